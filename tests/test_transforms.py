"""The kernels under JAX transformations: jit, grad, value_and_grad, checkpoint, scan."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
import oracle
from helpers import KERNEL_IMPLS, inputs


def _loss(impl, dout):
    def loss(q, k, v):
        out = jax_flash_amd.attention(q, k, v, causal=True, implementation=impl)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))
    return loss


def _assert_grads(grads, ref, tol):
    for g, name in zip(grads, ("dq", "dk", "dv")):
        err = np.max(np.abs(np.asarray(g.astype(jnp.float32)) - ref[name]))
        assert err <= tol * np.max(np.abs(ref[name])), f"{name}: {err}"


@pytest.fixture
def problem():
    q, k, v, dout, _ = inputs((2, 70, 2, 32), (2, 90, 2, 32), jnp.float16, seed=7)
    return q, k, v, dout, oracle.attention(q, k, v, dout, causal=True)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_jit_grad_and_value_and_grad(impl, problem):
    q, k, v, dout, ref = problem
    loss = _loss(impl, dout)
    _assert_grads(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v), ref, 1e-2)
    val, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(float(val), float(np.sum(ref["out"] * np.asarray(dout, np.float64))), rtol=1e-2)
    _assert_grads(grads, ref, 1e-2)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_checkpoint(impl, problem):
    q, k, v, dout, ref = problem
    _assert_grads(jax.jit(jax.grad(jax.checkpoint(_loss(impl, dout)), argnums=(0, 1, 2)))(q, k, v), ref, 1e-2)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_scan_over_layers(impl, problem):
    q, k, v, dout, ref = problem
    loss = _loss(impl, dout)

    def two_layers(q, k, v):  # the same attention twice through lax.scan: gradients add up
        total, _ = jax.lax.scan(lambda c, _: (c + loss(q, k, v), None), 0.0, None, length=2)
        return total

    grads = jax.jit(jax.grad(two_layers, argnums=(0, 1, 2)))(q, k, v)
    _assert_grads([g.astype(jnp.float32) / 2 for g in grads], ref, 1e-2)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_default_implementation_uses_kernels(impl, problem):
    q, k, v, _, _ = problem
    a = jax_flash_amd.attention(q, k, v, causal=True)
    b = jax_flash_amd.attention(q, k, v, causal=True, implementation=impl)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("impl", [*KERNEL_IMPLS, "xla"])
def test_windows_wider_than_the_sequence_are_unbounded(impl):
    """A window side that reaches past every key is the unbounded side (clamped once, in the API):
    no overflow, the same result as without it."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 37, 2, 16), jnp.float16) for i in range(3))
    f = functools.partial(jax_flash_amd.attention, q, k, v, implementation=impl)
    np.testing.assert_array_equal(np.asarray(f(causal=True, window_size=(2**31, 0))), np.asarray(f(causal=True)))
    np.testing.assert_array_equal(np.asarray(f(window_size=(2**40, 36))), np.asarray(f()))


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_second_derivative_through_the_kernels_says_so(impl):
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 20, 2, 16), jnp.float32) for i in range(3))

    def loss(q):
        return jnp.sum(jax_flash_amd.attention(q, k, v, implementation=impl) ** 2)

    jax.grad(loss)(q)  # once is fine
    with pytest.raises(TypeError, match="differentiable once.*implementation='xla'"):
        jax.grad(lambda q: jnp.sum(jax.grad(loss)(q) ** 2))(q)
