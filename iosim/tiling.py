"""Tiling (B_r, B_c) and the on-chip footprint of each schedule.

Paper names: B_r = rows of a query block (Pallas' block_q), B_c = rows of a key/value
block (block_k); T_r = ceil(N / B_r) query blocks, T_c = ceil(N / B_c) key blocks.
The last block of each is ragged when B does not divide N; counts always use the
valid rows only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import DTYPES, ConfigError, check_dtype, check_head_dim

ALGORITHMS = ("standard", "fa1", "fa2")
F32 = 4  # bytes of a float32 accumulator / statistic


@dataclass(frozen=True)
class Tiling:
    """Block sizes: B_r query rows and B_c key/value rows per tile."""

    B_r: int
    B_c: int

    def __post_init__(self):
        for name in ("B_r", "B_c"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ConfigError(f"{name}={v!r} must be a positive integer")
            object.__setattr__(self, name, int(v))

    def T_r(self, N: int) -> int:
        return -(-N // self.B_r)

    def T_c(self, N: int) -> int:
        return -(-N // self.B_c)


def sram_to_elements(sram_bytes: int, dtype: str) -> int:
    """M in elements of the input dtype, from bytes (floor)."""
    return check_sram_bytes(sram_bytes) // DTYPES[check_dtype(dtype)].itemsize


def paper_tiling(M_elements: int, d: int) -> Tiling:
    """Algorithm 1, line 1: B_c = ceil(M / 4d), B_r = min(ceil(M / 4d), d).

    M is in elements of the input dtype; d is any head dimension in 1..256 (elements;
    ConfigError otherwise). For large d the rule gives small blocks: B_c = ceil(M / 4d)
    rows, e.g. M = 48 KB of fp32 (12288 elements) and d = 256 give B_c = 12, B_r = 12;
    d = 59 gives B_c = 53, B_r = 53. The rule sizes the four B x d tiles (Q_i, K_j,
    V_j, O_i) to about M/4 each and ignores S and the statistics, so the real footprint
    (`sram_footprint_bytes`) exceeds M; we report that and do not reject it.
    """
    if isinstance(M_elements, bool) or not isinstance(M_elements, (int, np.integer)) \
            or M_elements < 1:
        raise ConfigError(f"M={M_elements!r} elements must be a positive integer")
    d = check_head_dim(d)
    b = -(-int(M_elements) // (4 * d))
    return Tiling(B_r=min(b, int(d)), B_c=b)


def sram_footprint_bytes(algorithm: str, B_r: int, B_c: int, d: int, dtype: str) -> int:
    """Bytes of on-chip (shared) memory one thread block of the schedule holds.

    This is exactly the dynamic shared-memory buffer the gpu kernels allocate:
      fa1, fa2:  Q_i (B_r x d) and K_j, V_j (B_c x d) in the input dtype;
                 O_i accumulator (B_r x d), S/P tile (B_r x B_c), m_i and l_i (B_r each)
                 in float32.
      standard:  the larger of its two tiled kernels: S = QK^T holds Q_i, K_j (input
                 dtype); O = PV holds P_ij (B_r x B_c) and V_j (B_c x d) in the input
                 dtype and O_i (B_r x d) in float32. (The row-wise softmax holds one row
                 of N float32 values; it is independent of the tiling and not counted.)
    """
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    B_r, B_c = Tiling(B_r, B_c).B_r, Tiling(B_r, B_c).B_c     # positive integers, or ConfigError
    d = check_head_dim(d)
    s = DTYPES[check_dtype(dtype)].itemsize
    if algorithm == "standard":
        qk = s * d * (B_r + B_c)
        pv = s * (B_r * B_c + B_c * d) + F32 * B_r * d
        return max(qk, pv)
    return s * d * (B_r + 2 * B_c) + F32 * (B_r * d + B_r * B_c + 2 * B_r)


def check_sram_bytes(sram_bytes) -> int:
    """sram_bytes (M in bytes) as an int if it is a positive integer, else ConfigError."""
    if isinstance(sram_bytes, bool) or not isinstance(sram_bytes, (int, np.integer)) \
            or sram_bytes <= 0:
        raise ConfigError(f"sram_bytes={sram_bytes!r} must be a positive integer (bytes)")
    return int(sram_bytes)


def check_tiling_fits(algorithm: str, tiling: Tiling, d: int, dtype: str, sram_bytes: int, *,
                      footprint_bytes: int | None = None, kernel: str | None = None) -> int:
    """The one rule for a tiling over the SRAM limit, in every path (the ledger's
    `resolve_tiling`, `flashsim traffic --levels`): a tiling the caller gives must fit,
    footprint <= sram_bytes (bytes of shared memory one thread block may use: M, or a
    GPU preset's `sram_bytes`), else ConfigError naming block_rows, block_cols, the
    footprint and the limit. Returns the footprint in bytes.

    footprint_bytes: the shared memory of the kernel that runs the tiling (a launch plan's
    smem_bytes, named by `kernel`); default: the schedule's own footprint,
    `sram_footprint_bytes`. Tilings a rule picks (the paper's rule, a kernel's default)
    are not checked here: the paper's rule may exceed M by design (`paper_tiling`)."""
    if not isinstance(tiling, Tiling):
        raise ConfigError(f"tiling={tiling!r} must be an iosim.Tiling(B_r, B_c)")
    sram_bytes = check_sram_bytes(sram_bytes)
    d = check_head_dim(d)
    fp = (sram_footprint_bytes(algorithm, tiling.B_r, tiling.B_c, d, dtype)
          if footprint_bytes is None else int(footprint_bytes))
    if fp > sram_bytes:
        what = f"the {algorithm} {kernel} kernel" if kernel else algorithm
        raise ConfigError(
            f"block_rows={tiling.B_r}, block_cols={tiling.B_c} need {fp} bytes of SRAM for "
            f"{what} at d={d}, {check_dtype(dtype)}, but sram_bytes={sram_bytes}; allowed: "
            f"tilings whose footprint fits sram_bytes")
    return fp


def resolve_tiling(algorithm: str, d: int, dtype: str, *, block_rows: int | None = None,
                   block_cols: int | None = None, sram_bytes: int | None = None) -> Tiling:
    """Tiling from explicit blocks, or from SRAM capacity M (bytes) by the paper's rule.

    Explicit blocks with a given `sram_bytes` must fit: footprint <= M, else ConfigError
    naming both numbers. With only `sram_bytes`, the paper's rule is used (M converted
    from bytes to elements of `dtype`), even if its footprint exceeds M.
    """
    d = check_head_dim(d)
    if (block_rows is None) != (block_cols is None):
        raise ConfigError("block_rows and block_cols must be given together "
                          f"(got block_rows={block_rows!r}, block_cols={block_cols!r})")
    if block_rows is not None:
        for name, v in (("block_rows", block_rows), ("block_cols", block_cols)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ConfigError(f"{name}={v!r} must be a positive integer")
        t = Tiling(block_rows, block_cols)
        if sram_bytes is not None:
            check_tiling_fits(algorithm, t, d, dtype, sram_bytes)
        return t
    if sram_bytes is None:
        raise ConfigError("give block_rows and block_cols, or sram_bytes (or a --gpu preset)")
    sram_bytes = check_sram_bytes(sram_bytes)
    M = sram_to_elements(sram_bytes, dtype)
    if M < 4 * d:
        raise ConfigError(
            f"head_dim d={d} is too large for sram_bytes={sram_bytes}: the paper's rule needs "
            f"M >= 4d = {4 * d} elements of {check_dtype(dtype)}, got M={M}")
    return paper_tiling(M, d)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["Tiling", "ALGORITHMS", "paper_tiling", "sram_footprint_bytes", "resolve_tiling",
           "check_tiling_fits", "check_sram_bytes", "sram_to_elements", "ceil_div"]
