"""What the softmax costs the warp-specialised forward loop (issue 19; benchmarks/results/NOTES.md, "Ninth
session"): a bare TMA + WS forward (tutorial-style, 128 x 128 tiles, 4 warps, 2 stages, non-causal, whole
blocks, D 128, bf16), timed as it is and with parts of its softmax left out, against cuDNN through torch, in
one process. Needs a Hopper GPU and torch (Triton's own launcher). From the repository root:
    python benchmarks/hopper_softmax_cost.py [--all]
EXP 0: exp2 on the MUFU unit (the real kernel); 1: no exponential (an FMA instead: timing only, wrong
output); RESCALE 0: no acc * alpha (timing only). --all also tries moving exponentials to the FMA pipe
(FlashAttention-4's polynomial exp2), which Triton 3.6's warp-specialisation pass does not compile: 2 / 3 a
quarter / half of the columns through split and join, 4 / 5 two key blocks an iteration (the second's
exponentials by the polynomial or not), 6 / 7 one / two of every four register-adjacent elements through
inline PTX, 8 every element through the polynomial (a bitcast)."""
import sys

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


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


# 2^x of the last (EXP 6) or last two (EXP 7) of every 4 register-adjacent elements by a degree-3 polynomial
# on the FMA pipe (relative error 7.5e-5 on [-0.5, 0.5]; x >= -126), the others by ex2.approx (MUFU)
_POLY = ("{ .reg .f32 x, t, j, f, p; .reg .b32 pb, tb; max.f32 x, $X, 0fC2FC0000; add.f32 t, x, 0f4B400000; "
         "sub.f32 j, t, 0f4B400000; sub.f32 f, x, j; fma.rn.f32 p, f, 0f3D61FBA5, 0f3E786F10; "
         "fma.rn.f32 p, p, f, 0f3F31798E; fma.rn.f32 p, p, f, 0f3F7FFB49; mov.b32 pb, p; mov.b32 tb, t; "
         "shl.b32 tb, tb, 23; add.s32 pb, pb, tb; mov.b32 $Y, pb; }")


_ASM = {1: ("ex2.approx.ftz.f32 $0, $4; ex2.approx.ftz.f32 $1, $5; ex2.approx.ftz.f32 $2, $6; "
             + _POLY.replace("$X", "$7").replace("$Y", "$3")),
        2: ("ex2.approx.ftz.f32 $0, $4; ex2.approx.ftz.f32 $1, $5; "
            + _POLY.replace("$X", "$6").replace("$Y", "$2") + _POLY.replace("$X", "$7").replace("$Y", "$3"))}
ASM1: tl.constexpr = tl.constexpr(_ASM[1])
ASM2: tl.constexpr = tl.constexpr(_ASM[2])


@triton.jit
def exp2_mixed(x, NPOLY: tl.constexpr):
    if NPOLY == 1:
        return tl.inline_asm_elementwise(ASM1, "=f,=f,=f,=f,f,f,f,f", [x], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(ASM2, "=f,=f,=f,=f,f,f,f,f", [x], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _blk(acc, l_i, m_i, q, kd, vd, row, col, scale2, POLY: tl.constexpr):
    k = kd.load([row, col])
    s = tl.dot(q, k.T)
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
    x = s * scale2 - m_new[:, None]
    if POLY:
        p = exp2_poly(x)
    else:
        p = tl.math.exp2(x)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = vd.load([row, col])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def kern(Q, K, V, Out, seq, sm_scale, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         EXP: tl.constexpr, RESCALE: tl.constexpr):
    start_m = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = (b + 1) * seq
    qd = tl.make_tensor_descriptor(Q, shape=[rows, H * D], strides=[H * D, 1], block_shape=[BM, D])
    kd = tl.make_tensor_descriptor(K, shape=[rows, H * D], strides=[H * D, 1], block_shape=[BN, D])
    vd = tl.make_tensor_descriptor(V, shape=[rows, H * D], strides=[H * D, 1], block_shape=[BN, D])
    row0 = b * seq
    q = qd.load([row0 + start_m, h * D])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    scale2 = sm_scale * 1.44269504
    if EXP >= 4:  # two key blocks an iteration, the second's exponentials by the polynomial (EXP 4) or not (5)
        for start_n in tl.range(0, seq, 2 * BN, warp_specialize=True):
            acc, l_i, m_i = _blk(acc, l_i, m_i, q, kd, vd, row0 + start_n, h * D, scale2, False)
            acc, l_i, m_i = _blk(acc, l_i, m_i, q, kd, vd, row0 + start_n + BN, h * D, scale2, EXP == 4)
    else:
        for start_n in tl.range(0, seq, BN, warp_specialize=True):
            k = kd.load([row0 + start_n, h * D])
            s = tl.dot(q, k.T)
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
            x = s * scale2 - m_new[:, None]
            if EXP == 0:
                p = tl.math.exp2(x)
            elif EXP == 1:
                p = x * 0.001 + 1.0
            elif EXP == 8:
                p = exp2_poly(x)
            elif EXP >= 6:
                p = exp2_mixed(x, EXP - 5)
            else:
                FR: tl.constexpr = 4 if EXP == 2 else 2
                xr = tl.reshape(x, [BM, BN // FR, FR])
                if FR == 2:
                    a, c = tl.split(xr)
                    p = tl.reshape(tl.join(tl.math.exp2(a), exp2_poly(c)), [BM, BN])
                else:
                    a, c = tl.split(tl.reshape(xr, [BM, BN // FR, 2, 2]))
                    a0, a1 = tl.split(a)
                    c0, c1 = tl.split(c)
                    p = tl.reshape(tl.join(tl.join(tl.math.exp2(a0), tl.math.exp2(a1)),
                                           tl.join(tl.math.exp2(c0), exp2_poly(c1))), [BM, BN])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = vd.load([row0 + start_n, h * D])
            if RESCALE:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            else:
                acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
    out = acc / l_i[:, None]
    offs_m = start_m + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    base = b.to(tl.int64) * seq * H * D + h * D
    tl.store(Out + base + offs_m[:, None] * (H * D) + offs_d[None, :], out.to(Out.dtype.element_ty))


for B, N in ((4, 4096), (1, 16384)):
    H, D = 16, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    heads_first = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    ref = torch.nn.functional.scaled_dot_product_attention(*heads_first).transpose(1, 2)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        cud = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(*heads_first), rep=300)
    print(f"{B}x{N}: cudnn(torch) {cud:.3f} ms", flush=True)
    more = [(exp, 1) for exp in range(2, 9)] if "--all" in sys.argv else []
    for exp, rescale in [(0, 1), (1, 1), (0, 0), (0, 1)] + more:
        grid = (N // 128, B * H)
        call = lambda: kern[grid](q, k, v, o, N, D ** -0.5, H, D, 128, 128, exp, rescale, num_warps=4, num_stages=2)
        try:
            call()
            torch.cuda.synchronize()
            err = (o.float() - ref.float()).abs().max().item()
            ms = triton.testing.do_bench(call, rep=300)
            print(f"  EXP {exp} RESCALE {rescale}: {ms:.3f} ms ({cud / ms:.3f}x cudnn) err {err:.4f}", flush=True)
        except Exception as e:
            print(f"  EXP {exp} RESCALE {rescale}: {type(e).__name__} {str(e)[:200]}", flush=True)
