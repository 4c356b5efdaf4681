"""The models below the ledger: the hierarchy engine (stack distances, the cache model),
the kernel plans, the L2 / DRAM levels of each pass, the time model and the CLI."""
import json

import numpy as np
import pytest

from iosim import Problem, Tiling, closed_form, get_hardware
from iosim.memory import L2Model, Stream, dram_from_stream, hit_probability
from iosim.memory.hits import _distances
from iosim.memory.schedule import _schedule


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------
def _brute_distances(blk, nbytes):
    """Distinct bytes between consecutive accesses of a tile, by direct counting."""
    n = len(blk)
    d_prev = np.full(n, -1.0)
    d_next = np.full(n, -1.0)
    for k in range(n):
        prev = [p for p in range(k) if blk[p] == blk[k]]
        if prev:
            p = prev[-1]
            seen = {}
            for q in range(p + 1, k):
                seen[blk[q]] = nbytes[q]          # a tile's latest size counts
            d_prev[k] = sum(seen.values())
            d_next[p] = d_prev[k]
    for k in range(n):                            # last accesses: distinct bytes after them
        if not any(blk[q] == blk[k] for q in range(k + 1, n)):
            seen = {}
            for q in range(k + 1, n):
                seen[blk[q]] = nbytes[q]
            d_next[k] = sum(seen.values())
    return d_prev, d_next


@pytest.mark.parametrize("seed", range(5))
def test_stack_distances_equal_direct_count(seed):
    rng = np.random.default_rng(seed)
    n = 60
    blk = rng.integers(0, 12, n).astype(np.int64)
    size = rng.integers(1, 100, 12).astype(np.float64)
    nbytes = size[blk]                            # one size per tile
    d_prev, d_next = _distances(blk, nbytes)
    b_prev, b_next = _brute_distances(blk, nbytes)
    np.testing.assert_allclose(d_prev, b_prev)
    np.testing.assert_allclose(d_next, b_next)


def test_hit_probability_limits():
    C = 1e6
    assert hit_probability(-1.0, C, 16) == 0.0            # first access: a miss
    assert hit_probability(0.0, C, 16) == pytest.approx(1.0)
    D = np.linspace(0, 3e6, 50)
    p = hit_probability(D, C, 16)
    assert np.all(np.diff(p) <= 1e-12)                    # farther -> less likely resident
    assert p[D < 0.5 * C].min() > 0.99 and p[D > 2 * C].max() < 0.01
    # many ways: the LRU edge at C
    big = hit_probability(np.array([0.9e6, 1.1e6]), C, 4096)
    assert big[0] > 0.99 and big[1] < 0.01


def test_schedule_is_list_scheduling():
    start = _schedule(np.array([3.0, 1.0, 1.0, 2.0]), 2)
    np.testing.assert_allclose(start, [0, 0, 1, 2])


def test_stream_reuse_within_and_beyond_capacity():
    """A tile read twice with less than C between is read once from DRAM; with far more
    than C in between, twice. Dirty tiles reach DRAM only if evicted before the end."""
    model = L2Model(1.0, 4096)
    C = 1000.0
    st = Stream()
    st.add(np.arange(3.0), np.array([1, 2, 1]), 100.0, True, False)
    r, w, _ = dram_from_stream(st, C, model)
    assert r == pytest.approx(200.0) and w == 0.0
    st = Stream()
    st.add(np.arange(3.0), np.array([1, 2, 1]), np.array([100.0, 5000.0, 100.0]), True, False)
    assert dram_from_stream(st, C, model)[0] == pytest.approx(5200.0)
    st = Stream()                                 # a write, then much traffic: written back
    st.add([0.0, 1.0], [7, 8], [100.0, 5000.0], [False, True], [True, False])
    assert dram_from_stream(st, C, model)[1] == pytest.approx(100.0)
    st = Stream()                                 # a write at the end: still in L2
    st.add([0.0, 1.0], [8, 7], [500.0, 100.0], [True, False], [False, True])
    assert dram_from_stream(st, C, model)[1] == pytest.approx(0.0, abs=1e-6)


