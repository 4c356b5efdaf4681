"""Where the time of one attention forward goes, operation by operation: the measurement
behind the paper's Figure 1 (right), on a GPU.

One configuration (default GPT-2-like: batch 8, 16 heads, N = 1024, d = 64, fp16, causal,
dropout p = 0.1), timed as

* PyTorch's unfused attention, each operation alone (`UNFUSED_OPS`): S = scale Q K^T
  (`torch.baddbmm`, one GEMM with alpha = scale), the causal mask (`masked_fill`, out of
  place), softmax, dropout, O = P V (`torch.matmul`); and the five in sequence;
* the fused kernels of PyTorch: `scaled_dot_product_attention` under
  `torch.nn.attention.sdpa_kernel` with the FLASH_ATTENTION and EFFICIENT_ATTENTION
  backends, with the same dropout and without it;
* flashsim's standard attention (three kernels: std_S, std_softmax, std_PV) and its fused
  fa2 forward (the fp16 tensor-core kernel, fa2_tc), each kernel timed alone by CUPTI
  through `analysis.hwmeasure.time_config` (configurations of
  `analysis.validation_configs.cfg`); neither has dropout.

PyTorch's operations are timed with CUDA events: warm-up first, then each repetition
queued behind a short GPU sleep (`torch.cuda._sleep`) so that the events time the GPU and
not the launch, inputs rotated over `input_sets` copies (so the L2 does not keep them),
the median over >= 20 repetitions. Every intermediate an operation reads (S, the masked
S, P, the dropped P) is computed beforehand for each copy, outside the timed region.

The modelled side: `iosim.predict_time` for flashsim's standard and fa2 with the
tiling the kernels ran, per launch, on the measuring device's preset (H100-SXM for an
H100). `PAIRING` says which PyTorch operations each flashsim kernel stands for: std_S <->
the Q K^T matmul, std_softmax <-> mask + softmax, std_PV <-> the P V matmul, fa2 <-> all
five. flashsim's std_S writes -inf into the masked entries itself (the mask is fused into
the S kernel, and fully masked tiles are skipped), and flashsim has no dropout: its bars
lack that operation.

Rows (kind "op_breakdown", ready for `flashsim results add`): impl, op, measured_ms
(ms_min, ms_max, reps, timer), pairs_with, for flashsim's kernels predicted_ms and the
model's binding term, config (shape, dtype, causal, dropout_p, scale, tiling), status
("ok" or "error" with the error), and the environment (`analysis.hwmeasure.environment`:
device, date, commit, versions with the driver) and a run_id. Needs a CUDA GPU and
PyTorch; without them it says so in one line and exits 2.

    python3 -m analysis.opbreakdown --out op_breakdown.jsonl
    flashsim results add op_breakdown.jsonl         # into the results data set
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

KIND = "op_breakdown"
#: the GPT-2-like default configuration
DEFAULTS = dict(batch=8, heads=16, N=1024, d=64, dtype="fp16", causal=True, dropout_p=0.1)

#: PyTorch's unfused forward, in order: (op, what is timed)
UNFUSED_OPS = (("matmul_qk", "S = scale Q K^T (torch.baddbmm, alpha = scale)"),
               ("mask", "S.masked_fill(causal mask, -inf), out of place"),
               ("softmax", "P = torch.softmax(S, dim=-1)"),
               ("dropout", "P = dropout(P, p), training"),
               ("matmul_pv", "O = P V (torch.matmul)"))
OP_NAMES = tuple(o for o, _ in UNFUSED_OPS)

#: flashsim kernel family -> the unfused PyTorch operations it stands for
PAIRING = {"std_S": ("matmul_qk",), "std_softmax": ("mask", "softmax"),
           "std_PV": ("matmul_pv",), "fa2_tc": OP_NAMES}
PAIRING_NOTES = {
    "std_S": "S = scale Q K^T per active tile; flashsim writes -inf into the causally masked "
             "entries here (the mask is fused into the S kernel) and skips fully masked tiles",
    "std_softmax": "row softmax over the active tiles; paired with PyTorch's mask + softmax "
                   "(flashsim's mask itself is applied in std_S); no dropout in flashsim",
    "std_PV": "O = P V over the active tiles",
    "fa2_tc": "fused: Q K^T, mask, online softmax and P V in one kernel; no dropout in flashsim",
}

#: the fused PyTorch kernels: impl -> torch.nn.attention.SDPBackend member
SDPA_BACKENDS = {"torch_sdpa_flash": "FLASH_ATTENTION", "torch_sdpa_efficient": "EFFICIENT_ATTENTION"}
#: every impl, in the order the figure draws them
IMPLS = ("pytorch_unfused", "torch_sdpa_flash", "torch_sdpa_efficient", "flashsim_standard",
         "flashsim_fa2")
SLEEP_CYCLES = 2_000_000        # about 1 ms: enough to queue one repetition behind it


class NoGPU(RuntimeError):
    """No CUDA GPU or no PyTorch: nothing can be measured."""


# ---------------------------------------------------------------------------------------
# Pure parts (no GPU): configurations, pairing, rows
# ---------------------------------------------------------------------------------------
def problem_config(**kw) -> dict:
    """The measured configuration: DEFAULTS updated with kw (unknown keys: ValueError)."""
    bad = set(kw) - set(DEFAULTS)
    if bad:
        raise ValueError(f"unknown configuration keys {sorted(bad)}; allowed: {sorted(DEFAULTS)}")
    c = dict(DEFAULTS, **kw)
    if c["dtype"] not in ("fp16", "fp32"):
        raise ValueError(f"dtype={c['dtype']!r} is not allowed; allowed: fp16, fp32")
    if not 0 <= c["dropout_p"] < 1:
        raise ValueError(f"dropout_p={c['dropout_p']!r} must be in [0, 1)")
    for k in ("batch", "heads", "N", "d"):
        if int(c[k]) != c[k] or c[k] < 1:
            raise ValueError(f"{k}={c[k]!r} must be a positive integer")
    c["kv_heads"] = c["heads"]
    c["scale"] = 1.0 / math.sqrt(c["d"])
    return c


def unfused_ops(c: dict) -> tuple:
    """The unfused operations this configuration runs: no mask without causal, no
    dropout at p = 0."""
    return tuple((o, w) for o, w in UNFUSED_OPS
                 if (o != "mask" or c["causal"]) and (o != "dropout" or c["dropout_p"] > 0))


def flashsim_configs(c: dict) -> dict:
    """impl -> the analysis.validation_configs configuration of flashsim's kernels."""
    from analysis.validation_configs import cfg
    args = (c["dtype"], c["batch"], c["heads"], c["N"], c["d"])
    return {"flashsim_standard": cfg("fwd", "standard", "default", *args, causal=c["causal"]),
            "flashsim_fa2": cfg("fwd", "fa2", "tc" if c["dtype"] == "fp16" else "fast", *args,
                                causal=c["causal"])}


