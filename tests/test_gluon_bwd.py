"""The Gluon dK/dV (kernels/bwd_sm90.py): on the H200 against float64 for every variant it takes, on the dS path and
on seven products (GPU only; Gluon does not run in Triton's interpreter); on any machine, which calls take it
(_launch.gluon_dkdv). What _launch.backward launches with it, compiled for sm90 on the CPU:
tests/kernel_factory_cases.py case_cuda_gluon_dkdv."""

import jax
import jax.numpy as jnp
import pytest

from helpers import ON_GPU
from jax_flash_amd import _launch
from jax_flash_amd.kernels import configs
from jax_flash_amd.rules import Band
from test_gluon_fwd import CASES as FWD_CASES, run_case, takes, through_the_api, with_defaults

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
    # the Gluon dQ of the seven-product path too (configs.SM90_GLUON_DQ_CANDIDATES; none shipped: no faster)
    "gluon-dq-d64-causal": dict(sq=300, sk=300, causal=True, d=64, gluon_dq=True),
    "gluon-dq-gqa-alibi": dict(sq=300, sk=300, causal=True, h_kv=2, alibi=True, ds=False, gluon_dq=True),
    "gluon-dq-cross": dict(sq=200, sk=333, causal=True, d=64, gluon_dq=True),
    "gluon-dq-more-queries": dict(sq=333, sk=200, causal=True, d=64, gluon_dq=True),  # rows that see no key
    "gluon-dq-softcap-window": dict(sq=700, sk=700, window=(100, 37), softcap=20.0, d=64, gluon_dq=True),
    "gluon-dq-dropout": dict(sq=300, sk=300, d=64, dropout=0.2, gluon_dq=True),
    "gluon-dq-fp16-whole": dict(sq=512, sk=512, d=64, dtype=jnp.float16, gluon_dq=True),
    "gluon-dq-d128-window": dict(sq=700, sk=650, window=(100, 37), alibi=True, ds=False, gluon_dq=True),
})


def _case(name):
    return {"ds": None, "gluon_dq": False, **with_defaults(CASES[name])}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_dkdv(name, monkeypatch):
    """The backward with dK/dV through the Gluon kernel (checked: it ran), the forward through the Triton rows,
    against float64, the rows' min_seq lowered to 0 (with dropout the row that takes it: D 64's 64-query steps).
    ds: the row's DS forced either way (None: the shipped row's). seq_q 50 and 333: lse and delta padded to aligned
    rows (_launch._dkdv_gluon). gluon_dq: dQ through the Gluon dQ's candidate rows too."""
    c = _case(name)
    monkeypatch.setattr(configs, "SM90_GLUON_FWD", [])
    monkeypatch.setattr(configs, "NARROW_WINDOW", 0)
    ds = {} if c["ds"] is None else {"DS": c["ds"]}
    monkeypatch.setattr(configs, "SM90_GLUON_DKDV", [dict(r, min_seq=0, **ds)
                                                     for r in configs.SM90_GLUON_DKDV])
    if c["gluon_dq"]:
        monkeypatch.setattr(configs, "SM90_GLUON_DQ", configs.SM90_GLUON_DQ_CANDIDATES)
    kernels = run_case(c, seed=29)
    assert "attn_bwd_dkdv_sm90" in kernels, kernels
    assert ("attn_bwd_dq_sm90" in kernels) == c["gluon_dq"], kernels
    ds = c["ds"] if c["ds"] is not None else next(r["DS"] for r in configs.SM90_GLUON_DKDV if r["head_dim"] == c["d"])
    assert ("attn_bwd_dq_ds" in kernels) == ds, kernels


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_dkdv_through_the_api(monkeypatch):
    """jax_flash_amd.attention under jit and grad: the Gluon dK/dV runs (recorded), the result against float64."""
    assert "attn_bwd_dkdv_sm90" in through_the_api(monkeypatch, (2, 1000, 4, 128), seed=6)


