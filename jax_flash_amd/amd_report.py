"""Register, spill, LDS, occupancy and inner-loop report of every kernel at its default config,
cross-compiled on the CPU with Triton's own HIP (and CUDA) backends: no GPU, no ROCm needed.

    python -m jax_flash_amd.amd_report [--arch gfx90a,gfx942,gfx950,sm90] [--head-dims 64,128,256]
                                       [--dtypes float16,bfloat16] [--check] [--jobs N] [--json PATH]

The launches (kernel, constexprs, compile options) are recorded from the same code that runs them on a
GPU (``_launch.forward`` / ``_launch.backward``), and the options are those the installed jax-triton
passes to Triton (all of a config row with jax-triton >= 0.4 or none installed; only num_warps and
num_stages with 0.3.x); array arguments carry the specialization the launch path gives them
(``_jax_triton_compat.pointer_specialization``: on AMD the 32-bit pointer range that makes buffer
loads), so the numbers describe what users run.

On AMD the report also reads the unmasked inner loop of each kernel from its AMDGCN (``loop_stats``),
one (query block, key block) tile per iteration: MFMA instructions and v_exp_f32 per tile (all waves)
against the tile's ideal (products x 2*BM*BN*BLOCK_D flops over the instruction's; one exponential per
probability), buffer vs global loads, LDS bytes per tile and instructions per wave per iteration.
``--check`` exits non-zero when a default config spills, needs more LDS / shared memory than the arch
has, gives the forward at head_dim <= 128 on gfx942 (MI300) fewer than 2 waves per SIMD, or (AMD)
issues more than DUPLICATION_LIMIT times the ideal MFMA flops or exponentials per tile (work repeated
by several warps), or global loads in the loop (64-bit addresses where buffer loads fit).
Run it without TRITON_INTERPRET: it compiles the kernels, it does not interpret them.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import inspect
import json
import math
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

from jax_flash_amd import _jax_triton_compat, _kernel_factory, _launch, fp8, plan
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band
from jax_flash_amd.kernels import configs

AMD_ARCHS = ("gfx90a", "gfx942", "gfx950")
# Bytes of LDS per workgroup (AMD: per CU) and shared memory per block (sm90, opt-in maximum).
LOCAL_MEMORY = {"gfx90a": 64 << 10, "gfx942": 64 << 10, "gfx950": 160 << 10, "sm90": 227 << 10}
SIMDS_PER_CU = 4
LANES = 64  # per AMD wave
DUPLICATION_LIMIT = 1.05  # --check: MFMA flops or v_exp_f32 per tile above this times the ideal
# Matrix products per (query block, key block) tile: forward S = QK^T, PV; dQ S, dP, dQ; dK/dV S^T, dV, dP^T,
# dK (SPLIT: the dK program's S^T, dP^T, dK, the loop loop_stats reads)
# The linear backward (--linear): dK/dV and dQ in one loop, five products (a SPLIT row: dK and dQ's four, then dV's
# two in a launch of its own)
PRODUCTS = {"fwd": 2, "dq": 3, "dkdv": 4, "decode": 2, "dbias": 2,  # decode: the KV-cache forward (kernels/decode.py)
            "dkdvdq": 5, "dkdq": 4, "dv": 2}
_TRITON_DTYPE = {jnp.dtype(jnp.float16): "fp16", jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float32): "fp32",
                 jnp.dtype(jnp.int32): "i32", jnp.dtype(jnp.float8_e4m3fn): "fp8e4nv",
                 jnp.dtype(jnp.float8_e4m3fnuz): "fp8e4b8", jnp.dtype(jnp.int8): "i8"}


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
    # AMD, the unmasked inner loop (one (query block, key block) tile per iteration; loop_stats):
    mfma: str = ""  # the MFMA instructions it issues, e.g. "f32_32x32x8_bf16"
    mfma_tile: int = 0  # MFMA instructions per tile (all waves)
    mfma_ideal: int = 0  # what the tile's products need: products * 2*BM*BN*BLOCK_D flops / the instruction's
    mfma_ratio: float = 0.0  # flops issued / flops needed (1.0: no duplicated work)
    exp_tile: int = 0  # v_exp_f32 per tile (all waves)
    exp_ideal: int = 0  # BM*BN/64 (one per probability, 64 lanes), plus one per wave for the forward's rescale
    buffer_loads: int = 0  # buffer_load instructions per wave per iteration
    global_loads: int = 0  # global_load instructions per wave per iteration (64-bit addresses)
    load_bytes: int = 0  # bytes per lane of those loads, per iteration
    lds_bytes: int = 0  # LDS bytes read + written per tile (all waves)
    loop_instrs: int = 0  # instructions per wave per iteration
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
        # the loop checks apply to the attention kernels (the KV-cache combine and append have no matrix products)
        if self.arch in AMD_ARCHS and not self.error and self.kernel.partition("+")[0] in PRODUCTS:
            if not self.mfma_tile:
                out.append("no MFMA loop found")
            elif self.mfma_ratio > DUPLICATION_LIMIT:
                out.append(f"duplicated MFMA work: {self.mfma_ratio:.2f}x the tile's ({self.mfma_tile} vs "
                           f"{self.mfma_ideal} per tile)")
            if self.exp_tile > DUPLICATION_LIMIT * self.exp_ideal:
                out.append(f"duplicated exp work: {self.exp_tile} v_exp_f32 per tile, ideal {self.exp_ideal}")
            if self.global_loads:
                out.append(f"{self.global_loads} global loads per iteration (buffer loads expected)")
        return out


def _target(arch: str) -> str:
    return arch  # each arch is a config target of its own (kernels/configs.py TARGETS)


def record_launches(target: str, head_dim: int, dtype, causal: bool, kind: str = ""
                    ) -> list[tuple[str, _launch.Launch]]:
    """The launches of one forward and one backward, as the runtime would make them (shapes are nominal:
    sequence lengths are runtime arguments and do not change the compiled code). kind: "" (plain),
    "dropout" (its kernels draw random numbers: more registers), "window" (a narrow sliding window) or
    "gqa" (4 query heads per key/value head), which take the "+<kind>" config rows where the target
    has them, "bias" (a (1, heads, seq, seq) bias: a tile of it per block, and its gradient's kernel) or "mask" (a
    (1, 1, seq, seq) mask); kernels are named with it. "decode": the KV-cache kernels
    (kvcache.record_launches). "linear": the linear backward's launches alone (plan.Policy(linear_backward=True))."""
    if kind == "decode":  # the KV-cache kernels (kernels/decode.py): decode, paged, chunked prefill, ...
        from jax_flash_amd import kvcache
        return kvcache.record_launches(target, head_dim, dtype)
    recorded = []

    def run(launch):
        recorded.append(launch)
        return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)

    # arrays (zeros, a few MB), not shapes: the launchers compute some operands with XLA (the dS path's delta)
    x = jnp.zeros((1, 1024, 16, head_dim), jnp.dtype(dtype))
    extras = Operands()
    band = Band.of(causal, (256, 0) if kind == "window" else (-1, -1), 1024, 1024)
    # linear: its atomics (the plan keeps AMD's deterministic calls off it)
    statics = _launch.Statics(head_dim ** -0.5, band, dropout_p=0.1 if kind == "dropout" else 0.0,
                              deterministic=kind != "linear")
    kv = jnp.zeros((1, 1024, 4, head_dim), jnp.dtype(dtype)) if kind == "gqa" else x
    if kind == "dropout":
        extras = Operands(seeds=jnp.zeros((1, 16, 2), jnp.uint32))
    if kind == "bias":
        extras = Operands(bias=jnp.zeros((1, 16, 1024, 1024), jnp.dtype(dtype)))
    if kind == "mask":
        extras = Operands(mask=jnp.ones((1, 1, 1024, 1024), bool))
    names = {"attn_fwd": "fwd", "attn_bwd_dkdv": "dkdv", "attn_bwd_dq": "dq", "attn_bwd_dq_ds": "dqds",
             "attn_bwd_dbias": "dbias", "attn_fwd_sm90": "fwd", "attn_bwd_dkdv_sm90": "dkdv",  # sm90: Gluon kernels
             "attn_bwd_dkdvdq_sm90": "dkdvdq"}
    if fp8.is_fp8(dtype):  # inference: the forward only
        extras = Operands(**dict.fromkeys(("q_descale", "k_descale", "v_descale"), jnp.ones((1, 16), jnp.float32)))
        _launch.forward(run, target, x, x, x, extras, statics=_launch.Statics(head_dim ** -0.5, band))
        return [("fwd", next(launch for launch in recorded if names.get(launch.kernel.__name__) == "fwd"))]
    out, lse = _launch.forward(run, target, x, kv, kv, extras, statics=statics)
    if kind == "linear":
        del recorded[:]
    with plan.using(plan.active().replace(linear_backward=kind == "linear")):
        _launch.backward(run, target, x, kv, kv, out, lse, out, lse, extras, statics=statics)

    def name(launch):
        if launch.kernel.__name__ == "attn_bwd_dkdv_dq":
            return {(True, True): "dkdvdq", (True, False): "dkdq", (False, True): "dv"}[
                (launch.constexprs["DK"], launch.constexprs["DV"])]
        return names[launch.kernel.__name__]

    suffix = f"+{kind}" if kind else ""
    return [(name(launch) + suffix, launch) for launch in recorded]


