"""The pure parts of `flashsim bench` and the ncu script: formulas, sweep order, skip rules,
rows, resume, the no-GPU message, the ncu CSV parser. A fake backend stands in for the GPU."""
import json
import re
import sys
from pathlib import Path

import pytest

from analysis import bench as B
from analysis.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


from analysis import ncu  # noqa: E402


# ---------------------------------------------------------------------------------------
# formulas
# ---------------------------------------------------------------------------------------
def test_flops_and_tflops():
    assert B.flops(4096, 64, 16, False) == 4 * 4096 ** 2 * 64 * 16
    assert B.flops(4096, 64, 16, True) == 2 * 4096 ** 2 * 64 * 16
    # e.g. a 2.09 ms forward at N=4096, d=64, 16 heads is 32.88 TFLOP/s
    assert B.tflops(4096, 64, 16, False, 2.09) == pytest.approx(32.88, abs=0.01)
    assert B.tflops(4096, 64, 16, True, 2.09) == pytest.approx(32.88 / 2, abs=0.01)
    for bad in (0, -1.0, float("nan"), None):
        with pytest.raises(ValueError, match="ms="):
            B.tflops(4096, 64, 16, False, bad)


def test_input_sets_exceed_twice_l2():
    for N in B.SEQ_LENS:
        for d in B.HEAD_DIMS:
            for dt in B.DTYPES:
                n = B.input_sets(N, d, 16, dt)
                assert n >= 2
                assert n * B.input_set_bytes(N, d, 16, dt) > 2 * B.L2_BYTES
    assert B.input_set_bytes(512, 64, 16, "fp16") == 3 * 16 * 512 * 64 * 2
    assert B.input_sets(512, 64, 16, "fp16") == 2 * 50_000_000 // 3_145_728 + 1


def test_predicted_memory_standard_materialises_S_and_P():
    assert B.predicted_extra_bytes("standard", 16384, 64, 16, "fp32") >= 2 * 16 * 16384 ** 2 * 4
    assert B.predicted_extra_bytes("fa2", 16384, 64, 16, "fp32") < 10 ** 7


def test_parse_lists_name_parameter_value_allowed():
    assert B.parse_int_list("seq_lens", "512, 1024,512") == [512, 1024]
    with pytest.raises(ValueError, match=r"seq_lens='x'.*allowed"):
        B.parse_int_list("seq_lens", "512,x")
    with pytest.raises(ValueError, match=r"seq_lens=-4.*allowed"):
        B.parse_int_list("seq_lens", "-4")
    with pytest.raises(ValueError, match=r"impls='fa3'.*allowed: fa2, fa2_kernel, fa1"):
        B.parse_name_list("impls", "fa2,fa3", B.IMPLS)
    with pytest.raises(ValueError, match=r"causal='maybe'.*allowed: off, on, both"):
        B.parse_causal("maybe")
    with pytest.raises(ValueError, match=r"reps=3.*allowed"):
        B.Options(reps=3)


# ---------------------------------------------------------------------------------------
# sweep order
# ---------------------------------------------------------------------------------------
def test_sweep_priority_first_then_rest_with_N_ascending():
    pts = B.sweep()
    n = len(B.IMPLS)
    assert n == 7 and B.IMPLS[:2] == ("fa2", "fa2_kernel")   # the kernel alone next to the call
    assert len(pts) == 6 * 2 * len(B.DTYPES) * 2 * n == len({p.key() for p in pts})
    assert B.DTYPES == ("fp32", "fp16", "bf16")
    first = pts[:4 * n]
    assert [(p.d, p.N, p.dtype, p.causal) for p in first[::n]] == B.PRIORITY
    assert {p.impl for p in first[:n]} == set(B.IMPLS)
    rest = pts[4 * n:]
    # within a series (impl, dtype, d, causal) the rest runs N ascending
    seen = {}
    for p in rest:
        s = p.series()
        assert p.N > seen.get(s, 0)
        seen[s] = p.N


