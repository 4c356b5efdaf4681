"""Speed of the iosim model on this machine (a benchmark, not a test).

    python3 benchmarks/model_speed.py

Prints: closed forms for 100,000 configurations (vectorised), and executing fa2 at
N=4096, d=64, one head (B_r = B_c = 64). Targets from the foundation issue: < 1 s and < 10 s.
"""
import platform
import time

import numpy as np

from iosim import Problem, Tiling, closed_form_arrays, execute


def main():
    rng = np.random.default_rng(0)
    n = 100_000
    N = rng.integers(128, 16385, n); d = rng.choice([32, 64, 128], n)
    Br = rng.choice([16, 32, 64, 128], n); Bc = rng.choice([16, 32, 64, 128, 256], n)
    causal = rng.random(n) < 0.5
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for alg in ("standard", "fa1", "fa2"):
            closed_form_arrays(alg, N, d, Br, Bc, causal=causal, itemsize=2, instances=16)
        best.append(time.perf_counter() - t0)
    print(f"closed forms, 3 algorithms x {n:,} configurations: {min(best):.3f} s (best of 5)")
    t0 = time.perf_counter()
    execute("fa2", Problem(N=4096, d=64), Tiling(64, 64))
    print(f"execute fa2 N=4096 d=64 one head, 64x64 tiles: {time.perf_counter() - t0:.2f} s")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")


if __name__ == "__main__":
    main()
