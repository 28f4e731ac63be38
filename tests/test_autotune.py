"""Config choice: the default rows (narrow windows, dropout and grouped heads have their own; plan.pick) and opt-in
autotuning, which tunes once per coarse key, picks among the candidates, and stays exact."""
import inspect
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

import oracle
from helpers import KERNEL_IMPLS, assert_close, inputs, run
from jax_flash_amd import autotune, plan
from jax_flash_amd.rules import Band
from jax_flash_amd.kernels import configs


def _call(target="cuda", head_dim=128, dtype=jnp.bfloat16, band=Band(), dropout=0.0, heads=16, kv_heads=16):
    """A call of 1 x 4096 x heads on `target`, for plan.pick."""
    return plan.Call(target, 1, 4096, 4096, heads, kv_heads, head_dim, jnp.dtype(dtype).name, band=band,
                     dropout_p=dropout)


def _narrow(causal, window):
    return Band.of(causal, window, 1 << 20, 1 << 20).narrow(configs.LIMITS.narrow_window)


def test_narrow_sliding_windows_take_their_rows():
    assert _narrow(True, (1024, -1)) and _narrow(False, (1000, 1000))
    assert not _narrow(True, (-1, -1))  # causal alone: the long loops of the plain rows
    assert not _narrow(False, (1024, -1))  # unbounded on the right
    assert not _narrow(True, (configs.LIMITS.narrow_window, 0))  # wider than limits.narrow_window keys
    window = Band.of(True, (1024, -1), 4096, 4096)
    assert _call(band=window).kind == "window"
    for kernel in ("fwd", "dkdv", "dq"):
        rows = configs.TARGETS["cuda"][f"{kernel}+window"]
        assert plan.pick(_call(band=window), kernel) == next(r for r in rows if r.max_width >= 128)
        assert plan.pick(_call("gfx942", band=window), kernel) == \
            plan.pick(_call("gfx942"), kernel)  # no window rows there


def test_row_kind_precedence():
    causal, window = Band(-1, 0), Band(256, 0)
    assert _call(dropout=0.1).kind == "dropout" and _call(band=causal).kind == ""
    assert _call(band=window, dropout=0.1).kind == "window"
    assert _call(band=causal, kv_heads=4).kind == "gqa"
    assert _call(band=causal, dropout=0.1, kv_heads=4).kind == "dropout"  # dropout's rows win over gqa's
    assert _call(band=window, kv_heads=4, dtype=jnp.float8_e4m3fn).kind == "fp8"
    fp8_call = _call(dtype=jnp.float8_e4m3fn)
    assert plan.pick(fp8_call, "fwd") != plan.pick(_call(), "fwd")
    assert "fwd+fp8" not in configs.TARGETS["gfx950"]  # no fp8 rows there: the plain ones
    assert plan.pick(_call("gfx950", dtype=jnp.float8_e4m3fn), "fwd") == next(
        r for r in configs.TARGETS["gfx950"]["fwd"] if plan.fits(r, fp8_call.width, fp8_call.dtype))
    gqa = next(r for r in configs.TARGETS["cuda"]["dkdv+gqa"] if r.max_width >= 128)
    assert plan.pick(_call(kv_heads=4), "dkdv").num_stages == gqa.num_stages
    for kernel in ("dkdv", "dq"):
        rows = configs.TARGETS["cuda"][f"{kernel}+dropout"]
        assert plan.pick(_call(dropout=0.1), kernel) == next(r for r in rows if r.max_width >= 128)
    assert plan.pick(_call(dropout=0.1), "fwd") == plan.pick(_call(), "fwd")  # no forward dropout rows


