"""jax_flash_amd: FlashAttention for JAX as Triton kernels, for AMD Instinct (ROCm) and NVIDIA GPUs.

    out = jax_flash_amd.attention(q, k, v, causal=True)   # q, k, v: (batch, seq, heads, head_dim)
"""
from jax_flash_amd.api import attention
from jax_flash_amd import autotune, reference

__all__ = ["attention", "autotune", "reference"]
__version__ = "0.1.0"
