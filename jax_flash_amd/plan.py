"""The one place that decides what a call runs: which kernels, with which config rows (kernels/configs.py), on
which grids, with which flags, and how much workspace they allocate, each with a one-line reason.

    call = Call.of("sm90", q, k, extras, statics)      # or Call(...) from shapes alone
    plan_forward(call), plan_backward(call)             # -> Plan: ordered Steps
    plan_decode(DecodeCall(...))                        # the KV cache's

A Plan is data: jax_flash_amd/_launch.py turns it into kernel launches, jax_flash_amd.explain prints it,
autotuning tunes the Triton rows it names, tests assert it. Every path rule lives here, written once; each
role (fwd, dkdv, dq, dqds, decode) has one ordered table of candidates, first match wins: Gluon rows, then
the target's Triton rows (TMA rows in front of the pointer rows of their width).

`Policy` holds what a caller may override: the row tables, the rule numbers (configs.Limits), forced rows
(autotuning, sweeps, tests), and the machine's facts (compute units, whether launches use the compiled warp
count). `using(policy)` makes calls traced inside it plan with it.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import heapq
import math
from typing import Any

import numpy as np

from jax_flash_amd import rules
from jax_flash_amd.kernels import configs
from jax_flash_amd.kernels.configs import DecodeRow, GluonRow, Row
from jax_flash_amd.rules import Band

FP8_TYPES = ("float8_e4m3fn", "float8_e4m3fnuz")
AMD_TARGETS = ("gfx90a", "gfx942", "gfx950")
GLUON_ROWS = 64  # rows per consumer group of the Gluon kernels (fwd_sm90.ROWS): a tile is two groups


# ----- what a call is -----

@dataclasses.dataclass(frozen=True)
class Policy:
    """What a caller may override (all hashable: a call's static options carry it). rows: {table: Row}
    forced for this call's Triton roles ("fwd", "dkdv", "dq", "dqds", "keys_last", "decode", ...); a forced
    row replaces the table's choice and turns the Gluon kernel of its role off. compute_units / compiled_warps
    None: the machine's."""
    limits: configs.Limits = configs.LIMITS
    gluon_fwd: tuple[GluonRow, ...] = configs.SM90_GLUON_FWD
    gluon_fwd_fp8: tuple[GluonRow, ...] = configs.SM90_GLUON_FWD_FP8
    gluon_dkdv: tuple[GluonRow, ...] = configs.SM90_GLUON_DKDV
    gluon_dkdvdq: tuple[GluonRow, ...] = configs.SM90_GLUON_DKDVDQ
    rows: tuple[tuple[str, Any], ...] = ()
    compute_units: int | None = None
    compiled_warps: bool | None = None
    linear_backward: bool = False  # the backward in one pass, dQ summed in float32 (plan_backward; slower, not default)
    # a dense bias / mask through the Gluon forward and dK/dV (tiled grids, no softcap, 16-bit); False: Triton's rows
    gluon_dense: bool = True
    # their tiles of a dense bias / mask through shared buffers copied in 16-byte pieces (16-bit, whole blocks), or
    # as a vector along one axis (fwd_sm90.dense_reads); False: each element in the product's layout
    gluon_dense_tiles: bool = True
    # their tiled grids batch-fastest where a dense operand is shared by the batch (masking.batch_inner: its tiles
    # from L2 after the first read); not default until a GPU run passes
    dense_batch_inner: bool = False
    # grouped heads' dS path with dK/dV per query head (K and V repeated), the parts summed over each group: a
    # launch's programs number key blocks x query heads; None: where per_query_head's rule takes it
    dkdv_per_query_head: bool | None = None

    def replace(self, **change) -> Policy:
        """A copy with fields changed; limits may be given as their own fields (narrow_window=0, ...)."""
        limit_names = {f.name for f in dataclasses.fields(configs.Limits)}
        limits = {k: change.pop(k) for k in list(change) if k in limit_names}
        if "rows" in change and isinstance(change["rows"], dict):
            change["rows"] = tuple(sorted(change["rows"].items()))
        for name in ("gluon_fwd", "gluon_fwd_fp8", "gluon_dkdv"):  # hashable: a call's static options carry it
            if name in change:
                change[name] = tuple(change[name])
        return dataclasses.replace(self, limits=dataclasses.replace(self.limits, **limits), **change)

    def row(self, table: str):
        return dict(self.rows).get(table)


DEFAULT = Policy()
_ACTIVE: contextvars.ContextVar[Policy | None] = contextvars.ContextVar("jax_flash_amd_policy", default=None)


@contextlib.contextmanager
def using(policy: Policy):
    """Calls traced inside plan with `policy` (tests and sweeps: forced rows, other rule numbers)."""
    token = _ACTIVE.set(policy)
    try:
        yield policy
    finally:
        _ACTIVE.reset(token)


def active() -> Policy:
    """The policy calls traced now plan with."""
    return _ACTIVE.get() or DEFAULT


@dataclasses.dataclass(frozen=True)
class Call:
    """Everything about an attention call that decides its plan: shapes, input dtype (a NumPy dtype name),
    the band (rules.Band), softcap, dropout, which optional operands are present (operands.Operands field
    names), the target (a configs.TARGETS key), the machine's facts and the policy."""
    target: str
    batch: int
    seq_q: int
    seq_k: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    band: Band = Band()
    softcap: float = 0.0
    dropout_p: float = 0.0
    operands: frozenset = frozenset()
    compute_units: int = 132
    compiled_warps: bool = True  # launches use the compiled warp count (warp specialisation, Gluon)
    interpreted: bool = False  # the kernels were built for Triton's interpreter
    policy: Policy = DEFAULT
    bias_shape: tuple[int, ...] = ()  # a dense bias's (batch | 1, heads | 1, seq_q | 1, seq_k | 1)
    mask_shape: tuple[int, ...] = ()  # a dense mask's, the same
    deterministic: bool = True  # False: the backward may sum in an order that varies (atomics)

    @classmethod
    def of(cls, target: str, q, k, extras=None, statics=None, policy: Policy | None = None, here: bool = True
           ) -> Call:
        """The call of arrays (or ShapeDtypeStructs) q (batch, seq_q, heads, head_dim), k (batch, seq_k,
        kv_heads, head_dim), optional operands `extras` (operands.Operands) and `statics` (_launch.Statics:
        scale, band, softcap, dropout_p) on `target`, with this machine's facts (here), else the target's
        nominal ones (configs.DECODE_SPLITS' compute units, launches of the compiled warp count)."""
        policy = policy or active()
        b, sq, h, d = q.shape
        if here:
            units, warps, interp = compute_units(target), _compiled_warps(), target == "interpret" or interpreted()
        else:
            units, warps, interp = configs.DECODE_SPLITS[target]["cus"], True, target == "interpret"
        return cls(target, b, sq, k.shape[1], h, k.shape[2], d, np.dtype(q.dtype).name,
                   statics.band if statics else Band(), float(statics.softcap) if statics else 0.0,
                   float(statics.dropout_p) if statics else 0.0,
                   frozenset(extras.present()) if extras is not None else frozenset(),
                   compute_units=policy.compute_units or units,
                   compiled_warps=policy.compiled_warps if policy.compiled_warps is not None else warps,
                   interpreted=interp, policy=policy,
                   bias_shape=tuple(extras.bias.shape) if extras is not None and extras.bias is not None else (),
                   mask_shape=tuple(extras.mask.shape) if extras is not None and extras.mask is not None else (),
                   deterministic=statics.deterministic if statics else True)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def fp8(self) -> bool:
        return self.dtype in FP8_TYPES

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize if not self.fp8 else 1

    @property
    def limits(self) -> configs.Limits:
        return self.policy.limits

    @property
    def block_d(self) -> int:
        return block_d(self.head_dim, self.dtype)

    @property
    def width(self) -> int:
        """The head width a row must cover: float32 tiles count double (twice the registers); fp8 as 16-bit."""
        return self.block_d * max(2, self.itemsize) // 2

    @property
    def narrow(self) -> bool:
        """A window bounded on both sides, at most limits.narrow_window keys wide (short loops)."""
        return self.band.narrow(self.limits.narrow_window)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The "+<kind>" tables the call may take, first present wins: fp8 alone, else those of dense (a bias or
        mask varying along queries and keys: a tile of it per block, more registers), window (narrow), dropout
        and gqa that hold."""
        if self.fp8:
            return ("fp8",)
        tiles = any(len(shape) == 4 and shape[2] > 1 and shape[3] > 1 for shape in (self.bias_shape, self.mask_shape))
        held = (("dense", tiles), ("window", self.narrow), ("dropout", self.dropout_p > 0), ("gqa", self.group > 1))
        return tuple(name for name, holds in held if holds)

    @property
    def kind(self) -> str:
        """The call's first kind ("" if none): its autotuning key's."""
        return self.kinds[0] if self.kinds else ""

    def has(self, *operands: str) -> bool:
        return any(name in self.operands for name in operands)

    @property
    def segments(self) -> bool:
        return self.has("q_segment_ids", "kv_segment_ids")

    @property
    def dense(self) -> bool:
        """A dense mask or bias (read tile by tile by the Triton pointer kernels)."""
        return self.has("bias", "mask")

    def heads_slice(self, kv_heads: int) -> Call:
        """The call of `kv_heads` of its key/value heads (and their query heads): a launch by head groups."""
        return dataclasses.replace(self, heads=kv_heads * self.group, kv_heads=kv_heads)

    def per_query_head(self) -> Call:
        """The call with K and V repeated for each query head (one key/value head per query head)."""
        return dataclasses.replace(self, kv_heads=self.heads)


def block_d(head_dim: int, dtype="bfloat16") -> int:
    """Head dim padded to a power of two >= tl.dot's smallest reduction (16; 32 for fp8), masked, never stored."""
    return max(32 if np.dtype(dtype).name in FP8_TYPES else 16, 1 << (head_dim - 1).bit_length())


def compute_units(target: str) -> int:
    """SMs / CUs of the default GPU (as the device reports them), else configs.DECODE_SPLITS' number."""
    if target != "interpret":
        import jax

        count = getattr(jax.devices()[0], "core_count", None)
        if isinstance(count, int) and count > 0:
            return count
    return configs.DECODE_SPLITS[target]["cus"]


def _compiled_warps() -> bool:
    from jax_flash_amd import _jax_triton_compat

    return _jax_triton_compat.launches_compiled_warps()


def interpreted() -> bool:
    """Whether the kernels were built for Triton's interpreter (TRITON_INTERPRET=1 when triton was first
    imported): the interpret implementation needs it, the triton one needs it not, Gluon cannot run there."""
    from triton.runtime.interpreter import InterpretedFunction

    from jax_flash_amd.kernels import fwd

    return isinstance(fwd.attn_fwd, InterpretedFunction)


# ----- what a plan is -----

@dataclasses.dataclass(frozen=True)
class Step:
    """One kernel launch (or XLA op) of a plan. constexprs: the kernel's compile-time flags the plan sets (the
    optional operands' presence flags are added at launch); grid: its programs; workspace: bytes it allocates
    beyond the call's inputs and outputs."""
    role: str  # keys_last, fwd, fwd_edges, delta, dq, dkdv, dkdv_edges, dqds, kv_append, decode, combine
    kernel: str  # the kernel's function name (kernels/*.py), or "xla"
    row: Row | GluonRow | DecodeRow | None
    grid: tuple[int, ...]
    layout: str  # tiled, persistent, edges, xla
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    workspace: int
    reason: str
    buffer: tuple[int, ...] = ()  # the shape of the workspace array it writes for a later step (the dS path's)

    @property
    def flags(self) -> dict:
        return dict(self.constexprs)

    @property
    def compile_options(self) -> dict:
        return dict(self.options)


@dataclasses.dataclass(frozen=True)
class Plan:
    """An ordered tuple of steps. head_groups > 1 (the backward's dS path): the steps run once per group of
    key/value heads, each group a call of its heads alone (Call.heads_slice), so one workspace is live at a time.
    per_query_head: the steps are those of the call with K and V repeated per query head (Call.per_query_head);
    head_groups counts its heads; dK and dV are the sums of each group's parts."""
    call: Any
    direction: str  # forward, backward, decode
    steps: tuple[Step, ...]
    head_groups: int = 1
    per_query_head: bool = False

    def step(self, role: str) -> Step | None:
        return next((s for s in self.steps if s.role == role), None)

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(s.kernel for s in self.steps)

    @property
    def workspace(self) -> int:
        """Peak bytes of workspace (one head group's at a time)."""
        return sum(s.workspace for s in self.steps)

    def __str__(self) -> str:
        return render([self])


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What jax_flash_amd.explain returns: the implementation and target a call runs on, and its plans (None
    where it runs no kernels: implementation "xla", an empty call; the backward of fp8 inputs)."""
    implementation: str
    target: str | None
    forward: Plan | None
    backward: Plan | None

    def __str__(self) -> str:
        if self.implementation == "xla":
            return ("implementation 'xla': the pure-JAX reference, no kernels (memory O(batch x heads x seq_q x "
                    "seq_k))")
        plans = [p for p in (self.forward, self.backward) if p is not None]
        if not plans:
            return f"implementation {self.implementation!r} on {self.target}: nothing to compute (an empty call)"
        text = render(plans)
        return text if self.backward is not None or not self.forward.call.fp8 else text + "\n(fp8: forward only)"


_COMMON = frozenset({"H", "KV_H", "HEAD_DIM", "BLOCK_D", "BANDED", "SOFTCAP", "DROP_THRESHOLD", "P8_LOG2"})


def _mib(n: int) -> str:
    return "-" if not n else f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def render(plans: list[Plan]) -> str:
    """The plans as a table: step, kernel, row, grid, workspace, flags, why."""
    lines = []
    for p in plans:
        c = p.call
        head = (f"{p.direction} on {c.target}: batch {c.batch}, seq_q {c.seq_q}, seq_k {getattr(c, 'seq_k', '-')}, "
                f"heads {c.heads}/{c.kv_heads}, head_dim {c.head_dim}, {c.dtype}")
        if p.per_query_head:
            head += f"; dK/dV per query head, summed over groups of {c.group}"
        if p.head_groups > 1:
            kv = c.heads if p.per_query_head else c.kv_heads
            head += f"; {p.head_groups} launches by head groups of {kv // p.head_groups} kv heads"
        lines += [head, f"  workspace {_mib(p.workspace)}"]
        rows = [("step", "kernel", "row", "grid", "layout", "workspace", "flags", "why")]
        for s in p.steps:
            flags = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in s.constexprs
                             if k not in _COMMON and k not in ("BLOCK_M", "BLOCK_N"))
            rows.append((s.role, s.kernel, s.row.name if s.row is not None else "-", "x".join(map(str, s.grid)) or "-",
                         s.layout, _mib(s.workspace), flags or "-", s.reason))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    return "\n".join(lines)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _step(role: str, kernel: str, row, grid, layout: str, constexprs: dict, options: dict, reason: str,
          workspace: int = 0, buffer: tuple[int, ...] = ()) -> Step:
    return Step(role, kernel, row, tuple(int(g) for g in grid), layout, tuple(constexprs.items()),
                tuple(options.items()), int(workspace), reason, tuple(buffer))


# ----- the Triton rows: first match in the call's table -----

def _whole_16bit_tiles(call: Call) -> bool:
    """16-bit inputs with a power-of-two head: what TMA descriptors over whole head tiles need."""
    return call.itemsize == 2 and not call.fp8 and call.block_d == call.head_dim


def takes_tma(call: Call) -> bool:
    """Whether a call may take TMA rows (sm90): whole 16-bit head tiles, no segment ids (Triton 3.6's
    warp-specialisation pass fails on that loop) nor a dense mask or bias (the TMA loops read neither), not dropout
    in a narrow window (its pointer rows are faster)."""
    return (_whole_16bit_tiles(call) and not call.segments and not call.dense
            and not (call.dropout_p > 0 and call.narrow))


def dkdv_takes_tma(call: Call) -> bool:
    """takes_tma, with seq_q a multiple of 4 and batch * heads * seq_q below 2^31 (lse and delta by int32 row
    offsets), and no softcap (its tanh chain spills in the warp-specialised loop and that kernel returned
    non-finite dK on the H200)."""
    return (takes_tma(call) and call.softcap == 0 and call.seq_q % 4 == 0
            and call.batch * call.heads * call.seq_q < 2 ** 31)


def fits(row: Row | DecodeRow, width: int, dtype: str, banded_seq: int = 0) -> bool:
    """Whether a row serves a call of this width and input dtype; banded_seq: the longer length where a band
    bounds the call, else 0."""
    itemsize = np.dtype(dtype).itemsize
    return (getattr(row, "min_width", 0) <= width <= row.max_width and itemsize <= row.max_itemsize
            and (getattr(row, "max_banded_seq", None) is None or banded_seq <= row.max_banded_seq))


def table_name(call: Call, role: str) -> str:
    """The name of the call's table for a role: "<role>+<kind>" of its first kind the target has, else role."""
    tables = configs.TARGETS[call.target]
    return next((f"{role}+{kind}" for kind in call.kinds if f"{role}+{kind}" in tables), role)


def table(call: Call, role: str) -> tuple:
    """The call's table for a role (table_name)."""
    return configs.TARGETS[call.target][table_name(call, role)]


def pick(call: Call, role: str, tma: bool = True, banded_seq: int = 0, persistent: bool = True) -> Row:
    """The first row of the call's table for `role` that fits its width and dtype (and banded_seq), passing over
    TMA rows where the call cannot take them (tma=False) and persistent_only rows where it would run them tiled
    (persistent=False); a row forced by the policy instead, unless TMA where the call cannot take it."""
    forced = call.policy.row(role)
    if forced is not None and not (forced.tma and not tma):
        return forced
    for row in table(call, role):
        if (fits(row, call.width, call.dtype, banded_seq) and (tma or not row.tma)
                and (persistent or not row.persistent_only)):
            return row
    raise ValueError(f"no {role} config for head_dim={call.head_dim}, dtype={call.dtype} on {call.target}")


def _row_constexprs(call: Call, row: Row) -> dict:
    blocks = row.constexprs()
    if blocks.get("WARP_SPECIALIZE") and not call.compiled_warps:
        blocks["WARP_SPECIALIZE"] = False  # launched with the requested warps, it would run a third of them
    return blocks


def _common(call: Call) -> dict:
    """The constexprs every attention kernel takes."""
    return dict(H=call.heads, KV_H=call.kv_heads, HEAD_DIM=call.head_dim, BLOCK_D=call.block_d,
                BANDED=call.band.sides, SOFTCAP=call.softcap > 0,
                DROP_THRESHOLD=rules.dropout_threshold(call.dropout_p))


def _dense_flags(call: Call) -> dict:
    """The Gluon kernels' DENSE_TILES where the call has a dense operand and the policy asks for it, and BATCH_INNER
    where that operand is shared by a batch of more than one (Policy.dense_batch_inner)."""
    flags = {"DENSE_TILES": True} if call.dense and call.policy.gluon_dense_tiles else {}
    shared = any(shape and shape[0] == 1 for shape in (call.bias_shape, call.mask_shape))
    if call.policy.dense_batch_inner and shared and call.batch > 1:
        flags["BATCH_INNER"] = True
    return flags


def p8_log2(call: Call) -> int:
    """fp8 inputs: log2 of the factor P is scaled by before its rounding to fp8 (jax_flash_amd/fp8.py)."""
    return {"float8_e4m3fn": 8, "float8_e4m3fnuz": 7}.get(call.dtype, 0)


# ----- grids: persistent where balanced, the band's edges apart on long TMA loops -----

def persistent_programs(call: Call, block_m: int, block_n: int, per_cu: int, keys: bool = False,
                        group_programs: int | None = None) -> int:
    """Programs of a persistent grid (per_cu programs per compute unit; keys: a dK/dV grid over key blocks), or
    0 for one program per tile. Only calls of whole query and key blocks (one descriptor per tensor serves every
    tile), and only where the fixed schedule is about as balanced as the tiled grid's: its busiest program's
    work at most limits.persistent_balance times the tiled grid's finish (_tiled_finish), a tile's work the
    blocks of the other side it visits plus one. With a band other than a narrow window, also only up to
    limits.persistent_banded_blocks blocks per row. group_programs: the tiled grid's (the row's, else the kernels')."""
    sq, sk, band, limits = call.seq_q, call.seq_k, call.band, call.limits
    rows = call.batch * (call.kv_heads if keys else call.heads)
    if not per_cu or sq % block_m or sk % block_n:
        return 0
    n_blocks = (sk // block_n) if keys else (sq // block_m)
    if band.sides and not call.narrow and n_blocks > limits.persistent_banded_blocks:
        return 0
    programs = min(per_cu * call.compute_units, n_blocks * rows)
    lo_off, hi_off = band.offsets(sq, sk)
    if keys:  # queries [first * block_m, end) of each key block (masking.query_blocks), heaviest first
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
    tiled = _tiled_finish(cost, rows, programs, band.sides == 1, group_programs or configs.TILED_GROUP_PROGRAMS)
    return programs if work.max() <= limits.persistent_balance * tiled else 0


def _tiled_finish(row_costs, rows: int, slots: int, grouped: bool, group_programs: int) -> float:
    """When a grid of one program per tile would finish, in tile work: rows x row_costs (a row's tiles, heaviest
    first) handed to `slots` programs in launch order (tiled_order), each slot taking the next tile when free
    (the GPU's block scheduler). Beyond 2^16 tiles the last wave's tail is negligible: the mean."""
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
    row-major, or (`grouped`: a band bounded on the right only) rows in groups of about group_programs
    programs, block-major in each group."""
    per = max(group_programs // n_blocks, 1) if grouped else 1
    i, r = np.meshgrid(np.arange(n_blocks), np.arange(per), indexing="ij")
    return np.concatenate([np.stack([i.ravel(), first + r.ravel()], 1)[r.ravel() < rows - first]
                           for first in range(0, rows, per)])


def edges_apart(call: Call, row: Row, loop: int, block: int, whole: bool, ds: bool = False) -> bool:
    """Whether a TMA row's masked blocks at its band's edges run in a launch of their own (kernels/fwd.py,
    bwd.py EDGES; `loop` positions in blocks of `block` along the kernel's loop): where its one
    warp-specialised loop would mask every block (a band, or not `whole`) and the loop runs at least
    limits.edges_apart_blocks blocks (ds_edges_apart_blocks on the dS path), so that the mask saved outweighs
    the second launch and its float32 partial result. Not with dropout (the partial would carry keep_scale) nor
    SPLIT; TMA rows imply no fp8 or segment ids."""
    band = call.band
    if not row.tma or row.split or call.dropout_p > 0 or (not band.sides and whole):
        return False
    width = band.left + band.right + 1 if band.left >= 0 and band.right >= 0 else loop
    least = call.limits.ds_edges_apart_blocks if ds else call.limits.edges_apart_blocks
    return _cdiv(min(width, loop), block) >= least


def _edges_step(role: str, kernel: str, main: Step, grid: tuple[int, ...]) -> Step:
    """The EDGES == 2 launch after a TMA row's EDGES == 1 one: the same blocks through pointer loads."""
    row = configs.EDGE_ROWS[role.split("_")[0]]
    flags = {**main.flags, "TMA": False, "WARP_SPECIALIZE": False, "PERSISTENT": False, "EDGES": 2}
    return _step(role, kernel, row, grid, "edges", flags, row.options(),
                 "the band's masked edge blocks, added to the first launch's float32 partial")


# ----- the Gluon kernels (sm90) -----

def _gluon_takes(call: Call, role: str) -> str | None:
    """Why a call may not take a Gluon kernel for `role`, or None: sm90, compiled warps launched, not the
    interpreter, 16-bit inputs (the forward: fp8 too) with a power-of-two head, no segment ids or positions, no
    narrow window with dropout, no row forced for the role (autotuning and sweeps time the Triton rows), and a dense
    bias or mask only under Policy.gluon_dense."""
    if call.target != "sm90":
        return "not sm90"
    if call.policy.row(role) is not None:
        return f"a {role} row is forced"
    if call.narrow and call.dropout_p > 0:
        return "dropout in a narrow window"
    fp8_tiles = role == "fwd" and call.fp8 and call.block_d == call.head_dim
    if not (_whole_16bit_tiles(call) or fp8_tiles):
        return "not whole 16-bit (or fp8) head tiles"
    if call.segments or call.has("positions"):
        return "segment ids or positions"
    if call.dense and not call.policy.gluon_dense:
        return "a dense mask or bias (Policy.gluon_dense)"
    if call.dense and (call.softcap or call.fp8):
        return "a dense mask or bias with softcap or fp8"
    if not call.compiled_warps or call.interpreted:
        return "launches do not use the compiled warp count"
    return None


def gluon_programs(call: Call, row: GluonRow, keys: bool = False) -> int:
    """Programs of a Gluon kernel's persistent grid for a row with `persistent`, or 0 (tiled): the forward's
    tiles are 128 queries of batch * heads rows, the dK/dV's (keys) 128 keys of batch * kv_heads rows in steps
    of the row's block_m queries; persistent_programs' rule."""
    if not row.persistent:
        return 0
    block_m, block_n = (row.block_m, 2 * GLUON_ROWS) if keys else (2 * GLUON_ROWS, row.block_n)
    return persistent_programs(call, block_m, block_n, row.persistent, keys=keys)


def _gluon_row(call: Call, rows: tuple[GluonRow, ...], keys: bool = False) -> GluonRow | None:
    """The first row for the call's head dim whose min_seq both lengths reach, that takes the call's dropout,
    and, a row with `persistent`, where the call runs persistent (else the next row; a dense bias or mask takes
    the tiled grid)."""
    return next((row for row in rows
                 if row.head_dim == call.head_dim and min(call.seq_q, call.seq_k) >= row.min_seq
                 and (call.dropout_p == 0 or row.dropout)
                 and (not row.persistent or (not call.dense and gluon_programs(call, row, keys)))), None)


def gluon_forward_row(call: Call) -> GluonRow | None:
    """The Gluon forward's row (kernels/fwd_sm90.py) for this call, or None (the Triton forward); narrow
    windows only through rows that say `window`, 16-bit, without dropout, where they run persistent."""
    if _gluon_takes(call, "fwd") is not None:
        return None
    rows = call.policy.gluon_fwd_fp8 if call.fp8 else call.policy.gluon_fwd
    if call.narrow:
        rows = tuple(row for row in rows if row.window and row.persistent)
    return _gluon_row(call, rows)


def gluon_dkdv_row(call: Call) -> GluonRow | None:
    """The Gluon dK/dV's row (kernels/bwd_sm90.py) for this call, or None (the Triton rows): with lse's 1-D TMA
    tiles' int32 coordinates."""
    if _gluon_takes(call, "dkdv") is not None:
        return None
    if call.batch * call.heads * _cdiv(call.seq_q, 4) * 4 >= 2 ** 31:
        return None
    return _gluon_row(call, call.policy.gluon_dkdv, keys=True)


def gluon_dkdvdq_row(call: Call) -> GluonRow | None:
    """The Gluon linear backward's row (kernels/bwd_sm90.py attn_bwd_dkdvdq_sm90), or None (the pointer row), as
    gluon_dkdv_row; not with a dense bias or mask."""
    if gluon_dkdv_row(call) is None or call.dense:
        return None
    return _gluon_row(call, call.policy.gluon_dkdvdq, keys=True)


# ----- the forward -----

def _keys_last_step(call: Call, mma_order: bool) -> Step:
    row = call.policy.row("keys_last") or next(r for r in configs.TARGETS[call.target]["keys_last"]
                                               if fits(r, call.width, call.dtype))
    padded = _cdiv(call.seq_k, 16) * 16  # kernels/fwd.py keys_padded
    flags = dict(KV_H=call.kv_heads, HEAD_DIM=call.head_dim, BLOCK_D=call.block_d, MMA_ORDER=mma_order,
                 **row.constexprs())
    return _step("keys_last", "keys_last", row, (_cdiv(padded, row.block_n), call.batch * call.kv_heads), "tiled",
                 flags, row.options(), "fp8 inputs: the forward reads V^T (16-byte rows)",
                 workspace=call.batch * call.kv_heads * call.head_dim * padded)


def plan_forward(call: Call) -> Plan:
    """The forward's steps: fp8's V^T, then the Gluon forward, or a Triton row (persistent where balanced, the
    band's edges in a launch of their own on long TMA loops)."""
    steps = []
    gluon = gluon_forward_row(call)
    if gluon is not None:
        if call.fp8:
            steps.append(_keys_last_step(call, mma_order=True))
        programs = gluon_programs(call, gluon)
        flags = {k: v for k, v in _common(call).items() if k != "BLOCK_D"}
        flags.update(BLOCK_N=gluon.block_n, STAGES=gluon.stages, CONSUMER_REGS=gluon.consumer_regs,
                     KEYS_EVEN=call.seq_k % gluon.block_n == 0,
                     PINGPONG=gluon.pingpong and not call.band.sides,  # causal calls measured slower with it
                     P8_LOG2=p8_log2(call), **_dense_flags(call))
        if gluon.carry:
            flags["CARRY"] = int(gluon.carry)
        grid = (_cdiv(call.seq_q, 2 * GLUON_ROWS), call.batch * call.heads)
        if programs:
            grid, flags["N_ROWS"] = (programs, 1), call.batch * call.heads
        why = "Gluon forward (sm90), " + ("persistent: balanced, whole blocks" if programs else "tiled")
        steps.append(_step("fwd", "attn_fwd_sm90", gluon, grid, "persistent" if programs else "tiled", flags,
                           {"num_warps": gluon.num_warps}, why))
        return Plan(call, "forward", tuple(steps))
    tma = takes_tma(call)
    banded_seq = max(call.seq_q, call.seq_k) if call.band.sides else 0
    row = pick(call, "fwd", tma, banded_seq)
    programs = persistent_programs(call, row.block_m, row.block_n, row.persistent, group_programs=row.group_programs)
    tiles = call.batch * call.heads * _cdiv(call.seq_q, row.block_m)
    if not programs or programs >= tiles:  # rows that serve only calls they run persistent give way
        tiled = pick(call, "fwd", tma, banded_seq, persistent=False)
        if tiled != row:
            row = tiled
            programs = persistent_programs(call, row.block_m, row.block_n, row.persistent,
                                           group_programs=row.group_programs)
    if call.fp8:
        steps.append(_keys_last_step(call, mma_order=False))
    flags = {**_common(call), "P8_LOG2": p8_log2(call), **_row_constexprs(call, row)}
    if row.tma:  # the TMA loop goes unmasked when every key block is whole
        flags["KEYS_EVEN"] = call.seq_k % row.block_n == 0
    # not persistent: the float32 partial's staging takes that kernel's shared memory past an SM's
    edges = not programs and edges_apart(call, row, call.seq_k, row.block_n, flags.get("KEYS_EVEN", False))
    flags.update(PERSISTENT=programs > 0, EDGES=int(edges))
    grid = (programs, 1) if programs else (_cdiv(call.seq_q, row.block_m), call.batch * call.heads)
    why = _why_row(call, "fwd", row, tma, "Gluon: " + (_gluon_takes(call, "fwd") or "no row for this call"))
    if programs:
        why += "; persistent: balanced, whole blocks"
    partial = call.batch * call.seq_q * call.heads * call.head_dim * 4 if edges else 0
    steps.append(_step("fwd", "attn_fwd", row, grid, "persistent" if programs else "tiled", flags, row.options(),
                       why, workspace=partial))
    if edges:
        steps.append(_edges_step("fwd_edges", "attn_fwd", steps[-1], grid))
    return Plan(call, "forward", tuple(steps))


def _why_row(call: Call, role: str, row: Row, tma: bool, gluon: str) -> str:
    first = f"first row of {table_name(call, role)} for width {call.width}"
    parts = ["forced row" if call.policy.row(role) is row else first]
    if call.target == "sm90":
        parts.append(gluon)
        if not tma:
            parts.append("no TMA: " + _why_no_tma(call))
    return "; ".join(parts)


def _why_no_tma(call: Call) -> str:
    if not _whole_16bit_tiles(call):
        return "not whole 16-bit head tiles"
    if call.segments:
        return "segment ids"
    if call.dense:
        return "a dense mask or bias"
    return "dropout in a narrow window"


# ----- the backward -----

def dkdv_row(call: Call) -> Row | GluonRow:
    """The dK/dV kernel's row: the Gluon dK/dV's where it takes the call, else the first Triton row."""
    gluon = gluon_dkdv_row(call)
    return gluon if gluon is not None else pick(call, "dkdv", dkdv_takes_tma(call))


def ds_workspace(call: Call, block_n: int) -> tuple[int, int]:
    """(rows, cols) of the dS path's 16-bit workspace for the call's heads, as kernels/bwd.py ds_tiles lays it
    out: seq_k rounded up to the dK/dV row's block_n per (batch, head); seq_q rounded up to 8, or where the
    layout is banded (ds_banded) the columns a row's band needs."""
    rows = call.batch * call.heads * _cdiv(call.seq_k, block_n) * block_n
    return rows, (ds_band_cols(call.band) if ds_banded(call) else _cdiv(call.seq_q, 8) * 8)


def ds_band_cols(band: Band) -> int:
    """A banded workspace's columns (kernels/bwd.py ds_tiles with DS_BAND)."""
    return _cdiv(2 * configs.DS_BAND_BLOCK - 1 + band.left + band.right, 8) * 8


def ds_banded(call: Call) -> bool:
    """Whether the dS workspace takes the banded layout: a band bounded on both sides whose banded rows are
    narrower than seq_q's, so that a window's workspace grows with its width, not with seq_q."""
    band = call.band
    return band.left >= 0 and band.right >= 0 and ds_band_cols(band) < _cdiv(call.seq_q, 8) * 8


def _within_band_groups(row) -> bool:
    """Whether a row's blocks fit the banded workspace's groups of DS_BAND_BLOCK positions (kernels/bwd.py ds_col)."""
    return max(row.block_m, _block_n(row)) <= configs.DS_BAND_BLOCK


def _block_n(row) -> int:
    return 2 * GLUON_ROWS if isinstance(row, GluonRow) else row.block_n


def ds_heads(call: Call, row=None) -> int:
    """Key/value heads per launch of the dS path (a divisor of them, so every launch compiles the same) whose
    workspace stays within limits.ds_workspace_bytes and whose rows within int32 (TMA coordinates); 0 for the
    seven-product path. Only with a dK/dV row marked ds (not SPLIT), for whole 16-bit head tiles (attn_bwd_dq_ds's
    descriptors), without segment ids (dK/dV skips blocks outside a segment, whose dS tiles dQ would read
    unwritten); a banded workspace only with rows within its groups."""
    row = row if row is not None else dkdv_row(call)
    if not row.ds or getattr(row, "split", False) or not _whole_16bit_tiles(call) or call.segments:
        return 0
    if ds_banded(call) and not _within_band_groups(row):
        return 0
    for n in range(call.kv_heads, 0, -1):
        ws_rows, ws_cols = ds_workspace(call.heads_slice(n), _block_n(row))
        if call.kv_heads % n == 0 and ws_rows < 2 ** 31 and ws_rows * ws_cols * 2 <= call.limits.ds_workspace_bytes:
            return n
    return 0


def per_query_head(call: Call) -> bool:
    """Whether a grouped call's backward runs the dS path with dK/dV per query head (Policy.dkdv_per_query_head, None:
    this rule). The rule: a band bounded on the right (causal) whose own dS path launches fewer dK/dV programs than
    the GPU has compute units (a key block of each of a launch's key/value heads, the first the heaviest: the launch
    lasts as long as they do). Not where the call itself takes seven products (one query head's workspace would
    fit: the dS path in the workspace's memory). H100, llama3.1 shapes (64 / 8 heads), causal backward ms, default /
    per query head: N 2048 0.633 / 0.584, 4096 (256 programs) 1.738 / 1.850, 8192 9.185 / 6.330, 16384 (seven
    products) 25.16 / 23.32 (docs/tuning.md)."""
    if call.group == 1:
        return False
    if call.policy.dkdv_per_query_head is not None:
        return call.policy.dkdv_per_query_head
    row = dkdv_row(call)
    heads = ds_heads(call, row)
    if not heads or call.band.right < 0:
        return False
    return math.prod(_dkdv_step(call.heads_slice(heads), row, True)[0].grid) < call.compute_units


def _ds_why(call: Call, row) -> str:
    if not row.ds:
        return "seven products: the dK/dV row has no dS path"
    if not _whole_16bit_tiles(call):
        return "seven products: not whole 16-bit head tiles"
    if call.segments:
        return "seven products: segment ids"
    return "seven products: no dS workspace fits limits.ds_workspace_bytes"


def _dkdv_step(call: Call, row, ds: bool) -> list[Step]:
    """The dK/dV launch (and its edge launch) of `row` for `call` (a head group's on the dS path)."""
    buffer = ds_workspace(call, _block_n(row)) if ds else ()
    workspace = buffer[0] * buffer[1] * 2 if ds else 0
    ds_band = {"DS_BAND": True} if ds and ds_banded(call) else {}
    if isinstance(row, GluonRow):
        programs = gluon_programs(call, row, keys=True)
        flags = {k: v for k, v in _common(call).items() if k != "BLOCK_D"}
        # SPANS for narrow windows only: their groups skip ~1 of 18 steps, a causal call's only the diagonal's
        flags.update(BLOCK_M=row.block_m, STAGES=row.stages, CONSUMER_REGS=row.consumer_regs,
                     SPANS=row.spans and call.narrow, DS=ds,
                     EVEN=call.seq_q % row.block_m == 0 and call.seq_k % (2 * GLUON_ROWS) == 0, **ds_band,
                     **_dense_flags(call))
        grid = (_cdiv(call.seq_k, 2 * GLUON_ROWS), call.batch * call.kv_heads)
        if programs:
            grid, flags["N_ROWS"] = (programs, 1), call.batch * call.kv_heads
        why = "Gluon dK/dV (sm90)" + ("; persistent: balanced, whole blocks" if programs else "")
        return [_step("dkdv", "attn_bwd_dkdv_sm90", row, grid, "persistent" if programs else "tiled", flags,
                      {"num_warps": row.num_warps}, why, workspace, buffer)]
    flags = {**_common(call), **_row_constexprs(call, row)}
    flags.setdefault("SPLIT", False)
    if row.tma:  # the TMA loop goes unmasked when every block is whole
        flags["QUERIES_EVEN"] = call.seq_q % row.block_m == 0 and call.seq_k % row.block_n == 0
    n_blocks = _cdiv(call.seq_k, row.block_n)
    # not while storing dS: persistent, that returned NaN on the H200 (Triton 3.6)
    programs = (persistent_programs(call, row.block_m, row.block_n, row.persistent, True, row.group_programs)
                if row.tma and not row.split and not ds else 0)
    persistent = 0 < programs < n_blocks * call.batch * call.kv_heads
    edges = edges_apart(call, row, call.seq_q, row.block_m, flags.get("QUERIES_EVEN", False), ds)
    flags.update(DS=ds, PERSISTENT=persistent, EDGES=int(edges), **ds_band)
    grid = (programs, 1, 1) if persistent else (n_blocks, call.batch * call.kv_heads, 2 if row.split else 1)
    why = _why_row(call, "dkdv", row, row.tma, "Gluon: " + (_gluon_takes(call, "dkdv") or "no row for this call"))
    partial = 2 * call.batch * call.seq_k * call.kv_heads * call.head_dim * 4 if edges else 0
    steps = [_step("dkdv", "attn_bwd_dkdv", row, grid, "persistent" if persistent else "tiled", flags,
                   row.options(), why, workspace + partial, buffer)]
    if edges:
        steps.append(_edges_step("dkdv_edges", "attn_bwd_dkdv", steps[-1], (n_blocks, call.batch * call.kv_heads, 1)))
    return steps


def _linear_steps(call: Call) -> tuple[Step, ...]:
    """The linear backward (Policy.linear_backward): one pass over the dK/dV pointer row's tiles, five products per
    tile, each tile's dS K added to a float32 buffer of Q's size; in key-block order through a lock per query
    block (deterministic) or by atomics. A SPLIT row's dV runs in a launch of its own."""
    mode = 2 if call.deterministic else 1
    order = "in key-block order (deterministic)" if mode == 2 else "by atomics (deterministic=False)"
    why = f"linear backward (Policy.linear_backward): dS K summed into float32 {order}"
    delta = _step("delta", "xla", None, (), "xla", {}, {}, "delta = rowsum(dO * O) - dlse, one fused XLA pass",
                  call.batch * call.heads * call.seq_q * 4)
    dq = _step("dq", "xla", None, (), "xla", {}, {}, "dQ = scale x the float32 sum, cast (XLA)")
    acc = call.batch * call.seq_q * call.heads * call.head_dim * 4
    grow = gluon_dkdvdq_row(call)
    if grow is not None:
        flags = {k: v for k, v in _common(call).items() if k != "BLOCK_D"}
        flags.update(BLOCK_M=grow.block_m, STAGES=grow.stages, CONSUMER_REGS=grow.consumer_regs, DQ=mode,
                     EVEN=call.seq_q % grow.block_m == 0 and call.seq_k % (2 * GLUON_ROWS) == 0)
        locks = call.batch * call.heads * _cdiv(call.seq_q, grow.block_m) * 2 * 4 if mode == 2 else 0
        return (delta, _step("dkdv", "attn_bwd_dkdvdq_sm90", grow,
                             (_cdiv(call.seq_k, 2 * GLUON_ROWS), call.batch * call.kv_heads), "tiled", flags,
                             {"num_warps": grow.num_warps}, f"Gluon {why}; each group adds half of dQ's columns",
                             acc + locks), dq)
    # its own rows where the target has them (a float32 dQ tile more than dK/dV's: AMD's spill), else dK/dV's
    row = pick(call, "dkdvdq" if "dkdvdq" in configs.TARGETS[call.target] else "dkdv", tma=False)
    grid = (_cdiv(call.seq_k, row.block_n), call.batch * call.kv_heads)
    flags = {**_common(call), "BLOCK_M": row.block_m, "BLOCK_N": row.block_n, "DQ": mode}
    locks = call.batch * call.heads * _cdiv(call.seq_q, row.block_m) * 4 if mode == 2 else 0
    steps = [delta, _step("dkdv", "attn_bwd_dkdv_dq", row, grid, "tiled", {**flags, "DV": not row.split},
                          row.options(), why, acc + locks)]
    if row.split:
        steps.append(_step("dv", "attn_bwd_dkdv_dq", row, grid, "tiled", {**flags, "DQ": 0, "DK": False},
                           row.options(), "SPLIT row: dV in programs of its own"))
    return (*steps, dq)


def plan_backward(call: Call) -> Plan:
    """The backward's steps. The linear backward where the policy asks for it; the dS path where the dK/dV row has
    it and a workspace fits (dK/dV also stores dS^T, dQ is one product from it), by groups of heads; else seven
    products per tile (dQ, which also writes delta, then dK/dV)."""
    if call.fp8:
        raise TypeError("float8 attention is forward-only (inference): it has no backward plan")
    # AMD: not the ordered sum: Triton's barrier there does not wait for the other waves' dQ stores before the
    # lock is passed on (no s_waitcnt vmcnt(0) before its s_barrier; docs/tuning.md, the linear backward)
    if call.policy.linear_backward and not (call.deterministic and call.target in AMD_TARGETS):
        return Plan(call, "backward", _linear_steps(call) + _dbias_steps(call))
    if per_query_head(call):
        whole = call.per_query_head()
        if ds_heads(whole):
            p = plan_backward(whole)
            repeated = 2 * call.batch * call.seq_k * call.heads * call.head_dim * call.itemsize
            parts = _step("dkdvsum", "xla", None, (), "xla", {}, {}, f"dK, dV: each group's {call.group} query heads' "
                          "parts summed in float32, cast (XLA); K and V repeated per query head before", 2 * repeated)
            # the bias's gradient as the call's own (its kernel reads the K and V given, not the repeated ones)
            steps = tuple(s for s in p.steps if s.role != "dbias")
            return dataclasses.replace(p, call=call, steps=(*steps, parts, *_dbias_steps(call)), per_query_head=True)
    row = dkdv_row(call)
    heads = ds_heads(call, row)
    delta = call.batch * call.heads * call.seq_q * 4
    if heads:
        group = call.heads_slice(heads)
        dq = pick(call, "dqds")
        if ds_banded(group) and not _within_band_groups(dq):
            raise ValueError(f"a dQ row with blocks over configs.DS_BAND_BLOCK ({configs.DS_BAND_BLOCK}) cannot read a "
                             f"banded dS workspace (kernels/bwd.py ds_col): {dq}")
        flags = dict(H=group.heads, KV_H=group.kv_heads, HEAD_DIM=call.head_dim, BANDED=call.band.sides,
                     DS_BLOCK_N=_block_n(row), **dq.constexprs())
        if ds_banded(group):
            flags["DS_BAND"] = True
        steps = [_step("delta", "xla", None, (), "xla", {}, {}, "delta = rowsum(dO * O) - dlse, one fused XLA pass",
                       delta),
                 *_dkdv_step(group, row, ds=True),
                 _step("dqds", "attn_bwd_dq_ds", dq, (_cdiv(call.seq_q, dq.block_m), group.batch * group.heads),
                       "tiled", flags, dq.options(), "dS path: dQ = scale dS K, one product per tile")]
        how = "dS path" + (f", {call.kv_heads // heads} head groups" if heads < call.kv_heads else "")
        steps[1] = dataclasses.replace(steps[1], reason=f"{how}; {steps[1].reason}")
        return Plan(call, "backward", tuple(steps) + _dbias_steps(call), head_groups=call.kv_heads // heads)
    dq = pick(call, "dq", takes_tma(call))
    dq_step = _step("dq", "attn_bwd_dq", dq, (_cdiv(call.seq_q, dq.block_m), call.batch * call.heads), "tiled",
                    {**_common(call), **_row_constexprs(call, dq)}, dq.options(),
                    f"{_ds_why(call, row)}; dQ writes delta", delta)
    return Plan(call, "backward", (dq_step, *_dkdv_step(call, row, ds=False)) + _dbias_steps(call))


def _dbias_steps(call: Call) -> tuple[Step, ...]:
    """The bias's gradient (kernels/bwd.py attn_bwd_dbias, on the dQ row's tiles, pointer loads): one program per
    tile of the bias, each summing over the axes the bias broadcasts along. Without a bias, none."""
    if not call.bias_shape:
        return ()
    row = pick(call, "dq", tma=False)
    b, h, t, s = call.bias_shape
    grid = (_cdiv(call.seq_q, row.block_m) if t > 1 else 1, _cdiv(call.seq_k, row.block_n) if s > 1 else 1, b * h)
    flags = {**_common(call), "BLOCK_M": row.block_m, "BLOCK_N": row.block_n}
    return (_step("dbias", "attn_bwd_dbias", row, grid, "tiled", flags, row.options(),
                  "the bias's gradient, summed over the axes it broadcasts along (S and dP recomputed per tile)"),)


# ----- the KV cache -----

@dataclasses.dataclass(frozen=True)
class DecodeCall:
    """A KV-cache call: q (batch, seq_q, heads, head_dim), a cache of kv_heads (capacity keys per row; paged:
    pages of page_size), seq_new appended positions, cache dtype, num_splits asked (0: the rule's)."""
    target: str
    batch: int
    seq_q: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    capacity: int
    band: Band = Band()  # against each row's own length (kvcache.py)
    softcap: float = 0.0
    page_size: int = 0  # 0: contiguous
    seq_new: int = 0
    cache_dtype: str = ""
    num_splits: int = 0
    compute_units: int = 132
    policy: Policy = DEFAULT
    leftpad: bool = False  # rows start at a first key of their own (cache_leftpad): the decode kernel's LEFTPAD

    @property
    def paged(self) -> bool:
        return self.page_size > 0


MIN_PAGE = 16  # the decode kernels' smallest key block (tl.dot's minimum): pages a multiple of it


def check_page_size(page_size: int) -> None:
    """The page sizes a paged KV cache may have, one rule for every implementation (the pure-JAX reference could
    take any, but then a program would run on the CPU and fail on the GPU): multiples of MIN_PAGE, since a key
    block of the kernels lies within one page."""
    if page_size % MIN_PAGE:
        raise ValueError(f"page_size (k_cache.shape[1] of a paged cache) must be a multiple of {MIN_PAGE} (the decode "
                         f"kernels' smallest key block, which lies within one page); got {page_size}")


def decode_splits(target: str, programs: int, keys: int, block_n: int, cus: int) -> int:
    """The split-KV rule (configs.DECODE_SPLITS[target] is its data): enough programs to fill the compute units
    programs_per_cu times over, given `programs` (batch x heads_kv x row blocks) before splitting; each split at
    least min_blocks_per_split key blocks of the `keys` a row can hold; at most max_splits; at least 1."""
    rule = configs.DECODE_SPLITS[target]
    fill = cus * rule["programs_per_cu"] // max(programs, 1)
    most = -(-keys // block_n) // rule["min_blocks_per_split"]
    return max(1, min(rule["max_splits"], fill, most))


def _decode_row(call: DecodeCall, table_name: str) -> DecodeRow:
    forced = call.policy.row(table_name.split("+")[0])
    if forced is not None:
        return forced
    tables = configs.TARGETS[call.target]
    rows = tables.get(table_name, tables[table_name.split("+")[0]])
    width = block_d(call.head_dim, call.dtype) * max(2, np.dtype(call.dtype).itemsize) // 2
    row = next((r for r in rows if fits(r, width, call.dtype)), None)
    if row is None:
        raise ValueError(f"no {table_name} config for head_dim={call.head_dim}, dtype={call.dtype} on {call.target}")
    return row


def plan_decode(call: DecodeCall) -> Plan:
    """The KV cache's steps: kv_append (new keys written in place), the split-KV attn_decode (block_m packed
    query rows: the group's heads x positions), attn_decode_combine where the keys were split."""
    if call.paged:
        check_page_size(call.page_size)
    bd = block_d(call.head_dim, call.dtype)
    common = dict(KV_H=call.kv_heads, HEAD_DIM=call.head_dim, BLOCK_D=bd, PAGE=call.page_size or 1,
                  PAGED=call.paged)
    steps = []
    if call.seq_new > 0:
        row = _decode_row(call, "kv_append")
        steps.append(_step("kv_append", "kv_append", row, (_cdiv(call.seq_new, row.block_n),
                                                          call.batch * call.kv_heads), "tiled",
                           {**common, "BLOCK_N": row.block_n}, row.options(), "new keys and values written in place"))
    row = _decode_row(call, "decode+paged" if call.paged else "decode")
    group = call.heads // call.kv_heads
    block_m = min(row.block_m, max(16, 1 << max(0, call.seq_q * group - 1).bit_length()))
    block_n = row.block_n
    if call.paged:  # a key block lies within one page
        block_n = min(block_n, call.page_size & -call.page_size)
    row_blocks = _cdiv(call.seq_q * group, block_m)
    programs = call.batch * call.kv_heads * row_blocks
    splits = call.num_splits or decode_splits(call.target, programs, call.capacity, block_n, call.compute_units)
    why = f"{row_blocks} row blocks of {block_m} packed (position, head) rows; {splits} key splits" + (
        " (asked)" if call.num_splits else " (split-KV rule)")
    partial = splits * call.batch * call.seq_q * call.heads * (call.head_dim + 1) * 4 if splits > 1 else 0
    # LEFTPAD only where set (the kernel's default is False): the plans, and explain's flags, of other calls
    # do not mention it
    leftpad = {"LEFTPAD": True} if call.leftpad else {}
    steps.append(_step("decode", "attn_decode", row, (call.batch * call.kv_heads, splits, row_blocks), "tiled",
                       {**common, "H": call.heads, "BLOCK_M": block_m, "BLOCK_N": block_n,
                        "BANDED": call.band.sides, "SOFTCAP": call.softcap > 0,
                        "FP8_KV": call.cache_dtype in FP8_TYPES, **leftpad}, row.options(block_m), why, partial))
    if splits > 1:
        row = _decode_row(call, "decode_combine")
        steps.append(_step("combine", "attn_decode_combine", row, (_cdiv(call.seq_q * call.heads, row.block_m),
                                                                   call.batch), "tiled",
                           dict(H=call.heads, HEAD_DIM=call.head_dim, BLOCK_D=bd, BLOCK_M=row.block_m),
                           row.options(), "the splits' partial results merged by their lse"))
    return Plan(call, "decode", tuple(steps))


# ----- which Triton rows a call may tune -----

def tunable(call: Call) -> bool:
    """Autotuning times calls without dropout in 16-bit or float32 types (its candidates' kind)."""
    return call.dropout_p == 0 and not call.fp8
