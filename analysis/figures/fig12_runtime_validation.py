"""Figure 12: the time model against measured kernel times, and the measured forward
kernels on a roofline.

(a) Predicted vs measured time of one kernel pass, every `runtime_validation` row of the
results data set (H100 and H200; forward and backward; the pass's kernels summed), in
milliseconds, log-log, y = x with a +-10 % band. Measured: CUPTI kernel times (median
over repetitions, warm clocks, inputs rotated so the L2 does not keep them;
`analysis.hwmeasure.time_config`). Predicted: `iosim.timing` with the constants
fitted on every H100 row; each H100 row is drawn at its 5-fold cross-validated
prediction (the model refitted without the row's fold: `cv_predicted_ms`); every H200
row is held out (only the preset changes). Colour: kernel family; marker: H100
cross-validated (open circle), H200 held out (triangle), H100 blind (square, frozen
predictions, once scored), the second blind set (diamond on the H100, down-triangle on
the H200). The title gives the median and worst |predicted / measured - 1|
per device.

(b), (c) A roofline of the H100-SXM preset (`iosim.get_hardware("H100-SXM")`: dense fp16
tensor-core and fp32 CUDA-core peaks, HBM and L2 bandwidths) with each measured H100
forward pass placed at its modelled arithmetic intensity and its achieved FLOP/s:
FLOPs = 4 d x RCA x batch x heads, RCA the score entries of the active tiles
(`iosim.tile_sums` with the measured tiling: what the kernel computes, partly masked
causal tiles included); (b) per DRAM byte (`iosim.levels(...)`'s
dram_read_bytes + dram_write_bytes, cold L2), (c) per L2 byte (l2_read_bytes +
l2_write_bytes). Achieved = FLOPs / measured time. The standard pass (three kernels) is
one point: its FLOPs over its three kernels' time and traffic. fa2_tc runs on the tensor
cores; every other kernel on the CUDA cores (the fp32 roof), fp16 included. At most
`max_calls` (80) configurations are placed, evenly spaced within each family, one model
call each (`iosim.levels`, cached per configuration).

Remake: `flashsim figure fig12` (about 3-5 s: 80 model calls).
"""
from __future__ import annotations

import math
import statistics
import textwrap
import time

from ._style import save

NAME = "fig12_runtime_validation"

FAMILY_COLORS = {"fa2_tc": "#2ca02c", "fa2_fast": "#17becf", "fa2_plain": "#bcbd22",
                 "fa1": "#1f77b4", "standard": "#d62728", "fa2_bwd": "#9467bd",
                 "standard_bwd": "#8c564b", "fa1_tc": "#aec7e8", "standard_tc": "#ff9896",
                 "fa2_bwd_tc": "#c5b0d5", "fa2_bwd_fast": "#e377c2",
                 "standard_bwd_tc": "#c49c94", "fa1_fast": "#393b79",
                 "standard_fast": "#7f7f7f"}
#: (device preset, split) -> (marker, filled)
CLASSES = {("H100-SXM", "fit"): ("o", True), ("H100-SXM", "heldout"): ("o", False),
           ("H100-SXM", "cv"): ("o", False), ("H100-SXM", "blind"): ("s", True),
           ("H100-SXM", "blind2"): ("D", True), ("H200", "blind2"): ("v", True),
           ("H100-SXM", "blind3"): ("P", True), ("H200", "blind3"): ("X", True),
           ("H100-SXM", "blind4"): ("*", True), ("H200", "blind4"): ("h", True),
           ("H100-SXM", "blind5"): ("p", True), ("H200", "blind5"): ("d", True),
           ("H100-SXM", "blind6"): ("<", True), ("H200", "blind6"): (">", True),
           ("H100-SXM", "blind7"): ("8", True), ("H200", "blind7"): ("H", True),
           ("H100-SXM", "blind8"): ("s", False), ("H200", "blind8"): ("D", False),
           ("H200", "heldout"): ("^", True), ("H200", "fit"): ("^", True)}
CLASS_LABELS = {("H100-SXM", "fit"): "H100, fit", ("H100-SXM", "heldout"): "H100, held out",
                ("H100-SXM", "cv"): "H100, 5-fold cross-validated",
                ("H100-SXM", "blind"): "H100, blind (frozen predictions)",
                ("H100-SXM", "blind2"): "H100, second blind set (frozen predictions)",
                ("H200", "blind2"): "H200, second blind set (frozen, preset change only)",
                ("H100-SXM", "blind3"): "H100, third blind set (frozen predictions)",
                ("H200", "blind3"): "H200, third blind set (frozen, preset change only)",
                ("H100-SXM", "blind4"): "H100, fourth blind set (frozen predictions)",
                ("H200", "blind4"): "H200, fourth blind set (frozen, preset change only)",
                ("H100-SXM", "blind5"): "H100, fifth blind set (frozen predictions)",
                ("H200", "blind5"): "H200, fifth blind set (frozen, preset change only)",
                ("H100-SXM", "blind6"): "H100, sixth blind set (frozen predictions)",
                ("H200", "blind6"): "H200, sixth blind set (frozen, preset change only)",
                ("H100-SXM", "blind7"): "H100, seventh blind set (frozen predictions)",
                ("H200", "blind7"): "H200, seventh blind set (frozen, preset change only)",
                ("H100-SXM", "blind8"): "H100, eighth blind set (frozen predictions)",
                ("H200", "blind8"): "H200, eighth blind set (frozen, preset change only)",
                ("H200", "heldout"): "H200, held out (preset change only)"}
