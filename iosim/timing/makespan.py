"""A launch's CTAs scheduled on its SMs: the makespan of their work (units of work at one
SM's full rate), with each SM's throughput shared by its resident CTAs (`makespans`), and
the imbalance it gives over the balanced time (`imbalance`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._jit import njit
from ..memory.schedule import _heap_push, _heap_sift_down

# ---------------------------------------------------------------------------------------
# Work and traffic of each launch
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UniformWork:
    """The work vector of a launch whose n CTAs all do the same work `value` (units of
    work at one SM's full rate), np.full(n, value) without the array: the standard
    kernels' tile products, fa1's heads and the backward's elementwise passes launch up to
    millions of equal CTAs whose work is only summed (`sum`, the spill term's
    `excess_sum`), maximised and scheduled (`makespans`: equal CTAs fill the machines in
    waves), which is arithmetic. Each gives the float the array's numpy expression gives."""
    n: int
    value: float

    @property
    def size(self) -> int:
        return self.n

    def sum(self) -> float:
        """np.full(n, value).sum(): n x value where every partial sum of numpy's pairwise
        summation is exact (an integer value, |n x value| < 2^53), else that sum."""
        v = float(self.value)
        if v.is_integer() and abs(v) * self.n < 2.0 ** 53:
            return 0.0 + float(self.n) * v          # (np.sum starts from +0.0)
        return float(np.full(self.n, v).sum())

    def max(self) -> float:
        """np.max(np.full(n, value)) (n > 0)."""
        return float(self.value)

    def excess_sum(self) -> float:
        """(work - 1).clip(0).sum(): the CTAs' work beyond their first unit (the spilling
        builds' local-memory steps)."""
        return UniformWork(self.n, float((np.float64(self.value) - 1).clip(0))).sum()


def _work_excess(work) -> float:
    """sum(max(work - 1, 0)) of a CTA work vector (array or `UniformWork`)."""
    if isinstance(work, UniformWork):
        return work.excess_sum()
    return (work - 1).clip(0).sum()


def _equal_work(work, uniform=None):
    """The work each CTA of `work` does (units at one SM's full rate) where all do the
    same, else None: a `UniformWork`'s value (equal by construction: no array), an
    array's first entry where every entry equals it (NaN equals none). uniform: whether
    all of an array is work[0], where the caller knows (one pass fewer over a grid of
    millions of CTAs)."""
    if isinstance(work, UniformWork):
        return float(work.value)
    if np.all(work == work[0]) if uniform is None else uniform:
        return float(work[0])
    return None


def _makespan(work, machines, uniform=None):
    """Makespan of the list schedule of work (an array or `UniformWork`; CTAs in grid
    order, each to the earliest free of `machines`): max(start + work), `_list_makespan`;
    equal CTAs fill the machines in whole waves. uniform: as `_equal_work`'s."""
    value = _equal_work(work, uniform)
    if value is not None:
        return -(-work.size // machines) * value
    return float(_list_makespan(np.asarray(work, dtype=np.float64), int(machines)))


@njit(cache=True)
def _list_makespan(dur, slots):
    """(iosim.memory.schedule._schedule(dur, slots) + dur).max() without the start times: the
    same heap of (free time, slot) (`iosim.memory.schedule._schedule_slots`), each CTA ending
    at its slot's free time + its work, the latest end kept as it goes (NaN, as np.max,
    if any end is NaN); no arrays of millions of CTAs."""
    n = dur.shape[0]
    k = min(slots, n)
    hf = np.zeros(k)                        # heap: free time ...
    hs = np.arange(k)                       # ... and slot, in slot order
    latest = -np.inf
    nan = False
    for c in range(n):
        end = hf[0] + dur[c]
        if end > latest:
            latest = end
        elif np.isnan(end):
            nan = True
        _heap_sift_down(hf, hs, k, 0, end, hs[0])      # the root's new free time
    return np.nan if nan else latest


#: grids past this many CTAs of unequal work keep the sequential list schedule (speed)
SHARED_MAX_CTAS = 20000


def _shared_makespan(work, sms: int, slots: int) -> float:
    """Makespan of CTAs (work in units at one SM's full rate) on `sms` SMs of `slots`
    resident CTAs each, an SM's throughput shared equally among its resident CTAs, the
    CTAs dispatched in grid order to the first slot that frees: a long CTA that starts
    late shares its SM until the end (list scheduling with an SM as one sequential machine
    would let it run alone). Compiled (`_shared_makespan_nb`); `_shared_makespan_py` is
    the same schedule in Python, the reference it reproduces bit for bit."""
    w = np.ascontiguousarray(work, dtype=np.float64)
    if w.size == 0:
        return 0.0
    return float(_shared_makespan_nb(w, int(sms), int(slots)))


@njit(cache=True)
def _row_min(res, sm, k):
    """The least remaining work among SM sm's k resident CTAs."""
    mn = res[sm, 0]
    for i in range(1, k):
        if res[sm, i] < mn:
            mn = res[sm, i]
    return mn


@njit(cache=True)
def _shared_makespan_nb(w, sms, slots):
    """`_shared_makespan_py` compiled: the same float operations in the same order. Each
    SM's resident CTAs are a row of `res` (order within a row does not matter: min and the
    filter are order-free), the event heap (iosim.memory's, shared with its slot
    schedule) is ordered by (time, SM) as heapq orders the Python version's (time, sm)
    tuples, so events pop in the same order."""
    n = w.shape[0]
    res = np.empty((sms, max(slots, 1)))
    cnt = np.zeros(sms, np.int64)
    m0 = min(n, sms * slots)
    for c in range(m0):                       # breadth first: CTA c on SM c mod sms
        sm = c % sms
        res[sm, cnt[sm]] = w[c]
        cnt[sm] += 1
    nxt = m0
    last = np.zeros(sms)
    ht = np.empty(sms)                        # event heap: time, SM
    hs = np.empty(sms, np.int64)
    size = 0
    for sm in range(sms):
        if cnt[sm] > 0:
            size = _heap_push(ht, hs, size, _row_min(res, sm, cnt[sm]) * cnt[sm], sm)
    t_end = 0.0
    while size > 0:
        t = ht[0]
        sm = hs[0]
        size -= 1                             # pop: the last entry to the root, sifted down
        if size > 0:
            _heap_sift_down(ht, hs, size, 0, ht[size], hs[size])
        k = cnt[sm]
        step = (t - last[sm]) / k             # each resident CTA's progress
        tol = 1e-9 * max(1.0, step)
        j = 0
        for i in range(k):
            x = res[sm, i] - step
            if x > tol:
                res[sm, j] = x
                j += 1
        last[sm] = t
        t_end = t
        while j < slots and nxt < n:          # freed slots take the next CTAs
            res[sm, j] = w[nxt]
            j += 1
            nxt += 1
        cnt[sm] = j
        if j > 0:
            size = _heap_push(ht, hs, size, t + _row_min(res, sm, j) * j, sm)
    return t_end


def _shared_makespan_py(work, sms: int, slots: int) -> float:
    """Makespan of CTAs (work in units at one SM's full rate) on `sms` SMs of `slots`
    resident CTAs each, an SM's throughput shared equally among its resident CTAs, the
    CTAs dispatched in grid order to the first slot that frees: a long CTA that starts
    late shares its SM until the end (list scheduling with an SM as one sequential machine
    would let it run alone)."""
    import heapq
    w = [float(x) for x in work]
    n = len(w)
    res = [[] for _ in range(sms)]                # remaining work of each SM's CTAs
    for c in range(min(n, sms * slots)):          # breadth first: CTA c on SM c mod sms
        res[c % sms].append(w[c])
    nxt = min(n, sms * slots)
    last = [0.0] * sms
    heap = [(min(r) * len(r), sm) for sm, r in enumerate(res) if r]
    heapq.heapify(heap)
    t_end = 0.0
    while heap:
        t, sm = heapq.heappop(heap)
        r = res[sm]
        step = (t - last[sm]) / len(r)            # each resident CTA's progress
        tol = 1e-9 * max(1.0, step)
        r[:] = [x - step for x in r if x - step > tol]
        last[sm] = t_end = t
        while len(r) < slots and nxt < n:         # freed slots take the next CTAs
            r.append(w[nxt])
            nxt += 1
        if r:
            heapq.heappush(heap, (t + min(r) * len(r), sm))
    return t_end


def makespans(work, hw, ctas_per_sm: int) -> dict:
    """The two schedules of a launch's CTAs, in units of work at one SM's full rate:
    mk_sm, SMs as machines sharing their throughput among resident CTAs; mk_slots, each
    of the SMs x CTAs-per-SM slots a machine running one CTA at a time at full rate (the
    latency-bound view: divided by the share of an SM one CTA can use, see `imbalance`).
    work: an array, or `UniformWork` (equal CTAs: waves of the machines, no array)."""
    total = work.sum() if work.size else 0     # (summed and compared once)
    if work.size == 0 or total == 0:
        return {"mk_sm": 0.0, "mk_slots": 0.0, "balanced": 1.0}
    uniform = _equal_work(work) is not None
    slots = hw.sm_count * ctas_per_sm
    if uniform or work.size > SHARED_MAX_CTAS:
        mk_sm = _makespan(work, hw.sm_count, uniform)
        # one CTA per SM: the slot schedule is the same list schedule (computed once)
        mk_slots = mk_sm if slots == hw.sm_count else _makespan(work, slots, uniform)
    else:
        mk_sm = _shared_makespan(work, hw.sm_count, max(1, ctas_per_sm))
        mk_slots = _makespan(work, slots, uniform)
    return {"mk_sm": mk_sm, "mk_slots": mk_slots, "balanced": float(total / hw.sm_count)}


def imbalance(f: dict, w_sat: float) -> float:
    """Makespan over the balanced time. One CTA of w warps can use at most
    min(1, w / w_sat) of its SM's throughput (latency hiding needs w_sat warps), so the
    makespan is the larger of the SM-throughput schedule and the slot schedule at that
    per-CTA rate."""
    share = min(1.0, f["warps"] / w_sat)
    return max(f["mk_sm"], f["mk_slots"] / share) / f["balanced"]
