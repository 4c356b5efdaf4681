"""Edges a newcomer hit (issue 36, item 7), each reproduced, and fuzzing of the validation
of the public entry points.

1. `flashsim traffic` at any N: exact integers per head and in total (table and --json);
   tables stay aligned.
2. One rule for tilings over the SRAM limit (iosim.tiling.check_tiling_fits) in the
   ledger path and --levels; --decode takes no tiling.
3. --levels beyond what the L2 model lays out: one line before the model runs; a
   MemoryError anywhere is one line, exit 2.
4. `flashsim results`: unknown kinds and missing data set folders exit 2.
5. Output paths checked before any work (`check --json DIR`).
6. Hypothesis: random `flashsim traffic` arguments exit 0 or 2 with one stderr line;
   random bad values for iosim's constructors and closed forms raise ConfigError naming
   the parameter, never another exception or a wrong answer.
"""
import json
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from iosim import ConfigError
from iosim.tiling import check_tiling_fits

from _cli import run_cli as run



def one_line_error(rc, err, *words):
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def _num(text: str) -> int:
    return int(text.replace(",", "").lstrip("~"))


# ---------------------------------------------------------------------------------------
# 1. exact integers, aligned tables
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("N", [10 ** 8, 10 ** 12, 10 ** 30])
def test_traffic_per_head_is_exact_at_any_N(N):
    argv = ["traffic", "--algorithm", "fa2", "--seq-len", str(N), "--head-dim", "64",
            "--gpu", "A100-40GB", "--heads", "3", "--batch", "2"]
    rc, out, _ = run(argv + ["--json"])
    got = json.loads(out)
    led = iosim.closed_form("fa2", iosim.Problem(N=N, d=64, heads=3, batch=2, dtype="fp16"),
                            iosim.Tiling(got["block_rows"], got["block_cols"]))
    assert rc == 0 and got["hbm_bytes"] == led.hbm_bytes
    assert isinstance(got["hbm_bytes_per_head"], int)
    assert got["hbm_bytes_per_head"] * 6 == got["hbm_bytes"]
    rc, out, _ = run(argv)
    last = out.strip().splitlines()[-1]
    total = _num(last.split("HBM traffic: ")[1].split(" bytes total")[0])
    per_head = _num(last.split("; ")[-1].split(" bytes per head")[0])
    assert rc == 0 and total == led.hbm_bytes and per_head * 6 == total


@pytest.mark.parametrize("N", [10 ** 8, 10 ** 12, 10 ** 30])
def test_ledger_table_columns_stay_apart_and_aligned(N):
    for alg in ("standard", "fa1"):
        led = iosim.closed_form(alg, iosim.Problem(N=N, d=64, heads=16, batch=8),
                                iosim.Tiling(64, 64))
        lines = led.table().splitlines()
        assert len({len(x) for x in lines}) == 1              # right edges line up
        for line in lines[1:]:
            cells = line.split()
            assert len(cells) == 5                            # no two figures run together
            assert [_num(c) for c in cells[1:]] == \
                ([led.read_elements, led.write_elements, led.hbm_read_bytes,
                  led.hbm_write_bytes] if cells[0] == "total" else
                 list(led.per_tensor()[cells[0]].values()))


def test_ledger_table_unchanged_at_ordinary_sizes():
    led = iosim.closed_form("fa2", iosim.Problem(N=4096, d=64, heads=16), iosim.Tiling(128, 64))
    lines = led.table().splitlines()
    assert lines[0] == (f"{'tensor':<7}{'read elems':>16}{'write elems':>16}"
                        f"{'read bytes':>18}{'write bytes':>18}")
    K = led.per_tensor()["K"]
    assert lines[2] == (f"{'K':<7}{K['read_elements']:>16,}{K['write_elements']:>16,}"
                        f"{K['read_bytes']:>18,}{K['write_bytes']:>18,}")


