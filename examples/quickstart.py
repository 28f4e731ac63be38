"""The main job: run jax_flash_amd.attention forward and backward, check it, and time it.

    python examples/quickstart.py            # GPU if there is one, else the CPU
    python examples/quickstart.py --seq 8192 --causal

On a GPU it runs the compiled Triton kernels (bf16, 16 heads of 128) and prints TFLOP/s next to
jax.nn.dot_product_attention (XLA, and cuDNN where available). Without a GPU it runs the same Triton
kernels in Triton's interpreter on a small problem and checks them against the pure-JAX reference.
"""
import argparse
import os

import jax

ON_GPU = jax.default_backend() != "cpu"
if not ON_GPU:  # Triton enables its interpreter only if this is set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_flash_amd  # noqa: E402
from jax_flash_amd.timing import median_seconds  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4 if ON_GPU else 1)
    ap.add_argument("--seq", type=int, default=4096 if ON_GPU else 200)
    ap.add_argument("--heads", type=int, default=16 if ON_GPU else 2)
    ap.add_argument("--head-dim", type=int, default=128 if ON_GPU else 64)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    b, n, h, d = args.batch, args.seq, args.heads, args.head_dim
    dtype = jnp.bfloat16 if ON_GPU else jnp.float16
    impl = "triton" if ON_GPU else "interpret"
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; implementation={impl!r}; "
          f"q, k, v: ({b}, {n}, {h}, {d}) {jnp.dtype(dtype).name}, causal={args.causal}")

    kq, kk, kv, kd = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(x, (b, n, h, d), dtype) for x in (kq, kk, kv, kd))

    def loss(attn):
        return lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

    peers = {"jax_flash_amd": lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=args.causal,
                                                                       implementation=impl),
             "reference (xla)": lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=args.causal,
                                                                         implementation="xla")}
    if ON_GPU:
        peers["jax.nn xla"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=args.causal,
                                                                           implementation="xla")
        peers["jax.nn cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=args.causal,
                                                                             implementation="cudnn")

    results = {}
    fwd_flops = 4 * b * h * n * n * d / (2 if args.causal else 1)
    print(f"{'':18s} {'fwd ms':>9s} {'fwd TF/s':>9s} {'fwd+bwd ms':>11s} {'f+b TF/s':>9s}")
    for name, attn in peers.items():
        try:
            fwd = jax.jit(attn)
            grad = jax.jit(jax.grad(loss(attn), argnums=(0, 1, 2)))
            results[name] = (fwd(q, k, v), *grad(q, k, v))
            t_f, t_fb = median_seconds(fwd, q, k, v, reps=10), median_seconds(grad, q, k, v, reps=10)
        except Exception as e:  # noqa: BLE001 - a peer may be unavailable here (e.g. cuDNN on ROCm)
            print(f"{name:18s} unavailable: {str(e).splitlines()[0][:80]}")
            continue
        print(f"{name:18s} {t_f * 1e3:9.3f} {fwd_flops / t_f / 1e12:9.1f} {t_fb * 1e3:11.3f} "
              f"{3.5 * fwd_flops / t_fb / 1e12:9.1f}")
    # relative to each tensor's largest reference value: rounding in bf16/fp16 is ~1e-2 at most
    errs = [float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32))) / jnp.max(jnp.abs(r.astype(jnp.float32))))
            for a, r in zip(results["jax_flash_amd"], results["reference (xla)"])]
    print("jax_flash_amd vs reference, max |diff| / max |ref| of out, dq, dk, dv:", " ".join(f"{e:.2g}" for e in errs))
    ok = all(np.isfinite(errs)) and max(errs) < 2e-2
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
