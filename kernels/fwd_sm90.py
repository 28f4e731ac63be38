"""Hopper forward in Gluon: FlashAttention-3's overlap of the products with the softmax, which Triton 3.6's own
warp specialisation cannot express (docs/tuning.md, Hopper forward).

Same contract as fwd.attn_fwd (layout, GQA, bands, softcap, ALiBi, dropout; lse in base 2), for 16-bit inputs with a
head of 64 or 128 and no segment ids or positions: which calls take it is jax_flash_amd/plan.py gluon_forward_row. The
scores and the mask are scores.py's and masking.py's, called from here. FP8 (P8_LOG2 > 0): fwd.attn_fwd's scheme
(the descales, P scaled by 2 ** P8_LOG2 and rounded to fp8, V transposed by fwd.keys_last: fp8 wgmma reads B with its
contraction dimension contiguous; here with its keys in fwd.mma_order's order, _pv), the output bfloat16 through a
buffer of its own.

One program per (128 queries, batch element, head), in masking.tile_order's order, three partitions:
- a load warp: Q once, then each key block's K and V through a ring of STAGES buffers (TMA, mbarriers ready / empty);
- two consumer warp groups of 64 queries each. Each issues block j's q.k product, then block j - 1's P.V, waits for
  q.k alone (warpgroup_mma_wait(1)), runs block j's softmax, waits for P.V and rescales. The two groups' products and
  softmaxes interleave on the SM. (ptxas places the wait for P.V before the softmax, sm90 SASS: a group's P.V does
  not run beside its own softmax. Holding the wait after it, by a shared store of l and a barrier, measured bf16
  D 128 -1 to +6 % faster, D 64 and fp8 within +-4 % on the H200, h200_fence_sweep.json; not done.) PINGPONG: the groups
  take turns to issue their products (FlashAttention-3's ping-pong, _my_turn).
Descriptors are bounded at the end of the program's batch element (masking.element_tiles' rule), so a ragged block
reads zeros there and its output rows past the end are not stored.

Persistent (N_ROWS > 0; configs.SM90_GLUON_FWD's PERSISTENT rows, plan.gluon_programs): a grid of about one program
per SM, each running its tiles in masking.persistent_tile's order with one descriptor per tensor (whole query and key
blocks only), the K / V rings' position carried from tile to tile; the groups release Q's buffer after a tile's last
q.k (q_empty), and the output has buffers of its own, so the load warp brings the next tile's Q and keys while the
groups finish a tile (the tiled grid pays that fill per program: H200, 16 x 1024 x 16 x 128 0.325 -> 0.256 ms).
fp8 with each tile's descales (configs.SM90_GLUON_FWD_FP8). CARRY: two tiles' Q buffers, and a
group issues the next tile's first q.k before its tile's last P.V, so its change of tile leaves no gap on the tensor
cores (H200, D 64 4 x 4096 x 32 1.333 -> 1.305 ms, causal 0.707 -> 0.673). PINGPONG without CARRY: the groups' turns
run on across tiles."""
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from .configs import TILED_GROUP_PROGRAMS
from .dropout import keep_at, load_seed
from .fwd import keys_padded
from .masking import (batch_inner, dense_planes, dense_pointers, dense_tile, key_blocks, persistent_rounds,
                      persistent_tile, tile_order)
from .scores import dense_added, scores

# Gluon is experimental: triton 3.9 renamed the TMA copies (3.6's names raise there); the kernel compiles with both
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
copy_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

ROWS = gl.constexpr(64)  # queries per consumer warp group: wgmma's M for one warp group


@gluon.jit
def tiles(T, b, seq, ROW: gl.constexpr, BLOCK_ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """[BLOCK_ROWS, HEAD_DIM] tiles of (batch, seq, heads, HEAD_DIM) T viewed as (batch * seq, ROW), bounded at
    the end of batch element b (masking.element_tiles)."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_ROWS, HEAD_DIM], T.dtype.element_ty)
    return tma.make_tensor_descriptor(T, [(b + 1) * seq, ROW], [ROW, 1], [BLOCK_ROWS, HEAD_DIM], layout)


@gluon.jit
def keys_last_tiles(Vt, b, seq_k, KV_H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr):
    """[HEAD_DIM, BLOCK_N] tiles of fwd.keys_last's (batch, KV_H, HEAD_DIM, seq_k rounded up to 16) Vt: a tile holds
    one head's rows, and keys past seq_k are keys_last's zeros, or past the row's end, the descriptor's."""
    seq_pad = keys_padded(seq_k)
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEAD_DIM, BLOCK_N], Vt.dtype.element_ty)
    return tma.make_tensor_descriptor(Vt, [(b + 1) * KV_H * HEAD_DIM, seq_pad], [seq_pad, 1], [HEAD_DIM, BLOCK_N],
                                      layout)


@gluon.jit
def _turns(PINGPONG: gl.constexpr):
    """The consumer groups' turn mbarriers (PINGPONG's, _my_turn), initialised if PINGPONG."""
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if PINGPONG:
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
    return turn


@gluon.jit
def kv_rings(STAGES: gl.constexpr):
    """(k_ready, v_ready, k_empty, v_empty): the mbarriers of K's and V's rings of STAGES buffers, initialised: ready
    completes with the TMA's bytes, empty once both consumer groups have released the buffer."""
    bar: gl.constexpr = mbarrier.MBarrierLayout()
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=2)
        mbarrier.init(v_empty.index(s), count=2)
    return k_ready, v_ready, k_empty, v_empty


@gluon.jit
def invalidate_kv_rings(k_ready, v_ready, k_empty, v_empty, STAGES: gl.constexpr):
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(s))
        mbarrier.invalidate(v_ready.index(s))
        mbarrier.invalidate(k_empty.index(s))
        mbarrier.invalidate(v_empty.index(s))


@gluon.jit
def head_scalars(Slopes, Seeds, bh, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr):
    """(ALiBi slope, dropout seed) of row bh = batch * H + query head (0.0 and 0 where not used)."""
    slope = 0.0
    if ALIBI:
        slope = gl.load(Slopes + bh)
    return slope, load_seed(Seeds, bh, DROP_THRESHOLD)


@gluon.jit
def query_rows(start_m, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, b, bh, BLOCK_N: gl.constexpr,
               BANDED: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr):
    """What a program of 2 * ROWS queries from start_m of row bh = batch * H + head needs besides its tiles: (ALiBi
    slope, dropout seed, and masking.key_blocks' start, full_start, full_end, end)."""
    slope, seed = head_scalars(Slopes, Seeds, bh, ALIBI, DROP_THRESHOLD)
    start, full_start, full_end, end = key_blocks(start_m, seq_q, seq_k, lo_off, hi_off, Slopes, b, 2 * ROWS,
                                                  BLOCK_N, BANDED, False)
    return slope, seed, start, full_start, full_end, end


