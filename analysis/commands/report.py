"""`flashsim report`: the main job (model sweeps, theory checks, validation, figures)."""
from __future__ import annotations


def register(sub):
    p = sub.add_parser("report", help="run the theory checks, sweeps and validation; draw every figure",
                       description="Run the model sweeps, the theory checks (log-log slopes against "
                                   "the paper's bounds), the kernel validation (CUDA simulator at tiny "
                                   "sizes when no GPU; kernel runtimes with one) and draw every figure; "
                                   "write DIR/REPORT.md. What DIR receives depends only on the code "
                                   "and the data set (a second run writes the same bytes); wall "
                                   "times and provenance go to DIR/run/ (untracked). Exit 0: all "
                                   "checks passed; 1: a check failed.")
    p.add_argument("--out", default="figures", metavar="DIR",
                   help="output directory for figures, the model sweep and REPORT.md; this run's "
                        "record in DIR/run/ (default: figures)")
    p.add_argument("--no-kernels", action="store_true",
                   help="skip the kernel validation (REPORT.md says it was skipped)")
    p.set_defaults(func=main)


def main(args) -> int:
    from analysis.report import run_report
    return run_report(args.out, kernel_validation=not args.no_kernels)
