"""Pure-JAX attention: the `xla` implementation (works on any backend, O(N^2) memory).

Numerics follow the kernels: logits in float32 from dots of the input dtype, softmax in float32,
unnormalised probabilities rounded to the input dtype before the PV dot, float32 accumulation,
normalisation last. Tests use it, in the input dtype, as the "same-dtype computation" that the
kernels' error is measured against.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_flash_amd.rules import Band, dropout_keep_scale, dropout_threshold

_HIGHEST = jax.lax.Precision.HIGHEST  # float32 inputs: true fp32 dots, not TF32
_F32_MIN = float(jnp.finfo(jnp.float32).min)


def dropout_seeds(rng, batch: int, heads: int) -> jax.Array:
    """(batch, heads, 2) uint32 dropout seeds, one per (batch, query head), drawn from a JAX PRNG key.
    Computed outside the kernels, so a shard or a vmapped slice sees the keys of its own rows."""
    return jax.random.bits(rng, (batch, heads, 2), jnp.uint32)


def _mix(x):
    """lowbias32 over uint32 arrays (kernels/dropout.py _mix)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _line(index, key, multiplier: int):
    x = (index.astype(jnp.uint32) ^ key) * jnp.uint32(multiplier)
    return x ^ (x >> 16)


def dropout_bytes(seeds, seq_q: int, seq_k: int, row0=None, col0=None) -> jax.Array:
    """(B, H, seq_q, seq_k) uint32 in [0, 256): the random byte of every probability for seeds (B, H, 2) uint32
    (kernels/dropout.py, bit for bit). row0, col0 (B,) int32 (both or neither): the rows and keys are those of a
    larger call from these positions on (operands.Operands.positions)."""
    seeds = jax.lax.bitcast_convert_type(jnp.asarray(seeds), jnp.uint32)  # int32 bits too: logical shifts below
    lo, hi = seeds[..., 0, None], seeds[..., 1, None]  # (B, H, 1)
    key_q = _mix(lo ^ _mix(hi ^ jnp.uint32(0x5BD1E995)))
    key_k = _mix(hi ^ _mix(lo + jnp.uint32(0x27D4EB2F)))
    rows, cols = jnp.arange(seq_q, dtype=jnp.int32), jnp.arange(seq_k, dtype=jnp.int32)
    if row0 is not None:  # per batch row
        rows = rows + row0.astype(jnp.int32)[:, None, None]
        cols = cols + col0.astype(jnp.int32)[:, None, None]
    r = _line(rows, key_q, 0x9E3779B1)[..., :, None]
    x = (r ^ _line(cols, key_k, 0x85EBCA77)[..., None, :]) * (r | jnp.uint32(1))
    return x >> 24


def dropout_keep(seeds, seq_q: int, seq_k: int, p: float, row0=None, col0=None) -> jax.Array:
    """(B, H, seq_q, seq_k) bool: the probabilities the kernels keep at rate p (dropout_bytes >= the threshold)."""
    return dropout_bytes(seeds, seq_q, seq_k, row0, col0) >= dropout_threshold(p)


def segment_mask(q_segment_ids, kv_segment_ids) -> jax.Array:
    """(batch..., 1, Sq, Sk) bool for ids (batch..., Sq) / (batch..., Sk): query and key share an id."""
    return (q_segment_ids[..., :, None] == kv_segment_ids[..., None, :])[..., None, :, :]


def attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
              dropout_p: float = 0.0, dropout_seeds=None, q_segment_ids=None, kv_segment_ids=None,
              band: Band | None = None, positions=None, bias=None, mask=None):
    """(out, lse) for q (B, Sq, H, D), k/v (B, Sk, H_kv, D) with H a multiple of H_kv (grouped-query
    attention: query head h uses key/value head h // (H // H_kv)); lse (B, H, Sq) float32, natural log.

    A query row that sees no key gives out = 0 and lse = -inf, with zero gradients. softcap > 0: logits
    softcap * tanh(logits / softcap); alibi_slopes (B, H) float32: logits -= slope * |i + Sk - Sq - j|;
    q_segment_ids (B, Sq) / kv_segment_ids (B, Sk) int32: only equal ids attend; dropout_p > 0 with
    dropout_seeds (B, H, 2) uint32 (see dropout_seeds): the kernels' dropout mask, kept values scaled
    by 1 / (1 - rate), rate = rules.dropout_rate(p) (p rounded to a multiple of 1/256); lse is that of
    the probabilities before dropout. band: the call's rules.Band when the caller has it (else made
    from causal and window_size). positions (B, 3) int32: the call is a block of a larger one
    (operands.Operands.positions); band, ALiBi and dropout follow the larger call's positions. bias (added to the
    logits after softcap and ALiBi) and mask (bool: False hides a pair), each broadcastable to (B, H, Sq, Sk);
    the bias gets a gradient (summed over the axes it broadcasts along).

    Gradients (reverse mode, any order; alibi_slopes get none) follow the kernels' backward, kernels/bwd.py:
    only (q, k, v, out, lse) are saved, P is recomputed (normalised by its row sum), and the softmax backward
    dS = P * (dP - delta), delta = rowsum(P * dP) - dLse, runs in float32; P and dS are rounded to the
    input dtype only where the kernels round them, before the dV, dQ and dK dots. (Differentiating the
    forward instead would round the cotangent of P, so a row that sees one key would get noise where
    its dq and dk are exactly 0.) Forward-mode differentiation (jax.jvp, jax.jacfwd) of this function
    alone is not available (a custom_vjp); forward-over-reverse (Hessian-vector products) is.
    """
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    if band is None:
        band = Band.of(causal, tuple(window_size), q.shape[1], k.shape[1])
    static = _Static(band, float(scale), float(softcap), float(dropout_p))
    return _attention(static, q, k, v, alibi_slopes, dropout_seeds, q_segment_ids, kv_segment_ids, positions, bias,
                      mask)


