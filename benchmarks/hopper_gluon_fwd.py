"""The Gluon forward (kernels/fwd_sm90.py, FlashAttention-3's overlap of the products with the softmax; NOTES
"Eighteenth session") launched by Triton from torch, outside JAX: its shipped rows and neighbours, timed against
cuDNN and against the Triton warp-specialised loop (`hopper_fwd_loop.py` case `ws`, non-causal) in one process,
checked against torch's attention. bf16, (batch, seq, heads, D), whole blocks. Needs a Hopper GPU and torch. From the
repository root:

    python benchmarks/hopper_gluon_fwd.py [D ...]
    python benchmarks/hopper_gluon_fwd.py --compile     # sm90 cross-compile on any machine: registers, spills, shared

The same comparison inside JAX, against the Triton rows as the library picks them: `python -m
benchmarks.hopper_rows_sweep OUT gluon` (h200_gluon_sweep.json). The first run of this script (a prototype of the
kernel, before it took scores.py and masking.py) measured D 128 1 x 16384 x 16 non-causal 3.534 ms against cuDNN's
3.704 and the ws loop's 3.909 (H200)."""
import sys
import types

import triton

from jax_flash_amd.kernels import configs, fwd_sm90

CASES = {"shipped": dict(), "s3": dict(STAGES=3), "s2": dict(STAGES=2), "r232": dict(CONSUMER_REGS=232),
         "bn64": dict(BLOCK_N=64, STAGES=3)}


def _row(D, **change):
    return {**next(r for r in configs.SM90_GLUON_FWD if r["head_dim"] == D), **change}


def _constexprs(H, D, causal, row):
    return {**dict(H=H, KV_H=H, HEAD_DIM=D, BANDED=int(causal), SOFTCAP=False, ALIBI=False, DROP_THRESHOLD=0,
                   KEYS_EVEN=True, GROUP_PROGRAMS=configs.TILED_GROUP_PROGRAMS),
            **{k: v for k, v in row.items() if k.isupper()}}


def cross_compile(D, H=16, causal=False, **change):
    """sm90 compile on any machine: registers, spill bytes, shared bytes, warps."""
    from triton.backends.compiler import GPUTarget

    from jax_flash_amd import _kernel_factory
    from jax_flash_amd.amd_report import _cuda_stats

    names = ["Q", "K", "V", "Slopes", "Seeds", "sm_scale", "softcap", "keep_scale", "seq_q", "seq_k", "lo_off",
             "hi_off", "Out", "Lse"]
    kinds = ["*bf16"] * 3 + ["*fp32", "*i32", "fp32", "fp32", "fp32", "i32", "i32", "i32", "i32", "*bf16", "*fp32"]
    const = _constexprs(H, D, causal, _row(D, **change))
    sig = {**dict(zip(names, kinds)), **dict.fromkeys(const, "constexpr")}
    out = triton.compile(_kernel_factory.source(fwd_sm90.attn_fwd_sm90, sig, const, {}),
                         target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    stats = types.SimpleNamespace()
    _cuda_stats(stats, out)
    return dict(regs=stats.vgprs, spills=stats.spill_bytes, shared=stats.local_mem, warps=out.metadata.num_warps)


def attention(q, k, v, causal=False, **change):
    """q, k, v: torch (batch, seq, heads, D) 16-bit on a Hopper GPU; (out, lse in base 2), launched by Triton."""
    import torch
    B, N, H, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    hi_off = 0 if causal else 2**30
    fwd_sm90.attn_fwd_sm90[(triton.cdiv(N, 128), B * H)](
        q, k, v, lse, lse, D ** -0.5, 0.0, 1.0, N, N, -2**30, hi_off, out, lse, num_warps=4,
        **_constexprs(H, D, causal, _row(D, **change)))
    return out, lse


def main(argv):
    if "--compile" in argv:
        for D in (64, 128):
            for causal in (False, True):
                for name, kw in CASES.items():
                    try:
                        st = cross_compile(D, causal=causal, **kw)
                        print(D, causal, name, st, flush=True)
                    except Exception as e:  # noqa: BLE001 -- a row that does not compile is a result
                        print(D, causal, name, "FAILED", type(e).__name__, str(e).splitlines()[:3], flush=True)
        return
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    dims = [int(a) for a in argv if a.isdigit()] or [128, 64]
    for D in dims:
        H = 16 if D == 128 else 32
        for B, N in ((16, 1024), (4, 4096), (1, 16384)):
            for causal in (False, True):
                torch.manual_seed(0)
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                heads_first = [t.transpose(1, 2) for t in (q, k, v)]
                ref = torch.nn.functional.scaled_dot_product_attention(*heads_first, is_causal=causal)
                ref = ref.transpose(1, 2)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    cud = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                        *heads_first, is_causal=causal), rep=300)
                line = f"D {D} {B}x{N}x{H} causal={causal} cudnn {cud:.3f}"
                if not causal:  # the Triton warp-specialised loop (hopper_fwd_loop.py "ws"), same tiles
                    from benchmarks import hopper_fwd_loop as loop
                    o = torch.empty_like(q)
                    ws = triton.testing.do_bench(lambda: loop.fwd[(N // 128, B * H)](
                        q, k, v, o, N, D ** -0.5, H, D, 128, 128, *loop.CASES["ws"][:4], num_warps=4, num_stages=2),
                        rep=300)
                    line += f" | ws {ws:.3f} ({cud / ws:.2f})"
                for name, kw in CASES.items():
                    try:
                        out, _ = attention(q, k, v, causal, **kw)
                        err = (out.float() - ref.float()).abs().max().item()
                        ms = triton.testing.do_bench(lambda: attention(q, k, v, causal, **kw), rep=300)
                        line += f" | {name} {ms:.3f} ({cud / ms:.2f}) err {err:.1e}"
                    except Exception as e:  # noqa: BLE001
                        line += f" | {name} FAILED {type(e).__name__}: {str(e).splitlines()[0][:80]}"
                print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
