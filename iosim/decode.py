"""KV-cache decoding: N_q new query rows per sequence against a cache of N_kv rows.

The host-side model of decoding (issue 20, the model part): the schedules run for real
with NumPy numerics through a `CountingMemory`, and `decode_closed_form` gives the same
ledger by formula. No GPU kernel here.

Problem. batch sequences x heads query heads, each
    O = softmax(scale * Q K^T + mask) V,   Q, O in R^{N_q x d};  K, V in R^{N_kv x d},
K/V heads grouped as in the forward (query head h reads K/V head h // (heads // kv_heads)).
Mask: bottom-right causal alignment. The N_q new rows are the last N_q positions of the
sequence, so query row r (0-based among the new rows) sees cache rows c <= N_kv - N_q + r.
For N_q = 1 that is the whole cache; row N_q - 1 always sees the whole cache, so no K/V
block is ever skipped and the traffic does not depend on the K/V block size.

Cache layout. page_size = None: K and V contiguous, (batch, kv_heads, N_kv, d).
page_size = P: the cache lives in pages of P rows holding every K/V head (flash-attn's
(num_pages, P, kv_heads, d)); logical page p of sequence b is physical page
block_table[b, p] (int32), the pages scattered (a random permutation of the pool). The
last page of a sequence is ragged when P does not divide N_kv.

Schedules (one thread block = one "reader"; readers per split R = batch x heads for
kv_reads="per_query_head", batch x kv_heads for "per_group"):
  fa2_decode  one block per reader: read Q (its N_q rows, for each query head it
              serves), every K/V block of the cache once, write O (N_q x d, problem
              dtype) and L (N_q, float32) for each of its query heads.
  split_kv    num_splits = S blocks per reader: split s takes the contiguous chunk of
              rows [s C, min((s+1) C, N_kv)), C = ceil(N_kv / S) (the last ragged); it
              reads Q and its chunk of K/V and writes Opart[s] (N_q x d) and Lpart[s]
              (N_q), both float32. A combine step per (batch, query head) reads all S
              Opart and Lpart and writes O (problem dtype) and L:
                  M = max_s Lpart_s,  w_s = exp(Lpart_s - M),
                  O = sum_s w_s Opart_s / sum_s w_s,  L = M + log sum_s w_s.
              A row that sees no key of a chunk gets Opart = 0, Lpart = -inf (weight 0).
  paged       either schedule on a paged problem: a block walks the pages its rows
              touch; per page it reads one block-table entry ("block_table", int32)
              and then the page's K/V rows that lie in its chunk.
Grouped heads, kv_reads:
  "per_query_head"  each query head's block reads its group's K/V itself (as the forward
                    kernels do): K/V read heads times.
  "per_group"       one block per K/V head serves all g = heads // kv_heads query heads of
                    the group: reads K/V once, and Q, O (or Opart, Lpart) of all g.

Ragged batches (cache_seqlens, issue 37). A problem may carry one cache length per
sequence, n_b >= 0 (flash-attn's cache_seqlens); N_kv is then their maximum (the seen
lengths', after any append) and the ledger is the sum of the per-sequence ledgers. The
splits stay S for every sequence (the kernel grid stays (S, readers)): sequence b's chunk
is C_b = ceil(n_b / S) rows, split s takes [s C_b, min((s+1) C_b, n_b)). A block whose
chunk is empty (a short sequence, or n_b = 0) reads nothing (no Q, no K/V, no
block-table entry) and writes its partial for its rows: Opart = 0, Lpart = -inf (S > 1),
or O = 0, L = -inf (S = 1); the combine is unchanged (an empty split weighs 0). Any S >= 1
is allowed on a ragged problem. A row that sees no key (n_b = 0, or n_b < N_q: the rows
before the cache start) gets O = 0, L = -inf. N_q is not bounded by n_b.

Append (flash_attn_with_kvcache(k=, v=)): with append=True, N_q new K/V rows per sequence
(K_new, V_new, (batch, kv_heads, N_q, d)) are written into the cache at rows
[n_b, n_b + N_q) (contiguous, or paged through the block table) before the attention,
which then runs over n_b + N_q rows (its seen lengths) with the same bottom-right mask:
new row r sees cache rows c <= n_b + r, its own new key included. The append step ("append"
kernel, one block per sequence) reads K_new and V_new (tensors of their own, problem
dtype), writes K and V (the cache), and, paged, reads one block-table entry per page its
N_q rows touch. flash-attn fuses the append into the attention kernel; flashsim's model
and kernels run it as a separate step first (the same counts either way, up to the
block-table entries, which a fused kernel would read again).

Counts are element totals for the whole problem (see iosim.ledger and README,
"Decoding (model)"); bytes use itemsize 4 for L, Opart, Lpart and block_table. The
per-sequence lengths themselves (one int32 per block, what a kernel gets as an argument)
are not counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .closed_form import floor_sum
from .ledger import TENSOR_ORDER, CountingMemory, TrafficCounts
from .problem import DTYPES, ConfigError, HeadsAndDtype, check_dtype
from .schedules import check_scale

F32 = np.float32
NEG_INF = F32(-np.inf)

#: decode schedules and grouped-head conventions
DECODE = ("fa2_decode", "split_kv")
KV_READS = ("per_query_head", "per_group")
#: new query rows per sequence a DecodeProblem allows
MAX_N_Q = 16
#: tensors held in 4-byte types whatever the problem dtype
DECODE_4BYTE = frozenset({"L", "Opart", "Lpart", "block_table"})
#: ledger order: the forward's tensors, the split partials, the block table, then the
#: appended rows (K_new, V_new: read by the append step, which writes them into K, V)
DECODE_ORDER = TENSOR_ORDER + ("Opart", "Lpart", "block_table", "K_new", "V_new")


def _positive_int(name: str, value, what: str = "a positive integer") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name}={value!r} is not allowed; allowed: {what}")
    return int(value)


@dataclass(frozen=True)
class DecodeProblem(HeadsAndDtype):
    """One decoding step (see the module docstring for the mask and the layouts).

    N_kv: cache length in rows (keys = values); with cache_seqlens, None (or the maximum
        seen length, which it becomes). d: head dimension.
    batch: sequences. heads: query heads; kv_heads: K/V heads (divides heads; default
        heads). N_q: new query rows per sequence, 1..16 (and at most N_kv without
        cache_seqlens); query row r sees cache rows c <= N_kv - N_q + r (bottom-right
        causal alignment).
    dtype: storage dtype of Q, K, V, O ("fp16" or "fp32"); L, Opart, Lpart are float32.
    page_size: None for a contiguous cache, else P rows per page reached through an
        int32 block table (pages scattered).
    cache_seqlens: None (every sequence has N_kv rows), or per-sequence cache lengths
        before any append: an int (the same for every sequence) or batch ints >= 0,
        stored as a tuple (a "ragged" problem; see the module docstring).
    append: write N_q new K/V rows per sequence into the cache before the attention
        (needs cache_seqlens); the attention then sees cache_seqlens[b] + N_q rows.
    """

    N_kv: int | None
    d: int
    batch: int = 1
    heads: int = 1
    kv_heads: int | None = None
    N_q: int = 1
    dtype: str = "fp16"
    page_size: int | None = None
    cache_seqlens: tuple | None = None
    append: bool = False

    @classmethod
    def ragged(cls, cache_seqlens, d: int, **kw) -> "DecodeProblem":
        """A problem with per-sequence cache lengths: batch = len(cache_seqlens)."""
        lens = tuple(cache_seqlens)
        return cls(None, d, batch=kw.pop("batch", len(lens)), cache_seqlens=lens, **kw)

    def __post_init__(self):
        for name in ("d", "batch", "heads"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        kv = self.heads if self.kv_heads is None else _positive_int("kv_heads", self.kv_heads)
        if self.heads % kv:
            raise ConfigError(f"kv_heads={kv} is not allowed for heads={self.heads}; "
                              f"allowed: a divisor of heads")
        object.__setattr__(self, "kv_heads", kv)
        if not isinstance(self.append, (bool, np.bool_)):
            raise ConfigError(f"append={self.append!r} is not allowed; allowed: True, False")
        object.__setattr__(self, "append", bool(self.append))
        n_q = self.N_q
        if self.cache_seqlens is None:
            if self.append:
                raise ConfigError("append=True needs cache_seqlens (the cache lengths before "
                                  "the append); allowed: append=False without cache_seqlens")
            object.__setattr__(self, "N_kv", _positive_int("N_kv", self.N_kv))
            hi = min(MAX_N_Q, self.N_kv)
            if isinstance(n_q, bool) or not isinstance(n_q, (int, np.integer)) or not 1 <= n_q <= hi:
                raise ConfigError(f"N_q={n_q!r} is not allowed for N_kv={self.N_kv}; allowed: "
                                  f"integers 1..{hi} (1..{MAX_N_Q} and at most N_kv)")
        else:
            if isinstance(n_q, bool) or not isinstance(n_q, (int, np.integer)) or not 1 <= n_q <= MAX_N_Q:
                raise ConfigError(f"N_q={n_q!r} is not allowed; allowed: integers 1..{MAX_N_Q}")
            object.__setattr__(self, "cache_seqlens", _check_seqlens(self.cache_seqlens,
                                                                     self.batch))
            top = max(self.seqlens)
            if self.N_kv is not None and (isinstance(self.N_kv, bool) or self.N_kv != top):
                raise ConfigError(f"N_kv={self.N_kv!r} is not allowed with cache_seqlens; "
                                  f"allowed: None or {top} (the longest seen length)")
            object.__setattr__(self, "N_kv", top)
        object.__setattr__(self, "N_q", int(n_q))
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        if self.page_size is not None:
            object.__setattr__(self, "page_size", _positive_int(
                "page_size", self.page_size,
                "None (contiguous cache) or a positive integer (rows per page)"))

    @property
    def itemsize(self) -> int:
        """Bytes per element of Q, K, V, O."""
        return DTYPES[self.dtype].itemsize

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    @property
    def is_ragged(self) -> bool:
        """True when the problem carries per-sequence lengths (cache_seqlens)."""
        return self.cache_seqlens is not None

    @property
    def seqlens(self) -> tuple:
        """Rows the attention sees, per sequence: cache_seqlens[b] (+ N_q when appending),
        or N_kv for every sequence."""
        if self.cache_seqlens is None:
            return (self.N_kv,) * self.batch
        add = self.N_q if self.append else 0
        return tuple(n + add for n in self.cache_seqlens)

    @property
    def pages(self) -> int:
        """Pages per sequence, ceil(N_kv / P) (the longest sequence's when ragged; 0 for a
        contiguous cache)."""
        return -(-self.N_kv // self.page_size) if self.paged else 0

    def itemsize_of(self, tensor: str) -> int:
        """Bytes per element of a named tensor in HBM."""
        return 4 if tensor in DECODE_4BYTE else self.itemsize

    def readers(self, kv_reads: str) -> int:
        """Thread blocks per split: batch x heads (per_query_head) or batch x kv_heads."""
        check_kv_reads(kv_reads)
        return self.batch * (self.heads if kv_reads == "per_query_head" else self.kv_heads)

    def splits(self, num_splits) -> int:
        """num_splits checked for this problem: every split non-empty (`check_num_splits`)
        for one N_kv; any positive integer on a ragged problem (empty chunks read nothing)."""
        if self.is_ragged:
            return _positive_int("num_splits", num_splits)
        return check_num_splits(self.N_kv, num_splits)


def _check_seqlens(lens, batch: int) -> tuple:
    """cache_seqlens as a tuple of batch ints >= 0 (an int: the same for every sequence)."""
    if isinstance(lens, (int, np.integer)) and not isinstance(lens, bool):
        vals = (int(lens),) * batch
    else:
        vals = tuple(lens) if isinstance(lens, (tuple, list, np.ndarray)) and \
            np.ndim(lens) == 1 else None
    if vals is None or len(vals) != batch or any(
            isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in vals):
        raise ConfigError(f"cache_seqlens={lens!r} is not allowed for batch={batch}; allowed: "
                          f"an int >= 0 or {batch} ints >= 0 (one cache length a sequence)")
    return tuple(int(n) for n in vals)


def check_kv_reads(kv_reads) -> str:
    if not isinstance(kv_reads, str) or kv_reads not in KV_READS:
        raise ConfigError(f"kv_reads={kv_reads!r} is not known; allowed: {', '.join(KV_READS)}")
    return kv_reads


def check_schedule(schedule) -> str:
    if not isinstance(schedule, str) or schedule not in DECODE:
        raise ConfigError(f"schedule={schedule!r} is not known; allowed: {', '.join(DECODE)}")
    return schedule


def split_rows(N_kv: int, num_splits: int) -> int:
    """C = ceil(N_kv / S): rows per split (the last split holds the rest)."""
    return -(-N_kv // num_splits)


def check_num_splits(N_kv: int, num_splits) -> int:
    """num_splits as an int; ConfigError unless every split gets at least one row, i.e.
    1 <= S and (S - 1) ceil(N_kv / S) < N_kv (S = 1..N_kv with a few gaps, e.g. N_kv = 10
    refuses S = 6..9)."""
    S = _positive_int("num_splits", num_splits, "a positive integer")
    C = split_rows(N_kv, S)
    if (S - 1) * C >= N_kv:
        raise ConfigError(
            f"num_splits={S} is not allowed for N_kv={N_kv}: chunks of ceil(N_kv/num_splits)"
            f"={C} rows leave split {S - 1} empty; allowed: num_splits with "
            f"(num_splits - 1) * ceil(N_kv / num_splits) < N_kv")
    return S


def split_bounds(N_kv: int, num_splits: int) -> list[tuple[int, int]]:
    """[(start, stop)] of the S chunks: [s C, min((s+1) C, N_kv)), C = ceil(N_kv / S)."""
    S = check_num_splits(N_kv, num_splits)
    C = split_rows(N_kv, S)
    return [(s * C, min((s + 1) * C, N_kv)) for s in range(S)]


def sequence_chunks(n: int, num_splits: int) -> list[tuple[int, int]]:
    """[(a, e)] of the S chunks of a sequence of n >= 0 rows in a ragged batch:
    a = min(s C, n), e = min((s+1) C, n), C = ceil(n / S); empty chunks (a == e) kept, so
    the list always has S entries (for one N_kv with every split non-empty it equals
    `split_bounds`)."""
    S = _positive_int("num_splits", num_splits)
    C = split_rows(n, S)
    return [(min(s * C, n), min((s + 1) * C, n)) for s in range(S)]


def nonempty_chunks(n: int, num_splits: int) -> int:
    """Non-empty chunks of a sequence of n rows: ceil(n / C), C = ceil(n / S) (0 for n = 0)."""
    return -(-n // split_rows(n, num_splits)) if n else 0


def _pages(n: int, S: int, P: int) -> int:
    """pages_touched over the non-empty chunks of a sequence of n >= 0 rows (0 for n = 0):
    the floor-sum formula of `pages_touched` with E = nonempty_chunks(n, S) chunks."""
    if n == 0:
        return 0
    C = split_rows(n, S)
    E = -(-n // C)
    return int(E + (n - 1) // P + int(floor_sum(E - 1, P, C, C - 1)) - int(floor_sum(E, P, C, 0)))


def append_pages(n: int, N_q: int, page_size: int) -> int:
    """Pages the rows [n, n + N_q) of an append touch: floor((n + N_q - 1) / P) - floor(n / P) + 1."""
    return (n + N_q - 1) // page_size - n // page_size + 1


# ---------------------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeLedger(TrafficCounts):
    """HBM traffic of one decode schedule on one DecodeProblem; element counts are
    problem totals, bytes = elements x itemsize (problem dtype for Q, K, V, O; 4 for
    L, Opart, Lpart, block_table). Same conventions as iosim.Ledger."""

    algorithm: str
    problem: DecodeProblem
    num_splits: int = 1
    kv_reads: str = "per_query_head"
    reads: dict = field(default_factory=dict)    # tensor -> elements read (total)
    writes: dict = field(default_factory=dict)   # tensor -> elements written (total)

    ORDER = DECODE_ORDER
    NAME_WIDTH = 12

    def to_dict(self) -> dict:
        p = self.problem
        return {
            "algorithm": self.algorithm, "num_splits": self.num_splits,
            "kv_reads": self.kv_reads,
            "batch": p.batch, "heads": p.heads, "kv_heads": p.kv_heads,
            "seq_len_q": p.N_q, "seq_len_kv": p.N_kv, "head_dim": p.d, "dtype": p.dtype,
            "paged": p.page_size,
            **({"cache_seqlens": list(p.cache_seqlens), "append": p.append}
               if p.is_ragged else {}),
            "hbm_read_bytes": self.hbm_read_bytes,
            "hbm_write_bytes": self.hbm_write_bytes,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bytes_per_head": self.hbm_bytes_per_head,
            "per_tensor": self.per_tensor(),
        }


# ---------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------
def _safe(m):
    return np.where(np.isneginf(m), F32(0), m).astype(F32)


def combine_partials(Opart, Lpart):
    """The split-KV combine in the partials' own float dtype: Opart (S, ..., N_q, d),
    Lpart (S, ..., N_q) -> (O, L) with M = max_s Lpart_s, w_s = exp(Lpart_s - M),
    O = sum_s w_s Opart_s / sum_s w_s, L = M + log sum_s w_s. A split with
    Lpart = -inf weighs 0; a row with every Lpart = -inf gets O = 0, L = -inf; NaN
    propagates. Exact up to the dtype's rounding (float64 partials give float64 O)."""
    Opart, Lpart = np.asarray(Opart), np.asarray(Lpart)
    ft = np.result_type(Opart.dtype, Lpart.dtype, np.float32)
    Opart, Lpart = Opart.astype(ft), Lpart.astype(ft)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        M = Lpart.max(axis=0)
        none = np.isneginf(M)
        Ms = np.where(none, ft.type(0), M)
        w = np.exp(Lpart - Ms)
        sw = w.sum(axis=0)
        O = (w[..., None] * Opart).sum(axis=0) / np.where(none, ft.type(1), sw)[..., None]
        O = np.where(none[..., None], ft.type(0), O)
        L = np.where(none, ft.type(-np.inf), Ms + np.log(np.where(none, ft.type(1), sw)))
    return O.astype(ft), L.astype(ft)