class _Static(NamedTuple):
    """The hashable, non-differentiable options of attention()."""
    band: Band
    scale: float
    softcap: float
    dropout_p: float


def _shift(positions, seq_q: int, seq_k: int):
    """(B,) int32: how far positions move the diagonal (kernels/masking.py `place`), or None."""
    if positions is None:
        return None
    return positions[:, 0] - positions[:, 1] + positions[:, 2] - (seq_k - seq_q)


def _keep(st: _Static, seeds, positions, seq_q: int, seq_k: int):
    corner = () if positions is None else (positions[:, 0], positions[:, 1])
    return dropout_keep(seeds, seq_q, seq_k, st.dropout_p, *corner)


def _logits(st: _Static, q, k, slopes, q_ids, kv_ids, positions, bias=None, mask=None):
    """(s, dcap, seen): float32 logits (B, H, Sq, Sk) from dots of the input dtype (k already repeated
    per query head), d s / d(scale * q.k) (1 - tanh^2 with softcap, else None), and the visibility mask."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32, precision=_HIGHEST) * st.scale
    dcap = None
    if st.softcap > 0:
        t = jnp.tanh(s / st.softcap)
        s, dcap = st.softcap * t, 1.0 - t * t
    sq, sk = q.shape[1], k.shape[1]
    shift = _shift(positions, sq, sk)
    if slopes is not None:
        dist = jnp.arange(sq)[:, None] + (sk - sq) - jnp.arange(sk)[None, :]
        if shift is not None:
            dist = dist + shift[:, None, None, None]  # (B, 1, Sq, Sk)
        s = s - jax.lax.stop_gradient(slopes)[:, :, None, None] * jnp.abs(dist).astype(jnp.float32)
    if bias is not None:  # floored at finfo.min as the kernels floor it: -inf hides a pair, a row of it is uniform
        b = bias.astype(jnp.float32)
        s = s + jnp.where(b < _F32_MIN, _F32_MIN, b)
    seen = st.band.visible(sq, sk, shift)
    if q_ids is not None:
        seen = seen & segment_mask(q_ids, kv_ids)
    if mask is not None:
        seen = seen & mask
    return s, dcap, seen


def _per_query_head(q, k, v):
    """k, v repeated to q's heads (the O(N^2) reference may copy them; the kernels do not)."""
    group = q.shape[2] // k.shape[2]
    if group > 1:
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    return k, v


def _forward(st: _Static, q, k, v, slopes, seeds, q_ids, kv_ids, positions, bias=None, mask=None):
    """(out, lse), plain JAX (also what second derivatives differentiate)."""
    k, v = _per_query_head(q, k, v)
    s, _, seen = _logits(st, q, k, slopes, q_ids, kv_ids, positions, bias, mask)
    s = jnp.where(seen, s, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1))
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # empty rows: exp(-inf - 0) = 0, no NaN
    p = jnp.exp(s - m[..., None])
    l = jnp.sum(p, axis=-1)
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    if st.dropout_p > 0:
        p = jnp.where(_keep(st, seeds, positions, q.shape[1], k.shape[1]), p, 0.0)
    acc = jnp.einsum("bhqk,bkhd->bqhd", p.astype(q.dtype), v, preferred_element_type=jnp.float32,
                     precision=_HIGHEST)
    out = acc / jnp.transpose(l_safe, (0, 2, 1))[..., None]
    if st.dropout_p > 0:
        out = out * dropout_keep_scale(st.dropout_p)
    lse = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))
    return out.astype(q.dtype), lse


_attention = jax.custom_vjp(_forward, nondiff_argnums=(0,))


def _attention_fwd(st: _Static, q, k, v, slopes, seeds, q_ids, kv_ids, positions, bias, mask):
    out, lse = _forward(st, q, k, v, slopes, seeds, q_ids, kv_ids, positions, bias, mask)
    return (out, lse), (q, k, v, slopes, seeds, q_ids, kv_ids, positions, bias, mask, out, lse)


