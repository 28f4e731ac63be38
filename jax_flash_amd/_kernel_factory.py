"""Compiling a kernel for jaxlib's Triton custom call, in place of jax-triton 0.3's
`get_or_create_triton_kernel` (installed by _jax_triton_compat for jax-triton < 0.4).

jax-triton 0.3 compiles with num_warps / num_stages only and hands jaxlib the *requested* warp count and no
global scratch. What this version adds, each needed by a kernel path of ours:
- every compile option of a config row (waves_per_eu, matrix_instr_nonkdim, ... on AMD);
- the compiled warp count: warp specialisation (Hopper) turns 4 requested warps into 12, and a launch with
  the requested count runs a third of the kernel's warps;
- the global scratch that device-side TMA descriptors live in (jaxlib >= 0.11 allocates it per launch;
  older jaxlib: a clear error, never a launch with a null scratch pointer);
- the AMD pointer-range attribute for arrays whose byte offsets fit 32 bits, so loads become buffer loads.
What jax-triton cannot carry in its own parameters arrives as one extra metaparam, `EXTRA`, set by
_jax_triton_compat.triton_call: (sorted compile options, byte sizes of the array arguments in order).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

EXTRA = "jax_flash_amd_extra"
_CACHE: dict = {}


@dataclasses.dataclass(frozen=True)
class Compiled:
    name: str
    binary: str  # PTX text (CUDA) or the path of an hsaco file (ROCm), as jaxlib takes them
    shared: int
    num_warps: int  # compiled: differs from the requested count under warp specialisation
    scratch_size: int
    scratch_align: int
    ttir: str


def specialization(backend, arg_dtypes, scalar_indices, nbytes, platform: str) -> dict:
    """Triton's per-argument attributes: arrays 16-byte aligned ("D", as jax-triton assumes for XLA
    buffers), plus the pointer range ("S") on AMD where _jax_triton_compat.pointer_specialization says."""
    from jax_flash_amd._jax_triton_compat import pointer_specialization

    sizes = iter(nbytes) if nbytes is not None else None
    attrs = {}
    for i, dtype in enumerate(arg_dtypes):
        if i in scalar_indices:
            attrs[(i,)] = []
            continue
        letters = pointer_specialization(next(sizes), platform) if sizes is not None else "D"
        attrs[(i,)] = backend.parse_attr(letters)
    return attrs


def is_gluon(fn) -> bool:
    """A @gluon.jit kernel (kernels/fwd_sm90.py), whose source Triton compiles as Gluon."""
    return bool(getattr(fn, "is_gluon", lambda: False)())


def source(fn, signature: dict, constants: dict, attrs: dict):
    """Triton's compiler input for fn: an ASTSource, or Gluon's for a Gluon kernel."""
    from triton.compiler import compiler

    if is_gluon(fn):
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(fn, signature, constexprs=constants, attrs=attrs)
    return compiler.ASTSource(fn, constexprs=constants, signature=signature, attrs=attrs)


def compile_kernel(fn, backend, platform: str, signature: dict, constants: dict, attrs: dict, options: dict,
                   capability) -> Compiled:
    """Triton's stages run one by one (as jax-triton does), keeping the metadata they fill in."""
    import triton._C.libtriton as libtriton

    opts = backend.parse_options(options)
    context = libtriton.ir.context()
    libtriton.ir.load_dialects(context)
    backend.load_dialects(context)
    module = source(fn, signature, constants, attrs).make_ir(
        backend.target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context)
    ttir = str(module)
    # triton >= 3.7's AMD make_llir reads num_ctas from the metadata; both backends overwrite num_warps
    metadata: dict[str, Any] = {"num_ctas": opts.num_ctas, "num_warps": opts.num_warps}
    if platform == "cuda":
        # a Gluon kernel's IR is already TritonGPU: it skips Triton's layout passes
        stages = (("gluon_to_ttgir",) if is_gluon(fn) else ("make_ttir", "make_ttgir")) + ("make_llir", "make_ptx")
        src = module
        for stage in stages:
            src = getattr(backend, stage)(src, metadata, opts, capability)
        binary = src
    else:
        src = module
        for stage in ("make_ttir", "make_ttgir", "make_llir", "make_amdgcn", "make_hsaco"):
            src = getattr(backend, stage)(src, metadata, opts)
        fd, binary = tempfile.mkstemp(suffix=".hsaco")  # jaxlib takes ROCm binaries by path
        with os.fdopen(fd, "wb") as f:
            f.write(src)
    return Compiled(name=metadata["name"], binary=binary, shared=metadata["shared"],
                    num_warps=metadata.get("num_warps") or opts.num_warps,
                    scratch_size=metadata.get("global_scratch_size") or 0,
                    scratch_align=metadata.get("global_scratch_align") or 1, ttir=ttir)


