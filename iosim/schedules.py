"""Executable forward schedules: real NumPy numerics, tile by tile, through a counting HBM.

Each schedule is written as its gpu kernel runs it, so one execution yields the output
(checked against `reference_attention`) and the ledger (checked against `closed_form`
and against the kernels' own counters). Numerics: float32 accumulation and statistics,
tensors stored in the problem dtype (the kernels do the same).

Notation (Dao et al. 2022): N = N_q query rows, N_k key/value rows (N_k = N unless
given). Query block i holds rows [i B_r, min((i+1) B_r, N_q)), key block j rows
[j B_c, min((j+1) B_c, N_k)); T_r = ceil(N_q/B_r), T_c = ceil(N_k/B_c).

Masks (iosim.problem): query row r sees key c iff lo <= c - r <= hi (`Problem.band`;
None = unbounded), bottom-right aligned: o = N_k - N_q, causal hi = o, window (wl, wr)
lo = o - wl, hi = o + wr.

Active tiles. Tile (i, j) with last query row r_l = min((i+1) B_r, N_q) - 1 and last key
c_l = min((j+1) B_c, N_k) - 1 is skipped, costing no traffic, iff
  * it holds no visible (row, key) pair: c - r over the tile takes every integer in
    [j B_c - r_l, c_l - i B_r], so the tile is active iff j B_c - r_l <= hi and
    c_l - i B_r >= lo (causal, N_k = N_q: j B_c <= r_l). Partly masked tiles are loaded
    whole and masked on chip; or
  * a block-sparse mask is given and block_mask[i, j] is False (Proposition 4).

What each schedule reads and writes, per (batch, query head) instance:
  standard  (Algorithm 0, three kernels; S and P are N_q x N_k HBM buffers, problem dtype)
            S kernel, per active tile:  read Q_i, K_j; write S_ij = scale Q_i K_j^T
                                        (entries outside the band written as -inf).
            softmax, per query row:     read the row's entries of S over its active
                                        tiles (once; the row is held on chip); write P
                                        over the same entries.
            PV kernel, per query block: for each active j read P_ij and V_j; write O_i.
  fa1       (Algorithm 1 as written; one thread block per instance)
            step 2: write O = 0, l = 0, m = -inf (N_q rows).   For j in 1..T_c (step 5):
            read K_j, V_j (step 6; every key block, active tiles or not). For each active i (step 7): read Q_i, O_i, l_i, m_i (step 8),
            compute (steps 9-11), write O_i (step 12), l_i, m_i (step 13).
  fa2       (FlashAttention-2 forward; one thread block per query block and instance)
            read Q_i; for each active j read K_j, V_j; write O_i and L_i = m_i + log l_i.
A row with no visible key (under a block mask, a window, or causal with N_q > N_k)
gets O = 0 and L = -inf (fa1: O = 0, l = 0, m = -inf).
Dropout (Problem.dropout_p = p > 0; Algorithm 2): P V becomes (P o Z / (1 - p)) V with
the keep mask Z of iosim.dropout (Philox, keyed by seed, offset, b, h, row, col); the
row sums l (and L) are those of P before dropout. fa1 and fa2 regenerate Z on chip:
no extra traffic (the host model takes it precomputed, `CountingMemory.keep`, uncounted).
standard, as the unfused graph: the softmax kernel also writes Z (tensor "Z", uint8,
1 byte per element) over the row's active entries, and the PV kernel reads Z_ij with
P_ij: + RCA writes and + RCA reads of Z.
Non-finite inputs: a row that sees a key and meets a NaN or Inf (in q, k, v or the scale)
gets NaN, never a finite number: "sees no key" is decided from the masks (`sees_key`),
not from the running sum l, which is then NaN.
"""
from __future__ import annotations

import numpy as np

from .ledger import CountingMemory, Ledger
from .problem import ConfigError, Problem
from .tiling import ALGORITHMS, Tiling

F32 = np.float32
NEG_INF = F32(-np.inf)


# ---------------------------------------------------------------------------------------
# Tiles
# ---------------------------------------------------------------------------------------
def block_bounds(N: int, B: int) -> list[tuple[int, int]]:
    """[(start, stop)] of the blocks of size B over N rows; the last may be ragged."""
    return [(s, min(s + B, N)) for s in range(0, N, B)]


