"""The `triton` implementation: compiled kernels called from JAX through jax-triton custom calls.

jax_triton is imported on first use only: it fails to import on a CPU-only jaxlib.
"""
from __future__ import annotations

import functools
import logging

import jax

from jax_flash_amd._launch import Launch
from jax_flash_amd.kernels import configs

log = logging.getLogger(__name__)

# What jax-triton 0.3.1 forwards to Triton's compiler. Others in a config row (HIP's waves_per_eu,
# matrix_instr_nonkdim) would reach the kernel as unknown constexprs, so they are held back here.
_FORWARDED_OPTIONS = ("num_warps", "num_stages")


def on_gpu() -> bool:
    return jax.default_backend() in ("gpu", "cuda", "rocm")


@functools.cache
def target() -> str:
    """configs.TARGETS key of the default device: "cuda", or the gfx arch on ROCm."""
    dev = jax.devices()[0]
    if "rocm" not in dev.client.platform_version.lower():
        return "cuda"
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
    from triton.runtime.interpreter import InterpretedFunction

    from jax_flash_amd.kernels import fwd

    if isinstance(fwd.attn_fwd, InterpretedFunction):
        raise RuntimeError("implementation='triton' needs compiled kernels, but TRITON_INTERPRET=1 was "
                           "set when triton was imported; unset it.")
    try:
        import jax_triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError("implementation='triton' needs jax-triton: pip install 'jax-triton>=0.3.1'") from e


def run(launch: Launch) -> tuple:
    import jax_triton

    options = {k: v for k, v in launch.compile_options.items() if k in _FORWARDED_OPTIONS}
    outs = jax_triton.triton_call(*launch.args, kernel=launch.kernel, out_shape=launch.out_shapes,
                                  grid=launch.grid, **options, **launch.constexprs)
    return tuple(outs)
