"""FlashAttention-2 backward on packed variable-length batches (flash-attn's varlen layout).

The launches of the plain fa2 backward (gpu.backward.flash), on packed tensors: q, o, do,
dq (total_q, H, d), k, v (total_k, H / G, d), L and D (H, total_q) float32, the dQ
accumulator dQacc (total_q, H, d) float32, dK, dV per query head (total_k, H, d):
  1. `flash.fa2_pre_kernel(..., packed=True)` over all total_q rows at once (grid
     (ceil(total_q / B_r), H)): D = rowsum(dO o O), dQacc = 0. Row-local, so its counts
     (total_q d reads of O and dO, total_q writes of D, total_q d of dQacc, per head) are
     the sum of the per-sequence pre-passes.
  2. this module's `fa2_varlen_bwd`, grid (max_b T_c_b, batch * H): block (j, z) is key
     block j of sequence b = z // H, query head h = z % H; it reads its sequence's row
     offsets and lengths from cu_seqlens_q, cu_seqlens_k (int32, on the device) and a
     block with j >= T_c_b = ceil(N_k_b / B_c) exits at once (no loads, no counts). Its
     work is the plain main kernel's block body, `flash.bwd_block(..., packed=True)` with
     row offsets qoff, koff, on the sequence's band (bottom-right, o_b = N_k_b - N_q_b:
     lo = lo0 + o_b, hi = hi0 + o_b, as gpu.forward.fa2_varlen). A sequence with
     N_q_b = 0 < N_k_b reads K_j, V_j and writes dK_j = dV_j = 0 (no query block).
  3. `flash.convert_kernel` on the flat packed dQacc -> dQ.
  4. grouped heads (H / G < H): `flash.group_sum_kernel` on the flat views dK_h
     (total_k H, d) -> dK (total_k H / G, d): row (c, h) of dK_h is instance c H + h =
     (c H/G + h // G) G + h % G, the group sum's indexing.
Tiles never straddle two sequences, so the counts are the sum of the per-sequence
backward ledgers (iosim.varlen_backward_closed_form). Shared memory: `bwd_shared_bytes`.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from .._launch import NB_DTYPE, kernel_name, launch, specialisation
from ..forward.fa2_varlen import band_args_relative, sequence_rows
from .flash import bwd_block, bwd_shared_bytes


@specialisation
def fa2_varlen_bwd_kernel(B_r, B_c, d, dt, banded, count, threads):
    """Kernel fa2_varlen_bwd(q, k, v, o, do, L, D, dqacc, dk, dv, cu_q, cu_k, scale, lo0,
    hi0, H, G, counters): packed arrays as the module docstring; lo0, hi0: int64 band
    relative to o_b (read only when `banded`); grid (max T_c_b, batch * H)."""
    block = bwd_block("fa2", B_r, B_c, d, dt, banded, False, count, threads, False,
                      packed=True)
    U0 = np.uint64(0)

    def kernel(q, k, v, o, do, L, D, dqacc, dk, dv, cu_q, cu_k, scale, lo0, hi0, H, G,
               counters):
        j = cuda.blockIdx.x
        z = cuda.blockIdx.y
        h = z % H
        qoff, N, koff, N_k = sequence_rows(cu_q, cu_k, z // H)
        if j * B_c >= N_k:                              # j >= T_c_b: nothing to do
            return
        # L stands in for the unread block mask
        block(q, k, v, o, do, L, L, D, dqacc, dk, dv, scale, N, N_k, lo0 + (N_k - N),
              hi0 + (N_k - N), h, h // G, qoff, koff, j, j + 1, L, counters, U0, U0, U0, U0,
              float32(0.0))

    name = kernel_name("fa2_varlen_bwd_main", Br=B_r, Bc=B_c, d=d, dt=dt, banded=banded,
                       count=count, t=threads)
    return kernel, name


def run_main(q3, k3, v3, o3, do3, L2, D2, acc3, dk3, dv3, cu_q, cu_k, scale, H, G, max_T_c,
             batch, counters, *, B_r, B_c, dt, causal, count, threads, window=(-1, -1)):
    """Launch the main kernel (launch 2) on packed device arrays; max_T_c = max_b T_c_b."""
    if max_T_c == 0:
        return                                          # every sequence has N_k_b = 0
    d = q3.shape[2]
    banded, lo0, hi0 = band_args_relative(causal, window)
    kern = fa2_varlen_bwd_kernel(B_r, B_c, d, dt, banded, count, threads)
    launch(kern, (max_T_c, batch * H), threads, bwd_shared_bytes(B_r, B_c, d, dt),
           q3, k3, v3, o3, do3, L2, D2, acc3, dk3, dv3, cu_q, cu_k, np.float32(scale), lo0,
           hi0, np.int64(H), np.int64(G), counters)


def signature(dt="fp32"):
    """Argument types of the main kernel (for cuda.compile_ptx without a GPU)."""
    from numba.cuda import types as nb
    X = nb.Array(NB_DTYPE[dt], 3, "C")
    F2 = nb.Array(nb.float32, 2, "C")
    F3 = nb.Array(nb.float32, 3, "C")
    I32 = nb.Array(nb.int32, 1, "C")
    return ((X, X, X, X, X, F2, F2, F3, X, X, I32, I32, nb.float32) + (nb.int64,) * 4 +
            (nb.Array(nb.int64, 2, "C"),))
