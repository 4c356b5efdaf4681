#!/usr/bin/env python3
"""ONE-OFF tuning script (not part of the product): time the tensor-core fa2 kernel's
tilings against PyTorch SDPA on one GPU, and profile the host time of a call. Its
results chose gpu.api's FA2_TC_TILES / FA2_TC_MT on the H100 (data set kind `tc_tilings`
and `host_time`, benchmarks/results/data/). The checks it used to run are
`flashsim check --suite tc`.

    python3 scripts/tc_tilings_time.py [--part time,profile] [--quick]

time: N in {4096, 8192}, d in {64, 128}, batch x heads = 16, causal off and on: each
  tensor-core tiling in VARIANTS, the CUDA-core fa2 kernel on the same fp16 inputs, and
  PyTorch SDPA MATH / EFFICIENT / FLASH, all in this run on this device. CUDA events around
  each call, 3 warm-up calls, median of 20, inputs rotated over sets larger than 2 x L2.
  Two figures for our kernels: `call` (gpu.attention as a user calls it, Python included)
  and `kernel` (the compiled kernel launched on preallocated arrays).
profile: cProfile of 300 gpu.attention calls (N=4096, d=64, fp16) -> $OUT/call_profile.txt;
  then host time per call with gpu._launch's fast repeat launch on and off.
Writes $OUT/tc_tilings_time.json. Needs torch with CUDA.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 5):
    sys.exit(f"numpy {np.__version__}: numba-cuda 0.30.4 needs numpy < 2.5 (carry a 2.4 wheel)")

import torch  # noqa: E402
from numba import cuda  # noqa: E402

import gpu  # noqa: E402
from gpu.forward import fa2_tc  # noqa: E402
from gpu.forward._band import band_args  # noqa: E402
from gpu._launch import dummy_mask, new_counters  # noqa: E402

OUT = os.environ.get("OUT", os.path.join(ROOT, "out"))
os.makedirs(OUT, exist_ok=True)
L2_BYTES = 50 * 2 ** 20
WARM, REPS = 3, 20

#: (B_r, B_c, MT) variants timed at each d (MT: m-tiles of 16 rows per warp)
VARIANTS = {64: [(128, 64, 1), (64, 64, 1), (128, 64, 2), (64, 64, 2), (128, 32, 2),
                 (64, 32, 2), (256, 64, 2)],
            128: [(64, 64, 1), (128, 64, 1), (64, 32, 1), (128, 32, 2), (64, 16, 2)]}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="time,profile")
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--json", default="tc_tilings_time.json", help="file name under $OUT")
    return ap.parse_args()


# ------------------------------------------------------------------------------- timing
def n_sets(N, d, bh):
    per = 3 * bh * N * d * 2
    return max(2, math.ceil(2 * L2_BYTES / per) + 1)


def time_calls(fn, sets):
    for w in range(WARM):
        fn(*sets[w % len(sets)])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(REPS)]
    for r in range(REPS):
        ev[r][0].record()
        fn(*sets[r % len(sets)])
        ev[r][1].record()
    torch.cuda.synchronize()
    ts = [a.elapsed_time(b) for a, b in ev]
    return statistics.median(ts), min(ts)


def tc_kernel_fn(N, d, bh, causal, B_r, B_c, MT=1):
    """A launcher of the compiled tensor-core kernel on preallocated outputs."""
    kern = fa2_tc.get_kernel(B_r, B_c, d, causal, False, False, MT)
    shmem = fa2_tc.layout(B_r, B_c, d)["bytes"]
    o = torch.empty((bh, N, d), dtype=torch.float16, device="cuda")
    L = torch.empty((bh, N), dtype=torch.float32, device="cuda")
    ov = cuda.as_cuda_array(o, sync=False)
    Lv = cuda.as_cuda_array(L, sync=False)
    ctr = new_counters(False)
    mk = dummy_mask()
    grid = (-(-N // B_r), bh)
    sc = np.float32(fa2_tc.LOG2E / math.sqrt(d))
    from gpu import _philox
    from gpu._launch import launch

    def fn(q, k, v):
        qv, kv_, vv = (cuda.as_cuda_array(x, sync=False) for x in (q, k, v))
        launch(kern, grid, fa2_tc.threads_per_block(B_r, MT), shmem, qv, kv_, vv, ov, Lv, sc, np.int64(N),
               np.int64(N), *band_args(N, N, causal)[1:],   # N_k, lo, hi (gpu.forward._band)
               np.int64(bh), np.int64(1), mk, ctr,
               *_philox.kernel_args())   # no dropout
    return fn


def time_point(N, d, causal, results):
    bh = 16
    flops = 4.0 * N * N * d * bh * (0.5 if causal else 1.0)
    ns = n_sets(N, d, bh)
    g = torch.Generator(device="cuda").manual_seed(N + d)
    sets = [tuple(torch.randn((1, bh, N, d), generator=g, device="cuda").half()
                  for _ in range(3)) for _ in range(ns)]
    sets3 = [tuple(x.reshape(bh, N, d) for x in s) for s in sets]
    rows = []

    def add(impl, ms_med, ms_min, **extra):
        row = dict(impl=impl, N=N, d=d, causal=causal, batch_heads=bh, dtype="fp16",
                   ms_median=ms_med, ms_min=ms_min,
                   tflops=flops / (ms_med * 1e-3) / 1e12 if ms_med else None, sets=ns, **extra)
        rows.append(row)
        results["timing"].append(row)
        print(f"  {impl:28s} N={N:5d} d={d:3d} causal={causal!s:5s} "
              f"{ms_med:8.3f} ms  {row['tflops']:6.1f} TFLOP/s", flush=True)

    for (B_r, B_c, MT) in VARIANTS[d]:
        if not fa2_tc.supports(B_r, B_c, d, MT=MT):
            continue
        try:
            fn = tc_kernel_fn(N, d, bh, causal, B_r, B_c, MT)
            add(f"fa2_tc_kernel_{B_r}x{B_c}_mt{MT}", *time_calls(fn, sets3), B_r=B_r, B_c=B_c,
                MT=MT)
        except Exception as exc:
            results["errors"].append(f"tc {B_r}x{B_c} MT={MT} N={N} d={d}: {exc!r}")
            traceback.print_exc()
    from gpu._launch import fast_launch
    for fast in (True, False):   # what a user calls: gpu.attention with its default tiling
        try:                     # (False: every launch through Numba's dispatcher)
            with fast_launch(fast):
                add("fa2_tc_call_default" + ("" if fast else "_numba_launch"), *time_calls(
                    lambda q, k, v: gpu.attention(q, k, v, causal=causal, kernel="tc"),
                    sets))
        except Exception as exc:
            results["errors"].append(f"tc call N={N} d={d} fast_launch={fast}: {exc!r}")
    try:   # the CUDA-core kernel on the same fp16 inputs (its default tiling)
        add("fa2_cudacore_call", *time_calls(
            lambda q, k, v: gpu.attention(q, k, v, causal=causal, kernel="fast"), sets))
    except Exception as exc:
        results["errors"].append(f"fa2 cuda-core N={N} d={d}: {exc!r}")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for name, be in (("torch_math", SDPBackend.MATH), ("torch_efficient",
                     SDPBackend.EFFICIENT_ATTENTION), ("torch_flash", SDPBackend.FLASH_ATTENTION)):
        if name == "torch_math" and N > 8192:
            continue
        try:
            with sdpa_kernel(be):
                add(name, *time_calls(lambda q, k, v: torch.nn.functional.
                                      scaled_dot_product_attention(q, k, v, is_causal=causal),
                                      sets))
        except Exception as exc:
            results["errors"].append(f"{name} N={N} d={d}: {exc!r}")
    del sets, sets3
    torch.cuda.empty_cache()
    return rows


def main():
    args = parse_args()
    parts = args.part.split(",")
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = cuda.get_current_device()
    results = dict(device=torch.cuda.get_device_name(), cc=list(dev.compute_capability),
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                   versions=versions(), timing=[], errors=[])

    def save():
        with open(os.path.join(OUT, args.json), "w") as f:
            json.dump(results, f, indent=1, default=str)

    save()
    if "time" in parts:
        points = [(4096, 64, False), (4096, 64, True), (4096, 128, False), (4096, 128, True),
                  (8192, 64, False), (8192, 128, False)]
        if args.quick:
            points = points[:1]
        for N, d, causal in points:
            try:
                time_point(N, d, causal, results)
            except Exception as exc:
                traceback.print_exc()
                results["errors"].append(f"time N={N} d={d} causal={causal}: {exc!r}")
            save()
    if "profile" in parts:
        import cProfile
        import io
        import pstats
        q, k, v = (torch.randn((1, 16, 4096, 64), device="cuda").half() for _ in range(3))
        for _ in range(5):
            gpu.attention(q, k, v)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        pr.enable()
        for _ in range(300):
            gpu.attention(q, k, v)
        pr.disable()
        host = (time.perf_counter() - t0) / 300
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(40)
        with open(os.path.join(OUT, "call_profile.txt"), "w") as f:
            f.write(f"host time per gpu.attention call under cProfile: {host * 1e3:.3f} ms\n")
            f.write(buf.getvalue())
        from gpu._launch import fast_launch
        q32, k32, v32 = (x.float() for x in (q, k, v))
        results["host_ms_per_call"] = {}
        samples: dict = {}
        # fast repeat launches on and off, interleaved over 7 rounds of 200 calls each
        # (host timings drift by 2x between runs; interleaving keeps the pair comparable)
        for rnd in range(7):
            for fast in (True, False):
                for name, qkv in (("fp16_tc", (q, k, v)), ("fp32_fast", (q32, k32, v32))):
                    with fast_launch(fast):
                        for _ in range(3):
                            gpu.attention(*qkv)
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(200):
                            gpu.attention(*qkv)
                        ms = (time.perf_counter() - t0) / 200 * 1e3
                        torch.cuda.synchronize()
                    key = f"{name}_{'fast_launch' if fast else 'numba_launch'}"
                    samples.setdefault(key, []).append(ms)
        for key, ms in samples.items():
            results["host_ms_per_call"][key] = dict(median=statistics.median(ms), all=ms)
            print(f"host ms per call (enqueue, no profiler) {key}: median "
                  f"{statistics.median(ms):.3f} of {[round(x, 3) for x in ms]}", flush=True)
    print(f"errors: {results['errors']}")
    save()
    return 1 if results['errors'] else 0


if __name__ == "__main__":
    sys.exit(main())
