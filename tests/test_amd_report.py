"""The AMD resource check: every kernel cross-compiles for gfx90a/gfx942/gfx950 at its default config
without spills, within LDS, and the MI300 forward keeps 2 waves per SIMD (no AMD GPU needed)."""
import os
import subprocess
import sys

from jax_flash_amd import amd_report


def test_check_flags_what_it_should():
    ok = amd_report.Row("gfx942", "fwd", 128, "bfloat16", False, "", vgprs=200, local_mem=32768, occupancy=2)
    assert ok.problems() == []
    assert amd_report.Row("gfx90a", "dq", 64, "float16", True, "", spill_bytes=8).problems()
    assert amd_report.Row("gfx942", "dkdv", 64, "float16", True, "", local_mem=70000, occupancy=1).problems()
    assert amd_report.Row("gfx942", "fwd", 64, "float16", True, "", occupancy=1).problems()
    assert not amd_report.Row("gfx942", "fwd", 256, "float16", True, "", occupancy=1).problems()
    assert amd_report.Row("gfx950", "fwd", 64, "float16", True, "", error="boom").problems()


def test_default_configs_pass_on_every_amd_arch():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # it compiles, not interprets
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-m", "jax_flash_amd.amd_report", "--check"], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout
    for arch in amd_report.AMD_ARCHS:
        for kernel in ("fwd", "dkdv", "dq", "fwd+dropout", "dkdv+dropout", "dq+dropout"):
            for d in (64, 128, 256):
                assert f"| {arch} | {kernel} | {d} | bfloat16 |" in table and f"| {arch} | {kernel} | {d} | float16 |" in table
    for arch, fp8_type in (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn")):  # the fp8 forward
        for d in (64, 128, 256):
            assert f"| {arch} | fwd | {d} | {fp8_type} | no |" in table and f"| {arch} | fwd | {d} | {fp8_type} | yes |" in table
    # 3 archs x 3 head dims x 2 dtypes x 9 kernels, and 2 fp8 forwards per head dim on gfx942 and gfx950
    assert "check: 174/174 kernels pass" in proc.stderr
