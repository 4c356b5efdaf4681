"""Sweeps on Ray (issue 22): `flashsim sweep --executor ray`.

One local Ray cluster (2 CPUs) for the module. A model sweep and a small kernel sweep
(Numba's CUDA simulator on the workers) give rows equal to the local executor's, key by
key, minus where/when fields; so do sweeps whose worker process is killed mid-sweep
(Ray retries the task; or, with no retries, the lost points become error rows that a
rerun evaluates) and a sweep whose driver is interrupted and then resumed (only the
missing points are evaluated). Bad --executor/--address input is one line, exit 2.
The Ray tests are skipped when Ray is not installed (pip install -e '.[ray]').
"""
import os
import signal
import sys

import pytest

from analysis.cli import main as cli
from analysis.executor import RayExecutor
from analysis.sweeps import (WHERE_FIELDS, evaluate_kernel, evaluate_model, grid, point_key,
                             read_rows, run_sweep)

MODEL_POINTS = grid(algorithm=["standard", "fa1", "fa2"], N=[256, 1024], d=[64, 128],
                    sram_bytes=[16384, 65536])
KERNEL_POINTS = grid(algorithm=["fa1", "fa2"], N=[32, 64], d=[16], block_rows=[16],
                     block_cols=[16])


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")
    # the test helpers below travel to the workers by value (tests/ is not on their path)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # one (pretend) GPU: kernel tasks that ask for it run, in the simulator (inherited
    # NUMBA_ENABLE_CUDASIM=1), with CUDA_VISIBLE_DEVICES set by Ray
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def _content(path) -> dict:
    """key -> row without the fields that say where and when it was made."""
    return {r["key"]: {k: v for k, v in r.items() if k not in WHERE_FIELDS}
            for r in read_rows(path)}


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory):
    """The local executor's rows (the reference), computed once."""
    d = tmp_path_factory.mktemp("local")
    run_sweep(MODEL_POINTS, d / "m.jsonl", evaluate_model)
    run_sweep(KERNEL_POINTS, d / "k.jsonl", evaluate_kernel)
    return {"model": _content(d / "m.jsonl"), "kernel": _content(d / "k.jsonl")}


class _KillOnce:
    """An evaluate that SIGKILLs its own (worker) process at the point `victim`, the
    first time only (a marker file remembers), else evaluates as `evaluate`."""

    def __init__(self, evaluate, victim: dict, marker: str):
        self.evaluate, self.victim, self.marker = evaluate, point_key(victim), marker

    def __call__(self, p):
        if point_key(p) == self.victim and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.evaluate(p)


def _check_rows(path, expected, backend):
    rows = read_rows(path)
    with open(path) as f:
        assert sum(1 for _ in f) == len(expected)          # one line per point
    assert _content(path) == expected
    for r in rows:
        w = r["where"]
        assert w["executor"] == "ray" and w["ray_node"] and w["host"] and w["versions"]["ray"]
        assert r["made_at"].endswith("+00:00")
        if backend == "kernel":
            assert w["gpu"] == "Numba CUDA simulator"
        else:
            assert w["gpu"] is None


@pytest.mark.parametrize("backend", ["model", "kernel"])
def test_ray_sweep_equals_local(ray_cluster, local_rows, tmp_path, backend):
    pts, evaluate = ((MODEL_POINTS, evaluate_model) if backend == "model"
                     else (KERNEL_POINTS, evaluate_kernel))
    ex = RayExecutor()
    st = run_sweep(pts, tmp_path / "r.jsonl", evaluate, executor=ex)
    assert st == {"done": len(pts), "skipped": 0, "errors": 0}
    assert ex.stats["tasks"] >= 2 and ex.stats["points"] == len(pts)
    _check_rows(tmp_path / "r.jsonl", local_rows[backend], backend)
    # a rerun does nothing
    assert run_sweep(pts, tmp_path / "r.jsonl", evaluate, executor=RayExecutor())["done"] == 0


