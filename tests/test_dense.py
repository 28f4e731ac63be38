"""A dense bias and mask (attention(bias=, mask=)) in the kernels, forward and backward (dq, dk, dv and the bias's
gradient), against float64, in every broadcast shape and composed with the other variants; the ranges that skip
the blocks a mask hides; and bad input."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl

import jax_flash_amd
import oracle
from helpers import KERNEL_IMPLS, ON_GPU, assert_close, inputs
from jax_flash_amd import _launch, reference
from jax_flash_amd.kernels.masking import batch_inner
from jax_flash_amd.operands import Operands

B, H, D = 2, 4, 40  # D 40: a head padded to 64 in the kernels

CASES = {
    "bias-full": dict(bias=(B, H, "q", "k")),
    "bias-heads": dict(bias=(1, H, "q", "k"), causal=True),  # a learned relative-position bias
    "bias-keys": dict(bias=(B, 1, 1, "k")),  # a padding bias
    "bias-2d": dict(bias=("q", "k"), sq=64, sk=64),  # whole blocks
    "bias-rows": dict(bias=(B, 1, "q", 1), causal=True, sk=70),
    "bias-scalar-per-head": dict(bias=(1, H, 1, 1)),
    "mask-padding": dict(mask="padding"),  # (B, 1, 1, Sk): keys past each row's length hidden
    "mask-causal-dense": dict(mask="tril", sq=64, sk=64),  # (1, 1, Sq, Sk): block skipping by its ranges
    "mask-random": dict(mask=(B, H, "q", "k")),  # with rows it hides entirely
    "mask-bias-causal-gqa": dict(mask=(B, 1, "q", "k"), bias=(1, H, "q", "k"), causal=True, h_kv=2),
    "bias-softcap-alibi": dict(bias=(B, H, "q", "k"), softcap=4.0, alibi=True, causal=True),
    "mask-window-segments": dict(mask=(1, 1, "q", "k"), window=(9, 4), segments=True),
    "bias-mask-dropout": dict(bias=(1, H, "q", "k"), mask="padding", dropout=0.2),
    "bias-bf16": dict(bias=(1, H, "q", "k"), dtype=jnp.bfloat16, causal=True),
    "mask-f16-gqa": dict(mask=(B, 1, "q", "k"), dtype=jnp.float16, h_kv=1),
    # "hide" biases: finfo.min and -inf (a pair hidden; a row of only those uniform, as jax.nn gives finfo.min)
    "bias-hide": dict(bias=(B, H, "q", "k"), hide=True, causal=True),
    "bias-hide-softcap": dict(bias=(1, 1, "q", "k"), hide=True, softcap=4.0),
}


def case_inputs(name, seed=0):
    c = {**dict(sq=45, sk=53, causal=False, window=(-1, -1), softcap=0.0, alibi=False, segments=False, dropout=0.0,
                h_kv=H, dtype=jnp.float32, bias=None, mask=None, hide=False), **CASES[name]}
    sq, sk = c["sq"], c["sk"]
    q, k, v, dout, dlse = inputs((B, sq, H, D), (B, sk, c["h_kv"], D), c["dtype"], seed=seed)
    keys = jax.random.split(jax.random.key(seed + 100), 4)
    size = {"q": sq, "k": sk}
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    ref_kw = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"])
    if c["bias"] is not None:
        shape = tuple(size.get(n, n) for n in c["bias"])
        bias = jax.random.normal(keys[0], shape, jnp.float32)
        if c["hide"]:  # rows: 3 all finfo.min, 5 -inf on its first keys, 8 all -inf, 9 finfo.min on odd keys
            low = jnp.finfo(jnp.float32).min
            bias = bias.at[..., 3, :].set(low).at[..., 5, :7].set(-jnp.inf).at[..., 8, :].set(-jnp.inf)
            bias = bias.at[..., 9, 1::2].set(low)
        kw["bias"] = ref_kw["bias"] = bias.astype(c["dtype"])
    if c["mask"] == "padding":
        lengths = jnp.array([sk - 7, 5])
        mask = (jnp.arange(sk)[None, :] < lengths[:, None])[:, None, None, :]
    elif c["mask"] == "tril":
        mask = jnp.tril(jnp.ones((sq, sk), bool))[None, None]
    elif c["mask"] is not None:
        mask = jax.random.uniform(keys[1], tuple(size.get(n, n) for n in c["mask"])) > 0.4
        mask = mask.at[..., 3, :].set(False)  # a row that sees nothing
    if c["mask"] is not None:
        kw["mask"] = ref_kw["mask"] = mask
    if c["alibi"]:
        kw["alibi_slopes"] = ref_kw["alibi"] = jnp.linspace(0.1, 0.9, B * H, dtype=jnp.float32).reshape(B, H)
    if c["segments"]:
        q_ids = jnp.repeat(jnp.arange(3), -(-sq // 3))[None, :sq].repeat(B, 0)
        kv_ids = jnp.repeat(jnp.arange(3), -(-sk // 3))[None, :sk].repeat(B, 0)
        kw.update(q_segment_ids=q_ids, kv_segment_ids=kv_ids)
        ref_kw["segments"] = (q_ids, kv_ids)
    if c["dropout"]:
        rng = jax.random.key(7)
        kw.update(dropout_p=c["dropout"], dropout_rng=rng)
        seeds = reference.dropout_seeds(rng, B, H)
        ref_kw.update(dropout_p=c["dropout"], keep=reference.dropout_keep(seeds, sq, sk, c["dropout"]))
    return (q, k, v, dout, dlse), kw, ref_kw, c["dtype"]


def run(impl, q, k, v, dout, dlse, kw):
    """dict(out, lse, dq, dk, dv[, dbias]) of a forward and a vjp with random cotangents."""
    bias = kw.get("bias")
    rest = {n: x for n, x in kw.items() if n != "bias"}

    def fwd_bwd(q, k, v, bias, dout, dlse):
        def f(q, k, v, bias):
            return jax_flash_amd.attention(q, k, v, bias=bias, return_lse=True, implementation=impl, **rest)

        (out, lse), vjp = jax.vjp(f, q, k, v, bias)
        dq, dk, dv, dbias = vjp((dout, dlse))
        grads = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
        return grads if bias is None else dict(grads, dbias=dbias)

    return jax.jit(fwd_bwd)(q, k, v, bias, dout, dlse)


@pytest.mark.matrix
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_dense_bias_and_mask_against_float64(name, impl):
    (q, k, v, dout, dlse), kw, ref_kw, dtype = case_inputs(name)
    assert_like_float64(run(impl, q, k, v, dout, dlse, kw), (q, k, v, dout, dlse), kw, ref_kw, dtype)


def assert_like_float64(got, args, kw, ref_kw, dtype):
    """got (run's dict) within FlashAttention's error rule of float64 (against xla in dtype), dbias too where there
    is a bias; rows a mask hides entirely: output 0, lse -inf."""
    ref = oracle.attention(*args, **ref_kw)
    base = run("xla", *args, kw)
    assert_close(got, ref, base, dtype, names=("out", "lse", "dq", "dk", "dv") + (("dbias",) if "bias" in kw else ()))
    if "mask" in kw:
        hidden = ~np.isfinite(ref["lse"])
        if hidden.any():
            assert np.all(np.asarray(got["out"], np.float32).transpose(0, 2, 1, 3)[hidden] == 0)


@pytest.mark.matrix
@pytest.mark.parametrize("name", ["bias-heads", "mask-padding", "mask-bias-causal-gqa"])
@pytest.mark.parametrize("target", ["sm90", "gfx942", "interpret"])
def test_dense_calls_run_the_triton_kernels(name, target):
    """The kernels, not a fallback: the pointer rows (no TMA loop, no Gluon kernel reads a dense operand), and the
    bias's gradient kernel where there is a bias."""
    (q, k, v, _, _), kw, _, _ = case_inputs(name)
    e = jax_flash_amd.explain(q, k, v, target=target, **kw)
    assert e.forward.kernels == ("attn_fwd",) and not e.forward.step("fwd").row.tma
    assert ("attn_bwd_dbias" in e.backward.kernels) == ("bias" in kw)
    assert "attn_bwd_dkdv" in e.backward.kernels and not e.backward.step("dkdv").row.tma


@pytest.mark.parametrize("shape", [(2, 1, 1, 53), (1, 1, 45, 53), (2, 3, 45, 53), (2, 3, 45, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("query_side", [True, False])
def test_mask_ranges_bound_the_visible_blocks(shape, query_side):
    """For each block of 16 queries (or keys), [lo, hi) holds every key (query) the mask lets any of them see in
    any head, tight at both ends; [0, 0) where it hides them all."""
    sq, sk = 45, 53
    mask = jax.random.uniform(jax.random.key(3), shape) > 0.85
    mask = mask.at[..., 0:2, :].set(False) if shape[2] > 1 else mask
    got = np.asarray(_launch.mask_ranges(mask, 2, sq, sk, 16, query_side))
    seen = np.broadcast_to(np.asarray(mask).any(1), (2, sq, sk))
    if not query_side:
        seen = seen.transpose(0, 2, 1)
    for b in range(2):
        for i, start in enumerate(range(0, seen.shape[1], 16)):
            cols = np.flatnonzero(seen[b, start:start + 16].any(0))
            want = (cols[0], cols[-1] + 1) if cols.size else (0, 0)
            assert tuple(got[b, i]) == want, (b, i)


def test_mask_and_segment_ranges_intersect():
    (q, k, _, _, _), kw, _, _ = case_inputs("mask-window-segments")
    extras = Operands(mask=kw["mask"], q_segment_ids=kw["q_segment_ids"], kv_segment_ids=kw["kv_segment_ids"])
    both = np.asarray(_launch._ranges(extras, True, 16, q, k))
    seg = np.asarray(_launch.segment_ranges(kw["q_segment_ids"], kw["kv_segment_ids"], 16))
    mask = np.asarray(_launch.mask_ranges(kw["mask"], B, q.shape[1], k.shape[1], 16, True))
    np.testing.assert_array_equal(both[..., 0], np.maximum(seg[..., 0], mask[..., 0]))
    np.testing.assert_array_equal(both[..., 1], np.minimum(seg[..., 1], mask[..., 1]))


@pytest.mark.parametrize("kw, error, match", [
    (dict(bias=np.zeros((2, 4, 45, 50), np.float32)), ValueError, "bias must broadcast to"),
    (dict(bias=np.zeros((3, 1, 1, 53), np.float32)), ValueError, "bias must broadcast to"),
    (dict(bias=np.zeros((1, 2, 3, 4, 5), np.float32)), ValueError, "bias must broadcast to"),
    (dict(bias=np.zeros((45, 53), np.int32)), TypeError, "bias must be float16, bfloat16 or float32"),
    (dict(bias=[1.0]), TypeError, "bias must be an array"),
    (dict(mask=np.ones((45, 53), np.int8)), TypeError, "mask must be a boolean array"),
    (dict(mask=np.ones((2, 4, 44, 53), bool)), ValueError, "mask must broadcast to"),
])
def test_bad_bias_and_mask_are_named(kw, error, match):
    q, k, v, _, _ = inputs((B, 45, H, D), (B, 53, H, D), jnp.float32)
    with pytest.raises(error, match=match):
        jax_flash_amd.attention(q, k, v, implementation="xla", **kw)


def test_fp8_takes_no_dense_operand():
    x = jnp.zeros((1, 16, 2, 32), jnp.float8_e4m3fn)
    d = jnp.ones((1, 2), jnp.float32)
    with pytest.raises(ValueError, match="float8 inputs"):
        jax_flash_amd.attention(x, x, x, q_descale=d, k_descale=d, v_descale=d, mask=jnp.ones((16, 16), bool),
                                implementation="xla")


def test_a_dense_operand_past_the_kernels_offsets_is_named():
    """A bias whose planes reach 2**31 elements per batch entry (the kernels' 32-bit offsets) is refused by name for
    the kernels; xla takes it (shapes only: nothing is allocated)."""
    q = jax.ShapeDtypeStruct((1, 8192, 64, 64), jnp.bfloat16)
    bias = jax.ShapeDtypeStruct((1, 64, 8192, 8192), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"bias has 4294967296 elements per batch entry \(heads \* seq_q \* seq_k\)"):
        jax.eval_shape(lambda q, b: jax_flash_amd.attention(q, q, q, bias=b, implementation="interpret"), q, bias)
    out = jax.eval_shape(lambda q, b: jax_flash_amd.attention(q, q, q, bias=b, implementation="xla"), q, bias)
    assert out.shape == q.shape


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_vmap_over_a_bias_call(impl):
    """vmap folds the mapped axis into the batch: a mapped bias, and an unmapped one broadcast over the batch
    (whose gradient is per mapped row, then summed by vmap's transpose), equal the loop over rows."""
    (q, k, v, dout, _), kw, _, _ = case_inputs("bias-heads")
    bias = kw["bias"]

    def loss(q, bias):
        out = jax_flash_amd.attention(q, k, v, bias=bias, causal=True, implementation=impl)
        return (out * dout).sum()

    qs = jnp.stack([q, q * 0.5])
    biases = jnp.stack([bias, bias * 2.0])
    for bias_axis, b_in in ((0, biases), (None, bias)):
        got = jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, bias_axis))(qs, b_in)
        for i in range(2):
            want = jax.grad(loss, argnums=(0, 1))(qs[i], b_in[i] if bias_axis == 0 else bias)
            for g, w in zip(got, want):
                np.testing.assert_allclose(np.asarray(g[i]), np.asarray(w), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("target, dense, window, row", [
    ("gfx942", "bias", (-1, -1), "gfx942/fwd/d128-dense"),
    ("gfx942", "mask", (-1, -1), "gfx942/fwd/d128-dense"),
    ("gfx942", "padding", (-1, -1), "gfx942/fwd/d128"),  # a row of keys, not a tile per block
    ("gfx950", "bias", (-1, -1), "gfx950/fwd/d128-dense"),
    ("gfx90a", "bias", (-1, -1), "gfx90a/fwd/d128"),  # its rows hold a bias tile (amd_report)
    ("cuda", "bias", (100, 0), "cuda/fwd/d128-dense"),  # ahead of the window's (its stages fit shared memory)
    ("cuda", "padding", (100, 0), "cuda/fwd/d128-window"),  # no tile per block: the next kind's
])
def test_dense_tiles_take_the_dense_rows(target, dense, window, row):
    """A bias or mask that varies along queries and keys takes a target's "fwd+dense" rows (more registers per
    block), ahead of the other kinds; where the target has none, the call's next kind decides."""
    q = k = v = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16)
    kw = {"bias": dict(bias=jnp.zeros((1, 4, 256, 256), jnp.bfloat16)),
          "mask": dict(mask=jnp.ones((1, 1, 256, 256), bool)),
          "padding": dict(mask=jnp.ones((1, 1, 1, 256), bool))}[dense]
    e = jax_flash_amd.explain(q, k, v, target=target, causal=True, window_size=window, **kw)
    assert e.forward.step("fwd").row.name == row


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_dense_calls_run_the_kernels_on_a_gpu_by_default():
    """A default GPU call with a mask or bias runs the kernels, with no warning, and agrees with xla."""
    q, k, v, _, _ = inputs((2, 64, 4, 64), (2, 64, 4, 64), jnp.bfloat16)
    mask = jnp.tril(jnp.ones((64, 64), bool))
    assert jax_flash_amd.explain(q, k, v, mask=mask).implementation == "triton"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jax_flash_amd.attention(q, k, v, mask=mask)
    want = jax_flash_amd.attention(q, k, v, mask=mask, implementation="xla")
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), atol=3e-2)  # bf16 units