def decode_mask(N_q: int, N_kv: int, c0: int = 0, c1: int | None = None) -> np.ndarray:
    """Boolean (N_q, c1 - c0): query row r sees cache row c iff c <= N_kv - N_q + r."""
    c1 = N_kv if c1 is None else c1
    return np.arange(c0, c1)[None, :] <= (N_kv - N_q + np.arange(N_q))[:, None]


def reference_decode(q, k, v, *, scale: float | None = None, return_lse: bool = False,
                     seqlens=None):
    """Dense float64 decoding attention: q (..., heads, N_q, d), k, v (..., kv_heads,
    N_kv, d), bottom-right causal mask; (O[, L]). seqlens (ragged batches): one length
    n_b per sequence (q, k, v then (batch, ...)); sequence b attends to k[b, :, :n_b]
    (rows past n_b are never looked at); a row that sees no key gets O = 0, L = -inf."""
    if seqlens is not None:
        q = np.asarray(q, dtype=np.float64)
        outs = [_reference_one(q[b], k[b], v[b], scale, int(n)) for b, n in enumerate(seqlens)]
        O, L = np.stack([o for o, _ in outs]), np.stack([l for _, l in outs])
        return (O, L) if return_lse else O
    o, lse = _reference_one(q, k, v, scale, None)
    return (o, lse) if return_lse else o


