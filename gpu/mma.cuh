// Warp-level tile products on the tensor cores (fp16 or bf16 in, fp32 accumulate): the CUDA C++ that
// every tensor-core kernel of flashsim links into its Numba kernel (gpu/_tc.py prepends this
// file to the kernel's own .cu: gpu/forward/fa2_tc.cu, gpu/backward/fa2_tc.cu).
//
// No header is included: NVRTC on the lent H100 has no <mma.h>, so the tensor cores are reached
// through inline PTX (mma.sync, ldmatrix, cp.async), which needs none. With link-time
// optimisation (nvJitLink, Numba's default when it is installed) the extern "C" entry points
// that a kernel's .cu instantiates are inlined into the Numba kernel, so the fragment arrays it
// passes by pointer stay in registers.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16", f16 A/B, f32 C/D), with
// lane = 4 g + q (g = lane / 4 in 0..7, q = lane % 4 in 0..3):
//     C (16 x 8 fp32), c[0..3]: c0, c1 at row g,     columns 2q, 2q + 1
//                               c2, c3 at row g + 8, columns 2q, 2q + 1
//     A (16 x 16 fp16), 4 regs of 2 halves: a0 row g cols 2q..2q+1, a1 row g+8 same cols,
//                               a2 row g cols 8+2q.., a3 row g+8 cols 8+2q..
//     B (16 x 8 fp16, k x n), 2 regs: b0 = B[2q..2q+1][g], b1 = B[8+2q..8+2q+1][g]
// A warp's C fragments of an R x C product (R = 16 MT rows), c[mt * C/2 + nt * 4 + e] for
// column tile nt (8 columns), hold X[16 mt + g + 8 (e >= 2)][8 nt + 2 q + (e & 1)].
// Because two neighbouring C fragments (column tiles 2kt, 2kt + 1) are exactly the A fragment
// of a 16-wide k step, a product's result can feed the next product from registers (FA2's P
// between S = Q K^T and O += P V; the backward's P^T and dS^T).
//
// Shared-memory tiles are fp16, row-major, with a row stride of `stride` halves = width + 8:
// the 16-byte row segments that one ldmatrix phase reads (8 rows) then fall in 8 distinct
// groups of 4 banks (stride = 16 bytes mod 128 for widths that are multiples of 64), so no
// ldmatrix is bank-conflicted.
//
// The templates (sizes are template parameters; MT = m-tiles of 16 rows per warp; E = the
// element type, tc_fp16 (default) or tc_bf16: see tc_mma_t):
//     tc_load_q_t<D, MT>       A fragments of the warp's 16 MT x D rows (ldmatrix)
//     tc_qk_t<D, BC, MT, E>    c = A B^T, A in registers, B = BC rows x D in shared (16 MT x BC)
//     tc_pv_t<D, BC, MT, E>    c += P B, P = fp32 C fragments (16 MT x BC) rounded to E,
//                              B = BC rows x D in shared (ldmatrix.trans)
//     tc_store_o_t<D, MT, E>   C fragments (16 MT x D) -> E rows in shared
//     tc_pack_t<E>, tc_unpack_t<E>  two fp32 <-> one register of two E values
//     tc_qk_smem_t<D, BC, MT, E>  as tc_qk_t with A read from shared at each k step
//     tc_ab_smem_t<TA, ACC, K, N, MT, E>  c (+)= A B, A (row-major or stored transposed) and
//                              B both E in shared (dQ = dS K_j; standard's P V, P^T dO)
//     tc_cp16_t, tc_st16_t     16-byte global <-> shared copies (cp.async; vector store)
//     tc_cp2_t, tc_st2_t       one 16-bit element global <-> shared (head dims d % 8 != 0)
//     tc_red2_t                two float32 atomic adds in one vector reduction (sm_90)
// Head dims that are not a multiple of 16 run these at D = d rounded up to 16, the padded
// columns of the shared tiles zero (the kernels' business: gpu/forward/fa2_tc.py).

typedef unsigned int u32;

