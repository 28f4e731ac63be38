"""Float64 NumPy attention, forward and backward, written from the definition (the test oracle)."""
import numpy as np

from jax_flash_amd.reference import dropout_keep_scale


def _f64(x):
    return np.asarray(np.asarray(x).astype(np.float32), np.float64)


def attention(q, k, v, dout, dlse=None, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None,
              segments=None, keep=None, dropout_p=0.0, bias=None, mask=None):
    """Returns dict(out, lse, dq, dk, dv) in float64 for cotangents dout (and dlse, default 0), and dbias where
    a bias is given. segments: (q ids (B, Sq), kv ids (B, Sk)); keep: (B, H, Sq, Sk) bool dropout mask, kept
    probabilities scaled by 1 / (1 - the applied rate) (dropout_p rounded to a multiple of 1/256); bias (added to
    the logits after softcap and ALiBi) and mask (bool), broadcastable to (B, H, Sq, Sk)."""
    q, k, v, dout = map(_f64, (q, k, v, dout))
    group = q.shape[2] // k.shape[2]  # grouped-query attention: each key/value head serves `group` query heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    sq, sk = q.shape[1], k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    dcap = 1.0
    if softcap > 0:  # s = c tanh(x / c); ds/dx = 1 - tanh^2
        t = np.tanh(s / softcap)
        s, dcap = softcap * t, 1.0 - t * t
    if alibi is not None:
        dist = np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :])
        s = s - np.asarray(alibi, np.float64)[:, :, None, None] * dist
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i, j = np.arange(sq)[:, None] + sk - sq, np.arange(sk)[None, :]
    if left >= 0:
        s = np.where(j >= i - left, s, -np.inf)
    if right >= 0:
        s = np.where(j <= i + right, s, -np.inf)
    if bias is not None:  # floored at float32's finfo.min, as the kernels floor it
        s = s + np.maximum(_f64(bias), np.finfo(np.float32).min)
    if segments is not None:
        q_ids, kv_ids = (np.asarray(x) for x in segments)
        s = np.where((q_ids[:, :, None] == kv_ids[:, None, :])[:, None], s, -np.inf)
    if mask is not None:
        s = np.where(np.asarray(mask), s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = e / np.where(l == 0, 1.0, l)
    lse = np.where(l[..., 0] == 0, -np.inf, m[..., 0] + np.log(np.where(l[..., 0] == 0, 1.0, l[..., 0])))
    drop = 1.0 if keep is None else np.asarray(keep) * dropout_keep_scale(dropout_p)  # P -> P * drop
    out = np.einsum("bhqk,bkhd->bqhd", p * drop, v)
    dlse = np.zeros_like(lse) if dlse is None else _f64(dlse)
    dv = np.einsum("bhqk,bqhd->bkhd", p * drop, dout)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, v) * drop
    delta = np.einsum("bqhd,bqhd->bhq", dout, out)
    dlogits = p * (dp - delta[..., None] + dlse[..., None])
    ds = dlogits * dcap
    dq = np.einsum("bhqk,bkhd->bqhd", ds, k) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    b, _, h, d = dk.shape
    dk, dv = (x.reshape(b, sk, h // group, group, d).sum(3) for x in (dk, dv))
    grads = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
    if bias is not None:  # summed over the axes the bias broadcasts along
        shape = (1,) * (4 - np.ndim(bias)) + np.shape(bias)
        axes = tuple(i for i, n in enumerate(shape) if n == 1 and dlogits.shape[i] > 1)
        grads["dbias"] = dlogits.sum(axis=axes, keepdims=True).reshape(np.shape(bias))
    return grads
