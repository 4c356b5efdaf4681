"""Figures 12 (time model against measurements, roofline) and 13 (time by operation),
and the pure parts of analysis.opbreakdown (no GPU, no PyTorch needed)."""
from __future__ import annotations

import json
import os

import pytest

K = 1024
# kernel names as CUPTI reports them (shortened)
STD_KERNELS = [{"name": "gpu::standard::std_S_Br64_Bc64_d64_fp16_causal_t128[abi:v112]", "ms": 18.0},
               {"name": "gpu::standard::std_softmax_Br64_Bc64_causal_t128[abi:v113]", "ms": 4.2},
               {"name": "gpu::standard::std_PV_Br64_Bc64_d64_fp16_causal_t128[abi:v114]", "ms": 14.5}]
FA2_KERNELS = [{"name": "gpu::fa2_tc::fa2_tc_Br64_Bc64_d64_fp16_causal[abi:v51]", "ms": 0.12}]
ENV = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-25T08:00:00Z", "commit": "abc1234",
       "driver": "580.159.04", "versions": {"python": "3.12.3", "torch": "2.11.0+cu130"}}


def _fake_run(run_id="op_breakdown-test", sdpa_error=False):
    """Rows of one made-up run, built by make_rows as a GPU run builds them."""
    from analysis import opbreakdown as OB
    c = OB.problem_config()
    ops = [{"op": o, "measured_ms": ms, "ms_min": ms, "ms_max": ms, "reps": 30, "what": w}
           for (o, w), ms in zip(OB.UNFUSED_OPS, (0.11, 0.09, 0.10, 0.08, 0.10))]
    ops.append({"op": "sequence", "measured_ms": 0.49, "reps": 30})
    fused = lambda ms, p: {"ops": [{"op": "fused", "measured_ms": ms, "reps": 30}],
                           "timer": "cuda_events", "input_sets": 4, "dropout_p": p}
    measured = {
        "pytorch_unfused": {"ops": ops, "timer": "cuda_events", "input_sets": 4},
        "torch_sdpa_flash": [fused(0.07, 0.1), fused(0.05, 0.0)],
        "torch_sdpa_efficient": ([{"error": "RuntimeError: No available kernel", "dropout_p": 0.1},
                                  fused(0.08, 0.0)] if sdpa_error else
                                 [fused(0.09, 0.1), fused(0.08, 0.0)]),
        "flashsim_standard": {"ops": OB.pair_kernels(STD_KERNELS), "timer": "cupti",
                              "tiling": [64, 64], "input_sets": 2, "dropout_p": 0.0},
        "flashsim_fa2": {"ops": OB.pair_kernels(FA2_KERNELS), "timer": "cupti",
                         "tiling": [64, 64], "input_sets": 2, "dropout_p": 0.0},
    }
    model = {"_gpu": "H100-SXM",
             "flashsim_standard": OB.modelled(c, "flashsim_standard", "H100-SXM", (64, 64)),
             "flashsim_fa2": OB.modelled(c, "flashsim_fa2", "H100-SXM", (64, 64))}
    return OB.make_rows(c, measured, ENV, run_id, model)


# --------------------------------------------------------------------------------------
# analysis.opbreakdown: the pure parts
# --------------------------------------------------------------------------------------
def test_opbreakdown_config_and_pairing():
    from analysis import opbreakdown as OB
    c = OB.problem_config()
    assert (c["batch"], c["heads"], c["N"], c["d"], c["dtype"], c["causal"], c["dropout_p"]) == \
        (8, 16, 1024, 64, "fp16", True, 0.1)
    assert c["scale"] == pytest.approx(1 / 8)
    for bad in ({"dropout_p": 1.0}, {"dtype": "bf16"}, {"N": 0}, {"seq": 4}):
        with pytest.raises(ValueError):
            OB.problem_config(**bad)
    assert [o for o, _ in OB.unfused_ops(c)] == ["matmul_qk", "mask", "softmax", "dropout",
                                                 "matmul_pv"]
    assert [o for o, _ in OB.unfused_ops(OB.problem_config(causal=False, dropout_p=0.0))] == \
        ["matmul_qk", "softmax", "matmul_pv"]
    fc = OB.flashsim_configs(c)
    assert fc["flashsim_standard"]["algorithm"] == "standard"
    assert fc["flashsim_fa2"]["kernel"] == "tc" and fc["flashsim_fa2"]["causal"]
    assert fc["flashsim_fa2"]["id"] == "fwd_fa2-tc_fp16_b8h16_n1024_d64_causal"
    # every PyTorch op but dropout is paired exactly once by the standard kernels, all by fa2
    paired = [o for k in ("std_S", "std_softmax", "std_PV") for o in OB.PAIRING[k]]
    assert sorted(paired + ["dropout"]) == sorted(OB.OP_NAMES)
    assert set(OB.PAIRING["fa2_tc"]) == set(OB.OP_NAMES)
    assert OB.PAIRING["std_softmax"] == ("mask", "softmax")
    assert "no dropout" in OB.PAIRING_NOTES["std_softmax"]
    got = OB.pair_kernels(STD_KERNELS)
    assert [g["op"] for g in got] == ["std_S", "std_softmax", "std_PV"]
    assert [g["pairs_with"] for g in got] == [["matmul_qk"], ["mask", "softmax"], ["matmul_pv"]]
    assert got[1]["measured_ms"] == 4.2
    with pytest.raises(ValueError, match="pairing"):
        OB.pair_kernels([{"name": "gpu::backward::fa2_bwd_main_x", "ms": 1.0}])


