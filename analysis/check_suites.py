"""The checks of one configuration of the forward, tc and backward suites of `flashsim
check` (analysis.check's docstring gives the criteria): the kernels against the model's
counts and against float64 references, in torch on the GPU or in NumPy.

`_T` is torch while analysis.check.run_checks runs with a torch reference, else None
(NumPy); the array helpers below read it."""
from __future__ import annotations

import math
import time

import numpy as np

import iosim

FP32_BOUND = 1e-5
BWD_FP32_BOUND = 1e-4
TC_L_BOUND = 1e-2
#: fa2 backward: plain vs counted dQ tolerance (float32 atomics: order not reproducible)
DQ_RTOL = {"fp32": 1e-5, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
DQ_ATOL = 1e-6

_T = None   # torch when the reference runs in torch on the GPU, else None (NumPy)


# ---------------------------------------------------------------------------------------
# Array helpers: torch float64 on the GPU, or NumPy
# ---------------------------------------------------------------------------------------
def _to64(x):
    if _T is not None:
        return _T.as_tensor(x, device="cuda").double()
    return np.asarray(x, dtype=np.float64)


def _expand_kv(x64, G):
    if G == 1:
        return x64
    return x64.repeat_interleave(G, dim=1) if _T is not None else np.repeat(x64, G, axis=1)


def _allowed(N, causal, block_mask, B_r, B_c):
    m = iosim.element_mask(N, causal, block_mask, B_r, B_c)
    return _T.as_tensor(m, device="cuda") if _T is not None else m


def _reference(q, k, v, allowed, scale, round_sp=None):
    """float64 (O, L) with the mask; rows that see no key: O = 0, L = -inf. With round_sp
    ('fp16') S and P are rounded to fp16 (the standard algorithm's storage roundings)."""
    q64, k64, v64 = _to64(q), _to64(k), _to64(v)
    G = q64.shape[1] // k64.shape[1]
    k64, v64 = _expand_kv(k64, G), _expand_kv(v64, G)
    if _T is not None:
        torch = _T
        S = scale * (q64 @ k64.transpose(-1, -2))
        if round_sp:
            S = S.to(torch.float16).double()
        S = S.masked_fill(~allowed, float("-inf"))
        m = S.amax(-1, keepdim=True)
        seen = torch.isfinite(m)
        E = torch.exp(S - torch.where(seen, m, torch.zeros_like(m)))
        del S
        l = E.sum(-1, keepdim=True)
        P = torch.where(seen, E / torch.where(seen, l, torch.ones_like(l)), torch.zeros_like(E))
        del E
        if round_sp:
            P = P.to(torch.float16).double()
        L = torch.where(seen, m + torch.log(torch.where(seen, l, torch.ones_like(l))),
                        float("-inf"))[..., 0]
        return P @ v64, L
    S = scale * (q64 @ np.swapaxes(k64, -1, -2))
    if round_sp:
        S = S.astype(np.float16).astype(np.float64)
    S = np.where(allowed, S, -np.inf)
    m = S.max(-1, keepdims=True)
    seen = np.isfinite(m)
    E = np.exp(S - np.where(seen, m, 0))
    l = E.sum(-1, keepdims=True)
    P = np.where(seen, E / np.where(seen, l, 1), 0)
    if round_sp:
        P = P.astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore"):
        L = np.where(seen, m + np.log(np.where(seen, l, 1)), -np.inf)[..., 0]
    return P @ v64, L


def _rel_err(O, ref, rows=None):
    """||O - ref||_F / ||ref||_F, over the query rows `rows` (a bool (N,) mask) if given."""
    if _T is not None:
        d = _T.as_tensor(O, device="cuda").double() - ref
        if rows is not None:
            d, ref = d[..., rows, :], ref[..., rows, :]
        return float(_T.linalg.vector_norm(d) / _T.linalg.vector_norm(ref))
    d = np.asarray(O, np.float64) - ref
    if rows is not None:
        d, ref = d[..., rows, :], ref[..., rows, :]
    return float(np.linalg.norm(d) / np.linalg.norm(ref))


def _round16(x):
    if _T is not None:
        return x.to(_T.float16)
    return x.astype(np.float16)


def _has_nan(O):
    return bool(_T.isnan(O).any()) if _T is not None else bool(np.isnan(O).any())


def _all_finite(x):
    return bool(_T.isfinite(x).all()) if _T is not None else bool(np.isfinite(x).all())


def _identical(a, b):
    return bool(_T.equal(a, b)) if _T is not None else bool(np.array_equal(a, b, equal_nan=True))


def _sync():
    if _T is not None:
        _T.cuda.synchronize()
    else:
        from numba import cuda
        cuda.synchronize()


def _inputs(B, H, Hk, N, d, dtype, seed=0, logit=1.0):
    if _T is not None:
        torch = _T
        g = torch.Generator(device="cuda").manual_seed(seed)
        dt = torch.float16 if dtype == "fp16" else torch.float32
        mk = lambda h, s=1.0: (s * torch.randn((B, h, N, d), generator=g, device="cuda",
                                               dtype=torch.float32)).to(dt)
        return mk(H, logit), mk(Hk), mk(Hk)
    p = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype=dtype)
    q, k, v = iosim.random_inputs(p, seed)
    if logit != 1.0:
        q = (q.astype(np.float32) * logit).astype(q.dtype)
    return q, k, v


