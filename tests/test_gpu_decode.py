"""gpu.decode (gpu/decode): outputs against dense float64, the kernels' own counts against
iosim.decode's closed form, poisoned outputs, bad input. Runs in Numba's CUDA simulator
at tiny sizes (there: one thread per key row, LPR = 1); the `gpu` test runs the hardware
layout (lane groups, warp shuffles, 16-byte loads) at a moderate size."""
import numpy as np
import pytest
from numba import config as numba_config

import iosim
from iosim.decode import (DecodeProblem, choose_num_splits, decode_closed_form, paged_cache,
                          random_decode_inputs, reference_decode)

SIM = numba_config.ENABLE_CUDASIM    # conftest settles it before this import


def rel_err(x, ref):
    ref = np.asarray(ref, dtype=np.float64)
    return np.linalg.norm(np.asarray(x, dtype=np.float64) - ref) / np.linalg.norm(ref)


def numpy_fp16_attention(q, k, v, causal=True):
    """Decoding attention computed by NumPy in float16 arithmetic throughout (scores,
    exp, sums, P V): the error a plain fp16 implementation makes, the yardstick for the
    kernels' fp16 tolerance."""
    H, G = q.shape[1], k.shape[1]
    k, v = np.repeat(k, H // G, axis=1), np.repeat(v, H // G, axis=1)
    N_q, N_kv, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q @ np.swapaxes(k, -1, -2)) * np.float16(1 / np.sqrt(d))
    if causal:
        s = np.where(iosim.decode.decode_mask(N_q, N_kv), s, np.float16(-np.inf))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True, dtype=np.float16)) @ v


def run_case(dtype, N_kv, N_q, heads, kv_heads, page, S, kv_reads, causal=True, batch=1,
             d=16, seed=0, qscale=1.0, main="auto"):
    import gpu
    p = DecodeProblem(N_kv=N_kv, d=d, batch=batch, heads=heads, kv_heads=kv_heads, N_q=N_q,
                      dtype=dtype, page_size=page)
    q, k, v = random_decode_inputs(p, seed=seed, scale=qscale)
    kw = dict(num_splits=S, kv_reads=kv_reads, causal=causal, return_stats=True,
              count_traffic=True, main=main)
    if page:
        for ps in range(seed + 1, seed + 50):   # a shuffled table: not the identity
            kp, vp, table = paged_cache(p, k, v, seed=ps)
            if not np.array_equal(table.ravel(), np.arange(table.size)):
                break
        assert sorted(table.ravel()) == list(range(table.size))
        assert not np.array_equal(table.ravel(), np.arange(table.size))
        O, L, led = gpu.decode(q, kp, vp, block_table=table, cache_seqlens=N_kv, **kw)
    else:
        O, L, led = gpu.decode(q, k, v, **kw)
    return p, (q, k, v), O, L, led


def reference(q, k, v, causal):
    if causal:
        return reference_decode(q, k, v, return_lse=True)
    # non-causal: every new row sees the whole cache = each row alone with N_q = 1
    outs = [reference_decode(q[:, :, r:r + 1], k, v, return_lse=True) for r in range(q.shape[2])]
    return np.concatenate([o for o, _ in outs], axis=2), np.concatenate([l for _, l in outs], axis=2)


