"""`flashsim check --suite variants`: the flash-attn test matrix, forward and backward.

The goal (issue 18): head dims d in {32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224,
256}; (N_q, N_k) in {(113, 203), (128, 217), (113, 211), (108, 256), (256, 512),
(512, 256), (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048)}; non-causal, causal,
local windows; fp16, bf16, fp32; grouped K/V; each run with error <= 2 x PyTorch's in the
same dtype + 1e-5, forward and backward.

Covering design (`configs`). The full cross product (12 d x 10 pairs x 4 masks x 3 dtypes
x 3 head layouts = 4,320) is too large to compile and run; the plan takes, for every
(d, dtype) (36 groups), ROWS_PER_GROUP = 8 rows, row t of group (i, j) (i: d's index,
j: the dtype's) taking
    pair  PAIRS[(3 i + 7 j + t) mod 10]     (8 of the 10 pairs per group, all 10 per d)
    mask  MASKS[(t + i + j) mod 4]          (every mask twice per group)
    heads HEADS[(t + i + 2 j) mod 3]        (MHA 4/4, GQA 4/2, MQA 4/1)
with batch 2: 288 rows. So every d meets every pair and every mask in every dtype's
rows, every pair meets many d (about 29 rows each), and every (dtype, mask), (dtype,
heads), (pair, mask) combination occurs (`coverage`, checked by the tests). Masks, in the
conventions of iosim.Problem (bottom-right aligned, o = N_k - N_q; query row r sees key
c iff ...):
    none           every key
    causal         c <= r + o
    window         r + o - 64 <= c <= r + o + 32          (window=(64, 32))
    causal-window  r + o - 128 <= c <= r + o              (causal, window=(128, 0))
Rows with N_q > N_k and a causal mask have query rows that see no key.
`quick` (GPU, ~30 rows): for each d two of its dtype groups (dtype index i mod 3 and
i + 1 mod 3), one row each (t = 2 i + 4 j + 4 mod 8): 24 rows over all 12 d, 3 dtypes,
4 masks (each with each dtype), 10 pairs, 3 head layouts (each with each dtype). `sim` (no GPU): 7 tiny rows (N <= 48, d in {12, 16, 32, 59}, windows (8, 4) and
(12, 0) scaled to N) in Numba's CUDA simulator. Deterministic: no randomness in the plan,
inputs seeded from the row.

One row, what the user gets (`check`): fa2 through gpu.attention(q, k, v, causal=...,
window=..., return_stats=True) with kernel='auto', then gpu.backward.attention_backward
on its O and L, with dO random:
  * counts: the instrumented builds' ledgers equal iosim.closed_form and
    iosim.backward_closed_form for the tiling that ran, exactly;
  * written: outputs are poisoned with NaN before each launch; O, dQ, dK, dV finite;
    the counting and plain builds give the same O (bit-identical; L's identity is
    recorded, as L_identical) and gradients
    (check.compare_plain_counted: dQ within its atomics tolerance);
  * rows that see no key: O = 0, L = -inf, dQ = 0; L within TC_L_BOUND of float64's
    elsewhere;
  * accuracy: err(x) = max|x - x_ref| / max|x_ref| (relative max-abs error; O and dQ
    over the rows that see a key) against float64 of the same inputs with the same
    mask, for x in O, dQ, dK, dV; pass iff err <= 2 err_torch + 1e-5 where err_torch is
    PyTorch SDPA's error in the same dtype (explicit boolean attn_mask, K/V heads
    repeated; run on the rows that see a key, as SDPA gives NaN on the others). Without
    torch (the simulator) err_torch is replaced by e_model, the error of float64
    attention with only the storage roundings to the dtype (O, and O's rounding in
    D = rowsum(dO o O), dQ, each head's dK, dV before the group sum, the sums).
A row's status is `pass`, `fail` (a failure above, or an exception other than the
refusal), or `refused`: gpu.attention or attention_backward refused the input with a
ValueError (e.g. a dtype it does not take yet); the message is kept, the row is not
counted as passed or failed, and the summary says how many were refused. Each row
records the kernels that ran (forward, backward: tc / fast / plain, read off their
launches), d, N_q, N_k, dtype, mask, heads / kv_heads, the errors, bounds and seconds.

Sharding (`shard`): groups of rows that share compiled kernels (same d and dtype) are
dealt out round-robin, so `--shard I/N` runs every N-th group starting at I and no two
shards compile the same kernels. The groups run d by d with the dtypes in an order
rotated by d's index, so that with N = 12 (3 groups each) every shard gets one group of
each dtype.
"""
from __future__ import annotations

