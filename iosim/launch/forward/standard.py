"""Launch geometry of `gpu.forward.standard` (the plain standard-attention kernels),
without Numba: threads of its row-softmax kernel (N: row length, keys)."""
from __future__ import annotations


def softmax_threads(N: int, threads: int) -> int:
    """Threads of the row-softmax kernel: `threads`, but no more than N needs."""
    return max(1, min(threads, 1 << (max(N, 1) - 1).bit_length()))
