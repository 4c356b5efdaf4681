"""The plain fa2, fa1 and standard backward (gpu.backward.attention_backward) with N_k != N_q and local
windows (issue 18): bottom-right aligned causal and window=(left, right) as gpu.attention
and iosim.Problem.

Runs in Numba's CUDA simulator without a GPU: d = 16, 16 x 16 tiles, N_q / N_k in
(24, 40), (40, 24), (33, 33) (ragged last blocks), causal or not, window (5, 3) or none,
kv_heads 1 (grouped, 2 query heads) or 2. L and O come from iosim's fa2 forward (the
schedule gpu.forward.fa2 runs, on the host to save simulator time).

Checks, as tests/test_gpu_backward.py: the kernels' own counts == iosim.backward_closed_form
== the ledger of iosim.execute_backward (the executed model); every output poisoned with
NaN first (all finite: every element written); fp32 rel err <= 1e-4 of the float64
reference (iosim.reference_attention_backward with N_k and the window); fp16 rel err <=
2 e_model, e_model of a float64 model of the fp16 roundings (O, dK_h, dV_h, the
gradients) under the same mask. Rows that see no key: dQ = 0.
"""
import numpy as np
import pytest

import iosim
from iosim.reference import element_mask
from gpu.backward import attention_backward

T16 = dict(block_rows=16, block_cols=16)
TILING = iosim.Tiling(16, 16)


def rel_err(g, ref):
    return float(np.linalg.norm(np.asarray(g, np.float64) - ref) / np.linalg.norm(ref))


def setup(Nq, Nk, causal, window, heads=2, kv_heads=1, dtype="fp32", seed=0):
    p = iosim.Problem(N=Nq, N_k=Nk, d=16, batch=1, heads=heads, kv_heads=kv_heads,
                      dtype=dtype, causal=causal, window=window)
    q, k, v = iosim.random_inputs(p, seed)
    do = np.random.default_rng(seed + 7).standard_normal(q.shape).astype(q.dtype)
    ex = iosim.execute("fa2", p, TILING, q, k, v)
    return p, q, k, v, ex.O, do, ex.stats["L"]


