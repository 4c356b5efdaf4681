"""Figure 12: the time model's error on measured kernel times, per kernel family.

Every `runtime_validation` row of the results data set (H100 and H200; forward and
backward; the pass's kernels summed): measured = CUPTI kernel time (median over
repetitions, warm clocks, inputs rotated so the L2 does not keep them;
`analysis.hwmeasure.time_config`); predicted = `iosim.timing` with the constants
fitted on the H100 rows, each H100 row at its 5-fold cross-validated prediction (the model
refitted without the row's fold: `cv_predicted_ms`), the H200 rows held out (only the
preset changes) and the blind rows at their frozen predictions. Drawn: per kernel family,
the share of rows whose |predicted / measured - 1| is at most x, forward passes left,
backward right, with lines at 10 % and 15 %. `generate` also places the measured H100
forward passes on the roofline (figure 16, `fig16_kernel_roofline`).

Remake: `flashsim figure fig12` (about 3-5 s: 80 model calls for the roofline numbers).
"""
from __future__ import annotations

import math
import statistics
import time

from ._style import save

NAME = "fig12_runtime_validation"

BAND = 0.10
#: the goal lines drawn: 10 % (the band of the fit) and 15 %
GOALS = (0.10, 0.15)
MAX_CALLS = 80

_LEVELS_CACHE: dict = {}


def _gpu_of(device: str):
    from analysis.fit_levels import GPU_OF_DEVICE
    return GPU_OF_DEVICE.get(device)


def _levels_of(c: dict, tiling, gpu: str) -> dict:
    """iosim.levels for one configuration with its measured tiling (cached)."""
    from iosim import Tiling
    from iosim import levels
    from analysis.fit_levels import config_kernel, problem_of
    key = (c["id"], tuple(tiling), gpu)
    if key not in _LEVELS_CACHE:
        kernel = config_kernel(c)
        _LEVELS_CACHE[key] = levels(c["algorithm"], problem_of(c), gpu, pass_=c["pass"],
                                    kernel=kernel, tiling=Tiling(*tiling))
    return _LEVELS_CACHE[key]


def flops_of(c: dict, tiling) -> float:
    """4 d x (score entries of the active tiles) x instances: the forward's two tile
    products, as the kernel computes them (partly masked causal tiles whole)."""
    import iosim
    rca = int(iosim.tile_sums(c["N"], tiling[0], tiling[1], c["causal"])[3])
    return 4.0 * c["d"] * rca * c["batch"] * c["heads"]


def _evenly(rows, k):
    """k of rows, evenly spaced in listed order (all when k >= len(rows))."""
    n = len(rows)
    if k >= n:
        return list(rows)
    return [rows[int(i * n / k)] for i in range(k)]


def select_roofline_rows(rows, gpu: str, max_calls: int | None):
    """The forward rows measured on `gpu`, at most max_calls, evenly spaced per family
    (each family keeps a share proportional to its size, at least one)."""
    from analysis.validate import BLIND_SPLITS
    fwd = [r for r in rows if r["config"]["pass"] == "fwd" and _gpu_of(r["device"]) == gpu
           and r.get("split") not in BLIND_SPLITS]
    if max_calls is None or len(fwd) <= max_calls:
        return fwd
    fams: dict = {}
    for r in fwd:
        fams.setdefault(r["family"], []).append(r)
    quota = {f: max(1, math.floor(len(rs) * max_calls / len(fwd))) for f, rs in fams.items()}
    # "at least one" can push the sum past max_calls: take the excess from the largest
    while sum(quota.values()) > max_calls and max(quota.values()) > 1:
        quota[max(quota, key=quota.get)] -= 1
    out = []
    for f, rs in fams.items():
        out += _evenly(rs, quota[f])
    return out


