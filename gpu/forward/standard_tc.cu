// Standard attention (Algorithm 0) on the tensor cores: the extern "C" entry points that
// gpu/forward/standard_tc.py links into its Numba kernels (gpu/mma.cuh is prepended by
// gpu/_tc.py), one set per (D, BC). Each thread block computes one tile product through HBM:
//     qk_smem : S_ij = Q_i K_j^T (also the backward's dP_ij = dO_i V_j^T), A and B from shared
//               (gpu/mma.cuh tc_qk_smem_t), 16 rows x BC per warp, fp32 accumulators
//     store_s : the warp's 16 x BC fp32 fragments -> fp16 rows in shared (tc_store_o_t<BC>)
//     ab      : O_i += P_ij V_j (also the backward's dQ_i += dS_ij K_j) with the fp16 operand
//               P_ij read from shared as A fragments (ldmatrix) and V_j as B (ldmatrix.trans):
//               std_ab_t below, the one template this file adds
//     store_o : 16 x D fp32 fragments -> fp16 rows in shared (tc_store_o_t<D>)
//     cp16, st16, cp_commit, cp_wait1, cp_wait0: 16-byte copies and cp.async groups

// c (16 MT x D, fragments c[mt * D/2 + nt * 4 + e], ACCUMULATED) += A B with A = 16 MT rows
// x BC fp16 stored row-major in shared (the warp's first row at word `aoff`, row stride
// `astride` halves) and B = BC rows x D fp16 in shared (first row at word `boff`, stride
// `bstride`). A's fragments as tc_load_q_t reads them (ldmatrix, one x4 per 16 x 16 block),
// B's as tc_pv_t (ldmatrix.trans). Unlike tc_pv_t, A comes from shared memory in fp16 (the
// standard algorithm's P_ij and dS_ij are HBM tensors, already in the input precision).
template <int D, int BC, int MT>
__device__ __forceinline__ void std_ab_t(float* c, const u32* sm, int aoff, int astride,
                                         int boff, int bstride) {
    const u32 lane = tc_lane();
    const u32 abase = tc_smem(sm + aoff) + 2u * ((lane & 15u) * astride + 8u * (lane >> 4));
    const u32 bbase = tc_smem(sm + boff) + 2u * ((lane & 15u) * bstride + 8u * (lane >> 4));
#pragma unroll
    for (int kt = 0; kt < BC / 16; ++kt) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            tc_ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                       abase + 2u * (16u * mt * astride + 16u * kt));
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            u32 b0, b1, b2, b3;
            tc_ldsm_x4_t(b0, b1, b2, b3, bbase + 2u * (16u * kt * bstride + 16u * np));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float* cc = c + mt * (D / 2) + 8 * np;
                tc_mma(cc, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                tc_mma(cc + 4, a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
            }
        }
    }
}

#define STDTC_INSTANTIATE(D, BC)                                                                \
    extern "C" __device__ int stdtc_qk_smem_d##D##_bc##BC(float* s, const u32* sm, int aoff,   \
                                                         int astride, int boff, int bstride) { \
        tc_qk_smem_t<D, BC, 1>(s, sm, aoff, astride, boff, bstride); return 0;                  \
    }                                                                                           \
    extern "C" __device__ int stdtc_store_s_d##D##_bc##BC(u32* sm, int off, int stride,        \
                                                         const float* s) {                      \
        tc_store_o_t<BC, 1>(sm, off, stride, s); return 0;                                      \
    }                                                                                           \
    extern "C" __device__ int stdtc_ab_d##D##_bc##BC(float* c, const u32* sm, int aoff,        \
                                                    int astride, int boff, int bstride) {       \
        std_ab_t<D, BC, 1>(c, sm, aoff, astride, boff, bstride); return 0;                      \
    }                                                                                           \
    extern "C" __device__ int stdtc_store_o_d##D##_bc##BC(u32* sm, int off, int stride,        \
                                                         const float* o) {                      \
        tc_store_o_t<D, 1>(sm, off, stride, o); return 0;                                       \
    }                                                                                           \
    extern "C" __device__ int stdtc_cp16_d##D##_bc##BC(u32* sm, int soff, const u32* g,        \
                                                      long long goff, int valid) {              \
        tc_cp16_t(sm, soff, g, goff, valid); return 0;                                          \
    }                                                                                           \
    extern "C" __device__ int stdtc_st16_d##D##_bc##BC(u32* g, long long goff, const u32* sm,  \
                                                      int soff) {                               \
        tc_st16_t(g, goff, sm, soff); return 0;                                                 \
    }                                                                                           \
    extern "C" __device__ int stdtc_cp_commit_d##D##_bc##BC() {                                 \
        asm volatile("cp.async.commit_group;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int stdtc_cp_wait1_d##D##_bc##BC() {                                  \
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int stdtc_cp_wait0_d##D##_bc##BC() {                                  \
        asm volatile("cp.async.wait_group 0;\n" ::: "memory"); return 0;                        \
    }
