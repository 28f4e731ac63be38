"""FP8 inputs (inference, forward only): which float8 types each target runs, their ranges, and a helper
that quantises bf16/fp16/fp32 tensors per (batch, head) with the dequantisation factors attention takes."""
from __future__ import annotations

import jax
import jax.numpy as jnp

TYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e4m3fnuz))
# float8 types whose dots each target's matrix units run: OCP e4m3fn on Hopper and MI350 (gfx950), the
# FNUZ variant on MI300 (gfx942); MI200 (gfx90a) has no fp8 matrix instructions. The interpreter runs both.
SUPPORTED = {
    "cuda": {jnp.dtype(jnp.float8_e4m3fn)},
    "sm90": {jnp.dtype(jnp.float8_e4m3fn)},
    "gfx950": {jnp.dtype(jnp.float8_e4m3fn)},
    "gfx942": {jnp.dtype(jnp.float8_e4m3fnuz)},
    "gfx90a": set(),
    "interpret": set(TYPES),
}


# P (in [0, 1]) is scaled by 2 ** this before its rounding to fp8 for the PV dot: a power of two (exact
# to undo) that keeps the largest P below the type's maximum (448 e4m3fn, 240 e4m3fnuz) and moves small
# probabilities out of the subnormal range.
P_LOG2 = {jnp.dtype(jnp.float8_e4m3fn): 8, jnp.dtype(jnp.float8_e4m3fnuz): 7}


def is_fp8(dtype) -> bool:
    return jnp.dtype(dtype) in TYPES


def check_supported(target: str, dtype) -> None:
    dtype = jnp.dtype(dtype)
    if dtype not in SUPPORTED.get(target, set()):
        runs = sorted(d.name for d in SUPPORTED.get(target, set())) or "no fp8 type"
        raise TypeError(f"{dtype.name} inputs cannot run on {target}: its matrix units take {runs}. "
                        "Quantise to the type the GPU runs (jax_flash_amd.quantize_fp8(x, dtype)), or use "
                        "bfloat16 inputs.")


def quantize_fp8(x, dtype=jnp.float8_e4m3fn):
    """(x in `dtype`, descale (batch, heads) float32) for x (batch, seq, heads, head_dim): each (batch,
    head) slice is scaled so its largest magnitude maps to the type's largest finite value; x ~= x_fp8 *
    descale[:, None, :, None]. Pass the descales as attention's q_descale / k_descale / v_descale."""
    dtype = jnp.dtype(dtype)
    if dtype not in TYPES:
        raise TypeError(f"dtype must be one of {[t.name for t in TYPES]}; got {dtype}")
    x = jnp.asarray(x, jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=(1, 3))  # (batch, heads)
    descale = jnp.where(amax > 0, amax / float(jnp.finfo(dtype).max), 1.0).astype(jnp.float32)
    return (x / descale[:, None, :, None]).astype(dtype), descale


def dequantize(x, descale) -> jax.Array:
    """x (batch, seq, heads, head_dim) in fp8 times its (batch, heads) descales, in float32."""
    return x.astype(jnp.float32) * descale[:, None, :, None]


NO_GRADIENT = ("attention with float8 inputs is forward-only (inference): it has no gradient. Differentiate a "
               "bfloat16/float16 call instead.")


@jax.custom_vjp
def forward_only(x):
    """x, with a gradient that raises NO_GRADIENT (the pure-JAX path's counterpart of the kernels' rule)."""
    return x


def _forward_only_fwd(x):
    return x, None


def _forward_only_bwd(_, g):
    raise TypeError(NO_GRADIENT)


forward_only.defvjp(_forward_only_fwd, _forward_only_bwd)
