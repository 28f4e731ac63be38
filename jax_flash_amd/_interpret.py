"""The `interpret` implementation: the same Triton kernels, run by Triton's interpreter on the CPU
through a JAX host callback. For tests and for reading kernels on machines without a GPU."""
from __future__ import annotations

import dataclasses
import functools
import threading

import jax
import numpy as np

from jax_flash_amd._launch import Launch
from jax_flash_amd.plan import interpreted

TARGET = "interpret"
_FP8 = {np.dtype(jax.numpy.float8_e4m3fn): "float8_e4m3fn", np.dtype(jax.numpy.float8_e4m3fnuz): "float8_e4m3fnuz"}
# Triton's interpreter keeps global state (the grid being run, its builder): one kernel at a time, even
# when several CPU devices of a sharded computation call back concurrently.
_LOCK = threading.Lock()


def target() -> str:
    """configs.TARGETS key of this implementation (small blocks, so tests see ragged and masked ones)."""
    return TARGET


def check_available() -> None:
    """Raise a clear error unless the kernels were built for Triton's interpreter."""
    if not interpreted():
        raise RuntimeError(
            "implementation='interpret' runs the Triton kernels in Triton's interpreter, which Triton "
            "only enables when TRITON_INTERPRET=1 is set before triton is first imported. "
            "Start Python with TRITON_INTERPRET=1 (e.g. `TRITON_INTERPRET=1 python ...`).")
    try:
        import torch  # noqa: F401  (the interpreter's argument handling expects torch tensors)
    except ImportError as e:
        raise RuntimeError("implementation='interpret' needs PyTorch (CPU build is enough): "
                           "pip install torch --index-url https://download.pytorch.org/whl/cpu") from e
    _patch_bf16()


@functools.cache
def _patch_bf16() -> None:
    """Two bf16 bugs of Triton <= 3.9's interpreter, which stores bf16 as raw uint16 bits:
    - create_dot multiplies those bits as integers (garbage): widen bf16 operands to fp32 first
      (exact for products of bf16 values);
    - fp32 -> bf16 casts truncate, where GPUs round to nearest even (a 1-ulp bias in every rounded P
      and every stored bf16 output): round to nearest even, as the compiled kernels do.
    Its fp32 -> float8 conversion (create_fp_to_fp) mishandles rounding carries and subnormals: done
    with ml_dtypes instead (round to nearest even, as the GPUs' default).
    Everything else in the kernels (bf16 loads and stores, rounding P to bf16) stays as on a GPU."""
    import ml_dtypes
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    original_dot, original_cast = builder.create_dot, builder.cast_impl

    def widen(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        bits = t.data.astype(np.uint32) << np.uint32(16)
        return interp.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, *args, **kwargs):
        return original_dot(self, widen(a), widen(b), *args, **kwargs)

    fp8 = {tl.float8e4nv: ml_dtypes.float8_e4m3fn, tl.float8e4b8: ml_dtypes.float8_e4m3fnuz}
    original_fp_to_fp = builder.create_fp_to_fp

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = src.data.astype(ml_dtypes.bfloat16).view(np.uint16)
            return interp.TensorHandle(data, tl.bfloat16)
        return original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar in fp8:
            data = src.data.astype(fp8[dst_type.scalar]).view(np.uint8)
            return interp.TensorHandle(data, dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_dot, builder.cast_impl, builder.create_fp_to_fp = create_dot, cast_impl, create_fp_to_fp


def _to_torch(a: np.ndarray):
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype == jax.numpy.bfloat16:  # torch cannot wrap ml_dtypes' bfloat16: go through the bits
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    if a.dtype in _FP8:  # nor its float8 types
        return torch.from_numpy(a.view(np.uint8).copy()).view(getattr(torch, _FP8[a.dtype]))
    return torch.from_numpy(a.copy())


def _to_numpy(t, dtype) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        return t.view(torch.uint8).numpy().view(dtype)
    return t.numpy()


def _call_on_host(launch: Launch, array_positions, *arrays):
    args = list(launch.args)
    for pos, a in zip(array_positions, arrays):
        args[pos] = _to_torch(a)
    args = [float(a) if isinstance(a, np.floating) else a for a in args]
    # NaN-poisoned outputs: an element the kernel fails to write shows up in tests
    outs = [_to_torch(np.full(s.shape, np.nan, s.dtype)) for s in launch.out_shapes]
    for pos, out in launch.aliases:  # written in place, as on a GPU: the output starts as the input
        outs[out] = args[pos]
    with _LOCK:
        launch.kernel[launch.grid](*args, *outs, **launch.constexprs)
    return tuple(_to_numpy(o, s.dtype) for o, s in zip(outs, launch.out_shapes))


def run(launch: Launch) -> tuple:
    positions = tuple(i for i, a in enumerate(launch.args) if isinstance(a, jax.Array))
    arrays = [launch.args[i] for i in positions]
    host_launch = dataclasses.replace(launch, args=tuple(None if i in positions else a for i, a in enumerate(launch.args)))
    return tuple(jax.pure_callback(functools.partial(_call_on_host, host_launch, positions),
                                   launch.out_shapes, *arrays))
