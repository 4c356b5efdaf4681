"""Forward kernels (gpu.attention) against dense float64 attention.

Runs in Numba's CUDA simulator without a GPU (tests/conftest.py), so cases are tiny:
N <= 48, d in {16, 48}, 16 x 16 tiles, a few instances.

Accuracy criteria (rel err = ||O - ref||_F / ||ref||_F, ref = float64 attention of the
very inputs the kernel saw, iosim.reference_attention):
  * fp32: rel err <= 1e-5.
  * fp16: rel err <= 2 * e_model, where e_model is the rel err of a NumPy model of the
    unavoidable fp16 storage roundings of the algorithm, computed in float64 from the
    same fp16 inputs:
      fa1, fa2:  O rounded to fp16 once (fp16(ref)).
      standard:  S rounded to fp16, P = softmax(S) rounded to fp16, O = P V rounded to
                 fp16 (S and P are fp16 HBM buffers in this algorithm; their rounding
                 roughly doubles the output error, so fp16(ref) alone is not attainable).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
import gpu
from gpu import _launch, _philox
from gpu.forward import fa2 as gpu_fa2

ALGS = ("standard", "fa1", "fa2")
T16 = dict(block_rows=16, block_cols=16)


def rel_err(O, ref):
    return float(np.linalg.norm(np.asarray(O, np.float64) - ref) / np.linalg.norm(ref))


def inputs(N, d, heads=1, kv_heads=None, batch=1, dtype="fp32", seed=0):
    p = iosim.Problem(N=N, d=d, batch=batch, heads=heads, kv_heads=kv_heads, dtype=dtype)
    return iosim.random_inputs(p, seed)


def fp16_model_error(alg, q, k, v, ref, causal=False, block_mask=None, B_r=16, B_c=16):
    """e_model of the module docstring."""
    if alg != "standard":
        return rel_err(ref.astype(np.float16), ref)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    k64, v64 = np.repeat(k64, G, axis=1), np.repeat(v64, G, axis=1)
    N, d = q.shape[-2:]
    S = (q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(d)).astype(np.float16).astype(np.float64)
    allowed = iosim.element_mask(N, causal, block_mask, B_r, B_c)
    S = np.where(allowed, S, -np.inf)
    m = S.max(-1, keepdims=True)
    E = np.exp(S - np.where(np.isfinite(m), m, 0))
    l = E.sum(-1, keepdims=True)
    P = np.where(l > 0, E / np.where(l > 0, l, 1), 0).astype(np.float16).astype(np.float64)
    O = (P @ v64).astype(np.float16)
    return rel_err(O, ref)


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_ragged_grouped(alg, dtype):
    """N=40 with 16x16 tiles (ragged last block), heads=2 sharing one K/V head."""
    q, k, v = inputs(40, 16, heads=2, kv_heads=1, dtype=dtype, seed=1)
    O = gpu.attention(q, k, v, algorithm=alg, **T16)
    assert O.dtype == q.dtype and O.shape == q.shape
    assert not np.isnan(O).any()
    ref = iosim.reference_attention(q, k, v)
    err = rel_err(O, ref)
    if dtype == "fp32":
        assert err <= 1e-5, err
    else:
        bound = 2 * fp16_model_error(alg, q, k, v, ref)
        assert err <= bound, (err, bound)


@pytest.mark.parametrize("alg", ALGS)
def test_causal_d48(alg):
    """Causal, d=48 (not a power of two), ragged N=40; fa2 also returns L."""
    q, k, v = inputs(40, 48, seed=2)
    ref, lse = iosim.reference_attention(q, k, v, causal=True, return_lse=True)
    if alg == "standard":
        O = gpu.attention(q, k, v, algorithm=alg, causal=True, **T16)
    else:
        O, L = gpu.attention(q, k, v, algorithm=alg, causal=True, return_stats=True, **T16)
        assert np.abs(L - lse).max() <= 1e-5 * np.abs(lse).max() + 1e-6
    assert rel_err(O, ref) <= 1e-5


@pytest.mark.parametrize("alg", ALGS)
def test_block_mask_empty_row_block(alg):
    """Query block 1 has no active tile: its O rows are exactly 0 (not NaN), L = -inf;
    the other blocks match the element-masked reference. Combined with causal."""
    N, B = 48, 16
    q, k, v = inputs(N, 16, seed=3)
    mask = np.array([[True, False, True],
                     [False, False, False],
                     [False, True, True]])
    ref = iosim.reference_attention(q, k, v, causal=True, block_mask=mask, B_r=B, B_c=B)
    if alg == "standard":
        O = gpu.attention(q, k, v, algorithm=alg, causal=True, block_mask=mask, **T16)
    else:
        O, L = gpu.attention(q, k, v, algorithm=alg, causal=True, block_mask=mask,
                             return_stats=True, **T16)
        assert np.isneginf(L[0, 0, 16:32]).all()
        assert np.isfinite(L[0, 0, :16]).all() and np.isfinite(L[0, 0, 32:]).all()
    assert not np.isnan(O).any()
    assert (O[0, 0, 16:32] == 0).all()
    assert rel_err(O, ref) <= 1e-5


@pytest.mark.parametrize("alg", ALGS)
def test_huge_logits(alg):
    """Scores up to ~2.5e4: integer-valued q, k (exact float32 dot products), scale=1.
    Without the running max, exp would overflow to inf and O would be NaN."""
    rng = np.random.default_rng(4)
    q = rng.integers(-40, 41, (1, 1, 32, 16)).astype(np.float32)
    k = rng.integers(-40, 41, (1, 1, 32, 16)).astype(np.float32)
    v = rng.standard_normal((1, 1, 32, 16)).astype(np.float32)
    s = q[0, 0] @ k[0, 0].T
    assert np.abs(s).max() > 5e3
    O = gpu.attention(q, k, v, algorithm=alg, scale=1.0, **T16)
    ref = iosim.reference_attention(q, k, v, scale=1.0)
    assert np.isfinite(O).all()
    assert rel_err(O, ref) <= 1e-5


def test_poison_shows_unwritten_rows():
    """The NaN poison works: launching fa2 over all but the last query block leaves
    exactly that block's O rows (and L) NaN. (This is why the other tests' no-NaN
    checks mean every element was written.)"""
    from numba import cuda
    q, k, v = inputs(40, 16, seed=5)
    o = _launch.filled((1, 40, 16), np.float32, np.nan)
    L = _launch.filled((1, 40), np.float32, np.nan)
    kern = gpu_fa2.fa2_forward_kernel(16, 16, 16, "fp32", False, False, False, 16)
    args = (cuda.to_device(q[0]), cuda.to_device(k[0]), cuda.to_device(v[0]), o, L,
            np.float32(0.25), np.int64(40), np.int64(40), np.int64(0), np.int64(0),  # N, N_k, band
            np.int64(1), np.int64(1), _launch.dummy_mask(),
            _launch.new_counters(False), *_philox.kernel_args())    # no dropout
    _launch.launch(kern, (2, 1), 16, gpu_fa2.shared_bytes(16, 16, 16, "fp32"), *args)
    Oh, Lh = o.copy_to_host(), L.copy_to_host()
    assert not np.isnan(Oh[0, :32]).any() and np.isnan(Oh[0, 32:]).all()
    assert not np.isnan(Lh[0, :32]).any() and np.isnan(Lh[0, 32:]).all()


def _bad(match, **kw):
    q, k, v = inputs(32, 16)
    args = dict(q=q, k=k, v=v)
    args.update({key: val for key, val in kw.items() if key in ("q", "k", "v")})
    opts = {key: val for key, val in kw.items() if key not in ("q", "k", "v")}
    with pytest.raises(ValueError, match=match):
        gpu.attention(args["q"], args["k"], args["v"], **opts)


def test_bad_inputs():
    q, k, v = inputs(32, 16)
    _bad("algorithm='fa3'", algorithm="fa3")
    _bad("ndim=3", q=q[0])
    _bad("dtype float64", q=q.astype(np.float64))
    _bad("dtypes are", k=k.astype(np.float16), v=v.astype(np.float16))
    _bad(r"d=257 is not allowed; allowed: integers 1\.\.256", q=np.zeros((1, 1, 32, 257), np.float32),
         k=np.zeros((1, 1, 32, 257), np.float32), v=np.zeros((1, 1, 32, 257), np.float32))
    _bad("k has shape", k=np.zeros((1, 1, 16, 16), np.float32))
    _bad("kv_heads=2", q=np.zeros((1, 3, 32, 16), np.float32),
         k=np.zeros((1, 2, 32, 16), np.float32), v=np.zeros((1, 2, 32, 16), np.float32))
    _bad("C-contiguous", q=np.asfortranarray(q))
    _bad("block_mask", block_mask=np.ones((3, 3), bool), **T16)
    _bad("block_mask", block_mask=np.ones((2, 2), np.int32), **T16)
    _bad("block_rows and block_cols", block_rows=16)
    _bad("return_stats", algorithm="standard", return_stats=True)
    # a tiling whose footprint exceeds the device's per-block shared memory
    with pytest.raises(ValueError, match=r"needs \d+ bytes of shared memory.*at most \d+"):
        gpu.attention(q, k, v, block_rows=256, block_cols=256)
    with pytest.raises(ValueError, match="sram_bytes"):
        gpu.attention(q, k, v, block_rows=64, block_cols=64, sram_bytes=1024)


def test_default_tiling_fits_48k():
    for alg in ALGS:
        for dt in ("fp32", "fp16"):
            for d in gpu.HEAD_DIMS:
                t = gpu.default_tiling(alg, d, dt)
                assert iosim.sram_footprint_bytes(alg, t.B_r, t.B_c, d, dt) <= 48 * 1024
    assert gpu.default_tiling("fa2", 64, "fp32") == iosim.Tiling(32, 32)


@settings(max_examples=6, deadline=None)
@given(alg=st.sampled_from(ALGS), N=st.integers(1, 24), B_r=st.sampled_from([8, 16]),
       B_c=st.sampled_from([8, 16]), causal=st.booleans(), grouped=st.booleans(),
       seed=st.integers(0, 2**16))
def test_property_matches_reference(alg, N, B_r, B_c, causal, grouped, seed):
    """Any tiny configuration: fp32 O within 1e-5 of float64, no NaN, and the kernels'
    own counts equal iosim's closed form."""
    heads, kv = (2, 1) if grouped else (1, 1)
    p = iosim.Problem(N=N, d=16, heads=heads, kv_heads=kv, causal=causal)
    q, k, v = iosim.random_inputs(p, seed)
    O, ledger = gpu.attention(q, k, v, algorithm=alg, causal=causal, block_rows=B_r,
                              block_cols=B_c, count_traffic=True)
    ref = iosim.reference_attention(q, k, v, causal=causal)
    assert not np.isnan(O).any()
    assert rel_err(O, ref) <= 1e-5
    assert ledger.counts() == iosim.closed_form(alg, p, iosim.Tiling(B_r, B_c)).counts()


