"""Ring attention (context parallelism): attention over a sequence split across the devices of one mesh
axis, called inside `shard_map`. Memory per device stays O(N / devices); only K/V blocks (and, in the
backward, their gradients) travel, device d -> d + 1, with `lax.ppermute`.

Forward. Device i holds its queries for the whole call and the K/V block of device (i - s) mod n at step
s. Each step attends the local queries to the block in hand with the kernels (return_lse) and merges
the partial (out, lse) exactly: lse = logaddexp(lse_a, lse_b), out = out_a e^(lse_a - lse) +
out_b e^(lse_b - lse), in float32. The block for the next step is sent before the step computes, so
the transfer can overlap the kernel.

Backward (custom_vjp; residuals only the local q, k, v, out, lse and ids). The kernels' backward takes
(out, lse) as inputs: called per step with the *global* (merged) out and lse it recomputes that step's
probabilities exactly (P = exp(s - lse)) and delta = rowsum(dO * O) - dlse, so it returns exactly the
step's share of dq and of the block's dk/dv; no per-step output is saved. dq accumulates locally; dk/dv
(float32) travel with their K/V block and, after the n-th hop, are home. Fixed order: deterministic.

Causal, equal chunks. Contiguous layout (device i holds chunk i): the block of device j is fully
visible (j < i), causal within the pair (j == i, step 0) or invisible (j > i, skipped: no compute), so
device n-1 works n times as long as device 0. Zig-zag layout (device i holds chunks i and 2n-1-i, see
`zigzag`): step 0 is one causal call over the local pair; at every other step a device attends either
all its queries to the first half of the block (j < i) or the second half of its queries to the whole
block (j > i): equal work everywhere. The device index is traced, so `lax.cond` picks between the
static calls.

Window, ALiBi, dropout. These depend on where a block lies, and which block a device holds is traced:
each call gets its global positions as a runtime operand (operands.Operands.positions; the kernels
shift the band and ALiBi's diagonal by it and hash dropout's mask by global position, so the mask
is the unsharded call's). Calls then run over runs of consecutive positions (zig-zag: up to four per
step, one per pair of chunks), each skipped by `lax.cond` where the band (window and causal) reaches no
pair of it; inside a call the kernels skip the key blocks outside the shifted band.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from jax_flash_amd import _dispatch, _spmd, api, fp8, plan, reference
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band

LAYOUTS = ("contiguous", "zigzag")


def ring_attention(q, k, v, *, axis_name, causal: bool = False, softmax_scale: float | None = None,
                   softcap: float = 0.0, q_segment_ids=None, kv_segment_ids=None, layout: str = "contiguous",
                   return_lse: bool = False, implementation: str | None = None, window_size=(-1, -1),
                   alibi_slopes=None, dropout_p: float = 0.0, dropout_rng=None):
    """Exact attention over a sequence sharded along mesh axis `axis_name`; call inside `jax.shard_map`.

    Args:
      q, k, v: this device's shard: (batch, seq_q / n, heads_q, head_dim) and (batch, seq_k / n,
        heads_kv, head_dim), n = the size of axis_name; heads_q a multiple of heads_kv (GQA). Shards in
        the order of `layout`.
      axis_name: the mesh axis the sequence is split over (every device of it holds one shard), or a tuple of
        mesh axes in any order, the first major, as PartitionSpec lays the sequence over them
        (P(None, ("b", "a")) with axis_name=("b", "a")).
      causal: query position p sees key position p' iff p' <= p (global positions; needs seq_q == seq_k).
      softmax_scale, softcap, implementation: as in `jax_flash_amd.attention`.
      window_size: (left, right) as in `attention`, over global positions (bottom-right aligned on the
        global seq_q, seq_k). Calls the window does not reach are skipped (K/V still go round).
      alibi_slopes: (heads_q,) or (batch, heads_q) (this device's batch rows), as in `attention`;
        distances are between global positions.
      dropout_p, dropout_rng: as in `attention`, with the same key on every device of the axis: the mask
        is the unsharded call's (hashed by global position). The keys are per (batch, head) row of this shard:
        where shard_map also splits batch or heads, the mask is not the unsharded call's, and the
        same key gives every such shard the same mask (fold the shard's index into the key to avoid it).
      q_segment_ids, kv_segment_ids: this device's (batch, seq / n) ids, as in `attention` (kv ids travel
        with their K/V block). Any integer type: converted to int32 alike on every device (64-bit ids by their
        rank among all devices' ids, an all_gather of the ids).
      layout: how global positions are laid over the devices (matters with causal, window, ALiBi or
        dropout).
        "contiguous": device i holds positions [i S/n, (i+1) S/n). Causal work is unbalanced (device i
        computes i + 1 blocks of n).
        "zigzag": the sequence in 2n equal chunks, device i holds chunks i and 2n-1-i (in that order):
        every device does the same causal work. `zigzag(x, n, axis)` puts a global array in this order
        (shard it afterwards), `unzigzag` undoes it.
      return_lse: also return the logsumexp (batch, heads_q, seq_q / n), float32, natural log, in the
        layout's order.

    Returns:
      out (this device's shard, q's shape and dtype), or (out, lse) when return_lse. Differentiable in q,
      k and v (also through lse); gradients are as unsharded `attention`'s, deterministic.

    Example:
      >>> spec = P(None, "seq")  # shard the sequence axis over mesh axis "seq"
      >>> f = jax.shard_map(lambda q, k, v: ring_attention(q, k, v, axis_name="seq", causal=True,
      ...                   layout="zigzag"), mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
      >>> out = unzigzag(f(*(zigzag(x, mesh.shape["seq"], axis=1) for x in (q, k, v))), mesh.shape["seq"], 1)
    """
    q, k, v = api._check_arrays(q, k, v)
    if fp8.is_fp8(q.dtype):
        raise NotImplementedError("ring_attention does not support float8 inputs yet (use float16, bfloat16 or "
                                  "float32)")
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        api._check_flag(name, flag)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    window = api._check_window(window_size)
    softcap = api._check_softcap(softcap)
    slopes = api._check_slopes(alibi_slopes, q.shape[0], q.shape[2])
    scale = api._check_scale(softmax_scale, q.shape[-1])
    dropout_p = api._check_dropout(dropout_p, dropout_rng)
    n = _axis_size(axis_name)
    q_ids, kv_ids = api._check_segment_ids(*_shared_ids(q_segment_ids, kv_segment_ids, axis_name),
                                           q.shape[:2], k.shape[:2])
    impl = _dispatch.choose_implementation(implementation)
    sq, sk = q.shape[1], k.shape[1]
    if causal and sq != sk:
        raise ValueError(f"causal ring_attention needs equal query and key shards; got seq_q / n = {sq}, "
                         f"seq_k / n = {sk}")
    band = Band.of(causal, window, n * sq, n * sk)  # of the global sequence
    # a window (beyond causal), ALiBi or dropout depend on where each block lies: every call gets its positions
    positional = band != Band.of(causal, (-1, -1), n * sq, n * sk) or slopes is not None or dropout_p > 0
    layout = layout if causal or positional else "contiguous"  # else the layout changes nothing
    if layout == "zigzag" and (sq % 2 or sk % 2):
        raise ValueError(f"layout='zigzag' holds two equal chunks per device: the local sequence lengths must "
                         f"be even; got {sq} queries, {sk} keys")
    if q.size == 0 or sk == 0:  # nothing to attend to: as attention, no launch (and no collective)
        out = _spmd.match_varying(jnp.zeros_like(q), q, k, v)
        lse = _spmd.match_varying(jnp.transpose(jnp.full_like(q[..., 0], -jnp.inf, dtype=jnp.float32), (0, 2, 1)),
                                  q, k, v)
        return (out, lse) if return_lse else out
    if impl != "xla":
        api._check_kernel_limits(q, k)
    # the same key on every device: the unsharded call's per-(batch, head) dropout seeds
    seeds = reference.dropout_seeds(dropout_rng, q.shape[0], q.shape[2]) if dropout_p > 0 else None
    extras = Operands(slopes=slopes, seeds=seeds, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    opts = _dispatch.Options(implementation=impl, softmax_scale=scale, softcap=softcap, dropout_p=dropout_p,
                             policy=plan.active())
    if n == 1:  # a ring of one device is plain attention: no merge, no accumulators, no overhead
        out, lse = _dispatch.attention(q, k, v, extras, dataclasses.replace(opts, band=band))
        return (out, lse) if return_lse else out
    cfg = _Ring(axis_name=axis_name, size=n, causal=causal, layout=layout, positional=positional,
                opts=dataclasses.replace(opts, band=band) if positional else opts)
    out, lse = _ring(q, k, v, extras, cfg)
    return (out, lse) if return_lse else out


def _axis_size(axis_name) -> int:
    try:
        return jax.lax.axis_size(axis_name)
    except NameError as e:
        raise NameError(f"ring_attention(axis_name={axis_name!r}): no such mesh axis is bound here. Call "
                        "ring_attention inside jax.shard_map over a mesh with that axis, with the sequence "
                        "axis of q, k, v split over it.") from e


def _shared_ids(q_ids, kv_ids, axis_name):
    """The segment ids in int32 numbered alike on every device of the ring: kv ids travel to devices that
    compare them with their own q ids, so a renumbering by each device's own ids (api._int32_ids, for
    traced wide ids) would pair different segments. Types int32 holds exactly are cast; uint32 is
    shifted down by 2^31 (equality and order kept); 64-bit ids become their rank among the row's ids of
    every device of the axis (an all_gather of the ids; equality and order kept). Ids that are not
    integer arrays of rank 2 are returned as given, for api._check_segment_ids to refuse."""
    given = [x for x in (q_ids, kv_ids) if x is not None]
    if not given or not all(hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.integer) and getattr(x, "ndim", 0) == 2
                            for x in given):
        return q_ids, kv_ids
    common = jnp.dtype(functools.reduce(jnp.promote_types, (x.dtype for x in given)))
    if not jnp.issubdtype(common, jnp.integer) or jax.dtypes.canonicalize_dtype(common) != common:
        types = ", ".join(f"{name} {x.dtype}" for name, x in (("q_segment_ids", q_ids), ("kv_segment_ids", kv_ids))
                          if x is not None)
        raise TypeError(f"segment ids ({types}) have no common integer type that JAX holds here (64-bit types need "
                        "jax_enable_x64; unsigned and signed 64-bit have none): pass the ids in one integer type")
    if common.itemsize < 4 or common == jnp.int32:
        def convert(x):
            return jnp.asarray(x, jnp.int32)
    elif common == jnp.uint32:
        def convert(x):
            return jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.uint32) ^ jnp.uint32(1 << 31), jnp.int32)
    else:
        local = [jnp.asarray(x, common) for x in given]
        pool = jnp.sort(jnp.concatenate([jax.lax.all_gather(x, axis_name, axis=1, tiled=True) for x in local], 1), 1)

        def convert(x):
            return jax.vmap(jnp.searchsorted)(pool, jnp.asarray(x, common)).astype(jnp.int32)

    return tuple(None if x is None else convert(x) for x in (q_ids, kv_ids))


def _ring_order(axis_name, n: int) -> list[tuple[int, int]]:
    """ppermute's (source, destination) pairs that hand each device's block to the next device of the ring.
    The ring numbers devices as lax.axis_index and PartitionSpec do, over a tuple of mesh axes in the order
    given (the first major); ppermute numbers them in the mesh's own axis order."""
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    mesh_names = tuple(jax.sharding.get_abstract_mesh().axis_names)
    ordered = tuple(sorted(names, key=mesh_names.index)) if set(names) <= set(mesh_names) else names
    sizes = {a: jax.lax.axis_size(a) for a in names}

    def permute_index(d):
        coords = dict(zip(names, np.unravel_index(d, [sizes[a] for a in names])))
        return int(np.ravel_multi_index([coords[a] for a in ordered], [sizes[a] for a in ordered]))

    return [(permute_index(d), permute_index((d + 1) % n)) for d in range(n)]


def zigzag(x, n: int, axis: int = 1):
    """x with its `axis` cut in 2n equal chunks reordered 0, 2n-1, 1, 2n-2, ..., n-1, n: sharded over n
    devices afterwards, device i holds chunks i and 2n-1-i (ring_attention's layout="zigzag")."""
    return _reorder(x, n, axis, [c for i in range(n) for c in (i, 2 * n - 1 - i)])


def unzigzag(x, n: int, axis: int = 1):
    """The inverse of `zigzag`: the sequence back in its natural order."""
    order = [c for i in range(n) for c in (i, 2 * n - 1 - i)]
    return _reorder(x, n, axis, sorted(range(2 * n), key=order.__getitem__))


def _reorder(x, n: int, axis: int, order):
    axis = axis % x.ndim
    if x.shape[axis] % (2 * n):
        raise ValueError(f"zigzag over {n} devices cuts the axis in {2 * n} equal chunks: its length "
                         f"{x.shape[axis]} must be a multiple of {2 * n}")

    def reorder(x):
        chunks = x.reshape(*x.shape[:axis], 2 * n, x.shape[axis] // (2 * n), *x.shape[axis + 1:])
        return jnp.take(chunks, jnp.asarray(order), axis=axis).reshape(x.shape)

    # on Explicit meshes with those axes made Auto: the gather has no Explicit rule along a sharded axis
    return _spmd.auto_axes(reorder, (x,), PartitionSpec(*_spmd.partition_spec(x)))


@dataclasses.dataclass(frozen=True)
class _Ring:
    axis_name: Any
    size: int  # devices along axis_name
    causal: bool
    layout: str  # "contiguous" where the layout changes nothing (no causal, window, ALiBi or dropout)
    opts: _dispatch.Options  # positional: the global band; else the band is set per call (_pieces)
    positional: bool = False  # window, ALiBi or dropout: calls over runs of global positions (_placed)


class _Piece(NamedTuple):
    """One call of a step: local query and key slices, its options, and (positional) its global
    positions (3,): first query, first key, global seq_k - seq_q (operands.Operands.positions)."""
    qs: slice
    ks: slice
    opts: _dispatch.Options
    positions: Any = None


# Without positions a step is one of these kinds; each is a list of static calls (query slice, key slice,
# causal) over the local positions (half: the first of the two zig-zag chunks).
def _pieces(cfg: _Ring, kind: str, sq: int, sk: int) -> list[_Piece]:
    every_q, every_k = slice(0, sq), slice(0, sk)
    calls = {"diagonal": [(every_q, every_k, True)],  # step 0 of a causal ring, both layouts
             "full": [(every_q, every_k, False)],
             "skip": [],  # contiguous, block after ours: invisible
             "lower": [(every_q, slice(0, sk // 2), False)],  # zig-zag, j < i: our two chunks see its first
             "upper": [(slice(sq // 2, sq), every_k, False)],  # zig-zag, j > i: our second chunk sees both
             }[kind]
    return [_Piece(qs, ks, dataclasses.replace(cfg.opts, band=Band.of(causal, (-1, -1), qs.stop - qs.start,
                                                                          ks.stop - ks.start)))
            for qs, ks, causal in calls]


def _by_step(cfg: _Ring, s, one, kv, state, sq: int, sk: int):
    """state after one(piece, kv, state) for each piece of step s (a Python int or traced): the block in
    hand is device j = (i - s) mod n's."""
    if cfg.positional:
        return _placed(cfg, s, one, kv, state, sq, sk)

    def run(kind, kv, state):
        for piece in _pieces(cfg, kind, sq, sk):
            state = one(piece, kv, state)
        return state

    if isinstance(s, int) and s == 0:
        return run("diagonal" if cfg.causal else "full", kv, state)
    if not cfg.causal:
        return run("full", kv, state)
    i = jax.lax.axis_index(cfg.axis_name)
    j = (i - s) % cfg.size
    before, after = ("lower", "upper") if cfg.layout == "zigzag" else ("full", "skip")
    return jax.lax.cond(j < i, functools.partial(run, before), functools.partial(run, after), kv, state)


def _runs(cfg: _Ring, d, length: int):
    """[(local slice, global start)] of the runs of consecutive positions device d (traced) holds."""
    if cfg.layout == "zigzag":
        h = length // 2
        return [(slice(0, h), d * h), (slice(h, length), (2 * cfg.size - 1 - d) * h)]
    return [(slice(0, length), d * length)]


def _placed(cfg: _Ring, s, one, kv, state, sq: int, sk: int):
    """_by_step with positions: one call per pair of runs (our queries', the block's keys') with their
    global positions, skipped (lax.cond) where the band reaches no pair, as causal skips later blocks."""
    n, band = cfg.size, cfg.opts.band
    i = jax.lax.axis_index(cfg.axis_name)
    j = (i - s) % n
    lo, hi = band.offsets(n * sq, n * sk)  # global: query p sees key p' iff p + lo <= p' <= p + hi
    for qs, q0 in _runs(cfg, i, sq):
        for ks, k0 in _runs(cfg, j, sk):
            piece = _Piece(qs, ks, cfg.opts, jnp.stack([q0, k0, jnp.asarray(n * (sk - sq))]).astype(jnp.int32))
            if not band.banded:
                state = one(piece, kv, state)
                continue
            # rows [q0, q0 + a) see keys [q0 + lo, q0 + a - 1 + hi] together (hi >= lo: one interval)
            a, c = qs.stop - qs.start, ks.stop - ks.start
            reached = (q0 + lo <= k0 + c - 1) & (q0 + a - 1 + hi >= k0)
            state = jax.lax.cond(reached, functools.partial(one, piece), lambda kv, state: state, kv, state)
    return state


def _circulate(cfg: _Ring, fixed, moving, local, step):
    """Runs step(s, fixed, moving, local) -> (moving, local) for s = 0 .. n-1 while the pytrees `fixed`
    (K/V and their ids: sent on before each step computes, so the transfer overlaps it) and `moving`
    (what a step accumulates into the block: sent after it) travel d -> d + 1. `moving` makes n hops,
    so it ends on the device it started on. Returns (moving, local)."""
    n = cfg.size
    perm = _ring_order(cfg.axis_name, n)

    def send(tree):
        return jax.tree.map(lambda x: jax.lax.ppermute(x, cfg.axis_name, perm), tree)

    if n == 1:
        return step(0, fixed, moving, local)
    nxt = send(fixed)
    moving, local = step(0, fixed, moving, local)
    carry = (nxt, send(moving), local)

    def body(carry, s):
        fixed, moving, local = carry
        nxt = send(fixed)
        moving, local = step(s, fixed, moving, local)
        return (nxt, send(moving), local), None

    if n > 2:  # steps 1 .. n-2 in a loop (compile time independent of n)
        carry, _ = jax.lax.scan(body, carry, jnp.arange(1, n - 1))
    fixed, moving, local = carry
    moving, local = step(n - 1, fixed, moving, local)  # the last block goes nowhere: no send of K/V
    return send(moving), local


def _sub(extras: Operands, kv_ids, piece: _Piece, batch: int) -> Operands:
    """The operands of one call: segment ids (the block's kv ids) sliced to it, its positions."""
    ids = {}
    if extras.q_segment_ids is not None:
        ids = dict(q_segment_ids=extras.q_segment_ids[:, piece.qs], kv_segment_ids=kv_ids[:, piece.ks])
    positions = None if piece.positions is None else jnp.broadcast_to(piece.positions, (batch, 3))
    return dataclasses.replace(extras, positions=positions, **ids)


def _merge(out_a, lse_a, out_b, lse_b):
    """Exact merge of two partial attentions over disjoint keys: out float32 (b, s, h, d), lse (b, h, s).
    Rows that saw nothing in either stay out 0, lse -inf."""
    lse = jnp.logaddexp(lse_a, lse_b)
    ref = jnp.where(jnp.isfinite(lse), lse, 0.0)  # -inf rows: both weights exp(-inf) = 0, no NaN

    def weight(x):
        return jnp.transpose(jnp.exp(x - ref), (0, 2, 1))[..., None]

    return out_a * weight(lse_a) + out_b.astype(jnp.float32) * weight(lse_b), lse


def _forward(cfg: _Ring, q, k, v, extras: Operands):
    sq, sk = q.shape[1], k.shape[1]
    # *_like: the accumulators keep q's type (sharding of axes left Explicit by a partial shard_map)
    rows = jnp.transpose(jnp.full_like(q[..., 0], -jnp.inf, dtype=jnp.float32), (0, 2, 1))  # (b, h, sq)
    acc = (_spmd.match_varying(jnp.zeros_like(q, dtype=jnp.float32), q, k, v), _spmd.match_varying(rows, q, k, v))

    def attend(piece, kv, acc):
        k, v, kv_ids = kv
        out_acc, lse_acc = acc
        qs, ks = piece.qs, piece.ks
        o, l = _dispatch.attention(q[:, qs], k[:, ks], v[:, ks], _sub(extras, kv_ids, piece, q.shape[0]), piece.opts)
        o, l = _merge(out_acc[:, qs], lse_acc[:, :, qs], o, l)
        return out_acc.at[:, qs].set(o), lse_acc.at[:, :, qs].set(l)

    def step(s, kv, _, acc):
        return (), _by_step(cfg, s, attend, kv, acc, sq, sk)

    _, (out, lse) = _circulate(cfg, (k, v, extras.kv_segment_ids), (), acc, step)
    return out.astype(q.dtype), lse


def _backward(cfg: _Ring, residuals, cotangents):
    q, k, v, extras, out, lse = residuals
    dout, dlse = cotangents
    like = (q, k, v, dout, dlse)
    dout, dlse = _spmd.match_varying(dout.astype(out.dtype), *like), _spmd.match_varying(dlse, *like)
    sq, sk = q.shape[1], k.shape[1]

    def zeros(x):
        return _spmd.match_varying(jnp.zeros_like(x, dtype=jnp.float32), *like)

    def accumulate(piece, kv, grads):
        k, v, kv_ids = kv
        (dk, dv), dq = grads
        qs, ks = piece.qs, piece.ks
        g = _dispatch.block_backward(q[:, qs], k[:, ks], v[:, ks], _sub(extras, kv_ids, piece, q.shape[0]),
                                     piece.opts, out[:, qs], lse[:, :, qs], dout[:, qs], dlse[:, :, qs])
        g = [_spmd.match_varying(x.astype(jnp.float32), *like) for x in g]
        return (dk.at[:, ks].add(g[1]), dv.at[:, ks].add(g[2])), dq.at[:, qs].add(g[0])

    def step(s, kv, dkv, dq):
        return _by_step(cfg, s, accumulate, kv, (dkv, dq), sq, sk)

    (dk, dv), dq = _circulate(cfg, (k, v, extras.kv_segment_ids), (zeros(k), zeros(v)), zeros(q), step)
    ids = jax.tree.map(lambda x: _spmd.match_varying(_dispatch._zero_cotangent(x), x), extras)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), ids


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ring(q, k, v, extras: Operands, cfg: _Ring):
    return _forward(cfg, q, k, v, extras)


def _ring_fwd(q, k, v, extras, cfg: _Ring):
    out, lse = _forward(cfg, q, k, v, extras)
    return (out, lse), (q, k, v, extras, out, lse)


_ring.defvjp(_ring_fwd, _backward)
