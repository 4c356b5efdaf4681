"""The L2 model's sixth revision (iosim.memory): partial accesses of coarse tiles
(`L2Model.partial_refetch`) and the local memory of builds whose frames overflow the L1
(`L2Model.local_memory`, `sweep_kernel`'s local_frame_bytes)."""
import dataclasses

import numpy as np
import pytest

from iosim import Problem
from iosim.memory import L2Model, Stream, dram_from_stream, sweep_kernel


def test_partial_accesses_of_a_tile_load_each_byte_once():
    """A tile touched first in part (30 B), then more (60 B), then in full (100 B), all
    close together: every byte misses once (100 B), not only the first access's 30 B."""
    st = Stream()
    st.add([0.0, 1.0, 2.0], [0, 0, 0], [30.0, 60.0, 100.0], True, False)
    off = dram_from_stream(st, 1e6, L2Model(1.0, 4096))[0]
    on = dram_from_stream(st, 1e6, L2Model(1.0, 4096, partial_refetch=True))[0]
    assert off == pytest.approx(30.0) and on == pytest.approx(100.0)


def test_partial_reaccess_charges_the_rest_from_where_it_was_last_touched():
    """A full access, then a long stream (past C), then a partial access and a full one:
    the partial access misses its 40 B; the other 60 B were last touched before the
    stream, so they miss too (v5 counted them as hits on the partial access)."""
    C = 1000.0
    st = Stream()
    st.add(0.0, 0, 100.0, True, False)
    st.add(np.arange(1, 21, dtype=float), np.arange(1, 21), 100.0, True, False)   # 2 C
    st.add([21.0, 22.0], [0, 0], [40.0, 100.0], True, False)
    m = L2Model(1.0, 4096)
    off = dram_from_stream(st, C, m)[0]
    on = dram_from_stream(st, C, dataclasses.replace(m, partial_refetch=True))[0]
    assert off == pytest.approx(100.0 + 2000.0 + 40.0, rel=1e-3)
    assert on == pytest.approx(100.0 + 2000.0 + 100.0, rel=1e-3)


@pytest.mark.parametrize("slots", [8, 64])
def test_coarse_causal_sweep_matches_the_fine_one(slots):
    """Causal prefixes (each CTA's sweep ends inside a coarse group of tiles): with
    partial_refetch the coarsened stream predicts the fine one's DRAM reads."""
    T = 96
    hi = np.tile(np.arange(T, 0, -1), 4)           # heaviest first, 4 heads
    group = np.repeat(np.arange(4), T)
    C = 6 * T * 10.0
    out = {}
    for budget in (1000, 10 ** 6):
        st = Stream()
        sweep_kernel(st, group=group, lo=np.zeros(hi.size), hi=hi, step_bytes=10.0,
                     slots=slots, budget=budget, n_seq=T)
        out[budget] = dram_from_stream(st, C, L2Model(1.0, 96, partial_refetch=True))[0]
    assert out[1000] == pytest.approx(out[10 ** 6], rel=0.03)
    assert out[10 ** 6] >= 4 * T * 10.0 - 1e-6       # at least every K/V tile once


def test_local_frames_reread_every_step_when_they_overflow_the_l2():
    """local_frame_bytes: each slot's frame is re-read (and rewritten) at every step; when
    the slots' frames together exceed C, every step misses its frame, when they fit, only
    the first touch does."""
    n, steps, slots = 16, 50, 4
    res = {}
    for frame in (10.0, 1000.0):
        st = Stream()
        sweep_kernel(st, group=np.arange(n), lo=np.zeros(n), hi=np.full(n, steps),
                     step_bytes=1.0, local_frame_bytes=frame, local_write_bytes=frame,
                     slots=slots, budget=10 ** 6, n_seq=steps)
        res[frame] = dram_from_stream(st, 2000.0, L2Model(1.0, 4096))
    reads_small = res[10.0][0] - n * steps * 1.0           # less the K/V tiles (all miss)
    reads_big = res[1000.0][0] - n * steps * 1.0
    assert reads_small == pytest.approx(slots * 10.0, rel=0.05)
    assert reads_big == pytest.approx(n * steps * 1000.0, rel=0.05)


def test_levels_counts_local_memory_of_the_spilling_tc_build():
    """fa2_tc 128 x 128 at d = 64 keeps fragments in a 400-byte local frame that overflows
    the L1: with local_memory its DRAM writes are of the order of its frames' rewrites
    (Nsight Compute: 327 GB at N = 65536, 16 heads), not the few MB of O."""
    from iosim import levels
    from iosim.memory import FITTED, FITTED_V5
    from iosim import Tiling
    p = Problem(N=8192, d=64, heads=16, dtype="fp16")
    new = levels("fa2", p, "H100-SXM", kernel="tc", tiling=Tiling(128, 128), model=FITTED)
    old = levels("fa2", p, "H100-SXM", kernel="tc", tiling=Tiling(128, 128), model=FITTED_V5)
    assert FITTED.local_memory and not FITTED_V5.local_memory
    assert new["dram_write_bytes"] > 10 * old["dram_write_bytes"]
    assert not any("nor in these predictions" in w for w in new["warnings"])
    # a build whose frame fits in the L1 (fa2_fast 256 x 32 at d = 64) is unchanged
    p = Problem(N=8192, d=64, heads=16, dtype="fp32")
    a = levels("fa2", p, "H100-SXM", kernel="fast", model=FITTED)
    b = levels("fa2", p, "H100-SXM", kernel="fast",
               model=dataclasses.replace(FITTED, local_memory=False))
    assert a["dram_read_bytes"] == pytest.approx(b["dram_read_bytes"])



def test_partial_layers_stay_within_their_room():
    """_partial_layers writes its layers into arrays of 4 n + 16 without bounds checks
    (Numba): the argument in its comment bounds them by 3 n. Random and adversarial
    streams (extents falling step by step, then jumping above all of them) stay within it."""
    from iosim.memory.order import _partial_layers
    rng = np.random.default_rng(0)
    for trial in range(150):
        n = int(rng.integers(1, 400))
        dense = np.sort(rng.integers(0, 1 + n // int(rng.integers(1, 40)), n)).astype(np.int64)
        extents = (rng.random(n) * 100,                                     # random
                   np.arange(n, 0, -1.0) % 21 + (np.arange(n) % 21 == 20) * 100,  # saw
                   rng.integers(1, 5, n) * 1.0)[trial % 3]                  # few sizes
        order = np.lexsort((np.arange(n), dense)).astype(np.int64)
        k, b, d = _partial_layers(order, dense, extents, np.ones(n), rng.random(n) * 10)
        assert k.size <= 3 * n and (b > 0).all()
