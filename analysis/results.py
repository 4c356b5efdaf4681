"""The results data set: every measurement and validation row, one place, no copies.

Layout: `benchmarks/results/data/<kind>.jsonl`, one JSON object per line. Every row has

    kind      what it is: bench, check, ncu, sanitizer, fast_variants, tc_tilings,
              host_time, device_probe, levels_validation, runtime_validation, ...
    run_id    the run that made it, stable (e.g. "2026-11-23-h100-v2-stage1" or
              "2026-11-25-h100-tc-mt/run2-ncu-bench"; new runs: "<kind>-<UTC time>-<hex>")
    device    the device's name as the driver reports it ("NVIDIA H100 80GB HBM3")
    date      ISO date or date-time (UTC) of the run
    commit    the git commit that ran, where known; else null
    versions  dict of package / driver versions (python, numba, numba_cuda, numpy, torch,
              driver, ...); from the run's own record or its folder's notes

plus its payload (kind-specific keys, e.g. a bench row's impl, dtype, N, d, ms_median).
Rows may name raw logs kept as history in `benchmarks/results/runs/<run_id>/` (key
`logs`: paths relative to benchmarks/results/).

The same row is never stored twice: `fingerprint(row)` hashes the row without its
run_id and logs, and `append` skips rows whose fingerprint is already in the file (the
earliest run keeps it). `load(kind, device=..., **where)` reads rows back.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
#: where the data set lives (FLASHSIM_RESULTS overrides: a folder holding <kind>.jsonl)
DEFAULT_DATA = ROOT / "benchmarks" / "results" / "data"
REQUIRED = ("kind", "run_id", "device", "date", "commit", "versions")
#: keys left out of a row's fingerprint: where it was recorded, not what it says
NOT_CONTENT = ("run_id", "logs", "source")


def data_dir(data=None) -> Path:
    if data is not None:
        return Path(data)
    env = os.environ.get("FLASHSIM_RESULTS")
    return Path(env) if env else DEFAULT_DATA


def existing_data_dir(data=None) -> Path:
    """data_dir(data) if it is a folder, else ValueError naming it and where it came from
    (--data, $FLASHSIM_RESULTS or the default): reading a data set that is not there is an
    error, not an empty answer."""
    d = data_dir(data)
    if not d.is_dir():
        where = ("--data" if data is not None else
                 "$FLASHSIM_RESULTS" if os.environ.get("FLASHSIM_RESULTS") else "the default")
        what = "is not a folder" if d.exists() else "does not exist"
        raise ValueError(f"data set folder {str(d)!r} ({where}) {what}; allowed: a folder "
                         f"of <kind>.jsonl files")
    return d


def check_kind_known(kind: str, data=None) -> str:
    """kind if the data set (which must exist) has rows of it, else ValueError naming it
    and the kinds there are."""
    _check_kind(kind)
    d = existing_data_dir(data)
    known = kinds(data)
    if kind not in known:
        raise ValueError(f"kind={kind!r} is not in the data set at {str(d)!r}; allowed: "
                         f"{', '.join(known) if known else '(none: the folder is empty)'}")
    return kind


def path_of(kind: str, data=None) -> Path:
    _check_kind(kind)
    return data_dir(data) / f"{kind}.jsonl"


def _check_kind(kind) -> None:
    if not isinstance(kind, str) or not kind or not all(c.isalnum() or c == "_" for c in kind):
        raise ValueError(f"kind={kind!r} is not allowed; allowed: a name of letters, digits "
                         f"and '_' (it names the file <kind>.jsonl)")


def kinds(data=None) -> list[str]:
    d = data_dir(data)
    return sorted(p.stem for p in d.glob("*.jsonl")) if d.is_dir() else []


def fingerprint(row: dict) -> str:
    """sha256 of the row's content (canonical JSON without NOT_CONTENT keys)."""
    body = {k: v for k, v in row.items() if k not in NOT_CONTENT}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _read(path: Path) -> list[dict]:
    rows = []
    if not path.exists():
        return rows
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON object ({e.msg})") from None
    return rows


