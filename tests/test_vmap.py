"""jax.vmap of attention folds the mapped axes into the kernels' batch (custom_vmap): it equals a Python
loop over the mapped axis, forward and backward, with mapped and unmapped arguments."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
from helpers import KERNEL_IMPLS


def _loss(impl, causal):
    def loss(q, k, v, ct):
        out, lse = jax_flash_amd.attention(q, k, v, causal=causal, return_lse=True, implementation=impl)
        return jnp.sum(out.astype(jnp.float32) * ct) + jnp.sum(lse * ct[..., 0].transpose(0, 2, 1))
    return loss


def _data(n, sq=37, sk=29, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (n, 2, sq, 3, 24), jnp.float16)
    k = jax.random.normal(ks[1], (n, 2, sk, 3, 24), jnp.float16)
    v = jax.random.normal(ks[2], (n, 2, sk, 3, 24), jnp.float16)
    ct = jax.random.normal(ks[3], (n, 2, sq, 3, 24), jnp.float32)
    return q, k, v, ct


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=2e-3, rtol=2e-3)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
@pytest.mark.parametrize("in_axes", [(0, 0, 0, 0), (0, None, None, 0), (None, 0, 0, None)],
                         ids=["all-mapped", "q-mapped", "kv-mapped"])
def test_vmap_equals_loop(impl, in_axes):
    q, k, v, ct = _data(2)
    loss = _loss(impl, causal=True)
    grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    args = [x if ax == 0 else x[0] for x, ax in zip((q, k, v, ct), in_axes)]
    value, grads = jax.jit(jax.vmap(grad, in_axes=in_axes))(*args)
    loop_grad = jax.jit(grad)  # one compile for the loop's equal shapes (eager compiles op by op)
    for i in range(2):
        one = [x[i] if ax == 0 else x for x, ax in zip(args, in_axes)]
        v_i, g_i = loop_grad(*one)
        _close(value[i], v_i)
        for g, gi in zip(grads, g_i):
            _close(g[i], gi)  # unmapped inputs get per-example gradients under vmap


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_nested_vmap_and_other_axis(impl):
    q, k, v, _ = _data(2, sq=16, sk=16)
    f = lambda q, k, v: jax_flash_amd.attention(q, k, v, implementation=impl)  # noqa: E731
    q2 = jnp.stack([q, q * 0.5], axis=1)  # (2, 2, B, S, H, D): two mapped axes
    out = jax.vmap(jax.vmap(f, in_axes=(0, None, None)), in_axes=(0, 0, 0))(q2, k, v)
    for i in range(2):
        for j in range(2):
            _close(out[i, j], f(q2[i, j], k[i], v[i]))
    moved = jnp.moveaxis(q, 0, 2)  # mapped axis in the middle
    out = jax.vmap(f, in_axes=(2, 0, 0))(moved, k, v)
    for i in range(2):
        _close(out[i], f(q[i], k[i], v[i]))


@pytest.mark.slow
@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
def test_vmap_over_dropout_keys_and_segment_ids(impl):
    # per-example keys and ids are folded into the batch with their rows: the same masks as a loop
    q, k, v, ct = _data(2)
    keys = jax.random.split(jax.random.key(0), 2)
    q_ids = jnp.sort(jax.random.randint(jax.random.key(1), (2, 2, 37), 0, 3), axis=-1)
    kv_ids = jnp.sort(jax.random.randint(jax.random.key(2), (2, 2, 29), 0, 3), axis=-1)

    def loss(q, k, v, key, qi, ki, ct):
        out = jax_flash_amd.attention(q, k, v, dropout_p=0.3, dropout_rng=key, q_segment_ids=qi, kv_segment_ids=ki,
                                      implementation=impl)
        return jnp.sum(out.astype(jnp.float32) * ct)

    grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    value, grads = jax.jit(jax.vmap(grad))(q, k, v, keys, q_ids, kv_ids, ct)
    loop_grad = jax.jit(grad)
    for i in range(2):
        v_i, g_i = loop_grad(q[i], k[i], v[i], keys[i], q_ids[i], kv_ids[i], ct[i])
        _close(value[i], v_i)
        for g, gi in zip(grads, g_i):
            _close(g[i], gi)
