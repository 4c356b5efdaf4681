"""Measure flashsim's kernels on a CUDA GPU: hardware counters and kernel-only times.

Two measurements over a configuration set of `analysis.validation_configs` (each
configuration is one kernel pass: a forward `gpu.attention` call or a backward
`gpu.backward.attention_backward` call, with a fixed kernel and tiling):

* counters: the pass runs once per configuration under Nsight Compute (`ncu`, found on
  PATH or given with --ncu), which flushes the L2 before each profiled kernel (its default
  cache control), so the figures are cold-L2. Per configuration, summed over the pass's
  kernels: DRAM bytes read / written (`dram__bytes_read.sum`, `dram__bytes_write.sum`),
  32-byte sectors the SMs read from / wrote to L2 (`lts__t_sectors_srcunit_tex_op_read.sum`
  / `_write.sum`; atomics and reductions separately), global and local-memory bytes at
  L1, kernel time, and the launch's registers and occupancy limits.
* times: the pass's kernels alone, timed by CUPTI (torch.profiler) on preallocated
  inputs rotated over several copies (so the L2 does not keep them warm between
  repetitions), warm-up first, median over repetitions. Host work is not included.

Rows are written one per configuration as each is made (JSON lines), with device,
driver, versions, date and the commit; a rerun skips configurations already in the file.
Needs a CUDA GPU and PyTorch (its tensors hold the inputs and its profiler reads CUPTI).

    python3 -m analysis.hwmeasure counters --set levels --out rows.jsonl
    python3 -m analysis.hwmeasure times --set runtime --out rows.jsonl
"""
from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

#: Kernels of ours that a pass launches (ncu's -k filter and the profiler's): every
#: forward / backward kernel, not the NaN-poison fills; plus the markers between passes.
OUR_KERNELS = r"(fa2_tc|fa2_fast|fa2_fwd|fa1_fwd|fa1_tc|fa1_fast|std_S|std_softmax|std_PV|std_tc|std_fast|fa2_bwd|fa1_bwd|std_bwd|bwd_convert|bwd_group_sum|fa2_varlen|decode_|flashsim_marker)"
#: Every kernel of the gpu package carries this namespace in CUPTI's (demangled) names; a
#: timed pass takes all of them and refuses a name OUR_KERNELS misses (Nsight Compute's
#: `-k regex:` sees only base names, so OUR_KERNELS must list every kernel's prefix: a
#: kernel missing from it was once left out of a pass's time without a word).
GPU_NAMESPACE = "gpu::"
#: the namespace CUPTI shows for a Numba kernel whose function has no module ("<dynamic>",
#: e.g. one made by exec): taken as ours too (and checked against OUR_KERNELS), so that
#: such a kernel is never left out of a pass's time
NUMBA_NO_MODULE = ("_3cdynamic_3e::", "<dynamic>::")
MARKER = "flashsim_marker"

COUNTER_METRICS = (
    "dram__bytes_read.sum", "dram__bytes_write.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
    "lts__t_sectors_srcunit_tex_op_atom.sum", "lts__t_sectors_srcunit_tex_op_red.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "gpu__time_duration.sum", "launch__registers_per_thread", "launch__block_size",
    "launch__grid_size", "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks",
    # per kernel, how close each unit ran to its peak (what binds; the time model's terms)
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)
#: Metrics summed over the kernels of a pass (the rest are per-kernel launch facts).
SUMMED = COUNTER_METRICS[:11]

_UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
          "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


# ---------------------------------------------------------------------------------------
# Environment facts (every row carries them)
# ---------------------------------------------------------------------------------------
def environment() -> dict:
    """Device, driver, versions, date (UTC) and commit of this run."""
    import numba
    import numpy
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": os.environ.get("FLASHSIM_COMMIT") or _git_commit()}
    versions = {"python": sys.version.split()[0], "numpy": numpy.__version__,
                "numba": numba.__version__}
    try:
        from importlib.metadata import version
        versions["numba-cuda"] = version("numba-cuda")
    except Exception:
        pass
    try:
        import torch
        versions["torch"] = torch.__version__
        out["device"] = torch.cuda.get_device_name(0)
    except Exception:
        out["device"] = None
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,uuid",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        name, drv, uuid = [x.strip() for x in q.stdout.splitlines()[0].split(",")]
        out["device"] = out.get("device") or name
        out["driver"] = drv
        # which physical chip answered: near the L2's capacity two H100s of one SKU gave
        # DRAM counts up to 3x apart for one pass, each reproducible to 1 % (docs/measurements.md)
        out["device_uuid"] = uuid
    except Exception:
        out["driver"] = None
    out["versions"] = versions
    return out


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


