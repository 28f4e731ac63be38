"""Triton kernels of jax_flash_amd (installed as ``jax_flash_amd.kernels``).

Only ``@triton.jit`` code and tuning configs as data live here; nothing imports JAX.
"""