def test_sweep_restricted():
    pts = B.sweep(seq_lens=[1024], head_dims=[128], dtypes=["fp16"], causal=[True],
                  impls=["fa2"], batch_heads=4)
    assert [p.key() for p in pts] == [("fa2", "fp16", 1024, 128, 4, True, "fwd")]


def test_fwd_bwd_pass_points_rows_and_resume(tmp_path):
    """--pass fwd,fwd+bwd doubles the points (the kernel-alone impl is skipped, saying
    why, in fwd+bwd); rows carry 'pass' and fwd+bwd TFLOP/s count 3.5 forwards; rows from
    before passes existed resume as forward rows."""
    pts = B.sweep(seq_lens=[1024], head_dims=[64], dtypes=["fp16"], causal=[False],
                  impls=["fa2", "fa2_kernel", "torch_flash"], batch_heads=4,
                  passes=("fwd", "fwd+bwd"))
    assert len(pts) == 6 and {p.pass_ for p in pts} == {"fwd", "fwd+bwd"}
    be = FakeBackend()
    _res, made = _run(tmp_path, pts, be)
    by = {(r["impl"], r["pass"]): r for r in made}
    assert "autograd" in by[("fa2_kernel", "fwd+bwd")]["skipped"]
    fwd, both = by[("fa2", "fwd")], by[("fa2", "fwd+bwd")]
    assert both["tflops"] == pytest.approx(
        3.5 * B.flops(1024, 64, 4, False) / (both["ms_median"] * 1e-3) / 1e12)
    assert fwd["tflops"] == pytest.approx(B.tflops(1024, 64, 4, False, fwd["ms_median"]))
    old = {k: v for k, v in fwd.items() if k != "pass"}
    assert B.row_key(old) == B.row_key(fwd)
    with pytest.raises(ValueError, match="pass='bwd' is not allowed; allowed: fwd, fwd\\+bwd"):
        B.run_bench(passes=("bwd",), backend=be, out=tmp_path / "x.json")


# ---------------------------------------------------------------------------------------
# the runner with a fake GPU
# ---------------------------------------------------------------------------------------
class FakeBackend:
    device_name = "Fake GPU 80GB"

    class OutOfMemory(Exception):
        pass

    def __init__(self, ms=lambda p: 1e-6 * p.N ** 2, free=80e9, fail=None, clock=None, tick=0.0):
        self.ms, self.free, self.fail = ms, free, fail or {}
        self.calls, self.prepared, self.timed = [], [], []
        self.clock, self.tick = clock, tick

    def free_bytes(self):
        return self.free

    def prepare(self, p, n_sets):
        self.prepared.append((p.key(), n_sets))

    def call(self, p, s):
        if p.impl in self.fail:
            raise self.fail[p.impl]
        self.calls.append((p.key(), s))
        if self.clock is not None:
            self.clock.t += self.tick

    def time_calls(self, p, idx):
        self.timed.append((p.key(), list(idx)))
        base = self.ms(p)
        return [base * (1 + 0.01 * (i % 3)) for i in range(len(idx))]

    def rel_err(self, p, s):
        return 1e-6 if p.dtype == "fp32" else 1e-3

    def peak_extra_bytes(self, p, s):
        return 1234

    def cleanup(self):
        pass

    def row_extra(self, p):
        return {"block_rows": 32} if p.impl in B.GPU_IMPLS else {}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


META = {"date": "2026-11-22", "device": "Fake GPU 80GB", "versions": {"torch": "x"}}


def _run(tmp_path, points, backend, opts=None, clock=None, name="r.json"):
    res = B.ResultFile(tmp_path / name)
    made = B.run_sweep(points, backend, res, opts or B.Options(), run_id="run1", meta=META,
                       clock=clock or Clock(), log=lambda *a: None)
    return res, made


def by_impl(rows):
    return {r["impl"]: r for r in rows}


