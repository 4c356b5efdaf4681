"""Sweeps: tidy rows (JSON lines), one per configuration, written as they are made.

Generate: `grid(**axes)` gives the cartesian product of parameter lists as dicts.
Process:  `run_sweep(points, path, evaluate)` evaluates each point and appends one JSON
          object per line, flushed at once. A killed sweep resumes where it stopped: points
          whose key is already in the file with the current `model_version` are skipped
          (rows of another version, and error rows unless retry_errors=False, are
          evaluated again; the new row supersedes the old, and the file is compacted to
          one row per key). A point that raises is
          recorded with status "error" and its message, and the sweep goes on. Only a
          sweep file (or an empty or absent one) is appended to; concurrent runs on one
          file lock it (fcntl.flock) and never write a point twice; `read_rows` keeps one
          row per key (the last).
Evaluate: `evaluate_model` (closed forms: instant) or `evaluate_kernel` (the gpu kernels:
          runtime and instrumented counts; needs `gpu`, a real GPU for timings).

Point parameters (every row carries all of them):
  algorithm  standard | fa1 | fa2
  N, d       sequence length, head dimension
  batch, heads
  dtype      fp16 | fp32
  causal     bool
  sram_bytes SRAM capacity M in BYTES (None: block_rows/block_cols must be given)
  block_rows, block_cols   B_r, B_c (None: the paper's rule from sram_bytes)
  sparsity   fraction s of nonzero blocks of a random block mask (1.0: dense)
  seed       seed of that mask
Every row also says how and where it was made: key, model_version, status (ok | error,
  with error), eval_seconds, made_at (UTC) and where (host, pid, commit, versions, and
  for kernel rows gpu, gpu_uuid, driver, cuda_driver_api; executor, ray_node): see
  `provenance`. WHERE_FIELDS are those that differ between two machines making one row.
Executors: `run_sweep(..., executor=analysis.executor.RayExecutor())` evaluates points
  on a Ray cluster; this process still writes the file alone (analysis/executor.py).
Row results (model): hbm_bytes / hbm_read_bytes / hbm_write_bytes (problem totals, bytes),
  hbm_elements_per_head, B_r, B_c, T_r, T_c, sram_footprint_bytes, fits_sram (footprint <=
  sram_bytes), M_elements, bound_elements_per_head (N^2 d^2 / M, constant 1).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import itertools
import json
import os
import time
from typing import Callable, Iterable

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: no locking
    fcntl = None

from iosim import (ALGORITHMS, ConfigError, Problem, Tiling, closed_form, resolve_tiling,
                   sram_footprint_bytes, sram_to_elements)
from iosim.problem import check_dtype

from .paths import check_out_file

DEFAULTS = {"algorithm": "fa1", "N": 1024, "d": 64, "batch": 1, "heads": 1, "dtype": "fp16",
            "causal": False, "sram_bytes": None, "block_rows": None, "block_cols": None,
            "sparsity": 1.0, "seed": 0}


# ---------------------------------------------------------------------------------------
# GPU detection (without importing numba.cuda)
# ---------------------------------------------------------------------------------------
# has_cuda_gpu(): whether libcuda reports a device; ensure_cuda_env(): the simulator where
# none is. Both live in gpu._env (standard library only: importing it loads no numba).
from gpu._env import ensure_cuda_env, has_cuda_gpu  # noqa: E402,F401


def import_gpu():
    """(gpu module, None) or (None, reason) — never raises."""
    ensure_cuda_env()
    try:
        import gpu  # noqa: F401
        if not hasattr(gpu, "attention"):
            return None, "gpu package has no attention() entry point yet"
        return gpu, None
    except Exception as exc:  # missing package, numba-cuda failure...
        return None, f"gpu package not importable: {type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------
# Generate
# ---------------------------------------------------------------------------------------
def grid(**axes) -> list[dict]:
    """Cartesian product of parameter lists, missing parameters from DEFAULTS.

    grid(algorithm=["fa1", "fa2"], N=[512, 1024], sram_bytes=[65536]) -> 4 points.
    Scalars are accepted as one-element lists. Unknown names raise ConfigError.
    """
    unknown = set(axes) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"sweep parameter(s) {sorted(unknown)} not known; allowed: "
                          f"{', '.join(DEFAULTS)}")
    names = list(DEFAULTS)
    lists = [axes[n] if isinstance(axes.get(n), (list, tuple)) else [axes.get(n, DEFAULTS[n])]
             for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*lists)]


def normalise(params: dict) -> dict:
    """A point with DEFAULTS filled in and every value in canonical form (dtype aliases
    `half`, `float16` -> `fp16`; NumPy integers -> int; sparsity -> float), so that equal
    points get equal keys. ConfigError naming the parameter for a value not allowed."""
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"sweep parameter(s) {sorted(unknown)} not known; allowed: "
                          f"{', '.join(DEFAULTS)}")
    p = {**DEFAULTS, **params}
    if p["algorithm"] not in ALGORITHMS:
        raise ConfigError(f"algorithm={p['algorithm']!r} is not known; allowed: {', '.join(ALGORITHMS)}")

    def integer(name, value, *, optional=False, positive=True):
        if value is None and optional:
            return None
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or (positive and value <= 0):
            allowed = "positive integers" if positive else "integers"
            raise ConfigError(f"{name}={value!r} is not allowed; allowed: {allowed}"
                              + (" or None" if optional else ""))
        return int(value)

    for name in ("N", "d", "batch", "heads"):
        p[name] = integer(name, p[name])
    for name in ("sram_bytes", "block_rows", "block_cols"):
        p[name] = integer(name, p[name], optional=True)
    p["seed"] = integer("seed", p["seed"], positive=False)
    p["dtype"] = check_dtype(p["dtype"])
    if not isinstance(p["causal"], (bool, np.bool_)):
        raise ConfigError(f"causal={p['causal']!r} is not allowed; allowed: True, False")
    p["causal"] = bool(p["causal"])
    sp = p["sparsity"]
    if isinstance(sp, (bool, np.bool_)) or not isinstance(sp, (int, float, np.integer, np.floating)) \
            or not 0 < sp <= 1:
        raise ConfigError(f"sparsity={sp!r} is not allowed; allowed: numbers in (0, 1]")
    p["sparsity"] = float(sp)
    if (p["block_rows"] is None) != (p["block_cols"] is None):
        raise ConfigError(f"block_rows={p['block_rows']!r} and block_cols={p['block_cols']!r}: "
                          f"give both or neither")
    return p


def point_key(params: dict) -> str:
    """Canonical identity of a point: its normalised parameters as sorted JSON."""
    full = normalise(params)
    return json.dumps({k: full[k] for k in sorted(DEFAULTS)}, sort_keys=True)


# ---------------------------------------------------------------------------------------
# Model version: a row is reused only if the code that made it is unchanged
# ---------------------------------------------------------------------------------------
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Source files whose content makes a row, per backend (globs relative to the project).
VERSION_SOURCES = {"model": ("iosim/**/*.py", "iosim/**/*.json", "analysis/sweeps.py"),
                   "kernel": ("iosim/**/*.py", "iosim/**/*.json", "analysis/sweeps.py",
                              "gpu/**/*.py", "gpu/**/*.cu", "gpu/**/*.cuh")}
_version_cache: dict = {}


def model_version(backend: str = "model") -> str:
    """sha256 (16 hex digits) over the source files of the model that produces `backend`'s
    rows (VERSION_SOURCES): any edit there makes earlier rows stale."""
    if backend not in VERSION_SOURCES:
        raise ConfigError(f"backend={backend!r} is not known; allowed: {', '.join(VERSION_SOURCES)}")
    if backend not in _version_cache:
        import glob
        h = hashlib.sha256()
        for pattern in VERSION_SOURCES[backend]:
            for f in sorted(glob.glob(os.path.join(_ROOT, pattern), recursive=True)):
                h.update(os.path.relpath(f, _ROOT).encode() + b"\0")
                with open(f, "rb") as fh:
                    h.update(fh.read() + b"\0")
        _version_cache[backend] = h.hexdigest()[:16]
    return _version_cache[backend]


# ---------------------------------------------------------------------------------------
# Process
# ---------------------------------------------------------------------------------------
#: Keys every sweep row has (a file of such rows, one per line, is a sweep file).
ROW_KEYS = frozenset(DEFAULTS) | {"key", "status"}


class SweepFileError(ValueError):
    """--out names a file that is not a sweep file (one line, naming the path)."""


def is_sweep_row(row) -> bool:
    return isinstance(row, dict) and ROW_KEYS <= row.keys()


def read_rows(path) -> list[dict]:
    """The rows of a sweep file, one per point: where a key occurs more than once (a
    recomputed stale or error row, or a file written by concurrent runs before they were
    locked) the last valid row wins, at the place of the first. Lines that are not sweep
    rows and a torn last line are ignored."""
    rows: dict = {}
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break  # torn write of a killed run
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if is_sweep_row(row):
                rows[row["key"]] = row
    return list(rows.values())


def pending(points, path) -> int:
    """How many of a sweep's `points` are not yet in its JSON-lines file `path` (what
    run_sweep will evaluate, unless rows of the file are stale or errors: it also
    evaluates those again; its own status line counts them)."""
    seen = {r.get("key") for r in read_rows(path)} if os.path.exists(path) else set()
    return sum(1 for p in points if point_key({**DEFAULTS, **p}) not in seen)


def _parse_line(line: bytes, path: str, where: str) -> dict:
    try:
        row = json.loads(line)
    except ValueError:
        row = None
    if not is_sweep_row(row):
        raise SweepFileError(f"--out {path!r} is not a sweep file ({where} is not a JSON row with "
                             f"the sweep keys); give a new file or an earlier sweep's file")
    return row


def _repair(f, path: str) -> None:
    """Check that the open file is a sweep file and repair its tail (caller holds the lock):
    a last line without its newline is a torn write of a killed run and is dropped, unless
    it is a whole row, which gets its newline. Anything else: SweepFileError."""
    f.seek(0)
    data = f.read()
    if not data:
        return
    lines = data.split(b"\n")
    tail = lines.pop()                       # b"" when the file ends with a newline
    for n, line in enumerate(lines, 1):
        _parse_line(line, path, f"line {n}")
    if not tail:
        return
    try:
        whole = json.loads(tail)
    except ValueError:
        whole = None
    if is_sweep_row(whole):
        f.seek(0, os.SEEK_END)
        f.write(b"\n")
        f.flush()
    elif tail.lstrip().startswith(b"{") and whole is None:
        f.truncate(len(data) - len(tail))    # torn: a row cut short
    else:
        _parse_line(tail, path, f"line {len(lines) + 1}")


class _SweepFile:
    """An open sweep file shared with concurrent runs.

    `locked()` holds an exclusive flock on it (fcntl; none where that is missing) and
    first reads what other runs appended since (`rows`: the last row per key). A file
    may be replaced by its compacted copy (os.replace) while others have it open: after
    taking the lock, a run checks that the path still names the file it locked, and
    otherwise opens the new one and reads it from the start, so nothing is ever appended
    to a replaced file.
    """

    def __init__(self, path: str):
        self.path, self.f = path, None

    def _open(self):
        self.f = open(self.path, "a+b")
        self.pos, self.lines, self.rows = 0, 0, {}

    def close(self):
        if self.f is not None:
            self.f.close()
            self.f = None

    def _flock(self, op):
        if fcntl is not None:
            fcntl.flock(self.f.fileno(), op)

    @contextlib.contextmanager
    def locked(self):
        while True:
            if self.f is None:
                self._open()
            self._flock(fcntl.LOCK_EX if fcntl else 0)
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                st = None
            mine = os.fstat(self.f.fileno())
            if st is not None and (st.st_ino, st.st_dev) == (mine.st_ino, mine.st_dev):
                break
            self._flock(fcntl.LOCK_UN if fcntl else 0)   # replaced or removed: reopen
            self.close()
        try:
            yield self
        finally:
            if self.f is not None:
                self._flock(fcntl.LOCK_UN if fcntl else 0)

    def repair(self):
        """Check the file is a sweep file and repair its tail (see `_repair`); lock held."""
        _repair(self.f, self.path)
        self.pos, self.lines, self.rows = 0, 0, {}

    def update(self):
        """Read the complete lines appended since the last call (lock held)."""
        self.f.seek(self.pos)
        data = self.f.read()
        end = data.rfind(b"\n") + 1
        for line in data[:end].split(b"\n")[:-1]:
            row = _parse_line(line, self.path, f"a row at byte {self.pos}")
            self.rows[row["key"]] = row
            self.lines += 1
        self.pos += end

    def append(self, row: dict):
        """Append one row (lock held, after `update`)."""
        self.f.seek(0, os.SEEK_END)
        self.f.write((json.dumps(row, default=_jsonable) + "\n").encode())
        self.f.flush()
        self.pos = self.f.tell()
        self.lines += 1
        self.rows[row["key"]] = row

    def compact(self):
        """Where a key has more than one row (a superseded stale or error row), replace
        the file by one holding the last row of each key, in first-appearance order
        (lock held; the file is then closed, the next `locked()` opens the new one)."""
        if self.lines <= len(self.rows):
            return
        tmp = f"{self.path}.{os.getpid()}.compact"
        try:
            with open(tmp, "wb") as out:
                for row in self.rows.values():
                    out.write((json.dumps(row, default=_jsonable) + "\n").encode())
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        self._flock(fcntl.LOCK_UN if fcntl else 0)
        self.close()


def run_sweep(points: Iterable[dict], path, evaluate: Callable[[dict], dict], *,
              progress: Callable[[str], None] | None = None, retry_errors: bool = True,
              version: str | None = None, executor=None, backend: str | None = None,
              show_progress: bool | None = None) -> dict:
    """Evaluate every point without a current row in `path`, appending one JSON row each.

    Every point is normalised and checked first (ConfigError before any work). `path`
    must be absent, empty or a sweep file (else SweepFileError, nothing written); a torn
    last line is repaired. A row is reused only if its model_version equals `version`
    (default `model_version('kernel')` for evaluate_kernel, else `model_version('model')`)
    and it is ok, or an error row with retry_errors=False; otherwise the point is
    evaluated again and its new row supersedes the old one: at the end the file is
    compacted to one row per key. Concurrent runs on one file are safe: each reads the
    rows the others appended and appends under an exclusive lock (fcntl.flock), so a
    point is written once.

    `executor` (analysis.executor; default: LocalExecutor, in this process, one point
    after another) says where points are evaluated; wherever that is, this process alone
    writes the file, each row as it comes back, under the rules above, so an interrupted
    sweep keeps every row it received and a rerun evaluates only what is missing.
    `backend` ("model" or "kernel"; default: that of evaluate_model / evaluate_kernel)
    names what `evaluate` computes when it wraps one of them: it picks the default
    `version`, the device fields of the rows' `where` and the executor's resources.

    Returns {"done": newly written, "skipped": reused, "errors": new error rows}.
    An exception from `evaluate` becomes a row with status "error" and its message; a
    KeyboardInterrupt/SystemExit stops the sweep (rows so far are kept: a re-run resumes).

    `progress(message)` is called after each row written ("STATUS KEY"). `show_progress`:
    a status line on stderr (analysis.progress: points done / the points to evaluate,
    elapsed, time left, the point running), on a terminal only, never with CI set; None
    (default): shown when no `progress` callback is given (a caller with a callback draws
    its own), False: never.
    """
    from .executor_base import LocalExecutor
    from .progress import Progress
    pts = [normalise(p) for p in points]
    path = check_out_file(path)
    if backend is None:
        backend = {evaluate_kernel: "kernel", evaluate_model: "model"}.get(evaluate)
    elif backend not in VERSION_SOURCES:
        raise ConfigError(f"backend={backend!r} is not known; allowed: {', '.join(VERSION_SOURCES)}")
    check_version = version is None and backend is not None
    if version is None:
        version = model_version(backend or "model")
    executor = LocalExecutor() if executor is None else executor
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    counts = {"done": 0, "skipped": 0, "errors": 0}

    def reusable(row):
        return (row is not None and row.get("model_version") == version
                and (row["status"] == "ok" or (row["status"] == "error" and not retry_errors)))

    sf = _SweepFile(path)
    bar = Progress(None, "sweep", show=False if show_progress is False or (
        show_progress is None and progress is not None) else None)
    pending: set = set()          # keys of the points to evaluate, as the file stood

    def todo():
        """The points still to evaluate, each checked against the file (re-read under
        the lock) just before it is handed out: a lazy executor skips what a concurrent
        run wrote meanwhile."""
        for full in pts:
            with sf.locked():
                sf.update()
                row = sf.rows.get(point_key(full))
            if reusable(row):
                counts["skipped"] += 1
                key = point_key(full)
                if key in pending and key not in written:   # a concurrent run made it
                    bar.total -= 1
                continue
            bar.set_note(point_label(full))
            yield full

    work = functools.partial(evaluate_point, evaluate, version=version, backend=backend,
                             check_version=check_version)

    def lost(full: dict, message: str) -> dict:       # a point whose worker never answered
        return evaluate_point(_Fail(message), full, version=version, backend=None)

    written: set = set()
    try:
        with sf.locked():
            sf.repair()
            sf.update()
            pending.update(k for k in map(point_key, pts) if not reusable(sf.rows.get(k)))
            sf.compact()
        bar.total = len(pending)
        bar.start()
        # closing(): an interrupted driver stops the executor's outstanding work at once
        with contextlib.closing(executor.map(work, todo(), backend=backend, lost=lost)) as rows:
            for row in rows:
                key = row["key"]
                if key in written:                  # a retried task's repeat: written already
                    continue
                row.setdefault("where", {})["executor"] = executor.name
                with sf.locked():
                    sf.update()
                    if reusable(sf.rows.get(key)):  # another run wrote it meanwhile
                        counts["skipped"] += 1
                        if key in pending:
                            bar.total -= 1
                        continue
                    sf.append(row)
                written.add(key)
                counts["errors"] += row["status"] == "error"
                counts["done"] += 1
                bar.update(note=None if executor.name == "local" else point_label(row))
                if progress:
                    progress(f"{row['status']:5s} {key}")
        with sf.locked():
            sf.update()
            sf.compact()
    finally:
        bar.close()
        sf.close()
    return counts


def point_label(p: dict) -> str:
    """A short name of a sweep point, for status lines: 'fa2 N=1024 d=64 fp16 causal
    B=1 H=16 64x64 s=0.5'."""
    text = f"{p['algorithm']} N={p['N']} d={p['d']} {p['dtype']}"
    if p.get("causal"):
        text += " causal"
    text += f" B={p['batch']} H={p['heads']}"
    if p.get("block_rows"):
        text += f" {p['block_rows']}x{p['block_cols']}"
    elif p.get("sram_bytes"):
        text += f" M={p['sram_bytes']}B"
    if p.get("sparsity", 1.0) != 1.0:
        text += f" s={p['sparsity']:g}"
    return text


