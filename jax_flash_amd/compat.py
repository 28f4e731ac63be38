"""Other libraries' attention APIs on jax_flash_amd: their names, arguments, defaults and semantics, so code
written against them runs after changing an import. One section per foreign API:

- jax.nn: dot_product_attention;
- FlashAttention (flash_attn.flash_attn_interface): flash_attn_func, flash_attn_with_kvcache.

Where the foreign API mutates its arguments, the function here returns the updated arrays instead (JAX arrays
are immutable), with a return structure that does not depend on which optional arguments are passed.
"""
from __future__ import annotations

import functools
import math
import warnings
from numbers import Real

import jax
import jax.numpy as jnp

from jax_flash_amd import _dispatch, api, kvcache
from jax_flash_amd.api import _check_flag, attention
from jax_flash_amd.rules import Band


# ----- jax.nn: dot_product_attention -----

_KERNEL_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal: bool = False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation: str | None = None):
    """``jax.nn.dot_product_attention`` over the kernels: its arguments, shapes and results, exactly.

    Args:
      query: (batch, seq_q, heads_q, head_dim), or (seq_q, heads_q, head_dim).
      key, value: (batch, seq_k, heads_kv, head_dim) (or without batch), query's dtype; heads_q a multiple of
        heads_kv (query head n reads key/value head n // (heads_q // heads_kv), as jax.nn broadcasts them).
      bias, mask: broadcastable to (batch, heads_q, seq_q, seq_k) (a shorter rank gains leading axes; each axis
        its size or 1): bias added to the scaled logits (differentiable), mask boolean (False hides a pair).
        Read tile by tile by the kernels, never expanded.
      scale: the logits' scale (default 1 / sqrt(head_dim)); a traced value is accepted (it then scales the
        queries, in their dtype, before the kernels).
      is_causal: query i sees key j iff j <= i, aligned TOP-LEFT as jax.nn does (jax_flash_amd.attention's
        `causal` aligns bottom-right, as FlashAttention does; they differ only where seq_q != seq_k).
      query_seq_lengths, key_value_seq_lengths: (batch,) int32: queries / keys past these are padding (the
        kernels bound their loops by them; padded query rows give 0).
      local_window_size: int w or (left, right): query i sees keys i - left .. i + right (top-left, as jax.nn).
      implementation: None (the kernels where this machine runs them, as jax_flash_amd.attention), "triton",
        "interpret" or "xla". jax.nn's "cudnn" is refused (use jax.nn for cuDNN).

    A row that sees no key (its mask hides every key, or its key length is 0) gives the mean of all values, as
    jax.nn's large-negative fill does. Calls the kernels cannot run (dtypes other than float16 / bfloat16 /
    float32, head_dim over 256) run jax.nn's XLA attention, with a one-time warning that names the argument.

    Example:
      >>> out = jax_flash_amd.dot_product_attention(q, k, v, mask=mask, is_causal=True)
    """
    if implementation == "cudnn":
        raise ValueError("dot_product_attention(implementation='cudnn'): jax_flash_amd runs its own kernels; for "
                         "cuDNN call jax.nn.dot_product_attention(..., implementation='cudnn'). Ours: None, "
                         f"{', '.join(repr(i) for i in _dispatch.IMPLEMENTATIONS)}.")
    _check_flag("is_causal", is_causal)
    arrays = [jnp.asarray(x) if hasattr(x, "shape") else x for x in (query, key, value)]
    query, key, value = arrays
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not hasattr(x, "shape") or x.ndim not in (3, 4):
            raise ValueError(f"{name} must have rank 3 (seq, heads, head_dim) or 4 (batch, seq, heads, head_dim); "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
    if not query.ndim == key.ndim == value.ndim:
        raise ValueError(f"query, key and value must have the same rank; got {query.ndim}, {key.ndim}, {value.ndim}")
    window = _check_window(local_window_size)
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = (x[None] for x in (query, key, value))
    fallback = _fallback_reason(query, key, value, bias)
    if fallback:
        _warn_once(f"jax_flash_amd.dot_product_attention: {fallback}, which the kernels do not take; this call runs "
                   "jax.nn.dot_product_attention's XLA attention (O(seq_q x seq_k) memory).")
        out = jax.nn.dot_product_attention(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                                           query_seq_lengths=query_seq_lengths,
                                           key_value_seq_lengths=key_value_seq_lengths,
                                           local_window_size=local_window_size, implementation="xla")
        return out[0] if unbatched else out
    impl = _dispatch.choose_implementation(implementation)
    q, k, v, extras, opts = _arguments(query, key, value, bias, mask, scale, is_causal, query_seq_lengths,
                                       key_value_seq_lengths, window, impl)
    if q.size == 0 or k.shape[1] == 0:
        out = jnp.zeros(q.shape, q.dtype)
    else:
        out, lse = _dispatch.attention(q, k, v, extras, opts)
        if mask is not None or key_value_seq_lengths is not None or window is not None:
            out = _mean_where_unseen(out, lse, v, query_seq_lengths)
    return out[0] if unbatched else out


def _arguments(query, key, value, bias, mask, scale, is_causal, query_seq_lengths, key_value_seq_lengths, window,
               impl: str, target: str | None = None):
    """jax.nn's arguments (batched) as attention's: (q, k, v, Operands, dispatch.Options)."""
    b, sq, n, h = query.shape
    sk = key.shape[1]
    query, softmax_scale = _scaled(query, scale, h)
    q_ids, kv_ids = _length_ids(query_seq_lengths, key_value_seq_lengths, b, sq, sk)
    # top-left alignment: the band of a call whose diagonal is at (0, 0) (Operands.positions says so), where it
    # differs from attention's bottom-right one
    band, positions = None, None
    if (is_causal or window is not None) and sq != sk:
        band = _top_left_band(is_causal, window, sq, sk)
        positions = jnp.zeros((b, 3), jnp.int32)
    return api._prepare(query, key, value, is_causal, softmax_scale, window or (-1, -1), 0.0, None, 0.0, None, q_ids,
                        kv_ids, None, None, None, False, impl, target, bias=bias, mask=mask, band=band,
                        positions=positions)


def _check_window(local_window_size) -> tuple[int, int] | None:
    if local_window_size is None:
        return None
    if isinstance(local_window_size, int) and not isinstance(local_window_size, bool):
        local_window_size = (local_window_size, local_window_size)
    ok = (isinstance(local_window_size, (tuple, list)) and len(local_window_size) == 2
          and all(isinstance(w, int) and not isinstance(w, bool) for w in local_window_size))
    if not ok:
        raise TypeError(f"local_window_size must be an int or a pair of ints (left, right); got {local_window_size!r}")
    if min(local_window_size) < 0:
        raise ValueError(f"local_window_size values must be >= 0; got {tuple(local_window_size)}")
    return int(local_window_size[0]), int(local_window_size[1])


def _fallback_reason(query, key, value, bias) -> str | None:
    """What the kernels cannot take of a call, named, or None."""
    kernel_dtypes = [jnp.dtype(d) for d in _KERNEL_DTYPES]
    for name, x in (("query", query), ("key", key), ("value", value)):
        if jnp.dtype(x.dtype) not in kernel_dtypes:
            return f"{name} of dtype {jnp.dtype(x.dtype)}"
    if bias is not None and hasattr(bias, "dtype") and jnp.dtype(bias.dtype) not in kernel_dtypes:
        return f"bias of dtype {jnp.dtype(bias.dtype)}"
    if query.shape[-1] > api.MAX_HEAD_DIM:
        return f"head_dim {query.shape[-1]} (over {api.MAX_HEAD_DIM})"
    return None


def _scaled(query, scale, head_dim: int):
    """(query, softmax_scale): a static scale goes to the kernels as it is; a traced one scales the queries."""
    if scale is None:
        return query, 1.0 / math.sqrt(head_dim)
    if isinstance(scale, Real) and not isinstance(scale, bool):
        return query, float(scale)
    scale = jnp.asarray(scale)
    if scale.shape != () or not jnp.issubdtype(scale.dtype, jnp.floating):
        raise TypeError(f"scale must be a number or a scalar float array; got {scale.dtype} {scale.shape}")
    if not isinstance(scale, jax.core.Tracer):
        return query, float(scale)
    return (query.astype(jnp.float32) * scale).astype(query.dtype), 1.0


def _length_ids(query_seq_lengths, key_value_seq_lengths, b: int, sq: int, sk: int):
    """Segment ids (0: a real position; padded queries 1, padded keys 2, which nothing matches) from jax.nn's
    sequence lengths, or (None, None): the kernels bound their key and query loops by them (sorted ids)."""
    if query_seq_lengths is None and key_value_seq_lengths is None:
        return None, None
    ids = []
    for name, lengths, seq, pad in (("query_seq_lengths", query_seq_lengths, sq, 1),
                                    ("key_value_seq_lengths", key_value_seq_lengths, sk, 2)):
        if lengths is None:
            ids.append(jnp.zeros((b, seq), jnp.int32))
            continue
        lengths = jnp.asarray(lengths)
        if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer array of shape (batch,) = ({b},); got {lengths.dtype} "
                             f"{lengths.shape}")
        ids.append(jnp.where(jnp.arange(seq)[None, :] < lengths[:, None], 0, pad).astype(jnp.int32))
    return tuple(ids)


