"""Variants of the bare forward loop on Hopper (issue 19; benchmarks/results/NOTES.md, "Ninth session"): what its
softmax costs, and FlashAttention-3's intra-warpgroup overlap written in plain Triton. Bare TMA forwards (128 x 128
tiles, non-causal, whole blocks, bf16), timed against cuDNN through torch in one process and checked against
torch's attention. Needs a Hopper GPU and torch (Triton's own launcher). From the repository root:

    python benchmarks/hopper_fwd_loop.py [--all] [D ...]

Cases (name: loop, warp-specialised, warps x stages):
  ws            the tutorial-style warp-specialised loop (what kernels/fwd.py's TMA row runs), 4 x 2
  ws-noexp      the same without the exponentials (an FMA instead: timing only, wrong output)
  ws-norescale  the same without the accumulator's rescale (timing only)
  plain[-s3]    the ws loop without warp specialisation, 8 x 2 (x 3)
  overlap[-s3]  the overlap, 8 x 2 (x 3): Triton 3.6 keeps a wgmma in flight only if nothing in the loop reads it
                but the yield, and reads of the previous iteration's result come after a `wgmma.wait_group 0`
                (WGMMAPipeline.cpp, dotCanBeProperlyAsync). So the loop carries S: iteration i starts with a small
                synchronous product (its wait drains S_i and P.V_{i-1}), issues S_{i+1}, runs block i's softmax
                beside it and issues P.V_i. Iteration 0 softmaxes a dummy block of -1e30 scores (p = 1 against a
                running max of -1e30), which the next block's rescale alpha = 2^(-1e30 - m) weighs by 0.
  peeled        the same overlap with the first block's q.k before the loop and the last softmax after it (no
                dummy block: what a masked kernel would need, as softcap or ALiBi would not weigh it by 0), 8 x 2
  overlap-ws    the overlap warp-specialised, 4 x 2: compiles, but the consumer releases K's buffer right after
                the q.k product, so q.k is waited for there
--all adds FlashAttention-4's cure for the exponential (a share of 2^x by a polynomial on the FMA pipe) in the ws
loop: one / two of every four register-adjacent elements through inline PTX (ws-asm1, ws-asm2) and every element
through the polynomial (ws-poly) compile under Triton 3.6's warp specialisation; a quarter / half of the columns
through split and join (ws-split4, ws-split2) and two key blocks per iteration (ws-two-blocks[-poly]) do not;
ws-f16x2 / ws-bf16x2 take the exponent to f16 / bf16 and ex2 two at a time in PTX (ptxas still issues one MUFU per
element). Case names on the command line run only those cases.

H200 (NOTES "Tenth session"): overlap, overlap-s3, peeled and overlap-ws run at 0.70-0.87x cuDNN against ws's 0.81-0.92x (the
dummy block of overlap gives NaN at D 64: a prototype's defect, peeled is right); at D 64 ws-noexp reaches
0.96-1.03x, ws-asm1 gains 2-3 %, ws-bf16x2 0-3 %, ws-poly and ws-f16x2 lose."""
import sys

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

from jax_flash_amd.kernels.masking import element_tiles

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))

# EXP: how the softmax's 2^x is taken
MUFU, NOEXP, SPLIT4, SPLIT2, ASM1, ASM2, POLY, F16X2, BF16X2 = (tl.constexpr(i) for i in range(9))
# LOOP: the key loop's shape
ONE, OVERLAP, PEELED, TWO_BLOCKS = (tl.constexpr(i) for i in range(4))


@triton.jit
def exp2_poly(x):
    # 2^x = 2^j * 2^f, j = round(x), f in [-0.5, 0.5]; 2^f by a degree-3 polynomial (relative error 7.5e-5)
    x = tl.maximum(x, -126.0)
    t = x + 12582912.0  # 1.5 * 2^23: rounds x to an integer in t's low mantissa bits
    j = t - 12582912.0
    f = x - j
    p = 0.05517163 * f + 0.24261117
    p = p * f + 0.693261
    p = p * f + 0.99992807
    return (p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)).to(tl.float32, bitcast=True)


# the same polynomial in PTX, for the last (ASM1) or last two (ASM2) of every 4 register-adjacent elements
_POLY = ("{ .reg .f32 x, t, j, f, p; .reg .b32 pb, tb; max.f32 x, $X, 0fC2FC0000; add.f32 t, x, 0f4B400000; "
         "sub.f32 j, t, 0f4B400000; sub.f32 f, x, j; fma.rn.f32 p, f, 0f3D61FBA5, 0f3E786F10; "
         "fma.rn.f32 p, p, f, 0f3F31798E; fma.rn.f32 p, p, f, 0f3F7FFB49; mov.b32 pb, p; mov.b32 tb, t; "
         "shl.b32 tb, tb, 23; add.s32 pb, pb, tb; mov.b32 $Y, pb; }")
