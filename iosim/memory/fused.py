"""The compiled DRAM sums: the hit probabilities and the read / write sums of every capacity
asked for (the point and the chip range) in one pass over a stream's accesses, each summand
with the float operations of the numpy reference (`iosim.memory.dram._dram_at`) and summed in
numpy's pairwise order, so the two agree to the bit."""
from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from .hits import _hit_one, _poisson_cdf_table, _poisson_slopes
from .l2model import L2Model
from .order import _dirty_distances, _grows_a_tile, _last_accesses, _layers


def _fused_applies(model: L2Model, capacities) -> bool:
    """Whether `_dram_fused` gives `_dram_at`'s numbers (bit for bit) for this model and
    these capacities (bytes): the LRU policy without keep_fraction's floor or the refetch
    what-if, one associativity for shared and private tiles (private_associativity off
    or equal), Poisson tables with finite slopes (`_interp_finite`), numpy's sums as
    `_pairwise_sum` reproduces them, and every capacity the hit probabilities are taken
    at (C, C x private_rmw_capacity, C x private_read_capacity, the dirty cap C_w) finite
    and > 0: then a hit probability is NaN only where its distance is NaN, which the
    terms `_dram_sums` skips rely on. Elsewhere `_dram_at` is the reference (and the
    model): the fitted model (`iosim.memory.FITTED`) and its chip range take the
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
