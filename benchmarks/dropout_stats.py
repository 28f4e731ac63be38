"""Statistics of dropout's random bytes (kernels/dropout.py, through reference.dropout_bytes, bit for bit the
kernels'): is a byte independent of its neighbours, of the other corners of its 2 x 2 squares, and of the byte
at the same place under a nearby seed?

    python -m benchmarks.dropout_stats [--n 4096] [--seeds 16] [--json PATH]

Each test is a chi-square over 65,536 (or 256) cells, as z = (chi2 - dof) / sqrt(2 dof), summed over the seeds
and divided by sqrt(seeds) (one z per test, standard normal if the bytes are independent and uniform). Pairs: the
byte and the one `lag` keys (h) or queries (v) away, at lags 1, 2, 3, 8, 13, 64, 89, 144, 233, 377, 987, 1024
(Fibonacci lags among them: the per-key multiplier is golden-ratio based); d / ad: diagonal neighbours. Quads: the
top 4 bits of the 4 corners of squares (1 x 1 .. 64 x 64 apart, and random ones): the xor structure of the row and
column keys would show there. Seeds: the mask under seed words one apart, and the high bit flipped. Each seed's
square starts at a random offset below 2^17 (long calls, ring shards)."""
import argparse
import json
import sys

import jax.numpy as jnp
import numpy as np

from jax_flash_amd import reference

LAGS = (1, 2, 3, 8, 13, 64, 89, 144, 233, 377, 987, 1024)
QUADS = ((1, 1), (1, 2), (2, 1), (1, 13), (64, 64))


def _z(idx, cells):
    cnt = np.bincount(idx.ravel(), minlength=cells)
    e = idx.size / cells
    return float((((cnt - e) ** 2 / e).sum() - (cells - 1)) / np.sqrt(2 * (cells - 1)))


def _pairs(a, b):
    return _z(a.astype(np.int64) * 256 + b, 65536)


def _quad(a, b, c, d):
    f = lambda x: (x >> 4).astype(np.int64)  # noqa: E731
    return _z(((f(a) * 16 + f(b)) * 16 + f(c)) * 16 + f(d), 65536)


def draw(lo, hi, n, row0, col0):
    """[n, n] random bytes of seed (lo, hi) for queries row0.. and keys col0.."""
    seeds = jnp.asarray([[[lo, hi]]], jnp.uint32)
    at = lambda x: jnp.asarray([x], jnp.int32)  # noqa: E731
    return np.asarray(reference.dropout_bytes(seeds, n, n, at(row0), at(col0))[0, 0]).astype(np.uint8)


def tests(lo, hi, n, row0, col0, rng) -> dict:
    """{test: z} for one seed."""
    b = draw(lo, hi, n, row0, col0)
    t = {"bytes": _z(b.astype(np.int64), 256)}
    for lag in LAGS:
        if lag < n:
            t[f"h{lag}"] = _pairs(b[:, :-lag], b[:, lag:])
            t[f"v{lag}"] = _pairs(b[:-lag], b[lag:])
    t["d"] = _pairs(b[:-1, :-1], b[1:, 1:])
    t["ad"] = _pairs(b[:-1, 1:], b[1:, :-1])
    for dq, dk in QUADS:
        if max(dq, dk) < n:
            t[f"quad{dq}x{dk}"] = _quad(b[:-dq, :-dk], b[dq:, :-dk], b[:-dq, dk:], b[dq:, dk:])
    # two distinct rows and columns (equal ones would make equal corners: a bias of the test, not of the bytes)
    r, c = rng.integers(0, n, n * n), rng.integers(0, n, n * n)
    r, c = np.stack([r, (r + rng.integers(1, n, n * n)) % n]), np.stack([c, (c + rng.integers(1, n, n * n)) % n])
    t["quad-random"] = _quad(b[r[0], c[0]], b[r[1], c[0]], b[r[0], c[1]], b[r[1], c[1]])
    for name, (lo2, hi2) in {"lo+1": (lo + 1, hi), "hi+1": (lo, hi + 1), "both+1": (lo + 1, hi + 1),
                             "lo^2^31": (lo ^ 1 << 31, hi)}.items():
        t[f"seed {name}"] = _pairs(b, draw(lo2 % 2 ** 32, hi2 % 2 ** 32, n, row0, col0))
    return t


def battery(n: int, seeds: int, seed: int = 0) -> dict:
    """{test: z over `seeds` random seeds}."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(seeds):
        lo, hi = (int(x) for x in rng.integers(0, 2 ** 32, 2))
        row0, col0 = (int(x) for x in rng.integers(0, 2 ** 17, 2))
        runs.append(tests(lo, hi, n, row0, col0, rng))
    return {k: sum(r[k] for r in runs) / np.sqrt(seeds) for k in runs[0]}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dropout_stats", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=4096, help="side of the square of bytes tested per seed")
    ap.add_argument("--seeds", type=int, default=16, help="seeds whose z-scores are combined")
    ap.add_argument("--seed", type=int, default=0, help="of the seeds drawn")
    ap.add_argument("--json", metavar="PATH", help="also write the z-scores as JSON")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    z = battery(args.n, args.seeds, args.seed)
    for k, v in z.items():
        print(f"{k:>14} {v:+.2f}")
    worst = max(z, key=lambda k: abs(z[k]))
    print(f"\n{len(z)} tests, {args.seeds} seeds of {args.n} x {args.n}: largest |z| {abs(z[worst]):.2f} ({worst})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(n=args.n, seeds=args.seeds, z=z), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