def test_varlen_mean_per_head_is_exact():
    """Sequences of different lengths: the mean per (sequence, head) is no integer; it is
    printed rounded from the exact total (3 sequences: total % 3 = 2 here)."""
    cu = "0,5,6,1000000000000000000007"
    rc, out, _ = run(["traffic", "--algorithm", "fa2", "--head-dim", "64", "--gpu", "H100-SXM",
                      "--cu-seqlens-q", cu, "--cu-seqlens-k", cu])
    last = out.strip().splitlines()[-1]
    total = _num(last.split("HBM traffic: ")[1].split(" bytes total")[0])
    mean = last.split("; ")[-1].split(" bytes per")[0]
    assert rc == 0 and total % 3 == 2
    assert mean.startswith("~") and _num(mean) == (total + 1) // 3       # nearest integer
    rc, out, _ = run(["traffic", "--algorithm", "fa2", "--head-dim", "64", "--gpu", "H100-SXM",
                      "--cu-seqlens-q", cu, "--cu-seqlens-k", cu, "--json"])
    got = json.loads(out)
    assert got["cu_seqlens_q"] == [0, 5, 6, 10 ** 21 + 7] and got["hbm_bytes"] == total


# ---------------------------------------------------------------------------------------
# 2. one SRAM rule
# ---------------------------------------------------------------------------------------
def test_one_rule_for_tilings_over_the_sram_limit():
    big = iosim.Tiling(1000, 1000)
    with pytest.raises(ConfigError, match=r"block_rows=1000, block_cols=1000 need 4648000 "
                                          r"bytes of SRAM.*sram_bytes=232448"):
        check_tiling_fits("fa2", big, 64, "fp16", 232448)
    with pytest.raises(ConfigError, match="need 4648000 bytes"):   # the ledger path
        iosim.resolve_tiling("fa2", 64, "fp16", block_rows=1000, block_cols=1000,
                             sram_bytes=232448)
    assert check_tiling_fits("fa2", iosim.Tiling(64, 64), 64, "fp16", 232448) == \
        iosim.sram_footprint_bytes("fa2", 64, 64, 64, "fp16")
    # a kernel's own footprint (a launch plan's smem_bytes) where one is given
    assert check_tiling_fits("fa2", big, 64, "fp16", 232448, footprint_bytes=1000) == 1000
    with pytest.raises(ConfigError, match="sram_bytes=0"):
        check_tiling_fits("fa2", big, 64, "fp16", 0)
    for extra in ([], ["--levels"]):
        rc, _, err = run(["traffic", "--algorithm", "fa2", "--seq-len", "4096", "--head-dim",
                          "64", "--block-rows", "1000", "--block-cols", "1000", "--gpu",
                          "H100-SXM"] + extra)
        one_line_error(rc, err, "block_rows=1000, block_cols=1000 need 4648000 bytes",
                       "sram_bytes=232448")


def test_decode_takes_no_tiling():
    for flag in ("--block-cols", "--block-rows"):
        rc, _, err = run(["traffic", "--algorithm", "fa2", "--seq-len", "1", "--seq-len-kv",
                          "4096", "--head-dim", "64", "--decode", flag, "1000"])
        one_line_error(rc, err, flag, "--decode")


# ---------------------------------------------------------------------------------------
# 3. sizes the L2 model cannot lay out; MemoryError
# ---------------------------------------------------------------------------------------
def test_levels_at_1e12_is_one_line_before_the_model(monkeypatch):
    import iosim
    monkeypatch.setattr(iosim, "levels", lambda *a, **k: pytest.fail("model ran"))
    t0 = time.time()
    rc, _, err = run(["traffic", "--algorithm", "fa2", "--seq-len", str(10 ** 12),
                      "--head-dim", "64", "--levels"])
    one_line_error(rc, err, "--seq-len=1000000000000", "--seq-len <= 268,435,456")
    assert time.time() - t0 < 60


