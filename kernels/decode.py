"""KV-cache attention kernels (decode, speculative decoding, chunked prefill): split-KV ("flash-decoding").

Layouts: q (batch, seq_q, H, HEAD_DIM); caches contiguous (batch, capacity, KV_H, HEAD_DIM) or paged
(num_pages, PAGE, KV_H, HEAD_DIM) with BlockTable (batch, max_pages) int32: key j of batch b lies in
page BlockTable[b, j // PAGE], row j % PAGE. SeqLens (batch,) int32: the keys each row attends to
(cached + appended); Offsets (batch, 2) int32: that row's band (lo_off, hi_off, masking.py), which is
bottom-right aligned against its own length. LEFTPAD (constexpr): Offsets is (batch, 3), its third column
the row's first key (FlashAttention's cache_leftpad): keys before it are neither read nor seen, and the
key blocks wholly before it are skipped. A column rather than an operand of its own: without LEFTPAD
the kernel has the parameters and the code of a kernel without the option.

attn_decode: one program per (batch * KV_H, key split, block of packed query rows). All query heads
of a grouped-query group and all seq_q positions share the key/value head's K and V tiles, so they
are packed into the M tile: row r is position r // G, query head kv_head * G + r % G (G = H // KV_H).
The keys a row block must see (masking.key_blocks) are divided evenly over the splits; each split
writes its normalised partial output and base-2 lse, and attn_decode_combine merges them (with one
split the decode kernel writes the final output itself). Paged reads look up one page per key block,
so BLOCK_N divides PAGE. A page index outside [0, num_pages) is clamped: never a read outside the
cache (its output is then undefined; the API refuses such tables when it can see them).

kv_append: writes new keys / values (batch, seq_new, KV_H, HEAD_DIM) into the caches at positions
cache_seqlens[b] + t, in place (the cache outputs alias the cache inputs: jax-triton's
input_output_aliases), dropping what falls outside the row's capacity or pages.
"""
import triton
import triton.language as tl

from .masking import key_blocks, load_tile, span_block, span_blocks
from .scores import scores


