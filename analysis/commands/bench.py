"""`flashsim bench`: time the kernels on a CUDA GPU, one JSON row per point.

Four benchmarks, one at a time:
  (default)         the forward (and forward + backward) sweep: gpu.attention (fa2, fa1,
                    standard) against PyTorch SDPA (analysis.bench);
  --decode          KV-cache decoding: checks, exact counts and timings of gpu.decode
                    against torch SDPA / flash_attn (analysis.bench_decode);
  --call-overhead   gpu.attention's per-call host time against its kernel alone
                    (analysis.bench_calls);
  --backward        the fp32 fast fa2 backward, its kernels alone and whole, against torch
                    SDPA, and its tiling variants (analysis.bench_backward).
An option that does not apply to the chosen benchmark is an error, not ignored.
"""
from __future__ import annotations

import argparse
import os
import sys

from analysis import bench as B

MODES = ("forward", "decode", "call-overhead", "backward")

#: options each benchmark takes (argparse dests); the others must stay unset
MODE_OPTIONS = {
    "forward": {"seq_lens", "head_dims", "dtypes", "causal", "impls", "reps", "batch_heads",
                "passes", "time_cap_ms", "row_budget_s", "budget_s", "out", "record",
                "tilings"},
    "decode": {"out", "budget_s", "reps", "quick", "no_checks", "no_sweep", "main"},
    "call-overhead": {"out", "seq_lens", "reps", "batch_heads", "head_dims", "impls", "run_id",
                      "no_profile"},
    "backward": {"out", "seq_lens", "batch_heads", "head_dims", "causal", "reps", "warm",
                 "no_torch", "no_variants", "plain", "run_id", "smoke"},
}
#: every option's flag, for the messages
FLAGS = {"seq_lens": "--seq-lens", "head_dims": "--head-dims", "dtypes": "--dtypes",
         "causal": "--causal", "impls": "--impls", "reps": "--reps",
         "batch_heads": "--batch-heads", "passes": "--pass", "time_cap_ms": "--time-cap-ms",
         "row_budget_s": "--row-budget-s", "budget_s": "--budget-s", "out": "--out",
         "record": "--record", "quick": "--quick", "no_checks": "--no-checks",
         "no_sweep": "--no-sweep", "run_id": "--run-id", "no_profile": "--no-profile",
         "warm": "--warm", "no_torch": "--no-torch", "no_variants": "--no-variants",
         "plain": "--plain", "smoke": "--smoke", "tilings": "--tilings", "main": "--main"}

EXAMPLES = """examples:
  flashsim bench                      # the forward sweep, every point, on a CUDA GPU with torch
  flashsim bench --seq-lens 1024,4096 --head-dims 64 --dtypes fp16 --impls fa2,torch_flash --out out/bench.json
  flashsim bench --record              # and append the rows to the results data set
  flashsim bench --impls fa2_kernel,torch_flash --dtypes fp16 --head-dims 64 --seq-lens 4096,8192 --causal off --tilings default,128x64,64x64,128x32
  flashsim bench --decode --out out/decode_bench.jsonl            # about 5 minutes on an H100
  flashsim bench --decode --quick --no-sweep --out out/decode.jsonl   # a few points only
  flashsim bench --call-overhead --seq-lens 1024,4096 --out out/call_overhead.jsonl
  flashsim bench --backward --head-dims 64 --causal off --out out/bwd_fast.jsonl
  flashsim bench --backward --smoke --out out/bwd_smoke.jsonl     # tiny sizes, no GPU needed
then `flashsim results add FILE` stores JSON-lines rows in the results data set."""


