"""Standard attention (the paper's Algorithm 0) for fp16 on the tensor cores.

Same schedule, hence EXACTLY the same HBM traffic and ledger, as `gpu.forward.standard`
(and `iosim.schedules.standard_forward`): three kernels through HBM, S and P N x N fp16
buffers per instance.

    S kernel   `std_tc_S`, one thread block per (active tile (i, j), instance): read Q_i,
               K_j (cp.async, rows past N zero-filled and not counted); S_ij = scale Q_i
               K_j^T on the tensor cores (gpu/mma.cuh tc_qk_smem_t), causally masked
               entries -inf; write the whole tile (rows, columns < N) through shared memory
               in 16-byte stores. Warp w owns query rows 16 w .. 16 w + 15 of the tile.
    softmax    `std_tc_softmax`, one thread block per (query row, instance): read the row's
               entries over the active tiles of its query block once (16-byte cp.async
               into an fp16 row in shared memory), block max and sum (warp shuffles, then
               one float32 per warp in shared), write P = exp(S - max) / sum over the same
               entries (float32 math, fp16 stored, 16-byte stores). A row with no active
               tile reads and writes nothing; one that sees no key writes P = 0, one whose
               sum is not positive although it sees a key (NaN / Inf input) writes NaN:
               the plain softmax's rule.
    PV kernel  `std_tc_PV`, one thread block per (query block i, instance): for each active
               j read P_ij (B_r x B_c fp16) and V_j (double-buffered cp.async: the next
               active tile's copies fly during this tile's products); O_i += P_ij V_j on
               the tensor cores with P_ij's A fragments read from shared memory by ldmatrix
               and V_j's B fragments by ldmatrix.trans (gpu/mma.cuh `tc_ab_smem_t`), fp32
               accumulators; write O_i once (16-byte stores; 0 for a row that sees no key,
               since its P is 0).

Dropout (`run(..., z3=, dropout=(p, seed, offset))`, p > 0): the unfused graph's, as the
plain kernels: the softmax kernel's dropout build also writes the keep mask Z (uint8,
gpu._philox: the plain kernels' bits) over the entries it writes P to; the PV kernel's
multiplies each landed P_ij tile in shared memory by Z/(1-p) (Z read from HBM, the product
rounded to fp16) between two barriers before its product (`tile_dropper`). Separate
specialisations: without dropout the kernels keep their arguments and code (same linked
PTX: scripts/ptx_snapshot.py --tc).

Counts, in elements (the plain kernels' rules): S written rows x cols per active tile; S
read and P written over the active entries of each row; Q read rows_i d and K cols_j d per
active tile; P read rows x cols and V cols_j d per active tile; O written N d.

The N x N matrices are moved 16 bytes (8 halves) at a time when N is a multiple of 8 (rows
then start 16-byte aligned); otherwise (`vec=False` specialisations) element by element.
Q, K, V, O always move in 16-byte chunks (d is a multiple of 16).

What runs where: as in gpu.forward.fa2_tc, the tile products are CUDA C++ device functions
(gpu/mma.cuh, instantiated by standard_tc.cu) linked into Numba kernels; the schedule, the
loads and stores and their counting, the masks and the softmax are Python here. fp16 only;
d a multiple of 16 up to 128; B_r = 16 x warps (warps 1, 2, 4, 8), B_c a multiple of 16 in
16..128. The CUDA simulator cannot run linked device functions: without a GPU these kernels
are built (`linked_ptx`) but not run.

Registers (ptxas -v, sm_90, no spills; tests/test_gpu_standard_tc.py checks the
defaults), default tiling 128 x 64: d = 64: S 48 (causal 60), softmax 32, PV 94 (causal
96); d = 128: S 50, softmax 32, PV 166 (256 threads: one PV block per SM by registers;
capping at 128 spilled 8 bytes). Not yet timed on a GPU: scripts/standard_tc_probe.py.

Shared memory (one dynamic buffer per kernel, 4-byte words, rows padded by 8 halves so that
no ldmatrix is bank-conflicted):
    S kernel:  Qs B_r x (d + 8) | Ks B_c x (d + 8) halves; then S_ij B_r x (B_c + 8)
    PV kernel: 2 x Ps B_r x (B_c + 8) | 2 x Vs B_c x (d + 8) halves; then O_i B_r x (d + 8)
    softmax:   the row, N halves rounded up to 8, plus one float32 per warp (static)
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np
from numba import cuda, float32, int64, uint32
from numba.cuda import types as _nbt

from .. import _philox, _tc
from .._launch import (NAN, NEG_INF, ONE, READ, SIM, WRITE, ZERO, T, add_count, dummy_mask,
                       kernel_name, launch, sees_key, specialisation)

CU_PATH = os.path.join(os.path.dirname(__file__), "standard_tc.cu")
# the launch geometry (which tilings run, threads, shared-memory layout): iosim.launch
from iosim.launch.forward import standard_tc as _geometry
from iosim.launch.forward.standard_tc import (_vec, default_tiling, plan_error, row_bytes,
                                             row_threads, rowblock_layout, shared_bytes,
                                             tile_layout)

WARPS = _geometry.WARPS
F16 = _nbt.float16
FULL = 0xFFFFFFFF
#: alignment of the dynamic shared buffer (16 bytes: cp.async, ldmatrix, vector stores;
#: the simulator takes no alignment argument)
ALIGN = None if SIM else 16
EIGHT = int64(8)




def supports(B_r: int, B_c: int, d: int, dt: str = "fp16", N: int | None = None,
             smem_limit=None) -> bool:
    """True if these kernels run (B_r, B_c, d, dt) (and the softmax row of N) on the
    current device: a real GPU, a supported shape, shared memory that fits."""
    if SIM or plan_error(B_r, B_c, d, dt) is not None:
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    need = shared_bytes(B_r, B_c, d)
    if N is not None:
        need = max(need, row_bytes(N))
    return need <= smem_limit


# ---------------------------------------------------------------------------------------
# The linked C++ functions
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def externs(d: int, B_c: int) -> dict:
    """The C++ entry points (standard_tc.cu) for (d, B_c), declared to Numba (C ABI, return
    0; generic pointers, offsets in 4-byte words, strides in halves)."""
    from numba.cuda import types as nb
    pu, pf, i32, i64 = nb.CPointer(nb.uint32), nb.CPointer(nb.float32), nb.int32, nb.int64
    sigs = dict(qk_smem=i32(pf, pu, i32, i32, i32, i32), store_s=i32(pu, i32, i32, pf),
                ab=i32(pf, pu, i32, i32, i32, i32), store_o=i32(pu, i32, i32, pf),
                cp16=i32(pu, i32, pu, i64, i32), st16=i32(pu, i64, pu, i32),
                cp_commit=i32(), cp_wait1=i32(), cp_wait0=i32())
    src = _tc.source(CU_PATH, f"STDTC_INSTANTIATE({d}, {B_c})")
    return _tc.declare(src, f"std_tc_d{d}_bc{B_c}.cu", "stdtc_", f"_d{d}_bc{B_c}", sigs)


# ---------------------------------------------------------------------------------------
# S = scale Q K^T (and the backward's dP = dO V^T), one block per active tile
# ---------------------------------------------------------------------------------------
@specialisation
def tile_kernel(B_r, B_c, d, causal, vec, count, prefix, idx, dropout=False):
    """Kernel(a, b, out, tiles, scale, N, H, G, counters); grid (n_active, instances),
    32 B_r / 16 threads, `tile_layout(...)["bytes"]` dynamic shared bytes.
    dropout=True (the backward's dP = (dO V^T) o Z/(1-p)): Kernel(..., counters, zm, rp),
    the staged tile multiplied by Z/(1-p) before its stores (`tile_dropper`; zm
    (instances, N, N) uint8, the forward's keep mask, counted under "Z").

    Out_ij = scale A_i B_j^T for each active tile (tiles: int32 (n_active, 2)), written
    whole (rows, columns < N) to an (instances, N, N) fp16 matrix; causal: entries above
    the diagonal -inf. A: (instances, N, d); B: (batch * kv_heads, N, d), fp16. idx =
    (A, B, Out) counter rows. vec: N % 8 == 0 (16-byte stores of Out)."""
    err = plan_error(B_r, B_c, d, "fp16")
    if err:
        raise ValueError(err)
    X = externs(d, B_c)
    qk_smem, store_s, cp16, st16 = X["qk_smem"], X["store_s"], X["cp16"], X["st16"]
    cp_commit, cp_wait0 = X["cp_commit"], X["cp_wait0"]
    ptr, ptr32 = _tc.ptr, _tc.ptr32
    NW = B_r // 16
    THREADS = 32 * NW
    lay = tile_layout(B_r, B_c, d)
    SH, SW, OSH, OSW, AO, BO = (lay[k] for k in ("SH", "SW", "OSH", "OSW", "AO", "BO"))
    DW = d // 2                   # words per Q / K row in global memory
    CPR = d // 8                  # 16-byte chunks per row
    AC, BCH = B_r * CPR, B_c * CPR
    LA, LB = -(-AC // THREADS), -(-BCH // THREADS)
    ADIV, BDIV = AC % THREADS == 0, BCH % THREADS == 0
    OCPR = B_c // 8               # 16-byte chunks per output row
    NTS = B_c // 8
    NSF = B_c // 2
    IA, IB, IOUT = idx
    IZ = T["Z"]
    drop_tile = tile_dropper(THREADS, OSH)

    def kernel(a, b, out, tiles, scale, N, H, G, counters):
        tix = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        g = lane >> 2
        qd = lane & 3
        zk = (z // H) * (H // G) + (z % H) // G     # this head's K/V instance
        i = tiles[tix, 0]
        j = tiles[tix, 1]
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        sh = cuda.shared.array(0, F16, alignment=ALIGN)
        smp = ptr(sm)
        s = cuda.local.array(NSF, float32)
        nA = int64(0)
        nB = int64(0)
        nO = int64(0)
        r0 = i * B_r
        c0 = j * B_c
        rows = min(B_r, N - r0)
        cols = min(B_c, N - c0)
        ap = ptr32(a)
        bp = ptr32(b)
        abase = (int64(z) * N + r0) * DW
        bbase = (int64(zk) * N + c0) * DW
        for it in range(LA):                        # A_i (Q_i or dO_i), zeros past N
            e = t + it * THREADS
            if ADIV or e < AC:
                r = e // CPR
                x = (e % CPR) * 4
                ok = r < rows
                cp16(smp, AO + r * SW + x, ap, abase + r * DW + x, ok)
                if count and ok:
                    nA += EIGHT
        for it in range(LB):                        # B_j (K_j or V_j), zeros past N
            e = t + it * THREADS
            if BDIV or e < BCH:
                r = e // CPR
                x = (e % CPR) * 4
                ok = r < cols
                cp16(smp, BO + r * SW + x, bp, bbase + r * DW + x, ok)
                if count and ok:
                    nB += EIGHT
        cp_commit()
        cp_wait0()
        cuda.syncthreads()
        # ---- the warp's 16 rows x B_c of A_i B_j^T on the tensor cores ----
        qk_smem(ptr(s), smp, AO + 16 * w * SW, SH, BO, SH)
        rw = r0 + 16 * w
        edge = causal and c0 + B_c - 1 > rw         # some of the warp's entries masked
        for nt in range(NTS):
            for hh in range(2):
                for u in range(2):
                    e = 4 * nt + 2 * hh + u
                    v = s[e] * scale
                    if edge and c0 + 8 * nt + 2 * qd + u > rw + g + 8 * hh:
                        v = NEG_INF
                    s[e] = v
        cuda.syncthreads()                          # everyone is done with Qs, Ks
        store_s(smp, 16 * w * OSW, OSH, ptr(s))
        cuda.syncthreads()
        if dropout:                                 # the staged tile o Z / (1 - p)
            drop_tile(sh, 0, zm, z, r0, rows, c0, cols, rp, t)
            cuda.syncthreads()
        if vec:                                     # whole tile, 16 bytes per store
            NWR = N // 2                            # words per row of Out
            op = ptr32(out)
            obase = (int64(z) * N + r0) * NWR + c0 // 2
            for e in range(t, rows * OCPR, THREADS):
                r = e // OCPR
                x = (e % OCPR) * 4
                if 2 * x < cols:
                    st16(op, obase + r * NWR + x, smp, r * OSW + x)
                    if count:
                        nO += EIGHT
        else:
            for e in range(t, rows * cols, THREADS):
                r = e // cols
                c = e % cols
                out[z, r0 + r, c0 + c] = sh[r * OSH + c]
                if count:
                    nO += 1
        if count:
            add_count(counters, IA, READ, nA)
            add_count(counters, IB, READ, nB)
            add_count(counters, IOUT, WRITE, nO)
            if dropout:                             # one Z per entry of Out written
                add_count(counters, IZ, READ, nO)

    if dropout:     # + zm, rp (the build without dropout: this very code, unchanged)
        kernel = _philox.with_args(kernel, ("zm", "rp"))

    return kernel, kernel_name(prefix, Br=B_r, Bc=B_c, d=d, dt="fp16", causal=causal,
                               vec=vec, dropout=dropout, count=count)


def s_kernel(B_r, B_c, d, causal, vec, count):
    """S = scale Q K^T per active tile (`tile_kernel` with the forward's counter rows)."""
    return tile_kernel(int(B_r), int(B_c), int(d), bool(causal), bool(vec), bool(count),
                       "std_tc_S", (T["Q"], T["K"], T["S"]))


def tile_dropper(threads: int, XSH: int):
    """A device function drop(sh, base, zm, z, r0, rows, c0, cols, rp, t): the unfused
    graph's dropout applied to an fp16 tile already in shared memory (half `base`, rows of
    XSH halves): entry (r, c) (r < rows, c < cols) becomes x Z/(1-p), Z read from the
    stored keep mask zm[z, r0 + r, c0 + c] (uint8, one read per entry of the tile read or
    written: the callers count "Z" as that tile's elements), rp = 1/(1-p); the product is
    rounded to fp16 (as the plain fp16 kernels' tiles). Each thread takes entries t,
    t + threads, ...: the caller puts barriers around it."""
    @cuda.jit(device=True, inline=True)
    def drop(sh, base, zm, z, r0, rows, c0, cols, rp, t):
        for e in range(t, rows * cols, threads):
            r = e // cols
            c = e % cols
            k = base + r * XSH + c
            if zm[z, r0 + r, c0 + c] != 0:
                sh[k] = float32(sh[k]) * rp
            else:
                sh[k] = ZERO
    return drop


# ---------------------------------------------------------------------------------------
# O = P V (and the backward's dQ = scale dS K), one block per query block
# ---------------------------------------------------------------------------------------
def nxn_tile_loader(B_r: int, B_c: int, threads: int, vec: bool, cp16):
    """A device function load(smp, sh, x, xp, z, r0, rows, c0, cols, N, t, dst) -> elements
    requested: start the copies of this thread's part of the B_r x B_c tile
    x[z, r0 : r0 + rows, c0 : c0 + cols] of an (instances, N, N) fp16 matrix (P, dS) into
    shared memory at word `dst`, rows of B_c + 8 halves, zeros outside the matrix (not
    counted). vec (N a multiple of 8, so rows start 16-byte aligned): 16-byte cp.async
    chunks (`cp16`, the caller's linked copy); else element by element. Shared by the PV /
    dQ row-block kernel here and the dV / dK column-block kernel (gpu.backward.standard_tc)."""
    XSH = B_c + 8
    XSW = XSH // 2
    XCR = B_c // 8                 # 16-byte chunks per row of the tile
    XCH = B_r * XCR
    LX = -(-XCH // threads)
    XDIV = XCH % threads == 0
    EIGHT = int64(8)

    @cuda.jit(device=True, inline=True)
    def load(smp, sh, x, xp, z, r0, rows, c0, cols, N, t, dst):
        n = int64(0)
        if vec:
            NWR = N // 2
            xbase = (int64(z) * N + r0) * NWR + c0 // 2
            for it in range(LX):
                e = t + it * threads
                if XDIV or e < XCH:
                    r = e // XCR
                    xx = (e % XCR) * 4
                    ok = r < rows and 2 * xx < cols
                    cp16(smp, dst + r * XSW + xx, xp, xbase + r * NWR + xx, ok)
                    if ok:
                        n += EIGHT
        else:
            for e in range(t, B_r * B_c, threads):
                r = e // B_c
                c = e % B_c
                val = ZERO                          # (exact: fp16 -> fp32 -> fp16)
                if r < rows and c < cols:
                    val = float32(x[z, r0 + r, c0 + c])
                    n += 1
                sh[2 * dst + r * XSH + c] = val
        return n
    return load


@specialisation
def rowblock_kernel(B_r, B_c, d, causal, has_mask, vec, count, prefix, idx, dropout=False):
    """Kernel(a, b, out, scale, mask, N, H, G, counters); grid (T_r, instances), 32 B_r / 16
    threads, `rowblock_layout(...)["bytes"]` dynamic shared bytes.
    dropout=True (the forward's O = (P o Z/(1-p)) V): Kernel(..., counters, zm, rp), each
    landed A_ij tile multiplied by Z/(1-p) in shared memory before its product
    (`tile_dropper`, between two barriers; zm (instances, N, N) uint8, counted under "Z").

    Out_i = scale sum over active j of A_ij B_j: A (instances, N, N) fp16 read tile by tile
    (active tiles only, rows and columns < N), B (batch * kv_heads, N, d) block by block,
    Out (instances, N, d) written once. idx = (A, B, Out) counter rows."""
    err = plan_error(B_r, B_c, d, "fp16")
    if err:
        raise ValueError(err)
    X = externs(d, B_c)
    ab, store_o, cp16, st16 = X["ab"], X["store_o"], X["cp16"], X["st16"]
    cp_commit, cp_wait1, cp_wait0 = X["cp_commit"], X["cp_wait1"], X["cp_wait0"]
    ptr, ptr32 = _tc.ptr, _tc.ptr32
    NW = B_r // 16
    THREADS = 32 * NW
    lay = rowblock_layout(B_r, B_c, d)
    SH, SW, PSH, PSW = lay["SH"], lay["SW"], lay["PSH"], lay["PSW"]
    PO, PB, VO, VB = lay["PO"], lay["PB"], lay["VO"], lay["VB"]
    DW = d // 2
    CPR = d // 8
    VCH = B_c * CPR
    LV = -(-VCH // THREADS)
    VDIV = VCH % THREADS == 0
    load_tile = nxn_tile_loader(B_r, B_c, THREADS, vec, cp16)   # A_ij
    NOF = d // 2
    IA, IB, IOUT = idx
    IZ = T["Z"]
    drop_tile = tile_dropper(THREADS, PSH)

    @cuda.jit(device=True, inline=True)
    def next_tile(j, T_c, last, mask, i):
        """The first active key tile >= j of query block i (T_c if none)."""
        while j < T_c:
            if causal and j * B_c > last:
                return T_c
            if has_mask and mask[i, j] == 0:
                j += 1
                continue
            return j
        return T_c

    @cuda.jit(device=True, inline=True)
    def issue(smp, sh, a, ap, bp, z, zk, r0, rows, j, N, t, buf):
        """Start the copies of A_ij and B_j into buffer `buf` (zeros past N); returns the
        elements of A and of B this thread requested."""
        nV = int64(0)
        c0 = j * B_c
        cols = min(B_c, N - c0)
        nP = load_tile(smp, sh, a, ap, z, r0, rows, c0, cols, N, t, PO + buf * PB)
        vbase = (int64(zk) * N + c0) * DW
        for it in range(LV):
            e = t + it * THREADS
            if VDIV or e < VCH:
                r = e // CPR
                x = (e % CPR) * 4
                ok = r < cols
                cp16(smp, VO + buf * VB + r * SW + x, bp, vbase + r * DW + x, ok)
                if ok:
                    nV += EIGHT
        return nP, nV

    def kernel(a, b, out, scale, mask, N, H, G, counters):
        i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        w = t >> 5
        zk = (z // H) * (H // G) + (z % H) // G
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        sh = cuda.shared.array(0, F16, alignment=ALIGN)
        smp = ptr(sm)
        ap = ptr32(a)
        bp = ptr32(b)
        acc = cuda.local.array(NOF, float32)
        nP = int64(0)
        nV = int64(0)
        nO = int64(0)
        r0 = i * B_r
        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        T_c = (N + B_c - 1) // B_c
        for e in range(NOF):
            acc[e] = ZERO
        j = next_tile(0, T_c, last, mask, i)
        buf = 0
        if j < T_c:
            x1, x2 = issue(smp, sh, a, ap, bp, z, zk, r0, rows, j, N, t, buf)
            nP += x1
            nV += x2
        cp_commit()
        while j < T_c:
            jn = next_tile(j + 1, T_c, last, mask, i)
            if jn < T_c:                            # next tile's copies fly meanwhile
                x1, x2 = issue(smp, sh, a, ap, bp, z, zk, r0, rows, jn, N, t, 1 - buf)
                nP += x1
                nV += x2
            cp_commit()
            cp_wait1()                              # tile j has landed (mine)
            cuda.syncthreads()                      # ... and everyone's
            if dropout:                             # A_ij o Z_ij / (1 - p), in place
                drop_tile(sh, 2 * (PO + buf * PB), zm, z, r0, rows, j * B_c,
                          min(B_c, N - j * B_c), rp, t)
                cuda.syncthreads()
            ab(ptr(acc), smp, PO + buf * PB + 16 * w * PSW, PSH, VO + buf * VB, SH)
            cuda.syncthreads()                      # all done with buffer `buf`
            buf = 1 - buf
            j = jn
        cp_wait0()
        for e in range(NOF):
            acc[e] *= scale
        store_o(smp, 16 * w * SW, SH, ptr(acc))     # buffers are free (barrier above)
        cuda.syncthreads()
        op = ptr32(out)
        obase = (int64(z) * N + r0) * DW
        for e in range(t, rows * CPR, THREADS):
            r = e // CPR
            x = (e % CPR) * 4
            st16(op, obase + r * DW + x, smp, r * SW + x)
            if count:
                nO += EIGHT
        if count:
            add_count(counters, IA, READ, nP)
            add_count(counters, IB, READ, nV)
            add_count(counters, IOUT, WRITE, nO)
            if dropout:                             # one Z per entry of A read
                add_count(counters, IZ, READ, nP)

    if dropout:     # + zm, rp (the build without dropout: this very code, unchanged)
        kernel = _philox.with_args(kernel, ("zm", "rp"))

    return kernel, kernel_name(prefix, Br=B_r, Bc=B_c, d=d, dt="fp16", causal=causal,
                               mask=has_mask, vec=vec, dropout=dropout, count=count)


def pv_kernel(B_r, B_c, d, causal, has_mask, vec, count, dropout=False):
    """O = P V, one block per query block (`rowblock_kernel`, the forward's rows);
    dropout: O = (P o Z/(1-p)) V, Z read from the stored keep mask."""
    return rowblock_kernel(int(B_r), int(B_c), int(d), bool(causal), bool(has_mask),
                           bool(vec), bool(count), "std_tc_PV", (T["P"], T["V"], T["O"]),
                           bool(dropout))


# ---------------------------------------------------------------------------------------
# Row kernels' shared pieces: which chunks of a row are active, block reductions
# ---------------------------------------------------------------------------------------
def red_size(threads: int) -> int:
    """Entries of a row kernel's reduction array: one per warp (one per thread in the
    simulator, which has no warp shuffles)."""
    return threads if SIM else threads // 32


def row_helpers(B_r, B_c, causal, has_mask, vec, threads):
    """(chunk_range, chunk_on, block_max, block_sum) device functions of a row kernel with
    `threads` threads (the reductions take a float32 shared array of `red_size(threads)`): the row's chunks (W = 8 elements when vec, else 1) run from 0 to
    `chunk_range(r, N)` (causal: up to the end of the last tile that query block r // B_r
    reaches); chunk e is active iff `chunk_on(mask, i, e)`."""
    W = 8 if vec else 1
    NW = threads // 32

    @cuda.jit(device=True, inline=True)
    def chunk_range(r, N):
        i = r // B_r
        cend = N
        if causal:
            last = min((i + 1) * B_r, N) - 1
            cend = min(N, (last // B_c + 1) * B_c)
        return (cend + W - 1) // W

    @cuda.jit(device=True, inline=True)
    def chunk_on(mask, i, e):
        if has_mask:
            return mask[i, (e * W) // B_c] != 0
        return True

    if SIM:     # the simulator has no warp shuffles: red has `threads` entries there
        @cuda.jit(device=True)
        def block_max(v, red, lane, w):
            red[cuda.threadIdx.x] = v
            cuda.syncthreads()
            v = red[0]
            for u in range(1, threads):
                v = max(v, red[u])
            return v

        @cuda.jit(device=True)
        def block_sum(v, red, lane, w):
            red[cuda.threadIdx.x] = v
            cuda.syncthreads()
            v = red[0]
            for u in range(1, threads):
                v += red[u]
            return v
        return chunk_range, chunk_on, block_max, block_sum

    @cuda.jit(device=True, inline=True)
    def block_max(v, red, lane, w):
        v = max(v, cuda.shfl_xor_sync(FULL, v, 16))
        v = max(v, cuda.shfl_xor_sync(FULL, v, 8))
        v = max(v, cuda.shfl_xor_sync(FULL, v, 4))
        v = max(v, cuda.shfl_xor_sync(FULL, v, 2))
        v = max(v, cuda.shfl_xor_sync(FULL, v, 1))
        if lane == 0:
            red[w] = v
        cuda.syncthreads()
        v = red[0]
        for u in range(1, NW):
            v = max(v, red[u])
        return v

    @cuda.jit(device=True, inline=True)
    def block_sum(v, red, lane, w):
        v += cuda.shfl_xor_sync(FULL, v, 16)
        v += cuda.shfl_xor_sync(FULL, v, 8)
        v += cuda.shfl_xor_sync(FULL, v, 4)
        v += cuda.shfl_xor_sync(FULL, v, 2)
        v += cuda.shfl_xor_sync(FULL, v, 1)
        if lane == 0:
            red[w] = v
        cuda.syncthreads()
        v = red[0]
        for u in range(1, NW):
            v += red[u]
        return v

    return chunk_range, chunk_on, block_max, block_sum


@specialisation
def softmax_kernel(B_r, B_c, causal, has_mask, vec, count, threads, dropout=False):
    """Kernel(s, p, mask, N, counters); grid (N, instances), `threads` threads (a multiple
    of 32: `row_threads`), `row_bytes(N)` dynamic shared bytes. s, p: (instances, N, N)
    fp16. Each thread handles the same chunks in every pass (no barrier is needed between
    its copy into the shared row and its reads of it).
    dropout=True: Kernel(s, p, mask, N, counters, zm, key0, key1, offset, thr) also writes
    the keep mask Z (uint8 0/1; gpu._philox, the plain kernels' bits) over the same
    entries into zm (instances, N, N), as the unfused graph's dropout stores its mask
    (counted under "Z", one per P entry written)."""
    X = externs(16, 16)
    cp16, st16, cp_commit, cp_wait0 = X["cp16"], X["st16"], X["cp_commit"], X["cp_wait0"]
    ptr, ptr32 = _tc.ptr, _tc.ptr32
    W = 8 if vec else 1
    RED = red_size(threads)
    chunk_range, chunk_on, block_max, block_sum = row_helpers(B_r, B_c, causal, has_mask,
                                                              vec, threads)
    IS, IP, IZ = T["S"], T["P"], T["Z"]

    def kernel(s, p, mask, N, counters):
        r = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        sh = cuda.shared.array(0, F16, alignment=ALIGN)
        redm = cuda.shared.array(RED, float32)
        reds = cuda.shared.array(RED, float32)
        smp = ptr(sm)
        nS = int64(0)
        i = r // B_r
        nch = chunk_range(r, N)
        rbase = (int64(z) * N + r) * (N // 2)      # word offset of the row (vec)
        sp = ptr32(s)
        for e in range(t, nch, threads):            # read the active entries of S, once
            if chunk_on(mask, i, e):
                if vec:
                    cp16(smp, 4 * e, sp, rbase + 4 * e, 1)
                else:
                    sh[e] = s[z, r, e]
                nS += W
        if vec:
            cp_commit()
            cp_wait0()
        mx = NEG_INF
        for e in range(t, nch, threads):
            if chunk_on(mask, i, e):
                for u in range(W):
                    mx = max(mx, float32(sh[e * W + u]))
        mx = block_max(mx, redm, lane, w)
        m_safe = mx if mx > NEG_INF else ZERO      # max() may skip NaN entries
        total = ZERO
        for e in range(t, nch, threads):
            if chunk_on(mask, i, e):
                for u in range(W):
                    total += math.exp(float32(sh[e * W + u]) - m_safe)
        total = block_sum(total, reds, lane, w)
        # the plain softmax's rule: only a row that sees no key gets P = 0
        if total > ZERO:
            inv = ONE / total
        elif sees_key(mask, i, r, (N + B_c - 1) // B_c, B_c, causal, has_mask):
            inv = NAN
        else:
            inv = ZERO
        nP = int64(0)
        pp = ptr32(p)
        for e in range(t, nch, threads):            # write P over the same entries
            if chunk_on(mask, i, e):
                for u in range(W):
                    pv = math.exp(float32(sh[e * W + u]) - m_safe) * inv
                    if vec:
                        sh[e * W + u] = pv
                    else:
                        p[z, r, e] = pv
                    if dropout:
                        if _philox.keep(key0, key1, offset, z, r, e * W + u, thr):
                            zm[z, r, e * W + u] = 1
                        else:
                            zm[z, r, e * W + u] = 0
                if vec:
                    st16(pp, rbase + 4 * e, smp, 4 * e)
                nP += W
        if count:
            add_count(counters, IS, READ, nS)
            add_count(counters, IP, WRITE, nP)
            if dropout:
                add_count(counters, IZ, WRITE, nP)

    if dropout:     # + the mask and Philox arguments (without dropout: this code as is)
        kernel = _philox.with_args(kernel, ("zm", "key0", "key1", "offset", "thr"))

    return kernel, kernel_name("std_tc_softmax", Br=B_r, Bc=B_c, causal=causal, mask=has_mask,
                               vec=vec, dropout=dropout, count=count, t=threads)


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------
def _check(q3, arrays):
    for name, arr in arrays:
        _tc.check_aligned("standard_tc", name, arr)


_TILES: dict = {}


def active_list(active):
    """The active tiles as an int32 (n_active, 2) device array of (i, j), cached per
    pattern and device (no host-to-device copy on repeated calls)."""
    key = (cuda.get_current_device().id if not SIM else 0, active.shape,
           np.packbits(active).tobytes())
    if key not in _TILES:
        if len(_TILES) > 64:
            _TILES.clear()
        tiles = np.argwhere(active).astype(np.int32)
        _TILES[key] = (len(tiles), cuda.to_device(tiles) if len(tiles) else None)
    return _TILES[key]


def run(q3, k3, v3, o3, s3, p3, scale, N, H, G, mask, active, counters, *, B_r, B_c, dt,
        causal, count, threads=None, z3=None, dropout=None):
    """Launch the three kernels on 3-D fp16 device views; writes s3, p3, o3. The arguments
    of `gpu.forward.standard.run` (threads is accepted and ignored: these kernels run one
    warp per 16 query rows, and `row_threads(N)` in the softmax).
    active: host boolean (T_r, T_c) of active tiles (iosim.active_tiles).
    dropout: None, or (dropout_p, seed, offset) with p > 0: the softmax kernel also writes
    the keep mask (the plain kernels' Philox bits) into z3 (instances, N, N) uint8, the PV
    kernel reads it (O = (P o Z/(1-p)) V)."""
    err = plan_error(B_r, B_c, q3.shape[2], dt)
    if err:
        raise ValueError(f"standard_tc: {err}")
    _check(q3, (("q", q3), ("k", k3), ("v", v3), ("o", o3), ("s", s3), ("p", p3)))
    d = q3.shape[2]
    inst = q3.shape[0]
    vec = _vec(N)
    has_mask = mask is not None
    mk = mask if has_mask else dummy_mask()
    n, h, g = np.int64(N), np.int64(H), np.int64(G)
    drop = bool(dropout and dropout[0] > 0)
    if drop and z3 is None:
        raise ValueError("standard_tc.run: dropout needs z3, the (instances, N, N) uint8 "
                         "keep mask buffer")
    key0, key1, off, thr, rp = _philox.kernel_args(*(dropout or ()))
    n_act, tiles = active_list(np.asarray(active, dtype=bool))
    nthr = 32 * (B_r // 16)
    if n_act:
        launch(s_kernel(B_r, B_c, d, causal, vec, count), (n_act, inst), nthr,
               tile_layout(B_r, B_c, d)["bytes"], q3, k3, s3, tiles,
               np.float32(scale), n, h, g, counters)
    ts = row_threads(N, vec)
    launch(softmax_kernel(int(B_r), int(B_c), bool(causal), has_mask, vec, bool(count), ts,
                          drop),
           (N, inst), ts, row_bytes(N), s3, p3, mk, n, counters,
           *((z3, key0, key1, off, thr) if drop else ()))
    launch(pv_kernel(B_r, B_c, d, causal, has_mask, vec, count, drop), (-(-N // B_r), inst),
           nthr, rowblock_layout(B_r, B_c, d)["bytes"], p3, v3, o3, np.float32(1.0), mk, n, h,
           g, counters, *((z3, rp) if drop else ()))


def forward_arrays(q, k, v, *, causal=False, scale=None, block_rows=None, block_cols=None,
                   block_mask=None, count_traffic=False, dropout_p=0.0, dropout_seed=0,
                   dropout_offset=0):
    """(O, P, ledger) for NumPy fp16 q (batch, heads, N, d), k, v (batch, kv_heads, N, d):
    a host wrapper of `run` for tests and scripts (the lead wires `gpu.attention`). O, P
    (batch, heads, N, N) are NaN-poisoned before the kernels run (P stays NaN outside the
    active tiles); ledger: the kernels' own counts (an iosim Ledger) or None.
    dropout_p > 0: (O, P, Z, ledger), Z the stored keep mask (batch, heads, N, N) uint8
    (entries outside the active tiles 0: never written)."""
    import iosim
    from .._launch import counters_to_ledger, filled, new_counters
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
    drop = {}
    if dropout_p:
        drop = dict(z3=cuda.to_device(np.zeros((B * H, N, N), np.uint8)),
                    dropout=(float(dropout_p), int(dropout_seed), int(dropout_offset)))
    q3, k3, v3 = (cuda.to_device(np.ascontiguousarray(x, np.float16).reshape(-1, N, d))
                  for x in (q, k, v))
    o3 = filled((B * H, N, d), np.float16, np.nan)
    s3 = filled((B * H, N, N), np.float16, np.nan)
    p3 = filled((B * H, N, N), np.float16, np.nan)
    counters = new_counters(count_traffic)
    run(q3, k3, v3, o3, s3, p3, scale, N, H, H // Hk, mask_dev, active, counters, B_r=B_r,
        B_c=B_c, dt="fp16", causal=bool(causal), count=bool(count_traffic), **drop)
    led = (counters_to_ledger(counters, "standard", problem, tiling) if count_traffic
           else None)
    if drop:
        return (o3.copy_to_host().reshape(B, H, N, d), p3.copy_to_host().reshape(B, H, N, N),
                drop["z3"].copy_to_host().reshape(B, H, N, N), led)
    return (o3.copy_to_host().reshape(B, H, N, d), p3.copy_to_host().reshape(B, H, N, N),
            led)


def signatures():
    """Argument types of the three kernels (for compiling without a GPU): dict name ->
    tuple."""
    from numba.cuda import types as nb
    W = nb.Array(nb.float16, 3, "C")
    I2 = nb.Array(nb.int32, 2, "C")
    M = nb.Array(nb.uint8, 2, "C")
    C = nb.Array(nb.int64, 2, "C")
    i64 = nb.int64
    Z = nb.Array(nb.uint8, 3, "C")
    u64 = nb.uint64
    return dict(S=(W, W, W, I2, nb.float32, i64, i64, i64, C),
                softmax=(W, W, M, i64, C),
                PV=(W, W, W, nb.float32, M, i64, i64, i64, C),
                # the dropout builds: + the keep mask zm and the dropout scalars
                softmax_dropout=(W, W, M, i64, C, Z, u64, u64, u64, u64),
                PV_dropout=(W, W, W, nb.float32, M, i64, i64, i64, C, Z, nb.float32),
                dP_dropout=(W, W, W, I2, nb.float32, i64, i64, i64, C, Z, nb.float32))


def linked_ptx(B_r, B_c, d, causal=False, has_mask=False, count=False, vec=True, N=4096,
               cc=(9, 0)) -> dict:
    """{'S', 'softmax', 'PV'}: the PTX of each kernel of one specialisation after link-time
    optimisation with its C++ functions, built without a GPU (gpu._tc.linked_ptx)."""
    sig = signatures()
    kerns = dict(S=s_kernel(B_r, B_c, d, causal, vec, count),
                 softmax=softmax_kernel(int(B_r), int(B_c), bool(causal), bool(has_mask),
                                        bool(vec), bool(count), row_threads(N, vec)),
                 PV=pv_kernel(B_r, B_c, d, causal, has_mask, vec, count))
    return {k: _tc.linked_ptx(kern, sig[k], cc) for k, kern in kerns.items()}


__all__ = ["plan_error", "supports", "default_tiling", "tile_layout", "rowblock_layout",
           "row_threads", "row_bytes", "shared_bytes", "externs", "tile_kernel",
           "s_kernel", "rowblock_kernel", "pv_kernel", "softmax_kernel", "row_helpers",
           "active_list", "run", "forward_arrays", "signatures", "linked_ptx"]
