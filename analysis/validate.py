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
from analysis.validation_configs import (LEVELS_BLIND, LEVELS_BLIND2, LEVELS_BLIND3,
                                         LEVELS_BLIND4, LEVELS_FP32_FAST, LEVELS_NEW, RUNTIME,
                                         RUNTIME_BLIND, RUNTIME_BLIND2, RUNTIME_BLIND3,
                                         RUNTIME_BLIND4, RUNTIME_DEV3, family_of, levels_split,
                                         LEVELS_BLIND5, RUNTIME_BLIND5, RUNTIME_DEV5,
                                         LEVELS_BLIND6, RUNTIME_BLIND6, RUNTIME_DEV6,
                                         LEVELS_BLIND7, RUNTIME_BLIND7, RUNTIME_DEV7,
                                         LEVELS_BLIND8, RUNTIME_BLIND8, RUNTIME_DEV8,
                                         LEVELS_BLIND9, LEVELS_BLIND10, RUNTIME_BLIND11,
                                         LEVELS_BLIND11, RUNTIME_BLIND12, LEVELS_BLIND12,
                                         RUNTIME_BLIND13)

ROOT = Path(__file__).resolve().parents[1]
#: measured after the L2 model was frozen (c9b0b77) and never fitted on: the blind set and
#: the fp32 fast forward kernels' first Nsight Compute rows
BLIND_IDS = {c["id"] for c in LEVELS_BLIND + LEVELS_FP32_FAST}
RUNS = ROOT / "benchmarks" / "results" / "runs"
#: each blind set: (its configurations, the split its scored rows carry, the frozen
#: predictions file)
LEVELS_BLIND_SETS = {
    "levels_blind": (LEVELS_BLIND, "blind", RUNS / "levels-blind-predictions" / "predictions.json"),
    "levels_blind2": (LEVELS_BLIND2, "blind2", RUNS / "levels-blind2-predictions" / "predictions.json"),
    "levels_blind3": (LEVELS_BLIND3, "blind3", RUNS / "levels-blind3-predictions" / "predictions.json"),
    "levels_blind4": (LEVELS_BLIND4, "blind4", RUNS / "levels-blind4-predictions" / "predictions.json"),
    "levels_blind5": (LEVELS_BLIND5, "blind5", RUNS / "levels-blind5-predictions" / "predictions.json"),
    "levels_blind6": (LEVELS_BLIND6, "blind6", RUNS / "levels-blind6-predictions" / "predictions.json"),
    "levels_blind7": (LEVELS_BLIND7, "blind7", RUNS / "levels-blind7-predictions" / "predictions.json"),
    "levels_blind8": (LEVELS_BLIND8, "blind8", RUNS / "levels-blind8-predictions" / "predictions.json"),
    "levels_blind9": (LEVELS_BLIND9, "blind9", RUNS / "levels-blind9-predictions" / "predictions.json"),
    "levels_blind10": (LEVELS_BLIND10, "blind10",
                       RUNS / "levels-blind10-predictions" / "predictions.json"),
    # issue 39: the passes of runtime_blind11, counted (DRAM / L2 across the space)
    "levels_blind11": (LEVELS_BLIND11, "blind11",
                       RUNS / "levels-blind11-predictions" / "predictions.json"),
    # the second across the space, declared after blind11 was scored and fitted on (time
    # form 11; the tensor-core builds' registers from ptxas at every head dim)
    "levels_blind12": (LEVELS_BLIND12, "blind12",
                       RUNS / "levels-blind12-predictions" / "predictions.json")}
RUNTIME_BLIND_SETS = {
    "runtime_blind": (RUNTIME_BLIND, "blind", RUNS / "runtime-blind-predictions" / "predictions.json"),
    "runtime_blind2": (RUNTIME_BLIND2, "blind2",
                       RUNS / "runtime-blind2-predictions" / "predictions.json"),
    "runtime_blind3": (RUNTIME_BLIND3, "blind3",
                       RUNS / "runtime-blind3-predictions" / "predictions.json"),
    "runtime_blind4": (RUNTIME_BLIND4, "blind4",
                       RUNS / "runtime-blind4-predictions" / "predictions.json"),
    "runtime_blind5": (RUNTIME_BLIND5, "blind5",
                       RUNS / "runtime-blind5-predictions" / "predictions.json"),
    "runtime_blind6": (RUNTIME_BLIND6, "blind6",
                       RUNS / "runtime-blind6-predictions" / "predictions.json"),
    "runtime_blind7": (RUNTIME_BLIND7, "blind7",
                       RUNS / "runtime-blind7-predictions" / "predictions.json"),
    "runtime_blind8": (RUNTIME_BLIND8, "blind8",
                       RUNS / "runtime-blind8-predictions" / "predictions.json"),
    # issue 39: across the space (odd d, bf16, grouped heads, windows / N_k != N declined)
    "runtime_blind11": (RUNTIME_BLIND11, "blind11",
                        RUNS / "runtime-blind11-predictions" / "predictions.json"),
    # the second across the space (new head dims, published models' grouped heads)
    "runtime_blind12": (RUNTIME_BLIND12, "blind12",
                        RUNS / "runtime-blind12-predictions" / "predictions.json"),
    # the third (form 12's element-wise copies at d % 8 != 0; blind12's other misses)
    "runtime_blind13": (RUNTIME_BLIND13, "blind13",
                        RUNS / "runtime-blind13-predictions" / "predictions.json")}
