"""The L2 model's tenth revision (iosim.memory): the private round trips' capacity edge
(`L2Model.private_rmw_capacity`) and fa1's Q_i as a tile of its own (`iosim.memory`)."""
import dataclasses

import numpy as np
import pytest

from iosim import Problem
from iosim.memory import L2Model, Stream, dram_from_stream


def test_v10_is_v9_with_the_private_round_trip_edge():
    import iosim.memory as M
    assert M.FITTED is M.FITTED_V10
    assert M.FITTED_V9.private_rmw_capacity == 1.0
    assert M.FITTED_V10.private_rmw_capacity == pytest.approx(0.93)
    assert dataclasses.replace(M.FITTED_V10, private_rmw_capacity=1.0) == M.FITTED_V9


def _round_trips(n_tiles=40, tile=1.0e6, steps=4, read_only=False):
    """One CTA's private tiles, each read (and written) once per step in a cycle: the
    distance of every re-access is the other tiles' bytes."""
    st = Stream()
    ids = st.ids(n_tiles)
    for k in range(steps):
        st.add(np.arange(n_tiles) + k * n_tiles, ids, tile, True, not read_only)
    return st


def test_private_round_trips_leave_at_their_own_edge():
    # 40 tiles of 1 MB cycled (39 MB between two accesses of a tile) against C = 41 MB
    # with a sharp edge: v9's edge keeps them (cold misses only); at 0.93 C (38 MB) they
    # thrash, reads and writes alike
    base = L2Model(capacity_fraction=1.0, associativity=4096)
    cold = 40e6
    r0, w0, _ = dram_from_stream(_round_trips(), 41e6, base)
    r1, w1, _ = dram_from_stream(_round_trips(), 41e6,
                                 dataclasses.replace(base, private_rmw_capacity=0.93))
    assert r0 == pytest.approx(cold, rel=0.02) and w0 < 0.05 * cold
    assert r1 > 3.5 * cold and w1 > 2.5 * cold
    # read-only private re-reads (fa1's Q) keep C unless private_read_capacity says so
    r2, _, _ = dram_from_stream(_round_trips(read_only=True), 41e6,
                                dataclasses.replace(base, private_rmw_capacity=0.93))
    assert r2 == pytest.approx(cold, rel=0.02)
    r3, _, _ = dram_from_stream(_round_trips(read_only=True), 41e6,
                                dataclasses.replace(base, private_read_capacity=0.93))
    assert r3 > 3.5 * cold


def test_fa1_near_capacity_writes_more_and_fa2_is_unchanged():
    import iosim
    import iosim.memory as M
    # LEVELS_DEV6 fa1_tc h16 N 8192 (W = 0.66 L2): 698 MB read, 483 MB written measured;
    # v9 366 / 230 MB
    p = Problem(N=8192, d=64, heads=16, dtype="fp16")
    v10 = iosim.levels("fa1", p, "H100-SXM", model=M.FITTED_V10)
    v9 = iosim.levels("fa1", p, "H100-SXM", model=M.FITTED_V9)
    assert v10["dram_write_bytes"] > 1.5 * v9["dram_write_bytes"]
    assert v10["dram_read_bytes"] > 1.3 * v9["dram_read_bytes"]
    assert v10["l2_model"]["private_rmw_capacity"] == pytest.approx(0.93)
    # far from the edge fa1 is as before (fits: compulsory only; far past: every round trip)
    for q in (Problem(N=4096, d=64, heads=16, dtype="fp16"),
              Problem(N=8192, d=64, heads=32, dtype="fp16")):
        a = iosim.levels("fa1", q, "H100-SXM", model=M.FITTED_V10)
        b = iosim.levels("fa1", q, "H100-SXM", model=M.FITTED_V9)
        assert a["dram_read_bytes"] == pytest.approx(b["dram_read_bytes"], rel=0.02)
    # the fa2 forward has no private round trips
    q = Problem(N=32768, d=64, heads=16, dtype="fp16")
    assert iosim.levels("fa2", q, "H100-SXM", model=M.FITTED_V10)["dram_read_bytes"] == \
        iosim.levels("fa2", q, "H100-SXM", model=M.FITTED_V9)["dram_read_bytes"]


def test_private_capacities_are_checked():
    for kw in ({"private_rmw_capacity": 0.0}, {"private_rmw_capacity": 2.5},
               {"private_read_capacity": -1.0}):
        with pytest.raises(ValueError):
            L2Model(**kw)
