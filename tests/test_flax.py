"""Flax modules: FlashSelfAttention (linen, nnx) and flash_attention_fn against Flax's own attention."""
import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jax_flash_amd
from helpers import KERNEL_IMPLS

IMPLS = KERNEL_IMPLS + ["xla"]
X = jax.random.normal(jax.random.key(0), (2, 37, 48), jnp.float32)  # odd length, head_dim 12


@pytest.fixture(autouse=True)
def _fp32_matmuls():
    # Flax's own modules (the reference here) would take TF32 matmuls on a GPU; the kernels do fp32
    with jax.default_matmul_precision("highest"):
        yield


def _close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol, rtol=tol)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_linen_module_is_flax_module_with_same_parameters(impl, causal):
    ours = jax_flash_amd.FlashSelfAttention(num_heads=4, qkv_features=48, causal=causal, implementation=impl)
    flax_mha = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=48)
    params = flax_mha.init(jax.random.key(1), X)
    mine = ours.init(jax.random.key(1), X)
    assert jax.tree.structure(params) == jax.tree.structure(mine)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, mine)
    mask = nn.make_causal_mask(X[..., 0]) if causal else None
    _close(ours.apply(params, X), flax_mha.apply(params, X, mask=mask))  # Flax's checkpoint in ours
    _close(flax_mha.apply(mine, X, mask=mask), ours.apply(mine, X))  # and ours in Flax's


@pytest.mark.matrix
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nnx_module_matches_flax_with_copied_weights(impl, causal):
    # grouped-query: 4 query heads over 2 key/value heads
    theirs = nnx.MultiHeadAttention(4, 48, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0))
    ours = jax_flash_amd.nnx.FlashSelfAttention(4, 48, num_kv_heads=2, decode=False, causal=causal,
                                                implementation=impl, rngs=nnx.Rngs(5))
    nnx.update(ours, nnx.state(theirs, nnx.Param))
    _close(ours(X), theirs(X, is_causal=causal))


@pytest.mark.parametrize("impl", IMPLS)
def test_flash_attention_fn_inside_both_flax_modules(impl):
    fn = functools.partial(jax_flash_amd.flash_attention_fn, implementation=impl)
    plain = nn.MultiHeadDotProductAttention(num_heads=4)
    params = plain.init(jax.random.key(1), X)
    swapped = nn.MultiHeadDotProductAttention(num_heads=4, attention_fn=functools.partial(fn, causal=True))
    _close(swapped.apply(params, X), plain.apply(params, X, mask=nn.make_causal_mask(X[..., 0])))

    theirs = nnx.MultiHeadAttention(4, 48, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0))
    ours = nnx.MultiHeadAttention(4, 48, num_kv_heads=2, decode=False, attention_fn=fn, rngs=nnx.Rngs(0))
    nnx.update(ours, nnx.state(theirs, nnx.Param))
    for causal in (False, True):
        _close(ours(X, is_causal=causal), theirs(X, is_causal=causal))


