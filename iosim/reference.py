"""Plain dense float64 attention: the independent reference for outputs."""
from __future__ import annotations

import numpy as np

from .problem import ConfigError, band_of, check_flag


def _as_float_array(name: str, x) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} is not allowed: it is not an array of numbers "
                          f"(got {type(x).__name__})") from None
    return a


def check_qkv(q, k, v):
    """q (..., heads, N_q, d), k and v (..., kv_heads, N_k, d) as float64 arrays, or a
    ConfigError naming the array and the shapes allowed: at least 3-d, equal leading
    (batch) dimensions, the same d >= 1 in q and k, k and v of one shape but v's d,
    N_k >= 1, kv_heads >= 1 dividing heads."""
    q, k, v = (_as_float_array(n, x) for n, x in (("q", q), ("k", k), ("v", v)))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 3:
            raise ConfigError(f"{name} has shape {x.shape}; allowed: (..., heads, rows, d), "
                              f"at least 3 dimensions")
    want = "q (..., heads, N_q, d), k and v (..., kv_heads, N_k, d)"
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        raise ConfigError(f"q, k, v have shapes {q.shape}, {k.shape}, {v.shape}; allowed: "
                          f"{want} with the same leading dimensions")
    if q.shape[-1] < 1 or q.shape[-1] != k.shape[-1]:
        raise ConfigError(f"q has d={q.shape[-1]} and k d={k.shape[-1]}; allowed: the same "
                          f"d >= 1 ({want})")
    H, G = q.shape[-3], k.shape[-3]
    if G < 1 or H % G:
        raise ConfigError(f"q has {H} heads and k, v {G}; allowed: kv_heads >= 1 dividing "
                          f"heads ({want})")
    if k.shape[-2] < 1:
        raise ConfigError(f"k and v have N_k=0 rows; allowed: N_k >= 1 ({want})")
    return q, k, v


def check_real(name: str, x) -> float:
    """x as a float if it is a real number (NaN and Inf included: they propagate), else
    ConfigError naming `name`."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer,
                                                             np.floating)):
        raise ConfigError(f"{name}={x!r} is not allowed; allowed: a real number")
    return float(x)


def element_mask(N: int, causal: bool, block_mask=None, B_r: int | None = None,
                 B_c: int | None = None, *, N_k: int | None = None,
                 window=(-1, -1)) -> np.ndarray:
    """Boolean (N_q, N_k), N_q = N (N_k default N): True where query row r may attend key
    column c. Causal and window align bottom-right (iosim.problem.band_of), o = N_k - N_q:
    causal c <= r + o; window (left, right) r + o - left <= c <= r + o + right."""
    N_k = N if N_k is None else int(N_k)
    causal = check_flag("causal", causal)
    lo, hi = band_of(N, N_k, causal, window)
    dc = np.arange(N_k)[None, :] - np.arange(N)[:, None]
    allowed = np.ones((N, N_k), dtype=bool)
    if lo is not None:
        allowed &= dc >= lo
    if hi is not None:
        allowed &= dc <= hi
    if block_mask is not None:
        if B_r is None or B_c is None:
            raise ConfigError("block_mask needs B_r and B_c to expand it to elements")
        from .tiling import Tiling
        t = Tiling(B_r, B_c)                     # positive integers, or ConfigError
        bm = np.asarray(block_mask)
        want = (t.T_r(N), t.T_c(N_k))
        if bm.dtype != np.bool_ or bm.shape != want:
            raise ConfigError(f"block_mask has dtype {bm.dtype} and shape {bm.shape}; "
                              f"allowed: bools of shape (ceil(N_q / B_r), ceil(N_k / B_c)) "
                              f"= {want}")
        rows = np.arange(N) // B_r
        cols = np.arange(N_k) // B_c
        allowed &= bm[rows[:, None], cols[None, :]]
    return allowed


def _masked_matmul(w, allowed, x):
    """sum_c w[..., r, c] x[..., c, :] over the allowed (r, c) only: a key a row may not see
    contributes nothing, even where x is NaN or Inf there (plain w @ x would give
    0 * Inf = NaN). Fast path (w @ x) when x is finite."""
    if np.isfinite(x).all():
        return w @ x
    bad = ~np.isfinite(x)
    out = w @ np.where(bad, 0.0, x)
    for c in np.nonzero(bad.any(axis=tuple(range(bad.ndim - 2)) + (-1,)))[0]:
        term = w[..., :, c, None] * np.where(bad, x, 0.0)[..., None, c, :]
        out = out + np.where(allowed[:, c, None], term, 0.0)
    return out


def reference_probs(q, k, allowed, scale: float):
    """(P, L, sees): softmax(scale Q K^T) over the allowed keys in float64, its logsumexp
    and whether each row sees any key. A row that sees no key gets P = 0, L = -inf; any
    other row follows IEEE arithmetic over its visible scores, so a NaN or Inf there
    (from q, k or the scale) gives NaN, never a finite number."""
    sees = allowed.any(axis=-1)                          # (N,)
    s = np.where(allowed, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    m = np.where(sees[:, None], s.max(axis=-1, keepdims=True), 0.0)   # NaN propagates
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - m)                                # max -inf / +inf / NaN: NaN
        l = p.sum(axis=-1, keepdims=True)
        p = np.where(sees[:, None], p / np.where(sees[:, None], l, 1.0), 0.0)
        with np.errstate(divide="ignore"):
            lse = np.where(sees, m[..., 0] + np.log(l[..., 0]), -np.inf)
    return p, lse, sees


def dropout_weights(p, keep, dropout_p: float):
    """P o Z / (1 - p) in float64 (P itself when dropout_p = 0 and keep is None): the
    dropped, rescaled probabilities of Algorithm 2. keep: boolean keep mask Z broadcast
    to P's shape (e.g. iosim.dropout.problem_keep_mask); required when dropout_p > 0."""
    from .dropout import check_dropout_p
    dropout_p = check_dropout_p(dropout_p)
    if keep is None:
        if dropout_p:
            raise ConfigError(f"dropout_p={dropout_p} needs the keep mask (dropout_keep=...)")
        return p
    return np.where(np.asarray(keep, dtype=bool), p / (1.0 - dropout_p), 0.0)