def _kinds(target: str) -> list[tuple[bool, str]]:
    """(causal, kind) cases of the report: window and gqa only where the target has their rows."""
    extra = [kind for kind in ("window", "gqa") if any(name.endswith("+" + kind) for name in configs.TARGETS[target])]
    return ([(False, ""), (True, ""), (True, "dropout")] + [(True, kind) for kind in extra]
            + [(True, "bias"), (True, "mask"), (True, "decode")])  # bias, mask: dense, over (queries, keys)


def _source(launch: _launch.Launch, platform: str):
    """The kernel as jax-triton hands it to Triton on `platform` ("hip" or "cuda"): array arguments
    16-byte aligned, and on AMD said to span < 2 GiB (buffer loads) when they do, by the rule the
    launch path applies (_jax_triton_compat.pointer_specialization), with each array's real size."""
    from triton.backends.amd.compiler import HIPBackend
    from triton.backends.nvidia.compiler import CUDABackend
    backend = HIPBackend if platform == "hip" else CUDABackend
    names = list(inspect.signature(launch.kernel.fn).parameters)
    values = [*launch.args, *launch.out_shapes]
    signature, attrs = {}, {}
    for i, (name, value) in enumerate(zip(names, values)):
        if isinstance(value, (jax.ShapeDtypeStruct, jax.Array)):
            signature[name] = "*" + _TRITON_DTYPE[jnp.dtype(value.dtype)]
            nbytes = math.prod(value.shape) * jnp.dtype(value.dtype).itemsize
            attrs[(i,)] = backend.parse_attr(_jax_triton_compat.pointer_specialization(nbytes, platform))
        elif isinstance(value, np.floating):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    for name in names[len(values):]:
        signature[name] = "constexpr"
    return _kernel_factory.source(launch.kernel, signature, dict(launch.constexprs), attrs)