def test_rows_measured_and_fields(tmp_path):
    pts = B.sweep(seq_lens=[1024], head_dims=[64], dtypes=["fp32"], causal=[False])
    be = FakeBackend()
    res, made = _run(tmp_path, pts, be)
    assert len(made) == len(B.IMPLS)
    assert by_impl(made)["fa2_kernel"]["ms_median"] is not None
    by = {r["impl"]: r for r in made}
    assert by["torch_flash"]["skipped"].startswith("torch FLASH backend supports fp16")
    assert by["torch_flash"]["ms_median"] is None and by["torch_flash"]["tflops"] is None
    r = by["fa2"]
    for key in ("run_id", "device", "impl", "dtype", "N", "d", "batch_heads", "causal",
                "ms_median", "tflops", "peak_extra_bytes", "rel_err", "versions", "date"):
        assert key in r
    times = [1.048576 * (1 + 0.01 * (i % 3)) for i in range(10)]
    assert r["ms_median"] == pytest.approx(sorted(times)[4] / 2 + sorted(times)[5] / 2)
    assert r["tflops"] == pytest.approx(B.tflops(1024, 64, 16, False, r["ms_median"]))
    assert r["reps"] == 10 and r["peak_extra_bytes"] == 1234 and r["rel_err"] == 1e-6
    assert r["block_rows"] == 32 and r["run_id"] == "run1" and r["versions"] == {"torch": "x"}
    # timed calls rotate over the input sets
    n_sets = B.input_sets(1024, 64, 16, "fp32")
    idx = [i for k, i in be.timed if k == pts[0].key()][-1]
    assert idx == [r % n_sets for r in range(10)] and len(set(idx)) == min(10, n_sets)
    # the file on disk is the same list
    assert json.loads((tmp_path / "r.json").read_text()) == res.rows


def test_time_cap_skips_and_is_recorded(tmp_path):
    pts = B.sweep(seq_lens=[1024], head_dims=[64], dtypes=["fp32"], causal=[False],
                  impls=["fa1", "fa2"])
    be = FakeBackend(ms=lambda p: 5000.0 if p.impl == "fa1" else 1.0)
    res, made = _run(tmp_path, pts, be)
    by = {r["impl"]: r for r in made}
    assert by["fa1"]["ms_median"] is None
    assert "single call took 5000 ms, over the cap of 2000 ms" in by["fa1"]["skipped"]
    assert by["fa2"]["ms_median"] == pytest.approx(1.0, rel=0.02)


def test_predicted_time_skips_without_running(tmp_path):
    pts = B.sweep(seq_lens=[4096, 8192, 16384], head_dims=[64], dtypes=["fp32"],
                  causal=[False], impls=["fa1"])
    # 4096 -> 1000 ms, so 8192 predicted 4000 ms > 2000 ms cap
    be = FakeBackend(ms=lambda p: 1000.0 * (p.N / 4096) ** 2)
    res, made = _run(tmp_path, pts, be, B.Options(row_budget_s=1e6))
    assert made[0]["ms_median"] == pytest.approx(1000, rel=0.02)
    assert re.match(r"predicted single call 40\d\d ms \(from N=4096", made[1]["skipped"])
    assert made[2]["skipped"] and made[2]["ms_median"] is None
    assert not any(k[2] in (8192, 16384) for k, _ in be.calls)   # never ran


def test_row_budget_skip(tmp_path):
    pts = B.sweep(seq_lens=[1024], head_dims=[64], dtypes=["fp32"], causal=[False], impls=["fa1"])
    be = FakeBackend(ms=lambda p: 1500.0)
    res, made = _run(tmp_path, pts, be, B.Options(row_budget_s=10))
    assert "per-point budget of 10 s" in made[0]["skipped"]


def test_memory_skip_and_fewer_sets(tmp_path):
    pts = B.sweep(seq_lens=[16384], head_dims=[64], dtypes=["fp32"], causal=[False],
                  impls=["standard", "fa2"])
    be = FakeBackend(free=20e9)           # standard needs 2 x 17 GB for S and P
    res, made = _run(tmp_path, pts, be)
    by = {r["impl"]: r for r in made}
    assert by["standard"]["skipped"].startswith("predicted memory 34.")
    assert by["fa2"]["ms_median"] is not None
    # tight memory: fewer input sets, but at least 2
    one = B.input_set_bytes(16384, 64, 16, "fp32")
    be2 = FakeBackend(free=(3 * one + 10 ** 7) / 0.9)
    _run(tmp_path, pts[1:], be2, name="r2.json")
    assert be2.prepared[0][1] == 2


