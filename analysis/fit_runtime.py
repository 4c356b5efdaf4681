"""The time model (`iosim.timing`) fitted to and scored on measured runtime rows: each row's
launch features with its measured ms per launch (`row_features`), the robust least-squares
fit of the constants (`fit`, `fit_data`, `fit_best`) and one runtime_validation row per
measured row (`validate`)."""
from __future__ import annotations

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
                 "sigma_w": (2000.0, 1.0, 1e6)}


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


__all__ = ["row_features", "fit", "fit_data", "fit_best", "validate", "G_MEM", "SHARED_PARAMS"]
