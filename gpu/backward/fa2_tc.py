"""FlashAttention-2 backward for fp16 and bf16 on the tensor cores: the main kernel.

Same schedule, hence the same HBM traffic and the same iosim ledger, as the plain fa2
backward (`gpu.backward.flash`, `iosim.backward.fa2_backward`): one thread block per (key
block j, instance); read K_j, V_j once; for each active query block i (inside the causal /
window band of gpu.forward._band, below; block_mask[i, j] False: skip) read Q_i, dO_i,
L_i, D_i; then

    S = Q_i K_j^T,  P = exp(scale S - L_i)            (FA2 backward, Algorithm 2 l. 11-13)
    dV_j += P^T dO_i                                   (l. 14)
    dP = dO_i V_j^T,  dS = P o (dP - D_i)              (l. 15-16)
    dQ_i += scale dS K_j   (float32 atomic adds into dQacc: one read + one write counted)
    dK_j += scale dS^T Q_i                             (l. 18)

and write dK_j, dV_j once. The pre-pass (D = rowsum(dO o O), dQacc = 0), the dQ
conversion and the grouped-heads sum are `gpu.backward.flash`'s kernels, unchanged.

N_k != N_q and local windows (issue 18; the forward's convention, gpu.forward._band,
iosim.problem.band_of): K, V, dK, dV have N_k rows, Q, dO, dQ N = N_q; query row r sees
key c iff lo <= c - r <= hi, bottom-right aligned (o = N_k - N_q: causal hi = o, a window
(left, right) lo = o - left, hi = o + right, -1 unbounded). lo, hi are int64 kernel
arguments; the band code is compiled in for causal or a window (`window` flag: the lower
edge lo, which causal alone does not have). What is skipped, and what is masked:
  - query blocks outside the band of key block j: the block's loop runs over i_lo .. i_hi
    only, the query blocks whose rows meet [c0 - hi, c_last - lo] (`fa2_fast.band_blocks`,
    exactly iosim's active tiles of column j, `tile_in_band`): nothing of them is loaded,
    nothing computed. A key block that no query row sees runs no tile and writes
    dK_j = dV_j = 0.
  - inside an active tile, a warp whose 16 MT keys have no pair with the tile's rows in
    the band (or are all past N_k) skips its four products (exact: its P^T is all zero)
    and writes zeros for its dS^T rows;
  - the rest of a tile that crosses an edge of the band or N_k (`edge`) is masked entry
    by entry: P^T = dS^T = 0 outside (keys past N_k are zero rows of Ks, Vs too).
A query row that sees no key has L = -inf from the forward (stored +inf base 2: P = 0 on
its whole row), so its dQ stays 0 (dQacc was zeroed) and it adds nothing to dK, dV.
Counting convention (count=True; iosim.backward's fa2 closed form, the main kernel's
part): per instance K, V read N_k d; per active tile (i, j) Q_i, dO_i read rows_i d,
L_i, D_i rows_i, dQacc rows_i d read and rows_i d written (one float32 atomic add = one
read + one write); dK, dV written N_k d (per query head; the group sum is counted by its
own launch). Only rows < N_q, keys < N_k and the d real columns are requested and counted.

What runs where: as in the forward (`gpu.forward.fa2_tc`), the tile products are CUDA C++
(`gpu/mma.cuh`, instantiated by `fa2_tc.cu`: `mma.sync.m16n8k16`, `ldmatrix`, `cp.async`)
linked into this Numba kernel; the schedule, the loads and stores and their counting, the
masks and P, dS are Python here.

Versions (H100; results data set: kinds `bwd_tc_probe` (tilings) and `bench` (pass
fwd+bwd: 1.33 ms with the forward at d = 64, N = 4096, 16 heads; 1.50x torch FLASH)):
  v1  (this file) keys are the fragments' rows: warp w owns key rows 16 MT w .. of K_j, V_j,
      so S^T = K_w Q_i^T and dP^T = V_w dO_i^T come out as accumulator fragments whose
      pairs are exactly the A fragments of dV_w += P^T dO_i and dK_w += dS^T Q_i: P^T and
      dS^T never leave registers for those two. dQ_i = dS K_j needs all of dS's key
      columns per query row, so each warp writes its dS^T rows to shared memory (fp16 or bf16) and
      after a barrier the warps read it back transposed (ldmatrix.trans), 16 query rows
      x DN columns of dQ_i at a time, added to dQacc with float32 vector atomics. K_j, V_j's
      A fragments are re-read from shared memory at each product (holding them in
      registers, kreg=True at d <= 64, was no faster); Q_i, dO_i (and L_i, D_i) double-buffered,
      filled by cp.async while the previous tile computes; a warp whose keys all lie
      after the tile's last query row (causal) or past N skips its products (exact: its
      P is all zero) and writes zeros for its dS^T rows.
  v1b N_k != N_q and windows (issue 18): the band lo, hi as kernel arguments, the query
      blocks of key block j from `band_blocks`, the warp skip and the masks on the band
      (the lower edge compiled in only with `window`). ptxas -v (sm_90, CUDA 13.0), no
      spills: d = 64 64 x 128 212 registers (causal 225, window 245, causal + window 244);
      d = 128 32 x 64 252 (window 252), causal 32 x 128 254 (causal + window 244). Not
      yet timed on a GPU.

Paper names (FlashAttention-2 backward):
    B_c = 16 * MT * warps  key rows per block (block_cols); warp w owns keys 16 MT w ..
    B_r                    query rows per tile (block_rows), a multiple of 16; dQ_i is
                           computed in pieces of 16 rows x DN columns (`dq_cols`) dealt to
                           the warps in turn
    S^T, P^T, dP^T, dS^T   16 MT x B_r per warp, fp32 accumulator fragments (registers)
    dK_j, dV_j             16 MT x d per warp, fp32 accumulators (registers) for the block
    L_i, D_i               float32 in shared; L is stored base 2 (L log2 e; +inf for a row
                           that saw no key, or past N_q, so that P = 0 there)
    lo, hi                 the band: query row r sees key c iff lo <= c - r <= hi

Shared memory (one dynamic buffer, 16-byte aligned; 4-byte words; rows padded to D + 8
elements, dS^T rows to B_r + 8, so that no ldmatrix is bank-conflicted):
    Ks, Vs       B_c x (D + 8) elements each     (then dK_j, dV_j for the stores)
    Qs, dOs      2 buffers x B_r x (D + 8) elements each
    Ls, Ds       2 buffers x B_r float32 each
    dSs          B_c x (B_r + 8) halves          (dS^T of the current tile)
fp16 or bf16 (DTYPES; bf16 data as uint16 arrays of the bits, the products on
mma.sync's bf16 form, P^T and dS^T rounded to bf16). Head dims 1..128, padded to
D = padded(d) (a multiple of 16) in shared memory as the forward does
(`gpu.forward.fa2_tc`): columns d .. D - 1 of Ks, Vs, Qs, dOs zeroed once per block and
never loaded; the products run at D (the zeros add nothing to S^T, dP^T, and give zero
padded columns of dK, dV, dQ); what is requested from and written to global memory is
the d real columns of each row (16-byte copies when d % 8 == 0, single elements
otherwise; dQacc: float32 pair reductions for even d, scalar atomics for odd d), so the
counts are iosim's backward closed form unchanged. Above 128 dK_j's and dV_j's
accumulators (D floats a thread together) would not fit in registers.
The CUDA simulator cannot run linked device functions: without a GPU this kernel is built
(`linked_ptx`) but not run; tests marked `gpu` and `flashsim check --suite backward` run it
on a GPU.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np
from numba import cuda, float32, int64, uint16, uint32

from .. import _tc
from .._launch import (NEG_INF, READ, SIM, WRITE, ZERO, add_count, dummy_mask, kernel_name,
                       specialisation)
from ..forward._band import band_args, tile_in_band
from .fa2_fast import band_blocks

#: CUDA C++ source of the entry points (instantiated per shape by `externs`).
CU_PATH = os.path.join(os.path.dirname(__file__), "fa2_tc.cu")
#: Warps per block we generate (B_c = 16 * MT * warps).
WARPS = (2, 4, 8)
#: m-tiles of 16 key rows per warp.
M_TILES = (1, 2)
#: Element types this kernel runs (bf16 data arrive as uint16 arrays of the bits).
DTYPES = ("fp16", "bf16")
LOG2E = math.log2(math.e)
INF = np.float32(np.inf)


def padded(d: int) -> int:
    """The head dim the tile products run at: d rounded up to 16 (the shared tiles' columns
    d .. padded(d) - 1 hold zeros; gpu.forward.fa2_tc does the same)."""
    return -(-d // 16) * 16


def warps_of(B_c: int, MT: int) -> int:
    """Warps per block: one per 16 MT key rows of K_j."""
    return B_c // (16 * MT)


def layout(B_r: int, B_c: int, d: int) -> dict:
    """Offsets (4-byte words) of Ks, Vs, Qs (buffer b at QO + b QB), dOs (DOO + b QB),
    Ls (LO + b B_r), Ds (DSTO + b B_r), dSs; row strides in halves (SH, DSH) and words
    (SW, DSW); total bytes."""
    SH = padded(d) + 8
    SW = SH // 2
    DSH = B_r + 8
    DSW = DSH // 2
    KO = 0
    VO = B_c * SW
    QO = 2 * B_c * SW
    QB = B_r * SW
    DOO = QO + 2 * QB
    LO = DOO + 2 * QB
    DSTO = LO + 2 * B_r
    DSO = DSTO + 2 * B_r
    words = DSO + B_c * DSW
    return dict(SH=SH, SW=SW, DSH=DSH, DSW=DSW, KO=KO, VO=VO, QO=QO, QB=QB, DOO=DOO,
                LO=LO, DSTO=DSTO, DSO=DSO, words=words, bytes=4 * words)


def plan_error(B_r: int, B_c: int, d: int, dt: str, MT: int = 1) -> str | None:
    """Why this kernel cannot run the configuration, or None if it can (shared memory
    aside: see `supports`)."""
    if dt not in DTYPES:
        return f"dtype {dt}: the tensor-core backward takes {' or '.join(DTYPES)} only"
    if not 1 <= d <= 128:
        return (f"d={d}: the tensor-core backward takes head dims 1..128 (padded to 16 on "
                f"chip; above 128 dK_j's and dV_j's accumulators would not fit in registers)")
    if MT not in M_TILES:
        return f"MT={MT}: key m-tiles per warp must be one of {M_TILES}"
    if B_c % (16 * MT) or warps_of(B_c, MT) not in WARPS:
        return f"B_c={B_c}: must be 16 x MT x warps (MT={MT}), warps in {WARPS}"
    if B_r % 16 or not 16 <= B_r <= 128:
        return f"B_r={B_r}: must be a multiple of 16 in 16..128"
    return None


def supports(B_r: int, B_c: int, d: int, dt: str = "fp16", smem_limit=None, MT: int = 1,
             kreg=None) -> bool:
    """True if this kernel runs (B_r, B_c, d, dt) on the current device (a real GPU)."""
    if SIM or plan_error(B_r, B_c, d, dt, MT) is not None:
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return layout(B_r, B_c, d)["bytes"] <= smem_limit


def default_tiling(d: int, causal: bool = False) -> dict:
    """The tiling and options this kernel runs by default: dict(B_r, B_c, MT, kreg, DN),
    the fastest spill-free choice in the H100 timings of the main kernel alone (batch x
    heads = 16, N = 4096; results data set, kind `bench`, what `bwd_main`). d <= 64:
    64 x 128, 8 warps of 16 key rows, dQ_i in pieces of 16 rows x DN = 32 columns so all
    8 warps share them (1.57 ms; DN = 64: 1.66 ms, 4 warps idle in that phase); causal
    DN = 64 (1.23 ms; 32: 1.32). 64 x 128 with MT = 2 (4 warps of 32 keys) was ~10%
    faster but spills 700 bytes a thread. d = 128: 32 x 64 (4 warps; few query rows per
    tile keep S^T and dP^T in registers beside dK_j, dV_j: 2.45 ms; 64 x 128 was 2.23 ms
    but spills 40 bytes), causal 32 x 128 (at 32 x 64 the masking code spilled 12 bytes)."""
    if padded(d) <= 64:
        return dict(B_r=64, B_c=128, MT=1, kreg=False,
                    DN=padded(d) if causal else _piece(padded(d)))
    return dict(B_r=32, B_c=128 if causal else 64, MT=1, kreg=False, DN=dq_cols(d))


def holds_kv(d: int, kreg=None) -> bool:
    """K_w, V_w's A fragments held in registers (kreg=True; d <= 64 only: at d = 128 they
    do not fit beside the accumulators) or re-read from shared memory at each product
    (the default: as fast on the H100, 2.06 against 2.13 ms at 64 x 64, d = 64, and it
    leaves the registers to the accumulators)."""
    return False if kreg is None else bool(kreg) and padded(d) <= 64


# ---------------------------------------------------------------------------------------
# The linked C++ functions
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def externs(d: int, B_c: int, B_r: int, MT: int, DN: int, dt: str = "fp16") -> dict:
    """The C++ entry points (fa2_tc.cu) for one shape and element type (dt: "fp16" or
    "bf16"), declared to Numba (C ABI, return 0; generic pointers, offsets in 4-byte words,
    strides in 16-bit elements)."""
    from numba.cuda import types as nb
    pu, pf, i32, i64 = nb.CPointer(nb.uint32), nb.CPointer(nb.float32), nb.int32, nb.int64
    ph = nb.CPointer(nb.uint16)
    sigs = dict(load_a=i32(pu, pu, i32, i32), qk=i32(pf, pu, pu, i32, i32),
                qk_smem=i32(pf, pu, i32, i32, i32, i32), pv=i32(pf, pf, pu, i32, i32),
                store_s=i32(pu, i32, i32, pf), store_o=i32(pu, i32, i32, pf),
                dq=i32(pf, pu, i32, i32, i32, i32, i32),
                cp16=i32(pu, i32, pu, i64, i32), st16=i32(pu, i64, pu, i32),
                cp2=i32(ph, i32, ph, i64, i32), st2=i32(ph, i64, ph, i32),
                red2=i32(pf, i64, nb.float32, nb.float32),
                cp_commit=i32(), cp_wait1=i32(), cp_wait0=i32())
    elem, sfx = _tc.ELEMENTS[dt]
    suffix = f"_d{d}_bc{B_c}_br{B_r}_mt{MT}_dn{DN}{sfx}"
    src = _tc.source(CU_PATH, f"BWDTC_INSTANTIATE({d}, {B_c}, {B_r}, {MT}, {DN}, {elem}, {sfx})")
    return _tc.declare(src, f"bwd_tc{suffix}.cu", "bwdtc_", suffix, sigs)


def dq_cols(d: int) -> int:
    """Head columns of dQ_i computed per work item (DN): d up to 64 at once; at d = 128 in
    32-wide pieces, so the dQ accumulators (16 x DN per warp) fit in registers beside
    dK_j's and dV_j's (64-wide ones spilled at 32 x 64, causal)."""
    D = padded(d)
    return D if D <= 64 else _piece(D)


def _piece(D: int) -> int:
    """32 columns where they divide the padded head dim D, else 16 (D = 48, 80, 112)."""
    return 32 if D % 32 == 0 else 16


# ---------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------
@specialisation
def fa2_bwd_tc_kernel(B_r, B_c, d, causal, has_mask, count, MT=1, kreg=None, DN=None,
                      dt="fp16", window=False):
    """Kernel(q, k, v, do, L, Dst, dqacc, dk, dv, scale, scale2, N, N_k, lo, hi, H, G, mask,
    counters).

    q, do: (instances, N, d); k, v: (kv instances, N_k, d); dk, dv: (instances, N_k, d):
    fp16 (float16 arrays) or bf16 (uint16 arrays of the bits), as `dt` says; L, Dst:
    (instances, N) float32 (the forward's L, the pre-pass's D); dqacc: (instances, N, d)
    float32, zeroed; dk, dv per query head; scale; scale2 = scale log2 e; N: query rows
    N_q, N_k: key rows; lo, hi: the int64 band of gpu.forward._band (row r sees key c iff
    lo <= c - r <= hi; `band_args`), read only when `causal` or `window` (compile flags:
    the band code is in for either, its lower edge lo only with `window`); H, G as the
    plain backward; mask uint8 (T_r, T_c); counters int64 (gpu.backward.BT rows). Grid
    (T_c = ceil(N_k / B_c), instances), 32 warps_of(B_c, MT) threads,
    `layout(...)["bytes"]` shared bytes. The global 16-bit arrays must be 16-byte aligned
    (`run` checks).
    """
    err = plan_error(B_r, B_c, d, dt, MT)
    if err:
        raise ValueError(err)
    from .flash import BT
    NW = warps_of(B_c, MT)
    RK = 16 * MT                      # key rows per warp
    DP = padded(d)                    # head dim of the tile products (zero columns d ..)
    PADC = DP - d                     # padded columns per shared row
    VEC = d % 8 == 0                  # rows move in 16-byte chunks, else element-wise
    DN = dq_cols(d) if DN is None else DN
    NDN = DP // DN
    # dQ_i's work items: (16 query rows, DN head columns) pieces, dealt to the warps in turn
    ITEMS = (B_r // 16) * NDN
    KREG = holds_kv(d, kreg)
    X = externs(DP, B_c, B_r, MT, DN, dt)
    load_a, qk, qk_smem, pv = X["load_a"], X["qk"], X["qk_smem"], X["pv"]
    store_s, store_o, dq = X["store_s"], X["store_o"], X["dq"]
    cp16, st16, red2 = X["cp16"], X["st16"], X["red2"]
    cp2, st2 = X["cp2"], X["st2"]
    cp_commit, cp_wait1, cp_wait0 = X["cp_commit"], X["cp_wait1"], X["cp_wait0"]
    ptr, ptr32, ptr16 = _tc.ptr, _tc.ptr32, _tc.ptr16
    THREADS = 32 * NW
    lay = layout(B_r, B_c, d)
    SH, SW, DSH, DSW = lay["SH"], lay["SW"], lay["DSH"], lay["DSW"]
    KO, VO, QO, QB, DOO = lay["KO"], lay["VO"], lay["QO"], lay["QB"], lay["DOO"]
    LO, DSTO, DSO = lay["LO"], lay["DSTO"], lay["DSO"]
    DW = d // 2                       # words per row in global memory (VEC)
    CPR = d // 8 if VEC else d        # copies per row: 16-byte chunks or elements
    QC, KC = B_r * CPR, B_c * CPR
    LQ, LK = -(-QC // THREADS), -(-KC // THREADS)
    QDIV, KDIV = QC % THREADS == 0, KC % THREADS == 0
    LR = -(-B_r // THREADS)           # statistics rows per thread
    NTB = B_r // 8                    # column tiles (8 queries) of S^T
    NSB = B_r // 2                    # S^T fragment floats per m-tile
    NOF = DP // 2                     # dK / dV fragment floats per m-tile
    NAF = DP // 4                     # A fragment registers of K_w / V_w per m-tile
    LSB, LOF, LAF, LQA = MT * NSB, MT * NOF, MT * NAF, DN // 2
    IQ, IK, IV, IdO = BT["Q"], BT["K"], BT["V"], BT["dO"]
    IL, ID, IA, IdK, IdV = BT["L"], BT["D"], BT["dQacc"], BT["dK"], BT["dV"]
    EIGHT = int64(8)
    CW = EIGHT if VEC else int64(1)   # elements per copy
    ZROWS = 2 * B_c + 4 * B_r         # shared rows with padded columns: Ks, Vs, Qs, dOs x 2
    L2E = np.float32(LOG2E)
    ALIGN = None if SIM else 16   # the simulator (tests' emulation) takes no alignment
    BANDED = bool(causal or window)   # the band code is in (gpu.forward._band)
    LOW = bool(window)        # the band has a lower edge lo (causal alone: lo = -inf)

    @cuda.jit(device=True, inline=True)
    def next_tile(i, i_end, mask, j):
        """The first active query block >= i for key block j (i_end if none); blocks
        outside the band are never asked for (the loop runs over i_lo .. i_end - 1 only,
        `band_blocks`), so only the block mask is left to test."""
        while i < i_end:
            if has_mask and mask[i, j] == 0:
                i += 1
                continue
            return i
        return i_end

    @cuda.jit(device=True, inline=True)
    def issue_q(smp, smf, qp, dop, L, Dst, z, i, N, t, buf, smh, qh, doh):
        """Start the copies of this thread's chunks of Q_i, dO_i into buffer `buf` (rows
        past N: zeros, not loaded) and store its rows of L_i (base 2; +inf where P must be
        0) and D_i; returns (elements of Q requested (= of dO), statistics rows read)."""
        n = int64(0)
        ns = int64(0)
        r0 = i * B_r
        rows = min(B_r, N - r0)
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
                    cp16(smp, QO + buf * QB + r * SW + x, qp, qbase + r * DW + x, ok)
                    cp16(smp, DOO + buf * QB + r * SW + x, dop, qbase + r * DW + x, ok)
                else:
                    x = e % CPR
                    ok = r < rows
                    cp2(smh, 2 * (QO + buf * QB + r * SW) + x, qh, qbase + r * d + x, ok)
                    cp2(smh, 2 * (DOO + buf * QB + r * SW) + x, doh, qbase + r * d + x, ok)
                if ok:
                    n += CW
        for it in range(LR):
            r = t + it * THREADS
            if r < B_r:
                lv = INF
                dv_ = ZERO
                if r < rows:
                    lr = L[z, r0 + r]
                    # a row that saw no key (L = -inf) has P = 0; NaN stays NaN
                    lv = INF if lr == NEG_INF else lr * L2E
                    dv_ = Dst[z, r0 + r]
                    ns += 1
                smf[LO + buf * B_r + r] = lv
                smf[DSTO + buf * B_r + r] = dv_
        return n, ns

    # P and dS for one m-tile (16 key rows) of the warp, called with a constant mt so the
    # fragment loops unroll and the arrays stay in registers (as the forward's softmax).
    @cuda.jit(device=True, inline=True)
    def p_ds_mtile(st, dp, smf, mt, cw, r0, N_k, lo, hi, edge, scale2, g, qd, lso, dso):
        """st: S^T -> P^T = exp2(scale2 S^T - L2) (0 past N_k and outside the band, and
        on rows whose L2 is +inf); dp: dP^T -> dS^T = P^T o (dP^T - D), for the warp's
        key rows cw + 16 mt + g (+ 8). edge: some entry of the warp's tile may be masked."""
        for nt in range(NTB):
            for u in range(2):
                col = 8 * nt + 2 * qd + u       # query row within the tile
                lv = smf[lso + col]
                dd = smf[dso + col]
                for hh in range(2):
                    e = mt * NSB + 4 * nt + 2 * hh + u
                    p = ZERO
                    if lv != INF:
                        p = math.exp2(st[e] * scale2 - lv)
                    if edge:
                        key = cw + 16 * mt + g + 8 * hh
                        rel = key - (r0 + col)          # c - r: visible iff lo <= c - r <= hi
                        if key >= N_k or (BANDED and (rel > hi or (LOW and rel < lo))):
                            p = ZERO
                    st[e] = p
                    dp[e] = p * (dp[e] - dd)

    @cuda.jit(device=True, inline=True)
    def add_dq(qa, dqp, z, rq, N, n0, scale, g, qd, dqacc):
        """dQacc[z, rq + row, n0 + col] += scale * dQ fragment (16 rows x DN columns;
        rows < N), the thread's two neighbouring columns in one vector reduction; returns
        the elements added."""
        n = int64(0)
        for hh in range(2):
            r = rq + g + 8 * hh
            if r < N:
                base = (int64(z) * N + r) * d + n0 + 2 * qd
                for nt in range(DN // 8):
                    e = 4 * nt + 2 * hh
                    if PADC == 0:
                        red2(dqp, base + 8 * nt, qa[e] * scale, qa[e + 1] * scale)
                        n += 2
                    else:   # padded columns (>= d) are not added (nor counted)
                        col = n0 + 2 * qd + 8 * nt
                        if d % 2 == 0:      # pairs stay 8-byte aligned: col, d even
                            if col < d:
                                red2(dqp, base + 8 * nt, qa[e] * scale, qa[e + 1] * scale)
                                n += 2
                        else:
                            if col < d:
                                cuda.atomic.add(dqacc, (z, r, col), qa[e] * scale)
                                n += 1
                            if col + 1 < d:
                                cuda.atomic.add(dqacc, (z, r, col + 1), qa[e + 1] * scale)
                                n += 1
        return n

    def kernel(q, k, v, do, L, Dst, dqacc, dk, dv, scale, scale2, N, N_k, lo, hi, H, G, mask,
               counters):
        j = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        g = lane >> 2
        qd = lane & 3
        zk = (z // H) * (H // G) + (z % H) // G        # this head's K/V instance
        sm = cuda.shared.array(0, uint32, alignment=ALIGN)
        smf = cuda.shared.array(0, float32, alignment=ALIGN)
        smp = ptr(sm)
        qp, dop, kp, vp = ptr32(q), ptr32(do), ptr32(k), ptr32(v)
        dqp = ptr(dqacc)
        kf = cuda.local.array(LAF, uint32)              # A fragments of K_w (d <= 64)
        vf = cuda.local.array(LAF, uint32)              # A fragments of V_w
        st = cuda.local.array(LSB, float32)             # S^T_w, then P^T_w
        dp = cuda.local.array(LSB, float32)             # dP^T_w, then dS^T_w
        dka = cuda.local.array(LOF, float32)            # dK_w accumulators
        dva = cuda.local.array(LOF, float32)            # dV_w accumulators
        qa = cuda.local.array(LQA, float32)             # dQ_i part of this warp
        nQ = int64(0)
        nK = int64(0)
        nS = int64(0)
        nA = int64(0)
        nW = int64(0)
        c0 = j * B_c
        cols = min(B_c, N_k - c0)
        cw = c0 + RK * w                                # first key row of this warp
        cw_last = min(cw + RK, N_k) - 1                 # its last real key (< cw: none)
        # the query blocks that see a key of this block: i_lo .. i_end - 1 (exactly iosim's
        # active tiles of column j, block mask aside); none: dK_j = dV_j = 0, still written
        i_lo = 0
        i_end = (N + B_r - 1) // B_r
        if BANDED:
            i_lo, i_hi = band_blocks(c0, c0 + cols - 1, N, B_r, lo, hi)
            i_end = i_hi + 1
        # ---- copy group 1: K_j, V_j (zeros past N_k); group 2: the first Q_i, dO_i ----
        if PADC:     # padded columns d .. DP - 1 of every shared row: zeros, never loaded
            smz = cuda.shared.array(0, uint16, alignment=ALIGN)
            for e in range(t, ZROWS * PADC, THREADS):
                smz[(e // PADC) * SH + d + e % PADC] = uint16(0)
        smh = ptr16(sm)
        qh, doh = ptr16(q), ptr16(do)
        if VEC:
            kvbase = int64(zk) * N_k * DW
        else:
            kvbase = int64(zk) * N_k * d
        for it in range(LK):
            e = t + it * THREADS
            if KDIV or e < KC:
                c = e // CPR
                if VEC:
                    x = (e % CPR) * 4
                    ok = c < cols
                    goff = kvbase + (c0 + c) * DW + x
                    cp16(smp, KO + c * SW + x, kp, goff, ok)
                    cp16(smp, VO + c * SW + x, vp, goff, ok)
                else:
                    x = e % CPR
                    ok = c < cols
                    goff = kvbase + (c0 + c) * d + x
                    cp2(smh, 2 * (KO + c * SW) + x, ptr16(k), goff, ok)
                    cp2(smh, 2 * (VO + c * SW) + x, ptr16(v), goff, ok)
                if ok:
                    nK += CW
        cp_commit()
        i = next_tile(i_lo, i_end, mask, j)
        buf = 0
        if i < i_end:
            a, b = issue_q(smp, smf, qp, dop, L, Dst, z, i, N, t, buf, smh, qh, doh)
            nQ += a
            nS += b
        cp_commit()
        cp_wait1()                                      # K_j, V_j have landed (mine)
        cuda.syncthreads()                              # ... and everyone's
        if KREG:
            load_a(ptr(kf), smp, KO + RK * w * SW, SH)
            load_a(ptr(vf), smp, VO + RK * w * SW, SH)
        for b in range(LOF):
            dka[b] = ZERO
            dva[b] = ZERO

        while i < i_end:
            r0 = i * B_r
            rows = min(B_r, N - r0)
            inext = next_tile(i + 1, i_end, mask, j)
            if inext < i_end:                           # next tile's copies in flight
                a, b = issue_q(smp, smf, qp, dop, L, Dst, z, inext, N, t, 1 - buf, smh, qh,
                               doh)
                nQ += a
                nS += b
            cp_commit()
            cp_wait1()                                  # tile i has landed
            cuda.syncthreads()
            qo = QO + buf * QB
            doo = DOO + buf * QB
            lso = LO + buf * B_r
            dso = DSTO + buf * B_r
            # the warp's keys all past N_k, or no pair of them with the tile's rows in
            # the band: its P^T is all zero, skip the products (exact)
            if cw < N_k and (not BANDED or tile_in_band(r0, r0 + rows - 1, cw, cw_last,
                                                        lo, hi)):
                # ---- S^T = K_w Q_i^T, dP^T = V_w dO_i^T on the tensor cores ----
                if KREG:
                    qk(ptr(st), ptr(kf), smp, qo, SH)
                    qk(ptr(dp), ptr(vf), smp, doo, SH)
                else:
                    qk_smem(ptr(st), smp, KO + RK * w * SW, SH, qo, SH)
                    qk_smem(ptr(dp), smp, VO + RK * w * SW, SH, doo, SH)
                # ---- P^T = exp(scale S^T - L), dS^T = P^T o (dP^T - D) ----
                # edge: some entry is past N_k or outside the band (c - r over the
                # warp's tile spans cw - (r0 + rows - 1) .. cw + RK - 1 - r0; rows past
                # N have L2 = +inf, P = 0, whatever the band)
                edge = cw + RK > N_k or (BANDED and (cw + RK - 1 - r0 > hi or
                                                     (LOW and cw - (r0 + rows - 1) < lo)))
                p_ds_mtile(st, dp, smf, 0, cw, r0, N_k, lo, hi, edge, scale2, g, qd, lso, dso)
                if MT > 1:
                    p_ds_mtile(st, dp, smf, 1, cw, r0, N_k, lo, hi, edge, scale2, g, qd, lso,
                               dso)
                # ---- dV_w += P^T dO_i, dK_w += dS^T Q_i (P^T, dS^T rounded to fp16) ----
                pv(ptr(dva), ptr(st), smp, doo, SH)
                pv(ptr(dka), ptr(dp), smp, qo, SH)
                store_s(smp, DSO + RK * w * DSW, DSH, ptr(dp))
            else:
                for e in range(lane, RK * DSW, 32):
                    sm[DSO + RK * w * DSW + e] = uint32(0)
            cuda.syncthreads()                          # dS^T of the whole block is in
            # ---- dQ_i += scale dS K_j, in (16 rows, DN columns) items dealt to warps ----
            for it in range(w, ITEMS, NW):
                rq = 16 * (it // NDN)
                n0 = DN * (it % NDN)
                if rq < rows:
                    dq(ptr(qa), smp, DSO + rq // 2, DSH, KO, SH, n0)
                    nA += add_dq(qa, dqp, z, r0 + rq, N, n0, scale, g, qd, dqacc)
            cuda.syncthreads()                          # all done with buffer buf and dS^T
            buf = 1 - buf
            i = inext
        cp_wait0()
        # ---- write dK_j = scale dK, dV_j through shared memory, 16 bytes at a time ----
        for b in range(LOF):
            dka[b] *= scale
        cuda.syncwarp()
        store_o(smp, KO + RK * w * SW, SH, ptr(dka))
        store_o(smp, VO + RK * w * SW, SH, ptr(dva))
        cuda.syncthreads()
        # (the real d columns only: the padded ones are never stored)
        dkp, dvp = ptr32(dk), ptr32(dv)
        if VEC:
            obase = (int64(z) * N_k + c0) * DW
        else:
            obase = (int64(z) * N_k + c0) * d
        for e in range(t, cols * CPR, THREADS):
            c = e // CPR
            if VEC:
                x = (e % CPR) * 4
                st16(dkp, obase + c * DW + x, smp, KO + c * SW + x)
                st16(dvp, obase + c * DW + x, smp, VO + c * SW + x)
            else:
                x = e % CPR
                st2(ptr16(dk), obase + c * d + x, smh, 2 * (KO + c * SW) + x)
                st2(ptr16(dv), obase + c * d + x, smh, 2 * (VO + c * SW) + x)
            nW += CW
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IdO, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nK)
            add_count(counters, IL, READ, nS)
            add_count(counters, ID, READ, nS)
            add_count(counters, IA, READ, nA)
            add_count(counters, IA, WRITE, nA)
            add_count(counters, IdK, WRITE, nW)
            add_count(counters, IdV, WRITE, nW)

    name = kernel_name("fa2_bwd_tc", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal,
                       window=bool(window), mask=has_mask, count=count,
                       mt=MT if MT > 1 else False, kreg=KREG, dn=DN)
    return kernel, name


def get_kernel(B_r, B_c, d, causal, has_mask, count, MT=1, kreg=None, DN=None, dt="fp16",
               window=False):
    """The compiled dispatcher for one specialisation (dt: "fp16" or "bf16"; window: a local
    window is given, the band's lower edge is compiled in, gpu.forward._band)."""
    err = plan_error(B_r, B_c, d, dt, MT)
    if err:
        raise ValueError(f"fa2_bwd_tc: {err}")
    DN = dq_cols(d) if DN is None else int(DN)
    if DN % 16 or padded(d) % DN:
        raise ValueError(f"fa2_bwd_tc: DN={DN} must be a multiple of 16 dividing "
                         f"padded(d)={padded(d)} (d={d})")
    return fa2_bwd_tc_kernel(int(B_r), int(B_c), int(d), bool(causal), bool(has_mask),
                             bool(count), int(MT), holds_kv(d, kreg), DN, str(dt),
                             bool(window))


def run(q3, k3, v3, do3, L2, D2, acc, dk3, dv3, scale, N, H, G, mask, counters, *, B_r, B_c,
        causal, count, MT=1, kreg=None, DN=None, dt="fp16", window=(-1, -1)):
    """Launch the main kernel on 3-D 16-bit device views: q3, do3 (instances, N, d), k3, v3
    (kv instances, N_k, d; N_k is k3's rows), dk3, dv3 (instances, N_k, d): float16 arrays
    for dt="fp16", uint16 arrays of the bfloat16 bits for dt="bf16"; adds scale dS K into
    acc (float32, zeroed by the pre-pass), writes dk3, dv3 (per query head, same kind).
    causal and window=(left, right): the band of gpu.forward._band (bottom-right aligned,
    -1 unbounded; ValueError for a bad window, as gpu.attention)."""
    from .._launch import launch
    if dt not in DTYPES:
        raise ValueError(f"fa2_bwd_tc: dt={dt!r}; the tensor-core backward takes {DTYPES}")
    d = q3.shape[2]
    for name, arr in (("q", q3), ("k", k3), ("v", v3), ("do", do3), ("dk", dk3), ("dv", dv3)):
        _tc.check_dtype("fa2_bwd_tc", name, arr, dt)
        _tc.check_aligned("fa2_bwd_tc", name, arr)
    N_k = k3.shape[1]
    if tuple(v3.shape[1:]) != (N_k, d) or tuple(dk3.shape) != (q3.shape[0], N_k, d) or \
            tuple(dv3.shape) != tuple(dk3.shape):
        raise ValueError(f"fa2_bwd_tc: v3 {tuple(v3.shape)}, dk3 {tuple(dk3.shape)}, dv3 "
                         f"{tuple(dv3.shape)}: v3 must have k3's N_k={N_k} rows and d={d} "
                         f"columns, dk3 and dv3 the shape (q3's instances={q3.shape[0]}, "
                         f"N_k={N_k}, d={d})")
    windowed, lo, hi = band_args(N, N_k, bool(causal), window)
    kern = get_kernel(B_r, B_c, d, causal, mask is not None, count, MT, kreg, DN, dt,
                      windowed)
    T_c = -(-N_k // B_c)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (T_c, q3.shape[0]), 32 * warps_of(B_c, MT), layout(B_r, B_c, d)["bytes"],
           q3, k3, v3, do3, L2, D2, acc, dk3, dv3, np.float32(scale),
           np.float32(scale * LOG2E), np.int64(N), np.int64(N_k), lo, hi, np.int64(H),
           np.int64(G), mk, counters)


def signature(dt="fp16"):
    """Argument types of the kernel (for compiling without a GPU): 16-bit arrays as dt
    arrives (gpu._tc.ARRAY_DTYPES)."""
    from numba.cuda import types as nb
    W = _tc.array_type(dt)
    F2 = nb.Array(nb.float32, 2, "C")
    return (W, W, W, W, F2, F2, nb.Array(nb.float32, 3, "C"), W, W, nb.float32, nb.float32,
            nb.int64, nb.int64, nb.int64, nb.int64, nb.int64, nb.int64,
            nb.Array(nb.uint8, 2, "C"), nb.Array(nb.int64, 2, "C"))


def linked_ptx(B_r, B_c, d, causal=False, has_mask=False, count=False, MT=1, kreg=None,
               DN=None, cc=(9, 0), dt="fp16", window=False) -> str:
    """The PTX of one specialisation after link-time optimisation (no GPU needed; see
    gpu._tc.linked_ptx): tests check mma.sync present, no `.local`, no calls."""
    return _tc.linked_ptx(get_kernel(B_r, B_c, d, causal, has_mask, count, MT, kreg, DN, dt,
                                     window), signature(dt), cc)


__all__ = ["DTYPES", "padded", "layout", "plan_error", "supports", "default_tiling", "externs",
           "fa2_bwd_tc_kernel", "get_kernel", "run", "linked_ptx", "signature"]
