"""Probe fa1_tc (Algorithm 1 on the tensor cores) against fa2_tc on a GPU.

Correctness, exact counts, kernel timings, and the traffic model's prediction beside them.

One call on the lent GPU (numba-cuda with numpy < 2.5; torch used where present):
    python3 scripts/fa1_tc_probe.py --out DIR [--quick] [--skip-check] [--skip-time]
writes DIR/fa1_tc_probe.jsonl, one JSON object per line as each is measured (a failing
point is recorded with its error and the probe goes on; points past the time budget,
--budget seconds, are recorded as skipped):
  * kind "check" (small sizes: ragged N, causal, grouped K/V, a block mask with an empty
    query block and an empty key column, T_r = 1, MT = 2, a NaN input): gpu.forward.fa1_tc
    with its outputs poisoned (NaN) first; `exact`: its own counts equal
    iosim.closed_form('fa1') element for element; `err_tc`: ||O - ref|| / ||ref|| against
    float64 attention; `err_model`: the same for iosim's fp16 model of Algorithm 1 (O
    rounded to fp16 after every key block: the existing fa1 kernel's criterion is
    err <= 2 err_model); `err_fa1_plain`: the existing fa1 kernel (gpu.attention
    algorithm='fa1') on the same inputs; `ok`: every check of tests/test_gpu_fa1_tc.check_run
    (counts, NaN placement, error bound, l and m, rows that see no key), `failure` if not;
    `same_bits_plain_build`: the uncounted build gives the same O, l, m.
  * kind "time": kernels alone (CUDA events around launches on preallocated arrays,
    inputs rotated over sets larger than the L2, warm-up, median of --reps) at N = 4096,
    d = 64, batch x heads in {16, 128}, causal or not: `fa1_tc` (default tiling, and at
    batch x heads = 128 non-causal the alternatives 128 x 128 with 2 stages, 128 x 64,
    64 x 128, 64 x 64), `fa2_tc` (gpu.forward.fa2_tc with
    gpu.attention's default tiling, the kernel gpu.attention(kernel='tc') launches), and at
    N = 1024, batch x heads = 16 also the existing plain `fa1` kernel (it is slow). Beside
    each fa1_tc time: `ratio_fa1_fa2` (measured), and the model's prediction:
    `ledger_gb` (iosim.closed_form bytes requested), `ratio_traffic` (fa1 / fa2 ledger
    bytes), `t_traffic_ms` (fa1's ledger bytes at --hbm-tbs, as if every request reached
    HBM: its O, Q, l, m round trips do not fit the L2 at batch x heads = 128),
    `t_parallel_ms` (fa2's measured time x SMs / min(instances, SMs): the same arithmetic on
    one SM per instance), `pred_ms` = max of the two, `pred_ratio` = pred_ms / fa2 ms.
Without a GPU `--help` works; nothing else does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--out", required=True, help="folder for fa1_tc_probe.jsonl")
    ap.add_argument("--quick", action="store_true", help="fewer checks and timings")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--reps", type=int, default=15, help="timed launches per point")
    ap.add_argument("--budget", type=float, default=170.0,
                    help="seconds in all; later points are recorded as skipped")
    ap.add_argument("--check-budget", type=float, default=70.0,
                    help="seconds for the checks (each new specialisation compiles: "
                         "seconds each); later checks are recorded as skipped")
    ap.add_argument("--shapes", default=None,
                    help="timed shapes as BH:N:causal,... (causal 0/1; default "
                         "16:4096:0,128:4096:0,16:4096:1,128:4096:1,16:1024:0)")
    ap.add_argument("--hbm-tbs", type=float, default=3.0,
                    help="HBM bandwidth for the traffic prediction (TB/s)")
    args = ap.parse_args(argv)
    t_start = time.time()

    from numba import cuda
    import iosim
    from gpu import _launch
    from gpu.api import attention, default_tiling, fa2_tc_default, fa2_tc_mt
    from gpu.forward import fa1, fa1_tc, fa2_tc
    from test_gpu_fa1_tc import GPU_CASES, _counts, _inputs, check_run, run_gpu, tiles

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fa1_tc_probe.jsonl")
    dev = cuda.get_current_device()
    name = getattr(dev, "name", "simulator")
    name = name.decode() if isinstance(name, bytes) else str(name)
    sms = int(getattr(dev, "MULTIPROCESSOR_COUNT", 132))

    def emit(row):
        row = dict(device=name, elapsed_s=round(time.time() - t_start, 1), **row)
        print(json.dumps(row), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def over_budget():
        return time.time() - t_start > args.budget

    def rel(X, ref, rows):
        return float(np.linalg.norm((np.asarray(X, np.float64) - ref)[rows])
                     / np.linalg.norm(ref[rows]))

    # ---------------- correctness and counts ----------------
    checks = GPU_CASES[:3] if args.quick else GPU_CASES
    for n_case, c in enumerate([] if args.skip_check else checks):
        row = dict(kind="check", **{k: v for k, v in c.items()})
        if time.time() - t_start > min(args.check_budget, args.budget):
            emit(dict(row, skipped="check time budget"))
            continue
        t0 = time.time()
        try:
            B_r, B_c, MT, st = tiles(c)
            mask = None if "mask" not in c else np.array(c["mask"], bool)
            p, q, k, v = _inputs(c["N"], c["d"], H=c.get("H", 1), Hk=c.get("Hk", c.get("H", 1)),
                                 causal=c.get("causal", False), mask=mask,
                                 nan_row=c.get("nan_row"))
            tiling = iosim.Tiling(B_r, B_c)
            O, l, m, counters = run_gpu(q, k, v, B_r=B_r, B_c=B_c, MT=MT, stages=st,
                                        causal=p.causal, block_mask=mask)
            got = _counts(counters)
            row["exact"] = got == iosim.closed_form("fa1", p, tiling).counts()
            ref = iosim.reference_attention(q, k, v, causal=p.causal, block_mask=mask,
                                            B_r=B_r, B_c=B_c)
            rows = np.isfinite(ref).all(-1) & (np.abs(ref).sum(-1) > 0)
            ex = iosim.execute("fa1", p, tiling, q, k, v)
            row["finite_rows_finite"] = bool(np.isfinite(O[rows]).all())
            row["err_tc"] = rel(O, ref, rows)
            row["err_model"] = rel(ex.O, ref, rows)
            if n_case in (0, 1, 8):   # the existing kernel (compiles one more kernel)
                try:
                    Op = attention(q, k, v, algorithm="fa1", causal=p.causal, block_rows=B_r,
                                   block_cols=B_c, block_mask=mask)
                    row["err_fa1_plain"] = rel(Op, ref, rows)
                except Exception as e:   # e.g. its shared memory at large tiles
                    row["err_fa1_plain"] = None
                    row["fa1_plain_error"] = repr(e)[:200]
            try:
                with np.errstate(invalid="ignore"):
                    check_run(p, tiling, q, k, v, O, l, m, got)
                row["ok"] = True
            except AssertionError as e:
                row["ok"] = False
                row["failure"] = str(e)[:600]
            if n_case in (0, 1):      # the uncounted build (one more compile each)
                O2, l2, m2, _ = run_gpu(q, k, v, B_r=B_r, B_c=B_c, MT=MT, stages=st,
                                        causal=p.causal, block_mask=mask, count=False)
                row["same_bits_plain_build"] = bool(
                    np.array_equal(O, O2, equal_nan=True) and np.array_equal(l, l2, equal_nan=True)
                    and np.array_equal(m, m2, equal_nan=True))
            if not row["exact"]:
                row["counts"] = {t: list(x) for t, x in got.items()}
                row["closed_form"] = {t: list(x) for t, x in
                                      iosim.closed_form("fa1", p, tiling).counts().items()}
            row["s"] = round(time.time() - t0, 2)
            emit(row)
        except Exception as e:   # record the failing point and go on
            emit(dict(row, error=repr(e)[:800]))

    if args.skip_time:
        return
    # ---------------- timings: kernels alone ----------------
    try:
        import torch
    except ImportError:
        torch = None

    def randn(shape, seed):
        if torch is not None:
            g = torch.Generator(device="cuda").manual_seed(seed)
            t = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
            return cuda.as_cuda_array(t), t
        x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        return cuda.to_device(x.astype(np.float16)), None

    def timed(fn, sets, reps, warm=2):
        for i in range(warm):
            fn(sets[i % len(sets)])
        cuda.synchronize()
        ts = []
        for i in range(reps):
            a, b = cuda.event(), cuda.event()
            s = sets[i % len(sets)]
            a.record()
            fn(s)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return float(np.median(ts))

    d = 64
    shapes = [(16, 4096, False), (128, 4096, False), (16, 4096, True), (128, 4096, True),
              (16, 1024, False)]
    alternatives = [(128, 128, 1, 2), (128, 64, 1, 3), (64, 128, 1, 3), (64, 64, 1, 3)]
    if args.quick:
        shapes = shapes[:2]
        alternatives = alternatives[:1]
    if args.shapes:
        shapes = [(int(a), int(b), bool(int(c))) for a, b, c in
                  (x.split(":") for x in args.shapes.split(","))]
    dummy = _launch.new_counters(False)
    for BH, N, causal in shapes:
        shape = dict(BH=BH, N=N, d=d, causal=causal)
        if over_budget():
            emit(dict(kind="time", **shape, skipped="time budget"))
            continue
        try:
            set_bytes = 6 * BH * N * d * 2          # q, k, v, o (+ fa1's l, m, small)
            n_sets = max(2, -(-200_000_000 // set_bytes))
            sets = []
            keep = []
            for s in range(n_sets):
                (q, tq), (k, tk), (v, tv) = (randn((BH, N, d), 3 * s + x) for x in range(3))
                o = cuda.device_array((BH, N, d), np.float16)
                l2 = cuda.device_array((BH, N), np.float32)
                m2 = cuda.device_array((BH, N), np.float32)
                L2 = cuda.device_array((BH, N), np.float32)
                sets.append((q, k, v, o, l2, m2, L2))
                keep.append((tq, tk, tv))
            scale = 1.0 / np.sqrt(d)
            p = iosim.Problem(N=N, d=d, batch=1, heads=BH, dtype="fp16", causal=causal)
            flops = 4.0 * N * N * d * BH * (0.5 if causal else 1.0)
            # fa2 on the tensor cores, gpu.attention's default tiling
            fb_r, fb_c = fa2_tc_default(d, causal)
            fmt = fa2_tc_mt(fb_r, fb_c, d)

            def run_fa2(s, fb_r=fb_r, fb_c=fb_c, fmt=fmt):
                q, k, v, o, _l, _m, L2 = s
                fa2_tc.run(q, k, v, o, L2, scale, N, BH, 1, None, dummy, B_r=fb_r, B_c=fb_c,
                           dt="fp16", causal=causal, count=False, MT=fmt)
            ms2 = timed(run_fa2, sets, args.reps)
            led2 = iosim.closed_form("fa2", p, iosim.Tiling(fb_r, fb_c))
            emit(dict(kind="time", kernel="fa2_tc", **shape, B_r=fb_r, B_c=fb_c, MT=fmt,
                      ms=ms2, tflops=flops / ms2 / 1e9, ledger_gb=led2.hbm_bytes / 1e9))
            dflt = fa1_tc.default_tiling(d, causal)
            tilings = [(dflt["B_r"], dflt["B_c"], dflt["MT"], dflt["stages"])]
            if BH == 128 and not causal:
                tilings += [t for t in alternatives if t != tilings[0]]
            for B_r, B_c, MT, st in tilings:
                tl = dict(B_r=B_r, B_c=B_c, MT=MT, stages=st)
                if over_budget():
                    emit(dict(kind="time", kernel="fa1_tc", **shape, **tl,
                              skipped="time budget"))
                    continue
                try:
                    def run_fa1(s, B_r=B_r, B_c=B_c, MT=MT, st=st):
                        q, k, v, o, l2, m2, _L = s
                        fa1_tc.run(q, k, v, o, l2, m2, scale, N, BH, 1, None, dummy, B_r=B_r,
                                   B_c=B_c, dt="fp16", causal=causal, count=False, MT=MT,
                                   stages=st)
                    ms1 = timed(run_fa1, sets, args.reps)
                    led1 = iosim.closed_form("fa1", p, iosim.Tiling(B_r, B_c))
                    t_traffic = led1.hbm_bytes / (args.hbm_tbs * 1e12) * 1e3
                    t_par = ms2 * sms / min(BH, sms)
                    pred = max(t_traffic, t_par)
                    emit(dict(kind="time", kernel="fa1_tc", **shape, **tl,
                              default=(B_r, B_c, MT, st) == tilings[0], ms=ms1,
                              tflops=flops / ms1 / 1e9, fa2_ms=ms2, ratio_fa1_fa2=ms1 / ms2,
                              ledger_gb=led1.hbm_bytes / 1e9,
                              ratio_traffic=led1.hbm_bytes / led2.hbm_bytes,
                              t_traffic_ms=t_traffic, t_parallel_ms=t_par, pred_ms=pred,
                              pred_ratio=pred / ms2, sms=sms))
                except Exception as e:
                    emit(dict(kind="time", kernel="fa1_tc", **shape, **tl, error=repr(e)[:800]))
            if N <= 1024 and BH <= 16 and not over_budget():
                # the existing plain fa1 kernel (CUDA cores, one thread per tile element)
                t = default_tiling("fa1", d, "fp16", causal)
                try:
                    def run_plain(s, t=t):
                        q, k, v, o, l2, m2, _L = s
                        fa1.run(q, k, v, o, l2, m2, scale, N, BH, 1, None, dummy, B_r=t.B_r,
                                B_c=t.B_c, dt="fp16", causal=causal, count=False,
                                threads=128)
                    msp = timed(run_plain, sets, max(3, args.reps // 3), warm=1)
                    emit(dict(kind="time", kernel="fa1_plain", **shape, B_r=t.B_r, B_c=t.B_c,
                              ms=msp, tflops=flops / msp / 1e9, fa2_ms=ms2,
                              ratio_fa1_fa2=msp / ms2))
                except Exception as e:
                    emit(dict(kind="time", kernel="fa1_plain", **shape, error=repr(e)[:800]))
            del sets, keep
            cuda.synchronize()
            if torch is not None:
                torch.cuda.empty_cache()
        except Exception as e:
            emit(dict(kind="time", **shape, error=repr(e)[:800]))


if __name__ == "__main__":
    main()
