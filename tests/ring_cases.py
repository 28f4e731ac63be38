"""Ring attention cases, run by test_ring.py in a process with 8 CPU host devices (XLA_FLAGS must be set
before jax starts, hence a process of their own).

Every numeric case compares the ring (inside shard_map, sequence split over a mesh axis) with the
unsharded `attention` of the same implementation on the whole sequence: out, lse and the gradients of
a vjp with random cotangents on both out and lse. The interpreter (a host callback, one kernel at a
time) gets few, tiny cases; the pure-JAX "xla" implementation the combinations.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flash_amd
import oracle
from helpers import assert_close, inputs
from jax_flash_amd import reference, ring

NAMES = ("out", "lse", "dq", "dk", "dv")


def _mesh(n, shape=None, names=("seq",)):
    assert jax.device_count() >= 8, "run through test_ring.py (8 host devices)"
    return Mesh(np.array(jax.devices()[:n]).reshape(shape or (n,)), names)


def _ring(mesh, layout="contiguous", seq_axis="seq", data_axis=None, ids=False, **kw):
    """f(q, k, v[, q_ids, kv_ids]) -> (out, lse) on global arrays in natural order: zig-zagged if asked,
    sequence sharded over seq_axis (batch over data_axis), ring_attention, and back."""
    n = int(np.prod([mesh.shape[a] for a in (seq_axis if isinstance(seq_axis, tuple) else (seq_axis,))]))
    seq, ids_spec, lse_spec = P(data_axis, seq_axis), P(data_axis, seq_axis), P(data_axis, None, seq_axis)
    inner = jax.shard_map(
        lambda q, k, v, *i: ring.ring_attention(q, k, v, axis_name=seq_axis, layout=layout, return_lse=True,
                                                **kw, **(dict(q_segment_ids=i[0], kv_segment_ids=i[1]) if i else {})),
        mesh=mesh, in_specs=(seq,) * 3 + ((ids_spec,) * 2 if ids else ()), out_specs=(seq, lse_spec))
    order = (lambda x, axis=1: ring.zigzag(x, n, axis)) if layout == "zigzag" else (lambda x, axis=1: x)
    back = (lambda x, axis=1: ring.unzigzag(x, n, axis)) if layout == "zigzag" else (lambda x, axis=1: x)

    def f(q, k, v, *i):
        out, lse = inner(*(order(x) for x in (q, k, v, *i)))
        return back(out), back(lse, 2)

    return f


def _jit_vjp(f):
    """jit of (q, k, v, dout, dlse, *const) -> dict(out, lse, dq, dk, dv): forward and backward in one
    program, one XLA compile (most of these tests' time)."""
    @jax.jit
    def both(q, k, v, dout, dlse, *const):
        (out, lse), pull = jax.vjp(lambda q, k, v: f(q, k, v, *const), q, k, v)
        dq, dk, dv = pull((dout, dlse))
        return dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)

    return both


def _vjp(f, *args):
    return _jit_vjp(f)(*args)


def _unsharded(impl, q, k, v, dout, dlse, ids=None, **kw):
    def f(q, k, v, *ids):
        seg = dict(q_segment_ids=ids[0], kv_segment_ids=ids[1]) if ids else {}
        return jax_flash_amd.attention(q, k, v, return_lse=True, implementation=impl, **kw, **seg)

    return _vjp(f, q, k, v, dout, dlse, *(ids or ()))


def _assert_same(got, want, tol):
    """Max error <= tol * the tensor's scale; -inf lse rows equal; no NaN (float32 inputs: the ring only
    sums the same terms in another order)."""
    for name in NAMES:
        g, w = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
        assert not np.isnan(g).any(), f"{name}: NaN"
        if name == "lse":
            np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg="lse: -inf rows differ")
            g, w = g[np.isfinite(w)], w[np.isfinite(w)]
        err, scale = np.max(np.abs(g - w)), max(1.0, np.max(np.abs(w)))
        assert err <= tol * scale, f"{name}: max error {err:.3g} > {tol * scale:.3g}"


