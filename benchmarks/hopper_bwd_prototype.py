"""Prototype of the Hopper backward (benchmarks/results/NOTES.md, "Hopper"): bare dK/dV and dQ loops (MHA,
whole blocks, causal or not), pointer loads against TMA descriptors with and without warp specialisation,
per tile config; what chose kernels/configs.py's sm90 backward rows. Needs Triton 3.6+ and, on the GPU,
torch (Triton's own launcher). From the repository root:
    python benchmarks/hopper_bwd_prototype.py [--d 64]   # H100/H200: error against float32, ms, TF/s
    python benchmarks/hopper_bwd_prototype.py --compile  # CPU: sm90 cross-compile, warps and shared memory
TF/s count the kernel's share of the backward: dK/dV 4 products, dQ 3."""
import argparse
import math
import sys
import time

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def dkdv_k(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, seq, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
           BN: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, LSE_TMA: tl.constexpr):
    start_n = tl.program_id(0) * BN
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    STRIDE: tl.constexpr = H * D
    row0 = b * seq
    col = h * D
    offs_n = start_n + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    base = b.to(tl.int64) * seq * STRIDE + col
    scale2 = sm_scale * 1.4426950408889634
    if TMA:
        qd = tl.make_tensor_descriptor(Q, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BM, D])
        dod = tl.make_tensor_descriptor(DO, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BM, D])
        kd = tl.make_tensor_descriptor(K, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BN, D])
        vd = tl.make_tensor_descriptor(V, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BN, D])
        k = kd.load([row0 + start_n, col])
        v = vd.load([row0 + start_n, col])
    else:
        k = tl.load(K + base + offs_n[:, None] * STRIDE + offs_d[None, :])
        v = tl.load(V + base + offs_n[:, None] * STRIDE + offs_d[None, :])
    if LSE_TMA:
        ld = tl.make_tensor_descriptor(LSE, shape=[(bh + 1) * seq], strides=[1], block_shape=[BM])
        dd = tl.make_tensor_descriptor(DELTA, shape=[(bh + 1) * seq], strides=[1], block_shape=[BM])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    lo = 0
    if CAUSAL:
        lo = start_n // BM * BM
    for start_m in tl.range(lo, seq, BM, warp_specialize=WS):
        offs_m = start_m + tl.arange(0, BM)
        if TMA:
            q = qd.load([row0 + start_m, col])
            do = dod.load([row0 + start_m, col])
        else:
            q = tl.load(Q + base + offs_m[:, None] * STRIDE + offs_d[None, :])
            do = tl.load(DO + base + offs_m[:, None] * STRIDE + offs_d[None, :])
        if LSE_TMA:
            lse = ld.load([bh * seq + start_m])
            delta = dd.load([bh * seq + start_m])
        else:
            lse = tl.load(LSE + bh.to(tl.int64) * seq + offs_m)
            delta = tl.load(DELTA + bh.to(tl.int64) * seq + offs_m)
        s_t = tl.dot(k, tl.trans(q))
        if CAUSAL:
            s_t = tl.where(offs_m[None, :] >= offs_n[:, None], s_t * scale2, float("-inf"))
            p_t = tl.math.exp2(s_t - lse[None, :])
        else:
            p_t = tl.math.exp2(s_t * scale2 - lse[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    tl.store(DK + base + offs_n[:, None] * STRIDE + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + base + offs_n[:, None] * STRIDE + offs_d[None, :], dv.to(DV.dtype.element_ty))


@triton.jit
def dq_k(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, seq, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
         BN: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, LSE_TMA: tl.constexpr):
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BM
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    STRIDE: tl.constexpr = H * D
    row0 = b * seq
    col = h * D
    offs_m = start_m + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    base = b.to(tl.int64) * seq * STRIDE + col
    scale2 = sm_scale * 1.4426950408889634
    if TMA:
        qd = tl.make_tensor_descriptor(Q, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BM, D])
        dod = tl.make_tensor_descriptor(DO, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BM, D])
        kd = tl.make_tensor_descriptor(K, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BN, D])
        vd = tl.make_tensor_descriptor(V, shape=[(b + 1) * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BN, D])
        q = qd.load([row0 + start_m, col])
        do = dod.load([row0 + start_m, col])
    else:
        q = tl.load(Q + base + offs_m[:, None] * STRIDE + offs_d[None, :])
        do = tl.load(DO + base + offs_m[:, None] * STRIDE + offs_d[None, :])
    lse = tl.load(LSE + bh.to(tl.int64) * seq + offs_m)
    delta = tl.load(DELTA + bh.to(tl.int64) * seq + offs_m)
    dq = tl.zeros([BM, D], tl.float32)
    hi = seq
    if CAUSAL:
        hi = tl.minimum(start_m + BM, seq)
    for start_n in tl.range(0, hi, BN, warp_specialize=WS):
        offs_n = start_n + tl.arange(0, BN)
        if TMA:
            k = kd.load([row0 + start_n, col])
            v = vd.load([row0 + start_n, col])
        else:
            k = tl.load(K + base + offs_n[:, None] * STRIDE + offs_d[None, :])
            v = tl.load(V + base + offs_n[:, None] * STRIDE + offs_d[None, :])
        s = tl.dot(q, tl.trans(k))
        if CAUSAL:
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s * scale2, float("-inf"))
            p = tl.math.exp2(s - lse[:, None])
        else:
            p = tl.math.exp2(s * scale2 - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    tl.store(DQ + base + offs_m[:, None] * STRIDE + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty))


