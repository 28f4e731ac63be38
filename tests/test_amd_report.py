"""The AMD resource check: every kernel cross-compiles for gfx90a/gfx942/gfx950 at its default config
without spills, within LDS, without duplicated MFMA or exp work, with buffer loads in its loop, and the
MI300 forward keeps 2 waves per SIMD (no AMD GPU needed).

The default run checks one arch, head dim and dtype through the report's whole path (subprocess,
compile workers, table, --check); the full sweep (402 kernels) is marked amd_sweep."""
import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest

from jax_flash_amd import _jax_triton_compat, amd_report

# Seconds one compile may take on one worker: ~5 s measured on an idle 2-core machine, ~10-17 s with
# the cores shared; the margin keeps a slow CI machine from failing a run that is only slow.
SECONDS_PER_KERNEL = 40
# AMD runs need jax-triton 0.4.x, hence triton >= 3.7 (_jax_triton_compat.check_supported): the check's thresholds
# are those of the AMD compilers users get. Triton 3.6 (the H200 image) lowers some loads differently (4 of gfx942's
# 17 kernels with global loads in their loop, dK/dV with dropout among them), a compiler no AMD call runs.
AMD_TRITON = pytest.mark.skipif(_jax_triton_compat.versions()["triton"] < (3, 7),
                                reason="the AMD check is for triton >= 3.7 (what jax-triton 0.4.x needs)")


def _check(arch, head_dims, dtypes, linear=False):
    """Runs `amd_report --check` in a process group of its own, with a timeout sized from the number of
    kernels; on timeout the whole group (the report and its compile workers) is killed. linear: --linear."""
    jobs = os.cpu_count() or 1
    kernels = len(amd_report.work_items(arch.split(","), [int(d) for d in head_dims.split(",")], dtypes.split(","),
                                        linear))
    timeout = 60 + SECONDS_PER_KERNEL * math.ceil(kernels / jobs)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # it compiles, not interprets
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "jax_flash_amd.amd_report", "--check", "--arch", arch,
                             "--head-dims", head_dims, "--dtypes", dtypes, "--jobs", str(jobs)]
                            + (["--linear"] if linear else []),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            process_group=0)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"amd_report --check ran past {timeout} s ({kernels} kernels, {jobs} jobs):\n{err[-3000:]}")
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C): leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert f"check: {kernels}/{kernels} kernels pass" in err, err[-3000:]
    assert f"amd_report: {kernels}/{kernels} kernels compiled" in err, err[-3000:]  # the progress lines
    return out


def test_check_flags_what_it_should():
    loop = dict(mfma="f32_32x32x8_bf16", mfma_tile=128, mfma_ideal=128, mfma_ratio=1.0, exp_tile=68, exp_ideal=68,
                buffer_loads=4)
    ok = amd_report.Row("gfx942", "fwd", 128, "bfloat16", False, "", vgprs=200, local_mem=32768, occupancy=2, **loop)
    assert ok.problems() == []
    assert amd_report.Row("gfx90a", "dq", 64, "float16", True, "", spill_bytes=8, **loop).problems()
    assert amd_report.Row("gfx942", "dkdv", 64, "float16", True, "", local_mem=70000, occupancy=1, **loop).problems()
    assert amd_report.Row("gfx942", "fwd", 64, "float16", True, "", occupancy=1, **loop).problems()
    assert not amd_report.Row("gfx942", "fwd", 256, "float16", True, "", occupancy=1, **loop).problems()
    assert amd_report.Row("gfx950", "fwd", 64, "float16", True, "", error="boom").problems()
    # duplicated work (the D 128 forward's 8 warps on 4 row tiles of 32x32 MFMAs), global loads, no loop found
    dup = dict(loop, mfma_tile=384, mfma_ideal=256, mfma_ratio=1.5)
    assert "duplicated MFMA" in amd_report.Row("gfx942", "fwd", 128, "bfloat16", False, "", occupancy=2,
                                               **dup).problems()[0]
    assert "duplicated exp" in amd_report.Row("gfx950", "fwd", 128, "bfloat16", False, "",
                                              **dict(loop, exp_tile=136)).problems()[0]
    assert not amd_report.Row("gfx950", "fwd", 128, "bfloat16", False, "", **dict(loop, exp_tile=71)).problems()
    assert "global loads" in amd_report.Row("gfx90a", "dq", 64, "float16", True, "",
                                            **dict(loop, global_loads=2)).problems()[0]
    assert amd_report.Row("gfx942", "dkdv", 64, "float16", True, "").problems() == ["no MFMA loop found"]
    assert not amd_report.Row("sm90", "fwd", 128, "bfloat16", False, "").problems()  # no loop stats on sm90


