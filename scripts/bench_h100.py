#!/usr/bin/env python3
"""The one script run on the H100: Nsight Compute counts, then the benchmark sweep.

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
        PYTHONPATH=/tmp/site python3 scripts/bench_h100.py [--budget-s 510] [--skip-ncu]

1. checks numpy < 2.5 BEFORE anything imports numba.cuda (numba-cuda 0.30.4 cannot
   compile kernels on numpy 2.5);
2. scripts/ncu_counts.py: fa1 and fa2, N=4096, d=64, 16 instances, fp32, under ncu
   (each run capped by --ncu-timeout), ncu global ld/st bytes against iosim's ledger;
3. the `flashsim bench` sweep (analysis.bench) with the most important points first
   (d=64, N=4096 and 8192, fp32 and fp16, non-causal, all impls), until the time budget is
   spent; later points are recorded as skipped ("time budget ...") and a rerun on the same
   JSON file picks them up;
4. the figure, and last a compact table of what was measured.
Everything goes to $OUT (default ./out): <date>-<device>.json, ncu_counts.json, ncu logs,
bench.png.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

T_START = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def check_numpy() -> str | None:
    import numpy
    parts = re.findall(r"\d+", numpy.__version__)[:2]
    if len(parts) == 2 and (int(parts[0]), int(parts[1])) >= (2, 5):
        return (f"numpy {numpy.__version__} (from {numpy.__file__}) is >= 2.5: numba-cuda "
                f"0.30.4 cannot compile kernels with it. Install the numpy<2.5 wheel first: "
                f"python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl "
                f"&& PYTHONPATH=/tmp/site python3 scripts/bench_h100.py")
    return None


def fmt_cell(row) -> str:
    if row is None:
        return "-"
    if row.get("ms_median") is None:
        return "skip"
    return f"{row['ms_median']:.3g}/{row['tflops']:.3g}"


def compact_table(rows: list[dict]) -> str:
    """ms/TFLOP/s per (dtype, d, causal) block, N by impl; then skips and errors."""
    from analysis.bench import IMPLS
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    by = {}
    for r in rows:
        by[(r["dtype"], r["d"], r["causal"], r["N"], r["impl"])] = r
    blocks = sorted({(r["dtype"], r["d"], r["causal"]) for r in rows},
                    key=lambda k: (k[1], k[2], k[0] != "fp32"))
    short = {"torch_math": "t_math", "torch_efficient": "t_eff", "torch_flash": "t_flash"}
    out = ["cells: ms_median/TFLOP/s ('skip': see JSON 'skipped')"]
    for (dt, d, c) in blocks:
        Ns = sorted({r["N"] for r in rows if (r["dtype"], r["d"], r["causal"]) == (dt, d, c)})
        out.append(f"-- {dt} d={d} {'causal' if c else 'non-causal'}")
        out.append(f"{'N':>6} " + "".join(f"{short.get(i, i):>14}" for i in impls))
        for N in Ns:
            out.append(f"{N:>6} " + "".join(f"{fmt_cell(by.get((dt, d, c, N, i))):>14}" for i in impls))
    reasons = {}
    for r in rows:
        if r.get("skipped"):
            key = re.sub(r"[\d.]+", "#", r["skipped"])[:90]
            reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        out.append("skipped rows by reason:")
        out += [f"  {n:>4} x {k}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    errs = {}
    for r in rows:
        if r.get("rel_err") is not None:
            errs[(r["impl"], r["dtype"])] = max(errs.get((r["impl"], r["dtype"]), 0.0), r["rel_err"])
    if errs:
        out.append("max rel_err: " + ", ".join(f"{i}/{dt} {e:.1e}" for (i, dt), e in sorted(errs.items())))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="flashsim on the H100: ncu counts + benchmark sweep")
    ap.add_argument("--budget-s", type=float, default=510.0,
                    help="total seconds for the whole script (default %(default)s: the device "
                         "call allows 600)")
    ap.add_argument("--reserve-s", type=float, default=45.0,
                    help="seconds kept back from the sweep for the point in flight, figure "
                         "and table (default %(default)s)")
    ap.add_argument("--skip-ncu", action="store_true")
    ap.add_argument("--ncu-timeout", type=float, default=90.0, help="seconds per ncu run")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--time-cap-ms", type=float, default=2500.0)
    ap.add_argument("--row-budget-s", type=float, default=35.0)
    ap.add_argument("--seq-lens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--causal", default="both", choices=("off", "on", "both"))
    ap.add_argument("--impls", default="fa2,fa1,standard,torch_math,torch_efficient,torch_flash")
    ap.add_argument("--batch-heads", type=int, default=16)
    ap.add_argument("--out", default=os.environ.get("OUT") or "out")
    ap.add_argument("--results", default=None,
                    help="results JSON (default: OUT/<date>-<device>.json; reuse one to resume)")
    args = ap.parse_args(argv)

    msg = check_numpy()
    if msg:
        print(f"bench_h100: error: {msg}", file=sys.stderr)
        return 1
    from analysis import bench as B
    missing = B.gpu_problem()
    if missing:
        print(f"bench_h100: nothing to run: {missing}.")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    opts = B.Options(reps=args.reps, time_cap_ms=args.time_cap_ms, row_budget_s=args.row_budget_s)
    kwargs = dict(seq_lens=B.parse_int_list("seq_lens", args.seq_lens),
                  head_dims=B.parse_int_list("head_dims", args.head_dims),
                  dtypes=B.parse_name_list("dtypes", args.dtypes, B.DTYPES),
                  causal=args.causal, impls=B.parse_name_list("impls", args.impls, B.IMPLS),
                  batch_heads=args.batch_heads)
    import numpy
    print(f"bench_h100: numpy {numpy.__version__} from {numpy.__file__}", flush=True)

    ncu_table = "ncu: skipped (--skip-ncu)"
    if not args.skip_ncu:
        t0 = time.monotonic()
        import io
        from contextlib import redirect_stdout
        sys.path.insert(0, str(ROOT / "scripts"))
        try:
            import ncu_counts
            buf = io.StringIO()
            with redirect_stdout(buf):
                rc = ncu_counts.main(["--out", str(out), "--timeout", str(args.ncu_timeout)])
            ncu_table = buf.getvalue().strip() + f"\n(ncu pass: rc={rc}, {time.monotonic() - t0:.0f} s)"
        except Exception as e:
            ncu_table = f"ncu pass failed: {type(e).__name__}: {e}"
        print(ncu_table, flush=True)

    remaining = args.budget_s - (time.monotonic() - T_START) - args.reserve_s
    if remaining < 30:
        print(f"bench_h100: only {remaining:.0f} s left for the sweep; running it anyway "
              f"(points past the budget are recorded as skipped)")
        remaining = 30.0
    opts.budget_s = remaining
    backend = B.TorchBackend()
    results = Path(args.results) if args.results else out / B.default_results_path(
        backend.device_name).name
    print(f"bench_h100: sweep budget {remaining:.0f} s", flush=True)
    path, made = B.run_bench(**kwargs, opts=opts, out=results, backend=backend)
    rows = B.ResultFile(path).rows
    try:
        from analysis.figures.bench_plot import plot
        print(f"figure: {plot(rows, out / 'bench.png')}")
    except Exception as e:
        print(f"figure not drawn: {type(e).__name__}: {e}")
    print(f"\nresults: {path} ({len(rows)} rows; {sum(r['ms_median'] is not None for r in rows)} "
          f"measured); elapsed {time.monotonic() - T_START:.0f} s")
    print(ncu_table)
    print(compact_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
