"""The linear backward (plan.Policy(linear_backward=True), kernels/bwd.py attn_bwd_dkdv_dq): one pass of five
products per tile, dQ summed in a float32 buffer of Q's size, in key-block order (deterministic) or by atomics
(deterministic=False); against float64 with every variant the dK/dV kernel takes, its plan and its memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
import oracle
from helpers import KERNEL_IMPLS, ON_GPU, assert_close, inputs
from jax_flash_amd import _dispatch, _launch, plan, reference
from jax_flash_amd.operands import Operands

LINEAR = plan.Policy(linear_backward=True)

CASES = {  # B 2, H 4 unless said; odd lengths, head dims padded in the kernels
    "causal-gqa": dict(causal=True, h_kv=2),
    "plain": dict(),
    "window": dict(window=(9, 4)),
    "softcap-alibi": dict(causal=True, softcap=4.0, alibi=True),
    "dropout": dict(causal=True, dropout=0.2),
    "segments": dict(segments=True),
    "bias-mask": dict(bias=True, mask=True, causal=True),
    "split-d96": dict(d=96, causal=True),  # the interpreter's SPLIT row: dV in a launch of its own
    "mqa-bf16": dict(h_kv=1, dtype=jnp.bfloat16, causal=True),
    "seq_q>seq_k": dict(sq=70, sk=33, causal=True),
    # long rows of ragged blocks: a deep chain of turns, segment ranges ending mid-block
    "long-segments-gqa": dict(sq=150, sk=170, h_kv=2, segments=True, causal=True),
}


def case(name, seed=0):
    c = {**dict(sq=45, sk=53, d=40, h_kv=4, dtype=jnp.float32, causal=False, window=(-1, -1), softcap=0.0,
                alibi=False, dropout=0.0, segments=False, bias=False, mask=False), **CASES[name]}
    b, h, sq, sk = 2, 4, c["sq"], c["sk"]
    q, k, v, dout, dlse = inputs((b, sq, h, c["d"]), (b, sk, c["h_kv"], c["d"]), c["dtype"], seed=seed)
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    ref = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"])
    if c["alibi"]:
        kw["alibi_slopes"] = ref["alibi"] = jnp.linspace(0.1, 0.9, b * h, dtype=jnp.float32).reshape(b, h)
    if c["segments"]:
        q_ids = jnp.repeat(jnp.arange(3), -(-sq // 3))[None, :sq].repeat(b, 0)
        kv_ids = jnp.repeat(jnp.arange(3), -(-sk // 3))[None, :sk].repeat(b, 0)
        kw.update(q_segment_ids=q_ids, kv_segment_ids=kv_ids)
        ref["segments"] = (q_ids, kv_ids)
    if c["dropout"]:
        rng = jax.random.key(7)
        kw.update(dropout_p=c["dropout"], dropout_rng=rng)
        keep = reference.dropout_keep(reference.dropout_seeds(rng, b, h), sq, sk, c["dropout"])
        ref.update(dropout_p=c["dropout"], keep=keep)
    if c["bias"]:
        kw["bias"] = ref["bias"] = jax.random.normal(jax.random.key(3), (1, h, sq, sk), jnp.float32)
    if c["mask"]:
        kw["mask"] = ref["mask"] = (jnp.arange(sk)[None, :] < jnp.array([sk - 7, 5])[:, None])[:, None, None, :]
    return (q, k, v, dout, dlse), kw, ref, c["dtype"]


def grads(impl, q, k, v, dout, dlse, kw, policy=plan.DEFAULT, deterministic=True):
    """dict(out, lse, dq, dk, dv[, dbias]) of a forward and a vjp with random cotangents, planned with `policy`."""
    bias = kw.get("bias")
    rest = {n: x for n, x in kw.items() if n != "bias"}

    def fwd_bwd(q, k, v, bias, dout, dlse):
        def f(q, k, v, bias):
            return jax_flash_amd.attention(q, k, v, bias=bias, return_lse=True, implementation=impl,
                                           deterministic=deterministic, **rest)

        (out, lse), vjp = jax.vjp(f, q, k, v, bias)
        dq, dk, dv, dbias = vjp((dout, dlse))
        got = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
        return got if bias is None else dict(got, dbias=dbias)

    with plan.using(policy):
        return jax.jit(fwd_bwd)(q, k, v, bias, dout, dlse)


# the ordered sum with every case; atomics (the same tiles, another way to add them) with a few
MATRIX = [(name, True) for name in CASES] + [(name, False) for name in ("causal-gqa", "bias-mask", "split-d96")]


@pytest.mark.matrix
@pytest.mark.parametrize("name,deterministic", MATRIX, ids=[f"{n}-{'ordered' if d else 'atomics'}" for n, d in MATRIX])
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_linear_backward_against_float64(impl, name, deterministic):
    if deterministic and _dispatch.backend(impl)[1] in plan.AMD_TARGETS:
        pytest.skip("AMD plans no ordered sum (plan_backward)")
    (q, k, v, dout, dlse), kw, ref_kw, dtype = case(name)
    with plan.using(LINEAR):
        explained = jax_flash_amd.explain(q, k, v, implementation=impl, deterministic=deterministic, **kw)
    dkdv = explained.backward.step("dkdv")
    assert dkdv.kernel == "attn_bwd_dkdv_dq" and dkdv.flags["DQ"] == (2 if deterministic else 1)
    assert (explained.backward.step("dv") is not None) == dkdv.row.split
    got = grads(impl, q, k, v, dout, dlse, kw, LINEAR, deterministic)
    ref = oracle.attention(q, k, v, dout, dlse, **ref_kw)
    base = grads("xla", q, k, v, dout, dlse, kw)
    assert_close(got, ref, base, dtype, names=tuple(got))


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_linear_backward_is_bitwise_repeatable(impl):
    """The default (ordered) sum gives the same bits every run; on a GPU the programs race, so this is the test
    that the locks order them (10 runs, as FlashAttention's deterministic mode is checked)."""
    (q, k, v, dout, dlse), kw, _, _ = case("causal-gqa")
    if impl == "triton":  # long enough that many programs of one query block run at once
        q, k, v, dout, dlse = inputs((2, 2048, 8, 128), (2, 2048, 2, 128), jnp.bfloat16)
    first = grads(impl, q, k, v, dout, dlse, kw, LINEAR)
    for _ in range(10 if impl == "triton" else 2):
        again = grads(impl, q, k, v, dout, dlse, kw, LINEAR)
        for name in ("dq", "dk", "dv"):
            np.testing.assert_array_equal(np.asarray(again[name]), np.asarray(first[name]), err_msg=name)


GLUON_CASES = {  # D 128, 16-bit: the Gluon kernel (attn_bwd_dkdvdq_sm90); B 2, lengths ragged where said
    "causal-gqa-ragged": dict(sq=1000, h=8, h_kv=2, causal=True),
    "plain": dict(sq=1024, h=4, h_kv=4),
    "window": dict(sq=1024, h=4, h_kv=4, window=(300, 0)),
    "softcap-alibi": dict(sq=768, h=4, h_kv=4, causal=True, softcap=20.0, alibi=True),
    "dropout-fp16": dict(sq=640, h=4, h_kv=2, causal=True, dropout=0.15, dtype=jnp.float16),
    "seq_q<seq_k": dict(sq=384, sk=1000, h=4, h_kv=4, causal=True),
}


@pytest.mark.gpu
@pytest.mark.skipif(_dispatch.backend("triton")[1] != "sm90" if ON_GPU else True, reason="needs an sm90 GPU")
@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "atomics"])
@pytest.mark.parametrize("name", list(GLUON_CASES))
def test_gluon_linear_backward_against_float64(name, deterministic):
    c = {**dict(sk=None, dtype=jnp.bfloat16, causal=False, window=(-1, -1), softcap=0.0, alibi=False, dropout=0.0),
         **GLUON_CASES[name]}
    b, h, sq, sk = 2, c["h"], c["sq"], c["sk"] or c["sq"]
    q, k, v, dout, dlse = inputs((b, sq, h, 128), (b, sk, c["h_kv"], 128), c["dtype"], seed=3)
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    ref = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"])
    if c["alibi"]:
        kw["alibi_slopes"] = ref["alibi"] = jnp.linspace(0.1, 0.9, b * h, dtype=jnp.float32).reshape(b, h)
    if c["dropout"]:
        rng = jax.random.key(7)
        kw.update(dropout_p=c["dropout"], dropout_rng=rng)
        ref.update(dropout_p=c["dropout"],
                   keep=reference.dropout_keep(reference.dropout_seeds(rng, b, h), sq, sk, c["dropout"]))
    with plan.using(LINEAR):
        dkdv = jax_flash_amd.explain(q, k, v, deterministic=deterministic, **kw).backward.step("dkdv")
    assert dkdv.kernel == "attn_bwd_dkdvdq_sm90" and dkdv.flags["DQ"] == (2 if deterministic else 1)
    got = grads("triton", q, k, v, dout, dlse, kw, LINEAR, deterministic)
    assert_close(got, oracle.attention(q, k, v, dout, dlse, **ref), grads("xla", q, k, v, dout, dlse, kw), c["dtype"])


