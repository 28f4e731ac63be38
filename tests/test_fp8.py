"""FP8 forward (inference): against the float64 attention of the dequantised inputs, errors, the helper."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
import oracle
from helpers import KERNEL_IMPLS
from jax_flash_amd import fp8

FN, FNUZ = jnp.float8_e4m3fn, jnp.float8_e4m3fnuz
# the interpreter and xla run both types; the compiled kernels the type of the GPU at hand (_gpu_type)
CASES = [pytest.param(impl, t, marks=m, id=f"{impl}-{jnp.dtype(t).name}")
         for impl, m in (("interpret", KERNEL_IMPLS[1].marks), ("xla", ())) for t in (FN, FNUZ)]
CASES.append(pytest.param("triton", None, marks=KERNEL_IMPLS[0].marks, id="triton"))


def _gpu_type():
    from jax_flash_amd import _triton
    return next(iter(fp8.SUPPORTED[_triton.target()]))


def _inputs(b, sq, sk, h, h_kv, d, dtype, seed=0):
    """fp8 q, k, v with (batch, heads_kv) descales (q's shared by each key/value head's query heads)."""
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (b, sq, h, d)) * 2.0
    k = jax.random.normal(ks[1], (b, sk, h_kv, d))
    v = jax.random.normal(ks[2], (b, sk, h_kv, d))
    group = h // h_kv
    q_grouped = q.reshape(b, sq, h_kv, group * d)  # one descale per key/value head
    qq, qd = jax_flash_amd.quantize_fp8(q_grouped, dtype)
    kq, kd = jax_flash_amd.quantize_fp8(k, dtype)
    vq, vd = jax_flash_amd.quantize_fp8(v, dtype)
    return qq.reshape(b, sq, h, d), kq, vq, qd, kd, vd


def _rel_rms(got, want):
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))


@pytest.mark.matrix
@pytest.mark.parametrize("impl,dtype", CASES)
@pytest.mark.parametrize("kind", ["full", "causal-gqa", "window"])
def test_fp8_forward_against_float64(impl, dtype, kind):
    dtype = dtype or _gpu_type()
    h, h_kv, kw = {"full": (2, 2, {}), "causal-gqa": (4, 2, dict(causal=True)),
                   "window": (2, 1, dict(window_size=(30, 5)))}[kind]
    qq, kq, vq, qd, kd, vd = _inputs(2, 90, 71, h, h_kv, 72, dtype)
    out, lse = jax_flash_amd.attention(qq, kq, vq, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True,
                                       implementation=impl, **kw)
    assert out.dtype == jnp.bfloat16 and out.shape == qq.shape
    group = h // h_kv
    ref = oracle.attention(fp8.dequantize(qq, jnp.repeat(qd, group, axis=1)), fp8.dequantize(kq, kd),
                           fp8.dequantize(vq, vd), np.zeros(qq.shape), causal=kw.get("causal", False),
                           window=kw.get("window_size", (-1, -1)))
    err = _rel_rms(out, ref["out"])
    # P rounded to e4m3 (3 mantissa bits) for the PV dot: ~1.5-2% measured; the bar is 5%
    assert err < 0.05, err
    fin = np.isfinite(ref["lse"])
    # Hopper's fp8 MMA accumulates the logits with fewer bits than fp32: ~1e-3 off on the H200
    np.testing.assert_allclose(np.asarray(lse)[fin], ref["lse"][fin], rtol=1e-4, atol=4e-3)


@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
def test_fp8_is_forward_only_and_refuses_bad_input(impl):
    dtype = _gpu_type() if impl == "triton" else FN
    other = FNUZ if dtype == FN else FN
    qq, kq, vq, qd, kd, vd = _inputs(1, 20, 20, 2, 2, 32, dtype)
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, implementation=impl)
    with pytest.raises(TypeError, match="forward-only"):
        jax.grad(lambda q: jnp.sum(jax_flash_amd.attention(q, kq, vq, **kw).astype(jnp.float32)))(qq)
    with pytest.raises(ValueError, match="need v_descale"):
        jax_flash_amd.attention(qq, kq, vq, q_descale=qd, k_descale=kd, implementation=impl)
    with pytest.raises(ValueError, match=r"k_descale must have shape \(batch, heads_kv\) = \(1, 2\)"):
        jax_flash_amd.attention(qq, kq, vq, **{**kw, "k_descale": kd[:, :1]})
    with pytest.raises(TypeError, match="same dtype"):
        jax_flash_amd.attention(qq, kq.astype(other), vq, **kw)
    with pytest.raises(ValueError, match="only apply to float8 inputs"):
        x = jnp.zeros((1, 20, 2, 32), jnp.bfloat16)
        jax_flash_amd.attention(x, x, x, q_descale=qd, implementation=impl)
    with pytest.raises(ValueError, match="forward-only"):
        jax_flash_amd.attention(qq, kq, vq, dropout_p=0.1, dropout_rng=jax.random.key(0), **kw)


def test_fp8_types_per_target():
    fp8.check_supported("cuda", FN)
    fp8.check_supported("gfx942", FNUZ)
    fp8.check_supported("gfx950", FN)
    for target, dtype in (("cuda", FNUZ), ("gfx942", FN), ("gfx90a", FN)):
        with pytest.raises(TypeError, match=f"cannot run on {target}"):
            fp8.check_supported(target, dtype)


@pytest.mark.parametrize("dtype", [FN, FNUZ])
def test_quantize_fp8_round_trip(dtype):
    x = jax.random.normal(jax.random.key(0), (2, 33, 3, 16)) * jnp.array([1.0, 50.0, 0.01])[None, None, :, None]
    xq, descale = jax_flash_amd.quantize_fp8(x, dtype)
    assert xq.dtype == dtype and descale.shape == (2, 3) and descale.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(xq.astype(jnp.float32)))) == float(jnp.finfo(dtype).max)
    back = fp8.dequantize(xq, descale)
    assert _rel_rms(back, np.asarray(x, np.float64)) < 0.04  # 3 mantissa bits, per-head scaling
    with pytest.raises(TypeError, match="dtype must be one of"):
        jax_flash_amd.quantize_fp8(x, jnp.bfloat16)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("seq_k,d", [(37, 72), (64, 33), (5, 128)])
@pytest.mark.parametrize("mma_order", [False, True])
def test_keys_last_transposes_every_byte(impl, seq_k, d, mma_order):
    """The fp8 forward's V^T (four keys packed per word, kernels/fwd.py): exact, zero-padded to 16 keys,
    for random bytes over the whole 0..255 range (NaN encodings included), ragged key counts and odd
    head dims; mma_order: position p of each 32 holds key (h, j1, c, j0) for p's bits (h, c, j1, j0)."""
    from jax_flash_amd import _dispatch, _launch, plan
    run, target = _dispatch.backend(impl)
    bits = jax.random.randint(jax.random.key(seq_k), (2, seq_k, 3, d), 0, 256, jnp.int32).astype(jnp.uint8)
    v = jax.lax.bitcast_convert_type(bits, FN)
    step = plan._keys_last_step(plan.Call.of(target, v, v), mma_order)
    vt = jax.jit(lambda v: _launch.keys_last(run, step, v))(v)
    pad = -seq_k % 16
    want = np.pad(np.asarray(bits).transpose(0, 2, 3, 1), ((0, 0), (0, 0), (0, 0), (0, pad)))
    if mma_order:
        p = np.arange(seq_k + pad)
        key = p // 32 * 32 + (p % 32) // 16 * 16 + (p % 4) // 2 * 8 + (p % 16) // 4 * 2 + p % 2
        assert sorted(key) == list(p) and (key // 16 == p // 16).all()  # a permutation within each 16
        want = want[..., key]
    np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(vt, jnp.uint8)), want)
