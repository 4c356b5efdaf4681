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
256 at N = 16K. Drawn: DRAM reads (whole problem, one kernel launch with a cold L2:
Nsight Compute flushes it before each kernel) divided by Q + K + V read once (the
compulsory floor); `generate` also gives the bytes and the requested reads (the ledger).
Head-major and swizzle-8 are what-ifs of the model, not measured.

Remake: `flashsim figure fig10` (about 1-2 s after numba's first compile).
"""
from __future__ import annotations

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
    """DRAM reads over the floor (Q + K + V once) per grid order: against N (a) and
    against batch x heads (b)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    cfg = data["config"]
    sweeps = [s for s in ("N", "bh") if s in data["panels"]]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.4 * len(sweeps), 4.2), squeeze=False,
                             layout="constrained", sharey=True)
    for col, sweep in enumerate(sweeps):
        pan = data["panels"][sweep]
        x = pan["x"]
        ax = axes[0][col]
        ax.axhline(1.0, color="#444444", ls="--", lw=1.0, label="Q + K + V read once (floor)")
        for o in cfg["orders"]:
            c, m, lab = ORDER_STYLE.get(o, ("#7f7f7f", "x", o))
            ratio = [dr / fl for dr, fl in zip(pan["dram"][o], pan["floor"])]
            ax.plot(x, ratio, "-", color=c, marker=m, ms=3.5, lw=1.4, label=lab)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        pow2 = [v for v in x if v & (v - 1) == 0]
        ax.set_xticks(pow2)
        ax.set_xticklabels([_fmt_N(v) if sweep == "N" else str(v) for v in pow2])
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        if sweep == "N":
            ax.set_title(f"(a) against N, batch x heads = {cfg['bh_fixed']}", fontsize=9)
            ax.set_xlabel("sequence length N (tokens)")
        else:
            ax.set_title(f"(b) against batch x heads, N = {_fmt_N(cfg['N_fixed'])}", fontsize=9)
            ax.set_xlabel("batch x heads")
        if col == 0:
            ax.set_ylabel("predicted DRAM reads / (Q + K + V read once)")
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"fa2 forward on the {cfg['gpu']} preset: the kernels' query-major grid keeps "
                 f"DRAM reads\nat the floor far longer than head-major or swizzled orders "
                 f"(model, cold L2)", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, {**data["config"], "calls": data["calls"]})


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
