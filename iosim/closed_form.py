"""Closed forms: the ledger of each forward schedule without executing it.

Everything reduces to four sums over the active tiles A of one instance:
    n_A  = |A|                       RA  = sum_{(i,j) in A} rows_i
    CA   = sum_{(i,j) in A} cols_j   RCA = sum_{(i,j) in A} rows_i cols_j
with rows_i = min(B_r, N - i B_r), cols_j = min(B_c, N - j B_c). Per instance:

  standard  Q: RA d read     K: CA d read      S: RCA written, RCA read
            P: RCA written, RCA read           V: CA d read      O: N d written
  fa1       Q: RA d read     K, V: N d read each
            O: RA d read, (N + RA) d written   l, m: RA read, N + RA written each
  fa2       Q: N d read      K, V: CA d read each      O: N d written   L: N written

Dense (no causal, no mask):  RA = N T_c, CA = N T_r, RCA = N^2.
Causal: query block i sees a_i = floor(last_i / B_c) + 1 key blocks, last_i =
min((i+1) B_r, N) - 1. Summing a_i over the T_r - 1 full query blocks is a floor sum,
    F = sum_{t=0}^{T_r-2} floor((B_r t + B_r - 1) / B_c),
evaluated exactly in O(log) steps (`floor_sum`), vectorised over configurations.
A block-sparse mask has no formula; its sums are taken over the (T_r, T_c) mask itself.
"""
from __future__ import annotations

import numpy as np

from .ledger import Ledger
from .problem import ConfigError, Problem
from .schedules import active_tiles
from .tiling import ALGORITHMS, Tiling

STAT = ("l", "m", "L")


def floor_sum(n, m, a, b):
    """sum_{i=0}^{n-1} floor((a i + b) / m) for integer arrays, n >= 0, m >= 1, a, b >= 0."""
    n, m, a, b = (np.array(x, dtype=np.int64, copy=True) for x in np.broadcast_arrays(n, m, a, b))
    ans = np.zeros_like(n)
    live = n > 0
    while live.any():
        q = np.where(live & (a >= m), a // m, 0)
        ans += np.where(live, (n - 1) * n // 2 * q, 0)
        a = np.where(live, a - q * m, a)
        q = np.where(live & (b >= m), b // m, 0)
        ans += np.where(live, n * q, 0)
        b = np.where(live, b - q * m, b)
        y_max = a * n + b
        live = live & (y_max >= m)
        n = np.where(live, y_max // m, n)
        b = np.where(live, y_max % m, b)
        m, a = np.where(live, a, m), np.where(live, m, a)
    return ans


def tile_sums(N, B_r, B_c, causal):
    """(n_A, RA, CA, RCA) per instance for dense or causal schedules; arrays broadcast."""
    N, B_r, B_c = (np.asarray(x, dtype=np.int64) for x in (N, B_r, B_c))
    causal = np.asarray(causal, dtype=bool)
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    # dense
    nA_d, RA_d, CA_d, RCA_d = T_r * T_c, N * T_c, N * T_r, N * N
    # causal
    n = T_r - 1                                  # full query blocks
    rows_last = N - n * B_r
    F = floor_sum(n, B_c, B_r, B_r - 1)
    sum_a = F + n                                # sum of a_i over the full blocks
    i0 = np.maximum(-(-((T_c - 1) * B_c + 1) // B_r) - 1, 0)
    cnt = np.maximum(n - i0, 0)                  # full blocks that see all T_c key blocks
    cols_full = B_c * sum_a - cnt * (T_c * B_c - N)
    nA_c = sum_a + T_c
    RA_c = B_r * sum_a + rows_last * T_c
    CA_c = cols_full + N
    RCA_c = B_r * cols_full + rows_last * N
    pick = lambda c, d: np.where(causal, c, d)
    return pick(nA_c, nA_d), pick(RA_c, RA_d), pick(CA_c, CA_d), pick(RCA_c, RCA_d)


def _mask_sums(problem: Problem, tiling: Tiling):
    A = active_tiles(problem, tiling).astype(np.int64)
    N = problem.N
    rows = np.minimum(tiling.B_r, N - np.arange(tiling.T_r(N)) * tiling.B_r)
    cols = np.minimum(tiling.B_c, N - np.arange(tiling.T_c(N)) * tiling.B_c)
    return int(A.sum()), int(rows @ A.sum(axis=1)), int(A.sum(axis=0) @ cols), int(rows @ A @ cols)


def counts_from_sums(algorithm: str, N, d, nA, RA, CA, RCA):
    """Per-instance element counts: ({tensor: reads}, {tensor: writes}); arrays broadcast."""
    if algorithm == "standard":
        reads = {"Q": RA * d, "K": CA * d, "V": CA * d, "S": RCA, "P": RCA}
        writes = {"S": RCA, "P": RCA, "O": N * d}
    elif algorithm == "fa1":
        reads = {"Q": RA * d, "K": N * d, "V": N * d, "O": RA * d, "l": RA, "m": RA}
        writes = {"O": (N + RA) * d, "l": N + RA, "m": N + RA}
    elif algorithm == "fa2":
        reads = {"Q": N * d, "K": CA * d, "V": CA * d}
        writes = {"O": N * d, "L": N}
    else:
        raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    return reads, writes


def closed_form(algorithm: str, problem: Problem, tiling: Tiling) -> Ledger:
    """The ledger of `execute(algorithm, problem, tiling)`, computed by formula (totals)."""
    if problem.block_mask is not None:
        nA, RA, CA, RCA = _mask_sums(problem, tiling)
    else:
        nA, RA, CA, RCA = (int(x) for x in tile_sums(problem.N, tiling.B_r, tiling.B_c, problem.causal))
    reads, writes = counts_from_sums(algorithm, problem.N, problem.d, nA, RA, CA, RCA)
    k = problem.instances
    return Ledger(algorithm, problem, tiling,
                  {t: int(c) * k for t, c in reads.items()},
                  {t: int(c) * k for t, c in writes.items()})


def closed_form_arrays(algorithm: str, N, d, B_r, B_c, *, causal=False, itemsize=2,
                       instances=1) -> dict:
    """Vectorised ledger for many configurations at once (dense or causal; no masks).

    All arguments broadcast (NumPy arrays or scalars). `itemsize` is bytes per element of
    Q, K, V, O, S, P (2 for fp16, 4 for fp32); statistics are 4 bytes. Returns a dict of
    arrays, problem totals over `instances` = batch * heads:
      reads / writes: {tensor: elements}, read_bytes, write_bytes, hbm_bytes.
    """
    N, d, B_r, B_c, itemsize, instances = (np.asarray(x, dtype=np.int64)
                                           for x in (N, d, B_r, B_c, itemsize, instances))
    if (N <= 0).any() or (d <= 0).any() or (B_r <= 0).any() or (B_c <= 0).any():
        raise ConfigError("N, d, B_r and B_c must all be positive")
    sums = tile_sums(N, B_r, B_c, causal)
    reads, writes = counts_from_sums(algorithm, N, d, *sums)
    reads = {t: c * instances for t, c in reads.items()}
    writes = {t: c * instances for t, c in writes.items()}
    nbytes = lambda t, c: c * (4 if t in STAT else itemsize)
    rb = sum(nbytes(t, c) for t, c in reads.items())
    wb = sum(nbytes(t, c) for t, c in writes.items())
    return {"reads": reads, "writes": writes, "read_bytes": rb, "write_bytes": wb,
            "hbm_bytes": rb + wb}
