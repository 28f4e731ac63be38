"""The main job: run jax_flash_amd.attention forward and backward, check it, and time it.

    python examples/quickstart.py            # GPU if there is one, else the CPU
    python examples/quickstart.py --seq 8192 --causal   # a longer causal problem (on a GPU)

On a GPU: the compiled Triton kernels (implementation='triton'; bf16, 16 heads of 128) are checked
against the pure-JAX reference and timed next to jax.nn.dot_product_attention (XLA, and cuDNN where
available), in ms and TFLOP/s.

On a CPU (about 15 s on 2 cores; nothing here is a GPU number):
  1. the `xla` implementation, jax_flash_amd's pure-JAX attention (what attention() runs on a CPU by
     default), is timed forward and forward+backward on a moderate problem next to
     jax.nn.dot_product_attention, and checked against it;
  2. the Triton kernels themselves run in Triton's interpreter (implementation='interpret', needs
     torch) on a small problem, causal and not, forward and backward, checked against the float32
     reference. The interpreter executes the kernels in NumPy: correct, but slow and not a speed
     measurement, so it is not timed.
Exits 0 when every check passes, 1 otherwise.
"""
import argparse
import os
import time

import jax

ON_GPU = jax.default_backend() != "cpu"
if not ON_GPU:  # Triton enables its interpreter only if this is set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_flash_amd  # noqa: E402
from jax_flash_amd.timing import median_seconds  # noqa: E402

TOLERANCE = 2e-2  # max |diff| / max |ref|: rounding in bf16/fp16 is ~1e-2 at most
T0 = time.perf_counter()
NOTE = []  # what the final line must add


def say(msg: str = "") -> None:
    print(msg, flush=True)


