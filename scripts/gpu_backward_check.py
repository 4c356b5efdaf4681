#!/usr/bin/env python3
"""Check the fa2 backward kernels (gpu.backward) on a real GPU: gradients, exact traffic
counts, and time against PyTorch's scaled_dot_product_attention.

    python3 scripts/gpu_backward_check.py           # N in {1024, 4096}, d=64, batch*heads=16
    python3 scripts/gpu_backward_check.py --quick   # N=256 only (smoke test)
    python3 scripts/gpu_backward_check.py --sim     # N=40, d=16 in Numba's CUDA simulator

For every (N, dtype in {fp32, fp16}, causal in {off, on}), batch=2, heads=8, d=64:
  * grads: rel err ||g - ref||_F / ||ref||_F of dQ, dK, dV against float64 gradients of
    the same (fp16/fp32) inputs (torch float64 on the GPU, explicit formulas). O and L
    come from gpu.attention (fa2 forward). PyTorch's own SDPA backward (default backend)
    in the same dtype is measured against the same reference (err_torch), as the
    yardstick for fp16. pass: fp32 max rel err <= 1e-4; fp16 <= 2 x err_torch + 1e-4
    (informational yardstick, not a proof).
  * counts: the instrumented build's BackwardLedger.counts() == iosim.backward_closed_form
    (every tensor, reads and writes, in elements); every gradient finite (poisoned NaN).
  * time (ms, cuda events, median of --repeats after --warmup runs) of forward+backward:
    ours = gpu.attention(fa2, return_stats) + attention_backward (plain build; Python
    launch overhead included); torch = sdpa forward + .backward(dO) with the MATH and
    EFFICIENT backends (and FLASH for fp16). TF32 off.
JSON to $OUT (else ./out)/gpu_backward_check.json with device, versions and date; a
short table is printed last. Exit status 1 if a check failed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
mode = ap.add_mutually_exclusive_group()
mode.add_argument("--quick", action="store_true")
mode.add_argument("--sim", action="store_true")
ap.add_argument("--repeats", type=int, default=10)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--out", default=None)
ARGS = ap.parse_args()
if ARGS.sim:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402

if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 5):
    sys.exit(f"numpy {np.__version__}: numba-cuda 0.30.4 needs numpy < 2.5 "
             "(put a numpy 2.4 wheel first on the path; see shared/PLATFORM.md)")

from numba import cuda  # noqa: E402

import iosim  # noqa: E402
import gpu  # noqa: E402
from gpu.backward import attention_backward, default_backward_tiling  # noqa: E402

try:
    import torch
except ImportError:
    torch = None
USE_TORCH = torch is not None and not ARGS.sim and torch.cuda.is_available()


def versions():
    import numba
    out = {"numpy": np.__version__, "numba": numba.__version__, "python": sys.version.split()[0]}
    try:
        from importlib.metadata import version
        out["numba-cuda"] = version("numba-cuda")
    except Exception:
        pass
    if torch is not None:
        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
    try:
        out["driver"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
    except Exception:
        pass
    return out


def rel(a, ref):
    if USE_TORCH:
        a = torch.as_tensor(a, device="cuda").double()
        return float(torch.linalg.vector_norm(a - ref) / torch.linalg.vector_norm(ref))
    a = np.asarray(a, np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def ref_grads(q, k, v, do, causal):
    """float64 gradients (torch on the GPU, else iosim's NumPy reference)."""
    if not USE_TORCH:
        return iosim.reference_attention_backward(q, k, v, do, causal=causal)
    q, k, v, do = (x.double() for x in (q, k, v, do))
    N, d = q.shape[-2:]
    s = (q @ k.transpose(-1, -2)) / d ** 0.5
    if causal:
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool, device="cuda").tril(), float("-inf"))
    p = torch.softmax(s, -1)
    del s
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdim=True))
    del dp, p
    return ds @ k / d ** 0.5, ds.transpose(-1, -2) @ q / d ** 0.5, dv


