"""Proof that a change to the Python layer leaves the compiled kernels unchanged: a fingerprint of the code
every kernel launch of a fixed list of calls compiles to, cross-compiled on the CPU (no GPU needed).

    python -m benchmarks.compiled_code record OUT.json [--targets sm90,gfx90a,gfx942,gfx950] [--jobs 2]
    python -m benchmarks.compiled_code compare BASE.json NEW.json

`record` fingerprints the checkout on PYTHONPATH (jax_flash_amd is imported from there even with -m, which puts the
current directory first, so the script of one checkout records another):
each call of the list below (every config row of kernels/configs.py on sm90, Gluon tables included, the
persistent and tiled grids, EDGES apart launches, the dS and seven-product backward paths, each head width and
dtype whose rows differ, causal / windows / dropout / GQA / segment ids / softcap / ALiBi / ring positions,
ragged and whole, short and long; amd_report's calls on each AMD target; the KV-cache kernels everywhere) is
recorded from the code that launches it on a GPU (_launch.forward / backward with a recording `run`, traced
abstractly: nothing is allocated) and each distinct launch (kernel, constexprs, options, argument types and
specialisation) compiled once, in --jobs processes.
`compare` exits 1 if any call differs: the set of call ids, then per call the number, order, kernel names and
grids of its launches, and per launch the compiled code's metrics. sm90: PTX and SASS opcode histograms
(opcodes with their modifiers), registers, spill stores / loads, stack, barriers, shared memory, global scratch
and the compiled warp count (warp specialisation changes it). AMD: amd_report's register / spill / LDS /
occupancy / inner-loop fields and an AMDGCN opcode histogram. No hash of the instruction stream: Triton's
warp-specialisation pass places its mbarriers in shared memory in an order that varies from one compile to the
next (the sm90 TMA dK/dV rows: swapped offsets, same histograms), so a hash would differ with nothing changed.
Constexpr and argument names are recorded for diagnosis but not compared: a refactor may rename or regroup
them; what it must not change is the code.

Forced, the same for every checkout: the Gluon kernels (sm90) are chosen only where launches use the compiled
warp count, which depends on the jax-triton installed: the calls plan with plan.Policy(compiled_warps=True);
compute_units falls back to configs.DECODE_SPLITS on a CPU. TRITON_INTERPRET must be unset (the kernels are
compiled, not interpreted). The baseline, benchmarks/results/compiled_code_19c5971.json, was recorded from
19c5971 (before the plan module) by this script's version of that commit.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import importlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import types

@functools.cache
def internals():
    """Every name of jax_flash_amd the script uses: adapt here if the refactor moves one."""
    import jax
    import jax.numpy as jnp

    # the checkout on PYTHONPATH, not one in the current directory (python -m puts that first); the rest of
    # sys.path as it was, so that spawned workers find this script's module where the parent did
    saved, sys.path[:0] = sys.path[:], [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    try:
        import jax_flash_amd
        from jax_flash_amd import _jax_triton_compat, _launch, amd_report, kvcache, plan
        from jax_flash_amd.operands import Operands
        from jax_flash_amd.rules import Band
    finally:
        sys.path[:] = saved

    if plan.interpreted():
        raise SystemExit("unset TRITON_INTERPRET: the kernels are compiled, not interpreted")
    policy = plan.Policy(compiled_warps=True)  # the Gluon paths, whatever jax-triton is here

    def attention(target, call):
        """The launches (kernel, grid, args, out_shapes, constexprs, compile_options) of one call."""
        recorded = []

        def run(launch):
            recorded.append(launch)
            return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)

        def trace(q, k, v, extras):
            band = Band.of(call.causal, call.window, call.sq, call.seq_k)
            statics = _launch.Statics(call.d ** -0.5, band, softcap=call.softcap, dropout_p=call.dropout)
            operands = Operands(**extras)
            out, lse = _launch.forward(run, target, q, k, v, operands, statics=statics, policy=policy)
            if call.backward:
                _launch.backward(run, target, q, k, v, out, lse, out, lse, operands, statics=statics, policy=policy)

        b, h, h_kv, dtype = call.b, call.h, call.heads_kv, jnp.dtype(call.dtype)
        sds, i32, f32 = jax.ShapeDtypeStruct, jnp.int32, jnp.float32
        q, kv = sds((b, call.sq, h, call.d), dtype), sds((b, call.seq_k, h_kv, call.d), dtype)
        extras = dict(slopes=sds((b, h), f32) if call.alibi else None,
                      seeds=sds((b, h, 2), i32) if call.dropout else None,
                      q_segment_ids=sds((b, call.sq), i32) if call.segments else None,
                      kv_segment_ids=sds((b, call.seq_k), i32) if call.segments else None,
                      positions=sds((b, 3), i32) if call.positions else None,
                      **dict.fromkeys(("q_descale", "k_descale", "v_descale"),
                                      sds((b, h_kv), f32) if dtype.itemsize == 1 else None))
        jax.eval_shape(trace, q, kv, kv, {k: x for k, x in extras.items() if x is not None})  # abstract: no memory
        return recorded

    def amd_stats(arch, kernel_name, compiled, num_warps, launch):
        names = {"attn_fwd": "fwd", "attn_bwd_dkdv": "dkdv", "attn_bwd_dq": "dq", "attn_decode": "decode"}
        row = amd_report.Row(arch, names.get(kernel_name, kernel_name), launch.constexprs.get("HEAD_DIM", 0), "",
                             False, "")
        amd_report._amd_stats(row, compiled, num_warps, launch)
        return {f: getattr(row, f) for f in ("vgprs", "agprs", "sgprs", "spill_bytes", "local_mem", "occupancy", "mfma",
                                             "mfma_tile", "exp_tile", "buffer_loads", "global_loads", "load_bytes",
                                             "lds_bytes", "loop_instrs")}

    return types.SimpleNamespace(
        attention=attention, kvcache=kvcache.record_launches, source=amd_report._source,
        compile=amd_report.compile_launch, options=_jax_triton_compat.compiler_options, amd_stats=amd_stats,
        die_with_parent=amd_report._die_with_parent,
        code=os.path.dirname(os.path.dirname(os.path.abspath(jax_flash_amd.__file__))))


# ----- the calls -----
@dataclasses.dataclass(frozen=True)
class Call:
    target: str
    d: int
    dtype: str
    sq: int
    causal: bool = True
    b: int = 1
    h: int = 16
    h_kv: int = 0  # 0: h
    sk: int = 0  # 0: sq
    window: tuple = (-1, -1)
    dropout: float = 0.0
    softcap: float = 0.0
    alibi: bool = False
    segments: bool = False
    positions: bool = False  # a block of a ring attention call: the Gluon kernels pass, the Triton TMA rows serve
    backward: bool = True

    seq_k = property(lambda self: self.sk or self.sq)
    heads_kv = property(lambda self: self.h_kv or self.h)

    def id(self) -> str:
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(self.dtype, self.dtype)
        shape = f"{self.b}x{self.sq}" + (f"x{self.sk}" if self.sk else "") + f"x{self.h}"
        parts = [self.target, "fwd+bwd" if self.backward else "fwd", f"D{self.d}", short,
                 "causal" if self.causal else "full", shape + (f"/{self.h_kv}" if self.h_kv else "")]
        parts += [f"window=({self.window[0]},{self.window[1]})"] * (self.window != (-1, -1))
        parts += [f"dropout={self.dropout}"] * bool(self.dropout) + [f"softcap={self.softcap}"] * bool(self.softcap)
        return " ".join(parts + [n for n in ("alibi", "segments", "positions") if getattr(self, n)])


def sm90_calls() -> list[Call]:
    """Every sm90 config row through the paths that choose them; float32 and
    D 32 only where they take rows of their own (float32 the next width's), float16 once (bfloat16's rows)."""
    C = functools.partial(Call, "sm90")
    bf16, fp32, fp8 = "bfloat16", "float32", "float8_e4m3fn"
    shapes = ((1024, False), (1024, True), (1000, True))  # full and causal, whole and ragged blocks
    calls = [C(d, bf16, sq, causal=c) for d in (32, 64, 128, 256) for sq, c in shapes]
    calls += [C(d, fp32, sq) for d in (32, 64, 128, 256) for sq in (1024, 1000)]
    calls += [C(128, "float16", sq) for sq in (1024, 1000)] + [C(128, bf16, 1024, b=4, causal=False)]
    # long: Gluon rows by min_seq, persistent / tiled (a causal grid past PERSISTENT_BANDED_BLOCKS), dS by heads
    calls += [C(128, bf16, 4096), C(128, bf16, 16384), C(128, bf16, 16384, causal=False), C(64, bf16, 4096),
              C(64, bf16, 8192, causal=False), C(64, bf16, 16384), C(128, bf16, 8200, causal=False)]
    # windows: narrow ("+window" rows, banded dS workspace; (1024, 0) and (256, 256)), and wide (the plain rows)
    calls += [C(d, bf16, sq, causal=False, window=w) for w in ((1024, 0), (256, 256)) for d in (64, 128, 256)
              for sq in (4096, 4000)]
    calls += [C(d, fp32, 4096, causal=False, window=(1024, 0)) for d in (128, 256)]
    calls += [C(d, bf16, 16384, causal=False, window=(4096, 0)) for d in (64, 128)]
    calls += [C(128, bf16, 16384, causal=False, window=(1024, 0)), C(64, bf16, 8192, causal=False, window=(1024, 0))]
    # dropout, GQA (4 query heads per key/value head), segment ids, softcap, ALiBi
    calls += [C(d, dtype, 1024, dropout=0.1) for dtype in (bf16, fp32) for d in (64, 128, 256)]
    calls += [C(d, bf16, 1024, h_kv=4) for d in (64, 128, 256)] + [C(d, fp32, 1024, h_kv=4) for d in (128, 256)]
    calls += [C(64, bf16, 4096, dropout=0.1), C(128, bf16, 1000, dropout=0.1), C(128, bf16, 1000, h_kv=4),
              C(128, bf16, 4096, causal=False, window=(1024, 0), dropout=0.1), C(64, bf16, 4096, h_kv=4)]
    calls += [C(d, bf16, 1024, segments=True) for d in (64, 128)]
    calls += [C(128, bf16, 1024, segments=True, dropout=0.1), C(128, bf16, 1024, segments=True, h_kv=4),
              C(128, bf16, 4096, causal=False, window=(1024, 0), segments=True)]
    calls += [C(d, bf16, sq, softcap=20.0) for d in (64, 128) for sq in (1024, 1000)]
    calls += [C(d, bf16, 1024, alibi=True) for d in (64, 128)] + [C(128, bf16, 1024, alibi=True, dropout=0.1)]
    # ring positions: the Triton TMA rows where Gluon would serve; EDGES apart on both backward paths
    calls += [C(d, bf16, 1024, b=4, causal=c, positions=True) for d in (64, 128) for c in (False, True)]
    calls += [C(128, bf16, 1024, positions=True), C(128, bf16, 16384, positions=True),
              C(128, bf16, 8200, causal=False, positions=True), C(128, bf16, 1024, dropout=0.1, positions=True),
              C(128, bf16, 1024, h_kv=4, positions=True), C(128, bf16, 16384, h_kv=1, positions=True),
              C(128, bf16, 4096, causal=False, window=(1024, 0), positions=True),
              C(128, bf16, 4096, causal=False, window=(1024, 0), softcap=20.0, positions=True),
              C(128, bf16, 1024, dropout=0.1, softcap=20.0, positions=True),
              C(128, bf16, 1024, softcap=20.0, positions=True)]
    # float8 (inference: the forward only): Gluon persistent / tiled (PINGPONG without a band), the Triton rows;
    # D 512 is beyond the API's 256 but its "fwd+fp8" row ships
    F = functools.partial(C, dtype=fp8, backward=False)
    calls += [F(128, sq=1024, causal=False), F(128, sq=8192), F(128, sq=8200, causal=False), F(128, sq=1000),
              F(128, sq=1000, alibi=True, softcap=20.0)] + [F(d, sq=1024) for d in (64, 256, 512)]
    return calls


def amd_calls(arch: str) -> list[Call]:
    """amd_report's calls (its _kinds at 1 x 1024 x 16 heads), the float8 forward where the arch has a float8 type
    (also at D 512, beyond the API's 256: "fwd+fp8"'s widest row), and float32 at D 256 (the 512-wide rows)."""
    calls = [Call(arch, d, dtype, 1024, causal=c, dropout=p) for d in (64, 128, 256)
             for dtype in ("float16", "bfloat16") for c, p in ((False, 0.0), (True, 0.0), (True, 0.1))]
    fp8 = {"gfx942": "float8_e4m3fnuz", "gfx950": "float8_e4m3fn"}.get(arch)
    if fp8:
        calls += [Call(arch, d, fp8, 1024, causal=c, backward=False) for d in (64, 128, 256) for c in (False, True)]
        calls += [Call(arch, 512, fp8, 1024, backward=False)]
    return calls + [Call(arch, 256, "float32", 1024), Call(arch, 256, "float32", 1024, dropout=0.1)]


# (head dim, dtype) of kvcache.record_launches: each decode row's width and itemsize (AMD's rows: by width only)
KV_CACHE = {"sm90": [(d, dtype) for d in (64, 128, 256) for dtype in ("bfloat16", "float32")],
            "amd": [(64, "bfloat16"), (128, "bfloat16"), (256, "bfloat16"), (256, "float32")]}


# ----- recording -----
def record_calls(targets) -> tuple[dict, dict]:
    """({call id: [launch entries]}, {key: compile job})."""
    api = internals()
    calls, jobs = {}, {}
    for target in targets:
        recorded = []  # (call id, launch)
        for call in sm90_calls() if target == "sm90" else amd_calls(target):
            recorded += [(call.id(), launch) for launch in api.attention(target, call)]
        # the KV cache: a call per launch kvcache names (decode, combine, append, paged, chunked prefill, fp8)
        for d, dtype in KV_CACHE["sm90" if target == "sm90" else "amd"]:
            recorded += [(f"{target} kvcache D{d} {dtype} {name}", launch)
                         for name, launch in api.kvcache(target, d, dtype)]
        for call_id, launch in recorded:
            job = compile_job(api, target, launch)
            jobs.setdefault(job["key"], job)
            calls.setdefault(call_id, []).append(dict(kernel=launch.kernel.__name__, grid=list(launch.grid),
                                                      compiled=job["key"]))
    return calls, jobs


def compile_job(api, target: str, launch) -> dict:
    """What a worker needs to compile a launch (picklable: the kernel by module and name, arrays as shapes),
    keyed on what the compiled code depends on: Triton's source hash (kernel, constexprs, argument types and
    specialisation), the compile options and the target."""
    import jax

    def plain(x):  # arrays (tracers here) as what _source reads of them; scalars (int, np.float32) as they are
        return ("array", tuple(x.shape), str(x.dtype)) if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) else x

    fn = launch.kernel.fn
    job = dict(target=target, module=fn.__module__, name=fn.__name__, args=[plain(a) for a in launch.args],
               out_shapes=[plain(s) for s in launch.out_shapes], constexprs=dict(launch.constexprs),
               options=api.options(launch.compile_options))
    src = api.source(as_launch(job, jax, launch.kernel), "cuda" if target == "sm90" else "hip")
    text = f"{target}|{fn.__module__}.{fn.__name__}|{src.hash()}|{sorted(job['options'].items())}"
    job["key"] = _sha(text)
    job["signature"] = {name: kind for name, kind in src.signature.items() if kind != "constexpr"}  # for diagnosis
    return job


def as_launch(job: dict, jax=None, kernel=None):
    """A stand-in for _launch.Launch with what amd_report's source / stats read."""
    def array(x):
        return jax.ShapeDtypeStruct(x[1], x[2]) if isinstance(x, tuple) and x[:1] == ("array",) else x

    kernel = kernel or getattr(importlib.import_module(job["module"]), job["name"])
    return types.SimpleNamespace(kernel=kernel, args=tuple(map(array, job["args"])),
                                 out_shapes=tuple(map(array, job["out_shapes"])), constexprs=job["constexprs"],
                                 compile_options=job["options"])


