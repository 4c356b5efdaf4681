"""The fa2 backward of packed variable-length batches (issue 18 item 6, backward half).

Model (iosim.varlen): varlen_backward_closed_form is the sum over sequences of
iosim.backward_closed_form on Problem(N=N_q_b, N_k=N_k_b, batch=1, ...), equals the
executed per-sequence backward (execute_varlen_backward) exactly, and with equal lengths
the closed form of the plain batched Problem; its gradients match the float64 reference.
Kernel (gpu.attention_varlen_backward, Numba simulator, d = 16, 16 x 16 tiles): every
output poisoned with NaN first (conftest turns gpu.api.POISON on) and all written; fp32
gradients within 1e-4 relative (norm-wise) of iosim.reference_varlen_backward; the
kernels' own counts == closed form == executed, exactly; sequences with no queries
(dk = dv = 0) or no keys (dq = 0).
"""
import numpy as np
import pytest

import iosim
from iosim import Problem, Tiling, VarlenProblem

CU_Q = [0, 5, 5, 22, 55]            # q lengths [5, 0, 17, 33]
CU_K = [0, 9, 12, 29, 69]           # k lengths [9, 3, 17, 40]
CU_Q5 = CU_Q + [62]                 # plus a sequence with queries and no keys
CU_K5 = CU_K + [69]
T16 = Tiling(16, 16)
BANDS = [(False, (-1, -1)), (True, (-1, -1)), (False, (4, 2)), (True, (6, 0))]


def _problem(cq, ck, causal, w, kv, d=16, dtype="fp32"):
    return VarlenProblem.from_cu_seqlens(cq, ck, d, heads=2, kv_heads=kv, dtype=dtype,
                                         causal=causal, window=w)


def _inputs(p, seed=2):
    q, k, v = iosim.random_varlen_inputs(p, seed)
    do = np.random.default_rng(seed + 7).standard_normal(q.shape).astype(p.np_dtype)
    return q, k, v, do


def _rel(g, ref):
    n = np.linalg.norm(ref)
    return float(np.linalg.norm(np.asarray(g, np.float64) - ref) / (n if n else 1.0))


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal,w", BANDS)
@pytest.mark.parametrize("kv", [1, 2])
def test_model_executed_equals_closed_form(causal, w, kv):
    p = _problem(CU_Q5, CU_K5, causal, w, kv)
    q, k, v, do = _inputs(p)
    ex = iosim.execute_varlen_backward(p, T16, q, k, v, do)
    cf = iosim.varlen_backward_closed_form(p, T16)
    assert ex.ledger.counts() == cf.counts()
    assert cf.algorithm == "fa2-backward"
    # the definition: per-sequence closed forms, plus the degenerate sequences' counts
    want: dict = {}
    for nq, nk in zip(p.seqlens_q, p.seqlens_k):
        if nq and nk:
            led = iosim.backward_closed_form("fa2", Problem(
                N=nq, N_k=nk, d=16, heads=2, kv_heads=kv, causal=causal, window=w), T16)
            for t, c in led.counts().items():
                want[t] = tuple(a + x for a, x in zip(want.get(t, (0, 0)), c))
    # sequence 1 (no queries, 3 keys): K, V read and dK = dV = 0 written per query head
    # (+ the group sum when kv = 1); sequence 4 (7 queries, no keys): pre-pass, dQ = 0
    n1, n4, H, d = 3, 7, 2, 16
    grp_r, grp_w = (n1 * H * d, n1 * kv * d) if kv < H else (0, 0)
    extra = {"K": (n1 * H * d, 0), "V": (n1 * H * d, 0),
             "dK": (grp_r, n1 * H * d + grp_w), "dV": (grp_r, n1 * H * d + grp_w),
             "dO": (n4 * H * d, 0), "O": (n4 * H * d, 0), "D": (0, n4 * H),
             "dQacc": (n4 * H * d, n4 * H * d), "dQ": (0, n4 * H * d)}
    for t, c in extra.items():
        want[t] = tuple(a + x for a, x in zip(want.get(t, (0, 0)), c))
    assert cf.counts() == {t: c for t, c in want.items() if c != (0, 0)}
    ref = iosim.reference_varlen_backward(q, k, v, do, CU_Q5, CU_K5, causal=causal,
                                          window=w)
    for g, r in zip((ex.dq, ex.dk, ex.dv), ref):
        assert _rel(g, r) < 1e-5
    assert not ex.dq[55:].any() and not ex.dk[9:12].any()


