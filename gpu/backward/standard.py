"""The standard attention backward (Algorithm 3 of Dao et al. 2022, arXiv 2205.14135 v2,
Appendix B) as five kernels through HBM, running iosim.backward.standard_backward's
schedule tile by tile, so that the instrumented build's own counts equal
`iosim.backward_closed_form('standard', ...)`.

Algorithm 3 (Require: Q, K, V, dO (N x d), P (N x N) in HBM), one kernel per line, launched
in this order (the model's passes 1..5):

  line 1  `std_bwd_dV`, one block per (key block j, instance): for each active query
          block i read P_ij (rows_i x cols_j) and dO_i (rows_i x d); dV_j += P_ij^T dO_i
          in float32 on chip; write dV_j (cols_j x d) once (0 if no i is active).
  line 2  `std_bwd_dP`, one block per (active tile (i, j), instance): read dO_i, V_j;
          write the whole tile dP_ij = dO_i V_j^T (rows_i x cols_j; causally masked
          entries too: P is 0 there, so their dS is 0).
  line 3  `std_bwd_dS`, one block per (query row r, instance): read P and dP over the
          row's entries in the active tiles of its query block, once each, keeping them
          on chip (2 N elements of the problem dtype in shared memory);
          D_r = sum_c P_rc dP_rc (float32); write dS_rc = P_rc (dP_rc - D_r) over the
          same entries. A row with no active tile reads and writes nothing.
  line 4  `std_bwd_dQ`, one block per (query block i, instance): for each active key block
          j read dS_ij, K_j; write dQ_i = scale sum_j dS_ij K_j once (0 if none active).
  line 5  `std_bwd_dK`, one block per (key block j, instance): for each active query
          block i read dS_ij, Q_i; write dK_j = scale sum_i dS_ij^T Q_i once.
  Dropout (dropout_p = p > 0; keep mask Z stored by the forward, uint8): line 1 reads
  Z_ij with P_ij and uses P o Z/(1-p); line 2 reads Z_ij and writes dP = (dO V^T) o
  Z/(1-p): + 2 RCA reads of Z (iosim.backward); lines 3-5 are unchanged.
  (line 6 returns dQ, dK, dV.) The paper's Algorithm 3 has no softmax scale; the model
  and these kernels use S = scale Q K^T, hence the factor scale in lines 4 and 5.

Grouped K/V heads (kv_heads < heads): every query head runs all five kernels with its
group's K_j, V_j and writes its own dK_h, dV_h; gpu.backward then launches the group-sum
pass (`bwd_group_sum`), as iosim counts it.

Tensors: P (the forward's, an input), dP, dS: (instances, N, N) in the problem dtype;
Q, dO, dQ, dK_h, dV_h: (instances, N, d); K, V: (batch * kv_heads, N, d). float32
arithmetic on chip, values stored in the problem dtype (fp32 or fp16). Only the entries of
active tiles of P, dP, dS are read or written; the others are never touched (dP and dS
keep their NaN poison there).

Counts, per instance, in elements (n_A active tiles; RA = sum of their rows, CA = sum of
their columns, RCA = sum of rows x columns): P read 2 RCA (lines 1, 3); dP written RCA
(line 2), read RCA (line 3); dS written RCA (line 3), read 2 RCA (lines 4, 5); dO read
2 RA d (lines 1, 2); V read CA d; K read CA d; Q read RA d; dV, dQ, dK written N d each.

Shared memory (bytes; one dynamic buffer per kernel, float32 tiles first):
  dV, dK kernels:  float32 acc (B_c*d) | dtype P_ij or dS_ij (B_r*B_c) | dO_i or Q_i (B_r*d)
  dQ kernel:       float32 acc (B_r*d) | dtype dS_ij (B_r*B_c) | K_j (B_c*d)
  dP kernel:       dtype dO_i (B_r*d) | V_j (B_c*d)
  `std_bwd_shared_bytes` is the largest of these; the dS kernel takes 2 N elements of the
  problem dtype (its row of P and of dP), plus a static `threads` float32 reduction array.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int64

from .._launch import (NB_DTYPE, NP_DTYPE, ONE, READ, WRITE, ZERO, T, add_count, kernel_name,
                      dummy_mask, launch, loader, specialisation, storer)
from .. import _philox
from .._torch_cpu import takes_torch_cpu
from ..forward._band import band_args, tile_in_band
from ..forward.standard import rowblock_product_kernel, tile_product_kernel

#: Counter rows: the same indices as gpu.backward.BT (BW_TENSORS starts with _launch.T).
IQ, IK, IV, IP, IdO = T["Q"], T["K"], T["V"], T["P"], T["dO"]
IdP, IdS, IdQ, IdK, IdV = T["dP"], T["dS"], T["dQ"], T["dK"], T["dV"]


# the launch geometry (shared memory, threads): iosim.launch
from iosim.launch.backward.standard import ds_shared_bytes, ds_threads, std_bwd_shared_bytes
# Lines 1 and 5: dV_j = sum_i P_ij^T dO_i,  dK_j = scale sum_i dS_ij^T Q_i
# ---------------------------------------------------------------------------------------
@specialisation
def tposed_kernel(which, B_r, B_c, d, dt, causal, has_mask, count, threads, dropout=False,
                  window=False):
    """Kernel (x, y, out, mul, mask, N, N_k, lo, hi, counters); grid (T_c, instances), T_c
    key blocks of N_k. dropout=True (which='dV'): Kernel (x, y, out, mul, mask, N, N_k, lo,
    hi, counters, zm, rp), x_ij dropped as it is loaded (x o Z/(1-p), Z read from zm
    (instances, N, N_k) uint8, counted under "Z").

    which='dV' (Algorithm 3 line 1): x = P, y = dO, mul = 1, out = dV_h.
    which='dK' (line 5):             x = dS, y = Q, mul = scale, out = dK_h.
    x: (instances, N, N_k); y: (instances, N, d); out: (instances, N_k, d); all in the
    problem dtype. out_j = mul * sum over active i of x_ij^T y_i, accumulated in float32.
    causal or window: tiles with no pair in the band lo <= c - r <= hi (gpu.forward._band)
    are skipped (read only then).
    """
    DT = NB_DTYPE[dt]
    ldx, stx = loader(dt), storer(dt)      # element -> float32, float32 -> element
    X0 = B_c * d * 4 // NP_DTYPE[dt].itemsize   # input-dtype tiles after the float32 acc
    Y0 = X0 + B_r * B_c
    IX, IY, IOUT = (IP, IdO, IdV) if which == "dV" else (IdS, IQ, IdK)
    IZ = T["Z"]
    banded = causal or window

    def body(x_hbm, y, out, mul, mask, N, N_k, lo, hi, counters, zm, rp):
        j = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        sf = cuda.shared.array(0, float32)
        sx = cuda.shared.array(0, DT)
        acc = sf[0:B_c * d]
        Xs = sx[X0:Y0]
        Ys = sx[Y0:Y0 + B_r * d]
        nX = int64(0)
        nY = int64(0)
        nW = int64(0)
        c0 = j * B_c
        cols = min(B_c, N_k - c0)
        for e in range(t, B_c * d, threads):
            acc[e] = ZERO
        T_r = (N + B_r - 1) // B_r
        for i in range(T_r):
            r0 = i * B_r
            rows = min(B_r, N - r0)
            if banded and not tile_in_band(r0, r0 + rows - 1, c0, c0 + cols - 1, lo, hi):
                continue                            # inactive tile (outside the band)
            if has_mask and mask[i, j] == 0:
                continue
            cuda.syncthreads()                      # previous tile's Xs, Ys consumed
            for e in range(t, rows * cols, threads):    # load P_ij (dS_ij)
                if dropout:                             # P_ij o Z_ij / (1 - p)
                    w = ZERO
                    if zm[z, r0 + e // cols, c0 + e % cols] != 0:
                        w = ldx(x_hbm[z, r0 + e // cols, c0 + e % cols]) * rp
                    Xs[(e // cols) * B_c + e % cols] = stx(w)
                else:
                    Xs[(e // cols) * B_c + e % cols] = x_hbm[z, r0 + e // cols, c0 + e % cols]
                nX += 1
            for e in range(t, rows * d, threads):       # load dO_i (Q_i)
                Ys[e] = y[z, r0 + e // d, e % d]
                nY += 1
            cuda.syncthreads()
            for e in range(t, cols * d, threads):   # each thread owns the same e every i
                c = e // d
                x = e % d
                a = ZERO
                for r in range(rows):
                    a += ldx(Xs[r * B_c + c]) * ldx(Ys[r * d + x])
                acc[e] += a
        for e in range(t, cols * d, threads):       # write dV_j (dK_j) once
            out[z, c0 + e // d, e % d] = stx(mul * acc[e])
            nW += 1
        if count:
            add_count(counters, IX, READ, nX)
            add_count(counters, IY, READ, nY)
            add_count(counters, IOUT, WRITE, nW)
            if dropout:
                add_count(counters, IZ, READ, nX)

    body = cuda.jit(device=True, inline=True)(body)
    if dropout:
        def kernel(x_hbm, y, out, mul, mask, N, N_k, lo, hi, counters, zm, rp):
            body(x_hbm, y, out, mul, mask, N, N_k, lo, hi, counters, zm, rp)
    else:
        def kernel(x_hbm, y, out, mul, mask, N, N_k, lo, hi, counters):
            body(x_hbm, y, out, mul, mask, N, N_k, lo, hi, counters, x_hbm, ONE)

    return kernel, kernel_name(f"std_bwd_{which}", Br=B_r, Bc=B_c, d=d, dt=dt,
                               causal=causal, window=window, mask=has_mask, dropout=dropout,
                               count=count, t=threads)


# ---------------------------------------------------------------------------------------
# Line 2: dP_ij = dO_i V_j^T, one block per active tile
# ---------------------------------------------------------------------------------------
def dp_kernel(B_r, B_c, d, dt, count, threads, dropout=False):
    """Kernel dP(do, v, dp, tiles, scale=1, N, N_k, lo, hi, H, G, counters [, zm, rp]);
    grid (n_active, instances). The forward's tile product (gpu.standard.tile_product_kernel,
    which also computes S = scale Q K^T) with A = dO, B = V, Out = dP (instances, N, N_k),
    unmasked (lo, hi unread): whole tiles are written; dropout: dP = (dO V^T) o Z/(1-p),
    Z read from zm."""
    return tile_product_kernel(B_r, B_c, d, dt, False, count, threads, "std_bwd_dP",
                               (IdO, IV, IdP), False, dropout)



# ---------------------------------------------------------------------------------------
# Line 3: dS = P o (dP - D), D = rowsum(P o dP), one block per query row
# ---------------------------------------------------------------------------------------
@specialisation
def ds_kernel(B_r, B_c, dt, causal, has_mask, count, threads, window=False):
    """Kernel dS(p, dp, ds, mask, N, N_k, lo, hi, counters); grid (N, instances); dynamic
    shared memory 2 N_k elements of the problem dtype (`ds_shared_bytes`), static
    `threads` float32.

    p, dp, ds: (instances, N, N_k) problem dtype. Row r's entries are those of the active
    tiles (i, j) of its query block i = r // B_r (the forward softmax's rule: tiles with a
    pair in the band lo <= c - r <= hi when causal or window, and the block mask).
    """
    DT = NB_DTYPE[dt]
    ldx, stx = loader(dt), storer(dt)
    IP_, IdP_, IdS_ = IP, IdP, IdS
    banded = causal or window

    def kernel(p_hbm, dp_hbm, ds_hbm, mask, N, N_k, lo, hi, counters):
        r = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        sx = cuda.shared.array(0, DT)
        red = cuda.shared.array(threads, float32)
        Prow = sx[0:N_k]
        dProw = sx[N_k:2 * N_k]
        nR = int64(0)
        nW = int64(0)
        i = r // B_r
        first = i * B_r                             # this row's query block
        last = min((i + 1) * B_r, N) - 1
        T_c = (N_k + B_c - 1) // B_c
        acc = ZERO
        for j in range(T_c):                        # read P, dP over the active entries
            c0 = j * B_c
            if banded and not tile_in_band(first, last, c0, min(c0 + B_c, N_k) - 1, lo, hi):
                continue
            if has_mask and mask[i, j] == 0:
                continue
            for c in range(c0 + t, min(c0 + B_c, N_k), threads):
                pv = p_hbm[z, r, c]
                dpv = dp_hbm[z, r, c]
                Prow[c] = pv
                dProw[c] = dpv
                acc += ldx(pv) * ldx(dpv)
                nR += 1
        red[t] = acc
        cuda.syncthreads()
        D = ZERO                                    # D_r = sum_c P_rc dP_rc
        for u in range(threads):
            D += red[u]
        for j in range(T_c):                        # each thread revisits its own entries
            c0 = j * B_c
            if banded and not tile_in_band(first, last, c0, min(c0 + B_c, N_k) - 1, lo, hi):
                continue
            if has_mask and mask[i, j] == 0:
                continue
            for c in range(c0 + t, min(c0 + B_c, N_k), threads):
                ds_hbm[z, r, c] = stx(ldx(Prow[c]) * (ldx(dProw[c]) - D))
                nW += 1
        if count:
            add_count(counters, IP_, READ, nR)
            add_count(counters, IdP_, READ, nR)
            add_count(counters, IdS_, WRITE, nW)

    return kernel, kernel_name("std_bwd_dS", Br=B_r, Bc=B_c, dt=dt, causal=causal,
                               window=window, mask=has_mask, count=count, t=threads)


# ---------------------------------------------------------------------------------------
# Line 4: dQ_i = scale sum_j dS_ij K_j, one block per query block
# ---------------------------------------------------------------------------------------
def dq_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, window=False):
    """Kernel dQ(ds, k, dq, scale, mask, N, N_k, lo, hi, H, G, counters); grid (T_r,
    instances). The forward's row-block product (gpu.standard.rowblock_product_kernel,
    which also computes O = P V) with A = dS (instances, N, N_k), B = K, Out = dQ:
    dQ_i = scale sum_j dS_ij K_j over the active tiles of the band."""
    return rowblock_product_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads,
                                   "std_bwd_dQ", (IdS, IK, IdQ), window)


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------
def run(q3, k3, v3, do3, p3, dp3, ds3, dq3, dk3, dv3, scale, N, H, G, mask, active,
        counters, *, B_r, B_c, dt, causal, count, threads, z3=None, dropout=None, N_k=None,
        window=(-1, -1)):
    """Launch Algorithm 3's five kernels, lines 1..5 in order, on 3-D device views.

    q3, do3, p3, dq3 per query head (instances = batch * heads); k3, v3 per K/V head
    (N_k rows, default N); dk3, dv3 (instances, N_k, d); dp3, ds3: (instances, N, N_k)
    scratch (poisoned by the caller); dk3, dv3 receive each query head's own dK_h, dV_h
    (the caller sums groups). mask: device uint8 (T_r, T_c) or None; active: host boolean
    (T_r, T_c) (iosim.active_tiles: band and block mask). window=(left, right) as
    iosim.Problem (bottom-right aligned band, gpu.forward._band).
    dropout: None, or (dropout_p, seed, offset) with p > 0 and z3 the forward's keep mask
    (instances, N, N_k) uint8: lines 1 and 2 read it.
    """
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    drop = bool(dropout and dropout[0] > 0)
    zargs = (z3, _philox.kernel_args(*dropout)[4]) if drop else ()
    d = q3.shape[2]
    inst = q3.shape[0]
    has_mask = mask is not None
    mk = mask if has_mask else dummy_mask()
    shm = std_bwd_shared_bytes(B_r, B_c, d, dt)
    T_r, T_c = -(-N // B_r), -(-N_k // B_c)
    n, nk, h, g = np.int64(N), np.int64(N_k), np.int64(H), np.int64(G)
    flags = (bool(causal), has_mask, bool(count), threads)
    # line 1: dV = P^T dO
    launch(tposed_kernel("dV", B_r, B_c, d, dt, *flags, drop, windowed), (T_c, inst), threads,
           shm, p3, do3, dv3, np.float32(1.0), mk, n, nk, lo, hi, counters, *zargs)
    # line 2: dP = dO V^T, active tiles only
    tiles = np.argwhere(active).astype(np.int32)
    if len(tiles):
        launch(dp_kernel(B_r, B_c, d, dt, bool(count), threads, drop), (len(tiles), inst),
               threads, shm, do3, v3, dp3, cuda.to_device(tiles), np.float32(1.0), n, nk, lo,
               hi, h, g, counters, *zargs)
    # line 3: dS = P o (dP - rowsum(P o dP))
    ts = ds_threads(N_k, threads)
    launch(ds_kernel(B_r, B_c, dt, bool(causal), has_mask, bool(count), ts, windowed), (N, inst),
           ts, ds_shared_bytes(N_k, dt), p3, dp3, ds3, mk, n, nk, lo, hi, counters)
    # line 4: dQ = scale dS K
    launch(dq_kernel(B_r, B_c, d, dt, *flags, windowed), (T_r, inst), threads, shm,
           ds3, k3, dq3, np.float32(scale), mk, n, nk, lo, hi, h, g, counters)
    # line 5: dK = scale dS^T Q
    launch(tposed_kernel("dK", B_r, B_c, d, dt, *flags, False, windowed), (T_c, inst), threads,
           shm, ds3, q3, dk3, np.float32(scale), mk, n, nk, lo, hi, counters)


@takes_torch_cpu
def standard_forward(q, k, v, *, causal=False, scale=None, block_rows, block_cols,
                     block_mask=None, threads=None, kernel="auto", poison=None,
                     dropout_p=0.0, dropout_seed=0, dropout_offset=0, window=(-1, -1)):
    """(O, P) of the standard forward (gpu.standard's S / softmax / PV kernels): the P that
    the standard backward needs. q (batch, heads, N, d), k, v (batch, kv_heads, N_k, d), as
    for `gpu.attention` (NumPy in -> NumPy out; device arrays in -> the same kind out;
    window=(left, right) and causal bottom-right aligned as there; N_k != N or a window
    runs the plain kernels). O: (batch, heads, N, d), P: (batch, heads, N, N_k), both in
    the input dtype. Entries of
    P outside the tiling's active tiles stay NaN (never written; the backward with the
    same tiling never reads them). `gpu.attention(algorithm='standard')` runs the same
    kernels but does not return P. kernel: 'auto' (fp16 on a GPU: the tensor-core kernels
    `gpu.forward.standard_tc` where they run the tiling, else the plain ones), 'plain',
    'tc', 'fast' (`gpu.forward.standard_fast`, fp32 or fp16, at a thread count its plan
    takes: `threads` or gpu.api's choice; a ValueError where none fits). poison: NaN-fill
    O, S, P first (default `gpu.api.POISON`).
    dropout_p > 0 (with dropout_seed, dropout_offset; `gpu.attention`): returns
    (O, P, Z), Z the keep mask (batch, heads, N, N) uint8 the softmax kernel stored (1 kept,
    0 dropped; entries outside the active tiles undefined), for attention_backward's
    stats = (P, Z); whichever kernels run (plain, fast or tensor-core, chosen as without
    dropout) store the same bits."""
    import iosim
    from ..forward import standard, standard_tc
    from .._launch import SIM, default_threads, dtype_name, new_counters
    from .. import api as _api
    from .._io import _check, _output, _return_like, _to_device
    (B, H, N, d), dt, kind = _check("q", q)
    shape_k, _, _ = _check("k", k)
    Hk, Nk = shape_k[1], shape_k[2]
    dname = dtype_name(dt)
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    given = None if threads is None else int(threads)
    threads = default_threads() if threads is None else int(threads)
    problem = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype=dname,
                            causal=causal, block_mask=block_mask, N_k=Nk, window=window)
    general = Nk != N or tuple(window) != (-1, -1)
    active = iosim.active_tiles(problem, iosim.Tiling(block_rows, block_cols))
    mask_dev = None if block_mask is None else cuda.to_device(
        np.ascontiguousarray(problem.block_mask, dtype=np.uint8))
    if kernel not in ("auto", "plain", "fast", "tc"):
        raise ValueError(f"kernel={kernel!r} is not allowed; allowed: 'auto', 'plain', "
                         f"'fast', 'tc'")
    fast_opts = None
    if kernel == "fast":
        from ..forward import standard_fast
        t_fast = _api.other_fast_threads("standard", block_rows, block_cols, d, dname, given,
                                         Nk)
        if t_fast is None:
            why = standard_fast.plan_error(block_rows, block_cols, d, threads, dname)
            raise ValueError(f"kernel='fast': the fast standard kernels cannot run {dname} "
                             f"with B_r={block_rows}, B_c={block_cols}, d={d}, "
                             f"threads={given}: {why or 'shared memory'}")
        threads = t_fast
        fast_opts = _api.other_fast_options("standard", block_rows, block_cols, t_fast)
    dropout = _api._check_dropout(dropout_p, dropout_seed, dropout_offset, "standard", kernel)
    why = ("the CUDA simulator cannot run it" if SIM else
           "N_k != N or a window (the plain kernels run those)" if general else
           standard_tc.plan_error(block_rows, block_cols, d, dname) or
           (None if standard_tc.supports(block_rows, block_cols, d, dname, N=N) else
            "its shared memory does not fit this device"))
    if why is not None and kernel == "tc":
        raise ValueError(f"kernel='tc': the tensor-core standard kernels cannot run {dname} "
                         f"with B_r={block_rows}, B_c={block_cols}, d={d}: {why}")
    use_tc = why is None and kernel not in ("plain", "fast")
    poison = _api.POISON if poison is None else bool(poison)
    npdt = NP_DTYPE[dname]
    qd, kd, vd = (_to_device(x, kind) for x in (q, k, v))
    o_obj, o3 = _output((B * H, N, d), npdt, kind, q, poison)
    _s, s3 = _output((B * H, N, Nk), npdt, kind, q, poison)
    p_obj, p3 = _output((B * H, N, Nk), npdt, kind, q, poison)
    drop = {}
    if dropout is not None:
        drop = dict(z3=cuda.device_array((B * H, N, Nk), dtype=np.uint8), dropout=dropout)
    if general:
        drop.update(N_k=Nk, window=window)
    if fast_opts is not None:
        from ..forward import standard_fast
        drop.setdefault("N_k", Nk)
        drop.setdefault("window", window)
        standard_fast.run(
            qd.reshape(B * H, N, d), kd.reshape(B * Hk, Nk, d), vd.reshape(B * Hk, Nk, d),
            o3, s3, p3, scale, N, H, H // Hk, mask_dev, active, new_counters(False),
            B_r=block_rows, B_c=block_cols, dt=dname, causal=bool(causal), count=False,
            threads=threads, **fast_opts, **drop)
    else:
        (standard_tc if use_tc else standard).run(
            qd.reshape(B * H, N, d), kd.reshape(B * Hk, Nk, d), vd.reshape(B * Hk, Nk, d),
            o3, s3, p3, scale, N, H, H // Hk, mask_dev, active, new_counters(False),
            B_r=block_rows, B_c=block_cols, dt=dname, causal=bool(causal), count=False,
            threads=threads, **drop)
    del s3, _s
    if dropout is not None:
        z_host = drop["z3"].reshape(B, H, N, Nk)
        if o_obj is not None:
            return (o_obj.view(B, H, N, d), p_obj.view(B, H, N, Nk),
                    _return_like(z_host, kind, q))
        return (_return_like(o3.reshape(B, H, N, d), kind, q),
                _return_like(p3.reshape(B, H, N, Nk), kind, q), _return_like(z_host, kind, q))
    if o_obj is not None:
        return o_obj.view(B, H, N, d), p_obj.view(B, H, N, Nk)
    return (_return_like(o3.reshape(B, H, N, d), kind, q),
            _return_like(p3.reshape(B, H, N, Nk), kind, q))


__all__ = ["run", "standard_forward", "std_bwd_shared_bytes", "ds_shared_bytes", "ds_threads",
           "tposed_kernel", "dp_kernel", "ds_kernel", "dq_kernel"]