def _sdpa_err(q, k, v, causal, allowed, use_mask, scale, ref, rows=None):
    """PyTorch scaled_dot_product_attention (default backend, same dtype) against ref,
    over the rows that see a key (SDPA gives NaN for fully masked rows); None without
    torch."""
    if _T is None:
        return None
    G = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    F = _T.nn.functional
    if use_mask:
        O = F.scaled_dot_product_attention(q, kk, vv, attn_mask=allowed, scale=scale)
        O = _T.nan_to_num(O, nan=0.0)
    else:
        O = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=scale)
    return _rel_err(O, ref, rows)


# ---------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------
def _forward_block_mask(cfg, tiling):
    if not cfg["mask"]:
        return None
    T_r, T_c = tiling.T_r(cfg["N"]), tiling.T_c(cfg["N"])
    rng = np.random.default_rng(1)
    m = rng.random((T_r, T_c)) < 0.6
    if T_r > 1:
        m[1, :] = False                  # an empty query block: O = 0, L = -inf
    return m


def check_forward(cfg: dict, repeats: int = 3) -> dict:
    import gpu
    from gpu import _launch
    alg, N, d, dtype, causal = cfg["alg"], cfg["N"], cfg["d"], cfg["dtype"], cfg["causal"]
    tiling = (iosim.Tiling(*cfg["tiles"]) if cfg["tiles"]
              else gpu.default_tiling(alg, d, dtype, causal))
    mask = _forward_block_mask(cfg, tiling)
    q, k, v = _inputs(cfg["batch"], cfg["heads"], cfg["kv_heads"], N, d, dtype)
    scale = 1.0 / math.sqrt(d)
    kw = dict(algorithm=alg, causal=causal, block_rows=tiling.B_r, block_cols=tiling.B_c,
              block_mask=mask, kernel=cfg.get("kernel") or "auto")
    row = dict(alg=alg, N=N, d=d, dtype=dtype, causal=causal, batch=cfg["batch"],
               heads=cfg["heads"], kv_heads=cfg["kv_heads"], block_mask=mask is not None,
               B_r=tiling.B_r, B_c=tiling.B_c, kernel=cfg.get("kernel") or "auto",
               smem_bytes=iosim.sram_footprint_bytes(alg, tiling.B_r, tiling.B_c, d, dtype))
    problem = iosim.Problem(N=N, d=d, batch=cfg["batch"], heads=cfg["heads"],
                            kv_heads=cfg["kv_heads"], dtype=dtype, causal=causal, block_mask=mask)
    failures = []
    O_c, ledger = gpu.attention(q, k, v, count_traffic=True, **kw)
    _sync()
    cf = iosim.closed_form(alg, problem, tiling)
    row["ledger_ok"] = ledger.counts() == cf.counts()
    row["hbm_bytes"] = ledger.hbm_bytes
    if not row["ledger_ok"]:
        failures.append(f"ledger {ledger.counts()} != closed form {cf.counts()}")
        row["ledger"] = {t: list(c) for t, c in ledger.counts().items()}
        row["closed_form"] = {t: list(c) for t, c in cf.counts().items()}
    O = gpu.attention(q, k, v, **kw)
    _sync()
    times = []
    for _ in range(0 if _launch.SIM else repeats):
        t0 = time.perf_counter()
        gpu.attention(q, k, v, **kw)
        _sync()
        times.append(1e3 * (time.perf_counter() - t0))
    row["ms"] = float(np.median(times)) if times else None
    row["no_nan"] = not _has_nan(O)
    row["count_build_identical"] = _identical(O, O_c)
    if not row["no_nan"]:
        failures.append("NaN in O (an element was not written, or bad numerics)")
    if not row["count_build_identical"]:
        failures.append("counting and plain builds differ")
    allowed = _allowed(N, causal, mask, tiling.B_r, tiling.B_c)
    ref, _L = _reference(q, k, v, allowed, scale)
    row["err"] = _rel_err(O, ref)
    if dtype == "fp32":
        row["bound"] = FP32_BOUND
    else:
        model = (_reference(q, k, v, allowed, scale, round_sp="fp16")[0] if alg == "standard"
                 else ref)
        row["e_model"] = _rel_err(_round16(model), ref)
        row["bound"] = 2 * row["e_model"]
    row["err_sdpa"] = _sdpa_err(q, k, v, causal, allowed, mask is not None, scale, ref)
    if dtype == "fp16" and row["err_sdpa"] is not None:
        row["bound_model"] = row["bound"]
        row["bound"] = 2 * row["err_sdpa"]
    row["acc_ok"] = row["err"] <= row["bound"]
    if not row["acc_ok"]:
        failures.append(f"rel err {row['err']:.3g} > bound {row['bound']:.3g}")
    row["failures"] = failures
    row["ok"] = not failures
    return row