def pair_kernels(kernels: list[dict]) -> list[dict]:
    """flashsim's measured kernels ([{name, ms}], as time_config gives them) -> one entry
    per kernel: {op (its family), kernel_name, measured_ms, pairs_with, note}."""
    from iosim.timing import family_key
    out = []
    for k in kernels:
        fam = family_key(k["name"])
        if fam not in PAIRING:
            raise ValueError(f"kernel {k['name']!r} (family {fam}) has no pairing with "
                             f"PyTorch's operations; known: {', '.join(PAIRING)}")
        out.append({"op": fam, "kernel_name": k["name"][:160], "measured_ms": float(k["ms"]),
                    "pairs_with": list(PAIRING[fam]), "note": PAIRING_NOTES[fam]})
    return out


def modelled(c: dict, impl: str, gpu: str = "H100-SXM", tiling=None) -> list[dict]:
    """iosim.predict_time for one flashsim impl, per launch: [{op, predicted_ms,
    binds, terms_ms, imbalance, pairs_with}]. tiling: (B_r, B_r) the kernels ran, or None
    (the model's default)."""
    from iosim import Problem, Tiling, predict_time
    from iosim.timing import family_key
    fc = flashsim_configs(c)[impl]
    p = Problem(N=c["N"], d=c["d"], batch=c["batch"], heads=c["heads"], kv_heads=c["kv_heads"],
                dtype=c["dtype"], causal=c["causal"])
    # the standard rows were measured on the plain kernels (before standard_tc)
    pr = predict_time(fc["algorithm"], p, gpu, kernel=fc["kernel"] if fc["algorithm"] == "fa2" else "plain",
                      tiling=None if tiling is None else Tiling(*tiling))
    out = []
    for la in pr["launches"]:
        fam = family_key(la["name"])
        out.append({"op": fam, "predicted_ms": la["predicted_ms"], "binds": la["binds"],
                    "terms_ms": la["terms_ms"], "imbalance": la["imbalance"],
                    "pairs_with": list(PAIRING.get(fam, ())), "model_family": la["family"]})
    return out


