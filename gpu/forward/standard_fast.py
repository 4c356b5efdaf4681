"""Standard attention (the paper's Algorithm 0), register-tiled on the CUDA cores (fp32
math): the fast path for fp32 (fp16 inputs run too, with fp32 math and fp16 S, P).

Same schedule, hence EXACTLY the same HBM traffic and ledger, as `gpu.forward.standard`
(and `iosim.schedules.standard_forward`) for the same tiling (B_r, B_c): three kernels
through HBM, S and P N_q x N_k buffers per instance in the problem dtype.

    S kernel   `std_fast_S`, one thread block per (active tile (i, j), instance): read Q_i
               and K_j (rows < N) into shared memory, zero rows past N (not counted);
               S_ij = scale Q_i K_j^T as an RM x RN register tile per thread
               (`fa2_fast.register_qk`: 16-byte shared loads, x advancing 4 at a time);
               entries outside the causal / window band of gpu.forward._band -inf; write
               the whole tile (rows < N_q, columns < N_k) straight from registers.
    softmax    the plain row kernel `gpu.forward.standard.softmax_kernel` with shfl=True on
               hardware (warp-shuffle reductions, one float32 per warp in shared memory;
               the simulator has no shuffles and runs shfl=False), at least 32 and at most
               SOFTMAX_THREADS threads per row.
    PV kernel  `std_fast_PV`, one thread block per (query block i, instance): for each
               active j read P_ij (rows x cols) and V_j (cols x d) into shared memory
               (zero-filled past N_q / N_k, not counted); O_i += P_ij V_j as an RM x DN
               register tile per thread (`fa2_fast.register_pv`); write O_i once through
               shared memory (coalesced row stores; 0 for a row that sees no key, since
               its P is 0). stage=1: the next active tile's P and V loads are issued into
               registers before this tile's product and stored to shared memory after it.

Dropout (dropout_p = p > 0; `run(..., z3=, dropout=(p, seed, offset))`): the unfused
graph's, as the plain kernels: the softmax kernel (the plain one, its dropout build)
also writes the keep mask Z (uint8, gpu._philox: the plain kernels' bits) over the
active entries, and the PV kernel's dropout build (`pv_kernel(..., dropout=True)`, two
more arguments zm, rp) multiplies each P entry it loads by Z/(1-p), Z read from HBM: Z
written and read RCA elements more (iosim's closed form with dropout). The builds
without dropout keep their arguments and code (same PTX: scripts/ptx_snapshot.py).

Thread layout (both tile kernels): `threads` = TR x TC, thread t = (ty, tx) =
(t // TC, t % TC), so the TC threads sharing a query row are consecutive lanes.
    S kernel:  S entries rows ty + TR a (a < RM), columns tx + TC b (b < RN);
               B_r = TR RM, B_c = TC RN (`s_plan`).
    PV kernel: O entries rows ty + TR a (a < RM), head columns 4 tx + 4 TC g + w
               (g < DN / 4, w < 4); B_r = TR RM, d = TC DN (`pv_plan`).
S stores: for fixed (a, b) a warp writes 32 / TC rows x TC consecutive floats: whole
32-byte sectors when TC >= 8.

Shared memory (float32 whatever the storage dtype; one dynamic buffer declared 16-byte
aligned; row strides multiples of 4 floats, chosen as in fa2_fast so the 16-byte loads
of a quarter warp hit distinct banks):
    S kernel:  Qs B_r x QS | Ks B_c x KS, QS = KS = d rounded up to 4 (mod 32)
    PV kernel: Ps B_r x PS (PS >= B_c, = TC mod 32) | Vs B_c x d; O_i staged over Ps
               afterwards, B_r x QS.

Counts, in elements (the plain kernels' rules): Q read rows_i d and K cols_j d, S written
rows_i cols_j per active tile; S read and P written over the active entries of each
row; P read rows_i cols_j and V cols_j d per active tile; O written N_q d. Each thread
counts in registers and adds once per tensor (count=True builds only).

Tiling: any (B_r, B_c, threads) that `plan_error` accepts; the api's default is
gpu.api.STANDARD_FAST_TILES. Versions: v1 (this file), untimed on a GPU at the time of
writing: scripts/fp32_fast_gpu.sh times the default against the plain kernels and
torch's MATH backend and sweeps a few tilings.

Registers (ptxas -v for sm_90 on the PTX built without a GPU, no register cap), d = 64:
128 x 128, 256 threads: S 128 (2 blocks of 256 threads per SM), PV 95, softmax 32, no
spills; 128 x 64 / 64 x 64: S 72, PV 80-95. stage=1 keeps LP + LV floats per thread in
registers: 48-64 at these tilings, and it spilled (620 B at 128 x 64, 1 KB at 64 x 64),
so the default is stage 0.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int64

from .._launch import (NB_DTYPE, NEG_INF, ONE, READ, SIM, WRITE, ZERO, T, add_count,
                       dummy_mask, jit_options, kernel_name, launch, specialisation)
from .. import _philox
from . import standard as _plain
from ._band import band_args
from .fa2_fast import (ALIGN, IMASK, W, active_tile_finder, register_pv, register_qk,
                       tile_loader, tile_storer)

# the launch geometry (which tilings run, threads, shared-memory layout): iosim.launch
from iosim.launch.forward import standard_fast as _geometry
from iosim.launch.forward.standard_fast import (SOFTMAX_THREADS, plan_error, pv_layout, pv_plan,
                                                s_layout, s_plan, shared_bytes)

DTYPES = _geometry.DTYPES




def supports(B_r, B_c, d, threads, dt="fp32", N_k=None, smem_limit=None) -> bool:
    """True if these kernels run the configuration (and the softmax row of N_k float32)
    within the device's per-block shared memory."""
    if plan_error(B_r, B_c, d, threads, dt) is not None:
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    need = shared_bytes(B_r, B_c, d, threads)
    if N_k is not None:
        need = max(need, 4 * N_k)
    return need <= smem_limit


