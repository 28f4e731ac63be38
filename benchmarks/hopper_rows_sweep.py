"""Candidate sm90 config rows of one kernel at a time, timed in the real kernels against the shipped rows,
each checked against the shipped rows' result (benchmarks/results/NOTES.md, "Hopper").

    python -m benchmarks.hopper_rows_sweep [OUT.json [SET,...]]    # sets: d64, window, mask, d128bwd, persistent,
                                                                   # d64persistent, d64long, windowpersistent, windowany,
                                                                   # tail, ds, dkdvpersistent, dkdvpersistent2048, wsfallback,
                                                                   # d128seven, edges, bm256, dropoutds, dropoutfwd,
                                                                   # ds16k, dropouttma, dropoutwindow, dropoutfwd64,
                                                                   # windowds, d64ws, windowbanded, gluon, gluon8k,
                                                                   # gluonwindow, gluonbwd, gluondropout, gluondq,
                                                                   # gluonbwdwindow, gluonbwd64, gluonfp8,
                                                                   # pingpong, gluonwindowcarry,
                                                                   # gluondkdvpersistent, gluondkdvspans (all: SETS)

A case swaps the row of one kernel ("fwd", "dq", "dkdv" or "dqds") and times the forward, or the whole backward
(the other kernels keep their shipped rows, so a difference is the swapped kernel's; a row's "_with" entry
swaps other kernels' rows along with it). A row that
compiles but computes something else (Triton 3.6's warp specialisation returns NaN for some tiles) shows
as its max error relative to the largest reference value.
"""
import json
import sys

import jax
import jax.numpy as jnp

from jax_flash_amd import _launch, _triton, reference
from jax_flash_amd._config_choice import pick_config
from jax_flash_amd.fp8 import quantize_fp8
from jax_flash_amd.kernels import configs
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band
from jax_flash_amd.timing import median_seconds


def _row(d, bm, bn, w, s, tma=True, ws=False, **extra):
    row = dict(max_block_d=d, max_itemsize=2, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s, TMA=tma, **extra)
    return dict(row, WARP_SPECIALIZE=True) if ws else row  # dQ has no WARP_SPECIALIZE


def _name(row):
    if "BLOCK_M" not in row:  # the default rows under other module-level limits
        return "default" + "".join(f",{k}={_limit(v)}" for k, v in row.get("_limits", {}).items())
    return (f"{row['BLOCK_M']}x{row['BLOCK_N']}w{row['num_warps']}s{row['num_stages']}"
            + ("tma" if row.get("TMA") else "") + ("ws" if row.get("WARP_SPECIALIZE") else "")
            + "".join(f",{k}={v}" for k, v in row.items() if k in ("KEYS_EVEN", "PERSISTENT", "DS"))
            + "".join(f",{k}:{_name(r)}" for k, r in row.get("_with", {}).items())
            + "".join(f",{k}={v}" for k, v in row.get("_limits", {}).items()))


def _limit(value):
    if isinstance(value, list):  # configs.SM90_GLUON_FWD's or SM90_GLUON_DKDV's rows
        return "[" + ";".join("".join(f"{k[0].lower()}{int(v)}" for k, v in r.items() if k != "num_warps")
                              for r in value) + "]"
    return value


def _gluon(**change):
    return dict(_limits=dict(SM90_GLUON_FWD=[dict(r, min_seq=0, **change) for r in configs.SM90_GLUON_FWD]))


# the Gluon forward (kernels/fwd_sm90.py) against the Triton rows (SM90_GLUON_FWD empty), at every length
GLUON = {"fwd": [dict(_limits=dict(SM90_GLUON_FWD=[])), _gluon(), _gluon(STAGES=2), _gluon(STAGES=3),
                 _gluon(CONSUMER_REGS=232), _gluon(BLOCK_N=64, STAGES=3)]}

def _gluon_dkdv(**change):
    return dict(_limits=dict(SM90_GLUON_DKDV=[dict(r, **change) for r in configs.SM90_GLUON_DKDV]))


# the Gluon dK/dV (kernels/bwd_sm90.py) against the Triton rows (SM90_GLUON_DKDV empty), and its neighbours: the dS
# path or seven products, 3 stages, 128-query steps
def _gluon_dkdv64(**change):
    """The D 64 row changed (from any length), the D 128 row as shipped."""
    return dict(_limits=dict(SM90_GLUON_DKDV=[dict(r, min_seq=0, **change) if r["head_dim"] == 64 else r
                                              for r in configs.SM90_GLUON_DKDV]))


GLUON_DKDV = {"dkdv": [dict(_limits=dict(SM90_GLUON_DKDV=[])), _gluon_dkdv(STAGES=3), _gluon_dkdv(DS=False),
                       _gluon_dkdv(DS=True), _gluon_dkdv64(BLOCK_M=128)]}