# ----- compiling and measuring (worker processes) -----
def _worker_init(parent: int, cache: str) -> None:
    os.environ.update(TRITON_CACHE_DIR=cache, TRITON_ALWAYS_COMPILE="1")  # every compile runs ptxas (its log)
    internals().die_with_parent(parent)


def _histogram(ops) -> dict:
    return dict(sorted(collections.Counter(ops).items()))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ptx_opcodes(ptx: str) -> list[str]:
    """Each PTX instruction's opcode with its modifiers (e.g. wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", ptx, flags=re.S)
    ops = []
    for statement in text.split(";"):
        tokens = [t for t in statement.split() if t not in "{}" and not t.endswith(":")]
        tokens = [t.strip("{}") for t in tokens]
        if tokens and tokens[0].startswith("@"):  # a predicate
            tokens = tokens[1:]
        if tokens and re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z0-9_:]+)*", tokens[0]):
            ops.append(tokens[0])
    return ops


def sass_instructions(cubin: bytes) -> list[str]:
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-sass", f.name], capture_output=True,
                             text=True, check=True).stdout
    return [m.group(1).strip() for m in re.finditer(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", out, re.M)]


def gcn_instructions(gcn: str, name: str) -> list[str]:
    body = gcn[gcn.index(f"\n{name}:"):gcn.index("\n.Lfunc_end0:")]
    lines = (line.split(";")[0].strip() for line in body.splitlines()[1:] if line[:1] in ("\t", " "))
    return [line for line in lines if line and not line.startswith(".")]


def _opcode(instruction: str) -> str:
    tokens = instruction.split()
    return tokens[1] if tokens[0].startswith("@") and len(tokens) > 1 else tokens[0]


def measure(job: dict) -> dict:
    """The compiled code's metrics of one job (run in a worker)."""
    import jax
    import triton

    api = internals()
    launch = as_launch(job, jax)
    try:
        triton.knobs.nvidia.dump_ptxas_log = True  # Triton's own ptxas run prints its -v report
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            compiled = api.compile(launch, job["target"], job["options"])
    except Exception as e:  # a compile error is a fingerprint too
        return {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"}
    m = {"num_warps": compiled.metadata.num_warps, "shared": compiled.metadata.shared,
         "scratch": compiled.metadata.global_scratch_size}
    if job["target"] == "sm90":
        sass = sass_instructions(compiled.asm["cubin"])
        log = log.getvalue()

        def number(pattern):
            found = re.search(pattern, log)
            return int(found.group(1)) if found else -1

        m.update(registers=number(r"Used (\d+) registers"), spill_stores=number(r"(\d+) bytes spill stores"),
                 spill_loads=number(r"(\d+) bytes spill loads"), stack=number(r"(\d+) bytes stack frame"),
                 barriers=number(r"used (\d+) barriers"), ptx_ops=_histogram(ptx_opcodes(compiled.asm["ptx"])),
                 sass_ops=_histogram(map(_opcode, sass)))
    else:
        gcn = gcn_instructions(compiled.asm["amdgcn"], compiled.metadata.name)
        m.update(api.amd_stats(job["target"], job["name"], compiled, job["options"].get("num_warps", 4), launch))
        m.update(gcn_ops=_histogram(map(_opcode, gcn)))
    return m


def compile_all(jobs: dict, n: int) -> dict:
    metrics = {}
    with tempfile.TemporaryDirectory(prefix="compiled_code_triton_cache_") as cache:
        # spawned, not forked: a fork of a process that has started JAX's threads can deadlock
        pool = concurrent.futures.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"),
                                                      initializer=_worker_init, initargs=(os.getpid(), cache))
        with pool:
            futures = {pool.submit(measure, job): key for key, job in jobs.items()}
            start = last = time.monotonic()
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                metrics[futures[future]] = future.result()
                if time.monotonic() - last >= 10 or done == len(futures):  # a full record takes many minutes
                    last = time.monotonic()
                    print(f"compiled {done}/{len(futures)} kernels ({last - start:.0f} s)", file=sys.stderr, flush=True)
    return metrics


