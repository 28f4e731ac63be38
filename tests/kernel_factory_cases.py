"""Checks of _kernel_factory that compile real kernels (Triton compiles on the CPU; no GPU needed), run by
test_kernel_factory.py in a process without TRITON_INTERPRET (under it @triton.jit gives interpreted
functions, which do not compile). What is checked is what jaxlib is told: warp count, scratch, attributes.

    python tests/kernel_factory_cases.py      -> "ok" per case, exit status 1 on the first failure
"""
import dataclasses
import os
import sys
import types

assert "TRITON_INTERPRET" not in os.environ, "run without TRITON_INTERPRET (the kernels must compile)"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.amd.compiler import HIPBackend  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402

from jax_flash_amd import _jax_triton_compat as compat, _kernel_factory as kf  # noqa: E402


@triton.jit
def plain(X, n, Y, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + o, tl.load(X + o, mask=o < n) * 2, mask=o < n)


@triton.jit
def tma_ws(A, B, K, C, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Device-side TMA descriptors (global scratch) and a warp-specialised loop (4 warps -> 12)."""
    a_desc = tl.make_tensor_descriptor(A, shape=[BM, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(B, shape=[BN, K], strides=[K, 1], block_shape=[BN, BK])
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=True):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([0, k]).T, acc)
    c_desc = tl.make_tensor_descriptor(C, shape=[BM, BN], strides=[BN, 1], block_shape=[BM, BN])
    c_desc.store([0, 0], acc.to(tl.float16))


class KernelWithScratch:
    """Stands in for jaxlib >= 0.11's TritonKernel: its nanobind signature names the scratch."""
    __doc__ = "__init__(self, ..., global_scratch_size: int | None = None, global_scratch_align: int | None = None)"
    made = []

    def __init__(self, *args):
        self.args = args
        type(self).made.append(args)


class KernelWithoutScratch:
    __doc__ = "__init__(self, kernel_name, num_warps, num_ctas, shared_mem_bytes, module_image, ttir, cc)"

    def __init__(self, *args):
        self.args = args


def fake_jax_triton(kernel_class, capability):
    """sys.modules entry so _kernel_factory.get_or_create_triton_kernel finds jaxlib's kernel class."""
    lib = types.SimpleNamespace(TritonKernel=kernel_class, get_compute_capability=lambda device: capability)
    module = types.ModuleType("jax_triton")
    module.triton_lib = types.SimpleNamespace(triton_kernel_call_lib=lib)
    sys.modules["jax_triton"] = module


def _rows(rows, **change):
    """The config rows with fields changed (the forced variants these cases plan with, through plan.Policy)."""
    return tuple(dataclasses.replace(row, **change) for row in rows)


def call(fn, backend, platform, dtypes, scalars, metaparams, num_warps=4, num_stages=2):
    return kf.get_or_create_triton_kernel(
        lambda device, cc: backend, platform, fn, dtypes, scalars, num_warps=num_warps, num_stages=num_stages,
        num_ctas=1, compute_capability=None, enable_fp_fusion=True, metaparams=metaparams, dump=False)


def case_cuda_plain_and_warp_specialised():
    fake_jax_triton(KernelWithScratch, 90)
    cuda = CUDABackend(GPUTarget("cuda", 90, 32))
    kernel, attrs = call(plain, cuda, "cuda", ["*fp32", "i32", "*fp32"], [(1, "i32", 1000)], {"BLOCK": 128})
    name, warps, ctas, shared, ptx, ttir, cc = kernel.args
    assert (warps, cc) == (4, 90) and ".version" in ptx, kernel.args[:4]  # no scratch arguments
    assert attrs[(0,)] == [["tt.divisibility", 16]] and attrs[(1,)] == [], attrs
    kernel, _ = call(tma_ws, cuda, "cuda", ["*fp16", "*fp16", "i32", "*fp16"], [(2, "i32", 256)],
                     {"BM": 128, "BN": 128, "BK": 64})
    warps, scratch, align = kernel.args[1], kernel.args[7], kernel.args[8]
    assert warps == 12, f"jaxlib must launch the compiled 12 warps, was told {warps}"
    assert scratch > 0 and align >= 64, (scratch, align)
    fake_jax_triton(KernelWithoutScratch, 90)
    kf._CACHE.clear()
    try:
        call(tma_ws, cuda, "cuda", ["*fp16", "*fp16", "i32", "*fp16"], [(2, "i32", 256)],
             {"BM": 128, "BN": 128, "BK": 64})
    except RuntimeError as e:
        assert "global scratch" in str(e) and "jaxlib >= 0.11" in str(e), e
    else:
        raise AssertionError("a kernel needing scratch was made on a jaxlib without it")


def case_cuda_gluon_forward():
    """The Gluon forward (kernels/fwd_sm90.py) as _launch.forward makes it for a call that takes it: compiled as
    Gluon (no Triton layout passes) with its three partitions (12 warps) and descriptor scratch."""
    import jax.numpy as jnp

    from jax_flash_amd import _launch
    from jax_flash_amd.rules import Band

    launches = []

    def record(launch):
        launches.append(launch)
        return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)

    q = jnp.zeros((1, 4096, 16, 128), jnp.bfloat16)
    statics = _launch.Statics(128 ** -0.5, Band.of(True, (-1, -1), 4096, 4096))
    _launch.forward(record, "sm90", q, q, q, statics=statics)
    (launch,) = launches
    assert kf.is_gluon(launch.kernel), launch.kernel
    dtypes, scalars = _signature(launch)
    fake_jax_triton(KernelWithScratch, 90)
    cuda = CUDABackend(GPUTarget("cuda", 90, 32))
    kernel, _ = call(launch.kernel, cuda, "cuda", dtypes, scalars, launch.constexprs,
                     num_warps=launch.compile_options["num_warps"])
    name, warps, scratch = kernel.args[0], kernel.args[1], kernel.args[7]
    assert name.startswith("attn_fwd_sm90") and warps == 12 and scratch > 0, kernel.args[:3] + kernel.args[7:]
    assert "setmaxnreg" in kernel.args[4], "the partitions' register split"
    assert not launch.constexprs["N_ROWS"], launch.constexprs  # causal 1 x 4096 x 16: unbalanced, one program per tile
    # without a band: the persistent grid (plan.gluon_programs)
    launches.clear()
    _launch.forward(record, "sm90", q, q, q, statics=_launch.Statics(128 ** -0.5, Band.of(False, (-1, -1), 4096, 4096)))
    (persistent,) = launches
    assert persistent.constexprs["N_ROWS"] == 16 and persistent.grid[1] == 1, (persistent.grid, persistent.constexprs)
    dtypes, scalars = _signature(persistent)
    kernel, _ = call(persistent.kernel, cuda, "cuda", dtypes, scalars, persistent.constexprs, num_warps=4)
    assert kernel.args[1] == 12 and kernel.args[7] > 0, kernel.args[:3] + kernel.args[7:]
    # D 64's persistent row carries a tile's block 0 into the tile before (fwd_sm90._carried_tiles)
    launches.clear()
    q64 = jnp.zeros((1, 4096, 32, 64), jnp.bfloat16)
    _launch.forward(record, "sm90", q64, q64, q64,
                    statics=_launch.Statics(64 ** -0.5, Band.of(True, (-1, -1), 4096, 4096)))
    (carried,) = launches
    assert carried.constexprs["N_ROWS"] == 32 and carried.constexprs["CARRY"] == 1, carried.constexprs
    dtypes, scalars = _signature(carried)
    kernel, _ = call(carried.kernel, cuda, "cuda", dtypes, scalars, carried.constexprs, num_warps=4)
    q_k_v_o = (2 * 2 * 64 + 2 * 3 * 128 + 2 * 64) * 64 * 2  # two tiles' Q, 3 stages of K and V, the output's buffers
    assert kernel.args[1] == 12 and kernel.args[3] >= q_k_v_o, kernel.args[:4]
    # and with dropout, where a row lets it take the kernel
    from jax_flash_amd.kernels import configs
    from jax_flash_amd.operands import Operands
    from jax_flash_amd.plan import Policy

    launches.clear()
    _launch.forward(record, "sm90", q, q, q, Operands(seeds=jnp.zeros((1, 16, 2), jnp.int32)),
                    statics=dataclasses.replace(statics, dropout_p=0.1),
                    policy=Policy(gluon_fwd=_rows(configs.SM90_GLUON_FWD, dropout=True)))
    (launch,) = launches
    assert kf.is_gluon(launch.kernel) and launch.constexprs["DROP_THRESHOLD"] > 0, launch.constexprs
    dtypes, scalars = _signature(launch)
    call(launch.kernel, cuda, "cuda", dtypes, scalars, launch.constexprs, num_warps=4)


