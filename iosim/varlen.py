"""Packed variable-length batches (flash-attn's `flash_attn_varlen_func`).

A `VarlenProblem` is `batch` sequences of different lengths packed along one row axis:
sequence b has N_q_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] query rows and N_k_b =
cu_seqlens_k[b+1] - cu_seqlens_k[b] key/value rows; q is (total_q, heads, d), k and v are
(total_k, kv_heads, d) (flash-attn's layout), total_q = cu_seqlens_q[-1]. Causal and
windows align bottom-right per sequence (iosim.problem.band_of with o_b = N_k_b - N_q_b):
row r of sequence b sees its key c iff c <= r + N_k_b - N_q_b (causal), and likewise for
window=(left, right). Grouped K/V as iosim.Problem.

Counting convention: the ledger of a packed problem is by definition the sum over its
sequences of the per-sequence ledgers (iosim.closed_form on Problem(N=N_q_b, N_k=N_k_b,
batch=1, ...)), the tiling applied per sequence (T_r_b = ceil(N_q_b / B_r), T_c_b =
ceil(N_k_b / B_c)): a tile never straddles two sequences and there is no padding, so no
work and no traffic for padding. A sequence with N_q_b = 0 costs nothing and outputs
nothing; one with N_q_b > 0 and N_k_b = 0 has rows that see no key (O = 0, L = -inf):
it touches no K/V tile, its counts are the schedule's with every tile sum zero
(fa2: N_q_b d reads of Q, N_q_b d writes of O, N_q_b writes of L per query head).
Counts are totals over sequences and query heads, in elements (bytes via `itemsize_of`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from .ledger import CountingMemory, TrafficCounts
from .problem import (DTYPES, STAT_DTYPE, ConfigError, HeadsAndDtype, Problem, check_dtype,
                      check_head_dim, check_window, _positive_int, MASK_TENSORS, STAT_TENSORS)
from .tiling import ALGORITHMS, Tiling


def check_cu_seqlens(name: str, cu, total: int | None = None) -> tuple[int, ...]:
    """cu_seqlens (cumulative sequence starts, length batch + 1) as a tuple of ints, or a
    ConfigError naming `name`, the value and what is allowed: a 1-D sequence of at least
    2 integers, starting at 0, non-decreasing, and (when `total` is given: the packed
    tensor's row count) ending at `total`."""
    arr = np.asarray(cu)
    if arr.ndim != 1 or arr.size < 2:
        raise ConfigError(f"{name}={cu!r} is not allowed; allowed: a 1-D sequence of "
                          f"batch + 1 >= 2 integers (cumulative sequence starts)")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or
                                     (arr.dtype == object and all(
                                         isinstance(x, (int, np.integer)) and
                                         not isinstance(x, bool) for x in arr))):
        raise ConfigError(f"{name}={cu!r} has dtype {arr.dtype}; allowed: integers")
    vals = tuple(int(x) for x in arr)
    if vals[0] != 0:
        raise ConfigError(f"{name}={list(vals)} starts at {vals[0]}; allowed: "
                          f"{name}[0] = 0")
    bad = [b for b in range(len(vals) - 1) if vals[b + 1] < vals[b]]
    if bad:
        b = bad[0]
        raise ConfigError(f"{name}={list(vals)} decreases at index {b + 1} "
                          f"({vals[b]} -> {vals[b + 1]}); allowed: non-decreasing integers")
    if total is not None and vals[-1] != int(total):
        raise ConfigError(f"{name}={list(vals)} ends at {vals[-1]} but the packed tensor "
                          f"has {int(total)} rows; allowed: {name}[-1] = {int(total)}")
    return vals


def _offsets(seqlens) -> list[int]:
    """[0, N_0, N_0 + N_1, ...]: exact Python ints at any size."""
    return [0, *itertools.accumulate(seqlens)]


def _int32_offsets(name: str, seqlens) -> np.ndarray:
    cu = _offsets(seqlens)
    top = int(np.iinfo(np.int32).max)
    if cu[-1] > top:
        raise ConfigError(f"{name}: {cu[-1]} packed rows do not fit the kernels' int32 "
                          f"offsets; allowed: at most {top} rows (the model's ledgers, "
                          f"varlen_closed_form, take any size)")
    return np.array(cu, dtype=np.int32)


