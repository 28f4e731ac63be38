"""The `xla` implementation's gradients (jax_flash_amd/reference.py): the kernels' float32 softmax backward,
exact where the exact gradient is 0, and differentiable again (second order) against float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracle
from helpers import inputs, run
from jax_flash_amd import reference

F32_EPS = float(jnp.finfo(jnp.float32).eps)


@pytest.mark.matrix
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (True, (3, 0)), (False, (-1, -1))],
                         ids=["causal", "causal-local", "full"])
def test_rows_that_see_one_key(dtype, causal, window):
    # FlashAttention's test_flash_attn_causal at seqlen (239, 1) (its (1, 239) swapped), d 32: with one key
    # per row the softmax is constant (P = 1), so dq and dk are exactly 0 (causal: only the last query sees
    # the key, the other 238 see none). Differentiating the forward rounded the cotangent of P to 16 bits
    # (dq 9e-3 in bf16); the float32 softmax backward gives exact zeros.
    sq, sk, d = 239, 1, 32
    q, k, v, dout, _ = inputs((2, sq, 2, d), (2, sk, 2, d), dtype, seed=4)
    dlse = jnp.zeros((2, 2, sq), jnp.float32)  # a cotangent on lse would make dq = dlse * scale * k
    got = run("xla", q, k, v, dout, dlse, causal=causal, window_size=window)
    ref = oracle.attention(q, k, v, dout, dlse, causal=causal, window=window)
    assert not (ref["dq"].any() or ref["dk"].any())
    f = lambda x: np.abs(oracle._f64(x))  # noqa: E731
    seen = np.isfinite(ref["lse"]).transpose(0, 2, 1)[..., None]  # (B, Sq, H, 1): rows that see the key
    # delta = rowsum(P * dP) uses dP's own float32 values, so with P one-hot dS = P * (dP - dP) is exactly 0
    assert not np.asarray(got["dq"]).any(), f"dq: max {f(got['dq']).max():.3g}, exactly 0 expected"
    assert not np.asarray(got["dk"]).any(), f"dk: max {f(got['dk']).max():.3g}, exactly 0 expected"
    # dv = the sum of dO over the rows that see the key (P = 1): float32 sums, rounded once to the dtype
    dv_err = np.max(np.abs(oracle._f64(got["dv"]) - ref["dv"]))
    assert dv_err <= float(jnp.finfo(dtype).eps) * np.max(np.abs(ref["dv"])), f"dv: {dv_err:.3g}"


def _grid(x, step=2.0 ** -12):
    """x rounded to multiples of step: then x +- h t (h a power of 2, t small integers) is exact in float32,
    which the float64 oracle's inputs pass through, so central differences of it see the exact inputs."""
    return jnp.round(jnp.asarray(x, jnp.float32) / step) * step


@pytest.mark.slow
@pytest.mark.parametrize("case", ["causal-softcap-alibi-gqa", "empty-rows-window-dropout"])
def test_second_order_against_float64(case):
    # Hessian-vector products of L = <out, G> + <lse, G_lse> through the custom_vjp's backward, reverse over
    # reverse and forward over reverse, against central differences of the float64 oracle's gradient
    b, h, h_kv, d = 1, 2, 1, 8
    if case == "causal-softcap-alibi-gqa":
        sq, sk, kw = 6, 9, dict(causal=True, softcap=4.0, alibi_slopes=jnp.array([[0.3, 0.7]], jnp.float32))
        okw = dict(causal=True, softcap=4.0, alibi=np.array([[0.3, 0.7]]))
    else:  # seq_q > seq_k, causal with a window: the first rows see no key (out 0, lse -inf, zero gradients)
        sq, sk, p = 9, 5, 0.25
        seeds = reference.dropout_seeds(jax.random.key(3), b, h)
        kw = dict(causal=True, window_size=(2, 0), dropout_p=p, dropout_seeds=seeds)
        okw = dict(causal=True, window=(2, 0), keep=reference.dropout_keep(seeds, sq, sk, p), dropout_p=p)
    q, k, v, g, g_lse = inputs((b, sq, h, d), (b, sk, h_kv, d), jnp.float32, seed=9)
    q, k, v = _grid(q), _grid(k), _grid(v)
    ts = [jnp.asarray(np.random.default_rng(i).integers(-3, 4, x.shape), jnp.float32) for i, x in enumerate((q, k, v))]

    def grads(q, k, v):
        _, vjp = jax.vjp(lambda q, k, v: reference.attention(q, k, v, **kw), q, k, v)
        return vjp((g, g_lse))

    rev = jax.grad(lambda q, k, v: sum(jnp.vdot(a, t) for a, t in zip(grads(q, k, v), ts)), argnums=(0, 1, 2))(q, k, v)
    _, fwd = jax.jvp(grads, (q, k, v), tuple(ts))

    step = 2.0 ** -10
    def grads64(sign):  # noqa: E306
        x = [a + sign * step * t for a, t in zip((q, k, v), ts)]
        r = oracle.attention(*x, g, g_lse, **okw)
        return [r[n] for n in ("dq", "dk", "dv")]
    ref = [(a - c) / (2 * step) for a, c in zip(grads64(1), grads64(-1))]
    for name, r, x_rev, x_fwd in zip(("q", "k", "v"), ref, rev, fwd):
        tol = 1e-4 * np.max(np.abs(r))  # float32 evaluation; the differences' truncation is ~step^2
        for mode, x in (("reverse-over-reverse", x_rev), ("forward-over-reverse", x_fwd)):
            x = np.asarray(x, np.float64)
            assert np.isfinite(x).all(), f"{mode} d{name}: not finite"
            assert np.max(np.abs(x - r)) <= tol, f"{mode} H.t for {name}: {np.max(np.abs(x - r)):.3g} > {tol:.3g}"
