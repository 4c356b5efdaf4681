"""Launch geometry of `gpu.backward.standard_tc` (standard attention's backward on the
tensor cores, fp16), without Numba. B_r: query rows per tile, B_c: key rows per tile
(16 per warp in the column-block kernels), d: head dim (elements). Offsets in 4-byte
words, strides in 16-bit elements (SH, XSH) or words (SW, XSW), `bytes` in bytes."""
from __future__ import annotations

from ..forward import standard_tc as fwd

WARPS = fwd.WARPS


def plan_error(B_r: int, B_c: int, d: int, dt: str) -> str | None:
    """Why these kernels cannot run the configuration, or None if they can (shared memory
    aside: see `supports`)."""
    err = fwd.plan_error(B_r, B_c, d, dt)
    if err:
        return err
    if B_c // 16 not in WARPS:
        return f"B_c={B_c}: must be 16 x warps, warps in {WARPS} (lines 1, 5: a warp per 16 keys)"
    return None


def default_tiling(d: int, causal: bool = False) -> dict:
    """dict(B_r, B_c): 128 x 64, as the forward (`gpu.forward.standard_tc.default_tiling`),
    so that the backward reads the P the forward wrote with the same tiling; not yet tuned
    on a GPU."""
    return dict(B_r=128, B_c=64)


def colblock_layout(B_r: int, B_c: int, d: int) -> dict:
    """X buffer b at XO + b XB (rows of B_c + 8 halves), Y buffer b at YO + b YB (rows of
    d + 8); dV_j / dK_j afterwards at word 0 (rows of d + 8)."""
    SH = d + 8
    SW = SH // 2
    XSH = B_c + 8
    XSW = XSH // 2
    XB = B_r * XSW
    YB = B_r * SW
    XO, YO = 0, 2 * XB
    words = max(YO + 2 * YB, B_c * SW)
    return dict(SH=SH, SW=SW, XSH=XSH, XSW=XSW, XO=XO, XB=XB, YO=YO, YB=YB, words=words,
                bytes=4 * words)


def shared_bytes(B_r: int, B_c: int, d: int) -> int:
    """The largest dynamic shared memory of the three tile kernels (bytes)."""
    return max(fwd.shared_bytes(B_r, B_c, d), colblock_layout(B_r, B_c, d)["bytes"])
