"""`FlashSelfAttention` for flax.nnx: flax.nnx.MultiHeadAttention's constructor and parameters (it is a
subclass), with the attention in the Triton kernels."""
from __future__ import annotations

from flax import nnx

from jax_flash_amd.attention_fn import flash_attention_fn
from jax_flash_amd.linen import decode_step


class FlashSelfAttention(nnx.MultiHeadAttention):
    """Multi-head self-attention mirroring ``flax.nnx.MultiHeadAttention`` (same constructor arguments,
    including ``num_kv_heads`` for grouped-query attention, and the same parameters: ``query``, ``key``,
    ``value``, ``out``), plus ``causal`` and ``implementation`` (jax_flash_amd.attention's).

    ``__call__(x, *, segment_ids=None, deterministic=None, rngs=None, decode=None)``: x (batch...,
    length, in_features); segment_ids (batch..., length) int32 for packed sequences. Dropout takes its key
    from ``rngs`` or the module's own dropout stream and runs inside the kernels; masks are independent
    per batch element and head (``broadcast_dropout`` must be False). ``decode=True`` uses the cache of
    ``init_cache`` as Flax does, attending to it through segment ids on the kernels.
    """

    def __init__(self, num_heads: int, in_features: int, qkv_features: int | None = None,
                 out_features: int | None = None, num_kv_heads: int | None = None, *, causal: bool = False,
                 implementation: str | None = None, broadcast_dropout: bool = False, **kwargs):
        for name in ("attention_fn", "in_kv_features"):
            if name in kwargs:
                raise TypeError(f"FlashSelfAttention does not take {name} (self-attention on the kernels)")
        if broadcast_dropout:
            raise ValueError("broadcast_dropout=True is not supported: the kernels draw an independent dropout "
                             "mask per batch element and head")
        super().__init__(num_heads, in_features, qkv_features, out_features, num_kv_heads,
                         broadcast_dropout=False, attention_fn=flash_attention_fn, **kwargs)
        self.causal = causal
        self.implementation = implementation

    def __call__(self, x, *, segment_ids=None, deterministic: bool | None = None, rngs=None,
                 decode: bool | None = None):
        query, key, value = self.query(x), self.key(x), self.value(x)
        if self.normalize_qk:
            query, key = self.query_ln(query), self.key_ln(key)
        ids, causal = (segment_ids, segment_ids), self.causal
        if self.decode if decode is None else decode:
            if self.cached_key is None:
                raise ValueError("decode=True needs the cache: call init_cache(input_shape) first")
            if segment_ids is not None:
                raise ValueError("segment_ids cannot be combined with decode=True")
            key, value, ids, self.cache_index[...] = decode_step(self.cache_index[...], self.cached_key[...],
                                                                 self.cached_value[...], key, value)
            self.cached_key[...], self.cached_value[...] = key, value
            causal = False

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
        out = flash_attention_fn(query, key, value, dropout_rng=rng, dropout_rate=rate, deterministic=rate == 0,
                                 broadcast_dropout=False, dtype=self.dtype, causal=causal, q_segment_ids=ids[0],
                                 kv_segment_ids=ids[1], implementation=self.implementation)
        return self.out(out)
