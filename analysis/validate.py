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
from analysis.validation_configs import LEVELS_BLIND, RUNTIME, family_of, levels_split

ROOT = Path(__file__).resolve().parents[1]
BLIND_IDS = {c["id"] for c in LEVELS_BLIND}


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
        if c["id"] in BLIND_IDS:     # LEVELS_BLIND: never fitted on (see levels_blind)
            split = "blind"
        else:
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
        for split in ("fit", "heldout", "blind", "all"):
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
# The blind levels set (analysis.validation_configs.LEVELS_BLIND): frozen predictions,
# written before the measured rows are read, then scored against them
# ---------------------------------------------------------------------------------------
BLIND_PREDICTIONS = ROOT / "benchmarks" / "results" / "runs" / "levels-blind-predictions" / "predictions.json"
LEVEL_KEYS = ("dram_read_bytes", "dram_write_bytes", "l2_read_bytes", "l2_write_bytes")


def levels_blind_predictions(model=None, gpu: str = "H100-SXM") -> dict:
    """The L2 model's predictions for every LEVELS_BLIND pass on `gpu` (the H100 it was
    measured on): per configuration the kernel and tiling the plan runs (the default of
    each kernel on that preset, as analysis.hwmeasure.resolved_tiling resolves it on
    the device) and the pass's DRAM / L2 bytes. With the frozen commit (git HEAD, which
    must be clean: the model's code and constants committed) and the model version."""
    import datetime as _dt
    from analysis.levels import FITTED, predict_row
    from analysis.validation_configs import LEVELS_BLIND
    model = model or FITTED
    commit = results.current_commit()
    if commit is None or commit.endswith("+dirty"):
        raise RuntimeError(f"commit the model first (git HEAD {commit}): the predictions name "
                           f"the frozen commit")
    preds = []
    for c in LEVELS_BLIND:
        p = predict_row(c, gpu, model)
        preds.append({"id": c["id"], "config": c, "family": family_of(c), "kernel": p["kernel"],
                      "tiling": [p["block_rows"], p["block_cols"]],
                      "predicted": {k: p[k] for k in LEVEL_KEYS + ("requested_read_bytes",
                                                                   "requested_write_bytes")},
                      "kernels": [{k: v for k, v in kk.items()} for kk in p["kernels"]],
                      "warnings": p["warnings"]})
    return {"what": "levels predictions for analysis.validation_configs.LEVELS_BLIND, frozen "
                    "before the measured rows were read",
            "frozen_commit": commit, "model_version": model_version(), "gpu_preset": gpu,
            "l2_model": {f: getattr(model, f) for f in model.__dataclass_fields__},
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "predictions": preds}


def write_levels_blind_predictions(path=BLIND_PREDICTIONS, model=None) -> Path:
    out = levels_blind_predictions(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=float, allow_nan=False) + "\n")
    return path


def levels_blind_rows(measured: list[dict], frozen: dict) -> list[dict]:
    """levels_validation-style rows (split "blind") joining measured counter rows
    (analysis.hwmeasure's format: config.id, measured.{dram,l2}_{read,write}_bytes; rows
    with an error or a status other than ok are skipped) with the frozen predictions."""
    from analysis.levels import within
    by_id = {p["id"]: p for p in frozen["predictions"]}
    out = []
    for r in measured:
        if r.get("error") or r.get("status", "ok") != "ok" or not r.get("measured"):
            continue
        cid = r["config"]["id"]
        if cid not in by_id:
            continue
        p = by_id[cid]
        m = {k: float(r["measured"][k]) for k in LEVEL_KEYS}
        pr = p["predicted"]
        err = {k: (pr[k] - m[k]) / m[k] if m[k] else None for k in LEVEL_KEYS}
        ok = {k: within(pr[k], m[k]) for k in ("dram_read_bytes", "dram_write_bytes")}
        out.append(results.make_row(
            "levels_validation", run_id=r.get("run_id", "blind"), device=r.get("device", "?"),
            date=r.get("date", "?"), commit=r.get("commit"), versions=r.get("versions", {}),
            config=p["config"], family=p["family"], split="blind",
            gpu_preset=frozen["gpu_preset"], kernel=p["kernel"], tiling=p["tiling"],
            measured_tiling=r.get("tiling"), model_version=frozen["model_version"],
            frozen_commit=frozen["frozen_commit"], l2_model=frozen["l2_model"],
            warnings=p["warnings"], measured=m, predicted=pr, rel_error=err, within_bound=ok))
    return out


