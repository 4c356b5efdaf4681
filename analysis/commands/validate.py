"""`flashsim validate`: the L2/DRAM and time models against the measured rows."""
from __future__ import annotations

import argparse
import os
import sys


def register(sub):
    p = sub.add_parser(
        "validate", help="check the L2/DRAM and time models against the measurements",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Predict every measured configuration of the results data set and "
                    "compare: 'levels' against Nsight Compute's L2 and DRAM bytes, 'runtime' "
                    "against CUPTI kernel times. Writes the validation rows (measured and "
                    "predicted side by side) to benchmarks/results/data/ (replacing the "
                    "previous ones) and prints median and worst errors per kernel family, "
                    "fit and held-out halves apart. No GPU needed.",
        epilog="examples:\n  flashsim validate levels\n  flashsim validate runtime --refit\n"
               "  flashsim validate runtime-blind --measured times.jsonl")
    p.add_argument("what", choices=("levels", "runtime", "runtime-blind"))
    p.add_argument("--measured", metavar="FILE",
                   help="runtime-blind: the measured rows (JSONL of analysis.hwmeasure times) to "
                        "score the frozen predictions "
                        "(benchmarks/results/runs/runtime-blind-predictions/) against")
    p.add_argument("--set", default="runtime_blind", metavar="NAME",
                   help="runtime-blind: which blind set's frozen predictions (runtime_blind, "
                        "runtime_blind2, ...: the keys of analysis.validate.RUNTIME_BLIND_SETS)")
    p.add_argument("--gpu", default="H100-SXM", metavar="PRESET",
                   help="runtime-blind: the preset of the frozen predictions to score "
                        "(H100-SXM, or H200: predictions-H200.json)")
    p.add_argument("--refit", action="store_true",
                   help="refit the model's constants first (levels: the L2 model grid on the "
                        "fit half; runtime: iosim/timing/runtime_constants.json on every H100 row)")
    p.add_argument("--free", default=None, metavar="NAMES",
                   help="runtime --refit: refit only these shared constants (comma-separated, "
                        "e.g. w_sat_tc) and the per-family efficiencies, holding the others at "
                        "the committed values (form 11's w_sat_tc was fitted so)")
    p.add_argument("--no-write", action="store_true", help="print only; leave the data set alone")
    p.set_defaults(func=main)


def main(args) -> int:
    from analysis import validate as V
    _check_outputs(args)
    if args.what == "levels":
        from analysis import fit_levels
        model = None
        if args.refit:
            from analysis import results
            rows = [r for r in results.load("levels_measurement") if r.get("status") == "ok"
                    and "H100" in r["device"] and V.levels_split(r["config"]) == "fit"]
            model = fit_levels.fit_l2(rows)
            print(f"fitted L2 model: {model}  (iosim.memory.FITTED holds the committed one)")
        rows = V.levels_rows(model)
        summary = V.levels_summary(rows)
        print(V.format_summary(summary, "levels"))
        if not args.no_write:
            print(f"wrote {len(rows)} rows to {V._write('levels_validation', rows)}")
        return 0
    if args.what == "runtime-blind":
        if not args.measured:
            print("flashsim validate runtime-blind: --measured FILE is required", file=sys.stderr)
            return 2
        if args.set not in V.RUNTIME_BLIND_SETS:
            print(f"flashsim validate runtime-blind: --set {args.set!r} is not allowed; allowed: "
                  f"{', '.join(V.RUNTIME_BLIND_SETS)}", file=sys.stderr)
            return 2
        V.score_runtime_blind(args.measured, write=not args.no_write, set_name=args.set,
                              gpu=args.gpu)
        return 0
    from iosim.timing import RuntimeModel
    model = None
    if args.refit:
        model = V.runtime_fit(free=args.free.split(",") if args.free else None)
        if not args.no_write:
            model.save()
    model = model or RuntimeModel.load()
    print(model.table())
    rows = V.runtime_rows(model)
    print(V.format_summary(V.runtime_summary(rows), "runtime"))
    if not args.no_write:
        blind = V.blind_rows_kept()          # scored against the frozen predictions: kept
        print(f"wrote {len(rows)} rows (and {len(blind)} blind rows kept) to "
              f"{V._write('runtime_validation', rows + blind)}")
    return 0


def _check_outputs(args) -> None:
    """What the run will read and write, checked before any work: the results data set
    (its validation rows are replaced) unless --no-write, runtime --refit's constants
    file, runtime-blind's --measured file."""
    from iosim import ConfigError
    from analysis import results
    from analysis.paths import check_out_dir, check_out_file
    if args.what == "runtime-blind" and args.measured is not None \
            and not os.path.isfile(args.measured):
        raise ConfigError(f"--measured {args.measured!r} is not a file")
    if args.no_write:
        return
    check_out_dir(results.data_dir(), "the results data set")
    if args.what == "runtime" and args.refit:
        from iosim.timing.model import CONSTANTS_PATH
        check_out_file(CONSTANTS_PATH, "the runtime constants")