@dataclass(frozen=True)
class VarlenProblem(HeadsAndDtype):
    """A packed batch of `batch = len(seqlens_q)` attention problems of their own lengths.

    seqlens_q, seqlens_k: per-sequence query rows N_q_b and key rows N_k_b (>= 0; tuples
        of ints of equal length batch). `from_cu_seqlens` builds one from flash-attn's
        cumulative arrays.
    d, heads, kv_heads, dtype, causal, window: as iosim.Problem, shared by every sequence.
    `sequences()` gives each sequence's iosim.Problem (None for N_q_b = 0 or N_k_b = 0).
    """

    seqlens_q: tuple
    seqlens_k: tuple
    d: int
    heads: int = 1
    kv_heads: int | None = None
    dtype: str = "fp32"
    causal: bool = False
    window: tuple = (-1, -1)

    def __post_init__(self):
        sq, sk = self.seqlens_q, self.seqlens_k
        for name, s in (("seqlens_q", sq), ("seqlens_k", sk)):
            try:
                ok = all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                         and x >= 0 for x in s)
            except TypeError:
                ok = False
            if not ok:
                raise ConfigError(f"{name}={s!r} is not allowed; allowed: a sequence of "
                                  f"integers >= 0 (rows per sequence)")
        sq, sk = tuple(int(x) for x in sq), tuple(int(x) for x in sk)
        if len(sq) != len(sk) or not sq:
            raise ConfigError(f"seqlens_q has {len(sq)} sequences and seqlens_k "
                              f"{len(sk)}; allowed: the same number, at least 1")
        object.__setattr__(self, "seqlens_q", sq)
        object.__setattr__(self, "seqlens_k", sk)
        object.__setattr__(self, "d", check_head_dim(self.d))
        h = _positive_int("heads", self.heads)
        kv = h if self.kv_heads is None else _positive_int("kv_heads", self.kv_heads)
        if h % kv:
            raise ConfigError(f"kv_heads={kv} must divide heads={h}")
        object.__setattr__(self, "heads", h)
        object.__setattr__(self, "kv_heads", kv)
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        from .problem import check_flag
        object.__setattr__(self, "causal", check_flag("causal", self.causal))
        object.__setattr__(self, "window", check_window(self.window, self.causal))

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens_q, cu_seqlens_k, d, *, total_q=None, total_k=None,
                        **kw) -> "VarlenProblem":
        """From flash-attn's cu_seqlens_q, cu_seqlens_k (length batch + 1, starting at 0,
        non-decreasing; `check_cu_seqlens`); total_q / total_k: the packed tensors' row
        counts, checked against the last entries when given."""
        cq = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q)
        ck = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, total_k)
        if len(cq) != len(ck):
            raise ConfigError(f"cu_seqlens_q has {len(cq)} entries and cu_seqlens_k "
                              f"{len(ck)}; allowed: the same number (batch + 1)")
        return cls(tuple(np.diff(cq).tolist()), tuple(np.diff(ck).tolist()), d, **kw)

    @property
    def batch(self) -> int:
        """Number of sequences (zero-length ones included)."""
        return len(self.seqlens_q)

    @property
    def cu_seqlens_q(self) -> np.ndarray:
        """int32 (batch + 1,): row offset of each sequence in the packed q (as the kernels
        and flash-attn take it; ConfigError past int32, where it would wrap)."""
        return _int32_offsets("cu_seqlens_q", self.seqlens_q)

    @property
    def cu_seqlens_k(self) -> np.ndarray:
        return _int32_offsets("cu_seqlens_k", self.seqlens_k)

    @property
    def total_q(self) -> int:
        """Packed query rows: sum of N_q_b."""
        return sum(self.seqlens_q)

    @property
    def total_k(self) -> int:
        return sum(self.seqlens_k)

    @property
    def max_seqlen_q(self) -> int:
        return max(self.seqlens_q)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    def itemsize_of(self, tensor: str) -> int:
        """Bytes per element of a named tensor in HBM (as iosim.Problem)."""
        if tensor in MASK_TENSORS:
            return 1
        return STAT_DTYPE.itemsize if tensor in STAT_TENSORS else self.itemsize

    def sequence(self, b: int) -> Problem | None:
        """Sequence b as an iosim.Problem (batch 1), None when N_q_b = 0 or N_k_b = 0
        (Problem needs positive lengths; see the module docstring for their counts)."""
        nq, nk = self.seqlens_q[b], self.seqlens_k[b]
        if nq == 0 or nk == 0:
            return None
        return Problem(N=nq, d=self.d, batch=1, heads=self.heads, kv_heads=self.kv_heads,
                       dtype=self.dtype, causal=self.causal, N_k=nk, window=self.window)

    def T_r(self, tiling: Tiling) -> tuple[int, ...]:
        """Query blocks per sequence, T_r_b = ceil(N_q_b / B_r)."""
        return tuple(tiling.T_r(n) for n in self.seqlens_q)