def format_blind(rows: list[dict], n_expected: int | None = None) -> str:
    """Per family and overall: rows, inside the bound (DRAM reads and writes within 15 %
    or 16 MB), median and worst |relative error| of DRAM reads and writes, and each row."""
    lines = [f"{'family':<16}{'rows':>5}{'in bound':>9}{'DRAM rd med':>12}{'worst':>8}"
             f"{'DRAM wr med':>12}{'worst':>8}"]
    for fam in sorted({r["family"] for r in rows}) + ["all"]:
        ss = [r for r in rows if fam == "all" or r["family"] == fam]
        rd = _stats([r["rel_error"]["dram_read_bytes"] for r in ss])
        wr = _stats([r["rel_error"]["dram_write_bytes"] for r in ss])
        lines.append(f"{fam:<16}{len(ss):>5}{sum(all(r['within_bound'].values()) for r in ss):>9}"
                     f"{rd['median']:>12.1%}{rd['worst']:>8.0%}{wr['median']:>12.1%}{wr['worst']:>8.0%}")
    lines.append("")
    for r in rows:
        m, p, e = r["measured"], r["predicted"], r["rel_error"]
        lines.append(f"{r['config']['id'][:52]:<53}rd {m['dram_read_bytes'] / 1e6:9.1f} "
                     f"{p['dram_read_bytes'] / 1e6:9.1f} {e['dram_read_bytes']:+7.1%}  wr "
                     f"{m['dram_write_bytes'] / 1e6:8.1f} {p['dram_write_bytes'] / 1e6:8.1f} "
                     f"{e['dram_write_bytes']:+7.1%}  {'ok' if all(r['within_bound'].values()) else 'OUT'}")
    if n_expected is not None and len(rows) != n_expected:
        lines.append(f"note: {len(rows)} of {n_expected} blind passes have measured rows")
    return "\n".join(lines)


def levels_blind(measured_path, predictions_path=BLIND_PREDICTIONS, out=None) -> list[dict]:
    """Score the frozen blind predictions against measured counter rows (a JSONL file);
    print the table; write the validation rows to `out` (JSONL) if given."""
    frozen = json.loads(Path(predictions_path).read_text())
    with open(measured_path) as f:
        measured = [json.loads(line) for line in f if line.strip()]
    rows = levels_blind_rows(measured, frozen)
    print(f"frozen commit {frozen['frozen_commit']}, model {frozen['model_version']}, "
          f"preset {frozen['gpu_preset']}")
    print(format_blind(rows, len(frozen["predictions"])))
    if out:
        for r in rows:
            results.validate(r)
        with open(out, "w") as f:
            for r in rows:
                f.write(json.dumps(r, default=float, allow_nan=False) + "\n")
        print(f"wrote {len(rows)} rows to {out}")
    return rows


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
           "format_summary", "model_version", "levels_blind_predictions",
           "write_levels_blind_predictions", "levels_blind_rows", "levels_blind"]


def _main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m analysis.validate",
        description="levels-blind MEASURED.jsonl: score the frozen LEVELS_BLIND predictions "
                    "(benchmarks/results/runs/levels-blind-predictions/predictions.json) "
                    "against measured counter rows; levels-blind-predict: write them "
                    "(only from a clean, committed tree: the frozen model)")
    ap.add_argument("what", choices=("levels-blind", "levels-blind-predict"))
    ap.add_argument("measured", nargs="?")
    ap.add_argument("--predictions", default=str(BLIND_PREDICTIONS))
    ap.add_argument("--out", default=None, help="JSONL file for the blind validation rows")
    a = ap.parse_args(argv)
    if a.what == "levels-blind-predict":
        print(f"wrote {write_levels_blind_predictions(a.predictions)}")
        return 0
    if not a.measured:
        ap.error("levels-blind needs MEASURED.jsonl")
    levels_blind(a.measured, a.predictions, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
