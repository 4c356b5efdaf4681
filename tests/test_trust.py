"""Trust statements (iosim.timing.trust) and coverage of the models below the ledger:
the committed trust table is what the data set's blind rows give; every prediction
carries a statement; every problem `flashsim traffic` takes gets, with --levels, a number
with a statement or a one-line decline (issue 39)."""
from __future__ import annotations

import itertools
import json

import pytest

import iosim
from iosim.memory.levels import model_problem
from iosim.timing.trust import TABLE_PATH, family_of, table, trust_for


def test_committed_table_is_what_the_blind_rows_give():
    from analysis.fit_runtime import trust_table
    with open(TABLE_PATH) as f:
        committed = json.load(f)
    assert committed == json.loads(json.dumps(trust_table())), \
        "regenerate: python3 -m analysis.fit_runtime trust"


def test_table_counts_blind_rows_only():
    """Each entry's rows: blind splits, frozen predictions; no fitted row's run alone."""
    from analysis import results
    t = table()
    assert t["time"] and t["dram"]
    for what in ("time", "dram"):
        for e in t[what].values():
            assert all(s.startswith("blind") for s in e["splits"]) and e["n"] >= 1
    # the count is the blind rows with a prediction (status ok), recomputed independently
    rows = [r for r in results.load("runtime_validation")
            if str(r.get("split", "")).startswith("blind") and r.get("status") == "ok"
            and r.get("rel_error") is not None]
    assert sum(e["n"] for e in t["time"].values()) == len(rows) == t["rows"]["time"]
    fit_only = {r["run_id"] for r in results.load("runtime_validation", split="fit")} - \
        {r["run_id"] for r in rows}
    used = {i for e in t["time"].values() for i in e["run_ids"]}
    assert not used & fit_only


def test_statement_inside_and_outside():
    hw = "H100-SXM"
    inside = iosim.predict_time("fa2", iosim.Problem(N=4096, d=64, heads=16, dtype="fp16"), hw)
    t = inside["trust"]
    e = table()["time"]["fa2_tc|fp16|fwd|H100-SXM"]
    assert t["validated"] and t["basis"] == "fa2_tc|fp16|fwd|H100-SXM"
    assert t["statement"].startswith(f"time ±{100 * e['p95']:.0f} %") and str(e["n"]) in t["statement"]
    odd = iosim.predict_time("fa2", iosim.Problem(N=4096, d=232, heads=16, dtype="fp16"), hw)
    assert not odd["trust"]["validated"]
    assert "outside validated range: d = 232 never measured" in odd["trust"]["statement"]
    # bf16 has blind rows of its own (runtime_blind11): judged by them, not by fp16's
    bf = iosim.predict_time("fa2", iosim.Problem(N=4096, d=64, heads=16, dtype="bf16"), hw)
    assert bf["trust"]["basis"] == "fa2_tc|bf16|fwd|H100-SXM" and "never measured" not in \
        bf["trust"]["statement"]
    # another preset than the measured ones: outside, with the nearest validated family
    a100 = trust_for("time", "fa2", "fwd", "tc", iosim.Problem(N=4096, d=64, dtype="fp16"),
                     "A100-80GB", (128, 64))
    assert not a100.validated and "no blind rows for fa2_tc fp16 fwd on A100-80GB" in a100.statement
    assert a100.basis == "fa2_tc|fp16|fwd|H100-SXM"
    with pytest.raises(ValueError, match="what='x'"):
        trust_for("x", "fa2", "fwd", "tc", iosim.Problem(N=8, d=8), "H100-SXM")


def test_family_names_match_the_validation_sets():
    from analysis.validation_configs import family_of as config_family
    from iosim.launch import kernel_plan
    from analysis.fit_levels import config_kernel, problem_of
    from analysis.validation_configs import RUNTIME_BLIND8
    hw = iosim.get_hardware("H100-SXM")
    for c in RUNTIME_BLIND8:
        plan = kernel_plan(c["algorithm"], problem_of(c), hw, pass_=c["pass"],
                           kernel=config_kernel(c))
        assert family_of(c["algorithm"], c["pass"], plan.kernel) == config_family(c), c["id"]