def _segments(b, s, t=None):
    """Sorted, packed ids whose boundaries fall inside chunks, and kv ids lacking id 2 for some queries
    (those rows see no key: out 0, lse -inf, zero gradients)."""
    t = t or s
    q_ids = np.broadcast_to(np.arange(s) * 5 // s, (b, s)).copy()
    kv_ids = np.broadcast_to(np.arange(t) * 5 // t, (b, t)).copy()
    kv_ids[kv_ids == 2] = 1  # queries of segment 2 find no key
    q_ids[1:, : s // 3] = 7  # batch rows differ
    kv_ids[1:, : t // 3] = 7
    return jnp.asarray(q_ids, jnp.int32), jnp.asarray(kv_ids, jnp.int32)


B, H, HKV, D = 2, 4, 2, 16
TOL = 2e-5


@pytest.mark.parametrize("causal, layout", [(False, "contiguous"), (False, "zigzag"), (True, "contiguous"),
                                            (True, "zigzag")], ids=["full", "full-zigzag", "causal", "causal-zigzag"])
def test_xla_ring_matches_unsharded(causal, layout):
    n, local = 8, 16  # zig-zag chunks of 8 positions
    q, k, v, dout, dlse = inputs((B, n * local, H, D), (B, n * local, HKV, D), jnp.float32, seed=1)
    f = _jit_vjp(_ring(_mesh(n), layout, causal=causal, implementation="xla"))
    got = f(q, k, v, dout, dlse)
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse, causal=causal), TOL)
    again = f(q, k, v, dout, dlse)  # a fixed order of steps and sums: deterministic
    for name in NAMES:
        np.testing.assert_array_equal(np.asarray(again[name]), np.asarray(got[name]), err_msg=name)


@pytest.mark.parametrize("causal, layout", [(False, "contiguous"), (True, "contiguous"), (True, "zigzag")],
                         ids=["full", "causal", "causal-zigzag"])
def test_xla_ring_softcap_segments_scale(causal, layout):
    n, local = 4, 12
    q, k, v, dout, dlse = inputs((B, n * local, H, D), (B, n * local, HKV, D), jnp.float32, seed=2, q_scale=4.0)
    ids = _segments(B, n * local)
    kw = dict(causal=causal, softcap=3.0, softmax_scale=0.4)
    got = _vjp(_ring(_mesh(n), layout, ids=True, implementation="xla", **kw), q, k, v, dout, dlse, *ids)
    want = _unsharded("xla", q, k, v, dout, dlse, ids, **kw)
    assert np.isneginf(np.asarray(want["lse"])).any(), "the case should hold rows that see no key"
    _assert_same(got, want, TOL)


def test_xla_cross_attention_unequal_shards():
    """Non-causal, seq_q != seq_k: the ring needs no positions."""
    n = 4
    q, k, v, dout, dlse = inputs((B, n * 6, H, D), (B, n * 10, HKV, D), jnp.float32, seed=3)
    got = _vjp(_ring(_mesh(n), implementation="xla"), q, k, v, dout, dlse)
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse), TOL)


def _keyed(kw):
    """kw with the dropout key and ALiBi slopes the names ask for (same for the ring and unsharded)."""
    kw = dict(kw)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = jnp.linspace(0.05, 0.6, H)  # (heads_q,): broadcast over the batch
    if kw.get("dropout_p"):
        kw["dropout_rng"] = jax.random.key(17)
    return kw


# window, ALiBi and dropout: every call gets its block's global positions (Operands.positions)
@pytest.mark.parametrize("causal, layout, window", [(True, "contiguous", (20, 0)), (True, "zigzag", (20, 0)),
                                                    (False, "contiguous", (12, 30)), (False, "zigzag", (12, 30))],
                         ids=["causal", "causal-zigzag", "full", "full-zigzag"])