def band_tiles(N_q: int, N_k: int, B_r: int, B_c: int, band) -> np.ndarray:
    """Boolean (T_r, T_c): tiles holding at least one pair lo <= c - r <= hi (band =
    (lo, hi), None unbounded; see the module docstring)."""
    lo, hi = band
    r0 = np.arange(-(-N_q // B_r)) * B_r
    r_last = np.minimum(r0 + B_r, N_q) - 1
    c0 = np.arange(-(-N_k // B_c)) * B_c
    c_last = np.minimum(c0 + B_c, N_k) - 1
    active = np.ones((r0.size, c0.size), dtype=bool)
    if hi is not None:
        active &= (c0[None, :] - r_last[:, None]) <= hi
    if lo is not None:
        active &= (c_last[None, :] - r0[:, None]) >= lo
    return active


def active_tiles(problem: Problem, tiling: Tiling) -> np.ndarray:
    """Boolean (T_r, T_c): which tiles a schedule visits (see module docstring)."""
    N, N_k = problem.N, problem.N_k
    T_r, T_c = tiling.T_r(N), tiling.T_c(N_k)
    active = band_tiles(N, N_k, tiling.B_r, tiling.B_c, problem.band)
    if problem.block_mask is not None:
        if problem.block_mask.shape != (T_r, T_c):
            raise ConfigError(
                f"block_mask has shape {problem.block_mask.shape}; for N_q={N}, N_k={N_k}, "
                f"B_r={tiling.B_r}, B_c={tiling.B_c} it must be (T_r, T_c) = ({T_r}, {T_c})")
        active &= problem.block_mask
    return active


def band_mask(r0: int, r1: int, c0: int, c1: int, band) -> np.ndarray | None:
    """Boolean (r1 - r0, c1 - c0): visible pairs of rows r0..r1-1, keys c0..c1-1 under
    band = (lo, hi); None when nothing is masked (band (None, None))."""
    lo, hi = band
    if lo is None and hi is None:
        return None
    dc = np.arange(c0, c1)[None, :] - np.arange(r0, r1)[:, None]
    ok = np.ones(dc.shape, dtype=bool)
    if lo is not None:
        ok &= dc >= lo
    if hi is not None:
        ok &= dc <= hi
    return ok


def _scores(Qi, Kj, scale, r0, c0, band):
    """S_ij = scale Q_i K_j^T in float32, entries outside the band -inf."""
    S = (F32(scale) * (Qi.astype(F32) @ Kj.astype(F32).T)).astype(F32)
    ok = band_mask(r0, r0 + Qi.shape[0], c0, c0 + Kj.shape[0], band)
    return S if ok is None else np.where(ok, S, NEG_INF)


def _rows_see(r0: int, r1: int, c0, c1, band) -> np.ndarray:
    """Boolean (r1 - r0, len(c0)): whether each row sees a key of each column range
    [c0, c1) (arrays of block bounds) under band = (lo, hi)."""
    lo, hi = band
    rows = np.arange(r0, r1)[:, None]
    c0, c_last = np.asarray(c0)[None, :], np.asarray(c1)[None, :] - 1
    ok = np.ones((r1 - r0, c0.shape[1]), dtype=bool)
    if hi is not None:
        ok &= c0 <= rows + hi
    if lo is not None:
        ok &= c_last >= rows + lo
    return ok


def sees_key(problem: Problem, tiling: Tiling, active, r0: int, r1: int) -> np.ndarray:
    """Boolean (r1 - r0,): whether each query row r0..r1-1 may attend at least one key
    (an active tile holding a key column the band lets it see)."""
    i = r0 // tiling.B_r
    cols = block_bounds(problem.N_k, tiling.B_c)
    ok = active[i][None, :] & _rows_see(r0, r1, [c for c, _ in cols], [c for _, c in cols],
                                        problem.band)
    return ok.any(axis=1)


def _visible(r0: int, r1: int, c0: int, c1: int, band) -> np.ndarray:
    """Boolean (r1 - r0,): rows that see at least one key c0..c1-1 of an active tile."""
    return _rows_see(r0, r1, [c0], [c1], band)[:, 0]


def _safe(m):
    """Max with -inf replaced by 0, so that exp(S - m) of an all-masked row is 0, not NaN."""
    return np.where(np.isneginf(m), F32(0), m).astype(F32)


def read_row_active(mem: CountingMemory, name: str, r0: int, r1: int, cols, js):
    """Rows r0:r1 of an N_q x N_k HBM matrix over the active key blocks js, read tile by tile
    and joined along the keys, as float32 (one row pass of the standard algorithm)."""
    return np.concatenate([mem.read(name, slice(r0, r1), slice(*cols[j])) for j in js],
                          axis=1).astype(F32)


def write_row_active(mem: CountingMemory, name: str, X, r0: int, r1: int, cols, js):
    """Write X (rows r0:r1, the active key blocks js joined) back tile by tile."""
    at = 0
    for j in js:
        c0, c1 = cols[j]
        mem.write(name, X[:, at:at + c1 - c0], slice(r0, r1), slice(c0, c1))
        at += c1 - c0


def dropped(X, keep, dropout_p: float):
    """X o Z / (1 - p) in float32 (X unchanged when keep is None): the dropout of
    Algorithm 2 applied to a tile X of P (or of dP = dO V^T in the backward)."""
    if keep is None:
        return X
    return np.where(keep, X * F32(1.0 / (1.0 - dropout_p)), F32(0)).astype(F32)


def tile_keep(mem: CountingMemory, r0: int, r1: int, c0: int, c1: int):
    """The instance's keep mask over rows r0:r1, keys c0:c1 as the fused kernels
    regenerate it on chip (uncounted); None without dropout."""
    return None if mem.keep is None else mem.keep[r0:r1, c0:c1]


def rowblock_product(mem: CountingMemory, a: str, b: str, out: str, rows, cols, active,
                     d: int, dt, scale=None, dropout_p: float = 0.0, kernel: str = "rowblock"):
    """Out_i = [scale] sum_j A_ij B_j over the active tiles, one pass per query block,
    accumulated in float32 (gpu.forward.standard.rowblock_product_kernel): the forward's O = P V
    and the standard backward's dQ = scale dS K. dropout_p > 0: A_ij is dropped with the
    keep mask Z_ij read from HBM tensor "Z" (the standard forward's O = (P o Z/(1-p)) V).
    kernel: its name in the access trace (`CountingMemory.mark`)."""
    for i, (r0, r1) in enumerate(rows):
        acc = np.zeros((r1 - r0, d), dtype=F32)
        for j, (c0, c1) in enumerate(cols):
            if active[i, j]:
                mem.mark(kernel, i, (i, j))
                A = mem.read(a, slice(r0, r1), slice(c0, c1)).astype(F32)
                if dropout_p:
                    A = dropped(A, mem.read("Z", slice(r0, r1), slice(c0, c1)) != 0, dropout_p)
                acc += A @ mem.read(b, slice(c0, c1)).astype(F32)
        mem.mark(kernel, i, (i, -1))
        mem.write(out, (acc if scale is None else F32(scale) * acc).astype(dt), slice(r0, r1))


# ---------------------------------------------------------------------------------------
# The three forward schedules, one instance (one (batch, head)) each.
# mem holds Q, K, V (N x d, problem dtype) and receives O and the statistics.
# ---------------------------------------------------------------------------------------
def standard_forward(mem: CountingMemory, problem: Problem, tiling: Tiling, scale: float):
    N, d, dt = problem.N, problem.d, problem.np_dtype
    rows, cols = block_bounds(N, tiling.B_r), block_bounds(problem.N_k, tiling.B_c)
    active = active_tiles(problem, tiling)
    mem.alloc("S", np.full((N, problem.N_k), np.nan, dtype=dt))
    mem.alloc("P", np.full((N, problem.N_k), np.nan, dtype=dt))
    mem.alloc("O", np.full((N, d), np.nan, dtype=dt))
    p_drop = problem.dropout_p
    if p_drop:
        mem.alloc("Z", np.zeros((N, problem.N_k), dtype=np.uint8))
    # Kernel 1: S = scale Q K^T, one thread block per active tile.
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            if active[i, j]:
                mem.mark("std_S", (i, j), (i, j))
                Qi, Kj = mem.read("Q", slice(r0, r1)), mem.read("K", slice(c0, c1))
                mem.write("S", _scores(Qi, Kj, scale, r0, c0, problem.band).astype(dt),
                          slice(r0, r1), slice(c0, c1))
    # Kernel 2: row-wise softmax over the active entries (grouped here by query block;
    # the counts are those of one pass per row).
    for i, (r0, r1) in enumerate(rows):
        js = [j for j in range(len(cols)) if active[i, j]]
        if not js:
            continue
        mem.mark("std_softmax", i, (i, -1))
        S = read_row_active(mem, "S", r0, r1, cols, js)
        m = _safe(S.max(axis=1, keepdims=True))          # NaN propagates
        with np.errstate(invalid="ignore", over="ignore"):
            E = np.exp(S - m)
            l = E.sum(axis=1, keepdims=True)
            seen = sees_key(problem, tiling, active, r0, r1)[:, None]
            P = np.where(l > 0, E / np.where(l > 0, l, F32(1)),
                         np.where(seen, F32(np.nan), F32(0))).astype(dt)
        write_row_active(mem, "P", P, r0, r1, cols, js)
        if p_drop:   # the unfused graph's dropout stores its keep mask Z (uint8)
            write_row_active(mem, "Z", mem.keep[r0:r1].astype(np.uint8)[
                :, np.concatenate([np.arange(*cols[j]) for j in js])], r0, r1, cols, js)
    # Kernel 3: O_i = sum_j (P_ij [o Z_ij / (1 - p)]) V_j, one thread block per query block.
    rowblock_product(mem, "P", "V", "O", rows, cols, active, d, dt, dropout_p=p_drop,
                     kernel="std_PV")
    return {}


def fa1_forward(mem: CountingMemory, problem: Problem, tiling: Tiling, scale: float):
    N, d, dt = problem.N, problem.d, problem.np_dtype
    rows, cols = block_bounds(N, tiling.B_r), block_bounds(problem.N_k, tiling.B_c)
    active = active_tiles(problem, tiling)
    mem.alloc("O", np.full((N, d), np.nan, dtype=dt))
    mem.alloc("l", np.full(N, np.nan, dtype=F32))
    mem.alloc("m", np.full(N, np.nan, dtype=F32))
    # Step 2: initialise O = (0)_{N x d}, l = (0)_N, m = (-inf)_N in HBM.
    mem.mark("fa1_fwd", 0)
    mem.write("O", np.zeros((N, d), dtype=dt))
    mem.write("l", np.zeros(N, dtype=F32))
    mem.write("m", np.full(N, NEG_INF, dtype=F32))
    for j, (c0, c1) in enumerate(cols):                      # step 5
        mem.mark("fa1_fwd", 0, (-1, j))
        Kj = mem.read("K", slice(c0, c1)).astype(F32)        # step 6
        Vj = mem.read("V", slice(c0, c1)).astype(F32)
        for i, (r0, r1) in enumerate(rows):                  # step 7
            if not active[i, j]:
                continue
            mem.mark("fa1_fwd", 0, (i, j))
            Qi = mem.read("Q", slice(r0, r1))                # step 8
            Oi = mem.read("O", slice(r0, r1)).astype(F32)
            li = mem.read("l", slice(r0, r1))
            mi = mem.read("m", slice(r0, r1))
            S = _scores(Qi, Kj, scale, r0, c0, problem.band)        # step 9
            # rows that see a key of this tile update (decided from the band, so
            # that a NaN or Inf score gives NaN); the others keep O_i, l_i, m_i
            vis = _visible(r0, r1, c0, c1, problem.band)
            with np.errstate(invalid="ignore", over="ignore"):
                m_t = S.max(axis=1)                                    # step 10: m~_ij
                P_t = np.exp(S - np.where(vis, m_t, F32(0))[:, None])  #          P~_ij
                l_t = P_t.sum(axis=1, dtype=F32)                       #          l~_ij
                m_new = np.where(vis, np.maximum(mi, m_t), mi)         # step 11
                alpha = np.where(vis, np.exp(mi - m_new), F32(1))
                beta = np.where(vis, np.exp(m_t - m_new), F32(0))
                l_new = np.where(vis, alpha * li + beta * l_t, li).astype(F32)
                P_d = dropped(P_t, tile_keep(mem, r0, r1, c0, c1), problem.dropout_p)
                num = (li * alpha)[:, None] * Oi + beta[:, None] * (P_d @ Vj)
                Oi = np.where(vis[:, None], num / np.where(vis, l_new, F32(1))[:, None], Oi)
            mem.write("O", Oi.astype(dt), slice(r0, r1))               # step 12
            mem.write("l", l_new, slice(r0, r1))                       # step 13
            mem.write("m", m_new.astype(F32), slice(r0, r1))
    return {"l": mem.arrays["l"].copy(), "m": mem.arrays["m"].copy()}


def fa2_forward(mem: CountingMemory, problem: Problem, tiling: Tiling, scale: float):
    N, d, dt = problem.N, problem.d, problem.np_dtype
    rows, cols = block_bounds(N, tiling.B_r), block_bounds(problem.N_k, tiling.B_c)
    active = active_tiles(problem, tiling)
    mem.alloc("O", np.full((N, d), np.nan, dtype=dt))
    mem.alloc("L", np.full(N, np.nan, dtype=F32))
    for i, (r0, r1) in enumerate(rows):          # one thread block per query block
        mem.mark("fa2_fwd", i, (i, -1))
        Qi = mem.read("Q", slice(r0, r1))
        acc = np.zeros((r1 - r0, d), dtype=F32)  # unnormalised O_i, on chip
        m = np.full(r1 - r0, NEG_INF, dtype=F32)
        l = np.zeros(r1 - r0, dtype=F32)
        for j, (c0, c1) in enumerate(cols):
            if not active[i, j]:
                continue
            mem.mark("fa2_fwd", i, (i, j))
            Kj = mem.read("K", slice(c0, c1))
            Vj = mem.read("V", slice(c0, c1)).astype(F32)
            S = _scores(Qi, Kj, scale, r0, c0, problem.band)
            with np.errstate(invalid="ignore", over="ignore"):
                m_new = np.maximum(m, S.max(axis=1))             # NaN propagates
                P = np.exp(S - _safe(m_new)[:, None])            # masked: 0; NaN: NaN
                alpha = np.where(np.isneginf(m), F32(0), np.exp(m - _safe(m_new)))
                l = (alpha * l + P.sum(axis=1, dtype=F32)).astype(F32)
                P_d = dropped(P, tile_keep(mem, r0, r1, c0, c1), problem.dropout_p)
                acc = alpha[:, None] * acc + P_d @ Vj      # l: before dropout (Alg. 2)
            m = m_new.astype(F32)
        # l > 0 fails for l = NaN (a NaN or Inf input) as well as for l = 0: a row that
        # sees no key gets O = 0, L = -inf; one that sees a key gets NaN there
        pos = l > 0
        nan_or_0 = np.where(sees_key(problem, tiling, active, r0, r1), F32(np.nan), F32(0))
        with np.errstate(invalid="ignore", over="ignore"):
            O = np.where(pos[:, None], acc / np.where(pos, l, F32(1))[:, None], nan_or_0[:, None])
            L = np.where(pos, m + np.log(np.where(pos, l, F32(1))),
                         np.where(np.isnan(nan_or_0), F32(np.nan), NEG_INF)).astype(F32)
        mem.mark("fa2_fwd", i, (i, -1))
        mem.write("O", O.astype(dt), slice(r0, r1))
        mem.write("L", L, slice(r0, r1))
    return {"L": mem.arrays["L"].copy()}


FORWARD = {"standard": standard_forward, "fa1": fa1_forward, "fa2": fa2_forward}


# ---------------------------------------------------------------------------------------
# Whole problems
# ---------------------------------------------------------------------------------------
def random_inputs(problem: Problem, seed: int = 0, scale: float = 1.0):
    """Standard-normal Q (batch, heads, N_q, d), K, V (batch, kv_heads, N_k, d) in the
    problem dtype."""
    rng = np.random.default_rng(seed)
    dt = problem.np_dtype
    q = (scale * rng.standard_normal((problem.batch, problem.heads, problem.N, problem.d))).astype(dt)
    k = (scale * rng.standard_normal((problem.batch, problem.kv_heads, problem.N_k, problem.d))).astype(dt)
    v = rng.standard_normal((problem.batch, problem.kv_heads, problem.N_k, problem.d)).astype(dt)
    return q, k, v


def check_scale(scale) -> float:
    """The softmax scale as a float; ConfigError unless it is finite in float32, the
    schedules' (and the kernels') compute dtype (1e40 would become Inf there)."""
    scale = float(scale)
    if not np.isfinite(scale) or abs(scale) > float(np.finfo(F32).max):
        raise ConfigError(f"scale={scale!r} is not allowed; allowed: numbers finite in "
                          f"float32 (|scale| <= {float(np.finfo(F32).max):.8g})")
    return scale


def _check_inputs(problem: Problem, q, k, v):
    B, H, G, N, d = problem.batch, problem.heads, problem.kv_heads, problem.N, problem.d
    for name, x, h, n in (("q", q, H, N), ("k", k, G, problem.N_k), ("v", v, G, problem.N_k)):
        if np.shape(x) != (B, h, n, d):
            raise ConfigError(f"{name} has shape {np.shape(x)}; the problem needs {(B, h, n, d)}")


class Execution:
    """Result of `execute`: output O (batch, heads, N, d), the ledger, and statistics."""

    def __init__(self, O, ledger: Ledger, stats: dict, trace: list | None = None):
        self.O, self.ledger, self.stats, self.trace = O, ledger, stats, trace

    def __iter__(self):  # allow `O, ledger = execute(...)`
        return iter((self.O, self.ledger))


def set_instance_keep(mem: CountingMemory, problem: Problem, b: int, h: int,
                      dropout_seed: int, dropout_offset: int) -> None:
    """mem.keep = the keep mask (N_q, N_k) of instance (b, h) (iosim.dropout.keep_mask),
    or None without dropout."""
    from .dropout import keep_mask
    mem.keep = None if not problem.dropout_p else keep_mask(
        dropout_seed, dropout_offset, b, h, range(problem.N), range(problem.N_k),
        problem.dropout_p, heads=problem.heads)


def execute(algorithm: str, problem: Problem, tiling: Tiling, q=None, k=None, v=None, *,
            scale: float | None = None, seed: int = 0, instances: str = "all",
            dropout_seed: int = 0, dropout_offset: int = 0, record: bool = False) -> Execution:
    """Run a forward schedule on (q, k, v) (random if omitted) and count every access.

    instances="all" executes every (batch, head); "one" executes instance (0, 0) only and
    scales its counts by batch*heads (valid because every instance does identical work),
    returning O for that instance only, shaped (1, 1, N, d).
    Ledger counts are problem totals in elements (see iosim.ledger).
    dropout_seed, dropout_offset: the Philox seed and offset of the keep mask when
    problem.dropout_p > 0 (iosim.dropout; ignored otherwise).
    record: also return the access trace (`Execution.trace`, `CountingMemory.trace`), with
    an ("instance", b, h, g) entry before each instance's accesses (g: its K/V head).
    """
    if algorithm not in FORWARD:
        raise ConfigError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    if instances not in ("all", "one"):
        raise ConfigError(f"instances={instances!r}; allowed: 'all', 'one'")
    if q is None:
        q, k, v = random_inputs(problem, seed)
    _check_inputs(problem, q, k, v)
    dt = problem.np_dtype
    q, k, v = (np.asarray(x, dtype=dt) for x in (q, k, v))
    active_tiles(problem, tiling)  # validate the mask shape before any work
    scale = check_scale(1.0 / np.sqrt(problem.d) if scale is None else scale)
    pairs = [(0, 0)] if instances == "one" else [(b, h) for b in range(problem.batch)
                                                 for h in range(problem.heads)]
    O = np.empty((len({b for b, _ in pairs}), len({h for _, h in pairs}), problem.N, problem.d), dtype=dt)
    stats: dict = {}
    mem = CountingMemory()
    if record:
        mem.record()
    for b, h in pairs:
        g = h // problem.group
        if record:
            mem.trace.append(("instance", b, h, g))
        mem.alloc("Q", q[b, h]); mem.alloc("K", k[b, g]); mem.alloc("V", v[b, g])
        set_instance_keep(mem, problem, b, h, dropout_seed, dropout_offset)
        st = FORWARD[algorithm](mem, problem, tiling, scale)
        O[b, h] = mem.arrays["O"]
        for name, arr in st.items():
            stats.setdefault(name, np.empty(O.shape[:2] + arr.shape, dtype=arr.dtype))[b, h] = arr
    multiplier = problem.instances if instances == "one" else 1
    return Execution(O, mem.ledger(algorithm, problem, tiling, multiplier), stats, mem.trace)