#: the split each scored blind set's rows carry, in order of the rounds (a round's levels
#: and runtime sets share the name; the ninth round has a levels set only)
BLIND_SPLITS = tuple(dict.fromkeys(
    [split for _, split, _ in RUNTIME_BLIND_SETS.values()]
    + [split for _, split, _ in LEVELS_BLIND_SETS.values()]))


def model_version() -> str:
    """sha256 (16 hex digits) of the model's source: iosim's modules and its fitted
    constants (iosim/**/*.py, iosim/**/*.json)."""
    h = hashlib.sha256()
    files = sorted((ROOT / "iosim").rglob("*.py")) + sorted((ROOT / "iosim").rglob("*.json"))
    for f in files:
        h.update(f.relative_to(ROOT).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _write(kind: str, rows: list[dict], data=None) -> Path:
    return _write_jsonl(results.path_of(kind, data), rows)


def _write_jsonl(path, rows: list[dict]) -> Path:
    """Validated rows to `path` as JSON lines, replacing it whole (through a temporary)."""
    path = Path(path)
    for r in rows:
        results.validate(r)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=float, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _stats(errs):
    """n, median and worst |error|; None (no measured bytes: no relative error, e.g. a
    pass that wrote nothing to DRAM) is left out."""
    e = np.abs(np.asarray([x for x in errs if x is not None], dtype=float))
    return {"n": int(e.size), "median": float(np.median(e)) if e.size else None,
            "worst": float(e.max()) if e.size else None}


# ---------------------------------------------------------------------------------------
def predictions_path(path, gpu: str) -> Path:
    """A blind set's frozen predictions file for a GPU preset: `path` itself for the
    H100-SXM (where the sets are measured first), predictions-<preset>.json beside it for
    another preset (the same frozen model, only the preset changed)."""
    path = Path(path)
    return path if gpu == "H100-SXM" else path.with_name(f"predictions-{gpu}.json")


def _frozen_levels() -> dict:
    """{(GPU preset, config id): (set name, split, frozen prediction record, the file's
    header)} over the blind sets whose frozen predictions exist (every preset's file)."""
    out = {}
    for name, (_, split, path) in LEVELS_BLIND_SETS.items():
        for f in sorted(Path(path).parent.glob("predictions*.json")):
            frozen = json.loads(f.read_text())
            for p in frozen["predictions"]:
                out[(frozen.get("gpu_preset", "H100-SXM"), p["id"])] = (name, split, p, frozen)
    return out


def _same_prediction(pred: dict, frozen: dict) -> bool:
    """Whether the current model predicts what was frozen: the points and, where the
    frozen record has them, the ranges (a range that moved is a new prediction too: its
    blind score stays the frozen one)."""
    from analysis.fit_levels import LEVEL_KEYS
    same = lambda a, b: abs(a - b) <= 1e-9 * max(1.0, abs(b))
    ranges = [k + "_range" for k in ("dram_read_bytes", "dram_write_bytes") if k + "_range" in frozen]
    return (all(same(pred[k], frozen[k]) for k in LEVEL_KEYS)
            and all(k in pred and all(same(a, b) for a, b in zip(pred[k], frozen[k]))
                    for k in ranges))


def levels_rows(model=None, data=None) -> list[dict]:
    """One levels_validation row per measured pass, predicted by the current model (split:
    levels_split's fit / heldout on the H100, heldout on the H200). A pass of a blind set
    whose frozen predictions exist keeps the set's split ("blind", "blind2", ...) while the
    current model still predicts exactly the frozen figures; once the model has changed,
    its current-model row is a development row (`blind_set` names the set it was scored
    in) and the frozen score is kept beside it as a row of the set's split
    (levels_blind_rows). LEVELS_FP32_FAST (no predictions file: measured with the L2
    model v3 unchanged) is "blind" while the LEVELS_BLIND passes are."""
    from analysis.fit_levels import GPU_OF_DEVICE, LEVEL_KEYS, compare, within_chip_range
    from iosim.memory import FITTED
    model = model or FITTED
    meas = [r for r in results.load("levels_measurement", data=data) if r.get("status") == "ok"]
    version = model_version()
    frozen = _frozen_levels()
    out, current = [], []
    rescored = {}            # (set, preset) -> (its frozen file, measured rows it scored)
    for r, p, err, ok in compare(meas, model):
        c = r["config"]
        gpu = GPU_OF_DEVICE.get(r["device"])
        h100 = gpu == "H100-SXM"
        split, blind_set = (levels_split(c) if h100 else "heldout"), None
        if (gpu, c["id"]) in frozen:
            name, bsplit, fp, _ = frozen[(gpu, c["id"])]
            if _same_prediction(p, fp["predicted"]):
                split = bsplit
            else:
                blind_set = name
                rescored.setdefault((name, gpu), (frozen[(gpu, c["id"])][3], []))[1].append(r)
        elif h100 and c["id"] in BLIND_IDS:
            blind_set = "levels_fp32_fast"
        current.append((r, p, err, ok, split, blind_set))
    still_blind = ("levels_blind", "H100-SXM") not in rescored
    for r, p, err, ok, split, blind_set in current:
        c = r["config"]
        if blind_set == "levels_fp32_fast" and still_blind:
            split, blind_set = "blind", None
        m = r["measured"]
        extra = {"blind_set": blind_set} if blind_set else {}
        out.append(results.make_row(
            "levels_validation", run_id=r["run_id"], device=r["device"], date=r["date"],
            commit=r["commit"], versions=r["versions"], config=c, family=family_of(c),
            split=split, gpu_preset=p["gpu"], kernel=p["kernel"],
            tiling=[p["block_rows"], p["block_cols"]], model_version=version,
            l2_model=p["l2_model"], warnings=p["warnings"],
            measured={k: m[k] for k in LEVEL_KEYS},
            predicted={k: p[k] for k in LEVEL_KEYS + ("requested_read_bytes",
                                                      "requested_write_bytes",
                                                      "dram_read_bytes_range",
                                                      "dram_write_bytes_range") if k in p},
            rel_error=err, within_bound=ok, within_chip_range=within_chip_range(p, m),
            **extra))
    for hdr, rows in rescored.values():          # the frozen score of a set the model left
        out += levels_blind_rows(rows, hdr)
    return out


def levels_summary(rows) -> list[dict]:
    """Per device, split and family: median and worst |relative error| of DRAM reads and
    writes, and how many rows are inside the bound (15 % or 16 MB)."""
    out = []
    for dev in sorted({r["device"] for r in rows}):
        for split in ("fit", "heldout") + BLIND_SPLITS + ("all",):
            # "all": the current model's rows (a blind set's frozen score, kept beside its
            # current-model row once the model has changed, is not counted twice)
            sel = [r for r in rows if r["device"] == dev and (
                r["split"] == split if split != "all" else "frozen_commit" not in r)]
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
                            # measured inside the chip-to-chip range (levels' dram_*_range,
                            # widened by the bound's tolerance); a frozen blind row, which has
                            # no range, counts its point (within_bound)
                            "inside_chip_range": sum(all(r.get("within_chip_range",
                                                               r["within_bound"]).values())
                                                     for r in ss),
                            "rows": len(ss), "spilling_rows": len(spill)})
    return out


