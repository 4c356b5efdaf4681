"""Backward kernels (gpu.backward.attention_backward: standard, fa1, fa2) against float64
gradients and iosim's backward ledger.

Runs in Numba's CUDA simulator without a GPU (tests/conftest.py): N <= 40, d = 16,
16 x 16 tiles (ragged: N = 40 leaves a 8-row last block; N = 24 with 8 x 16 tiles), 16
threads per block. The standard backward's P comes from iosim's standard forward (the
same schedule as gpu.forward.standard, computed on the host to save simulator time), except in
the test of `gpu.backward.standard.standard_forward`, which runs the gpu forward.

Accuracy (rel err = ||g - ref||_F / ||ref||_F, ref = iosim.reference_attention_backward
in float64 of the very (q, k, v, dO) the kernel saw):
  * fp32: rel err <= 1e-4 for dQ, dK, dV.
  * fp16: rel err <= 2 * e_model, e_model the rel err of a NumPy float64 model of the
    fp16 storage roundings the schedule cannot avoid: fa1/fa2: O stored in fp16 (D uses
    it), fa1's dQ_i rounded after every key block (Algorithm 4 line 22 writes it to HBM);
    standard: S and P stored in fp16 by the forward, dP and dS stored in fp16 (Algorithm 3
    lines 2-3); all: each query head's dK_h, dV_h rounded before the group sum, and the
    final fp16 gradients. For the standard backward the model is the schedule's own
    roundings, so the kernel must also lie within 0.25 e_model of the model itself.
Counts: the instrumented kernels' ledger `.counts()` == iosim.backward_closed_form(...).
Every output is poisoned with NaN before the kernels run; all-finite results show that
every element was written.
"""
import numpy as np
import pytest

import iosim
from gpu.api import attention   # not `gpu.attention`: works however `gpu` was installed
from gpu.backward import BACKWARD_ALGORITHMS, attention_backward, default_backward_tiling
from gpu.backward.standard import standard_forward

T16 = dict(block_rows=16, block_cols=16)
TILING = iosim.Tiling(16, 16)


def rel_err(g, ref):
    return float(np.linalg.norm(np.asarray(g, np.float64) - ref) / np.linalg.norm(ref))


def host_standard_forward(p, tiling, q, k, v):
    """(O, P) of iosim's standard forward (the schedule gpu.forward.standard runs), every instance;
    P entries outside the active tiles are NaN, as the gpu forward leaves them."""
    B, H, N, d = q.shape
    O = np.empty_like(q)
    P = np.empty((B, H, N, N), q.dtype)
    for b in range(B):
        for h in range(H):
            g = h // p.group
            mem = iosim.CountingMemory(Q=q[b, h], K=k[b, g], V=v[b, g])
            iosim.FORWARD["standard"](mem, p, tiling, 1.0 / np.sqrt(d))
            O[b, h], P[b, h] = mem.arrays["O"], mem.arrays["P"]
    return O, P


def setup(alg, N=40, d=16, heads=2, kv_heads=1, dtype="fp32", causal=False, block_mask=None,
          seed=0, B_r=16, B_c=16):
    p = iosim.Problem(N=N, d=d, batch=1, heads=heads, kv_heads=kv_heads, dtype=dtype,
                      causal=causal, block_mask=block_mask)
    q, k, v = iosim.random_inputs(p, seed)
    do = np.random.default_rng(seed + 7).standard_normal(q.shape).astype(q.dtype)
    if alg == "standard":
        O, P = host_standard_forward(p, iosim.Tiling(B_r, B_c), q, k, v)
        return p, q, k, v, O, do, P
    ex = iosim.execute(alg, p, iosim.Tiling(B_r, B_c), q, k, v)
    stats = ex.stats["L"] if alg == "fa2" else (ex.stats["l"], ex.stats["m"])
    return p, q, k, v, ex.O, do, stats


def fp16_model(alg, q, k, v, o, do, causal=False, B_c=16):
    """(dq, dk, dv) of the module docstring's rounding model (float64 otherwise):
    iosim.rounding_model_backward in fp16."""
    return iosim.rounding_model_backward(alg, q, k, v, o, do, dtype="fp16", causal=causal,
                                         B_c=B_c)


