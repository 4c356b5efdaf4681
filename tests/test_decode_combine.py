"""The split-KV combine (version 2): the kernel against iosim.combine_partials in float64
(in the simulator), its counts, its launch geometry, and its time model's constants."""
from __future__ import annotations

import json

import numpy as np
import pytest

from iosim import ConfigError, DecodeProblem, combine_partials
from iosim.launch.decode import COMBINE_UNROLL, COMBINE_WARPS, combine_plan


def _run_combine(Op, Lp, dt="fp32", warps=None):
    from numba import cuda
    from gpu._launch import SIM, launch
    from gpu.decode import split_kv as K
    B, H, S, N_q, d = Op.shape
    pl = combine_plan(S, N_q, d, sim=SIM, warps=warps)
    ker = K.combine_kernel(d, dt, N_q, True, pl["NT"])
    o = cuda.device_array((B, H, N_q, d), np.float32 if dt == "fp32" else np.float16)
    L = cuda.device_array((B, H, N_q), np.float32)
    ctr = cuda.to_device(np.zeros((len(K.COUNTED), 2), np.int64))
    launch(ker, B * H, pl["NT"], pl["smem_bytes"], cuda.to_device(Op), cuda.to_device(Lp),
           o, L, np.int64(S), np.int64(H), ctr)
    c = ctr.copy_to_host()
    counts = {name: tuple(int(x) for x in c[K.C[name]]) for name in ("Opart", "Lpart", "O", "L")}
    return o.copy_to_host(), L.copy_to_host(), counts


@pytest.mark.parametrize("S,N_q,d,warps", [(1, 1, 16, None), (40, 2, 40, None),
                                           (7, 1, 32, None), (9, 2, 24, 2), (40, 1, 16, 4)])
def test_combine_matches_float64_and_counts_each_element_once(S, N_q, d, warps):
    """(warps: the splits shared among that many warps, as version 3 runs them on a GPU)"""
    rng = np.random.default_rng(S + d)
    B, H = 2, 3
    Lp = rng.uniform(-4, 4, (B, H, S, N_q)).astype(np.float32)
    Lp[rng.random(Lp.shape) < 0.2] = -np.inf              # splits that saw no key
    Lp[0, 0, :, 0] = -np.inf                              # a row no split saw
    Op = rng.standard_normal((B, H, S, N_q, d)).astype(np.float32)
    Op[np.isneginf(Lp)] = 0.0
    Lp[1, 2, S // 2, N_q - 1] = np.nan                    # a NaN partial
    O, L, counts = _run_combine(Op, Lp, warps=warps)
    O_ref, L_ref = combine_partials(np.moveaxis(Op.astype(np.float64), 2, 0),
                                    np.moveaxis(Lp.astype(np.float64), 2, 0))
    nan_o, nan_l = np.isnan(O_ref), np.isnan(L_ref)
    assert np.array_equal(np.isnan(O), nan_o) and np.array_equal(np.isnan(L), nan_l)
    assert np.all(O[0, 0, 0] == 0) and L[0, 0, 0] == -np.inf
    ok = ~nan_o
    assert np.max(np.abs(O[ok] - O_ref[ok])) <= 1e-5 * max(1.0, np.max(np.abs(O_ref[ok])))
    finite = np.isfinite(L_ref)
    assert np.array_equal(np.isfinite(L), finite)
    assert np.max(np.abs(L[finite] - L_ref[finite])) <= 1e-5
    rows = B * H
    assert counts == {"Opart": (rows * S * N_q * d, 0), "Lpart": (rows * S * N_q, 0),
                      "O": (0, rows * N_q * d), "L": (0, rows * N_q)}


def test_combine_plan_rounds_and_shared_memory():
    pl = combine_plan(264, 1, 128)
    assert pl["NW"] == COMBINE_WARPS and pl["NT"] == 32 * COMBINE_WARPS
    assert pl["rounds"] == -(-264 // (COMBINE_WARPS * COMBINE_UNROLL))
    assert pl["smem_bytes"] == 4 * (264 + 1 + COMBINE_WARPS * 128 + COMBINE_WARPS + pl["NT"])
    sim = combine_plan(5, 2, 16, sim=True)
    assert sim["NW"] == 1 and sim["rounds"] == 2
    assert combine_plan(5, 2, 16, sim=True, warps=4)["NW"] == 4
    with pytest.raises(ValueError, match="warps=3 is not allowed"):
        combine_plan(5, 1, 16, warps=3)


def test_combine_warps_follow_the_splits():
    from iosim.launch.decode import combine_warps
    for S in range(2, 600):
        NW = combine_warps(S)
        assert NW in (1, 2, 4, 8) and NW <= COMBINE_WARPS
        # every warp has a round of U splits to sum, and halving NW would leave it
        # more rounds where it is below the cap
        assert NW == 1 or (NW // 2) * COMBINE_UNROLL < S
        assert NW == COMBINE_WARPS or NW * COMBINE_UNROLL >= S
    assert [combine_warps(S) for S in (2, 4, 5, 8, 9, 16, 17, 264)] == [1, 1, 2, 2, 4, 4, 8, 8]


def test_predict_decode_adds_the_combine_it_is_asked_for():
    from iosim.timing.decode import predict_decode
    p = DecodeProblem(N_kv=65536, d=128, batch=1, heads=8, kv_heads=1)
    v2 = predict_decode(p, main="tc", kv_reads="per_group")
    v1 = predict_decode(p, main="tc", kv_reads="per_group", combine="v1")
    assert v2["combine"] == "v2" and v1["combine"] == "v1" and v2["num_splits"] > 100
    assert v2["main_ms"] == v1["main_ms"] and v2["combine_ms"] < v1["combine_ms"]
    one = dict(main="tc", kv_reads="per_group", num_splits=1)
    assert (predict_decode(p, **one)["predicted_ms"]
            == predict_decode(p, combine="v1", **one)["predicted_ms"])
    # versions 2 and 3 differ only in the warps: the same where S needs all 8
    assert (predict_decode(p, combine="v3", main="tc", kv_reads="per_group")["predicted_ms"]
            == v2["predicted_ms"])
    few = dict(main="tc", kv_reads="per_group", num_splits=2)
    big = DecodeProblem(N_kv=4096, d=128, batch=64, heads=32, kv_heads=32)
    assert (predict_decode(big, combine="v3", **few)["combine_ms"]
            < predict_decode(big, combine="v2", **few)["combine_ms"])
    with pytest.raises(ConfigError, match="combine='v4' is not allowed"):
        predict_decode(p, combine="v4")


def test_rows_are_predicted_with_the_combine_they_ran():
    from analysis.fit_decode import COMBINE_V2_SINCE, combine_version_of
    assert combine_version_of({"date": "2026-12-07T17:08:20+00:00"}) == "v1"
    assert combine_version_of({"date": COMBINE_V2_SINCE}) == "v2"
    assert combine_version_of({"date": "2026-12-08T01:00:00+00:00"}) == "v2"


def test_committed_combine_constants_are_the_fit_of_the_committed_rows():
    from analysis.fit_decode import fit_combine
    from iosim.timing.decode import COMBINE_CONSTANTS_PATH
    committed = json.loads(COMBINE_CONSTANTS_PATH.read_text())
    doc = fit_combine()
    assert doc["source"] == committed["source"] and doc["heldout"] == committed["heldout"]
    for k, v in committed["constants"].items():
        assert doc["constants"][k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
