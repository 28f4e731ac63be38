"""Forward kernel: online softmax in base 2, masking paid only on boundary blocks.

Layout: q, out (batch, seq_q, H, HEAD_DIM); k, v (batch, seq_k, KV_H, HEAD_DIM), contiguous, so the
row strides H * HEAD_DIM and KV_H * HEAD_DIM are compile-time constants (aligned vector loads); lse
(batch, H, seq_q) fp32, in base 2 (log2 of the row sums of 2^(log2(e) logits)). Grouped-query attention: query head h reads key/value head
h // (H // KV_H), in place (no copy per query head). One program per (query block, batch * H).
Dropout (DROP_THRESHOLD > 0, dropout.py) zeroes probabilities after the row sums are taken, and the
output is scaled by keep_scale = 1 / (1 - rate).
FP8 (inference, P8_LOG2 > 0): q, k, v in a float8 type with dequantisation factors QDescale, KDescale,
VDescale (batch, KV_H) float32. The q.k dot runs in fp8 with fp32 accumulation and its scale absorbs
q_descale * k_descale; P (in [0, 1]) is computed as P * 2 ** P8_LOG2 (jax_flash_amd/fp8.py: the
exponent shift costs no multiply) and rounded to v's fp8 type for the PV dot, which keeps small
probabilities out of e4m3's subnormals; the row sums carry the same factor, so the output's division
cancels it, and lse subtracts it; the output applies v_descale. V comes transposed, (batch, KV_H, HEAD_DIM,
seq_k rounded up to 16; keys_last below): fp8 MMAs read both operands K-major from shared memory, and
only a tile whose keys are contiguous (and 16-byte aligned rows) is copied there asynchronously, i.e.
pipelined.
"""
import triton
import triton.language as tl

from .dropout import keep, load_seed
from .masking import (dense_planes, element_tiles, head_start, key_blocks, load_ids, load_tile, persistent_rounds,
                      persistent_tile, place, span_block, span_blocks, store_tile, tile_order)
from .configs import TILED_GROUP_PROGRAMS
from .scores import dense_start, scores


