"""The one place that says what a program touches: where a (batch, head) starts, which (query, key)
pairs are visible, which blocks need masking, masked tile loads and stores, the TMA descriptors of a
batch element's tiles (Hopper rows), which tiles a persistent program runs, and in which order a tiled
grid's programs take theirs.

Used by the forward and by all backward kernels. Visibility is a band around the bottom-right aligned
diagonal (FlashAttention's convention): query i sees key j iff
    i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right,
with left / right unbounded when negative; causal is right = 0. The kernels take the band as two
offsets, lo_off = seq_k - seq_q - left and hi_off = seq_k - seq_q + right (+-UNBOUNDED when open), so
query i sees key j iff i + lo_off <= j <= i + hi_off, and BANDED (constexpr, rules.Band.sides) says
which sides bound anything: 1 the right (hi_off), 2 the left (lo_off), 3 both; without a band (0) only
the sequence bounds are checked.

A call may be one block of a larger one (ring attention, POSITIONS constexpr): `place` shifts the band
to the larger call's positions before any of the block ranges below are computed, so they skip the keys
outside the shifted band too.

Segment ids (packed sequences, SEGMENTS constexpr) further restrict visibility to equal ids. Which key
blocks can hold a query block's ids (and the reverse) is computed outside the kernels
(``segment_ranges`` in jax_flash_amd/_launch.py) and narrows the block ranges here; every visited
block is then masked.
"""
import triton
import triton.language as tl

UNBOUNDED = tl.constexpr(1 << 30)  # an offset beyond any sequence length, small enough not to overflow


