"""Sweep files and the commands' output paths (issue 19, items 3-6).

* only a sweep file (or an empty or absent one) is repaired or appended to;
* concurrent runs on one file write each point once; readers keep one row per key;
* rows carry a model version and are reused only while it matches; error rows are
  retried unless --no-retry; parameters are normalised (dtype aliases) and checked
  before the first point; `flashsim report` regenerates its model sweep;
* every command: a bad --out or bad input is one line on stderr and exit 2.
"""
import json
import multiprocessing
import os

import pytest

import _report_runs
from analysis import sweeps
from analysis.cli import main as cli
from analysis.sweeps import evaluate_model, grid, point_key, read_rows, run_sweep

POINTS = grid(algorithm=["fa1", "fa2"], N=[256, 512, 1024], sram_bytes=[16384])


def _one_error_line(capsys, *needles):
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------
# Item 3: repair only sweep files
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["my notes", "line one\nline two", '{"a": 1}',
                                  '{"a": 1}\n{"b": 2}', '{"algorithm": "fa1"}\n'])
def test_non_sweep_file_is_refused_and_untouched(tmp_path, capsys, text):
    path = tmp_path / "notes.txt"
    path.write_text(text)
    rc = cli(["sweep", "--out", str(path), "--seq-len", "256", "--sram-bytes", "16384"])
    assert rc == 2
    _one_error_line(capsys, str(path), "not a sweep file")
    assert path.read_text() == text


def test_sweep_file_tail_repair(tmp_path):
    path = tmp_path / "s.jsonl"
    run_sweep(POINTS[:2], path, evaluate_model)
    data = path.read_bytes()
    # a whole last row without its newline is kept (the newline is added)
    path.write_bytes(data[:-1])
    st = run_sweep(POINTS[:2], path, evaluate_model)
    assert st == {"done": 0, "skipped": 2, "errors": 0}
    assert path.read_bytes() == data
    # a row cut short (killed writer) is dropped
    path.write_bytes(data + b'{"algorithm": "fa2", "N": 10')
    run_sweep(POINTS[:2], path, evaluate_model)
    assert path.read_bytes() == data
    # an empty file is fine
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert run_sweep(POINTS[:1], empty, evaluate_model)["done"] == 1


# ---------------------------------------------------------------------------------------
# Item 4: concurrent writers, de-duplicating readers
# ---------------------------------------------------------------------------------------
def _sweep_in_child(path, barrier, points):
    first = []

    def evaluate(p):
        if not first:               # both processes have read the file before either writes
            first.append(1)
            barrier.wait(timeout=30)
        return evaluate_model(p)

    run_sweep(points, path, evaluate)


def test_concurrent_runs_write_each_point_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "c.jsonl")
    pts = grid(algorithm=["standard", "fa1", "fa2"], N=[256, 512, 1024, 2048],
               d=[64, 128], sram_bytes=[16384, 65536])
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_sweep_in_child, args=(path, barrier, pts)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with open(path) as f:
        keys = [json.loads(line)["key"] for line in f]
    assert len(keys) == len(pts) == len(set(keys))


def test_concurrent_runs_over_stale_duplicated_rows(tmp_path):
    """Both runs compact (os.replace) a file the other has open, and recompute stale rows:
    still one line per point, every row current."""
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "d.jsonl")
    pts = grid(algorithm=["standard", "fa1", "fa2"], N=[256, 512, 1024, 2048],
               d=[64, 128], sram_bytes=[16384, 65536])
    run_sweep(pts, path, evaluate_model, version="old")
    with open(path) as f:
        old = f.read()
    with open(path, "w") as f:
        f.write(old + old)                           # duplicated stale rows
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_sweep_in_child, args=(path, barrier, pts)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == len(pts) == len({r["key"] for r in rows})
    assert {r["model_version"] for r in rows} == {sweeps.model_version("model")}


def test_readers_deduplicate_a_polluted_file(tmp_path):
    path = tmp_path / "p.jsonl"
    run_sweep(POINTS, path, evaluate_model)
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["hbm_bytes"] = -1                          # an older duplicate of row 0
    polluted = [json.dumps(first)] + lines + lines[:3]
    path.write_text("\n".join(polluted) + "\n")
    rows = read_rows(path)
    assert len(rows) == len(POINTS)
    assert rows[0]["hbm_bytes"] > 0                  # the last row of the key wins
    assert run_sweep(POINTS, path, evaluate_model)["done"] == 0
    # a writer compacts it: one line per point, the surviving rows unchanged
    assert path.read_text().splitlines() == lines


