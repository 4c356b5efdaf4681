// FlashAttention-2 forward on the tensor cores: the extern "C" entry points that
// gpu/forward/fa2_tc.py links into its Numba kernel, one set per (D, BC, MT, E). The tile products
// themselves are the shared templates of gpu/mma.cuh (prepended by gpu/_tc.py). One warp
// computes, for its 16 MT query rows of Q_i (paper: one 16 MT-row slice of the B_r x d block),
//     load_q : the A fragments of Q_w (16 MT x D)              (read once per block)
//     qk     : S_w = Q_w K_j^T  (16 MT x BC), fp32 accumulators (Algorithm 1 line 9)
//     qk_smem: the same with Q_w read from shared at each k step (D > 128: Q_w's fragments
//              do not fit in registers beside O_w's accumulators)
//     pv     : O_w += P_w V_j  (16 MT x D), P rounded to E     (line 12's P~ V_j)
//     store_o: O_w (fp32 fragments, already divided by l) -> E rows in shared
//     cp16, st16 / cp2, st2: global <-> shared copies of 16 bytes (d % 8 == 0) / of one
//              element (other d)
// E is the element type (tc_fp16 or tc_bf16, gpu/mma.cuh); D is the head dim rounded up to
// 16 (the kernel zero-fills the padded columns). SFX ends every name: empty for fp16 (the
// names the fp16 builds always had), _bf16 for bf16.
// P never leaves registers between S = Q K^T and O += P V (FA2, Sec. 3.1).
//
// Every name carries the sizes, so each kernel links exactly one instantiation. Not `inline`:
// an inline function that this file does not call would not be emitted at all; link-time
// optimisation inlines them into the kernel. They return 0 (Numba's C-ABI call wants a value).

#define FA2TC_INSTANTIATE(D, BC, MT, E, SFX)                                                    \
    extern "C" __device__ int fa2tc_load_q_d##D##_bc##BC##_mt##MT##SFX(u32* qf, const u32* sm,  \
                                                         int off, int stride) {                 \
        tc_load_q_t<D, MT>(qf, sm, off, stride); return 0;                                      \
    }                                                                                           \
    extern "C" __device__ int fa2tc_qk_d##D##_bc##BC##_mt##MT##SFX(float* s, const u32* qf,     \
                                                     const u32* sm, int off, int stride) {      \
        tc_qk_t<D, BC, MT, E>(s, qf, sm, off, stride); return 0;                                \
    }                                                                                           \
    extern "C" __device__ int fa2tc_qk_smem_d##D##_bc##BC##_mt##MT##SFX(                        \
        float* s, const u32* sm, int aoff, int astride, int boff, int bstride) {                \
        tc_qk_smem_t<D, BC, MT, E>(s, sm, aoff, astride, boff, bstride); return 0;              \
    }                                                                                           \
    extern "C" __device__ int fa2tc_pv_d##D##_bc##BC##_mt##MT##SFX(float* o, const float* p,    \
                                                     const u32* sm, int off, int stride) {      \
        tc_pv_t<D, BC, MT, E>(o, p, sm, off, stride); return 0;                                 \
    }                                                                                           \
    extern "C" __device__ int fa2tc_store_o_d##D##_bc##BC##_mt##MT##SFX(u32* sm, int off,       \
                                                          int stride, const float* o) {         \
        tc_store_o_t<D, MT, E>(sm, off, stride, o); return 0;                                   \
    }                                                                                           \
    extern "C" __device__ int fa2tc_cp16_d##D##_bc##BC##_mt##MT##SFX(u32* sm, int soff,         \
                                                       const u32* g, long long goff, int valid) { \
        tc_cp16_t(sm, soff, g, goff, valid); return 0;                                          \
    }                                                                                           \
    extern "C" __device__ int fa2tc_st16_d##D##_bc##BC##_mt##MT##SFX(u32* g, long long goff,    \
                                                       const u32* sm, int soff) {               \
        tc_st16_t(g, goff, sm, soff); return 0;                                                 \
    }                                                                                           \
    extern "C" __device__ int fa2tc_cp2_d##D##_bc##BC##_mt##MT##SFX(                            \
        unsigned short* sm, int soff, const unsigned short* g, long long goff, int valid) {     \
        tc_cp2_t(sm, soff, g, goff, valid); return 0;                                           \
    }                                                                                           \
    extern "C" __device__ int fa2tc_st2_d##D##_bc##BC##_mt##MT##SFX(                            \
        unsigned short* g, long long goff, const unsigned short* sm, int soff) {                \
        tc_st2_t(g, goff, sm, soff); return 0;                                                  \
    }                                                                                           \
    extern "C" __device__ int fa2tc_cp_commit_d##D##_bc##BC##_mt##MT##SFX() {                   \
        asm volatile("cp.async.commit_group;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    /* wait until at most 1 (0) of this thread's committed copy groups are in flight */         \
    extern "C" __device__ int fa2tc_cp_wait1_d##D##_bc##BC##_mt##MT##SFX() {                    \
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int fa2tc_cp_wait0_d##D##_bc##BC##_mt##MT##SFX() {                    \
        asm volatile("cp.async.wait_group 0;\n" ::: "memory"); return 0;                        \
    }
