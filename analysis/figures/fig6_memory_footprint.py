"""Figure 6: extra HBM memory beyond Q, K, V, O: O(N^2) for standard, O(N) for flash.

Bytes per head of the buffers each schedule allocates in HBM (iosim.schedules):
standard S and P, N x N each in the problem dtype; fa1 l and m, N float32 each; fa2
L, N float32. For scale, the inputs and output Q, K, V, O take 4 N d x itemsize.
"""
from __future__ import annotations

import numpy as np

from ._style import COLORS, new_figure, save, titles

NAME = "fig6_memory_footprint"


def extra_hbm_bytes(algorithm: str, N, itemsize: int):
    """Bytes per head of the HBM buffers beyond Q, K, V, O (see module docstring)."""
    N = np.asarray(N, dtype=np.float64)
    return {"standard": 2 * N * N * itemsize, "fa1": 2 * N * 4.0, "fa2": N * 4.0}[algorithm]


def generate(d=64, dtype="fp16", Ns=None):
    Ns = np.array(Ns if Ns is not None else [2 ** k for k in range(8, 18)], dtype=np.int64)
    item = 2 if dtype == "fp16" else 4
    return {"d": d, "dtype": dtype, "N": Ns.tolist(),
            "qkvo": (4 * Ns * d * item).tolist(),
            **{a: extra_hbm_bytes(a, Ns, item).tolist() for a in ("standard", "fa1", "fa2")}}


def plot(data):
    fig, ax = new_figure()
    N = np.array(data["N"])
    for a in ("standard", "fa1", "fa2"):
        ax.loglog(N, data[a], "o-", ms=3, color=COLORS[a], label=f"{a} extra buffers")
    ax.loglog(N, data["qkvo"], "k--", lw=1, label="Q, K, V, O themselves (4 N d)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("extra HBM memory per head (bytes)")
    ax.legend(fontsize=7)
    titles(fig, ax, "Extra HBM memory: O(N^2) vs O(N)",
           f"d={data['d']}, {data['dtype']} (S, P in {data['dtype']}; statistics float32)")
    return fig


def make(out_dir, **kw):
    data = generate(**kw)
    return save(plot(data), out_dir, NAME, {"d": data["d"], "dtype": data["dtype"]})