def test_bf16_tensor_core_passes_are_their_fp16_build():
    hw = "H100-SXM"
    for alg, pass_ in (("fa2", "fwd"), ("fa1", "fwd"), ("fa2", "bwd")):
        pb = iosim.Problem(N=1024, d=64, heads=4, dtype="bf16", causal=True)
        ph = iosim.Problem(N=1024, d=64, heads=4, dtype="fp16", causal=True)
        b, h = iosim.levels(alg, pb, hw, pass_=pass_), iosim.levels(alg, ph, hw, pass_=pass_)
        assert b["kernel"] == h["kernel"] == "tc" and b["dtype_modelled_as"] == "fp16"
        for k in ("requested_read_bytes", "l2_read_bytes", "dram_read_bytes", "dram_write_bytes"):
            assert b[k] == h[k]
        tb = iosim.predict_time(alg, pb, hw, pass_=pass_)
        assert tb["predicted_ms"] == iosim.predict_time(alg, ph, hw, pass_=pass_)["predicted_ms"]
        # judged by bf16's own blind rows where there are some (the H100's, runtime_blind11)
        assert tb["trust"]["basis"] == f"{tb['trust']['basis'].split('|')[0]}|bf16|{pass_}|H100-SXM"
        assert "bf16 never measured" not in tb["trust"]["statement"]
        # and by its fp16 build's, saying so, where there are none
        t2 = iosim.predict_time(alg, pb, "H200", pass_=pass_)
        assert not t2["trust"]["validated"] and "bf16 never measured" in t2["trust"]["statement"]
    # standard's tensor-core kernels take fp16 only: bf16 runs the plain kernels
    with pytest.raises(ValueError, match="dtype='bf16': the standard fwd pass runs bf16 on its plain"):
        iosim.levels("standard", iosim.Problem(N=1024, d=64, dtype="bf16"), hw)


def test_padded_head_dim_only_changes_unpadded_d():
    """Tensor-core work at d rounded up to 16: d = 40 costs what d = 48 does in W."""
    from iosim.timing.features import launch_features
    hw = iosim.get_hardware("H100-SXM")
    f = {}
    for d in (40, 48):
        p = iosim.Problem(N=2048, d=d, heads=8, dtype="fp16")
        lv = iosim.levels("fa2", p, hw, tiling=iosim.Tiling(128, 64))
        f[d] = launch_features(p, lv, hw)[0]
    assert f[40]["W"] == f[48]["W"] and f[40]["R"] == hw.fp16_tensor_flops


@pytest.mark.parametrize("kw, alg, pass_, words", [
    (dict(N_k=2048), "fa2", "bwd", "N_k=2048"), (dict(N_k=2048), "standard", "fwd", "N_k=2048"),
    (dict(window=(64, 0), causal=True), "fa1", "fwd", "window=(64, 0)"),
    (dict(dropout_p=0.1), "fa2", "fwd", "dropout_p=0.1"),
    (dict(dtype="bf16"), "standard", "fwd", "bf16")])
def test_declines_name_what_is_not_modelled(kw, alg, pass_, words):
    p = iosim.Problem(**{"N": 1024, "d": 64, "heads": 2, "dtype": "fp16", **kw})
    for f in (lambda: iosim.levels(alg, p, "H100-SXM", pass_=pass_),
              lambda: iosim.predict_time(alg, p, "H100-SXM", pass_=pass_)):
        with pytest.raises(ValueError) as e:
            f()
        assert words in str(e.value) and "\n" not in str(e.value)


# every problem the traffic command takes: a number with a statement, or one line
ALGS = (("fa2", "fwd"), ("fa1", "fwd"), ("standard", "fwd"), ("fa2", "bwd"),
        ("standard", "bwd"), ("fa1", "bwd"))
GRID = list(itertools.product(ALGS, ("fp16", "bf16", "fp32"), (1, 8, 64, 80, 96, 128, 192, 256),
                              (False, True), ((-1, -1), (32, 0)), (None, 96), (4, 2)))


