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
    from gpu import fa2
    p = iosim.Problem(N=16, d=16)
    q, k, v = iosim.random_inputs(p, seed=10)
    O = gpu.attention(q, k, v, block_rows=16, block_cols=16)
    assert isinstance(O, np.ndarray)
    k_on = fa2.fa2_forward_kernel(16, 16, 16, "fp32", False, False, True, 16)
    k_off = fa2.fa2_forward_kernel(16, 16, 16, "fp32", False, False, False, 16)
    assert k_on is not k_off
    assert k_on.py_func.__name__ == "fa2_fwd_Br16_Bc16_d16_fp32_count_t16"


# ---------------------------------------------------------------------------------------
# scripts/gpu_check.py, the H100 check, exercised here so the device run works first time
# ---------------------------------------------------------------------------------------
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")


def _run_script(*args, env_extra=None, timeout=600):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def test_gpu_check_script_in_simulator(tmp_path):
    """`gpu_check.py --sim`: ledgers == closed form, accuracy bounds, JSON written."""
    import json
    r = _run_script("--sim", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "gpu_check_sim.json").read_text())
    assert data["n_failed"] == 0 and len(data["rows"]) >= 7
    assert all(row["ledger_ok"] and row["acc_ok"] for row in data["rows"])
    assert {"numba", "numpy", "numba-cuda"} <= set(data["versions"])


def test_ptx_no_float64_and_no_atomics_without_counting():
    """Compile kernels for cc 9.0 (needs NVVM, not a GPU): no .f64 instructions, and the
    uninstrumented build has no atomics. Skipped where NVVM is unavailable."""
    probe = subprocess.run(
        [sys.executable, "-c", "from numba import cuda\n"
         "def f(a):\n    a[0] = 1\n"
         "cuda.compile_ptx(f, 'void(float32[:])', cc=(9, 0))"],
        capture_output=True, text=True, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="0"),
        timeout=300)
    if probe.returncode != 0:
        pytest.skip("cannot compile PTX here: " + probe.stderr.strip().splitlines()[-1])
    r = _run_script("--ptx", "--quick", env_extra={"NUMBA_ENABLE_CUDASIM": "0"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PTX: all ok" in r.stdout