# ---------------------------------------------------------------------------------------
# The blind levels set (analysis.validation_configs.LEVELS_BLIND): frozen predictions,
# written before the measured rows are read, then scored against them
# ---------------------------------------------------------------------------------------
LEVELS_BLIND_PREDICTIONS = LEVELS_BLIND_SETS["levels_blind"][2]


def _write_frozen(path, obj: dict) -> Path:
    """A frozen predictions file (JSON) at `path`, its folder made if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=float, allow_nan=False) + "\n")
    return path


def _frozen_commit() -> str:
    commit = results.current_commit()
    if commit is None or commit.endswith("+dirty"):
        raise RuntimeError(f"commit the model first (git HEAD {commit}): the predictions name "
                           f"the frozen commit")
    return commit


def levels_blind_predictions(model=None, gpu: str = "H100-SXM", set_name: str = "levels_blind") -> dict:
    """The L2 model's predictions for every pass of a blind set (`set_name`, a key of
    LEVELS_BLIND_SETS) on `gpu` (the H100 it was
    measured on): per configuration the kernel and tiling the plan runs (the default of
    each kernel on that preset, as analysis.hwmeasure.resolved_tiling resolves it on
    the device) and the pass's DRAM / L2 bytes. With the frozen commit (git HEAD, which
    must be clean: the model's code and constants committed) and the model version."""
    import datetime as _dt
    from analysis.fit_levels import LEVEL_KEYS, predict_row
    from iosim.memory import FITTED
    model = model or FITTED
    commit = _frozen_commit()
    configs, split, _ = LEVELS_BLIND_SETS[set_name]
    preds = []
    for c in configs:
        p = predict_row(c, gpu, model)
        preds.append({"id": c["id"], "config": c, "family": family_of(c), "kernel": p["kernel"],
                      "tiling": [p["block_rows"], p["block_cols"]],
                      "predicted": {k: p[k] for k in LEVEL_KEYS + (
                          "requested_read_bytes", "requested_write_bytes",
                          "dram_read_bytes_range", "dram_write_bytes_range") if k in p},
                      "kernels": [{k: v for k, v in kk.items()} for kk in p["kernels"]],
                      "warnings": p["warnings"]})
    return {"what": f"levels predictions for analysis.validation_configs.{set_name.upper()}, "
                    "frozen before the measured rows were read",
            "set": set_name, "split": split, "frozen_commit": commit, "model_version": model_version(), "gpu_preset": gpu,
            "l2_model": {f: getattr(model, f) for f in model.__dataclass_fields__},
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "predictions": preds}


def write_levels_blind_predictions(path=None, model=None, set_name: str = "levels_blind",
                                   gpu: str = "H100-SXM") -> Path:
    return _write_frozen(path or predictions_path(LEVELS_BLIND_SETS[set_name][2], gpu),
                         levels_blind_predictions(model, gpu=gpu, set_name=set_name))


def levels_blind_rows(measured: list[dict], frozen: dict) -> list[dict]:
    """levels_validation-style rows (split "blind", or the frozen set's own) joining measured counter rows
    (analysis.hwmeasure's format: config.id, measured.{dram,l2}_{read,write}_bytes; rows
    with an error or a status other than ok are skipped) with the frozen predictions."""
    from analysis.fit_levels import LEVEL_KEYS, errors, within_chip_range
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
        err, ok = errors(pr, m)
        out.append(results.make_row(
            "levels_validation", run_id=r.get("run_id", "blind"), device=r.get("device", "?"),
            date=r.get("date", "?"), commit=r.get("commit"), versions=r.get("versions", {}),
            config=p["config"], family=p["family"], split=frozen.get("split", "blind"),
            gpu_preset=frozen["gpu_preset"], kernel=p["kernel"], tiling=p["tiling"],
            measured_tiling=r.get("tiling"), model_version=frozen["model_version"],
            frozen_commit=frozen["frozen_commit"], l2_model=frozen["l2_model"],
            warnings=p["warnings"], measured=m, predicted=pr, rel_error=err, within_bound=ok,
            # frozen with a range (v12 on): scored against it too; earlier sets: none
            **({"within_chip_range": within_chip_range(pr, m)}
               if "dram_read_bytes_range" in pr else {})))
    return out


