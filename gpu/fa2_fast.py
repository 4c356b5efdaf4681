"""FlashAttention-2 forward, register-tiled on the CUDA cores (fp32 math): the fast path.

Same schedule, hence the same HBM traffic, as `gpu.fa2` and `iosim.schedules.fa2_forward`:
one thread block per (query block i, instance); read Q_i once; for each active key block
j (causal: skip j B_c > last row of block i; block_mask[i, j] False: skip) read K_j and
V_j once; online softmax with float32 running max m and sum l; write O_i and
L_i = m + log(l) once (a row with no visible key: O = 0, L = -inf). Ragged N: only the
valid rows are loaded / stored (and counted); the rest of a tile is zero-filled on chip.

Thread layout. `threads` = TR x TC threads, thread t = (ty, tx) = (t // TC, t % TC), so
the TC threads that share a query row are consecutive lanes of one warp. With
B_r = TR * RM and B_c = TC * RN each thread owns, in registers,
    S/P:  RM x RN entries, rows ty + TR a (a < RM), key columns tx + TC b (b < RN),
    O:    RM x DN accumulators, the same rows, head columns tx + TC b (b < DN = d / TC),
    m, l: its RM rows' running max and its own partial row sum (l is summed over the TC
          threads of a row only at the end: all of them rescale by the same alpha).
All register tiles are `cuda.local.array`s indexed by unrolled compile-time loops.

Shared memory (float32 whatever the storage dtype; one dynamic buffer, `smem_bytes`):
    Qt   d x (B_r + 1)   Q_i transposed (padded: the transposing stores are conflict-free)
    KP   K_j^T, d x (B_c + 1), then (after S is in registers) P, B_r x PS, in the same
         bytes; PS = B_c rounded up to 16 (mod 32) so the P stores are conflict-free
         (the shfl variant keeps P in its own region instead, see below)
    Vs   B_c x d
    RED  B_r x TC        partial row maxima (and the final partial row sums)
Every inner-loop shared read is a broadcast (Q, P: the same word for a row's TC lanes)
or TC consecutive words (K, V): no bank conflicts. Global loads and stores are
coalesced: consecutive threads touch consecutive elements of a row of Q, K, V or O.
This footprint is NOT iosim.sram_footprint_bytes('fa2', ...): O and S live in
registers here; see `smem_bytes` (e.g. B_r = B_c = 64, d = 64: 57,600 bytes).

Per key tile: sync; load K_j (transposed), V_j; sync; S = Q_i K_j^T in registers
(d steps of RM + RN shared loads and RM x RN FMAs); scale, mask; partial row max -> RED;
sync; row max from RED (TC reads per row); P = exp(S - m_new), alpha = exp(m - m_new),
l = alpha l + rowsum, O *= alpha; P -> KP; sync; O += P V_j (B_c steps of RM + DN
shared loads and RM x DN FMAs).
`shfl=True` (hardware only: the simulator has no warp shuffles) reduces the row max with
`cuda.shfl_xor_sync` over the TC lanes of a row and drops the RED round trip and one
barrier per tile (P then needs its own region).

Counting (count=True, compile-time): each thread counts the elements it loads / stores per
tensor in registers and adds them with one `cuda.atomic.add` per tensor at the end into
the int64 counters of `gpu._launch`; with count=False that code is not compiled at all.

Interface: `run(...)` has the signature of `gpu.fa2.run` (plus optional tuning keywords),
so `gpu.attention(..., algorithm="fa2")` can call it whenever `supports(...)` is true.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64

from ._launch import (NB_DTYPE, NEG_INF, ONE, READ, SIM, WRITE, ZERO, T, add_count,
                      dummy_mask, kernel_name, specialisation)

#: Largest register tile side we generate (S is RM x RN, O is RM x DN registers).
MAX_R = 8
#: Preferred threads per query row (TC), best first.
TC_CHOICES = (16, 8, 32, 4, 2, 1)


def _pad_ps(B_c: int, TC: int) -> int:
    """Row stride of P in shared memory: >= B_c, and = TC (mod 32) when TC < 32, so the
    rows of one warp (32 / TC of them, TC lanes each) fall in disjoint banks."""
    if TC >= 32:
        return B_c
    ps = B_c
    while ps % 32 != TC % 32:
        ps += 1
    return ps


def layout(B_r, B_c, d, TC, TR, shfl=False) -> dict:
    """Offsets (in float32 elements) of the shared regions and the total bytes."""
    QS, KS, PS = B_r + 1, B_c + 1, _pad_ps(B_c, TC)
    q_n = d * QS
    k_n = d * KS
    p_n = B_r * PS
    kp_n = k_n if shfl else max(k_n, p_n)
    v_n = B_c * d
    red_n = 0 if shfl else B_r * TC
    QO = 0
    KO = QO + q_n
    VO = KO + kp_n
    PO = (VO + v_n) if shfl else KO
    RO = VO + v_n + (p_n if shfl else 0)
    total = RO + red_n
    return dict(QS=QS, KS=KS, PS=PS, QO=QO, KO=KO, VO=VO, PO=PO, RO=RO, elems=total,
                bytes=4 * total)


def plan(B_r, B_c, d, threads, TC=None):
    """(TR, TC, RM, RN, DN) for a tiling and thread count, or None if unsupported."""
    choices = (TC,) if TC else TC_CHOICES
    for tc in choices:
        if threads % tc or B_c % tc or d % tc:
            continue
        tr = threads // tc
        if B_r % tr:
            continue
        RM, RN, DN = B_r // tr, B_c // tc, d // tc
        if RM <= MAX_R and RN <= MAX_R and DN <= 16 and RM * (RN + DN) <= 160:
            return tr, tc, RM, RN, DN
    return None


def smem_bytes(B_r, B_c, d, threads, TC=None, shfl=False) -> int:
    p = plan(B_r, B_c, d, threads, TC)
    if p is None:
        raise ValueError(f"fa2_fast does not support B_r={B_r}, B_c={B_c}, d={d}, "
                         f"threads={threads}")
    tr, tc = p[0], p[1]
    return layout(B_r, B_c, d, tc, tr, shfl)["bytes"]


def supports(B_r, B_c, d, threads, *, shfl=False, smem_limit=None) -> bool:
    """True if this kernel handles the configuration (and its shared memory fits)."""
    p = plan(B_r, B_c, d, threads)
    if p is None or (shfl and SIM):
        return False
    if smem_limit is None:
        from ._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return smem_bytes(B_r, B_c, d, threads, shfl=shfl) <= smem_limit


@specialisation
def fa2_fast_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TC, shfl):
    """Kernel(q, k, v, o, L, scale, N, H, G, mask, counters): arguments as gpu.fa2.
    Grid (T_r, instances), `threads` threads, `smem_bytes(...)` dynamic shared bytes."""
    TR, TC_, RM, RN, DN = plan(B_r, B_c, d, threads, TC)
    assert TC_ == TC
    lay = layout(B_r, B_c, d, TC, TR, shfl)
    QS, KS, PS = lay["QS"], lay["KS"], lay["PS"]
    QO, KO, VO, PO, RO = lay["QO"], lay["KO"], lay["VO"], lay["PO"], lay["RO"]
    DT = NB_DTYPE[dt]  # noqa: F841  (storage dtype; loads convert with float32())
    THREADS = threads
    QN, KN = B_r * d, B_c * d
    LQ = -(-QN // THREADS)
    LK = -(-KN // THREADS)
    QDIV = QN % THREADS == 0
    KDIV = KN % THREADS == 0
    IQ, IK, IV, IO, IL = T["Q"], T["K"], T["V"], T["O"], T["L"]
    FULL = 0xFFFFFFFF
    # xor offsets of the row reduction (TC is a power of two dividing 32 for shfl)
    if shfl:
        assert TC <= 32 and TC & (TC - 1) == 0, "shfl needs TC a power of two <= 32"
    OFF = []
    o_ = TC // 2
    while o_ >= 1:
        OFF.append(o_)
        o_ //= 2
    NOFF = len(OFF)
    OFF0 = OFF[0] if NOFF > 0 else 1
    OFF1 = OFF[1] if NOFF > 1 else 1
    OFF2 = OFF[2] if NOFF > 2 else 1
    OFF3 = OFF[3] if NOFF > 3 else 1
    OFF4 = OFF[4] if NOFF > 4 else 1

    def kernel(q, k, v, o, L, scale, N, H, G, mask, counters):
        if causal:   # heaviest query blocks (most key tiles) first
            i = cuda.gridDim.x - 1 - cuda.blockIdx.x
        else:
            i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        tx = t % TC
        ty = t // TC
        zk = (z // H) * (H // G) + (z % H) // G        # this head's K/V instance
        sm = cuda.shared.array(0, float32)
        s_acc = cuda.local.array((RM, RN), float32)
        o_acc = cuda.local.array((RM, DN), float32)
        m_r = cuda.local.array(RM, float32)
        l_r = cuda.local.array(RM, float32)
        qv = cuda.local.array(RM, float32)
        kv = cuda.local.array(RN, float32)
        vv = cuda.local.array(DN, float32)
        nQ = int64(0)
        nK = int64(0)
        nO = int64(0)
        nL = int64(0)

        r0 = i * B_r
        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        # ---- Q_i -> Qt (transposed, zero rows past N) ----
        for it in range(LQ):
            e = t + it * THREADS
            if QDIV or e < QN:
                r = e // d
                x = e % d
                val = ZERO
                if r < rows:
                    val = float32(q[z, r0 + r, x])
                    if count:
                        nQ += 1
                sm[QO + x * QS + r] = val
        for a in range(RM):
            m_r[a] = NEG_INF
            l_r[a] = ZERO
            for b in range(DN):
                o_acc[a, b] = ZERO

        T_c = (N + B_c - 1) // B_c
        for j in range(T_c):
            c0 = j * B_c
            if causal and c0 > last:                    # this and later tiles inactive
                break
            if has_mask and mask[i, j] == 0:
                continue
            cols = min(B_c, N - c0)
            cuda.syncthreads()                          # previous tile done with KP, V
            for it in range(LK):
                e = t + it * THREADS
                if KDIV or e < KN:
                    c = e // d
                    x = e % d
                    kval = ZERO
                    vval = ZERO
                    if c < cols:
                        kval = float32(k[zk, c0 + c, x])
                        vval = float32(v[zk, c0 + c, x])
                        if count:
                            nK += 1
                    sm[KO + x * KS + c] = kval
                    sm[VO + c * d + x] = vval
            cuda.syncthreads()
            # ---- S = Q_i K_j^T, register tile ----
            for a in range(RM):
                for b in range(RN):
                    s_acc[a, b] = ZERO
            for x in range(d):
                for a in range(RM):
                    qv[a] = sm[QO + x * QS + ty + TR * a]
                for b in range(RN):
                    kv[b] = sm[KO + x * KS + tx + TC * b]
                for a in range(RM):
                    for b in range(RN):
                        s_acc[a, b] += qv[a] * kv[b]
            # ---- scale, mask, row max ----
            for a in range(RM):
                r = ty + TR * a
                mx = NEG_INF
                for b in range(RN):
                    c = tx + TC * b
                    sv = s_acc[a, b] * scale
                    if c >= cols:
                        sv = NEG_INF
                    if causal:
                        if c0 + c > r0 + r:
                            sv = NEG_INF
                    s_acc[a, b] = sv
                    mx = max(mx, sv)
                if shfl:
                    if NOFF > 0:
                        mx = max(mx, cuda.shfl_xor_sync(FULL, mx, OFF0))
                    if NOFF > 1:
                        mx = max(mx, cuda.shfl_xor_sync(FULL, mx, OFF1))
                    if NOFF > 2:
                        mx = max(mx, cuda.shfl_xor_sync(FULL, mx, OFF2))
                    if NOFF > 3:
                        mx = max(mx, cuda.shfl_xor_sync(FULL, mx, OFF3))
                    if NOFF > 4:
                        mx = max(mx, cuda.shfl_xor_sync(FULL, mx, OFF4))
                    qv[a] = mx
                else:
                    sm[RO + r * TC + tx] = mx
            if not shfl:
                cuda.syncthreads()                      # RED full; everyone done with K^T
                for a in range(RM):
                    r = ty + TR * a
                    mx = NEG_INF
                    for u in range(TC):
                        mx = max(mx, sm[RO + r * TC + u])
                    qv[a] = mx
            # ---- online softmax update; P -> shared ----
            for a in range(RM):
                r = ty + TR * a
                m_old = m_r[a]
                m_new = max(m_old, qv[a])
                m_safe = m_new if m_new > NEG_INF else ZERO
                alpha = math.exp(m_old - m_safe)       # 0 while nothing was visible
                m_r[a] = m_new
                ps = ZERO
                for b in range(RN):
                    p = math.exp(s_acc[a, b] - m_safe)
                    ps += p
                    sm[PO + r * PS + tx + TC * b] = p
                l_r[a] = l_r[a] * alpha + ps
                for b in range(DN):
                    o_acc[a, b] *= alpha
            cuda.syncthreads()                          # P complete
            # ---- O += P V_j ----
            for c in range(B_c):
                for a in range(RM):
                    qv[a] = sm[PO + (ty + TR * a) * PS + c]
                for b in range(DN):
                    vv[b] = sm[VO + c * d + tx + TC * b]
                for a in range(RM):
                    for b in range(DN):
                        o_acc[a, b] += qv[a] * vv[b]
        # ---- row sums over the TC threads of each row ----
        if shfl:
            for a in range(RM):
                ls = l_r[a]
                if NOFF > 0:
                    ls += cuda.shfl_xor_sync(FULL, ls, OFF0)
                if NOFF > 1:
                    ls += cuda.shfl_xor_sync(FULL, ls, OFF1)
                if NOFF > 2:
                    ls += cuda.shfl_xor_sync(FULL, ls, OFF2)
                if NOFF > 3:
                    ls += cuda.shfl_xor_sync(FULL, ls, OFF3)
                if NOFF > 4:
                    ls += cuda.shfl_xor_sync(FULL, ls, OFF4)
                l_r[a] = ls
        else:
            for a in range(RM):
                sm[RO + (ty + TR * a) * TC + tx] = l_r[a]
            cuda.syncthreads()
            for a in range(RM):
                r = ty + TR * a
                ls = ZERO
                for u in range(TC):
                    ls += sm[RO + r * TC + u]
                l_r[a] = ls
        # ---- write O_i = acc / l (valid rows only) ----
        cuda.syncthreads()                              # all done with Qt: reuse it for L_i
        for a in range(RM):
            r = ty + TR * a
            ls = l_r[a]
            if r < rows:
                inv = ONE / ls if ls > ZERO else ZERO
                for b in range(DN):
                    o[z, r0 + r, tx + TC * b] = o_acc[a, b] * inv
                if count:
                    nO += DN
            if tx == 0:
                sm[QO + r] = m_r[a] + math.log(ls) if ls > ZERO else NEG_INF
        cuda.syncthreads()
        # ---- L_i = m + log l, staged through shared memory so that the block stores its
        # rows' L contiguously (full 32-byte sectors: what Nsight counts matches the
        # ledger) instead of one scattered 4-byte store per row ----
        for r in range(t, rows, THREADS):
            L[z, r0 + r] = sm[QO + r]
            if count:
                nL += 1
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nK)
            add_count(counters, IO, WRITE, nO)
            add_count(counters, IL, WRITE, nL)

    name = kernel_name("fa2_fast", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal, mask=has_mask,
                       count=count, t=threads, tc=TC, shfl=shfl)
    return kernel, name


def get_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TC=None, shfl=False):
    """The compiled dispatcher for one specialisation (TC: threads per row, default
    from `plan`)."""
    p = plan(B_r, B_c, d, threads, TC)
    if p is None:
        raise ValueError(f"fa2_fast does not support B_r={B_r}, B_c={B_c}, d={d}, "
                         f"threads={threads}, TC={TC}")
    return fa2_fast_kernel(B_r, B_c, d, dt, bool(causal), bool(has_mask), bool(count),
                           int(threads), p[1], bool(shfl))


def run(q3, k3, v3, o3, L2, scale, N, H, G, mask, counters, *, B_r, B_c, dt, causal,
        count, threads, TC=None, shfl=False):
    """Launch on 3-D device views (instances, N, d); writes o3 and L2. Same signature
    as gpu.fa2.run; TC (threads per query row) and shfl are optional tuning knobs."""
    from ._launch import launch
    d = q3.shape[2]
    kern = get_kernel(B_r, B_c, d, dt, causal, mask is not None, count, threads, TC, shfl)
    p = plan(B_r, B_c, d, threads, TC)
    shmem = layout(B_r, B_c, d, p[1], p[0], shfl)["bytes"]
    T_r = -(-N // B_r)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (T_r, q3.shape[0]), threads, shmem,
           q3, k3, v3, o3, L2, np.float32(scale), np.int64(N), np.int64(H), np.int64(G),
           mk, counters)


def signature(dt="fp32"):
    """Argument types of the kernel (for cuda.compile_ptx without a GPU)."""
    from numba.cuda import types as nb
    X = NB_DTYPE[dt]
    return (nb.Array(X, 3, "C"), nb.Array(X, 3, "C"), nb.Array(X, 3, "C"),
            nb.Array(X, 3, "C"), nb.Array(nb.float32, 2, "C"), nb.float32, nb.int64,
            nb.int64, nb.int64, nb.Array(nb.uint8, 2, "C"), nb.Array(nb.int64, 2, "C"))


__all__ = ["plan", "layout", "smem_bytes", "supports", "fa2_fast_kernel", "get_kernel",
           "run", "signature"]