def evaluate_point(evaluate: Callable[[dict], dict], full: dict, *, version: str,
                   backend: str | None = None, check_version: bool = False) -> dict:
    """The sweep row of one normalised point: its parameters, key, model_version, status
    ("ok" with `evaluate`'s results, or "error" with the exception's message), the
    seconds `evaluate` took (eval_seconds), when (made_at, UTC) and where it was made
    (`where`: see `provenance`). Runs wherever the executor puts it (a Ray worker on
    another host too), so everything that says where is taken here.

    check_version: the row is an error unless this process's model_version(backend)
    equals `version` (a node of a cluster running other code must not pass its rows off
    as the driver's)."""
    key = point_key(full)
    t0 = time.perf_counter()
    try:
        here = model_version(backend) if check_version else version
        if here != version:
            raise RuntimeError(f"this node runs model version {here}, the driver {version}: "
                               f"install the same flashsim commit on every node")
        result = evaluate(full)
        row = {**full, "key": key, "model_version": version, "status": "ok", **result}
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        row = {**full, "key": key, "model_version": version, "status": "error",
               "error": f"{type(exc).__name__}: {exc}"}
    row["eval_seconds"] = round(time.perf_counter() - t0, 6)
    row["made_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    row["where"] = provenance(backend)
    return row


class _Fail:
    """An evaluate that raises RuntimeError(message): the error row of a lost point."""

    def __init__(self, message: str):
        self.message = message

    def __call__(self, full: dict) -> dict:
        raise RuntimeError(self.message)


#: Row fields that say where and when a row was made, not what it says (rows of one point
#: made on two machines differ only there).
WHERE_FIELDS = ("where", "made_at", "eval_seconds")
_prov_cache: dict = {}


def provenance(backend: str | None = None) -> dict:
    """Where this process makes rows: host, pid, commit and versions (python, numpy,
    numba, numba-cuda, ray where imported); for kernel rows also the device: gpu (the
    driver's name, or "Numba CUDA simulator"), gpu_uuid, driver (the NVIDIA driver) and
    cuda_driver_api. Model rows name no GPU (the closed forms use none). Cached per
    process; a row's copy is its own."""
    import platform
    import socket
    import sys
    pid = os.getpid()
    if (pid, "base") not in _prov_cache:
        from importlib import metadata
        from .results import current_commit
        versions = {"python": sys.version.split()[0], "numpy": np.__version__}
        for name in ("numba", "numba-cuda", "ray"):
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = None
        _prov_cache[(pid, "base")] = {"host": socket.gethostname(), "pid": pid,
                                      "platform": platform.platform(),
                                      "commit": current_commit(), "versions": versions}
    where = {**_prov_cache[(pid, "base")]}
    where["versions"] = dict(where["versions"])
    if backend == "kernel":
        if (pid, "gpu") not in _prov_cache:
            _prov_cache[(pid, "gpu")] = _device_info()
        where.update(_prov_cache[(pid, "gpu")])
    else:
        where.update(gpu=None, gpu_uuid=None, driver=None, cuda_driver_api=None)
    return where


def _device_info() -> dict:
    """The current CUDA device as numba.cuda sees it (Ray sets CUDA_VISIBLE_DEVICES to
    the GPU it gave the task, so this is that GPU)."""
    info = {"gpu": None, "gpu_uuid": None, "driver": None, "cuda_driver_api": None}
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        info["gpu"] = "Numba CUDA simulator"
        return info
    try:
        from numba import cuda
        from numba.cuda.cudadrv.driver import driver
        dev = cuda.get_current_device()
        name = dev.name
        info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        info["gpu_uuid"] = str(dev.uuid)
        info["cuda_driver_api"] = ".".join(str(x) for x in driver.get_version())
    except Exception as exc:
        info["gpu"] = f"unknown ({type(exc).__name__}: {exc})"
        return info
    import subprocess
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                            "-i", info["gpu_uuid"]], capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            info["driver"] = r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def _jsonable(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


# ---------------------------------------------------------------------------------------
# Evaluate
# ---------------------------------------------------------------------------------------
def random_block_mask(T_r: int, T_c: int, sparsity: float, seed: int) -> np.ndarray:
    """A (T_r, T_c) boolean mask with exactly round(sparsity T_r T_c) True tiles (>= 1)."""
    if not 0 < sparsity <= 1:
        raise ConfigError(f"sparsity={sparsity!r} must be in (0, 1]")
    k = max(1, int(round(sparsity * T_r * T_c)))
    flat = np.zeros(T_r * T_c, dtype=bool)
    flat[np.random.default_rng(seed).choice(T_r * T_c, size=k, replace=False)] = True
    return flat.reshape(T_r, T_c)


def build(params: dict) -> tuple[Problem, Tiling]:
    """The Problem and Tiling of a point (paper's rule when blocks are not given)."""
    p = {**DEFAULTS, **params}
    if p["algorithm"] not in ALGORITHMS:
        raise ConfigError(f"algorithm={p['algorithm']!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    tiling = resolve_tiling(p["algorithm"], p["d"], p["dtype"], block_rows=p["block_rows"],
                            block_cols=p["block_cols"], sram_bytes=p["sram_bytes"])
    mask = None
    if p["sparsity"] != 1.0:
        mask = random_block_mask(tiling.T_r(p["N"]), tiling.T_c(p["N"]), float(p["sparsity"]),
                                 int(p["seed"]))
    problem = Problem(N=p["N"], d=p["d"], batch=p["batch"], heads=p["heads"], dtype=p["dtype"],
                      causal=p["causal"], block_mask=mask)
    return problem, tiling


def model_row(problem: Problem, tiling: Tiling, algorithm: str, sram_bytes) -> dict:
    led = closed_form(algorithm, problem, tiling)
    fp = sram_footprint_bytes(algorithm, tiling.B_r, tiling.B_c, problem.d, problem.dtype)
    row = {"B_r": tiling.B_r, "B_c": tiling.B_c, "T_r": tiling.T_r(problem.N),
           "T_c": tiling.T_c(problem.N), "hbm_bytes": led.hbm_bytes,
           "hbm_read_bytes": led.hbm_read_bytes, "hbm_write_bytes": led.hbm_write_bytes,
           "hbm_elements_per_head": (led.read_elements + led.write_elements) / problem.instances,
           "sram_footprint_bytes": fp}
    if sram_bytes:
        M = sram_to_elements(sram_bytes, problem.dtype)
        row.update(M_elements=M, fits_sram=fp <= sram_bytes,
                   bound_elements_per_head=problem.N ** 2 * problem.d ** 2 / M)
    return row


def evaluate_model(params: dict) -> dict:
    """Closed-form traffic of one point (see module docstring for the row fields)."""
    problem, tiling = build(params)
    return model_row(problem, tiling, params["algorithm"], params.get("sram_bytes"))


def run_kernel(gpu, algorithm: str, problem: Problem, tiling: Tiling, q, k, v, *,
               count_traffic: bool):
    """Call gpu.attention and return (O as numpy, iosim Ledger or None).

    The one place that knows gpu.attention's calling convention; tolerant of it returning
    O alone, (O, ledger) or an object with .O / .ledger.
    """
    out = gpu.attention(q, k, v, algorithm=algorithm, block_rows=tiling.B_r,
                        block_cols=tiling.B_c, causal=problem.causal,
                        block_mask=problem.block_mask, count_traffic=count_traffic,
                        poison=True)   # validation: an unwritten element shows as NaN
    ledger = None
    if isinstance(out, tuple):
        O = out[0]
        ledger = out[1] if len(out) > 1 else None
    elif hasattr(out, "O"):
        O, ledger = out.O, getattr(out, "ledger", None)
    else:
        O = out
    if hasattr(O, "copy_to_host"):
        O = O.copy_to_host()
    return np.asarray(O), ledger


def evaluate_kernel(params: dict, *, repeats: int = 3) -> dict:
    """Model row plus the kernel's instrumented counts and runtime at one point.

    Counts: one launch with count_traffic=True; `counts_match` says whether the kernel's
    ledger equals the model's, tensor by tensor. Runtime: `repeats` launches without
    counting on device-resident inputs, after one warm-up launch; wall-clock around each
    (synchronised), median in seconds. It includes gpu.attention's host work and output
    allocation (no NaN fill: these calls run outside poison mode). Only on a real GPU (the simulator's time
    means nothing and is not recorded).
    """
    from iosim import random_inputs, reference_attention
    gpu, why = import_gpu()
    if gpu is None:
        raise RuntimeError(why)
    problem, tiling = build(params)
    row = model_row(problem, tiling, params["algorithm"], params.get("sram_bytes"))
    q, k, v = random_inputs(problem, seed=int(params.get("seed", 0)))
    O, ledger = run_kernel(gpu, params["algorithm"], problem, tiling, q, k, v, count_traffic=True)
    ref = reference_attention(q, k, v, causal=problem.causal, block_mask=problem.block_mask,
                              B_r=tiling.B_r, B_c=tiling.B_c)
    row["max_abs_err"] = float(np.max(np.abs(O.astype(np.float64) - ref)))
    model = closed_form(params["algorithm"], problem, tiling)
    if ledger is not None:
        row["kernel_hbm_bytes"] = ledger.hbm_bytes
        row["counts_match"] = ledger.counts() == model.counts()
    if has_cuda_gpu():
        from numba import cuda
        qd, kd, vd = (cuda.to_device(x) for x in (q, k, v))  # time kernels, not transfers
        kw = dict(algorithm=params["algorithm"], block_rows=tiling.B_r, block_cols=tiling.B_c,
                  causal=problem.causal, block_mask=problem.block_mask)
        gpu.attention(qd, kd, vd, **kw)  # compile the uninstrumented build
        times = []
        for _ in range(max(1, repeats)):
            cuda.synchronize()
            t0 = time.perf_counter()
            gpu.attention(qd, kd, vd, **kw)
            cuda.synchronize()
            times.append(time.perf_counter() - t0)
        row["runtime_s"] = float(np.median(times))
    return row


EVALUATORS = {"model": evaluate_model, "kernel": evaluate_kernel}

__all__ = ["DEFAULTS", "EVALUATORS", "ROW_KEYS", "SweepFileError", "WHERE_FIELDS",
           "build", "ensure_cuda_env", "evaluate_kernel", "evaluate_model",
           "evaluate_point", "grid", "has_cuda_gpu", "import_gpu", "is_sweep_row",
           "model_row", "model_version", "normalise", "pending", "point_key",
           "point_label", "provenance", "random_block_mask", "read_rows", "run_kernel",
           "run_sweep"]
