"""`flashsim figure NAME`: draw one figure (PNG + SVG) into --out."""
from __future__ import annotations

from iosim import ConfigError

from analysis.figures import NAMES


def register(sub):
    p = sub.add_parser("figure", help="draw one figure",
                       description="Draw one figure as PNG and SVG (configuration in the title "
                                   "and the PNG metadata). Figures: " + ", ".join(NAMES) +
                                   " (short names fig1, fig2, ... work too). fig8_bench reads the results data set "
                                   "(benchmarks/results/data/bench.jsonl); fig9_levels, "
                                   "fig10_grid_order and fig11_levels_validation run the L2 / "
                                   "DRAM model (iosim.memory); fig9 and fig11 read the "
                                   "levels_measurement rows of the data set; fig12_runtime_validation "
                                   "reads the runtime_validation rows and runs the L2 / DRAM "
                                   "model for its roofline; fig13_time_breakdown reads the "
                                   "op_breakdown rows (python3 -m analysis.opbreakdown on a "
                                   "GPU) and runs the time model (iosim.timing); "
                                   "fig14_decode draws the decode traffic model "
                                   "(iosim.decode) and reads the decode_bench rows "
                                   "(scripts/decode_bench.py on a GPU); fig15_window draws "
                                   "fa2 traffic against a local window's size (model).",
                       epilog="examples:\n  flashsim figure fig1\n  flashsim figure fig8 --out figures\n"
                              "  flashsim figure fig12",
                       formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", help="figure name, e.g. fig1 or fig1_traffic_vs_M")
    p.add_argument("--out", default="figures", metavar="DIR", help="output directory (default: figures)")
    p.set_defaults(func=main)


def main(args) -> int:
    from analysis.paths import check_out_dir
    from analysis.sweeps import ensure_cuda_env
    ensure_cuda_env()  # before any numba.cuda import (fig7)
    from analysis.figures import get
    try:
        mod = get(args.name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_out_dir(args.out)
    for path in mod.make(args.out):
        print(path)
    return 0
