"""The issue-39 blind sets across the space (analysis/configs/runtime_blind11.json and
runtime_blind12.json, scored on the H100 2026-12-07: head dims, bf16, grouped heads,
causal, backward, windows and N_k != N; runtime_blind13.json, declared after them: the
element-wise copy path at d % 8 != 0 and blind12's misses): their frozen predictions with
each one's trust statement, and their scores.

    python3 -m analysis.blind_space predict [--set S]     # freeze (clean, committed tree)
    python3 -m analysis.blind_space score MEASURED.jsonl [--set S] [--gpu H200] [--run-id ID] [--no-write]

--set: runtime_blind11, runtime_blind12 or runtime_blind13 (the default, the newest). The
measured rows come from `bash scripts/device.sh measure times:runtime_blind13:300` (analysis.hwmeasure
times). The score is printed per family (passes, share within 10 %, median and 95th
percentile |error|, split by what the frozen trust statement said) and written as
runtime_validation rows of the set's split ("blind11", "blind12", ...: the kind the blind
scores live in)."""
from __future__ import annotations

import json

from iosim import get_hardware

from analysis.fit_levels import predict_row, problem_of


#: the sets declared for issue 39 (analysis/configs/NAME.json), the newest last
SPACE_SETS = ("runtime_blind11", "runtime_blind12", "runtime_blind13")
SPACE_SET = SPACE_SETS[-1]


def blind_predictions(set_name: str = SPACE_SET, gpu: str = "H100-SXM") -> dict:
    """`analysis.validate.runtime_blind_predictions` for the set on the preset, each
    predicted configuration with the trust statement of its time (`trust`: validated,
    statement, ...), so that the score can be split by what the statement said."""
    from analysis.validate import runtime_blind_predictions
    from iosim.timing.trust import trust_for
    out = runtime_blind_predictions(gpu=gpu, set_name=set_name)
    for rec in out["configs"]:
        if rec["status"] == "ok":
            c = rec["config"]
            lv = predict_row(c, gpu)
            rec["trust"] = trust_for("time", c["algorithm"], c["pass"], lv["kernel"],
                                     problem_of(c), get_hardware(gpu).name, tuple(rec["tiling"]),
                                     modelled_as=lv.get("dtype_modelled_as")).to_dict()
    return out


def write_blind_predictions(set_name: str = SPACE_SET, gpus=("H100-SXM", "H200")) -> list:
    """Freeze the set's predictions for each preset (a clean, committed tree only: the
    files name the frozen commit), beside the other sets' (`analysis.validate`)."""
    import datetime as _dt

    from analysis.validate import (RUNTIME_BLIND_SETS, _frozen_commit, _write_frozen,
                                   predictions_path)
    paths = []
    for gpu in gpus:
        out = {"frozen_commit": _frozen_commit(),
               "made_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "what": f"iosim.timing predictions (with their trust statements) for "
                       f"analysis.validation_configs.{set_name.upper()} on the {gpu} preset, "
                       f"tilings by iosim.kernel_plan (host-only), frozen before the measured "
                       f"rows were read. Score with: python3 -m analysis.blind_space "
                       f"score MEASURED.jsonl --gpu {gpu}",
               **blind_predictions(set_name, gpu)}
        paths.append(_write_frozen(predictions_path(RUNTIME_BLIND_SETS[set_name][2], gpu), out))
    return paths


def _pct(e, q) -> str:
    import numpy as np
    return f"{100 * np.percentile(e, q):.1f} %" if len(e) else "-"