@pytest.mark.parametrize("backend", ["model", "kernel"])
def test_ray_lost_worker_is_retried(ray_cluster, local_rows, tmp_path, backend):
    """A worker killed mid-task: Ray re-runs the task, every row is written once."""
    pts, evaluate = ((MODEL_POINTS, evaluate_model) if backend == "model"
                     else (KERNEL_POINTS, evaluate_kernel))
    victim = pts[len(pts) // 2]
    kill = _KillOnce(evaluate, victim, str(tmp_path / "killed"))
    st = run_sweep(pts, tmp_path / "r.jsonl", kill, executor=RayExecutor(points_per_task=len(pts)),
                   backend=backend)
    assert os.path.exists(tmp_path / "killed")             # the worker was killed
    assert st == {"done": len(pts), "skipped": 0, "errors": 0}
    _check_rows(tmp_path / "r.jsonl", local_rows[backend], backend)


def test_ray_lost_worker_without_retries_then_resume(ray_cluster, local_rows, tmp_path):
    """No retries: the killed task's unfinished points are error rows (its finished rows
    are kept); the rerun evaluates exactly those, and the rows then equal the local ones."""
    pts = MODEL_POINTS
    path = tmp_path / "r.jsonl"
    kill = _KillOnce(evaluate_model, pts[5], str(tmp_path / "killed"))
    st = run_sweep(pts, path, kill, executor=RayExecutor(points_per_task=4, max_retries=0),
                   backend="model")
    rows = read_rows(path)
    lost = [r for r in rows if r["status"] == "error"]
    assert st["done"] == len(pts) and st["errors"] == len(lost) >= 1
    assert point_key(pts[5]) in {r["key"] for r in lost}
    assert all("ray task lost" in r["error"] for r in lost)
    assert len(lost) <= 4                                   # only that task's points
    st = run_sweep(pts, path, evaluate_model, executor=RayExecutor())
    assert st == {"done": len(lost), "skipped": len(pts) - len(lost), "errors": 0}
    _check_rows(path, local_rows["model"], "model")


def test_ray_interrupted_driver_resumes(ray_cluster, local_rows, tmp_path):
    """The driver stops after 5 rows (KeyboardInterrupt): those 5 are in the file, and the
    rerun evaluates only the others."""
    path = tmp_path / "r.jsonl"
    seen = []

    def progress(msg):
        seen.append(msg)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(MODEL_POINTS, path, evaluate_model, executor=RayExecutor(points_per_task=1),
                  progress=progress)
    assert len(read_rows(path)) == 5
    st = run_sweep(MODEL_POINTS, path, evaluate_model, executor=RayExecutor())
    assert st == {"done": len(MODEL_POINTS) - 5, "skipped": 5, "errors": 0}
    _check_rows(path, local_rows["model"], "model")


_KILLED_DRIVER = """
import sys, time
import ray
from analysis.executor import RayExecutor
from analysis.sweeps import evaluate_model, grid, run_sweep
sys.path.insert(0, sys.argv[3])
from test_sweep_ray import MODEL_POINTS

def slow(p):                     # defined in __main__: travels to the workers by value
    time.sleep(0.3)
    return evaluate_model(p)

ray.init(address=sys.argv[1], logging_level="WARNING")
run_sweep(MODEL_POINTS, sys.argv[2], slow, executor=RayExecutor(points_per_task=1),
          backend="model")
"""


def test_ray_killed_driver_resumes(ray_cluster, local_rows, tmp_path):
    """A driver process SIGKILLed mid-sweep (its file may end in a torn line): the rows it
    wrote stay, and the rerun evaluates only the others."""
    import subprocess
    import time
    path = tmp_path / "r.jsonl"
    address = ray_cluster.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_DRIVER, address, str(path),
                             os.path.dirname(os.path.abspath(__file__))], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists() and path.read_bytes().count(b"\n") >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the driver ended before it was killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    kept = len(read_rows(path))
    assert 3 <= kept < len(MODEL_POINTS)
    st = run_sweep(MODEL_POINTS, path, evaluate_model, executor=RayExecutor())
    assert st == {"done": len(MODEL_POINTS) - kept, "skipped": kept, "errors": 0}
    _check_rows(path, local_rows["model"], "model")


class _NeedsGpu:
    """An evaluate that fails unless Ray gave its task a GPU."""

    def __init__(self, evaluate):
        self.evaluate = evaluate

    def __call__(self, p):
        import ray
        if not ray.get_gpu_ids() or not os.environ.get("CUDA_VISIBLE_DEVICES"):
            raise RuntimeError("the task was given no GPU")
        return self.evaluate(p)


def test_ray_kernel_tasks_take_one_gpu_each(ray_cluster, local_rows, tmp_path, monkeypatch):
    """Not simulating (a cluster that is not local, NUMBA_ENABLE_CUDASIM unset here):
    each kernel task asks for one GPU and runs in a fresh worker process."""
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM")
    pts = KERNEL_POINTS[:2]
    ex = RayExecutor(address="auto", points_per_task=1)   # Ray is initialised: that cluster
    st = run_sweep(pts, tmp_path / "k.jsonl", _NeedsGpu(evaluate_kernel), executor=ex,
                   backend="kernel")
    rows = read_rows(tmp_path / "k.jsonl")
    assert st == {"done": 2, "skipped": 0, "errors": 0}, [r.get("error") for r in rows]
    assert len({r["where"]["pid"] for r in rows}) == 2            # one worker per task
    assert _content(tmp_path / "k.jsonl") == {r["key"]: local_rows["kernel"][r["key"]]
                                              for r in rows}


