"""Time model of gpu.decode's kernels (split-KV decoding): `predict_decode`.

It predicts the GPU time of one decoding step: the main kernel and, when num_splits S > 1,
the combine kernel and the gap between the two launches. Names as in gpu/decode/split_kv.py:
N_kv cache rows, S = num_splits, C = ceil(N_kv / S) chunk rows, readers R = batch x heads
(kv_reads "per_query_head") or batch x kv_heads ("per_group", NG = heads // kv_heads query
heads a block), NR = NG x N_q query rows a block, TB rows a tile (split_kv.plan: NT = 128
threads, VW = 16 / itemsize, LPR = d / VW, TB = NT / LPR x KPG).

The main kernel is bound by its SMs' issue rate of the tile loop, not by DRAM (the DRAM
term is a floor). Per kernel, in us:
  main kernel   t_main = t_main0 + max(t_tiles, t_dram)
      t_tiles = max(latency, issue): a CTA's tile loop is either bound by its own
              dependent chain or by its SM's issue rate shared with the SM's other CTAs;
          latency = T x (L_kv + L_q x NR)
          issue   = n x ((C / TB) x (c_kv + c_row x TB / 64 + c_sh x NR x KPG log2(LPR) / 16)
                         + c_cta)
          T = tiles of the heaviest CTA (contiguous: ceil(C / TB); paged: its chunk cut at
              page boundaries, ceil(segment / TB) a segment);
          n = ceil(S x R / SMs): CTAs on the busiest SM (all resident at once);
          c_kv: a 16 KB tile's K/V loads and barriers; c_row: per key row, x TB / 64;
              c_sh: per query row of the block, scaled by the warp's group-sum shuffle
              steps KPG log2(LPR); c_cta: a CTA's prologue (Q to shared) and epilogue;
      t_dram = the main kernel's HBM bytes (iosim.decode's ledger less the combine's)
               / (e_dram x hbm_bandwidth), e_dram = the time model's achieved DRAM
               fraction (`iosim.timing`'s runtime_constants.json), not fitted here;
      t_main0 = launch, ramp and the first tile's load latency, once a kernel.
  combine (S > 1), version 2 (gpu.decode's since 2026-12-07) and its candidate version 3
  (decode_combine_constants.json):
      t_comb = t_comb0 + W (c_blk + N_q rounds c_r) + combine bytes / (e_dram x hbm_bandwidth)
      rounds = ceil(S / (NW U)): warp w of the block's NW sums splits w, w + NW, .., U
      loads in flight a lane (iosim.launch.decode.combine_plan; NW = 8 in version 2,
      combine_warps(S) in version 3); W = waves of the batch x
      heads blocks over the SMs' block slots; t_comb0: the second launch's gap and fixed
      latency; c_blk: a block's reductions and stores; the bytes are Opart / Lpart read
      and O / L written. Version 1 (before; every decode row timed until then), kept to
      score those rows: t_comb = t_comb0 + S c_s + bytes / (e_dram bw), one thread a
      column summing every split in turn, its constants fitted with the tiled model's.
  predicted = t_main + t_comb; `binding` names the largest term.

Ragged batches (per-sequence cache_seqlens) in the tiled model, which was never timed on
one: CTA y S + s streams its own chunk C_b = ceil(n_b / S) (empty: none). T is the longest
CTA's tiles; the issue term is the busiest SM's sum over its own CTAs,
    issue = max_sm sum_{i = sm mod SMs} ((C_i / TB) x (c_kv + ...) + c_cta),
the CTAs dispatched round-robin in grid order (all resident at once, as above), which for
equal lengths is n x (the one CTA's work) exactly; the DRAM term takes the ragged ledger's
bytes. An appending step (the append kernel) is not modelled: predict_decode refuses it.

The streaming main kernels, the tensor-core one (gpu/decode/tc.py; gpu.decode's default in
fp16 / bf16 at d = 16, 64, 128) and the flat one (gpu/decode/flat.py), have no
shared-memory phases and no barrier in their key loops. Their model (`_stream_terms`, each
kernel with its own constants: decode_tc_constants.json, decode_flat_constants.json)
treats their CTAs as a fluid that shares the HBM. Each of the n CTAs running at once
moves key rows at the rate
    r(n) = 1 / max(L / TB,  (c_t + c_q NR) min(res, ceil(n / SMs)) / TB,  beta n / B)
with TB the rows of a step (tc: NW warps x B_c; flat: its lane groups' rows), L = L_t +
L_q NR [+ L_p on a paged cache] a step's latency alone, the second its SM's issue cost
shared by the CTAs there (res: the blocks an SM holds), B = e x hbm_bandwidth (e_tc,
e_flat: each kernel's achieved fraction) and beta the main kernel's bytes a key row (its
ledger / the CTAs' rows). The SMs' slots (SMs x res) take the CTAs in grid order, each as
a slot frees (a list schedule of their rows: every running CTA moves at the same rate, so
which ends first does not depend on r). While CTAs wait, every slot runs; once the last
one is placed, the tail runs with fewer and fewer, each faster until latency binds: a
ragged batch's long sequences end alone, a uniform grid's partial last wave runs at its
own rate.
  t_main = t_main0 + sum over the schedule's segments of rows_seg / r(n_seg) + c_cta W
(W: waves of the grid on the slots); the combine as above. The form before (tc version 2,
flat version 1: the larger of the heaviest CTA's chain, the busiest SM's sum and the DRAM
bound) over-predicted ragged batches where few long CTAs end alone and under-predicted
those where the long CTAs share the HBM before their tail.

The constants (decode_constants.json) were fitted on H100 fp16 rows with N_q = 1 and d 64 /
128 (`analysis.fit_decode`); other dtypes, N_q, d and presets are unvalidated and say so in
`warnings`. The measurements, fit and held-out scores: docs/models-history.md.
"""
from __future__ import annotations

