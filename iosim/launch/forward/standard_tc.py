"""Launch geometry of `gpu.forward.standard_tc` (standard attention's S, softmax and PV
kernels on the tensor cores, fp16), without Numba: default tiling, shared-memory layouts
and row-kernel threads. B_r: query rows per tile (16 per warp), B_c: key columns per tile,
d: head dim (elements), N: row length (keys). Offsets in 4-byte words, strides in 16-bit
elements (SH) or words (SW), `bytes` in bytes."""
from __future__ import annotations


#: warps per block of the tile kernels (B_r = 16 x warps: one warp per 16 query rows)
WARPS = (1, 2, 4, 8)


def plan_error(B_r: int, B_c: int, d: int, dt: str) -> str | None:
    """Why these kernels cannot run the configuration, or None if they can (shared memory
    aside: see `supports`)."""
    if dt != "fp16":
        return f"dtype {dt}: the tensor-core standard kernels take fp16 only"
    if d % 16 or not 16 <= d <= 128:
        return f"d={d}: must be a multiple of 16 in 16..128"
    if B_r % 16 or B_r // 16 not in WARPS:
        return f"B_r={B_r}: must be 16 x warps, warps in {WARPS}"
    if B_c % 16 or not 16 <= B_c <= 128:
        return f"B_c={B_c}: must be a multiple of 16 in 16..128"
    return None


def default_tiling(d: int, causal: bool = False) -> dict:
    """The tiling these kernels run by default: dict(B_r, B_c). 128 x 64 (8 warps): the
    PV kernel's double buffers then take 55 KB (d = 64) / 72 KB (d = 128), so several
    blocks share an SM; not yet tuned on a GPU (scripts/standard_tc_probe.py times
    others)."""
    return dict(B_r=128, B_c=64)


def _vec(N: int) -> bool:
    """N x N rows start 16-byte aligned (16-byte moves) iff N is a multiple of 8."""
    return N % 8 == 0


def tile_layout(B_r: int, B_c: int, d: int) -> dict:
    """S / dP kernel: Qs (AO), Ks (BO) rows of d + 8 halves; the S tile afterwards at word
    0, rows of B_c + 8 halves (OSH)."""
    SH = d + 8
    SW = SH // 2
    OSH = B_c + 8
    OSW = OSH // 2
    AO, BO = 0, B_r * SW
    words = max(BO + B_c * SW, B_r * OSW)
    return dict(SH=SH, SW=SW, OSH=OSH, OSW=OSW, AO=AO, BO=BO, words=words, bytes=4 * words)


def rowblock_layout(B_r: int, B_c: int, d: int) -> dict:
    """PV / dQ kernel: Ps buffer b at PO + b PB (rows of B_c + 8 halves), Vs buffer b at
    VO + b VB (rows of d + 8); O_i afterwards at word 0 (rows of d + 8)."""
    SH = d + 8
    SW = SH // 2
    PSH = B_c + 8
    PSW = PSH // 2
    PB = B_r * PSW
    VB = B_c * SW
    PO, VO = 0, 2 * PB
    words = max(VO + 2 * VB, B_r * SW)
    return dict(SH=SH, SW=SW, PSH=PSH, PSW=PSW, PO=PO, PB=PB, VO=VO, VB=VB, words=words,
                bytes=4 * words)


def row_threads(N: int, vec: bool) -> int:
    """Threads of a row kernel (softmax, the backward's dS): one per 8-element chunk (one
    per element when not vec), a multiple of 32, at most 128 (256 from 2048 chunks)."""
    chunks = -(-N // 8) if vec else N
    if chunks >= 2048:
        return 256
    return max(32, min(128, 32 * -(-chunks // 32)))


def row_bytes(N: int, rows: int = 1) -> int:
    """Dynamic shared memory of a row kernel holding `rows` fp16 rows of N (bytes)."""
    return rows * 2 * (-(-N // 8) * 8)


def shared_bytes(B_r: int, B_c: int, d: int) -> int:
    """The larger of the two tile kernels' dynamic shared memory (bytes)."""
    return max(tile_layout(B_r, B_c, d)["bytes"], rowblock_layout(B_r, B_c, d)["bytes"])
