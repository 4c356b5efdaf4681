"""Figure 1: HBM traffic vs SRAM capacity M (log-log), with N^2 d^2 / M and the lower bound.

Traffic in elements per head (read + written), closed forms. M in elements of the input
dtype, over [4d, 16 N d] (the paper's rule needs M >= 4d; the asymptotic range is
[d, N d], marked). fa1 and fa2 with the paper's tiling; fa2 also with the best feasible
tiling (analysis.tiling_search) — the paper's B_r cap makes fa2 flat above M = 4 d^2.
"""
from __future__ import annotations

import numpy as np

from analysis import theory
from analysis.tiling_search import optimal_tiling

from ._style import COLORS, new_figure, save, titles

NAME = "fig1_traffic_vs_M"


def generate(N=4096, d=64, dtype="fp16", points=40):
    M = np.unique(np.round(np.geomspace(4 * d, 16 * N * d, points)).astype(np.int64))
    item = 2 if dtype == "fp16" else 4
    data = {"N": N, "d": d, "dtype": dtype, "M": M.tolist(),
            "fa1": theory.paper_rule_traffic("fa1", N, d, M).tolist(),
            "fa2": theory.paper_rule_traffic("fa2", N, d, M).tolist(),
            "standard": theory.traffic_elements("standard", N, d, 64, 64).tolist(),
            "bound": theory.flash_bound(N, d, M).tolist(),
            "lower": theory.lower_bound(N, d, M).tolist()}
    best = []
    for m in M:
        try:  # feasible tiling of least traffic; bytes per head -> elements (no stats split)
            r = optimal_tiling("fa2", N, d, int(m) * item, dtype=dtype)
            best.append(r.traffic_bytes / item)
        except Exception:
            best.append(np.nan)
    data["fa2_opt"] = best
    return data


def plot(data):
    fig, ax = new_figure()
    M = np.array(data["M"])
    N, d = data["N"], data["d"]
    ax.loglog(M, data["fa1"], "o-", ms=3, color=COLORS["fa1"], label="fa1 (paper's tiling)")
    ax.loglog(M, data["fa2"], "s-", ms=3, color=COLORS["fa2"], label="fa2 (paper's tiling)")
    ax.loglog(M, data["fa2_opt"], "--", color=COLORS["fa2"],
              label="fa2 (best feasible tiling, footprint <= M bytes)")
    ax.axhline(data["standard"], color=COLORS["standard"], lw=1, label="standard (B=64)")
    ax.loglog(M, data["bound"], ":", color=COLORS["bound"], label=r"$N^2d^2/M$ (Thm 2, const. 1)")
    ax.loglog(M, data["lower"], "-.", color=COLORS["lower"],
              label=r"lower bound max$(4Nd,\ N^2d^2/M)$ (Prop 3)")
    ax.axvspan(d, N * d, color="#eeeeee", zorder=0, label=r"asymptotic range $d \leq M \leq Nd$")
    ax.axvline(4 * d * d, color=COLORS["fa2"], lw=0.7, ls=":")
    ax.text(4 * d * d, ax.get_ylim()[0] * 1.5, r" $M=4d^2$: $B_r$ capped at $d$", fontsize=7,
            color=COLORS["fa2"])
    ax.set_xlabel(f"SRAM capacity M (elements of {data['dtype']})")
    ax.set_ylabel("HBM traffic per head (elements read + written)")
    ax.legend(fontsize=7, loc="lower left")
    titles(fig, ax, "HBM traffic vs SRAM size",
           f"N={N}, d={d}, {data['dtype']}, forward, one head, closed-form model")
    return fig


def make(out_dir, **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, {k: data[k] for k in ("N", "d", "dtype")})