@triton.jit
def head_start(b, h, seq, H: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Element offset of row 0 of (batch b, head h) in a contiguous (batch, seq, H, HEAD_DIM) tensor;
    rows are H * HEAD_DIM apart. 64-bit: a whole tensor may exceed 2**31 elements."""
    return b.to(tl.int64) * seq * (H * HEAD_DIM) + h * HEAD_DIM


@triton.jit
def element_tiles(T, b, seq, ROW: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """A TMA descriptor of [BLOCK_ROWS, BLOCK_D] tiles of a contiguous (batch, seq, heads, D) tensor T
    viewed as (batch * seq, ROW = heads * D): the tile at (b * seq + i, h * D) is rows i.. of head h.
    Bounded at the end of batch element b, so a ragged block's rows past it arrive as zeros, never the
    next element's. Based at the tensor, not the element: on the H200 (Triton 3.6) descriptors based at
    the element's row 0 gave wrong outputs under warp specialisation (benchmarks/hopper_ws_bisect.py)."""
    return tl.make_tensor_descriptor(T, shape=[(b + 1) * seq, ROW], strides=[ROW, 1],
                                     block_shape=[BLOCK_ROWS, BLOCK_D])


@triton.jit
def persistent_rounds(n_tiles):
    """How many tiles this program of a persistent grid runs (persistent_tile's rounds)."""
    n = tl.num_programs(0)
    full = n_tiles // n
    return full + (_column(full, tl.program_id(0), n) < n_tiles % n).to(tl.int32)


@triton.jit
def tile_order(BANDED: tl.constexpr, GROUP_PROGRAMS: tl.constexpr):
    """(i, row) of this program of a tiled grid, (blocks, rows) = tl.num_programs(0, 1): its row's i-th block
    in the caller's order (causal: the heaviest first). The program ids, but with a band bounded on the right only
    (causal: blocks' work grows along the row): then the rows go in groups of about GROUP_PROGRAMS programs,
    block-major within a group (every row's block 0, then block 1...): the GPU starts programs in launch order,
    so the heaviest of the group's rows start first and its last wave is light; a group's rows are few, and share
    L2. (Two-sided bands, windows, have blocks of about equal work.) The same order in numpy:
    jax_flash_amd/plan.py tiled_order."""
    if BANDED == 1:
        n = tl.num_programs(0)
        per = tl.maximum(GROUP_PROGRAMS // n, 1)  # rows per group
        i = tl.program_id(1) * n + tl.program_id(0)
        first = i // (per * n) * per
        size = tl.minimum(per, tl.num_programs(1) - first)  # the last group's may be fewer
        i -= first * n
        return i // size, first + i % size
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def batch_inner(row, H: tl.constexpr):
    """Row `row` of a tiled grid's batch x H rows (tl.num_programs(1)), taken batch-fastest: (row % batch) * H +
    row // batch. A head's batch elements then launch side by side, and a dense operand they share is read from HBM
    about once, from L2 after."""
    n_b = tl.num_programs(1) // H
    return row % n_b * H + row // n_b


@triton.jit
def _column(r, p, n):
    """Program p's place in round r: rounds alternate direction (a snake), so a program that drew the
    heaviest tile of one round draws the lightest of the next."""
    return tl.where(r % 2 == 0, p, n - 1 - p)


@triton.jit
def persistent_tile(r, n_blocks, rows):
    """(block, row) of this program's round r of a persistent grid over n_blocks blocks of `rows` (batch *
    heads) rows: round r hands out tiles r * programs .. in a snake (_column), one row's blocks after
    another (so programs at work at once share a row's K and V in L2), the last block first (the forward's
    query blocks: causal, the heaviest; the dK/dV kernel counts its key blocks from the other end)."""
    i = r * tl.num_programs(0) + _column(r, tl.program_id(0), tl.num_programs(0))
    return n_blocks - 1 - i % n_blocks, i // n_blocks


@triton.jit
def visible(q_idx, k_idx, seq_q, seq_k, lo_off, hi_off, q_seg, k_seg, BANDED: tl.constexpr,
            SEGMENTS: tl.constexpr):
    """Boolean mask, broadcast of q_idx and k_idx (pass [BM, 1] / [1, BN], or transposed), and of
    their segment ids q_seg / k_seg (ignored unless SEGMENTS)."""
    # per-row bounds first (q_idx varies along one axis only: a row's worth of work, not a tile's), so a
    # tile element costs one compare, two with a left bound
    last = tl.where(q_idx < seq_q, seq_k - 1, -1)  # a row past seq_q sees nothing
    if BANDED & 1:
        last = tl.minimum(last, q_idx + hi_off)
    ok = k_idx <= last
    if BANDED & 2:
        ok = ok & (k_idx >= q_idx + lo_off)
    if SEGMENTS:
        ok = ok & (q_seg == k_seg)
    return ok


@triton.jit
def place(Positions, b, seq_q, seq_k, lo_off, hi_off, POSITIONS: tl.constexpr):
    """(lo_off, hi_off, diag, pos_q, pos_k): where this call's rows and keys lie. Positions (batch, 3)
    int32 (pos_q, pos_k, D) says that query i and key j are query pos_q + i and key pos_k + j of a
    larger call whose seq_k - seq_q is D (ring attention); the band offsets, stated for this call's own
    diagonal, shift to that call's, diag is the diagonal offset ALiBi measures from (scores.py), and
    pos_q / pos_k are the origin of the dropout counters (dropout.py). Without POSITIONS: the offsets
    as given, seq_k - seq_q, 0, 0 (constants: nothing added to the kernel). Offsets stay far from
    overflow while the shift is below 2**29."""
    diag = seq_k - seq_q
    pos_q = 0
    pos_k = 0
    if POSITIONS:
        row = Positions + b.to(tl.int64) * 3
        pos_q = tl.load(row)
        pos_k = tl.load(row + 1)
        shift = pos_q - pos_k + tl.load(row + 2) - diag
        lo_off = lo_off + shift
        hi_off = hi_off + shift
        diag = diag + shift
    return lo_off, hi_off, diag, pos_q, pos_k


@triton.jit
def dense_plane(Dense, b, h, seq_q, seq_k, H: tl.constexpr, LAYOUT: tl.constexpr):
    """Batch b's, query head h's (seq_q | 1, seq_k | 1) plane of a dense operand (a mask or bias of shape
    (batch | 1, H | 1, seq_q | 1, seq_k | 1), contiguous). LAYOUT (jax_flash_amd/operands.py dense_layout): 1
    present, + 2 varies along queries, + 4 along keys, + 8 along the batch, + 16 along heads."""
    plane = (seq_q if LAYOUT & 2 else 1) * (seq_k if LAYOUT & 4 else 1)
    offset = 0
    if LAYOUT & 16:
        offset = h * plane
    if LAYOUT & 8:
        offset = offset + b.to(tl.int64) * ((H if LAYOUT & 16 else 1) * plane)
    return Dense + offset


@triton.jit
def dense_planes(Bias, Mask, b, h, seq_q, seq_k, H: tl.constexpr, BIAS: tl.constexpr, MASK: tl.constexpr):
    """(bias, mask): the planes (dense_plane) of the operands present, 0 for those absent."""
    bias = 0
    if BIAS:
        bias = dense_plane(Bias, b, h, seq_q, seq_k, H, BIAS)
    mask = 0
    if MASK:
        mask = dense_plane(Mask, b, h, seq_q, seq_k, H, MASK)
    return bias, mask


@triton.jit
def dense_pointers(plane, q_idx, k_idx, seq_q, seq_k):
    """(addresses, inside): elements (q_idx, k_idx) of a plane varying along queries and keys (dense_plane), and
    whether they lie inside (seq_q, seq_k)."""
    inside = (q_idx < seq_q) & (k_idx < seq_k)  # first, as tl.load's keyword was (the kernels' code is unchanged)
    return plane + q_idx * seq_k + k_idx, inside


@triton.jit
def dense_tile(plane, q_idx, k_idx, seq_q, seq_k, other, LAYOUT: tl.constexpr):
    """The dense operand's values at (q_idx, k_idx) of a plane (dense_plane), broadcast as the indices are
    ([BM, 1] / [1, BN], or transposed); `other` past the sequences."""
    if LAYOUT & 2 and LAYOUT & 4:
        ptrs, inside = dense_pointers(plane, q_idx, k_idx, seq_q, seq_k)
        return tl.load(ptrs, mask=inside, other=other)
    elif LAYOUT & 2:
        return tl.load(plane + q_idx, mask=q_idx < seq_q, other=other)
    elif LAYOUT & 4:
        return tl.load(plane + k_idx, mask=k_idx < seq_k, other=other)
    else:
        return tl.load(plane)


@triton.jit
def load_ids(Seg, b, offs, seq, SEGMENTS: tl.constexpr):
    """Segment ids of positions offs of batch b ((batch, seq) int32), -1 past the end; 0 if unused."""
    if SEGMENTS:
        return tl.load(Seg + b.to(tl.int64) * seq + offs, mask=offs < seq, other=-1)
    return tl.zeros(offs.shape, tl.int32)


@triton.jit
def segment_span(Ranges, b, block, n_blocks, lo, hi, BLOCK: tl.constexpr):
    """[lo, hi) narrowed to the positions that can share a segment id with block `block` of batch b:
    Ranges (batch, n_blocks, 2) int32 holds that range ([0, seq) when ids are not sorted). lo stays a
    multiple of BLOCK."""
    row = Ranges + (b.to(tl.int64) * n_blocks + block) * 2
    lo = tl.maximum(lo, tl.load(row) // BLOCK * BLOCK)
    hi = tl.maximum(tl.minimum(hi, tl.load(row + 1)), lo)
    return lo, hi


@triton.jit
def segment_bounds(Ranges, b, start, seq, lo, full_lo, full_hi, hi, BLOCK: tl.constexpr, OTHER: tl.constexpr,
                   SEGMENTS: tl.constexpr):
    """The tail of key_blocks and query_blocks, written once: for the block of BLOCK from start (of seq), with
    SEGMENTS [lo, hi) narrowed by segment_span (multiples of OTHER) and all of it masked; else as they are."""
    if SEGMENTS:
        lo, hi = segment_span(Ranges, b, start // BLOCK, tl.cdiv(seq, BLOCK), lo, hi, OTHER)
        full_lo = lo
        full_hi = lo
    return lo, full_lo, full_hi, hi


@triton.jit
def key_blocks(start_m, seq_q, seq_k, lo_off, hi_off, Ranges, b, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BANDED: tl.constexpr, SEGMENTS: tl.constexpr):
    """Keys a query block [start_m, start_m + BLOCK_M) of batch b must visit: (start, full_start,
    full_end, end).

    Key blocks in [full_start, full_end) are visible to every query row of the block and need no mask;
    [start, full_start) and [full_end, end) need the mask; keys outside [start, end) are invisible to
    all rows and are skipped. start, full_start, full_end are multiples of BLOCK_N. With SEGMENTS, only
    the keys Ranges allows (segment_span) are visited, all of them masked.
    """
    start = 0
    end = seq_k
    full_start = 0
    full_end = seq_k // BLOCK_N * BLOCK_N
    if BANDED:
        last_row = tl.minimum(start_m + BLOCK_M, seq_q) - 1
        start = tl.minimum(tl.maximum(start_m + lo_off, 0), seq_k) // BLOCK_N * BLOCK_N
        end = tl.maximum(tl.minimum(last_row + hi_off + 1, seq_k), 0)
        # visible to all rows: last_row + lo_off <= j <= start_m + hi_off
        full_start = tl.minimum(tl.cdiv(tl.maximum(last_row + lo_off, 0), BLOCK_N) * BLOCK_N, end)
        full_start = tl.maximum(full_start, start)
        full_end = tl.maximum(tl.minimum(start_m + hi_off + 1, seq_k), 0) // BLOCK_N * BLOCK_N
        full_end = tl.maximum(full_end, full_start)
    return segment_bounds(Ranges, b, start_m, seq_q, start, full_start, full_end, end, BLOCK_M, BLOCK_N, SEGMENTS)


@triton.jit
def query_blocks(start_n, seq_q, seq_k, lo_off, hi_off, Ranges, b, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BANDED: tl.constexpr, SEGMENTS: tl.constexpr):
    """Queries a key block [start_n, start_n + BLOCK_N) of batch b must visit: (begin, full_begin,
    full_end, end).

    [begin, full_begin) and [full_end, end) need the mask (the band's edges, the ragged last query
    block); [full_begin, full_end) see every key of the block. All bounds are multiples of BLOCK_M.
    A ragged last key block is masked throughout. SEGMENTS as in key_blocks.
    """
    end = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    begin = 0
    full_begin = 0
    full_end = seq_q // BLOCK_M * BLOCK_M
    if BANDED:
        last_key = tl.minimum(start_n + BLOCK_N, seq_k) - 1
        # query i sees key j iff j - hi_off <= i <= j - lo_off
        begin = tl.minimum(tl.maximum(start_n - hi_off, 0) // BLOCK_M * BLOCK_M, end)
        end = tl.minimum(tl.cdiv(tl.maximum(tl.minimum(last_key - lo_off + 1, seq_q), 0), BLOCK_M) * BLOCK_M, end)
        end = tl.maximum(end, begin)
        # rows that see every key of the block: last_key - hi_off <= i <= start_n - lo_off
        full_begin = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(last_key - hi_off, 0), BLOCK_M) * BLOCK_M, begin), end)
        full_end = tl.maximum(tl.minimum(tl.minimum(start_n - lo_off + 1, seq_q) // BLOCK_M * BLOCK_M, end),
                              full_begin)
    if start_n + BLOCK_N > seq_k:
        full_end = full_begin
    return segment_bounds(Ranges, b, start_n, seq_k, begin, full_begin, full_end, end, BLOCK_N, BLOCK_M, SEGMENTS)


@triton.jit
def span_block(i, lo, hi, lo2, BLOCK: tl.constexpr):
    """Start of the i-th block of [lo, hi) followed by [lo2, ...) (lo, lo2 multiples of BLOCK; a span
    may end ragged): one loop walks both masked spans of a band (less code, fewer registers than two)."""
    n1 = tl.cdiv(hi - lo, BLOCK)
    # told to the compiler: aligned vector loads along keys (the fp8 forward's V^T tiles)
    return tl.multiple_of(tl.where(i < n1, lo + i * BLOCK, lo2 + (i - n1) * BLOCK), BLOCK)


@triton.jit
def span_blocks(lo, hi, lo2, hi2, BLOCK: tl.constexpr):
    """Number of blocks in [lo, hi) and [lo2, hi2) together."""
    return tl.cdiv(hi - lo, BLOCK) + tl.cdiv(hi2 - lo2, BLOCK)


@triton.jit
def load_tile(ptr, rows, cols, stride, n_rows, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Loads ptr[rows, cols] (row stride `stride`), zero outside n_rows x n_cols where checked."""
    ptrs = ptr + rows[:, None] * stride + cols[None, :]
    if CHECK_ROWS and CHECK_COLS:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif CHECK_ROWS:
        return tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif CHECK_COLS:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def store_tile(ptr, value, rows, cols, stride, n_rows, n_cols, CHECK_COLS: tl.constexpr):
    """Stores value at ptr[rows, cols], rows always bounds-checked (the last block is ragged)."""
    ptrs = ptr + rows[:, None] * stride + cols[None, :]
    mask = rows[:, None] < n_rows
    if CHECK_COLS:
        mask = mask & (cols[None, :] < n_cols)
    tl.store(ptrs, value.to(ptr.dtype.element_ty), mask=mask)
