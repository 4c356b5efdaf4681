"""Launch geometry of `gpu.forward.fa1_fast` (register-tiled fa1 forward, fp32 math, one
block per instance), without Numba: B_r query rows, B_c key rows per tile, d head dim
(elements); the thread layout is `fa2_fast.plan`'s. Offsets and strides in float32
elements, `bytes` in bytes."""
from __future__ import annotations

from .fa2_fast import W, _pad_ps, _stride, plan


#: dtypes this kernel takes (fp32 math either way)
DTYPES = ("fp32", "fp16")


def layout(B_r, B_c, d, TC, shfl=False) -> dict:
    """Offsets and row strides (float32 elements) of the shared regions, total bytes."""
    QS, KS, PS = _stride(d), _stride(d), _pad_ps(B_c, TC)
    QO = 0
    OO = QO + B_r * QS
    KO = OO + B_r * QS
    VO = KO + B_c * KS
    PO = VO + B_c * d
    LO = PO + B_r * PS
    MO = LO + B_r
    RO = MO + B_r
    RO += (-RO) % W
    total = RO + (0 if shfl else B_r * TC)
    return dict(QS=QS, KS=KS, PS=PS, QO=QO, OO=OO, KO=KO, VO=VO, PO=PO, LO=LO, MO=MO,
                RO=RO, elems=total, bytes=4 * total)


def plan_error(B_r, B_c, d, threads, dt="fp32") -> str | None:
    """Why this kernel cannot run the configuration (None if it can; shared memory aside:
    see `supports`)."""
    if dt not in DTYPES:
        return f"dtype {dt}: the fast fa1 kernel takes {', '.join(DTYPES)}"
    if plan(B_r, B_c, d, threads) is None:
        return (f"B_r={B_r}, B_c={B_c}, d={d}, threads={threads}: needs threads = TR TC with "
                f"B_r / TR, B_c / TC <= 8, d / TC a multiple of 4 <= 16, B_c a multiple "
                f"of 4 (gpu.forward.fa2_fast.plan)")
    return None


def smem_bytes(B_r, B_c, d, threads, shfl=False) -> int:
    p = plan(B_r, B_c, d, threads)
    if p is None:
        raise ValueError(f"fa1_fast: {plan_error(B_r, B_c, d, threads)}")
    return layout(B_r, B_c, d, p[1], shfl)["bytes"]
