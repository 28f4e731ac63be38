"""`dot_product_attention`: jax.nn.dot_product_attention's signature and semantics over the kernels."""
from __future__ import annotations

import functools
import math
import warnings
from numbers import Real

import jax
import jax.numpy as jnp

from jax_flash_amd import _dispatch, api
from jax_flash_amd.rules import Band

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
    q, k, v, extras, opts = _arguments(query, key, value, bias, mask, scale, is_causal, query_seq_lengths,
                                       key_value_seq_lengths, window, _dispatch.choose_implementation(implementation))
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


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a Python bool; got {type(value).__name__}")


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