# (dtype, N_kv, N_q, heads, kv_heads, page_size, num_splits, kv_reads, causal)
CASES = [
    ("fp32", 37, 1, 2, 2, None, 1, "per_query_head", True),     # fa2_decode, MHA
    ("fp32", 37, 3, 4, 2, None, 2, "per_group", True),          # split_kv, GQA one K/V read
    ("fp32", 100, 3, 2, 1, None, 5, "per_query_head", True),    # GQA, each head reads K/V
    ("fp32", 37, 3, 4, 2, 16, 5, "per_group", True),            # 3 ragged pages < 5 splits
    ("fp32", 37, 3, 2, 2, 8, 1, "per_query_head", True),        # paged fa2_decode
    ("fp32", 100, 2, 2, 2, 40, 2, "per_query_head", True),      # pages of 2 tiles, odd first page
    ("fp16", 100, 1, 2, 2, 32, 5, "per_query_head", True),      # fp16 paged, 4 pages < 5
    ("fp16", 37, 3, 4, 1, None, 1, "per_group", True),          # fp16 MQA, one block
    ("fp32", 37, 3, 2, 2, None, 2, "per_query_head", False),    # not causal
    # many splits into the combine: S = 17, S = 11 paged (13 pages of 16), S = 8
    ("fp32", 300, 2, 2, 2, None, 17, "per_query_head", True),
    ("fp16", 200, 1, 4, 2, 16, 11, "per_group", True),
    ("fp32", 64, 1, 2, 1, None, 8, "per_group", True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("main", ["flat", "tiled"])
def test_outputs_and_counts(case, main):
    dtype, N_kv, N_q, H, Hk, page, S, kv_reads, causal = case
    if main == "flat" and not SIM:
        # the hardware layout covers fewer row counts than the simulator's (NR x VW caps)
        from iosim.launch.decode import main_kernel
        p = DecodeProblem(N_kv=N_kv, d=16, heads=H, kv_heads=Hk, N_q=N_q, dtype=dtype,
                          page_size=page)
        if main_kernel(p, kv_reads) != "flat":
            pytest.skip(f"the GPU flat kernel does not run this case's rows a block ({dtype})")
    p, (q, k, v), O, L, led = run_case(dtype, N_kv, N_q, H, Hk, page, S, kv_reads, causal,
                                       main=main)
    ref, lse = reference(q, k, v, causal)
    # O and L came back NaN-poisoned from the API: any unwritten element would be NaN
    assert O.dtype == p.np_dtype and O.shape == q.shape and L.dtype == np.float32
    assert not np.isnan(O).any() and not np.isnan(L).any()
    if dtype == "fp32":   # float32 arithmetic, partials and combine in float32
        assert rel_err(O, ref) <= 1e-5
    else:                 # O rounded to fp16 once: no worse than NumPy's fp16 attention
        yard = rel_err(numpy_fp16_attention(q, k, v, causal), ref)
        assert rel_err(O, ref) <= max(yard, 2.0 ** -11), (rel_err(O, ref), yard)
    np.testing.assert_allclose(L, lse, rtol=0, atol=1e-5 * (1 + np.abs(lse).max()))
    schedule = "split_kv" if S > 1 else "fa2_decode"
    cf = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads)
    assert led.algorithm == schedule and led.num_splits == S and led.kv_reads == kv_reads
    assert led.counts() == cf.counts()          # every tensor, reads and writes, exact
    assert led.hbm_bytes == cf.hbm_bytes
    assert ("block_table" in led.reads) == bool(page)


def test_counts_equal_the_executed_schedule():
    # the model run for real (iosim.execute_decode) counts what the kernels count
    p, _, _, _, led = run_case("fp32", 37, 2, 4, 2, 8, 5, "per_group", seed=4)
    ex = iosim.execute_decode("split_kv", p, num_splits=5, kv_reads="per_group")
    assert led.counts() == ex.ledger.counts()


def test_huge_logits():
    # scores of order 1e3-1e4: exp would overflow without the running max
    p, (q, k, v), O, L, _ = run_case("fp32", 100, 3, 2, 2, None, 5, "per_query_head",
                                     qscale=30.0, seed=2)
    ref, lse = reference_decode(q, k, v, return_lse=True)
    assert np.abs(lse).max() > 500 and np.isfinite(O).all()
    assert rel_err(O, ref) <= 1e-5
    np.testing.assert_allclose(L, lse, rtol=1e-6)


def test_nan_in_a_cache_row_reaches_only_the_rows_that_see_it():
    import gpu
    p = DecodeProblem(N_kv=37, d=16, N_q=2, dtype="fp32")
    q, k, v = random_decode_inputs(p, seed=5)
    k[0, 0, 36] = np.nan                 # only new row 1 (the last) sees cache row 36
    for S in (2, 10):
        O, L = gpu.decode(q, k, v, num_splits=S, return_stats=True)
        # (a NaN in V would reach row 0 too, 0 x NaN in P V, as in iosim.execute_decode)
        assert np.isnan(O[0, 0, 1]).all() and not np.isnan(O[0, 0, 0]).any()
        assert np.isnan(L[0, 0, 1]) and np.isfinite(L[0, 0, 0])


def test_poison_shows_unwritten_elements(monkeypatch):
    # skip the combine kernel: O must come back NaN (poisoned), not zeros or stale data
    import gpu
    from gpu.decode import api
    launches = []
    real = api.launch

    def first_only(kern, *a):
        launches.append(kern)
        if len(launches) == 1:
            real(kern, *a)
    monkeypatch.setattr(api, "launch", first_only)
    p = DecodeProblem(N_kv=37, d=16, dtype="fp32")
    q, k, v = random_decode_inputs(p)
    O, L = gpu.decode(q, k, v, num_splits=2, return_stats=True)
    assert len(launches) == 2 and np.isnan(O).all() and np.isnan(L).all()


def test_auto_num_splits_is_the_rule():
    import gpu
    from gpu.decode import api
    p = DecodeProblem(N_kv=300, d=16, heads=2, N_q=1, dtype="fp32")
    want = choose_num_splits(p, iosim.get_hardware("H100-SXM").sm_count,
                             api._geometry.ctas_per_sm(p, "per_query_head", "flat"))
    assert api.main_kernel(p, "per_query_head") == "flat"        # the simulator's default
    assert api.auto_num_splits(p, "per_query_head", "flat").num_splits == want.num_splits == 2
    q, k, v = random_decode_inputs(p, seed=1)
    _, led = gpu.decode(q, k, v, count_traffic=True)          # num_splits="auto"
    assert led.num_splits == want.num_splits and led.algorithm == "split_kv"


def test_cache_longer_than_seqlen_reads_only_n_kv_rows():
    import gpu
    p = DecodeProblem(N_kv=30, d=16, N_q=2, dtype="fp32")
    q, k, v = random_decode_inputs(p, seed=3)
    big = [np.concatenate([x, np.full((1, 1, 20, 16), np.nan, np.float32)], axis=2)
           for x in (k, v)]
    O, led = gpu.decode(q, *big, cache_seqlens=30, num_splits=1, count_traffic=True)
    assert rel_err(O, reference_decode(q, k, v)) <= 1e-5
    assert led.counts() == decode_closed_form("fa2_decode", p).counts()


def _inputs(**kw):
    p = DecodeProblem(**{**dict(N_kv=20, d=16, heads=2, dtype="fp32"), **kw})
    return random_decode_inputs(p)


@pytest.mark.parametrize("call, match", [
    (lambda q, k, v, g: g.decode(q.astype(np.int32), k, v), r"q has dtype int32; allowed: float16, float32"),
    (lambda q, k, v, g: g.decode(q, k.astype(np.float16), v), r"dtypes are float32, float16"),
    (lambda q, k, v, g: g.decode(q[0], k, v), r"q has shape \(2, 1, 16\) \(ndim=3\)"),
    (lambda q, k, v, g: g.decode(q, np.ascontiguousarray(k[..., :8]), np.ascontiguousarray(v[..., :8])), r"head dim 8.*d=16"),
    (lambda q, k, v, g: g.decode(q, k, v, num_splits=0), r"num_splits=0"),
    (lambda q, k, v, g: g.decode(q, k, v, num_splits="max"), r"num_splits=.max.*allowed: .auto."),
    (lambda q, k, v, g: g.decode(q, k, v, num_splits=15), r"num_splits=15 .*N_kv=20.*empty"),
    (lambda q, k, v, g: g.decode(q, k, v, kv_reads="per_head"), r"kv_reads='per_head'.*per_query_head, per_group"),
    (lambda q, k, v, g: g.decode(q, k, v, scale=float("inf")), r"scale=inf"),
    (lambda q, k, v, g: g.decode(q, k, v, cache_seqlens=21), r"cache_seqlens=21 .*1\.\.20"),
    (lambda q, k, v, g: g.decode(np.concatenate([q] * 2), np.concatenate([k] * 2),
                                 np.concatenate([v] * 2), cache_seqlens=[20, 21]),
     r"cache_seqlens\[1\]=21 is not allowed; allowed: 0\.\.20"),
    (lambda q, k, v, g: g.decode(np.zeros((1, 2, 17, 16), np.float32), k, v), r"N_q=17"),
    (lambda q, k, v, g: g.decode(q, k, v, causal=None), r"causal=None"),
    (lambda q, k, v, g: g.decode(q, k, np.ascontiguousarray(v[:, :, :10])), r"v_cache has shape"),
    (lambda q, k, v, g: g.decode(q, k[:, :, :, :].transpose(0, 1, 3, 2), v),
     r"k_cache must be C-contiguous|k_cache has head dim"),
])
def test_bad_input(call, match):
    import gpu
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=match):
        call(q, k, v, gpu)


