"""N_q != N_k and local windows (issue 18 items 1, 2, 7): model, command line, kernels.

Convention (iosim.problem.band_of; flash-attn >= 2.1, PyTorch causal_lower_right): with
o = N_k - N_q, query row r sees key c iff lo <= c - r <= hi, causal hi = o, window
(left, right) lo = o - left, hi = o + right (-1 unbounded). A row that sees no key gets
O = 0, L = -inf; a tile with no visible pair is skipped and costs nothing.

Model: executed schedules (forward and backward) equal their closed forms for a grid and
a property test over (N_q, N_k, causal, window, block mask, B_r, B_c), including
N_q > N_k, rows that see no key and windows smaller than a tile; the closed form's band
sums equal sums over the active-tile matrix; the default problem (N_k = N, no window)
keeps its old predictions. Kernels (Numba simulator, tiny sizes): outputs (poisoned with
NaN before the call by gpu.attention) against float64, and the kernels' own counts equal
to the closed form exactly, for every CUDA-core kernel; fa2_tc (tensor cores) runs on a
GPU only (`pytest -m gpu tests/test_variants.py`).
"""
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from iosim import Problem, Tiling
from iosim.backward import backward_closed_form, execute_backward, reference_attention_backward
from iosim.closed_form import band_sums, band_sums_by_block, problem_sums

ALGS = ("standard", "fa1", "fa2")
#: (N_q, N_k) pairs: N_q < N_k, N_q > N_k (rows that see no key under causal), equal,
#: one key block, one query row
SHAPES = [(7, 13), (13, 7), (16, 3), (5, 20), (9, 9), (1, 11), (11, 1)]
WINDOWS = [(-1, -1), (0, 0), (2, -1), (-1, 1), (3, 0), (1, 2), (40, 40)]
TILINGS = [(4, 4), (3, 5), (8, 2)]


def _brute_sums(p, t):
    """(n_A, RA, CA, RCA) straight from the active-tile matrix."""
    A = iosim.active_tiles(p, t)
    rows = np.minimum(t.B_r, p.N - np.arange(t.T_r(p.N)) * t.B_r)
    cols = np.minimum(t.B_c, p.N_k - np.arange(t.T_c(p.N_k)) * t.B_c)
    return int(A.sum()), int(rows @ A.sum(1)), int(A.sum(0) @ cols), int(rows @ A @ cols)


def _cases():
    for N, Nk in SHAPES:
        for causal in (False, True):
            for w in WINDOWS:
                if causal and w[1] > 0:
                    continue
                yield N, Nk, causal, w


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------
def test_problem_names_units_and_validation():
    p = Problem(N=8, d=4, N_k=12, causal=True, window=(3, -1))
    assert (p.N_q, p.N_k, p.band) == (8, 12, (4 - 3, 4))      # o = 4
    assert Problem(N=8, d=4).N_k == 8 and Problem(N=8, d=4).window == (-1, -1)
    assert Problem(N=8, d=4, causal=True, window=(2, 0)).band == (-2, 0)
    for kw, words in [(dict(causal=True, window=(2, 3)), ("causal=True", "(2, 3)")),
                      (dict(window=(-2, 0)), ("left=-2", "-1")),
                      (dict(window=(1, 1.5)), ("right=1.5",)),
                      (dict(window=7), ("window=7", "(left, right)")),
                      (dict(N_k=0), ("N_k=0",))]:
        with pytest.raises(iosim.ConfigError) as e:
            Problem(N=8, d=4, **kw)
        assert all(w in str(e.value) for w in words), str(e.value)


def test_element_mask_is_bottom_right_aligned():
    """causal = np.tril(ones, N_k - N_q) (PyTorch's causal_lower_right); a window is the
    band between two such diagonals; for N_q <= 16 causal equals the decode model's mask."""
    for N, Nk in SHAPES:
        ones = np.ones((N, Nk), dtype=bool)
        o = Nk - N
        assert np.array_equal(iosim.element_mask(N, True, N_k=Nk), np.tril(ones, o))
        assert np.array_equal(iosim.element_mask(N, False, N_k=Nk, window=(2, 1)),
                              np.tril(ones, o + 1) & np.triu(ones, o - 2))
        if N <= min(16, Nk):
            from iosim.decode import decode_mask
            assert np.array_equal(iosim.element_mask(N, True, N_k=Nk), decode_mask(N, Nk))


