"""`flashsim check` (analysis.check): the same check functions run here in Numba's CUDA
simulator and, in the tests marked `gpu`, on a real GPU (one source of truth for what the
H100 runs verified: counts equal iosim's closed form, errors within bounds)."""
import json
import os
import sys

import pytest

import _background
from analysis import check as C
from analysis.cli import main as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plans():
    """The configurations the H100 runs verified: 35 forward and 47 tensor-core ones at
    full size (14 of them at head dims padded to 16 on chip: 40, 59, 111, 160, 192, 256);
    quick mode keeps every MT = 2 build and two padded ones (d = 59, 256); the simulator
    has no tc suite."""
    count = lambda mode, s: sum(1 for x, _ in C.plan(mode) if x == s)
    assert (count("full", "forward"), count("full", "tc"), count("full", "backward")) == (35, 47, 8)
    quick_tc = [c for s, c in C.plan("quick", ["tc"])]
    assert len(quick_tc) == 13 and sum(c["MT"] == 2 for c in quick_tc) == 3
    assert {c["d"] for c in quick_tc if c["d"] % 16} == {59}
    assert any(c["d"] == 256 for c in quick_tc)
    assert count("sim", "tc") == 0 and count("sim", "forward") >= 7
    kernels = {c.get("kernel") for s, c in C.plan("full", ["forward"])}
    assert "plain" in kernels
    with pytest.raises(ValueError, match="suite='x' is not known"):
        C.plan("quick", ["x"])
    with pytest.raises(ValueError, match="mode='fast' is not known"):
        C.plan("fast")


def _sim_check_job():
    """`flashsim check --suite forward,tc --json FILE` in the simulator, as a child process
    started early (tests/_background.py); (exit status, stdout, stderr, the JSON or None).
    None on a GPU."""
    from gpu._launch import SIM
    if not SIM:
        return None
    return _background.check_suite("forward,tc", timeout=600)


@pytest.mark.prestart(job=_sim_check_job)
def test_check_command_in_simulator():
    """`flashsim check --suite forward,tc` without a GPU: the simulator at tiny sizes;
    every forward row passes, the tc suite is skipped and says why; JSON written. The
    command runs in a child process (_sim_check_job)."""
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("runs the simulator path")
    rc, text, err, data = _background.result(_sim_check_job)
    assert rc == 0, text + err
    assert "simulator" in text and "SKIP tc: needs a CUDA GPU" in text
    assert data is not None
    assert data["kind"] == "check" and data["mode"] == "sim" and data["ok"]
    assert data["n_failed"] == 0 and len(data["rows"]) >= 7
    assert all(r["ledger_ok"] and r["acc_ok"] and r["ok"] for r in data["rows"])
    assert {"numba", "numpy", "numba-cuda"} <= set(data["versions"])
    assert data["skipped"] == [{"suite": "tc", "reason": C.TC_NEEDS_GPU}]


def test_check_backward_in_simulator():
    """One backward configuration, all three algorithms, fp16 causal (the model bound).
    One head (N = 40 keeps fa2's and fa1's two 32-row tiles, the last ragged): the check's
    logic does not depend on the head count; the kernels' several heads, fp16 causal,
    are tests/test_gpu_backward.py::test_fp16_causal's."""
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("runs the simulator path")
    cfg = dict(N=40, d=16, batch=1, heads=1, dtype="fp16", causal=True,
               algs=["fa2", "standard", "fa1"])
    rows = C.check_backward(cfg, repeats=0)
    assert [r["algorithm"] for r in rows] == cfg["algs"]
    for r in rows:
        assert r["ok"], r
        assert r["counts_equal"] and r["plain_matches_counted"] and r["model_ok"]


def test_check_fails_on_a_wrong_ledger(monkeypatch):
    """A kernel whose counts differ from the model is a FAIL naming both."""
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("runs the simulator path")
    import iosim
    real = iosim.closed_form

    def off_by_one(alg, problem, tiling):
        led = real(alg, problem, tiling)
        led.reads["Q"] += 1
        return led
    monkeypatch.setattr(iosim, "closed_form", off_by_one)
    cfg = C.forward_configs("sim")[0]
    row = C.check_forward(cfg, repeats=0)
    assert not row["ok"] and not row["ledger_ok"]
    assert "closed form" in row["failures"][0]


def test_tools_missing_is_one_line(capsys, monkeypatch):
    """--sanitizer / --ncu where the GPU or the tool is missing: one line, status 2."""
    from analysis.commands import check as cmd
    monkeypatch.setattr(cmd, "find_tool", lambda name: None)
    for argv in (["check", "--sanitizer", "memcheck"], ["check", "--ncu"]):
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("flashsim check: error: --")


def test_bad_suite_is_one_line(capsys):
    assert cli(["check", "--suite", "forward,nope"]) == 2
    assert "suite='forward,nope' is not allowed" in capsys.readouterr().err


def _ptx_job():
    """The NVVM probe, then `flashsim check --ptx --quick` where it passes (subprocesses
    started early: tests/_background.py)."""
    env = dict(_background.environ(), NUMBA_ENABLE_CUDASIM="0")
    probe = _background.run(
        [sys.executable, "-c", "from numba import cuda\n"
         "def f(a):\n    a[0] = 1\n"
         "cuda.compile_ptx(f, 'void(float32[:])', cc=(9, 0))"],
        env=env, timeout=300)
    if probe.returncode != 0:
        return probe, None
    return probe, _background.run([sys.executable, "-m", "analysis.cli", "check", "--ptx",
                                   "--quick"], env=env, timeout=600, cwd=ROOT)


