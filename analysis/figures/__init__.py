"""One module per figure; each has generate(...) -> data, plot(data) -> Figure, and
make(out_dir, **kw) -> [png path, svg path] (most also draw(data, out_dir), which
`flashsim report` uses so that it writes the bytes `flashsim figure` writes). NAMES lists
them all; `get(name)` gives a module."""
from __future__ import annotations

import importlib

NAMES = ("fig1_traffic_vs_M", "fig2_traffic_vs_N", "fig3_block_size", "fig4_tiling_heatmap",
         "fig5_roofline", "fig6_memory_footprint", "fig7_validation", "fig8_bench",
         "fig9_levels", "fig10_grid_order", "fig11_levels_validation",
         "fig12_runtime_validation", "fig13_time_breakdown", "fig14_decode",
         "fig15_window", "fig16_kernel_roofline")


#: what each figure shows, and where its numbers come from (`flashsim figure --help`)
ABOUT = {
    "fig1_traffic_vs_M": "HBM traffic against SRAM size M (closed-form model)",
    "fig2_traffic_vs_N": "traffic against N: standard, fa1, fa2 (model)",
    "fig3_block_size": "fa1 traffic (and runtime with a GPU) against the block size B_c",
    "fig4_tiling_heatmap": "fa2 traffic over all tilings at one M (model)",
    "fig5_roofline": "arithmetic intensity and roofline bound, standard vs flash (model)",
    "fig6_memory_footprint": "extra HBM memory: O(N^2) standard against O(N) flash (model)",
    "fig7_validation": "kernel counts against the model, output error (runs the kernels; "
                       "the CUDA simulator without a GPU)",
    "fig8_bench": "measured forward TFLOP/s against N: fa2, standard, PyTorch SDPA (bench rows)",
    "fig9_levels": "requested, L2 and DRAM reads of the fa2 forward against N (L2 / DRAM "
                   "model, measured rows)",
    "fig10_grid_order": "grid order against predicted DRAM reads (L2 / DRAM model)",
    "fig11_levels_validation": "L2 / DRAM model error per kernel family "
                               "(levels_measurement rows)",
    "fig12_runtime_validation": "time model error per kernel family (runtime_validation rows)",
    "fig13_time_breakdown": "forward time by operation, measured and modelled "
                            "(op_breakdown rows, time model)",
    "fig14_decode": "decoding: the newest run's bandwidth against the HBM roof and the goal, "
                    "tiled decode time model error (decode_bench rows)",
    "fig15_window": "fa2 traffic against a local window's size (model)",
    "fig16_kernel_roofline": "measured forward kernels on the H100 roofline "
                             "(runtime_validation rows, L2 / DRAM model)",
}


def describe() -> str:
    """One line per figure: short name, full name, what it shows."""
    return "\n".join(f"  {n.split('_')[0]:6s} {n:26s} {ABOUT[n]}" for n in NAMES)


def get(name: str):
    """The figure module for a full name ('fig3_block_size') or short one ('fig3')."""
    for full in NAMES:
        if name == full or name == full.split("_")[0]:
            return importlib.import_module(f"analysis.figures.{full}")
    raise ValueError(f"figure={name!r} is not known; allowed: {', '.join(NAMES)} "
                     f"(or the short names {', '.join(n.split('_')[0] for n in NAMES)})")
