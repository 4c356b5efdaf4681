"""`flashsim explore`: the trace sums to the ledger, the page is self-contained, bad input is
refused; and, in a real headless browser (Chromium through Selenium), a person's use of the
page: step to the end, read the counters, toggle compare and a what-if control.

The browser tests skip, saying why, where Chromium, chromedriver or selenium is missing
(.ci/run installs them)."""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest

import iosim
from iosim import Problem, Tiling, closed_form, execute
from analysis.explore import MAX_ACCESSES, build_view, trace_counts, trace_steps
from tests._cli import run_cli

CASES = [  # (algorithm, problem, tiling)
    ("fa2", Problem(N=128, d=16, causal=True), Tiling(32, 32)),
    ("fa1", Problem(N=96, d=8, heads=2), Tiling(32, 16)),
    ("standard", Problem(N=80, d=8, causal=True), Tiling(16, 32)),
    ("fa2", Problem(N=64, d=8, N_k=160, heads=4, kv_heads=2, causal=True), Tiling(16, 32)),
    ("fa1", Problem(N=100, d=8, N_k=60, window=(20, 5)), Tiling(16, 16)),
    ("standard", Problem(N=50, d=8, N_k=90, batch=2, heads=2, kv_heads=1, window=(30, -1)),
     Tiling(16, 8)),
    ("fa2", Problem(N=130, d=8, window=(10, 10)), Tiling(32, 16)),
    ("fa1", Problem(N=96, d=8, causal=True, block_mask=np.eye(3, 6, dtype=bool) |
                    np.eye(3, 6, 2, dtype=bool)), Tiling(32, 16)),
]


@pytest.mark.parametrize("alg,problem,tiling", CASES)
def test_trace_sums_to_ledger(alg, problem, tiling):
    """The recorded trace sums to the ledger exactly; recording changes no count."""
    ex = execute(alg, problem, tiling, record=True)
    plain = execute(alg, problem, tiling)
    want = closed_form(alg, problem, tiling).counts()
    assert ex.ledger.counts() == plain.ledger.counts() == want
    assert plain.trace is None
    data = trace_steps(ex.trace)
    assert trace_counts(data) == want
    # skipped tiles are never visited
    active = iosim.active_tiles(problem, tiling)
    for k, cta, i, j, acc in data["steps"]:
        if i >= 0 and j >= 0:
            assert active[i, j]


@pytest.mark.parametrize("alg,problem,tiling", CASES[:4] + [
    ("fa2", Problem(N=64, d=8, batch=2, heads=4, kv_heads=2, causal=True), Tiling(16, 32)),
    ("standard", Problem(N=48, d=8, N_k=80, heads=2, kv_heads=1, window=(20, 3)), Tiling(16, 16))])
def test_backward_trace_sums_to_ledger(alg, problem, tiling):
    """The backward's trace (with the grouped heads' dK, dV reduction) sums to its ledger;
    recording changes no count."""
    ex = iosim.execute_backward(alg, problem, tiling, record=True)
    want = iosim.backward_closed_form(alg, problem, tiling).counts()
    assert ex.ledger.counts() == iosim.execute_backward(alg, problem, tiling).ledger.counts() == want
    data = trace_steps(ex.trace)
    assert trace_counts(data) == want
    kernels = [s[0] for s in data["steps"]]
    assert kernels == sorted(kernels)            # kernel by kernel, in launch order


@pytest.mark.parametrize("kw,splits,kv_reads", [
    (dict(N_kv=300, d=8, heads=4, kv_heads=2), 1, "per_query_head"),
    (dict(N_kv=1000, d=8, heads=4, kv_heads=2, N_q=3), 3, "per_query_head"),
    (dict(N_kv=257, d=8, batch=2, heads=4, kv_heads=1, N_q=2), 4, "per_group"),
])
def test_decode_trace_sums_to_ledger(kw, splits, kv_reads):
    """A decoding step's page: its steps sum to the decode ledger (the view checks it),
    recording changes no count, and each query head's tiles are its group's."""
    from analysis.explore import build_decode_view
    p = iosim.DecodeProblem(**kw)
    v = build_decode_view(p, splits, kv_reads)
    schedule = "split_kv" if splits > 1 else "fa2_decode"
    want = iosim.decode_closed_form(schedule, p, num_splits=splits, kv_reads=kv_reads).counts()
    assert trace_counts(v) == want
    assert iosim.execute_decode(schedule, p, num_splits=splits, kv_reads=kv_reads,
                                block_kv=64).ledger.counts() == want
    for k, cta, i, j, acc in v["steps"]:
        if j >= 0:
            assert v["active"][i][j]
    assert v["levels"] is None and "predict_decode" in v["levels_declined"]


