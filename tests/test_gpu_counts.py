"""The instrumented kernels' own global-memory counts equal iosim's ledger exactly.

Each kernel thread counts the elements it loads/stores per tensor and adds them with one
atomic per tensor (gpu._launch); the sums over all launches of an algorithm must equal
both iosim.closed_form (formula) and iosim.execute (host schedule run through a counting
memory), tensor by tensor, reads and writes. Simulator-sized: N=40 (ragged with 16-row
tiles), d=16, heads=2 sharing one K/V head (grouped).
"""
import numpy as np
import pytest

import iosim
import gpu

ALGS = ("standard", "fa1", "fa2")


def check_counts(alg, problem, tiling, q, k, v):
    O, ledger = gpu.attention(q, k, v, algorithm=alg, causal=problem.causal,
                              block_rows=tiling.B_r, block_cols=tiling.B_c,
                              block_mask=problem.block_mask, count_traffic=True)
    assert not np.isnan(O).any()
    cf = iosim.closed_form(alg, problem, tiling)
    ex = iosim.execute(alg, problem, tiling, q, k, v).ledger
    assert ledger.counts() == cf.counts()
    assert ledger.counts() == ex.counts()
    assert ledger.hbm_bytes == cf.hbm_bytes
    return ledger


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("causal", [False, True])
def test_counts_ragged_grouped(alg, causal):
    p = iosim.Problem(N=40, d=16, batch=1, heads=2, kv_heads=1, causal=causal)
    q, k, v = iosim.random_inputs(p, seed=7)
    ledger = check_counts(alg, p, iosim.Tiling(16, 16), q, k, v)
    # K/V are counted per query head: two query heads read the one K head twice.
    assert ledger.reads["K"] % 2 == 0


@pytest.mark.parametrize("alg", ALGS)
def test_counts_block_mask(alg):
    """Block-sparse (with causal) and an empty query block; batch 2, fp16."""
    mask = np.array([[True, False, True],
                     [False, False, False],
                     [True, True, False]])
    p = iosim.Problem(N=40, d=16, batch=2, heads=1, dtype="fp16", causal=True, block_mask=mask)
    q, k, v = iosim.random_inputs(p, seed=8)
    check_counts(alg, p, iosim.Tiling(16, 16), q, k, v)


@pytest.mark.parametrize("alg", ALGS)
def test_counts_rectangular_tiles(alg):
    """B_r != B_c (16 x 8), causal, d=48, N=36: both block sizes ragged."""
    p = iosim.Problem(N=36, d=48, causal=True)
    q, k, v = iosim.random_inputs(p, seed=9)
    check_counts(alg, p, iosim.Tiling(16, 8), q, k, v)


def test_counts_off_leaves_counters_untouched():
    """count_traffic=False returns O only; the counting build is a separate kernel."""
    from gpu.forward import fa2
    p = iosim.Problem(N=16, d=16)
    q, k, v = iosim.random_inputs(p, seed=10)
    O = gpu.attention(q, k, v, block_rows=16, block_cols=16)
    assert isinstance(O, np.ndarray)
    k_on = fa2.fa2_forward_kernel(16, 16, 16, "fp32", False, False, True, 16)
    k_off = fa2.fa2_forward_kernel(16, 16, 16, "fp32", False, False, False, 16)
    assert k_on is not k_off
    assert k_on.py_func.__name__ == "fa2_fwd_Br16_Bc16_d16_fp32_count_t16"
