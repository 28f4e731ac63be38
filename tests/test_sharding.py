"""Runs sharding_cases.py in a process of its own with 8 CPU host devices."""
import pytest

from helpers import ON_GPU, run_on_8_host_devices


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="host-device sharding cases run on CPU machines")
def test_sharding_cases_on_8_host_devices():
    run_on_8_host_devices("sharding_cases.py", at_least=50)