def test_xla_ring_window(causal, layout, window):
    """Windows a block or two wide over 8 devices: most steps' calls are skipped, the rest cut."""
    n, local = 8, 16
    q, k, v, dout, dlse = inputs((B, n * local, H, D), (B, n * local, HKV, D), jnp.float32, seed=12)
    kw = dict(causal=causal, window_size=window)
    got = _vjp(_ring(_mesh(n), layout, implementation="xla", **kw), q, k, v, dout, dlse)
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse, **kw), TOL)


@pytest.mark.parametrize("kw, layout", [
    (dict(causal=True, alibi=True), "zigzag"),
    (dict(alibi=True, window_size=(24, 3), softcap=2.0), "contiguous"),
    (dict(causal=True, dropout_p=0.25), "contiguous"),
    (dict(causal=True, dropout_p=0.25, alibi=True, window_size=(40, 0)), "zigzag"),
], ids=["alibi-causal-zigzag", "alibi-window-softcap", "dropout-causal", "dropout-alibi-window-zigzag"])
def test_xla_ring_alibi_dropout(kw, layout):
    """ALiBi on global distances; dropout the unsharded call's mask (so the same outputs and gradients), with
    shards of any length (dropout: 12 positions, zig-zag chunks of 6)."""
    n = 4 if layout == "zigzag" else 8
    local = 12 if "dropout_p" in kw else 16
    q, k, v, dout, dlse = inputs((B, n * local, H, D), (B, n * local, HKV, D), jnp.float32, seed=13)
    kw = _keyed(kw)
    got = _vjp(_ring(_mesh(n), layout, implementation="xla", **kw), q, k, v, dout, dlse)
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse, **kw), TOL)


def test_xla_cross_attention_window_alibi_dropout():
    """seq_q != seq_k: the global diagonal (bottom-right aligned) is not any block's own."""
    n = 4
    q, k, v, dout, dlse = inputs((B, n * 16, H, D), (B, n * 32, HKV, D), jnp.float32, seed=14)
    kw = _keyed(dict(window_size=(40, 8), alibi=True, dropout_p=0.2))
    got = _vjp(_ring(_mesh(n), implementation="xla", **kw), q, k, v, dout, dlse)
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse, **kw), TOL)


@pytest.mark.parametrize("extra", [{}, dict(window_size=(20, 0), alibi=True)], ids=["", "window-alibi"])
def test_xla_data_by_sequence_mesh(extra):
    """2 data x 4 sequence: batch sharded too, the ring runs within each data row."""
    mesh = _mesh(8, (2, 4), ("data", "seq"))
    q, k, v, dout, dlse = inputs((4, 4 * 16, H, D), (4, 4 * 16, HKV, D), jnp.float32, seed=4)
    ids = _segments(4, 4 * 16)
    kw = _keyed(dict(causal=True, **extra))
    f = _ring(mesh, "zigzag", data_axis="data", ids=True, implementation="xla", **kw)
    got = _vjp(f, q, k, v, dout, dlse, *ids)
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse, ids, **kw), TOL)


def test_xla_sequence_only_shard_map_on_explicit_mesh():
    """shard_map manual over the sequence axis only, the data axis left Explicit (jax.make_mesh's
    default type): the ring's accumulators keep the batch sharding. (The interpreter cannot run here:
    JAX allows host callbacks only when every mesh axis is manual.)"""
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    q, k, v, dout, dlse = inputs((4, 4 * 16, H, D), (4, 4 * 16, HKV, D), jnp.float32, seed=9)
    f = jax.shard_map(lambda q, k, v: ring.ring_attention(q, k, v, axis_name="seq", causal=True, return_lse=True,
                                                          implementation="xla"),
                      in_specs=(P(None, "seq"),) * 3, out_specs=(P(None, "seq"), P(None, None, "seq")),
                      axis_names={"seq"})
    with jax.set_mesh(mesh):
        put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P("data", *spec)))  # noqa: E731
        got = _vjp(f, put(q, "seq"), put(k, "seq"), put(v, "seq"), put(dout, "seq"), put(dlse, None, "seq"))
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse, causal=True), TOL)


