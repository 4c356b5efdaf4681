"""Figure 14: KV-cache decoding: modelled traffic against the cache length N_kv and the
number of splits S, and the measured kernels (gpu.decode) against the HBM roofline.

One configuration family: N_q = 1 new row, fp16, d = 128, 32 query heads (MHA, and GQA on
8 K/V heads), contiguous cache; the H100-SXM preset (132 SMs, 3.35 TB/s).

(a) Model: HBM bytes per decoding step (iosim.decode.decode_closed_form, problem totals)
    against N_kv, batch 1: fa2_decode (S = 1) and split_kv at the rule's S
    (iosim.choose_num_splits for 132 SMs); GQA with kv_reads "per_query_head" (each query
    head reads its group's K/V: G = 4 times the K/V bytes) and "per_group" (once). The
    split's extra bytes (Opart, Lpart written and read back) are drawn alone (dotted).
(b) Model and measurement against S at one shape (batch 1, MHA, N_kv = 16K): the bytes
    (left axis) grow with S by the partials; the blocks in flight, S x batch x heads,
    fill the 132 SMs at the rule's S (marked). Measured kernel time (right axis) from the
    data set's num_splits sweep rows (`decode_bench`, sweep "num_splits", shape
    "b1_mha_d128_16k") where present.
(c) Measured kernel time against N_kv (decode_bench rows, flashsim with num_splits
    "auto" and torch SDPA, contiguous and paged, per batch; d = 128) and the roofline
    floor dram_bytes / 3.35 TB/s (the least a step must move: K and V once, Q, O, L).
(d) Achieved bandwidth dram_bytes / time against N_kv, with the 3.35 TB/s line.
Without decode_bench rows, (c) draws the floor only, (d) the roofline only, (b) the
model only, and the title says so.

Rows: `scripts/decode_bench.py --out rows.jsonl` on a GPU, then
`flashsim results add rows.jsonl`. Remake: `flashsim figure fig14` (< 1 s).
"""
from __future__ import annotations

import textwrap
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
            "has_rows": bool(ok),
            "config": {"data_set": KIND, "device": device, "gpu": gpu, "d": D, "heads": HEADS,
                       "kv_heads_gqa": KV_GQA, "dtype": "fp16", "seq_len_q": 1,
                       "hbm_bandwidth": hw.hbm_bandwidth, "rows": len(ok),
                       "devices": sorted({r["device"] for r in ok})},
            "seconds": time.perf_counter() - t0}