def _top_left_band(is_causal: bool, window, sq: int, sk: int) -> Band:
    """The band of query i seeing keys i - left .. i + right (diagonal at (0, 0)); a side that reaches every
    key of every row unbounded (-1)."""
    left, right = window if window is not None else (-1, -1)
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    return Band(-1 if left < 0 or left >= sq - 1 else left, -1 if right < 0 or right >= sk - 1 else right)


def _mean_where_unseen(out, lse, v, query_seq_lengths):
    """jax.nn's result for rows that see no key: its large-negative fill makes their softmax uniform over every
    key, so the mean of the values (padded query rows stay 0: jax.nn zeroes them)."""
    b, sq, n, _ = out.shape
    unseen = jnp.transpose(jnp.isneginf(lse), (0, 2, 1))  # (batch, seq_q, heads)
    if query_seq_lengths is not None:
        unseen = unseen & (jnp.arange(sq)[None, :] < jnp.asarray(query_seq_lengths)[:, None])[..., None]
    mean = jnp.repeat(jnp.mean(v.astype(jnp.float32), axis=1), n // v.shape[2], axis=1)  # (batch, heads, d)
    return jnp.where(unseen[..., None], mean[:, None].astype(out.dtype), out)


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)


# ----- FlashAttention: flash_attn_func -----