# ----- the Gluon kernels (sm90): plan.Policy(gluon_dense=True), the default -----

def _gluon_dense_policy():
    """Policy(gluon_dense=True), the Gluon rows from any length (the tests' short sequences)."""
    from jax_flash_amd import plan
    from jax_flash_amd.kernels import configs
    from test_gluon_fwd import _rows

    return plan.Policy(gluon_dense=True, gluon_fwd=_rows(configs.SM90_GLUON_FWD, min_seq=0),
                       gluon_dkdv=_rows(configs.SM90_GLUON_DKDV, min_seq=0))


GLUON_CASES = {  # (d, causal, h_kv, bias shape, mask shape, dropout); "k": keys, "q": queries
    "padding": (128, False, 4, None, (B, 1, 1, "k"), 0.0),
    "padding-causal": (128, True, 4, None, (B, 1, 1, "k"), 0.0),
    "bias-heads-causal-gqa": (128, True, 2, (1, H, "q", "k"), None, 0.0),
    "mask-bias-rows-hidden": (128, False, 4, (B, 1, 1, "k"), (B, H, "q", "k"), 0.0),
    "padding-dropout": (128, True, 4, None, (B, 1, 1, "k"), 0.2),
    "bias-d64": (64, False, 4, (1, H, "q", "k"), None, 0.0),
    # whole blocks (no ragged-block mask): rows 0-63 see none of the first 128 keys, row 3 none at all
    "mask-even-first-block-hidden": (128, False, 4, None, (B, H, "q", "k"), 0.0),
    # whole blocks: under Policy(gluon_dense_tiles=True) the tiles that vary along both axes come through buffers
    "bias-mask-even-causal-gqa": (128, True, 2, (1, H, "q", "k"), (B, 1, "q", "k"), 0.0),
}


