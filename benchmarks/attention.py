"""Attention benchmark: jax_flash_amd against its peers, side by side, in one process and one run.

    python -m benchmarks.attention                      # the full suite: every shape below, every peer
    python -m benchmarks.attention --d 128 --n 4096 --causal yes --impls jax_flash_amd,cudnn
    python -m benchmarks.attention --llama only        # the llama3.1 shapes (B 1, 64 / 8 heads, D 128, N 2k-32k)
    python -m benchmarks.attention --plot-only benchmarks/results/h200_attention.json   # redraw table and plot

Implementations (the peers): jax_flash_amd (implementation="triton"); xla and cudnn, JAX's own
jax.nn.dot_product_attention with implementation="xla" / "cudnn"; pallas_triton, JAX's Pallas GPU
attention (jax.experimental.pallas.ops.gpu.attention.mha). Those that cannot run here are skipped.
The ratio table judges ours against the TARGETS below (bf16, N >= 1024, D 64 / 128).
Shapes: 16k tokens per batch (B = 16384 / N), hidden 2048 (H = 2048 / D); the long-context case (B 1, N 131072,
H 16, D 128, causal); and the llama3.1 shapes cuDNN's own benchmark publishes (B 1, 64 query / 8 key-value heads,
D 128, N 2048-32768, causal and not). FLOPs (FlashAttention convention): forward 4*B*H*N*N*D, halved
when causal; backward 2.5x forward. Times are medians after warm-up; backward = (forward+backward) -
forward. temp_mb: XLA's temp buffer of the jitted forward+backward (compile().memory_analysis()).
max_err: max |out - float32 reference| of the forward. compile_s: first forward+backward call (trace,
compile, Triton compile unless cached). Rows go to benchmarks/results/<gpu>_attention.json as they finish (a
run cut short keeps what it measured), headed by the GPU and the versions (jax, triton, cuDNN); the markdown table
(.md) and plot (.png, needs matplotlib) are written next to it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

import jax
import jax.numpy as jnp

from jax_flash_amd.timing import median_seconds

TOKENS, HIDDEN = 16384, 2048
IMPLS = ("jax_flash_amd", "xla", "cudnn", "pallas_triton")
# timed only when --impls names them: our backward in linear memory (plan.Policy(linear_backward=True)), its dQ
# summed in key-block order, or by atomics (deterministic=False)
OPTIONAL = ("jax_flash_amd_linear", "jax_flash_amd_atomics")
KEYS = ("impl", "B", "N", "H", "H_kv", "D", "causal", "dtype")
LLAMA_NS = (2048, 4096, 8192, 16384, 32768)


def _linear(deterministic: bool):
    import jax_flash_amd
    from jax_flash_amd import plan

    def attention(q, k, v, causal):
        with plan.using(plan.Policy(linear_backward=True)):  # the call's options carry it to its backward
            return jax_flash_amd.attention(q, k, v, causal=causal, implementation="triton",
                                           deterministic=deterministic)

    return attention


def peers() -> dict:
    """name -> f(q, k, v, causal) for each implementation importable here (keys of IMPLS and OPTIONAL)."""
    import jax_flash_amd

    fns = {
        "jax_flash_amd": lambda q, k, v, causal: jax_flash_amd.attention(q, k, v, causal=causal,
                                                                         implementation="triton"),
        "jax_flash_amd_linear": _linear(True),
        "jax_flash_amd_atomics": _linear(False),
        "xla": lambda q, k, v, causal: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla"),
        "cudnn": lambda q, k, v, causal: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                      implementation="cudnn"),
    }
    try:
        from jax.experimental.pallas.ops.gpu import attention as pallas_attention

        fns["pallas_triton"] = lambda q, k, v, causal: pallas_attention.mha(
            q, k, v, None, sm_scale=1.0 / math.sqrt(q.shape[-1]), causal=causal)
    except Exception as e:  # noqa: BLE001  (an optional peer)
        print(f"pallas_triton unavailable: {e!r}", file=sys.stderr)
    return fns


def shapes(ns, ds, causals, dtypes, long_context: bool, llama: bool = False) -> list[dict]:
    out = [dict(B=max(1, TOKENS // n), N=n, H=HIDDEN // d, H_kv=HIDDEN // d, D=d, causal=c, dtype=t)
           for t in dtypes for d in ds for c in causals for n in ns]
    if long_context:
        out.append(dict(B=1, N=131072, H=16, H_kv=16, D=128, causal=True, dtype="bfloat16"))
    if llama:
        out += [dict(B=1, N=n, H=64, H_kv=8, D=128, causal=c, dtype="bfloat16") for c in (False, True)
                for n in LLAMA_NS]
    return out


def cudnn_version() -> str | None:
    """The cuDNN jaxlib runs (major.minor.patch), or None off CUDA."""
    try:
        from jax._src.lib import cuda_versions

        v = cuda_versions.cudnn_get_version()
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v // 100 % 10}.{v % 100}"
    except Exception:  # noqa: BLE001  (not a CUDA jaxlib)
        return None


def fwd_flops(s: dict) -> float:
    return 4.0 * s["B"] * s["H"] * s["N"] * s["N"] * s["D"] / (2 if s["causal"] else 1)


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def measure(name: str, fn, s: dict, inputs, ref, extra=()) -> dict:
    """Times fn(q, k, v, causal, *extra) forward and forward+backward (the gradients of q, k, v); extra: arrays
    passed as arguments (a bias, a mask), not closed over (a jit would embed them as constants)."""
    q, k, v, do = inputs
    row = {"impl": name, **s}
    fl = fwd_flops(s)

    def fwd(q, k, v, *extra):
        return fn(q, k, v, s["causal"], *extra)

    def fwdbwd(q, k, v, do, *extra):
        out, vjp = jax.vjp(lambda q, k, v: fwd(q, k, v, *extra), q, k, v)
        return out, vjp(do)

    try:
        f, g = jax.jit(fwd), jax.jit(fwdbwd)
        t0 = time.perf_counter()
        jax.block_until_ready(g(q, k, v, do, *extra))
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        mem = g.lower(q, k, v, do, *extra).compile().memory_analysis()
        row["temp_mb"] = round(mem.temp_size_in_bytes / 2**20, 1) if mem is not None else None
        out = f(q, k, v, *extra)
        row["max_err"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref))) if ref is not None else None
        del out
        t_f = median_seconds(f, q, k, v, *extra, budget_s=0.25)
        t_fb = median_seconds(g, q, k, v, do, *extra, budget_s=0.25)
        row.update(fwd_ms=round(t_f * 1e3, 4), fwdbwd_ms=round(t_fb * 1e3, 4),
                   fwd_tflops=_sig(fl / t_f / 1e12), fwdbwd_tflops=_sig(3.5 * fl / t_fb / 1e12),
                   bwd_tflops=_sig(2.5 * fl / (t_fb - t_f) / 1e12) if t_fb > t_f else None)
    except Exception as e:  # noqa: BLE001  (out of memory, unsupported shape: recorded, not fatal)
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return row


def reference_output(s: dict, q, k, v, budget: int = 8 << 30):
    """float32 forward of the pure-JAX reference, a few heads at a time (whole groups of query heads sharing a key /
    value head) so its O(N^2) logits stay within `budget` bytes; None beyond that (the long-context case)."""
    import jax_flash_amd

    group = s["H"] // s.get("H_kv", s["H"])
    per_group = 3 * s["B"] * s["N"] * s["N"] * 4 * group  # logits, probabilities and a temporary, float32
    if per_group > budget:
        return None
    chunk = max(1, min(s["H"] // group, budget // per_group)) * group
    ref = jax.jit(lambda q, k, v: jax_flash_amd.attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), causal=s["causal"],
        implementation="xla"))
    try:
        parts = [jax.block_until_ready(ref(q[:, :, h:h + chunk], k[:, :, h // group:(h + chunk) // group],
                                           v[:, :, h // group:(h + chunk) // group]))
                 for h in range(0, s["H"], chunk)]
    except Exception as e:  # noqa: BLE001  (no reference: max_err is left empty)
        print(f"no reference for {s}: {e!r}"[:300], file=sys.stderr)
        return None
    return jnp.concatenate(parts, axis=2)


class Progress:
    """One-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()

    def step(self, label: str) -> None:
        self.done += 1
        frac = self.done / self.total
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / frac - elapsed
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r[{bar:<30}] {self.done}/{self.total} {elapsed:5.0f}s eta {eta:4.0f}s {label[:48]:<48}")
        sys.stderr.flush()
        if self.done == self.total:
            sys.stderr.write("\n")


