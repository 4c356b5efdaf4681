"""Each launch's features for the time model (`launch_features`): its work W and the peak R
of the unit doing it, its L2 and DRAM bytes (from `iosim.memory`'s levels), the CUDA-core
operations beside the products, shared-memory and local-memory bytes, latency rounds and
the makespans of its CTAs' work."""
from __future__ import annotations

import math

import numpy as np

from ..closed_form import tile_sums
from ..launch.plan import _fast_smem_bytes
from ..memory.access import _first_query_block, _key_block_range
from ..problem import Problem
from ..tiling import Tiling
from .makespan import UniformWork, _work_excess, makespans
from .model import MEMORY_KERNELS, NEWER, SHARED, TENSOR_KERNELS, family_key

def _sums(p: Problem, t: Tiling):
    """(n_A, RA, CA, RCA) per instance of the problem's mask (N_k and the window where
    given: `iosim.closed_form.tile_sums`)."""
    if p.N_k == p.N and p.window == (-1, -1):
        nA, RA, CA, RCA = (int(x) for x in tile_sums(p.N, t.B_r, t.B_c, p.causal))
    else:
        nA, RA, CA, RCA = (int(x) for x in tile_sums(p.N, t.B_r, t.B_c, p.causal, N_k=p.N_k,
                                                       window=p.window))
    return nA, RA, CA, RCA