# ----- the commands -----
def record(args) -> int:
    start = time.monotonic()
    targets = [t for t in args.targets.split(",") if t]
    calls, jobs = record_calls(targets)
    api = internals()
    per_target = collections.Counter(job["target"] for job in jobs.values())
    print(f"code under test: {api.code}\n{len(calls)} calls, {len(jobs)} distinct launches to compile "
          f"({', '.join(f'{t}: {per_target[t]}' for t in targets)})", file=sys.stderr)
    if args.dry_run:
        return 0
    metrics = compile_all(jobs, args.jobs)
    import triton

    compiled = {key: dict(target=job["target"], kernel=job["name"], metrics=metrics[key],  # compared
                          signature=job["signature"], constexprs={k: repr(v) for k, v in job["constexprs"].items()},
                          options=job["options"])  # for diagnosis only
                for key, job in sorted(jobs.items())}
    meta = dict(code=api.code, targets=targets, triton=triton.__version__, seconds=round(time.monotonic() - start),
                calls=len(calls), kernels=len(jobs))
    with open(args.out, "w") as f:  # one line per call and per kernel: diffable, and not megabytes of indentation
        f.write('{"meta": ' + json.dumps(meta) + ',\n"calls": {\n')
        f.write(",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in calls.items()) + '},\n"compiled": {\n')
        f.write(",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in compiled.items()) + "}}\n")
    errors = sum("error" in m for m in metrics.values())
    print(f"wrote {args.out}: {len(calls)} calls, {len(jobs)} kernels ({errors} failed to compile), "
          f"{meta['seconds']} s", file=sys.stderr)
    return 0