def check(alg, p, q, k, v, o, do, grads, ledger, causal, block_mask=None, tiling=TILING):
    ref = iosim.reference_attention_backward(q, k, v, do, causal=causal, block_mask=block_mask,
                                             B_r=tiling.B_r, B_c=tiling.B_c)
    assert ledger.counts() == iosim.backward_closed_form(alg, p, tiling).counts()
    for g, name in zip(grads, ("dq", "dk", "dv")):
        assert np.isfinite(g).all(), f"{name} has unwritten (NaN) elements"
    for g, want in zip(grads, (q, k, v)):
        assert g.shape == want.shape and g.dtype == want.dtype
    if q.dtype == np.float32:
        for g, r, name in zip(grads, ref, ("dq", "dk", "dv")):
            assert rel_err(g, r) <= 1e-4, (name, rel_err(g, r))
    else:
        model = fp16_model(alg, q, k, v, o, do, causal, tiling.B_c)
        for g, mdl, r, name in zip(grads, model, ref, ("dq", "dk", "dv")):
            assert rel_err(g, r) <= 2 * rel_err(mdl, r), (name, rel_err(g, r), rel_err(mdl, r))
            if alg == "standard":   # the model is this schedule's roundings, not a yardstick
                assert rel_err(g, mdl) <= 0.25 * rel_err(mdl, r), (name, rel_err(g, mdl))
    return ref


def test_standard_is_offered():
    assert set(BACKWARD_ALGORITHMS) == set(iosim.ALGORITHMS)
    # d=64: 64 x 64 tiles fit 48 KB for the standard kernels (48 KB exactly in fp32)
    assert default_backward_tiling(64, "fp32", "standard") == iosim.Tiling(64, 64)
    assert default_backward_tiling(64, "fp32", kernel="plain") == iosim.Tiling(16, 16)


@pytest.mark.parametrize("causal, N", [(False, 24), (True, 40)])
def test_standard_fp32_grouped_ragged(causal, N):
    """Algorithm 3's five kernels, N=24 or 40 (ragged), 2 query heads sharing 1 K/V head:
    counts == closed form, gradients vs float64, and the same numbers as iosim's host
    execution of the same schedule (up to float32 summation order)."""
    p, q, k, v, O, do, P = setup("standard", N=N, causal=causal)
    grads, ledger = attention_backward(q, k, v, O, do, P, algorithm="standard",
                                       causal=causal, count_traffic=True, **T16)
    check("standard", p, q, k, v, O, do, grads, ledger, causal)
    eb = iosim.execute_backward("standard", p, TILING, q, k, v, do)
    for g, r in zip(grads, (eb.dq, eb.dk, eb.dv)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_standard_fp16_rect_gpu_forward_plain_equals_counted():
    """fp16, non-causal, B_r=8, B_c=16, N=24 (ragged), one head; P from the gpu standard
    forward (`standard_forward`, checked against iosim's P); the uncounted build gives the
    same gradients bit for bit (the standard kernels use no float atomics)."""
    tiling = iosim.Tiling(8, 16)
    p, q, k, v, O_host, do, P_host = setup("standard", N=24, heads=1, dtype="fp16", B_r=8)
    O, P = standard_forward(q, k, v, block_rows=8, block_cols=16)
    assert P.dtype == np.float16 and P.shape == (1, 1, 24, 24)
    np.testing.assert_allclose(P.astype(np.float32), P_host.astype(np.float32), atol=2e-3)
    np.testing.assert_allclose(O.astype(np.float32), O_host.astype(np.float32), atol=5e-3)
    kw = dict(algorithm="standard", block_rows=8, block_cols=16)
    grads, ledger = attention_backward(q, k, v, O, do, P, count_traffic=True, **kw)
    check("standard", p, q, k, v, O, do, grads, ledger, False, tiling=tiling)
    plain = attention_backward(q, k, v, O, do, P, **kw)
    for a, b in zip(grads, plain):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_fa2_fp32_grouped_ragged(causal):
    """fa2, N=40 (ragged), 2 query heads sharing 1 K/V head; L from the gpu forward."""
    p, q, k, v, _, do, _ = setup("fa2", causal=causal)
    O, L = attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True, **T16)
    grads, ledger = attention_backward(q, k, v, O, do, L, causal=causal, count_traffic=True,
                                       **T16)
    assert all(g.dtype == np.float32 for g in grads)
    assert grads[1].shape == k.shape and grads[2].shape == v.shape
    check("fa2", p, q, k, v, O, do, grads, ledger, causal)


@pytest.mark.parametrize("alg", ["fa2", "fa1", "standard"])
def test_fp16_causal(alg):
    p, q, k, v, O, do, stats = setup(alg, dtype="fp16", causal=True, N=40)
    grads, ledger = attention_backward(q, k, v, O, do, stats, algorithm=alg, causal=True,
                                       count_traffic=True, **T16)
    assert all(g.dtype == np.float16 for g in grads)
    check(alg, p, q, k, v, O, do, grads, ledger, True)