@pytest.mark.parametrize("impl, dtype, positional", [("xla", jnp.float16, False), ("interpret", jnp.bfloat16, False),
                                                     ("xla", jnp.bfloat16, True)],
                         ids=["xla-float16", "interpret-bfloat16", "xla-bfloat16-window-alibi-dropout"])
def test_16_bit_against_float64(impl, dtype, positional):
    """16-bit inputs under the tests' float64 rule (helpers.assert_close): the ring's error is within
    the bounds of the unsharded call's, though each step's partial output is rounded to the input
    dtype before the float32 merge."""
    n, local, b = 4, 16, (B if impl == "xla" else 1)
    layout = "zigzag"
    q, k, v, dout, dlse = inputs((b, n * local, H, 32), (b, n * local, HKV, 32), dtype, seed=5)
    kw, oracle_kw = dict(causal=True), {}
    if positional:
        kw = _keyed(dict(causal=True, window_size=(40, 0), alibi=True, dropout_p=0.2))
        seeds = reference.dropout_seeds(kw["dropout_rng"], b, H)
        oracle_kw = dict(window=(40, 0), alibi=jnp.broadcast_to(kw["alibi_slopes"], (b, H)), dropout_p=0.2,
                         keep=reference.dropout_keep(seeds, n * local, n * local, 0.2))
    got = _vjp(_ring(_mesh(n), layout, implementation=impl, **kw), q, k, v, dout, dlse)
    ref = oracle.attention(q, k, v, dout, dlse, causal=True, **oracle_kw)
    assert_close(got, ref, _unsharded("xla", q, k, v, dout, dlse, **kw), dtype)


@pytest.mark.parametrize("case", ["causal-zigzag-gqa-softcap-segments", "causal-contiguous", "full",
                                  "causal-zigzag-gqa-window-alibi-dropout", "full-window"])
def test_interpreter_ring_matches_unsharded(case):
    """The Triton kernels (interpreter), forward and backward per step with the global out/lse."""
    # zig-zag chunks of 12: ragged kernel blocks (interpreter blocks are 16 / 32), dropout's hash at any start
    n, local = 4, 24
    causal = case.startswith("causal")
    layout = "zigzag" if "zigzag" in case else "contiguous"
    heads_kv = 1 if "gqa" in case else 2
    q, k, v, dout, dlse = inputs((1, n * local, 2, D), (1, n * local, heads_kv, D), jnp.float32, seed=6)
    extra = dict(softcap=2.0) if "softcap" in case else {}
    if "window" in case:
        extra["window_size"] = (14, 0) if causal else (20, 9)
    if "alibi" in case:
        extra["alibi_slopes"] = jnp.array([[0.3, 0.1]])  # (batch, heads_q)
    if "dropout" in case:
        extra.update(dropout_p=0.3, dropout_rng=jax.random.key(4))
    ids = _segments(1, n * local) if "segments" in case else None
    f = _ring(_mesh(n), layout, ids=bool(ids), causal=causal, implementation="interpret", **extra)
    got = _vjp(f, q, k, v, dout, dlse, *(ids or ()))
    _assert_same(got, _unsharded("interpret", q, k, v, dout, dlse, ids, causal=causal, **extra), TOL)


@pytest.mark.parametrize("impl", ["xla", "interpret"])
def test_one_device_ring_is_plain_attention(impl):
    """A ring of one device is plain attention (no merge, no collective): bit for bit."""
    q, k, v, dout, dlse = inputs((1, 24, 2, D), (1, 24, 1, D), jnp.float32, seed=7)
    got = _vjp(_ring(_mesh(1), causal=True, implementation=impl), q, k, v, dout, dlse)
    want = _unsharded(impl, q, k, v, dout, dlse, causal=True)
    for name in NAMES:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


def _compiled_grad(impl, seq, n=8, layout="zigzag", **kw):
    mesh = _mesh(n)
    spec = P(None, "seq")
    f = jax.shard_map(lambda q, k, v: ring.ring_attention(q, k, v, axis_name="seq", causal=True, layout=layout,
                                                          implementation=impl, **kw),
                      mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    grad = jax.grad(lambda q, k, v, ct: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2))
    x = jax.ShapeDtypeStruct((1, seq, 2, D), jnp.float32, sharding=NamedSharding(mesh, spec))
    return jax.jit(grad).lower(x, x, x, x).compile()


