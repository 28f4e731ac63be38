"""custom_vjp wiring: residuals are only (q, k, v, out, lse); the backward is Triton too."""
from __future__ import annotations

import dataclasses
import functools

import jax

from jax_flash_amd import _launch, autotune


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything static about one attention call (hashable: it is the custom_vjp's static argument)."""
    causal: bool
    softmax_scale: float
    implementation: str  # "triton" | "interpret"


def _backend(opts: Options):
    if opts.implementation == "triton":
        from jax_flash_amd import _triton
        return _triton.run, _triton.target()
    from jax_flash_amd import _interpret
    return _interpret.run, _interpret.TARGET


def _forward(q, k, v, opts: Options):
    run, target = _backend(opts)
    rows = autotune.rows_for(run, target, q, k, opts.causal, opts.softmax_scale, ("fwd",))
    return _launch.forward(run, target, q, k, v, causal=opts.causal, scale=opts.softmax_scale, rows=rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def flash_attention(q, k, v, opts: Options):
    """(out, lse) through the Triton kernels; differentiable in q, k, v (also through lse)."""
    return _forward(q, k, v, opts)


def _fwd_rule(q, k, v, opts: Options):
    out, lse = _forward(q, k, v, opts)
    return (out, lse), (q, k, v, out, lse)


def _bwd_rule(opts: Options, residuals, cotangents):
    q, k, v, out, lse = residuals
    dout, dlse = cotangents
    run, target = _backend(opts)
    rows = autotune.rows_for(run, target, q, k, opts.causal, opts.softmax_scale, ("dkdv", "dq"))
    return _launch.backward(run, target, q, k, v, out, lse, dout.astype(out.dtype), dlse,
                            causal=opts.causal, scale=opts.softmax_scale, rows=rows)


flash_attention.defvjp(_fwd_rule, _bwd_rule)
