"""gpu.flash_attn: flash-attn 2's interface (issue 40, items 1 and 4) on flashsim's kernels.

CPU (Numba's simulator, NumPy, tiny sizes): flash-attn's own call patterns against a float64
reference written here from flash-attn's docstrings (bottom-right causal, window_size
[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right], GQA head h -> h // group,
a row with no key -> 0), cross-checked with iosim.reference_attention; the masks of
flash-attn's own docstring examples read off exactly (q = 0, v = one-hot key index: row i of
out is its mask row over its count); varlen with cu_seqlens; kvcache with cache_seqlens,
block_table, cache_batch_idx, return_softmax_lse; every refusal.
Two features of flash_attn_with_kvcache run on gpu.decode features the `ragged` branch adds
(per-sequence cache_seqlens and k=/v= appends): their tests are marked RAGGED below and fail
until it is merged.
gpu-marked (a CUDA GPU with torch): torch tensors through all three functions, torch out,
gradients against torch's SDPA; torch CPU tensors on a GPU machine (host copies, CPU out).
torch CPU tensors without a GPU (the simulator): tests/test_flash_attn_torch_cpu.py.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from _errors import one_line
from _fa_mask import fa_mask
from gpu.flash_attn import (flash_attn_func, flash_attn_kvpacked_func,
                            flash_attn_qkvpacked_func, flash_attn_varlen_func,
                            flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                            flash_attn_with_kvcache)

RNG = np.random.default_rng(40)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _fa_ref(q, k, v, causal=False, window=(-1, -1), scale=None, lse=False):
    """float64 attention in flash-attn's layout: q (B, Nq, H, d), k, v (B, Nk, Hk, d)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, Nq, H, d = q.shape
    Nk, Hk = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    g = H // Hk
    keep = fa_mask(Nq, Nk, causal, window)
    out = np.zeros_like(q)
    L = np.full((B, H, Nq), -np.inf)
    for b in range(B):
        for h in range(H):
            s = scale * q[b, :, h] @ k[b, :, h // g].T
            s = np.where(keep, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            sees = np.isfinite(m[:, 0])
            p = np.where(keep, np.exp(s - np.where(sees[:, None], m, 0)), 0)
            l_ = p.sum(axis=1)
            out[b, :, h] = np.where(sees[:, None], p @ v[b, :, h // g]
                                    / np.where(sees, l_, 1)[:, None], 0)
            L[b, h] = np.where(sees, m[:, 0] + np.log(np.where(sees, l_, 1)), -np.inf)
    return (out, L) if lse else out


def _close(got, want, tol=1e-5):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= tol, err


# ---------------------------------------------------------------------------------------
# flash_attn_func
# ---------------------------------------------------------------------------------------
#: (seqlen_q, seqlen_k, nheads, nheads_k, causal, window_size)
FUNC_CASES = [
    (5, 9, 4, 2, True, (-1, -1)),       # bottom-right causal, GQA
    (9, 5, 2, 1, True, (-1, -1)),       # seqlen_q > seqlen_k: first rows see no key (0)
    (8, 8, 2, 2, False, (3, 1)),        # local window
    (7, 12, 4, 1, True, (4, -1)),       # causal + window: right becomes 0; MQA
    (6, 10, 2, 2, False, (-1, 2)),      # only a right bound
    (6, 6, 2, 2, False, (-1, -1)),
    (1, 11, 2, 1, True, (-1, -1)),      # decode-shaped: causal is the whole key
]


@pytest.mark.parametrize("Nq,Nk,H,Hk,causal,window", FUNC_CASES)
def test_func_matches_flash_attn_semantics(Nq, Nk, H, Hk, causal, window):
    q, k, v = _rand(2, Nq, H, 16), _rand(2, Nk, Hk, 16), _rand(2, Nk, Hk, 16)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert out.shape == (2, Nq, H, 16) and out.flags.c_contiguous
    want = _fa_ref(q, k, v, causal, window)
    _close(out, want)
    # the same answer as iosim's reference in flashsim's layout
    T = lambda x: np.asarray(x, np.float64).transpose(0, 2, 1, 3)  # noqa: E731
    if causal:      # flash-attn: causal sets right = 0
        window = (window[0], 0) if window[0] >= 0 else (-1, -1)
    ref = iosim.reference_attention(T(q), T(k), T(v), causal=causal, window=window)
    _close(out, T(ref))


@pytest.mark.parametrize("Nq,Nk,want", [
    (2, 5, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
    (5, 2, [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]),
])
def test_func_causal_mask_is_flash_attns_docstring_example(Nq, Nk, want):
    """flash-attn's docstring masks, read off: q = 0 makes the scores equal, so a row's
    output over v = one-hot(key) is its mask row divided by its count (0 where none)."""
    want = np.array(want, np.float64)
    q = np.zeros((1, Nq, 1, Nk), np.float32)
    k = _rand(1, Nk, 1, Nk)
    v = np.eye(Nk, dtype=np.float32)[None, :, None, :]
    out = flash_attn_func(q, k, v, causal=True)[0, :, 0]
    cnt = want.sum(1, keepdims=True)
    np.testing.assert_allclose(out, want / np.where(cnt, cnt, 1), atol=1e-6)


def test_func_window_reaching_past_the_keys_is_unbounded_and_scale_is_used():
    q, k, v = _rand(1, 6, 2, 8), _rand(1, 6, 2, 8), _rand(1, 6, 2, 8)
    a = flash_attn_func(q, k, v, window_size=(6, 100), softmax_scale=0.3)
    _close(a, _fa_ref(q, k, v, scale=0.3))


def test_func_fp16():
    q, k, v = (_rand(1, 12, 2, 16, dtype=np.float16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    assert out.dtype == np.float16 and out.shape == (1, 12, 2, 16)
    _close(out, _fa_ref(q, k, v, True), tol=2e-2)


def test_func_dropout_runs_and_differs_from_no_dropout():
    q, k, v = (_rand(1, 8, 1, 8) for _ in range(3))
    np.random.seed(3)
    a = flash_attn_func(q, k, v, dropout_p=0.5)
    np.random.seed(3)
    b = flash_attn_func(q, k, v, dropout_p=0.5)
    np.testing.assert_array_equal(a, b)            # seeded from NumPy's global state
    assert np.abs(a - _fa_ref(q, k, v)).max() > 1e-3


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(Nq=st.integers(1, 12), Nk=st.integers(1, 12), Hk=st.sampled_from([1, 2]),
       g=st.sampled_from([1, 2]), causal=st.booleans(),
       left=st.integers(-1, 6), right=st.integers(-1, 6), d=st.sampled_from([4, 8]))
def test_func_property(Nq, Nk, Hk, g, causal, left, right, d):
    q, k, v = _rand(1, Nq, Hk * g, d), _rand(1, Nk, Hk, d), _rand(1, Nk, Hk, d)
    out = flash_attn_func(q, k, v, causal=causal, window_size=(left, right))
    _close(out, _fa_ref(q, k, v, causal, (left, right)))


# ---------------------------------------------------------------------------------------
# flash_attn_varlen_func
# ---------------------------------------------------------------------------------------
CU_Q = np.array([0, 3, 3, 10, 14], np.int32)     # lengths 3, 0, 7, 4
CU_K = np.array([0, 5, 7, 14, 16], np.int32)     # lengths 5, 2, 7, 2


def _varlen_ref(q, k, v, cu_q, cu_k, **kw):
    out = np.zeros(q.shape)
    for b in range(len(cu_q) - 1):
        a, e, ka, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if e > a:
            out[a:e] = _fa_ref(q[None, a:e], k[None, ka:ke], v[None, ka:ke], **kw)[0]
    return out


@pytest.mark.parametrize("causal,window,Hk", [(False, (-1, -1), 2), (True, (-1, -1), 1),
                                              (True, (2, -1), 2), (False, (1, 1), 1)])
def test_varlen_matches_per_sequence_reference(causal, window, Hk):
    q, k, v = _rand(14, 2, 8), _rand(16, Hk, 8), _rand(16, Hk, 8)
    out = flash_attn_varlen_func(q, k, v, CU_Q, CU_K, 7, 7, causal=causal,
                                 window_size=window)
    assert out.shape == (14, 2, 8)
    _close(out, _varlen_ref(q, k, v, CU_Q, CU_K, causal=causal, window=window))


def test_varlen_max_seqlen_below_the_longest_is_refused():
    q, k, v = _rand(14, 2, 8), _rand(16, 2, 8), _rand(16, 2, 8)
    with pytest.raises(ValueError, match="max_seqlen_q=6"):
        flash_attn_varlen_func(q, k, v, CU_Q, CU_K, 6, 7)
    with pytest.raises(ValueError, match="max_seqlen_k=5"):
        flash_attn_varlen_func(q, k, v, CU_Q, CU_K, 7, 5)
    # larger than the longest is fine (flash-attn's callers often pass a bound)
    out = flash_attn_varlen_func(q, k, v, CU_Q, CU_K, 64, 64, causal=True)
    _close(out, _varlen_ref(q, k, v, CU_Q, CU_K, causal=True))


def test_packed_variants():
    qkv = _rand(1, 7, 3, 2, 8)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    _close(out, _fa_ref(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], True))
    q, kv = _rand(1, 5, 4, 8), _rand(1, 9, 2, 2, 8)
    out = flash_attn_kvpacked_func(q, kv, window_size=(2, 1))
    _close(out, _fa_ref(q, kv[:, :, 0], kv[:, :, 1], False, (2, 1)))
    cu = np.array([0, 4, 11], np.int32)
    qkv = _rand(11, 3, 2, 8)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, 7, causal=True)
    _close(out, _varlen_ref(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, causal=True))
    q, kv = _rand(14, 2, 8), _rand(16, 2, 1, 8)
    out = flash_attn_varlen_kvpacked_func(q, kv, CU_Q, CU_K, 7, 7, causal=True)
    _close(out, _varlen_ref(q, kv[:, 0], kv[:, 1], CU_Q, CU_K, causal=True))
    with pytest.raises(ValueError) as e:
        flash_attn_qkvpacked_func(_rand(1, 7, 2, 2, 8))
    one_line(e, "qkv has shape (1, 7, 2, 2, 8)", "must be 3")


# ---------------------------------------------------------------------------------------
# flash_attn_with_kvcache
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Nq,H,Hk", [(1, 2, 2), (3, 4, 2), (2, 4, 1)])
def test_kvcache_contiguous_uniform_seqlens(causal, Nq, H, Hk):
    kc, vc = _rand(2, 20, Hk, 16), _rand(2, 20, Hk, 16)
    q = _rand(2, Nq, H, 16)
    out, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=13, causal=causal,
                                       return_softmax_lse=True)
    want, L = _fa_ref(q, kc[:, :13], vc[:, :13], causal, lse=True)
    assert out.shape == (2, Nq, H, 16) and lse.shape == (2, H, Nq)
    assert lse.dtype == np.float32
    _close(out, want)
    np.testing.assert_allclose(lse, L, rtol=1e-5, atol=1e-5)
    # an int32 array of equal lengths and the whole cache (cache_seqlens=None)
    out2 = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([13, 13], np.int32),
                                   causal=causal)
    np.testing.assert_array_equal(out2, out)
    _close(flash_attn_with_kvcache(q, kc, vc, causal=causal), _fa_ref(q, kc, vc, causal))


def test_kvcache_paged_block_table_and_num_splits():
    P, pages = 4, 3                                  # page_block_size 4, 3 pages each
    kc, vc = _rand(8, P, 2, 16), _rand(8, P, 2, 16)  # num_blocks 8
    table = np.array([[5, 0, 7], [2, 6, 1]], np.int32)
    q = _rand(2, 2, 4, 16)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=10, block_table=table,
                                  causal=True, num_splits=2)
    kseq = np.stack([kc[t].reshape(pages * P, 2, 16) for t in table])[:, :10]
    vseq = np.stack([vc[t].reshape(pages * P, 2, 16) for t in table])[:, :10]
    _close(out, _fa_ref(q, kseq, vseq, True))
    _close(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=10, block_table=table,
                                   causal=True, num_splits=0), _fa_ref(q, kseq, vseq, True))


