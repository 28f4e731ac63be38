"""What each kernel launch needs (grid, arguments, outputs, config), written once for every backend.

A backend supplies ``run(launch) -> tuple of outputs`` (jax-triton on a GPU, Triton's interpreter on
the CPU); ``forward`` and ``backward`` below chain the launches. Kernel argument order follows
jax-triton's convention: inputs (arrays and scalars), then outputs, then constexprs by keyword.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import reference
from jax_flash_amd.kernels import bwd, configs, fwd, masking


@dataclasses.dataclass(frozen=True)
class Launch:
    kernel: Any  # a @triton.jit function
    grid: tuple[int, ...]
    args: tuple  # jax arrays, then Python int / np.float32 scalars, in the kernel's order
    out_shapes: tuple[jax.ShapeDtypeStruct, ...]
    constexprs: dict[str, Any]
    compile_options: dict[str, Any]  # num_warps, num_stages, and target-specific ones


Run = Callable[[Launch], tuple]


def block_d(head_dim: int) -> int:
    """Head dim padded to a power of two >= 16 (tl.dot's minimum); the padding is masked, never stored."""
    return max(16, 1 << (head_dim - 1).bit_length())


def config_width(head_dim: int, dtype) -> int:
    """The head width a config row must cover: float32 tiles count double (twice the registers)."""
    return block_d(head_dim) * jnp.dtype(dtype).itemsize // 2


def pick_config(target: str, kernel: str, head_dim: int, dtype, rows=None) -> tuple[dict, dict]:
    """(block constexprs, compiler options): rows[kernel] when given (autotuning), else the heuristic
    default, the first configs.TARGETS row whose max_block_d covers the head."""
    row = (rows or {}).get(kernel)
    if row is None:
        width = config_width(head_dim, dtype)
        row = next((r for r in configs.TARGETS[target][kernel] if r["max_block_d"] >= width), None)
        if row is None:
            raise ValueError(f"no {kernel} config for head_dim={head_dim}, dtype={dtype} on {target}")
    blocks = {k: v for k, v in row.items() if k.startswith("BLOCK_")}
    options = {k: v for k, v in row.items() if k != "max_block_d" and not k.startswith("BLOCK_")}
    return blocks, options


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def band(causal: bool, window: tuple[int, int], seq_q: int, seq_k: int) -> tuple[bool, int, int]:
    """(BANDED, lo_off, hi_off) of kernels/masking.py: query i sees key j iff i + lo_off <= j <= i + hi_off.
    window = (left, right), -1 unbounded; causal caps right at 0 (FlashAttention's convention)."""
    left, right = reference.band_edges(causal, window)
    diag = seq_k - seq_q
    unbounded = masking.UNBOUNDED.value
    lo_off = diag - left if left >= 0 else -unbounded
    hi_off = diag + right if right >= 0 else unbounded
    return left >= 0 or right >= 0, lo_off, hi_off


def _slopes(slopes, b: int, h: int):
    """(ALIBI, a (batch, heads) float32 array for the kernels' Slopes argument; a dummy when None)."""
    if slopes is None:
        return False, jnp.zeros((b, h), jnp.float32)
    return True, slopes


def _common(q, k, banded: bool, softcap: float, alibi: bool) -> dict[str, Any]:
    return dict(H=q.shape[2], KV_H=k.shape[2], HEAD_DIM=q.shape[3], BLOCK_D=block_d(q.shape[3]), BANDED=banded,
                SOFTCAP=softcap > 0, ALIBI=alibi)


def forward(run: Run, target: str, q, k, v, slopes=None, *, causal: bool, scale: float, window=(-1, -1),
            softcap: float = 0.0, rows=None):
    """(out, lse): out like q, lse (batch, heads, seq_q) float32, natural log. slopes: ALiBi slopes
    (batch, heads) float32 or None. rows: {kernel: config row} overriding the defaults (autotuning)."""
    b, sq, h, _ = q.shape
    alibi, slopes = _slopes(slopes, b, h)
    banded, lo_off, hi_off = band(causal, window, sq, k.shape[1])
    blocks, options = pick_config(target, "fwd", q.shape[3], q.dtype, rows)
    out, lse = run(Launch(
        kernel=fwd.attn_fwd,
        grid=(_cdiv(sq, blocks["BLOCK_M"]), b * h),
        args=(q, k, v, slopes, np.float32(scale), np.float32(softcap), sq, k.shape[1], lo_off, hi_off),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
        constexprs={**_common(q, k, banded, softcap, alibi), **blocks},
        compile_options=options,
    ))
    return out, lse


def backward(run: Run, target: str, q, k, v, out, lse, dout, dlse, slopes=None, *, causal: bool, scale: float,
             window=(-1, -1), softcap: float = 0.0, rows=None):
    """(dq, dk, dv) for cotangents dout (like out) and dlse (like lse)."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    banded, lo_off, hi_off = band(causal, window, sq, sk)
    alibi, slopes = _slopes(slopes, b, h)
    common = _common(q, k, banded, softcap, alibi)
    blocks, options = pick_config(target, "preprocess", d, q.dtype, rows)
    (delta,) = run(Launch(
        kernel=bwd.attn_bwd_preprocess,
        grid=(_cdiv(sq, blocks["BLOCK_M"]), b * h),
        args=(out, dout, dlse, sq),
        out_shapes=(jax.ShapeDtypeStruct((b, h, sq), jnp.float32),),
        constexprs={k_: common[k_] for k_ in ("H", "HEAD_DIM", "BLOCK_D")} | blocks,
        compile_options=options,
    ))
    blocks, options = pick_config(target, "dkdv", d, q.dtype, rows)
    dk, dv = run(Launch(
        kernel=bwd.attn_bwd_dkdv,
        grid=(_cdiv(sk, blocks["BLOCK_N"]), b * k.shape[2]),  # one program per key/value head
        args=(q, k, v, slopes, dout, lse, delta, np.float32(scale), np.float32(softcap), sq, sk, lo_off, hi_off),
        out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        constexprs={**common, **blocks},
        compile_options=options,
    ))
    blocks, options = pick_config(target, "dq", d, q.dtype, rows)
    (dq,) = run(Launch(
        kernel=bwd.attn_bwd_dq,
        grid=(_cdiv(sq, blocks["BLOCK_M"]), b * h),
        args=(q, k, v, slopes, dout, lse, delta, np.float32(scale), np.float32(softcap), sq, sk, lo_off, hi_off),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype),),
        constexprs={**common, **blocks},
        compile_options=options,
    ))
    return dq, dk, dv
