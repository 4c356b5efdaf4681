"""5-fold cross-validation of re-centred fa1 edges (a tool: prints, writes nothing).

    PYTHONPATH=<tree> python3 benchmarks/l2_point_cv.py

Folds by sha256(config id)[1] mod 5 (analysis.validate.cv_fold), as the v8-v10 fits of the
L2 model (docs/models-history.md). Rows: every ok H100 row of levels_measurement.jsonl, plus one row per
configuration and machine of levels_repeat.jsonl (B, C, D: the mean of that machine's
repeats), in the fold of its configuration id (so a configuration's machines are never
split between fit and test). Each fold picks the candidate with the most rows inside the bound on the other four
(ties: the median |log(pred / meas)| of DRAM reads and writes) and is scored on its own
rows. H200 rows are not used.
"""
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from l2_edge_spread import machine_of   # this folder: run as a script

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "results" / "data"


def load(name):
    return [json.loads(x) for x in (DATA / f"{name}.jsonl").read_text().splitlines() if x.strip()]


def h100_rows():
    rows = [r for r in load("levels_measurement")
            if r.get("status") == "ok" and r["device"] == "NVIDIA H100 80GB HBM3"]
    rep = {}
    for r in load("levels_repeat"):
        if r.get("status") == "ok" and r["device"] == "NVIDIA H100 80GB HBM3":
            rep.setdefault((r["config"]["id"], machine_of(r, "B")), []).append(r)
    for (cid, mach), rs in sorted(rep.items()):
        # one row per configuration and machine: the mean of that machine's repeats
        m = {k: float(np.mean([x["measured"][k] for x in rs])) for k in rs[0]["measured"]
             if isinstance(rs[0]["measured"][k], (int, float))}
        rows.append(dict(rs[0], measured=m, machine=mach))
    return rows


def candidates():
    from iosim.memory import FITTED_V10
    out = {"v10 (rmw 0.93)": FITTED_V10}
    for f in (0.89, 0.90, 0.91, 0.92, 0.94, 0.95, 0.96, 0.97):
        out[f"rmw {f}"] = replace(FITTED_V10, private_rmw_capacity=f)
    for cf in (0.72, 0.78):
        out[f"C {cf}"] = replace(FITTED_V10, capacity_fraction=cf)
    return out


def score(rows, model):
    from analysis.fit_levels import compare
    res = {}
    for r, p, err, ok in compare(rows, model):
        e = [abs(math.log(max(p[k], 1e6) / max(r["measured"][k], 1e6)))
             for k in ("dram_read_bytes", "dram_write_bytes")]
        res[(r["config"]["id"], r.get("machine", r["run_id"]))] = (all(ok.values()), e)
    return res


def main():
    from analysis.validate import cv_fold
    rows = h100_rows()
    cands = candidates()
    sc = {name: score(rows, m) for name, m in cands.items()}
    keys = list(next(iter(sc.values())))
    fold = {k: cv_fold(k[0]) for k in keys}
    print(f"{len(keys)} H100 rows ({sum(1 for k in keys if k[1] in ('B', 'C', 'D'))} repeat rows "
          f"of machines B, C, D)")
    for name, s in sc.items():
        fa1 = [k for k in keys if k[0].startswith("fwd_fa1")]
        print(f"  {name:<16} all rows inside {sum(s[k][0] for k in keys):>4}   fa1 "
              f"{sum(s[k][0] for k in fa1):>3}/{len(fa1)}   without the B rows "
              f"{sum(s[k][0] for k in keys if k[1] != 'B'):>4}   median |log err| fa1 "
              f"{np.median([x for k in fa1 for x in s[k][1]]):.3f}")
    held = {name: 0 for name in ("cv",)}
    picks = []
    tot = 0
    for f in range(5):
        train = [k for k in keys if fold[k] != f]
        test = [k for k in keys if fold[k] == f]
        best = min(cands, key=lambda n: (-sum(sc[n][k][0] for k in train),
                                          float(np.median([x for k in train for x in sc[n][k][1]]))))
        picks.append(best)
        tot += sum(sc[best][k][0] for k in test)
    base = sum(sc["v10 (rmw 0.93)"][k][0] for k in keys)
    print(f"folds picked {picks}: {tot} of {len(keys)} held-out-fold rows inside (v10 on all: {base})")


if __name__ == "__main__":
    main()