def test_ray_kernel_points_need_a_gpu(ray_cluster, tmp_path, monkeypatch):
    """On a cluster that is not local and has no GPU, kernel points (which ask for one GPU
    each) are refused, naming the simulator switch, unless NUMBA_ENABLE_CUDASIM=1."""
    from iosim import ConfigError
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(ray_cluster, "cluster_resources", lambda: {"CPU": 2.0})
    ex = RayExecutor(address="auto")          # Ray is initialised: that cluster is used
    with pytest.raises(ConfigError, match="no GPU.*NUMBA_ENABLE_CUDASIM=1"):
        run_sweep(KERNEL_POINTS, tmp_path / "k.jsonl", evaluate_kernel, executor=ex)
    assert read_rows(tmp_path / "k.jsonl") == []


def test_cli_sweep_executor_ray(ray_cluster, local_rows, tmp_path, capsys):
    out = tmp_path / "k.jsonl"
    rc = cli(["sweep", "--out", str(out), "--backend", "kernel", "--algorithm", "fa1,fa2",
              "--seq-len", "32,64", "--head-dim", "16", "--block-rows", "16", "--block-cols",
              "16", "--executor", "ray", "--executor-stats"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "4 new rows (0 errors)" in text and "executor ray: 4 points" in text
    assert "ms/point" in text
    _check_rows(out, local_rows["kernel"], "kernel")


# ---------------------------------------------------------------------------------------
# Bad input: one line, exit 2 (no Ray needed)
# ---------------------------------------------------------------------------------------
SWEEP = ["sweep", "--seq-len", "256", "--sram-bytes", "16384"]


@pytest.mark.parametrize("extra, needles", [
    (["--executor", "foo"], ["--executor='foo'", "local, ray"]),
    (["--address", "auto"], ["--address='auto'", "--executor ray"]),
    (["--points-per-task", "2"], ["--points-per-task=2", "--executor ray"]),
])
def test_cli_executor_bad_input(tmp_path, capsys, extra, needles):
    out = tmp_path / "s.jsonl"
    assert cli(SWEEP + ["--out", str(out)] + extra) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and all(n in err[0] for n in needles), err
    assert not out.exists()


def test_cli_executor_ray_without_ray(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray -> ImportError
    assert cli(SWEEP + ["--out", str(tmp_path / "s.jsonl"), "--executor", "ray"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "pip install -e '.[ray]'" in err[0], err


# ---------------------------------------------------------------------------------------
# The hardware-counter / timing validations (analysis.hwmeasure) on an executor
# ---------------------------------------------------------------------------------------
HW_CONFIGS = [{"id": f"cfg{i}", "N": 64 * (i + 1)} for i in range(5)]


class _FakeMeasure:
    """Stands in for hwmeasure.time_row (which needs torch and a GPU): a row per config,
    killing its worker once at `victim` (marker file) to exercise Ray's retry."""

    def __init__(self, victim=None, marker=None):
        self.victim, self.marker = victim, marker

    def __call__(self, c):
        if c["id"] == self.victim and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"kind": "runtime_measurement", "config": c, "status": "ok",
                "measured": {"measured_ms": c["N"] / 64.0}, "where": {"pid": os.getpid()},
                "eval_seconds": 0.0}


def _hw_rows(path):
    import json
    with open(path) as f:
        rows = [json.loads(x) for x in f]
    return {r["config"]["id"]: (r["status"], r["measured"]) for r in rows}, len(rows)


def test_hwmeasure_rows_equal_local_on_ray_and_resume(ray_cluster, tmp_path, monkeypatch):
    import time
    from analysis import hwmeasure
    from analysis.executor import LocalExecutor
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    loc = tmp_path / "local.jsonl"
    n = hwmeasure._run_executor(LocalExecutor(), _FakeMeasure(), HW_CONFIGS,
                                "runtime_measurement", str(loc), 60, time.time(), "times")
    assert n == 5
    ray_out = tmp_path / "ray.jsonl"
    ex = RayExecutor(points_per_task=2)
    with ex:   # a worker dies at cfg3 once: Ray re-runs its task, rows are not repeated
        n = hwmeasure._run_executor(ex, _FakeMeasure("cfg3", str(tmp_path / "killed")),
                                    HW_CONFIGS, "runtime_measurement", str(ray_out), 60,
                                    time.time(), "times")
    assert (tmp_path / "killed").exists()
    got, lines = _hw_rows(ray_out)
    assert got == _hw_rows(loc)[0] and lines == 5 == n
    # resume: hwmeasure skips the configurations whose ok rows are already in the file
    assert hwmeasure._done_ids(str(ray_out)) == {c["id"] for c in HW_CONFIGS}


def test_hwmeasure_executor_bad_input_is_one_line(capsys):
    from analysis import hwmeasure
    assert hwmeasure.main(["times", "--executor", "dask"]) == 2
    assert "--executor='dask' is not known" in capsys.readouterr().err
    assert hwmeasure.main(["counters", "--address", "auto"]) == 2
    assert "--address='auto'" in capsys.readouterr().err