def case_cuda_gluon_fp8_forward():
    """The Gluon forward for fp8 inputs (kernels/fwd_sm90.py P8_LOG2) as _launch.forward makes it where the rows the
    tests force serve (the shipped tiled D 128 row from any length, SM90_GLUON_FWD_FP8_D64): V transposed by keys_last
    first (fwd.mma_order's order), a bfloat16 output; compiled for sm90 at D 128 (causal, ragged, ALiBi and softcap;
    and without a band, the row's PINGPONG on) and D 64."""
    import jax.numpy as jnp

    from jax_flash_amd import _launch
    from jax_flash_amd.kernels import configs
    from jax_flash_amd.operands import Operands
    from jax_flash_amd.plan import Policy
    from jax_flash_amd.rules import Band

    launches = []

    def record(launch):
        launches.append(launch)
        return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)

    fake_jax_triton(KernelWithScratch, 90)
    cuda = CUDABackend(GPUTarget("cuda", 90, 32))
    forced = Policy(gluon_fwd_fp8=(configs.SM90_GLUON_FWD_FP8[1].but("sm90/gluon-fwd-fp8/d128-any-length", min_seq=0),
                                   configs.SM90_GLUON_FWD_FP8_D64))
    for d, variant in ((128, True), (128, False), (64, False)):
        q = jnp.zeros((2, 301, 4, d), jnp.float8_e4m3fn)
        descale = jnp.ones((2, 4), jnp.float32)
        extras = Operands(q_descale=descale, k_descale=descale, v_descale=descale,
                          slopes=jnp.zeros((2, 4), jnp.float32) if variant else None)
        statics = _launch.Statics(d ** -0.5, Band.of(variant, (-1, -1), 301, 301), softcap=20.0 * variant)
        launches.clear()
        out, _ = _launch.forward(record, "sm90", q, q, q, extras, statics=statics, policy=forced)
        assert [x.kernel.__name__ for x in launches] == ["keys_last", "attn_fwd_sm90"], launches
        assert out.dtype == jnp.bfloat16 and launches[1].constexprs["P8_LOG2"] == 8, launches[1].constexprs
        # PINGPONG for calls without a band only (plan.plan_forward); D 64's row has none
        assert launches[0].constexprs["MMA_ORDER"] and launches[1].constexprs["PINGPONG"] == (d == 128
                                                                                             and not variant)
        _compiles(launches[1], cuda, "attn_fwd_sm90")
    # the persistent grid (whole blocks, each tile's descales): the shipped row, with PINGPONG, with CARRY
    q = jnp.zeros((2, 512, 4, 128), jnp.float8_e4m3fn)
    descale = jnp.ones((2, 4), jnp.float32)
    descales = Operands(q_descale=descale, k_descale=descale, v_descale=descale)
    statics = _launch.Statics(128 ** -0.5, Band.of(False, (-1, -1), 512, 512))
    for pingpong, carry in ((False, 0), (True, 0), (False, 1)):
        policy = Policy(gluon_fwd_fp8=_rows(configs.SM90_GLUON_FWD_FP8, pingpong=pingpong, carry=bool(carry)))
        launches.clear()
        _launch.forward(record, "sm90", q, q, q, descales, statics=statics, policy=policy)
        made = launches[1].constexprs
        assert made["N_ROWS"] == 8 and made["CARRY"] == carry and made["PINGPONG"] == pingpong, made
        _compiles(launches[1], cuda, "attn_fwd_sm90")


