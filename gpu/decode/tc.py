"""Split-KV decoding on the tensor cores: a K/V head's query group as the rows of one mma
tile, K and V streamed through each warp's own cp.async pipeline.

Same schedules, hence the same HBM traffic and the same counts, as `flat` and `split_kv`
(fa2_decode when the grid has S = 1 split, split_kv when S > 1; contiguous or paged cache;
ragged lengths). What differs is where the arithmetic runs:

    flat (CUDA cores)                         this kernel (tensor cores)
    every K/V element loaded into registers   K_j, V_j copied global -> shared by cp.async
    serves NR query rows: NR multiply-adds    (no registers); S = Q K_j^T and O += P V_j
    for S, NR for P V, a shuffle reduction    are mma.sync m16n8k16 on a 16 x B_c tile:
    per row and key                           the NR = G x N_q rows fill the M side

Why. Measured on the H100 (Nsight Compute, d = 128, fp16): the flat kernel moves MHA's K/V
at 92 % of DRAM peak, but on grouped heads (G = 4 or 8 rows a block) its warps issue on
about two cycles in three and reach 57 % (GQA) and 35 % (MQA): every element loaded costs G
multiply-adds and a share of a shuffle chain per row. On the tensor cores a 16-key tile
costs 2 d / 16 mma for S and d / 8 for P V whatever G is (up to 16 rows), so the warps are
free to keep loads in flight.

Grid (S, R) as in split_kv: blockIdx.x = split s, blockIdx.y = reader (b, first query head
h0) serving NR = NG x N_q query rows; row r is head h0 + r // N_q, query r % N_q. Sequence
b has N_kv = seqlens[b] rows; split s covers rows [a, e) = [s C, min((s+1) C, N_kv)),
C = ceil(N_kv / S). A block with a < e:
    Q (NR x d, zero rows NR .. 15) -> shared by cp.async (each element read once); each
    warp takes the A fragments of the 16 x d tile (ldmatrix), once.
    For each window of rows (contiguous cache: the whole chunk; paged: up to NPW pages,
    whose block-table entries are read once into shared memory first, as flat does):
      tiles of B_c rows from the window's start; warp w takes tiles w, w + NW, w + 2 NW ..
      (the block's warps read neighbouring tiles at once). Each warp keeps STG - 1 tiles'
      copies in flight (its own STG K and V buffers in shared memory, a cp.async group a
      tile) while it computes on the oldest:
          S = Q K_j^T (fp32), scaled to base 2 (scale log2 e), masked to -inf where
          c >= the window's end or (causal) c > N_kv - N_q + (r mod N_q);
          m_new = max(m, rowmax S), P = exp2(S - m_new), l = exp2(m - m_new) l + rowsum P,
          O = exp2(m - m_new) O + P V_j (P rounded to the input dtype, as FA2's P~ V).
    Merge (shared memory, over the NW warps, as flat merges its lane groups):
    M = max_w m_w, u_w = exp2(m_w - M), l = sum u_w l_w, O = sum u_w O_w / l,
    L = M ln 2 + log l; write O and L (S = 1, problem dtype / float32) or Opart[s] and
    Lpart[s] (S > 1, float32; split_kv.combine_kernel then combines).
A block with a >= e reads nothing and writes rows that saw no key: 0 and L = -inf; a row
that sees a key and meets a NaN or Inf gets NaN, as in the other kernels.

Paper names: B_c = BC key rows a tile (block_keys); the block's query tile is B_r = 16
rows of which NR are real; m, l, O per row as in Algorithm 1 of FlashAttention-2.
Layout (compile time, iosim.launch.decode.tc_plan): NW warps, BC, STG; fp16 and bf16;
d a multiple of 16 up to 128; NR <= 16; 16-byte aligned caches. Shared memory (4-byte
words): the 16 x (d + 8) Q tile, then per warp STG K tiles and STG V tiles of BC x (d + 8)
elements; after the loop the same space holds the warps' O, m and l for the merge.

The CUDA simulator cannot run linked C++: without a GPU this kernel is built and linked
(`linked_ptx`) but not run; the tests marked `gpu` run it.
"""
from __future__ import annotations

import functools
import math
import os

from numba import cuda, float32, int32, int64, uint32

from iosim.launch import decode as _geometry

from .. import _tc
from .._launch import NEG_INF, SIM, ZERO, kernel_name, specialisation
from .flat import NPW, group_merger
from .split_kv import flush_counts

CU_PATH = os.path.join(os.path.dirname(__file__), "tc.cu")
LOG2E = math.log2(math.e)


