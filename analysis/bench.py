"""`flashsim bench`: attention timings on a CUDA GPU, one JSON row per point.

Passes (`--pass`): "fwd", the forward call; "fwd+bwd", forward then backward(dO) through
autograd (`gpu.autograd.flash_attention` for fa2 / fa1 / standard, SDPA for torch_*;
`rel_err` is then the worst of dQ, dK, dV on the first instance against float64
autograd; TFLOP/s count 3.5 forwards' FLOPs). Rows carry "pass".

Implementations: the project's Numba kernels through `gpu.attention` on torch tensors
(`fa2`, `fa1`, `standard`: the whole call, host work included), the fa2 kernel alone
(`fa2_kernel`: the compiled kernels `gpu.attention` runs, launched on preallocated
outputs by `gpu.api.kernel_launcher`, no checks or allocation; next to `fa2` it shows
what the call adds) and PyTorch's `scaled_dot_product_attention` with one backend forced
(`torch_math`, `torch_efficient`, `torch_flash`; FLASH is fp16 only), all in the same
run. TF32 is off.

Method, per point (impl, dtype, N, d, causal, batch_heads, pass):
  * inputs: `n_sets` independent (q, k, v) sets on the device, enough that together they
    exceed 2 x the 50 MB L2 (`input_sets`); repetition r uses set r % n_sets;
  * one warm-up call (it also compiles Numba kernels), then one timed single call: if it
    exceeds `time_cap_ms` the point is recorded as skipped (never silently);
  * `reps` (>= 10) calls, each between two torch.cuda.Events; `ms_median` is their median.
    Every impl is timed the same way: calls enqueued back to back with no host sync in
    between, as in a user's loop, so host work (Python, Numba's launch) overlaps the
    previous call's kernels and shows only where it exceeds the GPU time (small N). With
    torch inputs `gpu.attention` allocates its outputs and scratch from torch's caching
    allocator, so nothing is freed through Numba inside the timed loop;
  * `peak_extra_bytes`: device memory one call needs beyond its inputs and output,
    torch.cuda.max_memory_allocated after reset_peak_memory_stats, plus (for the Numba
    kernels, which allocate through the driver, not torch's allocator) the drop of the
    driver's free memory during the call with Numba's deallocations deferred;
  * `rel_err`: max |O - O_ref| / max |O_ref| over a subset of query rows (all instances),
    O_ref computed on the device in float64 from the same inputs;
  * `tflops`: 4 N^2 d per instance (halved when causal) / ms_median.
Points whose predicted memory exceeds free memory, or whose predicted single-call time
(previous N of the same series, scaled by (N/N_prev)^2) exceeds the cap, are recorded as
skipped with the reason. Rows go to the JSON file as soon as made (atomic rewrite), so an
interrupted run keeps them and a rerun on the same file skips points already done.

Tilings (`--tilings 128x64,64x64,default`): the Numba kernels (fa2, fa2_kernel, fa1,
standard) run once per tiling B_r x B_c (`block_rows`, `block_cols` of gpu.attention; the
kernel picks its threads), PyTorch's impls once; such rows carry "tiling": [B_r, B_c]
(absent: the default tiling). A tiling a kernel cannot run is a skipped row with the
kernel's reason.

`record_rows(rows)` appends a run's rows to the results data set (kind `bench`;
`flashsim bench --record`), where the README's tables and `flashsim figure fig8` read them.

The pure parts (sweep order, formulas, skip rules, rows, resume) take a `backend` object,
so tests run them with a fake one; `TorchBackend` is the real GPU one.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
DTYPES = ("fp32", "fp16", "bf16")
CAUSAL_MODES = ("off", "on", "both")
IMPLS = ("fa2", "fa2_kernel", "fa1", "standard", "torch_math", "torch_efficient",
         "torch_flash")
GPU_IMPLS = ("fa2", "fa1", "standard")
#: the Numba kernels alone, launched on preallocated outputs: impl -> the algorithm
KERNEL_IMPLS = {"fa2_kernel": "fa2"}
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
L2_BYTES = 50 * 10**6
MIN_REPS = 10
#: Points measured first (the most important), in this order: d=64, N=4096 then 8192,
#: fp32 then fp16, non-causal, all impls.
PRIORITY = [(64, 4096, "fp32", False), (64, 4096, "fp16", False),
            (64, 8192, "fp32", False), (64, 8192, "fp16", False)]
#: Skip reasons that a rerun retries (anything else is final for that point).
RETRY_REASONS = ("time budget",)
ROW_KEY = ("impl", "dtype", "N", "d", "batch_heads", "causal", "pass")
#: What a point times: the forward call ("fwd"), or forward + backward through autograd
#: ("fwd+bwd": gpu.autograd.flash_attention / SDPA, then .backward(dO)).
PASSES = ("fwd", "fwd+bwd")
#: FLOPs of a pass in units of the forward's: the backward is 2.5 forwards (five N x N x d
#: products against two), so fwd+bwd counts 3.5.
PASS_FLOPS = {"fwd": 1.0, "fwd+bwd": 3.5}
MIN_SETS = 2


# ---------------------------------------------------------------------------------------
# Argument parsing helpers (ValueError names parameter, value, allowed)
# ---------------------------------------------------------------------------------------
def parse_int_list(param: str, text, allowed=None) -> list[int]:
    """'512,1024' -> [512, 1024]; every value positive (and in `allowed` when given)."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = []
    for raw in items:
        s = str(raw).strip()
        try:
            v = int(s)
        except ValueError:
            raise ValueError(f"{param}={s!r} is not an integer; allowed: "
                             f"{_allowed(allowed, 'positive integers')}") from None
        if v <= 0 or (allowed is not None and v not in allowed):
            raise ValueError(f"{param}={v} is not allowed; allowed: "
                             f"{_allowed(allowed, 'positive integers')}")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError(f"{param} is empty; allowed: {_allowed(allowed, 'positive integers')}")
    return out


