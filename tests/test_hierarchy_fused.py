"""The compiled path of the L2 model (`iosim.memory.fused._dram_fused`: every capacity of a
stream in one pass) against its reference, `_dram_at` capacity by capacity (numpy
expressions), bit for bit: on random streams, on the streams of `iosim.memory`, and at
every capacity asked for; with the pieces it rests on (numpy's pairwise sum, the Poisson
table look-up, the stream builders' compiled parts) and the uniform CTA work of
`iosim.timing`."""
import dataclasses

import numpy as np
import pytest

from iosim import Problem, Tiling, get_hardware
from iosim.memory import dram as mem_dram
from iosim.memory import fused as mem_fused
from iosim.memory import hits as mem_hits
from iosim.memory import order as mem_order
from iosim.memory import schedule as mem_schedule
from iosim.memory import stream as mem_stream
from iosim.memory import L2Model, Stream, dram_at_capacities


def _fitted():
    from iosim.memory import FITTED
    return FITTED


def _both(st, caps, model):
    """(fused, reference) [(reads, writes)] of a stream at `caps` (bytes)."""
    acc = mem_order._time_ordered(st, model)
    return mem_fused._dram_fused(caps, model, *acc), mem_dram._dram_reference(caps, model, *acc)


def _random_stream(seed, n=3000, tiles=300, selfd=False):
    """Accesses of random tiles at random half-step times: shared and private tiles, reads,
    writes and read-modify-writes, weights, partial write-backs, tiles touched with
    growing extents (the partial layers), and optionally selfd."""
    rng = np.random.default_rng(seed)
    st = Stream()
    for _ in range(6):
        m = n // 6
        t = np.round(rng.uniform(0, n / 4, m) * 2) / 2
        blk = rng.integers(0, tiles, m) + (1 << 40) * rng.integers(0, 3, m)
        nb = rng.choice([64e3, 128e3, 256e3, 1e6], m) * rng.integers(1, 4, m)
        rd = rng.random(m) < 0.8
        wr = rng.random(m) < 0.35
        wr[~rd] = True                      # every access reads or writes
        st.add(t, blk, nb, rd, wr, w=rng.choice([1.0, 1.0, 3.0], m),
               wb=nb * rng.choice([1.0, 0.5], m), shared=rng.random(m) < 0.5,
               selfd=(rng.random(m) * 2e5 if selfd else 0.0))
    return st


