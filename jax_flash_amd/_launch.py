"""What each kernel launch needs (grid, arguments, outputs, config), written once for every backend.

A backend supplies ``run(launch) -> tuple of outputs`` (jax-triton on a GPU, Triton's interpreter on
the CPU); ``forward`` and ``backward`` below chain the launches. Kernel argument order follows
jax-triton's convention: inputs (arrays and scalars), then outputs, then constexprs by keyword.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import fp8, reference
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


def block_d(head_dim: int, dtype=jnp.bfloat16) -> int:
    """Head dim padded to a power of two >= tl.dot's minimum reduction (16; 32 for fp8); the padding is
    masked, never stored."""
    return max(32 if fp8.is_fp8(dtype) else 16, 1 << (head_dim - 1).bit_length())


def config_width(head_dim: int, dtype) -> int:
    """The head width a config row must cover: float32 tiles count double (twice the registers); fp8
    ones count as 16-bit (the fp32 accumulator, not the inputs, sets the register need)."""
    return block_d(head_dim, dtype) * max(2, jnp.dtype(dtype).itemsize) // 2


_SELECTORS = ("max_block_d", "max_itemsize")  # configs.py: which calls a row serves


def fits(row: dict, width: int, dtype) -> bool:
    """Whether a config row serves a call of this config_width and input dtype."""
    return row["max_block_d"] >= width and jnp.dtype(dtype).itemsize <= row.get("max_itemsize", 8)


def pick_config(target: str, kernel: str, head_dim: int, dtype, rows=None, kind: str = "") -> tuple[dict, dict]:
    """(constexprs, compiler options): rows[kernel] when given (autotuning), else the heuristic
    default, the first configs.TARGETS row that fits the head and dtype, from the
    "<kernel>+<kind>" rows where the target has them (kind: see row_kind)."""
    row = (rows or {}).get(kernel)
    if row is None:
        width = config_width(head_dim, dtype)
        table = configs.TARGETS[target]
        candidates = table.get(f"{kernel}+{kind}", table[kernel]) if kind else table[kernel]
        row = next((r for r in candidates if fits(r, width, dtype)), None)
        if row is None:
            raise ValueError(f"no {kernel} config for head_dim={head_dim}, dtype={dtype} on {target}")
    blocks = {k: v for k, v in row.items() if k.isupper()}  # constexprs: BLOCK_*, SPLIT
    options = {k: v for k, v in row.items() if k not in _SELECTORS and not k.isupper()}
    return blocks, options


def row_kind(causal: bool, window: tuple[int, int], dropout_p: float = 0.0, group: int = 1,
             fp8_inputs: bool = False) -> str:
    """Which config rows a call takes: "fp8" for float8 inputs (a forward of another shape: half-size
    tiles, a longer softmax chain per MMA), else "window" for a narrow band (narrow_window), else
    "dropout" with dropout (its random numbers cost registers), else "gqa" with grouped query heads
    (group > 1: the dK/dV loop runs over the group's heads too), else "" (the plain rows)."""
    if fp8_inputs:
        return "fp8"
    if narrow_window(causal, window):
        return "window"
    return "dropout" if dropout_p > 0 else "gqa" if group > 1 else ""


def narrow_window(causal: bool, window: tuple[int, int]) -> bool:
    """A band bounded on both sides and at most configs.NARROW_WINDOW keys wide (its "+window" rows)."""
    left, right = reference.band_edges(causal, window)
    return 0 <= left and 0 <= right and left + right + 1 <= configs.NARROW_WINDOW


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


def segment_ranges(ids, other_ids, block: int) -> jax.Array:
    """(batch, blocks, 2) int32: for each block of `block` positions of ids (batch, seq), the range
    [lo, hi) of positions of other_ids (batch, seq_other) whose id can equal one in the block. Exact
    when other_ids is sorted along each row (the usual packing; ids need not be); the whole range
    otherwise. The kernels skip the blocks outside it (masking.segment_span)."""
    b, seq = ids.shape
    n = _cdiv(seq, block)
    info = jnp.iinfo(jnp.int32)
    pad = ((0, 0), (0, n * block - seq))
    lowest = jnp.pad(ids, pad, constant_values=info.max).reshape(b, n, block).min(-1)
    highest = jnp.pad(ids, pad, constant_values=info.min).reshape(b, n, block).max(-1)

    def find(side, values):
        return jax.vmap(functools.partial(jnp.searchsorted, side=side, method="scan_unrolled"))(other_ids, values)

    lo, hi = find("left", lowest), find("right", highest)
    ordered = jnp.all(other_ids[:, 1:] >= other_ids[:, :-1], axis=1)[:, None]
    lo = jnp.where(ordered, lo, 0)
    hi = jnp.where(ordered, hi, other_ids.shape[1])
    return jnp.stack([lo, hi], axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Variant:
    """The optional operands of one call: ALiBi slopes (batch, heads) float32, dropout Philox keys
    (batch, heads, 2) uint32 with dropout_p, segment ids (batch, seq_q) / (batch, seq_k) int32. None:
    off (the kernels then get small dummies their constexprs tell them not to read)."""
    slopes: Any = None
    seeds: Any = None
    dropout_p: float = 0.0
    q_segment_ids: Any = None
    kv_segment_ids: Any = None
    descales: Any = None  # fp8 inputs: the q, k, v dequantisation factors, (batch, heads_kv) float32 each

    def operands(self) -> tuple:
        """(Slopes, Seeds, QSeg, KSeg) kernel arguments."""
        dummy = jnp.zeros((1,), jnp.int32)
        return (jnp.zeros((1,), jnp.float32) if self.slopes is None else self.slopes,
                dummy if self.seeds is None else jax.lax.bitcast_convert_type(self.seeds, jnp.int32),
                dummy if self.q_segment_ids is None else self.q_segment_ids,
                dummy if self.kv_segment_ids is None else self.kv_segment_ids)

    def descale_operands(self) -> tuple:
        return (jnp.zeros((1,), jnp.float32),) * 3 if self.descales is None else tuple(self.descales)

    def ranges(self, query_side: bool, block: int):
        """segment_ranges of query blocks (query_side) or key blocks; a dummy without segment ids."""
        if self.q_segment_ids is None:
            return jnp.zeros((1,), jnp.int32)
        ids, other = self.q_segment_ids, self.kv_segment_ids
        return segment_ranges(ids, other, block) if query_side else segment_ranges(other, ids, block)

    @property
    def drop_threshold(self) -> int:
        return reference.dropout_threshold(self.dropout_p) if self.dropout_p > 0 else 0

    @property
    def keep_scale(self) -> np.float32:
        return np.float32(reference.dropout_keep_scale(self.dropout_p) if self.dropout_p > 0 else 1.0)


def _common(q, k, banded: bool, softcap: float, variant: Variant) -> dict[str, Any]:
    return dict(H=q.shape[2], KV_H=k.shape[2], HEAD_DIM=q.shape[3], BLOCK_D=block_d(q.shape[3], q.dtype),
                BANDED=banded, SOFTCAP=softcap > 0, ALIBI=variant.slopes is not None,
                SEGMENTS=variant.q_segment_ids is not None, DROP_THRESHOLD=variant.drop_threshold)


def keys_last(run: Run, target: str, v):
    """v (batch, seq_k, heads, D) as (batch, heads, D, seq_k rounded up to 16), zero-padded: the layout
    the fp8 forward reads (kernels/fwd.py)."""
    b, sk, h, d = v.shape
    padded = _cdiv(sk, 16) * 16  # kernels/fwd.py: keys_padded
    blocks, options = pick_config(target, "keys_last", d, v.dtype)
    (vt,) = run(Launch(
        kernel=fwd.keys_last,
        grid=(_cdiv(padded, blocks["BLOCK_N"]), b * h),
        args=(v, sk),
        out_shapes=(jax.ShapeDtypeStruct((b, h, d, padded), v.dtype),),
        constexprs=dict(KV_H=h, HEAD_DIM=d, BLOCK_D=block_d(d, v.dtype), **blocks),
        compile_options=options,
    ))
    return vt


def forward(run: Run, target: str, q, k, v, variant: Variant = Variant(), *, causal: bool, scale: float,
            window=(-1, -1), softcap: float = 0.0, rows=None):
    """(out, lse): out like q (bfloat16 for fp8 inputs), lse (batch, heads, seq_q) float32, natural log.
    variant: the optional operands (Variant). rows: {kernel: config row} overriding the defaults
    (autotuning)."""
    b, sq, h, _ = q.shape
    fp8_inputs = fp8.is_fp8(q.dtype)
    banded, lo_off, hi_off = band(causal, window, sq, k.shape[1])
    blocks, options = pick_config(target, "fwd", q.shape[3], q.dtype, rows,
                                  row_kind(causal, window, variant.dropout_p, h // k.shape[2], fp8_inputs))
    if fp8_inputs:
        v = keys_last(run, target, v)
    out, lse = run(Launch(
        kernel=fwd.attn_fwd,
        grid=(_cdiv(sq, blocks["BLOCK_M"]), b * h),
        args=(q, k, v, *variant.operands(), variant.ranges(True, blocks["BLOCK_M"]), *variant.descale_operands(),
              np.float32(scale), np.float32(softcap), variant.keep_scale, sq, k.shape[1], lo_off, hi_off),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, jnp.bfloat16 if fp8_inputs else q.dtype),
                    jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
        constexprs={**_common(q, k, banded, softcap, variant), **blocks,
                    "P8_LOG2": fp8.P_LOG2.get(jnp.dtype(q.dtype), 0)},
        compile_options=options,
    ))
    return out, lse


def backward(run: Run, target: str, q, k, v, out, lse, dout, dlse, variant: Variant = Variant(), *, causal: bool,
             scale: float, window=(-1, -1), softcap: float = 0.0, rows=None):
    """(dq, dk, dv) for cotangents dout (like out) and dlse (like lse)."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    banded, lo_off, hi_off = band(causal, window, sq, sk)
    common = _common(q, k, banded, softcap, variant)
    operands = variant.operands()
    scalars = (np.float32(scale), np.float32(softcap), variant.keep_scale, sq, sk, lo_off, hi_off)
    kind = row_kind(causal, window, variant.dropout_p, h // k.shape[2])
    # dQ first: it writes delta (b, h, seq_q), which the dK/dV kernel reads
    blocks, options = pick_config(target, "dq", d, q.dtype, rows, kind)
    dq, delta = run(Launch(
        kernel=bwd.attn_bwd_dq,
        grid=(_cdiv(sq, blocks["BLOCK_M"]), b * h),
        args=(q, k, v, *operands, variant.ranges(True, blocks["BLOCK_M"]), out, dout, dlse, lse, *scalars),
        out_shapes=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
        constexprs={**common, **blocks},
        compile_options=options,
    ))
    blocks, options = pick_config(target, "dkdv", d, q.dtype, rows, kind)
    blocks = {"SPLIT": False, **blocks}
    dk, dv = run(Launch(
        kernel=bwd.attn_bwd_dkdv,
        # one program per key/value head; SPLIT: one for dV, one for dK
        grid=(_cdiv(sk, blocks["BLOCK_N"]), b * k.shape[2], 2 if blocks["SPLIT"] else 1),
        args=(q, k, v, *operands, variant.ranges(False, blocks["BLOCK_N"]), dout, lse, delta, *scalars),
        out_shapes=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        constexprs={**common, **blocks},
        compile_options=options,
    ))
    return dq, dk, dv
