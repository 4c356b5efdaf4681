"""Figure 7: kernel validation: error vs a float64 reference, and kernel vs model counts.

Runs gpu.attention (count_traffic=True) for every algorithm, dense and causal, at tiny
sizes (Numba's CUDA simulator when no GPU: NUMBA_ENABLE_CUDASIM is set by
analysis.sweeps.ensure_cuda_env before numba.cuda is imported). Left: max |O - O_ref|
against iosim.reference_attention (float64). Right: the kernel's own element counts
divided by iosim.closed_form's (1.0 = equal); a case whose per-tensor counts all agree is
marked "=". If the gpu package cannot be imported, the figure says so and holds no data.
"""
from __future__ import annotations

import time

import numpy as np

from iosim import Problem, Tiling, closed_form, random_inputs, reference_attention

from ._style import COLORS, save

NAME = "fig7_validation"
#: max |O - O_ref| a case may have (fp32 against float64): the report's pass line
TOLERANCE = 1e-4


def generate(N=40, d=16, heads=2, batch=1, B=16, dtype="fp32", algorithms=("standard", "fa1", "fa2"),
             causal_values=(False, True)):
    from analysis.sweeps import import_gpu, run_kernel, has_cuda_gpu
    cfg = {"N": N, "d": d, "heads": heads, "batch": batch, "B_r": B, "B_c": B, "dtype": dtype}
    gpu, why = import_gpu()
    if gpu is None:
        return {"config": cfg, "cases": [], "skipped": why}
    cases = []
    for causal in causal_values:
        p = Problem(N=N, d=d, batch=batch, heads=heads, dtype=dtype, causal=causal)
        t = Tiling(B, B)
        q, k, v = random_inputs(p, seed=1)
        ref = reference_attention(q, k, v, causal=causal)
        for a in algorithms:
            t0 = time.perf_counter()
            try:
                O, led = run_kernel(gpu, a, p, t, q, k, v, count_traffic=True)
                model = closed_form(a, p, t)
                cases.append({"algorithm": a, "causal": causal,
                              "max_abs_err": float(np.max(np.abs(O.astype(np.float64) - ref))),
                              "kernel_elements": led.read_elements + led.write_elements,
                              "model_elements": model.read_elements + model.write_elements,
                              "counts_match": led.counts() == model.counts(),
                              "seconds": time.perf_counter() - t0})
            except Exception as exc:
                cases.append({"algorithm": a, "causal": causal,
                              "error": f"{type(exc).__name__}: {exc}"})
    return {"config": cfg, "cases": cases, "skipped": None,
            "device": "GPU" if has_cuda_gpu() else "CUDA simulator"}


def plot(data):
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.5, 4.2), constrained_layout=True)
    c = data["config"]
    cfg_line = (f"N={c['N']}, d={c['d']}, {c['heads']} heads, batch {c['batch']}, "
                f"{c['dtype']}, B_r=B_c={c['B_r']}")
    if data.get("skipped"):
        for ax in (ax1, ax2):
            ax.axis("off")
        ax1.text(0, 0.5, "NOT RUN:\n" + data["skipped"], fontsize=9, color="#aa0000", wrap=True,
                 transform=ax1.transAxes)
        fig.suptitle("Kernel validation (not run)", fontsize=10, fontweight="bold")
        return fig
    ok = [x for x in data["cases"] if "error" not in x]
    labels = [f"{x['algorithm']}\n{'causal' if x['causal'] else 'dense'}" for x in data["cases"]]
    xs = np.arange(len(data["cases"]))
    errs = [x.get("max_abs_err", np.nan) for x in data["cases"]]
    ax1.bar(xs, np.maximum(errs, 1e-12), color=[COLORS[x["algorithm"]] for x in data["cases"]])
    ax1.set_yscale("log")
    ax1.set_ylim(1e-9, 1e-3)
    ax1.axhline(TOLERANCE, color="#aa0000", ls="--", lw=1.0)
    ax1.text(len(xs) - 0.5, TOLERANCE * 1.3, f"pass: <= {TOLERANCE:g}", ha="right",
             va="bottom", fontsize=7.5, color="#aa0000")
    ax1.set_title("(a) output error against a float64 reference", fontsize=9)
    ax1.set_xticks(xs, labels, fontsize=7)
    ax1.set_ylabel("max |O - O_ref| (float64 reference)")
    ratio = [x["kernel_elements"] / x["model_elements"] if "error" not in x else np.nan
             for x in data["cases"]]
    ax2.bar(xs, ratio, color=[COLORS[x["algorithm"]] for x in data["cases"]])
    for xi, x in zip(xs, data["cases"]):
        tag = "ERROR" if "error" in x else ("exact" if x["counts_match"] else "differs")
        ax2.text(xi, 1.02 if "error" not in x else 0.05, tag, ha="center", fontsize=8)
    ax2.set_ylim(0, 1.2)
    ax2.set_xticks(xs, labels, fontsize=7)
    ax2.set_ylabel("kernel counts / model counts (elements)")
    ax2.set_title("(b) the kernels' own traffic counts against the model", fontsize=9)
    fig.suptitle(f"Kernel validation on the {data.get('device', '?')}: "
                 f"{sum(1 for x in ok if x['counts_match'])} of {len(data['cases'])} cases "
                 f"count every element as the model does\n{cfg_line}", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, data["config"])


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
