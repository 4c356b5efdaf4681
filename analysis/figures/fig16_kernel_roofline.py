"""Figure 16: the measured forward kernels on the H100's roofline.

A roofline of the H100-SXM preset (`iosim.get_hardware("H100-SXM")`: dense fp16
tensor-core and fp32 CUDA-core peaks, HBM and L2 bandwidths) with each measured H100
forward pass of the `runtime_validation` rows placed at its modelled arithmetic intensity
and its achieved FLOP/s: FLOPs = 4 d x (score entries of the active tiles) x batch x
heads (`iosim.tile_sums` with the measured tiling: what the kernel computes, partly
masked causal tiles included); achieved = FLOPs / measured time. (a) per DRAM byte
(`iosim.levels(...)`'s dram_read_bytes + dram_write_bytes, cold L2), (b) per L2
byte. The standard pass (three kernels) is one point. Solid roof: the fp16 tensor-core
peak; dashed: the fp32 CUDA-core peak. At most
`fig12_runtime_validation.MAX_CALLS` configurations are placed, evenly spaced within each
family, one model call each. The numbers come from `fig12_runtime_validation.generate`.

Remake: `flashsim figure fig16` (about 5 s: 80 model calls).
"""
from __future__ import annotations

import math

from ._style import families_in_order, family_style, save

NAME = "fig16_kernel_roofline"


def generate(**kw):
    from . import fig12_runtime_validation
    return fig12_runtime_validation.generate(**kw)


def _panel(ax, rf, which, room=1):
    import numpy as np
    pk = rf["peaks"]
    bw = pk["hbm_bandwidth"] if which == "dram" else pk["l2_bandwidth"]
    key = f"intensity_{which}"
    xs = [p[key] for p in rf["points"]] or [1.0, 1e3]
    lo = 10 ** math.floor(math.log10(min(xs) / 2))
    hi = room * 10 ** math.ceil(math.log10(max(max(xs) * 2, pk["fp16_tensor_flops"] / bw * 4)))
    intensity = np.geomspace(lo, hi, 300)
    for peak, ls in ((pk["fp16_tensor_flops"], "-"), (pk["fp32_flops"], "--")):
        ax.loglog(intensity, np.minimum(peak, intensity * bw) / 1e12, ls, color="black", lw=1.1)
    for p in rf["points"]:
        st = family_style(p["family"])
        ax.plot(p[key], p["achieved_flops"] / 1e12, st["marker"], color=st["color"], ms=5,
                mfc="white" if p["causal"] else st["color"], mec=st["color"], mew=1.0,
                alpha=0.9, ls="none")
    ax.set_xlim(lo, hi)
    ymin = min([p["achieved_flops"] for p in rf["points"]] or [1e11]) / 1e12 / 3
    ax.set_ylim(10 ** math.floor(math.log10(ymin)), pk["fp16_tensor_flops"] / 1e12 * 3)
    name = "DRAM" if which == "dram" else "L2"
    ax.set_xlabel(f"modelled FLOP per {name} byte")
    ax.set_title(f"({'a' if which == 'dram' else 'b'}) against {name} bytes "
                 f"({bw / 1e12:.2f} TB/s)", fontsize=9)


def plot(data):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    rf = data["roofline"]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 4.4), constrained_layout=True, sharey=True)
    _panel(axes[0], rf, "dram")
    _panel(axes[1], rf, "l2", room=10)             # room for the legend right of the points
    axes[0].set_ylabel("achieved TFLOP/s (measured time)")
    pk = rf["peaks"]
    handles = [Line2D([], [], ls="none", marker=family_style(f)["marker"], ms=5,
                      color=family_style(f)["color"], label=f)
               for f in families_in_order({p["family"] for p in rf["points"]})]
    handles += [Line2D([], [], ls="none", marker="o", ms=5, mfc="white", mec="#555555",
                       label="open: causal"),
                Line2D([], [], color="black", lw=1.1,
                       label=f"tensor-core roof ({pk['fp16_tensor_flops'] / 1e12:.0f} TFLOP/s)"),
                Line2D([], [], color="black", lw=1.1, ls="--",
                       label=f"CUDA-core roof ({pk['fp32_flops'] / 1e12:.0f} TFLOP/s)")]
    axes[1].legend(handles=handles, loc="lower right", fontsize=6.5, ncol=1, framealpha=0.9)
    fig.suptitle(f"Measured forward kernels on the {rf['gpu']} roofline (modelled bytes, "
                 f"measured time)\n{len(rf['points'])} of the {rf['forward_rows']} measured "
                 "passes, evenly spread over each family", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (fig12_runtime_validation.generate's) as NAME.png / .svg."""
    return save(plot(data), out_dir, NAME, {"roofline_gpu": data["roofline"]["gpu"],
                                            "points": len(data["roofline"]["points"]),
                                            "max_calls": data["config"]["max_calls"]})


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