@gluon.jit
def load_keys(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, kv_col, start, n_blocks,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, vt_row=0, V_T: gl.constexpr = False, ring=0):
    """The load warp's loop over key blocks: K and V of each into their rings (kv_rings), from the rings' position
    `ring` (blocks loaded before: a persistent program's earlier tiles). V_T: v_desc is keys_last_tiles', its head's
    rows from vt_row."""
    for i in range(n_blocks):
        s = (ring + i) % STAGES
        # a fresh barrier has completed no phase, and a wait for parity 1 passes: the first round waits for nothing
        phase = (((ring + i) // STAGES) & 1) ^ 1
        row = kv_row + start + i * BLOCK_N
        mbarrier.wait(k_empty.index(s), phase)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [row, kv_col], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), phase)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        if V_T:
            tma_load(v_desc, [vt_row, start + i * BLOCK_N], v_ready.index(s), v_smem.index(s))
        else:
            tma_load(v_desc, [row, kv_col], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _loads(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row, q_col,
           kv_row, kv_col, vt_row, start, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, V_T: gl.constexpr):
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, q_col], q_bar, q_smem.index(0))
    tma_load(q_desc, [q_row + ROWS, q_col], q_bar, q_smem.index(1))
    load_keys(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, kv_row, kv_col, start, n_blocks,
              BLOCK_N, STAGES, vt_row, V_T)


