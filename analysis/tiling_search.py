"""Optimal tiling: the feasible (B_r, B_c) with the least HBM traffic for a given M.

Feasible: the schedule's real on-chip footprint fits, `iosim.sram_footprint_bytes(...)
<= M` (M in BYTES). Traffic: `iosim.closed_form_arrays`, problem bytes per head, over the
whole candidate grid at once. Compared with the paper's rule (which may not even fit:
it ignores S and the statistics) and the lower bound of Proposition 3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim import ConfigError, check_dtype, closed_form_arrays, paper_tiling, sram_to_elements
from iosim.problem import DTYPES
from iosim.tiling import F32, sram_footprint_bytes

from .theory import lower_bound


def default_candidates(N: int) -> np.ndarray:
    """Block sizes tried by default: multiples of 8 up to 256, powers of two above, <= N."""
    c = set(range(8, 257, 8)) | {2 ** k for k in range(3, 16)} | {1, 2, 4}
    return np.array(sorted(x for x in c if x <= N), dtype=np.int64)


def footprint_bytes(algorithm: str, B_r, B_c, d: int, dtype: str):
    """Vectorised `iosim.sram_footprint_bytes` (same formula; checked equal in tests)."""
    s = DTYPES[check_dtype(dtype)].itemsize
    B_r, B_c = np.asarray(B_r, np.int64), np.asarray(B_c, np.int64)
    if algorithm == "standard":
        return np.maximum(s * d * (B_r + B_c), s * (B_r * B_c + B_c * d) + F32 * B_r * d)
    if algorithm in ("fa1", "fa2"):
        return s * d * (B_r + 2 * B_c) + F32 * (B_r * d + B_r * B_c + 2 * B_r)
    raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: standard, fa1, fa2")


def traffic_grid(algorithm: str, N: int, d: int, sram_bytes: int, *, dtype="fp16",
                 causal=False, rows=None, cols=None):
    """(B_r values, B_c values, traffic bytes per head [i, j], feasible [i, j])."""
    rows = default_candidates(N) if rows is None else np.asarray(rows, np.int64)
    cols = default_candidates(N) if cols is None else np.asarray(cols, np.int64)
    R, C = np.meshgrid(rows, cols, indexing="ij")
    item = DTYPES[check_dtype(dtype)].itemsize
    traffic = closed_form_arrays(algorithm, N, d, R, C, causal=causal, itemsize=item)["hbm_bytes"]
    feasible = footprint_bytes(algorithm, R, C, d, dtype) <= sram_bytes
    return rows, cols, traffic, feasible


@dataclass
class TilingResult:
    algorithm: str
    N: int
    d: int
    dtype: str
    sram_bytes: int
    B_r: int
    B_c: int
    traffic_bytes: float          # per head, optimum
    paper_B_r: int
    paper_B_c: int
    paper_traffic_bytes: float    # per head, paper's rule
    paper_fits: bool              # paper tiling's footprint <= M
    lower_bound_bytes: float      # per head, max(4Nd, N^2 d^2/M) x itemsize

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def optimal_tiling(algorithm: str, N: int, d: int, sram_bytes: int, *, dtype="fp16",
                   causal=False, rows=None, cols=None) -> TilingResult:
    """Search the candidate grid for the feasible (B_r, B_c) of least traffic.

    Ties go to the largest B_r, then largest B_c (fewest blocks). ConfigError if nothing
    fits. Traffic is bytes per head.
    """
    if sram_bytes <= 0:
        raise ConfigError(f"sram_bytes={sram_bytes!r} must be positive")
    rows, cols, traffic, feasible = traffic_grid(algorithm, N, d, sram_bytes, dtype=dtype,
                                                 causal=causal, rows=rows, cols=cols)
    if not feasible.any():
        raise ConfigError(f"no candidate (B_r, B_c) fits sram_bytes={sram_bytes} for "
                          f"{algorithm} at d={d}, {dtype}")
    masked = np.where(feasible, traffic, np.iinfo(np.int64).max)
    best = masked.min()
    idx = np.argwhere(masked == best)
    i, j = max(idx.tolist(), key=lambda ij: (rows[ij[0]], cols[ij[1]]))
    M = sram_to_elements(sram_bytes, dtype)
    item = DTYPES[check_dtype(dtype)].itemsize
    pt = paper_tiling(M, d)
    ptraffic = closed_form_arrays(algorithm, N, d, pt.B_r, pt.B_c, causal=causal,
                                  itemsize=item)["hbm_bytes"]
    return TilingResult(algorithm, N, d, check_dtype(dtype), int(sram_bytes), int(rows[i]),
                        int(cols[j]), float(best), pt.B_r, pt.B_c, float(ptraffic),
                        sram_footprint_bytes(algorithm, pt.B_r, pt.B_c, d, dtype) <= sram_bytes,
                        float(lower_bound(N, d, M)) * item)


__all__ = ["TilingResult", "default_candidates", "footprint_bytes", "optimal_tiling",
           "traffic_grid"]