def _env_fields(env: dict) -> dict:
    versions = dict(env.get("versions") or {})
    if env.get("driver") is not None:
        versions["driver"] = env["driver"]
    return {"device": env.get("device"), "date": env.get("date"), "commit": env.get("commit"),
            "versions": versions}


def make_rows(c: dict, measured: dict, env: dict, run_id: str,
              model: dict | None = None) -> list[dict]:
    """Result rows from one run. measured: impl -> {"ops": [{op, measured_ms, ...}] or
    "error": text, "timer", "tiling", "dropout_p"}; for the fused torch impls a list of
    such dicts (one per dropout_p). model: impl -> modelled(...) list (flashsim impls)."""
    from analysis import results as R
    rows = []
    ef = _env_fields(env)
    base_cfg = {k: c[k] for k in ("batch", "heads", "kv_heads", "N", "d", "dtype", "causal",
                                  "dropout_p", "scale")}
    model = model or {}
    for impl in IMPLS:
        default_p = 0.0 if impl.startswith("flashsim") else c["dropout_p"]   # no dropout there
        for m in _as_list(measured.get(impl)):
            cfg = dict(base_cfg, dropout_p=m.get("dropout_p", default_p),
                       tiling=m.get("tiling"), input_sets=m.get("input_sets"))
            common = dict(impl=impl, dropout_p=cfg["dropout_p"], timer=m.get("timer"),
                          config=cfg)
            if m.get("error"):
                rows.append(R.make_row(KIND, run_id=run_id, **ef, **common, op=None,
                                       measured_ms=None, status="error", error=m["error"][:500]))
                continue
            preds = {x["op"]: x for x in model.get(impl, [])}
            for o in m["ops"]:
                row = dict(common, op=o["op"], measured_ms=float(o["measured_ms"]),
                           status="ok")
                for k in ("ms_min", "ms_max", "reps", "kernel_name", "pairs_with", "note",
                          "what"):
                    if k in o:
                        row[k] = o[k]
                pm = preds.get(o["op"])
                if pm is not None:
                    row.update(predicted_ms=pm["predicted_ms"], binds=pm["binds"],
                               terms_ms=pm["terms_ms"], model_gpu=model.get("_gpu"))
                rows.append(R.make_row(KIND, run_id=run_id, **ef, **row))
    for r in rows:
        R.validate(r)
    return rows


def _as_list(x):
    return [] if x is None else (x if isinstance(x, list) else [x])


def summarize(rows: list[dict]) -> dict:
    """(impl, dropout_p) -> {op: measured_ms} over ok rows (the last run wins), with
    'sequence' kept apart from the stacked operations."""
    out: dict = {}
    for r in rows:
        if r.get("status") != "ok" or r.get("op") is None:
            continue
        out.setdefault((r["impl"], r.get("dropout_p")), {})[r["op"]] = r["measured_ms"]
    return out


# ---------------------------------------------------------------------------------------
# GPU parts
# ---------------------------------------------------------------------------------------
def _need_gpu():
    try:
        import torch
    except Exception as e:
        raise NoGPU(f"PyTorch is not importable ({type(e).__name__}: {e})") from None
    if not torch.cuda.is_available():
        raise NoGPU("torch.cuda.is_available() is False")
    return torch