def test_forward_with_few_queries_equals_the_decode_model():
    """N_q <= B_r new rows against N_k keys, causal: the fa2 forward ledger is the decode
    model's fa2_decode ledger (iosim.decode, the same bottom-right alignment)."""
    for nq, nk in [(1, 4096), (4, 1000), (16, 333)]:
        p = Problem(N=nq, d=64, N_k=nk, heads=8, kv_heads=2, dtype="fp16", causal=True)
        f = iosim.closed_form("fa2", p, Tiling(64, 64))
        dl = iosim.decode_closed_form("fa2_decode", iosim.DecodeProblem(
            N_kv=nk, d=64, heads=8, kv_heads=2, N_q=nq))
        assert (f.reads, f.writes) == (dl.reads, dl.writes)


def test_band_sums_equal_the_active_tile_matrix():
    """The closed form's floor sums (band_sums) and its per-query-block runs
    (band_sums_by_block) = sums over active_tiles, and
    the old floor-sum path agrees with band_sums where both apply (N_k = N)."""
    for N, Nk, causal, w in _cases():
        for B_r, B_c in TILINGS + [(1, 1), (16, 16)]:
            p, t = Problem(N=N, d=2, N_k=Nk, causal=causal, window=w), Tiling(B_r, B_c)
            assert band_sums(N, Nk, B_r, B_c, p.band) == _brute_sums(p, t), (N, Nk, causal, w)
            assert band_sums_by_block(N, Nk, B_r, B_c, p.band) == _brute_sums(p, t)
            assert problem_sums(p, t) == _brute_sums(p, t)
            if Nk == N and w == (-1, -1):
                old = tuple(int(x) for x in iosim.tile_sums(N, B_r, B_c, causal))
                assert old == band_sums(N, N, B_r, B_c, p.band)


