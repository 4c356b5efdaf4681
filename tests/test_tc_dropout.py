"""Dropout in the fa2 tensor-core kernels (issue 18; gpu.forward.fa2_tc, gpu.backward.fa2_tc).

The forward multiplies the P~ that enters the PV product by Z / (1 - p) (Z: the Philox keep
mask of gpu._philox, keyed by (seed, offset, instance, row, col)) and keeps l the row sum of
P~ before dropout; the backward regenerates Z: dV += (P o Z / (1 - p))^T dO,
dS = P o (dP o Z / (1 - p) - D). No extra HBM traffic: counts equal iosim's closed forms.

Without a GPU, in the CUDA simulator with the kernels' C++ pieces emulated
(tests/fa2_tc_sim.py): forward and backward main kernel at tiny sizes (p = 0.1 and 0.5,
fp16 and bf16, causal and not, odd sizes, N_q != N_k, grouped K/V, padded d, MT = 2)
against the float64 reference given iosim's mask (tests/_tc_direct.py: `keep`,
`reference_dropout`), within 2 x the dtype's rounding of the reference + 1e-5 (the bound of
the kernels' other simulator tests); counts == the closed form; so forward and backward
agree on the mask (both equal the reference computed with the same Z). attention_backward's
dispatch with the tc kernel made available (emulated): kernel='auto' with dropout runs it.

On a GPU (`gpu` marker): the kernels at N ~ 500-1000 against float64 with the same mask,
and gpu.attention / attention_backward with kernel='auto' and dropout run the tc kernels.
"""
import numpy as np
import pytest

import _background
import iosim
from gpu._launch import SIM

P_SEED_OFF = (12345, 7)

#: dt, p, N_q, N_k, d, causal, I, I_k, (B_r, B_c), MT
FWD_CASES = [
    ("fp16", 0.1, 37, 29, 16, True, 2, 1, (16, 16), 1),     # causal, odd sizes, grouped
    ("bf16", 0.5, 33, 40, 40, False, 2, 1, (16, 16), 1),    # padded d, N_q < N_k
    ("fp16", 0.5, 24, 40, 16, False, 2, 2, (32, 16), 2),    # two m-tiles per warp
    ("bf16", 0.1, 21, 21, 10, True, 1, 1, (16, 16), 1),     # d % 8 != 0: element copies
]


@pytest.mark.parametrize("dt,p,N,N_k,d,causal,I,I_k,tiles,MT", FWD_CASES)
def test_forward_dropout_in_the_simulator(dt, p, N, N_k, d, causal, I, I_k, tiles, MT):
    """O == the float64 (P o Z / (1 - p)) V within the rounding bound, L the logsumexp
    before dropout, counts == iosim's closed form (dropout adds no traffic), and the mask
    matters (O differs from no dropout's)."""
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    import _tc_direct as tcd
    import fa2_tc_sim
    drop = (p,) + P_SEED_OFF
    (q, k, v), (q64, k64, v64) = tcd.inputs(I, I_k, N, N_k, d, dt, seed=N + d)
    with fa2_tc_sim.emulated():
        O, L, counts = fa2_tc_sim.run_sim(q, k, v, B_r=tiles[0], B_c=tiles[1], MT=MT,
                                          causal=causal, dt=dt, dropout=drop)
    assert counts == tcd.model_counts(N, N_k, d, I, I_k, causal, (-1, -1), tiles)
    allow = tcd.allowed(N, N_k, causal)
    Z = tcd.keep(I, N, N_k, drop)
    assert 0 < Z.mean() < 1
    scale = 1.0 / np.sqrt(d)
    do0 = np.zeros((I, N, d))
    ref, Lref, _ = tcd.reference_dropout(q64, k64, v64, do0, allow, scale, Z, p)
    seen = allow.any(-1)
    O = tcd.to_f64(O, dt)
    assert np.isfinite(O).all()
    assert tcd.rel_err(O, ref, seen) <= tcd.bound(dt, ref, seen, None)
    assert np.abs(L[:, seen] - Lref[:, seen]).max() <= 1e-3
    assert (O[:, ~seen] == 0).all() and np.isneginf(L[:, ~seen]).all()
    plain, _ = tcd.reference(q64, k64, v64, allow, scale)
    assert tcd.rel_err(O, plain, seen) > 10 * tcd.bound(dt, ref, seen, None)


