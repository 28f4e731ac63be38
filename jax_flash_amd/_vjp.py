"""custom_vjp wiring: residuals are only (q, k, v, out, lse); the backward is Triton too. Both kernel
calls carry vmap and sharding rules (_spmd)."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import _launch, _spmd, autotune, fp8, reference


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything static about one attention call (hashable: it is the custom_vjp's static argument)."""
    causal: bool
    softmax_scale: float
    implementation: str  # "triton" | "interpret"
    window: tuple[int, int] = (-1, -1)  # (left, right), -1 unbounded
    softcap: float = 0.0  # > 0: logits capped with softcap * tanh(logits / softcap)
    alibi: bool = False  # the slopes operand holds ALiBi slopes (else zeros, unused)
    dropout_p: float = 0.0  # > 0: the seeds operand holds Philox keys (reference.dropout_seeds)
    segments: bool = False  # the segment-id operands hold ids (else zeros, unused)

    @property
    def banded(self) -> bool:
        return max(reference.band_edges(self.causal, self.window)) >= 0


def backend(implementation: str):
    """(run, target) of a kernel implementation, "triton" or "interpret"."""
    if implementation == "triton":
        from jax_flash_amd import _triton
        return _triton.run, _triton.target()
    from jax_flash_amd import _interpret
    return _interpret.run, _interpret.TARGET


def _variant(opts: Options, q, slopes, seeds, q_seg, kv_seg, *descales) -> _launch.Variant:
    return _launch.Variant(slopes=slopes if opts.alibi else None, seeds=seeds if opts.dropout_p > 0 else None,
                           dropout_p=opts.dropout_p, q_segment_ids=q_seg if opts.segments else None,
                           kv_segment_ids=kv_seg if opts.segments else None,
                           descales=descales if fp8.is_fp8(q.dtype) else None)


def _rows(opts: Options, run, target, q, k, kernels):
    # autotuned rows are timed without dropout and in 16-bit types; other calls keep the defaults
    if opts.dropout_p > 0 or fp8.is_fp8(q.dtype):
        return None
    return autotune.rows_for(run, target, q, k, opts.banded, opts.softmax_scale, kernels)


def _forward(opts: Options, q, k, v, *variant):
    run, target = backend(opts.implementation)
    rows = _rows(opts, run, target, q, k, ("fwd",))
    return _launch.forward(run, target, q, k, v, _variant(opts, q, *variant), causal=opts.causal,
                           scale=opts.softmax_scale, window=opts.window, softcap=opts.softcap, rows=rows)


def _backward(opts: Options, q, k, v, slopes, seeds, q_seg, kv_seg, q_descale, k_descale, v_descale, out, lse,
              dout, dlse):
    run, target = backend(opts.implementation)
    rows = _rows(opts, run, target, q, k, ("dkdv", "dq"))
    variant = _variant(opts, q, slopes, seeds, q_seg, kv_seg, q_descale, k_descale, v_descale)
    return _launch.backward(run, target, q, k, v, out, lse, dout, dlse, variant,
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


def variant_operands(q, k, slopes=None, seeds=None, q_segment_ids=None, kv_segment_ids=None, descales=None
                     ) -> tuple:
    """flash_attention's `variant` argument: the given arrays, zeros of the right shape for the others
    (one fixed operand list keeps one sharding rule; the Options flags and q's dtype say which are
    real). descales: (q, k, v) descales, (batch, heads_kv) float32 each, fp8 inputs only."""
    b, sq, h, _ = q.shape
    return (jnp.zeros((b, h), jnp.float32) if slopes is None else slopes,
            jnp.zeros((b, h, 2), jnp.uint32) if seeds is None else seeds,
            jnp.zeros((b, sq), jnp.int32) if q_segment_ids is None else q_segment_ids,
            jnp.zeros((b, k.shape[1]), jnp.int32) if kv_segment_ids is None else kv_segment_ids,
            *((jnp.zeros((b, k.shape[2]), jnp.float32),) * 3 if descales is None else descales))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def flash_attention(q, k, v, variant: tuple, opts: Options):
    """(out, lse) through the Triton kernels; differentiable in q, k, v (also through lse), except for
    float8 inputs (forward only). variant (variant_operands): ALiBi slopes (batch, heads_q) float32,
    dropout keys (batch, heads_q, 2) uint32, segment ids (batch, seq_q) / (batch, seq_k) int32, fp8
    descales (batch, heads_kv) float32 (q, k, v); constants: their cotangent is zero, as in FlashAttention."""
    return _kernel_calls(opts, _group(q, k))[0](q, k, v, *variant)


def _fwd_rule(q, k, v, variant, opts: Options):
    out, lse = _kernel_calls(opts, _group(q, k))[0](q, k, v, *variant)
    return (out, lse), (q, k, v, variant, out, lse)


def _zero_cotangent(x):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return np.zeros(x.shape, jax.dtypes.float0)
    return jnp.zeros_like(x)


def _bwd_rule(opts: Options, residuals, cotangents):
    q, k, v, variant, out, lse = residuals
    if fp8.is_fp8(q.dtype):
        raise TypeError(fp8.NO_GRADIENT)
    dout, dlse = cotangents
    dq, dk, dv = _kernel_calls(opts, _group(q, k))[1](q, k, v, *variant, out, lse, dout.astype(out.dtype), dlse)
    return dq, dk, dv, tuple(_zero_cotangent(x) for x in variant)


flash_attention.defvjp(_fwd_rule, _bwd_rule)