GLUON_DKDV64 = {"dkdv": [_gluon_dkdv64(BLOCK_M=64), _gluon_dkdv64(BLOCK_M=128), _gluon_dkdv64(BLOCK_M=128, STAGES=3)]}
# the Gluon dQ of the seven-product path (configs.SM90_GLUON_DQ_CANDIDATES) against the Triton dQ rows; D 128 on seven
# products both ways (it takes the dS path by default), and 64-key blocks at 3 stages
def _gluon_dq(seven=False, **change):
    rows = [dict(r, **change) for r in configs.SM90_GLUON_DQ_CANDIDATES]
    return dict(_limits=dict(SM90_GLUON_DQ=rows, **({"DS_WORKSPACE_BYTES": 0} if seven else {})))


GLUON_DQ = {"dq": [_gluon_dq(), _gluon_dq(BLOCK_N=64, STAGES=3), dict(_limits=dict(DS_WORKSPACE_BYTES=0)),
                   _gluon_dq(seven=True)]}

# the Gluon forward for fp8 inputs (configs.SM90_GLUON_FWD_FP8_CANDIDATES; without PINGPONG, 3 stages) against the
# Triton fp8 rows (the first)
def _gluon_fp8(**change):
    return dict(_limits=dict(SM90_GLUON_FWD_FP8=[dict(r, **change) for r in configs.SM90_GLUON_FWD_FP8_CANDIDATES]))


GLUON_FP8 = {"fwd": [dict(_limits=dict(SM90_GLUON_FWD_FP8=[])), _gluon_fp8(), _gluon_fp8(PINGPONG=False),
                     _gluon_fp8(STAGES=3)], "_fp8": True}

# FlashAttention-3's ping-pong of the Gluon forward's two consumer groups (PINGPONG: the fp8 row's) for 16-bit inputs
PINGPONG = {"fwd": [_gluon(), _gluon(PINGPONG=True), _gluon(PINGPONG=True, STAGES=2)]}

# the Gluon forward persistent (PERSISTENT: programs per SM; whole query and key blocks) against
# its tiled grid and the Triton rows (the default below the rows' min_seq)
GLUON_PERSISTENT = {"fwd": [_gluon(), _gluon(PERSISTENT=1)]}
GLUON_CARRY = {"fwd": [_gluon(PERSISTENT=1, CARRY=0), _gluon(PERSISTENT=1, CARRY=1)]}
# narrow windows through the persistent Gluon forward (the rows' `window`, _launch.gluon_forward's rule), CARRY 0 / 1,
# against the "+window" Triton rows (every row's `window` off): short key loops are where a carried change of tile
# should pay most
GLUON_WINDOW_CARRY = {"fwd": [_gluon(window=False)] + [_gluon(PERSISTENT=1, CARRY=c, window=True) for c in (0, 1)]}
# the Gluon dK/dV persistent (kernels/bwd_sm90.py N_ROWS): every row made PERSISTENT ahead of the tiled rows (calls it
# cannot run persistent fall through to them), by the balance rule and at any balance (and banded rows of any length),
# against the tiled grid (the default)
def _gluon_dkdv_persistent(**limits):
    rows = [dict(r, PERSISTENT=1) for r in configs.SM90_GLUON_DKDV] + configs.SM90_GLUON_DKDV
    return dict(_limits=dict(SM90_GLUON_DKDV=rows, **limits))


GLUON_DKDV_PERSISTENT = {"dkdv": [_gluon_dkdv_persistent(),
                                  _gluon_dkdv_persistent(PERSISTENT_BALANCE=float("inf"),
                                                         PERSISTENT_BANDED_BLOCKS=2 ** 30)]}
# SPANS (each consumer group skips the steps that see none of its keys; narrow windows only), tiled and persistent
GLUON_DKDV_SPANS = {"dkdv": [_gluon_dkdv(SPANS=True),
                             dict(_limits=dict(SM90_GLUON_DKDV=[dict(r, SPANS=True, PERSISTENT=p) for p in (1, 0)
                                                                for r in configs.SM90_GLUON_DKDV]))]}
# fp8 through the persistent Gluon forward (no PINGPONG; CARRY 0 / 1) against the default fp8 rows
GLUON_FP8_PERSISTENT = {"fwd": [dict(_limits=dict(SM90_GLUON_FWD_FP8=[
    dict(r, min_seq=0, PINGPONG=False, PERSISTENT=1, CARRY=c) for r in configs.SM90_GLUON_FWD_FP8_CANDIDATES]))
    for c in (0, 1)], "_fp8": True}
