"""iosim: executed schedules against closed forms, outputs against dense float64."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from iosim import (ALGORITHMS, ConfigError, PRESETS, Problem, Tiling, active_tiles, closed_form,
                   closed_form_arrays, execute, floor_sum, paper_tiling, random_inputs,
                   reference_attention, resolve_tiling, sram_footprint_bytes)
from analysis.cli import main as cli


def rel_err(x, ref):
    ref = np.asarray(ref, dtype=np.float64)
    return np.linalg.norm(np.asarray(x, dtype=np.float64) - ref) / np.linalg.norm(ref)


@st.composite
def problems(draw):
    N = draw(st.integers(1, 80))
    d = draw(st.sampled_from([1, 3, 8, 16]))
    heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([g for g in (1, 2, 4) if heads % g == 0]))
    t = Tiling(draw(st.integers(1, 24)), draw(st.integers(1, 24)))
    mask = None
    if draw(st.booleans()):
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        mask = rng.random((t.T_r(N), t.T_c(N))) < 0.6
    p = Problem(N=N, d=d, batch=draw(st.integers(1, 2)), heads=heads, kv_heads=kv,
                dtype=draw(st.sampled_from(["fp32", "fp16"])), causal=draw(st.booleans()),
                block_mask=mask)
    return p, t


@settings(max_examples=150, deadline=None)
@given(problems(), st.sampled_from(ALGORITHMS))
def test_closed_form_equals_executed(pt, algorithm):
    p, t = pt
    ex = execute(algorithm, p, t)
    assert ex.ledger.counts() == closed_form(algorithm, p, t).counts()
    assert ex.ledger.hbm_bytes == closed_form(algorithm, p, t).hbm_bytes


@settings(max_examples=60, deadline=None)
@given(problems(), st.sampled_from(ALGORITHMS))
def test_executed_output_matches_float64(pt, algorithm):
    p, t = pt
    q, k, v = random_inputs(p, seed=3)
    ex = execute(algorithm, p, t, q, k, v)
    ref = reference_attention(q, k, v, causal=p.causal, block_mask=p.block_mask, B_r=t.B_r, B_c=t.B_c)
    assert not np.isnan(ex.O).any()
    if np.linalg.norm(ref) == 0:
        assert np.all(ex.O == 0)
        return
    # fp32: float32 arithmetic, 1e-5 of float64. fp16: storage rounding of O (and S, P, O
    # round trips in standard/fa1) at 2^-11 relative each; 4e-3 leaves room for a few.
    assert rel_err(ex.O, ref) <= (1e-5 if p.dtype == "fp32" else 4e-3)


def test_closed_form_arrays_match_scalar():
    rng = np.random.default_rng(0)
    N = rng.integers(1, 3000, 400); d = rng.integers(1, 200, 400)
    Br = rng.integers(1, 300, 400); Bc = rng.integers(1, 300, 400); causal = rng.random(400) < 0.5
    for alg in ALGORITHMS:
        arr = closed_form_arrays(alg, N, d, Br, Bc, causal=causal, itemsize=2, instances=3)
        for i in range(0, 400, 7):
            p = Problem(N=int(N[i]), d=int(d[i]), heads=3, dtype="fp16", causal=bool(causal[i]))
            led = closed_form(alg, p, Tiling(int(Br[i]), int(Bc[i])))
            assert arr["hbm_bytes"][i] == led.hbm_bytes
            assert {t: int(c[i]) for t, c in arr["reads"].items() if c[i]} == \
                   {t: r for t, (r, w) in led.counts().items() if r}


def test_causal_sums_against_mask_enumeration():
    # Independent of the floor-sum algebra: count active tiles by brute force.
    for N, Br, Bc in [(1, 1, 1), (17, 4, 5), (64, 16, 16), (100, 7, 33), (129, 64, 32), (50, 64, 8)]:
        p = Problem(N=N, d=2, causal=True)
        t = Tiling(Br, Bc)
        A = active_tiles(p, t)
        brute = sum(1 for i in range(t.T_r(N)) for j in range(t.T_c(N))
                    if j * Bc <= min((i + 1) * Br, N) - 1)
        assert A.sum() == brute
        # fa2 K reads = sum over active tiles of cols_j * d
        cols = [min(Bc, N - j * Bc) for j in range(t.T_c(N))]
        want = sum(cols[j] for i in range(t.T_r(N)) for j in range(t.T_c(N)) if A[i, j]) * 2
        assert closed_form("fa2", p, t).reads["K"] == want


def test_floor_sum_brute_force():
    rng = np.random.default_rng(5)
    n, m, a, b = (rng.integers(lo, hi, 300) for lo, hi in [(0, 60), (1, 50), (0, 90), (0, 90)])
    got = floor_sum(n, m, a, b)
    want = [sum((a[i] * t + b[i]) // m[i] for t in range(n[i])) for i in range(300)]
    assert list(got) == want


def test_dense_closed_form_textbook_values():
    # Hand-derived: fa2 reads Q once and K, V once per query block: N d (1 + 2 T_r).
    p = Problem(N=1024, d=64, dtype="fp16")
    led = closed_form("fa2", p, Tiling(128, 64))
    assert led.read_elements == 1024 * 64 * (1 + 2 * 8)
    assert led.hbm_write_bytes == 1024 * 64 * 2 + 1024 * 4
    # standard: S and P each written and read once: 4 N^2 elements of fp16 beyond Q, K, V, O.
    led = closed_form("standard", p, Tiling(64, 64))
    assert led.reads["S"] == led.writes["P"] == 1024 ** 2


def test_huge_logits_and_fully_masked_rows():
    p = Problem(N=40, d=8, block_mask=np.array([[False, False, False], [True, False, True], [True, True, True]]))
    t = Tiling(16, 16)
    q, k, v = random_inputs(p, seed=1)
    q = q * 3e3  # scores around 1e4
    ref = reference_attention(q, k, v, block_mask=p.block_mask, B_r=16, B_c=16)
    for alg in ALGORITHMS:
        ex = execute(alg, p, t, q, k, v)
        assert not np.isnan(ex.O).any(), alg
        assert np.all(ex.O[0, 0, :16] == 0), alg   # query block 0 sees no key block
        assert rel_err(ex.O, ref) < 1e-5, alg
    L = execute("fa2", p, t, q, k, v).stats["L"][0, 0]
    assert np.all(np.isneginf(L[:16])) and np.all(np.isfinite(L[16:]))


def test_paper_rule_and_footprint():
    assert paper_tiling(100 * 1024 // 2, 64) == Tiling(64, 200)
    t = resolve_tiling("fa1", 64, "fp16", sram_bytes=100 * 1024)
    assert t == Tiling(64, 200)
    fp = sram_footprint_bytes("fa1", 64, 200, 64, "fp16")
    assert fp == 2 * 64 * (64 + 400) + 4 * (64 * 64 + 64 * 200 + 128)
    with pytest.raises(ConfigError, match=r"block_rows=128, block_cols=128 need \d+ bytes.*sram_bytes=1000"):
        resolve_tiling("fa2", 64, "fp32", block_rows=128, block_cols=128, sram_bytes=1000)


@pytest.mark.parametrize("kwargs, match", [
    (dict(N=0, d=4), "N=0"), (dict(N=4, d=-1), "d=-1"), (dict(N=4, d=4, heads=3, kv_heads=2), "kv_heads=2"),
    (dict(N=4, d=4, dtype="int8"), "dtype='int8'"), (dict(N=4, d=4, block_mask=np.ones((2, 2))), "block_mask"),
])
def test_problem_rejects_bad_input(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Problem(**kwargs)


def test_mask_shape_checked():
    p = Problem(N=32, d=4, block_mask=np.ones((3, 2), dtype=bool))
    with pytest.raises(ConfigError, match=r"must be \(T_r, T_c\) = \(2, 2\)"):
        execute("fa2", p, Tiling(16, 16))


def test_presets_are_consistent():
    for name, hw in PRESETS.items():
        assert hw.smem_per_block_bytes <= hw.smem_per_sm_bytes
        assert hw.l2_bytes < hw.hbm_bytes


def test_cli_traffic_json(capsys):
    assert cli(["traffic", "--algorithm", "fa2", "--seq-len", "1000", "--head-dim", "48",
                "--block-rows", "64", "--block-cols", "32", "--dtype", "fp32", "--batch", "2",
                "--heads", "4", "--kv-heads", "2", "--causal", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = Problem(N=1000, d=48, batch=2, heads=4, kv_heads=2, dtype="fp32", causal=True)
    led = closed_form("fa2", p, Tiling(64, 32))
    assert out["hbm_bytes"] == led.hbm_bytes == out["hbm_read_bytes"] + out["hbm_write_bytes"]
    assert out["block_rows"] == 64 and out["block_cols"] == 32
    assert out["sram_footprint_bytes"] == sram_footprint_bytes("fa2", 64, 32, 48, "fp32")
    assert out["per_tensor"]["K"]["read_bytes"] == led.reads["K"] * 4


@pytest.mark.parametrize("argv, match", [
    (["--seq-len", "0", "--head-dim", "64", "--gpu", "H100-SXM"], "N=0"),
    (["--seq-len", "64", "--head-dim", "64", "--gpu", "B300"], "gpu='B300'"),
    (["--seq-len", "64", "--head-dim", "64", "--sram-bytes", "64"], "head_dim d=64 is too large"),
    (["--seq-len", "64", "--head-dim", "64", "--heads", "3", "--kv-heads", "2", "--gpu", "H200"], "kv_heads=2"),
    (["--seq-len", "64", "--head-dim", "64", "--dtype", "fp8", "--gpu", "H200"], "dtype='fp8'"),
])
def test_cli_bad_input_exit_2(argv, match, capsys):
    assert cli(["traffic", "--algorithm", "fa1", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
