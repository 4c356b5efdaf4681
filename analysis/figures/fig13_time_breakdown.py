"""Figure 13: the paper's Figure 1 (right): where one attention forward's time goes, by
operation, for PyTorch's unfused attention, the fused kernels and flashsim's kernels.

Stacked bars of GPU time (ms) by operation for one GPT-2-like configuration (default
batch 8, 16 heads, N = 1024, d = 64, fp16, causal, dropout p = 0.1), from the
`op_breakdown` rows of the results data set (`analysis.opbreakdown`; the latest run):

(a) PyTorch's unfused forward, each operation timed alone (Q K^T matmul, mask, softmax,
    dropout, P V matmul; CUDA events; a tick marks the five timed as one sequence), against
    the fused kernels: torch `scaled_dot_product_attention` with the FLASH and EFFICIENT
    backends (with the same dropout, and FLASH without it), and flashsim's fa2 forward
    (fp16 tensor-core kernel, CUPTI; no dropout), measured and modelled.
(b) flashsim's standard attention (three kernels through HBM: std_S, std_softmax,
    std_PV; CUPTI), measured and modelled, against flashsim's fa2: each flashsim kernel is
    coloured as the PyTorch operation it stands for (`analysis.opbreakdown.PAIRING`):
    std_S <-> Q K^T matmul (flashsim applies the causal mask inside std_S and skips fully
    masked tiles), std_softmax <-> mask + softmax, std_PV <-> P V matmul. flashsim has no
    dropout.

Modelled bars (hatched): `iosim.predict_time` per launch on the measuring device's
preset (H100-SXM without rows), with the tiling the kernels ran. Over each bar: its total
and, for a measured bar, the speed-up over the panel's first measured bar; for a modelled
bar, model / measured where that kernel was measured. Without op_breakdown rows only the
modelled bars are drawn, and the title says so.

Remake: `flashsim figure fig13` (two model calls, about 1-2 s). The rows:
`python3 -m analysis.opbreakdown --out rows.jsonl` on a GPU, then
`flashsim results add rows.jsonl`.
"""
from __future__ import annotations

import time

from ._style import save

NAME = "fig13_time_breakdown"

#: segment key -> (colour, hatch, legend label)
SEGMENTS = {
    "matmul_qk": ("#1f77b4", None, "Q K^T matmul (std_S, masked)"),
    "mask": ("#ff7f0e", None, "mask"),
    "softmax": ("#2ca02c", None, "softmax"),
    "mask+softmax": ("#2ca02c", "..", "softmax (std_softmax)"),
    "dropout": ("#d62728", None, "dropout"),
    "matmul_pv": ("#9467bd", None, "P V matmul"),
    "fused": ("#7f7f7f", None, "fused kernel"),
}
#: flashsim kernel family -> segment
FLASHSIM_SEGMENT = {"std_S": "matmul_qk", "std_softmax": "mask+softmax", "std_PV": "matmul_pv",
                    "fa2_tc": "fused", "fa2_fast": "fused"}


