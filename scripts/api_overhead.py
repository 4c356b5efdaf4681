#!/usr/bin/env python3
"""Where does a `gpu.attention` call spend its time beyond the kernel? (H100 diagnosis)

ONE-OFF diagnosis (kept for the record; results: data set kind `host_time`).

For fa2, d=64, 16 instances, fp32, N in {512, 4096}: (1) the fast kernel launched
directly on preallocated buffers, back to back (kernel time); (2) gpu.attention on torch
tensors and (3) on numba device arrays, one call between CUDA events, synchronised after
each call as analysis.bench does; (4) cProfile of 20 torch-tensor calls (host time by
function). Prints a table; writes $OUT/api_overhead.json.
"""
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

import gpu  # noqa: E402
from gpu.forward import fa2_fast  # noqa: E402
from gpu._launch import new_counters  # noqa: E402

OUT = os.environ.get("OUT", "out")
os.makedirs(OUT, exist_ok=True)
res = {"device": torch.cuda.get_device_name(), "rows": []}


def events(fn, reps=20, sync_each=True):
    ts = []
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        if sync_each:
            b.synchronize()
        ts.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ts)


for N in (512, 4096):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, 16, N, 64), device="cuda", generator=g) for _ in range(3))
    B_r, B_c, thr = gpu.api.FA2_FAST_TILES[64]
    q3, k3, v3 = (cuda.as_cuda_array(x).reshape(16, N, 64) for x in (q, k, v))
    o3 = cuda.device_array((16, N, 64), np.float32)
    L2 = cuda.device_array((16, N), np.float32)
    ctr = new_counters(False)

    def kernel_only():
        fa2_fast.run(q3, k3, v3, o3, L2, 0.125, N, 16, 1, None, ctr, B_r=B_r, B_c=B_c,
                     dt="fp32", causal=False, count=False, threads=thr, shfl=True,
                     **gpu.api.fa2_fast_options(B_r, B_c, 64, thr))
    row = {"N": N, "kernel_back_to_back_ms": events(kernel_only, sync_each=False),
           "kernel_synced_ms": events(kernel_only)}
    row["api_torch_ms"] = events(lambda: gpu.attention(q, k, v))
    qn, kn, vn = (cuda.as_cuda_array(x) for x in (q, k, v))
    row["api_numba_ms"] = events(lambda: gpu.attention(qn, kn, vn))
    t0 = time.perf_counter()
    for _ in range(20):
        gpu.attention(q, k, v)
    torch.cuda.synchronize()
    row["api_torch_wall_ms"] = (time.perf_counter() - t0) / 20 * 1e3
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        gpu.attention(q, k, v)
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25)
    row["profile"] = s.getvalue()
    res["rows"].append(row)
    print({kk: vv for kk, vv in row.items() if kk != "profile"}, flush=True)
    print(row["profile"][:6000], flush=True)
with open(os.path.join(OUT, "api_overhead.json"), "w") as f:
    json.dump(res, f, indent=1)