def test_l2model_rejects_bad_constants():
    with pytest.raises(ValueError, match="capacity_fraction"):
        L2Model(0.0, 16)
    with pytest.raises(ValueError, match="associativity"):
        L2Model(0.5, 0)


# ---------------------------------------------------------------------------------------
# Plans and levels
# ---------------------------------------------------------------------------------------
from analysis import fit_levels as FL
from iosim.launch import plan
import iosim  # noqa: E402  (imports gpu in the simulator)


@pytest.mark.parametrize("args, want", [
    (("fa2", "fp16", 64, False), ("tc", 128, 64)),
    (("fa2", "fp16", 64, True), ("tc", 64, 64)),
    (("fa2", "fp16", 128, False), ("tc", 64, 64)),
    (("fa2", "fp32", 64, False), ("fast", 256, 32)),
    (("fa2", "fp32", 128, False), ("fast", 64, 32)),
    (("fa1", "fp32", 64, False), ("default", 32, 32)),
    (("standard", "fp16", 64, False), ("default", 64, 64)),
])
def test_kernel_plan_is_what_the_gpu_runs(args, want):
    """The plans the H100 measurements ran (benchmarks/results: levels_measurement's tiling
    column) are what kernel_plan gives for the H100 preset, without a GPU (fa1 and standard
    ran their plain kernels then: kernel='plain' names them now)."""
    alg, dt, d, causal = args
    kernel = "auto" if alg == "fa2" else "plain"
    plan = iosim.kernel_plan(alg, Problem(N=4096, d=d, heads=16, dtype=dt, causal=causal),
                         get_hardware("H100-SXM"), kernel=kernel)
    assert (plan.kernel, plan.tiling.B_r, plan.tiling.B_c) == want


@pytest.mark.parametrize("alg, pass_, dt, runs, names, flagged", [
    ("standard", "fwd", "fp16", "tc", ["std_tc_S", "std_tc_softmax", "std_tc_PV"], False),
    ("fa1", "fwd", "fp16", "tc", ["fa1_tc"], False),
    ("fa2", "bwd", "fp16", "tc", ["fa2_bwd_pre", "fa2_bwd_tc", "bwd_convert"], False),
    ("fa2", "bwd", "fp32", "fast", ["fa2_bwd_pre_fast", "fa2_bwd_fast", "bwd_convert"], False),
    ("standard", "bwd", "fp16", "tc", ["std_tc_bwd_dV", "std_tc_bwd_dP", "std_tc_bwd_dS",
                                       "std_tc_bwd_dQ", "std_tc_bwd_dK"], False),
    ("standard", "fwd", "fp32", "fast", ["std_fast_S", "std_fast_softmax", "std_fast_PV"], True),
    ("fa1", "fwd", "fp32", "fast", ["fa1_fast"], True)])
def test_newer_default_kernels_are_planned_and_flagged(alg, pass_, dt, runs, names, flagged):
    """Where gpu now runs the tensor-core fa1 / standard / backward kernels or the fast fp32
    kernels by default, levels models those launches (their default tilings and
    geometry); those with few Nsight Compute rows (the fast fp32 standard / fa1 forward)
    are flagged; kernel='plain' still models the plain ones."""
    p = Problem(N=2048, d=64, heads=4, dtype=dt)
    hw = get_hardware("H100-SXM")
    plan = iosim.kernel_plan(alg, p, hw, pass_=pass_)
    assert plan.kernel == runs
    r = iosim.levels(alg, p, hw, pass_=pass_)
    assert [k["name"] for k in r["kernels"]] == names
    assert any("few Nsight Compute rows" in w for w in r["warnings"]) == flagged
    assert 0 < r["dram_read_bytes"] <= 1.01 * r["requested_read_bytes"]
    assert iosim.kernel_plan(alg, p, hw, pass_=pass_, kernel="plain").kernel == "default"
    plain = iosim.levels(alg, p, hw, pass_=pass_, kernel="plain")
    assert not any("few Nsight Compute rows" in w for w in plain["warnings"])


