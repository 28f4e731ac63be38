"""Default launch configs per target, as data (tuning lives here, not in the launchers).

TARGETS[target][kernel] is a list of rows ordered by ``max_block_d``; TARGETS[target]["<kernel>+window"],
where present, replaces it for sliding windows at most NARROW_WINDOW keys wide (short key loops favour
smaller tiles), "<kernel>+dropout" with dropout, "<kernel>+gqa" with grouped query heads, "fwd+fp8"
with float8 inputs (jax_flash_amd/_launch.py: row_kind). A launch takes the first row whose ``max_block_d`` >=
BLOCK_D * itemsize / 2: float32 inputs take the row of a head twice as wide, since their tiles need
twice the registers and shared memory. A row with ``max_itemsize`` serves only inputs of at most that
many bytes per element (float32 calls skip to the next row of the same width), one with ``min_block_d``
only heads at least that wide (narrower ones go on to the next row), one with ``max_banded_seq`` (the
forward) calls bounded by a band (causal, window) only up to that many queries and keys, one with
``persistent_only`` only the calls it runs persistent with more tiles than programs (jax_flash_amd/_launch.py
forward). Upper-case keys are the
kernel's constexprs (BLOCK_*; dK/dV's SPLIT, default False: dK and dV from separate programs; PERSISTENT (the
forward's, the TMA dK/dV's), programs per compute unit of a persistent grid, jax_flash_amd/_launch.py
persistent_programs; dK/dV's
DS, the dS path, jax_flash_amd/_launch.py ds_heads; GROUP_PROGRAMS, default TILED_GROUP_PROGRAMS: a causal tiled
grid's group, masking.tile_order), other
lower-case ones compiler options (num_warps, num_stages; on HIP also waves_per_eu and matrix_instr_nonkdim, which need
a jax-triton that forwards them).

Kernels: "fwd" (BLOCK_M queries held, BLOCK_N keys streamed), "dkdv" (BLOCK_N keys held, BLOCK_M
queries streamed), "dq" (BLOCK_M queries held, BLOCK_N keys streamed; also delta), "dqds" (the dS path's
dQ: BLOCK_M queries held, BLOCK_N keys of dS and K streamed), "keys_last" (BLOCK_N keys of V transposed for
the fp8 forward).
"""

_KEYS_LAST = [dict(max_block_d=512, BLOCK_N=64, num_warps=4, num_stages=1)]  # the fp8 forward's V^T