def _gluon_case(name, dtype):
    d, causal, h_kv, bias_shape, mask_shape, dropout = GLUON_CASES[name]
    sq, sk = (384, 384) if "even" in name else (301, 317)
    q, k, v, dout, dlse = inputs((B, sq, H, d), (B, sk, h_kv, d), dtype, seed=3)
    keys = jax.random.split(jax.random.key(5), 3)
    size = {"q": sq, "k": sk}
    kw, ref_kw = dict(causal=causal), dict(causal=causal)
    if bias_shape:
        bias = jax.random.normal(keys[0], tuple(size.get(n, n) for n in bias_shape), jnp.float32).astype(dtype)
        kw["bias"] = ref_kw["bias"] = bias
    if mask_shape == (B, 1, 1, "k"):
        mask = (jnp.arange(sk)[None, :] < jnp.array([sk - 70, 131])[:, None])[:, None, None, :]
    elif mask_shape:
        mask = jax.random.uniform(keys[1], tuple(size.get(n, n) for n in mask_shape)) > 0.3
        mask = mask.at[..., 3, :].set(False)  # a row that sees nothing
        if "even" in name:
            mask = mask.at[..., :64, :128].set(False)
    if mask_shape:
        kw["mask"] = ref_kw["mask"] = mask
    if dropout:
        rng = jax.random.key(9)
        kw.update(dropout_p=dropout, dropout_rng=rng)
        ref_kw.update(dropout_p=dropout, keep=reference.dropout_keep(reference.dropout_seeds(rng, B, H), sq, sk,
                                                                     dropout))
    return (q, k, v, dout, dlse), kw, ref_kw


