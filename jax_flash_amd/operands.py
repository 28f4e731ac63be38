"""The optional array inputs of one attention call, described once.

`Operands` is a pytree whose fields are None (off) or an array. Everything downstream is derived from
the field declarations below, so adding an operand means adding one field here (plus the kernel code
that reads it):
- the custom_vjp carries the pytree as one argument; absent fields are not leaves, so they cost nothing
  and get no cotangent;
- the vmap and sharding rules (_spmd) take each present field's `axes`;
- a kernel launch passes every field a kernel names in its signature (`param`): the array, or a
  one-element placeholder of the field's dtype, and sets the field's constexpr `flag` (if the kernel
  has it) to whether it is present, so the kernel never reads a placeholder.
All of them but the bias are constants of the call: their cotangent is zero, as in FlashAttention.
Dense fields (a mask and a bias over (batch, query heads, seq_q, seq_k), any of those axes of size one where they
broadcast) set their flag to their layout (dense_layout), which tells the kernels which axes they vary along.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Spec:
    axes: str  # Shardy factors (_spmd): b batch, s query and t key positions, h key/value heads, g query
    #            heads per key/value head ("(h g)" = query heads), r and p axes a device holds whole
    dtype: Any  # what the kernel reads (a same-width bitcast of the array when the dtypes differ; None: its own)
    param: str  # the kernel parameter it is passed as
    flag: str | None = None  # a kernel constexpr told whether it is present (None: the kernel knows otherwise)
    dense: bool = False  # (batch | 1, query heads | 1, seq_q | 1, seq_k | 1): the flag is its layout


def _field(axes: str, dtype, param: str, flag: str | None = None, dense: bool = False):
    spec = Spec(axes, None if dtype is None else jnp.dtype(dtype), param, flag, dense)
    return dataclasses.field(default=None, metadata={"spec": spec})


def dense_layout(x) -> int:
    """The kernels' layout constexpr of a dense operand (kernels/masking.py dense_plane): 1, + 2 if it varies
    along queries, + 4 along keys, + 8 along the batch, + 16 along heads."""
    _, h, t, s = x.shape
    return 1 + 2 * (t > 1) + 4 * (s > 1) + 8 * (x.shape[0] > 1) + 16 * (h > 1)


DENSE_AXES = ("b", "(h g)", "s", "t")  # a dense operand's factors where an axis is whole; x0..x3 where it is one


@dataclasses.dataclass(frozen=True)
class Operands:
    slopes: Any = _field("b (h g)", jnp.float32, "Slopes", "ALIBI")  # ALiBi slopes (batch, heads_q)
    # dropout seeds (batch, heads_q, 2) uint32; the rate (Options.dropout_p) tells the kernels
    seeds: Any = _field("b (h g) r", jnp.int32, "Seeds")
    q_segment_ids: Any = _field("b s", jnp.int32, "QSeg", "SEGMENTS")  # (batch, seq_q)
    kv_segment_ids: Any = _field("b t", jnp.int32, "KSeg", "SEGMENTS")  # (batch, seq_k)
    # fp8 dequantisation factors (batch, heads_kv); the inputs' dtype tells the kernels
    q_descale: Any = _field("b h", jnp.float32, "QDescale")
    k_descale: Any = _field("b h", jnp.float32, "KDescale")
    v_descale: Any = _field("b h", jnp.float32, "VDescale")
    # (batch, 3) int32 (pos_q, pos_k, D): the call is a block of a larger one (ring attention), query i
    # and key j being its query pos_q + i and key pos_k + j, D its seq_k - seq_q. The band, ALiBi and
    # dropout's hash follow those positions (kernels/masking.py `place`). Per batch row, so vmap and
    # sharding treat it like the other operands.
    positions: Any = _field("b p", jnp.int32, "Positions", "POSITIONS")
    # dense operands (batch | 1, query heads | 1, seq_q | 1, seq_k | 1): an additive bias (logits += bias, its
    # own float dtype) and a boolean mask (False hides a pair), read by the kernels as int8: AMD's buffer loads
    # (kernels/masking.py) cannot take the bitcast Triton puts on an i1 pointer (amd_report: 16 global loads a loop)
    bias: Any = _field(" ".join(DENSE_AXES), None, "Bias", "BIAS", dense=True)
    mask: Any = _field(" ".join(DENSE_AXES), jnp.int8, "Mask", "MASK", dense=True)

    def present(self) -> tuple[str, ...]:
        """Names of the fields that hold arrays, in declaration (= leaf) order."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

    def axes(self) -> tuple[str, ...]:
        """The sharding-rule axes of the present fields (leaf order); a dense field's axes of size one (where it
        broadcasts) get factors of their own, x0..x3, which a device holds whole."""
        out = []
        for name in self.present():
            spec, x = SPECS[name], getattr(self, name)
            if spec.dense:
                out.append(" ".join(f if n > 1 else f"x{i}" for i, (f, n) in enumerate(zip(DENSE_AXES, x.shape))))
            else:
                out.append(spec.axes)
        return tuple(out)

    def kernel_args(self, params) -> dict[str, Any]:
        """{kernel parameter: array or placeholder} for the parameters of `params` that are fields."""
        args = {}
        for name, spec in SPECS.items():
            if spec.param in params:
                x = getattr(self, name)
                if x is None:
                    x = jnp.zeros((1,), spec.dtype or jnp.float32)
                elif x.dtype == jnp.bool_ and spec.dtype is not None:
                    x = x.astype(spec.dtype)
                elif spec.dtype is not None and x.dtype != spec.dtype:
                    x = jax.lax.bitcast_convert_type(x, spec.dtype)
                args[spec.param] = x
        return args

    def heads(self, lo: int, hi: int, group: int) -> "Operands":
        """The operands of key/value heads [lo, hi) alone (query heads [lo * group, hi * group)): a call
        split by heads (_launch.backward's dS path)."""
        parts = {}
        for name in self.present():
            x = getattr(self, name)
            for axis, factor in enumerate(SPECS[name].axes.replace("(h g)", "q").split()):
                if factor in ("q", "h") and x.shape[axis] > 1 or factor == "h":
                    scale = group if factor == "q" else 1
                    x = jax.lax.slice_in_dim(x, lo * scale, hi * scale, axis=axis)
            parts[name] = x
        return dataclasses.replace(self, **parts)

    def kernel_flags(self, params) -> dict[str, bool | int]:
        """{constexpr: whether its operand is present (a dense one: its layout, 0 absent)} for the flags of
        `params`."""
        flags = {}
        for name, spec in SPECS.items():
            if spec.flag and spec.flag in params:
                x = getattr(self, name)
                flags[spec.flag] = (dense_layout(x) if x is not None else 0) if spec.dense else x is not None
        return flags


SPECS = {f.name: f.metadata["spec"] for f in dataclasses.fields(Operands)}
jax.tree_util.register_dataclass(Operands, data_fields=list(SPECS), meta_fields=[])
