"""Plans (jax_flash_amd/plan.py) turned into kernel launches, written once for every backend. Nothing here
decides what runs: `forward` and `backward` ask the plan and execute its steps.

A backend supplies ``run(launch) -> tuple of outputs`` (jax-triton on a GPU, Triton's interpreter on the CPU).
Arguments are given by the kernel's parameter names and put in its order here (jax-triton's convention: inputs,
then outputs, then constexprs by keyword), so an optional operand reaches every kernel that names it
(operands.Operands.kernel_args) without touching this file.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import plan as plans, rules
from jax_flash_amd.kernels import bwd, fwd
from jax_flash_amd.operands import Operands
from jax_flash_amd.plan import Plan, Step


@dataclasses.dataclass(frozen=True)
class Launch:
    kernel: Any  # a @triton.jit function
    grid: tuple[int, ...]
    args: tuple  # jax arrays, then Python int / np.float32 scalars, in the kernel's order
    out_shapes: tuple[jax.ShapeDtypeStruct, ...]
    constexprs: dict[str, Any]
    compile_options: dict[str, Any]  # num_warps, num_stages, and target-specific ones
    # (position in args, output index): that output is that input's buffer, updated in place (jax-triton's
    # input_output_aliases; a donated input is then not copied). The kernel writes it through the input's
    # parameter; the output keeps a parameter of its own (jax-triton 0.3's convention), which it never uses.
    aliases: tuple[tuple[int, int], ...] = ()


Run = Callable[[Launch], tuple]


@dataclasses.dataclass(frozen=True)
class Statics:
    """The static part of a call that the kernels see (dispatch.Options less the implementation)."""
    scale: float
    band: rules.Band = rules.Band()
    softcap: float = 0.0
    dropout_p: float = 0.0
    deterministic: bool = True  # False: the backward may sum in an order that varies (plan.Call.deterministic)


interpreted = plans.interpreted


@functools.cache
def _params(kernel) -> tuple[str, ...]:
    return tuple(inspect.signature(kernel.fn).parameters)


@functools.cache
def _defaults(kernel) -> dict:
    """The kernel's parameters with defaults (constexpr flags such as TMA). Given explicitly: jax-triton
    compiles only what it is passed, so a default left out would arrive as None."""
    return {name: p.default for name, p in inspect.signature(kernel.fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def launch(kernel, grid, inputs: dict, out_shapes: tuple, constexprs: dict, options: dict,
           extras: Operands | None = None) -> Launch:
    """A Launch with `inputs` (every runtime parameter before the outputs, by name) in the kernel's order,
    plus the optional operands (extras) the kernel names, with their presence flags."""
    params = _params(kernel)
    if extras is not None:
        inputs = {**inputs, **extras.kernel_args(params)}
        constexprs = {**constexprs, **extras.kernel_flags(params)}
    constexprs = {**_defaults(kernel), **constexprs}
    n_in = len(inputs)
    if set(params[:n_in]) != set(inputs):
        raise TypeError(f"{kernel.__name__} takes {params[:n_in]} before its outputs; given {tuple(inputs)}")
    return Launch(kernel, tuple(grid), tuple(inputs[p] for p in params[:n_in]), tuple(out_shapes), constexprs,
                  options)


def _of_step(step: Step, kernel, inputs: dict, out_shapes: tuple, extras: Operands | None = None) -> Launch:
    return launch(kernel, step.grid, inputs, out_shapes, step.flags, step.compile_options, extras)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def segment_ranges(ids, other_ids, block: int) -> jax.Array:
    """(batch, blocks, 2) int32: for each block of `block` positions of ids (batch, seq), the range
    [lo, hi) of positions of other_ids (batch, seq_other) whose id can equal one in the block. Exact
    when other_ids is sorted along each row (the usual packing; ids need not be); the whole range
    otherwise. The kernels skip the blocks outside it (masking.segment_span)."""
    b, seq = ids.shape
    n = _cdiv(seq, block)
    info = jnp.iinfo(jnp.int32)
    pad = ((0, 0), (0, n * block - seq))
    lowest = jnp.pad(ids, pad, constant_values=info.max).reshape(b, n, block).min(-1)
    highest = jnp.pad(ids, pad, constant_values=info.min).reshape(b, n, block).max(-1)

    def find(side, values):
        return jax.vmap(functools.partial(jnp.searchsorted, side=side, method="scan_unrolled"))(other_ids, values)

    lo, hi = find("left", lowest), find("right", highest)
    ordered = jnp.all(other_ids[:, 1:] >= other_ids[:, :-1], axis=1)[:, None]
    lo = jnp.where(ordered, lo, 0)
    hi = jnp.where(ordered, hi, other_ids.shape[1])
    return jnp.stack([lo, hi], axis=-1).astype(jnp.int32)


def mask_ranges(mask, batch: int, seq_q: int, seq_k: int, block: int, query_side: bool) -> jax.Array:
    """(batch, blocks, 2) int32: for each block of `block` queries (query_side) or keys, the range [lo, hi) of
    keys (or queries) that a dense mask (batch | 1, heads | 1, seq_q | 1, seq_k | 1) lets any of the block's
    positions see, in any head; [0, 0) where it hides them all. The kernels visit only those blocks."""
    seen = jnp.any(mask, axis=1)  # (batch | 1, seq_q | 1, seq_k | 1)
    if not query_side:
        seen = jnp.swapaxes(seen, 1, 2)
        seq_q, seq_k = seq_k, seq_q
    n = _cdiv(seq_q, block)
    if seen.shape[1] == 1:
        seen = jnp.broadcast_to(seen, (seen.shape[0], n, seen.shape[2]))
    else:
        seen = jnp.pad(seen, ((0, 0), (0, n * block - seq_q), (0, 0))).reshape(seen.shape[0], n, block, -1).any(2)
    some = seen.any(-1)
    if seen.shape[2] == 1:  # the same for every key: all of them or none
        lo, hi = jnp.zeros_like(some, jnp.int32), jnp.where(some, seq_k, 0)
    else:
        lo = jnp.where(some, jnp.argmax(seen, -1), 0)
        hi = jnp.where(some, seq_k - jnp.argmax(seen[..., ::-1], -1), 0)
    return jnp.broadcast_to(jnp.stack([lo, hi], -1).astype(jnp.int32), (batch, n, 2))


def _ranges(extras: Operands, query_side: bool, block: int, q, k):
    """The kernels' KeyRanges (query_side: for each query block, the keys it may see) or QueryRanges: from the
    segment ids (segment_ranges) and the dense mask (mask_ranges), both where both are given; a placeholder
    without either."""
    ranges = None
    if extras.q_segment_ids is not None:
        ids, other = extras.q_segment_ids, extras.kv_segment_ids
        ranges = segment_ranges(ids, other, block) if query_side else segment_ranges(other, ids, block)
    if extras.mask is not None:
        masked = mask_ranges(extras.mask, q.shape[0], q.shape[1], k.shape[1], block, query_side)
        ranges = masked if ranges is None else jnp.stack(
            [jnp.maximum(ranges[..., 0], masked[..., 0]), jnp.minimum(ranges[..., 1], masked[..., 1])], -1)
    return jnp.zeros((1,), jnp.int32) if ranges is None else ranges


def _scalars(q, k, statics: Statics) -> dict:
    """The runtime scalars every attention kernel takes."""
    sq, sk = q.shape[1], k.shape[1]
    lo_off, hi_off = statics.band.offsets(sq, sk)
    return dict(sm_scale=np.float32(statics.scale), softcap=np.float32(statics.softcap),
                keep_scale=np.float32(rules.dropout_keep_scale(statics.dropout_p)), seq_q=sq, seq_k=sk,
                lo_off=lo_off, hi_off=hi_off)


def _gluon_scalars(scalars: dict) -> dict:
    return {name: scalars[name] for name in ("sm_scale", "softcap", "keep_scale", "seq_q", "seq_k", "lo_off",
                                             "hi_off")}


def _placeholder():
    """An operand a launch does not read (a kernel parameter its constexprs leave unused)."""
    return jnp.zeros((1,), jnp.float32)


def call_of(target: str, q, k, extras: Operands, statics: Statics, rows=None, policy=None) -> plans.Call:
    """The plan's Call of these arrays; rows: {role: Row} forced on top of the policy (autotuning, sweeps)."""
    policy = policy or plans.active()
    if rows:
        policy = policy.replace(rows={**dict(policy.rows), **{k_: v for k_, v in rows.items() if v is not None}})
    return plans.Call.of(target, q, k, extras, statics, policy)