def test_bad_paged_input():
    import gpu
    p = DecodeProblem(N_kv=20, d=16, dtype="fp32", page_size=8)
    q, k, v = random_decode_inputs(p)
    kp, vp, table = paged_cache(p, k, v)
    with pytest.raises(ValueError, match=r"block_table holds page 7; allowed: 0\.\.2"):
        gpu.decode(q, kp, vp, block_table=table + 5, cache_seqlens=20)
    with pytest.raises(ValueError, match=r"block_table has shape \(1, 3\) and dtype int64"):
        gpu.decode(q, kp, vp, block_table=table.astype(np.int64))
    with pytest.raises(ValueError, match=r"cache_seqlens=25 .*1\.\.24"):
        gpu.decode(q, kp, vp, block_table=table, cache_seqlens=25)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, page, S, kv_reads, N_q", [
    ("fp16", None, "auto", "per_query_head", 1), ("fp16", 256, 3, "per_group", 4),
    ("fp32", None, 1, "per_group", 2), ("fp32", 256, "auto", "per_query_head", 1)])
def test_hardware_layout(dtype, page, S, kv_reads, N_q):
    # the GPU build: lane groups with warp shuffles and 16-byte loads
    for d in (64, 128):
        p, (q, k, v), O, L, led = run_case(dtype, 3001, N_q, 8, 2, page, S, kv_reads, d=d,
                                           batch=2, seed=d)
        ref, lse = reference_decode(q, k, v, return_lse=True)
        assert rel_err(O, ref) <= (1e-5 if dtype == "fp32" else 1e-3)
        np.testing.assert_allclose(L, lse, rtol=0, atol=1e-4 * (1 + np.abs(lse).max()))
        cf = decode_closed_form(led.algorithm, p, num_splits=led.num_splits, kv_reads=kv_reads)
        assert led.counts() == cf.counts()


