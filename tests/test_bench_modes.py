"""`flashsim bench --decode / --call-overhead / --backward` without a GPU: argument
parsing, one-line errors, the GPU / torch message, and the rows (decode: a fake torch and
a fake timer around the real decode kernels in Numba's simulator; backward: --smoke)."""
import json
import types
from pathlib import Path

import numpy as np
import pytest

import _background
from analysis import bench as B
from analysis.cli import main as cli_main

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "data"


def _err(capsys):
    out = capsys.readouterr()
    assert out.err.count("\n") == 1, out.err          # one line, no traceback
    return out.err


@pytest.mark.parametrize("argv, words", [
    (["--decode"], ["--out is required with --decode"]),
    (["--call-overhead"], ["--out is required with --call-overhead"]),
    (["--decode", "--impls", "fa2", "--out", "x.jsonl"],
     ["--impls does not apply to --decode", "--budget-s"]),
    (["--decode", "--reps", "5", "--out", "x.jsonl"], ["reps=5 is not allowed", ">= 20"]),
    (["--decode", "--budget-s", "0", "--out", "x.jsonl"], ["budget_s=0.0"]),
    (["--quick"], ["--quick does not apply to the forward sweep"]),
    (["--backward", "--no-checks", "--out", "x.jsonl"], ["--no-checks does not apply to --backward"]),
    (["--call-overhead", "--head-dims", "64,128", "--out", "x.jsonl"],
     ["head_dims=64,128 is not allowed", "one value"]),
    (["--call-overhead", "--impls", "fa3", "--out", "x.jsonl"], ["impls='fa3'", "fa2_kernel"]),
    (["--call-overhead", "--reps", "2", "--out", "x.jsonl"], ["reps=2", ">= 5"]),
    (["--backward", "--causal", "on", "--out", "x.jsonl"], ["causal='on'", "off, both"]),
    (["--backward", "--seq-lens", "1024,4096", "--out", "x.jsonl"], ["seq_lens=1024,4096"]),
    (["--backward", "--batch-heads", "0", "--out", "x.jsonl"], ["batch_heads=0"]),
    (["--backward", "--warm", "-1", "--out", "x.jsonl"], ["warm=-1"]),
])
def test_bad_input_one_line_status_2(argv, words, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(B, "gpu_problem", lambda: pytest.fail("checked the GPU first"))
    assert cli_main(["bench", *argv]) == 2
    err = _err(capsys)
    assert err.startswith("flashsim bench")
    for w in words:
        assert w in err, err


def test_one_benchmark_at_a_time(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "--decode", "--backward", "--out", "x.jsonl"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_out_checked_before_anything(tmp_path, capsys):
    assert cli_main(["bench", "--decode", "--out", str(tmp_path)]) == 2
    assert "is a directory" in _err(capsys)


@pytest.mark.parametrize("mode", ["--decode", "--call-overhead", "--backward"])
def test_says_it_needs_a_gpu_and_torch(mode, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(B, "gpu_problem", lambda: "PyTorch (torch) is not installed; "
                                                  "flashsim bench needs torch with CUDA")
    out = tmp_path / "rows.jsonl"
    assert cli_main(["bench", mode, "--out", str(out)]) == 2
    err = _err(capsys)
    assert f"flashsim bench {mode}: error: needs a CUDA GPU with PyTorch" in err
    assert "torch" in err and not out.exists()


def test_options_reach_the_benchmarks(monkeypatch, tmp_path):
    """Each benchmark gets its defaults, and the options given, as keyword arguments."""
    from analysis import bench_backward, bench_calls, bench_decode
    got = {}
    for mod in (bench_decode, bench_calls, bench_backward):
        monkeypatch.setattr(mod, "run", lambda _m=mod, **kw: got.setdefault(_m.__name__, kw) and 0)
    monkeypatch.setattr(B, "gpu_problem", lambda: None)
    out = str(tmp_path / "r.jsonl")
    assert cli_main(["bench", "--decode", "--out", out]) == 0
    assert got["analysis.bench_decode"] == dict(out=out, budget_s=330.0, reps=20, quick=False,
                                                checks=True, sweep=True, main="auto")
    got.clear()
    assert cli_main(["bench", "--decode", "--main", "tc", "--out", out]) == 0
    assert got["analysis.bench_decode"]["main"] == "tc"
    assert cli_main(["bench", "--call-overhead", "--seq-lens", "512", "--no-profile",
                     "--out", out]) == 0
    assert got["analysis.bench_calls"] == dict(
        out=out, seq_lens=[512], reps=50, batch_heads=16, head_dim=64,
        impls=list(bench_calls.IMPLS), run_id=None, profile=False)
    assert cli_main(["bench", "--backward", "--head-dims", "64", "--causal", "off",
                     "--no-torch", "--out", out]) == 0
    assert got["analysis.bench_backward"] == dict(
        out=out, N=4096, batch_heads=16, head_dims=(64,), causal=(False,), reps=20, warm=3,
        torch_rows=False, variants=True, plain=False, run_id=None, smoke=False)


def test_help_lists_the_benchmarks_with_examples(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "--help"])
    text = capsys.readouterr().out
    for w in ("--decode", "--call-overhead", "--backward", "--smoke", "--tilings",
              "flashsim bench --decode --out", "flashsim bench --call-overhead",
              "flashsim bench --backward"):
        assert w in text


# ---------------------------------------------------------------------------------------
# decode rows: the real kernels (simulator) under a fake torch and a fake timer
# ---------------------------------------------------------------------------------------
class _T(np.ndarray):
    """Just enough of a torch tensor for analysis.bench_decode.Bench.point."""

    def float(self):
        return np.asarray(self, np.float32).view(_T)

    def abs(self):
        return np.abs(self)

    def to(self, dtype):
        return np.asarray(self, dtype).view(_T)

    def contiguous(self):
        return self


def _fake_torch(free_bytes):
    class Gen:
        def __init__(self, device=None):
            self.rng = np.random.default_rng(0)

        def manual_seed(self, s):
            self.rng = np.random.default_rng(s)
            return self

    cuda = types.SimpleNamespace(empty_cache=lambda: None, synchronize=lambda: None,
                                 mem_get_info=lambda: (free_bytes, free_bytes))
    F = types.SimpleNamespace(
        scaled_dot_product_attention=lambda q, k, v, scale, enable_gqa: np.zeros_like(q))
    return types.SimpleNamespace(
        float16=np.float16, float32=np.float32, int32=np.int32, cuda=cuda, Generator=Gen,
        nn=types.SimpleNamespace(functional=F),
        randn=lambda shape, device, dtype, generator:
            generator.rng.standard_normal(shape).astype(dtype).view(_T),
        randperm=lambda n, device, generator: generator.rng.permutation(n).view(_T),
        empty=lambda shape, device, dtype: np.zeros(shape, dtype).view(_T))


def _bench(tmp_path, monkeypatch, free_bytes=10**10):
    from numba import cuda
    from analysis import bench_decode as D
    monkeypatch.setattr(D, "ATTN", {"mha": (2, 2), "gqa": (4, 2)})   # small: the simulator
    monkeypatch.setattr(D, "ROTATE_BYTES", 1)                       # two input sets
    out = tmp_path / "rows.jsonl"
    w = D.Writer(str(out), dict(run_id="t", device="sim", date="2026-12-06", commit=None,
                                versions={}))
    b = D.Bench.__new__(D.Bench)
    calls = []

    def timer(fn, n_sets):          # the fake timing source: one call, fixed times
        calls.append(n_sets)
        fn(0)
        return 0.5, 0.25
    b.w, b.torch, b.reps, b.fa, b.sms, b.timer = w, _fake_torch(free_bytes), 20, None, 132, timer
    b.cuda = types.SimpleNamespace(as_cuda_array=lambda x, sync=False: cuda.to_device(
        np.ascontiguousarray(x)))
    return b, out, calls


def _data_keys(pred):
    """The fields every data-set row matching pred has."""
    keys = None
    for line in (DATA / "decode_bench.jsonl").read_text().splitlines():
        r = json.loads(line)
        if pred(r):
            keys = set(r) if keys is None else keys & set(r)
    assert keys, "no such rows in the data set"
    return keys


def test_decode_rows_have_the_data_sets_fields(tmp_path, monkeypatch):
    b, out, calls = _bench(tmp_path, monkeypatch)
    b.point(1, "gqa", 64, 64, None)
    b.point(1, "mha", 64, 64, None, num_splits=2, sweep="num_splits", impls=("flashsim",),
            name="b1_mha_d64_64")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["impl"], r["status"]) for r in rows] == [("flashsim", "ok"),
                                                        ("torch_sdpa", "ok"),
                                                        ("flashsim", "ok")]
    assert calls == [2, 2, 2]
    plain = lambda r: r["status"] == "ok" and not r.get("sweep")       # noqa: E731
    # every field the data set's rows have (readers use them); new fields may be added
    assert set(rows[0]) >= _data_keys(lambda r: plain(r) and r["impl"] == "flashsim")
    assert set(rows[1]) >= _data_keys(lambda r: plain(r) and r["impl"] == "torch_sdpa")
    assert set(rows[2]) >= _data_keys(lambda r: r.get("sweep") == "num_splits")
    r = rows[0]
    assert r["kind"] == "decode_bench" and r["ms_median"] == 0.5 and r["ms_min"] == 0.25
    assert r["gbps"] == pytest.approx(r["dram_bytes"] / 0.5 / 1e6)
    assert r["ledger_bytes"] > 0 and r["kv_reads"] == "per_group"
    assert rows[2]["num_splits"] == 2 and rows[2]["shape"] == "b1_mha_d64_64"


