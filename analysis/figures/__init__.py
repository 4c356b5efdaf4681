"""One module per figure; each has generate(...) -> data, plot(data) -> Figure, and
make(out_dir, **kw) -> [png path, svg path]. FIGURES maps names to modules."""
from __future__ import annotations

import importlib

NAMES = ("fig1_traffic_vs_M", "fig2_traffic_vs_N", "fig3_block_size", "fig4_tiling_heatmap",
         "fig5_roofline", "fig6_memory_footprint", "fig7_validation", "fig8_bench",
         "fig9_levels", "fig10_grid_order", "fig11_levels_validation",
         "fig12_runtime_validation", "fig13_time_breakdown", "fig14_decode",
         "fig15_window")


def get(name: str):
    """The figure module for a full name ('fig3_block_size') or short one ('fig3')."""
    for full in NAMES:
        if name == full or name == full.split("_")[0]:
            return importlib.import_module(f"analysis.figures.{full}")
    raise ValueError(f"figure={name!r} is not known; allowed: {', '.join(NAMES)} "
                     f"(or the short names {', '.join(n.split('_')[0] for n in NAMES)})")