def test_default_problem_keeps_its_predictions():
    """N_k = N and window = (-1, -1) given explicitly change nothing (same closed forms,
    forward and backward, as the problem without them)."""
    for N, B, causal in [(1000, 64, False), (1000, 64, True), (4097, 128, True), (77, 13, False)]:
        t = Tiling(B, B // 2 + 1)
        a = Problem(N=N, d=64, heads=4, kv_heads=2, causal=causal)
        b = Problem(N=N, d=64, heads=4, kv_heads=2, causal=causal, N_k=N, window=(-1, -1))
        for alg in ALGS:
            assert iosim.closed_form(alg, a, t).counts() == iosim.closed_form(alg, b, t).counts()
            assert backward_closed_form(alg, a, t).counts() == \
                backward_closed_form(alg, b, t).counts()


def test_executed_equals_closed_form_grid():
    """Forward and backward schedules executed through the counting memory = closed
    form; outputs and gradients = float64; rows that see no key: O = 0, L = -inf."""
    rng = np.random.default_rng(0)
    n = 0
    for N, Nk, causal, w in _cases():
        B_r, B_c = TILINGS[n % len(TILINGS)]
        n += 1
        t = Tiling(B_r, B_c)
        mask = None
        if n % 3 == 0:   # a random block mask on every third case
            mask = rng.random((t.T_r(N), t.T_c(Nk))) < 0.6
        p = Problem(N=N, d=4, N_k=Nk, causal=causal, window=w, heads=2, kv_heads=1,
                    block_mask=mask)
        q, k, v = iosim.random_inputs(p, n)
        ref, lse = iosim.reference_attention(q, k, v, causal=causal, window=w, block_mask=mask,
                                             B_r=B_r, B_c=B_c, return_lse=True)
        do = np.random.default_rng(n).standard_normal(q.shape).astype(np.float32)
        grads = reference_attention_backward(q, k, v, do, causal=causal, window=w,
                                             block_mask=mask, B_r=B_r, B_c=B_c)
        alg = ALGS[n % 3]
        ex = iosim.execute(alg, p, t, q, k, v)
        assert ex.ledger.counts() == iosim.closed_form(alg, p, t).counts(), (alg, N, Nk, w)
        np.testing.assert_allclose(ex.O, ref, atol=1e-5)
        if alg == "fa2":
            L = ex.stats["L"]
            assert np.array_equal(np.isneginf(L), np.isneginf(lse))
            np.testing.assert_allclose(L[np.isfinite(lse)], lse[np.isfinite(lse)], atol=1e-5)
        none = ~iosim.element_mask(N, causal, mask, B_r, B_c, N_k=Nk, window=w).any(1)
        assert (ex.O[..., none, :] == 0).all()
        b = execute_backward(alg, p, t, q, k, v, do)
        assert b.ledger.counts() == backward_closed_form(alg, p, t).counts(), (alg, N, Nk, w)
        for got, want in zip((b.dq, b.dk, b.dv), grads):
            np.testing.assert_allclose(got, want, atol=1e-4)


def test_rows_that_see_no_key_and_windows_smaller_than_a_tile():
    # causal, N_q > N_k: rows 0 .. N_q - N_k - 1 see nothing; the first query block none
    p, t = Problem(N=24, d=4, N_k=6, causal=True), Tiling(8, 4)
    A = iosim.active_tiles(p, t)
    assert not A[:2].any() and A[2].any()        # o = -18: rows 18..23 see keys
    ex = iosim.execute("fa2", p, t)
    assert (ex.O[0, 0, :18] == 0).all() and np.isneginf(ex.stats["L"][0, 0, :18]).all()
    assert np.isfinite(ex.stats["L"][0, 0, 18:]).all()
    # a window of 3 keys inside 16 x 16 tiles: only the diagonal band of tiles is active
    p, t = Problem(N=64, d=4, window=(1, 1)), Tiling(16, 16)
    A = iosim.active_tiles(p, t)
    assert np.array_equal(A, np.eye(4, dtype=bool) | np.eye(4, k=1, dtype=bool)
                          | np.eye(4, k=-1, dtype=bool))
    assert iosim.execute("fa2", p, t).ledger.counts() == iosim.closed_form("fa2", p, t).counts()
    # a query block whose window lies past the keys: inactive, O = 0
    p, t = Problem(N=32, d=4, N_k=4, window=(0, 0)), Tiling(8, 8)   # o = -28: rows 28..31
    assert iosim.active_tiles(p, t)[:, 0].tolist() == [False, False, False, True]


@st.composite
def variant_problems(draw):
    N, Nk = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    B_r, B_c = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    causal = draw(st.booleans())
    left = draw(st.integers(-1, 45))
    right = draw(st.integers(-1, 0 if causal else 45))
    mask = None
    if draw(st.booleans()):
        T_r, T_c = -(-N // B_r), -(-Nk // B_c)
        bits = draw(st.lists(st.booleans(), min_size=T_r * T_c, max_size=T_r * T_c))
        mask = np.array(bits, dtype=bool).reshape(T_r, T_c)
    p = Problem(N=N, d=draw(st.sampled_from([1, 3, 8])), N_k=Nk, causal=causal,
                window=(left, right), heads=2, kv_heads=draw(st.sampled_from([1, 2])),
                dtype=draw(st.sampled_from(["fp32", "fp16"])), block_mask=mask)
    return p, Tiling(B_r, B_c), draw(st.sampled_from(ALGS)), draw(st.integers(0, 10**6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant_problems())
def test_property_executed_equals_closed_form(case):
    p, t, alg, seed = case
    q, k, v = iosim.random_inputs(p, seed)
    assert iosim.execute(alg, p, t, q, k, v).ledger.counts() == \
        iosim.closed_form(alg, p, t).counts()
    assert execute_backward(alg, p, t, q, k, v).ledger.counts() == \
        backward_closed_form(alg, p, t).counts()
    assert _brute_sums(p, t) == problem_sums(p, t)


def test_vectorised_closed_forms_take_N_k_and_window():
    N = np.array([100, 257, 1000])
    Nk = np.array([300, 64, 1000])
    for alg in ALGS:
        for causal, w in [(False, (-1, -1)), (True, (-1, -1)), (True, (50, 0)), (False, (7, 9))]:
            arr = iosim.closed_form_arrays(alg, N, 32, 32, 16, causal=causal, itemsize=2,
                                           instances=3, N_k=Nk, window=w)
            bwd = iosim.backward_closed_form_arrays(alg, N, 32, 32, 16, causal=causal,
                                                    itemsize=2, heads=4, kv_heads=2, N_k=Nk,
                                                    window=w)
            for x, (n, nk) in enumerate(zip(N, Nk)):
                p = Problem(N=int(n), d=32, heads=3, dtype="fp16", causal=causal, N_k=int(nk),
                            window=w)
                assert int(arr["hbm_bytes"][x]) == iosim.closed_form(alg, p, Tiling(32, 16)).hbm_bytes
                pb = Problem(N=int(n), d=32, heads=4, kv_heads=2, dtype="fp16", causal=causal,
                             N_k=int(nk), window=w)
                assert int(bwd["hbm_bytes"][x]) == \
                    backward_closed_form(alg, pb, Tiling(32, 16)).hbm_bytes


def test_window_traffic_is_linear_in_N():
    """fa2 K/V reads with a window of w keys: about N (w + B_r + B_c) d, not N^2 d: doubling
    N doubles them (up to the first blocks), and they grow with w."""
    t = Tiling(64, 64)
    kv = lambda N, w: iosim.closed_form("fa2", Problem(N=N, d=64, causal=True, window=(w, 0)),
                                        t).reads["K"]
    assert abs(kv(1 << 16, 512) / kv(1 << 15, 512) - 2) < 0.02
    assert kv(1 << 15, 256) < kv(1 << 15, 512) < kv(1 << 15, 1024)
    assert kv(1 << 15, 512) <= (1 << 15) * (512 + 64 + 64) * 64
    # huge N stays fast and exact (floor sums: no loop over tiles or query blocks)
    big = iosim.closed_form("fa2", Problem(N=10**8, d=128, causal=True, window=(4096, 0)),
                            Tiling(128, 64))
    assert big.reads["K"] == 128 * band_sums_by_block(10**8, 10**8, 128, 64, (-4096, 0))[2]
    huge = iosim.closed_form("fa2", Problem(N=10**15, N_k=3 * 10**15, d=128, window=(4096, 9)),
                             Tiling(128, 64))
    assert huge.reads["K"] > 0 and isinstance(huge.reads["K"], int)


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------
def test_cli_seq_len_kv_and_window_json(capsys):
    from analysis.cli import main
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "1000", "--seq-len-kv", "3000",
               "--head-dim", "64", "--causal", "--window", "256,0", "--block-rows", "64",
               "--block-cols", "32", "--json"])
    out = json.loads(capsys.readouterr().out)
    p = Problem(N=1000, d=64, N_k=3000, dtype="fp16", causal=True, window=(256, 0))
    led = iosim.closed_form("fa2", p, Tiling(64, 32))
    assert rc == 0 and out["hbm_bytes"] == led.hbm_bytes
    assert (out["seq_len"], out["seq_len_kv"], out["window"]) == (1000, 3000, [256, 0])
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "1000", "--head-dim", "64",
               "--block-rows", "64", "--block-cols", "32", "--json"])
    plain = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(plain) == set(out)          # the same keys
    assert (plain["seq_len_kv"], plain["window"]) == (1000, [-1, -1])


