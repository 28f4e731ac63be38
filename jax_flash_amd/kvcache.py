"""KV-cache attention for inference: `attention_with_kvcache` (FlashAttention's flash_attn_with_kvcache).

Decode (seq_q 1), speculative decoding and chunked prefill (seq_q > 1) against a contiguous or paged
key/value cache, new keys / values appended in place first. Three implementations, as `attention`:
"triton" and "interpret" run kernels/decode.py (kv_append, then the split-KV attn_decode, then
attn_decode_combine when the keys were split), "xla" is the pure-JAX reference. Forward only.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from jax_flash_amd import _dispatch, _launch, _spmd, fp8, plan
from jax_flash_amd.api import MAX_HEAD_DIM, _check_flag, _check_scale, _check_slopes, _check_softcap, _check_window
from jax_flash_amd.kernels import decode
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band

_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32)
_HIGHEST = jax.lax.Precision.HIGHEST
LN2 = 0.6931471805599453
NO_GRADIENT = ("jax_flash_amd.attention_with_kvcache is forward only (inference): it has no derivative. "
               "Differentiate jax_flash_amd.attention for training.")


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, block_table=None,
                           causal: bool = True, softmax_scale: float | None = None,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                           k_descale=None, v_descale=None, return_lse: bool = False, num_splits: int = 0,
                           cache_leftpad=None, implementation: str | None = None):
    """Attention of new queries against a key/value cache, with FlashAttention's semantics
    (flash_attn_with_kvcache): decoding (seq_q 1), speculative decoding or chunked prefill (seq_q > 1).

    Args:
      q: (batch, seq_q, heads_q, head_dim) float16, bfloat16 or float32; seq_q >= 1.
      k_cache, v_cache: the cache, q's dtype, or a float8 type with k_descale / v_descale. Contiguous:
        (batch, capacity, heads_kv, head_dim). Paged (with block_table): (num_pages, page_size, heads_kv,
        head_dim), page_size a multiple of 16 (plan.check_page_size: the kernels' rule, applied to every
        implementation). heads_q a multiple of heads_kv (grouped-query / multi-query attention).
      cache_seqlens: (batch,) integer array (or one int for every row): the keys already in each row's
        cache (0 allowed). Row b attends to keys 0 .. cache_seqlens[b] + seq_new - 1; a row with none
        gets output 0 (lse -inf).
      k, v: optional new keys / values (batch, seq_new, heads_kv, head_dim), the cache's dtype: written into the
        cache at positions cache_seqlens[b] .. cache_seqlens[b] + seq_new - 1 before attending, and the
        updated caches returned. The kernels write them in place (the caches are aliased to the
        outputs), so a cache donated to a jitted call (donate_argnums) is updated without a copy.
      block_table: (batch, max_pages) integer: row b's key j lies in page block_table[b, j // page_size].
        Entries a row uses must lie in [0, num_pages); the rest are never read.
      causal: bottom-right aligned against each row's new length L = cache_seqlens + seq_new: query i
        sees key j iff j <= i + L - seq_q (default True: a decoded token sees the cache and itself).
      softmax_scale, window_size, softcap, alibi_slopes: as in jax_flash_amd.attention, aligned the same
        way against L (window: i + L - seq_q - left <= j <= i + L - seq_q + right; ALiBi distance
        |i + L - seq_q - j|).
      k_descale, v_descale: (batch, heads_kv) float dequantisation factors of float8 caches (required with
        them): k ~= k_fp8 * k_descale (jax_flash_amd.quantize_fp8 makes both; new k / v must be quantised
        with the same factors). float8_e4m3fn on NVIDIA and gfx950, float8_e4m3fnuz on gfx942; q stays
        float16 / bfloat16: the kernels widen each K / V tile to q's type in registers (exact), so an fp8 cache
        halves the bytes read; logits are scaled by softmax_scale * k_descale, the output by v_descale.
      return_lse: also return the logsumexp (batch, heads_q, seq_q) float32, natural log.
      num_splits: key splits of the split-KV kernel (0: chosen from batch x heads_kv and the GPU's
        SM / CU count, kernels/configs.py DECODE_SPLITS). Ignored by "xla".
      cache_leftpad: optional (batch,) integer array, FlashAttention's cache_leftpad: row b's keys begin at
        cache_leftpad[b] (in [0, cache_seqlens[b]]); keys before it are neither attended nor read (they may
        hold anything), and the kernels skip their blocks. Positions stay those of the cache: cache_seqlens
        still counts from 0, new keys go to cache_seqlens[b] .., and causal, window and ALiBi are aligned
        against L as above; row b attends to keys cache_leftpad[b] .. L - 1.
      implementation: "triton", "interpret" or "xla", as in jax_flash_amd.attention (None: the default).

    Returns:
      out (q's shape and dtype), then lse if return_lse, then, when k / v are given, the updated
      k_cache and v_cache: `out`, `(out, lse)`, `(out, k_cache, v_cache)` or `(out, lse, k_cache, v_cache)`.

    Checks: shapes, dtypes and options are checked (ValueError / TypeError naming the argument). Where
    cache_seqlens, cache_leftpad and block_table are concrete (not traced), they are checked too:
    cache_seqlens in [0, capacity - seq_new] (capacity: the cache's length, or max_pages * page_size),
    cache_leftpad in [0, cache_seqlens], the block-table entries a row uses in [0, num_pages). Traced values
    cannot be checked; then a write past a row's capacity or to a page outside the cache is dropped, reads
    are clamped into the cache (cache_leftpad into [0, the row's length]), and the output of such a row is
    undefined, but nothing outside the row's own pages is ever written.
    Not differentiable: jax.grad raises TypeError.
    """
    _check_flag("causal", causal)
    _check_flag("return_lse", return_lse)
    window = _check_window(window_size)
    softcap = _check_softcap(softcap)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: chosen automatically); got {num_splits!r}")
    q, k_cache, v_cache, k, v, block_table = _check_arrays(q, k_cache, v_cache, k, v, block_table)
    batch, seq_q, heads, head_dim = q.shape
    descales = _check_descales(k_cache, k_descale, v_descale, batch)
    paged = block_table is not None
    if paged:  # before choosing the implementation: every one refuses the same page sizes
        plan.check_page_size(k_cache.shape[1])
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    seq_new = 0 if k is None else k.shape[1]
    cache_seqlens = _check_seqlens(cache_seqlens, batch, capacity, seq_new)
    slopes = _check_slopes(alibi_slopes, batch, heads)
    scale = _check_scale(softmax_scale, head_dim)
    impl = _dispatch.choose_implementation(implementation)
    if descales and impl != "xla":
        fp8.check_supported(_dispatch.backend(impl)[1], k_cache.dtype)
    leftpad = _check_leftpad(cache_leftpad, batch, cache_seqlens)
    if paged:
        _check_block_table(block_table, cache_seqlens, seq_new, k_cache.shape[0], k_cache.shape[1])
    if impl != "xla":
        _check_kernel_limits(q, k_cache)
    opts = Options(impl, scale, Band.of(causal, window, seq_q, max(capacity, 1)), softcap, num_splits, plan.active())
    extras = Operands(slopes=slopes, **descales)
    # on Explicit meshes, with those axes made Auto (the append's scatter has no Explicit sharding rule); the
    # caches come back sharded as given
    specs = (*_spmd.attention_specs(q), *(PartitionSpec(*_spmd.partition_spec(c)) for c in (k_cache, v_cache)))
    out, lse, k_cache, v_cache = _spmd.auto_axes(_forward_only(opts), (q, k_cache, v_cache, cache_seqlens, k, v,
                                                                      block_table, extras, leftpad), specs)
    result = (out, lse) if return_lse else (out,)
    if k is not None:
        result += (k_cache, v_cache)
    return result[0] if len(result) == 1 else result


@dataclasses.dataclass(frozen=True)
class Options:
    """The static part of one call (hashable)."""
    implementation: str
    softmax_scale: float
    band: Band  # rules.Band.of(causal, window, seq_q, capacity): per row, offsets against its own length
    softcap: float = 0.0
    num_splits: int = 0  # 0: the split-KV rule decides (plan.decode_splits)
    policy: plan.Policy = plan.DEFAULT  # plan.active() where the call was made


# ----- argument checks -----

def _is_array(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _check_arrays(q, k_cache, v_cache, k, v, block_table):
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if x is None and name in ("k", "v"):
            continue
        if not _is_array(x):
            raise TypeError(f"{name} must be an array; got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name} must have rank 4; got shape {tuple(x.shape)}")
        allowed = [jnp.dtype(d) for d in _DTYPES] + (list(fp8.TYPES) if name != "q" else [])
        if jnp.dtype(x.dtype) not in allowed:
            raise TypeError(f"{name} must be float16, bfloat16 or float32" + (" (or a float8 type for the cache)"
                                                                               if name != "q" else "")
                            + f"; got {jnp.dtype(x.dtype)}")
    q, k_cache, v_cache = jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache)
    if (k is None) != (v is None):
        raise ValueError("k and v (the new keys and values) must be given together")
    if not fp8.is_fp8(k_cache.dtype) and k_cache.dtype != q.dtype:
        raise TypeError(f"k_cache must have q's dtype {q.dtype} (or a float8 type); got {k_cache.dtype}")
    if fp8.is_fp8(k_cache.dtype) and q.dtype == jnp.float32:
        raise TypeError(f"a {k_cache.dtype} cache takes float16 or bfloat16 queries (its tiles are widened to q's "
                        "type); got float32")
    for name, x in (("v_cache", v_cache), ("k", k), ("v", v)):
        if x is not None and x.dtype != k_cache.dtype:
            raise TypeError(f"{name} must have k_cache's dtype {k_cache.dtype}; got {x.dtype}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {k_cache.shape} and {v_cache.shape}")
    batch, seq_q, heads, head_dim = q.shape
    if seq_q < 1 or batch < 1:
        raise ValueError(f"q must have batch >= 1 and seq_q >= 1; got shape {q.shape}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim (last axis of q) must be in 1..{MAX_HEAD_DIM}; got {head_dim}")
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache must have q's head_dim {head_dim}; got shape {k_cache.shape}")
    heads_kv = k_cache.shape[2]
    if heads_kv == 0 or heads % heads_kv:
        raise ValueError(f"the number of query heads ({heads}) must be a multiple of the cache's key/value heads "
                         f"({heads_kv}) (grouped-query attention)")
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"a contiguous k_cache must be (batch, capacity, heads_kv, head_dim) with q's batch "
                             f"{batch}; got shape {k_cache.shape} (pass block_table for a paged cache)")
    else:
        if not _is_array(block_table) or not jnp.issubdtype(block_table.dtype, jnp.integer):
            raise TypeError(f"block_table must be an integer array (batch, max_pages); got "
                            f"{getattr(block_table, 'dtype', type(block_table).__name__)}")
        if block_table.ndim != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1:
            raise ValueError(f"block_table must have shape (batch, max_pages) = ({batch}, >= 1); got "
                             f"{tuple(block_table.shape)}")
        if k_cache.shape[0] < 1 or k_cache.shape[1] < 1:
            raise ValueError(f"a paged k_cache must be (num_pages, page_size, heads_kv, head_dim) with at least "
                             f"one page of one row; got shape {k_cache.shape}")
        block_table = jnp.asarray(block_table).astype(jnp.int32)
    if k is not None:
        k, v = jnp.asarray(k), jnp.asarray(v)
        want = (batch, None, heads_kv, head_dim)
        for name, x in (("k", k), ("v", v)):
            if x.shape[0] != batch or x.shape[2:] != (heads_kv, head_dim):
                raise ValueError(f"{name} must have shape (batch, seq_new, heads_kv, head_dim) = "
                                 f"{want[:1] + ('seq_new',) + want[2:]}; got {tuple(x.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    return q, k_cache, v_cache, k, v, block_table


def _check_descales(k_cache, k_descale, v_descale, batch: int) -> dict:
    """{} for 16/32-bit caches; for float8 ones {k_descale, v_descale} as (batch, heads_kv) float32."""
    given = dict(k_descale=k_descale, v_descale=v_descale)
    if not fp8.is_fp8(k_cache.dtype):
        passed = [name for name, x in given.items() if x is not None]
        if passed:
            raise ValueError(f"{', '.join(passed)} only apply to float8 caches; the cache is {k_cache.dtype}")
        return {}
    shape = (batch, k_cache.shape[2])
    for name, x in given.items():
        if x is None:
            raise ValueError(f"a {k_cache.dtype} cache needs {name}, a (batch, heads_kv) = {shape} float array of "
                             "dequantisation factors (jax_flash_amd.quantize_fp8 returns them)")
        if not _is_array(x) or not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating array; got {getattr(x, 'dtype', type(x).__name__)}")
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape (batch, heads_kv) = {shape}; got {tuple(x.shape)}")
    return {name: jnp.asarray(x, jnp.float32) for name, x in given.items()}


def _concrete(x):
    """x as a NumPy array when its value is known here, else None (a tracer)."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x)
    except Exception:  # noqa: BLE001
        return None


def _check_seqlens(cache_seqlens, batch: int, capacity: int, seq_new: int):
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = np.full((batch,), cache_seqlens, np.int64)
    if not _is_array(cache_seqlens) or not jnp.issubdtype(cache_seqlens.dtype, jnp.integer):
        raise TypeError(f"cache_seqlens must be an int or an integer array (batch,); got "
                        f"{getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)}")
    if cache_seqlens.shape == ():
        cache_seqlens = jnp.broadcast_to(cache_seqlens, (batch,))
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"cache_seqlens must have shape (batch,) = ({batch},); got {tuple(cache_seqlens.shape)}")
    known = _concrete(cache_seqlens)
    if known is not None:
        if known.min() < 0:
            raise ValueError(f"cache_seqlens must be >= 0; got {known.tolist()}")
        if known.max() + seq_new > capacity:
            raise ValueError(f"cache_seqlens + seq_new must be at most the cache capacity {capacity} (contiguous: "
                             f"k_cache.shape[1]; paged: max_pages * page_size); got cache_seqlens "
                             f"{known.tolist()} with seq_new {seq_new}")
    return jnp.asarray(cache_seqlens).astype(jnp.int32)


def _check_leftpad(cache_leftpad, batch: int, cache_seqlens):
    """cache_leftpad as (batch,) int32 (None: every row starts at key 0), checked against cache_seqlens where both
    are concrete."""
    if cache_leftpad is None:
        return None
    if not _is_array(cache_leftpad) or not jnp.issubdtype(cache_leftpad.dtype, jnp.integer):
        raise TypeError(f"cache_leftpad must be an integer array (batch,); got "
                        f"{getattr(cache_leftpad, 'dtype', type(cache_leftpad).__name__)}")
    if tuple(cache_leftpad.shape) != (batch,):
        raise ValueError(f"cache_leftpad must have shape (batch,) = ({batch},); got {tuple(cache_leftpad.shape)}")
    known, lengths = _concrete(cache_leftpad), _concrete(cache_seqlens)
    if known is not None and (known.min() < 0 or lengths is not None and (known > lengths).any()):
        raise ValueError(f"cache_leftpad must be in [0, cache_seqlens] (row b's cached keys are cache_leftpad[b] .. "
                         f"cache_seqlens[b] - 1); got cache_leftpad {known.tolist()}"
                         + ("" if lengths is None else f" with cache_seqlens {lengths.tolist()}"))
    return jnp.asarray(cache_leftpad).astype(jnp.int32)


def _check_block_table(block_table, cache_seqlens, seq_new: int, num_pages: int, page_size: int) -> None:
    table, lengths = _concrete(block_table), _concrete(cache_seqlens)
    if table is None:
        return
    used = np.ones(table.shape, bool)
    if lengths is not None:  # only the pages each row uses; unused entries may hold anything (e.g. -1)
        need = -(-(lengths.astype(np.int64) + seq_new) // page_size)
        used = np.arange(table.shape[1])[None, :] < need[:, None]
    bad = used & ((table < 0) | (table >= num_pages))
    if bad.any():
        b, p = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"block_table[{b}, {p}] = {int(table[b, p])} is outside [0, num_pages = {num_pages}) "
                         f"(k_cache.shape[0]); every page a row uses must be in the cache")


def _check_kernel_limits(q, k_cache) -> None:
    # within one batch row (or page), offsets are 32-bit
    for name, n in (("q", q.shape[1] * q.shape[2] * q.shape[3]),
                    ("k_cache", k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3])):
        if n >= 2**31:
            raise ValueError(f"{name} has {n} elements per batch row (or page); the kernels support fewer than 2**31")


# ----- the implementations -----

@functools.cache
def _forward_only(opts: Options):
    """opts' implementation as a function of the arrays whose derivative raises TypeError(NO_GRADIENT)."""
    wrapped = jax.custom_jvp(functools.partial(_xla, opts) if opts.implementation == "xla" else _vmappable(opts))

    @wrapped.defjvp
    def _jvp(primals, tangents):
        raise TypeError(NO_GRADIENT)

    return wrapped


def _vmappable(opts: Options):
    """The kernels as a function of the arrays that jax.vmap maps by folding the mapped axis into the batch
    (one launch per kernel, as _spmd.wrap does for attention); the xla implementation maps as plain JAX."""
    @jax.custom_batching.custom_vmap
    def call(*args):
        return _kernels(opts, *args)

    @call.def_vmap
    def _fold(axis_size, in_batched, *args):
        # unmapped arguments broadcast first: every slice appends to a cache of its own, as vmap means
        q, k_cache, v_cache, cache_seqlens, k, v, block_table, extras, leftpad = jax.tree.map(
            lambda x, mapped: x if mapped else jnp.broadcast_to(x, (axis_size, *x.shape)), args, tuple(in_batched))
        if block_table is not None:  # slice i's pages follow slices 0 .. i-1's; invalid entries stay invalid
            num_pages = k_cache.shape[1]
            offset = (jnp.arange(axis_size, dtype=jnp.int32) * num_pages)[:, None, None]
            block_table = jnp.where((block_table >= 0) & (block_table < num_pages), block_table + offset, -1)
        folded = jax.tree.map(lambda x: x.reshape(axis_size * x.shape[1], *x.shape[2:]),
                              (q, k_cache, v_cache, cache_seqlens, k, v, block_table, extras, leftpad))
        outs = call(*folded)
        return tuple(x.reshape(axis_size, -1, *x.shape[1:]) for x in outs), (True,) * len(outs)

    return call


def _lengths(cache_seqlens, seq_new: int, capacity: int):
    """(first write position, keys attended) per row: clamped into [0, capacity] (only a traced
    out-of-range cache_seqlens, which cannot be checked, needs the clamp)."""
    start = jnp.clip(cache_seqlens, 0, capacity)
    return start, jnp.minimum(start + seq_new, capacity)


def _first_keys(leftpad, lengths):
    """Each row's first attended key (cache_leftpad), clamped into [0, lengths] as _lengths clamps (None: none
    given)."""
    return None if leftpad is None else jnp.clip(leftpad, 0, lengths)


def _offsets(band: Band, seq_q: int, lengths):
    """(batch, 2) int32: each row's (lo_off, hi_off) of kernels/masking.py against its own length."""
    lo, hi = band.offsets(seq_q, lengths)
    return jnp.stack([jnp.broadcast_to(jnp.asarray(x, jnp.int32), lengths.shape) for x in (lo, hi)], axis=-1)


def _capacity(k_cache, block_table) -> int:
    return k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)


def _append_xla(k_cache, v_cache, k, v, start, block_table):
    """The caches with k, v written at start[b] + t, out-of-capacity positions and pages dropped."""
    batch, seq_new = k.shape[:2]
    pos = start[:, None] + jnp.arange(seq_new, dtype=jnp.int32)[None, :]  # (batch, seq_new)
    if block_table is None:
        rows = jnp.broadcast_to(jnp.arange(batch)[:, None], pos.shape)
        ok = pos < k_cache.shape[1]
        at = (jnp.where(ok, rows, batch), pos)  # out of range: dropped
    else:
        num_pages, page_size = k_cache.shape[:2]
        index = pos // page_size
        ok = index < block_table.shape[1]
        page = jnp.take_along_axis(block_table, jnp.minimum(index, block_table.shape[1] - 1), axis=1)
        ok = ok & (page >= 0) & (page < num_pages)
        at = (jnp.where(ok, page, num_pages), pos % page_size)
    return (k_cache.at[at].set(k, mode="drop"), v_cache.at[at].set(v, mode="drop"))


def _rows(cache, block_table):
    """(batch, capacity, heads_kv, head_dim): each row's keys (or values) in order."""
    if block_table is None:
        return cache
    pages = cache[jnp.clip(block_table, 0, cache.shape[0] - 1)]  # (batch, max_pages, page, heads_kv, d)
    return pages.reshape(block_table.shape[0], -1, *cache.shape[2:])


def _xla(opts: Options, q, k_cache, v_cache, cache_seqlens, k, v, block_table, extras: Operands, leftpad=None):
    """The pure-JAX reference: (out, lse, k_cache, v_cache); the kernels' numerics (logits in float32
    from dots of the input dtype, P rounded to it before the PV dot, float32 accumulation; float8 caches
    widened to q's type, logits scaled by k_descale, the output by v_descale)."""
    slopes = extras.slopes
    seq_new = 0 if k is None else k.shape[1]
    start, lengths = _lengths(cache_seqlens, seq_new, _capacity(k_cache, block_table))
    if k is not None:
        k_cache, v_cache = _append_xla(k_cache, v_cache, k, v, start, block_table)
    keys, values = (_rows(c, block_table).astype(q.dtype) for c in (k_cache, v_cache))
    b, sq, h, d = q.shape
    t, h_kv = keys.shape[1], keys.shape[2]
    g = h // h_kv
    j = jnp.arange(t)[None, None, :]  # (1, 1, T)
    present = j < lengths[:, None, None]  # (B, 1, T)
    first = _first_keys(leftpad, lengths)
    if first is not None:
        present = present & (j >= first[:, None, None])
    # positions outside a row (past its length, before its first key) may hold anything (NaN included): never
    # multiplied by P = 0
    values = jnp.where(present[:, 0, :, None, None], values, jnp.zeros((), values.dtype))
    scale = opts.softmax_scale
    if extras.k_descale is not None:
        scale = scale * extras.k_descale[:, :, None, None, None]  # (b, h_kv, 1, 1, 1)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q.reshape(b, sq, h_kv, g, d), keys, preferred_element_type=jnp.float32,
                   precision=_HIGHEST) * scale
    if opts.softcap > 0:
        s = opts.softcap * jnp.tanh(s / opts.softcap)
    i = jnp.arange(sq)[None, :, None]  # (1, Sq, 1)
    offs = _offsets(opts.band, sq, lengths)
    lo, hi = offs[:, 0, None, None], offs[:, 1, None, None]
    seen = present & (j >= i + lo) & (j <= i + hi)  # (B, Sq, T)
    if slopes is not None:
        dist = jnp.abs(i + (lengths[:, None, None] - sq) - j).astype(jnp.float32)  # (B, Sq, T)
        s = s - slopes.reshape(b, h_kv, g)[:, :, :, None, None] * dist[:, None, None]
    s = jnp.where(seen[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, initial=-jnp.inf)  # a cache of capacity 0 has no key
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m[..., None])
    l = jnp.sum(p, axis=-1)  # (B, H_kv, G, Sq)
    empty = l == 0.0
    acc = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(q.dtype), values, preferred_element_type=jnp.float32,
                     precision=_HIGHEST)
    out = acc / jnp.transpose(jnp.where(empty, 1.0, l), (0, 3, 1, 2))[..., None]
    if extras.v_descale is not None:
        out = out * extras.v_descale[:, None, :, None, None]
    lse = jnp.where(empty, -jnp.inf, m + jnp.log(jnp.where(empty, 1.0, l)))
    return out.reshape(q.shape).astype(q.dtype), lse.reshape(b, h, sq), k_cache, v_cache


