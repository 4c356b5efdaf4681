"""gpu.forward.fa2_tc: fp16 / bf16 FlashAttention-2 on the tensor cores (linked CUDA C++ tile
products), any head dim d in 1..256 (padded to 16 in shared memory).

The simulator cannot run linked device functions, so without a GPU this file checks what
can be checked: the argument rules, the shared-memory layout, that `gpu.attention` falls
back (or refuses, with kernel='tc') where the kernel cannot run, and that every
specialisation builds and links (NVVM + NVRTC + nvJitLink, no GPU) into code with the
tensor-core instructions in it, the C++ inlined and nothing in local memory. Tests marked
`gpu` run the kernel (counts equal to iosim's closed form, accuracy against float64); the
full check against PyTorch runs on a GPU through `flashsim check --suite tc`.
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
# Pure parts (no numba.cuda needed beyond import)
# ---------------------------------------------------------------------------------------
def test_plan_error_names_the_parameter():
    from gpu.forward import fa2_tc
    assert fa2_tc.plan_error(128, 64, 64, "fp16") is None
    assert fa2_tc.plan_error(16, 16, 16, "fp16") is None
    assert "fp16 or bf16" in fa2_tc.plan_error(128, 64, 64, "fp32")
    assert fa2_tc.DTYPES == ("fp16", "bf16")
    assert fa2_tc.plan_error(128, 64, 64, "bf16") is None
    for d in (1, 40, 59, 111, 160, 192, 224, 256):          # padded to 16 on chip
        assert fa2_tc.plan_error(128, 64, d, "fp16") is None, d
    for d in (0, 257):
        assert f"d={d}" in fa2_tc.plan_error(128, 64, d, "fp16") and "1..256" in \
            fa2_tc.plan_error(128, 64, d, "fp16")
    # above d = 128 only one m-tile per warp (O's accumulators)
    assert "MT=2 at d=160" in fa2_tc.plan_error(128, 64, 160, "fp16", MT=2)
    assert "B_r=48" in fa2_tc.plan_error(48, 64, 64, "fp16")       # 3 warps: not generated
    assert "B_r=256" in fa2_tc.plan_error(256, 64, 64, "fp16")
    assert "B_c=8" in fa2_tc.plan_error(128, 8, 64, "fp16")
    assert "B_c=144" in fa2_tc.plan_error(128, 144, 64, "fp16")
    assert fa2_tc.plan_error(128, 64, 64, "fp16", MT=2) is None     # 4 warps of 32 rows
    assert "MT=3" in fa2_tc.plan_error(96, 64, 64, "fp16", MT=3)
    assert "B_r=16" in fa2_tc.plan_error(16, 64, 64, "fp16", MT=2)


@pytest.mark.parametrize("B_r,B_c,d", [(128, 64, 64), (64, 64, 128), (16, 48, 48),
                                       (128, 64, 40), (64, 32, 59), (128, 64, 256)])
def test_layout_regions_are_16_byte_aligned_and_disjoint(B_r, B_c, d):
    from gpu.forward import fa2_tc
    lay = fa2_tc.layout(B_r, B_c, d)
    D = -(-d // 16) * 16                   # the padded head dim of the tile products
    assert fa2_tc.padded(d) == D
    SW = (D + 8) // 2
    assert lay["SH"] == D + 8 and lay["SW"] == SW
    # ldmatrix / cp.async need 16-byte rows and region starts (4-byte words: multiples of 4)
    assert (2 * lay["SH"]) % 16 == 0
    for off in (lay["QO"], lay["KO"], lay["VO"], lay["KO"] + lay["KV"], lay["VO"] + lay["KV"],
                lay["LO"]):
        assert off % 4 == 0
    # Q | K0 V0 | K1 V1 | L, back to back
    assert lay["KO"] == B_r * SW and lay["VO"] == lay["KO"] + B_c * SW
    assert lay["KV"] == 2 * B_c * SW and lay["LO"] == lay["KO"] + 2 * lay["KV"]
    assert lay["bytes"] == 4 * (lay["LO"] + B_r)
    # the row stride keeps the 8 rows one ldmatrix phase reads in distinct 16-byte bank
    # groups: stride mod 128 bytes is an odd multiple of 16
    assert ((2 * lay["SH"]) % 128) // 16 % 2 == 1


def test_run_refuses_other_dtypes_and_mismatched_arrays():
    """dt must be one of DTYPES; bf16 data arrive as uint16 bits, fp16 as float16 (the
    message names the array, the dt and the array dtype wanted)."""
    from gpu.forward import fa2_tc
    kw = dict(B_r=64, B_c=64, causal=False, count=False)
    with pytest.raises(ValueError, match=r"fa2_tc: dt='fp32'; the tensor-core kernel takes "
                                         r"\('fp16', 'bf16'\)"):
        fa2_tc.run(None, None, None, None, None, 0.1, 64, 1, 1, None, None, dt="fp32", **kw)
    h = np.zeros((1, 64, 40), np.float16)
    with pytest.raises(ValueError, match="q: the tensor-core kernel fa2_tc takes dt='bf16' "
                                         "data as uint16 arrays \\(got dtype float16\\)"):
        fa2_tc.run(h, h, h, h, None, 0.1, 64, 1, 1, None, None, dt="bf16", **kw)
    u = h.view(np.uint16)
    with pytest.raises(ValueError, match="q: .*dt='fp16' data as float16 arrays"):
        fa2_tc.run(u, u, u, u, None, 0.1, 64, 1, 1, None, None, dt="fp16", **kw)


def test_listed_head_dims_have_a_tc_default_on_the_h100():
    """What gpu.api.fa2_tc_default picks on an H100 (227 KB of shared memory) for fp16 at
    d = 40, 59, 111, 160, 192, 224, 256: FA2_TC_FALLBACK's first tiling, which the kernel's
    rules accept and whose shared memory fits (on a GPU the test below runs them)."""
    from gpu import api
    from gpu.forward import fa2_tc
    B_r, B_c = api.FA2_TC_FALLBACK[0]
    for d in (40, 59, 111, 160, 192, 224, 256):
        assert d not in api.FA2_TC_TILES and d not in api.FA2_TC_TILES_CAUSAL
        assert fa2_tc.plan_error(B_r, B_c, d, "fp16", api.fa2_tc_mt(B_r, B_c, d)) is None
        assert fa2_tc.layout(B_r, B_c, d)["bytes"] <= 232448, d


def test_d256_default_tiling_fits_the_h100():
    """d = 256 at 128 x 64 (FA2_TC_FALLBACK's first): Q_i, two K/V buffers and L_i in
    the H100's 227 KB opt-in shared memory (232,448 bytes)."""
    from gpu.forward import fa2_tc
    b = fa2_tc.layout(128, 64, 256)["bytes"]
    assert b == 2 * (128 + 4 * 64) * (256 + 8) + 4 * 128 == 203264
    assert fa2_tc.plan_error(128, 64, 256, "fp16") is None and b <= 232448


def test_attention_kernel_argument_rules():
    import gpu
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 32, 16)).astype(np.float16) for _ in range(3))
    with pytest.raises(ValueError, match="kernel='yes' is not allowed; allowed: 'auto'"):
        gpu.attention(q, k, v, kernel="yes")
    with pytest.raises(ValueError, match="kernel='tc' needs float16 or bfloat16 inputs.*got fp32"):
        gpu.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                      kernel="tc")
    # fa1 and standard have tensor-core kernels too (gpu.forward.fa1_tc, standard_tc):
    # where they cannot run (here: the simulator, or an odd tiling) kernel='tc' says why
    from gpu._launch import SIM
    for alg in ("fa1", "standard"):
        with pytest.raises(ValueError, match=f"kernel='tc': the tensor-core {alg} kernels "
                                             f"cannot run fp16 with B_r=24"):
            gpu.attention(q, k, v, algorithm=alg, kernel="tc", block_rows=24, block_cols=16)
        if SIM:
            with pytest.raises(ValueError, match="simulator"):
                gpu.attention(q, k, v, algorithm=alg, kernel="tc", block_rows=16,
                              block_cols=16)
    with pytest.raises(ValueError, match="kernel='tc' needs float16.*fa1"):
        gpu.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                      algorithm="fa1", kernel="tc")
    # the fast standard kernels take fp16 too, but not 64 x 64 tiles with 16 threads
    with pytest.raises(ValueError, match="kernel='fast': the fast standard kernels cannot "
                                         "run fp16 with B_r=64, B_c=64, d=16"):
        gpu.attention(q, k, v, algorithm="standard", kernel="fast", block_rows=64,
                      block_cols=64, threads=16)


