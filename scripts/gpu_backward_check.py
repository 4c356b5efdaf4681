#!/usr/bin/env python3
"""Check the backward kernels (gpu.backward: standard, fa1, fa2) on a real GPU: gradients,
exact traffic counts, plain vs instrumented build, and time against PyTorch's
scaled_dot_product_attention.

    python3 scripts/gpu_backward_check.py           # full: see ALGS_FULL below
    python3 scripts/gpu_backward_check.py --quick   # N=256 only, every algorithm (smoke test)
    python3 scripts/gpu_backward_check.py --sim     # N=40, d=16 in Numba's CUDA simulator

Full mode, batch=2, heads=8, d=64, dtype in {fp32, fp16}, causal in {off, on}:
fa2 and standard at N in {1024, 4096}; fa1 at N=1024 only (Algorithm 4 runs ONE thread
block per instance, so it is slow; its timing uses --fa1-repeats). Tiling: the backward
default `default_backward_tiling(d, dtype, algorithm)`; the forward that provides the
statistics: fa2 `gpu.attention(fa2, return_stats)` (its own default tiling); fa1
`gpu.attention(fa1, return_stats)` and stats (l, m) = (1, L); standard
`gpu.backward_standard.standard_forward` (S / softmax / PV kernels, keeping P) with the
backward's tiling, since the backward reads P over its active tiles.
Per row:
  * grads: rel err ||g - ref||_F / ||ref||_F of dQ, dK, dV against float64 gradients of
    the same (fp16/fp32) inputs (torch float64 on the GPU, explicit formulas).
    fp32 pass: max rel err <= 1e-4.
    fp16: two yardsticks, both recorded. (a) err_torch: PyTorch's own SDPA backward
    (default backend) in fp16 against the same reference; torch_ok: max err <= 2 x
    max err_torch + 1e-4. (b) err_model: a float64 model of the fp16 roundings the
    schedule itself makes (`fp16_model`; the one tests/test_gpu_backward.py uses);
    model_ok: err <= 2 x err_model for each of dQ, dK, dV. pass (acc_ok) = model_ok.
    Why not (a): SDPA keeps S, P and its dQ accumulator on chip in float32, while
    Algorithm 3 stores S, P, dP, dS in fp16 in HBM and Algorithm 4 (line 22) re-rounds
    dQ_i to fp16 after every key block, so those schedules' error grows past 2 x torch's
    (seen on the H100: fa1 dQ at N=1024 non-causal, 2.9 x), without any kernel fault.
  * counts: the instrumented build's BackwardLedger.counts() == iosim.backward_closed_form
    (every tensor, reads and writes, in elements); every gradient finite (poisoned NaN).
  * plain vs counted (the build without counting code against the instrumented one):
    standard and fa1 are deterministic (no float atomics): dQ, dK, dV bit-identical.
    fa2 adds each key block's dQ_i partial into the float32 accumulator dQacc with
    atomics whose order varies from run to run, so its dQ cannot be bit-reproducible:
    dK and dV (one block each, fixed order) must be bit-identical, and dQ must satisfy
    |a - b| <= 1e-6 max|b| + rtol |b| elementwise, rtol = 1e-5 for fp32 and 2^-10 (one
    fp16 unit in the last place) for fp16; the largest difference is recorded.
  * time (ms, cuda events, median of --repeats after --warmup runs) of forward+backward:
    ours = the forward above + attention_backward (plain build; Python launch overhead
    included); torch = sdpa forward + .backward(dO) with the MATH and EFFICIENT backends
    (and FLASH for fp16), measured once per (N, dtype, causal). TF32 off.
JSON to $OUT (else ./out)/gpu_backward_check.json with device, versions and date; a
short table is printed last. Exit status 1 if a check failed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
mode = ap.add_mutually_exclusive_group()
mode.add_argument("--quick", action="store_true")
mode.add_argument("--sim", action="store_true")
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--fa1-repeats", type=int, default=3, help="timing repeats of the fa1 rows")
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
from gpu.api import attention  # noqa: E402
from gpu.backward import attention_backward, default_backward_tiling  # noqa: E402
from gpu.backward_standard import standard_forward  # noqa: E402

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


def time_ms(fn, repeats=None, warmup=None):
    if not USE_TORCH:
        return None
    for _ in range(ARGS.warmup if warmup is None else warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(ARGS.repeats if repeats is None else repeats):
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


#: Full mode: algorithm -> sequence lengths (d=64, batch=2, heads=8).
ALGS_FULL = {"fa2": (1024, 4096), "standard": (1024, 4096), "fa1": (1024,)}
#: plain vs counted dQ tolerance of fa2 (module docstring): rtol per dtype, atol factor.
DQ_RTOL = {"fp32": 1e-5, "fp16": 2.0 ** -10}
DQ_ATOL = 1e-6


def forward(alg, q, k, v, causal, tiling):
    """(O, stats) of the forward that feeds `alg`'s backward (module docstring)."""
    if alg == "fa2":
        return attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True)
    if alg == "fa1":
        O, L = attention(q, k, v, algorithm="fa1", causal=causal, return_stats=True)
        ones = torch.ones_like(L) if USE_TORCH else np.ones_like(L)
        return O, (ones, L)
    return standard_forward(q, k, v, causal=causal, block_rows=tiling.B_r,
                            block_cols=tiling.B_c)


