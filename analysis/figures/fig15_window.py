"""Figure 14: fa2 HBM traffic against the local-window size w (issue 18), from the model.

Causal sliding window window=(w, 0) (iosim.Problem: row r sees keys r - w .. r, N_k = N),
bytes per head (fp16; L float32), the fa2 closed form (iosim.closed_form_arrays, exact
tile sums over the band). Square tiles B_r = B_c = B = floor(M / 4d) with M a preset's
per-block shared memory in elements (the paper's B_c; B_r = B_c so both depend on M).

Reference lines (K and V dominate): a query block of B rows reads about w + 2B key rows
of K and of V, so
    window:  K + V ~ 2 (N / B) w d  = 8 N w d^2 / M        (linear in N and in w)
    full causal: K + V ~ 2 (N / B)(N / 2) d = 4 N^2 d^2 / M
times the element size; the model adds Q, O (2 N d) and the edge tiles (4 N d). The
window stops paying off once w approaches N / 2.
"""
from __future__ import annotations

import numpy as np

from iosim import closed_form_arrays, get_hardware, sram_to_elements

from ._style import COLORS, MiB, new_figure, save, titles

NAME = "fig15_window"


def generate(d=64, dtype="fp16", gpu="H100-SXM", Ns=(8192, 65536), windows=None):
    """Model bytes per head of fa2 with window (w, 0), and the two reference scalings."""
    hw = get_hardware(gpu)
    item = 2 if dtype == "fp16" else 4
    M = sram_to_elements(hw.sram_bytes, dtype)
    B = max(16, M // (4 * d))
    out = {"d": d, "dtype": dtype, "gpu": hw.name, "M_elements": M, "B_r": B, "B_c": B,
           "N": list(Ns), "curves": {}}
    for N in Ns:
        ws = np.array(windows if windows is not None
                      else [2 ** k for k in range(4, 30) if 2 ** k < N], dtype=np.int64)
        model = [int(closed_form_arrays("fa2", N, d, B, B, causal=True, itemsize=item,
                                        window=(int(w), 0))["hbm_bytes"]) for w in ws]
        full = int(closed_form_arrays("fa2", N, d, B, B, causal=True, itemsize=item)["hbm_bytes"])
        out["curves"][str(N)] = {
            "w": ws.tolist(), "model_bytes": model, "full_causal_bytes": full,
            "window_scaling_bytes": (8 * N * ws * d * d / M * item).tolist(),
            "full_scaling_bytes": 4 * N * N * d * d / M * item}
    return out


def plot(data):
    fig, ax = new_figure()
    shades = ("#2ca02c", "#17becf", "#9467bd", "#8c564b")
    for (N, c), col in zip(data["curves"].items(), shades):
        w = np.array(c["w"])
        ax.loglog(w, np.array(c["model_bytes"]) / MiB, "o-", ms=3, color=col,
                  label=f"fa2 model, N={N}")
        ax.loglog(w, np.array(c["window_scaling_bytes"]) / MiB, "--", color=col, lw=1,
                  label=f"8 N w d^2 / M, N={N}")
        ax.axhline(c["full_causal_bytes"] / MiB, color=col, ls=":", lw=1,
                   label=f"full causal model, N={N}")
        ax.plot([w[-1]], [c["full_scaling_bytes"] / MiB], "x", color=COLORS["bound"])
    ax.plot([], [], "x", color=COLORS["bound"], label="4 N^2 d^2 / M (full causal)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window w (keys left of the diagonal; window=(w, 0), causal)")
    ax.set_ylabel("HBM traffic per head (MiB read + written)")
    ax.legend(fontsize=6, loc="lower right")
    titles(fig, ax, "fa2 traffic against the local window",
           f"d={data['d']}, {data['dtype']}, M = {data['gpu']} per-block SRAM "
           f"({data['M_elements']} elements), B_r = B_c = M/4d = {data['B_r']}")
    return fig


def make(out_dir, **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME,
                {k: data[k] for k in ("d", "dtype", "gpu", "M_elements", "B_r", "B_c", "N")})
