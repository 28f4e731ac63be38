"""The Gluon dK/dV (kernels/bwd_sm90.py): on the H200 against float64 for every variant it takes, on the dS path and
on seven products (GPU only; Gluon does not run in Triton's interpreter); its rows within the kernel's limits. Which
calls take it (plan.gluon_dkdv_row): tests/test_plan.py. What _launch.backward launches with it, compiled for sm90 on
the CPU: tests/kernel_factory_cases.py case_cuda_gluon_dkdv. Paths are chosen through plan.Policy (plan.using)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import ON_GPU, fwd_bwd_through, inputs
from jax_flash_amd import _launch, _triton, plan
from jax_flash_amd.operands import Operands
from jax_flash_amd.kernels import configs
from jax_flash_amd.plan import Policy
from jax_flash_amd.rules import Band
from test_gluon_fwd import CASES as FWD_CASES, INF, _rows, run_case, through_the_api, with_defaults

# the forward's cases (ragged blocks of b 2, cross lengths both ways, rows that see no key, GQA, ALiBi, windows,
# softcap, D 64, fp16), each on the path its head takes by default; the cases below also the other path
CASES = {name: c for name, c in FWD_CASES.items() if not c.get("real_rows")}
CASES.update({
    "seven-products": dict(sq=300, sk=300, causal=True, ds=False),
    "seven-products-gqa-alibi": dict(sq=300, sk=300, causal=True, h_kv=2, alibi=True, ds=False),
    "d64-ds": dict(sq=300, sk=300, causal=True, d=64, ds=True),
    "d64-ds-window": dict(sq=700, sk=700, window=(100, 37), d=64, ds=True),
    "whole-blocks": dict(sq=512, sk=512),  # the unmasked loop (EVEN)
    "gqa-whole-causal": dict(sq=512, sk=512, causal=True, h_kv=1),
    "banded-workspace": dict(sq=1100, sk=1100, window=(150, 0)),  # bwd.ds_shape's DS_BAND layout
    # dropout (the rows' `dropout` turned on): its mask regenerated in dK/dV, carried by dS on the dS path
    "dropout-causal": dict(sq=300, sk=300, causal=True, dropout=0.2),
    "dropout-gqa-alibi": dict(sq=300, sk=300, h_kv=2, alibi=True, dropout=0.2),
    "dropout-cross-window": dict(sq=450, sk=333, window=(60, 40), dropout=0.2),
    "dropout-seven-products": dict(sq=300, sk=300, causal=True, dropout=0.2, ds=False),
    "dropout-d64": dict(sq=300, sk=300, d=64, dropout=0.2),
})


def _case(name):
    return {"ds": None, **with_defaults(CASES[name])}


def _ds(c) -> dict:
    """The rows' `ds` forced as the case says (None: the shipped rows')."""
    return {} if c["ds"] is None else {"ds": c["ds"]}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_dkdv(name):
    """The backward with dK/dV through the Gluon kernel (checked: it ran), the forward through the Triton rows (no
    Gluon forward rows), against float64, the rows' min_seq lowered to 0 and no window narrow (limits.narrow_window 0;
    with dropout the row that takes it: D 64's 64-query steps). ds: the rows' `ds` forced either way (None: the
    shipped row's). seq_q 50 and 333: lse and delta padded to aligned rows (_launch._dkdv)."""
    c = _case(name)
    policy = Policy().replace(gluon_fwd=(), narrow_window=0,
                              gluon_dkdv=_rows(configs.SM90_GLUON_DKDV, min_seq=0, **_ds(c)))
    kernels = run_case(c, seed=29, policy=policy)
    assert "attn_bwd_dkdv_sm90" in kernels, kernels
    ds = c["ds"] if c["ds"] is not None else next(r.ds for r in configs.SM90_GLUON_DKDV if r.head_dim == c["d"])
    assert ("attn_bwd_dq_ds" in kernels) == ds, kernels


# grouped heads with dK/dV per query head (Policy.dkdv_per_query_head): causal, a window with ALiBi, dropout, by
# launches of heads (a workspace of half the heads)
PER_QUERY_HEAD_CASES = {"causal": dict(sq=1000, sk=1000, causal=True, h=8, h_kv=2),
                        "window-alibi": dict(sq=700, sk=900, window=(200, 30), h=8, h_kv=1, alibi=True),
                        "dropout": dict(sq=600, sk=600, causal=True, h=4, h_kv=2, dropout=0.2),
                        "by-heads": dict(sq=1024, sk=1024, causal=True, h=8, h_kv=2, split="heads")}


@pytest.mark.parametrize("name", list(PER_QUERY_HEAD_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_dkdv_per_query_head(name):
    """The Gluon dK/dV once per query head (K and V repeated, each group's parts summed), against float64."""
    c = {"split": None, **with_defaults(PER_QUERY_HEAD_CASES[name])}
    policy = Policy(dkdv_per_query_head=True, gluon_dkdv=_rows(configs.SM90_GLUON_DKDV, min_seq=0,
                                                               dropout=c["dropout"] > 0)).replace(narrow_window=0)
    if c["split"] == "heads":
        whole = plan.Call("sm90", c["b"], c["sq"], c["sk"], c["h"], c["h"], 128, band=Band.of(True, (-1, -1), 1024,
                                                                                               1024))
        rows, cols = plan.ds_workspace(whole.heads_slice(c["h"] // 2), 2 * plan.GLUON_ROWS)
        policy = policy.replace(ds_workspace_bytes=rows * cols * 2)
    launches = []
    run_case(c, seed=37, policy=policy, launches=launches)
    dkdv = [one for one in launches if one.kernel.__name__ == "attn_bwd_dkdv_sm90"]
    assert len(dkdv) == (2 if c["split"] else 1) and {one.constexprs["KV_H"] for one in dkdv} == {
        c["h"] // 2 if c["split"] == "heads" else c["h"]}, dkdv


@pytest.mark.parametrize("how", ["default", "by-heads", "per-query-head"])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_backward_is_bitwise_repeatable(how):
    """The backward's gradients are the same bits in 10 runs (deterministic by default: one writer per element, sums
    in a fixed order), on the dS path as shipped, by head groups and per query head."""
    b, n, h, h_kv = 2, 2048, 8, 2
    whole = plan.Call("sm90", b, n, n, h, h_kv, 128, band=Band.of(True, (-1, -1), n, n))
    rows, cols = plan.ds_workspace(whole.heads_slice(1), 2 * plan.GLUON_ROWS)
    policy = {"default": Policy(), "by-heads": Policy().replace(ds_workspace_bytes=rows * cols * 2),
              "per-query-head": Policy(dkdv_per_query_head=True)}[how]
    q, k, v, dout, dlse = inputs((b, n, h, 128), (b, n, h_kv, 128), jnp.bfloat16, seed=41)
    statics = _launch.Statics(128 ** -0.5, whole.band)
    kernels = []

    def run(launch):
        kernels.append(launch.kernel.__name__)
        return _triton.run(launch)

    f = jax.jit(fwd_bwd_through(run, _triton.target(), statics, policy=policy))
    first = jax.device_get(f(q, k, v, dout, dlse, Operands()))
    assert "attn_bwd_dq_ds" in kernels, kernels
    for _ in range(10):
        again = jax.device_get(f(q, k, v, dout, dlse, Operands()))
        for name in ("dq", "dk", "dv"):
            np.testing.assert_array_equal(np.asarray(again[name]), np.asarray(first[name]), err_msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_dkdv_through_the_api():
    """jax_flash_amd.attention under jit and grad: its plan runs the Gluon dK/dV, the result against float64."""
    assert "attn_bwd_dkdv_sm90" in through_the_api((2, 1000, 4, 128), seed=6)


def test_every_gluon_dkdv_row_is_within_the_kernels_limits():
    """Rows as data, checked: for each head dim the kernel takes a row for calls with dropout and one without (which
    may be the same), within its shared memory."""
    for d in (64, 128):
        for p in (0.0, 0.1):
            call = plan.Call("sm90", 1, 1 << 20, 1 << 20, 1, 1, d, "bfloat16", dropout_p=p)
            assert plan.gluon_dkdv_row(call), (d, p)
    for row in configs.SM90_GLUON_DKDV + _rows(configs.SM90_GLUON_DKDV, persistent=1):
        d, bm, stages = row.head_dim, row.block_m, row.stages
        # K, V (two tiles' when persistent); the q and dO ring; dS^T staging (one buffer without ds); the lse and
        # delta ring (fp32)
        kv = 2 * 128 * d * (2 if row.persistent else 1)
        tiles = (kv + 2 * stages * bm * d + (2 if row.ds else 1) * 64 * bm) * 2 + 2 * stages * bm * 4
        assert tiles <= 227 * 1024, row
        assert bm in (64, 128) and row.num_warps == 4 and 24 < row.consumer_regs <= 256, row


# whole blocks (the persistent grid takes no other) on 3 programs, so each runs several tiles: the ring and the two
# K / V buffer pairs carried across tiles, tiles of unequal work, and tiles with no query step (cross-window: key
# blocks no query sees), on the dS path and on seven products
PERSISTENT_CASES = {
    "full": dict(sq=512, sk=512),
    "causal": dict(sq=512, sk=512, causal=True),
    "cross-causal-more-keys": dict(sq=256, sk=640, causal=True),
    "cross-causal-more-queries": dict(sq=640, sk=256, causal=True),
    "cross-window": dict(sq=256, sk=768, window=(100, 20)),
    "cross-window-odd-rounds": dict(sq=256, sk=1024, window=(60, 0), h_kv=2),  # key blocks no query sees, on both
    # buffer pairs
    "gqa-alibi-causal": dict(sq=384, sk=384, causal=True, h_kv=2, alibi=True),
    "two-sided": dict(sq=640, sk=512, window=(60, 40)),
    "banded-workspace": dict(sq=1152, sk=1152, window=(150, 0)),
    "softcap-causal": dict(sq=512, sk=512, causal=True, softcap=20.0),
    "dropout-causal": dict(sq=512, sk=512, causal=True, dropout=0.2),
    "dropout-gqa": dict(sq=384, sk=384, h_kv=2, dropout=0.2),
    "seven-products": dict(sq=512, sk=512, causal=True, ds=False),
    "d64-causal": dict(sq=512, sk=512, causal=True, d=64),
    "fp16-causal": dict(sq=512, sk=512, causal=True, dtype=jnp.float16),
}


@pytest.mark.parametrize("name", list(PERSISTENT_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_persistent_dkdv(name):
    """The Gluon dK/dV's persistent grid (every row made `persistent`, from any length, dropout on, any balance) on 3
    programs, against float64."""
    c = {"ds": None, **with_defaults(PERSISTENT_CASES[name])}
    policy = Policy().replace(gluon_fwd=(), narrow_window=0, persistent_balance=INF, compute_units=3,
                              gluon_dkdv=_rows(configs.SM90_GLUON_DKDV, min_seq=0, persistent=1, dropout=True,
                                               **_ds(c)))
    launches = []
    run_case(c, seed=37, policy=policy, launches=launches)
    grids = [(one.kernel.__name__, one.grid) for one in launches]
    assert ("attn_bwd_dkdv_sm90", (3, 1)) in grids, grids


# narrow windows with `spans` (each consumer group passes over the steps that see none of its keys; the dS path's dQ
# selects the tiles left unwritten away): two-sided, left-bounded, cross lengths, a banded workspace, D 64, ragged
SPANS_CASES = {
    "two-sided": dict(sq=640, sk=640, window=(100, 37)),
    "left": dict(sq=1100, sk=1100, window=(300, 0)),
    "cross": dict(sq=450, sk=700, window=(60, 40)),
    "banded-workspace": dict(sq=1152, sk=1152, window=(150, 0)),
    "gqa-alibi": dict(sq=512, sk=512, window=(64, 64), h_kv=2, alibi=True),
    "seven-products": dict(sq=512, sk=512, window=(100, 0), ds=False),
    "d64": dict(sq=700, sk=700, window=(100, 37), d=64),
    "d64-whole": dict(sq=768, sk=768, window=(100, 37), d=64),
    "cross-window": dict(sq=256, sk=768, window=(100, 20)),  # key blocks no query sees
}


@pytest.mark.parametrize("persistent", [0, 1])
@pytest.mark.parametrize("name", list(SPANS_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_dkdv_spans(name, persistent):
    """The Gluon dK/dV with every row's `spans` (persistent: rows made `persistent` ahead of the same rows tiled, so
    calls of whole blocks run persistent on 3 programs and the others fall through to the tiled rows), against
    float64."""
    c = {"ds": None, **with_defaults(SPANS_CASES[name])}
    rows = _rows(configs.SM90_GLUON_DKDV, min_seq=0, spans=True, **_ds(c))
    policy = Policy().replace(gluon_fwd=(), persistent_balance=INF, compute_units=3,
                              gluon_dkdv=_rows(rows, persistent=1) * persistent + rows)
    launches = []
    run_case(c, seed=41, policy=policy, launches=launches)
    dkdv = [(one.grid, one.constexprs) for one in launches if one.kernel.__name__ == "attn_bwd_dkdv_sm90"]
    assert dkdv and all(flags["SPANS"] for _, flags in dkdv), dkdv
    block_m = next(r.block_m for r in rows if r.head_dim == c["d"])
    whole = c["sq"] % block_m == 0 and c["sk"] % 128 == 0
    assert all((grid == (3, 1)) == bool(persistent and whole) for grid, _ in dkdv), dkdv
