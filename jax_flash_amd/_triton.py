"""The `triton` implementation: compiled kernels called from JAX through jax-triton custom calls.

jax_triton is imported on first use only: it fails to import on a CPU-only jaxlib.
"""
from __future__ import annotations

import functools
import logging

import jax

from jax_flash_amd import _jax_triton_compat
from jax_flash_amd._launch import Launch
from jax_flash_amd.plan import interpreted
from jax_flash_amd.kernels import configs

log = logging.getLogger(__name__)


def on_gpu() -> bool:
    return jax.default_backend() in ("gpu", "cuda", "rocm")


@functools.cache
def target() -> str:
    """configs.TARGETS key of the default device: "sm90" (Hopper), "cuda" (other NVIDIA), or the gfx arch
    on ROCm."""
    dev = jax.devices()[0]
    if "rocm" not in dev.client.platform_version.lower():
        return "sm90" if str(getattr(dev, "compute_capability", "")).startswith("9.") else "cuda"
    arch = str(getattr(dev, "compute_capability", "")).split(":")[0]
    if arch not in configs.TARGETS:
        log.warning("jax_flash_amd: no configs for ROCm arch %r; using gfx942's", arch)
        return "gfx942"
    return arch


def check_available() -> None:
    if not on_gpu():
        raise RuntimeError("implementation='triton' needs a GPU backend (CUDA or ROCm jaxlib); "
                           f"JAX's default backend is {jax.default_backend()!r}. "
                           "Use implementation='xla' or 'interpret' on the CPU.")
    if interpreted():
        raise RuntimeError("implementation='triton' needs compiled kernels, but TRITON_INTERPRET=1 was "
                           "set when triton was imported; unset it.")
    _jax_triton_compat.check_supported()
    try:
        import jax_triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"implementation='triton' could not import jax-triton: {e}") from e


def run(launch: Launch) -> tuple:
    return _jax_triton_compat.triton_call(launch)