def format_levels_blind(rows: list[dict], n_expected: int | None = None) -> str:
    """Per family and overall: rows, inside the bound (DRAM reads and writes within 15 %
    or 16 MB), median and worst |relative error| of DRAM reads and writes, and each row."""
    ranged = bool(rows) and all("within_chip_range" in r for r in rows)
    lines = [f"{'family':<16}{'rows':>5}{'in bound':>9}{'DRAM rd med':>12}{'worst':>8}"
             f"{'DRAM wr med':>12}{'worst':>8}" + (f"{'in chip range':>15}" if ranged else "")]
    for fam in sorted({r["family"] for r in rows}) + ["all"]:
        ss = [r for r in rows if fam == "all" or r["family"] == fam]
        rd = _stats([r["rel_error"]["dram_read_bytes"] for r in ss])
        wr = _stats([r["rel_error"]["dram_write_bytes"] for r in ss])
        lines.append(f"{fam:<16}{len(ss):>5}{sum(all(r['within_bound'].values()) for r in ss):>9}"
                     f"{rd['median']:>12.1%}{rd['worst']:>8.0%}{wr['median']:>12.1%}{wr['worst']:>8.0%}"
                     + (f"{sum(all(r['within_chip_range'].values()) for r in ss):>15}"
                        if ranged else ""))
    lines.append("")
    for r in rows:
        m, p, e = r["measured"], r["predicted"], r["rel_error"]
        lines.append(f"{r['config']['id'][:52]:<53}rd {m['dram_read_bytes'] / 1e6:9.1f} "
                     f"{p['dram_read_bytes'] / 1e6:9.1f} {e['dram_read_bytes']:+7.1%}  wr "
                     f"{m['dram_write_bytes'] / 1e6:8.1f} {p['dram_write_bytes'] / 1e6:8.1f} "
                     f"{e['dram_write_bytes']:+7.1%}  {'ok' if all(r['within_bound'].values()) else 'OUT'}"
                     + (f"  range rd {p['dram_read_bytes_range'][0] / 1e6:.0f}-"
                        f"{p['dram_read_bytes_range'][1] / 1e6:.0f} wr "
                        f"{p['dram_write_bytes_range'][0] / 1e6:.0f}-"
                        f"{p['dram_write_bytes_range'][1] / 1e6:.0f} "
                        f"{'in' if all(r['within_chip_range'].values()) else 'OUT'}"
                        if ranged else ""))
    if n_expected is not None and len(rows) != n_expected:
        lines.append(f"note: {len(rows)} of {n_expected} blind passes have measured rows")
    return "\n".join(lines)


def levels_blind(measured_path, predictions_path=LEVELS_BLIND_PREDICTIONS, out=None) -> list[dict]:
    """Score the frozen blind predictions against measured counter rows (a JSONL file);
    print the table; write the validation rows to `out` (JSONL) if given."""
    frozen = json.loads(Path(predictions_path).read_text())
    print(f"set {frozen.get('set', 'levels_blind')} (split {frozen.get('split', 'blind')})")
    with open(measured_path) as f:
        measured = [json.loads(line) for line in f if line.strip()]
    rows = levels_blind_rows(measured, frozen)
    print(f"frozen commit {frozen['frozen_commit']}, model {frozen['model_version']}, "
          f"preset {frozen['gpu_preset']}")
    print(format_levels_blind(rows, len(frozen["predictions"])))
    if out:
        print(f"wrote {len(rows)} rows to {_write_jsonl(out, rows)}")
    return rows


# ---------------------------------------------------------------------------------------
#: the measured configurations the time model is developed on: RUNTIME (every split) and
#: LEVELS_NEW (the newer default kernels, run 2026-11-25-h100-runtime-new)
SPLIT_OF = {c["id"]: c for c in RUNTIME}
SPLIT_OF.update({c["id"]: dict(c, family=family_of(c), split="new", split3="new")
                 for c in LEVELS_NEW})
