"""Shared test helpers: which kernel implementation runs here, inputs, the tolerance rule, and a runner
for test files that need several host devices."""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
import oracle

ON_GPU = jax.default_backend() != "cpu"

# The kernels run as "triton" on a GPU (marked gpu) and as "interpret" on the CPU.
KERNEL_IMPLS = [
    pytest.param("triton", marks=[pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a GPU")]),
    pytest.param("interpret", marks=pytest.mark.skipif(
        ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")),
]


def inputs(shape_q, shape_k, dtype, seed=0, q_scale=1.0):
    ks = jax.random.split(jax.random.key(seed), 5)
    q = (jax.random.normal(ks[0], shape_q, jnp.float32) * q_scale).astype(dtype)
    k = jax.random.normal(ks[1], shape_k, jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], shape_k, jnp.float32).astype(dtype)
    dout = jax.random.normal(ks[3], shape_q, jnp.float32).astype(dtype)
    b, sq, h, _ = shape_q
    dlse = jax.random.normal(ks[4], (b, h, sq), jnp.float32)
    return q, k, v, dout, dlse


def run(impl, q, k, v, dout, dlse, **kw):
    """Forward and a vjp with random cotangents on both out and lse: dict(out, lse, dq, dk, dv).

    Under one jit: on the CPU, eager dispatch compiles every op of the reference and of the kernels'
    wrappers for each new shape (~3 s a test); one program compiles in a third of that. kw (masks,
    slopes, keys) stays concrete, closed over; eager calls are tested elsewhere (test_errors, test_fp8,
    test_dropout, test_flax)."""
    def fwd_bwd(q, k, v, dout, dlse):
        def f(q, k, v):
            return jax_flash_amd.attention(q, k, v, return_lse=True, implementation=impl, **kw)

        (out, lse), vjp = jax.vjp(f, q, k, v)
        dq, dk, dv = vjp((dout, dlse))
        return dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)

    return jax.jit(fwd_bwd)(q, k, v, dout, dlse)


def fwd_bwd_through(run, target, statics, rows=None, policy=None):
    """fwd_bwd(q, k, v, dout, dlse, extras) -> dict(out, lse, dq, dk, dv) through _launch's forward and backward
    (the plan of `policy`, with `rows` forced), each launch through `run` (a backend's run, or one that records
    what it launches)."""
    from jax_flash_amd import _launch

    def fwd_bwd(q, k, v, dout, dlse, extras):
        out, lse2 = _launch.forward(run, target, q, k, v, extras, statics=statics, rows=rows, policy=policy)
        grads = _launch.backward(run, target, q, k, v, out, lse2, dout, dlse, extras, statics=statics, rows=rows,
                                 policy=policy)
        return dict(out=out, lse=lse2 * np.log(2), **dict(zip(("dq", "dk", "dv"), grads)))

    return fwd_bwd


def _np(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def assert_close(got, ref, base, dtype, names=("out", "lse", "dq", "dk", "dv")):
    """FlashAttention's rule: the kernel's max error against float64 is at most 2x (forward) / 3x
    (backward) that of a same-dtype computation done the way a fused kernel does it (`base`: the
    reference implementation in the input dtype), plus a floor: one unit of the dtype's precision at
    the tensor's scale (the output rounding both incur) and 1e-6 of it (float32 summation order,
    which matters where gradients cancel, e.g. dq with a single visible key), or 2 eps32 max|lse| of it
    where that is more (float32 logits of large magnitude, below)."""
    eps = float(jnp.finfo(dtype).eps)
    # A float32 logit s is only known to ~eps32 |s| (absolute; 1 ulp is 1.5e-5 at |s| = 130), so each
    # P = exp(s - lse) a backward recomputes, from its own logit and the forward's lse (rounded
    # independently), has a relative error of up to ~2 eps32 max|lse|, and so has every output linear in
    # P. `base` gets these errors to cancel, as its backward's logits come from the same XLA dot as its
    # forward's, bit for bit; a kernel's need not: in Triton's interpreter they are numpy matmuls of
    # q.k^T (forward) and k.q^T (dK/dV), which OpenBLAS's AVX2 kernel ("Haswell", also chosen on AMD
    # Zen 1-3) rounds differently, while its AVX-512 kernel (and the older ones tried) does not. So q x 30
    # logits (|lse| <= 133, test_large_logits_stay_finite) give dv errors of 1.1e-4 on one x86-64 CPU
    # and 2.4e-5 on another, against base's 1.5e-5 (git show 20f7913:benchmarks/fp32_large_logits.py);
    # this term allows 2.3e-4. At ordinary logit scales it is about the 1e-6 floor, and at 16 bits far
    # below eps.
    lse = ref["lse"][np.isfinite(ref["lse"])] if "lse" in ref else np.zeros(0)
    f32_floor = max(1e-6, 2 * float(jnp.finfo(jnp.float32).eps) * (np.max(np.abs(lse)) if lse.size else 0.0))
    for name in names:
        g, r, b = _np(got[name]), ref[name], _np(base[name])
        assert not np.isnan(g).any(), f"{name}: NaN in output"
        if name == "lse":  # rows that see no key: exactly -inf in both
            np.testing.assert_array_equal(np.isneginf(g), np.isneginf(r), err_msg="lse: -inf rows differ")
            fin = np.isfinite(r)
            g, r, b = g[fin], r[fin], b[fin]
            eps = float(jnp.finfo(jnp.float32).eps)
        if r.size == 0:
            continue
        err, base_err = np.max(np.abs(g - r)), np.max(np.abs(b - r))
        factor = 2.0 if name in ("out", "lse") else 3.0
        scale = np.max(np.abs(r))
        bound = factor * base_err + eps * scale + f32_floor * max(scale, 1.0)
        assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g} (same-dtype reference: {base_err:.3g})"


def run_on_8_host_devices(cases: str, at_least: int) -> None:
    """Runs the test file `cases` (beside this one) in a process of its own with 8 CPU host devices
    (XLA_FLAGS must be set before jax initialises, which in this process it already has), from the
    repository root so the package beside these tests is the one imported (with the default addopts,
    so its cases share the cores as pytest-xdist workers); asserts it passes with at
    least `at_least` tests."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
               TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(here, cases)], env=env, cwd=os.path.dirname(here),
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= at_least, proc.stdout[-2000:]