def test_kvcache_cache_batch_idx_picks_the_cache_entries():
    kc, vc = _rand(3, 9, 1, 8), _rand(3, 9, 1, 8)
    q = _rand(2, 1, 2, 8)
    idx = np.array([2, 0], np.int32)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=7, cache_batch_idx=idx)
    _close(out, _fa_ref(q, kc[idx, :7], vc[idx, :7]))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(Nq=st.integers(1, 4), n=st.integers(4, 20), P=st.sampled_from([None, 3, 8]),
       g=st.sampled_from([1, 2]), causal=st.booleans(), S=st.sampled_from([0, 1, 2]),
       seed=st.integers(0, 2 ** 16))
def test_kvcache_property(Nq, n, P, g, causal, S, seed):
    """Contiguous or paged (shuffled pages) caches, any split count: flash-attn's answer."""
    rng = np.random.default_rng(seed)
    B, Hk, d, cap = 2, 2, 8, 24
    kseq = rng.standard_normal((B, cap, Hk, d)).astype(np.float32)
    vseq = rng.standard_normal((B, cap, Hk, d)).astype(np.float32)
    q = rng.standard_normal((B, Nq, Hk * g, d)).astype(np.float32)
    n = max(n, Nq)
    kw = dict(cache_seqlens=n, causal=causal, num_splits=S, return_softmax_lse=True)
    if P is None:
        out, lse = flash_attn_with_kvcache(q, kseq, vseq, **kw)
    else:
        npg = cap // P
        perm = rng.permutation(B * npg)
        kc = np.empty((B * npg, P, Hk, d), np.float32)
        vc = np.empty_like(kc)
        kc[perm] = kseq.reshape(B * npg, P, Hk, d)
        vc[perm] = vseq.reshape(B * npg, P, Hk, d)
        table = perm.reshape(B, npg).astype(np.int32)
        out, lse = flash_attn_with_kvcache(q, kc, vc, block_table=table, **kw)
    want, L = _fa_ref(q, kseq[:, :n], vseq[:, :n], causal, lse=True)
    _close(out, want)
    np.testing.assert_allclose(lse, L, rtol=1e-5, atol=1e-5)


