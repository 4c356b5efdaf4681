"""`flashsim check --suite variants` (analysis/check_variants.py): the flash-attn test
matrix. Its plan (the covering design), sharding and merging; its rows in Numba's CUDA
simulator (tiny sizes, the rounding model's bound); that a refusal is reported as
refused, a wrong output as a failure; on a GPU (marked `gpu`) the quick matrix."""
import json

import numpy as np
import pytest

import _background
from analysis import check as C
from analysis import check_variants as V
from analysis.cli import main as cli


def _sim():
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("runs the simulator path")


def test_plan_is_a_covering_design():
    full = V.configs("full")
    assert len(full) == len(V.DS) * len(V.DTYPES) * V.ROWS_PER_GROUP == 288
    assert full == V.configs("full")                       # deterministic
    cov = V.coverage(full)
    # every d meets every pair, every pair many d
    assert len(cov[("d", "pair")]) == len(V.DS) * len(V.PAIRS)
    per_pair = {p: {d for (d, q) in cov[("d", "pair")] if q == p} for p in V.PAIRS}
    assert min(len(ds) for ds in per_pair.values()) >= 10
    # every mask, dtype and head layout with each other, and each d with each mask
    for a, b, n in (("mask", "dtype", 12), ("dtype", "heads", 9), ("pair", "mask", 20),
                    ("d", "mask", 48), ("d", "dtype", 36)):
        assert len(cov[(a, b)]) == n, (a, b)
    assert {(r["heads"], r["kv_heads"]) for r in full} == {(4, 4), (4, 2), (4, 1)}
    assert all(r["batch"] == 2 for r in full)
    # rows that see no key occur (causal with N_q > N_k)
    assert any(r["causal"] and r["N_q"] > r["N_k"] for r in full)
    quick = V.configs("quick")
    assert 20 <= len(quick) <= 36 and all(r in full for r in quick)
    qc = V.coverage(quick)
    assert len(qc[("d", "d")]) == 12 and len(qc[("pair", "pair")]) == 10
    assert len(qc[("mask", "dtype")]) == 12
    sim = V.configs("sim")
    assert all(max(r["N_q"], r["N_k"]) <= 64 for r in sim)
    assert {r["dtype"] for r in sim} == set(V.DTYPES) and len({r["mask"] for r in sim}) == 4
    assert len(C.plan("full", ["variants"])) == 288


def test_shards_split_the_plan_by_compile_group():
    cases = C.plan("full", ["variants"])
    shards = [C.shard_plan(cases, i, 12) for i in range(12)]
    got = [c for s in shards for c in s]
    assert sorted(map(V.name, (c for _, c in got))) == sorted(V.name(c) for _, c in cases)
    groups = [{c["group"] for _, c in s} for s in shards]
    assert all(len(g) == 3 for g in groups)                # 36 groups, 3 per shard
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1:])
    # (d, dtype) is the group: no two shards compile the same kernels
    keys = [{(c["d"], c["dtype"]) for _, c in s} for s in shards]
    assert all(not (a & b) for i, a in enumerate(keys) for b in keys[i + 1:])
    # and each of the 12 gets one group of each dtype (their compile times differ)
    assert all(sorted(dt for _, dt in k) == sorted(V.DTYPES) for k in keys)
    # other suites: every configuration its own group
    fw = C.plan("full", ["forward"])
    assert C.shard_plan(fw, 1, 4) == fw[1::4]
    with pytest.raises(ValueError, match="shard index=3"):
        V.shard([1, 2], 3, 3)
    with pytest.raises(ValueError, match="shard count=0"):
        V.shard([1, 2], 0, 0)


def test_bad_shard_is_one_line(capsys):
    assert cli(["check", "--suite", "variants", "--shard", "5/5"]) == 2
    err = capsys.readouterr().err
    assert "shard='5/5' is not allowed" in err and len(err.strip().splitlines()) == 1


def _sim_suite_job():
    """`flashsim check --suite variants --json FILE` in the simulator, as a child process
    (a background job, tests/_background.py: its ~50 s of simulator work runs beside the
    other tests); (exit status, stdout, stderr, the JSON or None). None on a GPU."""
    from gpu._launch import SIM
    if not SIM:
        return None
    return _background.check_suite("variants", timeout=900)


