"""Launch geometry of `gpu.backward.fa2_fast` (the register-tiled fa2 backward, fp32
math), without Numba: the three phases' thread layouts, the shared-memory layout, which
configurations run and the default tiling.

B_r: query rows per Q_i block, B_c: key rows per K_j/V_j block (one thread block each),
d: head dim (elements), threads per block. Phase A: S and dP register tiles RA x CA
(threads = TRA x TCA); phase B: dK / dV tiles RB x DB over B_c x d; phase C: dQ tiles
RC x DC over B_r x d. Offsets and strides in float32 elements, `bytes` in bytes.
smem_limit: the per-block shared-memory limit (bytes); None checks no limit (gpu fills
in the device's)."""
from __future__ import annotations

from ..forward.fa2_fast import TC_CHOICES, W, _pad_ps, _stride


#: Largest side of the phase-A register tiles (S and dP are RA x CA each).
MAX_R = 8
#: Most accumulators per thread of one phase-B tensor (dK or dV: RB x DB) and of dQ (C).
MAX_ACC = 64
# Threads per row tried for each phase, best first (>= 8: quarter-warp broadcasts):
# the forward's TC_CHOICES.
#: Thread counts tried when none is given (GPU; the simulator tries its default first).
THREAD_CHOICES = (256, 128, 512, 64)
#: Default (B_r, B_c, threads) per head dim on a GPU (fp32 and fp16 inputs alike).
DEFAULT_TILES = {64: (64, 64, 256), 128: (64, 64, 256)}
#: Fallback tilings for other head dims, in order.
FALLBACK_TILES = ((64, 64, 256), (64, 32, 256), (32, 32, 128), (16, 16, 64))


def _plan_a(B_r, B_c, threads, TCA=None):
    best = None
    for tc in ((TCA,) if TCA else TC_CHOICES):
        if threads % tc or B_c % tc:
            continue
        tr = threads // tc
        if B_r % tr:
            continue
        RA, CA = B_r // tr, B_c // tc
        if RA > MAX_R or CA > MAX_R:
            continue
        score = (RA + CA) / (RA * CA) + (0.0 if tc >= 8 or TCA else 0.5)
        if best is None or score < best[0] - 1e-9:
            best = (score, tc, tr, RA, CA)
    return None if best is None else best[1:]


def _plan_x(rows, d, threads, TX=None, group_rows=False):
    """(TX, TY, R, D) for an R x D register tile per thread over rows x d, D = d / TX in
    groups of 4 columns; group_rows: rows also in groups of 4 (R % 4 == 0)."""
    best = None
    for tx in ((TX,) if TX else TC_CHOICES):
        if threads % tx or d % (W * tx):
            continue
        ty = threads // tx
        if rows % ty:
            continue
        R, D = rows // ty, d // tx
        if group_rows and R % W:
            continue
        if R * D > MAX_ACC:
            continue
        score = (R + D) / (R * D) + (0.0 if tx >= 8 or TX else 0.5)
        if best is None or score < best[0] - 1e-9:
            best = (score, tx, ty, R, D)
    return None if best is None else best[1:]


def plan(B_r, B_c, d, threads, TCA=None, TXB=None, TXC=None):
    """dict of the three phases' thread layouts (module docstring), or None."""
    if B_c % W or d % W or B_r < 1:
        return None
    a = _plan_a(B_r, B_c, threads, TCA)
    b = _plan_x(B_c, d, threads, TXB, group_rows=True)
    c = _plan_x(B_r, d, threads, TXC)
    if a is None or b is None or c is None:
        return None
    return dict(TCA=a[0], TRA=a[1], RA=a[2], CA=a[3], TXB=b[0], TYB=b[1], RB=b[2], DB=b[3],
                TXC=c[0], TYC=c[1], RC=c[2], DC=c[3])


