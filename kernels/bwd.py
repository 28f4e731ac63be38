"""Backward kernels: dQ (loop over key blocks; also writes delta), then dK/dV (loop over query blocks); or,
on the dS path (below), dK/dV storing dS, then dQ from it.

attn_bwd_dq, attn_bwd_dkdv, attn_bwd_dq_ds: no atomics, every output block is written by exactly one program, so
gradients are deterministic. attn_bwd_dkdv_dq (the plan's linear backward, opt-in) adds dQ from dK/dV's programs
into a float32 buffer of Q's size instead: by atomics, or deterministic in key-block order (_add_dq).
SPLIT (wide heads): dV and dK come from separate programs (grid axis 2), each holding one fp32
accumulator instead of two; both compute P (five matrix products per tile instead of four).
With p = exp(s - lse):  dV = P^T dO,  dS = P * (dO V^T - delta),  dQ = scale dS K,  dK = scale dS^T Q,
where delta = rowsum(dO * O) - dLse (a cotangent on lse adds P * dLse to dS).
Layouts as in fwd.py; Lse (base 2, as the forward writes it), dLse (the cotangent of the natural lse),
Delta are (batch, H, seq_q) fp32. Grouped-query attention: a dK/dV
program owns one key/value head and sums over the H // KV_H query heads that read it (in its loop, so
still no atomics).
Dropout (dropout.py) regenerates the forward's keep mask: with Pd = P * keep * keep_scale,
dV = Pd^T dO and dS = P * (keep * keep_scale * dO V^T - delta). The tiles leave keep_scale out (P * keep, and
dS / keep_scale: dropout.dropped_ds); each output block takes it once (kept_scaled), and the dS path's workspace
holds dS / keep_scale (its dQ's scale carries keep_scale: jax_flash_amd/_launch.py ds_scale).
Hopper (TMA config rows): dQ reads K and V through TMA descriptors; dK/dV reads every tile through them (lse
and delta through pointers) and runs its query blocks in one loop, warp-specialised where the row says
(_dkdv_tma_program); PERSISTENT rows: one program per SM
looping over key blocks (which calls: jax_flash_amd/plan.py).
The dS path (Hopper rows with DS, where its workspace fits: jax_flash_amd/plan.py ds_heads):
dK/dV also stores each tile's dS^T (16-bit, as dK's product reads it) to a workspace, and attn_bwd_dq_ds
computes dQ = scale dS K from it: five products per tile, as FlashAttention's atomics give, still without
atomics (deterministic); dS carries dropout's keep mask (only dK/dV draws it). Delta: _launch (XLA).
"""
import triton
import triton.language as tl

from .dropout import dropped_ds, keep, load_seed
from .masking import (dense_plane, dense_planes, element_tiles, head_start, key_blocks, load_ids, load_tile,
                      persistent_rounds, persistent_tile, place, query_blocks, span_block, span_blocks, store_tile,
                      tile_order, visible)
from . import configs
from .configs import TILED_GROUP_PROGRAMS
from .scores import dense_start, scores

DS_BAND_BLOCK = tl.constexpr(configs.DS_BAND_BLOCK)  # the banded dS workspace's granule (ds_tiles)


@triton.jit
def _seen(lse):
    """lse (base 2, as the forward stores it) with +inf for rows that see no key, so their P is 0."""
    return tl.where(lse == float("-inf"), float("inf"), lse)


@triton.jit
def _lse2(Lse, row0, offs_m, seq_q):
    """_seen lse of rows offs_m, [BM] fp32."""
    return _seen(tl.load(Lse + row0 + offs_m, mask=offs_m < seq_q, other=0.0))


@triton.jit
def kept_scaled(x, keep_scale, DROP_THRESHOLD: tl.constexpr):
    """An output block (dK, dV, dQ) times keep_scale under dropout, which the tiles leave out (dropout.dropped_ds)."""
    if DROP_THRESHOLD > 0:
        x = x * keep_scale
    return x


@triton.jit
def _wait_turn(lock, rank):
    """Spins until the key block before this one (rank - 1) has passed the lock (DQ == 2)."""
    while tl.atomic_cas(lock, rank, rank, sem="acquire") != rank:
        pass


@triton.jit
def _pass_turn(lock, rank):
    """Hands the lock to the next key block, once every thread's stores are done."""
    tl.debug_barrier()
    tl.atomic_xchg(lock, rank + 1, sem="release")