def test_view_checks_and_declines():
    """build_view: the ledger, the waves, and the L2 model's refusal named for N_k != N
    (modelled for the fa2 forward since issue 39; fa1's is still declined)."""
    v = build_view("fa1", Problem(N=64, d=8, N_k=128, causal=True), Tiling(16, 32))
    assert v["levels"] is None and "N_k" in v["levels_declined"]
    assert v["ledger"] == {t: list(c) for t, c in
                           closed_form("fa1", Problem(N=64, d=8, N_k=128, causal=True),
                                       Tiling(16, 32)).counts().items()}
    assert sum(1 for row in v["active"] for x in row if not x) > 0


def _page(tmp_path, *args):
    out = tmp_path / "p.html"
    rc, _, err = run_cli(["explore", *args, "--out", str(out)])
    assert rc == 0, err
    return out


def _data(path) -> dict:
    html = path.read_text()
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def test_page_self_contained(tmp_path):
    path = _page(tmp_path, "--algorithm", "fa2", "--seq-len", "128", "--head-dim", "16",
                 "--block-rows", "32", "--block-cols", "32", "--causal", "--compare", "fa1",
                 "--no-whatif")
    html = path.read_text()
    assert not re.search(r"https?://", html), "the page refers to the network"
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)
    d = _data(path)
    assert [v["algorithm"] for v in d["views"]] == ["fa2", "fa1"]


@pytest.mark.parametrize("args,needle", [
    (["--seq-len", "65536", "--block-rows", "16", "--block-cols", "16"], "at most"),
    (["--seq-len", "128", "--block-rows", "0", "--block-cols", "16"], "block"),
    (["--seq-len", "128", "--compare-tiling", "12by3"], "--compare-tiling"),
    (["--seq-len", "128", "--gpu", "nope"], "gpu"),
    (["--seq-len", "1", "--seq-len-kv", "64", "--decode", "--causal"], "--causal"),
    (["--seq-len", "1", "--decode"], "--seq-len-kv"),
    (["--seq-len", "128", "--num-splits", "2"], "--decode"),
])
def test_bad_input(tmp_path, args, needle):
    rc, _, err = run_cli(["explore", "--algorithm", "fa2", "--head-dim", "16", *args,
                          "--out", str(tmp_path / "x.html")])
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "x.html").exists()


def test_limit_is_stated():
    assert MAX_ACCESSES >= 100_000


