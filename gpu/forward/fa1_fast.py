"""FlashAttention (Algorithm 1 as written), register-tiled on the CUDA cores (fp32 math): the
fast path for fp32 (fp16 inputs run too: fp32 math, O stored in fp16 after every key block
as Algorithm 1 writes it).

Same schedule, hence EXACTLY the same HBM traffic and ledger, as `gpu.forward.fa1` (and
`iosim.schedules.fa1_forward`): ONE thread block per (batch, head) instance runs the
whole loop, key blocks outer, query blocks inner:
    step 2:  write O = 0 (N_q x d), l = 0, m = -inf (N_q each, float32) to HBM;
    step 5:  for j in 0..T_c-1:  step 6: read K_j, V_j (always, active tiles or not);
    step 7:    for each active i (outside the causal / window band of gpu.forward._band:
               skip; block_mask False: skip; skipped tiles cost no traffic):
    step 8:      read Q_i, O_i, l_i, m_i;
    9-11:        S = scale Q_i K_j^T; m_new = max(m_i, rowmax S);
                 l_new = e^{m_i - m_new} l_i + rowsum e^{S - m_new};
    step 12:     O_i = (e^{m_i - m_new} l_i O_i + e^{S - m_new} V_j) / l_new;
    step 13:     write O_i, l_i = l_new, m_i = m_new.
As in gpu.forward.fa1_tc, e^{m~ - m_new} is folded into P (P = e^{S - m_new}). A row that
sees no key of tile (i, j) (decided from the band, not from the scores) keeps O_i, l_i,
m_i bit for bit (they are stored back as loaded); so a row that sees no key at all ends
with O = 0, l = 0, m = -inf, and a NaN or Inf score makes its l and O NaN (the plain
kernel's rules). Ragged N: only the valid rows / keys are loaded and stored (and
counted); the rest of a tile is zero-filled on chip.

FlashAttention-2's CUDA-core arithmetic (gpu.forward.fa2_fast), so that fa1 against fa2
measures the algorithm (its O, l, m round trips and one block per instance), not slower
arithmetic: S = Q_i K_j^T (`fa2_fast.register_qk`) and O_i += P V_j
(`fa2_fast.register_pv`) as register tiles with 16-byte shared loads, row max and row
sum by warp shuffles over the TC lanes of a row (`shfl`, hardware only) or through a
shared RED region (the simulator).

Thread layout (fa2_fast.plan): `threads` = TR x TC, thread t = (ty, tx) =
(t // TC, t % TC); with B_r = TR RM, B_c = TC RN, d = TC DN each thread owns
    S/P:  RM x RN entries, rows ty + TR a, key columns tx + TC b;
    O:    RM x DN entries, the same rows, head columns 4 tx + 4 TC g + w (g < DN / 4);
    its RM rows' m_i, l_i (read from shared memory per tile).
With BH instances there are only BH blocks, one per SM at BH <= 132: the block must
fill its SM by itself (`threads` 512 by default, hence at most 128 registers a thread).

Shared memory (float32 whatever the storage dtype; one dynamic buffer declared 16-byte
aligned; strides as fa2_fast's, so the 16-byte loads of a quarter warp hit distinct banks):
    Qs  B_r x QS   Q_i
    Os  B_r x QS   O_i: loaded coalesced, read by each thread for its entries, written
                   back by each thread, stored coalesced
    Ks  B_c x KS   K_j
    Vs  B_c x d    V_j
    Ps  B_r x PS   P
    ls, ms  B_r    l_i, m_i (loaded, then the new values to store)
    RED B_r x TC   partial row maxima / sums (only without warp shuffles)

Per active tile: sync; Q_i, O_i, l_i, m_i -> shared (coalesced); sync; S in registers;
scale, mask; row max; P = e^{S - m_new} -> Ps, row sums; O_i's entries from Os into
registers times e^{m_i - m_new} l_i; sync; += P V_j; times 1 / l_new back into Os, l_new,
m_new into ls, ms; sync; O_i, l_i, m_i -> HBM (coalesced).

Registers (ptxas -v for sm_90 on the PTX built without a GPU; the 512-thread default
runs with maxreg=128, gpu.api.other_fast_options): d = 64, 128 x 128, 512 threads: 128,
no spills (the causal, masked, counting build wants 168 uncapped); d = 128, 64 x 64, 256
threads: 165. Untimed on a GPU at the time of writing: scripts/fp32_fast_gpu.sh.

Dropout (compile-time flag `dropout`, as gpu.forward.fa1 and fa2_fast): the row sums l~
take P~ before dropout; the P stored for P V_j is P Z / (1 - p), Z regenerated per entry
by Philox (gpu._philox). No extra HBM traffic. Without `dropout` the kernel is the one it
was before dropout existed (same arguments, same code).

Counting (count=True, compile-time): per-thread element counts, one atomic add per tensor
and direction at the end (gpu._launch counters), as the plain kernel counts.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64, uint64

from .._launch import (NEG_INF, ONE, READ, SIM, WRITE, ZERO, T, add_count, dummy_mask,
                       jit_options, kernel_name, lane_group_reducer, launch, specialisation)
from .. import _philox
from ._band import band_args, tile_in_band
from .fa2_fast import (ALIGN, IMASK, W, pair_row_loader, pair_tile_loader, plan,
                       register_pv, register_qk, score_row_max, tile_storer)

# the launch geometry (which tilings run, threads, shared-memory layout): iosim.launch
from iosim.launch.forward import fa1_fast as _geometry
from iosim.launch.forward.fa1_fast import layout, plan_error, smem_bytes

DTYPES = _geometry.DTYPES


def supports(B_r, B_c, d, threads, dt="fp32", shfl=False, smem_limit=None) -> bool:
    """True if this kernel runs the configuration within the per-block shared memory."""
    if plan_error(B_r, B_c, d, threads, dt) is not None or (shfl and SIM):
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return smem_bytes(B_r, B_c, d, threads, shfl) <= smem_limit


@specialisation
def fa1_fast_kernel(B_r, B_c, d, dt, causal, window, has_mask, count, threads, shfl,
                    maxreg=0, dropout=False):
    """Kernel(q, k, v, o, l, m, scale, N, N_k, lo, hi, H, G, mask, counters): the arguments
    of gpu.forward.fa1's kernel (the dropout build, `dropout`: five more, key0, key1,
    offset, thr, rp, gpu._philox.kernel_args). Grid (instances,), `threads` threads,
    `smem_bytes(...)` dynamic shared bytes. maxreg > 0 caps registers per thread
    (hardware only)."""
    TR, TC, RM, RN, DN = plan(B_r, B_c, d, threads)
    lay = layout(B_r, B_c, d, TC, shfl)
    QS, KS, PS = lay["QS"], lay["KS"], lay["PS"]
    QO, OO, KO, VO, PO = lay["QO"], lay["OO"], lay["KO"], lay["VO"], lay["PO"]
    LO, MO, RO = lay["LO"], lay["MO"], lay["RO"]
    THREADS = threads
    banded = causal or window
    DG = DN // W
    QN = B_r * d
    IQ, IK, IV, IO, Il, Im = T["Q"], T["K"], T["V"], T["O"], T["l"], T["m"]
    if shfl:
        assert TC <= 32 and TC & (TC - 1) == 0, "shfl needs TC a power of two <= 32"
    row_sum = lane_group_reducer(TC, "sum") if shfl else None
    qk_product = register_qk(RM, RN, TR, TC, QS, KS, d)
    masked_row_max = score_row_max(RM, RN, TR, TC, RO, banded, shfl)
    pv_product = register_pv(RM, DN, TR, TC, PS, d, B_c)
    load_kv = pair_tile_loader(B_c, d, THREADS, KO, KS, VO, d, count)
    load_lm = pair_row_loader(B_r, THREADS, LO, MO, NEG_INF, count)
    store_o = tile_storer(d, THREADS, OO, QS, count)

    def body(q, k, v, o, l_hbm, m_hbm, scale, N, N_k, lo, hi, H, G, mask, counters, key0,
             key1, offset, thr, rp):
        z = cuda.blockIdx.x
        t = cuda.threadIdx.x
        tx = t % TC
        ty = t // TC
        zk = (z // H) * (H // G) + (z % H) // G
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        s_acc = cuda.local.array((RM, RN), float32)
        o_acc = cuda.local.array((RM, DN), float32)
        qv = cuda.local.array(W, float32)
        kv = cuda.local.array((RN, W), float32)
        pv = cuda.local.array((RM, W), float32)
        vv = cuda.local.array(DN, float32)
        mx_r = cuda.local.array(RM, float32)
        ls_r = cuda.local.array(RM, float32)
        mi_r = cuda.local.array(RM, float32)            # this tile's m_i, l_i of its rows
        li_r = cuda.local.array(RM, float32)
        rQ = int64(0)
        rK = int64(0)
        rO = int64(0)
        rl = int64(0)
        wO = int64(0)
        wl = int64(0)
        qbase = (QO + ty * QS) & IMASK
        obase = (OO + ty * QS) & IMASK
        kbase = (KO + tx * KS) & IMASK
        pbase = (PO + ty * PS) & IMASK
        col4 = (W * tx) & IMASK

        # step 2: initialise O, l, m in HBM
        for e in range(t, N * d, THREADS):
            o[z, e // d, e % d] = ZERO
            if count:
                wO += 1
        for r in range(t, N, THREADS):
            l_hbm[z, r] = ZERO
            m_hbm[z, r] = NEG_INF
            if count:
                wl += 1
        T_r = (N + B_r - 1) // B_r
        T_c = (N_k + B_c - 1) // B_c
        for j in range(T_c):                                # step 5
            c0 = j * B_c
            cols = min(B_c, N_k - c0)
            cuda.syncthreads()                              # last tile done with Ks, Vs
            rK = load_kv(k, v, zk, c0, cols, t, sm, rK)    # step 6: K_j, V_j -> shared
            for i in range(T_r):                            # step 7
                r0 = i * B_r
                rows = min(B_r, N - r0)
                last = r0 + rows - 1
                if banded and not tile_in_band(r0, last, c0, c0 + cols - 1, lo, hi):
                    continue
                if has_mask and mask[i, j] == 0:
                    continue
                cuda.syncthreads()      # K_j, V_j in; last tile's O_i, l_i, m_i stored
                for e in range(t, QN, THREADS):             # step 8
                    r = e // d
                    x = e % d
                    qx = ZERO
                    ox = ZERO
                    if r < rows:
                        qx = float32(q[z, r0 + r, x])
                        ox = float32(o[z, r0 + r, x])
                        if count:
                            rQ += 1
                    sm[QO + r * QS + x] = qx
                    sm[OO + r * QS + x] = ox
                rl = load_lm(l_hbm, m_hbm, z, r0, rows, t, sm, rl)
                cuda.syncthreads()
                # ---- steps 9-11: S = scale Q_i K_j^T, masked; row max ----
                qk_product(sm, qbase, kbase, s_acc, qv, kv)
                masked_row_max(sm, s_acc, mx_r, scale, cols, c0, r0, lo, hi, tx, ty)
                # ---- P = e^{S - m_new} -> Ps; partial row sums ----
                for a in range(RM):
                    r = ty + TR * a
                    sees = r < rows
                    if banded:
                        sees = sees and tile_in_band(r0 + r, r0 + r, c0, c0 + cols - 1, lo, hi)
                    m_i = sm[MO + r]
                    mi_r[a] = m_i
                    li_r[a] = sm[LO + r]
                    m_new = max(m_i, mx_r[a])
                    m_safe = m_new if m_new > NEG_INF else ZERO
                    ps = ZERO
                    # dropout: this thread's Z entries of the row as bits first (the
                    # register-tile loop below stays free of Philox and unrolls)
                    zb = _philox.U64_0
                    if dropout:
                        zb = _philox.row_bits(key0, key1, offset, z, r0 + r, c0 + tx, TC, RN,
                                              thr)
                    for b in range(RN):
                        p = ZERO
                        if sees:
                            p = math.exp(s_acc[a, b] - m_safe)
                        ps += p                         # l~: P~ before dropout
                        if dropout:                     # P~ o Z / (1 - p), Z by Philox
                            if (zb >> uint64(b)) & _philox.U64_1:
                                p = p * rp
                            else:
                                p = ZERO
                        sm[pbase + a * TR * PS + tx + TC * b] = p
                    ls_r[a] = ps
                    mx_r[a] = m_new
                if shfl:
                    for a in range(RM):
                        ls_r[a] = row_sum(ls_r[a])
                else:
                    cuda.syncthreads()                      # all done reading RED maxima
                    for a in range(RM):
                        sm[RO + (ty + TR * a) * TC + tx] = ls_r[a]
                    cuda.syncthreads()
                    for a in range(RM):
                        r = ty + TR * a
                        ps = ZERO
                        for u in range(TC):
                            ps += sm[RO + r * TC + u]
                        ls_r[a] = ps
                # ---- old O_i's entries into registers, times e^{m_i - m_new} l_i ----
                for a in range(RM):
                    r = ty + TR * a
                    sees = r < rows
                    if banded:
                        sees = sees and tile_in_band(r0 + r, r0 + r, c0, c0 + cols - 1, lo, hi)
                    coef = ONE
                    if sees:
                        coef = math.exp(mi_r[a] - mx_r[a]) * li_r[a]
                        if li_r[a] == ZERO:
                            coef = ZERO    # nothing seen yet: O_i = 0 (also e^{-inf+inf})
                    for g in range(DG):
                        for w in range(W):
                            o_acc[a, g * W + w] = coef * sm[obase + a * TR * QS + col4
                                                            + g * W * TC + w]
                cuda.syncthreads()                          # Ps complete
                # ---- step 12: O_i += P V_j, times 1 / l_new ----
                pv_product(sm, pbase, VO, col4, o_acc, pv, vv)
                for a in range(RM):     # (Os entries are this thread's own; ls, ms were
                    r = ty + TR * a     # read into registers before the last barrier)
                    sees = r < rows
                    if banded:
                        sees = sees and tile_in_band(r0 + r, r0 + r, c0, c0 + cols - 1, lo, hi)
                    if sees:
                        l_i = li_r[a]
                        alpha = math.exp(mi_r[a] - mx_r[a]) if l_i != ZERO else ZERO
                        l_new = alpha * l_i + ls_r[a]
                        inv = ONE / l_new
                        for g in range(DG):
                            for w in range(W):
                                sm[obase + a * TR * QS + col4 + g * W * TC + w] = \
                                    o_acc[a, g * W + w] * inv
                        if tx == 0:
                            sm[LO + r] = l_new
                            sm[MO + r] = mx_r[a]
                cuda.syncthreads()
                # ---- step 13: O_i, l_i, m_i -> HBM (coalesced) ----
                wO = store_o(o, z, r0, rows, t, sm, wO)
                for r in range(t, rows, THREADS):
                    l_hbm[z, r0 + r] = sm[LO + r]
                    m_hbm[z, r0 + r] = sm[MO + r]
                    if count:
                        wl += 1
        if count:
            add_count(counters, IQ, READ, rQ)
            add_count(counters, IK, READ, rK)
            add_count(counters, IV, READ, rK)
            add_count(counters, IO, READ, rQ)
            add_count(counters, Il, READ, rl)
            add_count(counters, Im, READ, rl)
            add_count(counters, IO, WRITE, wO)
            add_count(counters, Il, WRITE, wl)
            add_count(counters, Im, WRITE, wl)

    # the build without dropout: its own arguments only (gpu._philox.without_dropout)
    kernel = body if dropout else _philox.without_dropout(body)

    name = kernel_name("fa1_fast", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal, window=window,
                       mask=has_mask, dropout=dropout, count=count, t=threads, tc=TC,
                       shfl=shfl, maxreg=maxreg or False)
    return kernel, name, jit_options(maxreg)


def run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask, counters, *, B_r, B_c, dt, causal,
        count, threads, N_k=None, window=(-1, -1), shfl=None, maxreg=0, dropout=None):
    """Launch on 3-D device views q3, o3 (instances, N, d), k3, v3 (kv instances, N_k, d;
    N_k default N); writes o3, l2, m2. The arguments of gpu.forward.fa1.run (dropout:
    None or (dropout_p, seed, offset); p > 0 compiles the dropout build) plus the
    tuning knobs shfl (default: on hardware) and maxreg (register cap, 0 = none)."""
    d = q3.shape[2]
    err = plan_error(B_r, B_c, d, threads, dt)
    if err:
        raise ValueError(f"fa1_fast: {err}")
    shfl = (not SIM) if shfl is None else bool(shfl)
    if SIM:
        maxreg = 0
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    drop = bool(dropout and dropout[0] > 0)
    kern = fa1_fast_kernel(int(B_r), int(B_c), int(d), dt, bool(causal), bool(windowed),
                           mask is not None, bool(count), int(threads), shfl, int(maxreg),
                           drop)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (q3.shape[0],), threads, smem_bytes(B_r, B_c, d, threads, shfl),
           q3, k3, v3, o3, l2, m2, np.float32(scale), np.int64(N), np.int64(N_k), lo, hi,
           np.int64(H), np.int64(G), mk, counters,
           *(_philox.kernel_args(*dropout) if drop else ()))


def signature(dt="fp32", dropout=False):
    """Argument types of the kernel (for cuda.compile_ptx without a GPU; dropout: the
    dropout build's, five more)."""
    from numba.cuda import types as nb
    from .._launch import NB_DTYPE
    X = nb.Array(NB_DTYPE[dt], 3, "C")
    F2 = nb.Array(nb.float32, 2, "C")
    drop = (nb.uint64,) * 4 + (nb.float32,) if dropout else ()
    return ((X, X, X, X, F2, F2, nb.float32) + (nb.int64,) * 6 +
            (nb.Array(nb.uint8, 2, "C"), nb.Array(nb.int64, 2, "C")) + drop)


__all__ = ["layout", "plan_error", "smem_bytes", "supports", "fa1_fast_kernel", "run",
           "signature"]
