"""Opt-in autotuning of the kernels' block configs.

By default every launch uses the heuristic config of ``kernels/configs.py`` (``TARGETS``: by target and
head width). With autotuning on, the first call for a key times each candidate of ``configs.CANDIDATES``
(at most 8 per kernel) on random inputs of the call's shape and keeps the fastest::

    jax_flash_amd.autotune.enable()          # or: with jax_flash_amd.autotune.enabled(): ...
    out = jax_flash_amd.attention(q, k, v, causal=True)   # tunes while this call is traced

The key is (target, kernel, head width, dtype, config row kind, band, length bucket): candidates are
timed on the call's own band (causal, sliding window) and row kind (plain, window, gqa), and sequence
lengths fall into a few coarse buckets (``BUCKETS``), so a new length in a known bucket reuses the
choice instead of re-tuning (and recompiling) per length. Tuning runs the candidates eagerly while the
caller is being traced, so the first trace of a new key takes seconds to minutes (one Triton compile per candidate). ``table()``
lists the choices, ``forget()`` drops them, and the logger ``jax_flash_amd.autotune`` at INFO level
prints every candidate's time (a config sweep: that is how kernels/configs.py's defaults are chosen).
The forward is tuned on the first forward, dK/dV and dQ on the first backward (dQ's kernel of the path the
call's plan launches: "dq" for seven products, "dqds" for the dS path; jax_flash_amd.plan).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time

import jax
import jax.numpy as jnp

from jax_flash_amd import _launch, plan
from jax_flash_amd.operands import Operands
from jax_flash_amd.timing import median_seconds
from jax_flash_amd.kernels import configs

log = logging.getLogger(__name__)

BUCKETS = (1024, 4096, 16384)  # longest sequence <= bucket; anything longer is one last bucket
_enabled = False
_table: dict[tuple, dict] = {}


def enable(on: bool = True) -> None:
    """Turn autotuning on (or off) for calls traced from now on. Already compiled functions keep their configs."""
    global _enabled
    _enabled = bool(on)


def is_enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def enabled(on: bool = True):
    """Context manager form of enable(): restores the previous setting on exit."""
    before = _enabled
    enable(on)
    try:
        yield
    finally:
        enable(before)


def table() -> dict[tuple, dict]:
    """{(target, kernel, width, dtype, row kind, band, bucket): chosen config row} for every key tuned so far."""
    return dict(_table)


def forget() -> None:
    _table.clear()


def bucket(seq_q: int, seq_k: int) -> int | None:
    """Coarse length class of a call: the first BUCKETS entry >= max(seq_q, seq_k), None beyond."""
    longest = max(seq_q, seq_k)
    return next((b for b in BUCKETS if longest <= b), None)


def candidates(target: str, kernel: str, head_dim: int, dtype) -> list[configs.Row]:
    """configs.CANDIDATES rows of the narrowest class covering this head and dtype (empty: nothing to tune)."""
    call = plan.Call(target, 1, 1, 1, 1, 1, head_dim, jnp.dtype(dtype).name)
    rows = [r for r in configs.CANDIDATES.get(target, {}).get(kernel, ()) if plan.fits(r, call.width, call.dtype)]
    narrowest = min((r.max_width for r in rows), default=None)
    return [r for r in rows if r.max_width == narrowest]


def _key(call: plan.Call, kernel: str):
    return (call.target, kernel, call.width, call.dtype, call.kind, (call.band.left, call.band.right),
            bucket(call.seq_q, call.seq_k))


def rows_for(run, target: str, q, k, extras: Operands, statics: _launch.Statics, kernels: tuple[str, ...],
             policy: plan.Policy | None = None) -> dict | None:
    """{kernel: row} for these kernels ("fwd", "dkdv", "dq", "dqds"), tuning missing keys first; None when
    autotuning is off or the call is not tunable (plan.tunable). Only the Triton kernels the call's plan runs
    are tuned (the Gluon kernels, faster than the candidates, are left as they are)."""
    if not _enabled:
        return None
    call = _launch.call_of(target, q, k, extras, statics, policy=policy)
    if not plan.tunable(call):
        return None
    if call.policy.linear_backward:  # its kernel is not among the candidates' (the dK/dV and dQ kernels')
        kernels = tuple(name for name in kernels if name == "fwd")
    rows = {}
    for kernel in kernels:
        now = dataclasses.replace(call, policy=call.policy.replace(rows={**dict(call.policy.rows), **rows}))
        step = (plan.plan_forward(now) if kernel == "fwd" else plan.plan_backward(now)).step(kernel)
        if step is None or step.kernel.endswith("_sm90"):
            continue  # not launched by this call's plan, or a Gluon kernel
        key = _key(call, kernel)
        if key not in _table:
            _table[key] = _tune(run, target, kernel, q, k, statics, rows)
        rows[kernel] = _table[key]
    return rows


def _tune(run, target, kernel, q, k, statics: _launch.Statics, chosen) -> configs.Row:
    """Time each candidate of one kernel (the others at their chosen or default rows) on the call's band
    and scores, without its optional operands; return the fastest."""
    rows = candidates(target, kernel, q.shape[3], q.dtype)
    if not rows:
        return None
    t_start = time.perf_counter()
    with jax.ensure_compile_time_eval():  # run now, even while the caller is being traced
        keys = jax.random.split(jax.random.key(0), 4)
        qr, do = (jax.random.normal(kk, q.shape, q.dtype) for kk in keys[:2])
        kr, vr = (jax.random.normal(kk, k.shape, k.dtype) for kk in keys[2:])
        fwd = functools.partial(_launch.forward, run, target, statics=statics)
        if kernel != "fwd":
            out, lse = jax.jit(fwd)(qr, kr, vr)
        best, best_time = None, float("inf")
        for row in rows:
            trial = {**{k_: v for k_, v in chosen.items() if v is not None}, kernel: row}
            try:
                if kernel == "fwd":
                    t = median_seconds(jax.jit(functools.partial(fwd, rows=trial)), qr, kr, vr)
                else:
                    bwd = functools.partial(_launch.backward, run, target, statics=statics, rows=trial)
                    t = median_seconds(jax.jit(bwd), qr, kr, vr, out, lse, do, jnp.zeros_like(lse))
            except Exception as e:  # a candidate that does not fit this GPU (e.g. shared memory) is skipped
                log.info("autotune: %s %s failed: %s", kernel, row.name, str(e).splitlines()[0][:200])
                continue
            log.info("autotune: %s %s: %.3f ms", kernel, row.name, t * 1e3)
            if t < best_time:
                best, best_time = row, t
    if best is None:
        raise RuntimeError(f"autotune: no candidate config of {kernel} ran for head_dim={q.shape[3]}, "
                           f"dtype={q.dtype} on {target}")
    log.info("autotune: %s head_dim=%d %s band=%s bucket=%s -> %s (%.3f ms; %d candidates in %.1f s)",
             kernel, q.shape[3], q.dtype, statics.band, bucket(q.shape[1], k.shape[1]), best.name, best_time * 1e3,
             len(rows), time.perf_counter() - t_start)
    return best
