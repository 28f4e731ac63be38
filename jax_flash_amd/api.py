"""The public entry point: argument checks, implementation choice, dispatch."""
from __future__ import annotations

import math
from numbers import Real

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import _dispatch, fp8, plan, reference
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band

IMPLEMENTATIONS = _dispatch.IMPLEMENTATIONS
_DESCALES = ("q_descale", "k_descale", "v_descale")
_F32_TINY = float(np.finfo(np.float32).tiny)
# From here on softcap is off. Below it the quotient x / softcap loses at most softcap * 2**-126 < 2**-24 where a
# subnormal quotient is flushed to zero (XLA on the CPU, the GPUs); from it on c * tanh(x / c) differs from x by
# at most |x|^3 / (3 c^2), below float32's rounding of x for every |x| < 2**90.
SOFTCAP_OFF = 2.0 ** 102
# float32 resolves a logit to eps * |logit|: beyond 2**16 that is over 2**-7, and the backward's recomputed
# probabilities part from the forward's; a larger scale puts every |q.k| >= 1 there
MAX_SOFTMAX_SCALE = 2.0 ** 16
_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32)
MAX_HEAD_DIM = 256


def attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
              dropout_p: float = 0.0, dropout_rng=None, q_segment_ids=None, kv_segment_ids=None,
              q_descale=None, k_descale=None, v_descale=None, bias=None, mask=None, return_lse: bool = False,
              deterministic: bool = True, implementation: str | None = None):
    """Exact softmax attention, O(seq) memory, differentiable, as FlashAttention computes it.

    Args:
      q: (batch, seq_q, heads_q, head_dim) float16, bfloat16 or float32; or float8_e4m3fn /
        float8_e4m3fnuz for inference (forward only, with the descales below).
      k, v: (batch, seq_k, heads_kv, head_dim), same dtype as q. Any seq_q, seq_k >= 0; head_dim 1..256.
        heads_q a multiple of heads_kv: grouped-query (or multi-query, heads_kv = 1) attention, query
        head h attends with key/value head h // (heads_q // heads_kv); K/V are never copied per head.
      causal: query i sees key j iff j <= i + seq_k - seq_q (bottom-right aligned, as FlashAttention).
        A query row that sees no key gets output 0, lse -inf and zero gradients.
      softmax_scale: logits are scale * q.k; default 1 / sqrt(head_dim). A static number in [2**-126,
        2**16] (others raise ValueError). Every implementation computes the logits in float32, which
        resolves a logit to eps * |logit|: results are within float32 precision of float64 while
        |scale * q.k| <= 2**16 (at the largest scale, |q.k| <= 1), and drift or overflow far beyond.
      window_size: (left, right) sliding window, bottom-right aligned like causal: query i sees key j iff
        i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right; -1 leaves that side unbounded
        (default (-1, -1): no window). With causal, right is capped at 0. Key blocks outside the window
        are skipped, so the cost grows with seq * window, not seq^2.
      softcap: > 0 caps the logits: s = softcap * tanh(scale * q.k / softcap) (0: off). A static number:
        0, or from 2**-126 (float32's smallest normal number; smaller raise ValueError) on. From
        2**102 (5.1e30) on it is off: float32 cannot tell such a cap from plain attention (it changes no
        logit below 2**90 by more than float32's rounding), while the quotient scale * q.k / softcap
        would lose its precision to float32's subnormal range.
      alibi_slopes: (heads_q,) or (batch, heads_q) float: ALiBi, logits -= slope * |i + seq_k - seq_q - j|.
        Treated as constants (zero gradient), as in FlashAttention.
      dropout_p: attention-probability dropout rate in [0, 1), a static number. One random byte per
        probability (as in FlashAttention), so the rate applied is dropout_p rounded to a multiple of
        1/256 (at least 1/256; rules.dropout_rate); kept probabilities are scaled by 1 / (1 - that
        rate), which keeps the expectation exact. The mask comes from a counter-based hash of the
        (query, key) position, keyed per (batch, head) by dropout_rng (kernels/dropout.py), drawn inside
        the kernels and never stored; the backward regenerates the same mask. All three implementations
        draw the same mask for the same key.
      dropout_rng: a JAX PRNG key (jax.random.key or jax.random.PRNGKey), required when dropout_p > 0.
        The same key gives the same mask.
      q_segment_ids, kv_segment_ids: (batch, seq_q) and (batch, seq_k) integer ids for packed
        sequences (wider types, e.g. int64 under x64, are converted to int32 exactly: cast where the
        values fit, else renumbered per row): query i sees key j only if their ids are equal. Given one and
        seq_q == seq_k, the other defaults to it. When kv_segment_ids (for the backward also
        q_segment_ids) are sorted along the sequence, as packing makes them, blocks of keys that
        cannot share an id are skipped.
      q_descale, k_descale, v_descale: (batch, heads_kv) float dequantisation factors, required with
        float8 inputs (x ~= x_fp8 * descale; jax_flash_amd.quantize_fp8 makes both). The q.k dot runs in
        fp8 with fp32 accumulation, scaled by softmax_scale * q_descale * k_descale; P is multiplied by
        256 (e4m3fn; 128 for e4m3fnuz, whose maximum is 240) and rounded to v's fp8 type for the PV dot,
        which keeps small probabilities out of the subnormals; the output divides that back out and is
        multiplied by v_descale. Output bfloat16. float8_e4m3fn runs on NVIDIA Hopper and AMD gfx950,
        float8_e4m3fnuz on gfx942 (MI300); both in the interpreter. Differentiating an fp8 call raises
        TypeError; dropout is refused (training only).
      bias: an additive bias of the logits, float16 / bfloat16 / float32, of a shape that broadcasts to (batch,
        heads_q, seq_q, seq_k) (a shorter rank gains leading axes; each axis its size or 1), added after softcap
        and ALiBi; read tile by tile, never expanded. Differentiable: its gradient is summed over the axes it
        broadcasts along.
      mask: a boolean mask of such a shape: False hides a (query, key) pair, as causal or a window do. Blocks of
        keys it hides from every query of a block are skipped. A row it hides entirely gives output 0.
      return_lse: also return the logsumexp of the scaled logits, (batch, heads, seq_q) float32,
        natural log; it is differentiable too.
      deterministic: True (default): gradients bitwise equal from run to run. False lets a backward that sums dQ
        across programs (the linear backward, plan.Policy(linear_backward=True)) do so by atomics, in an order
        that varies; the other backward plans are deterministic either way.
      implementation: "triton" (GPU: CUDA or ROCm), "interpret" (the same Triton kernels in Triton's
        interpreter on the CPU; needs TRITON_INTERPRET=1 before triton is imported), "xla" (pure JAX,
        O(seq^2) memory, any backend). None: "triton" on a GPU backend, else "interpret" when
        TRITON_INTERPRET=1, else "xla".

    Returns:
      out with q's shape and dtype (bfloat16 for float8 inputs), or (out, lse) when return_lse.

    NaN (every implementation alike, as float64): a NaN in a query row makes that row's out, lse and dq
    NaN, and dk and dv of the keys it sees (maybe of more keys of its batch and head: the kernels' whole
    loaded key blocks, xla's dk); other rows' out, lse and dq are unaffected.

    Example:
      >>> out = jax_flash_amd.attention(q, k, v, causal=True)
      >>> dq = jax.grad(lambda q: jax_flash_amd.attention(q, k, v).astype(jnp.float32).sum())(q)
    """
    impl = _dispatch.choose_implementation(implementation)
    q, k, v, extras, opts = _prepare(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
                                     dropout_rng, q_segment_ids, kv_segment_ids, q_descale, k_descale, v_descale,
                                     return_lse, impl, bias=bias, mask=mask, deterministic=deterministic)
    b, sq, h, _ = q.shape
    if q.size == 0 or k.shape[1] == 0:  # nothing to attend to (or nothing to compute): no kernel launch
        out = jnp.zeros(q.shape, jnp.bfloat16 if fp8.is_fp8(q.dtype) else q.dtype)
        lse = jnp.full((b, h, sq), -jnp.inf, jnp.float32)
        return (out, lse) if return_lse else out
    out, lse = _dispatch.attention(q, k, v, extras, opts)
    return (out, lse) if return_lse else out