def decode_call(target: str, opts: Options, q, k_cache, block_table, seq_new: int = 0, rows=None,
                leftpad: bool = False) -> plan.DecodeCall:
    """The plan's DecodeCall of these arrays; rows: {table: DecodeRow} forced (benchmark sweeps); leftpad: the rows
    have first keys (cache_leftpad)."""
    policy = opts.policy
    if rows:
        policy = policy.replace(rows={**dict(policy.rows), **rows})
    b, sq, h, d = q.shape
    return plan.DecodeCall(target, b, sq, h, k_cache.shape[2], d, np.dtype(q.dtype).name,
                           _capacity(k_cache, block_table), opts.band, opts.softcap,
                           k_cache.shape[1] if block_table is not None else 0, seq_new, np.dtype(k_cache.dtype).name,
                           opts.num_splits, policy.compute_units or plan.compute_units(target), policy, leftpad)


def _kernels(opts: Options, q, k_cache, v_cache, cache_seqlens, k, v, block_table, extras: Operands, leftpad=None, *,
             rows=None):
    """The kernels (triton or interpret): (out, lse, k_cache, v_cache)."""
    run, target = _dispatch.backend(opts.implementation)
    return launches(run, target, opts, q, k_cache, v_cache, cache_seqlens, k, v, block_table, extras, rows=rows,
                    leftpad=leftpad)


