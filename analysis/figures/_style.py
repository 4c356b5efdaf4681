"""Shared figure plumbing: Agg backend, one look, and saving PNG + SVG with metadata.

Every figure module has three parts: `generate(...)` (numbers only, a dict), `plot(data)`
(a matplotlib Figure), and `make(out_dir, **kw)` (generate, plot, save; returns paths).

Saved files are deterministic: the same figure gives the same bytes on every run (no
dates, SVG ids from a fixed salt, the configuration in the metadata sorted and free of
timings), so that regenerating the committed figures leaves `git status` clean.
"""
from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: SVG element ids (clip paths, glyphs) are hashes salted by this; fixed, they are stable.
SVG_HASHSALT = "flashsim"
plt.rcParams["svg.hashsalt"] = SVG_HASHSALT

COLORS = {"standard": "#d62728", "fa1": "#1f77b4", "fa2": "#2ca02c", "bound": "#444444",
          "lower": "#9467bd"}
GiB = 1024 ** 3
MiB = 1024 ** 2


def new_figure(width=6.4, height=4.4):
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt.subplots(figsize=(width, height), constrained_layout=True)


#: PNG resolution: 130 dpi makes the 6.4-inch figures about 830 px wide (the README's width).
DPI = 130


def save(fig, out_dir, name: str, config: dict) -> list[str]:
    """Write out_dir/name.png (config in its PNG metadata) and name.svg; close the figure.
    Deterministic: no dates, fixed SVG ids (SVG_HASHSALT); `config` must hold no timings."""
    os.makedirs(out_dir, exist_ok=True)
    png, svg = os.path.join(out_dir, name + ".png"), os.path.join(out_dir, name + ".svg")
    desc = json.dumps(config, sort_keys=True, default=str)
    # "Software" replaces matplotlib's version string; "Date": None leaves the date out
    png_meta = {"Title": name, "Software": "flashsim", "Description": desc}
    svg_meta = {"Title": name, "Description": desc, "Date": None}
    # each file is written under a name of this process, then moved into place, so that
    # concurrent runs on one directory never leave a half-written figure
    for path, kw in ((png, dict(dpi=DPI, metadata=png_meta)),
                     (svg, dict(metadata=svg_meta))):
        tmp = f"{path}.{os.getpid()}.tmp{os.path.splitext(path)[1]}"
        try:
            with plt.rc_context({"svg.hashsalt": SVG_HASHSALT}):
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


# ---------------------------------------------------------------------------------------
# Kernel families (analysis.validation_configs.family_of): colour by algorithm, line style
# and marker by variant, so that every validation figure draws a family alike
# ---------------------------------------------------------------------------------------
_ALG_COLOR = {"fa2": "#2ca02c", "fa1": "#1f77b4", "standard": "#d62728"}
#: variant -> (line style, marker): tc = the tensor-core kernels (the default fp16 ones),
#: fast = the CUDA-core fast kernels, plain = the first, simplest kernels
_VARIANT = {"tc": ("-", "o"), "fast": ("--", "s"), "plain": (":", "^")}
FAMILY_ORDER = ("fa2_tc", "fa2_fast", "fa2_plain", "fa1_tc", "fa1_fast", "fa1",
                "standard_tc", "standard_fast", "standard",
                "fa2_bwd_tc", "fa2_bwd_fast", "fa2_bwd", "standard_bwd_tc", "standard_bwd")


def family_style(family: str) -> dict:
    """{"color", "ls", "marker"} of a kernel family ('fa2_tc', 'standard_bwd', ...)."""
    alg = family.split("_")[0]
    variant = "tc" if family.endswith("_tc") else "fast" if family.endswith("_fast") else \
        "plain"
    if family == "fa2_plain":
        variant = "plain"
    ls, mk = _VARIANT[variant]
    return {"color": _ALG_COLOR.get(alg, "#7f7f7f"), "ls": ls, "marker": mk}


def families_in_order(fams) -> list[str]:
    fams = set(fams)
    return [f for f in FAMILY_ORDER if f in fams] + sorted(fams - set(FAMILY_ORDER))


def error_cdf(ax, errors: dict, goals=(0.10, 0.15), xmax: float = 0.5, title: str = "",
              xmin: float | None = None, legend: bool = True, style=None,
              legend_title: str = "family"):
    """Draw, per family, the share of rows whose |error| (a fraction) is at most x:
    errors = {family: [|predicted / measured - 1|, ...]}. Vertical lines at the goals.
    x linear from 0 to xmax, or logarithmic from xmin (smaller errors drawn at xmin) to
    xmax. With `legend`, the legend (inside, lower right) gives each family's rows and
    median. style(name) -> {"color", "ls"} (default: family_style)."""
    import numpy as np
    style = style or family_style
    for g in goals:                 # the goal lines, their values just above the frame
        ax.axvline(100 * g, color="#555555", lw=0.9, ls=(0, (4, 3)))
        ax.text(100 * g, 1.005, f"{100 * g:.0f} %", ha="center", va="bottom", fontsize=7,
                color="#555555", transform=ax.get_xaxis_transform())
    for fam in (families_in_order(errors) if style is family_style else list(errors)):
        e = np.sort(100 * np.asarray(errors[fam], dtype=float))
        if not len(e):
            continue
        y = np.arange(1, len(e) + 1) / len(e)
        st = style(fam)
        lo = 100 * xmin if xmin else 0.0
        xs = np.clip(np.concatenate([[lo], np.repeat(e, 2)]), lo, 100 * xmax * 1.5)
        ys = np.concatenate([[0.0, 0.0], np.repeat(y, 2)[:-1]])
        ax.plot(xs, ys, color=st["color"], ls=st["ls"], lw=1.6,
                label=f"{fam} ({len(e)}; median {np.median(e):.1f} %)" if legend else fam)
    if xmin:
        ax.set_xscale("log")
        ax.set_xlim(100 * xmin, 100 * xmax)
        ax.xaxis.set_major_formatter(__import__("matplotlib.ticker").ticker.FuncFormatter(
            lambda v, _: f"{v:g}"))
    else:
        ax.set_xlim(0, 100 * xmax)
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("|predicted / measured - 1| (%)")
    ax.set_ylabel("share of rows with at most this error")
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=7, title=f"{legend_title} (rows; median)",
                  title_fontsize=7, framealpha=0.9)
    if title:
        ax.set_title(title, fontsize=9, pad=12)
