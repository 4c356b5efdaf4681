"""Figure 14: KV-cache decoding: the measured kernels against the HBM roof, and the decode
time model's error.

One configuration family: N_q = 1 new row, fp16, d = 128, 32 query heads (MHA, and GQA on
8 K/V heads); the H100-SXM preset (132 SMs, 3.35 TB/s).

(a) Achieved bandwidth against the cache length N_kv, from the data set's decode_bench
    rows (flashsim's gpu.decode with num_splits "auto", and torch SDPA; contiguous cache;
    colour: implementation, line: MHA or GQA, marker: batch): dram_bytes / time, where
    dram_bytes = K and V once + Q + O + L (+ block table) is the least a step moves, the
    same for every implementation. The black line is the preset's HBM bandwidth.
(b) The decode time model (`analysis.fit_decode.predict_row`) against the held-out
    flashsim rows (`analysis.fit_decode.split_of`): per schedule (fa2_decode, split_kv)
    and cache layout (contiguous, paged), the share of rows whose |predicted / measured -
    1| is at most x, with lines at 10 % and 15 %.

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
IMPL_COLORS = {"flashsim": "#2ca02c", "torch_sdpa": "#d62728", "flash_attn": "#9467bd"}
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


def generate(rows=None, data=None, device: str = "H100", gpu: str = "H100-SXM"):
    """{"series", "sweep", "rule", "measured": [...], "sweep_measured": [...],
    "has_rows", "config", "seconds"}; rows: decode_bench rows (default: the data set's,
    those whose device contains `device`)."""
    from analysis import results as R
    t0 = time.perf_counter()
    if rows is None:
        rows = R.load(KIND, device=device, data=data)
    ok = [r for r in rows if r.get("status") == "ok" and r.get("ms_median")]
    hw, series, sweep, rule = _model(gpu)
    last = {}
    for r in ok:   # the latest row per point (file order)
        if r.get("sweep"):
            continue
        if r.get("d") != D or r.get("seq_len_q", 1) != 1 or r.get("dtype") != "fp16":
            continue
        key = (r["impl"], r.get("attn"), r.get("batch"), r.get("paged"), r.get("seq_len_kv"))
        last[key] = r
    measured = [{"impl": k[0], "attn": k[1], "batch": k[2], "paged": k[3], "N_kv": k[4],
                 "ms": float(r["ms_median"]), "gbps": float(r["dram_bytes"]) / float(r["ms_median"]) / 1e6,
                 "num_splits": r.get("num_splits"), "floor_ms": float(r["dram_bytes"]) / hw.hbm_bandwidth * 1e3}
                for k, r in sorted(last.items(), key=lambda kv: (str(kv[0][:4]), kv[0][4]))]
    sw = {}
    for r in ok:
        if r.get("sweep") == "num_splits" and r.get("shape") == SWEEP_SHAPE:
            sw[r["num_splits"]] = float(r["ms_median"])
    return {"series": series, "sweep": sweep, "rule": rule.to_dict(),
            "measured": measured, "sweep_measured": sorted(sw.items()),
            "errors": model_errors(rows),
            "has_rows": bool(ok),
            "config": {"data_set": KIND, "device": device, "gpu": gpu, "d": D, "heads": HEADS,
                       "kv_heads_gqa": KV_GQA, "dtype": "fp16", "seq_len_q": 1,
                       "hbm_bandwidth": hw.hbm_bandwidth, "rows": len(ok),
                       "devices": sorted({r["device"] for r in ok})},
            "seconds": time.perf_counter() - t0}


def model_errors(rows) -> dict:
    """{"schedule, layout": [|predicted / measured - 1|, ...]} of the decode time model
    (`analysis.fit_decode.predict_row`) over the held-out flashsim rows
    (`analysis.fit_decode.split_of`; the rows the constants were not fitted on)."""
    from analysis import fit_decode as T
    fs = [r for r in rows if r.get("kind", KIND) == KIND and r.get("impl") == "flashsim"
          and r.get("status") == "ok" and r.get("ms_median") and "schedule" in r]
    out: dict = {}
    for v in T.validation_rows(fs) if fs else []:
        if v["split"] == "heldout":
            out.setdefault(f"{v['schedule']}, {v['layout']}", []).append(abs(v["rel_error"]))
    return dict(sorted(out.items()))


_ERROR_STYLE = {"fa2_decode": "#1f77b4", "split_kv": "#2ca02c"}


def _error_style(name: str) -> dict:
    schedule, layout = name.split(", ")
    return {"color": _ERROR_STYLE.get(schedule, "#7f7f7f"),
            "ls": "-" if layout == "contiguous" else "--", "marker": "o"}


def plot(data):
    """(a) achieved bandwidth of the measured decoding steps (contiguous cache) against
    the HBM roof; (b) the decode time model's error on the held-out rows."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from ._style import error_cdf
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig, (ax, axe) = plt.subplots(1, 2, figsize=(9.0, 4.4), layout="constrained",
                                  gridspec_kw={"width_ratios": [1.25, 1]})
    c = data["config"]
    bw = c["hbm_bandwidth"]
    meas = [m for m in data["measured"] if not m["paged"]]
    for key in sorted({(m["impl"], m["attn"], m["batch"]) for m in meas}, key=str):
        impl, attn, batch = key
        pts = sorted((m for m in meas if (m["impl"], m["attn"], m["batch"]) == key),
                     key=lambda m: m["N_kv"])
        ax.plot([m["N_kv"] for m in pts], [m["gbps"] for m in pts],
                color=IMPL_COLORS.get(impl, "#7f7f7f"), marker=BATCH_MARKERS.get(batch, "x"),
                ms=4, ls="-" if attn == "mha" else "--", lw=1.0, alpha=0.85)
    ax.axhline(bw / 1e9, color="black", lw=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xlim(KV_LENS[0] / 1.4, KV_LENS[-1] * 1.4)
    ax.set_xticks(KV_LENS[::2], [f"{n // 1024}K" for n in KV_LENS[::2]])
    ax.set_ylim(0, bw / 1e9 * 1.45)
    ax.set_xlabel("cache length N_kv (rows)")
    ax.set_ylabel("achieved GB/s (least bytes a step moves / time)")
    ax.set_title("(a) measured steps against the HBM roof (contiguous cache)", fontsize=9)
    if not meas:
        ax.text(0.5, 0.5, "no decode_bench rows yet", transform=ax.transAxes, ha="center",
                va="center", fontsize=9, color="#aa0000")
    impls = sorted({m["impl"] for m in meas})
    handles = [Line2D([], [], color=IMPL_COLORS.get(i, "#7f7f7f"), lw=1.5, label=i)
               for i in impls]
    handles += [Line2D([], [], color="#777777", ls="-", label=f"MHA ({c['heads']} heads)"),
                Line2D([], [], color="#777777", ls="--",
                       label=f"GQA ({c['heads']} on {c['kv_heads_gqa']})")]
    handles += [Line2D([], [], color="#777777", ls="none", marker=BATCH_MARKERS[b], ms=4,
                       label=f"batch {b}") for b in sorted({m["batch"] for m in meas})
                if b in BATCH_MARKERS]
    handles.append(Line2D([], [], color="black", lw=1.2, label=f"HBM {bw / 1e12:.2f} TB/s"))
    ax.legend(handles=handles, loc="upper center", ncol=4, fontsize=6.5, framealpha=0.9)
    n = sum(len(v) for v in data["errors"].values())
    error_cdf(axe, data["errors"], goals=(0.10, 0.15), xmax=0.25, style=_error_style,
              title=f"(b) time model, held-out rows ({n})", legend_title="schedule, cache")
    if not data["errors"]:
        axe.text(0.5, 0.5, "no decode_bench rows yet", transform=axe.transAxes, ha="center",
                 va="center", fontsize=9, color="#aa0000")
    fig.suptitle(f"KV-cache decoding on the {c['gpu'].split('-')[0]} (one new row, fp16, "
                 f"d = {c['d']}): where the kernels stand against\nthe HBM roof, and how well "
                 "the decode time model predicts them", fontsize=10)
    return fig


def draw(data, out_dir="figures"):
    """Save the figure of `data` (from generate) as out_dir/NAME.png and .svg."""
    return save(plot(data), out_dir, NAME, {**data["config"], "has_rows": data["has_rows"]})


def make(out_dir="figures", **kw):
    return draw(generate(**kw), out_dir)