def test_deprecated_fast_and_tensor_cores_map_onto_kernel():
    """fast= and tensor_cores= still work for one release, with a DeprecationWarning
    naming the kernel= to use; contradictory or doubled choices are errors."""
    import gpu
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 32, 16)).astype(np.float16) for _ in range(3))
    with pytest.warns(DeprecationWarning, match="fast=False is deprecated.*kernel='plain'"):
        O = gpu.attention(q, k, v, fast=False, block_rows=16, block_cols=16)
    np.testing.assert_array_equal(O, gpu.attention(q, k, v, kernel="plain", block_rows=16,
                                                   block_cols=16))
    with pytest.warns(DeprecationWarning, match="tensor_cores=False"):
        gpu.attention(q, k, v, tensor_cores=False, block_rows=16, block_cols=16)
    with pytest.raises(ValueError, match="tensor_cores='yes' is not allowed"):
        gpu.attention(q, k, v, tensor_cores="yes")
    with pytest.raises(ValueError, match="contradictory"):
        gpu.attention(q, k, v, tensor_cores=True, fast=True)
    with pytest.raises(ValueError, match="give kernel= only"):
        gpu.attention(q, k, v, kernel="plain", fast=False)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="kernel='tc'"):
        gpu.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                      tensor_cores=True)


