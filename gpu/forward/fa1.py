"""FlashAttention (Algorithm 1 of Dao et al. 2022, as written): one thread block per
(batch, head) instance.

Schedule (iosim.schedules.fa1_forward is the same, on the host):
    step 2:  write O = 0 (N_q x d), l = 0 (N_q), m = -inf (N_q) to HBM.
    step 5:  for j in 0..T_c-1:  step 6: read K_j, V_j (always).
    step 7:    for i in 0..T_r-1, skipping inactive tiles (no traffic; outside the causal /
               window band of gpu.forward._band, or block-masked):
    step 8:      read Q_i, O_i, l_i, m_i;
    steps 9-11:  S = scale Q_i K_j^T; m~ = rowmax S; P~ = exp(S - m~); l~ = rowsum P~;
                 m_new = max(m_i, m~); l_new = e^{m_i - m_new} l_i + e^{m~ - m_new} l~;
    step 12:     O_i = diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j),
                 written in the problem dtype (normalised, as the paper stores it);
    step 13:     write l_i = l_new, m_i = m_new (float32).
On chip P~ is stored already multiplied by e^{m~ - m_new} / l_new, so the PV phase needs
no per-row coefficient (same arithmetic as step 12, one multiply moved).

Non-finite inputs: a row updates its statistics on every tile in which it sees a key
(decided from the band, not from m~), so a NaN or Inf score makes l and O NaN for
that row; a row that sees no key keeps O = 0, l = 0, m = -inf.

Numerics: because step 12 stores O_i in the problem dtype after every K/V block, fp16 O is
rounded T_c times, not once: measured on the H100 (d=64, 16 heads) rel. error 8.4e-4 at
N=1024 and 1.7e-3 at N=4096 against 2.8e-4 for PyTorch's fp16 SDPA, outside the
project's 2x criterion, where fa2 (one rounding) gives 2.1e-4. This is Algorithm 1 as
written; a float32 O in HBM would remove it at twice the O bytes (not modelled). bf16
(uint16 bits, `_launch.loader` / `storer`) rounds O as often, with 8 bits of mantissa.

Dropout (compile-time flag `dropout`; Algorithm 2 of the FlashAttention paper, which is
this algorithm with dropout): l~ sums P~ before dropout, and the P~ entering step 12's
P~ V_j is P~ o Z / (1 - p), Z the keep mask regenerated per entry by Philox (gpu._philox,
bit-identical to iosim.dropout.keep_mask; keyed by the instance z and the entry's row and
column in the full score matrix). No extra HBM traffic; l and m (so L = m + log l) are
those without dropout. Without `dropout` the kernel is the one it was before dropout
existed (same arguments, same code).

Shared memory: the same layout and size as fa2 (`iosim.sram_footprint_bytes('fa1', ...)`):
    float32: O_i (B_r*d) | S/P tile (B_r*B_c) | m_i (B_r) | l_i (B_r);
    input dtype: Q_i (B_r*d) | K_j (B_c*d) | V_j (B_c*d).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64

from iosim.tiling import sram_footprint_bytes

from .._launch import (NB_DTYPE, NEG_INF, NP_DTYPE, READ, WRITE, ZERO, T, add_count,
                      dummy_mask, kernel_name, loader, specialisation, storer)
from .. import _philox
from ._band import band_args, tile_in_band


@specialisation
def fa1_forward_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, window=False,
                       dropout=False):
    """Kernel fa1(q, k, v, o, l, m, scale, N, N_k, lo, hi, H, G, mask, counters), and in the
    dropout build (`dropout`) five more: key0, key1, offset, thr (uint64), rp (float32)
    (gpu._philox.kernel_args).

    q, o: (instances, N, d); k, v: (batch * H // G, N_k, d); l, m: (instances, N) float32
    in HBM; other arguments as fa2. Grid (instances,), `threads` threads.
    """
    banded = causal or window
    DT = NB_DTYPE[dt]
    ld, st = loader(dt), storer(dt)        # element -> float32, float32 -> element
    F32_ELEMS = B_r * d + B_r * B_c + 2 * B_r
    X0 = F32_ELEMS * 4 // NP_DTYPE[dt].itemsize
    S0, M0, L0 = B_r * d, B_r * d + B_r * B_c, B_r * d + B_r * B_c + B_r
    Q0, K0, V0 = X0, X0 + B_r * d, X0 + B_r * d + B_c * d
    IQ, IK, IV, IO, Il, Im = T["Q"], T["K"], T["V"], T["O"], T["l"], T["m"]

    def body(q, k, v, o, l_hbm, m_hbm, scale, N, N_k, lo, hi, H, G, mask, counters, key0,
             key1, offset, thr, rp):
        z = cuda.blockIdx.x
        t = cuda.threadIdx.x
        zk = (z // H) * (H // G) + (z % H) // G
        sf = cuda.shared.array(0, float32)
        sx = cuda.shared.array(0, DT)
        Os = sf[0:S0]
        S = sf[S0:M0]
        ms = sf[M0:L0]
        ls = sf[L0:L0 + B_r]
        Qs = sx[Q0:K0]
        Ks = sx[K0:V0]
        Vs = sx[V0:V0 + B_c * d]
        rQ = int64(0)
        rK = int64(0)
        rV = int64(0)
        rO = int64(0)
        rl = int64(0)
        rm = int64(0)
        wO = int64(0)
        wl = int64(0)
        wm = int64(0)

        # step 2: initialise O, l, m in HBM
        for e in range(t, N * d, threads):
            o[z, e // d, e % d] = st(ZERO)
            wO += 1
        for r in range(t, N, threads):
            l_hbm[z, r] = ZERO
            m_hbm[z, r] = NEG_INF
            wl += 1
            wm += 1
        T_r = (N + B_r - 1) // B_r
        T_c = (N_k + B_c - 1) // B_c
        for j in range(T_c):                               # step 5
            c0 = j * B_c
            cols = min(B_c, N_k - c0)
            cuda.syncthreads()                             # also orders step 2 / step 13
            for e in range(t, cols * d, threads):          # step 6
                Ks[e] = k[zk, c0 + e // d, e % d]
                Vs[e] = v[zk, c0 + e // d, e % d]
                rK += 1
                rV += 1
            for i in range(T_r):                           # step 7
                r0 = i * B_r
                rows = min(B_r, N - r0)
                if banded and not tile_in_band(r0, r0 + rows - 1, c0, c0 + cols - 1, lo, hi):
                    continue
                if has_mask and mask[i, j] == 0:
                    continue
                cuda.syncthreads()                         # K_j/V_j loaded; last O_i written
                for e in range(t, rows * d, threads):      # step 8
                    Qs[e] = q[z, r0 + e // d, e % d]
                    Os[e] = ld(o[z, r0 + e // d, e % d])
                    rQ += 1
                    rO += 1
                for r in range(t, rows, threads):
                    ls[r] = l_hbm[z, r0 + r]
                    ms[r] = m_hbm[z, r0 + r]
                    rl += 1
                    rm += 1
                cuda.syncthreads()
                for e in range(t, rows * cols, threads):   # step 9
                    r = e // cols
                    c = e % cols
                    s = ZERO
                    for x in range(d):
                        s += ld(Qs[r * d + x]) * ld(Ks[c * d + x])
                    s = s * scale
                    if banded and (c0 + c - r0 - r > hi or c0 + c - r0 - r < lo):
                        s = NEG_INF
                    S[r * B_c + c] = s
                cuda.syncthreads()
                for r in range(t, rows, threads):          # steps 10-11, one row per thread
                    m_t = NEG_INF
                    for c in range(cols):
                        m_t = max(m_t, S[r * B_c + c])
                    # the row sees a key of this tile (structurally: not from m~, which
                    # stays -inf when every score is NaN); then NaN scores propagate
                    if not banded or tile_in_band(r0 + r, r0 + r, c0, c0 + cols - 1, lo, hi):
                        l_t = ZERO
                        for c in range(cols):
                            p = math.exp(S[r * B_c + c] - m_t)
                            S[r * B_c + c] = p
                            l_t += p
                        m_i = ms[r]
                        m_new = max(m_i, m_t)
                        a = math.exp(m_i - m_new) * ls[r]   # e^{m_i - m_new} l_i
                        b = math.exp(m_t - m_new)
                        l_new = a + b * l_t
                        a = a / l_new                       # coefficient of old O_i
                        b = b / l_new                       # coefficient of P~ V_j
                        for c in range(cols):
                            if dropout:                 # P~ o Z / (1 - p), Z by Philox
                                if _philox.keep(key0, key1, offset, z, r0 + r, c0 + c, thr):
                                    S[r * B_c + c] *= b * rp
                                else:
                                    S[r * B_c + c] = ZERO
                            else:
                                S[r * B_c + c] *= b
                        for x in range(d):
                            Os[r * d + x] *= a
                        ls[r] = l_new
                        ms[r] = m_new
                    else:                                  # row sees nothing in this tile
                        for c in range(cols):
                            S[r * B_c + c] = ZERO
                cuda.syncthreads()
                for e in range(t, rows * d, threads):      # step 12 (with P~ V_j)
                    r = e // d
                    x = e % d
                    pv = ZERO
                    for c in range(cols):
                        pv += S[r * B_c + c] * ld(Vs[c * d + x])
                    o[z, r0 + r, x] = st(Os[e] + pv)
                    wO += 1
                for r in range(t, rows, threads):          # step 13
                    l_hbm[z, r0 + r] = ls[r]
                    m_hbm[z, r0 + r] = ms[r]
                    wl += 1
                    wm += 1
        if count:
            add_count(counters, IQ, READ, rQ)
            add_count(counters, IK, READ, rK)
            add_count(counters, IV, READ, rV)
            add_count(counters, IO, READ, rO)
            add_count(counters, Il, READ, rl)
            add_count(counters, Im, READ, rm)
            add_count(counters, IO, WRITE, wO)
            add_count(counters, Il, WRITE, wl)
            add_count(counters, Im, WRITE, wm)

    # the build without dropout: its own arguments only (gpu._philox.without_dropout)
    kernel = body if dropout else _philox.without_dropout(body)

    name = kernel_name("fa1_fwd", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal, window=window,
                       mask=has_mask, dropout=dropout,
                       count=count, t=threads)
    return kernel, name


def shared_bytes(B_r, B_c, d, dt) -> int:
    """Dynamic shared memory of the fa1 kernel (bytes) = iosim's footprint."""
    return sram_footprint_bytes("fa1", B_r, B_c, d, dt)


def run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask, counters, *, B_r, B_c, dt, causal,
        count, threads, N_k=None, window=(-1, -1), dropout=None):
    """Launch fa1 on 3-D device views q3, o3 (instances, N, d), k3, v3 (kv instances, N_k,
    d; N_k default N); writes o3, l2, m2. window=(left, right) as iosim.Problem.
    dropout: None, or (dropout_p, seed, offset) (iosim.dropout; p > 0 compiles the
    dropout build, p = 0 runs the kernel without dropout)."""
    from .._launch import launch
    d = q3.shape[2]
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    drop = bool(dropout and dropout[0] > 0)
    kern = fa1_forward_kernel(B_r, B_c, d, dt, causal, mask is not None, count, threads,
                              windowed, drop)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (q3.shape[0],), threads, shared_bytes(B_r, B_c, d, dt),
           q3, k3, v3, o3, l2, m2, np.float32(scale), np.int64(N), np.int64(N_k), lo, hi,
           np.int64(H), np.int64(G),
           mk, counters, *(_philox.kernel_args(*dropout) if drop else ()))

