// Standard attention (Algorithm 0) on the tensor cores: the extern "C" entry points that
// gpu/forward/standard_tc.py links into its Numba kernels (gpu/mma.cuh is prepended by
// gpu/_tc.py), one set per (D, BC). Each thread block computes one tile product through HBM:
//     qk_smem : S_ij = Q_i K_j^T (also the backward's dP_ij = dO_i V_j^T), A and B from shared
//               (gpu/mma.cuh tc_qk_smem_t), 16 rows x BC per warp, fp32 accumulators
//     store_s : the warp's 16 x BC fp32 fragments -> fp16 rows in shared (tc_store_o_t<BC>)
//     ab      : O_i += P_ij V_j (also the backward's dQ_i += dS_ij K_j) with the fp16 operand
//               P_ij read from shared as A fragments (ldmatrix) and V_j as B (ldmatrix.trans):
//               gpu/mma.cuh tc_ab_smem_t<TA = false, ACC = true>
//     store_o : 16 x D fp32 fragments -> fp16 rows in shared (tc_store_o_t<D>)
//     cp16, st16, cp_commit, cp_wait1, cp_wait0: 16-byte copies and cp.async groups

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
        tc_ab_smem_t<false, true, BC, D, 1>(c, sm, aoff, astride, boff, bstride, 0); return 0;                      \
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