def load(kind: str | None = None, *, device: str | None = None, data=None,
         **where) -> list[dict]:
    """Rows of `kind` (every kind if None), in file order. device: keep rows whose device
    contains this text (case-insensitive); where: keep rows with row[key] == value."""
    names = [kind] if kind is not None else kinds(data)
    out = []
    for k in names:
        for row in _read(path_of(k, data)):
            if device is not None and device.lower() not in str(row.get("device", "")).lower():
                continue
            if any(row.get(key) != val for key, val in where.items()):
                continue
            out.append(row)
    return out


def validate(row: dict) -> None:
    """ValueError naming the first missing or bad required key."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a dict; got {type(row).__name__}")
    for key in REQUIRED:
        if key not in row:
            raise ValueError(f"row lacks {key!r}; every row has {', '.join(REQUIRED)}")
    _check_kind(row["kind"])
    if not isinstance(row["run_id"], str) or not row["run_id"]:
        raise ValueError(f"run_id={row['run_id']!r} must be a non-empty string")
    if not isinstance(row["versions"], dict):
        raise ValueError(f"versions={row['versions']!r} must be a dict")


def append(rows: Iterable[dict], data=None) -> tuple[int, int]:
    """Append rows to their kinds' files, skipping any whose fingerprint is already there
    (or earlier in `rows`). Returns (added, skipped). Rows are validated first: a bad row
    adds nothing."""
    rows = list(rows)
    for r in rows:
        validate(r)
    added = skipped = 0
    by_kind: dict[str, list[dict]] = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(r)
    for kind, new in by_kind.items():
        path = path_of(kind, data)
        seen = {fingerprint(r) for r in _read(path)}
        lines = []
        for r in new:
            fp = fingerprint(r)
            if fp in seen:
                skipped += 1
                continue
            seen.add(fp)
            lines.append(json.dumps(r, default=str, allow_nan=False))
        if lines:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write("\n".join(lines) + "\n")
            added += len(lines)
    return added, skipped


def make_row(kind: str, *, run_id: str, device: str, date: str, commit: str | None,
             versions: dict, **payload) -> dict:
    """A row with the required keys first, then the payload."""
    row = {"kind": kind, "run_id": run_id, "device": device, "date": date, "commit": commit,
           "versions": dict(versions or {})}
    row.update(payload)
    return row


def junit_rows(xml_text: str, command: str | None = None) -> list[dict]:
    """gpu_tests rows (test: the pytest node id, outcome: passed / failed / error /
    skipped, seconds, command; date: the suite's start, UTC) from pytest's JUnit XML
    (`--junitxml`), one per test case. The XML names no device, run, commit or versions:
    the caller adds them."""
    import xml.etree.ElementTree as ET
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as e:
        raise ValueError(f"not JUnit XML: {e}") from None
    rows = []
    stamp = next((ts.get("timestamp") for ts in root.iter("testsuite") if ts.get("timestamp")),
                 None)
    date = None
    if stamp:
        t = _dt.datetime.fromisoformat(stamp)
        t = t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)
        date = t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for tc in root.iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        path = cls.replace(".", "/") + ".py" if cls else ""
        outcome = next((tag for tag in ("failure", "error", "skipped")
                        if tc.find(tag) is not None), "passed")
        rows.append({"kind": "gpu_tests", "test": f"{path}::{name}" if path else name,
                     "outcome": {"failure": "failed"}.get(outcome, outcome),
                     "seconds": float(tc.get("time", 0.0)), "command": command,
                     **({"date": date} if date else {})})
    return rows


def current_commit(cwd=ROOT) -> str | None:
    """HEAD of the repository the package runs from (with '+dirty' if the working tree
    has changes), or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def new_run_id(prefix: str) -> str:
    """'<prefix>-<UTC yyyymmddThhmmss>-<6 hex>': unique for a new run."""
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{prefix}-{now}-{uuid.uuid4().hex[:6]}"
