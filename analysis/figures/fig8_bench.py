"""Figure 8: measured forward time and TFLOP/s against N, from the results data set.

Reads the `bench` rows of the data set (benchmarks/results/data/bench.jsonl) for one
device and draws analysis.figures.bench_plot's panels: for each (impl, dtype, N, d,
batch x heads, causal) the latest measured row (file order = the order runs were
recorded), implementations fa2, standard and PyTorch SDPA (MATH, EFFICIENT, FLASH).
"""
from __future__ import annotations

from pathlib import Path

NAME = "fig8_bench"
IMPLS = ("fa2", "standard", "torch_math", "torch_efficient", "torch_flash")


def generate(device: str = "H100", impls=IMPLS, data=None) -> list[dict]:
    from analysis import results as R
    from analysis.tables import bench_key, latest
    rows = R.load("bench", device=device, data=data)
    pick = latest(rows, bench_key, lambda r: r.get("ms_median") is not None and r["impl"] in impls
                  and r.get("pass", "fwd") == "fwd")
    return list(pick.values())


def make(out_dir="figures", device: str = "H100", data=None) -> list[Path]:
    from analysis.figures import bench_plot
    rows = generate(device, data=data)
    if not rows:
        raise ValueError(f"device={device!r}: the results data set holds no measured bench "
                         f"rows for it")
    path = bench_plot.plot(rows, Path(out_dir) / f"{NAME}.png")
    return [path]