def _prepare(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, dropout_rng,
             q_segment_ids, kv_segment_ids, q_descale, k_descale, v_descale, return_lse, impl: str, target=None,
             bias=None, mask=None, band: Band | None = None, positions=None, deterministic=True):
    """attention's arguments checked: (q, k, v, Operands, dispatch.Options). target: the kernels' target where it
    is not this machine's (explain). band, positions: a band and Operands.positions given by the caller
    (dot_product_attention's top-left alignment) in place of causal and window_size's."""
    q, k, v = _check_arrays(q, k, v)
    _check_flag("causal", causal)
    _check_flag("return_lse", return_lse)
    _check_flag("deterministic", deterministic)
    window = _check_window(window_size)
    softcap = _check_softcap(softcap)
    slopes = _check_slopes(alibi_slopes, q.shape[0], q.shape[2])
    scale = _check_scale(softmax_scale, q.shape[-1])
    dropout_p = _check_dropout(dropout_p, dropout_rng)
    q_seg, kv_seg = _check_segment_ids(q_segment_ids, kv_segment_ids, q.shape[:2], k.shape[:2])
    descales = _check_descales(q, k, (q_descale, k_descale, v_descale), dropout_p)
    dense = {name: _check_dense(name, x, q.shape, k.shape[1], descales) for name, x in (("bias", bias), ("mask", mask))}
    if descales is not None and impl != "xla":
        fp8.check_supported(target or _dispatch.backend(impl)[1], q.dtype)
    b, sq, h, _ = q.shape
    if impl != "xla":
        _check_kernel_limits(q, k, dense)
    extras = Operands(slopes=slopes, seeds=reference.dropout_seeds(dropout_rng, b, h) if dropout_p > 0 else None,
                      q_segment_ids=q_seg, kv_segment_ids=kv_seg, positions=positions,
                      **dict(zip(_DESCALES, descales or (None,) * 3)), **dense)
    opts = _dispatch.Options(implementation=impl, softmax_scale=scale, softcap=softcap, dropout_p=dropout_p,
                             band=band or Band.of(causal, window, sq, k.shape[1]), policy=plan.active(),
                             deterministic=deterministic)
    return q, k, v, extras, opts