import math
import time

import numpy as np

import iosim

DS = (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
PAIRS = ((113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256),
         (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048))
#: name -> (causal, window)
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)),
         "window": (False, (64, 32)), "causal-window": (True, (128, 0))}
DTYPES = ("fp16", "bf16", "fp32")
HEADS = ((4, 4), (4, 2), (4, 1))
BATCH = 2
ROWS_PER_GROUP = 8
ABS_SLACK = 1e-5
#: the simulator's rows: (d, N_q, N_k, dtype, mask, window, heads, kv_heads)
SIM_ROWS = ((16, 24, 40, "fp32", "none", (-1, -1), 2, 2),
            (16, 40, 24, "fp16", "causal", (-1, -1), 2, 1),
            (32, 33, 33, "fp16", "window", (8, 4), 2, 2),
            (12, 17, 45, "fp32", "causal-window", (12, 0), 2, 1),
            (59, 20, 28, "fp32", "window", (8, 4), 2, 2),
            (16, 24, 24, "bf16", "causal", (-1, -1), 2, 2),
            (32, 45, 17, "fp16", "causal-window", (12, 0), 2, 2))


def _row(d, pair, mask, dtype, heads, batch=BATCH, window=None):
    causal, win = MASKS[mask]
    return dict(d=d, N_q=pair[0], N_k=pair[1], dtype=dtype, mask=mask, causal=causal,
                window=list(win if window is None else window), batch=batch,
                heads=heads[0], kv_heads=heads[1])


def configs(mode: str) -> list[dict]:
    """The rows of `mode` (module docstring: the covering design), in run order: grouped
    by (d, dtype), each with `group` (its index) for sharding."""
    if mode == "sim":
        return [dict(_row(d, (nq, nk), m, dt, (h, hk), batch=1, window=w), group=g)
                for g, (d, nq, nk, dt, m, w, h, hk) in enumerate(SIM_ROWS)]
    masks = tuple(MASKS)
    out = []
    for i, d in enumerate(DS):
        for jj in range(len(DTYPES)):
            # dtypes in rotated order per d: round-robin shards (`shard`) then mix the
            # dtypes (their kernels differ in compile time: fp16's link tensor-core C++)
            j = (jj + i) % len(DTYPES)
            dt = DTYPES[j]
            g = i * len(DTYPES) + j
            ts = range(ROWS_PER_GROUP)
            if mode == "quick":
                if j not in (i % 3, (i + 1) % 3):
                    continue
                ts = ((2 * i + 4 * j + 4) % ROWS_PER_GROUP,)
            for t in ts:
                out.append(dict(_row(d, PAIRS[(3 * i + 7 * j + t) % len(PAIRS)],
                                     masks[(t + i + j) % len(masks)], dt,
                                     HEADS[(t + i + 2 * j) % len(HEADS)]), group=g))
    return out


def coverage(rows) -> dict:
    """How often each value and each pair of factors occurs: {(f1, f2): {(v1, v2): n}}
    for the factors d, pair, mask, dtype, heads."""
    key = {"d": lambda r: r["d"], "pair": lambda r: (r["N_q"], r["N_k"]),
           "mask": lambda r: r["mask"], "dtype": lambda r: r["dtype"],
           "heads": lambda r: (r["heads"], r["kv_heads"])}
    out = {}
    names = list(key)
    for a in range(len(names)):
        for b in range(a, len(names)):
            fa, fb = names[a], names[b]
            c = out.setdefault((fa, fb), {})
            for r in rows:
                k = (key[fa](r), key[fb](r)) if fa != fb else key[fa](r)
                c[k] = c.get(k, 0) + 1
    return out