# ---------------------------------------------------------------------------------------
# Item 5: model versions, retries, normalisation, early checks, report regenerates
# ---------------------------------------------------------------------------------------
def test_model_change_invalidates_cached_rows(tmp_path, monkeypatch):
    path = tmp_path / "v.jsonl"
    assert run_sweep(POINTS, path, evaluate_model)["done"] == len(POINTS)
    assert run_sweep(POINTS, path, evaluate_model)["done"] == 0
    monkeypatch.setattr(sweeps, "model_version", lambda backend="model": "another-model")
    st = run_sweep(POINTS, path, evaluate_model)
    assert st["done"] == len(POINTS) and st["skipped"] == 0
    rows = read_rows(path)
    assert len(rows) == len(POINTS)                  # superseded, not duplicated
    assert len(path.read_text().splitlines()) == len(POINTS)     # in the file too
    assert {r["model_version"] for r in rows} == {"another-model"}
    assert run_sweep(POINTS, path, evaluate_model)["done"] == 0


def test_model_version_hashes_the_sources():
    v = sweeps.model_version("model")
    assert len(v) == 16 and v != sweeps.model_version("kernel")
    with pytest.raises(ValueError, match="backend"):
        sweeps.model_version("nope")


def test_error_rows_are_retried_unless_no_retry(tmp_path, capsys):
    out = str(tmp_path / "r.jsonl")
    args = ["sweep", "--out", out, "--algorithm", "fa2", "--seq-len", "256", "--head-dim", "64",
            "--sram-bytes", "100"]
    assert cli(args) == 0                            # M < 4d: an error row
    assert "1 new rows (1 errors)" in capsys.readouterr().out
    assert cli(args) == 0
    assert "1 new rows (1 errors)" in capsys.readouterr().out
    assert cli(args + ["--no-retry"]) == 0
    assert "0 new rows" in capsys.readouterr().out
    assert len(read_rows(out)) == 1


def test_dtype_aliases_share_one_key(tmp_path, capsys):
    out = str(tmp_path / "a.jsonl")
    base = ["sweep", "--out", out, "--seq-len", "256", "--sram-bytes", "16384"]
    assert cli(base + ["--dtype", "half"]) == 0
    assert cli(base + ["--dtype", "float16"]) == 0
    assert cli(base + ["--dtype", "fp16"]) == 0
    assert "0 new rows" in capsys.readouterr().out.splitlines()[-1]
    rows = read_rows(out)
    assert len(rows) == 2 and {r["dtype"] for r in rows} == {"fp16"}
    assert point_key({"dtype": "half"}) == point_key({"dtype": "fp16"})