def _latest_run(rows):
    """The ok rows of the last run in the data set (by date, then file order)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return [], None
    last = max(ok, key=lambda r: str(r.get("date")))["run_id"]
    return [r for r in rows if r["run_id"] == last], last


def _bar(label, impl, source, segs, panel, **extra):
    return {"label": label, "impl": impl, "source": source,
            "segments": [(k, float(v)) for k, v in segs], "total": float(sum(v for _, v in segs)),
            "panel": panel, **extra}


def generate(rows=None, data=None, gpu: str | None = None):
    """{"bars": [...], "measured": bool, "config", "run", "seconds"}; rows: op_breakdown
    rows (default: the data set's)."""
    from analysis import opbreakdown as OB
    from analysis import results as R
    from analysis.fit_levels import GPU_OF_DEVICE
    t0 = time.perf_counter()
    rows = R.load(OB.KIND, data=data) if rows is None else rows
    run, run_id = _latest_run(rows)
    ok = [r for r in run if r.get("status") == "ok"]
    errors = [{"impl": r["impl"], "dropout_p": r.get("dropout_p"), "error": r.get("error")}
              for r in run if r.get("status") != "ok"]
    if ok:
        c0 = ok[0]["config"]
        c = OB.problem_config(**{k: c0[k] for k in ("batch", "heads", "N", "d", "dtype",
                                                    "causal")},
                              dropout_p=next((r["config"]["dropout_p"] for r in ok
                                              if r["impl"] == "pytorch_unfused"),
                                             OB.DEFAULTS["dropout_p"]))
        device = ok[0]["device"]
        gpu = gpu or GPU_OF_DEVICE.get(device, "H100-SXM")
    else:
        c, device, gpu = OB.problem_config(), None, gpu or "H100-SXM"
    p = c["dropout_p"]
    meas = OB.summarize(ok)
    tiling = {impl: next((r["config"].get("tiling") for r in ok if r["impl"] == impl), None)
              for impl in ("flashsim_standard", "flashsim_fa2")}
    model = {impl: OB.modelled(c, impl, gpu, tiling[impl]) for impl in tiling}
    bars = []
    # (a) PyTorch unfused against the fused kernels
    u = meas.get(("pytorch_unfused", p))
    if u:
        bars.append(_bar("PyTorch unfused\n(measured)", "pytorch_unfused", "measured",
                         [(o, u[o]) for o in OB.OP_NAMES if o in u], "a",
                         sequence_ms=u.get("sequence")))
    for impl, name in (("torch_sdpa_flash", "torch SDPA\nFLASH"),
                       ("torch_sdpa_efficient", "torch SDPA\nEFFICIENT")):
        for dp in sorted({p, 0.0}, reverse=True):
            m = meas.get((impl, dp))
            if m and "fused" in m:
                bars.append(_bar(f"{name}\np={dp:g} (measured)", impl, "measured",
                                 [("fused", m["fused"])], "a", dropout_p=dp))
    fa2_meas = meas.get(("flashsim_fa2", 0.0))
    fa2_bars = []
    if fa2_meas:
        fa2_bars.append(_bar("flashsim fa2\np=0 (measured)", "flashsim_fa2", "measured",
                             [(FLASHSIM_SEGMENT[k], v) for k, v in fa2_meas.items()], "a"))
    fa2_bars.append(_bar("flashsim fa2\np=0 (modelled)", "flashsim_fa2", "modelled",
                         [(FLASHSIM_SEGMENT[x["op"]], x["predicted_ms"]) for x in model["flashsim_fa2"]],
                         "a", binds=[x["binds"] for x in model["flashsim_fa2"]]))
    bars += fa2_bars
    # (b) flashsim standard against flashsim fa2
    st = meas.get(("flashsim_standard", 0.0))
    if st:
        bars.append(_bar("flashsim standard\np=0 (measured)", "flashsim_standard", "measured",
                         [(FLASHSIM_SEGMENT[k], st[k]) for k in ("std_S", "std_softmax", "std_PV")
                          if k in st], "b"))
    bars.append(_bar("flashsim standard\np=0 (modelled)", "flashsim_standard", "modelled",
                     [(FLASHSIM_SEGMENT[x["op"]], x["predicted_ms"])
                      for x in model["flashsim_standard"]], "b",
                     binds=[x["binds"] for x in model["flashsim_standard"]]))
    bars += [dict(b, panel="b") for b in fa2_bars]
    return {"bars": bars, "measured": bool(ok), "errors": errors,
            "config": {"data_set": OB.KIND, "run_id": run_id, "device": device, "gpu": gpu,
                       **{k: c[k] for k in ("batch", "heads", "N", "d", "dtype", "causal",
                                            "dropout_p")},
                       "tiling": tiling},
            "seconds": time.perf_counter() - t0}


def bar_notes(bars) -> list[str]:
    """The text over each bar of a panel: its total and, for a measured bar, the speed-up
    over the panel's first measured bar; for a modelled bar, model / measured where the
    same impl was measured (else the speed-up over the panel's first modelled bar)."""
    out = []
    first = {}
    for b in bars:
        first.setdefault(b["source"], b)
    for b in bars:
        note = f"{b['total']:.3g} ms"
        twin = next((x for x in bars if x["impl"] == b["impl"] and x["source"] == "measured"
                     and x.get("dropout_p") == b.get("dropout_p")), None)
        ref = first[b["source"]]
        if b["source"] == "modelled" and twin is not None and twin["total"] > 0:
            note += f"\nmodel / measured {b['total'] / twin['total']:.2f}"
        elif ref is not b and b["total"] > 0:
            r = ref["total"] / b["total"]
            note += (f"\n{r:.1f}x faster" if r >= 1 else f"\n{1 / r:.1f}x slower")
        out.append(note)
    return out


def _short(label: str) -> str:
    """A bar's tick label, short: measured is the default, modelled bars say so."""
    return (label.replace("PyTorch unfused\n(measured)", "PyTorch\nunfused")
            .replace("flashsim standard", "flashsim\nstandard")
            .replace(" (measured)", "").replace(" (modelled)", ",\nmodel"))


def _panel(ax, bars, title):
    import numpy as np
    x = np.arange(len(bars))
    top = max([b["total"] for b in bars] + [b.get("sequence_ms") or 0 for b in bars] or [1.0])
    for i, (b, note) in enumerate(zip(bars, bar_notes(bars))):
        y = 0.0
        modelled = b["source"] == "modelled"
        for k, v in b["segments"]:
            col, hatch, _ = SEGMENTS.get(k, ("#bbbbbb", None, k))
            ax.bar(i, v, bottom=y, width=0.62, color=col, alpha=0.45 if modelled else 0.9,
                   hatch=("//" if modelled else "") + (hatch or ""), edgecolor="white", lw=0.6)
            if v > 0.06 * top:
                ax.text(i, y + v / 2, f"{v:.3g}", ha="center", va="center", fontsize=6.5,
                        color="black", bbox=dict(facecolor="white", alpha=0.6, lw=0, pad=0.5))
            y += v
        if b.get("sequence_ms"):
            ax.plot([i - 0.36, i + 0.36], [b["sequence_ms"]] * 2, "k-", lw=1.6)
            ax.text(i + 0.38, b["sequence_ms"], "in\nsequence", fontsize=6, va="center")
        note = note.replace("model / measured ", "") + (" x meas." if "model / measured"
                                                         in note else "")
        ax.text(i, max(y, b.get("sequence_ms") or 0) + 0.02 * top, note, ha="center",
                va="bottom", fontsize=6.5)
    ax.set_xticks(x)
    ax.set_xticklabels([_short(b["label"]) for b in bars], fontsize=7)
    ax.set_ylim(0, top * 1.22)
    ax.set_xlim(-0.6, max(len(bars), 4) - 0.4)
    ax.set_ylabel("GPU time of the forward (ms)")
    ax.set_title(title, fontsize=8.5)
    ax.grid(axis="x", visible=False)


def plot(data):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 5.2), constrained_layout=True,
                             gridspec_kw={"width_ratios": [1.6, 1]})
    c = data["config"]
    a = [b for b in data["bars"] if b["panel"] == "a"]
    b = [x for x in data["bars"] if x["panel"] == "b"]
    _panel(axes[0], a, "(a) PyTorch's unfused ops against fused kernels")
    _panel(axes[1], b, "(b) flashsim: standard against fa2")
    if not data["measured"]:
        axes[0].text(0.5, 0.55, "no op_breakdown rows yet:\npython3 -m analysis.opbreakdown "
                     "--out rows.jsonl\n(on a GPU), then flashsim results add rows.jsonl",
                     transform=axes[0].transAxes, ha="center", va="center", fontsize=8,
                     color="#aa0000")
    used = [k for k in SEGMENTS if any(k == s for x in data["bars"] for s, _ in x["segments"])]
    handles = [Patch(facecolor=SEGMENTS[k][0], hatch=SEGMENTS[k][1], edgecolor="white",
                     label=SEGMENTS[k][2]) for k in used]
    handles.append(Patch(facecolor="#bbbbbb", alpha=0.45, hatch="//", edgecolor="white",
                         label="modelled (time model)"))
    axes[0].legend(handles=handles, loc="upper right", ncol=2, fontsize=7, framealpha=0.9)
    shape = (f"batch {c['batch']}, {c['heads']} heads, N = {c['N']}, d = {c['d']}, {c['dtype']}"
             f"{', causal' if c['causal'] else ''}, dropout p = {c['dropout_p']:g}")
    where = (f"measured on the {c['device']}" if data["measured"] else
             f"no measured rows yet: modelled only ({c['gpu']} preset)")
    fig.suptitle(f"Attention forward time by operation (the paper's Figure 1, right), {where}\n"
                 f"{shape}", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, {**data["config"], "measured": data["measured"]})


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