def shard(items: list, index: int, count: int, group=lambda item: item) -> list:
    """The items of shard `index` of `count`: the groups (in order of first appearance,
    `group(item)` naming an item's group) numbered g with g mod count == index."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"shard count={count!r} is not allowed; allowed: an integer >= 1")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"shard index={index!r} is not allowed; allowed: 0..{count - 1}")
    order = {}
    for it in items:
        order.setdefault(group(it), len(order))
    return [it for it in items if order[group(it)] % count == index]


def name(cfg) -> str:
    w = tuple(cfg["window"])
    m = cfg["mask"] + (f"{w[0]},{w[1]}" if w != (-1, -1) else "")
    return (f"fa2 d={cfg['d']} {cfg['N_q']}x{cfg['N_k']} {cfg['dtype']} {m} "
            f"H={cfg['heads']}/{cfg['kv_heads']}")


# ---------------------------------------------------------------------------------------
# one row
# ---------------------------------------------------------------------------------------
def _inputs(cfg, T):
    """q, k, v, dO in the row's dtype (torch CUDA tensors with torch T, else NumPy)."""
    B, H, Hk, Nq, Nk, d = (cfg[x] for x in ("batch", "heads", "kv_heads", "N_q", "N_k", "d"))
    seed = (cfg["d"] * 7919 + Nq * 131 + Nk) % (2 ** 31)
    shapes = ((B, H, Nq, d), (B, Hk, Nk, d), (B, Hk, Nk, d), (B, H, Nq, d))
    if T is not None:
        dt = {"fp16": T.float16, "bf16": T.bfloat16, "fp32": T.float32}[cfg["dtype"]]
        g = T.Generator(device="cuda").manual_seed(seed)
        return [T.randn(s, generator=g, device="cuda", dtype=T.float32).to(dt) for s in shapes]
    npdt = iosim.problem.DTYPES[cfg["dtype"]]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s, dtype=np.float32).astype(npdt) for s in shapes]


def kernel_of(launches) -> str:
    """'tc', 'fast' or 'plain': the main kernel among recorded launches (gpu._launch
    .recording), by the module that defines it (the fast backward's pre-pass, which
    every fa2 backward on a GPU runs, does not count)."""
    kinds = set()
    for kern, *_ in launches:
        fn = getattr(kern, "py_func", None) or getattr(kern, "fn", None)
        mod, nm = getattr(fn, "__module__", "") or "", getattr(fn, "__name__", "") or ""
        if mod.endswith("_tc"):
            kinds.add("tc")
        elif mod.endswith("_fast") and "_pre" not in nm:
            kinds.add("fast")
    return "tc" if "tc" in kinds else ("fast" if "fast" in kinds else "plain")


def _maxrel(x, ref, rows=None, T=None):
    """max|x - ref| / max|ref| (over query rows `rows`, a bool (N_q,) mask); NaN in x
    gives NaN (which no bound passes)."""
    if T is not None:
        x = T.as_tensor(x).double()
        ref = T.as_tensor(ref).double()
        if rows is not None:
            r = T.as_tensor(rows, device=x.device)
            x, ref = x[..., r, :], ref[..., r, :]
        den = float(ref.abs().max()) if ref.numel() else 0.0
        num = float((x - ref).abs().max()) if ref.numel() else 0.0
    else:
        x = np.asarray(x, np.float64)
        ref = np.asarray(ref, np.float64)
        if rows is not None:
            x, ref = x[..., rows, :], ref[..., rows, :]
        den = float(np.abs(ref).max()) if ref.size else 0.0
        num = float(np.abs(x - ref).max()) if ref.size else 0.0
    return num / den if den else num


