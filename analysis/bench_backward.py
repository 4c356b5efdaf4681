"""`flashsim bench --backward`: check and time the register-tiled fa2 backward
(gpu.backward.fa2_fast) on a CUDA GPU, next to PyTorch's scaled_dot_product_attention
(EFFICIENT, MATH) in the same run.

About 1-2 minutes on an H100 (numpy < 2.5 first on the path); the commit recorded is
$FLASHSIM_COMMIT:
    flashsim bench --backward --out out/bwd_fast.jsonl

1. Correctness (fp32; fp16 inputs too): N = 1000 (ragged), batch 1, 4 query heads on 2
   K/V heads, d = 64 causal and d = 128 dense, the default fast tiling: the instrumented
   counts == iosim.backward_closed_form('fa2', ...), and rel err ||g - ref||_F / ||ref||_F
   of dq, dk, dv against iosim.reference_attention_backward (float64); bound 1e-5 (fp32),
   2e-2 (fp16 inputs). Printed and written to <out>.check.json.
2. Timing, batch x heads = --batch-heads (16), N = --seq-lens (4096), fp32, d = 64 and
   128 (--head-dims), dense and causal (--causal). Each timed call sits between two CUDA events (Numba's, on the default stream
   that torch uses too); --warm calls first, then --reps calls back to back with no host
   sync between; rows give the median, min, max. Rows (kind "bench"; tiling and option
   variants: kind "bwd_fast_variants"; "pass" "bwd" or
   "fwd+bwd"), appended to --out as each is measured:
     ours_fa2_fast_main   the main kernel alone (`fa2_fast.run` on preallocated arrays:
                          L from the forward, D from the pre-pass, dQacc, dK_h, dV_h);
     ours_fa2_fast_pre    the pre-pass alone (D = rowsum(dO o O), dQacc = 0);
     ours_fa2_bwd         the whole `gpu.backward.attention_backward` call (kernel="fast":
                          its output allocation, pre-pass, main, dQ conversion);
     ours_fa2_fwd_bwd     `gpu.attention` (forward, its default fast kernel) + the above;
     torch_efficient / torch_math, pass "bwd": torch.autograd.grad of a retained graph;
                          pass "fwd+bwd": scaled_dot_product_attention then its backward.
   rel_err (ours and torch): max over dq, dk, dv of the rel err against a float64 torch
   autograd reference on the device, computed once per point. tflops: 10 N^2 d per
   instance for "bwd" (5 matmuls), 14 N^2 d for "fwd+bwd", halved when causal.
3. Variants (on unless --no-variants): the main kernel alone at other tilings / thread
   counts / register caps (d = 64 and 128, dense), each checked against the default's dK,
   dV first; rows carry "variant".
--plain also times the plain main kernel (`flash.bwd_main_kernel('fa2', ...)`, 3 reps) at
its default tiling for d = 64 dense. --smoke: tiny sizes, Numba device arrays instead of
torch, no torch rows (runs in the simulator: NUMBA_ENABLE_CUDASIM=1; timings are -1 there).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from types import SimpleNamespace

#: variants of the main kernel: name -> (d, B_r, B_c, threads, options)
VARIANTS = {
    # the defaults' own options one at a time (d = 64: 64 x 64, 256 threads)
    "r64x64_t256_nostagger": (64, 64, 64, 256, {"stagger": False}),
    "r64x64_t256_dqdirect": (64, 64, 64, 256, {"dq_stage": False}),
    "r64x64_t256_split": (64, 64, 64, 256, {"split": True}),
    "r64x64_t256_r128": (64, 64, 64, 256, {"maxreg": 128}),      # ptxas: 96 B spill
    # other tilings / thread counts (ptxas -v, sm_90: registers, no spills)
    "r64x64_t128": (64, 64, 64, 128, {}),
    "r32x64_t128": (64, 32, 64, 128, {}),                       # 244 registers
    "r64x32_t128": (64, 64, 32, 128, {}),
    "r128x64_t256": (64, 128, 64, 256, {}),                     # 254 registers, 215 KB
    "d128_r64x64_t256_nostagger": (128, 64, 64, 256, {"stagger": False}),
    "d128_r64x32_t256": (128, 64, 32, 256, {}),                 # 128 registers
}


#: smallest --reps (timed calls per point)
MIN_REPS = 1


def run(out, *, N=4096, batch_heads=16, head_dims=(64, 128), causal=(False, True), reps=20,
        warm=3, torch_rows=True, variants=True, plain=False, run_id=None, smoke=False) -> int:
    """Parts 1-3 into `out` (JSON lines, appended). Exit status 0, or 1 when a check, a
    point or a variant failed. On a GPU with torch, or (`smoke`) in Numba's simulator."""
    args = SimpleNamespace(out=out, N=N, bh=batch_heads, dims=",".join(map(str, head_dims)),
                           reps=reps, warm=warm, causal=list(causal), no_torch=not torch_rows,
                           variants=variants, plain=plain, run_id=run_id, smoke=smoke)
    import numpy as np
    print("numpy", np.__version__, "from", np.__file__, flush=True)
    if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 5):
        print("WARNING: numpy >= 2.5; numba-cuda 0.30.4 will not compile kernels. Put a "
              "numpy<2.5 wheel first on PYTHONPATH.", flush=True)
    from numba import cuda

    import iosim
    from analysis.results import make_row, new_run_id
    from gpu import _launch, _philox
    from gpu.api import attention
    from gpu.backward import attention_backward, fa2_fast
    from gpu.backward import flash

    smoke = args.smoke
    use_torch = not (smoke or args.no_torch)
    torch = None
    if use_torch:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if smoke:
        # the plumbing, not the kernels (their own tests check them): as small as runs
        args.N, args.bh, args.reps, args.warm, args.dims = 24, 1, 1, 1, "16"
    dims = [int(x) for x in args.dims.split(",")]
    run_id = args.run_id or new_run_id("bwd-fast")
    commit = os.environ.get("FLASHSIM_COMMIT")
    device = "Numba CUDA simulator" if _launch.SIM else cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else str(device)
    versions = {"python": sys.version.split()[0], "numpy": np.__version__}
    try:
        import numba
        from importlib import metadata
        versions["numba"] = numba.__version__
        versions["numba_cuda"] = metadata.version("numba-cuda")
    except Exception:
        pass
    if torch is not None:
        versions["torch"] = torch.__version__
        versions["cuda_torch"] = torch.version.cuda
    date = time.strftime("%Y-%m-%d", time.gmtime())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    print(f"device {device}; run_id {run_id}; rows -> {args.out}", flush=True)

    def emit(**payload):
        # tiling / option variants are a study of their own (kind bwd_fast_variants), the
        # default's rows are bench rows
        kind = "bwd_fast_variants" if payload.get("variant") else "bench"
        row = make_row(kind, run_id=run_id, device=device, date=date, commit=commit,
                       versions=versions, bench_run_id=run_id,
                       source="flashsim bench --backward", **payload)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        ms = row.get("ms_median")
        print(f"  {row['impl']:<20} {row.get('pass', ''):<8} d={row['d']:<4} "
              f"causal={int(row['causal'])} {row.get('variant', '') or '':<18} "
              f"{ms if ms is None else round(ms, 3)} ms  {row.get('tflops') and round(row['tflops'], 2)} "
              f"TFLOP/s  rel_err={row.get('rel_err')}", flush=True)

    def time_calls(fn, reps=None, warm=None):
        reps = args.reps if reps is None else reps
        warm = args.warm if warm is None else warm
        for _ in range(warm):
            fn()
        cuda.synchronize()
        ev = [(cuda.event(), cuda.event()) for _ in range(reps)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        cuda.synchronize()
        ts = [a.elapsed_time(b) for a, b in ev]
        return dict(ms_median=statistics.median(ts), ms_min=min(ts), ms_max=max(ts), reps=reps)

    def kernel_info(B_r, B_c, d, causal, th, opts):
        """Registers and local (spill) bytes per thread of a compiled main kernel."""
        out = {}
        try:
            kern = fa2_fast.get_kernel(B_r, B_c, d, "fp32", causal, False, False, th,
                                       **opts)
            for key, fn in (("regs", "get_regs_per_thread"),
                            ("local_bytes", "get_local_mem_per_thread")):
                x = getattr(kern, fn)()
                out[key] = list(x.values())[0] if isinstance(x, dict) and len(x) == 1 else x
        except Exception as exc:
            out["regs"] = f"unavailable: {type(exc).__name__}"
        return out

    def tflops(rule, N, d, causal, ms):
        f = rule * N * N * d * args.bh / (2 if causal else 1)
        return None if ms is None or ms <= 0 else f / (ms * 1e-3) / 1e12

    def rel(g, r):
        g = np.asarray(g, np.float64)
        return float(np.linalg.norm(g - r) / np.linalg.norm(r))

    failures = []
    t_start = time.perf_counter()
    # ---------------------------------------------------------------- 1. correctness
    checks = []
    cases = [(64, True, "fp32"), (128, False, "fp32"), (64, False, "fp16")]
    if smoke:
        cases = [(16, True, "fp32"), (16, False, "fp16")]
    Nc = 21 if smoke else 1000
    Hc, Gc = (2, 1) if smoke else (4, 2)          # heads, K/V heads of the checks
    for d, causal, dt in cases:
        t0 = time.perf_counter()
        p = iosim.Problem(N=Nc, d=d, batch=1, heads=Hc, kv_heads=Gc, dtype=dt, causal=causal)
        q, k, v = iosim.random_inputs(p, 0)
        do = np.random.default_rng(7).standard_normal(q.shape).astype(q.dtype)
        O, L = attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True)
        tl = fa2_fast.default_tiling(d, dt)
        kw = {}
        if smoke:
            tl = (16, 16, 16)
            kw = dict(block_rows=16, block_cols=16, threads=16)
        grads, ledger = attention_backward(q, k, v, O, do, L, causal=causal, kernel="fast",
                                           count_traffic=True, **kw)
        tiling = iosim.Tiling(tl[0], tl[1])
        ok_counts = (ledger.tiling == tiling and ledger.counts() ==
                     iosim.backward_closed_form("fa2", p, tiling).counts())
        ref = iosim.reference_attention_backward(q, k, v, do, causal=causal)
        errs = {n: rel(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, ref)}
        bound = 1e-5 if dt == "fp32" else 2e-2
        finite = all(np.isfinite(g).all() for g in grads)
        ok = ok_counts and finite and max(errs.values()) <= bound
        c = dict(N=Nc, d=d, causal=causal, dtype=dt, tiling=list(tl), counts_equal=ok_counts,
                 all_finite=finite, err=errs, bound=bound, ok=ok,
                 s=round(time.perf_counter() - t0, 2))
        checks.append(c)
        print("check", json.dumps(c), flush=True)
        if not ok:
            failures.append(f"check {c}")
    with open(os.path.abspath(args.out) + ".check.json", "w") as f:
        json.dump(dict(run_id=run_id, device=device, commit=commit, checks=checks), f,
                  indent=1)

    # ---------------------------------------------------------------- 2. timing
    N, BH = args.N, args.bh

    def inputs(d, seed=0):
        rng = np.random.default_rng(seed)
        host = [rng.standard_normal((1, BH, N, d), dtype=np.float32) for _ in range(4)]
        if use_torch:
            return [torch.from_numpy(x).cuda() for x in host]
        return [cuda.to_device(x) for x in host]

    keep = []      # torch tensors behind Numba views stay referenced while timed

    def empty(shape):
        if use_torch:
            keep.append(torch.empty(shape, dtype=torch.float32, device="cuda"))
            return cuda.as_cuda_array(keep[-1])
        return cuda.device_array(shape, np.float32)

    def view(x, shape):
        if use_torch:
            return cuda.as_cuda_array(x.reshape(shape))
        return x.reshape(shape)

    def reference_grads(q, k, v, do, causal):
        """float64 (dq, dk, dv) on the device (torch) or the host (smoke)."""
        if not use_torch:
            return iosim.reference_attention_backward(
                *(x.copy_to_host() for x in (q, k, v, do)), causal=causal)
        q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
        s = (q64 @ k64.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        if causal:
            s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device="cuda").triu(1),
                              float("-inf"))
        o = torch.softmax(s, dim=-1) @ v64
        g = torch.autograd.grad(o, (q64, k64, v64), do.double())
        del s, o
        return [x.cpu().numpy() for x in g]

    def host(x):
        return x.cpu().numpy() if use_torch else x.copy_to_host()

    for d in dims:
        for causal in args.causal:
            point = dict(dtype="fp32", N=N, d=d, batch_heads=BH, causal=causal)
            print(f"point d={d} causal={causal} (t = {time.perf_counter() - t_start:.0f} s)",
                  flush=True)
            try:
                q, k, v, do = inputs(d)
                O, L = attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True)
                tl = fa2_fast.default_tiling(d, "fp32")
                if smoke:
                    tl = (16, 16, 16)
                B_r, B_c, th = tl
                kw = dict(block_rows=B_r, block_cols=B_c, threads=th)
                ref = reference_grads(q, k, v, do, causal)

                def ours_bwd():
                    return attention_backward(q, k, v, O, do, L, causal=causal,
                                              kernel="fast", **kw)
                grads = ours_bwd()
                err = max(rel(host(g), r) for g, r in zip(grads, ref))
                del grads
                tinfo = dict(B_r=B_r, B_c=B_c, threads=th, kernel="fast")
                # main kernel alone, preallocated
                I = BH
                q3, k3, v3, o3, do3 = (view(x, (I, N, d)) for x in (q, k, v, O, do))
                L2 = view(L, (I, N))
                D2 = empty((I, N))
                acc = empty((I, N, d))
                dk_h = empty((I, N, d))
                dv_h = empty((I, N, d))
                cnt = _launch.new_counters(False)
                scale = 1.0 / np.sqrt(d)

                def pre():
                    fa2_fast.run_pre(o3, do3, D2, acc, N, cnt, dt="fp32", count=False)

                def main_k(B_r=B_r, B_c=B_c, th=th, opts={}):
                    fa2_fast.run(q3, k3, v3, o3, do3, L2, D2, acc, dk_h, dv_h, scale, N, BH,
                                 1, None, cnt, B_r=B_r, B_c=B_c, dt="fp32", causal=causal,
                                 count=False, threads=th, **opts)
                pre()
                main_k()
                cuda.synchronize()
                # the main kernel's dK, dV against the reference
                e_main = max(rel(dk_h.copy_to_host().reshape(ref[1].shape), ref[1]),
                             rel(dv_h.copy_to_host().reshape(ref[2].shape), ref[2]))
                t = time_calls(main_k)
                emit(impl="ours_fa2_fast_main", **point, **{"pass": "bwd"}, **t,
                     tflops=tflops(10, N, d, causal, t["ms_median"]), rel_err=e_main,
                     rel_err_of="dk, dv", **tinfo, skipped=None,
                     **kernel_info(B_r, B_c, d, causal, th, {}))
                t = time_calls(pre)
                emit(impl="ours_fa2_fast_pre", **point, **{"pass": "bwd"}, **t, tflops=None,
                     rel_err=None, **tinfo, skipped=None)
                t = time_calls(ours_bwd)
                emit(impl="ours_fa2_bwd", **point, **{"pass": "bwd"}, **t,
                     tflops=tflops(10, N, d, causal, t["ms_median"]), rel_err=err, **tinfo,
                     skipped=None)

                def ours_fwd_bwd():
                    O_, L_ = attention(q, k, v, algorithm="fa2", causal=causal,
                                       return_stats=True)
                    return attention_backward(q, k, v, O_, do, L_, causal=causal,
                                              kernel="fast", **kw)
                t = time_calls(ours_fwd_bwd)
                emit(impl="ours_fa2_fwd_bwd", **point, **{"pass": "fwd+bwd"}, **t,
                     tflops=tflops(14, N, d, causal, t["ms_median"]), rel_err=err, **tinfo,
                     skipped=None)
                if args.plain and d == dims[0] and not causal:
                    tp = flash.default_backward_tiling(d, "fp32", "fa2", "plain")
                    pt = _launch.default_threads()
                    kern = flash.bwd_main_kernel("fa2", tp.B_r, tp.B_c, d, "fp32", False,
                                                 False, False, pt)
                    shm = flash.bwd_shared_bytes(tp.B_r, tp.B_c, d, "fp32")

                    def plain_k():
                        _launch.launch(kern, (-(-N // tp.B_c), I), pt, shm, q3, k3, v3, o3,
                                       do3, L2, D2, D2, acc, dk_h, dv_h, np.float32(scale),
                                       np.int64(N), np.int64(N), np.int64(0), np.int64(0),
                                       np.int64(BH), np.int64(1),
                                       _launch.dummy_mask(), cnt, *_philox.kernel_args())
                    t = time_calls(plain_k, reps=3, warm=1)
                    emit(impl="ours_fa2_plain_main", **point, **{"pass": "bwd"}, **t,
                         tflops=tflops(10, N, d, causal, t["ms_median"]), rel_err=None,
                         B_r=tp.B_r, B_c=tp.B_c, threads=pt, kernel="plain", skipped=None)
                if use_torch:
                    from torch.nn.attention import SDPBackend, sdpa_kernel
                    import torch.nn.functional as F
                    for impl, be in (("torch_efficient", SDPBackend.EFFICIENT_ATTENTION),
                                     ("torch_math", SDPBackend.MATH)):
                        try:
                            qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
                            with sdpa_kernel(be):
                                out = F.scaled_dot_product_attention(qg, kg, vg,
                                                                     is_causal=causal)
                                g = torch.autograd.grad(out, (qg, kg, vg), do,
                                                        retain_graph=True)
                                terr = max(rel(x.cpu().numpy(), r) for x, r in zip(g, ref))
                                del g

                                def tb():
                                    torch.autograd.grad(out, (qg, kg, vg), do,
                                                        retain_graph=True)
                                t = time_calls(tb)
                                emit(impl=impl, **point, **{"pass": "bwd"}, **t,
                                     tflops=tflops(10, N, d, causal, t["ms_median"]),
                                     rel_err=terr, skipped=None)
                                del out

                                def tfb():
                                    o_ = F.scaled_dot_product_attention(qg, kg, vg,
                                                                        is_causal=causal)
                                    torch.autograd.grad(o_, (qg, kg, vg), do)
                                t = time_calls(tfb)
                                emit(impl=impl, **point, **{"pass": "fwd+bwd"}, **t,
                                     tflops=tflops(14, N, d, causal, t["ms_median"]),
                                     rel_err=terr, skipped=None)
                            del qg, kg, vg
                            torch.cuda.empty_cache()
                        except Exception as exc:
                            emit(impl=impl, **point, **{"pass": "bwd"}, ms_median=None,
                                 tflops=None, rel_err=None,
                                 skipped=f"{type(exc).__name__}: {exc}"[:300])
                # ---------------------------------------------------- 3. variants
                if args.variants and not causal and not smoke:
                    ref_dk = dk_h.copy_to_host()
                    ref_dv = dv_h.copy_to_host()
                    for name, (vd, vbr, vbc, vth, opts) in VARIANTS.items():
                        if vd != d:
                            continue
                        why = fa2_fast.plan_error(vbr, vbc, vd, "fp32", vth)
                        if why:
                            emit(impl="ours_fa2_fast_main", **point, **{"pass": "bwd"},
                                 variant=name, ms_median=None, tflops=None, rel_err=None,
                                 skipped=why)
                            continue
                        try:
                            fn = (lambda a=vbr, b=vbc, c=vth, o=opts: main_k(a, b, c, o))
                            fn()
                            cuda.synchronize()
                            ok = (np.allclose(dk_h.copy_to_host(), ref_dk, rtol=1e-4,
                                              atol=1e-5) and
                                  np.allclose(dv_h.copy_to_host(), ref_dv, rtol=1e-4,
                                              atol=1e-5))
                            t = time_calls(fn)
                            emit(impl="ours_fa2_fast_main", **point, **{"pass": "bwd"},
                                 variant=name, **t, B_r=vbr, B_c=vbc, threads=vth,
                                 kernel="fast", options=opts, matches_default=bool(ok),
                                 tflops=tflops(10, N, d, causal, t["ms_median"]),
                                 rel_err=None, skipped=None,
                                 **kernel_info(vbr, vbc, vd, causal, vth, opts))
                            if not ok:
                                failures.append(f"variant {name} differs from the default")
                        except Exception as exc:
                            traceback.print_exc()
                            emit(impl="ours_fa2_fast_main", **point, **{"pass": "bwd"},
                                 variant=name, ms_median=None, tflops=None, rel_err=None,
                                 skipped=f"{type(exc).__name__}: {exc}"[:300])
                # free the point's arrays before the next one
                q = k = v = do = O = L = None
                q3 = k3 = v3 = o3 = do3 = L2 = D2 = acc = dk_h = dv_h = None
                keep.clear()
                if use_torch:
                    torch.cuda.empty_cache()
            except Exception as exc:
                traceback.print_exc()
                failures.append(f"point d={d} causal={causal}: {type(exc).__name__}: {exc}")
    print(f"total {time.perf_counter() - t_start:.0f} s", flush=True)
    print("FAILURES:" if failures else "all ok", *failures, sep="\n", flush=True)
    return 1 if failures else 0

