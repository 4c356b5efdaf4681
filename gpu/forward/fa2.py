"""FlashAttention-2 forward: one thread block per (query block i, instance).

Schedule (iosim.schedules.fa2_forward is the same, on the host):
    read Q_i once; for each active key block j: read K_j, V_j, update the running
    row max m, row sum l and the unnormalised O_i accumulator (all float32, on chip);
    finally write O_i = acc / l and L_i = m + log(l) once.
N_q query rows (N) against N_k key rows; causal and local windows are the band
lo <= c - r <= hi of gpu.forward._band (bottom-right aligned, iosim.problem.band_of):
tiles outside it are skipped (no traffic), partly visible ones masked on chip.
A row that sees no key at all (under a block mask, a window, or causal with N_q > N_k)
gets O = 0, L = -inf; a row
that sees a key and meets a NaN or Inf (in q, k, v) gets NaN, never a finite number:
"sees no key" is decided from the mask (`sees_key`), not from l, which is then NaN.

Shared memory (one dynamic buffer, `iosim.sram_footprint_bytes('fa2', ...)` bytes):
    float32:      O_i acc (B_r*d) | S/P tile (B_r*B_c) | m_i (B_r) | l_i (B_r)
    input dtype:  Q_i (B_r*d) | K_j (B_c*d) | V_j (B_c*d)
Per tile three phases, each over all threads of the block:
    A  S[r, c] = scale * Q_i[r] . K_j[c]  (entries outside the band -inf), entries strided
    B  per row: m_new = max(m, rowmax S); P = exp(S - m_new) in place; l = alpha l + sum P;
       acc[r] *= alpha, alpha = exp(m - m_new)
    C  acc[r, x] += sum_c P[r, c] V_j[c, x], entries strided.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64

from iosim.tiling import sram_footprint_bytes

from .._launch import (NAN, NB_DTYPE, NEG_INF, NP_DTYPE, READ, WRITE, ZERO, T, add_count,
                      dummy_mask, kernel_name, specialisation)
from ._band import band_args, sees_key_band, tile_in_band


@specialisation
def fa2_forward_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, window=False):
    """Kernel fa2(q, k, v, o, L, scale, N, N_k, lo, hi, H, G, mask, counters).

    q, o: (instances, N, d); k, v: (batch * H // G, N_k, d); L: (instances, N) float32;
    scale: float32; N: query rows N_q; N_k: key rows; lo, hi: int64 band (row r sees key
    c iff lo <= c - r <= hi; read only when causal or window, the compile-time flags of
    gpu.forward._band); H: query heads; G: query heads per K/V head;
    mask: uint8 (T_r, T_c) (read only when has_mask); counters: int64 (see _launch).
    Grid (T_r, instances), `threads` threads.
    """
    DT = NB_DTYPE[dt]
    F32_ELEMS = B_r * d + B_r * B_c + 2 * B_r
    X0 = F32_ELEMS * 4 // NP_DTYPE[dt].itemsize   # first input-dtype element
    S0, M0, L0 = B_r * d, B_r * d + B_r * B_c, B_r * d + B_r * B_c + B_r
    Q0, K0, V0 = X0, X0 + B_r * d, X0 + B_r * d + B_c * d
    IQ, IK, IV, IO, IL = T["Q"], T["K"], T["V"], T["O"], T["L"]

    banded = causal or window

    def kernel(q, k, v, o, L, scale, N, N_k, lo, hi, H, G, mask, counters):
        i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        zk = (z // H) * (H // G) + (z % H) // G        # this head's K/V instance
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

        r0 = i * B_r
        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        for e in range(t, rows * d, threads):           # load Q_i (valid rows only)
            Qs[e] = q[z, r0 + e // d, e % d]
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
            if has_mask and mask[i, j] == 0:
                continue
            cuda.syncthreads()                          # previous tile done with K, V, S
            for e in range(t, cols * d, threads):
                Ks[e] = k[zk, c0 + e // d, e % d]
                Vs[e] = v[zk, c0 + e // d, e % d]
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
                # m_safe: exp(S - m_safe) is 0 for masked entries (-inf) while nothing was
                # visible, and stays NaN for a NaN score (max() may skip a NaN)
                m_safe = m_new if m_new > NEG_INF else ZERO
                alpha = math.exp(m_old - m_safe)        # exp(-inf) = 0 on the first tile
                rowsum = ZERO
                for c in range(cols):
                    p = math.exp(S[r * B_c + c] - m_safe)
                    S[r * B_c + c] = p
                    rowsum += p
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
        # write O_i = acc / l and L_i = m + log l; l > 0 fails for l = NaN (a NaN or Inf
        # input) as well as for l = 0, so a row that sees a key gets NaN there, and only a
        # row that sees no key gets O = 0, L = -inf
        for e in range(t, rows * d, threads):
            li = l[e // d]
            if li > ZERO:
                val = acc[e] / li
            elif sees_key_band(mask, i, r0 + e // d, B_c, N_k, lo, hi, banded, has_mask):
                val = NAN
            else:
                val = ZERO
            o[z, r0 + e // d, e % d] = val
            nO += 1
        for r in range(t, rows, threads):
            li = l[r]
            if li > ZERO:
                Lr = m[r] + math.log(li)
            elif sees_key_band(mask, i, r0 + r, B_c, N_k, lo, hi, banded, has_mask):
                Lr = NAN
            else:
                Lr = NEG_INF
            L[z, r0 + r] = Lr
            nL += 1
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nV)
            add_count(counters, IO, WRITE, nO)
            add_count(counters, IL, WRITE, nL)

    name = kernel_name("fa2_fwd", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal, window=window,
                       mask=has_mask,
                       count=count, t=threads)
    return kernel, name


def shared_bytes(B_r, B_c, d, dt) -> int:
    """Dynamic shared memory of the fa2 kernel (bytes) = iosim's footprint."""
    return sram_footprint_bytes("fa2", B_r, B_c, d, dt)


def run(q3, k3, v3, o3, L2, scale, N, H, G, mask, counters, *, B_r, B_c, dt, causal,
        count, threads, N_k=None, window=(-1, -1)):
    """Launch fa2 on 3-D device views q3, o3 (instances, N, d), k3, v3 (kv instances,
    N_k, d; N_k default N); writes o3 and L2. window=(left, right) as iosim.Problem."""
    from .._launch import launch
    d = q3.shape[2]
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    kern = fa2_forward_kernel(B_r, B_c, d, dt, causal, mask is not None, count, threads,
                              windowed)
    T_r = -(-N // B_r)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (T_r, q3.shape[0]), threads, shared_bytes(B_r, B_c, d, dt),
           q3, k3, v3, o3, L2, np.float32(scale), np.int64(N), np.int64(N_k), lo, hi,
           np.int64(H), np.int64(G),
           mk, counters)