def _signature(launch):
    """(dtypes, scalars) of a recorded _launch.Launch, as the factory takes them."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    pointer = {jnp.dtype(jnp.bfloat16): "*bf16", jnp.dtype(jnp.float32): "*fp32", jnp.dtype(jnp.int32): "*i32",
               jnp.dtype(jnp.float8_e4m3fn): "*fp8e4nv", jnp.dtype(jnp.int8): "*i8"}
    values = [*launch.args, *launch.out_shapes]
    dtypes = [pointer[jnp.dtype(x.dtype)] if isinstance(x, (jax.Array, jax.ShapeDtypeStruct))
              else "fp32" if isinstance(x, np.floating) else "i32" for x in values]
    return dtypes, [(i, t, values[i]) for i, t in enumerate(dtypes) if not t.startswith("*")]


def case_cuda_gluon_dkdv():
    """The Gluon dK/dV (kernels/bwd_sm90.py) as _launch.backward makes it where plan.gluon_dkdv_row takes the call (the
    rows from any length): 128-key blocks, on the dS path at D 128 (its workspace in 128-key rows, what attn_bwd_dq_ds
    reads) and on seven products at D 64; compiled as Gluon with its three partitions (12 warps) and descriptor
    scratch."""
    fake_jax_triton(KernelWithScratch, 90)
    _gluon_dkdv_launches(CUDABackend(GPUTarget("cuda", 90, 32)))


def case_cuda_gluon_dense():
    """The Gluon forward and dK/dV with a dense mask (keys) and bias (queries x keys) as _launch makes them under
    plan.Policy(gluon_dense=True): the tiled grids, compiled for sm90 with the operands' layouts."""
    import jax.numpy as jnp

    from jax_flash_amd import _launch
    from jax_flash_amd.kernels import configs
    from jax_flash_amd.operands import Operands
    from jax_flash_amd.plan import Policy
    from jax_flash_amd.rules import Band

    fake_jax_triton(KernelWithScratch, 90)
    cuda = CUDABackend(GPUTarget("cuda", 90, 32))
    policy = Policy(gluon_dense=True, gluon_fwd=_rows(configs.SM90_GLUON_FWD, min_seq=0),
                    gluon_dkdv=_rows(configs.SM90_GLUON_DKDV, min_seq=0))
    extras = Operands(mask=jnp.ones((2, 1, 1, 301), bool), bias=jnp.zeros((1, 4, 301, 301), jnp.bfloat16))
    statics = _launch.Statics(128 ** -0.5, Band.of(True, (-1, -1), 301, 301))
    launches = []

    def record(launch):
        launches.append(launch)
        return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)

    q = jnp.zeros((2, 301, 4, 128), jnp.bfloat16)
    _launch.forward(record, "sm90", q, q, q, extras, statics=statics, policy=policy)
    launches += _backward_launches(128, statics, extras, policy=policy)
    gluon = [one for one in launches if kf.is_gluon(one.kernel)]
    assert [one.kernel.__name__ for one in gluon] == ["attn_fwd_sm90", "attn_bwd_dkdv_sm90"], launches
    for launch in gluon:
        assert launch.constexprs["MASK"] == 1 + 4 + 8 and launch.constexprs["BIAS"] == 1 + 2 + 4 + 16, launch
        assert not launch.constexprs.get("N_ROWS"), launch.constexprs
        _compiles(launch, cuda, launch.kernel.__name__)
    # whole blocks: the forward masks every block only for the dense mask (MAY_MASK), the dK/dV none (EVEN)
    launches.clear()
    q = jnp.zeros((2, 384, 4, 128), jnp.bfloat16)
    full = _launch.Statics(128 ** -0.5, Band.of(False, (-1, -1), 384, 384))
    even = Operands(mask=jnp.ones((2, 4, 384, 384), bool))
    _launch.forward(record, "sm90", q, q, q, even, statics=full, policy=policy)
    launches += _backward_launches(128, full, even, shape=(2, 384, 4), policy=policy)
    gluon = [one for one in launches if kf.is_gluon(one.kernel)]
    assert gluon[0].constexprs["KEYS_EVEN"] and gluon[1].constexprs["EVEN"], [one.constexprs for one in gluon]
    for launch in gluon:
        _compiles(launch, cuda, launch.kernel.__name__)