#: then, each with its split3 tag: the first blind set (scored against its frozen
#: predictions: the split "blind" rows of runtime_validation), the second (frozen model
#: d7c7db6, split "blind2" rows), the third (frozen model 1e821c2, split "blind3"
#: rows), the fourth (frozen model 972eff4, split "blind4" rows), the fifth (split
#: "blind5" rows), the sixth (frozen model ac08151, split "blind6" rows) and the seventh
#: (frozen model bf23b81, split "blind7" rows), the eighth (frozen 1630114, split "blind8")
#: and the first across the space (frozen 37c5a1b, split "blind11"; form 11's w_sat_tc
#: was fitted with its rows), the second (frozen 15f9ee7, split "blind12"; form 12's
#: element-wise rounds were added after its d = 59 and 100 rows), each taken as
#: development rows once scored; and the
#: seventh, ninth, tenth, eleventh and
#: twelfth sessions' development rows (RUNTIME_DEV3, RUNTIME_DEV5, RUNTIME_DEV6,
#: RUNTIME_DEV7, RUNTIME_DEV8, declared before measuring)
for _configs, _tag in ((RUNTIME_BLIND, "blind1"), (RUNTIME_BLIND2, "blind2"),
                       (RUNTIME_DEV3, "dev3"), (RUNTIME_BLIND3, "blind3"),
                       (RUNTIME_BLIND4, "blind4"), (RUNTIME_DEV5, "dev5"),
                       (RUNTIME_BLIND5, "blind5"), (RUNTIME_DEV6, "dev6"),
                       (RUNTIME_BLIND6, "blind6"), (RUNTIME_DEV7, "dev7"),
                       (RUNTIME_BLIND7, "blind7"), (RUNTIME_DEV8, "dev8"),
                       (RUNTIME_BLIND8, "blind8"), (RUNTIME_BLIND11, "blind11"),
                       (RUNTIME_BLIND12, "blind12"), (RUNTIME_BLIND13, "blind13")):
    SPLIT_OF.update({c["id"]: dict(c, family=family_of(c), split3=_tag)
                     for c in _configs if c["id"] not in SPLIT_OF})
#: cross-validation of the model form on the H100 rows: folds by sha256(id)[1] mod CV_FOLDS
CV_FOLDS = 5
RUNTIME_BLIND_PREDICTIONS = RUNTIME_BLIND_SETS["runtime_blind"][2]


def cv_fold(cid: str, k: int = CV_FOLDS) -> int:
    return hashlib.sha256(cid.encode()).digest()[1] % k


def runtime_measured(data=None) -> list[dict]:
    """The measured rows the time model is fitted and checked on (H100 and H200): per
    configuration and device the latest row (a kernel changed since may have been
    measured again: the fp32 fast standard after its softmax was coalesced)."""
    latest = {}
    for r in results.load("runtime_measurement", data=data):
        if r.get("status") == "ok" and r["config"]["id"] in SPLIT_OF:
            key = (r["config"]["id"], r["device"])
            if key not in latest or r["date"] >= latest[key]["date"]:
                latest[key] = r
    return list(latest.values())


def _features(rows):
    from analysis import fit_runtime
    from analysis.fit_levels import GPU_OF_DEVICE
    return [fit_runtime.row_features(r, GPU_OF_DEVICE[r["device"]]) for r in rows]


def _fit_on(rows, feats, keep, source, fixed=None):
    from analysis import fit_runtime
    from iosim import get_hardware
    data = [(f, m) for r, (fs, ms) in zip(rows, feats) if "H100" in r["device"] and keep(r)
            for f, m in zip(fs, ms)]
    return fit_runtime.fit_best(data, get_hardware("H100-SXM"), source=source, fixed=fixed)


def runtime_fit(data=None, free=None):
    """The constants fitted on every H100 development row (RUNTIME, all splits, and the
    newer kernels' LEVELS_NEW rows); the H200 rows are never fitted. free: refit only
    these shared constants (and the per-family efficiencies), the others held at the
    committed constants' values."""
    from analysis.fit_runtime import SHARED_PARAMS
    from iosim.timing import FORM, RuntimeModel
    rows = runtime_measured(data)
    feats = _features(rows)
    h = [r for r in rows if "H100" in r["device"]]
    run = sorted({r["run_id"] for r in h})
    fixed, how = None, "all H100 rows"
    if free:
        bad = [k for k in free if k not in SHARED_PARAMS]
        if bad:
            from iosim import ConfigError
            raise ConfigError(f"--free {','.join(free)}: {bad[0]!r} is not a shared constant; "
                             f"allowed: {', '.join(SHARED_PARAMS)}")
        old = RuntimeModel.load()
        fixed = {k: getattr(old, k) for k in SHARED_PARAMS if k not in free}
        how = (f"{', '.join(free)} and the per-family efficiencies fitted (the other shared "
               f"constants held at the previous fit's) on all H100 rows")
    return _fit_on(rows, feats, lambda r: True,
                   f"{FORM}, {how} ({len(h)}) of {', '.join(run)}", fixed=fixed)


def _pass_ms(feats, model, gpu):
    from iosim import get_hardware
    from iosim.timing import predict_launch
    hw = get_hardware(gpu)
    return sum(predict_launch(f, model, hw)["predicted_ms"] for f in feats)