def test_tensor_cores_unavailable_is_refused_or_falls_back():
    """Where the kernel cannot run (here: the simulator; an unsupported tiling anywhere),
    kernel='tc' is a ValueError naming kernel, dtype, tiling and why, and kernel='auto'
    runs another fa2 kernel on the same schedule: same ledger as iosim."""
    import gpu
    from gpu._launch import SIM
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float16) for _ in range(3))
    with pytest.raises(ValueError, match="kernel='tc'.*fp16 with B_r=24, B_c=16, d=16: .*B_r=24"):
        gpu.attention(q, k, v, block_rows=24, block_cols=16, kernel="tc")
    if SIM:
        with pytest.raises(ValueError, match="simulator"):
            gpu.attention(q, k, v, block_rows=16, block_cols=16, kernel="tc")
    O, led = gpu.attention(q, k, v, block_rows=16, block_cols=16, count_traffic=True)
    want = iosim.closed_form("fa2", iosim.Problem(N=40, d=16, heads=2, dtype="fp16"),
                             iosim.Tiling(16, 16))
    assert led.counts() == want.counts()
    assert np.isfinite(O).all()


# ---------------------------------------------------------------------------------------
# The kernel's Python in the simulator, its C++ pieces emulated (tests/fa2_tc_sim.py)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt,N,N_k,d,causal,window,tiles,MT", [
    ("fp16", 40, 50, 40, True, (-1, -1), (16, 16), 1),     # padded 40 -> 48, 16-byte copies
    ("fp16", 37, 29, 59, True, (-1, -1), (16, 16), 1),     # odd d: element copies; rows
    ("fp16", 33, 20, 10, False, (4, 2), (16, 16), 1),      # that see no key; d % 8 != 0,
    ("fp16", 24, 40, 40, False, (-1, -1), (32, 16), 2),    # a window; two m-tiles per warp
    ("fp16", 20, 33, 130, False, (-1, -1), (16, 16), 1),   # padded 144 > 128: Q_w from shared
    ("fp16", 20, 33, 16, True, (-1, -1), (16, 16), 1),     # no padding
    ("bf16", 40, 50, 32, True, (-1, -1), (16, 16), 1),     # bf16
    ("bf16", 37, 29, 59, True, (-1, -1), (16, 16), 1)])
