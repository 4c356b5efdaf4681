"""The time model (`iosim.timing`) fitted to and scored on measured runtime rows: each row's
launch features with its measured ms per launch (`row_features`), the robust least-squares
fit of the constants (`fit`, `fit_data`, `fit_best`) and one runtime_validation row per
measured row (`validate`)."""
from __future__ import annotations

import json
import math
from dataclasses import replace

from iosim import get_hardware
from iosim.memory import FITTED
from iosim.timing import RuntimeModel, family_key, launch_features, predict_launch
from iosim.timing.predict import _with_background

from analysis.fit_levels import predict_row, problem_of


# ---------------------------------------------------------------------------------------
# Fitting and validation on measured rows
# ---------------------------------------------------------------------------------------
def row_features(row: dict, gpu: str) -> tuple[list[dict], list[float]]:
    """(launch features, measured ms per launch in the same order) of a runtime row."""
    c = row["config"]
    hw = get_hardware(gpu)
    # the levels without the L2 model's background DRAM writes, added below from this
    # time prediction's own launch times (as iosim.predict_time does)
    lv = predict_row(c, hw, model=replace(FITTED, background_write_rate=0.0))
    rate = FITTED.background_write_rate
    # levels' background DRAM writes, from the constants on file
    feats = _with_background(launch_features(problem_of(c), lv, hw),
                             RuntimeModel.load() if rate > 0 else None, hw, rate)
    meas = row["measured"]["kernels"]
    ms = []
    for f in feats:
        hit = [k["ms"] for k in meas if family_key(k["name"]) == f["kernel"]]
        if len(hit) != 1:
            raise ValueError(f"{c['id']}: measured kernels {[k['name'][:30] for k in meas]} do not "
                             f"match the model's launch {f['name']}")
        ms.append(hit[0])
    return feats, ms


def fit(rows: list[dict], gpu: str = "H100-SXM", source: str = "") -> RuntimeModel:
    """Least squares on log(predicted / measured) per launch, over `rows`."""
    hw = get_hardware(gpu)
    data = []
    for r in rows:
        feats, ms = row_features(r, gpu)
        data += list(zip(feats, ms))
    return fit_data(data, hw, source)


#: g_mem, no longer fitted (form 9): an SM may draw the whole L2 / DRAM bandwidth (the H100's
#: SM count, 132: the memory terms take no imbalance short of a one-CTA grid), where the
#: fit on every H100 row had put it (131.7 at its upper bound, form 8 on 447 rows)
G_MEM = 132.0


#: the shared constants the fit adjusts: (start, lower bound, upper bound)
SHARED_PARAMS = {"e_l2": (0.5, 0.05, 1.0), "e_dram": (0.7, 0.05, 1.0),
                 "t_launch_ms": (0.004, 1e-4, 0.05), "w_sat": (8.0, 1.0, 64.0),
                 "e_local": (0.2, 0.005, 1.0), "kappa": (20.0, 0.1, 1000.0),
                 "kappa_c": (2.0, 1e-3, 200.0), "rho": (10.0, 1e-3, 2000.0),
                 "e_smem": (0.5, 0.01, 1.0),
                 "kappa_b": (20.0, 0.1, 1000.0), "e_dram_w": (0.1, 0.005, 1.0),
                 "sigma": (2000.0, 1.0, 1e6), "sigma_r": (20.0, 0.01, 1e4),
                 "kappa_c1": (2.0, 1e-3, 200.0),
                 "t_round_us": (0.3, 1e-3, 10.0), "t_miss_us": (0.2, 1e-3, 10.0),
                 "kappa_o": (2.0, 1e-3, 500.0), "t_cta_us": (1.0, 1e-3, 50.0),
                 "sigma_w": (2000.0, 1.0, 1e6), "w_sat_tc": (12.0, 1.0, 64.0)}


def fit_data(data: list, hw, source: str = "", fixed: dict | None = None,
             start_scale: float = 1.0, return_cost: bool = False) -> RuntimeModel:
    """The fit on (launch features, measured ms) pairs (robust least squares on the log
    ratio per launch, every constant bounded). fixed: constants held at a value;
    start_scale: multiplies every start value (to check that different starts agree)."""
    from scipy.optimize import least_squares
    fams = sorted({f["family"] for f, _ in data})
    names = [k for k in SHARED_PARAMS if k not in (fixed or {})]

    def unpack(x):
        e = {k: math.exp(v) for k, v in zip(fams, x[:len(fams)])}
        kw = {"g_mem": G_MEM, **(fixed or {})}
        kw.update({k: math.exp(v) for k, v in zip(names, x[len(fams):])})
        return RuntimeModel(e, source=source, **kw)

    def resid(x):
        m = unpack(x)
        return [math.log(predict_launch(f, m, hw)["predicted_ms"] / ms) for f, ms in data]
    x0 = [math.log(0.3 * start_scale)] * len(fams) + \
        [min(math.log(SHARED_PARAMS[k][2]), math.log(SHARED_PARAMS[k][0] * start_scale))
         for k in names]
    lo = [math.log(1e-5)] * len(fams) + [math.log(SHARED_PARAMS[k][1]) for k in names]
    hi = [math.log(1.0)] * len(fams) + [math.log(SHARED_PARAMS[k][2]) for k in names]
    sol = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05)
    m = unpack(sol.x)
    return (m, float(sol.cost)) if return_cost else m


