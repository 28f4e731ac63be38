"""Every Hopper (sm90) config row (forward, dK/dV, dQ) that moves tiles through TMA descriptors, shipped
or a tuning candidate, run on the GPU against float64 (ragged and whole blocks, two batch elements, the
variants that take the path): some TMA / warp-specialised tiles of Triton 3.6 compute NaN or hang, so none
may ship unchecked (GPU only). In Triton's interpreter (CPU): the TMA code path itself, at interpreter-sized
tiles, against float64. Which calls take which rows: test_plan.py. The Gluon kernels that sm90 calls take in
their place are off here (the policy TRITON; test_gluon_fwd.py, test_gluon_bwd.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl

import oracle
import os
import subprocess
import sys

from helpers import ON_GPU, assert_close, fwd_bwd_through, inputs, run as run_impl
from jax_flash_amd import _launch, _triton, plan, reference
from jax_flash_amd.operands import Operands
from jax_flash_amd.kernels import configs
from jax_flash_amd.kernels.configs import Row
from jax_flash_amd.kernels.masking import persistent_rounds, persistent_tile, tile_order
from jax_flash_amd.rules import Band

KERNELS = ("fwd", "dkdv", "dq", "dqds")


# the Triton rows, where a compiled sm90 call would take the Gluon forward or dK/dV (processes these tests start take
# the shipped kernels, Gluon's included)
TRITON = plan.Policy().replace(gluon_fwd=(), gluon_fwd_fp8=(), gluon_dkdv=())
NEVER, ALWAYS = dict(edges_apart_blocks=1 << 30, ds_edges_apart_blocks=1 << 30), dict(edges_apart_blocks=1,
                                                                                     ds_edges_apart_blocks=1)


def with_(row: Row, **change) -> Row:
    """The row changed (and named for it)."""
    return row.but(row.name + "+" + ",".join(f"{k}={v}" for k, v in change.items()), **change)


ROWS = []  # (kernel, row): the TMA rows, and the dS path's dQ rows (TMA descriptors too)
for _kernel in KERNELS:
    for _row in configs.TARGETS["sm90"][_kernel] + configs.CANDIDATES["sm90"].get(_kernel, ()):
        if (_row.tma or _kernel == "dqds") and (_kernel, _row) not in ROWS:
            ROWS.append((_kernel, _row))


def _id(kernel_row):
    kernel, row = kernel_row
    return (f"{kernel}-d{row.max_width}-{row.block_m}x{row.block_n}-w{row.num_warps}-s{row.num_stages}"
            + ("-ws" if row.warp_specialize else "") + ("-ds" if row.ds else ""))


# window: both sides bound (the "+window" rows take the TMA rows too), narrower than a block; dropout: D 128 rows
# (D 64 dropout keeps its pointer rows: configs.py "fwd+dropout")
VARIANTS = {"plain": {}, "softcap": dict(softcap=20.0), "alibi": {}, "gqa": {}, "window": dict(window=(37, 5)),
            "dropout": dict(dropout=0.2)}


@pytest.mark.parametrize("kernel_row", ROWS, ids=_id)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
# 256: the unmasked loops (KEYS_EVEN, QUERIES_EVEN)
@pytest.mark.parametrize("seq", [300, 256], ids=["ragged", "whole"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_every_sm90_row(kernel_row, dtype, causal, seq, variant):
    """The row runs its kernel (the others their defaults) in a forward and a backward against float64;
    a dK/dV row marked DS runs the dS path, the dQ rows the seven-product one (that is where they serve)."""
    _check_row(kernel_row, dtype, causal, seq, variant, TRITON)


EDGE_ROWS = [(kernel, with_(row, persistent=0) if kernel == "fwd" else row) for kernel, row in ROWS
             if kernel in ("fwd", "dkdv")]


@pytest.mark.parametrize("kernel_row", EDGE_ROWS, ids=_id)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq", [300, 256], ids=["ragged", "whole"])
@pytest.mark.parametrize("variant", ["plain", "alibi", "gqa", "window"])
@pytest.mark.parametrize("path", ["seven", "ds"])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_every_sm90_row_edges_apart(kernel_row, causal, seq, variant, path):
    """test_every_sm90_row with the band's edge blocks in a launch of their own wherever a loop would mask
    (kernels/fwd.py, bwd.py EDGES; the forward rows tiled, dK/dV on seven products and, rows marked DS, on the
    dS path, whose edge launch stores its dS tiles too)."""
    if path == "ds" and not kernel_row[1].ds:
        pytest.skip("the dS path: dK/dV rows marked DS")
    policy = TRITON.replace(**ALWAYS, **(dict(ds_workspace_bytes=0) if path == "seven" else {}))
    _check_row(kernel_row, jnp.bfloat16, causal, seq, variant, policy, edges=True)


def _check_row(kernel_row, dtype, causal, seq, variant, policy, edges=False):
    if _triton.target() != "sm90":
        pytest.skip("needs a Hopper GPU")
    if kernel_row[0] == "dq":
        policy = policy.replace(ds_workspace_bytes=0)
    if variant != "plain" and (dtype != jnp.bfloat16 or seq != 300):
        pytest.skip("variants: bf16, ragged")
    kernel, row = kernel_row
    p = VARIANTS[variant].get("dropout", 0.0)
    if p and row.max_width <= 64:
        pytest.skip("dropout at D 64: the pointer rows")
    takes_ds = kernel == "dqds" or (kernel == "dkdv" and row.ds)
    if takes_ds:
        if variant == "softcap":
            pytest.skip("softcap takes dK/dV's pointer row: seven products")
        # narrow windows take the dS path anyway; not narrow, the window variant runs the plain dQ row (128 x 128)
        policy = policy.replace(narrow_window=0)
    d = row.max_width
    b, h = 2, 4
    h_kv = 2 if variant == "gqa" else h
    q, k, v, dout, dlse = inputs((b, seq, h, d), (b, seq, h_kv, d), dtype, seed=d + seq)
    softcap = VARIANTS[variant].get("softcap", 0.0)
    window = VARIANTS[variant].get("window", (-1, -1))
    slopes = (jax.random.uniform(jax.random.key(1), (b, h), jnp.float32, 0.01, 0.5) if variant == "alibi"
              else None)
    statics = _launch.Statics(d ** -0.5, Band.of(causal, window, seq, seq), softcap=softcap, dropout_p=p)
    rng = jax.random.key(4)
    seeds = reference.dropout_seeds(rng, b, h) if p else None
    extras = Operands(slopes=slopes, seeds=seeds)
    target = _triton.target()
    launched = []

    def run(launch):
        launched.append(launch.kernel.__name__)
        return _triton.run(launch)

    got = jax.jit(fwd_bwd_through(run, target, statics, rows={kernel: row}, policy=policy))(q, k, v, dout, dlse,
                                                                                          extras)
    if kernel in ("dkdv", "dqds"):  # the path the row serves ran
        assert ("attn_bwd_dq_ds" in launched) == bool(takes_ds and policy.limits.ds_workspace_bytes), launched
    if edges:  # and the edges' launch (a band, or ragged blocks)
        name = {"fwd": "attn_fwd", "dkdv": "attn_bwd_dkdv"}[kernel]
        assert launched.count(name) == 1 + (causal or variant == "window" or seq % 128 > 0), launched
    drop = dict(dropout_p=p, keep=reference.dropout_keep(seeds, seq, seq, p)) if p else {}
    ref = oracle.attention(q, k, v, dout, dlse, causal=causal, window=window, softcap=softcap, alibi=slopes, **drop)
    for name, x in got.items():
        assert np.isfinite(np.asarray(x, np.float32)[np.isfinite(ref[name])]).all(), name
    base = run_impl("xla", q, k, v, dout, dlse, causal=causal, window_size=window, softcap=softcap,
                    alibi_slopes=slopes, **(dict(dropout_p=p, dropout_rng=rng) if p else {}))
    assert_close(got, ref, base, dtype)


# the TMA path at interpreter-sized tiles: ragged and whole blocks, a batch element's last block next to
# the following element's rows, cross attention (bottom-right causal), windows and every variant it takes
TMA_INTERPRET_ROW = Row("test/tma", 16, 16, tma=True, warp_specialize=True)
TMA_INTERPRET_ROWS = {"fwd": TMA_INTERPRET_ROW, "dq": with_(TMA_INTERPRET_ROW, block_m=32),
                      "dkdv": with_(TMA_INTERPRET_ROW, block_n=32)}
# the dS path (dK/dV stores dS^T, attn_bwd_dq_ds reads it; the interpreter NaN-poisons what no kernel writes,
# so a tile read unmasked that dK/dV skipped shows)
# dQ's query tiles twice dK/dV's (as on the GPU: 128 against 64), so one dQ tile spans written and skipped ones
DS_INTERPRET_ROWS = {**TMA_INTERPRET_ROWS, "dkdv": with_(TMA_INTERPRET_ROW, block_n=32, ds=True),
                     "dqds": Row("test/dqds", 32, 16)}
# (dK/dV takes its TMA path where seq_q is a multiple of 4: plan.dkdv_takes_tma; "cross-causal" and
# "ragged-odd" run its pointer path after the TMA forward and dQ)
TMA_CASES = {
    "ragged": dict(sq=44, sk=44), "ragged-odd": dict(sq=45, sk=45), "whole": dict(sq=64, sk=64),
    "whole-causal": dict(sq=64, sk=64, causal=True), "cross-causal": dict(sq=37, sk=53, causal=True),
    # more queries than keys, causal (bottom-right): the first 16 rows see no key
    "cross-causal-rows-empty": dict(sq=52, sk=36, causal=True),
    "cross": dict(sq=36, sk=52), "window": dict(sq=44, sk=44, window=(9, 4)),
    "left-window": dict(sq=44, sk=44, window=(7, -1)), "softcap": dict(sq=44, sk=44, causal=True, softcap=5.0),
    "alibi": dict(sq=44, sk=44, alibi=True), "gqa": dict(sq=44, sk=44, causal=True, h_kv=1),
    "gqa-alibi": dict(sq=44, sk=44, alibi=True, h_kv=1),
    # two groups of two query heads: the dS path by key/value heads slices both (and ALiBi's slopes)
    "gqa-groups": dict(sq=44, sk=44, causal=True, alibi=True, h=4, h_kv=2),
}


@pytest.mark.matrix
@pytest.mark.parametrize("path", ["seven", "edges", "ds", "ds-edges", "ds-by-heads", "ds-edges-by-heads"])
@pytest.mark.parametrize("case", list(TMA_CASES))
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_tma_path_in_the_interpreter(case, dtype, path):
    """"edges", "ds-edges" (and "ds-edges-by-heads"): every call whose TMA loop would mask takes the edge launches
    (kernels/fwd.py, bwd.py EDGES), on the seven-product path or the dS path (one launch per key/value head)."""
    from jax_flash_amd import _interpret
    _interpret.check_available()  # what the public API does first (it also mends the interpreter's bf16)
    c = {**dict(causal=False, window=(-1, -1), softcap=0.0, alibi=False, h=2, h_kv=2), **TMA_CASES[case]}
    b, h, d = 3, c["h"], 32
    takes_tma = c["sq"] % 4 == 0 and not c["softcap"]  # plan.dkdv_takes_tma; else the seven products
    if path not in ("seven", "edges") and (dtype != jnp.float16 or not takes_tma):
        pytest.skip("the dS path: float16 (bfloat16 takes the same code), calls that take dK/dV's TMA row")
    rows = TMA_INTERPRET_ROWS if path in ("seven", "edges") else DS_INTERPRET_ROWS
    edges = "edges" in path
    policy = TRITON.replace(**(ALWAYS if edges else NEVER))
    if path != "seven":  # windows take the dS path too (the rule: test_plan.py)
        policy = policy.replace(narrow_window=0)
    if path.endswith("by-heads"):  # room for one key/value head's workspace: a launch per head
        if c["h_kv"] == 1:
            pytest.skip("one key/value head")
        policy = policy.replace(**_one_kv_head_per_launch(b, h // c["h_kv"], c["sq"], c["sk"],
                                                          DS_INTERPRET_ROWS["dkdv"].block_n,
                                                          Band.of(c["causal"], c["window"], c["sq"], c["sk"])))
    q, k, v, dout, dlse = inputs((b, c["sq"], h, d), (b, c["sk"], c["h_kv"], d), dtype, seed=7)
    slopes = jnp.asarray([[0.3, 0.1, 0.05, 0.2][:h]] * b, jnp.float32) if c["alibi"] else None
    statics = _launch.Statics(d ** -0.5, Band.of(c["causal"], c["window"], c["sq"], c["sk"]), softcap=c["softcap"])
    extras = Operands(slopes=slopes)
    launched = []

    def run(launch):
        launched.append(launch.kernel.__name__ + ("+edges" if launch.constexprs.get("EDGES") == 2 else ""))
        return _interpret.run(launch)

    out, lse2 = _launch.forward(run, "interpret", q, k, v, extras, statics=statics, rows=rows, policy=policy)
    dq, dk, dv = _launch.backward(run, "interpret", q, k, v, out, lse2, dout, dlse, extras, statics=statics,
                                  rows=rows, policy=policy)
    expected = {"seven": 0, "edges": 0, "ds": 1, "ds-edges": 1, "ds-by-heads": 2, "ds-edges-by-heads": 2}[path]
    assert launched.count("attn_bwd_dq_ds") == expected, launched
    # the edges apart where a TMA loop would mask a block: a band, or a ragged block (fwd: keys of 16; dK/dV:
    # queries of 16, keys of 32, and only where it takes its TMA row)
    banded = c["causal"] or c["window"] != (-1, -1)
    fwd_edges = edges and (banded or c["sk"] % 16 > 0)
    dkdv_edges = edges and takes_tma and (banded or c["sq"] % 16 > 0 or c["sk"] % 32 > 0)
    assert ("attn_fwd+edges" in launched) == fwd_edges, launched
    assert ("attn_bwd_dkdv+edges" in launched) == dkdv_edges, launched
    kw = dict(causal=c["causal"], softcap=c["softcap"])
    ref = oracle.attention(q, k, v, dout, dlse, window=c["window"], alibi=slopes, **kw)
    base = run_impl("xla", q, k, v, dout, dlse, window_size=c["window"], alibi_slopes=slopes, **kw)
    assert_close(dict(out=out, lse=lse2 * np.log(2), dq=dq, dk=dk, dv=dv), ref, base, dtype)


# grouped heads on the dS path with dK/dV per query head (Policy.dkdv_per_query_head): K and V repeated, each group's
# parts summed; with ALiBi and a window, by launches of heads (here of one query head), with dropout
PER_QUERY_HEAD_CASES = {"gqa-causal": dict(sq=44, sk=44, h_kv=2), "mqa-alibi-window": dict(window=(9, 4), alibi=True),
                        "by-heads": dict(h_kv=2, launches=4), "dropout": dict(h_kv=2, dropout=0.2)}


@pytest.mark.matrix
@pytest.mark.parametrize("case", list(PER_QUERY_HEAD_CASES))
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_dkdv_per_query_head_in_the_interpreter(case):
    """Against float64, dK/dV's launches counted and run per query head (KV_H the query heads)."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    c = {**dict(sq=44, sk=44, h=4, h_kv=1, window=(-1, -1), alibi=False, dropout=0.0, launches=1),
         **PER_QUERY_HEAD_CASES[case]}
    b, d, dtype, h = 2, 32, jnp.float16, c["h"]
    causal = c["window"] == (-1, -1)
    band = Band.of(causal, c["window"], c["sq"], c["sk"])
    policy = TRITON.replace(**NEVER, dkdv_per_query_head=True, narrow_window=0)
    if case == "by-heads":
        policy = policy.replace(**_one_kv_head_per_launch(b, 1, c["sq"], c["sk"], 32, band))
    q, k, v, dout, dlse = inputs((b, c["sq"], h, d), (b, c["sk"], c["h_kv"], d), dtype, seed=13)
    slopes = jnp.asarray([[0.3, 0.1, 0.05, 0.2]] * b, jnp.float32) if c["alibi"] else None
    p, rng = c["dropout"], jax.random.key(3)
    seeds = reference.dropout_seeds(rng, b, h) if p else None
    statics = _launch.Statics(d ** -0.5, band, dropout_p=p)
    launched = []

    def run(launch):
        launched.append((launch.kernel.__name__, launch.constexprs.get("KV_H")))
        return _interpret.run(launch)

    extras = Operands(slopes=slopes, seeds=seeds)
    out, lse2 = _launch.forward(run, "interpret", q, k, v, extras, statics=statics, rows=DS_INTERPRET_ROWS,
                                policy=policy)
    dq, dk, dv = _launch.backward(run, "interpret", q, k, v, out, lse2, dout, dlse, extras, statics=statics,
                                  rows=DS_INTERPRET_ROWS, policy=policy)
    per_launch = h // c["launches"]
    assert [x for x in launched if x[0] != "attn_fwd"] == [("attn_bwd_dkdv", per_launch),
                                                          ("attn_bwd_dq_ds", per_launch)] * c["launches"], launched
    drop = dict(dropout_p=p, keep=reference.dropout_keep(seeds, c["sq"], c["sk"], p)) if p else {}
    ref = oracle.attention(q, k, v, dout, dlse, causal=causal, window=c["window"], alibi=slopes, **drop)
    base = run_impl("xla", q, k, v, dout, dlse, causal=causal, window_size=c["window"], alibi_slopes=slopes,
                    **(dict(dropout_p=p, dropout_rng=rng) if p else {}))
    assert_close(dict(out=out, lse=lse2 * np.log(2), dq=dq, dk=dk, dv=dv), ref, base, dtype)


