"""analysis.hwmeasure's cutting of a CUPTI trace into passes (no GPU needed)."""
import glob
import os
import re

import pytest

from analysis import hwmeasure as hm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ev(name, ts, dur=1000.0):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}


MARK = "analysis::hwmeasure::flashsim_marker[abi:v1]"


def test_every_kernel_prefix_of_the_gpu_package_is_profiled():
    """Nsight Compute profiles only names OUR_KERNELS matches: each kernel_name prefix in
    gpu/ must match, or its traffic and time would silently drop out of a pass."""
    prefixes = set()
    for path in glob.glob(os.path.join(ROOT, "gpu", "**", "*.py"), recursive=True):
        prefixes |= set(re.findall(r'kernel_name\(\s*"([A-Za-z0-9_]+)"', open(path).read()))
    assert len(prefixes) > 15
    missing = [p for p in sorted(prefixes) if not re.search(hm.OUR_KERNELS, p)]
    assert not missing


def test_passes_take_every_gpu_kernel_between_markers():
    tr = {"traceEvents": [
        _ev(MARK, 0), _ev("gpu::forward::standard_fast::std_fast_S_Br64[abi:v1]", 1, 2000),
        _ev("void at::native::fill_kernel<float>", 2, 50),         # torch's poison fill: not ours
        _ev("gpu::forward::standard::std_softmax_Br64[abi:v2]", 3, 500),
        _ev("gpu::forward::standard_fast::std_fast_PV_Br64[abi:v3]", 4, 1500),
        _ev(MARK, 5), _ev("gpu::forward::fa1_fast::fa1_fast_Br128[abi:v4]", 6, 3000),
        _ev(MARK, 7)]}
    passes = hm.passes_from_trace(tr)
    assert [[n.split("::")[-1].split("_Br")[0] for n, _ in p] for p in passes] == [
        ["std_fast_S", "std_softmax", "std_fast_PV"], ["fa1_fast"]]
    assert sum(ms for _, ms in passes[0]) == pytest.approx(4.0)


def test_a_kernel_missing_from_the_list_is_an_error_not_a_shorter_pass():
    tr = {"traceEvents": [_ev(MARK, 0), _ev("gpu::forward::new_thing::brand_new_k[abi:v1]", 1),
                          _ev(MARK, 2)]}
    with pytest.raises(RuntimeError, match="brand_new_k"):
        hm.passes_from_trace(tr)


def test_an_empty_pass_is_an_error():
    with pytest.raises(RuntimeError, match="passes"):
        hm.passes_from_trace({"traceEvents": [_ev(MARK, 0), _ev(MARK, 1)]})


def test_a_kernel_without_a_module_is_taken_not_dropped():
    """A Numba kernel made by exec had no module and showed in CUPTI as
    _3cdynamic_3e::...: it was once left out of the fast backward's time. It is taken (and
    checked against OUR_KERNELS) now."""
    tr = {"traceEvents": [
        _ev(MARK, 0), _ev("gpu::backward::fa2_fast::fa2_bwd_pre_fast_d64[abi:v1]", 1, 100),
        _ev("_3cdynamic_3e::fa2_bwd_fast_Br64_Bc64_d64_fp32[abi:v2]", 2, 3000),
        _ev("gpu::backward::flash::bwd_convert_fp32[abi:v3]", 3, 200), _ev(MARK, 4)]}
    (p,) = hm.passes_from_trace(tr)
    assert [n.split("::")[-1].split("[")[0].split("_Br")[0].split("_d64")[0] for n, _ in p] == [
        "fa2_bwd_pre_fast", "fa2_bwd_fast", "bwd_convert_fp32"]
    with pytest.raises(RuntimeError, match="brand_new"):
        hm.passes_from_trace({"traceEvents": [_ev(MARK, 0), _ev("_3cdynamic_3e::brand_new[x]", 1),
                                              _ev(MARK, 2)]})


FAKE_NCU = r'''#!/usr/bin/env python3
# A stand-in for Nsight Compute: writes the child's manifest (the first configuration
# ok, the second failed) and prints CSV rows for marker, kernel, marker of the first
# pass and a marker pair around nothing for the second, as `ncu --csv` would.
import json, sys
a = sys.argv
cfgs = json.load(open(a[a.index("--configs") + 1]))
metrics = a[a.index("--metrics") + 1].split(",")
with open(a[a.index("--manifest") + 1], "w") as f:
    f.write(json.dumps({"id": cfgs[0]["id"], "ok": True, "tiling": [64, 64]}) + "\n")
    f.write(json.dumps({"id": cfgs[1]["id"], "ok": False, "error": "ValueError: no"}) + "\n")
print('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"')
rows = [(0, "flashsim_marker"), (1, "fa2_fwd_kernel"), (2, "fa2_fwd_kernel"),
        (3, "flashsim_marker"), (4, "flashsim_marker"), (5, "flashsim_marker")]
for i, k in rows:
    for m in metrics:
        print(f'"{i}","{k}","{m}","byte","{i * 10}"')
'''


def test_ncu_passes_and_counter_rows_from_one_run(tmp_path):
    """hwmeasure.ncu_passes (any Nsight Compute metrics, the counters' among them) cuts a
    run's kernels into passes by the manifest; _counter_rows makes rows of them."""
    ncu = tmp_path / "ncu"
    ncu.write_text(FAKE_NCU)
    ncu.chmod(0o755)
    chunk = [{"id": "a"}, {"id": "b"}]
    got = hm.ncu_passes(chunk, str(ncu), ["dram__bytes_read.sum"], timeout=60)
    assert [(c["id"], rec["ok"]) for c, rec, _ in got] == [("a", True), ("b", False)]
    assert [k["id"] for k in got[0][2]] == [1, 2] and got[1][2] is None
    assert got[0][2][1]["metrics"] == {"dram__bytes_read.sum": 20.0}
    rows = hm._counter_rows(chunk, str(ncu), {"device": "fake"}, timeout=60)
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert rows[0]["measured"]["dram_read_bytes"] == 10.0 + 20.0
    assert rows[0]["tiling"] == [64, 64] and rows[1]["error"] == "ValueError: no"
