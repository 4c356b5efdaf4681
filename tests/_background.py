"""Subprocess work of the test suite, started early and run on a second core.

The simulator tests keep one core busy (the GIL); the linked builds (NVVM + nvJitLink +
ptxas) and the CLI runs in child processes are work of their own that can run beside
them. A test marks such work with `@pytest.mark.prestart(job=job)`, `job` a module-level
function that runs the subprocesses (through `run` / `popen` here) and returns what the
test checks; the test then calls `result(job)`. conftest.py submits every selected test's
jobs after collection: one background thread runs them one after another, in collection
order, while the tests run. `result(job)` waits for a job that is running, runs one that
has not started yet at once in the test itself, and re-raises the job's exception; a
job runs once per session, its value shared by the tests that mark it. Without
the hook (or with FLASHSIM_PRESTART=0) every job simply runs in its test: the same
commands, the same checks, only when they start differs.
"""
import os
import shutil
import subprocess
import tempfile
import threading

_lock = threading.Lock()
_jobs = {}          # job -> _Job
_queue = []
_procs = set()
_dirs = []
_thread = None
_closed = False
_env = _cwd = None      # the process environment and directory before the first test


class _Job:
    def __init__(self, fn):
        self.fn = fn
        self.state = "pending"         # pending -> running -> done
        self.done = threading.Event()
        self.value = self.error = None

    def run(self):
        try:
            self.value = self.fn()
        except BaseException as e:     # noqa: BLE001 (re-raised in the test)
            self.error = e
        finally:
            self.state = "done"
            self.done.set()


def enabled():
    return os.environ.get("FLASHSIM_PRESTART", "1") != "0"


def _take():
    with _lock:
        while _queue:
            job = _queue.pop(0)
            if job.state == "pending":
                job.state = "running"
                return job
    return None


def _worker():
    while not _closed:
        job = _take()
        if job is None:
            return
        job.run()


def environ():
    """A copy of os.environ as it was when the jobs were submitted (before any test ran):
    a job must not see what a running test has monkeypatched (FLASHSIM_RESULTS, ...)."""
    return dict(os.environ if _env is None else _env)


def submit(fns):
    """Queue `fns` (job functions, each once) for the background thread; start it."""
    global _thread, _env, _cwd
    if _env is None:
        _env, _cwd = dict(os.environ), os.getcwd()
    if not enabled():
        return
    with _lock:
        for fn in fns:
            if fn not in _jobs:
                _jobs[fn] = job = _Job(fn)
                _queue.append(job)
        if _queue and (_thread is None or not _thread.is_alive()):
            _thread = threading.Thread(target=_worker, name="flashsim-prestart", daemon=True)
            _thread.start()


def result(fn):
    """`fn()`'s value: from the background run if it was submitted, else run here now.
    One run per session: tests that share a job read the same value (and must not change
    what it made)."""
    with _lock:
        job = _jobs.get(fn)
        if job is None:
            job = _jobs[fn] = _Job(fn)
        start_here = job.state == "pending"
        if start_here:
            job.state = "running"
    if start_here:
        job.run()
    job.done.wait()
    if job.error is not None:
        raise job.error
    return job.value


def popen(args, **kw):
    """subprocess.Popen, killed at the end of the session if still running; env and cwd
    default to those of before the first test (`environ`), not the running test's."""
    kw.setdefault("env", environ())
    if _cwd is not None:
        kw.setdefault("cwd", _cwd)
    p = subprocess.Popen(args, **kw)
    with _lock:
        _procs.add(p)
    return p


def run(args, timeout=None, **kw):
    """subprocess.run(args, capture_output=True, text=True, ...) through `popen`."""
    p = popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        p.kill()
        p.communicate()
        raise
    finally:
        with _lock:
            _procs.discard(p)
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def check_suite(suite: str, timeout: float):
    """`flashsim check --suite SUITE --json FILE` in Numba's simulator, as a child process
    (for a background job): (exit status, stdout, stderr, the JSON or None)."""
    import json
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(mkdtemp("check"), "check.json")
    r = run([sys.executable, "-m", "analysis.cli", "check", "--suite", suite, "--json", out],
            cwd=root, timeout=timeout,
            env=dict(environ(), NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=root))
    data = json.loads(open(out).read()) if os.path.exists(out) else None
    return r.returncode, r.stdout, r.stderr, data


def mkdtemp(tag):
    """A fresh directory for a job's files, removed at the end of the session."""
    d = tempfile.mkdtemp(prefix=f"flashsim-{tag}-")
    with _lock:
        _dirs.append(d)
    return d


def close():
    """End of session: kill what still runs, remove the jobs' directories."""
    global _closed
    _closed = True
    with _lock:
        procs, dirs = list(_procs), list(_dirs)
        _queue.clear()
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
