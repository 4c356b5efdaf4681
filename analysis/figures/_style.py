"""Shared figure plumbing: Agg backend, one look, and saving PNG + SVG with metadata.

Every figure module has three parts: `generate(...)` (numbers only, a dict), `plot(data)`
(a matplotlib Figure), and `make(out_dir, **kw)` (generate, plot, save; returns paths).
"""
from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"standard": "#d62728", "fa1": "#1f77b4", "fa2": "#2ca02c", "bound": "#444444",
          "lower": "#9467bd"}
GiB = 1024 ** 3
MiB = 1024 ** 2


def new_figure(width=6.4, height=4.4):
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt.subplots(figsize=(width, height), constrained_layout=True)


def save(fig, out_dir, name: str, config: dict) -> list[str]:
    """Write out_dir/name.png (config in its PNG metadata) and name.svg; close the figure."""
    os.makedirs(out_dir, exist_ok=True)
    png, svg = os.path.join(out_dir, name + ".png"), os.path.join(out_dir, name + ".svg")
    meta = {"Title": name, "Software": "flashsim",
            "Description": json.dumps(config, sort_keys=True, default=str)}
    # each file is written under a name of this process, then moved into place, so that
    # concurrent runs on one directory never leave a half-written figure
    for path, kw in ((png, dict(dpi=130, metadata=meta)),
                     (svg, dict(metadata={"Title": name, "Description": meta["Description"]}))):
        tmp = f"{path}.{os.getpid()}.tmp{os.path.splitext(path)[1]}"
        try:
            fig.savefig(tmp, **kw)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    plt.close(fig)
    return [png, svg]


def titles(fig, ax, title: str, config_line: str):
    """Figure title on top, the configuration in small type as the axes title."""
    fig.suptitle(title, fontsize=10, fontweight="bold")
    ax.set_title(config_line, fontsize=7.5, color="#444444")
