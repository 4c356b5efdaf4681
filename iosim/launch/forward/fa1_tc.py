"""Launch geometry of `gpu.forward.fa1_tc` (fa1 forward on the tensor cores, fp16 / bf16),
without Numba: default tiling, threads, shared-memory layout and which configurations it
runs. B_r: query rows per block (16 MT per warp), B_c: key rows per K/V tile, d: head dim
(elements), MT: m-tiles per warp, stages: Q/O/l/m slots in flight. Offsets in 4-byte
words, strides in 16-bit elements (SH) or words (SW), `bytes` in bytes."""
from __future__ import annotations


#: Warps per block we generate (B_r = 16 * MT * warps).
WARPS = (1, 2, 4, 8)
#: m-tiles of 16 query rows per warp.
M_TILES = (1, 2)
#: Q/O/l/m slots (pipeline depth: the current tile and up to STAGES - 1 in flight).
STAGES = (2, 3)
#: Element types this kernel runs (bf16 data arrive as uint16 arrays of the bits).
DTYPES = ("fp16", "bf16")


#: Default (B_r, B_c, MT, stages) per head dim: B_c large, because every key block costs one
#: read of Q and one read and write of O (the requested traffic falls as 1 / B_c); 8 warps
#: of 16 rows; 3 stages (two tiles' copies in flight: the kernel is bound by those round
#: trips at batch x heads >= SMs) where the shared memory allows (d = 128: 2). Chosen from
#: ptxas (spill-free) and the traffic model before any H100 timing; scripts/fa1_tc_probe.py
#: times the alternatives.
DEFAULT_TILES = {16: (128, 128, 1, 3), 32: (128, 128, 1, 3), 48: (128, 128, 1, 3),
                 64: (128, 128, 1, 3), 80: (128, 64, 1, 3), 96: (128, 64, 1, 3),
                 128: (128, 64, 1, 2)}


def default_tiling(d: int, causal: bool = False) -> dict:
    """dict(B_r, B_c, MT, stages) this kernel runs by default at head dim d (causal or
    not)."""
    B_r, B_c, MT, stages = DEFAULT_TILES.get(d, (64, 64, 1, 2))
    return dict(B_r=B_r, B_c=B_c, MT=MT, stages=stages)


def layout(B_r: int, B_c: int, d: int, stages: int = 2) -> dict:
    """Offsets (4-byte words) inside one slot (QO, OO, LS, MS) and one K/V buffer (KO, VO,
    relative to the buffer); SLOT, KV: their sizes; KB: where buffer 0 starts (after the
    `stages` slots); row stride in halves (SH) and words (SW); total bytes."""
    SH = d + 8
    SW = SH // 2
    QO = 0
    OO = B_r * SW
    LS = 2 * B_r * SW
    MS = LS + B_r
    SLOT = MS + B_r
    KB = stages * SLOT
    KO = 0
    VO = B_c * SW
    KV = 2 * B_c * SW
    words = KB + 2 * KV
    return dict(SH=SH, SW=SW, QO=QO, OO=OO, LS=LS, MS=MS, SLOT=SLOT, KB=KB, KO=KO, VO=VO,
                KV=KV, words=words, bytes=4 * words)


def threads_per_block(B_r: int, MT: int = 1) -> int:
    """One warp (32 threads) per 16 MT query rows: 2 B_r / MT."""
    return 2 * B_r // MT


def plan_error(B_r: int, B_c: int, d: int, dt: str, MT: int = 1, stages: int = 2) -> str | None:
    """Why this kernel cannot run the configuration, or None (shared memory aside: see
    `supports`)."""
    if stages not in STAGES:
        return f"stages={stages}: the pipeline depth must be one of {STAGES}"
    if dt not in DTYPES:
        return f"dtype {dt}: the tensor-core kernel takes {' or '.join(DTYPES)} only"
    if d % 16 or not 16 <= d <= 128:
        return f"d={d}: must be a multiple of 16 in 16..128"
    if MT not in M_TILES:
        return f"MT={MT}: m-tiles per warp must be one of {M_TILES}"
    if B_r % (16 * MT) or B_r // (16 * MT) not in WARPS:
        return f"B_r={B_r}: must be 16 x MT x warps (MT={MT}), warps in {WARPS}"
    if B_c % 16 or not 16 <= B_c <= 128:
        return f"B_c={B_c}: must be a multiple of 16 in 16..128"
    return None
