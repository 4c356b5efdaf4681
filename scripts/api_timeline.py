#!/usr/bin/env python3
"""GPU timeline of gpu.attention calls (torch.profiler / CUPTI sees Numba's kernels too):
which device operations one fa2 call makes, and how long each takes. H100 diagnosis
companion of scripts/api_overhead.py. Prints the tables; writes $OUT/api_timeline.txt.

ONE-OFF diagnosis (kept for the record).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import gpu  # noqa: E402
from gpu.forward import fa2_fast  # noqa: E402
from gpu._launch import new_counters  # noqa: E402

OUT = os.environ.get("OUT", "out")
os.makedirs(OUT, exist_ok=True)
N = int(os.environ.get("N", "4096"))
q, k, v = (torch.randn((1, 16, N, 64), device="cuda") for _ in range(3))
B_r, B_c, thr = gpu.api.FA2_FAST_TILES[64]
q3, k3, v3 = (cuda.as_cuda_array(x).reshape(16, N, 64) for x in (q, k, v))
o3 = cuda.device_array((16, N, 64), np.float32)
L2 = cuda.device_array((16, N), np.float32)
ctr = new_counters(False)


def kernel_only():
    fa2_fast.run(q3, k3, v3, o3, L2, 0.125, N, 16, 1, None, ctr, B_r=B_r, B_c=B_c, dt="fp32",
                 causal=False, count=False, threads=thr, shfl=True,
                 **gpu.api.fa2_fast_options(B_r, B_c, 64, thr))


text = []
for name, fn in (("kernel_only", kernel_only), ("api_torch", lambda: gpu.attention(q, k, v))):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
            torch.cuda.synchronize()
    t = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60)
    text.append(f"=== {name} N={N}, 5 calls\n{t}")
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    text.append("device events of the last call: " + "; ".join(
        f"{e.name[:40]} {e.time_range.elapsed_us():.0f}us" for e in evs[-6:]))
print("\n".join(text))
open(os.path.join(OUT, "api_timeline.txt"), "w").write("\n".join(text))
