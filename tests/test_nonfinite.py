"""Non-finite inputs (issue 19, item 1): NaN or Inf in q, k, v propagate as NaN wherever
the float64 reference has NaN, in every kernel and every executed schedule; only a row
that sees no key (all masked) gets O = 0, L = -inf. A scale that is not finite in
float32 is refused.

The simulator runs the kernels (tests/conftest.py): tiny sizes, N = 24, d = 16, 8 x 8
tiles. The same checks on real hardware, with the fast and tensor-core kernels, are the
tests marked `gpu` at the end.
"""
import numpy as np
import pytest

import iosim
from iosim.backward import execute_backward, reference_attention_backward

# NaN and Inf arithmetic is the point here: NumPy's and the simulator's warnings are expected
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

N, D, B = 24, 16, 8
TILES = dict(block_rows=B, block_cols=B)


def _inputs(dtype=np.float32, N=N, d=D, heads=1, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, heads, N, d)).astype(dtype) for _ in range(3))


# (name, tensor, row, col, value, causal, block_mask) -- the block mask (T_r, T_c) = (3, 3)
# leaves query block 1 without any key, so its rows must give O = 0, L = -inf
EMPTY_BLOCK = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 1]], dtype=bool)
CASES = [
    ("nan_in_one_key", "k", 10, 3, np.nan, False, None),
    ("nan_in_one_key_causal", "k", 10, 3, np.nan, True, None),
    ("nan_query_row", "q", 5, 0, np.nan, False, None),
    ("inf_query", "q", 17, 2, np.inf, True, None),
    ("inf_value", "v", 4, 1, np.inf, True, None),
    ("nan_key_masked_rows", "k", 2, 0, np.nan, False, EMPTY_BLOCK),
]
IDS = [c[0] for c in CASES]


def _case(case, dtype=np.float32):
    _, name, r, c, val, causal, mask = case
    q, k, v = _inputs(dtype)
    {"q": q, "k": k, "v": v}[name][0, 0, r, c] = val
    return q, k, v, causal, mask


def _reference(q, k, v, causal, mask):
    return iosim.reference_attention(q, k, v, causal=causal, block_mask=mask, B_r=B, B_c=B,
                                     return_lse=True)


def _sees_no_key(causal, mask):
    allowed = iosim.element_mask(N, causal, mask, B, B)
    return ~allowed.any(axis=1)


def check_forward(O, L, ref_O, ref_L, causal, mask, tol=1e-4):
    """NaN wherever the reference has NaN; rows that see no key exactly O = 0, L = -inf;
    everything the reference has finite, finite and close (or NaN only where the
    non-finite input shares a loaded tile: 0 * Inf)."""
    O = np.asarray(O, np.float64)[0, 0]
    ref_O = ref_O[0, 0]
    assert not np.isfinite(ref_O).all(), "the case must reach the reference"
    assert np.isnan(O[np.isnan(ref_O)]).all(), "a finite value where the reference is NaN"
    assert np.all(~np.isfinite(O[~np.isfinite(ref_O)])), "finite where the reference is not"
    none = _sees_no_key(causal, mask)
    assert (O[none] == 0).all()
    both = np.isfinite(O) & np.isfinite(ref_O)
    assert np.allclose(O[both], ref_O[both], atol=tol, rtol=tol)
    if L is not None:
        L = np.asarray(L, np.float64)[0, 0]
        ref_L = ref_L[0, 0]
        assert np.isnan(L[np.isnan(ref_L)]).all()
        assert np.all(np.isneginf(L[none]))
        fin = np.isfinite(L) & np.isfinite(ref_L)
        assert np.allclose(L[fin], ref_L[fin], atol=tol, rtol=tol)
        assert np.array_equal(np.isneginf(L), none), "L = -inf only for rows without a key"


def test_reference_rules():
    q, k, v = _inputs(np.float64)
    k[0, 0, 10, 3] = np.nan
    O, L = iosim.reference_attention(q, k, v, causal=True, return_lse=True)
    assert np.isfinite(O[0, 0, :10]).all() and np.isnan(O[0, 0, 10:]).all()
    assert np.isnan(L[0, 0, 10:]).all()
    # a masked key contributes nothing, even an Inf value
    q, k, v = _inputs(np.float64)
    v[0, 0, 20, 0] = np.inf
    O = iosim.reference_attention(q, k, v, causal=True)
    assert np.isfinite(O[0, 0, :20]).all() and not np.isfinite(O[0, 0, 20:, 0]).any()
    # a row whose every visible score is -inf is NaN, not "sees no key"
    q, k, v = _inputs(np.float64)
    q[0, 0, 0] = 0
    q[0, 0, 0, 0] = np.inf
    k[0, 0, 0, 0] = -1.0
    O, L = iosim.reference_attention(q, k, v, causal=True, return_lse=True)
    assert np.isnan(O[0, 0, 0]).all() and np.isnan(L[0, 0, 0])