def format_blind_score(rows: list[dict]) -> str:
    """Per family (and all): passes, scored, share within 10 %, median and 95th percentile
    |error|, and the same for the rows whose frozen trust statement said "validated" and
    "outside validated range"."""
    import numpy as np
    lines = [f"{'family':<16}{'rows':>5}{'scored':>7}{'<=10%':>8}{'median':>9}{'p95':>9}"
             f"{'  inside: n, median':>20}{'  outside: n, median':>21}{'no model':>9}"]
    fams = sorted({r["family"] for r in rows})
    for fam in fams + ["all"]:
        ss = [r for r in rows if fam == "all" or r["family"] == fam]
        ok = [r for r in ss if r["status"] == "ok"]
        e = np.abs([r["rel_error"] for r in ok])
        ins = np.abs([r["rel_error"] for r in ok if r.get("trust_validated")])
        out = np.abs([r["rel_error"] for r in ok if not r.get("trust_validated")])
        share = f"{(e <= 0.10).mean():.0%}" if e.size else "-"
        lines.append(f"{fam:<16}{len(ss):>5}{e.size:>7}{share:>8}{_pct(e, 50):>9}{_pct(e, 95):>9}"
                     f"{ins.size:>11}, {_pct(ins, 50):>7}{out.size:>12}, {_pct(out, 50):>7}"
                     f"{sum(r['status'] == 'cannot_predict' for r in ss):>9}")
    return "\n".join(lines)


def score_blind(measured_path: str, gpu: str = "H100-SXM", set_name: str = SPACE_SET,
                write: bool = True, data=None, run_id: str | None = None) -> list[dict]:
    """Score the frozen predictions of the set for `gpu` against measured time rows
    (`analysis.hwmeasure times` JSONL): runtime_validation rows of the set's split, each
    with `trust_validated` (what its frozen statement said), printed per family; with
    write, they replace the set's rows of that device in runtime_validation.jsonl (the
    kind the blind scores live in)."""
    from analysis import results
    from analysis.validate import (RUNTIME_BLIND_SETS, _write, predictions_path,
                                   runtime_blind_rows)
    with open(predictions_path(RUNTIME_BLIND_SETS[set_name][2], gpu)) as f:
        frozen = json.load(f)
    with open(measured_path) as f:
        measured = [json.loads(line) for line in f if line.strip()]
    if run_id:              # the run the rows came from (analysis.hwmeasure rows carry none)
        measured = [{**r, "run_id": r.get("run_id") or run_id} for r in measured]
    rows = runtime_blind_rows(measured, frozen)
    trust = {p["id"]: p.get("trust", {}).get("validated", False) for p in frozen["configs"]}
    for r in rows:
        r["trust_validated"] = trust.get(r["config"]["id"], False)
    print(f"{set_name} on {gpu}: frozen model commit {frozen.get('frozen_commit')}, "
          f"model_version {frozen.get('model_version')}")
    print(format_blind_score(rows))
    if write:
        path = results.path_of("runtime_validation", data)
        split = frozen.get("split")
        devices = {r["device"] for r in rows if r.get("device")}
        keep = [json.loads(line) for line in open(path) if line.strip()] if path.exists() else []
        keep = [r for r in keep if not (r.get("split") == split and (
            r.get("device") in devices or not r.get("device")))]
        print(f"wrote {len(rows)} blind rows to {_write('runtime_validation', keep + rows, data)}")
    return rows


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m analysis.blind_space",
        description="predict: freeze the predictions of an issue-39 blind set (--set) "
                    "for the H100 and H200 presets (clean, committed tree only). "
                    "score MEASURED.jsonl: score them against measured time rows "
                    "(analysis.hwmeasure times) and write the blind rows to the data set.")
    ap.add_argument("what", choices=("predict", "score"))
    ap.add_argument("measured", nargs="?")
    ap.add_argument("--set", default=SPACE_SET, choices=SPACE_SETS,
                    help=f"the blind set (default: {SPACE_SET}, the newest)")
    ap.add_argument("--gpu", default="H100-SXM", help="score: the preset (H100-SXM, H200)")
    ap.add_argument("--run-id", default=None,
                    help="score: the run id for measured rows that carry none")
    ap.add_argument("--no-write", action="store_true",
                    help="score: print only (no rows written to the data set)")
    a = ap.parse_args(argv)
    if a.what == "predict":
        for p in write_blind_predictions(a.set):
            print(f"wrote {p}")
        return 0
    if not a.measured:
        ap.error("score needs MEASURED.jsonl")
    score_blind(a.measured, a.gpu, set_name=a.set, write=not a.no_write, run_id=a.run_id)
    return 0


__all__ = ["SPACE_SET", "SPACE_SETS", "blind_predictions", "write_blind_predictions", "format_blind_score",
           "score_blind", "main"]


if __name__ == "__main__":
    raise SystemExit(main())
