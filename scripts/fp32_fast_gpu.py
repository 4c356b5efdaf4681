"""Time the fp32 fast standard and fa1 kernels on a GPU (scripts/fp32_fast_gpu.sh runs it).

In one process, with CUDA events around each call (calls enqueued back to back, so the
host work of `gpu.attention` hides behind the kernels of multi-ms calls), median of REPS
after WARM warm-up calls, fp32, d = 64, N = 4096:
  * standard, batch x heads = 16, dense and causal: the fast kernels at their default
    tiling (kernel='auto'), the plain kernels (kernel='plain', their default tiling) and
    torch's MATH SDPA backend (TF32 off);
  * fa1 fast (kernel='auto') against fa2 fast (kernel='auto'), batch x heads = 128, dense
    and causal;
  * a tiling sweep of each fast kernel (VARIANTS_*), dense, with registers / local memory
    per thread of each build (numba-cuda's view of ptxas) and the rel. error of one head
    against float64.
Prints a compact table and writes $OUT/fp32_fast_gpu.json. FP32FAST_SMOKE=1: a tiny run
(any device, the simulator included) to check the script itself.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

SMOKE = os.environ.get("FP32FAST_SMOKE") == "1"
OUT = os.environ.get("OUT", os.path.join(ROOT, "out"))
os.makedirs(OUT, exist_ok=True)
JSON = os.path.join(OUT, "fp32_fast_gpu.json")
N, D, BH_STD, BH_FA1 = 4096, 64, 16, 128
WARM, REPS = 3, 20
#: standard: (B_r, B_c, threads, stage, maxreg)
VARIANTS_STD = [(128, 128, 256, 0, 0), (64, 128, 128, 0, 0), (128, 64, 256, 0, 0),
                (64, 64, 128, 0, 0)]
#: fa1: (B_r, B_c, threads, maxreg)
VARIANTS_FA1 = [(128, 128, 512, 128), (128, 128, 256, 0), (128, 64, 512, 128),
                (64, 64, 256, 0)]
if SMOKE:
    N, D, BH_STD, BH_FA1, WARM, REPS = 24, 16, 2, 2, 1, 2
    VARIANTS_STD = [(8, 8, 16, 0, 0), (8, 8, 16, 1, 0)]
    VARIANTS_FA1 = [(8, 8, 16, 0)]

import gpu  # noqa: E402
from gpu import _launch, api  # noqa: E402

results = {"N": N, "d": D, "reps": REPS, "timings": [], "variants": [], "errors": []}


def save():
    with open(JSON, "w") as f:
        json.dump(results, f, indent=1, default=str)


def _one(x):
    if isinstance(x, dict):
        vals = list(x.values())
        return vals[0] if len(vals) == 1 else vals
    return x


def inputs(bh, seed=0):
    """q, k, v (1, bh, N, d) fp32: torch on a GPU, NumPy in the simulator."""
    if _launch.SIM:
        rng = np.random.default_rng(seed)
        return tuple(rng.standard_normal((1, bh, N, D)).astype(np.float32) for _ in range(3))
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(1, bh, N, D, device="cuda", generator=g) for _ in range(3))


def time_calls(fn):
    """Median ms over REPS calls of fn() after WARM, CUDA events per call (the simulator:
    host wall time)."""
    for _ in range(WARM):
        fn()
    if _launch.SIM:
        ts = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(ts)
    import torch
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(REPS)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def kernels_of(fn):
    """[(name, regs, local bytes)] of the kernels one call of fn launches (fill kernels
    left out)."""
    with _launch.recording() as rec:
        fn()
    out = []
    for kern, *_ in rec:
        name = kern.py_func.__name__
        if name.startswith("_fill"):
            continue
        info = [name]
        for f in ("get_regs_per_thread", "get_local_mem_per_thread"):
            try:
                info.append(_one(getattr(kern, f)()))
            except Exception as exc:      # the simulator has no such counts
                info.append(f"n/a ({type(exc).__name__})")
        out.append(tuple(info))
    return out


def rel_err_one_head(O, q, k, v, causal):
    """max |O - ref| / max |ref| over head 0, ref in float64."""
    to_np = (lambda x: np.asarray(x)) if _launch.SIM else (lambda x: x.detach().cpu().numpy())
    qh, kh, vh, oh = (to_np(x)[0, 0].astype(np.float64) for x in (q, k, v, O))
    S = qh @ kh.T / np.sqrt(D)
    if causal:
        S = np.where(np.tril(np.ones_like(S, dtype=bool)), S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    ref = (P / P.sum(-1, keepdims=True)) @ vh
    return float(np.abs(oh - ref).max() / np.abs(ref).max())


def record(kind, **row):
    row["kind"] = kind
    results["timings" if kind == "timing" else "variants"].append(row)
    save()
    print(json.dumps(row, default=str), flush=True)


def timing(label, alg, bh, causal, fn, q, k, v):
    try:
        ms = time_calls(fn)
        flops = 4.0 * N * N * D * bh * (0.5 if causal else 1.0)
        O = fn()
        O = O[0] if isinstance(O, tuple) else O
        err = rel_err_one_head(O, q, k, v, causal) if O is not None else None
        record("timing", label=label, alg=alg, bh=bh, causal=causal, ms=round(ms, 3),
               tflops=round(flops / ms / 1e9, 2), rel_err=err)
    except Exception as exc:
        results["errors"].append({"label": label, "error": repr(exc),
                                  "trace": traceback.format_exc()})
        save()
        print(f"ERROR {label}: {exc!r}", flush=True)


def main():
    if not _launch.SIM:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        results["device"] = torch.cuda.get_device_name()
    # ---- standard at BH 16: fast (auto), plain, torch MATH ----
    q, k, v = inputs(BH_STD)
    for causal in (False, True):
        c = " causal" if causal else ""
        timing(f"standard fast{c}", "standard", BH_STD, causal,
               lambda: gpu.attention(q, k, v, algorithm="standard", causal=causal), q, k, v)
        timing(f"standard plain{c}", "standard", BH_STD, causal,
               lambda: gpu.attention(q, k, v, algorithm="standard", causal=causal,
                                     kernel="plain"), q, k, v)
        if not _launch.SIM:
            import torch
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def math_sdpa():
                with sdpa_kernel(SDPBackend.MATH):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal)
            timing(f"torch MATH{c}", "standard", BH_STD, causal, math_sdpa, q, k, v)
    results["kernels_standard_default"] = kernels_of(
        lambda: gpu.attention(q, k, v, algorithm="standard"))
    # ---- the standard tiling sweep (dense) ----
    for (B_r, B_c, t, stage, maxreg) in VARIANTS_STD:
        label = f"std {B_r}x{B_c} t{t} s{stage} r{maxreg}"
        try:
            api.STANDARD_FAST_TUNED[(B_r, B_c, t)] = dict(stage=stage, maxreg=maxreg)
            fn = (lambda B_r=B_r, B_c=B_c, t=t: gpu.attention(
                q, k, v, algorithm="standard", kernel="fast", block_rows=B_r, block_cols=B_c,
                threads=t))
            ms = time_calls(fn)
            record("variant", alg="standard", label=label, ms=round(ms, 3),
                   tflops=round(4.0 * N * N * D * BH_STD / ms / 1e9, 2),
                   rel_err=rel_err_one_head(fn(), q, k, v, False), kernels=kernels_of(fn))
        except Exception as exc:
            results["errors"].append({"label": label, "error": repr(exc),
                                      "trace": traceback.format_exc()})
            print(f"ERROR {label}: {exc!r}", flush=True)
        finally:
            api.STANDARD_FAST_TUNED.pop((B_r, B_c, t), None)
    del q, k, v
    # ---- fa1 fast against fa2 fast at BH 128 ----
    q, k, v = inputs(BH_FA1, seed=1)
    for causal in (False, True):
        c = " causal" if causal else ""
        timing(f"fa1 fast{c}", "fa1", BH_FA1, causal,
               lambda: gpu.attention(q, k, v, algorithm="fa1", causal=causal), q, k, v)
        timing(f"fa2 fast{c}", "fa2", BH_FA1, causal,
               lambda: gpu.attention(q, k, v, algorithm="fa2", causal=causal), q, k, v)
    results["kernels_fa1_default"] = kernels_of(lambda: gpu.attention(q, k, v, algorithm="fa1"))
    for (B_r, B_c, t, maxreg) in VARIANTS_FA1:
        label = f"fa1 {B_r}x{B_c} t{t} r{maxreg}"
        try:
            api.FA1_FAST_TUNED[(B_r, B_c, t)] = dict(maxreg=maxreg)
            fn = (lambda B_r=B_r, B_c=B_c, t=t: gpu.attention(
                q, k, v, algorithm="fa1", kernel="fast", block_rows=B_r, block_cols=B_c,
                threads=t))
            ms = time_calls(fn)
            record("variant", alg="fa1", label=label, ms=round(ms, 3),
                   tflops=round(4.0 * N * N * D * BH_FA1 / ms / 1e9, 2),
                   rel_err=rel_err_one_head(fn(), q, k, v, False), kernels=kernels_of(fn))
        except Exception as exc:
            results["errors"].append({"label": label, "error": repr(exc),
                                      "trace": traceback.format_exc()})
            print(f"ERROR {label}: {exc!r}", flush=True)
        finally:
            api.FA1_FAST_TUNED.pop((B_r, B_c, t), None)
    save()
    # ---- compact table ----
    print("\n== timings (median ms of %d, fp32, N=%d, d=%d)" % (REPS, N, D))
    for r in results["timings"]:
        err = "-" if r["rel_err"] is None else "%.1e" % r["rel_err"]
        print(f"{r['label']:<24} BH={r['bh']:<4} {r['ms']:>10.3f} ms {r['tflops']:>7.2f} TFLOP/s"
              f"  err {err}")
    print("\n== tiling sweep (dense)")
    for r in results["variants"]:
        regs = " ".join(f"{n.split('_Br')[0]}:{rg}r/{lm}B" for n, rg, lm in r["kernels"])
        print(f"{r['label']:<28} {r['ms']:>10.3f} ms {r['tflops']:>7.2f} TFLOP/s "
              f"err {r['rel_err']:.1e}  {regs}")
    print("\n== default builds (registers / local bytes per thread)")
    for key in ("kernels_standard_default", "kernels_fa1_default"):
        for n, rg, lm in results.get(key, []):
            print(f"{n:<70} regs {rg}  local {lm}")
    if results["errors"]:
        print(f"\n{len(results['errors'])} errors (see {JSON})")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