def test_levels_new_configurations_are_planned():
    """The pre-registered configurations of the newer kernels have plans (<= 16)."""
    from analysis.validation_configs import LEVELS_NEW, SETS
    assert 0 < len(LEVELS_NEW) <= 16 and SETS["levels_new"] is LEVELS_NEW
    assert len({c["id"] for c in LEVELS_NEW}) == len(LEVELS_NEW)
    for c in LEVELS_NEW:
        plan = iosim.kernel_plan(c["algorithm"], FL.problem_of(c), get_hardware("H100-SXM"),
                             pass_=c["pass"], kernel=FL.config_kernel(c))
        assert plan.kernel == c["kernel"], c["id"]


@pytest.mark.parametrize("alg, want", [("standard", (128, 128, 256)), ("fa1", (128, 128, 512))])
def test_fast_fp32_forward_plan(alg, want):
    """gpu runs the fast fp32 standard / fa1 forward kernels (gpu.forward.standard_fast,
    fa1_fast) by default: levels plans them with gpu.api's default tiling at d = 64 and
    the plain kernels' schedule (same ledger); kernel='plain' still models the plain ones."""
    p = Problem(N=1024, d=64, heads=4, dtype="fp32")
    hw = get_hardware("H100-SXM")
    plan = iosim.kernel_plan(alg, p, hw)
    assert (plan.kernel, plan.tiling.B_r, plan.tiling.B_c, plan.threads) == ("fast",) + want
    assert iosim.kernel_plan(alg, p, hw, kernel="plain").kernel == "default"
    r = iosim.levels(alg, p, hw)
    led = closed_form(alg, p, Tiling(*want[:2]))
    assert r["requested_read_bytes"] == led.hbm_read_bytes
    assert 0 < r["dram_read_bytes"] <= r["requested_read_bytes"]


def test_occupancy_limits():
    hw = get_hardware("H100-SXM")
    assert plan.occupancy(hw, 256, 55_000, 128) == 2          # registers: 128 x 256 = 32 K
    assert plan.occupancy(hw, 128, 100_000, 32) == 2          # shared memory
    assert plan.occupancy(hw, 1024, 0, 32) == 2               # warps: 64 per SM


def test_levels_compulsory_when_everything_fits():
    """fa2 at N = 4096, 16 heads (25 MB of Q, K, V): DRAM reads are Q + K + V once, though
    the kernel requests K and V 32 times; L2 sees the requests (x1.5 for fa2_tc)."""
    p = Problem(N=4096, d=64, heads=16, dtype="fp16")
    r = iosim.levels("fa2", p, "H100-SXM")
    qkv = 3 * 16 * 4096 * 64 * 2
    led = closed_form("fa2", p, Tiling(128, 64))
    assert r["requested_read_bytes"] == led.hbm_read_bytes
    assert r["l2_read_bytes"] == pytest.approx(1.5 * led.hbm_read_bytes)
    assert r["dram_read_bytes"] == pytest.approx(qkv, rel=0.02)
    assert 0 <= r["dram_write_bytes"] <= r["requested_write_bytes"]


def test_levels_rereads_when_kv_does_not_fit_and_l2_size_matters():
    p = Problem(N=131072, d=64, heads=1, dtype="fp16")     # K + V = 33.5 MB per head
    h100 = iosim.levels("fa2", p, "H100-SXM")
    a100 = iosim.levels("fa2", p, "A100-40GB")
    qkv = 3 * 131072 * 64 * 2
    assert h100["dram_read_bytes"] > 1.5 * qkv
    assert a100["dram_read_bytes"] >= h100["dram_read_bytes"]


def test_levels_bounded_by_requests_for_every_pass():
    for alg, pass_, dt in (("fa1", "fwd", "fp32"), ("standard", "fwd", "fp16"),
                           ("fa2", "bwd", "fp16"), ("standard", "bwd", "fp32")):
        p = Problem(N=1024, d=64, heads=4, dtype=dt, causal=True)
        r = iosim.levels(alg, p, "H100-SXM", pass_=pass_, kernel="plain")
        assert 0 < r["dram_read_bytes"] <= 1.01 * r["requested_read_bytes"], (alg, pass_)
        assert 0 <= r["dram_write_bytes"] <= 1.01 * r["requested_write_bytes"], (alg, pass_)


