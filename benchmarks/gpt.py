"""GPT training with flash vs XLA attention (examples/train_gpt.py), each run in a process of its own
so that peak device memory is that run's.

    python -m benchmarks.gpt          # writes benchmarks/results/<gpu>_gpt.{json,md}

- Throughput: a ~89M-parameter byte-level GPT (12 layers, d_model 768, 12 heads, head_dim 64), bf16,
  8192 tokens per step at seq-len 1024, 4096 and 8192: tokens/s and peak memory, flash against xla.
- Longest trainable seq-len at batch 1: the given lengths in turn until a run fails (out of memory).
Targets (issue 5): at seq-len 4096 tokens/s >= 1.5x and peak memory <= 0.5x XLA's; longest seq-len
>= 4x XLA's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.attention import gpu_slug, save

MODEL = ["--layers", "12", "--d-model", "768", "--heads", "12", "--dtype", "bfloat16", "--lr", "6e-4"]
TOKENS = 8192
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(attention: str, seq_len: int, batch: int, steps: int, timeout: int = 600, extra=()) -> dict:
    """One examples/train_gpt.py run in a process of its own: its summary row, or {error} if it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.jsonl")
        cmd = [sys.executable, os.path.join(ROOT, "examples", "train_gpt.py"), "--attention", attention,
               "--seq-len", str(seq_len), "--batch", str(batch), "--steps", str(steps), "--out-dir", tmp,
               "--json", out, *MODEL, *extra]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return dict(attention=attention, seq_len=seq_len, batch=batch, error="timeout")
        if proc.returncode != 0 or not os.path.exists(out):
            lines = [l for l in proc.stderr.splitlines() if "Error" in l or "RESOURCE_EXHAUSTED" in l]
            return dict(attention=attention, seq_len=seq_len, batch=batch,
                        error=(lines[-1] if lines else proc.stderr[-300:]).strip()[:300])
        with open(out) as fh:
            row = json.loads(fh.readline())
        return row


def longest(attention: str, lengths: list[int]) -> tuple[int | None, list]:
    """The longest of `lengths` (increasing; stops at the first failure) that trains at batch 1."""
    best, attempts = None, []
    for n in lengths:
        r = run(attention, n, 1, 2, timeout=240)
        r.pop("losses", None)
        attempts.append(r)
        print(f"  {attention} seq {n}: {'ok' if 'error' not in r else r['error'][:100]}", file=sys.stderr, flush=True)
        if "error" in r:
            break
        best = n
    return best, attempts


def markdown(rows, longest_rows) -> str:
    lines = ["| seq-len | batch | attention | tokens/s | step ms | peak memory GB | final loss |", "|" + "---|" * 7]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['seq_len']} | {r['batch']} | {r['attention']} | error: {r['error'][:70]} | | | |")
        else:
            lines.append(f"| {r['seq_len']} | {r['batch']} | {r['attention']} | {r['tokens_per_s']:,} | {r['step_ms']} "
                         f"| {r['peak_memory_gb']} | {r['final_loss']} |")
    for n in sorted({r["seq_len"] for r in rows}):
        f = next((r for r in rows if r["seq_len"] == n and r["attention"] == "flash" and "error" not in r), None)
        x = next((r for r in rows if r["seq_len"] == n and r["attention"] == "xla" and "error" not in r), None)
        if f and x:
            lines.append(f"\nseq-len {n}: flash/xla tokens/s {f['tokens_per_s'] / x['tokens_per_s']:.2f}x, "
                         f"peak memory {f['peak_memory_gb'] / x['peak_memory_gb']:.2f}x")
    lines.append("\nLongest seq-len trained at batch 1: "
                 + ", ".join(f"{a} {n if n else 'none tried succeeded'}" for a, n in longest_rows.items()))
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpt", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--seq-lens", default="1024,4096,8192",
                    help=f"comma-separated sequence lengths of the throughput runs, {TOKENS} tokens per step")
    ap.add_argument("--steps", type=int, default=12, help="training steps per run")
    ap.add_argument("--try-xla", default="8192,16384,32768", help="batch-1 lengths to try with xla, in order")
    ap.add_argument("--try-flash", default="32768,65536,131072", help="the same with flash")
    ap.add_argument("--append", action="store_true", help="merge with the rows already in the results file")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    base = os.path.join(ROOT, "benchmarks", "results", f"{gpu_slug()}_gpt")
    result = dict(throughput=[], longest={}, attempts=[])
    if args.append and os.path.exists(base + ".json"):
        with open(base + ".json") as fh:
            result = json.load(fh)
    for seq_len in [int(n) for n in args.seq_lens.split(",") if n]:
        for attention in ("flash", "xla"):
            row = run(attention, seq_len, TOKENS // seq_len, args.steps)
            row.pop("losses", None)
            result["throughput"] = [r for r in result["throughput"]
                                    if (r["attention"], r["seq_len"]) != (attention, seq_len)] + [row]
            print(f"{attention} {seq_len}: {row.get('tokens_per_s', row.get('error'))}", file=sys.stderr, flush=True)
    for attention, tries in (("xla", args.try_xla), ("flash", args.try_flash)):
        lengths = [int(n) for n in tries.split(",") if n]
        if lengths:
            best, attempts = longest(attention, lengths)
            result["longest"][attention] = max(best or 0, result["longest"].get(attention) or 0) or None
            result["attempts"] += attempts
    result["throughput"].sort(key=lambda r: (r["seq_len"], r["attention"]))
    save(base, result, "# GPT training, flash vs XLA attention\n\nByte-level GPT of ~89M parameters (12 layers, "
         f"d_model 768, 12 heads), bf16, {TOKENS} tokens per step; `python -m benchmarks.gpt`.\n\n"
         + markdown(result["throughput"], result["longest"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
