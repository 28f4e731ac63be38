"""custom_vjp wiring: residuals are only (q, k, v, out, lse); the backward is Triton too. Both kernel
calls carry vmap and sharding rules (_spmd)."""
from __future__ import annotations

import dataclasses
import functools

import jax

from jax_flash_amd import _launch, _spmd, autotune


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything static about one attention call (hashable: it is the custom_vjp's static argument)."""
    causal: bool
    softmax_scale: float
    implementation: str  # "triton" | "interpret"
    window: tuple[int, int] = (-1, -1)  # (left, right), -1 unbounded

    @property
    def banded(self) -> bool:
        return self.causal or self.window != (-1, -1)


def _backend(opts: Options):
    if opts.implementation == "triton":
        from jax_flash_amd import _triton
        return _triton.run, _triton.target()
    from jax_flash_amd import _interpret
    return _interpret.run, _interpret.TARGET


def _forward(opts: Options, q, k, v):
    run, target = _backend(opts)
    rows = autotune.rows_for(run, target, q, k, opts.banded, opts.softmax_scale, ("fwd",))
    return _launch.forward(run, target, q, k, v, causal=opts.causal, scale=opts.softmax_scale, window=opts.window,
                           rows=rows)


def _backward(opts: Options, q, k, v, out, lse, dout, dlse):
    run, target = _backend(opts)
    rows = autotune.rows_for(run, target, q, k, opts.banded, opts.softmax_scale, ("dkdv", "dq"))
    return _launch.backward(run, target, q, k, v, out, lse, dout, dlse, causal=opts.causal,
                            scale=opts.softmax_scale, window=opts.window, rows=rows)


@functools.cache
def _kernel_calls(opts: Options, group: int):
    """(forward, backward) kernel calls of these options and query heads per key/value head, with
    their vmap and sharding rules."""
    partition = opts.implementation != "interpret"  # host callbacks cannot be partitioned (see _spmd)
    return (_spmd.wrap(functools.partial(_forward, opts), _spmd.FWD_RULE, group, partition),
            _spmd.wrap(functools.partial(_backward, opts), _spmd.BWD_RULE, group, partition))


def _group(q, k) -> int:
    return q.shape[2] // k.shape[2]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def flash_attention(q, k, v, opts: Options):
    """(out, lse) through the Triton kernels; differentiable in q, k, v (also through lse)."""
    return _kernel_calls(opts, _group(q, k))[0](q, k, v)


def _fwd_rule(q, k, v, opts: Options):
    out, lse = _kernel_calls(opts, _group(q, k))[0](q, k, v)
    return (out, lse), (q, k, v, out, lse)


def _bwd_rule(opts: Options, residuals, cotangents):
    q, k, v, out, lse = residuals
    dout, dlse = cotangents
    return _kernel_calls(opts, _group(q, k))[1](q, k, v, out, lse, dout.astype(out.dtype), dlse)


flash_attention.defvjp(_fwd_rule, _bwd_rule)