# ---------------------------------------------------------------------------------------
# One pass of a configuration
# ---------------------------------------------------------------------------------------
def _kernel_kwargs(c: dict) -> dict:
    """Keywords that pin the configuration's kernel: the fa2 forward's named one; for
    every other pass 'default' means the plain kernels (what ran when the configurations
    were measured; analysis.fit_levels.config_kernel)."""
    if c["algorithm"] != "fa2" or c["pass"] != "fwd":
        return {"kernel": "plain" if c["kernel"] == "default" else c["kernel"]}
    return {"tc": {"tensor_cores": True}, "fast": {"fast": True},
            "plain": {"fast": False, "tensor_cores": False}, "default": {}}[c["kernel"]]


def _tiles(c: dict) -> dict:
    return ({} if c.get("block_rows") is None else
            {"block_rows": c["block_rows"], "block_cols": c["block_cols"]})


def _band(c: dict) -> dict:
    """The band keywords of a configuration that names them (optional keys `window`, a
    [left, right] pair as gpu.attention's; none in the validation sets)."""
    return {"window": tuple(c["window"])} if c.get("window") is not None else {}


def make_inputs(c: dict, seed: int = 0):
    """Device inputs of one pass (torch tensors): forward {q, k, v}; backward also o, do
    and the forward's stats (computed here, outside any measured region). K and V have
    c["N_k"] rows where the configuration names N_k (N otherwise)."""
    import torch
    import gpu
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(c["dtype"], torch.float32)
    g = torch.Generator(device="cuda").manual_seed(seed)
    B, H, G, N, d = c["batch"], c["heads"], c["kv_heads"], c["N"], c["d"]
    N_k = c.get("N_k") or N
    q = torch.randn(B, H, N, d, device="cuda", dtype=dt, generator=g)
    k = torch.randn(B, G, N_k, d, device="cuda", dtype=dt, generator=g)
    v = torch.randn(B, G, N_k, d, device="cuda", dtype=dt, generator=g)
    x = {"q": q, "k": k, "v": v}
    if c["pass"] == "bwd":
        x["do"] = torch.randn(B, H, N, d, device="cuda", dtype=dt, generator=g)
        if c["algorithm"] == "fa2":
            o, L = gpu.attention(q, k, v, algorithm="fa2", causal=c["causal"],
                                 return_stats=True, **_band(c))
            x["o"], x["stats"] = o, L
        else:
            from gpu.backward import default_backward_tiling
            from gpu.backward.standard import standard_forward
            kern = _kernel_kwargs(c)["kernel"]
            t = (default_backward_tiling(d, c["dtype"], "standard", kernel=kern)
                 if c["block_rows"] is None else None)
            br, bc = (t.B_r, t.B_c) if t else (c["block_rows"], c["block_cols"])
            o, P = standard_forward(q, k, v, causal=c["causal"], block_rows=br, block_cols=bc,
                                    kernel=kern)
            x["o"], x["stats"] = o, P
    return x


def run_pass(c: dict, x: dict):
    """Launch the configuration's kernels once on inputs x (no synchronisation)."""
    import gpu
    if c["pass"] == "fwd":
        return gpu.attention(x["q"], x["k"], x["v"], algorithm=c["algorithm"],
                             causal=c["causal"], **_tiles(c), **_kernel_kwargs(c), **_band(c))
    from gpu.backward import attention_backward
    return attention_backward(x["q"], x["k"], x["v"], x["o"], x["do"], x["stats"],
                              algorithm=c["algorithm"], causal=c["causal"], **_tiles(c),
                              **_kernel_kwargs(c), **_band(c))


def resolved_tiling(c: dict) -> tuple[int, int]:
    """(B_r, B_c) the pass runs: the configuration's, else the default on this device."""
    if c.get("block_rows") is not None:
        return c["block_rows"], c["block_cols"]
    if c["pass"] == "bwd":
        from gpu.backward import default_backward_tiling
        t = default_backward_tiling(c["d"], c["dtype"], c["algorithm"], causal=c["causal"],
                                    kernel=_kernel_kwargs(c)["kernel"])
    else:
        from gpu.api import default_tiling
        t = default_tiling(c["algorithm"], c["d"], c["dtype"], c["causal"],
                           _kernel_kwargs(c).get("kernel", "auto"))
    return t.B_r, t.B_c


