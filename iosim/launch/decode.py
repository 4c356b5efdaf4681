"""Launch geometry of `gpu.decode.split_kv` (KV-cache decoding: the split-KV main kernel),
without Numba: threads, lanes per key row, rows per tile and shared memory for head dim d
(elements), storage dtype dt and NR query rows per block. sim=True gives the layout of
the simulator's build (gpu passes its own SIM); `smem_bytes` in bytes."""
from __future__ import annotations

from ..problem import DTYPES


#: largest O accumulator entries one thread keeps in registers (NR x d / NT)
MAX_ACC = 64


def plan(d: int, dt: str, NR: int, vec_ok: bool = True, sim: bool = False,
         lanes_per_row: int | None = None) -> dict:
    """Compile-time layout for head dim d, dtype dt and NR query rows per block:
    NT threads, VW elements a lane, LPR lanes a key row, NGRP groups, KPG rows a group
    per tile, TB rows a tile, A accumulator entries a thread, shfl, vec (16-byte loads),
    red (a shared scratch for the group sums when there are no shuffles), smem_bytes.
    lanes_per_row (simulator only, a power of two dividing d and 16): run the lane-group
    layout of the GPU build in the simulator, its group sums through shared memory
    instead of warp shuffles (tests). ValueError when no layout fits."""
    itemsize = DTYPES[dt].itemsize
    if lanes_per_row is not None and not sim:
        raise ValueError("lanes_per_row is for the simulator only (on a GPU LPR follows d)")
    if sim:
        NT, LPR, VW, shfl, vec = 16, 1, d, False, False
        if lanes_per_row is not None:
            LPR = int(lanes_per_row)
            if LPR < 1 or LPR & (LPR - 1) or d % LPR or NT % LPR:
                raise ValueError(f"lanes_per_row={lanes_per_row!r} is not allowed for d={d}; "
                                 f"allowed: a power of two dividing d and {NT}")
            VW = d // LPR
    else:
        NT, shfl = 128, True
        VW = 16 // itemsize
        if d % VW or 32 % (d // VW) and d // VW > 32:
            VW = 1
        LPR = d // VW
        while LPR > 32:                        # d > 32 VW: more elements a lane
            VW *= 2
            LPR = d // VW
        if 32 % LPR:                           # a group must not straddle warps
            raise ValueError(f"d={d} is not supported by gpu.decode ({dt}); allowed: "
                             f"head dims with d / {16 // itemsize} a power of two, e.g. "
                             f"16, 32, 64, 128, 256")
        # 16-byte loads convert fp16 in PTX; bf16 (uint16 bits) loads element by element
        vec = bool(vec_ok) and VW * itemsize == 16 and dt != "bf16"
    A = -(-NR * d // NT)
    while A > MAX_ACC and NT < 1024:
        NT *= 2
        A = -(-NR * d // NT)
    if A > MAX_ACC:
        raise ValueError(f"{NR} query rows x d={d} per block is too many for gpu.decode "
                         f"(at most {MAX_ACC * 1024 // d} rows); use kv_reads='per_query_head'")
    NGRP = NT // LPR
    KPG = 2 if sim else max(1, min(64 // NGRP, 32 // VW))
    TB = NGRP * KPG
    red = LPR > 1 and not shfl
    f32 = NR * d + TB * d + NR * TB + 3 * NR + (NT if red else 0)
    return dict(NT=NT, VW=VW, LPR=LPR, NGRP=NGRP, KPG=KPG, TB=TB, A=A, shfl=shfl, vec=vec,
                red=red, smem_bytes=4 * f32)