def register(sub):
    p = sub.add_parser("bench", help="time the kernels (forward, decode, call overhead, "
                                     "backward) and PyTorch SDPA on a CUDA GPU",
                       description="Time gpu.attention (fa2, fa1, standard) and PyTorch "
                                   "scaled_dot_product_attention (MATH, EFFICIENT, FLASH) on "
                                   "a CUDA GPU; one JSON row per point, written as it is made "
                                   "(a rerun on the same file skips points already done). "
                                   "--decode, --call-overhead and --backward run the other "
                                   "benchmarks instead (JSON-lines rows).",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("benchmark (one; default: the forward sweep)").add_mutually_exclusive_group()
    m.add_argument("--decode", dest="mode", action="store_const", const="decode",
                   help="KV-cache decoding: checks (rows kind decode_check), timings of "
                        "gpu.decode against torch SDPA / flash_attn and a num_splits sweep "
                        "(kind decode_bench)")
    m.add_argument("--call-overhead", dest="mode", action="store_const", const="call-overhead",
                   help="gpu.attention's per-call host overhead against its kernel alone and "
                        "torch SDPA, fp16 fa2 (kind host_time)")
    m.add_argument("--backward", dest="mode", action="store_const", const="backward",
                   help="the fp32 fast fa2 backward: checks, its kernels alone and whole, "
                        "torch SDPA's backward, tiling variants (kinds bench, "
                        "bwd_fast_variants)")
    p.set_defaults(mode="forward")
    # options of several benchmarks: None = the benchmark's own default
    p.add_argument("--seq-lens", default=None, metavar="N,...",
                   help="sequence lengths (forward: %s; --call-overhead: 1024,4096; "
                        "--backward: one N, 4096)" % ",".join(map(str, B.SEQ_LENS)))
    p.add_argument("--head-dims", default=None, metavar="d,...",
                   help="head dimensions (forward and --backward: %s; --call-overhead: one d, "
                        "64)" % ",".join(map(str, B.HEAD_DIMS)))
    p.add_argument("--dtypes", default=None,
                   help="fp32,fp16,bf16 (default: all three; bf16 inputs are torch.bfloat16)")
    p.add_argument("--causal", default=None, choices=B.CAUSAL_MODES,
                   help="forward: default both; --backward: off or both (default both)")
    p.add_argument("--impls", default=None,
                   help=f"implementations (forward: {','.join(B.IMPLS)}; --call-overhead: "
                        f"{','.join(_call_impls())})")
    p.add_argument("--reps", type=int, default=None,
                   help=f"timed calls per point, median reported (forward: >= {B.MIN_REPS}, "
                        f"default {B.MIN_REPS}; --decode: >= 20, default 20; --call-overhead: "
                        f">= 5, default 50; --backward: default 20)")
    p.add_argument("--batch-heads", type=int, default=None,
                   help="batch x heads (default: 16)")
    p.add_argument("--pass", dest="passes", default=None, metavar="PASS,...",
                   help="what a point times: fwd (the forward call), fwd+bwd (forward then "
                        "backward(dO) through autograd: gpu.autograd.flash_attention for "
                        "fa2/fa1/standard, SDPA for torch_*), or fwd,fwd+bwd (default: fwd)")
    p.add_argument("--time-cap-ms", type=float, default=None,
                   help="skip a point whose single call exceeds this (default: 2000)")
    p.add_argument("--row-budget-s", type=float, default=None,
                   help="skip a point whose calls would take longer (default: 40)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="whole-run time budget in seconds; later points are recorded as "
                        "skipped (--decode: default 330; the timings stop at 70%% of it, the "
                        "num_splits sweep at 95%%)")
    p.add_argument("--out", default=None,
                   help="results file: forward: JSON (default: out/<date>-<device>.json; a "
                        "rerun on the same file resumes); the others: JSON lines, appended, "
                        "required")
    p.add_argument("--tilings", default=None, metavar="BrxBc,...",
                   help="time the Numba kernels (fa2, fa2_kernel, fa1, standard) at each tiling "
                        "B_r x B_c, 'default' for their own choice (default: default); rows "
                        "carry 'tiling'; PyTorch's impls run once")
    p.add_argument("--record", action="store_true",
                   help="also append the rows measured now to the results data set "
                        "(benchmarks/results/data/bench.jsonl)")
    d = p.add_argument_group("--decode only")
    d.add_argument("--quick", action="store_true", help="a few points of each part (a smoke test)")
    d.add_argument("--no-checks", action="store_true", help="skip the checks")
    d.add_argument("--no-sweep", action="store_true", help="skip the num_splits sweep")
    d.add_argument("--main", default=None, choices=("auto", "flat", "tiled", "tc"),
                   help="gpu.decode's main kernel for impl flashsim (default auto; rows name "
                        "the one that ran in main_kernel)")
    c = p.add_argument_group("--call-overhead and --backward")
    c.add_argument("--run-id", default=None, help="run_id of the rows (default: a new one)")
    c.add_argument("--no-profile", action="store_true",
                   help="--call-overhead: skip the cProfile of 200 calls kept in the fa2 rows")
    c.add_argument("--warm", type=int, default=None,
                   help="--backward: warm-up calls (default 3)")
    c.add_argument("--no-torch", action="store_true", help="--backward: no torch SDPA rows")
    c.add_argument("--no-variants", action="store_true",
                   help="--backward: skip the tiling / option variants")
    c.add_argument("--plain", action="store_true",
                   help="--backward: also time the plain main kernel (slow; 3 reps)")
    c.add_argument("--smoke", action="store_true",
                   help="--backward: tiny sizes, Numba arrays, no torch: runs in Numba's "
                        "simulator (NUMBA_ENABLE_CUDASIM=1), no GPU needed")
    p.set_defaults(func=main)


def _call_impls():
    from analysis.bench_calls import IMPLS
    return IMPLS


def _unset(value) -> bool:
    return value is None or value is False


def check_mode_options(args) -> None:
    """ValueError naming the first option given that the chosen benchmark does not take."""
    allowed = MODE_OPTIONS[args.mode]
    for dest, flag in FLAGS.items():
        if dest not in allowed and not _unset(getattr(args, dest, None)):
            name = "the forward sweep" if args.mode == "forward" else f"--{args.mode}"
            raise ValueError(f"{flag} does not apply to {name}; its options: "
                             + ", ".join(FLAGS[x] for x in FLAGS if x in allowed))


def _default(value, default):
    return default if value is None else value


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: positive integers")
    return value


def _one(name: str, values: list[int]) -> int:
    if len(values) != 1:
        raise ValueError(f"{name}={','.join(map(str, values))} is not allowed; allowed: one "
                         f"value for this benchmark")
    return values[0]


def options_from_args(args) -> dict:
    """Validated keyword arguments for analysis.bench.run_bench (ValueError on bad input)."""
    opts = B.Options(reps=_default(args.reps, B.MIN_REPS),
                     time_cap_ms=_default(args.time_cap_ms, 2000.0),
                     row_budget_s=_default(args.row_budget_s, 40.0), budget_s=args.budget_s)
    return dict(seq_lens=B.parse_int_list("seq_lens", _default(args.seq_lens, B.SEQ_LENS)),
                head_dims=B.parse_int_list("head_dims", _default(args.head_dims, B.HEAD_DIMS)),
                dtypes=B.parse_name_list("dtypes", _default(args.dtypes, B.DTYPES), B.DTYPES),
                causal=_default(args.causal, "both"),
                impls=B.parse_name_list("impls", _default(args.impls, B.IMPLS), B.IMPLS),
                batch_heads=_default(args.batch_heads, 16), opts=opts, out=args.out,
                passes=B.parse_name_list("pass", _default(args.passes, "fwd"), B.PASSES),
                tilings=B.parse_tilings(_default(args.tilings, "default")))


def decode_options(args) -> dict:
    """Keyword arguments for analysis.bench_decode.run (ValueError on bad input)."""
    from analysis import bench_decode as D
    reps = _default(args.reps, D.MIN_REPS)
    if reps < D.MIN_REPS:
        raise ValueError(f"reps={reps} is not allowed; allowed: integers >= {D.MIN_REPS}")
    budget = _default(args.budget_s, D.BUDGET_S)
    if not budget > 0:
        raise ValueError(f"budget_s={budget} is not allowed; allowed: seconds > 0")
    return dict(out=args.out, budget_s=budget, reps=reps, quick=args.quick,
                checks=not args.no_checks, sweep=not args.no_sweep,
                main=_default(args.main, "auto"))


def call_overhead_options(args) -> dict:
    """Keyword arguments for analysis.bench_calls.run (ValueError on bad input)."""
    from analysis import bench_calls as C
    reps = _default(args.reps, C.REPS)
    if reps < C.MIN_REPS:
        raise ValueError(f"reps={reps} is not allowed; allowed: integers >= {C.MIN_REPS}")
    return dict(out=args.out,
                seq_lens=B.parse_int_list("seq_lens", _default(args.seq_lens, C.SEQ_LENS)),
                reps=reps, batch_heads=_positive("batch_heads", _default(args.batch_heads, 16)),
                head_dim=_one("head_dims", B.parse_int_list("head_dims",
                                                            _default(args.head_dims, "64"))),
                impls=B.parse_name_list("impls", _default(args.impls, C.IMPLS), C.IMPLS),
                run_id=args.run_id, profile=not args.no_profile)


def backward_options(args) -> dict:
    """Keyword arguments for analysis.bench_backward.run (ValueError on bad input)."""
    causal = _default(args.causal, "both")
    if causal == "on":
        raise ValueError("causal='on' is not allowed with --backward; allowed: off, both")
    reps = _positive("reps", _default(args.reps, 20))
    warm = _default(args.warm, 3)
    if isinstance(warm, bool) or warm < 0:
        raise ValueError(f"warm={warm!r} is not allowed; allowed: integers >= 0")
    return dict(out=args.out,
                N=_one("seq_lens", B.parse_int_list("seq_lens", _default(args.seq_lens, "4096"))),
                batch_heads=_positive("batch_heads", _default(args.batch_heads, 16)),
                head_dims=tuple(B.parse_int_list("head_dims", _default(args.head_dims,
                                                                       B.HEAD_DIMS))),
                causal=tuple(B.parse_causal(causal)), reps=reps, warm=warm,
                torch_rows=not args.no_torch, variants=not args.no_variants, plain=args.plain,
                run_id=args.run_id, smoke=args.smoke)


def needs_gpu(args) -> str | None:
    """What is missing for this benchmark (one line), or None. --backward --smoke runs in
    Numba's simulator and needs neither torch nor a GPU."""
    if args.mode == "backward" and args.smoke:
        return None
    return B.gpu_problem()


def _fail(args, message: str) -> int:
    name = "flashsim bench" + ("" if args.mode == "forward" else f" --{args.mode}")
    print(f"{name}: error: {message}", file=sys.stderr)
    return 2


def main(args) -> int:
    try:
        check_mode_options(args)
        if args.mode != "forward" and args.out is None:
            raise ValueError(f"--out is required with --{args.mode}: a JSON-lines file the "
                             f"rows are appended to")
        from analysis.paths import check_out_dir, check_out_file
        if args.out is not None:
            check_out_file(args.out)
        if getattr(args, "record", False):          # before any work, as every command
            from analysis import results as R
            check_out_dir(R.data_dir(), "--record (the results data set)")
        kwargs = {"forward": options_from_args, "decode": decode_options,
                  "call-overhead": call_overhead_options,
                  "backward": backward_options}[args.mode](args)
        if args.mode == "forward":
            _positive("batch_heads", kwargs["batch_heads"])
            if args.record and kwargs["tilings"] != [None]:
                raise ValueError("--record takes the default tilings' rows only (the data "
                                 "set's bench rows and fig8); drop --tilings or --record")
    except ValueError as e:
        return _fail(args, str(e))
    missing = needs_gpu(args)
    if missing:
        if args.mode == "forward":
            print(f"flashsim bench: nothing to run: {missing}.")
            return 1 if missing.startswith("numpy") else 0
        return _fail(args, f"needs a CUDA GPU with PyTorch: {missing}"
                           + (" (--smoke runs in the simulator)" if args.mode == "backward"
                              else ""))
    if args.mode == "decode":
        from analysis import bench_decode
        return bench_decode.run(**kwargs)
    if args.mode == "call-overhead":
        from analysis import bench_calls
        return bench_calls.run(**kwargs)
    if args.mode == "backward":
        if args.smoke:
            os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        from analysis import bench_backward
        return bench_backward.run(**kwargs)
    path, made = B.run_bench(**kwargs)
    done = sum(r["ms_median"] is not None for r in made)
    print(f"flashsim bench: {done} points measured, {len(made) - done} skipped; rows in {path}")
    if made:
        print(B.compact_table(made))
    if args.record:
        added, dup = B.record_rows(made)
        print(f"flashsim bench: {added} rows recorded in the results data set ({dup} already there)")
    return 0
