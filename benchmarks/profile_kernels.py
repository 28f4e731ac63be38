"""One forward+backward of jax_flash_amd and of cuDNN, with no warm-up launches, to run under Nsight
Compute (every kernel it launches is a real one; compilation launches none):

    ncu --clock-control none --kernel-name regex:'attn_|cudnn|fmha|sdpa' --launch-count 12 \\
        --section SpeedOfLight --section WarpStateStats --section Occupancy \\
        python -m benchmarks.profile_kernels --n 4096 --d 128

--fp8: instead, one bf16 and one float8_e4m3fn forward of jax_flash_amd (results/h200_ncu_fp8_fwd.txt:
--n 4096 --causal, --kernel-name regex:attn_fwd --launch-count 2).
"""
import argparse

import jax
import jax.numpy as jnp

import jax_flash_amd


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_kernels", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=4096, help="sequence length (batch 16384 / n, 2048 / d heads)")
    ap.add_argument("--d", type=int, default=128, help="head dim")
    ap.add_argument("--causal", action="store_true", help="causal attention")
    ap.add_argument("--peers", default="cudnn", help="also run these (cudnn: jax.nn.dot_product_attention's)")
    ap.add_argument("--fp8", action="store_true",
                    help="instead, one bf16 and one float8_e4m3fn forward of jax_flash_amd")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    b, h = max(1, 16384 // args.n), 2048 // args.d
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, (b, args.n, h, args.d), jnp.bfloat16) for kk in keys)
    if args.fp8:
        (q8, qd), (k8, kd), (v8, vd) = (jax_flash_amd.quantize_fp8(x, jnp.float8_e4m3fn) for x in (q, k, v))
        for x in ((q, k, v), (q8, k8, v8, qd, kd, vd)):
            fn = jax.jit(lambda q, k, v, qd=None, kd=None, vd=None: jax_flash_amd.attention(
                q, k, v, causal=args.causal, q_descale=qd, k_descale=kd, v_descale=vd))
            jax.block_until_ready(fn.lower(*x).compile()(*x))
        print("bf16 and fp8 forward done", flush=True)
        return
    fns = {"jax_flash_amd": lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=args.causal)}
    if "cudnn" in args.peers:
        fns["cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=args.causal,
                                                                    implementation="cudnn")
    for name, fn in fns.items():
        step = jax.jit(lambda q, k, v, do: jax.vjp(fn, q, k, v)[1](do))
        compiled = step.lower(q, k, v, do).compile()
        jax.block_until_ready(compiled(q, k, v, do))
        print(name, "done", flush=True)


if __name__ == "__main__":
    main()
