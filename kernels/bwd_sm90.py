"""Hopper dK/dV in Gluon: the backward's key-block loop with explicit barriers, so that lse and delta arrive through
TMA beside q and dO (Triton 3.6's own warp specialisation raced on a third TMA tile per iteration and had to take
them through pointers: docs/tuning.md, Hopper dK/dV), and each warp group's softmax
runs while its other product is on the tensor cores.

Same contract as bwd.attn_bwd_dkdv's TMA rows (layout, GQA, bands, softcap, ALiBi, dropout; Lse in base 2, Delta
from the caller; DS: dS^T also to the dS path's workspace, bwd.ds_tiles' layout) for 16-bit inputs with a head of 64
or 128 and no segment ids or positions: which calls take it is jax_flash_amd/plan.py gluon_dkdv_row. The scores, the
mask and dropout's draw are scores.py's, masking.py's and dropout.py's, called from here.

One program per (128 keys, batch element, key/value head), in masking.tile_order's order, three partitions:
- a load warp: the key block's K and V once, then for each query block (of each query head reading this key/value
  head) q, dO, lse and delta through a ring of STAGES buffers (TMA, mbarriers ready / empty);
- two consumer warp groups, 64 keys each. Per query block: S^T = K q^T and dP^T = V dO^T issued together; once S^T
  is in, P^T = exp2(S^T - lse) runs while dP^T is computed; dV += P^T dO is issued, and dS^T = P^T (dP^T - delta)
  runs beside it; dK += dS^T q is issued, and the block ends when both products are done (the other group's
  products keep the tensor cores busy meanwhile).
Descriptors are bounded at the end of the program's batch element (masking.element_tiles' rule). Persistent (N_ROWS
> 0, a row's PERSISTENT: plan.gluon_programs): about one program per SM over masking.persistent_tile's tiles,
descriptors over the whole batch (whole blocks only), the ring carried across tiles and two tiles' K / V buffers.
SPANS: each group passes over the query steps that see none of its keys (_consume_tile)."""
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .bwd import _pass_turn, _wait_turn, ds_col, ds_shape, kept_scaled
from .configs import TILED_GROUP_PROGRAMS
from .dropout import dropped_ds, keep_at
from .fwd_sm90 import (BUFFERED, ROWS, block_scores, dense_block, dense_buffer, dense_copy, dense_reads, head_scalars,
                       tiles, tma_load, tma_store)
from .masking import batch_inner, dense_planes, persistent_rounds, persistent_tile, query_blocks, tile_order


@gluon.jit
def _rows(T, n, BLOCK_M: gl.constexpr):
    """[BLOCK_M] fp32 tiles of the flat (batch * heads * lse_len) T (Lse, Delta), n elements long: a row past a
    head's seq_q reads padding or the next head's value, which only masked (P = 0) rows see."""
    layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    return tma.make_tensor_descriptor(T, [n], [1], [BLOCK_M], layout)


