"""analysis: theory slopes and bands, sweeps (writing, resume, failures), optimal tiling
against brute force, figures, and the report / sweep / figure commands."""
import json
import os
import struct
import zlib

import numpy as np
import pytest

from analysis import theory
from analysis.sweeps import grid, point_key, read_rows, run_sweep, evaluate_model
from analysis.tiling_search import footprint_bytes, optimal_tiling
from analysis.cli import main as cli
from iosim import Problem, Tiling, closed_form, execute, paper_tiling, sram_footprint_bytes


# ---------------------------------------------------------------------------------------
# Theory: the real checks, assertions on fitted values
# ---------------------------------------------------------------------------------------
def test_fa1_slope_vs_M_and_constant():
    c = theory.check_fa1_vs_M()
    assert c.passed, c.summary
    assert abs(c.values["slope"] + 1) <= 0.05
    # Algorithm 1 reads Q_i, O_i and writes O_i (3 B_r d) on each of T_r T_c tiles, and
    # T_c = 4 N d / M under the paper's rule: constant 12 (statistics add ~ 4/d).
    assert 11 <= c.values["constant"] <= 13.5
    assert c.values["ratio_max"] / c.values["ratio_min"] <= 1.5


@pytest.mark.parametrize("check,slope", [(theory.check_fa1_vs_N, 2), (theory.check_fa1_vs_d, 2),
                                         (theory.check_standard_vs_N, 2)])
def test_power_law_slopes(check, slope):
    c = check()
    assert c.passed, c.summary
    assert abs(c.values["slope"] - slope) <= 0.05


def test_slope_check_can_fail():
    """The same fit over a range where the law does not hold must fail the tolerance."""
    N, d = 4096, 64
    M = np.unique(np.geomspace(N * d, 16 * N * d, 10).astype(np.int64))
    f = theory.fit_loglog(M, theory.paper_rule_traffic("fa1", N, d, M))
    assert abs(f.slope + 1) > 0.05


def test_block_sparse_linear_in_s():
    c = theory.check_block_sparse()
    assert c.passed, c.summary
    assert 11 <= c.values["slope_const"] <= 13.5 and 2.5 <= c.values["intercept_const"] <= 4


def test_where_the_law_stops():
    stall = theory.check_fa2_stall()
    assert stall.passed and abs(stall.values["fa2_slope"]) < 0.01
    near = theory.check_near_Nd()
    assert near.passed and abs(near.values["slope_beyond"]) < 0.01


def test_bounds_values():
    assert theory.flash_bound(1024, 64, 4096) == 1024 ** 2 * 64 ** 2 / 4096
    assert theory.lower_bound(1024, 64, 1024 * 64 * 8) == 4 * 1024 * 64  # I/O bound dominates
    assert theory.standard_bound(10, 2) == 120
    assert theory.block_sparse_bound(8, 2, 4, 0.5) == 16 + 0.5 * 64 * 4 / 4


def test_traffic_matches_executed_schedule():
    """theory's traffic helper against an independent executed schedule (iosim.execute)."""
    p, t = Problem(N=96, d=16), Tiling(16, 32)
    for a in ("standard", "fa1", "fa2"):
        led = execute(a, p, t).ledger
        assert theory.traffic_elements(a, 96, 16, 16, 32) == led.read_elements + led.write_elements


# ---------------------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------------------
def test_sweep_writes_resumes_and_records_failures(tmp_path):
    path = tmp_path / "s.jsonl"
    pts = grid(algorithm=["fa1", "fa2"], N=[256, 512], sram_bytes=[16384, 100])  # 100: M < 4d
    calls = []

    def evaluate(p):
        calls.append(p)
        if len(calls) == 4:
            raise KeyboardInterrupt  # simulated kill after 3 rows
        return evaluate_model(p)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(pts, path, evaluate)
    assert len(read_rows(path)) == 3
    # a torn last line (killed mid-write) is dropped, not parsed
    with open(path, "a") as f:
        f.write('{"partial": ')
    st = run_sweep(pts, path, evaluate_model)
    rows = read_rows(path)
    # the two ok rows are reused; the error row is evaluated again (issue 19) and its new
    # row supersedes the old one
    assert st["skipped"] == 2 and st["done"] == 6
    assert len(rows) == 8 and len({r["key"] for r in rows}) == 8
    errors = [r for r in rows if r["status"] == "error"]
    assert len(errors) == 4 and all(r["sram_bytes"] == 100 for r in errors)
    assert all("sram_bytes=100" in r["error"] for r in errors)
    ok = [r for r in rows if r["status"] == "ok"]
    for r in ok:  # every row carries its parameters and agrees with closed_form
        t = paper_tiling(r["sram_bytes"] // 2, r["d"])
        led = closed_form(r["algorithm"], Problem(N=r["N"], d=r["d"], dtype="fp16"), t)
        assert r["hbm_bytes"] == led.hbm_bytes and (r["B_r"], r["B_c"]) == (t.B_r, t.B_c)
    # a third run only retries the error rows, or does nothing with retry_errors=False
    assert run_sweep(pts, path, evaluate_model)["done"] == 4
    assert run_sweep(pts, path, evaluate_model, retry_errors=False)["done"] == 0
    assert len(read_rows(path)) == 8


def test_point_key_fills_defaults():
    assert point_key({"algorithm": "fa1"}) == point_key(grid(algorithm="fa1")[0])


def test_sweep_sparsity_row(tmp_path):
    rows = []
    for s in (0.25, 1.0):
        r = evaluate_model({**grid()[0], "sram_bytes": 16384, "sparsity": s, "N": 1024})
        rows.append(r["hbm_bytes"])
    assert rows[0] < rows[1]


# ---------------------------------------------------------------------------------------
# Optimal tiling vs brute force
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["fa1", "fa2"])
@pytest.mark.parametrize("M", [8192, 40000])
def test_optimal_tiling_brute_force(algorithm, M):
    N, d, cand = 256, 32, [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 100, 128, 256]
    best = None
    for B_r in cand:
        for B_c in cand:
            if sram_footprint_bytes(algorithm, B_r, B_c, d, "fp16") > M:
                continue
            b = closed_form(algorithm, Problem(N=N, d=d, dtype="fp16"), Tiling(B_r, B_c)).hbm_bytes
            if best is None or b < best[0]:
                best = (b, B_r, B_c)
    r = optimal_tiling(algorithm, N, d, M, rows=cand, cols=cand)
    assert r.traffic_bytes == best[0]
    assert sram_footprint_bytes(algorithm, r.B_r, r.B_c, d, "fp16") <= M
    assert closed_form(algorithm, Problem(N=N, d=d, dtype="fp16"), Tiling(r.B_r, r.B_c)).hbm_bytes == best[0]
    assert r.traffic_bytes >= r.lower_bound_bytes


