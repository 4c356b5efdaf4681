"""Dump `iosim.predict_time` outputs to JSON, to check that a speed change alters no
time prediction (a tool, not a test; the companion of levels_identity.py).

    PYTHONPATH=<tree> python3 benchmarks/runtime_identity.py OUT.json [--n 300]

The first n of model_speed.py --levels' configurations (model_speed.levels_configs),
each predicted as analysis.validate does (iosim.predict_time with the pass and kernel);
floats written with repr (exact round trip), so two dumps compare bit for bit with `cmp`.
"""
import json
import sys

from levels_identity import _plain      # this folder: run as a script
from model_speed import levels_configs


def main():
    from iosim import predict_time
    out = sys.argv[1]
    n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 300
    res = []
    for alg, p, gpu, pass_, kern in levels_configs(n):
        try:
            res.append(predict_time(alg, p, gpu, pass_=pass_, kernel=kern))
        except ValueError as e:                   # a pass the time model cannot predict
            res.append({"error": str(e)})
    with open(out, "w") as f:
        json.dump(_plain(res), f, indent=0, sort_keys=True)
    print(f"{out}: {len(res)} configurations, "
          f"{sum('error' in r for r in res)} not predicted")


if __name__ == "__main__":
    main()
