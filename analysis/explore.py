"""The explorer page (`flashsim explore`): one self-contained HTML file that plays a schedule
(forward, backward or a decoding step) as iosim executed it, tile by tile, with its
traffic, waves and the L2 / DRAM model beneath.

Data flows one way. Python runs the schedule (`iosim.execute(..., record=True)`, or
`execute_backward` / `execute_decode`: the counting memory's access trace, with the
schedules' own marks of kernel, thread block and tile), takes the ledger
(`iosim.closed_form` and its backward and decode counterparts), the L2 / DRAM prediction (`iosim.levels`),
the predicted time (`iosim.predict_time`) and a grid of closed forms for the what-if panel
(`iosim.closed_form_arrays`), and embeds them as JSON in a template (explore_page.html:
plain JavaScript and SVG). The page only draws and sums what it is given: its counters are
running sums of the trace's element counts, which end at the ledger by construction (and
`build_view` checks that they do before writing a page).

Units: elements in the trace and the counters (bytes = elements x the tensor's itemsize,
given per tensor), bytes for the DRAM model, milliseconds for times.
"""
from __future__ import annotations

import json
import os

import numpy as np

from iosim import (ConfigError, PRESETS, Problem, Tiling, closed_form, closed_form_arrays,
                   execute, get_hardware, sram_footprint_bytes, sram_to_elements)

#: the most recorded accesses (all instances together) one page draws access by access: a
#: 1024 x 64 problem with 64 x 64 tiles is about 2,400 (standard) and its page about 0.1 MB;
#: at the limit a page is about 6 MB
MAX_ACCESSES = 250_000
#: up to this many, the page is summarised per thread block (one step per CTA: its reads and
#: writes per tensor, the tiles it visited as a range), the counters still exact; beyond
#: it the command refuses (the recorded trace alone would take a few hundred MB here)
MAX_SUMMARISED = 1_500_000

#: the what-if grid: sequence lengths, head dims, block sizes and SRAM sizes (bytes)
WHATIF_N = (256, 512, 1024, 2048, 4096)
WHATIF_D = (32, 64, 128)
WHATIF_B = (32, 64, 128)
WHATIF_M = (49152, 98304, 101376, 166912, 232448)

TEMPLATE = os.path.join(os.path.dirname(__file__), "explore_page.html")


def estimate_accesses(algorithm: str, problem: Problem, tiling: Tiling, pass_: str = "fwd") -> int:
    """An upper bound on the accesses `execute` (or `execute_backward`) records for this
    problem (all instances)."""
    T_r, T_c = tiling.T_r(problem.N), tiling.T_c(problem.N_k)
    if pass_ == "bwd":
        per = 12 * T_r * T_c + 4 * (T_r + T_c) + 8
    else:
        per = {"standard": 6 * T_r * T_c + 2 * T_r, "fa1": 7 * T_r * T_c + 2 * T_c + 3,
               "fa2": 2 * T_r * T_c + 3 * T_r}[algorithm]
    return per * problem.instances


def check_size(algorithm: str, problem: Problem, tiling: Tiling, pass_: str = "fwd") -> bool:
    """Whether the page is summarised per thread block (over MAX_ACCESSES accesses);
    ConfigError (one line) over MAX_SUMMARISED."""
    n = estimate_accesses(algorithm, problem, tiling, pass_)
    if n > MAX_SUMMARISED:
        raise ConfigError(
            f"the {algorithm} {'backward ' if pass_ == 'bwd' else ''}schedule of N={problem.N}, N_k={problem.N_k}, "
            f"batch x heads={problem.instances} at B_r={tiling.B_r}, B_c={tiling.B_c} makes "
            f"about {n:,} accesses; the explorer page draws at most {MAX_ACCESSES:,} one by "
            f"one and {MAX_SUMMARISED:,} summarised per thread block (larger blocks, fewer "
            f"heads or a shorter sequence)")
    return n > MAX_ACCESSES


