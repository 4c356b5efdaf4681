"""What a kernel pass requests, what reaches L2 and what reaches DRAM: `pass_levels`.

For the whole pass (all its kernel launches, each with a cold L2 as Nsight Compute
measures them; bytes, whole problem):
  requested_read_bytes / requested_write_bytes: the ledger (iosim.closed_form);
  l2_read_bytes / l2_write_bytes: what the SMs ask of L2 in 32-byte sectors: the ledger,
      except that fp32 atomics (the fa2 backward's dQ accumulator) are L2 reductions
      (`l2_atomic_bytes`), fa2_tc's cp.async copies cost 1.5 sectors per requested sector
      (TC_CPASYNC_SECTOR_FACTOR), and the local memory of spilling builds
      (`local_l2_bytes`);
  dram_read_bytes / dram_write_bytes: the L2 model (`iosim.memory.dram`) over the launches'
      access streams (`iosim.memory.access`), plus the background DRAM writes that grow with
      each launch's duration (L2Model.background_write_rate x the time model's predicted
      time: `iosim.levels` passes the time model in as `launch_ms`);
  dram_read_bytes_range / dram_write_bytes_range: the same model at the chip-to-chip spread
      of the effective L2 capacity (CHIP_CAPACITY_RANGE), or a spilling build's bounds.
The fitted constants are data (l2_constants.json); how they were fitted and scored:
docs/models-history.md.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace

from ..backward import backward_closed_form
from ..closed_form import closed_form, tile_sums
from ..hardware import get_hardware
from ..launch.plan import L1_BYTES, SMEM_CARVEOUTS, SMEM_RESERVED, Launch, Plan, kernel_plan, local_of
from ..problem import ConfigError, Problem
from ..tiling import Tiling, check_tiling_fits
from .access import GRID_ORDERS, _launches_and_streams
from .dram import dram_at_capacities
from .l2model import L2Model
from .limits import levels_size_error
from .stream import Stream

#: the fitted L2 models (l2_constants.json): FITTED, the one `pass_levels` uses, and the
#: earlier fits the tests and benchmarks compare with (their story: docs/models-history.md)
CONSTANTS_PATH = os.path.join(os.path.dirname(__file__), "l2_constants.json")
with open(CONSTANTS_PATH) as _f:
    _FITS = json.load(_f)
_MODELS = {v: L2Model(**fields) for v, fields in _FITS["models"].items()}
FITTED_V5, FITTED_V8, FITTED_V9, FITTED_V10 = (_MODELS[v] for v in ("v5", "v8", "v9", "v10"))
FITTED = _MODELS[_FITS["fitted"]]

#: the chip-to-chip spread of the effective L2 capacity, as factors (lo, hi) of the model's
#: C, over which `pass_levels` gives dram_read_bytes_range / dram_write_bytes_range: the
#: p2.5 and max of the H100's per-row capacity factors, rounded out
#: (benchmarks/l2_edge_spread.py). For the spilling builds (`iosim.launch.plan.LOCAL`) the
#: range is their physical bound instead: reads from the compulsory bytes to every CTA's
#: K/V loads, writes from none of the frames' write-backs to every step's.
CHIP_CAPACITY_RANGE = (0.88, 1.12)


#: L2 sectors per requested sector for gpu.forward.fa2_tc's global loads: its cp.async copies
#: land in shared rows padded to d + 8 halves (conflict-free ldmatrix), so a warp's 512
#: contiguous bytes reach L2 as 1.5x the sectors (measured 1.48-1.50x; docs/models-history.md)
TC_CPASYNC_SECTOR_FACTOR = 1.5


#: Kernels with few Nsight Compute rows: (algorithm, pass, kernel) -> what they showed
#: (`pass_levels` says so in its warnings; which runs: docs/models-history.md)
FEW_ROWS = {
    ("fa1", "fwd", "fast"): "7 passes measured on the H100, 1 on the H200: DRAM inside the "
                            "bound in 7 of 8 (the miss: 16 heads at N = 4096, d = 64, "
                            "near the L2's capacity: reads -39 %, writes -54 %)",
    ("standard", "fwd", "fast"): "8 passes measured on the H100, 1 on the H200: DRAM "
                                 "inside the bound in all"}


#: the share of the L1 left beside shared memory that holds local-memory frames
#: (`local_l2_bytes`): fitted on the spilling builds' measured L2 reads
L1_FRAME_SHARE = 0.7


def l1_left(lau: Launch) -> float:
    """The L1 bytes an SM keeps beside its resident CTAs' shared memory: 256 KB less the
    smallest sm_90 carve-out (`SMEM_CARVEOUTS`) holding ctas_per_sm x (smem + 1 KB)."""
    need = lau.ctas_per_sm * (lau.smem_bytes + SMEM_RESERVED)
    carve = next((c for c in SMEM_CARVEOUTS if c >= need), SMEM_CARVEOUTS[-1])
    return float(L1_BYTES - carve)


def local_l2_bytes(lau: Launch, sm_count: int) -> tuple[float, float]:
    """(read, write) bytes of a launch's local memory at the L2 (whole launch). Writes:
    every local store (the L1 writes local memory through: measured L2 writes = global
    + local stores within 0.2 %): the spilled frame once per CTA at its start
    (spill_bytes x threads) and, for a build whose frames overflow the L1, the bytes
    rewritten at every K/V step. Reads: that build's local loads at every step, less
    the part the L1 holds: L1_FRAME_SHARE x `l1_left` of the SM's resident frames (a grid
    smaller than its slots leaves fewer CTAs on an SM; the carve-out stays the one the
    kernel's occupancy asks for)."""
    write = float(lau.ctas * lau.spill_bytes * lau.threads)
    read = 0.0
    if lau.local_frame_bytes:
        write += lau.frame_steps * lau.local_write_bytes
        resident = min(lau.ctas_per_sm, -(-lau.ctas // max(1, sm_count)))
        held = min(1.0, L1_FRAME_SHARE * l1_left(lau) / (resident * lau.local_frame_bytes))
        read = lau.frame_steps * lau.local_load_bytes * (1.0 - held)
    return read, write


#: an L2 no stream overflows (bytes): the compulsory DRAM reads, the spilling builds' low end
UNBOUNDED_L2 = 1e18


def _spans(res: dict, keys) -> str:
    """The warnings' "DRAM read LO-HI MB (point P MB), ..." of these keys of a result."""
    return ", ".join(f"{k.replace('dram_', 'DRAM ').replace('_bytes', '')} "
                     f"{res[k + '_range'][0] / 1e6:.0f}-{res[k + '_range'][1] / 1e6:.0f} MB "
                     f"(point {res[k] / 1e6:.0f} MB)" for k in keys)


def requested(p: Problem, plan: Plan):
    """The pass's ledger (iosim closed form): (read bytes, write bytes, atomic bytes)."""
    if plan.pass_ == "fwd":
        led = closed_form(plan.algorithm, p, plan.tiling)
        return led.hbm_read_bytes, led.hbm_write_bytes, 0
    led = backward_closed_form(plan.algorithm, p, plan.tiling)
    atom = 0
    if plan.algorithm == "fa2":
        _, RA, _, _ = (int(x) for x in tile_sums(p.N, plan.tiling.B_r, plan.tiling.B_c,
                                                       p.causal))
        atom = RA * p.d * 4 * p.instances       # one fp32 read-modify-write per element
    return led.hbm_read_bytes, led.hbm_write_bytes, atom


#: (algorithm, pass) whose bf16 build is the fp16 tensor-core kernel's with bf16 operands
#: (gpu.forward.fa2_tc, fa1_tc and gpu.backward.fa2_tc list "bf16" in DTYPES: the same
#: tilings, shared layout and bytes; the fa2 backward's pre-pass and convert kernels
#: load bf16 as 2-byte elements too); standard's tensor-core kernels take fp16 only, so
#: its bf16 passes run the plain kernels, which the models do not know
BF16_AS_FP16 = (("fa2", "fwd"), ("fa1", "fwd"), ("fa2", "bwd"))


def model_problem(algorithm: str, problem: Problem, hw, *, pass_: str = "fwd",
                  kernel: str = "auto", tiling: Tiling | None = None):
    """(the problem the models compute, the dtype they took for it or None, the kernel=
    to plan it with): the problem itself where the L2 / DRAM and time models cover it; a
    bf16 tensor-core pass as its fp16 twin (`BF16_AS_FP16`); kernel 'plain' where 'auto'
    would plan a tensor-core kernel that cannot run this head dim and gpu runs the plain
    kernels instead (`_tc_error`). ValueError, one line, naming what is not modelled, for
    the rest: block-sparse masks, N_k != N, local windows, dropout, bf16 on the plain
    kernels, a tensor-core kernel outside its head dims (packed variable-length batches
    are another type, `iosim.VarlenProblem`, that the models do not take)."""
    if not isinstance(problem, Problem):
        raise ValueError(f"problem={type(problem).__name__}: not modelled below the ledger (the "
                         f"L2 / DRAM and time models take an iosim.Problem; packed "
                         f"variable-length batches are counted by iosim.varlen_closed_form)")
    if problem.block_mask is not None:
        raise ValueError("block_mask: not modelled below the ledger (the L2 / DRAM and time "
                         "models cover dense and causal problems; the ledger counts it)")
    if (problem.N_k != problem.N or problem.window != (-1, -1)) and \
            (algorithm, pass_) != ("fa2", "fwd"):
        raise ValueError(f"N_k={problem.N_k} (N={problem.N}), window={problem.window}: not "
                         f"modelled below the ledger for the {algorithm} {pass_} pass (the L2 / "
                         f"DRAM and time models take them for the fa2 forward only; the ledger, "
                         f"iosim.closed_form, counts them)")
    if problem.dropout_p:
        raise ValueError(f"dropout_p={problem.dropout_p}: not modelled below the ledger (the "
                         f"L2 / DRAM and time models were measured without dropout; the "
                         f"ledger counts it)")
    twin = replace(problem, dtype="fp16") if problem.dtype == "bf16" else problem
    try:
        plan = kernel_plan(algorithm, twin, hw, pass_=pass_, kernel=kernel, tiling=tiling)
    except ValueError as e:
        # the fast kernel has no tiling for this head dim: gpu runs the plain kernels
        # (gpu._choose.default_tiling, gpu.backward's default_backward_tiling)
        if kernel != "auto" or "no tiling" not in str(e) or problem.dtype == "bf16":
            raise
        return problem, None, "plain"
    err = _tc_error(plan, twin)
    if err and (kernel == "tc" or problem.dtype == "bf16"
                or (algorithm, pass_) not in (("fa1", "fwd"), ("standard", "fwd"),
                                              ("standard", "bwd"))):
        raise ValueError(f"{algorithm} {pass_} {problem.dtype} at d={problem.d}: not modelled "
                         f"below the ledger (iosim.kernel_plan picks the tensor-core kernel, "
                         f"which cannot run it: {err}; gpu runs another kernel there)")
    if err:                     # gpu falls back to the plain kernels (gpu._choose)
        return problem, None, "plain"
    if problem.dtype != "bf16":
        return problem, None, kernel
    if (algorithm, pass_) not in BF16_AS_FP16 or plan.kernel != "tc":
        raise ValueError(f"dtype='bf16': the {algorithm} {pass_} pass runs bf16 on its plain "
                         f"kernels here, which the L2 / DRAM and time models do not know (they "
                         f"model bf16 as fp16 on the tensor-core kernels of fa2 and fa1 forward "
                         f"and the fa2 backward); the bf16 ledger counts 2 bytes an element")
    return twin, "fp16", kernel


def _tc_error(plan: Plan, p: Problem) -> str | None:
    """Why the tensor-core kernel a plan names cannot run problem p (its module's
    plan_error: head dims, tile shapes), or None (not a tensor-core plan, or it runs)."""
    if plan.kernel != "tc" or (plan.algorithm, plan.pass_) == ("fa2", "fwd"):
        return None                 # (kernel_plan checks the fa2 forward's itself)
    from ..launch.backward import fa2_tc as bwd_fa2_tc, standard_tc as bwd_std_tc
    from ..launch.forward import fa1_tc, standard_tc
    B_r, B_c, d = plan.tiling.B_r, plan.tiling.B_c, p.d
    if plan.pass_ == "fwd" and plan.algorithm == "fa1":
        return fa1_tc.plan_error(B_r, B_c, d, p.dtype, plan.extra.get("MT", 1),
                                 plan.extra.get("stages", 2))
    if plan.algorithm == "standard":
        return (standard_tc if plan.pass_ == "fwd" else bwd_std_tc).plan_error(B_r, B_c, d, p.dtype)
    return bwd_fa2_tc.plan_error(B_r, B_c, d, p.dtype)


def pass_levels(algorithm: str, problem: Problem, gpu="H100-SXM", *, pass_: str = "fwd",
           kernel: str = "auto", tiling: Tiling | None = None,
           model: L2Model | None = None, grid_order: str = "query-major",
           chip_range: tuple[float, float] | None = CHIP_CAPACITY_RANGE,
           capacity_scales: tuple = (), launch_ms=None) -> dict:
    """Requested, L2 and DRAM bytes of one pass (whole problem; cold L2 at each kernel),
    with the plan, each kernel's launch and prediction, and the model's constants.
    grid_order (fa2 forward only): the order CTAs are dispatched in, "query-major" (what
    the kernels do) or a what-if: "head-major", "swizzle-8" (see `_grid_order`).
    chip_range (lo, hi): the spread of the effective L2 capacity chip to chip, as factors
    of the model's C (`CHIP_CAPACITY_RANGE`): dram_read_bytes_range / dram_write_bytes_range
    are [low, high], the same model at C x hi and C x lo in every launch (v12; v11 ranged
    only the launches with private read-modify-write round trips); a warning names a pass
    whose range is wider than the bound (15 % or 16 MB) about its point. None: no range keys. capacity_scales: (what-if, `benchmarks/l2_edge_spread.py`)
    `dram_at_capacity_scales` lists [scale, reads, writes] of the whole pass at C x scale
    (every launch; background writes as at the point).
    launch_ms: the time model, (result, problem, hw) -> predicted ms of each launch, for the
    background writes (L2Model.background_write_rate); None: none are added (`iosim.levels`
    passes `iosim.timing`'s)."""
    hw = get_hardware(gpu) if isinstance(gpu, str) else gpu
    model = model or FITTED
    asked = problem
    problem, modelled_as, kernel = model_problem(algorithm, problem, hw, pass_=pass_,
                                                 kernel=kernel, tiling=tiling)
    plan = kernel_plan(algorithm, problem, hw, pass_=pass_, kernel=kernel, tiling=tiling)
    if tiling is not None:      # the one SRAM rule, on the kernel that runs the tiling
        check_tiling_fits(algorithm, plan.tiling, problem.d, problem.dtype, hw.sram_bytes,
                          footprint_bytes=plan.smem_bytes, kernel=f"{pass_} '{plan.kernel}'")
    too_big = levels_size_error(algorithm, problem, plan.tiling,
                                names=("N", "batch x heads", "the L2 / DRAM model"))
    if too_big:
        raise ConfigError(too_big)
    if grid_order != "query-major":
        if not (algorithm == "fa2" and pass_ == "fwd"):
            raise ValueError(f"grid_order={grid_order!r} is modelled for the fa2 forward only")
        if grid_order not in GRID_ORDERS:
            raise ValueError(f"grid_order={grid_order!r} is not known; allowed: {', '.join(GRID_ORDERS)}")
        plan = replace(plan, extra={**plan.extra, "grid_order": grid_order})
    rd, wr, atom = requested(problem, plan)
    factor = TC_CPASYNC_SECTOR_FACTOR if plan.kernel == "tc" else 1.0
    cap = model.capacity_fraction * hw.l2_bytes
    kernels, dr, dw = [], 0.0, 0.0
    rng_r, rng_w = [0.0, 0.0], [0.0, 0.0]          # chip-to-chip [low, high]
    spilled = 0.0           # resident frame bytes of a launch with the spilling bounds (v13)
    scaled = [[0.0, 0.0] for _ in capacity_scales]
    warnings = []
    if (algorithm, pass_, plan.kernel) in FEW_ROWS:
        warnings.append(f"the {algorithm} {pass_} '{plan.kernel}' kernels have few Nsight "
                        f"Compute rows: {FEW_ROWS[(algorithm, pass_, plan.kernel)]}")
    loc_rd = loc_wr = 0.0                          # local memory at the L2 (v13)
    for lau, build in _launches_and_streams(problem, plan, hw, model):
        st = Stream()
        slots = hw.sm_count * lau.ctas_per_sm
        build(st, slots)
        lr, lw = local_l2_bytes(lau, hw.sm_count)
        loc_rd, loc_wr = loc_rd + lr, loc_wr + lw
        ranged = chip_range is not None
        caps = ((cap,) + ((cap * chip_range[1], cap * chip_range[0]) if ranged else ())
                + tuple(cap * x for x in capacity_scales))
        at = dram_at_capacities(st, caps, model)
        (r, w), n = at[0], st.size
        dr, dw = dr + r, dw + w
        if ranged:
            # the larger capacity gives the low end, the smaller the high end; min / max
            # keep the point inside where the model is not monotone in C
            (r_big, w_big), (r_small, w_small) = at[1], at[2]
            lo_r, hi_r, lo_w, hi_w = min(r, r_big), max(r, r_small), min(w, w_big), max(w, w_small)
            if lau.local_frame_bytes:
                # v13: a spilling build's bounds (see CHIP_CAPACITY_RANGE): reads from the
                # compulsory ones (each byte once: the frameless stream in an unbounded L2) up to
                # every CTA's K/V loads (the pass's L2 reads: a spilling build is one fa2
                # forward launch), writes from none of the frames' to every step's
                # rewritten frame
                st0 = Stream()
                build(st0, slots, frames=False)
                # (without the frames, whose first touch the stream counts as a read: the
                # kernel stores a frame before it loads it)
                (_, w0), (r_inf, _) = dram_at_capacities(st0, (cap, UNBOUNDED_L2), model)
                lo_r = min(lo_r, r_inf)
                hi_r = max(hi_r, (rd - atom) * factor)
                lo_w = min(lo_w, w0)
                hi_w = max(hi_w, w0 + lau.frame_steps * min(lau.local_write_bytes,
                                                             lau.local_frame_bytes))
                spilled = max(spilled, lau.local_frame_bytes * min(lau.ctas, slots))
            rng_r[0] += lo_r
            rng_r[1] += hi_r
            rng_w[0] += lo_w
            rng_w[1] += hi_w
        for i, (sr, sw) in enumerate(at[len(caps) - len(capacity_scales):]):
            scaled[i][0] += sr
            scaled[i][1] += sw
        kernels.append({"name": lau.name, "ctas": lau.ctas, "threads": lau.threads,
                        "smem_bytes": lau.smem_bytes, "registers": lau.registers,
                        "ctas_per_sm": lau.ctas_per_sm, "spill_bytes": lau.spill_bytes,
                        "dram_read_bytes": r,
                        "dram_write_bytes": w, "simulated_accesses": n})
        if lau.spill_bytes:
            counted = model.local_memory and local_of(
                lau.name, plan.tiling.B_r, plan.tiling.B_c, problem.d, problem.causal) is not None
            warnings.append(f"{lau.name} spills about {lau.spill_bytes} bytes of registers per "
                            f"thread to local memory (ptxas): that traffic is not in the ledger"
                            + ("; its local-memory frames are in the DRAM predictions "
                               "(iosim.launch.plan.LOCAL, where they overflow the L1)" if counted
                               else " nor in these predictions"))
    res = {"gpu": hw.name, "algorithm": algorithm, "pass": pass_, "kernel": plan.kernel,
            "grid_order": grid_order,
            "block_rows": plan.tiling.B_r, "block_cols": plan.tiling.B_c,
            "requested_read_bytes": rd, "requested_write_bytes": wr,
            "l2_read_bytes": (rd - atom) * factor + loc_rd, "l2_write_bytes": wr - atom + loc_wr,
            "l2_local_read_bytes": loc_rd, "l2_local_write_bytes": loc_wr,
            "l2_atomic_bytes": atom,
            "dram_read_bytes": dr, "dram_write_bytes": dw, "kernels": kernels,
            "l2_model": {"capacity_fraction": model.capacity_fraction,
                         "associativity": model.associativity,
                         "private_footprint": model.private_footprint if model.replicate else 1.0,
                         "shared_footprint": model.shared_footprint if model.replicate else 1.0,
                         "drain_fraction": model.drain_fraction,
                         "dirty_fraction": model.dirty_fraction,
                         "keep_fraction": model.keep_fraction,
                         "home_written": model.home_written,
                         "partial_refetch": model.partial_refetch,
                         "local_memory": model.local_memory,
                         "background_write_rate": model.background_write_rate,
                         "sweep_lag": model.sweep_lag,
                         "causal_lag": model.causal_lag,
                         "private_rmw_capacity": model.private_rmw_capacity,
                         "capacity_bytes": cap}, "warnings": warnings}
    if modelled_as:
        res["dtype"], res["dtype_modelled_as"] = asked.dtype, modelled_as
        warnings.append(f"dtype {asked.dtype} modelled as its {modelled_as} build: the "
                        f"{asked.dtype} tensor-core kernels run the same tiles and move the "
                        f"same bytes (the trust statements say how far {asked.dtype} "
                        f"passes were measured)")
    if model.background_write_rate > 0 and launch_ms is not None:
        _add_background_writes(res, problem, hw, model, launch_ms)
    bg = sum(k.get("background_write_bytes", 0.0) for k in kernels)
    if capacity_scales:
        res["dram_at_capacity_scales"] = [[x, r, w + bg] for x, (r, w) in
                                          zip(capacity_scales, scaled)]
    if chip_range is not None:
        res["dram_read_bytes_range"] = rng_r
        res["dram_write_bytes_range"] = [rng_w[0] + bg, rng_w[1] + bg]
        res["l2_model"]["chip_capacity_range"] = list(chip_range)
        # what the range is: the chip-to-chip capacity spread, or a spilling build's bound
        res["dram_range_basis"] = "spill_bound" if spilled else "chip_capacity"
        wide = [k for k in ("dram_read_bytes", "dram_write_bytes")
                if not (within(res[k + "_range"][0], res[k]) and within(res[k + "_range"][1], res[k]))]
        if spilled:
            warnings.append(
                f"its resident local-memory frames ({spilled / 1e6:.0f} MB, "
                f"{spilled / cap:.2f} of the effective L2) take L2 room and traffic; where "
                "they fill much of it, its CTAs drift apart and "
                "re-read K/V tiles from DRAM that the point model (lockstep sweeps) counts as "
                "hits, and the L2 writes part of the frames back at every step, by amounts "
                "that differ chip to chip (iosim.memory): the range is the bound "
                "(reads: from the compulsory bytes up to every CTA's K/V loads; writes: from none "
                "of the frames' "
                "write-backs to every step's), and the point is not within the 15 % bound: "
                + _spans(res, ("dram_read_bytes", "dram_write_bytes")))
        elif wide:
            warnings.append(
                "this pass sits on the L2's capacity edge (its working set near the "
                "effective capacity): its DRAM bytes are not pinned down within the 15 % / "
                "16 MB bound; over the effective L2 capacities measured chip to chip "
                f"(x{chip_range[0]:g} to x{chip_range[1]:g} of the model's; at fa1's round "
                "trips the chip's own spread, at the K/V sweeps' edge the model's "
                "uncertainty) they span "
                + _spans(res, wide))
    return res


def _add_background_writes(res: dict, problem: Problem, hw, model: L2Model, launch_ms):
    """DRAM writes that grow with the kernel's duration (`L2Model.background_write_rate`):
    rate x each launch's time as `launch_ms` (the time model) predicts it from these levels
    before this term is added (so there is no loop). `iosim.predict_time` does not call
    this: it asks for the levels with background_write_rate 0 and adds the same bytes
    from its own launch times, so a pass is predicted once. Where the time model cannot
    predict the pass, nothing is added and a warning says so."""
    try:
        ms = launch_ms(res, problem, hw)
    except (ValueError, KeyError, OSError) as e:
        res["warnings"].append(f"background DRAM writes not counted: the time model cannot "
                               f"predict this pass ({e})")
        return
    if len(ms) != len(res["kernels"]):
        ms = [sum(ms) * (1.0 if i == 0 else 0.0) for i in range(len(res["kernels"]))]
    for k, m in zip(res["kernels"], ms):
        extra = model.background_write_rate * m / 1e3
        k["background_write_bytes"] = extra
        k["dram_write_bytes"] += extra
        res["dram_write_bytes"] += extra


def within(pred: float, meas: float, rel: float = 0.15, floor: float = 16e6) -> bool:
    """The issue's bound: within 15 % or 16 MB, whichever is larger."""
    return abs(pred - meas) <= max(rel * abs(meas), floor)
