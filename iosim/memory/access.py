"""The access streams of each pass: for a pass's launch plan (`iosim.launch.plan`), its kernel
launches in order, each with a builder of its access stream (`iosim.memory.stream`) at tile
granularity: which CTA reads or writes which tile, in what order."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..launch.plan import L1_BYTES, SPILLS, Launch, Plan, _regs, local_of, occupancy
from ..problem import Problem, band_of
from .l2model import L2Model
from .stream import Stream, _coarse, row_kernel, sweep_kernel, tile_kernel


# ---------------------------------------------------------------------------------------
# Access streams of each pass
# ---------------------------------------------------------------------------------------
def _blocks(N, B):
    T = -(-N // B)
    sizes = np.minimum(B, N - np.arange(T) * B)
    return T, sizes


def _active_prefix(N, B_r, B_c, causal):
    """Key blocks each query block sees: a prefix 0..a_i - 1 (all T_c if not causal)."""
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    if not causal:
        return np.full(T_r, T_c, dtype=np.int64)
    last = np.minimum((np.arange(T_r) + 1) * B_r, N) - 1
    return np.minimum(last // B_c + 1, T_c)


def _key_block_range(p: Problem, B_r: int, B_c: int):
    """(j_lo, j_hi): the key blocks j_lo_i <= j < j_hi_i that query block i sees (empty
    where j_hi_i <= j_lo_i). N_k = N without a window: 0 .. a_i (`_active_prefix`); else
    the band lo <= c - r <= hi of `iosim.problem.band_of` (bottom-right aligned), block by
    block as `iosim.closed_form.band_sums_by_block` counts it."""
    if p.N_k == p.N and p.window == (-1, -1):
        a = _active_prefix(p.N, B_r, B_c, p.causal)
        return np.zeros_like(a), a
    lo, hi = band_of(p.N, p.N_k, p.causal, p.window)
    T_r, T_c = -(-p.N // B_r), -(-p.N_k // B_c)
    r0 = np.arange(T_r, dtype=np.int64) * B_r
    r_last = np.minimum(r0 + B_r, p.N) - 1
    if hi is None:
        j_hi = np.full(T_r, T_c - 1, dtype=np.int64)
    else:
        j_hi = np.where(r_last + hi < 0, -1, np.minimum((r_last + hi) // B_c, T_c - 1))
    j_lo = np.zeros(T_r, dtype=np.int64) if lo is None else \
        np.where(r0 + lo > p.N_k - 1, T_c, np.maximum((r0 + lo) // B_c, 0))
    return j_lo, j_lo + np.maximum(j_hi - j_lo + 1, 0)


def _first_query_block(N, B_r, B_c, causal):
    """First query block that sees key block j (causal): floor(j B_c / B_r); 0 otherwise."""
    T_c = -(-N // B_c)
    if not causal:
        return np.zeros(T_c, dtype=np.int64)
    return (np.arange(T_c) * B_c) // B_r


def _instances(p: Problem):
    z = np.arange(p.instances)
    zk = (z // p.heads) * p.kv_heads + (z % p.heads) // p.group
    return z, zk


def _launches_and_streams(p: Problem, plan: Plan, hw, model: L2Model):
    """[(Launch, Stream builder)] of the pass, in launch order."""
    N, d, s = p.N, p.d, p.itemsize
    B_r, B_c = plan.tiling.B_r, plan.tiling.B_c
    T_r = -(-N // B_r)
    I = p.instances
    z, zk = _instances(p)
    budget = model.max_accesses
    out = []

    geom = plan.extra.get("geom", {})
    tc_names = {"fa1_fwd": "fa1_tc", "std_S": "std_tc_S", "std_softmax": "std_tc_softmax",
                "std_PV": "std_tc_PV", "std_bwd_dV": "std_tc_bwd_dV",
                "std_bwd_dP": "std_tc_bwd_dP", "std_bwd_dS": "std_tc_bwd_dS",
                "std_bwd_dQ": "std_tc_bwd_dQ", "std_bwd_dK": "std_tc_bwd_dK"}
    fast_names = {"fa1_fwd": "fa1_fast", "std_S": "std_fast_S", "std_softmax": "std_fast_softmax",
                  "std_PV": "std_fast_PV"}

    def L(name, ctas, threads, smem, regs_prefix):
        if plan.kernel in ("tc", "fast") and not (plan.algorithm == "fa2" and plan.pass_ == "fwd"):
            if plan.algorithm == "fa2":           # backward: main and pre-pass
                if name == "fa2_bwd_main":
                    regs_prefix = name = "fa2_bwd_tc" if plan.kernel == "tc" else "fa2_bwd_fast"
                elif name == "fa2_bwd_pre" and plan.kernel == "fast":
                    regs_prefix = name = "fa2_bwd_pre_fast"
                key = {"fa2_bwd_tc": "fa2_bwd_main", "fa2_bwd_fast": "fa2_bwd_main",
                       "fa2_bwd_pre_fast": "fa2_bwd_pre"}.get(name, name)
            else:
                names = fast_names if plan.kernel == "fast" else tc_names
                key = regs_prefix = name = names.get(name, name)
            threads, smem = geom.get(key, (threads, smem))
        regs = _regs(regs_prefix, B_r, B_c, d, p.causal)
        return Launch(name, int(ctas), threads, int(smem), regs,
                      occupancy(hw, threads, int(smem), regs),
                      SPILLS.get((regs_prefix, B_r, B_c, d, p.causal),
                                 SPILLS.get((regs_prefix, B_r, B_c, d), 0)))

    if plan.pass_ == "fwd" and plan.algorithm == "fa2":
        prefix = {"tc": "fa2_tc", "fast": "fa2_fast", "plain": "fa2_fwd"}[plan.kernel]
        lau = L(prefix, T_r * I, plan.threads, plan.smem_bytes, prefix)
        # a spilling build's stack frame (spill bytes x threads) is written to local memory
        # once per CTA (Nsight Compute's local stores of the fast 256 x 32 build at d = 64:
        # 88 B x 512 threads x CTAs), at the addresses of its SM slot (sweep_kernel)
        frame = lau.spill_bytes * lau.threads
        loc = local_of(prefix, B_r, B_c, d, p.causal)
        local_frame = local_write = 0.0
        j_lo, j_hi = _key_block_range(p, B_r, B_c)
        a = j_hi - j_lo
        if loc and model.local_memory and \
                loc[0] * lau.threads * lau.ctas_per_sm > L1_BYTES - lau.ctas_per_sm * lau.smem_bytes:
            local_frame, local_write = loc[0] * lau.threads, loc[1] * lau.threads
            lau = replace(lau, local_frame_bytes=local_frame, local_write_bytes=local_write,
                          frame_steps=float(a.sum()) * z.size,
                          local_load_bytes=loc[2] * lau.threads)
        # v8: the lagging part of a wave's cohort, where two or more CTAs share an SM and
        # the sweeps are of equal length (non-causal); L2Model.sweep_lag. v9: the causal
        # sweeps (heaviest first, each CTA its own cohort) with L2Model.causal_lag
        lag = (model.causal_lag if p.causal else model.sweep_lag) if lau.ctas_per_sm >= 2 else 0.0
        order = np.arange(T_r)
        if p.causal and plan.kernel in ("tc", "fast"):
            order = order[::-1]                    # heaviest query blocks first
        _, rows = _blocks(N, B_r)

        def build(st, slots, frames=True):
            # frames=False: the same launch without its local-memory frames (the spilling
            # builds' lower bound of DRAM writes, `levels`)
            i, zz = _grid_order(order, z, plan.extra.get("grid_order", "query-major"))
            return sweep_kernel(st, group=zk[zz], lo=j_lo[i], hi=j_hi[i],
                                step_bytes=2 * B_c * d * s, pre_bytes=rows[i].mean() * d * s,
                                post_bytes=rows[i].mean() * (d * s + 4), frame_bytes=frame,
                                local_frame_bytes=local_frame if frames else 0.0,
                                local_write_bytes=local_write if frames else 0.0,
                                lag=lag, slots=slots,
                                budget=budget, n_seq=-(-p.N_k // B_c))
        out.append((lau, build))
    elif plan.pass_ == "fwd" and plan.algorithm == "fa1":
        lau = L("fa1_fwd", I, plan.threads, plan.smem_bytes, "fa1_fwd")
        split = model.private_rmw_capacity != 1.0 or model.private_read_capacity != 1.0
        out.append((lau, lambda st, slots: _fa1_stream(st, p, B_r, B_c, slots, budget, split)))
    elif plan.pass_ == "fwd":                      # standard: S, softmax, PV
        out += _standard_forward(p, B_r, B_c, L, plan, budget)
    elif plan.algorithm == "fa2":
        out += _fa2_backward(p, B_r, B_c, L, plan, budget)
    else:
        out += _standard_backward(p, B_r, B_c, L, plan, budget)
    if plan.pass_ == "bwd" and p.group > 1:
        n = p.instances * N * d
        lau = L("bwd_group_sum", -(-n // 256), 256, 0, "bwd_group_sum")
        nk = p.batch * p.kv_heads * N * d
        out.append((lau, lambda st, slots: row_kernel(
            st, read_bytes=np.full(64, 2 * n * s / 64), write_bytes=2 * nk * s / 64, slots=1)))
    return out


GRID_ORDERS = ("query-major", "head-major", "swizzle-8")


def _grid_order(order, z, grid_order):
    """(query block, instance) of each CTA in dispatch order for the fa2 forward grid.

    query-major: blockIdx.x = query block (what the kernels do): all query blocks of an
        instance, then the next instance; head-major: blockIdx.x = instance, so
        consecutive CTAs take the same query block of different heads; swizzle-8: groups
        of 8 instances, query-major inside a group (fewer K/V streams live at once than
        head-major, more query blocks of each than query-major)."""
    T_r, I = order.size, z.size
    if grid_order == "query-major":
        return np.tile(order, I), np.repeat(z, T_r)
    if grid_order == "head-major":
        return np.repeat(order, I), np.tile(z, T_r)
    if grid_order == "swizzle-8":
        g = 8
        ii, zz = [], []
        for z0 in range(0, I, g):
            zs = z[z0:z0 + g]
            ii.append(np.repeat(order, zs.size))
            zz.append(np.tile(zs, T_r))
        return np.concatenate(ii), np.concatenate(zz)
    raise ValueError(f"grid_order={grid_order!r} is not known; allowed: {', '.join(GRID_ORDERS)}")


def _active_tiles(p, B_r, B_c):
    a = _active_prefix(p.N, B_r, B_c, p.causal)
    ii = np.repeat(np.arange(a.size), a)
    jj = np.arange(a.sum()) - np.repeat(np.cumsum(a) - a, a)
    return ii, jj


def _tile_pass(st, p, B_r, B_c, slots, budget, a_of, b_of, a_bytes, b_bytes, out_bytes):
    """Tile kernels (S = QK^T, dP = dO V^T): CTA per active tile per instance, launch
    order instance-major, tiles row-major; coarsened by merging key tiles if too many."""
    ii, jj = _active_tiles(p, B_r, B_c)
    I = p.instances
    z, zk = _instances(p)
    q = _coarse(ii.size * I * 3, budget)
    if q > 1:                                   # merge q consecutive key tiles of a row
        keep = (jj % q) == 0
        ii, jj = ii[keep], jj[keep] // q
    zz = np.repeat(z, ii.size)
    i = np.tile(ii, I)
    j = np.tile(jj, I)
    big = 1 << 30
    return tile_kernel(st, a_blk=a_of(zz, zk[zz], i) * big + i, a_bytes=a_bytes,
                       b_blk=b_of(zz, zk[zz], j) * big + j, b_bytes=b_bytes * q,
                       out_bytes=out_bytes * q, slots=max(1, slots // q))


def _row_pass(st, p, B_r, B_c, slots, read_per_elem, write_per_elem):
    """Row kernels (softmax, dS): per query block the active row entries are read and
    written once (read_per_elem / write_per_elem bytes per N x N entry)."""
    a = _active_prefix(p.N, B_r, B_c, p.causal)
    _, rows = _blocks(p.N, B_r)
    cols = np.minimum(a * B_c, p.N)
    ent = np.tile(rows * cols, p.instances).astype(np.float64)
    return row_kernel(st, read_bytes=ent * read_per_elem, write_bytes=ent * write_per_elem,
                      slots=max(1, slots // B_r))


def _standard_forward(p, B_r, B_c, L, plan, budget):
    N, d, s, I = p.N, p.d, p.itemsize, p.instances
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    ii, _ = _active_tiles(p, B_r, B_c)
    z, zk = _instances(p)
    a = _active_prefix(N, B_r, B_c, p.causal)
    out = [(L("std_S", ii.size * I, plan.threads, plan.smem_bytes, "std_S"),
            lambda st, slots: _tile_pass(st, p, B_r, B_c, slots, budget,
                                         lambda z_, zk_, i: z_, lambda z_, zk_, j: zk_ + (1 << 20),
                                         B_r * d * s, B_c * d * s, B_r * B_c * s)),
           (L("std_softmax", N * I, min(128, 1 << (N - 1).bit_length()), 4 * N, "std_softmax"),
            lambda st, slots: _row_pass(st, p, B_r, B_c, slots, s, s))]

    def pv(st, slots):
        i = np.tile(np.arange(T_r), I)
        zz = np.repeat(z, T_r)
        return sweep_kernel(st, group=zk[zz], lo=np.zeros(i.size), hi=a[i],
                            step_bytes=B_c * d * s, step_private_bytes=B_r * B_c * s,
                            post_bytes=B_r * d * s, slots=slots, budget=budget, n_seq=T_c)
    out.append((L("std_PV", T_r * I, plan.threads, plan.smem_bytes, "std_PV"), pv))
    return out


def _fa1_stream(st: Stream, p, B_r, B_c, slots, budget, split=False):
    """Algorithm 1: one CTA per instance; O, l, m initialised; for each key block j, K_j
    and V_j read once, then every active query block's Q_i, O_i, l_i, m_i read and O_i,
    l_i, m_i written. Query blocks are grouped (at most 64 groups) and key blocks sampled
    (weights), both to keep the stream within the budget. split (v10 what-if): Q_i a tile
    of its own (read only) beside O_i, l_i, m_i (read and written), so that the two can
    have their own capacity edges (`L2Model.private_rmw_capacity`); without it one tile
    holds the four."""
    N, d, s, I = p.N, p.d, p.itemsize, p.instances
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    gq = max(1, -(-T_r // 64))                 # query blocks per group
    G = -(-T_r // gq)
    first = _first_query_block(N, B_r, B_c, p.causal)       # per key block j
    n_js = max(1, min(T_c, budget // max(1, I * ((2 if split else 1) * G + 2))))
    js = np.unique(np.linspace(0, T_c - 1, n_js).round().astype(np.int64))
    w = T_c / js.size
    per_row_rd = (2 * d * s + 8)               # Q_i, O_i, l_i, m_i per row
    per_row_wr = (d * s + 8)
    grp_rows = gq * B_r
    # all instances run concurrently in waves of `slots` CTAs of equal length. One CTA's
    # accesses as a template (times from its start): step 2's O, l, m initialisation of
    # every group, then per sampled key block its K_j, V_j and its active groups
    g0 = first[js] // gq
    ng = G - g0                                   # active groups per sampled key block
    tj = 1 + np.concatenate([[0], np.cumsum(ng + 1)[:-1]])   # K_j, V_j step
    nj = js.size
    cnt = ng.sum()
    grp_j = np.repeat(np.arange(nj), ng)
    grp_g = np.arange(cnt) - np.repeat(np.cumsum(ng) - ng, ng) + g0[grp_j]
    grp_t = tj[grp_j] + 1 + grp_g - g0[grp_j]
    cta_len = int(tj[-1] + ng[-1] + 1)
    t0 = (np.arange(I) // max(1, slots)) * float(cta_len)
    base = st.ids(I * G).reshape(I, G)
    kv = st.ids(I * nj).reshape(I, nj)
    # per instance, in the order the CTA issues them: init, then (K_j V_j, groups) per j
    tmpl_t = np.concatenate([np.zeros(G), tj.astype(float), grp_t.astype(float)])
    tmpl_kind = np.concatenate([np.zeros(G, int), np.ones(nj, int), np.full(cnt, 2)])
    order = np.argsort(tmpl_t, kind="stable")
    tmpl_t, tmpl_kind = tmpl_t[order], tmpl_kind[order]
    tmpl_g = np.concatenate([np.arange(G), np.zeros(nj, int), grp_g])[order]
    tmpl_j = np.concatenate([np.zeros(G, int), np.arange(nj), grp_j])[order]
    tt = (t0[:, None] + tmpl_t[None, :]).ravel()
    kind = np.tile(tmpl_kind, I)
    blk = np.where(tmpl_kind == 1, kv[:, tmpl_j], base[:, tmpl_g]).ravel()
    if split:
        # Q_i read just before O_i, l_i, m_i (inserted first: first at equal times)
        qid = st.ids(I * G).reshape(I, G)
        g2 = tmpl_kind == 2
        st.add((t0[:, None] + tmpl_t[None, g2]).ravel(), qid[:, tmpl_g[g2]].ravel(),
               grp_rows * d * s, True, False, w)
        per_row_rd = per_row_wr
    nbytes = np.select([kind == 0, kind == 1],
                       [grp_rows * per_row_wr, 2 * B_c * d * s], grp_rows * per_row_rd)
    st.add(tt, blk, nbytes, kind != 0, kind != 1, np.where(kind == 0, 1.0, w),
           np.where(kind == 1, nbytes, grp_rows * per_row_wr))
    n_acc = int(I * (nj + (2 if split else 1) * cnt))
    # the resident size is the read footprint; writes back only O, l, m
    return n_acc


def _fa2_backward(p, B_r, B_c, L, plan, budget):
    N, d, s, I = p.N, p.d, p.itemsize, p.instances
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    z, zk = _instances(p)
    _, rows = _blocks(N, B_r)
    out = [(L("fa2_bwd_pre", T_r * I, plan.threads, 0, "fa2_bwd_pre"),
            lambda st, slots: row_kernel(st, read_bytes=np.full(T_r * I, 2.0 * B_r * d * s),
                                         write_bytes=B_r * (4 + 4 * d), slots=slots))]
    first = _first_query_block(N, B_r, B_c, p.causal)

    def main(st, slots):
        j = np.tile(np.arange(T_c), I)
        zz = np.repeat(z, T_c)
        if p.causal and plan.extra.get("causal_grid") == "instance-major":
            # the fast backward's causal grid (instances, T_c): key block j = 0 of every
            # head first (its query-block stagger is not modelled)
            j, zz = np.repeat(np.arange(T_c), I), np.tile(z, T_c)
        kv = (zk[zz] * T_c + j) + (5 << 40)
        # per query block: Q_i, dO_i (dtype), L_i, D_i (fp32) read; dQacc_i (fp32) RMW
        return sweep_kernel(st, group=zz, lo=first[j], hi=np.full(j.size, T_r),
                            step_bytes=B_r * (2 * d * s + 8 + 4 * d), step_wr=True,
                            step_write_bytes=B_r * 4 * d,
                            pre_shared=kv, pre_shared_bytes=2 * B_c * d * s,
                            post_bytes=2 * B_c * d * s, slots=slots, budget=budget, n_seq=T_r)
    out.append((L("fa2_bwd_main", T_c * I, plan.threads, plan.smem_bytes, "fa2_bwd_main"), main))
    n = I * N * d
    out.append((L("bwd_convert", -(-n // 256), 256, 0, "bwd_convert"),
                lambda st, slots: row_kernel(st, read_bytes=np.full(64, 4.0 * n / 64),
                                             write_bytes=s * n / 64, slots=1)))
    return out


def _standard_backward(p, B_r, B_c, L, plan, budget):
    N, d, s, I = p.N, p.d, p.itemsize, p.instances
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    z, zk = _instances(p)
    a = _active_prefix(N, B_r, B_c, p.causal)
    first = _first_query_block(N, B_r, B_c, p.causal)
    shm = plan.smem_bytes

    def colsweep(st, slots, shared_of_z):      # dV_j = sum_i P_ij^T dO_i ; dK_j likewise
        j = np.tile(np.arange(T_c), I)
        zz = np.repeat(z, T_c)
        return sweep_kernel(st, group=shared_of_z(zz), lo=first[j], hi=np.full(j.size, T_r),
                            step_bytes=B_r * d * s, step_private_bytes=B_r * B_c * s,
                            post_bytes=B_c * d * s, slots=slots, budget=budget, n_seq=T_r)

    def rowsweep(st, slots):                    # dQ_i = sum_j dS_ij K_j
        i = np.tile(np.arange(T_r), I)
        zz = np.repeat(z, T_r)
        return sweep_kernel(st, group=zk[zz] + (1 << 20), lo=np.zeros(i.size), hi=a[i],
                            step_bytes=B_c * d * s, step_private_bytes=B_r * B_c * s,
                            post_bytes=B_r * d * s, slots=slots, budget=budget, n_seq=T_c)
    ii, _ = _active_tiles(p, B_r, B_c)
    return [
        (L("std_bwd_dV", T_c * I, plan.threads, shm, "std_bwd_dV"),
         lambda st, slots: colsweep(st, slots, lambda zz: zz)),
        (L("std_bwd_dP", ii.size * I, plan.threads, shm, "std_bwd_dP"),
         lambda st, slots: _tile_pass(st, p, B_r, B_c, slots, budget,
                                      lambda z_, zk_, i: z_, lambda z_, zk_, j: zk_ + (1 << 20),
                                      B_r * d * s, B_c * d * s, B_r * B_c * s)),
        (L("std_bwd_dS", N * I, 128, 2 * N * s, "std_bwd_dS"),
         lambda st, slots: _row_pass(st, p, B_r, B_c, slots, 2 * s, s)),
        (L("std_bwd_dQ", T_r * I, plan.threads, shm, "std_bwd_dQ"), rowsweep),
        (L("std_bwd_dK", T_c * I, plan.threads, shm, "std_bwd_dK"),
         lambda st, slots: colsweep(st, slots, lambda zz: zz)),
    ]