@pytest.mark.parametrize("case, head", [
    (dict(), 128),
    (dict(shape=(2, 300, 16, 128)), 128),  # D 128 at any length, ragged too
    (dict(shape=(2, 4096, 32, 64)), 64),
    (dict(shape=(4, 2048, 32, 64)), None),  # D 64 from 4096: the Triton row runs persistent below
    (dict(dtype=jnp.float16), 128),
    (dict(alibi=True), 128),
    (dict(causal=False), 128),
    (dict(window=(4096, 0)), 128),  # wide: one-sided in effect
    (dict(window=(1024, 0), shape=(1, 8192, 16, 128)), 128),  # narrow windows too (unlike the forward)
    (dict(window=(256, 256), shape=(1, 8192, 16, 128)), 128),
    (dict(window=(1024, 0), shape=(1, 8192, 16, 128), dropout=0.1), None),  # but not with dropout (not measured)
    (dict(shape=(64, 131072, 256, 128), kv_heads=256), None),  # lse's flat index past int32
    (dict(shape=(1, 1024, 16, 256)), None),  # no row for the head
    (dict(shape=(1, 1024, 16, 96)), None),  # not a whole 16-bit tile
    (dict(dtype=jnp.float32), None),
    (dict(dropout=0.1), 128),  # configs.SM90_GLUON_DKDV's `dropout`
    (dict(shape=(2, 4096, 32, 64), dropout=0.1), 64),
    (dict(segments=True), None),
    (dict(positions=True), None),
    (dict(rows={"dkdv": {"BLOCK_M": 64}}), None),  # an explicit row (autotuning, the rows sweep): Triton's
    (dict(rows={"fwd": {"BLOCK_M": 64}}), 128),  # another kernel's row
    (dict(target="cuda"), None),
    (dict(target="gfx942"), None),
    (dict(interpreted=True), None),
    (dict(jax_triton=(0, 4, 1)), None),
])
def test_which_calls_take_the_gluon_dkdv(case, head, monkeypatch):
    assert takes(monkeypatch, _launch.gluon_dkdv, **{"shape": (1, 1024, 16, 128), **case}) == head


@pytest.mark.parametrize("dropout, block_m", [(0.0, 128), (0.1, 64)])
def test_d64_dkdv_steps_by_dropout(dropout, block_m, monkeypatch):
    """D 64: 128-query steps, but 64 with dropout (configs.SM90_GLUON_DKDV: the row measured with it)."""
    assert takes(monkeypatch, _launch.gluon_dkdv, shape=(2, 4096, 32, 64), kv_heads=32, dropout=dropout,
                 key="BLOCK_M") == block_m


@pytest.mark.parametrize("case, head", [
    (dict(), None),  # no row shipped (no faster than the Triton dQ)
    (dict(candidates=True), 128),
    (dict(candidates=True, shape=(2, 300, 32, 64)), 64),
    (dict(candidates=True, dropout=0.1), 128),
    (dict(candidates=True, segments=True), None),
    (dict(candidates=True, rows={"dq": {"BLOCK_M": 64}}), None),
    (dict(candidates=True, interpreted=True), None),
])
def test_which_calls_take_the_gluon_dq(case, head, monkeypatch):
    case = dict(case)
    if case.pop("candidates", False):
        monkeypatch.setattr(configs, "SM90_GLUON_DQ", configs.SM90_GLUON_DQ_CANDIDATES)
    assert takes(monkeypatch, _launch.gluon_dq, **{"shape": (1, 1024, 16, 128), **case}) == head


def test_every_gluon_dkdv_row_is_within_the_kernels_limits():
    """Rows as data, checked: for each head dim the kernel takes a row for calls with dropout and one without (which
    may be the same), within its shared memory."""
    for d in (64, 128):
        for p in (0.0, 0.1):
            q = jax.ShapeDtypeStruct((1, 1 << 20, 1, d), jnp.bfloat16)
            statics = _launch.Statics(1.0, Band.of(False, (-1, -1), 1, 1), dropout_p=p)
            assert _launch._gluon_row(configs.SM90_GLUON_DKDV, q, q, statics), (d, p)
    for row in configs.SM90_GLUON_DKDV + [dict(r, PERSISTENT=1) for r in configs.SM90_GLUON_DKDV]:
        d, bm, stages = row["head_dim"], row["BLOCK_M"], row["STAGES"]
        # K, V (two tiles' when PERSISTENT); the q and dO ring; dS^T staging (one buffer without DS); the lse and
        # delta ring (fp32)
        kv = 2 * 128 * d * (2 if row.get("PERSISTENT") else 1)
        tiles = (kv + 2 * stages * bm * d + (2 if row["DS"] else 1) * 64 * bm) * 2 + 2 * stages * bm * 4
        assert tiles <= 227 * 1024, row
        assert bm in (64, 128) and row["num_warps"] == 4 and 24 < row["CONSUMER_REGS"] <= 256, row


def _persistent_rows(monkeypatch, rows=None):
    """Every Gluon dK/dV row (or `rows`) made PERSISTENT (one program per SM), from any length."""
    monkeypatch.setattr(configs, "SM90_GLUON_DKDV", [dict(r, min_seq=0, PERSISTENT=1)
                                                     for r in (rows or configs.SM90_GLUON_DKDV)])


