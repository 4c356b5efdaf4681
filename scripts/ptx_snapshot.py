"""Normalised PTX of a fixed set of builds of the register-tiled (fast) kernels, for
checking that a refactoring leaves what they compile to unchanged.

    NUMBA_ENABLE_CUDASIM=0 PYTHONPATH=$PWD python3 scripts/ptx_snapshot.py OUTDIR [-j 2]
    diff -r BEFORE AFTER
    NUMBA_ENABLE_CUDASIM=0 PYTHONPATH=$PWD python3 scripts/ptx_snapshot.py OUTDIR --tc

--tc: the tensor-core kernels' linked PTX instead (NVVM, NVRTC and nvJitLink; no GPU):
gpu.forward.fa2_tc (d = 64 and 128 defaults, MT = 2, causal / mask / window / counting,
d = 48 and 80), gpu.backward.fa2_tc (the default tilings at d = 64 and 128, MT = 2, kreg,
a window), gpu.forward.fa1_tc, gpu.forward.standard_tc and gpu.backward.standard_tc (one
build each): every user of gpu/mma.cuh, for checking that a change to the templates leaves them alone.

    NUMBA_ENABLE_CUDASIM=0 PYTHONPATH=$PWD python3 scripts/ptx_snapshot.py OUTDIR --decode

--decode: gpu.decode's fp16 builds instead (NVVM, no GPU): the main kernel at d 64 / 128,
NG 1 / 4 query heads a block, S = 1 / > 1, contiguous / paged (N_q = 1, causal, uncounted;
split_kv.plan's GPU layout), and the combine at d 64 / 128 (128 threads).

Builds: gpu.forward.fa2_fast, fa1_fast, standard_fast (S and PV kernels) and
gpu.backward.fa2_fast (main and preprocessing kernels); fp32 and fp16; causal or not;
counting or not; the api's usual tiling and one other (and the band / stage variants
where a kernel has them). NVVM only, no GPU. Normalisation: comments and the
.version / .target lines dropped, mangled symbols (_Z...) renamed to placeholders in
order of first appearance (closure names differ from build to build), the
process-wide counter of numba's shared-array symbols (_cudapy_smem_N) dropped."""
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")


def builds():
    """(file name, module, factory, args, signature key) of every build."""
    out = []
    for dt in ("fp32", "fp16"):
        for causal in (False, True):
            for count in (False, True):
                tag = f"{dt}_c{int(causal)}_n{int(count)}"
                # fa2_fast_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TC, shfl,
                #                 maxreg, stage, window)
                for i, a in enumerate(((128, 64, 64, dt, causal, True, count, 128, 8, True,
                                        0, 1, False),
                                       (64, 64, 128, dt, causal, False, count, 256, 16,
                                        False, 0, 0, causal),
                                       (128, 32, 64, dt, causal, False, count, 256, 8,
                                        True, 0, 2, False))):
                    out.append((f"fa2_fast_{i}_{tag}", "gpu.forward.fa2_fast",
                                "fa2_fast_kernel", a, "signature"))
                # fa1_fast_kernel(B_r, B_c, d, dt, causal, window, has_mask, count, threads,
                #                 shfl, maxreg)
                for i, a in enumerate(((128, 64, 64, dt, causal, False, True, count, 256,
                                        True, 0),
                                       (64, 64, 128, dt, causal, causal, False, count, 512,
                                        False, 0))):
                    out.append((f"fa1_fast_{i}_{tag}", "gpu.forward.fa1_fast",
                                "fa1_fast_kernel", a, "signature"))
                # s_kernel(B_r, B_c, d, dt, causal, window, count, threads, maxreg)
                # pv_kernel(B_r, B_c, d, dt, causal, window, has_mask, count, threads, stage,
                #           maxreg)
                for i, (B_r, B_c, d, th, win, st) in enumerate(((128, 128, 64, 256, False, 0),
                                                                (64, 64, 128, 128, True, 1))):
                    out.append((f"std_s_{i}_{tag}", "gpu.forward.standard_fast", "s_kernel",
                                (B_r, B_c, d, dt, causal, win and causal, count, th, 0),
                                "S"))
                    out.append((f"std_pv_{i}_{tag}", "gpu.forward.standard_fast",
                                "pv_kernel", (B_r, B_c, d, dt, causal, win and causal,
                                              not win, count, th, st, 0), "PV"))
                # get_kernel(B_r, B_c, d, dt, causal, has_mask, count, threads, TCA, TXB, TXC,
                #            maxreg, split, stagger, dq_stage, window)
                for i, a in enumerate(((64, 64, 64, dt, causal, True, count, 256),
                                       (64, 64, 128, dt, causal, False, count, 256, None,
                                        None, None, 0, None, True, True, causal),
                                       (32, 32, 64, dt, causal, False, count, 128, None,
                                        None, None, 0, True, False, False, False))):
                    out.append((f"bwd_fast_{i}_{tag}", "gpu.backward.fa2_fast", "get_kernel",
                                a, "signature"))
            # fa2_pre_fast_kernel(d, dt, count, threads, shfl, rpw)
            if not causal:
                for count in (False, True):
                    for i, a in enumerate(((64, dt, count, 256, True, 4),
                                           (128, dt, count, 128, False, 2))):
                        out.append((f"bwd_pre_{i}_{dt}_n{int(count)}",
                                    "gpu.backward.fa2_fast", "fa2_pre_fast_kernel", a,
                                    "pre_signature"))
    return out


