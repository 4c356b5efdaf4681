#!/usr/bin/env python3
"""One-off probe: how many L2 sectors do 16-byte global loads cost, by instruction form?

Why: gpu.forward.fa2_tc's L2 read sectors (Nsight Compute, lts__t_sectors_srcunit_tex_op_read)
were about 1.5x its exact request count, and its L1 view showed 18 sectors per 512-byte
warp request where 16 were expected. This probe isolates the instruction: each kernel
copies the same 64 MiB from global to shared memory, 16 bytes per thread, a warp covering
512 contiguous bytes, with
  ld_v4       ld.global.v4.u32 (through registers)
  cpasync_cg  cp.async.cg.shared.global [dst], [src], 16        (what fa2_tc would use)
  cpasync_cg_src  the same with the src-size operand (16), as fa2_tc issues it
  cpasync_ca  cp.async.ca.shared.global ... 16
  kv_pairs    cp.async.cg with src-size, alternating two arrays as fa2_tc's K and V copies
  padded      cp.async.cg with src-size into shared rows padded to d + 8 halves (144 bytes
              for a 128-byte global row), as fa2_tc lays out K_j and V_j for ldmatrix
Run under ncu (see scripts/device_levels.sh); prints nothing of interest by itself.
Needs CuPy (NVRTC) and a GPU of compute capability >= 8.0.
"""
import cupy as cp

SRC = r'''
extern "C" __device__ unsigned smem_addr(const void* p) {
    unsigned a; asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p)); return a; }
#define BODY_START \
    __shared__ __align__(16) unsigned sm[256 * 4 * 2]; \
    long n16 = n_bytes / 16; unsigned acc = 0;
extern "C" __global__ void ld_v4(const unsigned* __restrict__ g, long n_bytes, unsigned* out) {
    BODY_START
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n16; e += (long)gridDim.x * blockDim.x) {
        unsigned a, b, c, d;
        asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(g + 4 * e));
        acc ^= a ^ b ^ c ^ d; }
    if (acc == 0x12345678) out[0] = acc; }
extern "C" __global__ void cpasync_cg(const unsigned* __restrict__ g, long n_bytes, unsigned* out) {
    BODY_START
    unsigned dst = smem_addr(sm + 4 * threadIdx.x);
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n16; e += (long)gridDim.x * blockDim.x) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(g + 4 * e));
        asm volatile("cp.async.wait_all;" ::: "memory"); }
    if (sm[threadIdx.x] == 0x12345678) out[0] = 1; }
extern "C" __global__ void cpasync_cg_src(const unsigned* __restrict__ g, long n_bytes, unsigned* out) {
    BODY_START
    unsigned dst = smem_addr(sm + 4 * threadIdx.x);
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n16; e += (long)gridDim.x * blockDim.x) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(g + 4 * e), "r"(16));
        asm volatile("cp.async.wait_all;" ::: "memory"); }
    if (sm[threadIdx.x] == 0x12345678) out[0] = 1; }
extern "C" __global__ void cpasync_ca(const unsigned* __restrict__ g, long n_bytes, unsigned* out) {
    BODY_START
    unsigned dst = smem_addr(sm + 4 * threadIdx.x);
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n16; e += (long)gridDim.x * blockDim.x) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(g + 4 * e));
        asm volatile("cp.async.wait_all;" ::: "memory"); }
    if (sm[threadIdx.x] == 0x12345678) out[0] = 1; }
extern "C" __global__ void kv_pairs(const unsigned* __restrict__ g, long n_bytes, unsigned* out) {
    BODY_START
    const unsigned* h = g + n_bytes / 8;          // second half: the "V" array
    unsigned dk = smem_addr(sm + 4 * threadIdx.x), dv = smem_addr(sm + 1024 + 4 * threadIdx.x);
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n16 / 2; e += (long)gridDim.x * blockDim.x) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dk), "l"(g + 4 * e), "r"(16));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dv), "l"(h + 4 * e), "r"(16));
        asm volatile("cp.async.wait_all;" ::: "memory"); }
    if (sm[threadIdx.x] == 0x12345678) out[0] = 1; }
extern "C" __global__ void padded(const unsigned* __restrict__ g, long n_bytes, unsigned* out) {
    __shared__ __align__(16) unsigned sm[64 * 36];
    long n16 = n_bytes / 16;
    unsigned t = threadIdx.x;
    unsigned dst = smem_addr(sm + (t / 8) * 36 + (t % 8) * 4);   // row t/8, 16-byte chunk t%8
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n16; e += (long)gridDim.x * blockDim.x) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(g + 4 * e), "r"(16));
        asm volatile("cp.async.wait_all;" ::: "memory"); }
    if (sm[t] == 0x12345678) out[0] = 1; }
'''

mod = cp.RawModule(code=SRC, options=("-arch=sm_90",))
n_bytes = 64 << 20
g = cp.arange(n_bytes // 4, dtype=cp.uint32)
out = cp.zeros(1, dtype=cp.uint32)
for name in ("ld_v4", "cpasync_cg", "cpasync_cg_src", "cpasync_ca", "kv_pairs", "padded"):
    mod.get_function(name)((264,), (256,), (g, cp.int64(n_bytes), out))
cp.cuda.Device().synchronize()
print("probe kernels ran; expected L2 read sectors each:", n_bytes // 32)
