"""FlashAttention (Algorithm 1 of Dao et al. 2022, as written) for fp16 / bf16 on the tensor cores.

Same schedule, hence the same HBM traffic and the same iosim ledger, as `gpu.forward.fa1`
and `iosim.schedules.fa1_forward`: ONE thread block per (batch, head) instance runs the
whole loop, key blocks outer, query blocks inner:
    step 2:  write O = 0 (N x d, fp16), l = 0, m = -inf (N each, float32) to HBM;
    step 5:  for j in 0..T_c-1:  step 6: read K_j, V_j (always, active tiles or not);
    step 7:    for each active i (causal: skip j B_c > last row of block i; block_mask
               False: skip; skipped tiles cost no traffic):
    step 8:      read Q_i, O_i, l_i, m_i;
    9-11:        S = scale Q_i K_j^T; m_new = max(m_i, rowmax S);
                 l_new = e^{m_i - m_new} l_i + rowsum e^{S - m_new};
    step 12:     O_i = diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{S - m_new} V_j),
                 written in fp16 (the problem dtype: rounded after every key block);
    step 13:     write l_i = l_new, m_i = m_new.
Ragged N: only valid rows are loaded / stored (and counted). The per-row arithmetic is
Algorithm 1 lines 10-12 with e^{m~ - m_new} folded into P~ (P = e^{S - m_new} =
e^{m~ - m_new} P~): P stays in [0, 1] when rounded to fp16 for the tensor cores (P~ / l_new,
the plain kernel's on-chip product, would be fp16-subnormal for long rows).

FlashAttention-2's technology, so that fa1 against fa2 measures the algorithm (its O, l, m
round trips and its one block per instance), not slower arithmetic: the tile products on
the tensor cores (`gpu/mma.cuh`: mma.sync m16n8k16, ldmatrix; linked CUDA C++, inlined by
link-time optimisation), one warp per 16 MT query rows of Q_i (B_r = 16 MT warps), S and
P and the new O_i in registers, all global reads as cp.async (no registers):
  * Q_i, O_i, l_i, m_i: `stages` shared slots (2 or 3); the copies of the next
    stages - 1 active tiles are in flight while this one computes, one cp.async group per
    tile. A tile is issued ahead only if no tile before it that is still to be computed
    has its query block (it reads the O_i, l_i, m_i those write: the case at T_r <= 2 and
    at the last tiles of a causal column) and its key block is this one's or the next;
    otherwise it is issued when it becomes the current tile, after the last one's stores;
  * K_j, V_j: two shared buffers; the next column's copies start with the first of its
    tiles issued ahead; a key block without active tiles is read all the same (step 6)
    when the schedule reaches it;
  * the old O_i comes into the fp32 accumulator fragments from shared memory (each thread
    its rows g, g + 8, columns 2q, 2q + 1: `load_o`), scaled by e^{m_i - m_new} l_i;
    P V_j is added on the tensor cores; the result times 1 / l_new goes back to the slot
    as fp16 (`store_o`) and leaves in 16-byte stores, each warp its own rows (no block
    barrier); l_new, m_new leave from registers;
  * a warp whose rows all lie above a causal tile's first key skips the products (its
    rows keep O_i, l_i, m_i: they are stored back unchanged, bit for bit, as loaded).
Non-finite inputs as `gpu.forward.fa1`: a row updates on every tile in which it sees a key
(decided from the causal mask), so a NaN or Inf score makes its l and O NaN; a row that
sees no key keeps O = 0, l = 0, m = -inf. m is kept in base 2 on chip (S scale log2 e,
exp2) and stored in natural units (m_new ln 2; unchanged rows store the m they read).

Shared memory (one dynamic buffer, 4-byte words; fp16 rows padded to d + 8 halves):
    slot s < stages (SLOT words each): Qs B_r x (d+8) | Os B_r x (d+8) | ls B_r | ms B_r
    buffer b = 0, 1 (KV words each):   Ks B_c x (d+8) | Vs B_c x (d+8)
e.g. 183 KB at the d = 64 default (128 x 128, 3 stages). Registers (ptxas -v, sm_90, no
spills): 230 at the d = 64 default, 250 causal; 240-254 at the d = 128 default.
Dropout (compile flag `dropout`, `run(..., dropout=(p, seed, offset))`; the paper's
Algorithm 2, as gpu.forward.fa1): l~ sums P before dropout, then each P entering the
P V_j product is multiplied by Z / (1 - p), Z the Philox keep mask of gpu._philox (the
thread's entries of a row drawn into a bit mask before the unrolled fragment loop, as
gpu.forward.fa2_tc); P o Z / (1 - p) <= 1 / (1 - p) is rounded to fp16 / bf16 for the
product. No extra HBM traffic. Without `dropout` the kernel's code is the one it was
before (it takes the five dropout arguments last and does not read them). The dropout
build at B_c = 128 (the d = 64 default) puts fragments in local memory (linked PTX,
sm_90; as gpu.forward.fa2_tc's at B_c = 128): correct, slower, untimed; at 128 x 64
(the d = 128 default) it stays in registers.
fp16 or bf16 (DTYPES: bf16 data as uint16 arrays of the bits; O in HBM then rounded to
bf16 after every key block, P~ to bf16 for the products); d a multiple of 16.
The simulator cannot run the linked C++: without a GPU this kernel is built and linked but
not run; tests/fa1_tc_sim.py runs its Python there with the C++ pieces emulated (schedule,
counts, statistics, cp.async timing hazards).
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np
from numba import cuda, float32, int64, uint32, uint64

from .. import _philox, _tc
from .._launch import NEG_INF, ONE, READ, SIM, WRITE, ZERO, T, add_count, dummy_mask, \
    kernel_name, specialisation

#: CUDA C++ source of the fa1-specific pieces (instantiated per (d, B_c, MT)).
CU_PATH = os.path.join(os.path.dirname(__file__), "fa1_tc.cu")
# the launch geometry (which tilings run, threads, shared-memory layout): iosim.launch
from iosim.launch.forward import fa1_tc as _geometry
from iosim.launch.forward.fa1_tc import default_tiling, layout, plan_error, threads_per_block

WARPS, M_TILES, STAGES, DTYPES = _geometry.WARPS, _geometry.M_TILES, _geometry.STAGES, _geometry.DTYPES
DEFAULT_TILES = _geometry.DEFAULT_TILES
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def supports(B_r: int, B_c: int, d: int, dt: str = "fp16", smem_limit=None, MT: int = 1,
             stages: int = 2) -> bool:
    """True if this kernel runs (B_r, B_c, d, dt) here: a real GPU (the simulator cannot run
    linked device functions), a supported shape, shared memory that fits."""
    if SIM or plan_error(B_r, B_c, d, dt, MT, stages) is not None:
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return layout(B_r, B_c, d, stages)["bytes"] <= smem_limit


# ---------------------------------------------------------------------------------------
# The linked C++ functions
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def externs(d: int, B_c: int, MT: int = 1, dt: str = "fp16") -> dict:
    """The C++ functions for (d, B_c, MT) and element type dt ("fp16", "bf16"), declared to Numba (C ABI, each returns int 0;
    generic pointers, offsets in 4-byte words, strides in halves): qk (S = Q K^T, both from
    shared), pv (O += P V), load_o / store_o (16-bit rows <-> fp32 fragments), cp16 / cp4
    (asynchronous 16- / 4-byte copies, zero-filled when not valid), st16 (16 bytes shared ->
    global), zero16 (16 zero bytes to global), cp_commit, cp_wait1, cp_wait0."""
    from numba.cuda import types as nb
    pu, pf, i32, i64 = nb.CPointer(nb.uint32), nb.CPointer(nb.float32), nb.int32, nb.int64
    sigs = dict(qk=i32(pf, pu, i32, i32, i32, i32), pv=i32(pf, pf, pu, i32, i32),
                load_o=i32(pf, pu, i32, i32), store_o=i32(pu, i32, i32, pf),
                cp16=i32(pu, i32, pu, i64, i32), cp4=i32(pu, i32, pu, i64, i32),
                st16=i32(pu, i64, pu, i32), zero16=i32(pu, i64),
                cp_commit=i32(), cp_wait0=i32(), cp_wait1=i32(), cp_wait2=i32())
    elem, sfx = _tc.ELEMENTS[dt]
    src = _tc.source(CU_PATH, f"FA1TC_INSTANTIATE({d}, {B_c}, {MT}, {elem}, {sfx})")
    return _tc.declare(src, f"fa1_tc_d{d}_bc{B_c}_mt{MT}{sfx}.cu", "fa1tc_",
                       f"_d{d}_bc{B_c}_mt{MT}{sfx}", sigs)


ptr, ptr32 = _tc.ptr, _tc.ptr32


# ---------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------
@specialisation
def fa1_tc_kernel(B_r, B_c, d, causal, has_mask, count, MT=1, STAGES=2, dt="fp16",
                  dropout=False):
    """Kernel(q, k, v, o, l, m, scale2, N, H, G, mask, counters, key0, key1, offset, thr,
    rp). key0, key1, offset, thr (uint64), rp (float32): the dropout
    (gpu._philox.kernel_args), read only when `dropout` (compile flag): l~ sums P~ before
    dropout and P~ o Z / (1 - p) enters the P V_j product (as gpu.forward.fa1). Without
    `dropout` the kernel's code is the one it had before dropout existed: the five
    arguments come after the others and are not read (its SASS text is byte for byte the
    same, ptxas sm_90; only its parameter space grew by theirs).

    q, o: (instances, N, d); k, v: (kv instances, N, d): fp16 (float16 arrays) or bf16
    (uint16 arrays of the bits) as dt says; l, m: (instances, N)
    float32 (Algorithm 1's HBM statistics, m in natural units); scale2 = scale * log2(e);
    N, H, G, mask, counters as gpu.forward.fa1. Grid (instances,), 2 B_r / MT threads,
    `layout(...)["bytes"]` dynamic shared bytes; q, k, v, o 16-byte aligned (`run` checks).
    """
    err = plan_error(B_r, B_c, d, dt, MT, STAGES)
    if err:
        raise ValueError(err)
    X = externs(d, B_c, MT, dt)
    qk, pv, load_o, store_o = X["qk"], X["pv"], X["load_o"], X["store_o"]
    cp16, cp4, st16, zero16 = X["cp16"], X["cp4"], X["st16"], X["zero16"]
    cp_commit, cp_wait0 = X["cp_commit"], X["cp_wait0"]
    cp_wait1, cp_wait2 = X["cp_wait1"], X["cp_wait2"]
    RW = 16 * MT                  # query rows per warp
    NW = B_r // RW
    THREADS = 32 * NW
    lay = layout(B_r, B_c, d, STAGES)
    SH, SW, SLOT, KB, KV = lay["SH"], lay["SW"], lay["SLOT"], lay["KB"], lay["KV"]
    QO, OO, LS, MS, KO, VO = lay["QO"], lay["OO"], lay["LS"], lay["MS"], lay["KO"], lay["VO"]
    DW = d // 2                   # words per row in global memory
    CPR = d // 8                  # 16-byte chunks per row
    QC, KC = B_r * CPR, B_c * CPR
    LQ = -(-QC // THREADS)
    LK = -(-KC // THREADS)
    LL = -(-(2 * B_r) // THREADS)     # l_i and m_i elements per thread
    QDIV = QC % THREADS == 0
    KDIV = KC % THREADS == 0
    LDIV = (2 * B_r) % THREADS == 0
    WC = RW * CPR                 # 16-byte chunks of one warp's rows of O_i
    NTS = B_c // 8
    NTO = d // 8
    NSF, NOF = B_c // 2, d // 2
    NH = 2 * MT
    LSF, LOF = MT * NSF, MT * NOF
    IQ, IK, IV, IO, Il, Im = T["Q"], T["K"], T["V"], T["O"], T["l"], T["m"]
    FULL = 0xFFFFFFFF
    LN2_ = np.float32(LN2)
    LOG2E_ = np.float32(LOG2E)
    EIGHT = int64(8)
    ALIGN = None if SIM else 16   # the simulator (tests' emulation) takes no alignment

    @cuda.jit(device=True, inline=True)
    def wait_for(k):
        """Wait until at most k of this thread's copy groups are in flight (k <= 2)."""
        if k >= 2:
            cp_wait2()
        elif k == 1:
            cp_wait1()
        else:
            cp_wait0()

    @cuda.jit(device=True, inline=True)
    def active(i, j, N, mask):
        """Tile (i, j) is visited (iosim.active_tiles)."""
        if causal and j * B_c > min((i + 1) * B_r, N) - 1:
            return False
        if has_mask and mask[i, j] == 0:
            return False
        return True

    @cuda.jit(device=True, inline=True)
    def next_item(i, j, T_r, T_c, N, mask):
        """The active (i', j') after (i, j) in Algorithm 1's order (j outer, i inner);
        (0, T_c) when none is left."""
        i += 1
        while j < T_c:
            while i < T_r:
                if active(i, j, N, mask):
                    return i, j
                i += 1
            j += 1
            i = 0
        return int64(0), j

    @cuda.jit(device=True, inline=True)
    def issue_kv(smp, kp, vp, kvbase, j, N, t, buf):
        """Start this thread's copies of K_j, V_j into buffer `buf` (rows past N: zeros);
        returns the elements of K it requested (= of V)."""
        n = int64(0)
        c0 = j * B_c
        base = KB + buf * KV
        for it in range(LK):
            e = t + it * THREADS
            if KDIV or e < KC:
                c = e // CPR
                x = (e % CPR) * 4
                ok = c0 + c < N
                goff = kvbase + (c0 + c) * DW + x
                cp16(smp, base + KO + c * SW + x, kp, goff, ok)
                cp16(smp, base + VO + c * SW + x, vp, goff, ok)
                if ok:
                    n += EIGHT
        return n

    @cuda.jit(device=True, inline=True)
    def drain_kv(smp, kp, vp, kvbase, ja, jb, N, t, buf):
        """Step 6 for key blocks ja..jb-1 that have no active tile: K_j, V_j are read all
        the same (Algorithm 1 reads them before its inner loop), into buffer `buf`, and
        waited for (all of this thread's copies). Returns the elements of K requested."""
        n = int64(0)
        for jj in range(ja, jb):
            n += issue_kv(smp, kp, vp, kvbase, jj, N, t, buf)
            cp_commit()
            cp_wait0()
        return n

    @cuda.jit(device=True, inline=True)
    def issue_item(smp, qp, op, lp, mp, qbase, sbase, i, N, t, slot):
        """Step 8: start this thread's copies of Q_i, O_i, l_i, m_i into slot `slot` (rows
        past N: zeros). Returns the elements of Q (= of O) and of l (= of m) requested."""
        r0 = i * B_r
        rows = min(B_r, N - r0)
        so = slot * SLOT
        n = int64(0)
        nl = int64(0)
        for it in range(LQ):
            e = t + it * THREADS
            if QDIV or e < QC:
                r = e // CPR
                x = (e % CPR) * 4
                ok = r < rows
                goff = qbase + (r0 + r) * DW + x
                cp16(smp, so + QO + r * SW + x, qp, goff, ok)
                cp16(smp, so + OO + r * SW + x, op, goff, ok)
                if ok:
                    n += EIGHT
        for it in range(LL):
            e = t + it * THREADS
            if LDIV or e < 2 * B_r:
                if e < B_r:
                    ok = e < rows
                    cp4(smp, so + LS + e, lp, sbase + r0 + e, ok)
                    if ok:
                        nl += 1
                else:
                    r = e - B_r
                    cp4(smp, so + MS + r, mp, sbase + r0 + r, r < rows)
        return n, nl

    # Lines 9-11 and the per-row coefficients of line 12 for rows g, g + 8 of m-tile mt;
    # called once per m-tile with a constant mt so the fragment loops unroll (registers).
    # dropout (compiled in only for the dropout build; without it z .. rp are unused): l~
    # takes P before dropout, the P entering P V_j is P Z / (1 - p) (Algorithm 2).
    @cuda.jit(device=True, inline=True)
    def stats_mtile(s, coef, inv, lrow, mrow, smf, mt, so, lw, r0, c0, N, edge, scale2, g, qd,
                    z, key0, key1, offset, thr, rp):
        for hh in range(2):
            h = 2 * mt + hh
            rl = lw + 16 * mt + g + 8 * hh             # row in the slot
            row = r0 + rl
            mx = NEG_INF
            for nt in range(NTS):
                for u in range(2):
                    e = mt * NSF + 4 * nt + 2 * hh + u
                    sv = s[e] * scale2
                    if edge:
                        col = c0 + 8 * nt + 2 * qd + u
                        if col >= N or (causal and col > row):
                            sv = NEG_INF
                    s[e] = sv
                    mx = max(mx, sv)
            mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 1))   # the 4 lanes of a row
            mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 2))
            l_old = smf[so + LS + rl]
            m_nat = smf[so + MS + rl]
            # the row sees a key of this tile; the same for all 16 rows of the m-tile (c0
            # and the m-tile's first row are multiples of 16), so the shuffles below are
            # warp-uniform
            if not causal or row >= c0:
                m_old = m_nat * LOG2E_
                m_new = max(m_old, mx)                 # line 11 (base 2)
                ps = ZERO
                if dropout:
                    # this row's Z entries of the thread first, bit 2 nt + u of one uint64
                    # (B_c / 4 <= 32 of them; as gpu.forward.fa2_tc), so that the fragment
                    # loop stays free of Philox and unrolls
                    zb = _philox.U64_0
                    for b in range(2 * NTS):
                        if _philox.keep(key0, key1, offset, z, row,
                                        c0 + 8 * (b >> 1) + 2 * qd + (b & 1), thr):
                            zb |= _philox.U64_1 << uint64(b)
                for nt in range(NTS):
                    for u in range(2):
                        e = mt * NSF + 4 * nt + 2 * hh + u
                        p = math.exp2(s[e] - m_new)    # e^{m~ - m_new} P~
                        if dropout:
                            ps += p                    # l~: P~ before dropout
                            if (zb >> uint64(2 * nt + u)) & _philox.U64_1:
                                p = p * rp             # P~ o Z / (1 - p), Z by Philox
                            else:
                                p = ZERO
                            s[e] = p
                        else:
                            s[e] = p
                            ps += p
                ps += cuda.shfl_xor_sync(FULL, ps, 1)
                ps += cuda.shfl_xor_sync(FULL, ps, 2)
                a = math.exp2(m_old - m_new) * l_old    # e^{m_i - m_new} l_i
                l_new = a + ps                          # line 11
                coef[h] = a
                inv[h] = ONE / l_new
                lrow[h] = l_new
                mrow[h] = m_nat if m_new == m_old else m_new * LN2_
            else:                                      # sees nothing here: unchanged
                for nt in range(NTS):
                    for u in range(2):
                        s[mt * NSF + 4 * nt + 2 * hh + u] = ZERO
                coef[h] = ONE
                inv[h] = ONE
                lrow[h] = l_old
                mrow[h] = m_nat

    @cuda.jit(device=True, inline=True)
    def scale_mtile(oa, c, mt):
        for hh in range(2):
            f = c[2 * mt + hh]
            for nt in range(NTO):
                oa[mt * NOF + 4 * nt + 2 * hh] *= f
                oa[mt * NOF + 4 * nt + 2 * hh + 1] *= f

    def body(q, k, v, o, l_hbm, m_hbm, scale2, N, H, G, mask, counters, key0, key1, offset,
             thr, rp):       # (the kernel: `kernel = body` below)
        z = cuda.blockIdx.x
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        g = lane >> 2
        qd = lane & 3
        zk = (z // H) * (H // G) + (z % H) // G
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        smf = cuda.shared.array(0, float32, alignment=ALIGN)
        smp = ptr(sm)
        qp = ptr32(q)
        kp = ptr32(k)
        vp = ptr32(v)
        op = ptr32(o)
        lp = ptr32(l_hbm)
        mp = ptr32(m_hbm)
        kvbase = int64(zk) * N * DW
        qbase = int64(z) * N * DW                       # Q and O of this instance (words)
        sbase = int64(z) * N                            # l and m of this instance
        s = cuda.local.array(LSF, float32)              # S_w, then P_w
        oa = cuda.local.array(LOF, float32)             # O_w accumulators
        coef = cuda.local.array(NH, float32)            # e^{m_i - m_new} l_i per row
        inv = cuda.local.array(NH, float32)             # 1 / l_new
        lrow = cuda.local.array(NH, float32)            # l_new
        mrow = cuda.local.array(NH, float32)            # m_new (natural units)
        nQ = int64(0)
        nK = int64(0)
        nl = int64(0)
        nOw = int64(0)
        nlw = int64(0)
        T_r = (N + B_r - 1) // B_r
        T_c = (N + B_c - 1) // B_c

        # ---- step 2: O = 0, l = 0, m = -inf in HBM ----
        for e in range(t, N * CPR, THREADS):
            zero16(op, qbase + e * 4)
            if count:
                nOw += EIGHT
        for r in range(t, N, THREADS):
            l_hbm[z, r] = ZERO
            m_hbm[z, r] = NEG_INF
            if count:
                nlw += 1
        cuda.syncthreads()                              # ... before anything reads them

        # ---- the pipeline: the current tile (i, j) in slot sl; up to STAGES - 1 later
        # active tiles' copies in flight (the queue: a0, a1); (ni, nj) the first not yet
        # issued, for slot ns. A tile is issued ahead only if no tile before it that is
        # still to be computed has its query block (it reads the O_i, l_i, m_i they write)
        # and its key block is j or j + 1 (two K/V buffers); otherwise it is issued when it
        # becomes the current one, after the last one's stores (synchronously). Each tile's
        # copies are one group; nc counts the groups committed, g* is a tile's group.
        i, j = next_item(int64(-1), int64(0), T_r, T_c, N, mask)
        nc = int64(0)
        nK += drain_kv(smp, kp, vp, kvbase, int64(0), j, N, t, 0)  # leading empty columns
        nc += j
        kb = 0                                          # K/V buffer of column j
        kvn = int64(-1)                                 # column whose K/V is in buffer 1 - kb
        sl = 0                                          # slot of tile (i, j)
        gc = int64(0)                                   # its copy group
        if j < T_c:
            nK += issue_kv(smp, kp, vp, kvbase, j, N, t, 0)
            a, b = issue_item(smp, qp, op, lp, mp, qbase, sbase, i, N, t, 0)
            nQ += a
            nl += b
            cp_commit()
            nc += 1
            gc = nc
        ahead = 0                                       # tiles issued after (i, j)
        ai0 = int64(0)
        aj0 = int64(0)
        as0 = 0
        ag0 = int64(0)
        ai1 = int64(0)
        aj1 = int64(0)
        as1 = 0
        ag1 = int64(0)
        ni, nj = next_item(i, j, T_r, T_c, N, mask)
        ns = 1 % STAGES
        while j < T_c:
            # ---- issue the next tiles' copies (one group each), in flight during this one ----
            for _ in range(STAGES - 1):
                if ahead < STAGES - 1 and nj < T_c and nj <= j + 1:
                    clash = ni == i or (ahead >= 1 and ni == ai0)
                    if not clash:
                        if nj == j + 1 and kvn != nj:
                            nK += issue_kv(smp, kp, vp, kvbase, nj, N, t, 1 - kb)
                            kvn = nj
                        a, b = issue_item(smp, qp, op, lp, mp, qbase, sbase, ni, N, t, ns)
                        nQ += a
                        nl += b
                        cp_commit()
                        nc += 1
                        if ahead == 0:
                            ai0, aj0, as0, ag0 = ni, nj, ns, nc
                        else:
                            ai1, aj1, as1, ag1 = ni, nj, ns, nc
                        ahead += 1
                        ni, nj = next_item(ni, nj, T_r, T_c, N, mask)
                        ns = (ns + 1) % STAGES
            # tile (i, j) has landed: the groups committed after its own are the `ahead`
            # tiles in flight
            wait_for(nc - gc)
            cuda.syncthreads()
            r0 = i * B_r
            c0 = j * B_c
            so = sl * SLOT
            lw = RW * w                                 # this warp's first row in the slot
            rw = r0 + lw
            if not causal or c0 <= rw + RW - 1:
                # ---- step 9: S_w = Q_w K_j^T on the tensor cores ----
                qk(ptr(s), smp, so + QO + lw * SW, SH, KB + kb * KV + KO, SH)
                # ---- steps 10-11 (base 2): P = exp2(S - m_new), l_new, coefficients ----
                edge = c0 + B_c > N or (causal and c0 + B_c - 1 > rw)
                stats_mtile(s, coef, inv, lrow, mrow, smf, 0, so, lw, r0, c0, N, edge, scale2,
                            g, qd, z, key0, key1, offset, thr, rp)
                if MT > 1:
                    stats_mtile(s, coef, inv, lrow, mrow, smf, 1, so, lw, r0, c0, N, edge,
                                scale2, g, qd, z, key0, key1, offset, thr, rp)
                # ---- step 12: O = (e^{m - m_new} l O_old + P V_j) / l_new ----
                load_o(ptr(oa), smp, so + OO + lw * SW, SH)
                scale_mtile(oa, coef, 0)
                if MT > 1:
                    scale_mtile(oa, coef, 1)
                pv(ptr(oa), ptr(s), smp, KB + kb * KV + VO, SH)
                scale_mtile(oa, inv, 0)
                if MT > 1:
                    scale_mtile(oa, inv, 1)
                store_o(smp, so + OO + lw * SW, SH, ptr(oa))    # in place: this warp's rows
            else:
                # no row of this warp sees a key of this tile: O, l, m stay as read
                for h in range(NH):
                    rl = lw + 16 * (h // 2) + g + 8 * (h % 2)
                    lrow[h] = smf[so + LS + rl]
                    mrow[h] = smf[so + MS + rl]
            cuda.syncwarp()
            # ---- steps 12-13: write O_i (16-byte chunks), l_i, m_i: this warp's rows ----
            for e in range(lane, WC, 32):
                r = e // CPR
                x = (e % CPR) * 4
                if rw + r < N:
                    st16(op, qbase + (rw + r) * DW + x, smp, so + OO + (lw + r) * SW + x)
                    if count:
                        nOw += EIGHT
            if qd == 0:
                for h in range(NH):
                    row = rw + 16 * (h // 2) + g + 8 * (h % 2)
                    if row < N:
                        l_hbm[z, row] = lrow[h]
                        m_hbm[z, row] = mrow[h]
                        if count:
                            nlw += 1
            cuda.syncthreads()                          # slot sl free; O_i, l_i, m_i stored
            if ahead > 0:                               # the next tile is in flight
                if aj0 > j:                             # its K/V: the other buffer
                    kb = 1 - kb
                    kvn = int64(-1)
                i, j, sl, gc = ai0, aj0, as0, ag0
                ai0, aj0, as0, ag0 = ai1, aj1, as1, ag1
                ahead -= 1
            elif nj < T_c:                              # issue it now (see above)
                if nj > j:
                    # step 6 for the key blocks in between (no active tile: read all the same)
                    # (nothing is in flight here, so buffer 1 - kb holds no column yet)
                    nK += drain_kv(smp, kp, vp, kvbase, j + 1, nj, N, t, 1 - kb)
                    nc += nj - j - 1
                    nK += issue_kv(smp, kp, vp, kvbase, nj, N, t, 1 - kb)
                    kb = 1 - kb
                    kvn = int64(-1)
                a, b = issue_item(smp, qp, op, lp, mp, qbase, sbase, ni, N, t, ns)
                nQ += a
                nl += b
                cp_commit()
                nc += 1
                i, j, sl, gc = ni, nj, ns, nc
                ni, nj = next_item(ni, nj, T_r, T_c, N, mask)
                ns = (ns + 1) % STAGES
            else:                                       # no tile left
                nK += drain_kv(smp, kp, vp, kvbase, j + 1, T_c, N, t, 1 - kb)
                j = T_c
        cp_wait0()
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IO, READ, nQ)
            add_count(counters, Il, READ, nl)
            add_count(counters, Im, READ, nl)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nK)
            add_count(counters, IO, WRITE, nOw)
            add_count(counters, Il, WRITE, nlw)
            add_count(counters, Im, WRITE, nlw)

    kernel = body       # (a wrapper without the five arguments changed the build's code)
    name = kernel_name("fa1_tc", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal, mask=has_mask,
                       dropout=dropout, count=count, mt=MT if MT > 1 else False,
                       st=STAGES if STAGES != 2 else False)
    return kernel, name


def get_kernel(B_r, B_c, d, causal, has_mask, count, MT=1, stages=2, dt="fp16",
               dropout=False):
    """The compiled dispatcher for one specialisation (dt: "fp16" or "bf16"; dropout: the
    dropout build, five more arguments)."""
    err = plan_error(B_r, B_c, d, dt, MT, stages)
    if err:
        raise ValueError(f"fa1_tc: {err}")
    return fa1_tc_kernel(int(B_r), int(B_c), int(d), bool(causal), bool(has_mask),
                         bool(count), int(MT), int(stages), str(dt), bool(dropout))


def run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask, counters, *, B_r, B_c, dt, causal,
        count, threads=None, MT=1, stages=2, dropout=None):
    """Launch on 3-D 16-bit device views (instances, N, d): float16 arrays for dt="fp16",
    uint16 arrays of the bfloat16 bits for dt="bf16"; writes o3, l2, m2 (the arguments of
    gpu.forward.fa1.run; threads, if given, must be 2 B_r / MT). dropout: None, or
    (dropout_p, seed, offset) (p > 0 compiles the dropout build; without it the kernel
    gets gpu._philox.kernel_args()'s inert values)."""
    from .._launch import launch
    if dt not in DTYPES:
        raise ValueError(f"fa1_tc: dt={dt!r}; the tensor-core kernel takes {DTYPES}")
    d = q3.shape[2]
    want = threads_per_block(B_r, MT)
    if threads is not None and int(threads) != want:
        raise ValueError(f"fa1_tc runs one warp per {16 * MT} query rows: threads must be "
                         f"{want} for B_r={B_r}, MT={MT} (got threads={threads})")
    for name, arr in (("q", q3), ("k", k3), ("v", v3), ("o", o3)):
        _tc.check_dtype("fa1_tc", name, arr, dt)
        _tc.check_aligned("fa1_tc", name, arr)
    drop = bool(dropout and dropout[0] > 0)
    kern = get_kernel(B_r, B_c, d, causal, mask is not None, count, MT, stages, dt, drop)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (q3.shape[0],), want, layout(B_r, B_c, d, stages)["bytes"],
           q3, k3, v3, o3, l2, m2, np.float32(scale * LOG2E),
           np.int64(N), np.int64(H), np.int64(G), mk, counters,
           *_philox.kernel_args(*(dropout if drop else ())))