@pytest.mark.parametrize("case, persistent", [
    (dict(shape=(4, 4096, 16, 128)), True),
    (dict(shape=(4, 4096, 16, 128), causal=False), True),
    (dict(shape=(4, 4096, 16, 128), kv_heads=4), False),  # causal over 16 rows: unbalanced (PERSISTENT_BALANCE)
    (dict(shape=(4, 4096, 16, 128), kv_heads=4, causal=False), True),
    (dict(shape=(4, 4000, 16, 128)), False),  # ragged queries: one descriptor cannot serve every tile
    (dict(shape=(4, 4096, 16, 128), seq_k=4000, causal=False), False),  # ragged keys
    (dict(shape=(1, 16384, 16, 128), window=(1024, 0)), True),  # narrow windows at any length
    (dict(shape=(1, 131072, 16, 128)), False),  # causal beyond configs.PERSISTENT_BANDED_BLOCKS
    (dict(shape=(4, 4096, 16, 128), dropout=0.1), True),
])
def test_which_backwards_run_the_gluon_dkdv_persistent(case, persistent, monkeypatch):
    """A row with PERSISTENT runs a call persistent where _launch.persistent_programs allows its key blocks (whole
    blocks, balanced, a band's rows not too long); where it does not, the next row (here none: the Triton rows)."""
    _persistent_rows(monkeypatch)
    assert bool(takes(monkeypatch, _launch.gluon_dkdv, key="PERSISTENT", **case)) == persistent
    row = takes(monkeypatch, _launch.gluon_dkdv, key="head_dim", **case)
    assert row == (128 if persistent else None), row


def test_a_persistent_dkdv_row_gives_way_to_the_tiled_one(monkeypatch):
    """A PERSISTENT row ahead of a tiled one: calls it cannot run persistent take the tiled row (_launch._gluon_row;
    the launches and their grids: tests/kernel_factory_cases.py case_cuda_gluon_dkdv_persistent)."""
    monkeypatch.setattr(configs, "SM90_GLUON_DKDV", [dict(configs.SM90_GLUON_DKDV[0], PERSISTENT=1)]
                        + configs.SM90_GLUON_DKDV)
    for shape, persistent in (((4, 4096, 16, 128), True), ((4, 4000, 16, 128), False)):
        assert bool(takes(monkeypatch, _launch.gluon_dkdv, shape=shape, key="PERSISTENT")) == persistent
        assert takes(monkeypatch, _launch.gluon_dkdv, shape=shape) == 128


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
def test_gluon_persistent_dkdv(name, monkeypatch):
    """The Gluon dK/dV's persistent grid (every row made PERSISTENT, dropout on, any balance) on 3 programs, against
    float64."""
    c = {"ds": None, "gluon_dq": False, **with_defaults(PERSISTENT_CASES[name])}
    monkeypatch.setattr(configs, "SM90_GLUON_FWD", [])
    monkeypatch.setattr(configs, "NARROW_WINDOW", 0)
    monkeypatch.setattr(configs, "PERSISTENT_BALANCE", float("inf"))
    monkeypatch.setattr(_launch, "compute_units", lambda target: 3)
    ds = {} if c["ds"] is None else {"DS": c["ds"]}
    _persistent_rows(monkeypatch, [dict(r, dropout=True, **ds) for r in configs.SM90_GLUON_DKDV])
    grids = []
    run_case(c, seed=37, grids=grids)
    assert ("attn_bwd_dkdv_sm90", (3, 1)) in grids, grids


# narrow windows with SPANS (each consumer group passes over the steps that see none of its keys; the dS path's dQ
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
def test_gluon_dkdv_spans(name, persistent, monkeypatch):
    """The Gluon dK/dV with every row's SPANS (persistent: rows with PERSISTENT ahead of the same rows tiled, so calls
    of whole blocks run persistent on 3 programs and the others fall through to the tiled rows), against float64."""
    c = {"ds": None, "gluon_dq": False, **with_defaults(SPANS_CASES[name])}
    monkeypatch.setattr(configs, "SM90_GLUON_FWD", [])
    monkeypatch.setattr(configs, "PERSISTENT_BALANCE", float("inf"))
    monkeypatch.setattr(_launch, "compute_units", lambda target: 3)
    ds = {} if c["ds"] is None else {"DS": c["ds"]}
    rows = [dict(r, min_seq=0, SPANS=True, **ds) for r in configs.SM90_GLUON_DKDV]
    monkeypatch.setattr(configs, "SM90_GLUON_DKDV", [dict(r, PERSISTENT=1) for r in rows] * persistent + rows)
    launches = []
    real = _launch._launch

    def record(kernel, *args, **kw):
        launch = real(kernel, *args, **kw)
        if kernel.__name__ == "attn_bwd_dkdv_sm90":
            launches.append((launch.grid, launch.constexprs))
        return launch

    monkeypatch.setattr(_launch, "_launch", record)
    run_case(c, seed=41)
    assert launches and all(one["SPANS"] for _, one in launches), launches
    block_m = next(r["BLOCK_M"] for r in rows if r["head_dim"] == c["d"])
    whole = c["sq"] % block_m == 0 and c["sk"] % 128 == 0
    assert all((grid == (3, 1)) == (persistent and whole) for grid, _ in launches), launches
