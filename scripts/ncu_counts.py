#!/usr/bin/env python3
"""Nsight Compute counts of the fa1 and fa2 kernels against iosim's ledger.

    python3 scripts/ncu_counts.py [--out DIR] [--algorithms fa1,fa2] [--N 4096] [--d 64]
                                  [--batch-heads 16] [--dtype fp32]

For each algorithm, runs this script again in --child mode (one uncounted call of
gpu.attention on NumPy inputs: the kernel is launched exactly once) under

    ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,
        l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum,
        lts__t_bytes.sum,gpu__time_duration.sum -k regex:<alg>_fwd --csv --print-units base

parses the CSV, sums each metric over the profiled kernels, and compares the global
load/store bytes (what the kernel requested from L1TEX, in 32-byte sectors) with iosim's
closed-form ledger for the same tiling: within 2% counts as agreement. DRAM bytes (what
got past the 50 MB L2) and L2 bytes are recorded beside them; they are expected to differ.
The kernels' own instrumented counts (count_traffic=True) are recorded too.
Writes ncu_counts.json (and the raw ncu logs) to --out (default $OUT or .).
"""
from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum",
           "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
           "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
           "lts__t_bytes.sum", "gpu__time_duration.sum")
LD, ST = METRICS[2], METRICS[3]
#: Global loads issued as cp.async (LDGSTS: global -> shared without registers, what
#: gpu.fa2_tc uses) may not count under LD; name the metric that counts their bytes in
#: FLASHSIM_NCU_LD_EXTRA (e.g. l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts.sum, as
#: `ncu --query-metrics` lists it on the chip) and it is profiled and added to LD.
LD_EXTRA = os.environ.get("FLASHSIM_NCU_LD_EXTRA") or None
if LD_EXTRA:
    METRICS = METRICS + (LD_EXTRA,)
TOLERANCE = 0.02
#: What to profile: name -> (gpu.attention algorithm, fast flag, ncu kernel-name regex).
#: 'fa2' is what users get (the register-tiled gpu.fa2_fast kernel), 'fa2-plain' the
#: one-thread-per-element gpu.fa2 kernel; both run the same schedule.
#: 'fa2-tc' is fp16 fa2 on the tensor cores (gpu.fa2_tc; run it with --dtype fp16).
VARIANTS = {"fa1": ("fa1", None, "^fa1_fwd"), "fa2": ("fa2", None, "^fa2_fast"),
            "fa2-plain": ("fa2", False, "^fa2_fwd"), "fa2-tc": ("fa2", None, "^fa2_tc")}
KERNEL_REGEX = {name: v[2] for name, v in VARIANTS.items()}

#: Unit multipliers to bytes / nanoseconds (ncu uses SI prefixes for bytes).
UNITS = {
    "byte": 1, "bytes": 1, "b": 1,
    "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9, "gb": 1e9,
    "tbyte": 1e12, "tb": 1e12,
    "kibyte": 1024, "kib": 1024, "mibyte": 1024**2, "mib": 1024**2, "gibyte": 1024**3, "gib": 1024**3,
    "nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
    "second": 1e9, "s": 1e9, "": 1,
}


# ---------------------------------------------------------------------------------------
# Parsing (pure)
# ---------------------------------------------------------------------------------------
def parse_value(text: str, unit: str) -> float:
    """'2,281,701,376' 'byte' -> 2281701376.0; '2.28' 'Gbyte' -> 2.28e9; ns for times."""
    u = (unit or "").strip().lower()
    if u not in UNITS:
        raise ValueError(f"unit={unit!r} is not known; allowed: {', '.join(sorted(k for k in UNITS if k))}")
    s = str(text).strip().replace(",", "")
    if s in ("", "n/a", "N/A"):
        raise ValueError(f"metric value={text!r} is not a number")
    return float(s) * UNITS[u]


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows {id, kernel, metric, unit, value (bytes or ns)} from `ncu --csv` output.

    Lines before the header (==PROF== lines, program output) are ignored; the header is
    the first line starting with "ID". Columns are found by name, so their order and any
    extra columns do not matter.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    need = ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"ncu CSV header lacks columns {missing}; got {reader.fieldnames}")
    out = []
    for r in reader:
        if r.get("ID") == "ID":   # a repeated header
            continue
        out.append({"id": r.get("ID"), "kernel": r["Kernel Name"], "metric": r["Metric Name"],
                    "unit": r["Metric Unit"],
                    "value": parse_value(r["Metric Value"], r["Metric Unit"])})
    return out


def sum_metrics(records: list[dict]) -> dict:
    """{metric: sum over kernels}, plus 'kernels': sorted distinct names and 'launches'."""
    totals: dict = {}
    for r in records:
        totals[r["metric"]] = totals.get(r["metric"], 0.0) + r["value"]
    totals["kernels"] = sorted({r["kernel"] for r in records})
    totals["launches"] = len({(r["id"], r["kernel"]) for r in records})
    return totals


