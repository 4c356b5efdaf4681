"""The kernels against the model and against float64: what `flashsim check` runs.

Three suites, each a list of configurations (`plan`), each configuration one row with
`ok` and the `failures` that made it not ok:

forward   every forward kernel (standard, fa1, fa2 with their default kernels and the
          plain ones: fp32 standard's and fa1's defaults are gpu.forward.standard_fast and
          fa1_fast; fp32 and fp16;
          causal; >48 KB tilings through the opt-in; grouped K/V; a block mask with an
          empty query block):
          * counts: the instrumented build's ledger equals iosim.closed_form exactly
            (every tensor, reads and writes, in elements);
          * O has no NaN (outputs are poisoned with NaN before each launch: the
            check runs gpu.attention in its poison mode) and the
            counting and plain builds give bit-identical O;
          * accuracy: rel err = ||O - ref||_F / ||ref||_F against float64 attention of the
            same inputs. fp32: <= 1e-5. fp16: <= 2 err_sdpa (PyTorch's own fp16
            scaled_dot_product_attention against the same reference: the project's
            criterion) with torch, else <= 2 e_model (e_model: the unavoidable storage
            roundings in float64: O rounded to fp16 once for fa1/fa2; S, P and O for
            standard). fa1 rounds its O to fp16 after every key block (Algorithm 1 as
            written), so it misses the bound at large N: a known FAIL, shown, not hidden;
          * ms of the plain build (median of `repeats`; informational; on a GPU these
            repeat launches take gpu._launch's fast path).
tc        fp16 fa2 on the tensor cores (`gpu.attention(..., kernel="tc")`): ragged N, d
          in 16..128, causal, grouped K/V, a block mask with an empty query block, logits
          x30, tilings 16 x 16 to 128 x 128, MT = 2 m-tiles per warp: counts exact; O
          finite; rows that see no key have O = 0 and L = -inf; rel err of O (over rows
          that see a key) <= 2 err_sdpa (torch) or 2 e_model; max |L - L_ref| <= 1e-2;
          counting and plain builds bit-identical, and a repeat launch (gpu._launch's
          fast path, which skips Numba's dispatcher) gives the same O. Needs a GPU: the CUDA simulator cannot
          run its linked C++ tile functions, so `sim` mode skips this suite and says so.
backward  gpu.backward (standard, fa1, fa2): counts equal iosim.backward_closed_form;
          gradients finite; plain against counted build (bit-identical where deterministic;
          fa2's dQ, summed by float32 atomics in varying order, within |a - b| <= 1e-6
          max|b| + rtol |b|, rtol 1e-5 fp32 / 2^-10 fp16); fp32 max rel err of dQ, dK, dV
          <= 1e-4; fp16 each <= 2 x a float64 model of the schedule's own fp16 roundings
          (PyTorch's SDPA backward error recorded beside it); fwd+bwd ms against SDPA.
variants  the flash-attn test matrix (analysis/check_variants.py: its covering design):
          d in 32..256 (odd ones too), N_q != N_k, causal, local windows, fp16 / bf16 /
          fp32, grouped K/V; fa2 forward and backward as gpu.attention's kernel='auto'
          runs them; counts exact, outputs written, errors <= 2 x PyTorch SDPA's in the
          same dtype + 1e-5 (a rounding model without torch). A row gpu.attention or
          attention_backward refuses (ValueError) is `refused`: counted apart from
          passes and failures, never hidden. Not in the default suites (288 rows).

Every row has `status` ("pass", "fail" or "refused") and `ok` (status == "pass").
Sharding (`run_checks(..., shard=(i, n))`, `flashsim check --shard I/N`): every n-th
group of configurations that share compiled kernels, from group i (variants: a group is
one (d, dtype); other suites: one configuration), so n processes can split a run;
`merge` joins their results.

Modes: `full` (N in {1024, 4096}, 16 heads; what the H100 runs verified), `quick` (tiny
sizes: seconds; what the sanitizers re-run), `sim` (tiny sizes in Numba's CUDA simulator,
chosen automatically without a GPU). The reference is torch float64 on the GPU when torch
with CUDA is installed (and not `use_torch=False`), NumPy float64 otherwise.

Importing this module does not import numba.cuda: call `analysis.sweeps.ensure_cuda_env()`
(or set NUMBA_ENABLE_CUDASIM) first, as `flashsim check` does.
"""
from __future__ import annotations

import datetime
import math
import statistics
import sys
import time
from typing import Callable

import numpy as np

import iosim