TARGETS = ("gfx90a", "gfx942", "gfx950", "sm90", "cuda", "interpret")


def explain(q, k, v, *, target: str | None = None, causal: bool = False, softmax_scale: float | None = None,
            window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0,
            dropout_rng=None, q_segment_ids=None, kv_segment_ids=None, q_descale=None, k_descale=None,
            v_descale=None, bias=None, mask=None, return_lse: bool = False, deterministic: bool = True,
            implementation: str | None = None) -> plan.Explanation:
    """Which kernels `attention` runs for these arguments, and why: its forward and backward plans (kernels,
    config rows, grids, flags, workspace bytes, a reason per step). Nothing is computed or compiled.

    Args: attention's, as arrays or jax.ShapeDtypeStructs. target: None for this machine's implementation
      (`implementation` as attention takes it), or one of "gfx90a", "gfx942", "gfx950", "sm90", "cuda",
      "interpret" to plan for that target from any machine (its nominal compute units; launches of the compiled
      warp count, as the supported jax-triton does).

    Returns: a plan.Explanation; print it for a table, or read .forward / .backward (plan.Plan: .steps,
      .workspace, .kernels).

    Example:
      >>> print(jax_flash_amd.explain(q, k, v, causal=True, target="gfx942"))
    """
    if target is not None:
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS} or None; got {target!r}")
        if implementation is not None:
            raise ValueError("give target or implementation, not both")
        impl = "interpret" if target == "interpret" else "triton"
    else:
        impl = _dispatch.choose_implementation(implementation)
        target = _dispatch.backend(impl)[1] if impl != "xla" else None
    arrays = dict(alibi_slopes=alibi_slopes, dropout_rng=dropout_rng, q_segment_ids=q_segment_ids,
                  kv_segment_ids=kv_segment_ids, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                  bias=bias, mask=mask)
    found = {}

    def trace(q, k, v, arrays):
        found["call"] = _prepare(q, k, v, causal, softmax_scale, window_size, softcap, arrays["alibi_slopes"],
                                 dropout_p, arrays["dropout_rng"], arrays["q_segment_ids"], arrays["kv_segment_ids"],
                                 arrays["q_descale"], arrays["k_descale"], arrays["v_descale"], return_lse, impl,
                                 target, bias=arrays["bias"], mask=arrays["mask"], deterministic=deterministic)

    jax.eval_shape(trace, *(_shape(x, name) for name, x in (("q", q), ("k", k), ("v", v))),
                   {name: None if x is None else _shape(x, name) for name, x in arrays.items()})
    q, k, _, extras, opts = found["call"]
    if impl == "xla":
        return plan.Explanation("xla", None, None, None)
    call = plan.Call.of(target, q, k, extras, opts.statics, opts.policy, here=target == _here())
    if q.size == 0 or k.shape[1] == 0:
        return plan.Explanation(impl, target, None, None)
    return plan.Explanation(impl, target, plan.plan_forward(call), None if call.fp8 else plan.plan_backward(call))


