"""Dump `iosim.levels` outputs to JSON, to check that a speed change alters no
result (a tool, not a test).

    PYTHONPATH=<tree> python3 benchmarks/levels_identity.py OUT.json [--n 1000]

Writes one JSON document: the outputs of model_speed.py --levels' configurations (the
same draws, model_speed.levels_configs) and of every ok row of levels_measurement.jsonl
(analysis.fit_levels.predict_row, as analysis.validate.levels_rows asks for them). Floats are
written with repr (exact round trip), so two dumps compare bit for bit with `cmp`.
"""
import json
import sys

import numpy as np

from model_speed import levels_configs   # this folder: run as a script


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
    from analysis.fit_levels import GPU_OF_DEVICE, predict_row
    from iosim import levels
    out = sys.argv[1]
    n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 1000
    sweep = [levels(alg, p, gpu, pass_=pass_, kernel=kern)
             for alg, p, gpu, pass_, kern in levels_configs(n)]
    rows = [predict_row(r["config"], GPU_OF_DEVICE.get(r["device"], "H100-SXM"))
            for r in results.load("levels_measurement") if r.get("status") == "ok"]
    with open(out, "w") as f:
        json.dump({"sweep": _plain(sweep), "rows": _plain(rows)}, f, indent=0, sort_keys=True)
    print(f"{out}: {len(sweep)} sweep configurations, {len(rows)} measured rows")


if __name__ == "__main__":
    main()