def _backward_launches(d, statics, extras=None, shape=(2, 301, 4), policy=None):
    """The launches _launch.backward makes for an sm90 (*shape, d) bf16 call planned with `policy` (recorded, not
    run)."""
    import jax.numpy as jnp

    from jax_flash_amd import _launch
    from jax_flash_amd.operands import Operands

    launches = []

    def record(launch):
        launches.append(launch)
        return tuple(jnp.zeros(s.shape, s.dtype) for s in launch.out_shapes)

    q = jnp.zeros((*shape, d), jnp.bfloat16)
    lse = jnp.zeros((shape[0], shape[2], shape[1]), jnp.float32)
    _launch.backward(record, "sm90", q, q, q, q, lse, q, lse, extras or Operands(), statics=statics, policy=policy)
    return launches


def _compiles(launch, cuda, name):
    """The launch compiled for sm90 through the factory: Gluon's three partitions (12 warps) and descriptor scratch."""
    dtypes, scalars = _signature(launch)
    kernel, _ = call(launch.kernel, cuda, "cuda", dtypes, scalars, launch.constexprs, num_warps=4)
    assert kernel.args[0].startswith(name) and kernel.args[1] == 12 and kernel.args[7] > 0, kernel.args[:3]


def _gluon_dkdv_launches(cuda):
    import jax.numpy as jnp
    import numpy as np

    from jax_flash_amd import _launch, plan, rules
    from jax_flash_amd.kernels import configs
    from jax_flash_amd.operands import Operands
    from jax_flash_amd.plan import Policy
    from jax_flash_amd.rules import Band

    any_length = Policy(gluon_dkdv=_rows(configs.SM90_GLUON_DKDV, min_seq=0))
    for d, kernels in ((128, ["attn_bwd_dkdv_sm90", "attn_bwd_dq_ds"]), (64, ["attn_bwd_dq", "attn_bwd_dkdv_sm90"])):
        statics = _launch.Statics(d ** -0.5, Band.of(True, (-1, -1), 301, 301))
        launches = _backward_launches(d, statics, policy=any_length)
        assert [one.kernel.__name__ for one in launches] == kernels, launches
        (launch,) = [one for one in launches if kf.is_gluon(one.kernel)]
        assert launch.grid == (3, 8) and launch.compile_options == {"num_warps": 4}, launch
        assert launch.constexprs["DS"] == (d == 128) and not launch.constexprs["EVEN"], launch.constexprs
        params = _launch._params(launch.kernel)  # lse and delta padded to 16-byte rows, for their TMA tiles
        assert launch.args[params.index("lse_len")] == 304 and launch.args[params.index("Lse")].shape == (2, 4, 304)
        if d == 128:
            call = plan.Call("sm90", 2, 301, 301, 4, 4, 128, band=statics.band)
            assert launch.out_shapes[2].shape == plan.ds_workspace(call, 128), launch.out_shapes
        _compiles(launch, cuda, "attn_bwd_dkdv_sm90")
        if d == 128:  # and with dropout, where a row lets it take the kernel
            launches = _backward_launches(d, dataclasses.replace(statics, dropout_p=0.1),
                                          Operands(seeds=jnp.zeros((2, 4, 2), jnp.int32)),
                                          policy=any_length.replace(gluon_dkdv=_rows(any_length.gluon_dkdv,
                                                                                     dropout=True)))
            (launch,) = [one for one in launches if kf.is_gluon(one.kernel)]
            assert launch.constexprs["DROP_THRESHOLD"] > 0, launch.constexprs
            _compiles(launch, cuda, "attn_bwd_dkdv_sm90")
            # the workspace holds dS / keep_scale (kernels/dropout.py dropped_ds): dQ's scale carries keep_scale
            (dq,) = [one for one in launches if one.kernel.__name__ == "attn_bwd_dq_ds"]
            scale = dq.args[_launch._params(dq.kernel).index("sm_scale")]
            assert np.isclose(scale, statics.scale / (1 - rules.dropout_rate(0.1)), rtol=1e-6, atol=0), scale


