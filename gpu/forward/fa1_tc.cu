// FlashAttention (Algorithm 1 as written) forward on the tensor cores: the extern "C" entry
// points that gpu/forward/fa1_tc.py links into its Numba kernel, one set per (D, BC, MT, E):
// E the element type (tc_fp16 or tc_bf16, gpu/mma.cuh), SFX the names' ending (empty for
// fp16, as the fp16 builds always had; _bf16 for bf16).
// The tile products are the shared templates of gpu/mma.cuh (prepended by gpu/_tc.py);
// this file adds what Algorithm 1 needs beyond FlashAttention-2's kernel:
//     fa1tc_load_o_t : the old O_i (16-bit rows in shared memory, read back from HBM at
//                      step 8) -> fp32 accumulator fragments (the inverse of tc_store_o_t)
//     fa1tc_cp4_t    : one 4-byte asynchronous global -> shared copy (l_i, m_i: float32
//                      rows, not 16-byte aligned in general)
//     fa1tc_zero16_t : 16 zero bytes to global memory (step 2: O = 0)
// One warp computes, for its 16 MT query rows of Q_i and the block's K_j, V_j:
//     qk     : S_w = Q_w K_j^T (A and B from shared memory: Q_i changes every step)
//     pv     : O_w += P_w V_j (P rounded to E), onto the rescaled old O_w
//     store_o: O_w -> E rows in shared memory, then 16-byte stores to HBM (st16)
//
// Every name carries the sizes, so each kernel links exactly one instantiation. Not
// `inline`: link-time optimisation inlines them into the kernel. They return 0.

// o[mt * D/2 + nt * 4 + e] = the E rows (fp16 or bf16) at word `off` of `sm` (row stride
// `stride` elements) in the C-fragment layout of gpu/mma.cuh: rows 16 mt + g (+ 8), columns
// 8 nt + 2q, +1. Each thread reads exactly the words tc_store_o_t later writes for it.
template <int D, int MT, class E>
__device__ __forceinline__ void fa1tc_load_o_t(float* o, const u32* sm, int off, int stride) {
    const u32 lane = tc_lane();
    const u32 g = lane >> 2, q = lane & 3u;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const u32 a0 = tc_smem(sm + off + (16 * mt + g) * (stride / 2) + q);
        const u32 a8 = a0 + 4u * 8u * (stride / 2);
        float* om = o + mt * (D / 2);
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            u32 r0, r8;
            asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(r0) : "r"(a0 + 16u * nt) : "memory");
            asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(r8) : "r"(a8 + 16u * nt) : "memory");
            tc_unpack_t<E>(r0, om[4 * nt], om[4 * nt + 1]);
            tc_unpack_t<E>(r8, om[4 * nt + 2], om[4 * nt + 3]);
        }
    }
}

// Asynchronous 4-byte global -> shared copy (cp.async.ca: sizes below 16 must use .ca);
// valid = 0 writes 4 zero bytes instead (rows past N).
__device__ __forceinline__ void fa1tc_cp4_t(u32* sm, int soff, const u32* g, long long goff,
                                            int valid) {
    const u32 dst = tc_smem(sm + soff);
    unsigned long long src;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(src) : "l"(g + (valid ? goff : 0)));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// 16 zero bytes at g + goff (4-byte words; 16-byte aligned).
__device__ __forceinline__ void fa1tc_zero16_t(u32* g, long long goff) {
    unsigned long long dst;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(dst) : "l"(g + goff));
    asm volatile("st.global.v4.u32 [%0], {%1, %1, %1, %1};\n" :: "l"(dst), "r"(0u) : "memory");
}

#define FA1TC_INSTANTIATE(D, BC, MT, E, SFX)                                                          \
    extern "C" __device__ int fa1tc_qk_d##D##_bc##BC##_mt##MT##SFX(float* s, const u32* sm,          \
                                                     int aoff, int astride, int boff,           \
                                                     int bstride) {                             \
        tc_qk_smem_t<D, BC, MT, E>(s, sm, aoff, astride, boff, bstride); return 0;                 \
    }                                                                                           \
    extern "C" __device__ int fa1tc_pv_d##D##_bc##BC##_mt##MT##SFX(float* o, const float* p,         \
                                                     const u32* sm, int off, int stride) {      \
        tc_pv_t<D, BC, MT, E>(o, p, sm, off, stride); return 0;                                    \
    }                                                                                           \
    extern "C" __device__ int fa1tc_load_o_d##D##_bc##BC##_mt##MT##SFX(float* o, const u32* sm,      \
                                                         int off, int stride) {                 \
        fa1tc_load_o_t<D, MT, E>(o, sm, off, stride); return 0;                                    \
    }                                                                                           \
    extern "C" __device__ int fa1tc_store_o_d##D##_bc##BC##_mt##MT##SFX(u32* sm, int off, int stride, \
                                                          const float* o) {                     \
        tc_store_o_t<D, MT, E>(sm, off, stride, o); return 0;                                      \
    }                                                                                           \
    extern "C" __device__ int fa1tc_cp16_d##D##_bc##BC##_mt##MT##SFX(u32* sm, int soff, const u32* g, \
                                                       long long goff, int valid) {             \
        tc_cp16_t(sm, soff, g, goff, valid); return 0;                                          \
    }                                                                                           \
    extern "C" __device__ int fa1tc_cp4_d##D##_bc##BC##_mt##MT##SFX(u32* sm, int soff, const u32* g,  \
                                                      long long goff, int valid) {              \
        fa1tc_cp4_t(sm, soff, g, goff, valid); return 0;                                        \
    }                                                                                           \
    extern "C" __device__ int fa1tc_st16_d##D##_bc##BC##_mt##MT##SFX(u32* g, long long goff,         \
                                                       const u32* sm, int soff) {               \
        tc_st16_t(g, goff, sm, soff); return 0;                                                 \
    }                                                                                           \
    extern "C" __device__ int fa1tc_zero16_d##D##_bc##BC##_mt##MT##SFX(u32* g, long long goff) {     \
        fa1tc_zero16_t(g, goff); return 0;                                                      \
    }                                                                                           \
    extern "C" __device__ int fa1tc_cp_commit_d##D##_bc##BC##_mt##MT##SFX() {                        \
        asm volatile("cp.async.commit_group;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int fa1tc_cp_wait1_d##D##_bc##BC##_mt##MT##SFX() {                         \
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int fa1tc_cp_wait0_d##D##_bc##BC##_mt##MT##SFX() {                         \
        asm volatile("cp.async.wait_group 0;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int fa1tc_cp_wait2_d##D##_bc##BC##_mt##MT##SFX() {                         \
        asm volatile("cp.async.wait_group 2;\n" ::: "memory"); return 0;                        \
    }