def test_device_arrays_in_and_out():
    """Device arrays in -> a device array out (no host round trip by the API); fa2 L too."""
    from numba import cuda
    q, k, v = inputs(24, 16, heads=2, kv_heads=1, seed=6)
    dq, dk, dv = (cuda.to_device(x) for x in (q, k, v))
    O, L = gpu.attention(dq, dk, dv, return_stats=True, **T16)
    assert hasattr(O, "copy_to_host") and hasattr(L, "copy_to_host")
    ref, lse = iosim.reference_attention(q, k, v, return_lse=True)
    assert rel_err(O.copy_to_host(), ref) <= 1e-5
    assert np.abs(L.copy_to_host() - lse).max() <= 1e-5


def test_sram_bytes_uses_paper_rule():
    """sram_bytes=M alone: B_c = ceil(M/4d), B_r = min(B_c, d) (elements of the dtype),
    and the ledger is the closed form of that tiling."""
    q, k, v = inputs(24, 16, seed=7)
    O, ledger = gpu.attention(q, k, v, algorithm="fa2", sram_bytes=2048, count_traffic=True)
    M = 2048 // 4
    assert ledger.tiling == iosim.Tiling(min(-(-M // 64), 16), -(-M // 64)) == iosim.Tiling(8, 8)
    p = iosim.Problem(N=24, d=16)
    assert ledger.counts() == iosim.closed_form("fa2", p, ledger.tiling).counts()
    assert rel_err(O, iosim.reference_attention(q, k, v)) <= 1e-5


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_fa2_plain_and_fast_kernels_agree(dtype):
    """algorithm='fa2' runs gpu.forward.fa2_fast where it supports the tiling (here 16x16, d=16,
    16 threads: 4 threads per query row) and gpu.forward.fa2 with kernel='plain': the same schedule,
    so identical ledgers; both within the accuracy criterion of the reference."""
    q, k, v = inputs(37, 16, heads=2, kv_heads=1, dtype=dtype, seed=3)
    mask = np.array([[True, False, True], [False, False, False], [True, True, True]])
    ref = iosim.reference_attention(q, k, v, causal=True, block_mask=mask, B_r=16, B_c=16)
    outs = {}
    for fast in (True, False):
        O, L, led = gpu.attention(q, k, v, algorithm="fa2", causal=True, block_mask=mask,
                                  count_traffic=True, return_stats=True,
                                  kernel="fast" if fast else "plain", **T16)
        assert np.isfinite(O).all()
        assert led.counts() == iosim.closed_form("fa2", led.problem, led.tiling).counts()
        assert np.all(O[:, :, 16:32] == 0) and np.all(np.isneginf(L[:, :, 16:32]))
        outs[fast] = O
        tol = 1e-5 if dtype == "fp32" else 2 * fp16_model_error("fa2", q, k, v, ref)
        assert rel_err(O, ref) <= tol
    assert rel_err(outs[True], np.asarray(outs[False], np.float64)) <= (
        1e-6 if dtype == "fp32" else 1e-3)


def test_fa2_fast_options():
    """The measured tuning (TC, register cap) is used only where the kernel can run it;
    the simulator gets no register cap."""
    from gpu import api
    from gpu.forward import fa2_fast
    from gpu._launch import SIM
    opts = api.fa2_fast_options(256, 32, 64, 512)
    assert opts["TC"] == 8 and fa2_fast.plan(256, 32, 64, 512, opts["TC"]) is not None
    assert ("maxreg" in opts) != SIM and opts.get("maxreg", 128) == 128
    # d = 48: 8 threads per row would need d % 32 == 0, so plan() picks TC
    assert "TC" not in api.fa2_fast_options(256, 32, 48, 512)
    assert "TC" not in api.fa2_fast_options(64, 64, 64, 256)    # not tuned: plan's choice
    # every default tiling fits the H100's 232,448 bytes as attention() launches it (tuned
    # TC, warp shuffles: no RED region); without those, d=128 would not (233,984 bytes)
    for d, (B_r, B_c, threads) in api.FA2_FAST_TILES.items():
        TC = api.fa2_fast_options(B_r, B_c, d, threads).get("TC")
        assert fa2_fast.smem_bytes(B_r, B_c, d, threads, TC, shfl=True) <= 232448
    assert fa2_fast.smem_bytes(256, 32, 128, 512, shfl=False) == 233984 > 232448


def test_fast_flag_errors():
    q, k, v = inputs(20, 16)
    with pytest.raises(ValueError, match="kernel='fast': the fast fa1 kernels cannot run fp32 "
                                         "with B_r=16, B_c=16, d=16, threads=7"):
        gpu.attention(q, k, v, algorithm="fa1", kernel="fast", block_rows=16, block_cols=16,
                      threads=7)
    with pytest.raises(ValueError, match="kernel='fast': the fast fa2 kernel cannot run fp32 "
                                         "with B_r=16, B_c=16, d=16, threads=7"):
        gpu.attention(q, k, v, algorithm="fa2", kernel="fast", block_rows=16, block_cols=16,
                      threads=7)
    with pytest.raises(ValueError, match="fast='yes'"):
        gpu.attention(q, k, v, fast="yes")
    O = gpu.attention(q, k, v, algorithm="fa1", kernel="plain")
    assert np.isfinite(O).all()
