"""DRAM bytes of one kernel launch's stream at one or more effective L2 capacities:
`dram_from_stream`, `dram_at_capacities` (compiled where `_fused_applies`, else the numpy
reference `_dram_at`)."""
from __future__ import annotations

import numpy as np

from .fused import _dram_fused, _fused_applies
from .hits import hit_probability
from .l2model import L2Model
from .order import _dirty_distances, _last_accesses, _layers, _time_ordered
from .stream import Stream


def dram_from_stream(stream: Stream, capacity: float, model: L2Model):
    """(DRAM read bytes, DRAM write bytes, accesses) of a stream."""
    (r, w), = dram_at_capacities(stream, (capacity,), model)
    return r, w, stream.size


def dram_at_capacities(stream: Stream, capacities, model: L2Model):
    """[(DRAM read bytes, DRAM write bytes)] of a stream at each capacity C in
    `capacities` (bytes), the stack distances computed once: `dram_from_stream` at one C;
    several give the same model at other effective L2 sizes (`iosim.memory`'
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
