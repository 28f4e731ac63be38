"""The Gluon forward (kernels/fwd_sm90.py): on the H200 against float64 for every variant it takes, at its
rows (GPU only; Gluon does not run in Triton's interpreter); on any machine, which calls take it
(_launch.gluon_forward). Its compile for sm90 on the CPU: tests/kernel_factory_cases.py."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
import oracle
from helpers import ON_GPU, assert_close, fwd_bwd_through, inputs, run as run_impl
from jax_flash_amd import _jax_triton_compat, _launch, _triton, reference
from jax_flash_amd.operands import Operands
from jax_flash_amd.kernels import configs
from jax_flash_amd.rules import Band

# b 2: a ragged block's rows past its batch element must come in as zeros and never be stored
CASES = {
    "full-ragged": dict(sq=300, sk=300),
    "causal-whole": dict(sq=256, sk=256, causal=True),
    "causal-ragged": dict(sq=300, sk=300, causal=True),
    "cross-causal": dict(sq=200, sk=333, causal=True),
    "more-queries-causal": dict(sq=333, sk=200, causal=True),  # the first rows see no key: out 0, lse -inf
    "one-block": dict(sq=50, sk=77),
    "gqa-alibi-causal": dict(sq=300, sk=300, causal=True, h_kv=2, alibi=True),
    "gqa-full": dict(sq=300, sk=300, h_kv=2),
    "cross-two-sided": dict(sq=600, sk=450, window=(60, 40)),
    # windows narrower than configs.NARROW_WINDOW take the Triton rows: lowered to 0 for these
    "window": dict(sq=700, sk=700, window=(100, 37)),
    "window-left": dict(sq=1000, sk=1000, window=(300, 0)),
    "window-past-keys": dict(sq=500, sk=500, window=(20, -1)),  # left bound only (BANDED 2)
    "softcap-causal": dict(sq=300, sk=300, causal=True, softcap=20.0),
    "d64-causal": dict(sq=300, sk=300, causal=True, d=64),
    "d64-full": dict(sq=256, sk=256, d=64),
    "fp16": dict(sq=300, sk=300, dtype=jnp.float16),
    "fp16-d64-causal": dict(sq=300, sk=300, causal=True, d=64, dtype=jnp.float16),
    # dropout (the rows' `dropout` turned on; the shipped D 128 row takes it)
    "dropout-causal": dict(sq=300, sk=300, causal=True, dropout=0.2),
    "dropout-gqa-window": dict(sq=700, sk=700, h_kv=2, window=(100, 37), dropout=0.2),
    "long-causal": dict(causal=True, b=1, real_rows=True),  # at the shipped row's min_seq
    "long-d64": dict(d=64, b=1, h=2, h_kv=2, real_rows=True),
}


def with_defaults(case):
    return {**dict(b=2, h=4, h_kv=4, d=128, dtype=jnp.bfloat16, causal=False, window=(-1, -1), softcap=0.0,
                   alibi=False, dropout=0.0, real_rows=False), **case}


def _case(name):
    return with_defaults(CASES[name])


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_forward(name, monkeypatch):
    """The forward through the Gluon kernel (checked: it ran), the backward from its lse through the default kernels
    (the Gluon dK/dV too where _launch.gluon_dkdv holds), against float64. Below a row's min_seq the rows are lowered
    to 0 (short sequences, cheap references) and dropout turned on, except for the "long" cases, which take the
    shipped rows as they are."""
    c = _case(name)
    if c["real_rows"]:
        c["sq"] = c["sk"] = max(r["min_seq"] for r in configs.SM90_GLUON_FWD if r["head_dim"] == c["d"])
    else:
        monkeypatch.setattr(configs, "SM90_GLUON_FWD", [dict(row, min_seq=0, dropout=True)
                                                        for row in configs.SM90_GLUON_FWD])
        monkeypatch.setattr(configs, "NARROW_WINDOW", 0)
    kernels = run_case(c, seed=23)
    assert kernels[0] == "attn_fwd_sm90", kernels


# whole query and key blocks: the persistent grid (PERSISTENT rows) on 3 programs, so each runs many tiles (the K / V
# rings and Q's buffer carried across them, causal tiles of unequal work)
PERSISTENT_CASES = {
    "full": dict(sq=512, sk=512),
    "causal": dict(sq=512, sk=512, causal=True),
    "cross-causal": dict(sq=256, sk=640, causal=True),
    "gqa-alibi-causal": dict(sq=384, sk=384, causal=True, h_kv=2, alibi=True),
    "two-sided": dict(sq=640, sk=512, window=(60, 40)),
    "softcap-causal": dict(sq=512, sk=512, causal=True, softcap=20.0),
    "dropout-causal": dict(sq=512, sk=512, causal=True, dropout=0.2),
    "d64-causal": dict(sq=512, sk=512, causal=True, d=64),
    "d64-full": dict(sq=384, sk=256, d=64),
    "fp16-causal": dict(sq=512, sk=512, causal=True, dtype=jnp.float16),
}


@pytest.mark.parametrize("carry", [0, 1])
@pytest.mark.parametrize("name", list(PERSISTENT_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_persistent_forward(name, carry, monkeypatch):
    """The Gluon forward's persistent grid (the rows with PERSISTENT, from any length, dropout on, any balance, with
    and without CARRY) on 3 programs, against float64."""
    monkeypatch.setattr(configs, "SM90_GLUON_FWD", [dict(row, min_seq=0, dropout=True, CARRY=carry) for row in
                                                    configs.SM90_GLUON_FWD if row.get("PERSISTENT")])
    monkeypatch.setattr(configs, "NARROW_WINDOW", 0)
    monkeypatch.setattr(configs, "PERSISTENT_BALANCE", float("inf"))
    monkeypatch.setattr(_launch, "compute_units", lambda target: 3)
    grids = []
    run_case(with_defaults(PERSISTENT_CASES[name]), seed=29, grids=grids)
    assert grids[0] == ("attn_fwd_sm90", (3, 1)), grids


# narrow windows (configs.NARROW_WINDOW) through the rows that say `window` (every row made to here): persistent only,
# on 3 programs
NARROW_CASES = {
    "left-causal": dict(sq=1024, sk=1024, causal=True, window=(300, 0)),
    "two-sided-cross": dict(sq=640, sk=512, window=(60, 40)),
    "gqa-alibi": dict(sq=512, sk=512, window=(100, 100), h_kv=2, alibi=True),
    "d64-left-causal": dict(sq=1024, sk=1024, causal=True, window=(200, 0), d=64),
}


@pytest.mark.parametrize("name", list(NARROW_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_forward_of_a_narrow_window(name, monkeypatch):
    monkeypatch.setattr(configs, "SM90_GLUON_FWD", [dict(row, window=True) for row in configs.SM90_GLUON_FWD])
    monkeypatch.setattr(configs, "PERSISTENT_BALANCE", float("inf"))
    monkeypatch.setattr(_launch, "compute_units", lambda target: 3)
    grids = []
    run_case(with_defaults(NARROW_CASES[name]), seed=31, grids=grids)
    assert grids[0] == ("attn_fwd_sm90", (3, 1)), grids


def run_case(c, seed, grids=None):
    """Case c (_case) through _launch's forward and backward on the GPU, the rows as the caller set them, against
    float64; the kernels it launched (and into `grids`, their (name, grid))."""
    b, h, d = c["b"], c["h"], c["d"]
    q, k, v, dout, dlse = inputs((b, c["sq"], h, d), (b, c["sk"], c["h_kv"], d), c["dtype"], seed=seed)
    slopes = jax.random.uniform(jax.random.key(seed), (b, h), jnp.float32, 0.01, 0.5) if c["alibi"] else None
    p, rng = c["dropout"], jax.random.key(seed + 1)
    seeds = reference.dropout_seeds(rng, b, h) if p else None
    statics = _launch.Statics(d ** -0.5, Band.of(c["causal"], c["window"], c["sq"], c["sk"]), softcap=c["softcap"],
                              dropout_p=p)
    kernels = []

    def run(launch):
        kernels.append(launch.kernel.__name__)
        if grids is not None:
            grids.append((launch.kernel.__name__, launch.grid))
        return _triton.run(launch)

    got = jax.jit(fwd_bwd_through(run, _triton.target(), statics))(q, k, v, dout, dlse,
                                                                   Operands(slopes=slopes, seeds=seeds))
    drop = dict(dropout_p=p, keep=reference.dropout_keep(seeds, c["sq"], c["sk"], p)) if p else {}
    ref = oracle.attention(q, k, v, dout, dlse, causal=c["causal"], window=c["window"], softcap=c["softcap"],
                           alibi=slopes, **drop)
    base = run_impl("xla", q, k, v, dout, dlse, causal=c["causal"], window_size=c["window"], softcap=c["softcap"],
                    alibi_slopes=slopes, **(dict(dropout_p=p, dropout_rng=rng) if p else {}))
    assert_close(got, ref, base, c["dtype"])
    return kernels


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_forward_through_the_api(monkeypatch):
    """jax_flash_amd.attention under jit and grad, at the rows' lengths: the Gluon kernel runs (recorded), the result
    against float64."""
    assert "attn_fwd_sm90" in through_the_api(monkeypatch, (1, 4096, 4, 128), seed=5)


def through_the_api(monkeypatch, shape, seed):
    """The kernels a causal bf16 jax_flash_amd.attention call of that shape launches under jit and grad, its result
    checked against float64."""
    names, launch = [], _triton.run

    def record(one):
        names.append(one.kernel.__name__)
        return launch(one)

    monkeypatch.setattr(_triton, "run", record)
    q, k, v, dout, dlse = inputs(shape, shape, jnp.bfloat16, seed=seed)
    got = run_impl("triton", q, k, v, dout, dlse, causal=True)
    ref = oracle.attention(q, k, v, dout, dlse, causal=True)
    base = run_impl("xla", q, k, v, dout, dlse, causal=True)
    assert_close(got, ref, base, jnp.bfloat16)
    return names


def takes(monkeypatch, rule, interpreted=False, jax_triton=(0, 3, 1), shape=(1, 8192, 16, 128), kv_heads=16,
          seq_k=None, dtype=jnp.bfloat16, target="sm90", dropout=0.0, rows=None, causal=True, window=(-1, -1),
          alibi=False, segments=False, positions=False, key="head_dim"):
    """The head dim (or `key`) of the row `rule` (_launch.gluon_forward or gluon_dkdv) picks for such a call, or
    None."""
    monkeypatch.setattr(_launch, "interpreted", lambda: interpreted)
    monkeypatch.setattr(_jax_triton_compat, "versions", lambda: {"jax-triton": jax_triton, "triton": (3, 6, 0),
                                                                 "jax": (0, 11, 2)})
    q = jax.ShapeDtypeStruct(shape, dtype)
    seq_k = shape[1] if seq_k is None else seq_k
    k = jax.ShapeDtypeStruct((shape[0], seq_k, kv_heads, shape[3]), dtype)
    statics = _launch.Statics(shape[3] ** -0.5, Band.of(causal, window, shape[1], seq_k), dropout_p=dropout)
    extras = {}
    if alibi:
        extras["slopes"] = jnp.zeros((shape[0], shape[2]), jnp.float32)
    if segments:
        extras["q_segment_ids"] = extras["kv_segment_ids"] = jnp.zeros(shape[:2], jnp.int32)
    if positions:
        extras["positions"] = jnp.zeros((shape[0], 3), jnp.int32)
    row = rule(target, q, k, statics, dataclasses.replace(Operands(), **extras), rows)
    return None if row is None else row.get(key)


@pytest.mark.parametrize("case, head", [
    (dict(), 128),
    (dict(shape=(2, 8192, 32, 64)), 64),
    (dict(shape=(2, 4096, 32, 64)), 64),  # D 64 below 8192: the persistent row (whole blocks)
    (dict(shape=(2, 4000, 32, 64)), None),  # ragged: no persistent grid, and the tiled row from 8192
    (dict(kv_heads=4), 128),  # grouped heads
    (dict(dtype=jnp.float16), 128),
    (dict(alibi=True), 128),
    (dict(window=(4096, 0)), 128),  # wide: one-sided in effect
    (dict(window=(1024, 0)), None),  # narrow windows: D 128's rows do not say `window` (the "+window" Triton rows)
    (dict(shape=(4, 4096, 32, 64), window=(1024, 0)), 64),  # D 64's persistent row says `window`
    (dict(shape=(4, 4096, 32, 64), window=(100, 100), causal=False), 64),
    (dict(shape=(4, 4000, 32, 64), window=(1024, 0)), None),  # ragged: not persistent, and no tiled row for it
    (dict(shape=(4, 4096, 32, 64), window=(1024, 0), dropout=0.1), None),  # narrow windows with dropout: Triton's
    (dict(causal=False), 128),
    (dict(causal=False, window=(3000, 3000)), 128),  # two-sided, wider than configs.NARROW_WINDOW
    (dict(shape=(16, 1024, 16, 128)), 128),  # the persistent row: whole blocks
    (dict(shape=(16, 1000, 16, 128)), None),  # ragged and below the tiled row's min_seq: the Triton rows
    (dict(shape=(1, 8200, 16, 128)), 128),  # ragged from the tiled row's min_seq
    (dict(seq_k=1024), None),  # short key loops: the Triton rows (persistent: too many causal query blocks)
    (dict(seq_k=1024, causal=False), 128),  # persistent
    (dict(seq_k=1000, causal=False), None),  # ragged short key loops: the Triton rows
    (dict(shape=(4, 4096, 16, 128)), 128),
    (dict(shape=(1, 8192, 16, 256)), None),  # no row for the head
    (dict(shape=(1, 8192, 16, 96)), None),  # not a whole 16-bit tile
    (dict(dtype=jnp.float32), None),
    (dict(dtype=jnp.float8_e4m3fn), 128),  # configs.SM90_GLUON_FWD_FP8's row (test_which_fp8_calls_...)
    (dict(dropout=0.1), 128),
    (dict(shape=(2, 8192, 32, 64), dropout=0.1), None),  # D 64 dropout: the Triton rows (no faster in Gluon)
    (dict(segments=True), None),
    (dict(positions=True), None),
    (dict(rows={"fwd": {"BLOCK_M": 128}}), None),  # an explicit row (autotuning, the rows sweep): Triton's
    (dict(target="cuda"), None),
    (dict(target="gfx942"), None),
    (dict(interpreted=True), None),  # Triton's interpreter cannot run Gluon
    (dict(jax_triton=(0, 4, 1)), None),  # launches the requested 4 warps, not the compiled 12
])
def test_which_calls_take_the_gluon_forward(case, head, monkeypatch):
    assert takes(monkeypatch, _launch.gluon_forward, **case) == head


@pytest.mark.parametrize("case, persistent", [
    (dict(shape=(4, 4096, 16, 128)), True),
    (dict(shape=(4, 4096, 16, 128), causal=False), True),
    (dict(shape=(1, 8200, 16, 128)), False),  # ragged: one descriptor cannot serve every tile
    (dict(shape=(2, 4096, 32, 64)), True),
    (dict(shape=(1, 16384, 32, 64)), False),  # D 64 from 8192: the tiled row (persistent measured slower there)
    (dict(shape=(1, 16384, 16, 128), dtype=jnp.float8_e4m3fn), False),  # fp8 causal: the tiled row from 8192
    (dict(shape=(1, 16384, 16, 128), dtype=jnp.float8_e4m3fn, causal=False), True),
    (dict(shape=(1, 16384, 32, 64), window=(1024, 0)), True),  # a narrow window: only the rows that say `window`
    (dict(shape=(4, 4096, 16, 128), dtype=jnp.float8_e4m3fn), True),
])
def test_which_calls_run_the_gluon_forward_persistent(case, persistent, monkeypatch):
    assert bool(takes(monkeypatch, _launch.gluon_forward, key="PERSISTENT", **case)) == persistent


@pytest.mark.parametrize("case, head", [
    (dict(), 128),  # D 128 from 8192 queries and keys
    (dict(shape=(2, 4096, 16, 128)), 128),  # the persistent row: whole blocks
    (dict(shape=(16, 1024, 16, 128), causal=False), 128),
    (dict(shape=(2, 4000, 16, 128)), None),  # ragged and below the tiled row's min_seq: the Triton rows
    (dict(shape=(1, 16384, 16, 128), seq_k=4096), None),  # not persistent (causal, 128 query blocks), short keys
    (dict(shape=(1, 16384, 32, 64)), None),  # D 64: the Triton rows
    (dict(candidates=True), 128),
    (dict(candidates=True, shape=(2, 300, 4, 64)), 64),
    (dict(candidates=True, shape=(2, 300, 4, 96)), None),  # not a whole tile
    (dict(candidates=True, dropout=0.1), None),
    (dict(candidates=True, window=(100, 0)), None),  # narrow windows: the Triton rows, as for 16-bit inputs
    (dict(candidates=True, segments=True), None),
    (dict(candidates=True, interpreted=True), None),
])
def test_which_fp8_calls_take_the_gluon_forward(case, head, monkeypatch):
    case = dict(case)
    if case.pop("candidates", False):
        monkeypatch.setattr(configs, "SM90_GLUON_FWD_FP8", configs.SM90_GLUON_FWD_FP8_CANDIDATES)
    assert takes(monkeypatch, _launch.gluon_forward, **{"dtype": jnp.float8_e4m3fn, **case}) == head


# the fp8 forward (configs.SM90_GLUON_FWD_FP8_CANDIDATES forced): ragged and whole blocks, cross lengths, causal
# with grouped heads, a window, ALiBi with softcap, D 64
FP8_CASES = {"full-ragged": dict(sq=300, sk=333), "whole": dict(sq=512, sk=512),
             "causal-gqa": dict(sq=300, sk=300, h_kv=2, causal=True), "window": dict(sq=700, sk=700, window=(100, 37)),
             "alibi-softcap": dict(sq=300, sk=300, causal=True, alibi=True, softcap=20.0),
             "d64-causal": dict(sq=300, sk=300, d=64, causal=True)}


@pytest.mark.parametrize("name", list(FP8_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_fp8_forward(name, monkeypatch):
    """fp8 inputs through the Gluon forward (checked: it ran) against the float64 attention of the dequantised
    inputs, with tests/test_fp8.py's bounds (P rounded to e4m3 for the PV product)."""
    from jax_flash_amd import fp8
    from test_fp8 import _inputs, _rel_rms

    c = {**dict(d=128, h=4, h_kv=4, causal=False, window=(-1, -1), alibi=False, softcap=0.0), **FP8_CASES[name]}
    monkeypatch.setattr(configs, "SM90_GLUON_FWD_FP8", configs.SM90_GLUON_FWD_FP8_CANDIDATES)
    monkeypatch.setattr(configs, "NARROW_WINDOW", 0)
    names, launch = [], _triton.run

    def record(one):
        names.append(one.kernel.__name__)
        return launch(one)

    monkeypatch.setattr(_triton, "run", record)
    qq, kq, vq, qd, kd, vd = _inputs(2, c["sq"], c["sk"], c["h"], c["h_kv"], c["d"], jnp.float8_e4m3fn, seed=7)
    # descales far apart per (batch, key/value head), so that one read at another's index shows
    spread = 2.0 ** jnp.linspace(-1.0, 1.0, 2 * c["h_kv"], dtype=jnp.float32).reshape(2, c["h_kv"])
    qd, kd, vd = qd * spread, kd * spread[::-1], vd * spread[:, ::-1]
    slopes = jax.random.uniform(jax.random.key(3), (2, c["h"]), jnp.float32, 0.01, 0.5) if c["alibi"] else None
    out, lse = jax_flash_amd.attention(qq, kq, vq, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True,
                                       causal=c["causal"], window_size=c["window"], alibi_slopes=slopes,
                                       softcap=c["softcap"], implementation="triton")
    assert "attn_fwd_sm90" in names and out.dtype == jnp.bfloat16, names
    group = c["h"] // c["h_kv"]
    ref = oracle.attention(fp8.dequantize(qq, jnp.repeat(qd, group, axis=1)), fp8.dequantize(kq, kd),
                           fp8.dequantize(vq, vd), np.zeros(qq.shape), causal=c["causal"], window=c["window"],
                           alibi=slopes, softcap=c["softcap"])
    assert _rel_rms(out, ref["out"]) < 0.05
    fin = np.isfinite(ref["lse"])
    np.testing.assert_allclose(np.asarray(lse)[fin], ref["lse"][fin], rtol=1e-4, atol=4e-3)


