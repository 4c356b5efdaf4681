"""GPU or Numba's CUDA simulator, settled before numba.cuda is imported (Python's standard
library only: importing this module imports neither numba nor the kernels).

`has_cuda_gpu()` asks the CUDA driver (libcuda, through ctypes) whether it has a device;
`ensure_cuda_env()` sets NUMBA_ENABLE_CUDASIM=1 where it has none (silently: what
`analysis` calls before its kernel jobs); `use_backend()` is the kernels' own choice,
made once, before the first kernel module imports numba.cuda:

* NUMBA_ENABLE_CUDASIM already set (to anything): respected, silently;
* else a CUDA GPU: the kernels run on it;
* else FLASHSIM_REQUIRE_GPU=1 (or true, yes, on): `GPURequiredError`, one line;
* else NUMBA_ENABLE_CUDASIM=1 (Numba's simulator: same results, far slower), said once
  on stderr. Child processes inherit the variable, so they stay quiet.
"""
from __future__ import annotations

import ctypes
import os
import sys

#: the environment variable that demands a real GPU (no fallback to the simulator)
REQUIRE_VAR = "FLASHSIM_REQUIRE_GPU"


class GPURequiredError(RuntimeError):
    """FLASHSIM_REQUIRE_GPU demands a real CUDA GPU and there is none (or the simulator
    was chosen explicitly)."""


def has_cuda_gpu() -> bool:
    """True if the CUDA driver reports a device. Asks libcuda directly (ctypes), so that
    NUMBA_ENABLE_CUDASIM can still be set before numba.cuda is imported."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0:
            return count.value > 0
    return False


def ensure_cuda_env() -> bool:
    """Set NUMBA_ENABLE_CUDASIM=1 when no GPU is present (before numba.cuda is imported).
    Returns True when a real GPU will be used."""
    gpu = has_cuda_gpu()
    if not gpu:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    return gpu


def gpu_required() -> bool:
    """Whether FLASHSIM_REQUIRE_GPU demands a real GPU (1, true, yes, on)."""
    return os.environ.get(REQUIRE_VAR, "").strip().lower() in ("1", "true", "yes", "on")


_decided: bool | None = None


def use_backend() -> bool:
    """Settle GPU or simulator for this process (module docstring); True for a real GPU.
    Decided once; GPURequiredError (one line) where FLASHSIM_REQUIRE_GPU demands a GPU
    that the process will not use."""
    global _decided
    if _decided is not None:
        return _decided
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM")
    if sim is not None:
        on_sim = sim.strip() not in ("", "0")
        if on_sim and gpu_required():
            raise GPURequiredError(f"{REQUIRE_VAR}=1 demands a CUDA GPU, but "
                                   f"NUMBA_ENABLE_CUDASIM={sim} selects Numba's simulator; "
                                   f"unset one of them")
        _decided = not on_sim
        if on_sim:
            _fast_simulator()
        return _decided
    if has_cuda_gpu():
        _decided = True
        return True
    if gpu_required():
        raise GPURequiredError(f"{REQUIRE_VAR}=1 demands a CUDA GPU, but the CUDA driver "
                               f"(libcuda) reports none; unset {REQUIRE_VAR} to run the "
                               f"kernels in Numba's CUDA simulator")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    sys.stderr.write("flashsim: no CUDA GPU found; the gpu kernels run in Numba's CUDA "
                     f"simulator (same results, much slower; {REQUIRE_VAR}=1 makes this "
                     "an error)\n")
    _decided = False
    _fast_simulator()
    return False


def _fast_simulator() -> None:
    """The simulator's block scheduler without its busy-wait (`gpu._simsync`): the same
    results, a fraction of the time."""
    from . import _simsync
    _simsync.install()
