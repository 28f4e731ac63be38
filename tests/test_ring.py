"""Runs ring_cases.py (ring attention over a sequence-sharded mesh axis) in a process of its own with 8
CPU host devices."""
import pytest

from helpers import ON_GPU, run_on_8_host_devices


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="host-device ring cases run on CPU machines")
def test_ring_cases_on_8_host_devices():
    run_on_8_host_devices("ring_cases.py", at_least=60)