def _reference_torch(T, q, k, v, do, allowed, seen, scale):
    """float64 (O, L, dQ, dK, dV) by autograd of dense attention with the mask, on the
    rows that see a key (the others: O = 0, L = -inf, dQ = 0)."""
    G = q.shape[1] // k.shape[1]
    al = T.as_tensor(allowed, device=q.device)
    sv = T.as_tensor(seen, device=q.device)
    q64 = q[:, :, sv].double().requires_grad_(True)
    k64 = k.double().requires_grad_(True)
    v64 = v.double().requires_grad_(True)
    kk, vv = k64.repeat_interleave(G, 1), v64.repeat_interleave(G, 1)
    S = (scale * (q64 @ kk.transpose(-1, -2))).masked_fill(~al[sv], float("-inf"))
    Ls = T.logsumexp(S, -1)
    Os = T.softmax(S, -1) @ vv
    Os.backward(do[:, :, sv].double())
    B, H, Nq, d = q.shape
    O = T.zeros((B, H, Nq, d), dtype=T.float64, device=q.device)
    L = T.full((B, H, Nq), float("-inf"), dtype=T.float64, device=q.device)
    dq = T.zeros_like(O)
    O[:, :, sv] = Os.detach()
    L[:, :, sv] = Ls.detach()
    dq[:, :, sv] = q64.grad
    return O, L, dq, k64.grad, v64.grad


def _torch_errors(T, q, k, v, do, allowed, seen, scale, mask, ref):
    """PyTorch SDPA's errors in the row's dtype: {O, dq, dk, dv} (O, dQ over the rows that
    see a key), by autograd through scaled_dot_product_attention."""
    G = q.shape[1] // k.shape[1]
    sv = T.as_tensor(seen, device=q.device)
    qs = q[:, :, sv].detach().clone().requires_grad_(True)
    kl, vl = (x.detach().clone().requires_grad_(True) for x in (k, v))
    kk, vv = kl.repeat_interleave(G, 1), vl.repeat_interleave(G, 1)
    F = T.nn.functional
    if mask == "none":
        O = F.scaled_dot_product_attention(qs, kk, vv, scale=scale)
    else:
        am = T.as_tensor(allowed, device=q.device)[sv]
        O = F.scaled_dot_product_attention(qs, kk, vv, attn_mask=am, scale=scale)
    O.backward(do[:, :, sv])
    O_ref, _, dq_ref, dk_ref, dv_ref = ref
    return {"O": _maxrel(O.detach(), O_ref[:, :, sv], T=T),
            "dq": _maxrel(qs.grad, dq_ref[:, :, sv], T=T),
            "dk": _maxrel(kl.grad, dk_ref, T=T), "dv": _maxrel(vl.grad, dv_ref, T=T)}


