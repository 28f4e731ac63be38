"""Test setup: on a CPU-only machine the kernels run in Triton's interpreter, which Triton enables
only if TRITON_INTERPRET=1 is set before triton is first imported (so before jax_flash_amd)."""
import os

# test workers (pytest-xdist) share one GPU: none may take most of its memory up front
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

if jax.default_backend() == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
