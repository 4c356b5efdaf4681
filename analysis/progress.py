"""Progress of long commands on a terminal: points done / total, elapsed, time left.

    from analysis.progress import Progress
    with Progress(total=len(points), label="sweep") as bar:
        for p in points:
            ...
            bar.update(note=str(p))          # or bar.set(done) for absolute counts

analysis.sweeps.run_sweep and analysis.check.run_checks draw their own line when the
caller passes no progress callback (`show_progress`).

One status line on stderr, rewritten in place, only when stderr is a terminal and the
CI environment variable is unset (`enabled()`); otherwise silent, so logs and pipes stay
clean. The time left: the mean seconds per point done so far times the points left, less
what the running point has taken (never below the estimate for the points after it).
The line is drawn as soon as the `with` block starts (0 points done) and redrawn every
`refresh` seconds by a background thread, so that the elapsed time moves while one long
point (a kernel's first compilation) runs; its note (the point running, or the last one
done) stays until another replaces it.
"""
from __future__ import annotations

import os
import sys
import threading
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


def status_line(label: str, done: int, total: int | None, elapsed: float, note: str = "",
                left: float | None = None) -> str:
    """'sweep: 12/40 points, 3 s elapsed, ~7 s left  fa2 N=1024' (no estimate before the
    first point is done or when the total is unknown). `left`: the seconds left, if the
    caller knows better than elapsed / done x (total - done)."""
    if total:
        text = f"{label}: {done}/{total} points, {format_seconds(elapsed)} elapsed"
        if 0 < done < total:
            if left is None:
                left = elapsed / done * (total - done)
            text += f", ~{format_seconds(left)} left"
    else:
        text = f"{label}: {done} points, {format_seconds(elapsed)} elapsed"
    if note:
        text += f"  {note}"
    return text


class Progress:
    """A status line for `total` points (module docstring); a no-op when not enabled.
    `refresh`: seconds between redraws by the background thread (0: none; the thread runs
    only inside the `with` block and only when the line is shown)."""

    def __init__(self, total: int | None, label: str, stream=None, show: bool | None = None,
                 clock=time.monotonic, width: int = 100, refresh: float = 1.0):
        self.total, self.label, self.clock, self.width = total, label, clock, width
        self.stream = sys.stderr if stream is None else stream
        self.show = enabled(self.stream) if show is None else show
        self.done = 0
        self.note = ""
        self.refresh = refresh
        self.t0 = self._t_done = clock()
        self._drawn = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = None

    def line(self, note: str | None = None) -> str:
        """The status line now. Time left: the mean seconds per point done so far times
        the points left, less the time the running point has taken (but never less than
        the estimate for the points after it)."""
        now = self.clock()
        left = None
        if self.total and 0 < self.done < self.total:
            per = (self._t_done - self.t0) / self.done
            rest = self.total - self.done
            left = max(per * rest - (now - self._t_done), per * (rest - 1))
        return status_line(self.label, self.done, self.total, now - self.t0,
                           self.note if note is None else note, left)

    def _draw(self, note: str | None = None) -> None:
        if not self.show:
            return
        with self._lock:
            if note is not None:
                self.note = note
            text = self.line()[: self.width]
            self.stream.write("\r" + text.ljust(self.width))
            self.stream.flush()
            self._drawn = True

    def update(self, n: int = 1, note: str | None = None) -> None:
        """`n` more points done; `note` (None: keep the current one) follows the counts."""
        self.done += n
        self._t_done = self.clock()
        self._draw(note)

    def set(self, done: int, note: str | None = None) -> None:
        if done != self.done:
            self._t_done = self.clock()
        self.done = done
        self._draw(note)

    def set_note(self, note: str) -> None:
        """Name what runs now (the counts unchanged)."""
        self.note = note
        self._draw()

    def write(self, text: str) -> None:
        """Print a line above the status line (which is redrawn after it)."""
        with self._lock:
            if self.show and self._drawn:
                self.stream.write("\r" + " " * self.width + "\r")
            print(text, flush=True)
            if self.show and self._drawn:
                self._draw()

    def _tick(self) -> None:
        while not self._stop.wait(self.refresh):
            self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self.show and self._drawn:
                self.stream.write("\r" + " " * self.width + "\r")
                self.stream.flush()
                self._drawn = False

    def start(self) -> "Progress":
        """Draw the line (0 points done) and start the redraws; what `with` does."""
        if self.show:
            self._draw()
            if self.refresh and self.refresh > 0 and self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._tick, name="progress",
                                                daemon=True)
                self._thread.start()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False
