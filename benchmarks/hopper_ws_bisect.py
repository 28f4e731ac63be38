"""Bisect what breaks warp specialisation in our forward (Triton 3.6, Hopper; benchmarks/results/NOTES.md,
"Hopper"): a tutorial-style TMA + warp-specialised loop moved step by step towards kernels/fwd.py. Needs a
Hopper GPU and torch (Triton's own launcher). From the repository root:
    python benchmarks/hopper_ws_bisect.py FLAGS [BM BN W S]
FLAGS: comma list of PERB (per-batch-element 2-D descriptors), REV (reversed query blocks), IEEE (dots with
input_precision ieee), SC (our scores() + m_use guard), BLK (our _fwd_block; implies PERB), KB (loop bounds from
key_blocks), LSE (store lse), CAUSAL, NOWS."""
import sys, time
import torch, triton, triton.language as tl
from kernels.fwd import _fwd_block
from kernels.masking import key_blocks, load_ids
from kernels.scores import scores

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


@triton.jit
def diag_block(acc, l_i, m_i, q, kd, vd, row0, start_n, offs_m, sm_scale, h, D: tl.constexpr, BN: tl.constexpr):
    k = kd.load([row0 + start_n, h * D])
    qk = tl.dot(q, k.T)
    offs_n = start_n + tl.arange(0, BN)
    s = tl.where(offs_n[None, :] <= offs_m[:, None], qk, float("-inf"))
    scale2 = sm_scale * 1.44269504
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
    p = tl.math.exp2(s * scale2 - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = vd.load([row0 + start_n, h * D])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def kern(Q, K, V, Out, Lse, seq, sm_scale, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         PERB: tl.constexpr, REV: tl.constexpr, IEEE: tl.constexpr, SC: tl.constexpr, BLK: tl.constexpr,
         KB: tl.constexpr, LSE: tl.constexpr, CAUSAL: tl.constexpr, WS: tl.constexpr, BAR: tl.constexpr,
         SHAPEB: tl.constexpr, PERBQ: tl.constexpr, PERBKV: tl.constexpr, I32: tl.constexpr, TWO: tl.constexpr = False,
         TWOWS: tl.constexpr = False, PRE: tl.constexpr = False, DIAG1: tl.constexpr = False):
    if REV:
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BM
    else:
        start_m = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    nb = tl.num_programs(1) // H
    if I32:
        base = b * seq * (H * D)
    else:
        base = b.to(tl.int64) * seq * (H * D)
    rows = nb * seq
    if SHAPEB:
        rows = (b + 1) * seq
    qd = tl.make_tensor_descriptor(Q, shape=[rows, H * D], strides=[H * D, 1], block_shape=[BM, D])
    kd = tl.make_tensor_descriptor(K, shape=[rows, H * D], strides=[H * D, 1], block_shape=[BN, D])
    vd = tl.make_tensor_descriptor(V, shape=[rows, H * D], strides=[H * D, 1], block_shape=[BN, D])
    row0 = b * seq
    q_row0 = b * seq
    if PERB | PERBQ:
        qd = tl.make_tensor_descriptor(Q + base, shape=[seq, H * D], strides=[H * D, 1], block_shape=[BM, D])
        q_row0 = 0
    if PERB | PERBKV:
        kd = tl.make_tensor_descriptor(K + base, shape=[seq, H * D], strides=[H * D, 1], block_shape=[BN, D])
        vd = tl.make_tensor_descriptor(V + base, shape=[seq, H * D], strides=[H * D, 1], block_shape=[BN, D])
        row0 = 0
    if BAR:
        tl.debug_barrier()
    q = qd.load([q_row0 + start_m, h * D])
    offs_m = start_m + tl.arange(0, BM)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    hi_off = 0 if CAUSAL else (1 << 30)
    lo_off = -(1 << 30)
    if KB:
        lo, _fs, _fe, hi = key_blocks(start_m, seq, seq, lo_off, hi_off, K, b, BM, BN, CAUSAL, False)
    else:
        lo = 0
        hi = tl.minimum(start_m + BM, seq) if CAUSAL else seq
    q_ids = load_ids(K, b, offs_m, seq, False)
    if TWO:  # causal: unmasked WS loop below the diagonal, then the diagonal blocks masked
        hi = start_m
        if PRE:
            if DIAG1:
                acc, l_i, m_i = diag_block(acc, l_i, m_i, q, kd, vd, row0, start_m, offs_m, sm_scale, h, D, BN)
            else:
                for start_n in tl.range(start_m, tl.minimum(start_m + BM, seq), BN):
                    acc, l_i, m_i = diag_block(acc, l_i, m_i, q, kd, vd, row0, start_n, offs_m, sm_scale, h, D, BN)
    for start_n in tl.range(lo, hi, BN, warp_specialize=WS):
        k = kd.load([row0 + start_n, h * D])
        if BLK:
            acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k, V, vd, row0, h * D, start_n, start_m, seq, seq, lo_off, hi_off,
                                       0, 0, 0, sm_scale, 1.0, 0.0, q_ids, K, b, 0, STRIDE_KV=H * D, HEAD_DIM=D,
                                       BLOCK_D=D, BLOCK_M=BM, BLOCK_N=BN, BANDED=CAUSAL, MASKED=True, SOFTCAP=False,
                                       ALIBI=False, SEGMENTS=False, DROP_THRESHOLD=0, P8_LOG2=0, TMA=True,
                                       POSITIONS=False)
        else:
            if IEEE:
                qk = tl.dot(q, k.T, input_precision="ieee")
            else:
                qk = tl.dot(q, k.T)
            offs_n = start_n + tl.arange(0, BN)
            if SC:
                s, scale2, _ = scores(qk, offs_m[:, None], offs_n[None, :], q_ids[:, None], tl.zeros([1, BN], tl.int32), seq, seq,
                                      lo_off, hi_off, 0, sm_scale, 1.0, 0.0, MASKED=True, BANDED=CAUSAL,
                                      SEGMENTS=False, SOFTCAP=False, ALIBI=False)
                m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                scale2 = sm_scale * 1.44269504
                s = qk
                if CAUSAL:
                    s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
                m_use = m_new
            p = tl.math.exp2(s * scale2 - m_use[:, None])
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = vd.load([row0 + start_n, h * D])
            if IEEE:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
    if TWO and not PRE:
        if DIAG1:
            acc, l_i, m_i = diag_block(acc, l_i, m_i, q, kd, vd, row0, start_m, offs_m, sm_scale, h, D, BN)
        else:
            for start_n in tl.range(start_m, tl.minimum(start_m + BM, seq), BN, warp_specialize=TWOWS):
                acc, l_i, m_i = diag_block(acc, l_i, m_i, q, kd, vd, row0, start_n, offs_m, sm_scale, h, D, BN)
    out = acc / l_i[:, None]
    offs_d = tl.arange(0, D)
    base = b.to(tl.int64) * seq * H * D + h * D
    tl.store(Out + base + offs_m[:, None] * (H * D) + offs_d[None, :], out.to(Out.dtype.element_ty), mask=offs_m[:, None] < seq)
    if LSE:
        tl.store(Lse + bh.to(tl.int64) * seq + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < seq)