__device__ __forceinline__ u32 tc_lane() {
    u32 lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

// Generic pointer into shared memory (what Numba's arrays hold) -> shared-window address.
__device__ __forceinline__ u32 tc_smem(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8x8 fp16 matrices; lanes 8i .. 8i+7 give the row addresses of matrix i, and lane
// 4g + q receives (row g, columns 2q, 2q+1) of matrix i in r[i] (.trans: row 2q, 2q+1 of
// column g, i.e. the transposed matrix). "memory": must not move across the barriers
// that the Numba kernel places around the tile loads.
__device__ __forceinline__ void tc_ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void tc_ldsm_x4_t(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// The 16-bit element type E of the operands: tc_fp16 (IEEE half) or tc_bf16 (bfloat16).
// Both share every layout above (ldmatrix and cp.async move bits, whatever they hold); they
// differ only in the mma instruction's operand type and in the rounding of fp32 pairs to
// 16-bit pairs, the two specialised functions below. Every tile product takes E as its last
// template parameter (default tc_fp16).
struct tc_fp16 {};
struct tc_bf16 {};

// c (16 x 8 fp32) += A (16 x 16, E) B (16 x 8, E) on the tensor cores.
template <class E>
__device__ __forceinline__ void tc_mma_t(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1);
// One specialisation per element type; TY is its PTX name in the mma instruction.
#define TC_MMA_SPECIALISATION(E, TY)                                                            \
    template <>                                                                                 \
    __device__ __forceinline__ void tc_mma_t<E>(float* c, u32 a0, u32 a1, u32 a2, u32 a3,       \
                                                u32 b0, u32 b1) {                               \
        asm("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 "                          \
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                 \
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                    \
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                            \
    }
TC_MMA_SPECIALISATION(tc_fp16, "f16")
TC_MMA_SPECIALISATION(tc_bf16, "bf16")

// Two fp32 -> one register of two E values (round to nearest even); `lo` is the element with
// the lower column index (the low 16 bits). cvt.rn.{f16x2,bf16x2}.f32 d, a, b puts a in the
// upper half.
template <class E>
__device__ __forceinline__ u32 tc_pack_t(float lo, float hi);
template <>
__device__ __forceinline__ u32 tc_pack_t<tc_fp16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <>
__device__ __forceinline__ u32 tc_pack_t<tc_bf16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One register of two E values (low half = lower column) -> two fp32 (exact): the inverse
// of tc_pack_t. bf16 is the upper half of an fp32, so its conversion is a shift.
template <class E>
__device__ __forceinline__ void tc_unpack_t(u32 r, float& lo, float& hi);
template <>
__device__ __forceinline__ void tc_unpack_t<tc_fp16>(u32 r, float& lo, float& hi) {
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(lo), "=f"(hi) : "r"(r));
}
template <>
__device__ __forceinline__ void tc_unpack_t<tc_bf16>(u32 r, float& lo, float& hi) {
    asm("{ shl.b32 %0, %2, 16; and.b32 %1, %2, 0xFFFF0000; }" : "=f"(lo), "=f"(hi) : "r"(r));
}

// Asynchronous global -> shared copy of 16 bytes (8 halves), bypassing registers and L1
// (cp.async.cg, sm_80+); src_bytes = 0 writes 16 zero bytes instead (rows past N).
// `g + goff` (4-byte words) must be 16-byte aligned, as must `sm + soff`.
__device__ __forceinline__ void tc_cp16_t(u32* sm, int soff, const u32* g, long long goff,
                                             int valid) {
    const u32 dst = tc_smem(sm + soff);
    unsigned long long src;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(src) : "l"(g + (valid ? goff : 0)));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// 16 bytes (8 halves of O) from shared memory to global memory, one vector load and one
// vector store (the O_i write-back; both addresses 16-byte aligned).
__device__ __forceinline__ void tc_st16_t(u32* g, long long goff, const u32* sm, int soff) {
    u32 a, b, c, d;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(tc_smem(sm + soff)) : "memory");
    unsigned long long dst;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(dst) : "l"(g + goff));
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n"
                 :: "l"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// One 16-bit element from global to shared memory through a register (plain loads), 0 when
// !valid; offsets in 16-bit elements. For head dims d that are not a multiple of 8: their
// rows are not 16-byte aligned in global memory, so cp.async cannot move them in 16-byte
// pieces (nor, for odd d, in 4-byte ones).
__device__ __forceinline__ void tc_cp2_t(unsigned short* sm, int soff, const unsigned short* g,
                                         long long goff, int valid) {
    unsigned short v = 0;
    if (valid) {   // not volatile: the inputs are read-only, so loads may be batched early
        unsigned long long src;
        asm("cvta.to.global.u64 %0, %1;" : "=l"(src) : "l"(g + goff));
        asm("ld.global.nc.u16 %0, [%1];\n" : "=h"(v) : "l"(src));
    }
    asm volatile("st.shared.u16 [%0], %1;\n" :: "r"(tc_smem(sm + soff)), "h"(v) : "memory");
}

// One 16-bit element from shared to global memory (the O_i write-back when d is not a multiple
// of 8); offsets in 16-bit elements.
__device__ __forceinline__ void tc_st2_t(unsigned short* g, long long goff,
                                         const unsigned short* sm, int soff) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(tc_smem(sm + soff)) : "memory");
    unsigned long long dst;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(dst) : "l"(g + goff));
    asm volatile("st.global.u16 [%0], %1;\n" :: "l"(dst), "h"(v) : "memory");
}