# ----- the forward -----

def keys_last(run: Run, step: Step, v):
    """v (batch, seq_k, heads, D) as (batch, heads, D, seq_k rounded up to 16), zero-padded: the layout the fp8
    forward reads (kernels/fwd.py); MMA_ORDER: each 32 keys in fwd.mma_order's order (the Gluon forward's)."""
    b, sk, h, d = v.shape
    (vt,) = run(_of_step(step, fwd.keys_last, dict(V=v, seq_k=sk),
                         (jax.ShapeDtypeStruct((b, h, d, _cdiv(sk, 16) * 16), v.dtype),)))
    return vt


def forward(run: Run, target: str, q, k, v, extras: Operands = Operands(), *, statics: Statics, rows=None,
            policy=None):
    """(out, lse2): out like q (bfloat16 for fp8 inputs), lse2 (batch, heads, seq_q) float32 in base 2 (what
    backward takes; lse = lse2 * ln 2). rows: {role: config row} forced (autotuning)."""
    return execute_forward(plans.plan_forward(call_of(target, q, k, extras, statics, rows, policy)), run, q, k, v,
                           extras, statics)


def execute_forward(plan: Plan, run: Run, q, k, v, extras: Operands, statics: Statics):
    b, sq, h, _ = q.shape
    out_dtype = jnp.bfloat16 if plan.call.fp8 else q.dtype
    scalars = _scalars(q, k, statics)
    lse_shape = jax.ShapeDtypeStruct((b, h, sq), jnp.float32)
    out = lse = None
    for step in plan.steps:
        if step.role == "keys_last":
            v = keys_last(run, step, v)
        elif step.kernel == "attn_fwd_sm90":
            from jax_flash_amd.kernels import fwd_sm90  # Gluon: imported only where it runs

            out, lse = run(_of_step(step, fwd_sm90.attn_fwd_sm90, dict(Q=q, K=k, V=v, **_gluon_scalars(scalars)),
                                    (jax.ShapeDtypeStruct(q.shape, out_dtype), lse_shape), extras))
        elif step.role == "fwd":
            partial = step.flags["EDGES"] == 1
            inputs = dict(Q=q, K=k, V=v, KeyRanges=_ranges(extras, True, step.flags["BLOCK_M"], q, k), batch=b,
                          **scalars)
            out, lse = run(_of_step(step, fwd.attn_fwd, dict(inputs, Part=_placeholder(), PartLse=_placeholder()),
                                    (jax.ShapeDtypeStruct(q.shape, jnp.float32 if partial else out_dtype),
                                     lse_shape), extras))
        elif step.role == "fwd_edges":  # the band's edge blocks, from that partial result
            out, lse = run(_of_step(step, fwd.attn_fwd, dict(inputs, Part=out, PartLse=lse),
                                    (jax.ShapeDtypeStruct(q.shape, out_dtype), lse_shape), extras))
        else:
            raise ValueError(f"a forward plan has no step {step.role!r}")
    return out, lse


