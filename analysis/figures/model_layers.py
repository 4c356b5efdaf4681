"""A model's attention traffic per layer: the prefill against the decode steps (model).

From `flashsim model`'s summary (analysis.model_traffic): for each decoder layer, the
ledger bytes (exact, requested from HBM) of the prefill and of all the decode steps
together, side by side, and the prefill's predicted DRAM bytes where the L2 / DRAM model
covers the layer (sliding-window layers: ledger only). The point: at a long context, a
hundred decode steps move about as many bytes per layer as the whole prefill, and
sliding layers cost less in both. Drawn by `flashsim model ... --figure FILE.png`;
`make` draws the Llama-shaped default.
"""
from __future__ import annotations

import numpy as np

from ._style import new_figure, save, titles

NAME = "model_layers"
SHADES = {"prefill": "#1f77b4", "decode": "#ff7f0e", "train_forward": "#2ca02c",
          "train_backward": "#d62728"}
GB = 1e9


def generate(config="llama3.1-8b", prefill=8192, decode_steps=100, gpu="H100-SXM",
             batch=1, dtype="fp16"):
    """The summary of `flashsim model CONFIG` (analysis.model_traffic.summarise)."""
    from iosim.workload import calls_from_config, load_config, model_shape, traffic_table
    from analysis.model_traffic import summarise
    name, cfg = load_config(config)
    shape = model_shape(cfg, name)
    calls = calls_from_config(shape, batch=batch, prefill=prefill, decode_steps=decode_steps,
                              dtype=dtype, preset=gpu)
    out = summarise(traffic_table(calls, gpu))
    out.update(model=name, batch=batch, prefill=prefill, decode_steps=decode_steps,
               dtype=calls[0].problem.dtype)
    return out


def plot(data):
    fig, ax = new_figure()
    secs = data["sections"]
    width = 0.8 / max(1, len(secs))
    for i, (key, sec) in enumerate(secs.items()):
        layers = np.array([r["layer"] for r in sec["layers"]])
        x = layers + (i - (len(secs) - 1) / 2) * width
        label = sec["title"] + (f" ({sec['steps']} steps, summed)" if key == "decode" else "")
        ax.bar(x, [r["ledger_bytes"] / GB for r in sec["layers"]], width,
               color=SHADES.get(key, "#777777"), label=f"{label}: ledger")
        dram = [(xi, r["dram_bytes"]) for xi, r in zip(x, sec["layers"])
                if r["dram_bytes"] is not None]
        if dram and key != "decode":
            ax.plot([a for a, _ in dram], [b / GB for _, b in dram], "_", ms=7, mew=2,
                    color="black", label=f"{sec['title']}: predicted DRAM")
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("attention traffic per layer (GB, whole batch)")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)        # room for the legend above the bars
    totals = ", ".join(f"{s['title']} {s['total']['ledger_bytes'] / GB:.1f} GB"
                       for s in secs.values())
    titles(fig, ax, f"{data['model']}: attention traffic per layer",
           f"prefill {data['prefill']:,} tokens, {data['decode_steps']} decode steps, batch "
           f"{data['batch']}, {data['dtype']}, {data['preset']}; ledger: {totals}")
    return fig


def save_summary(data, out_dir, name=NAME):
    """Draw a summary (with model, prefill, decode_steps, batch, dtype) and save it."""
    return save(plot(data), out_dir, name,
                {k: data[k] for k in ("model", "prefill", "decode_steps", "batch", "dtype",
                                      "preset")})


def make(out_dir, **kw):
    return save_summary(generate(**kw), out_dir)