# RAGGED: per-sequence cache_seqlens run on gpu.decode(cache_seqlens=(batch,) int32), which
# the `ragged` branch adds; this test fails here until it is merged.
def test_kvcache_per_sequence_cache_seqlens():
    kc, vc = _rand(3, 12, 2, 16), _rand(3, 12, 2, 16)
    q = _rand(3, 2, 2, 16)
    lens = np.array([12, 4, 9], np.int32)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    for b, n in enumerate(lens):
        _close(out[b:b + 1], _fa_ref(q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], True))


# RAGGED: k=/v= appends run on gpu.decode(k=..., v=...), which the `ragged` branch adds;
# this test fails here until it is merged.
def test_kvcache_appends_new_rows_in_place():
    kc, vc = _rand(2, 12, 2, 16), _rand(2, 12, 2, 16)
    k0, v0 = kc.copy(), vc.copy()
    q, kn, vn = _rand(2, 2, 4, 16), _rand(2, 2, 2, 16), _rand(2, 2, 2, 16)
    lens = np.array([5, 8], np.int32)
    out = flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, causal=True)
    for b, n in enumerate(lens):
        np.testing.assert_array_equal(kc[b, n:n + 2], kn[b])      # written in place
        np.testing.assert_array_equal(vc[b, n + 2:], v0[b, n + 2:])
        np.testing.assert_array_equal(kc[b, :n], k0[b, :n])
        kk = np.concatenate([k0[b, :n], kn[b]])[None]
        vv = np.concatenate([v0[b, :n], vn[b]])[None]
        _close(out[b:b + 1], _fa_ref(q[b:b + 1], kk, vv, True))


