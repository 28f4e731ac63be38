"""Repeated forward + backward calls of the shipped kernels, each call's outputs checked for non-finite values and
compared bit for bit with the first call's (the kernels are deterministic); exits 1 if a call was wrong. Run by
test_sm90.py::test_shipped_rows_under_contention, several processes at once on one GPU.

    python tests/contention.py N REPEATS causal|full alibi|noalibi D H [P]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash_amd


def main(argv):
    n, repeats = int(argv[0]), int(argv[1])
    causal, alibi = argv[2] == "causal", argv[3] == "alibi"
    d, h = int(argv[4]), int(argv[5])
    p = float(argv[6]) if len(argv) > 6 else 0.0
    b = 2
    keys = jax.random.split(jax.random.key(d + n), 5)
    q, k, v, do = (jax.random.normal(x, (b, n, h, d), jnp.bfloat16) for x in keys[:4])
    dlse = jax.random.normal(keys[4], (b, h, n), jnp.float32)
    slopes = jax.random.uniform(jax.random.key(1), (b, h), jnp.float32, 0.01, 0.5) if alibi else None
    kw = dict(causal=causal, alibi_slopes=slopes, return_lse=True,
              **(dict(dropout_p=p, dropout_rng=jax.random.key(2)) if p else {}))

    @jax.jit
    def call(q, k, v):
        (out, lse), pull = jax.vjp(lambda q, k, v: jax_flash_amd.attention(q, k, v, **kw), q, k, v)
        return (out, lse, *pull((do, dlse)))

    label = f"D {d} H {h} N {n} {argv[2]} {argv[3]}" + (f" dropout {p}" if p else "")
    first, failed = None, 0
    for rep in range(repeats):
        got = [np.asarray(x, np.float32) for x in call(q, k, v)]
        first = got if first is None else first
        bad = {}
        for name, x, x0 in zip(("out", "lse", "dq", "dk", "dv"), got, first):
            nonfinite, differ = int((~np.isfinite(x)).sum()), int((x.view(np.int32) != x0.view(np.int32)).sum())
            if nonfinite or differ:
                bad[name] = f"non-finite {nonfinite}, differ from call 0 {differ}"
        failed += bool(bad)
        if bad:
            print(label, "call", rep, bad, flush=True)
    print(label, f"calls {repeats}, wrong {failed}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