def test_padded_head_dims_in_the_simulator(dt, N, N_k, d, causal, window, tiles, MT):
    """The padded-d logic runs in the simulator (C++ pieces emulated, shared memory starting
    as NaN bits): counts equal iosim's closed form (the d real columns only), every O
    element written, O within 2 x the dt rounding of the float64 reference + 1e-5, L to
    1e-3, rows that see no key O = 0 and L = -inf, counting and plain builds identical."""
    from gpu._launch import SIM
    if not SIM:
        pytest.skip("the emulation runs in the CUDA simulator")
    import _tc_direct as tcd
    import fa2_tc_sim
    I, I_k = 2, 1
    (q, k, v), (q64, k64, v64) = tcd.inputs(I, I_k, N, N_k, d, dt, seed=N + d)
    with fa2_tc_sim.emulated():
        O, L, counts = fa2_tc_sim.run_sim(q, k, v, B_r=tiles[0], B_c=tiles[1], MT=MT,
                                          causal=causal, window=window, dt=dt)
        O2, _, _ = fa2_tc_sim.run_sim(q, k, v, B_r=tiles[0], B_c=tiles[1], MT=MT,
                                      causal=causal, window=window, count=False, dt=dt)
    O = tcd.to_f64(O, dt)
    O2 = tcd.to_f64(O2, dt)
    assert counts == tcd.model_counts(N, N_k, d, I, I_k, causal, window, tiles)
    np.testing.assert_array_equal(O, O2)
    allow = tcd.allowed(N, N_k, causal, window)
    ref, Lref = tcd.reference(q64, k64, v64, allow, 1.0 / np.sqrt(d))
    seen = allow.any(-1)
    assert not np.isnan(O).any() and not np.isnan(L).any()
    assert tcd.rel_err(O, ref, seen) <= tcd.bound(dt, ref, seen, None)
    assert np.abs(L[:, seen] - Lref[:, seen]).max() <= 1e-3
    assert (O[:, ~seen] == 0).all() and np.isneginf(L[:, ~seen]).all()


# ---------------------------------------------------------------------------------------
# The linked build (NVVM, NVRTC and nvJitLink: no GPU needed), in a subprocess with the
# simulator off
# ---------------------------------------------------------------------------------------
BUILD = r"""
import json, sys
from gpu.forward import fa2_tc
out = []
for cfg in json.loads(sys.argv[1]):
    B_r, B_c, d, causal, mask, count, MT, *rest = cfg  # optional 8th: window, 9th: dtype
    window = bool(rest and rest[0])
    dt = rest[1] if len(rest) > 1 else "fp16"
    p = fa2_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, window=window, dt=dt)
    out.append(dict(cfg=cfg, mma=p.count("mma.sync"), bf16_mma=p.count(".bf16.bf16.f32"),
                    ldmatrix=p.count("ldmatrix"), local=p.count(".local"),
                    call=len([l for l in p.splitlines() if l.strip().startswith("call")]),
                    f64=p.count(".f64"), cp_async=p.count("cp.async.cg"),
                    atom=p.count("atom."), st_v4=p.count("st.global.v4"),
                    ld_u16=p.count("ld.global.nc.u16"), st_u16=p.count("st.global.u16")))
    if len(sys.argv) > 2:
        open(sys.argv[2] + f"/{B_r}_{B_c}_{d}_{MT}_{int(window)}_{dt}.ptx", "w").write(p)
print(json.dumps(out))
"""

CONFIGS = [(128, 64, 64, False, False, False, 1),  # d = 64 default
           (256, 64, 64, True, False, False, 2),   # largest tile: 8 warps of 32 rows
           (64, 64, 128, True, False, False, 1),   # d = 128 default (causal or not)
           (128, 64, 64, True, True, True, 1),     # causal, block mask, instrumented
           (16, 16, 16, False, False, True, 1),    # one warp, smallest tiles
           (32, 48, 80, False, True, False, 1),    # d and B_c not powers of two
           (128, 64, 64, False, False, False, 2),  # two m-tiles of 16 rows per warp
           (64, 32, 48, True, True, True, 2),
           # local window (issue 18; N_k != N_q needs no flag: lo, hi are arguments)
           (64, 64, 128, True, False, False, 1, True),
           (128, 64, 64, False, False, False, 2, True),
           (64, 32, 48, True, True, True, 1, True),
           # bf16 (issue 18): mma.sync's bf16 form, same layouts
           (128, 64, 64, False, False, False, 1, False, "bf16"),
           (64, 32, 48, True, True, True, 2, True, "bf16"),
           # head dims padded to 16 on chip: 16-byte copies (d % 8 == 0) or element-wise
           # ones (59: odd); above 128 Q_w read from shared at each k step
           (128, 64, 40, True, False, True, 1),
           (64, 64, 59, True, True, True, 1, False, "bf16"),
           (128, 64, 256, False, False, False, 1),
           (128, 64, 160, True, True, True, 1, False, "bf16")]


