"""`FlashSelfAttention` for flax.linen: MultiHeadDotProductAttention's fields and parameter tree, with the
attention in the Triton kernels."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.attention import default_kernel_init

from jax_flash_amd.attention_fn import flash_attention_fn


def decode_step(cache_index, cached_key, cached_value, key, value):
    """One autoregressive step on a key/value cache (batch..., max_len, heads_kv, head_dim): writes key /
    value (one position) at cache_index and returns (keys, values, (q ids, kv ids)), ids that let the one
    query see the cached positions <= cache_index (segment ids: 1 there, 0 beyond), and the next index."""
    *batch, max_len, _, _ = cached_key.shape
    if key.shape[-3] != 1:
        raise ValueError(f"decode=True feeds one position per call; got a length of {key.shape[-3]}")
    zero = jnp.zeros((), jnp.int32)
    at = (zero,) * len(batch) + (cache_index, zero, zero)
    keys = jax.lax.dynamic_update_slice(cached_key, key.astype(cached_key.dtype), at)
    values = jax.lax.dynamic_update_slice(cached_value, value.astype(cached_value.dtype), at)
    kv_ids = jnp.broadcast_to((jnp.arange(max_len) <= cache_index).astype(jnp.int32), (*batch, max_len))
    q_ids = jnp.ones((*batch, 1), jnp.int32)
    return keys, values, (q_ids, kv_ids), cache_index + 1


def kvcache_step(query, key, value, cache_index, cached_key, cached_value, causal: bool, implementation):
    """One decode call on a Flax cache (batch..., max_len, heads_kv, head_dim) through
    attention_with_kvcache (the split-KV kernels): key / value (any number of new positions) are written at
    cache_index, the query attends to the cache up to them (causal: bottom-right aligned). Returns (out,
    cached_key, cached_value, next index); the cache's dtype is the computation's."""
    from jax_flash_amd.kvcache import attention_with_kvcache

    *batch, max_len, _, _ = cached_key.shape
    flat = lambda x: x.reshape(math.prod(batch), *x.shape[len(batch):]).astype(cached_key.dtype)  # noqa: E731
    out, keys, values = attention_with_kvcache(
        flat(query), flat(cached_key), flat(cached_value), jnp.broadcast_to(cache_index, (math.prod(batch),)),
        k=flat(key), v=flat(value), causal=causal, implementation=implementation)
    return (out.reshape(query.shape).astype(query.dtype), keys.reshape(cached_key.shape),
            values.reshape(cached_value.shape), cache_index + key.shape[-3])


def kv_inputs(inputs_q, inputs_k, inputs_v, inputs_kv=None):
    """(inputs_k, inputs_v) as Flax's attention modules resolve them: both default to inputs_q, inputs_v
    to inputs_k; inputs_kv (linen's deprecated form) gives both."""
    if inputs_kv is not None:
        if inputs_k is not None or inputs_v is not None:
            raise ValueError("inputs_kv cannot be combined with inputs_k / inputs_v")
        return inputs_kv, inputs_kv
    if inputs_k is None:
        if inputs_v is not None:
            raise ValueError("inputs_k cannot be None if inputs_v is given (pass the one array as inputs_k)")
        inputs_k = inputs_q
    return inputs_k, inputs_k if inputs_v is None else inputs_v


class FlashSelfAttention(nn.Module):
    """Multi-head self-attention with the fields of ``flax.linen.MultiHeadDotProductAttention`` and the same
    parameter tree (``query``, ``key``, ``value``, ``out``; ``query_ln`` / ``key_ln`` with normalize_qk), so
    a checkpoint of either loads into the other; given Flax's module a causal mask and ``causal=True`` here,
    both compute the same function.

    Extra fields: ``causal`` (bottom-right aligned causal mask, computed in the kernels) and
    ``implementation`` (jax_flash_amd.attention's). ``__call__`` takes Flax's arguments, ``(inputs_q,
    inputs_k=None, inputs_v=None, *, inputs_kv=None, mask=None, deterministic=None, dropout_rng=None,
    sow_weights=False)``, plus ``segment_ids`` / ``kv_segment_ids``: inputs (batch..., length, features);
    inputs_k / inputs_v give cross-attention (default: inputs_q); segment_ids (batch..., q_length) integer
    ids restrict attention to equal ids (packed sequences), kv_segment_ids (default: segment_ids) those of
    the keys. A dense ``mask`` (batch..., heads | 1, q_length, kv_length) runs in the kernels, read tile by
    tile, as ``flash_attention_fn`` takes it; ``sow_weights=True`` runs on Flax's attention (O(N^2) memory)
    with a one-time warning. Dropout (``dropout_rate`` > 0, not deterministic)
    takes ``dropout_rng`` or the module's 'dropout' rng stream and runs inside the kernels (no dense mask);
    masks are independent per batch element and head, so ``broadcast_dropout`` must stay False.
    ``decode=True`` keeps Flax's autoregressive cache (same variables) and attends to it with
    ``attention_with_kvcache`` (the split-KV decode kernels; the cache index is the cache length), which
    also takes several positions per call (chunked prefill): each new position sees the cache and, with
    ``causal=True``, the new positions up to itself; with ``causal=False``, all the new positions. With a
    dense ``mask``, ``sow_weights`` or dropout it takes Flax's one position per call, through segment ids.
    """
    num_heads: int
    dtype: Any = None
    param_dtype: Any = jnp.float32
    qkv_features: int | None = None
    out_features: int | None = None
    broadcast_dropout: bool = False
    dropout_rate: float = 0.0
    deterministic: bool | None = None
    precision: Any = None
    kernel_init: Callable = default_kernel_init
    out_kernel_init: Callable | None = None
    bias_init: Callable = nn.initializers.zeros_init()
    out_bias_init: Callable | None = None
    use_bias: bool = True
    decode: bool = False
    normalize_qk: bool = False
    causal: bool = False
    implementation: str | None = None

    @nn.compact
    def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None, mask=None,
                 deterministic: bool | None = None, dropout_rng=None, sow_weights: bool = False, segment_ids=None,
                 kv_segment_ids=None):
        inputs_k, inputs_v = kv_inputs(inputs_q, inputs_k, inputs_v, inputs_kv)
        qkv_features = self.qkv_features or inputs_q.shape[-1]
        if qkv_features % self.num_heads:
            raise ValueError(f"qkv_features ({qkv_features}) must be divisible by num_heads ({self.num_heads})")
        if self.broadcast_dropout and self.dropout_rate > 0:
            raise ValueError("broadcast_dropout=True is not supported: the kernels draw an independent dropout "
                             "mask per batch element and head; set broadcast_dropout=False")
        dense = functools.partial(nn.DenseGeneral, axis=-1, dtype=self.dtype, param_dtype=self.param_dtype,
                                  features=(self.num_heads, qkv_features // self.num_heads),
                                  kernel_init=self.kernel_init, bias_init=self.bias_init, use_bias=self.use_bias,
                                  precision=self.precision)
        query, key, value = dense(name="query")(inputs_q), dense(name="key")(inputs_k), dense(name="value")(inputs_v)
        if self.normalize_qk:
            ln = functools.partial(nn.LayerNorm, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
            query, key = ln(name="query_ln")(query), ln(name="key_ln")(key)

        ids = (segment_ids, segment_ids if kv_segment_ids is None else kv_segment_ids)
        causal = self.causal
        rng, rate = None, 0.0
        if self.dropout_rate > 0 and not nn.merge_param("deterministic", self.deterministic, deterministic):
            rng, rate = self.make_rng("dropout") if dropout_rng is None else dropout_rng, self.dropout_rate
        out = None
        if self.decode:
            initialized = self.has_variable("cache", "cached_key")
            cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
            cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
            index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
            if initialized:
                if segment_ids is not None or kv_segment_ids is not None:
                    raise ValueError("segment_ids cannot be combined with decode=True")
                if mask is None and not sow_weights and rate == 0:  # the KV-cache kernels, any number of positions
                    out, cached_key.value, cached_value.value, index.value = kvcache_step(
                        query, key, value, index.value, cached_key.value, cached_value.value, causal,
                        self.implementation)
                else:  # a dense mask, weights to sow or dropout: Flax's one position per call, via segment ids
                    key, value, ids, index.value = decode_step(index.value, cached_key.value, cached_value.value,
                                                               key, value)
                    cached_key.value, cached_value.value = key, value
                    causal = False  # the ids say which cached positions the query sees

        if out is None:
            out = flash_attention_fn(query, key, value, mask=mask, dropout_rng=rng, dropout_rate=rate,
                                     deterministic=rate == 0, broadcast_dropout=False, dtype=self.dtype,
                                     precision=self.precision, module=self if sow_weights else None, causal=causal,
                                     q_segment_ids=ids[0], kv_segment_ids=ids[1], implementation=self.implementation)
        return nn.DenseGeneral(features=self.out_features or inputs_q.shape[-1], axis=(-2, -1),
                               kernel_init=self.out_kernel_init or self.kernel_init,
                               bias_init=self.out_bias_init or self.bias_init, use_bias=self.use_bias,
                               dtype=self.dtype, param_dtype=self.param_dtype, precision=self.precision,
                               name="out")(out)
