"""What binds gpu.decode's default main kernels (the flat kernel on MHA, the tensor-core one
on grouped heads since 2026-12-07): Nsight Compute at issue 37's goal shapes.

The 2026-12-07 benchmark (H100) put the flat kernel at 88-90 % of HBM peak on MHA but
52-65 % on grouped heads (32 on 8) and 21-31 % on MQA (8 on 1), batch >= 8, N_kv >= 16K:
the kernel's block then serves G = 4 or 8 query rows of one K/V head (kv_reads
"per_group"). This runs one decoding step per shape under `ncu` and keeps, per launch,
the sections that say why: SpeedOfLight (DRAM throughput), Occupancy (achieved and
theoretical, the register limit), LaunchStats (registers, waves), WarpStateStats and
SchedulerStats (what the warps wait on, issue activity), MemoryWorkloadAnalysis.

    python3 benchmarks/decode_flat_ncu.py --out rows.jsonl [--ncu PATH] [--raw ncu.csv]

The parent runs itself (`--child`) under ncu (`--page raw --csv`: one row per launch,
one column per metric); the child calls gpu.decode once per shape (default main kernel,
kv_reads and split count) and writes the shapes it ran, in order, to a manifest. Rows of
kind `decode_ncu`: the shape, the launch (main kernel or combine) and every metric ncu
reported for it (name -> value, in the unit ncu printed, listed in `units`). ncu's raw
CSV is kept too (`--raw`) in case its format moves. fp16, d = 128, N_q = 1."""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np

#: (name, batch, heads, kv_heads, N_kv, page_size, kv_reads): the goal groups' shapes, MHA
#: (the kernel near the roof) beside GQA and MQA, one paged, two at batch 1, and GQA with
#: every query head reading its K/V itself (per_query_head) for contrast
SHAPES = (
    ("b8_mha_16k", 8, 32, 32, 16384, None, "auto"),
    ("b8_gqa_16k", 8, 32, 8, 16384, None, "auto"),
    ("b8_mqa_16k", 8, 8, 1, 16384, None, "auto"),
    ("b8_gqa_16k_page16", 8, 32, 8, 16384, 16, "auto"),
    ("b64_gqa_16k", 64, 32, 8, 16384, None, "auto"),
    ("b1_gqa_64k", 1, 32, 8, 65536, None, "auto"),
    ("b1_mha_128k", 1, 32, 32, 131072, None, "auto"),
    ("b8_gqa_16k_per_query_head", 8, 32, 8, 16384, None, "per_query_head"),
)
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "MemoryWorkloadAnalysis")
KERNELS = r"regex:decode_(flat|tc|combine)"
D = 128


def child(manifest: str, only: str | None = None) -> int:
    """One gpu.decode call per shape (the calls before ncu's filter: compilation, copies)."""
    import gpu
    from gpu.decode.api import auto_num_splits, choose_kv_reads, main_kernel
    from iosim.decode import DecodeProblem, paged_cache
    rng = np.random.default_rng(0)
    with open(manifest, "w") as man:
        for name, B, H, Hk, N, page, kvr in SHAPES:
            if only and name not in only.split(","):
                continue
            p = DecodeProblem(N_kv=N, d=D, batch=B, heads=H, kv_heads=Hk, dtype="fp16",
                              page_size=page)
            q = rng.standard_normal((B, H, 1, D), dtype=np.float32).astype(np.float16)
            k = rng.standard_normal((B, Hk, N, D), dtype=np.float32).astype(np.float16)
            v = rng.standard_normal((B, Hk, N, D), dtype=np.float32).astype(np.float16)
            kw = {}
            if page:
                k, v, table = paged_cache(p, k, v, seed=1)
                kw = dict(block_table=table, cache_seqlens=N)
            kr = choose_kv_reads(p, kvr)
            main = main_kernel(p, kr)
            rec = dict(shape=name, batch=B, heads=H, kv_heads=Hk, seq_len_kv=N, d=D,
                       paged=page, kv_reads=kr, dtype="fp16", main_kernel=main,
                       num_splits=auto_num_splits(p, kr, main).num_splits)
            try:
                gpu.decode(q, k, v, kv_reads=kvr, **kw)
                rec["status"] = "ok"
            except Exception as e:          # recorded, the next shape still runs
                rec.update(status="error", error=repr(e)[:300])
            man.write(json.dumps(rec) + "\n")
            man.flush()
            del q, k, v
    return 0


