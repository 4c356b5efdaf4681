"""Below the ledger: what of a kernel's requested traffic reaches L2 and DRAM.

The ledger (`iosim.closed_form`) counts what a kernel *requests* from global memory. On
a real GPU those requests go to the L2 cache, and only the L2's misses reach DRAM (HBM);
dirty lines reach DRAM when the L2 evicts them. This module predicts, for one kernel
launch, the bytes that reach DRAM, from

* the kernel's access stream at tile granularity: which thread block (CTA) reads or
  writes which tile, in what order. CTAs start in launch order (blockIdx.x fastest, as
  the hardware dispatches them) as earlier ones finish, `slots` = SMs x CTAs per SM at a
  time (list scheduling; a CTA's duration is proportional to its tiles), and a CTA
  touches its tiles one per time step;
* an L2 model: a least-recently-used cache of effective capacity C = capacity_fraction x
  the preset's L2 bytes, whose lines are spread by an address hash over sets of
  `associativity` ways. An access finds its tile resident iff fewer than
  `associativity` other distinct lines of its set were touched since the tile's last
  access. With D distinct bytes touched since then (the LRU stack distance), the number
  of those lines in one set is close to Poisson with mean associativity x D / C, so

      P(hit | D) = P[Poisson(A D / C) <= A - 1]        (A = associativity)

  A -> infinity is a plain LRU cache of capacity C (hit iff D < C); small A softens the
  edge, as the hashed, set-associative L2 does.

DRAM reads = sum over read accesses of bytes x P(miss | D_prev); the first access of a
tile always misses (ncu flushes the L2 before each kernel: a cold L2). A write makes the
tile dirty; DRAM writes = sum over writes of bytes x P(the tile is evicted before its
next access | D_next), where D_next counts the distinct bytes until the next access, or
until the kernel ends. Dirty lines still resident when the kernel ends are not written
during it (measured: fa2 at N=4096 wrote 2 of its 8 MB of O to DRAM inside the kernel).

Footprints (L2Model.replicate): the H100's L2 is two partitions; a line read by SMs of
both is cached in both, so a tile many CTAs share counts shared_footprint (at most twice)
its bytes against C, a tile one CTA touches private_footprint times; with home_written,
written bytes (stores, atomics) count once, in their home partition. (Fitted: x1.75 in v4,
x1.4 in v5 / v6, x1.2 in v7: the far copies of clean shared lines are dropped sooner than
their home copies, so a shared K/V stream fills the cache at little more than its bytes.)

End of kernel (L2Model.drain_fraction): the dirty lines still resident when the kernel
ends are written back as it retires, and Nsight Compute's DRAM counters see the first
drain_fraction x L2 bytes of that write-back (measured: 2-3 MB of DRAM writes above the
evictions on the H100 in nearly every kernel launch that ends with dirty data, e.g. fa2 at
N = 4096, which fits in L2, wrote 2.3 of its 8.4 MB of O).

Partial accesses (L2Model.partial_refetch, v6): a coarse tile (a group of consecutive
tiles, below) that one access touches in part (a causal prefix ending inside the group, a
backward suffix starting inside it) and a later one in full: the later access finds each
byte where it was last touched (the latest earlier access that reached it), and bytes no
access touched before miss (their first touch). Without it (v5) the full access hit on the
partial one and the rest of the group was never read: reads below the compulsory Q + K + V
in the causal fa2 forward (-20 % at N = 49152), the causal backward -18 %.

Local memory (L2Model.local_memory, v6): a build whose resident CTAs' local-memory frames
overflow the L1 re-reads its frame from L2 at every step and rewrites it
(`sweep_kernel`'s local_frame_bytes; per-kernel frames in `analysis.levels.LOCAL`). The
frame of each SM slot is one tile; its distance is the other slots' frames and the shared
tiles in between, so frames larger than the dirty cap are cleaned to DRAM every step.

The wave's lagging part (L2Model.sweep_lag, v8): CTAs that start together do not stay
in step; in the non-causal fa2 forward with two or more CTAs per SM, each cohort's sweep
is read a second time sweep_lag x its length later. Where a wave sweeps the K/V of two
heads (the end of one, the start of the next: every wave of a multi-head grid whose head
needs more than one wave) the bytes between the two reads are about 2 x lag x two heads'
K/V, and past C the lagging part fetches each tile again: about two DRAM fetches per tile
and wave far past capacity, as measured (1.75-2.2 per wave at 3-5 waves a head, where v7
made one); a single head's wave (h = 1) sees half that distance.

The causal sweeps' lag (L2Model.causal_lag, v9): the causal fa2 forward with two or more
CTAs per SM gets the same second read, at causal_lag (0.03) x each CTA's sweep length: its
CTAs are dispatched heaviest first and each sweeps a prefix of its own length, so none
shares a cohort, and a lag of sweep_lag's size (0.35) there adds +20 % to +57 %, while the
long causal sweeps (N = 81-131K) were under-predicted by 10-20 % without one.

Private round trips (L2Model.private_rmw_capacity, v10): fa1's O_i, l_i, m_i, read and
written by one CTA every outer step, meet the capacity edge at 0.93 C, its Q_i (read only,
a tile of its own) at C: measured, fa1's intermediate writes reach DRAM about twice as
often as its re-reads miss where its working set nears the L2's capacity.

Background writes (L2Model.background_write_rate, v6): the counters see DRAM writes that
grow with the kernel's duration (21-25 MB/s on the H100 and the H200, whatever the
kernel); `analysis.levels` adds rate x the time model's predicted duration.

The constants are fitted on measured configurations and printed with every result
(`L2Model`); validation is against Nsight Compute on held-out configurations (see
`analysis.levels`). Distances are exact for the stream (a Fenwick tree over the access
sequence); to stay fast, CTAs that start together on the same data are merged (they touch
each tile at the same step), and long sweeps are coarsened to groups of consecutive tiles
(`max_accesses`), which quantises distances to a group's bytes.

Speed (the same numbers): the hit probabilities and sums of every capacity asked for
(`dram_at_capacities`: the point and the chip range) are taken in one compiled pass over
the accesses (`_dram_fused`, `_dram_sums`), each summand with the numpy reference's float
operations (`_dram_at`, kept for every model setting and used where the compiled path's
preconditions, `_fused_applies`, do not hold) and summed in numpy's pairwise order, so the
two agree to the bit (tests/test_hierarchy_fused.py).

Units: bytes, whole problem (all batch x heads), one kernel launch (cold L2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; keep the model importable
    def njit(*a, **k):
        return (lambda f: f) if not a or not callable(a[0]) else a[0]


@dataclass(frozen=True)
class L2Model:
    """The L2 model's constants (see the module docstring).

    capacity_fraction: effective capacity C as a fraction of the preset's L2 bytes (the
        H100's L2 is two partitions; data shared by all SMs is cached near each, which
        halves the capacity a shared stream sees).
    associativity: ways of the hashed set-associative cache the stack distance is
        compared with (softness of the capacity edge).
    max_accesses: budget of simulated accesses per kernel (coarsening beyond it).
    policy: "lru" (the hashed set-associative LRU above) or "random" (random replacement,
        `_random_replacement`).
    replicate: count each tile's footprint as the two-partition L2 holds it: a line is
        cached in its home partition and, when an SM of the other partition reads it, in
        that SM's partition too, so a tile shared by CTAs on both partitions occupies twice
        its bytes. private_footprint: the same factor for a tile only one CTA touches
        (1.5 if half its lines gained a near copy; the fit preferred 1.0). Distances are
        then these footprints.
    keep_fraction: rho of the insertion policy's protection of a cyclic working set
        larger than C (BIP / DIP-like adaptive insertion, or random replacement): an
        access at stack distance D > C still hits with probability rho x C / D (a loop of
        footprint F > C keeps about C of its F bytes), where the LRU would miss:
        P(hit | D) = max(P_lru(D), rho x min(1, C / D)). 0: plain (set-associative) LRU.
    shared_footprint: with replicate, the bytes a shared tile (read by CTAs on both
        partitions) occupies per byte: 2 if every far copy were kept as long as its home
        copy; less where the L2 drops clean duplicates first (the far copy of a line whose
        home partition still holds it), so that a shared stream fills the cache more
        slowly than twice its bytes. v4 fits 1.75.
    drain_fraction: the part of the dirty data resident at the kernel's end that reaches
        DRAM inside the measured kernel, at most drain_fraction x the L2's bytes (the
        write-back as the kernel retires; 2-3 MB measured on the H100). 0: none (the
        dirty lines at the end are never counted).
    once_footprint / once_write_footprint: what-ifs (tried for v5 and dropped; < 0: off):
        a tile accessed only once in the launch and only read (Q) / only written (O, S)
        counts this fraction of its bytes in other tiles' distances (streaming data
        inserted for early eviction).
    refetch_factor / refetch_capacity: what-if (tried for v5 and dropped; 1: off): a
        re-read of a shared tile costs, beyond its miss probability, (refetch_factor - 1)
        x P(miss | D against refetch_capacity x C) more DRAM fetches (each L2 partition
        fetching a shared line for its own SMs once the stream thrashes far beyond C).
    private_associativity: what-if (tried for v5 and dropped; 0: off): the ways of the
        capacity edge for tiles one CTA touches (fa1's O, l, m round trips), where
        `associativity` then sets it for shared tiles only (a replacement policy that
        protects lines with many hits would keep the K/V of a wave up to a hard edge).
    home_written: with replicate, the written part of a shared tile (wb bytes of a tile
        accessed with wr: stores, atomics / reductions such as the fa2 backward's dQ
        accumulator) counts once: writes are resolved at the line's home partition, its
        point of coherence, so only clean read data gains a copy in the far partition.
        Its footprint is then shared_footprint x nbytes - (shared_footprint - 1) x wb.
    dirty_fraction: the L2 keeps at most C_w = dirty_fraction x the L2's bytes of dirty
        data; beyond that the oldest dirty lines are cleaned (written to DRAM, kept valid,
        so reads still hit). A write then reaches DRAM if the tile is evicted before its
        next access (stack distance vs C) or cleaned before its next write: the distinct
        bytes *written* between the two (the dirty stack distance) exceed C_w, with the
        same set-associative softness. 0: no cap (dirty lines leave only by eviction).
    local_memory: count the local-memory traffic of builds whose frames overflow the L1
        (`sweep_kernel`'s local_frame_bytes; `analysis.levels.LOCAL`): the frame of each
        SM slot re-read and rewritten in L2 at every step. False: local memory is not
        modelled beyond a frame written once per CTA (v5).
    dirty_associativity: what-if (tried for v6 and dropped; 0: off): the ways of the
        dirty cap's edge (the dirty stack distance against C_w); 0: `associativity`.
    partial_refetch: a coarse tile (a group of consecutive tiles, `sweep_kernel`) that one
        access touches in part (a causal prefix ending inside the group, a backward
        suffix starting inside it) and the next in full: the part the first did not touch
        is charged from the access before it (`_partial_refetch`), not counted as a hit.
        False (v5): the coarse tile's later full access hits on the partial one, and the
        rest of the group's bytes are lost (the causal fa2 forward's sweeps
        under-predicted by up to 20 %).
    sweep_lag: the lagging part of a wave (v8; 0: off): in the sweeps of the fa2 forward
        where two or more CTAs share an SM and all sweeps have the same length (not
        causal), each cohort of CTAs that start together is taken as a leading and a
        lagging part, the lagging one reading each K/V tile again sweep_lag x the sweep's
        length later (`sweep_kernel`'s lag). The re-read hits while the bytes touched in
        between (2 x lag x the K/V of every head the wave sweeps: one head, or the end of
        one and the start of the next) fit in C, and misses (a second DRAM fetch of the
        tile in that wave) beyond; its access also leaves each tile more recent, so the next
        wave's reuse distance is shorter (the first passes past capacity fetch less).
    causal_lag: the lagging part of the causal sweeps (v9; 0: off): as sweep_lag, in the
        causal fa2 forward where two or more CTAs share an SM (the heaviest query blocks
        first, every sweep of its own length, so that each CTA is its own cohort): each
        K/V tile read again causal_lag x the CTA's sweep length later. Small (v9: 0.03,
        against sweep_lag 0.35 for the non-causal cohorts): past capacity the second read
        costs a K/V fetch more of the long sweeps (N = 81-131K: -10 % to -20 % in v8), below
        it it only leaves the tiles more recent.
    private_rmw_capacity: the capacity edge of private read-modify-write round trips (a
        tile one CTA reads and writes in the same access: fa1's O_i, l_i, m_i, the
        local-memory frames) at this fraction of C (v10: 0.93; 1: off). With it
        `analysis.levels` gives fa1's Q_i a tile of its own (read only), so that the
        written half of each round trip leaves the cache first: fa1's intermediate writes
        reach DRAM at about twice the rate its re-reads miss near its working set.
    private_read_capacity: what-if (tried for v10 and dropped; 1: off): the same for
        private read-only re-reads (fa1's Q_i).
    background_write_rate: DRAM writes (bytes per second of kernel time) that the
        counters see beside the kernel's own write-backs (`analysis.levels` adds
        rate x the time model's predicted duration of each launch). Measured: the
        residual writes of second-long kernels grow with their duration at 21-25 MB/s on
        both chips (plain fa2 forward at N = 16384: 34 MB in 1.47 s, the plain backward
        56-64 MB in 2.64 s, fa1 fp32 at N = 8192: 121 MB in 4.76 s), whatever the kernel.
        0: none (v5).
    """
    capacity_fraction: float = 0.5
    associativity: int = 16
    max_accesses: int = 400_000
    policy: str = "lru"
    replicate: bool = False
    private_footprint: float = 1.5
    keep_fraction: float = 0.0
    dirty_fraction: float = 0.0
    home_written: bool = False
    shared_footprint: float = 2.0
    drain_fraction: float = 0.0
    once_footprint: float = -1.0
    once_write_footprint: float = -1.0
    refetch_factor: float = 1.0
    refetch_capacity: float = 1.0
    private_associativity: int = 0
    local_memory: bool = False
    dirty_associativity: int = 0
    partial_refetch: bool = False
    background_write_rate: float = 0.0
    sweep_lag: float = 0.0
    causal_lag: float = 0.0
    private_rmw_capacity: float = 1.0
    private_read_capacity: float = 1.0

    def __post_init__(self):
        if not 0 < self.capacity_fraction <= 2:
            raise ValueError(f"capacity_fraction={self.capacity_fraction!r} must be in (0, 2]")
        if int(self.associativity) != self.associativity or self.associativity < 1:
            raise ValueError(f"associativity={self.associativity!r} must be a positive integer")
        if self.policy not in ("lru", "random"):
            raise ValueError(f"policy={self.policy!r} is not known; allowed: lru, random")
        if not 0 <= self.keep_fraction <= 1 or not 0 <= self.dirty_fraction <= 2:
            raise ValueError(f"keep_fraction={self.keep_fraction!r} must be in [0, 1] and "
                             f"dirty_fraction={self.dirty_fraction!r} in [0, 2]")
        if not 0 <= self.drain_fraction <= 1 or not 1 <= self.shared_footprint <= 2:
            raise ValueError(f"drain_fraction={self.drain_fraction!r} must be in [0, 1] and "
                             f"shared_footprint={self.shared_footprint!r} in [1, 2]")
        if self.refetch_factor < 1 or self.refetch_capacity <= 0:
            raise ValueError(f"refetch_factor={self.refetch_factor!r} must be >= 1 and "
                             f"refetch_capacity={self.refetch_capacity!r} > 0")
        if self.background_write_rate < 0:
            raise ValueError(f"background_write_rate={self.background_write_rate!r} must be >= 0")
        if not 0 <= self.sweep_lag <= 1:
            raise ValueError(f"sweep_lag={self.sweep_lag!r} must be in [0, 1]")
        if not 0 <= self.causal_lag <= 1:
            raise ValueError(f"causal_lag={self.causal_lag!r} must be in [0, 1]")
        if not (0 < self.private_rmw_capacity <= 2 and 0 < self.private_read_capacity <= 2):
            raise ValueError(f"private_rmw_capacity={self.private_rmw_capacity!r} and "
                             f"private_read_capacity={self.private_read_capacity!r} must be "
                             f"in (0, 2]")
        if self.max_accesses < 1000:
            raise ValueError(f"max_accesses={self.max_accesses!r} must be >= 1000")


@dataclass
class Stream:
    """Accesses of one kernel launch (arrays of equal length, unsorted).

    t: start time step; blk: tile id (equal ids = the same bytes); nbytes: bytes of the
    tile; rd / wr: the access reads / writes it; w: how many real accesses this one
    stands for (sampling; 1 otherwise); wb: bytes written back if the tile is evicted
    dirty (the written part of a tile read and written together; default nbytes)."""
    t: list = field(default_factory=list)
    blk: list = field(default_factory=list)
    nbytes: list = field(default_factory=list)
    rd: list = field(default_factory=list)
    wr: list = field(default_factory=list)
    w: list = field(default_factory=list)
    wb: list = field(default_factory=list)
    shared: list = field(default_factory=list)
    selfd: list = field(default_factory=list)
    next_id: int = 0
    #: the concatenated arrays of `arrays` / `selfd_array`, kept until the next `add`
    #: (each kernel launch's stream is read by several callers: the model, the access
    #: count; concatenating its pieces again each time cost ~1 ms a call)
    _cat: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _selfd_cat: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def ids(self, n: int) -> np.ndarray:
        """n fresh tile ids (for private tiles, touched once)."""
        out = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        return out

    def add(self, t, blk, nbytes, rd, wr, w=1.0, wb=None, shared=False, selfd=0.0):
        """Accesses; shared: the tiles are touched by many CTAs (on both L2 partitions);
        selfd: bytes added to the access's distances (a merged tile standing for several
        lines that are touched in turn, each after the others: its other lines' bytes)."""
        n = np.broadcast(t, blk, nbytes).size
        self._cat = self._selfd_cat = None          # the concatenations are stale
        # broadcast views (no copy): `arrays` concatenates them into fresh arrays anyway
        self.selfd.append(np.broadcast_to(np.asarray(selfd, dtype=np.float64), (n,)))
        wb = nbytes if wb is None else wb
        for lst, v, dt in ((self.t, t, np.float64), (self.blk, blk, np.int64),
                           (self.nbytes, nbytes, np.float64), (self.rd, rd, bool),
                           (self.wr, wr, bool), (self.w, w, np.float64),
                           (self.wb, wb, np.float64), (self.shared, shared, bool)):
            lst.append(np.broadcast_to(np.asarray(v, dtype=dt), (n,)))

    @property
    def size(self) -> int:
        """The number of accesses (the simulated accesses of `dram_from_stream`), without
        concatenating the pieces."""
        return int(sum(x.shape[0] for x in self.t))

    def has_selfd(self) -> bool:
        """Whether any access has a nonzero selfd (np.any of `selfd_array`, NaN counting
        as nonzero), without concatenating: a piece broadcast from one value (stride 0)
        is checked at its first element."""
        return any(bool(np.any(x[:1] if x.strides[0] == 0 else x)) for x in self.selfd
                   if x.size)

    def selfd_array(self):
        """Each access's selfd (bytes added to its distances), in insertion order. Read
        only: the array is kept for the next call until `add` (the stream is an input)."""
        if self._selfd_cat is None:
            out = np.concatenate(self.selfd) if self.selfd else np.zeros(0)
            out.setflags(write=False)
            self._selfd_cat = out
        return self._selfd_cat

    def arrays(self):
        """(t, blk, nbytes, rd, wr, w, wb, shared), each one array over the accesses in
        insertion order. Read only: they are kept for the next call until `add` (callers
        that need other values make their own, e.g. in time order)."""
        if self._cat is None:
            cat = lambda L, dt: np.concatenate(L) if L else np.zeros(0, dt)
            out = (cat(self.t, np.float64), cat(self.blk, np.int64),
                   cat(self.nbytes, np.float64), cat(self.rd, bool), cat(self.wr, bool),
                   cat(self.w, np.float64), cat(self.wb, np.float64), cat(self.shared, bool))
            for x in out:
                x.setflags(write=False)
            self._cat = out
        return self._cat


# ---------------------------------------------------------------------------------------
# The engine: schedule, stack distances, the cache model
# ---------------------------------------------------------------------------------------
@njit(cache=True)
def _heap_less(t1, s1, t2, s2):
    """The order of the event heaps below: (time, index), as heapq orders tuples."""
    return t1 < t2 or (t1 == t2 and s1 < s2)


@njit(cache=True)
def _heap_sift_down(ht, hs, size, i, t, s):
    """Put (t, s) at position i of the binary min-heap (ht, hs)[:size] and sift it down
    (replacing the root: i = 0; a pop moves the last entry there)."""
    while True:
        l = 2 * i + 1
        if l >= size:
            break
        m = l
        if l + 1 < size and _heap_less(ht[l + 1], hs[l + 1], ht[l], hs[l]):
            m = l + 1
        if _heap_less(ht[m], hs[m], t, s):
            ht[i] = ht[m]
            hs[i] = hs[m]
            i = m
        else:
            break
    ht[i] = t
    hs[i] = s


@njit(cache=True)
def _heap_push(ht, hs, size, t, s):
    """Add (t, s) to the binary min-heap (ht, hs)[:size] (sift up); returns the new size."""
    i = size
    while i > 0:
        par = (i - 1) // 2
        if _heap_less(t, s, ht[par], hs[par]):
            ht[i] = ht[par]
            hs[i] = hs[par]
            i = par
        else:
            break
    ht[i] = t
    hs[i] = s
    return size + 1


@njit(cache=True)
def _schedule_slots(dur, slots):
    """(start time, slot) of each CTA (launch order) on `slots` identical slots: each
    starts when the earliest-free slot frees (list scheduling; ties: the lowest slot).
    The slots are a binary min-heap ordered by (free time, slot index), which picks the
    slot a linear scan for the first minimum would (O(n log k) instead of O(n k))."""
    n = dur.shape[0]
    start = np.empty(n)
    slot = np.zeros(n, np.int64)
    if n == 0:
        return start, slot
    k = min(slots, n)
    hf = np.zeros(k)                        # heap: free time ...
    hs = np.arange(k)                       # ... and slot; all 0: a valid heap in slot order
    for c in range(n):
        s = hs[0]
        start[c] = hf[0]
        slot[c] = s
        _heap_sift_down(hf, hs, k, 0, hf[0] + dur[c], s)   # the root's new free time
    return start, slot


def _schedule(dur, slots):
    """Start time of each CTA (launch order) on `slots` identical slots (list scheduling)."""
    return _schedule_slots(np.asarray(dur, dtype=np.float64), int(slots))[0]


@njit(cache=True)
def _distances(blk, nbytes):
    """(d_prev, d_next): distinct bytes touched strictly between an access and the previous
    (next) access of the same tile; -1 where there is none (d_next then counts to the
    end). Fenwick tree over positions holding each tile's bytes at its latest access."""
    n = blk.shape[0]
    tree = np.zeros(n + 1)
    d_prev = np.full(n, -1.0)
    d_next = np.full(n, -1.0)
    nblk = 0
    for k in range(n):
        if blk[k] + 1 > nblk:
            nblk = blk[k] + 1
    last = np.full(nblk, -1, np.int64)
    total = 0.0
    for k in range(n):
        b = blk[k]
        p = last[b]
        if p >= 0:
            # sum over (p, k): prefix(k - 1) - prefix(p)
            s = 0.0
            i = k
            while i > 0:
                s += tree[i]
                i -= i & (-i)
            i = p + 1
            while i > 0:
                s -= tree[i]
                i -= i & (-i)
            if s < 0.0:         # rounding in the tree's sums: -1 must mean "no access"
                s = 0.0
            d_prev[k] = s
            d_next[p] = s
            i = p + 1
            v = nbytes[p]
            while i <= n:
                tree[i] -= v
                i += i & (-i)
            total -= v
        i = k + 1
        v = nbytes[k]
        while i <= n:
            tree[i] += v
            i += i & (-i)
        total += v
        last[b] = k
    # last accesses: distinct bytes after them = total - prefix(k)
    for b in range(nblk):
        k = last[b]
        if k >= 0:
            s = 0.0
            i = k + 1
            while i > 0:
                s += tree[i]
                i -= i & (-i)
            d_next[k] = max(total - s, 0.0)
    return d_prev, d_next


_CDF_TABLES = {}


def _poisson_cdf_table(A: int):
    """P[Poisson(lam) <= A - 1] tabulated on lam in [0, A + 12 sqrt(A) + 40] (beyond: < 1e-12),
    8,193 points: np.interp of it is within 1e-6 of scipy's gammaincc and ~10x faster."""
    if A not in _CDF_TABLES:
        from scipy.special import gammaincc
        x = np.linspace(0.0, A + 12.0 * np.sqrt(A) + 40.0, 8193)
        _CDF_TABLES[A] = (x, gammaincc(A, x))
    return _CDF_TABLES[A]


_SLOPES = {}


def _poisson_slopes(A: int):
    """The slopes of `_poisson_cdf_table(A)`'s intervals, (fp[j + 1] - fp[j]) / (xp[j + 1]
    - xp[j]) as np.interp computes them (IEEE operations: the same numbers), for
    `_interp_finite`; None where a slope is not finite (never for these tables: xp is
    strictly increasing, fp finite), which `_fused_applies` then declines and
    `hit_probability` meets with np.interp."""
    if A not in _SLOPES:
        x, y = _poisson_cdf_table(A)
        slope = (y[1:] - y[:-1]) / (x[1:] - x[:-1])
        ok = bool(np.all(np.isfinite(y)) and np.all(np.diff(x) > 0)
                  and np.all(np.isfinite(slope)))
        _SLOPES[A] = slope if ok else None
    return _SLOPES[A]


@njit(cache=True, inline="always")      # per access and capacity: no call
def _interp_finite(x, xp, fp, slope, inv):
    """np.interp(x, xp, fp, right=0) at one point x for an evenly spaced, increasing xp
    whose slopes are all finite (the Poisson tables, `_poisson_slopes`), bit for bit: the
    same interval j (xp[j] <= x < xp[j + 1], found from the spacing and corrected against
    xp itself instead of numpy's binary search) and numpy's arithmetic,
    slope[j] x (x - xp[j]) + fp[j], with the slope precomputed (numpy's own quotient), and
    its end cases (x == xp[j]: fp[j]; x == xp[-1]: fp[-1]; x > xp[-1]: 0; x < xp[0]:
    fp[0]). numpy's NaN repair never applies there (a finite slope times a finite offset
    plus a finite fp[j] is finite) and is left out (it made the loop ~3x slower).
    inv: (len(xp) - 1) / (xp[-1] - xp[0])."""
    n = xp.shape[0]
    x0 = xp[0]
    if np.isnan(x):
        return x
    if x > xp[n - 1]:
        return 0.0
    if x < x0:
        return fp[0]
    if x == xp[n - 1]:
        return fp[n - 1]
    j = int((x - x0) * inv)
    if j > n - 2:
        j = n - 2
    while j > 0 and xp[j] > x:
        j -= 1
    while j < n - 2 and xp[j + 1] <= x:
        j += 1
    if xp[j] == x:
        return fp[j]
    return slope[j] * (x - xp[j]) + fp[j]


@njit(cache=True)
def _interp_uniform(xv, xp, fp, slope):
    """np.interp(xv, xp, fp, right=0) of a vector xv on a Poisson table (xp, fp, its
    slopes), bit for bit: `_interp_finite` element by element."""
    n = xp.shape[0]
    out = np.empty(xv.shape[0])
    inv = (n - 1) / (xp[n - 1] - xp[0])
    for i in range(xv.shape[0]):
        out[i] = _interp_finite(xv[i], xp, fp, slope, inv)
    return out


@njit(cache=True)
def _hit_lru(D, a, capacity, xp, fp, slope):
    """hit_probability without keep_fraction, element by element with numpy's arithmetic:
    where(D < 0, 0, interp(a x max(D, 0) / capacity)) (`_interp_uniform`; slope: the
    table's, `_poisson_slopes`)."""
    lam = np.empty(D.shape[0])
    for i in range(D.shape[0]):
        d = D[i]
        lam[i] = a * (0.0 if d < 0.0 else d) / capacity
    p = _interp_uniform(lam, xp, fp, slope)
    for i in range(D.shape[0]):
        if D[i] < 0.0:
            p[i] = 0.0
    return p


@njit(cache=True, inline="always")      # per access and capacity: no call
def _hit_one(D, a, capacity, xp, fp, slope, inv):
    """`_hit_lru` at one stack distance D (bytes; < 0: no earlier access, never a hit),
    the same arithmetic: interp(a x D / capacity) on the Poisson table (xp, fp, its slopes;
    inv its points per unit of lam; `_interp_finite`)."""
    if D < 0.0:
        return 0.0
    return _interp_finite(a * D / capacity, xp, fp, slope, inv)


def hit_probability(D, capacity: float, associativity: int, keep_fraction: float = 0.0):
    """P(hit | stack distance D bytes) for the hashed set-associative LRU model; D < 0
    (no earlier access) gives 0. keep_fraction rho > 0: at least rho x min(1, C / D), the
    share of a cyclic working set of D bytes an insertion policy that protects part of it
    keeps (L2Model.keep_fraction)."""
    D = np.asarray(D, dtype=np.float64)
    x, y = _poisson_cdf_table(int(associativity))
    sl = _poisson_slopes(int(associativity))
    if sl is not None and keep_fraction <= 0 and D.ndim == 1:
        # the expressions below, fused in one compiled pass (`_hit_lru`)
        return _hit_lru(D, float(associativity), float(capacity), x, y, sl)
    lam = associativity * np.maximum(D, 0.0) / capacity
    # P[Poisson(lam) <= A - 1]; numpy's np.interp, which the look-up reproduces, where a
    # slope is not finite (never for these tables: `_poisson_slopes`)
    p = (np.interp(lam, x, y, right=0.0) if sl is None
         else _interp_uniform(lam.ravel(), x, y, sl).reshape(lam.shape))
    if keep_fraction > 0:
        p = np.maximum(p, keep_fraction * np.minimum(1.0, capacity / np.maximum(D, 1e-300)))
    return np.where(D < 0, 0.0, p)


@dataclass(frozen=True)
class KernelTraffic:
    """Predicted DRAM bytes of one kernel launch (whole problem, cold L2)."""
    name: str
    dram_read_bytes: float
    dram_write_bytes: float
    slots: int
    accesses: int

    def to_dict(self):
        return {"name": self.name, "dram_read_bytes": self.dram_read_bytes,
                "dram_write_bytes": self.dram_write_bytes, "slots": self.slots,
                "simulated_accesses": self.accesses}


@njit(cache=True)
def _half_step_order(t, limit):
    """The accesses' time order, argsort(t, kind="stable"), by a counting sort
    (`_counting_order` of the keys 2 t - min(2 t)) where every time is a multiple of a half
    step and the range of 2 t is at most `limit`; empty where not (the caller sorts)."""
    n = t.shape[0]
    lo = 2.0 * t[0]
    hi = lo
    for i in range(n):
        v = 2.0 * t[i]
        if np.floor(v) != v:
            return np.empty(0, np.int64)
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    if hi - lo > limit:
        return np.empty(0, np.int64)
    keys = np.empty(n, np.int64)
    for i in range(n):
        keys[i] = np.int64(2.0 * t[i] - lo)
    return _counting_order(keys, np.int64(hi - lo) + 1)


@njit(cache=True)
def _counting_order(keys, nkeys):
    """Stable argsort of integer keys in [0, nkeys) (a counting sort, O(n + nkeys))."""
    n = keys.shape[0]
    pos = np.zeros(nkeys + 1, np.int64)
    for i in range(n):
        pos[keys[i] + 1] += 1
    for k in range(nkeys):
        pos[k + 1] += pos[k]
    out = np.empty(n, np.int64)
    for i in range(n):
        k = keys[i]
        out[pos[k]] = i
        pos[k] += 1
    return out


@njit(cache=True)
def _dense_ranks_direct(ids, limit):
    """Ranks of non-negative ids among the distinct ones by direct addressing: the
    builders tag each kind of tile in bits 40 and up (`sweep_kernel`), and below the tag
    the ids of a kind span a range not much longer than the stream, so a presence table
    over each tag's [min, max] ranks them in O(n + ranges) without a sort. Returns an
    empty array where a tag's ranges add up past `limit` (the caller then sorts)."""
    n = ids.shape[0]
    ntag = 0
    for i in range(n):
        if ids[i] < 0:
            return np.empty(0, np.int64)
        tg = ids[i] >> 40
        if tg + 1 > ntag:
            ntag = tg + 1
    if ntag > 64:
        return np.empty(0, np.int64)
    lo = np.full(ntag, np.iinfo(np.int64).max)
    hi = np.full(ntag, -1, np.int64)
    mask = (np.int64(1) << 40) - 1
    for i in range(n):
        tg = ids[i] >> 40
        v = ids[i] & mask
        if v < lo[tg]:
            lo[tg] = v
        if v > hi[tg]:
            hi[tg] = v
    off = np.zeros(ntag + 1, np.int64)       # each tag's place in the table
    for tg in range(ntag):
        off[tg + 1] = off[tg] + (hi[tg] - lo[tg] + 1 if hi[tg] >= 0 else 0)
    if off[ntag] > limit:
        return np.empty(0, np.int64)
    table = np.zeros(off[ntag], np.int64)
    for i in range(n):
        tg = ids[i] >> 40
        table[off[tg] + (ids[i] & mask) - lo[tg]] = 1
    r = 0                                    # presence -> rank (tags in increasing order)
    for k in range(off[ntag]):
        if table[k]:
            table[k] = r
            r += 1
    out = np.empty(n, np.int64)
    for i in range(n):
        tg = ids[i] >> 40
        out[i] = table[off[tg] + (ids[i] & mask) - lo[tg]]
    return out


def _dense_ranks(ids):
    """np.unique(ids, return_inverse=True)[1] (int64): each id's rank among the distinct
    ids; by direct addressing (`_dense_ranks_direct`) where the ids allow it, else
    through a stable sort (timsort: the streams' ids come in long ascending runs)."""
    if ids.size:
        out = _dense_ranks_direct(ids, 4 * ids.size + 65536)
        if out.size == ids.size:
            return out
    perm = np.argsort(ids, kind="stable")
    s = ids[perm]
    rank = np.zeros(ids.size, np.int64)
    if ids.size > 1:
        np.cumsum(s[1:] != s[:-1], out=rank[1:])
    out = np.empty(ids.size, np.int64)
    out[perm] = rank
    return out


def dram_from_stream(stream: Stream, capacity: float, model: L2Model):
    """(DRAM read bytes, DRAM write bytes, accesses) of a stream."""
    (r, w), = dram_at_capacities(stream, (capacity,), model)
    return r, w, stream.size


def dram_at_capacities(stream: Stream, capacities, model: L2Model):
    """[(DRAM read bytes, DRAM write bytes)] of a stream at each capacity C in
    `capacities` (bytes), the stack distances computed once: `dram_from_stream` at one C;
    several give the same model at other effective L2 sizes (`analysis.levels`'
    chip-to-chip range)."""
    if stream.size == 0:
        return [(0.0, 0.0) for _ in capacities]
    acc = _time_ordered(stream, model)
    if _fused_applies(model, capacities):
        return _dram_fused(capacities, model, *acc)
    return _dram_reference(capacities, model, *acc)


def _dram_reference(capacities, model, *acc):
    """`dram_at_capacities` by `_dram_at`, capacity after capacity (numpy expressions;
    every model setting), from `_time_ordered`'s arrays: the reference `_dram_fused`
    reproduces where `_fused_applies`."""
    cache = {}
    return [_dram_at(capacity, model, *acc, cache) for capacity in capacities]


def _time_ordered(stream: Stream, model: L2Model):
    """What every capacity shares, from a non-empty stream: the accesses in time order
    (dense tile ids, nbytes, rd, wr, w, wb, shared, selfd, has_sd), their footprints
    (bytes each access counts in others' distances) and stack distances d_prev / d_next
    (bytes), as `_dram_at` and `_dram_fused` take them."""
    t, blk, nb, rd, wr, w, wb, sh = stream.arrays()
    # times are half-steps over a range not much longer than the stream: a counting sort
    # (stable: time, then insertion order, as argsort(t, kind="stable"))
    order = _half_step_order(t, 4 * t.size + 65536)
    if order.size != t.size:
        order = np.argsort(t, kind="stable")
    has_sd = stream.has_selfd()
    sd = stream.selfd_array() if has_sd else np.zeros(0)     # (read only where has_sd)
    # dense tile ids (the rank of each tile id among the distinct ones, as np.unique's
    # inverse) for the Fenwick pass, ranked before the time order: a rank does not depend
    # on the accesses' order (the sorted tile ids themselves are not needed); then the
    # ranks and arrays in time order and each access's footprint (bytes it counts in the
    # other accesses' distances), in one compiled pass (`_gather_footprints`)
    dense, nb, rd, wr, w, wb, sh, foot = _gather_footprints(
        order, _dense_ranks(blk), nb, rd, wr, w, wb, sh, bool(model.replicate),
        bool(model.home_written), float(model.shared_footprint),
        float(model.private_footprint))
    if has_sd:
        sd = sd[order]
    if model.once_footprint >= 0 or model.once_write_footprint >= 0:
        single = np.bincount(dense)[dense] == 1
        if model.once_footprint >= 0:
            foot = np.where(single & rd & ~wr, nb * model.once_footprint, foot)
        if model.once_write_footprint >= 0:
            foot = np.where(single & wr & ~rd, nb * model.once_write_footprint, foot)
    d_prev, d_next = _distances(dense, foot)
    if has_sd:
        d_prev = np.where(d_prev >= 0, d_prev + sd, d_prev)
        d_next = d_next + sd
    return dense, nb, rd, wr, w, wb, sh, sd, has_sd, foot, d_prev, d_next


@njit(cache=True)
def _gather_footprints(order, ranks, nb, rd, wr, w, wb, sh, replicate, home_written, sf, pf):
    """(dense, nbytes, rd, wr, w, wb, shared, foot): the accesses' dense tile ids (ranks)
    and arrays taken in `order` (x[order] each), and each access's footprint in bytes
    (`L2Model.replicate`): with replicate, nbytes x (shared ? sf : pf), and with
    home_written a shared written tile's sf x nbytes - (sf - 1) x min(wb, nbytes)
    (written bytes live in their home partition only); without, nbytes. The numpy
    expressions of `_time_ordered`'s earlier version, element by element, in one pass
    (np.minimum's NaN rule kept)."""
    n = order.shape[0]
    # one 32-byte record per access (nbytes, w, wb, rank x 8 + the rd / wr / shared bits,
    # exact as a float below 2^53): the time order is a scatter over the builders' pieces
    # (they add the accesses kind by kind), and a gather of one record per access reads one
    # cache line where seven arrays read seven
    rec = np.empty((n, 4))
    for k in range(n):
        rec[k, 0] = nb[k]
        rec[k, 1] = w[k]
        rec[k, 2] = wb[k]
        rec[k, 3] = float(ranks[k] * 8 + (1 if rd[k] else 0) + (2 if wr[k] else 0)
                          + (4 if sh[k] else 0))
    dense = np.empty(n, np.int64)
    nb_o = np.empty(n)
    rd_o = np.empty(n, np.bool_)
    wr_o = np.empty(n, np.bool_)
    w_o = np.empty(n)
    wb_o = np.empty(n)
    sh_o = np.empty(n, np.bool_)
    foot = np.empty(n)
    for i in range(n):
        k = order[i]
        b = rec[k, 0]
        wbk = rec[k, 2]
        code = np.int64(rec[k, 3])
        s = (code & 4) != 0
        wk = (code & 2) != 0
        dense[i] = code >> 3
        nb_o[i] = b
        rd_o[i] = (code & 1) != 0
        wr_o[i] = wk
        w_o[i] = rec[k, 1]
        wb_o[i] = wbk
        sh_o[i] = s
        f = b
        if replicate:
            f = b * (sf if s else pf)
            if home_written and s and wk:
                mn = wbk if (wbk <= b or np.isnan(wbk)) else b       # np.minimum(wb, nb)
                f = sf * b - (sf - 1.0) * mn
        foot[i] = f
    return dense, nb_o, rd_o, wr_o, w_o, wb_o, sh_o, foot


def _dirty_distances(dense, nb, wr, wb, sd, has_sd):
    """(iw, dw_next): the written accesses (positions in time order) and their dirty stack
    distance, the distinct bytes *written* until the tile's next write (or the end), in
    bytes (`L2Model.dirty_fraction`). Does not depend on the capacity."""
    iw = np.flatnonzero(wr)
    # (the tiles' own ids: _distances needs equal ids for equal tiles, not dense ones)
    _, dw_next = _distances(dense[iw], wb[iw])
    if has_sd:
        dw_next = dw_next + sd[iw] * wb[iw] / np.maximum(nb[iw], 1e-300)
    return iw, dw_next


def _last_accesses(dense, wr):
    """(ll, lw): for each tile ever written (in tile order), its last access and its last
    write (positions in time order), the accesses the end-of-kernel drain looks at
    (`L2Model.drain_fraction`). Does not depend on the capacity."""
    return _last_accesses_nb(dense, wr, int(dense.max()) + 1)


@njit(cache=True)
def _last_accesses_nb(dense, wr, nt):
    """`_last_accesses` in one pass (np.maximum.at of the positions per tile, compiled)."""
    last = np.full(nt, -1, np.int64)                      # last access, per tile
    lw = np.full(nt, -1, np.int64)                        # last write, per tile
    for i in range(dense.shape[0]):
        last[dense[i]] = i
        if wr[i]:
            lw[dense[i]] = i
    m = 0
    for b in range(nt):
        if lw[b] >= 0:
            m += 1
    ll_out = np.empty(m, np.int64)
    lw_out = np.empty(m, np.int64)
    m = 0
    for b in range(nt):
        if lw[b] >= 0:
            ll_out[m] = last[b]
            lw_out[m] = lw[b]
            m += 1
    return ll_out, lw_out


def _layers(dense, nb, foot, d_prev):
    """`_partial_layers` of the time-ordered accesses (access, bytes, distance in bytes):
    the parts of coarse tiles that an access touches beyond the tile's previous access
    (`L2Model.partial_refetch`). Does not depend on the capacity."""
    # the accesses by tile, then time (np.lexsort((arange(n), dense)), as a counting sort)
    order = _counting_order(dense, int(dense.max()) + 1)
    return _partial_layers(order, dense, nb.astype(np.float64, copy=False),
                           foot.astype(np.float64, copy=False),
                           d_prev.astype(np.float64, copy=False))


@njit(cache=True)
def _grows_a_tile(dense, nb):
    """Whether some access touches more of its tile than the tile's previous access
    (nbytes[prev] >= nbytes is false, NaN included): the only accesses `_partial_layers`
    gives layers for (its stack's top is the previous access, whose extent covers all of
    a later access that is no larger). False: there are no layers to compute."""
    nt = 0
    for i in range(dense.shape[0]):
        if dense[i] + 1 > nt:
            nt = dense[i] + 1
    last = np.empty(nt)
    seen = np.zeros(nt, np.bool_)
    for i in range(dense.shape[0]):
        b = dense[i]
        if seen[b] and not (last[b] >= nb[i]):
            return True
        last[b] = nb[i]
        seen[b] = True
    return False


def _fused_applies(model: L2Model, capacities) -> bool:
    """Whether `_dram_fused` gives `_dram_at`'s numbers (bit for bit) for this model and
    these capacities (bytes): the LRU policy without keep_fraction's floor or the refetch
    what-if, one associativity for shared and private tiles (private_associativity off
    or equal), Poisson tables with finite slopes (`_interp_finite`), numpy's sums as
    `_pairwise_sum` reproduces them, and every capacity the hit probabilities are taken
    at (C, C x private_rmw_capacity, C x private_read_capacity, the dirty cap C_w) finite
    and > 0: then a hit probability is NaN only where its distance is NaN, which the
    terms `_dram_sums` skips rely on. Elsewhere `_dram_at` is the reference (and the
    model): the fitted model (`analysis.levels.FITTED`) and its chip range take the
    fused path."""
    A = int(model.associativity)
    if (model.policy != "lru" or model.keep_fraction > 0 or model.refetch_factor != 1.0
            or (model.private_associativity and model.private_associativity != A)):
        return False
    Ad = int(model.dirty_associativity) or A
    if (_poisson_slopes(A) is None or _poisson_slopes(Ad) is None
            or _poisson_cdf_table(A)[0].size != _poisson_cdf_table(Ad)[0].size):
        return False
    if not _numpy_sum_is_pairwise():
        return False
    for c in capacities:
        for x in (c, c * model.private_rmw_capacity, c * model.private_read_capacity,
                  c * model.dirty_fraction / model.capacity_fraction if model.dirty_fraction > 0
                  else 1.0):
            if not (math.isfinite(x) and x > 0):
                return False
    return True


# numpy's pairwise summation, reproduced so that the fused path's sums are np.sum's to the
# bit without materialising the summands (arrays of accesses x capacities cost more in page
# faults than the arithmetic): np.sum(x) of a contiguous float64 array is 0.0 + pw(x), where
# pw of n <= 128 values is one block (below 8: in order; else 8 interleaved accumulators,
# ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the rest in order) and pw of more
# is pw(first n2) + pw(the rest), n2 = n // 2 rounded down to a multiple of 8.
_PW_LEAF = 128


@njit(cache=True)
def _pairwise_program(n):
    """numpy's pairwise summation of n values as a postfix program: an entry m >= 0 sums the
    next m values as one block (`_block_sum`), -1 adds the last two partial sums (left +
    right). Depends on n only."""
    out = np.empty(2 * (n // 57) + 4, np.int64)       # blocks past the root hold >= 57
    cnt = 0
    size = np.empty(256, np.int64)                    # pending nodes: size, expanded?
    done = np.zeros(256, np.bool_)
    size[0] = n
    top = 1
    while top > 0:
        top -= 1
        m = size[top]
        if m <= _PW_LEAF:
            out[cnt] = m
            cnt += 1
        elif done[top]:
            out[cnt] = -1
            cnt += 1
        else:
            m2 = m // 2
            m2 -= m2 % 8
            done[top] = True                          # revisit after both halves
            top += 1
            size[top] = m - m2                        # right half, summed second
            done[top] = False
            top += 1
            size[top] = m2                            # left half, summed first
            done[top] = False
            top += 1
    return out[:cnt]


@njit(cache=True, inline="always")
def _block_sum(v, m):
    """numpy's pairwise sum of v[:m], m <= 128 (one block, see above)."""
    if m < 8:
        res = 0.0
        for i in range(m):
            res += v[i]
        return res
    r0, r1, r2, r3, r4, r5, r6, r7 = v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    i = 8
    while i < m - m % 8:
        r0 += v[i]
        r1 += v[i + 1]
        r2 += v[i + 2]
        r3 += v[i + 3]
        r4 += v[i + 4]
        r5 += v[i + 5]
        r6 += v[i + 6]
        r7 += v[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < m:
        res += v[i]
        i += 1
    return res


@njit(cache=True)
def _pairwise_sum(x):
    """np.sum(x) of a 1-D float64 array by `_pairwise_program` and `_block_sum` (the check
    that they are numpy's: `_numpy_sum_is_pairwise`, the tests)."""
    prog = _pairwise_program(x.shape[0])
    vals = np.empty(128)
    top = 0
    pos = 0
    for op in prog:
        if op >= 0:
            vals[top] = _block_sum(x[pos:pos + op], op)
            top += 1
            pos += op
        else:
            top -= 1
            vals[top - 1] = vals[top - 1] + vals[top]
    return 0.0 + vals[0]


_PAIRWISE_OK = []


def _numpy_sum_is_pairwise() -> bool:
    """Whether this numpy's np.sum is `_pairwise_sum` (checked once, on random arrays of
    lengths around every block and split boundary); else the fused path is not taken."""
    if not _PAIRWISE_OK:
        rng = np.random.default_rng(12345)
        ok = True
        for n in (0, 1, 5, 7, 8, 9, 15, 16, 17, 100, 127, 128, 129, 130, 136, 255, 256, 257,
                  1000, 1023, 4097, 8191, 8192, 8193, 65537, 100003, 1 << 20, (1 << 20) + 77):
            x = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
            ok = ok and float(np.sum(x)) == float(_pairwise_sum(x))
        _PAIRWISE_OK.append(ok)
    return _PAIRWISE_OK[0]


@njit(cache=True, inline="always")
def _evict_from(h_next, keep, dirty):
    """evict from P(hit | max(d_next, 0)) = h_next: 1 - h_next, the tile evicted before its
    next access (or the end); with the dirty cap (dirty), 1 - (1 - evict) x keep, keep =
    P(hit | max(dw_next, 0) against C_w) for a write (the dirty line not cleaned before
    the tile's next write), 1 for any other access (`_dram_at`'s order of operations)."""
    e = 1.0 - h_next
    if dirty:
        e = 1.0 - (1.0 - e) * keep
    return e


@njit(cache=True, inline="always")
def _max0(x):
    """np.maximum(x, 0.0) of one float (NaN stays NaN)."""
    return x if (x >= 0.0 or np.isnan(x)) else 0.0


@njit(cache=True)
def _dram_sums(caps, caps_rmw, caps_read, caps_dirty, dirty, a, ad, tx, tf, ts,
               nb, rd, wr, w, wb, sh, d_prev, d_next, dw_next, need_evict, ll, lw,
               lk, lb, ld):
    """`_dram_at`'s sums at every capacity caps[c] (bytes), in one pass over the
    time-ordered accesses: each summand with `_dram_at`'s float operations in its order,
    summed as np.sum sums (`_pairwise_program`), so the results are `_dram_at`'s to the
    bit. tx, tf, ts: the Poisson tables (`_poisson_cdf_table`, `_poisson_slopes`) of the
    associativity a (row 0) and of the dirty cap's ad (row 1).
    Per access i, at C_i = caps[c], or caps_rmw[c] for a private read-modify-write round
    trip, caps_read[c] for a private read-only re-read (`L2Model.private_rmw_capacity`):
      reads: (w x nbytes) x miss_prev x rd, miss_prev = 1 - P(hit | d_prev, C_i);
      writes: (w x wb) x evict x wr, evict from P(hit | max(d_next, 0), C_i) and, with
      the dirty cap, keep = P(hit | max(dw_next, 0), caps_dirty[c]) (`_evict_from`).
    A summand multiplied by rd = 0 (wr = 0) is a zero of the sign of w x nbytes (w x wb)
    whatever miss_prev (evict) in [0, 1] stands beside it, so those are not computed
    (1 stands in), except where the distance is NaN (a NaN summand) or, for evict, where
    the drain needs it (need_evict).
    Returns (sums, drain, partial): sums[c] the reads' and sums[nc + c] the writes' sums
    (np.sum's, 0.0 + pairwise); the drain's summands (ll, lw: each written tile's last
    access and last write) (w x wb)[lw] x (1 - evict[lw]) x (1 if ll == lw else
    1 - evict[ll]), and the partial layers' (lk, lb, ld: access, bytes, distance; read
    ones only) (w[k] x b) x ((1 - P(hit | d, C)) - miss_prev[k]), as arrays (few: numpy
    sums them).
    The pass keeps evict at the accesses the drain reads and miss_prev at those the
    layers read (their slots), so neither is computed twice. It has `_hit_one` /
    `_interp_finite` written out, once for its three look-ups: an inlined helper that
    takes arrays costs reference counting per call there (about 5x the time); the
    layers' own look-ups (few) call `_hit_one`."""
    nc = caps.shape[0]
    n = nb.shape[0]
    K = 2 * nc
    m = tx.shape[1]
    invs = np.empty(2)
    # x_one: below it a table gives exactly 1 (P(hit) rounds to 1 near lam = 0: 0.37 A at
    # A = 96): the intervals there join two ones, slope 0, and 0 x (x - xp[j]) + 1 = 1,
    # so the search for the interval is skipped
    x_one = np.empty(2)
    for tb in range(2):
        invs[tb] = (m - 1) / (tx[tb, m - 1] - tx[tb, 0])
        jj = 0
        while jj < m and tf[tb, jj] == 1.0:
            jj += 1
        x_one[tb] = tx[tb, jj - 1] if jj > 0 else -np.inf
    # the accesses whose evict the drain reads (each tile's last write, last access) and
    # whose miss_prev the partial layers read: kept from the pass, at these slots
    ev_slot = np.full(n, -1, np.int64)
    nev = 0
    for j in range(lw.shape[0]):
        for u in (lw[j], ll[j]):
            if ev_slot[u] < 0:
                ev_slot[u] = nev
                nev += 1
    mp_slot = np.full(n, -1, np.int64)
    nmp = 0
    for j in range(lk.shape[0]):
        if rd[lk[j]] and mp_slot[lk[j]] < 0:
            mp_slot[lk[j]] = nmp
            nmp += 1
    ev_keep = np.empty((nc, nev))
    mp_keep = np.empty((nc, nmp))
    prog = _pairwise_program(n)
    buf = np.empty((K, _PW_LEAF))
    vals = np.empty((128, K))
    h = np.empty(3)                                 # P(hit): miss_prev's, evict's, keep's
    top = 0
    pos = 0
    for op in prog:
        if op < 0:                                  # left + right, every sum
            top -= 1
            for k in range(K):
                vals[top - 1, k] = vals[top - 1, k] + vals[top, k]
            continue
        for t in range(op):                         # one block's summands
            i = pos + t
            rdi = rd[i]
            wri = wr[i]
            priv = not sh[i]
            rdf = 1.0 if rdi else 0.0
            wrf = 1.0 if wri else 0.0
            xr = w[i] * nb[i]
            xw = w[i] * wb[i]
            dp = d_prev[i]
            dnm = _max0(d_next[i])
            dwm = _max0(dw_next[i])
            do_miss = rdi or np.isnan(dp)
            do_evict = need_evict[i] or np.isnan(dnm)
            for c in range(nc):
                if priv and rdi:
                    C = caps_rmw[c] if wri else caps_read[c]
                else:
                    C = caps[c]
                for L in range(3):
                    # the look-up: L = 0 miss_prev's, 1 evict's, 2 the dirty keep's
                    if L == 0:
                        if not do_miss:
                            continue
                        D, Cl, tb, al = dp, C, 0, a
                    elif L == 1:
                        if not do_evict:
                            continue
                        D, Cl, tb, al = dnm, C, 0, a
                    else:
                        if not (do_evict and dirty and wri):
                            continue
                        D, Cl, tb, al = dwm, caps_dirty[c], 1, ad
                    # _hit_one(D, al, Cl, tx[tb], tf[tb], ts[tb], invs[tb]), written out
                    if D < 0.0:
                        hp = 0.0
                    else:
                        x = al * D / Cl
                        if x < x_one[tb]:
                            hp = 1.0
                        elif np.isnan(x):
                            hp = x
                        elif x > tx[tb, m - 1]:
                            hp = 0.0
                        elif x < tx[tb, 0]:
                            hp = tf[tb, 0]
                        elif x == tx[tb, m - 1]:
                            hp = tf[tb, m - 1]
                        else:
                            j = int((x - tx[tb, 0]) * invs[tb])
                            if j > m - 2:
                                j = m - 2
                            while j > 0 and tx[tb, j] > x:
                                j -= 1
                            while j < m - 2 and tx[tb, j + 1] <= x:
                                j += 1
                            if tx[tb, j] == x:
                                hp = tf[tb, j]
                            else:
                                hp = ts[tb, j] * (x - tx[tb, j]) + tf[tb, j]
                    h[L] = hp
                mp = 1.0 - h[0] if do_miss else 1.0
                buf[c, t] = xr * mp * rdf
                e = 1.0
                if do_evict:
                    e = _evict_from(h[1], h[2] if wri else 1.0, dirty)
                buf[nc + c, t] = xw * e * wrf
                if ev_slot[i] >= 0:
                    ev_keep[c, ev_slot[i]] = e
                if mp_slot[i] >= 0:
                    mp_keep[c, mp_slot[i]] = mp
        for k in range(K):
            vals[top, k] = _block_sum(buf[k], op)
        top += 1
        pos += op
    sums = np.empty(K)
    for k in range(K):
        sums[k] = 0.0 + vals[0, k]
    nd = lw.shape[0]
    drain = np.empty((nc, nd))
    for j in range(nd):
        p = lw[j]
        q = ll[j]
        xw = w[p] * wb[p]
        for c in range(nc):
            stay = (1.0 - ev_keep[c, ev_slot[p]]) * (1.0 if q == p else
                                                      1.0 - ev_keep[c, ev_slot[q]])
            drain[c, j] = xw * stay
    xp, fp, sl = tx[0], tf[0], ts[0]
    nl = lk.shape[0]
    part = np.empty((nc, nl))
    cnt = 0
    for j in range(nl):
        k = lk[j]
        if rd[k]:
            x = w[k] * lb[j]
            for c in range(nc):
                mj = 1.0 - _hit_one(ld[j], a, caps[c], xp, fp, sl, invs[0])
                part[c, cnt] = x * (mj - mp_keep[c, mp_slot[k]])
            cnt += 1
    return sums, drain, part[:, :cnt]


def _dram_fused(capacities, model, dense, nb, rd, wr, w, wb, sh, sd, has_sd, foot, d_prev,
                d_next):
    """`dram_at_capacities`' [(DRAM read bytes, DRAM write bytes)] at each capacity
    (bytes) where `_fused_applies`: `_dram_at`'s numbers, its per-access arithmetic for
    every capacity in one compiled pass (`_dram_sums`) instead of numpy expressions per
    capacity. What does not depend on the capacity (the dirty stack distances, the last
    accesses and writes, the partial layers) is computed once, by `_dram_at`'s helpers."""
    A = int(model.associativity)
    xp, fp = _poisson_cdf_table(A)
    Ad = int(model.dirty_associativity) or A
    xpd, fpd = _poisson_cdf_table(Ad)
    n = dense.size
    any_wr = bool(wr.any())
    dirty = model.dirty_fraction > 0 and any_wr
    drain = model.drain_fraction > 0 and any_wr
    dw_all = np.zeros(n)                    # dirty stack distance at each write
    if dirty:
        iw, dw_next = _dirty_distances(dense, nb, wr, wb, sd, has_sd)
        dw_all[iw] = dw_next
    ll = lw = np.zeros(0, np.int64)
    if drain:
        ll, lw = _last_accesses(dense, wr)
    need_evict = wr.copy()                  # evict is summed for writes, drained at ll
    need_evict[ll] = True
    lk, lb, ld = np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    if model.partial_refetch and _grows_a_tile(dense, nb):
        lk, lb, ld = _layers(dense, nb, foot, d_prev)
    # the capacities each hit probability is taken at, as `_dram_at` computes them
    caps = np.array([float(c) for c in capacities])
    caps_rmw = np.array([float(c * model.private_rmw_capacity) for c in capacities])
    caps_read = np.array([float(c * model.private_read_capacity) for c in capacities])
    caps_dirty = np.array([float(c * model.dirty_fraction / model.capacity_fraction)
                           if dirty else 1.0 for c in capacities])
    f64 = lambda x: np.ascontiguousarray(x, dtype=np.float64)
    tx, tf, ts = np.stack([xp, xpd]), np.stack([fp, fpd]), np.stack([_poisson_slopes(A),
                                                                      _poisson_slopes(Ad)])
    sums, dterm, pterm = _dram_sums(
        caps, caps_rmw, caps_read, caps_dirty, dirty, float(A), float(Ad), tx, tf, ts,
        f64(nb), np.ascontiguousarray(rd),
        np.ascontiguousarray(wr), f64(w), f64(wb), np.ascontiguousarray(sh), f64(d_prev),
        f64(d_next), dw_all, need_evict, ll, lw, lk, f64(lb), f64(ld))
    nc = len(capacities)
    out = []
    for c, capacity in enumerate(capacities):
        reads = float(sums[c])
        if model.partial_refetch:
            reads += float(np.sum(pterm[c])) if lk.size else 0.0
        writes = float(sums[nc + c])
        if drain:
            resident = float(np.sum(dterm[c]))
            writes += min(resident, model.drain_fraction * capacity / model.capacity_fraction)
        out.append((reads, writes))
    return out


def _dram_at(capacity, model, dense, nb, rd, wr, w, wb, sh, sd, has_sd, foot, d_prev, d_next,
             cache):
    """`dram_at_capacities` at one capacity, from the time-ordered accesses and their
    stack distances; cache: what does not depend on the capacity (the dirty stack
    distances, the partial tiles' layers, the last writes), kept for the next capacity."""
    if model.policy == "random":
        miss_prev, evict = _random_replacement(dense, foot * w, d_prev, d_next, capacity)
    else:
        A = int(model.associativity)
        miss_prev = 1.0 - hit_probability(d_prev, capacity, A, model.keep_fraction)
        # d_next = -1 never happens (the last access counts to the end); 0: nothing after
        evict = 1.0 - hit_probability(np.maximum(d_next, 0.0), capacity, A, model.keep_fraction)
        if model.private_associativity and model.private_associativity != A and (~sh).any():
            Ap = int(model.private_associativity)
            ip = np.flatnonzero(~sh)
            miss_prev[ip] = 1.0 - hit_probability(d_prev[ip], capacity, Ap, model.keep_fraction)
            evict[ip] = 1.0 - hit_probability(np.maximum(d_next[ip], 0.0), capacity, Ap,
                                              model.keep_fraction)
        if model.private_rmw_capacity != 1.0 or model.private_read_capacity != 1.0:
            # v10 what-if: the capacity edge of private round trips (a tile one CTA reads
            # and writes in one access: fa1's O, l, m) and of private read-only re-reads
            # (fa1's Q) at their own fraction of C (`L2Model.private_rmw_capacity`)
            for sel, f in ((~sh & rd & wr, model.private_rmw_capacity),
                           (~sh & rd & ~wr, model.private_read_capacity)):
                if f != 1.0 and sel.any():
                    ip = np.flatnonzero(sel)
                    Ap = int(model.private_associativity) or A
                    miss_prev[ip] = 1.0 - hit_probability(d_prev[ip], capacity * f, Ap,
                                                          model.keep_fraction)
                    evict[ip] = 1.0 - hit_probability(np.maximum(d_next[ip], 0.0),
                                                      capacity * f, Ap, model.keep_fraction)
        if model.dirty_fraction > 0 and wr.any():
            # dirty stack distance: distinct written bytes until the tile's next write
            if "dirty" not in cache:
                cache["dirty"] = _dirty_distances(dense, nb, wr, wb, sd, has_sd)
            iw, dw_next = cache["dirty"]
            cw = capacity * model.dirty_fraction / model.capacity_fraction
            keep = np.ones_like(evict)
            keep[iw] = hit_probability(np.maximum(dw_next, 0.0), cw,
                                       int(model.dirty_associativity) or A)
            evict = 1.0 - (1.0 - evict) * keep
    if model.refetch_factor != 1.0:
        deep = 1.0 - hit_probability(d_prev, capacity * model.refetch_capacity, int(model.associativity))
        miss_prev = np.where(sh & (d_prev >= 0), miss_prev + (model.refetch_factor - 1.0) * deep, miss_prev)
    reads = float(np.sum(w * nb * miss_prev * rd))
    if model.partial_refetch and model.policy == "lru":
        reads += _partial_refetch(dense, nb, foot, rd, w, d_prev, miss_prev, capacity, model,
                                  cache)
    writes = float(np.sum(w * wb * evict * wr))
    if model.drain_fraction > 0 and wr.any():
        # dirty bytes still resident at the kernel's end: each tile's last write, if it
        # was neither evicted nor cleaned before the tile's next access and the tile's last
        # access was not evicted before the end; the counters see up to drain_fraction x
        # L2 of them written back (`L2Model.drain_fraction`)
        if "drain" not in cache:
            cache["drain"] = _last_accesses(dense, wr)
        ll, lw = cache["drain"]
        stay = (1.0 - evict[lw]) * np.where(ll == lw, 1.0, 1.0 - evict[ll])
        resident = float(np.sum(w[lw] * wb[lw] * stay))
        writes += min(resident, model.drain_fraction * capacity / model.capacity_fraction)
    return reads, writes


@njit(cache=True)
def _partial_layers(order, dense, nb, foot, d_prev):
    """Layers of the accesses that touch more of a tile than the tile's previous access
    (`_partial_refetch`): (access, bytes, distance; -1: never touched before). order: the
    accesses sorted by tile, then time. A stack per tile keeps the latest access of each
    extent (extents decreasing from the bottom); the distance between accesses m < k of a
    tile is taken as the chain sum S_k - S_m - foot[m], S the running sum of d_prev and
    the accesses' own footprints (an upper bound of the distinct bytes between them)."""
    n = order.shape[0]
    # room enough: an access gives at most one layer per stack entry it pops (extents up
    # to its own), one for the first larger entry below them, which completes its extent,
    # and one for bytes never touched; each access is pushed once: at most 3 n layers
    out_k = np.empty(4 * n + 16, np.int64)
    out_b = np.empty(4 * n + 16)
    out_d = np.empty(4 * n + 16)
    cnt = 0
    st_nb = np.empty(n)
    st_S = np.empty(n)
    st_f = np.empty(n)
    top = 0
    S = 0.0
    prev_tile = -1
    for r in range(n):
        k = order[r]
        if dense[k] != prev_tile:
            prev_tile = dense[k]
            top = 0
            S = 0.0
        else:
            S += max(d_prev[k], 0.0)
            covered = min(st_nb[top - 1], nb[k])       # the previous access: base charge
            i = top - 2
            while covered < nb[k] and i >= 0:
                if st_nb[i] > covered:
                    hi = min(st_nb[i], nb[k])
                    out_k[cnt] = k
                    out_b[cnt] = hi - covered
                    out_d[cnt] = max(S - st_S[i] - st_f[i], 0.0)
                    cnt += 1
                    covered = hi
                i -= 1
            if covered < nb[k]:
                out_k[cnt] = k
                out_b[cnt] = nb[k] - covered
                out_d[cnt] = -1.0
                cnt += 1
        while top > 0 and st_nb[top - 1] <= nb[k]:
            top -= 1
        st_nb[top] = nb[k]
        st_S[top] = S
        st_f[top] = foot[k]
        top += 1
        S += foot[k]
    return out_k[:cnt], out_b[:cnt], out_d[:cnt]


def _partial_refetch(dense, nb, foot, rd, w, d_prev, miss_prev, capacity, model, cache=None):
    """Extra DRAM reads of coarse tiles accessed in part (`L2Model.partial_refetch`). An
    access that touches more of a tile (nb) than the tile's previous access did finds the
    extra bytes where they were last touched: each layer of them at the latest earlier
    access that reached it (a miss with P(miss | that distance)), bytes no access reached
    before always missing (their first touch). The base charge counted them at
    P(miss | d_prev); this adds the difference. cache: a dict that keeps the layers (they do
    not depend on the capacity) for the next call on the same accesses."""
    cache = {} if cache is None else cache
    if "layers" not in cache:
        cache["layers"] = _layers(dense, nb, foot, d_prev)
    k, b, d = cache["layers"]
    if k.size == 0:
        return 0.0
    miss = 1.0 - hit_probability(d, capacity, int(model.associativity), model.keep_fraction)
    return float(np.sum((w[k] * b * (miss - miss_prev[k]))[rd[k]]))


def _random_replacement(blk, nb, d_prev, d_next, capacity, iterations=30):
    """(miss, evict) probabilities under random replacement: a resident line survives
    each insertion with probability 1 - line/C, so a tile survives a window in which M
    bytes were inserted (missed) with probability exp(-M / C). M is taken as the window's
    bytes accessed (with repeats) times the stream's mean miss fraction mu, solved as a
    fixed point (mu = the byte-weighted mean of the misses it implies)."""
    n = blk.size
    csum = np.concatenate([[0.0], np.cumsum(nb)])
    # previous / next access position of the same tile
    order = np.lexsort((np.arange(n), blk))
    same = np.r_[False, blk[order][1:] == blk[order][:-1]]
    before = order[np.flatnonzero(same) - 1]      # the access just before, same tile
    prev = np.full(n, -1)
    prev[order[same]] = before
    nxt = np.full(n, n)
    nxt[before] = order[same]
    k = np.arange(n)
    A_prev = np.where(prev >= 0, csum[k] - csum[np.maximum(prev, 0) + 1], -1.0)
    A_next = csum[np.minimum(nxt, n)] - csum[k + 1]
    mu = 0.5
    for _ in range(iterations):
        miss = np.where(A_prev < 0, 1.0, 1.0 - np.exp(-mu * np.maximum(A_prev, 0) / capacity))
        new = float(np.sum(nb * miss) / max(np.sum(nb), 1e-300))
        if abs(new - mu) < 1e-6:
            mu = new
            break
        mu = new
    evict = 1.0 - np.exp(-mu * A_next / capacity)
    return miss, evict


# ---------------------------------------------------------------------------------------
# Stream builders: the kernels' access patterns
# ---------------------------------------------------------------------------------------
def _unique_rows(key):
    """(first, inverse, counts) of np.unique(key, axis=0, return_index=True,
    return_inverse=True, return_counts=True), the unique rows left out: the rows in
    lexicographic order (columns compared as int64, as np.unique's structured view does) by
    a stable sort, so `first` is each distinct row's first occurrence, as there. A stable
    np.lexsort of the columns in place of the sort of structured rows (several times
    faster)."""
    n = key.shape[0]
    perm = np.lexsort(key.T[::-1])              # column 0 the primary key; stable
    aux = key[perm]
    mask = np.empty(n, bool)
    mask[:1] = True
    mask[1:] = np.any(aux[1:] != aux[:-1], axis=1)
    inv = np.empty(n, np.intp)
    inv[perm] = np.cumsum(mask) - 1
    return perm[mask], inv, np.diff(np.concatenate(np.nonzero(mask) + ([n],)))


@njit(cache=True)
def _sweep_groups(l, h, s0, c_lo, nc, q):
    """The coarse tiles of the cohorts' sweeps (`sweep_kernel`): for cohort c, coarse
    tiles c_lo[c] .. c_lo[c] + nc[c] - 1 of q real tiles each, clipped to its range
    [l, h): (cohort, coarse index, real tiles in it (float), mid time step
    s0 + (a + b) / 2 - l + 0.5 for its real tiles a..b-1), in cohort order; the numpy
    expressions it replaces, element by element (one pass, no temporaries)."""
    total = 0
    for c in range(nc.shape[0]):
        total += nc[c]
    cta = np.empty(total, np.int64)
    cidx = np.empty(total, np.int64)
    cnt = np.empty(total)
    tmid = np.empty(total)
    r = 0
    for c in range(nc.shape[0]):
        for o in range(nc[c]):
            ci = c_lo[c] + o
            a = max(ci * q, l[c])               # first real tile of this group in the range
            b = min(ci * q + q, h[c])
            cta[r] = c
            cidx[r] = ci
            cnt[r] = np.float64(b - a)
            tmid[r] = s0[c] + (a + b) / 2.0 - l[c] + 0.5
            r += 1
    return cta, cidx, cnt, tmid


def _coarse(total_steps: int, budget: int) -> int:
    return max(1, -(-int(total_steps) // max(1, budget)))


def sweep_kernel(stream: Stream, *, group, lo, hi, step_bytes, step_rd=True, step_wr=False,
                 step_write_bytes=None, step_private_bytes=0.0, pre_bytes=0.0,
                 pre_shared=None, pre_shared_bytes=0.0, post_bytes=0.0, frame_bytes=0.0,
                 local_frame_bytes=0.0, local_write_bytes=0.0, lag=0.0,
                 slots: int, budget: int, n_seq: int):
    """CTAs (arrays over CTAs, in launch order) that each sweep tiles lo..hi-1 of their
    group's shared sequence (n_seq tiles per group), one per time step.

    step_bytes: bytes of one shared tile (read on a miss); step_wr: the sweep also writes
    it (atomics, read-modify-write), step_write_bytes of it (default all).
    step_private_bytes: bytes of a per-step tile only this CTA touches (read).
    pre_bytes / post_bytes: private bytes read at the start / written at the end.
    pre_shared: optional shared tile id per CTA read at the start (pre_shared_bytes).
    frame_bytes: a spilling build's local-memory stack frame per CTA, written at its start.
    Local memory is allocated per resident CTA slot, so the CTA that next runs in the
    slot writes the same addresses: the frame is one tile per slot (a cohort of CTAs that
    start together: one tile of their bytes, named by their first slot), reaching DRAM
    only if evicted or cleaned before the slot's next CTA rewrites it.
    lag: the wave's lagging part (L2Model.sweep_lag, v8): each shared tile of a cohort's
    sweep is read again lag x the cohort's sweep length later (rounded to half steps); 0:
    off. The coarsening budget then counts the sweep twice (distances are quantised to
    groups twice as long), so the simulated accesses stay within `budget`.
    local_frame_bytes / local_write_bytes: a build whose local memory overflows the L1
    (the resident CTAs' frames exceed the L1 left beside shared memory) re-reads its frame
    from L2 at every step (local_frame_bytes per CTA: the distinct bytes, threads x the
    frame) and rewrites local_write_bytes of it: one access of the slot's frame tile per
    step (read, written; a tile of its own beside frame_bytes' write at the CTA's start:
    the tile-level dirty state would otherwise let the few bytes rewritten every step
    stand for the whole frame written at the start), so its distance is the other slots'
    frames and the shared tiles touched in between; a miss costs the frame's bytes once per step (repeated loads of
    the same bytes within a step hit in L2).
    Returns the number of simulated accesses."""
    group, lo, hi = (np.asarray(x, dtype=np.int64) for x in (group, lo, hi))
    n = group.size
    steps = np.maximum(hi - lo, 0)
    start, slot = _schedule_slots((steps + 1).astype(np.float64), int(slots))
    # CTAs that start together on the same tiles touch each tile at the same step: merge
    key = np.stack([start.view(np.int64), group, lo, hi,
                    (np.zeros(n, np.int64) if pre_shared is None else np.asarray(pre_shared))], 1)
    first, inv, counts = _unique_rows(key)
    mult = counts.astype(np.float64)            # CTAs per cohort (private bytes add up)
    g, l, h, s0 = group[first], lo[first], hi[first], start[first]
    st = np.maximum(h - l, 0)
    q = _coarse(int(st.sum()) * (2 if lag > 0 else 1), budget)
    m = len(first)
    # private pre / post
    stream.add(s0, stream.ids(m), mult * pre_bytes, True, False)
    if pre_shared is not None:
        ps = np.asarray(pre_shared, dtype=np.int64)[first]
        stream.add(s0, ps, pre_shared_bytes, True, False, shared=True)
    stream.add(s0 + st + 1, stream.ids(m), mult * post_bytes, False, True)
    if frame_bytes or local_frame_bytes:
        first_slot = np.full(m, np.iinfo(np.int64).max)
        np.minimum.at(first_slot, inv.ravel(), slot)
    if frame_bytes:
        stream.add(s0, first_slot + (7 << 40), mult * frame_bytes, False, True)
    # the sweep, in groups of q consecutive tiles
    c_lo, c_hi = l // q, np.where(st > 0, (h - 1) // q + 1, l // q)
    nc = np.maximum(c_hi - c_lo, 0)
    if nc.sum() == 0:
        return m
    # each cohort's coarse tiles: cohort, coarse index, real tiles, mid time
    cta, cidx, cnt, tmid = _sweep_groups(l, h, s0, c_lo, nc, q)
    ncoarse = -(-n_seq // q)
    wbytes = step_bytes if step_write_bytes is None else step_write_bytes
    stream.add(tmid, g[cta] * ncoarse + cidx + (1 << 40), cnt * step_bytes, step_rd, step_wr,
               wb=cnt * wbytes, shared=True)
    if lag > 0:
        # the cohort's lagging part reads each tile again lag x its sweep later
        stream.add(tmid + np.round(2.0 * lag * st[cta]) / 2.0, g[cta] * ncoarse + cidx + (1 << 40),
                   cnt * step_bytes, step_rd, step_wr, wb=cnt * wbytes, shared=True)
    if step_private_bytes:
        stream.add(tmid, stream.ids(cidx.size), cnt * mult[cta] * step_private_bytes, True, False)
    if local_frame_bytes:
        # the slot's frame, once per coarse group standing for cnt steps (weight)
        fb = mult[cta] * local_frame_bytes
        stream.add(tmid, first_slot[cta] + (8 << 40), fb, True, local_write_bytes > 0, w=cnt,
                   wb=mult[cta] * min(local_write_bytes, local_frame_bytes),
                   selfd=fb - local_frame_bytes)
        return m + (3 if lag > 0 else 2) * cidx.size
    return m + (2 if lag > 0 else 1) * cidx.size


def tile_kernel(stream: Stream, *, a_blk, a_bytes, b_blk, b_bytes, out_bytes, slots: int):
    """One CTA per tile (launch order): reads shared tiles a and b, writes a private output
    tile. Durations are equal, so CTAs run in waves of `slots`."""
    n = len(a_blk)
    start = (np.arange(n) // max(1, slots)).astype(np.float64)
    stream.add(start, np.asarray(a_blk) + (2 << 40), a_bytes, True, False, shared=True)
    stream.add(start, np.asarray(b_blk) + (3 << 40), b_bytes, True, False, shared=True)
    stream.add(start + 1, stream.ids(n), out_bytes, False, True)
    return 3 * n


def row_kernel(stream: Stream, *, read_bytes, write_bytes, slots: int):
    """CTAs (one per row block) that read a private input and write a private output."""
    read_bytes = np.asarray(read_bytes, dtype=np.float64)
    n = read_bytes.size
    start = (np.arange(n) // max(1, slots)).astype(np.float64)
    stream.add(start, stream.ids(n), read_bytes, True, False)
    stream.add(start + 1, stream.ids(n), write_bytes, False, True)
    return 2 * n


__all__ = ["L2Model", "Stream", "KernelTraffic", "hit_probability", "dram_from_stream",
           "sweep_kernel", "tile_kernel", "row_kernel"]
