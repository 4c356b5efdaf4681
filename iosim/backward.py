"""Backward schedules: executed tile by tile through a counting HBM, and their closed forms.

Notation and the active-tile rule are the forward's (iosim.schedules): N = N_q query
rows, N_k key rows; query block i is rows [i B_r, min((i+1) B_r, N_q)), key block j rows
[j B_c, min((j+1) B_c, N_k)); a tile (i, j) that is inactive (no visible pair under the
causal / window band; block mask False) is skipped and costs nothing. Partly masked
tiles are loaded whole and masked on chip. Every key block is still visited by fa1 and
fa2 (they read K_j, V_j and write dK_j, dV_j, zero where no query sees it); the counts
below write N_k for K, V, dK, dV rows.
Inputs per (batch, query head) instance: Q, O, dO (N_q x d), K, V (N_k x d) and what
the matching forward left in HBM (standard: P; fa1: l, m; fa2: L). Gradients:
    dV = P^T dO,  dP = dO V^T,  D = rowsum(dO o O) = rowsum(P o dP),
    dS = P o (dP - D),  dQ = scale dS K,  dK = scale dS^T Q.
Numerics: float32 on chip, tensors stored in the problem dtype; l, m, L, D and the fa2
dQ accumulator are float32.

What each schedule reads and writes, per instance (counts are elements):
  standard  (Algorithm 3; five kernels; P from the forward, dP and dS are N x N HBM
            buffers in the problem dtype; only active tiles are touched)
    1. dV kernel, per key block j:    for each active i read P_ij, dO_i; write dV_j.
    2. dP kernel, per active tile:    read dO_i, V_j; write dP_ij = dO_i V_j^T.
    3. dS kernel, per query row:      read P and dP over the row's active entries once;
                                      D = rowsum(P o dP) on chip; write dS = P o (dP - D).
    4. dQ kernel, per query block i:  for each active j read dS_ij, K_j; write dQ_i.
    5. dK kernel, per key block j:    for each active i read dS_ij, Q_i; write dK_j.
  fa1       (Algorithm 4 as written; line numbers of arXiv 2205.14135 v2, B.4)
    line 6:  write dQ = 0, dK = 0, dV = 0 (N x d each).
    line 8:  for every key block j read K_j, V_j.
    line 11: for each active (i, j) read Q_i, O_i, dO_i, dQ_i, l_i, m_i;
    line 22: write dQ_i.   line 25: after the inner loop write dK_j, dV_j.
  fa2       (FlashAttention-2 backward)
    preprocess, per query block i: read dO_i, O_i; write D_i = rowsum(dO_i o O_i) (float32);
        write dQacc = 0 (N x d, float32: the memset of the accumulator).
    main, per key block j: read K_j, V_j; for each active i read Q_i, dO_i, L_i, D_i and
        atomically add the partial dQ_i (rows_i x d) to dQacc_i; write dK_j, dV_j.
        Convention: an atomic add of one float32 element counts as one read and one write
        of dQacc (the read-modify-write the L2 performs).
    convert: read dQacc (float32), write dQ = dQacc in the problem dtype (always, fp32
        included: FlashAttention-2 runs this pass for every dtype).
  dropout (Problem.dropout_p = p > 0; Algorithm 4): with keep mask Z (iosim.dropout)
        dV = (P o Z/(1-p))^T dO,  dP = (dO V^T) o Z/(1-p),  D = rowsum(dO o O),
        dS = P o (dP - D).  fa1, fa2 regenerate Z on chip (no extra traffic); standard
        reads the Z its forward stored (uint8) in the dV kernel and the dP kernel:
        + 2 RCA reads of Z.
  grouped heads (kv_heads < heads), every schedule: each query head's kernel writes its own
    dK_h, dV_h (N_k x d) as above; a reduction pass then reads all `heads` of them and
    writes the `kv_heads` sums: + batch*heads*N_k*d reads and batch*kv_heads*N_k*d writes
    for each of dK and dV (counted under dK, dV).

Closed form, per instance, with the forward's tile sums (iosim.closed_form.problem_sums):
  n_A tiles, RA = sum rows_i, CA = sum cols_j, RCA = sum rows_i cols_j over active tiles
  (N = N_q, N_k key rows):
  standard  reads  P 2RCA, dP RCA, dS 2RCA, dO 2RA d, V CA d, K CA d, Q RA d
            writes dP RCA, dS RCA, dV N_k d, dQ N d, dK N_k d
  fa1       reads  K N_k d, V N_k d, Q RA d, O RA d, dO RA d, dQ RA d, l RA, m RA
            writes dQ (N + RA) d, dK 2 N_k d, dV 2 N_k d
  fa2       reads  dO (N + RA) d, O N d, K N_k d, V N_k d, Q RA d, L RA, D RA,
                   dQacc (RA + N) d
            writes D N, dQacc (N + RA) d, dK N_k d, dV N_k d, dQ N d
"""
from __future__ import annotations

