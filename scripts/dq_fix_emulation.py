"""Emulation (NumPy, no GPU) of the fp16 / bf16 fa2 path of the variants matrix's banded rows:
the tensor-core forward (gpu/forward/fa2_tc.py) and the fast backward's dQ, to weigh fixes
of the dQ error of row `fa2 d=59 1023x1024 fp16 causal-window128,0` (issue 18) before any
kernel changes.

Forward, as the kernel runs it, per key tile of B_c columns (only the order of the fp32 sums
inside a tensor-core product differs): S = fp32(Q K^T) x scale log2 e; m_new = max(m, rowmax);
p = exp2(S - m_new) in fp32; O = alpha O + round_E(p) V (fp32 accumulation); l = alpha l +
rowsum(...); at the end O / l rounded to E, L = m ln 2 + log l.
  base     l sums the unrounded fp32 p (the kernel before this change)
  a        l sums round_E(p), the values that enter the PV product
  exactO   O = float64 attention rounded once to E (no forward error but the storage)
Backward (float64, which equals our fast fp32 backward to the printed digits on the GPU,
scripts/dq_error_probe.py): P = exp(scale S - L) with the forward's L, dP = dO V^T,
dS = P (dP - D), dQ = scale dS K rounded once to E, with D one of
  D_O      rowsum(dO o O) from the stored O (what the pre-pass computes)
  D_exact  rowsum(P o dP) (a second sweep over the keys)
  D_tile   D_exact for the rows whose keys all lie in one key tile of the backward (B_c
           columns: the kernel holds the row's whole P o dP there), D_O for the others
Error: max|dQ - dQ_ref| / max|dQ_ref| over the rows that see a key; dQ_ref float64 autograd
of the same E inputs; torch (MATH, fp32, one rounding) = dQ_ref rounded once to E. Draws:
NumPy generators (the matrix's own inputs come from torch's CUDA generator, not available
here), so the numbers are the distribution over draws, not the matrix's draw itself.

    python3 scripts/dq_fix_emulation.py --rows d59 --draws 7
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

import iosim


def rounder(dt):
    if dt == "fp16":
        return lambda x: np.asarray(x).astype(np.float16).astype(np.float32)
    if dt == "bf16":
        def r(x):
            b = np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32)
            b = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
            return b.view(np.float32)
        return r
    raise ValueError(dt)


def forward(q, k, v, allowed, scale, dt, mode, B_c=64):
    """(O (E values as float32), L) of one head: q (N_q, d), k, v (N_k, d), E values."""
    r = rounder(dt)
    Nq, Nk = allowed.shape
    s2 = np.float32(scale * math.log2(math.e))
    m = np.full(Nq, -np.inf, np.float32)
    l = np.zeros(Nq, np.float32)
    o = np.zeros((Nq, q.shape[1]), np.float32)
    for c0 in range(0, Nk, B_c):
        al = allowed[:, c0:c0 + B_c]
        if not al.any():
            continue
        s = (q @ k[c0:c0 + B_c].T).astype(np.float32) * s2
        s = np.where(al, s, np.float32(-np.inf))
        mn = np.maximum(m, s.max(1))
        ms = np.where(mn > -np.inf, mn, np.float32(0))
        alpha = np.exp2(m - ms).astype(np.float32)
        p = np.exp2(s - ms[:, None]).astype(np.float32)
        pr = r(p)
        l = l * alpha + (pr if mode == "a" else p).sum(1, dtype=np.float32)
        o = o * alpha[:, None] + (pr @ v[c0:c0 + B_c]).astype(np.float32)
        m = mn
    with np.errstate(divide="ignore", invalid="ignore"):
        O = np.where(l[:, None] > 0, o * (np.float32(1) / l)[:, None], 0).astype(np.float32)
        L = np.where(l > 0, m * np.float32(math.log(2)) + np.log(l), -np.inf).astype(np.float32)
    return r(O), L


def contained(allowed, B_c):
    """Rows whose visible keys all lie in one key tile of B_c columns (rows seeing none too)."""
    Nq, Nk = allowed.shape
    cols = np.arange(Nk)
    first = np.where(allowed.any(1), np.where(allowed, cols, Nk).min(1), 0)
    last = np.where(allowed.any(1), np.where(allowed, cols, -1).max(1), 0)
    return first // B_c == last // B_c


def backward_dq(q, k, v, do, O, L, allowed, scale, D_mode, B_c=64):
    q, k, v, do, O = (np.asarray(x, np.float64) for x in (q, k, v, do, O))
    S = scale * (q @ k.T)
    with np.errstate(invalid="ignore"):
        P = np.where(allowed, np.exp(S - np.asarray(L, np.float64)[:, None]), 0.0)
    dP = do @ v.T
    if D_mode == "D_O":
        D = (do * O).sum(1)
    elif D_mode == "D_exact":
        D = (P * dP).sum(1)
    elif D_mode == "D_tile":
        D = np.where(contained(allowed, B_c), (P * dP).sum(1), (do * O).sum(1))
    else:
        raise ValueError(D_mode)
    return scale * (P * (dP - D[:, None])) @ k


def reference(q, k, v, do, allowed, scale):
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    S = np.where(allowed, scale * (q @ k.T), -np.inf)
    mx = S.max(1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0)
    E = np.exp(S - mx)
    den = E.sum(1, keepdims=True)
    P = np.where(den > 0, E / np.where(den > 0, den, 1), 0)
    O = P @ v
    dP = do @ v.T
    D = (P * dP).sum(1, keepdims=True)
    dq = scale * (P * (dP - D)) @ k
    return O, dq


MODES = (("base", "D_O"), ("a", "D_O"), ("exactO", "D_O"), ("base", "D_tile"),
         ("a", "D_tile"), ("base", "D_exact"))


def bwd_block_cols(d, dt):
    """B_c of the backward that kernel='auto' runs for a banded fp16 / bf16 row on the H100
    (gpu.backward.flash.default_backward_tiling with kernel 'fast'; 227 KB of shared memory):
    the fast kernel's default tiling where it has one, else the plain kernel's square tile."""
    from gpu.backward import fa2_fast
    from gpu.backward.flash import DEFAULT_SMEM_BYTES, DEFAULT_TILES, backward_shared_bytes
    f = fa2_fast.default_tiling(d, dt, smem_limit=232448)
    if f:
        return f[1]
    for B in DEFAULT_TILES:
        if B < 16 and d <= 128:
            return 16
        if backward_shared_bytes("fa2", B, B, d, dt) <= DEFAULT_SMEM_BYTES:
            return B
    return DEFAULT_TILES[-1]


def run_row(cfg, draw, B_c=64, bwd_B_c=None):
    d, Nq, Nk, dt = cfg["d"], cfg["N_q"], cfg["N_k"], cfg["dtype"]
    H, Hk, B = cfg["heads"], cfg["kv_heads"], cfg["batch"]
    causal, window = cfg["causal"], tuple(cfg["window"])
    allowed = iosim.element_mask(Nq, causal, N_k=Nk, window=window)
    seen = allowed.any(-1)
    scale = 1 / math.sqrt(d)
    r = rounder(dt)
    rng = np.random.default_rng(10_000 * draw + d * 7919 + Nq * 131 + Nk)
    q = r(rng.standard_normal((B, H, Nq, d), dtype=np.float32))
    k = r(rng.standard_normal((B, Hk, Nk, d), dtype=np.float32))
    v = r(rng.standard_normal((B, Hk, Nk, d), dtype=np.float32))
    do = r(rng.standard_normal((B, H, Nq, d), dtype=np.float32))
    G = H // Hk
    bB = bwd_block_cols(d, dt) if bwd_B_c is None else bwd_B_c
    refs, outs = [], {m: [] for m in MODES}
    for b in range(B):
        for h in range(H):
            args = (q[b, h], k[b, h // G], v[b, h // G])
            O_ref, dq_ref = reference(*args, do[b, h], allowed, scale)
            refs.append(dq_ref)
            fw = {}
            for fm in sorted({m for m, _ in MODES} - {"exactO"} | {"base"}):
                fw[fm] = forward(*args, allowed, scale, dt, fm, B_c)
            fw["exactO"] = (r(O_ref), fw["base"][1])
            for fm, Dm in MODES:
                O, L = fw[fm]
                outs[(fm, Dm)].append(r(backward_dq(*args, do[b, h], O, L, allowed, scale, Dm, bB)))
    ref = np.stack(refs)[:, seen]
    den = np.abs(ref).max()
    torch_err = np.abs(r(ref) - ref).max() / den
    res = {"torch": float(torch_err)}
    for key, xs in outs.items():
        e = np.abs(np.stack(xs)[:, seen] - ref).max() / den
        res["+".join(key)] = float(e)
    res["rows_contained"] = int(contained(allowed, bB)[seen].sum())
    res["bwd_B_c"] = bB
    return res


def banded_rows():
    """The full matrix's fp16 / bf16 rows with a band (causal, window, causal-window) whose
    forward runs on the tensor cores (analysis.check_variants.configs('full'))."""
    from analysis import check_variants as cv
    return [c for c in cv.configs("full") if c["dtype"] in ("fp16", "bf16") and c["mask"] != "none"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="d59", help="d59 (the failing row's shape) or banded")
    ap.add_argument("--draws", type=int, default=7)
    ap.add_argument("--first", type=int, default=0, help="first draw")
    ap.add_argument("--out", default=None)
    ap.add_argument("--shard", default="0/1", help="i/n: every n-th row from the i-th")
    ap.add_argument("--modes", default=None, help="comma list, e.g. base+D_O,base+D_tile")
    a = ap.parse_args()
    if a.rows == "d59":
        rows = [dict(d=59, N_q=1023, N_k=1024, dtype="fp16", mask="causal-window", causal=True,
                     window=[128, 0], batch=2, heads=4, kv_heads=4)]
    else:
        rows = banded_rows()
    i, n = map(int, a.shard.split("/"))
    rows = rows[i::n]
    if a.modes:
        global MODES
        MODES = tuple(tuple(m.split("+")) for m in a.modes.split(","))
    out = open(a.out, "a") if a.out else None
    for cfg in rows:
        for draw in range(a.first, a.first + a.draws):
            res = run_row(cfg, draw)
            rec = {"row": {k: cfg[k] for k in ("d", "N_q", "N_k", "dtype", "mask", "window",
                                               "heads", "kv_heads")}, "draw": draw,
                   "err_dq": {k: round(v, 8) for k, v in res.items()},
                   "ratio": {k: round(v / res["torch"], 3) for k, v in res.items()
                             if k not in ("torch", "rows_contained", "bwd_B_c")}}
            print(json.dumps(rec), flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    sys.exit(main())