# and with PINGPONG (without CARRY; calls without a band take the turns): D 128's candidate
GLUON_FP8_PERSISTENT_PINGPONG = {"fwd": [dict(_limits=dict(SM90_GLUON_FWD_FP8=[
    dict(configs.SM90_GLUON_FWD_FP8_CANDIDATES[0], min_seq=0, PINGPONG=pp, PERSISTENT=1, CARRY=0)])) for pp in (0, 1)],
    "_fp8": True}

# dropout through the Gluon kernels (their rows' `dropout` on) against the Triton rows it takes by default
GLUON_DROPOUT = {"fwd": [_gluon(dropout=True)], "dkdv": [_gluon_dkdv(dropout=True)], "_dropout": 0.1}

D64 = {
    "fwd": [_row(64, 128, 64, 4, 2, ws=True), _row(64, 128, 128, 4, 2, ws=True)],
    "dq": [_row(64, 64, 64, 4, 3), _row(64, 64, 64, 4, 2), _row(64, 128, 32, 4, 3), _row(64, 128, 64, 8, 2)],
    "dkdv": [_row(64, 128, 128, 4, 2, ws=True), _row(64, 64, 128, 4, 2, ws=True), _row(64, 64, 64, 4, 2, ws=True),
             _row(64, 128, 64, 4, 2, ws=True)],
}
WINDOW = {
    "fwd": [_row(128, 128, 128, 4, 2, ws=True), _row(128, 128, 64, 4, 2, ws=True)],
    "dq": [_row(128, 64, 64, 4, 2), _row(128, 64, 32, 4, 3), _row(128, 128, 64, 8, 2)],
    "dkdv": [_row(128, 64, 128, 4, 2, ws=True), _row(128, 64, 64, 4, 2, ws=True)],
}
# D 128 backward, untried tiles (the backward is 0.83-0.84x cuDNN non-causal at N >= 4096, target 0.85)
D128_BWD = {
    "dq": [_row(128, 64, 64, 4, 3), _row(128, 64, 128, 4, 2), _row(128, 128, 64, 8, 2)],
    "dkdv": [_row(128, 64, 128, 4, 3, ws=True)],  # the prototype's 128 x 128 and 64 x 64: 2-3x slower
    # the candidates on the seven-product path, where dQ's rows serve (the defaults now take the dS path)
    "_limits": dict(DS_WORKSPACE_BYTES=0),
}
# the dS path (kernels/bwd.py): its dQ kernel's tiles at D 128; at D 64 (shipped without it: the 128 x 128
# dK/dV tile spills with the store) the dK/dV tiles with it, and a dQ tile along
def _dqds(d, bm, bn, w, s):
    return dict(max_block_d=d, max_itemsize=2, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)


DS_D128 = {"dqds": [_dqds(128, 64, 64, 4, 3), _dqds(128, 128, 64, 8, 3), _dqds(128, 64, 128, 4, 3)]}
DS_D64 = {"dkdv": [_row(64, 64, 128, 4, 2, ws=True, DS=True), _row(64, 128, 128, 4, 2, ws=True, DS=True),
                   _row(64, 64, 128, 4, 2, ws=True, DS=True, _with={"dqds": _dqds(64, 64, 64, 4, 3)})]}
# the D 128 forward row one program per tile (the shipped one is persistent where balanced: kernels/configs.py)
PERSISTENT = {"fwd": [_row(128, 128, 128, 4, 2, ws=True, PERSISTENT=0)]}
# the D 64 forward through TMA + WS made persistent (tiled, these tiles were 0-40 % slower than the pointer row)
D64_PERSISTENT = {"fwd": [_row(64, 128, n, 4, s, ws=True, PERSISTENT=1) for n, s in ((64, 2), (128, 2), (64, 3))]}
# the window's forward persistent, its band's query blocks not limited (configs.PERSISTENT_BANDED_BLOCKS is
# set from the "_limits" entry while the candidates run; a candidate set's keys are kernels otherwise)
WINDOW_PERSISTENT = {"fwd": [_row(128, 128, 128, 4, 2, ws=True, PERSISTENT=p) for p in (0, 1)],
                     "_limits": dict(PERSISTENT_BANDED_BLOCKS=1 << 30)}
# the same with the balance rule lifted too (persistent whatever the schedule)
WINDOW_ANY = dict(WINDOW_PERSISTENT, _limits=dict(PERSISTENT_BANDED_BLOCKS=1 << 30, PERSISTENT_BALANCE=float("inf")))
# and the longer D 64 calls, tiled and persistent (where the launcher's balance rule would take it)
D64_TILED = {"fwd": [_row(64, 128, 128, 4, 2, ws=True, PERSISTENT=p) for p in (0, 1)]}
# the D 64 TMA dK/dV row tiled and persistent (kernels/bwd.py PERSISTENT), whatever the schedule and band (the D 128
# dS row ran in these sets too, persistent, before _launch._dkdv kept the dS path tiled:
# benchmarks/results/h200_dkdv_persistent_sweep.json)
DKDV_PERSISTENT = {"dkdv": [dict(configs._SM90_DKDV64_TMA, PERSISTENT=p) for p in (0, 1)],
                   "_limits": dict(PERSISTENT_BANDED_BLOCKS=1 << 30, PERSISTENT_BALANCE=float("inf"))}