@pytest.mark.parametrize("argv, words", [
    (["--causal", "--window", "8,4"], ["causal=True", "(8, 4)"]),
    (["--window", "8"], ["--window", "LEFT,RIGHT"]),
    (["--window", "-3,0"], ["left=-3"]),
    (["--window", "-1,0", "--causal", "--seq-len-kv", "4", "--window", "2,1"],
     ["causal=True", "(2, 1)"]),
    # --levels models N_k != N and windows for the fa2 forward only (issue 39)
    (["--seq-len-kv", "512", "--levels", "--pass", "bwd"], ["--levels", "N_k=512", "fa2 bwd"]),
    (["--window", "8,0", "--levels", "--pass", "bwd"], ["--levels", "window=(8, 0)", "fa2 bwd"]),
    (["--seq-len-kv", "512", "--window", "8,0", "--decode"], ["--window=8,0", "--decode"]),
    (["--seq-len-kv", "0"], ["N_k=0"]),
])
def test_cli_impossible_combinations_name_both_values(argv, words, capsys):
    from analysis.cli import main
    try:
        rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "8", "--head-dim", "64",
                   "--block-rows", "16", "--block-cols", "16"] + argv)
    except SystemExit as e:    # argparse's own errors (exit 2, one line)
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and all(w in err[0] for w in words), err