def test_parameters_are_checked_before_the_first_point(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    assert cli(["sweep", "--out", str(out), "--dtype", "fp16,fp8", "--sram-bytes", "16384"]) == 2
    _one_error_line(capsys, "fp8")
    assert not out.exists()
    calls = []
    with pytest.raises(ValueError, match="causal"):
        run_sweep([{"sram_bytes": 16384}, {"sram_bytes": 16384, "causal": "yes"}],
                  out, lambda p: calls.append(p) or {})
    assert calls == [] and not out.exists()


def test_reproduce_checks_sram_like_traffic(capsys):
    assert cli(["reproduce", "gpt2-table", "--sram-bytes", "100"]) == 2
    _one_error_line(capsys, "sram_bytes=100")
    assert cli(["traffic", "--algorithm", "fa2", "--seq-len", "1024", "--head-dim", "64",
                "--sram-bytes", "100"]) == 2
    _one_error_line(capsys, "sram_bytes=100")


@pytest.mark.prestart(job=_report_runs.concurrent_reports)
def test_report_regenerates_its_model_sweep():
    """Stale rows (an old model version, none) in DIR/sweep_model.jsonl are regenerated by
    `flashsim report` (the reports of tests/_report_runs.py, which start from such a file)."""
    path, runs = _report_runs.concurrent_reports_result()
    assert [status for status, _ in runs] == [0, 0], runs[0][1][-2000:] + runs[1][1][-2000:]
    rows = read_rows(os.path.join(path, "sweep_model.jsonl"))
    stale = _report_runs.stale_sweep_rows()[0]
    assert len(rows) == 360 and stale["key"] in {r["key"] for r in rows}
    assert {r["model_version"] for r in rows} == {sweeps.model_version("model")}
    assert all(r["hbm_bytes"] > 1 for r in rows if r["status"] == "ok")
    assert not [p for p in os.listdir(path) if p.endswith(".tmp")]


@pytest.mark.prestart(job=_report_runs.concurrent_reports)
def test_cli_report_without_kernels():
    """`flashsim report --no-kernels` writes every section and figure, all checks passing
    (the shared runs of tests/_report_runs.py; moved here from test_analysis.py)."""
    out_dir, runs = _report_runs.concurrent_reports_result()
    assert [status for status, _ in runs] == [0, 0], runs[0][1][-2000:] + runs[1][1][-2000:]
    with open(os.path.join(out_dir, "REPORT.md")) as f:
        text = f.read()
    assert "**FAIL**" not in text and "Skipped" in text
    for n in (1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13):
        assert f"fig{n}_" in text
        assert os.path.getsize(os.path.join(out_dir, next(
            p for p in os.listdir(out_dir) if p.startswith(f"fig{n}_") and p.endswith(".png")))) > 0
    assert "Below the ledger: L2 and DRAM" in text
    assert "Time model (iosim.timing)" in text
    assert len(read_rows(os.path.join(out_dir, "sweep_model.jsonl"))) == 360


# ---------------------------------------------------------------------------------------
# Item 6: every command, bad --out (or bad input where it has no --out)
# ---------------------------------------------------------------------------------------
def _bad_outs(tmp_path):
    a_file = tmp_path / "regular_file"
    a_file.write_text("not a directory\n")
    return a_file, str(a_file / "below")       # a parent that is a file fails for root too


def test_every_command_rejects_a_bad_out(tmp_path, capsys):
    a_file, below_file = _bad_outs(tmp_path)
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    cases = [
        (["sweep", "--sram-bytes", "16384", "--out", str(a_dir)], str(a_dir)),
        (["sweep", "--sram-bytes", "16384", "--out", str(a_file)], str(a_file)),
        (["sweep", "--sram-bytes", "16384", "--out", below_file + "/s.jsonl"], below_file),
        (["report", "--no-kernels", "--out", str(a_file)], str(a_file)),
        (["report", "--no-kernels", "--out", below_file], below_file),
        (["figure", "fig6", "--out", str(a_file)], str(a_file)),
        (["figure", "fig6", "--out", below_file], below_file),
        (["bench", "--out", str(a_dir)], str(a_dir)),
        (["bench", "--out", below_file + "/b.json"], below_file),
        # traffic and reproduce write no files: bad values instead
        (["traffic", "--algorithm", "fa2", "--seq-len", "0", "--head-dim", "64",
          "--sram-bytes", "16384"], "0"),
        (["traffic", "--algorithm", "fa2", "--seq-len", "64", "--head-dim", "64",
          "--sram-bytes", "16384", "--dtype", "fp8"], "fp8"),
        (["reproduce", "gpt2-table", "--sram-bytes", "-5"], "-5"),
    ]
    for argv, needle in cases:
        assert cli(argv) == 2, argv
        _one_error_line(capsys, needle)
    assert a_file.read_text() == "not a directory\n"
    assert os.listdir(a_dir) == []


def test_oserror_during_a_command_is_one_line(tmp_path, capsys, monkeypatch):
    """A file-system error met mid-run (after the up-front checks) is one line too."""
    from analysis.figures import _style

    def fail(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "fig6.png"))

    monkeypatch.setattr(_style, "save", fail)
    import analysis.figures.fig6_memory_footprint as f6
    monkeypatch.setattr(f6, "save", fail, raising=False)
    assert cli(["figure", "fig6", "--out", str(tmp_path)]) == 2
    _one_error_line(capsys, "Permission denied", "fig6.png")


@pytest.mark.prestart(job=_report_runs.concurrent_reports)
def test_two_concurrent_reports_leave_one_row_per_point():
    """The issue's example: two `flashsim report --no-kernels --out DIR` at once
    (tests/_report_runs.py)."""
    path, runs = _report_runs.concurrent_reports_result()
    for status, out in runs:
        assert status == 0, out[-2000:]
    with open(os.path.join(path, "sweep_model.jsonl")) as f:
        keys = [json.loads(line)["key"] for line in f]
    assert len(keys) == len(set(keys)) == 360
    with open(os.path.join(path, "REPORT.md")) as f:
        assert "all checks passed" in f.read()
    assert not [p for p in os.listdir(path) if ".tmp" in p]