# the D 128 dK/dV row on seven products (no dS store: made persistent, the dS row returned NaN on the H200),
# tiled and persistent: for the window's short loops ("dkdv+window" takes it), and causal N 1024
D128_SEVEN_PERSISTENT = {"dkdv": [dict(configs._SM90_DKDV_TMA, DS=False, PERSISTENT=p) for p in (0, 1)],
                         "_limits": dict(PERSISTENT_BALANCE=float("inf"), DS_WORKSPACE_BYTES=0)}
# the band's edge blocks in a launch of their own (configs.EDGES_APART_BLOCKS; kernels/fwd.py, bwd.py EDGES):
# the TMA rows with them in the one loop again (as before; D 64 dK/dV: its candidate row, the shipped one until the
# tenth session warp-specialised), and the forward's TMA rows tiled with them apart
# (persistent forwards keep them in: _launch.forward); a row's "_limits" hold while that row runs
def _edges(d):
    fwd = configs._SM90_FWD_TMA if d == 128 else configs._SM90_FWD64_TMA
    dkdv = configs._SM90_DKDV_TMA if d == 128 else configs._SM90_DKDV64_TMA
    off = dict(EDGES_APART_BLOCKS=1 << 30, DS_EDGES_APART_BLOCKS=1 << 30)  # the dS path's too
    return {"fwd": [dict(fwd, _limits=off), dict(fwd, PERSISTENT=0, _limits=dict(EDGES_APART_BLOCKS=1))],
            "dkdv": [dict(dkdv, _limits=off)]}


# 256-query forward tiles: each of the two consumer warp groups owns 128 rows (two m64 MMA chains), and every
# K / V tile loaded serves twice the rows (sm90 cross-compile, Triton 3.6, 12 warps at 168 registers: D 128
# 256 x 64 spills 36 bytes tiled / 236 persistent, 256 x 128 2132; D 64 256 x 64 and 256 x 128 persistent none)
BM256 = {128: {"fwd": [_row(128, 256, 64, 4, s, ws=True, PERSISTENT=p) for s, p in ((2, 1), (2, 0), (3, 0))]},
         64: {"fwd": [_row(64, 256, n, 4, s, ws=True, PERSISTENT=1) for n, s in ((64, 2), (128, 2), (64, 3))]}}


# the rows without warp specialisation that replace (D 64) or back (D 128) the warp-specialised dK/dV rows, which
# returned NaN under contention and compute-sanitizer with lse / delta through 1-D descriptors (NOTES "Tenth
# session"; benchmarks/hopper_ws_sanitizer_probe.py), against the defaults
def pointer_dkdv(d):
    """sm90's dK/dV row for a bf16 call at head dim d that cannot take TMA (pick_config's choice), as a row."""
    blocks, options = pick_config("sm90", "dkdv", d, jnp.bfloat16, tma=False)
    return {**blocks, **options}


WS_FALLBACK = {64: {"dkdv": [configs._SM90_DKDV64_TMA, dict(configs._SM90_DKDV64_TMA, PERSISTENT=0)]},
               128: {"dkdv": [dict(configs._SM90_DKDV_TMA, WARP_SPECIALIZE=False, num_warps=8),
                              dict(configs._SM90_DKDV_TMA, WARP_SPECIALIZE=False, num_warps=8, DS=False),
                              pointer_dkdv(128)]}}


# dropout's dK/dV rows on the dS path (pointer loads, dS^T stored; "_dropout": the rate these cases run at), against
# its seven products (DS=False)
def _drop(d, bm, bn, w, s, ds=True):
    return _row(d, bm, bn, w, s, tma=False, **({"DS": True} if ds else {}))


DROPOUT_DS = {"dkdv": [_drop(128, 32, 64, 4, 3, ds=False), _drop(128, 64, 64, 4, 3), _drop(128, 64, 64, 4, 2),
                       _drop(128, 32, 128, 4, 3), _drop(128, 64, 128, 8, 2), _drop(128, 32, 64, 4, 2),
                       _drop(128, 32, 64, 8, 3)],
              "_dropout": 0.1}