@triton.jit
def _add_dq(part, dq_base, lock, rank, offs_m, seq_q, STRIDE: tl.constexpr, HEAD_DIM: tl.constexpr,
            DQ: tl.constexpr):
    """Adds a tile's dS K [BM, BD] to the float32 dQ rows offs_m at dq_base: DQ == 1 by atomics (fast, the order of
    the additions varies), DQ == 2 in key-block order (bitwise deterministic): the lock of this (batch, head, query
    block) counts the key blocks that have added theirs, and key block `rank` waits for its turn."""
    offs_d = tl.arange(0, part.shape[1])
    ptrs = dq_base + offs_m[:, None] * STRIDE + offs_d[None, :]
    inside = (offs_m[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    if DQ == 1:
        tl.atomic_add(ptrs, part, mask=inside, sem="relaxed")
    else:
        _wait_turn(lock, rank)
        # past L1 (.cg): the previous key block's program wrote these rows from another SM
        tl.store(ptrs, tl.load(ptrs, mask=inside, other=0.0, cache_modifier=".cg") + part, mask=inside)
        _pass_turn(lock, rank)


@triton.jit
def _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, Delta, row0, offs_m, offs_n, start_m, start_n, seq_q, seq_k, lo_off,
               hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, seed, q_ids, k_ids,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, MASKED: tl.constexpr,
               SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr,
               POSITIONS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, LOAD_DELTA: tl.constexpr,
               ds_desc=0, ds_row=0, STORE_DS: tl.constexpr = False, DS_BAND: tl.constexpr = False, bias=0, mask=0,
               BIAS: tl.constexpr = 0, MASK: tl.constexpr = 0, dq_base=0, dq_lock=0, dq_rank=0,
               STRIDE: tl.constexpr = 0, HEAD_DIM: tl.constexpr = 0, DQ: tl.constexpr = 0):
    """One query block's share of dk / dv (q, do [BM, BD], lse2 (_seen) loaded). delta [BM] comes loaded,
    or LOAD_DELTA: from Delta + row0 here, after dV's product (in that order AMD's loop is up to 6 %
    shorter, amd_report). STORE_DS: dS^T also goes to ds_desc at row ds_row (the dS path; ds_col).
    DQ: dS K also added to the float32 dQ rows at dq_base (row stride STRIDE; _add_dq)."""
    start = dense_start(bias, mask, offs_m[None, :], offs_n[:, None], seq_q, seq_k, sm_scale, [BLOCK_N, BLOCK_M], BIAS,
                        MASK, SOFTCAP)
    s_t, scale2, dlogit_t = scores(tl.dot(k, tl.trans(q), start, input_precision="ieee"), offs_m[None, :],
                                   offs_n[:, None], q_ids[None, :], k_ids[:, None], seq_q, seq_k, lo_off, hi_off,
                                   diag, sm_scale, softcap, slope, MASKED=MASKED, BANDED=BANDED,
                                   SEGMENTS=SEGMENTS, SOFTCAP=SOFTCAP, ALIBI=ALIBI, bias=bias, mask=mask, BIAS=BIAS,
                                   MASK=MASK)  # [BN, BM]
    p_t = tl.math.exp2(s_t * scale2 - lse2[None, :])
    kept_t = False
    pd_t = p_t  # dV's P: P keep (keep_scale on dV at the end: kept_scaled)
    if DROP_THRESHOLD > 0:
        kept_t = keep(seed, start_m + pos_q, start_n + pos_k, DROP_THRESHOLD, BLOCK_M, BLOCK_N, True)  # [BN, BM]
        pd_t = tl.where(kept_t, p_t, 0.0)
    if DV:
        dv = tl.dot(pd_t.to(do.dtype), do, dv, input_precision="ieee")
    if DK:
        if LOAD_DELTA:
            delta = tl.load(Delta + row0 + offs_m, mask=offs_m < seq_q, other=0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision="ieee")  # [BN, BM]
        ds_t = dropped_ds(p_t, dp_t, delta[None, :], kept_t, DROP_THRESHOLD)
        if SOFTCAP:
            ds_t = ds_t * dlogit_t  # through softcap's tanh
        if STORE_DS:
            ds_desc.store([ds_row, ds_col(start_m, start_n, hi_off, DS_BAND)], ds_t.to(q.dtype))
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision="ieee")
        if DQ:
            _add_dq(tl.dot(tl.trans(ds_t.to(q.dtype)), k, input_precision="ieee"), dq_base, dq_lock, dq_rank,
                    offs_m, seq_q, STRIDE=STRIDE, HEAD_DIM=HEAD_DIM, DQ=DQ)
    return dk, dv


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q, dOut, Slopes, Seeds, Lse, Delta, b, h_kv, lo, hi, lo2, hi2, start_n, offs_n, seq_q,
                seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, QSeg, k_ids,
                H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, MASKED: tl.constexpr,
                SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr,
                POSITIONS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, ds_desc=0, ds_rows=0,
                STORE_DS: tl.constexpr = False, DS_BAND: tl.constexpr = False, Bias=0, Mask=0,
                BIAS: tl.constexpr = 0, MASK: tl.constexpr = 0, DQAcc=0, Locks=0, rank=0, DQ: tl.constexpr = 0):
    """Query blocks of [lo, hi) then [lo2, hi2), of each of the GROUP query heads that read key/value
    head h_kv: one flat loop (an outer loop over the heads costs registers, which spill at D 128), the
    heads innermost (the GROUP heads' tiles of one query block are read together). DK, DV: which of
    dk, dv to accumulate (the other is returned as it came). diag, pos_q, pos_k: masking.place.
    STORE_DS: each tile's dS^T also to ds_desc, ds_rows rows per (batch, head) (ds_tiles).
    DQ: each tile's dS K also to the float32 DQAcc (like Q), key block `rank` in turn where ordered (_add_dq)."""
    offs_d = tl.arange(0, BLOCK_D)
    STRIDE: tl.constexpr = H * HEAD_DIM
    n = span_blocks(lo, hi, lo2, hi2, BLOCK_M)
    for i in range(0, n * GROUP):
        if GROUP == 1:
            h = h_kv
            start_m = span_block(i, lo, hi, lo2, BLOCK_M)
        else:
            h = h_kv * GROUP + i % GROUP
            start_m = span_block(i // GROUP, lo, hi, lo2, BLOCK_M)
        q_base = head_start(b, h, seq_q, H, HEAD_DIM)
        row0 = (b * H + h).to(tl.int64) * seq_q
        slope = 0.0
        if ALIBI:
            slope = tl.load(Slopes + b * H + h)
        seed = load_seed(Seeds, b * H + h, DROP_THRESHOLD)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(Q + q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # [BM, BD]
        do = load_tile(dOut + q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)
        lse2 = _lse2(Lse, row0, offs_m, seq_q)
        q_ids = load_ids(QSeg, b, offs_m, seq_q, SEGMENTS and MASKED)
        bias, mask = dense_planes(Bias, Mask, b, h, seq_q, seq_k, H, BIAS, MASK)
        dq_base = DQAcc
        dq_lock = Locks
        if DQ:
            dq_base = DQAcc + q_base
            dq_lock = Locks + (b * H + h) * tl.cdiv(seq_q, BLOCK_M) + start_m // BLOCK_M
        dk, dv = _dkdv_tile(dk, dv, k, v, q, do, lse2, 0.0, Delta, row0, offs_m, offs_n, start_m, start_n, seq_q,
                            seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, seed, q_ids, k_ids,
                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, MASKED=MASKED,
                            SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD,
                            POSITIONS=POSITIONS, DK=DK, DV=DV, LOAD_DELTA=True, ds_desc=ds_desc,
                            ds_row=(b * H + h) * ds_rows + start_n, STORE_DS=STORE_DS, DS_BAND=DS_BAND, bias=bias,
                            mask=mask, BIAS=BIAS, MASK=MASK, dq_base=dq_base, dq_lock=dq_lock, dq_rank=rank,
                            STRIDE=STRIDE, HEAD_DIM=HEAD_DIM, DQ=DQ)
    return dk, dv


@triton.jit
def _query_tiles(q_desc, do_desc, row, col):
    """The q and dO tiles at (row, col) of their descriptors."""
    return q_desc.load([row, col]), do_desc.load([row, col])


@triton.jit
def _rows(Lse, Delta, row0, offs_m, seq_q):
    """(_seen lse, delta) of rows offs_m of the (batch, head) whose rows start at row0."""
    return _lse2(Lse, row0, offs_m, seq_q), tl.load(Delta + row0 + offs_m, mask=offs_m < seq_q, other=0.0)


@triton.jit
def _dkdv_tma_block(dk, dv, k, v, q_desc, do_desc, Lse, Delta, b, h, start_m, start_n, offs_n, seq_q,
                    seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, seed, k_ids,
                    ds_desc, ds_rows, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BANDED: tl.constexpr, MASKED: tl.constexpr, SOFTCAP: tl.constexpr,
                    ALIBI: tl.constexpr, DROP_THRESHOLD: tl.constexpr, POSITIONS: tl.constexpr,
                    STORE_DS: tl.constexpr, DS_BAND: tl.constexpr):
    """_dkdv_tile of query block start_m of head h, its tiles from the descriptors (_dkdv_tma_program);
    STORE_DS: dS^T to ds_desc, ds_rows rows per (batch, head) (ds_tiles)."""
    # lse and delta through pointers: through TMA (a third tile per iteration) the warp-specialised kernels
    # returned NaN under compute-sanitizer and under contention (docs/tuning.md, Hopper dK/dV)
    row0 = (b * H + h) * seq_q
    offs_m = start_m + tl.arange(0, BLOCK_M)
    if MASKED:
        q, do = _query_tiles(q_desc, do_desc, b * seq_q + start_m, h * HEAD_DIM)
        lse2, delta = _rows(Lse, Delta, row0, offs_m, seq_q)
    else:
        # loaded before the tiles, their loads come before the consumer warps' waits for q and dO, so their
        # latency overlaps the waits (H200, D 128: the backward 5-7 % faster; masked, 64 more bytes of spills
        # made it 24-30 % slower: docs/tuning.md, Hopper dK/dV)
        lse2, delta = _rows(Lse, Delta, row0, offs_m, seq_q)
        q, do = _query_tiles(q_desc, do_desc, b * seq_q + start_m, h * HEAD_DIM)
    return _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, Delta, row0, offs_m, offs_n, start_m, start_n, seq_q,
                      seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, seed,
                      tl.zeros([BLOCK_M], tl.int32), k_ids, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                      BANDED=BANDED, MASKED=MASKED, SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=False,
                      DROP_THRESHOLD=DROP_THRESHOLD,
                      POSITIONS=POSITIONS, DK=True, DV=True, LOAD_DELTA=False, ds_desc=ds_desc,
                      ds_row=(b * H + h) * ds_rows + start_n, STORE_DS=STORE_DS, DS_BAND=DS_BAND)


@triton.jit
def _dkdv_tma(dk, dv, k, v, q_desc, do_desc, Lse, Delta, Slopes, Seeds, b, h_kv, lo, hi, start_n, offs_n, seq_q,
              seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, k_ids, ds_desc, ds_rows,
              H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BANDED: tl.constexpr, MASKED: tl.constexpr, SOFTCAP: tl.constexpr,
              ALIBI: tl.constexpr, DROP_THRESHOLD: tl.constexpr, POSITIONS: tl.constexpr,
              WARP_SPECIALIZE: tl.constexpr, STORE_DS: tl.constexpr, DS_BAND: tl.constexpr):
    """Query blocks of [lo, hi) of the GROUP query heads of h_kv (heads innermost) in one plain loop, what
    Triton's warp-specialisation pass partitions (as the forward's TMA loop)."""
    if GROUP == 1:
        slope = 0.0
        if ALIBI:
            slope = tl.load(Slopes + b * H + h_kv)
        seed = load_seed(Seeds, b * H + h_kv, DROP_THRESHOLD)
        for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WARP_SPECIALIZE):
            dk, dv = _dkdv_tma_block(dk, dv, k, v, q_desc, do_desc, Lse, Delta, b, h_kv, start_m, start_n,
                                     offs_n, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap,
                                     slope, seed, k_ids, ds_desc, ds_rows, H=H, HEAD_DIM=HEAD_DIM,
                                     BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, MASKED=MASKED, SOFTCAP=SOFTCAP,
                                     ALIBI=ALIBI, DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS,
                                     STORE_DS=STORE_DS, DS_BAND=DS_BAND)
    else:
        for i in tl.range(0, tl.cdiv(hi - lo, BLOCK_M) * GROUP, warp_specialize=WARP_SPECIALIZE):
            h = h_kv * GROUP + i % GROUP
            slope = 0.0
            if ALIBI:
                slope = tl.load(Slopes + b * H + h)
            seed = load_seed(Seeds, b * H + h, DROP_THRESHOLD)
            dk, dv = _dkdv_tma_block(dk, dv, k, v, q_desc, do_desc, Lse, Delta, b, h,
                                     lo + i // GROUP * BLOCK_M, start_n, offs_n, seq_q, seq_k, lo_off, hi_off, diag,
                                     pos_q, pos_k, sm_scale, softcap, slope, seed, k_ids, ds_desc,
                                     ds_rows, H=H, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                     BANDED=BANDED, MASKED=MASKED, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
                                     DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, STORE_DS=STORE_DS,
                                     DS_BAND=DS_BAND)
    return dk, dv


