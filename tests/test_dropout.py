"""Dropout: the kernels' mask is the reference's (the same hash), the same in forward and backward, per key, as
frequent as p, and without dependence between neighbours."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl

import jax_flash_amd
from helpers import KERNEL_IMPLS, ON_GPU
from jax_flash_amd import reference, rules
from jax_flash_amd.kernels.dropout import dropped_ds, keep, keep_at, load_seed
from jax_flash_amd.rules import Band

IMPLS = KERNEL_IMPLS + ["xla"]


def _probe(impl, p, rng, b=2, sq=50, h=3, sk=64, causal=False, window=(-1, -1)):
    """With q = k = 0 every visible key gets probability 1 / (visible keys); with v = identity (head_dim
    = seq_k) the output row is those probabilities after dropout: out[b, i, h, j] = keep_ij * keep_scale / n,
    keep_scale = 1 / (1 - p rounded to a multiple of 1/256)."""
    q = jnp.zeros((b, sq, h, sk), jnp.float32)
    k = jnp.zeros((b, sk, h, sk), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(sk, dtype=jnp.float32)[None, :, None, :], (b, sk, h, sk))
    f = lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=causal, window_size=window,  # noqa: E731
                                                dropout_p=p, dropout_rng=rng, implementation=impl)
    return f, (q, k, v)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (20, 0))],
                         ids=["full", "causal", "narrow-window"])  # the window takes other blocks (16 keys)
def test_mask_is_the_reference_mask_and_backward_uses_it(impl, causal, window):
    p, rng = 0.3, jax.random.key(7)
    f, (q, k, v) = _probe(impl, p, rng, causal=causal, window=window)
    out, vjp = jax.vjp(f, q, k, v)
    b, sq, h, sk = out.shape
    kept = np.asarray(out > 0).transpose(0, 2, 1, 3)  # (b, h, sq, sk)
    visible = np.asarray(Band.of(causal, window, sq, sk).visible(sq, sk))
    expected = np.asarray(reference.dropout_keep(reference.dropout_seeds(rng, b, h), sq, sk, p)) & visible
    np.testing.assert_array_equal(kept, expected)
    n = visible.sum(-1)[None, None, :, None]
    np.testing.assert_allclose(np.asarray(out).transpose(0, 2, 1, 3), expected * rules.dropout_keep_scale(p) / n,
                               rtol=1e-6)
    # the backward regenerates the forward's mask: dV = P_dropped^T dO, with P_dropped = out here
    dout = jax.random.normal(jax.random.key(1), out.shape, jnp.float32)
    _, _, dv = vjp(dout)
    p_dropped = np.asarray(out, np.float64)  # (b, sq, h, sk)
    want = np.einsum("bqhk,bqhd->bkhd", p_dropped, np.asarray(dout, np.float64))
    np.testing.assert_allclose(np.asarray(dv), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_same_key_same_result_other_key_other_mask(impl):
    f1, args = _probe(impl, 0.5, jax.random.key(3))
    f2, _ = _probe(impl, 0.5, jax.random.key(4))
    grad = lambda f: jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * args[2][:, :50]), argnums=(0, 1, 2))  # noqa: E731
    a, b = f1(*args), f1(*args)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for x, y in zip(grad(f1)(*args), grad(f1)(*args)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(a > 0), np.asarray(f2(*args) > 0))


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_dropped_fraction_in_kernel(impl):
    p = 0.25
    f, args = _probe(impl, p, jax.random.key(11), b=2, sq=100, h=4, sk=64)
    frac = 1.0 - float(jnp.mean(f(*args) > 0))  # 51,200 draws: standard error 0.002
    assert abs(frac - p) < 0.01, frac  # 0.25 is a multiple of 1/256: applied exactly


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropped_fraction_of_the_mask(p):
    keep = reference.dropout_keep(reference.dropout_seeds(jax.random.key(0), 4, 8), 256, 256, p)
    frac = 1.0 - float(jnp.mean(keep))  # 2M draws: standard error < 0.0004
    assert abs(frac - rules.dropout_rate(p)) < 0.0015, frac
    assert abs(rules.dropout_rate(p) - p) <= 1 / 512
    # no structure along rows or columns (a broken counter repeats patterns)
    assert np.asarray(keep[0, 0, :, 0] != keep[0, 0, :, 4]).any()
    assert not np.array_equal(np.asarray(keep[0, 0]), np.asarray(keep[0, 1]))


@pytest.mark.parametrize("impl", IMPLS)
def test_dropout_under_jit_with_a_traced_key(impl):
    f, args = _probe(impl, 0.2, None)
    g = jax.jit(lambda rng, *a: jax_flash_amd.attention(*a, dropout_p=0.2, dropout_rng=rng, implementation=impl))
    key = jax.random.key(5)
    np.testing.assert_array_equal(np.asarray(g(key, *args)),
                                  np.asarray(jax_flash_amd.attention(*args, dropout_p=0.2, dropout_rng=key,
                                                                     implementation=impl)))


def test_random_bytes_show_no_dependence():
    """benchmarks/dropout_stats.py's battery at 2048 x 2048, one seed: neighbours, 2 x 2 squares and nearby seeds
    (chi-square z of each test; a linear or too-weak hash scores 10-50 here, this one within noise)."""
    from benchmarks import dropout_stats
    z = dropout_stats.battery(2048, 1, seed=3)
    assert len(z) == 37
    worst = max(z, key=lambda k: abs(z[k]))
    assert abs(z[worst]) < 6, (worst, z[worst])


@triton.jit
def _masks(Seeds, start_m, start_n, Plain, FromStart, THRESHOLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """keep's mask of one tile drawn two ways: from the global indices (dropout.keep), and as the Gluon forward
    draws it, from the block's key offsets with its start folded into the key (dropout.keep_at's k_start)."""
    seed = load_seed(Seeds, tl.program_id(0) + 1, THRESHOLD)  # (batch 0, head 1) of Seeds (1, 2, 2)
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    at = rows[:, None] * BN + cols[None, :]
    tl.store(Plain + at, keep(seed, start_m, start_n, THRESHOLD, BM, BN).to(tl.int32))
    tl.store(FromStart + at, keep_at(seed, (start_m + rows)[:, None], cols[None, :], THRESHOLD, start_n).to(tl.int32))


@pytest.mark.parametrize("start_m, start_n", [(0, 0), (37, 64), (5, 1 << 16), (1 << 20, 3 << 17)])
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_a_blocks_keys_from_its_start_draw_the_same_mask(start_m, start_n):
    """keep_at(..., k_start=start_n) over offsets 0 .. BN - 1 is the mask of keys start_n + offsets (start_n a
    multiple of BN: the same bits as start ^ offsets), and both are the reference's (interpreter)."""
    from jax_flash_amd import _interpret, _launch
    _interpret.check_available()
    bm, bn, p = 16, 64, 0.3
    seeds = reference.dropout_seeds(jax.random.key(4), 1, 2)
    plain, from_start = _interpret.run(_launch.launch(
        _masks, grid=(1,), inputs=dict(Seeds=seeds.astype(jnp.int32), start_m=start_m, start_n=start_n),
        out_shapes=(jax.ShapeDtypeStruct((bm, bn), jnp.int32),) * 2,
        constexprs=dict(THRESHOLD=rules.dropout_threshold(p), BM=bm, BN=bn), options={}))
    at = lambda x: jnp.asarray([x], jnp.int32)  # noqa: E731
    want = reference.dropout_keep(seeds, bm, bn, p, at(start_m), at(start_n))[0, 1]
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(from_start), np.asarray(want))


