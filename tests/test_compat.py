"""jax_flash_amd.compat: other libraries' APIs.

flash_attn_with_kvcache (FlashAttention's): against a float64 NumPy oracle of FlashAttention's semantics written
here in the cache's own positions (cache_seqlens, cache_leftpad, cache_batch_idx, the bottom-right aligned
mask), on contiguous, paged and batch-indexed caches, decode and chunked prefill, grouped-query heads, odd
lengths; the returned caches bit for bit; the fixed return structure; its equality with attention_with_kvcache;
its defaults and errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
from helpers import KERNEL_IMPLS

IMPLS = KERNEL_IMPLS + ["xla"]
B, H, HK, D, CAP, PAGE = 3, 4, 2, 16, 64, 16  # grouped-query 2:1; capacity of four pages of 16


def _oracle(q, keys, values, lengths, first, *, causal, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """FlashAttention's flash_attn_with_kvcache in float64, per row b in the cache's positions: its keys are
    first[b] .. lengths[b] - 1 (lengths: cached + appended), query i sits at position i + lengths[b] - seq_q
    (bottom-right aligned); causal: key j <= that position; window (left, right): within [pos - left, pos +
    right]; softcap; ALiBi -slope * |pos - j|. keys / values: (batch, capacity, heads_kv, d), the logical
    caches after the append. Returns (out, lse natural), out 0 and lse -inf where a row sees no key."""
    q = np.asarray(q, np.float64)
    batch, seq_q, heads, d = q.shape
    group = heads // keys.shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = np.zeros(q.shape)
    lse = np.full((batch, heads, seq_q), -np.inf)
    left, right = window
    for b in range(batch):
        for h in range(heads):
            for i in range(seq_q):
                pos = i + lengths[b] - seq_q
                js = [j for j in range(first[b], lengths[b])
                      if (not causal or j <= pos) and (left < 0 or j >= pos - left) and (right < 0 or j <= pos + right)]
                if not js:
                    continue
                kk = np.asarray(keys[b, js, h // group], np.float64)
                vv = np.asarray(values[b, js, h // group], np.float64)
                s = kk @ q[b, i, h] * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if alibi is not None:
                    s = s - alibi[b, h] * np.abs(pos - np.asarray(js))
                m = s.max()
                w = np.exp(s - m)
                out[b, i, h] = w @ vv / w.sum()
                lse[b, h, i] = m + np.log(w.sum())
    return out, lse


def _case(layout, seq_q, seq_new, leftpad, seed=0, dtype=jnp.float32):
    """One call's inputs: logical caches (batch rows, CAP keys) holding NaN outside each row's keys, laid out
    contiguous, paged (pages shuffled among spares) or as rows of a larger cache picked by cache_batch_idx
    (the other rows random: they must come back untouched)."""
    rng = np.random.default_rng(seed)

    def f(*shape):  # values of `dtype`, held as float32 (the oracle's view of them)
        return np.array(jnp.asarray(rng.standard_normal(shape), dtype), np.float32)

    lens = np.array([9, 40 - seq_new, 50 - seq_new], np.int32)  # odd; row 2's keys span several key blocks
    first = np.array([3, lens[1], 33], np.int32) if leftpad else np.zeros(B, np.int32)  # row 1: new keys only
    logical = [f(B, CAP, HK, D), f(B, CAP, HK, D)]
    for x in logical:
        for b in range(B):
            x[b, :first[b]] = np.nan  # padding before a row's first key: never read
            x[b, lens[b] + seq_new:] = np.nan
    case = dict(q=f(B, seq_q, H, D), lens=lens, first=first, logical=logical, table=None, idx=None,
                new=(f(B, seq_new, HK, D), f(B, seq_new, HK, D)) if seq_new else (None, None))
    if layout == "contiguous":
        case["caches"] = logical
    elif layout == "paged":
        per_row = CAP // PAGE
        order = rng.permutation(B * per_row + 2)
        table = order[:B * per_row].reshape(B, per_row).astype(np.int32)
        caches = []
        for x in logical:
            pages = f(len(order), PAGE, HK, D)
            pages[table.reshape(-1)] = x.reshape(-1, PAGE, HK, D)
            caches.append(pages)
        case["caches"], case["table"] = caches, table
    else:  # batch_idx: q's row b uses cache row idx[b] of B + 2
        idx = np.array([4, 0, 2], np.int32)
        caches = []
        for x in logical:
            rows = f(B + 2, CAP, HK, D)
            rows[idx] = x
            caches.append(rows)
        case["caches"], case["idx"] = caches, idx
    cast = lambda x: None if x is None else jnp.asarray(x, dtype)  # noqa: E731
    case["q"], case["new"], case["caches"] = cast(case["q"]), tuple(map(cast, case["new"])), tuple(
        map(cast, case["caches"]))
    return case


def _appended(case):
    """(expected caches as laid out, logical caches after the append): NumPy, exact."""
    caches = [np.array(c) for c in case["caches"]]
    logical = [np.array(x) for x in case["logical"]]
    k, v = case["new"]
    if k is not None:
        for b in range(B):
            for t in range(k.shape[1]):
                p = case["lens"][b] + t
                for cache, lg, new in zip(caches, logical, (k, v)):
                    lg[b, p] = np.asarray(new[b, t], np.float32)
                    if case["table"] is not None:
                        cache[case["table"][b, p // PAGE], p % PAGE] = new[b, t]
                    elif case["idx"] is not None:
                        cache[case["idx"][b], p] = new[b, t]
                    else:
                        cache[b, p] = new[b, t]
    return caches, logical


def _flash(impl, case, **kw):
    """flash_attn_with_kvcache under jit (its index and length arrays traced), with lse."""
    def f(q, kc, vc, k, v, lens, idx, first, table):
        return jax_flash_amd.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, cache_batch_idx=idx,
                                                     cache_leftpad=first, block_table=table, return_softmax_lse=True,
                                                     implementation=impl, **kw)

    arr = lambda x: None if x is None else jnp.asarray(x)  # noqa: E731
    first = jnp.asarray(case["first"]) if case["first"].any() else None
    return jax.jit(f)(case["q"], *case["caches"], *case["new"], jnp.asarray(case["lens"]), arr(case["idx"]), first,
                      arr(case["table"]))


def _bits(x):
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


@pytest.mark.matrix
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["contiguous", "paged", "batch_idx"])
@pytest.mark.parametrize("seq_q, seq_new, causal", [(1, 1, True), (5, 5, True), (3, 0, False)],
                         ids=["decode", "chunk", "no_append"])
def test_against_oracle(impl, layout, seq_q, seq_new, causal):
    """Rows of 9, 40 - seq_new and 50 - seq_new cached keys starting at keys 3, cache_seqlens[1] (only the new
    keys) and 33 (two whole key blocks skipped), NaN outside them; the output, lse and both caches."""
    case = _case(layout, seq_q, seq_new, leftpad=True, seed=seq_q)
    out, lse, kc, vc = _flash(impl, case, causal=causal, num_splits=3 if seq_q == 1 else 0)
    caches, logical = _appended(case)
    want_out, want_lse = _oracle(case["q"], *logical, case["lens"] + seq_new, case["first"], causal=causal)
    np.testing.assert_allclose(np.asarray(out), want_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(lse), want_lse, atol=2e-5, rtol=2e-5)
    if seq_new == 0:
        assert np.all(np.asarray(out)[1] == 0) and np.all(np.isneginf(np.asarray(lse)[1]))  # row 1 sees nothing
    for got, want in zip((kc, vc), caches):
        np.testing.assert_array_equal(_bits(got), _bits(want.astype(got.dtype)))


@pytest.mark.parametrize("impl", IMPLS)
def test_variants_against_oracle(impl):
    """A window, softcap and per-row ALiBi with cache_leftpad, seq_q 4 appended, bfloat16, paged."""
    case = _case("paged", 4, 4, leftpad=True, seed=7, dtype=jnp.bfloat16)
    alibi = np.random.default_rng(3).uniform(0, 0.5, (B, H)).astype(np.float32)
    out, lse, _, _ = _flash(impl, case, causal=True, window_size=(20, 0), softcap=3.0,
                            alibi_slopes=jnp.asarray(alibi), softmax_scale=0.3)
    _, logical = _appended(case)
    want_out, want_lse = _oracle(np.asarray(case["q"], np.float32), *logical, case["lens"] + 4, case["first"],
                                 causal=True, window=(20, 0), softcap=3.0, alibi=alibi, scale=0.3)
    np.testing.assert_allclose(np.asarray(out, np.float32), want_out, atol=3e-2, rtol=3e-2)
    np.testing.assert_allclose(np.asarray(lse), want_lse, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_equals_attention_with_kvcache(impl, layout):
    """The same semantics through both APIs, bit for bit: FlashAttention's causal=False default, and
    cache_leftpad passed through."""
    case = _case(layout, 2, 2, leftpad=True, seed=5)
    table = None if case["table"] is None else jnp.asarray(case["table"])
    args = (case["q"], *case["caches"])
    lens, first = jnp.asarray(case["lens"]), jnp.asarray(case["first"])
    got = jax_flash_amd.flash_attn_with_kvcache(*args, *case["new"], cache_seqlens=lens, cache_leftpad=first,
                                                block_table=table, return_softmax_lse=True, implementation=impl)
    want = jax_flash_amd.attention_with_kvcache(*args, lens, k=case["new"][0], v=case["new"][1], block_table=table,
                                                causal=False, cache_leftpad=first, return_lse=True,
                                                implementation=impl)
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("with_new", [False, True])
@pytest.mark.parametrize("lse", [False, True])
def test_return_structure_is_fixed(with_new, lse):
    """(out, k_cache, v_cache), or (out, softmax_lse, k_cache, v_cache) with return_softmax_lse, whether or not
    k / v are passed; without them the caches come back as passed."""
    case = _case("contiguous", 1, 1, leftpad=False)
    new = case["new"] if with_new else (None, None)
    res = jax_flash_amd.flash_attn_with_kvcache(case["q"], *case["caches"], *new, cache_seqlens=case["lens"],
                                                return_softmax_lse=lse, implementation="xla")
    assert isinstance(res, tuple) and len(res) == (4 if lse else 3)
    assert res[0].shape == case["q"].shape
    if lse:
        assert res[1].shape == (B, H, 1) and res[1].dtype == jnp.float32
    assert res[-2].shape == res[-1].shape == case["caches"][0].shape
    if not with_new:
        assert res[-2] is case["caches"][0] and res[-1] is case["caches"][1]


def test_fa_positional_order_and_full_cache_default():
    """FlashAttention's positional order (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, ...),
    and cache_seqlens=None: every row's whole cache (contiguous: k_cache.shape[1]; paged: max_pages * page)."""
    case = _case("contiguous", 2, 0, leftpad=False, seed=2)
    kc, vc = (jnp.nan_to_num(c) for c in case["caches"])
    lens = jnp.asarray(case["lens"])
    by_position = jax_flash_amd.flash_attn_with_kvcache(case["q"], kc, vc, None, None, None, None, lens, None, None,
                                                        None, 0.25, True, implementation="xla")
    by_name = jax_flash_amd.flash_attn_with_kvcache(case["q"], kc, vc, cache_seqlens=lens, softmax_scale=0.25,
                                                   causal=True, implementation="xla")
    np.testing.assert_array_equal(np.asarray(by_position[0]), np.asarray(by_name[0]))
    full = jax_flash_amd.flash_attn_with_kvcache(case["q"], kc, vc, implementation="xla")[0]
    want, _ = _oracle(case["q"], np.asarray(kc), np.asarray(vc), np.full(B, CAP), np.zeros(B, int), causal=False)
    np.testing.assert_allclose(np.asarray(full), want, atol=2e-5, rtol=2e-5)
    paged = _case("paged", 1, 0, leftpad=False)
    kp, vp = (jnp.nan_to_num(c) for c in paged["caches"])
    table = jnp.asarray(paged["table"])
    np.testing.assert_array_equal(
        np.asarray(jax_flash_amd.flash_attn_with_kvcache(paged["q"], kp, vp, block_table=table,
                                                         implementation="xla")[0]),
        np.asarray(jax_flash_amd.flash_attn_with_kvcache(paged["q"], kp, vp, cache_seqlens=CAP, block_table=table,
                                                         implementation="xla")[0]))