def test_levels_rejects_what_it_does_not_model():
    m = np.ones((4, 4), dtype=bool)
    with pytest.raises(ValueError, match="block_mask"):
        iosim.levels("fa2", Problem(N=256, d=64, block_mask=m), "H100-SXM")
    with pytest.raises(ValueError, match="grid_order"):
        iosim.levels("fa1", Problem(N=256, d=64), "H100-SXM", grid_order="head-major",
                 kernel="plain")
    with pytest.raises(ValueError, match="grid_order"):
        iosim.levels("fa2", Problem(N=256, d=64), "H100-SXM", grid_order="diagonal")


# ---------------------------------------------------------------------------------------
# The time model
# ---------------------------------------------------------------------------------------
def test_runtime_prediction_has_a_breakdown():
    from iosim import predict_time
    t = predict_time("standard", Problem(N=2048, d=64, heads=16, dtype="fp16"), "H100-SXM",
                kernel="plain")
    assert [x["family"].split("_fp")[0] for x in t["launches"]] == ["std_S", "std_softmax", "std_PV"]
    assert t["predicted_ms"] == pytest.approx(sum(x["predicted_ms"] for x in t["launches"]))
    for x in t["launches"]:
        assert sum(x["share"].values()) == pytest.approx(1.0)
        assert x["binds"] in x["terms_ms"]


def test_runtime_latency_rounds_of_the_fast_fa1():
    """Form 7: the fast fa1 (a lone CTA per instance, element-wise step-8 loads) carries a
    latency term, reported with the others; shares still sum to one."""
    from iosim import predict_time
    t = predict_time("fa1", Problem(N=2048, d=128, heads=16, dtype="fp32"), "H100-SXM",
                kernel="fast")
    (x,) = t["launches"]
    assert x["terms_ms"]["latency"] > 0
    assert sum(x["share"].values()) == pytest.approx(1.0)
    assert x["predicted_ms"] == pytest.approx(
        t["constants"]["t_launch_ms"] + x["terms_ms"]["latency"]
        + sum((v * (max(1.0, x["imbalance"] / t["constants"]["g_mem"]) if k in ("l2", "dram")
                    else x["imbalance"])) ** 4 for k, v in x["terms_ms"].items()
              if k != "latency") ** 0.25)


def test_imbalance_waves_and_causal():
    from iosim.timing import imbalance, makespans
    hw = get_hardware("H100-SXM")
    f = dict(makespans(np.ones(264), hw, 2), warps=8)
    assert imbalance(f, 8.0) == pytest.approx(1.0)
    f = dict(makespans(np.ones(133), hw, 2), warps=8)          # one CTA too many: 2 waves
    assert imbalance(f, 8.0) == pytest.approx(2 * 132 / 133)
    f = dict(makespans(np.ones(16), hw, 2), warps=4)           # 16 CTAs, half an SM each
    assert imbalance(f, 8.0) == pytest.approx(2 * 132 / 16)


def test_committed_validation_rows_are_current():
    """The data set's validation rows were made by this model: recomputing a few gives the
    same predictions (a stale row would not)."""
    from analysis import results
    from analysis.fit_runtime import validate
    from iosim.timing import RuntimeModel
    from analysis.validate import BLIND_SPLITS
    rows = results.load("runtime_validation")
    meas = {(r["run_id"], r["config"]["id"]): r for r in results.load("runtime_measurement")}
    m = RuntimeModel.load()
    for v in [r for r in rows if r["split"] not in BLIND_SPLITS][::97]:
        r = meas[(v["run_id"], v["config"]["id"])]
        again = validate([r], m, v["gpu_preset"])[0]
        assert again["predicted_ms"] == pytest.approx(v["predicted_ms"], rel=1e-6)
    lrows = results.load("levels_validation")
    lmeas = {(r["run_id"], r["config"]["id"]): r for r in results.load("levels_measurement")}
    for v in [r for r in lrows if "frozen_commit" not in r][::23]:   # not a frozen score
        p = FL.predict_row(v["config"], v["gpu_preset"])
        assert p["dram_read_bytes"] == pytest.approx(v["predicted"]["dram_read_bytes"], rel=1e-6)
        assert (v["run_id"], v["config"]["id"]) in lmeas


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------
def test_traffic_levels_json(capsys):
    from analysis.cli import main
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "4096", "--head-dim", "64",
               "--heads", "16", "--gpu", "H200", "--levels", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for k in ("l2_read_bytes", "l2_write_bytes", "dram_read_bytes", "dram_write_bytes",
              "predicted_ms"):
        assert out[k] > 0
    assert out["block_rows"] == 128 and out["kernel"] == "tc"