def test_fa1_fp32_grouped_ragged_causal():
    p, q, k, v, O, do, stats = setup("fa1", causal=True)
    grads, ledger = attention_backward(q, k, v, O, do, stats, algorithm="fa1", causal=True,
                                       count_traffic=True, **T16)
    check("fa1", p, q, k, v, O, do, grads, ledger, True)
    # the same schedule as iosim's host execution, up to float32 summation order
    eb = iosim.execute_backward("fa1", p, TILING, q, k, v, do)
    for g, r in zip(grads, (eb.dq, eb.dk, eb.dv)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("alg", ["fa2", "fa1", "standard"])
def test_block_mask_with_empty_row(alg):
    """Query block 1 sees no key at all (L = -inf / l = 0; standard: its P rows hold no
    active entry and stay NaN, unread): its dQ rows are 0."""
    mask = np.array([[True, False, True], [False, False, False], [True, True, False]])
    p, q, k, v, O, do, stats = setup(alg, N=40, heads=1, kv_heads=1, block_mask=mask)
    grads, ledger = attention_backward(q, k, v, O, do, stats, algorithm=alg, block_mask=mask,
                                       count_traffic=True, **T16)
    check(alg, p, q, k, v, O, do, grads, ledger, False, block_mask=mask)
    assert not grads[0][0, 0, 16:32].any()


def test_fa2_rectangular_tiles_uncounted_matches_counted():
    """B_r=8, B_c=16, N=24: counts equal the closed form; the uncounted build gives the
    same gradients bit for bit."""
    tiling = iosim.Tiling(8, 16)
    p, q, k, v, O, do, L = setup("fa2", N=24, heads=1, kv_heads=1, causal=True, B_r=8)
    grads, ledger = attention_backward(q, k, v, O, do, L, causal=True, count_traffic=True,
                                       block_rows=8, block_cols=16)
    check("fa2", p, q, k, v, O, do, grads, ledger, True, tiling=tiling)
    plain = attention_backward(q, k, v, O, do, L, causal=True, block_rows=8, block_cols=16)
    for a, b in zip(grads, plain):
        np.testing.assert_array_equal(a, b)


def test_bad_input():
    p, q, k, v, O, do, L = setup("fa2", N=16, heads=1, kv_heads=1)
    with pytest.raises(ValueError, match="algorithm='fa3'"):
        attention_backward(q, k, v, O, do, L, algorithm="fa3")
    with pytest.raises(ValueError, match="stats"):
        attention_backward(q, k, v, O, do, L[..., :8])
    with pytest.raises(ValueError, match=r"\(l, m\)"):
        attention_backward(q, k, v, O, do, L, algorithm="fa1")
    with pytest.raises(ValueError, match="dtypes"):
        attention_backward(q, k, v, O, do.astype(np.float16), L)
    with pytest.raises(ValueError, match="do has shape"):
        attention_backward(q, k, v, O, do[:, :, :8], L)
    with pytest.raises(ValueError, match="block_rows=0"):
        attention_backward(q, k, v, O, do, L, block_rows=0, block_cols=16)
    with pytest.raises(ValueError, match=r"d=257 is not allowed; allowed: integers 1\.\.256"):
        x = np.zeros((1, 1, 16, 257), np.float32)
        attention_backward(x, x, x, x, x, L)
    with pytest.raises(ValueError, match="shared memory"):   # > 227 KB: too big on an H100 too
        attention_backward(q, k, v, O, do, L, block_rows=256, block_cols=256)
    P = np.zeros((1, 1, 16, 16), np.float32)
    with pytest.raises(ValueError, match=r"stats \(P\)"):
        attention_backward(q, k, v, O, do, P[..., :8], algorithm="standard")
    with pytest.raises(ValueError, match=r"stats \(P\).*float16"):
        attention_backward(*(x.astype(np.float16) for x in (q, k, v, O, do)), P,
                           algorithm="standard")
    with pytest.raises(ValueError, match="forward's P"):
        attention_backward(q, k, v, O, do, None, algorithm="standard")
    with pytest.raises(ValueError, match="shared memory"):
        attention_backward(q, k, v, O, do, P, algorithm="standard", block_rows=256,
                           block_cols=256)


def test_fa1_accepts_l1_mL():
    """fa1 with l = 1, m = L gives the same P (also for a row that sees no key)."""
    mask = np.array([[True, False], [False, False]])
    p, q, k, v, O, do, (l, m) = setup("fa1", N=24, heads=1, kv_heads=1, block_mask=mask)
    with np.errstate(divide="ignore"):
        L = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(np.float32)
    a = attention_backward(q, k, v, O, do, (l, m), algorithm="fa1", block_mask=mask, **T16)
    b = attention_backward(q, k, v, O, do, (np.ones_like(l), L), algorithm="fa1",
                           block_mask=mask, **T16)
    for x, y in zip(a, b):
        assert np.isfinite(y).all()
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
