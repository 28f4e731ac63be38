"""softcap at every magnitude (issue 18, item 1): s = c tanh(x / c) keeps fp32 precision when x / c is
tiny (large c), in the forward and through the backward's 1 - tanh^2, and converges to plain attention
as c -> inf; plus the kernels' tanh itself against float64."""
import os

import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl

import oracle
from helpers import KERNEL_IMPLS, assert_close, inputs, run
from jax_flash_amd import api
from jax_flash_amd.kernels import scores

SOFTCAPS = [1e-2, 50.0, 1e3, 1e4, 1e5, 1e7]
SHAPE_Q, SHAPE_K = (1, 37, 2, 32), (1, 45, 2, 32)  # odd lengths; q = 3 x normal: |x / c| from 1e-8 to 1e3


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
@pytest.mark.parametrize("softcap", SOFTCAPS, ids=lambda c: f"cap{c:g}")
def test_softcap_forward_and_backward_match_float64(impl, softcap):
    q, k, v, dout, dlse = inputs(SHAPE_Q, SHAPE_K, jnp.float32, seed=3, q_scale=3.0)
    got = run(impl, q, k, v, dout, dlse, softcap=softcap)
    base = run("xla", q, k, v, dout, dlse, softcap=softcap)
    ref = oracle.attention(q, k, v, dout, dlse, softcap=softcap)
    assert_close(got, ref, base, jnp.float32)


@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
def test_huge_softcap_is_plain_attention(impl):
    # c = 1e7: c tanh(x / c) differs from x by ~x^3 / (3 c^2) < 1e-11, so only fp32 rounding of
    # x / c and c * t (an ulp or two of the logits) may separate it from softcap=0
    q, k, v, dout, dlse = inputs(SHAPE_Q, SHAPE_K, jnp.float32, seed=4, q_scale=3.0)
    capped = run(impl, q, k, v, dout, dlse, softcap=1e7)
    plain = run(impl, q, k, v, dout, dlse)
    ref = oracle.attention(q, k, v, dout, dlse)
    assert_close(capped, ref, run("xla", q, k, v, dout, dlse), jnp.float32)
    for name in ("out", "lse", "dq", "dk", "dv"):
        a, b = np.asarray(capped[name], np.float64), np.asarray(plain[name], np.float64)
        scale = np.max(np.abs(b))
        assert np.max(np.abs(a - b)) <= 16 * np.finfo(np.float32).eps * scale, name


# softcap's whole accepted range above 1e7: just below api.SOFTCAP_OFF (honoured) and from it on (off), up to
# float32's maximum and beyond; float32 cannot tell any of them from plain attention
HUGE_SOFTCAPS = [2.0 ** 101, 2.0 ** 102, 1e37, 1e38, 1e39]


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
@pytest.mark.parametrize("softcap", HUGE_SOFTCAPS, ids=lambda c: f"cap{c:g}")
def test_huge_softcaps_match_float64(impl, softcap):
    """Every accepted softcap is within float32 precision of float64 (attention's docstring): at these sizes
    c tanh(x / c) is x to float64's precision, so the same-dtype computation is plain attention; from
    SOFTCAP_OFF on the cap is off, bit for bit plain attention (there the quotient x / c would fall into
    float32's subnormals, which XLA and the GPUs flush to zero)."""
    q, k, v, dout, dlse = inputs(SHAPE_Q, SHAPE_K, jnp.float32, seed=5, q_scale=3.0)
    got = run(impl, q, k, v, dout, dlse, softcap=softcap)
    plain = run(impl, q, k, v, dout, dlse)
    assert_close(got, oracle.attention(q, k, v, dout, dlse, softcap=softcap), run("xla", q, k, v, dout, dlse),
                 jnp.float32)
    if softcap >= api.SOFTCAP_OFF:
        for name in ("out", "lse", "dq", "dk", "dv"):
            np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(plain[name]), err_msg=name)


def _cuda():
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# relative error bounds in float32's eps (2^-23), at every x (see kernels/scores.py::_tanh): the
# interpreter's exp2 is correctly rounded, the GPUs' is approximate (~2 ulp)
TANH_RTOL = {"interpret": 1.5, "cuda": 3.0}


@triton.jit
def _tanh_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, scores._tanh(tl.load(X + offs, mask=offs < N)), mask=offs < N)


@pytest.mark.parametrize("device", [
    pytest.param("interpret", marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                                       reason="Triton's interpreter (TRITON_INTERPRET=1)")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs torch with a GPU")]),
])
def test_kernel_tanh_relative_error(device, monkeypatch, tmp_path):
    import torch

    # jax-triton 0.3.1 sets TRITON_CACHE_DIR="" when imported (by any test of the triton implementation
    # in this process), and Triton's own launcher, used here, then has nowhere to build its stub
    if not os.environ.get("TRITON_CACHE_DIR", "unset"):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))

    mags = np.concatenate([np.logspace(-30, 1, 20001), np.linspace(0.7, 0.8, 2001), [0.75, 20.0, 100.0, 1e30]])
    x = np.concatenate([mags, -mags, [0.0, np.inf, -np.inf]]).astype(np.float32)
    on = "cpu" if device == "interpret" else device
    y = torch.empty(x.size, dtype=torch.float32, device=on)
    block = 1024
    with np.errstate(over="ignore"):  # e^(2|x|) overflows to inf for the largest |x|, as intended
        _tanh_kernel[(triton.cdiv(x.size, block),)](torch.from_numpy(x).to(on), y, x.size, BLOCK=block)
    got, want = y.cpu().numpy().astype(np.float64), np.tanh(x.astype(np.float64))
    rel = np.abs(got[:-3] - want[:-3]) / np.abs(want[:-3])
    print(f"{device}: tanh max relative error {rel.max():.3g} ({rel.max() / 2**-23:.2f} eps) at x = "
          f"{x[np.argmax(rel)]:.9g}")
    bound = TANH_RTOL[device] * float(np.finfo(np.float32).eps)
    assert rel.max() <= bound, f"max relative error {rel.max():.3g} at x = {x[np.argmax(rel)]:.9g}"
    assert got[-3:].tolist() == [0.0, 1.0, -1.0]
    tiny = np.abs(x) < 1e-4  # tanh(x) = x in float32 there: exactly x, so c tanh(x / c) -> x
    np.testing.assert_array_equal(got[tiny], x[tiny])
    # the backward's factor 1 - t^2: relative error ~eps where it is ~1, absolute ~eps everywhere
    dcap_err = np.abs((1.0 - (got * got).astype(np.float32)) - (1.0 - want * want))[:-3]
    assert dcap_err.max() <= 4 * float(np.finfo(np.float32).eps)
