"""Ring attention's cost where no ring is needed: `ring_attention` over a 1-device sequence axis against
plain `attention`, forward+backward, on the default GPU (the context-parallelism issue asks <= 1.05x).

    python -m benchmarks.ring            # B 1, H 16, D 128, bf16, N 16384, causal and not
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_flash_amd
from jax_flash_amd.timing import median_seconds


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ring", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=16384, help="sequence length")
    ap.add_argument("--heads", type=int, default=16, help="attention heads")
    ap.add_argument("--d", type=int, default=128, help="head dim")
    return ap


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    mesh = jax.make_mesh((1,), ("seq",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = P(None, "seq")
    ks = jax.random.split(jax.random.key(0), 4)
    shape = (1, args.n, args.heads, args.d)
    q, k, v, ct = (jax.random.normal(kk, shape, jnp.bfloat16) for kk in ks)
    print(f"{jax.devices()[0].device_kind}, (1, {args.n}, {args.heads}, {args.d}) bf16, forward+backward")
    print("| causal | attention ms | ring (1 device) ms | ratio |\n|---|---|---|---|")
    for causal in (False, True):
        def plain(q, k, v):
            return jax_flash_amd.attention(q, k, v, causal=causal)

        def ring(q, k, v):
            return jax.shard_map(lambda q, k, v: jax_flash_amd.ring_attention(q, k, v, axis_name="seq", causal=causal),
                                 mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)(q, k, v)

        times = []
        for f in (plain, ring):
            grad = jax.jit(jax.grad(lambda q, k, v, f=f: jnp.vdot(f(q, k, v).astype(jnp.float32), ct.astype(jnp.float32)),
                                    argnums=(0, 1, 2)))
            times.append(median_seconds(grad, q, k, v, reps=7, budget_s=2.0))
        a, b = (jax.jit(f)(q, k, v) for f in (plain, ring))
        assert np.array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32))), "ring != attention"
        print(f"| {causal} | {times[0] * 1e3:.3f} | {times[1] * 1e3:.3f} | {times[1] / times[0]:.3f} |")


if __name__ == "__main__":
    main()
