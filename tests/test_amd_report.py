"""The AMD resource check: every kernel cross-compiles for gfx90a/gfx942/gfx950 at its default config
without spills, within LDS, and the MI300 forward keeps 2 waves per SIMD (no AMD GPU needed).

The default run checks one arch, head dim and dtype through the report's whole path (subprocess,
compile workers, table, --check); the full sweep (276 kernels, ~10 min on 2 cores) is marked amd_sweep."""
import math
import os
import signal
import subprocess
import sys

import pytest

from jax_flash_amd import amd_report

# Seconds one compile may take on one worker: ~5 s measured on an idle 2-core machine, ~10-17 s with
# the cores shared; the margin keeps a slow CI machine from failing a run that is only slow.
SECONDS_PER_KERNEL = 40


def _check(arch, head_dims, dtypes):
    """Runs `amd_report --check` in a process group of its own, with a timeout sized from the number of
    kernels; on timeout the whole group (the report and its compile workers) is killed."""
    jobs = os.cpu_count() or 1
    kernels = len(amd_report.work_items(arch.split(","), [int(d) for d in head_dims.split(",")], dtypes.split(",")))
    timeout = 60 + SECONDS_PER_KERNEL * math.ceil(kernels / jobs)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # it compiles, not interprets
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "jax_flash_amd.amd_report", "--check", "--arch", arch,
                             "--head-dims", head_dims, "--dtypes", dtypes, "--jobs", str(jobs)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"amd_report --check ran past {timeout} s ({kernels} kernels, {jobs} jobs):\n{err[-3000:]}")
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C): leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert f"check: {kernels}/{kernels} kernels pass" in err, err[-3000:]
    assert f"amd_report: {kernels}/{kernels} kernels compiled" in err, err[-3000:]  # the progress lines
    return out


def test_check_flags_what_it_should():
    ok = amd_report.Row("gfx942", "fwd", 128, "bfloat16", False, "", vgprs=200, local_mem=32768, occupancy=2)
    assert ok.problems() == []
    assert amd_report.Row("gfx90a", "dq", 64, "float16", True, "", spill_bytes=8).problems()
    assert amd_report.Row("gfx942", "dkdv", 64, "float16", True, "", local_mem=70000, occupancy=1).problems()
    assert amd_report.Row("gfx942", "fwd", 64, "float16", True, "", occupancy=1).problems()
    assert not amd_report.Row("gfx942", "fwd", 256, "float16", True, "", occupancy=1).problems()
    assert amd_report.Row("gfx950", "fwd", 64, "float16", True, "", error="boom").problems()


def test_one_arch_passes_the_check():
    """MI300 at D 128 bf16: forward, dQ, dK/dV (full, causal, dropout), the fp8 forward and the KV-cache
    kernels (decode, paged, chunked prefill, float8 cache, combine, append): 17 kernels."""
    table = _check("gfx942", "128", "bfloat16")
    for kernel in ("decode", "decode+paged", "decode+chunk", "decode+fp8", "decode_combine", "kv_append"):
        assert f"| gfx942 | {kernel} | 128 | bfloat16 | yes |" in table
    for kernel in ("fwd", "dkdv", "dq"):
        for causal in ("no", "yes"):
            assert f"| gfx942 | {kernel} | 128 | bfloat16 | {causal} |" in table
        assert f"| gfx942 | {kernel}+dropout | 128 | bfloat16 | yes |" in table
    for causal in ("no", "yes"):
        assert f"| gfx942 | fwd | 128 | float8_e4m3fnuz | {causal} |" in table


@pytest.mark.amd_sweep
def test_default_configs_pass_on_every_amd_arch():
    table = _check(",".join(amd_report.AMD_ARCHS), "64,128,256", "float16,bfloat16")
    for arch in amd_report.AMD_ARCHS:
        for kernel in ("fwd", "dkdv", "dq", "fwd+dropout", "dkdv+dropout", "dq+dropout"):
            for d in (64, 128, 256):
                assert f"| {arch} | {kernel} | {d} | bfloat16 |" in table and f"| {arch} | {kernel} | {d} | float16 |" in table
    for arch, fp8_type in (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn")):  # the fp8 forward
        for d in (64, 128, 256):
            assert f"| {arch} | fwd | {d} | {fp8_type} | no |" in table and f"| {arch} | fwd | {d} | {fp8_type} | yes |" in table
    # 3 archs x 3 head dims x 2 dtypes x 14 kernels (9 attention, 5 KV-cache), and 2 fp8 forwards per
    # head dim on gfx942 and gfx950, and the fp8-cache decode per head dim and dtype there
    assert table.count("\n| gfx") == 276
