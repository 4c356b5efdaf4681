"""The attention problem: what is computed, independent of hardware and tiling.

A `Problem` is batch x heads independent attention instances, each
    O = softmax(scale * Q K^T  [+ mask]) V,   Q, O in R^{N_q x d},  K, V in R^{N_k x d},
with N = N_q (query rows) and N_k (key/value rows; default N_k = N).
Keys and values may have fewer heads (`kv_heads`, grouped / multi-query
attention): query head h reads K/V head h // (heads // kv_heads).

Masks are a band on the diagonal offset c - r (`band`), aligned bottom-right as in
flash-attn >= 2.1 and PyTorch's causal_lower_right: with o = N_k - N_q, query row r
(0-based) sees key c iff
    causal:            c <= r + o
    window=(wl, wr):   r + o - wl <= c <= r + o + wr   (-1: that side unbounded)
both at once when both are given (causal is the window's right side 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

#: NumPy's bfloat16 (ml_dtypes: NumPy has none of its own): 8 exponent bits like float32,
#: 7 mantissa bits, 2 bytes.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: Storage dtypes and their size in bytes (bf16 is 2 bytes, counted exactly as fp16).
#: Statistics (l, m, L, D) are always float32.
DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": BFLOAT16}
STAT_DTYPE = np.dtype(np.float32)
#: Tensors kept in float32 whatever the problem dtype.
STAT_TENSORS = frozenset({"l", "m", "L", "D"})
#: The dropout keep mask Z of the standard (unfused) algorithm: one byte (uint8) per element.
MASK_TENSORS = frozenset({"Z"})


class ConfigError(ValueError):
    """Bad input: the message names the parameter, the value and what is allowed."""


def check_dtype(dtype) -> str:
    """Normalise 'fp32'/'float32'/np.float32/... to 'fp32', 'fp16' or 'bf16' ('bfloat16',
    ml_dtypes.bfloat16)."""
    aliases = {"fp32": "fp32", "float32": "fp32", "f4": "fp32",
               "fp16": "fp16", "float16": "fp16", "half": "fp16", "f2": "fp16",
               "bf16": "bf16", "bfloat16": "bf16"}
    key = dtype
    if not isinstance(dtype, str):
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype)
    if key not in aliases:
        raise ConfigError(f"dtype={dtype!r} is not supported; allowed: fp32, fp16, bf16")
    return aliases[key]


#: Largest head dimension d (elements) a Problem, the tiling rules, the closed forms and the
#: GPU kernels take (flash-attn's limit): d is any integer in 1..MAX_HEAD_DIM.
MAX_HEAD_DIM = 256


def check_dropout_p(p) -> float:
    """p as a float; ConfigError naming dropout_p unless 0 <= p < 1 (a number)."""
    try:
        ok = not isinstance(p, bool) and 0.0 <= float(p) < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"dropout_p={p!r} is not allowed; allowed: a number with "
                          f"0 <= dropout_p < 1 (the probability of dropping an entry of P)")
    return float(p)


def check_head_dim(d) -> int:
    """d as an int if it is an integer in 1..MAX_HEAD_DIM (the head dimension, in elements),
    else ConfigError naming d and the allowed range."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 1 <= d <= MAX_HEAD_DIM:
        raise ConfigError(f"head dimension d={d!r} is not allowed; allowed: integers "
                          f"1..{MAX_HEAD_DIM}")
    return int(d)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")
    return int(value)


def check_flag(name: str, x) -> bool:
    """x as a bool if it is one (Python or NumPy bool, or the integers 0 and 1), else
    ConfigError naming `name`."""
    if isinstance(x, (bool, np.bool_)) or (isinstance(x, (int, np.integer)) and x in (0, 1)):
        return bool(x)
    raise ConfigError(f"{name}={x!r} is not allowed; allowed: True or False")


