"""The attention problem: what is computed, independent of hardware and tiling.

A `Problem` is batch x heads independent attention instances, each
    O = softmax(scale * Q K^T  [+ mask]) V,   Q, K, V, O in R^{N x d}.
Keys and values may have fewer heads (`kv_heads`, grouped / multi-query
attention): query head h reads K/V head h // (heads // kv_heads).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Storage dtypes and their size in bytes. Statistics (l, m, L, D) are always float32.
DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16)}
STAT_DTYPE = np.dtype(np.float32)
#: Tensors kept in float32 whatever the problem dtype.
STAT_TENSORS = frozenset({"l", "m", "L", "D"})


class ConfigError(ValueError):
    """Bad input: the message names the parameter, the value and what is allowed."""


def check_dtype(dtype) -> str:
    """Normalise 'fp32'/'float32'/np.float32/... to 'fp32' or 'fp16'."""
    aliases = {"fp32": "fp32", "float32": "fp32", "f4": "fp32",
               "fp16": "fp16", "float16": "fp16", "half": "fp16", "f2": "fp16"}
    key = dtype
    if not isinstance(dtype, str):
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype)
    if key not in aliases:
        raise ConfigError(f"dtype={dtype!r} is not supported; allowed: fp32, fp16")
    return aliases[key]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")
    return int(value)


class HeadsAndDtype:
    """What every attention problem derives from batch, heads, kv_heads and dtype
    (Problem here, iosim.decode.DecodeProblem)."""

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def instances(self) -> int:
        """Number of independent (batch, query head) attention instances."""
        return self.batch * self.heads

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class Problem(HeadsAndDtype):
    """One attention problem.

    N: sequence length (queries = keys). d: head dimension.
    dtype: storage dtype of Q, K, V, O (and of S, P for the standard algorithm).
    causal: query row r sees key column c iff c <= r.
    block_mask: optional boolean (T_r, T_c) array over (query block, key block) of the
        tiling it is used with; a False tile is skipped entirely (Proposition 4).
    """

    N: int
    d: int
    batch: int = 1
    heads: int = 1
    kv_heads: int | None = None
    dtype: str = "fp32"
    causal: bool = False
    block_mask: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for name in ("N", "d", "batch", "heads"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        kv = self.heads if self.kv_heads is None else _positive_int("kv_heads", self.kv_heads)
        if self.heads % kv:
            raise ConfigError(f"kv_heads={kv} must divide heads={self.heads}")
        object.__setattr__(self, "kv_heads", kv)
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        object.__setattr__(self, "causal", bool(self.causal))
        if self.block_mask is not None:
            m = np.asarray(self.block_mask)
            if m.ndim != 2 or m.dtype != np.bool_:
                raise ConfigError(
                    f"block_mask must be a 2-D boolean array (T_r, T_c); got dtype "
                    f"{m.dtype} with shape {m.shape}")
            m = m.copy()
            m.setflags(write=False)
            object.__setattr__(self, "block_mask", m)

    @property
    def itemsize(self) -> int:
        """Bytes per element of Q, K, V, O, S, P."""
        return DTYPES[self.dtype].itemsize

    def itemsize_of(self, tensor: str) -> int:
        """Bytes per element of a named tensor in HBM."""
        return STAT_DTYPE.itemsize if tensor in STAT_TENSORS else self.itemsize
