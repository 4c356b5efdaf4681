"""The validation configuration sets (analysis/configs/*.json, loaded by
analysis.validation_configs): every configuration a valid problem, the counts as declared,
ids and splits as their rules say."""
import json
import os

import pytest

import iosim
from analysis import validation_configs as V

#: configurations per set, as declared (a set never changes after it is declared)
COUNTS = {"levels": 49, "levels_new": 16, "runtime": 168, "variants": 16,
          "runtime_blind": 47, "levels_blind": 14, "levels_fp32_fast": 5,
          "runtime_blind2": 47, "levels_blind2": 18, "runtime_dev3": 33, "levels_dev3": 15,
          "runtime_blind3": 37, "levels_blind3": 16, "runtime_dev4": 14, "runtime_blind4": 42,
          "levels_blind4": 16, "runtime_dev5": 16, "levels_dev5": 11, "runtime_blind5": 42,
          "levels_blind5": 16, "runtime_dev6": 16, "levels_dev6": 8, "runtime_blind6": 42,
          "levels_blind6": 16, "runtime_dev7": 12, "levels_dev7": 8, "runtime_blind7": 42,
          "levels_blind7": 16, "runtime_dev8": 10, "levels_dev8": 12, "runtime_blind8": 42,
          "levels_blind8": 16, "levels_blind9": 16, "levels_dev10": 11, "levels_blind10": 8,
          "runtime_blind11": 51, "levels_blind11": 51, "runtime_blind12": 47,
          "levels_blind12": 47, "runtime_blind13": 24}


def test_counts_and_names():
    assert {k: len(v) for k, v in V.SETS.items()} == COUNTS
    assert list(V.SETS) == list(V.NAMES)
    files = {f[:-5] for f in os.listdir(V._DIR) if f.endswith(".json")}
    assert files == set(V.NAMES)
    for name in V.NAMES:            # each file names its set and its module variable
        with open(os.path.join(V._DIR, f"{name}.json")) as f:
            data = json.load(f)
        assert data["name"] == name and getattr(V, data["variable"]) is V.SETS[name]
        assert data["about"]
    assert sum(len(v) for v in V.RUNTIME_FAMILIES.values()) == COUNTS["runtime"]


@pytest.mark.parametrize("name", V.NAMES)
def test_every_configuration_is_a_valid_problem(name):
    ids = [c["id"] for c in V.SETS[name]]
    assert len(set(ids)) == len(ids)
    for c in V.SETS[name]:
        tiles = (c["block_rows"], c["block_cols"]) if c["block_rows"] else None
        again = V.cfg(c["pass"], c["algorithm"], c["kernel"], c["dtype"], c["batch"],
                      c["heads"], c["N"], c["d"], c["causal"], c["kv_heads"], tiles)
        # the optional N_k and window (runtime_blind11) end the id: _nkN_K, _wLEFT-RIGHT
        again["id"] += (f"_nk{c['N_k']}" if c.get("N_k") else "") + \
            (f"_w{c['window'][0]}-{c['window'][1]}" if c.get("window") else "")
        assert {k: c[k] for k in again} == again          # the id says what the row is
        assert c["pass"] in ("fwd", "bwd") and c["algorithm"] in iosim.ALGORITHMS
        assert c["kernel"] in ("tc", "fast", "plain", "default")
        p = iosim.Problem(N=c["N"], d=c["d"], batch=c["batch"], heads=c["heads"],
                          kv_heads=c["kv_heads"], dtype=c["dtype"], causal=c["causal"],
                          N_k=c.get("N_k"), window=tuple(c.get("window") or (-1, -1)))
        assert p.N == c["N"]
        if tiles:
            iosim.Tiling(*tiles)
        if name.startswith(("runtime_blind", "levels_blind")) or name == "levels_fp32_fast":
            assert c["split"] == "blind"
        elif "_dev" in name:
            assert c["split"] == name.split("_")[1]


def test_runtime_splits_follow_their_rules():
    for fam, cs in V.RUNTIME_FAMILIES.items():
        rows = [c for c in V.RUNTIME if c["family"] == fam]
        assert [{k: v for k, v in r.items() if k not in ("family", "split", "split3")}
                for r in rows] == cs
        assert [r["split"] for r in rows] == ["fit" if i % 2 == 0 else "heldout"
                                              for i in range(len(rows))]
    assert all(c["split3"] == V._hash_split(c) for c in V.RUNTIME)
    assert all(V.family_of(c) == c["family"] for c in V.RUNTIME)
    assert all(c["split"] == "variant" for c in V.FAST_VARIANTS)


def test_unknown_set_is_one_line():
    with pytest.raises(ValueError, match="set='nope' is not known; allowed: levels,"):
        V.load("nope")