// A warp owns MT m-tiles of 16 query rows (16 MT rows): each K or V fragment it loads from
// shared memory feeds MT products, so shared-memory traffic per mma falls by MT. Fragment
// arrays hold the m-tiles one after another: qf[mt * D/4 + ...], s[mt * BC/2 + ...],
// o[mt * D/2 + ...].

// qf[mt * D/4 + 4 kt + i], kt < D/16: the A fragments of the warp's rows of Q (rows start at
// word `off` of `sm`). Matrix i of k step kt: rows 16 mt + 8 (i & 1) .. +7, columns
// 16 kt + 8 (i >> 1).
template <int D, int MT>
__device__ __forceinline__ void tc_load_q_t(u32* qf, const u32* sm, int off, int stride) {
    const u32 lane = tc_lane();
    const u32 base = tc_smem(sm + off) + 2u * ((lane & 15u) * stride + 8u * (lane >> 4));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kt = 0; kt < D / 16; ++kt) {
            u32* a = qf + mt * (D / 4) + 4 * kt;
            tc_ldsm_x4(a[0], a[1], a[2], a[3], base + 2u * (16u * mt * stride + 16u * kt));
        }
}

// s = Q_w K_j^T: s[mt * BC/2 + nt * 4 + e], nt < BC/8 (overwritten). K_j rows start at word
// `off`. One ldmatrix.x4 gives the B fragments of two key tiles (2np, 2np + 1) at k step kt:
// matrix 0: keys 16 np + 0..7, dims 16 kt + 0..7 (b0 of 2np); 1: same keys, dims + 8 (b1);
// 2, 3: keys 16 np + 8..15 (tile 2np + 1). Lane address: key (lane & 7) + 8 (lane >> 4),
// dim 8 ((lane >> 3) & 1).
template <int D, int BC, int MT, class E = tc_fp16>
__device__ __forceinline__ void tc_qk_t(float* s, const u32* qf, const u32* sm, int off,
                                           int stride) {
    const u32 lane = tc_lane();
    const u32 base = tc_smem(sm + off) +
                     2u * (((lane & 7u) + 8u * (lane >> 4)) * stride + 8u * ((lane >> 3) & 1u));
#pragma unroll
    for (int i = 0; i < MT * BC / 2; ++i) s[i] = 0.0f;
#pragma unroll
    for (int np = 0; np < BC / 16; ++np) {
#pragma unroll
        for (int kt = 0; kt < D / 16; ++kt) {
            u32 b0, b1, b2, b3;
            tc_ldsm_x4(b0, b1, b2, b3, base + 2u * (16u * np * stride + 16u * kt));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const u32* a = qf + mt * (D / 4) + 4 * kt;
                float* c = s + mt * (BC / 2) + 8 * np;
                tc_mma_t<E>(c, a[0], a[1], a[2], a[3], b0, b1);
                tc_mma_t<E>(c + 4, a[0], a[1], a[2], a[3], b2, b3);
            }
        }
    }
}

