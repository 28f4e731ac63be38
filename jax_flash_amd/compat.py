"""Other libraries' attention APIs on jax_flash_amd: their names, arguments, defaults and semantics, so code
written against them runs after changing an import. One section per foreign API:

- FlashAttention (flash_attn.flash_attn_interface): flash_attn_with_kvcache. (flash_attn_func lives in
  jax_flash_amd.api, next to the attention it wraps.)

Where the foreign API mutates its arguments, the function here returns the updated arrays instead (JAX arrays
are immutable), with a return structure that does not depend on which optional arguments are passed.
"""
from __future__ import annotations

import jax.numpy as jnp

from jax_flash_amd import kvcache
from jax_flash_amd.api import _check_flag


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