flags = set(sys.argv[1].split(",")) - {""}
BM, BN, W, S = (int(x) for x in (sys.argv[2:6] or (128, 128, 4, 2)))
F = {f: f in flags for f in ("PERB", "REV", "IEEE", "SC", "BLK", "KB", "LSE", "CAUSAL", "BAR", "SHAPEB", "PERBQ", "PERBKV", "I32", "TWO", "TWOWS", "PRE", "DIAG1")}

B, N, H, D = 4, 4096, 16, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = torch.empty_like(q)
lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
grid = (N // BM, B * H)
call = lambda: kern[grid](q, k, v, o, lse, N, D ** -0.5, H, D, BM, BN, **F, WS="NOWS" not in flags, num_warps=W,
                          num_stages=S)
t = time.time()
call()
torch.cuda.synchronize()
ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=F["CAUSAL"]).transpose(1, 2)
err = (o.float() - ref.float()).abs().max().item()
per_b = " ".join(f"{(o[i].float() - ref[i].float()).abs().max().item():.3f}" for i in range(B))
ms = triton.testing.do_bench(call)
flops = 4 * B * H * N * N * D / (2 if F["CAUSAL"] else 1)
print(f"{sys.argv[1]:28s} {BM}x{BN}w{W}s{S} err {err:.4f} nan {bool(o.isnan().any())} {flops / ms / 1e9:.0f} TF/s "
      f"first {time.time() - t:.1f}s per batch {per_b}", flush=True)