# ---------------------------------------------------------------------------------------
# refusals: one line, naming the argument and what is allowed
# ---------------------------------------------------------------------------------------
def _qkv(Nq=4, Nk=4, H=2, Hk=2, d=8):
    return _rand(1, Nq, H, d), _rand(1, Nk, Hk, d), _rand(1, Nk, Hk, d)


@pytest.mark.parametrize("kwargs,words", [
    (dict(softcap=30.0), ("softcap=30.0", "allowed: 0.0")),
    (dict(alibi_slopes=np.ones(2, np.float32)), ("alibi_slopes", "allowed: None")),
    (dict(return_attn_probs=True), ("return_attn_probs=True", "allowed: False")),
    (dict(window_size=(1,)), ("window_size=(1,)", "allowed")),
    (dict(dropout_p=1.0), ("dropout_p=1.0", "allowed")),
    (dict(softmax_scale="x"), ("softmax_scale='x'", "allowed")),
])
def test_func_refusals(kwargs, words):
    with pytest.raises(ValueError) as e:
        flash_attn_func(*_qkv(), **kwargs)
    one_line(e, *words)


def test_func_shape_kind_dtype_refusals():
    q, k, v = _qkv(H=3, Hk=2)
    with pytest.raises(ValueError) as e:
        flash_attn_func(q, k, v)
    one_line(e, "nheads_k=2", "must divide")
    q, k, v = _qkv()
    with pytest.raises(ValueError) as e:
        flash_attn_func(q, k[:, :, :, :4], v)
    one_line(e, "k has shape", "headdim=8")
    with pytest.raises(ValueError) as e:
        flash_attn_func(q[0], k, v)
    one_line(e, "q has shape", "seqlen_q")
    with pytest.raises(ValueError) as e:
        flash_attn_func(q, k.astype(np.float16), v)
    one_line(e, "same dtype", "k: float16")
    with pytest.raises(ValueError) as e:
        flash_attn_func(q.tolist(), k, v)
    one_line(e, "q must be a NumPy array or a torch tensor", "list")
    q, k, v = _qkv(d=300)
    with pytest.raises(ValueError) as e:
        flash_attn_func(q, k, v)
    one_line(e, "headdim=300", "1..256")


