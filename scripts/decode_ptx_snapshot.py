"""Normalised PTX of gpu.decode's fp16 builds (scripts/ptx_snapshot.py has none of them),
for checking that a change leaves the decode kernels alone. NVVM only, no GPU:

    PYTHONPATH=$PWD python3 scripts/decode_ptx_snapshot.py OUTDIR; diff -r BEFORE AFTER

Builds: the main kernel at d 64 / 128, NG 1 / 4 query heads a block, S = 1 / > 1,
contiguous / paged (N_q = 1, causal, uncounted; split_kv.plan's GPU layout), and the combine
at d 64 / 128 (128 threads). Normalisation: scripts/ptx_snapshot.py's. Used for the
e5d20a2 -> 2f78a13 check in analysis/decode_time.py (identical)."""
import os
import sys
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
sys.path.insert(0, os.getcwd())
from numba import cuda, types as T
import gpu.decode.split_kv as K
from ptx_snapshot import normalise   # the same normalisation as the fast kernels' snapshot

h, f, i32, i64 = T.float16, T.float32, T.int32, T.int64
A = lambda t, n: T.Array(t, n, "C")
outdir = sys.argv[1]; os.makedirs(outdir, exist_ok=True)
main_sig = (A(h,4), A(h,4), A(h,4), A(i32,2), A(h,4), A(f,3), A(f,5), A(f,4), f, i64, i64, i64, i64, i64, A(i64,2))
n = 0
for d in (64, 128):
    for NG in (1, 4):
        for split in (False, True):
            for paged in (False, True):
                lay = K.plan(d, "fp16", NG)
                kern = K.decode_kernel(d, "fp16", 1, NG, split, paged, True, False, lay["NT"], lay["VW"],
                                       lay["LPR"], lay["KPG"], lay["shfl"], lay["vec"], *( [lay["red"]] if "red" in lay else []))
                ptx, _ = cuda.compile_ptx(kern.py_func, main_sig, cc=(9, 0))
                open(f"{outdir}/main_d{d}_ng{NG}_s{int(split)}_p{int(paged)}.ptx", "w").write(normalise(ptx)); n += 1
for d in (64, 128):
    kern = K.combine_kernel(d, "fp16", 1, False, 128)
    sig = (A(f,5), A(f,4), A(h,4), A(f,3), i64, i64, A(i64,2))
    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))
    open(f"{outdir}/combine_d{d}.ptx", "w").write(normalise(ptx)); n += 1
print(n, "builds ->", outdir, "plan:", K.plan(64, "fp16", 1))
