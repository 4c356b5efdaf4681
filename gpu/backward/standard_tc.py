"""The standard attention backward (Algorithm 3 of Dao et al. 2022, arXiv 2205.14135 v2,
Appendix B) for fp16 on the tensor cores.

Same schedule, hence EXACTLY the same HBM traffic and ledger, as `gpu.backward.standard`
(and `iosim.backward.standard_backward`): five kernels through HBM, launched in this order,
each reading and writing what the plain kernel of its line does (that module's docstring
has the counts):

  line 1  `std_tc_bwd_dV`, one block per (key block j, instance), warp w owning key rows
          16 w .. 16 w + 15: for each active query block i read P_ij (B_r x B_c) and dO_i
          (double-buffered cp.async, rows / columns past N zero-filled, not counted);
          dV_j += P_ij^T dO_i on the tensor cores, P_ij^T's A fragments read from the
          stored [query][key] tile by ldmatrix.trans (gpu/mma.cuh `tc_ab_smem_t` with A
          stored transposed, accumulating); write dV_j once (16-byte stores).
  line 2  `std_tc_bwd_dP`: gpu.forward.standard_tc's tile kernel (S = scale Q K^T) with
          A = dO, B = V, scale 1, unmasked: whole tiles dP_ij = dO_i V_j^T.
  line 3  `std_tc_bwd_dS`, one block per (query row, instance): read P and dP over the
          row's active entries once (16-byte cp.async into two fp16 rows in shared
          memory), D_r = sum P dP (float32; warp shuffles, then one float per warp);
          write dS = P (dP - D_r) over the same entries (16-byte stores).
  line 4  `std_tc_bwd_dQ`: gpu.forward.standard_tc's row-block kernel (O = P V) with
          A = dS, B = K: dQ_i = scale sum_j dS_ij K_j.
  line 5  `std_tc_bwd_dK`: line 1's kernel with X = dS, Y = Q: dK_j = scale sum_i dS_ij^T Q_i.

Dropout (`run(..., z3=, dropout=(p, seed, offset))`, p > 0; z3 the forward's keep mask):
as the plain kernels, lines 1 and 2 read Z: line 1's dropout build multiplies each landed
P_ij tile in shared memory by Z/(1-p) before its product, line 2's multiplies the staged
dP_ij tile before its stores (gpu.forward.standard_tc.tile_dropper): + 2 RCA reads of Z
(iosim.backward). Without dropout the kernels keep their arguments and code.

Grouped K/V heads: as the plain kernels (each query head writes its own dK_h, dV_h; the
caller sums groups). Non-finite inputs: every kernel multiplies every entry of every active
tile (no product is skipped), so NaN spreads exactly as in the plain kernels.

Registers (ptxas -v, sm_90, no spills), default tiling 128 x 64: d = 64: dV / dK 158,
dP 48, dS 32, dQ 94; d = 128: dV / dK 170, dP 50, dS 32, dQ 166. Not yet timed on a GPU
(scripts/standard_tc_probe.py).

Shared memory of the column-block kernel (4-byte words; rows padded by 8 halves): 2 x X_ij
B_r x (B_c + 8) | 2 x Y_i B_r x (d + 8) halves; then dV_j / dK_j B_c x (d + 8).
fp16 only; d a multiple of 16 up to 128; B_r and B_c each 16 x warps (warps 1, 2, 4, 8):
the forward's kernels take B_r = 16 x warps, line 1 and 5 take B_c = 16 x warps. The CUDA
simulator cannot run the linked C++: without a GPU these kernels are built, not run.
"""
from __future__ import annotations

import functools
import os

import numpy as np
from numba import cuda, float32, int64, uint32

from .. import _philox, _tc
from .._launch import (READ, SIM, WRITE, ZERO, T, add_count, dummy_mask, kernel_name, launch,
                       specialisation)
from ..forward import standard_tc as fwd
from ..forward.standard_tc import ALIGN, EIGHT, F16

CU_PATH = os.path.join(os.path.dirname(__file__), "standard_tc.cu")
WARPS = fwd.WARPS
IQ, IK, IV, IP, IdO = T["Q"], T["K"], T["V"], T["P"], T["dO"]
IdP, IdS, IdQ, IdK, IdV = T["dP"], T["dS"], T["dQ"], T["dK"], T["dV"]


# the launch geometry (which tilings run, threads, shared-memory layout): iosim.launch
from iosim.launch.backward.standard_tc import (colblock_layout, default_tiling, plan_error,
                                              shared_bytes)