def launches(run, target: str, opts: Options, q, k_cache, v_cache, cache_seqlens, k, v, block_table,
             extras: Operands = Operands(), rows=None, leftpad=None):
    """The plan's steps (plan.plan_decode): append (if k), decode, combine (if split): (out, lse natural, k_cache,
    v_cache). extras: ALiBi slopes, float8 descales. rows: {table: row} forced (benchmark sweeps). leftpad: (batch,)
    int32 first keys (cache_leftpad), or None."""
    b, sq, h, d = q.shape
    paged = block_table is not None
    num_pages = k_cache.shape[0]
    capacity = _capacity(k_cache, block_table)
    max_pages = block_table.shape[1] if paged else 1
    table = block_table if paged else jnp.zeros((1,), jnp.int32)
    seq_new = 0 if k is None else k.shape[1]
    start, lengths = _lengths(cache_seqlens, seq_new, capacity)
    steps = plan.plan_decode(decode_call(target, opts, q, k_cache, block_table, seq_new, rows,
                                         leftpad is not None)).steps
    if steps[0].role == "kv_append":
        append = _launch.launch(
            decode.kv_append, grid=steps[0].grid,
            inputs=dict(K=k, V=v, KCache=k_cache, VCache=v_cache, BlockTable=table, SeqLens=start, seq_new=seq_new,
                        capacity=capacity, max_pages=max_pages, num_pages=num_pages),
            out_shapes=(jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                        jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype)),
            constexprs=steps[0].flags, options=steps[0].compile_options)
        k_cache, v_cache = run(dataclasses.replace(append, aliases=((2, 0), (3, 1))))
        steps = steps[1:]
    step = steps[0]
    splits = step.grid[1]
    one = splits == 1
    offsets = _offsets(opts.band, sq, lengths)
    if leftpad is not None:  # the decode kernel's LEFTPAD: a third column, each row's first key
        offsets = jnp.concatenate([offsets, _first_keys(leftpad, lengths)[:, None]], axis=1)
    out, lse2 = run(_launch.launch(
        decode.attn_decode, grid=step.grid,
        inputs=dict(Q=q, KCache=k_cache, VCache=v_cache, BlockTable=table, SeqLens=lengths,
                    Offsets=offsets, sm_scale=np.float32(opts.softmax_scale),
                    softcap=np.float32(opts.softcap), seq_q=sq, capacity=capacity, max_pages=max_pages,
                    num_pages=num_pages),
        out_shapes=(jax.ShapeDtypeStruct((splits, b, sq, h, d), q.dtype if one else jnp.float32),
                    jax.ShapeDtypeStruct((splits, b, h, sq), jnp.float32)),
        constexprs=step.flags, options=step.compile_options, extras=extras))
    if one:
        out, lse2 = out[0], lse2[0]
    else:
        combine = steps[1]
        out, lse2 = run(_launch.launch(
            decode.attn_decode_combine, grid=combine.grid,
            inputs=dict(Parts=out, PartLse=lse2, seq_q=sq, n_split=splits),
            out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
            constexprs=combine.flags, options=combine.compile_options))
    return out, lse2 * np.float32(LN2), k_cache, v_cache


