"""The executor interface and the in-process executor (`LocalExecutor`): what
analysis.sweeps.run_sweep hands a sweep's points to. analysis.executor adds the Ray
executor and re-exports these; its docstring describes both."""
from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator


class Executor:
    """Evaluates sweep points somewhere; `map` yields one row per point, in any order.

    map(work, points, backend=..., lost=...): `work(point) -> row` (picklable: it may
    run in another process or host); `points` is consumed lazily by the local executor
    (each is checked against the file just before it is evaluated) and at once by the
    ray executor; `backend` ("model", "kernel" or None for another evaluate) picks the
    resources; `lost(point, message) -> row` makes the error row of a point whose
    worker never answered.
    """

    name = "?"

    def __init__(self):
        self.stats = {"executor": self.name, "points": 0, "tasks": 0, "startup_s": 0.0,
                      "wall_s": 0.0, "eval_s": 0.0}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self) -> None:
        """Connect to whatever evaluates the points (nothing for local)."""

    def close(self) -> None:
        """Release what `start` took."""

    def map(self, work: Callable[[dict], dict], points: Iterable[dict], *,
            backend: str | None = None,
            lost: Callable[[dict, str], dict] | None = None,
            key: Callable[[dict], str] | None = None,
            row_key: Callable[[dict], str] | None = None,
            group: Callable[[dict], object] | None = None) -> Iterator[dict]:
        """`key(point)` / `row_key(row)`: a point's identity and that of the row made from
        it (defaults: a sweep point's `point_key` and the row's "key"); the ray executor
        uses them to tell which points of a lost task still have no row. `group(point)`:
        points of one group may share a task (default: `kernel_group` for kernel points)."""
        raise NotImplementedError

    def _count(self, row: dict) -> None:
        self.stats["points"] += 1
        self.stats["eval_s"] += float(row.get("eval_seconds") or 0.0)

    def stats_line(self) -> str:
        """One line: points, wall time from the first point handed out to the last row
        received (file writes included), the time the points' evaluate took, and per
        point the difference (what the executor adds; with several slots working at once
        it can be negative). Startup (connecting to or starting a cluster) is apart."""
        s = self.stats
        n = max(1, s["points"])
        return (f"executor {s['executor']}: {s['points']} points in {s['tasks']} tasks, "
                f"wall {s['wall_s']:.3f} s ({s['wall_s'] / n * 1e3:.1f} ms/point), "
                f"evaluate {s['eval_s']:.3f} s ({s['eval_s'] / n * 1e3:.1f} ms/point), "
                f"overhead {(s['wall_s'] - s['eval_s']) / n * 1e3:.1f} ms/point; "
                f"startup {s['startup_s']:.3f} s")


class LocalExecutor(Executor):
    """This process, one point after another, each taken from `points` only when the
    previous row has been written (so a concurrent run's rows are seen)."""

    name = "local"

    def map(self, work, points, *, backend=None, lost=None, key=None, row_key=None,
            group=None):
        t0 = time.perf_counter()
        try:
            for full in points:
                self.stats["tasks"] += 1
                row = work(full)
                self._count(row)
                yield row
        finally:
            self.stats["wall_s"] += time.perf_counter() - t0