def fp16_model(q, k, v, o, do, allowed):
    """(dq, dk, dv) with fa2's unavoidable fp16 roundings (float64 otherwise)."""
    q, k, v, o, do = (np.asarray(x, np.float64) for x in (q, k, v, o, do))
    H, G = q.shape[1], k.shape[1]
    kr, vr = np.repeat(k, H // G, axis=1), np.repeat(v, H // G, axis=1)
    Nq, d = q.shape[-2:]
    Nk = k.shape[-2]
    r16 = lambda x: x.astype(np.float16).astype(np.float64)
    s = np.where(allowed, q @ np.swapaxes(kr, -1, -2) / np.sqrt(d), -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    tot = p.sum(-1, keepdims=True)
    p = np.where(tot > 0, p / np.where(tot > 0, tot, 1.0), 0.0)
    D = (do * o).sum(-1, keepdims=True)             # O as stored (fp16)
    ds = p * (do @ np.swapaxes(vr, -1, -2) - D) / np.sqrt(d)
    dq = ds @ kr
    dk_h, dv_h = r16(np.swapaxes(ds, -1, -2) @ q), r16(np.swapaxes(p, -1, -2) @ do)
    sh = (q.shape[0], G, H // G, Nk, d)
    return r16(dq), r16(dk_h.reshape(sh).sum(2)), r16(dv_h.reshape(sh).sum(2))


def check(p, q, k, v, o, do, grads, ledger, causal, window):
    Nq, Nk = q.shape[2], k.shape[2]
    closed = iosim.backward_closed_form("fa2", p, TILING)
    executed = iosim.execute_backward("fa2", p, TILING, q, k, v, do)
    assert ledger.counts() == closed.counts() == executed.ledger.counts()
    for g, want, name in zip(grads, (q, k, v), ("dq", "dk", "dv")):
        assert g.shape == want.shape and g.dtype == want.dtype, name
        assert np.isfinite(g).all(), f"{name} has unwritten (NaN) elements"
    ref = iosim.reference_attention_backward(q, k, v, do, causal=causal, window=window)
    allowed = element_mask(Nq, causal, N_k=Nk, window=window)
    empty = ~allowed.any(axis=1)
    assert not np.asarray(grads[0])[:, :, empty].any()          # rows that see no key
    if q.dtype == np.float32:
        for g, r, name in zip(grads, ref, ("dq", "dk", "dv")):
            assert rel_err(g, r) <= 1e-4, (name, rel_err(g, r))
    else:
        model = fp16_model(q, k, v, o, do, allowed)
        for g, mdl, r, name in zip(grads, model, ref, ("dq", "dk", "dv")):
            assert rel_err(g, r) <= 2 * rel_err(mdl, r), (name, rel_err(g, r), rel_err(mdl, r))
    return empty


CASES = [  # N_q, N_k, causal, window, heads, kv_heads
    (24, 40, True, (-1, -1), 2, 1),
    (40, 24, True, (-1, -1), 1, 1),      # rows 0..15 see no key
    (33, 33, False, (5, 3), 2, 2),
    (40, 24, False, (5, 3), 2, 1),       # rows 0..12 see no key; tiles outside the band
    (24, 40, False, (-1, -1), 2, 2),
    (33, 33, True, (5, 0), 1, 1),
]


@pytest.mark.parametrize("Nq, Nk, causal, window, heads, kv_heads", CASES)
def test_fa2_plain_fp32(Nq, Nk, causal, window, heads, kv_heads):
    p, q, k, v, O, do, L = setup(Nq, Nk, causal, window, heads, kv_heads)
    grads, ledger = attention_backward(q, k, v, O, do, L, causal=causal, window=window,
                                       kernel="plain", count_traffic=True, poison=True, **T16)
    empty = check(p, q, k, v, O, do, grads, ledger, causal, window)
    if (Nq, Nk) == (40, 24):
        assert empty.any()


@pytest.mark.parametrize("Nq, Nk, causal, window", [(40, 24, True, (-1, -1)),
                                                     (33, 33, False, (5, 3))])
def test_fa2_plain_fp16(Nq, Nk, causal, window):
    p, q, k, v, O, do, L = setup(Nq, Nk, causal, window, 2, 1, dtype="fp16")
    grads, ledger = attention_backward(q, k, v, O, do, L, causal=causal, window=window,
                                       kernel="plain", count_traffic=True, poison=True, **T16)
    assert all(g.dtype == np.float16 for g in grads)
    check(p, q, k, v, O, do, grads, ledger, causal, window)


def test_auto_matches_plain():
    """kernel='auto' (default) on N_k != N_q with a window (the fast kernel where it runs
    the tiling, tests/test_gpu_backward_fast_band.py, else the plain one): the gradients
    of kernel='plain' up to float32 summation order, uncounted too."""
    p, q, k, v, O, do, L = setup(24, 40, False, (5, 3), 1, 1)
    kw = dict(window=(5, 3), **T16)
    plain, ledger = attention_backward(q, k, v, O, do, L, kernel="plain", count_traffic=True,
                                       **kw)
    auto = attention_backward(q, k, v, O, do, L, **kw)
    for a, b in zip(plain, auto):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert ledger.counts() == iosim.backward_closed_form("fa2", p, TILING).counts()


def check_fa1(p, q, k, v, o, do, grads, ledger, causal, window, algorithm="fa1"):
    """As `check`, for fa1 (or standard): its counts (iosim's backward schedule at 16 x 16
    tiles), every output written, rows without a key dQ = 0, fp32 within 1e-4 of float64."""
    closed = iosim.backward_closed_form(algorithm, p, TILING)
    executed = iosim.execute_backward(algorithm, p, TILING, q, k, v, do)
    assert ledger.counts() == closed.counts() == executed.ledger.counts()
    for g, want, name in zip(grads, (q, k, v), ("dq", "dk", "dv")):
        assert g.shape == want.shape and g.dtype == want.dtype, name
        assert np.isfinite(g).all(), f"{name} has unwritten (NaN) elements"
    ref = iosim.reference_attention_backward(q, k, v, do, causal=causal, window=window)
    allowed = element_mask(q.shape[2], causal, N_k=k.shape[2], window=window)
    assert not np.asarray(grads[0])[:, :, ~allowed.any(axis=1)].any()
    for g, r, name in zip(grads, ref, ("dq", "dk", "dv")):
        assert rel_err(g, r) <= 1e-4, (name, rel_err(g, r))


@pytest.mark.parametrize("Nq, Nk, causal, window, heads, kv_heads",
                         [CASES[1], CASES[3], CASES[4], CASES[5]])
def test_fa1_plain_fp32(Nq, Nk, causal, window, heads, kv_heads):
    """fa1's backward (Algorithm 4 as written: one block per instance, dQ read-modify-
    written in HBM) with N_k != N_q and windows; l, m from iosim's fa1 forward (a row that
    sees no key has l = 0, m = -inf)."""
    p = iosim.Problem(N=Nq, N_k=Nk, d=16, batch=1, heads=heads, kv_heads=kv_heads,
                      dtype="fp32", causal=causal, window=window)
    q, k, v = iosim.random_inputs(p, 0)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(q.dtype)
    ex = iosim.execute("fa1", p, TILING, q, k, v)
    grads, ledger = attention_backward(q, k, v, ex.O, do, (ex.stats["l"], ex.stats["m"]),
                                       algorithm="fa1", causal=causal, window=window,
                                       count_traffic=True, poison=True, **T16)
    check_fa1(p, q, k, v, ex.O, do, grads, ledger, causal, window)


@pytest.mark.parametrize("Nq, Nk, causal, window, heads, kv_heads",
                         [CASES[1], CASES[2], CASES[3], CASES[4]])
def test_standard_plain_fp32(Nq, Nk, causal, window, heads, kv_heads):
    """The standard backward (Algorithm 3's five plain kernels) with N_k != N_q and
    windows; P (N_q x N_k) from standard_forward with the same band."""
    from gpu.backward.standard import standard_forward
    p = iosim.Problem(N=Nq, N_k=Nk, d=16, batch=1, heads=heads, kv_heads=kv_heads,
                      dtype="fp32", causal=causal, window=window)
    q, k, v = iosim.random_inputs(p, 0)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(q.dtype)
    O, P = standard_forward(q, k, v, causal=causal, window=window, **T16)
    assert P.shape == (1, heads, Nq, Nk)
    grads, ledger = attention_backward(q, k, v, O, do, P, algorithm="standard", causal=causal,
                                       window=window, count_traffic=True, poison=True, **T16)
    check_fa1(p, q, k, v, O, do, grads, ledger, causal, window, algorithm="standard")


def test_refusals():
    p, q, k, v, O, do, L = setup(24, 40, False, (-1, -1), 1, 1)
    # the fa2 tensor-core backward takes N_k != N_q and windows
    # (tests/test_gpu_backward_tc_band.py): fp32 is refused for its dtype, not the band
    with pytest.raises(ValueError, match=r"kernel='tc' cannot run algorithm='fa2', dtype "
                                         r"fp32.*fp16, bf16 only"):
        attention_backward(q, k, v, O, do, L, kernel="tc", **T16)
    with pytest.raises(ValueError, match=r"kernel='tc': the tensor-core standard backward "
                                         r"takes N_k = N_q.*N_k=40 != N_q=24"):
        attention_backward(q, k, v, O, do, L, algorithm="standard", kernel="tc", **T16)
    qs, ks, vs, Os, dos = (x[:, :, :24] for x in (q, k, v, O, do))
    with pytest.raises(ValueError, match=r"kernel='tc': the tensor-core standard backward "
                                         r"takes N_k = N_q.*window=\(5, 3\)"):
        attention_backward(qs, ks, vs, Os, dos, L, algorithm="standard", kernel="tc",
                           window=(5, 3), **T16)
    with pytest.raises(ValueError, match=r"causal=True and window=\(5, 3\)"):
        attention_backward(q, k, v, O, do, L, causal=True, window=(5, 3), **T16)
    with pytest.raises(ValueError, match="window="):
        attention_backward(q, k, v, O, do, L, window=(-2, 3), **T16)
    with pytest.raises(ValueError, match="k has shape"):
        attention_backward(q, k, v[:, :, :24], O, do, L, **T16)


def test_gpu_forward_and_dropout():
    """The gpu fa2 forward's (O, L) feed the backward (N_k != N_q, window, grouped heads);
    then with dropout (p = 0.3: the plain kernel regenerates the forward's keep mask):
    gradients vs the float64 reference given iosim's keep mask, counts unchanged."""
    from gpu.api import attention
    from iosim.dropout import problem_keep_mask
    Nq, Nk, w = 24, 40, (5, 3)
    p, q, k, v, _, do, _ = setup(Nq, Nk, False, w, 2, 1)
    O, L = attention(q, k, v, algorithm="fa2", window=w, return_stats=True, **T16)
    grads, ledger = attention_backward(q, k, v, O, do, L, window=w, count_traffic=True,
                                       poison=True, **T16)
    check(p, q, k, v, O, do, grads, ledger, False, w)
    drop = dict(dropout_p=0.3, dropout_seed=12345, dropout_offset=6)
    pd = iosim.Problem(N=Nq, N_k=Nk, d=16, batch=1, heads=2, kv_heads=1, dtype="fp32",
                       window=w, dropout_p=0.3)
    O, L = attention(q, k, v, algorithm="fa2", window=w, return_stats=True, **drop, **T16)
    grads, ledger = attention_backward(q, k, v, O, do, L, window=w, count_traffic=True,
                                       poison=True, **drop, **T16)
    assert ledger.counts() == iosim.backward_closed_form("fa2", pd, TILING).counts()
    Z = problem_keep_mask(pd, 12345, 6)
    ref = iosim.reference_attention_backward(q, k, v, do, window=w, dropout_p=0.3,
                                             dropout_keep=Z)
    for g, r, name in zip(grads, ref, ("dq", "dk", "dv")):
        assert np.isfinite(g).all() and rel_err(g, r) <= 1e-4, (name, rel_err(g, r))


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["fa1", "standard", "fa2"])
def test_gpu_autograd_every_algorithm_takes_N_k_and_windows(algorithm):
    """gpu.autograd.flash_attention with N_k != N_q (rows that see no key) and a window:
    every algorithm's forward and backward, fp32, against float64 autograd; rows without a
    key get O = 0 and dQ = 0."""
    torch = pytest.importorskip("torch")
    from gpu.autograd import flash_attention
    for Nq, Nk, causal, w in ((40, 24, True, (-1, -1)), (33, 57, False, (5, 3))):
        g = torch.Generator(device="cuda").manual_seed(Nq)
        q, k, v, do = (torch.randn(s, generator=g, device="cuda") for s in
                       ((1, 2, Nq, 16), (1, 1, Nk, 16), (1, 1, Nk, 16), (1, 2, Nq, 16)))
        qs, ks, vs = (x.clone().requires_grad_(True) for x in (q, k, v))
        out = flash_attention(qs, ks, vs, causal=causal, window=w, algorithm=algorithm,
                              block_rows=16, block_cols=16)
        out.backward(do)
        h = lambda x: x.detach().double().cpu().numpy()
        ref_o = iosim.reference_attention(h(q), h(k), h(v), causal=causal, window=w)
        ref_g = iosim.reference_attention_backward(h(q), h(k), h(v), h(do), causal=causal,
                                                   window=w)
        assert rel_err(h(out), ref_o) <= 1e-5, (algorithm, Nq, Nk)
        for x, r, name in zip((qs.grad, ks.grad, vs.grad), ref_g, ("dq", "dk", "dv")):
            assert torch.isfinite(x).all() and rel_err(h(x), r) <= 1e-4, (algorithm, name)
        empty = ~element_mask(Nq, causal, N_k=Nk, window=w).any(axis=1)
        assert not h(out)[:, :, empty].any() and not h(qs.grad)[:, :, empty].any()
