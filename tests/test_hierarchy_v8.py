"""The L2 model's eighth revision (iosim.memory): the wave's lagging part
(`L2Model.sweep_lag`, `sweep_kernel`'s lag), and where `iosim.memory` applies it."""
import dataclasses

import numpy as np
import pytest

from iosim import Problem
from iosim.memory import L2Model, Stream, dram_from_stream, sweep_kernel

M = L2Model(1.0, 4096)           # a nearly hard capacity edge


def _reads(groups, lag, C, n_seq=100, tile=100.0):
    """DRAM reads of one wave: 4 CTAs per group, all starting together, each sweeping its
    group's n_seq tiles of `tile` bytes."""
    st = Stream()
    g = np.repeat(np.arange(groups), 4)
    sweep_kernel(st, group=g, lo=np.zeros(g.size), hi=np.full(g.size, n_seq),
                 step_bytes=tile, lag=lag, slots=g.size, budget=100_000, n_seq=n_seq)
    return dram_from_stream(st, C, M)[0]


def test_no_lag_reads_each_tile_once():
    assert _reads(1, 0.0, 1e3) == pytest.approx(1e4)


def test_lagging_read_hits_within_capacity_and_misses_beyond():
    """lag 0.35 of a 100-tile sweep: about 2 x 35 tiles (7 kB) between the two reads of a
    tile. One head's wave: a hit at C = 10 kB, a second fetch at C = 3 kB; two heads' wave
    (the end of one, the start of the next): twice the distance, a second fetch at
    C = 10 kB for all but the sweep's last tiles (their lagging reads come after the
    leading part has ended: fewer bytes in between)."""
    assert _reads(1, 0.35, 1e4) == pytest.approx(1e4, rel=0.02)
    assert _reads(1, 0.35, 3e3) == pytest.approx(2e4, rel=0.02)
    assert 3e4 < _reads(2, 0.35, 1e4) <= 4e4 * 1.001
    assert _reads(2, 0.35, 3e3) == pytest.approx(4e4, rel=0.02)
    assert _reads(2, 0.35, 2e4) == pytest.approx(2e4, rel=0.02)


def test_levels_applies_the_lag_to_the_non_causal_tc_forward_only():
    import iosim
    import iosim.memory as M
    off = dataclasses.replace(M.FITTED_V8, sweep_lag=0.0)
    deep = Problem(N=98304, d=64, heads=8, dtype="fp16")
    on_r = iosim.levels("fa2", deep, "H100-SXM", model=M.FITTED_V8)["dram_read_bytes"]
    off_r = iosim.levels("fa2", deep, "H100-SXM", model=off)["dram_read_bytes"]
    assert on_r > 1.2 * off_r       # 1,031 and 800 MB; measured 1,146 MB (v7: 734 MB)
    for p, kernel in ((dataclasses.replace(deep, causal=True), "auto"),
                      (Problem(N=32768, d=64, heads=16, dtype="fp32"), "auto")):
        a = iosim.levels("fa2", p, "H100-SXM", kernel=kernel, model=M.FITTED_V8)
        b = iosim.levels("fa2", p, "H100-SXM", kernel=kernel, model=off)
        assert a["dram_read_bytes"] == b["dram_read_bytes"]


def test_sweep_lag_is_checked():
    with pytest.raises(ValueError):
        L2Model(sweep_lag=1.5)
