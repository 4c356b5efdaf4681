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

A separate kernel rather than a flag of gpu.forward.fa2: its indexing (packed rows, a
head axis in the middle) and its arguments differ, and the plain kernel's signature,
which gpu.api's recorded launch plans hold, stays as it is. Shared memory and the three
phases per tile are fa2's (`iosim.sram_footprint_bytes('fa2', ...)` bytes).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64

from iosim.tiling import sram_footprint_bytes

from .._launch import (NAN, NB_DTYPE, NEG_INF, NP_DTYPE, READ, WRITE, ZERO, T, add_count,
                      kernel_name, specialisation)
from ._band import BIG, sees_key_band, tile_in_band


@specialisation
def fa2_varlen_kernel(B_r, B_c, d, dt, banded, count, threads):
    """Kernel fa2_varlen(q, k, v, o, L, cu_q, cu_k, scale, lo0, hi0, H, G, counters).

    q, o: (total_q, H, d); k, v: (total_k, H // G, d); L: (H, total_q) float32; cu_q,
    cu_k: int32 (batch + 1,); scale: float32; lo0, hi0: int64 band relative to o_b
    (read only when `banded`: causal or a window); counters: int64 (see _launch).
    Grid (max T_r_b, batch * H), `threads` threads."""
    DT = NB_DTYPE[dt]
    F32_ELEMS = B_r * d + B_r * B_c + 2 * B_r
    X0 = F32_ELEMS * 4 // NP_DTYPE[dt].itemsize
    S0, M0, L0 = B_r * d, B_r * d + B_r * B_c, B_r * d + B_r * B_c + B_r
    Q0, K0, V0 = X0, X0 + B_r * d, X0 + B_r * d + B_c * d
    IQ, IK, IV, IO, IL = T["Q"], T["K"], T["V"], T["O"], T["L"]

    def kernel(q, k, v, o, L, cu_q, cu_k, scale, lo0, hi0, H, G, counters):
        i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        b = z // H
        h = z % H
        hk = h // G                                     # this head's K/V head
        qoff = int64(cu_q[b])
        N = int64(cu_q[b + 1]) - qoff                   # N_q_b
        koff = int64(cu_k[b])
        N_k = int64(cu_k[b + 1]) - koff                 # N_k_b
        r0 = i * B_r
        if r0 >= N:                                     # i >= T_r_b: nothing to do
            return
        lo = lo0 + (N_k - N)
        hi = hi0 + (N_k - N)
        sf = cuda.shared.array(0, float32)
        sx = cuda.shared.array(0, DT)
        acc = sf[0:S0]
        S = sf[S0:M0]
        m = sf[M0:L0]
        l = sf[L0:L0 + B_r]
        Qs = sx[Q0:K0]
        Ks = sx[K0:V0]
        Vs = sx[V0:V0 + B_c * d]
        nQ = int64(0)
        nK = int64(0)
        nV = int64(0)
        nO = int64(0)
        nL = int64(0)

        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        for e in range(t, rows * d, threads):           # load Q_i (valid rows only)
            Qs[e] = q[qoff + r0 + e // d, h, e % d]
            nQ += 1
        for e in range(t, B_r * d, threads):
            acc[e] = ZERO
        for r in range(t, B_r, threads):
            m[r] = NEG_INF
            l[r] = ZERO
        T_c = (N_k + B_c - 1) // B_c
        for j in range(T_c):
            c0 = j * B_c
            if banded and c0 - last > hi:               # this and later tiles inactive
                break
            cols = min(B_c, N_k - c0)
            if banded and not tile_in_band(r0, last, c0, c0 + cols - 1, lo, hi):
                continue
            cuda.syncthreads()                          # previous tile done with K, V, S
            for e in range(t, cols * d, threads):
                Ks[e] = k[koff + c0 + e // d, hk, e % d]
                Vs[e] = v[koff + c0 + e // d, hk, e % d]
                nK += 1
                nV += 1
            cuda.syncthreads()
            # A: scores
            for e in range(t, rows * cols, threads):
                r = e // cols
                c = e % cols
                s = ZERO
                for x in range(d):
                    s += float32(Qs[r * d + x]) * float32(Ks[c * d + x])
                s = s * scale
                if banded and (c0 + c - r0 - r > hi or c0 + c - r0 - r < lo):
                    s = NEG_INF
                S[r * B_c + c] = s
            cuda.syncthreads()
            # B: online softmax statistics, one thread per row
            for r in range(t, rows, threads):
                m_old = m[r]
                m_new = m_old
                for c in range(cols):
                    m_new = max(m_new, S[r * B_c + c])
                m_safe = m_new if m_new > NEG_INF else ZERO
                alpha = math.exp(m_old - m_safe)
                rowsum = ZERO
                for c in range(cols):
                    p = math.exp(S[r * B_c + c] - m_safe)
                    rowsum += p
                    S[r * B_c + c] = p
                l[r] = alpha * l[r] + rowsum
                m[r] = m_new
                for x in range(d):
                    acc[r * d + x] *= alpha
            cuda.syncthreads()
            # C: acc += P V_j
            for e in range(t, rows * d, threads):
                r = e // d
                x = e % d
                pv = ZERO
                for c in range(cols):
                    pv += S[r * B_c + c] * float32(Vs[c * d + x])
                acc[e] += pv
        cuda.syncthreads()
        # O_i = acc / l, L_i = m + log l; a row that sees no key: O = 0, L = -inf (decided
        # from the band, never from l, which is NaN after a NaN input)
        for e in range(t, rows * d, threads):
            li = l[e // d]
            if li > ZERO:
                val = acc[e] / li
            elif sees_key_band(L, i, r0 + e // d, B_c, N_k, lo, hi, banded, False):
                val = NAN
            else:
                val = ZERO
            o[qoff + r0 + e // d, h, e % d] = val
            nO += 1
        for r in range(t, rows, threads):
            li = l[r]
            if li > ZERO:
                Lr = m[r] + math.log(li)
            elif sees_key_band(L, i, r0 + r, B_c, N_k, lo, hi, banded, False):
                Lr = NAN
            else:
                Lr = NEG_INF
            L[h, qoff + r0 + r] = Lr
            nL += 1
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nV)
            add_count(counters, IO, WRITE, nO)
            add_count(counters, IL, WRITE, nL)

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