def runtime_rows(model=None, data=None, cv: bool = True) -> list[dict]:
    """One validation row per measured row: the model's prediction (in-sample on the
    H100, where every row is fitted; held out on the H200), and on the H100 the 5-fold
    cross-validated prediction (cv_predicted_ms: the model refitted without the row's fold)
    and the prediction of a refit on split3's "fit" half of RUNTIME plus the LEVELS_NEW rows
    (heldout3_predicted_ms, on split3's "heldout" rows: the old held-out half)."""
    from analysis import fit_runtime
    from analysis.fit_levels import GPU_OF_DEVICE
    from iosim.timing import RuntimeModel
    model = model or RuntimeModel.load()
    meas = runtime_measured(data)
    feats = _features(meas)
    version = model_version()
    folds = {}
    if cv:
        for i in range(CV_FOLDS):
            folds[i] = _fit_on(meas, feats, lambda r, i=i: cv_fold(r["config"]["id"]) != i,
                               f"cv fold {i}")
        half = _fit_on(meas, feats, lambda r: SPLIT_OF[r["config"]["id"]]["split3"] != "heldout",
                       "split3 fit half + LEVELS_NEW")
    out = []
    for r, (fs, ms) in zip(meas, feats):
        gpu = GPU_OF_DEVICE[r["device"]]
        v = fit_runtime.validate([r], model, gpu, features=(fs, ms))[0]
        c = SPLIT_OF[r["config"]["id"]]
        v.update(split="fit" if gpu == "H100-SXM" else "heldout", split3=c["split3"],
                 split_preregistered=c["split"], gpu_preset=gpu, model_version=version,
                 family=c["family"])
        if cv and gpu == "H100-SXM":
            meas_ms = r["measured"]["measured_ms"]
            p = _pass_ms(fs, folds[cv_fold(c["id"])], gpu)
            v.update(cv_fold=cv_fold(c["id"]), cv_predicted_ms=p, cv_rel_error=p / meas_ms - 1)
            if c["split3"] == "heldout":
                p = _pass_ms(fs, half, gpu)
                v.update(heldout3_predicted_ms=p, heldout3_rel_error=p / meas_ms - 1)
        out.append(v)
    return out


#: summary splits: which error field of which rows
SUMMARY_SPLITS = {"cv": "cv_rel_error", "heldout3": "heldout3_rel_error", "fit": "rel_error",
                  "heldout": "rel_error", **{split: "rel_error" for split in BLIND_SPLITS}}


def runtime_summary(rows, split_field="split") -> list[dict]:
    """Per device and family: median / worst |error| of the 5-fold CV ("cv", H100), of the
    refit on split3's fit half on its held-out half ("heldout3"), in-sample ("fit"), of
    the H200 rows ("heldout") and of each blind set's rows (BLIND_SPLITS)."""
    out = []
    for dev in sorted({r["device"] for r in rows}):
        for split, field in SUMMARY_SPLITS.items():
            if split in ("cv", "heldout3"):
                sel = [r for r in rows if r["device"] == dev and r.get(field) is not None]
            else:
                sel = [r for r in rows if r["device"] == dev and r[split_field] == split
                       and r.get(field) is not None]
            if not sel:
                continue
            for fam in sorted({r["family"] for r in sel}) + ["all"]:
                ss = [r for r in sel if fam == "all" or r["family"] == fam]
                e = [r[field] for r in ss]
                out.append({"device": dev, "split": split, "family": fam, **_stats(e),
                            "within_10pct": int(np.sum(np.abs(e) <= 0.10))})
    return out


# ---------------------------------------------------------------------------------------
# The blind set: frozen predictions, scored once the measured rows arrive
# ---------------------------------------------------------------------------------------
def runtime_blind_predictions(model=None, gpu: str = "H100-SXM", set_name: str = "runtime_blind") -> dict:
    """The time model's prediction for every configuration of a blind set (`set_name`, a
    key of RUNTIME_BLIND_SETS), with the tiling
    the kernel runs by default on `gpu` (iosim.kernel_plan: gpu.api's and
    gpu.backward's rules for the preset, no GPU needed); configurations the model cannot
    predict carry status "cannot_predict" and the reason."""
    from analysis.fit_levels import predict_row, problem_of
    from iosim import predict_time
    from iosim.timing import RuntimeModel
    model = model or RuntimeModel.load()
    configs, split, _ = RUNTIME_BLIND_SETS[set_name]
    out = []
    for c in configs:
        rec = {"id": c["id"], "config": c, "family": family_of(c)}
        try:
            lv = predict_row(c, gpu)
            p = predict_time(c["algorithm"], problem_of(c), gpu, model=model, levels_result=lv)
        except ValueError as e:
            rec.update(status="cannot_predict", reason=str(e))
        else:
            rec.update(status="ok", kernel=lv["kernel"], tiling=[lv["block_rows"], lv["block_cols"]],
                       predicted_ms=p["predicted_ms"],
                       launches=[{k: x[k] for k in ("name", "family", "predicted_ms", "binds",
                                                    "share", "terms_ms", "imbalance")}
                                 for x in p["launches"]])
        out.append(rec)
    return {"gpu": gpu, "set": set_name, "split": split, "model_version": model_version(),
            "constants": model.source, "configs": out}


def write_runtime_blind_predictions(set_name: str = "runtime_blind2", path=None, model=None,
                                    gpu: str = "H100-SXM") -> Path:
    """Freeze the time model's predictions for a blind set (only from a clean, committed
    tree: the file names the frozen commit)."""
    import datetime as _dt
    out = {"frozen_commit": _frozen_commit(),
           "made_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "what": f"iosim.timing predictions for analysis.validation_configs."
                   f"{set_name.upper()} on the {gpu} preset, tilings by "
                   f"iosim.kernel_plan (host-only), frozen before the measured rows "
                   f"were read. Score with: python3 -m analysis.validate runtime-blind "
                   f"MEASURED.jsonl --set {set_name} --gpu {gpu}",
           **runtime_blind_predictions(model, gpu=gpu, set_name=set_name)}
    return _write_frozen(path or predictions_path(RUNTIME_BLIND_SETS[set_name][2], gpu), out)


