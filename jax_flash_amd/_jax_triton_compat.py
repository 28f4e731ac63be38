"""The one place that knows jax-triton's versions: how a launch's compile options reach Triton, and the
workarounds each known version needs.

Supported pairs (docs/amd.md, "Running on AMD"):
- jax-triton 0.3.x + triton 3.6 (Python >= 3.10): its kernel factory is replaced by ours
  (_kernel_factory.py), which passes every option of a config row (AMD's waves_per_eu, ...), the AMD
  pointer-range attribute (buffer loads), and tells jaxlib the compiled warp count and the global scratch
  that TMA descriptors need.
- jax-triton 0.4.x + triton >= 3.7 (Python >= 3.12, jax < 0.12): takes ``backend_options=`` and passes
  the scratch itself; the pointer-range attribute is added to its specialisation here. It launches with
  the requested warp count, so warp-specialised config rows are not used with it (`launches_compiled_warps`).
Known broken, refused with a clear error: jax-triton 0.4.x with triton < 3.7 (its imports fall back to
stubs) and jax-triton 0.4.1 with jax >= 0.12 (its DCE rule takes the wrong number of arguments).
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import re

import numpy as np

from jax_flash_amd import _kernel_factory

log = logging.getLogger(__name__)

EXPLICIT_OPTIONS = ("num_warps", "num_stages")  # what every jax-triton version takes as keywords
RECOMMENDED = "jax-triton>=0.4.1,<0.5 with triton>=3.7 and jax>=0.11,<0.12 (Python >= 3.12)"


def _version(dist: str) -> tuple[int, ...] | None:
    try:
        text = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        try:  # importable without package metadata (e.g. copied onto sys.path)
            text = importlib.import_module(dist.replace("-", "_")).__version__
        except Exception:  # noqa: BLE001  (absent, or fails to import on a CPU-only jaxlib)
            return None
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


@functools.cache
def versions() -> dict[str, tuple[int, ...] | None]:
    return {name: _version(name) for name in ("jax-triton", "triton", "jax")}


def uses_own_factory(jax_triton_version: tuple[int, ...] | None = None) -> bool:
    """Whether launches go through _kernel_factory (jax-triton 0.3.x) rather than jax-triton's own."""
    v = jax_triton_version if jax_triton_version is not None else versions()["jax-triton"]
    return v is not None and v < (0, 4)


def launches_compiled_warps(jax_triton_version: tuple[int, ...] | None = None) -> bool:
    """Whether a launch uses the compiled warp count (needed by warp-specialised kernels). jax-triton 0.4.1
    passes the requested one; not installed: assume ours."""
    v = jax_triton_version if jax_triton_version is not None else versions()["jax-triton"]
    return v is None or uses_own_factory(v)


# AMD's buffer loads/stores address with a 32-bit byte offset from a base; Triton emits them (instead of
# global loads with 64-bit address arithmetic) for a pointer argument carrying the pointer-range attribute
# ("S"), which torch's launcher sets when the tensor spans < 2 GiB and jax-triton never sets.
BUFFER_RANGE_BYTES = 2**31 - 1


def pointer_specialization(nbytes: int, platform: str) -> str:
    """Triton's specialization letters for an array argument of `nbytes` bytes on `platform` ("cuda" or
    "hip"): "D" (16-byte aligned, as XLA buffers are), plus "S" on AMD when every byte offset fits 32
    bits (BUFFER_RANGE_BYTES). Larger tensors keep global loads."""
    return "DS" if platform == "hip" and nbytes <= BUFFER_RANGE_BYTES else "D"


def compiler_options(options: dict) -> dict:
    """The options of a config row that reach Triton's compiler: all of them, with either jax-triton."""
    return dict(options)


def check_supported() -> None:
    """Raise a clear error for jax-triton / triton / jax combinations known not to work."""
    v = versions()
    jt, tr, jx = v["jax-triton"], v["triton"], v["jax"]
    if jt is None:
        raise RuntimeError("implementation='triton' needs jax-triton: pip install 'jax-triton>=0.3.1'")
    if jt >= (0, 4) and tr is not None and tr < (3, 7):
        raise RuntimeError(f"jax-triton {_fmt(jt)} needs triton >= 3.7 (found {_fmt(tr)}); with triton "
                           f"{_fmt(tr)} use jax-triton 0.3.1, or install {RECOMMENDED}.")
    if jt[:3] == (0, 4, 1) and jx is not None and jx >= (0, 12):
        raise RuntimeError(f"jax-triton 0.4.1 does not work with jax {_fmt(jx)} (its DCE rule fails); "
                           f"install {RECOMMENDED}.")