@pytest.mark.parametrize("impl, kw", [("xla", {}), ("interpret", {}),
                                      ("xla", dict(window_size=(40, 0), alibi_slopes=jnp.ones(2), dropout_p=0.1,
                                                   dropout_rng=jax.random.key(0)))],
                         ids=["xla", "interpret", "xla-window-alibi-dropout"])
def test_compiled_forward_backward_only_permutes(impl, kw):
    """Positions come from the device index, dropout keys from the key on every device: no gathers."""
    text = _compiled_grad(impl, 8 * 32, layout="contiguous" if kw else "zigzag", **kw).as_text()
    assert re.search(r"collective-permute", text)
    assert not re.findall(r"all-gather|all-to-all|all-reduce|reduce-scatter", text)


def test_memory_grows_as_sequence_per_device():
    """Per-device temp memory of the compiled forward + backward depends on N / devices only: the same
    on 4 and 8 devices at equal shard length (a gather of K/V would double it), twice as much at twice
    the shard length. Measured on the interpreter path: its kernels run in a host callback, so XLA's
    temp buffers are the ring's own (K/V in flight, accumulators, per-step slices). (The xla
    implementation materialises each step's (N/n)^2 scores: quadratic in the shard, by design.)"""
    temp = {(n, local): _compiled_grad("interpret", n * local, n).memory_analysis().temp_size_in_bytes
            for n, local in ((4, 64), (8, 64), (8, 128))}
    assert temp[4, 64] == temp[8, 64], temp
    assert 1.7 <= temp[8, 128] / temp[8, 64] <= 2.2, temp


def test_zigzag_layout():
    n = 4
    x = jnp.arange(2 * 16 * 3).reshape(2, 16, 3)
    z = ring.zigzag(x, n, axis=1)
    chunks = np.asarray(z).reshape(2, n, 2, 2, 3)  # device, its two chunks, 2 positions
    for i in range(n):  # device i holds chunks i and 2n-1-i
        np.testing.assert_array_equal(chunks[:, i, 0], np.asarray(x)[:, 2 * i:2 * i + 2])
        np.testing.assert_array_equal(chunks[:, i, 1], np.asarray(x)[:, 2 * (2 * n - 1 - i):2 * (2 * n - i)])
    np.testing.assert_array_equal(np.asarray(ring.unzigzag(z, n, axis=-2)), np.asarray(x))
    with pytest.raises(ValueError, match="multiple of 8"):
        ring.zigzag(x[:, :12], n)


@pytest.mark.parametrize("kw, error, match", [
    (dict(window_size=(-2, 0)), ValueError, "window_size"),
    (dict(alibi_slopes=jnp.ones((3,))), ValueError, "alibi_slopes"),
    (dict(dropout_p=0.1), ValueError, "dropout_rng"),
    (dict(window_size=(4, 0), layout="zigzag", _local=(7, 7)), ValueError, "even"),
    (dict(layout="striped"), ValueError, "layout"),
    (dict(causal=True, layout="zigzag", axis_name="seq", _local=(7, 7)), ValueError, "even"),
    (dict(causal=True, _local=(8, 12)), ValueError, "equal"),
    (dict(axis_name="nope"), NameError, "nope"),
], ids=["window", "alibi", "dropout-no-key", "window-zigzag-odd", "layout", "zigzag-odd-shard", "causal-unequal-shards",
        "unbound-axis"])
def test_errors(kw, error, match):
    kw = dict(kw)
    sq, sk = kw.pop("_local", (8, 8))
    kw.setdefault("axis_name", "seq")
    mesh = _mesh(2)
    q, k = jnp.ones((1, 2 * sq, 2, D)), jnp.ones((1, 2 * sk, 2, D))
    f = jax.shard_map(lambda q, k: ring.ring_attention(q, k, k, implementation="xla", **kw), mesh=mesh,
                      in_specs=(P(None, "seq"),) * 2, out_specs=P(None, "seq"))
    with pytest.raises(error, match=match):
        f(q, k)