def parse_name_list(param: str, text, allowed) -> list[str]:
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = []
    for raw in items:
        s = str(raw).strip()
        if s not in allowed:
            raise ValueError(f"{param}={s!r} is not allowed; allowed: {', '.join(allowed)}")
        if s not in out:
            out.append(s)
    if not out:
        raise ValueError(f"{param} is empty; allowed: {', '.join(allowed)}")
    return out


def parse_causal(value) -> list[bool]:
    if value not in CAUSAL_MODES:
        raise ValueError(f"causal={value!r} is not allowed; allowed: {', '.join(CAUSAL_MODES)}")
    return {"off": [False], "on": [True], "both": [False, True]}[value]


def _allowed(allowed, default):
    return ", ".join(str(a) for a in allowed) if allowed is not None else default


# ---------------------------------------------------------------------------------------
# Formulas
# ---------------------------------------------------------------------------------------
def flops(N: int, d: int, batch_heads: int, causal: bool) -> float:
    """Forward FLOPs: 4 N^2 d per instance (two matmuls), halved when causal."""
    f = 4.0 * N * N * d * batch_heads
    return f / 2 if causal else f


def tflops(N: int, d: int, batch_heads: int, causal: bool, ms: float,
           pass_: str = "fwd") -> float:
    """TFLOP/s of a pass (`PASS_FLOPS` forwards' worth of FLOPs) taking `ms`."""
    if not ms or ms <= 0 or not math.isfinite(ms):
        raise ValueError(f"ms={ms!r} must be a positive number of milliseconds")
    return PASS_FLOPS[pass_] * flops(N, d, batch_heads, causal) / (ms * 1e-3) / 1e12


def input_set_bytes(N: int, d: int, batch_heads: int, dtype: str) -> int:
    """Bytes of one (q, k, v) set."""
    return 3 * batch_heads * N * d * ITEMSIZE[dtype]