# v_mfma_<acc type>_<M>x<N>x<K>[_<blocks>b]_<input type> (gfx942 / gfx950 names) or ..._<M>x<N>x<K><input
# type>[_1k] (gfx90a names, which do not say the block count of the multi-block variants: listed here)
_MFMA = re.compile(r"v_mfma_(?:[a-z0-9]+_)+?(\d+)x(\d+)x(\d+)(?:_(\d+)b_)?")
_GFX90A_BLOCKS = {"32x32x4bf16_1k": 2, "16x16x4bf16_1k": 4, "4x4x4bf16_1k": 16, "32x32x2bf16": 2, "16x16x2bf16": 4,
                  "4x4x2bf16": 16, "32x32x4f16": 2, "16x16x4f16": 4, "4x4x4f16": 16, "32x32x1f32": 2,
                  "16x16x1f32": 4, "4x4x1f32": 16}
_LOAD = re.compile(r"(buffer|global)_load_(?:lds_)?(dword(?:x(\d))?|[us]?byte|[us]?short)")
_LDS = re.compile(r"ds_(?:read|write|load|store)(2(?:st64)?)?_[bui](\d+)")


def _mfma_flops(mnemonic: str) -> int:
    m = _MFMA.match(mnemonic)
    M, N, K = (int(m.group(i)) for i in (1, 2, 3))
    blocks = int(m.group(4)) if m.group(4) else _GFX90A_BLOCKS.get(mnemonic[len("v_mfma_f32_"):], 1)
    return 2 * M * N * K * blocks