import numpy as np

from .closed_form import _max, _ints, check_arrays, exact_ints, int_dtype, problem_sums, tile_sums
from .ledger import CountingMemory, Ledger
from .problem import MAX_HEAD_DIM, STAT_DTYPE, ConfigError, Problem
from .reference import _masked_matmul, dropout_weights, element_mask, reference_probs
from .schedules import (FORWARD, active_tiles, block_bounds, check_scale, dropped,
                        random_inputs, read_row_active, rowblock_product, set_instance_keep,
                        tile_keep, write_row_active)
from .tiling import ALGORITHMS, Tiling

F32 = np.float32
NEG_INF = F32(-np.inf)
#: Tensors stored as float32 in the backward: the statistics and the fa2 dQ accumulator.
F32_TENSORS = frozenset({"l", "m", "L", "D", "dQacc"})


class BackwardLedger(Ledger):
    """A Ledger whose float32 tensors include the fa2 accumulator dQacc (4 bytes/element)."""

    def itemsize_of(self, tensor: str) -> int:
        if tensor in F32_TENSORS:
            return STAT_DTYPE.itemsize
        return self.problem.itemsize_of(tensor)     # the problem dtype; Z: 1 byte


def _check_algorithm(algorithm):
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALGORITHMS)}")


def _probs(S, l=None, m=None, L=None):
    """P = exp(S - L) (or diag(l)^-1 exp(S - m)) in float32. Rows that saw no key in the
    forward (L = -inf; fa1: l = 0) give 0; a NaN statistic (the forward met a NaN or Inf)
    gives NaN, never 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        if L is None:
            ok = (l != 0)[:, None]
            m_safe = np.where(np.isneginf(m), F32(0), m)[:, None]
            P = np.exp(S - m_safe) / np.where(ok, l[:, None], F32(1))
        else:
            ok = ~np.isneginf(L)[:, None]
            P = np.exp(S - np.where(ok, L[:, None], F32(0)))
        P = np.where(np.isneginf(S), F32(0), P)          # masked entries: 0, as the kernels
    return np.where(ok, P, F32(0)).astype(F32)


from .schedules import _scores  # noqa: E402  (S_ij with entries outside the band -inf)


# ---------------------------------------------------------------------------------------
# The three backward schedules, one instance each. mem holds Q, K, V, O, dO and the
# forward's leftovers; they write dQ, dK, dV (N x d, problem dtype) into mem.
# ---------------------------------------------------------------------------------------
def _colblock_product(mem: CountingMemory, a: str, b: str, out: str, rows, cols, active,
                      d: int, dt, scale=None, dropout_p: float = 0.0, kernel: str = "colblock"):
    """Out_j = [scale] sum_i A_ij^T B_i over the active tiles, one pass per key block,
    accumulated in float32 (gpu.backward.standard.tposed_kernel): dV = P^T dO and
    dK = scale dS^T Q. dropout_p > 0: A_ij dropped with Z_ij read from HBM ("Z").
    kernel: its name in the access trace (`CountingMemory.mark`)."""
    for j, (c0, c1) in enumerate(cols):
        acc = np.zeros((c1 - c0, d), dtype=F32)
        for i, (r0, r1) in enumerate(rows):
            if active[i, j]:
                mem.mark(kernel, j, (i, j))
                Aij = mem.read(a, slice(r0, r1), slice(c0, c1)).astype(F32)
                if dropout_p:
                    Aij = dropped(Aij, mem.read("Z", slice(r0, r1), slice(c0, c1)) != 0,
                                  dropout_p)
                acc += Aij.T @ mem.read(b, slice(r0, r1)).astype(F32)
        mem.mark(kernel, j, (-1, j))
        mem.write(out, (acc if scale is None else F32(scale) * acc).astype(dt), slice(c0, c1))


def standard_backward(mem: CountingMemory, problem: Problem, tiling: Tiling, scale: float):
    N, d, dt = problem.N, problem.d, problem.np_dtype
    N_k = problem.N_k
    rows, cols = block_bounds(N, tiling.B_r), block_bounds(N_k, tiling.B_c)
    A = active_tiles(problem, tiling)
    for name in ("dP", "dS"):
        mem.alloc(name, np.full((N, N_k), np.nan, dtype=dt))
    for name, n in (("dQ", N), ("dK", N_k), ("dV", N_k)):
        mem.alloc(name, np.full((n, d), np.nan, dtype=dt))
    p_drop = problem.dropout_p
    # 1. dV_j = sum_i (P_ij [o Z_ij / (1 - p)])^T dO_i
    _colblock_product(mem, "P", "dO", "dV", rows, cols, A, d, dt, dropout_p=p_drop,
                      kernel="std_bwd_dV")
    # 2. dP_ij = dO_i V_j^T [o Z_ij / (1 - p)]
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            if A[i, j]:
                mem.mark("std_bwd_dP", (i, j), (i, j))
                dOi = mem.read("dO", slice(r0, r1)).astype(F32)
                Vj = mem.read("V", slice(c0, c1)).astype(F32)
                dP = dOi @ Vj.T
                if p_drop:
                    dP = dropped(dP, mem.read("Z", slice(r0, r1), slice(c0, c1)) != 0, p_drop)
                mem.write("dP", dP.astype(dt), slice(r0, r1), slice(c0, c1))
    # 3. dS = P o (dP - D), D = rowsum(P o dP), one pass per row over its active entries
    for i, (r0, r1) in enumerate(rows):
        js = [j for j in range(len(cols)) if A[i, j]]
        if not js:
            continue
        mem.mark("std_bwd_dS", i, (i, -1))
        P = read_row_active(mem, "P", r0, r1, cols, js)
        dP = read_row_active(mem, "dP", r0, r1, cols, js)
        D = (P * dP).sum(axis=1, keepdims=True, dtype=F32)
        write_row_active(mem, "dS", (P * (dP - D)).astype(dt), r0, r1, cols, js)
    # 4. dQ_i = scale sum_j dS_ij K_j  (dS = P o (dP - D) already holds the dropout)
    rowblock_product(mem, "dS", "K", "dQ", rows, cols, A, d, dt, scale, kernel="std_bwd_dQ")
    # 5. dK_j = scale sum_i dS_ij^T Q_i
    _colblock_product(mem, "dS", "Q", "dK", rows, cols, A, d, dt, scale, kernel="std_bwd_dK")


def fa1_backward(mem: CountingMemory, problem: Problem, tiling: Tiling, scale: float):
    N, d, dt = problem.N, problem.d, problem.np_dtype
    N_k = problem.N_k
    rows, cols = block_bounds(N, tiling.B_r), block_bounds(N_k, tiling.B_c)
    A = active_tiles(problem, tiling)
    mem.mark("fa1_bwd", 0)
    for name, n in (("dQ", N), ("dK", N_k), ("dV", N_k)):             # line 6
        mem.alloc(name, np.full((n, d), np.nan, dtype=dt))
        mem.write(name, np.zeros((n, d), dtype=dt))
    for j, (c0, c1) in enumerate(cols):                               # line 7
        mem.mark("fa1_bwd", 0, (-1, j))
        Kj = mem.read("K", slice(c0, c1)).astype(F32)                 # line 8
        Vj = mem.read("V", slice(c0, c1)).astype(F32)
        dK_t = np.zeros((c1 - c0, d), dtype=F32)                      # line 9
        dV_t = np.zeros((c1 - c0, d), dtype=F32)
        for i, (r0, r1) in enumerate(rows):                           # line 10
            if not A[i, j]:
                continue
            mem.mark("fa1_bwd", 0, (i, j))
            Qi = mem.read("Q", slice(r0, r1)).astype(F32)             # line 11
            Oi = mem.read("O", slice(r0, r1)).astype(F32)
            dOi = mem.read("dO", slice(r0, r1)).astype(F32)
            dQi = mem.read("dQ", slice(r0, r1)).astype(F32)
            li, mi = mem.read("l", slice(r0, r1)), mem.read("m", slice(r0, r1))
            S = _scores(Qi, Kj, scale, r0, c0, problem.band)        # lines 12-13
            P = _probs(S, l=li, m=mi)                                 # line 14
            keep = tile_keep(mem, r0, r1, c0, c1)                     # line 15: Z_ij
            dV_t += dropped(P, keep, problem.dropout_p).T @ dOi       # lines 16-17
            dP = dropped(dOi @ Vj.T, keep, problem.dropout_p)         # lines 18-19
            D = (dOi * Oi).sum(axis=1, keepdims=True, dtype=F32)      # line 20
            dS = P * (dP - D)                                         # line 21
            mem.write("dQ", (dQi + F32(scale) * (dS @ Kj)).astype(dt), slice(r0, r1))  # line 22
            dK_t += F32(scale) * (dS.T @ Qi)                          # line 23
        mem.mark("fa1_bwd", 0, (-1, j))
        mem.write("dK", dK_t.astype(dt), slice(c0, c1))               # line 25
        mem.write("dV", dV_t.astype(dt), slice(c0, c1))


def fa2_backward(mem: CountingMemory, problem: Problem, tiling: Tiling, scale: float):
    N, d, dt = problem.N, problem.d, problem.np_dtype
    N_k = problem.N_k
    rows, cols = block_bounds(N, tiling.B_r), block_bounds(N_k, tiling.B_c)
    A = active_tiles(problem, tiling)
    mem.alloc("D", np.full(N, np.nan, dtype=F32))
    mem.alloc("dQacc", np.full((N, d), np.nan, dtype=F32))
    for name, n in (("dQ", N), ("dK", N_k), ("dV", N_k)):
        mem.alloc(name, np.full((n, d), np.nan, dtype=dt))
    # preprocess: D = rowsum(dO o O); dQacc = 0
    for i, (r0, r1) in enumerate(rows):
        mem.mark("fa2_bwd_pre", i, (i, -1))
        dOi = mem.read("dO", slice(r0, r1)).astype(F32)
        Oi = mem.read("O", slice(r0, r1)).astype(F32)
        mem.write("D", (dOi * Oi).sum(axis=1, dtype=F32), slice(r0, r1))
    mem.mark("fa2_bwd_pre", "dQacc = 0")
    mem.write("dQacc", np.zeros((N, d), dtype=F32))
    # main: one thread block per key block j
    for j, (c0, c1) in enumerate(cols):
        mem.mark("fa2_bwd_main", j, (-1, j))
        Kj = mem.read("K", slice(c0, c1)).astype(F32)
        Vj = mem.read("V", slice(c0, c1)).astype(F32)
        dK_t = np.zeros((c1 - c0, d), dtype=F32)
        dV_t = np.zeros((c1 - c0, d), dtype=F32)
        for i, (r0, r1) in enumerate(rows):
            if not A[i, j]:
                continue
            mem.mark("fa2_bwd_main", j, (i, j))
            Qi = mem.read("Q", slice(r0, r1)).astype(F32)
            dOi = mem.read("dO", slice(r0, r1)).astype(F32)
            Li, Di = mem.read("L", slice(r0, r1)), mem.read("D", slice(r0, r1))
            P = _probs(_scores(Qi, Kj, scale, r0, c0, problem.band), L=Li)
            keep = tile_keep(mem, r0, r1, c0, c1)          # Z_ij, regenerated on chip
            dV_t += dropped(P, keep, problem.dropout_p).T @ dOi
            dS = P * (dropped(dOi @ Vj.T, keep, problem.dropout_p) - Di[:, None])
            # atomicAdd of rows_i x d float32 values: one read and one write each
            part = mem.read("dQacc", slice(r0, r1))
            mem.write("dQacc", (part + F32(scale) * (dS @ Kj)).astype(F32), slice(r0, r1))
            dK_t += F32(scale) * (dS.T @ Qi)
        mem.mark("fa2_bwd_main", j, (-1, j))
        mem.write("dK", dK_t.astype(dt), slice(c0, c1))
        mem.write("dV", dV_t.astype(dt), slice(c0, c1))
    # convert: dQ = dQacc in the problem dtype
    mem.mark("bwd_convert", 0)
    mem.write("dQ", mem.read("dQacc").astype(dt))


BACKWARD = {"standard": standard_backward, "fa1": fa1_backward, "fa2": fa2_backward}


class BackwardExecution:
    """Result of `execute_backward`: dq (batch, heads, N_q, d), dk and dv (batch, kv_heads,
    N_k, d) in the problem dtype, the backward-only ledger, and the forward output O."""

    def __init__(self, dq, dk, dv, ledger, O, trace=None):
        self.dq, self.dk, self.dv, self.ledger, self.O = dq, dk, dv, ledger, O
        self.trace = trace


def execute_backward(algorithm: str, problem: Problem, tiling: Tiling, q=None, k=None, v=None,
                     do=None, *, scale: float | None = None, seed: int = 0,
                     dropout_seed: int = 0, dropout_offset: int = 0,
                     record: bool = False) -> BackwardExecution:
    """Run the forward schedule of `algorithm` (uncounted), then its backward, counted.

    Every (batch, query head) instance is executed. The ledger holds only the backward's
    accesses, in elements, as problem totals (the BackwardLedger's `algorithm` is
    "<algorithm>-backward"). q, k, v, do default to standard-normal arrays from `seed`.
    dropout_seed, dropout_offset: the Philox keep mask's (problem.dropout_p > 0); forward
    and backward use the same mask.
    record: also return the backward's access trace (`BackwardExecution.trace`, as
    `iosim.execute`'s): ("instance", b, h, g) before each instance, ("instance", b, None,
    g) before a group's dK, dV reduction.
    """
    _check_algorithm(algorithm)
    B, H, G, N, d = problem.batch, problem.heads, problem.kv_heads, problem.N, problem.d
    dt = problem.np_dtype
    if q is None:
        q, k, v = random_inputs(problem, seed)
    if do is None:
        do = np.random.default_rng(seed + 1).standard_normal((B, H, N, d)).astype(dt)
    N_k = problem.N_k
    for name, x, h, n in (("q", q, H, N), ("k", k, G, N_k), ("v", v, G, N_k), ("do", do, H, N)):
        if np.shape(x) != (B, h, n, d):
            raise ConfigError(f"{name} has shape {np.shape(x)}; the problem needs {(B, h, n, d)}")
    q, k, v, do = (np.asarray(x, dtype=dt) for x in (q, k, v, do))
    active_tiles(problem, tiling)
    scale = check_scale(1.0 / np.sqrt(d) if scale is None else scale)
    O = np.empty((B, H, N, d), dtype=dt)
    dq = np.empty((B, H, N, d), dtype=dt)
    dk_h = np.empty((B, H, N_k, d), dtype=dt)   # per query head, before the group sum
    dv_h = np.empty((B, H, N_k, d), dtype=dt)
    counted = CountingMemory()
    if record:
        counted.record()
    for b in range(B):
        for h in range(H):
            g = h // problem.group
            if record:
                counted.trace.append(("instance", b, h, g))
            fwd = CountingMemory(Q=q[b, h], K=k[b, g], V=v[b, g])
            set_instance_keep(fwd, problem, b, h, dropout_seed, dropout_offset)
            counted.keep = fwd.keep
            FORWARD[algorithm](fwd, problem, tiling, scale)
            O[b, h] = fwd.arrays["O"]
            # hand the forward's HBM to the counted memory: counts continue across instances
            counted.arrays = dict(fwd.arrays, dO=do[b, h])
            BACKWARD[algorithm](counted, problem, tiling, scale)
            dq[b, h] = counted.arrays["dQ"]
            dk_h[b, h], dv_h[b, h] = counted.arrays["dK"], counted.arrays["dV"]
    if problem.group == 1:
        dk, dv = dk_h, dv_h
    else:  # reduction pass: dK_g = sum over the group's query heads of dK_h (same for dV)
        dk = np.empty((B, G, N_k, d), dtype=dt)
        dv = np.empty((B, G, N_k, d), dtype=dt)
        for out, per_head, name in ((dk, dk_h, "dK"), (dv, dv_h, "dV")):
            for b in range(B):
                for g in range(G):
                    if record:
                        counted.trace.append(("instance", b, None, g))
                    counted.mark("bwd_group_sum", (name, b, g))
                    acc = np.zeros((N_k, d), dtype=F32)
                    for h in range(g * problem.group, (g + 1) * problem.group):
                        counted.alloc(name, per_head[b, h])
                        acc += counted.read(name).astype(F32)
                    counted.alloc(name, np.empty((N_k, d), dtype=dt))
                    counted.write(name, acc.astype(dt))
                    out[b, g] = counted.arrays[name]
    ledger = BackwardLedger(f"{algorithm}-backward", problem, tiling,
                            dict(counted.reads), dict(counted.writes))
    return BackwardExecution(dq, dk, dv, ledger, O, counted.trace)


# ---------------------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------------------
def backward_counts_from_sums(algorithm: str, N, d, nA, RA, CA, RCA, N_k=None,
                              dropout=False):
    """Per-instance backward element counts ({tensor: reads}, {tensor: writes}), without the
    grouped-head reduction; arrays broadcast. N: query rows N_q; N_k: key rows (default
    N); dropout: whether dropout_p > 0 (standard then reads its stored Z twice). See the
    module docstring. Exact at any size (object arrays where int64 could overflow)."""
    N_k = N if N_k is None else N_k
    (N, d, nA, RA, CA, RCA), N_k = exact_ints(N, d, nA, RA, CA, RCA, factor=2), \
        exact_ints(N_k, d, nA, RA, CA, RCA, factor=2)[0]
    Nd, Nkd = N * d, N_k * d
    if algorithm == "standard":
        reads = {"P": 2 * RCA, "dP": RCA, "dS": 2 * RCA, "dO": 2 * RA * d, "V": CA * d,
                 "K": CA * d, "Q": RA * d}
        writes = {"dP": RCA, "dS": RCA, "dV": Nkd, "dQ": Nd, "dK": Nkd}
        if dropout:
            reads["Z"] = 2 * RCA
    elif algorithm == "fa1":
        reads = {"K": Nkd, "V": Nkd, "Q": RA * d, "O": RA * d, "dO": RA * d, "dQ": RA * d,
                 "l": RA, "m": RA}
        writes = {"dQ": Nd + RA * d, "dK": 2 * Nkd, "dV": 2 * Nkd}
    elif algorithm == "fa2":
        reads = {"dO": Nd + RA * d, "O": Nd, "K": Nkd, "V": Nkd, "Q": RA * d, "L": RA,
                 "D": RA, "dQacc": RA * d + Nd}
        writes = {"D": N, "dQacc": Nd + RA * d, "dK": Nkd, "dV": Nkd, "dQ": Nd}
    else:
        _check_algorithm(algorithm)
    return reads, writes


def _add_group_reduction(reads, writes, N, d, batch, heads, kv_heads):
    """Totals (not per instance): add the dK/dV group-sum pass when kv_heads < heads
    (N: the key rows N_k of dK, dV)."""
    dt = object if any(np.asarray(x).dtype == object for x in (N, d, batch, heads)) else np.int64
    grouped = np.asarray(kv_heads < heads, dtype=bool)
    zero = np.asarray(0, dtype=dt)
    extra_r = np.where(grouped, np.asarray(batch * heads * N * d, dtype=dt), zero)
    extra_w = np.where(grouped, np.asarray(batch * kv_heads * N * d, dtype=dt), zero)
    for t in ("dK", "dV"):
        reads[t] = reads.get(t, 0) + extra_r
        writes[t] = writes.get(t, 0) + extra_w


def backward_closed_form(algorithm: str, problem: Problem, tiling: Tiling) -> BackwardLedger:
    """The ledger of `execute_backward(algorithm, problem, tiling)`, by formula (totals)."""
    _check_algorithm(algorithm)
    sums = problem_sums(problem, tiling)
    reads, writes = backward_counts_from_sums(algorithm, problem.N, problem.d, *sums,
                                              N_k=problem.N_k,
                                              dropout=problem.dropout_p > 0)
    k = problem.instances
    reads = {t: int(c) * k for t, c in reads.items()}
    writes = {t: int(c) * k for t, c in writes.items()}
    obj = lambda x: np.asarray(x, dtype=object)      # Python ints: exact at any size
    _add_group_reduction(reads, writes, obj(problem.N_k), obj(problem.d), obj(problem.batch),
                         obj(problem.heads), obj(problem.kv_heads))
    return BackwardLedger(f"{algorithm}-backward", problem, tiling,
                          {t: int(c) for t, c in reads.items()},
                          {t: int(c) for t, c in writes.items()})


def backward_closed_form_arrays(algorithm: str, N, d, B_r, B_c, *, causal=False, itemsize=2,
                                batch=1, heads=1, kv_heads=None, N_k=None,
                                window=(-1, -1)) -> dict:
    """Vectorised backward ledger for many configurations (dense or causal; no masks).
    N_k (key rows, broadcasts; default N) and window=(left, right) as iosim.Problem.

    Arguments broadcast. itemsize: bytes of the problem dtype (2 fp16, 4 fp32); l, m, L,
    D and dQacc are 4 bytes. Returns problem totals: reads / writes {tensor: elements},
    read_bytes, write_bytes, hbm_bytes (bytes); int64 arrays where int64 holds them
    exactly, else object arrays of Python ints (iosim.closed_form.int_dtype).
    """
    _check_algorithm(algorithm)
    causal, window = check_arrays(causal=causal, window=window, N=N, d=d, B_r=B_r, B_c=B_c,
                                  itemsize=itemsize, batch=batch, heads=heads,
                                  kv_heads=kv_heads, N_k=N_k)
    kv_heads = heads if kv_heads is None else kv_heads
    # counts are at most about 16 (N + B_r + B_c)^2 d batch heads elements, times 8 bytes
    bound = (128.0 * (_max(N) + (0.0 if N_k is None else _max(N_k)) + _max(B_r) + _max(B_c) + 2.0) ** 2 * max(_max(d), 1.0)
             * max(_max(batch), 1.0) * max(_max(heads), 1.0) * max(_max(itemsize), 4.0))
    args = (N, d, B_r, B_c, itemsize, batch, heads, kv_heads)
    N, d, B_r, B_c, itemsize, batch, heads, kv_heads = _ints(int_dtype(bound, *args), *args)
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
    reads, writes = backward_counts_from_sums(
        algorithm, N, d, *tile_sums(N, B_r, B_c, causal, N_k=N_k, window=window), N_k=N_k)
    reads = {t: c * batch * heads for t, c in reads.items()}
    writes = {t: c * batch * heads for t, c in writes.items()}
    _add_group_reduction(reads, writes, N if N_k is None else N_k, d, batch, heads, kv_heads)
    size = lambda t: 4 if t in F32_TENSORS else itemsize
    rb = sum(c * size(t) for t, c in reads.items())
    wb = sum(c * size(t) for t, c in writes.items())
    return {"reads": reads, "writes": writes, "read_bytes": rb, "write_bytes": wb,
            "hbm_bytes": rb + wb}


# ---------------------------------------------------------------------------------------
# Independent dense reference
# ---------------------------------------------------------------------------------------
def reference_attention_backward(q, k, v, do, *, causal: bool = False, scale: float | None = None,
                                 block_mask=None, B_r: int | None = None, B_c: int | None = None,
                                 window=(-1, -1), dropout_p: float = 0.0, dropout_keep=None):
    """(dq, dk, dv) of O = softmax(scale Q K^T + mask) V in float64, analytically:
    dV = P^T dO, dP = dO V^T, D = rowsum(P o dP), dS = P o (dP - D), dQ = scale dS K,
    dK = scale dS^T Q. Shapes (..., heads, N, d); K, V may have fewer (grouped) heads, in
    which case dk, dv are summed over each group. Rows that see no key have P = 0.
    Every sum runs over the visible (row, key) pairs only, so a NaN or Inf input gives NaN
    where it reaches, never a finite number, and nothing where it is masked (as
    iosim.reference_attention).
    Dropout (Algorithm 4; p = dropout_p, Z = dropout_keep, boolean (..., heads, N_q, N_k)):
    dV = (P o Z/(1-p))^T dO, dP = (dO V^T) o Z/(1-p), D = rowsum(P o dP), dS = P o (dP - D)."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    H, G = q.shape[-3], k.shape[-3]
    if H % G:
        raise ConfigError(f"kv_heads={G} must divide heads={H}")
    kr, vr = np.repeat(k, H // G, axis=-3), np.repeat(v, H // G, axis=-3)
    N, d = q.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    allowed = element_mask(N, causal, block_mask, B_r, B_c, N_k=k.shape[-2], window=window)
    p, _, _ = reference_probs(q, kr, allowed, scale)
    with np.errstate(invalid="ignore", over="ignore"):
        pd = dropout_weights(p, dropout_keep, dropout_p)
        dv = _masked_matmul(np.swapaxes(pd, -1, -2), allowed.T, do)
        dp = dropout_weights(do @ np.swapaxes(vr, -1, -2), dropout_keep, dropout_p)
        D = np.where(allowed, p * dp, 0.0).sum(axis=-1, keepdims=True)
        ds = np.where(allowed, p * (dp - D), 0.0)
        dq = scale * _masked_matmul(ds, allowed, kr)
        dk = scale * _masked_matmul(np.swapaxes(ds, -1, -2), allowed.T, q)
    if H != G:
        shape = dk.shape[:-3] + (G, H // G) + dk.shape[-2:]
        dk, dv = dk.reshape(shape).sum(axis=-3), dv.reshape(shape).sum(axis=-3)
    return dq, dk, dv


__all__ = ["BACKWARD", "BackwardExecution", "BackwardLedger", "F32_TENSORS",
           "backward_closed_form", "backward_closed_form_arrays", "backward_counts_from_sums",
           "execute_backward", "reference_attention_backward"]