def test_wide_heads_split_dkdv():
    """16-bit D 256 on cuda (and heads over 64 wide in the interpreter) compute dK and dV in separate
    programs: a third grid axis of 2 and SPLIT set. Narrower heads, float32 on cuda (whose rows of that
    width are for 16-bit inputs only) and the AMD targets: one program for both."""
    from jax_flash_amd import amd_report
    for target, d, dtype, split in (("cuda", 256, jnp.bfloat16, True), ("cuda", 256, jnp.float16, True),
                                    ("cuda", 128, jnp.float32, False), ("cuda", 128, jnp.bfloat16, False),
                                    ("interpret", 72, jnp.bfloat16, True), ("interpret", 64, jnp.float16, False),
                                    ("gfx942", 256, jnp.bfloat16, False)):
        launches = dict(amd_report.record_launches(target, d, dtype, False))
        dkdv = launches["dkdv"]
        assert dkdv.constexprs["SPLIT"] is split and dkdv.grid[2] == (2 if split else 1), (target, d, dtype)
        for launch in launches.values():
            assert not {"max_width", "min_width", "max_itemsize", "SPLIT"} & set(launch.compile_options)
    assert plan.pick(_call(head_dim=256), "dq").block_m == 128
    assert plan.pick(_call(dtype=jnp.float32), "dq").block_m == 64
    assert all(r.max_itemsize >= 4 for r in autotune.candidates("cuda", "dkdv", 128, jnp.float32))
    assert any(r.split for r in autotune.candidates("cuda", "dkdv", 256, jnp.bfloat16))


def test_buckets_are_coarse():
    assert autotune.bucket(1, 1) == autotune.bucket(700, 1024) == 1024
    assert autotune.bucket(1025, 10) == autotune.bucket(4000, 4096) == 4096
    assert autotune.bucket(16384, 5) == 16384 and autotune.bucket(16385, 5) is None


def test_candidates_are_few_and_cover_every_width():
    for target, kernels in configs.CANDIDATES.items():
        for kernel in ("fwd", "dkdv", "dq"):
            for d in (16, 64, 128, 256):
                for dtype in (jnp.float16, jnp.float32):
                    rows = autotune.candidates(target, kernel, d, dtype)
                    assert 1 <= len(rows) <= 8, (target, kernel, d, dtype)


@pytest.fixture
def tuning(monkeypatch):
    """Autotuning on, an empty table, and a count of tunings. (The interpreter's candidates are two per kernel; on a
    GPU every candidate of the call's width is timed, each a Triton compile.)"""
    tuned = []
    original = autotune._tune

    def counting(run_, target, kernel, *args):
        tuned.append(kernel)
        return original(run_, target, kernel, *args)

    monkeypatch.setattr(autotune, "_tune", counting)
    autotune.forget()
    with autotune.enabled():
        yield tuned
    autotune.forget()


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_tunes_once_per_bucket_and_stays_exact(impl, tuning):
    for sq in (40, 29):  # same length bucket: the second call reuses the first call's choices
        q, k, v, dout, dlse = inputs((1, sq, 2, 40), (1, sq + 3, 2, 40), jnp.float16, seed=sq)
        got = run(impl, q, k, v, dout, dlse, causal=True)
        base = run("xla", q, k, v, dout, dlse, causal=True)
        assert_close(got, oracle.attention(q, k, v, dout, dlse, causal=True), base, jnp.float16)
    assert sorted(tuning) == ["dkdv", "dq", "fwd"]
    table = autotune.table()
    assert len(table) == 3
    for (target, kernel, *_), row in table.items():
        assert row in configs.CANDIDATES[target][kernel]


