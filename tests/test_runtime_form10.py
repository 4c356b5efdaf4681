"""Form 10 of the time model (iosim.timing): the plain row passes' (softmax S -> P,
the backward's dS) tile steps cost, besides sigma per warp of the CTA (the loop over the
row's tiles, run by every warp), sigma_w per warp that holds entries of the tile (thread t
takes entries c0 + t, c0 + t + threads, ...: one load in flight per thread and pass); the
fast standard's dense flat sweep (4 independent loads in flight per thread) has none."""
import pytest

from iosim import Problem, get_hardware


def _softmax(p, kernel, algorithm="standard", pass_="fwd"):
    from iosim import levels
    from iosim.timing import launch_features
    hw = get_hardware("H100-SXM")
    lv = levels(algorithm, p, hw, pass_=pass_, kernel=kernel)
    (f,) = [f for f in launch_features(p, lv, hw) if f["kernel"] in ("std_softmax", "std_bwd_dS")]
    return f, lv


def _ra(p, lv):
    import iosim
    return int(iosim.tile_sums(p.N, lv["block_rows"], lv["block_cols"], p.causal)[1]) * p.instances


@pytest.mark.parametrize("d, holding", [(64, 4), (128, 2)])
def test_fast_causal_softmax_counts_the_warps_holding_entries(d, holding):
    """256 threads a row; B_c = 128 (d = 64) leaves 4 of 8 warps with entries in a tile
    step, B_c = 64 (d = 128) 2 of 8: the working warps' rounds are per entry (the same per
    row for either tiling), the loop's steps per tile (twice as many at B_c = 64)."""
    p = Problem(N=2048, d=d, batch=1, heads=4, dtype="fp32", causal=True)
    f, lv = _softmax(p, "fast")
    assert f["warps"] == 8
    assert f["row_steps"] == _ra(p, lv) * 8
    assert f["row_wsteps"] == _ra(p, lv) * holding * -(-lv["block_cols"] // 256)
    assert f["row_wsteps"] * 32 == pytest.approx(f["W"] / 32, rel=0.05)   # ~ one per entry


def test_flat_sweep_has_no_per_tile_rounds():
    p = Problem(N=2048, d=64, batch=1, heads=4, dtype="fp32", causal=False)
    f, _ = _softmax(p, "fast")
    assert f["row_steps"] > 0 and f["row_wsteps"] == 0


def test_plain_row_passes_and_model_term():
    """The plain softmax (128 threads, B_c = 32 at d = 128: one warp of four holds a
    tile's entries) and dS take the same count; sigma_w adds to the work term."""
    from iosim.timing import RuntimeModel, terms
    p = Problem(N=1024, d=128, batch=1, heads=2, dtype="fp32", causal=True)
    f, lv = _softmax(p, "plain")
    assert lv["block_cols"] == 32 and f["warps"] == 4
    assert f["row_wsteps"] == _ra(p, lv) * 1
    g, lv2 = _softmax(p, "plain", pass_="bwd")
    assert g["row_wsteps"] > 0
    hw = get_hardware("H100-SXM")
    m = RuntimeModel({"std_softmax": 0.5}, 0.5, 0.5, 0.0)
    base = terms(f, m, hw)["work"]
    from dataclasses import replace
    more = terms(f, replace(m, sigma_w=1000.0), hw)["work"]
    assert more - base == pytest.approx(1000.0 * f["row_wsteps"] / hw.fp32_flops / 0.5 * 1e3)


def test_compiled_shared_makespan_reproduces_the_python_schedule():
    """iosim.timing.makespan._shared_makespan (compiled) against _shared_makespan_py, the
    reference it reproduces: bit for bit on random grids (ties, causal-like ramps, grids
    smaller and larger than the slots)."""
    import numpy as np

    from iosim.timing import makespan as R
    rng = np.random.default_rng(11)
    for n, sms, slots in ((1, 132, 1), (7, 4, 2), (300, 132, 2), (1000, 132, 3),
                          (133, 132, 1), (64, 8, 4)):
        for work in (rng.random(n) * 10, np.ones(n), np.arange(n, 0, -1.0),
                     np.round(rng.random(n) * 4)):
            assert R._shared_makespan(work, sms, slots) == R._shared_makespan_py(work, sms, slots)