def plan(d: int, dt: str, NR: int, *, vec_ok: bool = True, sim: bool = SIM,
         warps: int | None = None, block_keys: int | None = None,
         stages: int | None = None) -> dict | None:
    """`iosim.launch.decode.tc_plan` for this process's build (None in the simulator)."""
    return _geometry.tc_plan(d, dt, NR, vec_ok=vec_ok, sim=sim, warps=warps,
                             block_keys=block_keys, stages=stages)


@functools.lru_cache(maxsize=None)
def externs(d: int, BC: int, dt: str) -> dict:
    """The C++ functions of gpu/decode/tc.cu for (d, BC, dt), declared to Numba (C ABI,
    each returns int 0; offsets in 4-byte words, strides in 16-bit elements)."""
    from numba.cuda import types as nb
    pu, pf, i32, i64 = nb.CPointer(nb.uint32), nb.CPointer(nb.float32), nb.int32, nb.int64
    sigs = dict(load_q=i32(pu, pu, i32, i32), qk=i32(pf, pu, pu, i32, i32),
                pv=i32(pf, pf, pu, i32, i32), cp16=i32(pu, i32, pu, i64, i32),
                cp_commit=i32(), cp_wait0=i32(), cp_wait1=i32(), cp_wait2=i32(),
                cp_wait3=i32())
    elem, sfx = _tc.ELEMENTS[dt]
    src = _tc.source(CU_PATH, f"DECTC_INSTANTIATE({d}, {BC}, {elem}, {sfx})")
    return _tc.declare(src, f"decode_tc_d{d}_bc{BC}{sfx}.cu", "dectc_", f"_d{d}_bc{BC}{sfx}",
                       sigs)


ptr, ptr32 = _tc.ptr, _tc.ptr32


