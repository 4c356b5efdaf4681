"""The fp16 tensor-core backward on a GPU: correctness, exact counts, tilings, timings.

One call on the lent GPU (torch needed):
    python3 scripts/bwd_tc_probe.py --out DIR [--quick]
writes DIR/bwd_tc_probe.jsonl, one JSON object per line as each is measured:
  * kind "check": gradients of `attention_backward(kernel='tc')` against the float64
    reference (rel. Frobenius error per gradient), beside the plain kernel's, PyTorch's
    fp16 SDPA backward's (default backend) and the fp16 storage model's
    (tests/test_gpu_backward.fp16_model); every gradient poisoned with NaN first (finite =
    all written); counts equal iosim.backward_closed_form ('exact').
  * kind "time": the main kernel alone (CUDA events around launches on preallocated
    arrays, inputs rotated over enough sets to exceed the L2) per tiling, then forward +
    backward through autograd for flashsim and torch SDPA MATH / EFFICIENT / FLASH in the
    same run, same inputs (median of repeated runs after warm-up).
Rows for the results data set are made from this file by the lead (kind `bench`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for bwd_tc_probe.jsonl")
    ap.add_argument("--quick", action="store_true", help="fewer tilings and sizes")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    args = ap.parse_args(argv)
    import torch
    import iosim
    from gpu.api import attention
    from gpu.backward import attention_backward, fa2_tc
    from test_gpu_backward import fp16_model, rel_err

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bwd_tc_probe.jsonl")
    dev = torch.cuda.get_device_name()

    def emit(row):
        row = dict(device=dev, **row)
        print(json.dumps(row), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    T = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()

    # ---------------- correctness and counts ----------------
    checks = [
        dict(B=1, H=2, Hk=2, N=128, d=64, causal=False, t=(64, 64)),
        dict(B=1, H=2, Hk=2, N=128, d=64, causal=True, t=(64, 64)),
        dict(B=2, H=4, Hk=2, N=200, d=64, causal=True, t=(64, 64)),
        dict(B=1, H=2, Hk=1, N=333, d=64, causal=False, t=(64, 64)),
        dict(B=1, H=2, Hk=2, N=256, d=64, causal=False, t=(64, 64), kreg=False),
        dict(B=1, H=2, Hk=2, N=256, d=64, causal=True, t=(128, 64)),
        dict(B=1, H=2, Hk=2, N=256, d=64, causal=True, t=(64, 128)),
        dict(B=1, H=2, Hk=2, N=256, d=64, causal=False, t=(128, 128)),
        dict(B=1, H=2, Hk=2, N=256, d=64, causal=True, t=(64, 128), MT=2),
        dict(B=1, H=2, Hk=2, N=200, d=128, causal=False, t=(64, 64)),
        dict(B=1, H=2, Hk=1, N=200, d=128, causal=True, t=(32, 64)),
        dict(B=1, H=2, Hk=2, N=200, d=128, causal=True, t=(64, 32)),
        dict(B=1, H=2, Hk=2, N=100, d=32, causal=True, t=(32, 32)),
        dict(B=1, H=2, Hk=2, N=96, d=16, causal=False, t=(16, 32)),
        dict(B=1, H=2, Hk=2, N=256, d=64, causal=False, t=(64, 64), mask="row"),
        dict(B=1, H=2, Hk=2, N=256, d=64, causal=True, t=(64, 64), huge=True),
        dict(B=1, H=4, Hk=4, N=1024, d=64, causal=True, t=(64, 64)),
        dict(B=1, H=4, Hk=4, N=1024, d=128, causal=False, t=(64, 64)),
    ]
    if args.quick:
        checks = checks[:4]
    for c in ([] if args.skip_check else checks):
        t0 = time.time()
        B, H, Hk, N, d, causal = c["B"], c["H"], c["Hk"], c["N"], c["d"], c["causal"]
        br, bc = c["t"]
        T_r, T_c = -(-N // br), -(-N // bc)
        mask = None
        if c.get("mask") == "row":       # query block 1 sees nothing; others random
            rng = np.random.default_rng(3)
            mask = rng.random((T_r, T_c)) < 0.6
            mask[:, 0] = True
            mask[1, :] = False
        try:
            p = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype="fp16",
                              causal=causal, block_mask=mask)
            q, k, v = iosim.random_inputs(p, 0)
            if c.get("huge"):
                q = (q.astype(np.float32) * 30).astype(np.float16)
            do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
            tq, tk, tv, tdo = T(q), T(k), T(v), T(do)
            tiles = dict(block_rows=br, block_cols=bc)
            o, L = attention(tq, tk, tv, algorithm="fa2", causal=causal, return_stats=True,
                             block_mask=mask, **tiles)
            kw = dict(causal=causal, block_mask=mask, **tiles)
            (dq, dk, dv), led = attention_backward(tq, tk, tv, o, tdo, L, kernel="tc",
                                                   count_traffic=True, **kw,
                                                   **({"tc_options": dict(MT=c["MT"], kreg=c.get("kreg"))}
                                                      if ("MT" in c or "kreg" in c) else {}))
            tcg = [x.cpu().numpy() for x in (dq, dk, dv)]
            plain = [x.cpu().numpy() for x in
                     attention_backward(tq, tk, tv, o, tdo, L, kernel="plain", **kw)]
            ref = iosim.reference_attention_backward(q, k, v, do, causal=causal,
                                                     block_mask=mask, B_r=br, B_c=bc)
            exact = led.counts() == iosim.backward_closed_form(
                "fa2", p, iosim.Tiling(br, bc)).counts()
            on = o.cpu().numpy()
            model = fp16_model("fa2", q, k, v, on, do, causal) if mask is None else None
            terr = None
            if mask is None:
                qq, kk, vv = (x.clone().requires_grad_(True) for x in (tq, tk, tv))
                kk2 = kk.repeat_interleave(H // Hk, dim=1) if Hk != H else kk
                vv2 = vv.repeat_interleave(H // Hk, dim=1) if Hk != H else vv
                if causal:
                    out = torch.nn.functional.scaled_dot_product_attention(qq, kk2, vv2,
                                                                           is_causal=True)
                else:
                    out = torch.nn.functional.scaled_dot_product_attention(qq, kk2, vv2)
                out.backward(tdo)
                terr = [rel_err(x.grad.float().cpu().numpy(), r)
                        for x, r in zip((qq, kk, vv), ref)]
            row = dict(kind="check", **{k_: (list(v_) if isinstance(v_, tuple) else v_)
                                       for k_, v_ in c.items()},
                       exact=bool(exact), finite=bool(all(np.isfinite(x).all() for x in tcg)),
                       err_tc=[rel_err(x, r) for x, r in zip(tcg, ref)],
                       err_plain=[rel_err(x, r) for x, r in zip(plain, ref)],
                       err_torch=terr,
                       err_model=None if model is None else
                       [rel_err(x, r) for x, r in zip(model, ref)],
                       s=round(time.time() - t0, 2))
            if not exact:
                row["counts_tc"] = {str(k_): v_ for k_, v_ in led.counts().items()}
            emit(row)
        except Exception as e:   # record the failing point and go on
            emit(dict(kind="check", **{k_: (list(v_) if isinstance(v_, tuple) else v_)
                                       for k_, v_ in c.items()}, error=repr(e)[:800]))

    if args.skip_time:
        return
    # ---------------- timings ----------------
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from gpu.autograd import flash_attention

    def timed(fn, sets, reps=20, warm=3):
        for i in range(warm):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        ts = []
        for i in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s = sets[i % len(sets)]
            a.record()
            fn(*s)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return float(np.median(ts))

    shapes = [dict(B=1, H=16, N=4096, d=64, causal=False),
              dict(B=1, H=16, N=4096, d=64, causal=True),
              dict(B=1, H=16, N=4096, d=128, causal=False)]
    # (B_r, B_c, MT, kreg, DN)
    tilings = {64: [(64, 128, 1, False, None), (64, 128, 1, False, 32), (64, 64, 1, False, 32),
                    (128, 128, 1, False, 32)],
               128: [(32, 64, 1, False, None), (32, 128, 1, False, None), (16, 64, 1, False, None),
                     (64, 128, 1, False, 32)]}
    if args.quick:
        tilings = {64: tilings[64][:2], 128: tilings[128][:1]}
    for sh in shapes:
        B, H, N, d, causal = sh["B"], sh["H"], sh["N"], sh["d"], sh["causal"]
        I = B * H
        set_bytes = 4 * I * N * d * 2 + 2 * I * N * 4
        n_sets = max(2, -(-200_000_000 // set_bytes))
        gen = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda: torch.randn((B, H, N, d), device="cuda", dtype=torch.float16,
                                 generator=gen)
        sets = []
        for _ in range(n_sets):
            q, k, v, do = mk(), mk(), mk(), mk()
            o, L = attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True)
            sets.append((q, k, v, do, o, L))
        flops_bwd = 2.5 * 4 * N * N * d * I * (0.5 if causal else 1.0)
        for (br, bc, MT, kreg, DN) in tilings[d]:
            name = dict(B_r=br, B_c=bc, MT=MT, kreg=kreg, DN=DN)
            try:
                if not fa2_tc.supports(br, bc, d, "fp16", MT=MT):
                    emit(dict(kind="time", what="bwd_main", **sh, **name, error="unsupported"))
                    continue
                acc = torch.zeros((I, N, d), device="cuda", dtype=torch.float32)
                dk = torch.empty((I, N, d), device="cuda", dtype=torch.float16)
                dv = torch.empty_like(dk)
                Dst = torch.zeros((I, N), device="cuda", dtype=torch.float32)
                from gpu._launch import new_counters
                cnt = new_counters(False)

                def main_only(q, k, v, do, o, L):
                    fa2_tc.run(q.view(I, N, d), k.view(I, N, d), v.view(I, N, d),
                               do.view(I, N, d), L.view(I, N), Dst, acc, dk, dv,
                               1 / np.sqrt(d), N, H, 1, None, cnt, B_r=br, B_c=bc,
                               causal=causal, count=False, MT=MT, kreg=kreg, DN=DN)
                ms = timed(main_only, sets)
                emit(dict(kind="time", what="bwd_main", **sh, **name, ms=ms,
                          tflops=flops_bwd / ms / 1e9))
            except Exception as e:
                emit(dict(kind="time", what="bwd_main", **sh, **name, error=repr(e)[:800]))

        def whole_bwd(q, k, v, do, o, L):
            attention_backward(q, k, v, o, do, L, causal=causal, kernel="tc")
        try:
            emit(dict(kind="time", what="bwd_call", **sh, ms=timed(whole_bwd, sets)))
        except Exception as e:
            emit(dict(kind="time", what="bwd_call", **sh, error=repr(e)[:800]))

        def fwdbwd_flashsim(q, k, v, do, o, L):
            qq, kk, vv = (x.requires_grad_(True) for x in (q, k, v))
            flash_attention(qq, kk, vv, causal=causal).backward(do)
            for x in (q, k, v):
                x.grad = None
                x.requires_grad_(False)

        def fwdbwd_torch(backend):
            def f(q, k, v, do, o, L):
                qq, kk, vv = (x.requires_grad_(True) for x in (q, k, v))
                with sdpa_kernel(backend):
                    torch.nn.functional.scaled_dot_product_attention(
                        qq, kk, vv, is_causal=causal).backward(do)
                for x in (q, k, v):
                    x.grad = None
                    x.requires_grad_(False)
            return f
        impls = [("flashsim_fa2", fwdbwd_flashsim)] + [
            (n, fwdbwd_torch(b)) for n, b in (("torch_math", SDPBackend.MATH),
                                              ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION),
                                              ("torch_flash", SDPBackend.FLASH_ATTENTION))]
        for n, f in impls:
            try:
                emit(dict(kind="time", what="fwd+bwd", impl=n, **sh, ms=timed(f, sets, reps=10)))
            except Exception as e:
                emit(dict(kind="time", what="fwd+bwd", impl=n, **sh, error=repr(e)[:800]))
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
