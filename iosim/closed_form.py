"""Closed forms: the ledger of each forward schedule without executing it.

Everything reduces to four sums over the active tiles A of one instance:
    n_A  = |A|                       RA  = sum_{(i,j) in A} rows_i
    CA   = sum_{(i,j) in A} cols_j   RCA = sum_{(i,j) in A} rows_i cols_j
with rows_i = min(B_r, N_q - i B_r), cols_j = min(B_c, N_k - j B_c) (N = N_q query rows,
N_k key rows; N_k = N unless given). Per instance:

  standard  Q: RA d read     K: CA d read      S: RCA written, RCA read
            P: RCA written, RCA read           V: CA d read      O: N d written
  fa1       Q: RA d read     K, V: N_k d read each
            O: RA d read, (N + RA) d written   l, m: RA read, N + RA written each
  fa2       Q: N d read      K, V: CA d read each      O: N d written   L: N written
Dropout (Problem.dropout_p > 0): standard also writes and reads its keep mask Z
(RCA each, uint8: 1 byte per element); fa1 and fa2 regenerate it on chip (no change).

Dense (no causal, no window, no mask):  RA = N T_c, CA = N_k T_r, RCA = N N_k.
Causal: query block i sees a_i = floor(last_i / B_c) + 1 key blocks, last_i =
min((i+1) B_r, N) - 1. Summing a_i over the T_r - 1 full query blocks is a floor sum,
    F = sum_{t=0}^{T_r-2} floor((B_r t + B_r - 1) / B_c),
evaluated exactly in O(log) steps (`floor_sum`), vectorised over configurations.
Band (N_k != N, or a window; `band_sums`): the active key blocks of query block i are
one run j_lo(i)..j_hi(i) (the band is a diagonal strip), with first row r0 = i B_r, last
row r_l, and (lo, hi) the bounds on c - r (iosim.problem.band_of):
    j_hi = min(T_c - 1, floor((r_l + hi) / B_c))   (-1, none, when r_l + hi < 0)
    j_lo = max(0, floor((r0 + lo) / B_c))           (none when r0 + lo > N_k - 1)
so a_i = max(0, j_hi - j_lo + 1) tiles, whose columns sum to min((j_hi+1) B_c, N_k) -
j_lo B_c. Over the full query blocks both j_hi and j_lo are clipped floors of linear
functions of i, summed with `floor_sum` in O(log) steps, vectorised over configurations
(`band_tile_sums`; no loop over tiles or query blocks); `band_sums_by_block` sums the
runs block by block (O(T_r) NumPy), an independent derivation the tests compare.
A block-sparse mask has no formula; its sums are taken over the (T_r, T_c) mask itself.

Exact at every size: counts are int64 NumPy arrays (fast) where a cheap bound on the
inputs shows int64 holds every intermediate and result, and object arrays of Python
integers (exact, slower) otherwise (`int_dtype`), e.g. N = 4e9 for standard, whose
N^2 entries of S overflow int64. Scalars (`closed_form`) are Python ints.
"""
from __future__ import annotations

import numpy as np

from .ledger import Ledger
from .problem import MAX_HEAD_DIM, ConfigError, Problem
from .schedules import active_tiles
from .tiling import ALGORITHMS, Tiling

STAT = ("l", "m", "L")


#: int64 is used only while a bound on every intermediate stays below this
INT64_SAFE = 2.0 ** 62


def _max(x) -> float:
    """The largest |value| of an integer array or scalar, as a float (no overflow)."""
    x = np.asarray(x)
    if x.size == 0:
        return 0.0
    return float(max(abs(int(x.max())), abs(int(x.min()))))


def int_dtype(bound: float, *arrays):
    """np.int64 when `bound` (a float estimate of the largest intermediate) is safely
    inside int64 and no argument is already an object array; else object (Python ints)."""
    if bound < INT64_SAFE and not any(np.asarray(x).dtype == object for x in arrays):
        return np.int64
    return object


def _ints(dtype, *arrays):
    """The arrays as `dtype` integers (object: Python ints, exact at any size)."""
    if dtype is object:
        return tuple(np.array(np.asarray(x).astype(object).tolist() if np.ndim(x) else int(x),
                              dtype=object) for x in arrays)
    return tuple(np.asarray(x, dtype=np.int64) for x in arrays)


