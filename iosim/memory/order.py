"""A stream in time order: the accesses sorted by step, the tiles ranked densely, each
access's footprint, the stack distances to its previous and next access (clean and dirty),
the last writes and the partial tiles' layers (what the DRAM sums read)."""
from __future__ import annotations

import numpy as np

from .._jit import njit
from .hits import _distances
from .l2model import L2Model
from .stream import Stream


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