@pytest.mark.parametrize("argv, word", [
    (["--kernel", "tc"], "--levels"),
    (["--levels", "--sram-bytes", "98304"], "sram"),
    (["--levels", "--block-rows", "64"], "block_cols"),
    (["--levels", "--kernel", "tc", "--dtype", "fp32"], "tc"),
])
def test_traffic_levels_bad_input_one_line(argv, word, capsys):
    from analysis.cli import main
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "1024", "--head-dim", "64"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and word in err[0]


def test_random_replacement_keeps_part_of_an_overflowing_cycle():
    """Under LRU a cyclic sweep just larger than C misses every time; under random
    replacement part of it survives (the alternative policy of iosim.memory)."""
    C = 1000.0
    st = Stream()
    blk = np.tile(np.arange(12), 20)                      # 12 x 100 bytes, cycled 20 times
    st.add(np.arange(blk.size, dtype=float), blk, 100.0, True, False)
    lru = dram_from_stream(st, C, L2Model(1.0, 4096))[0]
    rnd = dram_from_stream(st, C, L2Model(1.0, 16, policy="random"))[0]
    total = 100.0 * blk.size
    assert lru == pytest.approx(total, rel=1e-6)
    assert 1200.0 < rnd < 0.8 * total


# ---------------------------------------------------------------------------------------
# The L2 model's mechanisms (issue 14, second pass)
# ---------------------------------------------------------------------------------------
def test_distances_with_fractional_footprints_stay_non_negative():
    """Rounding in the Fenwick sums once made a re-access at distance ~0 read as 'no
    earlier access' (-1, a compulsory miss) whenever footprints were not integers (x0.9,
    x1.5): a tile re-read at once must have distance >= 0."""
    rng = np.random.default_rng(1)
    blk = np.repeat(rng.integers(0, 50, 4000), 2)          # every access repeated at once
    nbytes = rng.random(50)[blk] * 0.9 * 16384.3
    d_prev, _ = _distances(blk.astype(np.int64), nbytes)
    first = np.r_[True, np.zeros(blk.size - 1, bool)]
    seen = set()
    for k, b in enumerate(blk):
        first[k] = b not in seen
        seen.add(b)
    assert np.all(d_prev[~first] >= 0.0)
    assert np.all(d_prev[1::2] < 1e-6)                     # the immediate repeats


def _cycle(n_tiles, tile, rounds):
    st = Stream()
    blk = np.tile(np.arange(n_tiles), rounds)
    st.add(np.arange(blk.size, dtype=float), blk, tile, True, False)
    return st, blk.size * tile


def test_keep_fraction_keeps_c_over_footprint_of_a_cycle_just_over_capacity():
    """A cyclic sweep of footprint F = 1.2 C: LRU misses every access; with the insertion
    policy's protection (keep_fraction = 1) about C / F of each sweep hits."""
    C = 1000.0
    st, total = _cycle(12, 100.0, 50)
    first = 1200.0
    lru = dram_from_stream(st, C, L2Model(1.0, 4096))[0]
    kept = dram_from_stream(st, C, L2Model(1.0, 4096, keep_fraction=1.0))[0]
    assert lru == pytest.approx(total, rel=1e-6)
    hit = 1.0 - (kept - first) / (total - first)
    # the stack distance D = F - one tile = 1100 (the distinct bytes in between)
    assert hit == pytest.approx(C / 1100.0, rel=0.02)
    # below capacity nothing changes
    st, _ = _cycle(8, 100.0, 50)
    assert dram_from_stream(st, C, L2Model(1.0, 4096, keep_fraction=1.0))[0] == pytest.approx(800.0)