#: dt, p, N_q, N_k, d, causal, I, I_k, (B_r, B_c), MT
BWD_CASES = [
    ("fp16", 0.1, 37, 29, 16, True, 2, 1, (16, 32), 1),     # causal, odd sizes, grouped
    ("bf16", 0.5, 29, 40, 40, False, 2, 1, (16, 32), 1),    # padded d, N_q < N_k
    ("fp16", 0.5, 45, 45, 16, True, 1, 1, (16, 64), 2),     # MT = 2
]


@pytest.mark.parametrize("dt,p,N,N_k,d,causal,I,I_k,tiles,MT", BWD_CASES)
def test_backward_dropout_in_the_simulator(dt, p, N, N_k, d, causal, I, I_k, tiles, MT):
    """The backward main kernel with dropout: dQ, dK, dV == the float64 gradients given
    the forward's mask Z (the mask the forward test applies) within the rounding bound,
    every element written, counts == the closed form's main-kernel part; a different seed
    gives different dV (the kernel regenerates Z from the seed)."""
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    import _tc_direct as tcd
    import fa2_tc_sim
    drop = (p,) + P_SEED_OFF
    (q, k, v), (q64, k64, v64) = tcd.inputs(I, I_k, N, N_k, d, dt, seed=N + 3 * N_k + d)
    do = tcd.to_dtype(np.random.default_rng(d + N).standard_normal((I, N, d)), dt)
    do64 = tcd.to_f64(do, dt)
    scale = 1.0 / np.sqrt(d)
    allow = tcd.allowed(N, N_k, causal)
    Z = tcd.keep(I, N, N_k, drop)
    O, L, refs = tcd.reference_dropout(q64, k64, v64, do64, allow, scale, Z, p)
    D = (do64 * tcd.to_f64(tcd.to_dtype(O, dt), dt)).sum(-1)
    with fa2_tc_sim.emulated_backward():
        dq, dk, dv, counts = fa2_tc_sim.run_bwd_sim(q, k, v, do, L, D, B_r=tiles[0],
                                                    B_c=tiles[1], causal=causal, MT=MT,
                                                    dt=dt, dropout=drop)
        _, _, dv2, _ = fa2_tc_sim.run_bwd_sim(q, k, v, do, L, D, B_r=tiles[0], B_c=tiles[1],
                                              causal=causal, MT=MT, dt=dt, count=False,
                                              dropout=(p, P_SEED_OFF[0] + 1, P_SEED_OFF[1]))
    assert counts == tcd.bwd_main_model_counts(N, d, I, causal, tiles, N_k=N_k)
    got = (np.asarray(dq, np.float64), tcd.to_f64(dk, dt), tcd.to_f64(dv, dt))
    rows = None
    for name, g, r in zip(("dQ", "dK", "dV"), got, refs):
        assert np.isfinite(g).all(), name
        rows = np.ones(g.shape[1], bool)
        e, b = tcd.rel_err(g, r, rows), tcd.bound(dt, r, rows, None)
        assert e <= b, (name, e, b)
    rows = np.ones(N_k, bool)
    assert tcd.rel_err(tcd.to_f64(dv2, dt), refs[2], rows) > \
        10 * tcd.bound(dt, refs[2], rows, None)