# An AMDGCN listing as LLVM prints it: a loop over unmasked blocks, a longer one over masked blocks (two basic
# blocks, the second "in Loop"), and one without MFMAs
_LISTING = """attn_fwd:                               ; @attn_fwd
; %bb.0:
\ts_load_dwordx2 s[0:1], s[4:5], 0x0
.LBB0_1:                                ; =>This Inner Loop Header: Depth=1
\t.loc\t1 48 41                         ; fwd.py:48:41
\tbuffer_load_dwordx4 v[0:3], v4, s[8:11], 0 offen
\tds_write_b128 v5, v[0:3]
\tds_read2st64_b64 v[6:9], v5 offset1:1
\tds_bpermute_b32 v1, v2, v3
\tv_mfma_f32_32x32x8_bf16 v[10:25], v[6:7], v[8:9], v[10:25]
\tv_mfma_f32_32x32x8_bf16 v[10:25], v[6:7], v[8:9], v[10:25]
\tv_exp_f32_e32 v1, v2                    ; a comment
\ts_cbranch_scc1 .LBB0_1
; %bb.2:
\ts_nop 0
.LBB0_3:                                ; =>This Inner Loop Header: Depth=1
\tglobal_load_dwordx2 v[0:1], v[2:3], off
\tv_mfma_f32_32x32x8_bf16 v[10:25], v[6:7], v[8:9], v[10:25]
\ts_cbranch_execz .LBB0_5
; %bb.4:                                ;   in Loop: Header=BB0_3 Depth=1
\tv_cndmask_b32_e32 v1, v2, v3, vcc
\tv_mfma_f32_32x32x8_bf16 v[10:25], v[6:7], v[8:9], v[10:25]
\tv_exp_f32_e32 v1, v2
\tv_exp_f32_e32 v1, v2
.LBB0_5:                                ;   in Loop: Header=BB0_3 Depth=1
\ts_cbranch_scc1 .LBB0_3
.LBB0_6:                                ; =>This Inner Loop Header: Depth=1
\tv_add_u32_e32 v1, v2, v3
\ts_cbranch_scc1 .LBB0_6
; %bb.7:
\ts_endpgm
"""


def test_loop_stats_reads_the_unmasked_loop():
    assert [len(body) for body in amd_report.loops(_LISTING)] == [8, 8, 2]
    stats = amd_report.loop_stats(_LISTING)
    assert stats["instrs"] == 8 and stats["exp"] == 1 and len(stats["mfma"]) == 2
    assert stats["mfma_flops"] == 2 * 2 * 32 * 32 * 8
    assert (stats["buffer_loads"], stats["global_loads"], stats["load_bytes"]) == (1, 0, 16)
    assert stats["lds_bytes"] == 16 + 16  # ds_bpermute moves no LDS bytes
    assert amd_report.loop_stats("k:\n\ts_endpgm\n") == {}
    # flops per MFMA instruction, by name: gfx90a (block count implied), gfx942, gfx950, fp8
    for name, flops in (("v_mfma_f32_32x32x8bf16_1k", 16384), ("v_mfma_f32_32x32x4bf16_1k", 16384),
                        ("v_mfma_f32_16x16x16f16", 8192), ("v_mfma_f32_32x32x4_2b_bf16", 16384),
                        ("v_mfma_f32_16x16x32_bf16", 16384), ("v_mfma_f32_32x32x16_fp8_fp8", 32768),
                        ("v_mfma_f32_32x32x64_f8f6f4", 131072), ("v_mfma_scale_f32_16x16x128_f8f6f4", 65536)):
        assert amd_report._mfma_flops(name) == flops, name


_BOUNDARY = """
import dataclasses, inspect, json, sys
import jax, jax.numpy as jnp
from jax_flash_amd import _jax_triton_compat, amd_report
launch = dict(amd_report.record_launches("gfx942", 64, "bfloat16", False))["fwd"]
options = _jax_triton_compat.compiler_options(launch.compile_options)
names = list(inspect.signature(launch.kernel.fn).parameters)
kv = jax.ShapeDtypeStruct((1, int(sys.argv[1]), 16, 64), jnp.bfloat16)
args = tuple(kv if name in ("K", "V") else arg for name, arg in zip(names, launch.args))
gcn = amd_report.compile_launch(dataclasses.replace(launch, args=args), "gfx942", options).asm["amdgcn"]
print(json.dumps({k: v for k, v in amd_report.loop_stats(gcn).items() if k.endswith("_loads")}))
"""


