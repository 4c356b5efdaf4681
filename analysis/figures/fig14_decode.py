"""Figure 14: KV-cache decoding: the measured kernels against the HBM roof, and the decode
time model's error.

One configuration family: N_q = 1 new row, fp16, d = 128, 32 query heads (MHA, and GQA on
8 K/V heads); the H100-SXM preset (132 SMs, 3.35 TB/s).

(a) Achieved bandwidth against the cache length N_kv, from one decode_bench run: the
    newest run of the current kernels (flashsim rows carrying `main_kernel`; the device's
    HBM roof from its iosim preset, analysis.fit_levels.GPU_OF_DEVICE), else, before any,
    the newest run on the H100 (its flashsim rows are the tiled kernel). Colour: kernel
    (gpu.decode's main kernels: tc, the default in fp16, flat; the tiled kernel, impl
    flashsim_tiled at batch 8; torch SDPA; flash_attn where the run has it); line: MHA or
    GQA; marker: batch; contiguous cache, uniform lengths. Bandwidth = dram_bytes / time, where dram_bytes = K
    and V once + Q + O + L is the least a step moves, the same for every implementation.
    Solid black: the HBM peak; dashed: issue 37's goal, 80 % of it (batch >= 8, N_kv >=
    16K); dotted from 64K: 70 % (batch 1).
(b) The time model of gpu.decode's default main kernel in fp16, the tensor-core
    one (`analysis.fit_decode.predict_row`; iosim/timing/decode_tc_constants.json), against
    that kernel's held-out rows (`analysis.fit_decode.split_of`; `model_errors` takes
    the tiled kernel's model and rows too) of the H100-SXM preset it was fitted on; one
    kernel's rows are never predicted by the other's model. Per schedule (fa2_decode,
    split_kv) and cache layout (contiguous, paged), the share of rows whose |predicted /
    measured - 1| is at most x, with lines at 10 % and 15 %.

`generate` also computes the traffic model (iosim.decode.decode_closed_form, bytes per
step against N_kv; MHA and GQA with kv_reads "per_query_head" and "per_group"), the
num_splits rule (iosim.choose_num_splits) and its partial-output traffic against S, and
the measured num_splits sweep rows, for the tests and REPORT readers.

Rows: `flashsim bench --decode --out rows.jsonl` on a GPU, then
`flashsim results add rows.jsonl`. Remake: `flashsim figure fig14` (about 2 s).
"""
from __future__ import annotations

import time

from ._style import save

NAME = "fig14_decode"
KIND = "decode_bench"
KV_LENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
D, HEADS, KV_GQA = 128, 32, 8
SWEEP_SHAPE = "b1_mha_d128_16k"
SWEEP_N_KV = 16384
#: panel (a)'s series: kernel label -> colour
IMPL_COLORS = {"flashsim tc": "#1f77b4", "flashsim flat": "#2ca02c",
               "flashsim tiled": "#ff7f0e", "torch_sdpa": "#d62728", "flash_attn": "#9467bd"}
#: panel (a)'s legend names of the kernel labels
IMPL_NAMES = {"flashsim tc": "flashsim tc", "flashsim flat": "flashsim flat",
              "flashsim tiled": "flashsim tiled"}
#: the preset the decode time models were fitted on (H100 rows): panel (b)'s rows
ERRORS_GPU = "H100-SXM"
BATCH_MARKERS = {1: "o", 8: "s", 32: "^", 64: "D"}


