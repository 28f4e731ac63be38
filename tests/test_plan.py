"""Which kernels, rows, grids and flags a call runs (jax_flash_amd/plan.py), table-driven: each case is a call
(shape, dtype, band, variant, target, policy) and what its plan must say. No GPU needed: plans are data.
The kernels' numerics on each path: test_sm90.py, test_gluon_fwd.py, test_gluon_bwd.py (GPU) and the interpreter
tests."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jax_flash_amd
from jax_flash_amd import plan
from jax_flash_amd.kernels import configs
from jax_flash_amd.plan import Call, Policy
from jax_flash_amd.rules import Band

NO_GLUON = dict(gluon_fwd=(), gluon_fwd_fp8=(), gluon_dkdv=())


def call(shape=(1, 8192, 16, 128), kv_heads=16, seq_k=None, dtype="bfloat16", target="sm90", causal=True,
         window=(-1, -1), dropout=0.0, softcap=0.0, alibi=False, segments=False, positions=False, units=132,
         compiled_warps=True, interpreted=False, **policy) -> Call:
    """A Call; policy: Policy.replace's fields (rows, gluon tables, limits)."""
    b, sq, h, d = shape
    sk = sq if seq_k is None else seq_k
    operands = {"slopes"} if alibi else set()
    if segments:
        operands |= {"q_segment_ids", "kv_segment_ids"}
    if positions:
        operands.add("positions")
    if dropout:
        operands.add("seeds")
    return Call(target, b, sq, sk, h, kv_heads, d, jnp.dtype(dtype).name, Band.of(causal, window, sq, sk), softcap,
                dropout, frozenset(operands), units, compiled_warps, interpreted, Policy().replace(**policy))


def gluon_head(p: plan.Plan, role: str):
    """The head dim of the Gluon row a plan's step of `role` runs, or None (a Triton row)."""
    step = p.step(role)
    return step.row.head_dim if step.kernel.endswith("_sm90") else None


# ----- the Gluon forward (kernels/fwd_sm90.py) -----

FORCED_FWD = configs.TARGETS["sm90"]["fwd"][2]


@pytest.mark.parametrize("case, head", [
    (dict(), 128),
    (dict(shape=(2, 8192, 32, 64)), 64),
    (dict(shape=(2, 4096, 32, 64)), 64),  # D 64 below 8192: the persistent row (whole blocks)
    (dict(shape=(2, 4000, 32, 64)), None),  # ragged: no persistent grid, and the tiled row from 8192
    (dict(kv_heads=4), 128),  # grouped heads
    (dict(dtype="float16"), 128),
    (dict(alibi=True), 128),
    (dict(window=(4096, 0)), 128),  # wide: one-sided in effect
    (dict(window=(1024, 0)), None),  # narrow windows: D 128's rows do not say `window` (the "+window" Triton rows)
    (dict(shape=(4, 4096, 32, 64), window=(1024, 0)), 64),  # D 64's persistent row says `window`
    (dict(shape=(4, 4096, 32, 64), window=(100, 100), causal=False), 64),
    (dict(shape=(4, 4000, 32, 64), window=(1024, 0)), None),  # ragged: not persistent, and no tiled row for it
    (dict(shape=(4, 4096, 32, 64), window=(1024, 0), dropout=0.1), None),  # narrow windows with dropout: Triton's
    (dict(causal=False), 128),
    (dict(causal=False, window=(3000, 3000)), 128),  # two-sided, wider than Limits.narrow_window
    (dict(shape=(16, 1024, 16, 128)), 128),  # the persistent row: whole blocks
    (dict(shape=(16, 1000, 16, 128)), None),  # ragged and below the tiled row's min_seq: the Triton rows
    (dict(shape=(1, 8200, 16, 128)), 128),  # ragged from the tiled row's min_seq
    (dict(seq_k=1024), None),  # short key loops: the Triton rows (persistent: too many causal query blocks)
    (dict(seq_k=1024, causal=False), 128),  # persistent
    (dict(seq_k=1000, causal=False), None),  # ragged short key loops: the Triton rows
    (dict(shape=(4, 4096, 16, 128)), 128),
    (dict(shape=(1, 8192, 16, 256)), None),  # no row for the head
    (dict(shape=(1, 8192, 16, 96)), None),  # not a whole 16-bit tile
    (dict(dtype="float32"), None),
    (dict(dtype="float8_e4m3fn"), 128),  # SM90_GLUON_FWD_FP8's row
    (dict(dropout=0.1), 128),
    (dict(shape=(2, 8192, 32, 64), dropout=0.1), None),  # D 64 dropout: the Triton rows (no faster in Gluon)
    (dict(segments=True), None),
    (dict(positions=True), None),
    (dict(rows={"fwd": FORCED_FWD}), None),  # a forced row (autotuning, the rows sweep): Triton's
    (dict(target="cuda"), None),
    (dict(target="gfx942"), None),
    (dict(interpreted=True), None),  # Triton's interpreter cannot run Gluon
    (dict(compiled_warps=False), None),  # jax-triton 0.4 launches the requested 4 warps, not the compiled 12
])
def test_which_calls_take_the_gluon_forward(case, head):
    assert gluon_head(plan.plan_forward(call(**case)), "fwd") == head


