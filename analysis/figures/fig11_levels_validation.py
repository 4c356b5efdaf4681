"""Figure 11: predicted vs measured DRAM reads and writes, every measured levels row.

For every `levels_measurement` row of the results data set with status ok (Nsight
Compute on the H100 and the H200: `dram__bytes_read` / `dram__bytes_write` summed over
the pass's kernels, each launched with a cold L2 since ncu flushes it before each
kernel), the prediction of `analysis.fit_levels.predict_row(config, gpu)` (the preset of the
measuring device, `analysis.fit_levels.GPU_OF_DEVICE`) against the measurement, bytes for the
whole problem, log-log: reads left, writes right. The line is y = x, the band +-15 %;
the legend counts the rows within the issue's bound (15 % or 16 MB, whichever is larger:
`iosim.memory.within`). Colour: kernel family (`analysis.validation_configs.family_of`);
marker: device. Configurations whose kernel spills registers to local memory (ptxas,
`iosim.launch.plan.SPILLS`) are ringed (thick: 256 bytes per thread or more): that traffic
is in the measurement and not in the model.

Remake: `flashsim figure fig11` (one model call per row: about 6-10 s).
"""
from __future__ import annotations

import math
import re
import textwrap
import time

from ._style import save

NAME = "fig11_levels_validation"

FAMILY_COLORS = {"fa2_tc": "#2ca02c", "fa2_fast": "#17becf", "fa2_plain": "#bcbd22",
                 "fa1": "#1f77b4", "standard": "#d62728", "fa2_bwd": "#9467bd",
                 "standard_bwd": "#8c564b"}
DEVICE_MARKERS = {"H100-SXM": "o", "H200": "^"}
BAND = 0.15
BIG_SPILL = 256     # bytes per thread: a thick ring
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


def plot(data):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 6.6), constrained_layout=True)
    fig.get_layout_engine().set(rect=(0, 0.17, 1, 0.83))
    pts = data["points"]
    vals = [v for p in pts for k, _ in METRICS for v in (p[k]["measured"],) if v > 0]
    lo = 10 ** math.floor(math.log10(min(vals) if vals else 1e6))
    hi = 10 ** math.ceil(math.log10(max(vals) if vals else 1e9))
    summ = summary(data)
    gpus = [g for g in DEVICE_MARKERS if any(p["gpu"] == g for p in pts)]
    for ax, (k, label) in zip(axes, METRICS):
        xs = [lo, hi]
        ax.fill_between(xs, [lo * (1 - BAND), hi * (1 - BAND)], [lo * (1 + BAND), hi * (1 + BAND)],
                        color="#999999", alpha=0.25, lw=0, label=f"+-{100 * BAND:.0f} %")
        ax.plot(xs, xs, "-", color="#444444", lw=0.9, label="y = x")
        for p in pts:
            c = FAMILY_COLORS.get(p["family"], "#7f7f7f")
            mk = DEVICE_MARKERS.get(p["gpu"], "s")
            x, y = p[k]["measured"], p[k]["predicted"]
            if y < lo:                           # below the axis: drawn on it, pointing down
                y, mk = lo * 1.08, "v"
            ax.plot(x, y, mk, color=c, ms=5.5, mec="black" if p["gpu"] == "H200" else c,
                    mew=0.5, alpha=0.85, ls="none")
            if p["spill_bytes"]:
                big = p["spill_bytes"] >= BIG_SPILL
                ax.plot(x, y, "o", mfc="none", mec="black", ms=12 if big else 10,
                        mew=1.4 if big else 0.6, ls="none")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel(f"measured {label} (bytes, whole problem; Nsight Compute)")
        ax.set_ylabel(f"predicted {label} (bytes, whole problem; model)")
        counts = "; ".join(f"{g}: {summ[(g, k)][0]}/{summ[(g, k)][1]}" for g in gpus)
        ax.set_title(f"{label}: within 15 % or 16 MB: {counts}", fontsize=8.5)
    fams = [f for f in FAMILY_COLORS if any(p["family"] == f for p in pts)]
    fams += sorted({p["family"] for p in pts} - set(FAMILY_COLORS))
    handles = [Line2D([], [], ls="none", marker="s", ms=6, color=FAMILY_COLORS.get(f, "#7f7f7f"),
                      label=f) for f in fams]
    handles += [Line2D([], [], ls="none", marker=DEVICE_MARKERS[g], ms=6, color="#bbbbbb",
                       mec="black" if g == "H200" else "#bbbbbb", label=g) for g in gpus]
    handles += [Line2D([], [], ls="none", marker="o", mfc="none", mec="black", ms=10, mew=0.6,
                       label=f"spills < {BIG_SPILL} B/thread"),
                Line2D([], [], ls="none", marker="o", mfc="none", mec="black", ms=12, mew=1.4,
                       label=f"spills >= {BIG_SPILL} B/thread"),
                Line2D([], [], color="#444444", lw=0.9, label="y = x"),
                plt.Rectangle((0, 0), 1, 1, color="#999999", alpha=0.25,
                              label=f"+-{100 * BAND:.0f} %")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.17), ncol=7,
               fontsize=7, frameon=False)
    fig.suptitle("L2 / DRAM model against Nsight Compute: predicted vs measured DRAM bytes",
                 fontsize=10, fontweight="bold")
    n_dev = {g: sum(p["gpu"] == g for p in pts) for g in gpus}
    caption = (
        f"Every ok row of the levels_measurement data set ({', '.join(f'{n} on {g}' for g, n in n_dev.items())}"
        f"): one kernel pass each (forward or backward; all its kernels summed), bytes for the "
        f"whole problem (all batch x heads). Measured: Nsight Compute dram__bytes, every kernel "
        f"launched with a cold L2 (ncu flushes it before each kernel). Predicted: "
        f"analysis.fit_levels.predict_row with the device's preset (iosim.memory's L2 model). "
        f"Rings: the kernel spills registers to local memory (ptxas); that traffic is "
        f"measured, not modelled. Predictions below the axis are drawn on it as down-triangles.")
    fig.text(0.5, 0.095, textwrap.fill(caption, 170), ha="center", va="top", fontsize=6.8,
             color="#333333")
    return fig


def make(out_dir="figures", **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, {**data["config"],
                                            "seconds": round(data["seconds"], 2)})
