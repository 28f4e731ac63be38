"""Pure-JAX attention: the `xla` implementation (works on any backend, O(N^2) memory).

Numerics follow the kernels: logits in float32 from dots of the input dtype, softmax in float32,
unnormalised probabilities rounded to the input dtype before the PV dot, float32 accumulation,
normalisation last. Tests use it, in the input dtype, as the "same-dtype computation" that the
kernels' error is measured against.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST  # float32 inputs: true fp32 dots, not TF32


def band_edges(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """(left, right) of the visible band, -1 unbounded: causal caps right at 0 (FlashAttention's rule)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def visible(seq_q: int, seq_k: int, causal: bool, window: tuple[int, int] = (-1, -1)) -> jax.Array:
    """(seq_q, seq_k) bool: query i sees key j. Bottom-right aligned like FlashAttention: with
    diag = seq_k - seq_q, i + diag - left <= j <= i + diag + right (-1: unbounded); causal: right <= 0."""
    left, right = band_edges(causal, window)
    i = jnp.arange(seq_q)[:, None] + (seq_k - seq_q)
    j = jnp.arange(seq_k)[None, :]
    ok = jnp.ones((seq_q, seq_k), bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None):
    """(out, lse) for q (B, Sq, H, D), k/v (B, Sk, H_kv, D) with H a multiple of H_kv (grouped-query
    attention: query head h uses key/value head h // (H // H_kv)); lse (B, H, Sq) float32, natural log.

    A query row that sees no key gives out = 0 and lse = -inf, with zero gradients. softcap > 0: logits
    softcap * tanh(logits / softcap); alibi_slopes (B, H) float32: logits -= slope * |i + Sk - Sq - j|.
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
    s = jnp.where(visible(q.shape[1], k.shape[1], causal, window_size), s, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1))
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # empty rows: exp(-inf - 0) = 0, no NaN
    p = jnp.exp(s - m[..., None])
    l = jnp.sum(p, axis=-1)
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    acc = jnp.einsum("bhqk,bkhd->bqhd", p.astype(q.dtype), v, preferred_element_type=jnp.float32,
                     precision=_HIGHEST)
    out = acc / jnp.transpose(l_safe, (0, 2, 1))[..., None]
    lse = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))
    return out.astype(q.dtype), lse
