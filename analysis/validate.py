"""Validation of the models below the ledger against the measurements in the results data
set: `levels` (the L2 / DRAM model against Nsight Compute) and `runtime` (the time model
against CUPTI kernel times).

Each writes its validation rows afresh (measured and predicted side by side, with the
model version that made them) to benchmarks/results/data/<kind>.jsonl, replacing the
previous file: predictions are derived data, never appended or reused across model
versions. `summary` rows give median and worst errors per kernel family and split.

    flashsim validate levels            # predictions for every measured configuration
    flashsim validate runtime --refit   # refit the time constants on the fit half first
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from analysis import results
from analysis.validation_configs import RUNTIME, family_of, levels_split

ROOT = Path(__file__).resolve().parents[1]


def model_version() -> str:
    """sha256 (16 hex digits) of the model's source: iosim/*.py, analysis/levels.py,
    analysis/runtime.py and the fitted time constants."""
    h = hashlib.sha256()
    files = sorted((ROOT / "iosim").glob("*.py")) + [ROOT / "analysis" / "levels.py",
                                                    ROOT / "analysis" / "runtime.py",
                                                    ROOT / "analysis" / "runtime_constants.json"]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _write(kind: str, rows: list[dict], data=None) -> Path:
    path = results.path_of(kind, data)
    for r in rows:
        results.validate(r)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=float, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _stats(errs):
    e = np.abs(np.asarray(errs, dtype=float))
    return {"n": int(e.size), "median": float(np.median(e)) if e.size else None,
            "worst": float(e.max()) if e.size else None}


# ---------------------------------------------------------------------------------------
def levels_rows(model=None, data=None) -> list[dict]:
    from analysis.levels import FITTED, GPU_OF_DEVICE, compare
    model = model or FITTED
    meas = [r for r in results.load("levels_measurement", data=data) if r.get("status") == "ok"]
    version = model_version()
    out = []
    for r, p, err, ok in compare(meas, model):
        c = r["config"]
        split = levels_split(c) if GPU_OF_DEVICE.get(r["device"]) == "H100-SXM" else "heldout"
        m = r["measured"]
        out.append(results.make_row(
            "levels_validation", run_id=r["run_id"], device=r["device"], date=r["date"],
            commit=r["commit"], versions=r["versions"], config=c, family=family_of(c),
            split=split, gpu_preset=p["gpu"], kernel=p["kernel"],
            tiling=[p["block_rows"], p["block_cols"]], model_version=version,
            l2_model=p["l2_model"], warnings=p["warnings"],
            measured={k: m[k] for k in ("dram_read_bytes", "dram_write_bytes", "l2_read_bytes",
                                        "l2_write_bytes")},
            predicted={k: p[k] for k in ("dram_read_bytes", "dram_write_bytes", "l2_read_bytes",
                                         "l2_write_bytes", "requested_read_bytes",
                                         "requested_write_bytes")},
            rel_error=err, within_bound=ok))
    return out


def levels_summary(rows) -> list[dict]:
    """Per device, split and family: median and worst |relative error| of DRAM reads and
    writes, and how many rows are inside the bound (15 % or 16 MB)."""
    out = []
    for dev in sorted({r["device"] for r in rows}):
        for split in ("fit", "heldout", "all"):
            sel = [r for r in rows if r["device"] == dev and (split == "all" or r["split"] == split)]
            if not sel:
                continue
            for fam in sorted({r["family"] for r in sel}) + ["all"]:
                ss = [r for r in sel if fam == "all" or r["family"] == fam]
                spill = [r for r in ss if r["warnings"]]
                out.append({"device": dev, "split": split, "family": fam,
                            "dram_read": _stats([r["rel_error"]["dram_read_bytes"] for r in ss]),
                            "dram_write": _stats([r["rel_error"]["dram_write_bytes"] for r in ss]),
                            "l2_read": _stats([r["rel_error"]["l2_read_bytes"] for r in ss]),
                            "inside_bound": sum(all(r["within_bound"].values()) for r in ss),
                            "rows": len(ss), "spilling_rows": len(spill)})
    return out


# ---------------------------------------------------------------------------------------
SPLIT_OF = {c["id"]: c for c in RUNTIME}


def runtime_fit(split_key: str = "split3", data=None):
    from analysis import runtime
    rows = [r for r in results.load("runtime_measurement", data=data) if r.get("status") == "ok"
            and "H100" in r["device"] and r["config"]["id"] in SPLIT_OF
            and SPLIT_OF[r["config"]["id"]][split_key] == "fit"]
    run = sorted({r["run_id"] for r in rows})
    return runtime.fit(rows, "H100-SXM", source=f"{split_key}=fit rows ({len(rows)}) of {', '.join(run)}")


def runtime_rows(model=None, split_key: str = "split3", data=None) -> list[dict]:
    from analysis import runtime
    from analysis.levels import GPU_OF_DEVICE
    model = model or runtime.RuntimeModel.load()
    meas = [r for r in results.load("runtime_measurement", data=data) if r.get("status") == "ok"
            and r["config"]["id"] in SPLIT_OF]
    version = model_version()
    out = []
    for r in meas:
        gpu = GPU_OF_DEVICE[r["device"]]
        v = runtime.validate([r], model, gpu)[0]
        c = SPLIT_OF[r["config"]["id"]]
        v.update(split=c[split_key] if gpu == "H100-SXM" else "heldout", split_key=split_key,
                 split_preregistered=c["split"], gpu_preset=gpu, model_version=version,
                 family=c["family"])
        out.append(v)
    return out


def runtime_summary(rows, split_field="split") -> list[dict]:
    out = []
    for dev in sorted({r["device"] for r in rows}):
        for split in ("fit", "heldout"):
            sel = [r for r in rows if r["device"] == dev and r[split_field] == split]
            if not sel:
                continue
            for fam in sorted({r["family"] for r in sel}) + ["all"]:
                ss = [r for r in sel if fam == "all" or r["family"] == fam]
                e = [r["rel_error"] for r in ss]
                out.append({"device": dev, "split": split, "family": fam, **_stats(e),
                            "within_10pct": int(np.sum(np.abs(e) <= 0.10))})
    return out


def format_summary(summary, what: str) -> str:
    lines = []
    if what == "levels":
        lines.append(f"{'device':<24}{'split':<9}{'family':<14}{'rows':>5}{'in bound':>9}"
                     f"{'DRAM rd med':>12}{'worst':>8}{'DRAM wr med':>12}{'worst':>8}{'L2 rd med':>10}")
        for s in summary:
            lines.append(f"{s['device'][:23]:<24}{s['split']:<9}{s['family']:<14}{s['rows']:>5}"
                         f"{s['inside_bound']:>9}{s['dram_read']['median']:>12.1%}"
                         f"{s['dram_read']['worst']:>8.0%}{s['dram_write']['median']:>12.1%}"
                         f"{s['dram_write']['worst']:>8.0%}{s['l2_read']['median']:>10.1%}")
    else:
        lines.append(f"{'device':<24}{'split':<9}{'family':<14}{'rows':>5}{'median':>9}{'worst':>8}{'<=10%':>7}")
        for s in summary:
            lines.append(f"{s['device'][:23]:<24}{s['split']:<9}{s['family']:<14}{s['n']:>5}"
                         f"{s['median']:>9.1%}{s['worst']:>8.0%}{s['within_10pct']:>7}")
    return "\n".join(lines)


__all__ = ["levels_rows", "levels_summary", "runtime_fit", "runtime_rows", "runtime_summary",
           "format_summary", "model_version"]