@triton.jit
def keys_padded(seq_k):
    """The row length of the fp8 forward's V^T: seq_k rounded up to 16 (16-byte aligned rows, said so to
    the compiler), jax_flash_amd/_launch.py: keys_last."""
    return tl.multiple_of((seq_k + 15) // 16 * 16, 16)


@triton.jit
def _fwd_block(acc, l_i, m_i, q, k, v_base, v_desc, kv_row, kv_col, start_n, start_m, seq_q, seq_k, lo_off, hi_off,
               diag, pos_q, pos_k, sm_scale, softcap, slope, q_ids, KSeg, b, seed, bias, mask, STRIDE_KV: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BANDED: tl.constexpr, MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
               SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr, P8_LOG2: tl.constexpr, TMA: tl.constexpr,
               POSITIONS: tl.constexpr, BIAS: tl.constexpr, MASK: tl.constexpr):
    """One key block at start_n (its K tile k already loaded): the online-softmax update. diag, pos_q,
    pos_k: masking.place; bias, mask: the dense operands' planes (masking.dense_plane)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_ids = load_ids(KSeg, b, offs_n, seq_k, SEGMENTS and MASKED)
    qk = tl.dot(q, tl.trans(k), dense_start(bias, mask, offs_m[:, None], offs_n[None, :], seq_q, seq_k, sm_scale,
                                            [BLOCK_M, BLOCK_N], BIAS, MASK, SOFTCAP), input_precision="ieee")
    s, scale2, _ = scores(qk, offs_m[:, None], offs_n[None, :], q_ids[:, None], k_ids[None, :], seq_q, seq_k, lo_off,
                          hi_off, diag, sm_scale, softcap, slope, MASKED=MASKED, BANDED=BANDED, SEGMENTS=SEGMENTS,
                          SOFTCAP=SOFTCAP, ALIBI=ALIBI, bias=bias, mask=mask, BIAS=BIAS, MASK=MASK)  # [BM, BN]
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
    m_use = m_new
    if MASKED:  # a row that has seen no key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s * scale2 - (m_use - P8_LOG2)[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROP_THRESHOLD > 0:  # after the row sum: dropout acts on normalised probabilities
        p = tl.where(keep(seed, start_m + pos_q, start_n + pos_k, DROP_THRESHOLD, BLOCK_M, BLOCK_N), p, 0.0)
    if P8_LOG2 > 0:  # v_base: this head's V^T, rows seq_k rounded up to 16 apart
        stride_vt = keys_padded(seq_k)
        # bounded by the padded length (zeros past seq_k, where P is 0): a mask constant over 16 keys
        v = tl.trans(load_tile(v_base, offs_d, offs_n, stride_vt, HEAD_DIM, stride_vt, BLOCK_D != HEAD_DIM, MASKED))
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    else:
        if TMA:
            v = v_desc.load([kv_row + start_n, kv_col])
        else:
            v = load_tile(v_base, offs_n, offs_d, STRIDE_KV, seq_k, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # [BN, BD]
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    return acc, l_i, m_new


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, kv_col, lo, hi, lo2, hi2, start_m, seq_q,
               seq_k, lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, q_ids, KSeg, b, seed, bias, mask,
               STRIDE_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BANDED: tl.constexpr, MASKED: tl.constexpr, SOFTCAP: tl.constexpr,
               ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr, P8_LOG2: tl.constexpr,
               TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, POSITIONS: tl.constexpr, BIAS: tl.constexpr,
               MASK: tl.constexpr):
    """Key blocks of [lo, hi) then [lo2, hi2). TMA (one span, lo2 == hi2): K and V tiles from the
    descriptors k_desc / v_desc at (kv_row + start_n, kv_col), the loop striding over start_n itself (what Triton's
    warp-specialisation pass partitions); else pointer loads from k_base / v_base, the loop over the blocks of both
    spans (span_block). One loop serves both (constexpr bounds), so that _fwd_block's call is written once."""
    offs_d = tl.arange(0, BLOCK_D)
    for n in tl.range(lo if TMA else 0, hi if TMA else span_blocks(lo, hi, lo2, hi2, BLOCK_N), BLOCK_N if TMA else 1,
                      warp_specialize=WARP_SPECIALIZE):
        if TMA:
            start_n = n
            k = k_desc.load([kv_row + start_n, kv_col])
        else:
            start_n = span_block(n, lo, hi, lo2, BLOCK_N)
            k = load_tile(k_base, start_n + tl.arange(0, BLOCK_N), offs_d, STRIDE_KV, seq_k, HEAD_DIM, MASKED,
                          BLOCK_D != HEAD_DIM)  # [BN, BD]
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k, v_base, v_desc, kv_row, kv_col, start_n, start_m, seq_q, seq_k,
                                   lo_off, hi_off, diag, pos_q, pos_k, sm_scale, softcap, slope, q_ids, KSeg, b, seed,
                                   bias, mask, STRIDE_KV=STRIDE_KV, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, MASKED=MASKED, SOFTCAP=SOFTCAP,
                                   ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD, P8_LOG2=P8_LOG2,
                                   TMA=TMA, POSITIONS=POSITIONS, BIAS=BIAS, MASK=MASK)
    return acc, l_i, m_i


