"""Form 9 of the time model (iosim.timing): the causal fast fa2 backward's CTAs are
dispatched in its grid's real order, every head's key block 0 first, then every head's
block 1, ... (grid (instances, T_c), gpu.backward.fa2_fast.run), not head by head."""
import numpy as np
import pytest

from iosim import Problem, get_hardware


def _bwd_launch(p, kernel):
    from iosim import levels
    from iosim.timing import launch_features
    hw = get_hardware("H100-SXM")
    lv = levels("fa2", p, hw, pass_="bwd", kernel=kernel)
    (f,) = [f for f in launch_features(p, lv, hw) if f["kernel"] in ("fa2_bwd_fast", "fa2_bwd_tc")]
    return f, lv, hw


def test_causal_fast_backward_grid_is_heaviest_first_across_heads():
    from iosim.timing import makespans
    p = Problem(N=2048, d=64, batch=2, heads=8, dtype="fp32", causal=True)
    f, lv, hw = _bwd_launch(p, "fast")
    T_c = -(-p.N // lv["block_cols"])
    assert f["ctas"] == T_c * p.instances
    # key block j of every head: T_r - first query block + 1 units; the grid order
    # repeats each key block's work over the instances (blockIdx.x = instance)
    from iosim.memory.access import _first_query_block
    T_r = -(-p.N // lv["block_rows"])
    per_kb = T_r - _first_query_block(p.N, lv["block_rows"], lv["block_cols"], True) + 1
    w = np.repeat(per_kb, p.instances).astype(float)
    assert np.all(np.diff(w) <= 0)                     # heaviest first, the whole grid
    assert f["mk_sm"] == pytest.approx(makespans(w, hw, f["ctas_per_sm"])["mk_sm"])
    # head by head (the order form 8 assumed) leaves a longer tail on this 512-CTA grid
    head_by_head = makespans(np.tile(per_kb, p.instances).astype(float), hw, f["ctas_per_sm"])
    assert f["mk_sm"] < head_by_head["mk_sm"]


def test_non_causal_and_tensor_core_backward_keep_their_order():
    """The non-causal fast backward (grid (T_c, instances)) and the tensor-core backward
    (grid (T_c, instances) causal or not) run head by head: equal CTAs, or each head's
    key blocks in order."""
    from iosim.timing import makespans
    p = Problem(N=2048, d=64, batch=2, heads=8, dtype="fp16", causal=True)
    f, lv, hw = _bwd_launch(p, "tc")
    from iosim.memory.access import _first_query_block
    T_r = -(-p.N // lv["block_rows"])
    per_kb = T_r - _first_query_block(p.N, lv["block_rows"], lv["block_cols"], True) + 1
    w = np.tile(per_kb, p.instances).astype(float)
    assert f["mk_sm"] == pytest.approx(makespans(w, hw, f["ctas_per_sm"])["mk_sm"])


def test_g_mem_is_held_at_the_sm_count():
    """Form 9: g_mem is not fitted; the constants on file and any refit hold it at G_MEM."""
    from analysis.fit_runtime import G_MEM, SHARED_PARAMS
    from iosim.timing import RuntimeModel
    assert "g_mem" not in SHARED_PARAMS
    assert RuntimeModel.load().g_mem == G_MEM == get_hardware("H100-SXM").sm_count