def test_decode_point_too_big_is_a_skipped_row(tmp_path, monkeypatch):
    b, out, calls = _bench(tmp_path, monkeypatch, free_bytes=1000)
    b.point(1, "mha", 64, 64, None)
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["status"] == "skipped" and "free memory" in row["reason"] and calls == []
    assert set(row) >= _data_keys(lambda r: r["status"] == "skipped")


# ---------------------------------------------------------------------------------------
# backward: --smoke runs in the simulator
# ---------------------------------------------------------------------------------------
def _backward_smoke_job():
    """`flashsim bench --backward --smoke --causal off --out DIR/bwd.jsonl` as a child
    process started early (tests/_background.py); (CompletedProcess, DIR)."""
    import sys
    root = str(Path(__file__).resolve().parents[1])
    d = Path(_background.mkdtemp("bench-bwd"))
    r = _background.run([sys.executable, "-m", "analysis.cli", "bench", "--backward", "--smoke",
                         "--causal", "off", "--out", str(d / "bwd.jsonl")], cwd=root,
                        timeout=600, env=dict(_background.environ(), PYTHONPATH=root))
    return r, d


@pytest.mark.slow
@pytest.mark.prestart(job=_backward_smoke_job)
def test_backward_smoke_in_the_simulator():
    r, tmp_path = _background.result(_backward_smoke_job)
    out = tmp_path / "bwd.jsonl"
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["impl"], r["pass"]) for r in rows] == [
        ("ours_fa2_fast_main", "bwd"), ("ours_fa2_fast_pre", "bwd"), ("ours_fa2_bwd", "bwd"),
        ("ours_fa2_fwd_bwd", "fwd+bwd")]
    data = {}
    for line in (DATA / "bench.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("source") == "scripts/bwd_fast_bench.py":
            data.setdefault(r["impl"], set(r))
    for r in rows:
        assert r["kind"] == "bench" and r["source"] == "flashsim bench --backward"
        # the data set's fields; the simulator has no register counts to add
        assert set(r) == data[r["impl"]] - {"local_bytes"}, r["impl"]
        assert r["rel_err"] is None or r["rel_err"] < 1e-5
    assert json.loads((tmp_path / "bwd.jsonl.check.json").read_text())["checks"]


# ---------------------------------------------------------------------------------------
# scripts/device.sh (the lent GPU machine's set-up): its arguments, without a GPU
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, status, words", [
    ([], 2, "usage: bash scripts/device.sh CMD"),
    (["measure"], 2, "give stages KIND:SET"),
    (["measure", "speed:runtime_dev3"], 2, "stage kind 'speed' is not allowed; allowed: times, counters"),
    (["sh", "-c", "echo PYTHONPATH=$PYTHONPATH; exit 3"], 3, "PYTHONPATH="),
])
def test_device_script_arguments(argv, status, words, tmp_path):
    import os
    import shutil
    import subprocess
    # a copy of the script in a folder of its own: no wheel carried in .whl/ there (a
    # developer's checkout may hold one for the lent GPU, which this machine cannot install)
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "scripts" / "device.sh", root / "scripts")
    env = dict(os.environ, OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", "scripts/device.sh", *argv], cwd=root, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == status and words in r.stdout, (r.stdout, r.stderr)
    assert (tmp_path / "out" / "device.txt").exists()
    if status == 3:      # the command ran with the repository root on the path
        assert str(root) in r.stdout