# and the forward's (with Philox sm90 ran dropout on the CUDA pointer row, 128 x 128 x 8 x 3 at D 128; with the hash
# the shipped row is the TMA row, and the first candidate that pointer row)
DROPOUT_FWD = {"fwd": [_drop(128, 128, 128, 8, 3, ds=False), _drop(128, 128, 64, 8, 3, ds=False),
                       _drop(128, 128, 128, 8, 2, ds=False),
                       _drop(128, 64, 128, 4, 3, ds=False), _drop(128, 64, 64, 4, 3, ds=False),
                       _drop(128, 128, 32, 8, 3, ds=False)],
               "_dropout": 0.1}
# with the per-element hash (kernels/dropout.py) the warp-specialised TMA dK/dV loop takes dropout: its rows against
# the pointer row on the dS path (what dropout ran before)
DROPOUT_TMA = {"dkdv": [_drop(128, 32, 64, 4, 3), _row(128, 32, 128, 4, 2, ws=True, DS=True, GROUP_PROGRAMS=128),
                        _row(128, 32, 128, 4, 3, ws=True, DS=True, GROUP_PROGRAMS=128),
                        _row(128, 64, 64, 4, 2, ws=True, DS=True), _row(128, 32, 128, 8, 2, DS=True),
                        _row(128, 32, 64, 4, 2, ws=True, DS=True)],
               "_dropout": 0.1}
# a narrow window with dropout: the TMA rows it took with the hash before _launch._takes_tma's rule (the default then;
# since, the pointer rows are the default and these candidates repeat them), against the "+window" pointer rows
DROPOUT_WINDOW = {"fwd": [_drop(128, 64, 64, 4, 3, ds=False)], "dkdv": [_drop(128, 32, 64, 4, 3, ds=False)],
                  "dq": [_drop(128, 64, 32, 4, 3, ds=False)], "_dropout": 0.1}
# D 64 with dropout: the forward's TMA row where it runs persistent (the default before sm90's "fwd+dropout" rows left
# it out; since, the default is this pointer row), against its pointer row
DROPOUT_FWD64 = {"fwd": [_drop(64, 128, 64, 4, 3, ds=False)], "_dropout": 0.1}
DROPOUT_DS64 = {"dkdv": [_drop(64, 32, 128, 4, 3), _drop(64, 64, 64, 4, 3), _drop(64, 32, 64, 4, 3)],
                "_dropout": 0.1}

# a narrow window on the dS path (_launch._ds_heads leaves narrow windows to seven products: its workspace holds
# whole rows of which the band uses a few blocks): NARROW_WINDOW 0 lets the window take it, with the workspace budget
# (4 launches of 4 heads at 1 x 16384 x 16) or one launch; and the dS path's dQ on 64 x 64 tiles
_WIDE_DS = dict(NARROW_WINDOW=0, DS_WORKSPACE_BYTES=16 << 30)
WINDOW_DS = {"dkdv": [dict(configs._SM90_DKDV_TMA, _limits=dict(NARROW_WINDOW=0)),
                      dict(configs._SM90_DKDV_TMA, _limits=_WIDE_DS),
                      dict(configs._SM90_DKDV_TMA, _limits=_WIDE_DS, _with={"dqds": _dqds(128, 64, 64, 4, 3)}),
                      dict(configs._SM90_DKDV_TMA, _limits=_WIDE_DS, _with={"dqds": _dqds(128, 64, 128, 4, 3)})]}

# D 64's dK/dV through TMA + WS on D 128's tiles (64 x 128, lse / delta through pointers): the 128 x 128 row fails
# Triton 3.6's warp-specialisation pass with pointer lse / delta (WSLowerToken.cpp:73), this tile compiles (sm90:
# 12 warps, 168 registers, no spills, 82-115 KB), against the pointer row D 64 takes
_D64_WS = dict(configs._SM90_DKDV_TMA, max_block_d=64, min_block_d=64, DS=False)
D64_WS = {"dkdv": [_D64_WS, dict(_D64_WS, num_stages=3), dict(_D64_WS, BLOCK_M=32), dict(_D64_WS, PERSISTENT=1),
                   dict(_D64_WS, DS=True)]}

# the banded dS path (shipped for windows) against seven products (what narrow windows took before)
WINDOW_SEVEN = {"dkdv": [dict(configs._SM90_DKDV_TMA, DS=False)]}

# what the mask costs the D 128 TMA forward: the shipped row with every block masked
MASK_PROBE = {"fwd": [_row(128, 128, 128, 4, 2, ws=True, KEYS_EVEN=False)]}

