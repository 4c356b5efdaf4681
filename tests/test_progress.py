"""Progress lines (analysis/progress.py) and every command's --help example."""
import io

import pytest

from analysis import progress as P
from analysis.cli import COMMANDS, build_parser


class TTY(io.StringIO):
    def isatty(self):
        return True


def test_status_line():
    assert P.status_line("sweep", 0, 40, 0.0) == "sweep: 0/40 points, 0 s elapsed"
    assert P.status_line("sweep", 10, 40, 5.0, "fa2") == \
        "sweep: 10/40 points, 5 s elapsed, ~15 s left  fa2"
    assert P.status_line("check", 40, 40, 125.0) == "check: 40/40 points, 2 min 05 s elapsed"
    assert P.status_line("x", 3, None, 4000.0) == "x: 3 points, 1 h 06 min elapsed"


def test_shown_on_a_terminal_only_and_never_in_ci(monkeypatch):
    monkeypatch.delenv("FLASHSIM_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert P.enabled(TTY()) and not P.enabled(io.StringIO())
    monkeypatch.setenv("CI", "true")
    assert not P.enabled(TTY())
    monkeypatch.setenv("FLASHSIM_PROGRESS", "1")
    assert P.enabled(io.StringIO())


def test_progress_draws_and_clears(capsys):
    t = [0.0]
    out = TTY()
    with P.Progress(4, "bench", stream=out, show=True, clock=lambda: t[0], width=60) as bar:
        t[0] = 2.0
        bar.update(note="fa2 N=512")
        assert "bench: 1/4 points, 2 s elapsed, ~6 s left  fa2 N=512" in out.getvalue()
        bar.write("a row")
    assert capsys.readouterr().out == "a row\n"
    assert out.getvalue().endswith("\r" + " " * 60 + "\r")
    quiet = io.StringIO()
    with P.Progress(4, "bench", stream=quiet, show=False) as bar:
        bar.update()
    assert quiet.getvalue() == ""


def test_pending_counts_points_not_in_the_file(tmp_path):
    from analysis.sweeps import evaluate_model, grid, pending, run_sweep
    pts = grid(algorithm=["fa1", "fa2"], N=[256, 512], sram_bytes=[65536])
    path = tmp_path / "s.jsonl"
    assert pending(pts, str(path)) == 4
    run_sweep(pts[:3], str(path), evaluate_model)
    assert pending(pts, str(path)) == 1


def test_line_shows_at_start_and_moves_while_a_point_runs():
    """Drawn as the block starts (0 done), then redrawn by the thread: elapsed moves
    while nothing is done; the note stays until replaced."""
    import time
    out = TTY()
    with P.Progress(3, "sweep", stream=out, show=True, refresh=0.01) as bar:
        assert "sweep: 0/3 points, 0 s elapsed" in out.getvalue()
        bar.set_note("fa2 N=64")
        n = out.getvalue().count("\r")
        deadline = time.monotonic() + 10
        while out.getvalue().count("\r") < n + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.getvalue().count("\r") >= n + 3
        assert out.getvalue().rstrip().endswith("fa2 N=64")
    text = out.getvalue()
    assert text.endswith("\r" + " " * 100 + "\r")
    time.sleep(0.05)                            # the thread stopped with the block
    assert out.getvalue() == text


def test_time_left_counts_down_while_a_point_runs():
    t = [0.0]
    bar = P.Progress(3, "x", stream=TTY(), show=True, clock=lambda: t[0], refresh=0)
    t[0] = 10.0
    bar.update()                                   # 10 s per point, 2 left
    assert bar.line().endswith("~20 s left")
    t[0] = 15.0
    assert bar.line() == "x: 1/3 points, 15 s elapsed, ~15 s left"
    t[0] = 40.0                                    # overran: never below the last point's
    assert bar.line().endswith("~10 s left")


def _tty_stderr(monkeypatch):
    monkeypatch.delenv("FLASHSIM_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    err = TTY()
    monkeypatch.setattr("sys.stderr", err)
    return err


def test_sweep_shows_progress_on_a_terminal(tmp_path, monkeypatch):
    """run_sweep draws its own line (no progress callback): total = the points it will
    evaluate (stale rows included, reused ones not), the point running, cleared at the
    end."""
    from analysis.sweeps import evaluate_model, grid, run_sweep
    pts = grid(algorithm=["fa1", "fa2"], N=[256, 512], sram_bytes=[65536])
    path = tmp_path / "s.jsonl"
    run_sweep(pts[:3], path, evaluate_model, version="old", show_progress=False)
    err = _tty_stderr(monkeypatch)
    assert run_sweep(pts, path, evaluate_model)["done"] == 4
    text = err.getvalue()
    assert "sweep: 0/4 points, 0 s elapsed" in text and "sweep: 4/4 points" in text
    assert "fa2 N=512 d=64 fp16 B=1 H=1 M=65536B" in text
    assert text.endswith("\r" + " " * 100 + "\r")
    err.truncate(0)
    err.seek(0)
    assert run_sweep(pts, path, evaluate_model)["skipped"] == 4
    assert "sweep: 0 points" in err.getvalue() and "0/" not in err.getvalue()


def test_sweep_is_quiet_off_a_terminal_in_ci_and_with_a_callback(tmp_path, monkeypatch):
    import io
    from analysis.sweeps import evaluate_model, grid, run_sweep
    pts = grid(algorithm=["fa1", "fa2"], N=[256], sram_bytes=[65536])
    monkeypatch.delenv("FLASHSIM_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    run_sweep(pts, tmp_path / "a.jsonl", evaluate_model)
    assert pipe.getvalue() == ""
    err = _tty_stderr(monkeypatch)
    monkeypatch.setenv("CI", "true")
    run_sweep(pts, tmp_path / "b.jsonl", evaluate_model)
    monkeypatch.delenv("CI")
    msgs = []
    run_sweep(pts, tmp_path / "c.jsonl", evaluate_model, progress=msgs.append)
    run_sweep(pts, tmp_path / "d.jsonl", evaluate_model, show_progress=False)
    assert err.getvalue() == "" and len(msgs) == 2


def test_checks_show_progress_on_a_terminal_only(monkeypatch):
    """run_checks: its own line without callbacks (done / total, the configuration
    running); on_start before and on_case after each configuration; quiet off a
    terminal."""
    import io
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("runs the simulator path")
    from analysis import check as C
    from analysis import check_variants as V
    monkeypatch.setattr(V, "check", lambda cfg, T=None: {"ok": True, "status": "pass",
                                                          "err": {}, "bound": {}})
    err = _tty_stderr(monkeypatch)
    n = len(V.SIM_ROWS)
    assert C.run_checks("sim", ("variants",))["n_rows"] == n
    text = err.getvalue()
    assert f"check: 0/{n} points" in text and f"check: {n}/{n} points" in text
    assert V.name(V.configs("sim")[0]) in text
    err.truncate(0)
    err.seek(0)
    events = []
    C.run_checks("sim", ("variants",), on_start=lambda *a: events.append(("start",) + a),
                 on_case=lambda *a: events.append(("case",) + a))
    assert err.getvalue() == ""                  # callbacks: the caller draws its own
    first = V.name(V.configs("sim")[0])
    assert events[:2] == [("start", 0, n, first), ("case", 1, n, first)]
    assert len(events) == 2 * n
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    C.run_checks("sim", ("variants",))
    assert pipe.getvalue() == ""


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_has_an_example(name):
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    text = sub.choices[name].format_help()
    assert "examples:" in text and f"flashsim {name}" in text.split("examples:")[1]
