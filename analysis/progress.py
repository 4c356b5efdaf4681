"""Progress of long commands on a terminal: points done / total, elapsed, time left.

    from analysis.progress import Progress
    with Progress(total=len(points), label="sweep") as bar:
        for p in points:
            ...
            bar.update(note=str(p))          # or bar.set(done) for absolute counts

One status line on stderr, rewritten in place, only when stderr is a terminal and the
CI environment variable is unset (`enabled()`); otherwise silent, so logs and pipes stay
clean. The estimate of the time left is elapsed / done x (total - done).
"""
from __future__ import annotations

import os
import sys
import time


def enabled(stream=None) -> bool:
    """Whether progress is shown: `stream` (default stderr) is a TTY and CI is unset.
    FLASHSIM_PROGRESS=1 / 0 forces it on / off."""
    force = os.environ.get("FLASHSIM_PROGRESS")
    if force in ("0", "1"):
        return force == "1"
    stream = sys.stderr if stream is None else stream
    if os.environ.get("CI"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_seconds(s: float) -> str:
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def status_line(label: str, done: int, total: int | None, elapsed: float, note: str = "") -> str:
    """'sweep: 12/40 points, 3 s elapsed, ~7 s left  fa2 N=1024' (no estimate before the
    first point is done or when the total is unknown)."""
    if total:
        text = f"{label}: {done}/{total} points, {format_seconds(elapsed)} elapsed"
        if 0 < done < total:
            text += f", ~{format_seconds(elapsed / done * (total - done))} left"
    else:
        text = f"{label}: {done} points, {format_seconds(elapsed)} elapsed"
    if note:
        text += f"  {note}"
    return text


def pending(points, path) -> int:
    """How many of a sweep's `points` are not yet in its JSON-lines file `path` (what
    analysis.sweeps.run_sweep will evaluate: it skips a point whose key is there)."""
    import os
    from analysis.sweeps import DEFAULTS, point_key, read_rows
    seen = {r.get("key") for r in read_rows(path)} if os.path.exists(path) else set()
    return sum(1 for p in points if point_key({**DEFAULTS, **p}) not in seen)


class Progress:
    """A status line for `total` points (module docstring); a no-op when not enabled."""

    def __init__(self, total: int | None, label: str, stream=None, show: bool | None = None,
                 clock=time.monotonic, width: int = 100):
        self.total, self.label, self.clock, self.width = total, label, clock, width
        self.stream = sys.stderr if stream is None else stream
        self.show = enabled(self.stream) if show is None else show
        self.done = 0
        self.t0 = clock()
        self._drawn = False

    def line(self, note: str = "") -> str:
        return status_line(self.label, self.done, self.total, self.clock() - self.t0, note)

    def _draw(self, note: str) -> None:
        if not self.show:
            return
        text = self.line(note)[: self.width]
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self._drawn = True

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        self._draw(note)

    def set(self, done: int, note: str = "") -> None:
        self.done = done
        self._draw(note)

    def write(self, text: str) -> None:
        """Print a line above the status line (which is redrawn after it)."""
        if self.show and self._drawn:
            self.stream.write("\r" + " " * self.width + "\r")
        print(text, flush=True)
        if self.show and self._drawn:
            self._draw("")

    def close(self) -> None:
        if self.show and self._drawn:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self._drawn = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