def supports(B_r: int, B_c: int, d: int, dt: str = "fp16", N: int | None = None,
             smem_limit=None) -> bool:
    """True if these kernels run (B_r, B_c, d, dt) (and the dS rows of N) here: a GPU."""
    if SIM or plan_error(B_r, B_c, d, dt) is not None:
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    need = shared_bytes(B_r, B_c, d)
    if N is not None:
        need = max(need, fwd.row_bytes(N, 2))
    return need <= smem_limit


@functools.lru_cache(maxsize=None)
def externs(d: int, B_r: int) -> dict:
    """The C++ entry points (standard_tc.cu) for (d, B_r), declared to Numba."""
    from numba.cuda import types as nb
    pu, pf, i32, i64 = nb.CPointer(nb.uint32), nb.CPointer(nb.float32), nb.int32, nb.int64
    sigs = dict(atb=i32(pf, pu, i32, i32, i32, i32), store_o=i32(pu, i32, i32, pf),
                cp16=i32(pu, i32, pu, i64, i32), st16=i32(pu, i64, pu, i32),
                cp_commit=i32(), cp_wait1=i32(), cp_wait0=i32())
    src = _tc.source(CU_PATH, f"STDBWDTC_INSTANTIATE({d}, {B_r})")
    return _tc.declare(src, f"std_bwd_tc_d{d}_br{B_r}.cu", "stdbwdtc_", f"_d{d}_br{B_r}",
                       sigs)