def _model(gpu: str):
    import iosim
    from iosim.decode import DecodeProblem, choose_num_splits, decode_closed_form
    hw = iosim.get_hardware(gpu)
    series = {}
    for name, kv, reads in (("MHA", HEADS, "per_query_head"),
                            ("GQA per_query_head", KV_GQA, "per_query_head"),
                            ("GQA per_group", KV_GQA, "per_group")):
        pts = []
        for n in KV_LENS:
            p = DecodeProblem(N_kv=n, d=D, heads=HEADS, kv_heads=kv, dtype="fp16")
            S = choose_num_splits(p, hw.sm_count, kv_reads=reads).num_splits
            one = decode_closed_form("fa2_decode", p, kv_reads=reads)
            led = decode_closed_form("split_kv" if S > 1 else "fa2_decode", p, num_splits=S,
                                     kv_reads=reads)
            part = sum(led.read_bytes_of(t) + led.write_bytes_of(t) for t in ("Opart", "Lpart"))
            pts.append({"N_kv": n, "S": S, "fa2_decode": one.hbm_bytes, "split_kv": led.hbm_bytes,
                        "partials": part})
        series[name] = pts
    p = DecodeProblem(N_kv=SWEEP_N_KV, d=D, heads=HEADS, dtype="fp16")
    rule = choose_num_splits(p, hw.sm_count)
    sweep = []
    for S in range(1, 65):
        led = decode_closed_form("split_kv" if S > 1 else "fa2_decode", p, num_splits=S)
        part = sum(led.read_bytes_of(t) + led.write_bytes_of(t) for t in ("Opart", "Lpart"))
        kv = led.read_bytes_of("K") + led.read_bytes_of("V")
        sweep.append({"S": S, "bytes": led.hbm_bytes, "blocks": S * p.readers("per_query_head"),
                      "partial_pct": 100.0 * part / kv,
                      "floor_ms": led.hbm_bytes / hw.hbm_bandwidth * 1e3})
    return hw, series, sweep, rule


def kernel_of(r) -> str:
    """Panel (a)'s label of a decode_bench row: "flashsim <main kernel>" for flashsim rows
    (rows without main_kernel predate the flat kernel: tiled), "flashsim tiled" for
    flashsim_tiled rows, else the impl."""
    if r.get("impl") == "flashsim":
        return f"flashsim {r.get('main_kernel') or 'tiled'}"
    return "flashsim tiled" if r.get("impl") == "flashsim_tiled" else r.get("impl")


def panel_run(rows, device: str | None = None):
    """(device, run_id, current) of panel (a): the newest run of the current kernels
    (analysis.tables.newest_decode_runs) on any device (or `device`'s), newest by date;
    else the newest run with timed flashsim rows on the H100 (or `device`, or any);
    current is False then. (None, None, False) without rows."""
    from analysis.tables import newest_decode_runs
    rows = [r for r in rows if device is None or device.lower() in str(r.get("device")).lower()]
    date = {r["run_id"]: str(r.get("date", "")) for r in rows}
    for current in (True, False):
        runs = newest_decode_runs(rows, current=current)
        if not current and device is None:   # the old runs: the H100's first
            runs = {d: x for d, x in runs.items() if "H100" in d} or runs
        if runs:
            dev, run = max(runs.items(), key=lambda kv: date.get(kv[1], ""))
            return dev, run, current
    return None, None, False


def generate(rows=None, data=None, device: str | None = None, gpu: str | None = None):
    """{"series", "sweep", "rule", "measured": [...], "sweep_measured": [...], "errors",
    "has_rows", "current", "config", "seconds"}; rows: decode_bench rows (default: the data
    set's; device: keep those whose device contains it). Panel (a)'s rows ("measured") come
    from one run (panel_run); gpu: the preset of its HBM roof and model series (default:
    the run's device's, H100-SXM without one)."""
    from analysis import results as R
    from analysis.fit_levels import GPU_OF_DEVICE
    from analysis.tables import decode_attn
    t0 = time.perf_counter()
    if rows is None:
        rows = R.load(KIND, data=data)
    rows = [r for r in rows if device is None or device.lower() in str(r.get("device")).lower()]
    ok = [r for r in rows if r.get("status") == "ok" and r.get("ms_median")]
    dev, run, current = panel_run(rows)      # every row: a run cut by its budget is passed over
    gpu = gpu or GPU_OF_DEVICE.get(dev, "H100-SXM")
    hw, series, sweep, rule = _model(gpu)
    errors_main = "tc"             # gpu.decode's default main kernel in fp16
    last = {}
    for r in ok:   # the panel's run: the latest row per point (file order)
        if r["run_id"] != run or r.get("device") != dev or r.get("sweep") or r.get("ragged"):
            continue
        if r.get("d") != D or r.get("seq_len_q", 1) != 1 or r.get("dtype") != "fp16" or \
                r.get("heads") != HEADS or r.get("kv_heads") not in (HEADS, KV_GQA):
            continue
        key = (kernel_of(r), decode_attn(r), r.get("batch"), r.get("paged"), r.get("seq_len_kv"))
        last[key] = r
    measured = [{"impl": k[0], "attn": k[1], "batch": k[2], "paged": k[3], "N_kv": k[4],
                 "ms": float(r["ms_median"]), "gbps": float(r["dram_bytes"]) / float(r["ms_median"]) / 1e6,
                 "num_splits": r.get("num_splits"), "floor_ms": float(r["dram_bytes"]) / hw.hbm_bandwidth * 1e3}
                for k, r in sorted(last.items(), key=lambda kv: (str(kv[0][:4]), kv[0][4]))]
    sw = {}
    for r in ok:   # the panel's run's num_splits sweep
        if r["run_id"] == run and r.get("sweep") == "num_splits" and r.get("shape") == SWEEP_SHAPE:
            sw[r["num_splits"]] = float(r["ms_median"])
    return {"series": series, "sweep": sweep, "rule": rule.to_dict(),
            "measured": measured, "sweep_measured": sorted(sw.items()),
            "errors": model_errors(rows, main=errors_main), "errors_main": errors_main,
            "has_rows": bool(ok), "current": current,
            "config": {"data_set": KIND, "device": dev or device or "H100", "gpu": gpu, "d": D,
                       "heads": HEADS, "kv_heads_gqa": KV_GQA, "dtype": "fp16", "seq_len_q": 1,
                       "hbm_bandwidth": hw.hbm_bandwidth, "rows": len(ok), "run": run,
                       "current_kernels": current, "errors_gpu": ERRORS_GPU,
                       "devices": sorted({r["device"] for r in ok})},
            "seconds": time.perf_counter() - t0}


