"""Multi-GPU: data-parallel GPT training on 1 and on N GPUs, and heads-sharded attention without
collectives. Run on a host with N >= 2 GPUs:

    python -m benchmarks.scaling [--devices 2]     # writes benchmarks/results/<gpu>_scaling.{json,md}

- Training (examples/train_gpt.py, the GPT of benchmarks/gpt.py, flash attention, seq-len 2048): the same
  per-GPU batch on 1 and on N GPUs (tokens/s scaling, target >= 1.8x on 2), and the same global batch on
  1 and on N GPUs (the losses must agree).
- Attention alone with q, k, v sharded over heads on N GPUs: the compiled forward+backward has no
  collective, and its time against one GPU doing all the heads.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flash_amd
from benchmarks.attention import gpu_slug, save
from benchmarks.gpt import run
from jax_flash_amd.timing import median_seconds

COLLECTIVES = r"all-gather|all-to-all|collective-permute|all-reduce|reduce-scatter"
SEQ, PER_GPU_BATCH = 2048, 4


def heads_sharded(devices: int, b: int = 4, n: int = 4096, heads_per_device: int = 16, d: int = 128) -> dict:
    h = heads_per_device * devices
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, (b, n, h, d), jnp.bfloat16) for kk in keys)

    def fwd_bwd(q, k, v, do):
        out, vjp = jax.vjp(lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=True), q, k, v)
        return out, vjp(do)

    mesh = Mesh(jax.devices()[:devices], ("model",))
    sharded = [jax.device_put(x, NamedSharding(mesh, P(None, None, "model", None))) for x in (q, k, v, do)]
    f = jax.jit(fwd_bwd)
    hlo = f.lower(*sharded).compile().as_text()
    one = [jax.device_put(x, jax.devices()[0]) for x in (q, k, v, do)]
    return dict(shape=[b, n, h, d], devices=devices, collectives=sorted(set(re.findall(COLLECTIVES, hlo))),
                sharded_ms=round(median_seconds(f, *sharded) * 1e3, 3),
                one_gpu_ms=round(median_seconds(f, *one) * 1e3, 3))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--devices", type=int, default=2, help="GPUs of the data-parallel run and of the heads sharding")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        ap.error(f"needs {n} devices; this host has {jax.device_count()}")
    one = run("flash", SEQ, PER_GPU_BATCH, args.steps)
    many = run("flash", SEQ, n * PER_GPU_BATCH, args.steps, extra=("--devices", str(n)))
    same_batch_one = run("flash", SEQ, n * PER_GPU_BATCH, args.steps)
    result = dict(one_gpu=one, n_gpus=many, one_gpu_same_global_batch=same_batch_one, attention=heads_sharded(n))
    lines = [f"# Data-parallel GPT training and heads-sharded attention on {n} x {jax.devices()[0].device_kind}", ""]
    if all("error" not in r for r in (one, many, same_batch_one)):
        scaling = many["tokens_per_s"] / one["tokens_per_s"]
        gap = max(abs(a - b) for a, b in zip(many["losses"], same_batch_one["losses"]))
        result.update(scaling=round(scaling, 3), loss_gap_same_global_batch=round(gap, 5))
        lines += [f"- tokens/s: 1 GPU (batch {PER_GPU_BATCH}) {one['tokens_per_s']:,}; {n} GPUs (batch "
                  f"{n * PER_GPU_BATCH}) {many['tokens_per_s']:,}: {scaling:.2f}x (target >= 1.8x on 2)",
                  f"- same global batch on 1 and {n} GPUs: largest per-step loss difference {gap:.2g}"]
    else:
        lines.append(f"- a training run failed: {[r.get('error') for r in (one, many, same_batch_one)]}")
    att = result["attention"]
    lines.append(f"- attention {att['shape']} (B, N, H, D), heads over {n} GPUs: collectives "
                 f"{att['collectives'] or 'none'}; {att['sharded_ms']} ms vs {att['one_gpu_ms']} ms on one GPU")
    for r in (one, many, same_batch_one):
        r.pop("losses", None)
    save(os.path.join(os.path.dirname(__file__), "results", f"{gpu_slug()}_scaling"), result, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
