"""The dispatch layer: the implementations (one registry), the static options of a call, and the
custom_vjp that carries the Triton kernels' forward and backward. Data flows one way:
api (checks) -> Options + Operands -> here -> _launch (kernel launches) -> kernels.

Residuals are only (q, k, v, out, lse, the optional operands); the backward is Triton too. Both kernel
calls carry vmap and sharding rules (_spmd) derived from the optional operands present.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import _launch, _spmd, autotune, fp8, plan, reference, rules
from jax_flash_amd.operands import Operands


@dataclasses.dataclass(frozen=True)
class Backend:
    """A kernel implementation: the module that runs launches (run(Launch) -> outputs, target(),
    check_available()), and whether its calls may be partitioned (host callbacks may not: JAX frees
    callbacks lowered inside a custom_partitioning rule too early, jax-ml/jax#23620)."""
    module: str | None  # None: the pure-JAX reference, no kernels
    partitionable: bool = True

    def load(self):
        import importlib
        return importlib.import_module(self.module)


BACKENDS = {
    "triton": Backend("jax_flash_amd._triton"),  # compiled kernels through jax-triton (CUDA or ROCm)
    "interpret": Backend("jax_flash_amd._interpret", partitionable=False),  # Triton's interpreter, CPU
    "xla": Backend(None),  # reference.attention: pure JAX, any backend, O(N^2) memory
}
IMPLEMENTATIONS = tuple(BACKENDS)


def choose_implementation(implementation: str | None) -> str:
    """The implementation a call runs: the one asked for (checked to be usable here), or by default
    "triton" on a GPU backend, else "interpret" when TRITON_INTERPRET=1, else "xla"."""
    if implementation is None:
        if BACKENDS["triton"].load().on_gpu():
            implementation = "triton"
        elif os.environ.get("TRITON_INTERPRET") == "1":
            implementation = "interpret"
        else:
            implementation = "xla"
    if implementation not in BACKENDS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")
    if BACKENDS[implementation].module:
        BACKENDS[implementation].load().check_available()
    return implementation


def backend(implementation: str):
    """(run, target) of a kernel implementation, "triton" or "interpret"."""
    module = BACKENDS[implementation].load()
    return module.run, module.target()


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything static about one call (hashable: the custom_vjp's static argument). Which optional
    operands are present is not here: it is the structure of the Operands pytree."""
    implementation: str
    softmax_scale: float
    band: rules.Band = rules.Band()  # after the causal cap and clamping (rules.Band.of)
    softcap: float = 0.0  # > 0: logits capped with softcap * tanh(logits / softcap)
    dropout_p: float = 0.0  # > 0: Operands.seeds holds the dropout seeds
    policy: plan.Policy = plan.DEFAULT  # plan.active() where the call was made
    deterministic: bool = True  # False: the backward may sum in an order that varies

    @property
    def statics(self) -> _launch.Statics:
        return _launch.Statics(self.softmax_scale, self.band, self.softcap, self.dropout_p, self.deterministic)


def attention(q, k, v, extras: Operands, opts: Options):
    """(out, lse) of checked inputs with the chosen implementation; differentiable in q, k, v."""
    impl = _reference if opts.implementation == "xla" else flash_attention
    return _spmd.auto_axes(lambda q, k, v, extras: impl(q, k, v, extras, opts), (q, k, v, extras),
                           _spmd.attention_specs(q))


def _reference(q, k, v, extras: Operands, opts: Options):
    fp8_inputs = fp8.is_fp8(q.dtype)
    if fp8_inputs:  # the reference dequantises and computes in float32
        q, k, v = (fp8.forward_only(x) for x in (q, k, v))
        q = fp8.dequantize(q, jnp.repeat(extras.q_descale, q.shape[2] // k.shape[2], axis=1))  # per kv head
        k, v = fp8.dequantize(k, extras.k_descale), fp8.dequantize(v, extras.v_descale)
    out, lse = reference.attention(q, k, v, **_reference_options(extras, opts))
    return (out.astype(jnp.bfloat16), lse) if fp8_inputs else (out, lse)


def _reference_options(extras: Operands, opts: Options) -> dict:
    return dict(band=opts.band, softmax_scale=opts.softmax_scale, softcap=opts.softcap, alibi_slopes=extras.slopes,
                dropout_p=opts.dropout_p, dropout_seeds=extras.seeds, q_segment_ids=extras.q_segment_ids,
                kv_segment_ids=extras.kv_segment_ids, positions=extras.positions, bias=extras.bias, mask=extras.mask)


def _forward(opts: Options, treedef, q, k, v, *leaves):
    run, target = backend(opts.implementation)
    extras = jax.tree.unflatten(treedef, leaves)
    rows = autotune.rows_for(run, target, q, k, extras, opts.statics, ("fwd",), opts.policy)
    return _launch.forward(run, target, q, k, v, extras, statics=opts.statics, rows=rows, policy=opts.policy)


def _backward(opts: Options, treedef, q, k, v, *rest):
    *leaves, out, lse2, dout, dlse = rest
    run, target = backend(opts.implementation)
    extras = jax.tree.unflatten(treedef, leaves)
    rows = autotune.rows_for(run, target, q, k, extras, opts.statics, ("dkdv", "dq", "dqds"), opts.policy)
    return _launch.backward(run, target, q, k, v, out, lse2, dout, dlse, extras, statics=opts.statics, rows=rows,
                            policy=opts.policy)


LN2 = 0.6931471805599453
ONCE = ("jax_flash_amd.attention's kernels are differentiable once (their backward is a Triton kernel "
        "with no derivative of its own). For higher-order derivatives use implementation='xla'.")


def _first_order_only(fn):
    """fn, whose derivative raises a clear TypeError (instead of JAX's message about callbacks or
    custom calls without a JVP rule)."""
    wrapped = jax.custom_jvp(fn)

    @wrapped.defjvp
    def _jvp(primals, tangents):
        raise TypeError(ONCE)

    return wrapped


@functools.cache
def _kernel_calls(opts: Options, group: int, treedef, axes: tuple[str, ...]):
    """(forward, backward) kernel calls of these options, query heads per key/value head and optional
    operands (treedef of an Operands, axes: their Operands.axes), with their vmap and sharding rules; with a
    dense bias the backward also returns its gradient."""
    fields = jax.tree.unflatten(treedef, list(axes))
    fwd_rule, bwd_rule = _spmd.rules(axes, fields.bias)
    partition = BACKENDS[opts.implementation].partitionable
    # the bias's gradient (the backward's fourth result) of the operand after q, k, v and those before it
    summed = ((3, 3 + fields.present().index("bias")),) if fields.bias is not None else ()
    return (_first_order_only(_spmd.wrap(functools.partial(_forward, opts, treedef), fwd_rule, group, partition)),
            _first_order_only(_spmd.wrap(functools.partial(_backward, opts, treedef), bwd_rule, group, partition,
                                         summed)))


def _calls(q, k, extras: Operands, opts: Options):
    return _kernel_calls(opts, q.shape[2] // k.shape[2], jax.tree.structure(extras), extras.axes())


def _forward_call(q, k, v, extras: Operands, opts: Options):
    """(out, lse2) of the forward kernel: lse in base 2, as the backward kernels read it."""
    out, lse2 = _calls(q, k, extras, opts)[0](q, k, v, *jax.tree.leaves(extras))
    return _spmd.match_varying(out, q, k, v), _spmd.match_varying(lse2, q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def flash_attention(q, k, v, extras: Operands, opts: Options):
    """(out, lse) through the Triton kernels, lse natural; differentiable in q, k, v (also through lse),
    except for float8 inputs (forward only). extras: the optional operands, constants (zero cotangent)."""
    out, lse2 = _forward_call(q, k, v, extras, opts)
    return out, lse2 * np.float32(LN2)


def _fwd_rule(q, k, v, extras, opts: Options):
    out, lse2 = _forward_call(q, k, v, extras, opts)
    # the backward gets the forward's base-2 lse itself, not lse rounded through the natural log
    return (out, lse2 * np.float32(LN2)), (q, k, v, extras, out, lse2)


def _zero_cotangent(x):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return np.zeros(x.shape, jax.dtypes.float0)
    return jnp.zeros_like(x)


def _bwd_rule(opts: Options, residuals, cotangents):
    q, k, v, extras, out, lse2 = residuals
    if fp8.is_fp8(q.dtype):
        raise TypeError(fp8.NO_GRADIENT)
    dout, dlse = cotangents
    grads = _calls(q, k, extras, opts)[1](q, k, v, *jax.tree.leaves(extras), out, lse2, dout.astype(out.dtype), dlse)
    dq, dk, dv = grads[:3]
    like = (q, k, v, dout, dlse)  # inside shard_map: the cotangents must vary as the primals do
    d_extras = jax.tree.map(lambda x: _spmd.match_varying(_zero_cotangent(x), x), extras)
    if extras.bias is not None:  # the bias's gradient, the one operand that has one
        d_extras = dataclasses.replace(d_extras, bias=_spmd.match_varying(grads[3], *like, extras.bias))
    return (_spmd.match_varying(dq, *like), _spmd.match_varying(dk, *like), _spmd.match_varying(dv, *like),
            d_extras)


flash_attention.defvjp(_fwd_rule, _bwd_rule)


def kernel_backward(q, k, v, extras: Operands, opts: Options, out, lse, dout, dlse):
    """(dq, dk, dv) of the backward kernels for a given out and (natural) lse: ring attention calls it with
    the merged, global ones, which makes it return one block's exact share of the gradients."""
    return _bwd_rule(opts, (q, k, v, extras, out, lse * np.float32(1 / LN2)), (dout, dlse))[:3]


def block_backward(q, k, v, extras: Operands, opts: Options, out, lse, dout, dlse):
    """kernel_backward of any implementation ("xla": reference.block_gradients, float32)."""
    if opts.implementation == "xla":
        return reference.block_gradients(q, k, v, out, lse, dout, dlse, **_reference_options(extras, opts))
    return kernel_backward(q, k, v, extras, opts, out, lse, dout, dlse)