def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                    deterministic: bool = False, return_attn_probs: bool = False, *, dropout_rng=None):
    """FlashAttention's ``flash_attn_func`` (flash_attn 2.x argument names and order) over ``attention``,
    for code moving over from PyTorch. q (batch, seq_q, heads_q, head_dim), k/v (batch, seq_k,
    heads_kv, head_dim) as there. Differences: dropout needs ``dropout_rng`` (JAX has no global random
    state); ``deterministic`` is accepted and changes nothing, because this backward is always
    deterministic; ``return_attn_probs=True`` raises NotImplementedError (the kernels never
    form the probability matrix; use jax_flash_amd.reference.attention to inspect it)."""
    _check_flag("deterministic", deterministic)
    _check_flag("return_attn_probs", return_attn_probs)
    if return_attn_probs:
        raise NotImplementedError("flash_attn_func(return_attn_probs=True) is not supported: the kernels never "
                                  "form the attention probabilities. Call it with return_attn_probs=False, or use "
                                  "jax_flash_amd.attention(..., return_lse=True) for the logsumexp.")
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                     alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_rng=dropout_rng)


# ----- FlashAttention: flash_attn_with_kvcache -----

def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            k_descale=None, v_descale=None, implementation=None):
    """FlashAttention's flash_attn_with_kvcache (flash_attn/flash_attn_interface.py), functional: the same
    positional order, names and defaults, on jax_flash_amd.attention_with_kvcache. Forward only.

    Returns:
      Always the caches after the call, whatever is passed: `(out, k_cache, v_cache)`, or with
      return_softmax_lse `(out, softmax_lse, k_cache, v_cache)`. FlashAttention returns `out` or
      `(out, softmax_lse)` and updates the caches in place; JAX arrays are immutable, so the updated caches
      are returned (without k / v, the caches passed in, unchanged). out: q's shape and dtype; softmax_lse:
      (batch, heads_q, seq_q) float32, natural log (-inf, with out 0, for a row that sees no key).

    Arguments, as FlashAttention's (its docstring's words quoted):
      q: (batch, seq_q, heads_q, head_dim); k_cache, v_cache: (batch_cache, capacity, heads_kv, head_dim), or
        with block_table (num_pages, page_size, heads_kv, head_dim). FlashAttention asks page_size "a multiple
        of 256"; here a multiple of 16. Without cache_batch_idx a contiguous cache has q's batch.
      k, v: optional (batch, seq_new, heads_kv, head_dim): "we concatenate k with k_cache, starting at the
        indices specified by cache_seqlens"; then cache_seqlens is required (FlashAttention: "If key is
        supplied, seqlens_k must also be passed in").
      rotary_cos, rotary_sin, rotary_interleaved: rotary embedding is not implemented: rotary_cos or
        rotary_sin other than None raises NotImplementedError (apply the rotation to q and k before the
        call); rotary_interleaved is then ignored, as FlashAttention ignores it without them.
      cache_seqlens: int or (batch,) integer array, "the sequence lengths of the KV cache"; None (the
        default): every row's cache is full (capacity keys: k_cache.shape[1], or max_pages * page_size).
      cache_batch_idx: (batch,) integer array, "the indices used to index into the KV cache": row b of q
        uses cache row cache_batch_idx[b] (None: row b). Contiguous caches only (FlashAttention: "Paged
        KVcache does not support cache_batch_idx"). Those rows are gathered, and with k / v the updated rows
        are scattered back into exactly those rows of the returned caches (a copy of the rows used, where
        FlashAttention indexes in place); of duplicate indices, "the values updated in the cache might come
        from any of the duplicate indices". Indices must lie in [0, batch_cache).
      cache_leftpad: (batch,) integer array, "the index that the KV cache starts. If None, assume 0": row b
        attends to keys cache_leftpad[b] .. cache_seqlens[b] + seq_new - 1; cache_seqlens counts from the
        start of the cache, not from cache_leftpad, and new keys go to cache_seqlens[b] .. (FlashAttention's
        kernels read the row from cache_leftpad[b] with length cache_seqlens[b] - cache_leftpad[b]). The keys
        before it are never read. Also with block_table (FlashAttention refuses that pairing).
      block_table: (batch, max_pages) integer: row b's key j lies in page block_table[b, j // page_size].
      softmax_scale (None: 1 / sqrt(head_dim)), causal (False), window_size ((-1, -1): unbounded), softcap
        (0.0: off), alibi_slopes ((heads_q,) or (batch, heads_q) float32, "a bias of (-alibi_slope * |i +
        seqlen_k - seqlen_q - j|)"): as FlashAttention, the mask "aligned to the bottom right corner",
        seqlen_k being each row's cache_seqlens[b] + seq_new.
      num_splits: "If > 1, split the key/value into this many chunks along the sequence. If num_splits == 1,
        we don't split the key/value. If num_splits == 0, we use a heuristic" (ours: plan.decode_splits).
      return_softmax_lse: also return softmax_lse (see Returns).
      k_descale, v_descale (keyword only, FlashAttention 3's names): (batch, heads_kv) dequantisation
        factors of float8 caches, as in attention_with_kvcache.
      implementation (keyword only): "triton", "interpret" or "xla" (None: the default).

    Errors name the argument: ValueError / TypeError for bad shapes, dtypes, values (where concrete).
    """
    if rotary_cos is not None or rotary_sin is not None:
        raise NotImplementedError("flash_attn_with_kvcache: rotary embedding (rotary_cos / rotary_sin) is not "
                                  "implemented; rotate q and k before the call and pass rotary_cos=rotary_sin=None")
    _check_flag("rotary_interleaved", rotary_interleaved)
    _check_flag("return_softmax_lse", return_softmax_lse)
    caches = (k_cache, v_cache)
    if cache_batch_idx is not None:
        k_cache, v_cache, rows = _gather_rows(q, k_cache, v_cache, cache_batch_idx, block_table)
    if cache_seqlens is None:
        if k is not None or v is not None:
            raise ValueError("cache_seqlens is required with k / v (the new keys are written at cache_seqlens); "
                             "None means every row's cache is full")
        k_cache, v_cache = kvcache._check_arrays(q, k_cache, v_cache, None, None, block_table)[1:3]
        cache_seqlens = kvcache._capacity(k_cache, block_table)
    res = kvcache.attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens, k=k, v=v, block_table=block_table, causal=causal,
        softmax_scale=softmax_scale, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        k_descale=k_descale, v_descale=v_descale, return_lse=return_softmax_lse, num_splits=num_splits,
        cache_leftpad=cache_leftpad, implementation=implementation)
    res = res if isinstance(res, tuple) else (res,)
    head = res[:2] if return_softmax_lse else res[:1]
    if k is None:
        return (*head, *caches)
    new_k, new_v = res[len(head):]
    if cache_batch_idx is not None:
        new_k, new_v = (_scatter_rows(cache, updated, rows) for cache, updated in zip(caches, (new_k, new_v)))
    return (*head, new_k, new_v)