@pytest.mark.prestart(job=_ptx_job)
def test_ptx_no_float64_and_no_atomics_without_counting():
    """`flashsim check --ptx --quick` (needs NVVM, not a GPU): no .f64 instructions, and
    the uninstrumented builds have no atomics. Skipped where NVVM is unavailable."""
    probe, r = _background.result(_ptx_job)
    if probe.returncode != 0:
        pytest.skip("cannot compile PTX here: " + probe.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PTX: all ok" in r.stdout


# ---------------------------------------------------------------------------------------
# On a GPU: the quick checks of every suite, as `flashsim check --quick` runs them
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("suite", C.DEFAULT_SUITES)
def test_quick_checks_on_gpu(suite):
    result = C.run_checks("quick", [suite], repeats=1)
    failed = [(r["name"], r["failures"]) for r in result["rows"] if not r["ok"]]
    assert not failed and result["rows"], failed


def test_record_appends_rows_once(tmp_path, monkeypatch, capsys):
    """`flashsim check --record`: the result's rows go to the data set (kind check) with
    device, date, commit, versions; the same rows recorded again are not added twice."""
    from analysis import results as R
    from analysis.commands import check as cmd
    monkeypatch.setenv("FLASHSIM_RESULTS", str(tmp_path))
    result = {"device": "Fake GPU", "date": "2026-11-25T08:00:00+00:00", "commit": "abc",
              "versions": {"numba": "0"}, "mode": "quick", "reference": "NumPy float64",
              "rows": [{"suite": "forward", "name": "fa2 N=80", "ok": True, "failures": []}]}
    cmd._record(result)
    cmd._record(result)
    assert "1 rows" in capsys.readouterr().out
    rows = R.load("check")
    assert len(rows) == 1 and rows[0]["run_id"].startswith("check-")
    assert rows[0]["suite"] == "forward" and rows[0]["commit"] == "abc"


def test_sanitizer_run_reads_the_summary(tmp_path, monkeypatch, capsys):
    """--sanitizer runs the quick checks in a child under the tool and decides on its
    summary line and the child's verdict (a stand-in tool here: no GPU needed)."""
    from analysis.commands import check as cmd
    import analysis.sweeps as sweeps
    tool = tmp_path / "fake-sanitizer"
    tool.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
out = args[args.index("--json") + 1]
json.dump({{"ok": True, "n_rows": 3}}, open(out, "w"))
if "racecheck" in args:
    print("========= Warning: Race reported between Read access at f+0x10 and Write access")
    print("========= Warning: Race reported between Read access at f+0x20 and Write access")
else:
    print("========= ERROR SUMMARY: 0 errors")
""")
    tool.chmod(0o755)
    monkeypatch.setattr(cmd, "find_tool", lambda name: str(tool))
    monkeypatch.setattr(sweeps, "ensure_cuda_env", lambda: True)
    out = tmp_path / "san.json"
    assert cli(["check", "--sanitizer", "memcheck", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["ok"] and res["reported"] == 0 and res["n_checks"] == 3
    assert "--quick" in res["command"] and "--no-torch" in res["command"]
    assert cli(["check", "--sanitizer", "racecheck", "--json", str(out)]) == 1
    res = json.loads(out.read_text())
    assert not res["ok"] and res["reported"] == 2 and "no summary line" in res["note"]
    assert "2 hazards reported" in capsys.readouterr().out


def test_tc_check_code_path_in_simulator(monkeypatch):
    """check_tc's own logic (masked rows, L, bounds, repeat launch) with NumPy inputs, in
    the simulator: the tensor-core kernel cannot run here, so kernel='tc' is redirected
    to the plain fa2 kernel (same schedule, same ledger)."""
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("runs the simulator path")
    import gpu
    real = gpu.attention

    def stand_in(*a, **kw):
        kw["kernel"] = "plain"
        return real(*a, **kw)
    monkeypatch.setattr(gpu, "attention", stand_in)
    cfg = dict(N=40, d=16, bh=2, G=2, causal=True, tiles=(16, 16), mask="sparse",
               logit=1.0, MT=1)
    row = C.check_tc(cfg)
    assert row["ok"], row["failures"]
    assert row["masked_rows"] == 16 and row["masked_rows_ok"] and row["identical_repeat"]
    assert row["sdpa_err"] is None and row["bound"] == 2 * row["e_model"]
    assert C.tc_name(cfg) == "fa2-tc N=40 d=16 16x16 MT=1 causal mask G=2"


def test_plan_keeps_only_the_named_algorithms():
    from analysis import check as C
    full = C.plan("quick", ["forward", "backward"])
    only = C.plan("quick", ["forward", "backward"], ["fa2", "standard"])
    assert only and len(only) < len(full)
    for suite, c in only:
        if suite == "backward":
            assert c["algs"] and set(c["algs"]) <= {"fa2", "standard"}
        else:
            assert c["alg"] in ("fa2", "standard")
    # every fa2 / standard configuration of the full plan is still there
    keep = [(s, c.get("alg")) for s, c in full if s == "forward" and c["alg"] != "fa1"]
    assert keep == [(s, c.get("alg")) for s, c in only if s == "forward"]
    with pytest.raises(ValueError, match="algorithms"):
        C.plan("quick", ["forward"], ["fa3"])