# ----- the backward -----

def backward(run: Run, target: str, q, k, v, out, lse2, dout, dlse, extras: Operands = Operands(), *,
             statics: Statics, rows=None, policy=None):
    """(dq, dk, dv) for cotangents dout (like out) and dlse (of the natural lse); lse2 as forward returns it. With
    a dense bias, (dq, dk, dv, dbias)."""
    plan = plans.plan_backward(call_of(target, q, k, extras, statics, rows, policy))
    if plan.step("dkdv").kernel in ("attn_bwd_dkdv_dq", "attn_bwd_dkdvdq_sm90"):  # the linear backward
        delta = _delta(out, dout, dlse)
        dq, dk, dv = _linear(plan, run, q, k, v, dout, lse2, delta, extras, statics)
    elif plan.step("dqds") is None:
        (dq, dk, dv), delta = _seven_products(plan, run, q, k, v, out, lse2, dout, dlse, extras, statics)
    else:
        delta = _delta(out, dout, dlse)  # dK/dV runs first here
        group = q.shape[2] // k.shape[2]
        kr, vr = (jnp.repeat(x, group, axis=2) for x in (k, v)) if plan.per_query_head else (k, v)
        dq, dk, dv = _ds_path_by_heads(plan, run, q, kr, vr, lse2, delta, dout, extras, statics)
        if plan.per_query_head:
            dk, dv = (_group_sum(x, group).astype(k.dtype) for x in (dk, dv))
    step = plan.step("dbias")
    if step is None:
        return dq, dk, dv
    (dbias,) = run(_of_step(step, bwd.attn_bwd_dbias,
                            dict(Q=q, K=k, V=v, KeyRanges=_ranges(extras, True, step.flags["BLOCK_M"], q, k),
                                 dOut=dout, Lse=lse2, Delta=delta, batch=q.shape[0], **_scalars(q, k, statics)),
                            (jax.ShapeDtypeStruct(extras.bias.shape, extras.bias.dtype),), extras))
    return dq, dk, dv, dbias


