"""iosim.timing.decode and analysis.fit_decode: the split, the predictions, the CLI keys, the committed rows."""
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import analysis.fit_decode as DT
import iosim.timing.decode as DM
from analysis.cli import main
from iosim import DecodeProblem


def test_split_is_deterministic_and_about_half():
    rows = DT.measured_rows()
    first = [DT.split_of(r) for r in rows]
    assert first == [DT.split_of(dict(r)) for r in rows]
    held = first.count("heldout")
    assert 0.4 < held / len(rows) < 0.6
    # the key: only the configuration fields count, not the timing
    r = dict(rows[0], ms_median=123.0, run_id="other")
    assert DT.split_of(r) == DT.split_of(rows[0])


@pytest.mark.parametrize("kv_reads, kv_heads, page", [("per_query_head", 32, None),
                                                      ("per_group", 8, 256)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("S", [None, 1, 4])
def test_predictions_positive_and_monotone_in_N_kv(kv_reads, kv_heads, page, d, S):
    prev = 0.0
    for N_kv in (1024, 2048, 4096, 8192, 16384, 65536, 131072):
        p = DecodeProblem(N_kv=N_kv, d=d, batch=4, heads=32, kv_heads=kv_heads, N_q=1,
                          dtype="fp16", page_size=page)
        out = DM.predict_decode(p, num_splits=S, kv_reads=kv_reads)
        assert out["predicted_ms"] > 0
        assert abs(sum(out["shares"].values()) - 1) < 1e-9
        assert out["binding"] in out["terms_us"]
        if S is not None:       # at fixed num_splits (the rule changes S with N_kv)
            assert out["predicted_ms"] >= prev
        prev = out["predicted_ms"]


def test_h200_is_a_preset_change():
    p = DecodeProblem(N_kv=8192, d=128, batch=8, heads=32, kv_heads=32, N_q=1, dtype="fp16")
    h100 = DM.predict_decode(p, "H100-SXM", 1)
    h200 = DM.predict_decode(p, "H200", 1)
    assert h200["predicted_ms"] > 0 and h200["t_dram_us"] < h100["t_dram_us"]


def test_layout_matches_the_measured_rows():
    for r in DT.measured_rows()[:40]:
        NR = 1 if r["kv_reads"] == "per_query_head" else r["heads"] // r["kv_heads"]
        lay = DM.layout(r["d"], r["dtype"], NR)
        assert {k: lay[k] for k in ("NT", "VW", "LPR", "KPG", "TB")} == \
            {k: r["kernel_layout"][k] for k in ("NT", "VW", "LPR", "KPG", "TB")}


def test_cli_decode_levels_adds_predicted_ms(capsys):
    argv = ["traffic", "--algorithm", "fa2", "--seq-len", "1", "--seq-len-kv", "16384",
            "--head-dim", "128", "--heads", "32", "--kv-heads", "8", "--kv-reads", "per_group",
            "--decode", "--json", "--gpu", "H100-SXM"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "predicted_ms" not in plain
    assert main(argv + ["--levels"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {k: out[k] for k in plain} == plain          # existing keys unchanged
    assert out["predicted_ms"] > 0 and out["decode_time"]["num_splits"] == out["num_splits"]
    p = DecodeProblem(N_kv=16384, d=128, batch=1, heads=32, kv_heads=8, N_q=1, dtype="fp16")
    assert out["predicted_ms"] == pytest.approx(
        DM.predict_decode(p, "H100-SXM", kv_reads="per_group")["predicted_ms"])
    assert main(argv[:-1] + ["H200", "--levels"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_time"]["gpu"] == "H200"


def _committed():
    return [json.loads(l) for l in DT.VALIDATION_PATH.read_text().splitlines()]


def test_committed_validation_rows_are_the_current_models():
    rows = _committed()
    measured = DT.measured_rows()
    assert len(rows) == len(measured)
    fresh = DT.validation_rows(measured[::29])
    by_cfg = {json.dumps(r["config"], sort_keys=True): r for r in rows}
    for f in fresh:
        c = by_cfg[json.dumps(f["config"], sort_keys=True)]
        assert c["predicted_ms"] == pytest.approx(f["predicted_ms"], rel=1e-9)
        assert c["split"] == f["split"] and c["kind"] == DT.KIND
        assert c["constants_source"] == DM.load_constants()["source"]


def test_heldout_summary_in_the_docstring_matches_the_committed_rows():
    s = DT.summarise(_committed(), "heldout")
    assert s == DT.HELDOUT_SUMMARY
    a = s["all"]
    assert (f"median {100 * a['median']:.1f} %, worst {100 * a['worst']:.1f} %, "
            f"{a['within_10pct']} of" in " ".join(DT.__doc__.split()))


def test_predictions_outside_the_measured_rows_say_so(monkeypatch):
    """fp16, N_q = 1, d 64 / 128 on the H100 preset: no warning but the model's own; each
    step outside what was timed (dtype, N_q, d, preset) adds its own."""
    base = dict(N_kv=4096, d=128, batch=2, heads=32, kv_heads=8)
    # the tiled kernel's model, where gpu.decode's default runs the tensor-core or flat
    # kernel (every problem here): the first warning says so
    flat = "this is the tiled main kernel's time"
    w = DM.predict_decode(DecodeProblem(**base), "H100-SXM", main="tiled")["warnings"]
    assert len(w) == 1 and w[0].startswith(flat)
    w = DM.predict_decode(DecodeProblem(**dict(base, dtype="bf16", N_q=4, d=256)), "H200",
                          main="tiled")["warnings"]
    assert [x.split("=")[0] for x in w if not x.startswith(flat)] == ["dtype", "N_q", "d", "gpu"]
    # the default (main="auto") runs the tensor-core kernel's model in fp16 and the flat
    # kernel's in fp32: the one warning of each is its held-out score, read from its
    # constants (fp32: and that only fp16 rows were timed)
    for dt, kernel, name in (("fp16", "tc", "tensor-core"), ("fp32", "flat", "flat")):
        held = DM.load_constants(main=kernel)["heldout"]
        r = DM.predict_decode(DecodeProblem(**dict(base, dtype=dt)), "H100-SXM")
        score = (f"the {name} kernel's model: held-out median {100 * held['median']:.1f} %, "
                 f"{held['within_10pct']} of {held['rows']} rows within 10 % (fitted on the "
                 f"other half of one H100-SXM run)")
        assert r["main"] == kernel and r["warnings"][-1] == score
        assert len(r["warnings"]) == (1 if dt == "fp16" else 2)
    # N_q = 16 on 8 query heads a K/V head: more rows than the flat kernel's registers take
    r = DM.predict_decode(DecodeProblem(**dict(base, N_q=16)), "H100-SXM", kv_reads="per_group")
    assert r["main"] == "tiled" and not any(x.startswith(flat) for x in r["warnings"])
    with pytest.raises(ValueError, match="main='flat'"):
        DM.predict_decode(DecodeProblem(**dict(base, N_q=16)), "H100-SXM",
                          kv_reads="per_group", main="flat")
    # before any fit: main='flat' is declined in one line
    monkeypatch.setattr(DM, "FLAT_CONSTANTS_PATH", Path("/nonexistent/flat.json"))
    with pytest.raises(ValueError, match="main='flat'"):
        DM.predict_decode(DecodeProblem(**base), "H100-SXM", main="flat")
    # a head dim the decode kernels cannot run: no number at all, a one-line refusal
    with pytest.raises(ValueError, match="d=96 is not supported"):
        DM.predict_decode(DecodeProblem(**dict(base, d=96)), "H100-SXM")


def _synthetic_flat_rows(doc, seed=0):
    """decode_bench-shaped flat-kernel rows whose times come from `doc`'s constants with 3 %
    log-normal noise: what the fitter must recover (the model's form is not under test)."""
    import numpy as np
    from iosim import choose_num_splits
    from iosim.launch.decode import ctas_per_sm
    rng = np.random.default_rng(seed)
    rows = []
    for batch in (1, 8, 64):
        for N_kv in (4096, 16384, 65536, 131072):
            for d in (64, 128):
                for H, Hk in ((32, 32), (32, 8), (8, 1)):
                    for page in (None, 16):
                        kv = "per_group" if Hk != H else "per_query_head"
                        p = DT.DecodeProblem(N_kv=N_kv, d=d, batch=batch, heads=H,
                                             kv_heads=Hk, page_size=page)
                        S = choose_num_splits(p, 132, ctas_per_sm(p, kv, "flat"),
                                              kv_reads=kv).num_splits
                        r = dict(kind="decode_bench", impl="flashsim", status="ok",
                                 main_kernel="flat", device="NVIDIA H100 80GB HBM3",
                                 batch=batch, heads=H, kv_heads=Hk, seq_len_q=1,
                                 seq_len_kv=N_kv, d=d, dtype="fp16", paged=page, kv_reads=kv,
                                 num_splits=S, schedule="fa2_decode" if S == 1 else "split_kv",
                                 sweep=None, run_id="synthetic", commit="none",
                                 date="2026-12-07", versions={})
                        ms = DT.predict_row(r, doc, "flat")["predicted_ms"]
                        r["ms_median"] = ms * float(np.exp(rng.normal(0, 0.03)))
                        rows.append(r)
    return rows


def test_flat_fit_recovers_a_known_model_on_its_held_out_half():
    truth = {"constants": dict(t_main0=9.0, L_t=0.9, L_q=0.15, c_t=0.25, c_q=0.04,
                               c_cta=1.5, e_flat=0.88)}
    rows = _synthetic_flat_rows(truth)
    doc = DT.fit_flat(rows)
    assert doc["fit_rows"] == sum(DT.split_of(r) == "fit" for r in rows) >= 40
    assert doc["fitted_space"] == {"dtype": ["fp16"], "N_q": [1], "d": [64, 128],
                                   "gpu": DT.get_hardware("H100-SXM").name}
    held = [r for r in rows if DT.split_of(r) == "heldout"]
    v = DT.validation_rows(held, doc, main="flat")
    # against the noiseless truth: the fit found the model, not the noise
    err = sorted(abs(DT.predict_row(r, doc, "flat")["predicted_ms"]
                     / DT.predict_row(r, truth, "flat")["predicted_ms"] - 1) for r in held)
    # (the worst: a point whose binding term the fit half barely constrains)
    assert err[len(err) // 2] < 0.02 and err[-1] < 0.15, err[-5:]
    s = DT.summarise(v)
    assert s["all"]["rows"] == len(held) and "heads=MHA" in s
    assert all(x["main"] == "flat" for x in v)


def test_flat_model_declines_until_fitted_and_auto_picks_the_kernel(monkeypatch, tmp_path):
    import pytest as _pt
    from iosim import ConfigError
    from iosim.timing import decode as D
    p = DT.DecodeProblem(N_kv=4096, d=128, batch=8, heads=32, kv_heads=8)
    f32 = DT.DecodeProblem(N_kv=4096, d=128, batch=8, heads=32, kv_heads=32, dtype="fp32")
    monkeypatch.setattr(D, "FLAT_CONSTANTS_PATH", tmp_path / "absent.json")
    monkeypatch.setattr(D, "TC_CONSTANTS_PATH", tmp_path / "absent_tc.json")
    # auto: the tensor-core kernel in fp16 (here a block's 4 rows), the flat one in fp32
    with _pt.raises(ConfigError, match="main='tc': the tensor-core decode kernel's time is "
                                       "not modelled"):
        D.predict_decode(p, kv_reads="per_group", main="auto")
    with _pt.raises(ConfigError, match="main='flat': the flat decode kernel's time is not modelled"):
        D.predict_decode(f32, main="auto")
    # N_q = 16 on 4 query heads a K/V head: too many rows for the flat kernel; auto = tiled
    q = DT.DecodeProblem(N_kv=4096, d=128, batch=8, heads=32, kv_heads=8, N_q=16)
    r = D.predict_decode(q, kv_reads="per_group", main="auto")
    assert r["main"] == "tiled" and not any("flat kernel here" in w for w in r["warnings"])
    with _pt.raises(ConfigError, match="main='bogus' is not allowed"):
        D.predict_decode(p, main="bogus")


@pytest.mark.parametrize("command", ["constants", "validate"])
def test_fit_decode_flat_before_its_fit_is_one_line(command, monkeypatch, tmp_path, capsys):
    """`python3 -m analysis.fit_decode constants|validate --main flat` with no fitted
    constants: exit status 2 and one line naming main='flat', not a traceback."""
    monkeypatch.setattr(DM, "FLAT_CONSTANTS_PATH", tmp_path / "absent.json")
    monkeypatch.setattr(DT, "VALIDATION_FLAT_PATH", tmp_path / "rows.jsonl")
    assert DT.main([command, "--main", "flat"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "main='flat'" in lines[0] and "not modelled" in lines[0], err
    assert not (tmp_path / "rows.jsonl").exists()


def _running_per_row(rows, slots):
    """An independent step-by-step run of the streaming model's schedule: every running
    CTA moves one row a step; a freed slot takes the next CTA in grid order at once.
    Returns how many CTAs run in each step."""
    waiting, running, out = list(rows), [], []
    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.pop(0))
            running = [r for r in running if r > 0]      # an empty CTA frees its slot at once
        if running:
            out.append(len(running))
            running = [r - 1 for r in running if r > 1]
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.integers(1, 8))
def test_stream_schedule_matches_a_step_by_step_run(rows, slots):
    segs = DM.schedule_segments(rows, slots)
    expanded = [int(n) for dw, n in segs for _ in range(int(round(dw)))]
    assert all(float(dw).is_integer() and dw > 0 for dw, _ in segs)
    assert expanded == _running_per_row(rows, slots)
    assert sum(dw * n for dw, n in segs) == sum(rows)


def test_stream_model_tail_runs_faster_than_the_full_grid():
    """A uniform grid of 1.5 waves: the half wave runs at a rate of its own (faster where
    the HBM, not latency, bound the full one), so it costs less than a full wave."""
    k = dict(t_main0=0.0, L_t=1.0, L_q=0.0, c_t=0.0, c_q=0.0, c_cta=0.0, L_p=0.0, e_tc=0.9)
    one = DecodeProblem(N_kv=16384, d=128, batch=25, heads=32, kv_heads=8)     # 200 CTAs
    lay = DM.flat_shape(one, 1, "per_group", "tc")
    slots = 132 * lay["resident"]
    assert lay["ctas"] == 200 and slots == 132
    full = DM.predict_decode(DecodeProblem(N_kv=16384, d=128, batch=33, heads=32, kv_heads=4),
                             num_splits=1, kv_reads="per_group", main="tc",
                             constants={"constants": k})            # 132 CTAs of 8 rows
    both = DM.predict_decode(one, num_splits=1, kv_reads="per_group", main="tc",
                             constants={"constants": k})
    assert full["ctas"] == 132
    assert full["main_ms"] < both["main_ms"] < 2 * full["main_ms"]
