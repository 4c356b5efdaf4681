"""Direct launches of the fa2 tensor-core kernels (gpu.forward.fa2_tc, gpu.backward.fa2_tc)
on 16-bit device arrays, for the gpu-marked tests of bf16 and padded head dims: fp16 data
as float16 arrays, bf16 data as uint16 arrays of the bfloat16 bits (what the kernels take,
whatever `gpu.attention` does with bf16 inputs).

Inputs are drawn in float32 and rounded to the dtype; the float64 reference works on the
rounded values. The error bound is the one of the project's rules: 2 x PyTorch SDPA's
error in the same dtype against the same float64 reference, + 1e-5 (without torch or a
GPU: 2 x the error of rounding the reference itself to the dtype, + 1e-5).
"""
from __future__ import annotations

import math

import numpy as np

#: A bfloat16 NaN (the poison of unwritten outputs), and fp16's.
NAN_BITS = {"bf16": 0x7FC0, "fp16": 0x7E00}


def to_dtype(x, dt):
    """float32/64 values -> the 16-bit array the kernels take: float16 for fp16; for bf16
    the uint16 bits, rounded to nearest even."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if dt == "fp16":
        return x32.astype(np.float16)
    u = x32.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x32), np.uint16(NAN_BITS["bf16"]), bits).astype(np.uint16)


def to_f64(a, dt):
    """The values of a 16-bit array (to_dtype's kind) as float64."""
    a = np.asarray(a)
    if dt == "fp16":
        return a.astype(np.float64)
    return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def allowed(N, N_k, causal, window=(-1, -1)):
    """(N, N_k) bool: query row r sees key c (bottom-right alignment, o = N_k - N)."""
    r = np.arange(N)[:, None] + (N_k - N)
    c = np.arange(N_k)[None, :]
    ok = np.ones((N, N_k), bool)
    left, right = window
    if causal:
        ok &= c <= r
    if left >= 0:
        ok &= c >= r - left
    if right >= 0:
        ok &= c <= r + right
    return ok


def reference(q, k, v, allow, scale):
    """float64 O and L (rows that see no key: O = 0, L = -inf); q (I, N, d), k, v
    (I_k, N_k, d) float64 with I a multiple of I_k (consecutive query heads share one)."""
    G = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)
    S = scale * q @ k.transpose(0, 2, 1)
    S = np.where(allow, S, -np.inf)
    m = S.max(-1, keepdims=True)
    seen = np.isfinite(m)
    P = np.where(allow, np.exp(S - np.where(seen, m, 0.0)), 0.0)
    l = P.sum(-1, keepdims=True)
    O = np.where(seen, P @ v / np.where(seen, l, 1.0), 0.0)
    L = np.where(seen[..., 0], (m + np.log(np.where(seen, l, 1.0)))[..., 0], -np.inf)
    return O, L


def rel_err(x, ref, rows):
    d = (np.asarray(x, np.float64) - ref)[:, rows]
    return float(np.linalg.norm(d) / np.linalg.norm(ref[:, rows]))


def _torch():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def bound(dt, ref, rows, sdpa_err):
    """2 x PyTorch's error in dt + 1e-5, or without torch 2 x the rounding of ref to dt."""
    if sdpa_err is not None:
        return 2 * sdpa_err + 1e-5
    return 2 * rel_err(to_f64(to_dtype(ref, dt), dt), ref, rows) + 1e-5


def sdpa_forward_err(q, k, v, allow, scale, dt, ref, rows):
    """PyTorch SDPA in dt (explicit boolean mask) against ref; None without torch."""
    torch = _torch()
    if torch is None:
        return None
    tdt = torch.float16 if dt == "fp16" else torch.bfloat16
    G = q.shape[0] // k.shape[0]
    t = lambda x: torch.tensor(x, device="cuda").to(tdt)[None]
    O = torch.nn.functional.scaled_dot_product_attention(
        t(q), t(np.repeat(k, G, 0)), t(np.repeat(v, G, 0)),
        attn_mask=torch.tensor(allow, device="cuda"), scale=scale)
    O = torch.nan_to_num(O.double(), nan=0.0)[0].cpu().numpy()
    return rel_err(O, ref, rows)


def inputs(I, I_k, N, N_k, d, dt, seed):
    """Rounded q (I, N, d), k, v (I_k, N_k, d) as 16-bit arrays and their float64 values."""
    rng = np.random.default_rng(seed)
    xs = [to_dtype(rng.standard_normal(s), dt) for s in ((I, N, d), (I_k, N_k, d), (I_k, N_k, d))]
    return xs, [to_f64(x, dt) for x in xs]


def keep(I, N, N_k, dropout):
    """The keep mask Z (I, N, N_k) bool of dropout = (p, seed, offset) for instances
    z = 0 .. I - 1 (iosim.dropout: batch 1, I heads); all True for None."""
    from iosim.dropout import keep_mask
    if not dropout:
        return np.ones((I, N, N_k), bool)
    p, seed, offset = dropout
    return np.stack([keep_mask(seed, offset, 0, z, range(N), range(N_k), p, heads=I)
                     for z in range(I)])