def runtime_blind_rows(measured: list[dict], predictions: dict) -> list[dict]:
    """runtime_validation rows (split "blind", or the frozen set's own) joining measured rows (analysis.hwmeasure
    times rows: {config: {id, ...}, measured: {measured_ms, kernels: [{name, ms}]}, error?})
    with the frozen predictions. Rows whose measurement failed get status
    "measurement_failed"; configurations the model could not predict, "cannot_predict";
    predicted configurations with no measured row, "not_measured"."""
    from iosim.timing import family_key

    def fk(name):
        try:
            return family_key(name)
        except ValueError:
            return None
    pred = {p["id"]: p for p in predictions["configs"]}
    split = predictions.get("split", "blind")
    seen = set()
    out = []
    for r in measured:
        cid = r["config"]["id"]
        if cid not in pred:
            continue
        seen.add(cid)
        p = pred[cid]
        row = {"kind": "runtime_validation", "run_id": r.get("run_id", "blind"),
               "device": r.get("device", ""), "date": r.get("date", ""),
               "commit": r.get("commit"), "versions": r.get("versions", {}),
               "algorithm": p["config"]["algorithm"], "kernel": p["config"]["kernel"],
               "config": p["config"], "family": p["family"], "split": split,
               "tiling": r.get("tiling"), "predicted_tiling": p.get("tiling"),
               "frozen_model_commit": predictions.get("frozen_commit"),
               "model_version": predictions.get("model_version"),
               "constants_source": predictions.get("constants")}
        m = r.get("measured") or {}
        if r.get("error") or r.get("status", "ok") != "ok" or m.get("measured_ms") is None:
            row.update(status="measurement_failed",
                       error=str(r.get("error") or r.get("status") or "no measured_ms"),
                       measured_ms=None, predicted_ms=p.get("predicted_ms"), rel_error=None)
        elif p["status"] != "ok":
            row.update(status="cannot_predict", reason=p["reason"],
                       measured_ms=m["measured_ms"], predicted_ms=None, rel_error=None)
        else:
            launches = []
            for x in p["launches"]:
                k = fk(x["name"])
                hit = [q["ms"] for q in m.get("kernels", [])
                       if fk(q["name"]) == k or (k == "fa2_bwd_pre"
                                                 and fk(q["name"]) == "fa2_bwd_pre_fast")]
                launches.append({"name": x["name"], "predicted_ms": x["predicted_ms"],
                                 "measured_ms": hit[0] if len(hit) == 1 else None,
                                 "binds": x["binds"]})
            row.update(status="ok", measured_ms=m["measured_ms"], predicted_ms=p["predicted_ms"],
                       rel_error=p["predicted_ms"] / m["measured_ms"] - 1, launches=launches,
                       tiling_matches=(r.get("tiling") is None
                                       or list(r["tiling"]) == list(p["tiling"])))
        out.append(row)
    # a configuration the run did not reach (its stage's budget) stays a row of that run:
    # the run's device, run_id and date where the measured rows agree on them
    run = {}
    for k, unknown in (("run_id", "blind"), ("device", ""), ("date", "")):
        vals = {r[k] for r in measured if r.get(k)}
        run[k] = vals.pop() if len(vals) == 1 else unknown
    for cid, p in pred.items():
        if cid not in seen:
            out.append({"kind": "runtime_validation", **run, "commit": None, "versions": {},
                        "config": p["config"], "family": p["family"], "split": split,
                        "frozen_model_commit": predictions.get("frozen_commit"),
                        "status": "not_measured", "measured_ms": None,
                        "predicted_ms": p.get("predicted_ms"), "rel_error": None})
    return out


def format_runtime_blind(rows) -> str:
    lines = [f"{'family':<18}{'rows':>5}{'scored':>7}{'median':>9}{'worst':>8}{'<=10%':>7}"
             f"{'failed':>8}{'no model':>9}{'missing':>8}"]
    fams = sorted({r["family"] for r in rows})
    for fam in fams + ["all"]:
        ss = [r for r in rows if fam == "all" or r["family"] == fam]
        e = np.abs([r["rel_error"] for r in ss if r["status"] == "ok"])
        med = f"{np.median(e):>9.1%}{e.max():>8.1%}" if e.size else f"{'-':>9}{'-':>8}"
        lines.append(f"{fam:<18}{len(ss):>5}{e.size:>7}{med}{int((e <= 0.10).sum()):>7}"
                     f"{sum(r['status'] == 'measurement_failed' for r in ss):>8}"
                     f"{sum(r['status'] == 'cannot_predict' for r in ss):>9}"
                     f"{sum(r['status'] == 'not_measured' for r in ss):>8}")
    bad = [r for r in rows if r["status"] == "ok" and not r.get("tiling_matches", True)]
    if bad:
        lines.append(f"warning: {len(bad)} rows ran a tiling other than the predicted one: "
                     + ", ".join(r["config"]["id"] for r in bad))
    return "\n".join(lines)


def blind_rows_kept(data=None) -> list[dict]:
    """The blind rows (splits BLIND_SPLITS) already in runtime_validation.jsonl (scored
    against the frozen predictions, not the current model): `flashsim validate runtime`
    keeps them."""
    path = results.path_of("runtime_validation", data)
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in open(path) if line.strip())
            if r.get("split") in BLIND_SPLITS]