def _one_kv_head_per_launch(b, group, sq, sk, block_n, band) -> dict:
    """The dS path's workspace budget of one key/value head (group query heads): a launch per head."""
    ws_rows, ws_cols = plan.ds_workspace(plan.Call("interpret", b, sq, sk, group, 1, 32, band=band), block_n)
    return dict(ds_workspace_bytes=ws_rows * ws_cols * 2)


# a window's dS workspace banded (plan.ds_banded: a key's row holds the queries from the first 128-aligned block
# that sees its group of 128 keys, kernels/bwd.py ds_col), so these calls are longer than the band's 255 + width
# columns: windows either side, cross lengths (the band moved by seq_k - seq_q), grouped heads, a block of a larger
# call (Operands.positions shifts the band per batch element), and the edge launch storing dS too
BANDED_CASES = {"window": dict(sq=300, sk=300, window=(20, 7)), "cross": dict(sq=300, sk=347, window=(30, 0)),
                "gqa": dict(sq=300, sk=300, window=(12, 12), h_kv=1),
                "left-only-edges": dict(sq=300, sk=300, window=(9, 0)),
                "block": dict(sq=320, sk=320, window=(40, 3), positions=(64, 32, 24)),
                # more queries than keys (hi_off < 0), and a block whose larger call has fewer keys than queries
                "q-longer": dict(sq=340, sk=300, window=(30, 5)),
                "block-short-keys": dict(sq=320, sk=300, window=(40, 3), positions=(16, 40, -24)),
                # dQ on 128 x 128 tiles (sm90's plain dQ row, what wide windows take), over 32-key dK/dV blocks
                "dq-128": dict(sq=300, sk=300, window=(20, 7), dqds=dict(block_m=128, block_n=128))}


