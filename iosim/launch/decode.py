"""Launch geometry of gpu.decode's main kernels (KV-cache decoding, split-KV), without
Numba: threads, lanes per key row, rows per tile and shared memory for head dim d
(elements), storage dtype dt and NR query rows per block. `plan`: the tiled kernel
(`gpu.decode.split_kv`); `flat_plan`: the flat kernel (`gpu.decode.flat`); `tc_plan`: the
tensor-core kernel (`gpu.decode.tc`). sim=True gives
the layout of the simulator's build (gpu passes its own SIM); `smem_bytes` in bytes."""
from __future__ import annotations

from ..decode import choose_num_splits
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


#: the largest NR x VW (query rows x a lane's columns) a lane of the flat kernel keeps in
#: registers, twice (the scaled Q and the O accumulator); beyond it `flat_plan` declines
MAX_ROW_REGS = 64
#: the most query rows a block of the flat kernel serves: at NR = 16 (fp32, VW = 4) ptxas
#: puts the row arrays in local memory (a 640-byte stack frame), so `flat_plan` declines
MAX_FLAT_ROWS = 8

#: Registers a thread of the flat kernel's GPU build (uncounted), by (dtype, NR, paged):
#: ptxas -v, sm_90 (CUDA 13.0's ptxas on NVVM 13.5's PTX), N_q = 1 on NG = NR query heads
#: a block (N_q > 1 builds differ by a few), the same at d = 64 and 128, no spills. Remade
#: and checked by `benchmarks/decode_flat_probe.py --registers` (no GPU). Used for the
#: blocks an SM holds (`flat_resident_blocks`); a build not listed is taken at the cap (255).
FLAT_REGISTERS = {
    ("fp16", 1, False): 112, ("fp16", 1, True): 128, ("fp16", 4, False): 166,
    ("fp16", 4, True): 162, ("fp16", 8, False): 255, ("fp16", 8, True): 255,
    ("bf16", 1, False): 112, ("bf16", 1, True): 128, ("bf16", 4, False): 166,
    ("bf16", 4, True): 162, ("bf16", 8, False): 255, ("bf16", 8, True): 255,
    ("fp32", 1, False): 111, ("fp32", 1, True): 128, ("fp32", 4, False): 168,
    ("fp32", 4, True): 168, ("fp32", 8, False): 168, ("fp32", 8, True): 168,
}