@pytest.mark.prestart(job=_sim_suite_job)
def test_variants_suite_in_simulator():
    """The simulator's rows: every row passes (counts exact, outputs written, errors within
    2 x the rounding model + 1e-5), except a row gpu.attention refuses: reported as
    refused, with its reason, counted apart (bf16 until gpu.attention takes it). The
    command runs as `flashsim check` does, in a child process (_sim_suite_job)."""
    _sim()
    rc, text, err, data = _background.result(_sim_suite_job)
    assert data is not None, (rc, text[-3000:], err[-3000:])
    assert rc == 0 and data["n_failed"] == 0, text
    assert data["n_passed"] + data["n_refused"] == data["n_rows"] == len(V.SIM_ROWS)
    assert data["n_passed"] >= 6
    refused = [r for r in data["rows"] if r["status"] == "refused"]
    assert all(r["dtype"] == "bf16" and "dtype" in r["refused"] for r in refused)
    if refused:
        assert f"{len(refused)} refused" in text and "REFUSED variants" in text
    for r in data["rows"]:
        if r["status"] == "pass":
            assert r["counts_fwd_ok"] and r["counts_bwd_ok"] and r["O_written"]
            assert r["grads_written"] and set(r["err"]) == {"O", "dq", "dk", "dv"}
            assert all(r["err"][n] <= r["bound"][n] for n in r["err"])
            assert r["kernel_fwd"] in ("plain", "fast") and r["bound_from"] == "model"
    # rows that see no key were met and got O = 0, L = -inf, dQ = 0
    empty = [r for r in data["rows"] if r["rows_without_key"] and r["status"] == "pass"]
    assert empty and all(r["rows_without_key_ok"] and r["dq_zero_ok"] for r in empty)


def test_refused_is_reported_as_refused(monkeypatch, capsys):
    """A ValueError from gpu.attention: every row refused, none passed or failed, the
    summary line says so and names the reason; exit status 0 (nothing failed)."""
    _sim()
    import gpu

    def refuse(*a, **kw):
        raise ValueError("q has dtype float16; allowed: nothing today")
    monkeypatch.setattr(gpu, "attention", refuse)
    rc = cli(["check", "--suite", "variants"])
    text = capsys.readouterr().out
    n = len(V.SIM_ROWS)
    assert rc == 0
    assert f"0 passed, 0 failed, {n} refused" in text
    assert text.count("REFUSED variants") >= n and "allowed: nothing today" in text


def test_backward_refusal_keeps_the_forward(monkeypatch):
    _sim()
    import gpu.backward

    def refuse(*a, **kw):
        raise ValueError("window=(8, 4) is not allowed here")
    monkeypatch.setattr(gpu.backward, "attention_backward", refuse)
    cfg = V.configs("sim")[0]
    row = V.check(cfg)
    assert row["status"] == "refused" and not row["ok"]
    assert "attention_backward: window" in row["refused"]
    assert row["counts_fwd_ok"] and set(row["err"]) == {"O"}


def test_a_wrong_output_fails(monkeypatch):
    """The check can fail: O off by 1 % is over the bound (and an exception other than a
    ValueError is a failure, not a refusal)."""
    _sim()
    import gpu
    real = gpu.attention

    def off(*a, **kw):
        out = real(*a, **kw)
        return (out[0] * np.float32(1.01),) + tuple(out[1:])
    monkeypatch.setattr(gpu, "attention", off)
    cfg = V.configs("sim")[0]
    row = V.check(cfg)
    assert row["status"] == "fail" and any(f.startswith("O: err") for f in row["failures"])

    def broken(*a, **kw):
        raise RuntimeError("boom")
    monkeypatch.setattr(gpu, "attention", broken)
    res = C.run_checks("sim", ["variants"], repeats=0, shard=(0, len(V.SIM_ROWS)))
    assert res["n_failed"] == 1 and res["n_refused"] == 0
    assert "RuntimeError: boom" in res["rows"][0]["failures"][0]


def test_merge_joins_shards(tmp_path, monkeypatch, capsys):
    rows = lambda p, *st: [dict(suite="variants", name=f"{p}{i}", status=s, ok=s == "pass",
                             failures=[] if s != "fail" else ["x"]) for i, s in enumerate(st)]
    base = dict(kind="check", mode="full", device="GPU", commit="abc", reference="torch",
                suites=["variants"], skipped=[], versions={}, date="2026-11-25", total_s=1)
    a = C.finish_result(dict(base, rows=rows("a", "pass", "refused"), shard=[0, 2]))
    b = C.finish_result(dict(base, rows=rows("b", "pass", "fail"), shard=[1, 2]))
    m = C.merge([a, b])
    assert (m["n_rows"], m["n_passed"], m["n_failed"], m["n_refused"], m["ok"]) == \
        (4, 2, 1, 1, False)
    with pytest.raises(ValueError, match="results differ in commit"):
        C.merge([a, dict(b, commit="def")])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    monkeypatch.setenv("FLASHSIM_RESULTS", str(tmp_path / "data"))
    rc = cli(["check", "--merge", f"{pa},{pb}", "--record", "--run-id", "v-test"])
    text = capsys.readouterr().out
    assert rc == 1 and "2 passed, 1 failed, 1 refused" in text
    recorded = [json.loads(x) for x in (tmp_path / "data" / "check.jsonl").read_text()
                .splitlines()]
    assert len(recorded) == 4 and {r["run_id"] for r in recorded} == {"v-test"}


