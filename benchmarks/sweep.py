"""Time the Triton kernels under candidate configs on the current GPU (to choose kernels/configs.py rows).

    python -m benchmarks.sweep [--d 64,128] [--n 4096] [--out sweep.json]

For each head_dim, causal and each candidate (fwd, dkdv, dq) config it prints forward and backward
TFLOP/s (FlashAttention convention: forward 4*B*H*N*N*D, halved when causal; backward 2.5x).
"""
import argparse
import copy
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash_amd
from jax_flash_amd import _triton
from jax_flash_amd.kernels import configs

FWD = [(128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
DKDV = [(32, 128, 4, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3),
        (32, 128, 8, 2), (64, 64, 8, 2), (128, 128, 8, 2)]
DQ = [(128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 8, 3), (128, 64, 4, 2),
      (64, 128, 8, 2), (128, 128, 8, 2), (64, 64, 4, 4)]


def bench(f, *args, reps=7):
    jax.block_until_ready(f(*args))
    jax.block_until_ready(f(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    n = max(1, min(50, int(0.05 / max(time.perf_counter() - t0, 1e-6))))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            out = f(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / n)
    return float(np.median(samples)) * 1e3


def set_row(kernel, d, row):
    m, n, w, s = row
    rows = configs.TARGETS[_triton.target()][kernel]
    for r in rows:
        if r["max_block_d"] >= d:
            r.update(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
            return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="128,64")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    saved = copy.deepcopy(configs.TARGETS)
    results = []
    for d in map(int, args.d.split(",")):
        n = args.n
        b, h = max(1, 16384 // n), 2048 // d
        ks = jax.random.split(jax.random.key(0), 4)
        q, k, v, do = (jax.random.normal(kk, (b, n, h, d), jnp.bfloat16) for kk in ks)
        for causal in (False, True):
            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            fwd = lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=causal)
            base_fwd_ms = bench(jax.jit(fwd), q, k, v)
            for kernel, cands in (("fwd", FWD), ("dkdv", DKDV), ("dq", DQ)):
                for row in cands:
                    configs.TARGETS.clear()
                    configs.TARGETS.update(copy.deepcopy(saved))
                    set_row(kernel, d, row)
                    try:
                        if kernel == "fwd":
                            ms = bench(jax.jit(fwd), q, k, v)
                            tf = flops / ms / 1e9
                        else:
                            fwd_bwd = jax.jit(lambda q, k, v, do: jax.vjp(fwd, q, k, v)[1](do))
                            ms = bench(fwd_bwd, q, k, v, do) - base_fwd_ms
                            tf = 2.5 * flops / ms / 1e9
                        r = dict(d=d, n=n, causal=causal, kernel=kernel, config=row, ms=round(ms, 4), tflops=round(tf, 1))
                    except Exception as e:  # noqa: BLE001 - a config may not fit; record and go on
                        r = dict(d=d, n=n, causal=causal, kernel=kernel, config=row, error=repr(e)[:200])
                    results.append(r)
                    print(json.dumps(r), flush=True)
    configs.TARGETS.clear()
    configs.TARGETS.update(saved)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