def test_opbreakdown_dropout_is_unpaired_by_standard():
    from analysis import opbreakdown as OB
    paired = {o for k in ("std_S", "std_softmax", "std_PV") for o in OB.PAIRING[k]}
    assert set(OB.OP_NAMES) - paired == {"dropout"}


def test_opbreakdown_model_and_rows():
    from analysis import opbreakdown as OB
    from analysis import results as R
    c = OB.problem_config()
    st = OB.modelled(c, "flashsim_standard", "H100-SXM", (64, 64))
    assert [x["op"] for x in st] == ["std_S", "std_softmax", "std_PV"]
    assert all(x["predicted_ms"] > 0 for x in st)
    fa = OB.modelled(c, "flashsim_fa2", "H100-SXM", (64, 64))
    assert [x["op"] for x in fa] == ["fa2_tc"]
    assert fa[0]["predicted_ms"] < sum(x["predicted_ms"] for x in st)
    rows = _fake_run(sdpa_error=True)
    for r in rows:
        R.validate(r)
        assert r["kind"] == "op_breakdown" and r["run_id"] == "op_breakdown-test"
        assert r["device"] == ENV["device"] and r["versions"]["driver"] == "580.159.04"
    ok = [r for r in rows if r["status"] == "ok"]
    err = [r for r in rows if r["status"] == "error"]
    assert len(err) == 1 and err[0]["impl"] == "torch_sdpa_efficient" and err[0]["dropout_p"] == 0.1
    assert err[0]["measured_ms"] is None and "No available kernel" in err[0]["error"]
    # 5 ops + sequence, 3 fused (one failed), 3 standard kernels, 1 fa2 kernel
    assert len(ok) == 6 + 3 + 3 + 1
    std = [r for r in ok if r["impl"] == "flashsim_standard"]
    assert [r["op"] for r in std] == ["std_S", "std_softmax", "std_PV"]
    assert all(r["predicted_ms"] > 0 and r["binds"] and r["dropout_p"] == 0.0 for r in std)
    assert std[0]["config"]["tiling"] == [64, 64] and std[0]["timer"] == "cupti"
    assert all("predicted_ms" not in r for r in ok if not r["impl"].startswith("flashsim"))
    s = OB.summarize(rows)
    assert s[("pytorch_unfused", 0.1)]["softmax"] == 0.10
    assert s[("torch_sdpa_flash", 0.0)]["fused"] == 0.05
    assert ("torch_sdpa_efficient", 0.1) not in s
    assert json.loads(json.dumps(rows, allow_nan=False)) == rows
    # into a data set and back
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        assert R.append(rows, data=tmp) == (len(rows), 0)
        assert len(R.load("op_breakdown", data=tmp)) == len(rows)


def test_opbreakdown_without_gpu_fails_soft(tmp_path, monkeypatch, capsys):
    from analysis import opbreakdown as OB

    def no_gpu():
        raise OB.NoGPU("torch.cuda.is_available() is False")
    monkeypatch.setattr(OB, "_need_gpu", no_gpu)
    out = tmp_path / "rows.jsonl"
    assert OB.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU and PyTorch" in err[0]
    assert not out.exists()
    assert OB.main(["--out", str(out), "--reps", "5"]) == 2
    assert "at least 20" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# Figure 12