def takes_scratch(kernel_class) -> bool:
    """Whether jaxlib's TritonKernel takes global_scratch_size (jaxlib >= 0.11): read from its signature
    (nanobind puts it in the docstring), not from version numbers."""
    init = getattr(kernel_class, "__init__", None)
    text = " ".join(str(getattr(obj, attr, "") or "") for obj in (kernel_class, init)
                    for attr in ("__doc__", "__nb_signature__", "__text_signature__"))
    return "global_scratch_size" in text


def jaxlib_kernel(kernel_class, compiled: Compiled, num_ctas: int, capability):
    """jaxlib's TritonKernel, told the compiled warp count and (where the kernel needs it) the scratch."""
    args = [compiled.name, compiled.num_warps, num_ctas, compiled.shared, compiled.binary, compiled.ttir,
            capability]
    if compiled.scratch_size:
        if not takes_scratch(kernel_class):
            from jax_flash_amd._jax_triton_compat import versions

            raise RuntimeError(
                f"kernel {compiled.name} needs {compiled.scratch_size} bytes of global scratch (device-side "
                f"TMA descriptors), which this jaxlib (jax {versions()['jax']}) cannot allocate; jaxlib >= "
                "0.11 can. Upgrade jax/jaxlib, or use a config row without TMA.")
        args += [compiled.scratch_size, compiled.scratch_align]
    return kernel_class(*args)


def get_or_create_triton_kernel(backend_init_func, platform, fn, arg_dtypes, scalar_args, *, num_warps,
                                num_stages, num_ctas, compute_capability, enable_fp_fusion, metaparams,
                                dump: bool):
    """Drop-in for jax_triton.triton_lib.get_or_create_triton_kernel (0.3.x): same arguments, same
    (kernel, attrs) result."""
    from jax_triton import triton_lib

    lib = triton_lib.triton_kernel_call_lib
    metaparams = dict(metaparams)
    extra_options, nbytes = metaparams.pop(EXTRA, ((), None))
    num_warps = 4 if num_warps is None else num_warps
    num_stages = 3 if num_stages is None else num_stages
    device = 0  # as jax-triton: every device is assumed to be of device 0's kind
    if compute_capability is None:
        compute_capability = lib.get_compute_capability(device)
    backend = backend_init_func(device, compute_capability)
    kind = "cuda" if platform == "cuda" else "hip"
    scalar_indices = {i for i, _, _ in scalar_args}
    attrs = specialization(backend, arg_dtypes, scalar_indices, nbytes, kind)
    signature = {fn.arg_names[i]: dtype for i, dtype in enumerate(arg_dtypes)}
    constants = dict(metaparams)
    constants.update({k: None for _, k, v in scalar_args if v is None})
    constants.update({fn.arg_names[i]: 1 for i, _, v in scalar_args if v == 1})
    for name in constants:
        signature[name] = "constexpr"
    options = {"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas, "debug": dump,
               "enable_fp_fusion": enable_fp_fusion, **dict(extra_options)}
    key = (fn, tuple(signature.items()), tuple((k, tuple(map(tuple, v))) for k, v in attrs.items()),
           tuple(constants.items()), tuple(sorted(options.items())), compute_capability)
    kernel = _CACHE.get(key)
    if kernel is None:
        compiled = compile_kernel(fn, backend, kind, signature, constants, attrs, options, compute_capability)
        kernel = _CACHE[key] = jaxlib_kernel(lib.TritonKernel, compiled, num_ctas, compute_capability)
    return kernel, attrs

