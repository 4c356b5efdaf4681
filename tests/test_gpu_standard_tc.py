"""gpu.forward.standard_tc, gpu.backward.standard_tc: standard attention (Algorithm 0 forward,
Algorithm 3 backward) for fp16 with the tile products on the tensor cores.

Without a GPU: the argument rules, the shared-memory layouts, and that the kernels link
(NVVM + NVRTC + nvJitLink, no GPU) into code with mma.sync in it (the number of mma per
warp the tile sizes imply), the C++ inlined (no call), nothing in local memory, no float64,
and no register spills (ptxas -v) at the default tiling for d = 64 and d = 128.
On a GPU (`gpu` marker): outputs against float64 (iosim.reference_attention,
reference_attention_backward) no worse than the plain standard kernels' own error on the
same inputs, every output written (NaN poison), counts equal to iosim's closed forms
(the same schedule as gpu.forward.standard / gpu.backward.standard), NaN where the plain
kernels have NaN.
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


def test_plan_error_names_the_parameter():
    from gpu.backward import standard_tc as bwd
    from gpu.forward import standard_tc as fwd
    assert fwd.plan_error(128, 64, 64, "fp16") is None
    assert fwd.plan_error(16, 16, 16, "fp16") is None
    assert fwd.plan_error(64, 48, 128, "fp16") is None            # B_c: any multiple of 16
    assert "fp16" in fwd.plan_error(128, 64, 64, "fp32")
    assert "d=40" in fwd.plan_error(128, 64, 40, "fp16")
    assert "d=256" in fwd.plan_error(128, 64, 256, "fp16")
    assert "B_r=48" in fwd.plan_error(48, 64, 64, "fp16")          # 3 warps: not generated
    assert "B_r=256" in fwd.plan_error(256, 64, 64, "fp16")
    assert "B_c=8" in fwd.plan_error(128, 8, 64, "fp16")
    assert "B_c=144" in fwd.plan_error(128, 144, 64, "fp16")
    assert bwd.plan_error(128, 64, 64, "fp16") is None
    assert "B_c=48" in bwd.plan_error(64, 48, 64, "fp16")          # lines 1, 5: warps of keys
    assert "B_r=24" in bwd.plan_error(24, 64, 64, "fp16")


def test_default_tilings_follow_the_rules():
    from gpu.backward import standard_tc as bwd
    from gpu.forward import standard_tc as fwd
    for d in (16, 32, 64, 128):
        for causal in (False, True):
            t = fwd.default_tiling(d, causal)
            assert fwd.plan_error(t["B_r"], t["B_c"], d, "fp16") is None
            tb = bwd.default_tiling(d, causal)
            assert tb == t                                          # P is read as written
            assert bwd.plan_error(tb["B_r"], tb["B_c"], d, "fp16") is None
            # fits the H100's 227 KB, and the two tile kernels of d = 64 leave room for
            # several blocks per SM
            assert bwd.shared_bytes(t["B_r"], t["B_c"], d) <= 232448
    assert fwd.shared_bytes(128, 64, 64) <= 64 * 1024


@pytest.mark.parametrize("B_r,B_c,d", [(128, 64, 64), (64, 128, 128), (16, 16, 16),
                                       (32, 48, 80)])
def test_layouts_are_16_byte_aligned_and_disjoint(B_r, B_c, d):
    from gpu.backward import standard_tc as bwd
    from gpu.forward import standard_tc as fwd
    odd_16 = lambda stride_halves: ((2 * stride_halves) % 128) // 16 % 2 == 1
    t = fwd.tile_layout(B_r, B_c, d)
    assert t["BO"] == B_r * t["SW"] and t["words"] >= t["BO"] + B_c * t["SW"]
    assert t["words"] >= B_r * t["OSW"]                    # the S tile fits over Qs, Ks
    assert t["BO"] % 4 == 0 and odd_16(t["SH"]) and (2 * t["OSH"]) % 16 == 0
    r = fwd.rowblock_layout(B_r, B_c, d)
    assert r["VO"] == 2 * r["PB"] and r["words"] >= r["VO"] + 2 * r["VB"]
    assert r["words"] >= B_r * r["SW"]                     # O_i staging fits
    for off in (r["PB"], r["VO"], r["VB"]):
        assert off % 4 == 0
    assert odd_16(r["SH"]) and (2 * r["PSH"]) % 16 == 0
    if bwd.plan_error(B_r, B_c, d, "fp16") is None:
        c = bwd.colblock_layout(B_r, B_c, d)
        assert c["YO"] == 2 * c["XB"] and c["words"] >= c["YO"] + 2 * c["YB"]
        assert c["words"] >= B_c * c["SW"]
        for off in (c["XB"], c["YO"], c["YB"]):
            assert off % 4 == 0


def test_row_kernels_threads_and_bytes():
    from gpu.forward import standard_tc as fwd
    assert fwd.row_threads(4096, True) == 128             # 512 chunks of 8: 4 per thread
    assert fwd.row_threads(16384, True) == 256
    assert fwd.row_threads(40, True) == 32
    assert fwd.row_threads(333, False) == 128
    for N in (8, 40, 333, 4096):
        assert fwd.row_threads(N, N % 8 == 0) % 32 == 0
    assert fwd.row_bytes(4096) == 8192 and fwd.row_bytes(333, 2) == 2 * 2 * 336


BUILD = r"""
import json, re, sys
from gpu.backward import standard_tc as bwd
from gpu.forward import standard_tc as fwd
out = []
for B_r, B_c, d, causal, mask, count, vec in json.loads(sys.argv[1]):
    ps = dict(fwd.linked_ptx(B_r, B_c, d, causal, mask, count, vec))
    ps.update(bwd.linked_ptx(B_r, B_c, d, causal, mask, count, vec))
    for name, p in ps.items():
        out.append(dict(cfg=[B_r, B_c, d, causal, mask, count, vec], kernel=name,
                        mma=p.count("mma.sync"), local=p.count(".local"), f64=p.count(".f64"),
                        call=len([l for l in p.splitlines() if l.strip().startswith("call")])))
        open(sys.argv[2] + f"/{name}_{B_r}_{B_c}_{d}_{int(causal)}_{int(vec)}.ptx", "w").write(p)