@pytest.mark.parametrize("impl", IMPLS)
def test_flash_attention_fn_runs_flax_masks_and_biases_in_the_kernels(impl):
    """Flax's dense masks (a random one with a row it hides entirely: Flax gives that row the mean of the values, as
    here; a padding mask from make_attention_mask, whose padded query rows are such rows) and a bias, of extra
    batch axes too, without falling back (no warning), equal Flax's dot_product_attention; custom einsums are
    refused."""
    fn = functools.partial(jax_flash_amd.flash_attention_fn, implementation=impl)
    q = jax.random.normal(jax.random.key(2), (2, 9, 4, 8))
    mask = jax.random.bernoulli(jax.random.key(3), 0.7, (2, 1, 9, 9)).at[..., 0].set(True).at[1, 0, 4].set(False)
    tokens = jnp.asarray([[3, 1, 4, 1, 5, 0, 0, 0, 0], [2, 7, 1, 8, 2, 8, 1, 8, 0]])
    padding = nn.make_attention_mask(tokens > 0, tokens > 0)
    bias = jax.random.normal(jax.random.key(4), (1, 4, 9, 9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        for kw in (dict(mask=mask), dict(mask=padding), dict(bias=bias), dict(mask=padding, bias=bias)):
            _close(fn(q, q, q, **kw), nn.dot_product_attention(q, q, q, **kw))
        extra = q.reshape(1, 2, 9, 4, 8)  # batch axes (1, 2): a mask broadcast along the first
        _close(fn(extra, extra, extra, mask=mask[None]), nn.dot_product_attention(extra, extra, extra, mask=mask[None]))
    with pytest.raises(ValueError, match="custom einsums"):
        jax_flash_amd.flash_attention_fn(q, q, q, qk_attn_weights_einsum=jnp.einsum)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_flax_module_with_causal_and_padding_masks_trains_as_flax_does(impl):
    """nn.MultiHeadDotProductAttention(attention_fn=flash_attention_fn) with nn.make_causal_mask and a padding mask
    trains 20 steps (bfloat16 attention, Adam) with the losses of Flax's own attention, and no fallback warning."""
    tokens = jax.random.randint(jax.random.key(0), (4, 32), 1, 50).at[1, 20:].set(0).at[3, 9:].set(0)
    mask = nn.combine_masks(nn.make_causal_mask(tokens), nn.make_attention_mask(tokens > 0, tokens > 0))

    class Model(nn.Module):
        attention_fn: object

        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(50, 64)(tokens)
            x = x + nn.MultiHeadDotProductAttention(num_heads=4, dtype=jnp.bfloat16, attention_fn=self.attention_fn)(
                x, mask=mask)
            return nn.Dense(50)(x)

    def losses(attention_fn):
        model = Model(attention_fn)
        params = model.init(jax.random.key(1), tokens)
        opt = optax.adam(3e-3)
        state = opt.init(params)

        @jax.jit
        def step(params, state):
            def loss(p):
                logits = model.apply(p, tokens).astype(jnp.float32)
                targets = jnp.roll(tokens, -1, axis=1)
                return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
            value, grads = jax.value_and_grad(loss)(params)
            updates, state = opt.update(grads, state)
            return optax.apply_updates(params, updates), state, value

        out = []
        for _ in range(20):
            params, state, value = step(params, state)
            out.append(float(value))
        return np.asarray(out)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        ours = losses(functools.partial(jax_flash_amd.flash_attention_fn, implementation=impl))
    theirs = losses(nn.dot_product_attention)
    assert ours[-1] < 0.8 * ours[0]
    np.testing.assert_allclose(ours, theirs, rtol=2e-2)  # bfloat16 noise, compounded over 20 steps


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_dropout_is_deterministic_per_rng_in_both_modules(impl):
    layer = jax_flash_amd.FlashSelfAttention(num_heads=4, dropout_rate=0.3, causal=True, implementation=impl)
    params = layer.init(jax.random.key(1), X, deterministic=True)
    run = lambda seed: layer.apply(params, X, deterministic=False, rngs={"dropout": jax.random.key(seed)})  # noqa
    a, b, c = run(7), run(7), run(8)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))
    _close(layer.apply(params, X, deterministic=True),
           jax_flash_amd.FlashSelfAttention(num_heads=4, causal=True, implementation=impl).apply(params, X))

    make = lambda: jax_flash_amd.nnx.FlashSelfAttention(4, 48, dropout_rate=0.3, decode=False,  # noqa: E731
                                                        implementation=impl, rngs=nnx.Rngs(0, dropout=9))
    one, two = make(), make()
    np.testing.assert_array_equal(np.asarray(one(X, deterministic=False)), np.asarray(two(X, deterministic=False)))
    assert not np.allclose(np.asarray(one(X, deterministic=False)), np.asarray(two(X, deterministic=True)))


