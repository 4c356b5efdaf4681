"""Split-KV decoding kernels on the CUDA cores: the main (per split) kernel and the combine.

Same schedules, hence the same HBM traffic, as `iosim.decode` (`fa2_decode` when
num_splits S = 1, `split_kv` when S > 1; contiguous or paged cache; kv_reads
"per_query_head" or "per_group"); the instrumented build (count=True) counts every element
it loads or stores, and those counts equal `iosim.decode.decode_closed_form` exactly.

Main kernel, grid (S, R): blockIdx.x = split s, blockIdx.y = reader. A reader is
(batch b, query head h) for kv_reads="per_query_head" (NG = 1 query head per block) or
(batch b, K/V head g) for "per_group" (NG = G = heads // kv_heads query heads: the block
reads K/V once for all of them). The block serves NR = NG x N_q query rows (row r:
local head r // N_q, new row r % N_q) over the chunk [a, e) = [s C, min((s+1) C, N_kv)),
C = ceil(N_kv / S) cache rows (the paper's B_c-row K/V blocks are its tiles), where
N_kv = seqlens[b], the sequence's own length read from the device (a ragged batch: each
sequence has its own chunk, S = gridDim.x for all; a block whose chunk is empty reads
nothing and writes O = 0, L = -inf, or its partial Opart = 0, Lpart = -inf):
    read Q (NR x d, once) -> shared, float32;
    for each segment of the chunk (contiguous: the whole chunk; paged: the part of each
      page the chunk touches, after reading that page's block-table entry, one int32
      per page per block) and each tile of TB rows of the segment:
        A  every group of LPR consecutive lanes takes key rows c = group + NGRP kk
           (kk < KPG), whose K row and V row slices are already in its registers (VW
           consecutive elements a lane: one 16-byte load where the dtype allows), forms
           S[r, c] = scale Q[r] . K[c] for every row r (each lane's partial dot product,
           summed over the group with warp shuffles), masks c > N_kv - N_q + (r mod N_q)
           (bottom-right causal), stores S (float32) and its V row to shared memory,
           then issues the NEXT tile's K/V loads into the registers just freed, so they
           are in flight during B and C (paged: the next page's block-table entry is read
           one tile ahead by thread 0 into a 2-entry shared buffer);
        B  online softmax per row r: m_new = max(m, rowmax S), P = exp(S - m_new) in
           place, alpha = exp(m - m_new), l = alpha l + rowsum P (a warp per row with
           shuffles; one thread per row in the simulator);
        C  O accumulator (NR x d float32, in registers: thread t owns entries t + NT i)
           acc = alpha acc + P V_tile.
    S = 1: write O = acc / l (problem dtype, N_q x d per query head) and L = m + log l
    (float32). S > 1: write Opart[s] = acc / l and Lpart[s] = m + log l (float32). A row
    that sees no key of its chunk gets O (Opart) = 0, L (Lpart) = -inf; a row that sees one
    and meets a NaN or Inf gets NaN.
Combine kernel, grid (batch x heads): reads Lpart[:, r] once each (into shared memory),
M = max_s Lpart_s, w_s = exp(Lpart_s - M); reads each Opart element once and writes
O = sum_s w_s Opart_s / sum_s w_s (problem dtype) and L = M + log sum_s w_s.

Why the CUDA cores. With N_q <= 16 new rows per head, S = Q K^T is a matrix-vector (or
thin matrix) product: each K/V element loaded is used for NR multiply-adds, about
NR / itemsize FLOP per byte, far below the H100's ridge (about 20 FLOP/byte for fp32 FMA,
300 for fp16 tensor cores): decoding is memory-bound and the time is the time to stream
K and V from HBM. Tensor-core mma tiles need 16 query rows (m16n8k16); at N_q = 1 that
wastes 15/16 of each product and buys nothing the memory system could feed. What
matters is that the K/V loads are wide (16 bytes a lane), coalesced (a group of LPR
lanes reads one whole row) and many (KPG rows per group in flight before any use).

Lane layout (compile-time): VW elements per lane, LPR = d / VW lanes per key row, NGRP =
NT / LPR row groups, TB = NGRP x KPG rows per tile. On a GPU, VW = 16 / itemsize
(8 fp16, 4 fp32) so each lane issues one 16-byte `ld.global.nc.v4` (inline PTX; the
fp16 halves converted with cvt.f32.f16) when the cache is 16-byte aligned and
d x itemsize is a multiple of 16; otherwise VW scalar loads. In the simulator (no warp
shuffles) LPR = 1: one thread per key row, a whole-row dot product, no shuffles.

Counting (count=True, compile-time): per-thread int64 counts of elements loaded / stored
per tensor, one atomic add each at the end into counters (len(COUNTED), 2), rows in
`COUNTED` order (iosim.decode's DECODE_ORDER); count=False compiles none of it.
"""
from __future__ import annotations