def test_errors_and_oom_become_skipped_rows(tmp_path):
    pts = B.sweep(seq_lens=[1024], head_dims=[64], dtypes=["fp16"], causal=[False],
                  impls=["fa1", "torch_math", "fa2"])
    be = FakeBackend(fail={"fa1": RuntimeError("launch failed\nsecond line"),
                           "torch_math": FakeBackend.OutOfMemory("CUDA out of memory")})
    res, made = _run(tmp_path, pts, be)
    by = {r["impl"]: r for r in made}
    assert by["fa1"]["skipped"] == "error: RuntimeError: launch failed"
    assert by["torch_math"]["skipped"] == "out of memory: CUDA out of memory"
    assert by["fa2"]["ms_median"] is not None


def test_budget_and_resume(tmp_path):
    pts = B.sweep(seq_lens=[512, 1024], head_dims=[64], dtypes=["fp16"], causal=[False],
                  impls=["fa2", "torch_efficient"])
    clock = Clock()
    be = FakeBackend(clock=clock, tick=10.0)     # each call advances 10 s
    res, made = _run(tmp_path, pts, be, B.Options(budget_s=5, row_budget_s=1e6), clock)
    measured = [r for r in made if r["ms_median"] is not None]
    budget = [r for r in made if r["skipped"]]
    assert len(measured) == 1 and len(budget) == 3
    assert all(r["skipped"].startswith("time budget") for r in budget)
    # resume on the same file: the measured point is not redone, budget skips are retried
    be2 = FakeBackend()
    res2, made2 = _run(tmp_path, pts, be2)
    assert {r["impl"] + str(r["N"]) for r in made2} == {
        p.impl + str(p.N) for p in pts} - {measured[0]["impl"] + str(measured[0]["N"])}
    assert measured[0]["N"] not in [k[2] for k, _ in be2.calls if k[0] == measured[0]["impl"]]
    rows = json.loads((tmp_path / "r.json").read_text())
    assert len(rows) == 4 and all(r["ms_median"] is not None for r in rows)
    # a third run has nothing to do
    _res3, made3 = _run(tmp_path, pts, FakeBackend())
    assert made3 == []


def test_interrupted_run_keeps_rows(tmp_path):
    pts = B.sweep(seq_lens=[512], head_dims=[64], dtypes=["fp16"], causal=[False],
                  impls=["fa2", "torch_efficient"])

    class Boom(FakeBackend):
        def prepare(self, p, n):
            if p.impl == "torch_efficient":
                raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, pts, Boom())
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["impl"] for r in rows] == ["fa2"]
    assert not list(tmp_path.glob("*.tmp*"))


def test_make_row_needs_reason_and_drops_nan():
    p = B.Point("fa2", "fp32", 512, 64, False, 16)
    with pytest.raises(ValueError, match="skipped"):
        B.make_row(p, run_id="r", meta=META)
    r = B.make_row(p, run_id="r", meta=META, ms=1.0, times=[1.0] * 10, rel_err=float("nan"))
    assert r["rel_err"] is None and "non-finite" in r["note"]
    json.dumps(r, allow_nan=False)


def test_result_file_rejects_non_list(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    with pytest.raises(ValueError, match="expected a JSON list"):
        B.ResultFile(f)


def test_default_path():
    p = B.default_results_path("NVIDIA H100 80GB HBM3", "2026-11-22")
    assert p.as_posix() == "out/2026-11-22-nvidia-h100-80gb-hbm3.json"


def test_record_rows_into_the_data_set(tmp_path):
    from analysis import results as R
    rows = _fake_rows(tmp_path)
    data = tmp_path / "data"
    assert B.record_rows(rows, commit="abc", data=data) == (len(rows), 0)
    assert B.record_rows(rows, commit="abc", data=data) == (0, len(rows))
    got = R.load("bench", data=data)
    assert got[0]["run_id"] == "bench-" + rows[0]["run_id"]
    assert got[0]["bench_run_id"] == rows[0]["run_id"] and got[0]["commit"] == "abc"


# ---------------------------------------------------------------------------------------
# no GPU / no torch
# ---------------------------------------------------------------------------------------
def test_gpu_problem_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)    # import torch -> ImportError
    msg = B.gpu_problem()
    assert msg and "torch" in msg and "\n" not in msg


