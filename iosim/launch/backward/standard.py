"""Launch geometry of `gpu.backward.standard` (the plain standard-attention backward),
without Numba: dynamic shared memory (bytes) of its tiled kernels for B_r query rows, B_c
key rows, head dim d (elements) and storage dtype dt, and of its one-row dS kernel (N
keys)."""
from __future__ import annotations

from ...problem import DTYPES


def std_bwd_shared_bytes(B_r: int, B_c: int, d: int, dt: str) -> int:
    """Dynamic shared memory of the tiled standard-backward kernels (bytes): the largest of
    the dV/dK, dQ and dP kernels' footprints (module docstring)."""
    it = DTYPES[dt].itemsize
    dv_dk = 4 * B_c * d + it * (B_r * B_c + B_r * d)
    dq = 4 * B_r * d + it * (B_r * B_c + B_c * d)
    dp = it * (B_r * d + B_c * d)
    return max(dv_dk, dq, dp)


def ds_shared_bytes(N: int, dt: str) -> int:
    """Dynamic shared memory of the dS kernel (bytes): one row of P and of dP."""
    return 2 * N * DTYPES[dt].itemsize


def ds_threads(N: int, threads: int) -> int:
    """Threads of the one-row-per-block dS kernel: `threads`, but no more than N needs."""
    return max(1, min(threads, 1 << (max(N, 1) - 1).bit_length()))


# ---------------------------------------------------------------------------------------
