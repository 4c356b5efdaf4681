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
    from analysis.sweeps import evaluate_model, grid, run_sweep
    pts = grid(algorithm=["fa1", "fa2"], N=[256, 512], sram_bytes=[65536])
    path = tmp_path / "s.jsonl"
    assert P.pending(pts, str(path)) == 4
    run_sweep(pts[:3], str(path), evaluate_model)
    assert P.pending(pts, str(path)) == 1


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_has_an_example(name):
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    text = sub.choices[name].format_help()
    assert "examples:" in text and f"flashsim {name}" in text.split("examples:")[1]
