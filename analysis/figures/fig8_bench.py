"""Figure 8: measured forward time and TFLOP/s against N, from the results data set.

Reads the forward `bench` rows of the data set (benchmarks/results/data/bench.jsonl) for
one device and draws analysis.figures.bench_plot's panels, implementations fa2, standard
and PyTorch SDPA (MATH, EFFICIENT, FLASH). Each line is one run's sweep: for each series
(impl, dtype, d, batch x heads, causal) the latest run (file order = the order runs were
recorded) that measured at least MIN_POINTS of its N, so a later spot measurement (one N,
perhaps of a newer kernel: the tensor-core standard kernels of 2026-11-25 were measured
at N = 4096 only) never splices into an older sweep; the README's tables give the latest
figures at N = 4096.
"""
from __future__ import annotations

from pathlib import Path

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


def make(out_dir="figures", device: str = "H100", data=None) -> list[Path]:
    from analysis.figures import bench_plot
    rows = generate(device, data=data)
    if not rows:
        raise ValueError(f"device={device!r}: the results data set holds no measured bench "
                         f"rows for it")
    path = bench_plot.plot(rows, Path(out_dir) / f"{NAME}.png")
    return [path]