def _delta(a, b) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        changes = {k: b.get(k, 0) - a.get(k, 0) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}
        return " ".join(f"{k} {v:+d}" for k, v in list(changes.items())[:8]) + (" ..." if len(changes) > 8 else "")
    return f"{a} -> {b}"


def compare(args) -> int:
    base, new = (json.load(open(p)) for p in (args.base, args.new))
    if base["meta"]["triton"] != new["meta"]["triton"]:
        print(f"warning: recorded with triton {base['meta']['triton']} and {new['meta']['triton']}")
    rows, pairs = [], collections.defaultdict(list)  # (base kernel, new kernel): the launches that compile them
    for call in list(base["calls"]) + [c for c in new["calls"] if c not in base["calls"]]:
        a, b = base["calls"].get(call), new["calls"].get(call)
        if a is None or b is None:
            rows.append((call, "-", "-", "only in " + (args.new if a is None else args.base)))
        elif [x["kernel"] for x in a] != [x["kernel"] for x in b]:
            rows.append((call, "-", "-", f"launches {[x['kernel'] for x in a]} -> {[x['kernel'] for x in b]}"))
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                if x["grid"] != y["grid"]:
                    rows.append((call, i, x["kernel"], f"grid {x['grid']} -> {y['grid']}"))
                pairs[x["compiled"], y["compiled"]].append((call, i, x["kernel"]))
    for (kx, ky), uses in pairs.items():  # a kernel's difference once, at the first launch that compiles it
        mx, my = base["compiled"][kx]["metrics"], new["compiled"][ky]["metrics"]
        changed = [f"{m}: {_delta(mx.get(m), my.get(m))}" for m in sorted(set(mx) | set(my)) if mx.get(m) != my.get(m)]
        if changed:
            call, i, kernel = uses[0]
            rows.append((call + (f" (+{len(uses) - 1} launches)" if len(uses) > 1 else ""), i, kernel,
                         "; ".join(changed)))
    if rows:
        print("| call | launch | kernel | difference |\n|---|---|---|---|")
        print("\n".join(f"| {c} | {i} | {k} | {d} |" for c, i, k, d in rows))
    print(f"{len(base['calls'])} calls, {len({kx for kx, _ in pairs})} distinct compiled kernels compared: "
          f"{len(rows)} difference(s){'' if rows else ', the compiled code is the same'}")
    return 1 if rows else 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compiled_code", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("command", choices=("record", "compare"),
                    help="record OUT.json: fingerprint the checkout on PYTHONPATH; compare BASE.json NEW.json: exit 1 "
                         "if NEW's compiled code differs from BASE's")
    ap.add_argument("paths", nargs="+", help="record: the output file; compare: the two records")
    ap.add_argument("--targets", default="sm90,gfx90a,gfx942,gfx950", help="record: the targets, comma-separated")
    ap.add_argument("--jobs", type=int, default=2, help="record: compile processes")
    ap.add_argument("--dry-run", action="store_true", help="record: record the launches; compile nothing")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("unset TRITON_INTERPRET: the kernels are compiled, not interpreted")
    if len(args.paths) != (1 if args.command == "record" else 2):
        ap.error("record takes OUT.json; compare takes BASE.json NEW.json")
    if args.command == "record":
        args.out = args.paths[0]
        return record(args)
    args.base, args.new = args.paths
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
