"""Test set-up: decide real GPU or Numba's CUDA simulator BEFORE numba.cuda is imported.

A CUDA GPU is detected by asking the driver directly (ctypes, libcuda), so that importing
numba.cuda happens only after NUMBA_ENABLE_CUDASIM is settled. Tests marked `gpu` need
real hardware and are skipped without it (the same checks run on a GPU through
`flashsim check`).
"""
import os

import pytest

# analysis.sweeps imports iosim and numpy only, never numba.cuda: safe to use here
from analysis.sweeps import has_cuda_gpu

HAS_GPU = has_cuda_gpu()
if not HAS_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    # the simulator's block scheduler without its busy-wait (gpu/_simsync.py): same
    # results, a fraction of the time
    from gpu import _simsync
    SIM_EVENT_DRIVEN = _simsync.install()
    # the simulator runs each CUDA thread as a Python thread; at the default GIL switch
    # interval (5 ms) the runnable ones hand the GIL round so often that the handovers
    # cost about half of every kernel's time (measured: 24 s -> 11 s on test_fp16_causal
    # and test_wrong_O_own_rows_exact). Which thread runs when is not what the tests
    # check: a kernel's result must not depend on it (threads meet at syncthreads()).
    import sys
    sys.setswitchinterval(0.05)
# gpu.attention NaN-fills its outputs only in validation mode: the tests check that no
# element is left unwritten, so they run in it (gpu.api.POISON, read at import)
os.environ.setdefault("FLASHSIM_POISON", "1")


def pytest_report_header(config):
    if HAS_GPU:
        return "CUDA: real GPU"
    sched = "event-driven block scheduler" if SIM_EVENT_DRIVEN else "its own block scheduler"
    return f"CUDA: Numba simulator (NUMBA_ENABLE_CUDASIM=1), {sched}"


def pytest_collection_modifyitems(config, items):
    if not HAS_GPU:
        skip = pytest.mark.skip(reason="needs a real CUDA GPU (run `flashsim check` on a GPU)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    import _background
    if _background.enabled():
        # the tests that read a background job (prestart) run last, in their own order:
        # their jobs, started after collection, then run beside every other test instead
        # of holding up the test that waits for them
        waits = [item for item in items if item.get_closest_marker("prestart")]
        items[:] = [item for item in items if not item.get_closest_marker("prestart")] + waits


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "prestart(job=fn): start the test's subprocess work `job` in the "
        "background after collection (tests/_background.py); the test reads it with "
        "_background.result(job)")


def pytest_collection_finish(session):
    import _background
    jobs = []
    for item in session.items:
        if "gpu" in item.keywords and not HAS_GPU:
            continue
        for mark in item.iter_markers("prestart"):
            if mark.kwargs["job"] not in jobs:
                jobs.append(mark.kwargs["job"])
    _background.submit(jobs)


def pytest_sessionfinish(session, exitstatus):
    import _background
    _background.close()
