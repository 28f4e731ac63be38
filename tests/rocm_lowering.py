"""Drive jax-triton's real ROCm lowering of every kernel on a CPU (run by test_rocm_lowering.py in a
Python 3.12 env with jax-rocm7-plugin, jax-triton 0.4.x and triton >= 3.7).

    python tests/rocm_lowering.py gfx90a,gfx942,gfx950 [--no-workaround]   -> one JSON line per kernel

`jax.export(..., platforms=["rocm"])` of the library's own forward+backward (implementation="triton",
through _triton.run and the jax-triton compat layer) compiles each kernel with jax-triton's ROCm path
down to an hsaco. Only what needs an AMD GPU is stood in for: the device-arch query (pinned to the
arch under test) and the HIP runtime objects that would load the hsaco (libamdhip64 is absent).
"""
import json
import re
import sys

import jax
import jax.numpy as jnp
import triton.backends.amd.compiler as hip
from jax_triton import triton_lib

from jax_flash_amd import _dispatch, _triton, plan
from jax_flash_amd._dispatch import Options, flash_attention
from jax_flash_amd.operands import Operands
from jax_flash_amd.rules import Band

compiled = []  # one dict per kernel compile


class _RuntimeStandIn:
    """Accepts what the HIP runtime's kernel / parameter / call objects accept."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def to_proto(self, *args):
        return b"stand-in"


def _install_stand_ins(arch_details):
    lib = triton_lib.triton_kernel_call_lib
    lib.get_arch_details = lambda device: arch_details
    lib.TritonKernel = lib.TritonKernelCall = _RuntimeStandIn
    lib.create_array_parameter = lib.create_scalar_parameter = _RuntimeStandIn

    make_amdgcn = hip.HIPBackend.make_amdgcn
    last_amdgcn = []

    def recording_make_amdgcn(src, metadata, options):
        out = make_amdgcn(src, metadata, options)
        last_amdgcn.append((out, options))
        return out

    hip.HIPBackend.make_amdgcn = staticmethod(recording_make_amdgcn)
    compile_hsaco = triton_lib.compile_ttir_to_hsaco_inplace

    def recording_compile(ttir, backend, options):
        result = compile_hsaco(ttir, backend, options)
        amdgcn, opts = last_amdgcn.pop()
        with open(result.binary, "rb") as f:
            hsaco = f.read()
        occupancy = re.search(r"^; Occupancy: (\d+)", amdgcn, re.M)
        scratch = re.search(r"^; ScratchSize: (\d+)", amdgcn, re.M)
        compiled.append(dict(
            kernel=result.name, arch=opts.arch, hsaco_bytes=len(hsaco), is_elf=hsaco[:4] == b"\x7fELF",
            target_in_amdgcn=re.search(rf'amdgcn_target "[^"]*{opts.arch}"', amdgcn) is not None,
            num_warps=opts.num_warps, waves_per_eu=opts.waves_per_eu,
            matrix_instr_nonkdim=opts.matrix_instr_nonkdim,
            waves_attr=re.findall(r'"amdgpu-waves-per-eu"="([\d,]+)"', result.llir),
            mfma_shapes=sorted(set(re.findall(r"mfma\.f32\.(\d+x\d+)x", result.llir))),  # e.g. "16x16"
            occupancy=int(occupancy.group(1)) if occupancy else None,
            # the compat layer's pointer-range attribute (arrays < 2 GiB): buffer, not global, memory ops
            buffer_loads=len(re.findall(r"^\s*buffer_load_", amdgcn, re.M)),
            global_loads=len(re.findall(r"^\s*global_load_", amdgcn, re.M)),
            scratch=int(scratch.group(1)) if scratch else None,
        ))
        return result

    triton_lib.compile_ttir_to_hsaco_inplace = recording_compile


def export_forward_backward(arch: str, head_dim: int, dtype, causal: bool, kv_heads: int, variants: bool):
    _triton.target = lambda: arch  # the arch a ROCm device would report
    extra = dict(softcap=30.0, dropout_p=0.1) if variants else {}
    band = Band.of(causal, (32, 8) if variants else (-1, -1), 300, 300)
    opts = Options(implementation="triton", softmax_scale=head_dim ** -0.5, band=band, **extra)

    def fwd_bwd(q, k, v, dout, dlse, slopes, seeds, segment_ids):
        extras = Operands(slopes=slopes, seeds=seeds, q_segment_ids=segment_ids, kv_segment_ids=segment_ids
                          ) if variants else Operands()
        (out, lse), vjp = jax.vjp(lambda q, k, v: flash_attention(q, k, v, extras, opts), q, k, v)
        return out, lse, vjp((dout, dlse))

    x = jax.ShapeDtypeStruct((2, 300, 4, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((2, 300, kv_heads, head_dim), dtype)
    lse = jax.ShapeDtypeStruct((2, 4, 300), jnp.float32)
    # jax-triton's custom call has no export stability guarantee; that is irrelevant to lowering it
    unchecked = [jax.export.DisabledSafetyCheck.custom_call(triton_lib.CUSTOM_CALL_TARGET_NAME)]
    slopes = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    seeds = jax.ShapeDtypeStruct((2, 4, 2), jnp.uint32)
    segment_ids = jax.ShapeDtypeStruct((2, 300), jnp.int32)
    exported = jax.export.export(jax.jit(fwd_bwd), platforms=["rocm"], disabled_checks=unchecked)(
        x, kv, kv, x, lse, slopes, seeds, segment_ids)
    return exported.mlir_module().count("triton_kernel_call")


def export_kvcache(arch: str, head_dim: int, dtype):
    """attention_with_kvcache's kernels (kv_append, attn_decode, attn_decode_combine) on a paged cache:
    decode of 32 query / 8 key-value heads, split 4 ways. Returns (custom calls, {kernel: the compile
    options its launch asks for})."""
    from jax_flash_amd import kvcache

    _triton.target = lambda: arch
    opts = kvcache.Options("triton", head_dim ** -0.5, Band.of(True, (-1, -1), 1, 1024), num_splits=4)
    sds = jax.ShapeDtypeStruct
    args = (sds((2, 1, 32, head_dim), dtype), sds((32, 64, 8, head_dim), dtype), sds((32, 64, 8, head_dim), dtype),
            sds((2,), jnp.int32), sds((2, 1, 8, head_dim), dtype), sds((2, 1, 8, head_dim), dtype),
            sds((2, 16), jnp.int32))
    unchecked = [jax.export.DisabledSafetyCheck.custom_call(triton_lib.CUSTOM_CALL_TARGET_NAME)]
    exported = jax.export.export(jax.jit(lambda *a: kvcache._forward_only(opts)(*a, Operands())), platforms=["rocm"],
                                 disabled_checks=unchecked)(*args)
    steps = plan.plan_decode(kvcache.decode_call(arch, opts, args[0], args[1], args[6], seq_new=1)).steps
    expected = {step.kernel: step.compile_options for step in steps}
    assert set(expected) == {"kv_append", "attn_decode", "attn_decode_combine"}, expected
    return exported.mlir_module().count("triton_kernel_call"), expected


def main():
    archs = sys.argv[1].split(",")
    if "--no-workaround" in sys.argv:  # shows whether jax-triton still needs the compat layer's shim
        from jax_flash_amd import _jax_triton_compat
        _jax_triton_compat.apply_workarounds = lambda: None
    _install_stand_ins("unset")
    for arch in archs:
        triton_lib.triton_kernel_call_lib.get_arch_details = lambda device, a=arch: f"{a}:sramecc+:xnack-"
        # a process sees one device arch; this one lowers several in turn, so nothing traced for the
        # previous arch (the kernel calls cached per options, jax's trace caches) may be reused
        _dispatch._kernel_calls.cache_clear()
        jax.clear_caches()
        # D 128 bf16 causal; D 64 fp16 non-causal with every variant: grouped-query heads (4 query,
        # 2 key/value), a sliding window, softcap, ALiBi, dropout and segment ids
        for head_dim, dtype, causal, kv_heads in ((128, jnp.bfloat16, True, 4), (64, jnp.float16, False, 2)):
            start = len(compiled)
            calls = export_forward_backward(arch, head_dim, dtype, causal, kv_heads, variants=kv_heads < 4)
            for row in compiled[start:]:
                kernel = row["kernel"]
                name = {"attn_fwd": "fwd", "attn_bwd_dkdv": "dkdv",
                        "attn_bwd_dq": "dq"}[kernel]
                # the options of the target's plain row for the head: the row these calls take (the D 64 call's narrow
                # window has no rows of its own on AMD)
                options = plan.pick(plan.Call(arch, 1, 1, 1, 1, 1, head_dim, jnp.dtype(dtype).name), name).options()
                row.update(head_dim=head_dim, dtype=jnp.dtype(dtype).name, causal=causal, kv_heads=kv_heads,
                           custom_calls=calls, expected=options)
                print(json.dumps(row), flush=True)
        start = len(compiled)  # the KV-cache kernels: D 128 bf16, paged decode
        calls, expected = export_kvcache(arch, 128, jnp.bfloat16)
        for row in compiled[start:]:
            row.update(head_dim=128, dtype="bfloat16", causal=True, kv_heads=8, custom_calls=calls,
                       expected=expected[row["kernel"]])
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