@gluon.constexpr_function
def _coalesced(rows, cols, bits):
    """A blocked layout of a [rows, cols] tile of `bits`-bit elements, contiguous along cols, for one warp group:
    16-byte vectors along cols."""
    vec = min(128 // bits, cols)
    lanes = min(32, cols // vec)
    return gl.BlockedLayout([1, vec], [32 // lanes, lanes], [4, 1], [1, 0])


# a dense operand's layout bits (beside operands.dense_layout's) in the Gluon kernels (dense_block): not read element
# by element in the product's layout but as a vector along its one axis and converted (VECTORS), or through a shared
# buffer per consumer group, copied in 16-byte pieces (VECTORS and BUFFERED: dense_copy)
VECTORS = gl.constexpr(64)
BUFFERED = gl.constexpr(32)


@gluon.constexpr_function
def dense_reads(layout, aligned, tiles, bits):
    """A dense operand's layout with its read's bits, with `tiles` (the launch's DENSE_TILES), for a 16-bit or
    narrower operand (a float32 bias's buffers with a mask's passed the shared memory): VECTORS along one axis;
    VECTORS and BUFFERED along queries and keys where the planes' rows are 16-byte aligned (`aligned`: whole blocks;
    ragged ones read element by element: their 16-byte vectors, unaligned, were 2-byte loads still, sm90)."""
    if not tiles or not layout & 6 or bits > 16:  # (a scalar operand is one load either way)
        return layout
    if (layout & 6) == 6:
        return layout | 96 if aligned else layout
    return layout | 64


@gluon.jit
def dense_buffer(Dense, Q_N: gl.constexpr, K_N: gl.constexpr, LAYOUT: gl.constexpr):
    """The two consumer groups' shared [Q_N, K_N] buffers of a BUFFERED dense operand's tiles (0 if not BUFFERED),
    swizzled: read in a product's layout without bank conflicts."""
    buf = 0
    if LAYOUT & BUFFERED:
        bits: gl.constexpr = Dense.dtype.element_ty.primitive_bitwidth
        buf = gl.allocate_shared_memory(Dense.dtype.element_ty, [2, Q_N, K_N],
                                        gl.SwizzledSharedLayout(128 // bits, 1, 8, [1, 0]))
    return buf


@gluon.jit
def _copy(buf, plane, q0, k0, seq_q, seq_k):
    """Starts the copy of a plane's tile (queries from q0, keys from k0: masking.dense_pointers; zeros past the
    sequences) into buf, in 16-byte pieces (k0 // 16 * 16: k0 itself, dense_copy's, known 16-aligned so)."""
    lay: gl.constexpr = _coalesced(buf.shape[0], buf.shape[1], buf.dtype.primitive_bitwidth)
    q_idx = gl.expand_dims(q0 + gl.arange(0, buf.shape[0], layout=gl.SliceLayout(1, lay)), 1)
    k_idx = gl.expand_dims(k0 // 16 * 16 + gl.arange(0, buf.shape[1], layout=gl.SliceLayout(0, lay)), 0)
    ptrs, inside = dense_pointers(plane, q_idx, k_idx, seq_q, seq_k)
    copy_load(buf, ptrs, inside)


@gluon.jit
def dense_copy(bias, mask, bias_buf, mask_buf, q0, k0, seq_q, seq_k, BIAS: gl.constexpr, MASK: gl.constexpr,
               go=True):
    """Starts (if go) the copies of a BUFFERED dense bias's and mask's tiles over queries from q0 and keys from k0 (k0
    a multiple of 16: key blocks start at multiples of the block, masking.key_blocks, query_blocks) into a group's
    buffers (dense_buffer's); nothing for the others. dense_block reads them."""
    if (BIAS | MASK) & BUFFERED:
        if go:
            if BIAS & BUFFERED:
                _copy(bias_buf, bias, q0, k0, seq_q, seq_k)
            if MASK & BUFFERED:
                _copy(mask_buf, mask, q0, k0, seq_q, seq_k)
            async_copy.commit_group()


@gluon.jit
def _read(buf, layout: gl.constexpr, T: gl.constexpr):
    """The tile dense_copy brought into buf, in `layout` (S^T's: T)."""
    if T:
        return buf.permute((1, 0)).load(layout)
    else:
        return buf.load(layout)


@gluon.jit
def _dense_values(plane, q0, k0, seq_q, seq_k, other, layout: gl.constexpr, Q_N: gl.constexpr, K_N: gl.constexpr,
                  LAYOUT: gl.constexpr, T: gl.constexpr):
    """dense_block's tile of a VECTORS operand without a buffer, varying along one axis (masking.dense_tile's values,
    `other` past the sequences), broadcast along the other."""
    gl.static_assert((LAYOUT & 6) != 6, "an operand varying along queries and keys is BUFFERED")
    if LAYOUT & 4:  # keys only: S's dim 1, S^T's dim 0
        k_idx = k0 + gl.arange(0, K_N, layout=gl.BlockedLayout([1], [32], [4], [0]))
        t = dense_tile(plane, 0, k_idx, seq_q, seq_k, other, LAYOUT)
        return gl.expand_dims(gl.convert_layout(t, gl.SliceLayout(1 if T else 0, layout)), 1 if T else 0)
    else:  # queries only
        q_idx = q0 + gl.arange(0, Q_N, layout=gl.BlockedLayout([1], [32], [4], [0]))
        t = dense_tile(plane, q_idx, 0, seq_q, seq_k, other, LAYOUT)
        return gl.expand_dims(gl.convert_layout(t, gl.SliceLayout(0 if T else 1, layout)), 0 if T else 1)


@gluon.jit
def dense_block(bias, mask, bias_buf, mask_buf, q0, k0, seq_q, seq_k, layout: gl.constexpr, Q_N: gl.constexpr,
                K_N: gl.constexpr, BIAS: gl.constexpr, MASK: gl.constexpr, T: gl.constexpr = False):
    """(bias, mask): the tiles of a dense bias's and mask's planes (masking.dense_planes; 0 where absent) over
    queries [q0, + Q_N) and keys [k0, + K_N), in `layout`, a consumer group's product's: S [Q_N, K_N], or S^T
    (T), read as their layouts' bits say (dense_reads): BUFFERED from the buffers dense_copy filled (waited for
    here, and released to the next copy); VECTORS as a vector and converted. Others are returned as planes,
    read by block_scores in the product's layout, where each bias element is a 2-byte load of its own (sm90 SASS:
    64 a thread per tile of the forward)."""
    if (BIAS | MASK) & BUFFERED:
        async_copy.wait_group(0)
        tl.debug_barrier()  # every thread's pieces have landed
    bias_t = bias
    if BIAS & BUFFERED:
        bias_t = _read(bias_buf, layout, T)
    elif BIAS & VECTORS:
        bias_t = _dense_values(bias, q0, k0, seq_q, seq_k, 0.0, layout, Q_N, K_N, BIAS, T)
    mask_t = mask
    if MASK & BUFFERED:
        mask_t = _read(mask_buf, layout, T)
    elif MASK & VECTORS:
        mask_t = _dense_values(mask, q0, k0, seq_q, seq_k, 0, layout, Q_N, K_N, MASK, T)
    if (BIAS | MASK) & BUFFERED:
        tl.debug_barrier()  # every thread has read the buffers: the next copy may start
    return bias_t, mask_t


@gluon.jit
def block_scores(qk, q_idx, k_idx, masked, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope,
                 BANDED: gl.constexpr, MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, bias=0,
                 mask=0, BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0):
    """scores.scores of one block's product (S or S^T: q_idx / k_idx broadcast to its shape), masked where `masked`
    (a run-time branch, MAY_MASK: Gluon has no warp-specialisation pass to refuse it): (s, scale2, dlogit). bias,
    mask: what dense_block returns for a dense bias and mask (BIAS, MASK their layouts, 0: none; not with SOFTCAP):
    tiles, or planes read here (without VECTORS), added to the product's tile (scores.dense_added)."""
    gl.static_assert(not (SOFTCAP and (BIAS or MASK)), "a dense bias or mask with softcap takes the Triton rows")
    qk = dense_added(qk, bias, mask, q_idx, k_idx, seq_q, seq_k, sm_scale, BIAS, MASK, SOFTCAP,
                     (BIAS & VECTORS) // 64 + (MASK & VECTORS) // 32)
    diag = seq_k - seq_q
    if MAY_MASK:
        if masked:
            s, scale2, dlogit = scores(qk, q_idx, k_idx, 0, 0, seq_q, seq_k, lo_off, hi_off, diag, sm_scale, softcap,
                                       slope, MASKED=True, BANDED=BANDED, SEGMENTS=False, SOFTCAP=SOFTCAP,
                                       ALIBI=ALIBI)
        else:
            s, scale2, dlogit = scores(qk, q_idx, k_idx, 0, 0, seq_q, seq_k, lo_off, hi_off, diag, sm_scale, softcap,
                                       slope, MASKED=False, BANDED=BANDED, SEGMENTS=False, SOFTCAP=SOFTCAP,
                                       ALIBI=ALIBI)
    else:
        s, scale2, dlogit = scores(qk, q_idx, k_idx, 0, 0, seq_q, seq_k, lo_off, hi_off, diag, sm_scale, softcap,
                                   slope, MASKED=False, BANDED=BANDED, SEGMENTS=False, SOFTCAP=SOFTCAP, ALIBI=ALIBI)
    return s, scale2, dlogit


@gluon.jit
def _online(qk, m, l, q_idx, k_offsets, start_n, masked, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope,
            seed, BANDED: gl.constexpr, MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
            DROP_THRESHOLD: gl.constexpr, P8_LOG2: gl.constexpr, bias=0, mask=0, BIAS: gl.constexpr = 0,
            MASK: gl.constexpr = 0):
    """One key block's online-softmax step (fwd._fwd_block's) over keys start_n + k_offsets: (p, m, l, alpha);
    dropout zeroes p after the row sum (the caller scales the output by keep_scale), its hash's key columns drawn
    from the block's start (dropout.keep_at's k_start: the hash adds nothing per column; the mask's k_offsets +
    start_n is needed only where the block is masked); fp8: p and l carry 2 ** P8_LOG2. bias, mask: block_scores'
    tiles."""
    s, scale2, _ = block_scores(qk, q_idx, k_offsets + start_n, masked, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap,
                                slope, BANDED, MAY_MASK, SOFTCAP, ALIBI, bias, mask, BIAS, MASK)
    m_new = gl.maximum(m, gl.max(s, axis=1) * scale2)
    m_use = m_new
    if MAY_MASK:  # a row that has seen no key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    shift = m_use
    if P8_LOG2 > 0:
        shift = m_use - P8_LOG2
    p = gl.exp2(s * scale2 - gl.expand_dims(shift, 1))
    alpha = gl.exp2(m - m_use)
    l = l * alpha + gl.sum(p, axis=1)
    if DROP_THRESHOLD > 0:
        p = gl.where(keep_at(seed, q_idx, k_offsets, DROP_THRESHOLD, start_n), p, 0.0)
    return p, m_new, l, alpha


@gluon.jit
def _pv(p, v_smem, acc, p_layout: gl.constexpr, V_T: gl.constexpr):
    """acc += P V, issued (is_async): V's buffer as loaded, or with V_T keys_last_tiles' [HEAD_DIM, BLOCK_N] of
    keys in fwd.mma_order's order and P's columns permuted alike, which puts them where the product S left them:
    no shuffles (sm90 PTX: 99 -> 35 shfl and 64 -> 0 prmt; H200 1 x 16384 x 16 x 128 2.888 -> 2.860 ms, causal
    1.490 -> 1.374, h200_pingpong_sweep.json)."""
    p = p.to(v_smem.dtype)
    if V_T:
        n: gl.constexpr = p.shape[1]
        p = gl.reshape(gl.permute(gl.reshape(p, [ROWS, n // 32, 2, 2, 4, 2]), (0, 1, 2, 4, 3, 5)), [ROWS, n])
        p = gl.convert_layout(p, p_layout, assert_trivial=True)
        acc = warpgroup_mma(p, v_smem.permute((1, 0)), acc, is_async=True)
    else:
        p = gl.convert_layout(p, p_layout)
        acc = warpgroup_mma(p, v_smem, acc, is_async=True)
    return acc


@gluon.jit
def _my_turn(turn, j, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """PINGPONG: wait until the other consumer group has issued its products of step j - 1 (HALF 0) or j (HALF 1),
    so one group's products run beside the other's softmax (FlashAttention-3's ping-pong)."""
    if PINGPONG:
        mbarrier.wait(turn.index(HALF), (j & 1) ^ (1 - HALF))


@gluon.jit
def _their_turn(turn, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - HALF))


@gluon.constexpr_function
def _layout(of, bits, head_dim, block_n):
    """A consumer group's wgmma layout of S (`of` "s"), O ("o"), or P as O's operand ("p"), for inputs of `bits`."""
    s = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, block_n, 256 // bits])
    o = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, head_dim, 256 // bits])
    return {"s": s, "o": o, "p": gl.DotOperandLayout(operand_index=0, parent=o, k_width=32 // bits)}[of]


@gluon.jit
def _first(q, k_smem, k_ready, k_empty, turn, ring, qk, q_idx, k_idx, start, full_start, full_end, seq_q, seq_k,
           lo_off, hi_off, sm_scale, softcap, slope, seed, s_layout: gl.constexpr, HALF: gl.constexpr,
           BANDED: gl.constexpr, MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
           DROP_THRESHOLD: gl.constexpr, P8_LOG2: gl.constexpr, PINGPONG: gl.constexpr, lap=0, bias=0, mask=0,
           BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0, q0=0, bias_buf=0, mask_buf=0, n_blocks=1):
    """A tile's block 0 (its keys from `start`, the rings' block `ring`): q.k alone (into qk's registers, not added
    to), then its softmax from m = -inf, l = 0: (p, m, l, qk). PINGPONG's turns: ring + lap + j at a tile's block j
    (each tile takes n_blocks + 1; a persistent program's tile r starts at its ring position + r: lap = r, or r & 1,
    as only the parity counts). bias, mask: a dense bias's and mask's planes, the group's queries from q0, and their
    buffers (dense_buffer; the next block's tiles are copied while this block's softmax runs, if n_blocks > 1)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    dense_copy(bias, mask, bias_buf, mask_buf, q0, start, seq_q, seq_k, BIAS, MASK)
    m = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    mbarrier.wait(k_ready.index(ring % STAGES), (ring // STAGES) & 1)
    _my_turn(turn, ring + lap, HALF, PINGPONG)
    qk = warpgroup_mma(q, k_smem.index(ring % STAGES).permute((1, 0)), qk, use_acc=False, is_async=True)
    _their_turn(turn, HALF, PINGPONG)
    qk = warpgroup_mma_wait(0, deps=(qk,))
    mbarrier.arrive(k_empty.index(ring % STAGES))
    bias_t, mask_t = dense_block(bias, mask, bias_buf, mask_buf, q0, start, seq_q, seq_k, s_layout, ROWS, BLOCK_N, BIAS,
                                 MASK)
    dense_copy(bias, mask, bias_buf, mask_buf, q0, start + BLOCK_N, seq_q, seq_k, BIAS, MASK, n_blocks > 1)
    p, m, l, _ = _online(qk, m, l, q_idx, k_idx, start, (start < full_start) | (start >= full_end), seq_q, seq_k,
                         lo_off, hi_off, sm_scale, softcap, slope, seed, BANDED, MAY_MASK, SOFTCAP, ALIBI,
                         DROP_THRESHOLD, P8_LOG2, bias_t, mask_t, BIAS, MASK)
    return p, m, l, qk


@gluon.jit
def _blocks(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, ring, n_blocks, p, m, l, acc, qk, q_idx, k_idx,
            start, full_start, full_end, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope, seed,
            s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr, HALF: gl.constexpr,
            BANDED: gl.constexpr, MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
            DROP_THRESHOLD: gl.constexpr, P8_LOG2: gl.constexpr, PINGPONG: gl.constexpr, lap=0, bias=0, mask=0,
            BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0, q0=0, bias_buf=0, mask_buf=0):
    """A tile's blocks 1 .. n_blocks - 1 after _first: each block's q.k, then the block before's P.V; wait(1) returns
    once q.k is done (ptxas waits for P.V before the softmax: the module's docstring). (p, m, l, acc, qk): the last
    block's P.V not yet added. bias, mask, q0, bias_buf, mask_buf: _first's."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    for i in range(1, n_blocks):
        cur = (ring + i) % STAGES
        prev = (ring + i - 1) % STAGES
        start_n = start + i * BLOCK_N
        mbarrier.wait(k_ready.index(cur), ((ring + i) // STAGES) & 1)
        _my_turn(turn, ring + lap + i, HALF, PINGPONG)
        qk = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), qk, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((ring + i - 1) // STAGES) & 1)
        acc = _pv(p, v_smem.index(prev), acc, p_layout, P8_LOG2 > 0)
        _their_turn(turn, HALF, PINGPONG)
        qk = warpgroup_mma_wait(1, deps=(qk,))
        mbarrier.arrive(k_empty.index(cur))
        bias_t, mask_t = dense_block(bias, mask, bias_buf, mask_buf, q0, start_n, seq_q, seq_k, s_layout, ROWS, BLOCK_N,
                                     BIAS, MASK)
        dense_copy(bias, mask, bias_buf, mask_buf, q0, start_n + BLOCK_N, seq_q, seq_k, BIAS, MASK, i + 1 < n_blocks)
        p, m, l, alpha = _online(qk, m, l, q_idx, k_idx, start_n, (start_n < full_start) | (start_n >= full_end),
                                 seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope, seed, BANDED, MAY_MASK,
                                 SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2, bias_t, mask_t, BIAS, MASK)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(v_empty.index(prev))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return p, m, l, acc, qk


@gluon.jit
def _finish(acc, m, l, o, o_desc, Lse, q_row, q_col, lse_row, rows, seq_q, keep_scale, v_descale,
            o_layout: gl.constexpr, DROP_THRESHOLD: gl.constexpr, P8_LOG2: gl.constexpr, PERSISTENT: gl.constexpr):
    """A group's output rows from the accumulated acc, m, l: O through o (a shared buffer) by TMA, the lse stored.
    PERSISTENT: awaits the previous tile's store before writing o, and leaves this one's in flight."""
    # rows that saw no key: output 0, lse -inf (fwd.attn_fwd's)
    empty = l == 0.0
    l_safe = gl.where(empty, 1.0, l)
    out = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout)), 1)
    if DROP_THRESHOLD > 0:
        out = out * keep_scale
    if P8_LOG2 > 0:
        out = out * v_descale
    if PERSISTENT:
        tma.store_wait(0)  # the previous tile's output has left o
    o.store(out.to(o.dtype))  # with 16-bit inputs and a tiled grid Q's buffer, free: the products that read it are done
    fence_async_shared()
    tma_store(o_desc, [q_row, q_col], o)
    gl.store(Lse + lse_row + rows, gl.where(empty, float("-inf"), m + gl.log2(l_safe) - P8_LOG2), mask=rows < seq_q)
    if not PERSISTENT:
        tma.store_wait(0)


@gluon.jit
def _close(p, acc, m, l, v_smem, v_ready, v_empty, turn, j, o, o_desc, Lse, q_row, q_col, lse_row, rows, seq_q,
           keep_scale, v_descale, o_layout: gl.constexpr, p_layout: gl.constexpr, HALF: gl.constexpr,
           DROP_THRESHOLD: gl.constexpr, P8_LOG2: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
           lap=0):
    """A tile's last P.V (its block at the rings' position j), then _finish."""
    STAGES: gl.constexpr = v_smem.shape[0]
    mbarrier.wait(v_ready.index(j % STAGES), (j // STAGES) & 1)
    _my_turn(turn, j + 1 + lap, HALF, PINGPONG)
    acc = _pv(p, v_smem.index(j % STAGES), acc, p_layout, P8_LOG2 > 0)
    _their_turn(turn, HALF, PINGPONG)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(v_empty.index(j % STAGES))
    _finish(acc, m, l, o, o_desc, Lse, q_row, q_col, lse_row, rows, seq_q, keep_scale, v_descale, o_layout,
            DROP_THRESHOLD, P8_LOG2, PERSISTENT)


@gluon.jit
def _group_rows(start_m, HALF: gl.constexpr, s_layout: gl.constexpr):
    """The query indices of consumer group HALF's rows of the tile from start_m."""
    return start_m + HALF * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))


@gluon.jit
def _consume(q_smem, k_smem, v_smem, o_smem, o_desc, Lse, q_bar, turn, k_ready, v_ready, k_empty, v_empty, q_row, q_col,
             lse_row, start_m, start, full_start, full_end, n_blocks, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap,
             slope, seed, keep_scale, v_descale, HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, BANDED: gl.constexpr, MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr,
             ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, P8_LOG2: gl.constexpr, PINGPONG: gl.constexpr,
             ring=0, q_phase=0, q_empty=None, PERSISTENT: gl.constexpr = False, bias=0, mask=0,
             BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0, bias_buf=0, mask_buf=0):
    """A consumer group's tile: queries [start_m + HALF * ROWS, + ROWS), the key blocks from `start`, masked outside
    [full_start, full_end), and by a dense bias / mask's planes (bias, mask; their buffers bias_buf, mask_buf:
    _first's). o_smem: the output's staging buffers (q_smem's for 16-bit inputs). PERSISTENT (_consume_tiles without
    CARRY): the rings from position `ring`, Q's phase q_phase (the tile's round r & 1, also PINGPONG's lap: only its
    parity counts), Q released to q_empty after the last q.k, the output's store left in flight."""
    s_layout: gl.constexpr = _layout("s", q_smem.dtype.primitive_bitwidth, HEAD_DIM, BLOCK_N)
    o_layout: gl.constexpr = _layout("o", q_smem.dtype.primitive_bitwidth, HEAD_DIM, BLOCK_N)
    p_layout: gl.constexpr = _layout("p", q_smem.dtype.primitive_bitwidth, HEAD_DIM, BLOCK_N)
    if BIAS & BUFFERED:  # the group's own
        bias_buf = bias_buf.index(HALF)
    if MASK & BUFFERED:
        mask_buf = mask_buf.index(HALF)
    q = q_smem.index(HALF)
    rows = _group_rows(start_m, HALF, s_layout)
    q_idx = gl.expand_dims(rows, 1)
    k_idx = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
    mbarrier.wait(q_bar, q_phase)
    p, m, l, qk = _first(q, k_smem, k_ready, k_empty, turn, ring, gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                         q_idx, k_idx, start, full_start, full_end, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap,
                         slope, seed, s_layout, HALF, BANDED, MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2,
                         PINGPONG, q_phase, bias, mask, BIAS, MASK, start_m + HALF * ROWS, bias_buf, mask_buf,
                         n_blocks)
    p, m, l, acc, qk = _blocks(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, ring, n_blocks, p, m, l,
                               gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout), qk, q_idx, k_idx, start, full_start,
                               full_end, seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope, seed, s_layout,
                               o_layout, p_layout, HALF, BANDED, MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2,
                               PINGPONG, q_phase, bias, mask, BIAS, MASK, start_m + HALF * ROWS, bias_buf,
                               mask_buf)
    if PERSISTENT:  # every q.k of the tile is done: Q's buffer to the next tile
        mbarrier.arrive(q_empty)
    _close(p, acc, m, l, v_smem, v_ready, v_empty, turn, ring + n_blocks - 1, o_smem.index(HALF), o_desc, Lse,
           q_row + HALF * ROWS, q_col, lse_row, rows, seq_q, keep_scale, v_descale, o_layout, p_layout, HALF,
           DROP_THRESHOLD, P8_LOG2, PINGPONG, PERSISTENT, q_phase)


@gluon.jit
def _scales(QDescale, KDescale, VDescale, b, kv_h, sm_scale, KV_H: gl.constexpr, P8_LOG2: gl.constexpr):
    """(sm_scale, v_descale) of a tile of batch element b, key / value head kv_h: fp8 folds the q and k descales
    into sm_scale and scales the output by v's; else (sm_scale, 1.0)."""
    v_descale = 1.0
    if P8_LOG2 > 0:
        sm_scale = sm_scale * gl.load(QDescale + b * KV_H + kv_h) * gl.load(KDescale + b * KV_H + kv_h)
        v_descale = gl.load(VDescale + b * KV_H + kv_h)
    return sm_scale, v_descale


@gluon.jit
def _tile(start_m, bh, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H: gl.constexpr, KV_H: gl.constexpr,
          BLOCK_N: gl.constexpr, BANDED: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr):
    """The tile of 2 * ROWS queries from start_m of row bh = batch * H + head: (b, h, kv_h, slope, seed, start,
    full_start, full_end, n_blocks), query_rows' with its key blocks counted."""
    b = bh // H
    h = bh % H
    slope, seed, start, full_start, full_end, end = query_rows(start_m, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, b,
                                                               bh, BLOCK_N, BANDED, ALIBI, DROP_THRESHOLD)
    n_blocks = gl.cdiv(gl.maximum(end - start, 1), BLOCK_N)  # an empty band still runs one (masked) block
    return b, h, h // (H // KV_H), slope, seed, start, full_start, full_end, n_blocks


@gluon.jit
def _tile_of(r, n_m, n_rows, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H: gl.constexpr, KV_H: gl.constexpr,
             BLOCK_N: gl.constexpr, BANDED: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr):
    """Round r's tile of a persistent program (masking.persistent_tile's order over n_m query blocks of 2 * ROWS of
    n_rows = batch * H rows): (start_m, bh) and _tile's."""
    block, bh = persistent_tile(r, n_m, n_rows)
    start_m = block * (2 * ROWS)
    return (start_m, bh) + _tile(start_m, bh, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H, KV_H, BLOCK_N, BANDED,
                                 ALIBI, DROP_THRESHOLD)


@gluon.jit
def _consume_tiles(q_smem, k_smem, v_smem, o_smem, o_desc, Lse, Slopes, Seeds, QDescale, KDescale, VDescale, q_bar,
                   q_empty, turn, k_ready, v_ready, k_empty, v_empty, n_m, n_rows, seq_q, seq_k, lo_off, hi_off,
                   sm_scale, softcap, keep_scale, HALF: gl.constexpr, H: gl.constexpr, KV_H: gl.constexpr,
                   HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr,
                   MAY_MASK: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr,
                   CARRY: gl.constexpr, P8_LOG2: gl.constexpr, PINGPONG: gl.constexpr):
    """A persistent program's consumer group: its tiles one after another, the rings' position carried across them.
    CARRY: two tiles' Q buffers, the next tile's first q.k issued before a tile's last P.V and its
    softmax run before the tile's output is written, so the tensor cores do not wait for a group's change of tile.
    PINGPONG (without CARRY): the groups' turns run on from tile to tile (_first's lap)."""
    gl.static_assert(not (CARRY and PINGPONG), "PINGPONG is for persistent programs without CARRY")
    rounds = persistent_rounds(n_m * n_rows)
    if CARRY:  # tile r's Q in q_smem[2 (r % 2) + HALF] (q_bar[r % 2], released to q_empty[r % 2]), the next tile's
        # block 0 run at the end of the tile before. Tile 0's block 0 comes first, so a program needs at least one
        # round (plan.persistent_programs: never more programs than tiles).
        s_layout: gl.constexpr = _layout("s", q_smem.dtype.primitive_bitwidth, HEAD_DIM, BLOCK_N)
        o_layout: gl.constexpr = _layout("o", q_smem.dtype.primitive_bitwidth, HEAD_DIM, BLOCK_N)
        p_layout: gl.constexpr = _layout("p", q_smem.dtype.primitive_bitwidth, HEAD_DIM, BLOCK_N)
        k_idx = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
        start_m, bh, b, h, kv_h, slope, seed, start, full_start, full_end, n_blocks = _tile_of(
            0, n_m, n_rows, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H, KV_H, BLOCK_N, BANDED, ALIBI,
            DROP_THRESHOLD)
        scale, v_descale = _scales(QDescale, KDescale, VDescale, b, kv_h, sm_scale, KV_H, P8_LOG2)
        mbarrier.wait(q_bar.index(0), 0)
        p, m, l, qk = _first(q_smem.index(HALF), k_smem, k_ready, k_empty, None, 0,
                             gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                             gl.expand_dims(_group_rows(start_m, HALF, s_layout), 1), k_idx, start, full_start,
                             full_end, seq_q, seq_k, lo_off, hi_off, scale, softcap, slope, seed, s_layout, HALF,
                             BANDED, MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2, False)
    ring = 0
    for r in range(rounds):
        start_m, bh, b, h, kv_h, slope, seed, start, full_start, full_end, n_blocks = _tile_of(
            r, n_m, n_rows, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H, KV_H, BLOCK_N, BANDED, ALIBI,
            DROP_THRESHOLD)
        scale, v_descale = _scales(QDescale, KDescale, VDescale, b, kv_h, sm_scale, KV_H, P8_LOG2)
        if not CARRY:  # each tile as a tiled grid's program would run it
            _consume(q_smem, k_smem, v_smem, o_smem, o_desc, Lse, q_bar.index(0), turn, k_ready, v_ready, k_empty,
                     v_empty, b * seq_q + start_m, h * HEAD_DIM, bh.to(gl.int64) * seq_q, start_m, start, full_start,
                     full_end, n_blocks, seq_q, seq_k, lo_off, hi_off, scale, softcap, slope, seed, keep_scale,
                     v_descale, HALF, HEAD_DIM, BLOCK_N, STAGES, BANDED, MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD,
                     P8_LOG2, PINGPONG, ring, r & 1, q_empty.index(0), True)
            ring += n_blocks
        else:
            rows = _group_rows(start_m, HALF, s_layout)
            p, m, l, acc, qk = _blocks(q_smem.index(2 * (r % 2) + HALF), k_smem, v_smem, k_ready, v_ready, k_empty,
                                       v_empty, None, ring, n_blocks, p, m, l,
                                       gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout), qk, gl.expand_dims(rows, 1),
                                       k_idx, start, full_start, full_end, seq_q, seq_k, lo_off, hi_off, scale,
                                       softcap, slope, seed, s_layout, o_layout, p_layout, HALF, BANDED, MAY_MASK,
                                       SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2, False)
            mbarrier.arrive(q_empty.index(r % 2))  # every q.k of the tile is done
            last = ring + n_blocks - 1
            ring += n_blocks
            q_row = b * seq_q + start_m + HALF * ROWS
            q_col = h * HEAD_DIM
            lse_row = bh.to(gl.int64) * seq_q
            if r + 1 < rounds:
                # the next tile's block 0, its q.k issued before this tile's last P.V so that they run back to back
                start_m, bh, b, h, kv_h, slope, seed, start, full_start, full_end, n_blocks = _tile_of(
                    r + 1, n_m, n_rows, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H, KV_H, BLOCK_N, BANDED, ALIBI,
                    DROP_THRESHOLD)
                mbarrier.wait(q_bar.index((r + 1) % 2), ((r + 1) // 2) & 1)
                mbarrier.wait(k_ready.index(ring % STAGES), (ring // STAGES) & 1)
                qk = warpgroup_mma(q_smem.index(2 * ((r + 1) % 2) + HALF), k_smem.index(ring % STAGES).permute((1, 0)),
                                   qk, use_acc=False, is_async=True)
                mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
                acc = _pv(p, v_smem.index(last % STAGES), acc, p_layout, P8_LOG2 > 0)
                qk = warpgroup_mma_wait(1, deps=(qk,))
                mbarrier.arrive(k_empty.index(ring % STAGES))
                scale_next, _ = _scales(QDescale, KDescale, VDescale, b, kv_h, sm_scale, KV_H, P8_LOG2)
                p, m_next, l_next, _ = _online(
                    qk, gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout)),
                    gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout)),
                    gl.expand_dims(_group_rows(start_m, HALF, s_layout), 1), k_idx, start,
                    (start < full_start) | (start >= full_end), seq_q, seq_k, lo_off, hi_off, scale_next, softcap,
                    slope, seed, BANDED, MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2)
                acc = warpgroup_mma_wait(0, deps=(acc,))
                mbarrier.arrive(v_empty.index(last % STAGES))
                _finish(acc, m, l, o_smem.index(HALF), o_desc, Lse, q_row, q_col, lse_row, rows, seq_q, keep_scale,
                        v_descale, o_layout, DROP_THRESHOLD, P8_LOG2, True)
                m = m_next
                l = l_next
            else:
                _close(p, acc, m, l, v_smem, v_ready, v_empty, None, last, o_smem.index(HALF), o_desc, Lse, q_row,
                       q_col, lse_row, rows, seq_q, keep_scale, v_descale, o_layout, p_layout, HALF, DROP_THRESHOLD,
                       P8_LOG2, False, True)
    tma.store_wait(0)


@gluon.jit
def _loads_tiles(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, Slopes, Seeds, q_bar, q_empty, k_ready, v_ready,
                 k_empty, v_empty, n_m, n_rows, seq_q, seq_k, lo_off, hi_off, H: gl.constexpr, KV_H: gl.constexpr,
                 HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr,
                 ALIBI: gl.constexpr, CARRY: gl.constexpr, V_T: gl.constexpr):
    """A persistent program's load warp: each tile's Q once its buffer is released (_consume_tiles' QBUF), then its
    keys (V_T: fp8's V^T, keys_last_tiles)."""
    QBUF: gl.constexpr = 1 + CARRY
    ring = 0
    for r in range(persistent_rounds(n_m * n_rows)):
        # (the load warp needs neither the ALiBi slope nor the dropout seed)
        start_m, bh, b, h, kv_h, slope, seed, start, full_start, full_end, n_blocks = _tile_of(
            r, n_m, n_rows, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H, KV_H, BLOCK_N, BANDED, False, 0)
        q_row = b * seq_q + start_m
        s = r % QBUF
        mbarrier.wait(q_empty.index(s), ((r // QBUF) & 1) ^ 1)  # (a fresh barrier passes parity 1: load_keys)
        mbarrier.expect(q_bar.index(s), 2 * q_desc.block_type.nbytes)
        tma_load(q_desc, [q_row, h * HEAD_DIM], q_bar.index(s), q_smem.index(2 * s))
        tma_load(q_desc, [q_row + ROWS, h * HEAD_DIM], q_bar.index(s), q_smem.index(2 * s + 1))
        load_keys(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, b * seq_k, kv_h * HEAD_DIM,
                  start, n_blocks, BLOCK_N, STAGES, (b * KV_H + kv_h) * HEAD_DIM if V_T else 0, V_T, ring)
        ring += n_blocks


@gluon.jit
def attn_fwd_sm90(Q, K, V, Slopes, Seeds, QDescale, KDescale, VDescale, Bias, Mask, sm_scale, softcap, keep_scale,
                  seq_q, seq_k, lo_off, hi_off, Out, Lse, H: gl.constexpr, KV_H: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr, SOFTCAP: gl.constexpr,
                  ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, KEYS_EVEN: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr, P8_LOG2: gl.constexpr = 0, PINGPONG: gl.constexpr = False,
                  GROUP_PROGRAMS: gl.constexpr = TILED_GROUP_PROGRAMS, N_ROWS: gl.constexpr = 0,
                  CARRY: gl.constexpr = 0, BIAS: gl.constexpr = 0, MASK: gl.constexpr = 0,
                  DENSE_TILES: gl.constexpr = False, BATCH_INNER: gl.constexpr = False):
    """fwd.attn_fwd's arguments of the same names (fp8: V is fwd.keys_last's); grid (cdiv(seq_q, 128), batch * H).
    KEYS_EVEN: seq_k is a multiple of BLOCK_N (else the last key block is masked). CONSUMER_REGS: registers per thread
    of the second consumer group (a worker partition; the first is the default partition, which gets what the workers
    leave). N_ROWS > 0: persistent, grid (programs,), over the tiles of N_ROWS = batch * H rows (query and key
    lengths multiples of 2 * ROWS and BLOCK_N: one descriptor per tensor serves every tile), CARRY (0 / 1) and
    PINGPONG (not both) as _consume_tiles'. Bias, Mask (BIAS, MASK): a dense bias and mask, the tiled grid only
    (block_scores), their tiles read as DENSE_TILES says (dense_reads). BATCH_INNER: the tiled grid's rows taken
    batch-fastest (masking.batch_inner)."""
    gl.static_assert(N_ROWS == 0 or not (BIAS or MASK), "a dense bias or mask takes the tiled grid")
    if N_ROWS > 0:
        _persistent(Q, K, V, Slopes, Seeds, QDescale, KDescale, VDescale, sm_scale, softcap, keep_scale, seq_q, seq_k,
                    lo_off, hi_off, Out, Lse, H, KV_H, HEAD_DIM, BLOCK_N, STAGES, BANDED, SOFTCAP, ALIBI,
                    DROP_THRESHOLD, CONSUMER_REGS, N_ROWS, CARRY, P8_LOG2, PINGPONG)
    else:
        _tiled(Q, K, V, Slopes, Seeds, QDescale, KDescale, VDescale, sm_scale, softcap, keep_scale, seq_q, seq_k,
               lo_off, hi_off, Out, Lse, H, KV_H, HEAD_DIM, BLOCK_N, STAGES, BANDED, SOFTCAP, ALIBI, DROP_THRESHOLD,
               KEYS_EVEN, CONSUMER_REGS, P8_LOG2, PINGPONG, GROUP_PROGRAMS, Bias, Mask, BIAS, MASK, DENSE_TILES,
               BATCH_INNER)


@gluon.jit
def _persistent(Q, K, V, Slopes, Seeds, QDescale, KDescale, VDescale, sm_scale, softcap, keep_scale, seq_q, seq_k,
                lo_off, hi_off, Out, Lse, H: gl.constexpr, KV_H: gl.constexpr, HEAD_DIM: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, BANDED: gl.constexpr, SOFTCAP: gl.constexpr,
                ALIBI: gl.constexpr, DROP_THRESHOLD: gl.constexpr, CONSUMER_REGS: gl.constexpr, N_ROWS: gl.constexpr,
                CARRY: gl.constexpr, P8_LOG2: gl.constexpr, PINGPONG: gl.constexpr):
    """attn_fwd_sm90's persistent program: Q's buffers released per tile (q_empty), the output through buffers of
    its own, so a tile's Q and first keys load while the last tile finishes; fp8 (P8_LOG2): V^T's tiles, each tile's
    descales (_scales)."""
    QBUF: gl.constexpr = 1 + CARRY  # tiles' Q buffers (_consume_tiles)
    last = N_ROWS // H - 1  # descriptors over the whole batch
    q_desc = tiles(Q, last, seq_q, H * HEAD_DIM, ROWS, HEAD_DIM)
    o_desc = tiles(Out, last, seq_q, H * HEAD_DIM, ROWS, HEAD_DIM)
    k_desc = tiles(K, last, seq_k, KV_H * HEAD_DIM, BLOCK_N, HEAD_DIM)
    q_smem = gl.allocate_shared_memory(Q.dtype.element_ty, [2 * QBUF, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(K.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    if P8_LOG2 > 0:
        v_desc = keys_last_tiles(V, last, seq_k, KV_H, HEAD_DIM, BLOCK_N)
        v_smem = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
    else:
        v_desc = tiles(V, last, seq_k, KV_H * HEAD_DIM, BLOCK_N, HEAD_DIM)
        v_smem = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    o_smem = gl.allocate_shared_memory(Out.dtype.element_ty, [2, ROWS, HEAD_DIM], o_desc.layout)
    # two of each, as CARRY uses them (without it the second pair is unused: 16 bytes)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(q_bar.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=2)
    turn = _turns(PINGPONG)
    k_ready, v_ready, k_empty, v_empty = kv_rings(STAGES)
    fence_async_shared()
    n_m = gl.cdiv(seq_q, 2 * ROWS)
    gl.warp_specialize([
        (_consume_tiles, (q_smem, k_smem, v_smem, o_smem, o_desc, Lse, Slopes, Seeds, QDescale, KDescale, VDescale,
                          q_bar, q_empty, turn, k_ready, v_ready, k_empty, v_empty, n_m, N_ROWS, seq_q, seq_k, lo_off,
                          hi_off, sm_scale, softcap, keep_scale, 0, H, KV_H, HEAD_DIM, BLOCK_N, STAGES, BANDED,
                          BANDED, SOFTCAP, ALIBI, DROP_THRESHOLD, CARRY, P8_LOG2, PINGPONG)),
        (_consume_tiles, (q_smem, k_smem, v_smem, o_smem, o_desc, Lse, Slopes, Seeds, QDescale, KDescale, VDescale,
                          q_bar, q_empty, turn, k_ready, v_ready, k_empty, v_empty, n_m, N_ROWS, seq_q, seq_k, lo_off,
                          hi_off, sm_scale, softcap, keep_scale, 1, H, KV_H, HEAD_DIM, BLOCK_N, STAGES, BANDED,
                          BANDED, SOFTCAP, ALIBI, DROP_THRESHOLD, CARRY, P8_LOG2, PINGPONG)),
        (_loads_tiles, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, Slopes, Seeds, q_bar, q_empty, k_ready, v_ready,
                        k_empty, v_empty, n_m, N_ROWS, seq_q, seq_k, lo_off, hi_off, H, KV_H, HEAD_DIM, BLOCK_N, STAGES,
                        BANDED, ALIBI, CARRY, P8_LOG2 > 0)),
    ], [4, 1], [CONSUMER_REGS, 24])
    for s in gl.static_range(2):
        mbarrier.invalidate(q_bar.index(s))
        mbarrier.invalidate(q_empty.index(s))
    if PINGPONG:
        mbarrier.invalidate(turn.index(0))
        mbarrier.invalidate(turn.index(1))
    invalidate_kv_rings(k_ready, v_ready, k_empty, v_empty, STAGES)


@gluon.jit
def _tiled(Q, K, V, Slopes, Seeds, QDescale, KDescale, VDescale, sm_scale, softcap, keep_scale, seq_q, seq_k, lo_off,
           hi_off, Out, Lse, H: gl.constexpr, KV_H: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
           STAGES: gl.constexpr, BANDED: gl.constexpr, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
           DROP_THRESHOLD: gl.constexpr, KEYS_EVEN: gl.constexpr, CONSUMER_REGS: gl.constexpr, P8_LOG2: gl.constexpr,
           PINGPONG: gl.constexpr, GROUP_PROGRAMS: gl.constexpr, Bias, Mask, BIAS: gl.constexpr,
           MASK: gl.constexpr, DENSE_TILES: gl.constexpr, BATCH_INNER: gl.constexpr):
    """attn_fwd_sm90's program of a tiled grid: one tile."""
    if DENSE_TILES and KEYS_EVEN and (BIAS or MASK):  # whole key blocks: a dense tile's rows start 16-byte aligned
        seq_k = seq_k // 16 * 16  # equal, and known so (multiple_of on an argument does not reach the partitions)
    i, bh = tile_order(BANDED, GROUP_PROGRAMS)
    if BATCH_INNER:
        bh = batch_inner(bh, H)
    start_m = (gl.num_programs(0) - 1 - i) * (2 * ROWS)
    b = bh // H
    h = bh % H
    q_desc = tiles(Q, b, seq_q, H * HEAD_DIM, ROWS, HEAD_DIM)
    o_desc = tiles(Out, b, seq_q, H * HEAD_DIM, ROWS, HEAD_DIM)
    k_desc = tiles(K, b, seq_k, KV_H * HEAD_DIM, BLOCK_N, HEAD_DIM)
    if P8_LOG2 > 0:  # fp8: V^T's tiles
        v_desc = keys_last_tiles(V, b, seq_k, KV_H, HEAD_DIM, BLOCK_N)
    else:
        v_desc = tiles(V, b, seq_k, KV_H * HEAD_DIM, BLOCK_N, HEAD_DIM)
    kv_h = h // (H // KV_H)
    q_smem = gl.allocate_shared_memory(Q.dtype.element_ty, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(K.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    sm_scale, v_descale = _scales(QDescale, KDescale, VDescale, b, kv_h, sm_scale, KV_H, P8_LOG2)
    if P8_LOG2 > 0:  # fp8: V^T's buffers, the bfloat16 output's own buffers
        v_smem = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
        o_smem = gl.allocate_shared_memory(Out.dtype.element_ty, [2, ROWS, HEAD_DIM], o_desc.layout)
    else:
        v_smem = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        o_smem = q_smem
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    turn = _turns(PINGPONG)
    k_ready, v_ready, k_empty, v_empty = kv_rings(STAGES)
    fence_async_shared()

    _b, _h, _kv_h, slope, seed, start, full_start, full_end, n_blocks = _tile(
        start_m, bh, seq_q, seq_k, lo_off, hi_off, Slopes, Seeds, H, KV_H, BLOCK_N, BANDED, ALIBI, DROP_THRESHOLD)
    MAY_MASK: gl.constexpr = BANDED or not KEYS_EVEN or MASK != 0  # a dense mask may hide a block's every key
    bias, mask = dense_planes(Bias, Mask, b, h, seq_q, seq_k, H, BIAS, MASK)
    BIAS_B: gl.constexpr = dense_reads(BIAS, KEYS_EVEN, DENSE_TILES, Bias.dtype.element_ty.primitive_bitwidth)
    MASK_B: gl.constexpr = dense_reads(MASK, KEYS_EVEN, DENSE_TILES, Mask.dtype.element_ty.primitive_bitwidth)
    bias_buf = dense_buffer(Bias, ROWS, BLOCK_N, BIAS_B)
    mask_buf = dense_buffer(Mask, ROWS, BLOCK_N, MASK_B)
    q_row = b * seq_q + start_m
    q_col = h * HEAD_DIM
    lse_row = bh.to(gl.int64) * seq_q
    kv_row = b * seq_k
    kv_col = kv_h * HEAD_DIM
    vt_row = (b * KV_H + kv_h) * HEAD_DIM
    gl.warp_specialize([
        (_consume, (q_smem, k_smem, v_smem, o_smem, o_desc, Lse, q_bar, turn, k_ready, v_ready, k_empty, v_empty,
                    q_row, q_col, lse_row, start_m, start, full_start, full_end, n_blocks, seq_q, seq_k, lo_off, hi_off,
                    sm_scale, softcap, slope, seed, keep_scale, v_descale, 0, HEAD_DIM, BLOCK_N, STAGES, BANDED,
                    MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2, PINGPONG, 0, 0, None, False, bias, mask, BIAS_B,
                    MASK_B, bias_buf, mask_buf)),
        (_consume, (q_smem, k_smem, v_smem, o_smem, o_desc, Lse, q_bar, turn, k_ready, v_ready, k_empty, v_empty,
                    q_row, q_col, lse_row, start_m, start, full_start, full_end, n_blocks, seq_q, seq_k, lo_off, hi_off,
                    sm_scale, softcap, slope, seed, keep_scale, v_descale, 1, HEAD_DIM, BLOCK_N, STAGES, BANDED,
                    MAY_MASK, SOFTCAP, ALIBI, DROP_THRESHOLD, P8_LOG2, PINGPONG, 0, 0, None, False, bias, mask, BIAS_B,
                    MASK_B, bias_buf, mask_buf)),
        (_loads, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row,
                  q_col, kv_row, kv_col, vt_row, start, n_blocks, BLOCK_N, STAGES, P8_LOG2 > 0)),
    ], [4, 1], [CONSUMER_REGS, 24])
    mbarrier.invalidate(q_bar)
    if PINGPONG:
        mbarrier.invalidate(turn.index(0))
        mbarrier.invalidate(turn.index(1))
    invalidate_kv_rings(k_ready, v_ready, k_empty, v_empty, STAGES)