def _attention_bwd(st: _Static, res, cotangents):
    """The kernels' backward (kernels/bwd.py) in plain JAX, so it can be differentiated again."""
    q, k, v, slopes, seeds, q_ids, kv_ids, positions, bias, mask, out, lse = res
    dq, dk, dv, ds = _gradients(st, q, k, v, slopes, seeds, q_ids, kv_ids, positions, out, lse, *cotangents,
                                own=True, bias=bias, mask=mask)
    dbias = None
    if bias is not None:  # dS, summed over the axes the bias broadcasts along
        summed = tuple(i for i, n in enumerate(bias.shape) if n == 1 and ds.shape[i] > 1)
        dbias = jnp.sum(ds, axis=summed, keepdims=True).astype(bias.dtype)
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None, None, dbias, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def block_gradients(q, k, v, out, lse, dout, dlse, *, band: Band, softmax_scale: float, softcap: float = 0.0,
                    alibi_slopes=None, dropout_p: float = 0.0, dropout_seeds=None, q_segment_ids=None,
                    kv_segment_ids=None, positions=None, bias=None, mask=None):
    """float32 (dq, dk, dv) of attention of q to a block of the keys (k, v) when out and lse (natural) are
    those of the whole call, over every key (ring attention's backward step): the block's exact share,
    computed as the kernels' backward does when handed that out and lse. Arguments as attention's."""
    st = _Static(band, float(softmax_scale), float(softcap), float(dropout_p))
    return _gradients(st, q, k, v, alibi_slopes, dropout_seeds, q_segment_ids, kv_segment_ids, positions, out, lse,
                      dout, dlse, own=False, bias=bias, mask=mask)[:3]


def _gradients(st: _Static, q, k_in, v_in, slopes, seeds, q_ids, kv_ids, positions, out, lse, dout, dlse,
               own: bool, bias=None, mask=None):
    """float32 (dq, dk, dv, dS): dS the logits' gradient (B, H, Sq, Sk) (the bias's, before any sum). own: out
    and lse are this call's; else a larger call's (block_gradients)."""
    dtype = q.dtype
    k, v = _per_query_head(q, k_in, v_in)
    s, dcap, seen = _logits(st, q, k, slopes, q_ids, kv_ids, positions, bias, mask)
    # Masked before exp: neither P nor its derivatives see inf - inf (empty rows, lse -inf: P = 0). A NaN
    # lse (a NaN in the row) stays, so the row's P, dq and its keys' dk, dv are NaN, as in the kernels
    seen = seen & ~jnp.isneginf(lse)[..., None]
    if own:
        # P: the softmax recomputed in float32 and divided by its own row sum (the kernels use exp(s - lse),
        # the same up to rounding), so a row that sees one key has P exactly 1 however XLA fuses s here and
        # in the forward
        m = jax.lax.stop_gradient(jnp.max(jnp.where(seen, s, -jnp.inf), axis=-1, keepdims=True))
        e = jnp.exp(jnp.where(seen, s - jnp.where(jnp.isfinite(m), m, 0.0), -jnp.inf))
        row = jnp.sum(e, axis=-1, keepdims=True)
        p = e / jnp.where(row > 0, row, 1.0)
    else:  # this block's part of the whole call's softmax: only the whole call's lse normalises it
        p = jnp.where(seen, jnp.exp(s - jnp.where(jnp.isneginf(lse), 0.0, lse)[..., None]), 0.0)
    dp = jnp.einsum("bqhd,bkhd->bhqk", dout, v, preferred_element_type=jnp.float32, precision=_HIGHEST)
    pd = p
    if st.dropout_p > 0:  # the forward's mask: Pd = P * keep * keep_scale feeds dV, and dP is masked alike
        kept, keep_scale = _keep(st, seeds, positions, q.shape[1], k.shape[1]), dropout_keep_scale(st.dropout_p)
        pd = jnp.where(kept, p * keep_scale, 0.0)
        dp = jnp.where(kept, dp * keep_scale, 0.0)
    if own:
        # delta = rowsum(P * dP) (which equals rowsum(dO * O), the kernels' form, up to rounding): the same
        # float32 products as dP's, so a row whose P is one-hot gets dS = P * (dP - dP) = 0 exactly
        delta = jnp.sum(p * dp, axis=-1) - dlse
    else:  # the kernels' form: this block's P does not sum to the whole row's
        delta = jnp.transpose(jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1), (0, 2, 1)) - dlse
    dlogits = p * (dp - delta[..., None])
    ds = dlogits
    if dcap is not None:  # through softcap's tanh
        ds = ds * dcap
    ds = ds.astype(dtype)
    dv = jnp.einsum("bhqk,bqhd->bkhd", pd.astype(dtype), dout, preferred_element_type=jnp.float32,
                    precision=_HIGHEST)
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k, preferred_element_type=jnp.float32, precision=_HIGHEST) * st.scale
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q, preferred_element_type=jnp.float32, precision=_HIGHEST) * st.scale
    b, sk, h, d = dk.shape
    group = h // k_in.shape[2]
    if group > 1:  # a key/value head's gradient sums over the query heads that read it (in float32)
        dk, dv = (x.reshape(b, sk, h // group, group, d).sum(3) for x in (dk, dv))
    return dq, dk, dv, dlogits
