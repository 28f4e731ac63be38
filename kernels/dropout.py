"""Attention dropout from counter-based random numbers (Triton's Philox, 4x32-7): the keep mask of any
(query, key) tile is a pure function of a per-(batch, query head) 64-bit key and the tile's global
indices, so the forward never stores it and the backward regenerates it exactly, whatever the block
sizes.

One Philox call gives 16 random bytes, one per probability (FlashAttention's 8-bit draws). Counters:
(key // 16, query, 0, 0); key 16c + 4t + j takes byte j (bits 8j .. 8j + 7) of output t of counter c.
The bytes are picked from a [BM, BN / 16, 16] broadcast and reshaped, which Triton lowers straight
into the layout of the probabilities (no shared-memory shuffle; tl.interleave-ing the four outputs
cost one shuffle per interleave). A probability is kept when its byte is >= THRESHOLD, in 1 .. 255:
the rate is THRESHOLD / 256 (p rounded to a multiple of 1/256, jax_flash_amd/reference.py:
dropout_threshold). reference.py mirrors this bit for bit (the `xla` implementation and the tests)."""
import triton
import triton.language as tl

ROUNDS = tl.constexpr(7)  # Philox4x32-7, FlashAttention's choice (Salmon et al.: 7 rounds pass BigCrush)


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
def keep(seed, offs_m, start_n, THRESHOLD: tl.constexpr, BLOCK_N: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """[BM, BLOCK_N] bool ([BLOCK_N, BM] if TRANSPOSED): which probabilities of queries offs_m x keys
    start_n + arange(BLOCK_N) survive (start_n a multiple of 16)."""
    tl.static_assert(BLOCK_N >= 16, "dropout draws 16 keys per Philox call")
    cols = start_n // 16 + tl.arange(0, BLOCK_N // 16)
    if TRANSPOSED:  # [BN / 16, 16, BM]: drawn in the dK/dV kernel's layout, not transposed after
        c0 = (cols[:, None, None] + 0 * offs_m[None, None, :]).to(tl.uint32)
        c1 = (offs_m[None, None, :] + 0 * cols[:, None, None]).to(tl.uint32)
        i = tl.arange(0, 16)[None, :, None]
    else:  # [BM, BN / 16, 16]
        c0 = (cols[None, :, None] + 0 * offs_m[:, None, None]).to(tl.uint32)
        c1 = (offs_m[:, None, None] + 0 * cols[None, :, None]).to(tl.uint32)
        i = tl.arange(0, 16)[None, None, :]
    zero = c0 * 0
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, zero, zero, n_rounds=ROUNDS)
    # key 16c + i takes byte i % 4 of r_(i // 4)
    word = tl.where(i < 8, tl.where(i < 4, r0, r1), tl.where(i < 12, r2, r3))
    kept = ((word >> ((i % 4) * 8).to(tl.uint32)) & 0xFF) >= THRESHOLD
    if TRANSPOSED:
        kept = tl.reshape(kept, (BLOCK_N, offs_m.shape[0]))
    else:
        kept = tl.reshape(kept, (offs_m.shape[0], BLOCK_N))
    return kept
