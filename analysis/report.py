"""The main job: model sweeps, theory checks, kernel validation, every figure, REPORT.md.

`run_report(out_dir)` prints one line per step with elapsed seconds and returns the exit
status: 0 when every check passed, 1 otherwise. Without a GPU the kernels run in Numba's
CUDA simulator at tiny sizes (validation only, no timings); with a GPU it adds kernel runs
of the paper's GPT-2 medium block-size experiment with measured runtimes.

What it writes to `out_dir` depends only on the code and the data set: run twice, it
writes the same bytes (the committed figures/ stays clean in git). What says when, where
and how long (wall times, the sweep rows' provenance, the GPU runs' sweep file) goes to
`out_dir/run/` (RUN_DIR), which .gitignore lists.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import time

from . import theory
from .paths import check_out_dir
from .sweeps import (WHERE_FIELDS, ensure_cuda_env, evaluate_kernel, evaluate_model, grid,
                     model_version, provenance, read_rows, run_sweep)

#: The untracked folder (inside out_dir) for this run's record: run.json (wall times,
#: where it ran), sweep_model.jsonl with every row's provenance, the GPU runs' sweep.
RUN_DIR = "run"

#: The model sweep the report writes (bytes for M: 16 KiB .. the H100's 227 KiB).
MODEL_GRID = dict(algorithm=["standard", "fa1", "fa2"], N=[512, 1024, 2048, 4096, 8192, 16384],
                  d=[64, 128], causal=[False, True],
                  sram_bytes=[16384, 49152, 102400, 166912, 232448])


class _Progress:
    """Prints each step with the seconds since the start; keeps them for run.json."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.steps = []

    def __call__(self, msg: str):
        t = time.perf_counter() - self.t0
        self.steps.append({"seconds": round(t, 2), "step": msg})
        print(f"[{t:6.1f}s] {msg}", flush=True)


