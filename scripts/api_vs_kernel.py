#!/usr/bin/env python3
"""fa2 through `gpu.attention` against its kernel launched directly (H100 diagnosis).

ONE-OFF diagnosis (kept for the record; results: data set kind `host_time`).

For d in {64, 128}, N=4096, batch x heads=16, fp32, non-causal, the default tiling of
`gpu.attention` (gpu.api.FA2_FAST_TILES and fa2_fast_options): median ms of 20 calls
between CUDA events, enqueued back to back, inputs rotated over 3 torch sets, for
  kernel    gpu.forward.fa2_fast.run on preallocated outputs (what fa2_fast_variants.py times),
  kernel_tc the same with the other threads-per-row choice (TC 16 <-> 8) where it runs,
  api       gpu.attention(q, k, v) on the torch tensors (what analysis.bench times),
  host      wall-clock ms of one gpu.attention call's Python work (GPU idle before it).
Writes $OUT/api_vs_kernel.json and prints it.
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

import gpu  # noqa: E402
from gpu import api  # noqa: E402
from gpu.forward import fa2_fast  # noqa: E402
from gpu._launch import new_counters  # noqa: E402

OUT = os.environ.get("OUT", "out")
os.makedirs(OUT, exist_ok=True)
BH, N, REPS = 16, 4096, 20


def timed(fn, sets):
    for s in sets:
        fn(s)
    torch.cuda.synchronize()
    ev = []
    for r in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(sets[r % len(sets)])
        b.record()
        ev.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


rows = []
for d in (64, 128):
    g = torch.Generator(device="cuda").manual_seed(d)
    sets = [tuple(torch.randn((1, BH, N, d), device="cuda", generator=g) for _ in range(3))
            for _ in range(3)]
    B_r, B_c, thr = api.fa2_fast_default(d)
    opts = api.fa2_fast_options(B_r, B_c, d, thr)
    o3 = cuda.device_array((BH, N, d), np.float32)
    L2 = cuda.device_array((BH, N), np.float32)
    ctr = new_counters(False)

    def kernel(s, tc=None):
        q3, k3, v3 = (cuda.as_cuda_array(x, sync=False).reshape(BH, N, d) for x in s)
        o = dict(opts)
        if tc is not None:
            o["TC"] = tc
        fa2_fast.run(q3, k3, v3, o3, L2, 1 / np.sqrt(d), N, BH, 1, None, ctr, B_r=B_r,
                     B_c=B_c, dt="fp32", causal=False, count=False, threads=thr, shfl=True,
                     **o)
    row = dict(d=d, N=N, tiling=(B_r, B_c, thr), opts=opts, kernel_ms=timed(kernel, sets))
    other = 16 if opts.get("TC", 8) == 8 else 8
    if fa2_fast.plan(B_r, B_c, d, thr, other) is not None:
        row[f"kernel_tc{other}_ms"] = timed(lambda s: kernel(s, other), sets)
    row["api_ms"] = timed(lambda s: gpu.attention(*s), sets)
    hs = []
    for r in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gpu.attention(*sets[r % 3])
        hs.append((time.perf_counter() - t0) * 1e3)
    row["host_ms"] = statistics.median(hs)
    out = gpu.attention(*sets[0])
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.double() for x in sets[0]))
    row["rel_err"] = float((out.double() - ref).abs().max() / ref.abs().max())
    rows.append(row)
    print(json.dumps(row), flush=True)
    del sets, out, ref
    torch.cuda.empty_cache()
with open(os.path.join(OUT, "api_vs_kernel.json"), "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
