"""Launch geometry of `gpu.forward.fa2_tc` (fa2 forward on the tensor cores, fp16 / bf16),
without Numba: which (B_r, B_c, d, MT) it runs, its threads and its shared-memory layout.

B_r: query rows per block (16 MT per warp), B_c: key rows per K/V tile, d: head dim
(elements, padded to 16 on chip), MT: m-tiles of 16 query rows per warp. Offsets are in
4-byte words, strides in 16-bit elements (SH) or words (SW), `bytes` in bytes."""
from __future__ import annotations


#: Warps per block we generate (B_r = 16 * MT * warps).
WARPS = (1, 2, 4, 8)
#: m-tiles of 16 query rows per warp (MT): each K / V fragment feeds MT tensor-core products.
M_TILES = (1, 2)
#: Element types this kernel runs (bf16 data arrive as uint16 arrays of the bits).
DTYPES = ("fp16", "bf16")
#: Largest head dim.
D_MAX = 256
#: Largest padded head dim whose Q_w fragments are held in registers for the whole block;
#: above it S_w = Q_w K_j^T reads Q_w from shared memory at each k step (the O_w
#: accumulators, MT d/2 floats a thread, need the registers).
QREG_MAX = 128


def padded(d: int) -> int:
    """The head dim the tile products run at: d rounded up to 16 (one mma k step); the
    shared tiles' columns d .. padded(d) - 1 hold zeros."""
    return -(-d // 16) * 16


def _stride(d: int) -> int:
    """Shared row stride in 16-bit elements: padded(d) + 8, i.e. 2 padded(d) + 16 bytes, an
    odd multiple of 16 modulo 128, so the 8 rows one ldmatrix phase reads fall in 8 distinct
    groups of 4 banks (gpu/mma.cuh)."""
    return padded(d) + 8


def layout(B_r: int, B_c: int, d: int) -> dict:
    """Offsets (4-byte words) of Qs, Ks, Vs (buffer 0; buffer 1 is KV words further), Ls;
    row stride in halves (SH) and words (SW); total bytes."""
    SH = _stride(d)
    SW = SH // 2
    QO = 0
    KO = QO + B_r * SW
    VO = KO + B_c * SW
    KV = 2 * B_c * SW             # one K + V buffer
    LO = KO + 2 * KV
    words = LO + B_r
    return dict(SH=SH, SW=SW, QO=QO, KO=KO, VO=VO, KV=KV, LO=LO, words=words,
                bytes=4 * words)


def threads_per_block(B_r: int, MT: int = 1) -> int:
    """Threads per block: one warp (32 threads) per 16 MT query rows, so 2 B_r / MT."""
    return 2 * B_r // MT


def plan_error(B_r: int, B_c: int, d: int, dt: str, MT: int = 1) -> str | None:
    """Why this kernel cannot run the configuration, or None if it can (shared memory
    aside: see `supports`). MT: m-tiles of 16 query rows per warp (B_r = 16 MT warps)."""
    if dt not in DTYPES:
        return f"dtype {dt}: the tensor-core kernel takes {' or '.join(DTYPES)} only"
    if not 1 <= d <= D_MAX:
        return f"d={d}: the tensor-core kernel takes head dims 1..{D_MAX}"
    if MT not in M_TILES:
        return f"MT={MT}: m-tiles per warp must be one of {M_TILES}"
    if MT > 1 and padded(d) > QREG_MAX:
        return (f"MT={MT} at d={d}: above d={QREG_MAX} only MT=1 (the O accumulators, "
                f"MT x {padded(d) // 2} floats a thread, would not fit in registers)")
    if B_r % (16 * MT) or B_r // (16 * MT) not in WARPS:
        return f"B_r={B_r}: must be 16 x MT x warps (MT={MT}), warps in {WARPS}"
    if B_c % 16 or not 16 <= B_c <= 128:
        return f"B_c={B_c}: must be a multiple of 16 in 16..128"
    return None
