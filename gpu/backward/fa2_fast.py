"""FlashAttention-2 backward, register-tiled on the CUDA cores (fp32 math): the fast path.

Same schedule, hence the same HBM traffic, as the plain `bwd_main("fa2", ...)` of
`gpu.backward.flash` and `iosim.schedules`' fa2 backward (ledger:
`iosim.backward_closed_form('fa2', ...)`). It replaces two of the four launches:
  pre   `fa2_bwd_pre_fast`: D = rowsum(dO o O) (float32, one entry per query row) and
        dQacc = 0. One warp per query row (RPW rows per warp in turn): lane l reads
        elements l, l + 32, ... of the row of dO and of O (coalesced 4-byte loads; Numba
        cannot promise NVVM 16-byte aligned kernel arguments, so no wider global loads),
        multiplies, and the 32 partial sums are reduced with `cuda.shfl_xor_sync`
        (hardware) or through shared memory (`shfl=False`, the simulator). Counts: O and
        dO read N d, D written N, dQacc written N d per instance (as the plain pre-pass).
  main  `fa2_bwd_fast`: one thread block per (key block j, instance), grid (T_c,
        instances) (causal: (instances, T_c), so the key blocks with the most query
        blocks, j = 0, start first on every head): K_j, V_j read once into shared
        memory; dK_j, dV_j accumulate in registers over the active query blocks i
        (causal or a window: those whose rows meet [c0 - hi, c_last - lo], `band_blocks`;
        block mask: mask[i, j] True), visited from the (j mod their count)-th on,
        wrapping around (`stagger`: concurrent key blocks of
        one head then add into different dQacc rows); per query block read Q_i, dO_i
        (B_r x d), L_i, D_i (B_r):
          A  S = scale Q_i K_j^T and dP = dO_i V_j^T (register tiles), P = exp(S - L),
             dS = P o (dP - D) -> shared (row-major, B_r x B_c each);
          B  dV_j += P^T dO_i, dK_j += dS^T Q_i (register accumulators; scale at the end);
          C  dQ_i partial = scale dS K_j (register tile), then one float32
             `cuda.atomic.add` per element into dQacc (each counted as one read and one
             write of dQacc, as the plain kernel and the ledger). `dq_stage` (default):
             the tile goes to a shared staging tile QA and its atomics are issued after
             the next tile's first barrier (after the loop for the last one), by
             consecutive threads on consecutive elements (a warp's 32 atomics cover 4
             sectors; from the registers they would cover 16, 2 per sector);
        at the end dK_j, dV_j leave through shared memory with coalesced stores (into the
        per-query-head dK_h, dV_h; `flash.group_sum_kernel` sums grouped heads).
  The conversion dQ = dQacc and the group sum stay the plain kernels of flash.py.
N_k != N_q and local windows (issue 18; gpu.forward._band, iosim.problem.band_of): K, V,
dK, dV have N_k rows, grid T_c = ceil(N_k / B_c); the main kernel takes the band lo, hi
(row r sees key c iff lo <= c - r <= hi) and the compile flag `window` (the band code is
in when causal or window). Key block j visits exactly iosim's active tiles of its column
(none: dK_j = dV_j = 0, still written); a tile that crosses an edge of the band masks
entry by entry (P = dS = 0 outside); a row that sees no key has L = -inf, P = 0, dQ = 0.
The pre-pass and the stagger need nothing else (rows are query rows; the rotation runs
over the band's blocks).
Ragged N (N not a multiple of B_r or B_c): only valid rows are loaded / stored / added
(and counted); the rest of a shared tile is zero, and P = dS = 0 there.

Versions (timings: H100, fp32, d = 64, batch x heads = 16, N = 4096; to be measured with
scripts/bwd_fast_bench.py, results data set kind `bench`, "pass": "bwd"):
  v1  (this file) register tiles with 16-byte shared loads (LDS.128) in all three
      phases, P and dS stored once (row-major) and read by phases B and C, warp-shuffle
      pre-pass; staggered query-block order, causal grid heaviest first; dQ tiles
      staged in shared memory for coalesced atomics (dq_stage=False: straight from the
      registers).
      64 x 64 tiles, 256 threads, ptxas -v (CUDA 13.0, sm_90), no spills: d = 64 152
      registers (causal 128; phase A fused), d = 128 241 (causal 243; `split`); shared
      memory 124.5 / 204.5 KB: one block (8 warps) per SM. Not yet timed.
  v1b N_k != N_q and windows (issue 18): the band lo, hi as kernel arguments, the lower
      edge compiled in only with `window`. ptxas -v as above: d = 64 152 (causal 128,
      window 152), d = 128 241 (causal 247, window 247), no spills.
  v1c own rows (banded builds; issue 18's d = 59 fp16 row, gpu.backward.flash): in a
      tile that holds every key of some of its query rows, those rows' D is replaced
      in shared memory (Ds) by rowsum(P o dP) over the tile (each thread's partial sums
      of its register tile -> dSs[r, ax], two barriers, one thread per row adds them in
      order), only in such tiles (the first key block of a causal band, every tile of a
      narrow window). ptxas -v: d = 64 window 242, causal 182 registers (were 152 and
      128), no spills: at 127.5 KB of shared memory one block per SM either way; d = 128
      unchanged (241, causal 247, window 247). Placing the sums in a pass of their own
      before A (entry by entry from shared memory) gave window 165, causal 236.
  Tried and dropped (ptxas only, no GPU): issuing the next query tile's Q, dO loads into
  registers during this tile (as gpu.forward.fa2_fast's stage=1): 255 registers and 224
  bytes of spills a thread at d = 64 (1 KB at d = 128); 1-D (flattened) global indexing:
  no fewer registers.

Thread layouts. `threads` threads, the same ones re-mapped per phase (all index sets are
compile-time unrolled `cuda.local.array`s):
  A  t = (ay, ax) = (t // TCA, t % TCA), TRA = threads / TCA: S and dP entries at rows
     r = ay + TRA a (a < RA = B_r / TRA), key columns c = ax + TCA b (b < CA = B_c / TCA),
     RA x CA each; the reduction index x (head dim) advances 4 at a time: per step RA
     LDS.128 of Q and of dO (one row each), CA of K and of V, 8 RA CA FMAs.
  B  t = (by, bx) = (t // TXB, t % TXB), TYB = threads / TXB: dK, dV entries at key rows
     c = 4 by + 4 TYB g + w and head columns x = 4 bx + 4 TXB h + w (groups of 4
     consecutive), RB x DB each (RB = B_c / TYB, DB = d / TXB); outer products over the
     query rows r: per r RB / 4 LDS.128 of P[r] and of dS[r], DB / 4 of dO[r] and of Q[r],
     2 RB DB FMAs.
  C  t = (cy, cx) = (t // TXC, t % TXC), TYC = threads / TXC: dQ entries at rows
     r = cy + TYC a and head columns 4 cx + 4 TXC h + w, RC x DC (RC = B_r / TYC,
     DC = d / TXC); the reduction index c advances 4 at a time: RC LDS.128 of dS (rows),
     4 DC / 4 of K (rows c .. c + 3), 4 RC DC FMAs.
The TCA (TXB, TXC) consecutive lanes that share a row are one quarter warp or more where
the tiling allows (`plan` prefers TC >= 8): their loads of the shared operand are
broadcasts.

Shared memory (float32 whatever the input dtype; one dynamic buffer of `smem_bytes`,
16-byte aligned; row strides multiples of 4 floats):
    Ks, Vs   B_c x KS   K_j, V_j, KS = d + pad = 4 (mod 32)   (at the end: dK_j, dV_j)
    Qs, dOs  B_r x KS   Q_i, dO_i
    Ps, dSs  B_r x PS   P, dS, PS >= B_c, PS = TCA (mod 32) when 4 <= TCA < 32
    Ls, Ds   B_r        L_i, D_i
    QA       B_r x d    dQ_i partial (dq_stage only)
Bank conflicts: in A, 8 lanes of a quarter warp read 8 rows of K (or V) at one x (row
stride 4 mod 32: distinct banks) and one row of Q (broadcast); the scalar P / dS stores of
a warp (32 / TCA rows, TCA consecutive columns) hit distinct banks. In B and C a quarter
warp reads 8 consecutive 16-byte groups of one row (distinct banks) and one group of P,
dS (broadcast). Base indices carry `& IMASK` (a no-op that proves them non-negative, see
gpu.forward.fa2_fast) so NVVM emits ld.shared.v4.f32.

Per active query tile: sync; [dq_stage: the previous tile's dQ atomics from QA]; Q_i, dO_i,
L_i, D_i -> shared; sync; A; sync; B and C (-> QA, or atomics from the registers).
Syncs per tile: 3.

Dropout (compile flag `dropout`, a separate specialisation; `run(..., dropout=(p, seed,
offset))`, the forward's; Algorithm 4): phase A draws the thread's keep bits of each of
its RA rows (`_philox.row_bits`, gpu._philox: the forward's mask Z, regenerated), stores
P o Z / (1 - p) to Ps (phase B's dV += (P o Z / (1 - p))^T dO_i) and forms
dS = P o (dP o Z / (1 - p) - D) (phases B and C: dK, dQ); D = rowsum(dO o O) of the
forward's dropped O, as without dropout. No extra HBM traffic (counts unchanged); the
build without dropout keeps its arguments and its PTX (scripts/ptx_snapshot.py).

Own rows (banded builds, as the plain kernel: gpu.backward.flash's module docstring): a
query row whose keys all lie in key block j (`gpu.forward._band.own_rows`) takes D =
rowsum(P o dP) (dropout: P o dP o Z / (1 - p)) over that tile, exact in fp32, instead of
the pre-pass's rowsum(dO o O) from the stored O; D_i is still read (counts unchanged).

Non-finite values (as the plain kernel, `flash` module docstring): a row whose L is -inf
(it saw no key in the forward) has P = 0; a NaN L or score keeps P NaN; dS = P (dP - D)
for every entry of the valid rows and columns (masked ones included, P = 0 there), so NaN
in dO or V reaches the gradients wherever the plain kernel puts it.

Counting (count=True, compile-time): per-thread element counts in registers, one
`cuda.atomic.add` per tensor at the end (gpu._launch.add_count), rows of
`flash.BW_TENSORS`.

Interface: `run(...)` takes the arguments of the plain main-kernel launch in
`flash.attention_backward`; `run_pre(...)` those of the pre-pass; `supports`,
`plan_error`, `default_tiling`, `pick_threads` decide whether and how it runs.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64, uint64

# row strides of the shared tiles (bank-conflict-free 16-byte loads), the vector width W,
# index mask, shared-buffer alignment, threads-per-row choices and the tile loaders: the
# forward fast kernel's, shared rather than copied
from ..forward.fa2_fast import ALIGN, IMASK, W, pair_row_loader, pair_tile_loader
from ..forward._band import OWN_ROWS, own_rows_dev
from .._launch import (NB_DTYPE, NEG_INF, READ, SIM, WRITE, ZERO, add_count, dummy_mask,
                       jit_options, kernel_name, loader, specialisation)
from .. import _philox

# the launch geometry (thread layouts, shared-memory layout, default tiles): iosim.launch
from iosim.launch.backward import fa2_fast as _geometry
from iosim.launch.backward.fa2_fast import (DEFAULT_TILES, FALLBACK_TILES, THREAD_CHOICES, layout,
                                           plan, smem_bytes)

MAX_R, MAX_ACC, _plan_a, _plan_x = _geometry.MAX_R, _geometry.MAX_ACC, _geometry._plan_a, _geometry._plan_x

#: Rows per warp of the pre-pass.
PRE_RPW = 4


def plan_error(B_r, B_c, d, dt, threads, *, smem_limit=None, **opts) -> str | None:
    """Why the fast backward cannot run this configuration on this device, or None if it
    can (`iosim.launch.backward.fa2_fast.plan_error` with smem_limit None read as the
    device's per-block limit)."""
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return _geometry.plan_error(B_r, B_c, d, dt, threads, smem_limit=smem_limit, **opts)


def supports(B_r, B_c, d, dt, threads, **opts) -> bool:
    """True if the fast backward runs this configuration (see `plan_error`)."""
    return plan_error(B_r, B_c, d, dt, threads, **opts) is None


def pick_threads(B_r, B_c, d, dt, threads=None, smem_limit=None) -> int | None:
    """`threads` if the kernel runs it, else (none given) the first of the default tile's
    own, THREAD_CHOICES (the simulator: its default thread count first) that it runs."""
    if threads is not None:
        return threads if supports(B_r, B_c, d, dt, threads, smem_limit=smem_limit) else None
    from .._launch import default_threads
    own = [t for (br, bc, t) in list(DEFAULT_TILES.values()) + list(FALLBACK_TILES)
           if (br, bc) == (B_r, B_c)]
    cands = ([default_threads()] if SIM else []) + own + list(THREAD_CHOICES)
    for t in dict.fromkeys(cands):
        if supports(B_r, B_c, d, dt, t, smem_limit=smem_limit):
            return t
    return None


def default_tiling(d, dt="fp32", smem_limit=None) -> tuple[int, int, int] | None:
    """(B_r, B_c, threads) of the fast backward for head dim d on this device, or None."""
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return _geometry.default_tiling(d, dt, smem_limit)


# ---------------------------------------------------------------------------------------
# Pre-pass: D = rowsum(dO o O), dQacc = 0
# ---------------------------------------------------------------------------------------
def pre_rows_per_block(threads, rpw=PRE_RPW):
    return (threads // 32) * rpw


@specialisation
def fa2_pre_fast_kernel(d, dt, count, threads, shfl, rpw):
    """Kernel pre(o, do, D, dqacc, N, counters); grid (ceil(N / rows per block),
    instances), `threads` threads (a multiple of 32), rows per block (threads / 32) rpw."""
    from ._common import BT
    assert threads % 32 == 0
    IO, IdO, ID, IA = BT["O"], BT["dO"], BT["D"], BT["dQacc"]
    WARPS = threads // 32
    RPB = WARPS * rpw
    XL = -(-d // 32)               # elements of a row per lane
    XDIV = d % 32 == 0
    FULL = 0xFFFFFFFF
    ldx = loader(dt)               # element -> float32 (bf16: its uint16 bits widened)

    def kernel(o, do, D, dqacc, N, counters):
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        lane = t % 32
        warp = t // 32
        red = cuda.shared.array(threads, float32)
        r0 = cuda.blockIdx.x * RPB
        rows = min(RPB, N - r0)
        nO = int64(0)
        nD = int64(0)
        nA = int64(0)
        for rr in range(rpw):
            r = warp * rpw + rr
            acc = ZERO
            if r < rows:
                for u in range(XL):
                    x = lane + 32 * u
                    if XDIV or x < d:
                        acc += ldx(do[z, r0 + r, x]) * ldx(o[z, r0 + r, x])
                        if count:
                            nO += 1
            if shfl:
                acc += cuda.shfl_xor_sync(FULL, acc, 16)
                acc += cuda.shfl_xor_sync(FULL, acc, 8)
                acc += cuda.shfl_xor_sync(FULL, acc, 4)
                acc += cuda.shfl_xor_sync(FULL, acc, 2)
                acc += cuda.shfl_xor_sync(FULL, acc, 1)
            else:
                red[t] = acc
                cuda.syncthreads()
                if lane == 0:
                    s = ZERO
                    for u in range(32):
                        s += red[warp * 32 + u]
                    acc = s
                cuda.syncthreads()
            if lane == 0 and r < rows:
                D[z, r0 + r] = acc
                if count:
                    nD += 1
        for e in range(t, rows * d, threads):           # dQacc rows = 0
            dqacc[z, r0 + e // d, e % d] = ZERO
            if count:
                nA += 1
        if count:
            add_count(counters, IO, READ, nO)
            add_count(counters, IdO, READ, nO)
            add_count(counters, ID, WRITE, nD)
            add_count(counters, IA, WRITE, nA)

    return kernel, kernel_name("fa2_bwd_pre_fast", d=d, dt=dt, count=count, t=threads,
                               shfl=shfl, rpw=rpw)


def run_pre(o3, do3, D2, dqacc, N, counters, *, dt, count, threads=256, shfl=None,
            rpw=PRE_RPW):
    """Launch the pre-pass on (instances, N, d) views: D2 (instances, N) float32,
    dqacc (instances, N, d) float32. shfl: warp shuffles (default: on a GPU)."""
    shfl = (not SIM) if shfl is None else bool(shfl)
    threads = max(32, (int(threads) // 32) * 32)
    d = o3.shape[2]
    kern = fa2_pre_fast_kernel(d, dt, bool(count), threads, shfl, int(rpw))
    from .._launch import launch
    grid = (-(-N // pre_rows_per_block(threads, rpw)), o3.shape[0])
    launch(kern, grid, threads, 0, o3, do3, D2, dqacc, np.int64(N), counters)


# ---------------------------------------------------------------------------------------
# Main kernel
# ---------------------------------------------------------------------------------------
@cuda.jit(device=True, inline=True)
def band_blocks(c0, c_last, N, B_r, lo, hi):
    """(i_lo, i_hi): the query blocks of key columns c0..c_last that hold a pair
    lo <= c - r <= hi (`gpu.forward._band.tile_in_band`, iosim.schedules.band_tiles): the
    blocks whose rows meet [c0 - hi, c_last - lo] within 0..N - 1 (c - r takes every
    integer in between). i_hi < i_lo when there is none."""
    r_lo = max(c0 - hi, 0)
    r_hi = min(c_last - lo, N - 1)
    if r_lo > r_hi:
        return 1, 0
    return r_lo // B_r, r_hi // B_r


@specialisation
def fa2_bwd_fast_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TCA, TXB, TXC,
                        maxreg=0, split=True, stagger=True, dq_stage=True, window=False,
                        dropout=False):
    """Kernel main(q, k, v, do, L, D, dqacc, dk, dv, scale, N, N_k, lo, hi, H, G, mask,
    counters), and in the dropout build (`dropout`) five more: key0, key1, offset, thr
    (uint64), rp (float32) (gpu._philox.kernel_args). Dropout (Algorithm 4, as the plain
    `flash.bwd_main`): phase A regenerates the forward's keep mask Z per entry (Philox,
    the forward's seed and offset), stores P o Z / (1 - p) for phase B's dV and forms
    dS = P o (dP o Z / (1 - p) - D); without `dropout` the kernel is the one it was
    before dropout existed (same arguments, same code).

    q, do: (instances, N, d); k, v: (batch * kv_heads, N_k, d); L, D: (instances, N)
    float32; dqacc: (instances, N, d) float32; dk, dv: (instances, N_k, d) per query head.
    N: query rows N_q, N_k: key rows; lo, hi: the int64 band of gpu.forward._band (row r
    sees key c iff lo <= c - r <= hi), read only when `causal` or `window` (compile flags;
    `band_args`): key block j visits only the query blocks whose rows meet
    [c0 - hi, c_last - lo] (`band_blocks`: exactly iosim's active tiles), entries outside
    the band have P = dS = 0.
    Grid (T_c, instances), causal (instances, T_c) (heaviest key blocks first), `threads`
    threads, `smem_bytes(...)` dynamic shared bytes. maxreg > 0 caps the registers per
    thread (hardware only); split: phase A's dP loop after P; stagger: the query-block
    loop of key block j starts at its (j mod count)-th active block and wraps around."""
    from ._common import BT
    p = plan(B_r, B_c, d, threads, TCA, TXB, TXC)
    assert p is not None and (p["TCA"], p["TXB"], p["TXC"]) == (TCA, TXB, TXC)
    TRA, RA, CA = p["TRA"], p["RA"], p["CA"]
    TYB, RB, DB = p["TYB"], p["RB"], p["DB"]
    TYC, RC, DC = p["TYC"], p["RC"], p["DC"]
    DQS = bool(dq_stage)
    lay = layout(B_r, B_c, d, TCA, DQS)
    QA = lay["QA"]
    KS, PS = lay["KS"], lay["PS"]
    KO, VO, QO, dOO = lay["KO"], lay["VO"], lay["QO"], lay["dOO"]
    PO, SO, LO, DO = lay["PO"], lay["SO"], lay["LO"], lay["DO"]
    VK = VO - KO            # V's offset from K (same strides)
    dOQ = dOO - QO          # dO's offset from Q
    SP = SO - PO            # dS's offset from P
    THREADS = threads
    SPLIT = bool(split)
    STAGGER = bool(stagger)
    XC = d // W             # 4-wide steps of A
    CC = B_c // W           # 4-wide steps of C
    RBG, DBG, DCG = RB // W, DB // W, DC // W
    load_kv = pair_tile_loader(B_c, d, THREADS, KO, KS, VO, KS, count)
    load_qdo = pair_tile_loader(B_r, d, THREADS, QO, KS, dOO, KS, count)
    load_ld = pair_row_loader(B_r, THREADS, LO, DO, ZERO, count)
    IQ, IK, IV, IdO = BT["Q"], BT["K"], BT["V"], BT["dO"]
    IL, ID, IdK, IdV, IA = BT["L"], BT["D"], BT["dK"], BT["dV"], BT["dQacc"]
    banded = bool(causal or window)
    LOW = bool(window)      # the band has a lower edge lo (causal alone: lo = -inf)
    OWN = banded and OWN_ROWS   # own rows: exact D (module docstring)

    def body(q, k, v, do, L, D, dqacc, dk, dv, scale, N, N_k, lo, hi, H, G, mask,
             counters, key0, key1, offset, thr, rp):
        if causal:      # grid (instances, T_c): the heaviest key blocks (j = 0) start first
            z = cuda.blockIdx.x
            j = cuda.blockIdx.y
        else:           # grid (T_c, instances)
            j = cuda.blockIdx.x
            z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        zk = (z // H) * (H // G) + (z % H) // G        # this head's K/V instance
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        # phase A: S, dP tiles and operands
        s_acc = cuda.local.array((RA, CA), float32)
        dp_acc = cuda.local.array((RA, CA), float32)
        zb = cuda.local.array(RA, uint64)              # dropout: Z's bits per row
        kv = cuda.local.array((CA, W), float32)
        vv = cuda.local.array((CA, W), float32)
        qv = cuda.local.array(W, float32)
        dov = cuda.local.array(W, float32)
        # phase B: dK, dV accumulators (whole kernel) and operands
        dk_acc = cuda.local.array((RB, DB), float32)
        dv_acc = cuda.local.array((RB, DB), float32)
        pr = cuda.local.array(RB, float32)
        sr = cuda.local.array(RB, float32)
        qr = cuda.local.array(DB, float32)
        dor = cuda.local.array(DB, float32)
        # phase C: dQ tile and operands
        dq_acc = cuda.local.array((RC, DC), float32)
        sv = cuda.local.array((RC, W), float32)
        kr = cuda.local.array(DC, float32)
        nQ = int64(0)
        nK = int64(0)
        nS = int64(0)
        nA = int64(0)
        nW = int64(0)
        ay = t // TCA
        ax = t % TCA
        by = t // TXB
        bx = t % TXB
        cy = t // TXC
        cx = t % TXC
        # this thread's first word of each region (masked: see the module docstring)
        kbase = (KO + ax * KS) & IMASK                  # A: K row ax
        qbase = (QO + ay * KS) & IMASK                  # A: Q row ay
        pbase = (PO + ay * PS) & IMASK                  # A: P row ay (stores)
        pcol = (PO + W * by) & IMASK                    # B: P columns 4 by ..
        qcol = (QO + W * bx) & IMASK                    # B: Q / dO columns 4 bx ..
        srow = (SO + cy * PS) & IMASK                   # C: dS row cy
        kcol = (KO + W * cx) & IMASK                    # C: K columns 4 cx ..

        c0 = j * B_c
        cols = min(B_c, N_k - c0)
        T_r = (N + B_r - 1) // B_r
        # ---- K_j, V_j -> shared (zero rows past N_k) ----
        nK = load_kv(k, v, zk, c0, cols, t, sm, nK)
        for a in range(RB):
            for b in range(DB):
                dk_acc[a, b] = ZERO
                dv_acc[a, b] = ZERO
        i_lo = 0
        i_hi = T_r - 1
        if banded:      # the query blocks whose rows meet [c0 - hi, c_last - lo]
            if LOW:
                i_lo, i_hi = band_blocks(c0, c0 + cols - 1, N, B_r, lo, hi)
            else:       # causal: from the first row that sees key c0 on
                i_lo = max(c0 - hi, 0) // B_r           # c0 - hi <= c0 - o < N: i_lo <= i_hi
        n_i = i_hi - i_lo + 1                           # 0: key block j sees no query row
        pr0 = 0                                         # dQ tile staged in QA: its rows
        prows = 0
        rot = 0
        if STAGGER and n_i > 0:  # start at a different query block in each key block: the
            rot = j % n_i        # dQacc atomics of concurrent blocks then hit different rows
        for ii in range(n_i):
            i = i_lo + ii + rot
            if i > i_hi:
                i -= n_i
            r0 = i * B_r
            rows = min(B_r, N - r0)
            if has_mask and mask[i, j] == 0:
                continue
            cuda.syncthreads()                          # previous tile done with Qs .. dSs
            if DQS:     # the previous tile's dQ (staged in QA) -> dQacc, coalesced atomics
                for e in range(t, prows * d, THREADS):
                    cuda.atomic.add(dqacc, (z, pr0 + e // d, e % d), sm[QA + e])
                    if count:
                        nA += 1
            # ---- Q_i, dO_i, L_i, D_i -> shared ----
            nQ = load_qdo(q, do, z, r0, rows, t, sm, nQ)
            nS = load_ld(L, D, z, r0, rows, t, sm, nS)
            cuda.syncthreads()
            # ---- A: S = Q_i K_j^T, dP = dO_i V_j^T (x advances 4 at a time); with
            # SPLIT the dP loop runs after P = exp(S - L) (fewer live registers) ----
            for a in range(RA):
                for b in range(CA):
                    s_acc[a, b] = ZERO
                    dp_acc[a, b] = ZERO
            for xc in range(XC):
                x4 = (xc * W) & IMASK
                for b in range(CA):                     # K_j (V_j) rows ax + TCA b
                    for w in range(W):
                        kv[b, w] = sm[kbase + b * TCA * KS + x4 + w]
                        if not SPLIT:
                            vv[b, w] = sm[kbase + VK + b * TCA * KS + x4 + w]
                for a in range(RA):                     # Q_i (dO_i) rows ay + TRA a
                    for w in range(W):
                        qv[w] = sm[qbase + a * TRA * KS + x4 + w]
                        if not SPLIT:
                            dov[w] = sm[qbase + dOQ + a * TRA * KS + x4 + w]
                    for b in range(CA):
                        sx = s_acc[a, b]
                        for w in range(W):
                            sx += qv[w] * kv[b, w]
                        s_acc[a, b] = sx
                        if not SPLIT:
                            g = dp_acc[a, b]
                            for w in range(W):
                                g += dov[w] * vv[b, w]
                            dp_acc[a, b] = g
            # ---- P = exp(S - L) (in s_acc) -> shared ----
            # the tile crosses an edge of the band: mask entry by entry
            edge = banded and (c0 + cols - 1 - r0 > hi or
                               (LOW and c0 - (r0 + rows - 1) < lo))
            for a in range(RA):
                r = ay + TRA * a
                Lr = sm[LO + r]
                # a row that saw no key in the forward: L = -inf, P = 0
                row_vis = r < rows and Lr != NEG_INF
                # dropout: this thread's Z entries of the row as bits first (the
                # register-tile loop below stays free of Philox and unrolls); kept for dS
                if dropout:
                    zb[a] = _philox.row_bits(key0, key1, offset, z, r0 + r, c0 + ax, TCA,
                                             CA, thr)
                for b in range(CA):
                    c = ax + TCA * b
                    vis = row_vis and c < cols
                    if edge:
                        if c0 + c - r0 - r > hi or (LOW and c0 + c - r0 - r < lo):
                            vis = False                 # outside the band
                    pv = ZERO
                    if vis:
                        pv = math.exp(s_acc[a, b] * scale - Lr)
                    s_acc[a, b] = pv
                    if dropout:     # Z by Philox: P o Z / (1 - p) for dV (phase B)
                        if (zb[a] >> uint64(b)) & _philox.U64_1:
                            pv = pv * rp
                        else:
                            pv = ZERO
                    sm[pbase + a * TRA * PS + ax + TCA * b] = pv
            if SPLIT:
                for xc in range(XC):
                    x4 = (xc * W) & IMASK
                    for b in range(CA):                 # V_j rows ax + TCA b
                        for w in range(W):
                            vv[b, w] = sm[kbase + VK + b * TCA * KS + x4 + w]
                    for a in range(RA):                 # dO_i rows ay + TRA a
                        for w in range(W):
                            dov[w] = sm[qbase + dOQ + a * TRA * KS + x4 + w]
                        for b in range(CA):
                            g = dp_acc[a, b]
                            for w in range(W):
                                g += dov[w] * vv[b, w]
                            dp_acc[a, b] = g
            # ---- own rows (banded): the rows whose keys all lie in this tile take
            # D = rowsum(P o dP) over it, exact, instead of the D from the stored O
            # (gpu.backward.flash, module docstring): each thread's partial sums go to
            # dSs[r, ax] (not yet written); one thread per own row adds the TCA partials
            # and overwrites D_i in shared memory (Ds), which the dS loop then reads ----
            o_lo = int64(1)
            o_hi = int64(0)
            if OWN:
                o_lo, o_hi = own_rows_dev(r0, r0 + rows - 1, c0, c0 + cols - 1, N_k, lo, hi)
            if OWN and o_lo <= o_hi:
                for a in range(RA):
                    r = ay + TRA * a
                    part = ZERO
                    if r < rows and sm[LO + r] != NEG_INF:
                        for b in range(CA):
                            c = ax + TCA * b
                            if c < cols and c0 + c - r0 - r <= hi and c0 + c - r0 - r >= lo:
                                g = dp_acc[a, b]
                                if dropout:
                                    if (zb[a] >> uint64(b)) & _philox.U64_1:
                                        g = g * rp
                                    else:
                                        g = ZERO
                                part += s_acc[a, b] * g
                    sm[SO + r * PS + ax] = part
                cuda.syncthreads()
                for a in range(RA):
                    r = ay + TRA * a
                    if ax == 0 and o_lo <= r0 + r <= o_hi:
                        acc = ZERO
                        for u in range(TCA):
                            acc += sm[SO + r * PS + u]
                        sm[DO + r] = acc                # own row: D_i exact, in place
                cuda.syncthreads()
            # ---- dS = P (dP - D) -> shared (every valid entry, masked ones included) ----
            for a in range(RA):
                r = ay + TRA * a
                Dr = sm[DO + r]
                row_ok = r < rows
                for b in range(CA):
                    c = ax + TCA * b
                    dsv = ZERO
                    if row_ok and c < cols:
                        g = dp_acc[a, b]
                        if dropout:     # dP = (dO V^T) o Z / (1 - p)
                            if (zb[a] >> uint64(b)) & _philox.U64_1:
                                g = g * rp
                            else:
                                g = ZERO
                        dsv = s_acc[a, b] * (g - Dr)
                    sm[pbase + SP + a * TRA * PS + ax + TCA * b] = dsv
            cuda.syncthreads()
            # ---- B: dV_j += P^T dO_i, dK_j += dS^T Q_i (outer products over r) ----
            for r in range(B_r):
                po = (pcol + r * PS) & IMASK
                qo = (qcol + r * KS) & IMASK
                for g in range(RBG):
                    for w in range(W):
                        pr[g * W + w] = sm[po + g * W * TYB + w]
                        sr[g * W + w] = sm[po + SP + g * W * TYB + w]
                for h in range(DBG):
                    for w in range(W):
                        qr[h * W + w] = sm[qo + h * W * TXB + w]
                        dor[h * W + w] = sm[qo + dOQ + h * W * TXB + w]
                for a in range(RB):
                    pa = pr[a]
                    sa = sr[a]
                    for b in range(DB):
                        dv_acc[a, b] += pa * dor[b]
                        dk_acc[a, b] += sa * qr[b]
            # ---- C: dQ_i partial = dS K_j (c advances 4 at a time), atomics ----
            for a in range(RC):
                for b in range(DC):
                    dq_acc[a, b] = ZERO
            for cc in range(CC):
                c4 = (cc * W) & IMASK
                for a in range(RC):                     # dS rows cy + TYC a, c .. c+3
                    for w in range(W):
                        sv[a, w] = sm[srow + a * TYC * PS + c4 + w]
                for u in range(W):                      # K_j row c + u, own columns
                    ko = (kcol + (c4 + u) * KS) & IMASK
                    for h in range(DCG):
                        for w in range(W):
                            kr[h * W + w] = sm[ko + h * W * TXC + w]
                    for a in range(RC):
                        sa = sv[a, u]
                        for b in range(DC):
                            dq_acc[a, b] += sa * kr[b]
            if DQS:     # -> QA (row-major B_r x d); added after the next barrier
                for a in range(RC):
                    qa = (QA + (cy + TYC * a) * d + W * cx) & IMASK
                    for h in range(DCG):
                        for w in range(W):
                            sm[qa + h * W * TXC + w] = scale * dq_acc[a, h * W + w]
                pr0 = r0
                prows = rows
            else:       # one atomic per element straight from the registers
                for a in range(RC):
                    r = cy + TYC * a
                    if r < rows:
                        for h in range(DCG):
                            for w in range(W):
                                cuda.atomic.add(dqacc, (z, r0 + r, W * cx + W * TXC * h + w),
                                                scale * dq_acc[a, h * W + w])
                        if count:
                            nA += DC
        # ---- dK_j = scale acc, dV_j = acc -> shared (Ks, Vs), then coalesced stores ----
        cuda.syncthreads()                              # everyone done with Ks, Vs (and QA)
        if DQS:         # the last tile's dQ
            for e in range(t, prows * d, THREADS):
                cuda.atomic.add(dqacc, (z, pr0 + e // d, e % d), sm[QA + e])
                if count:
                    nA += 1
        for a in range(RB):
            c = W * by + W * TYB * (a // W) + a % W
            for h in range(DBG):
                for w in range(W):
                    x = W * bx + W * TXB * h + w
                    sm[KO + c * KS + x] = scale * dk_acc[a, h * W + w]
                    sm[VO + c * KS + x] = dv_acc[a, h * W + w]
        cuda.syncthreads()
        for e in range(t, cols * d, THREADS):
            c = e // d
            x = e % d
            dk[z, c0 + c, x] = sm[KO + c * KS + x]
            dv[z, c0 + c, x] = sm[VO + c * KS + x]
            if count:
                nW += 1
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

    # the build without dropout: its own arguments only (gpu._philox.without_dropout)
    kernel = body if dropout else _philox.without_dropout(body)

    name = kernel_name("fa2_bwd_fast", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal,
                       window=bool(window), mask=has_mask, dropout=bool(dropout), count=count,
                       t=threads, tca=TCA, txb=TXB, txc=TXC,
                       maxreg=maxreg or False, fused=not split, nostagger=not stagger,
                       dqdirect=not dq_stage, noown=banded and not OWN_ROWS)
    return kernel, name, jit_options(maxreg)


def default_split(d) -> bool:
    """Phase A's dP loop after P (split, d > 64) or fused with the S loop (d <= 64).
    ptxas -v, sm_90, 64 x 64 tiles, 256 threads, no spills either way: d = 64 fused 152
    registers, split 162; d = 128 split 241, fused 242 (it was 249 / 254 before the dQ
    staging)."""
    return d > 64


def get_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TCA=None, TXB=None,
               TXC=None, maxreg=0, split=None, stagger=True, dq_stage=True, window=False,
               dropout=False):
    """The compiled dispatcher of one specialisation (TCA, TXB, TXC default from `plan`;
    split default `default_split(d)`; window: a local window is given, the band code is
    compiled in as for causal; dropout: the dropout build, five more arguments)."""
    split = default_split(d) if split is None else split
    p = plan(B_r, B_c, d, threads, TCA, TXB, TXC)
    if p is None:
        raise ValueError(plan_error(B_r, B_c, d, dt, threads, smem_limit=1 << 30, TCA=TCA,
                                    TXB=TXB, TXC=TXC))
    return fa2_bwd_fast_kernel(B_r, B_c, d, dt, bool(causal), bool(has_mask), bool(count),
                               int(threads), p["TCA"], p["TXB"], p["TXC"], int(maxreg),
                               bool(split), bool(stagger), bool(dq_stage), bool(window),
                               bool(dropout))


def run(q3, k3, v3, o3, do3, L, D, dqacc, dk_h, dv_h, scale, N, H, G, mask, counters, *,
        B_r, B_c, dt, causal, count, threads, TCA=None, TXB=None, TXC=None, maxreg=0,
        split=None, stagger=True, dq_stage=True, window=(-1, -1), dropout=None):
    """Launch the main kernel on the arrays of the plain main-kernel launch in
    `flash.attention_backward` (o3 is not read: D already holds rowsum(dO o O)).
    N: query rows; the key rows N_k are k3's (k3, v3, dk_h, dv_h have N_k rows);
    window=(left, right): a local window (bottom-right aligned, gpu.forward._band).
    mask: the uint8 block mask on the device, or None / a dummy with has_mask from None.
    TCA, TXB, TXC (threads per row of phases A, B, C), maxreg (register cap) and split
    (phase A's dP loop after P, default `default_split(d)`) and stagger (each key block
    starts its query-block loop at a different block, j mod the count) are tuning knobs.
    dropout: None, or the forward's (dropout_p, seed, offset) (p > 0 compiles the dropout
    build, which regenerates the forward's keep mask; p = 0 the kernel without dropout)."""
    from .._launch import launch
    from ..forward._band import band_args
    d = q3.shape[2]
    N_k = k3.shape[1]
    windowed, lo, hi = band_args(N, N_k, bool(causal), window)
    has_mask = mask is not None and mask is not dummy_mask()
    drop = bool(dropout and dropout[0] > 0)
    kern = get_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TCA, TXB, TXC,
                      maxreg, split, stagger, dq_stage, windowed, drop)
    p = plan(B_r, B_c, d, threads, TCA, TXB, TXC)
    shmem = layout(B_r, B_c, d, p["TCA"], dq_stage)["bytes"]
    T_c = -(-N_k // B_c)
    mk = mask if has_mask else dummy_mask()
    grid = (q3.shape[0], T_c) if causal else (T_c, q3.shape[0])
    launch(kern, grid, threads, shmem,
           q3, k3, v3, do3, L, D, dqacc, dk_h, dv_h, np.float32(scale), np.int64(N),
           np.int64(N_k), lo, hi, np.int64(H), np.int64(G), mk, counters,
           *(_philox.kernel_args(*dropout) if drop else ()))


def signature(dt="fp32", dropout=False):
    """Argument types of the main kernel (for cuda.compile_ptx without a GPU; dropout:
    the dropout build's, five more)."""
    from numba.cuda import types as nb
    X = NB_DTYPE[dt]
    A3 = nb.Array(X, 3, "C")
    F2 = nb.Array(nb.float32, 2, "C")
    drop = (nb.uint64,) * 4 + (nb.float32,) if dropout else ()
    return (A3, A3, A3, A3, F2, F2, nb.Array(nb.float32, 3, "C"), A3, A3, nb.float32,
            nb.int64, nb.int64, nb.int64, nb.int64, nb.int64, nb.int64,
            nb.Array(nb.uint8, 2, "C"),
            nb.Array(nb.int64, 2, "C")) + drop


def pre_signature(dt="fp32"):
    from numba.cuda import types as nb
    X = NB_DTYPE[dt]
    return (nb.Array(X, 3, "C"), nb.Array(X, 3, "C"), nb.Array(nb.float32, 2, "C"),
            nb.Array(nb.float32, 3, "C"), nb.int64, nb.Array(nb.int64, 2, "C"))


def ptx(B_r, B_c, d, dt="fp32", causal=False, has_mask=False, count=False, threads=256,
        **opts) -> str:
    """PTX of one main-kernel specialisation, built without a GPU (NUMBA_ENABLE_CUDASIM
    unset); `.version` lowered to 9.0 so a CUDA 13.0 ptxas accepts it. A register cap is
    ptxas's business (`ptxas -arch=sm_90 -v --maxrregcount 128 file.ptx`)."""
    import re
    if SIM:
        raise RuntimeError("ptx() needs NUMBA_ENABLE_CUDASIM unset (no GPU is needed)")
    kern = get_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, **opts)
    text, _ = cuda.compile_ptx(kern.py_func, signature(dt, opts.get("dropout", False)),
                               cc=(9, 0))
    return re.sub(r"\.version \d+\.\d+", ".version 9.0", text, count=1)


__all__ = ["plan", "plan_error", "layout", "smem_bytes", "supports", "pick_threads",
           "default_tiling", "fa2_pre_fast_kernel", "run_pre", "fa2_bwd_fast_kernel",
           "get_kernel", "run", "signature", "pre_signature", "ptx"]
