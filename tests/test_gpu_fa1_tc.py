"""gpu.forward.fa1_tc: FlashAttention (Algorithm 1 as written) for fp16 on the tensor cores.

Without a GPU: the argument rules and the shared-memory layout; the kernel's own Python
(schedule, counts, masking, statistics, non-finite rules) in the CUDA simulator with its
C++ pieces and warp shuffles emulated (tests/fa1_tc_sim.py); and that the default
specialisations build and link (NVVM + NVRTC + nvJitLink, no GPU) into code with mma.sync
in it, the C++ inlined, nothing in local memory, no float64 and no register spills
(ptxas). Tests marked `gpu` run the real kernel.

Accuracy criterion (the existing fa1 kernel's, Algorithm 1's own): O is stored in fp16
after every key block, so its error grows with T_c; the bound is 2 x the error of the
float32/fp16 model of that schedule (iosim.execute('fa1', ...): O rounded to fp16 at
every write), against float64 attention of the same inputs. Counts: the kernel's own
element counts equal iosim.closed_form('fa1', ...) exactly. Outputs are poisoned with NaN
before each launch, so an unwritten element shows.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import _background
import iosim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------
def test_plan_error_names_the_parameter():
    from gpu.forward import fa1_tc
    assert fa1_tc.plan_error(128, 128, 64, "fp16") is None
    assert fa1_tc.plan_error(16, 16, 16, "fp16") is None
    assert fa1_tc.plan_error(128, 64, 64, "fp16", MT=2) is None
    assert "fp16 or bf16" in fa1_tc.plan_error(128, 64, 64, "fp32")
    assert fa1_tc.DTYPES == ("fp16", "bf16")
    assert fa1_tc.plan_error(128, 64, 64, "bf16") is None
    assert "d=40" in fa1_tc.plan_error(128, 64, 40, "fp16")
    assert "d=256" in fa1_tc.plan_error(128, 64, 256, "fp16")
    assert "B_r=48" in fa1_tc.plan_error(48, 64, 64, "fp16")
    assert "B_r=256" in fa1_tc.plan_error(256, 64, 64, "fp16")
    assert "B_c=8" in fa1_tc.plan_error(128, 8, 64, "fp16")
    assert "B_c=144" in fa1_tc.plan_error(128, 144, 64, "fp16")
    assert "MT=3" in fa1_tc.plan_error(96, 64, 64, "fp16", MT=3)
    assert "B_r=16" in fa1_tc.plan_error(16, 64, 64, "fp16", MT=2)
    assert fa1_tc.plan_error(128, 128, 64, "fp16", stages=3) is None
    assert "stages=4" in fa1_tc.plan_error(128, 128, 64, "fp16", stages=4)


def test_default_tiling_is_supported_and_fits_the_h100():
    from gpu.forward import fa1_tc
    for d in (16, 32, 48, 64, 80, 96, 128):
        for causal in (False, True):
            t = fa1_tc.default_tiling(d, causal)
            assert fa1_tc.plan_error(t["B_r"], t["B_c"], d, "fp16", t["MT"], t["stages"]) is None
            assert fa1_tc.layout(t["B_r"], t["B_c"], d, t["stages"])["bytes"] <= 232448


@pytest.mark.parametrize("B_r,B_c,d,stages", [(128, 128, 64, 3), (128, 64, 128, 2),
                                              (16, 48, 48, 2)])
def test_layout_regions_are_16_byte_aligned_and_disjoint(B_r, B_c, d, stages):
    from gpu.forward import fa1_tc
    lay = fa1_tc.layout(B_r, B_c, d, stages)
    SW = lay["SW"]
    assert lay["SH"] == d + 8 and (2 * lay["SH"]) % 16 == 0
    assert ((2 * lay["SH"]) % 128) // 16 % 2 == 1       # conflict-free ldmatrix phases
    # slot: Q | O | l | m; then two K | V buffers; back to back
    assert (lay["QO"], lay["OO"], lay["LS"], lay["MS"]) == (0, B_r * SW, 2 * B_r * SW,
                                                            2 * B_r * SW + B_r)
    assert lay["SLOT"] == lay["MS"] + B_r and lay["KB"] == stages * lay["SLOT"]
    assert lay["VO"] == B_c * SW and lay["KV"] == 2 * B_c * SW
    assert lay["words"] == lay["KB"] + 2 * lay["KV"] and lay["bytes"] == 4 * lay["words"]
    # cp.async 16-byte destinations: every fp16 region starts at a multiple of 4 words
    for s in range(stages):
        for off in (lay["QO"], lay["OO"]):
            assert (s * lay["SLOT"] + off) % 4 == 0
    for b in (0, 1):
        for off in (lay["KO"], lay["VO"]):
            assert (lay["KB"] + b * lay["KV"] + off) % 4 == 0


def test_run_refuses_fp32_and_a_wrong_thread_count():
    from gpu.forward import fa1_tc
    assert fa1_tc.threads_per_block(128, 1) == 256 and fa1_tc.threads_per_block(128, 2) == 128
    kw = dict(B_r=128, B_c=128, causal=False, count=False)
    with pytest.raises(ValueError, match=r"dt='fp32'; the tensor-core kernel takes "
                                         r"\('fp16', 'bf16'\)"):
        fa1_tc.run(None, None, None, None, None, None, 0.1, 64, 1, 1, None, None, dt="fp32",
                   **kw)
    q = np.zeros((1, 64, 64), np.float16)
    # bf16 data arrive as uint16 bits: float16 arrays with dt='bf16' are refused
    with pytest.raises(ValueError, match="q: the tensor-core kernel fa1_tc takes "
                                         "dt='bf16' data as uint16 arrays"):
        fa1_tc.run(q, q, q, q, None, None, 0.1, 64, 1, 1, None, None, dt="bf16", **kw)
    with pytest.raises(ValueError, match="threads must be 256"):
        fa1_tc.run(q, q, q, q, None, None, 0.1, 64, 1, 1, None, None, dt="fp16",
                   threads=128, **kw)


def test_supports_is_false_in_the_simulator_or_for_bad_shapes():
    from gpu.forward import fa1_tc
    from gpu._launch import SIM
    assert not fa1_tc.supports(48, 64, 64)
    assert not fa1_tc.supports(128, 128, 64, smem_limit=1000)
    if SIM:
        assert not fa1_tc.supports(128, 128, 64)


# ---------------------------------------------------------------------------------------
# What a run must give (simulator with emulated C++, or a GPU)
# ---------------------------------------------------------------------------------------
def _inputs(N, d, B=1, H=1, Hk=1, causal=False, mask=None, seed=0, nan_row=None):
    p = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype="fp16", causal=causal,
                      block_mask=mask)
    q, k, v = iosim.random_inputs(p, seed)
    if nan_row is not None:
        q = q.copy()
        q[0, 0, nan_row, 1] = np.nan
    return p, q, k, v


def check_run(p, tiling, q, k, v, O, l, m, ledger_counts):
    """Counts exact; O written everywhere, NaN exactly where the fp16 model of Algorithm 1
    has NaN, error <= 2x the model's; l, m as the model's; a row that sees no key: O = 0,
    l = 0, m = -inf."""
    ex = iosim.execute("fa1", p, tiling, q, k, v)
    cf = iosim.closed_form("fa1", p, tiling)
    assert ledger_counts == cf.counts(), (ledger_counts, cf.counts())
    assert np.array_equal(np.isnan(O), np.isnan(ex.O)), "NaN where the model has none (or not)"
    ref = iosim.reference_attention(q, k, v, causal=p.causal, block_mask=p.block_mask,
                                    B_r=tiling.B_r, B_c=tiling.B_c)
    rows = np.isfinite(ref).all(-1) & (np.abs(ref).sum(-1) > 0)
    if rows.any():
        def err(X):
            return (np.linalg.norm((X.astype(np.float64) - ref)[rows])
                    / np.linalg.norm(ref[rows]))
        assert err(O) <= 2 * err(ex.O), (err(O), err(ex.O))
    lm, mm = ex.stats["l"], ex.stats["m"]
    fin = np.isfinite(lm)
    np.testing.assert_allclose(l[fin], lm[fin], rtol=2e-3)
    np.testing.assert_allclose(m[fin], mm[fin], rtol=1e-5, atol=1e-5)
    assert np.isnan(l[~fin]).all()
    # rows that see no key keep the initial values
    unseen = np.isneginf(mm) & (lm == 0)
    assert (O[unseen] == 0).all() and (l[unseen] == 0).all() and np.isneginf(m[unseen]).all()


def _counts(counters):
    from gpu._launch import counters_to_dicts
    r, w = counters_to_dicts(counters)
    return {t: (r.get(t, 0), w.get(t, 0)) for t in set(r) | set(w)}


SIM_CASES = [
    dict(N=40, d=16, t=(16, 16, 1), causal=True),                 # ragged, causal
    dict(N=33, d=32, t=(32, 16, 1)),                             # ragged, 2 query blocks
    dict(N=20, d=16, t=(32, 16, 1), causal=True),                # T_r = 1: the next tile
                                                                 # reads what this one writes
    dict(N=48, d=16, t=(32, 32, 2), causal=True),                # 2 m-tiles, half-seen warps
    dict(N=40, d=16, t=(16, 16, 1), H=2, Hk=1, causal=True),     # grouped K/V
    dict(N=40, d=16, t=(16, 16, 1), mask=[[1, 0, 0], [0, 0, 1], [1, 0, 1]]),   # empty column
    dict(N=40, d=16, t=(16, 16, 1), causal=True,                 # empty row, leading
         mask=[[0, 0, 0], [0, 0, 0], [0, 0, 1]]),                # empty columns
    dict(N=40, d=16, t=(16, 16, 1), causal=True, nan_row=5),     # NaN input
    dict(N=40, d=48, t=(32, 48, 1)),                             # d, B_c not powers of 2
    # 3 stages: two tiles in flight; a tile waits when one in flight has its query block
    dict(N=72, d=16, t=(16, 16, 1, 3), causal=True),
    dict(N=40, d=16, t=(16, 16, 1, 3)),                          # T_r = 3
    dict(N=20, d=16, t=(16, 16, 1, 3)),                          # T_r = 2
    dict(N=48, d=16, t=(16, 16, 1, 3), causal=True,
         mask=[[1, 0, 0], [0, 0, 0], [1, 0, 1]]),                # empty row and column
    dict(N=64, d=32, t=(32, 16, 2, 3), H=2, Hk=1, causal=True),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")      # NaN arithmetic in the NaN case
@pytest.mark.parametrize("c", SIM_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()
                                                                   if k != "mask")
                         + ("-mask" if "mask" in c else ""))
def test_kernel_python_in_the_simulator(c):
    """The kernel's schedule, counts and numerics with the C++ tile functions emulated."""
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("the emulation is for the simulator; on a GPU the real kernel runs below")
    from fa1_tc_sim import emulated, run_sim
    B_r, B_c, MT, stages = tiles(c)
    mask = None if "mask" not in c else np.array(c["mask"], bool)
    p, q, k, v = _inputs(c["N"], c["d"], H=c.get("H", 1), Hk=c.get("Hk", 1),
                         causal=c.get("causal", False), mask=mask, nan_row=c.get("nan_row"))
    with np.errstate(invalid="ignore"), emulated():
        O, l, m, counters = run_sim(q, k, v, B_r=B_r, B_c=B_c, MT=MT, stages=stages,
                                    causal=p.causal, block_mask=mask)
    check_run(p, iosim.Tiling(B_r, B_c), q, k, v, O, l, m, _counts(counters))