def test_off_by_default_and_context_restores():
    assert not autotune.is_enabled()
    with autotune.enabled():
        assert autotune.is_enabled()
    assert not autotune.is_enabled()


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_tunes_on_the_calls_band(impl, tuning, monkeypatch):
    """A sliding-window call is tuned on its own band, not on a full causal problem, and its key says
    so (row kind and band), apart from a plain causal call's."""
    seen = []
    tune = autotune._tune

    def recording(run_, *args):
        def run_and_record(launch):
            params = inspect.signature(launch.kernel.fn).parameters
            named = dict(zip(params, launch.args))
            if "lo_off" in named:
                seen.append((named["lo_off"], named["hi_off"], launch.constexprs["BANDED"]))
            return run_(launch)
        return tune(run_and_record, *args)

    monkeypatch.setattr(autotune, "_tune", recording)
    sq = 45
    q, k, v, dout, dlse = inputs((1, sq, 2, 40), (1, sq, 2, 40), jnp.float16, seed=3)
    got = run(impl, q, k, v, dout, dlse, causal=True, window_size=(9, 0))
    base = run("xla", q, k, v, dout, dlse, causal=True, window_size=(9, 0))
    assert_close(got, oracle.attention(q, k, v, dout, dlse, causal=True, window=(9, 0)), base, jnp.float16)
    assert seen and set(seen) == {(-9, 0, 3)}, set(seen)  # both sides bounded
    keys = set(autotune.table())
    assert {key[4:6] for key in keys} == {("window", (9, 0))}
    run(impl, q, k, v, dout, dlse, causal=True)  # plain causal: tuned again, under its own keys
    assert {key[4:6] for key in set(autotune.table()) - keys} == {("", (-1, 0))}


# Which kernels autotuning tunes for an sm90 call (2 x 4096 x 16 x 128 bf16, causal), in a process of its own: whether
# the kernels are compiled or interpreted is fixed when triton is first imported (TRITON_INTERPRET), and only compiled
# ones may take the Gluon kernels. The tuning itself is faked: it takes the call's default row (plan.pick).
_TUNED = """
import json, sys
import jax, jax.numpy as jnp
from jax_flash_amd import _jax_triton_compat, _launch, autotune, plan
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band
_jax_triton_compat.versions = lambda: {"jax-triton": (0, 3, 1), "triton": (3, 6, 0), "jax": (0, 11, 2)}
tuned = []

def fake(run_, target, kernel, q, k, statics, chosen):
    tuned.append(kernel)
    b, sq, h, d = q.shape
    return plan.pick(plan.Call(target, b, sq, k.shape[1], h, k.shape[2], d, jnp.dtype(q.dtype).name), kernel)

autotune._tune = fake
q = jax.ShapeDtypeStruct((2, 4096, 16, 128), jnp.bfloat16)
statics = _launch.Statics(128 ** -0.5, Band.of(True, (-1, -1), 4096, 4096))
ids = jnp.zeros((2, 4096), jnp.int32)
found = {"interpreted": plan.interpreted()}
with autotune.enabled():
    for name, extras in (("plain", Operands()), ("segments", Operands(q_segment_ids=ids, kv_segment_ids=ids))):
        autotune.forget()
        tuned.clear()
        autotune.rows_for(None, "sm90", q, q, extras, statics, ("fwd", "dkdv", "dq", "dqds"))
        found[name] = list(tuned)
print(json.dumps(found))
"""


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_tunes_the_dq_kernel_of_the_path_the_call_takes(compiled):
    """On sm90 (D 128, bf16) a plain backward takes the dS path ("dqds"); with segment ids dK/dV takes its
    pointer row and the seven products ("dq"): that is the dQ kernel tuned (no GPU: the tuning is faked). Compiled
    (jax-triton 0.3.x), a plain call's dK/dV and long forward are the Gluon kernels: not tuned."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(JAX_PLATFORMS="cpu", **({} if compiled else {"TRITON_INTERPRET": "1"}))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))  # the package beside the tests
    proc = subprocess.run([sys.executable, "-c", _TUNED], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["interpreted"] == (not compiled), found
    assert found["plain"] == ([] if compiled else ["fwd", "dkdv"]) + ["dqds"], found
    assert found["segments"] == ["fwd", "dkdv", "dq"], found


def test_every_target_keyed_table_knows_every_target():
    """A target added to configs.TARGETS (e.g. "sm90") must be in every table keyed by target, or calls on
    that GPU fail with a KeyError deep in a launch."""
    from jax_flash_amd import fp8

    for name, table in (("CANDIDATES", configs.CANDIDATES), ("DECODE_SPLITS", configs.DECODE_SPLITS),
                        ("fp8.SUPPORTED", fp8.SUPPORTED)):
        assert set(table) == set(configs.TARGETS), name