def test_partitioned_l2_holds_shared_tiles_twice():
    """replicate: a tile touched by CTAs on both L2 partitions occupies twice its bytes,
    so a shared cycle of 0.7 C thrashes where the same private cycle fits."""
    C = 1000.0
    m = L2Model(1.0, 4096, replicate=True, private_footprint=1.0)
    for shared, want in ((False, 700.0), (True, 700.0 * 30)):
        st = Stream()
        blk = np.tile(np.arange(7), 30)
        st.add(np.arange(blk.size, dtype=float), blk, 100.0, True, False, shared=shared)
        assert dram_from_stream(st, C, m)[0] == pytest.approx(want, rel=1e-6), shared


def test_dirty_cap_bounds_what_stays_dirty_at_the_end():
    """A kernel that only writes W >> C bytes leaves C_w = dirty_fraction x L2 of them
    dirty at its end (the rest reached DRAM), not C: Nsight Compute's ~20 MB on the H100
    for standard's S and the backward's dP. Reads are unaffected (clean lines stay)."""
    L2 = 1000.0
    st = Stream()
    st.add(np.arange(100, dtype=float), np.arange(100), 100.0, False, True)    # 10 C written
    no_cap = dram_from_stream(st, 0.8 * L2, L2Model(0.8, 4096))[1]
    cap = dram_from_stream(st, 0.8 * L2, L2Model(0.8, 4096, dirty_fraction=0.4))[1]
    assert 10_000 - no_cap == pytest.approx(800.0, abs=100.0)
    assert 10_000 - cap == pytest.approx(400.0, abs=100.0)
    # a tile rewritten with little dirty data in between is written back once, at most
    st = Stream()
    blk = np.tile(np.arange(3), 40)
    st.add(np.arange(blk.size, dtype=float), blk, 100.0, True, True)
    r, w, _ = dram_from_stream(st, 0.8 * L2, L2Model(0.8, 4096, dirty_fraction=0.4))
    assert r == pytest.approx(300.0) and w == pytest.approx(0.0, abs=1e-6)


def test_end_of_kernel_drain_counts_part_of_the_resident_dirty_data():
    """drain_fraction: of the dirty bytes resident at the kernel's end, at most
    drain_fraction x L2 are counted as DRAM writes (the write-back as the kernel retires);
    evicted writes and reads are unchanged."""
    L2 = 1000.0
    st = Stream()
    st.add(np.arange(3, dtype=float), np.arange(3), 100.0, False, True)     # 300 B, all fit
    base = dram_from_stream(st, 0.8 * L2, L2Model(0.8, 4096))
    assert base[1] == pytest.approx(0.0, abs=1e-9)
    for f, want in ((0.06, 60.0), (0.5, 300.0)):
        r, w, _ = dram_from_stream(st, 0.8 * L2, L2Model(0.8, 4096, drain_fraction=f))
        assert r == base[0] and w == pytest.approx(want), f
    # a tile written, then read last: still dirty at the end, counted
    st = Stream()
    st.add([0.0, 1.0], [0, 0], 100.0, [False, True], [True, False])
    assert dram_from_stream(st, 800.0, L2Model(0.8, 4096, drain_fraction=1.0))[1] == \
        pytest.approx(100.0)


def test_shared_footprint_sets_the_replicated_bytes():
    """shared_footprint: a shared cycle of 0.7 C thrashes at x2 (1.4 C) and fits at x1.25
    (0.875 C) in a (nearly) fully associative cache."""
    C = 1000.0
    for sf, want in ((2.0, 700.0 * 30), (1.25, 700.0)):
        st = Stream()
        blk = np.tile(np.arange(7), 30)
        st.add(np.arange(blk.size, dtype=float), blk, 100.0, True, False, shared=True)
        m = L2Model(1.0, 4096, replicate=True, private_footprint=1.0, shared_footprint=sf)
        assert dram_from_stream(st, C, m)[0] == pytest.approx(want, rel=1e-6), sf
    with pytest.raises(ValueError):
        L2Model(shared_footprint=2.5)
    with pytest.raises(ValueError):
        L2Model(drain_fraction=-0.1)