def _here() -> str | None:
    """This machine's kernel target, or None without a GPU (and outside the interpreter)."""
    try:
        impl = _dispatch.choose_implementation(None)
    except RuntimeError:
        return None
    return _dispatch.backend(impl)[1] if impl != "xla" else None


def _shape(x, name: str):
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array or a jax.ShapeDtypeStruct; got {type(x).__name__}")
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype)


def _check_arrays(q, k, v):
    arrays = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array (batch, seq, heads, head_dim); got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name} must have rank 4 (batch, seq, heads, head_dim); got shape {tuple(x.shape)}")
        if jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in _DTYPES] + list(fp8.TYPES):
            raise TypeError(f"{name} must be float16, bfloat16 or float32 (or float8_e4m3fn / float8_e4m3fnuz "
                            f"for inference); got {jnp.dtype(x.dtype)}")
        arrays[name] = jnp.asarray(x)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape}, v {v.shape}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch size; got q {q.shape[0]}, k {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim; got q {q.shape[3]}, k {k.shape[3]}")
    if not 1 <= q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim (last axis of q, k, v) must be in 1..{MAX_HEAD_DIM}; got {q.shape[3]}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"the number of query heads must be a multiple of the number of key/value heads "
                         f"(grouped-query attention); got q {q.shape[2]} heads, k and v {k.shape[2]}")
    return q, k, v


def _check_kernel_limits(q, k, dense=None) -> None:
    # the kernels address a batch element's rows, and a dense operand's planes, with 32-bit offsets
    for name, x in (("q", q), ("k", k), *(dense or {}).items()):
        if x is None:
            continue
        per_batch = x.shape[1] * x.shape[2] * x.shape[3]
        if per_batch >= 2**31:
            axes = "(seq * heads * head_dim)" if name in ("q", "k") else "(heads * seq_q * seq_k)"
            raise ValueError(f"{name} has {per_batch} elements per batch entry "
                             f"{axes}; the kernels support fewer than 2**31. Split the heads "
                             f"over several calls, or use implementation='xla'.")


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a Python bool; got {type(value).__name__}")


def _check_window(window_size) -> tuple[int, int]:
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(isinstance(w, int) and not isinstance(w, bool) for w in window_size))
    if not ok:
        raise TypeError(f"window_size must be a pair of Python ints (left, right); got {window_size!r}")
    if min(window_size) < -1:
        raise ValueError(f"window_size values must be >= 0, or -1 for unbounded; got {tuple(window_size)}")
    return int(window_size[0]), int(window_size[1])


def _check_softcap(softcap) -> float:
    """softcap as the kernels take it: 0 (off) for 0 and for any softcap >= SOFTCAP_OFF, which float32 cannot
    tell from plain attention; refused below float32's smallest normal number."""
    if isinstance(softcap, jax.core.Tracer) or not isinstance(softcap, Real) or isinstance(softcap, bool):
        raise TypeError(f"softcap must be a static Python number; got {type(softcap).__name__}")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0 (0 turns it off); got {softcap}")
    if softcap >= SOFTCAP_OFF:
        return 0.0
    if softcap != 0 and softcap < _F32_TINY:  # the kernels divide by it in float32
        raise ValueError(f"softcap must be 0 or a normal float32 number, at least {_F32_TINY:.3g}; got {softcap}")
    return float(softcap)