@pytest.mark.matrix
@pytest.mark.parametrize("case", list(BANDED_CASES))
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_banded_ds_workspace_in_the_interpreter(case):
    """The dS path with the banded workspace equals float64 attention (the interpreter NaN-poisons what no kernel
    writes, so a tile dQ reads that dK/dV did not write, or wrote elsewhere, shows)."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    c = {**dict(h=2, h_kv=2, positions=None), **BANDED_CASES[case]}
    sq, sk, h = c["sq"], c["sk"], c["h"]
    # the interpreter's "+window" rows have no DS
    policy = TRITON.replace(narrow_window=0, **(ALWAYS if "edges" in case else NEVER))
    q, k, v, dout, dlse = inputs((1, sq, h, 32), (1, sk, c["h_kv"], 32), jnp.float16, seed=11)
    if c["positions"]:  # the larger call: queries from 64, keys from 32, its length 24 keys longer than its queries
        q0, k0, diff = c["positions"]
        band = Band.of(False, c["window"], q0 + sq + 40, q0 + sq + 40 + diff)
        extras = Operands(positions=jnp.array([[q0, k0, diff]], jnp.int32))
    else:
        band, extras = Band.of(False, c["window"], sq, sk), Operands()
    statics = _launch.Statics(32 ** -0.5, band)
    launches = []

    def run(launch):
        launches.append(launch)
        return _interpret.run(launch)

    rows = {**DS_INTERPRET_ROWS, "dqds": with_(DS_INTERPRET_ROWS["dqds"], **c.get("dqds", {}))}
    out, lse2 = _launch.forward(run, "interpret", q, k, v, extras, statics=statics, policy=policy)
    dq, dk, dv = _launch.backward(run, "interpret", q, k, v, out, lse2, dout, dlse, extras, statics=statics,
                                  rows=rows, policy=policy)
    ds = [x for x in launches if x.kernel.__name__ in ("attn_bwd_dkdv", "attn_bwd_dq_ds")]
    assert [x.kernel.__name__ for x in ds] == (["attn_bwd_dkdv"] * (1 + ("edges" in case)) + ["attn_bwd_dq_ds"])
    assert all(x.constexprs.get("DS_BAND") for x in ds), [x.constexprs for x in ds]
    cols = ds[0].out_shapes[2].shape[1]
    assert cols == -(-(255 + sum(c["window"])) // 8) * 8 < sq, ds[0].out_shapes
    if c["positions"]:  # against the pointer kernels (tests/test_positions.py checks those against the larger call)
        want = _launch.backward(_interpret.run, "interpret", q, k, v, out, lse2, dout, dlse, extras, statics=statics,
                                policy=policy)
        for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), atol=2e-3, err_msg=name)
        return
    ref = oracle.attention(q, k, v, dout, dlse, window=c["window"])
    base = run_impl("xla", q, k, v, dout, dlse, window_size=c["window"])
    assert_close(dict(out=out, lse=lse2 * np.log(2), dq=dq, dk=dk, dv=dv), ref, base, jnp.float16)


@pytest.mark.parametrize("case", ["window", "two-sided", "cross", "gqa-alibi", "whole"])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_banded_ds_workspace(case):
    """The shipped rows on the banded dS path (windows: test_banded_ds_workspace_in_the_interpreter) against
    float64, at lengths past the band's 255 + width columns: ragged and whole blocks, cross lengths, grouped heads."""
    c = {**dict(sq=1000, sk=1000, window=(300, 0), h_kv=4, alibi=False),
         **{"two-sided": dict(window=(100, 37)), "cross": dict(sq=900, sk=1100, window=(200, 0)),
            "gqa-alibi": dict(h_kv=2, alibi=True), "whole": dict(sq=1024, sk=1024, window=(128, 128))}.get(case, {})}
    b, h, d = 2, 4, 128
    q, k, v, dout, dlse = inputs((b, c["sq"], h, d), (b, c["sk"], c["h_kv"], d), jnp.bfloat16, seed=21)
    slopes = jax.random.uniform(jax.random.key(2), (b, h), jnp.float32, 0.01, 0.5) if c["alibi"] else None
    statics = _launch.Statics(d ** -0.5, Band.of(False, c["window"], c["sq"], c["sk"]))
    target = _triton.target()
    launches = []

    def run(launch):
        launches.append((launch.kernel.__name__, launch.constexprs.get("DS_BAND")))
        return _triton.run(launch)

    got = jax.jit(fwd_bwd_through(run, target, statics, policy=TRITON))(q, k, v, dout, dlse, Operands(slopes=slopes))
    assert {("attn_bwd_dkdv", True), ("attn_bwd_dq_ds", True)} <= set(launches), launches
    ref = oracle.attention(q, k, v, dout, dlse, window=c["window"], alibi=slopes)
    base = run_impl("xla", q, k, v, dout, dlse, window_size=c["window"], alibi_slopes=slopes)
    assert_close(got, ref, base, jnp.bfloat16)