# ---------------------------------------------------------------------------------------
# Lines 1 and 5: dV_j = sum_i P_ij^T dO_i,  dK_j = scale sum_i dS_ij^T Q_i
# ---------------------------------------------------------------------------------------
@specialisation
def colblock_kernel(which, B_r, B_c, d, causal, has_mask, vec, count, dropout=False):
    """Kernel(x, y, out, mul, mask, N, counters); grid (T_c, instances), 32 B_c / 16 threads,
    `colblock_layout(...)["bytes"]` dynamic shared bytes. dropout=True (which='dV', line
    1 with the forward's keep mask: dV = (P o Z/(1-p))^T dO): Kernel(..., counters, zm,
    rp), each landed X_ij tile multiplied by Z/(1-p) in shared memory before its product
    (gpu.forward.standard_tc.tile_dropper; zm (instances, N, N) uint8, counted under "Z").

    which='dV' (line 1): x = P, y = dO, mul = 1, out = dV_h; which='dK' (line 5): x = dS,
    y = Q, mul = scale, out = dK_h. x: (instances, N, N); y, out: (instances, N, d); fp16.
    out_j = mul * sum over active i of x_ij^T y_i (float32 accumulators)."""
    err = plan_error(B_r, B_c, d, "fp16")
    if err:
        raise ValueError(err)
    X = externs(d, B_r)
    atb, store_o, cp16, st16 = X["atb"], X["store_o"], X["cp16"], X["st16"]
    cp_commit, cp_wait1, cp_wait0 = X["cp_commit"], X["cp_wait1"], X["cp_wait0"]
    ptr, ptr32 = _tc.ptr, _tc.ptr32
    NW = B_c // 16
    THREADS = 32 * NW
    lay = colblock_layout(B_r, B_c, d)
    SH, SW, XSH = lay["SH"], lay["SW"], lay["XSH"]
    XO, XB, YO, YB = lay["XO"], lay["XB"], lay["YO"], lay["YB"]
    DW = d // 2
    CPR = d // 8
    YCH = B_r * CPR
    LY = -(-YCH // THREADS)
    YDIV = YCH % THREADS == 0
    load_tile = fwd.nxn_tile_loader(B_r, B_c, THREADS, vec, cp16)   # X_ij
    NOF = d // 2
    IX, IY, IOUT = (IP, IdO, IdV) if which == "dV" else (IdS, IQ, IdK)
    IZ = T["Z"]
    drop_tile = fwd.tile_dropper(THREADS, XSH)

    @cuda.jit(device=True, inline=True)
    def next_tile(i, T_r, mask, j):
        """The first active query block >= i for key block j (T_r if none); the causal
        loop starts at j's diagonal block, so every later block is active causally."""
        while i < T_r:
            if has_mask and mask[i, j] == 0:
                i += 1
                continue
            return i
        return T_r

    @cuda.jit(device=True, inline=True)
    def issue(smp, sh, x, xp, yp, z, c0, cols, i, N, t, buf):
        """Start the copies of X_ij and Y_i into buffer `buf` (zeros past N); returns the
        elements of X and of Y this thread requested."""
        nY = int64(0)
        r0 = i * B_r
        rows = min(B_r, N - r0)
        nX = load_tile(smp, sh, x, xp, z, r0, rows, c0, cols, N, t, XO + buf * XB)
        ybase = (int64(z) * N + r0) * DW
        for it in range(LY):
            e = t + it * THREADS
            if YDIV or e < YCH:
                r = e // CPR
                xx = (e % CPR) * 4
                ok = r < rows
                cp16(smp, YO + buf * YB + r * SW + xx, yp, ybase + r * DW + xx, ok)
                if ok:
                    nY += EIGHT
        return nX, nY

    def kernel(x, y, out, mul, mask, N, counters):
        j = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        w = t >> 5
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        sh = cuda.shared.array(0, F16, alignment=ALIGN)
        smp = ptr(sm)
        xp = ptr32(x)
        yp = ptr32(y)
        acc = cuda.local.array(NOF, float32)
        nX = int64(0)
        nY = int64(0)
        nW = int64(0)
        c0 = j * B_c
        cols = min(B_c, N - c0)
        T_r = (N + B_r - 1) // B_r
        for e in range(NOF):
            acc[e] = ZERO
        i = next_tile(c0 // B_r if causal else 0, T_r, mask, j)
        buf = 0
        if i < T_r:
            a1, a2 = issue(smp, sh, x, xp, yp, z, c0, cols, i, N, t, buf)
            nX += a1
            nY += a2
        cp_commit()
        while i < T_r:
            inext = next_tile(i + 1, T_r, mask, j)
            if inext < T_r:                         # next tile's copies fly meanwhile
                a1, a2 = issue(smp, sh, x, xp, yp, z, c0, cols, inext, N, t, 1 - buf)
                nX += a1
                nY += a2
            cp_commit()
            cp_wait1()
            cuda.syncthreads()
            if dropout:                             # X_ij o Z_ij / (1 - p), in place
                drop_tile(sh, 2 * (XO + buf * XB), zm, z, i * B_r, min(B_r, N - i * B_r),
                          c0, cols, rp, t)
                cuda.syncthreads()
            # the warp's 16 key rows: columns 16 w .. of the stored tile (word 8 w)
            atb(ptr(acc), smp, XO + buf * XB + 8 * w, XSH, YO + buf * YB, SH)
            cuda.syncthreads()
            buf = 1 - buf
            i = inext
        cp_wait0()
        for e in range(NOF):
            acc[e] *= mul
        store_o(smp, 16 * w * SW, SH, ptr(acc))
        cuda.syncthreads()
        op = ptr32(out)
        obase = (int64(z) * N + c0) * DW
        for e in range(t, cols * CPR, THREADS):
            c = e // CPR
            xx = (e % CPR) * 4
            st16(op, obase + c * DW + xx, smp, c * SW + xx)
            if count:
                nW += EIGHT
        if count:
            add_count(counters, IX, READ, nX)
            add_count(counters, IY, READ, nY)
            add_count(counters, IOUT, WRITE, nW)
            if dropout:                             # one Z per entry of X read
                add_count(counters, IZ, READ, nX)

    if dropout:     # + zm, rp (the build without dropout: this very code, unchanged)
        kernel = _philox.with_args(kernel, ("zm", "rp"))

    return kernel, kernel_name(f"std_tc_bwd_{which}", Br=B_r, Bc=B_c, d=d, dt="fp16",
                               causal=causal, mask=has_mask, vec=vec, dropout=dropout,
                               count=count)


def dv_kernel(B_r, B_c, d, causal, has_mask, vec, count, dropout=False):
    return colblock_kernel("dV", int(B_r), int(B_c), int(d), bool(causal), bool(has_mask),
                           bool(vec), bool(count), bool(dropout))


def dk_kernel(B_r, B_c, d, causal, has_mask, vec, count):
    return colblock_kernel("dK", int(B_r), int(B_c), int(d), bool(causal), bool(has_mask),
                           bool(vec), bool(count))


def dp_kernel(B_r, B_c, d, vec, count, dropout=False):
    """Line 2, dP = dO V^T per active tile (the forward's tile kernel, unmasked);
    dropout: dP = (dO V^T) o Z/(1-p), Z read from the forward's keep mask."""
    return fwd.tile_kernel(int(B_r), int(B_c), int(d), False, bool(vec), bool(count),
                           "std_tc_bwd_dP", (IdO, IV, IdP), bool(dropout))


def dq_kernel(B_r, B_c, d, causal, has_mask, vec, count):
    """Line 4, dQ = scale dS K (the forward's row-block kernel)."""
    return fwd.rowblock_kernel(int(B_r), int(B_c), int(d), bool(causal), bool(has_mask),
                               bool(vec), bool(count), "std_tc_bwd_dQ", (IdS, IK, IdQ))


# ---------------------------------------------------------------------------------------
# Line 3: dS = P o (dP - D), D = rowsum(P o dP), one block per query row
# ---------------------------------------------------------------------------------------
@specialisation
def ds_kernel(B_r, B_c, causal, has_mask, vec, count, threads):
    """Kernel(p, dp, ds, mask, N, counters); grid (N, instances), `threads` threads
    (`gpu.forward.standard_tc.row_threads`), `row_bytes(N, 2)` dynamic shared bytes: the
    row of P at half 0, of dP at half NP = N rounded up to 8."""
    X = fwd.externs(16, 16)
    cp16, st16, cp_commit, cp_wait0 = X["cp16"], X["st16"], X["cp_commit"], X["cp_wait0"]
    ptr, ptr32 = _tc.ptr, _tc.ptr32
    W = 8 if vec else 1
    RED = fwd.red_size(threads)
    chunk_range, chunk_on, _bmax, block_sum = fwd.row_helpers(B_r, B_c, causal, has_mask,
                                                              vec, threads)

    def kernel(p, dp, ds, mask, N, counters):
        r = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        sh = cuda.shared.array(0, F16, alignment=ALIGN)
        reds = cuda.shared.array(RED, float32)
        smp = ptr(sm)
        NP = (N + 7) // 8 * 8                       # dP's row starts here (halves)
        nR = int64(0)
        i = r // B_r
        nch = chunk_range(r, N)
        rbase = (int64(z) * N + r) * (N // 2)
        pp = ptr32(p)
        dpp = ptr32(dp)
        for e in range(t, nch, threads):            # read P, dP over the active entries
            if chunk_on(mask, i, e):
                if vec:
                    cp16(smp, 4 * e, pp, rbase + 4 * e, 1)
                    cp16(smp, NP // 2 + 4 * e, dpp, rbase + 4 * e, 1)
                else:
                    sh[e] = p[z, r, e]
                    sh[NP + e] = dp[z, r, e]
                nR += W
        if vec:
            cp_commit()
            cp_wait0()
        acc = ZERO
        for e in range(t, nch, threads):
            if chunk_on(mask, i, e):
                for u in range(W):
                    acc += float32(sh[e * W + u]) * float32(sh[NP + e * W + u])
        D = block_sum(acc, reds, lane, w)           # D_r = sum_c P_rc dP_rc
        dsp = ptr32(ds)
        for e in range(t, nch, threads):            # write dS over the same entries
            if chunk_on(mask, i, e):
                for u in range(W):
                    v = float32(sh[e * W + u]) * (float32(sh[NP + e * W + u]) - D)
                    if vec:
                        sh[e * W + u] = v
                    else:
                        ds[z, r, e] = v
                if vec:
                    st16(dsp, rbase + 4 * e, smp, 4 * e)
        if count:
            add_count(counters, IP, READ, nR)
            add_count(counters, IdP, READ, nR)
            add_count(counters, IdS, WRITE, nR)

    return kernel, kernel_name("std_tc_bwd_dS", Br=B_r, Bc=B_c, causal=causal, mask=has_mask,
                               vec=vec, count=count, t=threads)


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------
def run(q3, k3, v3, do3, p3, dp3, ds3, dq3, dk3, dv3, scale, N, H, G, mask, active,
        counters, *, B_r, B_c, dt, causal, count, threads=None, z3=None, dropout=None):
    """Launch Algorithm 3's five kernels, lines 1..5 in order, on 3-D fp16 device views:
    the arguments of `gpu.backward.standard.run` (threads accepted and ignored: one warp
    per 16 rows of the tile kernels, `row_threads(N)` in the dS kernel). dp3, ds3:
    (instances, N, N) scratch; dk3, dv3 receive each query head's dK_h, dV_h.
    dropout: None, or (dropout_p, seed, offset) with p > 0 and z3 the forward's keep mask
    (instances, N, N) uint8: lines 1 (dV) and 2 (dP) read it, as the plain kernels."""
    d = q3.shape[2]
    err = plan_error(B_r, B_c, d, dt)
    if err:
        raise ValueError(f"standard_tc backward: {err}")
    for name, arr in (("q", q3), ("k", k3), ("v", v3), ("do", do3), ("p", p3), ("dp", dp3),
                      ("ds", ds3), ("dq", dq3), ("dk", dk3), ("dv", dv3)):
        _tc.check_aligned("standard_tc backward", name, arr)
    inst = q3.shape[0]
    vec = fwd._vec(N)
    has_mask = mask is not None
    mk = mask if has_mask else dummy_mask()
    causal, count = bool(causal), bool(count)
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    n, h, g = np.int64(N), np.int64(H), np.int64(G)
    cb = colblock_layout(B_r, B_c, d)["bytes"]
    tc_, tr_ = 32 * (B_c // 16), 32 * (B_r // 16)
    drop = bool(dropout and dropout[0] > 0)
    if drop and z3 is None:
        raise ValueError("standard_tc backward: dropout needs z3, the forward's keep mask")
    zargs = (z3, _philox.kernel_args(*dropout)[4]) if drop else ()
    # line 1: dV = P^T dO (dropout: (P o Z/(1-p))^T dO)
    launch(dv_kernel(B_r, B_c, d, causal, has_mask, vec, count, drop), (T_c, inst), tc_, cb,
           p3, do3, dv3, np.float32(1.0), mk, n, counters, *zargs)
    # line 2: dP = dO V^T, active tiles only (dropout: o Z/(1-p))
    n_act, tiles = fwd.active_list(np.asarray(active, dtype=bool))
    if n_act:
        launch(dp_kernel(B_r, B_c, d, vec, count, drop), (n_act, inst), tr_,
               fwd.tile_layout(B_r, B_c, d)["bytes"], do3, v3, dp3, tiles,
               np.float32(1.0), n, h, g, counters, *zargs)
    # line 3: dS = P o (dP - rowsum(P o dP))
    ts = fwd.row_threads(N, vec)
    launch(ds_kernel(int(B_r), int(B_c), causal, has_mask, vec, count, ts), (N, inst), ts,
           fwd.row_bytes(N, 2), p3, dp3, ds3, mk, n, counters)
    # line 4: dQ = scale dS K
    launch(dq_kernel(B_r, B_c, d, causal, has_mask, vec, count), (T_r, inst), tr_,
           fwd.rowblock_layout(B_r, B_c, d)["bytes"], ds3, k3, dq3, np.float32(scale), mk,
           n, h, g, counters)
    # line 5: dK = scale dS^T Q
    launch(dk_kernel(B_r, B_c, d, causal, has_mask, vec, count), (T_c, inst), tc_, cb,
           ds3, q3, dk3, np.float32(scale), mk, n, counters)


def backward_arrays(q, k, v, do, P, *, causal=False, scale=None, block_rows=None,
                    block_cols=None, block_mask=None, count_traffic=False, Z=None,
                    dropout_p=0.0, dropout_seed=0, dropout_offset=0):
    """((dq, dk, dv), ledger) for NumPy fp16 q, do (batch, heads, N, d), k, v (batch,
    kv_heads, N, d) and the forward's P (batch, heads, N, N; e.g. from
    gpu.forward.standard_tc.forward_arrays with the same tiling): a host wrapper of `run`
    (plus gpu.backward.flash's group-sum pass when kv_heads < heads) for tests and
    scripts. Gradients and dP, dS are NaN-poisoned first; ledger: an iosim BackwardLedger
    of the kernels' own counts, or None. dropout_p > 0: Z is the forward's keep mask
    (batch, heads, N, N) uint8 (forward_arrays(..., dropout_p=...))."""
    import iosim
    from .._launch import filled
    from ._common import _counters_to_ledger, _flat_launch, _new_counters, group_sum_kernel
    B, H, N, d = q.shape
    Hk = k.shape[1]
    t = default_tiling(d, causal)
    B_r = t["B_r"] if block_rows is None else int(block_rows)
    B_c = t["B_c"] if block_cols is None else int(block_cols)
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    problem = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype="fp16",
                            causal=causal, block_mask=block_mask, dropout_p=dropout_p)
    tiling = iosim.Tiling(B_r, B_c)
    active = iosim.active_tiles(problem, tiling)
    mask_dev = None if block_mask is None else cuda.to_device(
        np.ascontiguousarray(problem.block_mask, dtype=np.uint8))
    I, Ik = B * H, B * Hk
    dev = lambda x, n: cuda.to_device(np.ascontiguousarray(x, np.float16).reshape(n, N, -1))
    q3, do3, p3 = dev(q, I), dev(do, I), dev(P, I)
    k3, v3 = dev(k, Ik), dev(v, Ik)
    dp3, ds3 = (filled((I, N, N), np.float16, np.nan) for _ in range(2))
    dq3, dk_h, dv_h = (filled((I, N, d), np.float16, np.nan) for _ in range(3))
    counters = _new_counters(count_traffic)
    drop = {}
    if dropout_p:
        if Z is None:
            raise ValueError(f"backward_arrays: dropout_p={dropout_p} needs Z, the forward's "
                             f"keep mask")
        drop = dict(z3=cuda.to_device(np.ascontiguousarray(Z, np.uint8).reshape(I, N, N)),
                    dropout=(float(dropout_p), int(dropout_seed), int(dropout_offset)))
    run(q3, k3, v3, do3, p3, dp3, ds3, dq3, dk_h, dv_h, scale, N, H, H // Hk, mask_dev,
        active, counters, B_r=B_r, B_c=B_c, dt="fp16", causal=bool(causal),
        count=bool(count_traffic), **drop)
    if Hk == H:
        dk3, dv3 = dk_h, dv_h
    else:
        dk3, dv3 = (filled((Ik, N, d), np.float16, np.nan) for _ in range(2))
        _flat_launch(group_sum_kernel("fp16", bool(count_traffic)), Ik * N * d,
                     dk_h.reshape(I, N * d), dv_h.reshape(I, N * d), dk3.reshape(Ik, N * d),
                     dv3.reshape(Ik, N * d), np.int64(H // Hk), counters)
    grads = (dq3.copy_to_host().reshape(B, H, N, d), dk3.copy_to_host().reshape(B, Hk, N, d),
             dv3.copy_to_host().reshape(B, Hk, N, d))
    led = (_counters_to_ledger(counters, "standard", problem, tiling) if count_traffic
           else None)
    return grads, led


def signatures():
    """Argument types of the backward's own kernels (dV / dK, dS) for compiling without
    a GPU; lines 2 and 4 are the forward's (gpu.forward.standard_tc.signatures)."""
    from numba.cuda import types as nb
    W = nb.Array(nb.float16, 3, "C")
    M = nb.Array(nb.uint8, 2, "C")
    C = nb.Array(nb.int64, 2, "C")
    return dict(colblock=(W, W, W, nb.float32, M, nb.int64, C), dS=(W, W, W, M, nb.int64, C),
                # line 1's dropout build: + the forward's keep mask zm, rp
                colblock_dropout=(W, W, W, nb.float32, M, nb.int64, C,
                                  nb.Array(nb.uint8, 3, "C"), nb.float32))


def linked_ptx(B_r, B_c, d, causal=False, has_mask=False, count=False, vec=True, N=4096,
               cc=(9, 0)) -> dict:
    """{'dV', 'dP', 'dS', 'dQ', 'dK'}: the linked PTX of each of the five kernels of one
    specialisation, built without a GPU (gpu._tc.linked_ptx)."""
    fs = fwd.signatures()
    bs = signatures()
    kerns = dict(dV=(dv_kernel(B_r, B_c, d, causal, has_mask, vec, count), bs["colblock"]),
                 dP=(dp_kernel(B_r, B_c, d, vec, count), fs["S"]),
                 dS=(ds_kernel(int(B_r), int(B_c), bool(causal), bool(has_mask), bool(vec),
                               bool(count), fwd.row_threads(N, vec)), bs["dS"]),
                 dQ=(dq_kernel(B_r, B_c, d, causal, has_mask, vec, count), fs["PV"]),
                 dK=(dk_kernel(B_r, B_c, d, causal, has_mask, vec, count), bs["colblock"]))
    return {k: _tc.linked_ptx(kern, sig, cc) for k, (kern, sig) in kerns.items()}


__all__ = ["plan_error", "supports", "default_tiling", "colblock_layout", "shared_bytes",
           "externs", "colblock_kernel", "dv_kernel", "dk_kernel", "dp_kernel", "dq_kernel",
           "ds_kernel", "run", "backward_arrays", "signatures", "linked_ptx"]