@pytest.mark.parametrize("name", ["padding-causal", "bias-heads-causal-gqa", "bias-d64"])
def test_gluon_dense_policy_plans_the_gluon_kernels(name):
    """Under Policy(gluon_dense=True) (the default) a 16-bit dense call on sm90 takes the Gluon forward (its tiled grid)
    and dK/dV (the dS path at D 128); gluon_dense=False, softcap and the linear backward keep the Triton rows."""
    from jax_flash_amd import plan

    (q, k, v, _, _), kw, _ = _gluon_case(name, jnp.bfloat16)
    policy = _gluon_dense_policy()
    with plan.using(policy):
        e = jax_flash_amd.explain(q, k, v, target="sm90", **kw)
        assert e.forward.kernels == ("attn_fwd_sm90",) and not e.forward.step("fwd").flags.get("N_ROWS")
        assert "attn_bwd_dkdv_sm90" in e.backward.kernels
        assert ("attn_bwd_dq_ds" in e.backward.kernels) == (q.shape[-1] == 128)
        assert ("attn_bwd_dbias" in e.backward.kernels) == ("bias" in kw)
        assert jax_flash_amd.explain(q, k, v, target="sm90", softcap=5.0, **kw).forward.kernels == ("attn_fwd",)
    with plan.using(policy.replace(linear_backward=True)):
        assert "attn_bwd_dkdvdq_sm90" not in jax_flash_amd.explain(q, k, v, target="sm90", **kw).backward.kernels
    with plan.using(policy.replace(gluon_dense=False)):
        e = jax_flash_amd.explain(q, k, v, target="sm90", **kw)
        assert e.forward.kernels == ("attn_fwd",) and "attn_bwd_dkdv_sm90" not in e.backward.kernels


