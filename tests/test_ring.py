"""Runs ring_cases.py (ring attention over a sequence-sharded mesh axis) in a process of its own with 8
CPU host devices (XLA_FLAGS must be set before jax initialises, which in this process it already has)."""
import os
import re
import subprocess
import sys

import pytest

from helpers import ON_GPU


@pytest.mark.skipif(ON_GPU, reason="host-device ring cases run on CPU machines")
def test_ring_cases_on_8_host_devices():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
               TRITON_INTERPRET="1")
    # from the repository root, so the package beside these tests is the one imported
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(here, "ring_cases.py")], env=env, cwd=os.path.dirname(here),
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 25, proc.stdout[-2000:]