def gpu_slug() -> str:
    kind = jax.devices()[0].device_kind  # e.g. "NVIDIA H200", "AMD Instinct MI300X"
    words = [w for w in re.split(r"[^A-Za-z0-9]+", kind.lower()) if w not in ("nvidia", "amd", "instinct", "")]
    return "_".join(words) or "gpu"


# ----- report: markdown table, target check, plot -----

def _find(rows, impl, s):
    return next((r for r in rows if r["impl"] == impl and all(r[k] == s[k] for k in KEYS[1:])
                 and "error" not in r), None)


def _ratio(a, b, key):
    if a is None or b is None or not a.get(key) or not b.get(key):
        return None
    return a[key] / b[key]


TARGETS = [  # (metric, peer, floor) on the H200, bf16, N >= 1024, D in {64, 128}
    ("fwd_tflops", "cudnn", 1.05), ("fwd_tflops", "pallas_triton", 1.15),
    ("bwd_tflops", "cudnn", 1.0), ("bwd_tflops", "pallas_triton", 3.0),
    ("fwdbwd_tflops", "xla", 3.0),
]


def markdown(rows: list[dict]) -> str:
    seen, lines = [], []
    for r in rows:
        s = {k: r[k] for k in KEYS[1:]}
        if s not in seen:
            seen.append(s)
    lines.append("| dtype | D | N | B | H / H_kv | causal | impl | fwd TF/s | bwd TF/s | fwd+bwd TF/s | temp MB | "
                 "max err | compile s |")
    lines.append("|" + "---|" * 13)
    for s in seen:
        for r in rows:
            if all(r[k] == s[k] for k in KEYS[1:]):
                if "error" in r:
                    cells = f"error: {r['error'][:60]} | | | | | |"
                else:
                    err = f"{r['max_err']:.2g}" if r.get("max_err") is not None else "-"
                    cells = (f"{r['fwd_tflops']} | {r['bwd_tflops'] or '-'} | {r['fwdbwd_tflops']} | {r['temp_mb']} "
                             f"| {err} | {r['compile_s']} |")
                lines.append(f"| {s['dtype']} | {s['D']} | {s['N']} | {s['B']} | {s['H']} / {s['H_kv']} | "
                             f"{'yes' if s['causal'] else 'no'} | {r['impl']} | {cells}")
    lines += ["", "Ratios of jax_flash_amd to each peer (same run); targets: "
              + ", ".join(f"{m.split('_')[0]} >= {f}x {p}" for m, p, f in TARGETS)
              + " (bf16, N >= 1024, D 64/128).", "",
              "| dtype | D | N | causal | fwd/cuDNN | fwd/Pallas | bwd/cuDNN | bwd/Pallas | f+b/XLA | misses |",
              "|" + "---|" * 10]
    for s in seen:
        ours = _find(rows, "jax_flash_amd", s)
        if ours is None:
            continue
        ratios = [_ratio(ours, _find(rows, p, s), m) for m, p, _ in TARGETS]
        judged = s["dtype"] == "bfloat16" and s["N"] >= 1024 and s["D"] in (64, 128) and s["N"] <= 32768
        misses = [f"{m.split('_')[0]}/{p}" for (m, p, f), x in zip(TARGETS, ratios) if judged and x is not None
                  and x < f]
        cells = " | ".join(f"{x:.2f}" if x is not None else "-" for x in ratios)
        lines.append(f"| {s['dtype']} | {s['D']} | {s['N']} | {'yes' if s['causal'] else 'no'} | {cells} | "
                     f"{', '.join(misses) if judged else 'not judged'} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib; then --plot-only)", file=sys.stderr)
        return False
    ds = sorted({r["D"] for r in rows if r["dtype"] == "bfloat16" and r["N"] <= 16384})
    if not ds:
        return False
    panels = [(m, c) for m in ("fwd_tflops", "bwd_tflops") for c in (False, True)]
    fig, axes = plt.subplots(len(ds), len(panels), figsize=(4 * len(panels), 3.2 * len(ds)), squeeze=False)
    for i, d in enumerate(ds):
        for j, (metric, causal) in enumerate(panels):
            ax = axes[i][j]
            for impl in IMPLS + OPTIONAL:
                pts = sorted((r["N"], r[metric]) for r in rows if r["impl"] == impl and r["D"] == d
                             and r["causal"] == causal and r["dtype"] == "bfloat16" and r["N"] <= 16384
                             and r.get(metric))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{metric.split('_')[0]}, D {d}, {'causal' if causal else 'non-causal'}", fontsize=9)
            ax.set_xlabel("N")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def save(base: str, data, md: str) -> None:
    """base.json (the data) and base.md (the report), and the report on stdout."""
    with open(base + ".json", "w") as fh:
        json.dump(data, fh, indent=1)
    with open(base + ".md", "w") as fh:
        fh.write(md)
    print(md)