def test_spill_frames_are_one_tile_per_slot():
    """A spilling build's stack frame lives at its SM slot's local-memory addresses: the
    CTAs that follow in a slot rewrite the same lines, so few frames reach DRAM when the
    CTAs are short (here: 4 slots, 64 CTAs, everything fits in C)."""
    from iosim.memory import sweep_kernel
    st = Stream()
    n = 64
    sweep_kernel(st, group=np.zeros(n), lo=np.zeros(n), hi=np.full(n, 4), step_bytes=10.0,
                 frame_bytes=50.0, slots=4, budget=10_000, n_seq=4)
    t, blk, nb, rd, wr, w, wb, sh = st.arrays()
    frames = blk >= (7 << 40)
    assert np.unique(blk[frames]).size <= 4 and nb[frames].sum() == pytest.approx(50.0 * n)
    r, wrt, _ = dram_from_stream(st, 1e6, L2Model(1.0, 4096))
    assert wrt == pytest.approx(0.0, abs=1e-6)                 # all still resident at the end


def test_levels_blind_predictions_and_scorer(tmp_path):
    """The frozen LEVELS_BLIND predictions cover the 14 passes, name a commit of this
    repository's history, and the scorer joins measured counter rows with them (rows with
    an error skipped), writing levels_validation rows with split "blind"."""
    import json
    import subprocess
    from analysis import validate as V
    from analysis.validation_configs import LEVELS_BLIND
    frozen = json.loads(V.LEVELS_BLIND_PREDICTIONS.read_text())
    assert [p["id"] for p in frozen["predictions"]] == [c["id"] for c in LEVELS_BLIND]
    ok = subprocess.run(["git", "merge-base", "--is-ancestor", frozen["frozen_commit"], "HEAD"],
                        cwd=V.ROOT, capture_output=True)
    assert ok.returncode == 0
    meas = []
    for i, p in enumerate(frozen["predictions"][:3]):
        m = {k: p["predicted"][k] * (1.2 if i == 1 else 1.0) for k in FL.LEVEL_KEYS}
        meas.append({"config": p["config"], "measured": m, "run_id": "r", "device": "d",
                     "date": "x", "commit": "c", "versions": {}})
    meas.append({"config": frozen["predictions"][3]["config"], "error": "failed"})
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in meas))
    rows = V.levels_blind(f, V.LEVELS_BLIND_PREDICTIONS, tmp_path / "v.jsonl")
    assert len(rows) == 3 and all(r["split"] == "blind" for r in rows)
    assert all(rows[0]["within_bound"].values())
    assert rows[1]["rel_error"]["dram_read_bytes"] == pytest.approx(1 / 1.2 - 1)
    assert len((tmp_path / "v.jsonl").read_text().splitlines()) == 3


def test_runtime_blind_scoring_joins_frozen_predictions(tmp_path):
    """The blind scorer joins measured rows with the frozen predictions: failed
    measurements and configurations the model cannot predict are reported, not dropped."""
    from analysis import validate as V
    pred = json.load(open(V.RUNTIME_BLIND_PREDICTIONS))
    assert pred["frozen_commit"] and len(pred["configs"]) == 47
    meas = []
    for i, c in enumerate(pred["configs"][:-1]):
        if i == 0:
            meas.append({"config": c["config"], "error": "RuntimeError: boom"})
            continue
        ms = 1.1 * (c.get("predicted_ms") or 1.0)
        meas.append({"config": c["config"], "tiling": c.get("tiling"), "run_id": "run-x",
                     "device": "GPU X", "date": "2026-01-01",
                     "measured": {"measured_ms": ms, "kernels": [{"name": "x", "ms": ms}]}})
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in meas) + "\n")
    rows = V.score_runtime_blind(str(path), write=False)
    status = [r["status"] for r in rows]
    assert len(rows) == 47 and status.count("measurement_failed") == 1
    assert status.count("not_measured") == 1 and status.count("cannot_predict") == 4
    # the configuration the run did not reach is a row of that run (device, run_id, date)
    (missing,) = [r for r in rows if r["status"] == "not_measured"]
    assert (missing["device"], missing["run_id"], missing["date"]) == \
        ("GPU X", "run-x", "2026-01-01")
    assert missing["frozen_model_commit"] == pred["frozen_commit"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(r["split"] == "blind" and abs(r["rel_error"] + 1 / 11) < 1e-9 for r in ok)
