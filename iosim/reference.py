"""Plain dense float64 attention: the independent reference for outputs."""
from __future__ import annotations

import numpy as np


def element_mask(N: int, causal: bool, block_mask=None, B_r: int | None = None,
                 B_c: int | None = None) -> np.ndarray:
    """Boolean (N, N): True where query row r may attend key column c."""
    allowed = np.ones((N, N), dtype=bool)
    if causal:
        allowed &= np.tril(np.ones((N, N), dtype=bool))
    if block_mask is not None:
        if B_r is None or B_c is None:
            raise ValueError("block_mask needs B_r and B_c to expand it to elements")
        bm = np.asarray(block_mask, dtype=bool)
        rows = np.arange(N) // B_r
        cols = np.arange(N) // B_c
        allowed &= bm[rows[:, None], cols[None, :]]
    return allowed


def reference_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                        block_mask=None, B_r: int | None = None, B_c: int | None = None,
                        return_lse: bool = False):
    """softmax(scale Q K^T + mask) V in float64, for (..., heads, N, d) arrays.

    K and V may have fewer heads than Q (grouped): query head h uses K/V head
    h // (heads // kv_heads). A row that may attend no key at all returns O = 0 and
    logsumexp L = -inf (the convention of every flashsim kernel).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    H, G = q.shape[-3], k.shape[-3]
    if H != G:
        k = np.repeat(k, H // G, axis=-3)
        v = np.repeat(v, H // G, axis=-3)
    N, d = q.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    s = scale * (q @ np.swapaxes(k, -1, -2))
    allowed = element_mask(N, causal, block_mask, B_r, B_c)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    o = np.where(l > 0, (p @ v) / np.where(l > 0, l, 1.0), 0.0)
    if not return_lse:
        return o
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf)
    return o, lse
