"""Which config row of kernels/configs.py a launch takes (the rows themselves are data, there)."""
from __future__ import annotations

import jax.numpy as jnp

from jax_flash_amd import _jax_triton_compat, fp8
from jax_flash_amd.kernels import configs
from jax_flash_amd.rules import Band

# configs.py: which calls a row serves
_SELECTORS = ("max_block_d", "min_block_d", "max_itemsize", "max_banded_seq", "persistent_only")


def block_d(head_dim: int, dtype=jnp.bfloat16) -> int:
    """Head dim padded to a power of two >= tl.dot's minimum reduction (16; 32 for fp8); the padding is
    masked, never stored."""
    return max(32 if fp8.is_fp8(dtype) else 16, 1 << (head_dim - 1).bit_length())


def config_width(head_dim: int, dtype) -> int:
    """The head width a config row must cover: float32 tiles count double (twice the registers); fp8
    ones count as 16-bit (the fp32 accumulator, not the inputs, sets the register need)."""
    return block_d(head_dim, dtype) * max(2, jnp.dtype(dtype).itemsize) // 2


def fits(row: dict, width: int, dtype, banded_seq: int = 0) -> bool:
    """Whether a config row serves a call of this config_width and input dtype; banded_seq: the call's
    length (the longer of queries and keys) where a band (causal, window) bounds it, else 0."""
    return (row.get("min_block_d", 0) <= width <= row["max_block_d"]
            and jnp.dtype(dtype).itemsize <= row.get("max_itemsize", 8)
            and banded_seq <= row.get("max_banded_seq", banded_seq))


def row_kind(band: Band, dropout_p: float = 0.0, group: int = 1, fp8_inputs: bool = False) -> str:
    """Which config rows a call takes: "fp8" for float8 inputs (a forward of another shape: half-size
    tiles, a longer softmax chain per MMA), else "window" for a band bounded on both sides and at most
    configs.NARROW_WINDOW keys wide (short key loops), else "dropout" with dropout (its random numbers
    cost registers), else "gqa" with grouped query heads (group > 1: the dK/dV loop runs over the
    group's heads too), else "" (the plain rows)."""
    if fp8_inputs:
        return "fp8"
    if band.narrow(configs.NARROW_WINDOW):
        return "window"
    return "dropout" if dropout_p > 0 else "gqa" if group > 1 else ""


def pick_config(target: str, kernel: str, head_dim: int, dtype, rows=None, kind: str = "",
                tma: bool = True, banded_seq: int = 0, persistent: bool = True) -> tuple[dict, dict]:
    """(constexprs, compiler options): rows[kernel] when given (autotuning), else the first
    configs.TARGETS row that fits the head, dtype and banded_seq (fits), from the "<kernel>+<kind>" rows
    where the target has them (kind: row_kind). tma=False: rows with TMA are passed over (the call cannot
    take that path); persistent=False: rows marked persistent_only are (the call would run them tiled)."""
    row = (rows or {}).get(kernel)
    if row is not None and row.get("TMA") and not tma:
        row = None
    if row is None:
        width = config_width(head_dim, dtype)
        table = configs.TARGETS[target]
        candidates = table.get(f"{kernel}+{kind}", table[kernel]) if kind else table[kernel]
        row = next((r for r in candidates if fits(r, width, dtype, banded_seq) and (tma or not r.get("TMA"))
                    and (persistent or not r.get("persistent_only"))), None)
        if row is None:
            raise ValueError(f"no {kernel} config for head_dim={head_dim}, dtype={dtype} on {target}")
    blocks = {k: v for k, v in row.items() if k.isupper()}  # constexprs: BLOCK_*, SPLIT, TMA, ...
    if blocks.get("WARP_SPECIALIZE") and not _jax_triton_compat.launches_compiled_warps():
        blocks["WARP_SPECIALIZE"] = False  # launched with the requested warps, it would run a third of them
    options = {k: v for k, v in row.items() if k not in _SELECTORS and not k.isupper()}
    return blocks, options