def _load_bytes(mnemonic: str) -> int:
    m = _LOAD.match(mnemonic)
    if m.group(2).startswith("dword"):
        return 4 * int(m.group(3) or 1)
    return 1 if "byte" in m.group(2) else 2


def loops(gcn: str) -> list[list[str]]:
    """The loops of an AMDGCN listing, in code order, each as the instructions (mnemonic and operands) of
    its basic blocks: LLVM marks a loop's header block "Loop Header" and each other block of it "in Loop:
    Header=<that block>" (innermost loop)."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in gcn.splitlines():
        label = re.match(r"^(?:\.L(BB\d+_\d+):|; %bb\.\d+:)\s*(?:;(.*))?$", line)
        if label:
            comment = label.group(2) or ""
            inside = re.search(r"in Loop: Header=(BB\d+_\d+)", comment)
            current = label.group(1) if "Loop Header" in comment else inside.group(1) if inside else None
            if current is not None:
                bodies.setdefault(current, [])
        elif re.match(r"^[A-Za-z_][\w.]*:", line):  # the function's own label
            current = None
        elif current is not None and line[:1] in ("\t", " "):
            text = line.split(";")[0].strip()
            if text and not text.startswith("."):  # not an assembler directive (.loc, ...)
                bodies[current].append(text)
    return list(bodies.values())


def loop_stats(gcn: str) -> dict:
    """Per-wave counts of a kernel's unmasked inner loop, the one most tiles take: of the loops that issue
    the most MFMA instructions (SPLIT dK/dV: the dK program's), the shortest (the loop over the masked
    blocks at a band's edges does the same products plus the masking). Empty if no loop issues MFMAs. (Code
    order says nothing: LLVM places blocks as it likes.)"""
    mfma_loops = [b for b in loops(gcn) if any(i.startswith("v_mfma") for i in b)]
    if not mfma_loops:
        return {}
    most = max(sum(i.startswith("v_mfma") for i in b) for b in mfma_loops)
    body = min((b for b in mfma_loops if sum(i.startswith("v_mfma") for i in b) == most), key=len)
    ops = [i.split()[0] for i in body]
    mfma = [o for o in ops if o.startswith("v_mfma")]
    loads = [o for o in ops if _LOAD.match(o)]
    lds = [_LDS.match(o) for o in ops]
    return dict(
        instrs=len(ops), mfma=mfma, mfma_flops=sum(map(_mfma_flops, mfma)),
        exp=sum(o.startswith("v_exp_f32") for o in ops),
        buffer_loads=sum(o.startswith("buffer") for o in loads),
        global_loads=sum(o.startswith("global") for o in loads),
        load_bytes=sum(map(_load_bytes, loads)),
        lds_bytes=sum(int(m.group(2)) // 8 * (2 if m.group(1) else 1) for m in lds if m),
    )


def _amd_stats(row: Row, compiled, num_warps: int, launch: _launch.Launch) -> None:
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

    stats = loop_stats(gcn)
    if not stats or row.kernel.partition("+")[0] not in PRODUCTS:
        return
    # every wave runs the loop body once per tile: per-tile counts are the per-wave ones times the waves
    c = launch.constexprs
    kernel = row.kernel.partition("+")[0]
    products = 3 if kernel == "dkdv" and c.get("SPLIT") else PRODUCTS[kernel]
    tile = c["BLOCK_M"] * c["BLOCK_N"]
    flops = products * 2 * tile * c["BLOCK_D"]
    row.mfma = ",".join(sorted({m[len("v_mfma_"):] for m in stats["mfma"]}))
    row.mfma_tile = len(stats["mfma"]) * num_warps
    row.mfma_ratio = stats["mfma_flops"] * num_warps / flops
    row.mfma_ideal = round(row.mfma_tile / row.mfma_ratio)
    row.exp_tile = stats["exp"] * num_warps
    # one exponential per probability, 64 to an instruction; the forward also rescales its running sums
    # (exp2(m_old - m_new), one per query row: one instruction per wave, two where a 16-wide MFMA layout puts
    # two rows in a lane)
    rows_a_lane = 2 if c.get("BLOCK_N") == 16 or launch.compile_options.get("matrix_instr_nonkdim") == 16 else 1
    row.exp_ideal = tile // LANES + (num_warps * rows_a_lane if kernel in ("fwd", "decode") else 0)
    row.buffer_loads, row.global_loads = stats["buffer_loads"], stats["global_loads"]
    row.load_bytes = stats["load_bytes"]
    row.lds_bytes = stats["lds_bytes"] * LANES * num_warps
    row.loop_instrs = stats["instrs"]


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


def compile_launch(launch: _launch.Launch, arch: str, options: dict):
    """Triton's compiled kernel of a launch for `arch` (gfx90a / gfx942 / gfx950 / sm90), on the CPU."""
    import triton
    from triton.backends.compiler import GPUTarget

    platform, target = ("cuda", GPUTarget("cuda", 90, 32)) if arch == "sm90" else ("hip", GPUTarget("hip", arch, 64))
    return triton.compile(_source(launch, platform), target=target, options=options)


