"""Train a small byte-level GPT (Flax linen + optax, one jax.jit step) on the Python standard library's
own source files, with jax_flash_amd's FlashSelfAttention or Flax's XLA attention.

    python examples/train_gpt.py                          # CPU-sized defaults
    python examples/train_gpt.py --compare                # flash and xla from the same seed, one plot
    python examples/train_gpt.py --compare --implementation interpret --steps 30 --seq-len 64 --batch 4 \\
        --d-model 64                                      # CPU: the Triton kernels themselves, in Triton's interpreter
    python examples/train_gpt.py --attention xla --seq-len 4096 --batch 4 --layers 12 --d-model 768 \\
        --heads 12 --dtype bfloat16 --steps 50            # ~89M parameters on a GPU
    python examples/train_gpt.py --devices 2 --batch 16 ...   # data parallel over 2 GPUs

--attention flash uses jax_flash_amd.FlashSelfAttention with --implementation: by default the compiled
Triton kernels on a GPU and, on a CPU, jax_flash_amd's pure-JAX `xla` implementation (no Triton kernel
runs then: --compare on a CPU compares that pure-JAX attention with Flax's). --implementation interpret
runs the Triton kernels in Triton's interpreter on the CPU (needs torch): a real check of the kernels
inside training, but slow, so give it a tiny model. --attention xla uses
flax.linen.MultiHeadDotProductAttention with a causal mask: the same parameter tree, so both start from
identical weights for a seed. Prints loss, tokens/s, step time and peak device memory; saves the loss
curve as a PNG (matplotlib: `pip install -e ".[examples]"`) and, with --json, a summary line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# jax_flash_amd (which imports triton) is imported in Block, after main() has set TRITON_INTERPRET=1 for
# --implementation interpret: Triton reads it once, when it is first imported


def load_text(limit_bytes: int = 24 << 20) -> np.ndarray:
    """Bytes of the standard library's .py files (sorted, so every machine reads the same text)."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, size = [], 0
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        if "site-packages" in dirpath:
            continue
        for name in sorted(filenames):
            if name.endswith(".py") and size < limit_bytes:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    data = fh.read()
                chunks.append(data)
                size += len(data)
    return np.frombuffer(b"\n".join(chunks)[:limit_bytes], np.uint8)


class Block(nn.Module):
    heads: int
    attention: str
    dropout: float
    dtype: jnp.dtype
    implementation: str | None = None  # of flash attention: jax_flash_amd.attention's

    @nn.compact
    def __call__(self, x, deterministic: bool):
        h = nn.LayerNorm(dtype=self.dtype)(x)
        if self.attention == "flash":
            from jax_flash_amd import FlashSelfAttention

            h = FlashSelfAttention(num_heads=self.heads, dtype=self.dtype, dropout_rate=self.dropout, causal=True,
                                   implementation=self.implementation, name="attn")(h, deterministic=deterministic)
        else:
            h = nn.MultiHeadDotProductAttention(num_heads=self.heads, dtype=self.dtype, dropout_rate=self.dropout,
                                                broadcast_dropout=False, name="attn")(
                h, mask=nn.make_causal_mask(h[..., 0]), deterministic=deterministic)
        x = x + h
        h = nn.Dense(4 * x.shape[-1], dtype=self.dtype)(nn.LayerNorm(dtype=self.dtype)(x))
        return x + nn.Dense(x.shape[-1], dtype=self.dtype)(nn.gelu(h))


class GPT(nn.Module):
    layers: int
    d_model: int
    heads: int
    max_len: int
    attention: str = "flash"
    dropout: float = 0.0
    dtype: jnp.dtype = jnp.float32
    implementation: str | None = None

    @nn.compact
    def __call__(self, tokens, deterministic: bool = True):
        x = nn.Embed(256, self.d_model, dtype=self.dtype)(tokens)
        x = x + nn.Embed(self.max_len, self.d_model, dtype=self.dtype)(jnp.arange(tokens.shape[1]))
        for i in range(self.layers):
            x = Block(self.heads, self.attention, self.dropout, self.dtype, self.implementation,
                      name=f"block{i}")(x, deterministic)
        return nn.Dense(256, dtype=jnp.float32)(nn.LayerNorm(dtype=self.dtype)(x))