@triton.jit
def attn_fwd(Q, K, V, Slopes, Seeds, QSeg, KSeg, KeyRanges, QDescale, KDescale, VDescale, Positions, Bias, Mask, Part,
             PartLse, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off, batch, Out, Lse, H: tl.constexpr,
             KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
             SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr, P8_LOG2: tl.constexpr, POSITIONS: tl.constexpr,
             TMA: tl.constexpr = False, WARP_SPECIALIZE: tl.constexpr = False, KEYS_EVEN: tl.constexpr = False,
             EDGES_FIRST: tl.constexpr = False, PERSISTENT: tl.constexpr = False, EDGES: tl.constexpr = 0,
             GROUP_PROGRAMS: tl.constexpr = TILED_GROUP_PROGRAMS, BIAS: tl.constexpr = 0, MASK: tl.constexpr = 0):
    """lo_off / hi_off / BANDED: the visible band, QSeg / KSeg (batch, seq) int32 and KeyRanges /
    SEGMENTS: segment ids, Positions (batch, 3) int32 / POSITIONS: the call as a block of a larger one
    (masking.py); Mask / MASK: a dense boolean mask (int8, a layout of masking.dense_plane's; KeyRanges then
    also bound by it); softcap / SOFTCAP, Slopes (batch, H) fp32 / ALIBI and Bias / BIAS (a dense bias):
    logit modifiers (scores.py);
    Seeds (batch, H, 2) uint32, keep_scale, DROP_THRESHOLD: dropout (dropout.py); QDescale, KDescale,
    VDescale / P8_LOG2: fp8 inputs (above). TMA (Hopper config rows): Q, K and V move through
    device-side TMA descriptors where the head is a power of two and the inputs 16-bit;
    WARP_SPECIALIZE then splits the key loop into producer and consumer warps (sm90 rows, kernels/configs.py;
    which calls take them: jax_flash_amd/plan.py takes_tma), KEYS_EVEN says every key block is whole.
    EDGES_FIRST (config rows): the masked key blocks at the band's edges before the unmasked ones; the
    order only changes how LLVM allocates registers (AMD: where the unmasked loop keeps its buffer
    descriptors in SGPRs instead of re-copying them every iteration).
    PERSISTENT (Hopper rows, whole query and key blocks only; which calls: jax_flash_amd/plan.py
    persistent_programs): a grid of (programs, 1), each program looping over tiles in
    masking.persistent_tile's order, with the TMA descriptors made once per program, over the whole
    tensors (no tile crosses a batch element). Otherwise one program per (query block, batch * H), and
    batch is unused.
    EDGES (which calls: jax_flash_amd/plan.py edges_apart): 0 every key block of the band; 1 (the TMA
    loop) only the blocks every row of the query block sees, unmasked, Out then float32: a partial result
    (out, lse) that is the online softmax's whole state; 2 (pointer loads) only the masked blocks at the
    band's edges, continuing from that partial result (Part, PartLse; placeholders otherwise). Triton 3.6's
    warp-specialised loop can take no second loop nor branch, so without this it masks every block of a band
    (H200: +11-19 % on the D 128 forward). GROUP_PROGRAMS: a causal tiled grid's group (masking.tile_order)."""
    # EDGES: the unmasked part through TMA; no dropout, fp8 or segment ids (the partial would carry keep_scale,
    # lse P8_LOG2's shift, and the segments mask every block)
    tl.static_assert(EDGES == 0 or ((EDGES == 2 or TMA) and DROP_THRESHOLD == 0 and P8_LOG2 == 0
                                    and not SEGMENTS))
    if PERSISTENT:
        q_desc = Q
        k_desc = K
        v_desc = V
        if TMA:
            q_desc, k_desc, v_desc = _fwd_tiles(Q, K, V, batch - 1, seq_q, seq_k, H=H, KV_H=KV_H, HEAD_DIM=HEAD_DIM,
                                                BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        n_m = tl.cdiv(seq_q, BLOCK_M)
        for r in range(0, persistent_rounds(n_m * batch * H)):
            block, bh = persistent_tile(r, n_m, batch * H)
            _fwd_tile(block * BLOCK_M, bh, q_desc, k_desc, v_desc, Q, K, V, Slopes, Seeds, QSeg, KSeg, KeyRanges,
                      QDescale, KDescale, VDescale, Positions, Bias, Mask, Part, PartLse, sm_scale, softcap,
                      keep_scale, seq_q, seq_k, lo_off, hi_off, Out, Lse, H=H, KV_H=KV_H, HEAD_DIM=HEAD_DIM,
                      BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP,
                      ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD, P8_LOG2=P8_LOG2,
                      POSITIONS=POSITIONS, TMA=TMA, WARP_SPECIALIZE=WARP_SPECIALIZE, KEYS_EVEN=KEYS_EVEN,
                      EDGES_FIRST=EDGES_FIRST, DESCRIPTORS=True, EDGES=EDGES, BIAS=BIAS, MASK=MASK)
    else:
        # heaviest (causal: last) query blocks first, so the ragged tail of the grid is cheap work
        i, bh = tile_order(BANDED, GROUP_PROGRAMS)
        start_m = (tl.num_programs(0) - 1 - i) * BLOCK_M
        _fwd_tile(start_m, bh, Q, K, V, Q, K, V, Slopes, Seeds, QSeg, KSeg, KeyRanges, QDescale, KDescale, VDescale,
                  Positions, Bias, Mask, Part, PartLse, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off, hi_off,
                  Out, Lse, H=H, KV_H=KV_H, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                  BANDED=BANDED, SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD,
                  P8_LOG2=P8_LOG2, POSITIONS=POSITIONS, TMA=TMA, WARP_SPECIALIZE=WARP_SPECIALIZE,
                  KEYS_EVEN=KEYS_EVEN, EDGES_FIRST=EDGES_FIRST, DESCRIPTORS=False, EDGES=EDGES, BIAS=BIAS, MASK=MASK)


@triton.jit
def _fwd_tiles(Q, K, V, last, seq_q, seq_k, H: tl.constexpr, KV_H: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The TMA path's descriptors (q, k, v) of tiles of batch elements up to `last` (masking.element_tiles):
    a program's own element, or the whole batch for a persistent one."""
    k_desc = element_tiles(K, last, seq_k, KV_H * HEAD_DIM, BLOCK_N, BLOCK_D)
    v_desc = element_tiles(V, last, seq_k, KV_H * HEAD_DIM, BLOCK_N, BLOCK_D)
    q_desc = element_tiles(Q, last, seq_q, H * HEAD_DIM, BLOCK_M, BLOCK_D)
    return q_desc, k_desc, v_desc


@triton.jit
def _fwd_tile(start_m, bh, q_desc, k_desc, v_desc, Q, K, V, Slopes, Seeds, QSeg, KSeg, KeyRanges, QDescale, KDescale,
              VDescale, Positions, Bias, Mask, Part, PartLse, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off,
              hi_off, Out, Lse, H: tl.constexpr, KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr, SOFTCAP: tl.constexpr,
              ALIBI: tl.constexpr, SEGMENTS: tl.constexpr, DROP_THRESHOLD: tl.constexpr, P8_LOG2: tl.constexpr,
              POSITIONS: tl.constexpr, TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, KEYS_EVEN: tl.constexpr,
              EDGES_FIRST: tl.constexpr, DESCRIPTORS: tl.constexpr, EDGES: tl.constexpr, BIAS: tl.constexpr,
              MASK: tl.constexpr):
    """Query block [start_m, start_m + BLOCK_M) of (batch * H) row bh, with attn_fwd's arguments (TMA:
    its TMA). DESCRIPTORS: q_desc, k_desc, v_desc are the TMA path's descriptors, made by the caller;
    else they are made here, bounded at this tile's batch element."""
    b = bh // H
    h = bh % H
    STRIDE: tl.constexpr = H * HEAD_DIM
    STRIDE_KV: tl.constexpr = KV_H * HEAD_DIM
    q_start = head_start(b, h, seq_q, H, HEAD_DIM)
    bh_kv = b * KV_H + h // (H // KV_H)
    kv_start = head_start(b, h // (H // KV_H), seq_k, KV_H, HEAD_DIM)
    q_base = Q + q_start
    k_base = K + kv_start
    v_base = V + kv_start
    if P8_LOG2 > 0:
        v_base = V + bh_kv.to(tl.int64) * HEAD_DIM * keys_padded(seq_k)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    slope = 0.0
    if ALIBI:
        slope = tl.load(Slopes + bh)
    # TMA (Hopper): Q, K and V through masking.element_tiles descriptors. All key blocks of the band run
    # in one loop. (Triton 3.6, sm90: the warp-specialisation pass fails to compile a kernel with a second
    # key loop, a dot outside the loop, a pointer-loaded Q, segment ids or a reshape (Philox's dropout draw),
    # leaves a loop with a branch unpartitioned; 3-D descriptors with reshaped tiles compile but hang on H200.)
    kv_col = (h // (H // KV_H)) * HEAD_DIM
    kv_row = b * seq_k
    if TMA:
        if not DESCRIPTORS:
            q_desc, k_desc, v_desc = _fwd_tiles(Q, K, V, b, seq_q, seq_k, H=H, KV_H=KV_H, HEAD_DIM=HEAD_DIM,
                                                BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        q = q_desc.load([b * seq_q + start_m, h * HEAD_DIM])
    else:
        q = load_tile(q_base, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # [BM, BD]
    if EDGES == 2:  # the partial result (out, lse) as the state (acc, l, m) = (out, 1, lse), or empty rows
        acc = load_tile(Part + q_start, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
        m_i = tl.load(PartLse + bh.to(tl.int64) * seq_q + offs_m, mask=offs_m < seq_q, other=float("-inf"))
        l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    lo_off, hi_off, diag, pos_q, pos_k = place(Positions, b, seq_q, seq_k, lo_off, hi_off, POSITIONS)
    # segment ids and a dense mask bound the key blocks by KeyRanges, and every visited block is masked
    start, full_start, full_end, end = key_blocks(start_m, seq_q, seq_k, lo_off, hi_off, KeyRanges, b, BLOCK_M,
                                                  BLOCK_N, BANDED, SEGMENTS or MASK > 0)
    q_ids = load_ids(QSeg, b, offs_m, seq_q, SEGMENTS)
    bias, mask = dense_planes(Bias, Mask, b, h, seq_q, seq_k, H, BIAS, MASK)
    seed = load_seed(Seeds, bh, DROP_THRESHOLD)
    v_descale = 1.0
    if P8_LOG2 > 0:
        sm_scale = sm_scale * tl.load(QDescale + bh_kv) * tl.load(KDescale + bh_kv)
        v_descale = tl.load(VDescale + bh_kv)
    if TMA:
        # masked unless no block needs it (no band, no segment ids, whole key blocks: KEYS_EVEN), or EDGES == 1:
        # the blocks every row sees, unmasked (a second launch takes the edges)
        TMA_MASKED: tl.constexpr = (BANDED or SEGMENTS or not KEYS_EVEN) and EDGES != 1
        if EDGES == 1:
            start = full_start
            end = full_end
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, kv_col, start, end,
                                   end, end, start_m, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k,
                                   sm_scale, softcap, slope, q_ids, KSeg, b, seed, bias, mask, MASKED=TMA_MASKED,
                                   STRIDE_KV=STRIDE_KV, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                                   BLOCK_N=BLOCK_N, BANDED=BANDED, SOFTCAP=SOFTCAP,
                                   ALIBI=ALIBI, SEGMENTS=SEGMENTS, DROP_THRESHOLD=DROP_THRESHOLD, P8_LOG2=P8_LOG2,
                                   TMA=True, WARP_SPECIALIZE=WARP_SPECIALIZE, POSITIONS=POSITIONS, BIAS=BIAS,
                                   MASK=MASK)
    else:
        # key blocks every row sees, unmasked, and those at the band's edges, masked (one loop, both spans);
        # EDGES_FIRST: the masked ones first; EDGES == 2: those only
        for i in tl.static_range(2):
            if (i == 0) == EDGES_FIRST:  # this pass: the edges' spans, masked
                lo, hi, lo2, hi2 = start, full_start, full_end, end
            else:  # the blocks every row sees, unmasked
                lo, hi, lo2, hi2 = full_start, full_end, full_end, full_end
            if (i == 0) == EDGES_FIRST or EDGES != 2:
                acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, kv_row, kv_col, lo, hi,
                                           lo2, hi2, start_m, seq_q, seq_k, lo_off, hi_off, diag, pos_q, pos_k,
                                           sm_scale, softcap, slope, q_ids, KSeg, b, seed, bias, mask,
                                           MASKED=(i == 0) == EDGES_FIRST, STRIDE_KV=STRIDE_KV, HEAD_DIM=HEAD_DIM,
                                           BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BANDED=BANDED,
                                           SOFTCAP=SOFTCAP, ALIBI=ALIBI, SEGMENTS=SEGMENTS,
                                           DROP_THRESHOLD=DROP_THRESHOLD, P8_LOG2=P8_LOG2, TMA=False,
                                           WARP_SPECIALIZE=False, POSITIONS=POSITIONS, BIAS=BIAS, MASK=MASK)

    # rows that saw no key: output 0, lse -inf
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if DROP_THRESHOLD > 0:
        out = out * keep_scale
    if P8_LOG2 > 0:
        out = out * v_descale
    # lse in base 2, as the backward reads it (jax_flash_amd/_dispatch.py returns it times ln 2): a round
    # trip through the natural log would cost two float32 roundings at |lse| up to hundreds, which the
    # backward's P = exp2(s - lse2) takes as relative error (half of float32 dV's error)
    lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)) - P8_LOG2)
    store_tile(Out + q_start, out, offs_m, offs_d, STRIDE, seq_q, HEAD_DIM, BLOCK_D != HEAD_DIM)
    tl.store(Lse + bh.to(tl.int64) * seq_q + offs_m, lse, mask=offs_m < seq_q)


@triton.jit
def mma_order(w, r):
    """The key at byte r of word w (position 4w + r) of keys_last's MMA_ORDER rows. Hopper's fp8 wgmma reads P
    from registers in another order than its product S leaves them in: a thread holds S's keys 2c, 2c + 1, 8 + 2c,
    9 + 2c (and 16 more) of each 32, P's positions 4c .. 4c + 3. Keys and positions as bits (h, j1, c, j0) and
    (h, c, j1, j0): with V^T's keys so ordered, P's positions are S's registers (fwd_sm90._pv)."""
    h = (w % 8) // 4
    c = w % 4
    return (w // 8) * 32 + 16 * h + 8 * (r // 2) + 2 * c + (r % 2)


@triton.jit
def keys_last(V, seq_k, Vt, KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_N: tl.constexpr, MMA_ORDER: tl.constexpr = False):
    """Vt (batch, KV_H, HEAD_DIM, seq_k rounded up to 16, zeros past seq_k) = V (batch, seq_k, KV_H,
    HEAD_DIM) transposed, for the fp8 forward. Bytes are packed four keys to a 32-bit word in registers
    before the transposition, which then moves 32-bit words through shared memory, not single bytes
    (H200, 4 x 4096 x 16 x 128, Nsight Compute: 16.5 us, against 25.8 for XLA's transpose and pad).
    MMA_ORDER: the keys of each 32 in mma_order's order (fwd_sm90.py), each 16 within its own half."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    seq_pad = keys_padded(seq_k)
    offs_w = start_n // 4 + tl.arange(0, BLOCK_N // 4)  # words: keys 4w .. 4w + 3
    offs_d = tl.arange(0, BLOCK_D)
    base = V.to(tl.pointer_type(tl.uint8)) + head_start(bh // KV_H, bh % KV_H, seq_k, KV_H, HEAD_DIM)
    words = tl.zeros((BLOCK_N // 4, BLOCK_D), tl.uint32)
    for r in tl.static_range(4):  # key 4w + r is byte r (little-endian) of word w
        keys = 4 * offs_w + r
        if MMA_ORDER:
            keys = mma_order(offs_w, r)
        v = load_tile(base, keys, offs_d, KV_H * HEAD_DIM, seq_k, HEAD_DIM, True,
                      BLOCK_D != HEAD_DIM)  # [BN / 4, BD], zeros past seq_k
        words = words | (v.to(tl.uint32) << (8 * r))
    ptrs = (Vt.to(tl.pointer_type(tl.uint32)) + bh.to(tl.int64) * HEAD_DIM * (seq_pad // 4)
            + offs_d[:, None] * (seq_pad // 4) + offs_w[None, :])
    tl.store(ptrs, tl.trans(words), mask=(offs_d[:, None] < HEAD_DIM) & (offs_w[None, :] < seq_pad // 4))
