"""Packed variable-length batches (issue 18 item 6; flash-attn's flash_attn_varlen_func).

Model (iosim.varlen): the closed form of a packed problem is the sum of the per-sequence
closed forms, equals the executed schedule (standard, fa1, fa2) exactly, and with equal
lengths equals the closed form of the plain batched Problem; executed outputs match a
float64 reference computed sequence by sequence. Inputs are validated.
Kernel (gpu.attention_varlen, Numba simulator, tiny sizes): outputs (NaN-poisoned before
the launch: the test suite runs with gpu.api.POISON on) within 1e-5 (fp32) / 2e-2 (fp16)
of the reference, L (heads, total_q) likewise with -inf exactly where a row sees no key,
and the kernel's own counts == varlen closed form == executed schedule, exactly.
"""
import numpy as np
import pytest

import iosim
from iosim import ConfigError, Problem, Tiling, VarlenProblem

#: the brief's lengths: q [5, 0, 17, 33], k [9, 3, 17, 40] (a sequence with no query rows)
CU_Q = [0, 5, 5, 22, 55]
CU_K = [0, 9, 12, 29, 69]
#: plus a sequence with query rows and no keys (O = 0, L = -inf)
CU_Q5 = CU_Q + [62]
CU_K5 = CU_K + [69]
T16 = Tiling(16, 16)
#: (causal, window)
BANDS = [(False, (-1, -1)), (True, (-1, -1)), (False, (4, 2)), (True, (6, 0))]


def _problem(cq, ck, causal, w, kv=1, d=16, dtype="fp32"):
    return VarlenProblem.from_cu_seqlens(cq, ck, d, heads=2, kv_heads=kv, dtype=dtype,
                                         causal=causal, window=w)


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("alg", ["standard", "fa1", "fa2"])
@pytest.mark.parametrize("causal,w", BANDS)
@pytest.mark.parametrize("kv", [1, 2])
def test_model_executed_equals_closed_form(alg, causal, w, kv):
    p = _problem(CU_Q5, CU_K5, causal, w, kv)
    q, k, v = iosim.random_varlen_inputs(p, 1)
    ex = iosim.execute_varlen(alg, p, T16, q, k, v)
    cf = iosim.varlen_closed_form(alg, p, T16)
    assert ex.ledger.counts() == cf.counts()
    # the definition: the sum over sequences of iosim.closed_form (no padding)
    want: dict = {}
    for b, (nq, nk) in enumerate(zip(p.seqlens_q, p.seqlens_k)):
        if nq and nk:
            led = iosim.closed_form(alg, Problem(N=nq, N_k=nk, d=16, heads=2, kv_heads=kv,
                                                 causal=causal, window=w), T16)
            for t, c in led.counts().items():
                want[t] = tuple(a + x for a, x in zip(want.get(t, (0, 0)), c))
    nq_nokey = 62 - 55                      # the last sequence: rows that see no key
    extra = {"fa2": {"Q": (nq_nokey * 2 * 16, 0), "O": (0, nq_nokey * 2 * 16),
                     "L": (0, nq_nokey * 2)},
             "fa1": {"O": (0, nq_nokey * 2 * 16), "l": (0, nq_nokey * 2),
                     "m": (0, nq_nokey * 2)},
             "standard": {"O": (0, nq_nokey * 2 * 16)}}[alg]
    for t, c in extra.items():
        want[t] = tuple(a + x for a, x in zip(want.get(t, (0, 0)), c))
    assert cf.counts() == want
    O, L = iosim.reference_varlen(q, k, v, p.cu_seqlens_q, p.cu_seqlens_k, causal=causal,
                                  window=w)
    np.testing.assert_allclose(ex.O, O, atol=1e-5)
    if ex.L is not None:
        assert np.array_equal(np.isneginf(ex.L), np.isneginf(L))
        fin = np.isfinite(L)
        np.testing.assert_allclose(ex.L[fin], L[fin], atol=1e-5)