def _short(x) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def check_int_array(name: str, x, low: int = 1, high: int | None = None):
    """x (an integer or an array of integers: int dtypes, or object arrays of Python
    ints) if every value is in low..high, else ConfigError naming `name`. Floats, bools,
    strings and NaN are refused: truncating 8.5 rows to 8 would be a wrong answer."""
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):          # ragged nested lists
        a = None
    if a is None or a.dtype.kind not in "iuO" or (a.dtype == object and not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            for v in a.flat)):
        raise ConfigError(f"{name}={_short(x)} is not allowed; allowed: integers (or arrays "
                          f"of integers) >= {low}")
    if a.size and (int(a.min()) < low or (high is not None and int(a.max()) > high)):
        bad = int(a.min()) if int(a.min()) < low else int(a.max())
        if name == "d":
            raise ConfigError(f"head dimension d={bad} is not allowed; allowed: integers "
                              f"{low}..{high}")
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"{name}={bad} is not allowed; allowed: integers {span}")
    return x


def check_causal_array(causal):
    """causal (a bool, or an array of bools) as a bool array, else ConfigError."""
    a = np.asarray(causal) if not isinstance(causal, str) else None
    if a is None or a.dtype.kind != "b":
        raise ConfigError(f"causal={_short(causal)} is not allowed; allowed: True, False or "
                          f"an array of bools")
    return a


def check_arrays(*, causal, window, d, **sizes):
    """The arguments of the vectorised closed forms, checked: d integers in
    1..MAX_HEAD_DIM, every other size (N, B_r, B_c, ...) integers >= 1 (N_k and kv_heads
    may be None: their defaults), causal bools, window one (left, right) pair. Returns
    (causal as a bool array, window as a tuple); ConfigError naming the first bad one."""
    from .problem import check_window
    check_int_array("d", d, 1, MAX_HEAD_DIM)
    for name, x in sizes.items():
        if not (x is None and name in ("N_k", "kv_heads")):
            check_int_array(name, x, 1)
    return check_causal_array(causal), check_window(window)


