"""The benchmark's report: ratios to each peer come from rows of the same shape, and misses are named."""
from benchmarks import attention as bench


def _row(impl, fwd, bwd, fb, **shape):
    s = dict(B=4, N=4096, H=16, H_kv=16, D=128, causal=False, dtype="bfloat16") | shape
    return dict(impl=impl, **s, fwd_tflops=fwd, bwd_tflops=bwd, fwdbwd_tflops=fb, temp_mb=1.0, max_err=0.01,
                compile_s=1.0)


def test_ratios_and_misses():
    rows = [_row("jax_flash_amd", 600, 300, 500), _row("cudnn", 550, 500, 510), _row("xla", 150, 170, 160),
            _row("pallas_triton", 400, 100, 150),
            _row("jax_flash_amd", 100, 100, 100, N=512), _row("cudnn", 500, 500, 500, N=512)]
    md = bench.markdown(rows)
    line = next(l for l in md.splitlines() if l.startswith("| bfloat16 | 128 | 4096 | no | 1.09"))
    assert line.endswith("| bwd/cudnn |")  # 300/500 < 1.0; 600/550 >= 1.05; 500/160 >= 3
    assert "| 1.50 |" in line and "| 3.00 |" in line  # fwd/Pallas, bwd/Pallas
    assert "not judged" in next(l for l in md.splitlines() if l.startswith("| bfloat16 | 128 | 512 | no |"))


def test_shapes_follow_the_protocol():
    s = bench.shapes([512, 16384], [64, 256], [True], ["bfloat16"], long_context=True)
    assert dict(B=32, N=512, H=32, H_kv=32, D=64, causal=True, dtype="bfloat16") in s
    assert dict(B=1, N=16384, H=8, H_kv=8, D=256, causal=True, dtype="bfloat16") in s
    assert s[-1] == dict(B=1, N=131072, H=16, H_kv=16, D=128, causal=True, dtype="bfloat16")


def test_variant_report_names_misses():
    from benchmarks import variants

    timing = lambda f, fb: dict(fwd_ms=f, bwd_ms=fb - f, fwdbwd_ms=fb)  # noqa: E731
    rows = [dict(case="gqa", B=4, N=4096, H=32, target=1.05, judged_on="fwd_ms,bwd_ms", met=False,
                 variant=timing(1.0, 3.5), baseline=timing(1.0, 3.0), ratios=dict(fwd_ms=1.0, bwd_ms=1.25,
                                                                                   fwdbwd_ms=1.167)),
            dict(case="seg", B=4, N=4096, H=16, target=None, variant=timing(1, 2), baseline=timing(2, 4),
                 ratios=dict(fwd_ms=0.5, bwd_ms=0.5, fwdbwd_ms=0.5)),
            dict(case="oom", B=1, N=1, H=1, error="XlaRuntimeError: out of memory"),
            dict(case="fp8", B=4, N=4096, H=16, target=0.714, judged_on="fwd_ms", met=True, variant=dict(fwd_ms=0.6),
                 baseline=timing(1.0, 3.0), ratios=dict(fwd_ms=0.6))]
    md = variants.markdown(rows)
    assert "| 1.00 / 1.25 / 1.17 | - / - | <= 1.05x (fwd,bwd) | **no** |" in md
    assert "| 0.50 / 0.50 / 0.50 | - / - | - | - |" in md and "error: XlaRuntimeError" in md
    assert "| 0.600 / - / - | 1.000 / 2.000 / 3.000 | 0.60 / - / - | - / - | <= 0.714x (fwd) | yes |" in md
    cases = variants.cases()
    assert len(cases) == 22
    pointer = [c for c in cases if c["name"].endswith(", pointer rows")]  # the dense cases again, on Triton's rows
    assert len(pointer) == 4 and all(c["variant"]["policy"] == {"gluon_dense": False} for c in pointer)
    elements = [c for c in cases if c["name"].endswith(", element reads")]  # and the Gluon kernels' element reads
    assert len(elements) == 4 and all(c["variant"]["policy"] == {"gluon_dense_tiles": False} for c in elements)
    inner = [c for c in cases if c["name"].endswith(", batch inner")]  # the bias's tiles from L2 across the batch
    assert len(inner) == 2 and all(c["variant"]["policy"] == {"dense_batch_inner": True} for c in inner)


def test_reference_output_takes_whole_head_groups():
    """The suite's float32 reference, computed a few heads at a time, of a grouped-query call (8 query heads on 2
    key / value heads) equals the one-piece reference: chunks hold whole groups, each with its own key / value head."""
    import jax
    import jax.numpy as jnp

    import jax_flash_amd

    s = dict(B=1, N=48, H=8, H_kv=2, causal=True)
    q, k, v = (jax.random.normal(key, (1, 48, h, 16)) for key, h in zip(jax.random.split(jax.random.key(0), 3),
                                                                         (8, 2, 2)))
    want = jax_flash_amd.attention(q, k, v, causal=True, implementation="xla")
    per_group = 3 * 48 * 48 * 4 * 4
    for budget in (per_group, 2 * per_group, 1 << 30):  # two chunks of one group each, then one piece
        got = bench.reference_output(s, q, k, v, budget=budget)
        assert got.shape == want.shape and float(jnp.max(jnp.abs(got - want))) < 1e-5, budget
    assert bench.reference_output(s, q, k, v, budget=per_group - 1) is None
