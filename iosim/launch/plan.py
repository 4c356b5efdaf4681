"""Kernel launch plans: which kernel a pass runs, with which tiling, threads, shared
memory and registers, for a `Hardware` preset, without a GPU.

`kernel_plan(...)` answers "which kernel and tiling does `gpu.attention` (or the backward)
run for these arguments on this GPU": the same rules `gpu` follows when it launches,
evaluated for a preset (its shared memory per block). Each launch of the pass gets its
grid, threads, dynamic shared memory, registers per thread (`REGISTERS`: ptxas's
allocation as Nsight Compute reported it on the H100) and so its CTAs per SM
(`occupancy`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..problem import Problem
from ..tiling import Tiling, sram_footprint_bytes
from ..closed_form import tile_sums
from . import tables as api
from .backward import fa2_fast as bwd_fast, fa2_tc as bwd_tc, standard_tc as bwd_std_tc
from .backward.flash import backward_shared_bytes, plain_backward_tiling
from .forward import (fa1_fast, fa1_tc, fa2_fast, fa2_tc, standard as plain, standard_fast,
                      standard_tc)

#: Registers per thread of each kernel (ptxas, as Nsight Compute's
#: launch__registers_per_thread reported them on the H100, 2026-11-25): kernel prefix ->
#: {(B_r, B_c, d, causal): registers}, with None as the key of the family's default.
REGISTERS = {
    "fa2_tc": {(128, 64, 64, False): 128, (64, 64, 64, True): 136, (64, 64, 128, False): 226,
               (64, 64, 128, True): 234, (64, 64, 64, False): 129, (128, 64, 64, True): 132,
               (128, 128, 64, False): 102, None: 128},
    "fa2_fast": {(64, 32, 128, False): 249, None: 128},
    # head dims other than 64 and 128 (issue 39): ptxas -v on the linked PTX (sm_90, CUDA
    # 13.0's ptxas; gpu.forward.fa2_tc.linked_ptx, gpu.backward.fa2_tc.linked_ptx), which
    # gives the measured builds' counts within 1-5 (128 x 64 at d = 64: 128; 64 x 64 at
    # d = 128: 228, Nsight Compute 226). Without them the default 128 let the 128 x 64
    # build at d = 80-256 hold two CTAs per SM where one runs
    "fa2_tc_d": {(128, 64, 16, False): 96, (128, 64, 32, False): 99, (128, 64, 80, False): 135,
                 (128, 64, 96, False): 167, (128, 64, 112, False): 167,
                 (128, 64, 160, False): 169, (128, 64, 192, False): 240,
                 (128, 64, 256, False): 249, (128, 64, 16, True): 83, (128, 64, 32, True): 105,
                 (128, 64, 80, True): 167, (128, 64, 96, True): 167, (128, 64, 112, True): 170,
                 (128, 64, 160, True): 227, (128, 64, 192, True): 247,
                 (128, 64, 256, True): 254},
    "fa2_bwd_tc_d": {(32, 64, 80, False): 168, (32, 128, 80, True): 182,
                     (32, 64, 96, False): 199, (32, 128, 96, True): 210,
                     (32, 64, 112, False): 250, (32, 128, 112, True): 230},
    "fa2_fwd": {None: 80}, "fa1_fwd": {None: 56}, "std_S": {None: 32}, "std_softmax": {None: 32},
    "std_PV": {None: 78}, "fa2_bwd_pre": {None: 37}, "fa2_bwd_main": {None: 90},
    "bwd_convert": {None: 28}, "bwd_group_sum": {None: 40}, "std_bwd_dV": {None: 69},
    "std_bwd_dP": {None: 32}, "std_bwd_dS": {None: 32}, "std_bwd_dQ": {None: 78},
    "std_bwd_dK": {None: 69},
    # the newer default kernels: ptxas -v as their docstrings quote it (sm_90, no spills),
    # corrected where Nsight Compute's launch__registers_per_thread differed on the
    # LEVELS_NEW run (2026-11-25-h100-levels-new): fa2_bwd_tc 213-252 (128 had been
    # assumed: 2 CTAs per SM where 1 runs), std_tc_S d = 128 (52, causal 78), fa1_tc
    # d = 128 (240), the fast pre-pass (32 registers, 256 threads)
    "fa1_tc": {(128, 128, 64, False): 230, (128, 128, 64, True): 250,
               (128, 64, 128, False): 240, None: 248},
    "std_tc_S": {(128, 64, 64, True): 60, (128, 64, 128, False): 52, (128, 64, 128, True): 78,
                 None: 48},
    "std_tc_softmax": {None: 32},
    "std_tc_PV": {(128, 64, 64, True): 96, (128, 64, 128, False): 166,
                  (128, 64, 128, True): 166, (128, 64, 96, False): 126, None: 94},
    "fa2_bwd_tc": {(64, 128, 64, False): 213, (64, 128, 64, True): 232,
                   (32, 64, 128, False): 252, (32, 128, 128, True): 250, None: 250},
    "fa2_bwd_fast": {(64, 64, 64, True): 128, (64, 64, 128, False): 241,
                     (64, 64, 128, True): 247, None: 152},
    "fa2_bwd_pre_fast": {None: 32},
    # fp32 standard / fa1 forward, fast CUDA-core kernels: ptxas -v as their docstrings
    # quote it (sm_90; fa1_fast's 512-thread default runs capped at 128); not measured
    "fa1_fast": {(64, 64, 128, False): 165, None: 128},
    "std_fast_S": {(128, 64, 64, False): 72, (64, 64, 64, False): 72, None: 128},
    "std_fast_softmax": {None: 32},
    # std_fast_PV at d = 128 (64 x 64, the default): Nsight Compute's 255 registers (run
    # 2026-11-25-h100-levels-fp32-fast; ptxas -v's 95 was another build), 2 CTAs per SM
    "std_fast_PV": {(64, 64, 128, False): 255, (64, 64, 128, True): 255,
                    (128, 128, 64, False): 128, None: 95},
    "std_tc_bwd_dV": {(128, 64, 128, False): 170, (128, 64, 128, True): 170, None: 158},
    "std_tc_bwd_dP": {(128, 64, 128, False): 50, (128, 64, 128, True): 50, None: 48},
    "std_tc_bwd_dS": {None: 32},
    "std_tc_bwd_dQ": {(128, 64, 128, False): 166, (128, 64, 128, True): 166, None: 94},
    "std_tc_bwd_dK": {(128, 64, 128, False): 170, (128, 64, 128, True): 170, None: 158},
}

for _k in ("fa2_tc", "fa2_bwd_tc"):           # (measured entries first: never replaced)
    REGISTERS[_k] = {**REGISTERS.pop(_k + "_d"), **REGISTERS[_k]}
# every other head dim of the fa2 tensor-core builds (forward 1-256, backward 1-128, the
# tiling iosim.kernel_plan picks): ptxas -v, benchmarks/tc_registers.py; below the
# entries above (which it agrees with: tests/test_plan_registers.py)
with open(os.path.join(os.path.dirname(__file__), "tc_registers.json")) as _f:
    PTXAS_REGISTERS = {k: {(r[0], r[1], r[2], r[3]): r[4] for r in rows}
                       for k, rows in json.load(_f)["builds"].items()}
for _k, _t in PTXAS_REGISTERS.items():
    REGISTERS[_k] = {**_t, **REGISTERS[_k]}
del _k, _t, _f

#: Kernels that spill registers to local memory: (prefix, B_r, B_c[, d]) -> bytes of
#: local-memory loads per thread per K/V tile. fa2_fast: ptxas -v's spill loads (88 and
#: 500 bytes at d = 64 and 128), which Nsight Compute's local loads matched (88 and 388 per
#: thread and tile); fa2_tc with B_c = 128 (non-causal builds): ptxas -v reports a
#: 400-byte stack frame (fragment arrays in local memory, no spills), Nsight Compute
#: 1,117 GB of local loads at N = 65536, 16 heads (520 per thread and tile); its causal
#: builds ran at the speed of the others. That traffic is not in the ledger; the
#: time model charges it to L2 when it overflows L1, the L2 model counts its frames'
#: DRAM traffic where `LOCAL` lists them (v6), and `levels` warns.
SPILLS = {("fa2_tc", 128, 128, 64, False): 520, ("fa2_tc", 64, 128, 64, False): 520,
          ("fa2_fast", 256, 32, 64): 88, ("fa2_fast", 256, 32, 128): 500}

#: Local memory of the spilling builds, per thread: (prefix, B_r, B_c, d[, causal]) ->
#: (frame bytes: the distinct local bytes one step touches, local store bytes per K/V
#: tile). fa2_tc's B_c = 128 builds: ptxas's 400-byte stack frame, Nsight Compute 1,041
#: bytes of local stores (and 1,040 of loads) per thread and tile at N = 65536, 16 heads
#: (run 2026-11-25-h100-levels): the whole frame rewritten every tile; fa2_fast 256 x 32
#: at d = 128: 388 bytes of local loads and 57 of stores per thread and tile (Nsight
#: Compute, 64 heads, N = 16384). Where the resident CTAs' frames overflow the L1 (256 KB
#: per SM less their shared memory, as `iosim.timing` charges t_local) every step
#: re-reads the frame from L2 (`iosim.memory.sweep_kernel`'s local_frame_bytes); the
#: fast d = 64 build's 88-byte frame fits in the L1 (its L2 reads equal its global loads)
#: and is written once per CTA. The third number: local load bytes per thread and tile
#: (Nsight Compute, the same runs), which `local_l2_bytes` counts at the L2.
LOCAL = {("fa2_tc", 128, 128, 64, False): (400, 1041, 1040),
         ("fa2_tc", 64, 128, 64, False): (400, 1041, 1040),
         ("fa2_fast", 256, 32, 128): (388, 57, 388)}
L1_BYTES = 256 * 1024
#: the shared-memory carve-outs of an sm_90 SM's 256 KB (CUDA C++ Programming Guide,
#: compute capability 9.0), bytes: the driver picks the smallest that holds the resident
#: CTAs' shared memory (+1 KB each), and the L1 keeps the rest
SMEM_CARVEOUTS = tuple(k * 1024 for k in (0, 8, 16, 32, 64, 100, 132, 164, 196, 228))


def local_of(prefix: str, B_r: int, B_c: int, d: int, causal: bool):
    """`LOCAL`'s entry of a build: keyed with its causal flag where it has one, else
    without; None for a build that is not listed."""
    return LOCAL.get((prefix, B_r, B_c, d, causal), LOCAL.get((prefix, B_r, B_c, d)))


SM_REGISTERS = 65536
SM_MAX_WARPS = 64
SM_MAX_BLOCKS = 32
SMEM_RESERVED = 1024          # per block, by the driver (sm_80 and later)


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a pass: name, grid size (CTAs), threads, dynamic shared memory
    (bytes), registers per thread, CTAs resident per SM."""
    name: str
    ctas: int
    threads: int
    smem_bytes: int
    registers: int
    ctas_per_sm: int
    spill_bytes: int = 0
    #: a build whose resident local-memory frames overflow the L1 (`LOCAL`): per CTA, the
    #: frame's distinct bytes and the bytes of it rewritten at each K/V step (0: none), and
    #: the K/V steps of all its CTAs together (the spilling builds' bounds, v13)
    local_frame_bytes: float = 0.0
    local_write_bytes: float = 0.0
    frame_steps: float = 0.0
    local_load_bytes: float = 0.0          # local loads per CTA and K/V step (`LOCAL`)