def fit_best(data: list, hw, source: str = "", starts=(1.0, 0.5, 2.0), **kw) -> RuntimeModel:
    """fit_data from several starts; the fit of the lowest cost (the starts' costs go in
    `fit_starts` of the printed report by `fit_report`)."""
    fits = [fit_data(data, hw, source, start_scale=s, return_cost=True, **kw) for s in starts]
    best = min(fits, key=lambda mc: mc[1])[0]
    fit_best.last = [(s, c) for s, (_, c) in zip(starts, fits)]
    return best


def validate(rows: list[dict], model: RuntimeModel, gpu: str, features=None) -> list[dict]:
    """One runtime_validation row per measured row: measured and predicted pass time.
    features: (launch features, measured ms) of a single row, computed already."""
    out = []
    for r in rows:
        feats, ms = features or row_features(r, gpu)
        hw = get_hardware(gpu)
        launches = [predict_launch(f, model, hw) for f in feats]
        pred = sum(x["predicted_ms"] for x in launches)
        c = r["config"]
        out.append({"kind": "runtime_validation", "run_id": r["run_id"], "device": r["device"],
                    "date": r["date"], "commit": r["commit"], "versions": r["versions"],
                    "algorithm": c["algorithm"], "kernel": c.get("family"), "split": c.get("split"),
                    "config": c, "tiling": r.get("tiling"),
                    "measured_ms": r["measured"]["measured_ms"], "predicted_ms": pred,
                    "rel_error": pred / r["measured"]["measured_ms"] - 1,
                    "launches": [{"name": x["family"], "measured_ms": m, "predicted_ms": x["predicted_ms"],
                                  "binds": x["binds"], "share": x["share"]}
                                 for x, m in zip(launches, ms)],
                    "constants_source": model.source})
    return out


__all__ = ["row_features", "fit", "fit_data", "fit_best", "validate", "G_MEM", "SHARED_PARAMS",
           "trust_table", "write_trust_table", "main"]


# ---------------------------------------------------------------------------------------
# The trust table (iosim/timing/trust.json): blind errors per kernel family
# ---------------------------------------------------------------------------------------
#: what `trust_table` reads: the frozen-prediction rows of the blind sets (their split
#: starts with "blind"; status ok), never a fitted or cross-validated row
TRUST_KINDS = {"time": "runtime_validation", "dram": "levels_validation"}


def _blind(rows: list[dict]) -> list[dict]:
    from analysis.fit_levels import GPU_OF_DEVICE
    return [r for r in rows if str(r.get("split", "")).startswith("blind")
            and r.get("status", "ok") == "ok" and r.get("device") in GPU_OF_DEVICE]


def _r6(x: float) -> float:
    return float(f"{x:.6g}")


def _entry(rows: list[dict], preset: str) -> dict:
    """Ranges an entry's rows span: d, N, causal, grouped heads, tilings, runs."""
    c0 = rows[0]["config"]
    tilings = sorted({tuple(r.get("tiling") or r.get("measured_tiling") or r.get("predicted_tiling"))
                      for r in rows if (r.get("tiling") or r.get("measured_tiling")
                                        or r.get("predicted_tiling"))})
    return {"family": rows[0]["family"], "dtype": c0["dtype"], "pass": c0["pass"], "preset": preset,
            "n": len(rows), "d": sorted({r["config"]["d"] for r in rows}),
            "N": [min(r["config"]["N"] for r in rows), max(r["config"]["N"] for r in rows)],
            "causal": sorted({bool(r["config"]["causal"]) for r in rows}),
            "grouped": any(r["config"]["kv_heads"] != r["config"]["heads"] for r in rows),
            "unequal_kv": any(r["config"].get("N_k") not in (None, r["config"]["N"]) for r in rows),
            "windowed": any(r["config"].get("window") not in (None, [-1, -1]) for r in rows),
            "tilings": [list(t) for t in tilings],
            "run_ids": sorted({r["run_id"] for r in rows}),
            "splits": sorted({r["split"] for r in rows})}