# ---------------------------------------------------------------------------------------
# S = scale Q K^T, one block per active tile
# ---------------------------------------------------------------------------------------
@specialisation
def s_kernel(B_r, B_c, d, dt, causal, window, count, threads, maxreg=0):
    """Kernel(q, k, s, tiles, scale, N, N_k, lo, hi, H, G, counters); grid (n_active,
    instances), `threads` threads, `s_layout(...)["bytes"]` dynamic shared bytes; tiles:
    int32 (n_active, 2) of (i, j); s: (instances, N, N_k) problem dtype. maxreg > 0 caps
    registers per thread (hardware only)."""
    TR, TC, RM, RN = s_plan(B_r, B_c, d, threads)
    lay = s_layout(B_r, B_c, d)
    QS, KS, QO, KO = lay["QS"], lay["KS"], lay["QO"], lay["KO"]
    THREADS = threads
    banded = causal or window
    load_q = tile_loader(B_r, d, THREADS, QO, QS, count)
    load_k = tile_loader(B_c, d, THREADS, KO, KS, count)
    IQ, IK, IS = T["Q"], T["K"], T["S"]
    qk_product = register_qk(RM, RN, TR, TC, QS, KS, d)

    def kernel(q, k, s, tiles, scale, N, N_k, lo, hi, H, G, counters):
        a_ = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        tx = t % TC
        ty = t // TC
        zk = (z // H) * (H // G) + (z % H) // G        # this head's K/V instance
        i = tiles[a_, 0]
        j = tiles[a_, 1]
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        s_acc = cuda.local.array((RM, RN), float32)
        qv = cuda.local.array(W, float32)
        kv = cuda.local.array((RN, W), float32)
        nQ = int64(0)
        nK = int64(0)
        nS = int64(0)
        r0 = i * B_r
        c0 = j * B_c
        rows = min(B_r, N - r0)
        cols = min(B_c, N_k - c0)
        nQ = load_q(q, z, r0, rows, t, sm, nQ)          # Q_i -> Qs, zero rows past N
        nK = load_k(k, zk, c0, cols, t, sm, nK)         # K_j -> Ks, zero rows past N_k
        cuda.syncthreads()
        qk_product(sm, (QO + ty * QS) & IMASK, (KO + tx * KS) & IMASK, s_acc, qv, kv)
        for a in range(RM):                             # scale, mask, store the tile
            r = ty + TR * a
            if r < rows:
                for b in range(RN):
                    c = tx + TC * b
                    if c < cols:
                        sv = s_acc[a, b] * scale
                        if banded:
                            if c0 + c - r0 - r > hi or c0 + c - r0 - r < lo:
                                sv = NEG_INF
                        s[z, r0 + r, c0 + c] = sv
                        if count:
                            nS += 1
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IS, WRITE, nS)

    name = kernel_name("std_fast_S", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal,
                       window=window, count=count, t=threads, tc=TC, maxreg=maxreg or False)
    return kernel, name, jit_options(maxreg)