@pytest.mark.parametrize("kwargs,words", [
    (dict(dropout_p=0.1), ("dropout_p=0.1", "allowed: 0.0")),
    (dict(block_table=np.zeros((4, 1), np.int32)), ("block_table", "allowed: None")),
    (dict(softcap=1.0), ("softcap=1.0",)),
    (dict(alibi_slopes=np.ones(2)), ("alibi_slopes",)),
    (dict(return_attn_probs=True), ("return_attn_probs=True",)),
])
def test_varlen_refusals(kwargs, words):
    q, k, v = _rand(14, 2, 8), _rand(16, 2, 8), _rand(16, 2, 8)
    with pytest.raises(ValueError) as e:
        flash_attn_varlen_func(q, k, v, CU_Q, CU_K, 7, 7, **kwargs)
    one_line(e, *words)


@pytest.mark.parametrize("kwargs,words", [
    (dict(rotary_cos=np.ones((12, 4)), rotary_sin=np.ones((12, 4))), ("rotary_cos",)),
    (dict(cache_leftpad=np.zeros(1, np.int32)), ("cache_leftpad", "allowed: None")),
    (dict(window_size=(3, -1)), ("window_size=(3, -1)", "allowed: (-1, -1)")),
    (dict(window_size=(-1, 2)), ("window_size=(-1, 2)",)),
    (dict(softcap=5.0), ("softcap=5.0",)),
    (dict(alibi_slopes=np.ones(2)), ("alibi_slopes",)),
    (dict(num_splits=-1), ("num_splits=-1", "allowed")),
    (dict(k=np.zeros((1, 1, 2, 8), np.float32)), ("k and v",)),
    (dict(k=np.zeros((1, 1, 2, 8), np.float32), v=np.zeros((1, 1, 2, 8), np.float32)),
     ("cache_seqlens is required",)),
    (dict(cache_seqlens=np.array([1, 2, 3], np.int32)), ("cache_seqlens has shape (3,)",)),
    (dict(k=np.zeros((1, 2, 2, 8), np.float32), v=np.zeros((1, 2, 2, 8), np.float32),
          cache_seqlens=3), ("seqlen_new=2", "seqlen_q=1")),
    (dict(cache_batch_idx=np.array([5], np.int32)), ("cache_batch_idx", "0..0")),
])
def test_kvcache_refusals(kwargs, words):
    q, kc, vc = _rand(1, 1, 2, 8), _rand(1, 12, 2, 8), _rand(1, 12, 2, 8)
    with pytest.raises(ValueError) as e:
        flash_attn_with_kvcache(q, kc, vc, **kwargs)
    one_line(e, *words)