print(json.dumps(out))
"""

# the defaults at d = 64 (16-byte rows) and d = 128 (causal, block mask, instrumented, and
# N not a multiple of 8: element-wise N x N moves); one subprocess each
CONFIGS = [[(128, 64, 64, False, False, False, True)],
           [(128, 64, 128, True, True, True, False)]]


def _mma_per_warp(kernel, B_r, B_c, d):
    if kernel in ("S", "dP"):          # 16 x B_c per warp, k = d: (B_c / 8) (d / 16)
        return (B_c // 8) * (d // 16)
    if kernel in ("PV", "dQ"):         # 16 x d per warp, k = B_c
        return (B_c // 16) * (d // 8)
    if kernel in ("dV", "dK"):         # 16 keys x d per warp, k = B_r
        return (B_r // 16) * (d // 8)
    return 0                           # softmax, dS: CUDA cores


# ---------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------
def _rel(x, ref):
    x = np.asarray(x, np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def _mask(N, B_r, B_c, seed=3):
    rng = np.random.default_rng(seed)
    m = rng.random((-(-N // B_r), -(-N // B_c))) < 0.6
    m[:, 0] = True
    m[1, :] = False                    # query block 1 sees nothing: O = 0, no P
    return m


GPU_CASES = [
    (200, 64, 4, 2, True, (128, 64), False),     # default tiling, GQA, ragged (N % 8 == 0)
    (333, 128, 2, 1, False, (128, 64), False),   # d = 128, N % 8 != 0: element-wise moves
    (256, 64, 2, 2, False, (64, 64), True),      # block mask with a row that sees nothing
    (100, 32, 2, 2, True, (32, 32), False),      # causal, N % 8 != 0
    (96, 16, 2, 2, False, (16, 32), False),      # smallest tiles
]


@pytest.mark.gpu
@pytest.mark.parametrize("N,d,heads,kv_heads,causal,tiles,mask", GPU_CASES)
def test_standard_tc_forward_and_backward_on_gpu(N, d, heads, kv_heads, causal, tiles, mask):
    from gpu.backward import attention_backward
    from gpu.backward import standard_tc as bwd
    from gpu.backward.standard import standard_forward
    from gpu.forward import standard_tc as fwd
    B_r, B_c = tiles
    bm = _mask(N, B_r, B_c) if mask else None
    p = iosim.Problem(N=N, d=d, batch=1, heads=heads, kv_heads=kv_heads, dtype="fp16",
                      causal=causal, block_mask=bm)
    tiling = iosim.Tiling(B_r, B_c)
    q, k, v = iosim.random_inputs(p, 0)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
    kw = dict(causal=causal, block_mask=bm, B_r=B_r, B_c=B_c)
    # forward
    O, P, led = fwd.forward_arrays(q, k, v, causal=causal, block_rows=B_r, block_cols=B_c,
                                   block_mask=bm, count_traffic=True)
    assert led.counts() == iosim.closed_form("standard", p, tiling).counts()
    assert np.isfinite(O).all()                         # every element written
    O_plain, P_plain = standard_forward(q, k, v, causal=causal, block_rows=B_r,
                                        block_cols=B_c, block_mask=bm)
    np.testing.assert_array_equal(np.isnan(P), np.isnan(P_plain))   # same entries written
    ok = ~np.isnan(P_plain)
    # S may differ by an fp16 rounding (other summation order): P by about 2^-10 relative
    np.testing.assert_allclose(P[ok].astype(np.float32), P_plain[ok], rtol=1e-2, atol=1e-4)
    ref = iosim.reference_attention(q, k, v, **kw)
    e, ep = _rel(O, ref), _rel(O_plain, ref)
    assert e <= 1.5 * ep + 1e-4, (e, ep)
    # backward, from this forward's P
    grads, bled = bwd.backward_arrays(q, k, v, do, P, causal=causal, block_rows=B_r,
                                      block_cols=B_c, block_mask=bm, count_traffic=True)
    assert bled.counts() == iosim.backward_closed_form("standard", p, tiling).counts()
    plain = attention_backward(q, k, v, O, do, P, algorithm="standard", causal=causal,
                               block_rows=B_r, block_cols=B_c, block_mask=bm)
    rg = iosim.reference_attention_backward(q, k, v, do, **kw)
    for name, g, gp, r in zip(("dq", "dk", "dv"), grads, plain, rg):
        assert np.isfinite(g).all(), name
        e, ep = _rel(g, r), _rel(gp, r)
        assert e <= 1.5 * ep + 1e-4, (name, e, ep)


@pytest.mark.gpu
def test_standard_tc_nan_where_the_plain_kernels_have_nan():
    from gpu.backward import attention_backward
    from gpu.backward import standard_tc as bwd
    from gpu.backward.standard import standard_forward
    from gpu.forward import standard_tc as fwd
    N, d = 136, 32
    p = iosim.Problem(N=N, d=d, batch=1, heads=2, kv_heads=1, dtype="fp16", causal=True)
    q, k, v = iosim.random_inputs(p, 1)
    q[0, 1, 70, 3] = np.nan
    k[0, 0, 20, 5] = np.inf
    do = np.random.default_rng(8).standard_normal(q.shape).astype(np.float16)
    O, P, _ = fwd.forward_arrays(q, k, v, causal=True, block_rows=32, block_cols=32)
    O_plain, P_plain = standard_forward(q, k, v, causal=True, block_rows=32, block_cols=32)
    np.testing.assert_array_equal(np.isnan(O), np.isnan(O_plain))
    np.testing.assert_array_equal(np.isnan(P), np.isnan(P_plain))
    grads, _ = bwd.backward_arrays(q, k, v, do, P, causal=True, block_rows=32, block_cols=32)
    plain = attention_backward(q, k, v, O, do, P, algorithm="standard", causal=True,
                               block_rows=32, block_cols=32)
    for g, gp in zip(grads, plain):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(gp))


# ---------------------------------------------------------------------------------------
# In the simulator, with the C++ entry points emulated in Python (each lane computes its
# own fragment entries from shared memory, in the layout of gpu/mma.cuh): checks the Numba
# side of the kernels (tiles, loads and stores, ragged N, masks, the softmax and dS rows,
# the counts) against the plain kernels. The C++ tile products are what the linked-build
# test and the `gpu` tests check.
# ---------------------------------------------------------------------------------------
def _np(x):
    if isinstance(x, np.ndarray):
        return x
    for attr in ("_item", "_ary"):
        if hasattr(x, attr):
            return _np(getattr(x, attr))
    return np.asarray(x)


def _lane():
    import threading
    return threading.current_thread().threadIdx.x % 32


def _frag(width):
    """(entry, row, column) of the lane's C fragments of a 16 x width product."""
    ln = _lane()
    g, q = ln >> 2, ln & 3
    return [(4 * nt + 2 * hh + u, g + 8 * hh, 8 * nt + 2 * q + u)
            for nt in range(width // 8) for hh in range(2) for u in range(2)]


def _emulated_externs(D, K):
    """The standard_tc entry points for (D, K): K = B_c (forward) or B_r (backward)."""
    def h(sm):
        return _np(sm).view(np.float16)

    def qk_smem(s, sm, aoff, astride, boff, bstride):       # 16 x K, inner D
        a, b = h(sm), h(sm)
        for e, r, c in _frag(K):
            x = a[2 * aoff + r * astride: 2 * aoff + r * astride + D].astype(np.float64)
            y = b[2 * boff + c * bstride: 2 * boff + c * bstride + D].astype(np.float64)
            s[e] = np.float32(x @ y)
        return 0

    def store(width):
        def f(sm, off, stride, c):
            a = h(sm)
            for e, r, col in _frag(width):
                a[2 * off + r * stride + col] = np.float16(c[e])
            return 0
        return f

    def ab(c, sm, aoff, astride, boff, bstride):            # 16 x D += A (16 x K) B (K x D)
        a = h(sm)
        for e, r, col in _frag(D):
            x = a[2 * aoff + r * astride: 2 * aoff + r * astride + K].astype(np.float64)
            y = a[2 * boff + col: 2 * boff + col + K * bstride: bstride].astype(np.float64)
            c[e] = np.float32(c[e] + x @ y)
        return 0

    def atb(c, sm, aoff, astride, boff, bstride):           # A stored transposed: K x 16
        a = h(sm)
        for e, r, col in _frag(D):
            x = a[2 * aoff + r: 2 * aoff + r + K * astride: astride].astype(np.float64)
            y = a[2 * boff + col: 2 * boff + col + K * bstride: bstride].astype(np.float64)
            c[e] = np.float32(c[e] + x @ y)
        return 0

    def cp16(sm, soff, g, goff, valid):
        s = _np(sm)
        s[soff:soff + 4] = _np(g)[goff:goff + 4] if valid else 0
        return 0

    def st16(g, goff, sm, soff):
        _np(g)[goff:goff + 4] = _np(sm)[soff:soff + 4]
        return 0

    nop = lambda: 0
    return dict(qk_smem=qk_smem, store_s=store(K), ab=ab, atb=atb, store_o=store(D),
                cp16=cp16, st16=st16, cp_commit=nop, cp_wait1=nop, cp_wait0=nop)


@pytest.fixture
def emulated(monkeypatch):
    from gpu import _tc
    from gpu._launch import SIM
    from gpu.backward import standard_tc as bwd
    from gpu.forward import standard_tc as fwd
    if not SIM:
        pytest.skip("the emulated entry points run in the simulator only")
    monkeypatch.setattr(_tc, "ptr", lambda a: _np(a).reshape(-1))
    monkeypatch.setattr(_tc, "ptr32", lambda a: _np(a).reshape(-1).view(np.uint32))
    monkeypatch.setattr(_tc, "check_aligned", lambda *a: None)
    monkeypatch.setattr(fwd, "externs", _emulated_externs)
    monkeypatch.setattr(bwd, "externs", _emulated_externs)
    caches = (fwd.tile_kernel, fwd.rowblock_kernel, fwd.softmax_kernel, bwd.colblock_kernel,
              bwd.ds_kernel)
    for c in caches:
        c.cache_clear()
    yield fwd, bwd
    for c in caches:
        c.cache_clear()


SIM_CASES = [
    (24, 16, 2, 1, True, (16, 16), False),     # GQA, causal, ragged, 16-byte moves
    pytest.param(36, 16, 1, 1, False, (32, 16), True,    # N % 8 != 0: element moves;
                 marks=pytest.mark.slow),                # block mask
]


@pytest.mark.parametrize("N,d,heads,kv_heads,causal,tiles,mask", SIM_CASES)
def test_kernels_with_emulated_tile_products(emulated, N, d, heads, kv_heads, causal, tiles,
                                             mask):
    from gpu.backward import attention_backward
    from gpu.backward.standard import standard_forward
    fwd, bwd = emulated
    B_r, B_c = tiles
    bm = None
    if mask:
        bm = np.array([[True, False, True], [False, False, False]])[:, :-(-N // B_c)]
    p = iosim.Problem(N=N, d=d, batch=1, heads=heads, kv_heads=kv_heads, dtype="fp16",
                      causal=causal, block_mask=bm)
    tiling = iosim.Tiling(B_r, B_c)
    q, k, v = iosim.random_inputs(p, 0)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
    tk = dict(causal=causal, block_rows=B_r, block_cols=B_c, block_mask=bm)
    O, P, led = fwd.forward_arrays(q, k, v, count_traffic=True, **tk)
    assert led.counts() == iosim.closed_form("standard", p, tiling).counts()
    O_pl, P_pl = standard_forward(q, k, v, **tk)
    np.testing.assert_array_equal(np.isnan(P), np.isnan(P_pl))
    ok = ~np.isnan(P_pl)
    np.testing.assert_allclose(P[ok].astype(np.float32), P_pl[ok], atol=1e-3)
    assert np.isfinite(O).all()
    np.testing.assert_allclose(O.astype(np.float32), O_pl, atol=2e-3)
    grads, bled = bwd.backward_arrays(q, k, v, do, P, count_traffic=True, **tk)
    assert bled.counts() == iosim.backward_closed_form("standard", p, tiling).counts()
    plain = attention_backward(q, k, v, O, do, P, algorithm="standard", **tk)
    for g, gp in zip(grads, plain):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g.astype(np.float32), gp, atol=3e-3, rtol=1e-2)


def _build_job():
    """The linked builds, one subprocess per config (started early, beside the simulator
    tests: tests/_background.py)."""
    ptx_dir = _background.mkdtemp("std-tc-ptx")
    env = dict(_background.environ(), NUMBA_ENABLE_CUDASIM="0")
    outs = []
    for c in CONFIGS:
        r = _background.run([sys.executable, "-c", BUILD, json.dumps(c), ptx_dir], env=env,
                            cwd=ROOT, timeout=900)
        outs.append((r.returncode, r.stdout, r.stderr))
    return outs, ptx_dir


@pytest.mark.prestart(job=_build_job)
def test_linked_build_uses_tensor_cores_and_registers_only():
    outs, ptx_dir = _background.result(_build_job)
    tmp_path = pathlib.Path(ptx_dir)
    rows = []
    for returncode, out, err in outs:
        if returncode != 0 and ("nvjitlink" in err.lower() or "nvrtc" in err.lower()
                                or "NVVM" in err):
            pytest.skip("cannot build linked code here: " + err.strip().splitlines()[-1])
        assert returncode == 0, out + err
        rows += json.loads(out.strip().splitlines()[-1])
    assert len(rows) == 8 * len(CONFIGS)
    for row in rows:
        B_r, B_c, d, causal, mask, count, vec = row["cfg"]
        assert row["mma"] == _mma_per_warp(row["kernel"], B_r, B_c, d), row
        assert row["local"] == 0 and row["call"] == 0 and row["f64"] == 0, row
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return
    for path in sorted(tmp_path.glob("*.ptx")):
        # ptxas may be older than nvJitLink's PTX ISA
        text = re.sub(r"^\.version \d+\.\d+", ".version 8.1", path.read_text(), flags=re.M)
        path.write_text(text)
        r = subprocess.run([ptxas, "-arch=sm_90", "-v", str(path), "-o", os.devnull],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip(f"ptxas cannot assemble nvJitLink's PTX here: {r.stderr[-300:]}")
        spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
        assert spills and all(int(s) == 0 for s in spills), (path.name, r.stderr)


# ---------------------------------------------------------------------------------------
# Dropout (issue 18): the keep mask Z stored by the softmax kernel, read by PV, dV and dP
# ---------------------------------------------------------------------------------------
def _drop_reference(q, k, v, do, prob, Zref):
    ref = iosim.reference_attention(q, k, v, causal=prob.causal, dropout_p=prob.dropout_p,
                                    dropout_keep=Zref)
    from iosim.backward import reference_attention_backward
    grads = reference_attention_backward(q, k, v, do, causal=prob.causal,
                                         dropout_p=prob.dropout_p, dropout_keep=Zref)
    return ref, grads


@pytest.mark.parametrize("N,d,heads,kv_heads,causal,tiles,p", [
    (24, 16, 2, 1, True, (16, 16), 0.3),       # GQA, causal, ragged, 16-byte moves
    (20, 16, 1, 1, False, (32, 16), 0.5),      # N % 8 != 0: element moves, B_r > N
])
def test_dropout_with_emulated_tile_products(emulated, N, d, heads, kv_heads, causal, tiles,
                                             p):
    """The tensor-core standard kernels with dropout (tile products emulated): the
    softmax kernel stores the plain kernels' keep mask (iosim's Philox bits) over the
    active tiles, PV / dV / dP read it; O equals the plain kernels' given the same seed and
    offset (fp16 rounding), O and the gradients the float64 reference given iosim's mask;
    counts equal iosim's closed forms with dropout (Z written and read RCA forward, read
    2 RCA backward)."""
    from gpu.backward.standard import standard_forward
    from iosim.dropout import problem_keep_mask
    fwd, bwd = emulated
    B_r, B_c = tiles
    seed, offset = 77, 3
    prob = iosim.Problem(N=N, d=d, batch=1, heads=heads, kv_heads=kv_heads, dtype="fp16",
                         causal=causal, dropout_p=p)
    t = iosim.Tiling(B_r, B_c)
    q, k, v = iosim.random_inputs(prob, 0)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
    tk = dict(causal=causal, block_rows=B_r, block_cols=B_c)
    dk = dict(dropout_p=p, dropout_seed=seed, dropout_offset=offset)
    O, P, Z, led = fwd.forward_arrays(q, k, v, count_traffic=True, **tk, **dk)
    assert led.counts() == iosim.closed_form("standard", prob, t).counts()
    Zref = problem_keep_mask(prob, seed, offset)
    act = np.kron(iosim.active_tiles(prob, t), np.ones((B_r, B_c), bool))[:N, :N]
    assert np.array_equal(Z[..., act] != 0, Zref[..., act])
    O_pl, P_pl, Z_pl = standard_forward(q, k, v, **tk, **dk)      # the plain kernels
    assert np.array_equal(Z[..., act], Z_pl[..., act])
    np.testing.assert_allclose(O.astype(np.float32), O_pl, atol=2e-3)
    ref, want = _drop_reference(q, k, v, do, prob, Zref)
    assert np.abs(O.astype(np.float64) - ref).max() < 5e-3 * max(1.0, np.abs(ref).max())
    grads, bled = bwd.backward_arrays(q, k, v, do, P, count_traffic=True, Z=Z, **tk, **dk)
    assert bled.counts() == iosim.backward_closed_form("standard", prob, t).counts()
    for g, w in zip(grads, want):     # (the plain backward reads Z as these kernels do:
        assert np.isfinite(g).all()   # test_dropout.py::test_standard_kernels_store_...)
        assert np.abs(g.astype(np.float64) - w).max() < 1e-2 * max(1.0, np.abs(w).max())