def reference_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                        block_mask=None, B_r: int | None = None, B_c: int | None = None,
                        return_lse: bool = False, window=(-1, -1), dropout_p: float = 0.0,
                        dropout_keep=None):
    """softmax(scale Q K^T + mask) V in float64: q (..., heads, N_q, d), k, v
    (..., kv_heads, N_k, d). Causal and window=(left, right) as iosim.Problem (bottom-right
    aligned; `element_mask`).

    K and V may have fewer heads than Q (grouped): query head h uses K/V head
    h // (heads // kv_heads). A row that may attend no key at all returns O = 0 and
    logsumexp L = -inf (the convention of every flashsim kernel).

    Non-finite inputs: the sums run over the keys a row may see only (a masked key adds
    nothing, whatever its k or v); within them IEEE arithmetic decides, so NaN or Inf in
    q, k, v or the scale gives NaN (or Inf) wherever it reaches a row, never a finite
    number. Every kernel and schedule returns NaN wherever this reference has NaN.

    Dropout: O = (P o Z / (1 - p)) V with p = dropout_p and the boolean keep mask Z =
    dropout_keep (..., heads, N_q, N_k) (iosim.dropout.problem_keep_mask gives the one
    the schedules and kernels use); L is the logsumexp before dropout.
    """
    q, k, v = check_qkv(q, k, v)
    H, G = q.shape[-3], k.shape[-3]
    if H != G:
        k = np.repeat(k, H // G, axis=-3)
        v = np.repeat(v, H // G, axis=-3)
    N, d = q.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else check_real("scale", scale)
    allowed = element_mask(N, causal, block_mask, B_r, B_c, N_k=k.shape[-2], window=window)
    p, lse, _ = reference_probs(q, k, allowed, scale)
    with np.errstate(invalid="ignore", over="ignore"):
        o = _masked_matmul(dropout_weights(p, dropout_keep, dropout_p), allowed, v)
    if not return_lse:
        return o
    return o, lse


# ---------------------------------------------------------------------------------------
# Rounding models: what storing HBM tensors in fp16 / bf16 costs, in float64
# ---------------------------------------------------------------------------------------
def rounder(dtype):
    """x -> x rounded to the storage dtype ('fp32', 'fp16', 'bf16'; round to nearest even)
    and back to float64: the one rounding an HBM store makes."""
    from .problem import DTYPES, check_dtype
    npdt = DTYPES[check_dtype(dtype)]
    return lambda x: np.asarray(x, np.float64).astype(npdt).astype(np.float64)


def _model_inputs(arrays, k_index, causal, scale, window, block_mask, B_r, B_c):
    """(float64 arrays with K/V-like ones (index >= k_index, < k_index + 2) repeated over
    the query heads, scale, allowed mask) of the rounding models."""
    arrays = [np.asarray(x, np.float64) for x in arrays]
    H, G = arrays[0].shape[-3], arrays[k_index].shape[-3]
    for i in (k_index, k_index + 1):
        arrays[i] = np.repeat(arrays[i], H // G, axis=-3)
    N, d = arrays[0].shape[-2:]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    allowed = element_mask(N, causal, block_mask, B_r, B_c, N_k=arrays[k_index].shape[-2],
                           window=window)
    return arrays, scale, allowed


def _probs(q, k, scale, allowed, round_s):
    """(P, sees) of softmax(round_s(scale Q K^T)) over the allowed keys, float64."""
    s = round_s(scale * (q @ np.swapaxes(k, -1, -2)))
    s = np.where(allowed, s, -np.inf)
    sees = allowed.any(-1)
    m = np.where(sees[:, None], s.max(-1, keepdims=True), 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    l = e.sum(-1, keepdims=True)
    return np.where(sees[:, None], e / np.where(l > 0, l, 1.0), 0.0), sees


def rounding_model_attention(algorithm: str, q, k, v, *, dtype, causal: bool = False,
                             scale: float | None = None, window=(-1, -1), block_mask=None,
                             B_r: int | None = None, B_c: int | None = None):
    """O of a float64 model of the storage roundings a schedule cannot avoid when its HBM
    tensors are in `dtype` (fp16 or bf16; the inputs q, k, v as given, i.e. already in
    it), everything else exact:
      fa2:       O rounded once (it is written once).
      fa1:       O rounded after every key block of B_c keys (Algorithm 1 step 12 stores
                 O_i after each K_j, V_j; needs B_c); the statistics l, m are float32 in
                 HBM, modelled exact.
      standard:  S rounded, P = softmax(S) rounded, O = P V rounded (S and P are HBM
                 buffers in the problem dtype).
    The kernels' own error must stay within a small multiple of this model's (the
    project's criterion is 2x). Shapes and masks as `reference_attention` (grouped heads,
    bottom-right causal / window, block mask with B_r, B_c); rows that see no key: 0."""
    r = rounder(dtype)
    (q, k, v), scale, allowed = _model_inputs((q, k, v), 1, causal, scale, window,
                                              block_mask, B_r, B_c)
    d, N_k = q.shape[-1], k.shape[-2]
    if algorithm == "standard":
        p, _ = _probs(q, k, scale, allowed, r)
        return r(r(p) @ v)
    if algorithm == "fa2":
        p, _ = _probs(q, k, scale, allowed, lambda x: x)
        return r(p @ v)
    if algorithm != "fa1":
        raise ValueError(f"algorithm={algorithm!r} is not known; allowed: standard, fa1, fa2")
    if B_c is None:
        raise ValueError("the fa1 rounding model needs B_c (O is rounded after every key "
                         "block)")
    s = np.where(allowed, scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    O = np.zeros(q.shape[:-1] + (d,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)
    l = np.zeros(q.shape[:-1] + (1,))
    for c0 in range(0, N_k, B_c):
        blk = slice(c0, c0 + B_c)
        seen = allowed[:, blk].any(-1)[:, None]         # rows that see a key of this block
        m_t = np.where(seen, s[..., blk].max(-1, keepdims=True), 0.0)
        e = np.where(allowed[:, blk], np.exp(s[..., blk] - m_t), 0.0)
        m_new = np.where(seen, np.maximum(m, m_t), m)
        with np.errstate(invalid="ignore"):
            a = np.where(seen, np.exp(np.where(np.isfinite(m), m - m_new, -np.inf)) * l, l)
        b = np.where(seen, np.exp(m_t - m_new), 0.0)
        l_new = a + b * e.sum(-1, keepdims=True)
        upd = (a * O + b * (e @ v[..., blk, :])) / np.where(l_new > 0, l_new, 1.0)
        O = np.where(seen, r(upd), O)
        m, l = m_new, np.where(seen, l_new, l)
    return O


def rounding_model_backward(algorithm: str, q, k, v, o, do, *, dtype, causal: bool = False,
                            scale: float | None = None, window=(-1, -1), block_mask=None,
                            B_r: int | None = None, B_c: int | None = None):
    """(dq, dk, dv) of a float64 model of the storage roundings of the backward schedules in
    `dtype` (fp16 or bf16; inputs, o and do as given, already in it): fa1 / fa2: D from O
    as stored; fa1's dQ_i rounded after every key block (Algorithm 4 line 22 writes it to
    HBM; needs B_c); standard: S and P stored rounded by the forward, dP and dS stored
    rounded (Algorithm 3 lines 2-3); all: each query head's dK_h, dV_h rounded before the
    grouped-head sum, and the final gradients rounded. Masks as `rounding_model_attention`;
    no dropout."""
    r = rounder(dtype)
    H, G = np.shape(q)[-3], np.shape(k)[-3]
    (q, kr, vr, o, do), scale, allowed = _model_inputs((q, k, v, o, do), 1, causal, scale,
                                                       window, block_mask, B_r, B_c)
    N_k, d = kr.shape[-2:]
    std = algorithm == "standard"
    p, _ = _probs(q, kr, scale, allowed, r if std else (lambda x: x))
    dp = do @ np.swapaxes(vr, -1, -2)
    if std:                                     # P (forward), dP (line 2), dS (line 3)
        p, dp = r(p), r(dp)
        ds = r(p * (dp - (p * dp).sum(-1, keepdims=True)))
    else:
        ds = p * (dp - (do * o).sum(-1, keepdims=True))
    ds = ds * scale
    if algorithm == "fa1":                      # dQ rounded after every key block
        if B_c is None:
            raise ValueError("the fa1 rounding model needs B_c")
        dq = np.zeros_like(q)
        for c0 in range(0, N_k, B_c):
            dq = r(dq + ds[..., c0:c0 + B_c] @ kr[..., c0:c0 + B_c, :])
    else:
        dq = ds @ kr
    dk_h, dv_h = r(np.swapaxes(ds, -1, -2) @ q), r(np.swapaxes(p, -1, -2) @ do)
    sh = dk_h.shape[:-3] + (G, H // G, N_k, d)
    return r(dq), r(dk_h.reshape(sh).sum(-3)), r(dv_h.reshape(sh).sum(-3))