@gluon.jit
def _query_block(i, begin, kv_h, GROUP: gl.constexpr, BLOCK_M: gl.constexpr):
    """(query head, first query) of iteration i: the GROUP heads of key/value head kv_h innermost."""
    return kv_h * GROUP + i % GROUP, begin + (i // GROUP) * BLOCK_M


@gluon.jit
def _key_span(start_n, bh, seq_q, seq_k, lo_off, hi_off, KV_H: gl.constexpr, GROUP: gl.constexpr,
              BLOCK_M: gl.constexpr, BANDED: gl.constexpr):
    """Key block start_n of row bh = batch * KV_H + key/value head: (b, kv_h, begin, full_begin, full_end, n_iters),
    masking.query_blocks' queries in n_iters steps of BLOCK_M queries of one of the GROUP query heads."""
    b = bh // KV_H
    begin, full_begin, full_end, end = query_blocks(start_n, seq_q, seq_k, lo_off, hi_off, 0, b, BLOCK_M, 2 * ROWS,
                                                    BANDED, False)
    return b, bh % KV_H, begin, full_begin, full_end, gl.cdiv(end - begin, BLOCK_M) * GROUP


@gluon.jit
def _key_tile(r, n_n, n_rows):
    """(start_n, bh) of a persistent program's round r: masking.persistent_tile's order over n_n key blocks of n_rows
    = batch * KV_H rows, its blocks counted from the other end (causal: key block 0 sees the most queries, and goes
    first)."""
    block, bh = persistent_tile(r, n_n, n_rows)
    return (n_n - 1 - block) * (2 * ROWS), bh


@gluon.jit
def _load_tile(k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
               delta_smem, kv_buf, kv_bar, q_ready, do_ready, empty, b, kv_h, start_n, begin, n_iters, ring, seq_q,
               seq_k, lse_len, H: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
               STAGES: gl.constexpr):
    """The load warp's share of one key block: its K and V (k_smem / v_smem[kv_buf + half], on kv_bar), then q, dO,
    lse and delta of each of its steps through the ring of STAGES, from the ring's position `ring` (steps loaded
    before: a persistent program's earlier tiles)."""
    kv_row = b * seq_k + start_n
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    for half in gl.static_range(2):
        tma_load(k_desc, [kv_row + half * ROWS, kv_h * HEAD_DIM], kv_bar, k_smem.index(kv_buf + half))
        tma_load(v_desc, [kv_row + half * ROWS, kv_h * HEAD_DIM], kv_bar, v_smem.index(kv_buf + half))
    for i in range(n_iters):
        s = (ring + i) % STAGES
        # a fresh barrier has completed no phase, and a wait for parity 1 passes: the first round waits for nothing
        mbarrier.wait(empty.index(s), (((ring + i) // STAGES) & 1) ^ 1)
        h, start_m = _query_block(i, begin, kv_h, GROUP, BLOCK_M)
        row = b * seq_q + start_m
        flat = (b * H + h) * lse_len + start_m
        mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
        tma_load(q_desc, [row, h * HEAD_DIM], q_ready.index(s), q_smem.index(s))
        tma_load(lse_desc, [flat], q_ready.index(s), lse_smem.index(s))
        mbarrier.expect(do_ready.index(s), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        tma_load(do_desc, [row, h * HEAD_DIM], do_ready.index(s), do_smem.index(s))
        tma_load(delta_desc, [flat], do_ready.index(s), delta_smem.index(s))


@gluon.jit
def _loads_tiles(k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
                 delta_smem, kv_bar, kv_empty, q_ready, do_ready, empty, n_n, n_rows, seq_q, seq_k, lo_off, hi_off,
                 lse_len, H: gl.constexpr, KV_H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 STAGES: gl.constexpr, BANDED: gl.constexpr):
    """A persistent program's load warp: tile r's K and V into buffer pair r % 2 once both groups have stored tile
    r - 2's dK and dV from it (kv_empty), so they load while the groups work on tile r - 1; the ring runs on."""
    ring = 0
    for r in range(persistent_rounds(n_n * n_rows)):
        start_n, bh = _key_tile(r, n_n, n_rows)
        b, kv_h, begin, _, _, n_iters = _key_span(start_n, bh, seq_q, seq_k, lo_off, hi_off, KV_H, H // KV_H,
                                                  BLOCK_M, BANDED)
        mbarrier.wait(kv_empty.index(r % 2), ((r // 2) & 1) ^ 1)  # (a fresh barrier passes parity 1)
        _load_tile(k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
                   delta_smem, 2 * (r % 2), kv_bar.index(r % 2), q_ready, do_ready, empty, b, kv_h, start_n, begin,
                   n_iters, ring, seq_q, seq_k, lse_len, H, H // KV_H, HEAD_DIM, BLOCK_M, STAGES)
        ring += n_iters


@gluon.jit
def _probs(st, q_idx, k_idx, masked, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope, lse,
           BANDED: gl.constexpr, MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, bias=0, mask=0,
           BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0):
    """(P, dlogit) of a score tile st (S^T in dK/dV, S in dQ; q_idx / k_idx and lse broadcast to its shape, lse as
    bwd._seen gives it): bwd._dkdv_tile's and _dq_inner's, masked where `masked` (MAY_MASK) and by a dense bias's /
    mask's tiles (block_scores')."""
    s, scale2, dlogit = block_scores(st, q_idx, k_idx, masked, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope,
                                     BANDED, MAY_MASK, SOFTCAP, ALIBI, bias, mask, BIAS, MASK)
    return gl.exp2(s * scale2 - lse), dlogit


@gluon.jit
def _unseen(start_m, first_key, lo_off, hi_off, BLOCK_M: gl.constexpr, BANDED: gl.constexpr):
    """Whether keys [first_key, first_key + ROWS) see none of queries [start_m, start_m + BLOCK_M) by the band
    (masking.visible's bounds: query i sees key j if i + lo_off <= j <= i + hi_off, the sides BANDED bounds)."""
    past_right = first_key > start_m + BLOCK_M - 1 + hi_off
    before_left = first_key + ROWS - 1 < start_m + lo_off
    if BANDED == 3:
        return past_right | before_left
    elif BANDED == 1:
        return past_right
    elif BANDED == 2:
        return before_left
    else:
        return False


@gluon.jit
def _dq_half(ds_q, dq_bar, k_lo, k_hi, g, HALF: gl.constexpr):
    """Step g's dQ columns [HALF * D / 2, + D / 2) for its BLOCK_M queries: dS (both groups' dS^T tiles, once the
    other group's is in: dq_bar) times those columns of the key block's K (both groups' buffers), issued."""
    BLOCK_M: gl.constexpr = ds_q.shape[2]
    HALF_D: gl.constexpr = k_lo.shape[1] // 2
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, HALF_D, 16])
    mbarrier.wait(dq_bar.index(g % 2), (g // 2) & 1)
    dq = warpgroup_mma(ds_q.index(2 * (g % 2)).permute((1, 0)), k_lo.slice(HALF * HALF_D, HALF_D, dim=1),
                       gl.zeros([BLOCK_M, HALF_D], gl.float32, layout), use_acc=False, is_async=True)
    return warpgroup_mma(ds_q.index(2 * (g % 2) + 1).permute((1, 0)), k_hi.slice(HALF * HALF_D, HALF_D, dim=1), dq,
                         is_async=True)


@gluon.jit
def _dq_lock(Locks, b, h, start_m, seq_q, HALF: gl.constexpr, H: gl.constexpr, BLOCK_M: gl.constexpr):
    """The lock of (batch b, head h, query block start_m, dQ half HALF): int32 zeros (batch, H, query blocks, 2)."""
    return Locks + ((b * H + h) * gl.cdiv(seq_q, BLOCK_M) + start_m // BLOCK_M) * 2 + HALF


@gluon.jit
def _add_dq(dq, DQAcc, Locks, rank, b, h, start_m, seq_q, HALF: gl.constexpr, H: gl.constexpr, DQ: gl.constexpr):
    """Adds a step's dQ half [BLOCK_M, D / 2] to the float32 DQAcc (like Q): DQ == 1 by atomics, DQ == 2 in
    key-block order (bwd._add_dq's locks, one per dQ half: bitwise deterministic)."""
    layout: gl.constexpr = dq.type.layout
    BLOCK_M: gl.constexpr = dq.shape[0]
    HALF_D: gl.constexpr = dq.shape[1]
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HALF_D, layout=gl.SliceLayout(0, layout))
    # a scalar base and 32-bit offsets: 64-bit addresses per element cost registers the tile's products need
    base = DQAcc + (b * seq_q + start_m).to(gl.int64) * (H * 2 * HALF_D) + h * (2 * HALF_D) + HALF * HALF_D
    ptrs = base + (gl.expand_dims(rows, 1) * (H * 2 * HALF_D) + gl.expand_dims(cols, 0))
    inside = (gl.expand_dims(start_m + rows, 1) < seq_q) & (gl.expand_dims(cols, 0) < HALF_D)
    if DQ == 1:
        gl.atomic_add(ptrs, dq, mask=inside, sem="relaxed")
    else:
        lock = _dq_lock(Locks, b, h, start_m, seq_q, HALF, H, BLOCK_M)
        _wait_turn(lock, rank)
        # past L1 (.cg): the previous key block's program wrote these rows from another SM
        gl.store(ptrs, gl.load(ptrs, mask=inside, other=0.0, cache_modifier=".cg") + dq, mask=inside)
        _pass_turn(lock, rank)


@gluon.jit
def _pass_turns(Locks, b, kv_h, rank, lo, hi, seq_q, HALF: gl.constexpr, H: gl.constexpr, GROUP: gl.constexpr,
                BLOCK_M: gl.constexpr):
    """Passes on, in turn, the locks of query blocks [lo, hi) of each query head of kv_h, which this key block does
    not visit (bwd._pass_turns), for the dQ half HALF."""
    for j in range(0, (hi - lo) // BLOCK_M * GROUP):
        lock = _dq_lock(Locks, b, kv_h * GROUP + j % GROUP, lo + j // GROUP * BLOCK_M, seq_q, HALF, H, BLOCK_M)
        _wait_turn(lock, rank)
        gl.atomic_xchg(lock, rank + 1, sem="release")


@gluon.jit
def _step(k, v, q, do, lse_smem, delta_smem, s, ds_smem, ds_desc, do_ready, phase, dk, dv, zeros, k_idx, m_range,
          Slopes, Seeds, slope, seed, b, h, start_m, start_n, full_begin, full_end, ds_rows, seq_q, seq_k, lo_off,
          hi_off, sm_scale, softcap, HALF: gl.constexpr, H: gl.constexpr, GROUP: gl.constexpr, BANDED: gl.constexpr,
          MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr,
          DS: gl.constexpr, DS_BAND: gl.constexpr, dq_args=(), DQ: gl.constexpr = 0, Bias=0, Mask=0,
          BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0, bias_buf=0, mask_buf=0):
    """One query step of _consume_tile (q's tile already in; the ring's stage s): S^T and dP^T issued together, P^T
    while dP^T runs, dV += P^T dO issued and dS^T beside it, dK += dS^T q; (dk, dv) once both products are done.
    slope, seed: the query head's (GROUP 1), else loaded here for head h. (The stage's buffers are indexed here, not
    by the caller: indexed before the call, the loop with dropout was 61 instructions longer, sm90 SASS.)"""
    s_layout: gl.constexpr = zeros.type.layout
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk.type.layout, k_width=2)
    dtype: gl.constexpr = k.dtype
    if (BIAS | MASK) & BUFFERED:  # the step's query head's planes, their tiles' copies started before the products
        bias, mask = dense_planes(Bias, Mask, b, h, seq_q, seq_k, H, BIAS, MASK)
        dense_copy(bias, mask, bias_buf, mask_buf, start_m, start_n + HALF * ROWS, seq_q, seq_k, BIAS, MASK)
    st = warpgroup_mma(k, q.permute((1, 0)), zeros, use_acc=False, is_async=True)
    mbarrier.wait(do_ready.index(s), phase)
    dpt = warpgroup_mma(v, do.permute((1, 0)), zeros, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(1, deps=(st,))  # S^T is in, dP^T runs on
    if GROUP > 1:
        slope, seed = head_scalars(Slopes, Seeds, b * H + h, ALIBI, DROP_THRESHOLD)
    lse = lse_smem.index(s).load(col_layout)
    lse = gl.where(lse == float("-inf"), float("inf"), lse)  # bwd._seen: rows that see no key get P = 0
    q_idx = gl.expand_dims(start_m + m_range, 0)
    if not (BIAS | MASK) & BUFFERED:  # here, not before the products: the element reads' code as before
        bias, mask = dense_planes(Bias, Mask, b, h, seq_q, seq_k, H, BIAS, MASK)  # the step's query head's
    bias, mask = dense_block(bias, mask, bias_buf, mask_buf, start_m, start_n + HALF * ROWS, seq_q, seq_k, s_layout,
                             zeros.shape[1], ROWS, BIAS, MASK, True)
    p, dlogit = _probs(st, q_idx, k_idx, (start_m < full_begin) | (start_m >= full_end), seq_q, seq_k, lo_off,
                       hi_off, sm_scale, softcap, slope, gl.expand_dims(lse, 0), BANDED, MAY_MASK, SOFTCAP, ALIBI, bias,
                       mask, BIAS, MASK)
    p_kept = p  # dV's P: P keep (keep_scale on dV at the end)
    if DROP_THRESHOLD > 0:
        p_kept = gl.where(keep_at(seed, q_idx, k_idx, DROP_THRESHOLD), p, 0.0)
    pb = gl.convert_layout(p_kept.to(dtype), op_layout)
    dv = warpgroup_mma(pb, do, dv, is_async=True)
    dpt, pb = warpgroup_mma_wait(1, deps=(dpt, pb))
    delta = delta_smem.index(s).load(col_layout)
    ds = dropped_ds(p, dpt, gl.expand_dims(delta, 0), p_kept, DROP_THRESHOLD)  # P keep: dropout.dropped_ds
    if SOFTCAP:
        ds = ds * dlogit  # through softcap's tanh
    dsb = ds.to(dtype)
    if DS:
        tma.store_wait(0)  # the previous block's dS^T has left the staging buffer
        ds_smem.store(dsb)
        fence_async_shared()
        tma_store(ds_desc, [(b * H + h) * ds_rows + start_n + HALF * ROWS, ds_col(start_m, start_n, hi_off,
                                                                                  DS_BAND)], ds_smem)
    if DQ:
        ds_q, dq_bar, k_lo, k_hi, DQAcc, Locks, g, rank = dq_args
        ds_q.index(2 * (g % 2) + HALF).store(dsb)
        fence_async_shared()
        tl.debug_barrier()  # every thread's share of dS^T is in before the other group is told
        mbarrier.arrive(dq_bar.index(g % 2))
    dsb = gl.convert_layout(dsb, op_layout)
    dk = warpgroup_mma(dsb, q, dk, is_async=True)
    if DQ:
        dq = _dq_half(ds_q, dq_bar, k_lo, k_hi, g, HALF)
        dv, dk, dsb, dq = warpgroup_mma_wait(0, deps=(dv, dk, dsb, dq))
        _add_dq(dq, DQAcc, Locks, rank, b, h, start_m, seq_q, HALF, H, DQ)
    else:
        # waited here, not after the next block's S^T: dK in flight across blocks serialised every product (ptxas
        # C7512, registers; the other group's products fill the tensor cores meanwhile)
        dv, dk, dsb = warpgroup_mma_wait(0, deps=(dv, dk, dsb))
    return dk, dv


@gluon.jit
def _consume_tile(k, v, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dk_desc, dv_desc, ds_desc, Slopes, Seeds,
                  kv_bar, kv_phase, q_ready, do_ready, empty, b, kv_h, kv_row, kv_col, start_n, begin, full_begin,
                  full_end, n_iters, ring, ds_rows, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, keep_scale,
                  HALF: gl.constexpr, H: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr, MAY_MASK: gl.constexpr,
                  SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, DS: gl.constexpr,
                  DS_BAND: gl.constexpr, SPANS: gl.constexpr, dq_args=(), DQ: gl.constexpr = 0, Bias=0, Mask=0,
                  BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0, bias_buf=0, mask_buf=0):
    """Keys [start_n + HALF * ROWS, + ROWS) (k, v: their buffers, on kv_bar at parity kv_phase; dK's and dV's rows
    from kv_row, columns from kv_col: passed, not computed here, the tiled loop is 6 instructions shorter, sm90 SASS):
    dK and dV over the tile's query steps (from the ring's position `ring`), masked outside [full_begin, full_end).
    Dropout (DROP_THRESHOLD > 0) as bwd._dkdv_tile's: P keep for dV, and dS / keep_scale (dropout.dropped_ds),
    keep_scale on dK and dV once at the end; the mask regenerated from the query head's seed (dropout.keep_at).
    SPANS: a step whose queries see none of this group's keys (_unseen: a band's first or last step of the tile for
    one of the two groups) is passed over: no product, no dS^T stored (attn_bwd_dq_ds selects such pairs away: they
    lie in its masked blocks). A window (1024, 0) skips 1 of each group's 18 steps; sm90 SASS per step, D 128:
    window 616 / 722 -> 578 / 584, but causal 497 / 532 -> 494 / 655 (plan.py _dkdv_step: narrow windows only).
    DQ (dq_args = (dS^T buffers, their barriers, both groups' K buffers, DQAcc, Locks, rank)): each step's dQ half
    also, from both groups' dS^T (_dq_half, _add_dq); no SPANS; dK and dV leave through V's buffer, since the other
    group reads this group's K for its dQ until its last step. Bias, Mask (BIAS, MASK): a dense bias and mask, and
    both groups' buffers of their tiles (fwd_sm90.dense_buffer, BUFFERED; _step)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    dtype: gl.constexpr = k.dtype
    if BIAS & BUFFERED:  # the group's own
        bias_buf = bias_buf.index(HALF)
    if MASK & BUFFERED:
        mask_buf = mask_buf.index(HALF)
    k_idx = gl.expand_dims(start_n + HALF * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout)), 1)
    m_range = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    zeros = gl.zeros([ROWS, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    if GROUP == 1:  # one query head: its slope and seed once, so the seed's mixing (two loads and ~33 uniform
        # operations) and the key rows' share of dropout's hash can leave the loop (ptxas hoists them: sm90 SASS,
        # docs/tuning.md, dropout; with GROUP > 1 they are per block: _step)
        slope, seed = head_scalars(Slopes, Seeds, b * H + kv_h, ALIBI, DROP_THRESHOLD)
    else:
        slope, seed = 0.0, 0
    mbarrier.wait(kv_bar, kv_phase)
    if DQ == 2:
        _pass_turns(dq_args[5], b, kv_h, dq_args[6], 0, begin, seq_q, HALF, H, GROUP, BLOCK_M)
    for i in range(n_iters):
        s = (ring + i) % STAGES
        phase = ((ring + i) // STAGES) & 1
        h, start_m = _query_block(i, begin, kv_h, GROUP, BLOCK_M)
        q = q_smem.index(s)
        do = do_smem.index(s)
        mbarrier.wait(q_ready.index(s), phase)
        skip = False
        if SPANS:
            skip = _unseen(start_m, start_n + HALF * ROWS, lo_off, hi_off, BLOCK_M, BANDED)
        if skip:  # each phase is still waited for: a wait for parity p passes while the phase before is pending
            mbarrier.wait(do_ready.index(s), phase)
        else:
            if DQ:
                ds_q, dq_bar, k_lo, k_hi, DQAcc, Locks, rank = dq_args
                step_args = (ds_q, dq_bar, k_lo, k_hi, DQAcc, Locks, ring + i, rank)
            else:
                step_args = ()
            dk, dv = _step(k, v, q, do, lse_smem, delta_smem, s, ds_smem, ds_desc, do_ready, phase, dk, dv, zeros,
                           k_idx, m_range, Slopes, Seeds, slope, seed, b, h, start_m, start_n, full_begin, full_end,
                           ds_rows, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, HALF, H, GROUP, BANDED, MAY_MASK,
                           SOFTCAP, ALIBI, DROP_THRESHOLD, DS, DS_BAND, step_args, DQ, Bias, Mask, BIAS, MASK,
                           bias_buf, mask_buf)
        mbarrier.arrive(empty.index(s))
    if DQ == 2:
        _pass_turns(dq_args[5], b, kv_h, dq_args[6], begin + n_iters // GROUP * BLOCK_M,
                    gl.cdiv(seq_q, BLOCK_M) * BLOCK_M, seq_q, HALF, H, GROUP, BLOCK_M)
    if DQ:
        for part in gl.static_range(2):  # dV, then dK, through V's buffer
            v.store(kept_scaled(dv if part == 0 else dk * sm_scale, keep_scale, DROP_THRESHOLD).to(dtype))
            fence_async_shared()
            tma_store(dv_desc if part == 0 else dk_desc, [kv_row + HALF * ROWS, kv_col], v)
            tma.store_wait(0)
    else:
        # K's and V's buffers are free now (this group's products are done): dK and dV leave through them
        k.store(kept_scaled(dk * sm_scale, keep_scale, DROP_THRESHOLD).to(dtype))
        v.store(kept_scaled(dv, keep_scale, DROP_THRESHOLD).to(dtype))
        fence_async_shared()
        tma_store(dk_desc, [kv_row + HALF * ROWS, kv_col], k)
        tma_store(dv_desc, [kv_row + HALF * ROWS, kv_col], v)
        tma.store_wait(0)  # (and so a persistent program may release the buffers: _consume_tiles)


@gluon.jit
def _consume_tiles(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dk_desc, dv_desc, ds_desc, Slopes,
                   Seeds, kv_bar, kv_empty, q_ready, do_ready, empty, n_n, n_rows, ds_rows, seq_q, seq_k, lo_off,
                   hi_off, sm_scale, softcap, keep_scale, HALF: gl.constexpr, H: gl.constexpr, KV_H: gl.constexpr,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr,
                   SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, DS: gl.constexpr,
                   DS_BAND: gl.constexpr, SPANS: gl.constexpr, dq_args=(), DQ: gl.constexpr = 0):
    """A persistent program's consumer group: its tiles one after another (whole blocks: masked only by a band),
    tile r's keys in buffer pair r % 2, released (kv_empty) once this group's dK and dV have left it."""
    ring = 0
    for r in range(persistent_rounds(n_n * n_rows)):
        start_n, bh = _key_tile(r, n_n, n_rows)
        b, kv_h, begin, full_begin, full_end, n_iters = _key_span(start_n, bh, seq_q, seq_k, lo_off, hi_off, KV_H,
                                                                  H // KV_H, BLOCK_M, BANDED)
        tile_dq = ()
        if DQ:  # (dS^T buffers, barriers, this tile's K buffers, DQAcc, Locks, rank)
            tile_dq = (dq_args[0], dq_args[1], k_smem.index(2 * (r % 2)), k_smem.index(2 * (r % 2) + 1), dq_args[2],
                       dq_args[3], 0)
        _consume_tile(k_smem.index(2 * (r % 2) + HALF), v_smem.index(2 * (r % 2) + HALF), q_smem, do_smem, lse_smem,
                      delta_smem, ds_smem, dk_desc, dv_desc, ds_desc, Slopes, Seeds, kv_bar.index(r % 2),
                      (r // 2) & 1, q_ready, do_ready, empty, b, kv_h, b * seq_k + start_n, kv_h * HEAD_DIM, start_n,
                      begin, full_begin, full_end, n_iters, ring, ds_rows, seq_q, seq_k, lo_off, hi_off, sm_scale,
                      softcap, keep_scale, HALF, H, H // KV_H, HEAD_DIM, BLOCK_M, STAGES, BANDED, BANDED, SOFTCAP,
                      ALIBI, DROP_THRESHOLD, DS, DS_BAND, SPANS, tile_dq, DQ)
        mbarrier.arrive(kv_empty.index(r % 2))  # after _consume_tile's store_wait: its dK and dV have left
        ring += n_iters


@gluon.jit
def _dkdv_program(Q, K, V, Slopes, Seeds, dOut, Lse, Delta, DQAcc, Locks, sm_scale, softcap, keep_scale, seq_q, seq_k,
                  lo_off, hi_off, lse_len, dK, dV, dS, H: gl.constexpr, KV_H: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr, SOFTCAP: gl.constexpr,
                  ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, EVEN: gl.constexpr, DS: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr, DS_BAND: gl.constexpr, GROUP_PROGRAMS: gl.constexpr,
                  N_ROWS: gl.constexpr, SPANS: gl.constexpr, DQ: gl.constexpr, Bias=0, Mask=0, BIAS: gl.constexpr = 0,
                  MASK: gl.constexpr = 0, DENSE_TILES: gl.constexpr = False, BATCH_INNER: gl.constexpr = False):
    """attn_bwd_dkdv_sm90 and attn_bwd_dkdvdq_sm90 (DQ), which see."""
    gl.static_assert(not (BIAS or MASK) or (N_ROWS == 0 and DQ == 0), "a dense bias or mask: tiled, no dQ")
    gl.static_assert(N_ROWS == 0 or EVEN, "a persistent grid takes whole blocks")
    gl.static_assert(DQ != 2 or N_ROWS == 0, "the ordered dQ sum takes the tiled grid's order")
    if DENSE_TILES and EVEN and (BIAS or MASK):  # whole key blocks: a dense tile's rows start 16-byte aligned
        seq_k = seq_k // 16 * 16  # equal, and known so (multiple_of on an argument does not reach the partitions)
    BLOCK_N: gl.constexpr = 2 * ROWS
    GROUP: gl.constexpr = H // KV_H
    KV_BUF: gl.constexpr = 2 if N_ROWS > 0 else 1  # tiles' K / V buffer pairs
    if N_ROWS > 0:
        last = N_ROWS // KV_H - 1  # descriptors over the whole batch
        start_n = 0
        bh = 0
    else:
        i, bh = tile_order(BANDED, GROUP_PROGRAMS)
        rank = 0
        if DQ == 2:  # dQ summed in launch order, the lightest key block first (bwd._dkdv_program)
            rank = gl.program_id(0)
            i = gl.num_programs(0) - 1 - rank
            bh = gl.program_id(1)
        if BATCH_INNER:
            bh = batch_inner(bh, KV_H)
        start_n = i * BLOCK_N  # causal: key block 0 sees the most queries, and goes first
        last = bh // KV_H
    k_desc = tiles(K, last, seq_k, KV_H * HEAD_DIM, ROWS, HEAD_DIM)
    v_desc = tiles(V, last, seq_k, KV_H * HEAD_DIM, ROWS, HEAD_DIM)
    dk_desc = tiles(dK, last, seq_k, KV_H * HEAD_DIM, ROWS, HEAD_DIM)
    dv_desc = tiles(dV, last, seq_k, KV_H * HEAD_DIM, ROWS, HEAD_DIM)
    q_desc = tiles(Q, last, seq_q, H * HEAD_DIM, BLOCK_M, HEAD_DIM)
    do_desc = tiles(dOut, last, seq_q, H * HEAD_DIM, BLOCK_M, HEAD_DIM)
    lse_desc = _rows(Lse, (last + 1) * H * lse_len, BLOCK_M)
    delta_desc = _rows(Delta, (last + 1) * H * lse_len, BLOCK_M)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ds_rows = 0
    ds_desc = k_desc  # a placeholder where not DS (never stored to)
    if DS:
        ds_rows, ds_cols = ds_shape(seq_q, seq_k, lo_off, hi_off, BLOCK_N, DS_BAND)
        ds_desc = tma.make_tensor_descriptor(dS, [(last + 1) * H * ds_rows, ds_cols], [ds_cols, 1], [ROWS, BLOCK_M],
                                             ds_layout)
    dtype: gl.constexpr = Q.dtype.element_ty
    k_smem = gl.allocate_shared_memory(dtype, [2 * KV_BUF, ROWS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2 * KV_BUF, ROWS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    # DQ: two steps' dS^T of both groups (a step's buffers are rewritten two steps on, when the other group has
    # passed the barrier of the step between, so has read them)
    ds_smem = gl.allocate_shared_memory(dtype, [4 if DQ else (2 if DS else 1), ROWS, BLOCK_M], ds_layout)
    bar: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [KV_BUF, 1], bar)
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    for t in gl.static_range(KV_BUF):
        mbarrier.init(kv_bar.index(t), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(do_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # released by both consumer groups
    dq_bar = empty  # a placeholder where not DQ
    if DQ:
        dq_bar = gl.allocate_shared_memory(gl.int64, [2, 1], bar)
        for t in gl.static_range(2):
            mbarrier.init(dq_bar.index(t), count=2)  # both groups' dS^T in
    fence_async_shared()

    if N_ROWS > 0:
        kv_empty = gl.allocate_shared_memory(gl.int64, [KV_BUF, 1], bar)  # released by both groups
        for t in gl.static_range(KV_BUF):
            mbarrier.init(kv_empty.index(t), count=2)
        fence_async_shared()
        n_n = gl.cdiv(seq_k, BLOCK_N)
        gl.warp_specialize([
            (_consume_tiles, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem.index(0), dk_desc,
                              dv_desc, ds_desc, Slopes, Seeds, kv_bar, kv_empty, q_ready, do_ready, empty, n_n, N_ROWS,
                              ds_rows, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, keep_scale, 0, H, KV_H,
                              HEAD_DIM, BLOCK_M, STAGES, BANDED, SOFTCAP, ALIBI, DROP_THRESHOLD, DS, DS_BAND,
                              SPANS, (ds_smem, dq_bar, DQAcc, Locks), DQ)),
            (_consume_tiles, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem.index(1 if DS else 0),
                              dk_desc, dv_desc, ds_desc, Slopes, Seeds, kv_bar, kv_empty, q_ready, do_ready, empty,
                              n_n, N_ROWS, ds_rows, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, keep_scale, 1, H,
                              KV_H, HEAD_DIM, BLOCK_M, STAGES, BANDED, SOFTCAP, ALIBI, DROP_THRESHOLD, DS, DS_BAND,
                              SPANS, (ds_smem, dq_bar, DQAcc, Locks), DQ)),
            (_loads_tiles, (k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem,
                            lse_smem, delta_smem, kv_bar, kv_empty, q_ready, do_ready, empty, n_n, N_ROWS, seq_q, seq_k,
                            lo_off, hi_off, lse_len, H, KV_H, HEAD_DIM, BLOCK_M, STAGES, BANDED)),
        ], [4, 1], [CONSUMER_REGS, 24])
        for t in gl.static_range(KV_BUF):
            mbarrier.invalidate(kv_empty.index(t))
    else:
        b, kv_h, begin, full_begin, full_end, n_iters = _key_span(start_n, bh, seq_q, seq_k, lo_off, hi_off, KV_H,
                                                                  GROUP, BLOCK_M, BANDED)
        MAY_MASK: gl.constexpr = BANDED or not EVEN
        BIAS_B: gl.constexpr = dense_reads(BIAS, EVEN, DENSE_TILES, Bias.dtype.element_ty.primitive_bitwidth)
        MASK_B: gl.constexpr = dense_reads(MASK, EVEN, DENSE_TILES, Mask.dtype.element_ty.primitive_bitwidth)
        bias_buf = dense_buffer(Bias, BLOCK_M, ROWS, BIAS_B)
        mask_buf = dense_buffer(Mask, BLOCK_M, ROWS, MASK_B)
        kv_row = b * seq_k + start_n
        kv_col = kv_h * HEAD_DIM
        dq_args = (ds_smem, dq_bar, k_smem.index(0), k_smem.index(1), DQAcc, Locks, rank)
        gl.warp_specialize([
            (_consume_tile, (k_smem.index(0), v_smem.index(0), q_smem, do_smem, lse_smem, delta_smem,
                             ds_smem.index(0), dk_desc, dv_desc, ds_desc, Slopes, Seeds, kv_bar.index(0), 0, q_ready,
                             do_ready, empty, b, kv_h, kv_row, kv_col, start_n, begin, full_begin, full_end, n_iters, 0,
                             ds_rows, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, keep_scale, 0, H, GROUP,
                             HEAD_DIM, BLOCK_M, STAGES, BANDED, MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, DS, DS_BAND,
                             SPANS, dq_args, DQ, Bias, Mask, BIAS_B, MASK_B, bias_buf, mask_buf)),
            (_consume_tile, (k_smem.index(1), v_smem.index(1), q_smem, do_smem, lse_smem, delta_smem,
                             ds_smem.index(1 if DS else 0), dk_desc, dv_desc, ds_desc, Slopes, Seeds, kv_bar.index(0),
                             0, q_ready, do_ready, empty, b, kv_h, kv_row, kv_col, start_n, begin, full_begin, full_end,
                             n_iters, 0, ds_rows, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, keep_scale, 1, H,
                             GROUP, HEAD_DIM, BLOCK_M, STAGES, BANDED, MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, DS,
                             DS_BAND, SPANS, dq_args, DQ, Bias, Mask, BIAS_B, MASK_B, bias_buf, mask_buf)),
            (_load_tile, (k_desc, v_desc, q_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem,
                          lse_smem, delta_smem, 0, kv_bar.index(0), q_ready, do_ready, empty, b, kv_h, start_n, begin,
                          n_iters, 0, seq_q, seq_k, lse_len, H, GROUP, HEAD_DIM, BLOCK_M, STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])
    for t in gl.static_range(KV_BUF):
        mbarrier.invalidate(kv_bar.index(t))
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(q_ready.index(s))
        mbarrier.invalidate(do_ready.index(s))
        mbarrier.invalidate(empty.index(s))


@gluon.jit
def attn_bwd_dkdv_sm90(Q, K, V, Slopes, Seeds, dOut, Lse, Delta, Bias, Mask, sm_scale, softcap, keep_scale, seq_q,
                       seq_k, lo_off, hi_off, lse_len, dK, dV, dS, H: gl.constexpr, KV_H: gl.constexpr,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr,
                       SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, EVEN: gl.constexpr,
                       DS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       DS_BAND: gl.constexpr = False, GROUP_PROGRAMS: gl.constexpr = TILED_GROUP_PROGRAMS,
                       N_ROWS: gl.constexpr = 0, SPANS: gl.constexpr = False, BIAS: gl.constexpr = 0,
                       MASK: gl.constexpr = 0, DENSE_TILES: gl.constexpr = False, BATCH_INNER: gl.constexpr = False):
    """bwd.attn_bwd_dkdv's arguments of the same names (Bias, Mask: the tiled grid only, their tiles read as DENSE_TILES
    says: fwd_sm90.dense_reads; BATCH_INNER: rows taken batch-fastest, masking.batch_inner); grid (cdiv(seq_k, 128),
    batch * KV_H). Lse and Delta are (batch, H, lse_len), lse_len a multiple of 4: a TMA tile must start 16-byte aligned
    (one that did not stopped the H200 with an illegal instruction), so the caller pads them where seq_q is not. EVEN:
    seq_q a multiple of BLOCK_M and seq_k of 128 (else the ragged blocks are masked). dS: the workspace (DS;
    bwd.ds_tiles with 128-key rows), else a placeholder. CONSUMER_REGS: registers per thread of the second consumer
    group. SPANS: each consumer group passes over the query steps that see none of its 64 keys (_consume_tile). N_ROWS >
    0: persistent, grid (programs, 1), over the key blocks of N_ROWS = batch * KV_H rows (EVEN: one descriptor per
    tensor serves every tile; plan.gluon_programs): the descriptors made once, the ring carried across tiles, two tiles'
    K and V buffers so that the next tile's load while a tile runs (the tiled program pays its nine descriptors, its K /
    V load and its pipeline's fill, and its dK / dV store, alone on its SM)."""
    _dkdv_program(Q, K, V, Slopes, Seeds, dOut, Lse, Delta, 0, 0, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off,
                  hi_off, lse_len, dK, dV, dS, H, KV_H, HEAD_DIM, BLOCK_M, STAGES, BANDED, SOFTCAP, ALIBI,
                  DROP_THRESHOLD, EVEN, DS, CONSUMER_REGS, DS_BAND, GROUP_PROGRAMS, N_ROWS, SPANS, 0, Bias, Mask, BIAS,
                  MASK, DENSE_TILES, BATCH_INNER)


@gluon.jit
def attn_bwd_dkdvdq_sm90(Q, K, V, Slopes, Seeds, dOut, Lse, Delta, DQAcc, Locks, sm_scale, softcap, keep_scale, seq_q,
                         seq_k, lo_off, hi_off, lse_len, dK, dV, dQAcc, dLocks, H: gl.constexpr, KV_H: gl.constexpr,
                         HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr,
                         SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, EVEN: gl.constexpr,
                         CONSUMER_REGS: gl.constexpr, DQ: gl.constexpr, GROUP_PROGRAMS: gl.constexpr = 1,
                         N_ROWS: gl.constexpr = 0):
    """The linear backward on Hopper: attn_bwd_dkdv_sm90's dK and dV, and each step's dS K added to DQAcc, float32
    zeros like Q (dQ = sm_scale keep_scale DQAcc after; bwd.attn_bwd_dkdv_dq's contract): DQ == 1 by atomics, DQ == 2
    in key-block order through Locks, int32 zeros (batch, H, query blocks, 2; the tiled grid only): bitwise
    deterministic. Each consumer group adds the dQ columns of its half of the head (D / 2), from both groups' dS^T.
    dQAcc and dLocks are DQAcc's and Locks' buffers, updated in place (jax-triton's input_output_aliases)."""
    _dkdv_program(Q, K, V, Slopes, Seeds, dOut, Lse, Delta, DQAcc, Locks, sm_scale, softcap, keep_scale, seq_q, seq_k,
                  lo_off, hi_off, lse_len, dK, dV, dK, H, KV_H, HEAD_DIM, BLOCK_M, STAGES, BANDED, SOFTCAP, ALIBI,
                  DROP_THRESHOLD, EVEN, False, CONSUMER_REGS, False, GROUP_PROGRAMS, N_ROWS, False, DQ, Q, Q)  # Bias,
    # Mask: placeholders (BIAS = MASK = 0), never read
