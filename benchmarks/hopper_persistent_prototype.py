"""Prototype of a persistent Hopper forward (benchmarks/results/NOTES.md, "Hopper", the profile of the
slowest shape): at D 128, N 1024 ours runs 2048 programs of 1-8 key blocks, each paying descriptor
creation, Q's load, the pipeline's fill and the epilogue, where cuDNN runs one program per SM. This is the
bare forward (MHA, whole blocks, causal or not, TMA + warp specialisation like kernels/fwd.py's sm90 row)
as one program per tile ("tiled", the shape of ours) against one program per SM looping over tiles
("persistent": descriptors made once per program; the tile loop or the key loop warp-specialised).
H200 results and the kernel it led to (kernels/fwd.py PERSISTENT): benchmarks/results/NOTES.md, "Hopper".
Needs Triton 3.6+; on the GPU torch (Triton's own launcher). From the repository root:
    python benchmarks/hopper_persistent_prototype.py             # H100/H200: error against float32, ms, TF/s
    python benchmarks/hopper_persistent_prototype.py --compile   # CPU: sm90 cross-compile, warps, shared memory
    TRITON_INTERPRET=1 python benchmarks/hopper_persistent_prototype.py --interpret   # CPU: numerics
"""
import argparse
import math

import triton
import triton.language as tl
from hopper_bwd_prototype import best_seconds, compile_sm90  # beside this script (run as a script, see above)

LOG2E = 1.4426950408889634


@triton.jit
def fwd_k(Q, K, V, O, LSE, sm_scale, B, seq, n_tiles, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
          BN: tl.constexpr, CAUSAL: tl.constexpr, PERSISTENT: tl.constexpr, WS_TILES: tl.constexpr,
          WS_KEYS: tl.constexpr):
    STRIDE: tl.constexpr = H * D
    n_m = seq // BM
    # whole blocks only (seq a multiple of BM and BN): no tile crosses a batch element, so one descriptor
    # over the whole tensor serves every tile of the program
    qd = tl.make_tensor_descriptor(Q, shape=[B * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BM, D])
    kd = tl.make_tensor_descriptor(K, shape=[B * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BN, D])
    vd = tl.make_tensor_descriptor(V, shape=[B * seq, STRIDE], strides=[STRIDE, 1], block_shape=[BN, D])
    scale2 = sm_scale * 1.4426950408889634
    step = n_tiles
    if PERSISTENT:
        step = tl.num_programs(0)
    offs_d = tl.arange(0, D)
    for tile in tl.range(tl.program_id(0), n_tiles, step, warp_specialize=WS_TILES):
        bh = tile // n_m
        start_m = (n_m - 1 - tile % n_m) * BM  # a head's heaviest (causal: last) query block first
        b = bh // H
        h = bh % H
        row0 = b * seq
        offs_m = start_m + tl.arange(0, BM)
        q = qd.load([row0 + start_m, h * D])
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        hi = seq
        if CAUSAL:
            hi = start_m + BM
        for start_n in tl.range(0, hi, BN, warp_specialize=WS_KEYS):
            k = kd.load([row0 + start_n, h * D])
            qk = tl.dot(q, tl.trans(k))
            if CAUSAL:  # every block masked, as in kernels/fwd.py's TMA loop (key 0 is always visible)
                qk = tl.where(offs_m[:, None] >= start_n + tl.arange(0, BN)[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * scale2)
            p = tl.math.exp2(qk * scale2 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = vd.load([row0 + start_n, h * D])
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        out = acc / l_i[:, None]
        rows = (row0 + offs_m).to(tl.int64) * STRIDE + h * D
        tl.store(O + rows[:, None] + offs_d[None, :], out.to(O.dtype.element_ty))
        tl.store(LSE + bh.to(tl.int64) * seq + offs_m, m_i + tl.math.log2(l_i))


# (name, BM, BN, warps, stages, persistent, WS over tiles, WS over keys)
VARIANTS = [
    ("tiled, WS keys 128x128 w4 s2", 128, 128, 4, 2, False, False, True),
    ("persistent, WS keys 128x128 w4 s2", 128, 128, 4, 2, True, False, True),
    ("persistent, WS tiles 128x128 w4 s2", 128, 128, 4, 2, True, True, False),
    ("persistent, no WS 128x128 w8 s2", 128, 128, 8, 2, True, False, False),
]


def compile_all(causal, d=128):
    for name, bm, bn, w, s, persistent, ws_tiles, ws_keys in VARIANTS:
        sig = {n: "*bf16" for n in ("Q", "K", "V", "O")}
        sig.update(LSE="*fp32", sm_scale="fp32", B="i32", seq="i32", n_tiles="i32")
        const = dict(H=16, D=d, BM=bm, BN=bn, CAUSAL=causal, PERSISTENT=persistent, WS_TILES=ws_tiles,
                     WS_KEYS=ws_keys)
        sig.update({c: "constexpr" for c in const})
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
        compile_sm90(f"{name:36s} causal={causal!s:5s}", fwd_k, sig, const, attrs, w, s)


def _reference(torch, q, k, v, causal):
    """float32 output and natural-log lse, (B, N, H, D) / (B, H, N)."""
    qf, kf, vf = (t.float().permute(0, 2, 1, 3) for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, device=q.device, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ vf).permute(0, 2, 1, 3), torch.logsumexp(s, -1)


def run(shapes, reps, device, variants):
    import torch
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 2
    dtype = torch.bfloat16 if device == "cuda" else torch.float16  # the interpreter's bf16 dot is wrong (<= 3.9)
    for (B, N, H, D) in shapes:
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, N, H, D, device=device, dtype=dtype) for _ in range(3))
            ref, ref_lse = _reference(torch, q, k, v, causal)
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            for name, bm, bn, w, st, persistent, ws_tiles, ws_keys in variants:
                n_tiles = B * H * (N // bm)
                out = torch.empty_like(q)
                lse = torch.empty(B, H, N, device=device, dtype=torch.float32)
                grid = (min(sms, n_tiles) if persistent else n_tiles,)

                def call():
                    fwd_k[grid](q, k, v, out, lse, 1 / math.sqrt(D), B, N, n_tiles, H=H, D=D, BM=bm, BN=bn,
                                CAUSAL=causal, PERSISTENT=persistent, WS_TILES=ws_tiles, WS_KEYS=ws_keys,
                                num_warps=w, num_stages=st)
                try:
                    call()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    err = float((out.float() - ref).abs().max() / ref.abs().max())
                    lse_err = float((lse / LOG2E - ref_lse).abs().max())
                    if device != "cuda":
                        print(f"{B}x{N}x{H}x{D} causal={causal!s:5s} {name:36s} relerr {err:.1e} lse {lse_err:.1e}",
                              flush=True)
                        continue
                    t = best_seconds(torch, call, reps)
                    print(f"{B}x{N}x{H}x{D} causal={causal!s:5s} {name:36s} {t * 1e3:7.3f} ms "
                          f"{flops / t / 1e12:6.1f} TF/s  relerr {err:.1e} lse {lse_err:.1e}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{B}x{N}x{H}x{D} causal={causal} {name:36s} FAIL {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--interpret", action="store_true", help="small shapes in Triton's interpreter (CPU)")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    if a.compile:
        compile_all(False)
        compile_all(True)
    elif a.interpret:
        run([(2, 128, 2, 16)], 1, "cpu",
            [(n, 32, 16, 4, 1, p, False, False) for n, p in (("tiled", False), ("persistent", True))])
    else:
        run([(16, 1024, 16, 128), (4, 4096, 16, 128), (1, 16384, 16, 128)], a.reps, "cuda", VARIANTS)
