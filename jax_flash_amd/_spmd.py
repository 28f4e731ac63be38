"""How the kernel calls compose with jax.vmap and with sharding (jit + NamedSharding, shard_map).

jax-triton's custom call has neither a batching rule nor a partitioning rule: vmapped, it would fail;
sharded, XLA would gather every operand onto every device. Both kernel calls (forward: q, k, v,
optional operands -> out, lse; backward: the same, out, lse, dout, dlse -> dq, dk, dv) are therefore
wrapped here:
- custom_vmap: mapped axes are folded into the batch axis (unmapped operands are broadcast first), so a
  vmap runs one launch, not a loop;
- custom_partitioning: batch and heads are independent, so each device runs the kernel on its own
  (batch, heads) shard with no communication. The sequence and head_dim axes must be whole on a
  device: if they are sharded they are gathered first (correct, not scalable; warned once).
"""
from __future__ import annotations

import functools
import re
import warnings

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

# Shardy rules: b batch, s query positions, t key positions, h key/value heads, g query heads per
# key/value head (query heads are (h g): sharding them in contiguous chunks shards h), d head_dim,
# r and p axes a device holds whole. The optional operands (operands.Operands) bring their own axes.


def rules(extra_axes: tuple[str, ...] = (), bias_axes: str | None = None) -> tuple[str, str]:
    """(forward, backward) rules for q, k, v, then optional operands of these axes (operands.Operands.axes):
    forward -> out, lse; backward: ..., out, lse, dout, dlse -> dq, dk, dv (and dbias, of bias_axes, where the
    call has a dense bias)."""
    extra = "".join(f", {a}" for a in extra_axes)
    fwd = f"b s (h g) d, b t h d, b t h d{extra} -> b s (h g) d, b (h g) s"
    bwd = (f"b s (h g) d, b t h d, b t h d{extra}, b s (h g) d, b (h g) s, b s (h g) d, b (h g) s"
           " -> b s (h g) d, b t h d, b t h d" + (f", {bias_axes}" if bias_axes else ""))
    return fwd, bwd


# factors a device must hold entirely (in order of first use: Shardy wants it); x0..x3: a dense operand's axes of
# size one (operands.Operands.axes)
_WHOLE = ("s", "d", "t", "r", "p", "x0", "x1", "x2", "x3")


def wrap(fn, rule: str, group: int = 1, partition: bool = True, summed: tuple[tuple[int, int], ...] = ()):
    """fn(*arrays) -> tuple of arrays, with the vmap and (if partition) sharding rules above: `rule`
    names every array's axes (axis 0 is always the batch, of size one for a dense operand broadcast over it; vmap
    then gives it one per row, and sums the gradients `summed` names, (result, operand), back); group: query heads
    per key/value head.
    partition=False for host-callback bodies (the interpreter): JAX frees callbacks lowered inside a
    custom_partitioning rule too early (jax-ml/jax#23620, a crash), so those run unpartitioned (XLA
    gathers their operands)."""
    if partition:
        sizes = {"g": group} if group > 1 else {}
        if group == 1:  # Shardy refuses a compound factor of size 1
            rule = rule.replace("(h g)", "h")
        partitioned = custom_partitioning(fn)
        factors = _factors(rule)
        partitioned.def_partition(
            partition=functools.partial(_partition, fn, factors),
            infer_sharding_from_operands=functools.partial(_infer, factors),
            sharding_rule=rule,
            need_replication_factors=tuple(f for f in _WHOLE if re.search(rf"\b{f}\b", rule)),
            **sizes,
        )
    else:
        partitioned = fn

    @jax.custom_batching.custom_vmap
    def batched(*arrays):
        return partitioned(*arrays)

    @batched.def_vmap
    def _fold(axis_size, in_batched, *arrays):
        batch = arrays[0].shape[1] if in_batched[0] else arrays[0].shape[0]
        folded, spread = [], set()
        differentiated = {operand for _, operand in summed}
        for i, (x, mapped) in enumerate(zip(arrays, in_batched)):
            if not mapped and x.shape[0] == 1 < batch and i not in differentiated:
                folded.append(x)  # a dense operand broadcast over the batch serves the folded batch as it is
                continue
            if not mapped:
                x = jnp.broadcast_to(x, (axis_size, *x.shape))
            if x.shape[1] == 1 < batch:  # broadcast over the batch: one per row, for a gradient per mapped row
                x = jnp.broadcast_to(x, (axis_size, batch, *x.shape[2:]))
                spread.add(i)
            folded.append(x.reshape(axis_size * x.shape[1], *x.shape[2:]))
        outs = [o.reshape(axis_size, -1, *o.shape[1:]) for o in batched(*folded)]
        for out, operand in summed:  # a gradient of an operand spread over the batch: summed back
            if operand in spread:
                outs[out] = outs[out].sum(1, keepdims=True)
        return tuple(outs), tuple(True for _ in outs)

    return batched


def _spec_of(shape) -> tuple:
    spec = tuple(shape.sharding.spec) if isinstance(shape.sharding, NamedSharding) else ()
    return spec + (None,) * (len(shape.shape) - len(spec))


def _batch_heads(mesh, arg_shapes):
    """(batch axes, heads axes) of q's sharding; warns once if its sequence or head_dim is sharded."""
    spec = _spec_of(arg_shapes[0])
    if spec[1] is not None or spec[3] is not None:
        _warn_gather(str(spec))
    return spec[0], spec[2]


