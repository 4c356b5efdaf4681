"""Figure 11: the L2 / DRAM model's error on DRAM reads and writes, per kernel family.

For every `levels_measurement` row of the results data set with status ok (Nsight
Compute on the H100 and the H200: `dram__bytes_read` / `dram__bytes_write` summed over
the pass's kernels, each launched with a cold L2 since ncu flushes it before each
kernel), the prediction of `analysis.fit_levels.predict_row(config, gpu)` (the preset of the
measuring device, `analysis.fit_levels.GPU_OF_DEVICE`) against the measurement. Drawn: per
kernel family (`analysis.validation_configs.family_of`), the share of rows whose
|predicted / measured - 1| is at most x, for reads (top) and writes (bottom), forward
(left) and backward (right) passes, with lines at 10 % and 15 %. The model's bound is 15 %
or 16 MB, whichever is larger (`iosim.memory.within`; `summary` counts the rows inside
it), so small rows far right on the x axis may still be inside the bound. Each point also
records the register spill bytes per thread (ptxas, `iosim.launch.plan.SPILLS`): that local
memory traffic is measured and not modelled.

Remake: `flashsim figure fig11` (one model call per row: about 6-10 s).
"""
from __future__ import annotations

import re
import time

from ._style import save

NAME = "fig11_levels_validation"

BAND = 0.15
#: the goal lines drawn: 10 % and the bound's 15 %
GOALS = (0.10, 0.15)
METRICS = (("dram_read_bytes", "DRAM reads"), ("dram_write_bytes", "DRAM writes"))


def generate(rows=None, data=None, select=None):
    """One point per ok row: {"points": [...], "config", "seconds"}. rows: measured
    levels rows (default: all of the data set); select: optional predicate on a row."""
    from analysis import results as R
    from analysis.fit_levels import GPU_OF_DEVICE, predict_row
    from iosim.memory import within
    from analysis.validation_configs import family_of
    t0 = time.perf_counter()
    rows = R.load("levels_measurement", data=data) if rows is None else rows
    points, skipped = [], []
    for r in rows:
        if r.get("status") != "ok" or (select is not None and not select(r)):
            continue
        gpu = GPU_OF_DEVICE.get(r["device"])
        if gpu is None:
            skipped.append({"id": r["config"]["id"], "device": r["device"],
                            "why": "no preset for this device"})
            continue
        c, m = r["config"], r["measured"]
        pred = predict_row(c, gpu)
        pt = {"id": c["id"], "device": r["device"], "gpu": gpu, "family": family_of(c),
              "pass": c.get("pass", "fwd"),
              "spill_bytes": max([int(x) for w in pred.get("warnings", [])
                                  for x in re.findall(r"about (\d+) bytes", w)] or [0]),
              "run_id": r.get("run_id")}
        for k, _ in METRICS:
            pt[k] = {"predicted": float(pred[k]), "measured": float(m[k]),
                     "within": bool(within(pred[k], m[k]))}
        points.append(pt)
    return {"points": points, "skipped": skipped,
            "config": {"data_set": "levels_measurement", "band": BAND,
                       "bound": "15 % or 16 MB, whichever is larger",
                       "rows": len(points)},
            "seconds": time.perf_counter() - t0}


def summary(data):
    """{(gpu, metric): (within, total)}."""
    out = {}
    for p in data["points"]:
        for k, _ in METRICS:
            w, n = out.get((p["gpu"], k), (0, 0))
            out[(p["gpu"], k)] = (w + p[k]["within"], n + 1)
    return out


def errors_by_family(data, metric: str, pass_: str) -> dict:
    """{family: [|predicted / measured - 1| of `metric`, ...]} over the rows of `pass_`."""
    out: dict = {}
    for p in data["points"]:
        if p["pass"] == pass_ and p[metric]["measured"] > 0:
            out.setdefault(p["family"], []).append(
                abs(p[metric]["predicted"] / p[metric]["measured"] - 1))
    return out


def plot(data):
    import matplotlib.pyplot as plt
    from ._style import error_cdf
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig, axes = plt.subplots(2, 2, figsize=(9.0, 7.8), layout="constrained", sharey=True)
    pts = data["points"]
    for i, (k, label) in enumerate(METRICS):
        for j, (pass_, what) in enumerate((("fwd", "forward"), ("bwd", "backward"))):
            ax = axes[i][j]
            n = sum(p["pass"] == pass_ for p in pts)
            error_cdf(ax, errors_by_family(data, k, pass_), goals=GOALS, xmin=1e-3, xmax=10,
                      title=f"({'abcd'[2 * i + j]}) {label}, {what} passes ({n} rows)",
                      legend=False)
            if j:
                ax.set_ylabel("")
            if i == 0:
                ax.set_xlabel("")
    handles = {}
    for ax in axes.flat:                          # one legend: every family once
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=5,
               fontsize=7.5, title="kernel family (errors below 0.1 % drawn at 0.1 %)",
               title_fontsize=7.5)
    devices = sorted({p["gpu"].split("-")[0] for p in pts})
    fig.suptitle("L2 / DRAM model: error of the predicted DRAM bytes against Nsight Compute,\n"
                 f"per kernel family (every measured pass on the {' and '.join(devices)}, "
                 "cold L2)", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, data["config"])


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