def model_errors(rows, gpu: str = ERRORS_GPU, main: str = "tiled") -> dict:
    """{"schedule, layout": [|predicted / measured - 1|, ...]} of the `main` kernel's time
    model (`analysis.fit_decode.predict_row`) over that kernel's held-out rows
    (`analysis.fit_decode.split_of`; the rows the constants were not fitted on) measured on
    a device of preset `gpu`. The tiled kernel's rows: impl flashsim or flashsim_tiled whose
    main_kernel is absent (rows before the flat kernel) or "tiled"; the flat or tc kernel's:
    impl flashsim with that main_kernel. Runs in analysis.tables.DECODE_RUNS_SUPERSEDED are
    left out. One kernel's rows are never predicted by another's model."""
    from analysis import fit_decode as T
    from analysis.fit_levels import GPU_OF_DEVICE
    from analysis.tables import DECODE_RUNS_SUPERSEDED
    impls = ("flashsim", "flashsim_tiled") if main == "tiled" else ("flashsim",)
    fs = [r for r in rows if r.get("kind", KIND) == KIND
          and r.get("run_id") not in DECODE_RUNS_SUPERSEDED
          and r.get("impl") in impls
          and r.get("main_kernel", "tiled") == main
          and GPU_OF_DEVICE.get(r.get("device")) == gpu
          and r.get("status") == "ok" and r.get("ms_median") and "schedule" in r]
    out: dict = {}
    for v in T.validation_rows(fs, main=main, gpu=gpu) if fs else []:
        if v["split"] == "heldout":
            out.setdefault(f"{v['schedule']}, {v['layout']}", []).append(abs(v["rel_error"]))
    return dict(sorted(out.items()))


_ERROR_STYLE = {"fa2_decode": "#1f77b4", "split_kv": "#2ca02c"}


def _error_style(name: str) -> dict:
    schedule, layout = name.split(", ")
    return {"color": _ERROR_STYLE.get(schedule, "#7f7f7f"),
            "ls": "-" if layout == "contiguous" else "--", "marker": "o"}