# --------------------------------------------------------------------------------------
def test_fig12_generate(tmp_path):
    import iosim
    from analysis.validate import BLIND_SPLITS
    from analysis import results as R
    from analysis.figures import fig12_runtime_validation as f
    rows = R.load("runtime_validation")
    data = f.generate(rows=rows, max_calls=10)
    scored = [r for r in rows if r.get("measured_ms") is not None
              and r.get("predicted_ms") is not None]
    assert len(data["points"]) == len(scored) >= 300
    assert {p["gpu"] for p in data["points"]} == {"H100-SXM", "H200"}
    # the H200 is never fitted: its rows are held out or blind (frozen predictions)
    assert all(p["split"] in ("heldout",) + BLIND_SPLITS for p in data["points"]
               if p["gpu"] == "H200")
    s = data["stats"][("H100-SXM", "cv")]
    assert 0 < s["median_abs"] <= s["worst_abs"]
    # the time model's cross-validated / held-out error: a median of a few per cent to ~15 %
    assert s["median_abs"] < 0.2 and data["stats"][("H200", "heldout")]["median_abs"] < 0.2
    rf = data["roofline"]
    assert data["calls"] == len(rf["points"]) <= 10
    assert rf["forward_rows"] == sum(1 for r in rows if r["config"]["pass"] == "fwd"
                                     and "H100" in r["device"]
                                     and r["split"] not in BLIND_SPLITS)
    assert {p["family"] for p in rf["points"]} == {"fa2_tc", "fa2_fast", "fa2_plain", "fa1",
                                                   "standard", "fa1_tc", "standard_tc",
                                                   "fa1_fast", "standard_fast"}
    hw = iosim.get_hardware("H100-SXM")
    for p in rf["points"]:
        assert p["achieved_flops"] < hw.fp16_tensor_flops
        if p["unit"] == "fp32":
            assert p["achieved_flops"] < hw.fp32_flops
        assert p["dram_bytes"] > 0 and p["l2_bytes"] >= 0.9 * p["dram_bytes"]
        assert p["intensity_dram"] == pytest.approx(p["flops"] / p["dram_bytes"])
    fam = f.family_roof_summary(data)
    assert fam["fa2_tc"]["median_tflops"] > 10 * fam["standard"]["median_tflops"]
    paths = f.save(f.plot(data), str(tmp_path), "f12", data["config"])
    assert os.path.getsize(paths[0]) > 5000


def test_fig12_flops_exact():
    from analysis.figures.fig12_runtime_validation import flops_of, select_roofline_rows
    c = dict(N=K, d=64, batch=2, heads=3, causal=False)
    assert flops_of(c, (64, 64)) == 4 * K * K * 64 * 6
    # causal, 64 x 64 tiles: 16 * 17 / 2 active tiles of 64 x 64 entries each
    assert flops_of(dict(c, causal=True), (64, 64)) == 4 * 64 * 136 * 64 * 64 * 6
    rows = [{"config": {"pass": "fwd"}, "device": "NVIDIA H100 80GB HBM3", "family": fam}
            for fam in ["a"] * 30 + ["b"] * 5]
    sel = select_roofline_rows(rows, "H100-SXM", 7)
    assert len(sel) <= 7 and {r["family"] for r in sel} == {"a", "b"}


# --------------------------------------------------------------------------------------
# Figure 13
# --------------------------------------------------------------------------------------
def test_fig13_without_rows(tmp_path):
    from analysis.figures import fig13_time_breakdown as f
    data = f.generate(rows=[])
    assert not data["measured"]
    assert all(b["source"] == "modelled" for b in data["bars"])
    st = next(b for b in data["bars"] if b["impl"] == "flashsim_standard")
    assert [k for k, _ in st["segments"]] == ["matmul_qk", "mask+softmax", "matmul_pv"]
    fa = next(b for b in data["bars"] if b["impl"] == "flashsim_fa2")
    assert fa["total"] < st["total"]
    paths = f.save(f.plot(data), str(tmp_path), "f13", data["config"])
    assert os.path.getsize(paths[0]) > 5000


def test_fig13_with_rows(tmp_path):
    from analysis.figures import fig13_time_breakdown as f
    old = _fake_run("op_breakdown-old")
    for r in old:
        r["date"] = "2026-11-01T00:00:00Z"
        if r.get("measured_ms"):
            r["measured_ms"] *= 10
    rows = old + _fake_run(sdpa_error=True)
    data = f.generate(rows=rows)
    assert data["measured"] and data["config"]["run_id"] == "op_breakdown-test"
    assert data["config"]["gpu"] == "H100-SXM" and data["config"]["tiling"]["flashsim_fa2"] == [64, 64]
    a = [b for b in data["bars"] if b["panel"] == "a"]
    assert a[0]["impl"] == "pytorch_unfused"
    assert [k for k, _ in a[0]["segments"]] == ["matmul_qk", "mask", "softmax", "dropout",
                                                "matmul_pv"]
    assert a[0]["total"] == pytest.approx(0.48) and a[0]["sequence_ms"] == 0.49
    labels = [(b["impl"], b.get("dropout_p"), b["source"]) for b in a]
    assert ("torch_sdpa_flash", 0.1, "measured") in labels
    assert ("torch_sdpa_efficient", 0.1, "measured") not in labels   # its row is an error
    assert data["errors"] and data["errors"][0]["impl"] == "torch_sdpa_efficient"
    b = [x for x in data["bars"] if x["panel"] == "b"]
    assert [(x["impl"], x["source"]) for x in b] == [
        ("flashsim_standard", "measured"), ("flashsim_standard", "modelled"),
        ("flashsim_fa2", "measured"), ("flashsim_fa2", "modelled")]
    assert b[0]["total"] == pytest.approx(18.0 + 4.2 + 14.5)
    paths = f.save(f.plot(data), str(tmp_path), "f13", data["config"])
    assert os.path.getsize(paths[0]) > 5000