def compare(totals: dict, read_bytes: int, write_bytes: int, tol: float = TOLERANCE) -> dict:
    """ncu's global ld/st bytes against the ledger's read/write bytes, with DRAM and L2
    bytes beside them. `rel_diff` = (ncu - iosim) / iosim; `agree` when |rel_diff| <= tol."""
    def rel(a, b):
        return None if a is None or not b else (a - b) / b
    ld, st = totals.get(LD), totals.get(ST)
    extra = totals.get(LD_EXTRA) if LD_EXTRA else None
    if extra is not None:
        ld = (ld or 0.0) + extra
    out = {
        "iosim_read_bytes": int(read_bytes), "iosim_write_bytes": int(write_bytes),
        "ncu_global_ld_bytes": ld, "ncu_global_st_bytes": st,
        "ncu_ld_extra_metric": LD_EXTRA, "ncu_ld_extra_bytes": extra,
        "ld_rel_diff": rel(ld, read_bytes), "st_rel_diff": rel(st, write_bytes),
        "dram_read_bytes": totals.get("dram__bytes_read.sum"),
        "dram_write_bytes": totals.get("dram__bytes_write.sum"),
        "l2_bytes": totals.get("lts__t_bytes.sum"),
        "gpu_time_ms": (totals["gpu__time_duration.sum"] / 1e6
                        if totals.get("gpu__time_duration.sum") is not None else None),
        "tolerance": tol,
        "kernels": totals.get("kernels", []), "launches": totals.get("launches", 0),
    }
    ok = [x is not None and abs(x) <= tol for x in (out["ld_rel_diff"], out["st_rel_diff"])]
    out["ld_agree"], out["st_agree"] = ok
    out["agree"] = all(ok)
    return out


def ncu_command(ncu: str, algorithm: str, log_file: str, child_args: list[str],
                base_units: bool = True) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--metrics", ",".join(METRICS),
           "-k", f"regex:{KERNEL_REGEX[algorithm]}", "--csv", "--log-file", log_file]
    if base_units:
        cmd += ["--print-units", "base"]
    return cmd + [sys.executable, str(Path(__file__).resolve()), "--child"] + child_args


def find_ncu() -> str | None:
    p = shutil.which("ncu")
    if p:
        return p
    cands = sorted(glob.glob("/usr/local/cuda*/bin/ncu") + glob.glob("/opt/nvidia/nsight-compute/*/ncu")
                   + glob.glob("/usr/local/cuda*/nsight-compute*/ncu"))
    return cands[-1] if cands else None


