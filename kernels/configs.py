"""Default launch configs per target, as data (tuning lives here, not in the launchers).

TARGETS[target][kernel] is a list of rows ordered by ``max_block_d``. A launch takes the first row
whose ``max_block_d`` >= BLOCK_D * itemsize / 2: float32 inputs take the row of a head twice as wide,
since their tiles need twice the registers and shared memory. Keys other than ``max_block_d`` are
the kernel's BLOCK_* constexprs and compiler options (num_warps, num_stages; on HIP also
waves_per_eu and matrix_instr_nonkdim, which need a jax-triton that forwards them).

Kernels: "fwd" (BLOCK_M queries held, BLOCK_N keys streamed), "dkdv" (BLOCK_N keys held, BLOCK_M
queries streamed), "dq" (BLOCK_M queries held, BLOCK_N keys streamed), "preprocess" (BLOCK_M rows).
"""

_PRE = [dict(max_block_d=512, BLOCK_M=64, num_warps=4, num_stages=1)]


def _hip(fwd_wide_n):
    # AMD practice (ROCm's Triton FA): no software pipelining (num_stages=1), occupancy asked for
    # with waves_per_eu, 16x16 MFMA in the backward.
    return {
        "fwd": [
            dict(max_block_d=128, BLOCK_M=128, BLOCK_N=fwd_wide_n, num_warps=4, num_stages=1, waves_per_eu=2),
            dict(max_block_d=256, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=1),
            dict(max_block_d=512, BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1),
        ],
        "dkdv": [
            dict(max_block_d=128, BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=256, BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
        ],
        "dq": [
            dict(max_block_d=128, BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=256, BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
            dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=1,
                 matrix_instr_nonkdim=16),
        ],
        "preprocess": _PRE,
    }


TARGETS = {
    # NVIDIA sm80/sm90 (H100/H200 measured)
    "cuda": {
        "fwd": [
            dict(max_block_d=64, BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
            dict(max_block_d=128, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
            dict(max_block_d=256, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
            dict(max_block_d=512, BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1),
        ],
        "dkdv": [
            dict(max_block_d=64, BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3),
            # H200, D 128, N 4096: 4.3 ms backward vs 8.5 ms for 32 x 128 x 4 warps (3 KB of spills)
            dict(max_block_d=128, BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2),
            dict(max_block_d=256, BLOCK_M=32, BLOCK_N=64, num_warps=8, num_stages=2),  # 4 warps: 4.5 KB spills
            dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
        ],
        "dq": [
            dict(max_block_d=64, BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=3),
            dict(max_block_d=128, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),  # no spills at D 128
            dict(max_block_d=256, BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2),
            dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1),
        ],
        "preprocess": _PRE,
    },
    "gfx90a": _hip(fwd_wide_n=64),  # MI200: 64 KiB LDS
    "gfx942": _hip(fwd_wide_n=64),  # MI300
    "gfx950": _hip(fwd_wide_n=128),  # MI350: 160 KiB LDS
    # Triton's interpreter on CPU (tests): small unequal blocks, so ragged, diagonal and unmasked
    # blocks all occur at test sizes.
    "interpret": {
        "fwd": [dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)],
        "dkdv": [dict(max_block_d=512, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)],
        "dq": [dict(max_block_d=512, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)],
        "preprocess": [dict(max_block_d=512, BLOCK_M=32, num_warps=4, num_stages=1)],
    },
}