@pytest.mark.parametrize("causal", [False, True])
def test_model_equal_lengths_is_the_batched_problem(causal):
    p = _problem([0, 40, 80, 120], [0, 24, 48, 72], causal, (-1, -1), 1)
    batched = Problem(N=40, N_k=24, d=16, batch=3, heads=2, kv_heads=1, causal=causal)
    assert (iosim.varlen_backward_closed_form(p, T16).counts() ==
            iosim.backward_closed_form("fa2", batched, T16).counts())


@pytest.mark.parametrize("alg", ["fa1", "standard"])
def test_model_other_algorithms(alg):
    """The model's other backward schedules: executed == closed form (kernels: fa2 only)."""
    p = _problem(CU_Q5, CU_K5, True, (-1, -1), 1)
    q, k, v, do = _inputs(p)
    ex = iosim.execute_varlen_backward(p, T16, q, k, v, do, algorithm=alg)
    assert ex.ledger.counts() == iosim.varlen_backward_closed_form(p, T16, alg).counts()
    ref = iosim.reference_varlen_backward(q, k, v, do, CU_Q5, CU_K5, causal=True)
    for g, r in zip((ex.dq, ex.dk, ex.dv), ref):
        assert _rel(g, r) < 1e-5


def test_model_all_empty_costs_nothing():
    p = _problem([0, 0, 0], [0, 0, 0], False, (-1, -1), 2)
    assert iosim.varlen_backward_closed_form(p, T16).counts() == {}
    assert iosim.execute_varlen_backward(p, T16).ledger.counts() == {}


