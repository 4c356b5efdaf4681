// Standard attention backward (Algorithm 3) on the tensor cores: the extern "C" entry points
// of gpu/backward/standard_tc.py's column-block kernel (lines 1 and 5: dV_j = P^T dO,
// dK_j = scale dS^T Q), one set per (D, BR); gpu/mma.cuh is prepended by gpu/_tc.py. Lines 2
// and 4 (dP = dO V^T, dQ = scale dS K) are gpu/forward/standard_tc.py's kernels.
//     atb     : c += A B with A stored TRANSPOSED in shared (gpu/mma.cuh tc_ab_smem_t<TA = true,
//               ACC = true>: P_ij, dS_ij as stored in HBM, [query][key], so the key rows of
//               A = P_ij^T are the stored tile's columns)
//     store_o : 16 x D fp32 fragments -> fp16 rows in shared (tc_store_o_t<D>)
//     cp16, st16, cp_commit, cp_wait1, cp_wait0

#define STDBWDTC_INSTANTIATE(D, BR)                                                             \
    extern "C" __device__ int stdbwdtc_atb_d##D##_br##BR(float* c, const u32* sm, int aoff,    \
                                                        int astride, int boff, int bstride) {   \
        tc_ab_smem_t<true, true, BR, D, 1>(c, sm, aoff, astride, boff, bstride, 0); return 0;                     \
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