# ---------------------------------------------------------------------------------------
# O = P V, one block per query block
# ---------------------------------------------------------------------------------------
@specialisation
def pv_kernel(B_r, B_c, d, dt, causal, window, has_mask, count, threads, stage=0, maxreg=0,
              dropout=False):
    """Kernel(p, v, o, mask, N, N_k, lo, hi, H, G, counters); grid (T_r, instances),
    `threads` threads, `pv_layout(...)["bytes"]` dynamic shared bytes. p: (instances, N,
    N_k), v: (batch * kv_heads, N_k, d), o: (instances, N, d), problem dtype. stage: 0
    loads each tile between two barriers, 1 issues the next active tile's loads into
    registers (LP + LV floats per thread) before this tile's product.
    dropout=True (O = (P o Z / (1 - p)) V, the unfused graph's dropout): Kernel(p, v, o,
    mask, N, N_k, lo, hi, H, G, counters, zm, rp), each loaded P entry multiplied by
    Z/(1-p) with Z read from the stored keep mask zm (instances, N, N_k) uint8 (written
    by the softmax kernel; counted under "Z", one per P entry read), rp = 1/(1-p) (float32
    math: P o Z/(1-p) is not rounded to the storage dtype). The build without dropout
    keeps its arguments and code (the shared body, its dropout branches compiled out)."""
    TR, TC, RM, DN = pv_plan(B_r, B_c, d, threads)
    lay = pv_layout(B_r, B_c, d, TC)
    PS, PO, VO, OS = lay["PS"], lay["PO"], lay["VO"], lay["OS"]
    THREADS = threads
    banded = causal or window
    DG = DN // W
    PN, VN = B_r * B_c, B_c * d
    LP, LV = -(-PN // THREADS), -(-VN // THREADS)
    PDIV, VDIV = PN % THREADS == 0, VN % THREADS == 0
    LPS, LVS = (LP, LV) if stage else (1, 1)
    IP, IV, IO, IZ = T["P"], T["V"], T["O"], T["Z"]
    pv_product = register_pv(RM, DN, TR, TC, PS, d, B_c)
    next_tile = active_tile_finder(B_c, banded, has_mask)
    store_o = tile_storer(d, THREADS, 0, OS, count)     # O_i staged at 0, stride OS

    @cuda.jit(device=True, inline=True)
    def ldg(p, v, z, zk, r0, rows, c0, cols, t, pst, vst, zm, rp):
        """This thread's share of P_ij and V_j into registers, zeros outside (dropout:
        P_ij o Z_ij / (1 - p)); returns the numbers of P and V elements it loaded."""
        nP = int64(0)
        nV = int64(0)
        for it in range(LP):
            e = t + it * THREADS
            pst[it] = ZERO
            if PDIV or e < PN:
                r = e // B_c
                c = e % B_c
                if r < rows and c < cols:
                    if dropout:
                        if zm[z, r0 + r, c0 + c] != 0:
                            pst[it] = float32(p[z, r0 + r, c0 + c]) * rp
                    else:
                        pst[it] = float32(p[z, r0 + r, c0 + c])
                    nP += 1
        for it in range(LV):
            e = t + it * THREADS
            vst[it] = ZERO
            if VDIV or e < VN:
                c = e // d
                x = e % d
                if c < cols:
                    vst[it] = float32(v[zk, c0 + c, x])
                    nV += 1
        return nP, nV

    @cuda.jit(device=True, inline=True)
    def lds(p, v, z, zk, r0, rows, c0, cols, t, sm, zm, rp):
        """stage 0: this thread's share of P_ij and V_j straight into Ps, Vs (zeros
        outside; dropout: P_ij o Z_ij / (1 - p)); returns the numbers of P and V elements
        it loaded."""
        nP = int64(0)
        nV = int64(0)
        for e in range(t, PN, THREADS):
            r = e // B_c
            c = e % B_c
            val = ZERO
            if r < rows and c < cols:
                if dropout:
                    if zm[z, r0 + r, c0 + c] != 0:
                        val = float32(p[z, r0 + r, c0 + c]) * rp
                else:
                    val = float32(p[z, r0 + r, c0 + c])
                nP += 1
            sm[PO + r * PS + c] = val
        for e in range(t, VN, THREADS):
            c = e // d
            val = ZERO
            if c < cols:
                val = float32(v[zk, c0 + c, e % d])
                nV += 1
            sm[VO + e] = val
        return nP, nV

    def body(p, v, o, mask, N, N_k, lo, hi, H, G, counters, zm, rp):
        i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        tx = t % TC
        ty = t // TC
        zk = (z // H) * (H // G) + (z % H) // G
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        o_acc = cuda.local.array((RM, DN), float32)
        pv = cuda.local.array((RM, W), float32)
        vv = cuda.local.array(DN, float32)
        pst = cuda.local.array(LPS, float32)           # stage 1: the next tile's P, V
        vst = cuda.local.array(LVS, float32)
        nP = int64(0)
        nV = int64(0)
        nO = int64(0)
        pbase = (PO + ty * PS) & IMASK
        col4 = (W * tx) & IMASK
        r0 = i * B_r
        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        for a in range(RM):
            for b in range(DN):
                o_acc[a, b] = ZERO
        T_c = (N_k + B_c - 1) // B_c
        jn = next_tile(0, T_c, r0, last, N_k, lo, hi, mask, i)
        if stage and jn < T_c:
            c0n = jn * B_c
            x1, x2 = ldg(p, v, z, zk, r0, rows, c0n, min(B_c, N_k - c0n), t, pst, vst,
                          zm, rp)
            nP += x1
            nV += x2
        while jn < T_c:
            j = jn
            c0 = j * B_c
            cuda.syncthreads()                          # previous product done with Ps, Vs
            if stage:                                   # registers -> shared
                for it in range(LP):
                    e = t + it * THREADS
                    if PDIV or e < PN:
                        sm[PO + (e // B_c) * PS + e % B_c] = pst[it]
                for it in range(LV):
                    e = t + it * THREADS
                    if VDIV or e < VN:
                        sm[VO + e] = vst[it]
            else:
                x1, x2 = lds(p, v, z, zk, r0, rows, c0, min(B_c, N_k - c0), t, sm, zm, rp)
                nP += x1
                nV += x2
            cuda.syncthreads()
            jn = next_tile(j + 1, T_c, r0, last, N_k, lo, hi, mask, i)
            if stage and jn < T_c:   # next tile's loads stay in flight during this product
                c0n = jn * B_c
                x1, x2 = ldg(p, v, z, zk, r0, rows, c0n, min(B_c, N_k - c0n), t, pst, vst,
                          zm, rp)
                nP += x1
                nV += x2
            pv_product(sm, pbase, VO, col4, o_acc, pv, vv)
        # ---- O_i -> shared (over Ps), then coalesced row stores ----
        cuda.syncthreads()
        for a in range(RM):
            for g in range(DG):
                for w in range(W):
                    sm[(ty + TR * a) * OS + col4 + g * W * TC + w] = o_acc[a, g * W + w]
        cuda.syncthreads()
        nO = store_o(o, z, r0, rows, t, sm, nO)
        if count:
            add_count(counters, IP, READ, nP)
            add_count(counters, IV, READ, nV)
            add_count(counters, IO, WRITE, nO)
            if dropout:
                add_count(counters, IZ, READ, nP)

    body = cuda.jit(device=True, inline=True)(body)
    if dropout:
        def kernel(p, v, o, mask, N, N_k, lo, hi, H, G, counters, zm, rp):
            body(p, v, o, mask, N, N_k, lo, hi, H, G, counters, zm, rp)
    else:
        def kernel(p, v, o, mask, N, N_k, lo, hi, H, G, counters):
            body(p, v, o, mask, N, N_k, lo, hi, H, G, counters, p, ONE)

    name = kernel_name("std_fast_PV", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal,
                       window=window, mask=has_mask, dropout=dropout, count=count,
                       t=threads, tc=TC, stage=stage or False, maxreg=maxreg or False)
    return kernel, name, jit_options(maxreg)


def softmax_threads(N_k: int) -> int:
    """Threads of the softmax row kernel: a power of two covering N_k, at least 32 (whole
    warps for the shuffles), at most SOFTMAX_THREADS (the simulator: the plain rule)."""
    if SIM:
        return _plain.softmax_threads(N_k, 16)
    return max(32, _plain.softmax_threads(N_k, SOFTMAX_THREADS))


def run(q3, k3, v3, o3, s3, p3, scale, N, H, G, mask, active, counters, *, B_r, B_c, dt,
        causal, count, threads, N_k=None, window=(-1, -1), stage=0, maxreg=0, z3=None,
        dropout=None):
    """Launch the three kernels on 3-D device views; writes s3, p3, o3. The arguments of
    `gpu.forward.standard.run` plus the tuning knobs stage (PV kernel's register
    prefetch, 0 or 1) and maxreg (register cap of both tile kernels, 0 = none).
    dropout: None, or (dropout_p, seed, offset) with p > 0: as the plain kernels, the
    softmax kernel also writes the keep mask (gpu._philox, the same bits) into z3
    (instances, N, N_k) uint8 and the PV kernel reads it (O = (P o Z/(1-p)) V).

    q3, o3: (instances, N, d); k3, v3: (kv instances, N_k, d) (N_k default N); s3, p3:
    (instances, N, N_k). active: host boolean (T_r, T_c) of active tiles
    (iosim.active_tiles, band and block mask)."""
    d = q3.shape[2]
    err = plan_error(B_r, B_c, d, threads, dt)
    if err:
        raise ValueError(f"standard_fast: {err}")
    from .standard_tc import active_list
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    inst = q3.shape[0]
    has_mask = mask is not None
    mk = mask if has_mask else dummy_mask()
    if SIM:
        maxreg = 0
    n, nk, h, g = np.int64(N), np.int64(N_k), np.int64(H), np.int64(G)
    n_act, tiles = active_list(np.asarray(active, dtype=bool))
    if n_act:
        launch(s_kernel(int(B_r), int(B_c), int(d), dt, bool(causal), bool(windowed),
                        bool(count), int(threads), int(maxreg)),
               (n_act, inst), threads, s_layout(B_r, B_c, d)["bytes"], q3, k3, s3, tiles,
               np.float32(scale), n, nk, lo, hi, h, g, counters)
    drop = bool(dropout and dropout[0] > 0)
    if drop and z3 is None:
        raise ValueError("standard_fast.run: dropout needs z3, the (instances, N, N_k) uint8 "
                         "keep mask buffer")
    key0, key1, off, thr, rp = _philox.kernel_args(*(dropout or ()))
    ts = softmax_threads(N_k)
    kSM = _plain.softmax_kernel(int(B_r), int(B_c), bool(causal), has_mask, bool(count), ts,
                                bool(windowed), drop, not SIM)
    launch(kSM, (N, inst), ts, 4 * N_k, s3, p3, mk, n, nk, lo, hi, counters,
           *((z3, key0, key1, off, thr) if drop else ()))
    TC = pv_plan(B_r, B_c, d, threads)[1]
    launch(pv_kernel(int(B_r), int(B_c), int(d), dt, bool(causal), bool(windowed), has_mask,
                     bool(count), int(threads), int(stage), int(maxreg), drop),
           (-(-N // B_r), inst), threads, pv_layout(B_r, B_c, d, TC)["bytes"], p3, v3, o3,
           mk, n, nk, lo, hi, h, g, counters, *((z3, rp) if drop else ()))


def signatures(dt="fp32"):
    """Argument types of the S, softmax and PV kernels (for compiling without a GPU)."""
    from numba.cuda import types as nb
    X = nb.Array(NB_DTYPE[dt], 3, "C")
    I2 = nb.Array(nb.int32, 2, "C")
    M = nb.Array(nb.uint8, 2, "C")
    C = nb.Array(nb.int64, 2, "C")
    i64 = nb.int64
    return dict(S=(X, X, X, I2, nb.float32) + (i64,) * 6 + (C,),
                softmax=(X, X, M) + (i64,) * 4 + (C,),
                PV=(X, X, X, M) + (i64,) * 6 + (C,),
                # the dropout builds' PV kernel: + zm (the keep mask), rp
                PV_dropout=(X, X, X, M) + (i64,) * 6 + (C, nb.Array(nb.uint8, 3, "C"),
                                                        nb.float32))


__all__ = ["s_plan", "pv_plan", "s_layout", "pv_layout", "plan_error", "shared_bytes",
           "supports", "s_kernel", "pv_kernel", "softmax_threads", "run", "signatures"]
