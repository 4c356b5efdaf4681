"""gpu.decode(main="tc"), the tensor-core decode kernel (gpu/decode/tc.py): its layout and
refusals (no GPU needed), its linked build (NVVM, NVRTC, nvJitLink: no GPU needed), and on
a GPU (marked `gpu`) its outputs against dense float64 and PyTorch, and its own counts
against iosim.decode's closed form, over grouped and single heads, N_q > 1, causal or not,
contiguous and paged (16, 256, more pages than one window), ragged lengths with 0 and 1,
appends, S = 1 and S > 1, and every layout the benchmarks time."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from numba import config as numba_config

import _background
from iosim.decode import (DecodeProblem, append_kv, decode_closed_form, paged_cache,
                          random_decode_inputs, random_new_kv, reference_decode)
from iosim.launch import decode as geo

SIM = numba_config.ENABLE_CUDASIM
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------
# Layout and refusals
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("d, dt, NR, why", [
    (128, "fp32", 4, "fp32"), (72, "fp16", 4, "d % 16"), (144, "fp16", 4, "d > 128"),
    (128, "bf16", 17, "NR > 16")])
def test_plan_declines_what_it_cannot_run(d, dt, NR, why):
    assert geo.tc_plan(d, dt, NR) is None, why
    assert geo.tc_plan(128, "fp16", 4, sim=True) is None          # linked C++: no simulator
    assert geo.tc_plan(128, "fp16", 4, vec_ok=False) is None      # cp.async: 16-byte rows


def test_plan_layout_and_resident_blocks():
    lay = geo.tc_plan(128, "fp16", 4)
    NW, BC, STG = (geo.TC_DEFAULT[k] for k in ("warps", "block_keys", "stages"))
    assert (lay["NW"], lay["BC"], lay["STG"], lay["NT"]) == (NW, BC, STG, 32 * NW)
    # Q tile (16 rows) + each warp's STG K and STG V tiles, rows of d + 8 elements
    assert lay["smem_bytes"] == 2 * (16 + NW * 2 * STG * BC) * (128 + 8)
    # the merge (each warp's 16 x d floats, m and l) fits in the same space at every layout
    for w in geo.TC_CHOICES["warps"]:
        for bc in geo.TC_CHOICES["block_keys"]:
            for s in geo.TC_CHOICES["stages"]:
                for d in (16, 64, 128):
                    x = geo.tc_plan(d, "bf16", 16, warps=w, block_keys=bc, stages=s)
                    assert x["smem_bytes"] >= 4 * w * 16 * (d + 2)
                    assert x["smem_bytes"] == 2 * (16 + w * 2 * s * bc) * (d + 8)
    # shared memory binds: 228 KB an SM, 1 KB reserved a block
    big = geo.tc_plan(128, "fp16", 4, warps=8, block_keys=32, stages=4)
    assert geo.tc_resident_blocks(big) == 1
    small = geo.tc_plan(64, "fp16", 4, warps=1, block_keys=16, stages=2)
    assert geo.tc_resident_blocks(small) == min(
        228 * 1024 // (small["smem_bytes"] + 1024),
        65536 // (-(-geo.TC_REGISTERS[(64, 16, False)] * 32 // 256) * 256))
    assert geo.tc_resident_blocks(small, paged=True) <= geo.tc_resident_blocks(small)


@pytest.mark.parametrize("kw, msg", [
    (dict(warps=3), "warps=3 is not allowed"), (dict(block_keys=24), "block_keys=24"),
    (dict(stages=5), "stages=5 is not allowed")])
def test_plan_refuses_other_layouts(kw, msg):
    with pytest.raises(ValueError, match=msg):
        geo.tc_plan(128, "fp16", 4, **kw)


def test_main_tc_is_asked_for_and_refused_where_it_cannot_run():
    p = DecodeProblem(N_kv=4096, d=128, batch=8, heads=32, kv_heads=8, dtype="fp16")
    assert geo.main_kernel(p, "per_group") == "tc"                   # auto: tc on a GPU ...
    assert geo.main_kernel(p, "per_group", sim=True) == "flat"       # ... flat in the simulator
    assert geo.main_kernel(p, "per_query_head") == "tc"              # one row a block too
    p32 = DecodeProblem(N_kv=4096, d=128, batch=8, heads=32, kv_heads=8, dtype="fp32")
    assert geo.main_kernel(p32, "per_group") == "flat"               # fp32: flat
    p256 = DecodeProblem(N_kv=4096, d=256, batch=8, heads=32, kv_heads=8, dtype="fp16")
    assert geo.main_kernel(p256, "per_query_head") != "tc"           # d = 256: not tc
    assert geo.choose_kv_reads(p) == "per_group"
    assert geo.main_kernel(p, "per_group", "tc") == "tc"
    assert geo.choose_kv_reads(p, "auto", "tc") == "per_group"
    with pytest.raises(ValueError, match="main='tc' does not run 4 query rows a block at "
                                         "d=128 .fp16, in the simulator"):
        geo.main_kernel(p, "per_group", "tc", sim=True)
    p32 = DecodeProblem(N_kv=4096, d=128, batch=8, heads=32, kv_heads=8, dtype="fp32")
    with pytest.raises(ValueError, match="main='tc' does not run"):
        geo.main_kernel(p32, "per_group", "tc")
    # S for "auto": the SMs full of tensor-core blocks
    lay = geo.tc_plan(128, "fp16", 4)
    assert geo.ctas_per_sm(p, "per_group", "tc") == geo.tc_resident_blocks(lay)


@pytest.mark.skipif(not SIM, reason="the simulator's refusal")
def test_decode_refuses_tc_in_the_simulator():
    import gpu
    p = DecodeProblem(N_kv=40, d=64, heads=4, kv_heads=1, dtype="fp16")
    q, k, v = random_decode_inputs(p)
    with pytest.raises(ValueError, match=r"main='tc' does not run .*in the simulator"):
        gpu.decode(q, k, v, main="tc")


# ---------------------------------------------------------------------------------------
# The linked build, in a subprocess with the simulator off (no GPU needed)
# ---------------------------------------------------------------------------------------
BUILD = r"""
import json, sys
from gpu.decode import tc
out = []
for cfg in json.loads(sys.argv[1]):
    p = tc.linked_ptx(**cfg)
    out.append(dict(cfg=cfg, mma=p.count("mma.sync"), bf16=p.count(".bf16.bf16.f32"),
                    ldmatrix=p.count("ldmatrix"), local=p.count(".local"),
                    call=len([l for l in p.splitlines() if l.strip().startswith("call")]),
                    f64=p.count(".f64"), cp_async=p.count("cp.async.cg"),
                    wait=sorted(set(l.strip() for l in p.splitlines()
                                    if "cp.async.wait_group" in l)),
                    atom=p.count("atom.")))
    open(sys.argv[2] + f"/{len(out)}.ptx", "w").write(p)