def test_kvcache_too_many_rows_and_batch_mismatch_refused():
    kc, vc = _rand(1, 40, 2, 8), _rand(1, 40, 2, 8)
    with pytest.raises(ValueError) as e:
        flash_attn_with_kvcache(_rand(1, 17, 2, 8), kc, vc)
    one_line(e, "seqlen_q=17", "1..16")
    with pytest.raises(ValueError) as e:
        flash_attn_with_kvcache(_rand(2, 1, 2, 8), kc, vc)
    one_line(e, "batch_size_cache=1", "cache_batch_idx")


def test_import_needs_neither_torch_nor_numba():
    """Importing gpu (and its torch glue) or iosim imports none of torch, numba and
    transformers: torch is imported when a tensor is met, numba when a kernel runs."""
    import subprocess
    import sys
    code = ("import sys, gpu, gpu.flash_attn, gpu.hf, gpu._torch_cpu, iosim, iosim.workload; "
            "print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'torch', 'numba', 'transformers'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------
# GPU: torch CUDA tensors (the lead runs these: python3 -m pytest -m gpu this file)
# ---------------------------------------------------------------------------------------
def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def _sdpa(torch, q, k, v, causal=False, window=(-1, -1)):
    """torch SDPA in flash-attn's layout (B, N, H, d) with flash-attn's mask (GQA by
    repeating K/V heads); float32 math."""
    B, Nq, H, d = q.shape
    Nk, Hk = k.shape[1], k.shape[2]
    mask = torch.as_tensor(fa_mask(Nq, Nk, causal, window), device=q.device)
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    kt, vt = (x.repeat_interleave(H // Hk, dim=1) for x in (kt, vt))
    o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    o = torch.where(mask.any(-1)[None, None, :, None], o, torch.zeros_like(o))
    return o.transpose(1, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("Nq,Nk,H,Hk,causal,window", [
    (128, 128, 4, 2, True, (-1, -1)), (96, 160, 4, 4, True, (-1, -1)),
    (128, 128, 2, 1, False, (32, 16)), (64, 192, 4, 2, True, (48, -1))])
def test_gpu_torch_func_forward_and_gradients_match_sdpa(dtype, Nq, Nk, H, Hk, causal,
                                                         window):
    torch = _torch_cuda()
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, Nq, H, 64, device="cuda", dtype=dt, generator=g).requires_grad_()
    k = torch.randn(2, Nk, Hk, 64, device="cuda", dtype=dt, generator=g).requires_grad_()
    v = torch.randn(2, Nk, Hk, 64, device="cuda", dtype=dt, generator=g).requires_grad_()
    out = flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert isinstance(out, torch.Tensor) and out.dtype == dt and out.is_contiguous()
    assert out.shape == (2, Nq, H, 64)
    want = _sdpa(torch, q, k, v, causal, window)
    tol = 2e-2 if dtype == "float16" else 6e-2
    assert (out.float() - want).abs().max().item() <= tol
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    wgrads = torch.autograd.grad(want, (q, k, v), do.float())
    for a, b in zip(grads, wgrads):
        rel = ((a.float() - b).norm() / b.norm()).item()
        assert rel <= tol, rel
    with torch.no_grad():                          # no autograd: gpu.attention directly
        out2 = flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert (out2.float() - want).abs().max().item() <= tol


@pytest.mark.gpu
def test_gpu_torch_refusals():
    torch = _torch_cuda()
    q, k, v = (torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16,
                           requires_grad=True) for _ in range(3))
    with pytest.raises(ValueError, match="deterministic=True is not supported with gradients"):
        flash_attn_func(q, k, v, deterministic=True)
    with torch.no_grad():                   # no backward: the forward is deterministic
        flash_attn_func(q, k, v, deterministic=True)
    with pytest.raises(ValueError, match=r"different devices \(q: cpu, k: cuda:0"):
        flash_attn_func(q.detach().cpu(), k, v)
    with pytest.raises(ValueError, match="mixed kinds"):
        flash_attn_func(q, k.detach().cpu().numpy(), v)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_gpu_torch_cpu_tensors_run_on_the_gpu_and_come_back_on_the_cpu(dtype):
    """With a GPU, CPU tensors are copied to it and back (as NumPy arrays are): CPU out,
    CPU gradients, the same numbers as the same tensors on CUDA."""
    torch = _torch_cuda()
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 96, H, 64, generator=g).to(dt).requires_grad_()
               for H in (4, 2, 2))
    out = flash_attn_func(q, k, v, causal=True)
    assert out.device.type == "cpu" and out.dtype == dt and out.is_contiguous()
    do = torch.randn(out.shape, generator=g).to(dt)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert all(x.device.type == "cpu" and x.dtype == dt for x in grads)
    qc, kc, vc = (x.detach().cuda().requires_grad_() for x in (q, k, v))
    outc = flash_attn_func(qc, kc, vc, causal=True)
    tol = 1e-3 if dtype == "float16" else 1e-5      # the same kernels (dQ: atomic adds)
    assert ((out.float() - outc.detach().float().cpu()).abs().max()).item() <= tol
    gc = torch.autograd.grad(outc, (qc, kc, vc), do.cuda())
    for a, b in zip(grads, gc):
        assert ((a.float() - b.float().cpu()).norm() / b.float().norm()).item() <= tol
    kcache, vcache = (torch.randn(2, 64, 2, 64, generator=g).to(dt) for _ in range(2))
    o, lse = flash_attn_with_kvcache(q.detach()[:, :1], kcache, vcache, cache_seqlens=40,
                                     causal=True, return_softmax_lse=True)
    assert o.device.type == "cpu" and lse.device.type == "cpu" and lse.dtype == torch.float32