def test_exported():
    assert jax_flash_amd.ring_attention is ring.ring_attention
    assert jax_flash_amd.zigzag is ring.zigzag and jax_flash_amd.unzigzag is ring.unzigzag


@pytest.mark.parametrize("layout, window, launches", [("contiguous", (-1, -1), 4 + 6), ("zigzag", (-1, -1), 4 + 12),
                                                     ("contiguous", (8, 0), 4 + 3), ("zigzag", (8, 0), 8 + 7)],
                         ids=["contiguous", "zigzag", "window-contiguous", "window-zigzag"])
def test_causal_blocks_after_ours_are_skipped(monkeypatch, layout, window, launches):
    """Forward kernel launches of a causal ring over 4 devices, counted in the interpreter: contiguous,
    each device computes its diagonal and only the blocks before it (4 + 3+2+1+0, not 16); zig-zag, every
    device launches once per step (4 + 4 * 3), each off-diagonal launch on half the pairs. A window of
    8 keys back (half a block; one zig-zag chunk) reaches only the block before: contiguous, the 4
    diagonals and 3 blocks before them; zig-zag, one call per pair of chunks (a, a) and (a, a - 1)."""
    from jax_flash_amd import _interpret
    seen = []
    call = _interpret._call_on_host

    def counting(launch, *args):
        seen.append(launch.kernel.__name__)
        return call(launch, *args)

    monkeypatch.setattr(_interpret, "_call_on_host", counting)
    q = jnp.ones((1, 4 * 16, 2, D))
    spec = P(None, "seq")
    f = jax.jit(jax.shard_map(lambda q: ring.ring_attention(q, q, q, axis_name="seq", causal=True, layout=layout,
                                                            window_size=window, implementation="interpret"),
                              mesh=_mesh(4), in_specs=spec, out_specs=spec))
    jax.block_until_ready(f(q))
    assert seen.count("attn_fwd") == launches, seen


def _big_ids(ids, dtype):
    """ids (int32, 0 .. 7) mapped one to one onto values of dtype beyond int32 where it has them (uint32's top
    half; 64-bit values far outside int32, negative ones for int64)."""
    ids = np.asarray(ids, np.int64)
    if dtype == np.uint32:
        return (ids.astype(np.uint64) * 2**29 + 7).astype(np.uint32)
    if dtype == np.int64:
        return ids * 2**40 - 2**45
    if dtype == np.uint64:
        return ids.astype(np.uint64) * np.uint64(2**61) + np.uint64(5)
    return ids.astype(dtype)


@pytest.mark.parametrize("impl, dtype", [("xla", np.uint32), ("xla", np.int8), ("xla", np.uint16),
                                         ("interpret", np.uint32), ("xla", np.int64), ("xla", np.uint64),
                                         ("interpret", np.int64)],
                         ids=["xla-uint32", "xla-int8", "xla-uint16", "interpret-uint32", "xla-int64-x64",
                              "xla-uint64-x64", "interpret-int64-x64"])
def test_segment_ids_of_every_integer_type(impl, dtype):
    """Segment ids of any integer type mean the same on every device (kv ids travel to devices that compare
    them with their own q ids): the ring equals the unsharded call with int32 ids of the same pattern. 64-bit
    types under jax_enable_x64."""
    n, local = 4, 16
    wide = np.dtype(dtype).itemsize == 8
    with jax.enable_x64(wide):
        q, k, v, dout, dlse = inputs((B, n * local, H, D), (B, n * local, HKV, D), jnp.float32, seed=15)
        ids = _segments(B, n * local)
        big = tuple(jnp.asarray(_big_ids(x, dtype)) for x in ids)
        assert all(x.dtype == dtype for x in big)
        kw = dict(causal=True, softcap=2.0)
        got = _vjp(_ring(_mesh(n), "zigzag", ids=True, implementation=impl, **kw), q, k, v, dout, dlse, *big)
        want = _unsharded(impl, q, k, v, dout, dlse, ids, **kw)
    _assert_same(got, want, TOL)