def signature(dt="fp16"):
    """Argument types of the kernel (for compiling without a GPU): 16-bit arrays as dt
    arrives (gpu._tc.ARRAY_DTYPES); the dropout's last (every build takes them)."""
    from numba.cuda import types as nb
    W = _tc.array_type(dt)
    F = nb.Array(nb.float32, 2, "C")
    return (W, W, W, W, F, F, nb.float32, nb.int64, nb.int64, nb.int64,
            nb.Array(nb.uint8, 2, "C"), nb.Array(nb.int64, 2, "C"),
            nb.uint64, nb.uint64, nb.uint64, nb.uint64, nb.float32)


def linked_ptx(B_r, B_c, d, causal=False, has_mask=False, count=False, MT=1, stages=2,
               cc=(9, 0), dt="fp16", dropout=False) -> str:
    """The PTX of one specialisation after link-time optimisation with its C++ functions,
    built without a GPU (see gpu._tc.linked_ptx): mma.sync, ldmatrix, cp.async; a correct
    build has no `call`, no `.local`, no float64."""
    return _tc.linked_ptx(get_kernel(B_r, B_c, d, causal, has_mask, count, MT, stages, dt,
                                     dropout), signature(dt), cc)


__all__ = ["DTYPES", "DEFAULT_TILES", "default_tiling", "layout", "threads_per_block", "plan_error",
           "supports", "externs", "fa1_tc_kernel", "get_kernel", "run", "signature",
           "linked_ptx"]