def _fmt(v) -> str:
    return ".".join(map(str, v))


@functools.cache
def apply_workarounds() -> None:
    """jax-triton 0.4.0-0.4.1 compile for ROCm starting from an empty metadata dict, and triton >= 3.7's
    HIPBackend.make_llir reads metadata["num_ctas"] (KeyError). Fill it in from the options first.
    Remove when a jax-triton release seeds the metadata (its compile_ttir_to_hsaco_inplace)."""
    v = versions()
    if not (v["jax-triton"] and (0, 4) <= v["jax-triton"] <= (0, 4, 1) and v["triton"] and v["triton"] >= (3, 7)):
        return
    import triton.backends.amd.compiler as hip

    make_llir = hip.HIPBackend.make_llir

    def make_llir_with_num_ctas(src, metadata, options):
        metadata.setdefault("num_ctas", options.num_ctas)
        return make_llir(src, metadata, options)

    hip.HIPBackend.make_llir = staticmethod(make_llir_with_num_ctas)


@functools.cache
def _install() -> None:
    """Route jax-triton's kernel creation through ours (0.3.x), or add the pointer-range attribute to its
    specialisation (0.4.x)."""
    from jax_triton import triton_lib

    if uses_own_factory():
        triton_lib.get_or_create_triton_kernel = _kernel_factory.get_or_create_triton_kernel
        return
    spec = getattr(triton_lib, "KernelSpecialization", None)
    if spec is None:
        return
    build = spec.build.__func__

    def build_with_pointer_range(cls, arg_names, args, arg_dtypes, in_tree, objpaths, metaparams, backend):
        out = build(cls, arg_names, args, arg_dtypes, in_tree, objpaths, metaparams, backend)
        if type(backend).__name__ != "HIPBackend":
            return out
        for i, arg in enumerate(args):
            shape, dtype = getattr(arg, "shape", None), getattr(arg, "dtype", None)
            if shape is None or dtype is None or out.attrs[objpaths[i]] == []:
                continue
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            out.attrs[objpaths[i]] = backend.parse_attr(pointer_specialization(nbytes, "hip"))
            out.specialization[i] = (out.specialization[i][0], pointer_specialization(nbytes, "hip"))
        return out

    spec.build = classmethod(build_with_pointer_range)


def _nbytes(x) -> int:
    return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def triton_call(launch) -> tuple:
    """jax_triton.triton_call of a _launch.Launch, passing its compile options as this version can."""
    import jax
    import jax_triton

    apply_workarounds()
    _install()
    explicit = {k: v for k, v in launch.compile_options.items() if k in EXPLICIT_OPTIONS}
    extra = {k: v for k, v in launch.compile_options.items() if k not in EXPLICIT_OPTIONS}
    out_shapes = launch.out_shapes
    if launch.aliases:  # outputs written in place into an input's buffer (_launch.Launch.aliases)
        if uses_own_factory():  # 0.3.x numbers inputs among the array arguments
            explicit["input_output_aliases"] = {sum(isinstance(a, jax.Array) for a in launch.args[:pos]): out
                                                for pos, out in launch.aliases}
        else:
            # 0.4.x numbers inputs among all the kernel's runtime arguments, and an aliased output takes no
            # parameter of its own: the kernel's (unused, _launch.Launch.aliases) get one-element placeholders
            explicit["input_output_aliases"] = {pos: out for pos, out in launch.aliases}
            out_shapes += tuple(jax.ShapeDtypeStruct((1,), out_shapes[out].dtype) for _, out in launch.aliases)
    if uses_own_factory():
        arrays = [a for a in launch.args if hasattr(a, "shape")] + list(out_shapes)
        explicit[_kernel_factory.EXTRA] = (tuple(sorted(extra.items())), tuple(_nbytes(a) for a in arrays))
    elif extra:
        explicit["backend_options"] = extra
    outs = jax_triton.triton_call(*launch.args, kernel=launch.kernel, out_shape=out_shapes,
                                  grid=launch.grid, **explicit, **launch.constexprs)
    return tuple(outs)[:len(launch.out_shapes)]