def _check_slopes(alibi_slopes, batch: int, heads: int):
    """None, or the slopes as a (batch, heads) float32 array."""
    if alibi_slopes is None:
        return None
    if not hasattr(alibi_slopes, "shape") or not hasattr(alibi_slopes, "dtype"):
        raise TypeError(f"alibi_slopes must be an array of shape (heads_q,) or (batch, heads_q); "
                        f"got {type(alibi_slopes).__name__}")
    if not jnp.issubdtype(alibi_slopes.dtype, jnp.floating):
        raise TypeError(f"alibi_slopes must be a floating array; got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}) (heads_q,) or "
                         f"(batch, heads_q); got {tuple(alibi_slopes.shape)}")
    return jnp.broadcast_to(jnp.asarray(alibi_slopes, jnp.float32), (batch, heads))


def _check_dropout(dropout_p, dropout_rng) -> float:
    if isinstance(dropout_p, jax.core.Tracer) or not isinstance(dropout_p, Real) or isinstance(dropout_p, bool):
        raise TypeError(f"dropout_p must be a static Python number; got {type(dropout_p).__name__}")
    if not (0.0 <= dropout_p < 1.0):
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    if dropout_p == 0:
        return 0.0
    if dropout_rng is None:
        raise ValueError(f"dropout_p={dropout_p} needs dropout_rng, a JAX PRNG key (e.g. jax.random.key(0))")
    dtype = getattr(dropout_rng, "dtype", None)
    typed = dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key) and dropout_rng.shape == ()
    raw = dtype == jnp.uint32 and getattr(dropout_rng, "shape", None) == (2,)
    if not (typed or raw):
        raise TypeError("dropout_rng must be one JAX PRNG key (jax.random.key(0), or a raw uint32 (2,) key "
                        f"from jax.random.PRNGKey(0)); got {type(dropout_rng).__name__} with dtype {dtype} "
                        f"and shape {getattr(dropout_rng, 'shape', None)}")
    return float(dropout_p)


def _check_segment_ids(q_segment_ids, kv_segment_ids, q_shape, k_shape):
    """(q ids, kv ids) as int32 arrays, or (None, None)."""
    if q_segment_ids is None and kv_segment_ids is None:
        return None, None
    given = {}
    for name, x, shape in (("q_segment_ids", q_segment_ids, q_shape), ("kv_segment_ids", kv_segment_ids, k_shape)):
        if x is None:
            continue
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an integer array (batch, seq); got {type(x).__name__}")
        if not jnp.issubdtype(jnp.dtype(x.dtype), jnp.integer):
            raise TypeError(f"{name} must be an integer array (int32; wider types are converted); got {x.dtype}")
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape (batch, seq) = {tuple(shape)}; got {tuple(x.shape)}")
        given[name] = x  # not converted yet: jnp.asarray would wrap NumPy int64 ids without x64
    if len(given) == 1:
        if q_shape[1] != k_shape[1]:
            missing = "q_segment_ids" if q_segment_ids is None else "kv_segment_ids"
            raise ValueError(f"{missing} is needed too when seq_q ({q_shape[1]}) != seq_k ({k_shape[1]})")
        ids = next(iter(given.values()))
        return _int32_ids(ids, ids)
    return _int32_ids(given["q_segment_ids"], given["kv_segment_ids"])


def _int32_ids(q_ids, kv_ids):
    """Checked integer ids (batch, seq_q) / (batch, seq_k) as int32, the type the kernels read. Ids need
    only compare equal or not (and keep their order, for the block skipping), so wider ones (int64 under
    x64, uint32) are cast where their concrete values fit, and otherwise renumbered per row by their rank
    among that row's q and kv ids together: exact for any values, where a cast could merge two ids."""
    wide = [jnp.dtype(x.dtype).itemsize > 4 or jnp.dtype(x.dtype) == jnp.uint32 for x in (q_ids, kv_ids)]
    if not any(wide):
        return jnp.asarray(q_ids, jnp.int32), jnp.asarray(kv_ids, jnp.int32)
    if not any(isinstance(x, jax.core.Tracer) for x in (q_ids, kv_ids)):
        q_np, kv_np = np.asarray(q_ids), np.asarray(kv_ids)
        info = np.iinfo(np.int32)
        if all(x.size == 0 or (x.min() >= info.min and x.max() <= info.max) for x in (q_np, kv_np)):
            return jnp.asarray(q_np.astype(np.int32)), jnp.asarray(kv_np.astype(np.int32))
        both = np.concatenate([q_np, kv_np], axis=-1)
        ranks = np.stack([np.searchsorted(np.sort(row), row) for row in both])
    else:
        common = jnp.promote_types(q_ids.dtype, kv_ids.dtype)
        both = jnp.concatenate([q_ids.astype(common), kv_ids.astype(common)], axis=-1)
        ranks = jax.vmap(lambda row: jnp.searchsorted(jnp.sort(row), row))(both)
    ranks = jnp.asarray(ranks, jnp.int32)
    return ranks[:, :q_ids.shape[1]], ranks[:, q_ids.shape[1]:]


