"""The fast fa2 backward (gpu.backward.fa2_fast, kernel='fast') with N_k != N_q and local
windows (issue 18): bottom-right aligned causal and window=(left, right) as gpu.attention
and iosim.Problem; the cases of tests/test_gpu_backward_band.py (its set-up and checks).

Runs in Numba's CUDA simulator without a GPU: d = 16, 16 x 16 tiles, 16 threads (the
smallest the fast kernel runs there, as tests/test_gpu_backward_fast.py). Checks: the
kernels' own counts == iosim.backward_closed_form == the executed ledger; every output
poisoned first (all finite); fp32 rel err <= 1e-4 of the float64 reference; rows that see
no key: dQ = 0; a key block that no query row sees: dK = dV = 0 (written). kernel='auto'
runs the fast kernel on these problems where it runs it for N_k = N_q (the fast main
kernel is called); 'tc' takes them for fp16 / bf16 only (tests/test_gpu_backward_tc_band.py).
One `gpu`-marked test at real sizes.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import iosim
from gpu.backward import attention_backward, fa2_fast
from test_gpu_backward_band import CASES, check, rel_err, setup

T16 = dict(block_rows=16, block_cols=16, threads=16)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fast(q, k, v, O, do, L, causal, window, **kw):
    return attention_backward(q, k, v, O, do, L, causal=causal, window=window,
                              kernel="fast", count_traffic=True, poison=True, **T16, **kw)


@pytest.mark.parametrize("Nq, Nk, causal, window, heads, kv_heads", CASES)
def test_fa2_fast_fp32(Nq, Nk, causal, window, heads, kv_heads):
    p, q, k, v, O, do, L = setup(Nq, Nk, causal, window, heads, kv_heads)
    grads, ledger = fast(q, k, v, O, do, L, causal, window)
    empty = check(p, q, k, v, O, do, grads, ledger, causal, window)
    if (Nq, Nk) == (40, 24):
        assert empty.any()


def test_key_block_seen_by_no_row():
    """N_q = 16, N_k = 48, window (2, 0): row r sees keys r + 30 .. r + 32, so key block 0
    has no active query block (the kernel's loop is empty): dK = dV = 0 there, written."""
    p, q, k, v, O, do, L = setup(16, 48, False, (2, 0), 1, 1)
    assert not iosim.active_tiles(p, iosim.Tiling(16, 16))[:, 0].any()
    grads, ledger = fast(q, k, v, O, do, L, False, (2, 0))
    check(p, q, k, v, O, do, grads, ledger, False, (2, 0))
    assert not grads[1][0, 0, :16].any() and not grads[2][0, 0, :16].any()


def test_run_options_window_direct_atomics():
    """fa2_fast.run with window=, no stagger and dQ atomics straight from the registers
    (N_q = 40, N_k = 24, window (5, 3): rows with no key, tiles outside the band): dQacc,
    dK, dV against the float64 reference."""
    from numba import cuda
    from gpu._launch import dummy_mask
    from gpu.backward.flash import BW_TENSORS
    w = (5, 3)
    p, q, k, v, O, do, L = setup(40, 24, False, w, 1, 1)
    I, N, Nk, d = 1, 40, 24, 16
    dev = [cuda.to_device(np.ascontiguousarray(x.reshape(I, -1, d))) for x in (q, k, v, O, do)]
    L2 = cuda.to_device(L.reshape(I, N))
    D2 = cuda.to_device(np.full((I, N), np.nan, np.float32))
    acc = cuda.to_device(np.full((I, N, d), np.nan, np.float32))
    dk, dv = (cuda.to_device(np.full((I, Nk, d), np.nan, np.float32)) for _ in range(2))
    counters = cuda.to_device(np.zeros((len(BW_TENSORS), 2), np.int64))
    fa2_fast.run_pre(dev[3], dev[4], D2, acc, N, counters, dt="fp32", count=True, threads=32)
    fa2_fast.run(*dev, L2, D2, acc, dk, dv, 1 / np.sqrt(d), N, 1, 1, dummy_mask(), counters,
                 B_r=16, B_c=16, dt="fp32", causal=False, count=True, threads=16, window=w,
                 stagger=False, dq_stage=False)
    ref = iosim.reference_attention_backward(q, k, v, do, window=w)
    got = (acc.copy_to_host(), dk.copy_to_host(), dv.copy_to_host())
    for g, r, name in zip(got, ref, ("dq", "dk", "dv")):
        assert rel_err(g.reshape(r.shape), r) <= 1e-4, name


def test_auto_runs_fast_and_tc_refuses(monkeypatch):
    """kernel='auto' runs the fast main kernel for N_k != N_q / a window (as it does for
    N_k = N_q at this tiling, fp32), with the gradients of kernel='plain' up to float32
    summation order; kernel='tc' refuses fp32 with a ValueError naming the dtype (it takes
    the band: tests/test_gpu_backward_tc_band.py)."""
    calls = []
    real = fa2_fast.run
    monkeypatch.setattr(fa2_fast, "run", lambda *a, **kw: (calls.append(kw), real(*a, **kw)))
    p, q, k, v, O, do, L = setup(24, 40, False, (5, 3), 1, 1)
    kw = dict(window=(5, 3), **T16)
    auto = attention_backward(q, k, v, O, do, L, **kw)
    assert calls and calls[-1]["window"] == (5, 3) and calls[-1]["threads"] == 16
    plain = attention_backward(q, k, v, O, do, L, kernel="plain", **kw)
    for a, b in zip(auto, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"kernel='tc' cannot run algorithm='fa2', dtype "
                                         r"fp32.*fp16, bf16 only"):
        attention_backward(q, k, v, O, do, L, kernel="tc", **kw)


PTX_SCRIPT = """
import re, subprocess, sys
from gpu.backward import fa2_fast
for causal, window in ((False, True), (True, False)):
    text = fa2_fast.ptx(64, 64, 64, "fp32", causal=causal, threads=256, window=window)
    path = sys.argv[1] + f"/bwd_fast_band_{int(causal)}{int(window)}.ptx"
    open(path, "w").write(text)
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", path, "-o", path + ".cubin"],
                       capture_output=True, text=True)
    regs = re.search(r"Used (\\d+) registers", r.stderr)
    spill = re.search(r"(\\d+) bytes spill stores, (\\d+) bytes spill loads", r.stderr)
    print(int(causal), int(window), regs.group(1), spill.group(1), spill.group(2))
"""


def test_ptx_band_kernels_do_not_spill(tmp_path):
    """ptxas -v (sm_90) on the main kernel with a window and causal at d = 64, 64 x 64
    tiles, 256 threads: it compiles through NVVM, no spills, and causal needs fewer
    registers than the window (the band's lower edge is compiled in only with a window).
    Since the own rows' exact D (fa2_fast docstring, v1c) causal takes 182, the window 242
    (were 128 and 152): at 127.5 KB of shared memory one block per SM either way. Needs
    NVVM and ptxas, not a GPU (skipped where they are missing)."""
    if shutil.which("ptxas") is None:
        pytest.skip("no ptxas on PATH")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", PTX_SCRIPT, str(tmp_path)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "CUDA" in r.stderr and "compile" not in r.stderr:
        pytest.skip("cannot compile PTX here: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.strip().splitlines()]
    assert [row[:2] for row in rows] == [["0", "1"], ["1", "0"]]
    for causal, window, regs, st, ld in rows:
        assert int(st) == 0 and int(ld) == 0 and int(regs) <= 255, (causal, window, regs)
    assert int(rows[1][2]) < int(rows[0][2])
    assert fa2_fast.smem_bytes(64, 64, 64, 256) > 232448 // 2   # one block per SM anyway


@pytest.mark.gpu
@pytest.mark.parametrize("Nq, Nk, causal, window, dtype", [
    (1000, 1500, True, (-1, -1), "fp32"),
    (1500, 1000, False, (200, 50), "fp32"),
    (1000, 1000, True, (300, 0), "fp16"),
])
def test_gpu_real_size(Nq, Nk, causal, window, dtype):
    """On a GPU at the fast kernel's default tiling (d = 64, 4 query heads on 2 K/V
    heads, the gpu fa2 forward's O and L): counts exact, fp32 rel err <= 1e-4 (fp16:
    test_gpu_backward_band's model bound), dQ = 0 on rows that see no key."""
    from gpu.api import attention
    from test_gpu_backward_band import fp16_model
    from iosim.reference import element_mask
    d = 64
    B_r, B_c, t = fa2_fast.default_tiling(d, dtype)
    tiling = iosim.Tiling(B_r, B_c)
    p = iosim.Problem(N=Nq, N_k=Nk, d=d, batch=1, heads=4, kv_heads=2, dtype=dtype,
                      causal=causal, window=window)
    q, k, v = iosim.random_inputs(p, 3)
    do = np.random.default_rng(10).standard_normal(q.shape).astype(q.dtype)
    O, L = attention(q, k, v, algorithm="fa2", causal=causal, window=window,
                     return_stats=True)
    grads, ledger = attention_backward(q, k, v, O, do, L, causal=causal, window=window,
                                       kernel="fast", count_traffic=True, poison=True)
    assert ledger.tiling == tiling
    assert ledger.counts() == iosim.backward_closed_form("fa2", p, tiling).counts()
    for g, want in zip(grads, (q, k, v)):
        assert g.shape == want.shape and np.isfinite(g).all()
    ref = iosim.reference_attention_backward(q, k, v, do, causal=causal, window=window)
    allowed = element_mask(Nq, causal, N_k=Nk, window=window)
    assert not grads[0][:, :, ~allowed.any(axis=1)].any()
    if dtype == "fp32":
        bounds = [1e-4] * 3
    else:
        bounds = [2 * rel_err(m, r) for m, r in zip(fp16_model(q, k, v, O, do, allowed), ref)]
    for g, r, b, name in zip(grads, ref, bounds, ("dq", "dk", "dv")):
        assert rel_err(g, r) <= b, (name, rel_err(g, r), b)