@pytest.mark.parametrize("impl", IMPLS)
def test_segment_ids_equal_separate_sequences(impl):
    layer = jax_flash_amd.FlashSelfAttention(num_heads=4, causal=True, implementation=impl)
    params = layer.init(jax.random.key(1), X)
    ids = jnp.asarray([[0] * 20 + [1] * 17, [0] * 5 + [1] * 32], jnp.int32)
    packed = layer.apply(params, X, segment_ids=ids)
    for row, cut in ((0, 20), (1, 5)):
        _close(packed[row, :cut], layer.apply(params, X[row:row + 1, :cut])[0])
        _close(packed[row, cut:], layer.apply(params, X[row:row + 1, cut:])[0])


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_one_position_at_a_time_equals_causal_forward(impl):
    x = X[:, :9]
    layer = jax_flash_amd.FlashSelfAttention(num_heads=4, causal=True, implementation=impl)
    params = layer.init(jax.random.key(1), x)
    full = layer.apply(params, x)
    step = jax_flash_amd.FlashSelfAttention(num_heads=4, causal=True, decode=True, implementation=impl)
    cache = step.init(jax.random.key(1), x)["cache"]
    for i in range(x.shape[1]):
        out, mutated = step.apply({**params, "cache": cache}, x[:, i:i + 1], mutable=["cache"])
        cache = mutated["cache"]
        _close(out[:, 0], full[:, i])

    model = jax_flash_amd.nnx.FlashSelfAttention(4, 48, causal=True, decode=True, implementation=impl,
                                                 rngs=nnx.Rngs(0))
    full = model(x, decode=False)
    model.init_cache(x.shape)
    for i in range(x.shape[1]):
        _close(model(x[:, i:i + 1])[:, 0], full[:, i])


class _TinyLM(nn.Module):
    impl: str

    @nn.compact
    def __call__(self, tokens, deterministic=True):
        h = nn.Embed(64, 32)(tokens)
        h = h + jax_flash_amd.FlashSelfAttention(num_heads=2, causal=True, dropout_rate=0.1,
                                                 implementation=self.impl)(nn.LayerNorm()(h),
                                                                           deterministic=deterministic)
        return nn.Dense(64)(nn.LayerNorm()(h))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_jit_training_step_lowers_the_loss(impl):
    tokens = jnp.tile(jnp.arange(24) % 7, (4, 1))  # a repeating pattern a causal model can learn
    model = _TinyLM(impl)
    params = model.init(jax.random.key(0), tokens)
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state, rng):
        def loss_fn(p):
            logits = model.apply(p, tokens[:, :-1], deterministic=False, rngs={"dropout": rng})
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(8):  # enough: the xla run of this model is at 0.36x its first loss by step 8
        params, state, loss = step(params, state, jax.random.key(i))
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < 0.6 * losses[0], losses


# Flax's call signatures (issue 18, item 9): cross-attention inputs, dense masks, dropout_rng, sow_weights,
# nnx's is_causal, and the int64 ids that jax_enable_x64 makes the default
Y = jax.random.normal(jax.random.key(7), (2, 29, 48), jnp.float32)  # keys / values of another length
Z = jax.random.normal(jax.random.key(8), (2, 29, 48), jnp.float32)
MASK = jax.random.bernoulli(jax.random.key(9), 0.7, (2, 1, 37, 37)).at[..., 0].set(True)


def _dense_mask_warning(caught):
    return any("dense mask" in str(w.message) or "Flax's dot_product_attention" in str(w.message) for w in caught)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_linen_module_takes_flax_call_arguments(impl):
    ours = jax_flash_amd.FlashSelfAttention(num_heads=4, qkv_features=48, implementation=impl)
    theirs = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=48)
    params = theirs.init(jax.random.key(1), X)
    for args in ((X, Y), (X, Y, Z)):  # positional inputs_k, inputs_v: cross-attention
        _close(ours.apply(params, *args), theirs.apply(params, *args))
    _close(ours.apply(params, X, inputs_kv=Y), theirs.apply(params, X, Y))
    jax_flash_amd.attention_fn._warn_once.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ours.apply(params, X, mask=MASK, deterministic=True)
    assert not _dense_mask_warning(caught)  # the mask runs in the kernels
    _close(got, theirs.apply(params, X, mask=MASK, deterministic=True))
    causal = jax_flash_amd.FlashSelfAttention(num_heads=4, qkv_features=48, causal=True, implementation=impl)
    both = jnp.logical_and(MASK, nn.make_causal_mask(X[..., 0]))  # causal=True and a mask: both apply
    _close(causal.apply(params, X, mask=MASK), theirs.apply(params, X, mask=both))
    jax_flash_amd.attention_fn._warn_once.cache_clear()
    with pytest.warns(UserWarning, match="attention weights to sow"):
        got, mine = ours.apply(params, X, sow_weights=True, mutable=["intermediates"])
    want, flax_vars = theirs.apply(params, X, sow_weights=True, mutable=["intermediates"])
    _close(got, want)
    _close(mine["intermediates"]["attention_weights"][0], flax_vars["intermediates"]["attention_weights"][0])

    drop = jax_flash_amd.FlashSelfAttention(num_heads=4, qkv_features=48, dropout_rate=0.3, implementation=impl)
    a, b = (drop.apply(params, X, deterministic=False, dropout_rng=jax.random.key(3)) for _ in range(2))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the given key, no 'dropout' stream needed
    assert not np.allclose(np.asarray(a), np.asarray(drop.apply(params, X, deterministic=True)))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside:DeprecationWarning")  # Flax's, for both modules