ASM_1: tl.constexpr = tl.constexpr("ex2.approx.ftz.f32 $0, $4; ex2.approx.ftz.f32 $1, $5; ex2.approx.ftz.f32 $2, $6; "
                                   + _POLY.replace("$X", "$7").replace("$Y", "$3"))
ASM_2: tl.constexpr = tl.constexpr("ex2.approx.ftz.f32 $0, $4; ex2.approx.ftz.f32 $1, $5; "
                                   + _POLY.replace("$X", "$6").replace("$Y", "$2")
                                   + _POLY.replace("$X", "$7").replace("$Y", "$3"))
# two exponentials per MUFU instruction: the exponent rounded to f16 (11-bit significand) or bf16 (8 bits), then
# the packed half-precision ex2 (sm90: f16x2, and bf16x2 since PTX 7.8); the element in the low half is the first
F16X2_ASM: tl.constexpr = tl.constexpr("{ .reg .b32 h; cvt.rn.f16x2.f32 h, $2, $1; ex2.approx.f16x2 $0, h; }")
BF16X2_ASM: tl.constexpr = tl.constexpr("{ .reg .b32 h; cvt.rn.bf16x2.f32 h, $2, $1; ex2.approx.ftz.bf16x2 $0, h; }")


@triton.jit
def _exp2(x, EXP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    if EXP == MUFU:
        p = tl.math.exp2(x)
    elif EXP == NOEXP:
        p = x * 0.001 + 1.0
    elif EXP == POLY:
        p = exp2_poly(x)
    elif EXP == ASM1:
        p = tl.inline_asm_elementwise(ASM_1, "=f,=f,=f,=f,f,f,f,f", [x], dtype=tl.float32, is_pure=True, pack=4)
    elif EXP == ASM2:
        p = tl.inline_asm_elementwise(ASM_2, "=f,=f,=f,=f,f,f,f,f", [x], dtype=tl.float32, is_pure=True, pack=4)
    elif EXP == F16X2:
        p = tl.inline_asm_elementwise(F16X2_ASM, "=r,f,f", [x], dtype=tl.float16, is_pure=True, pack=2)
    elif EXP == BF16X2:
        p = tl.inline_asm_elementwise(BF16X2_ASM, "=r,f,f", [x], dtype=tl.bfloat16, is_pure=True, pack=2)
    elif EXP == SPLIT2:
        a, c = tl.split(tl.reshape(x, [BM, BN // 2, 2]))
        p = tl.reshape(tl.join(tl.math.exp2(a), exp2_poly(c)), [BM, BN])
    else:  # SPLIT4
        a, c = tl.split(tl.reshape(x, [BM, BN // 4, 2, 2]))
        a0, a1 = tl.split(a)
        c0, c1 = tl.split(c)
        p = tl.reshape(tl.join(tl.join(tl.math.exp2(a0), tl.math.exp2(a1)),
                               tl.join(tl.math.exp2(c0), exp2_poly(c1))), [BM, BN])
    return p


@triton.jit
def _softmax_pv(acc, l_i, m_i, s, v, scale2, EXP: tl.constexpr, RESCALE: tl.constexpr):
    """One key block's online-softmax update from its scores s (q.k) and V tile v."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
    p = _exp2(s * scale2 - m_new[:, None], EXP, s.shape[0], s.shape[1])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p.to(tl.float32), 1)
    if RESCALE:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def fwd(Q, K, V, Out, seq, sm_scale, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
        LOOP: tl.constexpr, WS: tl.constexpr, EXP: tl.constexpr, RESCALE: tl.constexpr):
    start_m = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    qd = element_tiles(Q, b, seq, H * D, BM, D)
    kd = element_tiles(K, b, seq, H * D, BN, D)
    vd = element_tiles(V, b, seq, H * D, BN, D)
    row0 = b * seq
    col = h * D
    q = qd.load([row0 + start_m, col])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    scale2 = sm_scale * 1.44269504
    za = tl.zeros([BM, 16], Q.dtype.element_ty)
    zb = tl.zeros([16, 16], Q.dtype.element_ty)
    if LOOP == OVERLAP:
        s = tl.full([BM, BN], -1.0e30, tl.float32)  # the dummy block
        for start_n in tl.range(0, seq + BN, BN, warp_specialize=WS):
            # synchronous (read in the loop): its wait_group 0 drains S_i and P.V_{i-1}; adding its zeros to the
            # carried S also lets the warp-specialisation pass reach S's users from a product
            s = s + tl.max(tl.dot(za, zb), 1)[:, None]
            s_next = tl.dot(q, kd.load([row0 + tl.minimum(start_n, seq - BN), col]).T)  # read only via the yield
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, vd.load([row0 + tl.maximum(start_n - BN, 0), col]),
                                        scale2, EXP, RESCALE)
            s = s_next
    elif LOOP == PEELED:
        s = tl.dot(q, kd.load([row0, col]).T)
        for start_n in tl.range(BN, seq, BN):
            s = s + tl.max(tl.dot(za, zb), 1)[:, None]
            s_next = tl.dot(q, kd.load([row0 + start_n, col]).T)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, vd.load([row0 + start_n - BN, col]), scale2, EXP, RESCALE)
            s = s_next
        acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, vd.load([row0 + seq - BN, col]), scale2, EXP, RESCALE)
    elif LOOP == TWO_BLOCKS:  # the second block's exponentials by the polynomial where EXP == POLY
        for start_n in tl.range(0, seq, 2 * BN, warp_specialize=WS):
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, tl.dot(q, kd.load([row0 + start_n, col]).T),
                                        vd.load([row0 + start_n, col]), scale2, MUFU, RESCALE)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, tl.dot(q, kd.load([row0 + start_n + BN, col]).T),
                                        vd.load([row0 + start_n + BN, col]), scale2, EXP, RESCALE)
    else:
        for start_n in tl.range(0, seq, BN, warp_specialize=WS):
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, tl.dot(q, kd.load([row0 + start_n, col]).T),
                                        vd.load([row0 + start_n, col]), scale2, EXP, RESCALE)
    out = acc / l_i[:, None]
    offs_m = start_m + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    base = b.to(tl.int64) * seq * H * D + col
    tl.store(Out + base + offs_m[:, None] * (H * D) + offs_d[None, :], out.to(Out.dtype.element_ty))


# name: (LOOP, WS, EXP, RESCALE, num_warps, num_stages)
CASES = {"ws": (ONE, True, MUFU, True, 4, 2), "ws-noexp": (ONE, True, NOEXP, True, 4, 2),
         "ws-norescale": (ONE, True, MUFU, False, 4, 2), "plain": (ONE, False, MUFU, True, 8, 2),
         "plain-s3": (ONE, False, MUFU, True, 8, 3), "overlap": (OVERLAP, False, MUFU, True, 8, 2),
         "overlap-s3": (OVERLAP, False, MUFU, True, 8, 3), "peeled": (PEELED, False, MUFU, True, 8, 2),
         "overlap-ws": (OVERLAP, True, MUFU, True, 4, 2)}  # peeled at 3 stages: 262 KB of shared memory at D 128
FA4_CASES = {"ws-split4": (ONE, True, SPLIT4, True, 4, 2), "ws-split2": (ONE, True, SPLIT2, True, 4, 2),
             "ws-two-blocks-poly": (TWO_BLOCKS, True, POLY, True, 4, 2),
             "ws-two-blocks": (TWO_BLOCKS, True, MUFU, True, 4, 2), "ws-asm1": (ONE, True, ASM1, True, 4, 2),
             "ws-asm2": (ONE, True, ASM2, True, 4, 2), "ws-poly": (ONE, True, POLY, True, 4, 2),
             "ws-f16x2": (ONE, True, F16X2, True, 4, 2), "ws-bf16x2": (ONE, True, BF16X2, True, 4, 2)}


def main(argv):
    cases = {**CASES, **(FA4_CASES if "--all" in argv else {})}
    chosen = [x for x in argv if not x.isdigit() and x != "--all"]  # case names: only those
    cases = {name: case for name, case in {**CASES, **FA4_CASES}.items() if name in chosen} if chosen else cases
    for d in [int(x) for x in argv if x.isdigit()] or [128, 64]:
        for b, n in ((4, 4096), (1, 16384)):
            h = 2048 // d
            torch.manual_seed(0)
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o = torch.empty_like(q)
            heads_first = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            ref = torch.nn.functional.scaled_dot_product_attention(*heads_first).transpose(1, 2)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                cud = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(*heads_first),
                                              rep=300)
            print(f"D {d}, {b} x {n} x {h}: cuDNN (torch) {cud:.3f} ms", flush=True)
            for name, (loop, ws, exp, rescale, warps, stages) in cases.items():
                def call():
                    fwd[(n // 128, b * h)](q, k, v, o, n, d ** -0.5, h, d, 128, 128, loop, ws, exp, rescale,
                                           num_warps=warps, num_stages=stages)
                try:
                    call()
                    torch.cuda.synchronize()
                    err = (o.float() - ref.float()).abs().max().item()
                    ms = triton.testing.do_bench(call, rep=300)
                    print(f"  {name:18s} {ms:.3f} ms ({cud / ms:.3f}x cuDNN) max err {err:.4f}", flush=True)
                except Exception as e:  # noqa: BLE001  (a case that fails to compile or launch, recorded)
                    print(f"  {name:18s} {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