def write_reports(rows: list[dict], json_path: str, title: str) -> None:
    base = os.path.splitext(json_path)[0]
    with open(base + ".md", "w") as fh:
        fh.write(f"# {title}\n\n" + markdown(rows))
    plot(rows, base + ".png", title)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.attention", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help=f"comma-separated attention implementations to time; also {', '.join(OPTIONAL)}")
    ap.add_argument("--n", default="512,1024,2048,4096,8192,16384", help="comma-separated sequence lengths")
    ap.add_argument("--d", default="64,128,256", help="comma-separated head dims")
    ap.add_argument("--causal", choices=("no", "yes", "both"), default="both",
                    help="time non-causal attention, causal, or both")
    ap.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated input dtypes")
    ap.add_argument("--long", choices=("yes", "no", "only"), default="yes",
                    help="the long-context case (N 131072): with the others, not at all, or alone")
    ap.add_argument("--llama", choices=("yes", "no", "only"), default="yes",
                    help="the llama3.1 shapes (B 1, 64 / 8 heads, D 128, N 2k-32k): with the others, not, or alone")
    ap.add_argument("--out", default=None, help="JSON path (None: benchmarks/results/<gpu>_attention.json)")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in --out and measure only what they lack or failed on (resume a "
                         "cut-short run)")
    ap.add_argument("--plot-only", metavar="JSON", help="only redraw the markdown table and plot of a JSON file")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)

    if args.plot_only:
        with open(args.plot_only) as fh:
            rows = [dict(r, H_kv=r.get("H_kv", r["H"])) for r in json.load(fh)]
        write_reports(rows, args.plot_only, _title(rows))
        print(markdown(rows))
        return 0

    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    only = "only" in (args.long, args.llama)
    todo = [] if only else shapes([int(x) for x in args.n.split(",")], [int(x) for x in args.d.split(",")], causals,
                                  args.dtypes.split(","), False)
    todo += shapes([], [], [], [], args.long in ("yes", "only") and args.llama != "only",
                   args.llama in ("yes", "only") and args.long != "only")
    fns = {k: f for k, f in peers().items() if k in args.impls.split(",")}
    device = jax.devices()[0]
    out_path = args.out or os.path.join(os.path.dirname(__file__), "results", gpu_slug() + "_attention.json")
    rows = []
    if args.append and os.path.exists(out_path):
        with open(out_path) as fh:
            rows = [dict(r, H_kv=r.get("H_kv", r["H"])) for r in json.load(fh)]
        wanted = {(name, *(s[k] for k in KEYS[1:])) for s in todo for name in fns}
        rows = [r for r in rows if "error" not in r or tuple(r[k] for k in KEYS) not in wanted]  # retry failures
    env = dict(gpu=device.device_kind, jax=jax.__version__, cudnn=cudnn_version(), date=time.strftime("%Y-%m-%d"))
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    print(f"{env} on {device.platform}; {len(todo)} shapes x {list(fns)}", file=sys.stderr)
    done = {tuple(r[k] for k in KEYS) for r in rows}
    todo = [s for s in todo if any((name, *(s[k] for k in KEYS[1:])) not in done for name in fns)]
    bar = Progress(len(todo) * len(fns))
    for s in todo:
        keys = jax.random.split(jax.random.key(0), 4)
        q_shape, kv_shape = (s["B"], s["N"], s["H"], s["D"]), (s["B"], s["N"], s["H_kv"], s["D"])
        inputs = [jax.random.normal(kk, shape, jnp.dtype(s["dtype"]))
                  for kk, shape in zip(keys, (q_shape, kv_shape, kv_shape, q_shape))]
        ref = reference_output(s, *inputs[:3])
        for name, fn in fns.items():
            if (name, *(s[k] for k in KEYS[1:])) in done:
                bar.step(f"{name}: already measured")
                continue
            row = measure(name, fn, s, inputs, ref)
            row["env"] = env
            rows.append(row)
            bar.step(f"{name} {s['dtype']} D{s['D']} N{s['N']} {'causal' if s['causal'] else ''}")
            os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
            with open(out_path, "w") as fh:
                json.dump(rows, fh, indent=1)
        del inputs, ref
    write_reports(rows, out_path, _title(rows))
    print(markdown(rows))
    return 0


def _title(rows) -> str:
    env = rows[0].get("env", {}) if rows else {}
    return (f"Attention on {env.get('gpu', '?')} (jax {env.get('jax', '?')}, triton {env.get('triton', '?')}, "
            f"cuDNN {env.get('cudnn') or '?'}, {env.get('date', '')})")


if __name__ == "__main__":
    sys.exit(main())
