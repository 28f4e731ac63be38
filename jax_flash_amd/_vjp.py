"""custom_vjp wiring: residuals are only (q, k, v, out, lse); the backward is Triton too. Both kernel
calls carry vmap and sharding rules (_spmd)."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_flash_amd import _launch, _spmd, autotune, reference


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything static about one attention call (hashable: it is the custom_vjp's static argument)."""
    causal: bool
    softmax_scale: float
    implementation: str  # "triton" | "interpret"
    window: tuple[int, int] = (-1, -1)  # (left, right), -1 unbounded
    softcap: float = 0.0  # > 0: logits capped with softcap * tanh(logits / softcap)
    alibi: bool = False  # the slopes operand holds ALiBi slopes (else zeros, unused)

    @property
    def banded(self) -> bool:
        return max(reference.band_edges(self.causal, self.window)) >= 0


def _backend(opts: Options):
    if opts.implementation == "triton":
        from jax_flash_amd import _triton
        return _triton.run, _triton.target()
    from jax_flash_amd import _interpret
    return _interpret.run, _interpret.TARGET


def _forward(opts: Options, q, k, v, slopes):
    run, target = _backend(opts)
    rows = autotune.rows_for(run, target, q, k, opts.banded, opts.softmax_scale, ("fwd",))
    return _launch.forward(run, target, q, k, v, slopes if opts.alibi else None, causal=opts.causal,
                           scale=opts.softmax_scale, window=opts.window, softcap=opts.softcap, rows=rows)


def _backward(opts: Options, q, k, v, slopes, out, lse, dout, dlse):
    run, target = _backend(opts)
    rows = autotune.rows_for(run, target, q, k, opts.banded, opts.softmax_scale, ("dkdv", "dq"))
    return _launch.backward(run, target, q, k, v, out, lse, dout, dlse, slopes if opts.alibi else None,
                            causal=opts.causal, scale=opts.softmax_scale, window=opts.window, softcap=opts.softcap,
                            rows=rows)


@functools.cache
def _kernel_calls(opts: Options, group: int):
    """(forward, backward) kernel calls of these options and query heads per key/value head, with
    their vmap and sharding rules."""
    partition = opts.implementation != "interpret"  # host callbacks cannot be partitioned (see _spmd)
    return (_spmd.wrap(functools.partial(_forward, opts), _spmd.FWD_RULE, group, partition),
            _spmd.wrap(functools.partial(_backward, opts), _spmd.BWD_RULE, group, partition))


def _group(q, k) -> int:
    return q.shape[2] // k.shape[2]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def flash_attention(q, k, v, slopes, opts: Options):
    """(out, lse) through the Triton kernels; differentiable in q, k, v (also through lse). slopes:
    (batch, heads_q) float32 ALiBi slopes when opts.alibi (zeros otherwise); constants: their cotangent
    is zero, as in FlashAttention."""
    return _kernel_calls(opts, _group(q, k))[0](q, k, v, slopes)


def _fwd_rule(q, k, v, slopes, opts: Options):
    out, lse = _kernel_calls(opts, _group(q, k))[0](q, k, v, slopes)
    return (out, lse), (q, k, v, slopes, out, lse)


def _bwd_rule(opts: Options, residuals, cotangents):
    q, k, v, slopes, out, lse = residuals
    dout, dlse = cotangents
    dq, dk, dv = _kernel_calls(opts, _group(q, k))[1](q, k, v, slopes, out, lse, dout.astype(out.dtype), dlse)
    return dq, dk, dv, jnp.zeros_like(slopes)


flash_attention.defvjp(_fwd_rule, _bwd_rule)
