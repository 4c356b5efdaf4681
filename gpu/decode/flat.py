"""Split-KV decoding, the streaming main kernel: every lane group runs its own online
softmax over its own key rows, with no barrier inside the key loop.

Same schedules, hence the same HBM traffic, as `iosim.decode` and `split_kv`'s tiled
kernel (fa2_decode when the grid has S = 1 split, split_kv when S > 1; contiguous or
paged cache; kv_reads "per_query_head" or "per_group"); the instrumented build
(count=True) counts every element it loads or stores. Only the work inside a block is
arranged differently:

    split_kv.decode_kernel (tiled)           this kernel (flat)
    A  groups form S = Q K^T -> shared       each group of LPR lanes forms its own scores
    B  warps: softmax statistics -> shared   and keeps its own m, l and O accumulator in
    C  threads: O += P V from shared         registers (FlashDecoding's split, one level
       3 barriers per tile of TB rows        down: the block's groups are its splits)
                                             no barrier per tile; one merge at the end

Why. Decoding streams K and V once and does about N_q G multiply-adds per element loaded:
the time is the time to move K and V, and that needs many bytes in flight on every SM
(bandwidth x latency: a few MB across an H100). A block of the tiled kernel waits at three
barriers per tile, so only one tile of loads per block is ever in flight. Here each lane
keeps two tiles of loads (KPG key rows of K and of V, 16 bytes a row a lane) in flight
while it computes on the previous two, with nothing to wait for but its own data. fp16
rows stay as loaded (four 32-bit words a lane) until `update` widens them: widened at
the load, the thread would wait for each load there (ptxas places the conversions right
after it), and no tile's loads would overlap the previous tile's arithmetic.

Grid (S, R) as in split_kv: blockIdx.x = split s, blockIdx.y = reader (b, first query
head h0) serving NR = NG x N_q query rows. Sequence b has N_kv = seqlens[b] rows (the
batch may be ragged); its split s covers rows [a, e) = [s C, min((s+1) C, N_kv)),
C = ceil(N_kv / S). A block with a < e:
    Q (NR x d) -> shared (each element read once), then each lane keeps its VW columns of
    every row, times the softmax scale, in registers.
    For each window of rows (contiguous cache: the whole chunk; paged: up to NPW pages,
    whose block-table entries are read once into shared memory first):
      tiles of TB = NGRP x KPG rows; lane group gi takes rows c = tile + gi + NGRP kk
      (kk < KPG: NGRP groups side by side read TB consecutive rows, coalesced);
      for every query row r: s_kk = group-sum of q_r . K_c (shuffles),
          masked to -inf where c >= e or (causal) c > N_kv - N_q + (r mod N_q),
          m_new = max(m, s), alpha = exp(m - m_new), p_kk = exp(s_kk - m_new),
          l = alpha l + sum p, acc = alpha acc + sum_kk p_kk V_c[my columns];
      the next tile's K/V loads are issued before this tile's arithmetic (two register
      buffers, A and B, used in turn).
    Merge (shared memory): M = max_g m_g, w_g = exp(m_g - M), l = sum w_g l_g,
    O = sum w_g acc_g / l, L = M + log l; write O and L (S = 1, problem dtype / float32)
    or Opart[s] and Lpart[s] (S > 1, float32; `split_kv.combine_kernel` then combines).
A block with a >= e (an empty split of a short sequence) reads nothing and writes its
rows as rows that saw no key: 0 and L = -inf. A row that sees a key and meets a NaN or
Inf gets NaN (l > 0 fails), as in the tiled kernel.

Lane layout (compile-time, `plan`): VW elements a lane, LPR = d / VW lanes a key row,
NGRP = NT / LPR groups, KPG rows a group per tile. On a GPU VW = 16 / itemsize, so one
`ld.global.nc.v4` loads a lane's slice of a row when the cache is 16-byte aligned (fp32:
split_kv's inline PTX; fp16 and bf16: `_make_ld16_words`, widened at use); unaligned
caches load element by element. In the simulator (no
shuffles) LPR = 1: a thread is a group and forms whole-row dot products.
"""
from __future__ import annotations