# ---------------------------------------------------------------------------------------
# The linked build (no GPU needed), in a subprocess with the simulator off
# ---------------------------------------------------------------------------------------
BUILD = r"""
import json, sys
from gpu.forward import fa1_tc
out = []
for B_r, B_c, d, causal, mask, count, MT, st in json.loads(sys.argv[1]):
    p = fa1_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, st)
    out.append(dict(cfg=[B_r, B_c, d, causal, mask, count, MT, st], mma=p.count("mma.sync"),
                    ldmatrix=p.count("ldmatrix"), local=p.count(".local"),
                    call=len([l for l in p.splitlines() if l.strip().startswith("call")]),
                    f64=p.count(".f64"), cp_async=p.count("cp.async.cg"),
                    cp4=p.count("cp.async.ca"), atom=p.count("atom."),
                    st_v4=p.count("st.global.v4")))
    open(sys.argv[2] + f"/{B_r}_{B_c}_{d}_{int(causal)}_{MT}_{st}.ptx", "w").write(p)
print(json.dumps(out))
"""

#: the d = 64 default as it runs causal (the most registers of the d = 64 variants: 250)
CONFIGS = [(128, 128, 64, True, False, False, 1, 3)]
#: the d = 64 default non-causal, and d = 128's default causal, block-masked, counted (254)
SLOW_CONFIGS = [(128, 128, 64, False, False, False, 1, 3),
                (128, 64, 128, True, True, True, 1, 2)]


