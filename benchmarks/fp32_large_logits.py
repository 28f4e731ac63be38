"""Where float32 loses precision at large logits: the case of tests/test_attention.py::
test_large_logits_stay_finite[float32-*] (q x 30, (1, 150, 150, 2, 64), base-2 logits up to ~190).

    python -m benchmarks.fp32_large_logits                  # NumPy emulation of the kernels' fp32 math, by stage
    OPENBLAS_CORETYPE=Haswell python -m benchmarks.fp32_large_logits   # OpenBLAS's AVX2 kernel (AMD Zen 1-3)
    python -m benchmarks.fp32_large_logits --impl triton    # the kernels (or interpret): errors, the test's rule

The emulation follows kernels/fwd.py and kernels/bwd.py operation for operation in float32 (dots with
np.matmul, as Triton's interpreter does them; the interpreter's block sizes), with switches that replace
one stage at a time by a better one, so each stage's share of the error shows.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

LOG2E, LN2 = np.float32(1.4426950408889634), np.float32(0.6931471805599453)
F32 = np.float32


def _problem():
    import jax.numpy as jnp

    from helpers import inputs
    q, k, v, dout, dlse = inputs((1, 150, 2, 64), (1, 150, 2, 64), jnp.float32, 0, 30.0)
    return tuple(np.asarray(x) for x in (q, k, v, dout, dlse))


def _pad(x, n):
    out = np.zeros((n,) + x.shape[1:], x.dtype)
    out[:x.shape[0]] = x
    return out


def _dot(a, b):
    return np.matmul(a, b, dtype=F32)


def _forward(q, k, v, qk_scale, bm=32, bn=16):
    """kernels/fwd.py for one head, no mask but the ragged last key block: (out, lse2 (base 2), logits)."""
    sq, sk = q.shape[0], k.shape[0]
    qp, kp, vp = _pad(q, -(-sq // bm) * bm), _pad(k, -(-sk // bn) * bn), _pad(v, -(-sk // bn) * bn)
    out = np.zeros_like(qp)
    lse2 = np.zeros(qp.shape[0], F32)
    logits = np.zeros((qp.shape[0], kp.shape[0]), F32)
    for m0 in range(0, qp.shape[0], bm):
        qb = qp[m0:m0 + bm]
        m_i = np.full(bm, -np.inf, F32)
        l_i = np.zeros(bm, F32)
        acc = np.zeros((bm, q.shape[1]), F32)
        for n0 in range(0, kp.shape[0], bn):
            s = _dot(qb, kp[n0:n0 + bn].T)
            logits[m0:m0 + bm, n0:n0 + bn] = s
            seen = (n0 + np.arange(bn)) < sk
            s2 = np.where(seen[None], s * qk_scale, F32(-np.inf))
            m_new = np.maximum(m_i, s2.max(1))
            p = np.exp2(s2 - m_new[:, None])
            alpha = np.exp2(m_i - m_new)
            l_i = l_i * alpha + p.sum(1, dtype=F32)
            acc = _dot(p, vp[n0:n0 + bn]) + acc * alpha[:, None]
            m_i = m_new
        out[m0:m0 + bm] = acc / l_i[:, None]
        lse2[m0:m0 + bm] = m_i + np.log2(l_i)
    return out[:sq], lse2[:sq], logits[:sq, :sk]


def _dv(q, k, dout, lse2, qk_scale, logits=None, bm=16, bn=32):
    """kernels/bwd.py's dV for one head: P = exp2(s * qk_scale - lse2) from the backward's own q.k dot
    ([BN, D] x [D, BM], transposed against the forward's), or from `logits` where given."""
    sq, sk = q.shape[0], k.shape[0]
    s_t = np.zeros((sk, sq), F32)
    for n0 in range(0, sk, bn):
        for m0 in range(0, sq, bm):
            s_t[n0:n0 + bn, m0:m0 + bm] = _dot(_pad(k[n0:n0 + bn], bn), _pad(q[m0:m0 + bm], bm).T)[
                :min(bn, sk - n0), :min(bm, sq - m0)]
    if logits is not None:
        s_t = logits.T
    p_t = np.exp2(s_t * qk_scale - lse2[None, :])
    return _dot(p_t, dout), p_t.T


def emulate():
    import oracle
    q, k, v, dout, dlse = _problem()
    ref = oracle.attention(q, k, v, dout, dlse)
    scale = 64 ** -0.5
    qk_scale = F32(scale) * LOG2E  # sm_scale is an fp32 argument, LOG2E a constexpr: the product rounds to fp32
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}  max |logit| base 2: "
          f"{np.max(np.abs(ref['lse'])) / np.log(2):.1f} (ulp {np.spacing(F32(128)):.2g})")
    rows = {}
    for h in range(q.shape[2]):
        qh, kh, vh, doh = (x[0, :, h] for x in (q, k, v, dout))
        q64, k64 = qh.astype(np.float64), kh.astype(np.float64)
        s_exact = q64 @ k64.T * scale / np.log(2)  # base 2
        lse2_exact = ref["lse"][0, h] / np.log(2)
        p_exact = np.exp2(s_exact - lse2_exact[:, None])
        out, lse2, logits = _forward(qh, kh, vh, qk_scale)
        lse_nat = lse2 * LN2  # what the forward stores (natural log, the API's lse)
        round_trip = lse_nat * LOG2E  # what _lse2 in bwd.py reads back
        variants = {
            "kernels (bwd logits from own dot, lse via natural log)": dict(lse2=round_trip, logits=None),
            "lse kept in base 2 (no round trip)": dict(lse2=lse2, logits=None),
            "bwd logits bitwise = fwd logits": dict(lse2=round_trip, logits=logits),
            "both": dict(lse2=lse2, logits=logits),
        }
        stage = rows.setdefault("stages", {})
        stage.setdefault("logits q.k*scale*log2e (fp32 dot), abs err base 2", []).append(
            np.max(np.abs(logits * qk_scale - s_exact)))
        stage.setdefault("fwd lse2, abs err", []).append(np.max(np.abs(lse2 - lse2_exact)))
        stage.setdefault("lse2 -> lse -> lse2 round trip, abs change", []).append(np.max(np.abs(round_trip - lse2)))
        stage.setdefault("out, abs err", []).append(np.max(np.abs(out - ref["out"][0, :, h])))
        for name, kw in variants.items():
            dv, p = _dv(qh, kh, doh, kw["lse2"], qk_scale, kw["logits"])
            big = p_exact > 1e-3
            r = rows.setdefault(name, {"P rel err (P > 1e-3)": [], "dv abs err": []})
            r["P rel err (P > 1e-3)"].append(np.max(np.abs(p - p_exact)[big] / p_exact[big]))
            r["dv abs err"].append(np.max(np.abs(dv - ref["dv"][0, :, h])))
    for name, r in rows.items():
        print(f"  {name}")
        for what, vals in r.items():
            print(f"      {what:<55s} {max(vals):.3g}")
    print(f"  float64 dv scale {np.max(np.abs(ref['dv'])):.3g}")


def kernel(impl):
    import jax.numpy as jnp

    import oracle
    from helpers import assert_close, run
    q, k, v, dout, dlse = _problem()
    ref = oracle.attention(q, k, v, dout, dlse)
    args = [jnp.asarray(x) for x in (q, k, v, dout, dlse)]
    got, base = run(impl, *args), run("xla", *args)
    for name in ("out", "lse", "dq", "dk", "dv"):
        r = ref[name]
        fin = np.isfinite(r)
        err = np.max(np.abs(np.asarray(got[name], np.float64)[fin] - r[fin]))
        base_err = np.max(np.abs(np.asarray(base[name], np.float64)[fin] - r[fin]))
        print(f"{impl} {name:4s} err {err:.3g}  xla {base_err:.3g}  ratio {err / base_err:.2f}  "
              f"scale {np.max(np.abs(r[fin])):.3g}")
    try:
        assert_close(got, ref, base, jnp.float32)
        print("test rule: pass")
    except AssertionError as e:
        print("test rule: FAIL", e)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=["triton", "interpret", "xla"], help="run the real kernels instead")
    a = ap.parse_args()
    kernel(a.impl) if a.impl else emulate()
