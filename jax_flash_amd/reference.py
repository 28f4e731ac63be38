"""Pure-JAX attention: the `xla` implementation (works on any backend, O(N^2) memory).

Numerics follow the kernels: logits in float32 from dots of the input dtype, softmax in float32,
unnormalised probabilities rounded to the input dtype before the PV dot, float32 accumulation,
normalisation last. Tests use it, in the input dtype, as the "same-dtype computation" that the
kernels' error is measured against.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_flash_amd.rules import Band, dropout_keep_scale, dropout_threshold

_HIGHEST = jax.lax.Precision.HIGHEST  # float32 inputs: true fp32 dots, not TF32


def dropout_seeds(rng, batch: int, heads: int) -> jax.Array:
    """(batch, heads, 2) uint32 Philox keys, one per (batch, query head), drawn from a JAX PRNG key.
    Computed outside the kernels, so a shard or a vmapped slice sees the keys of its own rows."""
    return jax.random.bits(rng, (batch, heads, 2), jnp.uint32)


def _umulhi(a, b):
    """High 32 bits of the 64-bit product of uint32 arrays, in 16-bit halves (no uint64 without x64)."""
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = b & 0xFFFF, b >> 16
    mid1 = a1 * b0 + ((a0 * b0) >> 16)
    mid2 = a0 * b1 + (mid1 & 0xFFFF)
    return a1 * b1 + (mid1 >> 16) + (mid2 >> 16)


def _philox(c0, c1, c2, c3, k0, k1, rounds: int = 7):
    """Philox 4x32 as Triton's tl.philox computes it (constants of Salmon et al. 2011)."""
    u32 = lambda x: jnp.uint32(x)  # noqa: E731
    for _ in range(rounds):
        c0, c1, c2, c3 = (_umulhi(u32(0xCD9E8D57), c2) ^ c1 ^ k0, u32(0xCD9E8D57) * c2,
                          _umulhi(u32(0xD2511F53), c0) ^ c3 ^ k1, u32(0xD2511F53) * c0)
        k0, k1 = k0 + u32(0x9E3779B9), k1 + u32(0xBB67AE85)
    return c0, c1, c2, c3


def dropout_keep(seeds, seq_q: int, seq_k: int, p: float) -> jax.Array:
    """(B, H, seq_q, seq_k) bool: the probabilities the kernels keep for Philox keys seeds (B, H, 2)
    uint32 (kernels/dropout.py, bit for bit): query 16a + 8m + l and key 32b + 8i + 2t + j take byte
    8m + 2i + j of the call with counter (4b + t, 8a + l, 0, 0)."""
    na, nb = -(-seq_q // 16), -(-seq_k // 32)
    c0 = jnp.broadcast_to(jnp.arange(4 * nb, dtype=jnp.uint32)[None, :], (8 * na, 4 * nb))  # 4b + t
    c1 = jnp.broadcast_to(jnp.arange(8 * na, dtype=jnp.uint32)[:, None], (8 * na, 4 * nb))  # 8a + l
    zero = jnp.zeros_like(c0)
    k0, k1 = seeds[..., 0, None, None], seeds[..., 1, None, None]
    words = jnp.stack(_philox(c0, c1, zero, zero, k0, k1), axis=-1)  # [..., 8a + l, 4b + t, n // 4]
    random_bytes = jnp.stack([(words >> (8 * r)) & 0xFF for r in range(4)], axis=-1)  # byte n = 8m + 2i + j
    lead = seeds.shape[:-1]
    random_bytes = random_bytes.reshape(*lead, na, 8, nb, 4, 2, 4, 2)  # [..., a, l, b, t, m, i, j]
    n = len(lead)
    random_bytes = random_bytes.transpose(*range(n), n, n + 4, n + 1, n + 2, n + 5, n + 3, n + 6)  # a m l b i t j
    random_bytes = random_bytes.reshape(*lead, 16 * na, 32 * nb)[..., :seq_q, :seq_k]
    return random_bytes >= dropout_threshold(p)


def segment_mask(q_segment_ids, kv_segment_ids) -> jax.Array:
    """(batch..., 1, Sq, Sk) bool for ids (batch..., Sq) / (batch..., Sk): query and key share an id."""
    return (q_segment_ids[..., :, None] == kv_segment_ids[..., None, :])[..., None, :, :]


def attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
              dropout_p: float = 0.0, dropout_seeds=None, q_segment_ids=None, kv_segment_ids=None,
              band: Band | None = None):
    """(out, lse) for q (B, Sq, H, D), k/v (B, Sk, H_kv, D) with H a multiple of H_kv (grouped-query
    attention: query head h uses key/value head h // (H // H_kv)); lse (B, H, Sq) float32, natural log.

    A query row that sees no key gives out = 0 and lse = -inf, with zero gradients. softcap > 0: logits
    softcap * tanh(logits / softcap); alibi_slopes (B, H) float32: logits -= slope * |i + Sk - Sq - j|;
    q_segment_ids (B, Sq) / kv_segment_ids (B, Sk) int32: only equal ids attend; dropout_p > 0 with
    dropout_seeds (B, H, 2) uint32 (see dropout_seeds): the kernels' dropout mask, kept values scaled
    by 1 / (1 - rate), rate = rules.dropout_rate(p) (p rounded to a multiple of 1/256); lse is that of
    the probabilities before dropout. band: the call's rules.Band, when the caller has it (else made
    from causal and window_size).
    """
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    group = q.shape[2] // k.shape[2]
    if group > 1:  # the O(N^2) reference may copy K/V per query head; the kernels do not
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32, precision=_HIGHEST) * scale
    if softcap > 0:
        s = softcap * jnp.tanh(s / softcap)
    if alibi_slopes is not None:
        sq, sk = q.shape[1], k.shape[1]
        dist = jnp.abs(jnp.arange(sq)[:, None] + (sk - sq) - jnp.arange(sk)[None, :]).astype(jnp.float32)
        s = s - jax.lax.stop_gradient(alibi_slopes)[:, :, None, None] * dist
    if band is None:
        band = Band.of(causal, window_size, q.shape[1], k.shape[1])
    seen = band.visible(q.shape[1], k.shape[1])
    if q_segment_ids is not None:
        seen = seen & segment_mask(q_segment_ids, kv_segment_ids)
    s = jnp.where(seen, s, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1))
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # empty rows: exp(-inf - 0) = 0, no NaN
    p = jnp.exp(s - m[..., None])
    l = jnp.sum(p, axis=-1)
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    if dropout_p > 0:
        p = jnp.where(dropout_keep(dropout_seeds, q.shape[1], k.shape[1], dropout_p), p, 0.0)
    acc = jnp.einsum("bhqk,bkhd->bqhd", p.astype(q.dtype), v, preferred_element_type=jnp.float32,
                     precision=_HIGHEST)
    out = acc / jnp.transpose(l_safe, (0, 2, 1))[..., None]
    if dropout_p > 0:
        out = out * dropout_keep_scale(dropout_p)
    lse = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))
    return out.astype(q.dtype), lse
