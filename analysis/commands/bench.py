"""`flashsim bench`: time fa2/fa1/standard (Numba) and PyTorch SDPA on a CUDA GPU."""
from __future__ import annotations

import sys

from analysis import bench as B


def register(sub):
    p = sub.add_parser("bench", help="time the forward (and forward + backward) kernels and "
                                     "PyTorch SDPA on a CUDA GPU",
                       description="Time gpu.attention (fa2, fa1, standard) and PyTorch "
                                   "scaled_dot_product_attention (MATH, EFFICIENT, FLASH) on "
                                   "a CUDA GPU; one JSON row per point, written as it is made "
                                   "(a rerun on the same file skips points already done).")
    p.add_argument("--seq-lens", default=",".join(map(str, B.SEQ_LENS)), metavar="N,...",
                   help="sequence lengths (default: %(default)s)")
    p.add_argument("--head-dims", default=",".join(map(str, B.HEAD_DIMS)), metavar="d,...",
                   help="head dimensions (default: %(default)s)")
    p.add_argument("--dtypes", default=",".join(B.DTYPES), help="fp32,fp16,bf16 (default: all three; bf16 inputs are torch.bfloat16)")
    p.add_argument("--causal", default="both", choices=B.CAUSAL_MODES)
    p.add_argument("--impls", default=",".join(B.IMPLS),
                   help=f"implementations (default: {','.join(B.IMPLS)})")
    p.add_argument("--reps", type=int, default=B.MIN_REPS,
                   help=f"timed calls per point, median reported (>= {B.MIN_REPS})")
    p.add_argument("--batch-heads", type=int, default=16, help="batch x heads (default: 16)")
    p.add_argument("--pass", dest="passes", default="fwd", metavar="PASS,...",
                   help="what a point times: fwd (the forward call), fwd+bwd (forward then "
                        "backward(dO) through autograd: gpu.autograd.flash_attention for "
                        "fa2/fa1/standard, SDPA for torch_*), or fwd,fwd+bwd "
                        "(default: %(default)s)")
    p.add_argument("--time-cap-ms", type=float, default=2000.0,
                   help="skip a point whose single call exceeds this (default: %(default)s)")
    p.add_argument("--row-budget-s", type=float, default=40.0,
                   help="skip a point whose calls would take longer (default: %(default)s)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="whole-sweep time budget; later points are recorded as skipped")
    p.add_argument("--out", default=None,
                   help="results JSON (default: out/<date>-<device>.json); a rerun on the same "
                        "file resumes")
    p.add_argument("--record", action="store_true",
                   help="also append the rows measured now to the results data set "
                        "(benchmarks/results/data/bench.jsonl)")
    p.set_defaults(func=main)


def options_from_args(args) -> dict:
    """Validated keyword arguments for analysis.bench.run_bench (ValueError on bad input)."""
    opts = B.Options(reps=args.reps, time_cap_ms=args.time_cap_ms,
                     row_budget_s=args.row_budget_s, budget_s=args.budget_s)
    return dict(seq_lens=B.parse_int_list("seq_lens", args.seq_lens),
                head_dims=B.parse_int_list("head_dims", args.head_dims),
                dtypes=B.parse_name_list("dtypes", args.dtypes, B.DTYPES),
                causal=args.causal,
                impls=B.parse_name_list("impls", args.impls, B.IMPLS),
                batch_heads=args.batch_heads, opts=opts, out=args.out,
                passes=B.parse_name_list("pass", args.passes, B.PASSES))


def main(args) -> int:
    try:
        if args.out is not None:
            from analysis.paths import check_out_file
            check_out_file(args.out)
        kwargs = options_from_args(args)
        if isinstance(kwargs["batch_heads"], bool) or kwargs["batch_heads"] <= 0:
            raise ValueError(f"batch_heads={kwargs['batch_heads']!r} is not allowed; "
                             f"allowed: positive integers")
    except ValueError as e:
        print(f"flashsim bench: error: {e}", file=sys.stderr)
        return 2
    missing = B.gpu_problem()
    if missing:
        print(f"flashsim bench: nothing to run: {missing}.")
        return 1 if missing.startswith("numpy") else 0
    path, made = B.run_bench(**kwargs)
    done = sum(r["ms_median"] is not None for r in made)
    print(f"flashsim bench: {done} points measured, {len(made) - done} skipped; rows in {path}")
    if made:
        print(B.compact_table(made))
    if args.record:
        added, dup = B.record_rows(made)
        print(f"flashsim bench: {added} rows recorded in the results data set ({dup} already there)")
    return 0
