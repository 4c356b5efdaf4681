"""The kernels against the model and against float64: what `flashsim check` runs.

Three suites, each a list of configurations (`plan`), each configuration one row with
`ok` and the `failures` that made it not ok:

forward   every forward kernel (standard, fa1, fa2 with their default kernels and the
          plain ones: fp32 standard's and fa1's defaults are gpu.forward.standard_fast and
          fa1_fast; fp32 and fp16;
          causal; >48 KB tilings through the opt-in; grouped K/V; a block mask with an
          empty query block):
          * counts: the instrumented build's ledger equals iosim.closed_form exactly
            (every tensor, reads and writes, in elements);
          * O has no NaN (outputs are poisoned with NaN before each launch: the
            check runs gpu.attention in its poison mode) and the
            counting and plain builds give bit-identical O;
          * accuracy: rel err = ||O - ref||_F / ||ref||_F against float64 attention of the
            same inputs. fp32: <= 1e-5. fp16: <= 2 err_sdpa (PyTorch's own fp16
            scaled_dot_product_attention against the same reference: the project's
            criterion) with torch, else <= 2 e_model (e_model: the unavoidable storage
            roundings in float64: O rounded to fp16 once for fa1/fa2; S, P and O for
            standard). fa1 rounds its O to fp16 after every key block (Algorithm 1 as
            written), so it misses the bound at large N: a known FAIL, shown, not hidden;
          * ms of the plain build (median of `repeats`; informational; on a GPU these
            repeat launches take gpu._launch's fast path).
tc        fp16 fa2 on the tensor cores (`gpu.attention(..., kernel="tc")`): ragged N, d
          in 16..128, causal, grouped K/V, a block mask with an empty query block, logits
          x30, tilings 16 x 16 to 128 x 128, MT = 2 m-tiles per warp: counts exact; O
          finite; rows that see no key have O = 0 and L = -inf; rel err of O (over rows
          that see a key) <= 2 err_sdpa (torch) or 2 e_model; max |L - L_ref| <= 1e-2;
          counting and plain builds bit-identical, and a repeat launch (gpu._launch's
          fast path, which skips Numba's dispatcher) gives the same O. Needs a GPU: the CUDA simulator cannot
          run its linked C++ tile functions, so `sim` mode skips this suite and says so.
backward  gpu.backward (standard, fa1, fa2): counts equal iosim.backward_closed_form;
          gradients finite; plain against counted build (bit-identical where deterministic;
          fa2's dQ, summed by float32 atomics in varying order, within |a - b| <= 1e-6
          max|b| + rtol |b|, rtol 1e-5 fp32 / 2^-10 fp16); fp32 max rel err of dQ, dK, dV
          <= 1e-4; fp16 each <= 2 x a float64 model of the schedule's own fp16 roundings
          (PyTorch's SDPA backward error recorded beside it); fwd+bwd ms against SDPA.
variants  the flash-attn test matrix (analysis/check_variants.py: its covering design):
          d in 32..256 (odd ones too), N_q != N_k, causal, local windows, fp16 / bf16 /
          fp32, grouped K/V; fa2 forward and backward as gpu.attention's kernel='auto'
          runs them; counts exact, outputs written, errors <= 2 x PyTorch SDPA's in the
          same dtype + 1e-5 (a rounding model without torch). A row gpu.attention or
          attention_backward refuses (ValueError) is `refused`: counted apart from
          passes and failures, never hidden. Not in the default suites (288 rows).

Every row has `status` ("pass", "fail" or "refused") and `ok` (status == "pass").
Sharding (`run_checks(..., shard=(i, n))`, `flashsim check --shard I/N`): every n-th
group of configurations that share compiled kernels, from group i (variants: a group is
one (d, dtype); other suites: one configuration), so n processes can split a run;
`merge` joins their results.

Modes: `full` (N in {1024, 4096}, 16 heads; what the H100 runs verified), `quick` (tiny
sizes: seconds; what the sanitizers re-run), `sim` (tiny sizes in Numba's CUDA simulator,
chosen automatically without a GPU). The reference is torch float64 on the GPU when torch
with CUDA is installed (and not `use_torch=False`), NumPy float64 otherwise.

Where the code is: analysis.check_plan (the plans, configuration names, sharding),
analysis.check_suites (one configuration of the forward, tc and backward suites),
analysis.check_variants (the variants suite), analysis.check_ptx (`--ptx`); this module
runs them (`run_checks`), summarises and merges results, and re-exports their public
names.

Importing this module does not import numba.cuda: call `analysis.sweeps.ensure_cuda_env()`
(or set NUMBA_ENABLE_CUDASIM) first, as `flashsim check` does.
"""
from __future__ import annotations