def tc_builds():
    """(file name, module, linked_ptx args, kwargs) of the tensor-core builds (--tc)."""
    out = []
    for i, a in enumerate(((128, 64, 64, False, False, False, 1),
                           (128, 64, 64, True, True, True, 1),
                           (64, 64, 128, True, False, False, 1),
                           (128, 32, 128, False, False, False, 2),
                           (64, 32, 48, True, True, True, 2),
                           (32, 48, 80, False, True, False, 1))):
        out.append((f"fa2_tc_{i}", "gpu.forward.fa2_tc", a, {}))
    out.append(("fa2_tc_win", "gpu.forward.fa2_tc", (64, 64, 128, True, False, False, 1),
                dict(window=True)))
    # fa2 backward: (B_r, B_c, d, causal, has_mask, count, MT, kreg, DN)
    for i, a in enumerate(((64, 128, 64, False, False, False, 1, False, 32),
                           (64, 128, 64, True, True, True, 1, False, 64),
                           (32, 64, 128, False, False, False, 1, False, 32),
                           (64, 64, 64, False, False, True, 2, True, 64))):
        out.append((f"fa2_bwd_tc_{i}", "gpu.backward.fa2_tc", a, {}))
    out.append(("fa2_bwd_tc_win", "gpu.backward.fa2_tc", (64, 128, 64, True, False, False, 1,
                                                          False, 64), dict(window=True)))
    out.append(("fa1_tc_0", "gpu.forward.fa1_tc", (128, 64, 64, True, False, True), {}))
    out.append(("std_tc_fwd_0", "gpu.forward.standard_tc", (128, 128, 64, True, False, True),
                {}))
    out.append(("std_tc_bwd_0", "gpu.backward.standard_tc", (64, 64, 64, True, False, True),
                {}))
    return out


def decode_builds():
    """(file name, kind, d, NG, split, paged) of gpu.decode's builds (--decode)."""
    out = [(f"main_d{d}_ng{NG}_s{int(split)}_p{int(paged)}", "main", d, NG, split, paged)
           for d in (64, 128) for NG in (1, 4) for split in (False, True)
           for paged in (False, True)]
    return out + [(f"combine_d{d}", "combine", d, None, None, None) for d in (64, 128)]


def one_decode(job):
    fname, kind, d, NG, split, paged = job
    from numba import cuda, types as T
    import gpu.decode.split_kv as K
    h, f, i64 = T.float16, T.float32, T.int64

    def A(t, n):
        return T.Array(t, n, "C")
    if kind == "combine":
        kern = K.combine_kernel(d, "fp16", 1, False, 256)
        sig = (A(f, 5), A(f, 4), A(h, 4), A(f, 3), i64, i64, A(i64, 2))
    else:
        lay = K.plan(d, "fp16", NG)
        kern = K.decode_kernel(d, "fp16", 1, NG, split, paged, True, False, lay["NT"],
                               lay["VW"], lay["LPR"], lay["KPG"], lay["shfl"], lay["vec"],
                               *([lay["red"]] if "red" in lay else []))
        sig = (A(h, 4), A(h, 4), A(h, 4), A(T.int32, 2), A(T.int32, 1), A(h, 4), A(f, 3),
               A(f, 5), A(f, 4), f, i64, i64, i64, A(i64, 2))
    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))
    return fname, kern.py_func.__name__, normalise(ptx)


def one_tc(job):
    fname, mod, args, kw = job
    import importlib
    ptx = importlib.import_module(mod).linked_ptx(*args, **kw)
    if isinstance(ptx, dict):
        return fname, mod, "".join(f"// {k}\n{normalise(v)}" for k, v in sorted(ptx.items()))
    return fname, mod, normalise(ptx)


def normalise(ptx: str) -> str:
    names = {}

    def sub(m):
        return names.setdefault(m.group(0), f"_SYM{len(names)}")

    lines = []
    for line in ptx.splitlines():
        line = re.sub(r"//.*", "", line).rstrip()
        if not line or line.startswith((".version", ".target")):
            continue
        line = re.sub(r"_cudapy_(smem|lmem|cmem)_\d+", r"_cudapy_\1_N", line)
        lines.append(re.sub(r"_Z[A-Za-z0-9_$]+", sub, line))
    return "\n".join(lines) + "\n"


def one(job):
    fname, mod, fac, args, sigkey = job
    import importlib
    from numba import cuda
    m = importlib.import_module(mod)
    kern = getattr(m, fac)(*args)
    if sigkey in ("S", "PV"):
        sig = m.signatures(args[3])[sigkey]
    else:
        sig = getattr(m, sigkey)(args[1] if fac == "fa2_pre_fast_kernel" else args[3])
    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))
    return fname, kern.py_func.__name__, normalise(ptx)


def main():
    outdir = sys.argv[1]
    jobs = int(sys.argv[sys.argv.index("-j") + 1]) if "-j" in sys.argv else 2
    only = [a for a in sys.argv[2:] if a.startswith("--only=")]
    tc = "--tc" in sys.argv
    decode = "--decode" in sys.argv
    bs, fn = ((tc_builds(), one_tc) if tc else (decode_builds(), one_decode) if decode
              else (builds(), one))
    if only:
        bs = [b for b in bs if b[0].startswith(only[0][7:])]
    os.makedirs(outdir, exist_ok=True)
    with ProcessPoolExecutor(jobs) as ex:
        for fname, name, text in ex.map(fn, bs):
            with open(os.path.join(outdir, fname + ".ptx"), "w") as f:
                f.write(f"// {name}\n" + text)
    print(f"{len(bs)} builds -> {outdir}")


if __name__ == "__main__":
    main()