def fp16_model(alg, q, k, v, o, do, causal, B_c):
    """(dq, dk, dv) in float64 with the fp16 storage roundings `alg`'s schedule makes and
    nothing else: fa1/fa2: O (from the forward) in fp16, D = rowsum(dO o O); fa1: dQ
    rounded after every key block of B_c columns (Algorithm 4 line 22); standard: S and
    P (forward), dP and dS (Algorithm 3 lines 2-3) rounded; all: each query head's dK_h,
    dV_h rounded before the group sum, final gradients rounded. Torch on the GPU, else
    NumPy (same formulas as tests/test_gpu_backward.py)."""
    if USE_TORCH:
        f64, r16 = (lambda x: x.double()), (lambda x: x.half().double())
        T = lambda x: x.transpose(-1, -2)
        rep = lambda x, n: x.repeat_interleave(n, dim=1)
        exp, where = torch.exp, torch.where
        rmax = lambda x: x.amax(-1, keepdim=True)
        rsum = lambda x: x.sum(-1, keepdim=True)
        tril = lambda n: torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
    else:
        f64 = lambda x: np.asarray(x, np.float64)
        r16 = lambda x: x.astype(np.float16).astype(np.float64)
        T = lambda x: np.swapaxes(x, -1, -2)
        rep = lambda x, n: np.repeat(x, n, axis=1)
        exp, where = np.exp, np.where
        rmax = lambda x: x.max(-1, keepdims=True)
        rsum = lambda x: x.sum(-1, keepdims=True)
        tril = lambda n: np.tril(np.ones((n, n), bool))
    q, k, v, o, do = (f64(x) for x in (q, k, v, o, do))
    H, G = q.shape[1], k.shape[1]
    kr, vr = rep(k, H // G), rep(v, H // G)
    N, d = q.shape[-2:]
    s = q @ T(kr) / d ** 0.5
    if alg == "standard":
        s = r16(s)
    if causal:
        s = where(tril(N), s, -float("inf"))
    p = exp(s - rmax(s))
    del s
    p = p / rsum(p)
    if alg == "standard":
        p = r16(p)
        dp = r16(do @ T(vr))
        ds = r16(p * (dp - rsum(p * dp))) / d ** 0.5
        del dp
    else:
        ds = p * (do @ T(vr) - rsum(do * o)) / d ** 0.5
    if alg == "fa1":
        dq = 0 * q
        for c0 in range(0, N, B_c):
            dq = r16(dq + ds[..., c0:c0 + B_c] @ kr[..., c0:c0 + B_c, :])
    else:
        dq = ds @ kr
    dk_h, dv_h = r16(T(ds) @ q), r16(T(p) @ do)
    del ds, p
    sh = (q.shape[0], G, H // G, N, d)
    return r16(dq), r16(dk_h.reshape(sh).sum(2)), r16(dv_h.reshape(sh).sum(2))


def compare_plain_counted(alg, dt, counted, plain):
    """(ok, details): bit-identity where the kernel is deterministic; fa2's dQ within the
    stated tolerance (module docstring)."""
    if USE_TORCH:
        to64 = lambda x: x.double()
        same = lambda a, b: bool(torch.equal(a, b))
        amax = lambda x: float(x.abs().max())
    else:
        to64 = lambda x: np.asarray(x, np.float64)
        same = lambda a, b: bool(np.array_equal(a, b))
        amax = lambda x: float(np.abs(x).max())
    bits = {n: same(a, b) for n, a, b in zip(("dq", "dk", "dv"), counted, plain)}
    det = {"dq": alg != "fa2", "dk": True, "dv": True}
    out = {"bit_identical": bits}
    ok = all(bits[n] for n in bits if det[n])
    if alg == "fa2":
        a, b = to64(plain[0]), to64(counted[0])
        diff, scale = (a - b).abs() if USE_TORCH else np.abs(a - b), amax(b)
        bound = DQ_ATOL * scale + DQ_RTOL[dt] * (b.abs() if USE_TORCH else np.abs(b))
        within = bool((diff <= bound).all())
        out["dq_policy"] = (f"|plain - counted| <= {DQ_ATOL:g} max|dQ| + {DQ_RTOL[dt]:.3g} |dQ| "
                            f"(float32 atomic adds into dQacc: order not reproducible)")
        out["dq_max_abs_diff"] = amax(diff)
        out["dq_max_diff_over_max"] = amax(diff) / scale if scale else 0.0
        out["dq_within_tolerance"] = within
        ok = ok and within
    else:
        out["policy"] = "dQ, dK, dV bit-identical (deterministic kernels)"
    return ok, out


def case_inputs(N, d, batch, heads, dt, causal):
    p = iosim.Problem(N=N, d=d, batch=batch, heads=heads, dtype=dt, causal=causal)
    q, k, v = iosim.random_inputs(p, 0)
    do = np.random.default_rng(1).standard_normal(q.shape).astype(q.dtype)
    if USE_TORCH:
        q, k, v, do = (torch.as_tensor(x, device="cuda") for x in (q, k, v, do))
    return p, q, k, v, do


def torch_case(q, k, v, do, causal, dt, ref):
    """err_torch and the SDPA timings of one (N, dtype, causal): shared by its rows."""
    if not USE_TORCH:
        return {}
    out = {}
    run, leaves = torch_fwd_bwd(q, k, v, do, causal, None)
    run()
    out["err_torch"] = {n: rel(x.grad, r) for n, x, r in zip(("dq", "dk", "dv"), leaves, ref)}
    del run, leaves
    out["ms"] = {}
    for be in ("MATH", "EFFICIENT") + (("FLASH",) if dt == "fp16" else ()):
        try:
            run, _ = torch_fwd_bwd(q, k, v, do, causal, be)
            out["ms"][f"sdpa_{be}"] = time_ms(run)
        except Exception as exc:  # backend not available for this case
            out["ms"][f"sdpa_{be}"] = None
            out.setdefault("notes", []).append(f"{be}: {type(exc).__name__}: {exc}"[:200])
    torch.cuda.empty_cache()
    return out


def one(alg, p, q, k, v, do, ref, shared):
    t0 = time.perf_counter()
    N, d, dt, causal = p.N, p.d, p.dtype, p.causal
    tiling = default_backward_tiling(d, dt, alg)
    row = {"algorithm": alg, "N": N, "d": d, "batch": p.batch, "heads": p.heads, "dtype": dt,
           "causal": causal, "B_r": tiling.B_r, "B_c": tiling.B_c}
    O, stats = forward(alg, q, k, v, causal, tiling)
    (dq, dk, dv), ledger = attention_backward(q, k, v, O, do, stats, algorithm=alg,
                                              causal=causal, count_traffic=True)
    closed = iosim.backward_closed_form(alg, p, tiling)
    row["counts_equal"] = ledger.counts() == closed.counts()
    if not row["counts_equal"]:
        row["counts_kernel"] = {t: list(c) for t, c in ledger.counts().items()}
        row["counts_closed"] = {t: list(c) for t, c in closed.counts().items()}
    row["hbm_bytes"] = int(closed.hbm_bytes)
    finite = (lambda x: bool(torch.isfinite(x).all())) if USE_TORCH else (lambda x: bool(np.isfinite(x).all()))
    row["all_finite"] = all(finite(g) for g in (dq, dk, dv))
    plain = attention_backward(q, k, v, O, do, stats, algorithm=alg, causal=causal)
    row["plain_matches_counted"], row["plain_vs_counted"] = compare_plain_counted(
        alg, dt, (dq, dk, dv), plain)
    del plain
    row["err"] = {n: rel(g, r) for n, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref)}
    del dq, dk, dv
    if "err_torch" in shared:
        row["err_torch"] = shared["err_torch"]
    worst = max(row["err"].values())
    if dt == "fp32":
        row["acc_ok"] = worst <= 1e-4
    else:
        model = fp16_model(alg, q, k, v, O, do, causal, tiling.B_c)
        row["err_model"] = {n: rel(m, r) for n, m, r in zip(("dq", "dk", "dv"), model, ref)}
        del model
        row["model_ok"] = all(row["err"][n] <= 2 * row["err_model"][n] for n in row["err"])
        if "err_torch" in row:
            row["torch_ok"] = worst <= 2 * max(row["err_torch"].values()) + 1e-4
        row["acc_ok"] = row["model_ok"]
    del O, stats
    row["ok"] = bool(row["counts_equal"] and row["all_finite"] and row["plain_matches_counted"]
                     and row["acc_ok"])
    if USE_TORCH:
        def ours():
            O, stats = forward(alg, q, k, v, causal, tiling)
            attention_backward(q, k, v, O, do, stats, algorithm=alg, causal=causal)
        reps = ARGS.fa1_repeats if alg == "fa1" else None
        row["ms"] = {f"ours_{alg}": time_ms(ours, reps, 1 if alg == "fa1" else None)}
        row["ms"].update(shared.get("ms", {}))
        if "notes" in shared:
            row["notes"] = shared["notes"]
        torch.cuda.empty_cache()
    row["row_s"] = round(time.perf_counter() - t0, 2)   # wall time of this row (compiles too)
    print(json.dumps(row), flush=True)
    return row


def main():
    if ARGS.sim:
        plan, d, batch, heads = {a: (40,) for a in ("fa2", "standard", "fa1")}, 16, 1, 2
    elif ARGS.quick:
        plan, d, batch, heads = {a: (256,) for a in ("fa2", "standard", "fa1")}, 64, 2, 8
    else:
        plan, d, batch, heads = ALGS_FULL, 64, 2, 8
    if USE_TORCH:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    rows = []
    t_start = time.perf_counter()
    for N in sorted({n for ns in plan.values() for n in ns}):
        for dt in ("fp32", "fp16"):
            for causal in (False, True):
                p, q, k, v, do = case_inputs(N, d, batch, heads, dt, causal)
                ref = ref_grads(q, k, v, do, causal)
                shared = torch_case(q, k, v, do, causal, dt, ref)
                for alg in plan:
                    if N in plan[alg]:
                        rows.append(one(alg, p, q, k, v, do, ref, shared))
                del ref, q, k, v, do
                if USE_TORCH:
                    torch.cuda.empty_cache()
    dev = "simulator" if ARGS.sim else cuda.get_current_device().name
    dev = dev.decode() if isinstance(dev, bytes) else str(dev)
    result = {"device": dev, "versions": versions(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "repeats": ARGS.repeats, "warmup": ARGS.warmup, "fa1_repeats": ARGS.fa1_repeats,
              "dq_tolerance_fa2": {"rtol": DQ_RTOL, "atol_times_max": DQ_ATOL},
              "rows": rows, "all_ok": all(r["ok"] for r in rows),
              "total_s": round(time.perf_counter() - t_start, 1)}
    out = ARGS.out or os.environ.get("OUT") or "out"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_backward_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{dev}; backward; batch={batch} heads={heads} d={d}; times: fwd+bwd ms, "
          f"median of {ARGS.repeats} (fa1: {ARGS.fa1_repeats}); plain: plain vs counted build; "
          f"err: max rel err of dQ, dK, dV (model: the fp16 schedule-rounding model)")
    hdr = (f"{'alg':>8} {'N':>5} {'dt':>4} {'causal':>6} {'tile':>5} {'counts':>6} {'plain':>5} "
           f"{'err ours':>9} {'err model':>9} {'err torch':>9} {'ours':>8} {'MATH':>8} "
           f"{'EFFIC':>8} {'FLASH':>8} ok")
    print(hdr)
    f = lambda x: "-" if x is None else f"{x:8.2f}"
    for r in rows:
        ms = r.get("ms", {})
        et = max(r["err_torch"].values()) if "err_torch" in r else None
        em = max(r["err_model"].values()) if "err_model" in r else None
        print(f"{r['algorithm']:>8} {r['N']:>5} {r['dtype']:>4} {str(r['causal']):>6} "
              f"{r['B_r']:>2}x{r['B_c']:<2} {str(r['counts_equal']):>6} "
              f"{str(r['plain_matches_counted']):>5} {max(r['err'].values()):9.2e} "
              f"{'-' if em is None else f'{em:9.2e}':>9} "
              f"{'-' if et is None else f'{et:9.2e}':>9} {f(ms.get('ours_' + r['algorithm'])):>8} "
              f"{f(ms.get('sdpa_MATH')):>8} {f(ms.get('sdpa_EFFICIENT')):>8} "
              f"{f(ms.get('sdpa_FLASH')):>8} {r['ok']}")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