import math

from numba import cuda, float32, int32, int64, uint32

from iosim.launch import decode as _geometry

from .._launch import (NAN, NEG_INF, SIM, ZERO, kernel_name, lane_group_reducer, loader,
                       specialisation, storer)
from .split_kv import flush_counts, ld16_intrinsic, row_loader

# the layout (threads, lanes, rows a tile, shared memory): iosim.launch.decode.flat_plan
MAX_ROW_REGS = _geometry.MAX_ROW_REGS


# ---------------------------------------------------------------------------------------
# fp16 / bf16 rows kept as loaded (hardware only): a 16-byte load whose halves are
# widened to float32 at once makes the thread wait for the load right there, so the next
# tile's loads would not overlap this tile's arithmetic; the words are widened when used.
# ---------------------------------------------------------------------------------------
def _make_ld16_words():
    """(ld16w, {dtype: w2f}): ld16w(array, index) -> UniTuple(uint32, 4), the 16 bytes at
    &array[index] (eight fp16 or bf16) as four 32-bit words, one ld.global.nc.v4.b32
    (16-byte aligned); w2f(word) -> the word's two 16-bit floats as float32."""
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    ld16w = ld16_intrinsic("ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", 4, "b32")

    def widener(asm):
        @intrinsic
        def w2f(typingctx, word):
            """(float32, float32) of the word's low and high 16-bit float."""
            ret = types.UniTuple(types.float32, 2)

            def codegen(context, builder, sig, args):
                st = ir.LiteralStructType([ir.FloatType()] * 2)
                fn = ir.FunctionType(st, [ir.IntType(32)])
                res = builder.call(ir.InlineAsm(fn, asm, "=f,=f,r", side_effect=False),
                                   [args[0]])
                return context.make_tuple(builder, ret, [builder.extract_value(res, i)
                                                         for i in range(2)])

            return ret(word), codegen
        return w2f

    # fp16: convert each half; bf16: a bfloat16 is the top half of the float32 it widens to
    h2f = widener("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, $2;\n"
                  "cvt.f32.f16 $0, lo;\ncvt.f32.f16 $1, hi;\n}")
    b2f = widener("{\nshl.b32 $0, $2, 16;\nand.b32 $1, $2, 0xFFFF0000;\n}")
    return ld16w, {"fp16": h2f, "bf16": b2f}


_LD16W, _W2F = (None, {}) if SIM else _make_ld16_words()
#: block-table entries staged in shared memory per window (paged caches)
NPW = 256


def plan(d: int, dt: str, NR: int, *, vec_ok: bool = True, sim: bool = SIM,
         threads: int | None = None, rows_per_group: int | None = None) -> dict | None:
    """`iosim.launch.decode.flat_plan` for this process's build (sim: Numba's simulator):
    None where the flat kernel does not apply."""
    return _geometry.flat_plan(d, dt, NR, vec_ok=vec_ok, sim=sim, threads=threads,
                               rows_per_group=rows_per_group)


