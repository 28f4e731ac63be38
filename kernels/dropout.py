"""Attention dropout from a counter-based hash: the keep mask of any (query, key) tile is a pure function of
a per-(batch, query head) 64-bit seed and the tile's global indices, so the forward never stores it and the
backward regenerates it exactly, whatever the block sizes or the tile's orientation.

One random byte per probability (FlashAttention's 8-bit draws), computed per element, with no reshape or
layout of its own: Triton 3.6's warp-specialisation pass takes the loop with it (a Philox 4x32 call gives 16
bytes, which only a reshape hands to the 16 probabilities a thread holds, and that pass fails on the reshape;
NOTES "Sixteenth session"). Per (batch, head) the 64-bit seed is mixed into two 32-bit keys (once per tile);
query q and key k then give
    r = (q ^ key_q) * P1,  r ^= r >> 16      (per query row)
    c = (k ^ key_k) * P2,  c ^= c >> 16      (per key column)
    x = r ^ c,  x *= M1,  x ^= x >> 15,  x *= M2
and the byte is x's top 8 bits: six integer operations per probability (Philox's call cost less per byte where
all 16 of its bytes served, in the forward, and more in dK/dV's transposed tiles, which used 4). M1, M2 (and the
seed's mixing) are lowbias32's (C. Wellons, hash-prospector). Statistics (benchmarks/dropout_stats.py, 16 seeds
of 4096 x 4096 at offsets up to 2^17): byte pairs at 12 lags along each axis (1 .. 1024, Fibonacci lags among
them), diagonals, the corners of 2 x 2 squares (adjacent, up to 64 apart, random), and the masks of seeds one
apart or with the high bit flipped show no dependence (37 chi-square tests, |z| < 3). A probability is kept when
its byte is >= THRESHOLD, in 1 .. 255: the rate is THRESHOLD / 256 (p rounded to a multiple of 1/256,
jax_flash_amd/reference.py: dropout_threshold). reference.py mirrors this bit for bit (the xla implementation)."""
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
def _kept(x, THRESHOLD: tl.constexpr):
    """Whether the byte of x = r ^ c (a row's and a column's _line) is kept."""
    x = x * M1
    x = x ^ (x >> 15)
    x = x * M2
    CUT: tl.constexpr = THRESHOLD * (1 << 24)  # the top byte >= THRESHOLD
    return x >= CUT


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
        x = r[None, :] ^ c[:, None]
    else:
        x = r[:, None] ^ c[None, :]
    return _kept(x, THRESHOLD)


@triton.jit
def keep_at(seed, q_idx, k_idx, THRESHOLD: tl.constexpr):
    """keep's mask from the caller's global indices q_idx, k_idx, broadcast to the tile's shape (one of them a row,
    the other a column, either way round): for Gluon kernels, whose index tensors carry their layouts."""
    key_q, key_k = _keys(seed)
    return _kept(_line(q_idx, key_q, P1) ^ _line(k_idx, key_k, P2), THRESHOLD)
