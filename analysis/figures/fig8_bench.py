"""Figure 8: measured forward time and TFLOP/s against N, from the results data set.

Reads the forward `bench` rows of the data set (benchmarks/results/data/bench.jsonl) for
one device and draws the achieved TFLOP/s against N of fa2, standard and PyTorch SDPA
(MATH, EFFICIENT, FLASH) for fp16, d = 64 and d = 128, non-causal (PANELS; the other
series are in the rows: `analysis.figures.bench_plot` draws them all). Each line is one run's sweep: for each series
(impl, dtype, d, batch x heads, causal) the latest run (file order = the order runs were
recorded) that measured at least MIN_POINTS of its N, so a later spot measurement (one N,
perhaps of a newer kernel: the tensor-core standard kernels of 2026-11-25 were measured
at N = 4096 only) never splices into an older sweep; the README's tables give the latest
figures at N = 4096.
"""
from __future__ import annotations

NAME = "fig8_bench"
IMPLS = ("fa2", "standard", "torch_math", "torch_efficient", "torch_flash")


MIN_POINTS = 3


def generate(device: str = "H100", impls=IMPLS, data=None) -> list[dict]:
    from analysis import results as R
    from analysis.tables import bench_key, latest
    rows = [r for r in R.load("bench", device=device, data=data)
            if r.get("ms_median") is not None and r["impl"] in impls
            and r.get("pass", "fwd") == "fwd"]
    series = lambda r: (r["impl"], r["dtype"], r["d"], r["batch_heads"], bool(r["causal"]))
    runs = {}                                   # series -> {run_id: set of N}, file order
    for r in rows:
        runs.setdefault(series(r), {}).setdefault(r["run_id"], set()).add(r["N"])
    chosen = {}
    for s_, by_run in runs.items():
        full = [rid for rid, ns in by_run.items() if len(ns) >= MIN_POINTS]
        chosen[s_] = full[-1] if full else list(by_run)[-1]
    pick = latest(rows, bench_key, lambda r: r["run_id"] == chosen[series(r)])
    return list(pick.values())


#: the panels drawn: (dtype, d, causal); the data set holds more (fp32, causal, bf16)
PANELS = (("fp16", 64, False), ("fp16", 128, False))
LABELS = {"fa2": "flashsim fa2", "standard": "flashsim standard", "torch_math": "torch SDPA MATH",
          "torch_efficient": "torch SDPA EFFICIENT", "torch_flash": "torch SDPA FLASH"}


def plot(rows, panels=PANELS):
    """Achieved TFLOP/s against N, one panel per (dtype, d, causal), a line per impl."""
    import matplotlib.pyplot as plt
    from analysis.figures.bench_plot import IMPL_ORDER, STYLE, panels as by_panel
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    data = by_panel(rows)
    keys = [k for k in panels if k in data] or list(data)[:2]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 4.6), squeeze=False,
                             layout="constrained", sharey=True)
    for ax, key in zip(axes[0], keys):
        for impl in sorted(data[key], key=lambda s: IMPL_ORDER.index(s) if s in IMPL_ORDER else 99):
            pts = data[key][impl]
            color, marker, ls = STYLE.get(impl, ("k", ".", ":"))
            ax.plot([p[0] for p in pts], [p[2] for p in pts], color=color, marker=marker, ms=4,
                    ls=ls, label=LABELS.get(impl, impl))
        dtype, d, causal = key
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_title(f"{dtype}, d = {d}, {'causal' if causal else 'non-causal'}", fontsize=9)
    axes[0][0].set_ylabel("achieved TFLOP/s (4 N\u00b2 d per head / time)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=5, fontsize=7.5)
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    bh = sorted({int(r["batch_heads"]) for r in rows if r.get("batch_heads")})
    fig.suptitle(f"Measured forward attention on the {', '.join(devices) or 'unknown device'}: "
                 f"fa2 against the\nstandard kernels and PyTorch SDPA (batch x heads = "
                 f"{', '.join(map(str, bh))}; median of timed calls)", fontsize=10)
    return fig


def draw(rows, out_dir="figures"):
    """Save the figure of `rows` (from generate) as out_dir/NAME.png and .svg."""
    from ._style import save
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    return save(plot(rows), str(out_dir), NAME,
                {"data_set": "bench", "devices": devices, "rows": len(rows),
                 "panels": [list(k) for k in PANELS]})


def make(out_dir="figures", device: str = "H100", data=None) -> list[str]:
    rows = generate(device, data=data)
    if not rows:
        raise ValueError(f"device={device!r}: the results data set holds no measured bench "
                         f"rows for it")
    return draw(rows, out_dir)