_marker = None


def marker():
    """Launch the tiny marker kernel that separates passes in ncu's and CUPTI's lists."""
    global _marker
    from numba import cuda
    if _marker is None:
        @cuda.jit
        def flashsim_marker(x):
            if cuda.grid(1) == 0:
                x[0] += 1
        _marker = (flashsim_marker, cuda.device_array(1, dtype="int32"))
    k, buf = _marker
    k[1, 32](buf)


# ---------------------------------------------------------------------------------------
# Counters (Nsight Compute)
# ---------------------------------------------------------------------------------------
def child_counters(configs, manifest: str) -> None:
    """Under ncu: marker, pass, marker per configuration; the manifest lists them in order
    (ok or the error), so the parent can cut ncu's kernel list into passes."""
    import torch
    with open(manifest, "w") as f:
        for c in configs:
            rec = {"id": c["id"]}
            try:
                x = make_inputs(c)
                rec["tiling"] = list(resolved_tiling(c))
                torch.cuda.synchronize()
                marker()
                run_pass(c, x)
                marker()
                torch.cuda.synchronize()
                rec["ok"] = True
                del x
            except Exception as e:  # record and go on: one bad point must not end the run
                rec["ok"] = False
                rec["error"] = f"{type(e).__name__}: {e}"[:500]
                marker()
                marker()
            torch.cuda.empty_cache()
            f.write(json.dumps(rec) + "\n")
            f.flush()


def parse_ncu_csv(text: str) -> list[dict]:
    """[{id, kernel, metrics: {name: value}}] in launch order from `ncu --csv
    --print-units base` output (one row per kernel and metric)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(ln for ln in lines[start:] if ln.startswith('"'))))
    kernels: dict = {}
    for r in reader:
        if r.get("ID") == "ID":
            continue
        key = int(r["ID"])
        rec = kernels.setdefault(key, {"id": key, "kernel": r["Kernel Name"], "metrics": {}})
        s = r["Metric Value"].replace(",", "").strip()
        try:
            val = float(s) * _UNITS.get(r["Metric Unit"].strip().lower(), 1)
        except ValueError:
            continue
        rec["metrics"][r["Metric Name"]] = val
    return [kernels[k] for k in sorted(kernels)]


def split_passes(kernels: list[dict]) -> list[list[dict]]:
    """Kernels between consecutive marker pairs: one list per configuration."""
    passes, cur, inside = [], None, False
    for k in kernels:
        if MARKER in k["kernel"]:
            if not inside:
                cur, inside = [], True
            else:
                passes.append(cur)
                inside = False
        elif inside:
            cur.append(k)
    return passes


def counters_row(c: dict, kernels: list[dict]) -> dict:
    """One result row: the pass's summed counters and each kernel's launch facts."""
    tot = {m: sum(k["metrics"].get(m, 0.0) for k in kernels) for m in SUMMED}
    row = {"dram_read_bytes": tot["dram__bytes_read.sum"],
           "dram_write_bytes": tot["dram__bytes_write.sum"],
           "l2_read_bytes": 32 * tot["lts__t_sectors_srcunit_tex_op_read.sum"],
           "l2_write_bytes": 32 * tot["lts__t_sectors_srcunit_tex_op_write.sum"],
           "l2_atom_bytes": 32 * tot["lts__t_sectors_srcunit_tex_op_atom.sum"],
           "l2_red_bytes": 32 * tot["lts__t_sectors_srcunit_tex_op_red.sum"],
           "l1_global_ld_bytes": tot["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"],
           "l1_global_st_bytes": tot["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"],
           "local_ld_bytes": tot["l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"],
           "local_st_bytes": tot["l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"],
           "ncu_time_ms": tot["gpu__time_duration.sum"] / 1e6,
           "kernels": [{"name": k["kernel"], **{m.split("__", 1)[1]: k["metrics"].get(m)
                                               for m in COUNTER_METRICS}}
                       for k in kernels]}
    return row


def ncu_passes(chunk, ncu: str, metrics, timeout: float) -> list[tuple]:
    """Run `chunk` (configurations) in one child process under ncu with `metrics`:
    [(configuration, its manifest record, its pass's kernels [{id, kernel, metrics}] or
    None where the pass failed or ncu saw none of it)], one per configuration the child
    reached, in order (`metrics`: any Nsight Compute metrics, not only the counters)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path, man = os.path.join(tmp, "configs.json"), os.path.join(tmp, "manifest.jsonl")
        with open(cfg_path, "w") as f:
            json.dump(chunk, f)
        cmd = [ncu, "--csv", "--print-units", "base", "--clock-control", "none",
               "-k", f"regex:{OUR_KERNELS}", "--metrics", ",".join(metrics),
               sys.executable, "-m", "analysis.hwmeasure", "child-counters",
               "--configs", cfg_path, "--manifest", man]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            text = proc.stdout
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            print(f"hwmeasure: ncu chunk timed out after {timeout:.0f} s", file=sys.stderr)
        passes = split_passes(parse_ncu_csv(text))
        recs = [json.loads(ln) for ln in open(man)] if os.path.exists(man) else []
    if not recs:
        print((text or "")[-3000:], file=sys.stderr)
    return [(next(x for x in chunk if x["id"] == rec["id"]), rec,
             passes[i] if rec["ok"] and i < len(passes) and passes[i] else None)
            for i, rec in enumerate(recs)]