def test_numpy_problem(monkeypatch):
    import numpy
    monkeypatch.setattr(numpy, "__version__", "2.5.2")
    assert "2.5.2" in B.numpy_problem()
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    assert B.numpy_problem() is None
    monkeypatch.setattr(numpy, "__version__", "2.10.0")
    assert B.numpy_problem() is not None


def test_cli_without_gpu_one_line_status_0(monkeypatch, capsys):
    monkeypatch.setattr(B, "gpu_problem", lambda: "no CUDA GPU is available to PyTorch")
    monkeypatch.setattr(B, "run_bench", lambda **kw: pytest.fail("must not run"))
    assert cli_main(["bench", "--seq-lens", "512"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA GPU" in out


def test_cli_bad_input_status_2(capsys):
    assert cli_main(["bench", "--head-dims", "64,zero"]) == 2
    assert "head_dims='zero'" in capsys.readouterr().err
    assert cli_main(["bench", "--impls", "fa3"]) == 2
    assert "impls='fa3'" in capsys.readouterr().err


def test_cli_runs_with_fake_backend(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(B, "gpu_problem", lambda: None)
    real = B.run_bench
    monkeypatch.setattr(B, "run_bench", lambda **kw: real(backend=FakeBackend(), log=lambda *a: None, **kw))
    out = tmp_path / "res.json"
    assert cli_main(["bench", "--seq-lens", "512", "--head-dims", "64", "--dtypes", "fp16",
                     "--causal", "on", "--impls", "fa2,torch_flash", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["impl"], r["causal"], r["device"]) for r in rows] == [
        ("fa2", True, "Fake GPU 80GB"), ("torch_flash", True, "Fake GPU 80GB")]
    assert "2 points measured, 0 skipped" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# ncu CSV parser (sample in ncu's documented --csv layout; values made up)
# ---------------------------------------------------------------------------------------
NCU_SAMPLE = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
child fa2: 2.10 s, finite=True
==PROF== Profiling "fa2_fwd_Br32_Bc32_d64_fp32_t128": 0%....50%....100% - 3 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","fa2_fwd_Br32_Bc32_d64_fp32_t128","1","7","(128, 1, 1)","(128, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","52,428,800"
"0","4242","python3.12","127.0.0.1","fa2_fwd_Br32_Bc32_d64_fp32_t128","1","7","(128, 1, 1)","(128, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Mbyte","16.78"
"0","4242","python3.12","127.0.0.1","fa2_fwd_Br32_Bc32_d64_fp32_t128","1","7","(128, 1, 1)","(128, 16, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","22.30"
"0","4242","python3.12","127.0.0.1","fa2_fwd_Br32_Bc32_d64_fp32_t128","1","7","(128, 1, 1)","(128, 16, 1)","0","9.0","Command line profiler metrics","l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum","Gbyte","4.31"
"0","4242","python3.12","127.0.0.1","fa2_fwd_Br32_Bc32_d64_fp32_t128","1","7","(128, 1, 1)","(128, 16, 1)","0","9.0","Command line profiler metrics","l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum","byte","16,777,216"
"0","4242","python3.12","127.0.0.1","fa2_fwd_Br32_Bc32_d64_fp32_t128","1","7","(128, 1, 1)","(128, 16, 1)","0","9.0","Command line profiler metrics","lts__t_bytes.sum","Gbyte","4.50"
'''


def test_ncu_parse_units_and_sum():
    recs = ncu.parse_ncu_csv(NCU_SAMPLE)
    assert len(recs) == 6
    tot = ncu.sum_metrics(recs)
    assert tot["dram__bytes_read.sum"] == 52_428_800
    assert tot["dram__bytes_write.sum"] == pytest.approx(16.78e6)
    assert tot["gpu__time_duration.sum"] == pytest.approx(22.30e6)   # ns
    assert tot[ncu.LD] == pytest.approx(4.31e9)
    assert tot["kernels"] == ["fa2_fwd_Br32_Bc32_d64_fp32_t128"] and tot["launches"] == 1
    # two launches (e.g. a multi-kernel schedule) are summed
    extra = NCU_SAMPLE.splitlines()[-1].replace('"0","4242"', '"1","4242"').replace("4.50", "0.50")
    tot2 = ncu.sum_metrics(ncu.parse_ncu_csv(NCU_SAMPLE + extra + "\n"))
    assert tot2["lts__t_bytes.sum"] == pytest.approx(5.0e9) and tot2["launches"] == 2
    assert ncu.parse_ncu_csv("==PROF== No kernels were profiled.\n") == []
    with pytest.raises(ValueError, match="unit='furlong'"):
        ncu.parse_value("1", "furlong")


def test_ncu_compare_with_iosim_ledger():
    from iosim import Problem, Tiling, closed_form
    led = closed_form("fa2", Problem(N=4096, d=64, heads=16, dtype="fp32"), Tiling(32, 32))
    rd, wr = led.hbm_read_bytes, led.hbm_write_bytes
    # fa2: Q once + K, V per query block (T_r = 128) -> 16 x 4 x 4096 x 64 x (1 + 2 x 128)
    assert rd == 16 * 4 * 4096 * 64 * (1 + 2 * 128)
    tot = {ncu.LD: rd * 1.015, ncu.ST: wr * 0.99, "dram__bytes_read.sum": 5.2e7,
           "lts__t_bytes.sum": 4.5e9, "gpu__time_duration.sum": 2.23e7}
    c = ncu.compare(tot, rd, wr)
    assert c["agree"] and c["ld_rel_diff"] == pytest.approx(0.015)
    assert c["dram_read_bytes"] == 5.2e7 and c["gpu_time_ms"] == pytest.approx(22.3)
    tot[ncu.LD] = rd * 1.055          # an uncoalesced Q load: 5.5% over
    c = ncu.compare(tot, rd, wr)
    assert not c["agree"] and not c["ld_agree"] and c["st_agree"]
    c = ncu.compare({}, rd, wr)
    assert not c["agree"] and c["ld_rel_diff"] is None
    table = ncu.format_table([{"algorithm": "fa2", "block_rows": 32, "block_cols": 32,
                               "compare": ncu.compare(tot, rd, wr)},
                              {"algorithm": "fa1", "error": "ncu not found"}])
    assert "+5.5%" in table and "NO" in table and "ncu not found" in table


def test_ncu_command_has_the_metrics_and_filter():
    cmd = ncu.ncu_command("ncu", "fa1", "/tmp/x.log", ["fa1", "1024", "64", "4", "fp32", "32", "32"])
    assert cmd[:3] == ["ncu", "--clock-control", "none"]
    assert cmd[cmd.index("--metrics") + 1] == ",".join(ncu.METRICS)
    assert cmd[cmd.index("-k") + 1] == "regex:^fa1_fwd" and "--csv" in cmd
    assert cmd[-10:] == ["-m", "analysis.ncu", "--child", "fa1", "1024", "64", "4", "fp32", "32", "32"]
    # each regex matches its own kernel's name and not the others' (names as ncu shows them)
    import re
    from gpu._launch import kernel_name
    names = {"fa1": kernel_name("fa1_fwd", Br=32, Bc=32, d=64, dt="fp32"),
             "fa2": kernel_name("fa2_fast", Br=128, Bc=64, d=64, dt="fp32", shfl=True),
             "fa2-plain": kernel_name("fa2_fwd", Br=32, Bc=32, d=64, dt="fp32"),
             "fa2-tc": kernel_name("fa2_tc", Br=128, Bc=64, d=64, dt="fp16")}
    for alg, regex in ncu.KERNEL_REGEX.items():
        assert [a for a, n in names.items() if re.search(regex, n)] == [alg]


# ---------------------------------------------------------------------------------------
# figure and compact table
# ---------------------------------------------------------------------------------------
def _fake_rows(tmp_path):
    pts = B.sweep(seq_lens=[512, 1024], head_dims=[64], dtypes=["fp32", "fp16"],
                  causal=[False, True])
    res, _ = _run(tmp_path, pts, FakeBackend())
    return res.rows


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from analysis.figures import bench_plot
    rows = _fake_rows(tmp_path)
    data = bench_plot.panels(rows)
    assert len(data) == 4 and "torch_flash" not in data[("fp32", 64, False)]
    assert "Fake GPU 80GB" in bench_plot.title_of(rows) and "2026-11-22" in bench_plot.title_of(rows)
    out = bench_plot.plot(rows, tmp_path / "b.png")
    assert out.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no measured points"):
        bench_plot.plot([r for r in rows if r["skipped"]], tmp_path / "c.png")


def test_compact_table(tmp_path):
    rows = _fake_rows(tmp_path)
    t = B.compact_table(rows)
    assert "-- fwd fp32 d=64 non-causal" in t and "-- fwd fp16 d=64 causal" in t
    assert "skip" in t and "torch FLASH backend supports fp" in t
    fa2 = next(r for r in rows if r["impl"] == "fa2" and r["N"] == 1024 and r["dtype"] == "fp32"
               and not r["causal"])
    assert f"{fa2['ms_median']:.3g}/{fa2['tflops']:.3g}" in t
    assert len(t) < 12_000


def test_ncu_verdict_known_tc_loads():
    """The tensor-core kernel's cp.async loads read 9/8 in ncu: expected, not a failure;
    its stores, and every other kernel's loads, must agree."""
    rd, wr = 545_259_520, 8_650_752
    c = ncu.compare({ncu.LD: rd * 9 / 8, ncu.ST: wr}, rd, wr)
    ok, notes = ncu.verdict("fa2-tc", c)
    assert ok and "+12.5%" in notes[0] and "expected" in notes[0]
    ok, notes = ncu.verdict("fa2", c)
    assert not ok and "+12.5%" in notes[0]
    ok, notes = ncu.verdict("fa2-tc", ncu.compare({ncu.LD: rd, ncu.ST: wr * 1.1}, rd, wr))
    assert not ok and notes == ["st bytes +10.0% off the ledger"]


def test_run_ncu_plumbing_with_a_stand_in_ncu(tmp_path, monkeypatch):
    """run_ncu: command, CSV log, comparison with the ledger and verdict, with a stand-in
    ncu that writes the ledger's own byte counts (loads x 9/8 for the tc kernel)."""
    fake = tmp_path / "ncu"
    fake.write_text(f"""#!{sys.executable}
import sys
a = sys.argv[1:]
log = a[a.index("--log-file") + 1]
variant, N, d, bh, dt, br, bc = a[a.index("--child") + 1:][:7]
sys.path.insert(0, {str(ROOT)!r})
import iosim
led = iosim.closed_form("fa1" if variant == "fa1" else "fa2",
                        iosim.Problem(N=int(N), d=int(d), heads=int(bh), dtype=dt),
                        iosim.Tiling(int(br), int(bc)))
ld = led.hbm_read_bytes * (9 / 8 if variant == "fa2-tc" else 1)
head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
rows = [(m, v) for m, v in (("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", ld),
        ("l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum", led.hbm_write_bytes))]
open(log, "w").write(head + "\\n" + "\\n".join(
    f'"0","k_{{variant}}","{{m}}","byte","{{v:.0f}}"' for m, v in rows) + "\\n")
""")
    fake.chmod(0o755)
    monkeypatch.setattr(ncu, "find_ncu", lambda: str(fake))
    monkeypatch.setattr(ncu, "kernel_counts", lambda *a: {"read_bytes": 0, "write_bytes": 0})
    rows = ncu.run_ncu(tmp_path / "out", N=64, d=16, bh=2)
    by = {r["algorithm"]: r for r in rows}
    assert set(by) == set(ncu.VARIANTS)
    assert all(r["ok"] for r in rows), [r.get("notes") for r in rows]
    assert by["fa2-tc"]["compare"]["ld_rel_diff"] == pytest.approx(0.125)
    assert "expected" in by["fa2-tc"]["notes"][0] and by["fa1"]["notes"] == []


# ---------------------------------------------------------------------------------------
# --tilings: the Numba kernels once per tiling, PyTorch once; rows carry "tiling"
# ---------------------------------------------------------------------------------------
def test_parse_tilings():
    assert B.parse_tilings("default,128x64, 64x64,128x64") == [None, (128, 64), (64, 64)]
    for bad in ("128", "128x0", "ax64", "128x64x2", ""):
        with pytest.raises(ValueError, match=r"tilings=.* is not allowed; allowed: B_rxB_c"):
            B.parse_tilings(bad)


def test_tilings_sweep_rows_resume_and_table(tmp_path):
    pts = B.sweep(seq_lens=[1024], head_dims=[64], dtypes=["fp16"], causal=[False],
                  impls=["fa2", "fa2_kernel", "torch_flash"], tilings=(None, (128, 64)))
    assert [(p.impl, p.tiling) for p in pts] == [("fa2", None), ("fa2", (128, 64)),
                                                 ("fa2_kernel", None),
                                                 ("fa2_kernel", (128, 64)),
                                                 ("torch_flash", None)]
    # the default tiling's key is the one rows had before tilings existed
    assert pts[0].key() == ("fa2", "fp16", 1024, 64, 16, False, "fwd")
    out = tmp_path / "t.json"
    kw = dict(seq_lens=[1024], head_dims=[64], dtypes=["fp16"], causal="off",
              impls=["fa2", "torch_flash"], tilings=[None, (64, 32)], out=out,
              log=lambda *a: None)
    backend = FakeBackend(ms=lambda p: 2.0 if p.tiling else 1.0)
    _, rows = B.run_bench(backend=backend, **kw)
    assert [(r["impl"], r.get("tiling"), r["ms_median"]) for r in rows] == [
        ("fa2", None, 1.01), ("fa2", [64, 32], 2.02), ("torch_flash", None, 1.01)]
    assert [B.row_key(r) for r in rows] == [p.key() for p in B.sweep(
        [1024], [64], ["fp16"], [False], ["fa2", "torch_flash"], tilings=(None, (64, 32)))]
    table = B.compact_table(rows)
    assert "fa2@64x32" in table and "2.02/" in table
    # a rerun on the same file resumes: nothing to redo
    again = FakeBackend()
    _, rows2 = B.run_bench(backend=again, **kw)
    assert rows2 == [] and again.calls == []


def test_cli_tilings(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(B, "gpu_problem", lambda: None)
    real = B.run_bench
    monkeypatch.setattr(B, "run_bench", lambda **kw: real(backend=FakeBackend(),
                                                          log=lambda *a: None, **kw))
    out = tmp_path / "res.json"
    assert cli_main(["bench", "--seq-lens", "512", "--head-dims", "64", "--dtypes", "fp16",
                     "--causal", "off", "--impls", "fa2_kernel", "--tilings", "128x64,default",
                     "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["impl"], r.get("tiling")) for r in rows] == [("fa2_kernel", [128, 64]),
                                                            ("fa2_kernel", None)]
    capsys.readouterr()
    assert cli_main(["bench", "--tilings", "128by64"]) == 2
    assert "tilings='128by64' is not allowed" in capsys.readouterr().err
    assert cli_main(["bench", "--tilings", "128x64", "--record"]) == 2
    assert "--record takes the default tilings' rows only" in capsys.readouterr().err
    assert cli_main(["bench", "--decode", "--tilings", "128x64", "--out", "x.jsonl"]) == 2
    assert "--tilings does not apply to --decode" in capsys.readouterr().err