def _reference_one(q, k, v, scale, n):
    from .reference import reference_probs
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if n is not None:
        k, v = k[..., :n, :], v[..., :n, :]
    H, G = q.shape[-3], k.shape[-3]
    if H != G:
        k, v = np.repeat(k, H // G, axis=-3), np.repeat(v, H // G, axis=-3)
    N_q, N_kv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if N_kv == 0:                       # no key at all: O = 0, L = -inf
        return np.zeros(q.shape), np.full(q.shape[:-1], -np.inf)
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    allowed = decode_mask(N_q, N_kv)
    p, lse, _ = reference_probs(q, k, allowed, scale)
    with np.errstate(invalid="ignore", over="ignore"):
        o = np.where(allowed, p, 0.0) @ v
    return o, lse


def random_decode_inputs(problem: DecodeProblem, seed: int = 0, scale: float = 1.0):
    """Standard-normal q (batch, heads, N_q, d) and k, v (batch, kv_heads, N_kv, d),
    logical (unpaged) layout, in the problem dtype. Ragged problems: rows of sequence b
    from cache_seqlens[b] on are NaN (past its cache, or where the append will write):
    never read, or overwritten first."""
    rng = np.random.default_rng(seed)
    p, dt = problem, problem.np_dtype
    q = (scale * rng.standard_normal((p.batch, p.heads, p.N_q, p.d))).astype(dt)
    k = (scale * rng.standard_normal((p.batch, p.kv_heads, p.N_kv, p.d))).astype(dt)
    v = rng.standard_normal((p.batch, p.kv_heads, p.N_kv, p.d)).astype(dt)
    if p.is_ragged:
        for b, n in enumerate(p.cache_seqlens):
            k[b, :, n:] = np.nan
            v[b, :, n:] = np.nan
    return q, k, v


def random_new_kv(problem: DecodeProblem, seed: int = 0, scale: float = 1.0):
    """Standard-normal K_new, V_new (batch, kv_heads, N_q, d) in the problem dtype: the
    rows an appending problem writes into the cache."""
    rng = np.random.default_rng([seed, 37])
    p, dt = problem, problem.np_dtype
    shape = (p.batch, p.kv_heads, p.N_q, p.d)
    return ((scale * rng.standard_normal(shape)).astype(dt),
            rng.standard_normal(shape).astype(dt))


def append_kv(problem: DecodeProblem, k, v, k_new, v_new):
    """The logical caches after the append (copies): rows [cache_seqlens[b],
    cache_seqlens[b] + N_q) of sequence b replaced by K_new[b], V_new[b]."""
    p = problem
    k, v = np.array(k, dtype=p.np_dtype), np.array(v, dtype=p.np_dtype)
    for b, n in enumerate(p.cache_seqlens):
        k[b, :, n:n + p.N_q] = k_new[b]
        v[b, :, n:n + p.N_q] = v_new[b]
    return k, v


def paged_cache(problem: DecodeProblem, k, v, seed: int = 0):
    """(k_pages, v_pages, block_table): the logical cache scattered into a pool of
    physical pages (num_pages, P, kv_heads, d) in a random permutation; block_table
    (batch, pages) int32 maps logical page p of sequence b to its physical page. Rows
    past N_kv in a ragged last page are NaN (never read). Ragged problems: sequence b
    has ceil(n_b / P) pages (n_b its seen length, after any append), the pool
    max(1, sum_b of them) pages, the table max(1, ceil(N_kv / P)) columns, and the
    entries past a sequence's own pages are -1 (never read)."""
    p = problem
    P = p.page_size
    if not p.is_ragged:
        n = p.pages
        perm = np.random.default_rng(seed).permutation(p.batch * n).astype(np.int32)
        table = perm.reshape(p.batch, n)
        lens = p.seqlens
        total = p.batch * n
    else:
        lens = p.seqlens
        counts = [-(-x // P) for x in lens]
        total = sum(counts)
        perm = np.random.default_rng(seed).permutation(total).astype(np.int32)
        table = np.full((p.batch, max(1, p.pages)), -1, dtype=np.int32)
        at = 0
        for b, c in enumerate(counts):
            table[b, :c] = perm[at:at + c]
            at += c
    pools = []
    for x in (k, v):
        pool = np.full((max(1, total) if p.is_ragged else total, P, p.kv_heads, p.d), np.nan,
                       dtype=p.np_dtype)
        for b in range(p.batch):
            for j in range(-(-lens[b] // P)):
                r0, r1 = j * P, min((j + 1) * P, lens[b])
                pool[table[b, j], :r1 - r0] = np.swapaxes(x[b, :, r0:r1], 0, 1)
        pools.append(pool)
    return pools[0], pools[1], table


# ---------------------------------------------------------------------------------------
# One thread block: a reader's chunk of the cache
# ---------------------------------------------------------------------------------------
def _kv_pieces(mem: CountingMemory, problem: DecodeProblem, b: int, g: int, a: int, e: int,
               block_kv: int, mark=(None, None, 0)):
    """Yield (c0, K, V) over rows [a, e) of sequence b, K/V head g, as the block reads
    them: contiguous in blocks of block_kv rows; paged page by page (one block-table
    entry per page touched), each page's rows in pieces of at most block_kv.
    mark = (kernel, cta, first query head): each piece's mark in the access trace."""
    kernel, cta, h0 = mark
    if not problem.paged:
        for c0 in range(a, e, block_kv):
            c1 = min(c0 + block_kv, e)
            mem.mark(kernel, cta, (h0, c0))
            yield c0, mem.read("K", b, g, slice(c0, c1)), mem.read("V", b, g, slice(c0, c1))
        return
    P = problem.page_size
    for j in range(a // P, (e - 1) // P + 1):
        mem.mark(kernel, cta, (h0, max(a, j * P)))
        phys = int(mem.read("block_table", b, slice(j, j + 1))[0])
        lo, hi = max(a, j * P), min(e, (j + 1) * P)
        for c0 in range(lo, hi, block_kv):
            c1 = min(c0 + block_kv, hi)
            if c0 > lo:
                mem.mark(kernel, cta, (h0, c0))
            rows = slice(c0 - j * P, c1 - j * P)
            yield c0, mem.read("K", phys, rows, g), mem.read("V", phys, rows, g)


def _block(mem, problem: DecodeProblem, b: int, hs, g: int, a: int, e: int, scale: float,
           block_kv: int, kernel: str = "decode", cta=None, n: int | None = None):
    """One thread block: query heads hs (sharing K/V head g) over cache rows [a, e).
    Returns (O, L) float32, shaped (len(hs), N_q, d) and (len(hs), N_q); a row that sees
    no key of the chunk gets O = 0, L = -inf (NaN if it sees one and meets a NaN).
    kernel, cta: the block's names in the access trace (`CountingMemory.mark`; its tiles
    are (first query head, first cache row of the piece), -1 for the whole chunk).
    n: the sequence's seen length (ragged batches; default N_kv)."""
    mem.mark(kernel, cta, (hs[0], -1))
    N_q, N_kv, d = problem.N_q, problem.N_kv if n is None else n, problem.d
    Q = np.concatenate([mem.read("Q", b, h) for h in hs], axis=0).astype(F32)  # (n, d)
    r = np.tile(np.arange(N_q), len(hs))                    # each row's index among N_q
    last = N_kv - N_q + r                                   # last cache row it sees
    n = Q.shape[0]
    acc = np.zeros((n, d), dtype=F32)
    m = np.full(n, NEG_INF, dtype=F32)
    l = np.zeros(n, dtype=F32)
    for c0, K, V in _kv_pieces(mem, problem, b, g, a, e, block_kv, (kernel, cta, hs[0])):
        c = np.arange(c0, c0 + K.shape[0])
        S = (F32(scale) * (Q @ K.astype(F32).T)).astype(F32)
        S = np.where(c[None, :] <= last[:, None], S, NEG_INF)
        with np.errstate(invalid="ignore", over="ignore"):
            m_new = np.maximum(m, S.max(axis=1))
            Pt = np.exp(S - _safe(m_new)[:, None])
            alpha = np.where(np.isneginf(m), F32(0), np.exp(m - _safe(m_new)))
            l = (alpha * l + Pt.sum(axis=1, dtype=F32)).astype(F32)
            acc = (alpha[:, None] * acc + Pt @ V.astype(F32)).astype(F32)
        m = m_new.astype(F32)
    pos = l > 0
    sees = a <= last
    nan_or_0 = np.where(sees, F32(np.nan), F32(0))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        O = np.where(pos[:, None], acc / np.where(pos, l, F32(1))[:, None], nan_or_0[:, None])
        L = np.where(pos, m + np.log(np.where(pos, l, F32(1))),
                     np.where(sees, F32(np.nan), NEG_INF))
    return O.astype(F32).reshape(len(hs), N_q, d), L.astype(F32).reshape(len(hs), N_q)


# ---------------------------------------------------------------------------------------
# Whole problems
# ---------------------------------------------------------------------------------------
class DecodeExecution:
    """Result of `execute_decode`: O (batch, heads, N_q, d) in the problem dtype, the
    ledger, and stats (L (batch, heads, N_q) float32; block_table when paged)."""

    def __init__(self, O, ledger: DecodeLedger, stats: dict, trace: list | None = None):
        self.O, self.ledger, self.stats, self.trace = O, ledger, stats, trace

    def __iter__(self):  # allow `O, ledger = execute_decode(...)`
        return iter((self.O, self.ledger))


def _check_inputs(problem: DecodeProblem, q, k, v, k_new=None, v_new=None):
    p = problem
    want = [("q", q, (p.batch, p.heads, p.N_q, p.d)),
            ("k", k, (p.batch, p.kv_heads, p.N_kv, p.d)),
            ("v", v, (p.batch, p.kv_heads, p.N_kv, p.d))]
    if p.append:
        want += [("k_new", k_new, (p.batch, p.kv_heads, p.N_q, p.d)),
                 ("v_new", v_new, (p.batch, p.kv_heads, p.N_q, p.d))]
    elif k_new is not None or v_new is not None:
        raise ConfigError("k_new / v_new given for a problem with append=False; allowed: "
                          "None (or append=True on the problem)")
    for name, x, shape in want:
        if np.shape(x) != shape:
            raise ConfigError(f"{name} has shape {np.shape(x)}; the problem needs {shape}")


def _append(mem: CountingMemory, problem: DecodeProblem):
    """The append step: one block per sequence b writes K_new[b], V_new[b] (every K/V
    head, N_q rows) into cache rows [n_b, n_b + N_q); paged, it first reads the
    block-table entry of each page those rows touch (once per sequence: a page holds
    every K/V head)."""
    p = problem
    for b, n in enumerate(p.cache_seqlens):
        mem.mark("append", (b,), None)
        if not p.paged:
            for g in range(p.kv_heads):
                for t in ("K", "V"):
                    mem.write(t, mem.read(t + "_new", b, g), b, g, slice(n, n + p.N_q))
            continue
        P = p.page_size
        j0 = n // P
        phys = mem.read("block_table", b, slice(j0, (n + p.N_q - 1) // P + 1))
        for g in range(p.kv_heads):
            new = {t: mem.read(t + "_new", b, g) for t in ("K", "V")}
            for r in range(p.N_q):      # row n + r: page (n + r) // P, slot (n + r) % P
                j = (n + r) // P
                for t in ("K", "V"):
                    mem.write(t, new[t][r], int(phys[j - j0]), (n + r) % P, g)


def execute_decode(schedule: str, problem: DecodeProblem, q=None, k=None, v=None, *,
                   num_splits: int = 1, kv_reads: str = "per_query_head", block_kv: int = 128,
                   scale: float | None = None, seed: int = 0,
                   page_seed: int = 0, record: bool = False, k_new=None,
                   v_new=None) -> DecodeExecution:
    """Run a decode schedule on (q, k, v) (random if omitted; k, v in the logical layout,
    scattered into pages by `paged_cache(page_seed)` when the problem is paged) and count
    every access. schedule: "fa2_decode" (num_splits must be 1) or "split_kv".
    block_kv: K/V rows a block loads at a time (numerics only; no count depends on it).
    Ledger counts are problem totals in elements. record: also return the access trace
    (`DecodeExecution.trace`, `CountingMemory.trace`), ("instance", b, None, None) before
    each sequence's blocks and ("instance", b, h, g) before each combine block.
    Ragged problems: k, v (batch, kv_heads, N_kv, d) hold sequence b's cache in rows
    [0, n_b); empty chunks read nothing. Appending problems: k_new, v_new (batch,
    kv_heads, N_q, d) (`random_new_kv(seed)` if omitted) are written into the cache by
    the append step first (stats["K"], stats["V"]: the caches after it, physical layout)."""
    check_schedule(schedule)
    check_kv_reads(kv_reads)
    S = problem.splits(num_splits)
    if schedule == "fa2_decode" and S != 1:
        raise ConfigError(f"num_splits={S} is not allowed for schedule='fa2_decode'; "
                          f"allowed: 1 (use schedule='split_kv')")
    block_kv = _positive_int("block_kv", block_kv)
    p, dt = problem, problem.np_dtype
    if q is None:
        q, k, v = random_decode_inputs(p, seed)
    if p.append and k_new is None and v_new is None:
        k_new, v_new = random_new_kv(p, seed)
    _check_inputs(p, q, k, v, k_new, v_new)
    q, k, v = (np.asarray(x, dtype=dt) for x in (q, k, v))
    scale = check_scale(1.0 / np.sqrt(p.d) if scale is None else scale)
    mem = CountingMemory(Q=q)
    if record:
        mem.record()
    stats: dict = {}
    if p.paged:
        kp, vp, table = paged_cache(p, k, v, page_seed)
        mem.alloc("K", kp); mem.alloc("V", vp); mem.alloc("block_table", table)
        stats["block_table"] = table
    else:
        mem.alloc("K", k.copy() if p.append else k); mem.alloc("V", v.copy() if p.append else v)
    if p.append:
        mem.alloc("K_new", np.asarray(k_new, dtype=dt))
        mem.alloc("V_new", np.asarray(v_new, dtype=dt))
        _append(mem, p)
    mem.alloc("O", np.full(q.shape, np.nan, dtype=dt))
    mem.alloc("L", np.full(q.shape[:3], np.nan, dtype=F32))
    split = schedule == "split_kv"
    if split:
        mem.alloc("Opart", np.full((p.batch, p.heads, S, p.N_q, p.d), np.nan, dtype=F32))
        mem.alloc("Lpart", np.full((p.batch, p.heads, S, p.N_q), np.nan, dtype=F32))
    G = p.group
    groups = ([[h] for h in range(p.heads)] if kv_reads == "per_query_head"
              else [list(range(g * G, (g + 1) * G)) for g in range(p.kv_heads)])
    chunks = None if p.is_ragged else split_bounds(p.N_kv, S)
    for b in range(p.batch):                       # the grid: batch x readers x splits
        if record:
            mem.trace.append(("instance", b, None, None))
        n = p.seqlens[b]
        bounds = chunks if chunks is not None else sequence_chunks(n, S)
        for hs in groups:
            g = hs[0] // G
            for s, (a, e) in enumerate(bounds):
                if a < e:
                    O, L = _block(mem, p, b, hs, g, a, e, scale, block_kv, schedule,
                                  (b, hs[0], s), n)
                else:                              # an empty chunk: no read at all
                    mem.mark(schedule, (b, hs[0], s), (hs[0], -1))
                    O = np.zeros((len(hs), p.N_q, p.d), dtype=F32)
                    L = np.full((len(hs), p.N_q), NEG_INF, dtype=F32)
                mem.mark(schedule, (b, hs[0], s), (hs[0], -1))
                for i, h in enumerate(hs):
                    if split:
                        mem.write("Opart", O[i], b, h, s)
                        mem.write("Lpart", L[i], b, h, s)
                    else:
                        mem.write("O", O[i].astype(dt), b, h)
                        mem.write("L", L[i], b, h)
    if split:                                      # combine: one block per (batch, head)
        for b in range(p.batch):
            for h in range(p.heads):
                if record:
                    mem.trace.append(("instance", b, h, h // G))
                mem.mark("combine", (b, h), (h, -1))
                O, L = combine_partials(mem.read("Opart", b, h), mem.read("Lpart", b, h))
                mem.write("O", O.astype(dt), b, h)
                mem.write("L", L.astype(F32), b, h)
    stats["L"] = mem.arrays["L"].copy()
    if p.append:
        stats["K"], stats["V"] = mem.arrays["K"].copy(), mem.arrays["V"].copy()
    ledger = DecodeLedger(schedule, p, S, kv_reads, dict(mem.reads), dict(mem.writes))
    return DecodeExecution(mem.arrays["O"].copy(), ledger, stats, mem.trace)


# ---------------------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------------------
def pages_touched(N_kv: int, num_splits: int, page_size: int) -> int:
    """sum over the S chunks [a_s, e_s) of the pages each touches,
    floor((e_s - 1) / P) - floor(a_s / P) + 1, as floor sums (C = ceil(N_kv / S)):
        S + floor((N_kv - 1) / P) + F(S - 1, P, C, C - 1) - F(S, P, C, 0),
    F(n, m, a, b) = sum_{t<n} floor((a t + b) / m) (`floor_sum`). S = 1: ceil(N_kv / P)."""
    S = check_num_splits(N_kv, num_splits)
    C, P = split_rows(N_kv, S), int(page_size)
    return int(S + (N_kv - 1) // P + int(floor_sum(S - 1, P, C, C - 1))
               - int(floor_sum(S, P, C, 0)))


def decode_closed_form(schedule: str, problem: DecodeProblem, *, num_splits: int = 1,
                       kv_reads: str = "per_query_head") -> DecodeLedger:
    """The ledger of `execute_decode(schedule, problem, num_splits=, kv_reads=)` by
    formula. With BH = batch x heads, R = readers (batch x heads or batch x kv_heads),
    S = num_splits, T = pages_touched(N_kv, S, P) (= ceil(N_kv / P) for S = 1):
      fa2_decode  Q: BH N_q d read    K, V: R N_kv d read each    O: BH N_q d written
                  L: BH N_q written   block_table: R T read (paged)
      split_kv    Q: S BH N_q d read  K, V: R N_kv d read each
                  Opart: S BH N_q d written and read   Lpart: S BH N_q written and read
                  O: BH N_q d written  L: BH N_q written  block_table: R T read (paged)
    Ragged problems (`_ragged_closed_form`): the sum over sequences of the same terms at
    batch 1 and N_kv = n_b, except that only the E_b = nonempty_chunks(n_b, S) non-empty
    blocks of a reader read Q and the block table; appending adds the append step.
    """
    check_schedule(schedule)
    p = problem
    S = p.splits(num_splits)
    if schedule == "fa2_decode" and S != 1:
        raise ConfigError(f"num_splits={S} is not allowed for schedule='fa2_decode'; "
                          f"allowed: 1 (use schedule='split_kv')")
    if p.is_ragged:
        return _ragged_closed_form(schedule, p, S, kv_reads)
    R = p.readers(kv_reads)
    BH, N_q, d = p.instances, p.N_q, p.d
    reads = {"Q": S * BH * N_q * d, "K": R * p.N_kv * d, "V": R * p.N_kv * d}
    writes = {"O": BH * N_q * d, "L": BH * N_q}
    if schedule == "split_kv":
        reads.update(Opart=S * BH * N_q * d, Lpart=S * BH * N_q)
        writes.update(Opart=S * BH * N_q * d, Lpart=S * BH * N_q)
    if p.paged:
        reads["block_table"] = R * pages_touched(p.N_kv, S, p.page_size)
    return DecodeLedger(schedule, p, S, kv_reads, reads, writes)


def _ragged_closed_form(schedule: str, p: DecodeProblem, S: int, kv_reads: str) -> DecodeLedger:
    """The ledger of a ragged (and / or appending) problem, sequence by sequence. With
    H heads, r = heads or kv_heads readers a sequence, n_b its seen length,
    E_b = nonempty_chunks(n_b, S), T_b = the pages its non-empty chunks touch:
      Q: sum_b E_b H N_q d read          K, V: r sum_b n_b d read each
      O, L: batch H N_q (d) written      Opart, Lpart (S > 1): S batch H N_q (d) written
                                         and read (empty blocks write theirs too)
      block_table: r sum_b T_b read (paged)
      append: K_new, V_new read and K, V written batch kv_heads N_q d each; paged, plus
              sum_b append_pages(cache_seqlens[b], N_q, P) block-table entries read."""
    r = p.heads if kv_reads == "per_query_head" else p.kv_heads
    check_kv_reads(kv_reads)
    H, N_q, d, B = p.heads, p.N_q, p.d, p.batch
    lens = p.seqlens
    E = sum(nonempty_chunks(n, S) for n in lens)
    reads = {"Q": E * H * N_q * d, "K": r * sum(lens) * d, "V": r * sum(lens) * d}
    writes = {"O": B * H * N_q * d, "L": B * H * N_q}
    if schedule == "split_kv":
        reads.update(Opart=S * B * H * N_q * d, Lpart=S * B * H * N_q)
        writes.update(Opart=S * B * H * N_q * d, Lpart=S * B * H * N_q)
    if p.paged:
        reads["block_table"] = r * sum(_pages(n, S, p.page_size) for n in lens)
    if p.append:
        new = B * p.kv_heads * N_q * d
        reads.update(K_new=new, V_new=new)
        writes.update(K=new, V=new)
        if p.paged:
            reads["block_table"] += sum(append_pages(n, N_q, p.page_size)
                                        for n in p.cache_seqlens)
    return DecodeLedger(schedule, p, S, kv_reads,
                        {t: c for t, c in reads.items() if c}, writes)


# ---------------------------------------------------------------------------------------
# Choosing num_splits
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitChoice:
    """choose_num_splits' answer and its reasoning numbers.

    num_splits: the choice. blocks_per_split: readers (batch x heads or x kv_heads).
    target_blocks: sm_count x ctas_per_sm. s_fill: smallest S with
    blocks_per_split x S >= target_blocks. s_cap_blocks: largest S keeping one K/V unit
    (block_kv rows, or a page) per split, floor(N_kv / unit), at least 1. s_cap_traffic:
    largest S whose partial traffic stays within max_partial_fraction of the K/V bytes.
    partial_bytes, kv_bytes: problem totals at num_splits (Opart + Lpart written and read
    back; K + V read). binding: which of "fill", "blocks", "traffic", "nonempty" set it.
    """

    num_splits: int
    blocks_per_split: int
    target_blocks: int
    s_fill: int
    s_cap_blocks: int
    s_cap_traffic: int
    partial_bytes: int
    kv_bytes: int
    binding: str

    @property
    def partial_fraction(self) -> float | None:
        """partial_bytes / kv_bytes (None when there is no K/V byte: an all-empty batch)."""
        return self.partial_bytes / self.kv_bytes if self.kv_bytes else None

    def to_dict(self) -> dict:
        return {**self.__dict__, "partial_fraction": self.partial_fraction}


def choose_num_splits(problem: DecodeProblem, sm_count: int, ctas_per_sm: int = 1, *,
                      kv_reads: str = "per_query_head", block_kv: int = 128,
                      max_partial_fraction: float = 0.05, fill: str = "ceil",
                      min_split_rows: int = 0) -> SplitChoice:
    """The split-KV rule: fill the SMs, but not at the cost of more partial-output
    traffic than max_partial_fraction of the K/V bytes, and not below one K/V unit per
    split.

      blocks = batch x (heads | kv_heads)         (kv_reads)
      s_fill = ceil(sm_count x ctas_per_sm / blocks)   (fill "ceil": every block slot
               busy, a partial second wave allowed), or max(1, floor(...)) (fill "floor":
               at most one wave of blocks; what the tensor-core decode kernel measured
               faster, 2026-12-07)
      s_cap_blocks = max(1, floor(N_kv / U)),  U = max(page_size if paged else block_kv,
                                                     min_split_rows)
      s_cap_traffic = max(1, largest S with  S x BH x 2 x (N_q d + N_q) x 4
                                           <= max_partial_fraction x (K + V read bytes))
      num_splits = min(s_fill, s_cap_blocks, s_cap_traffic), then lowered while a split
                   would be empty ((S - 1) ceil(N_kv / S) >= N_kv).
    The partial traffic is Opart and Lpart (float32) written by the splits and read back
    by the combine, per (batch, query head); the K + V bytes are what the schedule reads
    (R N_kv d x 2 x itemsize, R = blocks). Batch 64 x 32 heads on 132 SMs gives 1;
    batch 1 x 32 heads with N_kv = 32K gives 5.
    min_split_rows (default 0) raises the unit U of the block cap: no split of N_kv rows
    shorter than it (gpu.decode's rule for ragged batches, iosim.launch.decode).
    Ragged problems: the same rule with N_kv the longest seen length (the block cap: a
    split of the longest sequence keeps one unit) and the K + V bytes of every sequence's
    own length (the traffic cap: sum_b n_b); no "nonempty" step (a short sequence's
    empty chunks read nothing). With no K/V row at all it gives 1.
    """
    p = problem
    sm_count = _positive_int("sm_count", sm_count)
    ctas_per_sm = _positive_int("ctas_per_sm", ctas_per_sm)
    U = p.page_size if p.paged else _positive_int("block_kv", block_kv)
    if not isinstance(min_split_rows, (int, np.integer)) or isinstance(min_split_rows, bool) \
            or min_split_rows < 0:
        raise ConfigError(f"min_split_rows={min_split_rows!r} is not allowed; allowed: an "
                          f"integer >= 0")
    U = max(U, int(min_split_rows))
    frac = float(max_partial_fraction)
    if not (np.isfinite(frac) and frac > 0):
        raise ConfigError(f"max_partial_fraction={max_partial_fraction!r} is not allowed; "
                          f"allowed: a finite number > 0")
    R = p.readers(kv_reads)
    if fill not in ("ceil", "floor"):
        raise ConfigError(f"fill={fill!r} is not allowed; allowed: 'ceil', 'floor'")
    target = sm_count * ctas_per_sm
    s_fill = -(-target // R) if fill == "ceil" else max(1, target // R)
    s_cap_blocks = max(1, p.N_kv // U)
    kv_bytes = 2 * (R // p.batch) * sum(p.seqlens) * p.d * p.itemsize
    per_split = p.instances * 2 * (p.N_q * p.d + p.N_q) * 4
    s_cap_traffic = max(1, int(Fraction(repr(frac)) * kv_bytes // per_split))
    S = min(s_fill, s_cap_blocks, s_cap_traffic)
    binding = ("fill" if S == s_fill else "blocks" if S == s_cap_blocks else "traffic")
    while S > 1 and not p.is_ragged and (S - 1) * split_rows(p.N_kv, S) >= p.N_kv:
        S, binding = S - 1, "nonempty"
    return SplitChoice(S, R, target, s_fill, s_cap_blocks, s_cap_traffic,
                       S * per_split, kv_bytes, binding)


__all__ = [
    "DECODE", "KV_READS", "MAX_N_Q", "DecodeExecution", "DecodeLedger", "DecodeProblem",
    "SplitChoice", "append_kv", "append_pages", "check_num_splits", "choose_num_splits",
    "combine_partials", "decode_closed_form", "decode_mask", "execute_decode",
    "nonempty_chunks", "pages_touched", "paged_cache", "random_decode_inputs",
    "random_new_kv", "reference_decode", "sequence_chunks", "split_bounds",
]