@pytest.mark.parametrize("alg", ["standard", "fa1", "fa2"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_executed_schedules_propagate_nan(alg, case):
    q, k, v, causal, mask = _case(case)
    prob = iosim.Problem(N=N, d=D, dtype="fp32", causal=causal, block_mask=mask)
    ex = iosim.execute(alg, prob, iosim.Tiling(B, B), q, k, v)
    ref_O, ref_L = _reference(q, k, v, causal, mask)
    L = ex.stats.get("L")
    if alg == "fa1":
        with np.errstate(divide="ignore", invalid="ignore"):
            L = ex.stats["m"] + np.log(ex.stats["l"])
    check_forward(ex.O, L, ref_O, ref_L, causal, mask)


def check_backward(grads, ref, causal, mask, tol=2e-3):
    for g, r, name in zip(grads, ref, ("dq", "dk", "dv")):
        g = np.asarray(g, np.float64)
        assert np.isnan(g[np.isnan(r)]).all(), f"{name}: finite where the reference is NaN"
        both = np.isfinite(g) & np.isfinite(r)
        assert np.allclose(g[both], r[both], atol=tol, rtol=tol), name


BW_CASES = [CASES[0], CASES[1], CASES[2], CASES[5]]
BW_IDS = [c[0] for c in BW_CASES]


@pytest.mark.parametrize("alg", ["standard", "fa1", "fa2"])
@pytest.mark.parametrize("case", BW_CASES, ids=BW_IDS)
def test_executed_backward_propagates_nan(alg, case):
    q, k, v, causal, mask = _case(case)
    do = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    prob = iosim.Problem(N=N, d=D, dtype="fp32", causal=causal, block_mask=mask)
    ex = execute_backward(alg, prob, iosim.Tiling(B, B), q, k, v, do)
    ref = reference_attention_backward(q, k, v, do, causal=causal, block_mask=mask, B_r=B, B_c=B)
    assert not all(np.isfinite(r).all() for r in ref)
    check_backward((ex.dq, ex.dk, ex.dv), ref, causal, mask)


# ---------------------------------------------------------------------------------------
# Kernels in the simulator (and on a GPU when there is one)
# ---------------------------------------------------------------------------------------
def _run_forward(alg, q, k, v, causal, mask, **kw):
    import gpu
    if alg == "standard":
        O = gpu.attention(q, k, v, algorithm=alg, causal=causal, block_mask=mask, **TILES, **kw)
        return O, None
    return gpu.attention(q, k, v, algorithm=alg, causal=causal, block_mask=mask,
                         return_stats=True, **TILES, **kw)


@pytest.mark.parametrize("alg,kw", [("fa2", {"fast": False}), ("fa1", {}), ("standard", {})],
                         ids=["fa2_plain", "fa1", "standard"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernels_propagate_nan(alg, kw, case):
    q, k, v, causal, mask = _case(case)
    O, L = _run_forward(alg, q, k, v, causal, mask, threads=32, **kw)
    check_forward(O, L, *_reference(q, k, v, causal, mask), causal, mask)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=[IDS[0], IDS[2], IDS[5]])
def test_fast_kernel_propagates_nan(case):
    """gpu.forward.fa2_fast in the simulator (shfl=False); 16 x 16 tiles, its smallest plan."""
    import gpu
    _, name, r, c, val, causal, _ = case
    q, k, v = _inputs(np.float32, N=32)
    {"q": q, "k": k, "v": v}[name][0, 0, r, c] = val
    mask = None if case[6] is None else np.array([[1, 0], [0, 0]], dtype=bool)
    O, L = gpu.attention(q, k, v, algorithm="fa2", causal=causal, block_mask=mask,
                         block_rows=16, block_cols=16, fast=True, return_stats=True)
    ref_O, ref_L = iosim.reference_attention(q, k, v, causal=causal, block_mask=mask, B_r=16,
                                             B_c=16, return_lse=True)
    O = np.asarray(O, np.float64)[0, 0]
    L = np.asarray(L, np.float64)[0, 0]
    assert np.isnan(ref_O).any() and np.isnan(O[np.isnan(ref_O[0, 0])]).all()
    assert np.isnan(L[np.isnan(ref_L[0, 0])]).all()
    if mask is not None:
        assert (O[16:] == 0).all() and np.isneginf(L[16:]).all()
    fin = np.isfinite(ref_O[0, 0])
    assert np.allclose(O[fin], ref_O[0, 0][fin], atol=1e-4)


@pytest.mark.parametrize("alg", ["fa2", "fa1", "standard"])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5]], ids=[IDS[1], IDS[2], IDS[5]])
def test_backward_kernels_propagate_nan(alg, case):
    import gpu
    from gpu.backward import attention_backward
    q, k, v, causal, mask = _case(case)
    do = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    kw = dict(causal=causal, block_mask=mask, **TILES)
    if alg == "fa2":
        O, L = gpu.attention(q, k, v, algorithm="fa2", fast=False, return_stats=True, **kw)
        stats = L
    elif alg == "fa1":
        prob = iosim.Problem(N=N, d=D, dtype="fp32", causal=causal, block_mask=mask)
        ex = iosim.execute("fa1", prob, iosim.Tiling(B, B), q, k, v)
        O, stats = ex.O, (ex.stats["l"], ex.stats["m"])
    else:
        prob = iosim.Problem(N=N, d=D, dtype="fp32", causal=causal, block_mask=mask)
        mem = iosim.CountingMemory()
        mem.alloc("Q", q[0, 0]); mem.alloc("K", k[0, 0]); mem.alloc("V", v[0, 0])
        iosim.schedules.standard_forward(mem, prob, iosim.Tiling(B, B), 1 / np.sqrt(D))
        O = mem.arrays["O"][None, None]
        stats = mem.arrays["P"][None, None]
    grads = attention_backward(q, k, v, np.asarray(O), do, stats, algorithm=alg, **kw)
    ref = reference_attention_backward(q, k, v, do, causal=causal, block_mask=mask, B_r=B, B_c=B)
    check_backward(grads, ref, causal, mask)


