"""Reproducer of the warp-specialised dK/dV kernels' non-finite gradients (issue 19; benchmarks/results/NOTES.md,
"Ninth session" and "Tenth session"): repeated forward + backward calls with chosen sm90 rows, each call's
outputs checked for non-finite values and compared bit for bit with the first call's (the kernels are
deterministic); batch 2, H heads (4), exits 1 if a call was wrong. Needs a Hopper GPU.

    [compute-sanitizer --tool racecheck --kernel-name kns=no_such_kernel] \
        python -m benchmarks.hopper_ws_sanitizer_probe ROW [N [REPEATS [causal|full [alibi|noalibi [D [H [P]]]]]]]

With lse and delta through 1-D TMA descriptors (the kernels up to commit 7947690) the warp-specialised dK/dV
rows failed two ways: under compute-sanitizer (racecheck, even with no kernel instrumented; not memcheck,
synccheck or initcheck) every call returned NaN (D 64 and D 128); and with 16 such processes at once on one GPU,
without a sanitizer, the D 64 row returned NaN in 42 of 600 calls. With lse and delta through pointers the D 128
row passes both; the D 64 one no longer compiles (Triton 3.6), so D 64 ships without warp specialisation.

ROW: default (the rows that ship: kernels/configs.py), ws (the warp-specialised dK/dV row of D: D 128's shipped
row, D 64's, which shipped until the tenth session), s3 (it at 3 stages), 64x128 (it with 64-query blocks), nows
(it without warp specialisation, 8 warps), fwd (the warp-specialised forward row, one program per tile, with
dK/dV's pointer row; the D 128 row's tiles at any D), fwd-persistent (the same, persistent where balanced).
P: a dropout rate (default 0), the same seeds every call."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.hopper_rows_sweep import pointer_dkdv
from jax_flash_amd import _launch, _triton, reference
from jax_flash_amd.kernels import configs
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band


def rows(name: str, d: int) -> dict:
    """{kernel: row} of ROW name at head dim d."""
    # the warp-specialised dK/dV row of d (D 64: not shipped; with lse / delta through pointers, as now, Triton
    # 3.6's warp-specialisation pass asserts on it, so it no longer compiles)
    dkdv = dict(configs._SM90_DKDV64_TMA, WARP_SPECIALIZE=True, num_warps=4) if d <= 64 else configs._SM90_DKDV_TMA
    pointer = pointer_dkdv(d)
    return {"default": None, "ws": {"dkdv": dkdv}, "s3": {"dkdv": dict(dkdv, num_stages=3)},
            "64x128": {"dkdv": dict(dkdv, BLOCK_M=64)},
            "nows": {"dkdv": dict(dkdv, WARP_SPECIALIZE=False, num_warps=8)},
            "fwd": {"fwd": dict(configs._SM90_FWD_TMA, PERSISTENT=0), "dkdv": pointer},
            "fwd-persistent": {"fwd": configs._SM90_FWD_TMA, "dkdv": pointer}}[name]


def main(argv):
    name = argv[0]
    n = int(argv[1]) if len(argv) > 1 else 300
    repeats = int(argv[2]) if len(argv) > 2 else 1
    causal = (argv[3] if len(argv) > 3 else "causal") == "causal"
    alibi = (argv[4] if len(argv) > 4 else "alibi") == "alibi"
    d = int(argv[5]) if len(argv) > 5 else 64
    h = int(argv[6]) if len(argv) > 6 else 4
    p = float(argv[7]) if len(argv) > 7 else 0.0
    b = 2  # 2 x 300 x 4: the shape of the GPU test that failed once (tests/test_sm90.py)
    keys = jax.random.split(jax.random.key(d + n), 4)
    q, k, v, do = (jax.random.normal(x, (b, n, h, d), jnp.bfloat16) for x in keys)
    extras = Operands(slopes=jax.random.uniform(jax.random.key(1), (b, h), jnp.float32, 0.01, 0.5) if alibi else None,
                      seeds=reference.dropout_seeds(jax.random.key(2), b, h) if p else None)
    statics = _launch.Statics(d ** -0.5, Band.of(causal, (-1, -1), n, n), dropout_p=p)
    dlse = jnp.zeros((b, h, n), jnp.float32)
    chosen = rows(name, d)

    @jax.jit
    def call(q, k, v, do):
        out, lse = _launch.forward(_triton.run, "sm90", q, k, v, extras, statics=statics, rows=chosen)
        return (out, lse) + _launch.backward(_triton.run, "sm90", q, k, v, out, lse, do, dlse, extras,
                                             statics=statics, rows=chosen)

    label = (f"{name} D {d} H {h} N {n} {'causal' if causal else 'full'} {'alibi' if alibi else 'noalibi'}"
             + (f" dropout {p}" if p else ""))
    names = ("out", "lse", "dq", "dk", "dv")
    first, failed = None, 0
    for rep in range(repeats):
        got = [np.asarray(x, np.float32) for x in call(q, k, v, do)]
        first = got if first is None else first
        bad = {}
        for what, x, x0 in zip(names, got, first):
            where = np.argwhere(~np.isfinite(x))  # (batch, row, head, column) for out / dq / dk / dv
            differ = int((x.view(np.int32) != x0.view(np.int32)).sum())
            if len(where) or differ:  # the pattern: how many, which (batch, 128-row block)s, heads, rows, columns
                pattern = f"non-finite {len(where)} (nan {int(np.isnan(x).sum())}), differ from call 0 {differ}"
                if len(where) and x.ndim == 4:
                    pattern += (f", blocks {sorted({(int(i[0]), int(i[1]) // 128) for i in where})} heads "
                                f"{len(set(where[:, 2]))} rows {len({(i[0], i[1]) for i in where})} columns "
                                f"{len(set(where[:, 3]))}")
                bad[what] = pattern
        failed += bool(bad)
        if bad or repeats == 1:
            print(label, "call", rep, bad or "finite", flush=True)
    print(label, f"calls {repeats}, wrong {failed}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