import datetime
import sys
import time
from typing import Callable

import numpy as np

from analysis import check_suites as _S
from analysis.check_plan import (ALGORITHMS, DEFAULT_SUITES, MODES, SUITES,
                                 TC_NEEDS_GPU, backward_configs, backward_name, case_name,
                                 forward_configs, forward_name, n_rows, plan, shard_plan,
                                 tc_configs, tc_name)
from analysis.check_ptx import (TC_PTX_BACKWARD, TC_PTX_FA1, TC_PTX_FORWARD,
                                ptx_check, tc_ptx_check)
from analysis.check_suites import (BWD_FP32_BOUND, DQ_ATOL, DQ_RTOL, FP32_BOUND,
                                   TC_L_BOUND, check_backward, check_forward, check_tc,
                                   compare_plain_counted, fp16_model)


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------
def _fmt(x, spec=".2e"):
    return "-" if x is None else format(x, spec)


def summary(row: dict) -> str:
    """One line of numbers for a row of any suite."""
    s = row.get("suite")
    if "error" in row:
        return f"ERROR {row['error']}"
    if s == "forward":
        return (f"counts {'ok' if row['ledger_ok'] else 'FAIL'}  err {_fmt(row['err'])} "
                f"bound {_fmt(row['bound'])}  sdpa {_fmt(row.get('err_sdpa'))}  "
                f"ms {_fmt(row.get('ms'), '.2f')}")
    if s == "tc":
        return (f"counts {'ok' if row['counts_equal'] else 'FAIL'}  err {_fmt(row['rel_err'])} "
                f"bound {_fmt(row['bound'])}  sdpa {_fmt(row.get('sdpa_err'))}  "
                f"L_err {_fmt(row['L_err'], '.1e')}  masked rows {row['masked_rows']}")
    if s == "variants":
        from analysis.check_variants import summary as variants_summary
        return variants_summary(row)
    if s == "backward":
        em = max(row["err_model"].values()) if "err_model" in row else None
        et = max(row["err_torch"].values()) if "err_torch" in row else None
        ms = row.get("ms", {}).get(f"ours_{row['algorithm']}")
        return (f"counts {'ok' if row['counts_equal'] else 'FAIL'}  err "
                f"{_fmt(max(row['err'].values()))} model {_fmt(em)} torch {_fmt(et)}  "
                f"plain=counted {row['plain_matches_counted']}  ms {_fmt(ms, '.2f')}")
    return ""