def plot(data):
    """(a) achieved bandwidth of one run's decoding steps (contiguous cache) against the
    HBM roof and issue 37's goals; (b) the default kernel's time model's error on its
    held-out rows."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from analysis.tables import DECODE_GOALS
    from ._style import error_cdf
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig, (ax, axe) = plt.subplots(1, 2, figsize=(9.0, 4.4), layout="constrained",
                                  gridspec_kw={"width_ratios": [1.25, 1]})
    c = data["config"]
    bw = c["hbm_bandwidth"]
    meas = [m for m in data["measured"] if not m["paged"]]
    order = list(IMPL_COLORS)
    rank = lambda i: order.index(i) if i in order else len(order)
    # SDPA and flash_attn under flashsim's lines: the kernels under study drawn last
    for key in sorted({(m["impl"], m["attn"], m["batch"]) for m in meas},
                      key=lambda k: (-rank(k[0]), str(k))):
        impl, attn, batch = key
        pts = sorted((m for m in meas if (m["impl"], m["attn"], m["batch"]) == key),
                     key=lambda m: m["N_kv"])
        ax.plot([m["N_kv"] for m in pts], [m["gbps"] for m in pts],
                color=IMPL_COLORS.get(impl, "#7f7f7f"), marker=BATCH_MARKERS.get(batch, "x"),
                ms=4, ls="-" if attn == "MHA" else "--", lw=1.3 if impl.startswith("flashsim") else 1.0,
                alpha=0.85)
    # the run's cache lengths (every KV_LENS without rows)
    ns = sorted({m["N_kv"] for m in meas}) or list(KV_LENS)
    xmin, xmax = min(ns[0], KV_LENS[-1] // 8) / 1.4, max(ns[-1], KV_LENS[-1]) * 1.4
    ticks = [n for n in KV_LENS if xmin <= n <= xmax]
    ticks = ticks[::2] if len(ticks) > 5 else ticks
    ax.axhline(bw / 1e9, color="black", lw=1.2)
    for g, ls in zip(DECODE_GOALS, ("--", ":")):
        ax.hlines(g.goal * bw / 1e9, max(g.n_kv_min, xmin), xmax,
                  color="black", lw=1.0, ls=ls)
    ax.set_xscale("log", base=2)
    ax.set_xlim(xmin, xmax)
    ax.set_xticks(ticks, [f"{n // 1024}K" for n in ticks])
    ax.set_ylim(0, bw / 1e9 * 1.45)
    ax.set_xlabel("cache length N_kv (rows)")
    ax.set_ylabel("achieved GB/s (least bytes a step moves / time)")
    which = ("newest run of the current kernels" if data.get("current") else
             "before the flat kernel: tiled")
    ax.set_title(f"(a) one run ({which}), contiguous cache", fontsize=9)
    if not meas:
        ax.text(0.5, 0.5, "no decode_bench rows yet", transform=ax.transAxes, ha="center",
                va="center", fontsize=9, color="#aa0000")
    impls = sorted({m["impl"] for m in meas}, key=rank)
    handles = [Line2D([], [], color=IMPL_COLORS.get(i, "#7f7f7f"), lw=1.5,
                      label=IMPL_NAMES.get(i, i)) for i in impls]
    handles += [Line2D([], [], color="#777777", ls="-", label=f"MHA ({c['heads']} heads)"),
                Line2D([], [], color="#777777", ls="--",
                       label=f"GQA ({c['heads']} on {c['kv_heads_gqa']})")]
    handles += [Line2D([], [], color="#777777", ls="none", marker=BATCH_MARKERS[b], ms=4,
                       label=f"batch {b}") for b in sorted({m["batch"] for m in meas})
                if b in BATCH_MARKERS]
    handles.append(Line2D([], [], color="black", lw=1.2, label=f"HBM {bw / 1e12:.2f} TB/s"))
    handles += [Line2D([], [], color="black", lw=1.0, ls=ls,
                       label=f"goal {100 * g.goal:.0f} % ({g.who}, "
                             f"N_kv ≥ {g.n_kv_min // 1024}K)")
                for g, ls in zip(DECODE_GOALS, ("--", ":"))]
    ax.legend(handles=handles, loc="upper center", ncol=3, fontsize=6.5, framealpha=0.9)
    n = sum(len(v) for v in data["errors"].values())
    main = data.get("errors_main", "tiled")
    error_cdf(axe, data["errors"], goals=(0.10, 0.15), xmax=0.3, style=_error_style,
              title=f"(b) {main} kernel's time model, held-out {ERRORS_GPU.split('-')[0]} rows ({n})",
              legend_title="schedule, cache")
    if not data["errors"]:
        axe.text(0.5, 0.5, f"no rows of the {main} kernel yet", transform=axe.transAxes,
                 ha="center", va="center", fontsize=9, color="#aa0000")
    fig.suptitle(f"KV-cache decoding on the {c['gpu'].split('-')[0]} (one new row, fp16, "
                 f"d = {c['d']}): where the kernels stand against\nthe HBM roof and the goal, "
                 f"and how well the {main} kernel's time model predicts it", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, {**data["config"], "has_rows": data["has_rows"]})


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