# ---------------------------------------------------------------------------------------
# Kernel (simulator)
# ---------------------------------------------------------------------------------------
def _check_kernel(cq, ck, causal, w, kv, dtype="fp32", d=16, L_from_gpu=False):
    import gpu
    p = _problem(cq, ck, causal, w, kv, d, dtype)
    q, k, v, do = _inputs(p)
    cu_q, cu_k = np.array(cq, dtype=np.int32), np.array(ck, dtype=np.int32)
    if L_from_gpu:
        O, L = gpu.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, window=w,
                                    block_rows=16, block_cols=16, return_stats=True)
    else:       # iosim's fa2 forward: the schedule gpu.attention_varlen runs, on the host
        fw = iosim.execute_varlen("fa2", p, T16, q, k, v)
        O, L = fw.O, fw.L
    (dq, dk, dv), led = gpu.attention_varlen_backward(
        q, k, v, O, do, L, cu_q, cu_k, causal=causal, window=w, block_rows=16,
        block_cols=16, count_traffic=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dq.dtype == dk.dtype == dv.dtype == q.dtype
    for g in (dq, dk, dv):
        assert not np.isnan(g).any()                # poisoned first: every element written
    cf = iosim.varlen_backward_closed_form(p, T16)
    assert led.counts() == cf.counts()
    assert led.counts() == iosim.execute_varlen_backward(p, T16, q, k, v, do).ledger.counts()
    ref = iosim.reference_varlen_backward(q, k, v, do, cq, ck, causal=causal, window=w)
    tol = 1e-4 if dtype == "fp32" else 2e-2
    for g, r in zip((dq, dk, dv), ref):
        assert _rel(g, r) < tol
    for b in range(len(cq) - 1):                    # empty sequences: exact zeros
        if ck[b + 1] == ck[b]:
            assert not dq[cq[b]:cq[b + 1]].any()
        if cq[b + 1] == cq[b]:
            assert not dk[ck[b]:ck[b + 1]].any() and not dv[ck[b]:ck[b + 1]].any()
    return led


@pytest.mark.parametrize("causal,w,kv", [(False, (-1, -1), 2), (True, (-1, -1), 1),
                                         (False, (4, 2), 1)])
def test_kernel_fp32(causal, w, kv):
    _check_kernel(CU_Q, CU_K, causal, w, kv, L_from_gpu=(kv == 2))


def test_kernel_zero_lengths():
    """A sequence with keys and no queries, one with queries and no keys, causal with
    N_q_b > N_k_b (rows that see no key: dq = 0), grouped K/V."""
    _check_kernel([0, 12, 12, 19], [0, 5, 8, 8], True, (-1, -1), 1)
    _check_kernel([0, 0, 3], [0, 4, 4], False, (-1, -1), 2)


def test_kernel_takes_device_arrays_and_a_device_L():
    """Numba device arrays in (L too: the path torch tensors take), the same gradients as
    from NumPy arrays, device arrays out."""
    import gpu
    from numba import cuda
    p = _problem(CU_Q, CU_K, True, (-1, -1), 2)
    q, k, v, do = _inputs(p)
    cu_q, cu_k = np.array(CU_Q, dtype=np.int32), np.array(CU_K, dtype=np.int32)
    fw = iosim.execute_varlen("fa2", p, T16, q, k, v)
    kw = dict(causal=True, block_rows=16, block_cols=16)
    want = gpu.attention_varlen_backward(q, k, v, fw.O, do, fw.L, cu_q, cu_k, **kw)
    dev = [cuda.to_device(np.ascontiguousarray(x)) for x in (q, k, v, fw.O, do, fw.L)]
    got = gpu.attention_varlen_backward(*dev, cu_q, cu_k, **kw)
    for g, w in zip(got, want):
        assert hasattr(g, "copy_to_host")
        np.testing.assert_array_equal(g.copy_to_host(), w)
    with pytest.raises(ValueError, match="L has shape"):
        gpu.attention_varlen_backward(*dev[:5], cuda.to_device(np.ascontiguousarray(fw.L.T)),
                                      cu_q, cu_k, **kw)


def test_kernel_errors():
    import gpu
    p = _problem([0, 3], [0, 4], False, (-1, -1), 2)
    q, k, v, do = _inputs(p)
    L = np.zeros((2, 3), np.float32)
    cu_q, cu_k = np.array([0, 3], np.int32), np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match="kernel='fast'"):
        gpu.attention_varlen_backward(q, k, v, q, do, L, cu_q, cu_k, kernel="fast")
    with pytest.raises(ValueError, match="L has shape"):
        gpu.attention_varlen_backward(q, k, v, q, do, L.T.copy(), cu_q, cu_k)
    with pytest.raises(ValueError, match="do has shape"):
        gpu.attention_varlen_backward(q, k, v, q, do[:2], L, cu_q, cu_k)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        gpu.attention_varlen_backward(q, k, v, q, do, L, cu_q, np.array([0, 5], np.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,causal", [("fp32", True), ("fp16", False)])
def test_kernel_on_gpu(dtype, causal):
    """Real hardware: sequences of 1000, 0, 2048 and 517 queries (keys 1200, 100, 2048,
    452), d = 64, L from gpu.attention_varlen; exact counts, every element written, errors
    within the same bounds (fp16: 2e-2)."""
    _check_kernel([0, 1000, 1000, 3048, 3565], [0, 1200, 1300, 3348, 3800], causal,
                  (-1, -1), 1, dtype=dtype, d=64, L_from_gpu=True)


def test_kernel_fp16_window():
    """fp16 inputs and gradients (float32 on chip), a causal window, grouped K/V."""
    _check_kernel(CU_Q, CU_K, True, (6, 0), 1, dtype="fp16")