def _build_job():
    """The linked build of CONFIGS in a subprocess (started early: tests/_background.py)."""
    ptx_dir = _background.mkdtemp("fa2-tc-ptx")
    env = dict(_background.environ(), NUMBA_ENABLE_CUDASIM="0")
    args = [sys.executable, "-c", BUILD, json.dumps(CONFIGS), ptx_dir]
    return _background.run(args, env=env, cwd=ROOT, timeout=600), ptx_dir


@pytest.mark.prestart(job=_build_job)
def test_linked_build_uses_tensor_cores_and_registers_only():
    """Every specialisation links into one kernel with the C++ inlined (no call), fragments
    in registers (no .local), exactly the mma.sync / ldmatrix count the tile loops imply,
    asynchronous K/V copies, 16-byte O stores, no float64, and atomics only when counting."""
    r, ptx_dir = _background.result(_build_job)
    tmp_path = pathlib.Path(ptx_dir)
    if r.returncode != 0 and ("nvjitlink" in r.stderr.lower() or "nvrtc" in r.stderr.lower()
                              or "NVVM" in r.stderr):
        pytest.skip("cannot build linked code here: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    for row in rows:
        B_r, B_c, d, causal, mask, count, MT = row["cfg"][:7]
        bf16 = row["cfg"][8:9] == ["bf16"]
        D = -(-d // 16) * 16                   # the padded head dim of the products
        steps = (B_c // 16) * D // 16
        # S: 2 mma per (key pair, k step, m-tile); O += P V: the same number
        assert row["mma"] == 4 * steps * MT, row
        assert row["bf16_mma"] == (row["mma"] if bf16 else 0), row
        # Q once per m-tile (D > 128: once per m-tile and k step of the unrolled S loop);
        # each K and V fragment once per step, shared by the m-tiles
        assert row["ldmatrix"] == MT * (D // 16) + 2 * steps, row
        assert row["local"] == 0 and row["call"] == 0 and row["f64"] == 0, row
        if d % 8 == 0:      # 16-byte asynchronous copies and stores
            assert row["cp_async"] > 0 and row["st_v4"] > 0 and row["st_u16"] == 0, row
        else:               # rows not 16-byte aligned: one element at a time
            assert row["cp_async"] == 0 and row["st_v4"] == 0, row
            assert row["ld_u16"] > 0 and row["st_u16"] > 0, row
        assert (row["atom"] > 0) == count, row
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return
    # ptxas may be older than nvJitLink's PTX ISA: the code uses nothing newer than 8.0
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
@pytest.mark.gpu
@pytest.mark.parametrize("N,d,causal,tiles", [(1000, 64, False, (128, 64)),
                                              (333, 128, True, (64, 64)),
                                              (77, 48, True, (32, 16))])
def test_fa2_tc_counts_and_accuracy_on_gpu(N, d, causal, tiles):
    """analysis.check.check_tc (what `flashsim check` runs): counts exact, error within
    2x PyTorch's own fp16 SDPA error (or 2x the fp16 rounding of O without torch), L,
    masked rows, plain = counted."""
    from analysis.check import check_tc
    row = check_tc(dict(N=N, d=d, bh=2, G=1, causal=causal, tiles=tiles, mask="none",
                        logit=1.0, MT=1))
    assert row["ok"], row["failures"]


# ---------------------------------------------------------------------------------------
# bf16 and padded head dims on a GPU (issue 18): the kernel launched directly on 16-bit
# arrays (bf16 as uint16 bits; tests/_tc_direct.py), whatever gpu.attention routes
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dt,N,N_k,d,causal,window,tiles,MT", [
    ("fp16", 200, 333, 40, True, (-1, -1), (128, 64), 1),
    ("fp16", 333, 200, 59, True, (-1, -1), (128, 64), 1),   # rows 0..132 see no key
    ("fp16", 257, 300, 111, False, (-1, -1), (64, 64), 1),
    ("fp16", 300, 257, 160, True, (64, 0), (128, 64), 1),
    ("fp16", 129, 200, 192, False, (-1, -1), (128, 64), 1),
    ("fp16", 200, 300, 224, False, (30, 30), (128, 64), 1),
    ("fp16", 256, 384, 256, True, (-1, -1), (128, 64), 1),
    ("fp16", 200, 200, 256, False, (-1, -1), (64, 64), 1),
    ("bf16", 300, 200, 64, True, (-1, -1), (128, 64), 1),
    ("bf16", 200, 333, 128, False, (-1, -1), (64, 64), 1),
    ("bf16", 256, 256, 64, False, (-1, -1), (128, 64), 2),
    ("bf16", 257, 300, 59, True, (-1, -1), (128, 64), 1),
    ("bf16", 77, 140, 40, False, (16, 8), (32, 16), 1),
    ("bf16", 200, 300, 256, False, (-1, -1), (128, 64), 1),
    ("bf16", 300, 200, 160, True, (-1, -1), (128, 64), 1)])
def test_fa2_tc_bf16_and_padded_d_on_gpu(dt, N, N_k, d, causal, window, tiles, MT):
    """Counts equal iosim's closed form exactly (the kernel requests the d real columns,
    never the padding); O within 2 x PyTorch SDPA's error in the same dtype + 1e-5 of
    float64 (grouped heads: 4 query heads on 2 K/V heads); L within TC_L_BOUND; every
    element written (outputs poisoned with NaN); rows that see no key O = 0, L = -inf;
    the counting and plain builds write identical O."""
    import _tc_direct as tcd
    from analysis.check import TC_L_BOUND
    I, I_k = 4, 2
    (q, k, v), (q64, k64, v64) = tcd.inputs(I, I_k, N, N_k, d, dt, seed=N + d)
    O, L, counts = tcd.run_forward(q, k, v, dt, tiles, causal, window, MT)
    O2, _, _ = tcd.run_forward(q, k, v, dt, tiles, causal, window, MT, count=False)
    assert counts == tcd.model_counts(N, N_k, d, I, I_k, causal, window, tiles)
    np.testing.assert_array_equal(O.view(np.uint16), O2.view(np.uint16))
    allow = tcd.allowed(N, N_k, causal, window)
    scale = 1.0 / np.sqrt(d)
    ref, Lref = tcd.reference(q64, k64, v64, allow, scale)
    O64 = tcd.to_f64(O, dt)
    assert np.isfinite(O64).all() and not np.isnan(L).any()
    seen = allow.any(-1)
    err = tcd.rel_err(O64, ref, seen)
    sdpa = tcd.sdpa_forward_err(q64, k64, v64, allow, scale, dt, ref, seen)
    assert err <= tcd.bound(dt, ref, seen, sdpa), (err, sdpa)
    assert (O64[:, ~seen] == 0).all() and np.isneginf(L[:, ~seen]).all()
    assert np.abs(L[:, seen] - Lref[:, seen]).max() <= TC_L_BOUND


@pytest.mark.gpu
def test_fa2_tc_default_runs_every_listed_head_dim_on_gpu():
    """gpu.attention picks the tensor-core kernel for fp16 at d = 40, 59, 111, 160, 192,
    224, 256 (its default tiling is the tc one and kernel='tc' with it runs: counts =
    closed form)."""
    import gpu
    from gpu import api
    for d in (40, 59, 111, 160, 192, 224, 256):
        t = api.fa2_tc_default(d)
        assert t is not None, d
        assert api.default_tiling("fa2", d, "fp16") == iosim.Tiling(*t)
        p = iosim.Problem(N=96, d=d, N_k=130, batch=1, heads=2, dtype="fp16", causal=True)
        q, k, v = iosim.random_inputs(p, d)
        O, led = gpu.attention(q, k, v, causal=True, kernel="tc", count_traffic=True)
        assert led.counts() == iosim.closed_form("fa2", p, iosim.Tiling(*t)).counts(), d
        assert np.isfinite(O).all(), d
