"""Figure 5: arithmetic intensity and roofline, standard vs FlashAttention, on a preset.

Model bounds, not measurements. FLOPs per head of the forward matmuls: 4 d x (active
(query, key) pairs) (2 FLOPs per multiply-add, QK^T and PV; softmax FLOPs ignored).
Bytes per head: closed-form HBM traffic. Arithmetic intensity I = FLOPs / bytes; the
roofline is min(peak FLOP/s, I x HBM bandwidth) with the preset's dense tensor-core (fp16)
or CUDA-core (fp32) peak. Flash tiles: the paper's rule from the preset's per-block SRAM;
standard: 64 x 64 tiles.
"""
from __future__ import annotations

import numpy as np

from iosim import closed_form_arrays, get_hardware, paper_tiling, sram_to_elements, tile_sums

from ._style import COLORS, new_figure, save, titles

NAME = "fig5_roofline"


def generate(gpu="A100-40GB", d=64, dtype="fp16", Ns=(1024, 4096, 16384), causal=False):
    hw = get_hardware(gpu)
    item = 2 if dtype == "fp16" else 4
    t = paper_tiling(sram_to_elements(hw.sram_bytes, dtype), d)
    Ns = np.array(Ns, dtype=np.int64)
    pairs = tile_sums(Ns, 1, 1, causal)[3]          # 1x1 tiles: RCA = visible (q, k) pairs
    flops = 4.0 * d * pairs
    pts = []
    for a, (B_r, B_c) in (("standard", (64, 64)), ("fa1", (t.B_r, t.B_c)), ("fa2", (t.B_r, t.B_c))):
        by = closed_form_arrays(a, Ns, d, B_r, B_c, causal=causal, itemsize=item)["hbm_bytes"]
        for N, f, b in zip(Ns, flops, by):
            pts.append({"algorithm": a, "N": int(N), "flops": float(f), "bytes": float(b),
                        "intensity": float(f / b)})
    return {"gpu": hw.name, "peak_flops": hw.peak_flops(dtype), "bandwidth": hw.hbm_bandwidth,
            "d": d, "dtype": dtype, "causal": causal, "B_r": t.B_r, "B_c": t.B_c, "points": pts}


def plot(data):
    fig, ax = new_figure()
    peak, bw = data["peak_flops"], data["bandwidth"]
    I = np.geomspace(0.5, 1e5, 200)
    ax.loglog(I, np.minimum(peak, I * bw) / 1e12, "k-", lw=1.5, label="roofline")
    ridge = peak / bw
    ax.axvline(ridge, color="k", ls=":", lw=0.8)
    ax.text(ridge * 1.1, peak / 1e12 * 0.05, f"ridge {ridge:.0f} FLOP/B", fontsize=7)
    marks = {1024: "o", 4096: "s", 16384: "^"}
    for p in data["points"]:
        y = min(peak, p["intensity"] * bw) / 1e12
        ax.loglog(p["intensity"], y, marks.get(p["N"], "D"), color=COLORS[p["algorithm"]], ms=7)
    for a in ("standard", "fa1", "fa2"):
        ax.plot([], [], "o", color=COLORS[a], label=a)
    for N, m in marks.items():
        ax.plot([], [], m, color="gray", label=f"N={N}")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("attainable throughput bound (TFLOP/s)")
    ax.legend(fontsize=7, loc="lower right")
    titles(fig, ax, "Roofline: standard vs FlashAttention (model bound)",
           f"{data['gpu']}: peak {peak / 1e12:.0f} TFLOP/s ({data['dtype']}), HBM "
           f"{bw / 1e9:.0f} GB/s; d={data['d']}, flash B_r={data['B_r']}, B_c={data['B_c']}")
    return fig


def make(out_dir, **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME,
                {k: data[k] for k in ("gpu", "d", "dtype", "causal", "B_r", "B_c")})
