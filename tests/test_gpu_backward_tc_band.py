"""gpu.backward.fa2_tc (the fa2 backward's main kernel on the tensor cores) with N_k != N_q
and local windows (issue 18): bottom-right aligned causal and window=(left, right) as
gpu.attention and iosim.Problem (gpu.forward._band: query row r sees key c iff
lo <= c - r <= hi).

Without a GPU, in Numba's CUDA simulator with the kernel's C++ pieces emulated
(tests/fa2_tc_sim.py; dynamic shared memory starting as NaN bits, dK and dV poisoned with
NaN), at tiny sizes (B_r = 16, B_c = 32 or 64, N_q, N_k <= 70): N_q < N_k and N_q > N_k
(odd sizes, ragged last blocks), windows with and without causal ((w, 0) with causal
among them), rows that see no key, a key block that no row sees, grouped K/V heads, a
block mask on top of the band, MT = 2, fp16 and bf16, padded head dims (40, 59, 10).
Checks: the kernel's own counts equal what iosim.backward_closed_form leaves for the main
kernel (tests/_tc_direct.py), every dK, dV element written, dQ, dK, dV within 2 x the
dtype's rounding of the float64 gradients + 1e-5 (the bound of the kernel's other
simulator tests, tests/test_gpu_backward_tc.py), dQ = 0 exactly on rows that see no key
and dK = dV = 0 exactly on keys that no row sees. Then attention_backward's dispatch with
the tensor-core kernel made available (emulated): kernel='tc' runs it on these problems
and the whole backward's ledger equals the closed form; kernel='auto' does not (it keeps
band problems on the fast / plain kernels: on the flash-attn matrix the tc backward's
16-bit P and dS exceeded 2x torch's error on three banded rows, gpu/backward/flash.py).

On a GPU (`gpu` marker): the same cases at larger sizes, the default tilings, through
fa2_tc.run (bf16 and fp16) and attention_backward(kernel='tc') (fp16, bf16), against
float64 (no torch needed); kernel='auto' there runs the fast kernel.
"""
import numpy as np
import pytest

import iosim
from gpu._launch import SIM

#: N_q, N_k, causal, window, d, dtype, query heads I, K/V heads I_k, (B_r, B_c), MT
SIM_CASES = [
    (17, 40, False, (-1, -1), 16, "fp16", 2, 1, (16, 32), 1),   # N_q < N_k, grouped K/V
    (40, 17, True, (-1, -1), 16, "fp16", 2, 2, (16, 32), 1),    # rows 0..22 see no key
    (33, 47, False, (5, 3), 40, "bf16", 2, 1, (16, 32), 1),     # window, padded d
    (37, 50, True, (7, 0), 59, "fp16", 2, 1, (16, 32), 1),      # (w, 0) + causal, odd d
    (24, 70, False, (2, 0), 16, "bf16", 1, 1, (16, 32), 1),     # key block 0: no row
    (50, 21, False, (3, 1), 10, "bf16", 2, 1, (16, 32), 1),     # rows 0..25 see no key
    (45, 45, True, (9, 0), 32, "fp16", 1, 1, (16, 64), 2),      # N_q = N_k window, MT = 2
    (29, 29, False, (4, 6), 16, "fp16", 1, 1, (16, 32), 1),     # window only, N_q = N_k
]


def _problem_data(Nq, Nk, causal, window, d, dt, I, I_k, block_mask=None, tiles=None):
    """Rounded inputs, float64 values, L and D (from the float64 forward, O rounded to dt
    as stored), the allowed (N_q, N_k) pairs, and the float64 per-query-head gradients."""
    import _tc_direct as tcd
    (q, k, v), (q64, k64, v64) = tcd.inputs(I, I_k, Nq, Nk, d, dt, seed=Nq + 3 * Nk + d)
    do = tcd.to_dtype(np.random.default_rng(d + Nq).standard_normal((I, Nq, d)), dt)
    do64 = tcd.to_f64(do, dt)
    scale = 1.0 / np.sqrt(d)
    allow = tcd.allowed(Nq, Nk, causal, window)
    if block_mask is not None:
        B_r, B_c = tiles
        allow &= np.kron(block_mask, np.ones((B_r, B_c), bool))[:Nq, :Nk]
    O, L = tcd.reference(q64, k64, v64, allow, scale)
    D = (do64 * tcd.to_f64(tcd.to_dtype(O, dt), dt)).sum(-1)
    G = I // I_k
    refs = tcd.reference_backward(q64, np.repeat(k64, G, 0), np.repeat(v64, G, 0), do64,
                                  allow, scale)
    return (q, k, v, do), L, D, allow, refs