# PINGPONG for the call without a band only: _launch._forward_gluon turns it off for banded calls
@pytest.mark.parametrize("name, mode", [(name, mode) for name in ("whole", "causal-gqa-whole", "d64-causal-whole",
                                                                  "two-sided-whole") for mode in ("plain", "carry")]
                         + [("whole", "pingpong")])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_fp8_persistent_forward(name, mode, monkeypatch):
    """fp8 inputs through the persistent Gluon forward (the candidates with PERSISTENT, and CARRY or PINGPONG) on 3
    programs, so each runs many tiles of different (batch, head) descales, against float64. (Turns taken wrongly would
    hang or race rather than change the numbers; the launch's constexprs show they were on.)"""
    from jax_flash_amd import fp8
    from test_fp8 import _inputs, _rel_rms

    case = {"whole": dict(sq=512, sk=512), "causal-gqa-whole": dict(sq=384, sk=384, h_kv=2, causal=True),
            "d64-causal-whole": dict(sq=512, sk=512, d=64, causal=True),
            "two-sided-whole": dict(sq=640, sk=512, window=(60, 40))}[name]
    c = {**dict(d=128, h=4, h_kv=4, causal=False, window=(-1, -1)), **case}
    monkeypatch.setattr(configs, "SM90_GLUON_FWD_FP8", [
        dict(r, min_seq=0, PINGPONG=mode == "pingpong", PERSISTENT=1, CARRY=int(mode == "carry"))
        for r in configs.SM90_GLUON_FWD_FP8_CANDIDATES])
    monkeypatch.setattr(configs, "NARROW_WINDOW", 0)
    monkeypatch.setattr(configs, "PERSISTENT_BALANCE", float("inf"))
    monkeypatch.setattr(_launch, "compute_units", lambda target: 3)
    grids, launch = [], _triton.run

    def record(one):
        grids.append((one.kernel.__name__, one.grid, one.constexprs))
        return launch(one)

    monkeypatch.setattr(_triton, "run", record)
    jax.clear_caches()  # the public call's traces would keep the last case's rows (same shapes, other CARRY)
    qq, kq, vq, qd, kd, vd = _inputs(2, c["sq"], c["sk"], c["h"], c["h_kv"], c["d"], jnp.float8_e4m3fn, seed=11)
    spread = 2.0 ** jnp.linspace(-1.0, 1.0, 2 * c["h_kv"], dtype=jnp.float32).reshape(2, c["h_kv"])
    qd, kd, vd = qd * spread, kd * spread[::-1], vd * spread[:, ::-1]
    out, lse = jax_flash_amd.attention(qq, kq, vq, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True,
                                       causal=c["causal"], window_size=c["window"], implementation="triton")
    (made,) = [constexprs for kernel, grid, constexprs in grids if kernel == "attn_fwd_sm90" and grid == (3, 1)]
    assert made["CARRY"] == (mode == "carry") and made["PINGPONG"] == (mode == "pingpong"), made
    jax.clear_caches()  # nor leave them to the next test
    group = c["h"] // c["h_kv"]
    ref = oracle.attention(fp8.dequantize(qq, jnp.repeat(qd, group, axis=1)), fp8.dequantize(kq, kd),
                           fp8.dequantize(vq, vd), np.zeros(qq.shape), causal=c["causal"], window=c["window"])
    assert _rel_rms(out, ref["out"]) < 0.05
    fin = np.isfinite(ref["lse"])
    np.testing.assert_allclose(np.asarray(lse)[fin], ref["lse"][fin], rtol=1e-4, atol=4e-3)