@pytest.mark.parametrize("case, persistent", [
    (dict(shape=(4, 4096, 16, 128)), True),
    (dict(shape=(4, 4096, 16, 128), causal=False), True),
    (dict(shape=(1, 8200, 16, 128)), False),  # ragged: one descriptor cannot serve every tile
    (dict(shape=(2, 4096, 32, 64)), True),
    (dict(shape=(1, 16384, 32, 64)), False),  # D 64 from 8192: the tiled row (persistent measured slower there)
    (dict(shape=(1, 16384, 16, 128), dtype="float8_e4m3fn"), False),  # fp8 causal: the tiled row from 8192
    (dict(shape=(1, 16384, 16, 128), dtype="float8_e4m3fn", causal=False), True),
    (dict(shape=(1, 16384, 32, 64), window=(1024, 0)), True),  # a narrow window: only the rows that say `window`
    (dict(shape=(4, 4096, 16, 128), dtype="float8_e4m3fn"), True),
])
def test_which_calls_run_the_gluon_forward_persistent(case, persistent):
    step = plan.plan_forward(call(**case)).step("fwd")
    assert step.kernel == "attn_fwd_sm90"
    assert (step.layout == "persistent") == persistent == ("N_ROWS" in step.flags)
    if persistent:
        assert step.grid == (132, 1) or step.grid[0] < 132, step.grid


FP8_CANDIDATES = (configs.SM90_GLUON_FWD_FP8[1].but("test/fp8-d128-tiled", min_seq=0), configs.SM90_GLUON_FWD_FP8_D64)


@pytest.mark.parametrize("case, head", [
    (dict(), 128),  # D 128 from 8192 queries and keys
    (dict(shape=(2, 4096, 16, 128)), 128),  # the persistent row: whole blocks
    (dict(shape=(16, 1024, 16, 128), causal=False), 128),
    (dict(shape=(2, 4000, 16, 128)), None),  # ragged and below the tiled row's min_seq: the Triton rows
    (dict(shape=(1, 16384, 16, 128), seq_k=4096), None),  # not persistent (causal, 128 query blocks), short keys
    (dict(shape=(1, 16384, 32, 64)), None),  # D 64: the Triton rows
    (dict(gluon_fwd_fp8=FP8_CANDIDATES), 128),
    (dict(gluon_fwd_fp8=FP8_CANDIDATES, shape=(2, 300, 4, 64)), 64),
    (dict(gluon_fwd_fp8=FP8_CANDIDATES, shape=(2, 300, 4, 96)), None),  # not a whole tile
    (dict(gluon_fwd_fp8=FP8_CANDIDATES, window=(100, 0)), None),  # narrow windows: the Triton rows
    (dict(gluon_fwd_fp8=FP8_CANDIDATES, segments=True), None),
    (dict(gluon_fwd_fp8=FP8_CANDIDATES, interpreted=True), None),
])
def test_which_fp8_calls_take_the_gluon_forward(case, head):
    p = plan.plan_forward(call(**{"dtype": "float8_e4m3fn", **case}))
    assert gluon_head(p, "fwd") == head
    # fp8 reads V^T: the Gluon forward in its MMA order
    assert p.steps[0].role == "keys_last" and p.steps[0].flags["MMA_ORDER"] == (head is not None)


def test_the_gluon_forward_pingpongs_only_without_a_band():
    tiled = configs.SM90_GLUON_FWD_FP8[1]
    for causal, pingpong in ((True, False), (False, True)):
        step = plan.plan_forward(call(shape=(1, 16384, 16, 128), dtype="float8_e4m3fn", causal=causal,
                                      gluon_fwd_fp8=(tiled,))).step("fwd")
        assert step.row is tiled and step.flags["PINGPONG"] == pingpong


# ----- the Gluon dK/dV (kernels/bwd_sm90.py) -----

@pytest.mark.parametrize("case, head", [
    (dict(), 128),
    (dict(shape=(2, 300, 16, 128)), 128),  # D 128 at any length, ragged too
    (dict(shape=(2, 4096, 32, 64)), 64),
    (dict(shape=(4, 2048, 32, 64)), None),  # D 64 from 4096: the Triton row runs persistent below
    (dict(dtype="float16"), 128),
    (dict(alibi=True), 128),
    (dict(causal=False), 128),
    (dict(window=(4096, 0)), 128),  # wide: one-sided in effect
    (dict(window=(1024, 0), shape=(1, 8192, 16, 128)), 128),  # narrow windows too (unlike the forward)
    (dict(window=(256, 256), shape=(1, 8192, 16, 128)), 128),
    (dict(window=(1024, 0), shape=(1, 8192, 16, 128), dropout=0.1), None),  # but not with dropout (not measured)
    (dict(shape=(64, 131072, 256, 128), kv_heads=256), None),  # lse's flat index past int32
    (dict(shape=(1, 1024, 16, 256)), None),  # no row for the head
    (dict(shape=(1, 1024, 16, 96)), None),  # not a whole 16-bit tile
    (dict(dtype="float32"), None),
    (dict(dropout=0.1), 128),  # the row's `dropout`
    (dict(shape=(2, 4096, 32, 64), dropout=0.1), 64),
    (dict(segments=True), None),
    (dict(positions=True), None),
    (dict(rows={"dkdv": configs.TARGETS["sm90"]["dkdv"][1]}), None),  # a forced row: Triton's
    (dict(rows={"fwd": FORCED_FWD}), 128),  # another kernel's row
    (dict(target="cuda"), None),
    (dict(target="gfx942"), None),
    (dict(interpreted=True), None),
    (dict(compiled_warps=False), None),
])
def test_which_calls_take_the_gluon_dkdv(case, head):
    assert gluon_head(plan.plan_backward(call(**{"shape": (1, 1024, 16, 128), **case})), "dkdv") == head


