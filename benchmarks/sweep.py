"""Config experiments on the GPU, as data: each candidate is a plan.Policy change (forced rows, Gluon row tables, rule
numbers), timed against the default plan on the same call and checked against its result.

    python -m benchmarks.sweep [--sets gluonwindowcarry,gluondkdvpersistent,...] [--json OUT.json]

A case times the forward ("fwd") or the whole backward ("bwd"), so a difference is what the candidate changes; a
candidate that compiles but computes something else shows as its max error relative to the largest reference value.
docs/tuning.md records what each experiment found, by row name.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp

from jax_flash_amd import _launch, _triton, plan, reference
from jax_flash_amd.fp8 import quantize_fp8
from jax_flash_amd.kernels import configs
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band
from jax_flash_amd.timing import median_seconds


@dataclasses.dataclass(frozen=True)
class Case:
    """A call: (batch, seq, heads, head_dim), its band and variant, and which part of it is timed."""
    shape: tuple[int, int, int, int]
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    dropout: float = 0.0
    fp8: bool = False
    bias: bool = False  # a (1, heads, seq, seq) bias
    part: str = "fwd"  # fwd or bwd
    kv_heads: int = 0  # key / value heads (GQA); 0: as many as the query heads


def _gluon_fwd(**change):
    return dict(gluon_fwd=tuple(r.but(f"{r.name}-sweep", **change) for r in configs.SM90_GLUON_FWD))


def _gluon_dkdv(*extra, **change):
    rows = tuple(r.but(f"{r.name}-sweep", **change) for r in configs.SM90_GLUON_DKDV)
    return dict(gluon_dkdv=rows + tuple(extra))


# name -> (cases, {candidate name: Policy.replace arguments})
EXPERIMENTS = {
    # narrow windows through the persistent Gluon forward (a row's `window`), CARRY off and on, against the
    # "+window" Triton rows the default takes at D 128
    "gluonwindowcarry": (
        [Case((1, 16384, 16, 128), window=(1024, 0)), Case((1, 16384, 16, 128), False, (256, 256)),
         Case((4, 4096, 32, 64), window=(1024, 0))],
        {f"persistent-window-carry{c}": _gluon_fwd(window=True, persistent=1, carry=bool(c)) for c in (0, 1)}),
    # the Gluon dK/dV on a persistent grid (every row made persistent ahead of the tiled ones), by the balance rule
    # and at any balance
    "gluondkdvpersistent": (
        [Case((16384 // n, n, 16, 128), causal, part="bwd") for n in (1024, 4096, 16384) for causal in (False, True)]
        + [Case((1, 16384, 16, 128), w[1] == 0, w, part="bwd") for w in ((1024, 0), (256, 256))],
        {"persistent": _gluon_dkdv(*configs.SM90_GLUON_DKDV, persistent=1),
         "persistent-any-balance": dict(_gluon_dkdv(*configs.SM90_GLUON_DKDV, persistent=1),
                                        persistent_balance=float("inf"), persistent_banded_blocks=1 << 30)}),
    # SPANS: each consumer group skips the query steps that see none of its keys (narrow windows), tiled and persistent
    "gluondkdvspans": (
        [Case((1, 16384, 16, 128), w[1] == 0, w, part="bwd") for w in ((1024, 0), (256, 256))]
        + [Case((4, 4096, 32, 64), window=(1024, 0), part="bwd")],
        {"spans": _gluon_dkdv(spans=True), "spans-persistent": _gluon_dkdv(
            *(r.but(f"{r.name}-spans", spans=True) for r in configs.SM90_GLUON_DKDV), spans=True, persistent=1)}),
    # a dense bias on the pointer rows: the forward's and dQ's D 128 tiles
    "densebias": (
        [Case((4, 4096, 16, 128), causal, bias=True, part=part) for causal in (False, True) for part in ("fwd", "bwd")],
        {f"fwd-{m}x{n}w{w}s{s}": dict(rows={"fwd": configs.Row(f"sweep/fwd/{m}x{n}w{w}s{s}", m, n, w, s,
                                                                 max_width=128)})
         for m, n, w, s in ((128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2))}),
    # a dense bias through the Gluon forward and dK/dV (the dS path) against the pointer rows
    "gluondense": (
        [Case((4, 4096, 16, 128), causal, bias=True, part=part) for causal in (False, True) for part in ("fwd", "bwd")],
        {"gluon": dict(gluon_dense=True)}),
    # the llama3.1 shapes (64 / 8 heads): the dS path in head-group launches (N 8192: four of 128 programs, causal
    # 0.68x cuDNN's backward) against seven products and dK/dV per query head
    "llamads": (
        [Case((1, n, 64, 128), causal, part="bwd", kv_heads=8) for causal in (True, False)
         for n in (8192, 2048, 16384, 4096)],
        {"seven": dict(ds_workspace_bytes=0), "perqueryhead": dict(dkdv_per_query_head=True)}),
}


def _inputs(case: Case):
    b, n, h, d = case.shape
    keys = jax.random.split(jax.random.key(0), 5)
    q, k, v, do = (jax.random.normal(x, (b, n, h if i in (0, 3) else case.kv_heads or h, d), jnp.bfloat16)
                   for i, x in enumerate(keys[:4]))
    extras = Operands(seeds=reference.dropout_seeds(jax.random.key(1), b, h) if case.dropout else None,
                      bias=jax.random.normal(keys[4], (1, h, n, n), jnp.bfloat16) if case.bias else None)
    if case.fp8:  # forward only: per-head quantised inputs and their descales
        (q, qd), (k, kd), (v, vd) = (quantize_fp8(x) for x in (q, k, v))
        extras = Operands(q_descale=qd, k_descale=kd, v_descale=vd)
    return q, k, v, do, extras


def _error(got, want) -> float:
    worst = 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        w = w.astype(jnp.float32)
        worst = max(worst, float(jnp.max(jnp.abs(g.astype(jnp.float32) - w)) / jnp.max(jnp.abs(w))))
    return worst


def run_case(case: Case, candidates: dict) -> dict:
    target = _triton.target()
    q, k, v, do, extras = _inputs(case)
    b, n, h, d = case.shape
    statics = _launch.Statics(d ** -0.5, Band.of(case.causal, case.window, n, n), dropout_p=case.dropout)
    out, lse = _launch.forward(_triton.run, target, q, k, v, extras, statics=statics)

    def timed(policy):
        if case.part == "fwd":
            f = jax.jit(lambda q, k, v: _launch.forward(_triton.run, target, q, k, v, extras, statics=statics,
                                                        policy=policy)[0])
            args = (q, k, v)
        else:
            f = jax.jit(lambda q, k, v: _launch.backward(_triton.run, target, q, k, v, out, lse, do,
                                                         jnp.zeros_like(lse), extras, statics=statics, policy=policy))
            args = (q, k, v)
        return f(*args), median_seconds(f, *args, budget_s=0.3) * 1e3

    want, default_ms = timed(plan.DEFAULT)
    line = dict(dataclasses.asdict(case), default_ms=round(default_ms, 4))
    for name, change in candidates.items():
        try:
            got, ms = timed(plan.DEFAULT.replace(**change))
            line[name] = dict(ms=round(ms, 4), err=round(_error(got, want), 5))
        except Exception as e:  # noqa: BLE001  (a candidate that fails to compile or launch is recorded)
            line[name] = f"{type(e).__name__}: {str(e)[:120]}"
    return line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sets", default=",".join(EXPERIMENTS), help="comma-separated experiments to run")
    p.add_argument("--json", default="/tmp/sweep.json", help="where to write every case's timings")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    print("target", _triton.target(), flush=True)
    results = []
    for name in args.sets.split(","):
        cases, candidates = EXPERIMENTS[name]
        for case in cases:
            line = dict(experiment=name, **run_case(case, candidates))
            print(json.dumps(line), flush=True)
            results.append(line)
    json.dump(results, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
