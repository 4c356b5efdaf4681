"""Dropout on the attention probabilities (FlashAttention paper, Algorithms 2 and 4).

With keep mask Z (Z[r, c] = 1 keeps probability P[r, c], 0 drops it) and drop
probability p (0 <= p < 1), the output is
    O = (P o Z / (1 - p)) V,
and the backward (Algorithm 4) regenerates the same Z:
    dV = (P o Z / (1 - p))^T dO,   dP = (dO V^T) o Z / (1 - p),
    D = rowsum(dO o O) = rowsum(P o dP),   dS = P o (dP - D).
The row sums l of the softmax are taken BEFORE dropout (Algorithm 2, line 11), so P is
the undropped softmax and only P V sees the mask.

The mask comes from a counter-based RNG, Philox-4x32-10 (Salmon et al., "Parallel random
numbers: as easy as 1, 2, 3", SC 2011; the generator FlashAttention and PyTorch use), so a
kernel can regenerate any entry from its coordinates alone and nothing N x N need be
stored. Layout (flashsim's own; NOT bit-compatible with PyTorch's or flash-attn's
masks, which lay out counters differently):
    key     = (seed mod 2^32, floor(seed / 2^32) mod 2^32)      seed: 0 <= seed < 2^64
    counter = (col // 4, row, z, offset)                         z = b * heads + h
one Philox call per (instance, query row, group of 4 key columns); word col % 4 of its
output x (a uint32) gives the entry (row, col):
    u = x * 2^-32 in [0, 1),   keep iff u >= p,
evaluated exactly as the integer test x >= ceil(p * 2^32) (`keep_threshold`), which
the kernels use too (gpu._philox), so host and device masks are bit-identical.
Counters are distinct for every (instance, row, column group, offset) while N_q, N_k / 4,
batch * heads and the offset are below 2^32. Rows and columns are 0-based positions in
the full (N_q, N_k) score matrix of instance z; query head h (not its K/V head) keys it.
"""
from __future__ import annotations

import numpy as np

from .problem import ConfigError, check_dropout_p  # noqa: F401 (check_dropout_p: dropout_p is a Problem field)

#: Philox-4x32 round constants (Salmon et al. 2011; Random123's philox.h).
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9          # key schedule (golden ratio)
PHILOX_W1 = 0xBB67AE85          # key schedule (sqrt(3) - 1)
PHILOX_ROUNDS = 10
_U32 = np.uint64(0xFFFFFFFF)
_SH = np.uint64(32)


def _mulhilo(m: int, x):
    """(hi, lo) 32-bit halves of the 64-bit product m * x, x a uint64 array of uint32 values
    (the product of two values below 2^32 fits in 64 bits: no overflow)."""
    prod = np.uint64(m) * x
    return prod >> _SH, prod & _U32


def philox4x32(counter, key, rounds: int = PHILOX_ROUNDS):
    """Philox-4x32-`rounds` (default 10) of the Random123 reference, vectorised.

    counter: (c0, c1, c2, c3), each an integer or array of uint32 values (broadcast);
    key: (k0, k1), likewise. Returns four uint32 arrays (x0, x1, x2, x3). Arithmetic runs
    in uint64 holding uint32 values, reduced mod 2^32 after every operation."""
    c = [np.asarray(x, dtype=np.uint64) & _U32 for x in counter]
    k0, k1 = (np.asarray(x, dtype=np.uint64) & _U32 for x in key)
    c0, c1, c2, c3 = np.broadcast_arrays(*c, k0, k1)[:4]
    k0, k1 = np.broadcast_arrays(k0, k1, c0)[:2]
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(PHILOX_W0)) & _U32
        k1 = (k1 + np.uint64(PHILOX_W1)) & _U32
    return tuple(x.astype(np.uint32) for x in (c0, c1, c2, c3))


def check_seed(seed, offset=0) -> tuple[int, int]:
    """(seed, offset) as ints; ConfigError unless 0 <= seed < 2^64 and 0 <= offset < 2^32."""
    for name, x, top in (("dropout_seed", seed, 2 ** 64), ("dropout_offset", offset, 2 ** 32)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= int(x) < top:
            raise ConfigError(f"{name}={x!r} is not allowed; allowed: integers 0 <= "
                              f"{name} < 2^{top.bit_length() - 1}")
    return int(seed), int(offset)


def keep_threshold(p: float) -> int:
    """The integer t with (x * 2^-32 >= p) <=> (x >= t) for every uint32 x: ceil(p 2^32)
    (exact: p 2^32 is p's float64 with its exponent shifted). 0 for p = 0: keep all."""
    return int(np.ceil(check_dropout_p(p) * 2.0 ** 32))


def seed_key(seed: int) -> tuple[int, int]:
    """The Philox key (seed mod 2^32, seed >> 32 mod 2^32)."""
    return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


def keep_mask(seed: int, offset: int, b: int, h: int, rows, cols, p: float, *,
              heads: int) -> np.ndarray:
    """Boolean keep mask Z[r, c] over query rows `rows` x key columns `cols` (index arrays
    or ranges, 0-based positions in the (N_q, N_k) score matrix) of instance (batch b,
    query head h) of a problem with `heads` query heads. One Philox call per (row, group
    of 4 columns), counter (col // 4, row, b * heads + h, offset), key from `seed`
    (module docstring). True where the entry is kept (probability 1 - p)."""
    seed, offset = check_seed(seed, offset)
    thr = keep_threshold(p)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    cols = np.asarray(cols, dtype=np.int64).reshape(-1)
    groups = np.unique(cols // 4)
    words = philox4x32((groups[None, :], rows[:, None], b * heads + h, offset), seed_key(seed))
    x = np.stack(words, axis=-1)                                  # (rows, groups, 4)
    gi = np.searchsorted(groups, cols // 4)
    return x[:, gi, cols % 4].astype(np.uint64) >= np.uint64(thr)


def problem_keep_mask(problem, seed: int, offset: int = 0) -> np.ndarray:
    """Boolean (batch, heads, N_q, N_k) keep mask of a whole problem (`keep_mask` per
    instance); all True when problem.dropout_p = 0."""
    out = np.empty((problem.batch, problem.heads, problem.N, problem.N_k), dtype=bool)
    for b in range(problem.batch):
        for h in range(problem.heads):
            out[b, h] = keep_mask(seed, offset, b, h, range(problem.N), range(problem.N_k),
                                  problem.dropout_p, heads=problem.heads)
    return out


__all__ = ["PHILOX_M0", "PHILOX_M1", "PHILOX_W0", "PHILOX_W1", "check_dropout_p", "check_seed",
           "keep_mask", "keep_threshold", "philox4x32", "problem_keep_mask", "seed_key"]