def test_footprint_vectorised_equals_iosim():
    R, C = np.meshgrid([1, 16, 64], [8, 100, 256], indexing="ij")
    for a in ("standard", "fa1", "fa2"):
        v = footprint_bytes(a, R, C, 64, "fp16")
        for (i, j), x in np.ndenumerate(v):
            assert x == sram_footprint_bytes(a, int(R[i, j]), int(C[i, j]), 64, "fp16")


def test_optimal_tiling_bad_input():
    with pytest.raises(ValueError, match="sram_bytes"):
        optimal_tiling("fa1", 256, 64, 10)


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------
def _png_text(path):
    """tEXt chunks of a PNG (independent of matplotlib)."""
    data, out, i = open(path, "rb").read(), {}, 8
    while i < len(data):
        n, kind = struct.unpack(">I4s", data[i:i + 8])
        body = data[i + 8:i + 8 + n]
        if kind == b"tEXt":
            k, v = body.split(b"\0", 1)
            out[k.decode()] = v.decode("latin-1")
        elif kind == b"zTXt":
            k, rest = body.split(b"\0", 1)
            out[k.decode()] = zlib.decompress(rest[1:]).decode("latin-1")
        i += 12 + n
    return out


@pytest.mark.parametrize("name", ["fig1", "fig2", "fig3", "fig4", "fig5", "fig6"])
def test_model_figures(tmp_path, name):
    from analysis.figures import get
    paths = get(name).make(str(tmp_path))
    png = [p for p in paths if p.endswith(".png")][0]
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 5000
    assert any(p.endswith(".svg") and os.path.getsize(p) > 1000 for p in paths)
    meta = _png_text(png)
    assert meta["Software"] == "flashsim" and json.loads(meta["Description"])


def test_fig3_gpt2_numbers():
    from analysis.figures import fig3_block_size
    data = fig3_block_size.generate()
    gb = [r["hbm_GB"] for r in data["rows"]]
    assert gb == sorted(gb, reverse=True)  # larger B_c: fewer passes over Q and O
    p = Problem(N=1024, d=64, batch=64, heads=16, dtype="fp16")
    assert gb[0] == closed_form("fa1", p, Tiling(64, 64)).hbm_bytes / 1e9


def test_fig6_buffers_match_executed_statistics():
    from analysis.figures.fig6_memory_footprint import extra_hbm_bytes
    ex1 = execute("fa1", Problem(N=48, d=8), Tiling(16, 16))
    assert extra_hbm_bytes("fa1", 48, 4) == sum(a[0, 0].nbytes for a in ex1.stats.values())
    ex2 = execute("fa2", Problem(N=48, d=8), Tiling(16, 16))
    assert extra_hbm_bytes("fa2", 48, 4) == sum(a[0, 0].nbytes for a in ex2.stats.values())


def test_fig7_smallest(tmp_path):
    from analysis.figures import fig7_validation
    from analysis.sweeps import import_gpu
    gpu, why = import_gpu()
    if gpu is None:
        data = fig7_validation.generate()
        assert data["skipped"] == why
    else:
        data = fig7_validation.generate(N=20, d=16, heads=1, B=16, algorithms=("fa2",),
                                        causal_values=(True,))
        (c,) = data["cases"]
        assert c["counts_match"] and c["max_abs_err"] < 1e-4
    from analysis.figures._style import save
    paths = save(fig7_validation.plot(data), str(tmp_path), "f7", data["config"])
    assert os.path.getsize(paths[0]) > 5000


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------
def test_cli_sweep_and_bad_input(tmp_path, capsys):
    out = tmp_path / "c.jsonl"
    assert cli(["sweep", "--out", str(out), "--seq-len", "256,512", "--sram-bytes", "16384"]) == 0
    assert len(read_rows(out)) == 4
    assert cli(["sweep", "--out", str(out), "--seq-len", "256,512", "--sram-bytes", "16384"]) == 0
    assert len(read_rows(out)) == 4
    assert cli(["sweep", "--out", str(out), "--seq-len", "x"]) == 2
    assert "seq_len" in capsys.readouterr().err
    assert cli(["sweep", "--out", str(out), "--algorithm", "fa3", "--sram-bytes", "1"]) == 2
    assert cli(["figure", "fig99", "--out", str(tmp_path)]) == 2


def test_cli_figure(tmp_path, capsys):
    assert cli(["figure", "fig6", "--out", str(tmp_path)]) == 0
    assert os.path.exists(tmp_path / "fig6_memory_footprint.png")