@triton.jit
def _block_offset(BlockTable, b, start_n, capacity, max_pages, num_pages, STRIDE: tl.constexpr,
                  PAGE: tl.constexpr, PAGED: tl.constexpr):
    """Element offset (int64) of key start_n of batch b in a cache whose rows are STRIDE apart (head 0);
    the rows of its key block follow it, STRIDE apart (BLOCK_N divides PAGE)."""
    if PAGED:
        page = tl.load(BlockTable + b.to(tl.int64) * max_pages + start_n // PAGE)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1)  # never outside the cache
        return page.to(tl.int64) * (PAGE * STRIDE) + (start_n % PAGE) * STRIDE
    else:
        return b.to(tl.int64) * capacity * STRIDE + start_n * STRIDE


@triton.jit
def _load_span(ptr, rows, cols, stride, lo, hi, n_cols, CHECK_COLS: tl.constexpr):
    """Loads ptr[rows, cols] (row stride `stride`), zero outside rows [lo, hi) and, where checked, cols < n_cols."""
    mask = (rows[:, None] >= lo) & (rows[:, None] < hi)
    if CHECK_COLS:
        mask = mask & (cols[None, :] < n_cols)
    return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _decode_inner(acc, l_i, m_i, q, KCache, VCache, BlockTable, b, head_off, lo, hi, lo2, hi2, pos, seq_q, seq_k,
                  lo_off, hi_off, sm_scale, softcap, slope, capacity, max_pages, num_pages, first,
                  STRIDE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  PAGE: tl.constexpr, PAGED: tl.constexpr, MASKED: tl.constexpr, BANDED: tl.constexpr,
                  SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, FP8_KV: tl.constexpr, LEFTPAD: tl.constexpr):
    """Key blocks of [lo, hi) then [lo2, hi2): the forward's online softmax (fwd.py), rows packed. Tiles of
    a float8 cache are widened to q's type (exact) in registers. LEFTPAD: keys before `first` are hidden (only
    masked blocks hold any: the unmasked ones begin at or after it)."""
    offs_d = tl.arange(0, BLOCK_D)
    rows = tl.arange(0, BLOCK_N)
    for i in range(0, span_blocks(lo, hi, lo2, hi2, BLOCK_N)):
        start_n = span_block(i, lo, hi, lo2, BLOCK_N)
        offs_n = start_n + rows
        off = _block_offset(BlockTable, b, start_n, capacity, max_pages, num_pages, STRIDE, PAGE, PAGED) + head_off
        # masked blocks load only keys < seq_k (and, LEFTPAD, >= first): positions outside a row are never read
        if LEFTPAD and MASKED:
            k = _load_span(KCache + off, rows, offs_d, STRIDE, first - start_n, seq_k - start_n, HEAD_DIM,
                           BLOCK_D != HEAD_DIM)
        else:
            k = load_tile(KCache + off, rows, offs_d, STRIDE, seq_k - start_n, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)
        k = k.to(q.dtype)  # a no-op but for float8 caches
        s, scale2, _ = scores(tl.dot(q, tl.trans(k), input_precision="ieee"), pos[:, None], offs_n[None, :], 0, 0,
                              seq_q, seq_k, lo_off, hi_off, seq_k - seq_q, sm_scale, softcap, slope, MASKED=MASKED,
                              BANDED=BANDED, SEGMENTS=False, SOFTCAP=SOFTCAP, ALIBI=ALIBI,
                              POSITIVE_SCALE=not FP8_KV)  # [BM, BN]
        if LEFTPAD and MASKED:  # -inf before and after scale2 (> 0, or 1.0 where scores applied the scale)
            s = tl.where(offs_n[None, :] >= first, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
        m_use = m_new
        if MASKED:  # a row that has seen no key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * scale2 - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        if LEFTPAD and MASKED:
            v = _load_span(VCache + off, rows, offs_d, STRIDE, first - start_n, seq_k - start_n, HEAD_DIM,
                           BLOCK_D != HEAD_DIM)
        else:
            v = load_tile(VCache + off, rows, offs_d, STRIDE, seq_k - start_n, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)
        v = v.to(q.dtype)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_decode(Q, KCache, VCache, BlockTable, SeqLens, Offsets, Slopes, KDescale, VDescale, sm_scale, softcap, seq_q,
                capacity, max_pages, num_pages, Out, Lse, H: tl.constexpr, KV_H: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                PAGE: tl.constexpr, PAGED: tl.constexpr, BANDED: tl.constexpr, SOFTCAP: tl.constexpr,
                ALIBI: tl.constexpr, FP8_KV: tl.constexpr, LEFTPAD: tl.constexpr = False):
    """Out (splits, batch, seq_q, H, HEAD_DIM) and Lse (splits, batch, H, seq_q) fp32 base 2: each split's
    normalised output and lse (fp32 for the combine step; with one split, Out is the final output in
    q's dtype). capacity: keys per row of a contiguous cache; max_pages / num_pages: the block table's
    width and the pages in the cache (paged). Slopes (batch, H) fp32 / ALIBI; softcap / SOFTCAP.
    FP8_KV: float8 caches, k ~= k_fp8 * KDescale[b, h_kv] (likewise v; (batch, KV_H) fp32): the tiles
    are widened to q's type, logits scaled by sm_scale * k_descale, the output by v_descale. LEFTPAD: Offsets
    holds each row's first key too (the module's docstring)."""
    bh = tl.program_id(0)
    b = bh // KV_H
    h_kv = bh % KV_H
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    G: tl.constexpr = H // KV_H
    STRIDE_Q: tl.constexpr = H * HEAD_DIM
    STRIDE: tl.constexpr = KV_H * HEAD_DIM
    start_r = tl.program_id(2) * BLOCK_M
    offs_r = start_r + tl.arange(0, BLOCK_M)  # packed rows: position r // G, query head h_kv * G + r % G
    pos = offs_r // G
    head = h_kv * G + offs_r % G
    rows_ok = offs_r < seq_q * G
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_rows = b.to(tl.int64) * seq_q * STRIDE_Q + pos * STRIDE_Q + head * HEAD_DIM  # [BM]
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :], mask=rows_ok[:, None] & d_ok[None, :], other=0.0)

    v_descale = 1.0
    if FP8_KV:
        sm_scale = sm_scale * tl.load(KDescale + bh)
        v_descale = tl.load(VDescale + bh)
    seq_k = tl.load(SeqLens + b)
    OFFSETS: tl.constexpr = 3 if LEFTPAD else 2  # columns of Offsets
    lo_off = tl.load(Offsets + OFFSETS * b)
    hi_off = tl.load(Offsets + OFFSETS * b + 1)
    slope = 0.0
    if ALIBI:
        slope = tl.load(Slopes + b * H + head, mask=rows_ok, other=0.0)[:, None]
    # the positions of this row block: at most (BLOCK_M - 1) // G + 2 of them, from start_r // G
    POSITIONS: tl.constexpr = (BLOCK_M - 1) // G + 2
    start, full_start, full_end, end = key_blocks(start_r // G, seq_q, seq_k, lo_off, hi_off, BlockTable, b,
                                                  POSITIONS, BLOCK_N, BANDED, False)
    first = 0
    if LEFTPAD:  # the blocks wholly before the row's first key skipped; the one holding it masked
        first = tl.load(Offsets + OFFSETS * b + 2)
        start = tl.maximum(start, first // BLOCK_N * BLOCK_N)
        full_start = tl.maximum(full_start, tl.cdiv(first, BLOCK_N) * BLOCK_N)
        full_end = tl.maximum(full_end, full_start)
    # this split's share of the key blocks, and within it the unmasked part [fs, fe)
    per_split = tl.cdiv(tl.cdiv(tl.maximum(end - start, 0), BLOCK_N), n_split)
    lo = start + split * per_split * BLOCK_N
    hi = tl.maximum(tl.minimum(lo + per_split * BLOCK_N, end), lo)
    fs = tl.minimum(tl.maximum(full_start, lo), hi)
    fe = tl.maximum(tl.minimum(full_end, hi), fs)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    head_off = h_kv * HEAD_DIM
    acc, l_i, m_i = _decode_inner(acc, l_i, m_i, q, KCache, VCache, BlockTable, b, head_off, fs, fe, fe, fe, pos,
                                  seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope, capacity, max_pages,
                                  num_pages, first, STRIDE=STRIDE, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                                  BLOCK_N=BLOCK_N, PAGE=PAGE, PAGED=PAGED, MASKED=False, BANDED=BANDED, SOFTCAP=SOFTCAP,
                                  ALIBI=ALIBI, FP8_KV=FP8_KV, LEFTPAD=LEFTPAD)
    acc, l_i, m_i = _decode_inner(acc, l_i, m_i, q, KCache, VCache, BlockTable, b, head_off, lo, fs, fe, hi, pos,
                                  seq_q, seq_k, lo_off, hi_off, sm_scale, softcap, slope, capacity, max_pages,
                                  num_pages, first, STRIDE=STRIDE, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                                  BLOCK_N=BLOCK_N, PAGE=PAGE, PAGED=PAGED, MASKED=True, BANDED=BANDED, SOFTCAP=SOFTCAP,
                                  ALIBI=ALIBI, FP8_KV=FP8_KV, LEFTPAD=LEFTPAD)

    empty = l_i == 0.0  # rows (or splits) that saw no key: output 0, lse -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if FP8_KV:
        out = out * v_descale
    lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    n_batch = tl.num_programs(0) // KV_H
    part = split.to(tl.int64) * n_batch * seq_q * STRIDE_Q
    tl.store(Out + part + q_rows[:, None] + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=rows_ok[:, None] & d_ok[None, :])
    lse_rows = (split.to(tl.int64) * n_batch + b) * H * seq_q + head * seq_q + pos
    tl.store(Lse + lse_rows, lse, mask=rows_ok)


@triton.jit
def attn_decode_combine(Parts, PartLse, seq_q, n_split, Out, Lse, H: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Out (batch, seq_q, H, HEAD_DIM) and Lse (batch, H, seq_q) fp32 base 2 from the n_split partial
    outputs Parts (n_split, batch, seq_q, H, HEAD_DIM) fp32 and their lse PartLse (n_split, batch, H, seq_q):
    out = sum_s 2^(lse_s - lse) out_s, lse = log2 sum_s 2^lse_s. One program per BLOCK_M (position, head)
    rows of a batch element."""
    b = tl.program_id(1)
    n_batch = tl.num_programs(1)
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # r = position * H + head
    rows_ok = offs_r < seq_q * H
    offs_d = tl.arange(0, BLOCK_D)
    mask = rows_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    lse_rows = b.to(tl.int64) * H * seq_q + (offs_r % H) * seq_q + offs_r // H
    lse_stride = n_batch.to(tl.int64) * H * seq_q  # between splits
    part_stride = n_batch.to(tl.int64) * seq_q * H * HEAD_DIM
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, n_split):
        m = tl.maximum(m, tl.load(PartLse + s * lse_stride + lse_rows, mask=rows_ok, other=float("-inf")))
    m_use = tl.where(m == float("-inf"), 0.0, m)
    out_rows = b.to(tl.int64) * seq_q * H * HEAD_DIM + offs_r * HEAD_DIM
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    w = tl.zeros([BLOCK_M], tl.float32)
    for s in range(0, n_split):
        ws = tl.math.exp2(tl.load(PartLse + s * lse_stride + lse_rows, mask=rows_ok, other=float("-inf")) - m_use)
        part = tl.load(Parts + s * part_stride + out_rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
        acc += ws[:, None] * part
        w += ws
    empty = w == 0.0
    out = acc / tl.where(empty, 1.0, w)[:, None]
    tl.store(Out + out_rows[:, None] + offs_d[None, :], out.to(Out.dtype.element_ty), mask=mask)
    tl.store(Lse + lse_rows, tl.where(empty, float("-inf"), m + tl.math.log2(tl.where(empty, 1.0, w))), mask=rows_ok)


@triton.jit
def kv_append(K, V, KCache, VCache, BlockTable, SeqLens, seq_new, capacity, max_pages, num_pages, KCacheOut,
              VCacheOut, KV_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
              PAGE: tl.constexpr, PAGED: tl.constexpr):
    """Writes K, V (batch, seq_new, KV_H, HEAD_DIM) into KCache / VCache in place, at positions
    SeqLens[b] + t (SeqLens: lengths before appending, >= 0). The outputs alias KCache / VCache
    (jax_flash_amd/_launch.py: Launch.aliases): the kernel writes through the input pointers, which point at
    the output buffers; KCacheOut / VCacheOut are jax-triton 0.3's separate parameters for them (the same
    memory there; placeholders under 0.4), never used. Positions at or past the row's capacity
    (contiguous: capacity; paged: max_pages * PAGE), and pages outside [0, num_pages), are not written.
    One program per (BLOCK_N new positions, batch * KV_H)."""
    bh = tl.program_id(1)
    b = bh // KV_H
    h_kv = bh % KV_H
    STRIDE: tl.constexpr = KV_H * HEAD_DIM
    t = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    p = tl.load(SeqLens + b) + t
    ok = (t < seq_new) & (p < capacity)
    if PAGED:
        page = tl.load(BlockTable + b.to(tl.int64) * max_pages + p // PAGE, mask=ok, other=-1)
        ok = ok & (page >= 0) & (page < num_pages)
        dst = page.to(tl.int64) * (PAGE * STRIDE) + (p % PAGE) * STRIDE
    else:
        dst = b.to(tl.int64) * capacity * STRIDE + p * STRIDE
    offs_d = tl.arange(0, BLOCK_D)
    mask = ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    src = b.to(tl.int64) * seq_new * STRIDE + t * STRIDE + h_kv * HEAD_DIM
    dst = dst + h_kv * HEAD_DIM
    k = tl.load(K + src[:, None] + offs_d[None, :], mask=mask)
    tl.store(KCache + dst[:, None] + offs_d[None, :], k, mask=mask)
    v = tl.load(V + src[:, None] + offs_d[None, :], mask=mask)
    tl.store(VCache + dst[:, None] + offs_d[None, :], v, mask=mask)
