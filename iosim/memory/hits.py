"""Stack distances and hit probabilities: the LRU stack distance of every access (a Fenwick
tree over the access sequence) and P(hit | D) of the hashed set-associative L2 (a Poisson
tail, tabulated per associativity and interpolated)."""
from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(cache=True)
def _distances(blk, nbytes):
    """(d_prev, d_next): distinct bytes touched strictly between an access and the previous
    (next) access of the same tile; -1 where there is none (d_next then counts to the
    end). Fenwick tree over positions holding each tile's bytes at its latest access."""
    n = blk.shape[0]
    tree = np.zeros(n + 1)
    d_prev = np.full(n, -1.0)
    d_next = np.full(n, -1.0)
    nblk = 0
    for k in range(n):
        if blk[k] + 1 > nblk:
            nblk = blk[k] + 1
    last = np.full(nblk, -1, np.int64)
    total = 0.0
    for k in range(n):
        b = blk[k]
        p = last[b]
        if p >= 0:
            # sum over (p, k): prefix(k - 1) - prefix(p)
            s = 0.0
            i = k
            while i > 0:
                s += tree[i]
                i -= i & (-i)
            i = p + 1
            while i > 0:
                s -= tree[i]
                i -= i & (-i)
            if s < 0.0:         # rounding in the tree's sums: -1 must mean "no access"
                s = 0.0
            d_prev[k] = s
            d_next[p] = s
            i = p + 1
            v = nbytes[p]
            while i <= n:
                tree[i] -= v
                i += i & (-i)
            total -= v
        i = k + 1
        v = nbytes[k]
        while i <= n:
            tree[i] += v
            i += i & (-i)
        total += v
        last[b] = k
    # last accesses: distinct bytes after them = total - prefix(k)
    for b in range(nblk):
        k = last[b]
        if k >= 0:
            s = 0.0
            i = k + 1
            while i > 0:
                s += tree[i]
                i -= i & (-i)
            d_next[k] = max(total - s, 0.0)
    return d_prev, d_next


_CDF_TABLES = {}


def _poisson_cdf_table(A: int):
    """P[Poisson(lam) <= A - 1] tabulated on lam in [0, A + 12 sqrt(A) + 40] (beyond: < 1e-12),
    8,193 points: np.interp of it is within 1e-6 of scipy's gammaincc and ~10x faster."""
    if A not in _CDF_TABLES:
        from scipy.special import gammaincc
        x = np.linspace(0.0, A + 12.0 * np.sqrt(A) + 40.0, 8193)
        _CDF_TABLES[A] = (x, gammaincc(A, x))
    return _CDF_TABLES[A]


_SLOPES = {}


def _poisson_slopes(A: int):
    """The slopes of `_poisson_cdf_table(A)`'s intervals, (fp[j + 1] - fp[j]) / (xp[j + 1]
    - xp[j]) as np.interp computes them (IEEE operations: the same numbers), for
    `_interp_finite`; None where a slope is not finite (never for these tables: xp is
    strictly increasing, fp finite), which `_fused_applies` then declines and
    `hit_probability` meets with np.interp."""
    if A not in _SLOPES:
        x, y = _poisson_cdf_table(A)
        slope = (y[1:] - y[:-1]) / (x[1:] - x[:-1])
        ok = bool(np.all(np.isfinite(y)) and np.all(np.diff(x) > 0)
                  and np.all(np.isfinite(slope)))
        _SLOPES[A] = slope if ok else None
    return _SLOPES[A]