print(json.dumps(out))
"""
BUILDS = [dict(d=128), dict(d=64, dt="bf16", N_q=2, NG=8, paged=True, count=True, STG=2),
          dict(d=128, NW=8, BC=32, STG=4, split=False)]


def _build_job():
    out = _background.mkdtemp("decode-tc-ptx")
    env = dict(_background.environ(), NUMBA_ENABLE_CUDASIM="0")
    args = [sys.executable, "-c", BUILD, json.dumps(BUILDS), out]
    return _background.run(args, env=env, cwd=ROOT, timeout=600), out


@pytest.mark.prestart(job=_build_job)
def test_linked_build_runs_the_products_on_the_tensor_cores():
    """Each build links into one kernel with the C++ inlined (no call), its fragments in
    registers (no .local), exactly the mma.sync and ldmatrix its tile implies, cp.async
    copies waited on at the pipeline's depth, no float64, atomics only when counting;
    ptxas (where present) reports no spills."""
    r, out = _background.result(_build_job)
    if r.returncode != 0 and ("nvjitlink" in r.stderr.lower() or "nvrtc" in r.stderr.lower()
                              or "NVVM" in r.stderr):
        pytest.skip("cannot build linked code here: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout + r.stderr
    for row in json.loads(r.stdout.strip().splitlines()[-1]):
        cfg = row["cfg"]
        d, BC = cfg["d"], cfg.get("BC", geo.TC_DEFAULT["block_keys"])
        STG = cfg.get("STG", geo.TC_DEFAULT["stages"])
        # S = Q K^T: (BC / 8) key tiles x (d / 16) k steps; O += P V: (d / 8) x (BC / 16)
        assert row["mma"] == BC * d // 128 + BC * d // 128, row
        assert row["bf16"] == (row["mma"] if cfg.get("dt") == "bf16" else 0), row
        # Q once (d / 16), K and V fragments once a step each
        assert row["ldmatrix"] == d // 16 + 2 * (BC // 16) * (d // 16), row
        assert row["local"] == 0 and row["call"] == 0 and row["f64"] == 0, row
        assert row["cp_async"] > 0, row
        assert f"cp.async.wait_group {STG - 1};" in row["wait"], row
        assert (row["atom"] > 0) == bool(cfg.get("count")), row
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        text = open(path).read()
        with open(path, "w") as f:     # ptxas may be older than nvJitLink's PTX ISA
            f.write(re.sub(r"^\.version \d+\.\d+", ".version 8.0", text, flags=re.M))
        r = subprocess.run([ptxas, "-arch=sm_90", "-v", path, "-o", os.devnull],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip(f"ptxas cannot assemble nvJitLink's PTX here: {r.stderr[-300:]}")
        spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
        assert spills and all(int(s) == 0 for s in spills), (name, r.stderr)


# ---------------------------------------------------------------------------------------
# On a GPU: outputs and counts
# ---------------------------------------------------------------------------------------
def _rel(x, ref):
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / (den if den else 1.0))


def _f64(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def sdpa_err(q, k, v, seqlens, causal, dt, ref):
    """PyTorch SDPA in dt (per sequence, explicit boolean mask, K/V repeated per group)
    against the float64 reference: the yardstick of the 16-bit tolerance."""
    import torch
    tdt = torch.float16 if dt == "fp16" else torch.bfloat16
    H, Hk, N_q = q.shape[1], k.shape[1], q.shape[2]
    outs = []
    for b, n in enumerate(seqlens):
        if n == 0:
            outs.append(np.zeros(q.shape[1:]))
            continue
        t = lambda x: torch.tensor(_f64(x), device="cuda").to(tdt)
        kk = np.repeat(k[b, :, :n], H // Hk, axis=0)
        vv = np.repeat(v[b, :, :n], H // Hk, axis=0)
        allow = np.ones((N_q, n), bool)
        if causal:
            allow = np.arange(n)[None, :] <= n - N_q + np.arange(N_q)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(
            t(q[b])[None], t(kk)[None], t(vv)[None],
            attn_mask=torch.tensor(allow, device="cuda"))
        outs.append(torch.nan_to_num(o.double(), nan=0.0)[0].cpu().numpy())
    return _rel(np.stack(outs), ref)


# (dtype, lengths (one N_kv or per sequence), N_q, heads, kv_heads, page, S, causal, d, append)
CASES = [
    ("fp16", 1000, 1, 32, 8, None, 1, True, 128, False),          # GQA, fa2_decode
    ("fp16", 4099, 1, 32, 8, None, 7, True, 128, False),          # GQA, split, ragged tail
    ("bf16", 4099, 1, 8, 1, None, 5, True, 64, False),            # MQA bf16
    ("fp16", 2000, 2, 16, 2, 16, 3, True, 64, False),             # 16 rows a block, pages of 16
    ("fp16", 3000, 3, 8, 2, 256, 4, True, 128, False),            # 12 rows, pages of 256
    ("fp16", 777, 1, 4, 4, None, 2, False, 64, False),            # MHA (1 row), not causal
    ("fp16", 9000, 1, 8, 2, 16, 1, True, 128, False),             # 563 pages: 3 windows
    ("bf16", (5000, 0, 1, 17), 1, 32, 8, 16, 6, True, 128, False),  # ragged, paged
    ("fp16", (300, 0, 1, 2000), 2, 8, 2, None, 3, True, 64, False),  # ragged, N_q = 2
    ("fp16", (100, 7), 2, 8, 2, 16, 2, True, 64, True),           # append, paged
    ("bf16", (0, 64), 1, 8, 8, None, 1, True, 16, True),          # append, d = 16, MHA
]


def run_tc(case, tc_layout=None, seed=0):
    import gpu
    from gpu.decode.api import DecodeLauncher
    dt, lens, N_q, H, Hk, page, S, causal, d, append = case
    if isinstance(lens, int) and not append:
        p = DecodeProblem(N_kv=lens, d=d, heads=H, kv_heads=Hk, N_q=N_q, dtype=dt,
                          page_size=page)
    else:
        lens = (lens,) if isinstance(lens, int) else lens
        p = DecodeProblem.ragged(lens, d, heads=H, kv_heads=Hk, N_q=N_q, append=append,
                                 page_size=page, dtype=dt)
    q, k, v = random_decode_inputs(p, seed=seed)
    kn, vn = random_new_kv(p, seed=seed) if append else (None, None)
    kw = dict(num_splits=S, kv_reads="per_group", causal=causal, return_stats=True,
              count_traffic=True, main="tc")
    # the lengths, always: without them a paged cache holds pages x P rows, and the rows
    # past N_kv in the last page are NaN (paged_cache)
    kw["cache_seqlens"] = list(p.cache_seqlens) if p.is_ragged else p.N_kv
    if append:
        kw.update(k=kn, v=vn)
    if tc_layout is None:
        if page:
            kc, vc, table = paged_cache(p, k, v, seed=seed + 1)
            O, L, led = gpu.decode(q, kc, vc, block_table=table, **kw)
        else:
            O, L, led = gpu.decode(q, k.copy(), v.copy(), **kw)
    else:   # a benchmark layout: the launcher the bench times, on device arrays
        from numba import cuda
        assert not page and not p.is_ragged
        run = DecodeLauncher(p, S, kv_reads="per_group", causal=causal, count=True,
                             main="tc", tc_layout=tc_layout)
        view = (lambda x: x.view(np.uint16)) if dt == "bf16" else (lambda x: x)
        qd, kd, vd = (cuda.to_device(view(np.ascontiguousarray(x))) for x in (q, k, v))
        od = cuda.device_array(q.shape, dtype=np.uint16 if dt == "bf16" else np.float16)
        Ld = cuda.device_array(q.shape[:3], dtype=np.float32)
        opart, lpart = run.partials()
        counters = run.new_counters()
        run(qd, kd, vd, None, od, Ld, opart, lpart, counters, 1.0 / np.sqrt(d))
        O = od.copy_to_host().view(p.np_dtype)     # bf16: the bits as bfloat16
        L, led = Ld.copy_to_host(), run.ledger(counters)
    kk, vv = append_kv(p, k, v, kn, vn) if append else (k, v)
    return p, (q, kk, vv), O, L, led


def check(case, p, qkv, O, L, led):
    dt, S, causal = case[0], case[6], case[7]
    q, k, v = qkv
    seq = list(p.seqlens)
    if causal:
        ref, lse = reference_decode(q, k, v, seqlens=seq, return_lse=True)
    else:
        outs = [reference_decode(q[:, :, r:r + 1], k, v, seqlens=seq, return_lse=True)
                for r in range(p.N_q)]
        ref = np.concatenate([o for o, _ in outs], axis=2)
        lse = np.concatenate([x for _, x in outs], axis=2)
    O64 = _f64(O)
    assert not np.isnan(O64).any() and not np.isnan(L).any()
    yard = sdpa_err(q, k, v, seq, causal, dt, ref)
    assert _rel(O64, ref) <= 2 * yard + 1e-5, (_rel(O64, ref), yard)
    none = np.isneginf(lse)
    assert np.array_equal(np.isneginf(L), none) and np.all(O64[none] == 0)
    np.testing.assert_allclose(L[~none], lse[~none], rtol=0,
                               atol=2e-5 * (1 + np.abs(lse[~none]).max(initial=0)))
    schedule = "split_kv" if S > 1 else "fa2_decode"
    cf = decode_closed_form(schedule, p, num_splits=S, kv_reads="per_group")
    assert led.algorithm == schedule and led.counts() == cf.counts()   # exact, every tensor
    assert led.hbm_bytes == cf.hbm_bytes


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_tc_outputs_and_counts(case):
    pytest.importorskip("torch")
    check(case, *run_tc(case))


#: every layout benchmarks/decode_flat_probe.py --tc times
LAYOUTS = [dict(warps=w, block_keys=bc, stages=s) for w, bc, s in
           ((4, 16, 3), (4, 16, 2), (2, 16, 4), (8, 16, 2), (4, 32, 2), (1, 16, 4),
            (2, 32, 3), (4, 16, 4))]


@pytest.mark.gpu
@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda x: "w{warps}-bc{block_keys}-s{stages}".format(**x))
def test_tc_layouts(lay):
    pytest.importorskip("torch")
    for case in (("fp16", 3001, 1, 32, 8, None, 3, True, 128, False),
                 ("bf16", 2049, 1, 8, 1, None, 1, True, 64, False)):
        check(case, *run_tc(case, tc_layout=lay))


def test_time_model_takes_tc_only_with_its_own_constants(tmp_path, monkeypatch):
    """predict_decode(main='tc') is the flat form at the tc kernel's tile (NW x B_c rows) and
    resident blocks; without its fitted constants it declines in one line."""
    from iosim import ConfigError
    from iosim.timing import decode as DM
    p = DecodeProblem(N_kv=16384, d=128, batch=8, heads=32, kv_heads=8, dtype="fp16")
    monkeypatch.setattr(DM, "TC_CONSTANTS_PATH", tmp_path / "absent.json")
    with pytest.raises(ConfigError, match="main='tc': the tensor-core decode kernel's time is "
                                          "not modelled yet"):
        DM.predict_decode(p, num_splits=4, kv_reads="per_group", main="tc")
    k = dict(t_main0=10.0, L_t=0.0, L_q=0.0, c_t=0.0, c_q=0.0, c_cta=0.0, e_tc=0.5)
    pr = DM.predict_decode(p, num_splits=4, kv_reads="per_group", main="tc",
                           constants={"constants": k, "source": "test"})
    lay = geo.tc_plan(128, "fp16", 4)
    assert pr["main"] == "tc" and pr["layout"]["TB"] == lay["NW"] * lay["BC"]
    assert pr["waves"] == -(-(-(-4 * 64 // 132)) // geo.tc_resident_blocks(lay))
    # all time is the fixed term and the K/V stream at e_tc of the HBM bandwidth
    hbm = DM.get_hardware("H100-SXM").hbm_bandwidth
    assert pr["terms_us"]["main_dram"] == pytest.approx(pr["main_hbm_bytes"] / (0.5 * hbm / 1e6))


def test_split_rule_fills_one_wave_for_tc():
    """num_splits="auto" for the tensor-core kernel: at most one wave of the blocks the SMs
    hold (floor), where the flat and tiled kernels keep the ceiling."""
    from iosim import ConfigError
    from iosim.decode import choose_num_splits
    p = DecodeProblem(N_kv=16384, d=128, batch=8, heads=32, kv_heads=8, dtype="fp16")
    assert choose_num_splits(p, 132, 1, kv_reads="per_group", fill="floor").num_splits == 2
    assert choose_num_splits(p, 132, 1, kv_reads="per_group").num_splits == 3      # ceil
    c = geo.ctas_per_sm(p, "per_group", "tc")
    assert geo.auto_num_splits(p, 132, "per_group", "tc").num_splits == max(1, 132 * c // 64)
    big = DecodeProblem(N_kv=16384, d=128, batch=256, heads=32, kv_heads=8, dtype="fp16")
    assert choose_num_splits(big, 132, 1, kv_reads="per_group", fill="floor").num_splits == 1
    with pytest.raises(ConfigError, match="fill='round' is not allowed"):
        choose_num_splits(p, 132, 1, fill="round")