BAND = 0.10
MAX_CALLS = 80

_LEVELS_CACHE: dict = {}


def _gpu_of(device: str):
    from analysis.fit_levels import GPU_OF_DEVICE
    return GPU_OF_DEVICE.get(device)


def _levels_of(c: dict, tiling, gpu: str) -> dict:
    """iosim.levels for one configuration with its measured tiling (cached)."""
    from iosim import Tiling, levels
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


def _families(fams):
    return [f for f in FAMILY_COLORS if f in fams] + sorted(set(fams) - set(FAMILY_COLORS))


def _stat_line(data):
    parts = []
    for g in ("H100-SXM", "H200"):
        s = data["stats"].get((g, "heldout")) or data["stats"].get((g, "cv"))
        if s:
            what = "held out" if data["stats"].get((g, "heldout")) else "cross-validated"
            parts.append(f"{g.split('-')[0]} {what} ({s['n']}): |error| median "
                         f"{100 * s['median_abs']:.1f} %, worst {100 * s['worst_abs']:.0f} %")
    for key in (k for k in CLASSES if k[1].startswith("blind")):   # each blind set, in order
        what = f"{key[0].split('-')[0]} {key[1].replace('blind', 'blind ').strip()}"
        s = data["stats"].get(key)
        if s:
            parts.append(f"{what}, frozen predictions ({s['n']}): |error| median "
                         f"{100 * s['median_abs']:.1f} %, worst {100 * s['worst_abs']:.0f} %")
    return "\n".join(parts)


def _roof_panel(ax, data, which):
    import numpy as np
    rf = data["roofline"]
    pk = rf["peaks"]
    bw = pk["hbm_bandwidth"] if which == "dram" else pk["l2_bandwidth"]
    key = f"intensity_{which}"
    xs = [p[key] for p in rf["points"]] or [1.0, 1e3]
    lo = 10 ** math.floor(math.log10(min(xs) / 2))
    hi = 10 ** math.ceil(math.log10(max(max(xs) * 2, pk["fp16_tensor_flops"] / bw * 4)))
    I = np.geomspace(lo, hi, 300)
    for peak, ls, lab in ((pk["fp16_tensor_flops"], "-", "fp16 tensor cores"),
                          (pk["fp32_flops"], "--", "fp32 CUDA cores")):
        ax.loglog(I, np.minimum(peak, I * bw) / 1e12, ls, color="black", lw=1.2,
                  label=f"roof: {lab} ({peak / 1e12:.0f} TFLOP/s)")
        ridge = peak / bw
        ax.axvline(ridge, color="#888888", ls=":", lw=0.7)
        ax.text(ridge * 1.08, peak / 1e12 * 1.15, f"ridge {ridge:.0f}", fontsize=6.5,
                color="#555555")
    for p in rf["points"]:
        c = FAMILY_COLORS.get(p["family"], "#7f7f7f")
        mk = "o" if p["dtype"] == "fp16" else "s"
        ax.plot(p[key], p["achieved_flops"] / 1e12, mk, color=c, ms=5,
                mfc=c if not p["causal"] else "white", mec=c, mew=1.0, alpha=0.9, ls="none")
    ax.set_xlim(lo, hi)
    ymin = min([p["achieved_flops"] for p in rf["points"]] or [1e11]) / 1e12 / 3
    ax.set_ylim(10 ** math.floor(math.log10(ymin)), pk["fp16_tensor_flops"] / 1e12 * 3)
    name = "DRAM (HBM)" if which == "dram" else "L2"
    ax.set_xlabel(f"modelled arithmetic intensity (FLOP per {name} byte)")
    ax.set_ylabel("achieved (measured) TFLOP/s")
    ax.set_title(f"({'b' if which == 'dram' else 'c'}) roofline over {name} bytes: "
                 f"{bw / 1e12:.2f} TB/s ({rf['gpu']} preset)", fontsize=8.5)