def floor_sum(n, m, a, b):
    """sum_{i=0}^{n-1} floor((a i + b) / m) for integer arrays, n >= 0, m >= 1, a, b >= 0.
    Exact at any size (object arrays of Python ints where int64 could overflow)."""
    # every intermediate is at most about (n + 2)^2 max(a, b, m) (see the loop)
    big = max(_max(a), _max(b), _max(m)) + 1.0
    dt = int_dtype(4.0 * (_max(n) + 2.0) ** 2 * big, n, m, a, b)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (n, m, a, b)))
    # at least 1-d: NumPy turns 0-d object arrays into Python scalars mid-expression
    n, m, a, b = (np.array(np.broadcast_to(x, shape), dtype=dt).reshape(-1)
                  for x in _ints(dt, n, m, a, b))
    ans = np.zeros(n.shape, dtype=np.int64).astype(dt)
    live = np.asarray(n > 0, dtype=bool)
    while live.any():
        m = np.where(m > 0, m, 1)          # (never for live entries; Python ints raise)
        q = np.where(live & (a >= m), a // m, 0)
        ans += np.where(live, (n - 1) * n // 2 * q, 0)
        a = np.where(live, a - q * m, a)
        q = np.where(live & (b >= m), b // m, 0)
        ans += np.where(live, n * q, 0)
        b = np.where(live, b - q * m, b)
        y_max = a * n + b
        live = live & np.asarray(y_max >= m, dtype=bool)
        n = np.where(live, y_max // m, n)
        b = np.where(live, y_max % m, b)
        m, a = np.where(live, a, m), np.where(live, m, a)
    return ans.reshape(shape)


def band_sums_by_block(N_q: int, N_k: int, B_r: int, B_c: int, band) -> tuple[int, int, int, int]:
    """`band_sums` computed block by block: the run j_lo(i)..j_hi(i) of each of the T_r
    query blocks, vectorised NumPy (O(T_r) work). A second, independent derivation that
    the tests hold `band_sums` to."""
    lo, hi = band
    N_q, N_k, B_r, B_c = int(N_q), int(N_k), int(B_r), int(B_c)
    T_r, T_c = -(-N_q // B_r), -(-N_k // B_c)
    big = float(N_q) + N_k + B_r + B_c + abs(lo or 0) + abs(hi or 0) + 2.0
    # largest intermediate: a product rows * cols, an index times a block size, or a sum
    # (at most N_q N_k plus index terms)
    dt = int_dtype(4.0 * (big * (B_r + B_c) + float(N_q) * N_k + big))
    i = np.arange(T_r, dtype=np.int64).astype(dt)
    r0 = i * B_r
    r_last = np.minimum(r0 + B_r, N_q) - 1
    rows = r_last - r0 + 1
    if hi is None:
        j_hi = np.full(T_r, T_c - 1, dtype=np.int64).astype(dt)
    else:
        j_hi = np.minimum((r_last + hi) // B_c, T_c - 1)
        j_hi = np.where(r_last + hi < 0, -1, j_hi)
    if lo is None:
        j_lo = np.zeros(T_r, dtype=np.int64).astype(dt)
    else:
        x = r0 + lo
        j_lo = np.where(x > N_k - 1, T_c, np.maximum(x // B_c, 0))
    a = np.maximum(j_hi - j_lo + 1, 0)
    cols = np.where(a > 0, np.minimum((j_hi + 1) * B_c, N_k) - j_lo * B_c, 0)
    return int(a.sum()), int((rows * a).sum()), int(cols.sum()), int((rows * cols).sum())


def _cdiv(a, b):
    """ceil(a / b) for integer arrays, b > 0 (floor division rounds down for negatives)."""
    return -((-a) // b)


def _range_floor_sum(p, q, a, c, m):
    """sum_{i=p}^{q-1} floor((a i + c) / m) where a i + c >= 0 on the range (0 if q <= p)."""
    n = np.maximum(q - p, 0)
    b = np.where(n > 0, a * p + c, 0)
    return floor_sum(n, m, a, b)


def band_tile_sums(N_q, N_k, B_r, B_c, lo, hi):
    """(n_A, RA, CA, RCA) per instance for rows that see keys lo <= c - r <= hi; every
    argument an integer array (broadcast), an unbounded side given as a bound no pair
    reaches (lo <= -(N_q + B_r), hi >= N_k + B_c). O(log) per configuration.

    Full query blocks i = 0..T_r-2 (rows B_r): j_hi(i) = min(floor((B_r i + B_r - 1 + hi)
    / B_c), T_c - 1), j_lo(i) = max(floor((B_r i + lo) / B_c), 0), on the run of blocks
    whose last row reaches a key (B_r i + B_r - 1 + hi >= 0) and whose first row is not
    past the keys (B_r i + lo <= N_k - 1): there j_hi >= j_lo, and both sums split into a
    clipped part and a floor sum (`floor_sum`). The last (ragged) block is one term."""
    big = _max(N_q) + _max(N_k) + _max(B_r) + _max(B_c) + _max(lo) + _max(hi) + 2.0
    dt = int_dtype(16.0 * big * big, N_q, N_k, B_r, B_c, lo, hi)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (N_q, N_k, B_r, B_c, lo, hi)))
    N_q, N_k, B_r, B_c, lo, hi = (np.array(np.broadcast_to(x, shape), dtype=dt).reshape(-1)
                                  for x in _ints(dt, N_q, N_k, B_r, B_c, lo, hi))
    T_r, T_c = _cdiv(N_q, B_r), _cdiv(N_k, B_c)
    n = T_r - 1                                       # full query blocks
    ch = B_r - 1 + hi                                 # A(i) = B_r i + ch
    i_a = np.maximum(_cdiv(-ch, B_r), 0)              # first block with A >= 0
    i_e = np.minimum((N_k - 1 - lo) // B_r, n - 1)    # last block with B_r i + lo <= N_k - 1
    i_e1 = np.maximum(i_e + 1, i_a)                   # the run is [i_a, i_e1)
    cnt = i_e1 - i_a
    # sum of j_hi: floor part before it reaches T_c - 1, then T_c - 1
    i_s = np.clip(_cdiv((T_c - 1) * B_c - ch, B_r), i_a, i_e1)
    full_hi = i_e1 - i_s                              # blocks with j_hi = T_c - 1
    s_hi = _range_floor_sum(i_a, i_s, B_r, ch, B_c) + full_hi * (T_c - 1)
    # sum of j_lo: 0 before B_r i + lo >= 0, then the floor
    i_z = np.clip(_cdiv(-lo, B_r), i_a, i_e1)
    s_lo = _range_floor_sum(i_z, i_e1, B_r, lo, B_c)
    nA = s_hi - s_lo + cnt
    CA = B_c * (s_hi + cnt) - full_hi * (T_c * B_c - N_k) - B_c * s_lo
    RA, RCA = B_r * nA, B_r * CA
    # the last query block: rows n B_r .. N_q - 1
    r0 = n * B_r
    rows = N_q - r0
    A, Bv = N_q - 1 + hi, r0 + lo
    j_hi = np.where(A < 0, -1, np.minimum(A // B_c, T_c - 1))
    j_lo = np.where(Bv > N_k - 1, T_c, np.maximum(Bv // B_c, 0))
    a = np.maximum(j_hi - j_lo + 1, 0)
    cols = np.where(a > 0, np.minimum((j_hi + 1) * B_c, N_k) - j_lo * B_c, 0)
    out = (nA + a, RA + rows * a, CA + cols, RCA + rows * cols)
    return tuple(np.asarray(x).astype(dt).reshape(shape) for x in out)


def _bounds(N_q, N_k, B_r, B_c, lo, hi):
    """(lo, hi) with None replaced by bounds no pair reaches (see `band_tile_sums`)."""
    return (-(N_q + B_r) if lo is None else lo, N_k + B_c if hi is None else hi)


def band_sums(N_q: int, N_k: int, B_r: int, B_c: int, band) -> tuple[int, int, int, int]:
    """(n_A, RA, CA, RCA) per instance, as Python ints, for one problem whose rows see the
    keys lo <= c - r <= hi (band = (lo, hi), None unbounded; see the module docstring).
    Exact at any size (`band_tile_sums`: floor sums, int64 where a bound shows it holds,
    Python ints otherwise)."""
    N_q, N_k, B_r, B_c = int(N_q), int(N_k), int(B_r), int(B_c)
    lo, hi = _bounds(N_q, N_k, B_r, B_c, *band)
    return tuple(int(x[()]) for x in band_tile_sums(N_q, N_k, B_r, B_c, lo, hi))


def tile_sums(N, B_r, B_c, causal, *, N_k=None, window=(-1, -1)):
    """(n_A, RA, CA, RCA) per instance for dense or causal schedules; arrays broadcast.
    int64 arrays where that is exact (see `int_dtype`), object arrays otherwise.
    N_k (key rows, broadcasts; default N) and window=(left, right) (one pair for all):
    configurations with N_k != N or a window take `band_tile_sums` (floor sums)."""
    from .problem import check_window
    if N_k is not None or tuple(window) != (-1, -1):
        check_window(window)
        left, right = check_window(window)
        N_k = N if N_k is None else N_k
        dt = int_dtype(16.0 * (_max(N) + _max(N_k) + _max(B_r) + _max(B_c) + 2.0) ** 2,
                       N, N_k, B_r, B_c)
        # at least 1-d: NumPy turns 0-d object arrays into Python scalars mid-expression,
        # which np.where would then squeeze into int64 (OverflowError past 2^63)
        shape = np.broadcast_shapes(*(np.shape(x) for x in (N, N_k, B_r, B_c, causal)))
        N, N_k, B_r, B_c = (np.array(np.broadcast_to(x, shape), dtype=dt).reshape(-1)
                            for x in _ints(dt, N, N_k, B_r, B_c))
        causal = np.broadcast_to(np.asarray(causal, dtype=bool), shape).reshape(-1)
        o = N_k - N                                   # iosim.problem.band_of, vectorised
        lo = -(N + B_r) if left < 0 else o - left
        hi = np.where(causal, o, (N_k + B_c) if right < 0 else o + right).astype(dt)
        return tuple(x.reshape(shape) for x in band_tile_sums(N, N_k, B_r, B_c, lo, hi))
    dt = int_dtype(16.0 * (_max(N) + _max(B_r) + _max(B_c) + 2.0) ** 2, N, B_r, B_c)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (N, B_r, B_c, causal)))
    # at least 1-d: NumPy turns 0-d object arrays into Python scalars mid-expression
    N, B_r, B_c = (np.array(np.broadcast_to(x, shape), dtype=dt).reshape(-1)
                   for x in _ints(dt, N, B_r, B_c))
    causal = np.broadcast_to(np.asarray(causal, dtype=bool), shape).reshape(-1)
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
    pick = lambda c, d: np.where(causal, c, d).astype(dt).reshape(shape)
    return pick(nA_c, nA_d), pick(RA_c, RA_d), pick(CA_c, CA_d), pick(RCA_c, RCA_d)


def _mask_sums(problem: Problem, tiling: Tiling):
    N, N_k = problem.N, problem.N_k
    dt = int_dtype(4.0 * (float(N) + N_k + tiling.B_r + tiling.B_c) ** 2)
    A = active_tiles(problem, tiling).astype(dt)
    rows, cols = (np.minimum(B, n - np.arange(T) * B).astype(dt) for B, T, n in
                  ((tiling.B_r, tiling.T_r(N), N), (tiling.B_c, tiling.T_c(N_k), N_k)))
    return int(A.sum()), int(rows @ A.sum(axis=1)), int(A.sum(axis=0) @ cols), int(rows @ A @ cols)


def exact_ints(N, d, nA, RA, CA, RCA, factor: int = 1):
    """The arguments of a counts_from_sums, as object arrays of Python ints where a count
    (at most `factor` (RCA + (N + RA + CA) d)) could overflow int64; unchanged otherwise."""
    args = (N, d, nA, RA, CA, RCA)
    if all(isinstance(x, int) for x in args):
        return args                                  # Python ints: exact already
    bound = factor * (_max(RCA) + (_max(N) + _max(RA) + _max(CA)) * max(_max(d), 1.0))
    if int_dtype(4.0 * bound, *args) is np.int64:
        return args
    return _ints(object, *args)


def counts_from_sums(algorithm: str, N, d, nA, RA, CA, RCA, N_k=None, dropout=False):
    """Per-instance element counts: ({tensor: reads}, {tensor: writes}); arrays broadcast.
    N: query rows N_q; N_k: key rows (default N). dropout: whether dropout_p > 0 (the
    standard algorithm then stores its keep mask Z). Exact at any size (object arrays
    where int64 could overflow)."""
    N_k = N if N_k is None else N_k
    (N, d, nA, RA, CA, RCA), N_k = exact_ints(N, d, nA, RA, CA, RCA), \
        exact_ints(N_k, d, nA, RA, CA, RCA)[0]
    if algorithm == "standard":
        reads = {"Q": RA * d, "K": CA * d, "V": CA * d, "S": RCA, "P": RCA}
        writes = {"S": RCA, "P": RCA, "O": N * d}
        if dropout:
            reads["Z"] = RCA
            writes["Z"] = RCA
    elif algorithm == "fa1":
        reads = {"Q": RA * d, "K": N_k * d, "V": N_k * d, "O": RA * d, "l": RA, "m": RA}
        writes = {"O": (N + RA) * d, "l": N + RA, "m": N + RA}
    elif algorithm == "fa2":
        reads = {"Q": N * d, "K": CA * d, "V": CA * d}
        writes = {"O": N * d, "L": N}
    else:
        raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    return reads, writes


def problem_sums(problem: Problem, tiling: Tiling) -> tuple[int, int, int, int]:
    """(n_A, RA, CA, RCA) per instance of one problem: over its block mask where it has
    one, else by formula (floor sums for dense/causal with N_k = N, else `band_sums`)."""
    if problem.block_mask is not None:
        return _mask_sums(problem, tiling)
    if problem.N_k == problem.N and problem.window == (-1, -1):
        return tuple(int(x) for x in tile_sums(problem.N, tiling.B_r, tiling.B_c, problem.causal))
    return band_sums(problem.N, problem.N_k, tiling.B_r, tiling.B_c, problem.band)


def _check_algorithm(algorithm) -> str:
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: "
                          f"{', '.join(ALGORITHMS)}")
    return algorithm


def check_problem_tiling(problem, tiling, problem_type=Problem) -> None:
    """ConfigError unless problem is a `problem_type` (iosim.Problem, or VarlenProblem for
    the packed ledgers) and tiling an iosim.Tiling."""
    if not isinstance(problem, problem_type):
        raise ConfigError(f"problem={_short(problem)} is not allowed; allowed: an "
                          f"iosim.{problem_type.__name__}")
    if not isinstance(tiling, Tiling):
        raise ConfigError(f"tiling={_short(tiling)} is not allowed; allowed: an "
                          f"iosim.Tiling(B_r, B_c)")


def closed_form(algorithm: str, problem: Problem, tiling: Tiling) -> Ledger:
    """The ledger of `execute(algorithm, problem, tiling)`, computed by formula (totals)."""
    _check_algorithm(algorithm)
    check_problem_tiling(problem, tiling)
    nA, RA, CA, RCA = problem_sums(problem, tiling)
    reads, writes = counts_from_sums(algorithm, problem.N, problem.d, nA, RA, CA, RCA,
                                     problem.N_k, dropout=problem.dropout_p > 0)
    k = problem.instances
    return Ledger(algorithm, problem, tiling,
                  {t: int(c) * k for t, c in reads.items()},
                  {t: int(c) * k for t, c in writes.items()})


def closed_form_arrays(algorithm: str, N, d, B_r, B_c, *, causal=False, itemsize=2,
                       instances=1, N_k=None, window=(-1, -1)) -> dict:
    """Vectorised ledger for many configurations at once (dense or causal; no masks).
    N_k (key rows, broadcasts; default N) and window=(left, right) as iosim.Problem.

    All arguments broadcast (NumPy arrays or scalars). `itemsize` is bytes per element of
    Q, K, V, O, S, P (2 for fp16, 4 for fp32); statistics are 4 bytes. Returns a dict of
    arrays, problem totals over `instances` = batch * heads:
      reads / writes: {tensor: elements}, read_bytes, write_bytes, hbm_bytes.
    int64 arrays where int64 holds every count exactly, else object arrays of Python ints.
    """
    _check_algorithm(algorithm)
    causal, window = check_arrays(causal=causal, window=window, N=N, d=d, B_r=B_r, B_c=B_c,
                                  itemsize=itemsize, instances=instances, N_k=N_k)
    # counts are at most about 16 (N + B_r + B_c)^2 d instances elements, times 8 bytes
    bound = (128.0 * (_max(N) + (0.0 if N_k is None else _max(N_k)) + _max(B_r) + _max(B_c)
                      + 2.0) ** 2 * max(_max(d), 1.0)
             * max(_max(instances), 1.0) * max(_max(itemsize), 4.0))
    dt = int_dtype(bound, N, d, B_r, B_c, itemsize, instances)
    N, d, B_r, B_c, itemsize, instances = _ints(dt, N, d, B_r, B_c, itemsize, instances)
    bad_d = d[(d <= 0) | (d > MAX_HEAD_DIM)]
    if bad_d.size:
        raise ConfigError(f"head dimension d={int(bad_d.flat[0])} is not allowed; allowed: "
                          f"integers 1..{MAX_HEAD_DIM}")
    if (N <= 0).any() or (B_r <= 0).any() or (B_c <= 0).any():
        raise ConfigError("N, B_r and B_c must all be positive")
    if N_k is not None:
        (N_k,) = _ints(int_dtype(bound, N_k), N_k)
        if (N_k <= 0).any():
            raise ConfigError(f"N_k={N_k!r} is not allowed; allowed: positive integers")
    sums = tile_sums(N, B_r, B_c, causal, N_k=N_k, window=window)
    reads, writes = counts_from_sums(algorithm, N, d, *sums, N_k=N_k)
    reads = {t: c * instances for t, c in reads.items()}
    writes = {t: c * instances for t, c in writes.items()}
    nbytes = lambda t, c: c * (4 if t in STAT else itemsize)
    rb = sum(nbytes(t, c) for t, c in reads.items())
    wb = sum(nbytes(t, c) for t, c in writes.items())
    return {"reads": reads, "writes": writes, "read_bytes": rb, "write_bytes": wb,
            "hbm_bytes": rb + wb}