def _groups(rows: list[dict]) -> dict:
    from analysis.fit_levels import GPU_OF_DEVICE
    from iosim.timing.trust import key_of
    out: dict = {}
    for r in rows:
        c = r["config"]
        preset = GPU_OF_DEVICE[r["device"]]
        out.setdefault(key_of(r["family"], c["dtype"], c["pass"], preset), (preset, []))[1].append(r)
    return out


#: blind sets whose frozen predictions were made by a form that prices the tensor-core
#: kernels' element-wise copies at d % 8 != 0 (form 12 on): their rows on that path are
#: its scores (blind12's two such passes were predicted before the path was modelled)
ELEMENTWISE_SPLITS = ("blind13",)


def _time_entry(rows: list[dict], preset: str) -> dict:
    """A time entry: the rows' ranges (`_entry`) and their |errors| (median, 95th
    percentile, worst, share within 10 %)."""
    import numpy as np
    e = np.abs([r["rel_error"] for r in rows])
    return {**_entry(rows, preset), "median": _r6(np.median(e)),
            "p95": _r6(np.percentile(e, 95)), "worst": _r6(e.max()),
            "within_10": _r6(float((e <= 0.10).mean()))}


def trust_table(data=None) -> dict:
    """The trust table from the results data set (`data`: its folder; default the
    repository's): per kernel family x dtype x pass x preset, the blind errors of the
    time model (runtime_validation rows: n, median, 95th percentile and worst |error|,
    share within 10 %) and of the DRAM model (levels_validation rows: share inside the
    15 % / 16 MB bound for reads and writes, inside the chip range, median |error|), with
    the d / N / causal / grouped / tiling ranges and run ids of the rows."""
    import numpy as np

    from analysis import results
    from analysis.fit_levels import within_chip_range
    out = {"about": "Generated by `python3 -m analysis.fit_runtime trust` from the blind rows "
                    "(split blind*, status ok: predictions frozen before measuring; never a "
                    "fitted row) of benchmarks/results/data/runtime_validation.jsonl (time) and "
                    "levels_validation.jsonl (DRAM). Errors are fractions (0.05 = 5 %). Read by "
                    "iosim.timing.trust.",
           "command": "python3 -m analysis.fit_runtime trust", "time": {}, "dram": {}}
    rt = _blind(results.load(TRUST_KINDS["time"], data=data))
    rt = [r for r in rt if r.get("rel_error") is not None]
    for key, (preset, rows) in sorted(_groups(rt).items()):
        out["time"][key] = _time_entry(rows, preset)
    lv = [r for r in _blind(results.load(TRUST_KINDS["dram"], data=data))
          if r.get("within_bound") and r.get("measured") and r.get("predicted")]
    for key, (preset, rows) in sorted(_groups(lv).items()):
        bound = [all(r["within_bound"].values()) for r in rows]
        rng = [all(within_chip_range(r["predicted"], r["measured"]).values()) for r in rows]

        def med(k):
            e = [abs(r["rel_error"][k]) for r in rows if r["rel_error"].get(k) is not None]
            return _r6(float(np.median(e))) if e else None
        out["dram"][key] = {**_entry(rows, preset), "within_bound": _r6(float(np.mean(bound))),
                            "within_range": _r6(float(np.mean(rng))),
                            "median_read": med("dram_read_bytes"),
                            "median_write": med("dram_write_bytes")}
    # the element-wise copy path of the tensor-core kernels, on its own: its blind rows
    from iosim.timing.trust import ELEMENTWISE_FAMILIES
    ew = [r for r in rt if r["split"] in ELEMENTWISE_SPLITS and r["config"]["d"] % 8
          and r["family"] in ELEMENTWISE_FAMILIES]
    out["time_elementwise"] = {key: _time_entry(rows, preset)
                               for key, (preset, rows) in sorted(_groups(ew).items())}
    out["rows"] = {"time": len(rt), "dram": len(lv), "time_elementwise": len(ew)}
    return out


def write_trust_table(path=None, data=None) -> str:
    from iosim.timing.trust import TABLE_PATH
    path = path or TABLE_PATH
    with open(path, "w") as f:
        json.dump(trust_table(data), f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m analysis.fit_runtime",
        description="trust: regenerate iosim/timing/trust.json, the blind errors per kernel "
                    "family that every time and DRAM prediction quotes (--check: compare with "
                    "the committed file instead, exit 1 where it differs)")
    ap.add_argument("what", choices=("trust",))
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    a = ap.parse_args(argv)
    from iosim.timing.trust import TABLE_PATH
    if a.check:
        with open(TABLE_PATH) as f:
            same = json.load(f) == json.loads(json.dumps(trust_table()))
        print(f"{TABLE_PATH}: {'up to date' if same else 'differs from the data set: regenerate'}")
        return 0 if same else 1
    print(f"wrote {write_trust_table()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