// o += P_w V_j: o[mt * D/2 + nt * 4 + e], nt < D/8; p as s from tc_qk_t (fp32, rounded
// to fp16 here: P~ enters the product in the input precision, as in FlashAttention-2). V_j
// rows start at word `off`. One ldmatrix.x4.trans gives the B fragments of two head-column
// tiles (2np, 2np + 1) at key step kt: matrix 0: keys 16 kt + 0..7, dims 16 np + 0..7 (b0);
// 1: keys + 8 (b1); 2, 3: dims + 8. Lane address: key lane & 15, dim 8 (lane >> 4).
template <int D, int BC, int MT, class E = tc_fp16>
__device__ __forceinline__ void tc_pv_t(float* o, const float* p, const u32* sm, int off,
                                           int stride) {
    const u32 lane = tc_lane();
    const u32 base = tc_smem(sm + off) + 2u * ((lane & 15u) * stride + 8u * (lane >> 4));
#pragma unroll
    for (int kt = 0; kt < BC / 16; ++kt) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float* p0 = p + mt * (BC / 2) + 8 * kt;   // key tile 2 kt: cols 16 kt + 2q..
            const float* p1 = p0 + 4;                        // key tile 2 kt + 1
            a[mt][0] = tc_pack_t<E>(p0[0], p0[1]);
            a[mt][1] = tc_pack_t<E>(p0[2], p0[3]);
            a[mt][2] = tc_pack_t<E>(p1[0], p1[1]);
            a[mt][3] = tc_pack_t<E>(p1[2], p1[3]);
        }
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            u32 b0, b1, b2, b3;
            tc_ldsm_x4_t(b0, b1, b2, b3, base + 2u * (16u * kt * stride + 16u * np));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float* c = o + mt * (D / 2) + 8 * np;
                tc_mma_t<E>(c, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                tc_mma_t<E>(c + 4, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
            }
        }
    }
}

// O_w (fragments o, already divided by l) -> fp16 rows in shared memory starting at word
// `off` (row r of the warp at word off + r * stride / 2).
template <int D, int MT, class E = tc_fp16>
__device__ __forceinline__ void tc_store_o_t(u32* sm, int off, int stride, const float* o) {
    const u32 lane = tc_lane();
    const u32 g = lane >> 2, q = lane & 3u;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        u32* row0 = sm + off + (16 * mt + g) * (stride / 2) + q;
        u32* row8 = row0 + 8 * (stride / 2);
        const float* om = o + mt * (D / 2);
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            row0[4 * nt] = tc_pack_t<E>(om[4 * nt], om[4 * nt + 1]);
            row8[4 * nt] = tc_pack_t<E>(om[4 * nt + 2], om[4 * nt + 3]);
        }
    }
}

// extern "C" entry points for one (D, BC, MT); every name carries the sizes, so each kernel
// links exactly one instantiation. Not `inline`: an inline function that this file does
// not call would not be emitted at all; link-time optimisation inlines them into the
// kernel. They return 0 (Numba's C-ABI call wants a value).

// c = A B^T with A read from shared memory at each k step (not held in registers): A = the
// warp's 16 MT rows x D at word `aoff` (stride `astride` halves), B = BC rows x D at word
// `boff` (stride `bstride`). Same result and layout as tc_qk_t; for kernels whose resident
// operand would not fit in registers (the backward's K_j, V_j at d = 128).
template <int D, int BC, int MT, class E = tc_fp16>
__device__ __forceinline__ void tc_qk_smem_t(float* s, const u32* sm, int aoff, int astride,
                                             int boff, int bstride) {
    const u32 lane = tc_lane();
    const u32 abase = tc_smem(sm + aoff) + 2u * ((lane & 15u) * astride + 8u * (lane >> 4));
    const u32 bbase = tc_smem(sm + boff) +
                      2u * (((lane & 7u) + 8u * (lane >> 4)) * bstride + 8u * ((lane >> 3) & 1u));
#pragma unroll
    for (int i = 0; i < MT * BC / 2; ++i) s[i] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            tc_ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                       abase + 2u * (16u * mt * astride + 16u * kt));