def test_nnx_module_takes_flax_call_arguments(impl):
    theirs = nnx.MultiHeadAttention(4, 48, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0))
    ours = jax_flash_amd.nnx.FlashSelfAttention(4, 48, num_kv_heads=2, decode=False, implementation=impl,
                                                rngs=nnx.Rngs(5))
    nnx.update(ours, nnx.state(theirs, nnx.Param))
    _close(ours(X, is_causal=True), theirs(X, is_causal=True))
    _close(ours(X, Y, Z), theirs(X, Y, Z))
    jax_flash_amd.attention_fn._warn_once.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ours(X, mask=MASK)
    assert not _dense_mask_warning(caught)
    _close(got, theirs(X, mask=MASK))
    jax_flash_amd.attention_fn._warn_once.cache_clear()
    with pytest.warns(UserWarning, match="attention weights to sow"):
        got = ours(X, sow_weights=True)
    _close(got, theirs(X, sow_weights=True))
    mine, flax_weights = (nnx.pop(m, nnx.Intermediate)["attention_weights"] for m in (ours, theirs))
    _close(jax.tree.leaves(mine)[0], jax.tree.leaves(flax_weights)[0])

    cross = dict(in_kv_features=24, decode=False)  # keys / values with their own feature size
    theirs = nnx.MultiHeadAttention(4, 48, 48, 48, 2, rngs=nnx.Rngs(0), **cross)
    ours = jax_flash_amd.nnx.FlashSelfAttention(4, 48, 48, 48, 2, implementation=impl, rngs=nnx.Rngs(5), **cross)
    nnx.update(ours, nnx.state(theirs, nnx.Param))
    _close(ours(X, Y[..., :24]), theirs(X, Y[..., :24]))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_int64_segment_ids_under_x64(impl):
    ids32 = jnp.asarray([[0] * 20 + [1] * 17, [0] * 5 + [1] * 32], jnp.int32)
    layer = jax_flash_amd.FlashSelfAttention(num_heads=4, causal=True, implementation=impl)
    params = layer.init(jax.random.key(1), X)
    want = layer.apply(params, X, segment_ids=ids32)
    model = jax_flash_amd.nnx.FlashSelfAttention(4, 48, causal=True, decode=False, implementation=impl,
                                                 rngs=nnx.Rngs(0))
    want_nnx = model(X, segment_ids=ids32)
    big = 5_000_000_000  # ids past int32: a plain cast would wrap 5e9 and 5e9 + 2^32 onto one id
    wide = np.asarray([[big] * 20 + [big + 2**32] * 17, [-big] * 5 + [big] * 32], np.int64)
    with jax.enable_x64(True):
        ids = jnp.asarray(ids32.tolist())  # the default integer type: int64
        assert ids.dtype == jnp.int64
        _close(layer.apply(params, X, segment_ids=ids), want)
        _close(jax.jit(lambda p, i: layer.apply(p, X, segment_ids=i))(params, ids), want)  # traced ids
        _close(layer.apply(params, X, segment_ids=jnp.asarray(wide)), want)
        _close(jax.jit(lambda p, i: layer.apply(p, X, segment_ids=i))(params, jnp.asarray(wide)), want)
        _close(model(X, segment_ids=ids), want_nnx)
    _close(layer.apply(params, X, segment_ids=wide), want)  # NumPy int64 without x64