@specialisation
def tc_kernel(d, dt, N_q, NG, split, paged, causal, count, NW, BC, STG):
    """Kernel(q, k, v, block_table, seqlens, o, L, opart, lpart, scale, H, G, P, counters),
    the argument order of flat.flat_kernel and split_kv.decode_kernel (see there): q, o
    (batch, heads, N_q, d); k, v contiguous (batch, kv_heads, N_alloc, d) or pages
    (num_pages, P, kv_heads, d); fp16 as float16 arrays, bf16 as uint16 arrays of the
    bits, q, k and v 16-byte aligned. Grid (S, batch x heads / NG), 32 NW threads,
    tc_plan(...)['smem_bytes'] dynamic shared bytes."""
    NR = NG * N_q
    NT = 32 * NW
    SH = d + 8                    # shared row stride, elements
    SW = SH // 2                  # ... in 4-byte words
    DW = d // 2                   # words a row in global memory
    CPR = d // 8                  # 16-byte chunks a row
    QC = 16 * CPR                 # chunks of the Q tile (rows NR .. 15: zeros)
    TC_ = BC * CPR                # chunks of one K (or V) tile
    LT = TC_ // 32                # ... a lane (BC CPR is a multiple of 32: BC >= 16, d >= 16)
    KO = 16 * SW                  # first word of warp 0's buffers
    WB = 2 * STG * BC * SW        # words of one warp's K and V buffers
    TW = BC * SW                  # words of one tile
    MM = NW * 16 * d              # merge: [0, MM) O rows, [MM, ML) m, [ML, ML + NW 16) l
    ML = MM + NW * 16
    NTS, NTO = BC // 8, d // 8    # 8-column fragments of S and of O
    NSF, NOF, NQF = BC // 2, d // 2, d // 4
    FULL = 0xFFFFFFFF
    LOG2E_ = float32(LOG2E)
    NBT = NPW if paged else 1
    merge = group_merger(NR, N_q, d, NT, NW, 16, MM, ML, causal, split, dt, base2=True)
    X = externs(d, BC, dt)
    load_q, qk, pv, cp16 = X["load_q"], X["qk"], X["pv"], X["cp16"]
    cp_commit, cp_wait0 = X["cp_commit"], X["cp_wait0"]
    cp_wait = X[f"cp_wait{STG - 1}"]    # tile i landed: at most STG - 1 younger groups remain

    @cuda.jit(device=True, inline=True)
    def issue(smp, kp, vp, bt, base, Hk, g, p0, P, invP, c0, we, lane, buf, wo):
        """Start this lane's copies of K and V rows c0 .. c0 + BC - 1 into buffer `buf` of
        its warp (rows at or past we: zeros, not loaded); returns the elements of K it
        requested (= of V). base: the word offset of this (b, g)'s rows (contiguous)."""
        n = int64(0)
        for it in range(LT):
            ch = lane + 32 * it
            rr = ch // CPR
            x = (ch % CPR) * 4
            c = c0 + rr
            ok = c < we
            if paged:
                rel = c - p0 * P
                pg = int64(float32(rel) * invP)
                if pg * P > rel:
                    pg -= 1
                elif (pg + 1) * P <= rel:
                    pg += 1
                if ok:
                    phys = int64(bt[pg])
                else:
                    phys = int64(0)
                goff = ((phys * P + rel - pg * P) * Hk + g) * DW + x
            else:
                goff = base + c * DW + x
            so = wo + buf * TW + rr * SW + x
            cp16(smp, so, kp, goff, ok)
            cp16(smp, so + STG * TW, vp, goff, ok)
            if ok:
                n += 8
        return n

    @cuda.jit(device=True, inline=True)
    def softmax(s, oa, m2, l2, c0, we, N_kv, g, qd, scale2):
        """S -> S scale log2 e (masked -inf), m_new, P = exp2(S - m_new) in place,
        l = exp2(m - m_new) l + rowsum P (this lane's columns), O *= exp2(m - m_new), for
        rows g and g + 8."""
        edge = c0 + BC > we or (causal and c0 + BC - 1 > N_kv - N_q)
        for hh in range(2):
            row = g + 8 * hh
            mx = NEG_INF
            for nt in range(NTS):
                for u in range(2):
                    e = 4 * nt + 2 * hh + u
                    sv = s[e] * scale2
                    if edge:
                        col = c0 + 8 * nt + 2 * qd + u
                        if col >= we or (causal and col > N_kv - N_q + row % N_q):
                            sv = NEG_INF
                    s[e] = sv
                    mx = max(mx, sv)
            mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 1))    # the 4 lanes of a row
            mx = max(mx, cuda.shfl_xor_sync(FULL, mx, 2))
            m_new = max(m2[hh], mx)
            m_safe = m_new if m_new > NEG_INF else ZERO
            alpha = math.exp2(m2[hh] - m_safe)                # 0 while nothing was visible
            m2[hh] = m_new
            ps = ZERO
            for nt in range(NTS):
                for u in range(2):
                    e = 4 * nt + 2 * hh + u
                    p = math.exp2(s[e] - m_safe)
                    s[e] = p
                    ps += p
            l2[hh] = l2[hh] * alpha + ps
            for nt in range(NTO):
                oa[4 * nt + 2 * hh] *= alpha
                oa[4 * nt + 2 * hh + 1] *= alpha

    def kernel(q, k, v, block_table, seqlens, o, L, opart, lpart, scale, H, G, P, counters):
        s_ = cuda.blockIdx.x
        y = cuda.blockIdx.y
        t = cuda.threadIdx.x
        S = cuda.gridDim.x
        lane = t & 31
        w = t >> 5
        gq = lane >> 2                      # fragment row (and gq + 8)
        qd = lane & 3                       # fragment column pair 2 qd, 2 qd + 1
        rpb = H // NG                       # the grid as split_kv's and flat's
        b = y // rpb
        h0 = (y % rpb) * NG
        g = h0 // G
        N_kv = int64(seqlens[b])
        Cr = (N_kv + S - 1) // S
        a = s_ * Cr
        e = min(a + Cr, N_kv)
        sm = cuda.shared.array(0, uint32, alignment=16)
        smf = cuda.shared.array(0, float32, alignment=16)
        bt = cuda.shared.array(NBT, int32)
        smp = ptr(sm)
        kp = ptr32(k)
        vp = ptr32(v)
        qf = cuda.local.array(NQF, uint32)
        sf = cuda.local.array(NSF, float32)
        oa = cuda.local.array(NOF, float32)
        m2 = cuda.local.array(2, float32)
        l2 = cuda.local.array(2, float32)
        nQ = int64(0)
        nK = int64(0)
        nO = int64(0)
        nL = int64(0)
        nBT = int64(0)
        for hh in range(2):
            m2[hh] = NEG_INF
            l2[hh] = ZERO
        for i in range(NOF):
            oa[i] = ZERO
        Pp = P if paged else int64(1)
        invP = float32(1.0) / float32(Pp)
        Hk = int64(k.shape[2]) if paged else int64(k.shape[1])
        base = (int64(b) * Hk + g) * int64(k.shape[2]) * DW     # contiguous: (b, g)'s row 0
        scale2 = float32(scale) * LOG2E_
        wo = KO + w * WB
        if a < e:                           # the same for every thread of the block
            qp = ptr32(q)
            qbase = (int64(b) * H + h0) * N_q * DW
            for ch in range(t, QC, NT):
                r = ch // CPR
                x = (ch % CPR) * 4
                ok = r < NR
                cp16(smp, r * SW + x, qp, qbase + r * DW + x, ok)
                if count and ok:
                    nQ += 8
            cp_commit()
            cp_wait0()
            cuda.syncthreads()
            load_q(ptr(qf), smp, 0, SH)
            ws = a
            while ws < e:
                if paged:
                    p0 = ws // Pp
                    we = min(e, (p0 + NPW) * Pp)
                    npg = (we - 1) // Pp - p0 + 1
                    cuda.syncthreads()      # every warp is done with the previous window
                    for i in range(t, npg, NT):
                        bt[i] = block_table[b, p0 + i]
                        if count:
                            nBT += 1
                    cuda.syncthreads()
                else:
                    p0 = int64(0)
                    we = e
                # this warp's tiles: c0 = ws + BC (w + NW i), i = 0, 1, ..; STG - 1 ahead
                for i in range(STG - 1):
                    c0 = ws + BC * (w + NW * i)
                    if c0 < we:
                        nK += issue(smp, kp, vp, bt, base, Hk, g, p0, Pp, invP, c0, we,
                                    lane, i, wo)
                    cp_commit()
                i = 0
                c0 = ws + BC * w
                while c0 < we:
                    cn = c0 + BC * NW * (STG - 1)
                    if cn < we:
                        nK += issue(smp, kp, vp, bt, base, Hk, g, p0, Pp, invP, cn, we,
                                    lane, (i + STG - 1) % STG, wo)
                    cp_commit()
                    cp_wait()               # tile i has landed (this lane's copies) ...
                    cuda.syncwarp()         # ... and the warp's
                    buf = wo + (i % STG) * TW
                    qk(ptr(sf), ptr(qf), smp, buf, SH)
                    softmax(sf, oa, m2, l2, c0, we, N_kv, gq, qd, scale2)
                    pv(ptr(oa), ptr(sf), smp, buf + STG * TW, SH)
                    cuda.syncwarp()         # done with buffer i % STG before it is refilled
                    i += 1
                    c0 += BC * NW
                cp_wait0()
                ws = we
        # ---- merge the NW warps' (m, l, O) ----
        for hh in range(2):
            ls = l2[hh]
            ls += cuda.shfl_xor_sync(FULL, ls, 1)
            ls += cuda.shfl_xor_sync(FULL, ls, 2)
            l2[hh] = ls
        cuda.syncthreads()                  # the tiles' shared memory is dead
        for hh in range(2):
            row = gq + 8 * hh
            if row < NR:
                for nt in range(NTO):
                    for u in range(2):
                        smf[(w * 16 + row) * d + 8 * nt + 2 * qd + u] = oa[4 * nt + 2 * hh + u]
                if qd == 0:
                    smf[MM + w * 16 + row] = m2[hh]
                    smf[ML + w * 16 + row] = l2[hh]
        cuda.syncthreads()
        dO, dL = merge(smf, t, a, e, N_kv, b, h0, s_, o, L, opart, lpart)
        nO += dO
        nL += dL
        if count:
            flush_counts(counters, split, nQ, nK, nBT, nO, nL)

    name = kernel_name("decode_tc_splitkv" if split else "decode_tc", d=d, dt=dt, nq=N_q,
                       ng=NG, paged=paged, causal=causal, count=count, w=NW, bc=BC, stg=STG)
    return kernel, name