#pragma unroll
        for (int np = 0; np < BC / 16; ++np) {
            u32 b0, b1, b2, b3;
            tc_ldsm_x4(b0, b1, b2, b3, bbase + 2u * (16u * np * bstride + 16u * kt));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float* c = s + mt * (BC / 2) + 8 * np;
                tc_mma_t<E>(c, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                tc_mma_t<E>(c + 4, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
            }
        }
    }
}

// c = A B (ACC: c += A B) for columns n0 .. n0 + N - 1 of B, both operands fp16 in shared
// memory: A is 16 MT rows x K, B is K rows x >= n0 + N columns (row stride `bstride` halves,
// first row at word `boff`), read by ldmatrix.trans as tc_pv_t reads V. A is stored
//   TA = false: row-major (the warp's first row at word `aoff`, stride `astride`): ldmatrix,
//               as tc_load_q_t (the standard algorithm's O += P V, dQ += dS K, P and dS
//               being HBM tensors already in the input precision);
//   TA = true:  TRANSPOSED (A^T: K rows x >= 16 MT columns, the warp's first column at word
//               `aoff`): ldmatrix.trans, matrix i of k step kt at stored rows 16 kt +
//               (lane & 7) + 8 ((lane >> 4) & 1), columns 16 mt + 8 ((lane >> 3) & 1), so
//               a0..a3 = (rows g, k 2q..), (g + 8, 2q..), (g, 8 + 2q..), (g + 8, 8 + 2q..) as
//               the A layout wants (fa2's dQ_i = dS K_j from the dS^T the key-row warps
//               wrote; standard's dV += P^T dO, dK += dS^T Q from P, dS as stored).
// c[mt * N/2 + nt * 4 + e] as every C fragment here.
template <bool TA, bool ACC, int K, int N, int MT, class E = tc_fp16>
__device__ __forceinline__ void tc_ab_smem_t(float* c, const u32* sm, int aoff, int astride,
                                             int boff, int bstride, int n0) {
    const u32 lane = tc_lane();
    const u32 abase = TA ? tc_smem(sm + aoff) +
                               2u * (((lane & 7u) + 8u * ((lane >> 4) & 1u)) * astride +
                                     8u * ((lane >> 3) & 1u))
                         : tc_smem(sm + aoff) + 2u * ((lane & 15u) * astride + 8u * (lane >> 4));
    const u32 bbase = tc_smem(sm + boff) + 2u * ((lane & 15u) * bstride + 8u * (lane >> 4) + n0);
    if (!ACC) {
#pragma unroll
        for (int i = 0; i < MT * N / 2; ++i) c[i] = 0.0f;
    }
#pragma unroll
    for (int kt = 0; kt < K / 16; ++kt) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if (TA)
                tc_ldsm_x4_t(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                             abase + 2u * (16u * kt * astride + 16u * mt));
            else
                tc_ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                           abase + 2u * (16u * mt * astride + 16u * kt));
        }
#pragma unroll
        for (int np = 0; np < N / 16; ++np) {
            u32 b0, b1, b2, b3;
            tc_ldsm_x4_t(b0, b1, b2, b3, bbase + 2u * (16u * kt * bstride + 16u * np));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float* cc = c + mt * (N / 2) + 8 * np;
                tc_mma_t<E>(cc, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                tc_mma_t<E>(cc + 4, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
            }
        }
    }
}

// g[off] += a, g[off + 1] += b as one vector reduction in global memory (red.global.add.v2.f32,
// sm_90): half the atomic instructions of two scalar adds. `g + off` must be 8-byte aligned.
// (The L2 still performs one read-modify-write per float: the ledger counts two of each.)
__device__ __forceinline__ void tc_red2_t(float* g, long long off, float a, float b) {
    unsigned long long p;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(p) : "l"(g + off));
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" :: "l"(p), "f"(a), "f"(b) : "memory");
}