def flat_resident_blocks(dt: str, NR: int, paged: bool, NT: int = 128,
                         regs_per_sm: int = 65536) -> int:
    """Blocks of the flat kernel one SM holds at once, as its registers allow
    (FLAT_REGISTERS, allocated per warp in units of 256): fp16 and bf16 4 (NR = 1), 3
    (NR = 4), 2 (NR = 8). Its shared memory (a few KB a block) never binds first."""
    regs = FLAT_REGISTERS.get((dt, int(NR), bool(paged)), 255)
    per_warp = -(-regs * 32 // 256) * 256
    return max(1, regs_per_sm // (per_warp * (NT // 32)))


def flat_plan(d: int, dt: str, NR: int, *, vec_ok: bool = True, sim: bool = False,
              threads: int | None = None, rows_per_group: int | None = None) -> dict | None:
    """Compile-time layout of the flat kernel for head dim d (elements), storage dtype dt
    and NR query rows a block: NT threads, VW elements a lane, LPR lanes a key row, NGRP
    groups, KPG rows a group per tile, TB rows a tile, vec (16-byte loads), smem_bytes
    (dynamic shared memory, bytes). None where the flat kernel does not apply (head dims
    whose row does not map onto a power-of-two lane group, NR x VW > MAX_ROW_REGS or
    NR > MAX_FLAT_ROWS):
    the tiled kernel runs those. threads / rows_per_group override NT / KPG (benchmarks)."""
    itemsize = DTYPES[dt].itemsize
    if sim:
        NT, VW, LPR, vec = 16, d, 1, False
        KPG = 2
    else:
        NT = 128
        VW = 16 // itemsize
        if d % VW:
            return None
        LPR = d // VW
        while LPR > 32:
            VW *= 2
            LPR = d // VW
        if LPR & (LPR - 1) or 32 % LPR:
            return None
        if NR * VW > MAX_ROW_REGS or NR > MAX_FLAT_ROWS:
            return None
        # bf16 too: the flat kernel widens 16-byte words itself (gpu.decode.flat)
        vec = bool(vec_ok) and VW * itemsize == 16
        KPG = 4 if NR * VW <= 16 else 2
    if threads is not None:
        NT = int(threads)
    if rows_per_group is not None:
        KPG = int(rows_per_group)
    if NT % LPR or NT % 32 and not sim:
        raise ValueError(f"threads={NT} is not allowed; allowed: a multiple of 32 and of "
                         f"{LPR} lanes a row")
    NGRP = NT // LPR
    f32 = NGRP * NR * d + 2 * NGRP * NR
    return dict(kernel="flat", NT=NT, VW=VW, LPR=LPR, NGRP=NGRP, KPG=KPG, TB=NGRP * KPG,
                vec=vec, smem_bytes=4 * max(f32, NR * d))


#: the tensor-core kernel's layout when none is asked for: warps a block, key rows a warp's
#: tile (B_c), tiles a warp keeps in its cp.async pipeline. The fastest or within 1 % of it
#: at each of the five shapes where decode_flat_probe --tc timed all eight layouts (H100,
#: fp16, 2026-12-07: GQA 32/8 at B = 8, 64 and 1, d = 64 and 128; MQA 8/1 at B = 8)
TC_DEFAULT = dict(warps=8, block_keys=16, stages=2)
#: what `tc_plan` allows for each of them
TC_CHOICES = dict(warps=(1, 2, 4, 8), block_keys=(16, 32, 64), stages=(2, 3, 4))
#: Registers a thread of the tensor-core kernel's GPU build, by (d, block_keys, paged):
#: ptxas -v, sm_90 (CUDA 13.0's ptxas on nvJitLink 13.5's linked PTX), fp16, N_q = 1 on 4
#: query heads a block, 2 stages, uncounted, no spills; a build not listed is taken at the
#: cap (255)
TC_REGISTERS = {(64, 16, False): 94, (64, 16, True): 154, (64, 32, False): 126,
                (64, 32, True): 162, (128, 16, False): 158, (128, 16, True): 168,
                (128, 32, False): 173, (128, 32, True): 174}
#: shared memory an SM has for blocks (H100 / H200: 228 KB) and what each block reserves
SMEM_PER_SM, SMEM_RESERVED = 228 * 1024, 1024


def tc_plan(d: int, dt: str, NR: int, *, vec_ok: bool = True, sim: bool = False,
            warps: int | None = None, block_keys: int | None = None,
            stages: int | None = None) -> dict | None:
    """Compile-time layout of the tensor-core kernel for head dim d (elements), storage
    dtype dt and NR query rows a block (the rows of one mma tile: NR <= 16): NW warps, NT
    threads, BC key rows a warp's tile (the paper's B_c), STG tiles in a warp's pipeline,
    SH row stride of the shared tiles (elements, d + 8), smem_bytes (dynamic shared
    memory, bytes). None where it does not apply: the simulator (linked C++ cannot run
    there), fp32, d not a multiple of 16 or above 128 (the Q fragments and O accumulators
    stay in registers up to there), NR > 16, caches not 16-byte aligned. warps,
    block_keys, stages override TC_DEFAULT (benchmarks); ValueError outside TC_CHOICES."""
    if sim or dt not in ("fp16", "bf16") or d % 16 or not 16 <= d <= 128 or NR > 16 \
            or not vec_ok:
        return None
    got = dict(warps=warps, block_keys=block_keys, stages=stages)
    for name, val in got.items():
        if val is None:
            got[name] = TC_DEFAULT[name]
        elif val not in TC_CHOICES[name]:
            raise ValueError(f"{name}={val!r} is not allowed for the tensor-core decode "
                             f"kernel; allowed: {', '.join(map(str, TC_CHOICES[name]))}")
    NW, BC, STG = got["warps"], got["block_keys"], got["stages"]
    SH = d + 8              # padded rows: the 8 rows one ldmatrix phase reads hit 8 bank groups
    SW = SH // 2
    words = 16 * SW + NW * 2 * STG * BC * SW      # Q tile, then each warp's K and V buffers
    merge = NW * 16 * (d + 2)                     # after the loop: each warp's O, m, l
    return dict(kernel="tc", NT=32 * NW, NW=NW, BC=BC, STG=STG, SH=SH, SW=SW, vec=True,
                smem_bytes=4 * max(words, merge))


#: the split-KV combine (gpu.decode.split_kv.combine_kernel): warps a block and the splits
#: each warp's lanes load before they use them. Warp w sums splits w, w + NW, ..; its loop
#: has ceil(S / (NW U)) rounds of U independent loads, not S dependent ones: with one
#: thread a column summing every split in order, the combine cost about 0.27 us a split
#: (decode_constants.json's c_s), 70 us at S = 264, beside a 10 us main kernel (MQA, B = 1)
COMBINE_WARPS = 8
COMBINE_UNROLL = 4


def combine_warps(S: int) -> int:
    """Version 3's warps for S splits (a candidate, not gpu.decode's yet: it waits on its
    GPU rows, benchmarks/decode_combine.py): the fewest powers of two that give every
    warp at least one round of U splits, at most COMBINE_WARPS. Why: a warp with no split
    to sum only costs; at 2,048 rows and S <= 4 the 8-warp blocks (2 waves of the SMs'
    thread slots) took 15-16 us where one thread a column took 8-10 (decode_combine
    rows, H100, 2026-12-07)."""
    need = -(-S // COMBINE_UNROLL)
    return min(COMBINE_WARPS, 1 << max(0, need - 1).bit_length())


def combine_plan(S: int, N_q: int, d: int, sim: bool = False, warps: int | None = None) -> dict:
    """Layout of the split-KV combine for S splits, N_q rows a (batch, head) and head dim d:
    NW warps (COMBINE_WARPS; 1 in the simulator; `warps` overrides: 1, 2, 4 or 8), NT
    threads, U splits a warp loads at once, rounds = ceil(S / (NW U)) of its loop,
    smem_bytes: the weights (S N_q), each row's sum (N_q), the warps' partial O rows
    (NW d) and the block reductions' slots (NW + NT), 4-byte words; per_sm: the blocks an
    SM holds at once (its shared memory and threads)."""
    if warps is not None and warps not in (1, 2, 4, 8):
        raise ValueError(f"warps={warps!r} is not allowed for the combine; allowed: 1, 2, 4, 8")
    NW = warps or (1 if sim else COMBINE_WARPS)
    U = COMBINE_UNROLL
    smem = 4 * (S * N_q + N_q + NW * d + NW + 32 * NW)
    return dict(NW=NW, NT=32 * NW, U=U, rounds=-(-S // (NW * U)), smem_bytes=smem,
                per_sm=max(1, _slots(smem, 32 * NW)))


def _slots(smem_bytes: int, NT: int) -> int:
    """Blocks of NT threads and smem_bytes of shared memory one SM holds at once, as its
    shared memory, its 2,048 threads and its 32 block slots allow (registers aside)."""
    return min(SMEM_PER_SM // (smem_bytes + SMEM_RESERVED), 2048 // NT, 32)


def tc_resident_blocks(lay: dict, paged: bool = False, regs_per_sm: int = 65536) -> int:
    """Blocks of the tensor-core kernel (layout `lay`, from tc_plan; paged cache or not)
    one SM holds at once, as its shared memory and its registers (TC_REGISTERS) allow."""
    regs = TC_REGISTERS.get((lay["SH"] - 8, lay["BC"], bool(paged)), 255)
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = regs_per_sm // (per_warp * lay["NW"])
    return max(1, min(_slots(lay["smem_bytes"], lay["NT"]), by_regs))


# ---------------------------------------------------------------------------------------
# What gpu.decode runs by default (main="auto", kv_reads="auto", num_splits="auto")
# ---------------------------------------------------------------------------------------
#: main decode kernels (gpu.decode's `main`)
MAIN_KERNELS = ("auto", "flat", "tiled", "tc")
def ctas_per_sm(problem, kv_reads: str, kernel: str) -> int:
    """Thread blocks per SM the "auto" split count aims for with main kernel `kernel`
    ("flat", "tiled" or "tc") on an iosim.decode.DecodeProblem: the tiled kernel's rule
    was measured with one; the flat kernel holds its loads in registers and wants every SM
    full: as many blocks as its registers let an SM hold (`flat_resident_blocks`), so
    that no split waits for a second wave; the tensor-core kernel likewise, as many as its
    shared memory and registers allow (`tc_resident_blocks`)."""
    if kernel == "tiled":
        return 1
    if kernel == "tc":
        lay = tc_plan(problem.d, problem.dtype, block_rows(problem, kv_reads))
        return 1 if lay is None else tc_resident_blocks(lay, problem.paged)
    return flat_resident_blocks(problem.dtype, block_rows(problem, kv_reads), problem.paged)


#: a ragged batch's split count (flat and tensor-core kernels): aim at RAGGED_WAVES waves of
#: the SMs' block slots, so that the longest sequence's chunks are not left running alone
#: while the short sequences' blocks have finished, with no chunk of the longest sequence
#: under RAGGED_MIN_ROWS rows, and never fewer splits than a uniform batch's rule.
#: decode_ragged_splits (H100, fp16, d = 128, lengths uniform in [N_kv / 8, N_kv],
#: 2026-12-07, S = 1..16): the one-wave rule lost 1-26 % to the best S at GQA / MQA batches
#: of 8 and 64, best at 3-12 waves; chunks under about 2K rows lost again (GQA, B = 8,
#: N_kv = 16K: 2,582 GB/s at S = 6, 2,549 at 8, 2,384 at 16; MQA, B = 8: 987 at S = 27
#: against 1,173 at 16, the uniform rule's)
RAGGED_WAVES = 4
RAGGED_MIN_ROWS = 2048


def auto_num_splits(problem, sm_count: int, kv_reads: str, kernel: str):
    """The split count S that gpu.decode's num_splits="auto" picks for main kernel
    `kernel` ("flat", "tiled" or "tc") on `sm_count` SMs: iosim.choose_num_splits with that
    kernel's target blocks an SM (`ctas_per_sm`); for "tc" at most one wave of them (fill
    "floor": measured 5-20 % faster than the partial second wave of "ceil" at every shape
    timed, H100 2026-12-07). A ragged batch (lengths not all equal) on the flat or tc
    kernel: the larger of that and choose_num_splits at RAGGED_WAVES x the slots (fill
    "ceil") with splits of at least RAGGED_MIN_ROWS rows of the longest sequence
    (min_split_rows). Returns its SplitChoice (S and the numbers behind it). One
    function, so the kernels, the time model, the workload model and `flashsim traffic`
    cannot pick different S for the same problem."""
    per_sm = ctas_per_sm(problem, kv_reads, kernel)
    uniform = choose_num_splits(problem, sm_count, per_sm, kv_reads=kv_reads,
                                fill="floor" if kernel == "tc" else "ceil")
    if kernel == "tiled" or len(set(problem.seqlens)) < 2:
        return uniform
    ragged = choose_num_splits(problem, sm_count, RAGGED_WAVES * per_sm, kv_reads=kv_reads,
                               fill="ceil", min_split_rows=RAGGED_MIN_ROWS)
    return ragged if ragged.num_splits > uniform.num_splits else uniform


def block_rows(problem, kv_reads: str) -> int:
    """NR, the query rows one block serves: N_q, times the G query heads of a group under
    kv_reads "per_group"."""
    return (1 if kv_reads == "per_query_head" else problem.group) * problem.N_q


def check_main(main) -> str:
    """main if it names a main kernel choice (MAIN_KERNELS), else ValueError (one line)."""
    if not isinstance(main, str) or main not in MAIN_KERNELS:
        raise ValueError(f"main={main!r} is not known; allowed: {', '.join(MAIN_KERNELS)}")
    return main


#: head dims at which main="auto" may pick the tensor-core kernel: those its GPU tests ran
#: (tests/test_gpu_decode_tc.py); tc_plan takes every multiple of 16 up to 128, the others
#: by main="tc" only until a GPU run has checked them
TC_AUTO_D = (16, 64, 128)


def main_kernel(problem, kv_reads: str, main: str = "auto", vec: bool = True,
                sim: bool = False) -> str:
    """The main kernel gpu.decode runs for `main` ("auto", "flat", "tiled" or "tc") on an
    iosim.decode.DecodeProblem. "auto": "tc" wherever `tc_plan` applies (fp16 / bf16, d a
    multiple of 16 up to 128, at most 16 rows a block, on a GPU) at a head dim of
    TC_AUTO_D; else "flat" wherever
    `flat_plan` applies; else "tiled". Why (H100, fp16, 2026-12-07): on grouped heads the
    tensor-core kernel streamed K/V at 1.58x the flat kernel's rate (median over 36 GQA
    32/8 shapes of decode_bench, 1.29-1.98) and 1.87x on MQA 8/1 (1.22-3.55); on MHA (one
    row a block) 1.12x (0.97-1.29): 1.12-1.29x at batch 1 and 1.11-1.14x on paged caches
    at batch 8, against 2-3 % slower at batch 64 (tc and flat rows of two runs that day)
    and 1-3 % slower on ragged batches at each kernel's best S (decode_ragged_splits, one
    run). ValueError for an unknown main, or main="flat" / "tc" where it does not apply."""
    if check_main(main) == "tiled":
        return "tiled"
    NR = block_rows(problem, kv_reads)
    if main == "auto" and problem.d in TC_AUTO_D \
            and tc_plan(problem.d, problem.dtype, NR, vec_ok=vec, sim=sim) is not None:
        return "tc"
    if main == "tc":
        if tc_plan(problem.d, problem.dtype, NR, vec_ok=vec, sim=sim) is None:
            raise ValueError(f"main='tc' does not run {NR} query rows a block at d={problem.d} "
                             f"({problem.dtype}{', in the simulator' if sim else ''}); it takes "
                             f"fp16 or bf16, d a multiple of 16 up to 128, at most 16 rows a "
                             f"block, 16-byte aligned caches, on a GPU; allowed: main='flat', "
                             f"'tiled' or 'auto'")
        return "tc"
    ok = flat_plan(problem.d, problem.dtype, NR, vec_ok=vec, sim=sim) is not None
    if main == "flat" and not ok:
        raise ValueError(f"main='flat' does not run {NR} query rows a block at "
                         f"d={problem.d} ({problem.dtype}); allowed: main='tiled' or 'auto'")
    return "flat" if ok else "tiled"


def choose_kv_reads(problem, kv_reads: str = "auto", main: str = "auto",
                    sim: bool = False) -> str:
    """kv_reads for "auto": "per_group" (each K/V head read once for its G query heads)
    on grouped heads where the main kernel runs the group's G x N_q rows (main "auto":
    the tensor-core or the flat kernel), else "per_query_head"; an explicit value is
    returned as it is."""
    if check_main(main) and kv_reads != "auto":
        return kv_reads
    if problem.group > 1 and main != "tiled":
        if main == "auto":      # the kernel auto picks for the group's rows takes them
            if main_kernel(problem, "per_group", sim=sim) != "tiled":
                return "per_group"
        elif (tc_plan if main == "tc" else flat_plan)(
                problem.d, problem.dtype, block_rows(problem, "per_group"), sim=sim) is not None:
            return "per_group"
    return "per_query_head"