@pytest.mark.parametrize("dropout, block_m", [(0.0, 128), (0.1, 64)])
def test_d64_dkdv_steps_by_dropout(dropout, block_m):
    """D 64: 128-query steps, but 64 with dropout (the row measured with it)."""
    step = plan.plan_backward(call(shape=(2, 4096, 32, 64), kv_heads=32, dropout=dropout)).step("dkdv")
    assert step.kernel == "attn_bwd_dkdv_sm90" and step.flags["BLOCK_M"] == block_m


PERSISTENT_DKDV = tuple(r.but(f"{r.name}-persistent", min_seq=0, persistent=1) for r in configs.SM90_GLUON_DKDV)


@pytest.mark.parametrize("case, persistent", [
    (dict(shape=(4, 4096, 16, 128)), True),
    (dict(shape=(4, 4096, 16, 128), causal=False), True),
    (dict(shape=(4, 4096, 16, 128), kv_heads=4), False),  # causal over 16 rows: unbalanced (persistent_balance)
    (dict(shape=(4, 4096, 16, 128), kv_heads=4, causal=False), True),
    (dict(shape=(4, 4000, 16, 128)), False),  # ragged queries: one descriptor cannot serve every tile
    (dict(shape=(4, 4096, 16, 128), seq_k=4000, causal=False), False),  # ragged keys
    (dict(shape=(1, 16384, 16, 128), window=(1024, 0)), True),  # narrow windows at any length
    (dict(shape=(1, 131072, 16, 128)), False),  # causal beyond Limits.persistent_banded_blocks
    (dict(shape=(4, 4096, 16, 128), dropout=0.1), True),
])
def test_which_backwards_run_the_gluon_dkdv_persistent(case, persistent):
    """A row with `persistent` runs a call persistent where persistent_programs allows its key blocks (whole
    blocks, balanced, a band's rows not too long); where it does not, the next row (here none: Triton's)."""
    c = call(**case, gluon_dkdv=PERSISTENT_DKDV)
    assert gluon_head(plan.plan_backward(c), "dkdv") == (128 if persistent else None)
    if persistent:  # a head group's call on the dS path (one program per SM over its key blocks)
        assert plan.plan_backward(c).step("dkdv").layout == "persistent"


def test_a_persistent_dkdv_row_gives_way_to_the_tiled_one():
    rows = (configs.SM90_GLUON_DKDV[0].but("test/persistent", persistent=1),) + configs.SM90_GLUON_DKDV
    for shape, persistent in (((4, 4096, 16, 128), True), ((4, 4000, 16, 128), False)):
        step = plan.plan_backward(call(shape=shape, gluon_dkdv=rows)).step("dkdv")
        assert step.kernel == "attn_bwd_dkdv_sm90" and (step.row.persistent > 0) == persistent
        assert ("N_ROWS" in step.flags) == persistent


def test_spans_only_for_narrow_windows():
    spans = tuple(r.but(f"{r.name}-spans", spans=True) for r in configs.SM90_GLUON_DKDV)
    for window, on in (((1024, 0), True), ((4096, 0), False), ((-1, -1), False)):
        step = plan.plan_backward(call(window=window, gluon_dkdv=spans)).step("dkdv")
        assert step.kernel == "attn_bwd_dkdv_sm90" and step.flags["SPANS"] == on


# ----- the dS path (kernels/bwd.py DS) or seven products per tile: heads per launch -----

