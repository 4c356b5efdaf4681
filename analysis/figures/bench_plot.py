"""Figure of `flashsim bench` rows: time (ms) and TFLOP/s against N.

One panel pair (time above, TFLOP/s below) per (dtype, d, causal) present in the rows, a
line per implementation; skipped points are left out (the JSON says why). The title names
the device and the date(s) of the rows.

    python3 -m analysis.figures.bench_plot RESULTS.json [OUT.png]
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

IMPL_ORDER = ("fa2", "fa1", "standard", "torch_math", "torch_efficient", "torch_flash")
STYLE = {"fa2": ("C0", "o", "-"), "fa1": ("C1", "s", "-"), "standard": ("C2", "^", "-"),
         "torch_math": ("C3", "v", "--"), "torch_efficient": ("C4", "D", "--"),
         "torch_flash": ("C5", "P", "--")}


def panels(rows: list[dict]) -> dict:
    """{(dtype, d, causal): {impl: [(N, ms, tflops), ...] sorted by N}} of measured rows."""
    out: dict = {}
    for r in rows:
        if r.get("ms_median") is None:
            continue
        key = (r["dtype"], int(r["d"]), bool(r["causal"]))
        out.setdefault(key, {}).setdefault(r["impl"], []).append(
            (int(r["N"]), float(r["ms_median"]), float(r["tflops"])))
    for series in out.values():
        for impl in series:
            series[impl].sort()
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0] != "fp32", kv[0][1], kv[0][2])))


def title_of(rows: list[dict]) -> str:
    devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
    dates = sorted({str(r.get("date")) for r in rows if r.get("date")})
    bh = sorted({int(r["batch_heads"]) for r in rows if r.get("batch_heads")})
    return (f"Forward attention on {', '.join(devices) or 'unknown device'}, "
            f"{' to '.join([dates[0], dates[-1]] if len(dates) > 1 else dates) or 'undated'}; "
            f"batch x heads = {', '.join(map(str, bh))}; median of timed calls")


def plot(rows: list[dict], path, title: str | None = None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = panels(rows)
    if not data:
        raise ValueError("rows hold no measured points (every row skipped, or none given)")
    keys = list(data)
    ncols = min(4, len(keys))
    nblocks = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(2 * nblocks, ncols, figsize=(4.2 * ncols, 6.4 * nblocks),
                             squeeze=False, sharex="col")
    for i, key in enumerate(keys):
        r, c = 2 * (i // ncols), i % ncols
        ax_t, ax_f = axes[r][c], axes[r + 1][c]
        dtype, d, causal = key
        for impl in sorted(data[key], key=lambda s: IMPL_ORDER.index(s) if s in IMPL_ORDER else 99):
            pts = data[key][impl]
            color, marker, ls = STYLE.get(impl, ("k", ".", ":"))
            Ns = [p[0] for p in pts]
            ax_t.plot(Ns, [p[1] for p in pts], color=color, marker=marker, ls=ls, label=impl)
            ax_f.plot(Ns, [p[2] for p in pts], color=color, marker=marker, ls=ls, label=impl)
        ax_t.set_title(f"{dtype}, d={d}, {'causal' if causal else 'non-causal'}", fontsize=10)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("time per call (ms)")
        ax_f.set_ylabel("TFLOP/s (4 N² d per head)")
        ax_f.set_xlabel("sequence length N")
        for ax in (ax_t, ax_f):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        ax_t.legend(fontsize=7)
    for j in range(len(keys), nblocks * ncols):
        r, c = 2 * (j // ncols), j % ncols
        axes[r][c].set_visible(False)
        axes[r + 1][c].set_visible(False)
    fig.suptitle(title or title_of(rows), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or len(argv) > 2:
        print("usage: python3 -m analysis.figures.bench_plot RESULTS.json [OUT.png]", file=sys.stderr)
        return 2
    src = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else src.with_suffix(".png")
    rows = json.loads(src.read_text())
    print(plot(rows, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
