"""Forward sweep on a Hopper GPU: cuDNN vs our sm90 default rows vs TMA + warp-specialised tiles, with each
one's max error against cuDNN (benchmarks/results/NOTES.md, "Hopper"). python -m benchmarks.hopper_fwd_sweep [OUT.json]"""
import json
import sys

import jax
import jax.numpy as jnp

from jax_flash_amd import _launch, _triton
from jax_flash_amd.rules import Band
from jax_flash_amd.timing import median_seconds

print("target", _triton.target(), flush=True)
rows_out = []
shapes = [(16, 1024, 16, 128), (4, 4096, 16, 128), (1, 16384, 16, 128), (16, 1024, 32, 64), (4, 4096, 32, 64), (1, 16384, 32, 64), (3, 1000, 16, 128), (2, 1531, 8, 64)]
for (b, n, h, d) in shapes:
    for causal in (False, True):
        ks = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(x, (b, n, h, d), jnp.bfloat16) for x in ks)
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        statics = _launch.Statics(d ** -0.5, Band.of(causal, (-1, -1), n, n))
        res = {}
        f = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn"))
        try:
            res["cudnn"] = median_seconds(f, q, k, v, reps=5, budget_s=0.5)
        except Exception as e:
            print("cudnn failed", e)
        ref = f(q, k, v)
        def ours(target, row=None):
            g = jax.jit(lambda q, k, v: _launch.forward(_triton.run, target, q, k, v, statics=statics,
                                                        rows=None if row is None else {"fwd": row})[0])
            out = g(q, k, v)
            err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
            return median_seconds(g, q, k, v, reps=5, budget_s=0.5), err
        res["sm90_default"] = ours("sm90")
        base = dict(max_block_d=d, TMA=True)
        for bm, bn, w, st, ws in [(128, 128, 4, 2, True), (128, 64, 4, 2, True)] + ([(128, 128, 4, 3, True), (128, 64, 4, 3, True)] if d == 64 else [(128, 64, 4, 3, True)]):
            r = {**base, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st, "WARP_SPECIALIZE": ws}
            name = f"{bm}x{bn}w{w}s{st}{'ws' if ws else ''}"
            try:
                res[name] = ours("sm90", r)
            except Exception as e:
                res[name] = (None, str(e)[:80])
        cud = res.get("cudnn")
        line = {"shape": (b, n, h, d), "causal": causal}
        for key, val in res.items():
            t, err = (val, 0.0) if key == "cudnn" else val
            if t is None:
                line[key] = err
                continue
            line[key] = dict(tflops=round(flops / t / 1e12, 1), ratio=round(cud / t, 3) if cud else None, err=round(err, 4))
        print(json.dumps(line), flush=True)
        rows_out.append(line)
json.dump(rows_out, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tma.json", "w"), indent=1)