@pytest.mark.skipif(not SIM, reason="lanes_per_row is the simulator's stand-in for the "
                    "hardware layout, which test_hardware_layout runs on a GPU")
@pytest.mark.parametrize("lpr, dtype, N_kv, page, S, kv_reads", [
    (4, "fp32", 37, None, 2, "per_group"),        # TB = 8 rows a tile
    (8, "fp16", 24, 8, 3, "per_query_head")])     # TB = 4: two tiles a page; split 1 from page 1
def test_gpu_lane_layout_in_the_simulator(lpr, dtype, N_kv, page, S, kv_reads):
    # the GPU build's layout (LPR lanes a key row, VW = d / LPR elements a lane, KPG rows a
    # group), its group sums through shared memory where the GPU uses warp shuffles
    from numba import cuda
    from gpu._launch import filled
    from gpu.decode import DecodeLauncher
    p = DecodeProblem(N_kv=N_kv, d=16, heads=4, kv_heads=2, N_q=3, dtype=dtype, page_size=page)
    q, k, v = random_decode_inputs(p, seed=lpr)
    run = DecodeLauncher(p, S, kv_reads=kv_reads, count=True, lanes_per_row=lpr)
    assert run.plan["LPR"] == lpr and run.plan["VW"] == 16 // lpr and run.plan["red"]
    tab = None
    if page:
        kp, vp, table = paged_cache(p, k, v, seed=2)
        k, v, tab = kp, vp, cuda.to_device(table)
    o = filled(q.shape, q.dtype, np.nan)
    L = filled(q.shape[:3], np.float32, np.nan)
    opart, lpart = run.partials()
    ctr = run.new_counters()
    run(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), tab, o, L, opart, lpart, ctr,
        1 / 4)
    qq, kk, vv = random_decode_inputs(p, seed=lpr)
    ref, lse = reference_decode(qq, kk, vv, return_lse=True)
    O = o.copy_to_host()
    assert not np.isnan(O).any()
    assert rel_err(O, ref) <= (1e-5 if dtype == "fp32" else 2.0 ** -11)
    np.testing.assert_allclose(L.copy_to_host(), lse, rtol=0, atol=1e-5 * (1 + np.abs(lse).max()))
    assert run.ledger(ctr).counts() == decode_closed_form(run.schedule, p, num_splits=S,
                                                          kv_reads=kv_reads).counts()


def test_decode_bench_without_a_gpu(tmp_path, monkeypatch):
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "analysis.cli", "bench", "--help"], cwd=root,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--decode" in r.stdout and "--budget-s" in r.stdout
    from analysis import bench_decode as D
    # K and V once + Q + O (fp16) + L (float32) + the block table
    assert D.dram_bytes(2, 32, 8, 1, 1000, 128, 2, 256) == (2 * 2 * 8 * 1000 * 128 * 2
                                                           + 2 * 2 * 32 * 128 * 2 + 4 * 2 * 32
                                                           + 4 * 2 * 4)
    # part (a) in the simulator at a tiny size: rows written as they are made, counts exact
    monkeypatch.setattr(D, "CHECKS", (("fp16", 1, 4, 2, 37, 16, 2, 8, "auto", "per_group"),))
    out = tmp_path / "rows.jsonl"
    w = D.Writer(str(out), dict(run_id="t", device="sim", date="2026-11-25", commit=None,
                                versions={}))
    assert D.run_checks(w, quick=False)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["kind"] == "decode_check" and rows[0]["counts_exact"]
    assert rows[0]["status"] == "ok"
