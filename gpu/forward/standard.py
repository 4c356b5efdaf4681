"""Standard attention (the paper's Algorithm 0) as three kernels through HBM.

    S kernel   one thread block per (active tile (i, j), instance): read Q_i, K_j;
               write S_ij = scale Q_i K_j^T (entries outside the causal / window band of
               gpu.forward._band -inf), whole tile.
    softmax    one thread block per (query row, instance): read the row's entries of S
               over the active tiles of its query block into a float32 row held in shared
               memory (N_k float32, separate from the tiles' footprint); write
               P = exp(S - max) / sum over the same entries (float32 math, stored in the
               problem dtype). A row with no active tile reads and writes nothing.
    PV kernel  one thread block per (query block i, instance): for each active j read
               P_ij and V_j; accumulate O_i in float32; write O_i once (0 for rows with
               no visible key).
S and P are N_q x N_k HBM buffers per instance, in the problem dtype (bf16: uint16 bits,
widened by `_launch.loader`, rounded by `_launch.storer`). Active tiles: as
iosim.active_tiles (the band and the block mask).

Shared memory of the two tiled kernels: one dynamic buffer of
`iosim.sram_footprint_bytes('standard', ...)` = max(QK tiles, PV tiles) bytes:
    S kernel:  input dtype Q_i (B_r*d) | K_j (B_c*d)
    PV kernel: float32 O_i (B_r*d) | input dtype P_ij (B_r*B_c) | V_j (B_c*d)
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64

from iosim.tiling import sram_footprint_bytes

from .._launch import (NAN, NB_DTYPE, NEG_INF, NP_DTYPE, ONE, READ, WRITE, ZERO, T, add_count,
                      dummy_mask, kernel_name, lane_group_reducer, launch, loader, specialisation,
                      storer)
from .. import _philox
from ._band import band_args, sees_key_band, tile_in_band

_U0 = np.uint64(0)         # the dropout arguments of a build without dropout (unread)


@specialisation
def tile_product_kernel(B_r, B_c, d, dt, causal, count, threads, prefix, idx, window=False,
                        dropout=False):
    """Kernel(a, b, out, tiles, scale, N, N_k, lo, hi, H, G, counters); grid (n_active,
    instances). dropout=True: Kernel(a, b, out, tiles, scale, N, N_k, lo, hi, H, G,
    counters, zm, rp).

    Out_ij = scale A_i B_j^T for each active tile (i, j) (tiles: int32 (n_active, 2)),
    written whole to an (instances, N, N_k) HBM matrix in the problem dtype; causal or
    window: entries outside the band lo <= c - r <= hi (gpu.forward._band) become -inf
    (lo, hi unread otherwise). A: (instances, N, d); B:
    (batch * kv_heads, N_k, d). Serves the forward's S = scale Q K^T ('std_S') and the
    standard backward's line 2, dP = dO V^T ('std_bwd_dP', scale 1, not masked).
    idx = (A, B, Out) counter rows. dropout=True (the standard backward's dP): each entry
    multiplied by Z/(1-p) read from the stored keep mask zm (instances, N, N_k) uint8
    (counted under "Z"), rp = 1/(1-p).
    """
    DT = NB_DTYPE[dt]
    ld, st = loader(dt), storer(dt)        # element -> float32, float32 -> element
    B0 = B_r * d
    IZ = T["Z"]
    IA, IB, IOUT = idx
    banded = causal or window

    def body(a_hbm, bt, out, tiles, scale, N, N_k, lo, hi, H, G, counters, zm, rp):
        a = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        zk = (z // H) * (H // G) + (z % H) // G    # this head's K/V instance
        i = tiles[a, 0]
        j = tiles[a, 1]
        sx = cuda.shared.array(0, DT)
        As = sx[0:B0]
        Bs = sx[B0:B0 + B_c * d]
        nA = int64(0)
        nB = int64(0)
        nO = int64(0)
        r0 = i * B_r
        c0 = j * B_c
        rows = min(B_r, N - r0)
        cols = min(B_c, N_k - c0)
        for e in range(t, rows * d, threads):       # A_i (Q_i or dO_i)
            As[e] = a_hbm[z, r0 + e // d, e % d]
            nA += 1
        for e in range(t, cols * d, threads):       # B_j (K_j or V_j)
            Bs[e] = bt[zk, c0 + e // d, e % d]
            nB += 1
        cuda.syncthreads()
        for e in range(t, rows * cols, threads):
            r = e // cols
            c = e % cols
            s = ZERO
            for x in range(d):
                s += ld(As[r * d + x]) * ld(Bs[c * d + x])
            s = s * scale
            if banded and (c0 + c - r0 - r > hi or c0 + c - r0 - r < lo):
                s = NEG_INF
            if dropout:                             # dP o Z / (1 - p), Z from HBM
                if zm[z, r0 + r, c0 + c] != 0:
                    s = s * rp
                else:
                    s = ZERO
            out[z, r0 + r, c0 + c] = st(s)
            nO += 1
        if count:
            add_count(counters, IA, READ, nA)
            add_count(counters, IB, READ, nB)
            add_count(counters, IOUT, WRITE, nO)
            if dropout:
                add_count(counters, IZ, READ, nO)

    body = cuda.jit(device=True, inline=True)(body)
    if dropout:
        def kernel(a_hbm, bt, out, tiles, scale, N, N_k, lo, hi, H, G, counters, zm, rp):
            body(a_hbm, bt, out, tiles, scale, N, N_k, lo, hi, H, G, counters, zm, rp)
    else:
        def kernel(a_hbm, bt, out, tiles, scale, N, N_k, lo, hi, H, G, counters):
            body(a_hbm, bt, out, tiles, scale, N, N_k, lo, hi, H, G, counters, out, ONE)

    return kernel, kernel_name(prefix, Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal,
                               window=window, dropout=dropout, count=count, t=threads)


def s_kernel(B_r, B_c, d, dt, causal, count, threads, window=False):
    """S = scale Q K^T per active tile: Kernel(q, k, s, tiles, scale, N, N_k, lo, hi, H, G,
    counters); grid (n_active, instances); s: (instances, N, N_k) problem dtype."""
    return tile_product_kernel(B_r, B_c, d, dt, causal, count, threads, "std_S",
                               (T["Q"], T["K"], T["S"]), window)



@specialisation
def softmax_kernel(B_r, B_c, causal, has_mask, count, threads, window=False, dropout=False,
                   shfl=False, dt="fp32"):
    """Kernel softmax(s, p, mask, N, N_k, lo, hi, counters); grid (N, instances); dynamic
    shared memory N_k float32 (the row), plus a static `threads` float32 reduction
    buffer. The row's active entries: those of the active tiles of its query block.
    shfl=True (hardware only; threads a multiple of 32; gpu.forward.standard_fast): the
    row max and sum are reduced by warp shuffles, then over one value per warp, instead of
    every thread reading all `threads` partial values; and a dense row (no band, no block
    mask, no dropout) is read in one flat sweep, each thread 4 entries (c = 4 (t + threads
    u) + w, w < 4) per step: 4 independent loads in flight per thread instead of one, and
    no idle threads where B_c < threads (the per-tile loop left half of 256 threads idle at
    B_c = 128 and ran at 0.5 TB/s on an H100); its exponentials and P stores then take
    consecutive entries on consecutive threads (c = t + threads u), so a warp's stores fill
    whole 32-byte sectors.
    dropout=True: Kernel(s, p, mask, N, N_k, lo, hi, counters, zm, key0, key1, offset,
    thr) also writes the keep mask Z (uint8 0/1, Philox: gpu._philox) over the same
    entries into zm (instances, N, N_k), as the unfused graph's dropout stores its mask."""
    IS, IP, IZ = T["S"], T["P"], T["Z"]
    ld, st = loader(dt), storer(dt)  # fp32 / fp16: as the arrays' type; bf16: uint16 bits
    banded = causal or window
    if shfl:
        assert threads % 32 == 0, "shfl needs whole warps"
    NRED = threads // 32 if shfl else threads       # partial values reduced at the end
    FLAT = shfl and not banded and not has_mask and not dropout   # the dense sweep above
    warp_max = lane_group_reducer(32, "max") if shfl else None
    warp_sum = lane_group_reducer(32, "sum") if shfl else None

    def body(s_hbm, p_hbm, mask, N, N_k, lo, hi, counters, zm, key0, key1, offset, thr):
        r = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        row = cuda.shared.array(0, float32)
        red = cuda.shared.array(threads, float32)
        nS = int64(0)
        nP = int64(0)
        i = r // B_r
        first = i * B_r                          # first and last row of this row's
        last = min((i + 1) * B_r, N) - 1        # query block
        T_c = (N_k + B_c - 1) // B_c
        mx = NEG_INF
        if FLAT:                                 # every entry is active: 4 per thread a step
            for c4 in range(4 * t, N_k, 4 * threads):
                v0 = ld(s_hbm[z, r, c4]) if c4 < N_k else NEG_INF
                v1 = ld(s_hbm[z, r, c4 + 1]) if c4 + 1 < N_k else NEG_INF
                v2 = ld(s_hbm[z, r, c4 + 2]) if c4 + 2 < N_k else NEG_INF
                v3 = ld(s_hbm[z, r, c4 + 3]) if c4 + 3 < N_k else NEG_INF
                row[c4] = v0
                if c4 + 1 < N_k:
                    row[c4 + 1] = v1
                if c4 + 2 < N_k:
                    row[c4 + 2] = v2
                if c4 + 3 < N_k:
                    row[c4 + 3] = v3
                mx = max(mx, max(max(v0, v1), max(v2, v3)))
                nS += min(4, N_k - c4)
        for j in range(0 if FLAT else T_c):      # read the active entries of S
            c0 = j * B_c
            c_end = min(c0 + B_c, N_k)
            if banded and c0 - last > hi:
                break
            if banded and not tile_in_band(first, last, c0, c_end - 1, lo, hi):
                continue
            if has_mask and mask[i, j] == 0:
                continue
            for c in range(c0 + t, c_end, threads):
                val = ld(s_hbm[z, r, c])
                row[c] = val
                mx = max(mx, val)
                nS += 1
        if shfl:
            mx = warp_max(mx)
            if t % 32 == 0:
                red[t // 32] = mx
        else:
            red[t] = mx
        cuda.syncthreads()
        mx = NEG_INF
        for u in range(NRED):
            mx = max(mx, red[u])
        cuda.syncthreads()                       # everyone has read red
        m_safe = mx if mx > NEG_INF else ZERO    # max() may skip NaN entries
        total = ZERO
        if FLAT:                                 # consecutive entries to consecutive lanes:
            for c in range(t, N_k, threads):     # no bank conflicts in `row`
                ex = math.exp(row[c] - m_safe)
                row[c] = ex
                total += ex
        for j in range(0 if FLAT else T_c):      # each thread revisits its own entries
            c0 = j * B_c
            c_end = min(c0 + B_c, N_k)
            if banded and c0 - last > hi:
                break
            if banded and not tile_in_band(first, last, c0, c_end - 1, lo, hi):
                continue
            if has_mask and mask[i, j] == 0:
                continue
            for c in range(c0 + t, c_end, threads):
                ex = math.exp(row[c] - m_safe)   # masked (-inf): 0; NaN stays NaN
                row[c] = ex
                total += ex
        if shfl:
            total = warp_sum(total)
            if t % 32 == 0:
                red[t // 32] = total
        else:
            red[t] = total
        cuda.syncthreads()
        total = ZERO
        for u in range(NRED):
            total += red[u]
        # total > 0 fails for NaN (a NaN or Inf input) as well as for 0: only a row that
        # sees no key gets P = 0 (so O = 0); one that sees a key gets NaN
        if total > ZERO:
            inv = ONE / total
        elif sees_key_band(mask, i, r, B_c, N_k, lo, hi, banded, has_mask):
            inv = NAN
        else:
            inv = ZERO
        if FLAT:                                 # P stored coalesced: a warp's 32 stores
            for c in range(t, N_k, threads):     # fill whole sectors (a lane's 4 entries
                p_hbm[z, r, c] = st(row[c] * inv)  # in a row made partial-sector writes:
                nP += 1                          # 3.7x the L2 write sectors on an H100)
        for j in range(0 if FLAT else T_c):
            c0 = j * B_c
            c_end = min(c0 + B_c, N_k)
            if banded and c0 - last > hi:
                break
            if banded and not tile_in_band(first, last, c0, c_end - 1, lo, hi):
                continue
            if has_mask and mask[i, j] == 0:
                continue
            for c in range(c0 + t, c_end, threads):
                p_hbm[z, r, c] = st(row[c] * inv)
                nP += 1
                if dropout:
                    if _philox.keep(key0, key1, offset, z, r, c, thr):
                        zm[z, r, c] = 1
                    else:
                        zm[z, r, c] = 0
        if count:
            add_count(counters, IS, READ, nS)
            add_count(counters, IP, WRITE, nP)
            if dropout:
                add_count(counters, IZ, WRITE, nP)

    body = cuda.jit(device=True, inline=True)(body)
    if dropout:
        def kernel(s_hbm, p_hbm, mask, N, N_k, lo, hi, counters, zm, key0, key1, offset, thr):
            body(s_hbm, p_hbm, mask, N, N_k, lo, hi, counters, zm, key0, key1, offset, thr)
    else:
        def kernel(s_hbm, p_hbm, mask, N, N_k, lo, hi, counters):
            body(s_hbm, p_hbm, mask, N, N_k, lo, hi, counters, p_hbm, _U0, _U0, _U0, _U0)

    return kernel, kernel_name("std_softmax", Br=B_r, Bc=B_c, causal=causal, window=window,
                               mask=has_mask, dropout=dropout,
                               count=count, t=threads, shfl=shfl, bf16=dt == "bf16")


@specialisation
def rowblock_product_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, prefix, idx,
                            window=False, dropout=False):
    """Kernel(a, b, out, scale, mask, N, N_k, lo, hi, H, G, counters); grid (T_r,
    instances); active tiles those of the band lo <= c - r <= hi (gpu.forward._band) when
    causal or window, and of the block mask.

    Out_i = scale * sum_j A_ij B_j for each query block i: A an (instances, N, N_k) HBM
    matrix read tile by tile (active tiles only), B a (batch * kv_heads, N_k, d) tensor read
    block by block, Out written once. Serves the forward's O = P V (A=P, B=V, scale 1,
    name 'std_PV') and the standard backward's line 4, dQ = scale dS K (Algorithm 3).
    idx = (A, B, Out) rows of the counters table the kernel adds its element counts to.
    dropout=True (the forward's O = (P o Z/(1-p)) V): Kernel(a, b, out,
    scale, mask, N, N_k, lo, hi, H, G, counters, zm, rp), A_ij dropped as it is loaded,
    with Z_ij read from zm (instances, N, N_k) uint8 (counted under "Z"), rp = 1/(1-p).
    """
    DT = NB_DTYPE[dt]
    ld, st = loader(dt), storer(dt)        # element -> float32, float32 -> element
    X0 = B_r * d * 4 // NP_DTYPE[dt].itemsize   # input-dtype tiles after the float32 acc
    A0, B0 = X0, X0 + B_r * B_c
    IA, IB, IOUT = idx
    IZ = T["Z"]
    banded = causal or window

    def body(a_hbm, bt, out, scale, mask, N, N_k, lo, hi, H, G, counters, zm, rp):
        i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        zk = (z // H) * (H // G) + (z % H) // G
        sf = cuda.shared.array(0, float32)
        sx = cuda.shared.array(0, DT)
        acc = sf[0:B_r * d]
        As = sx[A0:B0]
        Bs = sx[B0:B0 + B_c * d]
        nA = int64(0)
        nB = int64(0)
        nO = int64(0)
        r0 = i * B_r
        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        for e in range(t, B_r * d, threads):
            acc[e] = ZERO
        T_c = (N_k + B_c - 1) // B_c
        for j in range(T_c):
            c0 = j * B_c
            if banded and c0 - last > hi:
                break
            cols = min(B_c, N_k - c0)
            if banded and not tile_in_band(r0, last, c0, c0 + cols - 1, lo, hi):
                continue
            if has_mask and mask[i, j] == 0:
                continue
            cuda.syncthreads()
            for e in range(t, rows * cols, threads):    # A_ij (P_ij or dS_ij)
                if dropout:                             # P_ij o Z_ij / (1 - p)
                    w = ZERO
                    if zm[z, r0 + e // cols, c0 + e % cols] != 0:
                        w = ld(a_hbm[z, r0 + e // cols, c0 + e % cols]) * rp
                    As[(e // cols) * B_c + e % cols] = st(w)
                else:
                    As[(e // cols) * B_c + e % cols] = a_hbm[z, r0 + e // cols, c0 + e % cols]
                nA += 1
            for e in range(t, cols * d, threads):       # B_j (V_j or K_j)
                Bs[e] = bt[zk, c0 + e // d, e % d]
                nB += 1
            cuda.syncthreads()
            for e in range(t, rows * d, threads):   # each thread owns the same e every j
                r = e // d
                x = e % d
                s = ZERO
                for c in range(cols):
                    s += ld(As[r * B_c + c]) * ld(Bs[c * d + x])
                acc[e] += s
        for e in range(t, rows * d, threads):       # write Out_i once
            out[z, r0 + e // d, e % d] = st(scale * acc[e])
            nO += 1
        if count:
            add_count(counters, IA, READ, nA)
            add_count(counters, IB, READ, nB)
            add_count(counters, IOUT, WRITE, nO)
            if dropout:
                add_count(counters, IZ, READ, nA)

    body = cuda.jit(device=True, inline=True)(body)
    if dropout:
        def kernel(a_hbm, bt, out, scale, mask, N, N_k, lo, hi, H, G, counters, zm, rp):
            body(a_hbm, bt, out, scale, mask, N, N_k, lo, hi, H, G, counters, zm, rp)
    else:
        def kernel(a_hbm, bt, out, scale, mask, N, N_k, lo, hi, H, G, counters):
            body(a_hbm, bt, out, scale, mask, N, N_k, lo, hi, H, G, counters, a_hbm, ONE)

    return kernel, kernel_name(prefix, Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal,
                               window=window, mask=has_mask, dropout=dropout, count=count,
                               t=threads)


def pv_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, window=False,
              dropout=False):
    """O = P V, one block per query block: Kernel(p, v, o, scale=1, mask, N, N_k, lo, hi,
    H, G, counters [, zm, rp with dropout: O = (P o Z/(1-p)) V]); grid (T_r, instances)."""
    return rowblock_product_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads,
                                   "std_PV", (T["P"], T["V"], T["O"]), window, dropout)


def shared_bytes(B_r, B_c, d, dt) -> int:
    """Dynamic shared memory of the S and PV kernels (bytes) = iosim's footprint."""
    return sram_footprint_bytes("standard", B_r, B_c, d, dt)


from iosim.launch.forward.standard import softmax_threads  # the launch plan: iosim.launch


def run(q3, k3, v3, o3, s3, p3, scale, N, H, G, mask, active, counters, *, B_r, B_c, dt,
        causal, count, threads, N_k=None, window=(-1, -1), z3=None, dropout=None):
    """Launch the three standard kernels on 3-D device views; writes s3, p3, o3.
    dropout: None, or (dropout_p, seed, offset) with p > 0: the softmax kernel also
    writes the keep mask into z3 (instances, N, N_k) uint8, the PV kernel reads it.

    q3, o3: (instances, N, d); k3, v3: (kv instances, N_k, d) (N_k default N); s3, p3:
    (instances, N, N_k). active: host boolean (T_r, T_c) of active tiles
    (iosim.active_tiles, band and block mask). window=(left, right) as iosim.Problem.
    """
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    d = q3.shape[2]
    inst = q3.shape[0]
    has_mask = mask is not None
    mk = mask if has_mask else dummy_mask()
    shmem = shared_bytes(B_r, B_c, d, dt)
    tiles = np.argwhere(active).astype(np.int32)
    if len(tiles):
        kS = s_kernel(B_r, B_c, d, dt, causal, count, threads, windowed)
        launch(kS, (len(tiles), inst), threads, shmem, q3, k3, s3, cuda.to_device(tiles),
               np.float32(scale), np.int64(N), np.int64(N_k), lo, hi, np.int64(H),
               np.int64(G), counters)
    drop = bool(dropout and dropout[0] > 0)
    key0, key1, off, thr, rp = _philox.kernel_args(*(dropout or ()))
    ts = softmax_threads(N_k, threads)
    kSM = softmax_kernel(B_r, B_c, causal, has_mask, count, ts, windowed, drop, False, dt)
    launch(kSM, (N, inst), ts, 4 * N_k, s3, p3, mk, np.int64(N), np.int64(N_k), lo, hi,
           counters, *((z3, key0, key1, off, thr) if drop else ()))
    kPV = pv_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, windowed, drop)
    launch(kPV, (-(-N // B_r), inst), threads, shmem, p3, v3, o3, np.float32(1.0), mk,
           np.int64(N), np.int64(N_k), lo, hi, np.int64(H), np.int64(G), counters,
           *((z3, rp) if drop else ()))