def test_sm90_plans_the_gluon_linear_backward_at_d128():
    """On sm90 a 16-bit D 128 call takes the Gluon kernel, a lock per query block and dQ half where ordered."""
    x = jax.ShapeDtypeStruct((2, 1000, 8, 128), jnp.bfloat16)
    for deterministic in (True, False):
        with plan.using(LINEAR):
            backward = jax_flash_amd.explain(x, x, x, causal=True, target="sm90", deterministic=deterministic).backward
        step = backward.step("dkdv")
        assert step.kernel == "attn_bwd_dkdvdq_sm90" and step.flags["DQ"] == (2 if deterministic else 1)
        assert step.workspace == 2 * 1000 * 8 * 128 * 4 + (2 * 8 * -(-1000 // 64) * 2 * 4 if deterministic else 0)
    y = jax.ShapeDtypeStruct((2, 1000, 8, 64), jnp.bfloat16)  # no Gluon row at D 64: the pointer row
    with plan.using(LINEAR):
        assert jax_flash_amd.explain(y, y, y, target="sm90").backward.step("dkdv").kernel == "attn_bwd_dkdv_dq"


@pytest.mark.parametrize("target", ["sm90", "gfx942", "interpret"])
def test_linear_backward_memory_is_linear_in_the_sequence(target):
    """Its workspace is the float32 dQ sum, the locks and delta: exactly linear in N, where the dS path's grows
    with N^2 (until it splits into head groups)."""
    def backward(n, policy, deterministic=True):
        x = jax.ShapeDtypeStruct((2, n, 16, 128), jnp.bfloat16)
        with plan.using(policy):
            return jax_flash_amd.explain(x, x, x, causal=True, target=target, deterministic=deterministic).backward

    for n in (4096, 8192):
        ordered = backward(n, LINEAR)
        if target in plan.AMD_TARGETS:  # no ordered sum there: the default plan
            assert ordered.steps == backward(n, plan.DEFAULT).steps
        else:
            step = ordered.step("dkdv")  # the Gluon kernel's locks: one per dQ half
            locks = 2 * 16 * -(-n // step.row.block_m) * 4 * (2 if step.kernel == "attn_bwd_dkdvdq_sm90" else 1)
            assert ordered.workspace == 2 * n * 16 * 128 * 4 + locks + 2 * 16 * n * 4
        assert backward(n, LINEAR, deterministic=False).workspace == 2 * n * 16 * 128 * 4 + 2 * 16 * n * 4
    if target == "sm90":  # the dS path it is to replace
        assert backward(8192, plan.DEFAULT).workspace > 8 * backward(8192, LINEAR).workspace


def test_the_default_plan_takes_no_linear_backward():
    """Not run on a GPU yet: no default plan takes it, on any target."""
    x = jax.ShapeDtypeStruct((2, 512, 8, 64), jnp.bfloat16)
    for target in ("sm90", "cuda", "gfx942", "interpret"):
        for deterministic in (True, False):
            explained = jax_flash_amd.explain(x, x, x, causal=True, target=target, deterministic=deterministic)
            assert not {"attn_bwd_dkdv_dq", "attn_bwd_dkdvdq_sm90"} & set(explained.backward.kernels)


@pytest.mark.slow
@pytest.mark.parametrize("gluon", [False, True], ids=["pointer", "gluon"])
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_every_lock_counts_every_key_block(impl, gluon):
    """The ordered sum's locks end at the number of key blocks: each key block visited or passed each query block
    of each of its query heads exactly once (one too few hangs the next key block, one too many skips a turn).
    gluon: sm90's Gluon kernel (D 128, 16-bit, a window: key blocks that pass query blocks on both sides)."""
    run, target = _dispatch.backend(impl)
    if target in plan.AMD_TARGETS:
        pytest.skip("AMD plans no ordered sum (plan_backward)")
    if gluon and target != "sm90":
        pytest.skip("the Gluon kernel runs on sm90")
    if gluon:
        q, k, v, dout, dlse = inputs((2, 1000, 8, 128), (2, 1100, 2, 128), jnp.bfloat16)
        extras, band = Operands(), plan.Band.of(False, (200, 100), 1000, 1100)
    else:
        (q, k, v, dout, dlse), kw, _, _ = case("long-segments-gqa")
        extras = Operands(q_segment_ids=kw["q_segment_ids"], kv_segment_ids=kw["kv_segment_ids"])
        band = plan.Band.of(True, (-1, -1), q.shape[1], k.shape[1])
    statics = _launch.Statics(q.shape[-1] ** -0.5, band)
    locks = []

    def recording(launch):
        outs = run(launch)
        if launch.kernel.__name__ in ("attn_bwd_dkdv_dq", "attn_bwd_dkdvdq_sm90") and launch.constexprs["DQ"] == 2:
            locks.append((launch.grid[0], np.asarray(outs[3])))
        return outs

    out, lse2 = _launch.forward(run, target, q, k, v, extras, statics=statics)
    _launch.backward(recording, target, q, k, v, out, lse2, dout, dlse, extras, statics=statics, policy=LINEAR)
    (key_blocks, counts), = locks
    step = plan.plan_backward(plan.Call.of(target, q, k, extras, statics, LINEAR)).step("dkdv")
    assert (step.kernel == "attn_bwd_dkdvdq_sm90") == gluon
    halves = (2,) if gluon else ()
    assert counts.shape == (2, q.shape[2], -(-q.shape[1] // step.row.block_m), *halves)
    assert np.all(counts == key_blocks)


def test_deterministic_is_a_bool():
    x = jnp.zeros((1, 8, 2, 16))
    with pytest.raises(TypeError, match="deterministic must be a Python bool"):
        jax_flash_amd.attention(x, x, x, deterministic=1)
