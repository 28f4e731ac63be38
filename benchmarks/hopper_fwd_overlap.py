"""FlashAttention-3's intra-warpgroup overlap written in plain Triton (issue 19; benchmarks/results/NOTES.md, "Ninth
session"): the next key block's q.k product runs on the tensor cores while this block's softmax runs. Bare TMA
forwards (non-causal, whole blocks, bf16), timed against cuDNN through torch in one process, each checked against
torch's attention. Needs a Hopper GPU and torch (Triton's own launcher). From the repository root:

    python benchmarks/hopper_fwd_overlap.py [D ...]

Triton 3.6 keeps a wgmma in flight only if nothing in the loop reads it but the yield, and reads of the previous
iteration's result come after a `wgmma.wait_group 0` (WGMMAPipeline.cpp, dotCanBeProperlyAsync). So the loop
carries S: iteration i starts with a small synchronous product (its wait drains S_i and P.V_{i-1}), issues
S_{i+1}, then runs block i's softmax beside it and issues P.V_i. Iteration 0 softmaxes a dummy block of -1e30
scores (p = 1 against a running max of -1e30), whose weight the next block's rescale alpha = 2^(-1e30 - m) sets
to 0; one extra q.k and P.V per tile. Modes (BLOCK_M = BLOCK_N = 128):
  ws        the tutorial-style warp-specialised loop (what kernels/fwd.py's TMA row runs), 4 warps, 2 stages
  plain     the same loop without warp specialisation, 8 warps
  overlap   the carried-S loop, 8 warps: sm90 PTX has no wait between S_{i+1}'s issue and block i's softmax
  peeled    the same overlap with the first block's q.k before the loop and the last block's softmax after it
            (no dummy block; what a masked kernel would take: softcap or ALiBi would not weigh a dummy block by 0)
  overlap-ws  the carried-S loop warp-specialised: compiles, but the consumer releases K's buffer right after the
            S product, so S is waited for there (no overlap; for the record)
"""
import sys

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


@triton.jit
def _softmax_pv(acc, l_i, m_i, s, v, scale2):
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
    p = tl.math.exp2(s * scale2 - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    return tl.dot(p.to(v.dtype), v, acc * alpha[:, None]), l_i, m_new


@triton.jit
def fwd(Q, K, V, Out, seq, sm_scale, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
        OVERLAP: tl.constexpr, WS: tl.constexpr, PEELED: tl.constexpr = False):
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
    if PEELED:  # the same overlap, the first block's q.k before the loop and the last softmax after it
        za = tl.zeros([BM, 16], Q.dtype.element_ty)
        zb = tl.zeros([16, 16], Q.dtype.element_ty)
        s = tl.dot(q, kd.load([row0, h * D]).T)
        for start_n in tl.range(BN, seq, BN):
            s = s + tl.max(tl.dot(za, zb), 1)[:, None]
            s_next = tl.dot(q, kd.load([row0 + start_n, h * D]).T)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, vd.load([row0 + start_n - BN, h * D]), scale2)
            s = s_next
        acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, vd.load([row0 + seq - BN, h * D]), scale2)
    elif OVERLAP:
        s = tl.full([BM, BN], -1.0e30, tl.float32)  # the dummy block
        last = seq - BN
        za = tl.zeros([BM, 16], Q.dtype.element_ty)
        zb = tl.zeros([16, 16], Q.dtype.element_ty)
        for start_n in tl.range(0, seq + BN, BN, warp_specialize=WS):
            # synchronous (read in the loop): its wait_group 0 drains S_i and P.V_{i-1}; adding its zeros to the
            # carried S also lets the warp-specialisation pass reach S's users from a product
            s = s + tl.max(tl.dot(za, zb), 1)[:, None]
            k = kd.load([row0 + tl.minimum(start_n, last), h * D])
            s_next = tl.dot(q, k.T)  # read only through the loop's yield: stays in flight
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
            p = tl.math.exp2(s * scale2 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = vd.load([row0 + tl.maximum(start_n - BN, 0), h * D])
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
            s = s_next
    else:
        for start_n in tl.range(0, seq, BN, warp_specialize=WS):
            k = kd.load([row0 + start_n, h * D])
            s = tl.dot(q, k.T)
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
            p = tl.math.exp2(s * scale2 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = vd.load([row0 + start_n, h * D])
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
    out = acc / l_i[:, None]
    offs_m = start_m + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    base = b.to(tl.int64) * seq * H * D + h * D
    tl.store(Out + base + offs_m[:, None] * (H * D) + offs_d[None, :], out.to(Out.dtype.element_ty))


# mode: (OVERLAP, WS, num_warps, num_stages, PEELED)
MODES = {"ws": (False, True, 4, 2, False), "plain": (False, False, 8, 2, False),
         "plain-s3": (False, False, 8, 3, False), "overlap": (True, False, 8, 2, False),
         "overlap-s3": (True, False, 8, 3, False), "peeled": (False, False, 8, 2, True),
         "overlap-ws": (True, True, 4, 2, False)}  # peeled at 3 stages: 262 KB of shared memory at D 128


def main(dims):
    for d in dims:
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
            for mode, (overlap, ws, warps, stages, peeled) in MODES.items():
                def call():
                    fwd[(n // 128, b * h)](q, k, v, o, n, d ** -0.5, h, d, 128, 128, overlap, ws, peeled,
                                           num_warps=warps, num_stages=stages)
                try:
                    call()
                    torch.cuda.synchronize()
                    err = (o.float() - ref.float()).abs().max().item()
                    ms = triton.testing.do_bench(call, rep=300)
                    print(f"  {mode:10s} {ms:.3f} ms ({cud / ms:.3f}x cuDNN) max err {err:.4f}", flush=True)
                except Exception as e:  # noqa: BLE001  (a mode that fails to compile or launch, recorded)
                    print(f"  {mode:10s} {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [128, 64])