def _check_grads(dq, dk, dv, refs, allow, dt):
    """Every element written and finite; dQ = 0 on rows that see no key and dK = dV = 0 on
    keys no row sees (exactly); errors within the rounding bound."""
    import _tc_direct as tcd
    got = (np.asarray(dq, np.float64), tcd.to_f64(dk, dt), tcd.to_f64(dv, dt))
    for name, g in zip(("dQ", "dK", "dV"), got):
        assert np.isfinite(g).all(), f"{name} has unwritten (NaN) or non-finite elements"
    no_key = ~allow.any(axis=1)
    no_row = ~allow.any(axis=0)
    assert not got[0][:, no_key].any()
    assert not got[1][:, no_row].any() and not got[2][:, no_row].any()
    for name, g, r in zip(("dQ", "dK", "dV"), got, refs):
        rows = np.ones(g.shape[1], bool)
        e, b = tcd.rel_err(g, r, rows), tcd.bound(dt, r, rows, None)
        assert e <= b, (name, e, b)
    return no_key, no_row


@pytest.mark.parametrize("Nq,Nk,causal,window,d,dt,I,I_k,tiles,MT", SIM_CASES)
def test_band_in_the_simulator(Nq, Nk, causal, window, d, dt, I, I_k, tiles, MT):
    """The main kernel's Python in the simulator (C++ emulated): counts == iosim's closed
    form for the main kernel, gradients against float64, empty rows and keys exactly 0."""
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    import _tc_direct as tcd
    import fa2_tc_sim
    (q, k, v, do), L, D, allow, refs = _problem_data(Nq, Nk, causal, window, d, dt, I, I_k)
    with fa2_tc_sim.emulated_backward():
        dq, dk, dv, counts = fa2_tc_sim.run_bwd_sim(q, k, v, do, L, D, B_r=tiles[0],
                                                    B_c=tiles[1], causal=causal,
                                                    window=window, MT=MT, dt=dt)
    assert counts == tcd.bwd_main_model_counts(Nq, d, I, causal, tiles, N_k=Nk,
                                               window=window)
    no_key, no_row = _check_grads(dq, dk, dv, refs, allow, dt)
    if (Nq, Nk) in ((40, 17), (50, 21)):
        assert no_key.any()                     # the case is what it says
    if (Nq, Nk) == (24, 70):
        assert no_row[:32].all()                # key block 0 has no active query block


def test_band_with_block_mask_in_the_simulator():
    """Causal, N_q = 40 > N_k = 60 ... with a block mask on top of the band: the kernel
    skips the masked tiles too (counts == closed form with the mask), and a query block
    whose tiles are all masked gets dQ = 0."""
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    import _tc_direct as tcd
    import fa2_tc_sim
    Nq, Nk, d, dt, tiles = 40, 60, 16, "fp16", (16, 32)
    mask = np.array([[True, False], [False, True], [True, True]])      # (T_r, T_c)
    (q, k, v, do), L, D, allow, refs = _problem_data(Nq, Nk, True, (-1, -1), d, dt, 2, 1,
                                                     mask, tiles)
    with fa2_tc_sim.emulated_backward():
        dq, dk, dv, counts = fa2_tc_sim.run_bwd_sim(q, k, v, do, L, D, B_r=16, B_c=32,
                                                    causal=True, dt=dt, block_mask=mask)
    assert counts == tcd.bwd_main_model_counts(Nq, d, 2, True, tiles, N_k=Nk,
                                               block_mask=mask)
    _check_grads(dq, dk, dv, refs, allow, dt)