_BIAS_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32)


def _check_dense(name: str, x, q_shape, seq_k: int, descales):
    """None, or a bias / mask as a 4-D array broadcastable to (batch, heads_q, seq_q, seq_k), each axis its size
    or 1 (a shorter rank gains leading axes of 1, as in jax.nn.dot_product_attention); never expanded."""
    if x is None:
        return None
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array broadcastable to (batch, heads_q, seq_q, seq_k); got "
                        f"{type(x).__name__}")
    dtype = jnp.dtype(x.dtype)
    if name == "mask" and dtype != jnp.bool_:
        raise TypeError(f"mask must be a boolean array (True: the pair is attended); got {dtype}")
    if name == "bias" and dtype not in [jnp.dtype(d) for d in _BIAS_DTYPES]:
        raise TypeError(f"bias must be float16, bfloat16 or float32; got {dtype}")
    if descales is not None:
        raise ValueError(f"{name} with float8 inputs: the fp8 forward takes no dense bias or mask")
    full = (q_shape[0], q_shape[2], q_shape[1], seq_k)
    if x.ndim > 4 or any(n not in (1, f) for n, f in zip(x.shape[::-1], full[::-1])):
        raise ValueError(f"{name} must broadcast to (batch, heads_q, seq_q, seq_k) = {full}, each axis its size or "
                         f"1; got shape {tuple(x.shape)}")
    x = jnp.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _check_descales(q, k, given, dropout_p: float):
    """None for 16/32-bit inputs; for float8 inputs the three descales, (batch, heads_kv) float32 each (the
    kernel reads them apart: stacking them would cost a kernel launch per call)."""
    names = ("q_descale", "k_descale", "v_descale")
    if not fp8.is_fp8(q.dtype):
        passed = [n for n, x in zip(names, given) if x is not None]
        if passed:
            raise ValueError(f"{', '.join(passed)} only apply to float8 inputs; q, k, v are {q.dtype}")
        return None
    if dropout_p > 0:
        raise ValueError("dropout_p > 0 with float8 inputs: fp8 attention is forward-only (inference), "
                         "dropout is for training")
    shape = (q.shape[0], k.shape[2])
    for name, x in zip(names, given):
        if x is None:
            raise ValueError(f"{q.dtype} inputs need {name}, a (batch, heads_kv) = {shape} float array of "
                             "dequantisation factors (jax_flash_amd.quantize_fp8 returns them)")
        if not hasattr(x, "shape") or not jnp.issubdtype(getattr(x, "dtype", None), jnp.floating):
            raise TypeError(f"{name} must be a floating array; got {type(x).__name__}")
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape (batch, heads_kv) = {shape}; got {tuple(x.shape)}")
    return tuple(jnp.asarray(x, jnp.float32) for x in given)


def _check_scale(softmax_scale, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if (isinstance(softmax_scale, jax.core.Tracer) or not isinstance(softmax_scale, Real)
            or isinstance(softmax_scale, bool)):
        raise TypeError(f"softmax_scale must be a static Python number or None; got {type(softmax_scale).__name__}")
    scale = float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be a finite number > 0; got {softmax_scale}")
    if not _F32_TINY <= scale <= MAX_SOFTMAX_SCALE:
        raise ValueError(f"softmax_scale must be a normal float32 number within [{_F32_TINY:.3g}, 2**16 = "
                         f"{MAX_SOFTMAX_SCALE:.0f}]: the logits scale * q.k are computed in float32, which resolves "
                         f"them to within float32 precision of float64 only up to about 2**16; got {softmax_scale}")
    return scale
