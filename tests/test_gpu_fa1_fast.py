"""gpu.forward.fa1_fast: FlashAttention Algorithm 1 (one block per instance, key blocks
outer, O / l / m round trips through HBM) with register-tiled CUDA-core tile products
(fp32 math), through gpu.attention(algorithm='fa1', kernel='fast').

Simulator (tiny shapes): O and L = m + log l against the float64 dense reference (rel err
<= 1e-5), every output written (NaN poison is on in the tests), the instrumented
kernel's counts equal to iosim's closed form and executed schedule and to the plain
kernel's counts, for ragged N, causal, grouped K/V, N_q != N_k with a window, and a block
mask with a query block that sees no key (O = 0, L = -inf there); the argument errors.
On a GPU (`gpu` marker): the same at real sizes, and kernel='auto' picking it for fp32.
"""
import numpy as np
import pytest

import iosim
from iosim import Problem, Tiling

cuda = pytest.importorskip("numba.cuda")

import gpu  # noqa: E402
from gpu import _launch  # noqa: E402
from gpu.forward import fa1_fast  # noqa: E402


def _inputs(B, H, Hk, N, d, N_k=None, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    N_k = N if N_k is None else N_k
    q = rng.standard_normal((B, H, N, d)).astype(dtype)
    k = rng.standard_normal((B, Hk, N_k, d)).astype(dtype)
    v = rng.standard_normal((B, Hk, N_k, d)).astype(dtype)
    return q, k, v


def _rel(O, ref):
    return np.abs(O.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30)


def _check_L(L, lse):
    fin = np.isfinite(lse)
    assert (np.isneginf(L) == ~fin).all()
    if fin.any():
        assert np.abs(L[fin] - lse[fin]).max() / max(np.abs(lse[fin]).max(), 1.0) <= 1e-5


@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_matches_reference_and_counts(causal):
    """Ragged N = 21 with 8 x 8 tiles, 16 threads (TC = 4: RM x RN = 2 x 2, DN = 4), two
    query heads on one K/V head."""
    q, k, v = _inputs(1, 2, 1, 21, 16, seed=4 + causal)
    with _launch.recording() as launches:
        O, L, led = gpu.attention(q, k, v, algorithm="fa1", causal=causal, block_rows=8,
                                  block_cols=8, threads=16, kernel="fast",
                                  count_traffic=True, return_stats=True)
    names = [kern.py_func.__name__ for kern, *_ in launches]
    assert [n for n in names if n.startswith("fa1")][0].startswith("fa1_fast_"), names
    ref, lse = iosim.reference_attention(q, k, v, causal=causal, return_lse=True)
    assert np.isfinite(O).all() and _rel(O, ref) <= 1e-5
    _check_L(L, lse)
    problem = Problem(N=21, d=16, batch=1, heads=2, kv_heads=1, causal=causal)
    tiling = Tiling(8, 8)
    assert led.counts() == iosim.closed_form("fa1", problem, tiling).counts()
    assert led.counts() == iosim.execute("fa1", problem, tiling, q, k, v).ledger.counts()


def test_rectangular_window_and_block_mask_match_plain():
    """N_q = 13, N_k = 19 with a sliding window (rows that see no key of a tile keep their
    O, l, m), then a block mask whose second query block sees no key."""
    q, k, v = _inputs(1, 1, 1, 13, 16, N_k=19, seed=6)
    kw = dict(algorithm="fa1", block_rows=8, block_cols=8, threads=16, count_traffic=True,
              return_stats=True)
    O, L, led = gpu.attention(q, k, v, window=(5, 1), kernel="fast", **kw)
    O0, L0, led0 = gpu.attention(q, k, v, window=(5, 1), kernel="plain", **kw)
    ref, lse = iosim.reference_attention(q, k, v, window=(5, 1), return_lse=True)
    assert np.isfinite(O).all() and _rel(O, ref) <= 1e-5 and _rel(O0, ref) <= 1e-5
    _check_L(L, lse)
    assert led.counts() == led0.counts()
    problem = Problem(N=13, d=16, N_k=19, window=(5, 1))
    assert led.counts() == iosim.closed_form("fa1", problem, Tiling(8, 8)).counts()
    mask = np.array([[True, False, True], [False, False, False]])
    O, L, led = gpu.attention(q, k, v, block_mask=mask, kernel="fast", **kw)
    O0, L0, led0 = gpu.attention(q, k, v, block_mask=mask, kernel="plain", **kw)
    ref, lse = iosim.reference_attention(q, k, v, block_mask=mask, B_r=8, B_c=8,
                                         return_lse=True)
    assert np.isfinite(O).all() and (O[:, :, 8:] == 0).all() and np.isneginf(L[:, :, 8:]).all()
    assert _rel(O, ref) <= 1e-5 and led.counts() == led0.counts()
    _check_L(L, lse)


def test_errors_and_layout():
    q, k, v = _inputs(1, 1, 1, 8, 18)
    with pytest.raises(ValueError, match="fa1.*d=18"):
        gpu.attention(q, k, v, algorithm="fa1", block_rows=8, block_cols=8, threads=16,
                      kernel="fast")
    assert "fp64" in fa1_fast.plan_error(8, 8, 16, 16, "fp64")
    assert fa1_fast.plan_error(128, 128, 64, 512) is None
    lay = fa1_fast.layout(128, 128, 64, 16, shfl=True)
    assert (lay["QS"], lay["OO"], lay["KO"]) == (68, 128 * 68, 2 * 128 * 68)
    assert all(lay[key] % 4 == 0 for key in ("QO", "OO", "KO", "VO", "PO", "RO"))
    assert lay["bytes"] <= 232448                         # the H100's opt-in maximum
    assert fa1_fast.supports(128, 128, 64, 512, shfl=False, smem_limit=232448 + 128 * 64)
    assert not fa1_fast.supports(128, 128, 64, 512, smem_limit=48 * 1024)


# ---------------------------------------------------------------------------------------
# Real hardware
# ---------------------------------------------------------------------------------------
def _gpu_case(N, d, heads, causal, tiles=None, N_k=None, dtype="fp32"):
    npdt = np.float32 if dtype == "fp32" else np.float16
    q, k, v = _inputs(1, heads, heads, N, d, N_k=N_k, seed=N + d, dtype=npdt)
    kw = {} if tiles is None else dict(block_rows=tiles[0], block_cols=tiles[1])
    O, L, led = gpu.attention(q, k, v, algorithm="fa1", causal=causal, kernel="fast",
                              count_traffic=True, return_stats=True, **kw)
    problem = Problem(N=N, d=d, heads=heads, kv_heads=heads, causal=causal, N_k=N_k,
                      dtype=dtype)
    assert led.counts() == iosim.closed_form("fa1", problem, led.tiling).counts()
    ref, lse = iosim.reference_attention(q, k, v, causal=causal, return_lse=True)
    assert np.isfinite(O).all()
    if dtype == "fp32":
        assert _rel(O, ref) <= 1e-5
        _check_L(L, lse)
    else:   # O rounded to fp16 after every key block (Algorithm 1 as written): as plain
        O0 = gpu.attention(q, k, v, algorithm="fa1", causal=causal, kernel="plain", **(
            kw or dict(block_rows=led.tiling.B_r, block_cols=led.tiling.B_c)))
        assert _rel(O, ref) <= 2 * max(_rel(O0, ref), 1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("N,causal", [(1024, False), (1024, True), (1000, True)])
def test_gpu_default_tiling(N, causal):
    _gpu_case(N, 64, 4, causal)


@pytest.mark.gpu
def test_gpu_other_tilings_rectangular_fp16():
    _gpu_case(333, 64, 2, True, tiles=(64, 64))
    _gpu_case(500, 64, 2, False, tiles=(128, 64))
    _gpu_case(512, 128, 2, True)
    _gpu_case(300, 64, 2, True, N_k=700)
    _gpu_case(512, 64, 2, False, dtype="fp16")


@pytest.mark.gpu
def test_gpu_auto_picks_fast_for_fp32():
    from gpu import api
    q, k, v = _inputs(1, 8, 8, 2048, 64)
    O, led = gpu.attention(q, k, v, algorithm="fa1", count_traffic=True)
    B_r, B_c, _ = api.FA1_FAST_TILES[64]
    assert (led.tiling.B_r, led.tiling.B_c) == (B_r, B_c)
    problem = Problem(N=2048, d=64, heads=8, kv_heads=8)
    assert led.counts() == iosim.closed_form("fa1", problem, led.tiling).counts()
    ref = iosim.reference_attention(q[:, :2], k[:, :2], v[:, :2])
    assert _rel(O[:, :2], ref) <= 1e-5