def launch_features(p: Problem, lv: dict, hw) -> list[dict]:
    """Per launch of the pass: W (work), R (its unit's peak), B_L2, B_DRAM and the CTA
    work vector for the imbalance. `lv` is `iosim.levels(...)`'s result."""
    t = Tiling(lv["block_rows"], lv["block_cols"])
    N, d, s, I = p.N, p.d, p.itemsize, p.instances
    nA, RA, CA, RCA = _sums(p, t)
    T_r, T_c = -(-N // t.B_r), -(-N // t.B_c)
    j_lo, j_hi = _key_block_range(p, t.B_r, t.B_c)
    a = j_hi - j_lo                                                # key blocks per query block
    first = _first_query_block(N, t.B_r, t.B_c, p.causal)
    qb_per_kb = T_r - first                                        # query blocks per key block
    ones = lambda n: UniformWork(int(n), 1.0)        # equal CTAs: no array
    tc = lv["kernel"] == "tc"
    out = []
    for k in lv["kernels"]:
        name = k["name"]
        kern = family_key(name)
        if kern == "fa2_bwd_pre" and lv["kernel"] in ("tc", "fast") and lv.get("pass") != "fwd":
            kern = "fa2_bwd_pre_fast"          # the tensor-core backward runs the fast pre-pass
        fam = NEWER.get(kern, kern)            # whose work / traffic formulas it shares
        mem = fam in MEMORY_KERNELS
        if fam in ("fa2_tc", "fa2_fast", "fa2_fwd"):
            # the causal tensor-core and fast builds launch the heaviest query blocks first
            # (blockIdx.x reversed, gpu.forward.fa2_tc / fa2_fast); the plain one in order
            heavy_first = p.causal and kern in ("fa2_tc", "fa2_fast")
            W, B2 = 4.0 * RCA * d * I, _l2_global(lv)
            work = np.tile((a + 1)[::-1] if heavy_first else a + 1, I)
        elif fam == "fa1_fwd":
            W, work = 4.0 * RCA * d * I, UniformWork(int(I), float(nA + T_c))
            B2 = _l2_global(lv)
        elif fam in ("std_S", "std_bwd_dP"):          # tile products S = QK^T, dP = dO V^T
            W, work, B2 = 2.0 * RCA * d * I, ones(nA * I), ((RA + CA) * d + RCA) * s * I
        elif fam in ("std_softmax", "std_bwd_dS"):    # row passes: S -> P; P, dP -> dS
            W = (2.0 if fam == "std_softmax" else 3.0) * RCA * s * I
            work, B2 = np.tile(np.repeat(np.minimum(a * t.B_c, N), t.B_r)[:N], I), W
        elif fam in ("std_PV", "std_bwd_dQ"):         # row-block products O = PV, dQ = dS K
            W, work, B2 = 2.0 * RCA * d * I, np.tile(a + 1, I), (RCA + CA * d + N * d) * s * I
        elif fam == "fa2_bwd_pre":
            W = (2 * N * d * s + N * 4 + N * d * 4) * I
            work, B2 = ones(T_r * I), W
        elif fam == "fa2_bwd_main":
            W = 10.0 * RCA * d * I
            if p.causal and kern == "fa2_bwd_fast":
                # grid (instances, T_c): blockIdx.x is the instance, so the launch order
                # is every head's key block 0 (the heaviest), then every head's block 1,
                # ...: the whole grid heaviest first (longest processing time first), not
                # head by head (gpu.backward.fa2_fast.run)
                work = np.repeat(qb_per_kb + 1, I)
            else:                         # grid (T_c, instances): head by head
                work = np.tile(qb_per_kb + 1, I)
            B2 = ((2 * RA * d + 2 * N * d) * s + 2 * RA * 4 + 2 * RA * d * 4 + 2 * N * d * s) * I
        elif fam == "bwd_convert":
            W = N * d * (4 + s) * I
            work, B2 = ones(k["ctas"]), W
        elif fam == "bwd_group_sum":
            W = (2 * I + 2 * p.batch * p.kv_heads) * N * d * s
            work, B2 = ones(k["ctas"]), W
        elif fam in ("std_bwd_dV", "std_bwd_dK"):
            W, work, B2 = 2.0 * RCA * d * I, np.tile(qb_per_kb + 1, I), (RCA + RA * d + N * d) * s * I
        else:
            raise ValueError(f"kernel {name!r}: no work model")
        if mem:
            R = hw.hbm_bandwidth
        elif kern in TENSOR_KERNELS and (tc or kern != "fa2_tc"):
            R = hw.fp16_tensor_flops
            # the tensor-core kernels multiply tiles padded to d rounded up to 16 (one mma
            # k step; zeros in the pad columns): their work is at the padded head dim
            W *= _padded(d) / d
        else:
            R = hw.fp32_flops
        if fam == "fa2_tc":
            B2 = _l2_global(lv)
        if fam in ROW_PASSES:
            # the row passes' work is their per-entry CUDA-core instructions (two exps, max,
            # sum, conversions; dS: P dP, D, the product) at the fp32 rate: the same on
            # every chip of the same SMs and clocks, not the HBM's
            W, R = ROW_OPS * RCA * I, hw.fp32_flops
        if not isinstance(work, UniformWork):
            work = np.asarray(work, dtype=np.float64)
        spill = k.get("spill_bytes", 0)
        local = 0.0
        if spill:
            l1_free = 256 * 1024 - k["ctas_per_sm"] * k["smem_bytes"]
            if spill * k["threads"] * k["ctas_per_sm"] > l1_free:   # loads and stores
                local = float(2 * spill * k["threads"] * _work_excess(work))
        entries = {"fa2_tc": 1, "fa2_fast": 1, "fa2_fwd": 1, "fa1_fwd": 1, "std_S": 0,
                   "std_PV": 0, "fa2_bwd_main": 2, "std_bwd_dP": 0, "std_bwd_dQ": 0,
                   "std_bwd_dK": 0, "std_bwd_dV": 0}.get(fam, 0) * float(RCA) * I
        if kern in ("fa2_bwd_tc", "fa2_bwd_main"):
            entries = 0.0   # measured: the tensor-core one tensor-FLOP-bound (~180 TFLOP/s at
            # d 64 and 128), the plain one shared-memory bound (its bank conflicts, B_smem)
        # fp16 and fp32 builds of a CUDA-core kernel are different specialisations (the
        # fp16 ones convert every load): one constant each
        if kern in NEWER:
            key = SHARED.get(kern, kern)
        elif kern == "bwd_group_sum":          # no measured rows: the backward's other
            key = "bwd_convert"                # elementwise memory pass's constant
        else:
            key = fam if (mem or fam == "fa2_tc") else f"{fam}_{p.dtype}"
        steps = rows_pass = wsteps = 0.0
        if kern in ("std_softmax", "std_bwd_dS"):   # the plain row passes (one CTA a row)
            thr, warps = k["threads"], -(-k["threads"] // 32)
            shfl = name == "std_fast_softmax"        # warp shuffles, then one value a warp
            nred = thr // 32 if shfl else thr        # partial values each thread reads
            # reductions per row: softmax max and sum, dS one (D = rowsum P dP)
            rows_pass = float(N * I) * (2 if kern == "std_softmax" else 1) * thr * nred
            if shfl and not p.causal:                # one flat sweep, 4 entries a thread
                # (4 independent loads in flight per thread: no sigma_w)
                steps = float(N * I) * -(-N // (4 * thr)) * warps
            else:                                    # a step per active tile of the row
                steps = float(RA * I) * warps        # (the tile loop, every warp)
                # sigma_w (form 10) per warp that holds entries of the tile (thread t:
                # c0 + t, c0 + t + threads, ...) and per entry of each of its threads:
                # one load in flight per thread, then its use, in each pass
                wsteps = float(RA * I) * -(-min(t.B_c, thr) // 32) * -(-t.B_c // thr)
        elif kern in ("std_tc_softmax", "std_tc_bwd_dS"):   # the same block reductions
            thr = k["threads"]                       # (warp shuffles, one value a warp)
            rows_pass = float(N * I) * (2 if kern == "std_tc_softmax" else 1) * thr * (thr // 32)
        loop = fam in ("fa2_tc", "fa2_fast", "fa2_fwd", "fa1_fwd", "fa2_bwd_main")
        smem = _fast_smem_bytes(p, t, k["threads"], kern) if kern in FAST_SMEM else 0.0
        if kern == "fa2_bwd_main":
            smem = 128.0 * nA * I * _bwd_wavefronts(t.B_r, t.B_c, d, s)
        if kern == "fa2_bwd_tc" and k["ctas_per_sm"] == 1:
            W *= _bwd_tc_lockstep(t.B_r, -(-k["threads"] // 32))
        rounds = miss = 0.0
        thr = k["threads"]
        waves = -(-k["ctas"] // (hw.sm_count * max(1, k["ctas_per_sm"])))   # of CTAs an SM holds
        if kern in LATENCY_KERNELS:
            # fa1's step 8: Q_i, O_i element by element, one pair per thread and round, then
            # l_i, m_i (one more round), behind a barrier, by the instance's only CTA: each
            # round waits a memory round trip that no other CTA on the SM hides
            if kern == "std_fast_S":          # Q_i, K_j element by element, one tile a CTA
                rounds = float((-(-t.B_r * d // thr) + -(-t.B_c * d // thr)) * waves)
            elif kern == "std_fast_PV":       # P_ij, V_j per key tile of its row block
                rounds = float((-(-t.B_r * t.B_c // thr) + -(-t.B_c * d // thr))
                               * float(work.max()) * waves)       # (array or UniformWork)
            else:
                rounds = float(nA * (-(-t.B_r * d // thr) + 1) * waves)
        elif kern in ELEMENTWISE_TC and d % 8:
            # form 12: the tensor-core kernels copy rows in 16-byte chunks (cp.async) only
            # where d % 8 == 0; at any other d each element is a 2-byte load into a register,
            # then a shared store that clobbers memory (gpu/mma.cuh, tc_cp2_t), so the next
            # copy's load waits: a round trip per element copy (t_round, the constant fitted
            # on fa1's rounds). Per CTA: the tile it keeps, once, then the two tiles it
            # streams per active tile; CTAs resident together overlap their rounds
            tiles = nA * I / k["ctas"]  # active tiles per CTA, on average
            if kern == "fa2_tc":        # Q_i once; K_j and V_j per active tile
                per_cta = -(-t.B_r * d // thr) + 2 * tiles * -(-t.B_c * d // thr)
            else:                       # K_j and V_j once; Q_i and dO_i per active tile
                per_cta = 2 * -(-t.B_c * d // thr) + 2 * tiles * -(-t.B_r * d // thr)
            rounds = float(per_cta * waves)
        if kern in LATENCY_KERNELS or rounds:    # the share of the rounds that miss L2
            miss = min(1.0, k["dram_read_bytes"] / max(1.0, lv["l2_read_bytes"]
                                                        - lv.get("l2_local_read_bytes", 0.0)))
        out.append({"name": name, "family": key, "kernel": kern, "W": float(W), "R": float(R),
                    "lat_rounds": rounds, "lat_miss": miss,
                    "cta_waves": float(waves) if kern in CTA_LATENCY_KERNELS else 0.0,
                    "o_elems": float(nA * t.B_r * d * I) if kern in O_ROUNDTRIP else 0.0,
                    "entries": entries, "backward": fam == "fa2_bwd_main",
                    # the causal builds' band test per entry; a window's build runs the
                    # same test (its band), so it pays the same (gpu: one masked build)
                    "causal": bool(p.causal or p.window != (-1, -1))
                    and fam in ("fa2_tc", "fa2_fast", "fa2_fwd"),
                    "causal_fa1": bool(p.causal) and kern in ("fa1_tc", "fa1_fast"),
                    "B_smem": smem, "row_steps": steps, "row_rows": rows_pass,
                    "row_wsteps": wsteps,
                    "rows": float(RA * I) if (loop and fam != "fa2_bwd_main") else 0.0,
                    "B_l2": float(B2), "B_local": local,
                    "B_dram": float(k["dram_read_bytes"] + k["dram_write_bytes"]),
                    "B_dram_write": float(k["dram_write_bytes"]),
                    **makespans(work, hw, k["ctas_per_sm"]),
                    "warps": -(-k["threads"] // 32),
                    "ctas": k["ctas"], "ctas_per_sm": k["ctas_per_sm"]})
    return out


#: the standard row passes (one CTA a row: softmax S -> P, the backward's dS)
ROW_PASSES = ("std_softmax", "std_bwd_dS")


#: nominal CUDA-core operations per entry of a row pass (its fitted efficiency scales it)
ROW_OPS = 32.0


#: kernels whose lone CTA (one per instance) loads each tile step's operands in
#: latency-bound rounds behind a barrier (their `lat_rounds` feature, t_round each)
LATENCY_KERNELS = ("fa1_fast", "fa1_fwd", "std_fast_S", "std_fast_PV")


#: the tensor-core kernels whose row copies are element by element where d % 8 != 0
#: (gpu.forward.fa2_tc, gpu.backward.fa2_tc: `VEC`); their rounds are `lat_rounds` too
ELEMENTWISE_TC = ("fa2_tc", "fa2_bwd_tc")


#: kernels whose CTAs wait a prologue / epilogue latency per wave (t_cta): the first
#: operand tiles in before the first product, O_i out after the last
CTA_LATENCY_KERNELS = ("fa2_tc", "fa2_fast", "fa2_bwd_tc", "fa2_bwd_fast")


#: Algorithm 1's kernels: O_i re-read, rescaled and re-written at every tile step (kappa_o)
O_ROUNDTRIP = ("fa1_tc", "fa1_fast", "fa1_fwd")


#: the register-tiled fp32 CUDA-core kernels (their shared-memory term, `_fast_smem_bytes`)
FAST_SMEM = ("fa2_fast", "fa1_fast", "std_fast_S", "std_fast_PV")


#: independent MMA accumulator fragments an SM sub-partition needs in flight to keep its
#: tensor pipe busy (each behind its ldmatrix from shared memory): the d = 64 backward
#: build (2 warps a sub-partition x B_r / 8 = 8 fragments each = 16) runs at the
#: non-causal d = 128 build's rate (2 CTAs a SM) while the causal d = 128 build (8) does not.
#: Chosen by 5-fold CV among 10, 12, 14 (not by the least-squares fit)
MMA_INFLIGHT = 12.0


def _bwd_tc_lockstep(B_r: int, warps: int) -> float:
    """The tensor-core backward's work multiplier where an SM holds one CTA: its warps
    pass the tile's phases in lockstep (barriers around dS^T and dQ_i), so in the S^T and
    dP^T products (2 of the 5 products) each warp has only B_r / 8 independent
    accumulator fragments (16 keys x B_r queries), warps / 4 warps a sub-partition: below
    MMA_INFLIGHT in flight the tensor pipe idles in proportion. Two CTAs a SM (the
    non-causal d = 128 build, 32 x 64, 4 warps) interleave their phases, and the dV / dK /
    dQ products (d / 8 fragments) have enough: no penalty there. 32 x 128 at d = 128
    (8 warps, 1 CTA a SM): 8 in flight, 1.2 x; 64 x 128 at d = 64: 16, none."""
    inflight = (warps / 4.0) * (B_r / 8.0)
    return 0.6 + 0.4 * max(1.0, MMA_INFLIGHT / inflight)


def _bwd_wavefronts(B_r: int, B_c: int, d: int, s: int) -> float:
    """Shared-memory wavefronts (128 bytes a clock per SM) of one tile of the plain fa2
    backward (gpu.backward.flash.bwd_block: a thread per entry, no register tiling).
    Phase A (S = Q K^T and dP = dO V^T per entry): a warp's 32 consecutive entries span
    min(B_c, 32) keys and ceil(32 / B_c) query rows; rows of Q, dO, K, V lie d s / 4 words
    apart in shared memory, so for d a multiple of 32 / s the distinct rows a warp reads
    fall in one bank: a load of K_c (V_c) takes min(B_c, 32) wavefronts, of Q_r (dO_r)
    ceil(32 / B_c), per head column x. Phases B (dV, dK: 4 loads per query row, lanes on
    consecutive columns) and C (dQ: 2 per key) are conflict-free."""
    words = d * s / 4
    banks = 32 // math.gcd(int(words), 32) if words == int(words) else 32
    deg = lambda k: -(-k // banks)                # wavefronts of k distinct rows
    a = -(-B_r * B_c // 32) * d * 2 * (deg(min(B_c, 32)) + deg(-(-32 // B_c)))
    b = -(-B_c * d // 32) * B_r * 4
    c = -(-B_r * d // 32) * B_c * 2
    return float(a + b + c)


def _padded(d: int) -> int:
    """The head dim the tensor-core kernels' tile products run at: d rounded up to 16
    (iosim.launch.forward.fa2_tc.padded; the same k step in every tensor-core kernel)."""
    return -(-d // 16) * 16


def _l2_global(lv: dict) -> float:
    """A pass's L2 bytes less its local memory (`iosim.memory.local_l2_bytes`, which
    the spill term t_local prices on its own)."""
    return (lv["l2_read_bytes"] + lv["l2_write_bytes"]
            - lv.get("l2_local_read_bytes", 0.0) - lv.get("l2_local_write_bytes", 0.0))