@pytest.mark.parametrize("shape, kv_heads, d, dtype, causal, window, softcap, heads", [
    ((4, 4096, 16), 16, 128, "bfloat16", False, (-1, -1), 0.0, 16),  # 2 GiB of dS: one launch
    ((1, 16384, 16), 16, 128, "bfloat16", True, (-1, -1), 0.0, 4),  # 512 MiB per head: 4 heads a launch
    ((4, 4096, 32), 8, 128, "float16", True, (-1, -1), 0.0, 4),  # GQA: 4 query heads per key/value head
    ((1, 131072, 16), 16, 128, "bfloat16", True, (-1, -1), 0.0, 0),  # 32 GiB for one head: seven products
    # windows: the workspace banded (16384 x 4352 and x 1280 per head)
    ((1, 16384, 16), 16, 128, "bfloat16", True, (4096, 0), 0.0, 8),  # a wide window
    ((1, 16384, 16), 16, 128, "bfloat16", True, (1024, 0), 0.0, 16),  # a narrow one
    ((1, 131072, 16), 16, 128, "bfloat16", True, (1024, 0), 0.0, 4),  # banded: 336 MB per head
    ((4, 4096, 32), 32, 64, "bfloat16", False, (-1, -1), 0.0, 0),  # D 64 (its row spills with the store)
    ((4, 4096, 16), 16, 96, "bfloat16", False, (-1, -1), 0.0, 0),  # padded head: no TMA
    ((4, 4096, 16), 16, 128, "float32", False, (-1, -1), 0.0, 0),
    ((4, 4095, 16), 16, 128, "bfloat16", False, (-1, -1), 0.0, 0),  # seq_q % 4: dK/dV's pointer row
    ((4, 4096, 16), 16, 128, "bfloat16", False, (-1, -1), 30.0, 0),  # softcap: dK/dV's pointer row
    # dropout: its TMA row at D 128 (the pointer row with softcap or seq_q % 4)
    ((4, 4096, 16), 16, 128, "bfloat16", True, (-1, -1), 0.0, "dropout 16"),
    ((4, 4095, 16), 16, 128, "bfloat16", False, (-1, -1), 30.0, "dropout 16"),
    ((1, 16384, 16), 16, 128, "bfloat16", False, (-1, -1), 0.0, "dropout 4"),
    ((4, 4096, 32), 8, 128, "bfloat16", True, (-1, -1), 0.0, "dropout 4"),
    ((4, 4096, 16), 16, 128, "bfloat16", True, (-1, -1), 0.0, "dropout segments 0"),
    ((1, 16384, 16), 16, 128, "bfloat16", True, (1024, 0), 0.0, "dropout 0"),  # narrow window: seven
    ((4, 4096, 32), 32, 64, "bfloat16", False, (-1, -1), 0.0, "dropout 0"),  # D 64: its pointer row
    ((4, 4096, 16), 16, 96, "bfloat16", False, (-1, -1), 0.0, "dropout 0"),  # padded head: dQ's descriptors
    ((4, 4096, 16), 16, 128, "float32", False, (-1, -1), 0.0, "dropout 0"),
])
def test_which_backwards_take_the_ds_path(shape, kv_heads, d, dtype, causal, window, softcap, heads):
    """Key/value heads per launch of the dS path (the plan's head groups), 0 for seven products ("dropout
    [segments] N": with dropout [and segment ids]), with the Triton dK/dV rows."""
    variant = str(heads).split()
    c = call((*shape, d), kv_heads, dtype=dtype, causal=causal, window=window, softcap=softcap,
             dropout=0.1 if "dropout" in variant else 0.0, segments="segments" in variant, **NO_GLUON)
    p = plan.plan_backward(c)
    want = int(variant[-1])
    assert plan.ds_heads(c) == want
    if want:
        assert (p.kernels[0], p.kernels[-1], p.head_groups) == ("xla", "attn_bwd_dq_ds", kv_heads // want)
        assert p.step("dkdv").flags["DS"]
        assert p.step("dkdv").workspace >= 2 * p.step("dkdv").buffer[0] * p.step("dkdv").buffer[1]
    else:
        assert p.step("dq") is not None and not p.step("dkdv").flags["DS"] and p.head_groups == 1


@pytest.mark.parametrize("shape, d, softcap, dropout, heads", [
    ((4, 4095, 16), 128, 0.0, 0.0, 16),  # seq_q % 4: the Gluon dK/dV pads lse and delta (the Triton TMA row cannot)
    ((4, 4096, 16), 128, 30.0, 0.0, 16),  # softcap too
    ((1, 16384, 16), 128, 0.0, 0.1, 4),
    ((4, 4096, 32), 64, 0.0, 0.0, 0),  # D 64's Gluon rows: seven products
])
def test_which_backwards_take_the_ds_path_through_the_gluon_dkdv(shape, d, softcap, dropout, heads):
    c = call((*shape, d), shape[2], causal=False, softcap=softcap, dropout=dropout)
    p = plan.plan_backward(c)
    assert p.step("dkdv").kernel == "attn_bwd_dkdv_sm90" and plan.ds_heads(c) == heads
    assert (p.step("dqds") is not None) == bool(heads)


def test_banded_ds_path_needs_blocks_within_its_groups():
    """A banded workspace takes dK/dV rows of blocks up to DS_BAND_BLOCK; a row of larger blocks runs seven
    products, a dQ row of larger blocks is refused by name (kernels/bwd.py ds_col)."""
    c = call((1, 16384, 16, 128), window=(1024, 0), **NO_GLUON)
    row = configs.TARGETS["sm90"]["dkdv"][1]
    assert plan.ds_heads(c, row) == 16
    assert plan.ds_heads(c, row.but("test/wide", block_m=256)) == 0
    assert plan.ds_heads(call((1, 16384, 16, 128), **NO_GLUON), row.but("test/wide", block_m=256)) == 4  # whole rows
    wide_dq = configs.Row("test/dq-wide", 256, 64, max_width=128)
    with pytest.raises(ValueError, match="dQ row with blocks over"):
        plan.plan_backward(call((1, 512, 1, 128), 1, window=(64, 0), rows={"dqds": wide_dq}, **NO_GLUON))


def test_dkdv_per_query_head():
    """Policy.dkdv_per_query_head: a grouped call's dS path planned as the call with K and V repeated per query head
    (its programs key blocks x query heads), dK and dV summed over each group after; the bias's gradient as the call's
    own. The rule (None): causal calls whose own dS launches have fewer dK/dV programs than compute units."""
    llama = dict(shape=(1, 2048, 64, 128), kv_heads=8)
    p = plan.plan_backward(call(**llama))  # 16 key blocks x 8 kv heads = 128 programs < 132
    assert p.per_query_head and p.step("dkdv").grid == (16, 64) and p.step("dkdv").flags["KV_H"] == 64
    assert p.step("dkdvsum").workspace == 4 * 2048 * 64 * 128 * 2 and "summed over groups of 8" in str(p)
    assert plan.plan_backward(call(**llama, dkdv_per_query_head=False)).step("dkdv").grid == (16, 8)
    p = plan.plan_backward(call((1, 8192, 64, 128), 8))  # 4 launches of 64 key blocks x 2 kv heads
    assert p.per_query_head and p.head_groups == 4 and p.step("dkdv").grid == (64, 16)
    for shape, kw in (((1, 4096, 64, 128), {}), ((1, 2048, 64, 128), dict(causal=False)),
                      ((1, 2048, 64, 128), dict(units=100)), ((1, 16384, 64, 128), {})):
        assert not plan.plan_backward(call(shape, 8, **kw)).per_query_head, (shape, kw)
    # forced: one query head's workspace fits where one group's did not: the dS path, by launches of 4 query heads
    p = plan.plan_backward(call((1, 16384, 64, 128), 8, dkdv_per_query_head=True))
    assert p.per_query_head and p.head_groups == 16 and p.step("dkdv").flags["KV_H"] == 4
    assert plan.plan_backward(call((1, 16384, 64, 128), 8)).step("dqds") is None
    assert not plan.plan_backward(call((1, 2048, 8, 128), 8, dkdv_per_query_head=True)).per_query_head
    assert not plan.plan_backward(call(**llama, dkdv_per_query_head=True, ds_workspace_bytes=0)).per_query_head
    biased = dataclasses.replace(call(**llama, dkdv_per_query_head=True), bias_shape=(1, 64, 2048, 2048),
                                 operands=frozenset({"bias"}))
    p = plan.plan_backward(biased)
    assert p.kernels[-1] == "attn_bwd_dbias" and p.step("dbias").flags["KV_H"] == 8, p


def test_the_ds_workspace_is_reported():
    p = plan.plan_backward(call((1, 16384, 16, 128), **NO_GLUON))
    rows, cols = p.step("dkdv").buffer
    assert (rows, cols) == (4 * 16384, 16384) and p.head_groups == 4
    partial = 2 * 16384 * 4 * 128 * 4  # the edge launch's float32 dK / dV partials (a group's 4 heads)
    assert p.step("dkdv_edges") is not None and p.step("dkdv").workspace == rows * cols * 2 + partial
    assert p.workspace == p.step("dkdv").workspace + 16 * 16384 * 4  # and delta (every head)


# ----- TMA rows (sm90: 16-bit, power-of-two heads through TMA descriptors) -----

@pytest.mark.parametrize("case, takes", [
    ("plain", True), ("dropout", True), ("dropout-narrow-window", False), ("dropout-d64", True), ("segments", False),
    ("d96", False), ("float32", False), ("odd-seq", True), ("softcap", True)])
def test_which_calls_take_the_tma_rows(case, takes):
    """sm90's TMA rows serve 16-bit, power-of-two heads without segment ids, and not narrow windows with dropout
    (the pointer rows are faster there). dK/dV's also needs seq_q a multiple of 4 and no softcap. Dropout's dQ
    keeps its pointer row (its backward takes the dS path where the workspace fits); at D 64 its forward too (no
    D 64 TMA row with dropout), and its dK/dV as without dropout (no D 64 TMA dK/dV row)."""
    d = {"d96": 96, "dropout-d64": 64}.get(case, 128)
    seq = 255 if case == "odd-seq" else 256
    c = call((1, seq, 2, d), 2, dtype="float32" if case == "float32" else "bfloat16",
             window=(64, 0) if case == "dropout-narrow-window" else (-1, -1), dropout=0.1 if "dropout" in case else 0,
             softcap=30.0 if case == "softcap" else 0.0, segments=case == "segments")
    assert plan.takes_tma(c) == takes
    assert plan.dkdv_takes_tma(c) == (takes and case not in ("odd-seq", "softcap"))
    for role, rule in (("fwd", plan.takes_tma), ("dq", plan.takes_tma), ("dkdv", plan.dkdv_takes_tma)):
        pointer = (role, case) in (("dq", "dropout"), ("fwd", "dropout-d64"), ("dq", "dropout-d64"),
                                   ("dkdv", "dropout-d64"))
        assert plan.pick(c, role, rule(c)).tma == (rule(c) and not pointer), role
    if case == "dropout-narrow-window":  # the "+window" tables have TMA rows: the rule, not the table, keeps them out
        assert plan.pick(c, "dkdv").tma


@pytest.mark.parametrize("d, tma", [(16, set()), (32, set()), (48, set()), (64, {"fwd", "dq"}), (96, set()),
                                    (128, {"fwd", "dq", "dkdv"})])
def test_which_head_widths_have_tma_rows(d, tma):
    """By head width (16-bit): D 33-128 all three kernels but D 33-64's dK/dV (a candidate only); min_width keeps
    D <= 32 on the pointer rows; a head that is not a power of two never (whole-tile descriptors)."""
    for dtype in ("bfloat16", "float32"):
        c = call((1, 256, 2, d), 2, dtype=dtype, causal=False)
        for role, rule in (("fwd", plan.takes_tma), ("dq", plan.takes_tma), ("dkdv", plan.dkdv_takes_tma)):
            assert plan.pick(c, role, rule(c)).tma == (role in tma and dtype == "bfloat16"), (role, dtype)


# ----- persistent grids (kernels/fwd.py, bwd.py PERSISTENT) -----

@pytest.mark.parametrize("shape, causal, window, persistent", [
    ((16, 1024, 16), False, None, True), ((16, 1024, 16), True, None, True), ((4, 4096, 16), True, None, True),
    ((1, 16384, 16), False, None, True), ((1, 16384, 16), True, None, False), ((1, 4096, 16), True, None, False),
    ((1, 131072, 16), False, None, True), ((1, 131072, 16), True, None, False), ((2, 32768, 16), True, None, False),
    ((1, 16384, 16), True, (1024, 0), True), ((2, 32768, 16), True, (1024, 0), True),
    ((1, 16384, 16), False, (4096, 4096), False), ((2, 1000, 16), True, (255, 0), False)])
def test_which_forwards_run_persistent(shape, causal, window, persistent):
    """sm90's D 128 Triton forward row is persistent where one program per SM (132) has a schedule about as
    balanced as the tiled grid's: every call without a band, causal ones with enough rows per program and at most
    32 query blocks per row; not causal 1 x 16384 x 16 or 1 x 4096 x 16 (unbalanced), nor causal N >= 32768.
    Narrow windows ("+window": the same row, only where persistent, else their pointer row) at any length; a wide
    window is a band like causal (the TMA row tiled)."""
    b, n, h = shape
    c = call((b, n, h, 128), h, causal=causal, window=window or (-1, -1), **NO_GLUON)
    step = plan.plan_forward(c).step("fwd")
    if persistent:
        assert (step.grid, step.flags["PERSISTENT"], step.row.tma) == ((132, 1), True, True)
    else:  # the tiled grid: the TMA row, or for a narrow window the "+window" pointer row (64 queries a block)
        narrow = c.narrow
        assert (step.grid, step.flags["PERSISTENT"], step.row.tma) == ((-(-n // (64 if narrow else 128)), b * h),
                                                                       False, not narrow)


@pytest.mark.parametrize("shape, d, causal, tma, persistent", [
    ((16, 1024, 32), 64, False, True, True), ((16, 1024, 32), 64, True, True, True),
    ((1, 16384, 32), 64, False, True, True), ((4, 4096, 32), 64, True, False, False),
    ((1, 16384, 32), 64, True, False, False), ((2, 1000, 32), 64, False, False, False),
    ((1, 133 * 128, 1), 64, False, True, True), ((1, 1024, 16), 64, False, False, False),
    ((2, 1000, 16), 128, False, True, False), ((1, 1024, 16), 128, False, True, True),
    ((16, 512, 32, 16384), 64, True, False, False)])
def test_which_d64_forwards_take_the_tma_row(shape, d, causal, tma, persistent):
    """sm90's D 64 TMA forward row (persistent_only, max_banded_seq) serves only calls it runs persistent, and
    causal ones only up to 1024 queries; the others take the pointer row. 133 tiles on 132 programs run
    persistent. The D 128 TMA row also serves calls it runs tiled (ragged) or one tile per program."""
    b, n, h, *sk = shape
    step = plan.plan_forward(call((b, n, h, d), h, seq_k=sk[0] if sk else None, causal=causal, **NO_GLUON)).step("fwd")
    assert (step.row.tma, step.flags["PERSISTENT"]) == (tma, persistent)


@pytest.mark.parametrize("shape, d, causal, window, persistent", [
    ((16, 1024, 32), 64, False, None, True), ((16, 1024, 32), 64, True, None, True),
    ((4, 4096, 32), 64, False, None, True), ((4, 4096, 32), 64, True, None, True),
    ((1, 16384, 32), 64, False, None, True), ((1, 16384, 32), 64, True, None, False),
    ((2, 8192, 32), 64, True, None, False), ((2, 1000, 32), 64, False, None, False),
    ((1, 512, 32), 64, False, None, False), ((16, 1024, 16), 128, False, None, False),
    ((16, 1024, 16), 128, True, None, False), ((16, 1024, 16), 64, True, (300, 0), False)])
def test_which_backwards_run_dkdv_persistent(shape, d, causal, window, persistent):
    """sm90's D 64 TMA dK/dV row (a candidate, forced here) runs persistent (132 programs) where the schedule is
    balanced: whole blocks, causal only up to 32 key blocks, more tiles than programs (not 1 x 512 x 32: 128
    tiles). Not the D 128 row (persistent, its dS store returned NaN on the H200), nor the "+window" rows."""
    b, n, h = shape
    rows = {"dkdv": configs.CANDIDATES["sm90"]["dkdv"][0]} if d == 64 and window is None else {}
    assert rows == {} or rows["dkdv"].name == "sm90/dkdv/tma-d64"
    step = plan.plan_backward(call((b, n, h, d), h, causal=causal, window=window or (-1, -1), rows=rows,
                                   **NO_GLUON)).step("dkdv")
    assert step.kernel == "attn_bwd_dkdv" and step.flags["PERSISTENT"] == persistent
    assert (step.grid == (132, 1, 1)) == persistent


@pytest.mark.parametrize("rows, programs", [(1, 2), (2, 0)])
def test_persistent_key_blocks_balance(rows, programs):
    """persistent_programs over key blocks, by hand: causal 256 queries x 512 keys (bottom-right), 64 x 128 tiles,
    2 units. Key blocks 0-3 visit 4, 4, 4 and 2 query blocks (costs 5, 5, 5, 3 with the fixed one). One row:
    persistent gives 5 + 3 and 5 + 5, the tiled grid finishes at 10: 2 programs. Two rows: persistent 16 and 20,
    tiled (greedy) 18, over persistent_balance: tiled. The forward's rule (query blocks) takes both persistent."""
    c = call((rows, 256, 1, 128), 1, seq_k=512, units=2)
    assert plan.persistent_programs(c, 64, 128, 1, keys=True) == programs
    assert plan.persistent_programs(c, 64, 128, 1) == 2


# ----- the band's edge blocks in a launch of their own (kernels/fwd.py, bwd.py EDGES) -----

@pytest.mark.parametrize("shape, d, causal, window, fwd, dkdv", [
    ((1, 16384, 16), 128, True, None, True, True),  # the dS path: 256 query blocks, by groups of 4 heads
    ((1, 16384, 32), 64, True, None, False, False),  # D 64: the pointer rows
    ((2, 8192, 16), 128, True, None, True, False),  # 64 key blocks; the dS path's 128 query blocks
    ((4, 4096, 16), 128, True, None, False, False),  # 32 blocks (and a persistent forward)
    ((4, 4096, 32), 64, True, None, False, False),
    ((1, 16384, 16), 128, False, None, False, False),  # no band, whole blocks: nothing masked
    ((1, 16380, 16), 128, False, None, True, True),  # ragged blocks: every block masked otherwise
    ((1, 16384, 16), 128, True, (8191, 0), True, False),  # a wide window: 64 key blocks, 128 query blocks
    ((1, 16384, 16), 128, True, (1024, 0), False, False),  # a narrow one: 9 blocks
    ((1, 16384, 16), 96, True, None, False, False),  # no TMA (padded head)
])
def test_which_calls_run_the_edges_apart(shape, d, causal, window, fwd, dkdv):
    """TMA rows run the band's masked edge blocks in a second launch where their one loop would mask (a band,
    ragged blocks) and runs at least Limits.edges_apart_blocks blocks (ds_edges_apart_blocks on the dS path; the
    band's width where it bounds both sides); not persistent forwards."""
    b, n, h = shape
    c = call((b, n, h, d), h, causal=causal, window=window or (-1, -1), **NO_GLUON)
    for p, role, apart in ((plan.plan_forward(c), "fwd", fwd), (plan.plan_backward(c), "dkdv", dkdv)):
        assert p.step(role).flags["EDGES"] == int(apart)
        edge = p.step(role + "_edges")
        assert (edge is not None) == apart
        if apart:
            assert edge.flags["EDGES"] == 2 and not edge.flags["TMA"] and edge.layout == "edges"


@pytest.mark.parametrize("window", [(-1, -1), (8191, 0)], ids=["causal", "wide-window"])
def test_dropout_runs_no_edges_apart(window):
    """With dropout the TMA rows keep the band's edge blocks in their one loop (the forward's partial would carry
    keep_scale), where without it the same calls run them apart (above)."""
    c = call((1, 16384, 16, 128), window=window, dropout=0.1, **NO_GLUON)
    for p, role in ((plan.plan_forward(c), "fwd"), (plan.plan_backward(c), "dkdv")):
        assert p.step(role).flags["EDGES"] == 0 and p.step(role).row.tma and p.step(role + "_edges") is None


# ----- the rule numbers as data (Limits) -----

def test_limits_move_the_rules():
    """A policy's numbers, not module globals, move the rules: no dS workspace, no narrow windows, edges apart from
    one block, any balance."""
    c = call((4, 4096, 16, 128), **NO_GLUON)
    assert plan.plan_backward(c).step("dqds") is not None
    assert plan.plan_backward(call((4, 4096, 16, 128), ds_workspace_bytes=0, **NO_GLUON)).step("dqds") is None
    narrow = call(window=(1024, 0), **NO_GLUON)
    assert narrow.kind == "window" and call(window=(1024, 0), narrow_window=0).kind == ""
    assert plan.plan_forward(call((4, 4096, 16, 128), causal=True, edges_apart_blocks=1, **NO_GLUON)).step(
        "fwd").flags["PERSISTENT"]  # persistent forwards keep their edges in
    tiled = call((1, 16384, 16, 128), edges_apart_blocks=1, **NO_GLUON)
    assert plan.plan_forward(tiled).step("fwd_edges") is not None
    unbalanced = call((1, 16384, 16, 128), **NO_GLUON)
    assert not plan.plan_forward(unbalanced).step("fwd").flags["PERSISTENT"]
    assert plan.plan_forward(call((1, 16384, 16, 128), persistent_balance=float("inf"), persistent_banded_blocks=1 << 20,
                                  **NO_GLUON)).step("fwd").flags["PERSISTENT"]


def test_forced_rows_need_tma_where_the_call_takes_it():
    """A forced TMA row gives way where the call cannot take TMA (a padded head); a forced pointer row is taken."""
    tma = configs.TARGETS["sm90"]["fwd"][2]
    pointer = configs.TARGETS["sm90"]["fwd"][3]
    assert plan.plan_forward(call((1, 4096, 16, 128), rows={"fwd": tma}, **NO_GLUON)).step("fwd").row is tma
    assert plan.plan_forward(call((1, 4096, 16, 96), rows={"fwd": tma}, **NO_GLUON)).step("fwd").row is not tma
    assert plan.plan_forward(call((1, 4096, 16, 128), rows={"fwd": pointer})).step("fwd").row is pointer


# ----- every target's plans, and the KV cache -----

@pytest.mark.parametrize("target", ["sm90", "cuda", "gfx90a", "gfx942", "gfx950", "interpret"])
@pytest.mark.parametrize("d", [32, 64, 80, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_target_plans_every_head(target, d, dtype):
    """Every target has a row for every head dim and 16/32-bit dtype, forward and backward; AMD never runs the dS
    path (no row has it); each step names its row and a reason."""
    for causal in (False, True):
        c = call((2, 1000, 4, d), 2, dtype=dtype, target=target, causal=causal)
        for p in (plan.plan_forward(c), plan.plan_backward(c)):
            assert p.steps and all(s.reason for s in p.steps)
            assert all(s.row is not None for s in p.steps if s.kernel != "xla")
            if target.startswith("gfx"):
                assert "attn_bwd_dq_ds" not in p.kernels


@pytest.mark.parametrize("target, paged, seq_q, splits, kernels", [
    ("sm90", False, 1, 0, ("attn_decode", "attn_decode_combine")),
    ("sm90", True, 1, 0, ("kv_append", "attn_decode", "attn_decode_combine")),
    ("gfx942", False, 64, 1, ("attn_decode",)),
    ("interpret", True, 4, 3, ("kv_append", "attn_decode", "attn_decode_combine")),
])
def test_decode_plans(target, paged, seq_q, splits, kernels):
    c = plan.DecodeCall(target, 8, seq_q, 32, 8, 128, "bfloat16", 4096, page_size=64 if paged else 0,
                        seq_new=1 if paged else 0, num_splits=splits, compute_units=132)
    p = plan.plan_decode(c)
    assert p.kernels == kernels
    decode = p.step("decode")
    assert decode.grid[1] == (splits or plan.decode_splits(target, 8 * 8 * decode.grid[2], 4096,
                                                           decode.flags["BLOCK_N"], 132))
    assert decode.flags["BLOCK_M"] == max(16, 1 << (seq_q * 4 - 1).bit_length()) or seq_q * 4 > decode.flags["BLOCK_M"]
    if paged:
        assert decode.flags["BLOCK_N"] <= 64 and decode.flags["PAGED"]


def test_decode_split_rule():
    rule = configs.DECODE_SPLITS["cuda"]
    assert plan.decode_splits("cuda", 64, 32768, 64, 132) == 132 * rule["programs_per_cu"] // 64
    assert plan.decode_splits("cuda", 8, 131072, 64, 132) == min(rule["max_splits"], 132 * rule["programs_per_cu"] // 8)
    assert plan.decode_splits("cuda", 1024, 32768, 64, 132) == 1  # enough programs already
    assert plan.decode_splits("cuda", 1, 256, 64, 132) == 1  # too few keys to split
    assert plan.decode_splits("gfx942", 64, 32768, 32, 304) == 304 * 8 // 64


def test_decode_refuses_pages_the_kernels_cannot_take():
    with pytest.raises(ValueError, match="multiple of 16"):
        plan.plan_decode(plan.DecodeCall("sm90", 1, 1, 8, 8, 128, "bfloat16", 1024, page_size=8))


# ----- explain: the public view of the plans -----

@pytest.mark.parametrize("target, fwd_kernel, dkdv_kernel", [
    ("sm90", "attn_fwd_sm90", "attn_bwd_dkdv_sm90"), ("cuda", "attn_fwd", "attn_bwd_dkdv"),
    ("gfx90a", "attn_fwd", "attn_bwd_dkdv"), ("gfx942", "attn_fwd", "attn_bwd_dkdv"),
    ("gfx950", "attn_fwd", "attn_bwd_dkdv"), ("interpret", "attn_fwd", "attn_bwd_dkdv")])
def test_explain_every_target_from_a_cpu(target, fwd_kernel, dkdv_kernel):
    """explain(target=...) plans for a named target from any machine (its nominal compute units, compiled warps),
    with arrays or ShapeDtypeStructs, and prints a table of steps, rows, grids, workspace and reasons."""
    x = jax.ShapeDtypeStruct((2, 4096, 16, 128), jnp.bfloat16)
    e = jax_flash_amd.explain(x, x, x, causal=True, target=target)
    assert (e.implementation, e.target) == ("interpret" if target == "interpret" else "triton", target)
    assert e.forward.step("fwd").kernel == fwd_kernel and e.backward.step("dkdv").kernel == dkdv_kernel
    assert e.forward.call.compute_units == configs.DECODE_SPLITS[target]["cus"]
    text = str(e)
    for word in ("forward on " + target, "backward on " + target, "kernel", "row", "grid", "workspace", "why",
                 e.forward.step("fwd").row.name, e.backward.step("dkdv").row.name):
        assert word in text, word


def test_explain_takes_attentions_arguments_and_checks_them():
    q = jnp.zeros((1, 300, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 500, 2, 64), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((1, 300), jnp.int32)
    e = jax_flash_amd.explain(q, kv, kv, causal=True, window_size=(100, 0), softcap=20.0,
                              alibi_slopes=jnp.ones((4,), jnp.float32), q_segment_ids=ids,
                              kv_segment_ids=jax.ShapeDtypeStruct((1, 500), jnp.int32), target="sm90")
    c = e.forward.call
    assert (c.seq_q, c.seq_k, c.heads, c.kv_heads, c.softcap) == (300, 500, 4, 2, 20.0)
    assert c.band == Band.of(True, (100, 0), 300, 500) and {"slopes", "q_segment_ids"} <= c.operands
    assert e.forward.step("fwd").kernel == "attn_fwd"  # segment ids: no Gluon, no TMA
    with pytest.raises(ValueError, match="target must be one of"):
        jax_flash_amd.explain(q, q, q, target="gfx1100")
    with pytest.raises(ValueError, match="head_dim"):
        jax_flash_amd.explain(q, q[..., :32], q[..., :32], target="sm90")
    with pytest.raises(TypeError, match="cannot run on gfx90a"):
        f8 = jax.ShapeDtypeStruct((1, 64, 4, 64), jnp.float8_e4m3fn)
        d = jax.ShapeDtypeStruct((1, 4), jnp.float32)
        jax_flash_amd.explain(f8, f8, f8, q_descale=d, k_descale=d, v_descale=d, target="gfx90a")
    assert "xla" in str(jax_flash_amd.explain(q, q, q, implementation="xla"))


def test_explain_fp8_is_forward_only():
    f8 = jax.ShapeDtypeStruct((1, 4096, 4, 128), jnp.float8_e4m3fn)
    d = jax.ShapeDtypeStruct((1, 4), jnp.float32)
    e = jax_flash_amd.explain(f8, f8, f8, q_descale=d, k_descale=d, v_descale=d, target="sm90")
    assert e.backward is None and e.forward.kernels == ("keys_last", "attn_fwd_sm90")
    assert "forward only" in str(e)


def test_policies_reach_calls_traced_inside_using():
    """plan.using(policy): calls traced inside plan with it (the static options carry it), others with the
    default."""
    x = jax.ShapeDtypeStruct((1, 4096, 4, 128), jnp.bfloat16)
    forced = Policy().replace(ds_workspace_bytes=0)
    with plan.using(forced):
        inside = jax_flash_amd.explain(x, x, x, causal=True, target="sm90")
    outside = jax_flash_amd.explain(x, x, x, causal=True, target="sm90")
    assert inside.backward.step("dqds") is None and outside.backward.step("dqds") is not None
    assert plan.active() is plan.DEFAULT