def _gather_rows(q, k_cache, v_cache, cache_batch_idx, block_table):
    """(k_cache rows, v_cache rows, the indices) of cache_batch_idx, checked (concrete indices in range)."""
    if block_table is not None:
        raise ValueError("cache_batch_idx applies to contiguous caches only; with block_table, address the rows' "
                         "pages through the block table")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not kvcache._is_array(x) or x.ndim != 4:
            raise TypeError(f"{name} must be a rank-4 array; got {getattr(x, 'shape', type(x).__name__)}")
    idx = cache_batch_idx
    if not kvcache._is_array(idx) or not jnp.issubdtype(idx.dtype, jnp.integer):
        raise TypeError(f"cache_batch_idx must be an integer array (batch,); got "
                        f"{getattr(idx, 'dtype', type(idx).__name__)}")
    if tuple(idx.shape) != (q.shape[0],):
        raise ValueError(f"cache_batch_idx must have shape (batch,) = ({q.shape[0]},); got {tuple(idx.shape)}")
    n = k_cache.shape[0]
    known = kvcache._concrete(idx)
    if known is not None and ((known < 0) | (known >= n)).any():
        raise ValueError(f"cache_batch_idx must lie in [0, {n}) (k_cache.shape[0], the cache's rows); got "
                         f"{known.tolist()}")
    # a traced index cannot be checked: out of range, reads are clamped into the cache and writes dropped
    rows = jnp.asarray(idx).astype(jnp.int32)
    take = jnp.clip(rows, 0, n - 1)
    return jnp.asarray(k_cache)[take], jnp.asarray(v_cache)[take], rows


def _scatter_rows(cache, updated, rows):
    """cache with its rows `rows` replaced by `updated`'s; out-of-range rows dropped, never written elsewhere."""
    n = cache.shape[0]
    rows = jnp.where((rows >= 0) & (rows < n), rows, n)
    return jnp.asarray(cache).at[rows].set(updated, mode="drop")
