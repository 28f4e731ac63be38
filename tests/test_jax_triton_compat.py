"""The jax-triton compat layer's version logic (no GPU): what reaches Triton, what is refused, when the
shim applies. The real ROCm lowering with jax-triton 0.4.1 is test_rocm_lowering.py; jax-triton 0.3.1
runs in the H200 GPU suite."""
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from jax_flash_amd import _jax_triton_compat as compat
from jax_flash_amd._launch import Launch

HIP_ROW = dict(num_warps=8, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16)


def _versions(monkeypatch, jax_triton, triton=(3, 9, 0), jax=(0, 11, 2)):
    monkeypatch.setattr(compat, "versions", lambda: {"jax-triton": jax_triton, "triton": triton, "jax": jax})


def test_every_version_passes_every_option():
    assert compat.compiler_options(HIP_ROW) == HIP_ROW


@pytest.mark.parametrize("jt,own,compiled_warps", [((0, 3, 1), True, True), ((0, 4, 1), False, False),
                                                   (None, False, True)])
def test_which_factory(jt, own, compiled_warps, monkeypatch):
    """By the installed version (None: not installed; monkeypatched, so the same on any machine)."""
    _versions(monkeypatch, jt)
    assert compat.uses_own_factory() == own
    assert compat.launches_compiled_warps() == compiled_warps


@pytest.mark.slow
def test_kernel_factory_tells_jaxlib_warps_scratch_and_pointer_range():
    """The factory compiles real kernels (CUDA sm90 and gfx942, on the CPU) in a process without the
    interpreter: tests/kernel_factory_cases.py."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "tests/kernel_factory_cases.py"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(os.path.join(root, "tests", "kernel_factory_cases.py")) as f:
        cases = sum(line.startswith("def case_") for line in f)
    assert cases >= 7 and run.stdout.count("ok ") == cases, run.stdout  # 7 since the Gluon dQ's case went


@pytest.mark.parametrize("jt,tr,jx,match", [
    (None, (3, 6, 0), (0, 11, 2), "needs jax-triton"),
    ((0, 4, 1), (3, 6, 0), (0, 11, 2), "needs triton >= 3.7"),
    ((0, 4, 1), (3, 9, 0), (0, 12, 0), "does not work with jax 0.12"),
])
def test_known_broken_pairs_are_refused(monkeypatch, jt, tr, jx, match):
    _versions(monkeypatch, jt, tr, jx)
    with pytest.raises(RuntimeError, match=match):
        compat.check_supported()


@pytest.mark.parametrize("jt,tr", [((0, 3, 1), (3, 6, 0)), ((0, 4, 1), (3, 9, 0))])
def test_supported_pairs_pass(monkeypatch, jt, tr):
    _versions(monkeypatch, jt, tr)
    compat.check_supported()


def _fake_jax_triton(monkeypatch):
    calls = []

    def triton_call(*args, **kwargs):
        calls.append(kwargs)
        return (np.zeros(1),)

    monkeypatch.setitem(sys.modules, "jax_triton", types.SimpleNamespace(triton_call=triton_call))
    monkeypatch.setattr(compat, "_install", lambda: None)  # nothing of jax-triton's to patch here
    return calls


LAUNCH = Launch(kernel=None, grid=(1, 1), args=(), out_shapes=(), constexprs=dict(BLOCK_M=64),
                compile_options=HIP_ROW)


def test_new_jax_triton_gets_backend_options(monkeypatch):
    _versions(monkeypatch, (0, 4, 1))
    calls = _fake_jax_triton(monkeypatch)
    compat.triton_call(LAUNCH)
    assert calls[0]["backend_options"] == dict(waves_per_eu=2, matrix_instr_nonkdim=16)
    assert calls[0]["num_warps"] == 8 and calls[0]["BLOCK_M"] == 64 and "waves_per_eu" not in calls[0]


@pytest.mark.parametrize("jt,tr,patched", [((0, 4, 1), (3, 9, 0), True), ((0, 4, 1), (3, 6, 0), False),
                                          ((0, 3, 1), (3, 9, 0), False), ((0, 5, 0), (3, 9, 0), False)])
def test_num_ctas_shim_applies_only_where_needed(monkeypatch, jt, tr, patched):
    import triton.backends.amd.compiler as hip

    _versions(monkeypatch, jt, tr)
    original = hip.HIPBackend.__dict__["make_llir"]
    monkeypatch.setattr(hip.HIPBackend, "make_llir", original)  # restored after the test
    compat.apply_workarounds.__wrapped__()
    assert (hip.HIPBackend.__dict__["make_llir"] is not original) == patched