def _counter_rows(chunk, ncu: str, env: dict, timeout: float) -> list[dict]:
    """Run `chunk` (configurations) in one child process under ncu; one row each (a
    configuration ncu did not reach gets no row)."""
    rows = []
    for c, rec, kernels in ncu_passes(chunk, ncu, COUNTER_METRICS, timeout):
        row = {"kind": "levels_measurement", **env, "config": c,
               "tiling": rec.get("tiling"), "status": "ok" if kernels else "error"}
        if kernels:
            row["measured"] = counters_row(c, kernels)
        else:
            row["error"] = rec.get("error") or "no ncu rows for this pass"
        rows.append(row)
    return rows


def counter_row(c: dict, ncu: str | None = None, timeout: float = 600) -> dict:
    """One configuration under ncu, wherever this runs (an executor's worker: the GPU it
    was given), with where it was made (`where`) and how long it took (`eval_seconds`)."""
    from analysis.sweeps import provenance
    t0 = time.perf_counter()
    ncu = ncu or shutil.which("ncu")
    if not ncu:
        raise RuntimeError("hwmeasure: ncu (Nsight Compute) is not on PATH here")
    rows = _counter_rows([c], ncu, environment(), timeout)
    row = rows[0] if rows else {"kind": "levels_measurement", **environment(), "config": c,
                                "status": "error", "error": "ncu made no row"}
    row["where"] = provenance("kernel")
    row["eval_seconds"] = time.perf_counter() - t0
    return row


def _lost_row(kind):
    def lost(c, message):
        return {"kind": kind, "config": c, "status": "error", "error": message[:500]}
    return lost


def _by_id(c):
    return c["id"]


def _row_id(r):
    return r["config"]["id"]


def _run_executor(executor, work, todo, kind, out, budget_s, t0, what) -> int:
    """Stream `work`'s rows for `todo` from `executor` into `out` (this process alone
    writes it) until `budget_s` is spent; returns the rows written."""
    written = 0
    rows = executor.map(work, todo, backend="kernel", lost=_lost_row(kind), key=_by_id,
                        row_key=_row_id, group=lambda c: None)
    seen = set()
    try:
        for row in rows:
            if row["config"]["id"] in seen:     # a retried task's repeat: keep the first
                continue
            seen.add(row["config"]["id"])
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            written += 1
            m = row.get("measured", {})
            print(f"{row['config']['id']}: {m.get('measured_ms', m.get('dram_read_bytes')) if m else row.get('error')}",
                  flush=True)
            if time.time() - t0 > budget_s:
                print(f"hwmeasure {what}: budget reached (rerun to resume)", flush=True)
                break
    finally:
        rows.close()
    return written