# ---------------------------------------------------------------------------------------
# The kernels (simulator)
# ---------------------------------------------------------------------------------------
#: (N_q, N_k, causal, window, block mask?) at simulator sizes
KCASES = [(13, 21, True, (-1, -1), False), (21, 13, True, (-1, -1), False),
          (20, 20, False, (3, 2), False), (17, 9, True, (2, 0), True),
          (9, 17, False, (-1, 0), False), (12, 12, False, (0, 0), False),
          (10, 6, False, (-1, -1), True), (24, 5, False, (1, 1), False)]


def _check_kernel(alg, N, Nk, causal, w, with_mask, B_r=8, B_c=8, d=16, dtype="fp32",
                  seed=0, **kw):
    import gpu
    t = Tiling(B_r, B_c)
    mask = None
    if with_mask:
        mask = np.random.default_rng(seed).random((t.T_r(N), t.T_c(Nk))) < 0.7
    p = Problem(N=N, d=d, N_k=Nk, causal=causal, window=w, heads=2, kv_heads=1,
                dtype=dtype, block_mask=mask)
    q, k, v = iosim.random_inputs(p, seed)
    ref, lse = iosim.reference_attention(q, k, v, causal=causal, window=w, block_mask=mask,
                                         B_r=B_r, B_c=B_c, return_lse=True)
    stats = alg != "standard"
    out = gpu.attention(q, k, v, algorithm=alg, causal=causal, window=w, block_mask=mask,
                        block_rows=B_r, block_cols=B_c, count_traffic=True,
                        return_stats=stats, **kw)
    O, led = out[0], out[-1]
    assert led.counts() == iosim.closed_form(alg, p, t).counts(), (alg, N, Nk, causal, w)
    assert not np.isnan(O).any()                       # outputs were NaN-poisoned
    tol = 1e-5 if dtype == "fp32" else 2e-2
    np.testing.assert_allclose(O, ref, atol=tol * max(1.0, np.abs(ref).max()))
    if stats:
        L = out[1]
        assert np.array_equal(np.isneginf(L), np.isneginf(lse))
        fin = np.isfinite(lse)
        np.testing.assert_allclose(L[fin], lse[fin], atol=1e-4)


@pytest.mark.parametrize("case", KCASES)
def test_fa2_plain_kernel(case):
    _check_kernel("fa2", *case, kernel="plain")


@pytest.mark.parametrize("case", KCASES[:4] + KCASES[-1:])
def test_fa2_fast_kernel(case):
    _check_kernel("fa2", *case, kernel="fast")


@pytest.mark.parametrize("stage", [1, 2])
def test_fa2_fast_staged_loads(stage):
    """The staged K/V loads walk the same active tiles (next_tile with the band)."""
    from numba import cuda
    from gpu import _launch
    from gpu.forward import fa2_fast
    N, Nk, w = 19, 29, (5, 0)
    p = Problem(N=N, d=16, N_k=Nk, causal=True, window=w)
    q, k, v = iosim.random_inputs(p, 3)
    o3 = _launch.filled((1, N, 16), np.float32, np.nan)
    L2 = _launch.filled((1, N), np.float32, np.nan)
    ctr = _launch.new_counters(True)
    fa2_fast.run(cuda.to_device(q[0]), cuda.to_device(k[0]), cuda.to_device(v[0]), o3, L2,
                 0.25, N, 1, 1, None, ctr, B_r=8, B_c=8, dt="fp32", causal=True, count=True,
                 threads=16, stage=stage, N_k=Nk, window=w)
    led = _launch.counters_to_ledger(ctr, "fa2", p, Tiling(8, 8))
    assert led.counts() == iosim.closed_form("fa2", p, Tiling(8, 8)).counts()
    ref = iosim.reference_attention(q, k, v, causal=True, window=w, scale=0.25)
    np.testing.assert_allclose(o3.copy_to_host()[None], ref, atol=1e-5)


@pytest.mark.parametrize("case", KCASES[:3] + KCASES[5:7])
def test_fa1_kernel(case):
    _check_kernel("fa1", *case)


@pytest.mark.parametrize("case", [KCASES[1], KCASES[3], KCASES[-1]])
def test_standard_kernels(case):
    _check_kernel("standard", *case, B_r=8, B_c=8)


@pytest.mark.parametrize("N,Nk,causal,w", [(28, 51, True, (-1, -1)),    # (113, 203) / 4
                                           (27, 64, False, (16, -1)),    # (108, 256) / 4
                                           (32, 64, True, (8, 0)),       # (256, 512) / 8
                                           (64, 32, True, (-1, -1))])    # (512, 256) / 8
