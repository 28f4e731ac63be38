"""Register, spill, LDS and occupancy report of every kernel at its default config, cross-compiled
on the CPU with Triton's own HIP (and CUDA) backends: no GPU, no ROCm needed.

    python -m jax_flash_amd.amd_report [--arch gfx90a,gfx942,gfx950,sm90] [--head-dims 64,128,256]
                                       [--dtypes float16,bfloat16] [--check] [--jobs N]

The launches (kernel, constexprs, compile options) are recorded from the same code that runs them on a
GPU (``_launch.forward`` / ``_launch.backward``), and the options are those the installed jax-triton
passes to Triton (all of a config row with jax-triton >= 0.4 or none installed; only num_warps and
num_stages with 0.3.x), so the numbers describe what users run. ``--check`` exits
non-zero when a default config spills, needs more LDS / shared memory than the arch has, or gives the
forward at head_dim <= 128 on gfx942 (MI300) fewer than 2 waves per SIMD.
Run it without TRITON_INTERPRET: it compiles the kernels, it does not interpret them.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import inspect
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash_amd import _jax_triton_compat, _launch, fp8
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band
from jax_flash_amd.kernels import configs, fwd

AMD_ARCHS = ("gfx90a", "gfx942", "gfx950")
# Bytes of LDS per workgroup (AMD: per CU) and shared memory per block (sm90, opt-in maximum).
LOCAL_MEMORY = {"gfx90a": 64 << 10, "gfx942": 64 << 10, "gfx950": 160 << 10, "sm90": 227 << 10}
SIMDS_PER_CU = 4
_TRITON_DTYPE = {jnp.dtype(jnp.float16): "fp16", jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float32): "fp32",
                 jnp.dtype(jnp.int32): "i32", jnp.dtype(jnp.float8_e4m3fn): "fp8e4nv",
                 jnp.dtype(jnp.float8_e4m3fnuz): "fp8e4b8"}


@dataclasses.dataclass
class Row:
    arch: str
    kernel: str
    head_dim: int
    dtype: str
    causal: bool
    config: str
    vgprs: int = 0  # AMD: arch VGPRs; sm90: registers per thread
    agprs: int = 0
    sgprs: int = 0
    spill_bytes: int = 0  # AMD: scratch bytes per lane; sm90: spill stores
    local_mem: int = 0  # LDS / shared memory bytes per workgroup
    occupancy: int = 0  # AMD: waves per SIMD; sm90: 0 (not computed)
    error: str = ""

    def problems(self) -> list[str]:
        out = []
        if self.error:
            out.append(f"compile failed: {self.error}")
        if self.spill_bytes:
            out.append(f"spills {self.spill_bytes} bytes")
        if self.local_mem > LOCAL_MEMORY[self.arch]:
            out.append(f"needs {self.local_mem} B of LDS/shared memory, {self.arch} has {LOCAL_MEMORY[self.arch]}")
        if self.arch == "gfx942" and self.kernel.startswith("fwd") and self.head_dim <= 128 and self.occupancy < 2:
            out.append(f"forward occupancy {self.occupancy} < 2 waves/SIMD")
        return out


def _target(arch: str) -> str:
    return "cuda" if arch == "sm90" else arch


def record_launches(target: str, head_dim: int, dtype, causal: bool, kind: str = ""
                    ) -> list[tuple[str, _launch.Launch]]:
    """The launches of one forward and one backward, as the runtime would make them (shapes are nominal:
    sequence lengths are runtime arguments and do not change the compiled code). kind: "" (plain),
    "dropout" (its kernels draw random numbers: more registers), "window" (a narrow sliding window) or
    "gqa" (4 query heads per key/value head), which take the "+<kind>" config rows where the target
    has them; kernels are named with it. "decode": the KV-cache kernels (kvcache.record_launches)."""
    if kind == "decode":  # the KV-cache kernels (kernels/decode.py): decode, paged, chunked prefill, ...
        from jax_flash_amd import kvcache
        return kvcache.record_launches(target, head_dim, dtype)
    recorded = []

    def run(launch):
        recorded.append(launch)
        return launch.out_shapes

    x = jax.ShapeDtypeStruct((1, 1024, 16, head_dim), jnp.dtype(dtype))
    extras = Operands()
    band = Band.of(causal, (256, 0) if kind == "window" else (-1, -1), 1024, 1024)
    statics = _launch.Statics(head_dim ** -0.5, band, dropout_p=0.1 if kind == "dropout" else 0.0)
    kv = jax.ShapeDtypeStruct((1, 1024, 4, head_dim), jnp.dtype(dtype)) if kind == "gqa" else x
    if kind == "dropout":
        extras = Operands(seeds=jnp.zeros((1, 16, 2), jnp.uint32))
    if fp8.is_fp8(dtype):  # inference: the forward only
        extras = Operands(**dict.fromkeys(("q_descale", "k_descale", "v_descale"), jnp.ones((1, 16), jnp.float32)))
        _launch.forward(run, target, x, x, x, extras, statics=_launch.Statics(head_dim ** -0.5, band))
        return [("fwd", next(launch for launch in recorded if launch.kernel is fwd.attn_fwd))]
    out, lse = _launch.forward(run, target, x, kv, kv, extras, statics=statics)
    _launch.backward(run, target, x, kv, kv, out, lse, out, lse, extras, statics=statics)
    names = {"attn_fwd": "fwd", "attn_bwd_dkdv": "dkdv", "attn_bwd_dq": "dq"}
    suffix = f"+{kind}" if kind else ""
    return [(names[launch.kernel.__name__] + suffix, launch) for launch in recorded]


def _kinds(target: str) -> list[tuple[bool, str]]:
    """(causal, kind) cases of the report: window and gqa only where the target has their rows."""
    extra = [kind for kind in ("window", "gqa") if any(name.endswith("+" + kind) for name in configs.TARGETS[target])]
    return [(False, ""), (True, ""), (True, "dropout")] + [(True, kind) for kind in extra] + [(True, "decode")]


def _source(launch: _launch.Launch):
    from triton.compiler import ASTSource

    names = list(inspect.signature(launch.kernel.fn).parameters)
    values = [*launch.args, *launch.out_shapes]
    signature, attrs = {}, {}
    for i, (name, value) in enumerate(zip(names, values)):
        if isinstance(value, (jax.ShapeDtypeStruct, jax.Array)):
            signature[name] = "*" + _TRITON_DTYPE[jnp.dtype(value.dtype)]
            attrs[(i,)] = [["tt.divisibility", 16]]  # jax-triton passes 16-byte aligned buffers
        elif isinstance(value, np.floating):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    for name in names[len(values):]:
        signature[name] = "constexpr"
    return ASTSource(launch.kernel, signature, constexprs=dict(launch.constexprs), attrs=attrs)


def _amd_stats(row: Row, compiled, num_warps: int) -> None:
    gcn = compiled.asm["amdgcn"]

    def field(pattern):
        m = re.search(pattern, gcn, re.M)
        return int(m.group(1)) if m else 0

    row.vgprs = field(r"^\s*\.vgpr_count:\s+(\d+)")
    row.agprs = field(r"^\s*\.agpr_count:\s+(\d+)")
    row.sgprs = field(r"^\s*\.sgpr_count:\s+(\d+)")
    row.spill_bytes = field(r"^; ScratchSize: (\d+)")
    row.local_mem = compiled.metadata.shared
    occupancy = field(r"^; Occupancy: (\d+)")  # from registers (LLVM does not see Triton's dynamic LDS)
    if row.local_mem:
        workgroups = LOCAL_MEMORY[row.arch] // row.local_mem
        occupancy = min(occupancy, workgroups * num_warps // SIMDS_PER_CU)
    row.occupancy = occupancy


def _cuda_stats(row: Row, compiled) -> None:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", ptx, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True, check=True).stderr
    row.vgprs = int(re.search(r"Used (\d+) registers", log).group(1))
    row.spill_bytes = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    row.local_mem = compiled.metadata.shared


def compile_row(arch: str, head_dim: int, dtype: str, causal: bool, kernel: str) -> Row:
    import triton
    from triton.backends.compiler import GPUTarget

    kind = "decode" if kernel.startswith(("decode", "kv_append")) else kernel.partition("+")[2]
    launch = dict(record_launches(_target(arch), head_dim, dtype, causal, kind))[kernel]
    options = _jax_triton_compat.compiler_options(launch.compile_options)  # what the runtime passes
    shown = {k: v for k, v in launch.constexprs.items()
             if (k.startswith("BLOCK_") and k != "BLOCK_D") or (k == "SPLIT" and v)}
    row = Row(arch, kernel, head_dim, dtype, causal, config=" ".join(f"{k}={v}" for k, v in {**shown, **options}.items()))
    target = GPUTarget("cuda", 90, 32) if arch == "sm90" else GPUTarget("hip", arch, 64)
    try:
        compiled = triton.compile(_source(launch), target=target, options=options)
        if arch == "sm90":
            _cuda_stats(row, compiled)
        else:
            _amd_stats(row, compiled, options.get("num_warps", 4))
    except Exception as e:  # report it as a row; --check fails on it
        row.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return row


def work_items(archs, head_dims, dtypes) -> list[tuple]:
    """(arch, head_dim, dtype, causal, kernel) of every kernel the report compiles, in table order."""
    work = []
    for arch in archs:
        for head_dim in head_dims:
            for dtype in dtypes:
                for causal, kind in _kinds(_target(arch)):
                    for kernel, _ in record_launches(_target(arch), head_dim, dtype, causal, kind):
                        work.append((arch, head_dim, dtype, causal, kernel))
            for fp8_type in sorted(t.name for t in fp8.SUPPORTED[_target(arch)]):  # the fp8 forward
                work += [(arch, head_dim, fp8_type, causal, "fwd") for causal in (False, True)]
    return work


def report(archs, head_dims, dtypes, jobs: int) -> list[Row]:
    work = work_items(archs, head_dims, dtypes)
    # launches hold the kernels, which do not pickle: each worker records them again. Workers are
    # spawned, not forked: a fork of a process that has started JAX's threads can deadlock.
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_die_with_parent, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(compile_row, *args): i for i, args in enumerate(work)}
        rows = [None] * len(work)
        print(f"amd_report: compiling {len(work)} kernels on {jobs} worker(s)", file=sys.stderr, flush=True)
        start = last = time.monotonic()
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            rows[futures[future]] = future.result()
            now = time.monotonic()
            # a full run takes many minutes: say how far it is, every ~10 s and at the end
            if now - last >= 10 or done == len(work):
                print(f"amd_report: {done}/{len(work)} kernels compiled ({now - start:.0f} s)", file=sys.stderr,
                      flush=True)
                last = now
    except BaseException:
        # an error or Ctrl-C: do not wait for the queued compiles, stop the workers now
        pool.shutdown(wait=False, cancel_futures=True)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()
        raise
    pool.shutdown()
    return rows


def _die_with_parent(parent_pid: int) -> None:
    """Worker initializer: on Linux the kernel kills this worker when the process that started it dies,
    however it dies (kill -9, a test's timeout), so no compile outlives its report."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)


def format_table(rows: list[Row]) -> str:
    head = ("| arch | kernel | D | dtype | causal | config | VGPR | AGPR | SGPR | spill B | LDS/smem B | waves/SIMD |"
            " problems |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(f"| {r.arch} | {r.kernel} | {r.head_dim} | {r.dtype} | {'yes' if r.causal else 'no'} | {r.config} "
                     f"| {r.vgprs} | {r.agprs} | {r.sgprs} | {r.spill_bytes} | {r.local_mem} | {r.occupancy or '-'} "
                     f"| {'; '.join(r.problems())} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jax_flash_amd.amd_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=",".join(AMD_ARCHS),
                    help=f"comma-separated, from {', '.join(LOCAL_MEMORY)} (sm90: NVIDIA Hopper, registers from ptxas)")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--check", action="store_true", help="exit 1 if any default config spills, overflows LDS, "
                                                         "or gives the gfx942 forward (D <= 128) occupancy < 2")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("unset TRITON_INTERPRET: the report compiles the kernels")
    archs = [a for a in args.arch.split(",") if a]
    unknown = [a for a in archs if a not in LOCAL_MEMORY]
    if unknown:
        ap.error(f"--arch: unknown {unknown}; expected some of {list(LOCAL_MEMORY)}")
    rows = report(archs, [int(d) for d in args.head_dims.split(",")], args.dtypes.split(","), args.jobs)
    jt = _jax_triton_compat.versions()["jax-triton"]
    print(f"compile options as jax-triton {'.'.join(map(str, jt)) if jt else '>= 0.4 (not installed here)'} "
          f"passes them; triton {'.'.join(map(str, _jax_triton_compat.versions()['triton']))}\n")
    print(format_table(rows))
    bad = [r for r in rows if r.problems()]
    if args.check:
        print(f"\ncheck: {len(rows) - len(bad)}/{len(rows)} kernels pass", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