def per_cta(data: dict) -> dict:
    """The steps summarised per thread block: consecutive steps of one CTA become one step
    [kernel, cta, i, j, accesses, tiles], its accesses one per (op, tensor) spanning the
    rows and columns they touched, with the elements summed (so the counters still end at
    the ledger), and tiles = [i0, i1, j0, j1] the range of S tiles it visited (or None)."""
    out = []
    for k, cta, i, j, acc in data["steps"]:
        if not out or out[-1][0] != k or out[-1][1] != cta:
            out.append([k, cta, i, j, {}, None])
        step = out[-1]
        if i >= 0 and j >= 0:
            t = step[5]
            step[5] = [i, i, j, j] if t is None else [min(t[0], i), max(t[1], i),
                                                       min(t[2], j), max(t[3], j)]
        for op, tn, r0, r1, c0, c1, n in acc:
            a = step[4].get((op, tn))
            step[4][(op, tn)] = [op, tn, r0, r1, c0, c1, n] if a is None else [
                op, tn, min(a[2], r0), max(a[3], r1), min(a[4], c0), max(a[5], c1), a[6] + n]
    for step in out:
        step[4] = list(step[4].values())
        if step[5] is not None:         # the CTA's query (key) block, where it has one
            step[2] = step[5][0] if step[5][0] == step[5][1] else -1
            step[3] = step[5][2] if step[5][2] == step[5][3] else -1
    return dict(data, steps=out)


def trace_steps(trace: list) -> dict:
    """The recorded trace (`iosim.CountingMemory.trace`) as the page's steps: each mark
    starts a step [kernel, cta, i, j, accesses], an access [op (0 read, 1 write), tensor,
    r0, r1, c0, c1, elements]; CTAs numbered in order of first appearance per instance and
    kernel, i.e. launch order (the kernels' query-major grids: instance by instance); the
    steps of a pass with several kernels ordered kernel by kernel."""
    kernels, tensors, instances, ctas, steps = [], [], [], {}, []
    inst = -1
    for e in trace:
        if e[0] == "instance":
            instances.append(list(e[1:]))
            inst += 1
        elif e[0] == "mark":
            _, kernel, cta, tile = e
            if kernel not in kernels:
                kernels.append(kernel)
            k = kernels.index(kernel)
            key = (inst, k, cta if not isinstance(cta, tuple) else tuple(cta))
            if key not in ctas:
                ctas[key] = len(ctas)
            i, j = tile if tile is not None else (-1, -1)
            steps.append([k, ctas[key], int(i), int(j), []])
        else:
            op, name, span, n = e
            if name not in tensors:
                tensors.append(name)
            if not steps:
                raise ValueError("the trace has an access before its first mark")
            steps[-1][4].append([0 if op == "r" else 1, tensors.index(name), *map(int, span), int(n)])
    # kernel by kernel, as the GPU launches them (each kernel's CTAs over every instance
    # before the next kernel); iosim runs an instance's kernels in turn, then the next
    # instance: the same accesses, and within a kernel the same order (a stable sort)
    steps.sort(key=lambda s: s[0])
    cta_list = [None] * len(ctas)
    for (inst_, k, cta), n in ctas.items():
        cta_list[n] = [k, inst_, list(cta) if isinstance(cta, tuple) else [cta]]
    return {"kernels": kernels, "tensors": tensors, "instances": instances,
            "ctas": cta_list, "steps": steps}


def trace_counts(data: dict) -> dict:
    """{tensor: (read elements, write elements)} summed over the page's steps: what the
    page's counters show at the end."""
    out = {t: [0, 0] for t in data["tensors"]}
    for step in data["steps"]:
        for op, t, *_, n in step[4]:
            out[data["tensors"][t]][op] += n
    return {t: tuple(c) for t, c in out.items() if c[0] or c[1]}