# dropout on the dS path (sm90's dropout rows: the TMA row, or for calls that cannot take it the pointer row, dS^T
# stored through a descriptor): its keep mask drawn once, by dK/dV, and dQ from dS; the interpreter's pointer rows,
# dQ's query tiles twice dK/dV's (so that one spans written and skipped tiles, as on the GPU)
DROPOUT_DS_ROWS = {"dkdv": Row("test/dkdv-ds", 32, 32, ds=True), "dqds": with_(DS_INTERPRET_ROWS["dqds"], block_m=64)}
DROPOUT_DS_CASES = {
    "full-ragged": dict(sq=44, sk=44), "causal-whole": dict(sq=64, sk=64, causal=True),
    "cross-causal": dict(sq=37, sk=53, causal=True), "window": dict(sq=44, sk=44, window=(9, 4)),
    "softcap-alibi": dict(sq=44, sk=44, causal=True, softcap=5.0, alibi=True),
    "gqa-by-heads": dict(sq=44, sk=44, causal=True, h=4, h_kv=2, by_heads=True),
}


# the same through the TMA rows (forward and dK/dV warp-specialised on the GPU; the hash draw has no layout of its
# own, so those loops take it): for the calls whose dK/dV takes its TMA row (plan.dkdv_takes_tma)
DROPOUT_TMA_ROWS = {"fwd": TMA_INTERPRET_ROW, "dkdv": with_(TMA_INTERPRET_ROW, block_n=32, ds=True),
                    "dqds": DROPOUT_DS_ROWS["dqds"]}


@pytest.mark.matrix
@pytest.mark.parametrize("rows", ["pointer", "tma"])
@pytest.mark.parametrize("case", list(DROPOUT_DS_CASES))
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_dropout_on_the_ds_path_in_the_interpreter(case, rows):
    """The keep mask of dK/dV's dS tiles is the forward's (float64 oracle with reference.dropout_keep), and dQ
    comes from those tiles alone (no dQ kernel draws one)."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    c = DROPOUT_DS_CASES[case]
    if rows == "tma" and (c["sq"] % 4 or c.get("softcap")):
        pytest.skip("dK/dV takes its pointer row (plan.dkdv_takes_tma)")
    _dropout_on_the_ds_path(case, "interpret", _interpret.run, DROPOUT_TMA_ROWS if rows == "tma" else DROPOUT_DS_ROWS,
                            32, 1, jnp.float16, tma=rows == "tma")


# dropout on seven products: dQ and dK/dV each draw the mask, their tiles leave keep_scale out and each output block
# takes it once (kernels/bwd.py kept_scaled): the TMA rows tiled and persistent (descriptors over the whole batch),
# and SPLIT's pointer rows (dV and dK from separate programs)
SEVEN_DROPOUT_ROWS = {
    "tma": TMA_INTERPRET_ROWS,
    "tma-persistent": {**TMA_INTERPRET_ROWS, "dkdv": with_(TMA_INTERPRET_ROWS["dkdv"], persistent=1)},
    "split": {"dkdv": Row("test/split", 16, 32, split=True)},
}
SEVEN_DROPOUT_CASES = {"causal": dict(causal=True, h_kv=2, alibi=False), "gqa-alibi": dict(causal=False, h_kv=1,
                                                                                            alibi=True)}


@pytest.mark.matrix
@pytest.mark.parametrize("rows", list(SEVEN_DROPOUT_ROWS))
@pytest.mark.parametrize("case", list(SEVEN_DROPOUT_CASES))
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_dropout_on_seven_products_in_the_interpreter(case, rows):
    """Against float64 with the kernels' keep mask (reference.dropout_keep); the launches are the rows' (dQ drawing
    its own mask, dK/dV persistent or SPLIT where the row says)."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    c = SEVEN_DROPOUT_CASES[case]
    b, s, h, d, p = 2, 64, 2, 32, 0.25
    # persistent whatever the schedule, 3 programs for 4 or 8 tiles
    policy = TRITON.replace(persistent_balance=float("inf"), compute_units=3)
    q, k, v, dout, dlse = inputs((b, s, h, d), (b, s, c["h_kv"], d), jnp.float16, seed=13)
    rng = jax.random.key(2)
    seeds = reference.dropout_seeds(rng, b, h)
    slopes = jnp.asarray([[0.3, 0.1]] * b, jnp.float32) if c["alibi"] else None
    statics = _launch.Statics(d ** -0.5, Band.of(c["causal"], (-1, -1), s, s), dropout_p=p)
    launched, dkdv = [], []

    def run(launch):
        launched.append(launch.kernel.__name__)
        if launch.kernel.__name__ == "attn_bwd_dkdv":
            dkdv.append((launch.grid, launch.constexprs["PERSISTENT"], bool(launch.constexprs.get("TMA"))))
        return _interpret.run(launch)

    got = fwd_bwd_through(run, "interpret", statics, SEVEN_DROPOUT_ROWS[rows], policy)(
        q, k, v, dout, dlse, Operands(slopes=slopes, seeds=seeds))
    assert "attn_bwd_dq" in launched and "attn_bwd_dq_ds" not in launched, launched
    ((grid, persistent, tma),) = dkdv
    assert (persistent, tma, grid[2] == 2) == (rows == "tma-persistent", rows != "split", rows == "split"), dkdv
    kw = dict(causal=c["causal"])
    ref = oracle.attention(q, k, v, dout, dlse, alibi=slopes, dropout_p=p, keep=reference.dropout_keep(seeds, s, s, p),
                           **kw)
    base = run_impl("xla", q, k, v, dout, dlse, alibi_slopes=slopes, dropout_p=p, dropout_rng=rng, **kw)
    assert_close(got, ref, base, jnp.float16)