def test_levels_size_rule_boundaries():
    from iosim.memory.limits import LEVELS_MAX_BLOCKS, LEVELS_MAX_TILES, levels_size_error
    t = iosim.Tiling(128, 64)
    n_max = LEVELS_MAX_BLOCKS * 64 // 2                   # batch 2: ceil(N / 64) x 2 blocks
    assert levels_size_error("fa2", iosim.Problem(N=n_max, d=64, batch=2), t) is None
    msg = levels_size_error("fa2", iosim.Problem(N=n_max + 1, d=64, batch=2), t)
    assert f"--seq-len <= {n_max:,}" in msg
    msg = levels_size_error("standard", iosim.Problem(N=10 ** 7, d=64), t)
    n_std = int(msg.split("--seq-len <= ")[1].split(" ")[0].replace(",", ""))
    assert t.T_r(n_std) * t.T_c(n_std) <= LEVELS_MAX_TILES < t.T_r(n_std + 1) * t.T_c(n_std + 1)
    assert levels_size_error("standard", iosim.Problem(N=n_std, d=64), t) is None
    msg = levels_size_error("fa2", iosim.Problem(N=64, d=64, heads=LEVELS_MAX_BLOCKS + 1), t)
    assert msg.startswith("--batch x --heads")


def test_memory_error_is_one_line(monkeypatch):
    import analysis.commands.traffic as traffic

    def no_memory(*a, **k):
        raise MemoryError("Unable to allocate 58.2 GiB for an array")
    monkeypatch.setattr(traffic, "closed_form", no_memory)
    rc, _, err = run(["traffic", "--algorithm", "fa2", "--seq-len", "64", "--head-dim", "64",
                      "--sram-bytes", "100000"])
    one_line_error(rc, err, "flashsim traffic: error: out of memory", "58.2 GiB")


# ---------------------------------------------------------------------------------------
# 4. results: unknown kinds, missing data
# ---------------------------------------------------------------------------------------
def test_results_unknown_kind_and_missing_data(tmp_path, monkeypatch):
    rc, _, err = run(["results", "show", "nosuchkind"])
    one_line_error(rc, err, "kind='nosuchkind'", "bench")
    missing = str(tmp_path / "nonexistent")
    for action in (["list"], ["show", "bench"], ["tables", "--check"]):
        rc, _, err = run(["results", "--data", missing] + action)
        one_line_error(rc, err, repr(missing), "--data", "does not exist")
    monkeypatch.setenv("FLASHSIM_RESULTS", missing)
    rc, _, err = run(["results", "list"])
    one_line_error(rc, err, "$FLASHSIM_RESULTS")
    monkeypatch.delenv("FLASHSIM_RESULTS")
    rc, out, err = run(["results", "show", "bench", "--where", "impl=nosuchimpl"])
    assert rc == 0 and out == "" and "no bench rows match" in err   # an empty answer
    src = tmp_path / "rows.json"
    src.write_text("not json\n")
    data = tmp_path / "data"
    rc, _, err = run(["results", "--data", str(data), "add", str(src), "--kind", "bench"])
    one_line_error(rc, err, "line 1 is not JSON")
    assert not data.exists()                             # nothing made for a bad file


# ---------------------------------------------------------------------------------------
# 5. output paths before any work
# ---------------------------------------------------------------------------------------
def test_check_json_dir_fails_at_once_leaving_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    before = sorted(os.listdir(tmp_path))
    t0 = time.time()
    rc, stdout, err = run(["check", "--quick", "--json", str(out)])
    one_line_error(rc, err, "--json", "is a directory")
    assert time.time() - t0 < 30 and stdout == ""
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(out) == []
    (tmp_path / "file").write_text("x")
    rc, _, err = run(["check", "--quick", "--json", str(tmp_path / "file" / "c.json")])
    one_line_error(rc, err, "is not a directory")


def test_validate_checks_its_inputs_and_outputs_first(tmp_path, monkeypatch):
    rc, _, err = run(["validate", "runtime-blind", "--measured", str(tmp_path / "none.jsonl")])
    one_line_error(rc, err, "--measured")
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("FLASHSIM_RESULTS", str(tmp_path / "file"))
    rc, _, err = run(["validate", "levels"])
    one_line_error(rc, err, "the results data set", "is not a directory")


# ---------------------------------------------------------------------------------------
# 6a. fuzz: flashsim traffic
# ---------------------------------------------------------------------------------------
INTS = st.sampled_from(["1", "2", "7", "16", "64", "100", "1000", "4096", "0", "-3", "x", "1e3",
                        "", "2.5", str(10 ** 12), str(10 ** 30), "64,128"])
