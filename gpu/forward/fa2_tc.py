"""FlashAttention-2 forward for fp16 and bf16 on the tensor cores: the 16-bit fast path.

Same schedule, hence the same HBM traffic and the same iosim ledger, as `gpu.fa2`,
`gpu.fa2_fast` and `iosim.schedules.fa2_forward`: one thread block per (query block i,
instance); read Q_i once; for each active key block j (outside the causal / window band
of gpu.forward._band, N_q != N_k aligned bottom-right: skip; block_mask[i, j] False:
skip) read K_j and V_j once; online softmax with float32
running max m and sum l; write O_i and L_i = m + log(l) once (a row that sees no key:
O = 0, L = -inf). Ragged N: only valid rows are loaded / stored (and counted).

What runs where. Numba has no API for the tensor cores (numba-cuda 0.30.4), so the
tile products S_ij = Q_i K_j^T and P~_ij V_j are CUDA C++ device functions with inline
PTX `mma.sync.m16n8k16` and `ldmatrix` (`gpu/mma.cuh`, instantiated by `fa2_tc.cu`), declared with
`cuda.declare_device` and linked into this Numba kernel. With link-time optimisation
(nvJitLink, Numba's default when it is installed) they are inlined, so the fragment
arrays passed to them by pointer stay in registers (tests/test_gpu_tc.py checks the
linked PTX: mma.sync present, no local memory, no calls). Everything
else, the part to hold beside the paper, is Python here: which tiles run, the global
loads and stores (and their counting), the masking and the online softmax.

Versions (H100, fp16, d = 64, batch x heads = 16, N = 4096, non-causal, kernel alone;
results data set, kinds `check` and `tc_tilings`):
  v1  (this file) B_r = 16 x warps, one warp per 16 query rows; S and O in mma
      accumulator fragments; P stays in registers between the two products (two
      neighbouring S fragments are the A fragment of one 16-wide k step); Q_i's
      fragments loaded once (ldmatrix); K_j, V_j double-buffered in shared memory and
      filled by cp.async (16-byte asynchronous copies, no registers: the next active
      tile's copies are in flight during this tile's products); padded shared rows
      (stride d + 8 halves: conflict-free ldmatrix); exp2 with scale * log2(e) folded
      into one multiply; a warp whose 16 rows all lie above a causal tile's first key
      skips that tile's products (exact: every P entry would be 0; the tile is still
      loaded, so the traffic is unchanged); O_i leaves through shared memory in 16-byte
      stores. 128 x 64: 0.29 ms, 235 TFLOP/s (d = 128, 64 x 64: 0.53 ms, 262 TFLOP/s);
      128 registers, no spills (ptxas). A first build that loaded K/V through
      registers (4-byte loads, next tile staged in registers) needed 251-255 registers
      and spilled at d = 128; it was not timed.

Paper names (Dao et al. 2022, Algorithm 1; FlashAttention-2 Algorithm 1):
    B_r = 16 * warps  query rows per block (block_rows); warp w owns rows 16 w .. 16 w + 15
    B_c               key rows per tile (block_cols), a multiple of 16
    S_ij, P~_ij       16 x B_c per warp, in registers (s[8 nt' .. ], see gpu/mma.cuh)
    m_i, l_i          per thread: rows g and g + 8 of its warp (g = lane // 4); l is the
                      thread's partial sum over its own columns until the end, when the 4
                      lanes of a row add theirs (all rescale by the same alpha)
    O_i               16 x d per warp, fp32 accumulators in registers

Element types (DTYPES): fp16, and bf16 (its data arrive as uint16 arrays of the bfloat16
bits: Numba has no bfloat16 arrays to pass). The two differ only inside gpu/mma.cuh (the
mma.sync operand type and the fp32 -> 16-bit rounding of P~ and O, both round to nearest
even); everything here moves 16-bit bits.

Head dims (issue 18): any d in 1..256. The tile products run at D = padded(d) = d rounded
up to 16 (one mma k step); shared rows are D + 8 elements wide and their columns d .. D - 1
are zeroed once per block by plain shared stores (they are never loaded from global
memory, and no later copy writes them; the products then add exact zeros to S = Q K^T,
and O's padded columns are never stored). What is requested from global memory is the d
real elements of each row, nothing more: 16-byte cp.async chunks when d % 8 == 0, single
16-bit elements through registers otherwise (rows of such d are not 16-byte aligned, and
for odd d not even 4-byte aligned). So the kernel's own counts, iosim's closed form and
the executed schedule agree exactly, with no term for the padding (the padding costs
shared memory and tensor-core work only). Above D = 128 (QREG_MAX) the Q_w fragments are
not held in registers for the block but read from shared memory at each k step of
S = Q_w K_j^T (`qk_smem`): the O_w accumulators (D / 2 floats a thread) need them; MT = 1
only there. d = 256 at 128 x 64: 203 KB of shared memory (the H100 allows 227 KB), 249
registers, no spills (ptxas -v; causal 254).

Shared memory (one dynamic buffer, 16-byte aligned; in 4-byte words, 16-bit pairs):
    Qs  B_r x (D + 8) elements   Q_i (then O_i, for the coalesced store)
    Ks  B_c x (D + 8) elements   K_j
    Vs  B_c x (D + 8) elements   V_j
    Ls  B_r float32              L_i staging
Global memory is read and written as 4-byte words (two 16-bit elements; d % 8 != 0:
single elements); counts are in elements.

Dropout (issue 18; compile flag `dropout`, `run(..., dropout=(p, seed, offset))`): as
`gpu.forward.fa2`, Algorithm 2: l sums P~ before dropout, then each P~[row, col] that
enters the PV product is multiplied by Z / (1 - p), Z the Philox keep mask of
gpu._philox (bit-identical to iosim.dropout; the thread's entries drawn into a bit mask
per row before the unrolled fragment loop, `softmax_mtile`). No extra HBM traffic.

`run(...)` has the signature of `gpu.fa2.run` (plus tuning keywords), so
`gpu.attention(..., algorithm="fa2")` calls it for 16-bit inputs on a GPU whenever
`supports(...)`.
The CUDA simulator cannot run linked device functions: without a GPU this kernel is built
and linked (to SASS for sm_90) but not run; tests marked `gpu` run it through `device`.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np
from numba import cuda, float32, int64, uint16, uint32, uint64

from .. import _philox, _tc
from .._launch import (NAN, NEG_INF, ONE, READ, SIM, WRITE, ZERO, T, add_count, dummy_mask,
                      kernel_name, specialisation)
from ._band import active_tile_finder, band_args, sees_key_band, tile_in_band

#: CUDA C++ source of the tile products (instantiated per (d, B_c) by `_source`).
CU_PATH = os.path.join(os.path.dirname(__file__), "fa2_tc.cu")
# the launch geometry (which tilings run, threads, shared-memory layout): iosim.launch
from iosim.launch.forward import fa2_tc as _geometry
from iosim.launch.forward.fa2_tc import (D_MAX, DTYPES, QREG_MAX, layout, padded, plan_error,
                                        threads_per_block)

WARPS, M_TILES, _stride = _geometry.WARPS, _geometry.M_TILES, _geometry._stride
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)



def supports(B_r: int, B_c: int, d: int, dt: str = "fp16", smem_limit=None, MT: int = 1) -> bool:
    """True if this kernel runs (B_r, B_c, d, dt) on the current device: a real GPU (the
    simulator cannot run linked device functions), a supported shape, shared memory that
    fits."""
    if SIM or plan_error(B_r, B_c, d, dt, MT) is not None:
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return layout(B_r, B_c, d)["bytes"] <= smem_limit


# ---------------------------------------------------------------------------------------
# The linked C++ functions
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def externs(d: int, B_c: int, MT: int = 1, dt: str = "fp16") -> dict:
    """The C++ functions for (d, B_c, MT, dt), d the padded head dim (a multiple of 16),
    declared to Numba (C ABI, each returns int 0; pointers are generic addresses, offsets
    in 4-byte words, strides in 16-bit elements): load_q, qk, qk_smem, pv, store_o (tile
    products, gpu/mma.cuh, on dt's element type), cp16 (one 16-byte asynchronous global ->
    shared copy, zero-filled when not valid), st16 (16 bytes shared -> global), cp2, st2
    (one 16-bit element each way, offsets in elements), cp_commit, cp_wait1, cp_wait0
    (cp.async groups)."""
    from numba.cuda import types as nb
    pu, pf, i32, i64 = nb.CPointer(nb.uint32), nb.CPointer(nb.float32), nb.int32, nb.int64
    ph = nb.CPointer(nb.uint16)
    sigs = dict(load_q=i32(pu, pu, i32, i32), qk=i32(pf, pu, pu, i32, i32),
                qk_smem=i32(pf, pu, i32, i32, i32, i32),
                pv=i32(pf, pf, pu, i32, i32), store_o=i32(pu, i32, i32, pf),
                cp16=i32(pu, i32, pu, i64, i32), st16=i32(pu, i64, pu, i32),
                cp2=i32(ph, i32, ph, i64, i32), st2=i32(ph, i64, ph, i32),
                cp_commit=i32(), cp_wait1=i32(),
                cp_wait0=i32())
    elem, sfx = _tc.ELEMENTS[dt]
    src = _tc.source(CU_PATH, f"FA2TC_INSTANTIATE({d}, {B_c}, {MT}, {elem}, {sfx})")
    return _tc.declare(src, f"fa2_tc_d{d}_bc{B_c}_mt{MT}{sfx}.cu", "fa2tc_",
                       f"_d{d}_bc{B_c}_mt{MT}{sfx}", sigs)


ptr, ptr32, ptr16 = _tc.ptr, _tc.ptr32, _tc.ptr16


# ---------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------
@specialisation
def fa2_tc_kernel(B_r, B_c, d, causal, has_mask, count, MT=1, window=False, dt="fp16",
                  dropout=False):
    """Kernel(q, k, v, o, L, scale2, N, N_k, lo, hi, H, G, mask, counters, key0, key1,
    offset, thr, rp).

    q, o: (instances, N, d); k, v: (kv instances, N_k, d); all fp16 (float16 arrays) or bf16
    (uint16 arrays of the bits), as `dt` says (the C++ copies read and write them as 16-byte
    chunks when d % 8 == 0, else element by element); L: (instances, N) float32; scale2 = scale * log2(e) (float32: S is formed in
    base 2, so P = exp2(S - m) and L = m ln 2 + log l); N, N_k, lo, hi, H, G as
    gpu.forward.fa2 (the band of gpu.forward._band; window its compile-time flag); mask uint8
    (T_r, T_c); counters int64 (gpu._launch). Grid (T_r, instances), 2 B_r / MT threads
    (one warp per 16 MT query rows), `layout(...)["bytes"]` dynamic shared bytes. The
    global arrays must be 16-byte aligned (`run` checks). key0, key1, offset, thr: uint64,
    rp: float32, the dropout (gpu._philox.kernel_args), read only when `dropout` (compile
    flag): as gpu.forward.fa2, l sums P~ before dropout and P~ o Z / (1 - p) enters the PV
    product (Z[row, col] of instance z by Philox, `softmax_mtile`).
    """
    err = plan_error(B_r, B_c, d, dt, MT)
    if err:
        raise ValueError(err)
    DP = padded(d)                # head dim of the tile products (zero columns d .. DP - 1)
    PADC = DP - d                 # padded columns per shared row
    VEC = d % 8 == 0              # rows move in 16-byte chunks (cp.async), else element-wise
    QREG = DP <= QREG_MAX         # Q_w's A fragments held in registers
    X = externs(DP, B_c, MT, dt)
    load_q, qk, qk_smem, pv, store_o = (X["load_q"], X["qk"], X["qk_smem"], X["pv"],
                                        X["store_o"])
    cp16, st16, cp2, st2 = X["cp16"], X["st16"], X["cp2"], X["st2"]
    cp_commit, cp_wait1, cp_wait0 = X["cp_commit"], X["cp_wait1"], X["cp_wait0"]
    RW = 16 * MT                  # query rows per warp
    NW = B_r // RW
    THREADS = 32 * NW
    lay = layout(B_r, B_c, d)
    SH, SW = lay["SH"], lay["SW"]
    QO, KO, VO, LO, KV = lay["QO"], lay["KO"], lay["VO"], lay["LO"], lay["KV"]
    DW = d // 2                   # words per row in global memory (VEC)
    CPR = d // 8 if VEC else d    # copies per row: 16-byte chunks (8 elements) or elements
    QC, KC = B_r * CPR, B_c * CPR  # chunks per Q_i and per K_j tile
    LQ = -(-QC // THREADS)
    LK = -(-KC // THREADS)
    QDIV = QC % THREADS == 0
    KDIV = KC % THREADS == 0
    NTS = B_c // 8                # key-column fragments of S (4 floats each)
    NTO = DP // 8                 # head-column fragments of O
    NQF, NSF, NOF = DP // 4, B_c // 2, DP // 2   # fragment lengths per m-tile (registers)
    NH = 2 * MT                   # rows per thread: g + 8 h' in each m-tile
    LQF, LSF, LOF = MT * NQF if QREG else 1, MT * NSF, MT * NOF   # whole fragment arrays
    IQ, IK, IV, IO, IL = T["Q"], T["K"], T["V"], T["O"], T["L"]
    FULL = 0xFFFFFFFF
    LN2_ = np.float32(LN2)
    EIGHT = int64(8)              # elements per 16-byte chunk
    CW = EIGHT if VEC else int64(1)   # elements per copy
    ZROWS = B_r + 4 * B_c         # shared rows with padded columns: Qs, then Ks, Vs x 2
    banded = causal or window
    ALIGN = None if SIM else 16   # the simulator (tests' emulation) takes no alignment

    next_tile = active_tile_finder(B_c, banded, has_mask)

    @cuda.jit(device=True, inline=True)
    def issue_kv(smp, kp, vp, kvbase, j, N_k, t, buf, smh, kh, vh):
        """Start the asynchronous copies of this thread's chunks of K_j and V_j into
        buffer `buf` (rows past N_k: zeros, not loaded); returns the elements of K it
        requested from global memory (= of V). d % 8 != 0: element-wise copies through
        registers instead (kvbase then in elements, kh, vh, smh 16-bit pointers)."""
        n = int64(0)
        c0 = j * B_c
        for it in range(LK):
            e = t + it * THREADS
            if KDIV or e < KC:
                c = e // CPR
                if VEC:
                    x = (e % CPR) * 4
                    ok = c0 + c < N_k
                    goff = kvbase + (c0 + c) * DW + x
                    cp16(smp, KO + buf * KV + c * SW + x, kp, goff, ok)
                    cp16(smp, VO + buf * KV + c * SW + x, vp, goff, ok)
                else:
                    x = e % CPR
                    ok = c0 + c < N_k
                    goff = kvbase + (c0 + c) * d + x
                    cp2(smh, 2 * (KO + buf * KV + c * SW) + x, kh, goff, ok)
                    cp2(smh, 2 * (VO + buf * KV + c * SW) + x, vh, goff, ok)
                if ok:
                    n += CW
        return n

    # The online softmax and the final normalisation act on one m-tile (16 rows) at a time:
    # called once per m-tile with a constant mt, each inlined copy's loops unroll fully,
    # so the fragment arrays stay in registers (one loop over all m-tiles did not unroll
    # at MT = 2 and put them in local memory).
    @cuda.jit(device=True, inline=True)
    def softmax_mtile(s, oa, m2, l2, mt, rw, c0, N_k, lo, hi, edge, scale2, g, qd,
                      z, key0, key1, offset, thr, rp):
        """Algorithm 1 lines 10-12 for rows g and g + 8 of m-tile mt: S -> S scale log2 e
        (entries past N_k or outside the band -inf), m_new = max(m, rowmax), P~ = exp2(S - m_new) in place,
        l = exp2(m - m_new) l + rowsum P~ (this thread's columns), O *= exp2(m - m_new).
        dropout: l takes P~ before dropout; then P~[row, col] -> P~ / (1 - p) where Philox
        keeps (row, col) of instance z, else 0 (what pv multiplies; Algorithm 2)."""
        for hh in range(2):
            h = 2 * mt + hh
            row = rw + 16 * mt + g + 8 * hh
            mx = NEG_INF
            for nt in range(NTS):
                for u in range(2):
                    e = mt * NSF + 4 * nt + 2 * hh + u
                    sv = s[e] * scale2
                    if edge:
                        col = c0 + 8 * nt + 2 * qd + u
                        if col >= N_k or (banded and (col - row > hi or col - row < lo)):
                            sv = NEG_INF
                    s[e] = sv
                    mx = max(mx, sv)
            # the 4 lanes of a row (same g) hold its B_c columns
            mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 1))
            mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 2))
            m_new = max(m2[h], mx)
            m_safe = m_new if m_new > NEG_INF else ZERO
            alpha = math.exp2(m2[h] - m_safe)           # 0 while nothing was visible
            m2[h] = m_new
            ps = ZERO
            # dropout: Z's entries of this row first, bit 2 nt + u of one uint64 (B_c / 4
            # <= 32 of them), so that the fragment loop stays free of Philox and unrolls
            # (with the calls inside it, B_c = 128 put s and oa in local memory)
            zb = uint64(0)
            if dropout:
                for b in range(2 * NTS):
                    if _philox.keep(key0, key1, offset, z, row,
                                    c0 + 8 * (b >> 1) + 2 * qd + (b & 1), thr):
                        zb |= uint64(1) << uint64(b)
            for nt in range(NTS):
                for u in range(2):
                    e = mt * NSF + 4 * nt + 2 * hh + u
                    p = math.exp2(s[e] - m_safe)
                    ps += p                             # l: P~ before dropout
                    if dropout:                         # P~ o Z / (1 - p), Z by Philox
                        if (zb >> uint64(2 * nt + u)) & uint64(1):
                            p = p * rp
                        else:
                            p = ZERO
                    s[e] = p
            l2[h] = l2[h] * alpha + ps
            for nt in range(NTO):
                oa[mt * NOF + 4 * nt + 2 * hh] *= alpha
                oa[mt * NOF + 4 * nt + 2 * hh + 1] *= alpha

    @cuda.jit(device=True, inline=True)
    def finish_mtile(oa, m2, l2, smf, mt, lbase, g, qd, mask, i, rw, N_k, lo, hi):
        """Rows g, g + 8 of m-tile mt: l = sum of the 4 lanes' parts; O = O / l;
        L = m ln 2 + log l -> Ls. Where l > 0 fails: O = 0 and L = -inf for a row that
        sees no key (`sees_key_band`, from the band and the mask), NaN for one that does (l is NaN after a
        NaN or Inf input)."""
        for hh in range(2):
            h = 2 * mt + hh
            ls = l2[h]
            ls += cuda.shfl_xor_sync(FULL, ls, 1)
            ls += cuda.shfl_xor_sync(FULL, ls, 2)
            if ls > ZERO:
                inv = ONE / ls
                Lr = m2[h] * LN2_ + math.log(ls)
            elif sees_key_band(mask, i, rw + 16 * mt + g + 8 * hh, B_c, N_k, lo, hi, banded,
                               has_mask):
                inv = NAN
                Lr = NAN
            else:
                inv = ZERO
                Lr = NEG_INF
            for nt in range(NTO):
                oa[mt * NOF + 4 * nt + 2 * hh] *= inv
                oa[mt * NOF + 4 * nt + 2 * hh + 1] *= inv
            if qd == 0:
                smf[lbase + 16 * mt + g + 8 * hh] = Lr

    def kernel(q, k, v, o, L, scale2, N, N_k, lo, hi, H, G, mask, counters, key0, key1,
               offset, thr, rp):
        if causal:   # heaviest query blocks (most key tiles) first
            i = cuda.gridDim.x - 1 - cuda.blockIdx.x
        else:
            i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5                                      # warp: query rows RW w .. RW w + RW - 1
        g = lane >> 2                                   # fragment row (and g + 8)
        qd = lane & 3                                   # fragment column pair 2 qd, 2 qd + 1
        zk = (z // H) * (H // G) + (z % H) // G         # this head's K/V instance
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        smf = cuda.shared.array(0, float32, alignment=ALIGN)
        smp = ptr(sm)
        kp = ptr32(k)                                   # 16-bit arrays as 4-byte words
        vp = ptr32(v)
        if VEC:
            kvbase = int64(zk) * N_k * DW               # word offset of this head's K, V
        else:
            kvbase = int64(zk) * N_k * d                # element offset
        smh = ptr16(sm)
        kh = ptr16(k)
        vh = ptr16(v)
        qf = cuda.local.array(LQF, uint32)         # A fragments of Q_w (16-bit pairs)
        s = cuda.local.array(LSF, float32)         # S_w, then P~_w
        oa = cuda.local.array(LOF, float32)        # O_w accumulators
        m2 = cuda.local.array(NH, float32)              # running max (base 2), rows g, g + 8
        l2 = cuda.local.array(NH, float32)              # running sum (this thread's part)
        nQ = int64(0)
        nK = int64(0)
        nO = int64(0)
        nL = int64(0)

        r0 = i * B_r
        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        rw = r0 + RW * w                                # first query row of this warp
        T_c = (N_k + B_c - 1) // B_c
        # ---- padded columns d .. DP - 1 of every shared row: zeros, never loaded ----
        if PADC:
            smz = cuda.shared.array(0, uint16, alignment=ALIGN)
            for e in range(t, ZROWS * PADC, THREADS):
                smz[(e // PADC) * SH + d + e % PADC] = uint16(0)
        # ---- copy group 1: Q_i -> Qs (zero rows past N); group 2: the first K_j, V_j ----
        qp = ptr32(q)
        qh = ptr16(q)
        if VEC:
            qbase = (int64(z) * N + r0) * DW
        else:
            qbase = (int64(z) * N + r0) * d
        for it in range(LQ):
            e = t + it * THREADS
            if QDIV or e < QC:
                r = e // CPR
                if VEC:
                    x = (e % CPR) * 4
                    ok = r < rows
                    cp16(smp, QO + r * SW + x, qp, qbase + r * DW + x, ok)
                else:
                    x = e % CPR
                    ok = r < rows
                    cp2(smh, 2 * (QO + r * SW) + x, qh, qbase + r * d + x, ok)
                if count and ok:
                    nQ += CW
        cp_commit()
        j = next_tile(0, T_c, r0, last, N_k, lo, hi, mask, i)
        buf = 0
        if j < T_c:
            nK += issue_kv(smp, kp, vp, kvbase, j, N_k, t, buf, smh, kh, vh)
        cp_commit()
        cp_wait1()                                      # Q_i has landed (this thread's part)
        cuda.syncthreads()                              # ... and everyone's
        if QREG:
            load_q(ptr(qf), smp, QO + RW * w * SW, SH)
        for h in range(NH):
            m2[h] = NEG_INF
            l2[h] = ZERO
        for b in range(LOF):
            oa[b] = ZERO

        while j < T_c:
            c0 = j * B_c
            # next active tile's copies into the other buffer, in flight during this one
            jn = next_tile(j + 1, T_c, r0, last, N_k, lo, hi, mask, i)
            if jn < T_c:
                nK += issue_kv(smp, kp, vp, kvbase, jn, N_k, t, 1 - buf, smh, kh, vh)
            cp_commit()
            cp_wait1()                                  # tile j has landed
            cuda.syncthreads()
            ko = KO + buf * KV
            vo = VO + buf * KV
            # A warp whose rows see no key of this tile (outside the band) skips its
            # products: P would be all zero (exact).
            c_last = min(c0 + B_c, N_k) - 1
            if not banded or tile_in_band(rw, rw + RW - 1, c0, c_last, lo, hi):
                # ---- S_w = Q_w K_j^T on the tensor cores (fp32 accumulators) ----
                if QREG:
                    qk(ptr(s), ptr(qf), smp, ko, SH)
                else:
                    qk_smem(ptr(s), smp, QO + RW * w * SW, SH, ko, SH)
                # ---- scale (base 2), mask, online softmax, one m-tile at a time ----
                # edge: some entry of the warp's 16 MT x B_c tile is past N_k or outside
                # the band (c - r over it spans c0 - (rw + RW - 1) .. c0 + B_c - 1 - rw)
                edge = c0 + B_c > N_k or (banded and (c0 + B_c - 1 - rw > hi or
                                                      c0 - rw - RW + 1 < lo))
                softmax_mtile(s, oa, m2, l2, 0, rw, c0, N_k, lo, hi, edge, scale2, g, qd,
                              z, key0, key1, offset, thr, rp)
                if MT > 1:
                    softmax_mtile(s, oa, m2, l2, 1, rw, c0, N_k, lo, hi, edge, scale2, g, qd,
                                  z, key0, key1, offset, thr, rp)
                # ---- O_w += P~_w V_j on the tensor cores (P rounded to fp16 / bf16) ----
                pv(ptr(oa), ptr(s), smp, vo, SH)
            cuda.syncthreads()                          # all done with buffer `buf`
            buf = 1 - buf
            j = jn
        cp_wait0()                                      # nothing left in flight
        # ---- l: add the 4 lanes' partial sums; O_i = O / l, L_i = m ln 2 + log l ----
        finish_mtile(oa, m2, l2, smf, 0, LO + RW * w, g, qd, mask, i, rw, N_k, lo, hi)
        if MT > 1:
            finish_mtile(oa, m2, l2, smf, 1, LO + RW * w, g, qd, mask, i, rw, N_k, lo, hi)
        # each warp overwrites only its own rows of Qs, which only it read (load_q); other
        # lanes of the warp read them (ldmatrix), so order those reads first: in a block
        # that saw no key tile no barrier came between (compute-sanitizer racecheck)
        cuda.syncwarp()
        store_o(smp, QO + RW * w * SW, SH, ptr(oa))
        cuda.syncthreads()
        # O_i and L_i leave row by row: consecutive threads store consecutive 16-byte chunks
        # (the real d columns only: the padded ones are never stored)
        op = ptr32(o)
        if VEC:
            obase = (int64(z) * N + r0) * DW
        else:
            obase = (int64(z) * N + r0) * d
        oh = ptr16(o)
        for e in range(t, rows * CPR, THREADS):
            r = e // CPR
            if VEC:
                x = (e % CPR) * 4
                st16(op, obase + r * DW + x, smp, QO + r * SW + x)
            else:
                x = e % CPR
                st2(oh, obase + r * d + x, smh, 2 * (QO + r * SW) + x)
            if count:
                nO += CW
        for r in range(t, rows, THREADS):
            L[z, r0 + r] = smf[LO + r]
            if count:
                nL += 1
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nK)
            add_count(counters, IO, WRITE, nO)
            add_count(counters, IL, WRITE, nL)

    name = kernel_name("fa2_tc", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal, window=window,
                       mask=has_mask, dropout=dropout,
                       count=count, mt=MT if MT > 1 else False)
    return kernel, name


def get_kernel(B_r, B_c, d, causal, has_mask, count, MT=1, window=False, dt="fp16",
               dropout=False):
    """The compiled dispatcher for one specialisation (window: a local window is given,
    gpu.forward._band; dt: "fp16" or "bf16"; dropout: the dropout build)."""
    err = plan_error(B_r, B_c, d, dt, MT)
    if err:
        raise ValueError(f"fa2_tc: {err}")
    return fa2_tc_kernel(int(B_r), int(B_c), int(d), bool(causal), bool(has_mask),
                         bool(count), int(MT), bool(window), str(dt), bool(dropout))


def run(q3, k3, v3, o3, L2, scale, N, H, G, mask, counters, *, B_r, B_c, dt, causal, count,
        threads=None, MT=1, N_k=None, window=(-1, -1), dropout=None):
    """Launch on 3-D 16-bit device views q3, o3 (instances, N, d), k3, v3 (kv instances,
    N_k, d; N_k default N): float16 arrays for dt="fp16", uint16 arrays of the bfloat16
    bits for dt="bf16"; writes o3 (same kind) and L2. Same signature as gpu.forward.fa2.run
    (threads, if given, must be 2 B_r / MT: one warp per 16 MT query rows). dropout: None,
    or (dropout_p, seed, offset) (iosim.dropout; p > 0 compiles the dropout build)."""
    from .._launch import launch
    if dt not in DTYPES:
        raise ValueError(f"fa2_tc: dt={dt!r}; the tensor-core kernel takes {DTYPES}")
    d = q3.shape[2]
    want = threads_per_block(B_r, MT)
    if threads is not None and int(threads) != want:
        raise ValueError(f"fa2_tc runs one warp per {16 * MT} query rows: threads must be "
                         f"{want} for B_r={B_r}, MT={MT} (got threads={threads})")
    for name, arr in (("q", q3), ("k", k3), ("v", v3), ("o", o3)):
        _tc.check_dtype("fa2_tc", name, arr, dt)
        _tc.check_aligned("fa2_tc", name, arr)
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    drop = _philox.kernel_args(*(dropout or ()))
    kern = get_kernel(B_r, B_c, d, causal, mask is not None, count, MT, windowed, dt,
                      bool(dropout and dropout[0] > 0))
    T_r = -(-N // B_r)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (T_r, q3.shape[0]), want, layout(B_r, B_c, d)["bytes"],
           q3, k3, v3, o3, L2, np.float32(scale * LOG2E),
           np.int64(N), np.int64(N_k), lo, hi, np.int64(H), np.int64(G), mk, counters, *drop)


def linked_ptx(B_r, B_c, d, causal=False, has_mask=False, count=False, MT=1,
               cc=(9, 0), window=False, dt="fp16", dropout=False) -> str:
    """The PTX of one specialisation after link-time optimisation with its C++ functions,
    built without a GPU (Numba's NVVM, NVRTC and nvJitLink only): what runs, for
    inspection. A correct build has the tile functions inlined (no `call`), its fragments
    in registers (no `.local`), mma.sync and ldmatrix, and no float64 (tests/test_gpu_tc.py
    checks these; ptxas -v on it reports registers and spills). Uses numba-cuda's internal
    compile entry point (numba-cuda 0.30.4); the PTX .version is nvJitLink's."""
    return _tc.linked_ptx(get_kernel(B_r, B_c, d, causal, has_mask, count, MT, window, dt,
                                     dropout), signature(dt), cc)


def signature(dt="fp16"):
    """Argument types of the kernel (for compiling without a GPU): 16-bit arrays as dt
    arrives (gpu._tc.ARRAY_DTYPES)."""
    from numba.cuda import types as nb
    W = _tc.array_type(dt)
    return (W, W, W, W, nb.Array(nb.float32, 2, "C"), nb.float32, nb.int64, nb.int64,
            nb.int64, nb.int64, nb.int64, nb.int64, nb.Array(nb.uint8, 2, "C"),
            nb.Array(nb.int64, 2, "C"), nb.uint64, nb.uint64, nb.uint64, nb.uint64,
            nb.float32)


__all__ = ["DTYPES", "D_MAX", "padded", "layout", "plan_error", "supports", "externs", "fa2_tc_kernel", "get_kernel",
           "run", "linked_ptx", "signature"]