def check_window(window, causal: bool = False) -> tuple[int, int]:
    """(left, right) of a local window as flash-attn's window_size: each an integer >= -1,
    -1 meaning unbounded on that side. With causal=True the right side is 0 by
    definition: right = -1 or 0 is accepted (and kept as given), right > 0 is a
    ConfigError naming both values (flash-attn silently overrides it; we refuse rather
    than compute something the caller did not ask for)."""
    if window is None:
        window = (-1, -1)
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ConfigError(f"window={window!r} is not allowed; allowed: a pair (left, right) "
                          f"of integers >= -1 (-1: unbounded)") from None
    for name, x in (("left", left), ("right", right)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < -1:
            raise ConfigError(f"window={tuple(window)!r}: {name}={x!r} is not allowed; "
                              f"allowed: integers >= -1 (-1: unbounded)")
    if causal and right > 0:
        raise ConfigError(f"causal=True and window=({left}, {right}) were both given: causal "
                          f"fixes the window's right side to 0; allowed with causal: "
                          f"right = -1 or 0 (or causal=False, window=({left}, {right}))")
    return int(left), int(right)


def band_of(N_q: int, N_k: int, causal: bool, window=(-1, -1)):
    """(lo, hi): query row r sees key c iff lo <= c - r <= hi, None meaning unbounded.
    Bottom-right alignment, o = N_k - N_q: lo = o - left, hi = o + right (causal: hi = o)."""
    left, right = check_window(window, causal)
    o = N_k - N_q
    lo = None if left < 0 else o - left
    hi = o if causal else (None if right < 0 else o + right)
    return lo, hi


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

    N: query length N_q in rows (also `N_q`). d: head dimension (elements), any integer
        in 1..MAX_HEAD_DIM = 256 (`check_head_dim`).
    N_k: key/value length in rows; None (default) means N_k = N.
    dtype: storage dtype of Q, K, V, O (and of S, P for the standard algorithm).
    causal: query row r sees key column c iff c <= r + N_k - N_q (bottom-right aligned;
        for N_k = N: c <= r).
    window: (left, right) in key rows, flash-attn's window_size: row r sees keys
        r + o - left <= c <= r + o + right, o = N_k - N_q; -1 = unbounded (default
        (-1, -1): no window). With causal, right must be -1 or 0 (`check_window`).
    block_mask: optional boolean (T_r, T_c) array over (query block, key block) of the
        tiling it is used with, T_r = ceil(N_q / B_r), T_c = ceil(N_k / B_c); a False tile
        is skipped entirely (Proposition 4).
    A query row that sees no key (possible with N_q > N_k under causal, with a window,
    or under a block mask) gets O = 0 and L = -inf.
    dropout_p: probability p (0 <= p < 1, default 0) that dropout zeroes an entry of the
        softmax P (FlashAttention paper, Algorithms 2 and 4): O = (P o Z / (1 - p)) V with
        keep mask Z from iosim.dropout (Philox). fa1 and fa2 regenerate Z on chip (no
        extra traffic); standard writes Z to HBM as tensor "Z", 1 byte per element, and
        reads it back (iosim.closed_form, iosim.backward).
    """

    N: int
    d: int
    batch: int = 1
    heads: int = 1
    kv_heads: int | None = None
    dtype: str = "fp32"
    causal: bool = False
    block_mask: np.ndarray | None = field(default=None, compare=False, repr=False)
    N_k: int | None = None
    window: tuple = (-1, -1)
    dropout_p: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "dropout_p", check_dropout_p(self.dropout_p))
        for name in ("N", "batch", "heads"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        object.__setattr__(self, "d", check_head_dim(self.d))
        object.__setattr__(self, "N_k", self.N if self.N_k is None
                           else _positive_int("N_k", self.N_k))
        kv = self.heads if self.kv_heads is None else _positive_int("kv_heads", self.kv_heads)
        if self.heads % kv:
            raise ConfigError(f"kv_heads={kv} must divide heads={self.heads}")
        object.__setattr__(self, "kv_heads", kv)
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        object.__setattr__(self, "causal", check_flag("causal", self.causal))
        object.__setattr__(self, "window", check_window(self.window, self.causal))
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
    def N_q(self) -> int:
        """Query rows (= N)."""
        return self.N

    @property
    def band(self):
        """(lo, hi): row r sees key c iff lo <= c - r <= hi (None: unbounded); `band_of`."""
        return band_of(self.N, self.N_k, self.causal, self.window)

    @property
    def banded(self) -> bool:
        """Whether any (row, key) pair is masked by causal or the window."""
        return self.band != (None, None)

    @property
    def itemsize(self) -> int:
        """Bytes per element of Q, K, V, O, S, P."""
        return DTYPES[self.dtype].itemsize

    def itemsize_of(self, tensor: str) -> int:
        """Bytes per element of a named tensor in HBM."""
        if tensor in MASK_TENSORS:
            return 1
        return STAT_DTYPE.itemsize if tensor in STAT_TENSORS else self.itemsize