def reference_dropout(q, k, v, do, allow, scale, Z, p):
    """float64 O, L, (dQ, dK, dV) with dropout given its keep mask Z (I, N, N_k)
    (Algorithms 2 and 4: O = (P o Z / (1 - p)) V, L before dropout); q, do (I, N, d), k, v
    (I_k, N_k, d) float64; dK, dV per query head (I, N_k, d)."""
    G = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, G, axis=0), np.repeat(v, G, axis=0)
    S = np.where(allow, scale * q @ k.transpose(0, 2, 1), -np.inf)
    m = S.max(-1, keepdims=True)
    seen = np.isfinite(m)
    P = np.where(allow, np.exp(S - np.where(seen, m, 0.0)), 0.0)
    l = P.sum(-1, keepdims=True)
    P = P / np.where(seen, l, 1.0)
    L = np.where(seen[..., 0], (m + np.log(np.where(seen, l, 1.0)))[..., 0], -np.inf)
    Zs = Z / (1.0 - p)
    Pd = P * Zs
    O = Pd @ v
    dV = Pd.transpose(0, 2, 1) @ do
    dP = (do @ v.transpose(0, 2, 1)) * Zs
    dS = P * (dP - (do * O).sum(-1, keepdims=True))
    return O, L, (scale * dS @ k, scale * dS.transpose(0, 2, 1) @ q, dV)


def run_forward(q, k, v, dt, tiles, causal, window=(-1, -1), MT=1, count=True, heads=None,
                dropout=None):
    """gpu.forward.fa2_tc.run on device copies of q (I, N, d), k, v (I_k, N_k, d): (O as
    a host array of q's kind, poisoned with NaN before the launch; L (I, N) float32; the
    kernel's own counts {tensor: (reads, writes)} or None). dropout: None or (p, seed,
    offset)."""
    from numba import cuda
    from gpu import _launch
    from gpu.forward import fa2_tc
    I, N, d = q.shape
    N_k = k.shape[1]
    H = heads or I
    G = I // k.shape[0]
    dq, dk, dv = (cuda.to_device(np.ascontiguousarray(x)) for x in (q, k, v))
    o = cuda.to_device(np.full(q.shape, NAN_BITS[dt], np.uint16).view(q.dtype))
    L = cuda.to_device(np.full((I, N), np.nan, np.float32))
    counters = _launch.new_counters(count)
    fa2_tc.run(dq, dk, dv, o, L, 1.0 / math.sqrt(d), N, H, G, None, counters, B_r=tiles[0],
               B_c=tiles[1], dt=dt, causal=causal, count=count, MT=MT, N_k=N_k,
               window=window, dropout=dropout)
    cuda.synchronize()
    counts = None
    if count:
        r, w = _launch.counters_to_dicts(counters)
        counts = {t: (r.get(t, 0), w.get(t, 0)) for t in set(r) | set(w)}
    return o.copy_to_host(), L.copy_to_host(), counts


def model_counts(N, N_k, d, I, I_k, causal, window, tiles, algorithm="fa2"):
    """iosim's closed form for the same problem (element counts: the same for fp16 and
    bf16, both 2 bytes), as {tensor: (reads, writes)}."""
    import iosim
    p = iosim.Problem(N=N, N_k=N_k, d=d, batch=1, heads=I, kv_heads=I_k, dtype="fp16",
                      causal=causal, window=window)
    led = iosim.closed_form(algorithm, p, iosim.Tiling(*tiles))
    r, w = led.reads, led.writes
    return {t: (r.get(t, 0), w.get(t, 0)) for t in set(r) | set(w) if r.get(t) or w.get(t)}


def reference_backward(q, k, v, do, allow, scale):
    """float64 (dQ, dK, dV) of O = softmax(scale Q K^T, masked) V for one K/V head per
    query head (q, k, v, do: (I, N, d) float64)."""
    S = np.where(allow, scale * q @ k.transpose(0, 2, 1), -np.inf)
    m = S.max(-1, keepdims=True)
    seen = np.isfinite(m)
    P = np.where(allow, np.exp(S - np.where(seen, m, 0.0)), 0.0)
    P = P / np.where(seen, P.sum(-1, keepdims=True), 1.0)
    O = P @ v
    dV = P.transpose(0, 2, 1) @ do
    dP = do @ v.transpose(0, 2, 1)
    dS = P * (dP - (do * O).sum(-1, keepdims=True))
    return scale * dS @ k, scale * dS.transpose(0, 2, 1) @ q, dV


