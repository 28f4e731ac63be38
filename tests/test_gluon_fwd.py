"""The Gluon forward (kernels/fwd_sm90.py): on the H200 against float64 for every variant it takes, at its
rows (GPU only; Gluon does not run in Triton's interpreter); its rows within the kernel's limits. Which calls take
it (plan.gluon_forward_row): tests/test_plan.py. Its compile for sm90 on the CPU: tests/kernel_factory_cases.py.
Paths are chosen through plan.Policy (plan.using), never by patching the library."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
import oracle
from helpers import ON_GPU, assert_close, fwd_bwd_through, inputs, run as run_impl
from jax_flash_amd import _launch, _triton, plan, reference
from jax_flash_amd.operands import Operands
from jax_flash_amd.kernels import configs
from jax_flash_amd.plan import Policy
from jax_flash_amd.rules import Band

INF = float("inf")


def _rows(rows, **change):
    """The rows with fields changed (the tests' forced variants of the shipped rows), names kept."""
    return tuple(dataclasses.replace(row, **change) for row in rows)


# what the fp8 cases force (from any length): the shipped tiled D 128 row (PINGPONG), and D 64's (no default takes it)
FP8_ROWS = (configs.SM90_GLUON_FWD_FP8[1].but("sm90/gluon-fwd-fp8/d128-any-length", min_seq=0),
            configs.SM90_GLUON_FWD_FP8_D64)

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
    # windows narrower than limits.narrow_window take the Triton rows: lowered to 0 for these
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
def test_gluon_forward(name):
    """The forward through the Gluon kernel (checked: it ran), the backward from its lse through the default kernels
    (the Gluon dK/dV too where plan.gluon_dkdv_row takes the call), against float64. Below a row's min_seq the rows
    are lowered to 0 (short sequences, cheap references), dropout turned on and no window narrow (limits.narrow_window
    0), except for the "long" cases, which take the shipped rows and limits as they are."""
    c = _case(name)
    if c["real_rows"]:
        c["sq"] = c["sk"] = max(r.min_seq for r in configs.SM90_GLUON_FWD if r.head_dim == c["d"])
        policy = plan.DEFAULT
    else:
        policy = Policy().replace(narrow_window=0, gluon_fwd=_rows(configs.SM90_GLUON_FWD, min_seq=0, dropout=True))
    kernels = run_case(c, seed=23, policy=policy)
    assert kernels[0] == "attn_fwd_sm90", kernels


# whole query and key blocks: the persistent grid (rows with `persistent`) on 3 programs, so each runs many tiles (the
# K / V rings and Q's buffer carried across them, causal tiles of unequal work)
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
def test_gluon_persistent_forward(name, carry):
    """The Gluon forward's persistent grid (the rows with `persistent`, from any length, dropout on, any balance, with
    and without `carry`) on 3 programs, against float64."""
    policy = Policy().replace(narrow_window=0, persistent_balance=INF, compute_units=3,
                              gluon_fwd=_rows([r for r in configs.SM90_GLUON_FWD if r.persistent], min_seq=0,
                                              dropout=True, carry=bool(carry)))
    launches = []
    run_case(with_defaults(PERSISTENT_CASES[name]), seed=29, policy=policy, launches=launches)
    grids = [(one.kernel.__name__, one.grid) for one in launches]
    assert grids[0] == ("attn_fwd_sm90", (3, 1)), grids


# narrow windows (limits.narrow_window) through the rows that say `window` (every row made to here): persistent only,
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
def test_gluon_forward_of_a_narrow_window(name):
    policy = Policy().replace(persistent_balance=INF, compute_units=3,
                              gluon_fwd=_rows(configs.SM90_GLUON_FWD, window=True))
    launches = []
    run_case(with_defaults(NARROW_CASES[name]), seed=31, policy=policy, launches=launches)
    grids = [(one.kernel.__name__, one.grid) for one in launches]
    assert grids[0] == ("attn_fwd_sm90", (3, 1)), grids


def run_case(c, seed, policy, launches=None):
    """Case c (_case) through _launch's forward and backward on the GPU, planned with `policy` (plan.using), against
    float64; the names of the kernels it launched (and into `launches`, each _launch.Launch)."""
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
        if launches is not None:
            launches.append(launch)
        return _triton.run(launch)

    with plan.using(policy):  # traced here (a new function each case): planned with the policy
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
def test_gluon_forward_through_the_api():
    """jax_flash_amd.attention under jit and grad, at the rows' lengths: its plan runs the Gluon kernel, the result
    against float64."""
    assert "attn_fwd_sm90" in through_the_api((1, 4096, 4, 128), seed=5)


def through_the_api(shape, seed):
    """The kernels of the plans (jax_flash_amd.explain: forward, then backward) of a causal bf16
    jax_flash_amd.attention call of that shape, whose result under jit and grad is checked against float64."""
    q, k, v, dout, dlse = inputs(shape, shape, jnp.bfloat16, seed=seed)
    explained = jax_flash_amd.explain(q, k, v, causal=True, return_lse=True, implementation="triton")
    got = run_impl("triton", q, k, v, dout, dlse, causal=True)
    ref = oracle.attention(q, k, v, dout, dlse, causal=True)
    base = run_impl("xla", q, k, v, dout, dlse, causal=True)
    assert_close(got, ref, base, jnp.bfloat16)
    return explained.forward.kernels + explained.backward.kernels


# the fp8 forward (FP8_ROWS forced): ragged and whole blocks, cross lengths, causal with grouped heads, a window, ALiBi
# with softcap, D 64
FP8_CASES = {"full-ragged": dict(sq=300, sk=333), "whole": dict(sq=512, sk=512),
             "causal-gqa": dict(sq=300, sk=300, h_kv=2, causal=True), "window": dict(sq=700, sk=700, window=(100, 37)),
             "alibi-softcap": dict(sq=300, sk=300, causal=True, alibi=True, softcap=20.0),
             "d64-causal": dict(sq=300, sk=300, d=64, causal=True)}


@pytest.mark.parametrize("name", list(FP8_CASES))
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_fp8_forward(name):
    """fp8 inputs through the Gluon forward (checked: the call's plan runs it) against the float64 attention of the
    dequantised inputs, with tests/test_fp8.py's bounds (P rounded to e4m3 for the PV product)."""
    from jax_flash_amd import fp8
    from test_fp8 import _inputs, _rel_rms

    c = {**dict(d=128, h=4, h_kv=4, causal=False, window=(-1, -1), alibi=False, softcap=0.0), **FP8_CASES[name]}
    policy = Policy().replace(narrow_window=0, gluon_fwd_fp8=FP8_ROWS)
    qq, kq, vq, qd, kd, vd = _inputs(2, c["sq"], c["sk"], c["h"], c["h_kv"], c["d"], jnp.float8_e4m3fn, seed=7)
    # descales far apart per (batch, key/value head), so that one read at another's index shows
    spread = 2.0 ** jnp.linspace(-1.0, 1.0, 2 * c["h_kv"], dtype=jnp.float32).reshape(2, c["h_kv"])
    qd, kd, vd = qd * spread, kd * spread[::-1], vd * spread[:, ::-1]
    slopes = jax.random.uniform(jax.random.key(3), (2, c["h"]), jnp.float32, 0.01, 0.5) if c["alibi"] else None
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True, causal=c["causal"], window_size=c["window"],
              alibi_slopes=slopes, softcap=c["softcap"], implementation="triton")
    with plan.using(policy):
        explained = jax_flash_amd.explain(qq, kq, vq, **kw)
        out, lse = jax_flash_amd.attention(qq, kq, vq, **kw)
    assert "attn_fwd_sm90" in explained.forward.kernels and out.dtype == jnp.bfloat16, explained
    group = c["h"] // c["h_kv"]
    ref = oracle.attention(fp8.dequantize(qq, jnp.repeat(qd, group, axis=1)), fp8.dequantize(kq, kd),
                           fp8.dequantize(vq, vd), np.zeros(qq.shape), causal=c["causal"], window=c["window"],
                           alibi=slopes, softcap=c["softcap"])
    assert _rel_rms(out, ref["out"]) < 0.05
    fin = np.isfinite(ref["lse"])
    np.testing.assert_allclose(np.asarray(lse)[fin], ref["lse"][fin], rtol=1e-4, atol=4e-3)


