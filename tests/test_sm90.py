"""Every Hopper (sm90) forward config row that moves tiles through TMA descriptors, shipped or a tuning
candidate, run on the GPU against float64 (ragged blocks, two batch elements): some TMA / warp-specialised
tiles of Triton 3.6 compute NaN or hang, so none may ship unchecked. GPU only (skipped elsewhere)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracle
from helpers import ON_GPU, assert_close, inputs, run as run_impl
from jax_flash_amd import _launch, _triton
from jax_flash_amd.kernels import configs
from jax_flash_amd.rules import Band

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a GPU")]

ROWS = [r for r in configs.TARGETS["sm90"]["fwd"] + configs.CANDIDATES["sm90"]["fwd"] if r.get("TMA")]
ROWS = [r for i, r in enumerate(ROWS) if r not in ROWS[:i]]


def _id(row):
    return f"d{row['max_block_d']}-{row['BLOCK_M']}x{row['BLOCK_N']}-w{row['num_warps']}-s{row['num_stages']}" + (
        "-ws" if row.get("WARP_SPECIALIZE") else "")


@pytest.mark.parametrize("row", ROWS, ids=_id)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_sm90_row(row, dtype, causal):
    if _triton.target() != "sm90":
        pytest.skip("needs a Hopper GPU")
    d = row["max_block_d"]
    b, sq, sk, h = 2, 300, 300, 3  # ragged last blocks at every tile size; two batch elements
    q, k, v, dout, dlse = inputs((b, sq, h, d), (b, sk, h, d), dtype, seed=d)
    statics = _launch.Statics(d ** -0.5, Band.of(causal, (-1, -1), sq, sk))
    run, target = _triton.run, _triton.target()
    out, lse2 = jax.jit(lambda q, k, v: _launch.forward(run, target, q, k, v, statics=statics, rows={"fwd": row}))(
        q, k, v)
    ref = oracle.attention(q, k, v, dout, causal=causal)
    got = dict(out=out, lse=lse2 * np.log(2))
    assert np.isfinite(np.asarray(out, np.float32)).all()
    assert_close(got, ref, run_impl("xla", q, k, v, dout, dlse, causal=causal), dtype, names=("out", "lse"))
