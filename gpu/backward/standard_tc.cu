// Standard attention backward (Algorithm 3) on the tensor cores: the extern "C" entry points
// of gpu/backward/standard_tc.py's column-block kernel (lines 1 and 5: dV_j = P^T dO,
// dK_j = scale dS^T Q), one set per (D, BR); gpu/mma.cuh is prepended by gpu/_tc.py. Lines 2
// and 4 (dP = dO V^T, dQ = scale dS K) are gpu/forward/standard_tc.py's kernels.
//     atb     : c += A B with A stored TRANSPOSED in shared (std_atb_t below)
//     store_o : 16 x D fp32 fragments -> fp16 rows in shared (tc_store_o_t<D>)
//     cp16, st16, cp_commit, cp_wait1, cp_wait0

// c (16 MT x D, ACCUMULATED) += A B, A = 16 MT rows x BR stored transposed in shared (A^T:
// BR rows x >= 16 MT columns, row stride `astride` halves, the warp's first column at word
// `aoff`), B = BR rows x D (stride `bstride`, first row at word `boff`). The accumulating
// form of gpu/mma.cuh's tc_dq_t (same ldmatrix.trans addressing of A, DN = D, n0 = 0): the
// backward's dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i read P_ij, dS_ij as stored in HBM,
// [query][key], so the key rows of A = P_ij^T are the stored tile's columns.
template <int D, int BR, int MT>
__device__ __forceinline__ void std_atb_t(float* c, const u32* sm, int aoff, int astride,
                                          int boff, int bstride) {
    const u32 lane = tc_lane();
    const u32 abase = tc_smem(sm + aoff) +
                      2u * (((lane & 7u) + 8u * ((lane >> 4) & 1u)) * astride +
                            8u * ((lane >> 3) & 1u));
    const u32 bbase = tc_smem(sm + boff) + 2u * ((lane & 15u) * bstride + 8u * (lane >> 4));
#pragma unroll
    for (int kt = 0; kt < BR / 16; ++kt) {
        u32 a[MT][4];
#pragma unroll
        for (int mq = 0; mq < MT; ++mq)
            tc_ldsm_x4_t(a[mq][0], a[mq][1], a[mq][2], a[mq][3],
                         abase + 2u * (16u * kt * astride + 16u * mq));
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            u32 b0, b1, b2, b3;
            tc_ldsm_x4_t(b0, b1, b2, b3, bbase + 2u * (16u * kt * bstride + 16u * np));
#pragma unroll
            for (int mq = 0; mq < MT; ++mq) {
                float* cc = c + mq * (D / 2) + 8 * np;
                tc_mma(cc, a[mq][0], a[mq][1], a[mq][2], a[mq][3], b0, b1);
                tc_mma(cc + 4, a[mq][0], a[mq][1], a[mq][2], a[mq][3], b2, b3);
            }
        }
    }
}

#define STDBWDTC_INSTANTIATE(D, BR)                                                             \
    extern "C" __device__ int stdbwdtc_atb_d##D##_br##BR(float* c, const u32* sm, int aoff,    \
                                                        int astride, int boff, int bstride) {   \
        std_atb_t<D, BR, 1>(c, sm, aoff, astride, boff, bstride); return 0;                     \
    }                                                                                           \
    extern "C" __device__ int stdbwdtc_store_o_d##D##_br##BR(u32* sm, int off, int stride,     \
                                                            const float* o) {                   \
        tc_store_o_t<D, 1>(sm, off, stride, o); return 0;                                       \
    }                                                                                           \
    extern "C" __device__ int stdbwdtc_cp16_d##D##_br##BR(u32* sm, int soff, const u32* g,     \
                                                         long long goff, int valid) {           \
        tc_cp16_t(sm, soff, g, goff, valid); return 0;                                          \
    }                                                                                           \
    extern "C" __device__ int stdbwdtc_st16_d##D##_br##BR(u32* g, long long goff,              \
                                                         const u32* sm, int soff) {             \
        tc_st16_t(g, goff, sm, soff); return 0;                                                 \
    }                                                                                           \
    extern "C" __device__ int stdbwdtc_cp_commit_d##D##_br##BR() {                              \
        asm volatile("cp.async.commit_group;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int stdbwdtc_cp_wait1_d##D##_br##BR() {                               \
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int stdbwdtc_cp_wait0_d##D##_br##BR() {                               \
        asm volatile("cp.async.wait_group 0;\n" ::: "memory"); return 0;                        \
    }