SMALL = st.sampled_from(["1", "2", "3", "4", "8", "16", "0", "-1", "x", "", "17", "100000"])
WINDOWS = st.sampled_from(["-1,-1", "8,0", "-1,0", "4,4", "-2,0", "3", "a,b", "1,2,3", "0,-1"])
CUS = st.sampled_from(["0,5,5,22", "0,3", "0", "1,5", "0,5,3", "0,x", "", "0,1000000000000"])


@st.composite
def traffic_argvs(draw):
    argv = ["traffic"]
    for flag, vals in (("--algorithm", st.sampled_from(["standard", "fa1", "fa2", "fa3", ""])),
                       ("--seq-len", INTS), ("--seq-len-kv", INTS), ("--head-dim", INTS),
                       ("--sram-bytes", INTS), ("--block-rows", INTS), ("--block-cols", INTS),
                       ("--dtype", st.sampled_from(["fp16", "fp32", "bf16", "half", "fp8"])),
                       ("--batch", SMALL), ("--heads", SMALL), ("--kv-heads", SMALL),
                       ("--gpu", st.sampled_from(["H100-SXM", "A100-40GB", "H200", "x"])),
                       ("--window", WINDOWS),
                       ("--dropout", st.sampled_from(["0", "0.1", "1", "-0.5", "nan", "x"])),
                       ("--num-splits", SMALL), ("--page-size", SMALL),
                       ("--kv-reads", st.sampled_from(["per_query_head", "per_group", "x"])),
                       ("--pass", st.sampled_from(["fwd", "bwd", "x"])),
                       ("--kernel", st.sampled_from(["auto", "tc", "fast", "plain", "x"])),
                       ("--cu-seqlens-q", CUS), ("--cu-seqlens-k", CUS)):
        if draw(st.integers(0, 2)) == 0:
            argv += [flag, draw(vals)]
    for flag in ("--causal", "--json", "--decode", "--levels"):
        if draw(st.booleans()):
            argv.append(flag)
    return argv


class _ModelReached(Exception):
    """Raised by the stand-in models: the arguments passed every check."""


def test_traffic_fuzz(monkeypatch):
    """Every argument list exits 0 (valid JSON with --json) or 2 with one stderr line
    naming the problem, never a traceback. The L2 / time / decode-time models are stood
    in for (they are tested elsewhere): reaching them means the arguments were accepted."""
    import iosim

    def reached(*a, **k):
        raise _ModelReached
    monkeypatch.setattr(iosim, "levels", reached)
    monkeypatch.setattr(iosim, "predict_decode", reached)

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(traffic_argvs())
    def check(argv):
        try:
            rc, out, err = run(argv)
        except _ModelReached:
            assert "--levels" in argv
            return
        assert "Traceback" not in err, (argv, err)
        if rc == 0:
            if "--json" in argv:
                json.loads(out)
        else:
            assert rc == 2 and len(err.strip().splitlines()) == 1, (argv, rc, err)
            assert "error" in err, (argv, err)

    check()


# ---------------------------------------------------------------------------------------
# 6b. fuzz: the Python API
# ---------------------------------------------------------------------------------------
BAD = st.one_of(st.integers(-3, 0), st.integers(2 ** 64, 2 ** 80),
                st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                st.text(max_size=3), st.lists(st.integers(1, 4), max_size=3),
                st.sampled_from([np.float64(8.0), np.array([1, 2]), np.array([2.5]),
                                 complex(1, 0), b"1", (1, 2), np.array([], int)]))