MODES = ("full", "quick", "sim")
SUITES = ("forward", "tc", "backward", "variants")
#: what `flashsim check` and run_checks run when no suite is named
DEFAULT_SUITES = ("forward", "tc", "backward")
FP32_BOUND = 1e-5
BWD_FP32_BOUND = 1e-4
TC_L_BOUND = 1e-2
#: fa2 backward: plain vs counted dQ tolerance (float32 atomics: order not reproducible)
DQ_RTOL = {"fp32": 1e-5, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
DQ_ATOL = 1e-6
TC_NEEDS_GPU = ("needs a CUDA GPU: the CUDA simulator cannot run the tensor-core kernel's "
                "linked C++ tile functions (its PTX builds without a GPU: "
                "gpu.forward.fa2_tc.linked_ptx)")

_T = None   # torch when the reference runs in torch on the GPU, else None (NumPy)


# ---------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------
def forward_configs(mode: str) -> list[dict]:
    """dicts: alg, N, d, dtype, causal, batch, heads, kv_heads, tiles (None = default),
    mask, kernel (None = "auto")."""
    out = []
    if mode == "sim":
        base = dict(d=16, batch=1, heads=2, kv_heads=2, tiles=(16, 16), mask=False, kernel=None)
        for alg in ("standard", "fa1", "fa2"):
            out.append(dict(base, alg=alg, N=24, dtype="fp32", causal=False))
            out.append(dict(base, alg=alg, N=24, dtype="fp16", causal=True))
        out.append(dict(base, alg="fa2", N=40, dtype="fp32", causal=True, kv_heads=1, mask=True))
        out.append(dict(base, alg="fa2", N=40, dtype="fp32", causal=True, kernel="plain"))
        return out
    if mode == "quick":
        Ns, heads, tiles = (80,), 2, (32, 32)
    else:
        Ns, heads, tiles = (1024, 4096), 16, None
    for N in Ns:
        for dtype in ("fp32", "fp16"):
            for alg in ("standard", "fa1", "fa2"):
                for causal in (False, True):
                    out.append(dict(alg=alg, N=N, d=64, dtype=dtype, causal=causal, batch=1,
                                    heads=heads, kv_heads=heads, tiles=tiles, mask=False,
                                    kernel=None))
    N = Ns[0]
    extra = dict(N=N, d=64, batch=1, heads=heads, mask=False, kernel=None)
    # the plain fa2 kernel; the rows above run gpu.forward.fa2_fast / gpu.forward.fa2_tc where they apply
    for dtype in ("fp32", "fp16"):
        out.append(dict(extra, alg="fa2", dtype=dtype, causal=True, kv_heads=heads,
                        tiles=tiles or (32, 32), kernel="plain"))
    # the plain standard and fa1 kernels (fp32 'auto' runs gpu.forward.standard_fast,
    # fa1_fast), and the fast ones with grouped K/V and a block mask
    for alg in ("standard", "fa1"):
        out.append(dict(extra, alg=alg, dtype="fp32", causal=True, kv_heads=heads,
                        tiles=tiles or (64, 64), kernel="plain"))
        out.append(dict(extra, alg=alg, dtype="fp32", causal=True,
                        kv_heads=max(1, heads // 4), tiles=None, mask=True))
    # > 48 KB of dynamic shared memory: exercises the opt-in
    out.append(dict(extra, alg="fa2", dtype="fp32", causal=False, kv_heads=heads, tiles=(64, 64)))
    out.append(dict(extra, alg="fa1", dtype="fp16", causal=True, kv_heads=heads, tiles=(64, 64)))
    out.append(dict(extra, alg="standard", dtype="fp32", causal=True, kv_heads=heads,
                    tiles=(128, 64)))
    # grouped K/V and a block mask with an empty query block
    out.append(dict(extra, alg="fa2", dtype="fp16", causal=True, kv_heads=max(1, heads // 4),
                    tiles=None))
    out.append(dict(extra, alg="fa2", dtype="fp32", causal=True, kv_heads=heads, tiles=None,
                    mask=True))
    return out


def tc_configs(mode: str) -> list[dict]:
    """dicts: N, d, bh (query heads), G (query heads per K/V head), causal, tiles, mask
    ('none' | 'sparse': a random block mask with query block 0 empty), logit (input
    scale), MT (m-tiles of 16 rows per warp). Empty in `sim` mode (see TC_NEEDS_GPU)."""
    if mode == "sim":
        return []
    base = dict(bh=4, G=1, causal=False, tiles=(128, 64), mask="none", logit=1.0, MT=1)
    out = []
    for d in (64, 128, 16, 32, 48, 80, 96):
        for causal in (False, True):
            out.append(dict(base, N=1000, d=d, causal=causal))
    for tiles in ((64, 64), (128, 32), (64, 32), (16, 16), (32, 48), (128, 128)):
        out.append(dict(base, N=333, d=64, tiles=tiles, causal=True))
    out += [dict(base, N=1024, d=64, G=4, bh=8),                      # grouped K/V heads
            dict(base, N=1024, d=64, mask="sparse"),                   # block mask
            dict(base, N=1000, d=128, mask="sparse", causal=True),
            dict(base, N=1024, d=64, logit=30.0),                      # huge logits
            dict(base, N=77, d=64, causal=True, tiles=(64, 16)),
            dict(base, N=1, d=64),
            dict(base, N=4096, d=64, bh=16),
            dict(base, N=4096, d=64, bh=16, causal=True),
            dict(base, N=4096, d=128, bh=16, tiles=(128, 32)),
            # two m-tiles of 16 rows per warp
            dict(base, N=1000, d=64, MT=2), dict(base, N=1000, d=64, MT=2, causal=True),
            dict(base, N=333, d=48, MT=2, tiles=(64, 32), causal=True, mask="sparse"),
            dict(base, N=4096, d=64, bh=16, MT=2, causal=True)]
    # head dims padded to 16 on chip (d real columns loaded and stored); above 128 Q_w is
    # read from shared memory at each k step
    padded = [dict(base, N=1000, d=d, causal=causal) for d in (40, 59, 111, 160, 192, 256)
              for causal in (False, True)]
    out += padded + [dict(base, N=4096, d=256, bh=16), dict(base, N=4096, d=256, bh=16,
                                                            causal=True)]
    if mode == "quick":
        small = [c for c in out if c["N"] <= 1024]
        out = (small[:8] + [c for c in small[8:] if c["MT"] == 2]   # and every MT=2 build
               + [padded[2], padded[11]])                          # d = 59; 256 causal
    return out


def backward_configs(mode: str) -> list[dict]:
    """dicts: N, d, batch, heads, dtype, causal, algs (run on the same inputs)."""
    if mode == "sim":
        plan, d, batch, heads = {a: (40,) for a in ("fa2", "standard", "fa1")}, 16, 1, 2
    elif mode == "quick":
        plan, d, batch, heads = {a: (256,) for a in ("fa2", "standard", "fa1")}, 64, 2, 8
    else:   # fa1 (one thread block per instance: slow) at N=1024 only
        plan, d, batch, heads = {"fa2": (1024, 4096), "standard": (1024, 4096),
                                 "fa1": (1024,)}, 64, 2, 8
    out = []
    for N in sorted({n for ns in plan.values() for n in ns}):
        for dt in ("fp32", "fp16"):
            for causal in (False, True):
                out.append(dict(N=N, d=d, batch=batch, heads=heads, dtype=dt, causal=causal,
                                algs=[a for a in plan if N in plan[a]]))
    return out


ALGORITHMS = ("standard", "fa1", "fa2")


def plan(mode: str, suites=SUITES, algorithms=ALGORITHMS) -> list[tuple[str, dict]]:
    """[(suite, config)] in the order they run; `algorithms` keeps only the configurations
    (and, in the backward suite, the algorithms of a configuration) of those algorithms
    (the tc suite is fa2's)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not known; allowed: {', '.join(MODES)}")
    bad = [a for a in algorithms if a not in ALGORITHMS]
    if bad or not algorithms:
        raise ValueError(f"algorithms={list(algorithms)!r} is not allowed; allowed: a non-empty "
                         f"subset of {', '.join(ALGORITHMS)}")
    from analysis import check_variants
    makers = {"forward": forward_configs, "tc": tc_configs, "backward": backward_configs,
              "variants": check_variants.configs}
    out = []
    for s in suites:
        if s not in makers:
            raise ValueError(f"suite={s!r} is not known; allowed: {', '.join(SUITES)}")
        for c in makers[s](mode):
            if s == "backward":
                algs = [a for a in c["algs"] if a in algorithms]
                if algs:
                    out.append((s, dict(c, algs=algs)))
            elif c.get("alg", "fa2") in algorithms:
                out.append((s, c))
    return out


def n_rows(suite: str, cfg: dict) -> int:
    return len(cfg["algs"]) if suite == "backward" else 1


def shard_plan(cases: list, index: int, count: int) -> list:
    """Shard `index` of `count` of a plan (module docstring: Sharding)."""
    from analysis.check_variants import shard
    return shard(cases, index, count,
                 group=lambda c: (c[0], c[1]["group"]) if c[0] == "variants" else id(c[1]))


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


def forward_name(cfg) -> str:
    kern = "-plain" if cfg.get("kernel") == "plain" else ""
    tiles = f" {cfg['tiles'][0]}x{cfg['tiles'][1]}" if cfg.get("tiles") else ""
    return (f"{cfg['alg']}{kern} N={cfg['N']} d={cfg['d']} {cfg['dtype']}"
            f"{' causal' if cfg['causal'] else ''}{' mask' if cfg['mask'] else ''}"
            f" H={cfg['heads']}/{cfg['kv_heads']}{tiles}")


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


def tc_name(cfg) -> str:
    B_r, B_c = cfg["tiles"]
    name = f"fa2-tc N={cfg['N']} d={cfg['d']} {B_r}x{B_c} MT={cfg['MT']}"
    if cfg["causal"]:
        name += " causal"
    if cfg["mask"] != "none":
        name += " mask"
    if cfg["G"] > 1:
        name += f" G={cfg['G']}"
    if cfg["logit"] != 1:
        name += f" logits x{cfg['logit']:g}"
    return name


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
    stated tolerance (module docstring)."""
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


def backward_name(cfg, alg) -> str:
    return (f"{alg} N={cfg['N']} d={cfg['d']} {cfg['dtype']}"
            f"{' causal' if cfg['causal'] else ''} B={cfg['batch']} H={cfg['heads']}")


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
            def ours():
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


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------
def _fmt(x, spec=".2e"):
    return "-" if x is None else format(x, spec)


def summary(row: dict) -> str:
    """One line of numbers for a row of any suite."""
    s = row.get("suite")
    if "error" in row:
        return f"ERROR {row['error']}"
    if s == "forward":
        return (f"counts {'ok' if row['ledger_ok'] else 'FAIL'}  err {_fmt(row['err'])} "
                f"bound {_fmt(row['bound'])}  sdpa {_fmt(row.get('err_sdpa'))}  "
                f"ms {_fmt(row.get('ms'), '.2f')}")
    if s == "tc":
        return (f"counts {'ok' if row['counts_equal'] else 'FAIL'}  err {_fmt(row['rel_err'])} "
                f"bound {_fmt(row['bound'])}  sdpa {_fmt(row.get('sdpa_err'))}  "
                f"L_err {_fmt(row['L_err'], '.1e')}  masked rows {row['masked_rows']}")
    if s == "variants":
        from analysis.check_variants import summary as variants_summary
        return variants_summary(row)
    if s == "backward":
        em = max(row["err_model"].values()) if "err_model" in row else None
        et = max(row["err_torch"].values()) if "err_torch" in row else None
        ms = row.get("ms", {}).get(f"ours_{row['algorithm']}")
        return (f"counts {'ok' if row['counts_equal'] else 'FAIL'}  err "
                f"{_fmt(max(row['err'].values()))} model {_fmt(em)} torch {_fmt(et)}  "
                f"plain=counted {row['plain_matches_counted']}  ms {_fmt(ms, '.2f')}")
    return ""


def device_name() -> str:
    from gpu import _launch
    if _launch.SIM:
        return "Numba CUDA simulator"
    from numba import cuda
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def versions() -> dict:
    """Versions of what ran the checks (python, numba, numba-cuda, numpy, torch, driver)."""
    import importlib.metadata as md
    import numba
    v = {"python": sys.version.split()[0], "numba": numba.__version__, "numpy": np.__version__}
    for pkg in ("numba-cuda", "cuda-bindings"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    try:
        import torch
        v["torch"] = torch.__version__
        v["torch_cuda"] = torch.version.cuda
    except Exception:
        v["torch"] = None
    from gpu import _launch
    if not _launch.SIM:
        try:
            from numba.cuda.cudadrv.driver import driver
            v["cuda_driver"] = ".".join(str(x) for x in driver.get_version())
        except Exception:
            v["cuda_driver"] = None
    return v


def torch_available() -> bool:
    """torch with CUDA importable and the kernels on a real GPU."""
    from gpu import _launch
    if _launch.SIM:
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def run_checks(mode: str, suites=DEFAULT_SUITES, *, algorithms=ALGORITHMS,
               use_torch: bool | None = None, repeats: int = 3,
               on_row: Callable[[dict], None] | None = None,
               on_case: Callable[[int, int, str], None] | None = None,
               shard: tuple[int, int] | None = None,
               done_rows: list[dict] | None = None) -> dict:
    """Run the checks of `suites` in `mode` and return the result:
    {kind: "check", mode, device, versions, date, commit, reference, suites, skipped:
    [{suite, reason}], shard, rows: [...], n_rows, n_passed, n_failed, n_refused, ok}.
    Each row carries suite, name, status (pass / fail / refused), ok, failures; `ok` of
    the result: no row failed (refused rows are counted in n_refused, not as failures).
    shard=(i, n): only shard i of n (`shard_plan`). on_row(row) is called as each row is
    made; on_case(done, total, name) after each configuration (progress). done_rows: rows
    an interrupted run of the same plan already made (each carries `case`, the name of the
    configuration that made it): those configurations are not run again and their rows
    are part of the result."""
    global _T
    from gpu import _launch
    if mode != "sim" and _launch.SIM:
        raise ValueError(f"mode={mode!r} needs a CUDA GPU; without one run mode='sim' (the "
                         f"CUDA simulator at tiny sizes)")
    if use_torch is None:
        use_torch = torch_available()
    elif use_torch and not torch_available():
        raise ValueError("use_torch=True needs PyTorch with CUDA and a GPU")
    if use_torch:
        import torch
        _T = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        _T = None
    from analysis.results import current_commit
    skipped = []
    if "tc" in suites and mode == "sim":
        skipped.append({"suite": "tc", "reason": TC_NEEDS_GPU})
    cases = plan(mode, suites, algorithms)
    if shard is not None:
        cases = shard_plan(cases, *shard)
    total = len(cases)
    rows = list(done_rows or [])
    done = {r.get("case") for r in rows}
    t_start = time.perf_counter()
    from gpu import api as _api
    poison_before = _api.set_poison(True)   # validation: unwritten elements show as NaN

    def add(row):
        row.setdefault("status", "pass" if row["ok"] else "fail")
        row["case"] = case
        rows.append(row)
        if on_row:
            on_row(row)

    try:
        for i, (suite, cfg) in enumerate(cases):
            t0 = time.perf_counter()
            case = case_name(suite, cfg)
            if case in done:             # made by the interrupted run: kept, not rerun
                if on_case:
                    on_case(i + 1, total, case)
                continue
            if suite == "forward":
                name = forward_name(cfg)
                try:
                    row = check_forward(cfg, repeats=repeats)
                except Exception as exc:   # one broken config must not hide the others
                    row = dict(cfg, tiles=list(cfg["tiles"]) if cfg["tiles"] else None,
                               error=f"{type(exc).__name__}: {exc}"[:400], ok=False,
                               failures=[f"{type(exc).__name__}: {exc}"[:400]])
                row.update(suite=suite, name=name, s=round(time.perf_counter() - t0, 2))
                add(row)
            elif suite == "tc":
                name = tc_name(cfg)
                try:
                    row = check_tc(cfg)
                except Exception as exc:
                    row = dict(cfg, tiles=list(cfg["tiles"]), ok=False,
                               error=f"{type(exc).__name__}: {exc}"[:400],
                               failures=[f"{type(exc).__name__}: {exc}"[:400]])
                row.update(suite=suite, name=name, s=round(time.perf_counter() - t0, 2))
                add(row)
            elif suite == "variants":
                from analysis import check_variants
                name = check_variants.name(cfg)
                try:
                    row = check_variants.check(cfg, _T)
                except Exception as exc:   # not a refusal (check_variants.check keeps those)
                    row = dict(cfg, ok=False, status="fail",
                               error=f"{type(exc).__name__}: {exc}"[:400],
                               failures=[f"{type(exc).__name__}: {exc}"[:400]])
                row.update(suite=suite, name=name, s=round(time.perf_counter() - t0, 2))
                add(row)
                if _T is not None:
                    _T.cuda.empty_cache()
            else:
                name = case
                try:
                    made = check_backward(cfg, repeats=repeats)
                except Exception as exc:
                    made = [dict(algorithm=a, N=cfg["N"], d=cfg["d"], dtype=cfg["dtype"],
                                 causal=cfg["causal"], ok=False,
                                 error=f"{type(exc).__name__}: {exc}"[:400],
                                 failures=[f"{type(exc).__name__}: {exc}"[:400]])
                            for a in cfg["algs"]]
                for row, alg in zip(made, cfg["algs"]):
                    row.update(suite=suite, name=backward_name(cfg, alg))
                    add(row)
            if on_case:
                on_case(i + 1, total, name)
    finally:
        _T = None
        _api.set_poison(poison_before)
    return finish_result({
            "kind": "check", "mode": mode, "device": device_name(), "versions": versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": current_commit(),
            "reference": "torch float64 on the GPU" if use_torch else "NumPy float64",
            "suites": list(suites), "skipped": skipped,
            "shard": None if shard is None else list(shard),
            "criteria": {"ledger": "counts == iosim.closed_form exactly",
                         "forward fp32": f"rel err <= {FP32_BOUND:g}",
                         "fp16": "rel err <= 2 x PyTorch SDPA's fp16 error (with torch), "
                                 "else 2 x e_model",
                         "backward fp32": f"max rel err <= {BWD_FP32_BOUND:g}",
                         "backward fp16": "each rel err <= 2 x the schedule's fp16 model",
                         "variants": "max|x - ref| / max|ref| <= 2 x PyTorch SDPA's in the "
                                     "same dtype + 1e-5 (without torch: 2 x the storage "
                                     "rounding model + 1e-5), x in O, dQ, dK, dV"},
            "rows": rows, "total_s": round(time.perf_counter() - t_start, 1)})


def case_name(suite: str, cfg: dict) -> str:
    """The name of one configuration of a plan (its rows carry it as `case`)."""
    if suite == "forward":
        return forward_name(cfg)
    if suite == "tc":
        return tc_name(cfg)
    if suite == "variants":
        from analysis import check_variants
        return check_variants.name(cfg)
    return f"backward N={cfg['N']} {cfg['dtype']}{' causal' if cfg['causal'] else ''}"


def finish_result(result: dict) -> dict:
    """Set n_rows, n_passed, n_failed, n_refused and ok from result["rows"]."""
    rows = result["rows"]
    status = [r.get("status", "pass" if r["ok"] else "fail") for r in rows]
    result.update(n_rows=len(rows), n_passed=status.count("pass"),
                  n_failed=status.count("fail"), n_refused=status.count("refused"),
                  ok=status.count("fail") == 0)
    return result


def merge(results: list[dict]) -> dict:
    """One result from the results of shards (or any runs) of the same mode: their rows
    concatenated, skipped suites joined, totals recounted; device, versions, commit and
    reference from the first (a ValueError if they differ in mode, device or commit)."""
    if not results:
        raise ValueError("results=[] is not allowed; allowed: one or more check results")
    first = results[0]
    for r in results[1:]:
        for key in ("kind", "mode", "device", "commit", "reference"):
            if r.get(key) != first.get(key):
                raise ValueError(f"results differ in {key}: {first.get(key)!r} and "
                                 f"{r.get(key)!r}; allowed: results of one run")
    out = {k: v for k, v in first.items() if not k.startswith("n_")}
    out["rows"] = [row for r in results for row in r["rows"]]
    out["suites"] = sorted({s for r in results for s in r["suites"]},
                           key=lambda s: SUITES.index(s) if s in SUITES else len(SUITES))
    out["skipped"] = [s for i, r in enumerate(results) for s in r["skipped"]
                      if s not in [x for q in results[:i] for x in q["skipped"]]]
    out["shard"] = [r.get("shard") for r in results]
    out["total_s"] = round(sum(r.get("total_s", 0) for r in results), 1)
    return finish_result(out)


# ---------------------------------------------------------------------------------------
# PTX (no GPU needed: NVVM only)
# ---------------------------------------------------------------------------------------
#: Linked builds of the fa2 tensor-core kernels that `flashsim check --ptx` compiles
#: (tc_ptx_check): forward (B_r, B_c, d, causal, has_mask, count, MT, window, dt) and
#: backward (B_r, B_c, d, causal, has_mask, count, MT, kreg, DN, dt[, window]); the first
#: of each list are the --quick ones. fp16 and bf16; head dims padded to 16 on chip (40,
#: 59, 111) and above 128 (forward: 160, 256, Q read from shared at each k step).
TC_PTX_FORWARD = [(128, 64, 64, True, False, True, 1, False, "bf16"),
                  (128, 64, 59, True, True, True, 1, False, "fp16"),
                  (128, 64, 256, False, False, False, 1, False, "fp16"),
                  (128, 64, 64, False, False, False, 1, False, "fp16"),
                  (64, 64, 128, True, False, False, 1, True, "bf16"),
                  (128, 64, 40, False, False, True, 1, False, "bf16"),
                  (128, 64, 160, True, False, False, 1, False, "fp16"),
                  (128, 64, 256, True, True, True, 1, False, "bf16")]
#: fa1's tensor-core kernel (gpu.forward.fa1_tc) in bf16: (B_r, B_c, d, causal, has_mask,
#: count, MT, stages, dt) (not in --quick)
TC_PTX_FA1 = [(128, 128, 64, True, False, True, 1, 3, "bf16")]
TC_PTX_BACKWARD = [(64, 128, 64, True, False, True, 1, False, 64, "bf16"),
                   (64, 128, 64, False, False, False, 1, False, 32, "fp16"),
                   (32, 64, 128, False, False, False, 1, False, 32, "bf16"),
                   (64, 128, 59, True, True, True, 1, False, 64, "bf16"),
                   (32, 64, 111, False, False, False, 1, False, 16, "fp16"),
                   # a local window (N_k != N_q and windows, issue 18): the band's lower
                   # edge compiled in
                   (64, 128, 64, True, False, True, 1, False, 64, "fp16", True)]


def tc_ptx_check(quick: bool = False, out=print) -> list[str]:
    """The tensor-core kernels' linked PTX (fa2: TC_PTX_FORWARD, TC_PTX_BACKWARD, quick:
    the first of each; fa1: TC_PTX_FA1, not quick): the C++ inlined (no call), nothing in
    local memory, no .f64, the mma.sync count its loops imply in the dtype's form (f16 /
    bf16), atomics in the forward iff counting, dQ reductions in every backward build
    (vector ones for even d). NVVM, NVRTC and nvJitLink, no GPU. Returns the failures."""
    import re
    from gpu.backward import fa2_tc as bwd_tc
    from gpu.forward import fa2_tc

    def one(name, ptx, want_mma, dt, atom_ok):
        mma = ptx.count("mma.sync")
        bf = ptx.count(".bf16.bf16.f32")
        local = ptx.count(".local")
        call = len([ln for ln in ptx.splitlines() if ln.strip().startswith("call")])
        f64 = len(re.findall(r"\.f64\b", ptx))
        ok = (mma == want_mma and bf == (mma if dt == "bf16" else 0) and not local
              and not call and not f64 and atom_ok)
        out(f"{name:<52} mma={mma:<4} {dt} local={local} call={call} f64={f64} "
            f"{'ok' if ok else 'FAIL'}")
        return [] if ok else [name]

    failures = []
    for B_r, B_c, d, causal, mask, count, MT, window, dt in (
            TC_PTX_FORWARD[:1] if quick else TC_PTX_FORWARD):
        ptx = fa2_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, window=window, dt=dt)
        D = fa2_tc.padded(d)
        name = fa2_tc.get_kernel(B_r, B_c, d, causal, mask, count, MT, window,
                                 dt).py_func.__name__
        failures += one(name, ptx, 4 * (B_c // 16) * (D // 16) * MT, dt,
                        (ptx.count("atom.") > 0) == count)
    for B_r, B_c, d, causal, mask, count, MT, kreg, DN, dt, *win in (
            TC_PTX_BACKWARD[:1] if quick else TC_PTX_BACKWARD):
        window = bool(win and win[0])
        ptx = bwd_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, kreg, DN, dt=dt,
                                window=window)
        name = bwd_tc.get_kernel(B_r, B_c, d, causal, mask, count, MT, kreg, DN,
                                 dt, window).py_func.__name__
        want = 4 * (B_r // 8) * (bwd_tc.padded(d) // 16) * MT + (B_c // 16) * (DN // 8)
        # dQ: pairs in vector reductions; odd d (pairs not 8-byte aligned): single floats
        dq_ok = (ptx.count("red.global.add.v2") > 0 if d % 2 == 0 else
                 ptx.count("global.add.f32") > 0)
        failures += one(name, ptx, want, dt, dq_ok)
    from gpu.forward import fa1_tc
    for B_r, B_c, d, causal, mask, count, MT, st, dt in ([] if quick else TC_PTX_FA1):
        ptx = fa1_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, st, dt=dt)
        name = fa1_tc.get_kernel(B_r, B_c, d, causal, mask, count, MT, st,
                                 dt).py_func.__name__
        failures += one(name, ptx, 4 * (B_c // 16) * (d // 16) * MT, dt,
                        (ptx.count("atom.") > 0) == count)
    return failures


def ptx_check(quick: bool = False, out=print) -> list[str]:
    """Compile every CUDA-core forward kernel (d=64, 64x64 tiles, all flags) for cc 9.0
    and check: no .f64 instruction; atomics present iff the counting build; the fast fa2,
    standard and fa1 kernels use 16-byte shared loads (ld.shared.v4.f32). The plain fa2
    backward's main kernel and its varlen twin: no .f64, atomics (dQ) in every build, more
    in the counting one. Then the fa2 tensor-core kernels' linked builds (tc_ptx_check).
    quick: fp16 causal only (tensor cores: one forward, one backward build). Needs
    NUMBA_ENABLE_CUDASIM=0 (NVVM, NVRTC, nvJitLink), not a GPU. Returns the failures."""
    import re
    from numba import cuda
    from numba.cuda import types as T
    from gpu import _launch
    from gpu.forward import fa1, fa1_fast, fa2, fa2_fast, fa2_varlen, standard, standard_fast
    A = lambda dt, nd: T.Array(dt, nd, "C")
    U8, I64, F32 = A(T.uint8, 2), A(T.int64, 2), A(T.float32, 2)
    failures = []
    for dt in (("fp16",) if quick else ("fp32", "fp16")):
        X = A(_launch.NB_DTYPE[dt], 3)
        for count in (False, True):
            for causal in ((True,) if quick else (False, True)):
                # scale, N, N_k, lo, hi, H, G (gpu.forward._band: the band arguments)
                scal = (T.float32,) + (T.int64,) * 6
                ks = [(fa2.fa2_forward_kernel(64, 64, 64, dt, causal, True, count, 128),
                       (X, X, X, X, F32) + scal + (U8, I64)
                       + (T.uint64,) * 4 + (T.float32,)),     # dropout (gpu._philox)
                      (fa1.fa1_forward_kernel(64, 64, 64, dt, causal, True, count, 128),
                       (X, X, X, X, F32, F32) + scal + (U8, I64)),
                      (standard.s_kernel(64, 64, 64, dt, causal, count, 128),
                       (X, X, X, A(T.int32, 2)) + scal + (I64,)),
                      (standard.softmax_kernel(64, 64, causal, True, count, 128),
                       (X, X, U8) + (T.int64,) * 4 + (I64,)),
                      (standard.pv_kernel(64, 64, 64, dt, causal, True, count, 128),
                       (X, X, X, T.float32, U8) + (T.int64,) * 6 + (I64,)),
                      (fa2_fast.fa2_fast_kernel(128, 64, 64, dt, causal, True, count, 128, 8,
                                                True), fa2_fast.signature(dt)),
                      (standard_fast.s_kernel(128, 128, 64, dt, causal, False, count, 256),
                       standard_fast.signatures(dt)["S"]),
                      (standard_fast.pv_kernel(128, 128, 64, dt, causal, False, True, count,
                                               256), standard_fast.signatures(dt)["PV"]),
                      (standard.softmax_kernel(128, 128, causal, True, count, 256, False,
                                               False, True), standard_fast.signatures(dt)[
                                                   "softmax"]),
                      # the dense rows' flat sweep (no band, no mask: FLAT)
                      (standard.softmax_kernel(128, 128, False, False, count, 256, False,
                                               False, True), standard_fast.signatures(dt)[
                                                   "softmax"]),
                      (fa1_fast.fa1_fast_kernel(128, 64, 64, dt, causal, False, True, count,
                                                256, True), fa1_fast.signature(dt)),
                      (fa2_varlen.fa2_varlen_kernel(64, 64, 64, dt, causal, count, 128),
                       fa2_varlen.signature(dt))]
                for kern, sig in ks:
                    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))
                    name = kern.py_func.__name__
                    f64 = len(re.findall(r"\.f64\b", ptx))
                    atom = len(re.findall(r"\batom\.", ptx))
                    ok = f64 == 0 and (atom > 0) == count and name in ptx
                    extra = ""
                    if name.startswith(("fa2_fast", "std_fast", "fa1_fast")):   # LDS.128
                        v4 = len(re.findall(r"ld\.shared\.v4\.f32", ptx))
                        ok = ok and v4 > 0
                        extra = f" ld.shared.v4={v4}"
                    out(f"{name:<52} f64={f64:<3} atomics={atom:<3}{extra} "
                        f"{'ok' if ok else 'FAIL'}")
                    if not ok:
                        failures.append(name)
    # the plain fa2 backward's main kernel and its packed (varlen) twin: dQ is summed with
    # atomics in every build, so the rule is: no .f64, atomics present, and the counting
    # build has more of them (its counters)
    from gpu.backward import fa2_varlen as bwd_varlen
    from gpu.backward import flash
    for dt in (("fp16",) if quick else ("fp32", "fp16")):
        X = A(_launch.NB_DTYPE[dt], 3)
        main_sig = ((X,) * 5 + (F32, F32, F32, A(T.float32, 3), X, X, T.float32) +
                    (T.int64,) * 6 + (U8, I64) + (T.uint64,) * 4 + (T.float32,))
        for causal in ((True,) if quick else (False, True)):
            for kind, make, sig in (
                    ("fa2_bwd_main", lambda c: flash.bwd_main_kernel(
                        "fa2", 64, 64, 64, dt, causal, True, c, 128), main_sig),
                    ("fa2_varlen_bwd", lambda c: bwd_varlen.fa2_varlen_bwd_kernel(
                        64, 64, 64, dt, causal, c, 128), bwd_varlen.signature(dt))):
                atoms = []
                for count in (False, True):
                    kern = make(count)
                    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))
                    f64 = len(re.findall(r"\.f64\b", ptx))
                    atoms.append(len(re.findall(r"\b(?:atom|red)\.", ptx)))
                    ok = f64 == 0 and atoms[-1] > 0 and (not count or atoms[1] > atoms[0])
                    out(f"{kern.py_func.__name__:<52} f64={f64:<3} atomics={atoms[-1]:<3} "
                        f"{'ok' if ok else 'FAIL'}")
                    if not ok:
                        failures.append(kern.py_func.__name__)
    failures += tc_ptx_check(quick, out)
    for dt in (T.float32, T.float16):   # the NaN-poison fill
        ptx, _ = cuda.compile_ptx(_launch._fill_kernel.py_func, (T.Array(dt, 1, "C"), T.float32),
                                  cc=(9, 0))
        f64 = len(re.findall(r"\.f64\b", ptx))
        out(f"{'fill_' + str(dt):<52} f64={f64:<3} {'ok' if f64 == 0 else 'FAIL'}")
        if f64:
            failures.append(f"fill {dt}")
    return failures
