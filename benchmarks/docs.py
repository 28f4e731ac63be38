"""Writes docs/performance.md, and README.md's performance table, from the files in benchmarks/results/.

    python -m benchmarks.docs            # rewrite both from the results
    python -m benchmarks.docs --check    # exit 1 where either differs from what the results give

Every number in those tables is read from a results file here, so the docs cannot drift from the results:
tests/test_docs.py regenerates both and compares. After a new benchmark run, replace its results file (the names
below) and run this.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PERFORMANCE = os.path.join(ROOT, "docs", "performance.md")
README = os.path.join(ROOT, "README.md")
# README.md's generated table lies between these two lines
BEGIN = "<!-- benchmarks/docs.py writes this table from benchmarks/results/h200_attention.json: do not edit -->"
END = "<!-- end of the generated table -->"


def _json(name: str):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def _link(name: str, prefix: str = "../") -> str:
    return f"[{name}]({prefix}benchmarks/results/{name})"


def ran(md_name: str) -> str:
    """What ran, from a results table's header: hardware, versions, commit and command of each run (the header's own
    words, without its date)."""
    with open(os.path.join(RESULTS, md_name)) as f:
        text = f.read()
    hardware = re.search(r"^(\d+ x )?(One )?NVIDIA [^,]+", text, re.M).group(0)
    versions = ", ".join(f"{name} {re.search(rf'{name} ([0-9.]+)', text).group(1)}"
                         for name in ("jax", "triton", "jax-triton"))
    # one run, or several whose rows share the file (a run of some rows again): each commit with its command
    runs = "; then ".join(f"code of commit {commit}; `{command}`" for commit, command in
                          re.findall(r"code of commit ([0-9a-f]+)[^`]*`(python -m [^`]+)`", text))
    return f"{hardware[0].lower() + hardware[1:]}; {versions}; {runs}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]


def _wrap(text: str, indent: str = "") -> list[str]:
    """A paragraph as lines of at most 120 characters, the repository's width (Markdown joins them again)."""
    return textwrap.wrap(text, 120, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def _reflow(lines: list[str]) -> list[str]:
    """Prose and bullets wrapped; headings, tables and images as they are."""
    out = []
    for line in lines:
        if len(line) <= 120 or line.startswith(("|", "#", "!")):
            out.append(line)
        else:
            out += _wrap(line, "  " if line.startswith("- ") else "")
    return out


def _f(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# ----- attention (h200_attention.json, h200_long.json) -----

def _by_impl(rows: list[dict]) -> dict:
    return {(r["impl"], r["D"], r["N"], r["causal"]): r for r in rows}


def _ratio(rows: dict, key, peer: str, field: str):
    ours, theirs = rows.get(("jax_flash_amd", *key)), rows.get((peer, *key))
    if not ours or not theirs or not ours.get(field) or not theirs.get(field):
        return None
    return ours[field] / theirs[field]


def attention_shapes(rows: list[dict]) -> list[tuple[int, int, bool]]:
    """(D, N, causal) of every shape ours ran, D descending, then causal after full, then N."""
    return sorted({(r["D"], r["N"], r["causal"]) for r in rows if r["impl"] == "jax_flash_amd"},
                  key=lambda s: (-s[0], s[2], s[1]))


def readme_table() -> str:
    """README.md's table: ours / cuDNN, forward and backward, per head dim, mask and length."""
    rows = _json("h200_attention.json")
    by = _by_impl(rows)
    shapes = attention_shapes(rows)
    ns = sorted({n for _, n, _ in shapes})
    body = []
    for d, causal in sorted({(d, c) for d, _, c in shapes}, key=lambda s: (-s[0], s[1])):
        cells = [f"{_f(_ratio(by, (d, n, causal), 'cudnn', 'fwd_tflops'))} / "
                 f"{_f(_ratio(by, (d, n, causal), 'cudnn', 'bwd_tflops'))}" for n in ns]
        body.append([f"D {d}, {'causal' if causal else 'full'}", *cells])
    fb = [_ratio(by, s, "xla", "fwdbwd_tflops") for s in shapes]
    fb = [x for x in fb if x is not None]
    long = _by_impl(_json("h200_long.json"))
    (d, n, causal), = {(r["D"], r["N"], r["causal"]) for r in long.values()}
    ours_long = long[("jax_flash_amd", d, n, causal)]
    note = (f"Forward+backward runs {min(fb):.1f}-{max(fb):.1f}x as fast as XLA's attention. At N {n:,} ({'causal' if causal else 'full'}, "
            f"D {d}): forward {_f(_ratio(long, (d, n, causal), 'cudnn', 'fwd_tflops'))}x, backward "
            f"{_f(_ratio(long, (d, n, causal), 'cudnn', 'bwd_tflops'))}x cuDNN, in {ours_long['temp_mb']:,.0f} MB of "
            f"temp memory against cuDNN's {long[('cudnn', d, n, causal)]['temp_mb']:,.0f} MB. Ran: "
            f"{ran('h200_attention.md')}.")
    lines = [BEGIN, *_table(["ours / cuDNN, forward / backward", *(f"N {n}" for n in ns)], body), "", *_wrap(note),
             END]
    return "\n".join(lines)


def _attention_section() -> list[str]:
    rows = _json("h200_attention.json")
    by = _by_impl(rows)
    peers = sorted({r["impl"] for r in rows} - {"jax_flash_amd"})
    out = ["## Attention, forward and backward", "",
           f"Ran: {ran('h200_attention.md')}. Files: {_link('h200_attention.json')}, {_link('h200_attention.md')}, "
           f"{_link('h200_attention.png')}.", "",
           "16k tokens per batch and hidden 2048: B = 16384 / N, H = 2048 / D. TFLOP/s in FlashAttention's convention "
           "(forward 4·B·H·N²·D, halved when causal; backward 2.5x the forward). temp: XLA's temp memory of the "
           "jitted forward+backward.", ""]
    header = ["D", "N", "mask", "ours fwd / bwd TF/s"] + [f"{p} fwd / bwd TF/s" for p in peers]
    header += ["fwd / cuDNN", "bwd / cuDNN", "f+b / XLA", "temp MB ours / " + " / ".join(peers)]
    body = []
    for d, n, causal in attention_shapes(rows):
        key = (d, n, causal)
        tf = [f"{by[(i, *key)]['fwd_tflops']:.0f} / {by[(i, *key)]['bwd_tflops']:.0f}" if (i, *key) in by else "-"
              for i in ("jax_flash_amd", *peers)]
        temp = " / ".join(f"{by[(i, *key)]['temp_mb']:,.0f}" if (i, *key) in by else "-"
                          for i in ("jax_flash_amd", *peers))
        body.append([d, n, "causal" if causal else "full", *tf, _f(_ratio(by, key, "cudnn", "fwd_tflops")),
                     _f(_ratio(by, key, "cudnn", "bwd_tflops")), _f(_ratio(by, key, "xla", "fwdbwd_tflops")), temp])
    out += _table(header, body)
    out += ["", "![TFLOP/s against N](../benchmarks/results/h200_attention.png)", "",
            "Temp memory at D 128 is the dS workspace of the fast backward (up to 2 GiB per launch; "
            "[design.md](design.md#the-ds-workspace)); at D 64, and with the workspace turned off, it is linear in N.",
            ""]
    long = _json("h200_long.json")
    lby = _by_impl(long)
    out += ["## Long context", "", f"Ran: {ran('h200_long.md')}. Files: {_link('h200_long.json')}, "
            f"{_link('h200_long.md')}.", ""]
    body = []
    for d, n, causal in attention_shapes(long):
        for impl in sorted({r["impl"] for r in long}, key=lambda i: i != "jax_flash_amd"):
            r = lby[(impl, d, n, causal)]
            body.append([f"{r['B']} x {n:,} x {r['H']} x {d}", "causal" if causal else "full", impl,
                         f"{r['fwd_tflops']:.0f}", f"{r['bwd_tflops']:.0f}", f"{r['fwdbwd_tflops']:.0f}",
                         f"{r['temp_mb']:,.0f}"])
    out += _table(["B x N x H x D", "mask", "impl", "fwd TF/s", "bwd TF/s", "f+b TF/s", "temp MB"], body)
    return out + [""]


def _llama_section() -> list[str]:
    rows = _json("h200_llama.json")
    by = _by_impl(rows)
    r0 = rows[0]
    out = ["## The llama3.1 shapes", "", f"Ran: {ran('h200_llama.md')}. Files: {_link('h200_llama.json')}, "
           f"{_link('h200_llama.md')}, {_link('h200_llama.png')}. B {r0['B']}, {r0['H']} query / {r0['H_kv']} "
           f"key-value heads, D {r0['D']} (cudnn-frontend's own H200 benchmark shapes).", ""]
    body = []
    for d, n, causal in attention_shapes(rows):
        key = (d, n, causal)
        ours, cudnn = by[("jax_flash_amd", *key)], by[("cudnn", *key)]
        body.append([f"{n:,}", "causal" if causal else "full",
                     f"{ours['fwd_tflops']:.0f} / {ours['bwd_tflops']:.0f}",
                     f"{cudnn['fwd_tflops']:.0f} / {cudnn['bwd_tflops']:.0f}",
                     _f(_ratio(by, key, "cudnn", "fwd_tflops")), _f(_ratio(by, key, "cudnn", "bwd_tflops")),
                     f"{ours['temp_mb']:,.0f} / {cudnn['temp_mb']:,.0f}"])
    out += _table(["N", "mask", "ours fwd / bwd TF/s", "cudnn fwd / bwd TF/s", "fwd / cuDNN", "bwd / cuDNN",
                   "temp MB ours / cudnn"], body)
    return out + [""]


# ----- variants, decode, training, scaling, dropout statistics -----

def _variants_section() -> list[str]:
    rows = _json("h200_variants.json")
    out = ["## Variants", "", f"Ran: {ran('h200_variants.md')}. Files: {_link('h200_variants.json')}, "
           f"{_link('h200_variants.md')}. Each variant against the same kernels without it, in the same run "
           "(bf16, D 128); ratios of times, below 1 is faster.", ""]
    body = []
    for r in rows:
        v, ratio = r["variant"], r["ratios"]
        times = " / ".join(_f(v.get(k), 3) for k in ("fwd_ms", "bwd_ms", "fwdbwd_ms"))
        ratios = " / ".join(_f(ratio.get(k)) for k in ("fwd_ms", "bwd_ms", "fwdbwd_ms"))
        judged = r.get("judged_on")
        target = "-" if r.get("target") is None else (
            f"<= {r['target']}x" + (f" ({judged.replace('_ms', '').replace('fwdbwd', 'f+b')})" if judged else ""))
        met = "-" if r.get("met") is None else "met" if r["met"] else "**missed**"
        body.append([r["case"], f"{r['B']} x {r['N']} x {r['H']}", times, ratios, target, met])
    out += _table(["case", "B x N x H", "variant fwd / bwd / f+b ms", "ratio fwd / bwd / f+b", "target", ""], body)
    # the dense cases' default since (the Gluon kernels), timed on an H100 only
    h100 = {r["case"]: r["ratios"]["fwdbwd_ms"] for r in _json("h100_80gb_hbm3_variants.json") if "ratios" in r}
    pair = lambda name: " / ".join(_f(h100[f"{name} vs none, {m}"]) for m in ("full", "causal"))  # noqa: E731
    out += ["", "The dense rows above are Triton's pointer rows, which dense calls took then. The default since, the "
            "Gluon kernels with their tiles through shared buffers, on an H100 "
            f"({_link('h100_80gb_hbm3_variants.md')}): a padding mask {pair('padding mask (B, 1, 1, S)')}, a bias "
            f"{pair('bias (1, H, T, S)')} (f+b, full / causal; [tuning.md](tuning.md) has the table)."]
    return out + [""]


def _decode_rows(rows: list[dict]) -> dict:
    shapes = {}
    for r in rows:
        shapes.setdefault((r["B"], r["T"]), []).append(r)
    return shapes


def _decode_section() -> list[str]:
    rows = _json("h200_decode.json")
    env = rows[0]["env"]
    first = rows[0]
    out = ["## KV-cache decode", "",
           f"Ran: {ran('h200_decode.md')}. Files: {_link('h200_decode.json')}, {_link('h200_decode.md')}.", "",
           f"bf16, D {first['D']}, {first['H']} query / {first['H_kv']} key-value heads, one query per row, caches "
           f"full. The GPU's copy rate, measured in the same run (read + write of a 2 GiB array): "
           f"{env['copy_gbps']:,.0f} GB/s; \"of copy\" is the rate at which K and V are read over it. Peers: Pallas' "
           "`decode_attention` (its `gqa` entry on our layout, and its kernel on a head-major cache), Pallas' "
           "`paged_attention`, and XLA (`xla`: our pure-JAX implementation; `xla_plain`: one einsum).", ""]
    body = []
    for (b, t), group in _decode_rows(rows).items():
        for r in group:
            if "error" in r:
                body.append([f"{b} x {t:,}", r["impl"], r["layout"], "failed: " + r["error"].split(":")[1].strip(),
                             "", ""])
            else:
                body.append([f"{b} x {t:,}", r["impl"], r["layout"], f"{r['ms']:.4f}", f"{r['kv_gbps']:,.0f}",
                             f"{r['copy_fraction']:.2f}"])
    out += _table(["batch x cache", "impl", "layout", "ms", "K+V GB/s", "of copy"], body)
    out += ["", "Ours against the fastest form of each peer (time ratios, above 1 is faster):", ""]
    body = []
    for (b, t), group in _decode_rows(rows).items():
        ms = {(r["impl"], r["layout"]): r["ms"] for r in group if "ms" in r}
        ours = ms[("jax_flash_amd", "contiguous")]
        pallas = min(v for (i, _), v in ms.items() if i.startswith("pallas"))
        xla = min(v for (i, _), v in ms.items() if i.startswith("xla"))
        paged = " / ".join(f"{ms[('jax_flash_amd', f'paged {p}')] / ours:.2f}" for p in (64, 128))
        body.append([f"{b} x {t:,}", f"{pallas / ours:.2f}", f"{xla / ours:.2f}", paged])
    out += _table(["batch x cache", "vs Pallas", "vs XLA", "paged 64 / 128: time over contiguous's"], body)
    sweep = _json("h200_decode_sweep.json")
    tried = [r for r in sweep if r["impl"] == "sweep"]
    out += ["", f"Other decode configs and split counts ({ran('h200_decode_sweep.md')}; files: "
            f"{_link('h200_decode_sweep.json')}, {_link('h200_decode_sweep.md')}), fastest first:", ""]
    body = [[f"{r['B']} x {r['T']:,}", r["layout"], r["BLOCK_N"], r["num_warps"], r["num_stages"], r["splits"],
             f"{r['ms']:.4f}", f"{r['copy_fraction']:.2f}"]
            for r in sorted(tried, key=lambda r: (r["layout"], r["ms"]))]
    out += _table(["batch x cache", "layout", "BLOCK_N", "warps", "stages", "splits", "ms", "of copy"], body)
    return out + [""]


def _gpt_section() -> list[str]:
    data = _json("h200_gpt.json")
    out = ["## Training a GPT", "", f"Ran: {ran('h200_gpt.md')}. Files: {_link('h200_gpt.json')}, "
           f"{_link('h200_gpt.md')}.", "",
           "`examples/train_gpt.py`: a byte-level GPT (12 layers, d_model 768, 12 heads of 64), bf16, 8192 tokens "
           "per step; `flash` is `FlashSelfAttention`, `xla` Flax's `MultiHeadDotProductAttention` with a causal "
           "mask, from the same initial weights.", ""]
    body = []
    for r in data["throughput"]:
        body.append([r["seq_len"], r["batch"], r["attention"], f"{r['tokens_per_s']:,}", f"{r['step_ms']:.2f}",
                     f"{r['peak_memory_gb']:.2f}", r["final_loss"]])
    out += _table(["seq-len", "batch", "attention", "tokens/s", "step ms", "peak memory GB", "final loss"], body)
    longest = data["longest"]
    out += ["", f"Longest sequence trained at batch 1: xla {longest['xla']:,}, flash {longest['flash']:,}."]
    return out + [""]


def _scaling_section() -> list[str]:
    s = _json("h200_scaling.json")
    a = s["attention"]
    shape = " x ".join(str(x) for x in a["shape"])
    return ["## Several GPUs", "", f"Ran: {ran('h200_scaling.md')}. Files: {_link('h200_scaling.json')}, "
            f"{_link('h200_scaling.md')}.", "",
            f"- Data-parallel GPT training: {s['one_gpu']['tokens_per_s']:,} tokens/s on 1 GPU (batch "
            f"{s['one_gpu']['batch']}), {s['n_gpus']['tokens_per_s']:,} on {s['n_gpus']['devices']} (batch "
            f"{s['n_gpus']['batch']}): {s['scaling']:.2f}x.",
            f"- The same global batch on 1 and {s['n_gpus']['devices']} GPUs: largest per-step loss difference "
            f"{s['loss_gap_same_global_batch']}.",
            f"- Attention {shape} (B, N, H, D) sharded over heads on {a['devices']} GPUs: "
            f"{'no collective' if not a['collectives'] else ', '.join(a['collectives'])}; {a['sharded_ms']} ms against "
            f"{a['one_gpu_ms']} ms on one GPU.", ""]


def _dropout_section() -> list[str]:
    s = _json("dropout_stats.json")
    z = s["z"]
    return ["## Dropout's random bytes", "",
            f"`python -m benchmarks.dropout_stats --json benchmarks/results/dropout_stats.json` "
            f"({_link('dropout_stats.json')}): {len(z)} chi-square tests (each z-score combines {s['seeds']} seeds of "
            f"{s['n']} x {s['n']} bytes) of a byte against its neighbours at several distances along rows and columns, "
            f"the other corners of its 2 x 2 squares, and the byte at the same place under a nearby seed. Largest "
            f"|z|: {max(abs(x) for x in z.values()):.2f}.", ""]


def performance() -> str:
    lines = ["# Performance", "",
             "Current results only, each table written by `python -m benchmarks.docs` from the files in "
             "`benchmarks/results/` (do not edit by hand). Each section says what ran: the GPU, the versions, the "
             "commit of the measured code and the command. Every peer ran in the same process and run as ours; "
             "compare ratios taken in one run (run-to-run noise moves a ratio by a few hundredths, up to 0.08 at N "
             "1024). What each config row was measured against: [tuning.md](tuning.md); AMD (compiled, not yet "
             "timed): [amd.md](amd.md).", ""]
    for section in (_attention_section, _llama_section, _variants_section, _decode_section, _gpt_section,
                    _scaling_section, _dropout_section):
        lines += section()
    return "\n".join(_reflow(lines)).rstrip() + "\n"


def readme_with_table(readme: str) -> str:
    """README.md's text with its generated table replaced by the current one."""
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    return readme[:start] + readme_table() + readme[end:]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.docs", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 where a file differs from the results")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    with open(README) as f:
        readme = f.read()
    wanted = {PERFORMANCE: performance(), README: readme_with_table(readme)}
    stale = []
    for path, text in wanted.items():
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(os.path.relpath(path, ROOT))
            if not args.check:
                with open(path, "w") as f:
                    f.write(text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python -m benchmarks.docs)", file=sys.stderr)
        return 1
    print(("rewrote: " + ", ".join(stale)) if stale else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