def measure_counters(configs, out: str, ncu: str | None = None, budget_s: float = 540,
                     executor=None) -> int:
    """Run the configurations not yet in `out` under ncu and append one row per
    configuration. Locally (executor None or local): in chunks of 12, each one child
    process, within the time budget. With a ray executor: one ncu child per
    configuration, as Ray tasks asking for one GPU each (rows stream back here)."""
    done = _done_ids(out)
    todo = [c for c in configs if c["id"] not in done]
    t0 = time.time()
    if executor is not None and executor.name != "local":
        import functools
        with executor:
            n = _run_executor(executor, functools.partial(counter_row, ncu=ncu), todo,
                              "levels_measurement", out, budget_s, t0, "counters")
            print(executor.stats_line(), flush=True)
        return n
    ncu = ncu or shutil.which("ncu")
    if not ncu:
        raise SystemExit("hwmeasure: ncu (Nsight Compute) is not on PATH; give --ncu PATH")
    env = environment()
    written = 0
    while todo and time.time() - t0 < budget_s:
        chunk, todo = todo[:12], todo[12:]
        rows = _counter_rows(chunk, ncu, env, max(30.0, budget_s - (time.time() - t0)))
        with open(out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        written += len(rows)
        print(f"hwmeasure counters: {written} rows, {time.time() - t0:.0f} s", flush=True)
    if todo:
        print(f"hwmeasure counters: budget reached, {len(todo)} configurations left "
              f"(rerun to resume)", flush=True)
    return written


# ---------------------------------------------------------------------------------------
# Times (CUPTI through torch.profiler)
# ---------------------------------------------------------------------------------------
def _input_bytes(c):
    s = 2 if c["dtype"] in ("fp16", "bf16") else 4
    rows_q, rows_k = c["batch"] * c["N"] * c["d"] * s, c["batch"] * (c.get("N_k") or c["N"]) * c["d"] * s
    n_q = 2 * c["heads"] + (2 * c["heads"] if c["pass"] == "bwd" else 0)
    return rows_q * n_q + rows_k * 2 * c["kv_heads"]


def passes_from_trace(trace: dict) -> list[list[tuple[str, float]]]:
    """[(kernel name, ms)] per pass from a torch.profiler chrome trace: the gpu package's
    kernels between consecutive marker kernels. Raises where a pass is empty or a kernel
    of the package is missing from OUR_KERNELS."""
    ev = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"
                 and (e.get("name", "").startswith((GPU_NAMESPACE,) + NUMBA_NO_MODULE)
                      or MARKER in e.get("name", ""))), key=lambda e: e["ts"])
    missed = sorted({e["name"] for e in ev if not re.search(OUR_KERNELS, e["name"])})
    if missed:
        raise RuntimeError(f"kernels {missed} are not in hwmeasure.OUR_KERNELS: add their "
                           f"prefix (Nsight Compute would not profile them)")
    passes, cur = [], None
    for e in ev:
        if MARKER in e["name"]:
            if cur is not None:
                passes.append(cur)
            cur = []
        elif cur is not None:
            cur.append((e["name"], e["dur"] / 1e3))
    if not passes or not all(passes):
        raise RuntimeError(f"profiler saw {len(ev)} kernels, {len(passes)} passes")
    return passes