def _hip(arch):
    # AMD practice (ROCm's Triton FA): no software pipelining (num_stages=1), occupancy asked for
    # with waves_per_eu, 16x16 MFMA in the backward. Checked with `python -m jax_flash_amd.amd_report
    # --check`: no spills, no duplicated MFMA or exp work, forward at 2 waves/SIMD up to D 128.
    # Forward tiles keep 32 query rows per warp: the two dots chain (S -> P -> PV), so Triton lays all
    # warps along the rows, and 32x32 MFMAs on fewer than 32 rows per warp repeat work: 128 x 64 with 8 warps
    # (the earlier D 128 row) computed QK^T and the softmax twice (384 MFMAs and 264 v_exp per tile, ideal
    # 256 / 136) and passed P through LDS; 64 x 64 with 4 warps (D 256) the same. 16x16 MFMAs with 8 warps
    # (matrix_instr_nonkdim=16) remove the repetition, but each of the 8 warps then reads the whole K and V
    # tiles from LDS: 288 KB per 128 x 64 tile against 160 KB with 4 warps. gfx942, D 128, triton 3.9:
    # 128 x 64 x 4 warps spills 136-144 bytes, 128 x 32 x 4 warps none (214-217 VGPRs, 2 waves/SIMD, 292
    # instructions per wave per 32 keys). gfx950's MFMAs take twice the K (half the instructions):
    # 128 x 64 x 4 warps fits there (235-242 VGPRs, 311 instructions per 64 keys against 2 x 191). D 256:
    # 128 x 64 x 4 warps (443-445 VGPRs, 1 wave/SIMD as before, 64 KiB LDS); gfx90a spills 120 bytes with it,
    # 128 x 32 does not.
    keys = 64 if arch == "gfx950" else 32  # per key block of the D 128 forward
    # EDGES_FIRST (kernels/fwd.py): up to D 128 the masked key blocks first, so that the unmasked loop keeps
    # its K / V buffer descriptors in SGPRs (the other order re-copies 4 of their words every iteration;
    # at D 256, and gfx90a's D 128 with dropout, it is this order that costs instructions)
    fwd = [
        dict(max_block_d=64, BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2, EDGES_FIRST=True),
        dict(max_block_d=128, BLOCK_M=128, BLOCK_N=keys, num_warps=4, num_stages=1, waves_per_eu=2,
             EDGES_FIRST=True),
        dict(max_block_d=256, BLOCK_M=128, BLOCK_N=32 if arch == "gfx90a" else 64, num_warps=4, num_stages=1,
             waves_per_eu=1),
        dict(max_block_d=512, BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1),
    ]
    rows = {
        "fwd": fwd,
        # the dropout draw's registers: 32 keys at D 128 (gfx950 with 64: 251 VGPRs, at the edge); at D 256
        # 128 x 64 spills 20 bytes on gfx942 (gfx950: 386 VGPRs, no spills) (measured with the Philox draw of before)
        "fwd+dropout": _with(_with(fwd, 128, BLOCK_N=32, EDGES_FIRST=arch != "gfx90a"), 256,
                             BLOCK_N=64 if arch == "gfx950" else 32),
        "dkdv": [
            dict(max_block_d=128, BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=256, BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
        ],
        "dq": [
            dict(max_block_d=128, BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=256, BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
        ],
        "keys_last": _KEYS_LAST,
    }
    if arch == "gfx942":
        # dK/dV at D 65-128: 32x32 MFMAs (triton 3.9, per wave per 32 x 128 tile, fp16 / bf16: 444-579
        # instructions against 445-596 with 16x16, with dropout 964-1080 against 1247-1374, no spills), at
        # the price of 1.5x the load bytes per lane (192 against 128); at D 64 16x16 stays (379-507 vs 447-575)
        rows["dkdv"] = [dict(rows["dkdv"][0], max_block_d=64)] + _with(rows["dkdv"], 128, matrix_instr_nonkdim=32)
        # fp8 (e4m3fnuz) at D 128: half the bytes per tile, so 64 keys fit (215-224 VGPRs; 263 instructions
        # per wave per 64 keys against 2 x 177 with 32)
        rows["fwd+fp8"] = _with(fwd, 128, BLOCK_N=64)
    return rows


NARROW_WINDOW = 2048  # bands (left + right + 1 keys) up to this wide take the "+window" rows


def _with(rows, max_block_d, **change):
    """rows with the one of this max_block_d changed."""
    return [dict(r, **change) if r["max_block_d"] == max_block_d else r for r in rows]


_CUDA = {
    "fwd": [
        dict(max_block_d=64, BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
        dict(max_block_d=128, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
        dict(max_block_d=256, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
        dict(max_block_d=512, BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1),
    ],
    "dkdv": [
        dict(max_block_d=64, BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3),
        # H200, D 128, N 4096: 4.3 ms backward vs 8.5 ms for 32 x 128 x 4 warps (3 KB of spills)
        dict(max_block_d=128, BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2),
        # D 256: 128 x 256 fp32 dK and dV do not both fit; with 64 keys, 8 warps compute the (chained) S^T
        # and dP^T twice and spill. SPLIT, H200, N 4096, backward 8.72 ms vs 10.34 (4.53 vs 5.41 causal)
        dict(max_block_d=256, max_itemsize=2, BLOCK_M=32, BLOCK_N=128, SPLIT=True, num_warps=8, num_stages=2),
        # float32 at D <= 128 (FMA dots, tiles held in registers): smaller tiles (sm90 ptxas: SPLIT's
        # 128 keys spill ~70 KB)
        dict(max_block_d=256, BLOCK_M=32, BLOCK_N=64, num_warps=8, num_stages=2),
        dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
    ],
    "dq": [
        dict(max_block_d=64, BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=3),
        # 2 stages: 96 KB of shared memory, two programs per SM (3 stages: 128 KB, one). H200, N 4096, D 128:
        # backward 4.20 vs 4.40 ms (2.24 vs 2.44 causal)
        dict(max_block_d=128, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
        # 128 queries: each warp group its own 64 (64 x 32 x 8 warps computes S and dP twice): backward 6.08 ms vs
        # 8.77 at D 256, N 4096 on the H200 (3.16 vs 4.53 causal); float32 keeps 64 (ptxas: 43 KB of spills)
        dict(max_block_d=256, max_itemsize=2, BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
        dict(max_block_d=256, BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2),
        dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1),
    ],
}

_CUDA_TARGET = {
    **_CUDA,
    # window (1024, 0), N 16384, D 128 on the H200, swept over CANDIDATES: fwd 0.398 ms vs 0.426,
    # dK/dV 1.366 vs 1.449, dQ 1.249 vs 1.318 (9 key blocks per query block: the loop is short)
    "fwd+window": _with(_CUDA["fwd"], 128, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    "dkdv+window": _with(_CUDA["dkdv"], 128, BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
    "dq+window": _with(_CUDA["dq"], 128, BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
    # dropout 0.1, N 4096, D 128 on the H200: backward 1.26x / 1.21x the plain one (non-causal) with these
    # rows alone vs 1.31x with the plain rows; the default dK/dV tile spilled 200 bytes with the Philox draw of
    # before (kernels/dropout.py: a hash since)
    "dkdv+dropout": _with(_CUDA["dkdv"], 128, BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
    "dq+dropout": _with(_CUDA["dq"], 128, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    # 32 query / 8 key-value heads, N 4096, D 128: dK/dV 8.50 vs 8.93 ms (2 stages) non-causal, 5.04 vs 5.14
    # causal (MHA: 8.63 / 4.83 either way): each program's loop is GROUP times longer
    "dkdv+gqa": _with(_CUDA["dkdv"], 128, num_stages=3),
    # fp8 (e4m3fn) forward, D 128: 0.461 vs 0.490 ms (N 4096 causal), 2.96 vs 3.08 (N 16384 full) for
    # the bf16 row; 128 x 64 x 4 x 3: 0.470 / 2.86, 128 x 64 x 8 x 3/4 and 64 x 128 x 4 x 4 slower
    "fwd+fp8": _with(_CUDA["fwd"], 128, BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
    "keys_last": _KEYS_LAST,
}

# sm90, D 128, bf16, H200 (Triton 3.6), forward / cuDNN's: TMA + warp specialisation 128 x 128 x 4 warps x
# 2 stages 0.85 / 0.89 / 0.91 at N 1024 / 4096 / 16384 (causal 0.74 / 0.83 / 0.88) against 0.74-0.77
# (0.71-0.84) for the pointer row. 3 stages: 262 KB of shared memory; 128 x 64: slower; 128 x 64 x 3
# stages and 128 x 128 x 3 at D 64: NaN (Triton 3.6). D 64 one program per tile: the pointer row is faster
# (0.89-0.92 vs 0.74-0.91); persistent: _SM90_FWD64_TMA below.
# PERSISTENT=1: one program per SM looping over tiles where the schedule is balanced (_launch.py
# persistent_programs), H200, bf16, D 128, forward ms, cuDNN / one program per tile / persistent, same run
# (benchmarks/hopper_rows_sweep.py persistent): 16 x 1024 x 16 0.254 / 0.326 / 0.282, causal 0.184 / 0.245 /
# 0.181; 4 x 4096 0.945 / 1.048 / 1.030, causal 0.566 / 0.643 / 0.611; 1 x 16384 3.60 / 3.97 / 3.99, causal
# 1.99 / 2.22 / 3.03 (unbalanced: taken tiled). Tiles ordered all heads' last blocks first (balanced, K and V
# not shared in L2): 0.330, 0.213, 1.176, 0.626, 4.20, 2.26. The D 64 pointer row persistent (2 per SM):
# 7-20 % slower.
_SM90_FWD_TMA = dict(max_block_d=128, max_itemsize=2, BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, TMA=True,
                     WARP_SPECIALIZE=True, PERSISTENT=1)
# D 33-64: the same row where it is persistent, H200, bf16, 32 heads, forward ms, cuDNN / the pointer row / this
# (benchmarks/hopper_rows_sweep.py d64persistent, d64long): 16 x 1024 0.351 / 0.406 / 0.366, 4 x 4096 1.281 /
# 1.403 / 1.364, 1 x 16384 4.852 / 5.350 / 5.270; causal 16 x 1024 0.232 / 0.275 / 0.265, but 8 x 2048 0.384 /
# 0.446 / 0.464, 4 x 4096 0.705 / 0.797 / 0.860, 2 x 8192 (tiled) 1.312 / 1.472 / 1.756, 1 x 16384 (tiled)
# 2.515 / 2.833 / 3.250: every block of a band is masked in its one loop, so banded calls take it only up to
# 1024 queries and keys. One program per tile it is slower at short loops (16 x 1024 full 0.490 against the pointer
# row's 0.394 in an earlier sweep; 1 x 16384 5.343 against 5.270 persistent), so only calls it runs persistent
# take it. 128 x 64 tiles 6-30 % slower; 3 stages: NaN (Triton 3.6).
_SM90_FWD64_TMA = dict(_SM90_FWD_TMA, max_block_d=64, min_block_d=64, max_banded_seq=1024, persistent_only=True)
# The Gluon forward (kernels/fwd_sm90.py: FlashAttention-3's overlap of the products with the softmax), which calls
# take it: jax_flash_amd/_launch.py gluon_forward. The first row of the call's head dim (exactly) whose min_seq both
# its lengths reach; BLOCK_N keys per block, STAGES K / V buffers, CONSUMER_REGS registers per thread of the second
# consumer group (a worker partition; the first, Gluon's default partition, gets what is left: 256 in sm90 PTX; the
# load warp 24). H200, bf16, forward ms, cuDNN / the Triton rows / this row, same run (benchmarks/hopper_rows_sweep.py
# gluon, gluon8k; full, then causal):
#   D 128, 16 heads: 16 x 1024 0.250 / 0.280 / 0.322, 0.179 / 0.183 / 0.246; 8 x 2048 0.488 / 0.499 / 0.540, 0.307 /
#   0.317 / 0.341; 4 x 4096 0.933 / 1.015 / 0.966, 0.554 / 0.577 / 0.563; 2 x 8192 1.835 / 1.991 / 1.822, 1.024 /
#   1.189 / 0.947; 1 x 16384 3.603 / 3.923 / 3.520, 1.966 / 2.141 / 1.861.
#   D 64, 32 heads: 16 x 1024 0.341 / 0.365 / 0.519, 0.226 / 0.268 / 0.412; 8 x 2048 0.641 / 0.702 / 0.805, 0.383 /
#   0.424 / 0.557; 4 x 4096 1.238 / 1.349 / 1.369, 0.686 / 0.753 / 0.833; 2 x 8192 2.394 / 2.657 / 2.540, 1.292 /
#   1.406 / 1.395; 1 x 16384 4.832 / 5.251 / 4.868, 2.521 / 2.688 / 2.545.
# Short key loops pay the program's fixed cost (four descriptors, barriers, the pipeline's fill) with no persistent
# grid to spread it. 3 stages or 232 registers (the second group's) at D 128 (2 stages at D 64) within 1-2 % of
# these; 64-key blocks 5-25 % slower.
# dropout: whether calls with dropout take it. H200, bf16, p 0.1, forward ms, Triton rows / this row
# (hopper_rows_sweep.py gluondropout): D 128 4 x 4096 x 16 1.553 / 1.290, causal 1.004 / 0.808, 1 x 16384 5.81 /
# 4.81; D 64 causal 4 x 4096 x 32 1.277 / 1.292 (no gain: left to the Triton rows).
# PERSISTENT (programs per SM): a persistent grid (attn_fwd_sm90 N_ROWS), whose Q buffer is released after a tile's
# last q.k and whose output has buffers of its own, so the next tile's Q and keys load while a tile finishes; a row
# with it is taken only where the call runs persistent (_launch.gluon_programs: whole blocks, balanced).
# H200, bf16, forward ms, cuDNN / the default before (Triton rows below min_seq) / tiled / persistent, same run
# (hopper_rows_sweep.py gluonpersistent, h200_gluon_persistent_sweep.json; full, then causal):
#   D 128: 16 x 1024 0.266 / 0.271 / 0.325 / 0.256, 0.182 / 0.181 / 0.249 / 0.171; 8 x 2048 0.498 / 0.510 / 0.529 /
#   0.448, 0.305 / 0.323 / 0.343 / 0.287; 4 x 4096 0.952 / 0.952 / 0.967 / 0.917, 0.551 / 0.572 / 0.565 / 0.508;
#   1 x 16384 3.645 / 3.566 / 3.562 / 3.489, 2.015 / 1.889 / 1.884 / 1.889.
#   D 64: 16 x 1024 0.348 / 0.366 / 0.518 / 0.361, 0.230 / 0.265 / 0.408 / 0.239; 8 x 2048 0.647 / 0.699 / 0.801 /
#   0.675, 0.374 / 0.422 / 0.551 / 0.391; 4 x 4096 1.267 / 1.355 / 1.367 / 1.354, 0.669 / 0.762 / 0.828 / 0.703;
#   1 x 16384 4.873 / 4.977 / 4.968 / 5.126, 2.539 / 2.627 / 2.585 / 2.567 (tiled from 8192: the first row).
# CARRY (fwd_sm90._carried_tiles): two tiles' Q buffers, and the next tile's first q.k issued before a tile's last
# P.V. H200, forward ms, cuDNN / persistent without / with it, same process (hopper_rows_sweep.py gluoncarry,
# h200_gluon_carry_sweep.json "same_process"): D 64 4 x 4096 1.263 / 1.333 / 1.305, causal 0.696 / 0.707 / 0.673;
# 16 x 1024 0.345 / 0.372 / 0.350, causal 0.226 / 0.242 / 0.229. D 128 (not taken yet: its A/B across two processes
# read 3-5 % slower with it at long non-causal calls, the same process within 1 %): 4 x 4096 0.950 / 0.933 / 0.930,
# causal 0.556 / 0.527 / 0.475; 16 x 1024 0.267 / 0.260 / 0.241, causal 0.184 / 0.173 / 0.174; 1 x 16384 3.688 /
# 3.581 / 3.613.
# window: whether narrow windows (configs.NARROW_WINDOW; 16-bit, without dropout) take the row, only where it runs
# persistent (_launch.gluon_forward; else the "+window" Triton rows, whose short key loops beat the tiled Gluon grid:
# D 128 1 x 16384 x 16, ms, Triton / tiled Gluon (1024, 0) 0.358 / 0.369, (256, 256) 0.217 / 0.280). H200, forward ms,
# "+window" Triton rows / persistent Gluon CARRY 0 / 1 (hopper_rows_sweep.py gluonwindowcarry, twenty-fourth
# session): D 64 4 x 4096 x 32 (1024, 0) 0.440 / 0.389 / 0.383. D 128: not yet measured (the sweep's D 128 cases).
SM90_GLUON_FWD = [
    dict(head_dim=128, min_seq=0, BLOCK_N=128, STAGES=2, CONSUMER_REGS=240, dropout=True, PERSISTENT=1, window=False,
         num_warps=4),
    dict(head_dim=128, min_seq=4096, BLOCK_N=128, STAGES=2, CONSUMER_REGS=240, dropout=True, num_warps=4),
    dict(head_dim=64, min_seq=8192, BLOCK_N=128, STAGES=3, CONSUMER_REGS=232, dropout=False, num_warps=4),
    dict(head_dim=64, min_seq=0, BLOCK_N=128, STAGES=3, CONSUMER_REGS=232, dropout=False, PERSISTENT=1, CARRY=1,
         window=True, num_warps=4),
]
# The Gluon forward for fp8 inputs (kernels/fwd_sm90.py, P8_LOG2; V^T's keys in fwd.mma_order's order): which calls
# take it as SM90_GLUON_FWD's (its rule, _launch.gluon_forward). PINGPONG: the consumer groups take turns to issue,
# for calls without a band (_launch._forward_gluon: causal ones 1-4 % slower with it). H200, fp8 e4m3, D 128, 16 heads,
# forward ms, Triton fp8 rows / this row (h200_gluon_fp8_sweep2.json; ranges over it and the earlier runs of
# h200_pingpong_sweep.json, h200_fence_sweep.json, h200_tree_sweep.json): 1 x 16384 2.87-2.95 / 2.65-2.71, causal
# (no ping-pong) 1.49-1.53 / 1.35-1.38; 2 x 8192 1.481 / 1.361, causal 0.773 / 0.747; 4 x 4096 0.76-0.80 / 0.75-0.76,
# causal 0.43-0.45 / 0.46-0.47; 16 x 1024 0.24 / 0.31. D 64 4 x 4096 x 32 1.15-1.17 / 1.39, causal 0.65 / 0.84: the
# Triton rows. 3 stages (8-bit tiles take half the shared memory) within 3 %. PERSISTENT (the first row, where the
# call runs persistent: gluon_programs; each tile's descales), H200, forward ms, default (Triton fp8 rows below 8192,
# the tiled row above) / persistent / with CARRY (h200_gluon_fp8_persistent_sweep.json): 4 x 4096 0.779 / 0.684 /
# 0.724, causal 0.447 / 0.393 / 0.403; 16 x 1024 0.245 / 0.214 / 0.222, causal 0.189 / 0.157 / 0.164; 1 x 16384
# 2.696 / 2.584 / 2.686 (causal: not persistent, too many query blocks). D 64: 1-4 % slower than the Triton rows
# but 16 x 1024 x 32 with CARRY (0.334 against 0.341 ms).
# PINGPONG on the persistent grid (h200_gluon_fp8_pingpong_sweep.json, ms, without / with): 4 x 4096 0.693 / 0.698,
# 16 x 1024 0.213 / 0.217, 2 x 8192 1.317 / 1.355, 1 x 16384 2.592 / 2.693: off (it pays on the tiled grid only).
SM90_GLUON_FWD_FP8 = [
    dict(head_dim=128, min_seq=0, BLOCK_N=128, STAGES=2, CONSUMER_REGS=240, dropout=False, PINGPONG=False,
         PERSISTENT=1, num_warps=4),
    dict(head_dim=128, min_seq=8192, BLOCK_N=128, STAGES=2, CONSUMER_REGS=240, dropout=False, PINGPONG=True,
         num_warps=4),
]
# what tests/test_gluon_fwd.py's fp8 cases force (from any length): the tiled row, and D 64 without PINGPONG
SM90_GLUON_FWD_FP8_CANDIDATES = [
    dict(SM90_GLUON_FWD_FP8[1], min_seq=0),
    dict(head_dim=64, min_seq=0, BLOCK_N=128, STAGES=2, CONSUMER_REGS=240, dropout=False, num_warps=4),
]
# The Gluon dK/dV (kernels/bwd_sm90.py: lse and delta through TMA, each warp group's softmax beside its other
# product), which calls take it: jax_flash_amd/_launch.py gluon_dkdv, from min_seq queries and keys. 128 keys per
# program, BLOCK_M queries per step; DS: on the dS path (dK/dV also stores dS^T). H200, bf16, whole backward ms,
# Triton rows / this (h200_gluon_dkdv_sweep.json): D 128 (dS path) 16 x 1024 x 16 0.999 / 0.916, causal 0.756 /
# 0.698; 4 x 4096 3.302 / 2.828, causal 1.935 / 1.589; 1 x 16384 13.05 / 10.88, causal 6.65 / 5.63. D 64 (seven
# products; on the dS path 7-13 % slower) 4 x 4096 x 32 4.145 / 3.978, causal 2.365 / 2.317; 1 x 16384 16.01 /
# 14.92, causal 8.72 / 7.98; but 16 x 1024 1.192 / 1.269, causal 0.824 / 0.979 (the Triton row runs persistent
# there). 3 stages: within 3 % either way. dropout: whether calls with dropout take it (sm90 ptxas 244 / 328 bytes of
# spills full / causal at D 128); H200, bf16, p 0.1, whole backward ms, Triton rows / this (gluondropout): D 128
# 4 x 4096 x 16 3.87 / 3.36, causal 2.25 / 2.04, 1 x 16384 15.16 / 13.22; D 64 causal 4 x 4096 x 32 3.47 / 3.16
# (64-query steps). D 64 at 128-query steps (sm90 ptxas: 0-24 bytes of spills full, 308 causal), whole backward ms,
# 64 / 128 (2 stages) / 128 (3 stages) (h200_gluon_dkdv64_sweep.json): 4 x 4096 x 32 3.889 / 3.510 / 3.531, causal
# 2.320 / 2.133 / 2.140; 1 x 16384 14.45 / 13.21 / 13.25, causal 7.947 / 7.291 / 7.287; 16 x 1024 1.259 / 1.150 /
# 1.139 (Triton rows 1.167), causal 0.981 / 0.925 / 0.939 (Triton rows 0.827). With dropout not measured: those calls
# keep 64-query steps (the first row of the call's head dim and lengths that takes its dropout).
# PERSISTENT (programs per SM; kernels/bwd_sm90.py N_ROWS): a persistent grid, descriptors made once, the ring and two
# tiles' K / V buffers carried across tiles (sm90: 214 KB of shared memory at D 128), taken only where the call runs
# persistent (_launch.gluon_programs with keys: whole blocks, balanced; narrow windows at any length), else the next
# row. For the windows' short query loops (a tiled program's fixed cost: nine descriptors, K / V's load, the ring's
# fill, dK / dV's store). No row has it yet: not measured (hopper_rows_sweep.py gluondkdvpersistent).
# SPANS: each consumer group passes over the query steps that see none of its keys (narrow windows only:
# _launch._dkdv_gluon; 1 of each group's 18 steps at (1024, 0)). No row has it yet (gluondkdvspans).
SM90_GLUON_DKDV = [
    dict(head_dim=128, min_seq=0, BLOCK_M=64, STAGES=2, CONSUMER_REGS=240, DS=True, dropout=True, num_warps=4),
    dict(head_dim=64, min_seq=4096, BLOCK_M=128, STAGES=2, CONSUMER_REGS=240, DS=False, dropout=False, num_warps=4),
    dict(head_dim=64, min_seq=4096, BLOCK_M=64, STAGES=2, CONSUMER_REGS=240, DS=False, dropout=True, num_warps=4),
]
# The Gluon dQ of the seven-product path (kernels/bwd_sm90.py attn_bwd_dq_sm90: the forward's partitions, S and dP
# issued together), which calls take it: jax_flash_amd/_launch.py gluon_dq. None: the candidates are correct on the
# H200 (tests/test_gluon_bwd.py's gluon-dq cases) but no faster than the Triton dQ rows; bf16, whole backward ms,
# default / with them (hopper_rows_sweep.py gluondq): D 64 4 x 4096 x 32 3.90 / 3.98, causal 2.31 / 2.50; 16 x 1024
# causal 0.816 / 0.977; D 128 the same (its calls take the dS path, whose dQ is attn_bwd_dq_ds).
SM90_GLUON_DQ = []
SM90_GLUON_DQ_CANDIDATES = [
    dict(head_dim=64, min_seq=0, BLOCK_N=128, STAGES=2, CONSUMER_REGS=240, dropout=True, num_warps=4),
    dict(head_dim=128, min_seq=0, BLOCK_N=64, STAGES=2, CONSUMER_REGS=240, dropout=True, num_warps=4),
]
# _launch.py persistent_programs: the busiest program's work / when the tiled grid would finish, at most
# (causal D 128 forward ms, tiled / persistent: 1 x 2048 x 16 0.083 / 0.066, whose fixed schedule is 1.47x the
# mean work but 0.93x the tiled grid's finish (its last wave); 1 x 4096 x 16 0.198 / 0.221 and 1 x 16384 x 16
# 2.22 / 3.03: 1.19x and 1.53x the tiled grid's finish). Those tiled grids ran row-major; in TILED_GROUP_PROGRAMS'
# groups 1 x 2048 x 16 is as balanced tiled, which the rule now takes: 0.080 / 0.061 against persistent's 0.089 /
# 0.071 (two runs each, same process order)
PERSISTENT_BALANCE = 1.05
# and with a band (causal, a window wider than NARROW_WINDOW) at most this many query blocks per row: forward
# ms, D 128, causal, tiled / persistent: 64 x 512 x 16 0.338 / 0.225, 2 x 2048 0.119 / 0.091, 4 x 4096 0.643 /
# 0.611 (32 blocks), 2 x 32768 16.8 / 18.3, 1 x 65536 33.4 / 36.7, 1 x 131072 132 / 150 (without a band: 1 x
# 32768 15.71 / 15.60). Narrow windows: persistent at every length ("fwd+window" below).
PERSISTENT_BANDED_BLOCKS = 32
# The band's masked edge blocks in a launch of their own (kernels/fwd.py, bwd.py EDGES; which calls:
# _launch.py edges_apart): a TMA row's one warp-specialised loop masks every block of a band (Triton 3.6 takes
# neither a second loop nor a branch in it). What that costs, H200, bf16, Nsight Compute, kernel ms, whole blocks
# unmasked / every block masked (a band that hides one pair) / causal: forward D 128 1 x 16384 x 16 3.55 / 3.94
# / 1.99 (cuDNN causal 1.72), 4 x 4096 x 16 0.91 / 1.01 / 0.54; dK/dV D 64 (seven products) 1 x 16384 x 32 7.92 /
# 10.59 / 5.37, 4 x 4096 x 32 2.02 / 2.66 / 1.40 (cuDNN's whole causal backward 6.06 and 1.78 ms). The edges
# apart cost a second launch and a float32 partial result (written and read once: per token, not per pair), so
# they pay on long loops only (benchmarks/hopper_rows_sweep.py edges, H200, bf16, causal, ms, apart / together):
# D 64 backward (32 heads) 16 x 1024 0.947 / 0.743, 8 x 2048 1.380 / 1.211, 4 x 4096 2.276 / 2.234, 1 x 16384
# 7.627 / 8.404; D 128 forward (16 heads; tiled, where it is not persistent) 16 x 1024 0.371 / 0.181 (persistent),
# 4 x 4096 0.723 / 0.605 (persistent), 1 x 16384 2.172 / 2.219; window (1024, 0) D 128 backward 1.373 / 1.146.
# Taken where a row's loop runs at least this many blocks.
EDGES_APART_BLOCKS = 64
# The same on the dS path (D 128, 64-query blocks), whose edge launch also stores its dS tiles and whose TMA launch
# then spills 140 bytes (sm90 ptxas; 8 with bf16 dK / dV instead of the float32 partial). Whole backward, H200, bf16,
# causal, 16 heads, ms, one launch / apart (the TMA launch alone, without the edges: the bound): 16 x 1024 0.743 /
# 1.007 (16 blocks), 4 x 4096 1.967 / 2.083 (1.754; 64 blocks), 1 x 16384 7.09 / 6.69 (6.32; 256 blocks). The edge
# launch costs ~0.35 ms at both lengths (2048 programs of two 64 x 128 tiles, pointer loads, 320 bytes of spills).
DS_EDGES_APART_BLOCKS = 256
# A tiled grid of a causal call (a band bounded on the right only; windows' blocks are of about equal work) takes its
# (batch x heads) rows in groups of about this many programs, each group block-major: every row's heaviest block
# first, then the next (masking.tile_order). The GPU starts programs in launch order, so the heavy ones start first
# and the last wave is light. Row-major, the last row's heaviest block started late: greedy dispatch of the causal
# grouped-query dK/dV grid (4 x 4096, 8 key-value heads of 4, 128-key blocks, 132 SMs at one program each) finishes
# 1.14x its mean work, grouped 1.00x; the D 64 forward's (4 x 4096 x 32 and 1 x 16384 x 32, 128 queries, two programs
# per SM) 1.08x and 1.06x, grouped 1.00x. Measured, H200, bf16, causal, ms, row-major / grouped (two runs each, same
# process order): grouped-query 4 x 4096 x 32 / 8 heads D 128 backward 4.79, 4.81 / 4.23, 4.19; D 64 forward 4 x 4096
# x 32 0.806, 0.813 / 0.778, 0.773, 1 x 16384 x 32 2.890, 2.885 / 2.746, 2.746; D 128 1 x 2048 x 16 backward 0.192,
# 0.208 / 0.133, 0.150 (with 256 for dK/dV too, as in the rest of these). Not changed: D 128 4 x 4096 x 16 and x
# 32 (backward 1.97 / 1.97, 4.44 / 4.43; the model expected 3-7 % at x 16), 16 x 1024 x 16, and calls without a band
# (the same code). A group's rows share L2 (their Q / dO or K / V), so groups stay about a wave or two: the D 128 TMA
# dK/dV row (one program per SM) takes 128 (GROUP_PROGRAMS below).
TILED_GROUP_PROGRAMS = 256
# the edge launch's compiler options (its blocks are the TMA row's: the two split each tile's blocks)
EDGE_OPTIONS = {"fwd": dict(num_warps=8, num_stages=2), "dkdv": dict(num_warps=8, num_stages=1)}
# Backward, D 128, bf16, H200, per kernel (standalone prototypes of the same loops, 4 x 4096 x 16 / 1 x 16384
# x 16, non-causal; causal): dK/dV 64 x 128 x 4 warps x 2 stages with every tile through TMA and the query
# loop warp-specialised 1.63 / 6.62 ms (0.96 / 3.59) against 2.30 / 9.57 (1.22 / 4.27) for the pointer row's
# tiles; with lse and delta pointer-loaded in the loop 2.00 / 7.71 (shipped since the tenth session: through 1-D
# descriptors the warp-specialised kernels returned NaN under contention, NOTES; loaded before the q / dO tiles
# where no block is masked, the whole backward 5-7 % faster since the twelfth session); 8 warps is not specialised (2.60);
# 128 x 128 and 64 x 64 2-3x slower. dQ: K and V through TMA without warp specialisation 1.33 / 5.37 ms
# against 1.42 / 5.96 (warp-specialised 64 x 64: 2.31, 128-query tiles fail to compile in Triton 3.6).
# DS: the dS path (kernels/bwd.py; _launch.backward, where DS_WORKSPACE_BYTES allows): dK/dV also stores dS^T,
# and dQ is one product from it (attn_bwd_dq_ds) instead of three. Standalone prototypes (H200, bf16, ms,
# dK/dV loop alone / with the store + torch's bmm for dQ; 4 x 4096 x 16 x 128: 1.64 / 1.90 + 0.54, causal
# 0.96 / 1.14 + 0.55 (bmm over the whole square); 1 x 16384 x 16 x 128: 6.13 / 7.88 + 2.00, causal 3.23 /
# 4.19 + 2.01; D 64, 4 x 4096 x 32: 2.07 / 2.65 + 1.01), against 1.33 / 5.37 ms (causal 0.83 / 3.06) for the
# dQ kernel's three products at D 128. The store through TMA: pointer stores were no faster and returned
# NaN once under warp specialisation (Triton 3.6). Shipped (benchmarks.attention, same run): D 128 backward /
# cuDNN 1.01 / 0.95 / 0.91 at N 1024 / 4096 / 16384 (causal 0.94 / 0.92 / 0.86), was 0.89 / 0.86 / 0.81 (0.92 /
# 0.82 / 0.79) with seven products.
# GROUP_PROGRAMS (masking.tile_order): one program per SM here, so groups of ~one wave; causal 1 x 16384 x 16
# (128 key blocks, rows then one at a time, as before groups) whole backward 6.72 / 6.74 ms, with 256 (two rows a
# group) 6.88 / 6.85; grouped-query causal 4 x 4096 x 32 / 8 heads 4.79 / 4.81 before groups, 4.23 / 4.19 with 256
_SM90_DKDV_TMA = dict(max_block_d=128, max_itemsize=2, BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2, TMA=True,
                      WARP_SPECIALIZE=True, DS=True, GROUP_PROGRAMS=128)
_SM90_DQ_TMA = dict(max_block_d=128, max_itemsize=2, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, TMA=True)
# D 33-64 (benchmarks/hopper_rows_sweep.py, H200, bf16, 32 heads, whole backward in ms against the pointer
# rows', N 1024 / 4096 / 16384): dQ through TMA 64 x 64 x 4 x 3 1.17 / 4.10 / 15.84 vs 1.22 / 4.33 / 16.81
# (causal 0.84 / 2.40 / 8.78 vs 0.85 / 2.51 / 8.99; 2 stages the same, 128 x 32 and 128 x 64 slower); dK/dV
# TMA + WS 128 x 128 x 4 x 2 1.25 / 4.05 / 15.46 (causal 0.97 / 2.53 / 8.77): faster from N 4096 but for
# causal N 4096, slower at N 1024 (causal: 15 %, the loops are 1-8 blocks long and all masked); 64 x 128 and
# 64 / 128 x 64 slower. (The D 64 forward: _SM90_FWD64_TMA above.)
# D <= 32 keeps the pointer rows (not measured with TMA: min_block_d).
# No dS path at D 64: the store spills there (sm90 ptxas: 56-112 bytes at 168 registers) and the backward / cuDNN
# fell from 0.90 / 0.90 / 0.90 to 0.87 / 0.79 / 0.80 (N 1024 / 4096 / 16384; causal 0.86 / 0.81 / 0.77 to 0.80 /
# 0.68 / 0.69): half the products per byte of dS.
# PERSISTENT=1 (kernels/bwd.py: one program per SM looping over key blocks, heaviest first, where
# _launch.py persistent_programs finds the schedule balanced): whole backward ms, H200, bf16, 32 heads, tiled /
# persistent (benchmarks/hopper_rows_sweep.py dkdvpersistent, dkdvpersistent2048): 16 x 1024 1.178 / 1.050,
# causal 0.953 / 0.733; 8 x 2048 2.057 / 1.887, causal 1.433 / 1.272; 4 x 4096 3.785 / 3.649, causal 2.422 /
# 2.275; 1 x 16384 14.19 / 13.97, causal 8.36 / 8.37 (128 key blocks: tiled). It saves each tile's fixed cost (K
# and V loads, the pipeline's fill, dK and dV's stores: 12 warps and 168 registers leave one program per SM,
# so nothing overlaps them). Not the D 128 dS row: persistent, it returned NaN on the H200 (tests/test_sm90.py,
# 2 x 512 x 4, 5 and 13 programs; Triton 3.6) though it matched the tiled row in the sweep (N 1024: 0.882 /
# 0.917 ms, causal 0.613 / 0.680; N 4096 2.99 / 2.92 with 80-112 bytes of spills), so _launch._dkdv runs
# the dS path tiled whatever the row says.
# Not shipped since the tenth session, a candidate only: warp-specialised, this row returned NaN dK and dV in 42 of
# 600 calls with 16 processes sharing the H200, and in every call under compute-sanitizer (NOTES "Tenth session",
# benchmarks/hopper_ws_sanitizer_probe.py); with lse and delta through pointers (which cured the D 128 row) Triton
# 3.6's warp-specialisation pass asserts. Without warp specialisation (8 warps) it is right under both; D 64 takes
# the pointer row.
_SM90_DKDV64_TMA = dict(_SM90_DKDV_TMA, max_block_d=64, min_block_d=64, BLOCK_M=128, DS=False, PERSISTENT=1,
                        WARP_SPECIALIZE=False, num_warps=8)
_SM90_DQ64_TMA = dict(_SM90_DQ_TMA, max_block_d=64, min_block_d=64, num_stages=3)


# dropout, D 128: since the per-element hash (kernels/dropout.py) the TMA row (_SM90_DKDV_TMA, warp-specialised, dS
# path) takes dropout; H200, bf16, p 0.1, whole backward ms, full / causal at 4 x 4096 x 16, full at 1 x 16384 x 16
# (benchmarks/hopper_rows_sweep.py dropouttma): 3.90 / 2.25 / 15.3 (256 / 312 bytes of spills, sm90 ptxas) against
# 4.13 / 2.31 / 16.0 for this pointer row with the hash; warp-specialised 32 x 128 x 4 x 2 (no spills) 4.62 / 2.15 /
# 18.3, 3 stages 4.54 / 2.22 / 18.2, 64 x 64 6.91, 32 x 64 8.03, 32 x 128 x 8 warps unspecialised 5.88 (full, N
# 4096). This row, for the calls that cannot take TMA: the pointer row's tiles on the dS path, so
# that each tile's keep mask is drawn once (dK/dV) instead of twice and dQ is one product instead of three. H200,
# bf16, p 0.1, whole backward ms, full / causal at 4 x 4096 x 16, full at 1 x 16384 x 16 (benchmarks/
# hopper_rows_sweep.py dropoutds, one run, Philox): seven products 5.01 / 2.74 / 19.5, this row 4.44 / 2.40 / 17.7; with
# the dS path 32 x 64 x 4 x 2 4.87 / 2.47 / 19.4, 64 x 64 x 4 x 2 4.88 / 2.51 / 19.0, 64 x 128 x 8 x 2 5.04 / 2.68 /
# 21.0, 64 x 64 x 4 x 3 (524 bytes of spills) 7.13, 32 x 64 x 8 x 3 9.45, 32 x 128 x 4 x 3 13.2 (full, N 4096).
# D 64 (its pointer row's tiles, 32 x 128 x 4 x 3: 7.62 / 3.97 ms at 4 x 4096 x 32) with the dS path: 32 x 64 x 4
# x 3 6.58 / 4.07, 64 x 64 x 4 x 3 7.32 / 4.06, 32 x 128 7.33 / 4.28: faster full only, not shipped
_SM90_DKDV_DROPOUT = dict(next(r for r in _CUDA_TARGET["dkdv+dropout"] if r["max_block_d"] == 128), min_block_d=128,
                          max_itemsize=2, DS=True)

# the dS path's dQ (attn_bwd_dq_ds: a product from memory, 16-bit, power-of-two heads up to 128); its tiles: CANDIDATES
_SM90_DQ_DS = dict(max_block_d=128, max_itemsize=2, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
# the most memory the dS path's workspace (16-bit dS of seq_k x seq_q per head, or of seq_k x the band for windows:
# DS_BAND_BLOCK) may take per launch; a call
# needing more runs by groups of heads, or, where one head's does not fit, takes the seven-product path
DS_WORKSPACE_BYTES = 2 << 30
# A band bounded on both sides (a window) lays the workspace out banded (kernels/bwd.py ds_tiles, ds_col): a key's
# row holds the queries from the first block of this many that can see its group of this many keys, so every dS-path
# row's blocks must be at most this (powers of two: they divide it; _launch._ds_heads and _backward_ds check).
# kernels/bwd.py reads it once, at import
DS_BAND_BLOCK = 128
# the dS path's dQ for narrow windows (short key spans: 9 blocks of 128 keys at (1024, 0)); whole backward, H200,
# bf16, window (1024, 0), D 128, 16 heads, ms, 1 x 16384 / 4 x 4096 (benchmarks/hopper_rows_sweep.py windowds): seven
# products ("dkdv+window", what windows took before) 1.277 / 1.191; dS path with _SM90_DQ_DS 1.246 / 1.154 (whole
# rows then, one launch), with this row 1.192 / 1.082, 64 x 128 x 4 x 3 1.333 / 1.233. Shipped, banded, against seven
# products (windowbanded): (1024, 0) 1.167 / 1.075 against 1.264 / 1.171; (256, 256), 1 x 16384, 0.779 against 0.846;
# a wide window, (4096, 0) at 1 x 16384 (plain rows, dQ 128 x 128), 3.62 against 3.52 (whole rows by 4 heads before)
_SM90_DQ_DS_WINDOW = dict(_SM90_DQ_DS, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)


def _sm90(rows, *tma_rows):
    """CUDA rows with each TMA row in front of the pointer row of its width (which serves the calls that
    cannot take TMA: kernels/fwd.py, bwd.py)."""
    rows = list(rows)
    for tma in tma_rows:
        rows.insert(next(i for i, r in enumerate(rows) if r["max_block_d"] == tma["max_block_d"]), tma)
    return rows


_SM90_TARGET = {**_CUDA_TARGET, "fwd": _sm90(_CUDA["fwd"], _SM90_FWD_TMA, _SM90_FWD64_TMA),
                "dkdv": _sm90(_CUDA["dkdv"], _SM90_DKDV_TMA),
                # grouped heads: the same row at D 128 (32 query / 8 key-value heads: backward 0.96-0.97x MHA's,
                # H200); D 64 not measured with GQA
                "dkdv+gqa": _sm90(_CUDA_TARGET["dkdv+gqa"], _SM90_DKDV_TMA),
                "dq": _sm90(_CUDA["dq"], _SM90_DQ_TMA, _SM90_DQ64_TMA),
                # window (1024, 0), N 16384, D 128 (the variants case): backward 1.20 ms with dK/dV through
                # TMA + WS 64 x 128, 1.22 with dQ's TMA row, 1.26 with both "+window" pointer rows; the
                # forward's TMA row is no faster there (0.399 vs 0.397 ms: every block of a band is masked)
                # window (1024, 0), D 128, forward ms, "+window" pointer row / the TMA row tiled / persistent
                # (benchmarks/hopper_rows_sweep.py windowpersistent, windowany): 1 x 16384 x 16 0.403 / 0.398 /
                # 0.361, 2 x 8192 0.394 / 0.392 / 0.347, 4 x 4096 0.368 / 0.375 / 0.317: the TMA row where it
                # runs persistent (its short key ranges: at any length, _launch.persistent_programs)
                "fwd+window": _sm90(_CUDA_TARGET["fwd+window"], dict(_SM90_FWD_TMA, persistent_only=True)),
                # on the dS path, its workspace banded (DS_BAND_BLOCK)
                "dkdv+window": _sm90(_CUDA_TARGET["dkdv+window"], _SM90_DKDV_TMA),
                # dropout: the D 128 TMA row only (kernels/dropout.py's hash); D 64's persistent TMA row was slower
                # with it (H200, bf16, p 0.1, forward ms, pointer row / TMA row: 16 x 1024 x 32 0.642 / 0.666, causal
                # 0.395 / 0.534; 4 x 4096 x 32 2.403 / 2.487; hopper_rows_sweep.py dropoutfwd64)
                "fwd+dropout": _sm90(_CUDA["fwd"], _SM90_FWD_TMA),
                "dkdv+dropout": _sm90(_CUDA_TARGET["dkdv+dropout"], _SM90_DKDV_DROPOUT, _SM90_DKDV_TMA),
                "dqds": [_SM90_DQ_DS],
                "dqds+window": [_SM90_DQ_DS_WINDOW],
                "dq+window": _sm90(_CUDA_TARGET["dq+window"], _SM90_DQ_TMA)}


TARGETS = {
    # NVIDIA sm80 and later (H100/H200 measured)
    "cuda": _CUDA_TARGET,
    # Hopper (sm90: H100/H200): the CUDA rows, but 16-bit calls at D 33-128 through TMA descriptors, the
    # forward and dK/dV with warp specialisation (at D 33-64 the forward only where it runs persistent and,
    # causal, up to 1024 queries, and dK/dV not at all: its pointer row) (kernels/fwd.py, bwd.py;
    # which calls: jax_flash_amd/_launch.py _takes_tma). tests/test_sm90.py runs every TMA row on the GPU.
    "sm90": _SM90_TARGET,
    "gfx90a": _hip("gfx90a"),  # MI200: 64 KiB LDS
    "gfx942": _hip("gfx942"),  # MI300: 64 KiB LDS
    "gfx950": _hip("gfx950"),  # MI350: 160 KiB LDS (128 x 128 forward tiles spill ~500 bytes/lane at D 128)
    # Triton's interpreter on CPU (tests): small unequal blocks, so ragged, diagonal and unmasked
    # blocks all occur at test sizes.
    "interpret": {
        "fwd": [dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)],
        # heads up to 64 wide (16-bit) one dK/dV program per key block, wider ones SPLIT: tests run both
        "dkdv": [dict(max_block_d=64, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
                 dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, SPLIT=True, num_warps=4, num_stages=1)],
        "dq": [dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)],
        "dqds": [dict(max_block_d=512, BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)],
        "keys_last": [dict(max_block_d=512, BLOCK_N=16, num_warps=4, num_stages=1)],
        # other blocks for narrow windows, so the tests run the "+window" selection too (and the forward's
        # EDGES_FIRST order, which the AMD rows take)
        "fwd+window": [dict(max_block_d=512, BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, EDGES_FIRST=True)],
        "dkdv+window": [dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)],
        "dq+window": [dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)],
        # and for dropout: 16 and 32 keys (which the Philox draw of before needed: 32-key groups)
        "dkdv+dropout": [dict(max_block_d=512, BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)],
        "dq+dropout": [dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)],
    },
}


# Opt-in autotuning (jax_flash_amd.autotune) times these per kernel: at most 8 per head width, rows in
# the TARGETS format. Tuples are (BLOCK_M, BLOCK_N, num_warps, num_stages); HIP rows add their options.
def _rows(max_block_d, tuples, **options):
    return [dict(max_block_d=max_block_d, BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s, **options)
            for m, n, w, s in tuples]


_CUDA_FWD = [(128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
_CUDA_DKDV = [(32, 128, 4, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3),
              (64, 64, 8, 2), (128, 128, 8, 2)]
_CUDA_DQ = [(128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 8, 3), (128, 64, 4, 2),
            (64, 128, 8, 2), (64, 64, 4, 4)]
_HIP_BWD = dict(waves_per_eu=1, matrix_instr_nonkdim=16)


def _hip_candidates():
    return {
        "fwd": (_rows(64, [(128, 64, 4, 1), (128, 128, 4, 1), (64, 64, 4, 1), (128, 64, 8, 1), (128, 32, 4, 1)],
                      waves_per_eu=2)
                + _rows(128, [(128, 64, 8, 1), (128, 32, 4, 1), (128, 64, 4, 1), (64, 64, 4, 1), (128, 128, 8, 1),
                              (64, 32, 4, 1)], waves_per_eu=2)
                + _rows(256, [(128, 64, 4, 1), (128, 32, 4, 1), (64, 64, 4, 1), (64, 32, 4, 1), (128, 32, 8, 1)],
                        waves_per_eu=1)
                + _rows(512, [(32, 32, 4, 1), (32, 16, 4, 1)], waves_per_eu=1)),
        "dkdv": (_rows(128, [(32, 128, 4, 1), (16, 128, 4, 1), (32, 64, 4, 1), (64, 64, 4, 1), (64, 128, 8, 1),
                             (16, 64, 4, 1)], **_HIP_BWD)
                 + _rows(256, [(16, 64, 4, 1), (32, 64, 8, 1), (16, 32, 4, 1)], **_HIP_BWD)
                 + _rows(512, [(16, 32, 4, 1), (16, 16, 4, 1)], **_HIP_BWD)),
        "dq": (_rows(128, [(128, 32, 4, 1), (64, 32, 4, 1), (128, 16, 4, 1), (64, 64, 4, 1), (128, 64, 8, 1),
                           (32, 32, 4, 1)], **_HIP_BWD)
               + _rows(256, [(64, 16, 4, 1), (32, 32, 4, 1), (64, 32, 8, 1)], **_HIP_BWD)
               + _rows(512, [(32, 16, 4, 1), (16, 16, 4, 1)], **_HIP_BWD)),
    }


_CUDA_CANDIDATES = {
    "fwd": (_rows(64, [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3),
                       (64, 128, 4, 3)])
            + _rows(128, _CUDA_FWD)
            + _rows(256, [(128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 3), (128, 32, 8, 2)])
            + _rows(512, [(64, 32, 4, 1), (32, 32, 4, 1), (64, 16, 4, 1)])),
    "dkdv": (_rows(64, _CUDA_DKDV) + _rows(128, _CUDA_DKDV)
             + _rows(256, [(32, 128, 8, 2), (64, 128, 8, 1), (32, 64, 4, 3)], SPLIT=True, max_itemsize=2)
             + _rows(256, [(32, 64, 8, 2), (16, 64, 4, 2)])
             + _rows(512, [(16, 32, 4, 1), (16, 16, 4, 1)])),
    "dq": (_rows(64, _CUDA_DQ) + _rows(128, _CUDA_DQ)
           + _rows(256, [(128, 32, 8, 2), (128, 32, 8, 1), (128, 16, 8, 2)], max_itemsize=2)
           + _rows(256, [(64, 32, 8, 2), (32, 32, 4, 2)])
           + _rows(512, [(32, 16, 4, 1), (16, 16, 4, 1)])),
}


def _with_tma(rows, tma_rows):
    """Candidates with the TMA rows first, each in place of the last row of its width where that has 8
    already (autotuning times at most 8 per width)."""
    rows = list(rows)
    for tma in tma_rows:
        same = [r for r in rows if r["max_block_d"] == tma["max_block_d"] and "max_itemsize" not in r]
        if len(same) >= 8:
            rows.remove(same[-1])
    return tma_rows + rows


CANDIDATES = {
    "cuda": _CUDA_CANDIDATES,
    "sm90": {**_CUDA_CANDIDATES, "fwd": _with_tma(_CUDA_CANDIDATES["fwd"], [_SM90_FWD_TMA]),
             "dkdv": _with_tma(_CUDA_CANDIDATES["dkdv"], [_SM90_DKDV64_TMA, _SM90_DKDV_TMA]),
             "dq": _with_tma(_CUDA_CANDIDATES["dq"], [_SM90_DQ64_TMA, _SM90_DQ_TMA]),
             # H200, bf16, whole backward on the dS path, ms non-causal / causal (benchmarks/hopper_rows_sweep.py
             # ds, ds16k; each set one run): 4 x 4096 x 16 x 128: 128 x 64 x 8 x 3 2.909 / 1.745, 64 x 64 x 4 x 3
             # 2.891 / 1.680, 128 x 128 x 8 x 3 (shipped since) 2.857 / 1.703, 64 x 128 x 4 x 3 2.994 / 1.801;
             # 1 x 16384 x 16 x 128: 128 x 64 13.26 / 6.63, 64 x 64 13.24 / 6.68, 128 x 128 12.82 / 6.58
             "dqds": [_SM90_DQ_DS, dict(_SM90_DQ_DS, BLOCK_N=64),
                      dict(_SM90_DQ_DS, BLOCK_M=64, BLOCK_N=64, num_warps=4)]},
    "gfx90a": _hip_candidates(),
    "gfx942": _hip_candidates(),
    "gfx950": _hip_candidates(),
    # two each, so the tuning path itself is tested on the CPU
    "interpret": {
        "fwd": _rows(512, [(32, 16, 4, 1), (16, 32, 4, 1)]),
        "dkdv": _rows(512, [(16, 32, 4, 1), (32, 16, 4, 1)]),
        "dq": _rows(512, [(32, 16, 4, 1), (16, 16, 4, 1)]),
    },
}


# ----- KV-cache attention (kernels/decode.py, jax_flash_amd/kvcache.py) -----
# "decode": BLOCK_M is the most packed query rows (query heads of a group x positions) one program holds
# (a launch takes the smallest power of two >= 16 that holds them all, up to this), BLOCK_N the keys per
# step (paged caches: at most the largest power of two dividing the page size, at least 16); rows_per_warp,
# where given, caps num_warps at BLOCK_M // rows_per_warp (kvcache.plan).
# "decode+paged", where a target has it, for paged caches. "decode_combine": BLOCK_M (position, head) rows
# merged per program. "kv_append": BLOCK_N new positions.
# DECODE_SPLITS: the split-KV rule's data (kvcache.num_splits): key splits per (batch, kv head, row
# block) = min(max_splits, keys // (BLOCK_N * min_blocks_per_split), cus * programs_per_cu // programs),
# at least 1. cus: the GPU's SMs / CUs when the device does not report them (H200 132; MI250X GCD 110,
# MI300X 304, MI355X 256).
_DECODE_AUX = {
    "decode_combine": [dict(max_block_d=512, BLOCK_M=16, num_warps=4, num_stages=1)],
    "kv_append": [dict(max_block_d=512, BLOCK_N=32, num_warps=4, num_stages=1)],
}


def _hip_decode():
    # rows_per_warp: a launch takes num_warps = min(num_warps, BLOCK_M // rows_per_warp): each wave its own
    # 16-row strip of 16x16 MFMAs. More waves than strips compute the same S and exponentials again
    # (amd_report, gfx942, D 128: 2.5x the MFMA work at BLOCK_M 16 with 4 waves); one wave per 16 rows
    # with 32 keys per step holds gfx942 at 2 waves/SIMD (64 keys: 256 VGPRs, 1 wave).
    hip = dict(num_stages=1, rows_per_warp=16, matrix_instr_nonkdim=16)
    return {
        "decode": [
            dict(max_block_d=64, BLOCK_M=64, BLOCK_N=32, num_warps=4, waves_per_eu=2, **hip),
            dict(max_block_d=128, BLOCK_M=64, BLOCK_N=32, num_warps=4, waves_per_eu=2, **hip),
            dict(max_block_d=256, BLOCK_M=32, BLOCK_N=32, num_warps=2, waves_per_eu=1, **hip),
            dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=1, waves_per_eu=1, **hip),
        ],
        **_DECODE_AUX,
    }


_CUDA_DECODE = [
    dict(max_block_d=64, BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
    dict(max_block_d=128, max_itemsize=2, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    # float32 (FMA dots, tiles in registers; sm90 ptxas: 64 x 64 at D 64 spills 4 KB, 32 x 32 at D 128 0.5-1.8 KB)
    dict(max_block_d=128, BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=3),
    dict(max_block_d=256, max_itemsize=2, BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=3),
    dict(max_block_d=256, BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=3),
    dict(max_block_d=512, BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2),
]

DECODE = {
    "cuda": {
        "decode": _CUDA_DECODE,
        # paged: the pipeliner gives the block-table load stages of its own (sm90 TTGIR, triton 3.6 and 3.9:
        # one K/V buffer at 2-4 stages, two from 5), so two more stages keep as many K/V tiles in flight
        "decode+paged": [dict(r, num_stages=r["num_stages"] + 2) for r in _CUDA_DECODE],
        **_DECODE_AUX,
    },
    "gfx90a": _hip_decode(),
    "gfx942": _hip_decode(),
    "gfx950": _hip_decode(),
    # the interpreter: small blocks, so tests see several row blocks, splits and pages
    "interpret": {
        "decode": [dict(max_block_d=512, BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)],
        "decode_combine": [dict(max_block_d=512, BLOCK_M=16, num_warps=4, num_stages=1)],
        "kv_append": [dict(max_block_d=512, BLOCK_N=16, num_warps=4, num_stages=1)],
    },
}
DECODE_SPLITS = {
    "cuda": dict(cus=132, programs_per_cu=2, max_splits=64, min_blocks_per_split=8),
    "sm90": dict(cus=132, programs_per_cu=2, max_splits=64, min_blocks_per_split=8),  # H100 / H200
    # AMD: a decode program is one wave (rows_per_warp); 8 fill a CU at 2 waves per SIMD
    "gfx90a": dict(cus=110, programs_per_cu=8, max_splits=64, min_blocks_per_split=8),
    "gfx942": dict(cus=304, programs_per_cu=8, max_splits=64, min_blocks_per_split=8),
    "gfx950": dict(cus=256, programs_per_cu=8, max_splits=64, min_blocks_per_split=8),
    "interpret": dict(cus=2, programs_per_cu=2, max_splits=8, min_blocks_per_split=1),
}
DECODE["sm90"] = DECODE["cuda"]
for _target, _rows_of in DECODE.items():
    TARGETS[_target].update(_rows_of)
