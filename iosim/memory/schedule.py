"""The CTAs' start times: list scheduling of a launch's CTAs on its SM slots, with a compiled
binary heap of (free time, slot) that the time model's makespans share (`iosim.timing`)."""
from __future__ import annotations

import numpy as np

from .._jit import njit


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
