"""FlashAttention-2 forward on packed variable-length batches, one launch.

The schedule of gpu.forward.fa2 (read Q_i once; per active key block j read K_j, V_j and
update m, l and the O_i accumulator on chip; write O_i and L_i once), on flash-attn's
packed layout: q, o (total_q, H, d), k, v (total_k, H / G, d), L (H, total_q) float32
(flash-attn's softmax_lse layout). Grid (max_b T_r_b, batch * H): block (i, z) is query
block i of sequence b = z // H, query head h = z % H. It reads its sequence's row offsets
and lengths from cu_seqlens_q, cu_seqlens_k (int32, on the device), and a block with
i >= T_r_b = ceil(N_q_b / B_r) exits at once: no loads, no counts. Tiles never straddle
two sequences, so the kernel's own counts are the sum of the per-sequence ledgers
(iosim.varlen).

Band per sequence (bottom-right, o_b = N_k_b - N_q_b): the kernel takes lo0, hi0, the
band relative to o (lo0 = -left, hi0 = 0 causal or right, +-BIG unbounded;
gpu.forward._band) and uses lo = lo0 + o_b, hi = hi0 + o_b (|o_b| is far from BIG: no
overflow). A row that sees no key (N_k_b = 0, causal with N_q_b > N_k_b, a window) gets
O = 0, L = -inf.

A kernel of its own (its grid, its arguments: the plain kernel's signature, which
gpu.api's recorded launch plans hold, stays as it is), around the same block body:
`gpu.forward.fa2.fa2_block` with packed indexing. Shared memory and the three phases
per tile are fa2's (`iosim.sram_footprint_bytes('fa2', ...)` bytes).
"""
from __future__ import annotations


import numpy as np
from numba import cuda, float32, int64

from iosim.tiling import sram_footprint_bytes

from .._launch import NB_DTYPE, kernel_name, specialisation
from ._band import BIG
from .fa2 import fa2_block


@cuda.jit(device=True, inline=True)
def sequence_rows(cu_q, cu_k, b):
    """(qoff, N_q_b, koff, N_k_b): sequence b's first query row and query rows, first key
    row and key rows in the packed tensors (from cu_seqlens_q, cu_seqlens_k)."""
    qoff = int64(cu_q[b])
    koff = int64(cu_k[b])
    return qoff, int64(cu_q[b + 1]) - qoff, koff, int64(cu_k[b + 1]) - koff


@specialisation
def fa2_varlen_kernel(B_r, B_c, d, dt, banded, count, threads):
    """Kernel fa2_varlen(q, k, v, o, L, cu_q, cu_k, scale, lo0, hi0, H, G, counters).

    q, o: (total_q, H, d); k, v: (total_k, H // G, d); L: (H, total_q) float32; cu_q,
    cu_k: int32 (batch + 1,); scale: float32; lo0, hi0: int64 band relative to o_b
    (read only when `banded`: causal or a window); counters: int64 (see _launch).
    Grid (max T_r_b, batch * H), `threads` threads. A block's work is fa2's
    (`gpu.forward.fa2.fa2_block`, packed indexing) on its sequence's rows."""
    block = fa2_block(B_r, B_c, d, dt, banded, False, count, threads, False, packed=True)
    U0 = np.uint64(0)

    def kernel(q, k, v, o, L, cu_q, cu_k, scale, lo0, hi0, H, G, counters):
        i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        h = z % H
        qoff, N, koff, N_k = sequence_rows(cu_q, cu_k, z // H)
        if i * B_r >= N:                                # i >= T_r_b: nothing to do
            return
        # the band of this sequence (o_b = N_k_b - N_q_b); L stands in for the unread mask
        block(q, k, v, o, L, i, h, h // G, qoff, koff, N, N_k, lo0 + (N_k - N),
              hi0 + (N_k - N), scale, L, counters, U0, U0, U0, U0, float32(0.0))

    name = kernel_name("fa2_varlen_fwd", Br=B_r, Bc=B_c, d=d, dt=dt, banded=banded,
                       count=count, t=threads)
    return kernel, name


def band_args_relative(causal: bool, window) -> tuple[bool, np.int64, np.int64]:
    """(banded, lo0, hi0): the compile-time flag (causal or a window) and the band relative
    to o_b = N_k_b - N_q_b (iosim.problem.band_of with o = 0; +-BIG for an unbounded
    side). ConfigError (a ValueError) for a bad window."""
    from iosim.problem import band_of
    lo, hi = band_of(0, 0, bool(causal), window)
    return ((lo, hi) != (None, None), np.int64(-BIG if lo is None else lo),
            np.int64(BIG if hi is None else hi))


def shared_bytes(B_r, B_c, d, dt) -> int:
    """Dynamic shared memory (bytes) = iosim's fa2 footprint."""
    return sram_footprint_bytes("fa2", B_r, B_c, d, dt)


def run(q3, k3, v3, o3, L2, cu_q, cu_k, scale, H, G, max_T_r, batch, counters, *, B_r, B_c,
        dt, causal, count, threads, window=(-1, -1)):
    """Launch on packed device arrays q3, o3 (total_q, H, d), k3, v3 (total_k, H // G, d),
    L2 (H, total_q); cu_q, cu_k int32 device arrays (batch + 1,); max_T_r = max_b T_r_b."""
    from .._launch import launch
    if max_T_r == 0:
        return                                          # every sequence has N_q_b = 0
    d = q3.shape[2]
    banded, lo0, hi0 = band_args_relative(causal, window)
    kern = fa2_varlen_kernel(B_r, B_c, d, dt, banded, count, threads)
    launch(kern, (max_T_r, batch * H), threads, shared_bytes(B_r, B_c, d, dt),
           q3, k3, v3, o3, L2, cu_q, cu_k, np.float32(scale), lo0, hi0, np.int64(H),
           np.int64(G), counters)


def signature(dt="fp32"):
    """Argument types of the kernel (for cuda.compile_ptx without a GPU: `flashsim check
    --ptx`)."""
    from numba.cuda import types as nb
    X = nb.Array(NB_DTYPE[dt], 3, "C")
    I32 = nb.Array(nb.int32, 1, "C")
    return ((X, X, X, X, nb.Array(nb.float32, 2, "C"), I32, I32, nb.float32) +
            (nb.int64,) * 4 + (nb.Array(nb.int64, 2, "C"),))