def _api_calls(draw_value) -> dict:
    """{"entry.parameter": a call of a valid form with that argument = draw_value}."""
    p = iosim.Problem(N=8, d=4, dtype="fp16")
    dp = iosim.DecodeProblem(N_kv=64, d=4)
    vp = iosim.VarlenProblem((3, 4), (3, 5), 4)
    t = iosim.Tiling(2, 3)
    q = np.random.default_rng(0).standard_normal((2, 8, 4))
    v = draw_value
    calls = {
        "Problem.N": lambda: iosim.Problem(N=v, d=4),
        "Problem.d": lambda: iosim.Problem(N=8, d=v),
        "Problem.batch": lambda: iosim.Problem(N=8, d=4, batch=v),
        "Problem.heads": lambda: iosim.Problem(N=8, d=4, heads=v),
        "Problem.kv_heads": lambda: iosim.Problem(N=8, d=4, heads=4, kv_heads=v),
        "Problem.N_k": lambda: iosim.Problem(N=8, d=4, N_k=v),
        "Problem.window": lambda: iosim.Problem(N=8, d=4, window=v),
        "Problem.dtype": lambda: iosim.Problem(N=8, d=4, dtype=v),
        "Problem.dropout_p": lambda: iosim.Problem(N=8, d=4, dropout_p=v),
        "Tiling.B_r": lambda: iosim.Tiling(v, 4),
        "Tiling.B_c": lambda: iosim.Tiling(4, v),
        "closed_form.algorithm": lambda: iosim.closed_form(v, p, t),
        "closed_form.problem": lambda: iosim.closed_form("fa2", v, t),
        "closed_form.tiling": lambda: iosim.closed_form("fa2", p, v),
        "closed_form_arrays.N": lambda: iosim.closed_form_arrays("fa2", v, 4, 2, 3),
        "closed_form_arrays.d": lambda: iosim.closed_form_arrays("fa1", 8, v, 2, 3),
        "closed_form_arrays.B_r": lambda: iosim.closed_form_arrays("standard", 8, 4, v, 3),
        "closed_form_arrays.B_c": lambda: iosim.closed_form_arrays("fa2", 8, 4, 2, v),
        "closed_form_arrays.itemsize": lambda: iosim.closed_form_arrays("fa2", 8, 4, 2, 3,
                                                                         itemsize=v),
        "closed_form_arrays.instances": lambda: iosim.closed_form_arrays("fa2", 8, 4, 2, 3,
                                                                          instances=v),
        "closed_form_arrays.N_k": lambda: iosim.closed_form_arrays("fa2", 8, 4, 2, 3, N_k=v),
        "closed_form_arrays.causal": lambda: iosim.closed_form_arrays("fa2", 8, 4, 2, 3,
                                                                       causal=v),
        "closed_form_arrays.window": lambda: iosim.closed_form_arrays("fa2", 8, 4, 2, 3,
                                                                       window=v),
        "reference_attention.scale": lambda: iosim.reference_attention(q, q, q, scale=v),
        "reference_attention.causal": lambda: iosim.reference_attention(q, q, q, causal=v),
        "reference_attention.window": lambda: iosim.reference_attention(q, q, q, window=v),
        "reference_attention.dropout_p": lambda: iosim.reference_attention(q, q, q,
                                                                            dropout_p=v),
        "reference_attention.k": lambda: iosim.reference_attention(q, v, q),
        "DecodeProblem.N_kv": lambda: iosim.DecodeProblem(N_kv=v, d=4),
        "DecodeProblem.d": lambda: iosim.DecodeProblem(N_kv=64, d=v),
        "DecodeProblem.N_q": lambda: iosim.DecodeProblem(N_kv=64, d=4, N_q=v),
        "DecodeProblem.heads": lambda: iosim.DecodeProblem(N_kv=64, d=4, heads=v),
        "DecodeProblem.page_size": lambda: iosim.DecodeProblem(N_kv=64, d=4, page_size=v),
        "decode_closed_form.num_splits": lambda: iosim.decode_closed_form(
            "split_kv", dp, num_splits=v),
        "decode_closed_form.kv_reads": lambda: iosim.decode_closed_form("fa2_decode", dp,
                                                                         kv_reads=v),
        "decode_closed_form.schedule": lambda: iosim.decode_closed_form(v, dp),
        "choose_num_splits.sm_count": lambda: iosim.choose_num_splits(dp, v),
        "VarlenProblem.seqlens_q": lambda: iosim.VarlenProblem(v, (3, 5), 4),
        "VarlenProblem.d": lambda: iosim.VarlenProblem((3, 4), (3, 5), v),
        "VarlenProblem.causal": lambda: iosim.VarlenProblem((3, 4), (3, 5), 4, causal=v),
        "from_cu_seqlens.cu_seqlens_q": lambda: iosim.VarlenProblem.from_cu_seqlens(
            v, [0, 3, 8], 4),
        "varlen_closed_form.tiling": lambda: iosim.varlen_closed_form("fa2", vp, v),
        "varlen_closed_form.algorithm": lambda: iosim.varlen_closed_form(v, vp, t),
        "closed_form_arrays.algorithm": lambda: iosim.closed_form_arrays(v, 8, 4, 2, 3),
        "resolve_tiling.sram_bytes": lambda: iosim.resolve_tiling("fa2", 64, "fp16",
                                                                  sram_bytes=v),
        "resolve_tiling.block_rows": lambda: iosim.resolve_tiling(
            "fa2", 64, "fp16", block_rows=v, block_cols=16, sram_bytes=10 ** 6),
        "paper_tiling.M": lambda: iosim.paper_tiling(v, 64),
        "sram_footprint_bytes.B_r": lambda: iosim.sram_footprint_bytes("fa2", v, 8, 64,
                                                                       "fp16"),
        "sram_to_elements.sram_bytes": lambda: iosim.sram_to_elements(v, "fp16"),
    }
    return calls