@pytest.mark.parametrize("kernel", ["auto", "tc"])
def test_attention_backward_runs_tc_on_band_problems_by_name(monkeypatch, kernel):
    """With the tensor-core kernel available (the simulator cannot run it: `supports` is
    made to say yes and the kernel runs emulated), attention_backward runs it for
    N_q = 40, N_k = 24, window (5, 3) (rows 0..12 see no key), fp16, 2 query heads on 1
    K/V head, kernel='tc' (kernel='auto' must not run it on a band problem; the ledger is
    the same either way): the band reaches the kernel, the whole backward's ledger (fast pre-pass, tc main kernel, convert, group sum) equals
    iosim.backward_closed_form and the executed schedule, gradients within 2 x the fp16
    rounding model's error (iosim.rounding_model_backward), dQ = 0 on rows without a key."""
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    import fa2_tc_sim
    from gpu.backward import attention_backward
    Nq, Nk, w = 40, 24, (5, 3)
    p = iosim.Problem(N=Nq, N_k=Nk, d=16, batch=1, heads=2, kv_heads=1, dtype="fp16",
                      window=w)
    tiling = iosim.Tiling(16, 32)
    q, k, v = iosim.random_inputs(p, 5)
    do = np.random.default_rng(12).standard_normal(q.shape).astype(q.dtype)
    ex = iosim.execute("fa2", p, tiling, q, k, v)
    O, L = ex.O, ex.stats["L"]
    calls = fa2_tc_sim.tc_backward_available(monkeypatch)
    with fa2_tc_sim.emulated_backward():
        grads, led = attention_backward(q, k, v, O, do, L, window=w, block_rows=16,
                                        block_cols=32, kernel=kernel, count_traffic=True,
                                        poison=True)
    if kernel == "auto":
        assert not calls, "kernel='auto' ran the tensor-core backward on a band problem"
    else:
        assert calls and calls[-1]["window"] == w
    assert led.counts() == iosim.backward_closed_form("fa2", p, tiling).counts() == \
        iosim.execute_backward("fa2", p, tiling, q, k, v, do).ledger.counts()
    ref = iosim.reference_attention_backward(q, k, v, do, window=w)
    model = iosim.rounding_model_backward("fa2", q, k, v, O, do, dtype="fp16", window=w)
    rel = lambda g, r: np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
    for g, want, mdl, r, name in zip(grads, (q, k, v), model, ref, ("dq", "dk", "dv")):
        assert g.shape == want.shape and g.dtype == want.dtype and np.isfinite(g).all()
        assert rel(g, r) <= 2 * rel(mdl, r), (name, rel(g, r), rel(mdl, r))
    allowed = iosim.element_mask(Nq, False, N_k=Nk, window=w)
    assert (~allowed.any(axis=1)).any()
    assert not grads[0][:, :, ~allowed.any(axis=1)].any()


def test_tc_refuses_other_dtypes_not_the_band():
    """kernel='tc' on an fp32 problem with N_k != N_q and a window: refused for its dtype
    (the band itself is taken), a ValueError naming dtype and what is allowed."""
    from gpu.backward import attention_backward
    p = iosim.Problem(N=24, N_k=40, d=16, batch=1, heads=1, dtype="fp32", window=(5, 3))
    q, k, v = iosim.random_inputs(p, 0)
    ex = iosim.execute("fa2", p, iosim.Tiling(16, 16), q, k, v)
    with pytest.raises(ValueError, match=r"kernel='tc' cannot run algorithm='fa2', dtype "
                                         r"fp32.*fp16, bf16 only"):
        attention_backward(q, k, v, ex.O, q, ex.stats["L"], window=(5, 3), kernel="tc",
                           block_rows=16, block_cols=32)