def score_runtime_blind(measured_path, predictions_file=None, write=True, data=None,
                        set_name: str = "runtime_blind", gpu: str = "H100-SXM"):
    """Score the frozen blind predictions of a set (for `gpu`'s preset) against measured
    rows (a JSONL file); replace that set's rows on that device (its split, the measured
    rows' device) in runtime_validation.jsonl with the result; print the summary."""
    with open(predictions_file or predictions_path(RUNTIME_BLIND_SETS[set_name][2], gpu)) as f:
        predictions = json.load(f)
    split = predictions.get("split", "blind")
    with open(measured_path) as f:
        measured = [json.loads(line) for line in f if line.strip()]
    rows = runtime_blind_rows(measured, predictions)
    print(f"frozen model: commit {predictions.get('frozen_commit')}, "
          f"model_version {predictions.get('model_version')}")
    print(format_runtime_blind(rows))
    if write:
        path = results.path_of("runtime_validation", data)
        keep = []
        if path.exists():
            keep = [json.loads(line) for line in open(path) if line.strip()]
            devices = {r["device"] for r in rows if r.get("device")}
            keep = [r for r in keep if not (r.get("split") == split and (
                r.get("device") in devices or not r.get("device")))]
        print(f"wrote {len(rows)} blind rows to {_write('runtime_validation', keep + rows, data)}")
    return rows


def format_summary(summary, what: str) -> str:
    lines = []
    if what == "levels":
        lines.append(f"{'device':<24}{'split':<9}{'family':<14}{'rows':>5}{'in bound':>9}"
                     f"{'DRAM rd med':>12}{'worst':>8}{'DRAM wr med':>12}{'worst':>8}{'L2 rd med':>10}"
                     f"{'in chip range':>14}")
        for s in summary:
            lines.append(f"{s['device'][:23]:<24}{s['split']:<9}{s['family']:<14}{s['rows']:>5}"
                         f"{s['inside_bound']:>9}{s['dram_read']['median']:>12.1%}"
                         f"{s['dram_read']['worst']:>8.0%}{s['dram_write']['median']:>12.1%}"
                         f"{s['dram_write']['worst']:>8.0%}{s['l2_read']['median']:>10.1%}"
                         f"{s.get('inside_chip_range', s['inside_bound']):>14}")
    else:
        lines.append(f"{'device':<24}{'split':<9}{'family':<14}{'rows':>5}{'median':>9}{'worst':>8}{'<=10%':>7}")
        for s in summary:
            lines.append(f"{s['device'][:23]:<24}{s['split']:<9}{s['family']:<14}{s['n']:>5}"
                         f"{s['median']:>9.1%}{s['worst']:>8.0%}{s['within_10pct']:>7}")
    return "\n".join(lines)


__all__ = ["levels_rows", "levels_summary", "runtime_fit", "runtime_rows", "runtime_summary",
           "format_summary", "model_version", "levels_blind_predictions",
           "write_levels_blind_predictions", "levels_blind_rows", "levels_blind",
           "runtime_blind_predictions", "runtime_blind_rows", "score_runtime_blind",
           "write_runtime_blind_predictions", "LEVELS_BLIND_SETS", "RUNTIME_BLIND_SETS"]


def _main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m analysis.validate",
        description="Blind validation sets (analysis.validation_configs.LEVELS_BLIND, "
                    "RUNTIME_BLIND): levels-blind MEASURED.jsonl scores the frozen L2-model "
                    "predictions (benchmarks/results/runs/levels-blind-predictions/) against "
                    "measured counter rows; levels-blind-predict writes them (only from a "
                    "clean, committed tree: the frozen model); runtime-blind MEASURED.jsonl "
                    "scores the frozen time-model predictions "
                    "(benchmarks/results/runs/runtime-blind-predictions/) against measured "
                    "time rows and adds the blind runtime_validation rows")
    ap.add_argument("what", choices=("levels-blind", "levels-blind-predict", "runtime-blind",
                                     "runtime-blind-predict"))
    ap.add_argument("measured", nargs="?")
    ap.add_argument("--set", default=None, metavar="NAME",
                    help="the blind set: one of " + ", ".join(LEVELS_BLIND_SETS) + " (default "
                         "levels_blind) for the levels commands, of " + ", ".join(RUNTIME_BLIND_SETS)
                         + " (default runtime_blind) for the runtime ones")
    ap.add_argument("--predictions", default=None,
                    help="the frozen predictions file (default: the set's own)")
    ap.add_argument("--out", default=None, help="levels-blind: JSONL file for the blind rows")
    ap.add_argument("--gpu", default="H100-SXM", metavar="PRESET",
                    help="the preset the predictions are for (default H100-SXM; another "
                         "preset's file is predictions-<PRESET>.json beside the set's own)")
    a = ap.parse_args(argv)
    sets = LEVELS_BLIND_SETS if a.what.startswith("levels") else RUNTIME_BLIND_SETS
    name = a.set or next(iter(sets))
    if name not in sets:
        ap.error(f"--set {name!r} is not a {a.what.split('-')[0]} blind set; allowed: {', '.join(sets)}")
    if a.what == "levels-blind-predict":
        print(f"wrote {write_levels_blind_predictions(a.predictions, set_name=name, gpu=a.gpu)}")
        return 0
    if a.what == "runtime-blind-predict":
        print(f"wrote {write_runtime_blind_predictions(name, a.predictions, gpu=a.gpu)}")
        return 0
    if not a.measured:
        ap.error(f"{a.what} needs MEASURED.jsonl")
    if a.what == "levels-blind":
        levels_blind(a.measured, a.predictions or predictions_path(sets[name][2], a.gpu), a.out)
    else:
        score_runtime_blind(a.measured, a.predictions, set_name=name, gpu=a.gpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
