"""`flashsim report --no-kernels` runs shared by several tests (each run is ~20 s of
model evaluations and figure drawing): started early as a background job
(tests/_background.py), their output read by every test that checks one aspect of it."""
import json
import os
import subprocess
import sys

import _background

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stale_sweep_rows():
    """Two stale rows of the report's first model-sweep point: one with an old model
    version, one with none (the report must regenerate both)."""
    from analysis import sweeps
    from analysis.report import MODEL_GRID
    pt = {**sweeps.grid(**MODEL_GRID)[0]}
    stale = {**sweeps.normalise(pt), "key": sweeps.point_key(pt), "status": "ok", "hbm_bytes": 1,
             "model_version": "stale"}
    return [stale, {**stale, "model_version": None}]


def concurrent_reports():
    """The issue's example: two `flashsim report --no-kernels --out DIR` at once, into a
    directory whose sweep_model.jsonl holds stale rows. Returns (DIR, [(status, output)])."""
    out_dir = _background.mkdtemp("report")
    with open(os.path.join(out_dir, "sweep_model.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in stale_sweep_rows()))
    cmd = [sys.executable, "-m", "analysis.cli", "report", "--no-kernels", "--out", out_dir]
    procs = [_background.popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for _ in range(2)]
    runs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        runs.append((p.returncode, out.decode(errors="replace")))
    return out_dir, runs


def concurrent_reports_result():
    return _background.result(concurrent_reports)