@pytest.mark.parametrize("names, layout, extra", [
    (("b", "a"), "contiguous", {}), (("b", "a"), "zigzag", {}), (("a", "b"), "zigzag", {}),
    (("b", "a"), "zigzag", dict(window_size=(20, 0), alibi=True)),
], ids=["b-a-contiguous", "b-a-zigzag", "a-b-zigzag", "b-a-zigzag-window-alibi"])
def test_sequence_over_two_mesh_axes_in_either_order(names, layout, extra):
    """axis_name a tuple of mesh axes in the mesh's order or not: the sequence laid out as P(None, names) (the
    first major), the ring hands blocks on in that order."""
    mesh = _mesh(8, (2, 4), ("a", "b"))
    q, k, v, dout, dlse = inputs((B, 8 * 16, H, D), (B, 8 * 16, HKV, D), jnp.float32, seed=16)
    kw = _keyed(dict(causal=True, **extra))
    got = _vjp(_ring(mesh, layout, seq_axis=names, implementation="xla", **kw), q, k, v, dout, dlse)
    _assert_same(got, _unsharded("xla", q, k, v, dout, dlse, **kw), TOL)


def test_interpreter_sequence_over_two_mesh_axes_out_of_order():
    mesh = _mesh(4, (2, 2), ("a", "b"))
    q, k, v, dout, dlse = inputs((1, 4 * 16, 2, D), (1, 4 * 16, 1, D), jnp.float32, seed=17)
    got = _vjp(_ring(mesh, "zigzag", seq_axis=("b", "a"), causal=True, implementation="interpret"), q, k, v, dout,
               dlse)
    _assert_same(got, _unsharded("interpret", q, k, v, dout, dlse, causal=True), TOL)


def test_readme_ring_recipe_as_printed():
    """docs/distributed.md "Ring attention": the ring snippet verbatim (an Auto mesh; the default
    implementation), as the unsharded call."""
    q, k, v = inputs((1, 8 * 8, 2, D), (1, 8 * 8, 2, D), jnp.float32, seed=18)[:3]
    want = jax_flash_amd.attention(q, k, v, causal=True)
    # --- docs/distributed.md, verbatim ---
    from jax_flash_amd import ring_attention, zigzag, unzigzag
    mesh = jax.make_mesh((8,), ("seq",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = P(None, "seq")                                   # (batch, seq, heads, head_dim)
    ring = jax.shard_map(lambda q, k, v: ring_attention(q, k, v, axis_name="seq", causal=True, layout="zigzag"),
                         mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    out = unzigzag(jax.jit(ring)(*(zigzag(x, 8, axis=1) for x in (q, k, v))), 8, axis=1)
    # ---
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=TOL, rtol=TOL)


def test_ring_recipe_on_an_explicit_mesh():
    """The ring snippet on jax.make_mesh's default (Explicit) mesh, no context mesh: shard_map then takes inputs
    already sharded as in_specs (device_put after zigzag), and unzigzag reorders the sharded result."""
    q, k, v = inputs((1, 8 * 8, 2, D), (1, 8 * 8, 2, D), jnp.float32, seed=18)[:3]
    want = jax_flash_amd.attention(q, k, v, causal=True)
    from jax_flash_amd import ring_attention, zigzag, unzigzag
    mesh = jax.make_mesh((8,), ("seq",))
    spec = P(None, "seq")                                   # (batch, seq, heads, head_dim)
    ring = jax.shard_map(lambda q, k, v: ring_attention(q, k, v, axis_name="seq", causal=True, layout="zigzag"),
                         mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    q, k, v = (jax.device_put(zigzag(x, 8, axis=1), NamedSharding(mesh, spec)) for x in (q, k, v))
    out = unzigzag(jax.jit(ring)(q, k, v), 8, axis=1)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=TOL, rtol=TOL)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), 4)
