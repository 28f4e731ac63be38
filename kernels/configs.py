"""Launch configs per target, as typed data. Which row a call takes is decided in one place,
jax_flash_amd/plan (its tables name these rows); why each row has its values: docs/tuning.md, by row name.

TARGETS[target][table] is a tuple of `Row`s, first match wins. Tables: "fwd", "dkdv", "dq", "dqds" (the dS
path's dQ), "keys_last" (the fp8 forward's V^T), "decode", "decode_combine", "kv_append"; "<table>+<kind>"
(kind: window, dropout, gqa, fp8, paged, dense), where a target has it, replaces the plain table for calls of
that kind (plan.Call.kinds: which of them a call has, in precedence). The Gluon kernels (sm90) have tables of `GluonRow`s: SM90_GLUON_FWD, SM90_GLUON_FWD_FP8,
SM90_GLUON_DKDV. CANDIDATES: what autotuning times. Numbers of the path rules: `Limits`.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Row:
    """A Triton kernel's config row: which calls it serves, its tile, the kernel flags it sets, and the
    compiler options. Widths count the head padded to a power of two, float32 double."""
    name: str
    block_m: int = 0  # queries per block (the fwd / dq programs hold them, dK/dV streams them)
    block_n: int = 0  # keys per block
    num_warps: int = 4
    num_stages: int = 1
    # which calls it serves
    max_width: int = 512
    min_width: int = 0
    max_itemsize: int = 8  # 2: 16-bit inputs only
    max_banded_seq: int | None = None  # banded (causal, window) calls only up to this many queries and keys
    persistent_only: bool = False  # only calls it runs on a persistent grid with fewer programs than tiles
    # kernel flags
    tma: bool = False  # Hopper: tiles through TMA descriptors (16-bit, power-of-two heads)
    warp_specialize: bool = False  # Hopper: the TMA loop split into producer and consumer warps
    persistent: int = 0  # programs per compute unit of a persistent grid where balanced (0: tiled only)
    ds: bool = False  # dK/dV: may run the dS path (stores dS^T for a one-product dQ)
    split: bool = False  # dK/dV: dK and dV from separate programs
    edges_first: bool = False  # forward: the masked key blocks before the unmasked ones (AMD registers)
    group_programs: int | None = None  # a causal tiled grid's group (masking.tile_order); None: the kernel's
    # AMD compiler options
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None

    def constexprs(self) -> dict:
        """The kernel constexprs the row sets (the plan adds the per-call ones)."""
        flags = dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, TMA=self.tma, WARP_SPECIALIZE=self.warp_specialize,
                     SPLIT=self.split, EDGES_FIRST=self.edges_first, GROUP_PROGRAMS=self.group_programs)
        return {k: v for k, v in flags.items() if v}

    def options(self) -> dict:
        """Compiler options (num_warps, num_stages; on AMD waves_per_eu, matrix_instr_nonkdim)."""
        extra = dict(waves_per_eu=self.waves_per_eu, matrix_instr_nonkdim=self.matrix_instr_nonkdim)
        return dict(num_warps=self.num_warps, num_stages=self.num_stages,
                    **{k: v for k, v in extra.items() if v is not None})

    def but(self, name: str, **change) -> Row:
        return dataclasses.replace(self, name=name, **change)


@dataclasses.dataclass(frozen=True)
class GluonRow:
    """A Gluon kernel's row (kernels/fwd_sm90.py, bwd_sm90.py): two consumer warp groups of 64 rows each and
    a load warp. Taken for calls of exactly head_dim whose lengths both reach min_seq."""
    name: str
    head_dim: int
    min_seq: int = 0
    block_m: int = 128  # dK/dV: queries per step (the forward: 2 x 64 query rows, fixed)
    block_n: int = 128  # forward: keys per block (dK/dV: 2 x 64 keys, fixed)
    stages: int = 2  # K / V (forward) or q / dO (dK/dV) buffers
    consumer_regs: int = 240  # registers per thread of the second consumer group
    num_warps: int = 4
    dropout: bool = False  # calls with dropout take it too
    persistent: int = 0  # programs per SM of a persistent grid, only where the call runs persistent
    window: bool = False  # forward: narrow windows take it (persistent only)
    carry: bool = False  # forward, persistent: the next tile's first q.k issued before a tile's last P.V
    pingpong: bool = False  # forward: the consumer groups take turns to issue (calls without a band)
    ds: bool = False  # dK/dV: may run the dS path
    spans: bool = False  # dK/dV: consumer groups skip query steps that see none of their keys (narrow windows)

    def but(self, name: str, **change) -> GluonRow:
        return dataclasses.replace(self, name=name, **change)


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """A KV-cache kernel's row (kernels/decode.py): decode (block_m packed query rows, block_n keys per step),
    decode_combine (block_m rows merged per program) or kv_append (block_n new positions)."""
    name: str
    block_m: int = 0
    block_n: int = 0
    num_warps: int = 4
    num_stages: int = 1
    max_width: int = 512
    max_itemsize: int = 8
    rows_per_warp: int | None = None  # caps num_warps at block_m // rows_per_warp (AMD: a wave per 16-row strip)
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None

    def options(self, block_m: int | None = None) -> dict:
        warps = self.num_warps
        if self.rows_per_warp:
            warps = max(1, min(warps, (block_m or self.block_m) // self.rows_per_warp))
        extra = dict(waves_per_eu=self.waves_per_eu, matrix_instr_nonkdim=self.matrix_instr_nonkdim)
        return dict(num_warps=warps, num_stages=self.num_stages, **{k: v for k, v in extra.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class Limits:
    """The numbers of the path rules (jax_flash_amd/plan); docs/tuning.md says how each was measured."""
    narrow_window: int = 2048  # bands at most this many keys wide take the "+window" rows
    persistent_balance: float = 1.05  # persistent only where its busiest program <= this x the tiled finish
    persistent_banded_blocks: int = 32  # banded (not narrow) calls persistent only up to this many blocks a row
    edges_apart_blocks: int = 64  # a TMA row's masked edge blocks in a launch of their own from this loop length
    ds_edges_apart_blocks: int = 256  # the same on the dS path
    ds_workspace_bytes: int = 2 << 30  # the dS path's workspace per launch, at most


LIMITS = Limits()
TILED_GROUP_PROGRAMS = 256  # the kernels' default GROUP_PROGRAMS (masking.tile_order)
DS_BAND_BLOCK = 128  # a banded dS workspace's key groups (kernels/bwd.py ds_col); dS-path blocks divide it


def _with(rows, max_width: int, suffix: str, **change) -> tuple[Row, ...]:
    """rows with the one of this max_width changed (and renamed with the suffix)."""
    return tuple(r.but(f"{r.name}{suffix}", **change) if r.max_width == max_width else r for r in rows)


def _in_front(rows, *first: Row) -> tuple[Row, ...]:
    """rows with each of `first` in front of the first row of its max_width (the rows behind serve the calls
    that cannot take it)."""
    rows = list(rows)
    for row in first:
        rows.insert(next(i for i, r in enumerate(rows) if r.max_width == row.max_width), row)
    return tuple(rows)


# ----- AMD (no software pipelining, occupancy asked with waves_per_eu, 16x16 MFMA in the backward) -----

def _hip(arch: str) -> dict[str, tuple[Row, ...]]:
    a = arch
    fwd = (
        Row(f"{a}/fwd/d64", 128, 64, max_width=64, waves_per_eu=2, edges_first=True),
        Row(f"{a}/fwd/d128", 128, 64 if a == "gfx950" else 32, max_width=128, waves_per_eu=2, edges_first=True),
        Row(f"{a}/fwd/d256", 128, 32 if a == "gfx90a" else 64, max_width=256, waves_per_eu=1),
        Row(f"{a}/fwd/d512", 32, 32, max_width=512, waves_per_eu=1),
    )
    bwd = dict(waves_per_eu=1, matrix_instr_nonkdim=16)
    dkdv = (Row(f"{a}/dkdv/d128", 32, 128, max_width=128, **bwd),
            Row(f"{a}/dkdv/d256", 16, 64, max_width=256, **bwd),
            Row(f"{a}/dkdv/d512", 16, 32, max_width=512, **bwd))
    tables = {
        "fwd": fwd,
        "fwd+dropout": _with(_with(fwd, 128, "-dropout", block_n=32, edges_first=a != "gfx90a"), 256, "-dropout",
                             block_n=64 if a == "gfx950" else 32),
        "dkdv": dkdv,
        "dq": (Row(f"{a}/dq/d128", 128, 32, max_width=128, **bwd),
               Row(f"{a}/dq/d256", 64, 16, max_width=256, **bwd),
               Row(f"{a}/dq/d512", 32, 16, max_width=512, **bwd)),
        "keys_last": (Row(f"{a}/keys_last", block_n=64),),
    }
    if a == "gfx942":
        tables["dkdv"] = (dkdv[0].but("gfx942/dkdv/d64", max_width=64),
                          *_with(dkdv, 128, "-mfma32", matrix_instr_nonkdim=32))
        tables["fwd+fp8"] = _with(fwd, 128, "-fp8", block_n=64)
    # a dense bias or mask tile per block: the rows that spilled with it (amd_report --check, kinds bias and mask)
    if a == "gfx942":
        tables["fwd+dense"] = _with(_with(_with(fwd, 64, "-dense", block_n=32), 128, "-dense", edges_first=False,
                                          matrix_instr_nonkdim=16), 256, "-dense", block_n=32)
    if a == "gfx950":
        tables["fwd+dense"] = _with(fwd, 128, "-dense", block_n=32)
    # the linear backward (plan.Policy(linear_backward=True)): dK/dV's tile and a float32 dQ tile (amd_report --linear)
    tables["dkdvdq"] = (Row(f"{a}/dkdvdq/d64", 32, 128, max_width=64, **bwd),
                        Row(f"{a}/dkdvdq/d128", 16, 128, max_width=128, **bwd),
                        Row(f"{a}/dkdvdq/d256", 16, 64, max_width=256, split=a != "gfx950", **bwd),
                        Row(f"{a}/dkdvdq/d512", 16, 32, max_width=512, split=True, **bwd))
    return tables


# ----- NVIDIA -----

_CUDA_FWD = (
    Row("cuda/fwd/d64", 128, 64, 4, 3, max_width=64),
    Row("cuda/fwd/d128", 128, 128, 8, 3, max_width=128),
    Row("cuda/fwd/d256", 128, 64, 8, 2, max_width=256),
    Row("cuda/fwd/d512", 64, 32, 4, 1, max_width=512),
)
_CUDA_DKDV = (
    Row("cuda/dkdv/d64", 32, 128, 4, 3, max_width=64),
    Row("cuda/dkdv/d128", 64, 128, 8, 2, max_width=128),
    Row("cuda/dkdv/d256-split", 32, 128, 8, 2, max_width=256, max_itemsize=2, split=True),
    Row("cuda/dkdv/d256", 32, 64, 8, 2, max_width=256),  # float32 at D <= 128
    Row("cuda/dkdv/d512", 16, 32, 4, 1, max_width=512),
)
_CUDA_DQ = (
    Row("cuda/dq/d64", 128, 32, 4, 3, max_width=64),
    Row("cuda/dq/d128", 64, 64, 4, 2, max_width=128),
    Row("cuda/dq/d256-16bit", 128, 32, 8, 2, max_width=256, max_itemsize=2),
    Row("cuda/dq/d256", 64, 32, 8, 2, max_width=256),
    Row("cuda/dq/d512", 32, 16, 4, 1, max_width=512),
)
_KEYS_LAST = (Row("keys_last", block_n=64),)

_CUDA = {
    "fwd": _CUDA_FWD, "dkdv": _CUDA_DKDV, "dq": _CUDA_DQ,
    "fwd+window": _with(_CUDA_FWD, 128, "-window", block_m=64, block_n=64, num_warps=4, num_stages=3),
    "dkdv+window": _with(_CUDA_DKDV, 128, "-window", block_m=32, block_n=64, num_warps=4, num_stages=3),
    "dq+window": _with(_CUDA_DQ, 128, "-window", block_m=64, block_n=32, num_warps=4, num_stages=3),
    "dkdv+dropout": _with(_CUDA_DKDV, 128, "-dropout", block_m=32, block_n=64, num_warps=4, num_stages=3),
    "dq+dropout": _with(_CUDA_DQ, 128, "-dropout", block_m=128, block_n=64, num_warps=8, num_stages=3),
    "dkdv+gqa": _with(_CUDA_DKDV, 128, "-gqa", num_stages=3),
    "fwd+fp8": _with(_CUDA_FWD, 128, "-fp8", block_m=64, block_n=128, num_warps=4, num_stages=3),
    # a dense bias or mask tile per block: three stages of it overflow sm90's 227 KB (D 128 bf16 256 KB)
    "fwd+dense": _with(_CUDA_FWD, 128, "-dense", num_stages=2),
    "keys_last": _KEYS_LAST,
}

# Hopper: TMA rows in front of the pointer rows of their width (which serve the calls TMA cannot take)
_SM90_FWD_TMA = Row("sm90/fwd/tma-d128", 128, 128, 4, 2, max_width=128, max_itemsize=2, tma=True,
                    warp_specialize=True, persistent=1)
_SM90_FWD64_TMA = _SM90_FWD_TMA.but("sm90/fwd/tma-d64", max_width=64, min_width=64, max_banded_seq=1024,
                                    persistent_only=True)
_SM90_DKDV_TMA = Row("sm90/dkdv/tma-d128", 64, 128, 4, 2, max_width=128, max_itemsize=2, tma=True,
                     warp_specialize=True, ds=True, group_programs=128)
_SM90_DKDV64_TMA = _SM90_DKDV_TMA.but("sm90/dkdv/tma-d64", block_m=128, max_width=64, min_width=64, ds=False,
                                      persistent=1, warp_specialize=False, num_warps=8)  # a candidate only
_SM90_DKDV_DROPOUT = _CUDA["dkdv+dropout"][1].but("sm90/dkdv/d128-dropout-ds", min_width=128, max_itemsize=2,
                                                  ds=True)
_SM90_DQ_TMA = Row("sm90/dq/tma-d128", 64, 64, 4, 2, max_width=128, max_itemsize=2, tma=True)
_SM90_DQ64_TMA = _SM90_DQ_TMA.but("sm90/dq/tma-d64", max_width=64, min_width=64, num_stages=3)
_SM90_DQ_DS = Row("sm90/dqds/d128", 128, 128, 8, 3, max_width=128, max_itemsize=2)

_SM90 = {
    **_CUDA,
    "fwd": _in_front(_CUDA_FWD, _SM90_FWD_TMA, _SM90_FWD64_TMA),
    "fwd+window": _in_front(_CUDA["fwd+window"], _SM90_FWD_TMA.but("sm90/fwd/tma-d128-window",
                                                                    persistent_only=True)),
    "fwd+dropout": _in_front(_CUDA_FWD, _SM90_FWD_TMA),
    "dkdv": _in_front(_CUDA_DKDV, _SM90_DKDV_TMA),
    "dkdv+gqa": _in_front(_CUDA["dkdv+gqa"], _SM90_DKDV_TMA),
    "dkdv+window": _in_front(_CUDA["dkdv+window"], _SM90_DKDV_TMA),
    "dkdv+dropout": _in_front(_CUDA["dkdv+dropout"], _SM90_DKDV_DROPOUT, _SM90_DKDV_TMA),
    "dq": _in_front(_CUDA_DQ, _SM90_DQ_TMA, _SM90_DQ64_TMA),
    "dq+window": _in_front(_CUDA["dq+window"], _SM90_DQ_TMA),
    "dqds": (_SM90_DQ_DS,),
    "dqds+window": (_SM90_DQ_DS.but("sm90/dqds/d128-window", block_m=64, block_n=64, num_warps=4, num_stages=3),),
}

# the masked edge blocks' launch after a TMA row's (the same blocks, through pointer loads)
EDGE_ROWS = {"fwd": Row("sm90/fwd/edges", num_warps=8, num_stages=2),
             "dkdv": Row("sm90/dkdv/edges", num_warps=8, num_stages=1)}

# Gluon kernels (sm90), first match wins
SM90_GLUON_FWD = (
    GluonRow("sm90/gluon-fwd/d128-persistent", 128, dropout=True, persistent=1),
    GluonRow("sm90/gluon-fwd/d128", 128, min_seq=4096, dropout=True),
    GluonRow("sm90/gluon-fwd/d64", 64, min_seq=8192, stages=3, consumer_regs=232),
    GluonRow("sm90/gluon-fwd/d64-persistent", 64, stages=3, consumer_regs=232, persistent=1, carry=True,
             window=True),
)
SM90_GLUON_FWD_FP8 = (
    GluonRow("sm90/gluon-fwd-fp8/d128-persistent", 128, persistent=1),
    GluonRow("sm90/gluon-fwd-fp8/d128", 128, min_seq=8192, pingpong=True),
)
SM90_GLUON_DKDV = (
    GluonRow("sm90/gluon-dkdv/d128", 128, block_m=64, ds=True, dropout=True),
    GluonRow("sm90/gluon-dkdv/d64", 64, min_seq=4096),
    GluonRow("sm90/gluon-dkdv/d64-dropout", 64, min_seq=4096, block_m=64, dropout=True),
)
# rows no default takes: the forced cases of the tests, and the sweeps' candidates
SM90_GLUON_FWD_FP8_D64 = GluonRow("sm90/gluon-fwd-fp8/d64", 64)
# the linear backward's dK/dV/dQ (plan.Policy.linear_backward, which no default takes; GPU tests pass, not timed)
SM90_GLUON_DKDVDQ = (
    GluonRow("sm90/gluon-dkdvdq/d128", 128, block_m=64, dropout=True),
)

# ----- KV-cache kernels -----

_DECODE_AUX = {"decode_combine": (DecodeRow("decode_combine", block_m=16),),
               "kv_append": (DecodeRow("kv_append", block_n=32),)}


def _hip_decode(arch: str) -> dict[str, tuple[DecodeRow, ...]]:
    hip = dict(num_stages=1, rows_per_warp=16, matrix_instr_nonkdim=16)
    return {"decode": (DecodeRow(f"{arch}/decode/d64", 64, 32, 4, max_width=64, waves_per_eu=2, **hip),
                       DecodeRow(f"{arch}/decode/d128", 64, 32, 4, max_width=128, waves_per_eu=2, **hip),
                       DecodeRow(f"{arch}/decode/d256", 32, 32, 2, max_width=256, waves_per_eu=1, **hip),
                       DecodeRow(f"{arch}/decode/d512", 16, 32, 1, max_width=512, waves_per_eu=1, **hip)),
            **_DECODE_AUX}


_CUDA_DECODE = (
    DecodeRow("cuda/decode/d64", 64, 128, 4, 3, max_width=64),
    DecodeRow("cuda/decode/d128-16bit", 64, 64, 4, 3, max_width=128, max_itemsize=2),
    DecodeRow("cuda/decode/d128", 32, 32, 4, 3, max_width=128),  # float32
    DecodeRow("cuda/decode/d256-16bit", 32, 32, 4, 3, max_width=256, max_itemsize=2),
    DecodeRow("cuda/decode/d256", 16, 16, 4, 3, max_width=256),
    DecodeRow("cuda/decode/d512", 16, 16, 4, 2, max_width=512),
)
_DECODE_CUDA = {
    "decode": _CUDA_DECODE,
    # paged: the block-table load takes pipeline stages of its own, so two more keep as many K/V tiles in flight
    "decode+paged": tuple(dataclasses.replace(r, name=r.name.replace("decode", "decode-paged"),
                                              num_stages=r.num_stages + 2) for r in _CUDA_DECODE),
    **_DECODE_AUX,
}
DECODE_SPLITS = {  # the split-KV rule's data (jax_flash_amd/plan: decode_splits)
    "cuda": dict(cus=132, programs_per_cu=2, max_splits=64, min_blocks_per_split=8),
    "sm90": dict(cus=132, programs_per_cu=2, max_splits=64, min_blocks_per_split=8),  # H100 / H200
    "gfx90a": dict(cus=110, programs_per_cu=8, max_splits=64, min_blocks_per_split=8),
    "gfx942": dict(cus=304, programs_per_cu=8, max_splits=64, min_blocks_per_split=8),
    "gfx950": dict(cus=256, programs_per_cu=8, max_splits=64, min_blocks_per_split=8),
    "interpret": dict(cus=2, programs_per_cu=2, max_splits=8, min_blocks_per_split=1),
}

# Triton's interpreter on the CPU (tests): small unequal blocks, so ragged, diagonal and unmasked blocks all
# occur at test sizes; other blocks for windows and dropout, so the tests run those tables too
_INTERPRET = {
    "fwd": (Row("interpret/fwd", 32, 16),),
    "dkdv": (Row("interpret/dkdv/d64", 16, 32, max_width=64), Row("interpret/dkdv/split", 16, 32, split=True)),
    "dq": (Row("interpret/dq", 32, 16),),
    "dqds": (Row("interpret/dqds", 16, 16),),
    "keys_last": (Row("interpret/keys_last", block_n=16),),
    "fwd+window": (Row("interpret/fwd-window", 16, 16, edges_first=True),),
    "dkdv+window": (Row("interpret/dkdv-window", 32, 16),),
    "dq+window": (Row("interpret/dq-window", 16, 32),),
    "dkdv+dropout": (Row("interpret/dkdv-dropout", 32, 32),),
    "dq+dropout": (Row("interpret/dq-dropout", 16, 32),),
    "decode": (DecodeRow("interpret/decode", 16, 16),),
    "decode_combine": (DecodeRow("interpret/decode_combine", block_m=16),),
    "kv_append": (DecodeRow("interpret/kv_append", block_n=16),),
}

TARGETS = {
    "cuda": {**_CUDA, **_DECODE_CUDA},  # NVIDIA sm80 and later
    "sm90": {**_SM90, **_DECODE_CUDA},  # Hopper (H100 / H200)
    "gfx90a": {**_hip("gfx90a"), **_hip_decode("gfx90a")},  # MI200: 64 KiB LDS
    "gfx942": {**_hip("gfx942"), **_hip_decode("gfx942")},  # MI300: 64 KiB LDS
    "gfx950": {**_hip("gfx950"), **_hip_decode("gfx950")},  # MI350: 160 KiB LDS
    "interpret": _INTERPRET,
}


# ----- autotuning's candidates (jax_flash_amd.autotune): at most 8 per kernel and width -----

def _rows(kernel: str, max_width: int, tiles, **options) -> tuple[Row, ...]:
    extra = "".join(f"-{k}{v}" for k, v in options.items() if k in ("split", "max_itemsize"))
    return tuple(Row(f"candidate/{kernel}/d{max_width}/{m}x{n}w{w}s{s}{extra}", m, n, w, s, max_width=max_width,
                     **options) for m, n, w, s in tiles)


_FWD_128 = [(128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
_DKDV_TILES = [(32, 128, 4, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3),
               (64, 64, 8, 2), (128, 128, 8, 2)]
_DQ_TILES = [(128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 8, 3), (128, 64, 4, 2),
             (64, 128, 8, 2), (64, 64, 4, 4)]
_HIP_BWD = dict(waves_per_eu=1, matrix_instr_nonkdim=16)


def _hip_candidates() -> dict[str, tuple[Row, ...]]:
    return {
        "fwd": (_rows("fwd", 64, [(128, 64, 4, 1), (128, 128, 4, 1), (64, 64, 4, 1), (128, 64, 8, 1), (128, 32, 4, 1)],
                      waves_per_eu=2)
                + _rows("fwd", 128, [(128, 64, 8, 1), (128, 32, 4, 1), (128, 64, 4, 1), (64, 64, 4, 1),
                                     (128, 128, 8, 1), (64, 32, 4, 1)], waves_per_eu=2)
                + _rows("fwd", 256, [(128, 64, 4, 1), (128, 32, 4, 1), (64, 64, 4, 1), (64, 32, 4, 1), (128, 32, 8, 1)],
                        waves_per_eu=1)
                + _rows("fwd", 512, [(32, 32, 4, 1), (32, 16, 4, 1)], waves_per_eu=1)),
        "dkdv": (_rows("dkdv", 128, [(32, 128, 4, 1), (16, 128, 4, 1), (32, 64, 4, 1), (64, 64, 4, 1), (64, 128, 8, 1),
                                     (16, 64, 4, 1)], **_HIP_BWD)
                 + _rows("dkdv", 256, [(16, 64, 4, 1), (32, 64, 8, 1), (16, 32, 4, 1)], **_HIP_BWD)
                 + _rows("dkdv", 512, [(16, 32, 4, 1), (16, 16, 4, 1)], **_HIP_BWD)),
        "dq": (_rows("dq", 128, [(128, 32, 4, 1), (64, 32, 4, 1), (128, 16, 4, 1), (64, 64, 4, 1), (128, 64, 8, 1),
                                 (32, 32, 4, 1)], **_HIP_BWD)
               + _rows("dq", 256, [(64, 16, 4, 1), (32, 32, 4, 1), (64, 32, 8, 1)], **_HIP_BWD)
               + _rows("dq", 512, [(32, 16, 4, 1), (16, 16, 4, 1)], **_HIP_BWD)),
    }


_CUDA_CANDIDATES = {
    "fwd": (_rows("fwd", 64, [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3),
                              (64, 128, 4, 3)])
            + _rows("fwd", 128, _FWD_128)
            + _rows("fwd", 256, [(128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 3), (128, 32, 8, 2)])
            + _rows("fwd", 512, [(64, 32, 4, 1), (32, 32, 4, 1), (64, 16, 4, 1)])),
    "dkdv": (_rows("dkdv", 64, _DKDV_TILES) + _rows("dkdv", 128, _DKDV_TILES)
             + _rows("dkdv", 256, [(32, 128, 8, 2), (64, 128, 8, 1), (32, 64, 4, 3)], split=True, max_itemsize=2)
             + _rows("dkdv", 256, [(32, 64, 8, 2), (16, 64, 4, 2)])
             + _rows("dkdv", 512, [(16, 32, 4, 1), (16, 16, 4, 1)])),
    "dq": (_rows("dq", 64, _DQ_TILES) + _rows("dq", 128, _DQ_TILES)
           + _rows("dq", 256, [(128, 32, 8, 2), (128, 32, 8, 1), (128, 16, 8, 2)], max_itemsize=2)
           + _rows("dq", 256, [(64, 32, 8, 2), (32, 32, 4, 2)])
           + _rows("dq", 512, [(32, 16, 4, 1), (16, 16, 4, 1)])),
}


def _with_tma(rows: tuple[Row, ...], tma_rows: list[Row]) -> tuple[Row, ...]:
    """Candidates with the TMA rows first, each in place of the last row of its width where that has 8."""
    rows = list(rows)
    for tma in tma_rows:
        same = [r for r in rows if r.max_width == tma.max_width and r.max_itemsize == 8]
        if len(same) >= 8:
            rows.remove(same[-1])
    return tuple(tma_rows) + tuple(rows)


CANDIDATES = {
    "cuda": _CUDA_CANDIDATES,
    "sm90": {**_CUDA_CANDIDATES,
             "fwd": _with_tma(_CUDA_CANDIDATES["fwd"], [_SM90_FWD_TMA]),
             "dkdv": _with_tma(_CUDA_CANDIDATES["dkdv"], [_SM90_DKDV64_TMA, _SM90_DKDV_TMA]),
             "dq": _with_tma(_CUDA_CANDIDATES["dq"], [_SM90_DQ64_TMA, _SM90_DQ_TMA]),
             "dqds": (_SM90_DQ_DS, _SM90_DQ_DS.but("candidate/dqds/d128/128x64w8s3", block_n=64),
                      _SM90_DQ_DS.but("candidate/dqds/d128/64x64w4s3", block_m=64, block_n=64, num_warps=4))},
    "gfx90a": _hip_candidates(),
    "gfx942": _hip_candidates(),
    "gfx950": _hip_candidates(),
    # two each, so the tuning path itself is tested on the CPU
    "interpret": {"fwd": _rows("fwd", 512, [(32, 16, 4, 1), (16, 32, 4, 1)]),
                  "dkdv": _rows("dkdv", 512, [(16, 32, 4, 1), (32, 16, 4, 1)]),
                  "dq": _rows("dq", 512, [(32, 16, 4, 1), (16, 16, 4, 1)])},
}
