"""Figure 3: the paper's Figure 2 (middle): fa1 forward on GPT-2 medium vs block size B_c.

GPT-2 medium: N=1024, d=64, 16 heads, batch 64, fp16, B_r = 64 (= d, the paper's cap),
B_c in {64, 128, 256, 512}. Bars: HBM traffic, GB (1e9 bytes, problem total), closed form.
Runtime (ms) is drawn only when given: measured by the kernels on a real GPU
(`runtimes={B_c: seconds}`); without a GPU the figure says so.
"""
from __future__ import annotations

import numpy as np

from iosim import Problem, Tiling, closed_form, sram_footprint_bytes

from ._style import COLORS, new_figure, save, titles

NAME = "fig3_block_size"
GPT2_MEDIUM = dict(N=1024, d=64, heads=16, batch=64, dtype="fp16")


def generate(block_cols=(64, 128, 256, 512), B_r=64, runtimes=None, **problem):
    cfg = {**GPT2_MEDIUM, **problem}
    p = Problem(N=cfg["N"], d=cfg["d"], batch=cfg["batch"], heads=cfg["heads"], dtype=cfg["dtype"])
    rows = []
    for B_c in block_cols:
        led = closed_form("fa1", p, Tiling(B_r, B_c))
        rows.append({"B_c": B_c, "hbm_GB": led.hbm_bytes / 1e9,
                     "footprint_bytes": sram_footprint_bytes("fa1", B_r, B_c, p.d, p.dtype),
                     "runtime_s": (runtimes or {}).get(B_c)})
    std = closed_form("standard", p, Tiling(64, 64)).hbm_bytes / 1e9
    return {"config": {**cfg, "B_r": B_r}, "rows": rows, "standard_GB": std}


def plot(data):
    fig, ax = new_figure()
    rows = data["rows"]
    x = np.arange(len(rows))
    ax.bar(x, [r["hbm_GB"] for r in rows], color=COLORS["fa1"], width=0.6, label="fa1 HBM traffic")
    for xi, r in zip(x, rows):
        ax.text(xi, r["hbm_GB"], f"{r['hbm_GB']:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{r['B_c']}\n({r['footprint_bytes'] // 1024} KiB SRAM)" for r in rows])
    ax.set_xlabel("block size B_c (key/value rows per tile); on-chip footprint below")
    ax.set_ylabel("HBM traffic (GB = 1e9 bytes, whole problem)")
    times = [r["runtime_s"] for r in rows]
    if all(t is not None for t in times):
        ax2 = ax.twinx()
        ax2.plot(x, np.array(times) * 1e3, "o-", color="#ff7f0e", label="runtime (measured)")
        ax2.set_ylabel("runtime (ms)")
        ax2.grid(False)
        ax2.legend(fontsize=7, loc="upper center")
    else:
        ax.text(0.98, 0.95, "runtime: not measured (no GPU ran these kernels)",
                transform=ax.transAxes, ha="right", va="top", fontsize=7, color="#aa0000")
    ax.legend(fontsize=7, loc="upper right", bbox_to_anchor=(1, 0.88))
    c = data["config"]
    titles(fig, ax, "fa1 forward vs block size (paper Fig. 2, middle)",
           f"GPT-2 medium: N={c['N']}, d={c['d']}, {c['heads']} heads, batch {c['batch']}, "
           f"{c['dtype']}, B_r={c['B_r']}; standard (64x64) = {data['standard_GB']:.2f} GB")
    return fig


def make(out_dir, **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, data["config"])
