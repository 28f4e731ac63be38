"""jax-triton's real ROCm lowering of every kernel, on the CPU, at the default configs of gfx90a, gfx942
and gfx950: an hsaco comes out, and the AMD compile options of kernels/configs.py reach it.

Opt-in (marker rocm_lowering: `python -m pytest tests -m rocm_lowering`; .ci/run runs it): it needs a
Python 3.12 interpreter (jax-triton 0.4.x) and builds a venv with the pinned ROCm stack (PINS) in the
temp dir, /tmp/jax_flash_amd-rocm-<hash>: 2.1 GB, downloaded once and reused by later runs (delete
it to get the space back). It then runs tests/rocm_lowering.py in it."""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import pytest

pytestmark = pytest.mark.rocm_lowering

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The pair that passes AMD options through (see _jax_triton_compat.RECOMMENDED), CPU-installable.
PINS = ["jax==0.11.2", "jaxlib==0.11.2", "jax-rocm7-plugin==0.11.2", "jax-triton==0.4.1", "triton==3.9.0", "numpy"]
ARCHS = ("gfx90a", "gfx942", "gfx950")
KERNELS = {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"}
KVCACHE_KERNELS = {"kv_append", "attn_decode", "attn_decode_combine"}  # attention_with_kvcache, paged decode


def _python312():
    candidates = [shutil.which("python3.12")] + sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    for exe in filter(None, candidates):
        if subprocess.run([exe, "-c", "import venv"], capture_output=True).returncode == 0:
            return exe
    return None


@pytest.fixture(scope="module")
def rocm_python():
    exe = _python312()
    if exe is None:
        pytest.skip("no Python 3.12 interpreter found (jax-triton 0.4.x, which passes AMD options, needs it); "
                    "with one, this test builds a 2.1 GB venv in the temp dir")
    env_dir = os.path.join(tempfile.gettempdir(), "jax_flash_amd-rocm-" + hashlib.sha1(" ".join(PINS).encode()).hexdigest()[:10])
    python = os.path.join(env_dir, "bin", "python")
    if not os.path.exists(os.path.join(env_dir, ".complete")):
        shutil.rmtree(env_dir, ignore_errors=True)
        subprocess.run([exe, "-m", "venv", env_dir], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *PINS], check=True)
        open(os.path.join(env_dir, ".complete"), "w").close()
    # the checkout under test, every time (no dependencies: they are the pins above)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", REPO], check=True)
    return python


def _lower(python, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([python, os.path.join(REPO, "tests", "rocm_lowering.py"), ",".join(ARCHS), *args],
                          env=env, capture_output=True, text=True, timeout=1800)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, rows


def test_every_kernel_lowers_for_every_arch_with_its_options(rocm_python):
    proc, rows = _lower(rocm_python)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for arch in ARCHS:
        mine = [r for r in rows if r["arch"] == arch and r["kernel"] in KERNELS]
        assert {r["kernel"] for r in mine} == KERNELS, arch
        assert len(mine) == 2 * len(KERNELS)  # D 128 bf16 causal; D 64 fp16 non-causal grouped-query
        decode = [r for r in rows if r["arch"] == arch and r["kernel"] in KVCACHE_KERNELS]
        assert {r["kernel"] for r in decode} == KVCACHE_KERNELS and len(decode) == len(KVCACHE_KERNELS), arch
        for r in mine + decode:
            where = f"{arch} {r['kernel']} D{r['head_dim']} {r['dtype']}"
            assert r["is_elf"] and r["hsaco_bytes"] > 1000 and r["target_in_amdgcn"], where
            assert r["custom_calls"] >= len(KERNELS), where
            assert r["scratch"] == 0, f"{where}: spills ({r['scratch']} bytes of scratch)"
            # buffer loads (pointer-range attribute); at most the dropout key's two words stay global (dQ,
            # once per program, outside the loops)
            assert r["buffer_loads"] > 0 and r["global_loads"] <= 2, f"{where}: {r['global_loads']} global loads"
            expected = r["expected"]
            assert r["num_warps"] == expected["num_warps"], where
            waves = expected.get("waves_per_eu", 0)
            assert r["waves_per_eu"] == waves, where
            if waves:  # reached LLVM as a function attribute, and the occupancy is what was asked for
                assert r["waves_attr"] == [f"{waves},{waves}"] and r["occupancy"] == waves, where
            nonk = expected.get("matrix_instr_nonkdim", 0)
            assert r["matrix_instr_nonkdim"] == nonk, where
            if nonk:
                assert r["mfma_shapes"] == [f"{nonk}x{nonk}"], where


def test_num_ctas_shim_is_still_needed(rocm_python):
    """jax-triton 0.4.1 + triton >= 3.7 fail without _jax_triton_compat's shim. When this test fails,
    upstream has fixed it: drop the shim (apply_workarounds) and this test."""
    proc, rows = _lower(rocm_python, "--no-workaround")
    assert proc.returncode != 0 and "KeyError: 'num_ctas'" in proc.stderr, proc.stderr[-2000:]