@triton.jit
def _ds_both_ways(P, dP, Delta, Kept, FromMask, FromKept, THRESHOLD: tl.constexpr, N: tl.constexpr):
    at = tl.arange(0, N)[:, None] * N + tl.arange(0, N)[None, :]
    p = tl.load(P + at)
    dp = tl.load(dP + at)
    delta = tl.load(Delta + tl.arange(0, N))[None, :]
    kept = tl.load(Kept + at) != 0
    tl.store(FromMask + at, dropped_ds(p, dp, delta, kept, THRESHOLD))
    tl.store(FromKept + at, dropped_ds(p, dp, delta, tl.where(kept, p, 0.0), THRESHOLD))


@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_the_backwards_ds_from_the_mask_or_from_p_keep():
    """dropout.dropped_ds given the keep mask (the Triton kernels) or P keep (the Gluon dK/dV) is dS / keep_scale =
    P (keep dP - delta keep_rate), against float64."""
    from jax_flash_amd import _interpret, _launch
    _interpret.check_available()
    n, p_drop = 16, 0.3
    threshold = rules.dropout_threshold(p_drop)
    rng = np.random.default_rng(0)
    p, dp = rng.uniform(0, 1, (n, n)).astype(np.float32), rng.normal(size=(n, n)).astype(np.float32)
    delta, kept = rng.normal(size=n).astype(np.float32), rng.uniform(size=(n, n)) < 0.7
    got = _interpret.run(_launch.launch(
        _ds_both_ways, grid=(1,), inputs=dict(P=jnp.asarray(p), dP=jnp.asarray(dp), Delta=jnp.asarray(delta),
                                              Kept=jnp.asarray(kept, jnp.int32)),
        out_shapes=(jax.ShapeDtypeStruct((n, n), jnp.float32),) * 2, constexprs=dict(THRESHOLD=threshold, N=n),
        options={}))
    keep_rate = (256 - threshold) / 256
    want = p.astype(np.float64) * (np.where(kept, dp, 0.0) - delta[None, :] * keep_rate)
    for x in got:
        np.testing.assert_allclose(np.asarray(x), want, rtol=1e-6, atol=1e-6)