def test_every_gluon_row_is_within_the_kernels_limits():
    """Rows as data, checked: one per head dim the kernel takes, and within its shared memory and block rules (fp8:
    8-bit tiles and the bfloat16 output's own buffers; CARRY and PINGPONG not both: _consume_tiles)."""
    dims = {row["head_dim"] for row in configs.SM90_GLUON_FWD}
    assert dims == {64, 128}, dims
    fp8_rows = configs.SM90_GLUON_FWD_FP8 + configs.SM90_GLUON_FWD_FP8_CANDIDATES
    for row, fp8 in [(r, False) for r in configs.SM90_GLUON_FWD] + [(r, True) for r in fp8_rows]:
        assert not (row.get("CARRY") and row.get("PINGPONG")), row
        q_tiles = 2 if row.get("CARRY") else 1  # fwd_sm90._carried_tiles: two tiles' Q
        tiles = (q_tiles * 2 * 64 + 2 * row["STAGES"] * row["BLOCK_N"]) * row["head_dim"] * (1 if fp8 else 2)  # Q K V
        tiles += 2 * 64 * row["head_dim"] * 2 if fp8 or row.get("PERSISTENT") else 0  # the output's own buffers
        assert tiles <= 227 * 1024, row
        assert row["BLOCK_N"] in (64, 128) and row["num_warps"] == 4 and 24 < row["CONSUMER_REGS"] <= 256, row