def batches(data: np.ndarray, batch: int, seq_len: int, seed: int):
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - seq_len - 1, batch)
        window = np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int32)
        yield window[:, :-1], window[:, 1:]


def peak_memory_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def flash_implementation(requested: str) -> str:
    """What --attention flash runs: --implementation, with auto resolved as attention(implementation=None)
    would resolve it without TRITON_INTERPRET (triton on a GPU, else xla)."""
    if requested != "auto":
        return requested
    return "triton" if jax.default_backend() != "cpu" else "xla"


DESCRIBE = {"triton": "the compiled Triton kernels",
            "xla": "jax_flash_amd's pure-JAX implementation, no Triton kernel",
            "interpret": "the Triton kernels in Triton's interpreter, on the CPU"}


def train(args, attention: str) -> dict:
    dtype = jnp.dtype(args.dtype)
    impl = flash_implementation(args.implementation)
    model = GPT(args.layers, args.d_model, args.heads, args.seq_len, attention, args.dropout, dtype, impl)
    data = load_text()
    split = int(len(data) * 0.95)
    train_data, val_data = data[:split], data[split:]
    tokens = jnp.zeros((args.batch, args.seq_len), jnp.int32)
    params = model.init(jax.random.key(args.seed), tokens)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    # data parallel over --devices: batch rows split over a 1-D mesh, parameters and optimizer state
    # replicated; XLA partitions the step (the attention kernels run on each device's rows, no gather)
    if args.batch % args.devices:
        raise SystemExit(f"--batch {args.batch} must be a multiple of --devices {args.devices}")
    mesh = Mesh(np.array(jax.devices()[:args.devices]), ("data",))
    rows = NamedSharding(mesh, P("data"))
    params = jax.device_put(params, NamedSharding(mesh, P()))
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(optax.warmup_cosine_decay_schedule(0.0, args.lr, min(100, args.steps // 10 + 1),
                                                                      max(args.steps, 2)), weight_decay=0.1))
    state = opt.init(params)

    def loss_fn(params, x, y, rng, deterministic):
        logits = model.apply(params, x, deterministic=deterministic, rngs={"dropout": rng})
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(params, state, x, y, rng):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, rng, args.dropout == 0)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    evaluate = jax.jit(lambda params, x, y: loss_fn(params, x, y, jax.random.key(0), True))
    what = (f"jax_flash_amd.FlashSelfAttention, implementation={impl!r}: {DESCRIBE[impl]}" if attention == "flash"
            else "flax.linen.MultiHeadDotProductAttention + causal mask")
    print(f"{attention} attention ({what}):\n  "
          f"{n_params:,} parameters, seq_len {args.seq_len}, batch {args.batch}, {args.dtype}, "
          f"{args.devices} x {jax.devices()[0].device_kind}", flush=True)

    stream = batches(train_data, args.batch, args.seq_len, args.seed)
    losses, times = [], []
    t_compile = time.perf_counter()
    for i in range(args.steps):
        x, y = (jax.device_put(a, rows) for a in next(stream))
        t0 = time.perf_counter()
        params, state, loss = step(params, state, x, y, jax.random.key(args.seed * 100003 + i))
        loss = float(loss)  # waits for the step
        times.append(time.perf_counter() - t0)
        if i == 0:
            t_compile = time.perf_counter() - t_compile
        losses.append(loss)
        _progress(i + 1, args.steps, loss, times)
    timed = times[min(2, len(times) - 1):]  # past compilation and warm-up
    step_s = float(np.median(timed))
    val_x, val_y = next(batches(val_data, args.batch, args.seq_len, 1))
    result = dict(attention=attention, implementation=impl if attention == "flash" else "xla",
                  params_m=round(n_params / 1e6, 1), seq_len=args.seq_len, batch=args.batch, dtype=args.dtype,
                  steps=args.steps, final_loss=round(losses[-1], 4), val_loss=round(float(evaluate(params, val_x,
                                                                                                   val_y)), 4),
                  step_ms=round(step_s * 1e3, 2), tokens_per_s=round(args.batch * args.seq_len / step_s),
                  compile_s=round(t_compile, 1), peak_memory_gb=_gb(peak_memory_bytes()), devices=args.devices,
                  device=jax.devices()[0].device_kind, losses=[round(x, 4) for x in losses])
    print(f"\n{attention}: loss {losses[0]:.3f} -> {losses[-1]:.3f} (val {result['val_loss']:.3f}), "
          f"{result['tokens_per_s']:,} tokens/s, step {result['step_ms']} ms, "
          f"peak device memory {'n/a' if result['peak_memory_gb'] is None else str(result['peak_memory_gb']) + ' GB'}, "
          f"first step (compile) {result['compile_s']} s"
          + (" (the interpreter's speed, not a GPU's)" if impl == "interpret" and attention == "flash" else ""),
          flush=True)
    return result


