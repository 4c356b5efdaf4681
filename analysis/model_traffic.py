"""A model's attention traffic summarised per layer: the numbers behind `flashsim model`
and its figure, from an iosim.workload.TrafficTable (calls priced one by one).

`summarise(table)` gives, per step kind (the prefill, the decode steps, a training step's
forward and backward), one row per layer (calls summed: ledger bytes exact, DRAM bytes and
time where the models give them) and the totals; for the decode steps also the first and
the last step over all layers. `format_summary` prints it; the JSON (`--json`) is the
summary itself. A decode call's step number is its rank among its layer's decode calls,
so a recording (gpu.hf) summarises as the calls built from a config do.
"""
from __future__ import annotations

from iosim.workload import TrafficTable, sum_rows

#: the sections of a summary: (key, step, backward, title)
SECTIONS = (("prefill", "prefill", False, "prefill"),
            ("decode", "decode", False, "decode"),
            ("train_forward", "train", False, "training step, forward"),
            ("train_backward", "train", True, "training step, backward"))
MB = 1e6
GB = 1e9


def _problem_text(call) -> str:
    p = call.problem
    if call.pass_ == "decode":
        return f"N_kv={p.N_kv}"
    if not hasattr(p, "N"):                        # iosim.VarlenProblem: a packed batch
        return (f"varlen N_q={'/'.join(map(str, p.seqlens_q))} N_k="
                f"{'/'.join(map(str, p.seqlens_k))}" + (" causal" if p.causal else ""))
    text = f"N={p.N}" + (f" N_k={p.N_k}" if p.N_k != p.N else "")
    text += " causal" if p.causal else ""
    if p.window != (-1, -1):
        text += f" window={p.window[0]},{p.window[1]}"
    return text


def _cache_rows(call) -> int:
    """Key rows a decode-step call attends to: N_kv of a DecodeProblem, N_k of a Problem
    (a backend that ran the step on the forward kernels), the longest sequence's of a
    packed batch."""
    p = call.problem
    if hasattr(p, "N_kv"):
        return p.N_kv
    return p.N_k if hasattr(p, "N_k") else max(p.seqlens_k)


def _total(rows, **labels) -> dict:
    """Ledger bytes (exact), DRAM bytes and time of rows, summed (None where a row has
    none), and the first reason."""
    t = sum_rows(rows)
    return dict(labels, calls=len(rows), ledger_bytes=t.hbm_bytes, dram_bytes=t.dram_bytes,
                predicted_ms=t.predicted_ms)


def _layer_row(layer, rows) -> dict:
    """One layer's calls of one section, summed."""
    first, last = rows[0], rows[-1]
    t = sum_rows(rows)
    out = _total(rows, layer=layer, problem=_problem_text(first.call),
                 kernel=" / ".join(dict.fromkeys(r.kernel for r in rows)),
                 tiling=None if first.call.tiling is None else list(first.call.tiling))
    out.update(ledger_read_bytes=sum(t.read_bytes.values()),
               ledger_write_bytes=sum(t.write_bytes.values()), reason=t.reason,
               warnings=list(dict.fromkeys(w for r in rows for w in r.warnings)),
               trust=list(dict.fromkeys(w for r in rows for w in r.trust)))
    if first.call.step == "decode":
        out["cache_rows"] = [_cache_rows(first.call), _cache_rows(last.call)]
    return out


def summarise(table: TrafficTable) -> dict:
    """{preset, sections: {key: {title, layers: [row per layer], total, [first_step,
    last_step, steps]}}, reasons: [distinct reasons]} (see the module docstring). Rows
    keep None where a model gives no number, with the reason beside it."""
    if not isinstance(table, TrafficTable):
        raise ValueError(f"table={type(table).__name__} is not allowed; allowed: an "
                         f"iosim.workload.TrafficTable (iosim.workload.traffic_table)")
    sections = {}
    for key, step, backward, title in SECTIONS:
        rows = table.select(step, backward)
        if not rows:
            continue
        by_layer: dict = {}
        for r in rows:
            by_layer.setdefault(r.call.layer, []).append(r)
        sec = {"title": title,
               "layers": [_layer_row(layer, rs) for layer, rs in sorted(by_layer.items())],
               "total": _total(rows)}
        if step == "decode":
            steps = max(len(rs) for rs in by_layer.values())
            sec["steps"] = steps
            for name, k in (("first_step", 0), ("last_step", steps - 1)):
                at = [rs[k] for rs in by_layer.values() if len(rs) > k]
                sec[name] = dict(_total(at), step=k + 1,
                                 cache_rows=sorted({_cache_rows(r.call) for r in at}))
        sections[key] = sec
    reasons = list(dict.fromkeys(r.reason for r in table.rows if r.reason))
    return {"preset": table.preset, "sections": sections, "reasons": reasons}