def plot(data):
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 8, "axes.grid": True, "grid.alpha": 0.3})
    fig, axes = plt.subplots(2, 2, figsize=(12.5, 9.0), constrained_layout=True)
    fig.get_layout_engine().set(rect=(0, 0.07, 1, 0.93))
    c = data["config"]
    bw = c["hbm_bandwidth"]
    # (a) model bytes against N_kv
    ax = axes[0, 0]
    colors = {"MHA": "#1f77b4", "GQA per_query_head": "#ff7f0e", "GQA per_group": "#2ca02c"}
    for name, pts in data["series"].items():
        x = [p["N_kv"] for p in pts]
        ax.loglog(x, [p["fa2_decode"] for p in pts], "-", color=colors[name],
                  label=f"{name}: fa2_decode (S = 1)")
        ax.loglog(x, [p["split_kv"] for p in pts], "--", marker="o", ms=3, color=colors[name],
                  label=f"{name}: split_kv, S from the rule")
        ax.loglog(x, [max(p["partials"], 1) for p in pts], ":", color=colors[name], lw=1,
                  label=f"{name}: Opart + Lpart bytes alone")
        for p in pts[::2]:
            ax.annotate(f"S={p['S']}", (p["N_kv"], p["split_kv"]), fontsize=6,
                        textcoords="offset points", xytext=(2, 4), color=colors[name])
    ax.set_xlabel("cache length N_kv (rows)")
    ax.set_ylabel("HBM bytes per step (model, problem total)")
    ax.set_title(f"(a) model: bytes per step, batch 1, {c['heads']} query heads\n(GQA "
                 f"per_query_head requests what MHA does: the lines coincide)", fontsize=8.5)
    ax.legend(fontsize=6.2, ncol=1)
    # (b) partial traffic and time against S
    ax = axes[0, 1]
    sw = data["sweep"]
    rule = data["rule"]
    ax.plot([p["S"] for p in sw], [p["partial_pct"] for p in sw], "-", color="#1f77b4",
            label="model: Opart + Lpart bytes, % of K + V bytes (left)")
    ax.axhline(5.0, color="#1f77b4", ls=":", lw=0.8, label="the rule's cap (5 %)")
    ax.axvline(rule["num_splits"], color="#444444", ls=":", lw=1)
    ax.axvline(-(-rule["target_blocks"] // rule["blocks_per_split"]), color="#bbbbbb", lw=4,
               alpha=0.4, label="S x blocks a split >= SMs from here")
    ax.text(rule["num_splits"] + 0.7, 0.2, f"rule: S = {rule['num_splits']}\n({rule['binding']}: "
            f"{rule['blocks_per_split']} blocks a split,\n{rule['target_blocks']} SMs)",
            fontsize=6.5, va="bottom")
    ax.set_xlabel("num_splits S")
    ax.set_ylabel("partial-output traffic (% of the K + V bytes, model)")
    ax2 = ax.twinx()
    ax2.plot([p["S"] for p in sw], [p["floor_ms"] * 1e3 for p in sw], "-", color="#999999",
             lw=0.8, label="model bytes / HBM bandwidth (us, right)")
    if data["sweep_measured"]:
        xs, ys = zip(*data["sweep_measured"])
        ax2.plot(xs, [y * 1e3 for y in ys], "o-", ms=3, color="#2ca02c",
                 label="measured flashsim kernels (us, right)")
    else:
        ax2.text(0.5, 0.6, "no num_splits sweep rows yet: model only", transform=ax2.transAxes,
                 ha="center", color="#aa0000", fontsize=8)
    ax2.set_ylabel("time per step (us)")
    ax2.set_ylim(bottom=0)
    ax2.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=6.5, loc="upper left")
    ax.set_title(f"(b) against S: batch 1, MHA, N_kv = {SWEEP_N_KV}, d = {D}, fp16",
                 fontsize=8.5)
    # (c) time against N_kv, (d) bandwidth against N_kv
    axc, axd = axes[1, 0], axes[1, 1]
    floor = {}
    for m in data["measured"]:
        floor.setdefault((m["attn"], m["batch"]), {})[m["N_kv"]] = m["floor_ms"]
    for m_key in sorted({(m["impl"], m["attn"], m["batch"], m["paged"]) for m in data["measured"]},
                        key=str):
        impl, attn, batch, paged = m_key
        pts = sorted((m for m in data["measured"]
                      if (m["impl"], m["attn"], m["batch"], m["paged"]) == m_key),
                     key=lambda m: m["N_kv"])
        style = dict(color=IMPL_COLORS.get(impl, "#7f7f7f"), marker=BATCH_MARKERS.get(batch, "x"),
                     ms=4, ls="-" if attn == "mha" else "--",
                     mfc="white" if paged else None, lw=0.9, alpha=0.85)
        lab = f"{impl} {attn} b={batch}{' paged' if paged else ''}"
        axc.loglog([m["N_kv"] for m in pts], [m["ms"] for m in pts], label=lab, **style)
        axd.semilogx([m["N_kv"] for m in pts], [m["gbps"] for m in pts], label=lab, **style)
    if not data["measured"]:   # the floor of the model family instead
        for name, pts in data["series"].items():
            if name == "GQA per_query_head":
                continue
            axc.loglog([p["N_kv"] for p in pts],
                       [min(p["fa2_decode"], p["split_kv"]) / bw * 1e3 for p in pts], "-",
                       label=f"{name}, batch 1: model bytes / {bw / 1e12:.2f} TB/s")
        for ax in (axc, axd):
            ax.text(0.5, 0.5, "no decode_bench rows yet: model only\n(scripts/decode_bench.py "
                    "on a GPU,\nthen flashsim results add rows.jsonl)", transform=ax.transAxes,
                    ha="center", va="center", fontsize=8, color="#aa0000")
    else:
        for (attn, batch), fl in sorted(floor.items()):
            xs = sorted(fl)
            axc.loglog(xs, [fl[x] for x in xs], ":", color="#444444", lw=0.8)
    axd.axhline(bw / 1e9, color="black", lw=1.2, label=f"HBM roofline {bw / 1e12:.2f} TB/s")
    axc.set_xlabel("cache length N_kv (rows)")
    axc.set_ylabel("time per decoding step (ms)")
    axc.set_title("(c) measured kernel time (dotted: dram_bytes / HBM bandwidth)", fontsize=8.5)
    axd.set_xlabel("cache length N_kv (rows)")
    axd.set_ylabel("achieved GB/s (dram_bytes / time)")
    axd.set_title("(d) achieved bandwidth against the HBM roofline", fontsize=8.5)
    axd.set_ylim(0, max([bw / 1e9] + [m["gbps"] for m in data["measured"]]) * 1.15)
    axd.set_xscale("log")
    axd.set_xlim(KV_LENS[0] / 1.5, KV_LENS[-1] * 1.5)
    axc.legend(fontsize=5.8, ncol=2)
    axd.legend(fontsize=5.8, ncol=2, loc="lower right")
    where = (f"measured on {', '.join(c['devices'])} ({c['rows']} decode_bench rows)"
             if data["has_rows"] else "NO decode_bench rows yet: model panels only")
    fig.suptitle(f"KV-cache decoding (N_q = 1, fp16, d = {c['d']}): traffic model and the "
                 f"gpu.decode kernels; {where}", fontsize=10, fontweight="bold")
    caption = ("Model: iosim.decode.decode_closed_form (every element the kernels request, "
               "= the kernels' own counts) on the " + c["gpu"] + " preset; S from "
               "iosim.choose_num_splits. Measured: scripts/decode_bench.py (CUDA events around "
               "the kernels alone, median of >= 20 calls, K/V rotated over copies totalling "
               ">= 200 MB where memory allows). dram_bytes = K and V once + Q + O + L "
               "(+ block table): the least a step moves, the same for every implementation; "
               "open markers: paged (256-row pages); dashed: GQA (32 query heads on 8 K/V heads, "
               "flashsim kv_reads='per_group').")
    fig.text(0.5, 0.055, textwrap.fill(caption, 190), ha="center", va="top", fontsize=6.8,
             color="#333333")
    return fig


def make(out_dir="figures", **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, {**data["config"], "has_rows": data["has_rows"],
                                            "seconds": round(data["seconds"], 2)})