def _answer(alg, pass_, p):
    """('ok', levels, time) or ('declined', message)."""
    try:
        lv = iosim.levels(alg, p, "H100-SXM", pass_=pass_)
        t = iosim.predict_time(alg, p, "H100-SXM", pass_=pass_)
    except ValueError as e:
        return "declined", str(e)
    return "ok", lv, t


def test_every_problem_answers_or_declines_in_one_line():
    seen = {"ok": 0, "declined": 0}
    for (alg, pass_), dt, d, causal, window, N_k, kvh in GRID:
        if causal and window[1] not in (-1, 0):
            continue
        p = iosim.Problem(N=128, d=d, heads=4, kv_heads=kvh, dtype=dt, causal=causal,
                          window=window, N_k=N_k)
        got = _answer(alg, pass_, p)
        seen[got[0]] += 1
        where = (alg, pass_, dt, d, causal, window, N_k, kvh)
        if got[0] == "declined":
            assert got[1] and "\n" not in got[1], where
            if ((N_k is None and window == (-1, -1)) or (alg, pass_) == ("fa2", "fwd")) \
                    and dt != "bf16":
                # a plain problem is declined only where a kernel cannot run its head dim
                assert f"d={d}" in got[1] and d > 128 and (alg, pass_) == ("fa2", "bwd"), where
            continue
        _, lv, t = got
        assert (N_k is None and window == (-1, -1)) or (alg, pass_) == ("fa2", "fwd"), where
        assert t["predicted_ms"] > 0 and lv["dram_read_bytes"] >= 0, where
        for tr in (t["trust"], lv["trust"]["time"], lv["trust"]["dram"]):
            assert tr["statement"] and "\n" not in tr["statement"], where
            assert tr["validated"] == (not tr["outside"]), where
        assert t["trust"] == lv["trust"]["time"], where
        # inside the validated range only where a blind row had this d and dtype
        if t["trust"]["validated"]:
            assert d in (64, 128) and dt != "bf16", where
    assert seen["ok"] > 300 and seen["declined"] > 300


def test_varlen_batches_are_declined_in_one_line():
    vp = iosim.VarlenProblem(seqlens_q=(100, 200), seqlens_k=(100, 200), d=64, heads=2,
                             dtype="fp16")
    for f in (iosim.levels, iosim.predict_time):
        with pytest.raises(ValueError, match="problem=VarlenProblem: not modelled below the ledger"):
            f("fa2", vp, "H100-SXM")


def test_model_problem_keeps_covered_problems():
    hw = iosim.get_hardware("H100-SXM")
    p = iosim.Problem(N=4096, d=64, heads=16, dtype="fp16")
    assert model_problem("fa2", p, hw) == (p, None, "auto")
    # fp16 standard at d = 8: its tensor-core kernels take d a multiple of 16, gpu runs plain
    q = iosim.Problem(N=512, d=8, heads=2, dtype="fp16")
    assert model_problem("standard", q, hw)[2] == "plain"
    assert iosim.levels("standard", q, hw)["kernel"] == "default"


