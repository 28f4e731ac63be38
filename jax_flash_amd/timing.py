"""Wall-clock timing of jitted JAX calls, shared by the autotuner, the benchmarks and the examples."""
from __future__ import annotations

import time

import jax
import numpy as np


def median_seconds(fn, *args, reps: int = 5, budget_s: float = 0.0) -> float:
    """Median seconds per call of fn(*args) after two warm-up calls (the first compiles). Each of the
    `reps` samples averages enough back-to-back calls to fill budget_s / reps (at least one, at most
    100), so short calls are not dominated by dispatch jitter."""
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, min(100, int(budget_s / reps / one)))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / n)
    return float(np.median(samples))
