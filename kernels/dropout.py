"""Attention dropout from a counter-based hash: the keep mask of any (query, key) tile is a pure function of
a per-(batch, query head) 64-bit seed and the tile's global indices, so the forward never stores it and the
backward regenerates it exactly, whatever the block sizes or the tile's orientation.

One random byte per probability (FlashAttention's 8-bit draws), computed per element, with no reshape or
layout of its own: Triton 3.6's warp-specialisation pass takes the loop with it (a Philox 4x32 call gives 16
bytes, which only a reshape hands to the 16 probabilities a thread holds, and that pass fails on the reshape;
docs/tuning.md, dropout). Per (batch, head) the 64-bit seed is mixed into two 32-bit keys (once per tile);
query q and key k then give
    r = (q ^ key_q) * P1,  r ^= r >> 16      (per query row)
    c = (k ^ key_k) * P2,  c ^= c >> 16      (per key column)
    x = (r ^ c) * (r | 1)
and the byte is x's top 8 bits: an xor and a multiply per probability (r | 1 is per row). For a row, c -> x is
a bijection (r | 1 is odd), and the multiply carries every bit of r ^ c into the top byte. M1, M2 (the seed's
mixing) are lowbias32's (C. Wellons, hash-prospector). Statistics (benchmarks/dropout_stats.py, 16 seeds of
4096 x 4096 at offsets up to 2^17): byte pairs at 12 lags along each axis (1 .. 1024, Fibonacci lags among
them), diagonals, the corners of 2 x 2 squares (adjacent, up to 64 apart, random), and the masks of seeds one
apart or with the high bit flipped show no dependence (chi-square tests, |z| < 3: dropout_stats.json).
A probability is kept when its byte is >= THRESHOLD, in 1 .. 255: the drop rate is THRESHOLD / 256 (p rounded to a
multiple of 1/256, jax_flash_amd/reference.py: dropout_threshold). reference.py mirrors this bit for bit (the
xla implementation).

The backward leaves keep_scale (1 / the keep rate) out of its tiles: they compute P keep and
dS / keep_scale = P (keep dP - delta keep_rate) (`dropped_ds`), and the output blocks take keep_scale once
(bwd.kept_scaled)."""
import triton
import triton.language as tl

P1 = tl.constexpr(0x9E3779B1)  # odd multipliers: each step a bijection of 32 bits
P2 = tl.constexpr(0x85EBCA77)
M1 = tl.constexpr(0x7FEB352D)
M2 = tl.constexpr(0x846CA68B)


@triton.jit
def load_seed(Seeds, bh, THRESHOLD: tl.constexpr):
    """The seed of row bh = batch * H + head (0 without dropout, THRESHOLD 0): Seeds (batch, H, 2)
    holds its (low, high) uint32 words, passed as int32 (every binding and the interpreter take it)."""
    seed = 0
    if THRESHOLD > 0:
        lo = tl.load(Seeds + bh.to(tl.int64) * 2).to(tl.uint32, bitcast=True).to(tl.uint64)
        hi = tl.load(Seeds + bh.to(tl.int64) * 2 + 1).to(tl.uint32, bitcast=True).to(tl.uint64)
        seed = lo | (hi << 32)
    return seed


@triton.jit
def _mix(x):
    """lowbias32: a bijection of uint32 whose every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * M1
    x = x ^ (x >> 15)
    x = x * M2
    return x ^ (x >> 16)


@triton.jit
def _line(index, key, P: tl.constexpr):
    """A query row's or key column's share of the hash: (index ^ key) * P, xor-shifted."""
    x = (index.to(tl.uint32) ^ key) * P
    return x ^ (x >> 16)


@triton.jit
def _keys(seed):
    """The seed's two 32-bit keys (queries', keys'): every seed bit in both."""
    lo = seed.to(tl.uint32)
    hi = (seed >> 32).to(tl.uint32)
    return _mix(lo ^ _mix(hi ^ 0x5BD1E995)), _mix(hi ^ _mix(lo + 0x27D4EB2F))


@triton.jit
def _kept(r, c, THRESHOLD: tl.constexpr):
    """Whether the byte of row line r and column line c (_line's) is kept: the top byte of (r ^ c) * (r | 1)."""
    x = (r ^ c) * (r | 1)
    CUT: tl.constexpr = THRESHOLD * (1 << 24)  # the top byte >= THRESHOLD
    return x >= CUT


@triton.constexpr_function
def keep_rate(THRESHOLD):
    """The kept fraction, (256 - THRESHOLD) / 256: exact in float32, unlike keep_scale (its inverse)."""
    return (256 - THRESHOLD) / 256


@triton.jit
def dropped_ds(p, dp, delta, kept, THRESHOLD: tl.constexpr):
    """A backward tile's dS before softcap: P (dP - delta), or under dropout (THRESHOLD > 0) dS / keep_scale =
    P (keep dP - delta keep_rate), keep_scale left to the output blocks (bwd.kept_scaled). kept: the keep mask, or
    P keep itself (a float tile, dV's operand: P keep dP - P delta keep_rate, the same). Which one is the
    compiler's matter: given P keep, the sm90 Gluon dK/dV holds no 32 predicates across its dP wait (SASS per
    block, D 128: 968 -> 894 instructions), while gfx942's Triton dK/dV needs 26 more VGPRs (376 -> 402) and its
    dQ 22 more instructions per iteration. delta: broadcastable to the tile ([1, BM] or [BM, 1]: its keep_rate
    product costs a row, not a tile)."""
    if THRESHOLD > 0:
        if kept.dtype == tl.int1:
            return p * (tl.where(kept, dp, 0.0) - delta * keep_rate(THRESHOLD))
        else:
            return kept * dp - p * (delta * keep_rate(THRESHOLD))
    else:
        return p * (dp - delta)


@triton.jit
def keep(seed, start_m, start_n, THRESHOLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         TRANSPOSED: tl.constexpr = False):
    """[BLOCK_M, BLOCK_N] bool ([BLOCK_N, BLOCK_M] if TRANSPOSED): which probabilities of queries
    start_m + arange(BLOCK_M) x keys start_n + arange(BLOCK_N) survive (any starts >= 0: global
    positions, masking.py `place`)."""
    key_q, key_k = _keys(seed)
    r = _line(start_m + tl.arange(0, BLOCK_M), key_q, P1)
    c = _line(start_n + tl.arange(0, BLOCK_N), key_k, P2)
    if TRANSPOSED:
        return _kept(r[None, :], c[:, None], THRESHOLD)
    else:
        return _kept(r[:, None], c[None, :], THRESHOLD)


@triton.jit
def keep_at(seed, q_idx, k_idx, THRESHOLD: tl.constexpr, k_start=0):
    """keep's mask from the caller's global indices q_idx, k_idx, broadcast to the tile's shape (one of them a row,
    the other a column, either way round): for Gluon kernels, whose index tensors carry their layouts. k_start:
    the keys are k_start + k_idx, with k_start a multiple of a power of two above every k_idx (a block's start and
    its offsets), so k_start + k_idx = k_start ^ k_idx and k_start goes into the key once instead of per column."""
    key_q, key_k = _keys(seed)
    return _kept(_line(q_idx, key_q, P1), _line(k_idx, key_k ^ k_start, P2), THRESHOLD)