def test_gluon_dense_tiles_policy_sets_the_kernels_flag():
    """Policy(gluon_dense_tiles=True), the default, gives the Gluon forward and dK/dV of a dense call DENSE_TILES
    (their tiles read in vectors, through buffers copied ahead: fwd_sm90.dense_reads); False, and calls without a
    dense operand, keep the kernels' element-wise reads."""
    from jax_flash_amd import plan

    (q, k, v, _, _), kw, _ = _gluon_case("bias-mask-even-causal-gqa", jnp.bfloat16)
    for tiles in (False, True):
        with plan.using(_gluon_dense_policy().replace(gluon_dense_tiles=tiles)):
            for dense in (kw, dict(causal=True)):
                e = jax_flash_amd.explain(q, k, v, target="sm90", **dense)
                flags = [e.forward.step("fwd").flags, e.backward.step("dkdv").flags]
                assert all(f.get("DENSE_TILES", False) == (tiles and dense is kw) for f in flags), (tiles, flags)
    assert plan.DEFAULT.gluon_dense_tiles


def test_dense_batch_inner_policy_sets_the_kernels_flag():
    """Policy(dense_batch_inner=True) (not default until a GPU run passes) gives the Gluon forward and dK/dV
    BATCH_INNER where a dense operand is shared by a batch of more than one (bias (1, H, T, S)), not where each batch
    element has its own (mask (B, H, T, S)) or the batch is one."""
    from jax_flash_amd import plan

    (q, k, v, _, _), kw, _ = _gluon_case("bias-mask-even-causal-gqa", jnp.bfloat16)
    bias, mask = kw["bias"], jnp.broadcast_to(kw["mask"], (B, H) + kw["mask"].shape[2:])
    assert not plan.DEFAULT.dense_batch_inner
    for inner in (False, True):
        with plan.using(_gluon_dense_policy().replace(dense_batch_inner=inner)):
            for dense, batch, want in ((dict(bias=bias), B, inner), (dict(mask=mask), B, False),
                                       (dict(bias=bias), 1, False)):
                e = jax_flash_amd.explain(q[:batch], k[:batch], v[:batch], target="sm90", causal=True,
                                          **{n: x[:batch] if x.shape[0] > 1 else x for n, x in dense.items()})
                flags = [e.forward.step("fwd").flags, e.backward.step("dkdv").flags]
                assert all(f.get("BATCH_INNER", False) == want for f in flags), (inner, list(dense), batch, flags)