def test_buffer_loads_where_offsets_fit_32_bits():
    """The forward's loop loads K and V with buffer loads when they span at most 2 GiB - 1 bytes (Triton's
    pointer-range attribute, given by _jax_triton_compat.pointer_specialization as in the launch path), with
    global loads (64-bit addresses, the code that stays correct at any size) from 2 GiB on. Compiled for
    gfx942 in a subprocess (the tests' process runs Triton's interpreter): two compiles, ~4 s."""
    from jax_flash_amd import _jax_triton_compat

    row_bytes = 16 * 64 * 2  # K and V (1, seq, 16 heads, 64) bf16
    limit = _jax_triton_compat.BUFFER_RANGE_BYTES
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    for seq, kind, other in ((limit // row_bytes, "buffer", "global"), (limit // row_bytes + 1, "global", "buffer")):
        assert (seq * row_bytes <= limit) == (kind == "buffer")
        proc = subprocess.run([sys.executable, "-c", _BOUNDARY, str(seq)], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        loads = json.loads(proc.stdout.strip().splitlines()[-1])
        assert loads[f"{kind}_loads"] >= 2 and loads[f"{other}_loads"] == 0, (seq, loads)


@AMD_TRITON
def test_one_arch_passes_the_check():
    """MI300 at D 128 bf16: forward, dQ, dK/dV (full, causal, dropout), the fp8 forward and the KV-cache
    kernels (decode, paged, chunked prefill, float8 cache, combine, append), and the linear backward's."""
    table = _check("gfx942", "128", "bfloat16", linear=True)
    assert "| gfx942 | dkdvdq+linear | 128 | bfloat16 | yes |" in table
    for kernel in ("decode", "decode+paged", "decode+chunk", "decode+fp8", "decode_combine", "kv_append"):
        assert f"| gfx942 | {kernel} | 128 | bfloat16 | yes |" in table
    for kernel in ("fwd", "dkdv", "dq"):
        for causal in ("no", "yes"):
            assert f"| gfx942 | {kernel} | 128 | bfloat16 | {causal} |" in table
        assert f"| gfx942 | {kernel}+dropout | 128 | bfloat16 | yes |" in table
    for causal in ("no", "yes"):
        assert f"| gfx942 | fwd | 128 | float8_e4m3fnuz | {causal} |" in table
    # the loop columns: MFMA and v_exp per tile at the ideal (--check allows 5 % more), buffer loads (the
    # KV-cache combine and append kernels have no matrix products: no loop columns)
    for line in (line for line in table.splitlines() if line.startswith("| gfx942 |")):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells[1] in ("decode_combine", "kv_append"):
            continue
        mfma, ideal = re.fullmatch(r"(\d+) \((\d+)\)", cells[13]).groups()
        assert mfma == ideal and "buffer" in cells[15] and "global" not in cells[15], line


@pytest.mark.amd_sweep
def test_sm90_kernels_fit_shared_memory():
    """sm90 at D 128 bf16, the dense bias and mask kernels and the linear backward's included (a tile of either per
    pipeline stage: the pointer forward takes configs' "fwd+dense" rows, three stages asked for 262,144 bytes; the
    backward the Gluon dK/dV and the dS path's dQ), within the 227 KB of shared memory a block may have. (Not
    --check: its spill rule is AMD's; the Gluon rows' spills ran well on the GPU.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "jax_flash_amd.amd_report", "--arch", "sm90", "--head-dims", "128",
                           "--dtypes", "bfloat16", "--linear", "--jobs", str(os.cpu_count() or 1)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| sm90 |")]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
    kernels = {cells[1] for cells in rows}
    assert {"fwd+bias", "fwd+mask", "dqds+bias", "dkdv+bias", "dbias+bias", "dkdvdq+linear"} <= kernels, kernels
    for cells in rows:
        assert int(cells[10]) <= amd_report.LOCAL_MEMORY["sm90"] and "memory" not in cells[-1], cells


@pytest.mark.amd_sweep
@AMD_TRITON
def test_default_configs_pass_on_every_amd_arch():
    table = _check(",".join(amd_report.AMD_ARCHS), "64,128,256", "float16,bfloat16")
    for arch in amd_report.AMD_ARCHS:
        for kernel in ("fwd", "dkdv", "dq", "fwd+dropout", "dkdv+dropout", "dq+dropout", "fwd+bias", "dkdv+bias",
                       "dq+bias", "dbias+bias", "fwd+mask", "dkdv+mask", "dq+mask"):
            for d in (64, 128, 256):
                assert f"| {arch} | {kernel} | {d} | bfloat16 |" in table and f"| {arch} | {kernel} | {d} | float16 |" in table
    for arch, fp8_type in (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn")):  # the fp8 forward
        for d in (64, 128, 256):
            assert f"| {arch} | fwd | {d} | {fp8_type} | no |" in table and f"| {arch} | fwd | {d} | {fp8_type} | yes |" in table
    # 3 archs x 3 head dims x 2 dtypes x 21 kernels (9 attention, 7 dense bias/mask, 5 KV-cache), and 2 fp8
    # forwards per head dim on gfx942 and gfx950, and the fp8-cache decode per head dim and dtype there
    assert table.count("\n| gfx") == 402


_DENSE_TILES_PROBE = """
import json, sys
import jax.numpy as jnp
from jax_flash_amd import _jax_triton_compat, _launch, amd_report, plan
from jax_flash_amd.kernels import configs
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band
sys.path.insert(0, "tests")
from test_gluon_fwd import _rows

x = jnp.zeros((1, 1024, 16, 128), jnp.bfloat16)
cases = {"bias": dict(bias=jnp.zeros((1, 16, 1024, 1024), jnp.bfloat16)),
         "mask": dict(mask=jnp.ones((1, 1, 1024, 1024), bool)),
         "bias32+mask": dict(bias=jnp.zeros((1, 16, 1024, 1024), jnp.float32), mask=jnp.ones((1, 1, 1024, 1024), bool))}
out = {}
with plan.using(plan.Policy(gluon_fwd=_rows(configs.SM90_GLUON_FWD, min_seq=0))):
    for name, dense in cases.items():
        recorded = []
        def run(launch):
            recorded.append(launch)
            return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)
        statics = _launch.Statics(128 ** -0.5, Band.of(True, (-1, -1), 1024, 1024))
        o, lse = _launch.forward(run, "sm90", x, x, x, Operands(**dense), statics=statics)
        _launch.backward(run, "sm90", x, x, x, o, lse, o, lse, Operands(**dense), statics=statics)
        for launch in recorded:
            kernel = {"attn_fwd_sm90": "fwd", "attn_bwd_dkdv_sm90": "dkdv"}.get(launch.kernel.__name__)
            if kernel:
                compiled = amd_report.compile_launch(launch, "sm90",
                                                     _jax_triton_compat.compiler_options(launch.compile_options))
                row = amd_report.Row("sm90", kernel, 128, "bfloat16", True, "")
                amd_report._cuda_stats(row, compiled)
                ptx = compiled.asm["ptx"]
                out[kernel + "+" + name] = dict(tiles=launch.constexprs.get("DENSE_TILES"), shared=row.local_mem,
                                                copies=ptx.count("cp.async.cg.shared.global"),
                                                elements=ptx.count("ld.global.b16") + ptx.count("ld.global.b8"))
print(json.dumps(out))
"""


def test_sm90_dense_tiles_compile_to_buffered_copies():
    """Under the default Policy(gluon_dense_tiles=True) the Gluon forward and dK/dV of a (1, H, T, S) bf16 bias and a
    (1, 1, T, S) mask (whole blocks) cross-compile for sm90 with their tiles copied into shared buffers in 16-byte
    pieces (cp.async), none read element by element (ld.global.b16 / .b8), within shared memory; with a float32 bias
    only the mask is buffered (the bias's buffers and the mask's passed the 227 KB), and the kernels fit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _DENSE_TILES_PROBE], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.splitlines()[-1])
    assert set(rows) == {f"{k}+{c}" for k in ("fwd", "dkdv") for c in ("bias", "mask", "bias32+mask")}, rows
    for name, r in rows.items():
        assert r["tiles"] and r["copies"] > 0 and r["shared"] <= amd_report.LOCAL_MEMORY["sm90"], (name, r)
        assert r["elements"] == 0, (name, r)  # (a float32 bias's element reads are 4-byte loads)
