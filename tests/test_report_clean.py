"""`flashsim report` leaves a clean tree: run twice, it writes the same bytes.

The report runs twice (its fast parts: no kernel runs, the L2 / DRAM and time model
figures on reduced inputs) in two child processes with different hash seeds, into two
directories; every file it writes outside DIR/run/ must be byte-identical, and what
differs from run to run (wall times, provenance) must be in DIR/run/ only.
"""
import json
import os
import sys

import pytest

import _background

pytest.importorskip("matplotlib")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: run_report with the slow figures' inputs reduced (the drawing and saving unchanged)
_FAST_REPORT = r"""
import functools, sys
from analysis import report
from analysis.figures import (fig9_levels, fig10_grid_order, fig11_levels_validation,
                              fig12_runtime_validation)
fig9_levels.generate = functools.partial(fig9_levels.generate, Ns=[1024, 4096, 16384],
                                         bhs=[1, 16])
fig10_grid_order.generate = functools.partial(fig10_grid_order.generate, Ns=[4096, 16384],
                                              bhs=[1, 16])
fig11_levels_validation.generate = functools.partial(
    fig11_levels_validation.generate,
    select=lambda r: r["config"]["N"] <= 4096 and r["config"]["batch"] * r["config"]["heads"] <= 16)
fig12_runtime_validation.generate = functools.partial(fig12_runtime_validation.generate,
                                                      max_calls=4)
sys.exit(report.run_report(sys.argv[1], kernel_validation=False))
"""


def two_reports():
    """Two fast reports into two new directories; [(dir, status, output)]."""
    out = []
    for seed in ("1", "2"):
        d = _background.mkdtemp("report_clean")
        env = {**_background.environ(), "PYTHONHASHSEED": seed, "PYTHONPATH": ROOT}
        p = _background.run([sys.executable, "-c", _FAST_REPORT, d], cwd=ROOT, env=env,
                            timeout=600)
        out.append((d, p.returncode, p.stdout + p.stderr))
    return out


def _files(d):
    """{relative path: bytes} of everything under d outside run/."""
    out = {}
    for base, dirs, names in os.walk(d):
        dirs[:] = [x for x in dirs if os.path.relpath(os.path.join(base, x), d) != "run"]
        for n in names:
            p = os.path.join(base, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, d)] = f.read()
    return out


@pytest.mark.prestart(job=two_reports)
def test_two_reports_write_the_same_bytes():
    (a, sa, oa), (b, sb, ob) = _background.result(two_reports)
    assert (sa, sb) == (0, 0), oa[-3000:] + ob[-3000:]
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    from analysis.figures import NAMES
    for name in NAMES:
        if name == "fig7_validation":          # kernels not run here
            continue
        assert f"{name}.png" in fa and f"{name}.svg" in fa, name
    differ = [p for p in fa if fa[p] != fb[p]]
    assert not differ, differ
    # nothing that says when: no dates in the SVGs, no wall time in REPORT.md
    for p, data in fa.items():
        if p.endswith(".svg"):
            assert b"<dc:date>" not in data, p
    assert b"Wall time" not in fa["REPORT.md"] and b"all checks passed" in fa["REPORT.md"]


@pytest.mark.prestart(job=two_reports)
def test_provenance_is_kept_in_run_only():
    """The tracked sweep file keeps model_version (a resumed sweep never reuses a row of an
    older model) but no provenance; DIR/run/ has the rows with it and the wall time."""
    from analysis.sweeps import WHERE_FIELDS, model_version, read_rows
    (a, status, out), _ = _background.result(two_reports)
    assert status == 0, out[-3000:]
    rows = read_rows(os.path.join(a, "sweep_model.jsonl"))
    assert len(rows) == 360
    assert {r["model_version"] for r in rows} == {model_version("model")}
    assert not [f for r in rows for f in WHERE_FIELDS if f in r]
    full = read_rows(os.path.join(a, "run", "sweep_model.jsonl"))
    assert [r["key"] for r in full] == [r["key"] for r in rows]
    assert all(set(WHERE_FIELDS) <= r.keys() for r in full)
    assert [{k: v for k, v in r.items() if k not in WHERE_FIELDS} for r in full] == rows
    with open(os.path.join(a, "run", "run.json")) as f:
        run = json.load(f)
    assert run["wall_seconds"] > 0 and run["result"] == "all checks passed"
    assert "wall time" in out
    assert not [p for p in os.listdir(a) if ".tmp" in p]


def test_save_is_deterministic(tmp_path):
    """One figure saved twice (PNG and SVG): the same bytes, no date, stable ids."""
    from analysis.figures import fig6_memory_footprint as f
    a = f.make(str(tmp_path / "a"))
    b = f.make(str(tmp_path / "b"))
    for pa, pb in zip(a, b):
        with open(pa, "rb") as x, open(pb, "rb") as y:
            assert x.read() == y.read(), pa
