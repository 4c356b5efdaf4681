"""Launch geometry of `gpu.backward.flash` (the plain fa1 / fa2 backward kernels) and the
plain backward's default tiling, without Numba. B_r: query rows per Q_i block, B_c: key
rows per K_j/V_j block, d: head dim (elements), dt: storage dtype; shared memory in
bytes."""
from __future__ import annotations

from ...problem import DTYPES
from ...tiling import Tiling
from ..tables import DEFAULT_SMEM_BYTES
from . import standard as backward_standard


#: square default tiles B tried in order (`default_backward_tiling`); 8 and 4 let every
#: d <= 256 fit 48 KB (fa2/fa1 fp32 d=256 needs B=4: 24,752 bytes, B=8 needs 49,760)
DEFAULT_TILES = (64, 32, 16, 8, 4)


def bwd_shared_bytes(B_r: int, B_c: int, d: int, dt: str) -> int:
    """Dynamic shared memory of `bwd_main` in bytes (module docstring layout)."""
    f32 = 2 * B_c * d + 2 * B_r * B_c + 3 * B_r
    return 4 * f32 + DTYPES[dt].itemsize * (2 * B_c * d + 2 * B_r * d)


def backward_shared_bytes(algorithm: str, B_r: int, B_c: int, d: int, dt: str) -> int:
    """Dynamic shared memory per block of `algorithm`'s tiled backward kernels (bytes):
    fa1/fa2 `bwd_shared_bytes`; standard `backward_standard.std_bwd_shared_bytes` (its
    one-row dS kernel needs 2 N elements more, checked separately)."""
    if algorithm == "standard":
        return backward_standard.std_bwd_shared_bytes(B_r, B_c, d, dt)
    return bwd_shared_bytes(B_r, B_c, d, dt)


def plain_backward_tiling(d: int, dt: str, algorithm: str = "fa2") -> Tiling:
    """The plain backward kernels' default tiling (`gpu.backward.default_backward_tiling`
    with kernel="plain", and where no faster kernel runs): the largest square tile in
    `DEFAULT_TILES` whose backward footprint (`backward_shared_bytes`, bytes) fits 48 KB;
    up to d = 128, 16 x 16 when nothing larger fits."""
    for B in DEFAULT_TILES:
        if B < 16 and d <= 128:
            # up to d = 128 the default was, and stays, 16 x 16 when nothing larger fits
            # 48 KB (fa1 / fa2 fp32 at d = 128: 51,392 bytes, above 48 KB by opt-in): the
            # measured validation configurations ran it
            return Tiling(16, 16)
        if backward_shared_bytes(algorithm, B, B, d, dt) <= DEFAULT_SMEM_BYTES:
            return Tiling(B, B)
    return Tiling(DEFAULT_TILES[-1], DEFAULT_TILES[-1])