def problem(shape, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    return tuple(jax.random.normal(x, shape, jnp.float32).astype(dtype) for x in ks)  # q, k, v, dout


def forward_and_grads(attn, q, k, v, do):
    """out, dq, dk, dv of attn at (q, k, v) for the output cotangent do."""
    out, vjp = jax.vjp(attn, q, k, v)
    return (out, *vjp(do))


def rel_errors(got, ref):
    """max |got - ref| / max |ref| for each of out, dq, dk, dv."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return [float(jnp.max(jnp.abs(f32(a) - f32(r))) / jnp.max(jnp.abs(f32(r)))) for a, r in zip(got, ref)]


def verdict(errs) -> bool:
    return bool(all(np.isfinite(errs)) and max(errs) < TOLERANCE)


def fmt(errs) -> str:
    return " ".join(f"{e:.1e}" for e in errs)


def time_peers(peers: dict, q, k, v, do, fwd_flops: float | None, reps: int) -> dict:
    """Times forward and forward+backward of each peer; prints one row each (TF/s only when
    fwd_flops is given, i.e. on a GPU). Returns {name: (out, dq, dk, dv)}."""
    def loss(attn):
        return lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

    head = f"  {'':28s} {'fwd ms':>9s} {'fwd+bwd ms':>11s}"
    say(head + (f" {'fwd TF/s':>9s} {'f+b TF/s':>9s}" if fwd_flops else ""))
    results = {}
    for name, attn in peers.items():
        try:
            fwd = jax.jit(attn)
            grad = jax.jit(jax.grad(loss(attn), argnums=(0, 1, 2)))
            results[name] = (fwd(q, k, v), *grad(q, k, v))
            t_f, t_fb = median_seconds(fwd, q, k, v, reps=reps), median_seconds(grad, q, k, v, reps=reps)
        except Exception as e:  # noqa: BLE001 - a peer may be unavailable here (e.g. cuDNN on ROCm)
            say(f"  {name:28s} unavailable: {str(e).splitlines()[0][:80]}")
            continue
        row = f"  {name:28s} {t_f * 1e3:9.2f} {t_fb * 1e3:11.2f}"
        if fwd_flops:  # FlashAttention's convention: backward = 2.5x forward
            row += f" {fwd_flops / t_f / 1e12:9.1f} {3.5 * fwd_flops / t_fb / 1e12:9.1f}"
        say(row)
    return results


def on_gpu(args) -> bool:
    b, n, h, d = args.batch, args.seq, args.heads, args.head_dim
    say(f"jax {jax.__version__} on {jax.devices()[0].device_kind}: the compiled Triton kernels "
        f"(implementation='triton'), q, k, v ({b}, {n}, {h}, {d}) bfloat16, causal={args.causal}")
    q, k, v, do = problem((b, n, h, d), jnp.bfloat16)
    c = args.causal
    peers = {"jax_flash_amd (triton)": lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=c,
                                                                                implementation="triton"),
             "jax_flash_amd (xla)": lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=c,
                                                                             implementation="xla"),
             "jax.nn (xla)": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=c,
                                                                          implementation="xla"),
             "jax.nn (cudnn)": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=c,
                                                                            implementation="cudnn")}
    say("timing (each compiles first) ...")
    results = time_peers(peers, q, k, v, do, 4 * b * h * n * n * d / (2 if c else 1), reps=10)
    errs = rel_errors(results["jax_flash_amd (triton)"], results["jax_flash_amd (xla)"])
    ok = verdict(errs)
    say(f"triton kernels vs the xla reference, max |diff| / max |ref| of out, dq, dk, dv: {fmt(errs)} "
        f"({'ok' if ok else 'MISMATCH'})")
    return ok


def on_cpu(args) -> bool:
    b, n, h, d = args.batch, args.seq, args.heads, args.head_dim
    cn = args.check_seq
    say(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, no GPU. On a CPU this runs:\n"
        f"  1. timed:   implementation='xla' (jax_flash_amd's pure-JAX attention, the CPU default) next to "
        f"jax.nn.dot_product_attention,\n"
        f"              q, k, v ({b}, {n}, {h}, {d}) float32, causal={args.causal}\n"
        f"  2. checked: the Triton kernels in Triton's interpreter (implementation='interpret'), forward and\n"
        f"              backward, causal and not, q, k, v (1, {cn}, 2, {d}) float16, against the float32 "
        f"reference;\n"
        f"              not timed: the interpreter runs the kernels in NumPy, its speed says nothing about a GPU")

    say("[1/2] xla implementation, timed (each call compiles first) ...")
    q, k, v, do = problem((b, n, h, d), jnp.float32)
    c = args.causal
    peers = {"jax_flash_amd (xla)": lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=c,
                                                                             implementation="xla"),
             "jax.nn.dot_product_attention": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=c)}
    results = time_peers(peers, q, k, v, do, None, reps=3)
    errs = rel_errors(*results.values())
    ok = verdict(errs)
    say(f"  xla vs jax.nn, max |diff| / max |ref| of out, dq, dk, dv: {fmt(errs)} ({'ok' if ok else 'MISMATCH'})")

    say(f"[2/2] Triton kernels in Triton's interpreter, checked ({time.perf_counter() - T0:.0f} s so far) ...")
    try:
        from jax_flash_amd import _interpret
        _interpret.check_available()
    except RuntimeError as e:
        say(f"  SKIPPED, the kernels were not checked: {e}")
        NOTE.append("the Triton kernels were not checked, see above")
        return ok
    q, k, v, do = problem((1, cn, 2, d), jnp.float16, seed=1)
    up = [x.astype(jnp.float32) for x in (q, k, v, do)]
    for causal in (False, True):
        t = time.perf_counter()
        got = forward_and_grads(lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=causal,
                                                                         implementation="interpret"), q, k, v, do)
        jax.block_until_ready(got)
        ref = forward_and_grads(lambda q, k, v: jax_flash_amd.attention(q, k, v, causal=causal,
                                                                         implementation="xla"), *up)
        errs = rel_errors(got, ref)
        ok &= verdict(errs)
        say(f"  causal={str(causal):5s} max |diff| / max |ref| of out, dq, dk, dv: {fmt(errs)} "
            f"({'ok' if verdict(errs) else 'MISMATCH'}; {time.perf_counter() - t:.1f} s in the interpreter)")
    return ok


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    ap.add_argument("--batch", type=int, default=4 if ON_GPU else 1, help="batch of the timed problem")
    ap.add_argument("--seq", type=int, default=4096 if ON_GPU else 1024, help="sequence length of the timed problem")
    ap.add_argument("--heads", type=int, default=16 if ON_GPU else 8, help="heads of the timed problem")
    ap.add_argument("--head-dim", type=int, default=128 if ON_GPU else 64, help="head dim (1..256)")
    ap.add_argument("--causal", action="store_true", help="causal attention in the timed problem")
    ap.add_argument("--check-seq", type=int, default=100,
                    help="CPU only: sequence length of the interpreter check (its time grows as its square)")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    ok = on_gpu(args) if ON_GPU else on_cpu(args)
    say(f"{'OK' if ok else 'MISMATCH'} ({'; '.join(NOTE + [f'{time.perf_counter() - T0:.0f} s'])})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