def record_launches(target: str, head_dim: int, dtype) -> list[tuple[str, _launch.Launch]]:
    """The launches of representative calls, named for amd_report (traced abstractly: nothing runs or is
    allocated; the compiled code depends only on the constexprs): "decode" (a decode step, 32 query / 8
    kv heads: 4 packed rows, split), "decode_combine", "kv_append" (paged), "decode+paged" (page 64),
    "decode+chunk" (chunked prefill: full row blocks, the causal band) and, where the target runs a float8
    type, "decode+fp8" (a cache of that type)."""
    recorded = []

    def run(launch):
        recorded.append(launch)
        return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)

    sds = jax.ShapeDtypeStruct
    dtype = jnp.dtype(dtype)
    opts = Options("triton", head_dim ** -0.5, Band.of(True, (-1, -1), 1, 4096), num_splits=4)
    chunk = dataclasses.replace(opts, band=Band.of(True, (-1, -1), 64, 4096), num_splits=1)

    fp8_types = sorted(fp8.SUPPORTED.get(target, ()), key=str)[:1]

    def calls(q1, q_chunk, cache, pages, new, lens, table, descale):
        launches(run, target, opts, q1, cache, cache, lens, None, None, None)
        launches(run, target, opts, q1, pages, pages, lens, new, new, table)
        launches(run, target, chunk, q_chunk, cache, cache, lens, None, None, None)
        for t in fp8_types:
            cache8 = jnp.zeros(cache.shape, t)
            launches(run, target, opts, q1, cache8, cache8, lens, None, None, None,
                     Operands(k_descale=descale, v_descale=descale))

    jax.eval_shape(calls, sds((8, 1, 32, head_dim), dtype), sds((8, 64, 32, head_dim), dtype),
                   sds((8, 4096, 8, head_dim), dtype), sds((512, 64, 8, head_dim), dtype),
                   sds((8, 1, 8, head_dim), dtype), sds((8,), jnp.int32), sds((8, 64), jnp.int32),
                   sds((8, 8), jnp.float32))
    names = ["decode", "decode_combine", "kv_append", "decode+paged", "decode_combine", "decode+chunk"]
    names += ["decode+fp8", "decode_combine"] * len(fp8_types)
    assert len(recorded) == len(names), [launch.kernel.__name__ for launch in recorded]
    out = {}
    for name, launch in zip(names, recorded):
        out.setdefault(name, launch)
    return list(out.items())
