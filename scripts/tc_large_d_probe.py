#!/usr/bin/env python3
"""ONE-OFF probe (not part of the product): time the fa2 tensor-core forward kernel at large
and padded head dims (issue 18) against PyTorch SDPA FLASH on one GPU, in fp16 and bf16.

    python3 scripts/tc_large_d_probe.py [--d 256,192,160,111] [--N 4096] [--bh 16]
                                        [--tiles 128x64,64x64,128x32,64x32] [--causal]

For each d and dtype: the kernel alone (gpu.forward.fa2_tc.run on preallocated device
arrays; bf16 as uint16 bits), each tiling that fits the device's shared memory, CUDA events,
3 warm-up launches, median of 10; PyTorch FLASH (then EFFICIENT if FLASH refuses) on the
same shapes; TFLOP/s at 4 N^2 d per head (halved when causal). Prints a table and writes
$OUT/tc_large_d_probe.json (or ./ without $OUT). Needs torch with CUDA and numpy < 2.5.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", default="256,192,160,111")
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--bh", type=int, default=16)
    ap.add_argument("--tiles", default="128x64,64x64,128x32,64x32")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    import torch
    from numba import cuda
    from gpu import _launch
    from gpu.forward import fa2_tc
    limit = _launch.device_smem_limit()
    N, bh, causal = a.N, a.bh, a.causal
    rows = []

    def median_ms(fn, event, sync):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(10):
            e0, e1 = event(), event()
            e0.record()
            fn()
            e1.record()
            sync(e1)
            ts.append(e0.elapsed_time(e1))
        return statistics.median(ts)

    for d in (int(x) for x in a.d.split(",")):
        flop = 4.0 * N * N * d * bh * (0.5 if causal else 1.0)
        for dt in a.dtypes.split(","):
            tdt = torch.float16 if dt == "fp16" else torch.bfloat16
            g = torch.Generator(device="cuda").manual_seed(d)
            q, k, v = (torch.randn((1, bh, N, d), generator=g, device="cuda").to(tdt)
                       for _ in range(3))
            F = torch.nn.functional
            from torch.nn.attention import SDPBackend, sdpa_kernel
            for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
                try:
                    with sdpa_kernel(be):
                        ms = median_ms(lambda: F.scaled_dot_product_attention(
                            q, k, v, is_causal=causal), lambda: torch.cuda.Event(
                                enable_timing=True), lambda e: e.synchronize())
                    rows.append(dict(d=d, dt=dt, kernel=f"torch {be.name}", ms=ms,
                                     tflops=flop / ms / 1e9))
                    break
                except Exception as exc:    # FLASH may refuse a shape: try the next one
                    rows.append(dict(d=d, dt=dt, kernel=f"torch {be.name}",
                                     error=repr(exc)[:120]))
            npdt = np.float16 if dt == "fp16" else np.uint16
            host = [x.reshape(bh, N, d).cpu().view(torch.int16).numpy().view(npdt)
                    for x in (q, k, v)]
            dq, dk, dv = (cuda.to_device(np.ascontiguousarray(x)) for x in host)
            o = cuda.device_array((bh, N, d), npdt)
            L = cuda.device_array((bh, N), np.float32)
            counters = _launch.new_counters(False)
            for tl in a.tiles.split(","):
                B_r, B_c = (int(x) for x in tl.split("x"))
                if not fa2_tc.supports(B_r, B_c, d, dt, smem_limit=limit):
                    rows.append(dict(d=d, dt=dt, kernel=f"fa2_tc {tl}", error="does not fit"))
                    continue

                def launch():
                    fa2_tc.run(dq, dk, dv, o, L, 1.0 / math.sqrt(d), N, bh, 1, None,
                               counters, B_r=B_r, B_c=B_c, dt=dt, causal=causal, count=False)
                try:
                    ms = median_ms(launch, cuda.event, lambda e: e.synchronize())
                except Exception as exc:
                    rows.append(dict(d=d, dt=dt, kernel=f"fa2_tc {tl}", error=repr(exc)[:200]))
                    continue
                out = torch.as_tensor(o.copy_to_host().view(np.int16)).view(tdt).cuda()
                ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                     is_causal=causal)[0].to(tdt)
                err = float((out.double() - ref.double()).norm() / ref.double().norm())
                rows.append(dict(d=d, dt=dt, kernel=f"fa2_tc {tl}", ms=ms,
                                 tflops=flop / ms / 1e9, rel_err_vs_fp32_sdpa=err))
    for r in rows:
        if "ms" in r:
            extra = (f"  err {r['rel_err_vs_fp32_sdpa']:.2e}" if "rel_err_vs_fp32_sdpa" in r
                     else "")
            print(f"d={r['d']:<4} {r['dt']:<5} {r['kernel']:<32} {r['ms']:8.3f} ms "
                  f"{r['tflops']:7.1f} TFLOP/s{extra}")
        else:
            print(f"d={r['d']:<4} {r['dt']:<5} {r['kernel']:<32} {r['error']}")
    path = os.path.join(os.environ.get("OUT", "."), "tc_large_d_probe.json")
    with open(path, "w") as f:
        json.dump(dict(N=N, bh=bh, causal=causal, device=torch.cuda.get_device_name(),
                       rows=rows), f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
