"""The causal / local-window band of the forward kernels (N_q != N_k, window_size).

Convention (iosim.problem.band_of; flash-attn >= 2.1, PyTorch causal_lower_right): with
o = N_k - N_q, query row r sees key c iff lo <= c - r <= hi, where causal gives hi = o and
a window (left, right) gives lo = o - left, hi = o + right (-1: that side unbounded).
Kernels take lo and hi as int64 arguments, an unbounded side as -BIG / +BIG, and a
compile-time flag `banded` (causal or a window) that turns the masking code on.

Tile (i, j) (rows r0..r_last, keys c0..c_last) holds a visible pair iff
    c0 - r_last <= hi  and  c_last - r0 >= lo          (`tile_in_band`)
(c - r takes every integer in between), exactly iosim.schedules.band_tiles.
"""
from __future__ import annotations

import os

import numpy as np
from numba import cuda

from iosim.problem import band_of, check_window

#: stands for an unbounded side of the band (|c - r| never reaches it)
BIG = 1 << 62
#: the fa2 backward's own rows (`own_rows`): exact D where one key tile holds a row's keys.
#: FLASHSIM_OWN_ROWS=0 (read at import) builds the banded backward kernels without them, as
#: they were before (for A/B timings and the error they fix; kernel names end in _noown).
OWN_ROWS = os.environ.get("FLASHSIM_OWN_ROWS", "1") != "0"


def band_args(N_q: int, N_k: int, causal: bool, window=(-1, -1)):
    """(windowed, lo, hi): the compile-time flag `window` of the kernels (a window is
    given; the kernels mask when causal or windowed) and the int64 arguments lo, hi.
    ConfigError (a ValueError) for a bad window, or causal with right > 0."""
    windowed = check_window(window, bool(causal)) != (-1, -1)
    lo, hi = band_of(int(N_q), int(N_k), bool(causal), window)
    return (windowed, np.int64(-BIG if lo is None else lo), np.int64(BIG if hi is None else hi))


def own_rows(r0, r_last, c0, c_last, N_k, lo, hi):
    """(o_lo, o_hi): the rows of r0..r_last whose keys (lo <= c - r <= hi, 0 <= c < N_k) all
    lie in c0..c_last (an empty range when o_lo > o_hi). The fa2 backward kernels take such a
    row's D = rowsum(P o dP) from the tile itself (exact) instead of rowsum(dO o O) from
    the stored O (gpu.backward.flash, module docstring). Plain Python too (tests)."""
    o_lo = r0 if c0 <= 0 else max(r0, c0 - lo)
    o_hi = r_last if c_last >= N_k - 1 else min(r_last, c_last - hi)
    return o_lo, o_hi


own_rows_dev = cuda.jit(device=True, inline=True)(own_rows)


@cuda.jit(device=True, inline=True)
def tile_in_band(r0, r_last, c0, c_last, lo, hi):
    """Whether the tile rows r0..r_last x keys c0..c_last holds a pair lo <= c - r <= hi."""
    return c0 - r_last <= hi and c_last - r0 >= lo


def active_tile_finder(B_c, banded, has_mask):
    """Device function next_tile(j, T_c, r0, last, N_k, lo, hi, mask, i): the first active
    key tile >= j of query block i (rows r0 .. last), T_c if none; a tile is inactive
    outside the band (`banded`: causal or a window, gpu.forward._band) or where the block
    mask (`has_mask`) is 0. Shared by the fast fa2, the fast standard PV and the tensor-core fa2 kernels."""

    @cuda.jit(device=True, inline=True)
    def next_tile(j, T_c, r0, last, N_k, lo, hi, mask, i):
        """The first active key tile >= j of query block i (T_c if none)."""
        while j < T_c:
            if banded and j * B_c - last > hi:          # this and later tiles inactive
                return T_c
            if banded and not tile_in_band(r0, last, j * B_c, min(j * B_c + B_c, N_k) - 1,
                                           lo, hi):
                j += 1
                continue
            if has_mask and mask[i, j] == 0:
                j += 1
                continue
            return j
        return T_c

    return next_tile


@cuda.jit(device=True, inline=True)
def sees_key_band(mask, i, row, B_c, N_k, lo, hi, banded, has_mask):
    """Whether query `row` (of query block i) may attend at least one key: a key
    c in [max(0, row + lo), min(N_k - 1, row + hi)] (all keys when not banded) in a tile
    the block mask keeps. The structural test of "the row sees no key" (O = 0,
    L = -inf): never read off the running sum l, which is NaN when an input is NaN."""
    c_lo = 0
    c_hi = N_k - 1
    if banded:
        c_lo = max(c_lo, row + lo)
        c_hi = min(c_hi, row + hi)
    if c_lo > c_hi:
        return False
    if not has_mask:
        return True
    for j in range(c_lo // B_c, c_hi // B_c + 1):
        if mask[i, j] != 0:
            return True
    return False