@triton.jit
def _batch_inner_rows(Out, H: tl.constexpr):
    tl.store(Out + tl.program_id(1), batch_inner(tl.program_id(1), H))


def test_batch_inner_takes_every_row_once_batch_fastest():
    """masking.batch_inner over a grid of batch x H rows (the interpreter): row r runs (r % batch) * H + r // batch,
    each row once, a head's batch elements adjacent."""
    import torch

    n_b, h = 3, 5
    out = torch.full((n_b * h,), -1, dtype=torch.int32)
    _batch_inner_rows[(1, n_b * h)](out, h)
    got = out.tolist()
    assert got == [(r % n_b) * h + r // n_b for r in range(n_b * h)] and sorted(got) == list(range(n_b * h))
    assert [g % h for g in got[:n_b]] == [0] * n_b  # the first n_b programs: head 0 of each batch element


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("tiles", [False, True])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("name", list(GLUON_CASES))
def test_gluon_dense_against_float64(name, dtype, tiles):
    """The Gluon forward and dK/dV with a dense bias / mask (Policy.gluon_dense) against float64: ragged lengths,
    rows a mask hides entirely, GQA, dropout, D 64 and 128; the tiles read element by element, and (tiles) in vectors
    and through buffers (Policy.gluon_dense_tiles)."""
    from jax_flash_amd import plan

    (q, k, v, dout, dlse), kw, ref_kw = _gluon_case(name, dtype)
    with plan.using(_gluon_dense_policy().replace(gluon_dense_tiles=tiles)):
        e = jax_flash_amd.explain(q, k, v, **kw)
        assert e.forward.kernels == ("attn_fwd_sm90",) and "attn_bwd_dkdv_sm90" in e.backward.kernels, e
        assert e.forward.step("fwd").flags.get("DENSE_TILES", False) == tiles
        got = run("triton", q, k, v, dout, dlse, kw)
    assert_like_float64(got, (q, k, v, dout, dlse), kw, ref_kw, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("name", ["bias-heads-causal-gqa", "bias-d64", "bias-mask-even-causal-gqa"])
def test_gluon_dense_batch_inner_against_float64(name):
    """Policy(dense_batch_inner=True): the Gluon kernels' rows batch-fastest for a bias shared by the batch, against
    float64 (each row's batch element and head found back from its program)."""
    from jax_flash_amd import plan

    (q, k, v, dout, dlse), kw, ref_kw = _gluon_case(name, jnp.bfloat16)
    with plan.using(_gluon_dense_policy().replace(dense_batch_inner=True)):
        e = jax_flash_amd.explain(q, k, v, **kw)
        assert e.forward.step("fwd").flags.get("BATCH_INNER") and e.backward.step("dkdv").flags.get("BATCH_INNER")
        got = run("triton", q, k, v, dout, dlse, kw)
    assert_like_float64(got, (q, k, v, dout, dlse), kw, ref_kw, jnp.bfloat16)