@pytest.mark.parametrize("alg", ["standard", "fa1", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
def test_model_equal_lengths_is_the_batched_problem(alg, causal):
    p = VarlenProblem((21, 21, 21), (30, 30, 30), 8, heads=4, kv_heads=2, causal=causal)
    batched = Problem(N=21, N_k=30, d=8, batch=3, heads=4, kv_heads=2, causal=causal)
    t = Tiling(8, 16)
    assert iosim.varlen_closed_form(alg, p, t).counts() == \
        iosim.closed_form(alg, batched, t).counts()
    assert iosim.varlen_closed_form(alg, p, t).hbm_bytes == \
        iosim.closed_form(alg, batched, t).hbm_bytes


def test_model_zero_lengths_cost_nothing():
    p = VarlenProblem((0, 0), (0, 7), 16)
    assert iosim.varlen_closed_form("fa2", p, T16).counts() == {}
    ex = iosim.execute_varlen("fa2", p, T16)
    assert ex.O.shape == (0, 1, 16) and ex.ledger.counts() == {}
    d = iosim.varlen_closed_form("fa2", _problem(CU_Q, CU_K, True, (-1, -1)), T16).to_dict()
    assert d["seq_len"] == 55 and d["seq_len_kv"] == 69 and d["batch"] == 4
    assert d["cu_seqlens_q"] == CU_Q and d["cu_seqlens_k"] == CU_K


@pytest.mark.parametrize("cu,words", [
    ([1, 5, 9], ["cu_seqlens_q", "starts at 1", "= 0"]),
    ([0, 5, 3], ["cu_seqlens_q", "decreases at index 2", "5 -> 3", "non-decreasing"]),
    ([0, 2.5, 9], ["cu_seqlens_q", "float64", "integers"]),
    ([0], ["cu_seqlens_q", "batch + 1 >= 2"]),
    ([0, 5, 8], ["cu_seqlens_q", "ends at 8", "9 rows"]),
])
def test_cu_seqlens_validation(cu, words):
    with pytest.raises(ConfigError) as e:
        VarlenProblem.from_cu_seqlens(cu, [0, 4, 9], 16, total_q=9, total_k=9)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_varlen_problem_validation():
    with pytest.raises(ConfigError, match="cu_seqlens_q has 3 entries and cu_seqlens_k 2"):
        VarlenProblem.from_cu_seqlens([0, 1, 2], [0, 2], 16)
    with pytest.raises(ConfigError, match=r"seqlens_q=\(1, -1\).*>= 0"):
        VarlenProblem((1, -1), (1, 1), 16)
    with pytest.raises(ConfigError, match="kv_heads=3 must divide heads=4"):
        VarlenProblem((1,), (1,), 16, heads=4, kv_heads=3)
    p = VarlenProblem((2, 3), (4, 4), 16)
    with pytest.raises(ConfigError, match=r"q has shape \(4, 1, 16\).*\(5, 1, 16\)"):
        iosim.execute_varlen("fa2", p, T16, np.zeros((4, 1, 16)), np.zeros((8, 1, 16)),
                             np.zeros((8, 1, 16)))


# ---------------------------------------------------------------------------------------
# Kernel (simulator)
# ---------------------------------------------------------------------------------------
def _check_kernel(cq, ck, causal, w, kv, dtype="fp32", d=16):
    import gpu
    p = _problem(cq, ck, causal, w, kv, d, dtype)
    q, k, v = iosim.random_varlen_inputs(p, 2)
    O, L, led = gpu.attention_varlen(q, k, v, np.array(cq, dtype=np.int32),
                                     np.array(ck, dtype=np.int32), causal=causal, window=w,
                                     block_rows=16, block_cols=16, count_traffic=True,
                                     return_stats=True)
    assert O.shape == q.shape and O.dtype == q.dtype
    assert L.shape == (2, cq[-1]) and L.dtype == np.float32
    cf = iosim.varlen_closed_form("fa2", p, T16)
    assert led.counts() == cf.counts()
    assert led.counts() == iosim.execute_varlen("fa2", p, T16, q, k, v).ledger.counts()
    ref, lse = iosim.reference_varlen(q, k, v, cq, ck, causal=causal, window=w)
    assert not np.isnan(O).any() and not np.isnan(L).any()   # poisoned: all written
    tol = 1e-5 if dtype == "fp32" else 2e-2
    np.testing.assert_allclose(O, ref, atol=tol * max(1.0, np.abs(ref).max()))
    assert np.array_equal(np.isneginf(L), np.isneginf(lse))
    fin = np.isfinite(lse)
    np.testing.assert_allclose(L[fin], lse[fin], atol=1e-4 if dtype == "fp32" else 2e-2)


@pytest.mark.parametrize("causal,w,kv", [(False, (-1, -1), 2), (True, (-1, -1), 1),
                                         (False, (4, 2), 1)])
def test_kernel_fp32(causal, w, kv):
    _check_kernel(CU_Q, CU_K, causal, w, kv)


def test_kernel_no_key_rows_causal():
    """A sequence with keys and no queries, one with queries and no keys, and causal with
    N_q_b > N_k_b in the first one (rows that see no key)."""
    _check_kernel([0, 12, 12, 19], [0, 5, 8, 8], True, (-1, -1), 2)


def test_kernel_fp16():
    _check_kernel(CU_Q, CU_K, True, (6, 0), 2, dtype="fp16")


def test_kernel_errors():
    import gpu
    p = _problem(CU_Q, CU_K, False, (-1, -1))
    q, k, v = iosim.random_varlen_inputs(p, 0)
    with pytest.raises(ValueError, match="kernel='fast'.*allowed: 'plain'"):
        gpu.attention_varlen(q, k, v, CU_Q, CU_K, kernel="fast")
    with pytest.raises(ValueError, match=r"cu_seqlens_k=\[0, 9, 12, 29, 68\] ends at 68.*69"):
        gpu.attention_varlen(q, k, v, CU_Q, [0, 9, 12, 29, 68])
    with pytest.raises(ValueError, match="cu_seqlens_q.*starts at 2"):
        gpu.attention_varlen(q, k, v, [2, 5, 5, 22, 55], CU_K)
    with pytest.raises(ValueError, match=r"q has shape \(1, 55, 2, 16\).*3 dimensions"):
        gpu.attention_varlen(q[None], k, v, CU_Q, CU_K)
    with pytest.raises(ValueError, match="kv_heads=2, which must divide q's heads=3"):
        gpu.attention_varlen(np.zeros((55, 3, 16), np.float32), np.repeat(k, 2, axis=1),
                             np.repeat(v, 2, axis=1), CU_Q, CU_K)
    with pytest.raises(ValueError, match="causal=True and window=\\(2, 1\\)"):
        gpu.attention_varlen(q, k, v, CU_Q, CU_K, causal=True, window=(2, 1))


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------
def test_cli_traffic_json(capsys):
    import json
    from analysis.cli import main
    argv = ["traffic", "--algorithm", "fa2", "--cu-seqlens-q", "0,5,5,22,55",
            "--cu-seqlens-k", "0,9,12,29,69", "--head-dim", "16", "--heads", "2",
            "--kv-heads", "1", "--dtype", "fp32", "--causal", "--block-rows", "16",
            "--block-cols", "16"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = iosim.varlen_closed_form("fa2", _problem(CU_Q, CU_K, True, (-1, -1)), T16)
    assert out["hbm_bytes"] == want.hbm_bytes and out["per_tensor"] == want.per_tensor()
    assert out["cu_seqlens_q"] == CU_Q and out["seq_len"] == 55 and out["batch"] == 4
    plain = Problem(N=8, d=16)          # every key of the plain ledger's JSON is there
    assert set(iosim.closed_form("fa2", plain, T16).to_dict()) <= set(out)
    assert main(argv) == 0
    assert "fa2 varlen: 4 sequences" in capsys.readouterr().out


@pytest.mark.parametrize("extra,words", [
    (["--cu-seqlens-q", "0,5", "--cu-seqlens-k", "0,5", "--seq-len", "5"],
     ["do not go with --seq-len"]),
    (["--cu-seqlens-q", "0,5"], ["--cu-seqlens-q needs --cu-seqlens-k"]),
    (["--cu-seqlens-q", "0,5,3", "--cu-seqlens-k", "0,5,6"],
     ["cu_seqlens_q", "decreases"]),
    ([], ["--seq-len is required"]),
])
def test_cli_traffic_errors(capsys, extra, words):
    from analysis.cli import main
    rc = main(["traffic", "--algorithm", "fa2", "--head-dim", "16"] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and all(w in err[0] for w in words), err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,causal", [("fp32", True), ("fp16", False)])
def test_kernel_on_gpu(dtype, causal):
    """Real hardware: sequences of 1000, 0, 2048 and 517 queries (keys 1200, 100, 2048,
    452), d = 64; exact counts, every element written, errors within the same bounds."""
    _check_kernel([0, 1000, 1000, 3048, 3565], [0, 1200, 1300, 3348, 3800], causal,
                  (-1, -1), 1, dtype=dtype, d=64)
