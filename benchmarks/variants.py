"""What each attention variant costs, against the same kernels without it, in one process and one run.

    python -m benchmarks.variants            # writes benchmarks/results/<gpu>_variants.{json,md}

Each case is a pair (variant, baseline) of jax_flash_amd calls (implementation="triton", bf16) whose time
ratio has a target (the project's; docs/performance.md "Variants"):
- GQA 32 query / 8 key-value heads vs 32-head MHA at N 4096, D 128: forward and backward each <= 1.05x;
- window (1024, 0) vs full causal at N 16384, D 128: forward+backward <= 0.15x;
- dropout 0.1 vs none at N 4096, D 128: forward+backward <= 1.3x;
- packed segment ids (4 sequences of N / 4) vs one causal sequence: informational (skipped blocks);
- fp8 (e4m3fn, inference) forward vs bf16 forward at N 4096 and 16384, D 128: >= 1.4x as fast, i.e. a
  time ratio <= 0.714;
- a padding mask (B, 1, 1, S) and a bias (1, H, T, S) vs none at N 4096, D 128: forward+backward <= 1.25x (also
  through Triton's pointer rows, plan.Policy(gluon_dense=False), and with the Gluon kernels reading the tiles
  element by element, plan.Policy(gluon_dense_tiles=False); the bias also with each head's batch elements launched
  side by side, plan.Policy(dense_batch_inner=True)).
Times are medians (jax_flash_amd.timing) of the forward and of forward+backward; backward = their difference.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

import jax_flash_amd
from jax_flash_amd import plan
from benchmarks.attention import gpu_slug, measure, save
from jax_flash_amd.timing import median_seconds

D = 128


def _case(name, target_key, target, b, n, h, h_kv, causal, variant_kw, base_kw, base_h_kv=None):
    return dict(name=name, target_key=target_key, target=target, B=b, N=n, H=h, H_kv=h_kv, causal=causal,
                variant=variant_kw, base=base_kw, base_H_kv=base_h_kv or h_kv)


def cases(n_seg: int = 4096) -> list[dict]:
    ids = jnp.repeat(jnp.arange(4, dtype=jnp.int32), n_seg // 4)[None]
    return [
        _case("gqa 32q/8kv vs mha, causal", "fwd_ms,bwd_ms", 1.05, 4, 4096, 32, 8, True, {}, {}, base_h_kv=32),
        _case("gqa 32q/8kv vs mha, full", "fwd_ms,bwd_ms", 1.05, 4, 4096, 32, 8, False, {}, {}, base_h_kv=32),
        _case("window (1024, 0) vs causal, N 16384", "fwdbwd_ms", 0.15, 1, 16384, 16, 16, True,
              dict(window_size=(1024, 0)), {}),
        _case("dropout 0.1 vs none, causal", "fwdbwd_ms", 1.3, 4, 4096, 16, 16, True,
              dict(dropout_p=0.1, dropout_rng=jax.random.key(0)), {}),
        _case("dropout 0.1 vs none, full", "fwdbwd_ms", 1.3, 4, 4096, 16, 16, False,
              dict(dropout_p=0.1, dropout_rng=jax.random.key(0)), {}),
        _case("4 packed segments vs one sequence, causal", "fwdbwd_ms", None, 4, n_seg, 16, 16, True,
              dict(q_segment_ids=jnp.broadcast_to(ids, (4, n_seg))), {}),
        _case("fp8 forward vs bf16, causal, N 4096", "fwd_ms", 0.714, 4, 4096, 16, 16, True, FP8, {}),
        _case("fp8 forward vs bf16, full, N 16384", "fwd_ms", 0.714, 1, 16384, 16, 16, False, FP8, {}),
        # dense operands, read tile by tile (the targets: <= 1.25x the same call without them)
        _case("padding mask (B, 1, 1, S) vs none, full", "fwdbwd_ms", 1.25, 4, 4096, 16, 16, False, PADDING, {}),
        _case("padding mask (B, 1, 1, S) vs none, causal", "fwdbwd_ms", 1.25, 4, 4096, 16, 16, True, PADDING, {}),
        _case("bias (1, H, T, S) vs none, full", "fwdbwd_ms", 1.25, 4, 4096, 16, 16, False, BIAS, {}),
        _case("bias (1, H, T, S) vs none, causal", "fwdbwd_ms", 1.25, 4, 4096, 16, 16, True, BIAS, {}),
        # the same through Triton's pointer rows (plan.Policy(gluon_dense=False)), as before the Gluon kernels took them
        *(_case(f"{name} vs none, {mask}, pointer rows", "fwdbwd_ms", 1.25, 4, 4096, 16, 16, mask == "causal",
                {**dense, "policy": {"gluon_dense": False}}, {})
          for name, dense in (("padding mask (B, 1, 1, S)", PADDING), ("bias (1, H, T, S)", BIAS))
          for mask in ("full", "causal")),
        # the Gluon kernels reading the tiles element by element (plan.Policy(gluon_dense_tiles=False)), as before
        *(_case(f"{name} vs none, {mask}, element reads", "fwdbwd_ms", 1.25, 4, 4096, 16, 16, mask == "causal",
                {**dense, "policy": {"gluon_dense_tiles": False}}, {})
          for name, dense in (("padding mask (B, 1, 1, S)", PADDING), ("bias (1, H, T, S)", BIAS))
          for mask in ("full", "causal")),
        # the bias shared by the batch, a head's batch elements launched side by side (Policy(dense_batch_inner))
        *(_case(f"bias (1, H, T, S) vs none, {mask}, batch inner", "fwdbwd_ms", 1.25, 4, 4096, 16, 16,
                mask == "causal", {**BIAS, "policy": {"dense_batch_inner": True}}, {}) for mask in ("full", "causal")),
    ]


# dense operands, made per case and passed as arguments (measure's extra): a padding mask whose rows keep all but
# the last 0 / 512 / 0 / 1024 keys, and a bias per head
PADDING = {"dense": "mask"}
BIAS = {"dense": "bias"}


def _dense(c):
    if c["variant"].get("dense") == "mask":
        lengths = jnp.asarray([c["N"], c["N"] - 512, c["N"], c["N"] - 1024][:c["B"]])
        return "mask", (jnp.arange(c["N"])[None, :] < lengths[:, None])[:, None, None, :]
    return "bias", jax.random.normal(jax.random.key(5), (1, c["H"], c["N"], c["N"]), jnp.bfloat16)


FP8 = {"fp8": jnp.float8_e4m3fn}  # variant marker: quantise the inputs, time the forward only


def _fn(kw, dense_name=None):
    def fn(q, k, v, causal, *dense):
        extra = {dense_name: dense[0]} if dense_name else {}
        return jax_flash_amd.attention(q, k, v, causal=causal, implementation="triton", **kw, **extra)
    return fn


def _fp8_forward(c, dtype) -> dict:
    """Forward time of fp8 inputs (quantised beforehand, untimed), in measure()'s row format."""
    q, k, v, _ = _inputs(c, c["H_kv"])
    (q8, qd), (k8, kd), (v8, vd) = (jax_flash_amd.quantize_fp8(x, dtype) for x in (q, k, v))
    f = jax.jit(lambda q, k, v, qd, kd, vd: jax_flash_amd.attention(
        q, k, v, causal=c["causal"], q_descale=qd, k_descale=kd, v_descale=vd, implementation="triton"))
    try:
        return dict(fwd_ms=round(median_seconds(f, q8, k8, v8, qd, kd, vd, budget_s=0.25) * 1e3, 4))
    except Exception as e:  # noqa: BLE001  (recorded, not fatal)
        return dict(error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")


def _inputs(c, h_kv):
    keys = jax.random.split(jax.random.key(1), 4)
    q = jax.random.normal(keys[0], (c["B"], c["N"], c["H"], D), jnp.bfloat16)
    k, v = (jax.random.normal(kk, (c["B"], c["N"], h_kv, D), jnp.bfloat16) for kk in keys[1:3])
    return q, k, v, jax.random.normal(keys[3], q.shape, jnp.bfloat16)


def run_case(c) -> dict:
    s = dict(B=c["B"], N=c["N"], H=c["H"], D=D, causal=c["causal"], dtype="bfloat16")
    if "fp8" in c["variant"]:
        var = _fp8_forward(c, c["variant"]["fp8"])
    elif "dense" in c["variant"]:
        name, array = _dense(c)
        with plan.using(plan.DEFAULT.replace(**c["variant"].get("policy", {}))):  # traced inside: planned with it
            var = measure("variant", _fn({}, name), s, _inputs(c, c["H_kv"]), None, extra=(array,))
        del array
    else:
        var = measure("variant", _fn(c["variant"]), s, _inputs(c, c["H_kv"]), None)
    base = measure("baseline", _fn(c["base"]), s, _inputs(c, c["base_H_kv"]), None)
    row = dict(case=c["name"], **s, target=c["target"], variant=var, baseline=base)
    for r in (var, base):
        if "fwdbwd_ms" in r:
            r["bwd_ms"] = round(r["fwdbwd_ms"] - r["fwd_ms"], 4)
    if "error" in var or "error" in base:
        row["error"] = var.get("error") or base.get("error")
        return row
    row["ratios"] = {k: round(var[k] / base[k], 3) for k in ("fwd_ms", "bwd_ms", "fwdbwd_ms") if k in var}
    if c["target"] is not None:
        row["met"] = all(row["ratios"][k] <= c["target"] for k in c["target_key"].split(","))
        row["judged_on"] = c["target_key"]
    return row


def markdown(rows) -> str:
    lines = ["| case | B | N | H | variant fwd / bwd / f+b ms | baseline fwd / bwd / f+b ms | ratio fwd / bwd / f+b "
             "| temp MB variant / baseline | target | met |", "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['B']} | {r['N']} | {r['H']} | error: {r['error'][:80]} | | | | | |")
            continue
        v, b, x = r["variant"], r["baseline"], r["ratios"]
        ms = lambda t: " / ".join(f"{t[k]:.3f}" if k in t else "-" for k in ("fwd_ms", "bwd_ms", "fwdbwd_ms"))  # noqa
        target = f"<= {r['target']}x ({r['judged_on'].replace('_ms', '')})" if r["target"] else "-"
        met = {True: "yes", False: "**no**"}.get(r.get("met"), "-")
        lines.append(f"| {r['case']} | {r['B']} | {r['N']} | {r['H']} | {ms(v)} | {ms(b)} | "
                     f"{' / '.join(f'{x[k]:.2f}' if k in x else '-' for k in ('fwd_ms', 'bwd_ms', 'fwdbwd_ms'))} "
                     f"| {v.get('temp_mb', '-')} / {b.get('temp_mb', '-')} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.variants", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    env = dict(gpu=jax.devices()[0].device_kind, jax=jax.__version__, date=time.strftime("%Y-%m-%d"))
    base = os.path.join(os.path.dirname(__file__), "results", gpu_slug() + "_variants")
    rows = []
    if args.only and os.path.exists(base + ".json"):  # keep the other cases' rows
        with open(base + ".json") as fh:
            rows = [r for r in json.load(fh) if args.only not in r["case"]]
    for c in cases():
        if args.only in c["name"]:
            rows.append(run_case(c) | {"env": env})
            print(f"{c['name']}: {rows[-1].get('ratios', rows[-1].get('error'))}", file=sys.stderr, flush=True)
    order = [c["name"] for c in cases()]
    rows.sort(key=lambda r: order.index(r["case"]) if r["case"] in order else len(order))
    save(base, rows, f"# Attention variants on {env['gpu']} (bf16, D {D}, jax {env['jax']}, {env['date']})\n\n"
         + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