def time_ms(fn):
    if not USE_TORCH:
        return None
    for _ in range(ARGS.warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(ARGS.repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def torch_fwd_bwd(q, k, v, do, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"MATH": SDPBackend.MATH, "EFFICIENT": SDPBackend.EFFICIENT_ATTENTION,
          "FLASH": SDPBackend.FLASH_ATTENTION, None: None}[backend]
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

    def run():
        qq.grad = kk.grad = vv.grad = None
        if be is None:
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        else:
            with sdpa_kernel(be):
                o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        o.backward(do)
    return run, (qq, kk, vv)


def one(N, d, batch, heads, dt, causal):
    p = iosim.Problem(N=N, d=d, batch=batch, heads=heads, dtype=dt, causal=causal)
    tiling = default_backward_tiling(d, dt)
    q, k, v = iosim.random_inputs(p, 0)
    do = np.random.default_rng(1).standard_normal(q.shape).astype(q.dtype)
    if USE_TORCH:
        q, k, v, do = (torch.as_tensor(x, device="cuda") for x in (q, k, v, do))
    row = {"N": N, "d": d, "batch": batch, "heads": heads, "dtype": dt, "causal": causal,
           "B_r": tiling.B_r, "B_c": tiling.B_c}
    O, L = gpu.attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True)
    (dq, dk, dv), ledger = attention_backward(q, k, v, O, do, L, causal=causal,
                                              count_traffic=True)
    closed = iosim.backward_closed_form("fa2", p, tiling)
    row["counts_equal"] = ledger.counts() == closed.counts()
    if not row["counts_equal"]:
        row["counts_kernel"] = {t: list(c) for t, c in ledger.counts().items()}
        row["counts_closed"] = {t: list(c) for t, c in closed.counts().items()}
    row["hbm_bytes"] = int(closed.hbm_bytes) if hasattr(closed, "hbm_bytes") else None
    finite = (lambda x: bool(torch.isfinite(x).all())) if USE_TORCH else (lambda x: bool(np.isfinite(x).all()))
    row["all_finite"] = all(finite(g) for g in (dq, dk, dv))
    plain = attention_backward(q, k, v, O, do, L, causal=causal)
    eq = (lambda a, b: bool(torch.equal(a, b))) if USE_TORCH else (lambda a, b: bool(np.array_equal(a, b)))
    row["plain_equals_counted"] = all(eq(a, b) for a, b in zip((dq, dk, dv), plain))
    ref = ref_grads(q, k, v, do, causal)
    row["err"] = {n: rel(g, r) for n, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref)}
    if USE_TORCH:
        run, leaves = torch_fwd_bwd(q, k, v, do, causal, None)
        run()
        row["err_torch"] = {n: rel(x.grad, r) for n, x, r in zip(("dq", "dk", "dv"), leaves, ref)}
    del ref
    worst = max(row["err"].values())
    if dt == "fp32":
        row["acc_ok"] = worst <= 1e-4
    else:
        yard = max(row.get("err_torch", {"x": 5e-4}).values())
        row["acc_ok"] = worst <= 2 * yard + 1e-4
    row["ok"] = bool(row["counts_equal"] and row["all_finite"] and row["plain_equals_counted"]
                     and row["acc_ok"])
    if USE_TORCH:
        def ours():
            O, L = gpu.attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True)
            attention_backward(q, k, v, O, do, L, causal=causal)
        row["ms"] = {"ours_fa2": time_ms(ours)}
        for be in ("MATH", "EFFICIENT") + (("FLASH",) if dt == "fp16" else ()):
            try:
                run, _ = torch_fwd_bwd(q, k, v, do, causal, be)
                row["ms"][f"sdpa_{be}"] = time_ms(run)
            except Exception as exc:  # backend not available for this case
                row["ms"][f"sdpa_{be}"] = None
                row.setdefault("notes", []).append(f"{be}: {type(exc).__name__}: {exc}"[:200])
        torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    return row


def main():
    if ARGS.sim:
        sizes, d, batch, heads = (40,), 16, 1, 2
    elif ARGS.quick:
        sizes, d, batch, heads = (256,), 64, 2, 8
    else:
        sizes, d, batch, heads = (1024, 4096), 64, 2, 8
    if USE_TORCH:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    rows = [one(N, d, batch, heads, dt, causal) for N in sizes for dt in ("fp32", "fp16")
            for causal in (False, True)]
    dev = "simulator" if ARGS.sim else cuda.get_current_device().name
    dev = dev.decode() if isinstance(dev, bytes) else str(dev)
    result = {"device": dev, "versions": versions(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "repeats": ARGS.repeats, "warmup": ARGS.warmup, "rows": rows,
              "all_ok": all(r["ok"] for r in rows)}
    out = ARGS.out or os.environ.get("OUT") or "out"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_backward_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{dev}; fa2 backward; batch={batch} heads={heads} d={d}; times: fwd+bwd ms, "
          f"median of {ARGS.repeats}")
    hdr = (f"{'N':>5} {'dt':>4} {'causal':>6} {'tile':>5} {'counts':>6} {'err ours':>9} "
           f"{'err torch':>9} {'ours':>8} {'MATH':>8} {'EFFIC':>8} {'FLASH':>8} ok")
    print(hdr)
    f = lambda x: "-" if x is None else f"{x:8.2f}"
    for r in rows:
        ms = r.get("ms", {})
        et = max(r["err_torch"].values()) if "err_torch" in r else None
        print(f"{r['N']:>5} {r['dtype']:>4} {str(r['causal']):>6} {r['B_r']:>2}x{r['B_c']:<2} "
              f"{str(r['counts_equal']):>6} {max(r['err'].values()):9.2e} "
              f"{'-' if et is None else f'{et:9.2e}':>9} {f(ms.get('ours_fa2')):>8} "
              f"{f(ms.get('sdpa_MATH')):>8} {f(ms.get('sdpa_EFFICIENT')):>8} "
              f"{f(ms.get('sdpa_FLASH')):>8} {r['ok']}")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