def _write_atomic(path: str, text: str) -> None:
    """Write under a name of this process, then move into place (concurrent reports on
    one directory each leave a whole file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _rows_text(rows, drop=()) -> str:
    return "".join(json.dumps({k: v for k, v in r.items() if k not in drop}) + "\n"
                   for r in rows)


def _md_check(c: theory.Check) -> str:
    kind = " (where the law stops; a demonstration)" if c.expected_failure_demo else ""
    return f"| {'PASS' if c.passed else '**FAIL**'} | {c.name}{kind} | {c.summary} |"


def _levels_section(d9, d10, d11) -> list[str]:
    """REPORT.md lines for figures 9-11 (numbers only; no pass/fail: the model's
    validation criteria live in analysis.fit_levels)."""
    from .figures.fig11_levels_validation import METRICS, summary
    out = ["## Below the ledger: L2 and DRAM (model, cold L2)", "",
           f"fa2 forward, {d9['config']['dtype']}, d={d9['config']['d']}, default kernel: where "
           f"predicted DRAM reads first exceed Q + K + V read once by "
           f"{100 * (d9['config']['threshold'] - 1):.0f} % (fig9):", "",
           "| preset | against N (batch x heads = 16) | against batch x heads (N = 16K) |",
           "|---|---|---|"]

    def cell(pan):
        cr = pan["crossing"]
        if cr is None:
            return f"never (at most {pan['max_ratio']:.3f} x)"
        return f"{cr['x']:,} ({cr['ratio']:.3f} x)"
    for gpu in d9["config"]["gpus"]:
        out.append(f"| {gpu} | N = {cell(d9['panels'][f'N|{gpu}'])} | "
                   f"{cell(d9['panels'][f'bh|{gpu}'])} |")
    pan = d10["panels"]["N"]
    out += ["", f"Grid order (fig10, {d10['config']['gpu']}, N = {pan['x'][-1]:,}, batch x "
            f"heads = {d10['config']['bh_fixed']}): predicted DRAM reads / floor " +
            ", ".join(f"{o} {pan['dram'][o][-1] / pan['floor'][-1]:.1f} x"
                      for o in d10["config"]["orders"]) + ".", ""]
    s = summary(d11)
    out += [f"Predicted vs measured DRAM bytes (fig11, {len(d11['points'])} levels_measurement "
            "rows): within 15 % or 16 MB:", "", "| preset | reads | writes |", "|---|---|---|"]
    for gpu in sorted({g for g, _ in s}):
        out.append(f"| {gpu} | " + " | ".join(f"{s[(gpu, k)][0]}/{s[(gpu, k)][1]}"
                                              for k, _ in METRICS) + " |")
    return out + [""]


def _runtime_section(d12, d13) -> list[str]:
    """REPORT.md lines for figures 12 and 13 (numbers only)."""
    from .figures.fig12_runtime_validation import family_roof_summary
    out = ["## Time model (iosim.timing)", "",
           f"Predicted vs measured kernel time of a pass (fig12, {len(d12['points'])} "
           "runtime_validation rows): |predicted / measured - 1|:", "",
           "| device | split | rows | median | worst | within 10 % |", "|---|---|---|---|---|---|"]
    for (gpu, split), s in sorted(d12["stats"].items()):
        out.append(f"| {gpu} | {split} | {s['n']} | {100 * s['median_abs']:.1f} % | "
                   f"{100 * s['worst_abs']:.0f} % ({s['worst_id']}) | {s['within_band']} |")
    fam = family_roof_summary(d12)
    out += ["", f"Measured forward passes on the {d12['roofline']['gpu']} roofline (fig12, "
            f"{len(d12['roofline']['points'])} passes): median achieved TFLOP/s " +
            ", ".join(f"{f} {v['median_tflops']:.3g}" for f, v in sorted(fam.items())) + ".", ""]
    c = d13["config"]
    tot = {(b["impl"], b["source"], b.get("dropout_p")): b["total"] for b in d13["bars"]}
    parts = [f"{impl} {src}{'' if p is None else f' p={p:g}'} {ms:.3g} ms"
             for (impl, src, p), ms in tot.items()]
    out += [f"Time by operation (fig13, batch {c['batch']}, {c['heads']} heads, N = {c['N']}, "
            f"d = {c['d']}, {c['dtype']}{', causal' if c['causal'] else ''}; "
            + (f"measured on {c['device']}" if d13["measured"] else
               "no op_breakdown rows yet: modelled only") + "): " + "; ".join(parts) + ".", ""]
    return out


def run_report(out_dir="figures", *, kernel_validation=True) -> int:
    """Run everything into `out_dir`; return 0 if all checks pass, else 1."""
    log = _Progress()
    out_dir = check_out_dir(out_dir)
    run_dir = os.path.join(out_dir, RUN_DIR)
    os.makedirs(run_dir, exist_ok=True)
    gpu_present = ensure_cuda_env()
    log(f"flashsim report -> {out_dir}/ ({'GPU' if gpu_present else 'no GPU: CUDA simulator'})")
    lines = ["# flashsim report", ""]
    failed = []
    figures = []

    # 1. theory checks -----------------------------------------------------------------
    checks = theory.run_all_checks()
    for c in checks:
        log(c.line())
        if not c.passed:
            failed.append(c.name)
    lines += ["## Theory checks (closed-form model, elements per head)", "",
              "Log-log slopes by scipy.stats.linregress; ranges and reasons in "
              "`analysis/theory.py`.", "", "| result | check | numbers |", "|---|---|---|"]
    lines += [_md_check(c) for c in checks] + [""]
    log("theory checks done")

    # 2. optimal tiling ------------------------------------------------------------------
    from .tiling_search import optimal_tiling
    lines += ["## Optimal tiling vs the paper's rule (N=4096, d=64, fp16, bytes per head)", "",
              "| M (bytes) | alg | best (B_r, B_c) | traffic | paper (B_r, B_c) | paper traffic | "
              "paper fits M? | lower bound | best >= bound |", "|---|---|---|---|---|---|---|---|---|"]
    below = []
    for M in (16384, 49152, 102400, 166912, 232448):
        for a in ("fa1", "fa2"):
            r = optimal_tiling(a, 4096, 64, M)
            ok = r.traffic_bytes >= r.lower_bound_bytes
            if not ok:
                below.append((M, a))
            lines.append(f"| {M} | {a} | ({r.B_r}, {r.B_c}) | {r.traffic_bytes / 2**20:.1f} MiB | "
                         f"({r.paper_B_r}, {r.paper_B_c}) | {r.paper_traffic_bytes / 2**20:.1f} MiB | "
                         f"{'yes' if r.paper_fits else 'no'} | {r.lower_bound_bytes / 2**20:.1f} MiB | "
                         f"{'yes' if ok else '**no**'} |")
    if below:
        failed.append("optimal tiling beats the lower bound")
    lines += ["", "The model counts HBM accesses only; it does not price compute, so fa1's "
              "optimum may pick a tiny B_r (its traffic does not depend on B_r).", ""]
    log(f"optimal tiling: {10 - len(below)}/10 optima at or above the lower bound")

    # 3. model sweep -------------------------------------------------------------------
    # regenerated on every run (instant), never trusted from an earlier or committed file:
    # written to a file of this process in run/ (rows with their provenance), then copied
    # without the provenance (WHERE_FIELDS: when, where, how long) to out_dir, whose rows
    # keep model_version, so a sweep resumed on that file never reuses a row of an older
    # model; both moved into place atomically (concurrent reports each leave whole files)
    sweep_path = os.path.join(out_dir, "sweep_model.jsonl")
    run_sweep_path = os.path.join(run_dir, "sweep_model.jsonl")
    tmp_path = f"{run_sweep_path}.{os.getpid()}.tmp"
    if os.path.exists(tmp_path):
        os.remove(tmp_path)
    pts = grid(**MODEL_GRID)
    try:
        st = run_sweep(pts, tmp_path, evaluate_model)
        full_rows = read_rows(tmp_path)
        _write_atomic(sweep_path, _rows_text(full_rows, drop=WHERE_FIELDS))
        os.replace(tmp_path, run_sweep_path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
    rows = read_rows(sweep_path)
    n_err = sum(r["status"] == "error" for r in rows)
    lines += ["## Model sweep", "",
              f"`{os.path.basename(sweep_path)}`: {len(rows)} rows (algorithm x N x d x causal x "
              f"M bytes; paper's tiling), {n_err} recorded errors (tilings the rule cannot make, "
              f"e.g. M < 4d); all {st['done']} evaluated now by model version "
              f"{model_version('model')}.", ""]
    log(f"model sweep: {len(rows)} rows ({st['done']} evaluated, {n_err} errors)")

    # 4. kernel validation ---------------------------------------------------------------
    from .figures import fig7_validation
    val = None
    if kernel_validation:
        val = fig7_validation.generate()
        if val["skipped"]:
            lines += ["## Kernel validation", "", f"**Skipped**: {val['skipped']}", ""]
            log(f"kernel validation SKIPPED: {val['skipped']}")
        else:
            bad = [c for c in val["cases"]
                   if "error" in c or not c["counts_match"] or c["max_abs_err"] > 1e-4]
            if bad:
                failed.append("kernel validation")
            lines += [f"## Kernel validation ({val['device']})", "",
                      f"Config: {val['config']}. Pass: per-tensor counts equal the closed form "
                      "and max |O - O_ref| <= 1e-4 (fp32) against float64.", "",
                      "| algorithm | causal | max abs err | kernel elems | model elems | counts equal |",
                      "|---|---|---|---|---|---|"]
            for c in val["cases"]:
                if "error" in c:
                    lines.append(f"| {c['algorithm']} | {c['causal']} | **error: {c['error']}** | | | |")
                else:
                    lines.append(f"| {c['algorithm']} | {c['causal']} | {c['max_abs_err']:.2e} | "
                                 f"{c['kernel_elements']} | {c['model_elements']} | "
                                 f"{'yes' if c['counts_match'] else '**no**'} |")
            lines.append("")
            log(f"kernel validation: {len(val['cases']) - len(bad)}/{len(val['cases'])} cases pass")
    else:
        lines += ["## Kernel validation", "", "**Skipped** (--no-kernels).", ""]
        log("kernel validation SKIPPED (--no-kernels)")

    # 5. GPU runs (only with a GPU) -------------------------------------------------------
    runtimes = None
    if gpu_present:
        kpath = os.path.join(run_dir, "sweep_kernel_gpt2.jsonl")   # measured: untracked
        kp = grid(algorithm="fa1", N=1024, d=64, heads=16, batch=64, dtype="fp16",
                  block_rows=64, block_cols=[64, 128, 256, 512])
        from .progress import Progress, pending
        with Progress(pending(kp, kpath), "report: GPU kernel runs") as bar:
            run_sweep(kp, kpath, evaluate_kernel, progress=lambda msg: bar.update())
        krows = [r for r in read_rows(kpath) if r["status"] == "ok"]
        runtimes = {r["block_cols"]: r.get("runtime_s") for r in krows}
        lines += ["## GPU kernel runs (GPT-2 medium, fa1)", "", "| B_c | runtime (ms) | counts equal model |",
                  "|---|---|---|"]
        for r in read_rows(kpath):
            if r["status"] != "ok":
                lines.append(f"| {r['block_cols']} | error: {r['error']} | |")
                continue
            lines.append(f"| {r['block_cols']} | {1e3 * r.get('runtime_s', float('nan')):.3f} | "
                         f"{r.get('counts_match')} |")
        lines.append("")
        log("GPU kernel runs done")
    else:
        lines += ["## GPU kernel runs", "", "**Skipped**: no CUDA GPU detected (runtimes are not "
                  "measured in the simulator).", ""]
        log("GPU kernel runs SKIPPED: no CUDA GPU")

    # 6. figures -------------------------------------------------------------------------
    # every figure of analysis.figures.NAMES; those from measured rows (fig8, fig11-fig14)
    # read the committed data set, so no GPU is needed
    from .figures import (fig1_traffic_vs_M, fig2_traffic_vs_N, fig3_block_size, fig4_tiling_heatmap,
                          fig5_roofline, fig6_memory_footprint, fig8_bench, fig15_window)
    for mod in (fig1_traffic_vs_M, fig2_traffic_vs_N, fig4_tiling_heatmap, fig5_roofline,
                fig6_memory_footprint, fig15_window):
        figures += mod.make(out_dir)
        log(f"figure {mod.NAME}")
    if runtimes and all(v is not None for v in runtimes.values()):
        figures += fig3_block_size.make(out_dir, runtimes=runtimes)
    else:
        figures += fig3_block_size.make(out_dir)
    log(f"figure {fig3_block_size.NAME}")
    if val is not None:
        figures += fig7_validation.draw(val, out_dir)
        log(f"figure {fig7_validation.NAME}")
    figures += fig8_bench.make(out_dir)
    log(f"figure {fig8_bench.NAME} (bench rows of the data set)")
    # the L2 / DRAM model (iosim.memory): figures 9-11, their numbers in the report
    from .figures import fig9_levels, fig10_grid_order, fig11_levels_validation
    d9 = fig9_levels.generate()
    figures += fig9_levels.draw(d9, out_dir)
    log(f"figure {fig9_levels.NAME} ({d9['calls']} model calls)")
    d10 = fig10_grid_order.generate()
    figures += fig10_grid_order.draw(d10, out_dir)
    log(f"figure {fig10_grid_order.NAME} ({d10['calls']} model calls)")
    d11 = fig11_levels_validation.generate()
    figures += fig11_levels_validation.draw(d11, out_dir)
    log(f"figure {fig11_levels_validation.NAME} ({len(d11['points'])} measured rows)")
    lines += _levels_section(d9, d10, d11)
    # the time model (iosim.timing): figure 12 (against the measured times), 16 (the
    # measured forward passes on the roofline) and 13 (time by operation; measured where
    # op_breakdown rows exist); 14 the decoding model and kernels
    from .figures import (fig12_runtime_validation, fig13_time_breakdown, fig14_decode,
                          fig16_kernel_roofline)
    d12 = fig12_runtime_validation.generate()
    figures += fig12_runtime_validation.draw(d12, out_dir)
    log(f"figure {fig12_runtime_validation.NAME} ({len(d12['points'])} measured rows)")
    figures += fig16_kernel_roofline.draw(d12, out_dir)
    log(f"figure {fig16_kernel_roofline.NAME} ({d12['calls']} model calls)")
    d13 = fig13_time_breakdown.generate()
    figures += fig13_time_breakdown.draw(d13, out_dir)
    log(f"figure {fig13_time_breakdown.NAME} ({'measured' if d13['measured'] else 'modelled only'})")
    lines += _runtime_section(d12, d13)
    figures += fig14_decode.make(out_dir)
    log(f"figure {fig14_decode.NAME}")

    result = "all checks passed" if not failed else "FAILED: " + ", ".join(failed)
    lines += ["## Figures", ""]
    number = lambda p: int(os.path.basename(p)[3:].split("_")[0])   # fig12_... -> 12
    for p in sorted(figures, key=number):
        if p.endswith(".png"):
            name = os.path.basename(p)
            lines.append(f"- [{name}]({name}) ([svg]({name[:-4]}.svg))")
    # no wall time here: REPORT.md is committed and must not change from run to run
    lines += ["", f"Result: {result}.", ""]
    _write_atomic(os.path.join(out_dir, "REPORT.md"), "\n".join(lines))
    wall = time.perf_counter() - log.t0
    _write_atomic(os.path.join(run_dir, "run.json"), json.dumps(
        {"result": result, "wall_seconds": round(wall, 1), "gpu": gpu_present,
         "model_version": model_version("model"), "where": provenance(None),
         "made_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
         "steps": log.steps}, indent=1) + "\n")
    log(f"wrote {os.path.join(out_dir, 'REPORT.md')}: {result} (wall time {wall:.1f} s; "
        f"this run's record in {run_dir}/)")
    return 0 if not failed else 1


__all__ = ["MODEL_GRID", "RUN_DIR", "run_report"]