def input_sets(N: int, d: int, batch_heads: int, dtype: str, l2_bytes: int = L2_BYTES) -> int:
    """Number of input sets to rotate so that together they exceed 2 x L2 (at least 2)."""
    one = input_set_bytes(N, d, batch_heads, dtype)
    return max(MIN_SETS, 2 * l2_bytes // one + 1)


def predicted_extra_bytes(impl: str, N: int, d: int, batch_heads: int, dtype: str) -> int:
    """A generous prediction of device memory one call needs beyond inputs and output.

    standard: S and P, each batch_heads x N^2 in the input dtype (plus the statistics).
    torch_math: materialises scores, probabilities and softmax temporaries; measured
    2.3 GB at N=4096 fp32 (2.1 x batch_heads N^2 x 4); we allow 3 x in float32.
    The tiled kernels and the fused torch kernels: O(batch_heads N) statistics.
    """
    s = ITEMSIZE[dtype]
    nn = batch_heads * N * N
    stats = 4 * 4 * batch_heads * N
    if impl == "standard":
        return 2 * nn * s + stats
    if impl == "torch_math":
        return 3 * nn * 4 + stats
    return stats


def unsupported_reason(impl: str, dtype: str, d: int, pass_: str = "fwd") -> str | None:
    """Why an impl cannot run this dtype/d/pass at all (a skipped row), or None."""
    if impl == "torch_flash" and dtype not in ("fp16", "bf16"):
        return "torch FLASH backend supports fp16/bf16 only"
    if pass_ == "fwd+bwd" and impl in KERNEL_IMPLS:
        return f"{impl} times the forward kernels alone; the fwd+bwd pass runs through autograd"
    return None


# ---------------------------------------------------------------------------------------
# Sweep
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    impl: str
    dtype: str
    N: int
    d: int
    causal: bool
    batch_heads: int
    pass_: str = "fwd"
    #: (B_r, B_c) given with --tilings (the Numba kernels only); None: the default tiling
    tiling: tuple | None = None

    def key(self) -> tuple:
        """ROW_KEY's fields (and the tiling where one was given)."""
        return (self.impl, self.dtype, self.N, self.d, self.batch_heads, self.causal,
                self.pass_) + (() if self.tiling is None else (self.tiling,))

    def series(self) -> tuple:
        """Points that differ only in N form a series (for time prediction)."""
        return (self.impl, self.dtype, self.d, self.causal, self.batch_heads, self.pass_,
                self.tiling)


def sweep(seq_lens=SEQ_LENS, head_dims=HEAD_DIMS, dtypes=DTYPES, causal=(False, True),
          impls=IMPLS, batch_heads=16, passes=("fwd",), tilings=(None,)) -> list[Point]:
    """All points, the PRIORITY ones first (in their order), then the rest grouped by
    (d, dtype, causal) with N ascending (so time predictions from smaller N exist). The
    Numba kernels' impls run once per entry of `tilings` ((B_r, B_c), or None for the
    default tiling), PyTorch's once."""
    groups = []
    for (d, N, dt, c) in PRIORITY:
        if d in head_dims and N in seq_lens and dt in dtypes and c in causal:
            groups.append((d, N, dt, c))
    for d in sorted(head_dims):
        for c in causal:
            for dt in dtypes:
                for N in sorted(seq_lens):
                    if (d, N, dt, c) not in groups:
                        groups.append((d, N, dt, c))
    return [Point(impl, dt, N, d, c, batch_heads, ps, t) for (d, N, dt, c) in groups
            for ps in passes for impl in impls
            for t in (tilings if impl in GPU_IMPLS or impl in KERNEL_IMPLS else (None,))]


def row_key(row: dict) -> tuple:
    """A row's point (rows from before passes existed were forward rows; rows without
    `tiling` ran the default tiling)."""
    return (tuple(row.get(k, "fwd") if k == "pass" else row.get(k) for k in ROW_KEY)
            + ((tuple(row["tiling"]),) if row.get("tiling") else ()))


def parse_tilings(text) -> list[tuple | None]:
    """'default,128x64' -> [None, (128, 64)]: B_r x B_c, positive integers; 'default' is
    the kernel's own choice."""
    allowed = "B_rxB_c with positive integers (128x64) or 'default'"
    out = []
    for raw in str(text).split(","):
        s = raw.strip()
        if s == "default":
            t = None
        else:
            m = re.fullmatch(r"(\d+)x(\d+)", s)
            if not m or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
                raise ValueError(f"tilings={s!r} is not allowed; allowed: {allowed}")
            t = (int(m.group(1)), int(m.group(2)))
        if t not in out:
            out.append(t)
    return out


def is_done(row: dict) -> bool:
    """A row that a resumed run need not redo: measured, or skipped for a lasting reason."""
    if row.get("ms_median") is not None:
        return True
    reason = row.get("skipped")
    return bool(reason) and not any(str(reason).startswith(r) for r in RETRY_REASONS)


# ---------------------------------------------------------------------------------------
# Result file
# ---------------------------------------------------------------------------------------
def device_slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return s or "unknown-device"


def default_results_path(device_name: str, date: str | None = None, root="out") -> Path:
    date = date or _dt.date.today().isoformat()
    return Path(root) / f"{date}-{device_slug(device_name)}.json"


class ResultFile:
    """A JSON list of rows, rewritten atomically after every row."""

    def __init__(self, path):
        self.path = Path(path)
        self.rows: list[dict] = []
        if self.path.exists():
            text = self.path.read_text()
            if text.strip():
                data = json.loads(text)
                if not isinstance(data, list):
                    raise ValueError(f"results file {self.path} holds {type(data).__name__}; "
                                     f"expected a JSON list of rows")
                self.rows = data

    def done_keys(self) -> set:
        return {row_key(r) for r in self.rows if is_done(r)}

    def add(self, row: dict) -> None:
        """Add a row (replacing an earlier row of the same point) and rewrite the file."""
        k = row_key(row)
        self.rows = [r for r in self.rows if row_key(r) != k] + [row]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.rows, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, self.path)