def signature(dt: str, split: bool, paged: bool):
    """Argument types of the kernel (for compiling without a GPU)."""
    from numba.cuda import types as nb
    W4 = _tc.array_type(dt, 4)
    f4, f5 = nb.Array(nb.float32, 4, "C"), nb.Array(nb.float32, 5, "C")
    f3 = nb.Array(nb.float32, 3, "C")
    return (W4, W4, W4, nb.Array(nb.int32, 2, "C"), nb.Array(nb.int32, 1, "C"), W4, f3,
            f5, f4, nb.float32, nb.int64, nb.int64, nb.int64, nb.Array(nb.int64, 2, "C"))


def linked_ptx(d, dt="fp16", N_q=1, NG=4, split=True, paged=False, causal=True, count=False,
               NW=None, BC=None, STG=None, cc=(9, 0)) -> str:
    """The PTX of one specialisation after link-time optimisation with its C++ functions,
    built without a GPU (gpu._tc.linked_ptx): for inspection, and for ptxas -v."""
    lay = _geometry.tc_plan(d, dt, NG * N_q, warps=NW, block_keys=BC, stages=STG)
    if lay is None:
        raise ValueError(f"the tensor-core decode kernel does not take d={d}, {dt}, "
                         f"{NG * N_q} rows a block")
    kern = tc_kernel(d, dt, N_q, NG, split, paged, causal, count, lay["NW"], lay["BC"],
                     lay["STG"])
    return _tc.linked_ptx(kern, signature(dt, split, paged), cc)


__all__ = ["plan", "externs", "tc_kernel", "signature", "linked_ptx"]