@pytest.mark.gpu
def test_gpu_torch_qkvpacked_gradients_match_sdpa():
    torch = _torch_cuda()
    qkv = torch.randn(2, 80, 3, 4, 64, device="cuda", dtype=torch.float16,
                      requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    want = _sdpa(torch, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], True)
    assert (out.float() - want).abs().max().item() <= 2e-2
    do = torch.randn_like(out)
    (g,), (w,) = (torch.autograd.grad(out, (qkv,), do),
                  torch.autograd.grad(want, (qkv,), do.float()))
    assert ((g.float() - w).norm() / w.norm()).item() <= 2e-2


@pytest.mark.gpu
def test_gpu_torch_func_dropout_is_reproducible_and_differentiable():
    torch = _torch_cuda()
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16,
                           requires_grad=True) for _ in range(3))
    torch.manual_seed(1)
    a = flash_attn_func(q, k, v, dropout_p=0.2, causal=True)
    torch.manual_seed(1)
    b = flash_attn_func(q, k, v, dropout_p=0.2, causal=True)
    assert torch.equal(a, b)
    a.float().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.gpu
def test_gpu_torch_varlen_forward_and_gradients_match_sdpa():
    torch = _torch_cuda()
    lens_q, lens_k = [37, 0, 64, 5], [37, 12, 80, 40]
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32,
                        device="cuda")
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32,
                        device="cuda")
    q = torch.randn(sum(lens_q), 4, 64, device="cuda", dtype=torch.float16,
                    requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 64, device="cuda", dtype=torch.float16,
                    requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 64, device="cuda", dtype=torch.float16,
                    requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    parts = []
    for b in range(4):
        a, e = int(cu_q[b]), int(cu_q[b + 1])
        ka, ke = int(cu_k[b]), int(cu_k[b + 1])
        if e > a:
            parts.append(_sdpa(torch, q[None, a:e], k[None, ka:ke], v[None, ka:ke],
                               True)[0])
    want = torch.cat(parts)
    assert (out.float() - want).abs().max().item() <= 2e-2
    do = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), do),
                    torch.autograd.grad(want, (q, k, v), do.float())):
        assert ((a.float() - b).norm() / b.norm()).item() <= 2e-2
    with torch.no_grad():                           # gpu.attention_varlen directly
        out2 = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                      causal=True)
    assert torch.equal(out2, out.detach())


