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
    m = next(x for x in data["measured"] if x["impl"] == "flashsim" and x["N_kv"] == 16384)
    assert m["gbps"] == pytest.approx(rows[2]["dram_bytes"] / 0.16 / 1e6)
    paths = f.save(f.plot(data), str(tmp_path), "f14", data["config"])
    assert os.path.getsize(paths[0]) > 5000
