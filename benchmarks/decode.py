"""Decode benchmark: attention_with_kvcache against Pallas' GPU decode kernels and the XLA reference, with
the GPU's own copy bandwidth measured in the same run.

    python -m benchmarks.decode                    # both issue shapes, contiguous and paged (64, 128), all peers
    python -m benchmarks.decode --sweep            # also time a few decode configs / split counts of ours
    python -m benchmarks.decode --shapes 8x32768 --impls jax_flash_amd,xla

Shapes (issue 20): bf16, head_dim 128, 32 query / 8 key-value heads, seq_q 1, batch x cache length
8 x 32768 and 1 x 131072; every row's cache full (cache_seqlens = capacity). Implementations:
jax_flash_amd (implementation="triton": contiguous, and paged with page 64 and 128 on shuffled pages),
jax_flash_amd+append (one new key / value written in place into donated caches, then attention),
pallas_gqa (jax.experimental.pallas.ops.gpu.decode_attention.gqa on our cache layout, (batch, seq,
heads_kv, D): it transposes K and V on every call), pallas_head_major (the same Pallas kernel, vmapped
over key/value heads, on a (batch, heads_kv, seq, D) cache: no transpose), pallas_paged
(paged_attention.paged_attention, its own (heads_kv, pages, page, D) layout), xla (attention_with_kvcache's
implementation="xla", masked to each row's length) and xla_plain (grouped einsum, softmax, einsum over
the full caches: the shortest XLA decode). Pallas peers that fail to import or run are recorded with
their error.

Bandwidth: bytes of K and V read per call (2 x batch x length x heads_kv x D x 2) / time, and its fraction
of the copy bandwidth (a jitted x + 1 over a 2 GiB bf16 array: bytes read + written / time). Targets
(the project's; docs/performance.md "KV-cache decode"): ours >= 70% of the copy rate, >= 2x Pallas (the faster
of its two contiguous forms), >= 3x XLA (the faster of the two), paged <= 1.1x contiguous. max_err: max |out - xla's out| (both bf16). JSON
and markdown go to benchmarks/results/<gpu>_decode.json / .md.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd.timing import median_seconds

HEADS_Q, HEADS_KV, D = 32, 8, 128
SHAPES = ((8, 32768), (1, 131072))
PAGES = (64, 128)
IMPLS = ("jax_flash_amd", "jax_flash_amd+append", "pallas_gqa", "pallas_head_major", "pallas_paged", "xla",
         "xla_plain")
TARGETS = dict(copy_fraction=0.70, vs_pallas=2.0, vs_xla=3.0, paged_over_contiguous=1.1)


def copy_bandwidth(gib: float = 2.0) -> float:
    """Bytes per second of a jitted elementwise copy (x + 1, bf16): bytes read + written / time."""
    x = jnp.zeros((int(gib * 2**30) // 2,), jnp.bfloat16)
    f = jax.jit(lambda x: x + jnp.bfloat16(1))
    t = median_seconds(f, x, reps=7, budget_s=1.0)
    del x
    return 2 * gib * 2**30 / t


def _err(out, ref) -> float | None:
    if ref is None:
        return None
    return float(jnp.max(jnp.abs(out.astype(jnp.float32).reshape(ref.shape) - ref.astype(jnp.float32))))


def paged_copy(cache, page: int, seed: int):
    """(pages, block_table): cache (batch, T, heads_kv, D) cut into pages of `page` keys, pages shuffled."""
    b, t = cache.shape[:2]
    n = b * t // page
    order = np.random.default_rng(seed).permutation(n)
    pages = jnp.zeros((n, page, *cache.shape[2:]), cache.dtype).at[order].set(cache.reshape(n, page, *cache.shape[2:]))
    return pages, jnp.asarray(order.reshape(b, t // page), jnp.int32)


def time_donated(step, q, kc, vc, lens, k, v, reps: int = 7, budget_s: float = 0.5) -> float:
    """Median seconds of step(q, kc, vc, lens, k, v) -> (out, kc, vc) with the caches donated and carried
    from call to call (timing.median_seconds over a call that threads them)."""
    caches = [kc, vc]

    def call():
        out, caches[0], caches[1] = step(q, *caches, lens, k, v)
        return out

    return median_seconds(call, reps=reps, budget_s=budget_s)


def measure(name: str, layout: str, fn, args, kv_bytes: int, copy_bw: float, ref, timer=None,
            budget_s: float = 0.5) -> dict:
    row = dict(impl=name, layout=layout)
    try:
        t0 = time.perf_counter()
        out = fn(*args)
        out = out[0] if isinstance(out, tuple) else out
        jax.block_until_ready(out)
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        row["max_err"] = _err(out, ref)
        del out
        t = timer() if timer else median_seconds(fn, *args, reps=7, budget_s=budget_s)
        row.update(ms=round(t * 1e3, 4), kv_gbps=round(kv_bytes / t / 1e9, 1),
                   copy_fraction=round(kv_bytes / t / copy_bw, 3))
    except Exception as e:  # noqa: BLE001  (a peer that cannot run here: recorded)
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:240] if str(e).strip() else ''}"
    return row


def peers(q, k_cache, v_cache, lens, names, impl: str = "triton"):
    """{(name, layout): (jitted fn, args, timer or None)} for one shape; impl: what "jax_flash_amd" runs."""
    import jax_flash_amd

    b, t = k_cache.shape[:2]
    scale = 1 / math.sqrt(D)
    out = {}
    ours = jax.jit(functools.partial(jax_flash_amd.attention_with_kvcache, implementation=impl))
    if "jax_flash_amd" in names:
        out[("jax_flash_amd", "contiguous")] = (ours, (q, k_cache, v_cache, lens), None)
        for page in PAGES:
            pages_k, table = paged_copy(k_cache, page, 0)
            pages_v, _ = paged_copy(v_cache, page, 0)
            out[("jax_flash_amd", f"paged {page}")] = (
                jax.jit(lambda q, kc, vc, lens, table: jax_flash_amd.attention_with_kvcache(
                    q, kc, vc, lens, block_table=table, implementation=impl)),
                (q, pages_k, pages_v, lens, table), None)
    if "jax_flash_amd+append" in names:
        # the decode step of a generation loop: caches donated; cache_seqlens = capacity - 1, so the new
        # key fills the cache and the attention reads as many keys as the others
        step = jax.jit(lambda q, kc, vc, lens, k, v: jax_flash_amd.attention_with_kvcache(
            q, kc, vc, lens, k=k, v=v, implementation=impl), donate_argnums=(1, 2))
        new = jnp.zeros((b, 1, HEADS_KV, D), q.dtype)

        def timer():
            return time_donated(step, q, jnp.array(k_cache), jnp.array(v_cache), lens - 1, new, new)

        # the last key is overwritten (with zeros): no error column for this row
        out[("jax_flash_amd+append", "contiguous")] = (step, (q, jnp.array(k_cache), jnp.array(v_cache), lens - 1,
                                                              new, new), timer)
    try:
        from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode
    except Exception as e:  # noqa: BLE001
        pallas_decode = e
    q3 = q[:, 0]  # (batch, heads_q, D)
    if "pallas_gqa" in names:
        if isinstance(pallas_decode, Exception):
            out[("pallas_gqa", "contiguous")] = (_raiser(pallas_decode), (), None)
        else:
            out[("pallas_gqa", "contiguous")] = (
                jax.jit(lambda q, k, v, lens: pallas_decode.gqa(q, k, v, kv_seq_len=lens, sm_scale=scale)),
                (q3, k_cache, v_cache, lens), None)
    if "pallas_head_major" in names:
        if isinstance(pallas_decode, Exception):
            out[("pallas_head_major", "contiguous")] = (_raiser(pallas_decode), (), None)
        else:
            kh, vh = (jnp.swapaxes(x, 1, 2) for x in (k_cache, v_cache))  # (batch, heads_kv, T, D), once
            g = HEADS_Q // HEADS_KV

            def head_major(q, k, v, lens):
                per_head = jax.vmap(lambda q, k, v: pallas_decode.mqa(q, k, v, kv_seq_len=lens, sm_scale=scale),
                                    in_axes=(1, 1, 1), out_axes=1)
                return per_head(q.reshape(b, HEADS_KV, g, D), k, v).reshape(b, HEADS_Q, D)

            out[("pallas_head_major", "contiguous")] = (jax.jit(head_major), (q3, kh, vh, lens), None)
    if "pallas_paged" in names:
        try:
            from jax.experimental.pallas.ops.gpu import paged_attention as pallas_paged
        except Exception as e:  # noqa: BLE001
            pallas_paged = e
        for page in PAGES:
            if isinstance(pallas_paged, Exception):
                out[("pallas_paged", f"paged {page}")] = (_raiser(pallas_paged), (), None)
                continue
            pages_k, table = paged_copy(k_cache, page, 0)
            pages_v, _ = paged_copy(v_cache, page, 0)
            # its layout: (heads_kv, pages, page, D); it takes no softmax scale: q comes scaled
            pk, pv = (jnp.transpose(x, (2, 0, 1, 3)) for x in (pages_k, pages_v))
            out[("pallas_paged", f"paged {page}")] = (
                jax.jit(lambda q, k, v, table, lens: pallas_paged.paged_attention(
                    (q * scale).astype(q.dtype), k, v, table, lens)),
                (q3, pk, pv, table, lens), None)
    if "xla" in names:
        out[("xla", "contiguous")] = (jax.jit(functools.partial(jax_flash_amd.attention_with_kvcache,
                                                                implementation="xla")),
                                      (q, k_cache, v_cache, lens), None)
    if "xla_plain" in names:
        out[("xla_plain", "contiguous")] = (jax.jit(plain_xla), (q, k_cache, v_cache), None)
    return out


def plain_xla(q, k, v):
    """The shortest XLA decode over full caches: grouped einsum, float32 softmax, einsum (no lengths, no
    masking), as a user would write it."""
    b, _, h, d = q.shape
    g = h // k.shape[2]
    s = jnp.einsum("bhgd,bkhd->bhgk", q.reshape(b, -1, g, d), k, preferred_element_type=jnp.float32) / math.sqrt(d)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum("bhgk,bkhd->bhgd", p, v).reshape(b, 1, h, d)


def _raiser(e: Exception):
    def fn(*args):
        raise e
    return fn


def sweep(q, k_cache, v_cache, lens, copy_bw: float, kv_bytes: int, page: int | None,
          impl: str = "triton") -> list[dict]:
    """Ours at other decode configs and split counts (kvcache.launches with explicit rows)."""
    from jax_flash_amd import _dispatch, kvcache, plan
    from jax_flash_amd.kernels.configs import DecodeRow
    from jax_flash_amd.rules import Band

    run, target = _dispatch.backend(impl)
    table = None
    if page:
        k_cache, table = paged_copy(k_cache, page, 0)
        v_cache, _ = paged_copy(v_cache, page, 0)
    band = Band.of(True, (-1, -1), 1, k_cache.shape[1])
    default = plan.plan_decode(kvcache.decode_call(target, kvcache.Options(impl, D ** -0.5, band), q, k_cache, table))
    default_splits = default.step("decode").grid[1]
    rows = []
    base = 3 if not page else 5  # the default stages (configs.py: paged rows take two more)
    configs = [(bn, w, s) for bn in (64, 128) for w in (2, 4, 8) for s in (base, base + 1)] + [(32, 4, base)]
    splits = sorted({max(1, default_splits // 2), default_splits * 2, default_splits * 4})
    for (bn, w, s), n in [(c, default_splits) for c in configs] + [((64, 4, base), n) for n in splits]:
        if page and page % bn:
            continue
        row = DecodeRow(f"sweep/decode/16x{bn}w{w}s{s}", block_m=16, block_n=bn, num_warps=w, num_stages=s)
        opts = kvcache.Options(impl, D ** -0.5, band, num_splits=n)
        fn = jax.jit(lambda q, kc, vc, lens, table, row=row, opts=opts: kvcache.launches(
            run, target, opts, q, kc, vc, lens, None, None, table, rows={"decode": row})[0])
        r = measure("sweep", f"paged {page}" if page else "contiguous", fn, (q, k_cache, v_cache, lens, table),
                    kv_bytes, copy_bw, None, budget_s=0.3)
        r.update(BLOCK_N=bn, num_warps=w, num_stages=s, splits=n)
        rows.append(r)
        print(f"  sweep {r['layout']}: BLOCK_N {bn} warps {w} stages {s} splits {n}: "
              f"{r.get('ms', r.get('error'))} ms, {r.get('copy_fraction', '-')} of copy", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict], env: dict) -> str:
    lines = [f"# Decode attention on {env['gpu']} (jax {env['jax']}, triton {env.get('triton', '?')}, {env['date']})",
             "", f"Copy bandwidth (x + 1 over 2 GiB bf16, read + write): **{env['copy_gbps']:.0f} GB/s**. "
             f"bf16, D {D}, {HEADS_Q} query / {HEADS_KV} key-value heads, seq_q 1, caches full.", "",
             "| batch x cache | impl | layout | ms | K+V GB/s | of copy | max err | compile s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["impl"] == "sweep":
            continue
        shape = f"{r['B']} x {r['T']}"
        if "error" in r:
            lines.append(f"| {shape} | {r['impl']} | {r['layout']} | error: {r['error'][:120]} | | | | |")
            continue
        err = f"{r['max_err']:.2g}" if r.get("max_err") is not None else "-"
        lines.append(f"| {shape} | {r['impl']} | {r['layout']} | {r['ms']:.4f} | {r['kv_gbps']:.0f} | "
                     f"{r['copy_fraction']:.2f} | {err} | {r['compile_s']} |")
    lines += ["", f"Targets: K+V read >= {TARGETS['copy_fraction']:.0%} of the copy rate, >= {TARGETS['vs_pallas']}x "
              f"Pallas (its faster contiguous form), >= {TARGETS['vs_xla']}x XLA (the faster one), paged <= "
              f"{TARGETS['paged_over_contiguous']}x contiguous.", "",
              "| batch x cache | of copy | vs Pallas | vs XLA | paged 64 / contiguous | paged 128 / contiguous "
              "| misses |",
              "|---|---|---|---|---|---|---|"]
    for b, t in sorted({(r["B"], r["T"]) for r in rows}, reverse=True):
        def get(impl, layout="contiguous"):
            return next((r for r in rows if r["impl"] == impl and r["layout"] == layout and (r["B"], r["T"]) == (b, t)
                         and "ms" in r), None)

        ours = get("jax_flash_amd")
        if ours is None:
            continue
        pallas = [r for r in (get("pallas_gqa"), get("pallas_head_major")) if r]
        fastest = min(pallas, key=lambda r: r["ms"]) if pallas else None
        xlas = [r for r in (get("xla"), get("xla_plain")) if r]
        xla = min(xlas, key=lambda r: r["ms"]) if xlas else None
        vals = dict(copy_fraction=ours["copy_fraction"],
                    vs_pallas=fastest["ms"] / ours["ms"] if fastest else None,
                    vs_xla=xla["ms"] / ours["ms"] if xla else None)
        paged = [get("jax_flash_amd", f"paged {p}") for p in PAGES]
        ratios = [p["ms"] / ours["ms"] if p else None for p in paged]
        misses = [k for k, v in vals.items() if v is not None and v < TARGETS[k]]
        misses += [f"paged {p}" for p, x in zip(PAGES, ratios)
                   if x is not None and x > TARGETS["paged_over_contiguous"]]
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {b} x {t} | {fmt(vals['copy_fraction'])} | {fmt(vals['vs_pallas'])} | {fmt(vals['vs_xla'])} | "
                     f"{fmt(ratios[0])} | {fmt(ratios[1])} | {', '.join(misses) or 'none'} |")
    sweeps = [r for r in rows if r["impl"] == "sweep" and "ms" in r]
    if sweeps:
        lines += ["", "Sweep (ours, other configs; the default is the config rows of kernels/configs.py):", "",
                  "| batch x cache | layout | BLOCK_N | warps | stages | splits | ms | of copy |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sorted(sweeps, key=lambda r: (r["B"], r["T"], r["layout"], r["ms"])):
            lines.append(f"| {r['B']} x {r['T']} | {r['layout']} | {r['BLOCK_N']} | {r['num_warps']} | "
                         f"{r['num_stages']} | {r['splits']} | {r['ms']:.4f} | {r['copy_fraction']:.2f} |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES),
                    help="comma-separated BATCHxCACHE_LENGTH shapes")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma-separated decode implementations to time")
    ap.add_argument("--sweep", action="store_true", help="also time other decode configs and split counts of ours")
    ap.add_argument("--out", default=None, help="JSON path (None: benchmarks/results/<gpu>_decode.json)")
    ap.add_argument("--implementation", default="triton", help="what jax_flash_amd runs (interpret: a CPU smoke run)")
    ap.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy-bandwidth array, GiB")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from benchmarks.attention import gpu_slug

    names = args.impls.split(",")
    device = jax.devices()[0]
    env = dict(gpu=device.device_kind, jax=jax.__version__, date=time.strftime("%Y-%m-%d"),
               core_count=getattr(device, "core_count", None))
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    copy_bw = copy_bandwidth(args.copy_gib)
    env["copy_gbps"] = round(copy_bw / 1e9, 1)
    print(f"{env}", file=sys.stderr, flush=True)
    out_path = args.out or os.path.join(os.path.dirname(__file__), "results", gpu_slug() + "_decode.json")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        b, t = (int(x) for x in shape.split("x"))
        ks = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(ks[0], (b, 1, HEADS_Q, D), jnp.bfloat16)
        k_cache = jax.random.normal(ks[1], (b, t, HEADS_KV, D), jnp.bfloat16)
        v_cache = jax.random.normal(ks[2], (b, t, HEADS_KV, D), jnp.bfloat16)
        lens = jnp.full((b,), t, jnp.int32)
        kv_bytes = 2 * b * t * HEADS_KV * D * 2
        ref = None
        try:
            import jax_flash_amd
            ref = jax.jit(functools.partial(jax_flash_amd.attention_with_kvcache, implementation="xla"))(
                q, k_cache, v_cache, lens)[:, 0]
        except Exception as e:  # noqa: BLE001
            print(f"no reference at {shape}: {e!r}"[:300], file=sys.stderr)
        for (name, layout), (fn, fargs, timer) in peers(q, k_cache, v_cache, lens, names, args.implementation).items():
            row = measure(name, layout, fn, fargs, kv_bytes, copy_bw, None if timer else ref, timer)
            row.update(B=b, T=t, H=HEADS_Q, H_kv=HEADS_KV, D=D, env=env)
            rows.append(row)
            print(f"{b} x {t} {name} {layout}: {row.get('ms', row.get('error'))} ms, "
                  f"{row.get('copy_fraction', '-')} of copy, err {row.get('max_err')}", file=sys.stderr, flush=True)
            with open(out_path, "w") as fh:
                json.dump(rows, fh, indent=1)
        if args.sweep:
            for page in (None, 64):
                for r in sweep(q, k_cache, v_cache, lens, copy_bw, kv_bytes, page, args.implementation):
                    r.update(B=b, T=t, H=HEADS_Q, H_kv=HEADS_KV, D=D)
                    rows.append(r)
            with open(out_path, "w") as fh:
                json.dump(rows, fh, indent=1)
        del q, k_cache, v_cache, ref
    md = markdown(rows, env)
    with open(os.path.splitext(out_path)[0] + ".md", "w") as fh:
        fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
