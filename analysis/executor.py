"""Executors: where a sweep's points are evaluated.

`analysis.sweeps.run_sweep(points, path, evaluate, executor=...)` hands the points still
to do to an executor's `map`, which yields their rows as they are made; run_sweep alone
writes the file (same format, resume, retry and de-duplication rules whatever the
executor). Two executors:

  local  in this process, one point after another (the default; today's behaviour).
  ray    Ray tasks on a Ray cluster: an existing one (`address`: "auto", "host:port" or
         "ray://host:port") or, with no address, a local one started for the sweep and
         shut down after it. One task per group of points: kernel points are grouped by
         the compiled kernel they share (algorithm, d, dtype, causal, B_r, B_c, block
         mask or not), so a worker compiles each kernel once; groups are cut so that
         there are at least as many tasks as slots (GPUs for kernel points, CPUs for
         model points). A kernel task asks for one GPU (num_gpus=1; Ray then sets
         CUDA_VISIBLE_DEVICES), or for one CPU where the kernels run in Numba's CUDA
         simulator (NUMBA_ENABLE_CUDASIM=1 in the driver's environment, or no GPU here
         when Ray starts a local cluster; the variable reaches the workers through the
         task's runtime_env). A GPU task runs in a fresh worker process (Ray's rule for
         them), which pays process start, imports and compilation once per task: hence
         the grouping. A model task asks for one CPU. Tasks are streaming
         generators: each row comes back as soon as it is made, so a lost worker loses no
         finished row; Ray retries a task whose worker died (max_retries), and rows a
         retry makes again are dropped by run_sweep. A task that still fails gives error
         rows for its points (evaluated again on the next run).

`Executor` (the interface) and `LocalExecutor` live in analysis.executor_base, which
analysis.sweeps uses; this module (which needs the sweep points: `kernel_group`) adds Ray.

Ray is an optional extra (pip install -e '.[ray]'): only `RayExecutor.start` imports it.
Each executor keeps `stats` (points, tasks, seconds) and `stats_line()` describes them,
for measuring the overhead per point of one executor against another.
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable

from iosim import ConfigError

from .executor_base import Executor, LocalExecutor

EXECUTORS = ("local", "ray")
RAY_EXTRA = "pip install -e '.[ray]'"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kernel_group(point: dict) -> tuple:
    """What a kernel point's compiled kernel depends on: points with equal groups reuse
    one build in a worker (N, batch and heads are launch arguments, not constants)."""
    from .sweeps import build
    try:
        _, tiling = build(point)
    except Exception:            # the point fails on its own; it is a group of one
        from .sweeps import point_key
        return ("error", point_key(point))
    return (point["algorithm"], point["d"], point["dtype"], point["causal"], tiling.B_r,
            tiling.B_c, point["sparsity"] != 1.0)


def task_chunks(points: list[dict], backend: str | None, slots: int,
                points_per_task: int | None = None,
                group: Callable[[dict], object] | None = None) -> list[list[dict]]:
    """The points cut into tasks: kernel points grouped by `kernel_group` (others: one
    group), each group cut into pieces of `points_per_task` points (default: all points
    over `slots`, rounded up, so there are at least `slots` tasks where there are as many
    points)."""
    if group is None:
        group = kernel_group if backend == "kernel" else (lambda p: None)
    groups: dict = {}
    for p in points:
        groups.setdefault(group(p), []).append(p)
    size = points_per_task or max(1, math.ceil(len(points) / max(1, slots)))
    return [g[i:i + size] for g in groups.values() for i in range(0, len(g), size)]


def _ray_task(work, points):
    """Body of a Ray task (a streaming generator): one row per point, as it is made,
    each naming the Ray node that made it."""
    import ray
    node = ray.get_runtime_context().get_node_id()
    for full in points:
        row = work(full)
        row.setdefault("where", {})["ray_node"] = node
        yield row


class RayExecutor(Executor):
    """Ray tasks on a Ray cluster (module docstring). `address`: "auto", "host:port" or
    "ray://host:port" of an existing cluster; None starts a local cluster (shut down by
    `close`). If Ray is already initialised in this process, that cluster is used as it
    is. `points_per_task`: see `task_chunks`. `max_retries`: how often Ray re-runs a task
    whose worker died."""

    name = "ray"

    def __init__(self, address: str | None = None, *, points_per_task: int | None = None,
                 max_retries: int = 3, init_kwargs: dict | None = None):
        super().__init__()
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ConfigError(f"--address={address!r} is not allowed; allowed: auto, "
                              f"HOST:PORT or ray://HOST:PORT of a Ray cluster, or none to "
                              f"start a local one")
        if points_per_task is not None and (isinstance(points_per_task, bool)
                                            or not isinstance(points_per_task, int)
                                            or points_per_task <= 0):
            raise ConfigError(f"points_per_task={points_per_task!r} is not allowed; "
                              f"allowed: positive integers or None")
        self.address, self.points_per_task, self.max_retries = address, points_per_task, max_retries
        self.init_kwargs = dict(init_kwargs or {})
        self.ray = None
        self.owned = False

    @property
    def local(self) -> bool:
        """The cluster runs on this machine (started here): workers see this checkout."""
        return self.address is None

    def start(self) -> None:
        if self.ray is not None:
            return
        ray = import_ray()
        t0 = time.perf_counter()
        if not ray.is_initialized():
            kw = {"address": self.address or "local", "logging_level": "WARNING",
                  **self.init_kwargs}
            if self.local:
                kw.setdefault("include_dashboard", False)
            try:
                ray.init(**kw)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                if self.address is None:
                    raise ConfigError(f"--executor ray could not start a local Ray cluster "
                                      f"({why})") from None
                raise ConfigError(f"--address={self.address!r}: no Ray cluster found there "
                                  f"({why}); start one with `ray start --head` or leave "
                                  f"--address out to start a local one") from None
            self.owned = True
        self.ray = ray
        self.stats["startup_s"] += time.perf_counter() - t0

    def close(self) -> None:
        if self.ray is not None and self.owned:
            self.ray.shutdown()
        self.ray, self.owned = None, False

    def _resources(self, backend) -> tuple[dict, dict, int]:
        """(task options, env_vars for the workers, slots)."""
        from .sweeps import has_cuda_gpu
        env = {}
        if self.local:   # a local cluster's workers import this very checkout
            env["PYTHONPATH"] = os.pathsep.join(
                [_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        total = self.ray.cluster_resources()
        if backend == "kernel":
            sim = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or (self.local and not has_cuda_gpu())
            if sim:
                env["NUMBA_ENABLE_CUDASIM"] = "1"
            else:
                gpus = int(total.get("GPU", 0))
                if gpus < 1:
                    raise ConfigError(
                        f"--executor ray --backend kernel: the Ray cluster at "
                        f"{self.address or 'this machine'} has no GPU (resources: "
                        f"{ {k: v for k, v in total.items() if '/' not in k and 'node:' not in k} }); "
                        f"kernel points ask for one GPU each. Set NUMBA_ENABLE_CUDASIM=1 to run "
                        f"them in Numba's CUDA simulator on CPUs")
                return {"num_gpus": 1, "num_cpus": 1}, env, gpus
        return {"num_cpus": 1}, env, max(1, int(total.get("CPU", 1)))

    def map(self, work, points, *, backend=None, lost=None, key=None, row_key=None,
            group=None):
        from .sweeps import point_key
        key = key or point_key
        row_key = row_key or (lambda row: row["key"])
        self.start()
        ray = self.ray
        points = list(points)
        if not points:
            return
        options, env, slots = self._resources(backend)
        if env:
            options["runtime_env"] = {"env_vars": env}
        # Resources in ray.remote itself (not .options): a GPU task then gets Ray's default
        # max_calls=1, a fresh worker per task, whose CUDA context is on the GPU Ray gave it
        # (a reused worker would keep its first GPU's context: ray-project/ray#29624).
        task = ray.remote(num_returns="streaming", max_retries=self.max_retries,
                          **options)(_ray_task)
        chunks = task_chunks(points, backend, slots, self.points_per_task, group)
        t0 = time.perf_counter()
        gens = {}
        try:
            for chunk in chunks:
                gens[task.remote(work, chunk)] = chunk
            self.stats["tasks"] += len(gens)
            received = {g: set() for g in gens}   # keys of the rows each task returned
            waiting = list(gens)
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=1)
                for g in ready:
                    try:
                        row = ray.get(next(g))
                    except StopIteration:
                        continue
                    except ray.exceptions.RayError as exc:   # retries spent: the rest is lost
                        why = " ".join(str(exc).split())[:300]
                        for full in gens[g]:
                            if key(full) in received[g]:
                                continue
                            msg = (f"ray task lost after {self.max_retries} retries: "
                                   f"{type(exc).__name__}: {why}")
                            row = lost(full, msg) if lost else None
                            if row is not None:
                                self._count(row)
                                yield row
                        continue
                    received[g].add(row_key(row))
                    self._count(row)
                    yield row
                    waiting.append(g)
        finally:
            self.stats["wall_s"] += time.perf_counter() - t0
            for g in gens:           # nothing left running after an interrupted driver
                try:
                    ray.cancel(g, force=True)
                except Exception:
                    pass


def import_ray():
    """The ray module, or ConfigError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--executor ray needs Ray, an optional extra: {RAY_EXTRA}") from None
    return ray


def make_executor(name: str = "local", address: str | None = None, **kw) -> Executor:
    """The executor called `name` ("local" or "ray"); ConfigError for another name, for
    an address with the local executor, and (ray) when Ray is not installed."""
    if name not in EXECUTORS:
        raise ConfigError(f"--executor={name!r} is not known; allowed: {', '.join(EXECUTORS)}")
    if name == "local":
        if address is not None:
            raise ConfigError(f"--address={address!r} is given with --executor local; "
                              f"--address names a Ray cluster: give it with --executor ray")
        return LocalExecutor()
    import_ray()
    return RayExecutor(address, **kw)


__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "RAY_EXTRA", "RayExecutor", "import_ray",
           "kernel_group", "make_executor", "task_chunks"]