def _delta(out, dout, dlse):
    """delta = rowsum(dO * O) - dlse, (batch, heads, seq_q), by XLA (one fused pass; cuDNN's backward makes the
    same), where the kernel that reads it first does not compute it (attn_bwd_dq does)."""
    return jnp.einsum("bshd,bshd->bhs", out, dout, preferred_element_type=jnp.float32) - dlse


def ds_scale(statics: Statics) -> np.float32:
    """attn_bwd_dq_ds's scale: sm_scale, times keep_scale under dropout (the workspace holds dS / keep_scale:
    kernels/dropout.py dropped_ds)."""
    return np.float32(statics.scale * rules.dropout_keep_scale(statics.dropout_p))


def _ds_path(plan: Plan, run: Run, q, k, v, lse2, delta, dout, extras: Operands, statics: Statics):
    """One head group of the dS path: dK/dV also writes dS^T, attn_bwd_dq_ds reads it for dQ."""
    dk, dv, ds = _dkdv(plan, run, q, k, v, dout, lse2, delta, extras, statics)
    scalars = _scalars(q, k, statics)
    (dq,) = run(_of_step(plan.step("dqds"), bwd.attn_bwd_dq_ds,
                         dict(K=k, dS=ds, sm_scale=ds_scale(statics),
                              **{n: scalars[n] for n in ("seq_q", "seq_k", "lo_off", "hi_off")}),
                         (jax.ShapeDtypeStruct(q.shape, q.dtype),), extras))
    return dq, dk, dv


