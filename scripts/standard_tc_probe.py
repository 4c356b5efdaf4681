"""Standard attention on the tensor cores (gpu.forward.standard_tc, gpu.backward.standard_tc)
on a GPU: correctness, exact counts, timings next to torch MATH and flashsim's fa2.

One call on the lent H100 (torch needed; about 3-4 minutes, most of it compiling):
    python3 scripts/standard_tc_probe.py --out DIR [--skip-check] [--skip-time]
        [--more-checks] [--no-sweep] [--reps N] [--budget SECONDS]
writes DIR/standard_tc_probe.jsonl, one JSON object per line as each is measured (a
failing point is recorded with its error and the script goes on):
  * kind "check": fp16 at small sizes (the default tiling; causal, GQA, ragged N with
    N % 8 == 0 and not (d = 128); a block mask with a query block that sees nothing;
    --more-checks: causal with N % 8 != 0 at d = 32, the smallest tiles at d = 16): the
    instrumented tensor-core kernels' counts against iosim.closed_form /
    backward_closed_form ('exact_fwd', 'exact_bwd'); outputs poisoned with NaN first
    ('finite': every element written); rel. Frobenius error of O and of dq, dk, dv against
    the float64 reference (iosim.reference_attention, reference_attention_backward), beside
    the plain standard kernels' (gpu.backward.standard.standard_forward,
    attention_backward(algorithm='standard')) on the same inputs and the same P; P against
    the plain forward's P (max abs difference; NaN exactly where the plain P has NaN).
  * kind "time": batch x heads = 16, N = 4096, d = 64 (and causal, and d = 128), fp16:
    each kernel alone ('kernel': S, softmax, PV; dV, dP, dS, dQ, dK), the whole standard
    forward (three kernels) and backward (five), forward + backward, torch SDPA MATH
    forward and forward + backward, flashsim's fa2 tensor-core forward kernel alone and
    gpu.attention(kernel='tc') called on torch tensors. CUDA events, warm-up, median of
    `--reps` (>= 10) runs, preallocated arrays. 'ms' is the device time of the work alone
    (a torch.cuda._sleep ahead of the first event keeps host launch gaps out); 'ms_wall'
    (whole passes and calls) is the same without the sleep, host gaps included.
  * kind "time", what "accuracy_vs_torch_fp32": the timed outputs (O, dq, dk, dv at
    N = 4096) against torch's float32 MATH forward / backward, beside torch's fp16 MATH.
  * kind "sweep": the forward's and backward's kernels at other tilings (SWEEP: d = 64
    and 128, non-causal), while `--budget` lasts.
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

CHECKS = [
    dict(B=1, H=2, Hk=2, N=256, d=64, causal=False, t=(128, 64)),     # default tiling
    dict(B=2, H=4, Hk=2, N=200, d=64, causal=True, t=(128, 64)),      # GQA, ragged, vec
    dict(B=1, H=2, Hk=1, N=333, d=128, causal=False, t=(128, 64)),    # N % 8 != 0
    dict(B=1, H=2, Hk=2, N=256, d=64, causal=False, t=(64, 64), mask="row"),
]
#: with --more-checks (each check compiles about 16 kernels: ~25 s)
MORE_CHECKS = [
    dict(B=1, H=2, Hk=2, N=100, d=32, causal=True, t=(32, 32)),       # causal, N % 8 != 0
    dict(B=1, H=2, Hk=2, N=96, d=16, causal=False, t=(16, 32)),       # smallest tiles
]
SHAPES = [dict(B=1, H=16, N=4096, d=64, causal=False),
          dict(B=1, H=16, N=4096, d=64, causal=True),
          dict(B=1, H=16, N=4096, d=128, causal=False)]
#: (d, B_r, B_c) of the tiling sweep (non-causal, N = 4096, 16 heads), in this order
SWEEP = [(64, 64, 64), (128, 64, 64), (64, 128, 128), (64, 64, 128), (128, 64, 128),
         (64, 32, 64)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for standard_tc_probe.jsonl")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--more-checks", action="store_true", help="two more check sizes")
    ap.add_argument("--no-sweep", action="store_true", help="no tiling sweep")
    ap.add_argument("--reps", type=int, default=15, help="timed runs per point (>= 10)")
    ap.add_argument("--budget", type=float, default=225.0,
                    help="seconds after which optional parts (the sweep) are skipped")
    args = ap.parse_args(argv)
    t_start = time.time()
    import torch
    from numba import cuda

    import iosim
    from gpu._launch import dummy_mask, launch, new_counters
    from gpu.backward import attention_backward
    from gpu.backward import standard_tc as bwd
    from gpu.backward.standard import standard_forward
    from gpu.forward import standard_tc as fwd

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "standard_tc_probe.jsonl")
    dev = torch.cuda.get_device_name()

    def emit(row):
        row = dict(device=dev, elapsed_s=round(time.time() - t_start, 1), **row)
        print(json.dumps(row), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def rel(x, ref):
        x = np.asarray(x, np.float64)
        return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))

    # ---------------- correctness and counts ----------------
    for c in ([] if args.skip_check else CHECKS + (MORE_CHECKS if args.more_checks else [])):
        t0 = time.time()
        desc = {k: (list(v) if isinstance(v, tuple) else v) for k, v in c.items()}
        try:
            B, H, Hk, N, d, causal = c["B"], c["H"], c["Hk"], c["N"], c["d"], c["causal"]
            B_r, B_c = c["t"]
            bm = None
            if c.get("mask") == "row":
                rng = np.random.default_rng(3)
                bm = rng.random((-(-N // B_r), -(-N // B_c))) < 0.6
                bm[:, 0] = True
                bm[1, :] = False
            p = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype="fp16",
                              causal=causal, block_mask=bm)
            tiling = iosim.Tiling(B_r, B_c)
            q, k, v = iosim.random_inputs(p, 0)
            do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float16)
            tk = dict(causal=causal, block_rows=B_r, block_cols=B_c, block_mask=bm)
            O, P, led = fwd.forward_arrays(q, k, v, count_traffic=True, **tk)
            O_pl, P_pl = standard_forward(q, k, v, **tk)
            kw = dict(causal=causal, block_mask=bm, B_r=B_r, B_c=B_c)
            ref = iosim.reference_attention(q, k, v, **kw)
            ok = ~np.isnan(P_pl)
            row = dict(kind="check", **desc,
                       exact_fwd=led.counts() == iosim.closed_form("standard", p,
                                                                   tiling).counts(),
                       finite_fwd=bool(np.isfinite(O).all()),
                       P_nan_same=bool((np.isnan(P) == np.isnan(P_pl)).all()),
                       P_maxdiff=float(np.abs(P[ok].astype(np.float64) - P_pl[ok]).max()),
                       err_O_tc=rel(O, ref), err_O_plain=rel(O_pl, ref))
            (dq, dk, dv), bled = bwd.backward_arrays(q, k, v, do, P, count_traffic=True, **tk)
            plain = attention_backward(q, k, v, O, do, P, algorithm="standard", **tk)
            rg = iosim.reference_attention_backward(q, k, v, do, **kw)
            row.update(exact_bwd=bled.counts() == iosim.backward_closed_form(
                           "standard", p, tiling).counts(),
                       finite_bwd=bool(all(np.isfinite(g).all() for g in (dq, dk, dv))),
                       err_grads_tc=[rel(g, r) for g, r in zip((dq, dk, dv), rg)],
                       err_grads_plain=[rel(g, r) for g, r in zip(plain, rg)],
                       s=round(time.time() - t0, 2))
            if not row["exact_fwd"]:
                row["counts_fwd"] = {str(a): b for a, b in led.counts().items()}
            if not row["exact_bwd"]:
                row["counts_bwd"] = {str(a): b for a, b in bled.counts().items()}
            emit(row)
        except Exception as e:   # record the failing point and go on
            emit(dict(kind="check", **desc, error=repr(e)[:800]))

    if args.skip_time:
        return
    # ---------------- timings ----------------
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import gpu
    from gpu.api import fa2_tc_default, fa2_tc_mt
    from gpu.forward import fa2_tc

    reps = max(10, args.reps)
    sleeper = getattr(torch.cuda, "_sleep", None)

    def timed(fn, sleep=True, warm=2):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if sleep and sleeper is not None:
                sleeper(3_000_000)           # ~1.5 ms busy: the launches queue meanwhile
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return float(np.median(ts))

    cnt = new_counters(False)

    def kernels_of(B_r, B_c, d, causal, N, H, views):
        """{name: launch closure} of the eight kernels on the preallocated views."""
        (q3, k3, v3, o3, s3, p3, do3, dp3, ds3, dq3, dk3, dv3, scale) = views
        problem = iosim.Problem(N=N, d=d, batch=1, heads=H, dtype="fp16", causal=causal)
        active = iosim.active_tiles(problem, iosim.Tiling(B_r, B_c))
        n_act, tiles = fwd.active_list(active)
        inst = q3.shape[0]
        n, h, g = np.int64(N), np.int64(H), np.int64(1)
        mk = dummy_mask()
        vec = N % 8 == 0
        nr, nc = 32 * (B_r // 16), 32 * (B_c // 16)
        ts = fwd.row_threads(N, vec)
        T_r, T_c = -(-N // B_r), -(-N // B_c)
        tb, rb = fwd.tile_layout(B_r, B_c, d)["bytes"], fwd.rowblock_layout(B_r, B_c, d)["bytes"]
        cb = bwd.colblock_layout(B_r, B_c, d)["bytes"]
        sk = fwd.s_kernel(B_r, B_c, d, causal, vec, False)
        sm = fwd.softmax_kernel(B_r, B_c, causal, False, vec, False, ts)
        pv = fwd.pv_kernel(B_r, B_c, d, causal, False, vec, False)
        ks = dict(
            S=lambda: launch(sk, (n_act, inst), nr, tb, q3, k3, s3, tiles, np.float32(scale),
                             n, h, g, cnt),
            softmax=lambda: launch(sm, (N, inst), ts, fwd.row_bytes(N), s3, p3, mk, n, cnt),
            PV=lambda: launch(pv, (T_r, inst), nr, rb, p3, v3, o3, np.float32(1.0), mk, n, h,
                              g, cnt))
        if bwd.plan_error(B_r, B_c, d, "fp16") is None:
            dvk = bwd.dv_kernel(B_r, B_c, d, causal, False, vec, False)
            dpk = bwd.dp_kernel(B_r, B_c, d, vec, False)
            dsk = bwd.ds_kernel(B_r, B_c, causal, False, vec, False, ts)
            dqk = bwd.dq_kernel(B_r, B_c, d, causal, False, vec, False)
            dkk = bwd.dk_kernel(B_r, B_c, d, causal, False, vec, False)
            ks.update(
                dV=lambda: launch(dvk, (T_c, inst), nc, cb, p3, do3, dv3, np.float32(1.0), mk,
                                  n, cnt),
                dP=lambda: launch(dpk, (n_act, inst), nr, tb, do3, v3, dp3, tiles,
                                  np.float32(1.0), n, h, g, cnt),
                dS=lambda: launch(dsk, (N, inst), ts, fwd.row_bytes(N, 2), p3, dp3, ds3, mk,
                                  n, cnt),
                dQ=lambda: launch(dqk, (T_r, inst), nr, rb, ds3, k3, dq3, np.float32(scale),
                                  mk, n, h, g, cnt),
                dK=lambda: launch(dkk, (T_c, inst), nc, cb, ds3, q3, dk3, np.float32(scale),
                                  mk, n, cnt))
        return ks, active

    def views_of(B, H, N, d):
        I = B * H
        gen = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda *s: torch.randn(s, device="cuda", dtype=torch.float16, generator=gen)
        q, k, v, do = (mk(B, H, N, d) for _ in range(4))
        em = lambda *s: torch.full(s, float("nan"), device="cuda", dtype=torch.float16)
        o, dq, dk, dv = (em(B, H, N, d) for _ in range(4))
        s, p, dp, ds = (em(I, N, N) for _ in range(4))
        nb = lambda x, *s: cuda.as_cuda_array(x.view(*s), sync=False)
        views = (nb(q, I, N, d), nb(k, I, N, d), nb(v, I, N, d), nb(o, I, N, d), nb(s, I, N, N),
                 nb(p, I, N, N), nb(do, I, N, d), nb(dp, I, N, N), nb(ds, I, N, N),
                 nb(dq, I, N, d), nb(dk, I, N, d), nb(dv, I, N, d), 1.0 / np.sqrt(d))
        return (q, k, v, do, o, dq, dk, dv), views

    for sh in SHAPES:
        B, H, N, d, causal = sh["B"], sh["H"], sh["N"], sh["d"], sh["causal"]
        frac = 0.5 if causal else 1.0
        flops_fwd = 4.0 * N * N * d * B * H * frac
        try:
            tens, views = views_of(B, H, N, d)
            q, k, v, do = tens[:4]
            tl = fwd.default_tiling(d, causal)
            B_r, B_c = tl["B_r"], tl["B_c"]
            ks, active = kernels_of(B_r, B_c, d, causal, N, H, views)
            base = dict(kind="time", **sh, B_r=B_r, B_c=B_c)
            for name, f in ks.items():
                try:
                    emit(dict(base, what="kernel", kernel=name, ms=timed(f)))
                except Exception as e:
                    emit(dict(base, what="kernel", kernel=name, error=repr(e)[:800]))
            (q3, k3, v3, o3, s3, p3, do3, dp3, ds3, dq3, dk3, dv3, scale) = views
            common = dict(B_r=B_r, B_c=B_c, dt="fp16", causal=causal, count=False)

            def fwd_pass():
                fwd.run(q3, k3, v3, o3, s3, p3, scale, N, H, 1, None, active, cnt, **common)

            def bwd_pass():
                bwd.run(q3, k3, v3, do3, p3, dp3, ds3, dq3, dk3, dv3, scale, N, H, 1, None,
                        active, cnt, **common)

            def fwd_bwd():
                fwd_pass()
                bwd_pass()
            for what, f in (("std_tc_fwd", fwd_pass), ("std_tc_bwd", bwd_pass),
                            ("std_tc_fwd+bwd", fwd_bwd)):
                try:
                    ms = timed(f)
                    row = dict(base, what=what, ms=ms, ms_wall=timed(f, sleep=False))
                    if what == "std_tc_fwd":
                        row["tflops"] = flops_fwd / ms / 1e9
                    emit(row)
                except Exception as e:
                    emit(dict(base, what=what, error=repr(e)[:800]))
            # the timed outputs against torch's float32 MATH (and its fp16 MATH's error)
            try:
                fwd_pass()
                bwd_pass()
                torch.cuda.synchronize()
                ours = [tens[4], tens[5], tens[6], tens[7]]            # o, dq, dk, dv

                def grads(dtype):
                    xs = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
                    with sdpa_kernel(SDPBackend.MATH):
                        out = torch.nn.functional.scaled_dot_product_attention(
                            *xs, is_causal=causal)
                    out.backward(do.to(dtype))
                    return [out.detach()] + [x.grad for x in xs]
                ref = grads(torch.float32)
                half = grads(torch.float16)
                err = lambda a, r: float((a.float() - r).norm() / r.norm())
                emit(dict(base, what="accuracy_vs_torch_fp32",
                          err_tc=[err(a, r) for a, r in zip(ours, ref)],
                          err_torch_math_fp16=[err(a, r) for a, r in zip(half, ref)],
                          finite=bool(all(torch.isfinite(a).all() for a in ours))))
                del ref, half
            except Exception as e:
                emit(dict(base, what="accuracy_vs_torch_fp32", error=repr(e)[:800]))
        except Exception as e:
            emit(dict(kind="time", **sh, what="std_tc", error=repr(e)[:800]))
            tens = None
        # torch MATH, the same algorithm unfused on cuBLAS
        try:
            if tens is None:
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (torch.randn((B, H, N, d), device="cuda", dtype=torch.float16,
                                           generator=gen) for _ in range(4))

            def math_fwd():
                with sdpa_kernel(SDPBackend.MATH):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

            qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

            def math_fwd_bwd():
                with sdpa_kernel(SDPBackend.MATH):
                    torch.nn.functional.scaled_dot_product_attention(
                        qq, kk, vv, is_causal=causal).backward(do)
                for x in (qq, kk, vv):
                    x.grad = None
            with torch.no_grad():
                emit(dict(kind="time", **sh, what="torch_math_fwd", ms=timed(math_fwd),
                          ms_wall=timed(math_fwd, sleep=False)))
            emit(dict(kind="time", **sh, what="torch_math_fwd+bwd", ms=timed(math_fwd_bwd),
                      ms_wall=timed(math_fwd_bwd, sleep=False)))
        except Exception as e:
            emit(dict(kind="time", **sh, what="torch_math", error=repr(e)[:800]))
        # flashsim fa2 forward on the tensor cores: kernel alone and gpu.attention call
        try:
            fr, fc = fa2_tc_default(d, causal)
            MT = fa2_tc_mt(fr, fc, d)
            I = B * H
            L2 = cuda.device_array((I, N), np.float32)
            (q3, k3, v3, o3) = views[:4]

            def fa2_kernel():
                fa2_tc.run(q3, k3, v3, o3, L2, 1.0 / np.sqrt(d), N, H, 1, None, cnt, B_r=fr,
                           B_c=fc, dt="fp16", causal=causal, count=False, MT=MT)

            def fa2_call():
                gpu.attention(q, k, v, algorithm="fa2", kernel="tc", causal=causal)
            emit(dict(kind="time", **sh, what="fa2_tc_fwd_kernel", B_r=fr, B_c=fc, MT=MT,
                      ms=timed(fa2_kernel)))
            emit(dict(kind="time", **sh, what="fa2_tc_fwd_call", ms=timed(fa2_call),
                      ms_wall=timed(fa2_call, sleep=False)))
        except Exception as e:
            emit(dict(kind="time", **sh, what="fa2_tc", error=repr(e)[:800]))
        tens = views = None
        torch.cuda.empty_cache()

    # ---------------- tiling sweep (optional, while the budget lasts) ----------------
    if args.no_sweep:
        return
    B, H, N = 1, 16, 4096
    have = {}
    for d, B_r, B_c in SWEEP:
        if time.time() - t_start > args.budget:
            emit(dict(kind="sweep", d=d, B_r=B_r, B_c=B_c, skipped="budget"))
            continue
        try:
            if d not in have:
                have.clear()
                torch.cuda.empty_cache()
                have[d] = views_of(B, H, N, d)     # (torch tensors, their views)
            ks, _ = kernels_of(B_r, B_c, d, False, N, H, have[d][1])
            for name, f in ks.items():
                emit(dict(kind="sweep", N=N, d=d, H=H, causal=False, B_r=B_r, B_c=B_c,
                          kernel=name, ms=timed(f)))
        except Exception as e:
            emit(dict(kind="sweep", d=d, B_r=B_r, B_c=B_c, error=repr(e)[:800]))


if __name__ == "__main__":
    main()
