"""Figures 9-11 (the L2 / DRAM model figures): generate() on reduced grids gives sane
numbers, plot() draws them."""
from __future__ import annotations

import os

import pytest


def test_fig9_levels_small_grid(tmp_path):
    from analysis.figures import fig9_levels as f
    data = f.generate(gpus=("H100-SXM",), Ns=[1024, 4096, 16384, 65536], bhs=[1, 16])
    assert data["calls"] <= 6 + 2 * 6
    for key, pan in data["panels"].items():
        for p in pan["points"]:
            # DRAM reads: at most what is asked of L2 and what is requested, at least the
            # compulsory floor (Q + K + V once; 1 % slack for the model's coarsening)
            assert p["dram"] <= p["l2"] and p["dram"] <= p["requested"] * 1.001
            assert p["dram"] >= 0.99 * p["floor"]
            assert p["requested"] <= p["l2"]
    a = data["panels"]["N|H100-SXM"]
    cr = a["crossing"]
    assert cr is not None and 16384 < cr["x"] <= 65536 and cr["ratio"] > f.THRESHOLD
    assert cr["below"] < cr["x"] and cr["calls"] > 0
    # the measured rows with exactly this configuration are overlaid
    assert {m["N"] for m in a["measured"]} == {4096, 16384, 65536}
    assert all(m["bh"] == 16 for m in a["measured"])
    assert [m["x"] for m in data["panels"]["bh|H100-SXM"]["measured"]] == [16]
    paths = f.save(f.plot(data), str(tmp_path), "f9", data["config"])
    assert os.path.getsize(paths[0]) > 5000