def time_events(fn, arg_sets, reps: int = 30, warmup: int = 5) -> dict:
    """Median GPU time (ms, CUDA events) of fn(*args), args rotated over arg_sets."""
    import torch
    n = len(arg_sets)
    for i in range(warmup):
        fn(*arg_sets[i % n])
    torch.cuda.synchronize()
    sleep = getattr(torch.cuda, "_sleep", None)
    st = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        if sleep is not None:
            sleep(SLEEP_CYCLES)          # the GPU waits here while the CPU queues the rest
        st[r].record()
        fn(*arg_sets[r % n])
        en[r].record()
        if r % 8 == 7:                   # keep the queue short (no sleep pile-up)
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    ms = [a.elapsed_time(b) for a, b in zip(st, en)]
    return {"measured_ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms),
            "reps": reps}


def measure_unfused(c: dict, reps: int, input_sets: int, seed: int = 0) -> dict:
    torch = _need_gpu()
    import torch.nn.functional as F
    dt = torch.float16 if c["dtype"] == "fp16" else torch.float32
    B, H, N, d = c["batch"], c["heads"], c["N"], c["d"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    mask = torch.ones(N, N, dtype=torch.bool, device="cuda").triu(1) if c["causal"] else None
    p = c["dropout_p"]

    def qk(q, k):
        return torch.baddbmm(torch.empty(B * H, N, N, dtype=dt, device="cuda"),
                             q.view(B * H, N, d), k.view(B * H, N, d).transpose(1, 2),
                             beta=0.0, alpha=c["scale"]).view(B, H, N, N)

    def msk(s):
        return s.masked_fill(mask, float("-inf")) if mask is not None else s

    def sm(s):
        return torch.softmax(s, dim=-1)

    def drop(pm):
        return F.dropout(pm, p=p, training=True) if p > 0 else pm

    def pv(pm, v):
        return torch.matmul(pm, v)

    def sequence(q, k, v):
        return pv(drop(sm(msk(qk(q, k)))), v)

    sets = []
    with torch.no_grad():
        for _ in range(input_sets):
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=dt, generator=g)
                       for _ in range(3))
            s = qk(q, k)
            sm_ = msk(s)
            pm = sm(sm_)
            pd = drop(pm)
            sets.append({"q": q, "k": k, "v": v, "s": s, "sm": sm_, "p": pm, "pd": pd})
        torch.cuda.synchronize()
        plan = {"matmul_qk": (qk, ("q", "k")), "mask": (msk, ("s",)), "softmax": (sm, ("sm",)),
                "dropout": (drop, ("p",)), "matmul_pv": (pv, ("pd", "v"))}
        ops = []
        for op, what in unfused_ops(c):
            fn, keys = plan[op]
            t = time_events(fn, [tuple(x[k] for k in keys) for x in sets], reps)
            ops.append({"op": op, "what": what, **t})
        t = time_events(sequence, [(x["q"], x["k"], x["v"]) for x in sets], reps)
        ops.append({"op": "sequence", "what": "the operations above in order, one timed region",
                    **t})
    del sets
    torch.cuda.empty_cache()
    return {"ops": ops, "timer": "cuda_events", "input_sets": input_sets}


def measure_sdpa(c: dict, impl: str, dropout_p: float, reps: int, input_sets: int,
                 seed: int = 0) -> dict:
    torch = _need_gpu()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
    dt = torch.float16 if c["dtype"] == "fp16" else torch.float32
    B, H, N, d = c["batch"], c["heads"], c["N"], c["d"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    sets = [tuple(torch.randn(B, H, N, d, device="cuda", dtype=dt, generator=g) for _ in range(3))
            for _ in range(input_sets)]

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                              is_causal=c["causal"], scale=c["scale"])
    with torch.no_grad(), sdpa_kernel(backend):
        t = time_events(fn, sets, reps)
    return {"ops": [{"op": "fused", "what": f"scaled_dot_product_attention, {backend.name}", **t}],
            "timer": "cuda_events", "input_sets": input_sets, "dropout_p": dropout_p}


def measure_flashsim(c: dict, impl: str, reps: int) -> dict:
    _need_gpu()
    from analysis.hwmeasure import resolved_tiling, time_config
    fc = flashsim_configs(c)[impl]
    t = time_config(fc, reps=reps, min_reps=20)
    return {"ops": pair_kernels(t["kernels"]), "timer": "cupti", "tiling": list(resolved_tiling(fc)),
            "input_sets": t["input_sets"], "dropout_p": 0.0, "reps": t["reps"],
            "pass_ms": t["measured_ms"]}