import math

from numba import cuda, float32, int32, int64

from iosim.decode import DECODE_ORDER
# the launch geometry (threads, lanes, tile rows, shared memory): iosim.launch.decode
from iosim.launch import decode as _geometry

from .._launch import (NAN, NEG_INF, READ, SIM, WRITE, ZERO, add_count, kernel_name,
                       lane_group_reducer, loader, specialisation, storer)

#: rows of the decode counters array (same names and order as iosim.decode's ledger)
COUNTED = DECODE_ORDER
C = {name: i for i, name in enumerate(COUNTED)}
#: largest O accumulator entries one thread keeps in registers (NR x d / NT)
MAX_ACC = _geometry.MAX_ACC
FULL = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------
# 16-byte loads (hardware only): inline PTX, since Numba cannot tell NVVM that a kernel
# argument is 16-byte aligned and so never emits vector global loads itself
# ---------------------------------------------------------------------------------------
def ld16_intrinsic(asm: str, n: int, word: str):
    """Intrinsic ld16(array, index) -> UniTuple(n values): the inline PTX `asm` (its
    outputs $0..$(n-1), the address $n) on &array[index], one ld.global.nc.v4 instruction
    for the 16 bytes there (16-byte aligned); word "f32" (float32 values) or "b32" (uint32
    words, left as loaded: gpu.decode.flat widens them later)."""
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.cache_hints import _get_element_pointer
    from numba.cuda.extending import intrinsic

    nb, ll, con = ((types.float32, ir.FloatType(), "=f") if word == "f32" else
                   (types.uint32, ir.IntType(32), "=r"))
    cons = ",".join([con] * n) + ",l"

    @intrinsic
    def ld16(typingctx, array, index):
        ret = types.UniTuple(nb, n)

        def codegen(context, builder, sig, args):
            arr_t, idx_t = sig.args
            ptr = _get_element_pointer(context, builder, idx_t, args[1], arr_t, args[0])
            st = ir.LiteralStructType([ll] * n)
            fn = ir.FunctionType(st, [ptr.type])
            res = builder.call(ir.InlineAsm(fn, asm, cons, side_effect=False), [ptr])
            vals = [builder.extract_value(res, i) for i in range(n)]
            return context.make_tuple(builder, ret, vals)

        return ret(array, index), codegen

    return ld16


def _make_ld16(n: int):
    """Intrinsic ld16(array, index) -> UniTuple(float32, n): the 16 bytes at
    &array[index] (n = 4: four float32; n = 8: eight float16 widened to float32) with one
    ld.global.nc.v4 instruction. The address must be 16-byte aligned."""
    if n == 4:
        asm = "ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];"
    else:
        asm = ("{\n.reg .b32 w<4>;\n.reg .b16 h<8>;\n"
               "ld.global.nc.v4.b32 {w0, w1, w2, w3}, [$8];\n"
               "mov.b32 {h0, h1}, w0;\nmov.b32 {h2, h3}, w1;\n"
               "mov.b32 {h4, h5}, w2;\nmov.b32 {h6, h7}, w3;\n"
               + "".join(f"cvt.f32.f16 ${i}, h{i};\n" for i in range(8)) + "}")
    return ld16_intrinsic(asm, n, "f32")


_LD16 = {} if SIM else {4: _make_ld16(4), 8: _make_ld16(8)}


