"""Backward schedules: executed counts == closed forms; gradients == float64 reference."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from iosim.backward import (BackwardLedger, backward_closed_form, backward_closed_form_arrays,
                            execute_backward, reference_attention_backward)
from iosim.problem import ConfigError, Problem
from iosim.schedules import random_inputs
from iosim.tiling import Tiling

ALGS = ("standard", "fa1", "fa2")


def _inputs(p, seed):
    q, k, v = random_inputs(p, seed)
    do = np.random.default_rng(seed + 1).standard_normal((p.batch, p.heads, p.N, p.d)).astype(p.np_dtype)
    return q, k, v, do


def _rel(a, b):
    """Max error relative to max |b|, floored at 1 (inputs are O(1); a gradient that is
    exactly 0 in float64, e.g. dQ at N = 1, comes out as float32 round-off)."""
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1.0))


@st.composite
def problems(draw):
    N = draw(st.integers(1, 40))
    d = draw(st.sampled_from([1, 4, 8]))
    kv = draw(st.sampled_from([1, 2]))
    heads = kv * draw(st.sampled_from([1, 2]))
    B_r, B_c = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    causal = draw(st.booleans())
    mask = None
    if draw(st.booleans()):
        T_r, T_c = -(-N // B_r), -(-N // B_c)
        bits = draw(st.lists(st.booleans(), min_size=T_r * T_c, max_size=T_r * T_c))
        mask = np.array(bits, dtype=bool).reshape(T_r, T_c)
    p = Problem(N=N, d=d, batch=draw(st.integers(1, 2)), heads=heads, kv_heads=kv,
                dtype="fp32", causal=causal, block_mask=mask)
    return p, Tiling(B_r, B_c), draw(st.sampled_from(ALGS)), draw(st.integers(0, 1000))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_executed_equals_closed_form_and_reference(case):
    p, t, alg, seed = case
    q, k, v, do = _inputs(p, seed)
    ex = execute_backward(alg, p, t, q, k, v, do)
    assert ex.ledger.counts() == backward_closed_form(alg, p, t).counts()
    ref = reference_attention_backward(q, k, v, do, causal=p.causal, block_mask=p.block_mask,
                                       B_r=t.B_r, B_c=t.B_c)
    for got, want in zip((ex.dq, ex.dk, ex.dv), ref):
        assert got.shape == want.shape
        assert _rel(got, want) < 1e-4


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 300), d=st.integers(1, 128), B_r=st.integers(1, 70), B_c=st.integers(1, 70),
       causal=st.booleans(), alg=st.sampled_from(ALGS), group=st.sampled_from([1, 4]))
def test_vectorised_equals_scalar_closed_form(N, d, B_r, B_c, causal, alg, group):
    p = Problem(N=N, d=d, batch=3, heads=4, kv_heads=4 // group, dtype="fp16", causal=causal)
    led = backward_closed_form(alg, p, Tiling(B_r, B_c))
    arr = backward_closed_form_arrays(alg, np.array([N, N]), d, B_r, B_c, causal=causal,
                                      itemsize=2, batch=3, heads=4, kv_heads=4 // group)
    assert int(arr["hbm_bytes"][0]) == led.hbm_bytes
    assert {t: int(c[0]) for t, c in arr["reads"].items() if int(c[0])} == \
        {t: r for t, r in ((t, v) for t, v in led.reads.items()) if r}


def test_hand_counts_dense_fa1_fa2_standard():
    # N=10, d=3, B_r=4, B_c=5: T_r=3, T_c=2, one instance; counted by hand from Algorithm 4.
    p, t = Problem(N=10, d=3, dtype="fp16"), Tiling(4, 5)
    fa1 = backward_closed_form("fa1", p, t).counts()
    # Q, O, dO, dQ read once per (j, i): T_c * N * d = 60; K, V read once: 30.
    assert fa1["Q"] == (60, 0) and fa1["O"] == (60, 0) and fa1["dO"] == (60, 0)
    assert fa1["dQ"] == (60, 30 + 60) and fa1["K"] == (30, 0) and fa1["dK"] == (0, 60)
    assert fa1["l"] == (20, 0) and fa1["m"] == (20, 0)
    fa2 = backward_closed_form("fa2", p, t)
    c = fa2.counts()
    assert c["dQacc"] == (60 + 30, 30 + 60) and c["D"] == (20, 10) and c["dO"] == (30 + 60, 0)
    # dQacc is float32: 4 bytes per element even for fp16 problems.
    assert fa2.read_bytes_of("dQacc") == 90 * 4 and fa2.read_bytes_of("dO") == 90 * 2
    std = backward_closed_form("standard", p, t).counts()
    assert std["P"] == (200, 0) and std["dP"] == (100, 100) and std["dS"] == (200, 100)
    # V read once per query block (T_r = 3), Q once per key block (T_c = 2).
    assert std["V"] == (90, 0) and std["Q"] == (60, 0)


def test_causal_skips_tiles():
    # N=8, B_r=B_c=4 causal: tiles (0,0), (1,0), (1,1) active, (0,1) skipped.
    p, t = Problem(N=8, d=2, causal=True), Tiling(4, 4)
    c = backward_closed_form("fa1", p, t).counts()
    assert c["Q"] == (3 * 4 * 2, 0)          # three active tiles of 4 query rows
    s = backward_closed_form("standard", p, t).counts()
    assert s["dP"] == (3 * 16, 3 * 16)


def test_grouped_reduction_counted():
    p1 = Problem(N=6, d=2, batch=1, heads=4, kv_heads=4)
    p4 = Problem(N=6, d=2, batch=1, heads=4, kv_heads=1)
    t = Tiling(3, 3)
    a, b = backward_closed_form("fa2", p1, t).counts(), backward_closed_form("fa2", p4, t).counts()
    assert b["dK"][0] - a["dK"][0] == 4 * 6 * 2 and b["dK"][1] - a["dK"][1] == 1 * 6 * 2


def test_fp16_gradients_close():
    p, t = Problem(N=33, d=16, heads=2, dtype="fp16", causal=True), Tiling(8, 16)
    q, k, v, do = _inputs(p, 7)
    ref = reference_attention_backward(q, k, v, do, causal=True)
    for alg in ALGS:
        ex = execute_backward(alg, p, t, q, k, v, do)
        for got, want in zip((ex.dq, ex.dk, ex.dv), ref):
            assert _rel(got, want) < 2e-2, alg


def test_ledger_bytes_units():
    p, t = Problem(N=16, d=4, dtype="fp16"), Tiling(4, 4)
    led = backward_closed_form("fa2", p, t)
    assert isinstance(led, BackwardLedger)
    manual = sum(r * (4 if n in ("D", "L", "dQacc") else 2) for n, r in led.reads.items())
    assert led.hbm_read_bytes == manual


def test_bad_input():
    p, t = Problem(N=8, d=2), Tiling(4, 4)
    with pytest.raises(ConfigError, match="algorithm='fa3'"):
        backward_closed_form("fa3", p, t)
    with pytest.raises(ConfigError, match="do has shape"):
        execute_backward("fa1", p, t, *random_inputs(p), do=np.zeros((1, 1, 8, 3)))
