"""Bad input raises a clear error naming the argument, before any kernel runs."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash_amd
from helpers import KERNEL_IMPLS, ON_GPU

Q = jnp.zeros((1, 8, 2, 16), jnp.float16)
KEY = jax.random.key(0)
IDS = jnp.zeros((1, 8), jnp.int32)


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
    ((jnp.zeros((1, 8, 3, 16), jnp.float16), Q, Q), {}, ValueError, "multiple of the number of key/value heads"),
    ((Q, Q[:, :, :0], Q[:, :, :0]), {}, ValueError, "multiple of the number of key/value heads"),
    ((Q, Q, Q), {"window_size": (-2, 0)}, ValueError, "window_size values must be >= 0, or -1"),
    ((Q, Q, Q), {"window_size": 4}, TypeError, "window_size must be a pair"),
    ((Q, Q, Q), {"window_size": (1.5, 0)}, TypeError, "window_size must be a pair"),
    ((Q, Q, Q), {"softcap": -1.0}, ValueError, "softcap must be a finite number >= 0"),
    ((Q, Q, Q), {"softcap": "5"}, TypeError, "softcap must be a static Python number"),
    ((Q, Q, Q), {"alibi_slopes": jnp.zeros((3,))}, ValueError, r"alibi_slopes must have shape \(2,\) or \(1, 2\)"),
    ((Q, Q, Q), {"alibi_slopes": jnp.zeros((2,), jnp.int32)}, TypeError, "alibi_slopes must be a floating array"),
    ((Q, Q, Q), {"alibi_slopes": [0.1, 0.2]}, TypeError, "alibi_slopes must be an array"),
    ((Q, jnp.zeros((2, 8, 2, 16), jnp.float16), jnp.zeros((2, 8, 2, 16), jnp.float16)), {}, ValueError, "batch"),
    ((Q, Q[..., :8], Q[..., :8]), {}, ValueError, "same head_dim"),
    ((Q, Q, Q), {"implementation": "cuda"}, ValueError, "implementation must be one of"),
    ((Q, Q, Q), {"softmax_scale": 0.0}, ValueError, "softmax_scale must be a finite number > 0"),
    ((Q, Q, Q), {"softmax_scale": -1.0}, ValueError, "softmax_scale"),
    ((Q, Q, Q), {"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
    ((Q, Q, Q), {"softmax_scale": jnp.float32(0.1)}, TypeError, "softmax_scale must be a static Python number"),
    ((Q, Q, Q), {"causal": 1}, TypeError, "causal must be a Python bool"),
    ((Q, Q, Q), {"return_lse": "yes"}, TypeError, "return_lse must be a Python bool"),
    ((Q, Q, Q), {"dropout_p": 1.0, "dropout_rng": KEY}, ValueError, r"dropout_p must be in \[0, 1\)"),
    ((Q, Q, Q), {"dropout_p": -0.1, "dropout_rng": KEY}, ValueError, r"dropout_p must be in \[0, 1\)"),
    ((Q, Q, Q), {"dropout_p": 0.1}, ValueError, "dropout_p=0.1 needs dropout_rng"),
    ((Q, Q, Q), {"dropout_p": jnp.float32(0.1), "dropout_rng": KEY}, TypeError, "dropout_p must be a static"),
    ((Q, Q, Q), {"dropout_p": 0.1, "dropout_rng": 3}, TypeError, "dropout_rng must be one JAX PRNG key"),
    ((Q, Q, Q), {"dropout_p": 0.1, "dropout_rng": jax.random.split(KEY, 2)}, TypeError, "dropout_rng must be one"),
    ((Q, Q, Q), {"q_segment_ids": IDS[:, :5]}, ValueError, r"q_segment_ids must have shape \(batch, seq\) = \(1, 8\)"),
    ((Q, Q, Q), {"q_segment_ids": IDS, "kv_segment_ids": IDS[None]}, ValueError, "kv_segment_ids must have shape"),
    ((Q, Q, Q), {"q_segment_ids": IDS.astype(jnp.float32)}, TypeError, "q_segment_ids must be an integer"),
    ((Q, Q, Q), {"kv_segment_ids": IDS.astype(jnp.float32)}, TypeError, "kv_segment_ids must be an integer"),
    ((Q, Q, Q), {"kv_segment_ids": IDS[:, :5]}, ValueError, r"kv_segment_ids must have shape \(batch, seq\)"),
    ((Q, Q, Q), {"softmax_scale": 1e39}, ValueError, "softmax_scale must be a normal float32"),
    ((Q, Q, Q), {"softmax_scale": 1e-40}, ValueError, "softmax_scale must be a normal float32"),
    ((Q, Q, Q), {"softcap": 1e-40}, ValueError, "softcap must be 0 or a normal float32"),
    ((Q, Q, Q), {"softmax_scale": 1e38}, ValueError, r"softmax_scale must be a normal float32 .* 2\*\*16"),
    ((Q, Q, Q), {"softmax_scale": 2.0 ** 16 * 1.01}, ValueError, r"softmax_scale must be .* 2\*\*16"),
    ((Q, Q, Q), {"softcap": float("inf")}, ValueError, "softcap must be a finite number"),
    ((Q, Q, Q), {"q_segment_ids": [[0] * 8]}, TypeError, "q_segment_ids must be an integer array"),
    ((Q, Q[:, :4], Q[:, :4]), {"q_segment_ids": IDS}, ValueError, "kv_segment_ids is needed too"),
])
def test_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jax_flash_amd.attention(*args, **kwargs)


@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_too_long_for_32_bit_offsets(impl):
    big = jax.ShapeDtypeStruct((1, 2**24, 16, 128), jnp.bfloat16)  # traced only, never allocated
    with pytest.raises(ValueError, match="fewer than 2\\*\\*31"):
        jax.eval_shape(lambda q: jax_flash_amd.attention(q, q, q, implementation=impl), big)


def test_numpy_inputs_are_accepted():
    x = np.random.default_rng(0).standard_normal((1, 5, 1, 8)).astype(np.float32)
    out = jax_flash_amd.attention(x, x, x, implementation="xla")
    assert out.shape == x.shape


@pytest.mark.skipif(ON_GPU, reason="CPU-only behaviour")
def test_triton_on_cpu_says_what_to_use():
    with pytest.raises(RuntimeError, match="needs a GPU backend"):
        jax_flash_amd.attention(Q, Q, Q, implementation="triton")


def test_interpret_without_env_var_says_how():
    code = ("import jax.numpy as jnp, jax_flash_amd\n"
            "q = jnp.zeros((1, 4, 1, 16), jnp.float16)\n"
            "jax_flash_amd.attention(q, q, q, implementation='interpret')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "TRITON_INTERPRET=1" in proc.stderr and "RuntimeError" in proc.stderr


def test_flash_attn_func_names_and_refusals():
    x = jax.random.normal(jax.random.key(1), (1, 9, 2, 16), jnp.float32)
    got = jax_flash_amd.flash_attn_func(x, x, x, 0.0, 0.5, True, (3, 0), 0.0, None, True)  # FA's positional order
    want = jax_flash_amd.attention(x, x, x, softmax_scale=0.5, causal=True, window_size=(3, 0))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    got = jax_flash_amd.flash_attn_func(x, x, x, dropout_p=0.2, dropout_rng=KEY)
    want = jax_flash_amd.attention(x, x, x, dropout_p=0.2, dropout_rng=KEY)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(NotImplementedError, match="return_attn_probs"):
        jax_flash_amd.flash_attn_func(x, x, x, return_attn_probs=True)
    with pytest.raises(ValueError, match="needs dropout_rng"):
        jax_flash_amd.flash_attn_func(x, x, x, dropout_p=0.1)


def test_raw_prng_key_and_narrow_ids_are_accepted():
    x = jax.random.normal(jax.random.key(1), (1, 9, 2, 16), jnp.float32)
    raw = jax.random.PRNGKey(3)
    out = jax_flash_amd.attention(x, x, x, dropout_p=0.5, dropout_rng=raw, implementation="xla")
    assert np.isfinite(np.asarray(out)).all()
    ids = jnp.array([[0, 0, 0, 1, 1, 1, 1, 2, 2]], jnp.int8)
    a = jax_flash_amd.attention(x, x, x, q_segment_ids=ids, implementation="xla")
    b = jax_flash_amd.attention(x, x, x, q_segment_ids=ids.astype(jnp.int32), kv_segment_ids=ids.astype(jnp.int32),
                                implementation="xla")
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