def test_flash_attn_shapes_scaled_down(N, Nk, causal, w):
    _check_kernel("fa2", N, Nk, causal, w, False, B_r=16, B_c=16, kernel="plain")
    _check_kernel("fa2", N, Nk, causal, w, False, B_r=16, B_c=16, dtype="fp16", kernel="fast")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 24), st.integers(1, 24), st.booleans(), st.integers(-1, 20),
       st.integers(-1, 20), st.sampled_from([(8, 8), (4, 8), (16, 4)]),
       st.sampled_from(["fa2", "fa1"]))
def test_property_kernel_counts_and_outputs(N, Nk, causal, left, right, tiles, alg):
    """Random shapes and windows through the plain kernels: counts = closed form, O and L
    = float64."""
    right = min(right, 0) if causal else right
    _check_kernel(alg, N, Nk, causal, (left, right), False, *tiles)


def test_kernel_refuses_a_bad_window():
    import gpu
    q, k, v = iosim.random_inputs(Problem(N=8, d=16, N_k=12), 0)
    with pytest.raises(ValueError, match=r"causal=True and window=\(4, 2\)"):
        gpu.attention(q, k, v, causal=True, window=(4, 2))
    with pytest.raises(ValueError, match="k has shape"):
        gpu.attention(q, k[..., :10, :], v, window=(4, 2))


# ---------------------------------------------------------------------------------------
# fa2_tc on a GPU: `python3 -m pytest -m gpu tests/test_variants.py`
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("N,Nk,causal,w,d,tiles", [
    (113, 203, True, (-1, -1), 64, (64, 64)),
    (108, 256, False, (32, 16), 64, (128, 64)),
    (256, 512, True, (64, 0), 128, (64, 64)),
    (512, 256, True, (-1, -1), 64, (64, 64)),        # rows 0..255 see no key
    (1000, 1000, False, (100, 100), 64, (128, 64)),
    (333, 77, False, (5, 5), 48, (32, 16)),          # windows smaller than a tile
    # head dims padded to 16 on chip (issue 18): d real columns loaded and stored
    (200, 333, True, (-1, -1), 40, (128, 64)),
    (333, 200, True, (-1, -1), 59, (128, 64)),
    (257, 300, False, (32, 16), 111, (64, 64)),
    (300, 257, True, (64, 0), 160, (128, 64)),
    (129, 200, False, (-1, -1), 192, (128, 64)),
    (256, 384, True, (-1, -1), 256, (128, 64))])
def test_fa2_tc_variants_on_gpu(N, Nk, causal, w, d, tiles):
    """Tensor-core kernel: counts = closed form exactly, O within the fp16 error of the
    plain kernel's own (P is rounded to fp16 before P V, as FlashAttention-2 does: bound
    4e-3 relative), rows that see no key O = 0 and L = -inf."""
    import gpu
    p = Problem(N=N, d=d, N_k=Nk, causal=causal, window=w, batch=2, heads=4, kv_heads=2,
                dtype="fp16")
    q, k, v = iosim.random_inputs(p, 7)
    ref, lse = iosim.reference_attention(q, k, v, causal=causal, window=w, return_lse=True)
    O, L, led = gpu.attention(q, k, v, causal=causal, window=w, block_rows=tiles[0],
                              block_cols=tiles[1], kernel="tc", count_traffic=True,
                              return_stats=True)
    assert led.counts() == iosim.closed_form("fa2", p, Tiling(*tiles)).counts()
    assert not np.isnan(O).any()
    err = np.linalg.norm(O.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err <= 4e-3, err
    none = np.isneginf(lse)
    assert (O[..., none[0, 0], :] == 0).all() if none.any() else True
    assert np.array_equal(np.isneginf(L), none)
    np.testing.assert_allclose(L[~none], lse[~none], atol=2e-2)


def test_fig15_window(tmp_path):
    from analysis.figures import fig15_window as f
    data = f.generate(Ns=(4096,), windows=[16, 512, 1024, 2048])
    c = data["curves"]["4096"]
    assert c["model_bytes"] == sorted(c["model_bytes"]) and c["model_bytes"][-1] < c["full_causal_bytes"]
    paths = f.make(tmp_path, Ns=(2048,))
    assert all(p.endswith((".png", ".svg")) for p in paths)
