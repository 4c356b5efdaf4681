"""gpu.forward.standard_fast: standard attention (Algorithm 0) with register-tiled CUDA-core
tile products (fp32 math), through gpu.attention(algorithm='standard', kernel='fast').

Simulator (tiny shapes): O against the float64 dense reference (rel err <= 1e-5), every
output element written (NaN poison is on in the tests), the instrumented kernels' own
counts equal to iosim's closed form and executed schedule and to the plain kernels'
counts (same schedule), for ragged N, causal, grouped K/V, N_q != N_k with a window, and
a block mask with a query block that sees no key; the argument errors. On a GPU (`gpu`
marker): the same at real sizes, and kernel='auto' picking these kernels for fp32.
"""
import numpy as np
import pytest

import iosim
from iosim import Problem, Tiling

cuda = pytest.importorskip("numba.cuda")

import gpu  # noqa: E402
from gpu import _launch  # noqa: E402
from gpu.forward import standard_fast  # noqa: E402


def _inputs(B, H, Hk, N, d, N_k=None, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    N_k = N if N_k is None else N_k
    q = rng.standard_normal((B, H, N, d)).astype(dtype)
    k = rng.standard_normal((B, Hk, N_k, d)).astype(dtype)
    v = rng.standard_normal((B, Hk, N_k, d)).astype(dtype)
    return q, k, v


def _rel(O, ref):
    return np.abs(O.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30)


@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_matches_reference_and_counts(causal):
    """Ragged N = 21 with 8 x 8 tiles, 16 threads (S: RM x RN = 4 x 1, PV: 2 x 4), two
    query heads on one K/V head."""
    B_r = B_c = 8
    q, k, v = _inputs(1, 2, 1, 21, 16, seed=1 + causal)
    with _launch.recording() as launches:
        O, led = gpu.attention(q, k, v, algorithm="standard", causal=causal, block_rows=B_r,
                               block_cols=B_c, threads=16, kernel="fast", count_traffic=True)
    names = [kern.py_func.__name__ for kern, *_ in launches]
    names = [n.split("_Br")[0] for n in names if n.startswith("std_")]
    assert names == ["std_fast_S", "std_softmax", "std_fast_PV"], names
    ref = iosim.reference_attention(q, k, v, causal=causal)
    assert np.isfinite(O).all()
    assert _rel(O, ref) <= 1e-5
    problem = Problem(N=21, d=16, batch=1, heads=2, kv_heads=1, causal=causal)
    tiling = Tiling(B_r, B_c)
    assert led.counts() == iosim.closed_form("standard", problem, tiling).counts()
    assert led.counts() == iosim.execute("standard", problem, tiling, q, k, v).ledger.counts()


def test_rectangular_window_and_block_mask_match_plain():
    """N_q = 13, N_k = 19 with a sliding window, then a block mask whose second query block
    sees no key (O = 0 there): outputs and counts equal to the plain kernels'."""
    q, k, v = _inputs(1, 1, 1, 13, 16, N_k=19, seed=3)
    kw = dict(algorithm="standard", block_rows=8, block_cols=8, threads=16,
              count_traffic=True)
    O, led = gpu.attention(q, k, v, window=(5, 1), kernel="fast", **kw)
    O0, led0 = gpu.attention(q, k, v, window=(5, 1), kernel="plain", **kw)
    ref = iosim.reference_attention(q, k, v, window=(5, 1))
    assert np.isfinite(O).all() and _rel(O, ref) <= 1e-5 and _rel(O0, ref) <= 1e-5
    assert led.counts() == led0.counts()
    problem = Problem(N=13, d=16, N_k=19, window=(5, 1))
    assert led.counts() == iosim.closed_form("standard", problem, Tiling(8, 8)).counts()
    mask = np.array([[True, False, True], [False, False, False]])
    O, led = gpu.attention(q, k, v, block_mask=mask, kernel="fast", **kw)
    O0, led0 = gpu.attention(q, k, v, block_mask=mask, kernel="plain", **kw)
    ref = iosim.reference_attention(q, k, v, block_mask=mask, B_r=8, B_c=8)
    assert np.isfinite(O).all() and (O[:, :, 8:] == 0).all()
    assert _rel(O, ref) <= 1e-5 and led.counts() == led0.counts()


def test_errors_name_the_parameter():
    q, k, v = _inputs(1, 1, 1, 8, 18)
    with pytest.raises(ValueError, match="d=18"):
        gpu.attention(q, k, v, algorithm="standard", block_rows=8, block_cols=8, threads=16,
                      kernel="fast")
    q, k, v = _inputs(1, 1, 1, 8, 16)
    with pytest.raises(ValueError, match="threads=7"):
        gpu.attention(q, k, v, algorithm="standard", block_rows=8, block_cols=8, threads=7,
                      kernel="fast")
    with pytest.raises(ValueError, match="dropout_p"):    # (p < 1 runs: test_dropout.py)
        gpu.attention(q, k, v, algorithm="standard", kernel="fast", dropout_p=1.0)
    assert "fp64" in standard_fast.plan_error(8, 8, 16, 16, "fp64")
    assert "d=18" in standard_fast.plan_error(8, 8, 18, 16)


def test_plans_and_layouts():
    assert standard_fast.s_plan(128, 128, 64, 256) == (16, 16, 8, 8)
    assert standard_fast.pv_plan(128, 128, 64, 256) == (16, 16, 8, 4)
    assert standard_fast.s_plan(64, 128, 64, 128) == (8, 16, 8, 8)
    assert standard_fast.plan_error(128, 128, 64, 256) is None
    assert standard_fast.plan_error(256, 256, 64, 256) is not None     # 16 x 16 tiles
    lay = standard_fast.s_layout(128, 128, 64)
    assert (lay["QS"], lay["KO"], lay["bytes"]) == (68, 128 * 68, 4 * 2 * 128 * 68)
    pl = standard_fast.pv_layout(128, 128, 64, 16)
    assert pl["PS"] % 4 == 0 and pl["PS"] % 32 == 16 and pl["VO"] == 128 * pl["PS"]
    assert pl["bytes"] >= 4 * 128 * pl["OS"]                           # O_i staging fits
    assert standard_fast.supports(128, 128, 64, 256, smem_limit=232448)
    assert not standard_fast.supports(128, 128, 64, 256, smem_limit=48 * 1024)


# ---------------------------------------------------------------------------------------
# Real hardware
# ---------------------------------------------------------------------------------------
def _gpu_case(N, d, heads, causal, dtype="fp32", N_k=None, tiles=None, kernel="fast"):
    npdt = np.float32 if dtype == "fp32" else np.float16
    q, k, v = _inputs(1, heads, heads, N, d, N_k=N_k, seed=N + d, dtype=npdt)
    kw = {} if tiles is None else dict(block_rows=tiles[0], block_cols=tiles[1])
    O, led = gpu.attention(q, k, v, algorithm="standard", causal=causal, kernel=kernel,
                           count_traffic=True, **kw)
    O0, led0 = gpu.attention(q, k, v, algorithm="standard", causal=causal, kernel="plain",
                             count_traffic=True, **(kw or dict(
                                 block_rows=led.tiling.B_r, block_cols=led.tiling.B_c)))
    assert led.counts() == led0.counts()
    problem = Problem(N=N, d=d, heads=heads, kv_heads=heads, causal=causal, dtype=dtype,
                      N_k=N_k)
    assert led.counts() == iosim.closed_form("standard", problem, led.tiling).counts()
    ref = iosim.reference_attention(q, k, v, causal=causal)
    assert np.isfinite(O).all()
    err, err0 = _rel(O, ref), _rel(O0, ref)
    assert err <= (1e-5 if dtype == "fp32" else max(2 * err0, 2e-3)), (err, err0)


@pytest.mark.gpu
@pytest.mark.parametrize("N,causal", [(1024, False), (1024, True), (1000, True), (1001, False)])
def test_gpu_default_tiling(N, causal):
    _gpu_case(N, 64, 4, causal)


@pytest.mark.gpu
def test_gpu_other_tilings_fp16_rectangular():
    _gpu_case(333, 64, 2, True, tiles=(64, 64))
    _gpu_case(500, 64, 2, False, tiles=(128, 64))
    _gpu_case(512, 128, 2, True)
    _gpu_case(512, 64, 2, False, dtype="fp16")
    _gpu_case(300, 64, 2, False, N_k=701)      # the softmax's dense sweep, ragged tail
    q, k, v = _inputs(1, 2, 2, 300, 64, N_k=700, seed=9)
    O, led = gpu.attention(q, k, v, algorithm="standard", causal=True, kernel="fast",
                           count_traffic=True)
    ref = iosim.reference_attention(q, k, v, causal=True)
    assert np.isfinite(O).all() and _rel(O, ref) <= 1e-5
    problem = Problem(N=300, d=64, heads=2, kv_heads=2, causal=True, N_k=700)
    assert led.counts() == iosim.closed_form("standard", problem, led.tiling).counts()


@pytest.mark.gpu
def test_gpu_auto_picks_fast_for_fp32():
    from gpu import api
    q, k, v = _inputs(1, 16, 16, 4096, 64)
    O, led = gpu.attention(q, k, v, algorithm="standard", count_traffic=True)
    B_r, B_c, _ = api.STANDARD_FAST_TILES[64]
    assert (led.tiling.B_r, led.tiling.B_c) == (B_r, B_c)
    problem = Problem(N=4096, d=64, heads=16, kv_heads=16)
    assert led.counts() == iosim.closed_form("standard", problem, led.tiling).counts()
    ref = iosim.reference_attention(q[:, :2], k[:, :2], v[:, :2])
    assert _rel(O[:, :2], ref) <= 1e-5