def _try(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except NoGPU:
        raise
    except Exception as e:  # one failing implementation must not end the run
        out = {"error": f"{type(e).__name__}: {e}"}
        if "dropout_p" in kw:
            out["dropout_p"] = kw["dropout_p"]
        return out


def measure(N=1024, d=64, batch=8, heads=16, dtype="fp16", causal=True, dropout_p=0.1,
            reps: int = 30, input_sets: int = 4, run_id: str | None = None,
            log=None) -> list[dict]:
    """Time every implementation of one configuration on the GPU; the result rows."""
    log = log or (lambda msg: print(msg, flush=True))
    from analysis import results as R
    from analysis.hwmeasure import environment
    from analysis.fit_levels import GPU_OF_DEVICE
    c = problem_config(N=N, d=d, batch=batch, heads=heads, dtype=dtype, causal=causal,
                       dropout_p=dropout_p)
    if reps < 20:
        raise ValueError(f"reps={reps} must be at least 20")
    _need_gpu()
    env = environment()
    run_id = run_id or R.new_run_id(KIND)
    t0 = time.perf_counter()
    measured = {}
    measured["pytorch_unfused"] = _try(measure_unfused, c, reps, input_sets)
    log(f"[{time.perf_counter() - t0:5.1f}s] pytorch_unfused")
    for impl in SDPA_BACKENDS:
        measured[impl] = [_try(measure_sdpa, c, impl, dropout_p=p, reps=reps, input_sets=input_sets)
                          for p in sorted({c["dropout_p"], 0.0}, reverse=True)]
        log(f"[{time.perf_counter() - t0:5.1f}s] {impl}")
    gpu = GPU_OF_DEVICE.get(env.get("device"), "H100-SXM")
    model = {"_gpu": gpu}
    for impl in ("flashsim_standard", "flashsim_fa2"):
        measured[impl] = _try(measure_flashsim, c, impl, reps)
        tiling = measured[impl].get("tiling")
        model[impl] = modelled(c, impl, gpu, tiling)
        log(f"[{time.perf_counter() - t0:5.1f}s] {impl}")
    rows = make_rows(c, measured, env, run_id, model)
    log(f"[{time.perf_counter() - t0:5.1f}s] {len(rows)} rows, run_id {run_id}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m analysis.opbreakdown",
                                 description=__doc__.split("\n\n")[0],
                                 epilog="example: python3 -m analysis.opbreakdown --out op_breakdown.jsonl")
    ap.add_argument("--out", required=True, help="JSON-lines file the rows are appended to")
    for k, v in DEFAULTS.items():
        if k == "causal":
            ap.add_argument("--no-causal", dest="causal", action="store_false",
                            help="no causal mask (default: causal)")
        else:
            ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v,
                            help=f"default {v}")
    ap.add_argument("--reps", type=int, default=30, help="repetitions per timing (>= 20)")
    ap.add_argument("--input-sets", type=int, default=4, help="input copies rotated over")
    ap.add_argument("--run-id", default=None)
    a = ap.parse_args(argv)
    try:
        rows = measure(N=a.N, d=a.d, batch=a.batch, heads=a.heads, dtype=a.dtype,
                       causal=a.causal, dropout_p=a.dropout_p, reps=a.reps,
                       input_sets=a.input_sets, run_id=a.run_id)
    except NoGPU as e:
        print(f"opbreakdown: needs a CUDA GPU and PyTorch: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"opbreakdown: {e}", file=sys.stderr)
        return 2
    with open(a.out, "a") as f:
        for r in rows:
            f.write(json.dumps(r, allow_nan=False) + "\n")
    for r in rows:
        ms = ("error: " + r["error"].splitlines()[0] if r["status"] != "ok"
              else f"{r['measured_ms']:.4f} ms")
        pred = f" (model {r['predicted_ms']:.4f} ms)" if "predicted_ms" in r else ""
        print(f"{r['impl']:<22} p={r['dropout_p']:<4} {str(r['op']):<12} {ms}{pred}")
    print(f"wrote {len(rows)} rows to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
