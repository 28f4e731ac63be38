"""What each kernel launch needs (grid, arguments, outputs, config), written once for every backend.

A backend supplies ``run(launch) -> tuple of outputs`` (jax-triton on a GPU, Triton's interpreter on
the CPU); ``forward`` and ``backward`` below chain the launches. Arguments are given by the kernel's
parameter names and put in its order here (jax-triton's convention: inputs, then outputs, then
constexprs by keyword), so the call sites read as name = value and an optional operand reaches every
kernel that names it (operands.Operands.kernel_args) without touching this file.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import _jax_triton_compat, fp8, rules
from jax_flash_amd._config_choice import block_d, pick_config, row_kind
from jax_flash_amd.kernels import bwd, configs, fwd
from jax_flash_amd.operands import Operands


@dataclasses.dataclass(frozen=True)
class Launch:
    kernel: Any  # a @triton.jit function
    grid: tuple[int, ...]
    args: tuple  # jax arrays, then Python int / np.float32 scalars, in the kernel's order
    out_shapes: tuple[jax.ShapeDtypeStruct, ...]
    constexprs: dict[str, Any]
    compile_options: dict[str, Any]  # num_warps, num_stages, and target-specific ones
    # (position in args, output index): that output is that input's buffer, updated in place (jax-triton's
    # input_output_aliases; a donated input is then not copied). The kernel writes it through the input's
    # parameter; the output keeps a parameter of its own (jax-triton 0.3's convention), which it never uses.
    aliases: tuple[tuple[int, int], ...] = ()


Run = Callable[[Launch], tuple]


@dataclasses.dataclass(frozen=True)
class Statics:
    """The static part of a call that the kernels see (dispatch.Options less the implementation)."""
    scale: float
    band: rules.Band = rules.Band()
    softcap: float = 0.0
    dropout_p: float = 0.0


@functools.cache
def _params(kernel) -> tuple[str, ...]:
    return tuple(inspect.signature(kernel.fn).parameters)


@functools.cache
def _defaults(kernel) -> dict:
    """The kernel's parameters with defaults (constexpr flags such as TMA). Given explicitly: jax-triton
    compiles only what it is passed, so a default left out would arrive as None."""
    return {name: p.default for name, p in inspect.signature(kernel.fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _launch(kernel, grid, inputs: dict, out_shapes: tuple, constexprs: dict, options: dict,
            extras: Operands | None = None) -> Launch:
    """A Launch with `inputs` (every runtime parameter before the outputs, by name) in the kernel's order,
    plus the optional operands (extras) the kernel names, with their presence flags."""
    params = _params(kernel)
    if extras is not None:
        inputs = {**inputs, **extras.kernel_args(params)}
        constexprs = {**constexprs, **extras.kernel_flags(params)}
    constexprs = {**_defaults(kernel), **constexprs}
    n_in = len(inputs)
    if set(params[:n_in]) != set(inputs):
        raise TypeError(f"{kernel.__name__} takes {params[:n_in]} before its outputs; given {tuple(inputs)}")
    return Launch(kernel, tuple(grid), tuple(inputs[p] for p in params[:n_in]), tuple(out_shapes), constexprs,
                  options)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def segment_ranges(ids, other_ids, block: int) -> jax.Array:
    """(batch, blocks, 2) int32: for each block of `block` positions of ids (batch, seq), the range
    [lo, hi) of positions of other_ids (batch, seq_other) whose id can equal one in the block. Exact
    when other_ids is sorted along each row (the usual packing; ids need not be); the whole range
    otherwise. The kernels skip the blocks outside it (masking.segment_span)."""
    b, seq = ids.shape
    n = _cdiv(seq, block)
    info = jnp.iinfo(jnp.int32)
    pad = ((0, 0), (0, n * block - seq))
    lowest = jnp.pad(ids, pad, constant_values=info.max).reshape(b, n, block).min(-1)
    highest = jnp.pad(ids, pad, constant_values=info.min).reshape(b, n, block).max(-1)

    def find(side, values):
        return jax.vmap(functools.partial(jnp.searchsorted, side=side, method="scan_unrolled"))(other_ids, values)

    lo, hi = find("left", lowest), find("right", highest)
    ordered = jnp.all(other_ids[:, 1:] >= other_ids[:, :-1], axis=1)[:, None]
    lo = jnp.where(ordered, lo, 0)
    hi = jnp.where(ordered, hi, other_ids.shape[1])
    return jnp.stack([lo, hi], axis=-1).astype(jnp.int32)


def _ranges(extras: Operands, query_side: bool, block: int):
    """segment_ranges of query blocks (query_side) or key blocks; a placeholder without segment ids."""
    if extras.q_segment_ids is None:
        return jnp.zeros((1,), jnp.int32)
    ids, other = extras.q_segment_ids, extras.kv_segment_ids
    return segment_ranges(ids, other, block) if query_side else segment_ranges(other, ids, block)


def _common(q, k, statics: Statics) -> tuple[dict, dict]:
    """(runtime scalars, constexprs) every attention kernel takes."""
    sq, sk = q.shape[1], k.shape[1]
    lo_off, hi_off = statics.band.offsets(sq, sk)
    scalars = dict(sm_scale=np.float32(statics.scale), softcap=np.float32(statics.softcap),
                   keep_scale=np.float32(rules.dropout_keep_scale(statics.dropout_p)), seq_q=sq, seq_k=sk,
                   lo_off=lo_off, hi_off=hi_off)
    constexprs = dict(H=q.shape[2], KV_H=k.shape[2], HEAD_DIM=q.shape[3], BLOCK_D=block_d(q.shape[3], q.dtype),
                      BANDED=statics.band.sides, SOFTCAP=statics.softcap > 0,
                      DROP_THRESHOLD=rules.dropout_threshold(statics.dropout_p))
    return scalars, constexprs


def _kind(q, k, statics: Statics) -> str:
    return row_kind(statics.band, statics.dropout_p, q.shape[2] // k.shape[2], fp8.is_fp8(q.dtype))


def _whole_16bit_tiles(q) -> bool:
    """16-bit inputs with a power-of-two head: what TMA descriptors over whole head tiles need."""
    return jnp.dtype(q.dtype).itemsize == 2 and block_d(q.shape[3], q.dtype) == q.shape[3]


def _takes_tma(q, statics: Statics, extras: Operands) -> bool:
    """Whether a call may take the TMA rows (sm90, kernels/fwd.py and bwd.py): _whole_16bit_tiles, without
    segment ids (Triton 3.6's warp-specialisation pass fails to compile that loop), nor dropout in a narrow
    window (its "+window" pointer rows are faster there: H200, bf16, (1024, 0), 1 x 16384 x 16 x 128, p 0.1,
    ms, TMA rows / pointer rows: forward 0.677 / 0.490, whole backward 1.551 / 1.446 with dK/dV's; NOTES
    "Sixteenth session"). Others take the target's pointer rows."""
    return (_whole_16bit_tiles(q) and extras.q_segment_ids is None
            and not (statics.dropout_p > 0 and statics.band.narrow(configs.NARROW_WINDOW)))


def _dkdv_takes_tma(q, statics: Statics, extras: Operands) -> bool:
    """_takes_tma, with seq_q a multiple of 4 and (batch * heads * seq_q) below 2^31: the kernel addresses lse
    and delta ((batch, heads, seq_q) float32) by int32 row offsets. (seq_q % 4 was what its 1-D descriptors
    over them needed, 16-byte aligned blocks; they went in the tenth session, NOTES, and the rule stays: other
    lengths have not run the TMA dK/dV rows on the GPU, and the 2-D tiles that may replace the pointer loads
    need it.) Not with softcap: its tanh chain spills in the warp-specialised loop (sm90 ptxas: 288-1132 bytes at
    168 registers per thread), and that kernel returned non-finite dK on the H200 (tests/test_sm90.py,
    ragged causal) with the same PTX that had passed there before: a race in Triton 3.6's code, not in
    the math."""
    b, sq, h, _ = q.shape
    return (_takes_tma(q, statics, extras) and statics.softcap == 0 and sq % 4 == 0
            and b * h * sq < 2 ** 31)


def compute_units(target: str) -> int:
    """SMs / CUs of the default GPU (as the device reports them), else configs.DECODE_SPLITS' number."""
    if target != "interpret":
        count = getattr(jax.devices()[0], "core_count", None)
        if isinstance(count, int) and count > 0:
            return count
    return configs.DECODE_SPLITS[target]["cus"]


def persistent_programs(blocks: dict, target: str, rows: int, sq: int, sk: int, band: rules.Band,
                        keys: bool = False) -> int:
    """Programs of a persistent grid for a forward config (kernels/fwd.py PERSISTENT; the config's
    PERSISTENT: programs per compute unit), or with `keys` for a TMA dK/dV config (kernels/bwd.py, tiles
    of key blocks), or 0 for one program per tile. One descriptor per tensor
    serves only tiles that never cross a batch element, so only calls of whole query and key blocks.
    Persistent saves each tile's fixed cost (descriptors, pipeline fill), but fixes in advance which
    tiles a program runs (masking.persistent_tile), so it is taken only where that schedule is about as
    balanced as the tiled grid's: the busiest program's work at most configs.PERSISTENT_BALANCE times the
    tiled grid's finish (_tiled_finish), a tile's work counted as the blocks of the other side it visits
    (the band) plus one (causal 1 x 16384 x 16, D 128: 1.5x; H200 3.03 ms against 2.22 tiled). With a band
    other than a narrow window (configs.NARROW_WINDOW), also only up to configs.PERSISTENT_BANDED_BLOCKS
    blocks per row: beyond, persistent measured slower though balanced (causal 1 x 131072 x 16: 150 ms
    against 132), while a window's short key ranges measured faster at every length (configs.py)."""
    block_m, block_n = blocks["BLOCK_M"], blocks["BLOCK_N"]
    if not blocks.get("PERSISTENT") or sq % block_m or sk % block_n:
        return 0
    n_blocks = (sk // block_n) if keys else (sq // block_m)
    if band.sides and not band.narrow(configs.NARROW_WINDOW) and n_blocks > configs.PERSISTENT_BANDED_BLOCKS:
        return 0
    programs = min(blocks["PERSISTENT"] * compute_units(target), n_blocks * rows)
    lo_off, hi_off = band.offsets(sq, sk)
    if keys:  # queries [first * block_m, end) of each key block (masking.query_blocks), heaviest (first) first
        starts = np.arange(n_blocks) * block_n
        first = np.clip(starts - hi_off, 0, sq) // block_m
        end = np.clip(np.minimum(starts + block_n, sk) - lo_off, 0, sq)
        order = slice(None)
    else:  # keys [first * block_n, end) of each query block (masking.key_blocks), the last one first
        starts = np.arange(n_blocks) * block_m
        first = np.clip(starts + lo_off, 0, sk) // block_n
        end = np.clip(np.minimum(starts + block_m, sq) + hi_off, 0, sk)
        order = slice(None, None, -1)
    cost = (np.maximum(-(-end // (block_m if keys else block_n)) - first, 0) + 1)[order]  # in launch order
    i = np.arange(n_blocks * rows)
    rounds, column = np.divmod(i, programs)
    column = np.where(rounds % 2 == 1, programs - 1 - column, column)  # masking._column's snake
    work = np.bincount(column, cost[i % n_blocks], programs)
    tiled = _tiled_finish(cost, rows, programs, band.sides == 1,
                          blocks.get("GROUP_PROGRAMS", configs.TILED_GROUP_PROGRAMS))
    return programs if work.max() <= configs.PERSISTENT_BALANCE * tiled else 0


def _tiled_finish(row_costs, rows: int, slots: int, grouped: bool, group_programs: int) -> float:
    """When a grid of one program per tile would finish, in tile work: rows x row_costs (a row's tiles,
    heaviest first) handed to `slots` programs at a time in launch order (tiled_order: `grouped`, rows in
    groups of about group_programs programs, block-major), each slot taking the next tile when free (greedy,
    as the GPU's block scheduler does). It pays the same last-wave tail a persistent schedule does (16 x
    1024 x 16 tiles on 132 SMs: 15.5 rounds), which a comparison with the mean work would count against
    persistent only. Beyond 2^16 tiles the tail is negligible: the mean."""
    n = len(row_costs) * rows
    if n > 1 << 16:
        return float(np.sum(row_costs)) * rows / slots
    free = [0.0] * slots
    for c in np.asarray(row_costs)[tiled_order(len(row_costs), rows, grouped, group_programs)[:, 0]].tolist():
        heapq.heapreplace(free, free[0] + c)
    return max(free)


def tiled_order(n_blocks: int, rows: int, grouped: bool,
                group_programs: int = configs.TILED_GROUP_PROGRAMS) -> np.ndarray:
    """(i, row) of each program of a tiled grid of n_blocks x rows, in launch order (masking.tile_order):
    row-major, or (`grouped`: a band bounded on the right only, BANDED == 1) rows in groups of about
    group_programs programs, block-major in each group."""
    per = max(group_programs // n_blocks, 1) if grouped else 1
    i, r = np.meshgrid(np.arange(n_blocks), np.arange(per), indexing="ij")  # a whole group's, block-major
    return np.concatenate([np.stack([i.ravel(), first + r.ravel()], 1)[r.ravel() < rows - first]
                           for first in range(0, rows, per)])


def edges_apart(blocks: dict, loop: int, block: int, statics: Statics, whole: bool, ds: bool = False) -> bool:
    """Whether a call of a TMA row runs the masked blocks at its band's edges in a launch of their own
    (kernels/fwd.py, bwd.py: EDGES; `loop` positions in blocks of `block` along the kernel's loop, keys
    for the forward, queries for dK/dV): where its one warp-specialised loop would mask every block (a band,
    or not `whole`: the kernel's own KEYS_EVEN / QUERIES_EVEN; Triton 3.6's pass takes neither a second
    loop nor a branch in it), and a row's loop runs at least configs.EDGES_APART_BLOCKS blocks (the band's
    width where both sides bound it; configs.DS_EDGES_APART_BLOCKS on the dS path, `ds`), so that the mask
    saved outweighs the second launch and the float32 partial result between the two (configs.py: H200
    measurements). The edge launches rely on what a TMA row implies (_takes_tma: no fp8 or segment ids, whose
    partial would carry lse's fp8 shift or a mask on every block), on no dropout (refused here: the forward's
    partial would carry keep_scale; the backward's edges were not run with it) and on no SPLIT; attn_fwd
    asserts it too (attn_bwd_dkdv does not: that assert moved the H200-tested kernel's shared-memory layout)."""
    band = statics.band
    if not blocks.get("TMA") or blocks.get("SPLIT") or statics.dropout_p > 0 or (not band.sides and whole):
        return False
    width = band.left + band.right + 1 if band.left >= 0 and band.right >= 0 else loop
    return _cdiv(min(width, loop), block) >= (configs.DS_EDGES_APART_BLOCKS if ds else configs.EDGES_APART_BLOCKS)


def _edge_blocks(blocks: dict, kernel: str) -> tuple[dict, dict]:
    """(constexprs, compiler options) of the EDGES == 2 launch after a TMA row's EDGES == 1 one: the same
    blocks (the two split each tile's blocks between them), through pointer loads, options from
    configs.EDGE_OPTIONS."""
    edge = {"BLOCK_M": blocks["BLOCK_M"], "BLOCK_N": blocks["BLOCK_N"], "TMA": False, "WARP_SPECIALIZE": False,
            "PERSISTENT": False, "EDGES": 2}
    return edge, dict(configs.EDGE_OPTIONS[kernel])


def keys_last(run: Run, target: str, v, mma_order=False):
    """v (batch, seq_k, heads, D) as (batch, heads, D, seq_k rounded up to 16), zero-padded: the layout
    the fp8 forward reads (kernels/fwd.py); mma_order: each 32 keys in fwd.mma_order's order."""
    b, sk, h, d = v.shape
    padded = _cdiv(sk, 16) * 16  # kernels/fwd.py: keys_padded
    blocks, options = pick_config(target, "keys_last", d, v.dtype)
    (vt,) = run(_launch(
        fwd.keys_last, grid=(_cdiv(padded, blocks["BLOCK_N"]), b * h),
        inputs=dict(V=v, seq_k=sk),
        out_shapes=(jax.ShapeDtypeStruct((b, h, d, padded), v.dtype),),
        constexprs=dict(KV_H=h, HEAD_DIM=d, BLOCK_D=block_d(d, v.dtype), MMA_ORDER=mma_order, **blocks),
        options=options,
    ))
    return vt


def _fp8_inputs(run: Run, target: str, q, v, mma_order=False):
    """(v as a forward kernel reads it, the output's dtype, P8_LOG2): fp8 inputs read V^T (keys_last; mma_order
    for the Gluon forward) and give bfloat16 (kernels/fwd.py, fwd_sm90.py)."""
    if not fp8.is_fp8(q.dtype):
        return v, q.dtype, 0
    return keys_last(run, target, v, mma_order), jnp.bfloat16, fp8.P_LOG2[jnp.dtype(q.dtype)]


def forward(run: Run, target: str, q, k, v, extras: Operands = Operands(), *, statics: Statics, rows=None):
    """(out, lse2): out like q (bfloat16 for fp8 inputs), lse2 (batch, heads, seq_q) float32 in base 2
    (what backward takes; lse = lse2 * ln 2). rows: {kernel: config row} overriding the defaults
    (autotuning)."""
    gluon = gluon_forward(target, q, k, statics, extras, rows)
    if gluon is not None:
        return _forward_gluon(run, q, k, v, extras, statics, gluon)
    b, sq, h, _ = q.shape
    pick = functools.partial(pick_config, target, "fwd", q.shape[3], q.dtype, rows, _kind(q, k, statics),
                             tma=_takes_tma(q, statics, extras),
                             banded_seq=max(sq, k.shape[1]) if statics.band.sides else 0)
    blocks, options = pick()
    programs = persistent_programs(blocks, target, b * h, sq, k.shape[1], statics.band)
    if not programs or programs >= b * h * _cdiv(sq, blocks["BLOCK_M"]):  # tiled, or one tile per program
        # (a tiled grid by another name): the rows that serve only calls they run persistent give way
        tiled = pick(persistent=False)
        if tiled != (blocks, options):
            blocks, options = tiled
            programs = persistent_programs(blocks, target, b * h, sq, k.shape[1], statics.band)
    scalars, constexprs = _common(q, k, statics)
    v, out_dtype, constexprs["P8_LOG2"] = _fp8_inputs(run, target, q, v)
    n_blocks = _cdiv(sq, blocks["BLOCK_M"])
    grid = (n_blocks, b * h)
    if blocks.get("TMA"):  # kernels/fwd.py: the TMA loop goes unmasked when every key block is whole
        constexprs["KEYS_EVEN"] = k.shape[1] % blocks["BLOCK_N"] == 0
    # not with a persistent grid: the float32 partial's staging takes that D 128 kernel's shared memory past an
    # SM's (sm90 cross-compile: 262 KB; tiled 230 KB, of 227 KiB)
    edges = not programs and edges_apart(blocks, k.shape[1], blocks["BLOCK_N"], statics,
                                         constexprs.get("KEYS_EVEN", False))
    blocks = dict(blocks, PERSISTENT=programs > 0, EDGES=int(edges))
    if programs:
        grid = (programs, 1)
    inputs = dict(Q=q, K=k, V=v, KeyRanges=_ranges(extras, True, blocks["BLOCK_M"]), batch=b, **scalars)
    lse_shape = jax.ShapeDtypeStruct((b, h, sq), jnp.float32)
    out, lse = run(_launch(
        fwd.attn_fwd, grid=grid,
        inputs=dict(inputs, Part=_placeholder(), PartLse=_placeholder()),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, jnp.float32 if edges else out_dtype), lse_shape),
        constexprs={**constexprs, **blocks},
        options=options, extras=extras,
    ))
    if edges:  # the band's edge blocks, from that partial result (kernels/fwd.py EDGES)
        edge, edge_options = _edge_blocks(blocks, "fwd")
        out, lse = run(_launch(
            fwd.attn_fwd, grid=(n_blocks, b * h),
            inputs=dict(inputs, Part=out, PartLse=lse),
            out_shapes=(jax.ShapeDtypeStruct(q.shape, out_dtype), lse_shape),
            constexprs={**constexprs, **edge}, options=edge_options, extras=extras,
        ))
    return out, lse


def interpreted() -> bool:
    """Whether the kernels were built for Triton's interpreter (TRITON_INTERPRET=1 when triton was first imported):
    the interpret implementation needs it, the triton one needs it not, and the interpreter cannot run Gluon."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fwd.attn_fwd, InterpretedFunction)


def gluon_forward(target: str, q, k, statics: Statics, extras: Operands, rows=None) -> dict | None:
    """The configs.SM90_GLUON_FWD row of the Gluon forward (kernels/fwd_sm90.py) for this call, or None (the Triton
    forward): sm90, compiled kernels launched with their compiled warp count (_jax_triton_compat), 16-bit inputs
    (fp8: configs.SM90_GLUON_FWD_FP8's rows) with a head of a row's size, no segment ids or positions, no dropout
    unless the row says `dropout`, a narrow window only on a row that says `window` (16-bit, without dropout, and only
    where it runs persistent; the "+window" rows' short key loops beat the tiled grid: configs.py), both lengths at
    least the row's min_seq (a short key loop or grid pays the program's fixed cost; a row with PERSISTENT, which
    spreads that cost, only where the call runs persistent: gluon_programs), and no "fwd" row given (autotuning and
    the rows sweep time the Triton rows)."""
    if not _gluon_takes(target, q, statics, extras, rows, "fwd"):
        return None
    table = configs.SM90_GLUON_FWD_FP8 if fp8.is_fp8(q.dtype) else configs.SM90_GLUON_FWD
    if statics.band.narrow(configs.NARROW_WINDOW):
        table = [row for row in table if row.get("window") and row.get("PERSISTENT")]
    return _gluon_row(table, q, k, statics)


def gluon_dkdv(target: str, q, k, statics: Statics, extras: Operands, rows=None) -> dict | None:
    """The configs.SM90_GLUON_DKDV row of the Gluon dK/dV (kernels/bwd_sm90.py) for this call, or None (the Triton
    rows): what gluon_forward asks (both lengths at least the row's min_seq) but narrow windows without dropout too,
    and no "dkdv" row given; with dropout only where the row says `dropout`."""
    if not _gluon_takes(target, q, statics, extras, rows, "dkdv"):
        return None
    if q.shape[0] * q.shape[2] * _cdiv(q.shape[1], 4) * 4 >= 2 ** 31:  # lse's 1-D TMA tiles: int32 coordinates
        return None
    return _gluon_row(configs.SM90_GLUON_DKDV, q, k, statics, keys=True)


def gluon_dq(target: str, q, k, statics: Statics, extras: Operands, rows=None) -> dict | None:
    """The configs.SM90_GLUON_DQ row of the Gluon dQ (kernels/bwd_sm90.py, the seven-product path) for this call, or
    None (the Triton rows): as gluon_dkdv, no "dq" row given."""
    if not _gluon_takes(target, q, statics, extras, rows, "dq"):
        return None
    return _gluon_row(configs.SM90_GLUON_DQ, q, k, statics)


def _gluon_takes(target: str, q, statics: Statics, extras: Operands, rows, kernel: str) -> bool:
    """Whether a call may take a Gluon kernel (kernels/*_sm90.py) in place of `kernel`'s Triton rows: sm90, compiled
    kernels launched with their compiled warp count (_jax_triton_compat), 16-bit inputs (the forward: fp8 too) with a
    power-of-two head, no segment ids or positions, no narrow window with dropout nor for dQ, and no row given for
    `kernel` (autotuning and the rows sweep time the Triton rows). Dropout: _gluon_row. Narrow windows: the
    forward's through the rows that say `window` (gluon_forward); the dK/dV's short query loops are no slower in
    Gluon (H200, D 128, 1 x 16384 x 16, whole backward ms, Triton / Gluon dK/dV: (1024, 0) 1.165 / 1.057, (256, 256)
    0.786 / 0.796; hopper_rows_sweep.py gluonbwdwindow); with dropout not measured."""
    if target != "sm90" or (rows or {}).get(kernel) is not None:
        return False
    if statics.band.narrow(configs.NARROW_WINDOW) and (kernel == "dq" or statics.dropout_p > 0):
        return False
    fp8_tiles = kernel == "fwd" and fp8.is_fp8(q.dtype) and block_d(q.shape[3], q.dtype) == q.shape[3]
    if not (_whole_16bit_tiles(q) or fp8_tiles) or extras.q_segment_ids is not None:
        return False
    return extras.positions is None and _jax_triton_compat.launches_compiled_warps() and not interpreted()


def _gluon_row(table: list[dict], q, k, statics: Statics, keys: bool = False) -> dict | None:
    """The first row of a Gluon kernel's table (configs.SM90_GLUON_*) for the call's head dim whose min_seq both
    lengths reach, that takes the call's dropout if any, and, a row with PERSISTENT, where the call runs persistent
    (gluon_programs; keys: the dK/dV's grid); else None (a row that cannot run persistent gives way to the next)."""
    return next((row for row in table
                 if row["head_dim"] == q.shape[3] and min(q.shape[1], k.shape[1]) >= row["min_seq"]
                 and (statics.dropout_p == 0 or row["dropout"])
                 and (not row.get("PERSISTENT") or gluon_programs(row, q, k, statics, keys))), None)


def gluon_programs(row: dict, q, k, statics: Statics, keys: bool = False) -> int:
    """Programs of a Gluon kernel's persistent grid for a row with PERSISTENT (programs per SM), or 0 (a tiled grid):
    whole query and key blocks (one descriptor per tensor serves every tile) and persistent_programs' balance rule.
    The forward's tiles: 128 queries (fwd_sm90.ROWS per group) of batch * heads rows; keys (the dK/dV,
    kernels/bwd_sm90.py): 128 keys of batch * key/value heads rows, in steps of the row's BLOCK_M queries."""
    if not row.get("PERSISTENT"):
        return 0
    block_m, block_n, heads = (row["BLOCK_M"], 2 * 64, k.shape[2]) if keys else (2 * 64, row["BLOCK_N"], q.shape[2])
    return persistent_programs(dict(BLOCK_M=block_m, BLOCK_N=block_n, PERSISTENT=row["PERSISTENT"]), "sm90",
                               q.shape[0] * heads, q.shape[1], k.shape[1], statics.band, keys=keys)


def _gluon_args(q, k, statics: Statics, row: dict) -> tuple[dict, dict]:
    """(runtime scalars, constexprs) every Gluon kernel takes (_common's it names, and the row's upper-case
    entries)."""
    scalars, common = _common(q, k, statics)
    inputs = {name: scalars[name] for name in ("sm_scale", "softcap", "keep_scale", "seq_q", "seq_k", "lo_off",
                                               "hi_off")}
    constexprs = {name: common[name] for name in ("H", "KV_H", "HEAD_DIM", "BANDED", "SOFTCAP", "DROP_THRESHOLD")}
    return inputs, {**constexprs, **{name: value for name, value in row.items() if name.isupper()}}


def _forward_gluon(run: Run, q, k, v, extras: Operands, statics: Statics, row: dict):
    """forward's (out, lse2) from the Gluon kernel: one program per (128 queries, batch * heads)."""
    from jax_flash_amd.kernels import fwd_sm90  # Gluon: imported only where it runs

    b, sq, h, _ = q.shape
    inputs, constexprs = _gluon_args(q, k, statics, row)
    constexprs["KEYS_EVEN"] = k.shape[1] % row["BLOCK_N"] == 0
    # a row's PINGPONG for calls without a band: causal ones measured 1-4 % slower with it (configs.SM90_GLUON_FWD_FP8)
    constexprs["PINGPONG"] = bool(row.get("PINGPONG")) and not constexprs["BANDED"]
    v, out_dtype, constexprs["P8_LOG2"] = _fp8_inputs(run, "sm90", q, v, mma_order=True)
    grid = (_cdiv(sq, 2 * fwd_sm90.ROWS.value), b * h)
    constexprs.pop("PERSISTENT", None)  # programs per SM: the grid's (gluon_programs), not a kernel parameter
    programs = gluon_programs(row, q, k, statics)
    if programs:
        grid, constexprs["N_ROWS"] = (programs, 1), b * h
    return run(_launch(
        fwd_sm90.attn_fwd_sm90, grid=grid, inputs=dict(Q=q, K=k, V=v, **inputs),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, out_dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
        constexprs=constexprs, options={"num_warps": row["num_warps"]}, extras=extras))


def _placeholder():
    """An operand a launch does not read (a kernel parameter its constexprs leave unused)."""
    return jnp.zeros((1,), jnp.float32)


def _dkdv_config(target: str, q, k, statics: Statics, extras: Operands, rows) -> tuple[dict, dict]:
    gluon = gluon_dkdv(target, q, k, statics, extras, rows)
    if gluon is not None:  # 128-key blocks, two warp groups of 64 (kernels/bwd_sm90.py)
        return {"GLUON": True, "SPLIT": False, "BLOCK_N": 128,
                **{name: value for name, value in gluon.items() if name.isupper()}}, {"num_warps": gluon["num_warps"]}
    blocks, options = pick_config(target, "dkdv", q.shape[3], q.dtype, rows, _kind(q, k, statics),
                                  tma=_dkdv_takes_tma(q, statics, extras))
    blocks = {"SPLIT": False, **blocks}
    if blocks.get("TMA"):  # kernels/bwd.py: the TMA loop goes unmasked when every block is whole
        blocks["QUERIES_EVEN"] = q.shape[1] % blocks["BLOCK_M"] == 0 and k.shape[1] % blocks["BLOCK_N"] == 0
    return blocks, options


def _dkdv(run: Run, target: str, q, k, v, dout, lse2, delta, extras: Operands, statics: Statics, dkdv,
          ds: bool = False):
    """(dk, dv, dS workspace) of the dK/dV kernel with config dkdv (_dkdv_config), ds: on the dS path (it
    stores dS^T, ds_workspace; else a placeholder). One program per (key block, batch * key/value head[, dV
    or dK where SPLIT]), or a persistent grid (TMA rows with PERSISTENT, persistent_programs) where it has
    fewer programs than tiles, but not while it stores dS (persistent, that returned NaN on the H200 with
    Triton 3.6, kernels/configs.py)."""
    if dkdv[0].get("GLUON"):
        return _dkdv_gluon(run, q, k, v, dout, lse2, delta, extras, statics, dkdv, ds)
    b, sq, h, _ = q.shape
    sk, h_kv = k.shape[1], k.shape[2]
    blocks, options = dkdv
    n_blocks = _cdiv(sk, blocks["BLOCK_N"])
    programs = 0
    if blocks.get("TMA") and not blocks["SPLIT"] and not ds:
        programs = persistent_programs(blocks, target, b * h_kv, sq, sk, statics.band, keys=True)
    persistent = 0 < programs < n_blocks * b * h_kv
    grid = (programs, 1, 1) if persistent else (n_blocks, b * h_kv, 2 if blocks["SPLIT"] else 1)
    edges = edges_apart(blocks, sq, blocks["BLOCK_M"], statics, blocks.get("QUERIES_EVEN", False), ds)
    scalars, constexprs = _common(q, k, statics)
    inputs = dict(Q=q, K=k, V=v, QueryRanges=_ranges(extras, False, blocks["BLOCK_N"]), dOut=dout, Lse=lse2,
                  Delta=delta, batch=b, **scalars)
    part = jnp.float32 if edges else None
    dk, dv, ds_out = run(_launch(
        bwd.attn_bwd_dkdv, grid=grid,
        inputs=dict(inputs, DKPart=_placeholder(), DVPart=_placeholder(), DSPart=_placeholder()),
        out_shapes=(jax.ShapeDtypeStruct(k.shape, part or k.dtype), jax.ShapeDtypeStruct(v.shape, part or v.dtype),
                    jax.ShapeDtypeStruct(ds_workspace(b, h, sq, sk, blocks["BLOCK_N"], statics.band) if ds else (1,),
                                         q.dtype)),
        constexprs={**constexprs, **blocks, "DS": ds, "PERSISTENT": persistent, "EDGES": int(edges),
                    **_ds_band(statics.band, sq, ds)},
        options=options, extras=extras,
    ))
    if edges:  # the band's edge blocks, added to those partial sums (kernels/bwd.py EDGES); on the dS path
        # their dS tiles go into the first launch's workspace, in place
        edge, edge_options = _edge_blocks(blocks, "dkdv")
        launch = _launch(
            bwd.attn_bwd_dkdv, grid=(n_blocks, b * h_kv, 1),
            inputs=dict(inputs, DKPart=dk, DVPart=dv, DSPart=ds_out),
            out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                        jax.ShapeDtypeStruct(ds_out.shape, q.dtype)),
            constexprs={**constexprs, **blocks, "DS": ds, **_ds_band(statics.band, sq, ds), **edge},
            options=edge_options, extras=extras,
        )
        if ds:
            launch = dataclasses.replace(launch, aliases=((_params(bwd.attn_bwd_dkdv).index("DSPart"), 2),))
        dk, dv, ds_out = run(launch)
    return dk, dv, ds_out


def _dkdv_gluon(run: Run, q, k, v, dout, lse2, delta, extras: Operands, statics: Statics, dkdv, ds: bool):
    """_dkdv's (dk, dv, dS workspace) from the Gluon kernel (gluon_dkdv): one program per (128 keys, batch *
    key/value heads), or a row with PERSISTENT where the call runs persistent (gluon_programs) a grid of about that
    many programs per SM."""
    from jax_flash_amd.kernels import bwd_sm90  # Gluon: imported only where it runs

    b, sq, h, _ = q.shape
    sk, h_kv = k.shape[1], k.shape[2]
    blocks, options = dkdv
    inputs, constexprs = _gluon_args(q, k, statics, {name: blocks[name] for name in ("BLOCK_M", "STAGES",
                                                                                     "CONSUMER_REGS")})
    # a row's SPANS (kernels/bwd_sm90.py _consume_tile) for narrow windows only: their groups skip 1 of ~18 steps,
    # while a causal call's skip the diagonal's step at a longer loop (sm90 SASS)
    constexprs["SPANS"] = bool(blocks.get("SPANS")) and statics.band.narrow(configs.NARROW_WINDOW)
    # (on the dS path by heads, a launch per head group: its slice may run tiled where the whole call would not, the
    # row's other settings the same)
    programs = gluon_programs(blocks, q, k, statics, keys=True)
    constexprs.update(DS=ds, EVEN=sq % blocks["BLOCK_M"] == 0 and sk % blocks["BLOCK_N"] == 0,
                      **_ds_band(statics.band, sq, ds))
    lse_len = _cdiv(sq, 4) * 4  # lse's and delta's rows 16-byte aligned, as the kernel's TMA tiles need
    if lse_len != sq:
        lse2, delta = (jnp.pad(x, ((0, 0), (0, 0), (0, lse_len - sq))) for x in (lse2, delta))
    workspace = ds_workspace(b, h, sq, sk, blocks["BLOCK_N"], statics.band) if ds else (1,)
    grid = (_cdiv(sk, blocks["BLOCK_N"]), b * h_kv)
    if programs:
        grid, constexprs["N_ROWS"] = (programs, 1), b * h_kv
    return run(_launch(
        bwd_sm90.attn_bwd_dkdv_sm90, grid=grid,
        inputs=dict(Q=q, K=k, V=v, dOut=dout, Lse=lse2, Delta=delta, lse_len=lse_len, **inputs),
        out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                    jax.ShapeDtypeStruct(workspace, q.dtype)),
        constexprs=constexprs, options=options, extras=extras))


def ds_workspace(batch: int, heads: int, sq: int, sk: int, block_n: int, band: rules.Band) -> tuple[int, int]:
    """(rows, cols) of the dS path's 16-bit workspace for `heads` query heads, as kernels/bwd.py ds_tiles
    lays it out: seq_k rounded up to the dK/dV row's block_n per (batch, head); seq_q rounded up to 8, or
    where the layout is banded (_ds_banded) the columns a row's band needs."""
    rows = batch * heads * _cdiv(sk, block_n) * block_n
    return rows, (_ds_band_cols(band) if _ds_banded(band, sq) else _cdiv(sq, 8) * 8)


def _ds_band_cols(band: rules.Band) -> int:
    """A banded workspace's columns (kernels/bwd.py ds_tiles with DS_BAND)."""
    return _cdiv(2 * bwd.DS_BAND_BLOCK.value - 1 + band.left + band.right, 8) * 8  # the kernels' value


def _ds_banded(band: rules.Band, sq: int) -> bool:
    """Whether the dS path's workspace takes the banded layout (kernels/bwd.py ds_tiles, DS_BAND): a band
    bounded on both sides whose banded rows (_ds_band_cols) are narrower than seq_q's, so that a window's
    workspace grows with its width, not with seq_q (window (1024, 0), 1 x 16384 x 16 heads: 40 MiB per head
    where whole rows take 512 MiB)."""
    return band.left >= 0 and band.right >= 0 and _ds_band_cols(band) < _cdiv(sq, 8) * 8


def _within_band_groups(blocks: dict) -> bool:
    """Whether a row's blocks fit the banded workspace's groups of configs.DS_BAND_BLOCK positions (kernels/bwd.py
    ds_col: every tile in one group of keys, starting at or right of its column 0)."""
    return max(blocks["BLOCK_M"], blocks["BLOCK_N"]) <= bwd.DS_BAND_BLOCK.value


def _ds_band(band: rules.Band, sq: int, ds: bool) -> dict:
    """The DS_BAND constexpr of a dK/dV or dQ launch on the dS path (ds), where _ds_banded."""
    return {"DS_BAND": True} if ds and _ds_banded(band, sq) else {}


def ds_heads(target: str, q, k, statics: Statics, extras: Operands = Operands(), rows=None) -> int:
    """Key/value heads per launch of the dS path (kernels/bwd.py), 0 for the seven-product path
    (_ds_heads, for the dK/dV config the call takes)."""
    return _ds_heads(q, k, statics, extras, _dkdv_config(target, q, k, statics, extras, rows)[0])


def _ds_heads(q, k, statics: Statics, extras: Operands, dkdv_blocks: dict) -> int:
    """The most key/value heads per launch (a divisor of them, so every launch compiles the same) whose
    workspace (ds_workspace) stays within configs.DS_WORKSPACE_BYTES, its rows within int32 (TMA
    coordinates); 0 where none does. Only with a dK/dV row marked DS (sm90: the TMA rows, and the dropout
    row through pointer loads; the path's H200 measurements in configs.py), for what attn_bwd_dq_ds reads
    (its TMA descriptors: _whole_16bit_tiles), not with segment ids (dK/dV skips the blocks outside a
    segment's range, whose workspace tiles dQ would then read unwritten). A window's workspace is banded
    (_ds_banded), so windows take the path at lengths whose whole rows would not fit; not with a dK/dV row of
    blocks over its 128-position groups (kernels/bwd.py ds_col)."""
    if (not dkdv_blocks.get("DS") or dkdv_blocks["SPLIT"] or not _whole_16bit_tiles(q)
            or extras.q_segment_ids is not None):
        return 0
    if _ds_banded(statics.band, q.shape[1]) and not _within_band_groups(dkdv_blocks):
        return 0
    b, sq, h, _ = q.shape
    sk, h_kv = k.shape[1], k.shape[2]
    for n in range(h_kv, 0, -1):
        ws_rows, ws_cols = ds_workspace(b, n * (h // h_kv), sq, sk, dkdv_blocks["BLOCK_N"], statics.band)
        if h_kv % n == 0 and ws_rows < 2 ** 31 and ws_rows * ws_cols * 2 <= configs.DS_WORKSPACE_BYTES:
            return n
    return 0


def backward(run: Run, target: str, q, k, v, out, lse2, dout, dlse, extras: Operands = Operands(), *,
             statics: Statics, rows=None):
    """(dq, dk, dv) for cotangents dout (like out) and dlse (of the natural lse); lse2 as forward returns it."""
    dkdv = _dkdv_config(target, q, k, statics, extras, rows)
    heads = _ds_heads(q, k, statics, extras, dkdv[0])
    if not heads:
        return _backward_7(run, target, q, k, v, out, lse2, dout, dlse, extras, statics, rows, dkdv)
    h_kv, group = k.shape[2], q.shape[2] // k.shape[2]
    delta = _delta(out, dout, dlse)  # dK/dV runs first here
    parts = []
    for lo in range(0, h_kv, heads):  # by heads: each launch a whole attention of its heads, no partial sums
        qh, kh = slice(lo * group, (lo + heads) * group), slice(lo, lo + heads)
        inputs = (q[:, :, qh], k[:, :, kh], v[:, :, kh], lse2[:, qh], delta[:, qh], dout[:, :, qh])
        if parts:  # one group after another, so that one workspace is live at a time
            _, inputs = jax.lax.optimization_barrier((parts[-1], inputs))
        parts.append(_backward_ds(run, target, *inputs, extras.heads(lo, lo + heads, group), statics, rows, dkdv))
    if len(parts) == 1:
        return parts[0]
    return tuple(jnp.concatenate(g, axis=2) for g in zip(*parts))


def _delta(out, dout, dlse):
    """delta = rowsum(dO * O) - dlse, (batch, heads, seq_q), by XLA (one fused pass; cuDNN's backward makes the same),
    where the kernel that reads it first does not compute it (attn_bwd_dq does)."""
    return jnp.einsum("bshd,bshd->bhs", out, dout, preferred_element_type=jnp.float32) - dlse


def ds_scale(statics: Statics) -> np.float32:
    """attn_bwd_dq_ds's scale: sm_scale, times keep_scale under dropout (the workspace holds dS / keep_scale:
    kernels/dropout.py dropped_ds)."""
    return np.float32(statics.scale * rules.dropout_keep_scale(statics.dropout_p))


def _backward_ds(run, target, q, k, v, lse2, delta, dout, extras, statics, rows, dkdv):
    """The dS path (kernels/bwd.py): dK/dV also writes dS^T, attn_bwd_dq_ds reads it for dQ."""
    b, sq, h, d = q.shape
    scalars, constexprs = _common(q, k, statics)
    dq_blocks, dq_options = pick_config(target, "dqds", d, q.dtype, rows, _kind(q, k, statics))
    band = _ds_band(statics.band, sq, True)
    if band and not _within_band_groups(dq_blocks):
        raise ValueError(f"a dQ row with blocks over configs.DS_BAND_BLOCK ({bwd.DS_BAND_BLOCK.value}) cannot read "
                         f"a banded dS workspace (kernels/bwd.py ds_col): {dq_blocks}")
    dk, dv, ds = _dkdv(run, target, q, k, v, dout, lse2, delta, extras, statics, dkdv, ds=True)
    (dq,) = run(_launch(
        bwd.attn_bwd_dq_ds, grid=(_cdiv(sq, dq_blocks["BLOCK_M"]), b * h),
        inputs=dict(K=k, dS=ds, sm_scale=ds_scale(statics),
                    **{n: scalars[n] for n in ("seq_q", "seq_k", "lo_off", "hi_off")}),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype),),
        constexprs=dict(H=h, KV_H=k.shape[2], HEAD_DIM=d, BANDED=constexprs["BANDED"], DS_BLOCK_N=dkdv[0]["BLOCK_N"],
                        **dq_blocks, **band),
        options=dq_options, extras=extras,
    ))
    return dq, dk, dv


def _backward_7(run, target, q, k, v, out, lse2, dout, dlse, extras, statics, rows, dkdv):
    """Seven products per tile: dQ (which also writes delta; the Gluon dQ reads it), then dK/dV."""
    b, sq, h, d = q.shape
    scalars, constexprs = _common(q, k, statics)
    gluon = gluon_dq(target, q, k, statics, extras, rows)
    if gluon is not None:
        from jax_flash_amd.kernels import bwd_sm90  # Gluon: imported only where it runs

        delta = _delta(out, dout, dlse)
        inputs, gluon_constexprs = _gluon_args(q, k, statics, gluon)
        (dq,) = run(_launch(
            bwd_sm90.attn_bwd_dq_sm90, grid=(_cdiv(sq, 2 * bwd_sm90.ROWS.value), b * h),
            inputs=dict(Q=q, K=k, V=v, dOut=dout, Lse=lse2, Delta=delta, **inputs),
            out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype),),
            constexprs={**gluon_constexprs, "KEYS_EVEN": k.shape[1] % gluon["BLOCK_N"] == 0},
            options={"num_warps": gluon["num_warps"]}, extras=extras))
        dk, dv, _ = _dkdv(run, target, q, k, v, dout, lse2, delta, extras, statics, dkdv)
        return dq, dk, dv
    # dQ first: it writes delta (b, h, seq_q), which the dK/dV kernel reads
    blocks, options = pick_config(target, "dq", d, q.dtype, rows, _kind(q, k, statics),
                                  tma=_takes_tma(q, statics, extras))
    dq, delta = run(_launch(
        bwd.attn_bwd_dq, grid=(_cdiv(sq, blocks["BLOCK_M"]), b * h),
        inputs=dict(Q=q, K=k, V=v, KeyRanges=_ranges(extras, True, blocks["BLOCK_M"]), Out=out, dOut=dout,
                    dLse=dlse, Lse=lse2, **scalars),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
        constexprs={**constexprs, **blocks},
        options=options, extras=extras,
    ))
    dk, dv, _ = _dkdv(run, target, q, k, v, dout, lse2, delta, extras, statics, dkdv)
    return dq, dk, dv