def case_cuda_gluon_dkdv_persistent():
    """The Gluon dK/dV's persistent grid (kernels/bwd_sm90.py N_ROWS; a row made `persistent` ahead of the tiled one,
    no row ships it) as _launch.backward makes it on 132 SMs: about one program per SM where the call runs persistent,
    the tiled grid where it cannot (ragged); compiled for sm90: 12 warps, scratch, two tiles' K and V within shared
    memory."""
    from jax_flash_amd import _launch
    from jax_flash_amd.kernels import configs
    from jax_flash_amd.plan import Policy
    from jax_flash_amd.rules import Band

    fake_jax_triton(KernelWithScratch, 90)
    cuda = CUDABackend(GPUTarget("cuda", 90, 32))
    shipped = configs.SM90_GLUON_DKDV
    policy = Policy(compute_units=132, gluon_dkdv=_rows(shipped, min_seq=0, persistent=1) + shipped)
    shared = {}
    for d, shape, window, grid in ((128, (4, 4096, 16), (-1, -1), (132, 1)),
                                   (128, (4, 4000, 16), (-1, -1), (32, 64)),
                                   (128, (1, 16384, 16), (1024, 0), (132, 1)),
                                   (64, (4, 4096, 32), (-1, -1), (132, 1))):
        statics = _launch.Statics(d ** -0.5, Band.of(True, window, shape[1], shape[1]))
        launches = _backward_launches(d, statics, shape=shape, policy=policy)
        (launch,) = [one for one in launches if kf.is_gluon(one.kernel)]
        n_rows = launch.constexprs.get("N_ROWS", 0)
        assert launch.grid == grid and n_rows == (shape[0] * shape[2] if grid[1] == 1 else 0), launch
        dtypes, scalars = _signature(launch)
        kernel, _ = call(launch.kernel, cuda, "cuda", dtypes, scalars, launch.constexprs, num_warps=4)
        assert kernel.args[1] == 12 and kernel.args[7] > 0 and kernel.args[3] <= 227 * 1024, kernel.args[:4]
        shared[d, bool(n_rows)] = kernel.args[3]
    # SPANS (kernels/bwd_sm90.py _consume_tile): narrow windows only, persistent and tiled
    policy = policy.replace(gluon_dkdv=tuple(dataclasses.replace(r, min_seq=0, spans=True, persistent=p)
                                             for p in (1, 0) for r in shipped))
    for d, shape, window, spans in ((128, (1, 16384, 16), (1024, 0), True), (128, (2, 1000, 4), (100, 37), True),
                                    (128, (1, 4096, 16), (-1, -1), False), (64, (4, 4096, 32), (256, 256), True)):
        statics = _launch.Statics(d ** -0.5, Band.of(True, window, shape[1], shape[1]))
        launches = _backward_launches(d, statics, shape=shape, policy=policy)
        (launch,) = [one for one in launches if kf.is_gluon(one.kernel)]
        assert launch.constexprs["SPANS"] == spans, launch.constexprs
        _compiles(launch, cuda, "attn_bwd_dkdv_sm90")
    # a second pair of K / V buffers: 64 KiB (the barriers' bytes differ too)
    assert 64 * 1024 - 64 <= shared[128, True] - shared[128, False] <= 64 * 1024 + 64, shared


