"""Tuning probe of gpu.decode.flat (the flat decode main kernel) on a GPU: correctness and
exact counts against iosim at sizes the simulator cannot reach, then kernel times against
the tiled kernel (DecodeLauncher(main="tiled")) and torch SDPA in the same run, over lane
layouts (threads, rows a group) and split counts: what gpu.decode's defaults
(iosim.launch.decode: flat_plan, CTAS_PER_SM) are chosen from. Rows (kinds
"decode_probe", "decode_probe_check") to --out. `flashsim bench --decode` times the
defaults themselves.

    python3 benchmarks/decode_flat_probe.py --out decode_probe.jsonl [--quick]
    python3 benchmarks/decode_flat_probe.py --splits     (default layout, one-wave split counts)
    python3 benchmarks/decode_flat_probe.py --tc         (the tensor-core kernel, gpu.decode.tc:
        its layouts and split counts against the flat kernel's defaults and SDPA)
    python3 benchmarks/decode_flat_probe.py --tc --layouts 8x16x3,4x32x3
        (those layouts (warps x block_keys x stages) in pass 2, on TC_DEEP_SHAPES)
    compute-sanitizer --tool racecheck python3 benchmarks/decode_flat_probe.py --tc --sanitize
        (its tiny checks, TC_SANITIZE)
    compute-sanitizer --tool memcheck --report-api-errors no \
        python3 benchmarks/decode_flat_probe.py --sanitize      (tiny cases, no timings)
    NUMBA_ENABLE_CUDASIM=0 python3 benchmarks/decode_flat_probe.py --registers
        (no GPU: ptxas -v on each GPU build's PTX, sm_90; remakes and checks
        iosim.launch.decode.FLAT_REGISTERS)
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def flat_launch(p, S, kv_reads, causal=True, count=False, vec=True, threads=None, kpg=None,
                defer=True):
    """(fn(q, k, v, tab, seqlens, o, L, opart, lpart, ctr, scale), plan, partials)."""
    from gpu.decode import flat as F, split_kv as K
    from gpu._launch import launch, filled
    from numba import cuda
    NG = 1 if kv_reads == "per_query_head" else p.heads // p.kv_heads
    lay = F.plan(p.d, p.dtype, NG * p.N_q, vec_ok=vec, threads=threads, rows_per_group=kpg)
    if lay is None:
        return None, None, None
    ker = F.flat_kernel(p.d, p.dtype, p.N_q, NG, S > 1, p.paged, causal, count, lay["NT"],
                        lay["VW"], lay["LPR"], lay["KPG"], lay["vec"], defer)
    from iosim.launch.decode import combine_plan
    cpl = combine_plan(S, p.N_q, p.d)
    comb = K.combine_kernel(p.d, p.dtype, p.N_q, count, cpl["NT"]) if S > 1 else None
    if S > 1:
        parts = (filled((p.batch, p.heads, S, p.N_q, p.d), np.float32, np.nan),
                 filled((p.batch, p.heads, S, p.N_q), np.float32, np.nan))
    else:
        parts = (cuda.to_device(np.zeros((1,) * 5, np.float32)),
                 cuda.to_device(np.zeros((1,) * 4, np.float32)))
    grid = (S, p.batch * p.heads // NG)
    H, G, P = np.int64(p.heads), np.int64(p.heads // p.kv_heads), np.int64(p.page_size or 1)

    def fn(q, k, v, tab, sl, o, L, opart, lpart, ctr, scale):
        launch(ker, grid, lay["NT"], lay["smem_bytes"], q, k, v, tab, sl, o, L, opart, lpart,
               np.float32(scale), H, G, P, ctr)
        if comb is not None:
            launch(comb, p.batch * p.heads, cpl["NT"], cpl["smem_bytes"], opart, lpart,
                   o, L, np.int64(S), H, ctr)
    return fn, lay, parts


CHECKS = (  # dtype, batch, heads, kv_heads, N_kv, d, N_q, page, S, kv_reads
    ("fp16", 2, 8, 2, 1000, 64, 1, None, 1, "per_group"),
    ("fp16", 2, 8, 2, 1000, 64, 1, None, 7, "per_query_head"),
    ("fp16", 3, 4, 4, 777, 128, 1, 16, 5, "per_query_head"),
    ("fp16", 2, 8, 1, 2049, 128, 2, 256, 3, "per_group"),
    ("fp32", 2, 4, 2, 513, 64, 4, None, 4, "per_group"),
    ("fp32", 1, 4, 4, 300, 128, 1, 7, 2, "per_query_head"),
    ("bf16", 2, 8, 2, 1000, 128, 1, None, 3, "per_group"),
    ("fp16", 1, 2, 2, 5000, 256, 1, None, 2, "per_query_head"),
    ("fp16", 1, 4, 4, 70000, 64, 1, 16, 1, "per_query_head"),
)


def checks(emit, sanitize=False):
    from iosim.decode import (DecodeProblem, decode_closed_form, paged_cache,
                              random_decode_inputs, reference_decode)
    from gpu._launch import READ, WRITE
    from gpu.decode import split_kv as K
    from numba import cuda
    ok = True
    # under the sanitizer: one case of each dtype (fp32 with 8 rows a block, bf16) and of
    # each layout (contiguous, pages of 16), split and not
    cases = [CHECKS[i] for i in (0, 2, 4, 6)] if sanitize else CHECKS
    for dt, B, H, Hk, N, d, nq, page, S, kvr in cases:
        if sanitize:
            N = min(N, 300)
        p = DecodeProblem(N_kv=N, d=d, batch=B, heads=H, kv_heads=Hk, N_q=nq, dtype=dt,
                          page_size=page)
        q, k, v = random_decode_inputs(p, seed=3)
        ref, lse = reference_decode(q.astype(np.float64), k.astype(np.float64),
                                    v.astype(np.float64), return_lse=True)
        if page:
            kh, vh, tab = paged_cache(p, k, v, seed=4)
        else:
            kh, vh, tab = k, v, np.zeros((1, 1), np.int32)
        bits = (lambda x: x.view(np.uint16)) if dt == "bf16" else (lambda x: x)
        name = f"{dt} B{B} H{H}/{Hk} N{N} d{d} nq{nq} page{page} S{S} {kvr}"
        if flat_launch(p, S, kvr)[0] is None:
            # more query rows a block than the flat kernel's registers take (gpu.decode runs
            # the tiled kernel there): nothing of the flat kernel's to check
            emit("decode_probe_check", dict(check=name, status="no_flat_layout"))
            continue
        for count in (True, False):
            fn, lay, (opart, lpart) = flat_launch(p, S, kvr, count=count)
            qd, kd, vd = (cuda.to_device(bits(x)) for x in (q, kh, vh))
            td = cuda.to_device(tab)
            sl = cuda.to_device(np.full(B, N, np.int32))
            o = cuda.to_device(np.zeros(q.shape, np.uint16 if dt == "bf16" else q.dtype))
            L = cuda.to_device(np.zeros(q.shape[:3], np.float32))
            ctr = cuda.to_device(np.zeros((len(K.COUNTED), 2), np.int64))
            fn(qd, kd, vd, td, sl, o, L, opart, lpart, ctr, 1.0 / math.sqrt(d))
            O = o.copy_to_host()
            if dt == "bf16":
                O = O.view(q.dtype)
            O = O.astype(np.float64)
            err = float(np.abs(O - ref).max() / np.abs(ref).max())
            lerr = float(np.abs(L.copy_to_host() - lse).max())
            tol = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}[dt]
            row = dict(check=name, count=count, rel_err=err, lse_err=lerr, tol=tol,
                       kernel_layout={x: lay[x] for x in ("NT", "VW", "LPR", "KPG", "vec")})
            if count:
                led = decode_closed_form("split_kv" if S > 1 else "fa2_decode", p,
                                         num_splits=S, kv_reads=kvr)
                c = ctr.copy_to_host()
                got_r = {t: int(c[i, READ]) for t, i in K.C.items() if c[i, READ]}
                got_w = {t: int(c[i, WRITE]) for t, i in K.C.items() if c[i, WRITE]}
                row["counts_exact"] = got_r == dict(led.reads) and got_w == dict(led.writes)
                ok &= row["counts_exact"]
            row["passed"] = err <= tol and lerr <= 1e-3 and row.get("counts_exact", True)
            ok &= row["passed"]
            emit("decode_probe_check", row)
    return ok


SHAPES = (  # batch, attn, d, N_kv, page
    (8, "gqa", 64, 16384, None), (8, "mha", 64, 16384, None), (8, "mha", 128, 16384, None),
    (8, "gqa", 128, 16384, None), (8, "mqa", 128, 16384, None), (64, "gqa", 128, 16384, None),
    (1, "gqa", 128, 65536, None), (1, "mha", 128, 131072, None), (32, "mha", 128, 4096, None),
    (8, "gqa", 128, 16384, 16), (8, "gqa", 128, 16384, 256), (8, "mha", 64, 16384, 16),
    (1, "gqa", 128, 131072, 256),
)
ATTN = {"mha": (32, 32), "gqa": (32, 8), "mqa": (8, 1)}


def input_sets(torch, B, H, Hk, d, N, page):
    """(copies, [(q, k, v, block_table or None)] * copies): fp16 inputs of one shape on the
    GPU, enough copies that the K/V caches together pass 200 MB (the timings rotate
    through them, so the L2 does not serve a copy read just before); paged caches in a
    random page order."""
    pages = -(-N // page) if page else 0
    cache = 2 * B * Hk * (pages * page if page else N) * d * 2
    copies = max(2, -(-200_000_000 // cache))
    g = torch.Generator(device="cuda").manual_seed(N + B + d)
    sets = []
    for _ in range(copies):
        q = torch.randn((B, H, 1, d), device="cuda", dtype=torch.float16, generator=g)
        shape = (B * pages, page, Hk, d) if page else (B, Hk, N, d)
        tab = (torch.randperm(B * pages, device="cuda", generator=g).to(torch.int32)
               .reshape(B, pages).contiguous() if page else None)
        k = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
        sets.append((q, k, v, tab))
    return copies, sets


def timings(emit, quick, budget_s, splits=False):
    import torch
    import iosim
    from iosim.launch.decode import auto_num_splits
    from numba import cuda
    from gpu.decode import DecodeLauncher
    from analysis.bench_decode import Timer, dram_bytes
    timer = Timer(torch, 20)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.monotonic()
    shapes = SHAPES[:3] if quick else SHAPES
    for B, attn, d, N, page in shapes:
        if time.monotonic() - t0 > budget_s:
            print("budget: timings stopped", flush=True)
            break
        H, Hk = ATTN[attn]
        p = iosim.DecodeProblem(N_kv=N, d=d, batch=B, heads=H, kv_heads=Hk, N_q=1,
                                dtype="fp16", page_size=page)
        dbytes = dram_bytes(B, H, Hk, 1, N, d, 2, page)
        copies, sets = input_sets(torch, B, H, Hk, d, N, page)
        # the flat launcher takes a block table always: a 1 x 1 dummy when contiguous
        dummy = torch.zeros((1, 1), device="cuda", dtype=torch.int32)
        sets = [(q, k, v, dummy if tab is None else tab) for q, k, v, tab in sets]
        dev = [tuple(cuda.as_cuda_array(x, sync=False) for x in s) for s in sets]
        sl = cuda.as_cuda_array(torch.full((B,), N, device="cuda", dtype=torch.int32))
        o = torch.empty((B, H, 1, d), device="cuda", dtype=torch.float16)
        L = torch.empty((B, H, 1), device="cuda", dtype=torch.float32)
        od, Ld = cuda.as_cuda_array(o), cuda.as_cuda_array(L)
        scale = 1 / math.sqrt(d)
        base = dict(batch=B, attn=attn, heads=H, kv_heads=Hk, d=d, seq_len_kv=N, paged=page,
                    dtype="fp16", seq_len_q=1, dram_bytes=dbytes, kv_copies=copies)
        ref = None
        if not page:
            F_ = torch.nn.functional

            def sdpa(i):
                q, k, v, _ = sets[i]
                return F_.scaled_dot_product_attention(q, k, v, scale=scale,
                                                       enable_gqa=H != Hk)
            ms, mn = timer(sdpa, copies)
            ref = sdpa(0).float()
            emit("decode_probe", dict(base, impl="torch_sdpa", ms_median=ms, ms_min=mn,
                                      gbps=dbytes / ms / 1e6))
        for kvr in ("per_group", "per_query_head") if H != Hk else ("per_query_head",):
            rule = auto_num_splits(p, sms, kvr, "tiled")
            # the tiled kernel (the kernel before the flat one; not in --splits)
            if not splits:
                try:
                    run = DecodeLauncher(p, rule.num_splits, kv_reads=kvr, main="tiled")
                    opart, lpart = run.partials()
                    ctr = run.new_counters()

                    def tiled(i):
                        qd, kd, vd, td = dev[i]
                        run(qd, kd, vd, td if page else None, od, Ld, opart, lpart, ctr, scale)
                    ms, mn = timer(tiled, copies)
                    emit("decode_probe", dict(base, impl="flashsim_tiled", kv_reads=kvr,
                                              num_splits=rule.num_splits, ms_median=ms,
                                              ms_min=mn, gbps=dbytes / ms / 1e6))
                except Exception as e:
                    emit("decode_probe", dict(base, impl="flashsim_tiled", kv_reads=kvr,
                                              status="error", error=repr(e)[:300]))
            R = B * (H if kvr == "per_query_head" else Hk)
            flat_rule = auto_num_splits(p, sms, kvr, "flat").num_splits
            if splits:
                # the split rule's question: blocks filling the SMs' c block slots in one
                # wave (floor) against just past it (ceil, the rule: a partial second wave)
                Ss = sorted({1, flat_rule} | {max(1, min(N // 256, S))
                                              for c in (1, 2, 3, 4)
                                              for S in (sms * c // R, -(-sms * c // R))})
            else:
                Ss = sorted({rule.num_splits, flat_rule, 1}
                            | {max(1, min(N // 256, -(-sms * w // R))) for w in (2, 4, 8, 16)})
            # (NT, KPG, defer): the default layout with fp16 rows widened at use (defer)
            # and as loaded, then the other layouts
            variants = [(128, None, True)] if splits else [(128, None, True), (128, None, False)] + (
                [] if quick else [(NT, kpg, True) for NT in (128, 256) for kpg in (None, 2, 4, 8)
                                  if (NT, kpg) != (128, None)])
            for NT, kpg, defer in variants:
                for S in Ss:
                    try:
                        fn, lay, (opart, lpart) = flat_launch(p, S, kvr, threads=NT,
                                                              kpg=kpg, defer=defer)
                        if fn is None:
                            continue
                        ctr = cuda.to_device(np.zeros((1, 1), np.int64))

                        def flat(i):
                            qd, kd, vd, td = dev[i]
                            fn(qd, kd, vd, td, sl, od, Ld, opart, lpart, ctr, scale)
                        ms, mn = timer(flat, copies)
                        flat(0)
                        torch.cuda.synchronize()
                        diff = (float((o.float() - ref).abs().max()) if ref is not None
                                else None)
                        emit("decode_probe", dict(
                            base, impl="flashsim_flat" if defer else "flashsim_flat_atload",
                            kv_reads=kvr, num_splits=S,
                            rule_num_splits=rule.num_splits, flat_rule_num_splits=flat_rule,
                            ms_median=ms, ms_min=mn,
                            gbps=dbytes / ms / 1e6, max_abs_diff_vs_sdpa=diff,
                            kernel_layout={x: lay[x] for x in
                                           ("NT", "VW", "LPR", "KPG", "TB", "vec")}))
                    except Exception as e:
                        emit("decode_probe", dict(base, impl="flashsim_flat" if defer
                                                  else "flashsim_flat_atload",
                                                  kv_reads=kvr, num_splits=S,
                                                  threads=NT, kpg=kpg, status="error",
                                                  error=repr(e)[:300]))
        sets.clear()
        torch.cuda.empty_cache()


#: the tensor-core kernel's layouts timed by --tc's pass 2 (warps, block_keys, stages), beside
#: the default (iosim.launch.decode.TC_DEFAULT) in pass 1
TC_LAYOUTS = ((4, 16, 3), (4, 16, 2), (2, 16, 4), (8, 16, 2), (4, 32, 2), (1, 16, 4),
              (2, 32, 3), (4, 16, 4))
#: --tc's shapes, grouped heads first (the flat kernel's gap); then MHA and paged
TC_SHAPES = (
    (8, "gqa", 128, 16384, None), (8, "mqa", 128, 16384, None), (8, "gqa", 64, 16384, None),
    (64, "gqa", 128, 16384, None), (1, "gqa", 128, 65536, None), (8, "gqa", 128, 16384, 16),
    (8, "gqa", 128, 16384, 256), (8, "mha", 128, 16384, None), (8, "mqa", 64, 16384, None),
    (1, "mha", 128, 131072, None), (1, "gqa", 128, 131072, 256), (32, "mqa", 128, 16384, None),
)
#: pass 2's shapes with --layouts: the grouped ones, MHA at batch 8 and MQA at d = 64
TC_DEEP_SHAPES = TC_SHAPES[:5] + (TC_SHAPES[7], TC_SHAPES[8])


TC_SANITIZE = (  # dtype, batch, heads, kv_heads, N_kv, d, N_q, page, S: tiny, one of each path
    ("fp16", 2, 8, 2, 300, 128, 1, None, 3), ("fp16", 2, 8, 2, 300, 64, 1, 16, 1),
    ("bf16", 1, 16, 2, 200, 64, 2, None, 2), ("fp16", 1, 8, 1, 100, 128, 1, 256, 2),
    ("fp16", 1, 8, 1, 400, 64, 1, None, 9))     # S = 9: a 4-warp combine (combine_warps)


def tc_checks(emit) -> bool:
    """The tensor-core kernel at TC_SANITIZE's tiny cases (what --tc --sanitize runs under
    compute-sanitizer): outputs against float64, counts against the closed form."""
    import gpu
    from iosim.decode import (DecodeProblem, decode_closed_form, paged_cache,
                              random_decode_inputs, reference_decode)
    ok = True
    for dt, B, H, Hk, N, d, nq, page, S in TC_SANITIZE:
        p = DecodeProblem(N_kv=N, d=d, batch=B, heads=H, kv_heads=Hk, N_q=nq, dtype=dt,
                          page_size=page)
        q, k, v = random_decode_inputs(p, seed=3)
        kw = dict(num_splits=S, kv_reads="per_group", main="tc", count_traffic=True,
                  cache_seqlens=N)
        if page:
            kh, vh, tab = paged_cache(p, k, v, seed=4)
            O, led = gpu.decode(q, kh, vh, block_table=tab, **kw)
        else:
            O, led = gpu.decode(q, k, v, **kw)
        ref = reference_decode(q, k, v)
        O = np.asarray(O, np.float32).astype(np.float64)
        err = float(np.abs(O - ref).max() / np.abs(ref).max())
        cf = decode_closed_form("split_kv" if S > 1 else "fa2_decode", p, num_splits=S,
                                kv_reads="per_group")
        row = dict(check=f"tc {dt} B{B} H{H}/{Hk} N{N} d{d} nq{nq} page{page} S{S}",
                   rel_err=err, tol={"fp16": 2e-3, "bf16": 1.6e-2}[dt],
                   counts_exact=led.counts() == cf.counts())
        row["passed"] = err <= row["tol"] and row["counts_exact"]
        ok &= row["passed"]
        emit("decode_probe_check", row)
    return ok


def tc_timings(emit, budget_s, layouts=None):
    """The tensor-core kernel (gpu.decode.tc) beside torch SDPA and the flat kernel at
    gpu.decode's defaults, same run, inputs rotated: pass 1, every TC_SHAPES shape at the
    default layout and split counts around one wave of its resident blocks and the rule's;
    pass 2, TC_LAYOUTS on the grouped shapes (or `layouts` on TC_DEEP_SHAPES), as the
    budget allows."""
    import torch
    import iosim
    from iosim.launch import decode as geo
    from numba import cuda
    from gpu.decode import DecodeLauncher
    from analysis.bench_decode import Timer, dram_bytes
    timer = Timer(torch, 20)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.monotonic()
    F_ = torch.nn.functional
    default = (geo.TC_DEFAULT["warps"], geo.TC_DEFAULT["block_keys"], geo.TC_DEFAULT["stages"])
    passes = [(TC_SHAPES, (default,), True),
              (TC_DEEP_SHAPES, tuple(layouts), False) if layouts else
              (TC_SHAPES[:5], tuple(x for x in TC_LAYOUTS if x != default), False)]
    for shapes, layouts, peers in passes:
        for B, attn, d, N, page in shapes:
            if time.monotonic() - t0 > budget_s:
                print("budget: tc timings stopped", flush=True)
                return
            H, Hk = ATTN[attn]
            p = iosim.DecodeProblem(N_kv=N, d=d, batch=B, heads=H, kv_heads=Hk, N_q=1,
                                    dtype="fp16", page_size=page)
            dbytes = dram_bytes(B, H, Hk, 1, N, d, 2, page)
            copies, sets = input_sets(torch, B, H, Hk, d, N, page)
            o = torch.empty((B, H, 1, d), device="cuda", dtype=torch.float16)
            L = torch.empty((B, H, 1), device="cuda", dtype=torch.float32)
            od, Ld = cuda.as_cuda_array(o), cuda.as_cuda_array(L)
            dev = [tuple(None if x is None else cuda.as_cuda_array(x, sync=False) for x in s)
                   for s in sets]
            scale = 1 / math.sqrt(d)
            base = dict(batch=B, attn=attn, heads=H, kv_heads=Hk, d=d, seq_len_kv=N,
                        paged=page, dtype="fp16", seq_len_q=1, dram_bytes=dbytes,
                        kv_copies=copies, probe="tc")
            ref = None
            if page is None:
                def sdpa(i):
                    q, k, v, _ = sets[i]
                    return F_.scaled_dot_product_attention(q, k, v, scale=scale,
                                                           enable_gqa=H != Hk)
                ref = sdpa(0).float()
                if peers:
                    ms, mn = timer(sdpa, copies)
                    emit("decode_probe", dict(base, impl="torch_sdpa", ms_median=ms,
                                              ms_min=mn, gbps=dbytes / ms / 1e6))

            def time_run(run, impl, extra):
                opart, lpart = run.partials()
                ctr = run.new_counters()

                def call(i):
                    qd, kd, vd, td = dev[i]
                    run(qd, kd, vd, td, od, Ld, opart, lpart, ctr, scale)
                ms, mn = timer(call, copies)
                call(0)
                torch.cuda.synchronize()
                diff = float((o.float() - ref).abs().max()) if ref is not None else None
                emit("decode_probe", dict(base, impl=impl, ms_median=ms, ms_min=mn,
                                          gbps=dbytes / ms / 1e6, max_abs_diff_vs_sdpa=diff,
                                          **extra))
            kvr = "per_group" if H != Hk else "per_query_head"
            if peers:   # the flat kernel as gpu.decode runs it by default
                S = geo.auto_num_splits(p, sms, kvr, "flat").num_splits
                try:
                    time_run(DecodeLauncher(p, S, kv_reads=kvr, main="flat"), "flashsim_flat",
                             dict(kv_reads=kvr, num_splits=S))
                except Exception as e:
                    emit("decode_probe", dict(base, impl="flashsim_flat", status="error",
                                              error=repr(e)[:300]))
            R = p.readers(kvr)
            rule = geo.auto_num_splits(p, sms, kvr, "tc").num_splits
            for NW, BC, STG in layouts:
                lay = geo.tc_plan(d, "fp16", geo.block_rows(p, kvr), warps=NW, block_keys=BC,
                                  stages=STG)
                c = geo.tc_resident_blocks(lay, bool(page))
                Ss = sorted({max(1, min(N // 256, S)) for S in
                             (sms * c // R, -(-sms * c // R), 2 * -(-sms * c // R), rule)})
                for S in Ss:
                    try:
                        run = DecodeLauncher(p, S, kv_reads=kvr, main="tc",
                                             tc_layout=dict(warps=NW, block_keys=BC,
                                                            stages=STG))
                        time_run(run, "flashsim_tc", dict(
                            kv_reads=kvr, num_splits=S, resident_blocks=c,
                            rule_num_splits=rule,
                            kernel_layout=dict(NW=NW, BC=BC, STG=STG,
                                               smem_bytes=lay["smem_bytes"])))
                    except Exception as e:
                        emit("decode_probe", dict(base, impl="flashsim_tc", num_splits=S,
                                                  kernel_layout=dict(NW=NW, BC=BC, STG=STG),
                                                  status="error", error=repr(e)[:300]))
            sets.clear()
            torch.cuda.empty_cache()


def registers() -> int:
    """ptxas -v registers of the flat kernel's GPU builds (uncounted, split, causal, N_q = 1,
    NG = NR query heads a block, d = 64 and 128), sm_90, against FLAT_REGISTERS; no GPU
    needed (NUMBA_ENABLE_CUDASIM=0, ptxas on the PATH). 0 when they all agree."""
    from numba import cuda, types
    from iosim.launch.decode import FLAT_REGISTERS, flat_plan
    from gpu._tc import ptxas_registers
    from gpu.decode import flat as F
    T = {"fp16": types.float16, "bf16": types.uint16, "fp32": types.float32}
    A = types.Array
    ok = True
    for (dt, NR, paged), want in sorted(FLAT_REGISTERS.items()):
        for d in (64, 128):
            lay = flat_plan(d, dt, NR)
            ker = F.flat_kernel(d, dt, 1, NR, True, paged, True, False, lay["NT"], lay["VW"],
                                lay["LPR"], lay["KPG"], lay["vec"])
            a4 = A(T[dt], 4, "C")
            sig = (a4, a4, a4, A(types.int32, 2, "C"), A(types.int32, 1, "C"), a4,
                   A(types.float32, 3, "C"), A(types.float32, 5, "C"),
                   A(types.float32, 4, "C"), types.float32, types.int64, types.int64,
                   types.int64, A(types.int64, 2, "C"))
            ptx, _ = cuda.compile_ptx(ker.py_func, sig, cc=(9, 0))
            got, _ = ptxas_registers(ptx)
            ok &= got == want
            print(f"{dt} NR={NR} paged={paged} d={d}: {got} registers (table {want})"
                  + ("" if got == want else "  DIFFERS"), flush=True)
    print("FLAT_REGISTERS", "agrees" if ok else "DIFFERS: update iosim/launch/decode.py")
    return 0 if ok else 1


def _layouts(text: str) -> list[tuple[int, int, int]]:
    """--layouts: WARPSxBLOCK_KEYSxSTAGES[,..] -> [(warps, block_keys, stages), ..]."""
    try:
        out = [tuple(int(x) for x in item.split("x")) for item in text.split(",")]
    except ValueError:
        out = [()]
    if any(len(x) != 3 for x in out):
        raise argparse.ArgumentTypeError(f"--layouts={text!r} is not allowed; allowed: "
                                         f"WARPSxBLOCK_KEYSxSTAGES[,..], e.g. 8x16x3,4x32x3")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="decode_probe.jsonl")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--registers", action="store_true",
                    help="no GPU: ptxas registers of the GPU builds against FLAT_REGISTERS")
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--tc", action="store_true",
                    help="the tensor-core kernel: layouts and split counts, beside the flat "
                         "kernel's defaults and SDPA (no checks: the gpu tests check it)")
    ap.add_argument("--layouts", type=_layouts, default=None,
                    help="with --tc: pass 2's layouts, WARPSxBLOCK_KEYSxSTAGES[,..] (e.g. "
                         "8x16x3,4x32x3), on TC_DEEP_SHAPES")
    ap.add_argument("--splits", action="store_true",
                    help="timings of the default layout only, at the split counts that fill "
                         "the SMs' block slots in one wave and just past it, every shape")
    a = ap.parse_args()
    if a.registers:
        return registers()
    import subprocess
    dev = "?"
    try:
        import torch
        dev = torch.cuda.get_device_name()
    except Exception:
        pass
    commit = os.environ.get("FLASHSIM_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    from analysis.bench import versions
    base = dict(device=dev, versions=versions(), date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                commit=commit, run_id="decode_probe-" + time.strftime("%Y%m%dT%H%M%S"))
    f = open(a.out, "a")

    def emit(kind, row):
        r = dict(kind=kind, **base, **row)
        f.write(json.dumps(r) + "\n")
        f.flush()
        short = {k: v for k, v in row.items() if k not in ("kernel_layout",)}
        print(kind, short, flush=True)
    if a.tc:
        if a.sanitize:
            ok = tc_checks(emit)
            print("tc checks", "passed" if ok else "FAILED", flush=True)
            return 0 if ok else 1
        tc_timings(emit, a.budget_s, a.layouts)
        return 0
    ok = checks(emit, sanitize=a.sanitize)
    print("checks", "passed" if ok else "FAILED", flush=True)
    if not a.sanitize:
        timings(emit, a.quick, a.budget_s, splits=a.splits)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