# ---------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------
GPU_CASES = [  # N_q, N_k, causal, window, d, I, I_k, tiles (None: default), MT
    (200, 333, True, (-1, -1), 64, 4, 2, None, 1),
    (333, 200, True, (-1, -1), 64, 2, 1, None, 1),          # rows 0..132 see no key
    (257, 300, False, (32, 16), 128, 2, 2, None, 1),
    (300, 257, True, (64, 0), 40, 4, 2, None, 1),
    (150, 400, False, (20, 0), 59, 2, 1, (64, 128), 1),       # key blocks no row sees
    (400, 150, False, (17, 3), 111, 2, 1, (32, 64), 1),       # rows with no key
    (256, 256, True, (48, 0), 64, 2, 2, (64, 64), 2),
    (130, 99, False, (5, 5), 10, 2, 2, (32, 64), 1),          # windows smaller than a tile
]


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["fp16", "bf16"])
@pytest.mark.parametrize("Nq,Nk,causal,window,d,I,I_k,tiles,MT", GPU_CASES)
def test_fa2_tc_backward_band_on_gpu(Nq, Nk, causal, window, d, I, I_k, tiles, MT, dt):
    """fa2_tc.run (the main kernel alone, tests/_tc_direct.py) with the band: counts ==
    iosim's closed form for the main kernel, every dK, dV element written, errors within
    2 x the dtype's rounding of the float64 gradients + 1e-5, empty rows / keys 0."""
    import _tc_direct as tcd
    from gpu.backward import fa2_tc
    if tiles is None:
        t = fa2_tc.default_tiling(d, causal)
        tiles, MT = (t["B_r"], t["B_c"]), t["MT"]
    (q, k, v, do), L, D, allow, refs = _problem_data(Nq, Nk, causal, window, d, dt, I, I_k)
    dq, dk, dv, counts = tcd.run_backward(q, k, v, do, dt, tiles, causal, MT,
                                          window=window)
    assert counts == tcd.bwd_main_model_counts(Nq, d, I, causal, tiles, N_k=Nk,
                                               window=window)
    _check_grads(dq, dk, dv, refs, allow, dt)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("Nq,Nk,causal,window,d", [
    (1000, 1500, True, (-1, -1), 64),
    (1500, 1000, False, (200, 50), 64),
    (1000, 1000, True, (300, 0), 128),
    (700, 513, True, (-1, -1), 40)])
def test_attention_backward_band_tc_on_gpu(Nq, Nk, causal, window, d, dtype, monkeypatch):
    """attention_backward(kernel='tc') runs the tensor-core main kernel on these
    problems at its default tiling (4 query heads on 2 K/V heads, O and L from the gpu
    fa2 forward): the whole backward's counts == iosim.backward_closed_form, gradients
    within 2 x the rounding model's error in the dtype (iosim.rounding_model_backward),
    dQ = 0 on rows that see no key; kernel='auto' runs the fast kernel instead and gives
    the same gradients within the dtype's tolerance."""
    import gpu
    from gpu.backward import attention_backward, fa2_tc
    from iosim.reference import element_mask
    calls = []
    real = fa2_tc.run
    monkeypatch.setattr(fa2_tc, "run", lambda *a, **kw: (calls.append(kw), real(*a, **kw)))
    p = iosim.Problem(N=Nq, N_k=Nk, d=d, batch=1, heads=4, kv_heads=2, dtype=dtype,
                      causal=causal, window=window)
    q, k, v = iosim.random_inputs(p, 3)
    do = np.random.default_rng(10).standard_normal(q.shape).astype(q.dtype)
    O, L = gpu.attention(q, k, v, algorithm="fa2", causal=causal, window=window,
                         return_stats=True)
    grads, led = attention_backward(q, k, v, O, do, L, causal=causal, window=window,
                                    count_traffic=True, poison=True, kernel="tc")
    assert calls, "kernel='tc' did not run the tensor-core backward"
    t = fa2_tc.default_tiling(d, causal)
    tiling = iosim.Tiling(t["B_r"], t["B_c"])
    assert led.tiling == tiling
    assert led.counts() == iosim.backward_closed_form("fa2", p, tiling).counts()
    for g, want in zip(grads, (q, k, v)):
        assert g.shape == want.shape and g.dtype == want.dtype
        assert np.isfinite(np.asarray(g, np.float64)).all()
    ref = iosim.reference_attention_backward(q, k, v, do, causal=causal, window=window)
    model = iosim.rounding_model_backward("fa2", q, k, v, O, do, dtype=dtype, causal=causal,
                                          window=window)
    rel = lambda g, r: np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
    for g, mdl, r, name in zip(grads, model, ref, ("dq", "dk", "dv")):
        assert rel(g, r) <= 2 * rel(mdl, r), (name, rel(g, r), rel(mdl, r))
    allowed = element_mask(Nq, causal, N_k=Nk, window=window)
    assert not np.asarray(grads[0], np.float64)[:, :, ~allowed.any(axis=1)].any()
    n_tc = len(calls)
    auto = attention_backward(q, k, v, O, do, L, causal=causal, window=window)
    assert len(calls) == n_tc, "kernel='auto' ran the tensor-core backward on a band problem"
    for g, mdl, r, name in zip(auto, model, ref, ("dq", "dk", "dv")):
        assert rel(g, r) <= 2 * rel(mdl, r), ("auto", name, rel(g, r), rel(mdl, r))
