#!/usr/bin/env python3
"""Run gpu.forward.fa2_tc on a few small configurations, one launch each, for compute-sanitizer.

ONE-OFF investigation of a racecheck hazard, fixed (kept for the record; the routine check is `flashsim check --sanitizer racecheck`).

    compute-sanitizer --tool racecheck python3 scripts/tc_race_probe.py [names...]

Each configuration is launched alone, so a sanitizer's report names the kernel (its
name carries B_r, B_c, d, causal, mask, count, MT). Prints whether O matches the plain
CUDA-core fa2 on the same inputs (max abs difference) so a hazard can be told apart
from a wrong result. Names (default all): see PROBES.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import gpu  # noqa: E402
from gpu import api  # noqa: E402

#: name -> (N, d, B_r, B_c, MT, causal, sparse block mask, count)
PROBES = {
    "d48_mt2_causal_mask_count": (333, 48, 64, 32, 2, True, True, True),
    "d48_mt2_causal_mask": (333, 48, 64, 32, 2, True, True, False),
    "d48_mt1_causal_mask": (333, 48, 64, 32, 1, True, True, False),
    "d48_mt2_causal": (333, 48, 64, 32, 2, True, False, False),
    "d48_mt2": (333, 48, 64, 32, 2, False, False, False),
    "d64_mt2_causal_mask": (333, 64, 64, 32, 2, True, True, False),
    "d48_mt2_mask": (333, 48, 64, 32, 2, False, True, False),
}


def block_mask(T_r, T_c):
    rng = np.random.default_rng(7)
    m = rng.random((T_r, T_c)) < 0.6
    m[0, :] = False
    m[1:, 0] = True
    return m


def main(names):
    for name in names or PROBES:
        N, d, B_r, B_c, MT, causal, sparse, count = PROBES[name]
        rng = np.random.default_rng(0)
        q, k, v = (cuda.to_device(rng.standard_normal((1, 4, N, d)).astype(np.float16))
                   for _ in range(3))
        bm = block_mask(-(-N // B_r), -(-N // B_c)) if sparse else None
        api.FA2_TC_MT[(B_r, B_c, d)] = MT
        kw = dict(causal=causal, block_rows=B_r, block_cols=B_c, block_mask=bm,
                  poison=True)   # an element no kernel writes shows as NaN
        out = gpu.attention(q, k, v, kernel="tc", count_traffic=count, **kw)
        O = (out[0] if count else out).copy_to_host().astype(np.float64)
        ref = gpu.attention(q, k, v, kernel="plain", **kw).copy_to_host().astype(np.float64)
        print(f"{name}: finite={np.isfinite(O).all()} max|O - plain fa2|="
              f"{np.nanmax(np.abs(O - ref)):.3e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