def test_attention_backward_auto_runs_tc_with_dropout(monkeypatch):
    """With the tensor-core backward available (emulated; `supports` made to say yes),
    attention_backward(kernel='auto', dropout_p=0.3) runs it (N_k = N_q, no window: where
    'auto' runs it without dropout), passing the dropout on; the whole backward's ledger
    equals iosim.backward_closed_form with dropout, the gradients the float64 reference
    given iosim's mask (2 heads on 1 K/V head, fp16)."""
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    import fa2_tc_sim
    from gpu.backward import attention_backward
    from iosim.dropout import problem_keep_mask
    pdrop, seed, off = 0.3, 21, 2
    p = iosim.Problem(N=24, d=16, batch=1, heads=2, kv_heads=1, dtype="fp16", causal=True,
                      dropout_p=pdrop)
    tiling = iosim.Tiling(16, 32)
    q, k, v = iosim.random_inputs(p, 5)
    do = np.random.default_rng(12).standard_normal(q.shape).astype(q.dtype)
    Z = problem_keep_mask(p, seed, off)
    common = dict(causal=True, dropout_p=pdrop, dropout_keep=Z)
    O, L = iosim.reference_attention(q.astype(np.float64), k.astype(np.float64),
                                     v.astype(np.float64), return_lse=True, **common)
    O = O.astype(q.dtype)
    calls = fa2_tc_sim.tc_backward_available(monkeypatch)
    with fa2_tc_sim.emulated_backward():
        grads, led = attention_backward(q, k, v, O, do, L.astype(np.float32), causal=True,
                                        block_rows=16, block_cols=32, kernel="auto",
                                        count_traffic=True, poison=True, dropout_p=pdrop,
                                        dropout_seed=seed, dropout_offset=off)
    assert calls and calls[-1]["dropout"] == (pdrop, seed, off)
    assert led.counts() == iosim.backward_closed_form("fa2", p, tiling).counts()
    ref = iosim.reference_attention_backward(q.astype(np.float64), k.astype(np.float64),
                                             v.astype(np.float64), do.astype(np.float64),
                                             **common)
    rel = lambda g, r: np.linalg.norm(np.asarray(g, np.float64) - r) / np.linalg.norm(r)
    for g, r, name in zip(grads, ref, ("dq", "dk", "dv")):
        assert np.isfinite(np.asarray(g, np.float64)).all()
        assert rel(g, r) < 1e-2, (name, rel(g, r))


def test_dropout_kernel_rules():
    """fa2's, fa1's and standard's kernel='tc' with dropout are taken (here refused only
    because the simulator cannot run them; standard's with its tile products emulated:
    tests/test_gpu_standard_tc.py::test_dropout_with_emulated_tile_products); fa1's
    backward has no 'tc' for any p."""
    import gpu
    from gpu.backward import attention_backward
    q = np.zeros((1, 1, 32, 16), dtype=np.float16)
    P = np.zeros((1, 1, 32, 32), dtype=np.float16)
    if SIM:
        for alg in ("fa2", "fa1", "standard"):
            with pytest.raises(ValueError, match="simulator"):
                gpu.attention(q, q, q, algorithm=alg, kernel="tc", dropout_p=0.2)
        with pytest.raises(ValueError, match="simulator"):
            attention_backward(q, q, q, q, q, np.zeros((1, 1, 32), np.float32), kernel="tc",
                               dropout_p=0.2)
        with pytest.raises(ValueError, match="simulator"):
            attention_backward(q, q, q, q, q, (P, P.astype(np.uint8)), algorithm="standard",
                               kernel="tc", block_rows=16, block_cols=16, dropout_p=0.2)
    with pytest.raises(ValueError, match="kernel='tc'"):
        attention_backward(q, q, q, q, q, (q[..., 0], q[..., 0]), algorithm="fa1",
                           kernel="tc", dropout_p=0.2)


BUILD = r"""
import json
from gpu.forward import fa2_tc as F
from gpu.backward import fa2_tc as B
out = []
for name, p in (("fwd 128x64 d64", F.linked_ptx(128, 64, 64, dropout=True)),
                ("fwd 64x64 d128 causal bf16", F.linked_ptx(64, 64, 128, True, dt="bf16",
                                                            dropout=True)),
                ("bwd 64x128 d64 causal", B.linked_ptx(64, 128, 64, True, dropout=True)),
                ("bwd 32x64 d128 bf16", B.linked_ptx(32, 64, 128, dt="bf16", dropout=True))):
    out.append(dict(name=name, mma=p.count("mma.sync"), local=p.count(".local"),
                    f64=p.count(".f64"),
                    call=len([l for l in p.splitlines() if l.strip().startswith("call")])))
print(json.dumps(out))
"""


def _build_job():
    """BUILD in a subprocess without the simulator (started early: tests/_background.py)."""
    import os
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(_background.environ(), NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=root)
    return _background.run([sys.executable, "-c", BUILD], env=env, cwd=root, timeout=600)


