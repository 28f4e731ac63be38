"""The one place that says what a program touches: where a (batch, head) starts, which (query, key)
pairs are visible, which blocks need masking, and masked tile loads and stores.

Used by the forward and by all backward kernels. Causal attention is bottom-right aligned:
query i sees key j iff j <= i + seq_k - seq_q.
"""
import triton
import triton.language as tl


@triton.jit
def head_start(b, h, seq, H: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Element offset of row 0 of (batch b, head h) in a contiguous (batch, seq, H, HEAD_DIM) tensor;
    rows are H * HEAD_DIM apart. 64-bit: a whole tensor may exceed 2**31 elements."""
    return b.to(tl.int64) * seq * (H * HEAD_DIM) + h * HEAD_DIM


@triton.jit
def visible(q_idx, k_idx, seq_q, seq_k, CAUSAL: tl.constexpr):
    """Boolean mask, broadcast of q_idx and k_idx (pass [BM, 1] / [1, BN], or transposed)."""
    ok = (q_idx < seq_q) & (k_idx < seq_k)
    if CAUSAL:
        ok = ok & (k_idx <= q_idx + (seq_k - seq_q))
    return ok


@triton.jit
def key_blocks(start_m, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Keys a query block [start_m, start_m + BLOCK_M) must visit: (full_end, end).

    Key blocks in [0, full_end) are visible to every query row of the block and need no mask;
    [full_end, end) need the mask; keys >= end are invisible to all rows and are skipped.
    """
    end = seq_k
    full_end = seq_k
    if CAUSAL:
        diag = seq_k - seq_q
        last_row = tl.minimum(start_m + BLOCK_M, seq_q) - 1
        end = tl.maximum(tl.minimum(seq_k, last_row + diag + 1), 0)
        full_end = tl.maximum(tl.minimum(seq_k, start_m + diag + 1), 0)
    full_end = full_end // BLOCK_N * BLOCK_N
    return full_end, end


@triton.jit
def query_blocks(start_n, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Queries a key block [start_n, start_n + BLOCK_N) must visit: (begin, full_begin, full_end, end).

    [begin, full_begin) and [full_end, end) need the mask (the diagonal, the ragged last query
    block); [full_begin, full_end) see every key of the block. All bounds are multiples of BLOCK_M.
    A ragged last key block is masked throughout.
    """
    end = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    begin = 0
    full_begin = 0
    if CAUSAL:
        diag = seq_k - seq_q
        begin = tl.minimum(tl.maximum(start_n - diag, 0) // BLOCK_M * BLOCK_M, end)
        # first row that sees the block's last key, rounded up to a block boundary
        full_begin = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M, end)
    full_end = seq_q // BLOCK_M * BLOCK_M
    if start_n + BLOCK_N > seq_k:
        full_end = full_begin
    full_end = tl.maximum(full_end, full_begin)
    return begin, full_begin, full_end, end


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