def compile_row(arch: str, head_dim: int, dtype: str, causal: bool, kernel: str) -> Row:
    kind = "decode" if kernel.startswith(("decode", "kv_append")) else kernel.partition("+")[2]
    launch = dict(record_launches(_target(arch), head_dim, dtype, causal, kind))[kernel]
    options = _jax_triton_compat.compiler_options(launch.compile_options)  # what the runtime passes
    shown = {k: v for k, v in launch.constexprs.items()
             if (k.startswith("BLOCK_") and k != "BLOCK_D") or (k == "SPLIT" and v)}
    row = Row(arch, kernel, head_dim, dtype, causal, config=" ".join(f"{k}={v}" for k, v in {**shown, **options}.items()))
    try:
        compiled = compile_launch(launch, arch, options)
        if arch == "sm90":
            _cuda_stats(row, compiled)
        else:
            _amd_stats(row, compiled, options.get("num_warps", 4), launch)
    except Exception as e:  # report it as a row; --check fails on it
        row.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return row


def work_items(archs, head_dims, dtypes, linear: bool = False) -> list[tuple]:
    """(arch, head_dim, dtype, causal, kernel) of every kernel the report compiles, in table order; linear: the
    linear backward's too (causal)."""
    work = []
    for arch in archs:
        for head_dim in head_dims:
            for dtype in dtypes:
                for causal, kind in _kinds(_target(arch)) + ([(True, "linear")] if linear else []):
                    for kernel, _ in record_launches(_target(arch), head_dim, dtype, causal, kind):
                        work.append((arch, head_dim, dtype, causal, kernel))
            for fp8_type in sorted(t.name for t in fp8.SUPPORTED[_target(arch)]):  # the fp8 forward
                work += [(arch, head_dim, fp8_type, causal, "fwd") for causal in (False, True)]
    return work


