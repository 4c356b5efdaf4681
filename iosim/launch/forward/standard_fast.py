"""Launch geometry of `gpu.forward.standard_fast` (standard attention's register-tiled S
and PV kernels, fp32 math), without Numba. B_r: query rows per tile, B_c: key columns per
tile, d: head dim (elements); threads = TR x TC, each thread an RM x RN tile of S
(RM = B_r / TR, RN = B_c / TC) or an RM x DN tile of O (DN = d / TC). Offsets and strides
in float32 elements, `bytes` in bytes."""
from __future__ import annotations

from .fa2_fast import MAX_R, TC_CHOICES, W, _pad_ps, _stride


#: most threads of the softmax row kernel
SOFTMAX_THREADS = 256
#: dtypes these kernels take (fp32 math either way)
DTYPES = ("fp32", "fp16")


def s_plan(B_r, B_c, d, threads, TC=None):
    """(TR, TC, RM, RN) of the S kernel, or None: threads = TR TC, B_r = TR RM,
    B_c = TC RN, RM, RN <= MAX_R, d a multiple of 4."""
    if d % W or threads < 1:
        return None
    for tc in ((TC,) if TC else TC_CHOICES):
        if threads % tc or B_c % tc:
            continue
        tr = threads // tc
        if B_r % tr:
            continue
        RM, RN = B_r // tr, B_c // tc
        if RM <= MAX_R and RN <= MAX_R:
            return tr, tc, RM, RN
    return None


def pv_plan(B_r, B_c, d, threads, TC=None):
    """(TR, TC, RM, DN) of the PV kernel, or None: threads = TR TC, B_r = TR RM,
    d = TC DN with DN a multiple of 4 (<= 16), RM <= MAX_R, B_c a multiple of 4."""
    if B_c % W or threads < 1:
        return None
    for tc in ((TC,) if TC else TC_CHOICES):
        if threads % tc or d % (W * tc):
            continue
        tr = threads // tc
        if B_r % tr:
            continue
        RM, DN = B_r // tr, d // tc
        if RM <= MAX_R and DN <= 16 and RM * DN <= 64:
            return tr, tc, RM, DN
    return None


def s_layout(B_r, B_c, d) -> dict:
    """S kernel: offsets / strides in float32 elements, total bytes."""
    QS = KS = _stride(d)
    KO = B_r * QS
    elems = KO + B_c * KS
    return dict(QS=QS, KS=KS, QO=0, KO=KO, elems=elems, bytes=4 * elems)


def pv_layout(B_r, B_c, d, TC) -> dict:
    """PV kernel: Ps (PO, stride PS), Vs (VO, stride d); O_i staged at 0 (stride OS)."""
    PS = _pad_ps(B_c, TC)
    VO = B_r * PS
    OS = _stride(d)
    elems = max(VO + B_c * d, B_r * OS)
    return dict(PS=PS, PO=0, VO=VO, OS=OS, elems=elems, bytes=4 * elems)


def plan_error(B_r, B_c, d, threads, dt="fp32") -> str | None:
    """Why these kernels cannot run the configuration (None if they can; shared memory
    aside: see `supports`)."""
    if dt not in DTYPES:
        return f"dtype {dt}: the fast standard kernels take {', '.join(DTYPES)}"
    if d % W:
        return f"d={d}: must be a multiple of 4"
    if s_plan(B_r, B_c, d, threads) is None:
        return (f"B_r={B_r}, B_c={B_c}, threads={threads}: the S kernel needs threads = TR TC "
                f"with B_r / TR and B_c / TC in 1..{MAX_R}")
    if pv_plan(B_r, B_c, d, threads) is None:
        return (f"B_r={B_r}, B_c={B_c}, d={d}, threads={threads}: the PV kernel needs "
                f"threads = TR TC with B_r / TR <= {MAX_R}, d / TC a multiple of 4 <= 16, "
                f"B_c a multiple of 4")
    return None


def shared_bytes(B_r, B_c, d, threads) -> int:
    """The larger of the two tile kernels' dynamic shared memory (bytes)."""
    p = pv_plan(B_r, B_c, d, threads)
    return max(s_layout(B_r, B_c, d)["bytes"], pv_layout(B_r, B_c, d, p[1])["bytes"])