import heapq
import json
import math
from pathlib import Path

import numpy as np

from ..decode import (DecodeProblem, decode_closed_form, sequence_chunks,
                      split_bounds)
from ..problem import ConfigError
from ..hardware import get_hardware
from ..launch.decode import (auto_num_splits, block_rows, combine_plan, combine_warps,
                             ctas_per_sm, flat_plan, main_kernel, plan, tc_plan)

CONSTANTS_PATH = Path(__file__).resolve().parent / "decode_constants.json"
MODEL_VERSION = "decode-time v1"
#: the flat main kernel's constants (`analysis.fit_decode fit --main flat`); absent until
#: measured rows of the flat kernel have been fitted, and predict_decode(main="flat") says so
FLAT_CONSTANTS_PATH = Path(__file__).resolve().parent / "decode_flat_constants.json"
FLAT_MODEL_VERSION = "decode-time flat v2"
#: the tensor-core main kernel's constants (`analysis.fit_decode fit --main tc`), the
#: streaming form (`_stream_terms`) with its own tile (NW warps x B_c rows) and resident blocks
TC_CONSTANTS_PATH = Path(__file__).resolve().parent / "decode_tc_constants.json"
TC_MODEL_VERSION = "decode-time tc v3"
#: the split-KV combine's versions: "v2" (gpu.decode's since 2026-12-07: the splits shared
#: among the block's 8 warps), "v3" (the same kernel with as many warps as S needs,
#: iosim.launch.decode.combine_warps: a candidate, not gpu.decode's until its GPU rows are
#: in) and "v1" (before 2026-12-07: one thread a column, every split in turn)
COMBINE_VERSIONS = ("v2", "v3", "v1")
#: versions 2 and 3's constants (one kernel, one form; `analysis.fit_decode fit-combine`,
#: from decode_combine rows)
COMBINE_CONSTANTS_PATH = Path(__file__).resolve().parent / "decode_combine_constants.json"
#: each streaming kernel's model version, achieved-DRAM-fraction constant and name
STREAM_MODELS = {"flat": (FLAT_MODEL_VERSION, "e_flat", "flat"),
                 "tc": (TC_MODEL_VERSION, "e_tc", "tensor-core")}


def stream_constants_path(main: str) -> Path:
    """The constants file of a streaming kernel's model ("flat" or "tc")."""
    return FLAT_CONSTANTS_PATH if main == "flat" else TC_CONSTANTS_PATH
ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}


# ---------------------------------------------------------------------------------------
# The kernels' shape (no GPU, no Numba)
# ---------------------------------------------------------------------------------------
def layout(d: int, dtype: str, NR: int) -> dict:
    """The split-KV decode kernel's GPU layout (NT, VW, LPR, NGRP, KPG, TB) for head dim d,
    dtype and NR query rows a block: its launch plan (`iosim.launch.decode.plan`), which
    refuses (ValueError) a layout the kernel cannot run."""
    p = plan(d, dtype, NR)
    return {k: p[k] for k in ("NT", "VW", "LPR", "NGRP", "KPG", "TB")}


