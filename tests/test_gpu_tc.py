"""gpu.forward.fa2_tc: fp16 FlashAttention-2 on the tensor cores (linked CUDA C++ tile products).

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
    assert "fp16" in fa2_tc.plan_error(128, 64, 64, "fp32")
    assert "d=40" in fa2_tc.plan_error(128, 64, 40, "fp16")
    assert "B_r=48" in fa2_tc.plan_error(48, 64, 64, "fp16")       # 3 warps: not generated
    assert "B_r=256" in fa2_tc.plan_error(256, 64, 64, "fp16")
    assert "B_c=8" in fa2_tc.plan_error(128, 8, 64, "fp16")
    assert "B_c=144" in fa2_tc.plan_error(128, 144, 64, "fp16")
    assert fa2_tc.plan_error(128, 64, 64, "fp16", MT=2) is None     # 4 warps of 32 rows
    assert "MT=3" in fa2_tc.plan_error(96, 64, 64, "fp16", MT=3)
    assert "B_r=16" in fa2_tc.plan_error(16, 64, 64, "fp16", MT=2)


@pytest.mark.parametrize("B_r,B_c,d", [(128, 64, 64), (64, 64, 128), (16, 48, 48)])
def test_layout_regions_are_16_byte_aligned_and_disjoint(B_r, B_c, d):
    from gpu.forward import fa2_tc
    lay = fa2_tc.layout(B_r, B_c, d)
    SW = (d + 8) // 2
    assert lay["SH"] == d + 8 and lay["SW"] == SW
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


def test_attention_kernel_argument_rules():
    import gpu
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 32, 16)).astype(np.float16) for _ in range(3))
    with pytest.raises(ValueError, match="kernel='yes' is not allowed; allowed: 'auto'"):
        gpu.attention(q, k, v, kernel="yes")
    with pytest.raises(ValueError, match="kernel='tc' needs float16 inputs.*got fp32"):
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
# The linked build (NVVM, NVRTC and nvJitLink: no GPU needed), in a subprocess with the
# simulator off
# ---------------------------------------------------------------------------------------
BUILD = r"""
import json, sys
from gpu.forward import fa2_tc
out = []
for cfg in json.loads(sys.argv[1]):
    B_r, B_c, d, causal, mask, count, MT, *window = cfg     # window: optional 8th flag
    p = fa2_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, window=bool(window and window[0]))
    out.append(dict(cfg=cfg, mma=p.count("mma.sync"),
                    ldmatrix=p.count("ldmatrix"), local=p.count(".local"),
                    call=len([l for l in p.splitlines() if l.strip().startswith("call")]),
                    f64=p.count(".f64"), cp_async=p.count("cp.async.cg"),
                    atom=p.count("atom."), st_v4=p.count("st.global.v4")))
    if len(sys.argv) > 2:
        open(sys.argv[2] + f"/{B_r}_{B_c}_{d}_{MT}_{int(bool(window and window[0]))}.ptx",
             "w").write(p)
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
           (64, 32, 48, True, True, True, 1, True)]


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
        steps = (B_c // 16) * (d // 16)
        # S: 2 mma per (key pair, k step, m-tile); O += P V: the same number
        assert row["mma"] == 4 * steps * MT, row
        # Q once per m-tile; each K and V fragment once per step, shared by the m-tiles
        assert row["ldmatrix"] == MT * (d // 16) + 2 * steps, row
        assert row["local"] == 0 and row["call"] == 0 and row["f64"] == 0, row
        assert row["cp_async"] > 0 and row["st_v4"] > 0, row
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
