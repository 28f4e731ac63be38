"""Numerics of the Triton kernels (interpret on CPU, triton on GPU) against float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
import oracle
from jax_flash_amd import reference
from helpers import KERNEL_IMPLS, assert_close, inputs, run

DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32]


def _check(impl, b, sq, sk, h, d, dtype, causal, seed=0, q_scale=1.0, scale=None, h_kv=None, window=(-1, -1),
           softcap=0.0, alibi=None, segments=None, dropout_p=0.0):
    q, k, v, dout, dlse = inputs((b, sq, h, d), (b, sk, h_kv or h, d), dtype, seed, q_scale)
    rng = jax.random.key(seed + 1000) if dropout_p > 0 else None
    kw = dict(causal=causal, softmax_scale=scale, window_size=window, softcap=softcap, alibi_slopes=alibi,
              dropout_p=dropout_p, dropout_rng=rng)
    if segments is not None:
        kw.update(q_segment_ids=segments[0], kv_segment_ids=segments[1])
    got = run(impl, q, k, v, dout, dlse, **kw)
    base = run("xla", q, k, v, dout, dlse, **kw)
    slopes = None if alibi is None else np.broadcast_to(np.asarray(alibi, np.float64), (b, h))
    # the dropout mask is drawn bit for bit as the kernels draw it (test_dropout_* check that separately)
    keep = None if rng is None else reference.dropout_keep(reference.dropout_seeds(rng, b, h), sq, sk, dropout_p)
    ref = oracle.attention(q, k, v, dout, dlse, causal=causal, scale=scale, window=window, softcap=softcap,
                           alibi=slopes, segments=segments, keep=keep, dropout_p=dropout_p)
    assert_close(got, ref, base, dtype)
    for name, x in (("out", q), ("dq", q), ("dk", k), ("dv", v)):
        assert got[name].shape == x.shape and got[name].dtype == x.dtype, name
    assert got["lse"].shape == (b, h, sq) and got["lse"].dtype == jnp.float32
    return got


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 103), (71, 71), (103, 45), (64, 120), (259, 33)],
                         ids=lambda x: str(x))
def test_lengths(impl, dtype, causal, sq, sk):
    _check(impl, 2, sq, sk, 2, 64, dtype, causal)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("d", [1, 16, 59, 64, 72, 96, 128, 256])
def test_head_dims(impl, dtype, d):
    _check(impl, 1, 61, 90, 2, d, dtype, causal=True, seed=d)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_large_logits_stay_finite(impl, dtype):
    # |lse| up to 133: in float32 the logits' own rounding (~1e-5 absolute) dominates P's error, and how
    # much of it a kernel's backward cancels depends on its dot's summation order, in the interpreter on
    # the CPU's BLAS kernel (dv 1.1e-4 with OpenBLAS's AVX2 kernel, 2.4e-5 with its AVX-512 one):
    # helpers.assert_close allows 2 eps32 max|lse| for it (measured by
    # git show 20f7913:benchmarks/fp32_large_logits.py)
    got = _check(impl, 1, 150, 150, 2, 64, dtype, causal=False, q_scale=30.0)
    for name, x in got.items():
        assert np.isfinite(np.asarray(x.astype(jnp.float32))).all(), name


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("h,h_kv,causal", [(4, 2, True), (6, 1, False), (6, 3, True)], ids=["gqa", "mqa", "gqa3"])
def test_grouped_query_heads(impl, dtype, h, h_kv, causal):
    # dK/dV sum over the query heads of each group; odd lengths, seq_q != seq_k
    _check(impl, 2, 45, 70, h, 40, dtype, causal=causal, h_kv=h_kv, seed=h * 10 + h_kv)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk,window", [
    (100, 100, (20, 0)), (100, 100, (0, 0)), (100, 100, (33, 17)), (67, 131, (40, -1)), (131, 67, (-1, 5)),
    (110, 110, (0, 70)), (48, 200, (5, 5)),
], ids=lambda x: str(x))
def test_sliding_window(impl, causal, sq, sk, window):
    # blocks entirely outside the band are skipped; band edges land inside and across blocks;
    # rows whose window holds no key (seq_q > seq_k with a narrow band) give 0, lse -inf
    _check(impl, 1, sq, sk, 2, 48, jnp.float16, causal=causal, window=window, seed=sq + sum(window))


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_window_with_grouped_query_heads(impl):
    _check(impl, 2, 90, 90, 4, 32, jnp.bfloat16, causal=True, h_kv=2, window=(31, 0), seed=7)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("softcap,q_scale", [(5.0, 1.0), (2.0, 8.0)], ids=["cap5", "cap2-saturated"])
def test_softcap(impl, dtype, causal, softcap, q_scale):
    # large logits push tanh into saturation, where its derivative (1 - tanh^2) matters in the backward
    _check(impl, 2, 71, 50, 2, 40, dtype, causal=causal, softcap=softcap, q_scale=q_scale, seed=int(softcap))


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("per_batch", [False, True], ids=["heads", "batch-heads"])
def test_alibi(impl, causal, per_batch):
    slopes = np.array([0.5, 0.0625, 0.25], np.float32)
    if per_batch:
        slopes = np.stack([slopes, slopes[::-1] * 2])
    _check(impl, 2, 61, 90, 3, 32, jnp.float16, causal=causal, alibi=jnp.asarray(slopes), seed=5)


def _packed_ids(b, seq, lengths, seed):
    """(b, seq) int32 sorted segment ids: runs of the given lengths (cycled), shifted per row."""
    rows = []
    for r in range(b):
        ids, seg, i = [], seed + r, 0
        while len(ids) < seq:
            ids += [seg] * lengths[i % len(lengths)]
            seg, i = seg + 1, i + 1
        rows.append(ids[:seq])
    return jnp.asarray(rows, jnp.int32)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["packed", "packed-ragged", "unsorted"])
def test_segment_ids(impl, causal, layout):
    # packed: sorted ids, so key blocks of other segments are skipped; ragged: seq_q != seq_k with
    # different runs on each side, so some query rows share an id with no key (output 0, lse -inf);
    # unsorted: no block is skipped, the mask alone decides
    sq, sk = (130, 130) if layout == "packed" else (121, 151)
    if layout == "unsorted":
        q_ids = jax.random.randint(jax.random.key(1), (2, sq), 0, 4)
        kv_ids = jax.random.randint(jax.random.key(2), (2, sk), 0, 4)
    else:
        q_ids = _packed_ids(2, sq, [70, 3, 41, 100] if layout == "packed" else [50, 17, 90], 0)
        kv_ids = q_ids if layout == "packed" else _packed_ids(2, sk, [60, 5, 130], 1)
    _check(impl, 2, sq, sk, 2, 40, jnp.float16, causal=causal, segments=(q_ids, kv_ids), seed=len(layout))


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dropout(impl, dtype, causal):
    # forward and backward against float64 with the mask the kernels draw (odd lengths, seq_q != seq_k)
    _check(impl, 2, 91, 57, 2, 40, dtype, causal=causal, dropout_p=0.17, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_every_variant_together(impl):
    slopes = jnp.array([0.3, 0.1, 0.2, 0.05], jnp.float32)
    _check(impl, 2, 70, 53, 4, 48, jnp.bfloat16, causal=True, h_kv=2, window=(37, 0), softcap=8.0, alibi=slopes,
           seed=11)
    segments = (_packed_ids(2, 70, [40, 20, 30], 0), _packed_ids(2, 53, [30, 13, 16], 0))
    _check(impl, 2, 70, 53, 4, 48, jnp.bfloat16, causal=True, h_kv=2, window=(37, 0), softcap=8.0, alibi=slopes,
           segments=segments, dropout_p=0.1, seed=12)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_custom_scale(impl):
    _check(impl, 1, 77, 77, 3, 40, jnp.float16, causal=True, scale=0.3)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_rows_that_see_no_key(impl):
    # causal with seq_q > seq_k: the first seq_q - seq_k query rows see no key
    sq, sk = 100, 40
    q, k, v, dout, dlse = inputs((2, sq, 2, 32), (2, sk, 2, 32), jnp.float16)
    got = run(impl, q, k, v, dout, dlse, causal=True)
    empty = sq - sk
    assert (np.asarray(got["out"][:, :empty]) == 0).all()
    assert np.isneginf(np.asarray(got["lse"][:, :, :empty])).all()
    assert (np.asarray(got["dq"][:, :empty]) == 0).all()
    assert np.isfinite(np.asarray(got["lse"][:, :, empty:])).all()
    for x in got.values():
        assert not np.isnan(np.asarray(x.astype(jnp.float32))).any()


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_backward_is_deterministic(impl):
    q, k, v, dout, dlse = inputs((2, 90, 2, 64), (2, 90, 2, 64), jnp.bfloat16, seed=3)
    a = run(impl, q, k, v, dout, dlse, causal=True)
    b = run(impl, q, k, v, dout, dlse, causal=True)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


@pytest.mark.matrix
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.float16, 2e-2), (jnp.bfloat16, 5e-2)],
                         ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_xla_reference_matches_float64(dtype, tol, causal):
    q, k, v, dout, dlse = inputs((2, 90, 2, 48), (2, 70, 2, 48), dtype)
    got = run("xla", q, k, v, dout, dlse, causal=causal)
    ref = oracle.attention(q, k, v, dout, dlse, causal=causal)
    for name in ("out", "dq", "dk", "dv"):
        err = np.max(np.abs(np.asarray(got[name].astype(jnp.float32)) - ref[name]))
        assert err <= tol * np.max(np.abs(ref[name])), name
    fin = np.isfinite(ref["lse"])
    np.testing.assert_array_equal(np.isneginf(np.asarray(got["lse"])), ~fin)
    np.testing.assert_allclose(np.asarray(got["lse"])[fin], ref["lse"][fin], rtol=1e-5, atol=1e-5)


def test_empty_sequences():
    q = jnp.ones((2, 5, 2, 8), jnp.float32)
    k = jnp.ones((2, 0, 2, 8), jnp.float32)
    out, lse = jax_flash_amd.attention(q, k, k, return_lse=True)
    assert out.shape == q.shape and (np.asarray(out) == 0).all()
    assert np.isneginf(np.asarray(lse)).all() and lse.shape == (2, 2, 5)
    out = jax_flash_amd.attention(k, q, q)
    assert out.shape == k.shape


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nan_in_a_query_row_propagates_as_in_float64(impl, causal):
    """The NaN policy of attention's docstring, alike in every implementation: a NaN in query row r (head 1)
    makes r's out, lse and dq NaN and dk, dv NaN for the keys r sees, as float64 does; every other row's out,
    lse and dq are those of the same call with r finite."""
    sq, sk, r = 37, 45, 23
    q, k, v, dout, dlse = inputs((1, sq, 2, 32), (1, sk, 2, 32), jnp.float32, seed=8)
    bad = q.at[0, r, 1, 5].set(jnp.nan)
    got = {name: np.asarray(x, np.float64) for name, x in run(impl, bad, k, v, dout, dlse, causal=causal).items()}
    clean = {name: np.asarray(x, np.float64) for name, x in run(impl, q, k, v, dout, dlse, causal=causal).items()}
    ref = oracle.attention(bad, k, v, dout, dlse, causal=causal)
    seen = r + sk - sq + 1 if causal else sk  # keys 0 .. seen - 1
    for result in (got, ref):
        assert np.isnan(result["out"][0, r, 1]).all() and np.isnan(result["lse"][0, 1, r])
        assert np.isnan(result["dq"][0, r, 1]).all()
        assert np.isnan(result["dk"][0, :seen, 1]).all() and np.isnan(result["dv"][0, :seen, 1]).all()
    rows = np.ones((sq, 2), bool)
    rows[r, 1] = False  # every (row, head) but the NaN one
    for name, x in (("out", lambda t: t[0][rows]), ("dq", lambda t: t[0][rows]), ("lse", lambda t: t[0].T[rows])):
        assert np.isfinite(x(got[name])).all(), name
        np.testing.assert_allclose(x(got[name]), x(clean[name]), rtol=1e-6, atol=1e-6, err_msg=name)
    for name in ("dk", "dv"):  # head 0 never meets the NaN
        np.testing.assert_allclose(got[name][:, :, 0], clean[name][:, :, 0], rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
@pytest.mark.parametrize("scale", [2.0 ** -126, 1e3, 2.0 ** 16], ids=["2^-126", "1e3", "2^16"])
def test_softmax_scale_range_ends_match_float64(impl, scale):
    """The accepted softmax_scale range (attention's docstring: [2**-126, 2**16], results within float32
    precision of float64 while |scale * q.k| <= 2**16) at its ends: normal inputs, and at 2**16 unit-length
    queries and keys (|q.k| <= 1). Larger scales raise (test_errors)."""
    q, k, v, dout, dlse = inputs((1, 37, 2, 32), (1, 45, 2, 32), jnp.float32, seed=9)
    if scale == 2.0 ** 16:
        q, k = (x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    got = run(impl, q, k, v, dout, dlse, causal=True, softmax_scale=scale)
    base = run("xla", q, k, v, dout, dlse, causal=True, softmax_scale=scale)
    assert_close(got, oracle.attention(q, k, v, dout, dlse, causal=True, scale=scale), base, jnp.float32)