API_NAMES = sorted(_api_calls(None))

#: what the message may call the parameter, where it is not its own name
ALIASES = {"M": ("M=",), "k": ("k ", "k,", "k has", " k"), "algorithm": ("algorithm=",),
           "N": ("N=",), "kv_heads": ("kv_heads=",), "B_r": ("B_r=", "block_rows=")}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(API_NAMES), BAD)
def test_api_bad_values_raise_config_errors_naming_the_parameter(name, value):
    call = _api_calls(value)[name]
    try:
        got = call()
    except ConfigError as e:
        param = name.split(".")[1]
        words = ALIASES.get(param, ()) + (param,)
        assert any(w in str(e) for w in words), (name, value, str(e))
        assert "\n" not in str(e)
        return
    except Exception as e:      # noqa: BLE001: anything else is the defect being looked for
        pytest.fail(f"{name}={value!r}: {type(e).__name__}: {e}")
    # accepted: then it must have been a valid value, giving the right answer
    param = name.split(".")[1]
    if name.startswith("closed_form_arrays.") and param in ("N", "d", "B_r", "B_c", "N_k"):
        alg = {"d": "fa1", "B_r": "standard"}.get(param, "fa2")
        want = []
        for x in np.asarray(value, dtype=object).reshape(-1).tolist():
            kw = dict(N=8, d=4, B_r=2, B_c=3, N_k=None)
            kw[param] = None if x is None else int(x)       # N_k=None: the default, N
            want.append(iosim.closed_form(alg, iosim.Problem(N=kw["N"], d=kw["d"], N_k=kw["N_k"],
                                                             dtype="fp16"),
                                          iosim.Tiling(kw["B_r"], kw["B_c"])).hbm_bytes)
        assert np.asarray(got["hbm_bytes"]).reshape(-1).tolist() == want, (name, value)


def test_closed_form_arrays_refuses_what_it_used_to_truncate():
    with pytest.raises(ConfigError, match=r"N=array\(\[8\.5\]\)"):
        iosim.closed_form_arrays("fa2", np.array([8.5]), 4, 2, 2)
    with pytest.raises(ConfigError, match="B_c=nan"):
        iosim.closed_form_arrays("fa2", 8, 4, 2, float("nan"))
    # the band path in arrays stays exact past int64 (was OverflowError)
    want = iosim.closed_form("fa2", iosim.Problem(N=8, d=4, N_k=2 ** 70, dtype="fp16"),
                             iosim.Tiling(2, 2)).hbm_bytes
    assert iosim.closed_form_arrays("fa2", 8, 4, 2, 2, N_k=2 ** 70)["hbm_bytes"] == want
