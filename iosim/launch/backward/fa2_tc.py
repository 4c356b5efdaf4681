"""Launch geometry of `gpu.backward.fa2_tc` (the fa2 backward's main kernel on the tensor
cores, fp16 / bf16), without Numba. B_c: key rows per K_j/V_j block (16 MT per warp),
B_r: query rows per Q_i block, d: head dim (elements, padded to 16 on chip), MT: key
m-tiles per warp, DN: dQ_i columns per work item. Offsets in 4-byte words, strides in
16-bit elements (SH, DSH) or words (SW, DSW), `bytes` in bytes."""
from __future__ import annotations


#: Warps per block we generate (B_c = 16 * MT * warps).
WARPS = (2, 4, 8)
#: m-tiles of 16 key rows per warp.
M_TILES = (1, 2)
#: Element types this kernel runs (bf16 data arrive as uint16 arrays of the bits).
DTYPES = ("fp16", "bf16")


def padded(d: int) -> int:
    """The head dim the tile products run at: d rounded up to 16 (the shared tiles' columns
    d .. padded(d) - 1 hold zeros; gpu.forward.fa2_tc does the same)."""
    return -(-d // 16) * 16


def warps_of(B_c: int, MT: int) -> int:
    """Warps per block: one per 16 MT key rows of K_j."""
    return B_c // (16 * MT)


def layout(B_r: int, B_c: int, d: int) -> dict:
    """Offsets (4-byte words) of Ks, Vs, Qs (buffer b at QO + b QB), dOs (DOO + b QB),
    Ls (LO + b B_r), Ds (DSTO + b B_r), dSs; row strides in halves (SH, DSH) and words
    (SW, DSW); total bytes."""
    SH = padded(d) + 8
    SW = SH // 2
    DSH = B_r + 8
    DSW = DSH // 2
    KO = 0
    VO = B_c * SW
    QO = 2 * B_c * SW
    QB = B_r * SW
    DOO = QO + 2 * QB
    LO = DOO + 2 * QB
    DSTO = LO + 2 * B_r
    DSO = DSTO + 2 * B_r
    words = DSO + B_c * DSW
    return dict(SH=SH, SW=SW, DSH=DSH, DSW=DSW, KO=KO, VO=VO, QO=QO, QB=QB, DOO=DOO,
                LO=LO, DSTO=DSTO, DSO=DSO, words=words, bytes=4 * words)


def plan_error(B_r: int, B_c: int, d: int, dt: str, MT: int = 1) -> str | None:
    """Why this kernel cannot run the configuration, or None if it can (shared memory
    aside: see `supports`)."""
    if dt not in DTYPES:
        return f"dtype {dt}: the tensor-core backward takes {' or '.join(DTYPES)} only"
    if not 1 <= d <= 128:
        return (f"d={d}: the tensor-core backward takes head dims 1..128 (padded to 16 on "
                f"chip; above 128 dK_j's and dV_j's accumulators would not fit in registers)")
    if MT not in M_TILES:
        return f"MT={MT}: key m-tiles per warp must be one of {M_TILES}"
    if B_c % (16 * MT) or warps_of(B_c, MT) not in WARPS:
        return f"B_c={B_c}: must be 16 x MT x warps (MT={MT}), warps in {WARPS}"
    if B_r % 16 or not 16 <= B_r <= 128:
        return f"B_r={B_r}: must be a multiple of 16 in 16..128"
    return None


def default_tiling(d: int, causal: bool = False) -> dict:
    """The tiling and options this kernel runs by default: dict(B_r, B_c, MT, kreg, DN),
    the fastest spill-free choice in the H100 timings of the main kernel alone (batch x
    heads = 16, N = 4096; results data set, kind `bench`, what `bwd_main`). d <= 64:
    64 x 128, 8 warps of 16 key rows, dQ_i in pieces of 16 rows x DN = 32 columns so all
    8 warps share them (1.57 ms; DN = 64: 1.66 ms, 4 warps idle in that phase); causal
    DN = 64 (1.23 ms; 32: 1.32). 64 x 128 with MT = 2 (4 warps of 32 keys) was ~10%
    faster but spills 700 bytes a thread. d = 128: 32 x 64 (4 warps; few query rows per
    tile keep S^T and dP^T in registers beside dK_j, dV_j: 2.45 ms; 64 x 128 was 2.23 ms
    but spills 40 bytes), causal 32 x 128 (at 32 x 64 the masking code spilled 12 bytes)."""
    if padded(d) <= 64:
        return dict(B_r=64, B_c=128, MT=1, kreg=False,
                    DN=padded(d) if causal else _piece(padded(d)))
    return dict(B_r=32, B_c=128 if causal else 64, MT=1, kreg=False, DN=dq_cols(d))


def holds_kv(d: int, kreg=None) -> bool:
    """K_w, V_w's A fragments held in registers (kreg=True; d <= 64 only: at d = 128 they
    do not fit beside the accumulators) or re-read from shared memory at each product
    (the default: as fast on the H100, 2.06 against 2.13 ms at 64 x 64, d = 64, and it
    leaves the registers to the accumulators)."""
    return False if kreg is None else bool(kreg) and padded(d) <= 64


def dq_cols(d: int) -> int:
    """Head columns of dQ_i computed per work item (DN): d up to 64 at once; at d = 128 in
    32-wide pieces, so the dQ accumulators (16 x DN per warp) fit in registers beside
    dK_j's and dV_j's (64-wide ones spilled at 32 x 64, causal)."""
    D = padded(d)
    return D if D <= 64 else _piece(D)


def _piece(D: int) -> int:
    """32 columns where they divide the padded head dim D, else 16 (D = 48, 80, 112)."""
    return 32 if D % 32 == 0 else 16