# ---------------------------------------------------------------------------------------
# In a browser
# ---------------------------------------------------------------------------------------
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _why_no_browser():
    import importlib.util
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install selenium; the test extra has it)"
    for path in (CHROMIUM, DRIVER):
        if not (os.path.exists(path) or shutil.which(os.path.basename(path))):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def browser():
    why = _why_no_browser()
    if why:
        pytest.skip(f"no headless browser: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    o = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        o.add_argument(a)
    o.binary_location = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    drv = DRIVER if os.path.exists(DRIVER) else shutil.which("chromedriver")
    d = webdriver.Chrome(options=o, service=Service(drv))
    yield d
    d.quit()


def _val(d, el_id):
    return float(d.find_element("id", el_id).get_attribute("data-value"))


def _check_end(d, data, shots, name):
    """Step a few times, jump to the end; counters equal the ledger, DRAM the prediction."""
    d.find_element("id", "btn-step").click()
    d.find_element("id", "btn-step").click()
    assert d.find_element("id", "stepinfo").get_attribute("data-step") == "2"
    d.find_element("id", "btn-end").click()
    for vi, v in enumerate(data["views"]):
        skipped = d.find_elements("css selector", f"#v{vi}-svg rect[data-skipped]")
        assert len(skipped) == sum(1 for row in v["active"] for x in row if not x)
        for t, (r, w) in v["ledger"].items():
            assert _val(d, f"v{vi}-r-{t}") == r, (vi, t)
            assert _val(d, f"v{vi}-w-{t}") == w, (vi, t)
        assert _val(d, f"v{vi}-bytes") == v["ledger_bytes"]
        if v["levels"]:
            lv = v["levels"]
            assert _val(d, f"v{vi}-dram-sofar") == pytest.approx(
                lv["dram_read_bytes"] + lv["dram_write_bytes"], rel=1e-12)
        else:
            assert d.find_element("id", f"v{vi}-dram-declined").text
    d.save_screenshot(str(shots / f"{name}.png"))
    assert [e for e in d.get_log("browser") if e.get("level") == "SEVERE"] == []


BROWSER_CASES = {
    "fa2_causal": ["--algorithm", "fa2", "--seq-len", "256", "--head-dim", "32",
                   "--block-rows", "64", "--block-cols", "64", "--causal"],
    "fa1": ["--algorithm", "fa1", "--seq-len", "192", "--head-dim", "16",
            "--block-rows", "32", "--block-cols", "64"],
    "standard": ["--algorithm", "standard", "--seq-len", "128", "--head-dim", "16",
                 "--block-rows", "32", "--block-cols", "32", "--causal"],
    "fa2_backward": ["--algorithm", "fa2", "--seq-len", "128", "--head-dim", "16", "--heads", "2",
                     "--kv-heads", "1", "--block-rows", "32", "--block-cols", "32", "--causal",
                     "--backward"],
    "standard_backward": ["--algorithm", "standard", "--seq-len", "96", "--head-dim", "16",
                          "--block-rows", "32", "--block-cols", "32", "--backward"],
    "decode_split": ["--algorithm", "fa2", "--decode", "--seq-len", "2", "--seq-len-kv", "600",
                     "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--num-splits", "3"],
    "block_sparse": ["--algorithm", "fa2", "--seq-len", "128", "--head-dim", "16",
                     "--block-rows", "16", "--block-cols", "16", "--sparsity", "0.3"],
    "gqa_nk": ["--algorithm", "fa2", "--seq-len", "64", "--seq-len-kv", "160", "--heads", "4",
               "--kv-heads", "2", "--head-dim", "16", "--block-rows", "16", "--block-cols", "32",
               "--causal"],
}


@pytest.mark.parametrize("name", list(BROWSER_CASES))
def test_browser_steps_to_the_ledger(browser, tmp_path, name):
    path = _page(tmp_path, *BROWSER_CASES[name], "--no-whatif")
    browser.get(path.as_uri())
    _check_end(browser, _data(path), tmp_path, name)
    assert (tmp_path / f"{name}.png").stat().st_size > 1000


def test_browser_summarised(browser, tmp_path, monkeypatch):
    """Over MAX_ACCESSES the page is summarised per thread block; its counters still end at
    the ledger."""
    import analysis.explore
    monkeypatch.setattr(analysis.explore, "MAX_ACCESSES", 50)
    path = _page(tmp_path, "--algorithm", "fa1", "--seq-len", "128", "--head-dim", "16",
                 "--heads", "2", "--block-rows", "32", "--block-cols", "32", "--causal",
                 "--no-whatif")
    data = _data(path)
    v = data["views"][0]
    assert v["summarised"] and len(v["steps"]) == len(v["ctas"]) == 2
    browser.get(path.as_uri())
    assert "Summarised per thread block" in browser.find_element("id", "view0").text
    _check_end(browser, data, tmp_path, "summarised")


def test_browser_compare_and_whatif(browser, tmp_path):
    path = _page(tmp_path, "--algorithm", "fa2", "--seq-len", "256", "--head-dim", "32",
                 "--block-rows", "64", "--block-cols", "64", "--compare", "fa1")
    data = _data(path)
    browser.get(path.as_uri())
    _check_end(browser, data, tmp_path, "compare")
    a, b = data["views"]
    assert _val(browser, "diff-bytes") == b["ledger_bytes"] - a["ledger_bytes"]
    # one step back from the end: the last step's accesses come off the counters
    last = a["steps"][-1] if len(a["steps"]) >= len(b["steps"]) else None
    browser.find_element("id", "btn-back").click()
    if last:
        for op, t, *_, n in last[4]:
            name = a["tensors"][t]
            assert _val(browser, f"v0-{'rw'[op]}-{name}") == a["ledger"][name][op] - sum(
                x[6] for x in last[4] if x[0] == op and x[1] == t)
    # play, then pause: the step advances and then stays
    import time
    browser.find_element("id", "btn-reset").click()
    browser.find_element("id", "btn-play").click()
    time.sleep(0.6)
    browser.find_element("id", "btn-play").click()
    at = int(browser.find_element("id", "stepinfo").get_attribute("data-step"))
    time.sleep(0.3)
    assert 0 < at == int(browser.find_element("id", "stepinfo").get_attribute("data-step"))
    from selenium.webdriver.support.ui import Select
    toggle = browser.find_element("id", "compare-toggle")
    assert browser.find_element("id", "view1").is_displayed()
    toggle.click()
    assert not browser.find_element("id", "view1").is_displayed()
    toggle.click()
    assert browser.find_element("id", "view1").is_displayed()
    # what-if: pick N = 1024, d = 64, B_r = 128; the page shows the embedded numbers
    W = data["whatif"]
    Select(browser.find_element("id", "wi-N")).select_by_visible_text("1024")
    Select(browser.find_element("id", "wi-d")).select_by_visible_text("64")
    Select(browser.find_element("id", "wi-Br")).select_by_visible_text("128")
    iN, idd, ir, ic = W["N"].index(1024), W["d"].index(64), W["B"].index(128), W["B"].index(64)
    k = ((iN * len(W["d"]) + idd) * len(W["B"]) + ir) * len(W["B"]) + ic
    for alg in ("fa2", "fa1"):
        assert _val(browser, f"wi-traffic-{alg}") == W["traffic"][alg][k]
        assert _val(browser, f"wi-time-{alg}") == W["time_ms"][f"{alg}|{a['gpu']}"][k]
    want = closed_form("fa2", Problem(N=1024, d=64), Tiling(128, 64))
    assert _val(browser, "wi-traffic-fa2") == want.read_elements + want.write_elements
    iM = 1
    assert _val(browser, "wi-bound") == W["bound"][(iN * len(W["d"]) + idd) * len(W["M_bytes"]) + iM]
    browser.save_screenshot(str(tmp_path / "whatif.png"))


def test_waves_follow_the_launch_order():
    """Waves: the causal fa2 tensor-core / fast kernels launch the heaviest query block first;
    the slots are the preset's SMs x the plan's CTAs per SM."""
    p = Problem(N=256, d=32, causal=True, heads=2)
    v = build_view("fa2", p, Tiling(64, 64))
    w = v["waves"][0]
    assert w["heavy_first"] and w["slots"] == v["sm_count"] * w["ctas_per_sm"]
    first = [n for n, (pos, *_rest) in w["cta"].items() if pos == 0][0]
    assert v["ctas"][int(first)][2] == [3]           # query block T_r - 1 of instance 0
    dense = build_view("fa2", Problem(N=256, d=32, heads=2), Tiling(64, 64))["waves"][0]
    assert not dense["heavy_first"]
    assert [dense["cta"][str(n)][0] for n in range(8)] == list(range(8))


def test_trace_sums_to_ledger_property():
    """Many random problems (masks, windows, N_q != N_k, grouped heads, ragged tiles): the
    forward and backward traces sum to their ledgers exactly."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(alg=st.sampled_from(["standard", "fa1", "fa2"]), N=st.integers(1, 70),
           N_k=st.integers(1, 70), B_r=st.integers(1, 40), B_c=st.integers(1, 40),
           causal=st.booleans(), wl=st.integers(-1, 30), wr=st.integers(-1, 30),
           group=st.sampled_from([(1, 1), (2, 1), (4, 2)]), backward=st.booleans())
    def check(alg, N, N_k, B_r, B_c, causal, wl, wr, group, backward):
        if causal and wr not in (-1, 0):
            wr = 0
        p = Problem(N=N, d=4, N_k=N_k, heads=group[0], kv_heads=group[1], causal=causal,
                    window=(wl, wr))
        t = Tiling(B_r, B_c)
        if backward:
            ex = iosim.execute_backward(alg, p, t, record=True)
            want = iosim.backward_closed_form(alg, p, t).counts()
        else:
            ex = execute(alg, p, t, record=True)
            want = closed_form(alg, p, t).counts()
        assert ex.ledger.counts() == want
        assert trace_counts(trace_steps(ex.trace)) == want
    check()
