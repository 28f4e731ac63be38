"""Reproducer of the warp-specialised dK/dV kernels' non-finite gradients (issue 19; benchmarks/results/NOTES.md,
"Ninth session"): one backward with a chosen D 64 dK/dV row, printing how many dQ / dK / dV values are
non-finite and in which (batch element, 128-key block). Needs a Hopper GPU. Without a sanitizer every row is
right; under compute-sanitizer (any tool, even with no kernel instrumented) the warp-specialised rows return
non-finite dK and dV on every call, the same TMA row without warp specialisation does not:

    compute-sanitizer --tool racecheck --kernel-name kns=no_such_kernel \\
        python -m benchmarks.hopper_ws_sanitizer_probe ROW [N [REPEATS [causal|full [alibi|noalibi]]]]

ROW: shipped (configs._SM90_DKDV64_TMA), s3 (3 stages), 64x128 (64-query blocks), nows (no warp specialisation,
8 warps)."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import _launch, _triton
from jax_flash_amd.kernels import configs
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band

ROWS = {"shipped": configs._SM90_DKDV64_TMA, "s3": dict(configs._SM90_DKDV64_TMA, num_stages=3),
        "64x128": dict(configs._SM90_DKDV64_TMA, BLOCK_M=64),
        "nows": dict(configs._SM90_DKDV64_TMA, WARP_SPECIALIZE=False, num_warps=8)}


def main(argv):
    name = argv[0]
    n = int(argv[1]) if len(argv) > 1 else 300
    repeats = int(argv[2]) if len(argv) > 2 else 1
    causal = (argv[3] if len(argv) > 3 else "causal") == "causal"
    alibi = (argv[4] if len(argv) > 4 else "alibi") == "alibi"
    b, h, d = 2, 4, 64  # the shape of the GPU test that failed once (tests/test_sm90.py)
    keys = jax.random.split(jax.random.key(d + n), 4)
    q, k, v, do = (jax.random.normal(x, (b, n, h, d), jnp.bfloat16) for x in keys)
    extras = Operands(slopes=jax.random.uniform(jax.random.key(1), (b, h), jnp.float32, 0.01, 0.5) if alibi else None)
    statics = _launch.Statics(d ** -0.5, Band.of(causal, (-1, -1), n, n))
    dlse = jnp.zeros((b, h, n), jnp.float32)

    @jax.jit
    def grads(q, k, v, do):
        out, lse = _launch.forward(_triton.run, "sm90", q, k, v, extras, statics=statics)
        return _launch.backward(_triton.run, "sm90", q, k, v, out, lse, do, dlse, extras, statics=statics,
                                rows={"dkdv": ROWS[name]})

    for rep in range(repeats):
        bad = {}
        for grad, x in zip(("dq", "dk", "dv"), grads(q, k, v, do)):
            where = np.argwhere(~np.isfinite(np.asarray(x, np.float32)))
            bad[grad] = (len(where), sorted({(int(i[0]), int(i[1]) // 128) for i in where}))
        print(name, n, "causal" if causal else "full", "alibi" if alibi else "noalibi", rep, bad, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