MODELS = {
    "fitted": None,                                         # iosim.memory.FITTED
    "plain": L2Model(capacity_fraction=0.8, associativity=16),
    "dirty ways": L2Model(capacity_fraction=0.75, associativity=96, replicate=True,
                          dirty_fraction=0.4, dirty_associativity=24, drain_fraction=0.1,
                          home_written=True, partial_refetch=True),
    "private edges": L2Model(capacity_fraction=0.75, associativity=48, replicate=True,
                             private_footprint=1.2, dirty_fraction=0.3,
                             private_rmw_capacity=0.9, private_read_capacity=1.1,
                             drain_fraction=0.05, partial_refetch=True),
    # the whole end-of-kernel drain counted (up to 2 C): its summands unclipped
    "full drain": L2Model(capacity_fraction=0.5, associativity=32, dirty_fraction=0.6,
                          drain_fraction=1.0, partial_refetch=True),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_is_the_reference_on_random_streams(name, seed):
    model = MODELS[name] or _fitted()
    st = _random_stream(seed, selfd=(seed == 2))
    caps = (40e6, 40e6 * 1.12, 40e6 * 0.88, 3e6, 1e9)
    assert mem_fused._fused_applies(model, caps)
    fused, ref = _both(st, caps, model)
    assert fused == ref                    # every capacity, reads and writes, to the bit
    assert dram_at_capacities(st, caps, model) == ref


def _levels_streams():
    """(stream, capacities) of a few passes of `iosim.memory` (small problems): fa1's
    private round trips near the edge, the causal fa2 forward, the standard backward, a
    spilling fa2_tc build (local-memory frames: selfd), the fast fa2 forward with grouped
    K/V at N = 32K (coarse tiles touched in part: the partial layers)."""
    from iosim.memory import access
    import iosim
    import iosim.memory as M
    cases = [("fa1", Problem(N=2048, d=64, heads=24, dtype="fp16"), "fwd", "tc", None,
              "H100-SXM"),
             ("fa2", Problem(N=8192, d=64, heads=4, dtype="fp16", causal=True), "fwd",
              "auto", None, "H100-SXM"),
             ("standard", Problem(N=1024, d=64, heads=4, dtype="fp16"), "bwd", "plain", None,
              "H100-SXM"),
             ("fa2", Problem(N=4096, d=64, heads=8, dtype="fp16"), "fwd", "tc",
              Tiling(128, 128), "H100-SXM"),
             ("fa2", Problem(N=32768, d=64, batch=2, heads=4, kv_heads=1, dtype="fp32"),
              "fwd", "auto", None, "H200")]
    out = []
    for alg, p, pass_, kern, tiling, gpu in cases:
        hw = get_hardware(gpu)
        plan = iosim.kernel_plan(alg, p, hw, pass_=pass_, kernel=kern, tiling=tiling)
        cap = M.FITTED.capacity_fraction * hw.l2_bytes
        lo, hi = M.CHIP_CAPACITY_RANGE
        for lau, build in access._launches_and_streams(p, plan, hw, M.FITTED):
            st = Stream()
            build(st, hw.sm_count * lau.ctas_per_sm)
            if st.size:
                out.append((st, (cap, cap * hi, cap * lo)))
    return out


def test_fused_is_the_reference_on_levels_streams():
    model = _fitted()
    streams = _levels_streams()
    assert any(st.has_selfd() for st, _ in streams)                       # frames
    assert any(mem_order._grows_a_tile(*mem_order._time_ordered(st, model)[:2]) for st, _ in streams)
    for st, caps in streams:
        fused, ref = _both(st, caps, model)
        assert fused == ref


def test_reference_where_the_fused_path_does_not_apply():
    st = _random_stream(3)
    caps = (40e6, 20e6)
    base = _fitted()
    for model in (dataclasses.replace(base, policy="random"),
                  dataclasses.replace(base, keep_fraction=0.2),
                  dataclasses.replace(base, refetch_factor=1.5),
                  dataclasses.replace(base, private_associativity=16)):
        assert not mem_fused._fused_applies(model, caps)
        acc = mem_order._time_ordered(st, model)
        assert dram_at_capacities(st, caps, model) == mem_dram._dram_reference(caps, model, *acc)
    assert not mem_fused._fused_applies(base, (40e6, 0.0))
    assert not mem_fused._fused_applies(base, (float("inf"),))


def test_partial_layers_exist_exactly_where_a_tile_grows():
    model = _fitted()
    for seed in range(4):
        acc = mem_order._time_ordered(_random_stream(seed), model)
        dense, nb, foot, d_prev = acc[0], acc[1], acc[9], acc[10]
        assert mem_order._grows_a_tile(dense, nb) == (mem_order._layers(dense, nb, foot, d_prev)[0].size > 0)
    st = Stream()
    st.add(np.arange(4.0), np.zeros(4, np.int64), [4e3, 4e3, 2e3, 1e3], True, False)
    acc = mem_order._time_ordered(st, model)
    assert not mem_order._grows_a_tile(acc[0], acc[1])


def test_pairwise_sum_is_numpys():
    assert mem_fused._numpy_sum_is_pairwise()
    rng = np.random.default_rng(5)
    for n in list(range(0, 600)) + [1023, 4096, 8193, 65536 + 13, 300_007]:
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)
        assert float(mem_fused._pairwise_sum(x)) == float(np.sum(x)), n
    prog = mem_fused._pairwise_program(1000)
    assert prog[prog >= 0].sum() == 1000 and (prog < 0).sum() == (prog >= 0).sum() - 1


def test_table_look_up_is_the_reference():
    x, y = mem_hits._poisson_cdf_table(96)
    sl = mem_hits._poisson_slopes(96)
    inv = (x.size - 1) / (x[-1] - x[0])
    rng = np.random.default_rng(6)
    C = 40e6
    D = np.concatenate([rng.uniform(-1e6, 3.0 * C, 20000), [-1.0, 0.0, -0.0, np.nan, np.inf],
                        x[::97] * C / 96.0, [x[-1] * C / 96.0, 1e30]])
    ref = mem_hits._hit_lru(D, 96.0, C, x, y, sl)
    one = np.array([mem_hits._hit_one(d, 96.0, C, x, y, sl, inv) for d in D])
    np.testing.assert_array_equal(one, ref)
    assert np.array_equal(mem_hits._interp_uniform(D / C, x, y, sl), np.interp(D / C, x, y, right=0.0),
                          equal_nan=True)


