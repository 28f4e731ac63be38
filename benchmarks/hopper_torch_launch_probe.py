"""Runs the backward's launches through Triton's own launcher (torch tensors; triton.set_allocator supplies the
global scratch of the in-kernel TMA descriptors) instead of jax-triton, to tell jaxlib's scratch and launch from
the compiled kernel (issue 19; benchmarks/results/NOTES.md, "Twelfth session"). Needs a Hopper GPU and a CUDA
torch, and runs the kernels it imports: main's pass racecheck; the failing ones (lse through a TMA tile, a third
TMA load per warp-specialised iteration) were an experiment tree run from its own directory. Each call's dq / dk
/ dv are checked for non-finite values and against dK/dV's pointer row (jax-triton). Set
XLA_PYTHON_CLIENT_PREALLOCATE=false, or JAX takes the memory torch needs.

    [compute-sanitizer --tool racecheck --kernel-name kns=no_such_kernel] \
        python -m benchmarks.hopper_torch_launch_probe SCRATCH [N [causal|full [D [H [CALLS [ROW]]]]]]

SCRATCH: fresh (new memory for every launch, never freed during the run), poison (the same, filled with 0xff
bytes: a descriptor read before it is written shows), reuse (one buffer per size, as a caching allocator gives),
jax (the launches through jax-triton, for comparison). ROW: default (kernels/configs.py), s3 (the dK/dV row at 3
stages), nods (without the dS path), both D 128 only. Exits 1 if a call was wrong."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.hopper_rows_sweep import pointer_dkdv
from jax_flash_amd import _launch, _triton
from jax_flash_amd.kernels import configs
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band

ROWS = {"default": None, "s3": {"dkdv": dict(configs._SM90_DKDV_TMA, num_stages=3)},  # D 128's row
        "nods": {"dkdv": dict(configs._SM90_DKDV_TMA, DS=False)}}
SCRATCH = ("fresh", "poison", "reuse", "jax")


def torch_runner(scratch: str):
    """A _launch.Run launching through Triton with torch tensors, global scratch as `scratch` says."""
    import torch
    import triton

    kept, by_size = [], {}
    os.environ["TRITON_CACHE_DIR"] = "/tmp/triton-cache"  # jax-triton 0.3.1 empties it on import

    def allocate(size, alignment, stream):
        if scratch == "reuse" and size in by_size:
            return by_size[size]
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        if scratch == "poison":
            t.fill_(0xFF)
        kept.append(t)
        by_size[size] = t
        return t

    triton.set_allocator(allocate)
    dtypes = {jnp.dtype(jnp.bfloat16): torch.bfloat16, jnp.dtype(jnp.float16): torch.float16,
              jnp.dtype(jnp.float32): torch.float32, jnp.dtype(jnp.int32): torch.int32}

    def run(launch):
        if launch.aliases:  # in place into a JAX array's buffer: none at the probe's lengths (the dS path's edge
            # launch aliases its workspace from 256 query blocks: configs.DS_EDGES_APART_BLOCKS)
            raise NotImplementedError(f"{launch.kernel.__name__}: outputs aliased to inputs")
        args = [torch.from_dlpack(a.block_until_ready()) if isinstance(a, jax.Array)
                else float(a) if isinstance(a, np.floating) else a for a in launch.args]
        outs = [torch.full(tuple(s.shape), float("nan"), dtype=dtypes[jnp.dtype(s.dtype)], device="cuda")
                if jnp.issubdtype(s.dtype, jnp.floating)
                else torch.zeros(tuple(s.shape), dtype=dtypes[jnp.dtype(s.dtype)], device="cuda")
                for s in launch.out_shapes]
        launch.kernel[launch.grid](*args, *outs, **launch.constexprs, **launch.compile_options)
        torch.cuda.synchronize()
        return tuple(jnp.from_dlpack(o) for o in outs)

    return run


def main(argv):
    scratch = argv[0]
    n = int(argv[1]) if len(argv) > 1 else 256
    causal = (argv[2] if len(argv) > 2 else "full") == "causal"
    d = int(argv[3]) if len(argv) > 3 else 128
    h = int(argv[4]) if len(argv) > 4 else 4
    calls = int(argv[5]) if len(argv) > 5 else 2
    row = argv[6] if len(argv) > 6 else "default"
    if scratch not in SCRATCH or row not in ROWS or (row != "default" and d != 128):
        sys.exit(f"SCRATCH one of {SCRATCH}, ROW one of {tuple(ROWS)} (other than default: D 128 only); "
                 f"given {scratch}, {row}, D {d}")
    keys = jax.random.split(jax.random.key(d + n), 4)
    q, k, v, do = (jax.random.normal(x, (2, n, h, d), jnp.bfloat16) for x in keys)
    statics = _launch.Statics(d ** -0.5, Band.of(causal, (-1, -1), n, n))
    dlse = jnp.zeros((2, h, n), jnp.float32)
    out, lse = _launch.forward(_triton.run, "sm90", q, k, v, Operands(), statics=statics)
    ref = [np.asarray(x, np.float32) for x in _launch.backward(
        _triton.run, "sm90", q, k, v, out, lse, do, dlse, Operands(), statics=statics, rows={"dkdv": pointer_dkdv(d)})]
    run = _triton.run if scratch == "jax" else torch_runner(scratch)
    label = f"{scratch} {row} D {d} H {h} N {n} {'causal' if causal else 'full'}"
    wrong = 0
    for call in range(calls):
        got = [np.asarray(x, np.float32) for x in _launch.backward(
            run, "sm90", q, k, v, out, lse, do, dlse, Operands(), statics=statics, rows=ROWS[row])]
        report, bad = [], False
        for name, x, x_ref in zip(("dq", "dk", "dv"), got, ref):
            finite = np.isfinite(x)
            err = float(np.abs(np.where(finite, x, 0) - x_ref).max() / np.abs(x_ref).max())
            report.append(f"{name} non-finite {int((~finite).sum())} error {err:.4f}")
            bad |= not finite.all() or err > 0.03
        rows = sorted({(int(i[0]), int(i[1]), int(i[2])) for i in np.argwhere(~np.isfinite(got[0]))})
        if rows:  # (batch, query row, head) of dq's non-finite values
            report.append(f"dq rows {rows[:8]}")
        wrong += bad
        print(label, "call", call, "; ".join(report), flush=True)
    print(label, f"calls {calls}, wrong {wrong}", flush=True)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
