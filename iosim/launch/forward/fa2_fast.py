"""Launch geometry of `gpu.forward.fa2_fast` (register-tiled fa2 forward, fp32 math):
thread layout and shared-memory layout of a (B_r, B_c, d) tiling, without Numba.

B_r: query rows per block, B_c: key rows per K/V tile, d: head dim (elements). A block of
`threads` = TR x TC threads gives each thread an RM x RN register tile of S = Q K^T
(RM = B_r / TR, RN = B_c / TC) and an RM x DN tile of O (DN = d / TC). Layout offsets and
strides are in float32 elements, `bytes` in bytes."""
from __future__ import annotations


#: Largest register tile side we generate (S is RM x RN, O is RM x DN registers).
MAX_R = 8
#: Preferred threads per query row (TC), best first.
TC_CHOICES = (16, 8, 32, 4, 2, 1)
#: Floats per shared-memory vector load (LDS.128).
W = 4


def _stride(n: int) -> int:
    """Row stride (floats) of Qs and Ks: >= n and = 4 (mod 32) (a multiple of 4)."""
    s = n
    while s % 32 != 4:
        s += 1
    return s


def _pad_ps(B_c: int, TC: int) -> int:
    """Row stride of P: >= B_c, a multiple of 4, and = TC (mod 32) when 4 <= TC < 32, so
    the rows of one warp (32 / TC of them, TC lanes each) fall in disjoint banks."""
    want = TC % 32 if 4 <= TC < 32 else None
    ps = B_c
    while ps % W or (want is not None and ps % 32 != want):
        ps += 1
    return ps


def layout(B_r, B_c, d, TC, TR, shfl=False, stage=0) -> dict:
    """Offsets and row strides (float32 elements) of the shared regions, total bytes
    (stage=2: two K and two V buffers)."""
    QS, KS, PS = _stride(d), _stride(d), _pad_ps(B_c, TC)
    nbuf = 2 if stage == 2 else 1
    QO = 0
    KO = QO + B_r * QS
    VO = KO + nbuf * B_c * KS
    PO = VO + nbuf * B_c * d
    RO = PO + B_r * PS
    total = RO + (0 if shfl else B_r * TC)
    return dict(QS=QS, KS=KS, PS=PS, QO=QO, KO=KO, VO=VO, PO=PO, RO=RO, elems=total,
                bytes=4 * total)


def plan(B_r, B_c, d, threads, TC=None):
    """(TR, TC, RM, RN, DN) for a tiling and thread count, or None if unsupported.
    Needs B_c % 4 == 0 and d % (4 TC) == 0 (each thread's head columns come in groups of
    4), and register tiles of at most MAX_R x MAX_R (S) and MAX_R x 16 (O)."""
    choices = (TC,) if TC else TC_CHOICES
    for tc in choices:
        if threads % tc or B_c % tc or B_c % W or d % (W * tc):
            continue
        tr = threads // tc
        if B_r % tr:
            continue
        RM, RN, DN = B_r // tr, B_c // tc, d // tc
        if RM <= MAX_R and RN <= MAX_R and DN <= 16 and RM * (RN + DN) <= 160:
            return tr, tc, RM, RN, DN
    return None


def smem_bytes(B_r, B_c, d, threads, TC=None, shfl=False, stage=0) -> int:
    p = plan(B_r, B_c, d, threads, TC)
    if p is None:
        raise ValueError(f"fa2_fast does not support B_r={B_r}, B_c={B_c}, d={d}, "
                         f"threads={threads}")
    tr, tc = p[0], p[1]
    return layout(B_r, B_c, d, tc, tr, shfl, stage)["bytes"]
