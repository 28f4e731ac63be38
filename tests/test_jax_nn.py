"""jax_flash_amd.dot_product_attention against jax.nn.dot_product_attention itself (its XLA implementation), on a grid
of every argument: bias and mask of each broadcast shape, is_causal with seq_q != seq_k (top-left), sequence
lengths, windows, grouped heads, rank 3 and 4, a traced scale; forward and gradients (dq, dk, dv, dbias). The
float32 jax.nn result is the reference, the same call's jax.nn result in the input dtype the same-dtype error
(FlashAttention's rule, helpers.assert_close)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
from helpers import KERNEL_IMPLS, assert_close
from jax_flash_amd import plan

B, N, K, H = 2, 4, 2, 40

CASES = {
    "plain": dict(),
    "causal-more-keys": dict(is_causal=True, t=37, s=53),  # top-left: the last keys unseen
    "causal-more-queries": dict(is_causal=True, t=53, s=37),
    "window-int": dict(window=6),
    "window-pair-cross": dict(window=(9, 3), t=40, s=50),
    "window-causal": dict(window=(7, 2), is_causal=True),
    "bias-full": dict(bias=(B, N, "t", "s")),
    "bias-heads-causal": dict(bias=(1, N, "t", "s"), is_causal=True, t=30, s=45),
    "bias-keys": dict(bias=(B, 1, 1, "s")),
    "bias-2d": dict(bias=("t", "s")),
    "mask-padding": dict(mask="padding"),
    "mask-causal-dense": dict(mask="tril"),
    "mask-random-rows-hidden": dict(mask=(B, N, "t", "s")),  # rows that see nothing: the mean of the values
    "mask-bias-gqa": dict(mask=(1, 1, "t", "s"), bias=(B, N, "t", "s"), kv_heads=1),
    "lengths-both": dict(q_lengths=[30, 11], kv_lengths=[44, 7]),
    "lengths-kv-zero": dict(kv_lengths=[44, 0]),  # a row of no keys: the mean of every value
    "lengths-causal-cross": dict(q_lengths=[20, 37], kv_lengths=[50, 9], is_causal=True, t=37, s=53),
    "rank3": dict(rank3=True, is_causal=True, bias=(N, "t", "s")),
    "traced-scale": dict(scale="traced", bias=(1, N, "t", "s")),
    "static-scale-window": dict(scale=0.3, window=(5, 5), mask="padding"),
    "everything": dict(is_causal=True, window=(12, 0), mask=(B, 1, "t", "s"), bias=(1, N, "t", "s"),
                       q_lengths=[40, 25], kv_lengths=[33, 40], kv_heads=2),
}


def case(name, dtype, seed=0):
    c = {**dict(t=45, s=45, kv_heads=K, is_causal=False, window=None, bias=None, mask=None, q_lengths=None,
                kv_lengths=None, scale=None, rank3=False), **CASES[name]}
    t, s = c["t"], c["s"]
    keys = jax.random.split(jax.random.key(seed), 7)
    q = jax.random.normal(keys[0], (B, t, N, H), jnp.float32)
    k = jax.random.normal(keys[1], (B, s, c["kv_heads"], H), jnp.float32)
    v = jax.random.normal(keys[2], (B, s, c["kv_heads"], H), jnp.float32)
    dout = jax.random.normal(keys[3], (B, t, N, H), jnp.float32)
    size = {"t": t, "s": s}
    bias = None if c["bias"] is None else jax.random.normal(keys[4], tuple(size.get(n, n) for n in c["bias"]))
    if c["mask"] == "padding":
        mask = (jnp.arange(s)[None, :] < jnp.array([s - 6, 9])[:, None])[:, None, None, :]
    elif c["mask"] == "tril":
        mask = jnp.tril(jnp.ones((t, s), bool))
    elif c["mask"] is not None:
        mask = (jax.random.uniform(keys[5], tuple(size.get(n, n) for n in c["mask"])) > 0.35).at[..., 4, :].set(False)
    else:
        mask = None
    if c["rank3"]:
        q, k, v, dout = (x[0] for x in (q, k, v, dout))
    kw = dict(is_causal=c["is_causal"], local_window_size=c["window"], mask=mask,
              query_seq_lengths=None if c["q_lengths"] is None else jnp.array(c["q_lengths"], jnp.int32),
              key_value_seq_lengths=None if c["kv_lengths"] is None else jnp.array(c["kv_lengths"], jnp.int32))
    args = [x.astype(dtype) for x in (q, k, v)]
    return args, None if bias is None else bias.astype(dtype), dout.astype(dtype), kw, c["scale"]


def outputs(fn, args, bias, dout, kw, scale):
    """dict(out, dq, dk, dv[, dbias]) of fn under one jit, scale passed as an argument where it is traced."""
    traced = scale == "traced"

    def fwd_bwd(q, k, v, bias, dout, scale_arg):
        def f(q, k, v, bias):
            return fn(q, k, v, bias, scale=scale_arg if traced else scale, **kw)

        out, vjp = jax.vjp(f, q, k, v, bias)
        dq, dk, dv, dbias = vjp(dout)
        grads = dict(out=out, dq=dq, dk=dk, dv=dv)
        return grads if bias is None else dict(grads, dbias=dbias)

    return jax.jit(fwd_bwd)(*args, bias, dout, jnp.float32(0.21))


def jax_nn(q, k, v, bias, **kw):
    return jax.nn.dot_product_attention(q, k, v, bias, implementation="xla", **kw)


def ours(impl):
    def fn(q, k, v, bias, **kw):
        mask = kw.pop("mask")
        return jax_flash_amd.dot_product_attention(q, k, v, bias, mask, implementation=impl, **kw)
    return fn


def jax_nn_masked(q, k, v, bias, **kw):
    mask = kw.pop("mask")
    return jax_nn(q, k, v, bias, mask=mask, **kw)


BF16_CASES = ("plain", "causal-more-keys", "bias-heads-causal", "mask-bias-gqa", "everything")
INTERPRETED = ("causal-more-queries", "window-pair-cross", "mask-random-rows-hidden", "lengths-kv-zero", "rank3",
               "traced-scale", "everything")


@pytest.mark.matrix
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("impl", [*KERNEL_IMPLS, "xla"])
def test_equals_jax_nn(name, dtype, impl):
    if dtype == jnp.bfloat16 and name not in BF16_CASES:
        pytest.skip("bfloat16: a few cases")
    if impl == "interpret" and name not in INTERPRETED:
        pytest.skip("the interpreter (slow): the cases whose arguments reach the kernels differently (the kernels' "
                    "numerics on every dense shape: test_dense.py)")
    args, bias, dout, kw, scale = case(name, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernels, no fallback warning
        got = outputs(ours(impl), args, bias, dout, kw, scale)
    up = lambda x: None if x is None else x.astype(jnp.float32)  # noqa: E731
    with jax.default_matmul_precision("highest"):  # float32 on a GPU: no TF32 in the reference
        ref = outputs(jax_nn_masked, [up(x) for x in args], up(bias), up(dout), kw, scale)
    ref = {n: np.asarray(x, np.float64) for n, x in ref.items()}
    base = outputs(jax_nn_masked, args, bias, dout, kw, scale)
    names = ("out", "dq", "dk", "dv") + (("dbias",) if bias is not None else ())
    assert_close(got, ref, base, dtype, names=names)


@pytest.mark.parametrize("name, kernel", [
    ("bias-heads-causal", "attn_fwd"), ("mask-padding", "attn_fwd_sm90"), ("lengths-both", "attn_fwd"),
    ("window-pair-cross", "attn_fwd"), ("causal-more-keys", "attn_fwd"), ("plain", "attn_fwd_sm90")])
def test_the_kernels_run(name, kernel):
    """Bias, mask, lengths and windows run the kernels: the plan, on sm90, of the attention call
    dot_product_attention makes (a dense operand, segment ids from the lengths, a top-left band's positions)."""
    from jax_flash_amd import compat

    args, bias, _, kw, _ = case(name, jnp.bfloat16)
    t, s = 4096, 4096 + args[1].shape[1] - args[0].shape[1]  # past the Gluon rows' min_seq, seq_k - seq_q kept
    q, k, v = (jnp.zeros((B, n, x.shape[2], 128), jnp.bfloat16) for n, x in zip((t, s, s), args))

    def grown(x):  # a bias or mask of the same broadcast shape at these lengths
        return None if x is None else jnp.zeros(x.shape[:-2] + (t if x.shape[-2] > 1 else 1, s), x.dtype)

    window = kw["local_window_size"]
    q, k, v, extras, opts = compat._arguments(
        q, k, v, grown(bias), grown(kw["mask"]), None, kw["is_causal"], kw["query_seq_lengths"],
        kw["key_value_seq_lengths"], (window, window) if isinstance(window, int) else window, "triton", "sm90")
    call = plan.Call.of("sm90", q, k, extras, opts.statics, here=False)
    assert plan.plan_forward(call).step("fwd").kernel == kernel
    assert plan.plan_backward(call).step("dkdv").kernel in ("attn_bwd_dkdv", "attn_bwd_dkdv_sm90")


def test_cudnn_is_refused_by_name():
    x = jnp.zeros((1, 8, 2, 16))
    with pytest.raises(ValueError, match="cudnn"):
        jax_flash_amd.dot_product_attention(x, x, x, implementation="cudnn")


def test_what_the_kernels_cannot_take_runs_jax_nn_with_a_warning():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(1, 8, 2, 16)), jnp.float32)
    bias = jnp.asarray(rng.integers(-2, 3, size=(1, 2, 8, 8)), jnp.int8)
    with pytest.warns(UserWarning, match="bias of dtype int8"):
        out = jax_flash_amd.dot_product_attention(x, x, x, bias)
    np.testing.assert_array_equal(out, jax.nn.dot_product_attention(x, x, x, bias))
    wide = jnp.asarray(rng.normal(size=(1, 8, 2, 300)), jnp.float32)
    with pytest.warns(UserWarning, match="head_dim 300"):
        out = jax_flash_amd.dot_product_attention(wide, wide, wide)
    np.testing.assert_array_equal(out, jax.nn.dot_product_attention(wide, wide, wide))