# ---------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------
def _num(x, scale, fmt, note) -> str:
    return f"-{note}" if x is None else format(x / scale, fmt)


def _layers_text(layers: list[int]) -> str:
    return str(layers[0]) if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"


def _collapse(rows: list[dict]) -> list[tuple[list[int], dict]]:
    """Runs of consecutive layers whose rows are the same but for the layer number."""
    out: list = []
    for r in rows:
        same = {k: v for k, v in r.items() if k != "layer"}
        if out and out[-1][1] == same and out[-1][0][-1] + 1 == r["layer"]:
            out[-1][0].append(r["layer"])
        else:
            out.append(([r["layer"]], same))
    return out


def _columns(rows: list[list[str]], spec: list[tuple[str, int]]) -> list[str]:
    """Rows of cells as aligned lines: spec = (align '<' or '>', least width) per column;
    a column grows to its longest cell + 2, so cells stay apart at any size."""
    widths = [max([least] + [len(r[i]) + 2 for r in rows]) for i, (_, least) in enumerate(spec)]
    return ["".join(f"{c:{a}{w}}" for c, (a, _), w in zip(r, spec, widths)).rstrip()
            for r in rows]


def format_summary(summary: dict, heading: str, *, every_layer: bool = False) -> str:
    """The summary as text: a per-layer table per section (consecutive layers with equal
    rows on one line unless every_layer), the totals, and the reasons as numbered notes."""
    notes = {reason: i + 1 for i, reason in enumerate(summary["reasons"])}
    lines = [heading, "ledger: exact bytes requested from HBM (read + written); DRAM, "
                      "time: model predictions (-[n]: note n says why not)"]
    spec = [(">", 7), ("<", 0), ("<", 24), ("<", 16), ("<", 11), (">", 18), (">", 11),
            (">", 10)]
    for key, sec in summary["sections"].items():
        decode = key == "decode"
        what = (f"sum over {sec['steps']} steps per layer" if decode else "per layer")
        lines += ["", f"{sec['title']}, {what}"]
        groups = ([([r["layer"]], r) for r in sec["layers"]] if every_layer
                  else _collapse(sec["layers"]))
        rows = [["layer", "", "cache rows" if decode else "problem", "kernel",
                 "" if decode else "B_r x B_c", "ledger bytes", "DRAM MB", "time ms"]]
        for layers, r in groups:
            note = f"[{notes[r['reason']]}]" if r["reason"] else ""
            rows.append([
                _layers_text(layers), "",
                f"{r['cache_rows'][0]:,}..{r['cache_rows'][1]:,}" if decode else r["problem"],
                r["kernel"],
                "" if r["tiling"] is None else f"{r['tiling'][0]}x{r['tiling'][1]}",
                f"{r['ledger_bytes']:,}", _num(r["dram_bytes"], MB, ".1f", note),
                _num(r["predicted_ms"], 1, ".3f", note)])
        lines += _columns(rows, spec)
    rows = [["totals (all layers; -: a layer has none)", "ledger GB", "DRAM GB", "time ms"]]
    for key, sec in summary["sections"].items():
        parts = [(sec["title"] + (f", {sec['steps']} steps" if key == "decode" else ""),
                  sec["total"])]
        if key == "decode":
            for name in ("first_step", "last_step"):
                s = sec[name]
                parts.append((f"  {name.replace('_', ' ')} ({s['step']}: cache "
                               f"{'/'.join(f'{n:,}' for n in s['cache_rows'])} rows)", s))
        rows += [[label, f"{t['ledger_bytes'] / GB:.3f}", _num(t["dram_bytes"], GB, ".3f", ""),
                  _num(t["predicted_ms"], 1, ".3f", "")] for label, t in parts]
    lines += [""] + _columns(rows, [("<", 44), (">", 12), (">", 11), (">", 10)])
    if notes:
        lines.append("")
        lines += [f"[{i}] {reason}" for reason, i in notes.items()]
    warnings = list(dict.fromkeys(w for sec in summary["sections"].values()
                                  for r in sec["layers"] for w in r["warnings"]))
    lines += [f"warning: {w}" for w in warnings]
    trust = list(dict.fromkeys(w for sec in summary["sections"].values()
                               for r in sec["layers"] for w in r.get("trust", ())))
    lines += [f"trust: {w}" for w in trust]
    return "\n".join(lines)


__all__ = ["SECTIONS", "format_summary", "summarise"]