def plot(data):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig = plt.figure(figsize=(15.5, 7.0), constrained_layout=True)
    fig.get_layout_engine().set(rect=(0, 0.15, 1, 0.85))
    gs = fig.add_gridspec(2, 3, width_ratios=[1.0, 1, 1], height_ratios=[3.2, 1.1])
    ax = fig.add_subplot(gs[0, 0])
    axr = fig.add_subplot(gs[1, 0], sharex=ax)
    axes = [ax, fig.add_subplot(gs[:, 1]), fig.add_subplot(gs[:, 2])]
    pts = data["points"]
    vals = [v for p in pts for v in (p["measured_ms"], p["predicted_ms"]) if v > 0]
    lo = 10 ** math.floor(math.log10(min(vals) if vals else 1e-3))
    hi = 10 ** math.ceil(math.log10(max(vals) if vals else 1e2))
    ax.fill_between([lo, hi], [lo * (1 - BAND), hi * (1 - BAND)], [lo * (1 + BAND), hi * (1 + BAND)],
                    color="#999999", alpha=0.25, lw=0)
    ax.plot([lo, hi], [lo, hi], "-", color="#444444", lw=0.9)
    axr.axhspan(-100 * BAND, 100 * BAND, color="#999999", alpha=0.25, lw=0)
    axr.axhline(0, color="#444444", lw=0.9)
    for p in pts:
        c = FAMILY_COLORS.get(p["family"], "#7f7f7f")
        mk, filled = CLASSES.get((p["gpu"], p["split"]), ("s", True))
        style = dict(color=c, ms=5.5 if mk == "o" else 5, mfc=c if filled else "none",
                     mec="black" if mk == "^" else c, mew=0.5 if mk == "^" else 1.1,
                     alpha=0.85, ls="none")
        ax.plot(p["measured_ms"], p["predicted_ms"], mk, **style)
        axr.plot(p["measured_ms"], 100 * p["rel_error"], mk, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_ylabel("predicted kernel time of the pass (ms, iosim.timing)")
    ax.tick_params(labelbottom=False)
    errs = [100 * abs(p["rel_error"]) for p in pts] or [10]
    lim = min(100, 10 * math.ceil(max(errs) / 10 + 0.5))
    axr.set_ylim(-lim, lim)
    axr.set_xlabel("measured kernel time of the pass (ms, CUPTI)")
    axr.set_ylabel("predicted / measured - 1 (%)")
    ax.set_title("(a) predicted vs measured, every runtime_validation row\n" + _stat_line(data),
                 fontsize=8.5)
    _roof_panel(axes[1], data, "dram")
    _roof_panel(axes[2], data, "l2")
    fams = _families({p["family"] for p in pts} | {p["family"] for p in data["roofline"]["points"]})
    handles = [Line2D([], [], ls="none", marker="s", ms=6, color=FAMILY_COLORS.get(f, "#7f7f7f"),
                      label=f) for f in fams]
    present = [k for k in CLASS_LABELS if any((p["gpu"], p["split"]) == k for p in pts)]
    for k in present:
        mk, filled = CLASSES[k]
        handles.append(Line2D([], [], ls="none", marker=mk, ms=6, color="#777777",
                              mfc="#777777" if filled else "none",
                              mec="black" if mk == "^" else "#777777", label=f"(a) {CLASS_LABELS[k]}"))
    handles += [Line2D([], [], color="#444444", lw=0.9, label="(a) y = x"),
                plt.Rectangle((0, 0), 1, 1, color="#999999", alpha=0.25,
                              label=f"(a) +-{100 * BAND:.0f} %"),
                Line2D([], [], ls="none", marker="o", ms=6, color="#777777", label="(b, c) fp16"),
                Line2D([], [], ls="none", marker="s", ms=6, color="#777777", label="(b, c) fp32"),
                Line2D([], [], ls="none", marker="o", ms=6, mfc="white", mec="#777777",
                       label="(b, c) causal (open)"),
                Line2D([], [], color="black", lw=1.2, label="roof: fp16 tensor cores"),
                Line2D([], [], color="black", lw=1.2, ls="--", label="roof: fp32 CUDA cores")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.15), ncol=9,
               fontsize=7, frameon=False)
    fig.suptitle("Time model against measured kernel times (a), and the measured forward "
                 "kernels on the H100 roofline (b, c)", fontsize=10, fontweight="bold")
    rf = data["roofline"]
    n_dev = {g: sum(p["gpu"] == g for p in pts) for g in ("H100-SXM", "H200")}
    fit = data["stats"].get(("H100-SXM", "fit"))
    caption = (
        f"(a) Every runtime_validation row ({n_dev['H100-SXM']} on the H100, {n_dev['H200']} on "
        f"the H200; forward and backward passes, each pass's kernels summed): measured = CUPTI "
        f"kernel time (median, warm clocks, rotated inputs), predicted = iosim.timing with "
        f"constants fitted on the H100 fit rows"
        + (f" (fit rows: median |error| {100 * fit['median_abs']:.1f} %)" if fit else "")
        + f"; the H200 rows change only the preset. "
        f"(b, c) {len(rf['points'])} of the {rf['forward_rows']} measured H100 forward passes "
        f"(evenly spaced per family), at FLOPs = 4 d x (score entries of the active tiles) x "
        f"batch x heads over the measured time, against the modelled DRAM bytes (b, cold L2) "
        f"and L2 bytes (c) of iosim.memory. fa2_tc uses the tensor cores; every other "
        f"kernel (fp16 included) the CUDA cores, whose roof is the dashed line. The standard "
        f"pass (three kernels) is one point.")
    fig.text(0.5, 0.075, textwrap.fill(caption, 200), ha="center", va="top", fontsize=6.8,
             color="#333333")
    return fig


def make(out_dir="figures", **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, {**data["config"], "calls": data["calls"],
                                            "seconds": round(data["seconds"], 2)})