def parse_raw(text: str) -> tuple[list[dict], dict]:
    """([{kernel name, metrics {name: value}}] in launch order, {metric: unit}) from
    `ncu --csv --page raw` (a header row of metric names, a row of units, a row a launch)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        return [], {}
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    head = rows[0]
    # a row of units follows the names (its ID column empty) unless ncu printed none
    units, data = (rows[1], rows[2:]) if rows[1] and rows[1][0] == "" else ([""] * len(head), rows[1:])
    out = []
    for r in data:
        if len(r) != len(head):
            continue
        m = {}
        for h, val in zip(head, r):
            try:
                m[h] = float(val.replace(",", ""))
            except ValueError:
                m[h] = val
        out.append({"kernel": m.get("Kernel Name", ""), "metrics": m})
    return out, dict(zip(head, units))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="decode_ncu.jsonl")
    ap.add_argument("--raw", default=None, help="keep ncu's CSV here (default: beside --out)")
    ap.add_argument("--ncu", default=None, help="ncu (default: on PATH)")
    ap.add_argument("--timeout", type=float, default=280.0)
    ap.add_argument("--shapes", default=None,
                    help="comma-separated names of SHAPES to run (default: all)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    names = [x[0] for x in SHAPES]
    if a.shapes:
        bad = [x for x in a.shapes.split(",") if x not in names]
        if bad:
            ap.error(f"--shapes: {', '.join(bad)} not known; allowed: {', '.join(names)}")
    if a.child:
        return child(a.child, a.shapes)
    ncu = a.ncu or shutil.which("ncu")
    if not ncu:
        print("decode_flat_ncu: ncu (Nsight Compute) is not on PATH; give --ncu", file=sys.stderr)
        return 2
    man = a.out + ".manifest"
    cmd = [ncu, "--csv", "--page", "raw", "--clock-control", "none", "-k", KERNELS]
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += [sys.executable, os.path.abspath(__file__), "--child", man]
    if a.shapes:
        cmd += ["--shapes", a.shapes]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        text, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = f"ncu timed out after {a.timeout:.0f} s"
    raw = a.raw or os.path.splitext(a.out)[0] + "_ncu.csv"
    with open(raw, "w") as f:
        f.write(text)
    launches, units = parse_raw(text)
    shapes = [json.loads(ln) for ln in open(man)] if os.path.exists(man) else []
    from analysis import results as R
    from analysis.check import device_name, versions
    base = dict(run_id=R.new_run_id("decode_ncu"), device=device_name(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                commit=os.environ.get("FLASHSIM_COMMIT") or R.current_commit(),
                versions=versions())
    # each ok shape launched its main kernel, then the combine when it split (S > 1): cut
    # ncu's launch list (KERNELS: the flat or tensor-core kernel, the combine) at each main
    # kernel
    groups, cur = [], None
    for k in launches:
        if "decode_flat" in k["kernel"] or "decode_tc" in k["kernel"] or cur is None:
            cur = []
            groups.append(cur)
        cur.append(k)
    ok = [s for s in shapes if s["status"] == "ok"]
    n = 0
    with open(a.out, "a") as f:
        for s, g in zip(ok, groups):
            for k in g:
                row = R.make_row("decode_ncu", **base, **s, kernel=k["kernel"],
                           launch="combine" if "combine" in k["kernel"] else "main",
                           metrics=k["metrics"], units={m: units.get(m) for m in k["metrics"]})
                f.write(json.dumps(row) + "\n")
                n += 1
        for s in shapes:
            if s["status"] != "ok":
                f.write(json.dumps(R.make_row("decode_ncu", **base, **s)) + "\n")
    print(f"decode_flat_ncu: {len(shapes)} shapes ran, {len(launches)} launches profiled, "
          f"{n} rows -> {a.out}; ncu's CSV -> {raw}"
          + ("" if len(groups) == len(ok) else f"; WARNING: {len(groups)} launch groups for "
             f"{len(ok)} shapes (check the CSV)"))
    if err and not launches:
        print(err[-2000:], file=sys.stderr)
    return 0 if launches else 1


if __name__ == "__main__":
    sys.exit(main())