# (name, kernel, BM, BN, warps, stages, TMA, WS, LSE_TMA)
VARIANTS_D64 = [
    ("dkdv ptr 32x128 w4 s3", "dkdv", 32, 128, 4, 3, False, False, False),
    ("dkdv tma+ws+lse 64x128 w4 s2", "dkdv", 64, 128, 4, 2, True, True, True),
    ("dkdv tma+ws+lse 64x128 w4 s3", "dkdv", 64, 128, 4, 3, True, True, True),
    ("dkdv tma+ws+lse 128x128 w4 s2", "dkdv", 128, 128, 4, 2, True, True, True),
    ("dkdv tma+ws+lse 64x64 w4 s3", "dkdv", 64, 64, 4, 3, True, True, True),
    ("dq ptr 128x32 w4 s3", "dq", 128, 32, 4, 3, False, False, False),
    ("dq tma 128x32 w4 s3", "dq", 128, 32, 4, 3, True, False, False),
    ("dq tma 64x64 w4 s3", "dq", 64, 64, 4, 3, True, False, False),
    ("dq tma 128x64 w4 s2", "dq", 128, 64, 4, 2, True, False, False),
    ("dq tma 128x64 w8 s3", "dq", 128, 64, 8, 3, True, False, False),
]
VARIANTS = [
    ("dkdv ptr 64x128 w8 s2", "dkdv", 64, 128, 8, 2, False, False, False),
    ("dkdv tma 64x128 w8 s2", "dkdv", 64, 128, 8, 2, True, False, False),
    ("dkdv tma+ws 64x128 w4 s2", "dkdv", 64, 128, 4, 2, True, True, False),
    ("dkdv tma+ws+lse 64x128 w4 s2", "dkdv", 64, 128, 4, 2, True, True, True),
    ("dkdv tma+ws+lse 64x128 w8 s2", "dkdv", 64, 128, 8, 2, True, True, True),
    ("dkdv tma+ws+lse 64x128 w4 s3", "dkdv", 64, 128, 4, 3, True, True, True),
    ("dkdv tma+ws+lse 128x128 w4 s2", "dkdv", 128, 128, 4, 2, True, True, True),
    ("dkdv tma+ws+lse 64x64 w4 s3", "dkdv", 64, 64, 4, 3, True, True, True),
    ("dq ptr 64x64 w4 s2", "dq", 64, 64, 4, 2, False, False, False),
    ("dq tma 64x64 w4 s2", "dq", 64, 64, 4, 2, True, False, False),
    ("dq tma+ws 64x64 w4 s2", "dq", 64, 64, 4, 2, True, True, False),
    ("dq tma+ws 128x64 w4 s2", "dq", 128, 64, 4, 2, True, True, False),
    ("dq tma+ws 128x128 w4 s2", "dq", 128, 128, 4, 2, True, True, False),
    ("dq tma+ws 64x128 w4 s2", "dq", 64, 128, 4, 2, True, True, False),
    ("dq tma+ws 128x64 w8 s2", "dq", 128, 64, 8, 2, True, True, False),
]
KERNELS = {"dkdv": dkdv_k, "dq": dq_k}