def report(archs, head_dims, dtypes, jobs: int, linear: bool = False) -> list[Row]:
    work = work_items(archs, head_dims, dtypes, linear)
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
    """Markdown. The loop columns (AMD: the unmasked inner loop, loop_stats) are per tile (all waves) for
    MFMA, v_exp and LDS bytes, and per wave and iteration for loads and instructions."""
    head = ("| arch | kernel | D | dtype | causal | config | VGPR | AGPR | SGPR | spill B | LDS/smem B | waves/SIMD |"
            " MFMA | MFMA/tile (ideal) | v_exp/tile (ideal) | loads/iter | LDS B/tile | instrs/iter | problems |")
    lines = [head, "|" + "---|" * 19]
    for r in rows:
        loop = ["-"] * 6
        if r.mfma_tile:
            loads = " + ".join(f"{n} {kind}" for n, kind in ((r.buffer_loads, "buffer"), (r.global_loads, "global"))
                               if n) or "0"
            loop = [r.mfma, f"{r.mfma_tile} ({r.mfma_ideal})", f"{r.exp_tile} ({r.exp_ideal})",
                    f"{loads}, {r.load_bytes} B", str(r.lds_bytes), str(r.loop_instrs)]
        lines.append(f"| {r.arch} | {r.kernel} | {r.head_dim} | {r.dtype} | {'yes' if r.causal else 'no'} | {r.config} "
                     f"| {r.vgprs} | {r.agprs} | {r.sgprs} | {r.spill_bytes} | {r.local_mem} | {r.occupancy or '-'} "
                     f"| {' | '.join(loop)} | {'; '.join(r.problems())} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m jax_flash_amd.amd_report", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--arch", default=",".join(AMD_ARCHS),
                    help=f"comma-separated, from {', '.join(LOCAL_MEMORY)} (sm90: NVIDIA Hopper, registers from ptxas)")
    ap.add_argument("--head-dims", default="64,128,256", help="comma-separated head dims to compile the kernels for")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated input dtypes")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if any default config spills, overflows LDS, gives the gfx942 forward (D <= 128) "
                         "occupancy < 2, or (AMD) does duplicated MFMA / exp work or global loads in its loop")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="compile in this many processes, one per CPU by default")
    ap.add_argument("--json", metavar="PATH", help="also write the rows (and their problems) as JSON")
    ap.add_argument("--linear", action="store_true",
                    help="also the linear backward (plan.Policy(linear_backward=True), which no default plan takes)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("unset TRITON_INTERPRET: the report compiles the kernels")
    archs = [a for a in args.arch.split(",") if a]
    unknown = [a for a in archs if a not in LOCAL_MEMORY]
    if unknown:
        ap.error(f"--arch: unknown {unknown}; expected some of {list(LOCAL_MEMORY)}")
    rows = report(archs, [int(d) for d in args.head_dims.split(",")], args.dtypes.split(","), args.jobs, args.linear)
    jt = _jax_triton_compat.versions()["jax-triton"]
    print(f"compile options as jax-triton {'.'.join(map(str, jt)) if jt else '>= 0.4 (not installed here)'} "
          f"passes them; triton {'.'.join(map(str, _jax_triton_compat.versions()['triton']))}\n")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(versions={k: ".".join(map(str, v)) if v else None
                                     for k, v in _jax_triton_compat.versions().items()},
                           rows=[dict(dataclasses.asdict(r), problems=r.problems()) for r in rows]), f, indent=1)
    bad = [r for r in rows if r.problems()]
    if args.check:
        print(f"\ncheck: {len(rows) - len(bad)}/{len(rows)} kernels pass", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