def case_amd_options_and_pointer_range():
    fake_jax_triton(KernelWithScratch, 0)
    hip = HIPBackend(GPUTarget("hip", "gfx942", 64))
    small, large = compat.BUFFER_RANGE_BYTES, compat.BUFFER_RANGE_BYTES + 1
    extra = ((("waves_per_eu", 2),), (small, large))  # X fits 32-bit offsets, Y does not
    kernel, attrs = call(plain, hip, "rocm", ["*fp32", "i32", "*fp32"], [(1, "i32", 1000)],
                         {"BLOCK": 128, kf.EXTRA: extra})
    assert ["tt.pointer_range", 32] in attrs[(0,)] and ["tt.pointer_range", 32] not in attrs[(2,)], attrs
    assert os.path.getsize(kernel.args[4]) > 0  # the hsaco, by path
    assert "tt.pointer_range = 32" in kernel.args[5], "the attribute reached the TTIR"


def case_amd_compat_triton_call_sizes():
    """compat.triton_call (jax-triton 0.3.x) hands the factory the row's options and every array's size."""
    import numpy as np

    from jax_flash_amd._launch import Launch

    seen = {}

    def triton_call(*args, **kwargs):
        seen.update(kwargs)
        return (np.zeros(1),)

    sys.modules["jax_triton"] = types.SimpleNamespace(triton_call=triton_call)
    compat.versions.cache_clear()
    compat.versions = lambda: {"jax-triton": (0, 3, 1), "triton": (3, 6, 0), "jax": (0, 11, 2)}
    compat._install = lambda: None
    x = np.zeros((3, 5), np.float32)
    launch = Launch(kernel=plain, grid=(1,), args=(x, 15), out_shapes=(np.zeros((2,), np.float16),),
                    constexprs=dict(BLOCK=128), compile_options=dict(num_warps=8, num_stages=1, waves_per_eu=2))
    compat.triton_call(launch)
    assert seen[kf.EXTRA] == ((("waves_per_eu", 2),), (60, 4)), seen
    assert seen["num_warps"] == 8 and seen["BLOCK"] == 128 and "backend_options" not in seen


if __name__ == "__main__":
    for name, case in list(globals().items()):
        if name.startswith("case_"):
            case()
            print("ok", name, flush=True)