def layout(B_r, B_c, d, TCA, dq_stage=True) -> dict:
    """Offsets and strides (float32 elements) of the shared regions, total bytes
    (dq_stage: a B_r x d staging tile for dQ, QA)."""
    KS, PS = _stride(d), _pad_ps(B_c, TCA)
    KO = 0
    VO = KO + B_c * KS
    QO = VO + B_c * KS
    dOO = QO + B_r * KS
    PO = dOO + B_r * KS
    SO = PO + B_r * PS
    LO = SO + B_r * PS
    DO = LO + B_r
    QA = -(-(DO + B_r) // W) * W
    total = QA + B_r * d if dq_stage else DO + B_r
    return dict(KS=KS, PS=PS, KO=KO, VO=VO, QO=QO, dOO=dOO, PO=PO, SO=SO, LO=LO, DO=DO,
                QA=QA, elems=total, bytes=4 * total)


def smem_bytes(B_r, B_c, d, threads, **opts) -> int:
    p = plan(B_r, B_c, d, threads, opts.get("TCA"), opts.get("TXB"), opts.get("TXC"))
    if p is None:
        raise ValueError(plan_error(B_r, B_c, d, "fp32", threads, **opts))
    return layout(B_r, B_c, d, p["TCA"], opts.get("dq_stage", True))["bytes"]


def plan_error(B_r, B_c, d, dt, threads, *, smem_limit=None, TCA=None, TXB=None, TXC=None,
               dq_stage=True, **_ignored) -> str | None:
    """Why the fast backward cannot run this configuration, or None if it can (smem_limit:
    the per-block shared-memory limit in bytes; None: no limit checked)."""
    what = f"B_r={B_r}, B_c={B_c}, d={d}, {dt}, threads={threads}"
    if dt not in ("fp32", "fp16"):      # bf16 runs on the plain backward
        return f"{what}: dtype {dt!r} is not supported (fp32, fp16)"
    if not 1 <= threads <= 1024:
        return f"{what}: threads must be in 1..1024"
    if B_c % W or d % W:
        return f"{what}: B_c and d must be multiples of 4 (16-byte shared loads)"
    if _plan_a(B_r, B_c, threads, TCA) is None:
        return (f"{what}: no S/dP register tile: need threads = TRA x TCA with TCA | B_c, "
                f"TRA | B_r, B_r / TRA and B_c / TCA <= {MAX_R}")
    if _plan_x(B_c, d, threads, TXB, group_rows=True) is None:
        return (f"{what}: no dK/dV register tile: need threads = TYB x TXB with 4 TXB | d, "
                f"4 TYB | B_c and (B_c / TYB)(d / TXB) <= {MAX_ACC}")
    if _plan_x(B_r, d, threads, TXC) is None:
        return (f"{what}: no dQ register tile: need threads = TYC x TXC with 4 TXC | d, "
                f"TYC | B_r and (B_r / TYC)(d / TXC) <= {MAX_ACC}")
    p = plan(B_r, B_c, d, threads, TCA, TXB, TXC)
    need = layout(B_r, B_c, d, p["TCA"], dq_stage)["bytes"]
    if smem_limit is not None and need > smem_limit:
        return f"{what}: needs {need} bytes of shared memory, this device allows {smem_limit}"
    return None


def supports(B_r, B_c, d, dt, threads, **opts) -> bool:
    """True if the fast backward runs this configuration (see `plan_error`)."""
    return plan_error(B_r, B_c, d, dt, threads, **opts) is None


def default_tiling(d, dt="fp32", smem_limit=None) -> tuple[int, int, int] | None:
    """(B_r, B_c, threads) of the fast backward for head dim d within smem_limit (bytes per
    block; None: no limit), or None."""
    cands = ((DEFAULT_TILES[d],) if d in DEFAULT_TILES else ()) + FALLBACK_TILES
    for B_r, B_c, t in cands:
        if supports(B_r, B_c, d, dt, t, smem_limit=smem_limit):
            return B_r, B_c, t
    return None