def _group_sum(x, group: int):
    """(batch, seq, heads / group, D) float32: each group's heads of x (batch, seq, heads, D) added in order, as
    elementwise adds (a reduction may sum in an order that varies: deterministic by default)."""
    parts = x.reshape(*x.shape[:2], x.shape[2] // group, group, x.shape[3]).astype(jnp.float32)
    total = parts[:, :, :, 0]
    for g in range(1, group):
        total = total + parts[:, :, :, g]
    return total


def _ds_path_by_heads(plan: Plan, run: Run, q, k, v, lse2, delta, dout, extras: Operands, statics: Statics):
    """The dS path by groups of plan.head_groups key/value heads: each launch a whole attention of its heads."""
    kv_heads, group = k.shape[2], q.shape[2] // k.shape[2]
    heads = kv_heads // plan.head_groups
    parts = []
    for lo in range(0, kv_heads, heads):
        qh, kh = slice(lo * group, (lo + heads) * group), slice(lo, lo + heads)
        inputs = (q[:, :, qh], k[:, :, kh], v[:, :, kh], lse2[:, qh], delta[:, qh], dout[:, :, qh])
        if parts:  # one group after another, so that one workspace is live at a time
            _, inputs = jax.lax.optimization_barrier((parts[-1], inputs))
        parts.append(_ds_path(plan, run, *inputs, extras.heads(lo, lo + heads, group), statics))
    return parts[0] if len(parts) == 1 else tuple(jnp.concatenate(g, axis=2) for g in zip(*parts))


def _linear(plan: Plan, run: Run, q, k, v, dout, lse2, delta, extras: Operands, statics: Statics):
    """The linear backward: dK, dV and the float32 sum of dS K in one pass (a SPLIT row's dV in a second launch),
    the sum in place in zeroed buffers (aliased to the outputs), then scaled and cast. sm90's Gluon kernel
    (bwd_sm90.attn_bwd_dkdvdq_sm90) keeps a lock per dQ half."""
    step, dv_step = plan.step("dkdv"), plan.step("dv")
    b, sq, h, _ = q.shape
    if step.kernel == "attn_bwd_dkdvdq_sm90":
        from jax_flash_amd.kernels import bwd_sm90  # Gluon: imported only where it runs

        kernel, halves = bwd_sm90.attn_bwd_dkdvdq_sm90, (2,)
        lse2, delta, lse_len = _lse_rows(lse2, delta)
        inputs = dict(Q=q, K=k, V=v, dOut=dout, Lse=lse2, Delta=delta, lse_len=lse_len,
                      **_gluon_scalars(_scalars(q, k, statics)))
    else:
        kernel, halves = bwd.attn_bwd_dkdv_dq, ()
        inputs = dict(Q=q, K=k, V=v, QueryRanges=_ranges(extras, False, step.flags["BLOCK_N"], q, k), dOut=dout,
                      Lse=lse2, Delta=delta, **_scalars(q, k, statics))
    locks = (b, h, _cdiv(sq, step.flags["BLOCK_M"]), *halves) if step.flags["DQ"] == 2 else (1,)
    inputs.update(DQAcc=jnp.zeros(q.shape, jnp.float32), Locks=jnp.zeros(locks, jnp.int32))
    dk_shape, dv_shape = jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)
    unwritten = jax.ShapeDtypeStruct((1,), v.dtype)  # a SPLIT row's launches each write one of dK, dV
    params = _params(kernel)
    one = _of_step(step, kernel, inputs,
                   (dk_shape, unwritten if dv_step else dv_shape, jax.ShapeDtypeStruct(q.shape, jnp.float32),
                    jax.ShapeDtypeStruct(locks, jnp.int32)), extras)
    dk, dv, dq, _ = run(dataclasses.replace(one, aliases=((params.index("DQAcc"), 2), (params.index("Locks"), 3))))
    if dv_step is not None:  # a SPLIT row: dV's programs hold one accumulator too
        rest = dict(inputs, DQAcc=_placeholder(), Locks=jnp.zeros((1,), jnp.int32))
        _, dv, _, _ = run(_of_step(dv_step, kernel, rest, (unwritten, dv_shape, jax.ShapeDtypeStruct((1,), jnp.float32),
                                                           jax.ShapeDtypeStruct((1,), jnp.int32)), extras))
    return (dq * ds_scale(statics)).astype(q.dtype), dk, dv


