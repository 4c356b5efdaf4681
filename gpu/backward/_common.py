"""What the backward kernels share, apart from `flash.py`'s main kernels: the counter rows
(BW_TENSORS, BT: the forward's tensors plus the fa2 accumulator dQacc), their counters and
ledger, the element-wise passes (dQ = dQacc, grouped-head sums of dK and dV) and their
flat launch. Its own module so that the fast and tensor-core backward kernels reach them
without importing `flash` (which imports them)."""
from __future__ import annotations

import numpy as np
from numba import cuda, int64

from iosim.backward import BackwardLedger

from .._launch import (READ, SIM, WRITE, ZERO, T, add_count, default_threads, kernel_name, launch,
                       loader, new_counters, specialisation, storer)


#: Counter rows of the backward: the forward's tensors plus the fa2 accumulator.
BW_TENSORS = tuple(T) + ("dQacc",)
BT = {name: i for i, name in enumerate(BW_TENSORS)}


def _new_counters(count):
    if not count:           # the uncounted kernels never touch it: one cached dummy
        return new_counters(False)
    return cuda.to_device(np.zeros((len(BW_TENSORS), 2), dtype=np.int64))


def _counters_to_ledger(counters, algorithm, problem, tiling) -> BackwardLedger:
    host = counters.copy_to_host()
    reads = {t: int(host[i, READ]) for t, i in BT.items() if host[i, READ]}
    writes = {t: int(host[i, WRITE]) for t, i in BT.items() if host[i, WRITE]}
    return BackwardLedger(f"{algorithm}-backward", problem, tiling, reads, writes)


# ---------------------------------------------------------------------------------------
# Element-wise passes: dQ = dQacc; grouped-head sums of dK, dV
# ---------------------------------------------------------------------------------------
@specialisation
def convert_kernel(dt, count):
    """Kernel convert(dqacc, dq, counters): dq = dqacc (problem dtype); flat views."""
    IA, IdQ = BT["dQacc"], BT["dQ"]
    stx = storer(dt)                    # float32 -> element (bf16: rounded bits)

    def kernel(acc, dq, counters):
        n = int64(0)
        for e in range(cuda.grid(1), dq.shape[0], cuda.gridsize(1)):
            dq[e] = stx(acc[e])
            n += 1
        if count:
            add_count(counters, IA, READ, n)
            add_count(counters, IdQ, WRITE, n)

    return kernel, kernel_name("bwd_convert", dt=dt, count=count)


@specialisation
def group_sum_kernel(dt, count):
    """Kernel gsum(dk_h, dv_h, dk, dv, group, counters): dk[g] = sum over the group's query
    heads of dk_h (same for dv); dk_h, dv_h: (batch * heads, N*d), dk, dv: (batch *
    kv_heads, N*d); head h of batch b belongs to kv instance (b*heads + h) // group."""
    IdK, IdV = BT["dK"], BT["dV"]
    ldx, stx = loader(dt), storer(dt)

    def kernel(dk_h, dv_h, dk, dv, group, counters):
        nd = dk.shape[1]
        nr = int64(0)
        nw = int64(0)
        for e in range(cuda.grid(1), dk.shape[0] * nd, cuda.gridsize(1)):
            zg = e // nd
            x = e % nd
            ak = ZERO
            av = ZERO
            for h in range(group):
                ak += ldx(dk_h[zg * group + h, x])
                av += ldx(dv_h[zg * group + h, x])
                nr += 1
            dk[zg, x] = stx(ak)
            dv[zg, x] = stx(av)
            nw += 1
        if count:
            add_count(counters, IdK, READ, nr)
            add_count(counters, IdV, READ, nr)
            add_count(counters, IdK, WRITE, nw)
            add_count(counters, IdV, WRITE, nw)

    return kernel, kernel_name("bwd_group_sum", dt=dt, count=count)


def _flat_launch(kern, n, *args):
    threads = default_threads() if SIM else 256
    blocks = max(1, min(4 if SIM else 4096, -(-n // threads)))
    launch(kern, blocks, threads, 0, *args)   # repeat launches skip Numba's dispatcher