def group_merger(NR: int, N_q: int, d: int, NT: int, NSRC: int, RS: int, MOFF: int,
                 LOFF: int, causal: bool, split: bool, dt: str, base2: bool = False):
    """The end of a split-KV main kernel that runs NSRC online softmaxes side by side (the
    flat kernel's lane groups, the tensor-core kernel's warps): a device function
    merge(sm, t, a, e, N_kv, b, h0, s, o, L, opart, lpart) -> (O elements, L elements
    written) for thread t of NT. Source u's row r left its O accumulator at
    sm[(u RS + r) d ...], its running max at sm[MOFF + u RS + r] and its sum at
    sm[LOFF + u RS + r] (base2: the max in base 2, scores scaled by log2 e). Then
        M = max_u m_u, w_u = exp(m_u - M), l = sum_u w_u l_u, O = sum_u w_u O_u / l,
        L = M + log l (base 2: M ln 2 + log l),
    O and L (split False, O in dt) or Opart[s], Lpart[s] (float32) written. A row that
    saw a key of [a, e) but has no positive l (a NaN or Inf met it) gets NaN; one that saw
    none gets 0 and L = -inf."""
    st = storer(dt)
    SCALE = float32(math.log(2.0) if base2 else 1.0)

    if base2:
        @cuda.jit(device=True, inline=True)
        def ex(x):
            return math.exp2(x)
    else:
        @cuda.jit(device=True, inline=True)
        def ex(x):
            return math.exp(x)

    @cuda.jit(device=True, inline=True)
    def merge(sm, t, a, e, N_kv, b, h0, s, o, L, opart, lpart):
        nO = int64(0)
        nL = int64(0)
        for i in range(t, NR * d, NT):
            r = i // d
            x = i % d
            qr = r % N_q
            M = NEG_INF
            for u in range(NSRC):
                M = max(M, sm[MOFF + u * RS + r])
            Ms = M if M > NEG_INF else ZERO
            lt = ZERO
            ot = ZERO
            for u in range(NSRC):
                w_ = ex(sm[MOFF + u * RS + r] - Ms)
                lt += w_ * sm[LOFF + u * RS + r]
                ot += w_ * sm[(u * RS + r) * d + x]
            saw = a < e and ((not causal) or a <= N_kv - N_q + qr)
            # l > 0 fails for NaN as well as 0: a row that saw a key and met NaN gets NaN
            if lt > ZERO:
                val = ot / lt
            elif saw:
                val = NAN
            else:
                val = ZERO
            if split:
                opart[b, h0 + r // N_q, s, qr, x] = val
            else:
                o[b, h0 + r // N_q, qr, x] = st(val)
            nO += 1
            if x == 0:
                if lt > ZERO:
                    Lr = Ms * SCALE + math.log(lt)
                elif saw:
                    Lr = NAN
                else:
                    Lr = NEG_INF
                if split:
                    lpart[b, h0 + r // N_q, s, qr] = Lr
                else:
                    L[b, h0 + r // N_q, qr] = Lr
                nL += 1
        return nO, nL

    return merge


@specialisation
def flat_kernel(d, dt, N_q, NG, split, paged, causal, count, NT, VW, LPR, KPG, vec,
                defer=True):
    """Kernel(q, k, v, block_table, seqlens, o, L, opart, lpart, scale, H, G, P, counters).

    q, o: (batch, heads, N_q, d); k, v: (batch, kv_heads, N_alloc, d) contiguous, or
    (num_pages, P, kv_heads, d) pages through block_table (batch, pages) int32; seqlens
    (batch,) int32: the rows each sequence's queries attend to; L (batch, heads, N_q)
    float32; opart (batch, heads, S, N_q, d) and lpart (batch, heads, S, N_q) float32
    (S > 1; 1-element dummies otherwise). scale float32; H query heads, G query heads a
    K/V head, P page rows (int64). Grid (S, batch x heads / NG), NT threads,
    plan()['smem_bytes'] dynamic shared bytes. counters (len(COUNTED), 2) int64 when count.
    defer=False widens fp16 rows to float32 as they are loaded (the build before deferred
    widening; benchmarks/decode_flat_probe.py times both); bf16 rows are always widened
    at use.
    """
    NR = NG * N_q
    NGRP = NT // LPR
    TB = NGRP * KPG
    NBT = NPW if paged else 1           # block-table entries staged (paged caches only)
    GM = NGRP * NR * d                  # shared: [0, GM) group accumulators (Q first),
    GL = GM + NGRP * NR                 # [GM, GL) group maxima, [GL, GL + NGRP NR) sums
    ld = loader(dt)
    gsum = lane_group_reducer(LPR, "sum") if LPR > 1 else None
    merge = group_merger(NR, N_q, d, NT, NGRP, NR, GM, GL, causal, split, dt)

    @cuda.jit(device=True, inline=True)
    def group_sum(x):
        if LPR > 1:
            return gsum(x)
        return x

    # RAW: 16-bit K/V rows with 16-byte loads are kept as loaded (VW // 2 words of two
    # halves each) and widened in `update`, after the next tile's loads were issued (bf16
    # always: its only 16-byte load is this one)
    RAW = (bool(vec) and VW == 8 and not SIM
           and (dt == "bf16" or (dt == "fp16" and bool(defer))))
    BW = VW // 2 if RAW else VW             # buffer entries a row
    BUF = uint32 if RAW else float32
    ZB = uint32(0) if RAW else ZERO
    load_row = row_loader(dt, VW, vec)
    ld16w, h2f = _LD16W, _W2F.get(dt)

    if RAW:
        @cuda.jit(device=True, inline=True)
        def load_buf(arr, i0, i1, i2, x0, dst, kk):
            t4 = ld16w(arr, (i0, i1, i2, x0))
            for j in range(4):
                dst[kk, j] = t4[j]

        @cuda.jit(device=True, inline=True)
        def widen(src, dst):
            for kk in range(KPG):
                for j in range(4):
                    lo, hi = h2f(src[kk, j])
                    dst[kk, 2 * j] = lo
                    dst[kk, 2 * j + 1] = hi
    else:
        load_buf = load_row

        @cuda.jit(device=True, inline=True)
        def widen(src, dst):
            for kk in range(KPG):
                for w in range(VW):
                    dst[kk, w] = src[kk, w]

    @cuda.jit(device=True, inline=True)
    def load_tile(k, v, b, g, bt, p0, P, invP, c1, we, x0, kreg, vreg):
        """Rows c1 + NGRP kk (kk < KPG) below we -> kreg, vreg (zeros past we); returns
        the elements of K loaded (= of V)."""
        n = 0
        for kk in range(KPG):
            c = c1 + NGRP * kk
            if c < we:
                if paged:
                    rel = c - p0 * P
                    pg = int64(float32(rel) * invP)
                    if pg * P > rel:
                        pg -= 1
                    elif (pg + 1) * P <= rel:
                        pg += 1
                    phys = bt[pg]
                    load_buf(k, phys, rel - pg * P, g, x0, kreg, kk)
                    load_buf(v, phys, rel - pg * P, g, x0, vreg, kk)
                else:
                    load_buf(k, b, g, c, x0, kreg, kk)
                    load_buf(v, b, g, c, x0, vreg, kk)
                n += VW
            else:
                for w in range(BW):
                    kreg[kk, w] = ZB
                    vreg[kk, w] = ZB
        return n

    @cuda.jit(device=True, inline=True)
    def update(qreg, kbuf, vbuf, acc, mrow, lrow, sc, c1, we, N_kv):
        """Online softmax over this group's KPG rows c1 + NGRP kk for every query row."""
        kreg = cuda.local.array((KPG, VW), float32)
        vreg = cuda.local.array((KPG, VW), float32)
        widen(kbuf, kreg)
        widen(vbuf, vreg)
        for r in range(NR):
            mx = mrow[r]
            for kk in range(KPG):
                part = ZERO
                for w in range(VW):
                    part += qreg[r, w] * kreg[kk, w]
                part = group_sum(part)
                c = c1 + NGRP * kk
                if c >= we or (causal and c > N_kv - N_q + r % N_q):
                    part = NEG_INF
                sc[kk] = part
                mx = max(mx, part)
            m_safe = mx if mx > NEG_INF else ZERO
            alpha = math.exp(mrow[r] - m_safe)      # 0 while nothing was visible
            ps = ZERO
            for kk in range(KPG):
                p = math.exp(sc[kk] - m_safe)
                sc[kk] = p
                ps += p
            lrow[r] = alpha * lrow[r] + ps
            mrow[r] = mx
            for w in range(VW):
                av = acc[r, w] * alpha
                for kk in range(KPG):
                    av += sc[kk] * vreg[kk, w]
                acc[r, w] = av

    def kernel(q, k, v, block_table, seqlens, o, L, opart, lpart, scale, H, G, P, counters):
        s = cuda.blockIdx.x
        y = cuda.blockIdx.y
        t = cuda.threadIdx.x
        S = cuda.gridDim.x
        gi = t // LPR
        li = t % LPR
        x0 = li * VW
        rpb = H // NG
        b = y // rpb
        h0 = (y % rpb) * NG
        g = h0 // G
        N_kv = int64(seqlens[b])
        Cr = (N_kv + S - 1) // S
        a = s * Cr
        e = min(a + Cr, N_kv)
        sm = cuda.shared.array(0, float32)
        bt = cuda.shared.array(NBT, int32)
        qreg = cuda.local.array((NR, VW), float32)
        acc = cuda.local.array((NR, VW), float32)
        mrow = cuda.local.array(NR, float32)
        lrow = cuda.local.array(NR, float32)
        sc = cuda.local.array(KPG, float32)
        kA = cuda.local.array((KPG, BW), BUF)
        vA = cuda.local.array((KPG, BW), BUF)
        kB = cuda.local.array((KPG, BW), BUF)
        vB = cuda.local.array((KPG, BW), BUF)
        nQ = int64(0)
        nK = int64(0)
        nO = int64(0)
        nL = int64(0)
        nBT = int64(0)
        for r in range(NR):
            mrow[r] = NEG_INF
            lrow[r] = ZERO
            for w in range(VW):
                acc[r, w] = ZERO
        Pp = P if paged else int64(1)
        invP = float32(1.0) / float32(Pp)
        if a < e:                           # the same for every thread of the block
            for i in range(t, NR * d, NT):
                r = i // d
                sm[i] = ld(q[b, h0 + r // N_q, r % N_q, i % d])
                if count:
                    nQ += 1
            cuda.syncthreads()
            for r in range(NR):
                for w in range(VW):
                    qreg[r, w] = sm[r * d + x0 + w] * scale
            ws = a
            while ws < e:
                if paged:
                    p0 = ws // Pp
                    we = min(e, (p0 + NPW) * Pp)
                    npg = (we - 1) // Pp - p0 + 1
                    cuda.syncthreads()      # the previous window is done with bt
                    for i in range(t, npg, NT):
                        bt[i] = block_table[b, p0 + i]
                        if count:
                            nBT += 1
                    cuda.syncthreads()
                else:
                    p0 = int64(0)
                    we = e
                # tiles of TB rows from ws; buffers A and B in turn, the next tile's loads
                # issued before the current tile's arithmetic
                c1 = ws + gi
                n = load_tile(k, v, b, g, bt, p0, Pp, invP, c1, we, x0, kA, vA)
                if count:
                    nK += n
                tb = ws
                while tb < we:
                    n = load_tile(k, v, b, g, bt, p0, Pp, invP, c1 + TB, we, x0, kB, vB)
                    update(qreg, kA, vA, acc, mrow, lrow, sc, c1, we, N_kv)
                    if count:
                        nK += n
                    tb += TB
                    c1 += TB
                    if tb >= we:
                        break
                    n = load_tile(k, v, b, g, bt, p0, Pp, invP, c1 + TB, we, x0, kA, vA)
                    update(qreg, kB, vB, acc, mrow, lrow, sc, c1, we, N_kv)
                    if count:
                        nK += n
                    tb += TB
                    c1 += TB
                ws = we
        # ---- merge the NGRP groups' (m, l, acc) ----
        cuda.syncthreads()                  # Q's shared copy is dead
        for r in range(NR):
            for w in range(VW):
                sm[(gi * NR + r) * d + x0 + w] = acc[r, w]
            if li == 0:
                sm[GM + gi * NR + r] = mrow[r]
                sm[GL + gi * NR + r] = lrow[r]
        cuda.syncthreads()
        dO, dL = merge(sm, t, a, e, N_kv, b, h0, s, o, L, opart, lpart)
        nO += dO
        nL += dL
        if count:
            flush_counts(counters, split, nQ, nK, nBT, nO, nL)

    name = kernel_name("decode_flat_splitkv" if split else "decode_flat", d=d, dt=dt,
                       nq=N_q, ng=NG, paged=paged, causal=causal, count=count, t=NT,
                       lpr=LPR, kpg=KPG, vec=vec,
                       atload=bool(vec) and dt == "fp16" and not RAW)
    return kernel, name


__all__ = ["MAX_ROW_REGS", "NPW", "plan", "flat_kernel", "group_merger"]