def _gb(n):
    return None if n is None else round(n / 2**30, 2)


def _progress(done: int, total: int, loss: float, times: list) -> None:
    if done % max(1, total // 50) and done != total:  # about 50 updates per run
        return
    bar = "#" * int(30 * done / total)
    rate = f"{1 / np.median(times[-10:]):5.1f} it/s" if done > 2 else "compiling"
    sys.stderr.write(f"\r[{bar:<30}] {done}/{total} loss {loss:6.3f} {rate}")
    sys.stderr.flush()


def plot(results: list[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no loss-curve PNG", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in results:
        name = f"flash, {r['implementation']}" if r["attention"] == "flash" else "xla (flax)"
        ax.plot(r["losses"], label=f"{name} ({r['tokens_per_s']:,} tok/s)", alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title(f"byte-level GPT {results[0]['params_m']}M, seq {results[0]['seq_len']}, {results[0]['device']}",
                 fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"loss curve: {path}")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    ap.add_argument("--attention", choices=("flash", "xla"), default="flash",
                    help="flash: jax_flash_amd.FlashSelfAttention (see --implementation); "
                         "xla: flax.linen.MultiHeadDotProductAttention with a causal mask")
    ap.add_argument("--implementation", choices=("auto", "triton", "interpret", "xla"), default="auto",
                    help="what --attention flash runs. auto: triton (the compiled kernels) on a GPU, xla "
                         "(jax_flash_amd's pure-JAX attention) on a CPU. interpret: the Triton kernels in "
                         "Triton's interpreter (CPU, needs torch; slow: ~0.5 s per step for the tiny model of the "
                         "third example above, ~10 s at --d-model 64 --layers 2 --batch 4 --seq-len 64)")
    ap.add_argument("--compare", action="store_true",
                    help="train with both attentions (flash, then xla) from the same seed and data; "
                         "one loss plot, and the largest per-step loss difference")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens (bytes) per sequence")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (global, over all --devices)")
    ap.add_argument("--steps", type=int, default=150, help="training steps")
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks")
    ap.add_argument("--d-model", type=int, default=128, help="model width")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (head dim = d-model / heads)")
    ap.add_argument("--dropout", type=float, default=0.0, help="attention-probability dropout rate")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="compute dtype of the model (parameters stay float32)")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW, warmup + cosine decay)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights, the data order and dropout")
    ap.add_argument("--devices", type=int, default=1, help="data-parallel over this many devices (batch split)")
    ap.add_argument("--out-dir", default="runs", help="where the loss-curve PNG goes")
    ap.add_argument("--json", help="append the summary (one JSON line per run) to this file")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.implementation == "interpret":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--implementation interpret: triton was imported before TRITON_INTERPRET=1 could be "
                             "set; run as `TRITON_INTERPRET=1 python examples/train_gpt.py ...`")
        os.environ["TRITON_INTERPRET"] = "1"
    elif args.implementation == "triton" and jax.default_backend() == "cpu":
        raise SystemExit("--implementation triton needs a GPU; on a CPU use xla or interpret")

    results = [train(args, a) for a in (("flash", "xla") if args.compare else (args.attention,))]
    if args.compare:
        gap = max(abs(a - b) for a, b in zip(results[0]["losses"], results[1]["losses"]))
        print(f"largest per-step loss difference flash ({results[0]['implementation']}) vs xla: {gap:.4f}")
        if results[0]["implementation"] == "xla":
            print("(on this CPU both runs were pure JAX: --implementation interpret runs the Triton kernels)")
    os.makedirs(args.out_dir, exist_ok=True)
    plot(results, os.path.join(args.out_dir, f"train_gpt_{'compare' if args.compare else args.attention}.png"))
    if args.json:
        with open(args.json, "a") as fh:
            for r in results:
                fh.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
