"""Attention dropout from counter-based random numbers (Triton's Philox, 4x32-7): the keep mask of any
(query, key) tile is a pure function of a per-(batch, query head) 64-bit key and the tile's global
indices, so the forward never stores it and the backward regenerates it exactly, whatever the block
sizes.

One Philox call gives 16 random bytes, one per probability (FlashAttention's 8-bit draws). They go to
the 16 probabilities that one thread holds in an NVIDIA MMA accumulator tile (rows q, q + 8, columns
8i + 2t + {0, 1}): query q = 16a + 8m + l and key k = 32b + 8i + 2t + j use counter
(4b + t, 8a + l, 0, 0) and byte 8m + 2i + j (byte n is bits 8(n % 4) .. 8(n % 4) + 7 of output n // 4).
So the forward and dQ kernels compute each call once; the dK/dV kernel, whose tiles are transposed,
uses 4 of each call's 16 bytes (a layout-independent mask cannot suit both). The bytes are picked from
a broadcast over the 7 index digits and reshaped, which Triton lowers straight into the layout of the
probabilities (no shared-memory shuffle). A probability is kept when its byte is >= THRESHOLD, in
1 .. 255: the rate is THRESHOLD / 256 (p rounded to a multiple of 1/256, jax_flash_amd/reference.py:
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
def _digit(n: tl.constexpr, at: tl.constexpr, TRANSPOSED: tl.constexpr):
    """arange(n) along digit `at` of the query digits (a, m, l) and key digits (b, i, t, j): dims
    (a, m, l, b, i, t, j), or (b, i, t, j, a, m, l) when TRANSPOSED."""
    AT: tl.constexpr = (at + 4) % 7 if TRANSPOSED else at
    r = tl.arange(0, n)
    if AT == 0:
        r = r[:, None, None, None, None, None, None]
    elif AT == 1:
        r = r[None, :, None, None, None, None, None]
    elif AT == 2:
        r = r[None, None, :, None, None, None, None]
    elif AT == 3:
        r = r[None, None, None, :, None, None, None]
    elif AT == 4:
        r = r[None, None, None, None, :, None, None]
    elif AT == 5:
        r = r[None, None, None, None, None, :, None]
    else:
        r = r[None, None, None, None, None, None, :]
    return r


@triton.jit
def keep(seed, start_m, start_n, THRESHOLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         TRANSPOSED: tl.constexpr = False, ANY_START: tl.constexpr = False):
    """[BLOCK_M, BLOCK_N] bool ([BLOCK_N, BLOCK_M] if TRANSPOSED): which probabilities of queries
    start_m + arange(BLOCK_M) x keys start_n + arange(BLOCK_N) survive (block starts multiples of the
    block sizes, which are multiples of 16). ANY_START: start_m a multiple of 16 and start_n of 8 only
    (a block of a larger call, offset by its global position: masking.py `place`); one Philox call per
    8 keys then, of which 4 of the 16 bytes are used, as in the transposed tiles."""
    tl.static_assert(BLOCK_M % 16 == 0 and BLOCK_N % 16 == 0, "dropout tiles are whole 16 x 16 blocks")
    # 8-key digit i within a 32-key group (NI 8-key groups share a call: they must not cross 32 keys)
    NI: tl.constexpr = 1 if ANY_START else 4 if BLOCK_N >= 32 else BLOCK_N // 8
    # shifts, not //: the starts are >= 0, and a signed division by a power of two costs a sign fix-up
    a = (start_m >> 4) + _digit(BLOCK_M // 16, 0, TRANSPOSED)
    m = _digit(2, 1, TRANSPOSED)
    l = _digit(8, 2, TRANSPOSED)
    b8 = (start_n >> 3) + NI * _digit(BLOCK_N // (8 * NI), 3, TRANSPOSED)  # first 8-key digit of each group
    i = _digit(NI, 4, TRANSPOSED)
    t = _digit(4, 5, TRANSPOSED)
    j = _digit(2, 6, TRANSPOSED)
    c0 = ((b8 >> 2) * 4 + t + 0 * (a + l)).to(tl.uint32)  # over (a, l, b, t) only: one call per 16 bytes
    c1 = (a * 8 + l + 0 * (b8 + t)).to(tl.uint32)
    zero = c0 * 0
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, zero, zero, n_rounds=ROUNDS)
    if NI == 4:
        ii = i  # a constant per register, so the byte picking below folds away
    else:
        ii = (b8 & 3) + i
    w = m * 2 + ii // 2  # byte 8m + 2i + j is in output (8m + 2i + j) // 4
    word = tl.where(w < 2, tl.where(w < 1, r0, r1), tl.where(w < 3, r2, r3))
    shift = ((ii % 2) * 16 + j * 8).to(tl.uint32)
    kept = ((word >> shift) & 0xFF) >= THRESHOLD
    if TRANSPOSED:
        kept = tl.reshape(kept, (BLOCK_N, BLOCK_M))
    else:
        kept = tl.reshape(kept, (BLOCK_M, BLOCK_N))
    return kept
