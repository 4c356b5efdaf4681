"""`import gpu` on a machine without a CUDA GPU (gpu/_env.py): it falls back to Numba's
CUDA simulator on its own and says so once; FLASHSIM_REQUIRE_GPU=1 turns that into a
one-line error; NUMBA_ENABLE_CUDASIM, where set, is respected silently.

Each case runs in a fresh Python with a clean environment (no NUMBA_ENABLE_CUDASIM, no
FLASHSIM_REQUIRE_GPU), as a newcomer's first `import gpu` would, so that numba.cuda is
imported only there. Without a GPU the fallback cases run; with one they skip (there is
nothing to fall back from)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu._env import has_cuda_gpu

ROOT = Path(__file__).resolve().parents[1]
MESSAGE = "flashsim: no CUDA GPU found"

#: a tiny attention against iosim's float64 reference, two calls (the message is said once)
TINY = """
import numpy as np
import gpu, iosim
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 24, 16)).astype(np.float32) for _ in range(3))
for alg in ("fa2", "standard"):
    O = gpu.attention(q, k, v, algorithm=alg, causal=True)
    ref = iosim.reference_attention(q.astype(np.float64), k.astype(np.float64),
                                    v.astype(np.float64), causal=True)
    err = np.linalg.norm(O - ref) / np.linalg.norm(ref)
    assert err <= 1e-5, (alg, err)
import os
print("ok", os.environ["NUMBA_ENABLE_CUDASIM"])
"""


def _run(code, **env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("NUMBA_ENABLE_CUDASIM", "FLASHSIM_REQUIRE_GPU")}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), clean.get("PYTHONPATH", "")])
    clean.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=600)


no_gpu = pytest.mark.skipif(has_cuda_gpu(), reason="a CUDA GPU is present: no fallback")


@no_gpu
def test_import_gpu_falls_back_to_the_simulator_and_says_so_once():
    r = _run(TINY)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "1"]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert sum(MESSAGE in x for x in lines) == 1, r.stderr
    assert "simulator" in lines[[MESSAGE in x for x in lines].index(True)]


@no_gpu
def test_import_gpu_alone_loads_no_numba():
    r = _run("import sys, gpu, analysis.sweeps as s\n"
             "print(s.has_cuda_gpu(), sorted(m for m in sys.modules if m.startswith('numba')))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "[]"]
    assert MESSAGE not in r.stderr


@no_gpu
def test_require_gpu_fails_with_one_line():
    r = _run("import gpu\ngpu.attention", FLASHSIM_REQUIRE_GPU="1")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("gpu._env.GPURequiredError: FLASHSIM_REQUIRE_GPU=1 demands a CUDA "
                           "GPU"), r.stderr
    assert MESSAGE not in r.stderr


def test_require_gpu_refuses_an_explicit_simulator():
    r = _run("import gpu\ngpu.attention", FLASHSIM_REQUIRE_GPU="1", NUMBA_ENABLE_CUDASIM="1")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "GPURequiredError" in last and "NUMBA_ENABLE_CUDASIM=1" in last, r.stderr


def test_explicit_simulator_is_silent():
    r = _run(TINY, NUMBA_ENABLE_CUDASIM="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "1"]
    assert MESSAGE not in r.stderr
