"""`flashsim sweep`: a resumable grid of configurations, one JSON line per point."""
from __future__ import annotations

from iosim import ALGORITHMS, ConfigError


def _ints(name):
    def parse(text):
        try:
            vals = [int(x) for x in text.split(",") if x]
        except ValueError:
            raise ConfigError(f"{name}={text!r} must be a comma-separated list of integers") from None
        if not vals or any(v <= 0 for v in vals):
            raise ConfigError(f"{name}={text!r} must list positive integers")
        return vals
    return parse


def register(sub):
    import argparse
    p = sub.add_parser("sweep", help="sweep configurations into a JSON-lines file (resumable)",
                       epilog="examples:\n"
                              "  flashsim sweep --out out/m.jsonl --algorithm fa1,fa2 --seq-len 1024,4096 "
                              "--sram-bytes 65536,131072\n"
                              "  flashsim sweep --out out/k.jsonl --backend kernel --algorithm fa2 "
                              "--seq-len 256 --block-rows 32 --block-cols 32\n"
                              "  flashsim sweep --out out/k.jsonl --backend kernel --algorithm fa2 "
                              "--seq-len 256,512 --block-rows 32 --block-cols 32 --executor ray "
                              "--address auto --executor-stats",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Evaluate the cartesian product of the given lists (comma-"
                                   "separated) and append one JSON row per point to --out, flushed "
                                   "as it is made. Points already in the file (made by the same "
                                   "model version) are skipped, so a killed sweep resumes; a "
                                   "failing point is recorded with its error and evaluated again "
                                   "on the next run unless --no-retry. --out must be a new file, "
                                   "an empty one or a sweep file; concurrent runs on one file "
                                   "are safe.")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="output file (appended to)")
    p.add_argument("--backend", choices=("model", "kernel"), default="model",
                   help="model: closed forms (instant); kernel: gpu kernels, instrumented counts "
                        "and runtime (runtime only on a real GPU; simulator otherwise)")
    p.add_argument("--algorithm", default="fa1,fa2",
                   help=f"comma-separated list from {', '.join(ALGORITHMS)} (default: fa1,fa2)")
    p.add_argument("--seq-len", default="1024", metavar="N,...", help="sequence lengths N")
    p.add_argument("--head-dim", default="64", metavar="d,...", help="head dimensions d")
    p.add_argument("--sram-bytes", default=None, metavar="M,...",
                   help="SRAM capacities M in bytes (paper's tiling); or give --block-rows/--block-cols")
    p.add_argument("--block-rows", default=None, metavar="B_r,...", help="query rows per tile")
    p.add_argument("--block-cols", default=None, metavar="B_c,...", help="key/value rows per tile")
    p.add_argument("--batch", default="1", metavar="B,...", help="batch sizes")
    p.add_argument("--heads", default="1", metavar="H,...", help="query heads")
    p.add_argument("--dtype", default="fp16", help="comma-separated list from fp16, bf16, fp32")
    p.add_argument("--causal", default="false", help="comma-separated list from false, true")
    p.add_argument("--sparsity", default="1.0",
                   help="fractions s in (0, 1] of nonzero blocks of a random block mask")
    p.add_argument("--seed", type=int, default=0, help="seed of the random block masks")
    p.add_argument("--no-retry", action="store_true",
                   help="keep the error rows of an earlier run (default: evaluate them again)")
    p.add_argument("--executor", default="local", metavar="local|ray",
                   help="where points are evaluated: local (this process, default) or ray "
                        "(Ray tasks on a Ray cluster; kernel points ask for one GPU each; "
                        "needs the extra: pip install -e '.[ray]'). This process alone "
                        "writes --out, with the same resume and retry rules")
    p.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                   help="with --executor ray: the Ray cluster to use (auto: the one this machine "
                        "joined with `ray start`; HOST:PORT: its head node); left out: start "
                        "a local one for this sweep")
    p.add_argument("--points-per-task", type=int, default=None, metavar="K",
                   help="with --executor ray: points per Ray task (default: points over "
                        "GPUs, or CPUs for model points, grouped by compiled kernel)")
    p.add_argument("--executor-stats", action="store_true",
                   help="print the executor's points, tasks, wall and evaluate seconds and "
                        "overhead per point")
    p.set_defaults(func=main)


def main(args) -> int:
    from analysis.paths import check_out_file
    from analysis.sweeps import EVALUATORS, ensure_cuda_env, grid, normalise, run_sweep
    check_out_file(args.out)
    algs = [a for a in args.algorithm.split(",") if a]
    for a in algs:
        if a not in ALGORITHMS:
            raise ConfigError(f"algorithm={a!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    causal = []
    for c in args.causal.split(","):
        if c.lower() not in ("false", "true"):
            raise ConfigError(f"causal={c!r}; allowed: false, true")
        causal.append(c.lower() == "true")
    try:
        sparsity = [float(x) for x in args.sparsity.split(",") if x]
    except ValueError:
        raise ConfigError(f"sparsity={args.sparsity!r} must be numbers in (0, 1]") from None
    if any(not 0 < s <= 1 for s in sparsity):
        raise ConfigError(f"sparsity={args.sparsity!r} must be numbers in (0, 1]")
    axes = dict(algorithm=algs, N=_ints("seq_len")(args.seq_len), d=_ints("head_dim")(args.head_dim),
                batch=_ints("batch")(args.batch), heads=_ints("heads")(args.heads),
                dtype=args.dtype.split(","), causal=causal, sparsity=sparsity, seed=[args.seed])
    if args.sram_bytes:
        axes["sram_bytes"] = _ints("sram_bytes")(args.sram_bytes)
    if (args.block_rows is None) != (args.block_cols is None):
        raise ConfigError("block_rows and block_cols must be given together")
    if args.block_rows:
        axes["block_rows"] = _ints("block_rows")(args.block_rows)
        axes["block_cols"] = _ints("block_cols")(args.block_cols)
    if not args.sram_bytes and not args.block_rows:
        raise ConfigError("give --sram-bytes, or --block-rows and --block-cols")
    points = [normalise(p) for p in grid(**axes)]   # every value checked before any work
    from analysis.executor import make_executor
    if args.executor != "ray" and args.points_per_task is not None:
        raise ConfigError(f"--points-per-task={args.points_per_task!r} is given with --executor "
                          f"{args.executor}; it applies to --executor ray only")
    kw = {} if args.executor != "ray" else {"points_per_task": args.points_per_task}
    executor = make_executor(args.executor, args.address, **kw)
    if args.backend == "kernel" and args.executor == "local":
        ensure_cuda_env()   # (ray: each worker decides on its own node)
    from analysis.progress import Progress
    from analysis.sweeps import pending
    with executor, Progress(pending(points, args.out), "sweep") as bar:
        st = run_sweep(points, args.out, EVALUATORS[args.backend], retry_errors=not args.no_retry,
                       progress=lambda msg: bar.update(note=msg.split(" ", 1)[0]),
                       executor=executor)
    print(f"{args.out}: {st['done']} new rows ({st['errors']} errors), {st['skipped']} already present")
    if args.executor_stats:
        print(executor.stats_line())
    return 0
