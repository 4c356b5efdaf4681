#!/usr/bin/env python3
"""ONE-OFF (ran once, 2026-11-25; kept for provenance): fold the 26 run folders that
benchmarks/results/ held until then into the one data set, benchmarks/results/data/
<kind>.jsonl (layout and row keys: analysis/results.py).

    git checkout <a commit before the migration> -- benchmarks/results   # the old folders
    python3 scripts/migrate_results.py benchmarks/results

For each run folder, in the order the runs were made (RUNS): every JSON result becomes rows
(kinds bench, check, ncu, fast_variants, tc_tilings, host_time, device_probe); the
compute-sanitizer summaries in its logs become rows of kind sanitizer; its raw logs,
profiles and plots move unchanged to benchmarks/results/runs/<run_id>/ and every row of
the run names them (`logs`). Rows copied between folders (the "final" folders hold copies
of earlier runs' bench rows) are stored once, under the earliest run: `results.append`
skips a row whose content is already there. Rows that lack versions take the folder
notes' versions (VERSIONS). The commit that ran is not recorded for these runs (null).
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import results as R  # noqa: E402

DEVICE = "NVIDIA H100 80GB HBM3"
#: what benchmarks/results/README.md stated for every run (Python 3.12, carried numpy wheel)
VERSIONS = {"python": "3.12", "numba": "0.68.0", "numba_cuda": "0.30.4", "numpy": "2.4.6",
            "torch": "2.11.0+cu130", "driver": "580.159.04"}
#: run_id (folder, relative to benchmarks/results) -> date-time (UTC) the run was made
RUNS = [
    ("2026-11-22-h100-probe.json", "2026-11-22"),
    ("2026-11-23-h100-check", "2026-11-23T00:28"),
    ("2026-11-23-h100-check2", "2026-11-23T00:45"),
    ("2026-11-23-h100-check3", "2026-11-23T00:58"),
    ("2026-11-23-h100-bench", "2026-11-23T01:05"),
    ("2026-11-23-h100-backward", "2026-11-23T01:15"),
    ("2026-11-23-h100-bench2", "2026-11-23T01:25"),
    ("2026-11-23-h100-bench3", "2026-11-23T01:32"),
    ("2026-11-23-h100-v2-round3", "2026-11-23T04:00"),
    ("2026-11-23-h100-v2-round4", "2026-11-23T04:06"),
    ("2026-11-23-h100-v2-round5", "2026-11-23T04:10"),
    ("2026-11-23-h100-v2-check", "2026-11-23T04:13"),
    ("2026-11-23-h100-v2-bench", "2026-11-23T04:15"),
    ("2026-11-23-h100-v2-sanitize", "2026-11-23T04:24"),
    ("2026-11-23-h100-v2-d128/first", "2026-11-23T04:31"),
    ("2026-11-23-h100-v2-d128/fixed", "2026-11-23T04:34"),
    ("2026-11-23-h100-v2-round6", "2026-11-23T04:48"),
    ("2026-11-23-h100-v2-stage1", "2026-11-23T04:50"),
    ("2026-11-23-h100-v2-sanitize2", "2026-11-23T04:54"),
    ("2026-11-23-h100-v2-final-check", "2026-11-23T04:59"),
    ("2026-11-23-h100-v2-final", "2026-11-23"),
    ("2026-11-23-h100-tc-v1", "2026-11-23T19:10"),
    ("2026-11-23-h100-tc-v2", "2026-11-23T19:14"),
    ("2026-11-23-h100-tc-bench", "2026-11-23T19:23"),
    ("2026-11-23-h100-tc-final", "2026-11-23"),
    ("2026-11-25-h100-tc-mt/run1-check-time", "2026-11-25T00:27"),
    ("2026-11-25-h100-tc-mt/run2-ncu-bench", "2026-11-25T00:35"),
    ("2026-11-25-h100-tc-mt/run3-check-sanitize", "2026-11-25T00:40"),
    ("2026-11-25-h100-tc-mt/run4-race-probe", "2026-11-25T00:47"),
    ("2026-11-25-h100-tc-mt/run5-sanitize-fixed", "2026-11-25T00:50"),
    ("2026-11-25-h100-tc-mt/run6-time-fixed", "2026-11-25T00:55"),
    ("2026-11-25-h100-tc-mt/run7-key-change", "2026-11-25T00:59"),
    ("2026-11-25-h100-tc-mt/run8-host-time", "2026-11-25T01:00"),
    ("2026-11-25-h100-tc-mt/run9-review-refactor", "2026-11-25T01:12"),
    ("2026-11-25-h100-final", "2026-11-25"),
]
#: what the run notes said about a sanitizer summary that is not 0 (run_id, tool) -> note
SANITIZER_NOTES = {
    ("2026-11-23-h100-tc-v2", "racecheck"): "all 8 in cuDNN's SDPA kernels (the PyTorch "
                                            "reference); 0 in fa2_tc",
    ("2026-11-25-h100-tc-mt/run4-race-probe", "racecheck"): "the hazard in fa2_tc (MT = 2, "
        "a query block with no key tile: ldmatrix reads of Q against the warp's own O "
        "stores); fixed by a __syncwarp before the O stores (run5)",
    ("2026-11-25-h100-tc-mt/run5-sanitize-fixed", "racecheck"): "after the fix: 0 in our "
        "kernels; the 11 reported are in cuDNN's SDPA kernels (the PyTorch reference)",
}
SANITIZER_RE = re.compile(r"(ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: (\d+) hazards? .*)")


def row(kind, run_id, date, versions=None, **payload):
    return R.make_row(kind, run_id=run_id, device=DEVICE, date=date, commit=None,
                      versions=versions or VERSIONS, **payload)


def check_forward_rows(d, run_id, date, source, under=None):
    out = []
    for r in d["rows"]:
        p = dict(r)
        kernel = "plain" if p.pop("fast", None) is False else "auto"
        p.update(suite="forward", mode=d.get("mode"), kernel=kernel, source=source,
                 ok=not p.get("failures"))
        if under:
            p["under"] = under
        out.append(row("check", run_id, d.get("date") or date, d.get("versions"), **p))
    return out


def check_backward_rows(d, run_id, date, source):
    return [row("check", run_id, d.get("date") or date, d.get("versions"),
                **dict(r, suite="backward", source=source)) for r in d["rows"]]


def tc_rows(d, run_id, date, source, under=None):
    out = []
    v = d.get("versions")
    for r in d.get("checks", []):
        p = {k: v for k, v in r.items() if k not in R.REQUIRED}
        p.update(suite="tc", source=source)
        if under:
            p["under"] = under
        out.append(row("check", run_id, d.get("date") or date, v, **p))
    for r in d.get("timing", []):
        out.append(row("tc_tilings", run_id, d.get("date") or date, v, **dict(r, source=source)))
    for key, val in (d.get("host_ms_per_call") or {}).items():
        val = val if isinstance(val, dict) else {"median": val}
        out.append(row("host_time", run_id, d.get("date") or date, v,
                       **dict(val, what=key, unit="ms per gpu.attention call (host)",
                              source=source)))
    return out


def fast_variant_rows(d, run_id, date, source):
    out = []
    common = dict(source=source, bh=d.get("bh"), d_default=d.get("d"), tol=d.get("tol"))
    for key, val in d.items():
        if "|" in key and isinstance(val, dict):
            spec = d.get("variants", {}).get(val.get("variant"), {})
            out.append(row("fast_variants", run_id, date, None,
                           **dict(val, part="timing", spec=spec, **common)))
    for part in ("counts", "d128", "baselines"):
        for r in d.get(part, []):
            out.append(row("fast_variants", run_id, date, None, **dict(r, part=part, **common)))
    return out


def ncu_rows(lst, run_id, date, source):
    return [row("ncu", run_id, date, None, **dict(r, source=source)) for r in lst]


def bench_rows(lst, run_id, source):
    out = []
    for r in lst:
        p = {k: v for k, v in r.items() if k not in ("run_id", "date", "device", "versions")}
        p["bench_run_id"] = r.get("run_id")
        p["source"] = source
        out.append(R.make_row("bench", run_id=run_id, device=r.get("device") or DEVICE,
                              date=r.get("date"), commit=None,
                              versions=r.get("versions") or VERSIONS, **p))
    return out


def sanitizer_rows(text, run_id, date, source):
    """One row per compute-sanitizer summary in a log, with the tool and target named by
    the nearest preceding '--tool X ...' line."""
    out, tool, target = [], None, None
    for line in text.splitlines():
        m = re.search(r"--tool (memcheck|racecheck)\b(.*)", line)
        if m:
            tool, target = m.group(1), m.group(2).strip()[:200]
        s = SANITIZER_RE.search(line)
        if s:
            n = int(s.group(2) if s.group(2) is not None else s.group(3))
            t = "racecheck" if "RACECHECK" in s.group(1) else (tool or "memcheck")
            extra = {}
            if n and (run_id, t) in SANITIZER_NOTES:
                extra["note"] = SANITIZER_NOTES[(run_id, t)]
            out.append(row("sanitizer", run_id, date, None, tool=t, target=target,
                           summary=s.group(1).strip(), reported=n, source=source, **extra))
    return out


def convert(src: Path, dst_runs: Path, data: Path) -> dict:
    stats = {}
    for run_id, date in RUNS:
        path = src / run_id
        rows, logs = [], []
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(src).as_posix()
            name = f.name
            if f.suffix == ".json":
                d = json.loads(f.read_text())
                if name == "2026-11-22-h100-probe.json":
                    p = {k: v for k, v in d.items() if k not in ("date", "device")}
                    rows.append(row("device_probe", run_id, d["date"], None,
                                    device_detail=d["device"], **p, source=rel))
                elif name.startswith("gpu_check"):
                    rows += check_forward_rows(d, run_id, date, rel)
                elif name == "gpu_backward_check.json":
                    rows += check_backward_rows(d, run_id, date, rel)
                elif name == "fa2_fast_variants.json":
                    rows += fast_variant_rows(d, run_id, date, rel)
                elif name.startswith("ncu_counts"):
                    rows += ncu_rows(d, run_id, date, rel)
                elif name in ("api_overhead.json", "api_vs_kernel.json"):
                    for r in d["rows"]:
                        rows.append(row("host_time", run_id, date, None,
                                        **dict(r, what=name[:-5], source=rel)))
                elif name.startswith(("fa2_tc_check", "tc_", )):
                    under = None
                    if "memcheck" in name or "racecheck" in name:
                        under = "compute-sanitizer " + ("memcheck" if "memcheck" in name
                                                        else "racecheck")
                    if run_id.endswith("tc-v2") and name == "fa2_tc_check.json":
                        under = "compute-sanitizer racecheck"   # the quick pass that overwrote it
                    rows += tc_rows(d, run_id, date, rel, under)
                elif isinstance(d, list) and d and "impl" in d[0]:
                    rows += bench_rows(d, run_id, rel)
                else:
                    raise SystemExit(f"no rule for {rel}")
                continue
            # raw history: moved unchanged
            target = dst_runs / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
            logs.append("runs/" + rel)
            if f.suffix in (".txt", ".log"):
                rows += sanitizer_rows(f.read_text(errors="replace"), run_id, date, rel)
        for r in rows:
            if logs:
                r["logs"] = logs
        added, skipped = R.append(rows, data=data)
        stats[run_id] = (added, skipped)
        print(f"{run_id:<45} {added:>4} rows added, {skipped:>4} already there, "
              f"{len(logs)} raw files")
    return stats


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0] if argv else ROOT / "benchmarks" / "results")
    data = src / "data"
    if data.exists() and any(data.iterdir()):
        raise SystemExit(f"{data} is not empty: the migration ran already")
    convert(src, src / "runs", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
