"""Backward kernels: the gradients dQ, dK, dV of exact attention, running iosim.backward's
schedules tile by tile, with an instrumented build whose own element counts equal
`iosim.backward_closed_form(...)` (compare `.counts()`).

Gradients (iosim.backward): dV = P^T dO, dP = dO V^T, D = rowsum(dO o O),
dS = P o (dP - D), dQ = scale dS K, dK = scale dS^T Q. float32 on chip; inputs and
gradients in the problem dtype; l, m, L, D and the fa2 accumulator dQacc are float32.

fa2 (FlashAttention-2 backward), four launches:
  1. `fa2_bwd_pre`, one block per (query block i, instance): read dO_i, O_i, write
     D_i = rowsum(dO_i o O_i); write dQacc_i = 0 (the accumulator's memset).
  2. `bwd_main` (fa2 variant), one block per (key block j, instance): read K_j, V_j; for
     each active query block i read Q_i, dO_i, L_i, D_i; P = exp(S - L); dV_j += P^T dO_i;
     dS = P o (dO_i V_j^T - D_i); dK_j += scale dS^T Q_i; dQacc_i += scale dS K_j with
     float32 atomic adds (each counted as one read and one write of dQacc); write dK_j,
     dV_j once.
  Dropout (dropout_p = p > 0, Algorithm 4; the plain main kernel, the fast one,
     `gpu.backward.fa2_fast`, and the tensor-core one, `gpu.backward.fa2_tc`, compile
     flag `dropout`): each entry regenerates the forward's
     keep mask Z[r, c] by Philox
     (gpu._philox, same seed and offset), dV_j += (P o Z/(1-p))^T dO_i and
     dS = P o ((dO_i V_j^T) o Z/(1-p) - D_i); nothing N x N touches HBM, counts unchanged.
  Own rows (banded fa2 builds: causal or a window; plain and fast main kernels): a query
     row whose keys all lie in the current key block j (`gpu.forward._band.own_rows`)
     takes D = rowsum(P o dP) over that tile (with dropout P o dP o Z/(1-p)), exact in
     fp32, instead of the pre-pass's rowsum(dO o O): O is stored in the input dtype, and
     its rounding error reaches dQ_i as scale (dO_i . dO_err) sum_c P K_c, largest where
     a row sees few keys (|sum_c P K_c| ~ |K|): on the flash-attn matrix's d = 59 fp16
     causal-window (128, 0) row (N_q = 1023, N_k = 1024) the first rows, 2 to 6 keys,
     carried a dQ error 2.1x PyTorch's (one fp32 pass, one rounding; the matrix allows
     2x). NumPy emulation (scripts/dq_fix_emulation.py, 40 draws at that shape): D from
     the stored O 1.00-2.47x torch's, own rows exact 1.00-1.10x. D_i is still loaded
     (counts and the ledger unchanged); the work is a row sum in the few tiles that hold
     whole rows (the first key block of a causal band, every tile of a window narrower
     than B_c), plus one pass over such rows' entries in the plain kernel. A row whose
     keys span key blocks keeps rowsum(dO o O) (the error weighs less there: sum_c P K_c
     averages many keys). The tensor-core backward (not run for band problems by
     kernel='auto') and fa1 keep rowsum(dO o O) everywhere.
  3. `bwd_convert`: read dQacc, write dQ in the problem dtype (fp32 too).
  4. grouped heads only (kv_heads < heads), `bwd_group_sum`: read every query head's
     dK_h, dV_h, write the kv_heads sums.
  `attention_backward(kernel="auto")` (default) runs launches 1 and 2 as the register-tiled
  `gpu.backward.fa2_fast` where it supports the tiling (same schedule, same counts).
  N_k != N_q and local windows (every fa2 main kernel; `kernel="auto"` picks fast where
  it supports the tiling, else plain, and tc only when asked for by name: on the flash-attn
  matrix on the H100 the tc backward, which rounds P and dS to 16 bits before its
  products as FlashAttention-2 does, exceeded 2x torch's error on three banded fp16 /
  bf16 rows that the fast and plain kernels pass; see the README): K, V, dK, dV have N_k rows, T_c = ceil(N_k / B_c); `bwd_main` (and
  `fa2_fast`'s and `fa2_tc`'s main kernels) takes the band lo, hi of gpu.forward._band
  (bottom-right aligned, iosim.problem.band_of), skips tiles outside it (`tile_in_band`,
  iosim's active tiles) and sets P = dS = 0 outside it; a row that sees no key
  (L = -inf) has P = 0 everywhere: dQ = 0, nothing added to dK, dV.
fa1 (Algorithm 4 of arXiv 2205.14135 v2): `bwd_main` (fa1 variant), ONE block
  per instance, because line 22's read-modify-write of dQ_i in HBM is not atomic: the
  outer loop over key blocks j (line 7) runs inside the block, in order. Then the group
  sum as above. Dropout (lines 14-20, compile flag `dropout`): as fa2's main kernel, Z
  regenerated per entry, dV_j += (P o Z/(1-p))^T dO_i, dS = P o (dP o Z/(1-p) - D_i)
  with D_i = rowsum(dO_i o O_i) of the forward's (dropped) O; counts unchanged.
standard (Algorithm 3 of arXiv 2205.14135 v2, one kernel per line: dV = P^T dO, dP = dO V^T,
  dS = P o (dP - rowsum(P o dP)), dQ = scale dS K, dK = scale dS^T Q, with P, dP, dS
  N x N HBM buffers): gpu.backward_standard (its docstring has the kernels, tiles and
  shared memory); stats = the forward's P. Then the group sum as above.

Shared memory of `bwd_main` (one dynamic buffer, `bwd_shared_bytes`):
    float32:      dK_j acc (B_c*d) | dV_j acc (B_c*d) | P (B_r*B_c) | dS (B_r*B_c) |
                  L_i or m_i (B_r) | D_i (B_r) | l_i (B_r)
    input dtype:  K_j (B_c*d) | V_j (B_c*d) | Q_i (B_r*d) | dO_i (B_r*d)
Per active tile (i, j) three phases over all threads of the block:
    load  Q_i, dO_i, the row statistics (fa1: D_i = rowsum(dO_i o O_i) from O_i)
    A     per entry (r, c): P = exp(scale Q_i[r].K_j[c] - L[r]) (0 if masked),
          dS = P (dO_i[r].V_j[c] - D[r])
    B/C   per (c, x): dV += sum_r P dO, dK += scale sum_r dS Q;
          per (r, x): dQ_i[r, x] += scale sum_c dS K_j (atomic into dQacc / fa1: RMW of dQ).
Non-finite inputs: a row that saw no key in the forward (L = -inf; fa1: l = 0) has P = 0;
a NaN statistic (the forward met a NaN or Inf) or a NaN score keeps P NaN, so NaN or Inf
in q, k, v, o, dO reach the gradients as NaN wherever the float64 reference has NaN.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64

import iosim
from iosim.tiling import Tiling

from .._launch import (NB_DTYPE, NEG_INF, NP_DTYPE, READ, SIM, WRITE, ZERO, add_count,
                      check_fits, default_threads, dtype_name, kernel_name, dummy_mask, launch,
                      loader, specialisation, storer)
from .. import api as _api
from .._io import _check, _output, _return_like, _to_device
from .._torch_cpu import takes_torch_cpu
from .. import _philox
from ..forward._band import OWN_ROWS, band_args, own_rows_dev, tile_in_band
from . import fa2_fast, fa2_tc, standard_tc
from . import standard as backward_standard

# the counter rows, counters, ledger and element-wise passes all backward kernels share
from ._common import (BT, BW_TENSORS, _counters_to_ledger, _flat_launch, _new_counters,
                      convert_kernel, group_sum_kernel)

# the plain kernels' launch geometry (shared memory, default tiles): iosim.launch
from iosim.launch.backward import flash as _geometry
from iosim.launch.backward.flash import backward_shared_bytes, bwd_shared_bytes, plain_backward_tiling

DEFAULT_TILES, DEFAULT_SMEM_BYTES = _geometry.DEFAULT_TILES, _geometry.DEFAULT_SMEM_BYTES
#: Algorithms with GPU backward kernels (all of iosim's backward schedules).
BACKWARD_ALGORITHMS = ("standard", "fa1", "fa2")
#: attention_backward(kernel=...), the fa2 main kernel: "auto" (fp16: the tensor-core
#: kernel where it runs the tiling; otherwise the fast kernel where it does; else the
#: plain one), "plain" (this module's kernels), "fast" (gpu.backward.fa2_fast, CUDA cores,
#: fp32 math), "tc" (gpu.backward.fa2_tc, fp16 on the tensor cores)
BACKWARD_KERNELS = ("auto", "plain", "fast", "tc")




def default_backward_tiling(d: int, dt: str, algorithm: str = "fa2",
                            kernel: str = "auto", causal: bool = False) -> Tiling:
    """The tiling attention_backward(..., kernel=kernel, causal=causal) uses when none is
    given, on this machine: fa2 fp16 with kernel "auto" or "tc" on a GPU: the tensor-core
    kernel's `fa2_tc.default_tiling(d, causal)` where it runs; fa2 with "auto" or "fast"
    on a GPU: the fast kernel's `fa2_fast.default_tiling(d, dt)` (64 x 64 at d = 64 and 128)
    where it has one. Otherwise (kernel="plain", fa1, standard, the simulator) the largest
    square tile in (64, 32, 16, 8, 4) whose backward footprint (bytes,
    `backward_shared_bytes`) fits 48 KB; up to d = 128, 16 x 16 when nothing larger fits
    (above 48 KB by opt-in, as before any d was allowed). E.g. d=64: fa1/fa2 fp32 16,
    fp16 32; standard fp32 and fp16 64; d=128: fa1/fa2 fp32 16 (51,392 bytes), fp16 16;
    d=256: fa1/fa2 fp32 4, fp16 8."""
    if algorithm == "standard" and kernel in ("auto", "tc") and \
            dt in _api.tc_dtypes(standard_tc) and not SIM:
        t = standard_tc.default_tiling(d, bool(causal))
        if standard_tc.supports(t["B_r"], t["B_c"], d, dt):
            return Tiling(t["B_r"], t["B_c"])
    if algorithm == "fa2" and kernel in ("auto", "tc") and dt in _api.tc_dtypes(fa2_tc) \
            and not SIM:
        t = fa2_tc.default_tiling(d, bool(causal))
        if fa2_tc.supports(t["B_r"], t["B_c"], d, dt, MT=t["MT"]):
            return Tiling(t["B_r"], t["B_c"])
    # --- fast-kernel hook (gpu.backward.fa2_fast) ---
    if algorithm == "fa2" and kernel in ("auto", "fast") and not SIM and \
            dt in _api.FAST_DTYPES:
        fast = fa2_fast.default_tiling(d, dt)
        if fast is not None:
            return Tiling(fast[0], fast[1])
    return plain_backward_tiling(d, dt, algorithm)




# ---------------------------------------------------------------------------------------
# fa2 preprocess: D = rowsum(dO o O), dQacc = 0
# ---------------------------------------------------------------------------------------
@specialisation
def fa2_pre_kernel(B_r, d, dt, count, threads, packed=False):
    """Kernel pre(o, do, D, dqacc, N, counters); grid (T_r, instances). `packed`: o, do,
    dqacc are (N, instances, d) (flash-attn's (total_q, heads, d); grid (ceil(total_q /
    B_r), heads)), D is (instances, N) either way."""
    IO, IdO, ID, IA = BT["O"], BT["dO"], BT["D"], BT["dQacc"]
    ldx = loader(dt)                    # element -> float32 (bf16: uint16 bits)

    def kernel(o, do, D, dqacc, N, counters):
        i = cuda.blockIdx.x
        z = cuda.blockIdx.y
        t = cuda.threadIdx.x
        r0 = i * B_r
        rows = min(B_r, N - r0)
        nO = int64(0)
        nD = int64(0)
        nA = int64(0)
        for r in range(t, rows, threads):               # D_i = rowsum(dO_i o O_i)
            acc = ZERO
            for x in range(d):
                if packed:
                    acc += ldx(do[r0 + r, z, x]) * ldx(o[r0 + r, z, x])
                else:
                    acc += ldx(do[z, r0 + r, x]) * ldx(o[z, r0 + r, x])
            D[z, r0 + r] = acc
            nO += d
            nD += 1
        for e in range(t, rows * d, threads):           # dQacc_i = 0
            if packed:
                dqacc[r0 + e // d, z, e % d] = ZERO
            else:
                dqacc[z, r0 + e // d, e % d] = ZERO
            nA += 1
        if count:
            add_count(counters, IO, READ, nO)
            add_count(counters, IdO, READ, nO)
            add_count(counters, ID, WRITE, nD)
            add_count(counters, IA, WRITE, nA)

    return kernel, kernel_name("fa2_bwd_pre", Br=B_r, d=d, dt=dt, packed=packed, count=count,
                               t=threads)


# ---------------------------------------------------------------------------------------
# Main kernel (fa2: one block per key block; fa1: Algorithm 4, one block per instance)
# ---------------------------------------------------------------------------------------
def bwd_block(alg, B_r, B_c, d, dt, banded, has_mask, count, threads, dropout=False,
              packed=False):
    """The work of one thread block of `bwd_main` (fa2: key block j_lo of one instance;
    fa1: key blocks j_lo .. j_hi - 1 of one instance, in order): the device function the
    plain main kernel (`bwd_main_kernel`) and the packed varlen one
    (gpu.backward.fa2_varlen) both run.

    block(q, k, v, o, do, s1, s2, D, dq, dk, dv, scale, N, N_k, lo, hi, z, zk, qoff, koff,
    j_lo, j_hi, mask, counters, key0, key1, offset, thr, rp): z, zk: the query / K/V
    instance (packed: the query / K/V head); qoff, koff: the first query / key row of
    this problem (0 unless packed); N, N_k: its query and key rows; lo, hi: its band (read
    only when `banded`); the rest as `bwd_main_kernel`. Element (r, x) of q, o, do, dq is
    q[z, r, x], or q[qoff + r, z, x] when `packed` (flash-attn's (total, heads, d)); of
    k, v k[zk, c, x] or k[koff + c, zk, x]; of dk, dv (per query head) dk[z, c, x] or
    dk[koff + c, z, x]; s1 and D are s1[z, qoff + r] either way. `packed`: fa2 only,
    without a block mask or dropout."""
    FA1 = alg == "fa1"
    OWN = banded and not FA1 and OWN_ROWS   # fa2 with a band: exact D of own rows
    if packed and (FA1 or dropout or has_mask):
        raise ValueError("bwd_block: packed indexing runs the fa2 variant without a block "
                         "mask or dropout only")
    DT = NB_DTYPE[dt]
    ldx, stx = loader(dt), storer(dt)      # element -> float32, float32 -> element
    F32_ELEMS = 2 * B_c * d + 2 * B_r * B_c + 3 * B_r
    X0 = F32_ELEMS * 4 // NP_DTYPE[dt].itemsize
    dK0, dV0, P0 = 0, B_c * d, 2 * B_c * d
    dS0 = P0 + B_r * B_c
    St0 = dS0 + B_r * B_c
    D0 = St0 + B_r
    l0 = D0 + B_r
    K0, V0 = X0, X0 + B_c * d
    Q0 = V0 + B_c * d
    dO0 = Q0 + B_r * d
    IQ, IK, IV, IO, IdO = BT["Q"], BT["K"], BT["V"], BT["O"], BT["dO"]
    IL, Il, Im, ID = BT["L"], BT["l"], BT["m"], BT["D"]
    IdQ, IdK, IdV, IA = BT["dQ"], BT["dK"], BT["dV"], BT["dQacc"]

    def block(q, k, v, o, do, s1, s2, D, dq, dk, dv, scale, N, N_k, lo, hi, z, zk, qoff,
              koff, j_lo, j_hi, mask, counters, key0, key1, offset, thr, rp):
        t = cuda.threadIdx.x
        sf = cuda.shared.array(0, float32)
        sx = cuda.shared.array(0, DT)
        dKs = sf[dK0:dV0]
        dVs = sf[dV0:P0]
        Ps = sf[P0:dS0]
        dSs = sf[dS0:St0]
        Sts = sf[St0:D0]                                # L_i (fa2) or m_i (fa1)
        Ds = sf[D0:l0]
        ls = sf[l0:l0 + B_r]
        Ks = sx[K0:V0]
        Vs = sx[V0:Q0]
        Qs = sx[Q0:dO0]
        dOs = sx[dO0:dO0 + B_r * d]
        nQ = int64(0)
        nK = int64(0)
        nO = int64(0)
        nS = int64(0)
        nA = int64(0)
        nW = int64(0)
        nZ = int64(0)
        nZk = int64(0)
        T_r = (N + B_r - 1) // B_r
        if FA1:
            # line 6: dQ = 0 (N_q rows), dK = 0, dV = 0 (N_k rows) in HBM
            for e in range(t, N * d, threads):
                dq[z, e // d, e % d] = stx(ZERO)
                nZ += 1
            for e in range(t, N_k * d, threads):
                dk[z, e // d, e % d] = stx(ZERO)
                dv[z, e // d, e % d] = stx(ZERO)
                nZk += 1
        for j in range(j_lo, j_hi):                     # line 7
            c0 = j * B_c
            cols = min(B_c, N_k - c0)
            cuda.syncthreads()
            for e in range(t, cols * d, threads):       # line 8: load K_j, V_j
                if packed:
                    Ks[e] = k[koff + c0 + e // d, zk, e % d]
                    Vs[e] = v[koff + c0 + e // d, zk, e % d]
                else:
                    Ks[e] = k[zk, c0 + e // d, e % d]
                    Vs[e] = v[zk, c0 + e // d, e % d]
                nK += 1
            for e in range(t, B_c * d, threads):        # line 9: dK_j, dV_j = 0 on chip
                dKs[e] = ZERO
                dVs[e] = ZERO
            for i in range(T_r):                        # line 10
                r0 = i * B_r
                rows = min(B_r, N - r0)
                if banded and not tile_in_band(r0, r0 + rows - 1, c0, c0 + cols - 1,
                                               lo, hi):  # inactive tile (outside the band)
                    continue
                if has_mask and mask[i, j] == 0:
                    continue
                cuda.syncthreads()                      # previous tile done with Q, dO, P, dS
                # line 11: load Q_i, dO_i and the row statistics
                for e in range(t, rows * d, threads):
                    if packed:
                        Qs[e] = q[qoff + r0 + e // d, z, e % d]
                        dOs[e] = do[qoff + r0 + e // d, z, e % d]
                    else:
                        Qs[e] = q[z, r0 + e // d, e % d]
                        dOs[e] = do[z, r0 + e // d, e % d]
                    nQ += 1
                for r in range(t, rows, threads):
                    Sts[r] = s1[z, qoff + r0 + r]
                    if FA1:
                        ls[r] = s2[z, r0 + r]
                        acc = ZERO                      # lines 19-20: D_i = rowsum(dO_i o O_i)
                        for x in range(d):
                            acc += ldx(do[z, r0 + r, x]) * ldx(o[z, r0 + r, x])
                        Ds[r] = acc
                        nO += d
                    else:
                        Ds[r] = D[z, qoff + r0 + r]
                    nS += 1
                cuda.syncthreads()
                # pass 0 (fa2, banded): the rows whose keys all lie in this tile ("own"
                # rows) get D = rowsum(P o dP) over it, exact, in ls, instead of the D
                # from the stored O (module docstring): P o dP per entry -> dSs (written
                # by A only later), then one thread per row adds its row in order
                # (deterministic: the counting and plain builds agree bit for bit)
                o_lo = int64(1)
                o_hi = int64(0)
                if OWN:
                    o_lo, o_hi = own_rows_dev(r0, r0 + rows - 1, c0, c0 + cols - 1, N_k,
                                              lo, hi)
                    if o_lo <= o_hi:
                        own_n = o_hi - o_lo + 1
                        for e in range(t, own_n * cols, threads):
                            r = o_lo - r0 + e // cols
                            c = e % cols
                            st = Sts[r]
                            pd = ZERO
                            if st != NEG_INF and c0 + c - r0 - r <= hi and \
                                    c0 + c - r0 - r >= lo:
                                s = ZERO
                                dp = ZERO
                                for x in range(d):
                                    s += ldx(Qs[r * d + x]) * ldx(Ks[c * d + x])
                                    dp += ldx(dOs[r * d + x]) * ldx(Vs[c * d + x])
                                if dropout:
                                    if _philox.keep(key0, key1, offset, z, r0 + r, c0 + c,
                                                    thr):
                                        dp = dp * rp
                                    else:
                                        dp = ZERO
                                pd = math.exp(s * scale - st) * dp
                            dSs[r * B_c + c] = pd
                        cuda.syncthreads()
                        for r in range(o_lo - r0 + t, o_hi - r0 + 1, threads):
                            acc = ZERO
                            for c in range(cols):
                                acc += dSs[r * B_c + c]
                            ls[r] = acc
                        cuda.syncthreads()
                # A, lines 12-21: P and dS per entry
                for e in range(t, rows * cols, threads):
                    r = e // cols
                    c = e % cols
                    p = ZERO
                    visible = True
                    if banded and (c0 + c - r0 - r > hi or c0 + c - r0 - r < lo):
                        visible = False                 # outside the band
                    st = Sts[r]
                    # a row that saw no key in the forward: fa2 L = -inf, fa1 l = 0 (then
                    # P = 0); a NaN statistic (a NaN or Inf input) keeps P NaN
                    if FA1:
                        if ls[r] == ZERO:
                            visible = False
                    elif st == NEG_INF:
                        visible = False
                    if visible:
                        s = ZERO                        # line 12: S = scale Q_i K_j^T
                        for x in range(d):
                            s += ldx(Qs[r * d + x]) * ldx(Ks[c * d + x])
                        s = s * scale
                        if FA1:                         # lines 13-14: P = exp(S - m) / l
                            p = math.exp(s - st) / ls[r]
                        else:                           # P = exp(S - L)
                            p = math.exp(s - st)
                    dp = ZERO                           # line 18: dP = dO_i V_j^T
                    for x in range(d):
                        dp += ldx(dOs[r * d + x]) * ldx(Vs[c * d + x])
                    if dropout:                         # lines 15-19: Z_ij by Philox,
                        if _philox.keep(key0, key1, offset, z, r0 + r, c0 + c, thr):
                            Ps[r * B_c + c] = p * rp    # P o Z / (1 - p) for dV
                            dp = dp * rp                # dP = (dO V^T) o Z / (1 - p)
                        else:
                            Ps[r * B_c + c] = ZERO
                            dp = ZERO
                    else:
                        Ps[r * B_c + c] = p
                    Dr = Ds[r]
                    if OWN and o_lo <= r0 + r <= o_hi:
                        Dr = ls[r]                      # own row: exact D (pass 0)
                    dSs[r * B_c + c] = p * (dp - Dr)    # line 21
                cuda.syncthreads()
                # B, lines 17 and 23: dV_j += P^T dO_i, dK_j += scale dS^T Q_i
                for e in range(t, cols * d, threads):
                    c = e // d
                    x = e % d
                    av = ZERO
                    ak = ZERO
                    for r in range(rows):
                        av += Ps[r * B_c + c] * ldx(dOs[r * d + x])
                        ak += dSs[r * B_c + c] * ldx(Qs[r * d + x])
                    dVs[e] += av
                    dKs[e] += scale * ak
                # C, line 22: dQ_i += scale dS K_j
                for e in range(t, rows * d, threads):
                    r = e // d
                    x = e % d
                    aq = ZERO
                    for c in range(cols):
                        aq += dSs[r * B_c + c] * ldx(Ks[c * d + x])
                    aq = scale * aq
                    if FA1:                             # read-modify-write of dQ_i in HBM
                        dq[z, r0 + r, x] = stx(ldx(dq[z, r0 + r, x]) + aq)
                    else:                               # one float32 atomic add
                        if packed:
                            cuda.atomic.add(dq, (qoff + r0 + r, z, x), aq)
                        else:
                            cuda.atomic.add(dq, (z, r0 + r, x), aq)
                    nA += 1
            cuda.syncthreads()
            for e in range(t, cols * d, threads):       # line 25: write dK_j, dV_j
                if packed:
                    dk[koff + c0 + e // d, z, e % d] = stx(dKs[e])
                    dv[koff + c0 + e // d, z, e % d] = stx(dVs[e])
                else:
                    dk[z, c0 + e // d, e % d] = stx(dKs[e])
                    dv[z, c0 + e // d, e % d] = stx(dVs[e])
                nW += 1
        if count:
            add_count(counters, IQ, READ, nQ)
            add_count(counters, IdO, READ, nQ)
            add_count(counters, IK, READ, nK)
            add_count(counters, IV, READ, nK)
            if FA1:
                add_count(counters, IO, READ, nO)
                add_count(counters, Im, READ, nS)
                add_count(counters, Il, READ, nS)
                add_count(counters, IdQ, READ, nA)
                add_count(counters, IdQ, WRITE, nA + nZ)
                add_count(counters, IdK, WRITE, nW + nZk)
                add_count(counters, IdV, WRITE, nW + nZk)
            else:
                add_count(counters, IL, READ, nS)
                add_count(counters, ID, READ, nS)
                add_count(counters, IA, READ, nA)
                add_count(counters, IA, WRITE, nA)
                add_count(counters, IdK, WRITE, nW)
                add_count(counters, IdV, WRITE, nW)

    return cuda.jit(device=True, inline=True)(block)


@specialisation
def bwd_main_kernel(alg, B_r, B_c, d, dt, causal, has_mask, count, threads, dropout=False,
                    window=False):
    """Kernel main(q, k, v, o, do, s1, s2, D, dq, dk, dv, scale, N, N_k, lo, hi, H, G, mask,
    counters, key0, key1, offset, thr, rp).

    q, o, do: (instances, N, d); k, v: (batch * kv_heads, N_k, d); dk, dv: (instances, N_k,
    d) per query head; N: query rows N_q, N_k: key rows; lo, hi: the int64 band of
    gpu.forward._band (row r sees key c iff lo <= c - r <= hi), read only when `causal` or
    `window` (compile flags; `band_args`): tiles outside it are skipped (`tile_in_band`,
    iosim's active tiles), entries outside it have P = dS = 0; fa2: s1 = L (instances, N), D (instances, N), dq = dQacc float32;
    fa1: s1 = m, s2 = l (instances, N), D unused, dq = dQ in the problem dtype.
    key0, key1, offset, thr (uint64), rp (float32): the dropout (gpu._philox.kernel_args),
    read only when `dropout` (fa2 and fa1). Grid fa2 (T_c, instances), fa1 (1, instances);
    `threads` threads.
    """
    FA1 = alg == "fa1"
    block = bwd_block(alg, B_r, B_c, d, dt, causal or window, has_mask, count, threads,
                      dropout)

    def kernel(q, k, v, o, do, s1, s2, D, dq, dk, dv, scale, N, N_k, lo, hi, H, G, mask,
               counters, key0, key1, offset, thr, rp):
        z = cuda.blockIdx.y
        zk = (z // H) * (H // G) + (z % H) // G        # this head's K/V instance
        if FA1:
            j_lo = 0
            j_hi = (N_k + B_c - 1) // B_c
        else:
            j_lo = cuda.blockIdx.x
            j_hi = j_lo + 1
        block(q, k, v, o, do, s1, s2, D, dq, dk, dv, scale, N, N_k, lo, hi, z, zk, int64(0),
              int64(0), j_lo, j_hi, mask, counters, key0, key1, offset, thr, rp)

    name = kernel_name(f"{alg}_bwd_main", Br=B_r, Bc=B_c, d=d, dt=dt, causal=causal,
                       window=window, mask=has_mask, dropout=dropout, count=count,
                       t=threads, noown=alg == "fa2" and bool(causal or window) and not OWN_ROWS)
    return kernel, name



# ---------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------
def _check_stats(name, x, shape, kind):
    """Device array of float32 statistics of `shape` (B, H, N)."""
    if isinstance(x, np.ndarray):
        if x.shape != shape:
            raise ValueError(f"{name} has shape {x.shape}; expected {shape} (batch, heads, N)")
        return cuda.to_device(np.ascontiguousarray(x, dtype=np.float32))
    if hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host"):
        # as gpu.api._to_device: no host-blocking sync for work on the legacy stream
        dev = x if hasattr(x, "copy_to_host") else _to_device(x, "cai")
        if tuple(dev.shape) != shape or np.dtype(dev.dtype) != np.float32:
            raise ValueError(f"{name} has shape {tuple(dev.shape)} and dtype {dev.dtype}; "
                             f"expected {shape} float32")
        return dev
    raise ValueError(f"{name} must be a float32 array of shape {shape}; got {type(x).__name__}")


def _check_P(x, shape, dt, name="P"):
    """Device array of the forward's P: `shape` (B, H, N, N), the problem dtype `dt`
    (name='Z': its dropout keep mask, uint8); bf16 as its uint16 bits (as the kernels
    take it)."""
    if isinstance(x, np.ndarray):
        if x.shape != shape or x.dtype != dt:
            raise ValueError(f"stats ({name}) has shape {x.shape} and dtype {x.dtype}; expected "
                             f"{shape} {np.dtype(dt)} (batch, heads, N, N)"
                             + (", the problem dtype" if name == "P" else ""))
        return _to_device(np.ascontiguousarray(x), "numpy")
    if (hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host")
            or _api._torch_bf16(x)):
        if hasattr(x, "copy_to_host"):
            dev = x
        elif _api._torch_bf16(x):           # no __cuda_array_interface__ for bfloat16
            dev = _to_device(x, "cai")      # its uint16 bits
        else:
            dev = cuda.as_cuda_array(x)
        got = _api.BF16 if _api._torch_bf16(x) else np.dtype(dev.dtype)
        if tuple(dev.shape) != shape or got != dt:
            raise ValueError(f"stats ({name}) has shape {tuple(dev.shape)} and dtype "
                             f"{got}; expected {shape} {np.dtype(dt)}")
        if not dev.is_c_contiguous():
            raise ValueError(f"stats ({name}) must be C-contiguous")
        return _api._bf16_bits(dev)
    raise ValueError(f"stats for algorithm='standard' must be the forward's {name}, an array "
                     f"of shape {shape} and dtype {np.dtype(dt)}; got {type(x).__name__}")


@takes_torch_cpu
def attention_backward(q, k, v, o, do, stats, *, algorithm="fa2", causal=False, scale=None,
                       block_rows=None, block_cols=None, block_mask=None, count_traffic=False,
                       threads=None, kernel="auto", tc_options=None, poison=None,
                       dropout_p=0.0, dropout_seed=0, dropout_offset=0, window=(-1, -1)):
    """Gradients (dq, dk, dv) of O = softmax(scale Q K^T [+ mask]) V given dO, on the GPU.

    q, o, do: (batch, heads, N, d); k, v: (batch, kv_heads, N_k, d); one dtype (float32,
    float16 or bfloat16: the plain kernels, or a tensor-core kernel whose module lists
    bf16), C-contiguous, all NumPy or all device arrays (as `gpu.attention`).
    N_k != N and window=(left, right) (as `gpu.attention`: bottom-right aligned causal,
    flash-attn's window_size, -1 unbounded; same ValueErrors for a bad window) run on
    every fa2 main kernel (algorithm='fa2', kernel 'tc', 'fast', 'plain', or 'auto',
    which picks 'fast' where it supports the tiling, else 'plain': 'tc' only by name, for
    the accuracy reason in the module docstring); tiles outside the band are skipped, as in
    iosim.backward (counts equal its closed form), and a row that sees no key gets dQ = 0
    and adds nothing to dK, dV. algorithm='fa1' (its one plain kernel) and 'standard'
    (its five plain kernels; stats P of shape (batch, heads, N, N_k) from
    `standard_forward(..., window=...)`, with dropout also its keep mask Z of that
    shape) run them too; the standard kernel 'tc' refuses them with a ValueError.
    algorithm: 'fa2' (default), 'fa1' or 'standard' (module docstring).
    stats: what the forward left in HBM: fa2: L (batch, heads, N) float32 (e.g.
    `gpu.attention(..., algorithm='fa2', return_stats=True)`); fa1: (l, m), each
    (batch, heads, N) float32 (gpu.attention returns only L: take l, m from
    iosim.execute('fa1', ...).stats, or use l = 1, m = L, which gives the same P);
    standard: P (batch, heads, N, N) in the problem dtype, e.g. from
    `gpu.backward_standard.standard_forward` with the same tiling (only the entries of
    the active tiles are read; Algorithm 3 needs no O: `o` is checked but not read).
    causal, scale, block_mask: as in the forward (must match it). Tiling: block_rows=B_r,
    block_cols=B_c, or neither (`default_backward_tiling(d, dtype, algorithm)`).
    kernel: the fa2 main kernel (fa1 has one; standard 'plain' or, fp16 on a GPU, 'tc':
    `gpu.backward.standard_tc`, the default there): 'tc' (fp16 or bf16 on the tensor
    cores, `gpu.backward.fa2_tc`; a GPU), 'fast' (register-tiled on the CUDA cores,
    `gpu.backward.fa2_fast`), 'plain' (this module's), or 'auto' (default): for fp16 and
    bf16 with N_k = N and no window 'tc' where it runs the configuration (its own default
    tiling `fa2_tc.default_tiling(d, causal)` when none is given), else 'fast' where it
    supports the tiling and thread count, else 'plain'. An explicit 'tc' or 'fast' that cannot run is a ValueError saying
    why. The schedule, hence the ledger, is the same for all three.
    poison: fill the gradients and intermediate buffers with NaN before the kernels run,
    so that an element a kernel failed to write shows (validation); default: the
    forward's `gpu.api.POISON` (off unless FLASHSIM_POISON=1, `set_poison`,
    `poison_outputs`; `flashsim check` and the tests turn it on).
    tc_options: tuning keywords of `fa2_tc.run` (MT: key m-tiles per warp; kreg: hold
    K_j, V_j's fragments in registers), for tiling studies.
    dropout_p, dropout_seed, dropout_offset: the forward's (`gpu.attention`): the fa2 main
    kernel regenerates its keep mask (Algorithm 4); standard reads the mask its forward
    stored, stats = (P, Z) from `gpu.backward.standard.standard_forward(...,
    dropout_p=...)` (lines 1 and 2 read Z, plain or tensor-core kernels alike); fa1's
    kernel regenerates it too. With p > 0 every algorithm runs the kernel it would run
    without dropout ('auto'; or the one named: `gpu.api.DROPOUT_KERNELS`).
    Returns (dq, dk, dv) (dk, dv with kv_heads heads), or ((dq, dk, dv), ledger) with
    count_traffic=True: the kernels' own counts as an iosim BackwardLedger (problem totals,
    equal to iosim.backward_closed_form).
    """
    if algorithm not in BACKWARD_ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not supported by the GPU backward; "
                         f"allowed: {', '.join(BACKWARD_ALGORITHMS)}")
    if kernel not in BACKWARD_KERNELS:
        raise ValueError(f"kernel={kernel!r} is not allowed; allowed: "
                         f"{', '.join(map(repr, BACKWARD_KERNELS))}")
    if kernel == "fast" and algorithm != "fa2":
        raise ValueError(f"kernel='fast' runs only algorithm='fa2' (got {algorithm!r}); use "
                         f"kernel='auto' or 'plain'")
    dropout = _api._check_dropout(dropout_p, dropout_seed, dropout_offset, algorithm, kernel)
    windowed, lo, hi = band_args(1, 1, bool(causal), window)  # ValueError for a bad window
    (B, H, N, d), dt, kind = _check("q", q)
    shape_k, dtk, kindk = _check("k", k)
    shape_v, dtv, kindv = _check("v", v)
    shape_o, dto, kindo = _check("o", o)
    shape_do, dtdo, kinddo = _check("do", do)
    Hk, Nk = shape_k[1], shape_k[2]
    if shape_k != (B, Hk, Nk, d) or shape_v != shape_k:
        raise ValueError(f"k has shape {shape_k} and v has shape {shape_v}; both must be "
                         f"(batch={B}, kv_heads, N_k, d={d}), the same, to match q "
                         f"{(B, H, N, d)}")
    # N_k != N_q or a window: the fa2 kernels (tc, fast, plain) all take them ('auto'
    # picks fast or plain: module docstring); the standard backward's tensor-core kernels
    # do not
    general = Nk != N or windowed
    if general:
        what = (f"N_k={Nk} != N_q={N}" if Nk != N else "") + \
            (" and " if Nk != N and windowed else "") + \
            (f"window={tuple(window)}" if windowed else "")
        if algorithm == "standard" and kernel == "tc":
            raise ValueError(f"kernel='tc': the tensor-core standard backward takes N_k = N_q "
                             f"and no window only (got {what}); allowed: kernel='plain' or "
                             f"'auto' (which runs the plain standard backward)")
    windowed, lo, hi = band_args(N, Nk, bool(causal), window)
    for name, shp in (("o", shape_o), ("do", shape_do)):
        if shp != (B, H, N, d):
            raise ValueError(f"{name} has shape {shp}; expected q's shape {(B, H, N, d)}")
    if H % Hk:
        raise ValueError(f"k/v have kv_heads={Hk}, which must divide q's heads={H}")
    if any(x != dt for x in (dtk, dtv, dto, dtdo)):
        raise ValueError(f"q, k, v, o, do dtypes are {dt}, {dtk}, {dtv}, {dto}, {dtdo}; "
                         f"they must be the same")
    if len({x == "numpy" for x in (kind, kindk, kindv, kindo, kinddo)}) != 1:
        raise ValueError("q, k, v, o, do must all be NumPy arrays or all be device arrays")
    iosim.check_head_dim(d)     # ValueError naming d and 1..256
    dname = dtype_name(dt)
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    if not np.isfinite(scale) or abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"scale={scale!r} is not allowed; allowed: numbers finite in float32 "
                         f"(|scale| <= {float(np.finfo(np.float32).max):.8g}), the kernels' "
                         f"compute dtype")
    use_tc = False
    if algorithm == "fa2" and (kernel == "tc" or (kernel == "auto" and not general)):
        tc_options = dict(tc_options or {})
        if block_rows is None and block_cols is None:
            dflt = fa2_tc.default_tiling(d, bool(causal))
            tr, tcol = dflt.pop("B_r"), dflt.pop("B_c")
            tc_options = {**dflt, **tc_options}
        else:
            tr, tcol = block_rows, block_cols
        use_tc = (isinstance(tr, (int, np.integer)) and isinstance(tcol, (int, np.integer))
                  and dname in _api.tc_dtypes(fa2_tc)
                  and fa2_tc.supports(tr, tcol, d, dname, MT=int(tc_options.get("MT", 1))))
        if use_tc and block_rows is None and block_cols is None:
            block_rows, block_cols = tr, tcol
    if kernel == "tc" and algorithm == "fa1":
        raise ValueError("kernel='tc': the fa1 backward (Algorithm 4 as written) has no "
                         "tensor-core kernel; use kernel='auto' or 'plain'")
    if kernel == "tc" and algorithm == "fa2" and not use_tc:
        dts = _api.tc_dtypes(fa2_tc)
        why = (f"it takes {', '.join(dts)} only" if dname not in dts else
               "no GPU (the CUDA simulator cannot run it)" if SIM else
               fa2_tc.plan_error(block_rows or 64, block_cols or 64, d, dname)
               or "its shared memory does not fit this device")
        raise ValueError(f"kernel='tc' cannot run algorithm={algorithm!r}, dtype {dname}, "
                         f"d={d}, block_rows={block_rows}, block_cols={block_cols}: {why}")
    if block_rows is None and block_cols is None:
        # N_k != N_q or a window: 'auto' keeps off the tensor-core tilings (standard's
        # kernels take N_k = N_q only; fa2's by name only: module docstring)
        tiling = default_backward_tiling(d, dname, algorithm,
                                         "fast" if general and kernel == "auto" else kernel,
                                         bool(causal))
    else:
        for name, val in (("block_rows", block_rows), ("block_cols", block_cols)):
            if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name}={val!r} must be a positive integer (give both "
                                 f"block_rows and block_cols, or neither)")
        tiling = Tiling(int(block_rows), int(block_cols))
    B_r, B_c = tiling.B_r, tiling.B_c
    # the standard backward on the tensor cores (fp16): gpu.backward.standard_tc
    use_std_tc = False
    if algorithm == "standard" and kernel in ("auto", "tc") and not general:
        dts = _api.tc_dtypes(standard_tc)
        why = (f"it takes {', '.join(dts)} only" if dname not in dts else
               "the CUDA simulator cannot run it" if SIM else
               standard_tc.plan_error(B_r, B_c, d, dname) or
               (None if standard_tc.supports(B_r, B_c, d, dname, N=N) else
                "its shared memory does not fit this device"))
        if why is not None and kernel == "tc":
            raise ValueError(f"kernel='tc': the tensor-core standard backward cannot run "
                             f"{dname} with B_r={B_r}, B_c={B_c}, d={d}: {why}")
        use_std_tc = why is None
    if threads is not None and not 1 <= int(threads) <= 1024:
        raise ValueError(f"threads={threads} must be in 1..1024")
    # --- fast-kernel dispatch (gpu.backward.fa2_fast): thread count, or None = plain ---
    fast_threads = None
    if algorithm == "fa2" and kernel in ("auto", "fast") and not use_tc:
        fast_threads = fa2_fast.pick_threads(B_r, B_c, d, dname,
                                             None if threads is None else int(threads))
        if fast_threads is None and kernel == "fast":
            why = fa2_fast.plan_error(B_r, B_c, d, dname, default_threads() if threads is None
                                      else int(threads))
            raise ValueError(f"kernel='fast': the fast fa2 backward cannot run {dname} with "
                             f"B_r={B_r}, B_c={B_c}, d={d}, threads={threads}: "
                             f"{why or 'no thread count fits'}; use kernel='auto' or 'plain'")
    threads = fast_threads or (default_threads() if threads is None else int(threads))
    problem = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype=dname,
                            causal=causal, block_mask=block_mask, N_k=Nk, window=window,
                            dropout_p=0.0 if dropout is None else dropout[0])
    active = iosim.active_tiles(problem, tiling)   # validates block_mask's shape
    shm = backward_shared_bytes(algorithm, B_r, B_c, d, dname)
    if not use_tc and fast_threads is None and not use_std_tc:
        check_fits(shm, f"the {algorithm} backward with B_r={B_r}, B_c={B_c}, d={d}, {dname}")
    if algorithm == "standard" and not use_std_tc:
        check_fits(backward_standard.ds_shared_bytes(Nk, dname),
                   f"the standard backward's dS row of N_k={Nk} (P and dP, {dname})")
    Z_dev = None
    if algorithm == "standard" and dropout is not None:
        if not (isinstance(stats, (tuple, list)) and len(stats) == 2):
            raise ValueError(f"stats for algorithm='standard' with dropout_p={dropout[0]} must "
                             f"be the pair (P, Z) of gpu.backward.standard.standard_forward("
                             f"..., dropout_p=...); got {type(stats).__name__}")
        P_dev = _check_P(stats[0], (B, H, N, Nk), dt)
        Z_dev = _check_P(stats[1], (B, H, N, Nk), np.uint8, "Z")
    elif algorithm == "standard":
        P_dev = _check_P(stats, (B, H, N, Nk), dt)
    elif algorithm == "fa2":
        L_dev = _check_stats("stats (L)", stats, (B, H, N), kind)
    elif algorithm == "fa1":
        if not (isinstance(stats, (tuple, list)) and len(stats) == 2):
            raise ValueError(f"stats for algorithm='fa1' must be the pair (l, m); got "
                             f"{type(stats).__name__}")
        l_dev = _check_stats("stats l", stats[0], (B, H, N), kind)
        m_dev = _check_stats("stats m", stats[1], (B, H, N), kind)
    mask_dev = (dummy_mask() if block_mask is None else
                cuda.to_device(np.ascontiguousarray(problem.block_mask, dtype=np.uint8)))
    has_mask = block_mask is not None

    qd, kd, vd, od, dod = (_to_device(x, kind) for x in (q, k, v, o, do))
    I, Ik = B * H, B * Hk
    q3, o3, do3 = (x.reshape(I, N, d) for x in (qd, od, dod))
    k3, v3 = kd.reshape(Ik, Nk, d), vd.reshape(Ik, Nk, d)
    G = H // Hk
    npdt = NP_DTYPE[dname]
    counters = _new_counters(count_traffic)
    count = bool(count_traffic)
    like = q
    poison = _api.POISON if poison is None else bool(poison)
    tq, dq3 = _output((I, N, d), npdt, kind, like, poison)   # poison: unwritten elements show
    tk, dk_h = _output((I, Nk, d), npdt, kind, like, poison)  # per query head
    tv, dv_h = _output((I, Nk, d), npdt, kind, like, poison)
    T_r, T_c = -(-N // B_r), -(-Nk // B_c)
    if algorithm == "fa2":
        tD, D2 = _output((I, N), np.float32, kind, like, poison)
        tA, acc = _output((I, N, d), np.float32, kind, like, poison)
        if use_tc:         # the fast pre-pass (warp per row), then the tensor-core kernel
            fa2_fast.run_pre(o3, do3, D2, acc, N, counters, dt=dname, count=count)
            fa2_tc.run(q3, k3, v3, do3, L_dev.reshape(I, N), D2, acc, dk_h, dv_h, scale, N, H,
                       G, mask_dev if has_mask else None, counters, B_r=B_r, B_c=B_c,
                       causal=bool(causal), count=count, dt=dname, window=window,
                       dropout=dropout, **(tc_options or {}))
        elif fast_threads is not None:   # the fast pre-pass and main kernel (CUDA cores)
            fa2_fast.run_pre(o3, do3, D2, acc, N, counters, dt=dname, count=count)
            fa2_fast.run(q3, k3, v3, o3, do3, L_dev.reshape(I, N), D2, acc, dk_h, dv_h,
                         scale, N, H, G, mask_dev if has_mask else None, counters, B_r=B_r,
                         B_c=B_c, dt=dname, causal=bool(causal), count=count,
                         threads=threads, window=window, dropout=dropout)
        else:
            pre = fa2_pre_kernel(B_r, d, dname, count, threads)
            pre[(T_r, I), threads](o3, do3, D2, acc, np.int64(N), counters)
            kern = bwd_main_kernel("fa2", B_r, B_c, d, dname, bool(causal), has_mask, count,
                                   threads, dropout is not None, windowed)
            launch(kern, (T_c, I), threads, shm, q3, k3, v3, o3, do3, L_dev.reshape(I, N), D2,
                   D2, acc, dk_h, dv_h, np.float32(scale), np.int64(N), np.int64(Nk), lo, hi,
                   np.int64(H), np.int64(G), mask_dev, counters,
                   *_philox.kernel_args(*(dropout or ())))
        _flat_launch(convert_kernel(dname, count), I * N * d, acc.reshape(I * N * d),
                     dq3.reshape(I * N * d), counters)
    elif algorithm == "fa1":
        kern = bwd_main_kernel("fa1", B_r, B_c, d, dname, bool(causal), has_mask, count, threads,
                               dropout is not None, windowed)
        launch(kern, (1, I), threads, shm, q3, k3, v3, o3, do3, m_dev.reshape(I, N),
               l_dev.reshape(I, N), m_dev.reshape(I, N), dq3, dk_h, dv_h, np.float32(scale),
               np.int64(N), np.int64(Nk), lo, hi, np.int64(H), np.int64(G), mask_dev, counters,
               *_philox.kernel_args(*(dropout or ())))
    else:   # standard: Algorithm 3, five kernels through HBM (gpu.backward_standard)
        _dp, dp3 = _output((I, N, Nk), npdt, kind, like, poison)
        _ds, ds3 = _output((I, N, Nk), npdt, kind, like, poison)
        extra = {} if Z_dev is None else dict(z3=Z_dev.reshape(I, N, Nk), dropout=dropout)
        if general:                        # the plain kernels only
            extra.update(N_k=Nk, window=window)
        (standard_tc if use_std_tc else backward_standard).run(
            q3, k3, v3, do3, P_dev.reshape(I, N, Nk), dp3, ds3, dq3, dk_h, dv_h, scale, N, H,
            G, mask_dev if has_mask else None, active, counters, B_r=B_r, B_c=B_c, dt=dname,
            causal=bool(causal), count=count, threads=threads, **extra)
        del dp3, ds3
    if G == 1:
        dk3, dv3 = dk_h, dv_h
    else:
        tk, dk3 = _output((Ik, Nk, d), npdt, kind, like, poison)
        tv, dv3 = _output((Ik, Nk, d), npdt, kind, like, poison)
        _flat_launch(group_sum_kernel(dname, count), Ik * Nk * d, dk_h.reshape(I, Nk * d),
                     dv_h.reshape(I, Nk * d), dk3.reshape(Ik, Nk * d), dv3.reshape(Ik, Nk * d),
                     np.int64(G), counters)
    if tq is not None:      # torch callers: the torch tensors themselves
        grads = (tq.view(B, H, N, d), tk.view(B, Hk, Nk, d), tv.view(B, Hk, Nk, d))
    else:
        grads = (_return_like(dq3.reshape(B, H, N, d), kind, q),
                 _return_like(dk3.reshape(B, Hk, Nk, d), kind, q),
                 _return_like(dv3.reshape(B, Hk, Nk, d), kind, q))
    if count_traffic:
        return grads, _counters_to_ledger(counters, algorithm, problem, tiling)
    return grads


__all__ = ["attention_backward", "default_backward_tiling", "bwd_shared_bytes",
           "backward_shared_bytes", "BACKWARD_ALGORITHMS", "BACKWARD_KERNELS", "BW_TENSORS"]
