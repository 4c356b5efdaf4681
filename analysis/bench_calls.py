"""`flashsim bench --call-overhead`: per-call host overhead of `gpu.attention` against its
kernel alone, on a CUDA GPU.

fp16 fa2, d=64, batch x heads=16, non-causal, N in --seq-lens (default 1024, 4096), in
one run, on torch tensors (inputs rotated over enough sets to exceed 2 x the 50 MB L2):

  fa2_kernel       the compiled kernels alone on preallocated outputs
                   (gpu.api.kernel_launcher: what `flashsim bench` times as fa2_kernel)
  fa2              gpu.attention(q, k, v): repeat calls take the thin path
  fa2_full         gpu.attention with the thin path off (every call checks everything)
  fa2_full_poison  the same, outputs NaN-filled first (what every call did before)
  torch_efficient, torch_flash   scaled_dot_product_attention, that backend forced

For each: after warm-up, `--reps` calls with
  ms_median   a CUDA event pair around each call, calls enqueued back to back with no
              sync (as `flashsim bench` and a user's loop: host work overlaps the GPU)
  loop_ms     one event pair around all reps back to back, divided by reps
  synced_ms   an event pair around each call on an idle GPU (synchronised before each):
              the call's host work after the first event plus its GPU time
  host_us     wall-clock microseconds of the Python call alone (GPU idle before it)
medians over the reps; `overhead_us` = synced_ms(impl) - synced_ms(fa2_kernel). One
summary row per N: ratio fa2 / fa2_kernel (goal <= 1.2 at N=4096) and fa2 against
torch_efficient (goal <=, at N=1024), the thin path taken (gpu.api.thin_calls), its
outputs bit-identical to the full path's, max |O - O_efficient|.

Rows (kind `host_time`: kind, run_id, device, date, commit (env FLASHSIM_COMMIT, else the
checkout's HEAD), versions, what="call_overhead" / "call_overhead_summary", ...) are
appended to --out (JSON lines) as measured; `flashsim results add` takes the file.
Under 2 minutes on an H100. Needs torch with CUDA and numpy < 2.5.

    flashsim bench --call-overhead --out out/call_overhead.jsonl
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
import time
import warnings
from types import SimpleNamespace

IMPLS = ("fa2_kernel", "fa2", "fa2_full", "fa2_full_poison", "torch_efficient", "torch_flash")


#: smallest --reps (timed calls per method)
MIN_REPS = 5
#: defaults of the options
SEQ_LENS = (1024, 4096)
REPS = 50


def run(out, *, seq_lens=SEQ_LENS, reps=REPS, batch_heads=16, head_dim=64, impls=IMPLS,
        run_id=None, profile=True) -> int:
    """Time each impl at each N into `out` (JSON lines, appended). Needs torch + a GPU
    (the caller checks: analysis.bench.gpu_problem)."""
    args = SimpleNamespace(out=out, seq_lens=list(seq_lens), reps=reps,
                           batch_heads=batch_heads, head_dim=head_dim, impls=list(impls),
                           run_id=run_id, no_profile=not profile)
    from analysis import bench as B
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import gpu
    from analysis import results as R
    from gpu import _launch, api

    F = torch.nn.functional
    meta = dict(run_id=args.run_id or R.new_run_id("host_time"),
                device=torch.cuda.get_device_name(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                commit=os.environ.get("FLASHSIM_COMMIT") or R.current_commit(),
                versions=B.versions())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    t_start = time.perf_counter()
    BH, d = args.batch_heads, args.head_dim
    backends = {"torch_efficient": SDPBackend.EFFICIENT_ATTENTION,
                "torch_flash": SDPBackend.FLASH_ATTENTION}

    def clean(x):        # JSON without NaN / inf (they become null)
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    def write(row):
        row = clean(R.make_row("host_time", **meta, **row))
        with open(args.out, "a") as f:
            f.write(json.dumps(row, allow_nan=False) + "\n")
        return row

    def median_ms(pairs):
        return [a.elapsed_time(b) for a, b in pairs]

    def measure(fn, sets, reps):
        for s in sets[:3]:               # warm-up (compiles; builds the plan)
            fn(s)
        torch.cuda.synchronize()
        # back to back, an event pair per call
        pairs = []
        for r in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn(sets[r % len(sets)])
            b.record()
            pairs.append((a, b))
            del out
        torch.cuda.synchronize()
        per_call = median_ms(pairs)
        # one pair around the whole loop
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for r in range(reps):
            fn(sets[r % len(sets)])
        b.record()
        torch.cuda.synchronize()
        loop_ms = a.elapsed_time(b) / reps
        # idle GPU before each call: host work + GPU time, and the host time alone
        synced, host = [], []
        for r in range(reps):
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            t0 = time.perf_counter()
            out = fn(sets[r % len(sets)])
            t1 = time.perf_counter()
            b.record()
            synced.append((a, b))
            host.append((t1 - t0) * 1e6)
            del out
        torch.cuda.synchronize()
        synced = median_ms(synced)
        return dict(ms_median=statistics.median(per_call), ms_min=min(per_call),
                    ms_max=max(per_call), loop_ms=loop_ms, synced_ms=statistics.median(synced),
                    host_us=statistics.median(host), host_us_min=min(host), reps=reps)

    print(f"call_overhead: {meta['device']}, run {meta['run_id']} -> {args.out}", flush=True)
    for N in args.seq_lens:
        g = torch.Generator(device="cuda").manual_seed(N)
        n_sets = min(B.input_sets(N, d, BH, "fp16"), 24)
        sets = [tuple(torch.randn((1, BH, N, d), device="cuda", generator=g,
                                  dtype=torch.float16) for _ in range(3)) for _ in range(n_sets)]
        try:
            launcher = api.kernel_launcher(*sets[0])
        except Exception as exc:        # recorded in the fa2_kernel row
            launcher_error = f"{type(exc).__name__}: {exc}"[:400]

            def launcher(*s):
                raise RuntimeError(f"kernel_launcher failed: {launcher_error}")

        def full(s, poison=False):
            with api.thin_path(False):
                return gpu.attention(*s, poison=poison)

        def sdpa(backend):
            def f(s):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(*s)
            return f
        fns = {"fa2_kernel": lambda s: launcher(*s), "fa2": lambda s: gpu.attention(*s),
               "fa2_full": full, "fa2_full_poison": lambda s: full(s, True),
               **{name: sdpa(b) for name, b in backends.items()}}
        got = {}
        thin_fa2 = 0
        for impl in args.impls:
            extra = {}
            caught = []
            n0 = api.thin_calls
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    m = measure(fns[impl], sets, args.reps)
            except Exception as exc:     # a failing impl is a result too
                m = dict(error=f"{type(exc).__name__}: {exc}"[:400])
            if impl == "fa2":
                extra["thin_calls"] = thin_fa2 = api.thin_calls - n0
                extra["warnings"] = [str(w.message)[:300] for w in caught]
                if not args.no_profile and "error" not in m:
                    import cProfile
                    import io
                    import pstats
                    torch.cuda.synchronize()
                    pr = cProfile.Profile()
                    pr.enable()
                    for r in range(200):
                        gpu.attention(*sets[r % len(sets)])
                    pr.disable()
                    torch.cuda.synchronize()
                    s = io.StringIO()
                    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(15)
                    extra["profile"] = s.getvalue()[-6000:]
            got[impl] = m
            row = write(dict(what="call_overhead", impl=impl, N=N, d=d, batch_heads=BH,
                             dtype="fp16", causal=False, n_sets=n_sets,
                             unit="ms per call (CUDA events); host_us: microseconds",
                             **m, **extra))
            print(f"  N={N:<5} {impl:<16} " + ("ERROR " + m["error"] if "error" in m else
                  f"events {m['ms_median']:.4f} ms  loop {m['loop_ms']:.4f}  synced "
                  f"{m['synced_ms']:.4f}  host {m['host_us']:.1f} us"), flush=True)
            del row
        # the summary: goals, identical outputs, the thin path taken (3 x reps timed calls)
        try:
            tl = api.default_tiling("fa2", d, "fp16", False)
            s0 = sets[0]
            thin = gpu.attention(*s0)
            with api.thin_path(False):
                ref = gpu.attention(*s0)
            with sdpa_kernel(backends["torch_efficient"]):
                eff = F.scaled_dot_product_attention(*s0)
            kern = launcher(*s0)
            torch.cuda.synchronize()
            summ = dict(what="call_overhead_summary", N=N, d=d, batch_heads=BH, dtype="fp16",
                        causal=False, identical_to_full=bool(torch.equal(thin, ref)),
                        kernel_identical=bool(torch.equal(kern, ref)),
                        max_abs_diff_vs_efficient=float((thin.float() - eff.float()).abs().max()),
                        tiling=[tl.B_r, tl.B_c], thin_calls_fa2=thin_fa2,
                        thin_path_taken=thin_fa2 >= 3 * args.reps)
            k, c = got.get("fa2_kernel", {}), got.get("fa2", {})
            if "ms_median" in k and "ms_median" in c:
                summ.update(ratio_call_to_kernel=c["ms_median"] / k["ms_median"],
                            ratio_call_to_kernel_loop=c["loop_ms"] / k["loop_ms"],
                            overhead_us_synced=(c["synced_ms"] - k["synced_ms"]) * 1e3,
                            host_us_call=c["host_us"], host_us_kernel=k["host_us"],
                            host_us_on_top=c["host_us"] - k["host_us"])
                for name in ("fa2_full", "fa2_full_poison", "torch_efficient", "torch_flash"):
                    if "ms_median" in got.get(name, {}):
                        summ[f"ms_{name}"] = got[name]["ms_median"]
                        summ[f"overhead_us_synced_{name}"] = (got[name]["synced_ms"]
                                                              - k["synced_ms"]) * 1e3
                summ["ms_fa2"], summ["ms_fa2_kernel"] = c["ms_median"], k["ms_median"]
                summ["goal_host_on_top_le_30us"] = summ["host_us_on_top"] <= 30
                if N == 4096:
                    summ["goal_ratio_le_1_2"] = summ["ratio_call_to_kernel"] <= 1.2
                if N == 1024 and "ms_torch_efficient" in summ:
                    summ["goal_le_efficient"] = c["ms_median"] <= summ["ms_torch_efficient"]
            write(summ)
            print("  summary " + json.dumps({kk: (round(vv, 4) if isinstance(vv, float) else vv)
                                             for kk, vv in summ.items()
                                             if kk not in ("what", "d", "batch_heads", "dtype",
                                                           "causal")}), flush=True)
        except Exception as exc:     # the timings above are kept; say what failed
            write(dict(what="call_overhead_summary", N=N, d=d, batch_heads=BH, dtype="fp16",
                       causal=False, error=f"{type(exc).__name__}: {exc}"[:400]))
            print(f"  summary failed: {type(exc).__name__}: {exc}", flush=True)
        sets = fns = launcher = thin = ref = eff = kern = None   # free before the next N
        torch.cuda.empty_cache()
    print(f"call_overhead: done in {time.perf_counter() - t_start:.0f} s; "
          f"fast launches {_launch.fast_launches}, thin calls {api.thin_calls}", flush=True)
    return 0

