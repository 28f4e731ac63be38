"""`FlashSelfAttention` for flax.nnx: flax.nnx.MultiHeadAttention's constructor, parameters and call
arguments (it is a subclass), with the attention in the Triton kernels."""
from __future__ import annotations

from flax import nnx

from jax_flash_amd.attention_fn import flash_attention_fn
from jax_flash_amd.linen import decode_step, kv_inputs, kvcache_step


class FlashSelfAttention(nnx.MultiHeadAttention):
    """Multi-head attention mirroring ``flax.nnx.MultiHeadAttention`` (same constructor arguments,
    including ``num_kv_heads`` for grouped-query attention and ``in_kv_features``, and the same parameters:
    ``query``, ``key``, ``value``, ``out``), plus ``causal`` and ``implementation``
    (jax_flash_amd.attention's).

    ``__call__`` takes Flax's arguments, ``(inputs_q, inputs_k=None, inputs_v=None, *, mask=None,
    deterministic=None, rngs=None, sow_weights=False, decode=None, is_causal=False, out_sharding=None,
    qkv_sharding=None)``, plus ``segment_ids`` / ``kv_segment_ids`` (batch..., length) integer ids for
    packed sequences (kv_segment_ids defaults to segment_ids). ``is_causal`` or the constructor's
    ``causal`` turns on the causal mask (bottom-right aligned, in the kernels). A dense ``mask`` runs in the
    kernels, read tile by tile; ``sow_weights=True`` runs on Flax's attention (O(N^2) memory) with a one-time
    warning. Dropout takes
    its key from ``rngs`` or the module's own dropout stream and runs inside the kernels; masks are
    independent per batch element and head (``broadcast_dropout`` must be False). ``decode=True`` uses the
    cache of ``init_cache`` as Flax does, attending to it with ``attention_with_kvcache`` (the split-KV
    decode kernels; ``cache_index`` is the cache length), several positions per call allowed (chunked
    prefill); with a dense ``mask``, ``sow_weights`` or dropout, one position per call through segment ids.
    """

    def __init__(self, num_heads: int, in_features: int, qkv_features: int | None = None,
                 out_features: int | None = None, num_kv_heads: int | None = None, in_kv_features: int | None = None,
                 *, causal: bool = False, implementation: str | None = None, broadcast_dropout: bool = False,
                 **kwargs):
        if "attention_fn" in kwargs:
            raise TypeError("FlashSelfAttention does not take attention_fn (the attention runs on the kernels)")
        if broadcast_dropout:
            raise ValueError("broadcast_dropout=True is not supported: the kernels draw an independent dropout "
                             "mask per batch element and head")
        super().__init__(num_heads, in_features, qkv_features, out_features, num_kv_heads, in_kv_features,
                         broadcast_dropout=False, attention_fn=flash_attention_fn, **kwargs)
        self.causal = causal
        self.implementation = implementation

    def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, mask=None, deterministic: bool | None = None,
                 rngs=None, sow_weights: bool = False, decode: bool | None = None, is_causal: bool = False,
                 out_sharding=None, qkv_sharding=None, segment_ids=None, kv_segment_ids=None):
        inputs_k, inputs_v = kv_inputs(inputs_q, inputs_k, inputs_v)
        if inputs_q.shape[-1] != self.in_features:
            raise ValueError(f"inputs_q has {inputs_q.shape[-1]} features; the module expects {self.in_features}")
        query = self.query(inputs_q, out_sharding=qkv_sharding)
        key = self.key(inputs_k, out_sharding=qkv_sharding)
        value = self.value(inputs_v, out_sharding=qkv_sharding)
        if self.normalize_qk:
            query, key = self.query_ln(query), self.key_ln(key)
        ids = (segment_ids, segment_ids if kv_segment_ids is None else kv_segment_ids)
        causal = bool(self.causal or is_causal)
        rng, rate = None, 0.0
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.dropout_rate > 0:
            if deterministic is None:
                raise ValueError("dropout_rate > 0 needs `deterministic`, in the constructor or the call")
            if not deterministic:
                stream = rngs.dropout if isinstance(rngs, nnx.Rngs) else rngs if rngs is not None else self.rngs
                if stream is None:
                    raise ValueError("dropout needs rngs: pass rngs= to the call (the module was built with "
                                     "keep_rngs=False)")
                rng, rate = stream(), self.dropout_rate
        if self.decode if decode is None else decode:
            if self.cached_key is None:
                raise ValueError("decode=True needs the cache: call init_cache(input_shape) first")
            if segment_ids is not None or kv_segment_ids is not None:
                raise ValueError("segment_ids cannot be combined with decode=True")
            if mask is None and not sow_weights and rate == 0:  # the KV-cache kernels, any number of positions
                out, self.cached_key[...], self.cached_value[...], self.cache_index[...] = kvcache_step(
                    query, key, value, self.cache_index[...], self.cached_key[...], self.cached_value[...], causal,
                    self.implementation)
                return self.out(out, out_sharding=out_sharding)
            # a dense mask, weights to sow or dropout: Flax's one position per call, through segment ids
            key, value, ids, self.cache_index[...] = decode_step(self.cache_index[...], self.cached_key[...],
                                                                 self.cached_value[...], key, value)
            self.cached_key[...], self.cached_value[...] = key, value
            causal = False

        out = flash_attention_fn(query, key, value, mask=mask, dropout_rng=rng, dropout_rate=rate,
                                 deterministic=rate == 0, broadcast_dropout=False, dtype=self.dtype,
                                 precision=self.precision, module=self if sow_weights else None, causal=causal,
                                 q_segment_ids=ids[0], kv_segment_ids=ids[1], implementation=self.implementation)
        return self.out(out, out_sharding=out_sharding)
