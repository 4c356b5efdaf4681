// Split-KV decoding on the tensor cores: the extern "C" entry points that gpu/decode/tc.py
// links into its Numba kernel, one set per (D, BC, E). The tile products are the shared
// templates of gpu/mma.cuh (prepended by gpu/_tc.py), at one m-tile (MT = 1): the 16 rows of
// the mma tile hold the block's NR = G x N_q query rows (zero rows past NR).
//     load_q : the A fragments of the 16 x D query tile           (once per block)
//     qk     : S = Q K_j^T (16 x BC), fp32 accumulators
//     pv     : O += P V_j (16 x D), P rounded to E
//     cp16   : one 16-byte asynchronous copy global -> shared (zeros when not valid)
//     cp_commit, cp_wait0 .. cp_wait3: cp.async groups (wait until at most N of this
//              thread's committed groups are in flight; N is an immediate in PTX, hence one
//              function each)
// Every name carries the sizes and SFX (empty for fp16, _bf16 for bf16). Not `inline`: an
// inline function this file does not call would not be emitted; link-time optimisation
// inlines them into the kernel. They return 0 (Numba's C-ABI call wants a value).

#define DECTC_INSTANTIATE(D, BC, E, SFX)                                                       \
    extern "C" __device__ int dectc_load_q_d##D##_bc##BC##SFX(u32* qf, const u32* sm, int off,  \
                                                              int stride) {                     \
        tc_load_q_t<D, 1>(qf, sm, off, stride); return 0;                                       \
    }                                                                                           \
    extern "C" __device__ int dectc_qk_d##D##_bc##BC##SFX(float* s, const u32* qf,              \
                                                          const u32* sm, int off, int stride) { \
        tc_qk_t<D, BC, 1, E>(s, qf, sm, off, stride); return 0;                                 \
    }                                                                                           \
    extern "C" __device__ int dectc_pv_d##D##_bc##BC##SFX(float* o, const float* p,             \
                                                          const u32* sm, int off, int stride) { \
        tc_pv_t<D, BC, 1, E>(o, p, sm, off, stride); return 0;                                  \
    }                                                                                           \
    extern "C" __device__ int dectc_cp16_d##D##_bc##BC##SFX(u32* sm, int soff, const u32* g,    \
                                                            long long goff, int valid) {        \
        tc_cp16_t(sm, soff, g, goff, valid); return 0;                                          \
    }                                                                                           \
    extern "C" __device__ int dectc_cp_commit_d##D##_bc##BC##SFX() {                            \
        asm volatile("cp.async.commit_group;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int dectc_cp_wait0_d##D##_bc##BC##SFX() {                             \
        asm volatile("cp.async.wait_group 0;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int dectc_cp_wait1_d##D##_bc##BC##SFX() {                             \
        asm volatile("cp.async.wait_group 1;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int dectc_cp_wait2_d##D##_bc##BC##SFX() {                             \
        asm volatile("cp.async.wait_group 2;\n" ::: "memory"); return 0;                        \
    }                                                                                           \
    extern "C" __device__ int dectc_cp_wait3_d##D##_bc##BC##SFX() {                             \
        asm volatile("cp.async.wait_group 3;\n" ::: "memory"); return 0;                        \
    }