def test_stream_arrays_are_kept_until_the_next_add():
    st = Stream()
    st.add(np.arange(3.0), st.ids(3), 1e3, True, False)
    a = st.arrays()
    assert st.arrays() is a and st.size == 3 and not st.has_selfd()
    with pytest.raises(ValueError):
        a[2][0] = 5.0                      # read only: callers cannot change the stream
    st.add(np.arange(2.0), st.ids(2), 2e3, False, True, selfd=np.array([0.0, 3.0]))
    b = st.arrays()
    assert b is not a and st.size == 5 == b[0].size and st.has_selfd()
    assert st.has_selfd() == bool(np.any(st.selfd_array()))


def test_sweep_kernel_pieces_are_the_numpy_expressions():
    rng = np.random.default_rng(7)
    key = rng.integers(0, 4, (500, 5))
    key[:, 0] = rng.choice([0, 4607182418800017408, 4611686018427387904], 500)
    _, first, inv, counts = np.unique(key, axis=0, return_index=True, return_inverse=True,
                                      return_counts=True)
    f2, i2, c2 = mem_stream._unique_rows(key)
    assert np.array_equal(first, f2) and np.array_equal(inv.ravel(), i2)
    assert np.array_equal(counts, c2)
    m, q = 50, 3
    l = rng.integers(0, 40, m)
    h = l + rng.integers(0, 30, m)
    s0 = rng.integers(0, 100, m) / 2.0
    st = np.maximum(h - l, 0)
    c_lo, c_hi = l // q, np.where(st > 0, (h - 1) // q + 1, l // q)
    nc = np.maximum(c_hi - c_lo, 0)
    cta = np.repeat(np.arange(m), nc)
    off = np.arange(nc.sum()) - np.repeat(np.cumsum(nc) - nc, nc)
    cidx = c_lo[cta] + off
    a = np.maximum(cidx * q, l[cta])
    b = np.minimum(cidx * q + q, h[cta])
    got = mem_stream._sweep_groups(l, h, s0, c_lo, nc, q)
    for x, y in zip(got, (cta, cidx, (b - a).astype(np.float64),
                          s0[cta] + (a + b) / 2.0 - l[cta] + 0.5)):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("n,v,cps", [(1, 1.0, 1), (133, 1.0, 2), (264, 7.0, 2),
                                     (5_000_000, 1.0, 8), (40_000, 3.0, 1), (17, 0.5, 3),
                                     (0, 1.0, 2), (100, 0.0, 2)])
def test_uniform_work_is_the_array(n, v, cps):
    from iosim.timing.makespan import UniformWork, _work_excess, makespans
    hw = get_hardware("H100-SXM")
    u, a = UniformWork(n, v), np.full(n, v)
    assert makespans(u, hw, cps) == makespans(a, hw, cps)
    assert _work_excess(u) == _work_excess(a)
    if n:
        assert u.max() == float(np.max(a))


def test_list_makespan_is_the_schedules_latest_end():
    from iosim.timing.makespan import _list_makespan, _makespan
    rng = np.random.default_rng(8)
    for n, machines in ((1, 4), (50, 132), (3000, 132), (20000, 1056), (777, 1)):
        work = rng.integers(1, 300, n).astype(np.float64) * rng.choice([1.0, 0.37], n)
        ref = float((mem_schedule._schedule(work, machines) + work).max())
        assert _list_makespan(work, machines) == ref
        assert _makespan(work, machines, False) == ref
    work = np.array([1.0, np.nan, 2.0])
    assert np.isnan(_list_makespan(work, 2)) and np.isnan((mem_schedule._schedule(work, 2) + work).max())


def test_time_order_is_the_stable_argsort():
    rng = np.random.default_rng(9)
    for t in (np.round(rng.uniform(0, 500, 5000) * 2) / 2, rng.integers(0, 3, 100) * 1.0,
              np.array([3.0])):
        assert np.array_equal(mem_order._half_step_order(t, 4 * t.size + 65536),
                              np.argsort(t, kind="stable"))
    assert mem_order._half_step_order(np.array([0.0, 0.25]), 100).size == 0      # not half steps
    assert mem_order._half_step_order(np.array([0.0, 1e9]), 100).size == 0       # range too long
