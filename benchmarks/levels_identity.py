"""Dump `analysis.levels.levels` outputs to JSON, to check that a speed change alters no
result (a tool, not a test).

    PYTHONPATH=<tree> python3 benchmarks/levels_identity.py OUT.json [--n 1000]

Writes one JSON document: the outputs of model_speed.py --levels' configurations (the
same seeded draws as levels_sweep) and of every ok row of levels_measurement.jsonl
(analysis.levels.predict_row, as analysis.validate.levels_rows asks for them). Floats are
written with repr (exact round trip), so two dumps compare bit for bit with `cmp`.
"""
import json
import sys

import numpy as np

from iosim import Problem


def sweep_configs(n=1000, seed=0):
    """The draws of benchmarks/model_speed.py's levels_sweep, in its order."""
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


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    return x


def main():
    from analysis import results
    from analysis.levels import GPU_OF_DEVICE, levels, predict_row
    out = sys.argv[1]
    n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 1000
    sweep = [levels(alg, p, gpu, pass_=pass_, kernel=kern)
             for alg, p, gpu, pass_, kern in sweep_configs(n)]
    rows = [predict_row(r["config"], GPU_OF_DEVICE.get(r["device"], "H100-SXM"))
            for r in results.load("levels_measurement") if r.get("status") == "ok"]
    with open(out, "w") as f:
        json.dump({"sweep": _plain(sweep), "rows": _plain(rows)}, f, indent=0, sort_keys=True)
    print(f"{out}: {len(sweep)} sweep configurations, {len(rows)} measured rows")


if __name__ == "__main__":
    main()
