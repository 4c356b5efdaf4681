"""`flashsim figure NAME`: draw one figure (PNG + SVG) into --out."""
from __future__ import annotations

from iosim import ConfigError


def register(sub):
    from analysis.figures import describe
    p = sub.add_parser("figure", help="draw one figure",
                       description="Draw one figure as PNG and SVG into --out (the same bytes "
                                   "`flashsim report` writes). Figures from measured rows read "
                                   "the committed results data set (benchmarks/results/data): "
                                   "no GPU is needed.",
                       epilog="figures (NAME, or its short name fig1, fig2, ...):\n" + describe()
                              + "\n\nexamples:\n  flashsim figure fig1\n"
                              "  flashsim figure fig8 --out figures\n  flashsim figure fig12",
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