# ---------------------------------------------------------------------------------------
# Pieces both main kernels (this tiled one and gpu.decode.flat) use
# ---------------------------------------------------------------------------------------
def row_loader(dt: str, VW: int, vec: bool):
    """Device function load_row(arr, i0, i1, i2, x0, dst, kk): dst[kk, :] = arr[i0, i1, i2,
    x0 : x0 + VW] as float32; one 16-byte load when vec (16-byte aligned), else VW loads."""
    ld16 = _LD16.get(VW) if vec else None
    ld = loader(dt)

    @cuda.jit(device=True, inline=True)
    def load_row(arr, i0, i1, i2, x0, dst, kk):
        if vec:
            t4 = ld16(arr, (i0, i1, i2, x0))
            for w in range(VW):
                dst[kk, w] = t4[w]
        else:
            for w in range(VW):
                dst[kk, w] = ld(arr[i0, i1, i2, x0 + w])
    return load_row


_IQ, _IK, _IV, _IO, _IL = C["Q"], C["K"], C["V"], C["O"], C["L"]
_IOP, _ILP, _IBT = C["Opart"], C["Lpart"], C["block_table"]


@cuda.jit(device=True, inline=True)
def flush_counts(counters, split, nQ, nK, nBT, nO, nL):
    """A main-kernel thread's counts into the counters: Q, K and V (nK each) and
    block-table elements read; O, L (S = 1) or Opart, Lpart (split) written."""
    add_count(counters, _IQ, READ, nQ)
    add_count(counters, _IK, READ, nK)
    add_count(counters, _IV, READ, nK)
    add_count(counters, _IBT, READ, nBT)
    add_count(counters, _IOP if split else _IO, WRITE, nO)
    add_count(counters, _ILP if split else _IL, WRITE, nL)


# ---------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------

def plan(d: int, dt: str, NR: int, vec_ok: bool = True, sim: bool = SIM,
         lanes_per_row: int | None = None) -> dict:
    """`iosim.launch.decode.plan` for this process's build (sim: Numba's simulator)."""
    return _geometry.plan(d, dt, NR, vec_ok, sim, lanes_per_row)