# ---------------------------------------------------------------------------------------
# tc
# ---------------------------------------------------------------------------------------
def _tc_block_mask(T_r, T_c):
    rng = np.random.default_rng(7)
    m = rng.random((T_r, T_c)) < 0.6
    m[0, :] = False            # query block 0 sees nothing: O = 0, L = -inf there
    m[1:, 0] = True
    return m


def check_tc(cfg: dict) -> dict:
    import gpu
    from gpu import api
    N, d, bh, G = cfg["N"], cfg["d"], cfg["bh"], cfg["G"]
    B_r, B_c = cfg["tiles"]
    q, k, v = _inputs(1, bh, bh // G, N, d, "fp16", seed=N * 131 + d, logit=cfg["logit"])
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    bmask = _tc_block_mask(T_r, T_c) if cfg["mask"] == "sparse" else None
    kw = dict(algorithm="fa2", causal=cfg["causal"], block_rows=B_r, block_cols=B_c,
              block_mask=bmask, kernel="tc")
    saved = dict(api.FA2_TC_MT)
    api.FA2_TC_MT[(B_r, B_c, d)] = cfg["MT"]         # the MT under test
    try:
        O, L, ledger = gpu.attention(q, k, v, count_traffic=True, return_stats=True, **kw)
        O2 = gpu.attention(q, k, v, **kw)
        O3 = gpu.attention(q, k, v, **kw)   # a repeat launch: gpu._launch's fast path
    finally:
        api.FA2_TC_MT.clear()
        api.FA2_TC_MT.update(saved)
    _sync()
    prob = iosim.Problem(N=N, d=d, batch=1, heads=bh, kv_heads=bh // G, dtype="fp16",
                         causal=cfg["causal"], block_mask=bmask)
    want = iosim.closed_form("fa2", prob, iosim.Tiling(B_r, B_c)).counts()
    got = ledger.counts()
    scale = 1.0 / math.sqrt(d)
    allow = _allowed(N, cfg["causal"], bmask, B_r, B_c)
    ref, Lref = _reference(q, k, v, allow, scale)
    seen = allow.any(-1)
    unseen = ~seen
    rec = dict(cfg, tiles=list(cfg["tiles"]), counts_equal=got == want,
               all_written=_all_finite(O), identical_plain=_identical(O, O2),
               identical_repeat=_identical(O2, O3))
    if got != want:
        rec["counts"], rec["want"] = str(got), str(want)
    rec["rel_err"] = _rel_err(O, ref, seen)
    rec["masked_rows"] = int(unseen.sum())
    O0, L0 = O[0], L[0]
    if _T is not None:
        rec["masked_rows_ok"] = bool((O0[:, unseen, :] == 0).all() and
                                     _T.isneginf(L0[:, unseen]).all())
        rec["L_err"] = float((L0[:, seen].double() - Lref[0][:, seen]).abs().max())
    else:
        rec["masked_rows_ok"] = bool((O0[:, unseen, :] == 0).all() and
                                     np.isneginf(L0[:, unseen]).all())
        rec["L_err"] = float(np.abs(L0[:, seen].astype(np.float64) - Lref[0][:, seen]).max())
    rec["e_model"] = _rel_err(_round16(ref), ref, seen)
    try:
        rec["sdpa_err"] = _sdpa_err(q, k, v, cfg["causal"], allow, bmask is not None, scale,
                                    ref, seen)
    except Exception as exc:   # recorded: the bound falls back to the model's
        rec["sdpa_err"] = None
        rec["sdpa_error"] = repr(exc)[:200]
    rec["bound"] = 2 * rec["sdpa_err"] if rec["sdpa_err"] else 2 * rec["e_model"]
    failures = []
    if not rec["counts_equal"]:
        failures.append(f"ledger {got} != closed form {want}")
    if not rec["all_written"]:
        failures.append("O not finite everywhere (unwritten or bad numerics)")
    if not rec["identical_plain"]:
        failures.append("counting and plain builds differ")
    if not rec["identical_repeat"]:
        failures.append("a repeat launch (fast launch path) gave a different O")
    if not rec["rel_err"] <= rec["bound"]:
        failures.append(f"rel err {rec['rel_err']:.3g} > bound {rec['bound']:.3g}")
    if not rec["masked_rows_ok"]:
        failures.append("rows that see no key: O != 0 or L != -inf")
    if not rec["L_err"] <= TC_L_BOUND:
        failures.append(f"max |L - L_ref| {rec['L_err']:.3g} > {TC_L_BOUND}")
    rec["failures"] = failures
    rec["ok"] = not failures
    return rec


# ---------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------
def _bwd_inputs(cfg):
    p = iosim.Problem(N=cfg["N"], d=cfg["d"], batch=cfg["batch"], heads=cfg["heads"],
                      dtype=cfg["dtype"], causal=cfg["causal"])
    q, k, v = iosim.random_inputs(p, 0)
    do = np.random.default_rng(1).standard_normal(q.shape).astype(q.dtype)
    if _T is not None:
        q, k, v, do = (_T.as_tensor(x, device="cuda") for x in (q, k, v, do))
    return p, q, k, v, do


def _ref_grads(q, k, v, do, causal):
    """float64 gradients (torch on the GPU, else iosim's NumPy reference)."""
    if _T is None:
        return iosim.reference_attention_backward(q, k, v, do, causal=causal)
    torch = _T
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


def _time_ms(fn, repeats, warmup):
    if _T is None or repeats <= 0:
        return None
    for _ in range(warmup):
        fn()
    _T.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        a, b = _T.cuda.Event(enable_timing=True), _T.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        _T.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def _torch_fwd_bwd(q, k, v, do, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch = _T
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


def _bwd_forward(alg, q, k, v, causal, tiling):
    """(O, stats) of the forward that feeds `alg`'s backward: fa2 its own (O, L); fa1
    (O, (1, L)); standard the S / softmax / PV kernels keeping P, with the backward's
    tiling (the backward reads P over its active tiles)."""
    from gpu.api import attention
    from gpu.backward.standard import standard_forward
    if alg == "fa2":
        return attention(q, k, v, algorithm="fa2", causal=causal, return_stats=True)
    if alg == "fa1":
        O, L = attention(q, k, v, algorithm="fa1", causal=causal, return_stats=True)
        ones = _T.ones_like(L) if _T is not None else np.ones_like(L)
        return O, (ones, L)
    return standard_forward(q, k, v, causal=causal, block_rows=tiling.B_r,
                            block_cols=tiling.B_c)


def fp16_model(alg, q, k, v, o, do, causal, B_c):
    """(dq, dk, dv) in float64 with the fp16 storage roundings `alg`'s schedule makes and
    nothing else: fa1/fa2: O (from the forward) in fp16, D = rowsum(dO o O); fa1: dQ
    rounded after every key block of B_c columns (Algorithm 4 line 22); standard: S and
    P (forward), dP and dS (Algorithm 3 lines 2-3) rounded; all: each query head's dK_h,
    dV_h rounded before the group sum, final gradients rounded."""
    if _T is not None:
        torch = _T
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
    stated tolerance (analysis.check's docstring: backward)."""
    if _T is not None:
        to64 = lambda x: x.double()
        same = lambda a, b: bool(_T.equal(a, b))
        amax = lambda x: float(x.abs().max())
        absf = lambda x: x.abs()
    else:
        to64 = lambda x: np.asarray(x, np.float64)
        same = lambda a, b: bool(np.array_equal(a, b))
        amax = lambda x: float(np.abs(x).max())
        absf = np.abs
    bits = {n: same(a, b) for n, a, b in zip(("dq", "dk", "dv"), counted, plain)}
    det = {"dq": alg != "fa2", "dk": True, "dv": True}
    out = {"bit_identical": bits}
    ok = all(bits[n] for n in bits if det[n])
    if alg == "fa2":
        a, b = to64(plain[0]), to64(counted[0])
        diff, scale = absf(a - b), amax(b)
        within = bool((diff <= DQ_ATOL * scale + DQ_RTOL[dt] * absf(b)).all())
        out["dq_policy"] = (f"|plain - counted| <= {DQ_ATOL:g} max|dQ| + {DQ_RTOL[dt]:.3g} |dQ| "
                            f"(float32 atomic adds into dQacc: order not reproducible)")
        out["dq_max_abs_diff"] = amax(diff)
        out["dq_max_diff_over_max"] = amax(diff) / scale if scale else 0.0
        out["dq_within_tolerance"] = within
        ok = ok and within
    else:
        out["policy"] = "dQ, dK, dV bit-identical (deterministic kernels)"
    return ok, out


def _torch_case(q, k, v, do, causal, dt, ref, repeats):
    """err_torch and the SDPA timings of one (N, dtype, causal), shared by its rows."""
    if _T is None:
        return {}
    out = {}
    run, leaves = _torch_fwd_bwd(q, k, v, do, causal, None)
    run()
    out["err_torch"] = {n: _rel_err(x.grad, r) for n, x, r in zip(("dq", "dk", "dv"), leaves, ref)}
    del run, leaves
    out["ms"] = {}
    if repeats > 0:
        for be in ("MATH", "EFFICIENT") + (("FLASH",) if dt == "fp16" else ()):
            try:
                run, _ = _torch_fwd_bwd(q, k, v, do, causal, be)
                out["ms"][f"sdpa_{be}"] = _time_ms(run, repeats, 2)
            except Exception as exc:  # backend not available for this case
                out["ms"][f"sdpa_{be}"] = None
                out.setdefault("notes", []).append(f"{be}: {type(exc).__name__}: {exc}"[:200])
    _T.cuda.empty_cache()
    return out


def check_backward(cfg: dict, repeats: int = 5) -> list[dict]:
    """One row per algorithm of cfg['algs'], all on the same inputs."""
    from gpu.backward import attention_backward, default_backward_tiling
    p, q, k, v, do = _bwd_inputs(cfg)
    N, d, dt, causal = p.N, p.d, p.dtype, p.causal
    ref = _ref_grads(q, k, v, do, causal)
    shared = _torch_case(q, k, v, do, causal, dt, ref, repeats)
    rows = []
    for alg in cfg["algs"]:
        t0 = time.perf_counter()
        tiling = default_backward_tiling(d, dt, alg, causal=causal)
        row = {"algorithm": alg, "N": N, "d": d, "batch": p.batch, "heads": p.heads,
               "dtype": dt, "causal": causal, "B_r": tiling.B_r, "B_c": tiling.B_c}
        O, stats = _bwd_forward(alg, q, k, v, causal, tiling)
        (dq, dk, dv), ledger = attention_backward(q, k, v, O, do, stats, algorithm=alg,
                                                  causal=causal, count_traffic=True)
        closed = iosim.backward_closed_form(alg, p, tiling)
        row["counts_equal"] = ledger.counts() == closed.counts()
        if not row["counts_equal"]:
            row["counts_kernel"] = {t: list(c) for t, c in ledger.counts().items()}
            row["counts_closed"] = {t: list(c) for t, c in closed.counts().items()}
        row["hbm_bytes"] = int(closed.hbm_bytes)
        row["all_finite"] = all(_all_finite(g) for g in (dq, dk, dv))
        plain = attention_backward(q, k, v, O, do, stats, algorithm=alg, causal=causal)
        row["plain_matches_counted"], row["plain_vs_counted"] = compare_plain_counted(
            alg, dt, (dq, dk, dv), plain)
        del plain
        row["err"] = {n: _rel_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref)}
        del dq, dk, dv
        if "err_torch" in shared:
            row["err_torch"] = shared["err_torch"]
        worst = max(row["err"].values())
        if dt == "fp32":
            row["acc_ok"] = worst <= BWD_FP32_BOUND
        else:
            model = fp16_model(alg, q, k, v, O, do, causal, tiling.B_c)
            row["err_model"] = {n: _rel_err(m, r) for n, m, r in zip(("dq", "dk", "dv"), model, ref)}
            del model
            row["model_ok"] = all(row["err"][n] <= 2 * row["err_model"][n] for n in row["err"])
            if "err_torch" in row:
                row["torch_ok"] = worst <= 2 * max(row["err_torch"].values()) + 1e-4
            row["acc_ok"] = row["model_ok"]
        del O, stats
        failures = []
        if not row["counts_equal"]:
            failures.append("ledger != iosim.backward_closed_form")
        if not row["all_finite"]:
            failures.append("a gradient is not finite (unwritten or bad numerics)")
        if not row["plain_matches_counted"]:
            failures.append("plain and counted builds differ beyond the policy")
        if not row["acc_ok"]:
            failures.append(f"max rel err {worst:.3g} over its bound")
        if _T is not None and repeats > 0:
            def ours(q=q, k=k, v=v, do=do):
                O_, st = _bwd_forward(alg, q, k, v, causal, tiling)
                attention_backward(q, k, v, O_, do, st, algorithm=alg, causal=causal)
            reps = min(repeats, 3) if alg == "fa1" else repeats
            row["ms"] = {f"ours_{alg}": _time_ms(ours, reps, 1 if alg == "fa1" else 2)}
            row["ms"].update(shared.get("ms", {}))
            if "notes" in shared:
                row["notes"] = shared["notes"]
            _T.cuda.empty_cache()
        row["failures"] = failures
        row["ok"] = not failures
        row["row_s"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
    del ref, q, k, v, do
    if _T is not None:
        _T.cuda.empty_cache()
    return rows