def rounding_model(q, k, v, do, causal, window, dtype) -> dict:
    """e_model for x in O, dq, dk, dv (NumPy, float64): the error of fa2's float64
    rounding model in `dtype` (iosim.rounding_model_attention / _backward: O rounded once,
    D from the stored O, each query head's dK, dV rounded before the grouped-heads sum)
    against exact float64 attention, over the query rows that see a key."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    kw = dict(causal=causal, window=window)
    O = iosim.reference_attention(q, k, v, **kw)
    exact = iosim.reference_attention_backward(q, k, v, do, **kw)
    O_m = iosim.rounding_model_attention("fa2", q, k, v, dtype=dtype, **kw)
    model = iosim.rounding_model_backward("fa2", q, k, v, O_m, do, dtype=dtype, **kw)
    rows = iosim.element_mask(q.shape[-2], causal, N_k=k.shape[-2], window=window).any(-1)
    return {"O": _maxrel(O_m, O, rows), "dq": _maxrel(model[0], exact[0], rows),
            "dk": _maxrel(model[1], exact[1]), "dv": _maxrel(model[2], exact[2])}


def check(cfg: dict, T=None) -> dict:
    """One row (module docstring). T: torch (reference and SDPA on the GPU) or None
    (NumPy float64 reference, the rounding model's bound)."""
    import gpu
    from gpu import _launch
    from gpu.backward import attention_backward
    from analysis.check_suites import TC_L_BOUND, compare_plain_counted
    t0 = time.perf_counter()
    Nq, Nk, d, dt, causal = cfg["N_q"], cfg["N_k"], cfg["d"], cfg["dtype"], cfg["causal"]
    window = tuple(cfg["window"])
    row = {k: cfg[k] for k in ("d", "N_q", "N_k", "dtype", "mask", "causal", "window",
                               "batch", "heads", "kv_heads")}
    row["window"] = list(window)
    failures = []
    scale = 1.0 / math.sqrt(d)
    allowed = iosim.element_mask(Nq, causal, N_k=Nk, window=window)
    seen = allowed.any(-1)
    row["rows_without_key"] = int((~seen).sum())
    kw = dict(algorithm="fa2", causal=causal, window=window)   # kernel='auto'

    def finish(status, refused=None):
        row["failures"] = failures
        if refused is not None:
            row["refused"] = refused
        row["status"] = "fail" if failures else status
        row["ok"] = row["status"] == "pass"
        row["row_s"] = round(time.perf_counter() - t0, 2)
        return row

    q, k, v, do = _inputs(cfg, T)
    # -- forward ---------------------------------------------------------------------
    try:
        with _launch.recording() as rec:
            O_c, L_c, ledger = gpu.attention(q, k, v, count_traffic=True, return_stats=True,
                                             **kw)
        O, L = gpu.attention(q, k, v, return_stats=True, **kw)
    except ValueError as exc:
        return finish("refused", f"gpu.attention: {exc}"[:500])
    row["kernel_fwd"] = kernel_of(rec)
    row["tiles_fwd"] = [ledger.tiling.B_r, ledger.tiling.B_c]
    problem = iosim.Problem(N=Nq, d=d, batch=cfg["batch"], heads=cfg["heads"],
                            kv_heads=cfg["kv_heads"], dtype=dt, causal=causal, N_k=Nk,
                            window=window)
    want = iosim.closed_form("fa2", problem, ledger.tiling).counts()
    row["counts_fwd_ok"] = ledger.counts() == want
    if not row["counts_fwd_ok"]:
        failures.append(f"forward ledger {ledger.counts()} != closed form {want}")
    if T is not None:
        finite = lambda x: bool(T.isfinite(x).all())
        same = lambda a, b: bool(T.equal(a, b))
    else:
        finite = lambda x: bool(np.isfinite(np.asarray(x, np.float64)).all())
        same = lambda a, b: bool(np.array_equal(np.asarray(a, np.float64),
                                                np.asarray(b, np.float64), equal_nan=True))
    row["O_written"] = finite(O)
    if not row["O_written"]:
        failures.append("O not finite everywhere (unwritten or bad numerics)")
    if not same(O, O_c):
        failures.append("counting and plain forward builds differ")
    row["L_identical"] = same(L, L_c)   # informational (the other suites compare O)
    # -- reference -------------------------------------------------------------------
    if T is not None:
        ref = _reference_torch(T, q, k, v, do, allowed, seen, scale)
    else:
        O_r, L_r = iosim.reference_attention(q, k, v, causal=causal, window=window,
                                             return_lse=True)
        ref = (O_r, L_r) + tuple(iosim.reference_attention_backward(
            q, k, v, do, causal=causal, window=window))
    unseen = ~seen
    if unseen.any():
        if T is not None:
            uv = T.as_tensor(unseen, device=q.device)
            zero_O = bool((O[:, :, uv] == 0).all()) and bool(T.isneginf(L[:, :, uv]).all())
        else:
            zero_O = bool((np.asarray(O, np.float64)[:, :, unseen] == 0).all() and
                          np.isneginf(np.asarray(L)[:, :, unseen]).all())
        row["rows_without_key_ok"] = zero_O
        if not zero_O:
            failures.append("rows that see no key: O != 0 or L != -inf")
    if seen.any():
        if T is not None:
            sv = T.as_tensor(seen, device=q.device)
            row["L_err"] = float((L[:, :, sv].double() - ref[1][:, :, sv]).abs().max())
        else:
            row["L_err"] = float(np.abs(np.asarray(L, np.float64)[:, :, seen]
                                        - ref[1][:, :, seen]).max())
        if not row["L_err"] <= TC_L_BOUND:
            failures.append(f"max |L - L_ref| {row['L_err']:.3g} > {TC_L_BOUND}")
    err = {"O": _maxrel(O, ref[0], seen, T=T)}
    # -- backward --------------------------------------------------------------------
    refused = None
    try:
        with _launch.recording() as rec:
            counted, bledger = attention_backward(q, k, v, O, do, L, count_traffic=True, **kw)
        grads = attention_backward(q, k, v, O, do, L, **kw)
    except ValueError as exc:
        refused = f"attention_backward: {exc}"[:500]
        grads = None
    if grads is not None:
        row["kernel_bwd"] = kernel_of(rec)
        row["tiles_bwd"] = [bledger.tiling.B_r, bledger.tiling.B_c]
        bwant = iosim.backward_closed_form("fa2", problem, bledger.tiling).counts()
        row["counts_bwd_ok"] = bledger.counts() == bwant
        if not row["counts_bwd_ok"]:
            failures.append(f"backward ledger {bledger.counts()} != closed form {bwant}")
        row["grads_written"] = all(finite(g) for g in grads)
        if not row["grads_written"]:
            failures.append("a gradient is not finite (unwritten or bad numerics)")
        same_b, row["plain_vs_counted"] = compare_plain_counted("fa2", dt, counted, grads)
        if not same_b:
            failures.append("counting and plain backward builds differ beyond the policy")
        dq, dk, dv = grads
        if unseen.any():
            if T is not None:
                row["dq_zero_ok"] = bool((dq[:, :, T.as_tensor(unseen, device=q.device)] == 0)
                                         .all())
            else:
                row["dq_zero_ok"] = bool((np.asarray(dq, np.float64)[:, :, unseen] == 0).all())
            if not row["dq_zero_ok"]:
                failures.append("rows that see no key: dQ != 0")
        err["dq"] = _maxrel(dq, ref[2], seen, T=T)
        err["dk"] = _maxrel(dk, ref[3], T=T)
        err["dv"] = _maxrel(dv, ref[4], T=T)
    row["err"] = err
    # -- bounds ----------------------------------------------------------------------
    base = None
    if T is not None:
        try:
            row["err_torch"] = base = _torch_errors(T, q, k, v, do, allowed, seen, scale,
                                                    cfg["mask"], ref)
            row["bound_from"] = "torch"
        except Exception as exc:    # recorded; the bound falls back to the model's
            row["sdpa_error"] = f"{type(exc).__name__}: {exc}"[:300]
            q, k, v, do = (x.float().cpu().numpy() for x in (q, k, v, do))
    if base is None:
        row["err_model"] = base = rounding_model(q, k, v, do, causal, window, dt)
        row["bound_from"] = "model"
    row["bound"] = {n: 2 * base[n] + ABS_SLACK for n in err}
    for n in err:
        if not err[n] <= row["bound"][n]:
            failures.append(f"{n}: err {err[n]:.3g} > bound {row['bound'][n]:.3g}")
    return finish("pass" if refused is None else "refused", refused)


def summary(row: dict) -> str:
    """One line of numbers for a variants row."""
    if "error" in row:
        return f"ERROR {row['error']}"
    if row.get("status") == "refused" and "err" not in row:
        return f"REFUSED {row.get('refused', '')}"[:200]
    e, b = row.get("err", {}), row.get("bound", {})
    errs = " ".join(f"{n} {e[n]:.2e}/{b[n]:.2e}" for n in e if n in b)
    kern = f"{row.get('kernel_fwd', '-')}/{row.get('kernel_bwd', '-')}"
    extra = f"  REFUSED {row['refused']}"[:160] if row.get("refused") else ""
    return f"{kern:<10} err/bound {errs} ({row.get('bound_from')}){extra}"
