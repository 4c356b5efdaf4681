"""Figure 2: HBM traffic vs sequence length N: standard vs fa1 vs fa2.

Bytes per head (problem dtype; statistics float32), closed forms, M = a hardware preset's
per-block shared memory with the paper's tiling for fa1/fa2 and 64 x 64 tiles for
standard. The right axis shows standard / flash: the paper's "up to 9x fewer accesses"
(measured on GPT-2 medium, Fig. 2) is context, not a target.
"""
from __future__ import annotations

import numpy as np

from iosim import get_hardware, paper_tiling, sram_to_elements
from iosim import closed_form_arrays

from ._style import COLORS, MiB, new_figure, save, titles

NAME = "fig2_traffic_vs_N"


def generate(d=64, dtype="fp16", gpu="A100-40GB", Ns=None, causal=False):
    Ns = np.array(Ns if Ns is not None else [2 ** k for k in range(8, 16)], dtype=np.int64)
    hw = get_hardware(gpu)
    item = 2 if dtype == "fp16" else 4
    t = paper_tiling(sram_to_elements(hw.sram_bytes, dtype), d)
    out = {"d": d, "dtype": dtype, "gpu": hw.name, "causal": causal, "N": Ns.tolist(),
           "B_r": t.B_r, "B_c": t.B_c}
    out["standard"] = closed_form_arrays("standard", Ns, d, 64, 64, causal=causal, itemsize=item)["hbm_bytes"].tolist()
    for a in ("fa1", "fa2"):
        out[a] = closed_form_arrays(a, Ns, d, t.B_r, t.B_c, causal=causal, itemsize=item)["hbm_bytes"].tolist()
    return out


def plot(data):
    fig, ax = new_figure()
    N = np.array(data["N"])
    for a in ("standard", "fa1", "fa2"):
        ax.loglog(N, np.array(data[a]) / MiB, "o-", ms=3, color=COLORS[a], label=a)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("HBM traffic per head (MiB read + written)")
    ax2 = ax.twinx()
    for a, ls in (("fa1", "--"), ("fa2", ":")):
        ax2.plot(N, np.array(data["standard"]) / np.array(data[a]), ls, color=COLORS[a],
                 label=f"standard / {a}")
    ax2.set_ylabel("standard / flash (x fewer bytes)")
    ax2.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    titles(fig, ax, "HBM traffic vs sequence length",
           f"d={data['d']}, {data['dtype']}, causal={data['causal']}, M = {data['gpu']} per-block SRAM, "
           f"flash tiles B_r={data['B_r']}, B_c={data['B_c']}; standard 64x64")
    return fig


def make(out_dir, **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, {k: data[k] for k in ("d", "dtype", "gpu", "causal", "B_r", "B_c")})
