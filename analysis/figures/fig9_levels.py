"""Figure 9: requested vs L2 vs DRAM reads of the fa2 forward, against N.

The fa2 forward (fp16, d=64, the default kernel and tiling `gpu.attention` picks: the
tensor-core kernel, B_r x B_c = 128 x 64) on two presets, H100-SXM and A100-40GB (one
panel each), from `iosim.levels` (`iosim.memory`'s L2 model), against
N = 1K .. 128K at batch x heads = 16. `generate` also sweeps batch x heads = 1 .. 256 at
N = 16K (REPORT.md's table; the reads stay on the floor there, so it is not drawn).

Three read levels, bytes for the whole problem, one kernel launch with a cold L2 (Nsight
Compute flushes the L2 before each kernel): what the kernel requests (the ledger,
`iosim.closed_form`), what the SMs ask of L2 (32-byte sectors; the tensor-core kernel's
cp.async copies cost 1.5 sectors per requested sector) and what reaches DRAM
(predicted). The dashed line is Q + K + V read once, the compulsory floor. The dotted
vertical line marks where predicted DRAM reads first exceed the floor by 10 %: where
the N^2 d^2 / M term of the requested reads (K and V re-read once per query block) starts
to reach DRAM instead of being served by L2; it is found on the grid and refined by
bisection. Measured H100 points (Nsight Compute, `levels_measurement` rows of the results
data set) are overlaid where a row has exactly the plotted configuration.

Remake: `flashsim figure fig9` (about 1-2 s after numba's first compile).
"""
from __future__ import annotations

import math
import time

from ._style import save

NAME = "fig9_levels"