@specialisation
def decode_kernel(d, dt, N_q, NG, split, paged, causal, count, NT, VW, LPR, KPG, shfl, vec,
                  red=False):
    """Kernel(q, k, v, block_table, seqlens, o, L, opart, lpart, scale, H, G, P, counters).

    q, o: (batch, heads, N_q, d); k, v: (batch, kv_heads, N_alloc, d) contiguous, or
    (num_pages, P, kv_heads, d) paged through block_table (batch, pages) int32; seqlens:
    (batch,) int32 on the device, the rows the attention sees per sequence (after any
    append); L: (batch, heads, N_q) float32; opart (batch, heads, S, N_q, d), lpart
    (batch, heads, S, N_q) float32 (split only; 1-element dummies otherwise). scale
    float32; H query heads; G query heads per K/V head; P page rows (int64).
    S = gridDim.x; each block computes its sequence's chunk C_b = ceil(seqlens[b] / S)
    and a block with an empty chunk reads nothing (it writes O = 0, L = -inf, or its
    partial). The lengths (one int32 a block) are not counted, as no kernel argument is.
    Grid (S, batch x heads / NG), NT threads, plan()['smem_bytes'] dynamic shared bytes.
    red: group sums through shared memory (plan()['red']: the simulator's lane-group build).
    """
    NR = NG * N_q
    NGRP = NT // LPR
    TB = NGRP * KPG
    NW = NT // 32 if shfl else 1
    A = -(-NR * d // NT)
    ADIV = (NR * d) % NT == 0
    QO, VO = 0, NR * d
    SO = VO + TB * d
    MO = SO + NR * TB
    LO, AO = MO + NR, MO + 2 * NR
    RO = MO + 3 * NR                    # group-sum scratch (NT floats) without shuffles
    RED = bool(red)
    assert not (RED and shfl) and (RED or shfl or LPR == 1)
    IO, IL, IOP, ILP = C["O"], C["L"], C["Opart"], C["Lpart"]
    ld, st = loader(dt), storer(dt)     # element -> float32, float32 -> element
    lanes_sum = lane_group_reducer(LPR, "sum") if (shfl or LPR == 1) else None

    @cuda.jit(device=True, inline=True)
    def group_sum(x, sm, t):
        """Sum of x over the LPR lanes of a row group (all of them get it): warp shuffles,
        or (RED: the simulator's lane-group test build) shared memory and two barriers."""
        if RED:
            sm[RO + t] = x
            cuda.syncthreads()
            tot = ZERO
            for u in range(LPR):
                tot += sm[RO + (t // LPR) * LPR + u]
            cuda.syncthreads()
            return tot
        return lanes_sum(x)

    load_row = row_loader(dt, VW, vec)

    @cuda.jit(device=True, inline=True)
    def load_tile(k, v, b, g, phys, r0, cols, gi, x0, kreg, vreg):
        """This lane's slices of the tile's K and V rows c = gi + NGRP kk < cols (row r0 + c
        of page phys when paged, of sequence b's cache otherwise) -> registers; returns
        the K elements loaded (= V elements)."""
        n = 0
        for kk in range(KPG):
            c = gi + NGRP * kk
            if c < cols:
                if paged:
                    load_row(k, phys, r0 + c, g, x0, kreg, kk)
                    load_row(v, phys, r0 + c, g, x0, vreg, kk)
                else:
                    load_row(k, b, g, r0 + c, x0, kreg, kk)
                    load_row(v, b, g, r0 + c, x0, vreg, kk)
                n += VW
        return n

    def kernel(q, k, v, block_table, seqlens, o, L, opart, lpart, scale, H, G, P, counters):
        s = cuda.blockIdx.x
        y = cuda.blockIdx.y
        t = cuda.threadIdx.x
        S = cuda.gridDim.x
        gi = t // LPR                       # row group
        li = t % LPR                        # lane within the group
        x0 = li * VW                        # first head column of this lane
        rpb = H // NG                       # readers per sequence
        b = y // rpb
        h0 = (y % rpb) * NG                 # first query head served
        g = h0 // G                         # their K/V head
        sm = cuda.shared.array(0, float32)
        phys_s = cuda.shared.array(2, int32)
        kreg = cuda.local.array((KPG, VW), float32)
        vreg = cuda.local.array((KPG, VW), float32)
        acc = cuda.local.array(A, float32)
        nQ = int64(0)
        nK = int64(0)
        nO = int64(0)
        nL = int64(0)
        nBT = int64(0)
        N_kv = int64(seqlens[b])            # this sequence's rows (after any append)
        Cr = (N_kv + S - 1) // S            # its chunk, C_b = ceil(N_kv / S)
        a = s * Cr
        e = min(a + Cr, N_kv)
        if a >= e:
            # an empty chunk (short sequence, or N_kv = 0): read nothing, write the rows'
            # "no key" result, O (Opart) = 0 and L (Lpart) = -inf (weight 0 in the combine)
            for i in range(t, NR * d, NT):
                r = i // d
                if split:
                    opart[b, h0 + r // N_q, s, r % N_q, i % d] = ZERO
                else:
                    o[b, h0 + r // N_q, r % N_q, i % d] = st(ZERO)
                if count:
                    nO += 1
            for r in range(t, NR, NT):
                if split:
                    lpart[b, h0 + r // N_q, s, r % N_q] = NEG_INF
                else:
                    L[b, h0 + r // N_q, r % N_q] = NEG_INF
                if count:
                    nL += 1
            if count:
                add_count(counters, IOP if split else IO, WRITE, nO)
                add_count(counters, ILP if split else IL, WRITE, nL)
            return
        # ---- Q: NR rows -> shared (float32) ----
        for i in range(t, NR * d, NT):
            r = i // d
            Qv = q[b, h0 + r // N_q, r % N_q, i % d]
            sm[QO + i] = ld(Qv)
            if count:
                nQ += 1
        for r in range(t, NR, NT):
            sm[MO + r] = NEG_INF
            sm[LO + r] = ZERO
        for i in range(A):
            acc[i] = ZERO
        # ---- the tiles of the chunk, one after another (paged: tiles never cross a page);
        # tile (j, c0): rows c0 .. c0 + cols - 1 of segment j (page j, or the chunk) ----
        if paged:
            j = a // P
            hi = min(e, (j + 1) * P)
            if t == 0:                      # page j's entry lives in phys_s[j % 2]
                phys_s[j % 2] = block_table[b, j]
                if count:
                    nBT += 1
        else:
            j = 0
            hi = e
        c0 = a
        cuda.syncthreads()                  # Q and the first page's entry visible
        phys = phys_s[j % 2] if paged else 0
        # the first tile's K, V rows -> registers
        if count:
            nK += load_tile(k, v, b, g, phys, c0 - j * P, min(TB, hi - c0), gi, x0, kreg, vreg)
        else:
            load_tile(k, v, b, g, phys, c0 - j * P, min(TB, hi - c0), gi, x0, kreg, vreg)
        while c0 < hi:
            cols = min(TB, hi - c0)
            # the next tile: the rest of this segment, else the next page's part of the chunk
            nj = j
            nc0 = c0 + TB
            nhi = hi
            if nc0 >= hi and paged:
                nj = j + 1
                nc0 = nj * P
                nhi = min(e, (nj + 1) * P)
                if nc0 < e and t == 0:      # its block-table entry, read once
                    phys_s[nj % 2] = block_table[b, nj]
                    if count:
                        nBT += 1
            cuda.syncthreads()              # previous tile done with S, V; next entry visible
            nphys = phys
            if paged and nj != j and nc0 < e:
                nphys = phys_s[nj % 2]
            # ---- A: S = scale Q K^T from the registers; V -> shared ----
            for kk in range(KPG):
                c = gi + NGRP * kk
                for r in range(NR):
                    part = ZERO
                    if c < cols:
                        for w in range(VW):
                            part += sm[QO + r * d + x0 + w] * kreg[kk, w]
                    part = group_sum(part, sm, t)
                    if li == 0 and c < cols:
                        sv = part * scale
                        if causal and c0 + c > N_kv - N_q + r % N_q:
                            sv = NEG_INF
                        sm[SO + r * TB + c] = sv
                if c < cols:
                    for w in range(VW):
                        sm[VO + c * d + x0 + w] = vreg[kk, w]
            # the next tile's K, V rows -> the freed registers: in flight during B and C
            if nc0 < nhi:
                if count:
                    nK += load_tile(k, v, b, g, nphys, nc0 - nj * P, min(TB, nhi - nc0), gi,
                                    x0, kreg, vreg)
                else:
                    load_tile(k, v, b, g, nphys, nc0 - nj * P, min(TB, nhi - nc0), gi, x0,
                              kreg, vreg)
            cuda.syncthreads()
            # ---- B: online softmax statistics per row ----
            if shfl:
                wi = t // 32
                lane = t % 32
                for r in range(wi, NR, NW):
                    mx = NEG_INF
                    for c in range(lane, cols, 32):
                        mx = max(mx, sm[SO + r * TB + c])
                    for o2 in (16, 8, 4, 2, 1):
                        mx = max(mx, cuda.shfl_xor_sync(FULL, mx, o2))
                    m_old = sm[MO + r]
                    m_new = max(m_old, mx)
                    m_safe = m_new if m_new > NEG_INF else ZERO
                    ps = ZERO
                    for c in range(lane, cols, 32):
                        p = math.exp(sm[SO + r * TB + c] - m_safe)
                        sm[SO + r * TB + c] = p
                        ps += p
                    for o2 in (16, 8, 4, 2, 1):
                        ps += cuda.shfl_xor_sync(FULL, ps, o2)
                    if lane == 0:
                        alpha = math.exp(m_old - m_safe)
                        sm[LO + r] = alpha * sm[LO + r] + ps
                        sm[MO + r] = m_new
                        sm[AO + r] = alpha
            else:
                for r in range(t, NR, NT):
                    m_old = sm[MO + r]
                    m_new = m_old
                    for c in range(cols):
                        m_new = max(m_new, sm[SO + r * TB + c])
                    m_safe = m_new if m_new > NEG_INF else ZERO
                    ps = ZERO
                    for c in range(cols):
                        p = math.exp(sm[SO + r * TB + c] - m_safe)
                        sm[SO + r * TB + c] = p
                        ps += p
                    alpha = math.exp(m_old - m_safe)     # 0 while nothing was visible
                    sm[LO + r] = alpha * sm[LO + r] + ps
                    sm[MO + r] = m_new
                    sm[AO + r] = alpha
            cuda.syncthreads()
            # ---- C: acc = alpha acc + P V ----
            for i in range(A):
                ei = t + NT * i
                if ADIV or ei < NR * d:
                    r = ei // d
                    x = ei % d
                    av = acc[i] * sm[AO + r]
                    for c in range(cols):
                        av += sm[SO + r * TB + c] * sm[VO + c * d + x]
                    acc[i] = av
            j = nj
            c0 = nc0
            hi = nhi
            phys = nphys
        # ---- O (or Opart) = acc / l, L (or Lpart) = m + log l ----
        for i in range(A):
            ei = t + NT * i
            if ADIV or ei < NR * d:
                r = ei // d
                x = ei % d
                qr = r % N_q
                li_ = sm[LO + r]
                # l > 0 fails for l = NaN as well as l = 0: only a row that sees no key
                # of the chunk gets 0; one that sees a key and met a NaN gets NaN
                if li_ > ZERO:
                    val = acc[i] / li_
                elif (not causal) or a <= N_kv - N_q + qr:
                    val = NAN
                else:
                    val = ZERO
                if split:
                    opart[b, h0 + r // N_q, s, qr, x] = val
                else:
                    o[b, h0 + r // N_q, qr, x] = st(val)
                if count:
                    nO += 1
        for r in range(t, NR, NT):
            qr = r % N_q
            li_ = sm[LO + r]
            if li_ > ZERO:
                Lr = sm[MO + r] + math.log(li_)
            elif (not causal) or a <= N_kv - N_q + qr:
                Lr = NAN
            else:
                Lr = NEG_INF
            if split:
                lpart[b, h0 + r // N_q, s, qr] = Lr
            else:
                L[b, h0 + r // N_q, qr] = Lr
            if count:
                nL += 1
        if count:
            flush_counts(counters, split, nQ, nK, nBT, nO, nL)

    name = kernel_name("decode_splitkv" if split else "decode_fa2", d=d, dt=dt, nq=N_q,
                       ng=NG, paged=paged, causal=causal, count=count, t=NT, lpr=LPR,
                       kpg=KPG, vec=vec, red=red)
    return kernel, name


@specialisation
def combine_kernel(d, dt, N_q, count, NT):
    """Kernel(opart, lpart, o, L, S, H, counters): the split-KV combine, one block per
    (batch, query head) (grid batch x heads), NT = 32 NW threads and the dynamic shared
    bytes of iosim.launch.decode.combine_plan (which picks NW). For each row r < N_q:

        M = max_s Lpart[s]            every thread a share of the splits, then the block's
                                      max (a NaN stays NaN); each Lpart read once
        w_s = exp(Lpart[s] - M),  sum_s w_s   (the same shares; the block's sum)
        O = sum_s w_s Opart[s] / sum_s w_s,  L = M + log sum_s w_s
            warp w sums splits w, w + NW, .. (its lanes the columns: lane + 32 j), U
            splits' loads issued before their first use; then the NW warps' sums are
            added in shared memory. Each Opart element read once.

    A row no split saw (M = -inf): O = 0, L = -inf. Sums are float32; their order is
    by warp, then across warps (iosim.combine_partials sums in split order: the results
    agree to float32 rounding, not bit for bit)."""
    IO, IL, IOP, ILP = C["O"], C["L"], C["Opart"], C["Lpart"]
    st = storer(dt)                     # float32 -> element (bf16: rounded bits)
    NW = NT // 32
    U = _geometry.COMBINE_UNROLL
    XJ = (d + 31) // 32                 # columns a lane: lane + 32 j, j < XJ
    FULL = 0xFFFFFFFF
    shfl = not SIM                      # the simulator has no warp shuffles
    NWR = NW if shfl else 1             # slots block_reduce fills: a warp's, or thread 0's

    @cuda.jit(device=True, inline=True)
    def nanmax(x, y):                   # max that keeps a NaN from either side
        return y if (y > x or y != y) else x

    @cuda.jit(device=True, inline=True)
    def block_reduce(x, red, t, is_max):
        """x combined over the block's NT threads (every thread gets it); red: NW + NT
        words of shared memory, free on entry."""
        if shfl:
            for k in range(5):
                y = cuda.shfl_xor_sync(FULL, x, 16 >> k)
                x = nanmax(x, y) if is_max else x + y
            if t % 32 == 0:
                red[t // 32] = x
        else:                           # no shuffles: thread 0 adds all NT values
            red[NW + t] = x
            cuda.syncthreads()
            if t == 0:
                acc = red[NW]
                for i in range(1, NT):
                    acc = nanmax(acc, red[NW + i]) if is_max else acc + red[NW + i]
                red[0] = acc
        cuda.syncthreads()
        acc = red[0]
        for i in range(1, NWR):         # the warps' results (shuffles: one slot a warp)
            acc = nanmax(acc, red[i]) if is_max else acc + red[i]
        cuda.syncthreads()              # red is free again
        return acc

    def kernel(opart, lpart, o, L, S, H, counters):
        z = cuda.blockIdx.x
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        b = z // H
        h = z % H
        sm = cuda.shared.array(0, float32)
        SW = S * N_q                        # sm[s N_q + r] = w_s of row r; sm[SW + r] its sum
        PO = SW + N_q                       # sm[PO + w d + x]: warp w's sum for column x
        red = sm[PO + NW * d:]              # the block reductions' slots
        acc = cuda.local.array(XJ, float32)
        vals = cuda.local.array((U, XJ), float32)
        wts = cuda.local.array(U, float32)
        nOp = int64(0)
        nLp = int64(0)
        nO = int64(0)
        nL = int64(0)
        for r in range(N_q):
            M = NEG_INF
            for s in range(t, S, NT):
                x = lpart[b, h, s, r]
                sm[s * N_q + r] = x
                M = nanmax(M, x)
                if count:
                    nLp += 1
            M = block_reduce(M, red, t, True)
            none = M == NEG_INF             # every split saw nothing (no key at all)
            Ms = ZERO if none else M
            sw = ZERO
            for s in range(t, S, NT):
                wv = math.exp(sm[s * N_q + r] - Ms)
                sm[s * N_q + r] = wv
                sw += wv
            sw = block_reduce(sw, red, t, False)    # its syncs publish the weights too
            if t == 0:
                L[b, h, r] = NEG_INF if none else Ms + math.log(sw)
                if count:
                    nL += 1
            for j in range(XJ):
                acc[j] = ZERO
            s0 = w
            while s0 < S:
                for u in range(U):          # the loads of U splits first, all in flight ...
                    s = s0 + u * NW
                    if s < S:
                        wts[u] = sm[s * N_q + r]
                        for j in range(XJ):
                            x = lane + 32 * j
                            if x < d:
                                vals[u, j] = opart[b, h, s, r, x]
                                if count:
                                    nOp += 1
                    else:
                        wts[u] = ZERO
                        for j in range(XJ):
                            vals[u, j] = ZERO
                for u in range(U):          # ... then their sums
                    for j in range(XJ):
                        acc[j] += wts[u] * vals[u, j]
                s0 += U * NW
            for j in range(XJ):
                x = lane + 32 * j
                if x < d:
                    sm[PO + w * d + x] = acc[j]
            cuda.syncthreads()
            for x in range(t, d, NT):
                tot = ZERO
                for v in range(NW):
                    tot += sm[PO + v * d + x]
                o[b, h, r, x] = st(tot / sw if sw != ZERO else ZERO)
                if count:
                    nO += 1
            cuda.syncthreads()              # sm[PO ..] is free for the next row
        if count:
            add_count(counters, IOP, READ, nOp)
            add_count(counters, ILP, READ, nLp)
            add_count(counters, IO, WRITE, nO)
            add_count(counters, IL, WRITE, nL)

    return kernel, kernel_name("decode_combine", d=d, dt=dt, nq=N_q, count=count, t=NT)


__all__ = ["COUNTED", "C", "plan", "decode_kernel", "combine_kernel"]
