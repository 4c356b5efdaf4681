"""gpu.decode on ragged batches (per-sequence cache_seqlens) and with an append (k=, v=):
the kernels' own counts against iosim.decode's closed form, outputs against dense float64
per sequence, the cache written in place, device-side lengths, bad input. Runs in Numba's
CUDA simulator at tiny sizes; the `gpu` tests run the hardware build (lane groups, warp
shuffles, 16-byte loads) at moderate sizes, with torch device arrays where asked."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from iosim.decode import (DecodeProblem, append_kv, decode_closed_form, paged_cache,
                          random_decode_inputs, random_new_kv, reference_decode)


def rel_err(x, ref):
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)             # 0 when no row sees a key: the absolute error
    return np.linalg.norm(np.asarray(x, dtype=np.float64) - ref) / (den if den else 1.0)


def run_case(dtype, lens, N_q, heads, kv_heads, page, S, kv_reads, append, *, d=16,
             causal=True, seed=0, host_lens=list):
    """gpu.decode on a ragged problem (NumPy in the simulator); returns the problem, the
    logical caches after any append, q, O, L, the ledger and the caches as the kernels
    left them (contiguous: the NumPy caches passed in; paged: the pools and table)."""
    import gpu
    p = DecodeProblem.ragged(lens, d, heads=heads, kv_heads=kv_heads, N_q=N_q, append=append,
                             page_size=page, dtype=dtype)
    q, k, v = random_decode_inputs(p, seed=seed)
    kn, vn = random_new_kv(p, seed=seed) if append else (None, None)
    kw = dict(num_splits=S, kv_reads=kv_reads, causal=causal, return_stats=True,
              count_traffic=True, cache_seqlens=host_lens(lens))
    if append:
        kw.update(k=kn, v=vn)
    if page:
        kc, vc, table = paged_cache(p, k, v, seed=seed + 1)
        O, L, led = gpu.decode(q, kc, vc, block_table=table, **kw)
        caches = (kc, vc, table)
    else:
        kc, vc = k.copy(), v.copy()
        O, L, led = gpu.decode(q, kc, vc, **kw)
        caches = (kc, vc, None)
    kk, vv = append_kv(p, k, v, kn, vn) if append else (k, v)
    return p, (q, kk, vv), O, L, led, caches


def check(p, qkv, O, L, led, S, kv_reads, causal=True):
    q, k, v = qkv
    if causal:
        ref, lse = reference_decode(q, k, v, seqlens=p.seqlens, return_lse=True)
    else:   # every new row sees its sequence's whole cache: each row alone, N_q = 1
        outs = [reference_decode(q[:, :, r:r + 1], k, v, seqlens=p.seqlens, return_lse=True)
                for r in range(p.N_q)]
        ref = np.concatenate([o for o, _ in outs], axis=2)
        lse = np.concatenate([x for _, x in outs], axis=2)
    # O, L came back NaN-poisoned and the caches hold NaN past each sequence's rows:
    # an unwritten output or a read past a cache would show as NaN
    assert not np.isnan(O).any() and not np.isnan(L).any()
    # fp32: float32 arithmetic; fp16 / bf16: O rounded once to the dtype (2^-11, 2^-8)
    tol = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 8e-3}[p.dtype]
    assert rel_err(O, ref) <= tol, rel_err(O, ref)
    none = np.isneginf(lse)
    assert np.array_equal(np.isneginf(L), none) and np.all(O[none] == 0)
    np.testing.assert_allclose(L[~none], lse[~none], rtol=0,
                               atol=1e-5 * (1 + np.abs(lse[~none]).max(initial=0)))
    schedule = "split_kv" if S > 1 else "fa2_decode"
    cf = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads)
    assert led.algorithm == schedule and led.counts() == cf.counts()
    assert led.hbm_bytes == cf.hbm_bytes


# (dtype, cache_seqlens, N_q, heads, kv_heads, page_size, num_splits, kv_reads, append)
CASES = [
    ("fp32", (37, 0, 5, 1), 2, 2, 2, None, 1, "per_query_head", False),   # fa2, 0 and 1 rows
    ("fp32", (37, 0, 5, 1), 3, 4, 2, None, 6, "per_group", False),        # S > shortest
    ("fp32", (20, 3), 2, 2, 1, 8, 3, "per_query_head", False),            # P = 8 divides neither length
    ("fp32", (16, 8, 0), 1, 2, 2, 8, 2, "per_group", False),              # P divides all
    ("fp32", (9, 0, 1), 3, 4, 2, None, 2, "per_group", True),             # append, contiguous
    ("fp32", (9, 0, 14), 2, 2, 1, 4, 3, "per_query_head", True),          # append across pages
    ("fp32", (6, 6), 3, 2, 2, 3, 1, "per_query_head", True),              # append, P = 3, S = 1
    ("fp16", (30, 2, 0), 2, 4, 1, 7, 4, "per_group", True),               # fp16 MQA paged append
    ("fp16", (25, 1), 1, 2, 2, None, 5, "per_query_head", False),         # fp16 split
    ("fp32", (0, 0), 1, 2, 2, None, 1, "per_query_head", False),          # nothing to see
    ("bf16", (7, 0, 2), 2, 4, 2, 4, 3, "per_group", True),                # bf16 paged append
    ("bf16", (7, 0, 2), 2, 4, 2, None, 3, "per_query_head", True),        # bf16 copied back
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_ragged_outputs_and_counts(case):
    dtype, lens, N_q, H, Hk, page, S, kv_reads, append = case
    p, qkv, O, L, led, (kc, vc, table) = run_case(dtype, lens, N_q, H, Hk, page, S, kv_reads,
                                                  append)
    check(p, qkv, O, L, led, S, kv_reads)
    _, k, v = qkv
    if append:                         # the cache was written in place
        for b, n in enumerate(p.seqlens):
            if page:
                rows = [kc[table[b, c // page], c % page] for c in range(n)]
                got = np.stack(rows, axis=1) if rows else np.zeros((Hk, 0, p.d))
            else:
                got = kc[b, :, :n]
            assert np.array_equal(got, k[b, :, :n])


def test_not_causal_and_numpy_int_lengths():
    p, qkv, O, L, led, _ = run_case("fp32", (11, 1, 0), 3, 2, 2, 4, 2, "per_query_head",
                                    True, causal=False,
                                    host_lens=lambda x: np.asarray(x, dtype=np.int64))
    check(p, qkv, O, L, led, 2, "per_query_head", causal=False)


def test_int_cache_seqlens_with_append():
    # one int with an append: every sequence has that many rows before it
    import gpu
    p = DecodeProblem.ragged((5, 5), 16, heads=2, N_q=2, append=True, dtype="fp32")
    q, k, v = random_decode_inputs(p, seed=2)
    kn, vn = random_new_kv(p, seed=2)
    kc, vc = k.copy(), v.copy()
    O, led = gpu.decode(q, kc, vc, cache_seqlens=5, k=kn, v=vn, num_splits=2,
                        count_traffic=True)
    kk, vv = append_kv(p, k, v, kn, vn)
    assert led.problem == p and led.counts() == decode_closed_form("split_kv", p,
                                                                   num_splits=2).counts()
    assert rel_err(O, reference_decode(q, kk, vv, seqlens=p.seqlens)) <= 1e-5
    assert np.array_equal(kc, kk, equal_nan=True) and np.array_equal(vc, vv, equal_nan=True)


@pytest.mark.parametrize("append", [False, True])
def test_launcher_reads_device_lengths(append):
    # DecodeLauncher with the lengths as a device int32 array: the kernels read them on
    # the device (in the simulator, the lane-group layout of the GPU build)
    from numba import cuda
    from gpu._launch import filled
    from gpu.decode import DecodeLauncher
    lens = (13, 0, 6)
    p = DecodeProblem.ragged(lens, 16, heads=4, kv_heads=2, N_q=2, append=append,
                             page_size=4, dtype="fp32")
    q, k, v = random_decode_inputs(p, seed=7)
    kn, vn = random_new_kv(p, seed=7)
    kp, vp, table = paged_cache(p, k, v, seed=3)
    from numba import config
    # the simulator stands in for the lane groups with lanes_per_row; a GPU runs its own
    run = DecodeLauncher(p, 3, kv_reads="per_group", count=True,
                         lanes_per_row=4 if config.ENABLE_CUDASIM else None)
    o = filled(q.shape, q.dtype, np.nan)
    L = filled(q.shape[:3], np.float32, np.nan)
    opart, lpart = run.partials()
    ctr = run.new_counters()
    news = dict(k_new=cuda.to_device(kn), v_new=cuda.to_device(vn)) if append else {}
    run(cuda.to_device(q), cuda.to_device(kp), cuda.to_device(vp), cuda.to_device(table), o, L,
        opart, lpart, ctr, 1 / 4, cache_seqlens=cuda.to_device(np.array(lens, np.int32)),
        **news)
    kk, vv = append_kv(p, k, v, kn, vn) if append else (k, v)
    check(p, (q, kk, vv), o.copy_to_host(), L.copy_to_host(), run.ledger(ctr), 3, "per_group")


def test_bad_input():
    import gpu
    p = DecodeProblem.ragged((6, 2), 16, N_q=2, append=True, dtype="fp32")
    q, k, v = random_decode_inputs(p)          # caches of 8 rows
    kn, vn = random_new_kv(p)
    for kw, match in [
        (dict(cache_seqlens=[7, 2], k=kn, v=vn),
         r"cache_seqlens\[0\]=7 \+ N_q=2 new rows overflow the cache \(k_cache holds 8 rows\); "
         r"allowed: cache_seqlens\[b\] \+ N_q <= 8"),
        (dict(cache_seqlens=[6, -1]), r"cache_seqlens\[1\]=-1 is not allowed; allowed: 0\.\.8"),
        (dict(cache_seqlens=[6, 9]), r"cache_seqlens\[1\]=9 is not allowed; allowed: 0\.\.8"),
        (dict(cache_seqlens=[6, 2, 1]), r"cache_seqlens=\[6, 2, 1\] is not allowed; allowed: None"),
        (dict(cache_seqlens=[6.0, 2.0]), r"cache_seqlens=\[6\.0, 2\.0\] is not allowed"),
        (dict(cache_seqlens=0), r"cache_seqlens=0 is not allowed; allowed: 1\.\.8"),
        (dict(k=kn, v=vn), r"k, v \(the rows to append\) need cache_seqlens"),
        (dict(cache_seqlens=[6, 2], k=kn), r"v=None with k given"),
        (dict(cache_seqlens=[6, 2], k=kn[:, :, :1].copy(), v=vn[:, :, :1].copy()),
         r"k has shape \(2, 1, 1, 16\) .*allowed: \(2, 1, 2, 16\)"),
        (dict(cache_seqlens=[6, 2], k=kn.astype(np.float16), v=vn.astype(np.float16)),
         r"k has shape .* dtype float16"),
    ]:
        with pytest.raises(ValueError, match=match):
            gpu.decode(q, k, v, **kw)
    # paged: the capacity is the table's pages x page size
    pp = DecodeProblem.ragged((6, 2), 16, N_q=2, append=True, dtype="fp32", page_size=4)
    kp, vp, table = paged_cache(pp, *random_decode_inputs(pp)[1:])
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\]=7 \+ N_q=2 .*overflow.*"
                                         r"block_table's 2 pages x page_size 4"):
        gpu.decode(q, kp, vp, block_table=table, cache_seqlens=[7, 2], k=kn, v=vn)
    bad = table.copy()
    bad[1, 0] = 9
    with pytest.raises(ValueError, match=r"block_table holds page 9"):
        gpu.decode(q, kp, vp, block_table=bad, cache_seqlens=[6, 2], k=kn, v=vn)


# ---------------------------------------------------------------------------------------
# On a GPU: the hardware build
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("page, S, kv_reads, append", [
    (None, "auto", "per_query_head", False), (16, 5, "per_group", True),
    (256, "auto", "per_group", False), (None, 1, "per_group", True),
    (256, 9, "per_query_head", True)])
def test_hardware_ragged(dtype, d, page, S, kv_reads, append):
    # GQA 32 / 8, lengths from 0 to past 2 pages of 256, N_q = 1 and 4
    import gpu
    lens = (3001, 0, 1, 700, 513, 256)
    for N_q in (1, 4):
        p = DecodeProblem.ragged(lens, d, heads=32, kv_heads=8, N_q=N_q, append=append,
                                 page_size=page, dtype=dtype)
        q, k, v = random_decode_inputs(p, seed=d + N_q)
        kn, vn = random_new_kv(p, seed=d)
        kw = dict(num_splits=S, kv_reads=kv_reads, cache_seqlens=np.array(lens, np.int32),
                  return_stats=True, count_traffic=True)
        if append:
            kw.update(k=kn, v=vn)
        if page:
            kp, vp, table = paged_cache(p, k, v, seed=1)
            O, L, led = gpu.decode(q, kp, vp, block_table=table, **kw)
        else:
            O, L, led = gpu.decode(q, k.copy(), v.copy(), **kw)
        kk, vv = append_kv(p, k, v, kn, vn) if append else (k, v)
        ref, lse = reference_decode(q, kk, vv, seqlens=p.seqlens, return_lse=True)
        assert not np.isnan(O).any()
        assert rel_err(O, ref) <= (1e-5 if dtype == "fp32" else 1e-3)
        none = np.isneginf(lse)
        assert np.array_equal(np.isneginf(L), none)
        np.testing.assert_allclose(L[~none], lse[~none], rtol=0,
                                   atol=1e-4 * (1 + np.abs(lse[~none]).max()))
        cf = decode_closed_form(led.algorithm, p, num_splits=led.num_splits, kv_reads=kv_reads)
        assert led.counts() == cf.counts()


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 16])
def test_hardware_torch_device_lengths(page):
    # torch tensors in and out, cache_seqlens a torch int32 tensor on the GPU, an append:
    # the cache is written in place on the device; counts and outputs as with NumPy
    torch = pytest.importorskip("torch")
    import gpu
    lens = (1000, 0, 1, 77)
    p = DecodeProblem.ragged(lens, 128, heads=32, kv_heads=8, N_q=2, append=True,
                             page_size=page, dtype="fp16")
    q, k, v = random_decode_inputs(p, seed=3)
    kn, vn = random_new_kv(p, seed=3)
    if page:
        kc, vc, table = paged_cache(p, k, v, seed=2)
    else:
        kc, vc, table = k, v, None
    dev = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()   # noqa: E731
    tk, tv = dev(kc), dev(vc)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    O, L, led = gpu.decode(dev(q), tk, tv, block_table=None if table is None else dev(table),
                           cache_seqlens=seq, k=dev(kn), v=dev(vn), kv_reads="per_group",
                           return_stats=True, count_traffic=True)
    assert isinstance(O, torch.Tensor) and O.is_cuda
    assert seq.tolist() == list(lens)                  # the caller's lengths untouched
    kk, vv = append_kv(p, k, v, kn, vn)
    ref, lse = reference_decode(q, kk, vv, seqlens=p.seqlens, return_lse=True)
    assert rel_err(O.float().cpu().numpy(), ref) <= 1e-3
    cf = decode_closed_form(led.algorithm, p, num_splits=led.num_splits, kv_reads="per_group")
    assert led.counts() == cf.counts()
    got = tk.cpu().numpy()
    for b, n in enumerate(p.seqlens):                  # the appended rows, on the device
        for c in range(lens[b], n):
            row = got[table[b, c // page], c % page] if page else got[b, :, c]
            assert np.array_equal(row, kk[b, :, c])
    # a numba device array works the same
    from numba import cuda
    O2 = gpu.decode(dev(q), dev(kc), dev(vc), block_table=None if table is None else dev(table),
                    cache_seqlens=cuda.to_device(np.array(lens, np.int32)), k=dev(kn),
                    v=dev(vn), kv_reads="per_group")
    assert rel_err(O2.float().cpu().numpy(), ref) <= 1e-3


@st.composite
def api_cases(draw):
    batch = draw(st.integers(1, 3))
    lens = tuple(draw(st.lists(st.integers(0, 24), min_size=batch, max_size=batch)))
    heads, kv = draw(st.sampled_from([(1, 1), (2, 1), (2, 2)]))
    return (draw(st.sampled_from(["fp32", "fp16"])), lens, draw(st.integers(1, 3)), heads, kv,
            draw(st.one_of(st.none(), st.integers(1, 9))), draw(st.integers(1, 5)),
            draw(st.sampled_from(["per_query_head", "per_group"])), draw(st.booleans()))


@settings(max_examples=20, deadline=None)
@given(api_cases())
def test_api_property(case):
    # any ragged batch (lengths 0..24, 1..3 new rows, paged or not, appending or not,
    # S up to past the shortest sequence): the kernels count the closed form and match
    # float64 per sequence
    dtype, lens, N_q, H, Hk, page, S, kv_reads, append = case
    p, qkv, O, L, led, _ = run_case(dtype, lens, N_q, H, Hk, page, S, kv_reads, append, d=8,
                                    seed=len(lens))
    check(p, qkv, O, L, led, S, kv_reads)