def _lse_rows(lse2, delta):
    """(lse2, delta, lse_len): rows padded to a multiple of 4, 16-byte aligned as the Gluon kernels' TMA tiles need."""
    sq = lse2.shape[-1]
    lse_len = _cdiv(sq, 4) * 4
    if lse_len != sq:
        lse2, delta = (jnp.pad(x, ((0, 0), (0, 0), (0, lse_len - sq))) for x in (lse2, delta))
    return lse2, delta, lse_len


def _seven_products(plan: Plan, run: Run, q, k, v, out, lse2, dout, dlse, extras: Operands, statics: Statics):
    """((dq, dk, dv), delta): dQ first (it also writes delta, which the dK/dV kernel reads), then dK/dV."""
    b, sq, h, _ = q.shape
    step = plan.step("dq")
    dq, delta = run(_of_step(step, bwd.attn_bwd_dq,
                             dict(Q=q, K=k, V=v, KeyRanges=_ranges(extras, True, step.flags["BLOCK_M"], q, k), Out=out,
                                  dOut=dout, dLse=dlse, Lse=lse2, **_scalars(q, k, statics)),
                             (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
                             extras))
    dk, dv, _ = _dkdv(plan, run, q, k, v, dout, lse2, delta, extras, statics)
    return (dq, dk, dv), delta


def _dkdv(plan: Plan, run: Run, q, k, v, dout, lse2, delta, extras: Operands, statics: Statics):
    """(dk, dv, dS workspace) of the plan's dK/dV step (and its edge step): on the dS path (DS) it also stores dS^T
    (else a placeholder)."""
    step = plan.step("dkdv")
    ds = step.flags["DS"]
    b, sq = q.shape[:2]
    workspace = step.buffer or (1,)
    scalars = _scalars(q, k, statics)
    if step.kernel == "attn_bwd_dkdv_sm90":
        from jax_flash_amd.kernels import bwd_sm90  # Gluon: imported only where it runs

        lse2, delta, lse_len = _lse_rows(lse2, delta)
        return run(_of_step(step, bwd_sm90.attn_bwd_dkdv_sm90,
                            dict(Q=q, K=k, V=v, dOut=dout, Lse=lse2, Delta=delta, lse_len=lse_len,
                                 **_gluon_scalars(scalars)),
                            (jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                             jax.ShapeDtypeStruct(workspace, q.dtype)), extras))
    edges = plan.step("dkdv_edges")
    inputs = dict(Q=q, K=k, V=v, QueryRanges=_ranges(extras, False, step.flags["BLOCK_N"], q, k), dOut=dout, Lse=lse2,
                  Delta=delta, batch=b, **scalars)
    part = jnp.float32 if edges else None
    dk, dv, ds_out = run(_of_step(
        step, bwd.attn_bwd_dkdv, dict(inputs, DKPart=_placeholder(), DVPart=_placeholder(), DSPart=_placeholder()),
        (jax.ShapeDtypeStruct(k.shape, part or k.dtype), jax.ShapeDtypeStruct(v.shape, part or v.dtype),
         jax.ShapeDtypeStruct(workspace, q.dtype)), extras))
    if edges:  # the band's edge blocks, added to those partial sums; on the dS path their dS tiles go into the
        # first launch's workspace, in place
        one = _of_step(edges, bwd.attn_bwd_dkdv, dict(inputs, DKPart=dk, DVPart=dv, DSPart=ds_out),
                       (jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                        jax.ShapeDtypeStruct(ds_out.shape, q.dtype)), extras)
        if ds:
            one = dataclasses.replace(one, aliases=((_params(bwd.attn_bwd_dkdv).index("DSPart"), 2),))
        dk, dv, ds_out = run(one)
    return dk, dv, ds_out

