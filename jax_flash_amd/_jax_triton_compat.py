"""The one place that knows jax-triton's versions: how a launch's compile options reach Triton, and the
workarounds each known version needs.

Supported pairs (README, "Running on AMD"):
- jax-triton 0.3.x + triton 3.6 (Python >= 3.10): forwards num_warps / num_stages only, so AMD options
  (waves_per_eu, matrix_instr_nonkdim, kpack) are dropped, with a one-time warning.
- jax-triton 0.4.x + triton >= 3.7 (Python >= 3.12, jax < 0.12): takes ``backend_options=``, so every
  option of a config row reaches Triton's HIPOptions / CUDAOptions.
Known broken, refused with a clear error: jax-triton 0.4.x with triton < 3.7 (its imports fall back to
stubs) and jax-triton 0.4.1 with jax >= 0.12 (its DCE rule takes the wrong number of arguments).
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import re

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


def passes_backend_options(jax_triton_version: tuple[int, ...] | None = None) -> bool:
    """Whether this jax-triton forwards backend options (waves_per_eu, ...). Not installed: assume the
    recommended pair, which does (amd_report describes what ROCm users of that pair run)."""
    v = jax_triton_version if jax_triton_version is not None else versions()["jax-triton"]
    return v is None or v >= (0, 4)


# AMD's buffer loads/stores address with a 32-bit byte offset from a base; Triton emits them (instead of
# global loads with 64-bit address arithmetic) for a pointer argument carrying the pointer-range attribute
# ("S"), which torch's launcher sets when the tensor spans < 2 GiB and jax-triton never sets.
BUFFER_RANGE_BYTES = 2**31 - 1


def pointer_specialization(nbytes: int, platform: str) -> str:
    """Triton's specialization letters for an array argument of `nbytes` bytes on `platform` ("cuda" or
    "hip"): "D" (16-byte aligned, as XLA buffers are), plus "S" on AMD when every byte offset fits 32
    bits (BUFFER_RANGE_BYTES). Larger tensors keep global loads."""
    return "DS" if platform == "hip" and nbytes <= BUFFER_RANGE_BYTES else "D"


def compiler_options(options: dict, jax_triton_version: tuple[int, ...] | None = None) -> dict:
    """The options of a config row that reach Triton's compiler through this jax-triton."""
    if passes_backend_options(jax_triton_version):
        return dict(options)
    return {k: v for k, v in options.items() if k in EXPLICIT_OPTIONS}


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
def _warn_dropped(names: tuple[str, ...]) -> None:
    log.warning("jax_flash_amd: jax-triton %s cannot pass %s to Triton, so the kernels compile without "
                "them (on AMD: lower occupancy, possible spills). Install %s.",
                _fmt(versions()["jax-triton"]), ", ".join(names), RECOMMENDED)


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


def triton_call(launch) -> tuple:
    """jax_triton.triton_call of a _launch.Launch, passing its compile options as this version can."""
    import jax_triton

    apply_workarounds()
    explicit = {k: v for k, v in launch.compile_options.items() if k in EXPLICIT_OPTIONS}
    extra = {k: v for k, v in launch.compile_options.items() if k not in EXPLICIT_OPTIONS}
    if extra and passes_backend_options():
        explicit["backend_options"] = extra
    elif extra:
        _warn_dropped(tuple(sorted(extra)))
    outs = jax_triton.triton_call(*launch.args, kernel=launch.kernel, out_shape=launch.out_shapes,
                                  grid=launch.grid, **explicit, **launch.constexprs)
    return tuple(outs)
