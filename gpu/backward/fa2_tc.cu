// FlashAttention-2 backward on the tensor cores: the extern "C" entry points that
// gpu/backward/fa2_tc.py links into its Numba kernel, one set per (D, BC, BR, MT, DN, E). The tile
// products are the shared templates of gpu/mma.cuh (prepended by gpu/_tc.py). Warp w owns the
// 16 MT key rows 16 MT w .. of the resident K_j, V_j (the transposed view of FA2's backward:
// with keys as the fragments' rows, P^T and dS^T come out of the products in exactly the A
// layout that dV += P^T dO and dK += dS^T Q take, so neither leaves registers):
//     load_a  : A fragments of K_w or V_w (16 MT x D), once per block when they are held
//     qk      : S^T_w = K_w Q_i^T, dP^T_w = V_w dO_i^T (16 MT x BR), A in registers
//     qk_smem : the same with A read from shared at each k step (d = 128: no room to hold it)
//     pv      : dV_w += P^T_w dO_i, dK_w += dS^T_w Q_i (16 MT x D), P^T, dS^T rounded to fp16
//     store_s : dS^T_w -> fp16 rows of the block's dS^T tile in shared (BR wide)
//     store_o : dK_w, dV_w -> fp16 rows in shared (for the 16-byte stores)
//     dq      : 16 rows x DN columns (n0 ..) of dQ_i = dS K_j, dS^T read back
//               transposed by ldmatrix.trans
//     red2    : two float32 atomic adds into dQacc in one red.global.add.v2.f32
//     cp2, st2: one 16-bit element global <-> shared (head dims d % 8 != 0)
// D is the head dim rounded up to 16 (the kernel zero-fills the padded columns).
// E is the element type (tc_fp16 or tc_bf16, gpu/mma.cuh); SFX ends every name: empty for
// fp16 (the names the fp16 builds always had), _bf16 for bf16.
#define BWDTC_INSTANTIATE(D, BC, BR, MT, DN, E, SFX)                                                   \
    extern "C" __device__ int bwdtc_load_a_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(             \
        u32* af, const u32* sm, int off, int stride) {                                          \
        tc_load_q_t<D, MT>(af, sm, off, stride); return 0;                                      \
    }                                                                                           \
    extern "C" __device__ int bwdtc_qk_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(                 \
        float* s, const u32* af, const u32* sm, int off, int stride) {                          \
        tc_qk_t<D, BR, MT, E>(s, af, sm, off, stride); return 0;                                   \
    }                                                                                           \
    extern "C" __device__ int bwdtc_qk_smem_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(            \
        float* s, const u32* sm, int aoff, int astride, int boff, int bstride) {                \
        tc_qk_smem_t<D, BR, MT, E>(s, sm, aoff, astride, boff, bstride); return 0;                 \
    }                                                                                           \
    extern "C" __device__ int bwdtc_pv_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(                 \
        float* o, const float* p, const u32* sm, int off, int stride) {                         \
        tc_pv_t<D, BR, MT, E>(o, p, sm, off, stride); return 0;                                    \
    }                                                                                           \
    extern "C" __device__ int bwdtc_store_s_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(            \
        u32* sm, int off, int stride, const float* s) {                                         \
        tc_store_o_t<BR, MT, E>(sm, off, stride, s); return 0;                                     \
    }                                                                                           \
    extern "C" __device__ int bwdtc_store_o_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(            \
        u32* sm, int off, int stride, const float* o) {                                         \
        tc_store_o_t<D, MT, E>(sm, off, stride, o); return 0;                                      \
    }                                                                                           \
    extern "C" __device__ int bwdtc_dq_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(                 \
        float* c, const u32* sm, int aoff, int astride, int boff, int bstride, int n0) {        \
        tc_ab_smem_t<true, false, BC, DN, 1, E>(c, sm, aoff, astride, boff, bstride, n0); return 0;              \
    }                                                                                           \
    extern "C" __device__ int bwdtc_cp16_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(               \
        u32* sm, int soff, const u32* g, long long goff, int valid) {                           \
        tc_cp16_t(sm, soff, g, goff, valid); return 0;                                          \
    }                                                                                           \
    extern "C" __device__ int bwdtc_cp2_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(          \
        unsigned short* sm, int soff, const unsigned short* g, long long goff, int valid) {     \
        tc_cp2_t(sm, soff, g, goff, valid); return 0;                                           \
    }                                                                                           \
    extern "C" __device__ int bwdtc_st2_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(          \
        unsigned short* g, long long goff, const unsigned short* sm, int soff) {                \
        tc_st2_t(g, goff, sm, soff); return 0;                                                  \
    }                                                                                           \
    extern "C" __device__ int bwdtc_st16_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(               \
        u32* g, long long goff, const u32* sm, int soff) {                                      \
        tc_st16_t(g, goff, sm, soff); return 0;                                                 \
    }                                                                                           \
    extern "C" __device__ int bwdtc_red2_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX(               \
        float* g, long long off, float a, float b) {                                            \
        tc_red2_t(g, off, a, b); return 0;                                                      \
    }                                                                                           \
    extern "C" __device__ int bwdtc_cp_commit_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX() {       \
        asm volatile("cp.async.commit_group;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int bwdtc_cp_wait1_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX() {        \
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int bwdtc_cp_wait0_d##D##_bc##BC##_br##BR##_mt##MT##_dn##DN##SFX() {        \
        asm volatile("cp.async.wait_group 0;\n" ::: "memory"); return 0;                        \
    }