@pytest.mark.gpu
def test_gpu_attention_varlen_takes_torch_tensors():
    """gpu.attention_varlen and its backward on torch CUDA tensors (they refused them
    before issue 40): torch out, L in flash-attn's (heads, total_q) layout, the kernel's own
    counts equal to iosim.varlen_closed_form."""
    torch = _torch_cuda()
    import gpu
    cu_q = np.array([0, 20, 20, 70], np.int32)
    cu_k = np.array([0, 33, 40, 90], np.int32)
    q = torch.randn(70, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(90, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(90, 2, 64, device="cuda", dtype=torch.float16)
    o, L, ledger = gpu.attention_varlen(q, k, v, cu_q, torch.as_tensor(cu_k, device="cuda"),
                                        causal=True, return_stats=True, count_traffic=True)
    assert isinstance(o, torch.Tensor) and o.shape == q.shape and o.dtype == q.dtype
    assert isinstance(L, torch.Tensor) and L.shape == (4, 70) and L.dtype == torch.float32
    assert ledger.counts() == iosim.varlen_closed_form("fa2", ledger.problem,
                                                       ledger.tiling).counts()
    want = _varlen_ref(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), cu_q, cu_k,
                       causal=True)
    assert np.abs(o.float().cpu().numpy() - want).max() <= 2e-2
    do = torch.randn_like(o)
    dq, dk, dv = gpu.attention_varlen_backward(q, k, v, o, do, L, cu_q, cu_k, causal=True)
    assert all(isinstance(x, torch.Tensor) for x in (dq, dk, dv))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.gpu
def test_gpu_torch_kvcache_contiguous_and_paged():
    torch = _torch_cuda()
    kc = torch.randn(2, 256, 2, 64, device="cuda", dtype=torch.float16)
    vc = torch.randn(2, 256, 2, 64, device="cuda", dtype=torch.float16)
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    out, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=200, causal=True,
                                       return_softmax_lse=True)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 1, 8, 64)
    assert lse.shape == (2, 8, 1) and lse.dtype == torch.float32
    want = _sdpa(torch, q, kc[:, :200], vc[:, :200], True)
    assert (out.float() - want).abs().max().item() <= 2e-2
    # the same cache as 16-row pages in a shuffled block table
    perm = torch.randperm(32, device="cuda")
    pages_k = torch.empty(32, 16, 2, 64, device="cuda", dtype=torch.float16)
    pages_v = torch.empty_like(pages_k)
    pages_k[perm] = kc.reshape(32, 16, 2, 64)
    pages_v[perm] = vc.reshape(32, 16, 2, 64)
    table = perm.reshape(2, 16).to(torch.int32).contiguous()
    out2 = flash_attn_with_kvcache(q, pages_k, pages_v, cache_seqlens=200, causal=True,
                                   block_table=table)
    assert (out2.float() - want).abs().max().item() <= 2e-2


# RAGGED: per-sequence cache_seqlens and k=/v= appends (gpu.decode from the `ragged`
# branch); fails until it is merged.
@pytest.mark.gpu
def test_gpu_torch_kvcache_append_per_sequence():
    torch = _torch_cuda()
    kc = torch.randn(2, 128, 2, 64, device="cuda", dtype=torch.float16)
    vc = torch.randn(2, 128, 2, 64, device="cuda", dtype=torch.float16)
    k0, v0 = kc.clone(), vc.clone()
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.float16)
    kn = torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.float16)
    vn = torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.float16)
    lens = torch.tensor([50, 90], dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, causal=True)
    for b, n in enumerate((50, 90)):
        assert torch.equal(kc[b, n], kn[b, 0]) and torch.equal(vc[b, n], vn[b, 0])
        kk = torch.cat([k0[b, :n], kn[b]])[None]
        vv = torch.cat([v0[b, :n], vn[b]])[None]
        want = _sdpa(torch, q[b:b + 1], kk, vv, True)
        assert (out[b:b + 1].float() - want).abs().max().item() <= 2e-2