@pytest.mark.prestart(job=_build_job)
def test_linked_dropout_builds_keep_registers():
    """The dropout builds of the default tilings (forward 128 x 64 at d = 64, 64 x 64 at
    d = 128; backward 64 x 128, 32 x 64) link with the C++ inlined (no call), mma.sync,
    no float64 and no local memory: Z is drawn into a bit mask before the unrolled
    fragment loops (with Philox inside them the backward's S^T / dP^T went to local
    memory). Non-default tiles with B_c = 128 (forward) or B_r = 128 (backward) do put
    fragments in local memory with dropout (correct, slower)."""
    import json
    r = _background.result(_build_job)
    if r.returncode != 0 and ("nvjitlink" in r.stderr.lower() or "nvrtc" in r.stderr.lower()
                              or "NVVM" in r.stderr):
        pytest.skip("cannot build linked code here: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr
    for row in json.loads(r.stdout.strip().splitlines()[-1]):
        assert row["mma"] > 0 and row["local"] == 0 and row["f64"] == 0 and \
            row["call"] == 0, row


# ---------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["fp16", "bf16"])
@pytest.mark.parametrize("p,N,N_k,d,causal,I,I_k", [
    (0.1, 700, 513, 64, True, 4, 2),
    (0.5, 513, 1000, 128, False, 2, 1),
    (0.1, 600, 600, 40, True, 2, 2)])
def test_tc_dropout_kernels_on_gpu(dt, p, N, N_k, d, causal, I, I_k):
    """fa2_tc.run forward and backward main kernel (default tilings) with dropout: counts
    == the closed forms, O and dQ, dK, dV within 2 x the dtype's rounding of the float64
    results given iosim's mask + 1e-5, every element written."""
    import _tc_direct as tcd
    from gpu import api
    from gpu.backward import fa2_tc as bwd_tc
    drop = (p,) + P_SEED_OFF
    (q, k, v), (q64, k64, v64) = tcd.inputs(I, I_k, N, N_k, d, dt, seed=N + d)
    do = tcd.to_dtype(np.random.default_rng(d).standard_normal((I, N, d)), dt)
    do64 = tcd.to_f64(do, dt)
    scale = 1.0 / np.sqrt(d)
    allow = tcd.allowed(N, N_k, causal)
    Z = tcd.keep(I, N, N_k, drop)
    ref, Lref, refs = tcd.reference_dropout(q64, k64, v64, do64, allow, scale, Z, p)
    tiles = api.fa2_tc_default(d, causal, dt)
    MT = api.fa2_tc_mt(tiles[0], tiles[1], d)
    O, L, counts = tcd.run_forward(q, k, v, dt, tiles, causal, MT=MT, heads=I, dropout=drop)
    assert counts == tcd.model_counts(N, N_k, d, I, I_k, causal, (-1, -1), tiles)
    seen = allow.any(-1)
    O = tcd.to_f64(O, dt)
    assert np.isfinite(O).all()
    assert tcd.rel_err(O, ref, seen) <= tcd.bound(dt, ref, seen, None)
    assert np.abs(L[:, seen] - Lref[:, seen]).max() <= 1e-3
    t = bwd_tc.default_tiling(d, causal)
    btiles = (t["B_r"], t["B_c"])
    dq, dk, dv, bcounts = tcd.run_backward(q, k, v, do, dt, btiles, causal, t["MT"],
                                           dropout=drop)
    assert bcounts == tcd.bwd_main_model_counts(N, d, I, causal, btiles, N_k=N_k)
    got = (np.asarray(dq, np.float64), tcd.to_f64(dk, dt), tcd.to_f64(dv, dt))
    for name, g, r in zip(("dQ", "dK", "dV"), got, refs):
        assert np.isfinite(g).all(), name
        rows = np.ones(g.shape[1], bool)
        e, b = tcd.rel_err(g, r, rows), tcd.bound(dt, r, rows, None)
        assert e <= b, (name, e, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_auto_runs_tc_with_dropout_on_gpu(dtype, causal, monkeypatch):
    """gpu.attention and attention_backward with kernel='auto' and dropout_p=0.2 run the
    tensor-core kernels (fa2_tc.run recorded, the dropout passed on), ledgers == iosim's
    closed forms with dropout, O and the gradients near the float64 reference given
    iosim's mask (N = 800, d = 64, 4 heads on 2 K/V heads)."""
    import gpu
    from gpu.backward import attention_backward
    from gpu.backward import fa2_tc as bwd_tc
    from gpu.forward import fa2_tc as fwd_tc
    from iosim.dropout import problem_keep_mask
    pd, seed, off = 0.2, 77, 3
    prob = iosim.Problem(N=800, d=64, batch=1, heads=4, kv_heads=2, dtype=dtype,
                         causal=causal, dropout_p=pd)
    calls = {"fwd": [], "bwd": []}
    for mod, key in ((fwd_tc, "fwd"), (bwd_tc, "bwd")):
        real = mod.run
        monkeypatch.setattr(mod, "run", lambda *a, _r=real, _k=key, **kw:
                            (calls[_k].append(kw), _r(*a, **kw)))
    q, k, v = iosim.random_inputs(prob, 3)
    do = np.random.default_rng(10).standard_normal(q.shape).astype(q.dtype)
    opts = dict(causal=causal, dropout_p=pd, dropout_seed=seed, dropout_offset=off)
    O, L, led = gpu.attention(q, k, v, return_stats=True, count_traffic=True, **opts)
    assert calls["fwd"] and calls["fwd"][-1]["dropout"] == (pd, seed, off)
    assert led.counts() == iosim.closed_form("fa2", prob, led.tiling).counts()
    grads, bled = attention_backward(q, k, v, O, do, L, count_traffic=True, poison=True,
                                     **opts)
    assert calls["bwd"] and calls["bwd"][-1]["dropout"] == (pd, seed, off)
    assert bled.counts() == iosim.backward_closed_form("fa2", prob, bled.tiling).counts()
    Z = problem_keep_mask(prob, seed, off)
    f64 = lambda x: np.asarray(x, np.float64)
    common = dict(causal=causal, dropout_p=pd, dropout_keep=Z)
    ref = iosim.reference_attention(f64(q), f64(k), f64(v), **common)
    rel = lambda g, r: np.linalg.norm(f64(g) - r) / np.linalg.norm(r)
    tol = 1e-2 if dtype == "fp16" else 3e-2
    assert rel(O, ref) < tol
    want = iosim.reference_attention_backward(f64(q), f64(k), f64(v), f64(do), **common)
    for g, r, name in zip(grads, want, ("dq", "dk", "dv")):
        assert np.isfinite(f64(g)).all(), name
        assert rel(g, r) < tol, (name, rel(g, r))


# ---------------------------------------------------------------------------------------
# fa1's tensor-core forward (gpu.forward.fa1_tc) with dropout
# ---------------------------------------------------------------------------------------
def _fa1_tc_dropout_check(p, N, d, H, Hk, causal, tiles, O, l, m, counts, drop, dt, q, k, v):
    """fa1_tc with dropout against the models: counts == iosim's fa1 closed form (the same
    with and without dropout); O within 2 x the error of iosim's executed fa1 schedule
    with the same mask (O rounded to the dtype at every store, as Algorithm 1 writes it)
    + 1e-5 of the float64 reference given iosim's mask; l and m (before dropout) as the
    schedule's; and the mask matters."""
    from iosim.dropout import problem_keep_mask
    B_r, B_c = tiles[:2]
    prob = iosim.Problem(N=N, d=d, heads=H, kv_heads=Hk, dtype=dt, causal=causal,
                         dropout_p=p)
    t = iosim.Tiling(B_r, B_c)
    cf = iosim.closed_form("fa1", prob, t).counts()
    assert counts == cf
    assert cf == iosim.closed_form("fa1", iosim.Problem(N=N, d=d, heads=H, kv_heads=Hk,
                                                        dtype=dt, causal=causal),
                                   t).counts()
    f64 = lambda x: np.asarray(x, np.float64)
    ex = iosim.execute("fa1", prob, t, f64(q), f64(k), f64(v), dropout_seed=drop[1],
                       dropout_offset=drop[2])
    Z = problem_keep_mask(prob, drop[1], drop[2])
    assert 0 < Z.mean() < 1
    ref = iosim.reference_attention(f64(q), f64(k), f64(v), causal=causal, dropout_p=p,
                                    dropout_keep=Z)
    O = f64(O)
    assert np.isfinite(O).all()
    err = lambda X: np.linalg.norm(f64(X) - ref) / np.linalg.norm(ref)
    bound = {"fp16": 1e-3, "bf16": 8e-3}[dt]      # + the tensor cores' rounding of P
    assert err(O) <= 2 * max(err(ex.O), bound) + 1e-5, (err(O), err(ex.O))
    plain = iosim.reference_attention(f64(q), f64(k), f64(v), causal=causal)
    assert np.linalg.norm(O - plain) / np.linalg.norm(plain) > 0.05
    lm, mm = ex.stats["l"], ex.stats["m"]
    np.testing.assert_allclose(l, lm, rtol=2e-3)
    np.testing.assert_allclose(m, mm, rtol=1e-5, atol=1e-5)


#: dt, p, N, d, causal, H, Hk, (B_r, B_c, MT, stages)
FA1_TC_CASES = [("fp16", 0.3, 40, 16, True, 2, 1, (16, 16, 1, 3)),    # ragged, grouped
                ("bf16", 0.5, 33, 32, False, 1, 1, (32, 16, 2, 2))]   # 2 m-tiles per warp


@pytest.mark.parametrize("dt,p,N,d,causal,H,Hk,t", FA1_TC_CASES)
def test_fa1_tc_dropout_in_the_simulator(dt, p, N, d, causal, H, Hk, t):
    """fa1_tc's Python with dropout in the simulator (C++ pieces emulated,
    tests/fa1_tc_sim.py): counts, O, l, m as `_fa1_tc_dropout_check`."""
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    from fa1_tc_sim import emulated, run_sim
    prob = iosim.Problem(N=N, d=d, heads=H, kv_heads=Hk, dtype="fp16")
    q, k, v = iosim.random_inputs(prob, N + d)
    if dt == "bf16":        # the bf16 roundings of the same numbers, as uint16 bits
        import _tc_direct as tcd
        q, k, v = (tcd.to_dtype(np.asarray(x, np.float64)[0], "bf16")[None] for x in (q, k, v))
    drop = (p,) + P_SEED_OFF
    with np.errstate(invalid="ignore"), emulated():
        O, l, m, counters = run_sim(q, k, v, B_r=t[0], B_c=t[1], MT=t[2], stages=t[3],
                                    causal=causal, dt=dt, dropout=drop)
    from gpu._launch import counters_to_dicts
    r, w = counters_to_dicts(counters)
    counts = {x: (r.get(x, 0), w.get(x, 0)) for x in set(r) | set(w)}
    if dt == "bf16":
        import _tc_direct as tcd
        q, k, v, O = (tcd.to_f64(x[0], "bf16")[None] for x in (q, k, v, O))
    _fa1_tc_dropout_check(p, N, d, H, Hk, causal, t, O, l, m, counts, drop, dt, q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["fp16", "bf16"])
@pytest.mark.parametrize("p,N,d,causal,H,Hk", [(0.1, 1000, 64, False, 2, 2),
                                               (0.5, 333, 64, True, 4, 2),
                                               (0.2, 300, 128, True, 2, 1)])
def test_fa1_tc_dropout_on_gpu(dt, p, N, d, causal, H, Hk, monkeypatch):
    """gpu.attention(algorithm='fa1', kernel='auto') with dropout on fp16 / bf16 runs
    fa1_tc (its default tiling; run recorded with the dropout): counts, O, l, m as
    `_fa1_tc_dropout_check` (l, m: gpu.forward.fa1_tc.run's own outputs, captured)."""
    import gpu
    from gpu.forward import fa1_tc
    calls = []
    real = fa1_tc.run

    def spy(*a, **kw):
        real(*a, **kw)
        calls.append((kw, a[4].copy_to_host(), a[5].copy_to_host()))
    monkeypatch.setattr(fa1_tc, "run", spy)
    prob = iosim.Problem(N=N, d=d, heads=H, kv_heads=Hk, dtype=dt)
    q, k, v = iosim.random_inputs(prob, N + d)
    drop = (p,) + P_SEED_OFF
    O, led = gpu.attention(q, k, v, algorithm="fa1", causal=causal, count_traffic=True,
                           dropout_p=p, dropout_seed=drop[1], dropout_offset=drop[2])
    assert calls and calls[-1][0]["dropout"] == drop
    kw, l, m = calls[-1]
    counts = led.counts()
    f64 = lambda x: np.asarray(x, np.float32).astype(np.float64)
    _fa1_tc_dropout_check(p, N, d, H, Hk, causal, (kw["B_r"], kw["B_c"]), f64(O),
                          l.reshape(1, H, N), m.reshape(1, H, N), counts, drop, dt,
                          f64(q), f64(k), f64(v))