def _build(configs):
    ptx_dir = _background.mkdtemp("fa1-tc-ptx")
    env = dict(_background.environ(), NUMBA_ENABLE_CUDASIM="0")
    r = _background.run([sys.executable, "-c", BUILD, json.dumps(configs), ptx_dir],
                        env=env, cwd=ROOT, timeout=600)
    return r, ptx_dir


def _build_job():
    """The linked build of CONFIGS (started early: tests/_background.py)."""
    return _build(CONFIGS)


def _build_slow_job():
    return _build(SLOW_CONFIGS)


@pytest.mark.prestart(job=_build_job)
def test_linked_build_uses_tensor_cores_registers_only_no_spills():
    _check_build(*_background.result(_build_job))


@pytest.mark.slow
@pytest.mark.prestart(job=_build_slow_job)
def test_linked_build_other_defaults():
    _check_build(*_background.result(_build_slow_job))


def _check_build(r, ptx_dir):
    tmp_path = pathlib.Path(ptx_dir)
    if r.returncode != 0 and ("nvjitlink" in r.stderr.lower() or "nvrtc" in r.stderr.lower()
                              or "NVVM" in r.stderr):
        pytest.skip("cannot build linked code here: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr
    for row in json.loads(r.stdout.strip().splitlines()[-1]):
        B_r, B_c, d, causal, mask, count, MT, st = row["cfg"]
        steps = (B_c // 16) * (d // 16)
        assert row["mma"] == 4 * steps * MT, row              # S = Q K^T and O += P V
        # Q and K from shared at each k step (Q_i changes every tile), V once per step
        assert row["ldmatrix"] == (d // 16) * (MT + B_c // 16) + steps, row
        assert row["local"] == 0 and row["call"] == 0 and row["f64"] == 0, row
        assert row["cp_async"] > 0 and row["cp4"] > 0 and row["st_v4"] > 0, row
        assert (row["atom"] > 0) == count, row
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return
    for path in tmp_path.glob("*.ptx"):
        text = re.sub(r"^\.version \d+\.\d+", ".version 8.0", path.read_text(), flags=re.M)
        path.write_text(text)
        r = subprocess.run([ptxas, "-arch=sm_90", "-v", str(path), "-o", os.devnull],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip(f"ptxas cannot assemble nvJitLink's PTX here: {r.stderr[-300:]}")
        spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
        assert spills and all(int(s) == 0 for s in spills), (path.name, r.stderr)


# ---------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------
def run_gpu(q, k, v, *, B_r, B_c, MT=1, stages=2, causal=False, block_mask=None, count=True,
            dt="fp16"):
    """fa1_tc on a GPU from NumPy (batch, heads, N, d) fp16 (dt="bf16": uint16 bits): O, l,
    m (poisoned with NaN before the launch) and the counters."""
    from numba import cuda
    from gpu import _launch
    from gpu.forward import fa1_tc
    B, H, N, d = q.shape
    Hk = k.shape[1]
    q3, k3, v3 = (cuda.to_device(np.ascontiguousarray(x).reshape(-1, N, d)) for x in (q, k, v))
    if dt == "fp16":
        o3 = _launch.filled((B * H, N, d), np.float16, np.nan)
    else:
        o3 = cuda.to_device(np.full((B * H, N, d), 0x7FC0, np.uint16))     # bf16 NaN
    l2 = _launch.filled((B * H, N), np.float32, np.nan)
    m2 = _launch.filled((B * H, N), np.float32, np.nan)
    counters = _launch.new_counters(count)
    mask = None if block_mask is None else cuda.to_device(np.asarray(block_mask, np.uint8))
    fa1_tc.run(q3, k3, v3, o3, l2, m2, 1.0 / np.sqrt(d), N, H, H // Hk, mask, counters,
               B_r=B_r, B_c=B_c, dt=dt, causal=causal, count=count, MT=MT, stages=stages)
    cuda.synchronize()
    return (o3.copy_to_host().reshape(B, H, N, d), l2.copy_to_host().reshape(B, H, N),
            m2.copy_to_host().reshape(B, H, N), counters)


def tiles(c):
    """(B_r, B_c, MT, stages) of a case's t = (B_r, B_c, MT[, stages = 2])."""
    return (tuple(c["t"]) + (2,))[:4]


#: t = (B_r, B_c, MT, stages)
GPU_CASES = [
    dict(N=1000, d=64, t=(128, 128, 1, 3), H=2),                  # the d = 64 default
    dict(N=333, d=64, t=(128, 128, 1, 3), H=2, causal=True),
    dict(N=300, d=128, t=(128, 64, 1, 2), H=4, Hk=2, causal=True),  # the d = 128 default
    dict(N=256, d=64, t=(128, 64, 2, 3), causal=True),            # 2 m-tiles per warp
    dict(N=77, d=48, t=(32, 16, 1, 2), causal=True),
    dict(N=100, d=64, t=(128, 64, 1, 3)),                         # T_r = 1
    dict(N=256, d=64, t=(64, 64, 1, 3), mask=[[1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1],
                                              [0, 0, 1, 1]]),     # empty row and column
    dict(N=256, d=64, t=(64, 64, 1, 2), causal=True, nan_row=70),
    dict(N=1024, d=64, t=(128, 128, 1, 3), H=4),                  # T_c = 8 fp16 roundings
    dict(N=512, d=64, t=(128, 128, 1, 2), causal=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("c", GPU_CASES)
def test_fa1_tc_counts_and_accuracy_on_gpu(c):
    B_r, B_c, MT, st = tiles(c)
    mask = None if "mask" not in c else np.array(c["mask"], bool)
    p, q, k, v = _inputs(c["N"], c["d"], H=c.get("H", 1), Hk=c.get("Hk", c.get("H", 1)),
                         causal=c.get("causal", False), mask=mask, nan_row=c.get("nan_row"))
    O, l, m, counters = run_gpu(q, k, v, B_r=B_r, B_c=B_c, MT=MT, stages=st, causal=p.causal,
                                block_mask=mask)
    with np.errstate(invalid="ignore"):
        check_run(p, iosim.Tiling(B_r, B_c), q, k, v, O, l, m, _counts(counters))
    O2, l2, m2, _ = run_gpu(q, k, v, B_r=B_r, B_c=B_c, MT=MT, stages=st, causal=p.causal,
                            block_mask=mask, count=False)
    # the plain build gives the same bits as the counted one
    assert np.array_equal(O, O2, equal_nan=True) and np.array_equal(l, l2, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("N,d,causal,t", [(333, 64, True, (128, 128, 1, 3)),
                                          (300, 128, False, (128, 64, 1, 2)),
                                          (200, 32, False, (64, 64, 2, 2))])
def test_fa1_tc_bf16_on_gpu(N, d, causal, t):
    """bf16 (uint16 bits; tests/_tc_direct.py): counts equal iosim's fa1 closed form, every
    element written, the counting and plain builds agree bit for bit, and O is within
    2 x the larger of PyTorch's bf16 SDPA error and the bf16 rounding model of Algorithm 1
    (O stored to HBM in bf16 after every key block: `_fa1_bf16_model`), + 1e-5, of float64
    (4 query heads on 2 K/V heads). The model term is there because Algorithm 1 as written
    rounds O T_c times, SDPA once."""
    import _tc_direct as tcd
    B_r, B_c, MT, st = t
    H, Hk = 4, 2
    (q, k, v), (q64, k64, v64) = tcd.inputs(H, Hk, N, N, d, "bf16", seed=N + d)
    O, l, m, counters = run_gpu(q[None], k[None], v[None], B_r=B_r, B_c=B_c, MT=MT,
                                stages=st, causal=causal, dt="bf16")
    O2, _, _, _ = run_gpu(q[None], k[None], v[None], B_r=B_r, B_c=B_c, MT=MT, stages=st,
                          causal=causal, dt="bf16", count=False)
    np.testing.assert_array_equal(O, O2)
    _check_bf16(O, counters, q64, k64, v64, causal, B_r, B_c, Hk, sdpa=True)


def _check_bf16(O, counters, q64, k64, v64, causal, B_r, B_c, Hk, sdpa):
    """fa1 in bf16: counts equal iosim's fa1 closed form, every O element written, error
    within 2 x the larger of SDPA's bf16 error (sdpa: where torch runs) and the bf16
    rounding model of Algorithm 1, + 1e-5."""
    import _tc_direct as tcd
    H, N, d = q64.shape
    assert _counts(counters) == tcd.model_counts(N, N, d, H, Hk, causal, (-1, -1), (B_r, B_c),
                                                 algorithm="fa1")
    allow = tcd.allowed(N, N, causal)
    scale = 1.0 / np.sqrt(d)
    ref, _ = tcd.reference(q64, k64, v64, allow, scale)
    O64 = tcd.to_f64(O[0], "bf16")
    assert np.isfinite(O64).all()
    rows = np.ones(N, bool)
    err = tcd.rel_err(O64, ref, rows)
    e_sdpa = tcd.sdpa_forward_err(q64, k64, v64, allow, scale, "bf16", ref, rows) if sdpa \
        else None
    model = tcd.rel_err(_fa1_bf16_model(q64, k64, v64, allow, scale, B_c), ref, rows)
    assert err <= 2 * max(e_sdpa or 0.0, model) + 1e-5, (err, e_sdpa, model)


@pytest.mark.parametrize("N,d,causal,t", [(40, 16, True, (16, 16, 1, 3)),
                                          (33, 32, False, (32, 16, 2, 2))])
def test_fa1_tc_bf16_in_the_simulator(N, d, causal, t):
    """fa1_tc's Python with dt='bf16' in the simulator (C++ pieces emulated with bf16
    roundings, tests/fa1_tc_sim.py): counts equal iosim's fa1 closed form, every element
    written, O within 2 x the bf16 rounding model of Algorithm 1 + 1e-5 of float64."""
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("the emulation is for the simulator")
    import _tc_direct as tcd
    from fa1_tc_sim import emulated, run_sim
    B_r, B_c, MT, st = t
    H, Hk = 2, 1
    (q, k, v), (q64, k64, v64) = tcd.inputs(H, Hk, N, N, d, "bf16", seed=N + d)
    with emulated():
        O, l, m, counters = run_sim(q[None], k[None], v[None], B_r=B_r, B_c=B_c, MT=MT,
                                    stages=st, causal=causal, dt="bf16")
    _check_bf16(O, counters, q64, k64, v64, causal, B_r, B_c, Hk, sdpa=False)


def _fa1_bf16_model(q, k, v, allow, scale, B_c):
    """Algorithm 1 in float64 with O rounded to bf16 each time it is stored to HBM (after
    every key block j a row sees), l, m float64: the rounding model of fa1 in bf16."""
    import _tc_direct as tcd
    G = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, G, 0), np.repeat(v, G, 0)
    I, N, d = q.shape
    O = np.zeros((I, N, d))
    l = np.zeros((I, N, 1))
    m = np.full((I, N, 1), -np.inf)
    for c0 in range(0, k.shape[1], B_c):
        a = allow[:, c0:c0 + B_c]
        S = np.where(a, scale * q @ k[:, c0:c0 + B_c].transpose(0, 2, 1), -np.inf)
        mt = S.max(-1, keepdims=True)
        seen = np.isfinite(mt)
        P = np.where(a, np.exp(S - np.where(seen, mt, 0.0)), 0.0)
        m_new = np.maximum(m, mt)
        fm = np.where(np.isfinite(m), np.exp(m - np.where(seen | np.isfinite(m), m_new, 0.0)), 0.0)
        ft = np.where(seen, np.exp(mt - np.where(seen, m_new, 0.0)), 0.0)
        l_new = fm * l + ft * P.sum(-1, keepdims=True)
        On = (l * fm * O + ft * (P @ v[:, c0:c0 + B_c])) / np.where(l_new > 0, l_new, 1.0)
        On = tcd.to_f64(tcd.to_dtype(On, "bf16"), "bf16")
        O = np.where(seen, On, O)
        l = np.where(seen, l_new, l)
        m = np.where(seen, m_new, m)
    return O