@pytest.mark.parametrize("scale", [1e40, -1e39, float("inf"), float("nan")])
def test_scale_not_finite_in_float32_is_refused(scale):
    import gpu
    from gpu.backward import attention_backward
    q, k, v = _inputs()
    prob = iosim.Problem(N=N, d=D, dtype="fp32")
    with pytest.raises(ValueError, match="scale="):
        iosim.execute("fa2", prob, iosim.Tiling(B, B), q, k, v, scale=scale)
    with pytest.raises(ValueError, match="scale="):
        execute_backward("fa2", prob, iosim.Tiling(B, B), q, k, v, q, scale=scale)
    with pytest.raises(ValueError, match="scale="):
        gpu.attention(q, k, v, algorithm="fa2", scale=scale, **TILES)
    with pytest.raises(ValueError, match="scale="):
        attention_backward(q, k, v, q, q, np.zeros((1, 1, N), np.float32), algorithm="fa2",
                           scale=scale, **TILES)


# ---------------------------------------------------------------------------------------
# On a GPU: the fast fp32 kernel and the tensor-core fp16 kernel at their own tilings
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,kw", [(np.float32, {"fast": True}),
                                      (np.float16, {"tensor_cores": True}),
                                      (np.float32, {"fast": False}),
                                      (np.float16, {"tensor_cores": False})],
                         ids=["fast_fp32", "tensor_cores_fp16", "plain_fp32", "cuda_cores_fp16"])
@pytest.mark.parametrize("where", ["k", "q", "v"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_kernels_propagate_nan(dtype, kw, where, causal):
    import gpu
    n, d = 256, 64
    q, k, v = _inputs(dtype, N=n, d=d, heads=2)
    {"q": q, "k": k, "v": v}[where][0, 1, 100, 7] = np.nan
    mask = np.ones((8, 8), dtype=bool)
    mask[4] = False                                  # query rows 128..159 see no key
    O, L = gpu.attention(q, k, v, algorithm="fa2", causal=causal, block_mask=mask,
                         block_rows=32, block_cols=32, return_stats=True, **kw)
    ref_O, ref_L = iosim.reference_attention(q, k, v, causal=causal, block_mask=mask, B_r=32,
                                             B_c=32, return_lse=True)
    O, L = np.asarray(O, np.float64), np.asarray(L, np.float64)
    assert np.isnan(ref_O).any()
    assert np.isnan(O[np.isnan(ref_O)]).all() and np.isnan(L[np.isnan(ref_L)]).all()
    assert (O[:, :, 128:160] == 0).all() and np.isneginf(L[:, :, 128:160]).all()
    fin = np.isfinite(ref_O) & np.isfinite(O)
    assert np.allclose(O[fin], ref_O[fin], atol=5e-3)
    assert np.isfinite(O[0, 0]).all()                # the other head is untouched


@pytest.mark.parametrize("alg", ["fa2", "fa1", "standard"])
def test_nan_in_do_reaches_the_gradients(alg):
    """dO is an input of the backward too: a NaN in one of its rows is never a finite 0."""
    from gpu.backward import attention_backward
    q, k, v = _inputs()
    do = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    do[0, 0, 13, 5] = np.nan
    prob = iosim.Problem(N=N, d=D, dtype="fp32", causal=True)
    ex = execute_backward(alg, prob, iosim.Tiling(B, B), q, k, v, do)
    ref = reference_attention_backward(q, k, v, do, causal=True)
    assert np.isnan(ref[0][0, 0, 13]).all() and np.isnan(ref[2][0, 0, :14, 5]).all()
    check_backward((ex.dq, ex.dk, ex.dv), ref, True, None)
    if alg == "fa2":
        fw = iosim.execute("fa2", prob, iosim.Tiling(B, B), q, k, v)
        grads = attention_backward(q, k, v, fw.O, do, fw.stats["L"], algorithm="fa2",
                                   causal=True, **TILES)
        check_backward(grads, ref, True, None)