GPUS = ("H100-SXM", "A100-40GB")
#: measured device (levels_measurement "device") of each preset that has one
MEASURED_DEVICE = {"H100-SXM": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200"}
THRESHOLD = 1.10
LEVEL_STYLE = {"requested": ("#444444", "-", "requested (ledger)"),
               "l2": ("#1f77b4", "-", "L2 (sectors asked of L2)"),
               "dram": ("#d62728", "-", "DRAM (predicted)")}


def _N_grid(lo=1024, hi=131072, per_octave=2):
    k = int(round(math.log2(hi / lo) * per_octave))
    return sorted({int(round(lo * 2 ** (i / per_octave) / 64)) * 64 for i in range(k + 1)})


def _bh_grid(lo=1, hi=256):
    return [2 ** i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]


def floor_bytes(N, d, bh, itemsize=2):
    """Q + K + V read once: the compulsory DRAM reads (bytes, whole problem)."""
    return 3 * N * d * itemsize * bh


def _point(gpu, N, bh, d, dtype, kernel):
    from iosim import levels
    from iosim import Problem
    r = levels("fa2", Problem(N=int(N), d=d, batch=1, heads=int(bh), dtype=dtype), gpu,
               pass_="fwd", kernel=kernel)
    item = 2 if dtype == "fp16" else 4
    return {"N": int(N), "bh": int(bh),
            "requested": float(r["requested_read_bytes"]), "l2": float(r["l2_read_bytes"]),
            "dram": float(r["dram_read_bytes"]), "floor": float(floor_bytes(N, d, bh, item)),
            "kernel": r["kernel"], "tiles": [r["block_rows"], r["block_cols"]]}


def _crossing(points, eval_at, axis, integer_step, max_steps=6):
    """First grid point whose DRAM / floor > THRESHOLD, refined by bisection between it and
    the grid point before (in log space; x stays a multiple of integer_step). Returns
    {"x", "ratio", "calls"} or None if the grid never crosses."""
    ratios = [p["dram"] / p["floor"] for p in points]
    first = next((i for i, q in enumerate(ratios) if q > THRESHOLD), None)
    if first is None:
        return None
    if first == 0:
        return {"x": points[0][axis], "ratio": ratios[0], "dram": points[0]["dram"],
                "calls": 0, "at_grid_start": True}
    lo, hi = points[first - 1][axis], points[first][axis]
    hi_ratio, hi_dram, calls = ratios[first], points[first]["dram"], 0
    for _ in range(max_steps):
        mid = int(round(math.sqrt(lo * hi) / integer_step)) * integer_step
        if mid <= lo or mid >= hi:
            break
        p = eval_at(mid)
        calls += 1
        q = p["dram"] / p["floor"]
        if q > THRESHOLD:
            hi, hi_ratio, hi_dram = mid, q, p["dram"]
        else:
            lo = mid
    return {"x": hi, "ratio": hi_ratio, "dram": hi_dram, "below": lo, "calls": calls,
            "at_grid_start": False}


def _measured(gpu, d, dtype, sweep, fixed, data=None):
    """Measured rows with exactly the plotted configuration: fa2 forward, default (tc)
    kernel and tiling, fp16, d, non-causal, no grouped K/V; (a) batch x heads = fixed,
    (b) N = fixed."""
    dev = MEASURED_DEVICE.get(gpu)
    if dev is None:
        return []
    from analysis import results as R
    out = []
    for r in R.load("levels_measurement", data=data):
        c = r["config"]
        if r.get("status") != "ok" or r["device"] != dev:
            continue
        if not (c["pass"] == "fwd" and c["algorithm"] == "fa2" and c["kernel"] in ("tc", "default")
                and c["dtype"] == dtype and c["d"] == d and not c["causal"]
                and c["block_rows"] is None and c["kv_heads"] == c["heads"]):
            continue
        bh = c["batch"] * c["heads"]
        if (sweep == "N" and bh == fixed) or (sweep == "bh" and c["N"] == fixed):
            m = r["measured"]
            out.append({"id": c["id"], "N": c["N"], "bh": bh, "x": c["N"] if sweep == "N" else bh,
                        "dram": m["dram_read_bytes"], "l2": m["l2_read_bytes"],
                        "date": r.get("date"), "run_id": r.get("run_id")})
    return sorted(out, key=lambda p: p["x"])


def generate(gpus=GPUS, Ns=None, bhs=None, N_fixed=16384, bh_fixed=16, d=64, dtype="fp16",
             kernel="auto", refine=True, data=None):
    """Numbers of both sweeps for each preset: {"panels": {(sweep, gpu) as "N|gpu":
    {"points", "crossing", "measured"}}, "config", "calls", "seconds"}."""
    t0 = time.perf_counter()
    Ns = list(Ns) if Ns is not None else _N_grid()
    bhs = list(bhs) if bhs is not None else _bh_grid()
    panels, calls = {}, 0
    for gpu in gpus:
        for sweep, xs in (("N", Ns), ("bh", bhs)):
            if sweep == "N":
                def ev(x, gpu=gpu):
                    return _point(gpu, x, bh_fixed, d, dtype, kernel)
                step = 64
            else:
                def ev(x, gpu=gpu):
                    return _point(gpu, N_fixed, x, d, dtype, kernel)
                step = 1
            pts = [ev(x) for x in xs]
            for p in pts:
                p["x"] = p[sweep]
            calls += len(pts)
            cross = _crossing(pts, ev, sweep, step, max_steps=6 if refine else 0)
            calls += cross["calls"] if cross else 0
            panels[f"{sweep}|{gpu}"] = {
                "sweep": sweep, "gpu": gpu, "points": pts, "crossing": cross,
                "max_ratio": max(p["dram"] / p["floor"] for p in pts),
                "measured": [m for m in _measured(gpu, d, dtype, sweep,
                                                  bh_fixed if sweep == "N" else N_fixed, data)
                             if min(xs) <= m["x"] <= max(xs)]}
    kernels = sorted({(p["kernel"], tuple(p["tiles"])) for pan in panels.values()
                      for p in pan["points"]})
    return {"config": {"algorithm": "fa2", "pass": "fwd", "d": d, "dtype": dtype,
                       "kernel": kernel, "gpus": list(gpus), "N_fixed": N_fixed,
                       "bh_fixed": bh_fixed, "threshold": THRESHOLD, "grid_order": "query-major",
                       "kernels": [f"{k} {t[0]}x{t[1]}" for k, t in kernels]},
            "panels": panels, "calls": calls, "seconds": time.perf_counter() - t0}


def _fmt_N(n):
    return f"{n / 1024:.0f}K" if n % 1024 == 0 else f"{n / 1024:.1f}K"


def plot(data):
    """Against N, one panel per preset: requested, L2 and DRAM reads, the floor, the
    measured rows, and where DRAM reads leave the floor. (The batch x heads sweep stays
    in `data` for REPORT.md: the reads stay on the floor there.)"""
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    cfg = data["config"]
    gpus = [g for g in cfg["gpus"] if f"N|{g}" in data["panels"]]
    fig, axes = plt.subplots(1, len(gpus), figsize=(4.4 * len(gpus), 4.4), squeeze=False,
                             constrained_layout=True, sharey=True)
    where = []
    for col, gpu in enumerate(gpus):
        ax = axes[0][col]
        pan = data["panels"][f"N|{gpu}"]
        x = [p["x"] for p in pan["points"]]
        for lvl, (c, ls, lab) in LEVEL_STYLE.items():
            ax.plot(x, [p[lvl] for p in pan["points"]], ls, color=c, marker="o", ms=2.5,
                    lw=1.3, label=lab)
        ax.plot(x, [p["floor"] for p in pan["points"]], "--", color="#2ca02c", lw=1.2,
                label="Q + K + V read once (floor)")
        meas = pan["measured"]
        if meas:
            mx = [m["x"] for m in meas]
            ax.plot(mx, [m["dram"] for m in meas], "D", color="#d62728", mfc="white", ms=5,
                    mew=1.2, ls="none", label="DRAM, measured (ncu)")
            ax.plot(mx, [m["l2"] for m in meas], "s", color="#1f77b4", mfc="white", ms=5,
                    mew=1.2, ls="none", label="L2, measured (ncu)")
        cr = pan["crossing"]
        short = gpu.split("-")[0]
        if cr is not None:
            ax.axvline(cr["x"], color="#7f7f7f", ls=":", lw=1.2,
                       label=f"DRAM > {cfg['threshold']:.2f} x floor")
            where.append(f"{_fmt_N(cr['x'])} on the {short}")
        else:
            where.append(f"never (up to {_fmt_N(x[-1])}) on the {short}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = [v for v in x if v & (v - 1) == 0]
        ax.set_xticks(ticks)
        ax.set_xticklabels([_fmt_N(v) for v in ticks])
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_title(f"({'ab'[col] if col < 2 else col}) {gpu} preset"
                     + ("" if meas else " (no measured rows)"), fontsize=9)
        if col == 0:
            ax.set_ylabel("reads (bytes, whole problem)")
            ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle(f"fa2 forward ({cfg['dtype']}, d = {cfg['d']}, batch x heads = "
                 f"{cfg['bh_fixed']}): predicted DRAM reads leave the\nQ + K + V floor at "
                 f"N = {', '.join(where)} (cold L2)", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, {**data["config"], "calls": data["calls"]})


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
