"""Attention dropout from counter-based random numbers (Triton's Philox 4x32-10): the keep mask of any
(query, key) tile is a pure function of a per-(batch, query head) 64-bit key and the tile's global
indices, so the forward never stores it and the backward regenerates it exactly, whatever the block
sizes. Counters: (key // 4, query, 0, 0); the four outputs serve keys 4c .. 4c + 3. A probability is
kept when its 31 high random bits are >= THRESHOLD = floor(p * 2**31). jax_flash_amd/reference.py
mirrors this bit for bit (the `xla` implementation and the tests)."""
import triton
import triton.language as tl


@triton.jit
def load_seed(Seeds, bh, THRESHOLD: tl.constexpr):
    """The Philox key of row bh = batch * H + head (0 without dropout, THRESHOLD 0): Seeds (batch, H, 2)
    holds its (low, high) uint32 words, passed as int32 (every binding and the interpreter take it)."""
    seed = 0
    if THRESHOLD > 0:
        lo = tl.load(Seeds + bh.to(tl.int64) * 2).to(tl.uint32, bitcast=True).to(tl.uint64)
        hi = tl.load(Seeds + bh.to(tl.int64) * 2 + 1).to(tl.uint32, bitcast=True).to(tl.uint64)
        seed = lo | (hi << 32)
    return seed


@triton.jit
def keep(seed, offs_m, start_n, THRESHOLD: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BM, BLOCK_N] bool: which probabilities of queries offs_m x keys start_n + arange(BLOCK_N)
    survive (start_n a multiple of 4)."""
    cols = start_n // 4 + tl.arange(0, BLOCK_N // 4)
    c0 = (cols[None, :] + 0 * offs_m[:, None]).to(tl.uint32)  # [BM, BN / 4]
    c1 = (offs_m[:, None] + 0 * cols[None, :]).to(tl.uint32)
    zero = c0 * 0
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, zero, zero)
    r = tl.interleave(tl.interleave(r0, r2), tl.interleave(r1, r3))  # key 4c + t takes r_t[c]
    return (r >> 1).to(tl.int32) >= THRESHOLD
