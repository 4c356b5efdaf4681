"""Figure 14 (analysis/figures/fig14_decode.py): model panels without rows, measured
panels from decode_bench rows."""
import os

import pytest

from analysis.figures import fig14_decode as f
from analysis.figures import get


def _row(impl, batch, N_kv, ms, paged=None, attn="mha", **kw):
    H, Hk = (32, 32) if attn == "mha" else (32, 8)
    dram = 2 * batch * Hk * N_kv * 128 * 2 + 2 * batch * H * 128 * 2 + 4 * batch * H
    return {"kind": "decode_bench", "run_id": "decode_bench-test", "device": "NVIDIA H100 80GB HBM3",
            "date": "2026-11-25", "commit": None, "versions": {}, "impl": impl, "dtype": "fp16",
            "batch": batch, "heads": H, "kv_heads": Hk, "seq_len_q": 1, "seq_len_kv": N_kv,
            "d": 128, "paged": paged, "attn": attn, "status": "ok", "ms_median": ms,
            "dram_bytes": dram, "num_splits": kw.pop("num_splits", 1), **kw}


def test_fig14_is_registered():
    assert get("fig14") is f and get("fig14_decode") is f


def test_fig14_without_rows(tmp_path):
    data = f.generate(rows=[])
    assert not data["has_rows"] and data["measured"] == [] and data["sweep_measured"] == []
    mha = data["series"]["MHA"]
    gqa = data["series"]["GQA per_group"]
    # per_group reads K/V once for 4 query heads: about a quarter of the bytes
    assert all(g["fa2_decode"] < m["fa2_decode"] / 3.5 for g, m in zip(gqa, mha))
    # the rule: batch 1 x 32 heads fills 132 SMs at S = 5; partials stay within 5 %
    assert data["rule"]["num_splits"] == 5
    assert all(p["partial_pct"] <= 5 for p in data["sweep"] if p["S"] <= 5)
    paths = f.save(f.plot(data), str(tmp_path), "f14", data["config"])
    assert os.path.getsize(paths[0]) > 5000


def test_fig14_with_rows(tmp_path):
    rows = [_row("flashsim", 1, n, 0.01 * n / 1024) for n in (1024, 4096, 16384)]
    rows += [_row("torch_sdpa", 1, n, 0.02 * n / 1024) for n in (1024, 4096)]
    rows += [_row("flashsim", 8, 4096, 0.1, paged=256, attn="gqa")]
    rows += [_row("flashsim", 1, 16384, 0.05, num_splits=S, sweep="num_splits",
                  shape=f.SWEEP_SHAPE) for S in (1, 2, 5)]
    rows += [dict(_row("flashsim", 64, 131072, None), status="skipped")]
    data = f.generate(rows=rows)
    assert data["has_rows"] and len(data["measured"]) == 6
    assert [s for s, _ in data["sweep_measured"]] == [1, 2, 5]
    m = next(x for x in data["measured"] if x["impl"] == "flashsim tiled" and x["N_kv"] == 16384)
    assert m["gbps"] == pytest.approx(rows[2]["dram_bytes"] / 0.16 / 1e6)
    paths = f.save(f.plot(data), str(tmp_path), "f14", data["config"])
    assert os.path.getsize(paths[0]) > 5000


# --- the flat kernel's runs beside the tiled kernel's (tests/test_decode_goal_table.py's rows)
from test_decode_goal_table import (FLAT_H100, FLAT_H200, H100, H200, OLD_H100,  # noqa: E402
                                    synthetic_rows)


def test_fig14_panel_a_is_the_newest_run_of_the_current_kernels(tmp_path):
    rows = synthetic_rows()
    data = f.generate(rows=rows)
    # the H200's run is the newest: its roof, its rows only (paged ones kept apart)
    assert data["current"] and data["config"]["run"] == FLAT_H200
    assert data["config"]["gpu"] == "H200" and data["config"]["hbm_bandwidth"] == 4.8e12
    assert sorted(((m["impl"], m["paged"]) for m in data["measured"]), key=str) == \
        [("flashsim flat", 256), ("flashsim flat", None), ("torch_sdpa", None)]
    # on the H100: the flat run's default kernel, its tiled kernel and SDPA; d = 128, 32
    # query heads (MHA, GQA 32/8), uniform lengths; the latest row of a point
    h = f.generate(rows=rows, device="H100")
    assert h["config"]["run"] == FLAT_H100 and h["config"]["gpu"] == "H100-SXM"
    want = {}
    for r in rows:
        if (r["run_id"] == FLAT_H100 and r["status"] == "ok" and not r.get("sweep")
                and not r.get("ragged") and r["heads"] == 32):
            name = {"flashsim": "flashsim flat", "flashsim_tiled": "flashsim tiled"}.get(
                r["impl"], r["impl"])
            want[(name, r["attn"].upper(), r["batch"], r["paged"], r["seq_len_kv"])] = \
                r["dram_bytes"] / r["ms_median"] / 1e6
    got = {(m["impl"], m["attn"], m["batch"], m["paged"], m["N_kv"]): m["gbps"]
           for m in h["measured"]}
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k]) for k in want)
    assert {k[0] for k in got} == {"flashsim flat", "flashsim tiled", "torch_sdpa"}
    paths = f.save(f.plot(h), str(tmp_path), "f14", h["config"])
    assert os.path.getsize(paths[0]) > 5000


def test_fig14_only_old_rows_show_the_tiled_kernel():
    rows = [r for r in synthetic_rows() if r["run_id"] == OLD_H100]
    data = f.generate(rows=rows)
    assert not data["current"] and data["config"]["run"] == OLD_H100
    assert {m["impl"] for m in data["measured"]} == {"flashsim tiled", "torch_sdpa"}


def test_fig14_model_errors_predict_only_the_tiled_kernel(monkeypatch):
    """Panel (b) is the tiled model's validation: flat-kernel rows never reach it, nor
    rows of another preset than the one it was fitted on."""
    from analysis import fit_decode
    seen = []

    def spy(rows, *a, **kw):
        seen.extend(rows)
        return [{"split": "heldout", "schedule": r["schedule"], "layout": "contiguous",
                 "rel_error": 0.01} for r in rows]
    monkeypatch.setattr(fit_decode, "validation_rows", spy)
    rows = synthetic_rows()
    for r in rows:
        if r["impl"] == "flashsim" and "main_kernel" not in r:
            r["schedule"] = "split_kv"       # the old run's rows (the tiled kernel)
    errs = f.model_errors(rows)
    assert seen and all(r.get("main_kernel", "tiled") == "tiled" for r in seen)
    assert all(r["device"] == H100 and r["impl"] in ("flashsim", "flashsim_tiled") for r in seen)
    assert {r["run_id"] for r in seen} == {OLD_H100, FLAT_H100}
    assert sum(len(v) for v in errs.values()) == len(seen)
    flat = [r for r in rows if r.get("main_kernel") == "flat" and r["status"] == "ok"]
    assert flat and not any(r is s for r in flat for s in seen)
    # the same flat rows, called tiled, would be predicted: the filter is what keeps them out
    seen.clear()
    f.model_errors([dict(r, main_kernel="tiled") for r in flat])
    assert len(seen) == len([r for r in flat if r["device"] == H100])
    assert not any(r["device"] == H200 for r in seen)
    # the flat kernel's model: its own H100 rows only, never the tiled kernel's
    seen.clear()
    f.model_errors(rows, main="flat")
    assert seen and all(r.get("main_kernel") == "flat" and r["impl"] == "flashsim"
                        and r["device"] == H100 for r in seen)
    assert len(seen) == len([r for r in flat if r["device"] == H100])