def compile_sm90(label, fn, sig, const, attrs, num_warps, num_stages):
    """Compile fn for sm90 on the CPU and print what came out (warps after warp specialisation, shared
    memory, TMA scratch, wgmma and TMA instructions), or why it failed: a variant that does not compile is
    a result."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    t0 = time.time()
    try:
        c = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=num_warps, num_stages=num_stages))
        ptx = c.asm["ptx"]
        print(f"{label} ok warps={c.metadata.num_warps} shared={c.metadata.shared} "
              f"scratch={c.metadata.global_scratch_size} wgmma={ptx.count('wgmma.mma_async')} "
              f"tma={ptx.count('cp.async.bulk.tensor')} {time.time() - t0:.0f}s", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{label} FAIL {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


def compile_all(causal):
    for name, kern, bm, bn, w, s, tma, ws, lt in VARIANTS:
        fn = KERNELS[kern]
        n_ptr = 8 if kern == "dkdv" else 7
        sig = {fn.arg_names[i]: "*bf16" for i in range(n_ptr)}
        for nm in ("LSE", "DELTA"):
            sig[nm] = "*fp32"
        sig["sm_scale"] = "fp32"
        sig["seq"] = "i32"
        const = dict(H=16, D=128, BM=bm, BN=bn, CAUSAL=causal, TMA=tma, WS=ws, LSE_TMA=lt)
        for c in const:
            sig[c] = "constexpr"
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_ptr)}
        attrs[(n_ptr + 1,)] = [["tt.divisibility", 16]]
        compile_sm90(f"{name:34s} causal={causal}", fn, sig, const, attrs, w, s)


def best_seconds(torch, call, reps):
    """Seconds per call: the best of three timings of `reps` back-to-back calls (after a first call)."""
    ts = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / reps)
    return min(ts)


def run_gpu(shapes, reps):
    import torch
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    for (B, N, H, D) in shapes:
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = 1 / math.sqrt(D)
            # float32 reference
            qf, kf, vf, dof = (t.float().permute(0, 2, 1, 3) for t in (q, k, v, do))
            s = qf @ kf.transpose(-1, -2) * scale
            if causal:
                s = s.masked_fill(torch.ones(N, N, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
            lse = torch.logsumexp(s, -1)
            p = torch.exp(s - lse[..., None])
            o = p @ vf
            dvr = p.transpose(-1, -2) @ dof
            dp = dof @ vf.transpose(-1, -2)
            delta = (o * dof).sum(-1)
            ds = p * (dp - delta[..., None])
            dqr = ds @ kf * scale
            dkr = ds.transpose(-1, -2) @ qf * scale
            del s, p, dp, ds
            lse2 = (lse * LOG2E).contiguous().reshape(B * H, N)
            delta = delta.contiguous().reshape(B * H, N)
            flops_fwd = 4 * B * H * N * N * D / (2 if causal else 1)
            ref = {"dq": (dqr,), "dkdv": (dkr, dvr)}
            for name, kern, bm, bn, w, st, tma, ws, lt in (VARIANTS_D64 if D == 64 else VARIANTS):
                outs = [torch.empty_like(q) for _ in ref[kern]]
                grid = (N // (bn if kern == "dkdv" else bm), B * H)
                fn = KERNELS[kern]

                def call():
                    fn[grid](q, k, v, do, lse2, delta, *outs, scale, N, H=H, D=D, BM=bm, BN=bn, CAUSAL=causal,
                             TMA=tma, WS=ws, LSE_TMA=lt, num_warps=w, num_stages=st)
                try:
                    call()
                    torch.cuda.synchronize()
                    errs = [float((a.float().permute(0, 2, 1, 3) - r).abs().max() / r.abs().max())
                            for a, r in zip(outs, ref[kern])]
                    t = best_seconds(torch, call, reps)
                    # TF/s in units of the kernel's share: dkdv 4 products, dq 3 (fwd = 2 products)
                    share = (4 if kern == "dkdv" else 3) / 2
                    print(f"{B}x{N}x{H}x{D} causal={causal!s:5s} {name:34s} {t * 1e3:7.3f} ms "
                          f"{flops_fwd * share / t / 1e12:6.1f} TF/s  relerr {' '.join(f'{e:.1e}' for e in errs)}",
                          flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{B}x{N}x{H}x{D} causal={causal} {name:34s} FAIL {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--d", type=int, default=128)
    a = ap.parse_args()
    if a.compile:
        compile_all(False)
        compile_all(True)
        sys.exit()
    if a.d == 64:
        run_gpu([(4, 4096, 32, 64), (1, 16384, 32, 64)], a.reps)
    else:
        run_gpu([(4, 4096, 16, 128), (1, 16384, 16, 128)], a.reps)