def _finite_or_none(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def make_row(point: Point, *, run_id: str, meta: dict, ms=None, times=None, rel_err=None,
             peak_extra_bytes=None, skipped=None, extra=None) -> dict:
    """One result row. `ms` None means not measured (then `skipped` says why)."""
    if ms is None and not skipped:
        raise ValueError("a row without ms_median must say why it was skipped")
    row = {
        "run_id": run_id,
        "date": meta.get("date"),
        "device": meta.get("device"),
        "impl": point.impl, "pass": point.pass_, "dtype": point.dtype, "N": point.N,
        "d": point.d,
        "batch_heads": point.batch_heads, "causal": point.causal,
        "ms_median": None if ms is None else float(ms),
        "tflops": None if ms is None else tflops(point.N, point.d, point.batch_heads,
                                                 point.causal, ms, point.pass_),
        "peak_extra_bytes": None if peak_extra_bytes is None else int(peak_extra_bytes),
        "rel_err": _finite_or_none(rel_err),
        "skipped": skipped,
        "reps": None if times is None else len(times),
        "ms_min": None if not times else float(min(times)),
        "ms_max": None if not times else float(max(times)),
        "versions": meta.get("versions", {}),
    }
    if point.tiling is not None:
        row["tiling"] = list(point.tiling)
    if rel_err is not None and not math.isfinite(float(rel_err)):
        row["note"] = "output has non-finite values"
    if extra:
        row.update(extra)
    return row


# ---------------------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------------------
@dataclass
class Options:
    reps: int = MIN_REPS
    time_cap_ms: float = 2000.0       # longest single call we accept
    row_budget_s: float = 40.0        # longest a point may take (all calls together)
    budget_s: float | None = None     # whole sweep; remaining points are recorded skipped
    l2_bytes: int = L2_BYTES
    memory_margin: float = 0.9        # use at most this fraction of free memory

    def __post_init__(self):
        if isinstance(self.reps, bool) or not isinstance(self.reps, int) or self.reps < MIN_REPS:
            raise ValueError(f"reps={self.reps!r} is not allowed; allowed: integers >= {MIN_REPS}")
        for name in ("time_cap_ms", "row_budget_s"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"{name}={v!r} is not allowed; allowed: positive numbers")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"budget_s={self.budget_s!r} is not allowed; allowed: positive seconds")


def predict_single_ms(point: Point, measured: dict) -> tuple[float, int] | None:
    """(predicted ms, from N) for `point` from the largest smaller N measured in its series,
    scaled by (N / N_prev)^2; None without such a point."""
    prev = measured.get(point.series(), {})
    smaller = [n for n in prev if n < point.N]
    if not smaller:
        return None
    n0 = max(smaller)
    return prev[n0] * (point.N / n0) ** 2, n0


