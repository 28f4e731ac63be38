"""The benchmark's report: ratios to each peer come from rows of the same shape, and misses are named."""
from benchmarks import attention as bench


def _row(impl, fwd, bwd, fb, **shape):
    s = dict(B=4, N=4096, H=16, D=128, causal=False, dtype="bfloat16") | shape
    return dict(impl=impl, **s, fwd_tflops=fwd, bwd_tflops=bwd, fwdbwd_tflops=fb, temp_mb=1.0, max_err=0.01,
                compile_s=1.0)


def test_ratios_and_misses():
    rows = [_row("jax_flash_amd", 500, 300, 350), _row("cudnn", 550, 500, 510), _row("xla", 150, 170, 160),
            _row("pallas_triton", 400, 100, 150),
            _row("jax_flash_amd", 100, 100, 100, N=512), _row("cudnn", 500, 500, 500, N=512)]
    md = bench.markdown(rows)
    line = next(l for l in md.splitlines() if l.startswith("| bfloat16 | 128 | 4096 | no | 0.91"))
    assert "bwd/cudnn" in line and "fwd/cudnn" not in line  # 300/500 < 0.70; 500/550 >= 0.85
    assert "| 1.25 |" in line and "| 3.00 |" in line  # fwd/Pallas, bwd/Pallas
    assert "not judged" in next(l for l in md.splitlines() if l.startswith("| bfloat16 | 128 | 512 | no |"))


def test_shapes_follow_the_protocol():
    s = bench.shapes([512, 16384], [64, 256], [True], ["bfloat16"], long_context=True)
    assert dict(B=32, N=512, H=32, D=64, causal=True, dtype="bfloat16") in s
    assert dict(B=1, N=16384, H=8, D=256, causal=True, dtype="bfloat16") in s
    assert s[-1] == dict(B=1, N=131072, H=16, D=128, causal=True, dtype="bfloat16")