def format_table(results: list[dict]) -> str:
    lines = [f"{'alg':<5}{'tile':>7}{'iosim rd GB':>12}{'ncu ld GB':>10}{'diff':>8}"
             f"{'iosim wr GB':>12}{'ncu st GB':>10}{'diff':>8}{'DRAM rd GB':>11}"
             f"{'DRAM wr GB':>11}{'L2 GB':>8}{'ms':>9}  agree"]
    for r in results:
        c = r.get("compare")
        if not c:
            lines.append(f"{r['algorithm']:<5} {r.get('error', 'no result')}")
            continue

        def gb(x):
            return f"{x / 1e9:.3f}" if x is not None else "n/a"

        def pc(x):
            return f"{100 * x:+.1f}%" if x is not None else "n/a"
        lines.append(
            f"{r['algorithm']:<5}{r['block_rows']:>3}x{r['block_cols']:<3}"
            f"{gb(c['iosim_read_bytes']):>12}{gb(c['ncu_global_ld_bytes']):>10}{pc(c['ld_rel_diff']):>8}"
            f"{gb(c['iosim_write_bytes']):>12}{gb(c['ncu_global_st_bytes']):>10}{pc(c['st_rel_diff']):>8}"
            f"{gb(c['dram_read_bytes']):>11}{gb(c['dram_write_bytes']):>11}{gb(c['l2_bytes']):>8}"
            f"{(c['gpu_time_ms'] or float('nan')):>9.2f}  {'yes' if c['agree'] else 'NO'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# GPU parts
# ---------------------------------------------------------------------------------------
def _inputs(N, d, bh, dtype):
    import numpy as np
    rng = np.random.default_rng(0)
    dt = np.float32 if dtype == "fp32" else np.float16
    return [rng.standard_normal((1, bh, N, d), dtype=np.float32).astype(dt) for _ in range(3)]


def child(args) -> int:
    """One uncounted call: exactly one launch of the <alg>_fwd kernel."""
    import gpu
    q, k, v = _inputs(args.N, args.d, args.batch_heads, args.dtype)
    t0 = time.perf_counter()
    alg, fast, _ = VARIANTS[args.algorithm]
    O = gpu.attention(q, k, v, algorithm=alg, block_rows=args.block_rows,
                      block_cols=args.block_cols, **({} if fast is None else {"fast": fast}))
    import numpy as np
    print(f"child {args.algorithm}: {time.perf_counter() - t0:.2f} s, finite={bool(np.isfinite(O).all())}")
    return 0


def profile(ncu, alg, args, out_dir: Path, tiling) -> dict:
    from iosim import Problem, closed_form
    res = {"algorithm": alg, "N": args.N, "d": args.d, "batch_heads": args.batch_heads,
           "dtype": args.dtype, "block_rows": tiling.B_r, "block_cols": tiling.B_c}
    problem = Problem(N=args.N, d=args.d, batch=1, heads=args.batch_heads, dtype=args.dtype)
    ledger = closed_form(VARIANTS[alg][0], problem, tiling)
    res["iosim_per_tensor"] = ledger.per_tensor()
    child_args = ["--algorithm", alg, "--N", str(args.N), "--d", str(args.d),
                  "--batch-heads", str(args.batch_heads), "--dtype", args.dtype,
                  "--block-rows", str(tiling.B_r), "--block-cols", str(tiling.B_c)]
    text = ""
    for base_units in (True, False):
        log = out_dir / f"ncu_{alg}.csv.log"
        if log.exists():
            log.unlink()
        cmd = ncu_command(ncu, alg, str(log), child_args, base_units)
        res["command"] = " ".join(cmd)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            res["error"] = f"ncu timed out after {args.timeout} s"
            return res
        text = log.read_text() if log.exists() else ""
        (out_dir / f"ncu_{alg}.stdout.txt").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
        if '"ID"' not in text and '"ID"' in p.stdout:
            text = p.stdout
        if p.returncode == 0 or '"ID"' in text:
            break
        if not (base_units and "print-units" in (p.stderr + p.stdout + text)):
            res["error"] = (f"ncu exited {p.returncode}: "
                            + " | ".join((p.stderr + text).strip().splitlines()[-3:]))
            return res
    records = parse_ncu_csv(text)
    if not records:
        res["error"] = "ncu printed no metrics (kernel name not matched, or no permission)"
        return res
    res["compare"] = compare(sum_metrics(records), ledger.hbm_read_bytes, ledger.hbm_write_bytes)
    return res


def kernel_counts(alg, args, tiling) -> dict:
    """The instrumented kernel's own counts (not under ncu)."""
    import gpu
    q, k, v = _inputs(args.N, args.d, args.batch_heads, args.dtype)
    a, fast, _ = VARIANTS[alg]
    _O, led = gpu.attention(q, k, v, algorithm=a, block_rows=tiling.B_r,
                            block_cols=tiling.B_c, count_traffic=True,
                            **({} if fast is None else {"fast": fast}))
    return {"read_bytes": led.hbm_read_bytes, "write_bytes": led.hbm_write_bytes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--algorithm", default="fa2", choices=tuple(VARIANTS))
    ap.add_argument("--algorithms", default="fa1,fa2,fa2-plain")
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--batch-heads", type=int, default=16)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "fp16"))
    ap.add_argument("--block-rows", type=int, default=None)
    ap.add_argument("--block-cols", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per ncu run")
    ap.add_argument("--no-kernel-counts", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    from analysis.bench import numpy_problem
    msg = numpy_problem()
    if msg:
        print(f"ncu_counts: {msg}", file=sys.stderr)
        return 1
    if args.child:
        return child(args)
    algs = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    for a in algs:
        if a not in VARIANTS:
            print(f"ncu_counts: error: algorithms={a!r} is not allowed; allowed: "
                  f"{', '.join(VARIANTS)}",
                  file=sys.stderr)
            return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ncu = find_ncu()
    results = []
    from iosim import Tiling
    for alg in algs:
        if args.block_rows and args.block_cols:
            tiling = Tiling(args.block_rows, args.block_cols)
        else:
            from gpu import default_tiling
            tiling = default_tiling(VARIANTS[alg][0], args.d, args.dtype)
            if VARIANTS[alg][1] is False:     # the plain kernel's own default (48 KB)
                from gpu.api import DEFAULT_TILES
                from iosim.tiling import sram_footprint_bytes
                B = next(b for b in DEFAULT_TILES
                         if sram_footprint_bytes("fa2", b, b, args.d, args.dtype) <= 48 * 1024)
                tiling = Tiling(B, B)
        if ncu is None:
            results.append({"algorithm": alg, "error": "ncu not found on PATH or under /usr/local/cuda*"})
            continue
        t0 = time.perf_counter()
        r = profile(ncu, alg, args, out_dir, tiling)
        r["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(r)
    if not args.no_kernel_counts:
        for r in results:
            if "block_rows" not in r:
                continue
            try:
                r["kernel_counts"] = kernel_counts(r["algorithm"], args,
                                                   Tiling(r["block_rows"], r["block_cols"]))
            except Exception as e:
                r["kernel_counts"] = {"error": f"{type(e).__name__}: {e}"}
    (out_dir / "ncu_counts.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(format_table(results))
    return 0 if all(r.get("compare") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