def _cli(argv, capsys):
    from analysis.cli import main
    try:
        rc = main(["traffic"] + argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("extra", [
    [], ["--head-dim", "96"], ["--dtype", "bf16", "--causal"], ["--pass", "bwd", "--dtype", "fp32"],
    ["--kv-heads", "2", "--causal"], ["--head-dim", "256", "--algorithm", "standard"]])
def test_cli_levels_prints_the_trust_lines(extra, capsys):
    argv = ["--algorithm", "fa2", "--seq-len", "512", "--head-dim", "64", "--heads", "4",
            "--levels"]
    # later options win (argparse), so extra may override the algorithm and head dim
    rc, out, err = _cli(argv + extra, capsys)
    assert rc == 0, err
    lines = [x for x in out.splitlines() if x.startswith("trust: ")]
    assert len(lines) == 2 and lines[0].startswith("trust: time") and "DRAM" in lines[1]
    rc, out, _ = _cli(argv + extra + ["--json"], capsys)
    js = json.loads(out)
    assert js["time"]["trust"]["statement"] == js["trust"]["time"]["statement"] == lines[0][7:]


@pytest.mark.parametrize("extra, words", [
    (["--seq-len-kv", "1024", "--pass", "bwd"], "N_k=1024"),
    (["--window", "32,0", "--algorithm", "standard"], "window=(32, 0)"),
    (["--dropout", "0.1"], "--dropout=0.1"), (["--dtype", "bf16", "--algorithm", "standard"], "bf16"),
    (["--head-dim", "192", "--pass", "bwd"], "d=192")])
def test_cli_levels_declines_in_one_line(extra, words, capsys):
    rc, out, err = _cli(["--algorithm", "fa2", "--seq-len", "512", "--head-dim", "64",
                         "--levels"] + extra, capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and words in lines[0] and not out, (out, err)


@pytest.mark.parametrize("name, scored", [("runtime_blind11", True),
                                          ("runtime_blind12", True),
                                          ("runtime_blind13", True)])
def test_blind_set_is_declared_and_frozen(name, scored):
    """The issue-39 blind sets: new passes when declared (none in an earlier set), never
    fitted on until scored (blind11, blind12 and blind13, scored on the H100, then joined the
    development rows: form 11's w_sat_tc, form 12's element-wise rounds), their frozen
    predictions committed for the H100 and H200 presets, one per
    configuration, each predicted one with its statement."""
    from analysis.validate import RUNTIME_BLIND_SETS, SPLIT_OF, predictions_path
    from analysis.validation_configs import NAMES, SETS
    configs = SETS[name]
    assert 20 <= len(configs) <= 60
    # levels_blindN counts the same passes (for the DRAM model)
    twin = name.replace("runtime", "levels")
    earlier = {c["id"] for n in NAMES[:NAMES.index(name)] if n != twin for c in SETS[n]}
    ids = {c["id"] for c in configs}
    assert not ids & earlier
    assert (ids <= set(SPLIT_OF)) if scored else not ids & set(SPLIT_OF)
    for gpu in ("H100-SXM", "H200"):
        with open(predictions_path(RUNTIME_BLIND_SETS[name][2], gpu)) as f:
            fr = json.load(f)
        assert [c["id"] for c in fr["configs"]] == [c["id"] for c in configs]
        for c in fr["configs"]:
            if c["status"] == "ok":
                assert c["predicted_ms"] > 0 and c["trust"]["statement"]
            else:
                assert "not modelled" in c["reason"]


@pytest.mark.parametrize("n", [11, 12])
def test_dram_blind_set_is_the_same_passes_frozen(n):
    """LEVELS_BLINDn: the passes of RUNTIME_BLINDn for the L2 / DRAM model, whose
    predictions are frozen on both presets with a DRAM range for every pass."""
    from analysis.validate import LEVELS_BLIND_SETS, predictions_path
    from analysis.validation_configs import SETS
    assert SETS[f"levels_blind{n}"] == SETS[f"runtime_blind{n}"]
    for gpu in ("H100-SXM", "H200"):
        with open(predictions_path(LEVELS_BLIND_SETS[f"levels_blind{n}"][2], gpu)) as f:
            fr = json.load(f)
        assert fr["split"] == f"blind{n}" and fr["gpu_preset"] == gpu
        assert [p["id"] for p in fr["predictions"]] == [c["id"] for c in SETS[f"levels_blind{n}"]]
        for p in fr["predictions"]:
            lo, hi = p["predicted"]["dram_read_bytes_range"]
            assert 0 < lo <= p["predicted"]["dram_read_bytes"] * (1 + 1e-9) and lo <= hi


def test_blind_score_rows(tmp_path):
    """The scorer joins measured rows with the frozen predictions: errors, statuses and
    what each frozen statement said."""
    from analysis.blind_space import score_blind
    from analysis.validate import RUNTIME_BLIND_SETS, predictions_path
    with open(predictions_path(RUNTIME_BLIND_SETS["runtime_blind11"][2], "H100-SXM")) as f:
        fr = json.load(f)
    ok = [c for c in fr["configs"] if c["status"] == "ok"][:3]
    measured = tmp_path / "m.jsonl"
    with open(measured, "w") as f:
        for i, c in enumerate(ok):
            f.write(json.dumps({"config": c["config"], "run_id": "t", "device": "NVIDIA H100 80GB HBM3",
                                "date": "2026-12-06", "tiling": c["tiling"],
                                "measured": {"measured_ms": c["predicted_ms"] * (1 + 0.1 * i),
                                             "kernels": []}}) + "\n")
    rows = score_blind(str(measured), set_name="runtime_blind11", write=False)
    got = {r["config"]["id"]: r for r in rows}
    for i, c in enumerate(ok):
        assert got[c["id"]]["rel_error"] == pytest.approx(1 / (1 + 0.1 * i) - 1)
        assert got[c["id"]]["trust_validated"] == c["trust"]["validated"]
    assert sum(r["status"] == "not_measured" for r in rows) == len(fr["configs"]) - 3


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(alg_pass=st.sampled_from(ALGS), kernel=st.sampled_from(("tc", "fast", "plain", "default")),
       dtype=st.sampled_from(("fp16", "bf16", "fp32")), d=st.integers(1, 256),
       N=st.integers(1, 1 << 18), causal=st.booleans(), grouped=st.booleans(),
       preset=st.sampled_from(("H100-SXM", "H200", "A100-80GB")), what=st.sampled_from(("time", "dram")),
       tiling=st.sampled_from((None, (128, 64), (64, 64), (16, 16))))
def test_trust_for_property(alg_pass, kernel, dtype, d, N, causal, grouped, preset, what, tiling):
    """Any problem: one line; validated exactly when no reason is given; a validated
    statement's basis is the problem's own family, dtype, pass and preset, and covers its
    d, N, causal flag, grouping and tiling."""
    alg, pass_ = alg_pass
    p = iosim.Problem(N=N, d=d, heads=4, kv_heads=2 if grouped else 4, dtype=dtype, causal=causal)
    t = trust_for(what, alg, pass_, kernel, p, preset, tiling,
                  modelled_as="fp16" if dtype == "bf16" else None)
    assert t.statement and "\n" not in t.statement
    assert t.validated == (not t.outside)
    if t.validated:
        e = table()[what][t.basis]
        assert t.basis == f"{family_of(alg, pass_, kernel)}|{dtype}|{pass_}|{preset}"
        assert d in e["d"] and e["N"][0] <= N <= e["N"][1] and causal in e["causal"]
        assert e["grouped"] or not grouped
        assert tiling is None or list(tiling) in e["tilings"]
    else:
        assert "outside validated range" in t.statement


@pytest.mark.parametrize("N, N_k, causal, window", [
    (1000, 1000, True, (-1, -1)), (1000, 3000, False, (-1, -1)), (3000, 1000, True, (-1, -1)),
    (1024, 4096, True, (256, 0)), (2048, 2048, False, (100, 37)), (777, 5000, False, (-1, 64))])
def test_key_block_ranges_are_the_closed_forms_band(N, N_k, causal, window):
    """The fa2 forward's per-CTA key tiles (the L2 stream's and the makespan's) sum to the
    closed form's n_A, and row- and column-weighted to RA and CA, for N_k != N and windows
    (an independent derivation: iosim.closed_form.band_sums)."""
    from iosim.closed_form import band_sums
    from iosim.memory.access import _key_block_range
    from iosim.problem import band_of
    B_r, B_c = 64, 32
    p = iosim.Problem(N=N, d=16, N_k=N_k, causal=causal, window=window)
    j_lo, j_hi = _key_block_range(p, B_r, B_c)
    a = j_hi - j_lo
    rows = [min(B_r, N - i * B_r) for i in range(len(a))]
    cols = [sum(min(B_c, N_k - j * B_c) for j in range(lo, hi)) for lo, hi in zip(j_lo, j_hi)]
    nA, RA, CA, _ = band_sums(N, N_k, B_r, B_c, band_of(N, N_k, causal, window))
    assert (int(a.sum()), sum(r * x for r, x in zip(rows, a)), sum(cols)) == (nA, RA, CA)
    assert (a >= 0).all() and (j_lo >= 0).all() and (j_hi <= -(-N_k // B_c)).all()


def test_fa2_forward_windows_and_unequal_kv():
    """A window that masks nothing more than causal is the causal pass; N_k = N given is
    the default; a narrower window or fewer keys cost less; statements say outside."""
    hw = "H100-SXM"
    base = dict(N=4096, d=64, heads=8, dtype="fp16")
    c = iosim.Problem(**base, causal=True)
    w = iosim.Problem(**base, causal=True, window=(4095, 0))
    assert iosim.predict_time("fa2", w, hw)["predicted_ms"] == iosim.predict_time("fa2", c, hw)["predicted_ms"]
    lc, lw = iosim.levels("fa2", c, hw), iosim.levels("fa2", w, hw)
    assert lc["dram_read_bytes"] == lw["dram_read_bytes"] and lc["l2_read_bytes"] == lw["l2_read_bytes"]
    narrow = iosim.Problem(**base, causal=True, window=(512, 0))
    tn = iosim.predict_time("fa2", narrow, hw)
    assert tn["predicted_ms"] < iosim.predict_time("fa2", c, hw)["predicted_ms"]
    # fp16 windows and N_k != N have blind rows (runtime_blind11); bf16's have none
    assert "never measured" not in tn["trust"]["statement"]
    bf = dict(base, dtype="bf16")
    tb = iosim.predict_time("fa2", iosim.Problem(**bf, causal=True, window=(512, 0)), hw)
    assert "local window (512, 0) never measured" in tb["trust"]["statement"]
    same = iosim.Problem(**base, N_k=4096)
    assert iosim.predict_time("fa2", same, hw)["predicted_ms"] == \
        iosim.predict_time("fa2", iosim.Problem(**base), hw)["predicted_ms"]
    short = iosim.predict_time("fa2", iosim.Problem(**{**bf, "N": 512}, N_k=4096), hw)
    assert "N_k != N (N_k = 4096) never measured" in short["trust"]["statement"]


def test_blind_score_writes_valid_rows(tmp_path):
    """Written into a data folder, the scored rows are valid runtime_validation rows of
    split blind11, stamped with the run id; the trust table then counts the scored ones."""
    from analysis import results
    from analysis.blind_space import score_blind
    from analysis.fit_runtime import trust_table
    from analysis.validate import RUNTIME_BLIND_SETS, predictions_path
    with open(predictions_path(RUNTIME_BLIND_SETS["runtime_blind11"][2], "H100-SXM")) as f:
        fr = json.load(f)
    c = next(c for c in fr["configs"] if "d96" in c["id"] and c["id"].startswith("fwd_fa2-tc_fp16"))
    measured = tmp_path / "m.jsonl"
    measured.write_text(json.dumps({"config": c["config"], "device": "NVIDIA H100 80GB HBM3",
                                    "date": "2026-12-06", "commit": "x", "versions": {},
                                    "tiling": c["tiling"],
                                    "measured": {"measured_ms": 2 * c["predicted_ms"],
                                                 "kernels": []}}) + "\n")
    data = tmp_path / "data"
    data.mkdir()
    score_blind(str(measured), set_name="runtime_blind11", write=True, data=data, run_id="t-run")
    rows = results.load("runtime_validation", data=data)
    assert len(rows) == len(fr["configs"]) and all(r["split"] == "blind11" for r in rows)
    for r in rows:
        results.validate(r)
    t = trust_table(data)["time"]
    assert list(t) == ["fa2_tc|fp16|fwd|H100-SXM"] and t["fa2_tc|fp16|fwd|H100-SXM"]["n"] == 1
    assert t["fa2_tc|fp16|fwd|H100-SXM"]["run_ids"] == ["t-run"]
    assert t["fa2_tc|fp16|fwd|H100-SXM"]["median"] == pytest.approx(0.5)