# PINGPONG for the call without a band only: plan.plan_forward turns it off for banded calls
@pytest.mark.parametrize("name, mode", [(name, mode) for name in ("whole", "causal-gqa-whole", "d64-causal-whole",
                                                                  "two-sided-whole") for mode in ("plain", "carry")]
                         + [("whole", "pingpong")])
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gluon_fp8_persistent_forward(name, mode):
    """fp8 inputs through the persistent Gluon forward (FP8_ROWS made `persistent`, with `carry` or `pingpong`) on 3
    programs, so each runs many tiles of different (batch, head) descales, against float64. (Turns taken wrongly would
    hang or race rather than change the numbers; the plan's flags show they were on.)"""
    from jax_flash_amd import fp8
    from test_fp8 import _inputs, _rel_rms

    case = {"whole": dict(sq=512, sk=512), "causal-gqa-whole": dict(sq=384, sk=384, h_kv=2, causal=True),
            "d64-causal-whole": dict(sq=512, sk=512, d=64, causal=True),
            "two-sided-whole": dict(sq=640, sk=512, window=(60, 40))}[name]
    c = {**dict(d=128, h=4, h_kv=4, causal=False, window=(-1, -1)), **case}
    rows = _rows(FP8_ROWS, min_seq=0, pingpong=mode == "pingpong", persistent=1, carry=mode == "carry")
    policy = Policy().replace(narrow_window=0, persistent_balance=INF, compute_units=3, gluon_fwd_fp8=rows)
    qq, kq, vq, qd, kd, vd = _inputs(2, c["sq"], c["sk"], c["h"], c["h_kv"], c["d"], jnp.float8_e4m3fn, seed=11)
    spread = 2.0 ** jnp.linspace(-1.0, 1.0, 2 * c["h_kv"], dtype=jnp.float32).reshape(2, c["h_kv"])
    qd, kd, vd = qd * spread, kd * spread[::-1], vd * spread[:, ::-1]
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True, causal=c["causal"], window_size=c["window"],
              implementation="triton")
    with plan.using(policy):  # the policy is part of the call's static options: no trace of another case is reused
        explained = jax_flash_amd.explain(qq, kq, vq, **kw)
        out, lse = jax_flash_amd.attention(qq, kq, vq, **kw)
    step = explained.forward.step("fwd")
    assert (step.kernel, step.grid) == ("attn_fwd_sm90", (3, 1)), explained
    made = step.flags  # CARRY left out: the kernel's default, 0
    assert made.get("CARRY", 0) == (mode == "carry") and made["PINGPONG"] == (mode == "pingpong"), made
    group = c["h"] // c["h_kv"]
    ref = oracle.attention(fp8.dequantize(qq, jnp.repeat(qd, group, axis=1)), fp8.dequantize(kq, kd),
                           fp8.dequantize(vq, vd), np.zeros(qq.shape), causal=c["causal"], window=c["window"])
    assert _rel_rms(out, ref["out"]) < 0.05
    fin = np.isfinite(ref["lse"])
    np.testing.assert_allclose(np.asarray(lse)[fin], ref["lse"][fin], rtol=1e-4, atol=4e-3)


def test_every_gluon_row_is_within_the_kernels_limits():
    """Rows as data, checked: one per head dim the kernel takes, and within its shared memory and block rules (fp8:
    8-bit tiles and the bfloat16 output's own buffers; `carry` and `pingpong` not both: _consume_tiles)."""
    dims = {row.head_dim for row in configs.SM90_GLUON_FWD}
    assert dims == {64, 128}, dims
    fp8_rows = configs.SM90_GLUON_FWD_FP8 + FP8_ROWS
    for row, fp8 in [(r, False) for r in configs.SM90_GLUON_FWD] + [(r, True) for r in fp8_rows]:
        assert not (row.carry and row.pingpong), row
        q_tiles = 2 if row.carry else 1  # fwd_sm90._carried_tiles: two tiles' Q
        tiles = (q_tiles * 2 * 64 + 2 * row.stages * row.block_n) * row.head_dim * (1 if fp8 else 2)  # Q K V
        tiles += 2 * 64 * row.head_dim * 2 if fp8 or row.persistent else 0  # the output's own buffers
        assert tiles <= 227 * 1024, row
        assert row.block_n in (64, 128) and row.num_warps == 4 and 24 < row.consumer_regs <= 256, row
