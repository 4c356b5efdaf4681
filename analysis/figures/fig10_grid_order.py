"""Figure 10: how the order CTAs are dispatched in changes the fa2 forward's DRAM reads.

The fa2 forward (fp16, d=64, the default tensor-core kernel, 128 x 64 tiles) on the
H100-SXM preset, predicted by `iosim.levels` (`iosim.memory`'s L2 model) for
three grid orders:

* query-major (blockIdx.x = query block: what the kernels do): all query blocks of one
  (batch, head) instance, then the next, so the CTAs resident at once share one or two
  instances' K and V;
* head-major (blockIdx.x = instance): consecutive CTAs take the same query block of
  different heads, so every instance's K/V stream is live at once;
* swizzle-8: groups of 8 instances, query-major inside a group.

Left: against N = 4K .. 128K at batch x heads = 16; right: against batch x heads = 1 ..
256 at N = 16K. Top: DRAM reads (bytes, whole problem, one kernel launch with a cold L2:
Nsight Compute flushes it before each kernel), with the requested reads (the ledger, the
same for every order) and Q + K + V read once (the compulsory floor). Bottom: DRAM reads
divided by that floor. Head-major and swizzle-8 are what-ifs of the model, not measured.

Remake: `flashsim figure fig10` (about 1-2 s after numba's first compile).
"""
from __future__ import annotations

import textwrap
import time

from ._style import save
from .fig9_levels import _N_grid, _bh_grid, _fmt_N

NAME = "fig10_grid_order"

ORDERS = ("query-major", "head-major", "swizzle-8")
ORDER_STYLE = {"query-major": ("#2ca02c", "o", "query-major (the kernels)"),
               "head-major": ("#d62728", "s", "head-major (what-if)"),
               "swizzle-8": ("#ff7f0e", "^", "swizzle-8 (what-if)")}


def generate(gpu="H100-SXM", Ns=None, bhs=None, N_fixed=16384, bh_fixed=16, d=64,
             dtype="fp16", orders=ORDERS, second_panel=True):
    """{"panels": {"N" | "bh": {"x", "requested", "floor", "dram": {order: [...]}}},
    "config", "calls", "seconds"}."""
    from iosim import levels
    from iosim import Problem
    t0 = time.perf_counter()
    Ns = list(Ns) if Ns is not None else _N_grid(lo=4096)
    bhs = list(bhs) if bhs is not None else _bh_grid()
    item = 2 if dtype == "fp16" else 4
    sweeps = [("N", Ns)] + ([("bh", bhs)] if second_panel else [])
    panels, calls, kernels = {}, 0, set()
    for sweep, xs in sweeps:
        pan = {"x": xs, "requested": [], "floor": [], "dram": {o: [] for o in orders},
               "l2": []}
        for x in xs:
            N, bh = (x, bh_fixed) if sweep == "N" else (N_fixed, x)
            prob = Problem(N=int(N), d=d, batch=1, heads=int(bh), dtype=dtype)
            for o in orders:
                r = levels("fa2", prob, gpu, pass_="fwd", grid_order=o)
                calls += 1
                pan["dram"][o].append(float(r["dram_read_bytes"]))
                kernels.add(f"{r['kernel']} {r['block_rows']}x{r['block_cols']}")
            pan["requested"].append(float(r["requested_read_bytes"]))
            pan["l2"].append(float(r["l2_read_bytes"]))
            pan["floor"].append(float(3 * N * d * item * bh))
        panels[sweep] = pan
    return {"config": {"algorithm": "fa2", "pass": "fwd", "gpu": gpu, "d": d, "dtype": dtype,
                       "N_fixed": N_fixed, "bh_fixed": bh_fixed, "orders": list(orders),
                       "kernels": sorted(kernels)},
            "panels": panels, "calls": calls, "seconds": time.perf_counter() - t0}


def plot(data):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    cfg = data["config"]
    sweeps = [s for s in ("N", "bh") if s in data["panels"]]
    fig, axes = plt.subplots(2, len(sweeps), figsize=(4.6 * len(sweeps) + 0.4, 7.0),
                             squeeze=False, constrained_layout=True,
                             gridspec_kw={"height_ratios": [1.4, 1]})
    fig.get_layout_engine().set(rect=(0, 0.1, 1, 0.9))
    for col, sweep in enumerate(sweeps):
        pan = data["panels"][sweep]
        x = pan["x"]
        top, bot = axes[0][col], axes[1][col]
        top.plot(x, pan["requested"], "-", color="#444444", lw=1.2, label="requested (ledger)")
        top.plot(x, pan["floor"], "--", color="#2ca02c", lw=1.2,
                 label="Q + K + V read once (floor)")
        for o in cfg["orders"]:
            c, m, lab = ORDER_STYLE.get(o, ("#7f7f7f", "x", o))
            top.plot(x, pan["dram"][o], "-", color=c, marker=m, ms=3, lw=1.3,
                     label=f"DRAM, {lab}")
            ratio = [dr / fl for dr, fl in zip(pan["dram"][o], pan["floor"])]
            bot.plot(x, ratio, "-", color=c, marker=m, ms=3, lw=1.3, label=lab)
            bot.annotate(f"{ratio[-1]:.1f}x", (x[-1], ratio[-1]), xytext=(4, 0),
                         textcoords="offset points", fontsize=6.5, color=c, va="center")
        bot.axhline(1.0, color="#2ca02c", ls="--", lw=1.0)
        for ax in (top, bot):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            pow2 = [v for v in x if v & (v - 1) == 0]
            ax.set_xticks(pow2)
            ax.set_xticklabels([_fmt_N(v) if sweep == "N" else str(v) for v in pow2], fontsize=7)
            ax.set_xlim(x[0] / 1.15, x[-1] * 1.75)
        bot.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        bot.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        bot.yaxis.set_minor_formatter(NullFormatter())
        top.set_ylabel("reads (bytes, whole problem)")
        bot.set_ylabel("DRAM reads / (Q + K + V once)")
        if sweep == "N":
            top.set_title(f"(a) against N, batch x heads = {cfg['bh_fixed']}", fontsize=8.5)
            bot.set_xlabel("sequence length N (tokens)")
        else:
            top.set_title(f"(b) against batch x heads, N = {_fmt_N(cfg['N_fixed'])}",
                          fontsize=8.5)
            bot.set_xlabel("batch x heads")
        if col == 0:
            top.legend(fontsize=6.5, loc="upper left")
    fig.suptitle(f"fa2 forward on {cfg['gpu']}: grid order vs predicted DRAM reads (model, "
                 f"cold L2)", fontsize=10, fontweight="bold")
    caption = (
        f"fa2 forward, {cfg['dtype']}, d={cfg['d']}, non-causal, default kernel "
        f"({', '.join(cfg['kernels'])}), {cfg['gpu']} preset. Bytes, whole problem (all batch "
        f"x heads), one kernel launch with a cold L2 (Nsight Compute flushes it before each "
        f"kernel); DRAM = iosim.memory's prediction. query-major: blockIdx.x = query block, "
        f"what the kernels do; head-major: blockIdx.x = (batch, head) instance; swizzle-8: "
        f"groups of 8 instances, query-major inside a group (the same as head-major for batch x heads <= 8). head-major and swizzle-8 are "
        f"model what-ifs (no kernel runs them, none measured). Numbers at the right: DRAM "
        f"reads / floor at the largest point.")
    fig.text(0.5, 0.085, textwrap.fill(caption, 140), ha="center", va="top", fontsize=6.8,
             color="#333333")
    return fig


def make(out_dir="figures", **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, {**data["config"], "calls": data["calls"]})