@dataclass(frozen=True)
class VarlenLedger(TrafficCounts):
    """HBM traffic of one schedule on a packed problem: element counts are totals over
    all sequences and query heads (iosim.ledger's conventions per sequence).
    `hbm_bytes_per_head` is the mean per (sequence, query head) pair, zero-length
    sequences included."""

    algorithm: str
    problem: VarlenProblem
    tiling: Tiling
    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The keys of iosim.Ledger.to_dict (seq_len, seq_len_kv: total_q, total_k packed
        rows; batch: sequences) plus cu_seqlens_q, cu_seqlens_k."""
        from .tiling import sram_footprint_bytes
        p, t = self.problem, self.tiling
        return {
            "algorithm": self.algorithm,
            "batch": p.batch, "heads": p.heads, "kv_heads": p.kv_heads,
            "seq_len": p.total_q, "head_dim": p.d, "dtype": p.dtype, "causal": p.causal,
            "seq_len_kv": p.total_k, "window": list(p.window),
            "block_sparse": False,
            "cu_seqlens_q": _offsets(p.seqlens_q), "cu_seqlens_k": _offsets(p.seqlens_k),
            "block_rows": t.B_r, "block_cols": t.B_c,
            "hbm_read_bytes": self.hbm_read_bytes,
            "hbm_write_bytes": self.hbm_write_bytes,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bytes_per_head": self.hbm_bytes_per_head,
            "per_tensor": self.per_tensor(),
            "sram_footprint_bytes": sram_footprint_bytes(self.algorithm, t.B_r, t.B_c, p.d,
                                                         p.dtype),
        }


def _check_problem_tiling(problem, tiling) -> None:
    from .closed_form import check_problem_tiling
    check_problem_tiling(problem, tiling, VarlenProblem)


def _check_algorithm(algorithm: str) -> None:
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: "
                          f"{', '.join(ALGORITHMS)}")


def _no_key_counts(algorithm: str, N_q: int, d: int) -> tuple[dict, dict]:
    """Per-instance counts of a sequence with N_q query rows and no keys: the schedule's
    counts with every tile sum (n_A, RA, CA, RCA) zero."""
    from .closed_form import counts_from_sums
    reads, writes = counts_from_sums(algorithm, N_q, d, 0, 0, 0, 0, 0)
    return ({t: int(c) for t, c in reads.items()}, {t: int(c) for t, c in writes.items()})


def _add(acc: dict, counts: dict, k: int = 1) -> None:
    for t, c in counts.items():
        if c:
            acc[t] = acc.get(t, 0) + int(c) * k


def varlen_closed_form(algorithm: str, problem: VarlenProblem, tiling: Tiling) -> VarlenLedger:
    """The ledger of a packed problem by formula: the sum over sequences of
    iosim.closed_form per sequence (totals in elements; module docstring)."""
    from .closed_form import closed_form
    _check_algorithm(algorithm)
    _check_problem_tiling(problem, tiling)
    reads: dict = {}
    writes: dict = {}
    for b in range(problem.batch):
        p = problem.sequence(b)
        if p is not None:
            led = closed_form(algorithm, p, tiling)
            _add(reads, led.reads)
            _add(writes, led.writes)
        elif problem.seqlens_q[b]:
            r, w = _no_key_counts(algorithm, problem.seqlens_q[b], problem.d)
            _add(reads, r, problem.heads)
            _add(writes, w, problem.heads)
    return VarlenLedger(algorithm, problem, tiling, reads, writes)


class VarlenExecution:
    """Result of `execute_varlen`: O packed (total_q, heads, d) in the problem dtype, L
    packed (heads, total_q) float32 (flash-attn's softmax_lse layout; fa2 and fa1, None
    for standard) and the ledger."""

    def __init__(self, O, L, ledger: VarlenLedger):
        self.O, self.L, self.ledger = O, L, ledger


def random_varlen_inputs(problem: VarlenProblem, seed: int = 0):
    """Standard-normal packed q (total_q, heads, d), k, v (total_k, kv_heads, d)."""
    rng = np.random.default_rng(seed)
    dt = problem.np_dtype
    q = rng.standard_normal((problem.total_q, problem.heads, problem.d)).astype(dt)
    k = rng.standard_normal((problem.total_k, problem.kv_heads, problem.d)).astype(dt)
    v = rng.standard_normal((problem.total_k, problem.kv_heads, problem.d)).astype(dt)
    return q, k, v


def check_packed(problem: VarlenProblem, q, k, v) -> None:
    """ConfigError unless q is (total_q, heads, d) and k, v are (total_k, kv_heads, d)."""
    for name, x, n, h in (("q", q, problem.total_q, problem.heads),
                          ("k", k, problem.total_k, problem.kv_heads),
                          ("v", v, problem.total_k, problem.kv_heads)):
        if np.shape(x) != (n, h, problem.d):
            raise ConfigError(f"{name} has shape {np.shape(x)}; the packed problem needs "
                              f"{(n, h, problem.d)} (total rows, heads, d)")


def execute_varlen(algorithm: str, problem: VarlenProblem, tiling: Tiling, q=None, k=None,
                   v=None, *, scale: float | None = None, seed: int = 0) -> VarlenExecution:
    """Run the schedule sequence by sequence (iosim.execute on each sequence's Problem,
    its rows cut from the packed q, k, v) and pack the outputs; the ledger is the sum of
    the executed per-sequence ledgers. A sequence with N_k_b = 0 < N_q_b is written
    O = 0, L = -inf through a counting memory (Q read, O and statistics written, as the
    schedule does when it visits no tile)."""
    from .schedules import check_scale, execute
    _check_algorithm(algorithm)
    if q is None:
        q, k, v = random_varlen_inputs(problem, seed)
    check_packed(problem, q, k, v)
    dt = problem.np_dtype
    q, k, v = (np.asarray(x, dtype=dt) for x in (q, k, v))
    scale = check_scale(1.0 / np.sqrt(problem.d) if scale is None else scale)
    H, d = problem.heads, problem.d
    O = np.zeros((problem.total_q, H, d), dtype=dt)
    L = None if algorithm == "standard" else np.zeros((H, problem.total_q), dtype=np.float32)
    reads: dict = {}
    writes: dict = {}
    cq, ck = problem.cu_seqlens_q, problem.cu_seqlens_k
    for b in range(problem.batch):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        p = problem.sequence(b)
        if p is not None:
            # (rows, heads, d) -> (1, heads, rows, d)
            qs, ks, vs = (np.ascontiguousarray(x[a:z].transpose(1, 0, 2))[None]
                          for x, a, z in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
            ex = execute(algorithm, p, tiling, qs, ks, vs, scale=scale)
            O[q0:q1] = ex.O[0].transpose(1, 0, 2)
            if L is not None:
                L[:, q0:q1] = (ex.stats["L"][0] if algorithm == "fa2" else
                               _fa1_L(ex.stats["l"][0], ex.stats["m"][0]))
            _add(reads, ex.ledger.reads)
            _add(writes, ex.ledger.writes)
        elif q1 > q0:                   # rows that see no key: O = 0, L = -inf
            n = q1 - q0
            mem = CountingMemory(Q=q[q0:q1], O=O[q0:q1])
            for h in range(H):
                mem.read("Q", slice(None), h)
                mem.write("O", 0, slice(None), h)
            if L is not None:
                L[:, q0:q1] = -np.inf
            stats = {"fa2": ("L",), "fa1": ("l", "m"), "standard": ()}[algorithm]
            for s in stats:
                mem.writes[s] = mem.writes.get(s, 0) + n * H
            if algorithm != "fa2":      # fa1 / standard read Q per active tile: none
                mem.reads.pop("Q")
            _add(reads, mem.reads)
            _add(writes, mem.writes)
    return VarlenExecution(O, L, VarlenLedger(algorithm, problem, tiling, reads, writes))


def _fa1_L(l, m):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (m + np.log(l)).astype(np.float32)


def reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, window=(-1, -1),
                     scale=None):
    """Dense float64 reference, sequence by sequence (iosim.reference_attention): O packed
    (total_q, heads, d) float64 and L (heads, total_q) float64 (-inf for rows that see
    no key, O = 0 there)."""
    from .reference import reference_attention
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    total_q, H, d = q.shape
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    O = np.zeros((total_q, H, d))
    L = np.full((H, total_q), -np.inf)
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        o, lse = reference_attention(q[q0:q1].transpose(1, 0, 2), k[k0:k1].transpose(1, 0, 2),
                                     v[k0:k1].transpose(1, 0, 2), causal=causal,
                                     window=window, scale=scale, return_lse=True)
        O[q0:q1] = o.transpose(1, 0, 2)
        L[:, q0:q1] = lse
    return O, L


# ---------------------------------------------------------------------------------------
# Backward (iosim.backward per sequence)
# ---------------------------------------------------------------------------------------
def _backward_algorithm(algorithm: str) -> None:
    from .backward import _check_algorithm as check
    check(algorithm)


def _degenerate_backward_counts(algorithm: str, problem: VarlenProblem, b: int):
    """Totals over query heads of the backward of sequence b when N_q_b = 0 or N_k_b = 0:
    the schedule's counts (iosim.backward.backward_counts_from_sums) with every tile sum
    zero, plus the grouped-heads sum over its N_k_b key rows. fa2: N_q_b = 0 < N_k_b reads
    K_j, V_j and writes dK_j = dV_j = 0 per key block; N_k_b = 0 < N_q_b runs the
    pre-pass (D, dQacc = 0) and the conversion (dQ = 0)."""
    from .backward import _add_group_reduction, backward_counts_from_sums
    nq, nk, d, H = problem.seqlens_q[b], problem.seqlens_k[b], problem.d, problem.heads
    r, w = backward_counts_from_sums(algorithm, nq, d, 0, 0, 0, 0, N_k=nk)
    reads = {t: int(c) * H for t, c in r.items() if int(c)}
    writes = {t: int(c) * H for t, c in w.items() if int(c)}
    _add_group_reduction(reads, writes, nk, d, 1, H, problem.kv_heads)
    return ({t: int(c) for t, c in reads.items() if int(c)},
            {t: int(c) for t, c in writes.items() if int(c)})


def varlen_backward_closed_form(problem: VarlenProblem, tiling: Tiling,
                                algorithm: str = "fa2"):
    """The backward ledger of a packed problem by formula: the sum over sequences of
    iosim.backward_closed_form(algorithm, Problem(N=N_q_b, N_k=N_k_b, batch=1, ...)),
    the grouped-heads sum included (totals in elements; an iosim.BackwardLedger of
    algorithm '<algorithm>-backward' whose problem is the VarlenProblem). A sequence
    with N_q_b = 0 or N_k_b = 0 counts as `_degenerate_backward_counts` says (nothing
    when both are 0)."""
    from .backward import BackwardLedger, backward_closed_form
    _backward_algorithm(algorithm)
    _check_problem_tiling(problem, tiling)
    reads: dict = {}
    writes: dict = {}
    for b in range(problem.batch):
        p = problem.sequence(b)
        if p is not None:
            led = backward_closed_form(algorithm, p, tiling)
            r, w = led.reads, led.writes
        else:
            r, w = _degenerate_backward_counts(algorithm, problem, b)
        _add(reads, r)
        _add(writes, w)
    return BackwardLedger(f"{algorithm}-backward", problem, tiling, reads, writes)


class VarlenBackwardExecution:
    """Result of `execute_varlen_backward`: dq packed (total_q, heads, d), dk, dv packed
    (total_k, kv_heads, d) in the problem dtype, O packed (the forward's) and the
    backward-only ledger (iosim.BackwardLedger, totals)."""

    def __init__(self, dq, dk, dv, ledger, O):
        self.dq, self.dk, self.dv, self.ledger, self.O = dq, dk, dv, ledger, O


def execute_varlen_backward(problem: VarlenProblem, tiling: Tiling, q=None, k=None, v=None,
                            do=None, *, algorithm: str = "fa2", scale: float | None = None,
                            seed: int = 0) -> VarlenBackwardExecution:
    """iosim.execute_backward on each sequence (its rows cut from the packed q, k, v, do;
    forward uncounted, backward counted) with the gradients packed and the ledgers summed.
    A sequence with N_q_b = 0 or N_k_b = 0 gets zero gradients and adds the counts of its
    zero-sum schedule (`_degenerate_backward_counts`; iosim.backward's Problem needs
    positive lengths, so there is no per-sequence execution to run)."""
    from .backward import BackwardLedger, execute_backward
    from .schedules import check_scale
    _backward_algorithm(algorithm)
    if q is None:
        q, k, v = random_varlen_inputs(problem, seed)
    check_packed(problem, q, k, v)
    dt = problem.np_dtype
    H, Hk, d = problem.heads, problem.kv_heads, problem.d
    if do is None:
        do = np.random.default_rng(seed + 1).standard_normal(
            (problem.total_q, H, d)).astype(dt)
    if np.shape(do) != (problem.total_q, H, d):
        raise ConfigError(f"do has shape {np.shape(do)}; the packed problem needs "
                          f"{(problem.total_q, H, d)}")
    q, k, v, do = (np.asarray(x, dtype=dt) for x in (q, k, v, do))
    scale = check_scale(1.0 / np.sqrt(d) if scale is None else scale)
    O = np.zeros((problem.total_q, H, d), dtype=dt)
    dq = np.zeros((problem.total_q, H, d), dtype=dt)
    dk = np.zeros((problem.total_k, Hk, d), dtype=dt)
    dv = np.zeros((problem.total_k, Hk, d), dtype=dt)
    reads: dict = {}
    writes: dict = {}
    cq, ck = problem.cu_seqlens_q, problem.cu_seqlens_k
    cut = lambda x, a, z: np.ascontiguousarray(x[a:z].transpose(1, 0, 2))[None]
    for b in range(problem.batch):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        p = problem.sequence(b)
        if p is not None:
            ex = execute_backward(algorithm, p, tiling, cut(q, q0, q1), cut(k, k0, k1),
                                  cut(v, k0, k1), cut(do, q0, q1), scale=scale)
            O[q0:q1] = ex.O[0].transpose(1, 0, 2)
            dq[q0:q1] = ex.dq[0].transpose(1, 0, 2)
            dk[k0:k1] = ex.dk[0].transpose(1, 0, 2)
            dv[k0:k1] = ex.dv[0].transpose(1, 0, 2)
            _add(reads, ex.ledger.reads)
            _add(writes, ex.ledger.writes)
        elif q1 > q0 or k1 > k0:        # the zero-sum schedule: gradients 0, counted
            r, w = _degenerate_backward_counts(algorithm, problem, b)
            _add(reads, r)
            _add(writes, w)
    return VarlenBackwardExecution(dq, dk, dv, BackwardLedger(
        f"{algorithm}-backward", problem, tiling, reads, writes), O)


def reference_varlen_backward(q, k, v, do, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                              window=(-1, -1), scale=None):
    """Dense float64 reference gradients, sequence by sequence
    (iosim.reference_attention_backward): dq packed (total_q, heads, d), dk, dv packed
    (total_k, kv_heads, d), float64; zero for sequences with no queries or no keys and
    for rows that see no key."""
    from .backward import reference_attention_backward
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        t = lambda x, a, z: x[a:z].transpose(1, 0, 2)
        g = reference_attention_backward(t(q, q0, q1), t(k, k0, k1), t(v, k0, k1),
                                         t(do, q0, q1), causal=causal, window=window,
                                         scale=scale)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (x.transpose(1, 0, 2) for x in g)
    return dq, dk, dv


__all__ = ["VarlenProblem", "VarlenLedger", "VarlenExecution", "check_cu_seqlens",
           "varlen_closed_form", "execute_varlen", "random_varlen_inputs", "reference_varlen",
           "check_packed", "varlen_backward_closed_form", "execute_varlen_backward",
           "reference_varlen_backward", "VarlenBackwardExecution"]