def _waves(data: dict, tiling: Tiling, problem: Problem, hw, occupancy: list | None,
           heavy_first: bool = False, gpu_names: list | None = None) -> list:
    """Per kernel: slots (SMs x CTAs per SM) and each CTA's launch position, wave and slot.
    Launch order: the trace's (the kernels' grids, instance by instance), except that the
    causal fa2 tensor-core and fast forward kernels launch each instance's query blocks
    heaviest first (heavy_first; blockIdx.x reversed in gpu.forward.fa2_tc / fa2_fast, as
    iosim.memory and iosim.timing model them). A CTA of the softmax kernel stands for the
    B_r one-row CTAs the GPU launches (the schedule reads a query block's rows together),
    so it takes as many positions. Waves: launch position // slots, as if the CTAs took
    equal time."""
    out = []
    for k, name in enumerate(data["kernels"]):
        per_sm = occupancy[k] if occupancy else 1
        slots = hw.sm_count * per_sm
        pos, cta_pos = 0, {}
        mine = [n for n, c in enumerate(data["ctas"]) if c[0] == k]
        if heavy_first and name == "fa2_fwd":
            mine.sort(key=lambda n: (data["ctas"][n][1], -data["ctas"][n][2][0]))
        for n in mine:
            ident = data["ctas"][n][2]
            width = 1
            if name == "std_softmax":
                i = ident[0]
                width = min(problem.N, (i + 1) * tiling.B_r) - i * tiling.B_r
            cta_pos[n] = [pos, pos // slots, pos % slots, width]
            pos += width
        out.append({"name": name, "ctas_per_sm": per_sm, "slots": slots, "gpu_ctas": pos,
                    "gpu_name": gpu_names[k] if gpu_names else None,
                    "heavy_first": heavy_first and name == "fa2_fwd",
                    "waves": -(-pos // slots), "occupancy_known": bool(occupancy),
                    "cta": {str(n): v for n, v in cta_pos.items()}})
    return out


def _levels(algorithm: str, problem: Problem, tiling: Tiling, hw, pass_: str = "fwd"):
    """(result or None, why not): iosim.levels for these arguments, as `flashsim traffic
    --levels --block-rows --block-cols [--pass bwd]` gives it, with the predicted time."""
    import iosim
    try:
        lv = iosim.levels(algorithm, problem, hw, tiling=tiling, pass_=pass_)
    except ValueError as e:
        return None, str(e)
    try:
        t = iosim.predict_time(algorithm, problem, hw, pass_=pass_,
                               levels_result=lv)["predicted_ms"]
    except ValueError as e:
        t, lv["warnings"] = None, lv["warnings"] + [f"no predicted time: {e}"]
    return {"kernel": lv["kernel"], "dram_read_bytes": lv["dram_read_bytes"],
            "dram_write_bytes": lv["dram_write_bytes"],
            "l2_read_bytes": lv["l2_read_bytes"], "l2_write_bytes": lv["l2_write_bytes"],
            "requested_read_bytes": lv["requested_read_bytes"],
            "requested_write_bytes": lv["requested_write_bytes"],
            "kernels": [{"name": k["name"], "ctas": k["ctas"], "ctas_per_sm": k["ctas_per_sm"],
                         "dram_bytes": k["dram_read_bytes"] + k["dram_write_bytes"]}
                        for k in lv["kernels"]],
            "predicted_ms": t, "warnings": lv["warnings"]}, None


def build_view(algorithm: str, problem: Problem, tiling: Tiling, gpu: str = "H100-SXM",
               label: str | None = None, pass_: str = "fwd") -> dict:
    """One schedule's data for the page: the executed trace as steps, the active tiles,
    the ledger, the waves on `gpu` and the L2 / DRAM model's prediction (or why none).
    pass_: "fwd" (iosim.execute) or "bwd" (iosim.execute_backward: the backward's
    accesses only, its forward run uncounted)."""
    from iosim import backward_closed_form, execute_backward
    hw = get_hardware(gpu)
    if pass_ not in ("fwd", "bwd"):
        raise ConfigError(f"pass_={pass_!r} is not known; allowed: fwd, bwd")
    summarised = check_size(algorithm, problem, tiling, pass_)
    if pass_ == "bwd":
        ex = execute_backward(algorithm, problem, tiling, record=True, seed=0)
        ledger = backward_closed_form(algorithm, problem, tiling)
    else:
        ex = execute(algorithm, problem, tiling, record=True, seed=0)
        ledger = closed_form(algorithm, problem, tiling)
    data = trace_steps(ex.trace)
    ex.trace = None
    if summarised:
        data = per_cta(data)
    if trace_counts(data) != ledger.counts() or ex.ledger.counts() != ledger.counts():
        raise AssertionError(f"the trace of {algorithm} does not sum to its ledger")
    from iosim.schedules import active_tiles
    lv, why = _levels(algorithm, problem, tiling, hw, pass_)
    occ = names = None
    if lv and len(lv["kernels"]) == len(data["kernels"]):
        occ = [k["ctas_per_sm"] for k in lv["kernels"]]
        names = [k["name"] for k in lv["kernels"]]
        # the DRAM bytes each launch adds as its last step ends
        last = {}
        for n, s in enumerate(data["steps"]):
            last[s[0]] = n
        lv["kernel_done_step"] = [last[k] for k in range(len(data["kernels"]))]
    elif lv:
        why, lv = "the model's launches do not match the schedule's kernels", None
    p = problem
    shapes = {t: list(ex_shape) for t, ex_shape in _shapes(p).items() if t in data["tensors"]}
    view = {"label": label or f"{algorithm} {tiling.B_r}x{tiling.B_c}",
            "algorithm": algorithm, "pass": pass_, "gpu": hw.name, "sm_count": hw.sm_count,
            "problem": {"N": p.N, "N_k": p.N_k, "d": p.d, "batch": p.batch, "heads": p.heads,
                        "kv_heads": p.kv_heads, "dtype": p.dtype, "causal": p.causal,
                        "window": list(p.window),
                        "block_sparse": (None if p.block_mask is None else
                                         f"{float(np.mean(p.block_mask)):.2f}")},
            "tiling": {"B_r": tiling.B_r, "B_c": tiling.B_c, "T_r": tiling.T_r(p.N),
                       "T_c": tiling.T_c(p.N_k)},
            "active": active_tiles(p, tiling).astype(int).tolist(),
            "itemsize": {t: ledger.itemsize_of(t) for t in data["tensors"]},
            "shapes": shapes,
            "ledger": {t: list(c) for t, c in ledger.counts().items()},
            "ledger_bytes": ledger.hbm_bytes,
            "waves": _waves(data, tiling, p, hw, occ,
                            pass_ == "fwd" and _heavy_first(algorithm, p, tiling, hw),
                            names),
            "levels": lv, "levels_declined": why, "summarised": summarised, **data}
    return view


def _heavy_first(algorithm: str, problem: Problem, tiling: Tiling, hw) -> bool:
    """Whether the forward kernel gpu.attention runs here launches its query blocks
    heaviest first: the causal fa2 'tc' and 'fast' kernels (iosim.kernel_plan's choice)."""
    from iosim import kernel_plan
    if algorithm != "fa2" or not problem.causal:
        return False
    try:
        return kernel_plan("fa2", problem, hw, tiling=tiling).kernel in ("tc", "fast")
    except ValueError:
        return False


def _shapes(p: Problem) -> dict:
    """(rows, columns) of each tensor one instance holds in HBM."""
    return {"Q": (p.N, p.d), "K": (p.N_k, p.d), "V": (p.N_k, p.d), "O": (p.N, p.d),
            "S": (p.N, p.N_k), "P": (p.N, p.N_k), "Z": (p.N, p.N_k),
            "l": (p.N, 1), "m": (p.N, 1), "L": (p.N, 1), "D": (p.N, 1),
            "dO": (p.N, p.d), "dQ": (p.N, p.d), "dQacc": (p.N, p.d), "dK": (p.N_k, p.d),
            "dV": (p.N_k, p.d), "dP": (p.N, p.N_k), "dS": (p.N, p.N_k)}


def whatif_grid(algorithms: list, problem: Problem, pass_: str = "fwd") -> dict:
    """The what-if panel's numbers: for each algorithm and (N, d, B_r, B_c) of the grid, the
    ledger's elements per head (closed_form_arrays, the page's causal setting) and the
    on-chip footprint; per (N, d, M) the N^2 d^2 / M bound and the lower bound
    max(4 N d, N^2 d^2 / M) (analysis.theory; M in elements of the dtype); per preset and
    point the predicted time of the whole problem (batch x heads of the page) or why the
    time model declines it. pass_ "bwd": the backward's ledger and time."""
    from iosim import backward_closed_form_arrays, predict_time
    from analysis.theory import flash_bound, lower_bound
    Ns = sorted(set(WHATIF_N) | {problem.N})
    p = problem
    N, d, Br, Bc = np.meshgrid(Ns, WHATIF_D, WHATIF_B, WHATIF_B, indexing="ij")
    traffic, footprint = {}, {}
    for alg in algorithms:
        if pass_ == "bwd":
            cf = backward_closed_form_arrays(alg, N, d, Br, Bc, causal=p.causal,
                                             itemsize=p.itemsize)
        else:
            cf = closed_form_arrays(alg, N, d, Br, Bc, causal=p.causal, itemsize=p.itemsize,
                                    instances=1)
        tot = sum(cf["reads"].values()) + sum(cf["writes"].values())
        traffic[alg] = np.asarray(tot, dtype=np.float64).ravel().tolist()
        footprint[alg] = [[[sram_footprint_bytes(alg, br, bc, dd, p.dtype) for bc in WHATIF_B]
                           for br in WHATIF_B] for dd in WHATIF_D]
    Ms = [sram_to_elements(m, p.dtype) for m in WHATIF_M]
    nn, dd, mm = np.meshgrid(Ns, WHATIF_D, Ms, indexing="ij")
    reasons, times = [], {}
    for alg in algorithms:
        for gpu in PRESETS:
            row = []
            for n_ in Ns:
                for d_ in WHATIF_D:
                    for br in WHATIF_B:
                        for bc in WHATIF_B:
                            try:
                                q = Problem(N=n_, d=d_, batch=p.batch, heads=p.heads,
                                            kv_heads=p.kv_heads, dtype=p.dtype, causal=p.causal)
                                row.append(predict_time(alg, q, gpu, pass_=pass_,
                                                        tiling=Tiling(br, bc))["predicted_ms"])
                            except ValueError as e:
                                msg = " ".join(str(e).split())
                                if msg not in reasons:
                                    reasons.append(msg)
                                row.append(-1 - reasons.index(msg))
            times[f"{alg}|{gpu}"] = row
    return {"N": Ns, "d": list(WHATIF_D), "B": list(WHATIF_B), "M_bytes": list(WHATIF_M),
            "M_elements": Ms, "algorithms": list(algorithms), "presets": list(PRESETS),
            "traffic": traffic, "footprint": footprint,
            "bound": flash_bound(nn, dd, mm).ravel().tolist(),
            "lower_bound": lower_bound(nn, dd, mm).ravel().tolist(),
            "time_ms": times, "time_declined": reasons, "pass": pass_,
            "start": {"N": p.N, "d": p.d}}


def page(views: list, whatif: dict | None, title: str) -> str:
    """The HTML page: the template with the data embedded as JSON (no network, no server)."""
    with open(TEMPLATE, encoding="utf-8") as f:
        html = f.read()
    data = json.dumps({"title": title, "views": views, "whatif": whatif},
                      separators=(",", ":"), default=float)
    # "</" inside a script element would end it
    data = data.replace("</", "<\\/")
    return html.replace("__TITLE__", title).replace("__DATA__", data)


# ---------------------------------------------------------------------------------------
# Decoding: N_q new rows of each query head against a cache of N_kv rows
# ---------------------------------------------------------------------------------------
def _piece_rows(chunk: int) -> int:
    """Cache rows a decode block loads at a time on the page: the largest divisor of the
    split's chunk up to 128 (so that the pieces of every split line up in one grid), or
    the whole chunk where that divisor is under 16 (numerics only: no count depends on
    it, iosim.execute_decode's block_kv)."""
    best = max(x for x in range(1, min(chunk, 128) + 1) if chunk % x == 0)
    return best if best >= 16 or best == chunk else chunk


def build_decode_view(problem, num_splits: int = 1, kv_reads: str = "per_query_head",
                      gpu: str = "H100-SXM", label: str | None = None) -> dict:
    """A decoding step's data for the page (iosim.execute_decode, contiguous cache): the
    grid's rows are the query heads (N_q rows each), its columns the cache of each K/V
    head in pieces, a query head's tiles those of its group's K/V head; a step is one
    piece a block reads, its chunk's start or its partial results' writes, then the
    combine blocks (split-KV). No L2 / DRAM model covers decoding; the page shows the
    decode time model's prediction (iosim.predict_decode) instead."""
    from iosim import decode_closed_form, execute_decode, predict_decode, split_bounds
    from iosim.decode import split_rows
    p, hw = problem, get_hardware(gpu)
    if p.paged:
        raise ConfigError("--page-size: the explorer page draws contiguous caches only "
                          "(a paged cache's rows are scattered over pages)")
    S = num_splits
    schedule = "split_kv" if S > 1 else "fa2_decode"
    C = split_rows(p.N_kv, S)
    bk = _piece_rows(C)
    T_kv = -(-p.N_kv // bk)
    n_acc = p.batch * p.heads * (2 * S * (T_kv // max(1, S) + 2) + 4)
    if n_acc > MAX_ACCESSES:
        raise ConfigError(f"the decode schedule of N_kv={p.N_kv}, batch x heads="
                          f"{p.batch * p.heads} makes about {n_acc:,} accesses; the explorer "
                          f"page draws at most {MAX_ACCESSES:,} (fewer heads or a shorter cache)")
    ex = execute_decode(schedule, p, num_splits=S, kv_reads=kv_reads, block_kv=bk, record=True)
    ledger = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads)
    H, Nq, d, G = p.heads, p.N_q, p.d, p.group
    KV = T_kv * bk                                    # a K/V head's cache, padded to pieces

    def rows(name, sp):
        """The flat span of a decode tensor as (r0, r1, c0, c1) of its page layout."""
        ax = [sp[i:i + 2] for i in range(0, len(sp), 2)]
        if name in ("K", "V"):                        # (batch, kv_heads, N_kv, d)
            g, c = ax[1][0], ax[2]
            return g * KV + c[0], g * KV + c[1], 0, d
        if name in ("Q", "O", "L"):                   # (batch, heads, N_q[, d])
            h = ax[1]
            return h[0] * Nq, h[1] * Nq, 0, (d if name != "L" else 1)
        h, s = ax[1], ax[2]                           # Opart, Lpart (batch, heads, S, N_q[, d])
        return ((h[0] * S + s[0]) * Nq, (h[1] - 1) * S * Nq + s[1] * Nq, 0,
                d if name == "Opart" else 1)
    trace = []
    for e in ex.trace:
        if e[0] in ("r", "w"):
            e = (e[0], e[1], rows(e[1], e[2]), e[3])
        elif e[0] == "mark" and e[1] in ("fa2_decode", "split_kv"):
            h0, c0 = e[3]
            j = -1 if c0 < 0 else (h0 // G) * T_kv + c0 // bk
            e = ("mark", e[1], e[2], (h0, j))
        trace.append(e)
    data = trace_steps(trace)
    if trace_counts(data) != ledger.counts() or ex.ledger.counts() != ledger.counts():
        raise AssertionError("the decode trace does not sum to its ledger")
    active = [[int(h // G == j // T_kv) for j in range(p.kv_heads * T_kv)] for h in range(H)]
    try:
        t = predict_decode(p, hw.name, num_splits=S, kv_reads=kv_reads)
        why = (f"the L2 / DRAM model (iosim.levels) covers the forward and backward passes, "
               f"not decoding; the decode time model (iosim.predict_decode) predicts "
               f"{t['predicted_ms']:.4f} ms for this step on {hw.name}")
    except (ValueError, KeyError, TypeError) as e:
        why = ("the L2 / DRAM model (iosim.levels) covers the forward and backward passes, "
               f"not decoding; the decode time model declines this step: {e}")
    shapes = {"Q": [H * Nq, d], "O": [H * Nq, d], "L": [H * Nq, 1],
              "K": [p.kv_heads * KV, d], "V": [p.kv_heads * KV, d],
              "Opart": [H * S * Nq, d], "Lpart": [H * S * Nq, 1]}
    chunks = split_bounds(p.N_kv, S)
    return {"label": label or f"{schedule} ({S} split{'s' if S > 1 else ''})",
            "algorithm": schedule, "pass": "decode", "gpu": hw.name, "sm_count": hw.sm_count,
            "desc": (f"decoding: N_q={Nq} new rows of each of {H} query heads against a cache "
                     f"of N_kv={p.N_kv} rows of {p.kv_heads} K/V heads (grid rows: query "
                     f"heads; columns: each K/V head's cache in pieces of {bk} rows; a query "
                     f"head's tiles are its group's), d={d}, {p.dtype}, batch={p.batch}, "
                     f"{S} split(s) of {C} rows {[list(c) for c in chunks][:4]}"
                     f"{'...' if S > 4 else ''}, kv_reads={kv_reads}"),
            "problem": {"N": H * Nq, "N_k": p.kv_heads * KV, "d": d, "batch": p.batch,
                        "heads": H, "kv_heads": p.kv_heads, "dtype": p.dtype, "causal": False,
                        "window": [-1, -1]},
            "tiling": {"B_r": Nq, "B_c": bk, "T_r": H, "T_c": p.kv_heads * T_kv},
            "active": active,
            "itemsize": {t: ledger.itemsize_of(t) for t in data["tensors"]},
            "shapes": {t: sh for t, sh in shapes.items() if t in data["tensors"]},
            "ledger": {t: list(c) for t, c in ledger.counts().items()},
            "ledger_bytes": ledger.hbm_bytes,
            "waves": _waves(data, Tiling(Nq, bk), Problem(N=H * Nq, d=d), hw, None),
            "levels": None, "levels_declined": why, "summarised": False, **data}