def run_sweep(points, backend, results: ResultFile, opts: Options, *, run_id: str, meta: dict,
              clock=time.monotonic, log=print, on_point=None) -> list[dict]:
    """Measure every point not already done in `results`; return the rows made now.
    on_point(row), if given, is called after each row is recorded (progress)."""
    start = clock()
    done = results.done_keys()
    measured: dict = {}   # series -> {N: single-call ms} (for predictions)
    for r in results.rows:
        if r.get("ms_median") is not None:
            p = Point(r["impl"], r["dtype"], r["N"], r["d"], r["causal"], r["batch_heads"],
                      r.get("pass", "fwd"), tuple(r["tiling"]) if r.get("tiling") else None)
            measured.setdefault(p.series(), {})[p.N] = r["ms_median"]
    made = []

    def record(point, **kw):
        row = make_row(point, run_id=run_id, meta=meta, **kw)
        results.add(row)
        made.append(row)
        impl = point.impl + ("" if point.tiling is None else "@{}x{}".format(*point.tiling))
        if row["ms_median"] is not None:
            log(f"{impl:>16} {point.dtype} N={point.N:<6} d={point.d:<4} "
                f"causal={int(point.causal)} {row['ms_median']:10.3f} ms "
                f"{row['tflops']:8.2f} TFLOP/s rel_err={row['rel_err']}")
        else:
            log(f"{impl:>16} {point.dtype} N={point.N:<6} d={point.d:<4} "
                f"causal={int(point.causal)} skipped: {row['skipped']}")
        if on_point:
            on_point(row)
        return row

    for point in points:
        if point.key() in done:
            continue
        reason = unsupported_reason(point.impl, point.dtype, point.d, point.pass_)
        if reason:
            record(point, skipped=reason)
            continue
        if opts.budget_s is not None and clock() - start > opts.budget_s:
            record(point, skipped=f"time budget of {opts.budget_s:.0f} s used up before this point")
            continue
        pred = predict_single_ms(point, measured)
        if pred is not None and pred[0] > opts.time_cap_ms:
            record(point, skipped=f"predicted single call {pred[0]:.0f} ms (from N={pred[1]}, "
                                  f"x(N/N_prev)^2) exceeds the cap of {opts.time_cap_ms:.0f} ms")
            continue
        n_sets = input_sets(point.N, point.d, point.batch_heads, point.dtype, opts.l2_bytes)
        need = (n_sets * input_set_bytes(point.N, point.d, point.batch_heads, point.dtype)
                + point.batch_heads * point.N * point.d * ITEMSIZE[point.dtype]
                + predicted_extra_bytes(point.impl, point.N, point.d, point.batch_heads,
                                        point.dtype))
        free = backend.free_bytes()
        if need > opts.memory_margin * free:
            # fewer input sets (down to MIN_SETS) before giving up
            one = input_set_bytes(point.N, point.d, point.batch_heads, point.dtype)
            need_min = need - (n_sets - MIN_SETS) * one
            if need_min > opts.memory_margin * free:
                record(point, skipped=f"predicted memory {need / 1e9:.2f} GB exceeds "
                                      f"{opts.memory_margin:.0%} of free memory {free / 1e9:.2f} GB")
                continue
            n_sets = MIN_SETS + int((opts.memory_margin * free - need_min) // one)
        try:
            row = _measure(point, backend, opts, n_sets, clock)
        except backend.OutOfMemory as e:  # noqa: B030 (backend supplies the class)
            backend.cleanup()
            record(point, skipped=f"out of memory: {str(e).splitlines()[0][:200]}")
            continue
        except Exception as e:  # a failing impl is a result too; keep going
            backend.cleanup()
            record(point, skipped=f"error: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            continue
        backend.cleanup()
        if row.get("skipped"):
            if row.get("single_ms") is not None:
                measured.setdefault(point.series(), {})[point.N] = row["single_ms"]
            record(point, skipped=row["skipped"], extra={"single_ms": row.get("single_ms"),
                                                         "n_sets": n_sets})
            continue
        measured.setdefault(point.series(), {})[point.N] = row["ms"]
        record(point, ms=row["ms"], times=row["times"], rel_err=row["rel_err"],
               peak_extra_bytes=row["peak_extra_bytes"],
               extra={"n_sets": n_sets, "single_ms": row["single_ms"], **row.get("extra", {})})
    return made


def _measure(point: Point, backend, opts: Options, n_sets: int, clock) -> dict:
    """Warm-up, cap check, reference check, peak memory, `reps` timed calls."""
    t0 = clock()
    backend.prepare(point, n_sets)
    backend.call(point, 0)                     # warm-up (compiles Numba kernels)
    single = backend.time_calls(point, [1 % n_sets])[0]
    if single > opts.time_cap_ms:
        return {"skipped": f"single call took {single:.0f} ms, over the cap of "
                           f"{opts.time_cap_ms:.0f} ms", "single_ms": single}
    # warm-up + single already spent; reference, peak-memory and timed calls to come
    if single * (opts.reps + 3) / 1e3 + (clock() - t0) > opts.row_budget_s:
        return {"skipped": f"single call took {single:.0f} ms: {opts.reps} reps would exceed "
                           f"the per-point budget of {opts.row_budget_s:.0f} s",
                "single_ms": single}
    rel = backend.rel_err(point, 0)
    peak = backend.peak_extra_bytes(point, 0)
    times = backend.time_calls(point, [r % n_sets for r in range(opts.reps)])
    return {"ms": statistics.median(times), "times": times, "rel_err": rel,
            "peak_extra_bytes": peak, "single_ms": single, "extra": backend.row_extra(point)}


# ---------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------
def numpy_problem() -> str | None:
    """A one-line message if numpy is too new for numba-cuda 0.30.4 (>= 2.5), else None."""
    try:
        import numpy
    except ImportError:
        return "numpy is not installed"
    parts = re.findall(r"\d+", numpy.__version__)[:2]
    if len(parts) == 2 and (int(parts[0]), int(parts[1])) >= (2, 5):
        return (f"numpy {numpy.__version__} is too new: numba-cuda 0.30.4 cannot compile "
                f"kernels on numpy >= 2.5; put a numpy<2.5 first on the path")
    return None


def gpu_problem() -> str | None:
    """One line saying what is missing for `flashsim bench`, or None when torch + a CUDA
    GPU are there. Never raises."""
    msg = numpy_problem()
    if msg:
        return msg
    try:
        import torch  # noqa: F401
    except ImportError:
        return "PyTorch (torch) is not installed; flashsim bench needs torch with CUDA"
    except Exception as e:  # broken install
        return f"PyTorch failed to import: {type(e).__name__}: {e}"
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU is available to PyTorch"
    except Exception as e:
        return f"no CUDA GPU is available to PyTorch ({type(e).__name__}: {e})"
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "NUMBA_ENABLE_CUDASIM=1 is set: the Numba kernels would run in the simulator"
    return None


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    from importlib import metadata
    for mod, dist in (("torch", "torch"), ("numba", "numba"), ("numba_cuda", "numba-cuda"),
                      ("numpy", "numpy")):
        try:
            out[mod] = metadata.version(dist)
        except Exception:
            out[mod] = None
    try:
        import numpy
        out["numpy"] = numpy.__version__   # the one imported (may differ from metadata)
    except Exception:
        pass
    try:
        import torch
        out["torch"] = torch.__version__
        out["cuda_torch"] = torch.version.cuda
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    try:
        from numba.cuda.cudadrv.driver import driver
        v = driver.get_version()
        out["cuda_driver_api"] = ".".join(str(x) for x in v)
    except Exception:
        out["cuda_driver_api"] = None
    try:
        import subprocess
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        out["driver"] = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except Exception:
        out["driver"] = None
    return out


def new_run_id() -> str:
    return _dt.datetime.now().strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


# ---------------------------------------------------------------------------------------
# The real backend (torch + gpu.attention). Runs only on a CUDA GPU.
# ---------------------------------------------------------------------------------------
class TorchBackend:
    """Inputs, calls, timings, references and memory for one point at a time."""

    REF_ROWS = 256   # query rows checked against float64 (spread over N, incl. the last)

    def __init__(self, seed: int = 0):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import gpu
        from numba import cuda
        self.torch, self.cuda, self.gpu = torch, cuda, gpu
        self.sdpa_kernel = sdpa_kernel
        self.backends = {"torch_math": SDPBackend.MATH,
                         "torch_efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "torch_flash": SDPBackend.FLASH_ATTENTION}
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.OutOfMemory = torch.cuda.OutOfMemoryError
        self.seed = seed
        self.sets = []
        self.set_key = None
        self.launcher = self.launcher_key = None
        self.device_name = torch.cuda.get_device_name()

    # -- inputs ----------------------------------------------------------------------
    def prepare(self, point: Point, n_sets: int) -> None:
        key = (point.dtype, point.N, point.d, point.batch_heads, n_sets)
        if key == self.set_key:
            return
        self.sets = []
        self.set_key = None
        self.launcher = self.launcher_key = None
        self.cleanup()
        torch = self.torch
        dt = {"fp32": torch.float32, "fp16": torch.float16,
              "bf16": torch.bfloat16}[point.dtype]
        g = torch.Generator(device="cuda").manual_seed(self.seed)
        shape = (1, point.batch_heads, point.N, point.d)
        for _ in range(n_sets):
            self.sets.append(tuple(torch.randn(shape, device="cuda", generator=g,
                                               dtype=torch.float32).to(dt).contiguous()
                                   for _ in range(3)))
        # dO of the fwd+bwd pass: one (shared by the sets; it is read once per call)
        self.do = torch.randn(shape, device="cuda", generator=g,
                              dtype=torch.float32).to(dt).contiguous()
        torch.cuda.synchronize()
        self.set_key = key

    def free_bytes(self) -> int:
        self.cleanup()
        free, _total = self.torch.cuda.mem_get_info()
        # inputs of the current group are about to be replaced: count them as free
        held = sum(t.numel() * t.element_size() for s in self.sets for t in s)
        return int(free + held)

    def flush_numba(self) -> None:
        """Free Numba's pending device deallocations (the memory manager's and the
        context's queues)."""
        try:
            ctx = self.cuda.current_context()
        except Exception:
            return
        for owner in (getattr(ctx, "memory_manager", None), ctx):
            pend = getattr(owner, "deallocations", None)
            if pend is not None:
                try:
                    pend.clear()
                except Exception:
                    pass

    def cleanup(self) -> None:
        self.flush_numba()
        self.torch.cuda.empty_cache()

    # -- one call ----------------------------------------------------------------------
    @staticmethod
    def tiling_kwargs(point: Point) -> dict:
        if point.tiling is None:
            return {}
        return {"block_rows": point.tiling[0], "block_cols": point.tiling[1]}

    def call(self, point: Point, s: int):
        q, k, v = self.sets[s]
        if point.pass_ == "fwd+bwd":
            return self.call_fwd_bwd(point, q, k, v)
        if point.impl in GPU_IMPLS:
            return self.gpu.attention(q, k, v, algorithm=point.impl, causal=point.causal,
                                      **self.tiling_kwargs(point))
        if point.impl in KERNEL_IMPLS:
            key = (point.key(), self.set_key)
            if self.launcher_key != key:   # outputs allocated once per point
                self.launcher = None
                self.launcher = self.gpu.api.kernel_launcher(
                    q, k, v, algorithm=KERNEL_IMPLS[point.impl], causal=point.causal,
                    **self.tiling_kwargs(point))
                self.launcher_key = key
            return self.launcher(q, k, v)
        F = self.torch.nn.functional
        with self.sdpa_kernel(self.backends[point.impl]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=point.causal)

    def call_fwd_bwd(self, point: Point, q, k, v):
        """Forward then backward(dO) through autograd; returns (dq, dk, dv)."""
        from gpu.autograd import flash_attention
        qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
        if point.impl in GPU_IMPLS:
            out = flash_attention(qq, kk, vv, algorithm=point.impl, causal=point.causal,
                                  **self.tiling_kwargs(point))
        else:
            F = self.torch.nn.functional
            with self.sdpa_kernel(self.backends[point.impl]):
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=point.causal)
        out.backward(self.do)
        return qq.grad, kk.grad, vv.grad

    def time_calls(self, point: Point, set_indices) -> list[float]:
        torch = self.torch
        evs = []
        torch.cuda.synchronize()
        for s in set_indices:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = self.call(point, s)
            b.record()
            evs.append((a, b))
            del out
        torch.cuda.synchronize()
        self.flush_numba()
        times = [a.elapsed_time(b) for a, b in evs]
        del evs
        return times

    # -- checks ------------------------------------------------------------------------
    def ref_rows(self, N: int):
        n = min(N, self.REF_ROWS)
        idx = sorted({int(round(i * (N - 1) / max(n - 1, 1))) for i in range(n)})
        return self.torch.tensor(idx, device="cuda", dtype=self.torch.long)

    def rel_err_grads(self, point: Point, s: int) -> float:
        """max over dQ, dK, dV of max |g - g_ref| / max |g_ref| on the first instance,
        g_ref from float64 autograd of the dense attention on the same inputs."""
        torch = self.torch
        grads = self.call(point, s)
        torch.cuda.synchronize()
        x = [t[:, :1].double().detach().requires_grad_(True) for t in self.sets[s]]
        scores = (x[0] @ x[1].transpose(-1, -2)) / math.sqrt(point.d)
        if point.causal:
            n = point.N
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda")
                                        .triu(1), float("-inf"))
        (torch.softmax(scores, dim=-1) @ x[2]).backward(self.do[:, :1].double())
        worst = 0.0
        for g, ref in zip(grads, x):
            den = ref.grad.abs().max().item()
            num = (g[:, :1].double() - ref.grad).abs().max().item()
            worst = max(worst, num / den if den > 0 else float("nan"))
        del grads, x, scores
        return worst

    def rel_err(self, point: Point, s: int) -> float:
        if point.pass_ == "fwd+bwd":
            return self.rel_err_grads(point, s)
        torch = self.torch
        out = self.call(point, s)
        torch.cuda.synchronize()
        q, k, v = (t.double() for t in self.sets[s])
        rows = self.ref_rows(point.N)
        qs = q[:, :, rows, :]
        scores = (qs @ k.transpose(-1, -2)) / math.sqrt(point.d)
        if point.causal:
            cols = torch.arange(point.N, device="cuda")
            scores = scores.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
        ref = torch.softmax(scores, dim=-1) @ v
        got = out[:, :, rows, :].double()
        num = (got - ref).abs().max().item()
        den = ref.abs().max().item()
        del scores, ref, got, out, q, k, v
        return num / den if den > 0 else float("nan")

    def peak_extra_bytes(self, point: Point, s: int) -> int:
        torch = self.torch
        self.cleanup()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        reserved0 = torch.cuda.memory_reserved()
        free0 = torch.cuda.mem_get_info()[0]
        with self.cuda.defer_cleanup():
            out = self.call(point, s)
            torch.cuda.synchronize()
            free1 = torch.cuda.mem_get_info()[0]
        reserved1 = torch.cuda.memory_reserved()
        torch_peak = torch.cuda.max_memory_allocated() - base
        driver = 0
        if point.impl in GPU_IMPLS:   # numba's own allocations (not torch's caching allocator)
            driver = max(0, (free0 - free1) - (reserved1 - reserved0))
        # the kernel alone writes outputs allocated before (kernel_launcher): none here
        outs = out if isinstance(out, tuple) else (out,)
        out_bytes = 0 if point.impl in KERNEL_IMPLS else sum(o.numel() * o.element_size()
                                                             for o in outs)
        del out
        self.cleanup()
        return int(torch_peak + driver - out_bytes)

    def row_extra(self, point: Point) -> dict:
        if point.tiling is not None:
            return {"block_rows": point.tiling[0], "block_cols": point.tiling[1]}
        if point.impl in GPU_IMPLS or point.impl in KERNEL_IMPLS:
            alg = KERNEL_IMPLS.get(point.impl, point.impl)
            t = self.gpu.default_tiling(alg, point.d, point.dtype, point.causal)
            return {"block_rows": t.B_r, "block_cols": t.B_c}
        return {}


def record_rows(rows: list[dict], commit: str | None = None, data=None) -> tuple[int, int]:
    """Append bench rows to the results data set (analysis.results, kind `bench`): run_id
    'bench-<the bench run id>', the bench run id kept as bench_run_id, commit (default:
    the checkout's HEAD). Returns (added, already there)."""
    from analysis import results as R
    commit = R.current_commit() if commit is None else commit
    out = []
    for r in rows:
        p = {k: v for k, v in r.items() if k not in ("run_id", "date", "device", "versions")}
        p["bench_run_id"] = r.get("run_id")
        out.append(R.make_row("bench", run_id=f"bench-{r.get('run_id')}", device=r.get("device"),
                              date=r.get("date"), commit=commit,
                              versions=r.get("versions") or {}, **p))
    return R.append(out, data=data)


# ---------------------------------------------------------------------------------------
# Compact table (printed after a sweep)
# ---------------------------------------------------------------------------------------
def fmt_cell(row) -> str:
    if row is None:
        return "-"
    if row.get("ms_median") is None:
        return "skip"
    return f"{row['ms_median']:.3g}/{row['tflops']:.3g}"


def compact_table(rows: list[dict]) -> str:
    """ms/TFLOP/s per (dtype, d, causal) block, N by impl; then skips and errors."""
    def label(r):        # an impl, or an impl at a tiling given with --tilings
        return r["impl"] + ("@{}x{}".format(*r["tiling"]) if r.get("tiling") else "")
    impls = []
    for i in IMPLS:
        impls += [x for x in dict.fromkeys(label(r) for r in rows if r["impl"] == i)]
    by = {}
    ps = lambda r: r.get("pass", "fwd")
    for r in rows:
        by[(ps(r), r["dtype"], r["d"], r["causal"], r["N"], label(r))] = r
    blocks = sorted({(ps(r), r["dtype"], r["d"], r["causal"]) for r in rows},
                    key=lambda k: (k[0] != "fwd", k[2], k[3], k[1] != "fp32"))
    short = {"torch_math": "t_math", "torch_efficient": "t_eff", "torch_flash": "t_flash",
             "fa2_kernel": "fa2_kern"}
    out = ["cells: ms_median/TFLOP/s ('skip': see JSON 'skipped')"]
    for (p, dt, d, c) in blocks:
        Ns = sorted({r["N"] for r in rows if (ps(r), r["dtype"], r["d"], r["causal"]) == (p, dt, d, c)})
        out.append(f"-- {p} {dt} d={d} {'causal' if c else 'non-causal'}")
        out.append(f"{'N':>6} " + "".join(f"{short.get(i, i):>14}" for i in impls))
        for N in Ns:
            out.append(f"{N:>6} " + "".join(f"{fmt_cell(by.get((p, dt, d, c, N, i))):>14}"
                                             for i in impls))
    reasons = {}
    for r in rows:
        if r.get("skipped"):
            key = re.sub(r"[\d.]+", "#", r["skipped"])[:90]
            reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        out.append("skipped rows by reason:")
        out += [f"  {n:>4} x {k}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    errs = {}
    for r in rows:
        if r.get("rel_err") is not None:
            errs[(r["impl"], r["dtype"])] = max(errs.get((r["impl"], r["dtype"]), 0.0), r["rel_err"])
    if errs:
        out.append("max rel_err: " + ", ".join(f"{i}/{dt} {e:.1e}" for (i, dt), e in sorted(errs.items())))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Entry point of `flashsim bench` (the forward sweep)
# ---------------------------------------------------------------------------------------
def run_bench(*, seq_lens=SEQ_LENS, head_dims=HEAD_DIMS, dtypes=DTYPES, causal="both",
              impls=IMPLS, batch_heads=16, passes=("fwd",), opts: Options | None = None, out=None,
              backend=None, log=print, progress: bool | None = None,
              tilings=(None,)) -> tuple[Path, list[dict]]:
    """Run the sweep on the real GPU (or the given backend); returns (path, rows made).
    progress: a status line on stderr (analysis.progress; None: only on a terminal).
    tilings: (B_r, B_c) pairs (None: the default) the Numba kernels run at."""
    if isinstance(batch_heads, bool) or not isinstance(batch_heads, int) or batch_heads <= 0:
        raise ValueError(f"batch_heads={batch_heads!r} is not allowed; allowed: positive integers")
    opts = opts or Options()
    for ps in passes:
        if ps not in PASSES:
            raise ValueError(f"pass={ps!r} is not allowed; allowed: {', '.join(PASSES)}")
    points = sweep(seq_lens, head_dims, dtypes, parse_causal(causal), impls, batch_heads,
                   tuple(passes), tuple(tilings))
    backend = backend or TorchBackend()
    device = backend.device_name
    path = Path(out) if out else default_results_path(device)
    results = ResultFile(path)
    meta = {"date": _dt.date.today().isoformat(), "device": device,
            "versions": versions() if isinstance(backend, TorchBackend) else {}}
    run_id = new_run_id()
    log(f"flashsim bench: {len(points)} points on {device}, results -> {path} (run {run_id})")
    from analysis.progress import Progress
    todo = sum(1 for p in points if p.key() not in results.done_keys())
    with Progress(todo, "bench", show=progress) as bar:
        made = run_sweep(points, backend, results, opts, run_id=run_id, meta=meta,
                         log=bar.write if log is print else log,
                         on_point=lambda row: bar.update(
                             note=f"{row['impl']} {row['dtype']} N={row['N']} d={row['d']}"))
    return path, made
