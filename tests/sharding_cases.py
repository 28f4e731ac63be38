"""Sharding cases, run by test_sharding.py in a process with 8 CPU devices (XLA_FLAGS must be set before
jax starts, hence a process of their own).

The partitioning rules of _spmd are checked with a pure-JAX stand-in for the kernels (the reference
forward and its vjp): the Triton interpreter, which runs the kernels on a CPU, is a host callback, and
JAX crashes on callbacks lowered inside a custom_partitioning rule (jax-ml/jax#23620), so the
interpreter path is left unpartitioned; it is checked for correct results under sharding and inside
shard_map. The compiled kernels take the partitioned path on GPUs (the GPU suite, 2 GPUs)."""
import contextlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flash_amd
from jax_flash_amd import _spmd, reference
from jax_flash_amd.operands import SPECS as OPERANDS

COLLECTIVES = r"all-gather|all-to-all|collective-permute|all-reduce|reduce-scatter"
B, S, T, H, D = 8, 40, 24, 8, 32


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() >= 8, "run through test_sharding.py (8 host devices)"
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def _inputs(dtype=jnp.float32, group=1):
    ks = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(ks[0], (B, S, H, D), dtype)
    k, v = (jax.random.normal(kk, (B, T, H // group, D), dtype) for kk in ks[1:3])
    dout = jax.random.normal(ks[3], (B, S, H, D), dtype)
    dlse = jax.random.normal(ks[4], (B, H, S), jnp.float32)
    slopes = jnp.linspace(0.01, 0.5, B * H, dtype=jnp.float32).reshape(B, H)
    seeds = reference.dropout_seeds(ks[4], B, H)
    q_ids, kv_ids = jnp.arange(S)[None, :] * 3 // S, jnp.arange(T)[None, :] * 3 // T  # three packed segments
    descales = (jnp.ones((B, H // group), jnp.float32),) * 3  # fp8 only: unused by 16/32-bit calls
    positions = jnp.stack([jnp.arange(B) * 16, jnp.full((B,), 32), jnp.full((B,), 8)], -1).astype(jnp.int32)
    variant = (slopes, seeds, jnp.broadcast_to(q_ids, (B, S)), jnp.broadcast_to(kv_ids, (B, T)), *descales, positions)
    return q, k, v, dout, dlse, variant


def _variant_shardings(mesh, spec):
    """Shardings of (slopes, seeds, q ids, kv ids, q/k/v descales, positions) that follow q's batch and heads."""
    return [NamedSharding(mesh, p) for p in (P(spec[0], spec[2]), P(spec[0], spec[2], None), P(spec[0], None),
                                             P(spec[0], None)) + (P(spec[0], spec[2]),) * 3 + (P(spec[0], None),)]


PARTITION_CALLS = []


def _stand_in_kernels(group=1):
    """(fwd, bwd) in pure JAX and the same wrapped by _spmd; the wrapped ones count how often _spmd's
    partition rule runs (XLA could shard the pure-JAX bodies by itself: the count shows ours did)."""
    scale = D ** -0.5

    def fwd(q, k, v, slopes, seeds, q_ids, kv_ids, q_descale, k_descale, v_descale, positions):
        # every variant operand in use: a shard computes the dropout mask from its own rows' keys and positions
        return tuple(reference.attention(q, k, v, causal=True, softmax_scale=scale, alibi_slopes=slopes,
                                         dropout_p=0.2, dropout_seeds=seeds, q_segment_ids=q_ids,
                                         kv_segment_ids=kv_ids, positions=positions))

    def bwd(q, k, v, slopes, seeds, q_ids, kv_ids, q_descale, k_descale, v_descale, positions, out, lse, dout, dlse):
        variant = (slopes, seeds, q_ids, kv_ids, q_descale, k_descale, v_descale, positions)
        return tuple(jax.vjp(lambda q, k, v: fwd(q, k, v, *variant), q, k, v)[1]((dout, dlse)))

    partition = _spmd._partition
    _spmd._partition = lambda *a: PARTITION_CALLS.append(a[0]) or partition(*a)
    try:
        # every per-row optional operand (the stand-ins take no dense bias or mask)
        fwd_rule, bwd_rule = _spmd.rules(tuple(spec.axes for spec in OPERANDS.values() if not spec.dense))
        return fwd, bwd, _spmd.wrap(fwd, fwd_rule, group), _spmd.wrap(bwd, bwd_rule, group)
    finally:
        _spmd._partition = partition


SPECS = [P("data", None, "model", None), P(("data", "model"), None, None, None), P(None, None, ("data", "model"), None)]


@pytest.mark.parametrize("group", [1, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("spec", SPECS, ids=["batch+heads", "batch", "heads"])
def test_batch_and_head_sharding_run_without_collectives(mesh, spec, group):
    head_axes = spec[2] if isinstance(spec[2], tuple) else (spec[2],) if spec[2] else ()
    if (H // group) % int(np.prod([mesh.shape[a] for a in head_axes])):
        pytest.skip(f"{H // group} key/value heads do not split over the {head_axes} axes")
    fwd, bwd, fwd_sharded, bwd_sharded = _stand_in_kernels(group)
    q, k, v, dout, dlse, variant = _inputs(group=group)
    sh = NamedSharding(mesh, spec)
    rows = NamedSharding(mesh, P(spec[0], spec[2], None))  # (batch, heads, seq)
    args = ([jax.device_put(x, sh) for x in (q, k, v)]
            + [jax.device_put(x, s) for x, s in zip(variant, _variant_shardings(mesh, spec))])
    f = jax.jit(fwd_sharded)
    PARTITION_CALLS.clear()
    out, lse = f(*args)
    assert PARTITION_CALLS == [fwd], "the forward was not partitioned by _spmd's rule"
    assert out.sharding.is_equivalent_to(sh, 4) and lse.sharding.is_equivalent_to(rows, 3)
    for got, want in zip((out, lse), fwd(q, k, v, *variant)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    assert not re.findall(COLLECTIVES, f.lower(*args).compile().as_text())

    bargs = args + [out, lse, jax.device_put(dout, sh), jax.device_put(dlse, rows)]
    PARTITION_CALLS.clear()
    g = jax.jit(bwd_sharded)
    grads = g(*bargs)
    assert PARTITION_CALLS == [bwd], "the backward was not partitioned by _spmd's rule"
    for got, want in zip(grads, bwd(q, k, v, *variant, *fwd(q, k, v, *variant), dout, dlse)):
        assert got.sharding.is_equivalent_to(sh, 4)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)
    assert not re.findall(COLLECTIVES, g.lower(*bargs).compile().as_text())


def test_sequence_sharding_is_gathered_with_a_warning(mesh):
    fwd, _, fwd_sharded, _ = _stand_in_kernels()
    q, k, v, _, _, variant = _inputs()
    sh = NamedSharding(mesh, P("data", "model", None, None))
    _spmd._warn_gather.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = jax.jit(fwd_sharded)(*[jax.device_put(x, sh) for x in (q, k, v)], *variant)
    assert any("gathered" in str(w.message) for w in caught)
    np.testing.assert_allclose(np.asarray(out), np.asarray(fwd(q, k, v, *variant)[0]), atol=1e-5, rtol=1e-5)


def test_stand_in_inside_shard_map(mesh):
    fwd, _, fwd_sharded, _ = _stand_in_kernels()
    q, k, v, _, _, variant = _inputs()
    spec = P("data", None, "model", None)
    variant_specs = tuple(s.spec for s in _variant_shardings(mesh, spec))
    f = jax.jit(jax.shard_map(lambda q, k, v, *var: fwd_sharded(q, k, v, *var)[0], mesh=mesh,
                              in_specs=(spec, spec, spec, *variant_specs), out_specs=spec))
    np.testing.assert_allclose(np.asarray(f(q, k, v, *variant)), np.asarray(fwd(q, k, v, *variant)[0]), atol=1e-5,
                               rtol=1e-5)


def _interpret_loss(q, k, v, dout):
    return jnp.sum(jax_flash_amd.attention(q, k, v, causal=True, implementation="interpret").astype(jnp.float32)
                   * dout.astype(jnp.float32))


def test_interpreter_under_sharding_and_shard_map(mesh):
    q, k, v, dout = (x[:2, :, :4] for x in _inputs(jnp.float16)[:4])
    want = jax.value_and_grad(_interpret_loss, argnums=(0, 1, 2))(q, k, v, dout)
    sh = NamedSharding(mesh, P("data", None, "model", None))
    args = [jax.device_put(x, sh) for x in (q, k, v, dout)]
    got = jax.jit(jax.value_and_grad(_interpret_loss, argnums=(0, 1, 2)))(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-3, rtol=2e-3)

    spec = P("data", None, "model", None)
    f = jax.jit(jax.shard_map(lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=True, implementation="interpret"),
                              mesh=mesh, in_specs=spec, out_specs=spec))
    out = f(*args[:3])
    assert out.sharding.is_equivalent_to(sh, 4)
    np.testing.assert_allclose(np.asarray(out, np.float32),
                               np.asarray(jax_flash_amd.attention(q, k, v, causal=True, implementation="interpret"),
                                          np.float32), atol=1e-3)


AXIS_TYPES = [jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit]
# every mesh-typed case runs on Auto and Explicit meshes (jax.make_mesh's default), each with and without a
# context mesh (jax.set_mesh): arrays put on an Explicit mesh carry it in their types, with no context
MESHES = pytest.mark.parametrize("axis_type, context", [(t, c) for t in AXIS_TYPES for c in (False, True)],
                                 ids=["auto", "auto-context", "explicit", "explicit-context"])


def _typed_mesh(axis_type):
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)


def _context(mesh, on: bool):
    return jax.set_mesh(mesh) if on else contextlib.nullcontext()


def _small(dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(3), 4)
    q, k, v = (jax.random.normal(kk, (4, 24, 4, 16), dtype) for kk in ks[:3])  # heads: one per "model" device
    ct = jax.random.normal(ks[3], (4, 24, 4, 16), jnp.float32)
    return q, k, v, ct


def _loss(impl, **kw):
    def loss(q, k, v, ct):
        return jnp.sum(jax_flash_amd.attention(q, k, v, causal=True, implementation=impl, **kw) * ct)
    return loss


def _assert_trees_close(got, want, tol=2e-5):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


@MESHES
@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_grad_inside_shard_map(impl, axis_type, context):
    """jax.grad of attention inside the user's own shard_map: the backward's cotangents carry the
    primals' varying axes (a custom_vjp type check failed before)."""
    mesh = _typed_mesh(axis_type)
    q, k, v, ct = _small()
    spec = P("data", None, "model", None)
    grad = jax.grad(_loss(impl), argnums=(0, 1, 2))
    with _context(mesh, context):
        f = jax.jit(jax.shard_map(grad, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 3))
        got = f(*[jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v, ct)])
    _assert_trees_close(got, grad(q, k, v, ct))


@MESHES
@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_sharded_segment_ids_under_jit(impl, axis_type, context):
    """Batch-sharded segment ids with batch- and head-sharded q/k/v, forward and backward."""
    mesh = _typed_mesh(axis_type)
    q, k, v, ct = _small()
    ids = jnp.broadcast_to(jnp.arange(24) * 3 // 24, (4, 24)).astype(jnp.int32)
    grad = jax.value_and_grad(lambda q, k, v, ct, ids: _loss(impl, q_segment_ids=ids)(q, k, v, ct), argnums=(0, 1, 2))
    with _context(mesh, context):
        heads = NamedSharding(mesh, P("data", None, "model", None))
        args = [jax.device_put(x, heads) for x in (q, k, v, ct)] + [jax.device_put(ids, NamedSharding(mesh, P("data")))]
        got = jax.jit(grad)(*args)
    _assert_trees_close(got, grad(q, k, v, ct, ids))


@MESHES
@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_sequence_sharded_under_jit(impl, axis_type, context):
    """A sequence-sharded q/k/v (gathered, with the warning), forward and backward."""
    mesh = _typed_mesh(axis_type)
    q, k, v, ct = _small()
    plain = jax.value_and_grad(_loss(impl), argnums=(0, 1, 2))
    with _context(mesh, context), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the gather warning (test_sequence_sharding_is_gathered_with_a_warning)
        seq = NamedSharding(mesh, P("data", "model", None, None))
        got = jax.jit(plain)(*[jax.device_put(x, seq) for x in (q, k, v, ct)])
    _assert_trees_close(got, plain(q, k, v, ct))


def test_readme_sharding_recipe_as_printed():
    """README "Multi-GPU, multi-host, vmap": the sharding snippet verbatim (an Explicit mesh, no context mesh;
    the default implementation), then the same with batch-sharded segment ids; as the unsharded call."""
    q, k, v, _ = _small()
    ids = jnp.broadcast_to(jnp.arange(24) * 3 // 24, (4, 24)).astype(jnp.int32)
    want = jax_flash_amd.attention(q, k, v, causal=True)
    want_ids = jax_flash_amd.attention(q, k, v, causal=True, q_segment_ids=ids)
    # --- README, verbatim ---
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    spec = NamedSharding(mesh, P("data", None, "model", None))   # (batch, seq, heads, head_dim)
    q, k, v = (jax.device_put(x, spec) for x in (q, k, v))
    out = jax.jit(lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=True))(q, k, v)
    # ---
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-6, rtol=2e-6)
    assert out.sharding.is_equivalent_to(spec, 4)
    ids = jax.device_put(ids, NamedSharding(mesh, P("data", None)))
    out = jax.jit(lambda q, k, v, ids: jax_flash_amd.attention(q, k, v, causal=True, q_segment_ids=ids))(q, k, v, ids)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_ids), atol=2e-6, rtol=2e-6)
    assert out.sharding.is_equivalent_to(spec, 4)


@MESHES
@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_kvcache_append_on_sharded_batch(impl, axis_type, context):
    """attention_with_kvcache with new keys on batch- and head-sharded q, caches and new keys (a Flax decode
    step on a sharded batch): out, lse and the appended caches as the unsharded call's; on an Explicit mesh
    the caches keep their sharding."""
    mesh = _typed_mesh(axis_type)
    rng = np.random.default_rng(5)
    f = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    q, kc, vc, kn, vn = f(4, 3, 4, 16), f(4, 19, 4, 16), f(4, 19, 4, 16), f(4, 2, 4, 16), f(4, 2, 4, 16)
    lens = jnp.asarray([5, 0, 17, 9], jnp.int32)

    def call(q, kc, vc, lens, kn, vn):
        return jax_flash_amd.attention_with_kvcache(q, kc, vc, lens, k=kn, v=vn, return_lse=True, implementation=impl)

    want = call(q, kc, vc, lens, kn, vn)
    spec = NamedSharding(mesh, P("data", None, "model", None))
    with _context(mesh, context):
        got = jax.jit(call)(*(jax.device_put(x, spec) for x in (q, kc, vc)),
                            jax.device_put(lens, NamedSharding(mesh, P("data"))),
                            *(jax.device_put(x, spec) for x in (kn, vn)))
    _assert_trees_close(got, want, 1e-6)
    if axis_type == jax.sharding.AxisType.Explicit:
        for cache in got[2:]:
            assert cache.sharding.is_equivalent_to(spec, 4), cache.sharding


@MESHES
def test_zigzag_on_a_sharded_sequence(axis_type, context):
    """zigzag / unzigzag of a sequence sharded over both mesh axes: the unsharded reorder; on an Explicit mesh
    the result keeps the sharding."""
    mesh = _typed_mesh(axis_type)
    x = jnp.arange(2 * 32 * 3, dtype=jnp.float32).reshape(2, 32, 3)
    sh = NamedSharding(mesh, P(None, ("data", "model")))
    with _context(mesh, context):
        z = jax.jit(lambda x: jax_flash_amd.zigzag(x, 8))(jax.device_put(x, sh))
        back = jax_flash_amd.unzigzag(z, 8)
    np.testing.assert_array_equal(np.asarray(z), np.asarray(jax_flash_amd.zigzag(x, 8)))
    np.testing.assert_array_equal(np.asarray(back), np.asarray(x))
    if axis_type == jax.sharding.AxisType.Explicit:
        assert z.sharding.is_equivalent_to(sh, 3) and back.sharding.is_equivalent_to(sh, 3)


@MESHES
@pytest.mark.parametrize("impl", ["interpret", "xla"])
def test_eager_calls_on_sharded_arrays(impl, axis_type, context):
    """Outside jit: attention with batch-sharded segment ids, and a KV-cache append, on sharded arrays."""
    mesh = _typed_mesh(axis_type)
    q, k, v, _ = _small()
    ids = jnp.broadcast_to(jnp.arange(24) * 3 // 24, (4, 24)).astype(jnp.int32)
    lens = jnp.asarray([5, 0, 17, 9], jnp.int32)
    want = (jax_flash_amd.attention(q, k, v, causal=True, q_segment_ids=ids, implementation=impl),
            jax_flash_amd.attention_with_kvcache(q[:, :2], k, v, lens, k=k[:, :3], v=v[:, :3], implementation=impl))
    sh = NamedSharding(mesh, P("data", None, "model", None))
    with _context(mesh, context):
        q, k, v = (jax.device_put(x, sh) for x in (q, k, v))
        ids, lens = (jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (ids, lens))
        got = (jax_flash_amd.attention(q, k, v, causal=True, q_segment_ids=ids, implementation=impl),
               jax_flash_amd.attention_with_kvcache(q[:, :2], k, v, lens, k=k[:, :3], v=v[:, :3], implementation=impl))
    _assert_trees_close(got, want, 1e-6)
