"""The results data set (analysis/results.py), its tables (analysis/tables.py), the
`flashsim results` command and the data set committed in benchmarks/results/data/."""
import json
from pathlib import Path

import pytest

from analysis import results as R
from analysis import tables as T
from analysis.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]


def _row(kind="bench", run_id="r1", **payload):
    return R.make_row(kind, run_id=run_id, device="Fake GPU", date="2026-11-25", commit=None,
                      versions={"numba": "0"}, **payload)


def test_append_load_filter_and_no_row_twice(tmp_path):
    rows = [_row(impl="fa2", N=1024, ms_median=1.0), _row(impl="fa2", N=2048, ms_median=2.0)]
    assert R.append(rows, data=tmp_path) == (2, 0)
    # the same rows again, also under another run id: nothing added
    assert R.append(rows + [dict(rows[0], run_id="r2", logs=["runs/r2/x.txt"])],
                    data=tmp_path) == (0, 3)
    # a row twice in one call: once
    new = _row(impl="fa2", N=4096, ms_median=4.0)
    assert R.append([new, dict(new)], data=tmp_path) == (1, 1)
    assert len(R.load("bench", data=tmp_path)) == 3
    assert [r["N"] for r in R.load("bench", data=tmp_path, N=2048)] == [2048]
    assert R.load("bench", data=tmp_path, device="fake")[0]["device"] == "Fake GPU"
    assert R.load("bench", data=tmp_path, device="A100") == []
    R.append([_row("check", suite="forward", ok=True)], data=tmp_path)
    assert R.kinds(tmp_path) == ["bench", "check"]
    assert len(R.load(data=tmp_path)) == 4
    lines = (tmp_path / "bench.jsonl").read_text().splitlines()
    assert all(json.loads(line)["kind"] == "bench" for line in lines)


def test_rows_are_validated(tmp_path):
    bad = _row()
    del bad["versions"]
    with pytest.raises(ValueError, match="row lacks 'versions'"):
        R.append([_row(N=1), bad], data=tmp_path)
    assert not (tmp_path / "bench.jsonl").exists()          # nothing half-written
    with pytest.raises(ValueError, match="kind='a/b' is not allowed"):
        R.append([_row("a/b")], data=tmp_path)


def test_tables_render_markers(tmp_path):
    text = "intro\n<!-- results:demo -->\nold\n<!-- /results:demo -->\nend\n"
    new, names = T.render(text, tables={"demo": lambda data: "| a |\n|---|\n| 1 |\n"})
    assert names == ["demo"]
    assert new == "intro\n<!-- results:demo -->\n| a |\n|---|\n| 1 |\n<!-- /results:demo -->\nend\n"
    with pytest.raises(ValueError, match="table='nope'"):
        T.render("<!-- results:nope -->\n<!-- /results:nope -->", tables={})


def test_forward_table_takes_the_latest_measured_row(tmp_path):
    rows = [_row(impl="fa2", dtype="fp32", N=4096, d=64, batch_heads=16, causal=False,
                 ms_median=ms) for ms in (3.0, 2.5)]
    rows.append(_row(impl="fa2", dtype="fp32", N=4096, d=64, batch_heads=16, causal=False,
                     ms_median=None, skipped="time budget"))
    rows = [dict(r, device="NVIDIA H100 80GB HBM3") for r in rows]
    R.append(rows, data=tmp_path)
    t = T.table_forward_fp32(tmp_path)
    assert "| non-causal | 2.5 | – |" in t and "bench.jsonl" in t


def test_readme_tables_are_up_to_date(capsys):
    """docs/results.md's generated tables equal what the data set gives (they cannot drift)."""
    assert cli(["results", "tables", "--check"]) == 0, capsys.readouterr().err


def test_results_command(tmp_path, capsys):
    src = tmp_path / "bench.json"
    src.write_text(json.dumps([{"run_id": "20261201T000000-abc", "device": "Fake GPU",
                                "date": "2026-12-01", "impl": "fa2", "N": 512}]))
    d = str(tmp_path / "data")
    assert cli(["results", "--data", d, "add", str(src), "--kind", "bench",
                "--run-id", "fake-run"]) == 0
    assert cli(["results", "--data", d, "add", str(src), "--kind", "bench",
                "--run-id", "fake-run"]) == 0
    out = capsys.readouterr().out
    assert "1 rows added, 0 already there" in out and "0 rows added, 1 already there" in out
    assert cli(["results", "--data", d, "show", "bench", "--where", "N=512"]) == 0
    row = json.loads(capsys.readouterr().out.strip())
    assert row["run_id"] == "fake-run" and row["source_run_id"] == "20261201T000000-abc"
    assert cli(["results", "--data", d, "list"]) == 0
    assert "bench" in capsys.readouterr().out
    assert cli(["results"]) == 2


def test_committed_data_set():
    """Every row has the required keys; no row is stored twice; the raw logs a row names
    exist; the old run folders' copies were folded (each bench point of a run once)."""
    kinds = R.kinds()
    assert {"bench", "check", "ncu", "sanitizer", "fast_variants", "tc_tilings",
            "host_time", "device_probe"} <= set(kinds)
    seen = set()
    for kind in kinds:
        for r in R.load(kind):
            R.validate(r)
            assert r["kind"] == kind
            fp = R.fingerprint(r)
            assert fp not in seen, (kind, r["run_id"])
            seen.add(fp)
            for log in r.get("logs", []):
                assert (ROOT / "benchmarks" / "results" / log).exists(), log
    bench = R.load("bench")
    keys = [(r["run_id"], r.get("bench_run_id")) + T.bench_key(r) for r in bench]
    assert len(keys) == len(set(keys))


def test_fig8_reads_the_data_set(tmp_path):
    pytest.importorskip("matplotlib")
    from analysis.figures import fig8_bench
    rows = fig8_bench.generate("H100")
    assert {r["impl"] for r in rows} == set(fig8_bench.IMPLS)
    assert len(rows) == len({T.bench_key(r) for r in rows})
    with pytest.raises(ValueError, match="no measured bench rows"):
        fig8_bench.make(tmp_path, device="No Such GPU")


def test_junit_rows_take_every_outcome_and_the_suite_date():
    from analysis.results import junit_rows
    xml = """<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="1"
      failures="1" skipped="1" tests="4" timestamp="2026-11-27T03:51:36.007491+00:00">
      <testcase classname="tests.test_a" name="test_ok[fa2]" time="1.5"/>
      <testcase classname="tests.test_a" name="test_bad" time="0.2"><failure message="x"/></testcase>
      <testcase classname="tests.test_b" name="test_skip" time="0"><skipped message="no"/></testcase>
      <testcase classname="tests.test_b" name="test_err" time="0"><error message="e"/></testcase>
    </testsuite></testsuites>"""
    rows = junit_rows(xml, command="pytest -m gpu")
    assert [(r["test"], r["outcome"]) for r in rows] == [
        ("tests/test_a.py::test_ok[fa2]", "passed"), ("tests/test_a.py::test_bad", "failed"),
        ("tests/test_b.py::test_skip", "skipped"), ("tests/test_b.py::test_err", "error")]
    assert {r["date"] for r in rows} == {"2026-11-27T03:51:36Z"}
    assert rows[0]["seconds"] == 1.5 and rows[0]["command"] == "pytest -m gpu"
    with pytest.raises(ValueError, match="not JUnit XML"):
        junit_rows("<testsuite")
