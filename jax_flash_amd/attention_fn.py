"""`flash_attention_fn`: the kernels as a drop-in `attention_fn` for Flax's attention modules
(flax.linen.MultiHeadDotProductAttention and flax.nnx.MultiHeadAttention), taking the keyword arguments
those pass."""
from __future__ import annotations

import functools
import math
import warnings

import jax.numpy as jnp

from jax_flash_amd import reference
from jax_flash_amd.compat import _mean_where_unseen
from jax_flash_amd.api import attention


def flash_attention_fn(query, key, value, bias=None, mask=None, broadcast_dropout: bool = True, dropout_rng=None,
                       dropout_rate: float = 0.0, deterministic: bool = False, dtype=None, precision=None,
                       module=None, is_causal: bool = False, force_fp32_for_softmax: bool = False,
                       qk_attn_weights_einsum=None, attn_weights_value_einsum=None, *, causal: bool = False,
                       q_segment_ids=None, kv_segment_ids=None, implementation: str | None = None):
    """Flax's ``dot_product_attention`` signature over ``jax_flash_amd.attention``.

    Use as ``attention_fn=jax_flash_amd.flash_attention_fn`` in ``flax.linen.MultiHeadDotProductAttention``
    or ``flax.nnx.MultiHeadAttention``; bind the options Flax does not pass with functools.partial, e.g.
    ``functools.partial(flash_attention_fn, causal=True)`` (nnx also passes ``is_causal``).

    query (batch..., q_len, heads_q, head_dim), key / value (batch..., kv_len, heads_kv, head_dim); heads_q
    a multiple of heads_kv. ``mask`` (nonzero: attended) and ``bias`` (batch..., heads | 1, q_len, kv_len), the
    ones Flax's modules pass (``nn.make_causal_mask``, ``nn.make_attention_mask`` padding masks, a relative-position
    bias), run in the kernels, read tile by tile; as in Flax, a row whose mask hides every key gives the mean of the values (Flax's
    large-negative fill makes its softmax uniform). Dropout (``dropout_rate`` > 0 and not ``deterministic``) is
    the kernels' in-kernel dropout with ``dropout_rng``; its mask is drawn independently per batch element and
    head, so ``broadcast_dropout=True`` (Flax's default: one mask shared along the batch) is not reproduced: a
    one-time warning says so. ``precision`` and ``force_fp32_for_softmax`` change nothing: the kernels always take
    exact dots of the input dtype and a float32 softmax. ``causal`` (or nnx's ``is_causal``) is bottom-right
    aligned, computed in the kernels: cheaper than a dense causal mask, the same for self-attention.

    ``module`` (attention weights to sow) runs on Flax's own ``dot_product_attention`` (O(N^2) memory; linen's for
    a linen ``module``, nnx's otherwise), correctly, with a one-time warning; there the causal mask stays
    bottom-right aligned and the segment ids apply, as on the kernels. Custom einsums
    (``qk_attn_weights_einsum`` etc., AQT) are refused with a ValueError.

    Segment ids of a 64-bit integer type (the default under ``jax_enable_x64``) are renumbered to int32
    per row (rank among the row's q and kv ids): equal ids stay equal and sorted ids sorted, so the
    result is the same for any values, including ones outside int32's range, jitted or not.
    """
    if qk_attn_weights_einsum is not None or attn_weights_value_einsum is not None:
        raise ValueError("flash_attention_fn cannot run custom einsums (qk_attn_weights_einsum / "
                         "attn_weights_value_einsum, e.g. AQT quantisation): the attention runs inside the "
                         "Triton kernels. Use Flax's dot_product_attention for those modules.")
    causal = bool(causal or is_causal)
    dtype = dtype or jnp.result_type(query, key, value)
    query, key, value = (jnp.asarray(x, dtype) for x in (query, key, value))
    dropout_p = 0.0 if deterministic else float(dropout_rate)
    if module is not None:
        _warn_once("jax_flash_amd.flash_attention_fn got attention weights to sow (a module), which the kernels "
                   "never form; this call runs on Flax's dot_product_attention (O(N^2) memory).")
        return _flax_attention(query, key, value, bias, mask, broadcast_dropout, dropout_rng, dropout_rate,
                               deterministic, dtype, precision, module, causal, q_segment_ids, kv_segment_ids)
    if dropout_p > 0 and broadcast_dropout:
        _warn_once("jax_flash_amd.flash_attention_fn: broadcast_dropout=True (one dropout mask shared along the "
                   "batch) is not reproduced; the kernels draw an independent mask per batch element and head "
                   "(as broadcast_dropout=False).")
    batch = query.shape[:-3]
    flat = lambda x: None if x is None else x.reshape(math.prod(batch), *x.shape[len(batch):])  # noqa: E731
    # ids of any integer width: attention converts wider ones (x64's default int64) to int32 exactly
    out, lse = attention(flat(query), flat(key), flat(value), causal=causal, dropout_p=dropout_p,
                         dropout_rng=dropout_rng if dropout_p > 0 else None, q_segment_ids=flat(q_segment_ids),
                         kv_segment_ids=flat(kv_segment_ids), bias=_flat_dense(bias, batch),
                         mask=_flat_dense(None if mask is None else jnp.asarray(mask).astype(bool), batch),
                         return_lse=True, implementation=implementation)
    if mask is not None:
        out = _mean_where_unseen(out, lse, flat(value), None)
    return out.reshape(query.shape)


def _flat_dense(x, batch: tuple[int, ...]):
    """A Flax mask or bias (batch..., heads | 1, q_len, kv_len), its batch axes each theirs or 1, as attention
    takes it: (batch | 1, heads | 1, q_len, kv_len), expanded only where some but not all batch axes broadcast."""
    if x is None:
        return None
    x = jnp.asarray(x)
    x = x.reshape((1,) * max(len(batch) + 3 - x.ndim, 0) + x.shape)
    lead, rest = x.shape[:len(batch)], x.shape[len(batch):]
    if all(n == 1 for n in lead):
        return x.reshape(1, *rest)
    if lead != batch:
        x = jnp.broadcast_to(x, batch + rest)
    return x.reshape(math.prod(batch), *rest)


def _flax_attention(query, key, value, bias, mask, broadcast_dropout, dropout_rng, dropout_rate, deterministic,
                    dtype, precision, module, causal, q_segment_ids, kv_segment_ids):
    """Flax's own dot_product_attention (sowing attention weights into `module`), with causal and the segment
    ids as the kernels apply them."""
    import flax.linen as nn
    from flax import nnx

    if q_segment_ids is not None or kv_segment_ids is not None:
        kv_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
        q_ids = kv_ids if q_segment_ids is None else q_segment_ids
        same = reference.segment_mask(q_ids, kv_ids)
        mask = same if mask is None else jnp.logical_and(mask, same)
    if causal:  # bottom-right aligned, as in the kernels (Flax's is_causal aligns top-left)
        sq, sk = query.shape[-3], key.shape[-3]
        below = jnp.tril(jnp.ones((sq, sk), jnp.bool_), sk - sq)
        mask = below if mask is None else jnp.logical_and(mask, below)
    if isinstance(module, nn.Module):  # sows into linen's 'intermediates' collection
        return nn.dot_product_attention(query, key, value, bias, mask, broadcast_dropout, dropout_rng,
                                        dropout_rate, deterministic, dtype, precision, module)
    return nnx.dot_product_attention(query, key, value, bias, mask, broadcast_dropout, dropout_rng, dropout_rate,
                                     deterministic, dtype, precision, module)


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)