@pytest.mark.gpu
def test_quick_variants_on_gpu():
    """The quick matrix on a GPU against PyTorch (with torch) or the rounding model: no
    row fails; refused rows (e.g. bf16 before gpu.attention takes it) are counted."""
    result = C.run_checks("quick", ["variants"], repeats=0)
    failed = [(r["name"], r["failures"]) for r in result["rows"] if r["status"] == "fail"]
    assert result["rows"] and not failed, failed
    assert result["n_passed"] + result["n_refused"] == result["n_rows"]


def test_variants_table_from_the_data_set(tmp_path):
    """README's variants table: the latest full run on the H100, passed / rows per (d,
    dtype), failures and refusals named by count; an earlier run is not mixed in."""
    from analysis import results as R
    from analysis import tables as T
    mk = lambda run, d, dt, st: R.make_row(
        "check", run_id=run, device="NVIDIA H100 80GB HBM3", date="2026-11-25", commit="c",
        versions={}, mode="full", suite="variants", d=d, dtype=dt, status=st,
        ok=st == "pass", name=f"{run}{d}{dt}{st}")
    R.append([mk("old", 64, "fp16", "fail"), mk("new", 64, "fp16", "pass"),
              mk("new", 64, "fp16", "refused"), mk("new", 32, "bf16", "fail"),
              mk("new", 32, "fp32", "pass")], data=tmp_path)
    text = T.table_variants(tmp_path)
    lines = {ln.split(" | ")[0]: ln for ln in text.splitlines() if ln.startswith("| ")}
    assert lines["| 64"] == "| 64 | 1/2 (1 refused) | – | – |"
    assert lines["| 32"] == "| 32 | – | 0/1 (1 fail) | 1/1 |"
    assert "2 passed, 1 failed, 1 refused of 4 rows" in text and "`new`" in text
    assert "`old`" not in text


def test_kernel_of_reads_the_launches():
    """tc / fast / plain from the recorded launches' defining modules; the fast backward's
    pre-pass (run before every fa2 backward on a GPU) does not make a row 'fast'."""
    def k(mod, name):
        def f():
            pass
        f.__module__, f.__name__ = mod, name
        return type("K", (), {"py_func": f})()
    pre = (k("gpu.backward.fa2_fast", "fa2_bwd_pre_fast_d64"),)
    assert V.kernel_of([pre, (k("gpu.backward.fa2_tc", "fa2_bwd_tc"),)]) == "tc"
    assert V.kernel_of([pre, (k("gpu.backward.fa2_fast", "fa2_bwd_fast_Br64"),)]) == "fast"
    assert V.kernel_of([pre, (k("gpu.backward.flash", "fa2_bwd_Br16"),)]) == "plain"
    assert V.kernel_of([(k("gpu.forward.fa2", "fa2_fwd_Br64"),)]) == "plain"


def test_an_interrupted_run_resumes_with_its_rows(tmp_path, monkeypatch, capsys):
    """Each row is appended to PATH.rows.jsonl as it is made; a run killed after 3 rows
    resumes with --resume: the 3 rows are kept, only the other configurations run, the
    result holds every row once; a rows file of another plan is refused."""
    _sim()
    calls = []

    def fake(cfg, T=None):
        calls.append(V.name(cfg))
        if len(calls) == 4 and not resumed:
            raise KeyboardInterrupt            # the run is killed while on its 4th row
        return {"ok": True, "status": "pass", "err": {}, "bound": {}, "d": cfg["d"],
                "dtype": cfg["dtype"]}
    monkeypatch.setattr(V, "check", fake)
    out = tmp_path / "v.json"
    resumed = False
    with pytest.raises(KeyboardInterrupt):
        cli(["check", "--suite", "variants", "--json", str(out)])
    rows_file = tmp_path / "v.json.rows.jsonl"
    assert not out.exists() and len(rows_file.read_text().splitlines()) == 1 + 3
    first = calls[:3]
    resumed, calls[:] = True, []
    assert cli(["check", "--suite", "variants", "--json", str(out), "--resume"]) == 0
    data = json.loads(out.read_text())
    n = len(V.SIM_ROWS)
    assert len(calls) == n - 3 and not set(calls) & set(first)
    assert data["n_rows"] == n and sorted(r["case"] for r in data["rows"]) == sorted(first + calls)
    assert not rows_file.exists()                        # removed once the JSON is written
    capsys.readouterr()
    rows_file.write_text(json.dumps({"plan": {"mode": "full"}}) + "\n")
    assert cli(["check", "--suite", "variants", "--json", str(out), "--resume"]) == 2
    assert "another plan" in capsys.readouterr().err
