"""jax_flash_amd: FlashAttention for JAX as Triton kernels, for AMD Instinct (ROCm) and NVIDIA GPUs.

    out = jax_flash_amd.attention(q, k, v, causal=True)   # q, k, v: (batch, seq, heads, head_dim)
    layer = jax_flash_amd.FlashSelfAttention(num_heads=16, causal=True)   # flax.linen
    layer = jax_flash_amd.nnx.FlashSelfAttention(16, 1024, causal=True, rngs=nnx.Rngs(0))   # flax.nnx
    out = jax_flash_amd.ring_attention(q, k, v, axis_name="seq", causal=True)   # inside shard_map
    out, k_cache, v_cache = jax_flash_amd.attention_with_kvcache(q, k_cache, v_cache, lens, k=k, v=v)  # decode
    out, k_cache, v_cache = jax_flash_amd.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens)
    out = jax_flash_amd.dot_product_attention(q, k, v, bias, mask, is_causal=True)   # jax.nn's signature
    print(jax_flash_amd.explain(q, k, v, causal=True, target="gfx942"))   # which kernels run, and why
"""
from jax_flash_amd.api import attention, explain
from jax_flash_amd.attention_fn import flash_attention_fn
from jax_flash_amd.compat import dot_product_attention, flash_attn_func, flash_attn_with_kvcache
from jax_flash_amd import autotune, plan, reference
from jax_flash_amd.fp8 import quantize_fp8
from jax_flash_amd.kvcache import attention_with_kvcache
from jax_flash_amd.ring import ring_attention, unzigzag, zigzag

__all__ = ["FlashSelfAttention", "attention", "attention_with_kvcache", "autotune", "dot_product_attention", "explain",
           "flash_attention_fn", "flash_attn_func", "flash_attn_with_kvcache", "nnx", "plan", "quantize_fp8",
           "reference", "ring_attention", "unzigzag", "zigzag"]
__version__ = "0.1.0"


def __getattr__(name):
    # the modules import flax, an optional dependency: only when asked for
    if name == "FlashSelfAttention":
        from jax_flash_amd.linen import FlashSelfAttention
        return FlashSelfAttention
    if name == "nnx":
        import importlib
        return importlib.import_module("jax_flash_amd.nnx")
    raise AttributeError(f"module 'jax_flash_amd' has no attribute {name!r}")


def __dir__():
    # with the names __getattr__ imports on first use (FlashSelfAttention, nnx), so dir() and completion show
    # the whole public API
    return sorted(set(globals()) | set(__all__))