def sdpa_backward_errs(q, k, v, do, allow, scale, dt, refs):
    """PyTorch SDPA's gradients in dt (autograd, explicit mask) against refs: [dQ, dK, dV]
    relative errors, or None without torch."""
    torch = _torch()
    if torch is None:
        return None
    tdt = torch.float16 if dt == "fp16" else torch.bfloat16
    ts = [torch.tensor(x, device="cuda").to(tdt)[None].requires_grad_(True) for x in (q, k, v)]
    O = torch.nn.functional.scaled_dot_product_attention(
        *ts, attn_mask=torch.tensor(allow, device="cuda"), scale=scale)
    O.backward(torch.tensor(do, device="cuda").to(tdt)[None])
    rows = np.ones(q.shape[1], bool)
    return [rel_err(t.grad.double()[0].cpu().numpy(), r, rows) for t, r in zip(ts, refs)]


def run_backward(q, k, v, do, dt, tiles, causal, MT=1, count=True, window=(-1, -1),
                 dropout=None):
    """gpu.backward.fa2_tc.run (the main kernel alone) on device copies of q, do (I, N, d),
    k, v (I_k, N_k, d; I a multiple of I_k, consecutive query heads sharing a K/V head),
    with the band of causal / window (gpu.forward._band), and L and D computed here in
    float64 from the rounded inputs (D = rowsum(dO o O), O rounded to dt as the forward
    stores it; rows that see no key: L = -inf, D = 0): (dQ (the float32 accumulator), dK,
    dV per query head (I, N_k, d; host arrays of q's kind, poisoned with NaN before the
    launch), counts {tensor: (reads, writes)} or None). dropout: None or the forward's
    (p, seed, offset) (O, hence D, then the dropped output, `reference_dropout`)."""
    from numba import cuda
    from gpu.backward import fa2_tc
    I, N, d = q.shape
    N_k = k.shape[1]
    scale = 1.0 / math.sqrt(d)
    q64, k64, v64, do64 = (to_f64(x, dt) for x in (q, k, v, do))
    allow = allowed(N, N_k, causal, window)
    if dropout:
        O, L, _ = reference_dropout(q64, k64, v64, do64, allow, scale,
                                    keep(I, N, N_k, dropout), dropout[0])
    else:
        O, L = reference(q64, k64, v64, allow, scale)
    D = (do64 * to_f64(to_dtype(O, dt), dt)).sum(-1)
    dev = lambda x: cuda.to_device(np.ascontiguousarray(x))
    poison = lambda: dev(np.full((I, N_k, d), NAN_BITS[dt], np.uint16).view(q.dtype))
    acc = dev(np.zeros(q.shape, np.float32))
    dk, dv = poison(), poison()
    counters = backward_counters(count)
    fa2_tc.run(dev(q), dev(k), dev(v), dev(do), dev(L.astype(np.float32)),
               dev(D.astype(np.float32)), acc, dk, dv, scale, N, I, I // k.shape[0], None,
               counters, B_r=tiles[0], B_c=tiles[1], causal=causal, count=count, MT=MT,
               dt=dt, window=window, dropout=dropout)
    cuda.synchronize()
    return (acc.copy_to_host(), dk.copy_to_host(), dv.copy_to_host(),
            backward_counts(counters) if count else None)


def backward_counters(count):
    """Counters of the backward kernels (rows: gpu.backward.flash.BW_TENSORS)."""
    from gpu.backward.flash import _new_counters
    return _new_counters(count)


def backward_counts(counters):
    """{tensor: (reads, writes)} of a backward counters array (nonzero rows)."""
    from gpu._launch import READ, WRITE
    from gpu.backward.flash import BW_TENSORS
    host = counters.copy_to_host()
    return {t: (int(host[i, READ]), int(host[i, WRITE])) for i, t in enumerate(BW_TENSORS)
            if host[i].any()}


def bwd_main_model_counts(N, d, I, causal, tiles, N_k=None, window=(-1, -1),
                          block_mask=None):
    """What iosim's fa2 backward closed form leaves for the main kernel alone (I instances,
    counted as one K/V head per query head: the kernel reads K_j, V_j and writes dK_h, dV_h
    per query head; the grouped-head sum is a later launch): the closed form less the
    pre-pass (reads O and dO, writes D and dQacc = 0: N d, N d, N, N d per instance) and
    the dQ conversion (reads dQacc, writes dQ: N d each), as {tensor: (reads, writes)}.
    N: query rows; N_k (default N), window and block_mask as iosim.Problem."""
    import iosim
    p = iosim.Problem(N=N, N_k=N_k, d=d, batch=1, heads=I, dtype="fp16", causal=causal,
                      window=window, block_mask=block_mask)
    led = iosim.backward_closed_form("fa2", p, iosim.Tiling(*tiles))
    r, w = dict(led.reads), dict(led.writes)
    nd = I * N * d
    r["O"] -= nd
    r["dO"] -= nd
    w["D"] -= I * N
    w["dQacc"] -= nd
    r["dQacc"] -= nd
    w["dQ"] -= nd
    return {t: (r.get(t, 0), w.get(t, 0)) for t in set(r) | set(w) if r.get(t) or w.get(t)}