@triton.jit
def _pass_turns(Locks, b, h_kv, rank, lo, hi, seq_q, H: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Key block `rank` passes on, in turn, the locks of query blocks [lo, hi), which it does not visit: every lock
    then counts all key blocks, so a key block's turn at any query block is its rank."""
    n_m = tl.cdiv(seq_q, BLOCK_M)
    for j in range(0, (hi - lo) // BLOCK_M * GROUP):
        lock = Locks + (b * H + h_kv * GROUP + j % GROUP) * n_m + lo // BLOCK_M + j // GROUP
        _wait_turn(lock, rank)
        tl.atomic_xchg(lock, rank + 1, sem="release")  # no stores of its own to wait for


@triton.jit
def _dkdv_in_turn(dk, dv, k, v, Q, dOut, Slopes, Seeds, Lse, Delta, b, h_kv, begin, full_begin, full_end, end,
                  start_n, offs_n, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, QSeg, k_ids,
                  Bias, Mask, DQAcc, Locks, rank, H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr,
                  SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr,
                  POSITIONS: tl.constexpr, BIAS: tl.constexpr, MASK: tl.constexpr, DV: tl.constexpr):
    """dK (and dV where DV) of a key block whose dS K goes to DQAcc in turn (DQ == 2): every query block in
    ascending order, those it does not visit passed on, the band's low edge, the blocks that see every key, the high
    edge. With the lightest key block first (rank 0: the last), each key block reaches a query block as the one
    before it leaves it, so in a band none waits for long."""
    _pass_turns(Locks, b, h_kv, rank, 0, begin, seq_q, H=H, GROUP=GROUP, BLOCK_M=BLOCK_M)
    for phase in tl.static_range(3):
        lo = begin
        hi = full_begin
        if phase == 1:
            lo = full_begin
            hi = full_end
        if phase == 2:
            lo = full_end
            hi = end
        dk, dv = _dkdv_inner(dk, dv, k, v, Q, dOut, Slopes, Seeds, Lse, Delta, b, h_kv, lo, hi, hi, hi, start_n,
                             offs_n, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, QSeg, k_ids,
                             MASKED=phase != 1, H=H, GROUP=GROUP, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                             BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS,
                             DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, DK=True, DV=DV, Bias=Bias,
                             Mask=Mask, BIAS=BIAS, MASK=MASK, DQAcc=DQAcc, Locks=Locks, rank=rank, DQ=2)
    # segment ids and masks bound `end` by position: the last block visited is the one holding it
    _pass_turns(Locks, b, h_kv, rank, tl.cdiv(end, BLOCK_M) * BLOCK_M, tl.cdiv(seq_q, BLOCK_M) * BLOCK_M, seq_q, H=H,
                GROUP=GROUP, BLOCK_M=BLOCK_M)
    return dk, dv


@triton.jit
def _dkdv_program(Q, K, V, Slopes, Seeds, QSeg, KSeg, QueryRanges, Positions, Bias, Mask, dOut, Lse, Delta, DKPart,
                  DVPart, DSPart, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV,
                  H: tl.constexpr, KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, SOFTCAP: tl.constexpr,
                  ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr, POSITIONS: tl.constexpr,
                  DK: tl.constexpr, DV: tl.constexpr, EDGES: tl.constexpr = 0, DS: tl.constexpr = False,
                  GROUP_PROGRAMS: tl.constexpr = TILED_GROUP_PROGRAMS, DS_BAND: tl.constexpr = False,
                  BIAS: tl.constexpr = 0, MASK: tl.constexpr = 0, DQAcc=0, Locks=0, DQ: tl.constexpr = 0):
    """dK (DK) and / or dV (DV) of one key block; EDGES == 2 (attn_bwd_dkdv): only the masked query blocks,
    added to the partial DKPart / DVPart; DS (the dS path): every visited tile's dS^T to the workspace DSPart;
    DQ (attn_bwd_dkdv_dq): every visited tile's dS K to DQAcc (_add_dq)."""
    i, bh = tile_order(BANDED, GROUP_PROGRAMS)  # bh: batch * KV_H
    rank = i
    if DQ == 2:  # dQ summed in launch order (tile_order's plain one), the lightest key block first (_dkdv_in_turn)
        tl.static_assert(GROUP_PROGRAMS == 1, "the ordered dQ sum takes the grid's plain order")
        i = tl.num_programs(0) - 1 - rank
    start_n = i * BLOCK_N  # causal: the heaviest first (but for DQ == 2)
    b = bh // KV_H
    h_kv = bh % KV_H
    GROUP: tl.constexpr = H // KV_H
    STRIDE_KV: tl.constexpr = KV_H * HEAD_DIM
    kv_base = head_start(b, h_kv, seq_k, KV_H, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    k = load_tile(K + kv_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # [BN, BD]
    v = k  # read by dK's dP only
    if DK:
        v = load_tile(V + kv_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    lo_off, hi_off, diag, pos_q, pos_k = place(Positions, b, seq_q, seq_k, lo_off, hi_off, POSITIONS)
    # segment ids and a dense mask bound the query blocks by QueryRanges, and every visited block is masked
    begin, full_begin, full_end, end = query_blocks(start_n, seq_q, seq_k, lo_off, hi_off, QueryRanges, b, BLOCK_M,
                                                    BLOCK_N, BANDED, SEGMENTS or MASK > 0)
    k_ids = load_ids(KSeg, b, offs_n, seq_k, SEGMENTS)
    ds_desc = DSPart
    ds_rows = 0
    if DS:
        ds_desc, ds_rows = ds_tiles(DSPart, b, seq_q, seq_k, lo_off, hi_off, H, BLOCK_N, BLOCK_N, BLOCK_M, DS_BAND)
    if DQ == 2:
        dk, dv = _dkdv_in_turn(dk, dv, k, v, Q, dOut, Slopes, Seeds, Lse, Delta, b, h_kv, begin, full_begin, full_end,
                               end, start_n, offs_n, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale,
                               softcap, QSeg, k_ids, Bias, Mask, DQAcc, Locks, rank, H=H, GROUP=GROUP,
                               HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED,
                               SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD,
                               POSITIONS=POSITIONS, BIAS=BIAS, MASK=MASK, DV=DV)
    else:
        # query blocks that see every key of this block, unmasked (EDGES == 2: done); then those at the band's
        # edges, masked
        if EDGES != 2:
            dk, dv = _dkdv_inner(dk, dv, k, v, Q, dOut, Slopes, Seeds, Lse, Delta, b, h_kv, full_begin, full_end,
                                 full_end, full_end, start_n, offs_n, seq_q, seq_k, lo_off, hi_off, diag, pos_q,
                                 pos_k, sm_scale, softcap, QSeg, k_ids, MASKED=False, H=H, GROUP=GROUP,
                                 HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED,
                                 SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD,
                                 POSITIONS=POSITIONS, DK=DK, DV=DV, ds_desc=ds_desc, ds_rows=ds_rows, STORE_DS=DS,
                                 DS_BAND=DS_BAND, Bias=Bias, Mask=Mask, BIAS=BIAS, MASK=MASK, DQAcc=DQAcc,
                                 Locks=Locks, DQ=DQ)
        dk, dv = _dkdv_inner(dk, dv, k, v, Q, dOut, Slopes, Seeds, Lse, Delta, b, h_kv, begin, full_begin, full_end,
                             end, start_n, offs_n, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale,
                             softcap, QSeg, k_ids, MASKED=True, H=H, GROUP=GROUP, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
                             SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, DK=DK, DV=DV,
                             ds_desc=ds_desc, ds_rows=ds_rows, STORE_DS=DS, DS_BAND=DS_BAND, Bias=Bias, Mask=Mask,
                             BIAS=BIAS, MASK=MASK, DQAcc=DQAcc, Locks=Locks, DQ=DQ)
    dk = kept_scaled(dk * sm_scale, keep_scale, DROP_THRESHOLD)
    dv = kept_scaled(dv, keep_scale, DROP_THRESHOLD)
    if EDGES == 2:  # the partials carry keep_scale already
        dk += load_tile(DKPart + kv_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
        dv += load_tile(DVPart + kv_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    if DK:
        store_tile(dK + kv_base, dk, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, BLOCK_D != HEAD_DIM)
    if DV:
        store_tile(dV + kv_base, dv, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, BLOCK_D != HEAD_DIM)


@triton.jit
def _dkdv_tma_program(Q, K, V, Slopes, Seeds, QueryRanges, Positions, dOut, Lse, Delta, sm_scale, softcap,
                      keep_scale, seq_q, seq_k, lo_off, hi_off, batch, dK, dV, dS, H: tl.constexpr,
                      KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROP_THRESHOLD: tl.constexpr,
                      POSITIONS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                      QUERIES_EVEN: tl.constexpr, DS: tl.constexpr, PERSISTENT: tl.constexpr, EDGES: tl.constexpr,
                      GROUP_PROGRAMS: tl.constexpr, DS_BAND: tl.constexpr):
    """dK and dV of one key block (PERSISTENT: of the key blocks masking.persistent_tile hands this program),
    every tile through TMA descriptors (masking.element_tiles), Lse and Delta through pointers (_dkdv_tma_block)."""
    if PERSISTENT:  # whole blocks only (jax_flash_amd/plan.py): descriptors over the whole batch
        descriptors = _dkdv_descriptors(Q, K, V, dOut, dS, batch - 1, seq_q, seq_k, lo_off, hi_off, H=H, KV_H=KV_H,
                                        HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, DS=DS, DS_BAND=DS_BAND)
        n_n = tl.cdiv(seq_k, BLOCK_N)
        for r in range(0, persistent_rounds(n_n * batch * KV_H)):
            block, bh = persistent_tile(r, n_n, batch * KV_H)
            # persistent_tile hands out the last block first; here the heaviest (causal) is the first
            _dkdv_tma_tile((n_n - 1 - block) * BLOCK_N, bh, descriptors, Lse, Delta, Slopes, Seeds, QueryRanges,
                           Positions, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV, H=H,
                           KV_H=KV_H, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED,
                           SOFTCAP=SOFTCAP, ALIBI=ALIBI, DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS,
                           WARP_SPECIALIZE=WARP_SPECIALIZE, QUERIES_EVEN=QUERIES_EVEN, DS=DS, EDGES=EDGES,
                           DS_BAND=DS_BAND)
    else:
        i, bh = tile_order(BANDED, GROUP_PROGRAMS)
        descriptors = _dkdv_descriptors(Q, K, V, dOut, dS, bh // KV_H, seq_q, seq_k, lo_off, hi_off, H=H,
                                        KV_H=KV_H, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, DS=DS,
                                        DS_BAND=DS_BAND)
        _dkdv_tma_tile(i * BLOCK_N, bh, descriptors, Lse, Delta, Slopes, Seeds, QueryRanges, Positions, sm_scale,
                       softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV, H=H, KV_H=KV_H,
                       HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
                       DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, WARP_SPECIALIZE=WARP_SPECIALIZE,
                       QUERIES_EVEN=QUERIES_EVEN, DS=DS, EDGES=EDGES, DS_BAND=DS_BAND)


@triton.jit
def _dkdv_descriptors(Q, K, V, dOut, dS, last, seq_q, seq_k, lo_off, hi_off, H: tl.constexpr, KV_H: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DS: tl.constexpr,
                      DS_BAND: tl.constexpr):
    """The TMA dK/dV loop's descriptors (k, v, q, do, ds, ds_rows) of batch elements up to `last`:
    a program's own element, or the whole batch for a persistent one. ds (ds_tiles) only where DS."""
    k_desc = element_tiles(K, last, seq_k, KV_H * HEAD_DIM, BLOCK_N, HEAD_DIM)
    v_desc = element_tiles(V, last, seq_k, KV_H * HEAD_DIM, BLOCK_N, HEAD_DIM)
    q_desc = element_tiles(Q, last, seq_q, H * HEAD_DIM, BLOCK_M, HEAD_DIM)
    do_desc = element_tiles(dOut, last, seq_q, H * HEAD_DIM, BLOCK_M, HEAD_DIM)
    ds_desc = dS
    ds_rows = 0
    if DS:
        ds_desc, ds_rows = ds_tiles(dS, last, seq_q, seq_k, lo_off, hi_off, H, BLOCK_N, BLOCK_N, BLOCK_M, DS_BAND)
    return k_desc, v_desc, q_desc, do_desc, ds_desc, ds_rows


@triton.jit
def _dkdv_tma_tile(start_n, bh, descriptors, Lse, Delta, Slopes, Seeds, QueryRanges, Positions, sm_scale, softcap,
                   keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV, H: tl.constexpr, KV_H: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr,
                   SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROP_THRESHOLD: tl.constexpr, POSITIONS: tl.constexpr,
                   WARP_SPECIALIZE: tl.constexpr,
                   QUERIES_EVEN: tl.constexpr, DS: tl.constexpr, EDGES: tl.constexpr, DS_BAND: tl.constexpr):
    """dK and dV of key block start_n of (batch * KV_H) row bh, tiles through descriptors (_dkdv_descriptors);
    EDGES == 1: of the query blocks that see the whole key block only (attn_bwd_dkdv)."""
    k_desc, v_desc, q_desc, do_desc, ds_desc, ds_rows = descriptors
    b = bh // KV_H
    h_kv = bh % KV_H
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k = k_desc.load([b * seq_k + start_n, h_kv * HEAD_DIM])
    v = v_desc.load([b * seq_k + start_n, h_kv * HEAD_DIM])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo_off, hi_off, diag, pos_q, pos_k = place(Positions, b, seq_q, seq_k, lo_off, hi_off, POSITIONS)
    begin, full_begin, full_end, end = query_blocks(start_n, seq_q, seq_k, lo_off, hi_off, QueryRanges, b, BLOCK_M,
                                                    BLOCK_N, BANDED, False)
    # one loop (Triton 3.6's warp-specialisation pass takes no second one), masked unless no block needs it,
    # or (EDGES == 1) over the blocks that need none
    if EDGES == 1:
        begin = full_begin
        end = full_end
    dk, dv = _dkdv_tma(dk, dv, k, v, q_desc, do_desc, Lse, Delta, Slopes, Seeds, b, h_kv, begin, end, start_n,
                       offs_n, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap,
                       tl.zeros([BLOCK_N], tl.int32), ds_desc, ds_rows, H=H, GROUP=H // KV_H, HEAD_DIM=HEAD_DIM,
                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED,
                       MASKED=(BANDED or not QUERIES_EVEN) and EDGES != 1, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
                       DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, WARP_SPECIALIZE=WARP_SPECIALIZE,
                       STORE_DS=DS, DS_BAND=DS_BAND)
    kv_base = head_start(b, h_kv, seq_k, KV_H, HEAD_DIM)
    store_tile(dK + kv_base, kept_scaled(dk * sm_scale, keep_scale, DROP_THRESHOLD), offs_n, offs_d, KV_H * HEAD_DIM,
               seq_k, HEAD_DIM, False)
    store_tile(dV + kv_base, kept_scaled(dv, keep_scale, DROP_THRESHOLD), offs_n, offs_d, KV_H * HEAD_DIM, seq_k,
               HEAD_DIM, False)


@triton.jit
def attn_bwd_dkdv(Q, K, V, Slopes, Seeds, QSeg, KSeg, QueryRanges, Positions, Bias, Mask, dOut, Lse, Delta, DKPart,
                  DVPart, DSPart, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, batch, dK, dV, dS,
                  H: tl.constexpr, KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, SOFTCAP: tl.constexpr,
                  ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr, SPLIT: tl.constexpr,
                  POSITIONS: tl.constexpr, TMA: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = False,
                  QUERIES_EVEN: tl.constexpr = False, DS: tl.constexpr = False, PERSISTENT: tl.constexpr = False,
                  EDGES: tl.constexpr = 0, GROUP_PROGRAMS: tl.constexpr = TILED_GROUP_PROGRAMS,
                  DS_BAND: tl.constexpr = False, BIAS: tl.constexpr = 0, MASK: tl.constexpr = 0):
    """Arguments as attn_fwd's; QueryRanges (batch, key blocks, 2): the queries that can share a segment
    id with each key block, or see it through the mask. The TMA path takes no Bias or Mask (the plan keeps
    calls with them off TMA rows). One program per (key block, batch * KV_H[, dV or dK where SPLIT]), or with
    PERSISTENT (TMA rows, whole blocks: jax_flash_amd/plan.py) a grid of (programs, 1, 1), each
    looping over key blocks of the batch's `batch` elements.
    TMA (Hopper config rows; which calls take them: jax_flash_amd/plan.py takes_tma): tiles through
    TMA descriptors, WARP_SPECIALIZE splitting the query loop into producer and consumer warps;
    QUERIES_EVEN says every query and key block is whole (the loop then runs unmasked without a band).
    dS: the dS path's workspace (ds_tiles; DS_BAND: its banded layout), written where DS (sm90 rows), else a
    placeholder.
    EDGES (as attn_fwd's; which calls: jax_flash_amd/plan.py edges_apart): 1 (the TMA loop) only the query
    blocks that see every key of the block, unmasked, dK and dV then float32 partial sums; 2 (pointer loads)
    only the masked ones at the band's edges, added to those (DKPart, DVPart; placeholders otherwise); on the
    dS path (DS) storing their dS^T into the first launch's workspace, DSPart (aliased to dS).
    GROUP_PROGRAMS: a causal tiled grid's group (masking.tile_order)."""
    # DK / DV must be compile-time constants (each program holds only the accumulators it needs), hence
    # one call per case
    if TMA:
        _dkdv_tma_program(Q, K, V, Slopes, Seeds, QueryRanges, Positions, dOut, Lse, Delta, sm_scale, softcap,
                          keep_scale, seq_q, seq_k, lo_off, hi_off, batch, dK, dV, dS, H=H, KV_H=KV_H,
                          HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP,
                          ALIBI=ALIBI, DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS,
                          WARP_SPECIALIZE=WARP_SPECIALIZE, QUERIES_EVEN=QUERIES_EVEN, DS=DS, PERSISTENT=PERSISTENT,
                          EDGES=EDGES, GROUP_PROGRAMS=GROUP_PROGRAMS, DS_BAND=DS_BAND)
    elif not SPLIT:  # dS^T (DS) to this launch's workspace, or on the edge launch (EDGES == 2) to the first's
        _dkdv_program(Q, K, V, Slopes, Seeds, QSeg, KSeg, QueryRanges, Positions, Bias, Mask, dOut, Lse, Delta,
                      DKPart, DVPart, DSPart if EDGES == 2 else dS, sm_scale, softcap, keep_scale, seq_q, seq_k,
                      lo_off, hi_off, dK, dV, DK=True, DV=True, H=H, KV_H=KV_H, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                      BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS,
                      DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, EDGES=EDGES, DS=DS,
                      GROUP_PROGRAMS=GROUP_PROGRAMS, DS_BAND=DS_BAND, BIAS=BIAS, MASK=MASK)
    elif tl.program_id(2) == 0:
        _dkdv_program(Q, K, V, Slopes, Seeds, QSeg, KSeg, QueryRanges, Positions, Bias, Mask, dOut, Lse, Delta,
                      DKPart, DVPart, DSPart, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV,
                      DK=False, DV=True, H=H, KV_H=KV_H, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                      BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS,
                      DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, GROUP_PROGRAMS=GROUP_PROGRAMS, BIAS=BIAS,
                      MASK=MASK)
    else:
        _dkdv_program(Q, K, V, Slopes, Seeds, QSeg, KSeg, QueryRanges, Positions, Bias, Mask, dOut, Lse, Delta,
                      DKPart, DVPart, DSPart, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV,
                      DK=True, DV=False, H=H, KV_H=KV_H, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                      BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS,
                      DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, GROUP_PROGRAMS=GROUP_PROGRAMS, BIAS=BIAS,
                      MASK=MASK)


@triton.jit
def attn_bwd_dkdv_dq(Q, K, V, Slopes, Seeds, QSeg, KSeg, QueryRanges, Positions, Bias, Mask, dOut, Lse, Delta, DQAcc,
                     Locks, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV, dQAcc, dLocks,
                     H: tl.constexpr, KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, SOFTCAP: tl.constexpr,
                     ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr, POSITIONS: tl.constexpr,
                     DQ: tl.constexpr, DK: tl.constexpr = True, DV: tl.constexpr = True, BIAS: tl.constexpr = 0,
                     MASK: tl.constexpr = 0):
    """The backward in one pass, five products per tile and linear memory: attn_bwd_dkdv's dK and dV, and each
    tile's dS K added to DQAcc, float32 zeros like Q (dQ = sm_scale keep_scale DQAcc after), DQ == 1 by atomics,
    DQ == 2 in key-block order through Locks, int32 zeros (batch, H, query blocks): bitwise deterministic; DQ == 0
    with DK off (a SPLIT row's dV launch; its dK launch adds dQ). dQAcc and dLocks are DQAcc's and Locks' buffers,
    updated in place (jax-triton's input_output_aliases). Grid (key blocks, batch * KV_H) in launch order: a key
    block waits only for the one before it, which started first (masking.tile_order's plain order)."""
    tl.static_assert(DK or DQ == 0, "dQ comes from dK's programs (dS)")
    _dkdv_program(Q, K, V, Slopes, Seeds, QSeg, KSeg, QueryRanges, Positions, Bias, Mask, dOut, Lse, Delta, 0, 0, 0,
                  sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dK, dV, DK=DK, DV=DV, H=H, KV_H=KV_H,
                  HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED,
                  SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS,
                  GROUP_PROGRAMS=1, BIAS=BIAS, MASK=MASK, DQAcc=DQAcc, Locks=Locks, DQ=DQ)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, kv_row, kv_col, lo, hi, lo2, hi2, start_m,
              seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, q_ids, KSeg, b, seed,
              STRIDE_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, MASKED: tl.constexpr,
              SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr,
              POSITIONS: tl.constexpr, TMA: tl.constexpr, bias=0, mask=0, BIAS: tl.constexpr = 0,
              MASK: tl.constexpr = 0):
    """Key blocks of [lo, hi) then [lo2, hi2); diag, pos_q, pos_k: masking.place. TMA: K and V tiles from
    k_desc / v_desc at (kv_row + start_n, kv_col) (zeros past the batch element's keys), else from
    k_base / v_base."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    for i in range(0, span_blocks(lo, hi, lo2, hi2, BLOCK_N)):
        start_n = span_block(i, lo, hi, lo2, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if TMA:
            k = k_desc.load([kv_row + start_n, kv_col])
            v = v_desc.load([kv_row + start_n, kv_col])
        else:
            k = load_tile(k_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # [BN, BD]
            v = load_tile(v_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # [BN, BD]
        k_ids = load_ids(KSeg, b, offs_n, seq_k, SEGMENTS and MASKED)
        start = dense_start(bias, mask, offs_m[:, None], offs_n[None, :], seq_q, seq_k, sm_scale, [BLOCK_M, BLOCK_N],
                            BIAS, MASK, SOFTCAP)
        s, scale2, dlogit = scores(tl.dot(q, tl.trans(k), start, input_precision="ieee"), offs_m[:, None],
                                   offs_n[None, :], q_ids[:, None], k_ids[None, :], seq_q, seq_k, lo_off, hi_off, diag,
                                   sm_scale, softcap, slope, MASKED=MASKED, BANDED=BANDED, SEGMENTS=SEGMENTS,
                                   SOFTCAP=SOFTCAP, ALIBI=ALIBI, bias=bias, mask=mask, BIAS=BIAS, MASK=MASK)  # [BM, BN]
        p = tl.math.exp2(s * scale2 - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")  # [BM, BN]
        kept = False
        if DROP_THRESHOLD > 0:
            kept = keep(seed, start_m + pos_q, start_n + pos_k, DROP_THRESHOLD, BLOCK_M, BLOCK_N)
        ds = dropped_ds(p, dp, delta[:, None], kept, DROP_THRESHOLD)  # keep_scale on dQ at the end
        if SOFTCAP:
            ds = ds * dlogit  # through softcap's tanh
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision="ieee")
    return dq


@triton.jit
def attn_bwd_dq(Q, K, V, Slopes, Seeds, QSeg, KSeg, KeyRanges, Positions, Bias, Mask, Out, dOut, dLse, Lse, sm_scale,
                softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, dQ, Delta, H: tl.constexpr, KV_H: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEGMENTS: tl.constexpr,
                DROP_THRESHOLD: tl.constexpr, POSITIONS: tl.constexpr, TMA: tl.constexpr = False,
                GROUP_PROGRAMS: tl.constexpr = TILED_GROUP_PROGRAMS, BIAS: tl.constexpr = 0, MASK: tl.constexpr = 0):
    """Arguments as attn_fwd's. Also writes Delta (delta above) for the dK/dV kernel, which runs after:
    the dQ program holds dO anyway, so this saves a pass over O and dO. TMA (Hopper config rows): K and V
    tiles through TMA descriptors (as the forward's), 16-bit inputs with power-of-two heads. GROUP_PROGRAMS: a
    causal tiled grid's group (masking.tile_order)."""
    i, bh = tile_order(BANDED, GROUP_PROGRAMS)
    start_m = (tl.num_programs(0) - 1 - i) * BLOCK_M  # causal: the heaviest first
    b = bh // H
    h = bh % H
    STRIDE: tl.constexpr = H * HEAD_DIM
    q_base = head_start(b, h, seq_q, H, HEAD_DIM)
    kv_base = head_start(b, h // (H // KV_H), seq_k, KV_H, HEAD_DIM)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    slope = 0.0
    if ALIBI:
        slope = tl.load(Slopes + bh)

    q = load_tile(Q + q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # [BM, BD]
    do = load_tile(dOut + q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # [BM, BD]
    o = load_tile(Out + q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    row0 = bh.to(tl.int64) * seq_q
    dlse = tl.load(dLse + row0 + offs_m, mask=offs_m < seq_q, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1) - dlse
    tl.store(Delta + row0 + offs_m, delta, mask=offs_m < seq_q)
    lse2 = _lse2(Lse, row0, offs_m, seq_q)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    lo_off, hi_off, diag, pos_q, pos_k = place(Positions, b, seq_q, seq_k, lo_off, hi_off, POSITIONS)
    start, full_start, full_end, end = key_blocks(start_m, seq_q, seq_k, lo_off, hi_off, KeyRanges, b, BLOCK_M,
                                                  BLOCK_N, BANDED, SEGMENTS or MASK > 0)
    q_ids = load_ids(QSeg, b, offs_m, seq_q, SEGMENTS)
    seed = load_seed(Seeds, bh, DROP_THRESHOLD)
    bias, mask = dense_planes(Bias, Mask, b, h, seq_q, seq_k, H, BIAS, MASK)
    STRIDE_KV: tl.constexpr = KV_H * HEAD_DIM
    k_desc = K
    v_desc = V
    kv_row = b * seq_k
    kv_col = (h // (H // KV_H)) * HEAD_DIM
    if TMA:
        k_desc = element_tiles(K, b, seq_k, STRIDE_KV, BLOCK_N, BLOCK_D)
        v_desc = element_tiles(V, b, seq_k, STRIDE_KV, BLOCK_N, BLOCK_D)
    # the band's edges (masked) first, then the key blocks every row sees (unmasked): in this order the
    # unmasked loop keeps its K and V buffer descriptors in SGPRs (the other way round, LLVM re-copied
    # 4 descriptor words into place every iteration on AMD)
    for i in tl.static_range(2):
        if i == 0:  # the edges' spans, masked
            lo, hi, lo2, hi2 = start, full_start, full_end, end
        else:  # the blocks every row sees, unmasked
            lo, hi, lo2, hi2 = full_start, full_end, full_end, full_end
        dq = _dq_inner(dq, q, do, lse2, delta, K + kv_base, V + kv_base, k_desc, v_desc, kv_row, kv_col, lo, hi, lo2,
                       hi2, start_m, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, q_ids,
                       KSeg, b, seed, MASKED=i == 0, STRIDE_KV=STRIDE_KV, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
                       SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD, POSITIONS=POSITIONS, TMA=TMA, bias=bias,
                       mask=mask, BIAS=BIAS, MASK=MASK)
    store_tile(dQ + q_base, kept_scaled(dq * sm_scale, keep_scale, DROP_THRESHOLD), offs_m, offs_d, STRIDE, seq_q,
               HEAD_DIM, BLOCK_D != HEAD_DIM)


@triton.jit
def ds_shape(seq_q, seq_k, lo_off, hi_off, DS_BLOCK_N: tl.constexpr, DS_BAND: tl.constexpr):
    """(rows per (batch, head), cols) of the dS path's workspace (ds_tiles); also the Gluon dK/dV's (bwd_sm90.py)."""
    rows = tl.cdiv(seq_k, DS_BLOCK_N) * DS_BLOCK_N
    if DS_BAND:
        cols = tl.cdiv(2 * DS_BAND_BLOCK - 1 + hi_off - lo_off, 8) * 8
    else:
        cols = tl.cdiv(seq_q, 8) * 8
    return rows, cols


@triton.jit
def ds_tiles(dS, b, seq_q, seq_k, lo_off, hi_off, H: tl.constexpr, DS_BLOCK_N: tl.constexpr,
             BLOCK_KEYS: tl.constexpr, BLOCK_QUERIES: tl.constexpr, DS_BAND: tl.constexpr):
    """(descriptor, rows per head) of the dS path's workspace: dS^T of every (batch, head) as
    (batch * H * rows, cols) 16-bit, rows = seq_k rounded up to the dK/dV row's BLOCK_N (DS_BLOCK_N: each
    key block's tiles whole), cols = seq_q rounded up to 8 (16-byte aligned rows); key j, query i of
    (b, h) at row (b * H + h) * rows + j, column ds_col(i, ...) (i itself unless DS_BAND). [BLOCK_KEYS,
    BLOCK_QUERIES] tiles, bounded at batch element b's end. Only tiles that dK/dV visits are written: readers mask
    the others (attn_bwd_dq_ds). DS_BAND (a band bounded on both sides, narrower than the sequence; plan.py
    ds_workspace computes the same): a row holds only the queries its key group can see (ds_col), cols =
    DS_BAND_BLOCK - 1 + the band's width + DS_BAND_BLOCK - 1, rounded up to 8, so the workspace grows with the
    band's width, not with seq_q (tiles past cols are cut off: their queries see none of the row's keys)."""
    rows, cols = ds_shape(seq_q, seq_k, lo_off, hi_off, DS_BLOCK_N, DS_BAND)
    desc = tl.make_tensor_descriptor(dS, shape=[(b + 1) * H * rows, cols], strides=[cols, 1],
                                     block_shape=[BLOCK_KEYS, BLOCK_QUERIES])
    return desc, rows


@triton.jit
def ds_col(start_m, start_n, hi_off, DS_BAND: tl.constexpr):
    """The workspace column (ds_tiles) of query block start_m in the row of key start_n: start_m, or with DS_BAND
    counted from the first DS_BAND_BLOCK-aligned query block that can see start_n's aligned group of DS_BAND_BLOCK keys
    (query i sees key j only if i >= j - hi_off; hi_off as masking.place gives it). Every tile a kernel visits
    (blocks of at most DS_BAND_BLOCK queries and keys, aligned to their size) lies in one group of keys and
    starts at or right of that column (jax_flash_amd/plan.py checks the rows' blocks)."""
    if DS_BAND:
        group = start_n // DS_BAND_BLOCK * DS_BAND_BLOCK
        start_m = start_m - tl.maximum(group - hi_off, 0) // DS_BAND_BLOCK * DS_BAND_BLOCK
    return start_m


@triton.jit
def _dq_ds_inner(dq, ds_desc, k_desc, ds_row, kv_row, kv_col, lo, hi, lo2, hi2, start_m, seq_q, seq_k, lo_off,
                 hi_off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, MASKED: tl.constexpr,
                 DS_BAND: tl.constexpr):
    """Key blocks of [lo, hi) then [lo2, hi2): dq += dS K, the invisible pairs selected away where MASKED
    (their tiles may never have been written)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    for i in range(0, span_blocks(lo, hi, lo2, hi2, BLOCK_N)):
        start_n = span_block(i, lo, hi, lo2, BLOCK_N)
        ds_t = ds_desc.load([ds_row + start_n, ds_col(start_m, start_n, hi_off, DS_BAND)])  # [BN, BM]
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            ds_t = tl.where(visible(offs_m[None, :], offs_n[:, None], seq_q, seq_k, lo_off, hi_off, 0, 0, BANDED,
                                    False), ds_t, 0.0)
        k = k_desc.load([kv_row + start_n, kv_col])
        dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k, dq, input_precision="ieee")
    return dq


@triton.jit
def attn_bwd_dq_ds(K, Positions, dS, sm_scale, seq_q, seq_k, lo_off, hi_off, dQ, H: tl.constexpr,
                   KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BANDED: tl.constexpr, POSITIONS: tl.constexpr, DS_BLOCK_N: tl.constexpr,
                   GROUP_PROGRAMS: tl.constexpr = TILED_GROUP_PROGRAMS, DS_BAND: tl.constexpr = False):
    """dQ = scale dS K from the dS path's workspace dS (ds_tiles; DS_BLOCK_N: the dK/dV row's BLOCK_N):
    one product per tile where attn_bwd_dq computes three. The key blocks of masking.key_blocks, the
    band's edges masked. 16-bit, power-of-two heads (TMA descriptors). GROUP_PROGRAMS: as attn_bwd_dq's."""
    i, bh = tile_order(BANDED, GROUP_PROGRAMS)
    start_m = (tl.num_programs(0) - 1 - i) * BLOCK_M  # causal: the heaviest first
    b = bh // H
    h = bh % H
    STRIDE_KV: tl.constexpr = KV_H * HEAD_DIM
    ds_desc, ds_rows = ds_tiles(dS, b, seq_q, seq_k, lo_off, hi_off, H, DS_BLOCK_N, BLOCK_N, BLOCK_M, DS_BAND)
    k_desc = element_tiles(K, b, seq_k, STRIDE_KV, BLOCK_N, HEAD_DIM)
    lo_off, hi_off, diag, pos_q, pos_k = place(Positions, b, seq_q, seq_k, lo_off, hi_off, POSITIONS)
    start, full_start, full_end, end = key_blocks(start_m, seq_q, seq_k, lo_off, hi_off, 0, b, BLOCK_M, BLOCK_N,
                                                  BANDED, False)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    ds_row = bh * ds_rows
    kv_row = b * seq_k
    kv_col = (h // (H // KV_H)) * HEAD_DIM
    dq = _dq_ds_inner(dq, ds_desc, k_desc, ds_row, kv_row, kv_col, start, full_start, full_end, end, start_m, seq_q,
                      seq_k, lo_off, hi_off, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, MASKED=True,
                      DS_BAND=DS_BAND)
    dq = _dq_ds_inner(dq, ds_desc, k_desc, ds_row, kv_row, kv_col, full_start, full_end, full_end, full_end,
                      start_m, seq_q, seq_k, lo_off, hi_off, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED,
                      MASKED=False, DS_BAND=DS_BAND)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    store_tile(dQ + head_start(b, h, seq_q, H, HEAD_DIM), dq * sm_scale, offs_m, tl.arange(0, HEAD_DIM),
               H * HEAD_DIM, seq_q, HEAD_DIM, False)


@triton.jit
def attn_bwd_dbias(Q, K, V, Slopes, Seeds, QSeg, KSeg, KeyRanges, Positions, Bias, Mask, dOut, Lse, Delta, sm_scale,
                   softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, batch, dBias, H: tl.constexpr, KV_H: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SEGMENTS: tl.constexpr,
                   DROP_THRESHOLD: tl.constexpr, POSITIONS: tl.constexpr, BIAS: tl.constexpr, MASK: tl.constexpr = 0):
    """The bias's gradient, dBias (the bias's shape, (batch | 1, H | 1, seq_q | 1, seq_k | 1), BIAS its layout):
    dS = P (dP - delta) summed over the axes the bias broadcasts along. One program per tile of it, grid
    (query blocks | 1, key blocks | 1, batch | 1 x H | 1): it recomputes S and dP for each (batch, head, query
    block, key block) the tile sums over, in a fixed order (deterministic, no atomics, no workspace). KeyRanges,
    Delta as attn_bwd_dq's (its blocks: BLOCK_M queries)."""
    ROWS: tl.constexpr = (BIAS & 2) > 0  # the bias varies along queries (else the tile sums every query)
    COLS: tl.constexpr = (BIAS & 4) > 0
    BATCHES: tl.constexpr = (BIAS & 8) > 0
    HEADS: tl.constexpr = (BIAS & 16) > 0
    TM: tl.constexpr = BLOCK_M if ROWS else 1
    TN: tl.constexpr = BLOCK_N if COLS else 1
    STRIDE: tl.constexpr = H * HEAD_DIM
    STRIDE_KV: tl.constexpr = KV_H * HEAD_DIM
    tile_b = tl.program_id(2) // (H if HEADS else 1)
    tile_h = tl.program_id(2) % (H if HEADS else 1)
    n_m = tl.cdiv(seq_q, BLOCK_M)
    n_n = tl.cdiv(seq_k, BLOCK_N)
    n_b = 1 if BATCHES else batch
    n_h = 1 if HEADS else H
    n_i = 1 if ROWS else n_m
    n_j = 1 if COLS else n_n
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([TM, TN], tl.float32)
    for t in range(0, n_b * n_h * n_i * n_j):  # batch, head, query block, key block: the last fastest
        b = tile_b if BATCHES else t // (n_h * n_i * n_j)
        h = tile_h if HEADS else (t // (n_i * n_j)) % n_h
        start_m = (tl.program_id(0) if ROWS else (t // n_j) % n_i) * BLOCK_M
        start_n = (tl.program_id(1) if COLS else t % n_j) * BLOCK_N
        bh = b * H + h
        lo, hi, diag, pos_q, pos_k = place(Positions, b, seq_q, seq_k, lo_off, hi_off, POSITIONS)
        start, _, _, end = key_blocks(start_m, seq_q, seq_k, lo, hi, KeyRanges, b, BLOCK_M, BLOCK_N, BANDED,
                                      SEGMENTS or MASK > 0)
        if (start_n >= start) & (start_n < end):  # a tile no pair of which is visible adds nothing
            offs_m = start_m + tl.arange(0, BLOCK_M)
            offs_n = start_n + tl.arange(0, BLOCK_N)
            q_base = head_start(b, h, seq_q, H, HEAD_DIM)
            kv_base = head_start(b, h // (H // KV_H), seq_k, KV_H, HEAD_DIM)
            q = load_tile(Q + q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
            do = load_tile(dOut + q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
            k = load_tile(K + kv_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
            v = load_tile(V + kv_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
            row0 = bh.to(tl.int64) * seq_q
            lse2 = _lse2(Lse, row0, offs_m, seq_q)
            delta = tl.load(Delta + row0 + offs_m, mask=offs_m < seq_q, other=0.0)
            slope = 0.0
            if ALIBI:
                slope = tl.load(Slopes + bh)
            bias, mask = dense_planes(Bias, Mask, b, h, seq_q, seq_k, H, BIAS, MASK)
            s0 = dense_start(bias, mask, offs_m[:, None], offs_n[None, :], seq_q, seq_k, sm_scale,
                             [BLOCK_M, BLOCK_N], BIAS, MASK, SOFTCAP)
            s, scale2, dlogit = scores(tl.dot(q, tl.trans(k), s0, input_precision="ieee"), offs_m[:, None],
                                       offs_n[None, :], load_ids(QSeg, b, offs_m, seq_q, SEGMENTS)[:, None],
                                       load_ids(KSeg, b, offs_n, seq_k, SEGMENTS)[None, :], seq_q, seq_k, lo, hi,
                                       diag, sm_scale, softcap, slope, MASKED=True, BANDED=BANDED, SEGMENTS=SEGMENTS,
                                       SOFTCAP=SOFTCAP, ALIBI=ALIBI, bias=bias, mask=mask, BIAS=BIAS,
                                       MASK=MASK)  # [BM, BN]
            p = tl.math.exp2(s * scale2 - lse2[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            kept = False
            if DROP_THRESHOLD > 0:
                kept = keep(load_seed(Seeds, bh, DROP_THRESHOLD), start_m + pos_q, start_n + pos_k, DROP_THRESHOLD,
                            BLOCK_M, BLOCK_N)
            ds = dropped_ds(p, dp, delta[:, None], kept, DROP_THRESHOLD)  # the bias enters after softcap
            if not ROWS:
                ds = tl.sum(ds, 0, keep_dims=True)
            if not COLS:
                ds = tl.sum(ds, 1, keep_dims=True)
            acc += ds
    offs_i = tl.program_id(0) * TM + tl.arange(0, TM)
    offs_j = tl.program_id(1) * TN + tl.arange(0, TN)
    plane = dense_plane(dBias, tile_b, tile_h, seq_q, seq_k, H, BIAS)
    rows = seq_q if ROWS else 1
    cols = seq_k if COLS else 1
    tl.store(plane + offs_i[:, None] * cols + offs_j[None, :], kept_scaled(acc, keep_scale, DROP_THRESHOLD).to(
        dBias.dtype.element_ty), mask=(offs_i[:, None] < rows) & (offs_j[None, :] < cols))