def occupancy(hw, threads: int, smem_bytes: int, registers: int) -> int:
    """CTAs resident per SM: the tightest of registers (allocated per warp in units of
    256), shared memory (+1 KB reserved per block), warps (64) and blocks (32)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = SM_REGISTERS // max(1, per_warp * warps)
    by_smem = hw.smem_per_sm_bytes // (smem_bytes + SMEM_RESERVED)
    by_warps = SM_MAX_WARPS // warps
    return max(1, min(by_regs, by_smem, by_warps, SM_MAX_BLOCKS))


def _regs(prefix, B_r, B_c, d, causal):
    table = REGISTERS[prefix]
    return table.get((B_r, B_c, d, causal), table.get((B_r, B_c, d, False), table[None]))


# ---------------------------------------------------------------------------------------
# Which kernels a pass runs (the rules of gpu.api / gpu.backward, for a preset)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """The kernel a pass runs and its tiling: kernel in 'tc' | 'fast' | 'plain' for the
    fa2 forward, 'default' otherwise; threads and shared bytes of the main kernel."""
    algorithm: str
    pass_: str
    kernel: str
    tiling: Tiling
    threads: int
    smem_bytes: int
    extra: dict = field(default_factory=dict)


def kernel_plan(algorithm: str, problem: Problem, hw, *, pass_: str = "fwd",
                kernel: str = "auto", tiling: Tiling | None = None) -> Plan:
    """The plan `gpu.attention` (pass_='fwd') or `gpu.backward.attention_backward`
    ('bwd') follows for these arguments on `hw`, without a GPU. kernel: 'auto' (the
    default choice) or 'tc' | 'fast' | 'plain' to pin the fa2 forward kernel."""
    d, dt, causal = problem.d, problem.dtype, problem.causal
    limit = hw.smem_per_block_bytes
    if not (algorithm == "fa2" and pass_ == "fwd"):
        if kernel not in ("auto", "plain", "tc", "fast"):
            raise ValueError(f"kernel={kernel!r} is not known; allowed: auto, tc, fast, plain")
        # what gpu runs by default since 2026-11-25 (gpu.api, gpu.backward): the
        # tensor-core kernels for fp16 (fa1, standard; the fa2 and standard backward), the
        # fast fa2 backward for fp32, and the fast fp32 standard and fa1 forward kernels
        # (gpu.forward.standard_fast, fa1_fast); all planned by _newer_plan
        runs = "plain"
        if kernel != "plain":
            if dt == "fp16" and (pass_ == "fwd" or algorithm in ("fa2", "standard")):
                runs = "tc"
            elif pass_ == "bwd" and algorithm == "fa2":
                runs = "fast"
            elif pass_ == "fwd" and dt == "fp32" and algorithm in api.FAST_ALGORITHMS:
                runs = "fast"
            if kernel in ("tc", "fast") and kernel != runs:
                raise ValueError(f"kernel={kernel!r}: the {algorithm} {pass_} pass has no "
                                 f"{kernel!r} kernel for {dt}")
        if runs == "fast" and pass_ == "fwd":
            return _fast_forward_plan(algorithm, problem, hw, tiling)
        if runs != "plain":
            return _newer_plan(algorithm, pass_, runs, problem, hw, tiling)
    if pass_ == "bwd":
        t = tiling or plain_backward_tiling(d, dt, algorithm)
        return Plan(algorithm, "bwd", "default", t, 128,
                    backward_shared_bytes(algorithm, t.B_r, t.B_c, d, dt))
    if algorithm != "fa2":
        t = tiling or api.plain_default_tiling(algorithm, d, dt)
        return Plan(algorithm, "fwd", "default", t, 128,
                    sram_footprint_bytes(algorithm, t.B_r, t.B_c, d, dt))
    if kernel not in ("auto", "tc", "fast", "plain"):
        raise ValueError(f"kernel={kernel!r} is not known; allowed: auto, tc, fast, plain")
    if kernel == "tc" and dt != "fp16":
        raise ValueError(f"kernel='tc' runs fp16 only; got dtype={dt}")
    choice = kernel
    if kernel in ("auto", "tc") and dt == "fp16" and tiling is None:
        tuned = (api.FA2_TC_TILES_CAUSAL if causal else api.FA2_TC_TILES).get(d)
        for B_r, B_c in ((tuned,) if tuned else ()) + api.FA2_TC_FALLBACK:
            mt = api.fa2_tc_mt(B_r, B_c, d)
            if fa2_tc.plan_error(B_r, B_c, d, dt, mt) is None and \
                    fa2_tc.layout(B_r, B_c, d)["bytes"] <= limit:
                tiling, choice = Tiling(B_r, B_c), "tc"
                break
    if choice in ("auto", "tc") and dt == "fp16" and tiling is not None:
        mt = api.fa2_tc_mt(tiling.B_r, tiling.B_c, d)
        if fa2_tc.plan_error(tiling.B_r, tiling.B_c, d, dt, mt) is None:
            return Plan("fa2", "fwd", "tc", tiling, fa2_tc.threads_per_block(tiling.B_r, mt),
                        fa2_tc.layout(tiling.B_r, tiling.B_c, d)["bytes"], {"MT": mt})
        if choice == "tc":
            raise ValueError(f"kernel='tc' cannot run B_r={tiling.B_r}, B_c={tiling.B_c}, d={d}")
    if choice in ("auto", "fast"):
        cands = ((api.FA2_FAST_TILES[d],) if d in api.FA2_FAST_TILES else ()) + api.FA2_FAST_FALLBACK
        if tiling is not None:
            cands = [(tiling.B_r, tiling.B_c, t) for (br, bc, t) in
                     list(api.FA2_FAST_TILES.values()) + list(api.FA2_FAST_FALLBACK)
                     if (br, bc) == (tiling.B_r, tiling.B_c)] + \
                    [(tiling.B_r, tiling.B_c, t) for t in api.FA2_FAST_THREADS]
        for B_r, B_c, threads in cands:
            if fa2_fast.plan(B_r, B_c, d, threads) is None:
                continue
            opts = dict(api.FA2_FAST_TUNED.get((B_r, B_c, threads), {}))
            if "TC" in opts and fa2_fast.plan(B_r, B_c, d, threads, opts["TC"]) is None:
                del opts["TC"]
            sm = fa2_fast.smem_bytes(B_r, B_c, d, threads, opts.get("TC"), shfl=True,
                                     stage=opts.get("stage", 0))
            if sm <= limit:
                return Plan("fa2", "fwd", "fast", Tiling(B_r, B_c), threads, sm, opts)
        if choice == "fast":
            raise ValueError(f"kernel='fast' cannot run {tiling} at d={d}")
    t = tiling or api.plain_default_tiling("fa2", d, dt)
    return Plan("fa2", "fwd", "plain", t, 128,
                sram_footprint_bytes("fa2", t.B_r, t.B_c, d, dt))


def _fast_forward_plan(algorithm, problem, hw, tiling):
    """The plan of fp32 standard's / fa1's fast forward kernels (gpu.forward.standard_fast,
    fa1_fast): the default tiling of gpu.api (STANDARD_FAST_TILES / FA1_FAST_TILES, then
    their FALLBACK: the first whose shared memory fits the preset's per-block limit; as
    gpu.api.other_fast_default on a GPU). Their schedule, hence their access stream, is
    the plain kernels' (S per active tile, a softmax row kernel, PV per query block; fa1:
    one block per instance); only the launch geometry differs. extra["geom"]: launch name
    -> (threads, dynamic shared bytes)."""
    d, N, limit = problem.d, problem.N, hw.smem_per_block_bytes
    tiles, fallback, _, tlist = api.other_fast_tables(algorithm)

    def fits(B_r, B_c, t):
        if algorithm == "standard":
            if standard_fast.plan_error(B_r, B_c, d, t, problem.dtype) is not None:
                return False
            return max(standard_fast.shared_bytes(B_r, B_c, d, t), 4 * N) <= limit
        if fa1_fast.plan_error(B_r, B_c, d, t, problem.dtype) is not None:
            return False
        return fa1_fast.smem_bytes(B_r, B_c, d, t, shfl=True) <= limit
    if tiling is not None:
        cands = [(tiling.B_r, tiling.B_c, t) for (br, bc, t) in
                 ((tiles[d],) if d in tiles else ()) + tuple(fallback)
                 if (br, bc) == (tiling.B_r, tiling.B_c)] + \
                [(tiling.B_r, tiling.B_c, t) for t in tlist]
    else:
        cands = ((tiles[d],) if d in tiles else ()) + tuple(fallback)
    for B_r, B_c, thr in cands:
        if fits(B_r, B_c, thr):
            break
    else:
        raise ValueError(f"the fast {algorithm} forward has no tiling for d={d}, N={N} on {hw.name}")
    if algorithm == "fa1":
        sm = fa1_fast.smem_bytes(B_r, B_c, d, thr, shfl=True)
        return Plan("fa1", "fwd", "fast", Tiling(B_r, B_c), thr, sm,
                    {"geom": {"fa1_fast": (thr, sm)}})
    sm_s = standard_fast.s_layout(B_r, B_c, d)["bytes"]
    TC = standard_fast.pv_plan(B_r, B_c, d, thr)[1]
    sm_pv = standard_fast.pv_layout(B_r, B_c, d, TC)["bytes"]
    ts = max(32, plain.softmax_threads(N, standard_fast.SOFTMAX_THREADS))
    return Plan("standard", "fwd", "fast", Tiling(B_r, B_c), thr, sm_s,
                {"geom": {"std_fast_S": (thr, sm_s), "std_fast_softmax": (ts, 4 * N),
                          "std_fast_PV": (thr, sm_pv)}})


def _newer_plan(algorithm, pass_, runs, problem, hw, tiling):
    """The plan of the newer default kernels (fa1 / standard forward and the fa2 /
    standard backward on the tensor cores, the fast fp32 fa2 backward): their default
    tilings and launch geometry from their modules (the same rules gpu follows on a GPU).
    extra["geom"]: launch name -> (threads, dynamic shared bytes)."""
    d, causal, N = problem.d, problem.causal, problem.N
    if algorithm == "fa1":
        m = fa1_tc
        t = m.default_tiling(d, causal)
        B_r, B_c = (tiling.B_r, tiling.B_c) if tiling else (t["B_r"], t["B_c"])
        thr = m.threads_per_block(B_r, t["MT"])
        sm = m.layout(B_r, B_c, d, t["stages"])["bytes"]
        return Plan("fa1", "fwd", "tc", Tiling(B_r, B_c), thr, sm,
                    {"geom": {"fa1_tc": (thr, sm)}, "MT": t["MT"], "stages": t["stages"]})
    if algorithm == "standard":
        f, b = standard_tc, bwd_std_tc
        t = f.default_tiling(d, causal)
        B_r, B_c = (tiling.B_r, tiling.B_c) if tiling else (t["B_r"], t["B_c"])
        vec = N % 8 == 0
        row = (f.row_threads(N, vec), f.row_bytes(N, 1 if pass_ == "fwd" else 2))
        tile = (2 * B_r, f.tile_layout(B_r, B_c, d)["bytes"])
        rowblock = (2 * B_r, f.rowblock_layout(B_r, B_c, d)["bytes"])
        if pass_ == "fwd":
            geom = {"std_tc_S": tile, "std_tc_softmax": row, "std_tc_PV": rowblock}
        else:
            col = (2 * B_c, b.colblock_layout(B_r, B_c, d)["bytes"])
            geom = {"std_tc_bwd_dV": col, "std_tc_bwd_dP": tile, "std_tc_bwd_dS": row,
                    "std_tc_bwd_dQ": rowblock, "std_tc_bwd_dK": col}
        return Plan("standard", pass_, "tc", Tiling(B_r, B_c), 2 * B_r, tile[1], {"geom": geom})
    if runs == "tc":                                  # fa2 backward, tensor cores
        m = bwd_tc
        t = m.default_tiling(d, causal)
        B_r, B_c = (tiling.B_r, tiling.B_c) if tiling else (t["B_r"], t["B_c"])
        thr = 32 * m.warps_of(B_c, t["MT"])
        sm = m.layout(B_r, B_c, d)["bytes"]
        return Plan("fa2", "bwd", "tc", Tiling(B_r, B_c), thr, sm,
                    {"geom": {"fa2_bwd_main": (thr, sm), "fa2_bwd_pre": (256, 0)}})
    m = bwd_fast                                      # fa2 backward, fast fp32
    t = m.default_tiling(d, problem.dtype, smem_limit=hw.smem_per_block_bytes)
    if t is None:
        raise ValueError(f"the fast fa2 backward has no tiling for d={d} on {hw.name}")
    B_r, B_c, thr = t
    if tiling:
        B_r, B_c = tiling.B_r, tiling.B_c
    sm = m.smem_bytes(B_r, B_c, d, thr)
    return Plan("fa2", "bwd", "fast", Tiling(B_r, B_c), thr, sm,
                {"geom": {"fa2_bwd_main": (thr, sm), "fa2_bwd_pre": (256, 0)},
                 "causal_grid": "instance-major"})


def _fast_smem_bytes(p: Problem, t: Tiling, threads: int, kern: str = "fa2_fast") -> float:
    """Shared-memory bytes the fast fp32 fa2 forward loads: each thread's register tile
    (RM query rows x RN keys for S = QK^T, RM x DN head columns for O += PV) loads
    RM + RN (RM + DN) words per d step (key step) for RM RN (RM DN) FMAs, so the
    loads per FMA fall as the register tile grows (gpu.forward.fa2_fast.plan)."""
    fma = float(tile_sums(p.N, t.B_r, t.B_c, p.causal)[3]) * p.d * p.instances
    if kern == "std_fast_S":
        _, _, RM, RN = standard_fast.s_plan(t.B_r, t.B_c, p.d, threads)
        return 4.0 * fma * (RM + RN) / (RM * RN)
    if kern == "std_fast_PV":
        _, _, RM, DN = standard_fast.pv_plan(t.B_r, t.B_c, p.d, threads)
        return 4.0 * fma * (RM + DN) / (RM * DN)
    opts = api.FA2_FAST_TUNED.get((t.B_r, t.B_c, threads), {}) if kern == "fa2_fast" else {}
    pl = fa2_fast.plan(t.B_r, t.B_c, p.d, threads, opts.get("TC"))
    if pl is None:
        pl = fa2_fast.plan(t.B_r, t.B_c, p.d, threads)
    _, _, RM, RN, DN = pl
    return 4.0 * fma * ((RM + RN) / (RM * RN) + (RM + DN) / (RM * DN))