@functools.cache
def _warn_gather(spec: str) -> None:
    warnings.warn(f"jax_flash_amd.attention: q is sharded along its sequence or head_dim axis ({spec}); "
                  "those axes are gathered onto every device first (correct, but not scalable). Shard "
                  "over batch and heads instead, or, for a sequence too long for one device, call "
                  "jax_flash_amd.ring_attention inside shard_map (attention does not switch to the ring "
                  "by itself: the ring needs the caller's layout and mesh axis).", stacklevel=3)


def _factors(rule: str) -> tuple[list, list]:
    """Per operand and per result of a rule, its axes' factors: [["b", "s", "(h g)", "d"], ...]."""
    return tuple([re.findall(r"\([^)]*\)|\w+", operand) for operand in side.split(",")]
                 for side in rule.split("->"))


def _sharding(mesh, factors, batch, heads) -> NamedSharding:
    """Batch factors on q's batch axes, head factors on its heads axes, everything else whole."""
    return NamedSharding(mesh, PartitionSpec(*(batch if f == "b" else heads if f in ("h", "(h g)") else None
                                               for f in factors)))


def _infer(factors, mesh, arg_shapes, result_shape):
    batch, heads = _batch_heads(mesh, arg_shapes)
    return tuple(_sharding(mesh, f, batch, heads) for f in factors[1])


def _partition(fn, factors, mesh, arg_shapes, result_shape):
    batch, heads = _batch_heads(mesh, arg_shapes)
    args = tuple(_sharding(mesh, f, batch, heads) for f in factors[0])
    results = tuple(_sharding(mesh, f, batch, heads) for f in factors[1])
    return mesh, fn, results, args


def varying_axes(x) -> frozenset:
    """The manual mesh axes x varies over inside shard_map (empty outside)."""
    aval = jax.typeof(x)
    if hasattr(aval, "vma"):  # jax < 0.10
        return frozenset(aval.vma)
    manual = getattr(aval, "manual_axis_type", None)
    return frozenset(manual.varying) if manual is not None else frozenset()


def match_varying(x, *like):
    """x marked as varying over every manual axis the arrays `like` vary over. Inside shard_map the
    kernels' custom calls and callbacks return values typed as invariant; custom_vjp (and the user's
    out_specs) need the primals' type back."""
    if jnp.issubdtype(x.dtype, jax.dtypes.float0):  # integer operands' (numpy) zero cotangents
        return x
    missing = frozenset().union(*map(varying_axes, like)) - varying_axes(x)
    if not missing:
        return x
    axes = tuple(sorted(missing))
    return jax.lax.pcast(x, axes, to="varying") if hasattr(jax.lax, "pcast") else jax.lax.pvary(x, axes)


def partition_spec(x, rank: int | None = None) -> tuple:
    """x's PartitionSpec in its type (empty outside sharding) as a tuple of rank entries (None: whole)."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    entries = tuple(getattr(sharding, "spec", ()) or ())
    return entries + (None,) * ((x.ndim if rank is None else rank) - len(entries))


def _explicit_mesh(arrays):
    """The mesh whose Explicit axes a call runs under: the context mesh (jax.set_mesh, shard_map), else
    the one the arrays' types name (arrays put on an Explicit mesh and passed to jit with no context mesh,
    as jax.make_mesh and device_put leave them). A concrete Mesh where the arrays are concrete (an eager
    call: resharding them needs the devices), else an AbstractMesh; None when no axis is Explicit."""
    context = jax.sharding.get_abstract_mesh()
    if not context.empty:
        return context if getattr(context, "explicit_axes", ()) else None
    for x in arrays:
        concrete = isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        sharding = x.sharding if concrete else None
        if not isinstance(sharding, NamedSharding):
            sharding = getattr(jax.typeof(x), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and not mesh.empty and getattr(mesh, "explicit_axes", ()):
            return mesh
    return None


def auto_axes(fn, args: tuple, out_specs):
    """fn(*args), run with the Explicit axes of the mesh in use (_explicit_mesh: jax.make_mesh's default
    type, with or without jax.set_mesh) made Auto for its duration: the kernels' partitioning rules, the
    interpreter's callbacks and the reference's gathers and scatters are written for Auto axes. The results
    then come back sharded as out_specs (a pytree of PartitionSpec like fn's results). An eager call on
    arrays sharded over several devices runs as one jitted program: op by op, the interpreter's callback
    results land on one device, which ops with the sharded arrays then refuse."""
    leaves = jax.tree.leaves(args)
    mesh = _explicit_mesh(leaves)
    call = fn if mesh is None else jax.sharding.auto_axes(fn, axes=tuple(mesh.explicit_axes), out_sharding=out_specs)
    eager = not any(isinstance(x, jax.core.Tracer) for x in leaves)
    if eager and any(isinstance(x, jax.Array) and len(x.sharding.device_set) > 1 for x in leaves):
        call = jax.jit(call)
    if mesh is None or not jax.sharding.get_abstract_mesh().empty:
        return call(*args)
    context = jax.set_mesh(mesh) if isinstance(mesh, jax.sharding.Mesh) else jax.sharding.use_abstract_mesh(mesh)
    with context:
        return call(*args)


def attention_specs(q) -> tuple[PartitionSpec, PartitionSpec]:
    """(out, lse) specs of an attention call: out as q, lse (batch, heads, seq) as q's batch, heads and seq."""
    b, s, h, d = partition_spec(q, 4)
    return PartitionSpec(b, s, h, d), PartitionSpec(b, h, s)
