"""The chip-to-chip range of the DRAM predictions (`iosim.levels`'
dram_read_bytes_range / dram_write_bytes_range, `CHIP_CAPACITY_RANGE`) and its validation
count (`within_chip_range`)."""
import numpy as np
import pytest

from iosim import Problem
from iosim.memory import L2Model, Stream, dram_at_capacities, dram_from_stream

from analysis import fit_levels as FL
import dataclasses
import iosim
import iosim.memory as M

KEYS = ("dram_read_bytes", "dram_write_bytes")
#: fa1_tc at W = 0.53 of the H100's L2 (LEVELS_DEV8: 58 / 28 MB on machine A, 116 / 79 MB on
#: machine B): on the edge
EDGE = ("fa1", "tc", Problem(N=6144, d=64, batch=1, heads=17, dtype="fp16"))
#: fa1_tc at W = 2.6 L2 (every round trip misses) and 0.1 L2 (every one hits)
FAR = [("fa1", "tc", Problem(N=8192, d=128, batch=1, heads=32, dtype="fp16")),
       ("fa1", "tc", Problem(N=1024, d=64, batch=1, heads=8, dtype="fp16"))]


def _levels(case, **kw):
    alg, kern, p = case
    return iosim.levels(alg, p, "H100-SXM", kernel=kern, **kw)


def test_the_range_constants_bracket_the_model():
    lo, hi = M.CHIP_CAPACITY_RANGE
    assert 0.5 < lo < 1.0 < hi < 1.5


def test_range_brackets_the_point_and_is_wide_on_the_edge():
    r = _levels(EDGE)
    for k in KEYS:
        lo, hi = r[k + "_range"]
        assert lo <= r[k] <= hi
    # at 0.53 L2 a chip with less effective L2 misses far more (machine B: 116 / 79 MB)
    assert r["dram_read_bytes_range"][1] > 1.5 * r["dram_read_bytes"]
    assert r["dram_write_bytes_range"][1] > 2.0 * r["dram_write_bytes"]
    assert any("capacity edge" in w for w in r["warnings"])
    # the range is the same model at C x hi (low end) and C x lo (high end)
    lo, hi = M.CHIP_CAPACITY_RANGE
    s = _levels(EDGE, capacity_scales=(hi, 1.0, lo), chip_range=None)
    (_, r_hi, w_hi), (_, r_1, w_1), (_, r_lo, w_lo) = s["dram_at_capacity_scales"]
    assert r_1 == pytest.approx(r["dram_read_bytes"], rel=1e-12)
    assert w_1 == pytest.approx(r["dram_write_bytes"], rel=1e-12)
    assert r["dram_read_bytes_range"] == pytest.approx([min(r_hi, r_1), max(r_lo, r_1)], rel=1e-12)
    assert r["dram_write_bytes_range"] == pytest.approx([min(w_hi, w_1), max(w_lo, w_1)], rel=1e-12)
    assert "dram_read_bytes_range" not in s


@pytest.mark.parametrize("case", FAR)
def test_range_is_the_point_far_from_the_edge(case):
    r = _levels(case)
    for k in KEYS:
        lo, hi = r[k + "_range"]
        assert lo <= r[k] <= hi
        assert lo == pytest.approx(r[k], rel=1e-3) and hi == pytest.approx(r[k], rel=1e-3)
    assert not any("capacity edge" in w for w in r["warnings"])


def test_fa2_kv_edge_is_ranged_and_far_from_it_is_the_point():
    # v12: every launch is ranged. The fa2 forward far from its K/V edge (16 heads,
    # N = 4096: K/V fit with room) has its point as its range ...
    far = iosim.levels("fa2", Problem(N=4096, d=64, batch=1, heads=16, dtype="fp16"), "H100-SXM")
    for k in KEYS:
        lo, hi = far[k + "_range"]
        assert lo == pytest.approx(far[k], rel=1e-3) and hi == pytest.approx(far[k], rel=1e-3)
    assert not any("capacity edge" in w for w in far["warnings"])
    # ... on the edge (20 heads, N = 48K: measured 393 MB of reads on the H100 against
    # v10's 457) its reads span more than the point; writes (O once) barely move
    edge = iosim.levels("fa2", Problem(N=48 * 1024, d=64, batch=1, heads=20, dtype="fp16"),
                    "H100-SXM")
    lo, hi = edge["dram_read_bytes_range"]
    assert lo < 0.95 * edge["dram_read_bytes"] and hi > 1.05 * edge["dram_read_bytes"]
    assert FL.within_range((lo, hi), 393.5e6) and not M.within(edge["dram_read_bytes"], 393.5e6)
    wlo, whi = edge["dram_write_bytes_range"]
    assert whi - wlo < 0.05 * edge["dram_write_bytes"]


def test_dram_at_capacities_is_dram_from_stream_at_each_capacity():
    st = Stream()
    ids = st.ids(40)
    for k in range(4):
        st.add(np.arange(40) + 40.0 * k, ids, 1.0e6, True, True)
    m = L2Model(capacity_fraction=1.0, associativity=64)
    caps = (30e6, 41e6, 60e6)
    many = dram_at_capacities(st, caps, m)
    for c, (r, w) in zip(caps, many):
        r1, w1, n = dram_from_stream(st, c, m)
        assert (r, w) == (r1, w1) and n == 160
    # less capacity, more DRAM traffic
    assert many[0][0] > many[1][0] > many[2][0]