def time_config(c: dict, reps: int = 15, rotate_bytes: float = 200e6, min_reps: int = 5) -> dict:
    """Median device time of the pass's kernels (sum per pass), and per kernel: up to
    `reps` repetitions (fewer for slow passes, about 0.4 s in all), at least `min_reps`."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    n_sets = int(max(1, min(8, rotate_bytes // max(1, _input_bytes(c)))))
    sets = [make_inputs(c, seed=s) for s in range(n_sets)]
    for x in sets[:2]:                       # compile and warm up
        run_pass(c, x)
    torch.cuda.synchronize()
    # aim at about 0.4 s of measured kernels: a first timing decides how many repetitions
    t = time.perf_counter()
    run_pass(c, sets[0])
    torch.cuda.synchronize()
    one = time.perf_counter() - t
    reps = int(max(min_reps, min(reps, 0.4 / max(one, 1e-6))))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for r in range(reps):
            marker()
            run_pass(c, sets[r % n_sets])
        marker()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    passes = passes_from_trace(trace)
    import numpy as np
    tot = np.array([sum(dur for _, dur in p) for p in passes])
    names = [n for n, _ in passes[0]]
    per = [float(np.median([p[i][1] for p in passes if len(p) == len(names)]))
           for i in range(len(names))]
    return {"measured_ms": float(np.median(tot)), "ms_min": float(tot.min()),
            "ms_max": float(tot.max()), "reps": len(passes), "input_sets": n_sets,
            "kernels": [{"name": n, "ms": m} for n, m in zip(names, per)]}


def time_row(c: dict) -> dict:
    """One configuration's kernels timed alone, wherever this runs (an executor's worker:
    the GPU it was given), with `where` and `eval_seconds`."""
    import torch
    from analysis.sweeps import provenance
    t0 = time.perf_counter()
    row = {"kind": "runtime_measurement", **environment(), "config": c}
    try:
        row["tiling"] = list(resolved_tiling(c))
        row["measured"] = time_config(c)
        row["status"] = "ok"
    except Exception as e:
        row["status"] = "error"
        row["error"] = f"{type(e).__name__}: {e}"[:500]
    torch.cuda.empty_cache()
    row["where"] = provenance("kernel")
    row["eval_seconds"] = time.perf_counter() - t0
    return row


def measure_times(configs, out: str, budget_s: float = 540, executor=None) -> int:
    """Time the configurations not yet in `out` (ok rows), one row each, appended as made
    until `budget_s` is spent. executor: None or local (this process, one after
    another), or a ray executor (Ray tasks asking for one GPU each; rows stream back)."""
    from analysis.executor import LocalExecutor
    done = _done_ids(out)
    todo = [c for c in configs if c["id"] not in done]
    t0 = time.time()
    executor = executor or LocalExecutor()

    def in_budget():                      # the local executor takes points lazily
        for c in todo:
            if time.time() - t0 > budget_s:
                return
            yield c
    with executor:
        n = _run_executor(executor, time_row, in_budget() if executor.name == "local" else todo,
                          "runtime_measurement", out, budget_s, t0, "times")
        if executor.name != "local":
            print(executor.stats_line(), flush=True)
    return n


def _done_ids(path):
    ids = set()
    if os.path.exists(path):
        with open(path) as f:
            for ln in f:
                try:
                    r = json.loads(ln)
                except ValueError:
                    continue
                if r.get("status") == "ok":
                    ids.add(r["config"]["id"])
    return ids



def ingest(path: str, kind: str, run_id: str, data=None) -> tuple[int, int]:
    """Add a measurement file's rows to the results data set (analysis.results) under
    `kind` ("levels_measurement" or "runtime_measurement") and `run_id`; rows already
    stored are skipped. Returns (added, skipped)."""
    from analysis import results
    rows = []
    with open(path) as f:
        for ln in f:
            r = json.loads(ln)
            r.pop("kind", None)
            rows.append(results.make_row(kind, run_id=run_id, device=r.pop("device"),
                                         date=r.pop("date"), commit=r.pop("commit"),
                                         versions=dict(r.pop("versions"), driver=r.pop("driver", None)),
                                         **r))
    return results.append(rows, data)


def main(argv=None) -> int:
    from .validation_configs import SETS
    ap = argparse.ArgumentParser(prog="python3 -m analysis.hwmeasure", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["counters", "times", "child-counters"])
    ap.add_argument("--set", choices=sorted(SETS), default="levels")
    ap.add_argument("--only", default=None, help="regex on configuration ids")
    ap.add_argument("--out", default="rows.jsonl")
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--executor", default="local", metavar="local|ray",
                    help="where configurations run: local (this process, the default) or ray "
                         "(Ray tasks, one GPU each; needs the extra: pip install -e '.[ray]')")
    ap.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                    help="with --executor ray: the Ray cluster (default: start one here)")
    ap.add_argument("--points-per-task", type=int, default=None, metavar="K",
                    help="with --executor ray: configurations per Ray task (default: 1)")
    ap.add_argument("--configs", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--manifest", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.what == "child-counters":
        with open(a.configs) as f:
            child_counters(json.load(f), a.manifest)
        return 0
    from analysis.executor import make_executor
    from iosim import ConfigError
    try:
        if a.points_per_task is not None and a.executor != "ray":
            raise ConfigError(f"--points-per-task={a.points_per_task} is given with --executor "
                              f"{a.executor}; it is for --executor ray")
        if a.points_per_task is not None and a.points_per_task < 1:
            raise ConfigError(f"--points-per-task={a.points_per_task} must be >= 1")
        kw = {"points_per_task": a.points_per_task or 1} if a.executor == "ray" else {}
        executor = make_executor(a.executor, a.address, **kw)
    except ConfigError as e:
        print(f"hwmeasure: error: {e}", file=sys.stderr)
        return 2
    configs = SETS[a.set]
    if a.only:
        configs = [c for c in configs if re.search(a.only, c["id"])]
    if a.what == "counters":
        measure_counters(configs, a.out, a.ncu, a.budget_s, executor)
    else:
        measure_times(configs, a.out, a.budget_s, executor)
    return 0


if __name__ == "__main__":
    sys.exit(main())