@njit(cache=True, inline="always")      # per access and capacity: no call
def _interp_finite(x, xp, fp, slope, inv):
    """np.interp(x, xp, fp, right=0) at one point x for an evenly spaced, increasing xp
    whose slopes are all finite (the Poisson tables, `_poisson_slopes`), bit for bit: the
    same interval j (xp[j] <= x < xp[j + 1], found from the spacing and corrected against
    xp itself instead of numpy's binary search) and numpy's arithmetic,
    slope[j] x (x - xp[j]) + fp[j], with the slope precomputed (numpy's own quotient), and
    its end cases (x == xp[j]: fp[j]; x == xp[-1]: fp[-1]; x > xp[-1]: 0; x < xp[0]:
    fp[0]). numpy's NaN repair never applies there (a finite slope times a finite offset
    plus a finite fp[j] is finite) and is left out (it made the loop ~3x slower).
    inv: (len(xp) - 1) / (xp[-1] - xp[0])."""
    n = xp.shape[0]
    x0 = xp[0]
    if np.isnan(x):
        return x
    if x > xp[n - 1]:
        return 0.0
    if x < x0:
        return fp[0]
    if x == xp[n - 1]:
        return fp[n - 1]
    j = int((x - x0) * inv)
    if j > n - 2:
        j = n - 2
    while j > 0 and xp[j] > x:
        j -= 1
    while j < n - 2 and xp[j + 1] <= x:
        j += 1
    if xp[j] == x:
        return fp[j]
    return slope[j] * (x - xp[j]) + fp[j]


@njit(cache=True)
def _interp_uniform(xv, xp, fp, slope):
    """np.interp(xv, xp, fp, right=0) of a vector xv on a Poisson table (xp, fp, its
    slopes), bit for bit: `_interp_finite` element by element."""
    n = xp.shape[0]
    out = np.empty(xv.shape[0])
    inv = (n - 1) / (xp[n - 1] - xp[0])
    for i in range(xv.shape[0]):
        out[i] = _interp_finite(xv[i], xp, fp, slope, inv)
    return out


@njit(cache=True)
def _hit_lru(D, a, capacity, xp, fp, slope):
    """hit_probability without keep_fraction, element by element with numpy's arithmetic:
    where(D < 0, 0, interp(a x max(D, 0) / capacity)) (`_interp_uniform`; slope: the
    table's, `_poisson_slopes`)."""
    lam = np.empty(D.shape[0])
    for i in range(D.shape[0]):
        d = D[i]
        lam[i] = a * (0.0 if d < 0.0 else d) / capacity
    p = _interp_uniform(lam, xp, fp, slope)
    for i in range(D.shape[0]):
        if D[i] < 0.0:
            p[i] = 0.0
    return p


@njit(cache=True, inline="always")      # per access and capacity: no call
def _hit_one(D, a, capacity, xp, fp, slope, inv):
    """`_hit_lru` at one stack distance D (bytes; < 0: no earlier access, never a hit),
    the same arithmetic: interp(a x D / capacity) on the Poisson table (xp, fp, its slopes;
    inv its points per unit of lam; `_interp_finite`)."""
    if D < 0.0:
        return 0.0
    return _interp_finite(a * D / capacity, xp, fp, slope, inv)


def hit_probability(D, capacity: float, associativity: int, keep_fraction: float = 0.0):
    """P(hit | stack distance D bytes) for the hashed set-associative LRU model; D < 0
    (no earlier access) gives 0. keep_fraction rho > 0: at least rho x min(1, C / D), the
    share of a cyclic working set of D bytes an insertion policy that protects part of it
    keeps (L2Model.keep_fraction)."""
    D = np.asarray(D, dtype=np.float64)
    x, y = _poisson_cdf_table(int(associativity))
    sl = _poisson_slopes(int(associativity))
    if sl is not None and keep_fraction <= 0 and D.ndim == 1:
        # the expressions below, fused in one compiled pass (`_hit_lru`)
        return _hit_lru(D, float(associativity), float(capacity), x, y, sl)
    lam = associativity * np.maximum(D, 0.0) / capacity
    # P[Poisson(lam) <= A - 1]; numpy's np.interp, which the look-up reproduces, where a
    # slope is not finite (never for these tables: `_poisson_slopes`)
    p = (np.interp(lam, x, y, right=0.0) if sl is None
         else _interp_uniform(lam.ravel(), x, y, sl).reshape(lam.shape))
    if keep_fraction > 0:
        p = np.maximum(p, keep_fraction * np.minimum(1.0, capacity / np.maximum(D, 1e-300)))
    return np.where(D < 0, 0.0, p)