def test_within_chip_range():
    pred = {"dram_read_bytes": 100e6, "dram_write_bytes": 50e6,
            "dram_read_bytes_range": [90e6, 300e6], "dram_write_bytes_range": [40e6, 60e6]}
    ok = FL.within_chip_range(pred, {"dram_read_bytes": 250e6, "dram_write_bytes": 70e6})
    assert ok == {"dram_read_bytes": True, "dram_write_bytes": True}     # 70 MB: +16 MB floor
    ok = FL.within_chip_range(pred, {"dram_read_bytes": 400e6, "dram_write_bytes": 20e6})
    assert ok == {"dram_read_bytes": False, "dram_write_bytes": False}
    # 345 MB: 300 MB is within 15 % of it
    assert FL.within_chip_range(pred, {"dram_read_bytes": 345e6, "dram_write_bytes": 50e6})["dram_read_bytes"]
    # no range: the point, as the bound
    point = {"dram_read_bytes": 100e6, "dram_write_bytes": 50e6}
    assert FL.within_chip_range(point, {"dram_read_bytes": 150e6, "dram_write_bytes": 50e6}) == \
        {"dram_read_bytes": False, "dram_write_bytes": True}


# v13: the spilling builds' bounds. fa2_tc 128 x 128 at d = 64 keeps a 400-byte frame
# per thread in local memory, rewritten at every K/V step (iosim.launch.plan.LOCAL); the
# default 128 x 64 build has none.
SPILL = Problem(N=32768, d=64, batch=1, heads=4, dtype="fp16")


def test_spilling_build_range_is_the_physical_bound():
    from iosim import Tiling
    r = iosim.levels("fa2", SPILL, "H100-SXM", kernel="tc", tiling=Tiling(128, 128))
    k = r["kernels"][0]
    assert k["spill_bytes"] > 0
    lo_r, hi_r = r["dram_read_bytes_range"]
    lo_w, hi_w = r["dram_write_bytes_range"]
    # reads: from the compulsory Q + K + V (each byte once) up to every CTA's K/V loads,
    # i.e. the pass's L2 reads of global memory
    assert lo_r == 3 * 4 * 32768 * 64 * 2
    assert hi_r == pytest.approx(r["l2_read_bytes"] - r["l2_local_read_bytes"], rel=1e-12)
    assert lo_r <= r["dram_read_bytes"] <= hi_r
    # writes: from the launch without its frames to every step's rewritten frame
    # (4 heads x 256 query blocks, 256 K/V steps each, 400 B x 256 threads a step),
    # background writes added to both ends as to the point
    steps = 4 * 256 * 256
    bg = k["background_write_bytes"]
    no_frames = iosim.levels("fa2", SPILL, "H100-SXM", kernel="tc", tiling=Tiling(128, 128),
                         model=dataclasses.replace(M.FITTED, local_memory=False), chip_range=None)
    assert lo_w <= no_frames["dram_write_bytes"] * 1.001
    assert hi_w >= steps * 400 * 256
    assert lo_w <= r["dram_write_bytes"] <= hi_w and lo_w >= bg
    assert any("drift apart" in w for w in r["warnings"])
    # the default build of the same problem has no frames and keeps its narrow range
    d = iosim.levels("fa2", SPILL, "H100-SXM", kernel="tc")
    assert d["kernels"][0]["spill_bytes"] == 0
    assert d["dram_read_bytes_range"][1] < 0.1 * d["l2_read_bytes"] and d["l2_local_read_bytes"] == 0
    assert not any("drift apart" in w for w in d["warnings"])


def test_local_memory_at_the_l2():
    """v13: local memory reaches the L2 (the ledger counts global memory only). Stores
    go through the L1: the fast d = 64 build's 88-byte frame once per CTA; the 128 x 128
    tensor-core build's 1,041 bytes a thread at every K/V step. Loads: the overflowing
    build's 1,040 bytes a thread a step, less what 0.7 of the L1 left beside its shared
    memory holds of the SM's frames."""
    from iosim import Tiling
    fast = iosim.levels("fa2", Problem(N=16384, d=64, heads=16, dtype="fp32"), "H100-SXM",
                    kernel="fast")
    k = fast["kernels"][0]
    assert (k["spill_bytes"], k["threads"], k["ctas"]) == (88, 512, 16 * 64)
    assert fast["l2_local_write_bytes"] == 88 * 512 * 16 * 64
    assert fast["l2_write_bytes"] == fast["requested_write_bytes"] + 88 * 512 * 16 * 64
    assert fast["l2_local_read_bytes"] == 0 and fast["l2_read_bytes"] == fast["requested_read_bytes"]
    tc = iosim.levels("fa2", SPILL, "H100-SXM", kernel="tc", tiling=Tiling(128, 128))
    k = tc["kernels"][0]
    ctas, steps = 4 * 256, 4 * 256 * 256              # CTAs; CTAs x K/V steps (T_c = 256)
    assert (k["threads"], k["ctas_per_sm"], k["spill_bytes"]) == (256, 2, 520)
    assert tc["l2_local_write_bytes"] == pytest.approx(ctas * 520 * 256 + steps * 1041 * 256)
    # two CTAs of 92,672 + 1,024 bytes take the 196 KB carve-out: 60 KB of L1 for 2 x 256
    # x 400 bytes of frames
    held = 0.7 * 60 * 1024 / (2 * 256 * 400)
    assert tc["l2_local_read_bytes"] == pytest.approx(steps * 1040 * 256 * (1 - held))
    assert tc["l2_read_bytes"] == pytest.approx(
        tc["requested_read_bytes"] * M.TC_CPASYNC_SECTOR_FACTOR + tc["l2_local_read_bytes"])
