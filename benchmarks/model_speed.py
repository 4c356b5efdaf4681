"""Speed of the iosim model on this machine (a benchmark, not a test).

    python3 benchmarks/model_speed.py

Prints: closed forms for 100,000 configurations (vectorised), and executing fa2 at
N=4096, d=64, one head (B_r = B_c = 64). Targets from the foundation issue: < 1 s and < 10 s.
With --levels: the L2 / DRAM model (iosim.levels) over 1,000 configurations
(N <= 32K; every modelled pass), target < 60 s on a 2-core machine (issue 14).
"""
import platform
import time

import numpy as np

from iosim import Problem, Tiling, closed_form_arrays, execute


def levels_configs(n=1000, seed=0):
    """The levels sweep's n random configurations, drawn in order from `seed`: (algorithm,
    Problem, GPU preset, pass, kernel); N <= 32K, the fa2 forward's three kernels and the
    plain fa1 / standard / backward passes, d 64 / 128, causal or not, batch x heads 1-64,
    grouped K/V. benchmarks/levels_identity.py dumps the model's outputs for the same."""
    rng = np.random.default_rng(seed)
    passes = [("fa2", "fwd", "auto", "fp16"), ("fa2", "fwd", "auto", "fp32"),
              ("fa2", "fwd", "plain", "fp32"), ("fa1", "fwd", "plain", "fp32"),
              ("standard", "fwd", "plain", "fp16"), ("fa2", "bwd", "plain", "fp16"),
              ("standard", "bwd", "plain", "fp16")]
    for _ in range(n):
        alg, pass_, kern, dt = passes[rng.integers(len(passes))]
        N = int(rng.choice([1024, 2048, 4096, 8192, 16384, 32768]))
        heads = int(rng.choice([1, 4, 8, 16, 32]))
        kv = heads // int(rng.choice([1, 2, 4])) if heads >= 4 else heads
        p = Problem(N=N, d=int(rng.choice([64, 128])), batch=int(rng.choice([1, 2])),
                    heads=heads, kv_heads=kv, dtype=dt, causal=bool(rng.random() < 0.5))
        yield alg, p, str(rng.choice(["H100-SXM", "H200", "A100-40GB"])), pass_, kern


def levels_sweep(n=1000, seed=0):
    """Seconds for `levels` over `levels_configs(n, seed)` (drawn as they are evaluated),
    after one warm-up call (numba compilation)."""
    from iosim import levels
    levels("fa2", Problem(N=1024, d=64, heads=4, dtype="fp16"), "H100-SXM")
    t0 = time.perf_counter()
    for alg, p, gpu, pass_, kern in levels_configs(n, seed):
        levels(alg, p, gpu, pass_=pass_, kernel=kern)
    return time.perf_counter() - t0


def main():
    import sys
    if "--levels" in sys.argv:
        print(f"levels, 1,000 configurations (N <= 32K): {levels_sweep():.1f} s")
        return
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