def generate(rows=None, data=None, gpu: str = "H100-SXM", max_calls: int | None = MAX_CALLS):
    """{"points": one per runtime_validation row, "stats": per (preset, split),
    "roofline": {"peaks", "points"}, "config", "calls", "seconds"}."""
    from iosim import get_hardware
    from analysis import results as R
    t0 = time.perf_counter()
    rows = R.load("runtime_validation", data=data) if rows is None else rows
    points, skipped = [], []
    for r in rows:
        g = _gpu_of(r["device"])
        if g is None:
            skipped.append({"id": r["config"]["id"], "device": r["device"]})
            continue
        if r.get("measured_ms") is None or r.get("predicted_ms") is None:
            skipped.append({"id": r["config"]["id"], "device": r["device"],
                            "status": r.get("status")})
            continue
        split, pred = r["split"], float(r["predicted_ms"])
        if r.get("cv_predicted_ms") is not None:      # H100: every row is fitted; plot its
            split, pred = "cv", float(r["cv_predicted_ms"])   # cross-validated prediction
        points.append({"id": r["config"]["id"], "gpu": g, "split": split,
                       "family": r.get("family") or r["config"].get("family"),
                       "pass": r["config"]["pass"], "measured_ms": float(r["measured_ms"]),
                       "predicted_ms": pred,
                       "rel_error": pred / float(r["measured_ms"]) - 1})
    stats = {}
    for key in sorted({(p["gpu"], p["split"]) for p in points}):
        ps = [p for p in points if (p["gpu"], p["split"]) == key]
        errs = [abs(p["rel_error"]) for p in ps]
        worst = max(ps, key=lambda p: abs(p["rel_error"]))
        stats[key] = {"n": len(ps), "median_abs": statistics.median(errs),
                      "worst_abs": abs(worst["rel_error"]), "worst_id": worst["id"],
                      "worst_rel": worst["rel_error"],
                      "within_band": sum(e <= BAND for e in errs)}
    # roofline: the forward passes measured on `gpu`
    hw = get_hardware(gpu)
    sel = select_roofline_rows(rows, gpu, max_calls)
    n_fwd = len(select_roofline_rows(rows, gpu, None))
    roof = []
    for r in sel:
        c = r["config"]
        lv = _levels_of(c, r["tiling"], gpu)
        fl = flops_of(c, r["tiling"])
        dram = lv["dram_read_bytes"] + lv["dram_write_bytes"]
        l2 = lv["l2_read_bytes"] + lv["l2_write_bytes"]
        achieved = fl / (float(r["measured_ms"]) * 1e-3)
        unit = "tensor" if r["family"] == "fa2_tc" else "fp32"
        peak = hw.fp16_tensor_flops if unit == "tensor" else hw.fp32_flops
        i_dram, i_l2 = fl / dram, fl / l2
        roof.append({"id": c["id"], "family": r["family"], "dtype": c["dtype"],
                     "causal": c["causal"], "split": r["split"], "flops": fl,
                     "dram_bytes": dram, "l2_bytes": l2, "measured_ms": float(r["measured_ms"]),
                     "achieved_flops": achieved, "intensity_dram": i_dram, "intensity_l2": i_l2,
                     "unit": unit,
                     "roof_dram": min(peak, i_dram * hw.hbm_bandwidth),
                     "roof_l2": min(peak, i_l2 * hw.l2_bandwidth),
                     "binds_dram": "memory" if i_dram * hw.hbm_bandwidth < peak else "compute"})
    for p in roof:
        p["fraction_of_roof"] = p["achieved_flops"] / min(p["roof_dram"], p["roof_l2"])
    return {"points": points, "stats": stats, "skipped": skipped,
            "roofline": {"gpu": hw.name,
                         "peaks": {"fp16_tensor_flops": hw.fp16_tensor_flops,
                                   "fp32_flops": hw.fp32_flops,
                                   "hbm_bandwidth": hw.hbm_bandwidth,
                                   "l2_bandwidth": hw.l2_bandwidth},
                         "points": roof, "forward_rows": n_fwd},
            "config": {"data_set": "runtime_validation", "band": BAND, "rows": len(points),
                       "roofline_gpu": hw.name, "roofline_points": len(roof),
                       "max_calls": max_calls},
            "calls": len(roof), "seconds": time.perf_counter() - t0}


def family_roof_summary(data) -> dict:
    """family -> {n, median achieved TFLOP/s, median fraction of its roof, median DRAM
    intensity}."""
    out = {}
    for f in {p["family"] for p in data["roofline"]["points"]}:
        ps = [p for p in data["roofline"]["points"] if p["family"] == f]
        out[f] = {"n": len(ps),
                  "median_tflops": statistics.median(p["achieved_flops"] for p in ps) / 1e12,
                  "max_tflops": max(p["achieved_flops"] for p in ps) / 1e12,
                  "median_fraction": statistics.median(p["fraction_of_roof"] for p in ps),
                  "median_intensity_dram": statistics.median(p["intensity_dram"] for p in ps)}
    return out


def errors_by_family(data, pass_=None) -> dict:
    """{family: [|predicted / measured - 1|, ...]} over every scored row (H100 rows at
    their cross-validated prediction, H200 rows held out, blind rows frozen)."""
    out: dict = {}
    for p in data["points"]:
        if pass_ is None or p["pass"] == pass_:
            out.setdefault(p["family"], []).append(abs(p["rel_error"]))
    return out


def plot(data):
    import matplotlib.pyplot as plt
    from ._style import error_cdf
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 4.4), constrained_layout=True, sharey=True)
    pts = data["points"]
    for ax, (pass_, what) in zip(axes, (("fwd", "forward"), ("bwd", "backward"))):
        n = sum(p["pass"] == pass_ for p in pts)
        error_cdf(ax, errors_by_family(data, pass_), goals=GOALS, xmax=0.4,
                  title=f"({'a' if pass_ == 'fwd' else 'b'}) {what} passes ({n} rows)")
    axes[1].set_ylabel("")
    devices = sorted({p["gpu"].split("-")[0] for p in pts})
    fig.suptitle("Time model: error of the predicted kernel time, per kernel family\n"
                 f"every measured pass on the {' and '.join(devices)}, each predicted without "
                 "its own row", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, {**data["config"], "calls": data["calls"]})


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