@pytest.mark.parametrize("case", list(DROPOUT_DS_CASES))
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_dropout_on_the_ds_path(case, dtype):
    """The same with sm90's shipped dropout rows, D 128, the lengths 7 times the interpreter's."""
    if _triton.target() != "sm90":
        pytest.skip("needs a Hopper GPU")
    _dropout_on_the_ds_path(case, "sm90", _triton.run, None, 128, 7, dtype)


def _dropout_on_the_ds_path(case, target, run_launch, rows, d, f, dtype, tma=None):
    """tma: whether the forward and dK/dV launches must (True) or must not (False) have run their TMA rows."""
    c = {**dict(causal=False, window=(-1, -1), softcap=0.0, alibi=False, h=2, h_kv=2, by_heads=False),
         **DROPOUT_DS_CASES[case]}
    b, h, p, sq, sk = 2, c["h"], 0.25, c["sq"] * f, c["sk"] * f
    window = tuple(w * f if w > 0 else w for w in c["window"])
    policy = TRITON.replace(narrow_window=0)  # the window too
    q, k, v, dout, dlse = inputs((b, sq, h, d), (b, sk, c["h_kv"], d), dtype, seed=3)
    rng = jax.random.key(5)
    seeds = reference.dropout_seeds(rng, b, h)
    slopes = jnp.asarray([[0.3, 0.1, 0.05, 0.2][:h]] * b, jnp.float32) if c["alibi"] else None
    statics = _launch.Statics(d ** -0.5, Band.of(c["causal"], window, sq, sk), softcap=c["softcap"], dropout_p=p)
    if c["by_heads"]:  # room for one key/value head's workspace (of the dK/dV row the call takes): a launch per head
        block_n = plan.dkdv_row(_launch.call_of(target, q, k, Operands(seeds=seeds), statics, rows, policy)).block_n
        policy = policy.replace(**_one_kv_head_per_launch(b, h // c["h_kv"], sq, sk, block_n,
                                                          Band.of(c["causal"], window, sq, sk)))
    launched = []

    tma_runs = set()

    def run(launch):
        launched.append(launch.kernel.__name__)
        tma_runs.add((launch.kernel.__name__, bool(launch.constexprs.get("TMA"))))
        return run_launch(launch)

    fwd_bwd = fwd_bwd_through(run, target, statics, rows, policy)
    got = (fwd_bwd if target == "interpret" else jax.jit(fwd_bwd))(q, k, v, dout, dlse,
                                                                  Operands(slopes=slopes, seeds=seeds))
    assert launched.count("attn_bwd_dq_ds") == (c["h_kv"] if c["by_heads"] else 1), launched
    assert "attn_bwd_dq" not in launched, launched
    if tma is not None:
        assert {("attn_fwd", tma), ("attn_bwd_dkdv", tma)} <= tma_runs, tma_runs
    kw = dict(causal=c["causal"], softcap=c["softcap"])
    ref = oracle.attention(q, k, v, dout, dlse, window=window, alibi=slopes, dropout_p=p,
                           keep=reference.dropout_keep(seeds, sq, sk, p), **kw)
    base = run_impl("xla", q, k, v, dout, dlse, window_size=window, alibi_slopes=slopes, dropout_p=p,
                    dropout_rng=rng, **kw)
    assert_close(got, ref, base, dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_dropout_at_d64(causal):
    """D 64 with dropout, a shape whose plain forward runs the persistent TMA row: with dropout the pointer rows
    (configs.py "fwd+dropout": that row was slower with the hash), against float64 with the kernels' keep mask."""
    if _triton.target() != "sm90":
        pytest.skip("needs a Hopper GPU")
    b, sq, h, d, p = 2, 1024, 32, 64, 0.2
    q, k, v, dout, dlse = inputs((b, sq, h, d), (b, sq, h, d), jnp.bfloat16, seed=11)
    rng = jax.random.key(9)
    seeds = reference.dropout_seeds(rng, b, h)
    statics = _launch.Statics(d ** -0.5, Band.of(causal, (-1, -1), sq, sq), dropout_p=p)
    launches = []

    def run(launch):
        launches.append(launch.constexprs)
        return _triton.run(launch)

    got = jax.jit(fwd_bwd_through(run, "sm90", statics, policy=TRITON))(q, k, v, dout, dlse, Operands(seeds=seeds))
    assert not launches[0].get("TMA"), launches[0]
    ref = oracle.attention(q, k, v, dout, dlse, causal=causal, dropout_p=p,
                           keep=reference.dropout_keep(seeds, sq, sq, p))
    base = run_impl("xla", q, k, v, dout, dlse, causal=causal, dropout_p=p, dropout_rng=rng)
    assert_close(got, ref, base, jnp.bfloat16)


def test_operands_of_a_group_of_heads():
    """Operands.heads: query-head fields by the group's query heads, key/value-head fields by its own."""
    b, h, g = 2, 3, 2
    slopes = jnp.arange(b * h * g, dtype=jnp.float32).reshape(b, h * g)
    descale = jnp.arange(b * h, dtype=jnp.float32).reshape(b, h)
    pos = jnp.ones((b, 3), jnp.int32)
    part = Operands(slopes=slopes, k_descale=descale, positions=pos).heads(1, 3, g)
    np.testing.assert_array_equal(part.slopes, slopes[:, 2:6])
    np.testing.assert_array_equal(part.k_descale, descale[:, 1:3])
    np.testing.assert_array_equal(part.positions, pos)
    assert part.seeds is None


@pytest.mark.matrix
@pytest.mark.parametrize("case", ["causal-window-alibi", "gqa-causal"])
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_tma_path_as_a_block_of_a_larger_call(case):
    """With Operands.positions (a ring-attention step: tests/test_positions.py checks the pointer path
    against the larger call), the TMA forward and backward equal the pointer kernels: in one loop, with the
    band's edge blocks apart (kernels/fwd.py, bwd.py EDGES), and on the dS path."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    sq, sk, h = 24, 40, 2
    h_kv = 1 if "gqa" in case else h
    q, k, v, dout, dlse = inputs((1, sq, h, 32), (1, sk, h_kv, 32), jnp.float16, seed=3)
    band = Band.of(True, (20, 0) if "window" in case else (-1, -1), 80, 96)  # the larger call's band
    extras = Operands(positions=jnp.array([[32, 16, 96 - 80]], jnp.int32),
                      slopes=jnp.array([[0.2, 0.45]], jnp.float32) if "alibi" in case else None)
    statics = _launch.Statics(0.3, band)

    edge_launches = []

    def run(launch):
        if launch.constexprs.get("EDGES") == 2:
            edge_launches.append(launch.kernel.__name__)
        return _interpret.run(launch)

    def grads(rows, edges=NEVER):
        policy = TRITON.replace(**edges)
        out, lse2 = _launch.forward(run, "interpret", q, k, v, extras, statics=statics, rows=rows, policy=policy)
        return (out, lse2, *_launch.backward(run, "interpret", q, k, v, out, lse2, dout, dlse, extras,
                                             statics=statics, rows=rows, policy=policy))

    want_all = grads(None)
    one_loop = grads(TMA_INTERPRET_ROWS)
    assert not edge_launches
    apart = grads(TMA_INTERPRET_ROWS, ALWAYS)
    assert edge_launches == ["attn_fwd", "attn_bwd_dkdv"]
    ds_apart = grads(DS_INTERPRET_ROWS, ALWAYS)[2:]  # the dS path, its edge launch storing dS too
    assert edge_launches[2:] == ["attn_fwd", "attn_bwd_dkdv"]
    for name, got, want in [*zip(("out", "lse", "dq", "dk", "dv"), one_loop, want_all),
                            *zip(("edges: out", "edges: lse", "edges: dq", "edges: dk", "edges: dv"), apart, want_all),
                            *zip(("ds: dq", "ds: dk", "ds: dv"), grads(DS_INTERPRET_ROWS)[2:], want_all[2:]),
                            *zip(("ds edges: dq", "ds edges: dk", "ds edges: dv"), ds_apart, want_all[2:])]:
        g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=name)
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin], w[fin], atol=2e-3 * max(1.0, np.abs(w[fin]).max()), err_msg=name)


# ----- the persistent forward (kernels/fwd.py PERSISTENT): tiles handed out by masking.persistent_tile -----
@triton.jit
def _tile_order(n_blocks, rows, Tiles, ROUNDS: tl.constexpr):
    """Tiles (programs, ROUNDS, 2): the (query block, row) each program runs in each of its rounds."""
    p = tl.program_id(0)
    for r in range(0, persistent_rounds(n_blocks * rows)):
        block, row = persistent_tile(r, n_blocks, rows)
        tl.store(Tiles + (p * ROUNDS + r) * 2, block.to(tl.float32))
        tl.store(Tiles + (p * ROUNDS + r) * 2 + 1, row.to(tl.float32))


@pytest.mark.parametrize("programs, n_blocks, rows", [(3, 4, 6), (4, 5, 6), (7, 3, 5), (5, 2, 2), (2, 8, 3), (1, 3, 2)])
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_persistent_tiles_cover_every_tile_once(programs, n_blocks, rows):
    """Every (query block, row) exactly once, handed out in rounds of one tile per program, in a snake
    (odd rounds from the last program), one row's blocks after another, heaviest (last) block first."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    n_tiles = n_blocks * rows
    rounds = -(-n_tiles // programs)
    (tiles,) = _interpret.run(_launch.launch(
        _tile_order, grid=(programs,), inputs=dict(n_blocks=n_blocks, rows=rows),
        out_shapes=(jax.ShapeDtypeStruct((programs, rounds, 2), jnp.float32),), constexprs=dict(ROUNDS=rounds),
        options={}))
    tiles = np.asarray(tiles)
    order = [(m, r) for r in range(rows) for m in reversed(range(n_blocks))]
    for p in range(programs):
        for r in range(rounds):
            i = r * programs + (p if r % 2 == 0 else programs - 1 - p)
            want = order[i] if i < n_tiles else (np.nan, np.nan)  # NaN: never written
            np.testing.assert_array_equal(tiles[p, r], want, err_msg=f"program {p} round {r}")


# ----- tiled grids (masking.tile_order): causal calls' rows in groups, block-major -----
@triton.jit
def _tiled_grid_order(Tiles, BANDED: tl.constexpr, GROUP_PROGRAMS: tl.constexpr):
    """Tiles (programs, 2): the (i, row) of each program, in launch order (x fastest)."""
    i, row = tile_order(BANDED, GROUP_PROGRAMS)
    p = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(Tiles + p * 2, i.to(tl.float32))
    tl.store(Tiles + p * 2 + 1, row.to(tl.float32))


@pytest.mark.matrix
@pytest.mark.parametrize("n_blocks, rows, group", [(4, 6, 8), (3, 7, 6), (5, 2, 256), (1, 5, 2), (6, 5, 4), (4, 3, 1)])
@pytest.mark.parametrize("banded", [0, 1, 3])
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_tiled_grid_order(n_blocks, rows, group, banded):
    """Every (block, row) once. Row-major, but with a band bounded on the right only (BANDED 1: causal) rows in
    groups of max(group // n_blocks, 1) (the last may be fewer), each group's tiles block-major (every row's
    heaviest block first), so launch order is longest first within a group. The launcher's model of it
    (tiled_order, which _tiled_finish weighs persistent grids against) says the same."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    (tiles,) = _interpret.run(_launch.launch(
        _tiled_grid_order, grid=(n_blocks, rows), inputs={},
        out_shapes=(jax.ShapeDtypeStruct((n_blocks * rows, 2), jnp.float32),),
        constexprs=dict(BANDED=banded, GROUP_PROGRAMS=group), options={}))
    got = [tuple(t) for t in np.asarray(tiles).astype(int).tolist()]
    assert sorted(got) == [(i, r) for i in range(n_blocks) for r in range(rows)]
    per = max(group // n_blocks, 1) if banded == 1 else 1
    want = [(i, r) for first in range(0, rows, per) for i in range(n_blocks)
            for r in range(first, min(first + per, rows))]
    assert got == want
    assert got == [tuple(t) for t in plan.tiled_order(n_blocks, rows, banded == 1, group).tolist()]


@pytest.mark.matrix
@pytest.mark.parametrize("path", ["seven", "ds"])
@pytest.mark.parametrize("case", ["whole-causal", "cross-causal-rows-empty", "gqa-groups"])
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_grouped_tile_order_in_the_interpreter(case, path):
    """Every kernel's causal grid in groups of a few rows, the last group partial (GROUP_PROGRAMS 8 in every row:
    the forward's 3-4 query blocks take 2 rows a group, dQ's and dK/dV's 2 blocks 4, of 6 rows): right against
    float64, and the same bits as one group (the default at these sizes), since the order only moves which
    program runs a tile."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    c = {**dict(window=(-1, -1), h=2, h_kv=2), **TMA_CASES[case]}
    b, h, d, dtype = 3, c["h"], 32, jnp.float16
    base_rows = TMA_INTERPRET_ROWS if path == "seven" else DS_INTERPRET_ROWS
    grouped = {kernel: with_(row, group_programs=8) for kernel, row in base_rows.items()}
    q, k, v, dout, dlse = inputs((b, c["sq"], h, d), (b, c["sk"], c["h_kv"], d), dtype, seed=7)
    statics = _launch.Statics(d ** -0.5, Band.of(True, c["window"], c["sq"], c["sk"]))
    results = []
    for rows in (grouped, base_rows):
        out, lse2 = _launch.forward(_interpret.run, "interpret", q, k, v, statics=statics, rows=rows, policy=TRITON)
        results.append((out, lse2) + _launch.backward(_interpret.run, "interpret", q, k, v, out, lse2, dout, dlse,
                                                      statics=statics, rows=rows, policy=TRITON))
    for got, same in zip(*results):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(same))
    out, lse2, dq, dk, dv = results[0]
    ref = oracle.attention(q, k, v, dout, dlse, causal=True)
    base = run_impl("xla", q, k, v, dout, dlse, causal=True)
    assert_close(dict(out=out, lse=lse2 * np.log(2), dq=dq, dk=dk, dv=dv), ref, base, dtype)


PERSISTENT_CASES = {
    "full": dict(sq=64, sk=64), "causal": dict(sq=64, sk=64, causal=True),
    "cross-causal": dict(sq=32, sk=64, causal=True), "window": dict(sq=64, sk=64, window=(9, 4)),
    "gqa-alibi-causal": dict(sq=64, sk=64, causal=True, h_kv=1, alibi=True),
    "softcap": dict(sq=48, sk=64, softcap=5.0),
}


@pytest.mark.matrix
@pytest.mark.parametrize("case", list(PERSISTENT_CASES))
@pytest.mark.parametrize("path", ["tma", "pointer"])
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_persistent_forward_equals_one_program_per_tile(case, path):
    """Whole blocks: the persistent forward (1, 3 and 7 programs) gives the tiled forward's output and lse
    exactly, through TMA (float16) and pointer loads (float32); a ragged call takes the tiled grid."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    c = {**dict(causal=False, window=(-1, -1), softcap=0.0, alibi=False, h_kv=2), **PERSISTENT_CASES[case]}
    b, h, d = 3, 2, 32
    dtype = jnp.float16 if path == "tma" else jnp.float32
    q, k, v, _, _ = inputs((b, c["sq"], h, d), (b, c["sk"], c["h_kv"], d), dtype, seed=11)
    extras = Operands(slopes=jnp.asarray([[0.3, 0.1]] * b, jnp.float32) if c["alibi"] else None)
    statics = _launch.Statics(d ** -0.5, Band.of(c["causal"], c["window"], c["sq"], c["sk"]), softcap=c["softcap"])
    row = with_(TMA_INTERPRET_ROW, tma=path == "tma", warp_specialize=path == "tma")
    grids = []

    def run(launch):
        grids.append(launch.grid)
        return _interpret.run(launch)

    def forward(q, persistent, programs=None):
        # any schedule: the test is of the kernel (persistent_programs' choice: test_plan.py)
        policy = TRITON.replace(persistent_balance=float("inf"), compute_units=programs)
        return _launch.forward(run, "interpret", q, k, v, extras, statics=statics,
                               rows={"fwd": with_(row, persistent=persistent)}, policy=policy)

    want = forward(q, 0)
    for programs in (1, 3, 7):
        got = forward(q, 1, programs)
        assert grids[-1] == (programs, 1)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    forward(q[:, :-1], 1, 3)  # ragged: one program per tile
    assert grids[-1] == (c["sq"] // row.block_m, b * h)


def _persistent_case(d, causal, variant, seed):
    """A GPU persistent test's call, 2 x 512 x 4 heads, bf16: ((q, k, v, dout, dlse), ALiBi slopes, statics,
    float64 reference, XLA's result). gqa-alibi: 2 key/value heads and slopes; window: a band bounded on
    both sides ((100, 0) with causal, as the "+window" rows take it). Skips off Hopper."""
    if _triton.target() != "sm90":
        pytest.skip("needs a Hopper GPU")
    b, h, seq = 2, 4, 512
    h_kv = 2 if variant == "gqa-alibi" else h
    args = inputs((b, seq, h, d), (b, seq, h_kv, d), jnp.bfloat16, seed=d + seed)
    slopes = (jax.random.uniform(jax.random.key(seed), (b, h), jnp.float32, 0.01, 0.5) if variant == "gqa-alibi"
              else None)
    window = ((100, 0) if causal else (37, 5)) if variant == "window" else (-1, -1)
    statics = _launch.Statics(d ** -0.5, Band.of(causal, window, seq, seq))
    ref = oracle.attention(*args, causal=causal, alibi=slopes, window=window)
    base = run_impl("xla", *args, causal=causal, alibi_slopes=slopes, window_size=window)
    return args, slopes, statics, ref, base


# every sm90 forward row, persistent (kernels/fwd.py PERSISTENT: the shipped persistent rows and the TMA rows
# made persistent), and the D 64 pointer row made persistent (two programs per SM)
PERSISTENT_ROWS = [with_(r, persistent=r.persistent or 1) for k, r in ROWS if k == "fwd"]
PERSISTENT_ROWS += [with_(r, persistent=2) for r in configs.TARGETS["sm90"]["fwd"] if r.max_width == 64 and not r.tma]


@pytest.mark.parametrize("row", PERSISTENT_ROWS, ids=lambda r: _id(("fwd", r)) + f"-p{r.persistent}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", ["plain", "gqa-alibi", "window"])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_every_sm90_forward_row_persistent(row, causal, variant):
    """Whole blocks over 5 programs, so each loops over several tiles (warp-specialised key loops inside
    the tile loop), against float64; then over as many programs as the GPU has units (_persistent_case)."""
    (q, k, v, _, _), slopes, statics, ref, base = _persistent_case(row.max_width, causal, variant, seed=5)
    for units in (5, None):  # persistent whatever the schedule
        policy = TRITON.replace(persistent_balance=float("inf"), compute_units=units)
        out, lse2 = jax.jit(lambda q, k, v, e: _launch.forward(_triton.run, "sm90", q, k, v, e, statics=statics,
                                                               rows={"fwd": row}, policy=policy))(
            q, k, v, Operands(slopes=slopes))
        assert np.isfinite(np.asarray(out, np.float32)).all()
        assert_close(dict(out=out, lse=lse2 * np.log(2)), ref, base, jnp.bfloat16, names=("out", "lse"))


# ----- the persistent dK/dV (kernels/bwd.py PERSISTENT): key blocks handed out by masking.persistent_tile -----

# softcap takes dK/dV's pointer row; "ring": a block of a larger causal call (Operands.positions, as in
# test_tma_path_as_a_block_of_a_larger_call)
DKDV_PERSISTENT_CASES = {**{c: v for c, v in PERSISTENT_CASES.items() if c != "softcap"},
                         "ring": dict(sq=32, sk=64, causal=True, positions=True)}


@pytest.mark.matrix
@pytest.mark.parametrize("case", list(DKDV_PERSISTENT_CASES))
@pytest.mark.parametrize("path", ["seven", "edges", "ds"])
@pytest.mark.skipif(ON_GPU or os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter runs on CPU-only machines")
def test_persistent_dkdv_equals_one_program_per_tile(case, path):
    """Whole blocks: the persistent TMA dK/dV kernel (1, 3 and 5 programs over 6-12 key-block tiles) gives
    the tiled kernel's gradients exactly on the seven-product path, also with the band's edge blocks apart
    ("edges": the persistent kernel then loops over the unmasked blocks); the dS path runs a PERSISTENT row
    tiled (persistent with the dS store: NaN on the H200, plan.py _dkdv_step)."""
    from jax_flash_amd import _interpret
    _interpret.check_available()
    c = {**dict(causal=False, window=(-1, -1), alibi=False, h_kv=2, positions=False), **DKDV_PERSISTENT_CASES[case]}
    b, h, d = 3, 2, 32
    q, k, v, dout, dlse = inputs((b, c["sq"], h, d), (b, c["sk"], c["h_kv"], d), jnp.float16, seed=13)
    extras = Operands(slopes=jnp.asarray([[0.3, 0.1]] * b, jnp.float32) if c["alibi"] else None,
                      positions=jnp.asarray([[32, 16, 16], [0, 0, 16], [48, 32, 16]], jnp.int32) if c["positions"]
                      else None)
    # with positions, the band is the larger call's (80 queries, 96 keys)
    shape = (80, 96) if c["positions"] else (c["sq"], c["sk"])
    statics = _launch.Statics(d ** -0.5, Band.of(c["causal"], c["window"], *shape))
    rows = DS_INTERPRET_ROWS if path == "ds" else TMA_INTERPRET_ROWS
    # the window case takes the dS path too
    policy = TRITON.replace(narrow_window=0, **(ALWAYS if path == "edges" else NEVER))
    grids = []

    def run(launch):
        if launch.kernel.__name__ == "attn_bwd_dkdv" and launch.constexprs.get("EDGES") != 2:
            grids.append(launch.grid)
        return _interpret.run(launch)

    out, lse2 = _launch.forward(run, "interpret", q, k, v, extras, statics=statics, rows=rows, policy=policy)

    def backward(persistent, programs=None):
        # any schedule: the test is of the kernel (the choice: test_plan.py)
        return _launch.backward(run, "interpret", q, k, v, out, lse2, dout, dlse, extras, statics=statics,
                                rows={**rows, "dkdv": with_(rows["dkdv"], persistent=persistent)},
                                policy=policy.replace(persistent_balance=float("inf"), compute_units=programs))

    want = backward(0)
    for programs in (1, 3, 5):
        got = backward(1, programs)
        assert grids[-1] == (grids[0] if path == "ds" else (programs, 1, 1))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


# the persistent TMA dK/dV rows (the D 64 candidate; the D 128 dS row returned NaN persistent: configs.py)
@pytest.mark.parametrize("row", [r for kernel, r in ROWS if kernel == "dkdv" and r.persistent],
                         ids=lambda r: _id(("dkdv", r)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", ["plain", "gqa-alibi", "window"])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_every_sm90_dkdv_row_persistent(row, causal, variant):
    """Every persistent sm90 TMA dK/dV row, over 5 and 13 programs (each loops over several key blocks, its
    query loop inside the tile loop), against float64."""
    args, slopes, statics, ref, base = _persistent_case(row.max_width, causal, variant, seed=9)
    rows = {"dkdv": row}
    for programs in (5, 13):  # 16 or 32 key-block tiles: uneven last rounds
        policy = TRITON.replace(persistent_balance=float("inf"), compute_units=programs)  # whatever the schedule
        grids = []

        def run(launch):
            if launch.kernel.__name__ == "attn_bwd_dkdv":
                grids.append(launch.grid)
            return _triton.run(launch)

        # rows only name dK/dV's: the forward takes its defaults
        got = jax.jit(fwd_bwd_through(run, "sm90", statics, rows, policy))(*args, Operands(slopes=slopes))
        assert grids and all(g == (programs, 1, 1) for g in grids), grids  # persistent
        for name, x in got.items():
            assert np.isfinite(np.asarray(x, np.float32)[np.isfinite(ref[name])]).all(), name
        assert_close(got, ref, base, jnp.bfloat16)


# the shipped kernels with other processes on the GPU: the warp-specialised dK/dV kernels with lse and delta through
# 1-D descriptors passed every test alone but returned NaN in 42 of 600 calls with 16 processes sharing the H200
# (docs/tuning.md, Hopper dK/dV)
@pytest.mark.parametrize("shape", [
    ["300", "40", "causal", "alibi", "128", "4"],  # D 128: the warp-specialised forward and dK/dV, masked
    ["256", "40", "full", "noalibi", "128", "4"],  # the same unmasked (whole blocks: lse / delta loaded first)
    ["1024", "40", "full", "noalibi", "64", "32"],  # D 64: the persistent warp-specialised forward; dK/dV's pointer row
    ["300", "40", "causal", "alibi", "128", "4", "0.1"],  # D 128 with dropout: the warp-specialised rows, dS path
], ids=["d128-masked", "d128-unmasked", "d64", "d128-dropout"])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_shipped_rows_under_contention(shape):
    """8 processes at once, each 40 forward + backward calls of the shipped kernels (batch 2; N, calls, mask, ALiBi,
    D, H and the dropout rate as `shape` gives them to tests/contention.py), every call finite and bit for bit the
    first call's (the kernels are deterministic)."""
    if _triton.target() != "sm90":
        pytest.skip("needs a Hopper GPU")
    here = os.path.dirname(os.path.abspath(__file__))
    command = [sys.executable, os.path.join(here, "contention.py"), *shape]
    procs = [subprocess.Popen(command, cwd=os.path.dirname(here), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(8)]
    try:
        outputs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, output in zip(procs, outputs):
        assert p.returncode == 0 and "calls 40, wrong 0" in output, output[-3000:]