def test_duplicate_batch_indices_write_one_of_them():
    """FlashAttention: with repeated indices "the values updated in the cache might come from any of the
    duplicate indices"; the other rows stay as they were."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 1, 2, 16)), jnp.float32)
    kc = jnp.asarray(rng.standard_normal((3, 8, 1, 16)), jnp.float32)
    new = jnp.asarray(rng.standard_normal((2, 1, 1, 16)), jnp.float32)
    _, k2, _ = jax_flash_amd.flash_attn_with_kvcache(q, kc, kc, new, new, cache_seqlens=jnp.array([2, 2]),
                                                     cache_batch_idx=jnp.array([1, 1]), implementation="xla")
    written = np.asarray(k2[1, 2])
    assert any(np.array_equal(written, np.asarray(new[b, 0])) for b in range(2))
    np.testing.assert_array_equal(np.asarray(k2)[[0, 2]], np.asarray(kc)[[0, 2]])
    np.testing.assert_array_equal(np.asarray(k2[1, :2]), np.asarray(kc[1, :2]))


Q = jnp.zeros((2, 1, 4, 16), jnp.float16)
C = jnp.zeros((2, 32, 2, 16), jnp.float16)
P = jnp.zeros((6, 16, 2, 16), jnp.float16)
T = jnp.array([[0, 1], [2, 3]], jnp.int32)
L = jnp.array([3, 4], jnp.int32)
N = jnp.zeros((2, 1, 2, 16), jnp.float16)


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((Q, C, C), {"rotary_cos": jnp.ones((32, 8)), "rotary_sin": jnp.ones((32, 8))}, NotImplementedError,
     "rotary embedding"),
    ((Q, C, C, N, N), {}, ValueError, "cache_seqlens is required with k / v"),
    ((Q, P, P), {"cache_seqlens": L, "block_table": T, "cache_batch_idx": jnp.array([0, 1])}, ValueError,
     "cache_batch_idx applies to contiguous caches only"),
    ((Q, C, C), {"cache_seqlens": L, "cache_batch_idx": jnp.array([0, 2])}, ValueError,
     r"cache_batch_idx must lie in \[0, 2\)"),
    ((Q, C, C), {"cache_seqlens": L, "cache_batch_idx": jnp.array([0])}, ValueError,
     r"cache_batch_idx must have shape \(batch,\)"),
    ((Q, C, C), {"cache_seqlens": L, "cache_batch_idx": jnp.array([0.0, 1.0])}, TypeError,
     "cache_batch_idx must be an integer array"),
    ((Q, C, C), {"cache_seqlens": L, "cache_leftpad": jnp.array([0, 5])}, ValueError,
     r"cache_leftpad must be in \[0, cache_seqlens\]"),
    ((Q, C, C), {"cache_seqlens": L, "cache_leftpad": jnp.array([-1, 0])}, ValueError,
     r"cache_leftpad must be in \[0, cache_seqlens\]"),
    ((Q, C, C), {"cache_seqlens": L, "cache_leftpad": jnp.array([0, 1, 2])}, ValueError,
     r"cache_leftpad must have shape \(batch,\)"),
    ((Q, C, C), {"cache_seqlens": L, "cache_leftpad": [0, 1]}, TypeError, "cache_leftpad must be an integer array"),
    ((Q, C, C), {"cache_seqlens": L, "return_softmax_lse": 1}, TypeError, "return_softmax_lse must be a Python bool"),
    ((Q, C, C), {"cache_seqlens": L, "rotary_interleaved": None}, TypeError, "rotary_interleaved must be"),
    ((Q, P[:, :8], P[:, :8]), {"cache_seqlens": L, "block_table": T}, ValueError,
     "page_size .* must be a multiple of 16"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jax_flash_amd.flash_attn_with_kvcache(*args, **{"implementation": "xla", **kwargs})


def test_exported():
    assert "flash_attn_with_kvcache" in jax_flash_amd.__all__
    assert jax_flash_amd.flash_attn_with_kvcache is jax_flash_amd.compat.flash_attn_with_kvcache


def test_dir_lists_the_whole_public_api():
    """dir() shows __all__, the names imported on first use (FlashSelfAttention, nnx) included."""
    assert {"FlashSelfAttention", "nnx", "flash_attn_with_kvcache", "plan", "explain"} <= set(dir(jax_flash_amd))
    assert set(jax_flash_amd.__all__) <= set(dir(jax_flash_amd))
