"""A kernel launch's access stream at tile granularity (`Stream`) and its builders: CTAs that
sweep shared tiles (`sweep_kernel`), tile products (`tile_kernel`) and row passes
(`row_kernel`), scheduled on the launch's SM slots."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._jit import njit
from .schedule import _schedule_slots


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
