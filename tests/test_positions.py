"""Operands.positions: a call that is one block of a larger call (what ring attention runs per step)
equals that larger call restricted to the block: its rows, with the keys outside the block hidden (by
segment ids), for window, ALiBi, dropout and GQA, forward and backward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import KERNEL_IMPLS, inputs
from jax_flash_amd import _dispatch, reference
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band

NAMES = ("out", "lse", "dq", "dk", "dv")
# the larger call (seq_q != seq_k: its diagonal differs from the block's) and the block: rows [30, 54),
# keys [13, 53); starts on no block boundary (dropout's hash takes any), ragged block lengths
SQ, SK, R0, C0, SQ_BLOCK, SK_BLOCK = 80, 96, 30, 13, 24, 40


def _vjp(impl, q, k, v, dout, dlse, extras, opts):
    @jax.jit
    def f(q, k, v, dout, dlse, extras):
        (out, lse), pull = jax.vjp(lambda q, k, v: _dispatch.attention(q, k, v, extras, opts), q, k, v)
        return dict(zip(NAMES, (out, lse, *pull((dout, dlse)))))

    return f(q, k, v, dout, dlse, extras)


@pytest.mark.matrix
@pytest.mark.parametrize("impl", KERNEL_IMPLS + ["xla"])
@pytest.mark.parametrize("case", ["causal-window-alibi", "window", "dropout", "gqa-causal-window-alibi-dropout"])
def test_block_of_a_larger_call(impl, case):
    heads_kv = 1 if "gqa" in case else 2
    q, k, v, dout, dlse = inputs((1, SQ, 2, 16), (1, SK, heads_kv, 16), jnp.float32, seed=11)
    rows = slice(R0, R0 + SQ_BLOCK)
    keys = slice(C0, C0 + SK_BLOCK)
    # cotangents only on the block's rows: the larger call's dk, dv of the block's keys are then the block's
    dout = jnp.zeros_like(dout).at[:, rows].set(dout[:, rows])
    dlse = jnp.zeros_like(dlse).at[:, :, rows].set(dlse[:, :, rows])
    window = (20, 0) if "causal" in case else (20, 7) if "window" in case else (-1, -1)
    opts = _dispatch.Options(implementation=impl, softmax_scale=0.3, dropout_p=0.3 if "dropout" in case else 0.0,
                             band=Band.of("causal" in case, window, SQ, SK))
    common = dict(slopes=jnp.array([[0.2, 0.45]]) if "alibi" in case else None,
                  seeds=reference.dropout_seeds(jax.random.key(5), 1, 2) if "dropout" in case else None)
    kv_ids = jnp.ones((1, SK), jnp.int32).at[:, keys].set(0)
    larger = _vjp(impl, q, k, v, dout, dlse, Operands(q_segment_ids=jnp.zeros((1, SQ), jnp.int32),
                                                      kv_segment_ids=kv_ids, **common), opts)
    positions = jnp.array([[R0, C0, SK - SQ]], jnp.int32)
    got = _vjp(impl, q[:, rows], k[:, keys], v[:, keys], dout[:, rows], dlse[:, :, rows],
               Operands(positions=positions, **common), opts)
    want = dict(out=larger["out"][:, rows], lse=larger["lse"][:, :, rows], dq=larger["dq"][:, rows],
                dk=larger["dk"][:, keys], dv=larger["dv"][:, keys])
    for name in NAMES:
        g, w = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=name)
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin], w[fin], atol=2e-6 * max(1.0, np.abs(w[fin]).max()), err_msg=name)
