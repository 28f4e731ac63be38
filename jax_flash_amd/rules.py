"""The rules every implementation shares, written once: which (query, key) pairs are visible (the band
after the causal cap and window clamping) and what dropout applies (threshold and keep scale).

The API computes a call's `Band` once; the kernel launches, the pure-JAX reference and the tests all
read it from here, so the three cannot disagree.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

UNBOUNDED = 1 << 30  # kernels/masking.py's UNBOUNDED: an offset past any sequence, small enough not to overflow


@dataclasses.dataclass(frozen=True)
class Band:
    """Query i sees key j iff i + diag - left <= j <= i + diag + right, diag = seq_k - seq_q (bottom-right
    aligned, FlashAttention's convention); -1: that side unbounded. Hashable: part of a call's static
    options."""
    left: int = -1
    right: int = -1

    @classmethod
    def of(cls, causal: bool, window: tuple[int, int], seq_q: int, seq_k: int) -> Band:
        """The band of a call: causal caps right at 0; a side wide enough to reach every key of every row
        becomes unbounded (so window_size=(2**31, 0) is plain causal, with no overflow anywhere)."""
        left, right = window
        if causal:
            right = 0 if right < 0 else min(right, 0)
        # the widest reach any row needs: left >= seq_k - 1 (the last row's first key), right >= seq_q - 1
        if left >= max(seq_k - 1, 0):
            left = -1
        if right >= max(seq_q - 1, 0):
            right = -1
        return cls(left, right)

    @property
    def banded(self) -> bool:
        """Whether the band bounds anything (else only the sequence bounds apply)."""
        return self.left >= 0 or self.right >= 0

    @property
    def sides(self) -> int:
        """The kernels' BANDED constexpr (kernels/masking.py): 1 if the right side bounds anything, + 2 if
        the left does (0: no band)."""
        return (self.right >= 0) + 2 * (self.left >= 0)

    def narrow(self, widest: int) -> bool:
        """Bounded on both sides and at most `widest` keys wide."""
        return 0 <= self.left and 0 <= self.right and self.left + self.right + 1 <= widest

    def offsets(self, seq_q: int, seq_k: int) -> tuple[int, int]:
        """(lo_off, hi_off) of kernels/masking.py: query i sees key j iff i + lo_off <= j <= i + hi_off."""
        diag = seq_k - seq_q
        return (diag - self.left if self.left >= 0 else -UNBOUNDED,
                diag + self.right if self.right >= 0 else UNBOUNDED)

    def visible(self, seq_q: int, seq_k: int, shift=None) -> jax.Array:
        """(seq_q, seq_k) bool: query i sees key j (the O(N^2) mask of the pure-JAX reference). shift
        (batch,) int: the band moved by that many keys per batch row (a block of a larger call,
        kernels/masking.py `place`): (batch, 1, seq_q, seq_k)."""
        lo_off, hi_off = self.offsets(seq_q, seq_k)
        i = jnp.arange(seq_q)[:, None]
        j = jnp.arange(seq_k)[None, :]
        if shift is not None:
            i = i + shift[:, None, None, None]
        return (j >= i + lo_off) & (j <= i + hi_off)


def dropout_threshold(p: float) -> int:
    """A probability is kept iff its random byte is >= this (kernels/dropout.py): p * 256 rounded, in
    1 .. 255 for 0 < p < 1, so the rate applied is a multiple of 1/256 (FlashAttention's 8-bit draws);
    0 for p == 0 (no dropout)."""
    return min(255, max(1, round(p * 256))) if p > 0 else 0


def dropout_rate(p: float) -> float:
    """The rate the kernels apply for a requested dropout_p: dropout_threshold(p) / 256."""
    return dropout_threshold(p) / 256


def dropout_keep_scale(p: float) -> float:
    """What kept probabilities are multiplied by: 1 / (1 - the applied rate), so the expectation is exact."""
    return 1.0 / (1.0 - dropout_rate(p))