def device_name() -> str:
    from gpu import _launch
    if _launch.SIM:
        return "Numba CUDA simulator"
    from numba import cuda
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def versions() -> dict:
    """Versions of what ran the checks (python, numba, numba-cuda, numpy, torch, driver)."""
    import importlib.metadata as md
    import numba
    v = {"python": sys.version.split()[0], "numba": numba.__version__, "numpy": np.__version__}
    for pkg in ("numba-cuda", "cuda-bindings"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    try:
        import torch
        v["torch"] = torch.__version__
        v["torch_cuda"] = torch.version.cuda
    except Exception:
        v["torch"] = None
    from gpu import _launch
    if not _launch.SIM:
        try:
            from numba.cuda.cudadrv.driver import driver
            v["cuda_driver"] = ".".join(str(x) for x in driver.get_version())
        except Exception:
            v["cuda_driver"] = None
    return v


def torch_available() -> bool:
    """torch with CUDA importable and the kernels on a real GPU."""
    from gpu import _launch
    if _launch.SIM:
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def run_checks(mode: str, suites=DEFAULT_SUITES, *, algorithms=ALGORITHMS,
               use_torch: bool | None = None, repeats: int = 3,
               on_row: Callable[[dict], None] | None = None,
               on_case: Callable[[int, int, str], None] | None = None,
               shard: tuple[int, int] | None = None,
               done_rows: list[dict] | None = None,
               on_start: Callable[[int, int, str], None] | None = None,
               show_progress: bool | None = None) -> dict:
    """Run the checks of `suites` in `mode` and return the result:
    {kind: "check", mode, device, versions, date, commit, reference, suites, skipped:
    [{suite, reason}], shard, rows: [...], n_rows, n_passed, n_failed, n_refused, ok}.
    Each row carries suite, name, status (pass / fail / refused), ok, failures; `ok` of
    the result: no row failed (refused rows are counted in n_refused, not as failures).
    shard=(i, n): only shard i of n (`shard_plan`). on_row(row) is called as each row is
    made; on_start(done, total, name) before each configuration runs and on_case(done,
    total, name) after it (progress: done counts the configurations finished). done_rows:
    rows an interrupted run of the same plan already made (each carries `case`, the name
    of the configuration that made it): those configurations are not run again and their
    rows are part of the result. show_progress: a status line on stderr (analysis.progress:
    configurations done / to run, elapsed, time left, the one running), on a terminal
    only, never with CI set; None (default): shown when no callback (on_row, on_case,
    on_start) is given (a caller with callbacks prints and draws its own), False: never."""
    from gpu import _launch
    if mode != "sim" and _launch.SIM:
        raise ValueError(f"mode={mode!r} needs a CUDA GPU; without one run mode='sim' (the "
                         f"CUDA simulator at tiny sizes)")
    if use_torch is None:
        use_torch = torch_available()
    elif use_torch and not torch_available():
        raise ValueError("use_torch=True needs PyTorch with CUDA and a GPU")
    if use_torch:
        import torch
        _S._T = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        _S._T = None
    from analysis.results import current_commit
    skipped = []
    if "tc" in suites and mode == "sim":
        skipped.append({"suite": "tc", "reason": TC_NEEDS_GPU})
    cases = plan(mode, suites, algorithms)
    if shard is not None:
        cases = shard_plan(cases, *shard)
    total = len(cases)
    rows = list(done_rows or [])
    done = {r.get("case") for r in rows}
    t_start = time.perf_counter()
    from analysis.progress import Progress
    own = show_progress or (show_progress is None
                            and all(f is None for f in (on_row, on_case, on_start)))
    bar = Progress(sum(case_name(s, c) not in done for s, c in cases), "check",
                   show=None if own else False)
    from gpu import api as _api
    poison_before = _api.set_poison(True)   # validation: unwritten elements show as NaN

    def add(row):
        row.setdefault("status", "pass" if row["ok"] else "fail")
        row["case"] = case
        rows.append(row)
        if on_row:
            on_row(row)

    try:
        bar.start()
        for i, (suite, cfg) in enumerate(cases):
            t0 = time.perf_counter()
            case = case_name(suite, cfg)
            if case in done:             # made by the interrupted run: kept, not rerun
                if on_case:
                    on_case(i + 1, total, case)
                continue
            if on_start:
                on_start(i, total, case)
            bar.set_note(case)
            if suite == "forward":
                name = forward_name(cfg)
                try:
                    row = check_forward(cfg, repeats=repeats)
                except Exception as exc:   # one broken config must not hide the others
                    row = dict(cfg, tiles=list(cfg["tiles"]) if cfg["tiles"] else None,
                               error=f"{type(exc).__name__}: {exc}"[:400], ok=False,
                               failures=[f"{type(exc).__name__}: {exc}"[:400]])
                row.update(suite=suite, name=name, s=round(time.perf_counter() - t0, 2))
                add(row)
            elif suite == "tc":
                name = tc_name(cfg)
                try:
                    row = check_tc(cfg)
                except Exception as exc:
                    row = dict(cfg, tiles=list(cfg["tiles"]), ok=False,
                               error=f"{type(exc).__name__}: {exc}"[:400],
                               failures=[f"{type(exc).__name__}: {exc}"[:400]])
                row.update(suite=suite, name=name, s=round(time.perf_counter() - t0, 2))
                add(row)
            elif suite == "variants":
                from analysis import check_variants
                name = check_variants.name(cfg)
                try:
                    row = check_variants.check(cfg, _S._T)
                except Exception as exc:   # not a refusal (check_variants.check keeps those)
                    row = dict(cfg, ok=False, status="fail",
                               error=f"{type(exc).__name__}: {exc}"[:400],
                               failures=[f"{type(exc).__name__}: {exc}"[:400]])
                row.update(suite=suite, name=name, s=round(time.perf_counter() - t0, 2))
                add(row)
                if _S._T is not None:
                    _S._T.cuda.empty_cache()
            else:
                name = case
                try:
                    made = check_backward(cfg, repeats=repeats)
                except Exception as exc:
                    made = [dict(algorithm=a, N=cfg["N"], d=cfg["d"], dtype=cfg["dtype"],
                                 causal=cfg["causal"], ok=False,
                                 error=f"{type(exc).__name__}: {exc}"[:400],
                                 failures=[f"{type(exc).__name__}: {exc}"[:400]])
                            for a in cfg["algs"]]
                for row, alg in zip(made, cfg["algs"]):
                    row.update(suite=suite, name=backward_name(cfg, alg))
                    add(row)
            bar.update()
            if on_case:
                on_case(i + 1, total, name)
    finally:
        bar.close()
        _S._T = None
        _api.set_poison(poison_before)
    return finish_result({
            "kind": "check", "mode": mode, "device": device_name(), "versions": versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": current_commit(),
            "reference": "torch float64 on the GPU" if use_torch else "NumPy float64",
            "suites": list(suites), "skipped": skipped,
            "shard": None if shard is None else list(shard),
            "criteria": {"ledger": "counts == iosim.closed_form exactly",
                         "forward fp32": f"rel err <= {FP32_BOUND:g}",
                         "fp16": "rel err <= 2 x PyTorch SDPA's fp16 error (with torch), "
                                 "else 2 x e_model",
                         "backward fp32": f"max rel err <= {BWD_FP32_BOUND:g}",
                         "backward fp16": "each rel err <= 2 x the schedule's fp16 model",
                         "variants": "max|x - ref| / max|ref| <= 2 x PyTorch SDPA's in the "
                                     "same dtype + 1e-5 (without torch: 2 x the storage "
                                     "rounding model + 1e-5), x in O, dQ, dK, dV"},
            "rows": rows, "total_s": round(time.perf_counter() - t_start, 1)})


def finish_result(result: dict) -> dict:
    """Set n_rows, n_passed, n_failed, n_refused and ok from result["rows"]."""
    rows = result["rows"]
    status = [r.get("status", "pass" if r["ok"] else "fail") for r in rows]
    result.update(n_rows=len(rows), n_passed=status.count("pass"),
                  n_failed=status.count("fail"), n_refused=status.count("refused"),
                  ok=status.count("fail") == 0)
    return result


def merge(results: list[dict]) -> dict:
    """One result from the results of shards (or any runs) of the same mode: their rows
    concatenated, skipped suites joined, totals recounted; device, versions, commit and
    reference from the first (a ValueError if they differ in mode, device or commit)."""
    if not results:
        raise ValueError("results=[] is not allowed; allowed: one or more check results")
    first = results[0]
    for r in results[1:]:
        for key in ("kind", "mode", "device", "commit", "reference"):
            if r.get(key) != first.get(key):
                raise ValueError(f"results differ in {key}: {first.get(key)!r} and "
                                 f"{r.get(key)!r}; allowed: results of one run")
    out = {k: v for k, v in first.items() if not k.startswith("n_")}
    out["rows"] = [row for r in results for row in r["rows"]]
    out["suites"] = sorted({s for r in results for s in r["suites"]},
                           key=lambda s: SUITES.index(s) if s in SUITES else len(SUITES))
    out["skipped"] = [s for i, r in enumerate(results) for s in r["skipped"]
                      if s not in [x for q in results[:i] for x in q["skipped"]]]
    out["shard"] = [r.get("shard") for r in results]
    out["total_s"] = round(sum(r.get("total_s", 0) for r in results), 1)
    return finish_result(out)


__all__ = ["ALGORITHMS", "BWD_FP32_BOUND", "DEFAULT_SUITES", "DQ_ATOL", "DQ_RTOL",
           "FP32_BOUND", "MODES", "SUITES", "TC_L_BOUND", "TC_NEEDS_GPU", "TC_PTX_BACKWARD",
           "TC_PTX_FA1", "TC_PTX_FORWARD", "backward_configs", "backward_name", "case_name",
           "check_backward", "check_forward", "check_tc", "compare_plain_counted",
           "device_name", "finish_result", "forward_configs", "forward_name", "fp16_model",
           "merge", "n_rows", "plan", "ptx_check", "run_checks", "shard_plan", "summary",
           "tc_configs", "tc_name", "tc_ptx_check", "torch_available", "versions"]
