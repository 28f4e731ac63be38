"""Bad input raises a clear error naming the argument, before any kernel runs."""
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd

Q = jnp.zeros((1, 8, 2, 16), jnp.float16)


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((Q[0], Q, Q), {}, ValueError, "q must have rank 4"),
    ((Q, Q[..., None], Q), {}, ValueError, "k must have rank 4"),
    ((Q, Q, [1, 2]), {}, TypeError, "v must be an array"),
    ((Q, Q.astype(jnp.float32), Q), {}, TypeError, "same dtype"),
    ((Q.astype(jnp.int32), Q, Q), {}, TypeError, "q must be float16, bfloat16 or float32"),
    ((Q, Q, Q.astype(jnp.int8)), {}, TypeError, "v must be float16"),
    ((jnp.zeros((1, 8, 2, 300), jnp.float16),) * 3, {}, ValueError, "head_dim .* must be in 1..256"),
    ((jnp.zeros((1, 8, 2, 0), jnp.float16),) * 3, {}, ValueError, "head_dim .* must be in 1..256"),
    ((Q, Q, Q[:, :4]), {}, ValueError, "k and v must have the same shape"),
    ((Q, Q[:, :, :1], Q[:, :, :1]), {}, ValueError, "same number of heads"),
    ((Q, jnp.zeros((2, 8, 2, 16), jnp.float16), jnp.zeros((2, 8, 2, 16), jnp.float16)), {}, ValueError, "batch"),
    ((Q, Q[..., :8], Q[..., :8]), {}, ValueError, "same head_dim"),
    ((Q, Q, Q), {"implementation": "cuda"}, ValueError, "implementation must be one of"),
    ((Q, Q, Q), {"softmax_scale": 0.0}, ValueError, "softmax_scale must be a finite number > 0"),
    ((Q, Q, Q), {"softmax_scale": -1.0}, ValueError, "softmax_scale"),
    ((Q, Q, Q), {"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
    ((Q, Q, Q), {"softmax_scale": jnp.float32(0.1)}, TypeError, "softmax_scale must be a static Python number"),
    ((Q, Q, Q), {"causal": 1}, TypeError, "causal must be a Python bool"),
    ((Q, Q, Q), {"return_lse": "yes"}, TypeError, "return_lse must be a Python bool"),
])
def test_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jax_flash_amd.attention(*args, **kwargs)


def test_numpy_inputs_are_accepted():
    x = np.random.default_rng(0).standard_normal((1, 5, 1, 8)).astype(np.float32)
    out = jax_flash_amd.attention(x, x, x, implementation="xla")
    assert out.shape == x.shape
