"""The logits a program computes from a tile of q.k, written once for the forward and both backward
kernels: scaling, softcap (s = softcap * tanh(scale * q.k / softcap)), ALiBi (s -= slope *
|i + diag - j|, diag = seq_k - seq_q; for a block of a larger call, that call's diagonal in the block's
indices: masking.py `place`) and a dense bias (s += bias[i, j]), in base 2 for exp2, with the band, the
segment ids and a dense mask applied, and the factor the backward applies to dS."""
import triton
import triton.language as tl

from .masking import dense_tile, visible

LOG2E = tl.constexpr(1.4426950408889634)
# a bias's floor (finfo.min and -inf hide a pair): 2^-3 of float32's range, so that q.k added to it in a tensor
# core's accumulator (not IEEE-rounded) cannot overflow to -inf and empty a row a bias hides entirely
BIAS_FLOOR = tl.constexpr(-2.0 ** 125)


@triton.jit
def _tanh(x):
    """tanh in fp32 to ~1 ulp relative at every x, portable (no libdevice; CUDA, ROCm, interpreter). For
    |x| < 0.75, x * P(x^2) (odd minimax polynomial, degree 13: <= 0.75 eps relative, exactly x below
    ~1e-4, so softcap * tanh(x / softcap) -> x as softcap -> inf); above, 1 - 2 / (e^(2|x|) + 1)
    (<= 1.3 eps with a correctly rounded exp2, ~2 eps with the GPUs' approximate one; exactly 1 from
    |x| ~ 9 on), with x's sign. The plain 1 - 2 / (e^(2x) + 1) everywhere has an absolute error of
    ~1e-7, i.e. no relative precision left for small |x| (a large softcap)."""
    a = tl.abs(x)
    big = 1.0 - 2.0 / (tl.math.exp2(a * (2.0 * LOG2E)) + 1.0)
    s = tl.minimum(a, 0.75)  # the polynomial's branch, kept finite where the other is taken
    y = s * s
    p = -0.0076573337428271770 + y * 0.0017369877314195037
    p = 0.021452078595757484 + y * p
    p = -0.053892735391855240 + y * p
    p = 0.13332694768905640 + y * p
    p = -0.33333316445350647 + y * p
    small = s + s * (y * p)
    t = tl.where(a < 0.75, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def logits2(qk, q_idx, k_idx, diag, sm_scale, softcap, slope, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """(log2(e) * logits, d logits / d(scale * q.k)) for a fp32 tile qk = q.k; q_idx / k_idx broadcast
    to its shape. The second is 1 - tanh^2 with softcap (1.0 otherwise)."""
    x = qk * sm_scale
    grad = 1.0
    if SOFTCAP:
        t = _tanh(x / softcap)
        x = softcap * t
        grad = 1.0 - t * t
    if ALIBI:
        x = x - slope * tl.abs(q_idx + diag - k_idx).to(tl.float32)
    return x * LOG2E, grad


@triton.jit
def scores(qk, q_idx, k_idx, q_ids, k_ids, seq_q, seq_k, lo_off, hi_off, diag, sm_scale, softcap, slope,
           MASKED: tl.constexpr, BANDED: tl.constexpr, SEGMENTS: tl.constexpr, SOFTCAP: tl.constexpr,
           ALIBI: tl.constexpr, POSITIVE_SCALE: tl.constexpr = True, bias=0, mask=0, BIAS: tl.constexpr = 0,
           MASK: tl.constexpr = 0):
    """The scores step every kernel takes on a fp32 tile qk = q.k (transposed or not: q_idx / k_idx and
    the segment ids q_ids / k_ids broadcast to its shape): (s, scale2, dlogit) with s * scale2 the logits
    in base 2, -inf where the pair is invisible (MASKED: band, bounds, segments), and dlogit the
    factor the backward applies to dS (logits2). Without softcap or ALiBi, s is qk itself (masked) and
    scale2 the scale: the callers' s * scale2 - m then compiles to one FMA per element. POSITIVE_SCALE:
    sm_scale is known > 0 (the API checks softmax_scale; False where fp8 descales multiply it). bias, mask:
    planes of a dense bias and boolean mask (masking.dense_plane; BIAS, MASK their layouts, 0: none), applied here
    under SOFTCAP only (the bias after it, the mask on a MASKED tile); otherwise qk started from dense_start."""
    LATE_BIAS: tl.constexpr = BIAS if SOFTCAP else 0  # else in q.k already (dense_start)
    LATE_MASK: tl.constexpr = MASK if SOFTCAP else 0
    if SOFTCAP or ALIBI:
        s, dlogit = logits2(qk, q_idx, k_idx, diag, sm_scale, softcap, slope, SOFTCAP, ALIBI)
        if LATE_BIAS:  # floored as dense_start floors it
            s = s + tl.maximum(dense_tile(bias, q_idx, k_idx, seq_q, seq_k, 0.0, BIAS).to(tl.float32) * LOG2E,
                               BIAS_FLOOR)
        scale2 = 1.0
    else:
        s = qk
        dlogit = 1.0
        scale2 = sm_scale * LOG2E
    if MASKED:
        # unscaled where scale2 > 0 (the callers' s * scale2 - m then stays one FMA per element, and -inf
        # stays -inf; sm90 SASS: a masked element cost FMUL, ISETP, FSEL and FADD, and the mask 16 % of the
        # D 128 forward); scaled first where the scale comes from run-time factors (fp8 descales) whose
        # sign or zero would turn -inf into +inf or NaN
        ok = visible(q_idx, k_idx, seq_q, seq_k, lo_off, hi_off, q_ids, k_ids, BANDED, SEGMENTS)
        if LATE_MASK:
            ok = ok & (dense_tile(mask, q_idx, k_idx, seq_q, seq_k, 0, MASK) != 0)
        if POSITIVE_SCALE:
            s = tl.where(ok, s, float("-inf"))
        else:
            s = tl.where(ok, s * scale2, float("-inf"))
            scale2 = 1.0
    return s, scale2, dlogit



@triton.jit
def dense_start(bias, mask, q_idx, k_idx, seq_q, seq_k, sm_scale, SHAPE: tl.constexpr, BIAS: tl.constexpr,
                MASK: tl.constexpr, SOFTCAP: tl.constexpr):
    """The accumulator q.k starts from (a SHAPE tile; q_idx / k_idx broadcast to it): dense_added to zeros. In the
    accumulator the tiles take the product's layout; added after it, Triton ran the softmax in the tiles' layout as
    well (gfx942 D 128: 3x the exponentials and 372 bytes of spills; sm90 too, amd_report)."""
    return dense_added(tl.zeros(SHAPE, tl.float32), bias, mask, q_idx, k_idx, seq_q, seq_k, sm_scale, BIAS, MASK,
                       SOFTCAP)


@triton.jit
def dense_added(qk, bias, mask, q_idx, k_idx, seq_q, seq_k, sm_scale, BIAS: tl.constexpr, MASK: tl.constexpr,
                SOFTCAP: tl.constexpr, TILES: tl.constexpr = 0):
    """qk (q.k's units) with a dense bias added, bias / sm_scale, and -inf where a dense mask hides the pair; qk as it
    is without them or under SOFTCAP (scores applies them then: softcap comes first). bias, mask: their planes, read
    here at (q_idx, k_idx), or their tiles (TILES bit 1: the bias's, 2: the mask's), broadcast to qk's shape. A bias
    floors at BIAS_FLOOR / max(1, scale * log2 e), finite after scaling: finfo.min (a common "hide" bias; -inf the same)
    hides a pair, and a row of only those is uniform, as in jax.nn, not empty. The Gluon kernels add it to the product's
    tile (their accumulator is not started from it)."""
    if BIAS and not SOFTCAP:
        floor = BIAS_FLOOR / tl.maximum(sm_scale * LOG2E, 1.0)
        b = bias if TILES & 1 else dense_tile(bias, q_idx, k_idx, seq_q, seq_k, 0.0, BIAS)
        qk += tl.maximum(b.to(tl.float32) * (1.0 / sm_scale), floor)
    if MASK and not SOFTCAP:
        m = mask if TILES & 2 else dense_tile(mask, q_idx, k_idx, seq_q, seq_k, 0, MASK)
        qk += tl.where(m != 0, 0.0, float("-inf"))
    return qk
