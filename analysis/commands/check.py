"""`flashsim check`: the kernels' own counts against the model, their errors against
float64 and PyTorch, on any CUDA GPU (or in the CUDA simulator without one)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

EPILOG = """examples:
  flashsim check                       # every suite; full sizes on a GPU, simulator without
  flashsim check --quick --json out/check.json
  flashsim check --suite tc --quick    # the tensor-core kernel only
  flashsim check --sanitizer racecheck # the quick checks under compute-sanitizer
  flashsim check --ncu                 # Nsight Compute's load/store bytes against the ledger
  flashsim check --ptx                 # no GPU needed: compile PTX, no float64, atomics only when counting
  flashsim check --suite variants      # the flash-attn matrix: d, N_q != N_k, masks, dtypes, GQA
  flashsim check --suite variants --shard 0/18 --json out/v0.json   # one of 18 processes
  flashsim check --merge out/v0.json,out/v1.json --record            # join shards, record once

Exit status: 0 no check failed (refused rows are counted and listed, not failures), 1 a
check failed, 2 bad input or a missing tool."""


def register(sub):
    import argparse
    p = sub.add_parser(
        "check", help="check every kernel: exact counts against the model, errors against "
                      "float64 and PyTorch",
        description="Run every kernel (forward: standard, fa1, fa2 plain / fast / tensor "
                    "cores; backward: standard, fa1, fa2) and check: the instrumented "
                    "build's traffic counts equal iosim's closed form exactly; outputs are "
                    "finite and the counting build equals the plain one; errors against "
                    "float64 attention within bounds (fp16: 2x PyTorch SDPA's own error when "
                    "torch is installed). On a CUDA GPU at full sizes (--quick: tiny); "
                    "without one in Numba's CUDA simulator at tiny sizes, where the "
                    "tensor-core suite is skipped (it needs a GPU) and says so. --suite "
                    "variants: the flash-attn test matrix (head dims 32..256, N_q != N_k, "
                    "causal, windows, fp16 / bf16 / fp32, grouped K/V; fa2 forward and "
                    "backward against PyTorch SDPA's error in the same dtype); rows a "
                    "kernel refuses are counted as refused.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (seconds; variants: 24 rows of the matrix); what "
                        "--sanitizer re-runs")
    p.add_argument("--suite", default="forward,tc,backward", metavar="S,...",
                   help="comma-separated suites from forward, tc, backward, variants "
                        "(default: forward,tc,backward; variants: the flash-attn test "
                        "matrix, analysis/check_variants.py)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run shard I of N (0 <= I < N): every N-th group of configurations "
                        "that share compiled kernels, from group I; run N processes and "
                        "join their --json files with --merge")
    p.add_argument("--merge", default=None, metavar="PATH,...",
                   help="join the --json results of shards (comma-separated paths) into one "
                        "result: print its summary, write --json, --record it once; runs "
                        "no kernels")
    p.add_argument("--run-id", default=None,
                   help="run_id of the rows --record appends (default: a new one)")
    p.add_argument("--algorithms", default="standard,fa1,fa2", metavar="A,...",
                   help="comma-separated algorithms whose configurations run (default: "
                        "standard,fa1,fa2; the tc suite is fa2's)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="write the result as JSON; while the checks run, each row is also "
                        "appended to PATH.rows.jsonl as it is made (removed once PATH is "
                        "written)")
    p.add_argument("--resume", action="store_true",
                   help="with --json: keep the rows of an interrupted run of the same plan "
                        "(PATH.rows.jsonl) and run only the configurations it had not done")
    p.add_argument("--no-torch", action="store_true",
                   help="NumPy float64 reference and no PyTorch kernels, even if torch is there")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed calls per configuration, informational (default: 3; 0: none)")
    tools = p.add_mutually_exclusive_group()
    tools.add_argument("--sanitizer", choices=("memcheck", "racecheck"), default=None,
                       help="re-run the quick checks under compute-sanitizer --tool TOOL "
                            "(needs a GPU and compute-sanitizer on PATH)")
    tools.add_argument("--ncu", action="store_true",
                       help="Nsight Compute: global load/store bytes of one launch of each "
                            "forward kernel against iosim's ledger (N=4096, d=64, 16 heads; "
                            "--quick: N=1024, 4 heads; needs ncu on PATH)")
    tools.add_argument("--ptx", action="store_true",
                       help="no GPU needed: compile the CUDA-core kernels to PTX for cc 9.0 "
                            "and check them (no .f64, atomics only in counting builds)")
    p.add_argument("--record", action="store_true",
                   help="append the result rows to the results data set "
                        "(benchmarks/results/data/check.jsonl)")
    p.set_defaults(func=main)


def find_tool(name: str) -> str | None:
    """`name` on PATH, else under /usr/local/cuda*/bin."""
    p = shutil.which(name)
    if p:
        return p
    import glob
    cands = sorted(glob.glob(f"/usr/local/cuda*/bin/{name}"))
    return cands[-1] if cands else None


def _suites(text: str) -> list[str]:
    from iosim import ConfigError
    from analysis.check import SUITES
    out = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in out if s not in SUITES]
    if bad or not out:
        raise ConfigError(f"suite={text!r} is not allowed; allowed: comma-separated from "
                          f"{', '.join(SUITES)}")
    return out


def _algorithms(text: str) -> list[str]:
    from iosim import ConfigError
    from analysis.check import ALGORITHMS
    out = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in out if a not in ALGORITHMS]
    if bad or not out:
        raise ConfigError(f"algorithms={text!r} is not allowed; allowed: comma-separated from "
                          f"{', '.join(ALGORITHMS)}")
    return out


def _write_json(path, result) -> None:
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


def _shard(text):
    """'I/N' -> (I, N), or None."""
    from iosim import ConfigError
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        i = n = None
    if n is None or n < 1 or not 0 <= i < n:
        raise ConfigError(f"shard={text!r} is not allowed; allowed: I/N with integers "
                          f"0 <= I < N, e.g. 0/12")
    return i, n


def _err(msg: str) -> int:
    print(f"flashsim check: error: {msg}", file=sys.stderr)
    return 2


def main(args) -> int:
    from iosim import ConfigError
    suites = _suites(args.suite)
    _algorithms(args.algorithms)
    if args.repeats < 0:
        raise ConfigError(f"repeats={args.repeats} must be >= 0")
    shard = _shard(args.shard)
    _check_outputs(args)
    if args.merge:
        return _merge(args)
    if args.ptx:
        return _ptx(args)
    from analysis.sweeps import ensure_cuda_env
    has_gpu = ensure_cuda_env()
    from analysis.bench import numpy_problem
    msg = numpy_problem()
    if msg:
        return _err(msg)
    if args.sanitizer or args.ncu:
        tool = "compute-sanitizer" if args.sanitizer else "ncu"
        path = find_tool(tool)
        if not has_gpu:
            return _err(f"--{'sanitizer' if args.sanitizer else 'ncu'} needs a CUDA GPU; none "
                        f"found")
        if path is None:
            return _err(f"--{'sanitizer' if args.sanitizer else 'ncu'} needs {tool} (CUDA "
                        f"toolkit) on PATH; not found")
        return _sanitizer(args, path, suites) if args.sanitizer else _ncu(args)
    return _checks(args, suites, has_gpu, shard)


def _check_outputs(args) -> None:
    """Every path the run will write, checked before any work (a bad --json must not
    fail after minutes of checks): --json and its PATH.rows.jsonl, and the results data
    set with --record."""
    from analysis.paths import check_out_dir, check_out_file
    if args.json is not None:
        check_out_file(args.json, "--json")
        check_out_file(args.json + ".rows.jsonl", "--json (its PATH.rows.jsonl)")
    if args.record:
        from analysis import results as R
        check_out_dir(R.data_dir(), "--record (the results data set)")


def _report(args, result) -> int:
    """Print the summary line, the failures and refusals; write --json; --record; the
    exit status."""
    rows = result["rows"]
    extra = []
    if result.get("n_refused"):
        extra.append(f"{result['n_refused']} refused")
    if result["skipped"]:
        extra.append(f"suite {', '.join(s['suite'] for s in result['skipped'])} skipped")
    print(f"{result['n_rows']} checks on {result['device']} ({result['reference']} "
          f"reference): {result['n_passed']} passed, {result['n_failed']} failed"
          + "".join(f", {x}" for x in extra) + f" ({result['total_s']} s)")
    for r in rows:
        if r.get("status") == "fail":
            print(f"  FAIL {r['suite']} {r['name']}: {'; '.join(r['failures'])}")
    for r in rows:
        if r.get("status") == "refused":
            print(f"  REFUSED {r['suite']} {r['name']}: {r.get('refused', '')}")
    _write_json(args.json, result)
    if args.json:
        print(f"JSON: {args.json}")
    if args.record:
        _record(result, args.run_id)
    return 1 if result["n_failed"] else 0


def _merge(args) -> int:
    from iosim import ConfigError
    from analysis import check as C
    paths = [x.strip() for x in args.merge.split(",") if x.strip()]
    results = []
    for p in paths:
        try:
            results.append(json.loads(Path(p).read_text()))
        except json.JSONDecodeError as e:
            raise ConfigError(f"merge={p!r} is not a JSON check result ({e.msg})") from None
    result = C.merge(results)
    print(f"flashsim check --merge: {len(paths)} results")
    return _report(args, result)


def _checks(args, suites, has_gpu, shard=None) -> int:
    from analysis import check as C
    from analysis.progress import Progress
    mode = "sim" if not has_gpu else ("quick" if args.quick else "full")
    if mode == "sim":
        print("flashsim check: no CUDA GPU: running in Numba's CUDA simulator at tiny sizes")
    algs = _algorithms(args.algorithms)
    cases = C.plan(mode, suites, algs)
    if shard is not None:
        cases = C.shard_plan(cases, *shard)
    total = len(cases)
    bar = Progress(total, "check")
    lines = []
    rows_path = Path(args.json + ".rows.jsonl") if args.json else None
    head = {"plan": {"mode": mode, "suites": list(suites), "algorithms": list(algs),
                     "shard": list(shard) if shard else None}}
    done_rows = []
    if args.resume:
        if rows_path is None:
            return _err("--resume needs --json PATH (the interrupted run's rows are in "
                        "PATH.rows.jsonl)")
        if rows_path.exists():
            got = [json.loads(ln) for ln in rows_path.read_text().splitlines() if ln.strip()]
            if not got or got[0] != head:
                return _err(f"--resume: {rows_path} holds rows of another plan "
                            f"({got[0] if got else 'no header'}); allowed: the same mode, "
                            f"suites, algorithms and shard as {head['plan']}")
            done_rows = got[1:]
            print(f"flashsim check: resuming with {len(done_rows)} rows from {rows_path}")
    if rows_path is not None and not done_rows:
        rows_path.parent.mkdir(parents=True, exist_ok=True)
        rows_path.write_text(json.dumps(head) + "\n")

    def on_row(row):
        line = (f"{row['status'].upper():<7} {row['suite']:<8} {row['name']:<46} "
                f"{C.summary(row)}")
        lines.append(line)
        bar.write(line)
        if rows_path is not None:          # each row as it is made: a killed run resumes
            with open(rows_path, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")

    print(f"flashsim check ({mode}): {total} configurations of {', '.join(suites)}"
          + (f" (shard {shard[0]}/{shard[1]})" if shard else ""))
    with bar:
        result = C.run_checks(mode, suites, algorithms=algs,
                              use_torch=False if args.no_torch else None,
                              repeats=args.repeats, on_row=on_row,
                              on_case=lambda done, tot, name: bar.set(done, name),
                              shard=shard, done_rows=done_rows)
    for s in result["skipped"]:
        print(f"SKIP {s['suite']}: {s['reason']}")
    status = _report(args, result)
    if rows_path is not None and Path(args.json).exists():
        rows_path.unlink(missing_ok=True)
    return status


def _record(result, run_id=None) -> None:
    from analysis import results as R
    run_id = run_id or R.new_run_id("check")
    rows = [R.make_row("check", run_id=run_id, device=result["device"], date=result["date"],
                       commit=result["commit"], versions=result["versions"],
                       mode=result["mode"], reference=result["reference"], **row)
            for row in result["rows"]]
    added, dup = R.append(rows)
    print(f"recorded {added} rows in {R.path_of('check')} ({dup} already there)")


def _sanitizer(args, tool_path, suites) -> int:
    """The quick checks (NumPy reference: only our kernels on the GPU, no cuDNN) in a child
    process under compute-sanitizer; its summary line decides."""
    import re
    out_dir = Path(args.json).parent if args.json else Path(tempfile.mkdtemp(prefix="flashsim-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    child_json = out_dir / f"check_{args.sanitizer}_child.json"
    log = out_dir / f"check_{args.sanitizer}.log"
    # --report-api-errors no: torch and numba probe driver entry points at start-up
    # (cuGetProcAddress_v2 answering "invalid argument", about 34 times); those are API
    # results, not memory faults, and would otherwise count as memcheck errors
    cmd = [tool_path, "--tool", args.sanitizer, "--print-limit", "20", "--error-exitcode", "1",
           "--report-api-errors", "no", sys.executable, "-m",
           "analysis.cli", "check", "--quick", "--no-torch", "--repeats", "1",
           "--suite", ",".join(suites), "--algorithms", ",".join(_algorithms(args.algorithms)),
           "--json", str(child_json)]
    print(f"flashsim check: {' '.join(cmd)}", flush=True)
    env = dict(os.environ, FLASHSIM_PROGRESS="0")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = p.stdout + "\n--- stderr ---\n" + p.stderr
    log.write_text(text)
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    h = re.search(r"RACECHECK SUMMARY: (\d+) hazard", text)
    found = int(h.group(1)) if h else (int(m.group(1)) if m else None)
    # some versions print no racecheck summary when nothing was found: then count the
    # reports themselves ("========= Error: ..." / "========= Warning: ...")
    reports = len(re.findall(r"^=+ (?:Error|Warning|Invalid|Race|Program hit)", text, re.M))
    note = None
    if found is None:
        found = reports
        note = f"no summary line printed; {reports} report lines counted"
    child = json.loads(child_json.read_text()) if child_json.exists() else None
    checks_ok = bool(child and child.get("ok"))
    result = {"kind": "sanitizer", "tool": args.sanitizer, "command": " ".join(cmd),
              "exit_status": p.returncode, "reported": found,
              "summary": [ln.strip("= ") for ln in text.splitlines() if "SUMMARY" in ln],
              "checks_ok": checks_ok, "n_checks": child["n_rows"] if child else None,
              "log": str(log), "child": child, "note": note,
              "ok": found == 0 and checks_ok and p.returncode == 0}
    for ln in result["summary"]:
        print(ln)
    print(f"flashsim check --sanitizer {args.sanitizer}: "
          f"{'no' if found == 0 else found} {'hazards' if args.sanitizer == 'racecheck' else 'errors'}"
          f" reported; checks {'passed' if checks_ok else 'FAILED'}"
          f" ({result['n_checks']} configurations); log: {log}")
    if note:
        print(f"  {note} (see the log)")
    if p.returncode != 0 and found == 0 and checks_ok:
        print(f"  exit status {p.returncode}: see the log")
    _write_json(args.json, result)
    return 0 if result["ok"] else 1


def _ncu(args) -> int:
    from analysis import ncu
    from analysis.progress import Progress
    out_dir = Path(args.json).parent if args.json else Path(tempfile.mkdtemp(prefix="flashsim-"))
    N, bh = (1024, 4) if args.quick else (4096, 16)
    print(f"flashsim check --ncu: N={N}, d=64, {bh} heads; logs in {out_dir}", flush=True)
    with Progress(len(ncu.VARIANTS), "ncu") as bar:
        rows = ncu.run_ncu(out_dir, N=N, d=64, bh=bh,
                           on_row=lambda r: bar.update(note=r["algorithm"]))
    print(ncu.format_table(rows))
    for r in rows:
        for note in r.get("notes", []):
            print(f"  {r['algorithm']}: {note}")
    result = {"kind": "ncu", "N": N, "d": 64, "batch_heads": bh, "rows": rows,
              "ok": all(r["ok"] for r in rows)}
    _write_json(args.json, result)
    return 0 if result["ok"] else 1


def _ptx(args) -> int:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    from gpu import _launch
    if _launch.SIM:
        return _err("--ptx needs NUMBA_ENABLE_CUDASIM unset before numba.cuda is imported "
                    "(run it in a fresh process)")
    from analysis.check import ptx_check
    failures = ptx_check(quick=args.quick)
    print("PTX:", "all ok" if not failures else f"FAILED: {failures}")
    _write_json(args.json, {"kind": "ptx", "failures": failures, "ok": not failures})
    return 1 if failures else 0