SETS = {
    "d64": [((b, n, 32, 64), causal, (-1, -1), D64) for b, n in ((16, 1024), (4, 4096), (1, 16384))
            for causal in (False, True)],
    "window": [((1, 16384, 16, 128), True, (1024, 0), WINDOW)],
    "mask": [((4, 4096, 16, 128), False, (-1, -1), MASK_PROBE)],
    "persistent": [((16384 // n, n, 16, 128), causal, (-1, -1), PERSISTENT) for n in (1024, 4096, 16384)
                   for causal in (False, True)],
    "d64persistent": [((b, n, 32, 64), causal, (-1, -1), D64_PERSISTENT) for b, n in ((16, 1024), (4, 4096))
                      for causal in (False, True)],
    "d64long": [((b, n, 32, 64), causal, (-1, -1), D64_TILED) for b, n, causal in
                ((1, 16384, False), (1, 16384, True), (8, 2048, True), (2, 8192, True))],
    "windowpersistent": [((1, 16384, 16, 128), True, (1024, 0), WINDOW_PERSISTENT),
                         ((4, 4096, 16, 128), True, (1024, 0), WINDOW_PERSISTENT)],
    "windowany": [((b, 16384 // b, 16, 128), True, (1024, 0), WINDOW_ANY) for b in (1, 2, 4)],
    # a call the balance rule against the tiled grid's finish takes persistent (shipped) that the rule against
    # the mean work did not (1 x 2048 x 16; x 32 was persistent under both), against one program per tile
    "tail": [((1, 2048, 16, 128), True, (-1, -1), PERSISTENT), ((1, 2048, 32, 128), True, (-1, -1), PERSISTENT)],
    "d128bwd": [((b, n, 16, 128), causal, (-1, -1), D128_BWD) for b, n in ((4, 4096), (1, 16384))
                for causal in (False, True)],
    "dkdvpersistent": [((16384 // n, n, 32, 64), causal, (-1, -1), DKDV_PERSISTENT) for n in (1024, 4096, 16384)
                       for causal in (False, True)],
    "dkdvpersistent2048": [((8, 2048, 32, 64), causal, (-1, -1), DKDV_PERSISTENT) for causal in (False, True)],
    "d128seven": [((b, 16384 // b, 16, 128), True, (1024, 0), D128_SEVEN_PERSISTENT) for b in (1, 4)]
                 + [((16, 1024, 16, 128), causal, (-1, -1), D128_SEVEN_PERSISTENT) for causal in (False, True)],
    "edges": [((b, n, h, d), True, (-1, -1), _edges(d)) for d, h in ((64, 32), (128, 16))
              for b, n in ((16, 1024), (8, 2048), (4, 4096), (1, 16384))]
             + [((1, 16384, 16, 128), True, (1024, 0), _edges(128))],
    "bm256": [((16384 // n, n, h, d), causal, (-1, -1), BM256[d]) for d, h in ((128, 16), (64, 32))
              for n in (1024, 4096, 16384) for causal in (False, True)],
    "wsfallback": [((16384 // n, n, 2048 // d, d), causal, (-1, -1), WS_FALLBACK[d]) for d in (64, 128)
                   for n in (1024, 4096, 16384) for causal in (False, True)],
    "dropoutds": [((4, 4096, 16, 128), causal, (-1, -1), DROPOUT_DS) for causal in (False, True)]
                 + [((1, 16384, 16, 128), False, (-1, -1), DROPOUT_DS)]
                 + [((4, 4096, 32, 64), causal, (-1, -1), DROPOUT_DS64) for causal in (False, True)],
    "dropoutfwd": [((4, 4096, 16, 128), causal, (-1, -1), DROPOUT_FWD) for causal in (False, True)]
                  + [((1, 16384, 16, 128), False, (-1, -1), DROPOUT_FWD)],
    "dropouttma": [((4, 4096, 16, 128), causal, (-1, -1), DROPOUT_TMA) for causal in (False, True)]
                  + [((1, 16384, 16, 128), False, (-1, -1), DROPOUT_TMA)],
    "dropoutfwd64": [((b, n, 32, 64), causal, (-1, -1), DROPOUT_FWD64) for b, n in ((16, 1024), (4, 4096))
                     for causal in (False, True)],
    "d64ws": [((b, n, 32, 64), causal, (-1, -1), D64_WS) for b, n in ((16, 1024), (4, 4096), (1, 16384))
              for causal in (False, True)],
    "windowbanded": [((b, 16384 // b, 16, 128), w[1] == 0, w, WINDOW_SEVEN)
                     for b, w in ((1, (1024, 0)), (4, (1024, 0)), (1, (4096, 0)), (1, (256, 256)))],
    "windowds": [((b, 16384 // b, 16, 128), True, (1024, 0), WINDOW_DS) for b in (1, 4)],
    "dropoutwindow": [((1, 16384, 16, 128), True, (1024, 0), DROPOUT_WINDOW)],
    "gluon": [((16384 // n, n, h, d), causal, (-1, -1), GLUON) for d, h in ((128, 16), (64, 32))
              for n in (1024, 2048, 4096, 16384) for causal in (False, True)],
    "gluonbwd": [((16384 // n, n, h, d), causal, (-1, -1), GLUON_DKDV) for n in (4096, 16384, 1024)
                 for d, h in ((128, 16), (64, 32)) for causal in (False, True)],
    "gluondq": [((16384 // n, n, h, d), causal, (-1, -1), GLUON_DQ) for n in (4096, 16384, 1024)
                for d, h in ((64, 32), (128, 16)) for causal in (False, True)],
    # narrow windows through the Gluon kernels (NARROW_WINDOW 0: the Gluon forward and dK/dV, the dK/dV on the banded dS
    # path) against the "+window" Triton rows (measured so; since, the default backward takes the Gluon dK/dV there)
    "gluonbwdwindow": [((1, 16384, 16, 128), w[1] == 0, w, {"dkdv": [dict(_limits=dict(NARROW_WINDOW=0))]})
                       for w in ((1024, 0), (256, 256))],
    # the D 64 Gluon dK/dV at 64- and 128-query steps (2 and 3 stages), from any length
    "gluonbwd64": [((16384 // n, n, 32, 64), causal, (-1, -1), GLUON_DKDV64) for n in (4096, 16384, 1024)
                   for causal in (False, True)],
    "gluonfp8": [((16384 // n, n, 16, 128), causal, (-1, -1), GLUON_FP8) for n in (4096, 16384, 1024, 8192)
                 for causal in (False, True)] + [((4, 4096, 32, 64), True, (-1, -1), GLUON_FP8)],
    "pingpong": [((16384 // n, n, 32, 64), causal, (-1, -1), PINGPONG) for n in (4096, 1024, 16384)
                 for causal in (False, True)] + [((16384 // n, n, 16, 128), causal, (-1, -1), PINGPONG)
                                                 for n in (4096, 16384) for causal in (False, True)],
    "gluondropout": [((4, 4096, 16, 128), causal, (-1, -1), GLUON_DROPOUT) for causal in (False, True)]
                    + [((1, 16384, 16, 128), False, (-1, -1), GLUON_DROPOUT), ((4, 4096, 32, 64), True, (-1, -1),
                                                                                GLUON_DROPOUT)],
    "gluonpersistent": [((16384 // n, n, h, d), causal, (-1, -1), GLUON_PERSISTENT) for d, h in ((64, 32), (128, 16))
                        for n in (4096, 1024, 2048, 16384) for causal in (False, True)],
    # the persistent Gluon forward with and without CARRY (fwd_sm90._carried_tiles), same process
    "gluoncarry": [((16384 // n, n, h, d), causal, (-1, -1), GLUON_CARRY) for d, h in ((128, 16), (64, 32))
                   for n in (4096, 1024, 16384) for causal in (False, True) if (d, n) != (64, 16384)],
    "gluonwindowcarry": [((1, 16384, 16, 128), w[1] == 0, w, GLUON_WINDOW_CARRY) for w in ((1024, 0), (256, 256))]
                        + [((4, 4096, 32, 64), True, (1024, 0), GLUON_WINDOW_CARRY)],
    "gluondkdvpersistent": [((16384 // n, n, 16, 128), causal, (-1, -1), GLUON_DKDV_PERSISTENT)
                           for n in (1024, 4096, 16384) for causal in (False, True)]
                          + [((1, 16384, 16, 128), w[1] == 0, w, GLUON_DKDV_PERSISTENT) for w in ((1024, 0), (256, 256))],
    "gluondkdvspans": [((1, 16384, 16, 128), w[1] == 0, w, GLUON_DKDV_SPANS) for w in ((1024, 0), (256, 256))]
                      + [((4, 4096, 32, 64), True, (1024, 0), GLUON_DKDV_SPANS)],
    "gluonfp8persistent": [((16384 // n, n, h, d), causal, (-1, -1), GLUON_FP8_PERSISTENT)
                           for d, h in ((128, 16), (64, 32)) for n in (4096, 1024, 16384) for causal in (False, True)],
    "gluonfp8pingpong": [((16384 // n, n, 16, 128), False, (-1, -1), GLUON_FP8_PERSISTENT_PINGPONG)
                         for n in (4096, 1024, 16384, 8192)],
    "gluon8k": [((2, 8192, h, d), causal, (-1, -1), dict(fwd=GLUON["fwd"][:2])) for d, h in ((128, 16), (64, 32))
                for causal in (False, True)],
    "gluonwindow": [((1, 16384, 16, 128), w[1] == 0, w, dict(fwd=GLUON["fwd"][:2])) for w in ((1024, 0), (256, 256))],
    "ds16k": [((1, 16384, 16, 128), causal, (-1, -1), DS_D128) for causal in (False, True)],
    "ds": [((4, 4096, 16, 128), causal, (-1, -1), DS_D128) for causal in (False, True)]
          + [((4, 4096, 32, 64), causal, (-1, -1), DS_D64) for causal in (False, True)],
}


def _err(got, ref):
    worst = 0.0
    for g, r in zip(got, ref):
        r = r.astype(jnp.float32)
        worst = max(worst, float(jnp.max(jnp.abs(g.astype(jnp.float32) - r)) / jnp.max(jnp.abs(r))))
    return worst


def _set(limits):
    for key, value in limits.items():
        setattr(configs, key, value)


def main(out_path, sets):
    print("target", _triton.target(), flush=True)
    target = _triton.target()
    results = []
    for (b, n, h, d), causal, window, candidates in [case for name in sets for case in SETS[name]]:
        candidates = dict(candidates)
        limits = candidates.pop("_limits", {})  # for the candidates only: the defaults run the shipped ones
        dropout_p = candidates.pop("_dropout", 0.0)
        fp8_inputs = candidates.pop("_fp8", False)
        shipped_limits = {key: getattr(configs, key) for key in limits}
        ks = jax.random.split(jax.random.key(0), 4)
        q, k, v, do = (jax.random.normal(x, (b, n, h, d), jnp.bfloat16) for x in ks)
        statics = _launch.Statics(d ** -0.5, Band.of(causal, window, n, n), dropout_p=dropout_p)
        extras = Operands(seeds=reference.dropout_seeds(jax.random.key(1), b, h) if dropout_p else None)
        if fp8_inputs:  # forward only: per-head quantised inputs and their descales
            (q, qd), (k, kd), (v, vd) = (quantize_fp8(x) for x in (q, k, v))
            extras = Operands(q_descale=qd, k_descale=kd, v_descale=vd)
        dlse = jnp.zeros((b, h, n), jnp.float32)
        line = dict(shape=(b, n, h, d), causal=causal, window=window, **({"dropout": dropout_p} if dropout_p else {}))

        def fwd(rows):
            return jax.jit(lambda q, k, v: _launch.forward(_triton.run, target, q, k, v, extras, statics=statics,
                                                           rows=rows))

        out, lse = fwd(None)(q, k, v)

        def bwd(rows):
            return jax.jit(lambda q, k, v, o, l, do: _launch.backward(_triton.run, target, q, k, v, o, l, do, dlse,
                                                                       extras, statics=statics, rows=rows))

        ref = {"fwd": (out,)}
        if any(kn != "fwd" for kn in candidates):
            ref["bwd"] = bwd(None)(q, k, v, out, lse, do)
        args = {"fwd": (q, k, v), "bwd": (q, k, v, out, lse, do)}
        make = {"fwd": fwd, "bwd": bwd}
        if "fwd" in candidates and window == (-1, -1) and not fp8_inputs:  # the peer, same run
            cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                         implementation="cudnn"))
            line["cudnn_fwd_ms"] = round(median_seconds(cudnn, q, k, v, budget_s=0.3) * 1e3, 4)
        for part in ("fwd", "bwd"):
            kernels = [kn for kn in candidates if (kn == "fwd") == (part == "fwd")]
            if not kernels:
                continue
            line[f"{part}_default_ms"] = round(median_seconds(make[part](None), *args[part], budget_s=0.3) * 1e3, 4)
            _set(limits)
            for kn in kernels:
                for row in candidates[kn]:
                    key = f"{part}:{kn}:{_name(row)}"
                    row_limits = row.get("_limits", {})
                    saved = {name: getattr(configs, name) for name in row_limits}
                    _set(row_limits)
                    try:
                        with_rows = row.get("_with", {})
                        f = make[part]({kn: {k: v for k, v in row.items() if k not in ("_with", "_limits")},
                                        **with_rows} if "BLOCK_M" in row else None)
                        got = f(*args[part])
                        got = got if part == "bwd" else got[:1]  # the forward's (out, lse): out
                        line[key] = dict(ms=round(median_seconds(f, *args[part], budget_s=0.3) * 1e3, 4),
                                         err=round(_err(got, ref[part]), 4))
                    except Exception as e:  # noqa: BLE001  (recorded: a row that fails to compile or launch)
                        line[key] = f"{type(e).__name__}: {str(e)[:100]}"
                    finally:
                        _set(saved)
            _set(shipped_limits)
        print(json.dumps(line), flush=True)
        results.append(line)
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rows_sweep.json", sys.argv[2].split(",") if len(sys.argv) > 2 else SETS)