def chunk_tiles(a: int, e: int, TB: int, page_size: int | None) -> int:
    """Tiles the main kernel's loop runs over the chunk [a, e): contiguous, ceil((e - a) /
    TB); paged, the chunk cut at page boundaries, ceil(segment / TB) a segment."""
    if e <= a:
        return 0
    if not page_size:
        return -(-(e - a) // TB)
    P, n, x = int(page_size), 0, a
    while x < e:
        y = min(e, (x // P + 1) * P)
        n += -(-(y - x) // TB)
        x = y
    return n


def kernel_shape(problem: DecodeProblem, num_splits: int, kv_reads: str) -> dict:
    """R, NR, layout, tiles T of the heaviest CTA, CTAs."""
    p = problem
    NG = 1 if kv_reads == "per_query_head" else p.group
    NR = NG * p.N_q
    lay = layout(p.d, p.dtype, NR)
    R = p.readers(kv_reads)
    if p.is_ragged:
        # every CTA's chunk, in dispatch order (CTA y S + s: reader y = b rpb + head group)
        rpb, out = R // p.batch, []
        for n in p.seqlens:
            one = [(e - a, chunk_tiles(a, e, lay["TB"], p.page_size))
                   for a, e in sequence_chunks(n, num_splits)]
            out += one * rpb
        return dict(R=R, NR=NR, layout=lay, T=max(t for _, t in out),
                    C=max(c for c, _ in out), ctas=num_splits * R,
                    cta_rows=[c for c, _ in out])
    b = split_bounds(p.N_kv, num_splits)
    T = max(chunk_tiles(a, e, lay["TB"], p.page_size) for a, e in b)
    C = max(e - a for a, e in b)
    return dict(R=R, NR=NR, layout=lay, T=T, C=C, ctas=num_splits * R)



# ---------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------
def load_constants(path=None, main: str = "tiled") -> dict:
    """The fitted constants document of the `main` kernel's model ("tiled", "flat" or
    "tc"); ConfigError (one line) for a streaming kernel's while none have been fitted."""
    if path is None and main in STREAM_MODELS:
        path = stream_constants_path(main)
        if not path.exists():
            raise ConfigError(f"main={main!r}: the {STREAM_MODELS[main][2]} decode kernel's time is not modelled "
                              f"yet (no measured rows fitted: analysis.fit_decode fit --main "
                              f"{main}); allowed: main='tiled' (the tiled kernel's model)")
    return json.loads(Path(path or CONSTANTS_PATH).read_text())


# ---------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------
def _bytes(p: DecodeProblem, S: int, kv_reads: str) -> tuple[str, int, int]:
    """(schedule, the main kernel's HBM bytes, the combine's) from iosim.decode's ledger:
    the combine reads Opart / Lpart and writes O / L when S > 1."""
    schedule = "fa2_decode" if S == 1 else "split_kv"
    led = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads)
    comb_read = led.read_bytes_of("Opart") + led.read_bytes_of("Lpart")
    comb_write = (led.write_bytes_of("O") + led.write_bytes_of("L")) if S > 1 else 0
    main_bytes = led.hbm_bytes - comb_read - comb_write
    return schedule, main_bytes, led.hbm_bytes - main_bytes


def _busiest_sm(work, sm_count: int) -> float:
    """The busiest SM's sum of its CTAs' `work` (us), the CTAs dispatched round-robin in
    grid order, all resident at once."""
    work = np.asarray(work, dtype=np.float64)
    return float(np.bincount(np.arange(work.size) % sm_count, weights=work).max())


def _step_terms(t_main0: float, t_tiles: float, t_dram: float, comb_terms: dict) -> dict:
    """A step's terms (us): the main kernel's fixed time and the larger of its tile and
    DRAM bounds, then the combine's (`combine_terms`; empty when S = 1)."""
    terms = {"main_fixed": t_main0, "main_tiles": t_tiles if t_tiles >= t_dram else 0.0,
             "main_dram": t_dram if t_dram > t_tiles else 0.0}
    terms.update(comb_terms)
    return terms


def load_combine_constants(path=None) -> dict | None:
    """The version 2 / 3 combine's fitted constants document, None while none are fitted."""
    path = Path(path or COMBINE_CONSTANTS_PATH)
    return json.loads(path.read_text()) if path.exists() else None


def check_combine(version) -> str:
    """`version` if it is one of COMBINE_VERSIONS, else ConfigError (one line)."""
    if version not in COMBINE_VERSIONS:
        raise ConfigError(f"combine={version!r} is not allowed; allowed: "
                          f"{', '.join(map(repr, COMBINE_VERSIONS))}")
    return version


def combine_terms(problem: DecodeProblem, S: int, comb_bytes: int, hw, version: str = "v2",
                  v1: dict | None = None, constants: dict | None = None) -> dict:
    """The split-KV combine's terms (us) for S splits (none when S = 1), of the kernel
    `version` (module docstring): "v2", today's, or "v3", its candidate (constants: their
    document's constants, default decode_combine_constants.json), or "v1", the one before
    2026-12-07 (v1: the tiled model's constants t_comb0, c_s, e_dram; default
    decode_constants.json), with which every decode row measured before then was timed."""
    if S <= 1:
        return {}
    if check_combine(version) == "v1":
        k = v1 or load_constants(main="tiled")["constants"]
        bw = k["e_dram"] * hw.hbm_bandwidth / 1e6          # bytes per us
        return dict(combine_fixed=k["t_comb0"], combine_splits=S * k["c_s"],
                    combine_dram=comb_bytes / bw)
    k = constants or load_combine_constants()["constants"]
    p = problem
    pl = combine_plan(S, p.N_q, p.d, warps=combine_warps(S) if version == "v3" else None)
    waves = -(-(p.batch * p.heads) // (hw.sm_count * pl["per_sm"]))
    bw = k["e_dram"] * hw.hbm_bandwidth / 1e6
    return dict(combine_fixed=k["t_comb0"],
                combine_rounds=waves * (k["c_blk"] + p.N_q * pl["rounds"] * k["c_r"]),
                combine_dram=comb_bytes / bw)


def _terms(problem: DecodeProblem, S: int, kv_reads: str, hw, k: dict,
           combine: str = "v2", v2: dict | None = None) -> dict:
    p = problem
    sh = kernel_shape(p, S, kv_reads)
    schedule, main_bytes, comb_bytes = _bytes(p, S, kv_reads)
    bw = k["e_dram"] * hw.hbm_bandwidth / 1e6          # bytes per us
    n = -(-sh["ctas"] // hw.sm_count)
    lay, NR = sh["layout"], sh["NR"]
    latency = sh["T"] * (k["L_kv"] + k["L_q"] * NR)
    steps = lay["KPG"] * math.log2(lay["LPR"])        # group-sum shuffle steps a warp, a row
    per_tile = (k["c_kv"] + k["c_row"] * lay["TB"] / 64
                + NR * k["c_sh"] * steps / 16)
    if "cta_rows" in sh:    # a ragged batch: the busiest SM's sum over its own CTAs
        work = np.asarray(sh["cta_rows"], dtype=np.float64) / lay["TB"] * per_tile + k["c_cta"]
        issue = _busiest_sm(work, hw.sm_count)
    else:
        issue = n * (sh["C"] / lay["TB"] * per_tile + k["c_cta"])
    t_tiles = max(latency, issue)
    t_dram = main_bytes / bw
    terms = _step_terms(k["t_main0"], t_tiles, t_dram,
                        combine_terms(p, S, comb_bytes, hw, combine, v1=k, constants=v2))
    info = dict(schedule=schedule, num_splits=S, kv_reads=kv_reads, readers=sh["R"],
                NR=sh["NR"], tiles_per_cta=sh["T"], ctas=sh["ctas"], ctas_per_busiest_sm=n,
                sm_count=hw.sm_count, layout=sh["layout"], main_hbm_bytes=main_bytes,
                combine_hbm_bytes=comb_bytes, t_tiles_us=t_tiles, t_dram_us=t_dram)
    return terms, info


def flat_shape(problem: DecodeProblem, num_splits: int, kv_reads: str,
               kernel: str = "flat") -> dict:
    """A streaming kernel's ("flat" or "tc") R, NR, layout (`flat_plan` / `tc_plan`), rows
    TB a block takes a step (flat: its groups' rows; tc: NW warps x B_c), tiles T of the
    heaviest CTA (ceil(C / TB): both find each row's page themselves, so pages do not cut
    their tiles), C, CTAs, resident blocks an SM, and every CTA's rows in dispatch order."""
    p = problem
    NR = block_rows(p, kv_reads)
    if kernel == "tc":
        lay = tc_plan(p.d, p.dtype, NR)
        if lay is None:
            raise ConfigError(f"main='tc' does not run {NR} query rows a block at d={p.d} "
                              f"({p.dtype}); allowed: main='flat' or 'tiled'")
        lay = dict(NT=lay["NT"], NW=lay["NW"], BC=lay["BC"], STG=lay["STG"],
                   TB=lay["NW"] * lay["BC"], smem_bytes=lay["smem_bytes"])
    else:
        lay = flat_plan(p.d, p.dtype, NR)
        if lay is None:
            raise ConfigError(f"main='flat' does not run {NR} query rows a block at d={p.d} "
                              f"({p.dtype}); allowed: main='tiled'")
        lay = {k: lay[k] for k in ("NT", "VW", "LPR", "NGRP", "KPG", "TB")}
    # the blocks an SM holds: what the split rule aims at (iosim.launch.decode)
    resident = ctas_per_sm(p, kv_reads, kernel)
    R = p.readers(kv_reads)
    if p.is_ragged:
        rpb, rows = R // p.batch, []
        for n in p.seqlens:
            rows += [e - a for a, e in sequence_chunks(n, num_splits)] * rpb
    else:
        rows = [e - a for a, e in split_bounds(p.N_kv, num_splits)] * R
    C = max(rows)
    return dict(R=R, NR=NR, layout=lay, T=-(-C // lay["TB"]), C=C, ctas=num_splits * R,
                cta_rows=rows, resident=resident)


def schedule_segments(cta_rows, slots: int) -> np.ndarray:
    """The list schedule of CTAs of `cta_rows` key rows each (grid order) on `slots` slots
    that run every CTA at one rate: rows (dw, n) a segment, n CTAs running through dw rows
    of each, first the part where all slots run, then the tail (empty CTAs take no slot
    time). sum(dw x n) = sum(cta_rows)."""
    rows = np.asarray(cta_rows, dtype=np.float64)
    n = rows.size
    if n == 0 or not rows.any():
        return np.zeros((0, 2))
    if n > slots and np.all(rows == rows[0]):           # a uniform grid: waves, closed form
        q, rem = divmod(n, slots)
        segs = [(q * rows[0], slots)] + ([(rows[0], rem)] if rem else [])
        return np.array(segs, dtype=np.float64)
    if n <= slots:
        ends, V = np.sort(rows), 0.0
    else:
        heap = list(rows[:slots])
        heapq.heapify(heap)
        V = 0.0
        for r in rows[slots:]:
            V = heapq.heappop(heap)
            heapq.heappush(heap, V + r)
        ends = np.sort(np.asarray(heap))
    segs = [(V, slots)] if V > 0 else []            # V > 0 only where CTAs waited
    prev, running = V, ends.size
    for e in ends:
        if e > prev:
            segs.append((e - prev, running))
        prev, running = e, running - 1
    return np.array(segs, dtype=np.float64).reshape(-1, 2)


def _stream_terms(problem: DecodeProblem, S: int, kv_reads: str, hw, k: dict, comb: dict,
                  kernel: str = "tc", combine: str = "v2",
                  v2: dict | None = None) -> tuple[dict, dict]:
    """A streaming main kernel's terms (us; "tc" or "flat", each with its own constants,
    tile TB and resident blocks), its CTAs a fluid sharing the HBM (module docstring), then
    the combine's (S > 1, `combine_terms`; comb: the tiled model's constants, version
    1's): main_fixed t_main0, main_tiles the segments' time where latency or issue binds
    (and c_cta a wave), main_dram where the HBM does."""
    p = problem
    sh = flat_shape(p, S, kv_reads, kernel)
    schedule, main_bytes, comb_bytes = _bytes(p, S, kv_reads)
    TB, NR, res = sh["layout"]["TB"], sh["NR"], sh["resident"]
    slots = hw.sm_count * res
    segs = schedule_segments(sh["cta_rows"], slots)
    dw, n = segs[:, 0], segs[:, 1]
    beta = main_bytes / max(1, sum(sh["cta_rows"]))      # bytes a key row
    bw = k[STREAM_MODELS[kernel][1]] * hw.hbm_bandwidth / 1e6      # bytes per us
    L = k["L_t"] + k["L_q"] * NR + (k.get("L_p", 0.0) if p.page_size else 0.0)
    per_row_lat = np.maximum(L / TB, (k["c_t"] + k["c_q"] * NR)
                             * np.minimum(res, np.ceil(n / hw.sm_count)) / TB)
    per_row_dram = beta * n / bw
    dram = per_row_dram >= per_row_lat
    waves = -(-sh["ctas"] // slots)
    t_dram = float(np.sum((dw * per_row_dram)[dram]))
    t_tiles = float(np.sum((dw * per_row_lat)[~dram])) + k["c_cta"] * waves
    terms = {"main_fixed": k["t_main0"], "main_tiles": t_tiles, "main_dram": t_dram}
    terms.update(combine_terms(p, S, comb_bytes, hw, combine, v1=comb, constants=v2))
    info = dict(schedule=schedule, num_splits=S, kv_reads=kv_reads, readers=sh["R"],
                NR=NR, tiles_per_cta=sh["T"], ctas=sh["ctas"],
                ctas_per_busiest_sm=-(-sh["ctas"] // hw.sm_count), waves=waves,
                sm_count=hw.sm_count, layout=sh["layout"], main_hbm_bytes=main_bytes,
                combine_hbm_bytes=comb_bytes, t_tiles_us=t_tiles, t_dram_us=t_dram)
    return terms, info


def _uniform(problem: DecodeProblem, num_splits) -> DecodeProblem:
    """The problem with one N_kv that a ragged problem of equal lengths (no append, every
    split non-empty) is; other ragged problems as they are (`_terms` models their
    makespan); ConfigError (one line, why) for an append: the append kernel has no
    measured rows."""
    p = problem
    if not p.is_ragged:
        return p
    if p.append:
        raise ConfigError("an appending step (append=True) is not modelled: the append "
                          "kernel gpu.decode launches first has no measured rows")
    n = p.seqlens[0]
    if any(x != n for x in p.seqlens) or n == 0 or (
            num_splits is not None and (num_splits - 1) * -(-n // num_splits) >= n):
        return p                        # ragged: _terms' makespan over the grid
    q = DecodeProblem(N_kv=n, d=p.d, batch=p.batch, heads=p.heads, kv_heads=p.kv_heads,
                      N_q=p.N_q, dtype=p.dtype, page_size=p.page_size)
    return q


def predict_decode(problem: DecodeProblem, gpu: str = "H100-SXM", num_splits=None, *,
                   kv_reads: str = "per_query_head", constants=None, main: str = "auto",
                   combine: str = "v2") -> dict:
    """Predicted time of gpu.decode's kernels for one decoding step.

    num_splits None: the rule gpu.decode uses for that main kernel (iosim.choose_num_splits
    on the preset's SM count and iosim.launch.decode.ctas_per_sm). Returns predicted_ms,
    main_ms, combine_ms (0 when S = 1), terms (us, each term's value), shares (of the
    total), binding (the largest term), main_binding ("tiles" or "dram": which of the main
    kernel's bounds is taken), main (the kernel modelled), the shape numbers, and
    `warnings`: where the prediction leaves what was measured (dtype, N_q, d or preset
    outside the fitted rows), each a sentence.
    Per-sequence lengths: equal lengths without an append are predicted as the same
    problem with one N_kv; a ragged batch by the same terms over its own CTAs (see the
    module docstring; a warning says it is unvalidated where that kernel's model was fitted
    on no ragged row, the tiled one's); an appending batch raises
    ConfigError (one line: why) rather than give a number the model was not built for.
    main: "auto" (the default: the kernel gpu.decode's default runs,
    iosim.launch.decode.main_kernel), "tiled" (gpu.decode's main="tiled"), "flat"
    (main="flat") or "tc" (main="tc", the flat form with the tensor-core kernel's own
    constants); ConfigError while a kernel's constants are not fitted or where it does not
    run. With main="tiled" a warning says where gpu.decode's default runs the tensor-core
    or flat kernel instead; a flat or tc prediction carries its model's held-out score.
    combine: the split-KV combine's version whose time is added (S > 1): "v2" (today's
    gpu.decode; while its constants are not fitted, version 1's are used and a warning
    says so), "v3" (its candidate whose warps follow S) or "v1" (the one every decode row
    before 2026-12-07 was timed with)."""
    if main not in ("tiled", "flat", "tc", "auto"):
        raise ConfigError(f"main={main!r} is not allowed; allowed: 'tiled', 'flat', 'tc', "
                          f"'auto'")
    problem = _uniform(problem, num_splits)
    kernel = main_kernel(problem, kv_reads) if main == "auto" else main
    hw = get_hardware(gpu)
    c = constants or load_constants(main=kernel)
    warnings = []
    default = main_kernel(problem, kv_reads) if main == "tiled" else kernel
    if kernel == "tiled" and default != "tiled":
        name = STREAM_MODELS[default][2]
        warnings.append(f"this is the tiled main kernel's time (gpu.decode main='tiled'); "
                        f"gpu.decode's default runs the {name} kernel here (main='auto', "
                        f"flashsim traffic --main auto, predicts that one)")
    fitted = c.get("fitted_space", {"dtype": ["fp16"], "N_q": [1], "d": [64, 128],
                                    "gpu": get_hardware("H100-SXM").name})
    if problem.dtype not in fitted["dtype"]:
        warnings.append(f"dtype={problem.dtype!r}: only {'/'.join(fitted['dtype'])} decode "
                        f"kernels were timed; their constants are used, unvalidated")
    if problem.N_q not in fitted["N_q"]:
        warnings.append(f"N_q={problem.N_q}: only N_q = {', '.join(map(str, fitted['N_q']))} "
                        f"was timed; unvalidated")
    if problem.d not in fitted["d"]:
        warnings.append(f"d={problem.d}: only d = {' and '.join(map(str, fitted['d']))} were "
                        f"timed; unvalidated")
    if hw.name != fitted["gpu"]:
        warnings.append(f"gpu={gpu!r}: the constants were fitted on the {fitted['gpu']}; this "
                        f"preset changes only the SM count and HBM bandwidth, untested (no "
                        f"decode rows on it)")
    held = c.get("heldout") if kernel in STREAM_MODELS else None
    if held:
        warnings.append(f"the {STREAM_MODELS[kernel][2]} kernel's model: held-out median {100 * held['median']:.1f} %, "
                        f"{held['within_10pct']} of {held['rows']} rows within 10 % "
                        f"(fitted on the other half of one {fitted['gpu']} run)")
    if problem.is_ragged and not c.get("ragged_validated"):
        warnings.append(f"a ragged batch (lengths {min(problem.seqlens)} to "
                        f"{max(problem.seqlens)}): the main kernel's latency term takes the "
                        f"longest CTA and its issue term the busiest SM's sum over its own "
                        f"CTAs (dispatched round-robin); no ragged row was measured, "
                        f"unvalidated")
    if num_splits is None:
        num_splits = auto_num_splits(problem, hw.sm_count, kv_reads, kernel).num_splits
    v2 = None
    if check_combine(combine) != "v1" and int(num_splits) > 1:
        v2 = load_combine_constants()           # read once for the prediction
    if combine != "v1" and int(num_splits) > 1 and v2 is None:
        combine = "v1"
        warnings.append("the split-KV combine's time is version 1's (one thread a column, "
                        "before 2026-12-07): today's combine has no fitted constants yet "
                        "and is faster, so this over-predicts where S is large")
    if kernel in STREAM_MODELS:
        comb = load_constants(main="tiled")["constants"]
        terms, info = _stream_terms(problem, int(num_splits), kv_reads, hw, c["constants"], comb,
                                  kernel, combine, v2 and v2["constants"])
    else:
        terms, info = _terms(problem, int(num_splits), kv_reads, hw, c["constants"], combine,
                             v2 and v2["constants"])
    total = sum(terms.values())
    main_us = sum(v for t, v in terms.items() if t.startswith("main"))
    version = c.get("model_version", STREAM_MODELS[kernel][0] if kernel in STREAM_MODELS
                    else MODEL_VERSION)
    return dict(predicted_ms=total / 1e3, main_ms=main_us / 1e3,
                combine_ms=(total - main_us) / 1e3, gpu=gpu, main=kernel, terms_us=terms,
                shares={t: v / total for t, v in terms.items()},
                binding=max(terms, key=terms.get),
                main_binding="tiles" if info["t_tiles_us"] >= info["t_dram_us"] else "dram",
                model_version=version, combine=combine, warnings=warnings, **info)
