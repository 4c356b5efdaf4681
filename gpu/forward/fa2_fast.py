"""FlashAttention-2 forward, register-tiled on the CUDA cores (fp32 math): the fast path.

Same schedule, hence the same HBM traffic, as `gpu.fa2` and `iosim.schedules.fa2_forward`:
one thread block per (query block i, instance); read Q_i once; for each active key block
j (outside the causal / window band of gpu.forward._band, N_q != N_k aligned
bottom-right: skip; block_mask[i, j] False: skip) read K_j and
V_j once; online softmax with float32 running max m and sum l; write O_i and
L_i = m + log(l) once (a row with no visible key: O = 0, L = -inf). Ragged N: only the
valid rows are loaded / stored (and counted); the rest of a tile is zero-filled on chip.

Versions (llm.c style; timings: H100, fp32, d = 64, batch x heads = 16, N = 4096, kernel
alone, non-causal; results data set, kind `fast_variants`):
  v1  scalar shared loads: Q and K stored transposed (x-major), one 4-byte LDS per
      operand; RM + RN loads per RM x RN FMAs (8 + 8 per 64). 5.47 ms, 12.6 TFLOP/s.
  v2  (this file) 16-byte shared loads (LDS.128): Q, K, V, P stay row-major and the
      reduction index (x for S = Q K^T, c for P V) advances 4 at a time, so each
      operand load brings 4 consecutive floats; RM + RN loads per 4 RM RN FMAs.
      128 x 64 tile, 128 threads: 3.45 ms. Tuned (rounds 3-5, 19 variants at d = 64):
      256 x 32 tile, 512 threads, TC = 8, registers capped at 128 (`maxreg`; 56 bytes
      spill): 2.76 ms, 24.9 TFLOP/s; d = 128: 5.80 ms, 23.7 TFLOP/s.
  v3  `stage=1` (round 6): the next K/V tile's global loads are issued into registers
      before this tile's arithmetic and stored to shared memory after it: 2.56 ms,
      26.9 TFLOP/s (d = 128: 5.51 ms). `stage=2` (a second K/V buffer, one barrier
      less per tile) measured 2.62 ms: more shared memory, no gain.

Thread layout. `threads` = TR x TC threads, thread t = (ty, tx) = (t // TC, t % TC), so
the TC threads that share a query row are consecutive lanes of one warp. With
B_r = TR * RM and B_c = TC * RN each thread owns, in registers,
    S/P:  RM x RN entries, rows ty + TR a (a < RM), key columns tx + TC b (b < RN),
    O:    RM x DN accumulators, the same rows, head columns 4 tx + 4 TC g + w
          (g < DN / 4, w < 4: groups of 4 consecutive columns, one LDS.128 of V each),
    m, l: its RM rows' running max and its own partial row sum (l is summed over the TC
          threads of a row only at the end: all of them rescale by the same alpha).
All register tiles are `cuda.local.array`s indexed by unrolled compile-time loops.

Shared memory (float32 whatever the storage dtype; one dynamic buffer of `smem_bytes`,
declared 16-byte aligned; all row strides are multiples of 4 floats):
    Qs   B_r x QS   Q_i, QS = d + pad, QS = 4 (mod 32)   (later O_i, then L_i staging)
    Ks   B_c x KS   K_j, KS = d + pad, KS = 4 (mod 32)
    Vs   B_c x d    V_j
    Ps   B_r x PS   P,   PS >= B_c, PS = TC (mod 32)
    RED  B_r x TC   partial row maxima / sums (only without warp shuffles)
Bank conflicts. A 16-byte load is served a quarter warp (8 lanes) at a time. The 8 lanes
of a quarter read either one word group (Q_i or P: one row, a broadcast), or the 8 rows
tx + TC b of K_j at the same x: row stride 4 (mod 32) words puts them in 8 distinct
4-bank groups; or 8 consecutive 16-byte groups of one V row. The scalar P stores of a
warp (32 / TC rows, TC consecutive columns) hit distinct banks because PS = TC (mod 32).
Global loads and stores are coalesced 4-byte accesses (a warp covers 128 consecutive
bytes of a row of Q, K, V, O); Numba cannot tell NVVM that a kernel argument is 16-byte
aligned, so wider global accesses are not generated. O_i goes through shared memory (in
Qs) so its stores are coalesced too.

Why the index masks: Numba wraps negative indices (`i < 0 ? i + n : i`) on signed
integers; that select hides from NVVM that 4 neighbouring loads are contiguous, and no
LDS.128 comes out. `& IMASK` (a no-op on our non-negative indices) proves the base index
non-negative, and the unrolled offsets keep it so; with the buffer declared 16-byte
aligned and every base a multiple of 4, NVVM's load/store vectoriser emits
ld.shared.v4.f32 (`flashsim check --ptx` requires it; tests/test_check.py runs that
check without a GPU).

Per key tile: sync; K_j, V_j -> shared (row-major copies); sync; [stage >= 1: issue the
loads of the next active tile into registers]; S = Q_i K_j^T in registers
(d / 4 steps of RM + RN LDS.128 and 4 RM RN FMAs); scale, mask; row max (warp shuffles
over the TC lanes of a row, or RED + a barrier); P = exp(S - m_new),
alpha = exp(m - m_new), l = alpha l + rowsum, O *= alpha; P -> Ps; sync;
O += P V_j (B_c / 4 steps of RM + DN LDS.128 and 4 RM DN FMAs).
K/V loading (`stage`). Numba has no asynchronous copy (cp.async), so the overlap of the
next tile's loads with this tile's arithmetic goes through registers: with stage >= 1
each thread issues its LK loads of tile j+1 (8 floats for 256 x 32 at d = 64) right
after tile j is in shared memory, and stores them after tile j's P V. stage=1 keeps one
K/V buffer (a barrier before the store); stage=2 double-buffers K/V in shared memory
and drops that barrier. The default (gpu.api.FA2_FAST_TUNED) is stage=1.
`shfl=True` (hardware only: the simulator has no warp shuffles) reduces the row max and
the final row sums with `cuda.shfl_xor_sync` over the TC lanes of a row.

Dropout (compile-time flag `dropout`, a separate specialisation; `run(...,
dropout=(p, seed, offset))`; Algorithm 2 of the FlashAttention paper, as gpu.forward.fa2):
l sums P~ before dropout; the P stored to Ps for the P V product is P~ Z / (1 - p), Z the
keep mask of gpu._philox (bit-identical to iosim.dropout), drawn per query row as one
uint64 of bits (`_philox.row_bits`: one Philox evaluation per entry of the thread's
RM x RN tile, its columns tx + TC b) before the unrolled register-tile loop. No extra
HBM traffic: the counts are those without dropout. The build without dropout keeps its
arguments and compiles to the PTX it had before dropout existed (scripts/ptx_snapshot.py).

Counting (count=True, compile-time): each thread counts the elements it loads / stores per
tensor in registers and adds them with one `cuda.atomic.add` per tensor at the end into
the int64 counters of `gpu._launch`; with count=False that code is not compiled at all.

Interface: `run(...)` has the signature of `gpu.fa2.run` (plus optional tuning keywords),
so `gpu.attention(..., algorithm="fa2")` can call it whenever `supports(...)` is true.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64, uint64

from .._launch import (NAN, NB_DTYPE, NEG_INF, ONE, READ, SIM, WRITE, ZERO, T, add_count,
                      dummy_mask, jit_options, kernel_name, lane_group_reducer,
                      specialisation)
from .. import _philox


from ._band import active_tile_finder, band_args, sees_key_band

# the launch geometry (which tilings run, threads, shared-memory layout): iosim.launch
from iosim.launch.forward import fa2_fast as _geometry
from iosim.launch.forward.fa2_fast import W, layout, plan, smem_bytes

MAX_R, TC_CHOICES = _geometry.MAX_R, _geometry.TC_CHOICES
_stride, _pad_ps = _geometry._stride, _geometry._pad_ps
#: Index mask: a no-op on every index we form (all < 2**30), proving it non-negative.
IMASK = 0x3FFFFFFF
#: Alignment of the dynamic shared buffer (the simulator accepts no alignment argument).
ALIGN = None if SIM else 16




def supports(B_r, B_c, d, threads, *, TC=None, shfl=False, stage=0, smem_limit=None) -> bool:
    """True if this kernel handles the configuration (TC: threads per row, default from
    `plan`; shfl: warp-shuffle reductions, which need no RED region) and its shared
    memory fits."""
    p = plan(B_r, B_c, d, threads, TC)
    if p is None or (shfl and SIM):
        return False
    if smem_limit is None:
        from .._launch import device_smem_limit
        smem_limit = device_smem_limit()
    return smem_bytes(B_r, B_c, d, threads, TC, shfl=shfl, stage=stage) <= smem_limit


def register_qk(RM, RN, TR, TC, QS, KS, d):
    """Device function qk(sm, qbase, kbase, s_acc, qv, kv): s_acc[a, b] = sum over x < d of
    sm[qbase + a TR QS + x] * sm[kbase + b TC KS + x] (a < RM, b < RN), i.e. this thread's
    RM x RN register tile of A B^T for two row-major float32 tiles in shared memory (row
    strides QS, KS, multiples of 4; qbase = the thread's first A row ty, kbase its first
    B row tx, both masked with IMASK). x advances 4 at a time: RM + RN LDS.128 and
    4 RM RN FMAs per step. qv (W,) and kv (RN, W) are the caller's float32 local arrays.
    Used by fa2_fast (S = Q_i K_j^T) and standard_fast / fa1_fast."""
    XC = d // W

    @cuda.jit(device=True, inline=True)
    def qk(sm, qbase, kbase, s_acc, qv, kv):
        for a in range(RM):
            for b in range(RN):
                s_acc[a, b] = ZERO
        for xc in range(XC):
            x4 = (xc * W) & IMASK
            for b in range(RN):                     # B rows tx + TC b, x .. x+3
                for w in range(W):
                    kv[b, w] = sm[kbase + b * TC * KS + x4 + w]
            for a in range(RM):                     # A row ty + TR a, x .. x+3
                for w in range(W):
                    qv[w] = sm[qbase + a * TR * QS + x4 + w]
                for b in range(RN):
                    s = s_acc[a, b]
                    for w in range(W):
                        s += qv[w] * kv[b, w]
                    s_acc[a, b] = s
    return qk


def register_pv(RM, DN, TR, TC, PS, VS, B_c):
    """Device function pv(sm, pbase, vbase, col4, o_acc, pv, vv): o_acc[a, 4 g + w] +=
    sum over c < B_c of sm[pbase + a TR PS + c] * sm[vbase + c VS + col4 + 4 TC g + w]
    (a < RM, g < DN / 4, w < 4): this thread's RM x DN register tile of P V for a
    row-major P tile (row stride PS; pbase = the thread's first row ty) and a row-major V
    tile (row stride VS; vbase its first word, col4 = 4 tx its first column group), both
    float32 in shared memory. c advances 4 at a time: RM + DN / 4 x 4 LDS.128 and
    4 RM DN FMAs per step. pv (RM, W) and vv (DN,) are the caller's local arrays. Used by
    fa2_fast (O += P V_j) and standard_fast / fa1_fast."""
    CC = B_c // W
    DG = DN // W

    @cuda.jit(device=True, inline=True)
    def pvp(sm, pbase, vbase, col4, o_acc, pv, vv):
        for cc in range(CC):
            c4 = (cc * W) & IMASK
            for a in range(RM):                     # P row ty + TR a, c .. c+3
                for w in range(W):
                    pv[a, w] = sm[pbase + a * TR * PS + c4 + w]
            for u in range(W):                      # V row c + u, own columns
                for g in range(DG):
                    for w in range(W):
                        vv[g * W + w] = sm[vbase + c4 * VS + u * VS + col4 + g * W * TC + w]
                for a in range(RM):
                    p = pv[a, u]
                    for b in range(DN):
                        o_acc[a, b] += p * vv[b]
    return pvp


def score_row_max(RM, RN, TR, TC, RO, banded, shfl):
    """Device function masked_row_max(sm, s_acc, mx_r, scale, cols, c0, r0, lo, hi, tx, ty):
    the RM x RN register tile s_acc of S (rows ty + TR a, columns tx + TC b of the tile at
    (r0, c0)) scaled, -inf at columns >= cols and (`banded`) outside the band [lo, hi];
    mx_r[a] = the max of row ty + TR a over its TC threads: warp shuffles (`shfl`) or the
    shared RED words at RO (a barrier inside, every thread must call it). Shared by the
    fast fa2 and fa1 forward kernels."""
    row_max = lane_group_reducer(TC, "max") if shfl else None

    @cuda.jit(device=True, inline=True)
    def masked_row_max(sm, s_acc, mx_r, scale, cols, c0, r0, lo, hi, tx, ty):
        for a in range(RM):
            r = ty + TR * a
            mx = NEG_INF
            for b in range(RN):
                c = tx + TC * b
                sv = s_acc[a, b] * scale
                if c >= cols:
                    sv = NEG_INF
                if banded:
                    if c0 + c - r0 - r > hi or c0 + c - r0 - r < lo:
                        sv = NEG_INF
                s_acc[a, b] = sv
                mx = max(mx, sv)
            if shfl:
                mx = row_max(mx)
                mx_r[a] = mx
            else:
                sm[RO + r * TC + tx] = mx
        if not shfl:
            cuda.syncthreads()                      # RED complete
            for a in range(RM):
                r = ty + TR * a
                mx = NEG_INF
                for u in range(TC):
                    mx = max(mx, sm[RO + r * TC + u])
                mx_r[a] = mx

    return masked_row_max


def tile_loader(R, d, threads, AO, AS, count):
    """Device function load(a, z, r0, rows, t, sm, n) -> n: rows r0 .. r0 + rows - 1 of an
    (instances, N, d) tensor a (instance z) into the R x d shared tile at AO (row stride
    AS), zero rows past `rows`; with `count`, n grows by the elements read. The one-tensor
    `pair_tile_loader`: the fast fa2 forward (Q) and the fast standard S kernel (Q, K)."""
    NE = R * d
    L = -(-NE // threads)
    DIV = NE % threads == 0

    @cuda.jit(device=True, inline=True)
    def load(a, z, r0, rows, t, sm, n):
        for it in range(L):
            e = t + it * threads
            if DIV or e < NE:
                r = e // d
                x = e % d
                val = ZERO
                if r < rows:
                    val = float32(a[z, r0 + r, x])
                    if count:
                        n += 1
                sm[AO + r * AS + x] = val
        return n

    return load


def tile_storer(d, threads, AO, AS, count):
    """Device function store(a, z, r0, rows, t, sm, n) -> n: the shared tile at AO (row
    stride AS) into rows r0 .. r0 + rows - 1 of an (instances, N, d) tensor a (instance
    z), row by row, consecutive threads on consecutive elements (full 32-byte sectors);
    with `count`, n grows by the elements written. The fast fa2 and fa1 forward and the
    fast standard PV kernel (O)."""

    @cuda.jit(device=True, inline=True)
    def store(a, z, r0, rows, t, sm, n):
        for e in range(t, rows * d, threads):
            r = e // d
            x = e % d
            a[z, r0 + r, x] = sm[AO + r * AS + x]
            if count:
                n += 1
        return n

    return store


def pair_tile_loader(R, d, threads, AO, AS, BO, BS, count):
    """Device function load(a, b, z, r0, rows, t, sm, n) -> n: rows r0 .. r0 + rows - 1 of
    two (instances, N, d) tensors a, b (instance z) into the R x d shared tiles at AO and
    BO (row strides AS, BS), zero rows past `rows`; each of the `threads` threads takes
    every threads-th element. With `count`, n (the thread's element counter) grows by the
    rows it read from a (= from b). Used by the fast fa1 forward (K, V) and the fast fa2
    backward (K, V; Q, dO)."""
    NE = R * d
    L = -(-NE // threads)
    DIV = NE % threads == 0

    @cuda.jit(device=True, inline=True)
    def load(a, b, z, r0, rows, t, sm, n):
        for it in range(L):
            e = t + it * threads
            if DIV or e < NE:
                r = e // d
                x = e % d
                ax = ZERO
                bx = ZERO
                if r < rows:
                    ax = float32(a[z, r0 + r, x])
                    bx = float32(b[z, r0 + r, x])
                    if count:
                        n += 1
                sm[AO + r * AS + x] = ax
                sm[BO + r * BS + x] = bx
        return n

    return load


def pair_row_loader(R, threads, AO, BO, fill_b, count):
    """Device function load(a, b, z, r0, rows, t, sm, n) -> n: entries r0 .. r0 + rows - 1
    of two float32 (instances, N) row vectors a, b into the R-word shared vectors at AO and
    BO, past `rows` 0 (a) and fill_b (b); n grows by the entries read from a with `count`.
    Used by the fast fa1 forward (l, m) and the fast fa2 backward (L, D)."""

    @cuda.jit(device=True, inline=True)
    def load(a, b, z, r0, rows, t, sm, n):
        for r in range(t, R, threads):
            ax = ZERO
            bx = fill_b
            if r < rows:
                ax = a[z, r0 + r]
                bx = b[z, r0 + r]
                if count:
                    n += 1
            sm[AO + r] = ax
            sm[BO + r] = bx
        return n

    return load


@specialisation
def fa2_fast_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TC, shfl, maxreg=0,
                    stage=0, window=False, dropout=False):
    """Kernel(q, k, v, o, L, scale, N, N_k, lo, hi, H, G, mask, counters): arguments as
    gpu.forward.fa2 (window: the compile-time flag of gpu.forward._band); the dropout
    build (`dropout`) takes five more, key0, key1, offset, thr (uint64), rp (float32)
    (gpu._philox.kernel_args), as gpu.forward.fa2: l sums P~ before dropout and the P~
    stored for the P V product is P~ Z / (1 - p). Without `dropout` the kernel is the one
    it was before dropout existed (same arguments, same code).
    Grid (T_r, instances), `threads` threads, `smem_bytes(...)` dynamic shared bytes.
    maxreg > 0 caps the registers per thread (ptxas spills beyond it): fewer registers,
    more resident blocks per SM (a tuning knob; hardware only). stage: 0 loads each K/V
    tile between two barriers; 1 issues the next tile's loads into registers before
    this tile's arithmetic (LK more registers); 2 does that into a second K/V buffer,
    which saves one barrier per tile."""
    TR, TC_, RM, RN, DN = plan(B_r, B_c, d, threads, TC)
    assert TC_ == TC
    lay = layout(B_r, B_c, d, TC, TR, shfl, stage)
    QS, KS, PS = lay["QS"], lay["KS"], lay["PS"]
    KBUF = B_c * KS if stage == 2 else 0      # second K / V buffer offsets
    VBUF = B_c * d if stage == 2 else 0
    QO, KO, VO, PO, RO = lay["QO"], lay["KO"], lay["VO"], lay["PO"], lay["RO"]
    THREADS = threads
    banded = causal or window
    DG = DN // W          # groups of 4 head columns per thread
    KN = B_c * d
    LK = -(-KN // THREADS)
    KDIV = KN % THREADS == 0
    IQ, IK, IV, IO, IL = T["Q"], T["K"], T["V"], T["O"], T["L"]
    # row reductions over the TC lanes of a query row by warp shuffles (TC a power of two
    # dividing 32 for shfl); without shfl the kernel reduces through shared memory
    if shfl:
        assert TC <= 32 and TC & (TC - 1) == 0, "shfl needs TC a power of two <= 32"
    row_sum = lane_group_reducer(TC, "sum") if shfl else None
    qk_product = register_qk(RM, RN, TR, TC, QS, KS, d)
    masked_row_max = score_row_max(RM, RN, TR, TC, RO, banded, shfl)
    pv_product = register_pv(RM, DN, TR, TC, PS, d, B_c)
    next_tile = active_tile_finder(B_c, banded, has_mask)
    load_q = tile_loader(B_r, d, THREADS, QO, QS, count)
    store_o = tile_storer(d, THREADS, QO, QS, count)

    @cuda.jit(device=True, inline=True)
    def ldg_tile(k, v, zk, c0, cols, t, kst, vst):
        """This thread's share of K_j, V_j (rows c0 .. c0 + cols - 1) into registers, zeros
        past N; returns the number of K elements it loaded (= V elements)."""
        n = int64(0)
        for it in range(LK):
            e = t + it * THREADS
            kst[it] = ZERO
            vst[it] = ZERO
            if KDIV or e < KN:
                c = e // d
                x = e % d
                if c < cols:
                    kst[it] = float32(k[zk, c0 + c, x])
                    vst[it] = float32(v[zk, c0 + c, x])
                    n += 1
        return n

    def body(q, k, v, o, L, scale, N, N_k, lo, hi, H, G, mask, counters, key0, key1, offset,
             thr, rp):
        if causal:   # heaviest query blocks (most key tiles) first
            i = cuda.gridDim.x - 1 - cuda.blockIdx.x
        else:
            i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        tx = t % TC
        ty = t // TC
        zk = (z // H) * (H // G) + (z % H) // G        # this head's K/V instance
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        s_acc = cuda.local.array((RM, RN), float32)
        o_acc = cuda.local.array((RM, DN), float32)
        m_r = cuda.local.array(RM, float32)
        l_r = cuda.local.array(RM, float32)
        qv = cuda.local.array(W, float32)
        kv = cuda.local.array((RN, W), float32)
        pv = cuda.local.array((RM, W), float32)
        vv = cuda.local.array(DN, float32)
        mx_r = cuda.local.array(RM, float32)
        kst = cuda.local.array(LK, float32)             # this thread's share of a K / V tile
        vst = cuda.local.array(LK, float32)
        nQ = int64(0)
        nK = int64(0)
        nO = int64(0)
        nL = int64(0)
        # this thread's first word in each region (masked: see the module docstring)
        qbase = (QO + ty * QS) & IMASK          # Qs row ty
        kbase = (KO + tx * KS) & IMASK          # Ks row tx
        pbase = (PO + ty * PS) & IMASK          # Ps row ty
        col4 = (W * tx) & IMASK                 # first of its 4-column groups of V / O

        r0 = i * B_r
        rows = min(B_r, N - r0)
        last = r0 + rows - 1
        # ---- Q_i -> Qs (row-major copy, zero rows past N) ----
        nQ = load_q(q, z, r0, rows, t, sm, nQ)
        for a in range(RM):
            m_r[a] = NEG_INF
            l_r[a] = ZERO
            for b in range(DN):
                o_acc[a, b] = ZERO

        T_c = (N_k + B_c - 1) // B_c
        jn = next_tile(0, T_c, r0, last, N_k, lo, hi, mask, i)
        if stage and jn < T_c:                          # first tile -> registers
            nK += ldg_tile(k, v, zk, jn * B_c, min(B_c, N_k - jn * B_c), t, kst, vst)
        buf = 0
        while jn < T_c:
            j = jn
            c0 = j * B_c
            cols = min(B_c, N_k - c0)
            koff = (buf * KBUF) & IMASK                 # this tile's K / V buffer
            voff = (buf * VBUF) & IMASK
            if not stage:                               # stage 0: this tile's loads now
                nK += ldg_tile(k, v, zk, c0, cols, t, kst, vst)
            if stage < 2:
                cuda.syncthreads()                      # previous tile done with Ks, Vs, Ps
            for it in range(LK):                        # registers -> shared
                e = t + it * THREADS
                if KDIV or e < KN:
                    c = e // d
                    x = e % d
                    sm[KO + koff + c * KS + x] = kst[it]
                    sm[VO + voff + c * d + x] = vst[it]
            cuda.syncthreads()
            jn = next_tile(j + 1, T_c, r0, last, N_k, lo, hi, mask, i)
            if stage and jn < T_c:   # next tile's loads stay in flight during this tile
                nK += ldg_tile(k, v, zk, jn * B_c, min(B_c, N_k - jn * B_c), t, kst, vst)
            # ---- S = Q_i K_j^T in registers: x advances 4 at a time (LDS.128) ----
            qk_product(sm, qbase, kbase + koff, s_acc, qv, kv)
            # ---- scale, mask, row max ----
            masked_row_max(sm, s_acc, mx_r, scale, cols, c0, r0, lo, hi, tx, ty)
            # ---- online softmax update; P -> Ps ----
            for a in range(RM):
                m_old = m_r[a]
                m_new = max(m_old, mx_r[a])
                m_safe = m_new if m_new > NEG_INF else ZERO
                alpha = math.exp(m_old - m_safe)       # 0 while nothing was visible
                m_r[a] = m_new
                ps = ZERO
                # dropout: this thread's Z entries of the row first, bit b of one uint64,
                # so that the register-tile loop below stays free of Philox and unrolls
                zb = _philox.U64_0
                if dropout:
                    zb = _philox.row_bits(key0, key1, offset, z, r0 + ty + TR * a, c0 + tx,
                                          TC, RN, thr)
                for b in range(RN):
                    p = math.exp(s_acc[a, b] - m_safe)
                    ps += p                             # l: P~ before dropout
                    if dropout:                         # P~ o Z / (1 - p), Z by Philox
                        if (zb >> uint64(b)) & _philox.U64_1:
                            p = p * rp
                        else:
                            p = ZERO
                    sm[pbase + a * TR * PS + tx + TC * b] = p
                l_r[a] = l_r[a] * alpha + ps
                for b in range(DN):
                    o_acc[a, b] *= alpha
            cuda.syncthreads()                          # P complete
            # ---- O += P V_j: c advances 4 at a time (LDS.128 of P and of V) ----
            pv_product(sm, pbase, VO + voff, col4, o_acc, pv, vv)
            if stage == 2:
                buf = 1 - buf
        # ---- row sums over the TC threads of each row ----
        if shfl:
            for a in range(RM):
                ls = l_r[a]
                ls = row_sum(ls)
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
        # ---- O_i = acc / l -> Qs, L_i = m + log l -> Ps; then coalesced stores ----
        cuda.syncthreads()                              # all threads past their last Qs / Ps read
        for a in range(RM):
            ls = l_r[a]
            # l > 0 fails for l = NaN (a NaN or Inf input) as well as for l = 0: only a row
            # that sees no key gets O = 0, L = -inf; one that sees a key gets NaN
            if ls > ZERO:
                inv = ONE / ls
                Lr = m_r[a] + math.log(ls)
            elif sees_key_band(mask, i, r0 + ty + TR * a, B_c, N_k, lo, hi, banded, has_mask):
                inv = NAN
                Lr = NAN
            else:
                inv = ZERO
                Lr = NEG_INF
            for g in range(DG):
                for w in range(W):
                    sm[qbase + a * TR * QS + col4 + g * W * TC + w] = o_acc[a, g * W + w] * inv
            if tx == 0:
                sm[PO + ty + TR * a] = Lr
        cuda.syncthreads()
        # O_i and L_i leave row by row: consecutive threads store consecutive elements
        # (full 32-byte sectors, so what Nsight counts matches the ledger)
        nO = store_o(o, z, r0, rows, t, sm, nO)
        for r in range(t, rows, THREADS):
            L[z, r0 + r] = sm[PO + r]
            if count:
                nL += 1
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nK)
            add_count(counters, IO, WRITE, nO)
            add_count(counters, IL, WRITE, nL)

    # the build without dropout: its own arguments only (gpu._philox.without_dropout)
    kernel = body if dropout else _philox.without_dropout(body)

    name = kernel_name("fa2_fast", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal, window=window,
                       mask=has_mask, dropout=dropout,
                       count=count, t=threads, tc=TC, shfl=shfl, maxreg=maxreg or False,
                       stage=stage or False)
    return kernel, name, jit_options(maxreg)


def get_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TC=None, shfl=False,
               maxreg=0, stage=0, window=False, dropout=False):
    """The compiled dispatcher for one specialisation (TC: threads per row, default
    from `plan`; maxreg: register cap, 0 = none; stage: K/V load staging, 0..2; dropout:
    the dropout build, five more arguments)."""
    p = plan(B_r, B_c, d, threads, TC)
    if p is None:
        raise ValueError(f"fa2_fast does not support B_r={B_r}, B_c={B_c}, d={d}, "
                         f"threads={threads}, TC={TC}")
    return fa2_fast_kernel(B_r, B_c, d, dt, bool(causal), bool(has_mask), bool(count),
                           int(threads), p[1], bool(shfl), int(maxreg), int(stage),
                           bool(window), bool(dropout))


def run(q3, k3, v3, o3, L2, scale, N, H, G, mask, counters, *, B_r, B_c, dt, causal,
        count, threads, TC=None, shfl=False, maxreg=0, stage=0, N_k=None, window=(-1, -1),
        dropout=None):
    """Launch on 3-D device views q3, o3 (instances, N, d), k3, v3 (kv instances, N_k, d;
    N_k default N); writes o3 and L2. Same signature as gpu.forward.fa2.run; TC (threads
    per query row), shfl, maxreg and stage are optional tuning knobs. dropout: None, or
    (dropout_p, seed, offset) (iosim.dropout; p > 0 compiles the dropout build, p = 0 runs
    the kernel without dropout)."""
    from .._launch import launch
    d = q3.shape[2]
    N_k = N if N_k is None else int(N_k)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    drop = bool(dropout and dropout[0] > 0)
    kern = get_kernel(B_r, B_c, d, dt, causal, mask is not None, count, threads, TC, shfl,
                      maxreg, stage, windowed, drop)
    p = plan(B_r, B_c, d, threads, TC)
    shmem = layout(B_r, B_c, d, p[1], p[0], shfl, stage)["bytes"]
    T_r = -(-N // B_r)
    mk = mask if mask is not None else dummy_mask()
    launch(kern, (T_r, q3.shape[0]), threads, shmem,
           q3, k3, v3, o3, L2, np.float32(scale), np.int64(N), np.int64(N_k), lo, hi,
           np.int64(H), np.int64(G),
           mk, counters, *(_philox.kernel_args(*dropout) if drop else ()))


def signature(dt="fp32", dropout=False):
    """Argument types of the kernel (for cuda.compile_ptx without a GPU; dropout: the
    dropout build's, five more)."""
    from numba.cuda import types as nb
    X = NB_DTYPE[dt]
    drop = (nb.uint64,) * 4 + (nb.float32,) if dropout else ()
    return (nb.Array(X, 3, "C"), nb.Array(X, 3, "C"), nb.Array(X, 3, "C"),
            nb.Array(X, 3, "C"), nb.Array(nb.float32, 2, "C"), nb.float32, nb.int64,
            nb.int64, nb.int64, nb.int64, nb.int64, nb.int64, nb.Array(nb.uint8, 2, "C"),
            nb.Array(nb.int64, 2, "C")) + drop


__all__ = ["plan", "layout", "smem_bytes", "supports", "register_qk", "register_pv",
           "active_tile_finder", "score_row_max", "tile_loader", "tile_storer",
           "pair_tile_loader", "pair_row_loader", "fa2_fast_kernel", "get_kernel", "run",
           "signature"]
