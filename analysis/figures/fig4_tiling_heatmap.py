"""Figure 4: HBM traffic over (B_r, B_c) for one M, feasibility boundary and optimum.

Bytes per head, closed form, on the candidate grid of analysis.tiling_search. Cells whose
on-chip footprint (iosim.sram_footprint_bytes) exceeds M are hatched out; the optimum
(least traffic among feasible) is a star, the paper's rule a cross (it may lie outside
the feasible region: the rule ignores S and the statistics).
"""
from __future__ import annotations

import numpy as np
from matplotlib.colors import LogNorm

from iosim import paper_tiling, sram_to_elements
from analysis.tiling_search import optimal_tiling, traffic_grid

from ._style import new_figure, save, titles

NAME = "fig4_tiling_heatmap"


def generate(algorithm="fa2", N=4096, d=64, sram_bytes=100 * 1024, dtype="fp16"):
    pt = paper_tiling(sram_to_elements(sram_bytes, dtype), d)
    cands = np.array(sorted({8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512,
                             pt.B_r, pt.B_c}))
    rows, cols, traffic, feasible = traffic_grid(algorithm, N, d, sram_bytes, dtype=dtype,
                                                 rows=cands, cols=cands)
    best = optimal_tiling(algorithm, N, d, sram_bytes, dtype=dtype, rows=cands, cols=cands)
    return {"algorithm": algorithm, "N": N, "d": d, "sram_bytes": sram_bytes, "dtype": dtype,
            "rows": rows.tolist(), "cols": cols.tolist(), "traffic": traffic.tolist(),
            "feasible": feasible.tolist(), "best": best.as_dict()}


def plot(data):
    fig, ax = new_figure(6.4, 5.2)
    T = np.array(data["traffic"], float) / 1024 ** 2
    F = np.array(data["feasible"], bool)
    rows, cols = data["rows"], data["cols"]
    im = ax.imshow(T, origin="lower", cmap="viridis", norm=LogNorm(), aspect="auto")
    fig.colorbar(im, ax=ax, label="HBM traffic per head (MiB)")
    ax.contourf(np.where(F, np.nan, 1.0), levels=[0.5, 1.5], colors="none", hatches=["///"])
    ax.contour(F.astype(float), levels=[0.5], colors="white", linewidths=1.5)
    b = data["best"]
    ax.plot(cols.index(b["B_c"]), rows.index(b["B_r"]), "*", ms=15, color="red",
            label=f"optimum B_r={b['B_r']}, B_c={b['B_c']}")
    if b["paper_B_r"] in rows and b["paper_B_c"] in cols:
        ax.plot(cols.index(b["paper_B_c"]), rows.index(b["paper_B_r"]), "X", ms=10, color="orange",
                label=f"paper's rule B_r={b['paper_B_r']}, B_c={b['paper_B_c']}"
                      f" ({'fits' if b['paper_fits'] else 'exceeds M'})")
    ax.set_xticks(range(len(cols)), cols, rotation=90)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("B_c (key/value rows per tile)")
    ax.set_ylabel("B_r (query rows per tile)")
    ax.grid(False)
    ax.legend(fontsize=7, loc="upper right")
    titles(fig, ax, f"{data['algorithm']} traffic over tilings (hatched: footprint > M)",
           f"N={data['N']}, d={data['d']}, {data['dtype']}, M={data['sram_bytes']} bytes; "
           f"white line: feasibility boundary")
    return fig


def make(out_dir, **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME,
                {k: data[k] for k in ("algorithm", "N", "d", "sram_bytes", "dtype")})
