"""Time model of gpu.decode's kernels (split-KV decoding): `predict_decode`.

What it predicts: the GPU time of one decoding step as `scripts/decode_bench.py` times it
(CUDA events around DecodeLauncher's call, the stream held by torch.cuda._sleep, so the
events time GPU work): the main kernel, and when num_splits S > 1 also the combine kernel
and the gap between the two launches. Kernel names as in gpu/decode/split_kv.py: N_kv
cache rows, S = num_splits, C = ceil(N_kv / S) chunk rows, readers R = batch x heads
(kv_reads "per_query_head") or batch x kv_heads ("per_group", NG = heads // kv_heads
query heads a block), NR = NG x N_q query rows a block, TB rows a tile (split_kv.plan:
NT = 128 threads, VW = 16 / itemsize, LPR = d / VW, TB = NT / LPR x KPG; for fp16 a tile
is always 4096 K elements + 4096 V elements = 16 KB, whatever d).

What the rows say (decode_bench-20261125T101238-ceff05, H100 SXM, fp16, N_q = 1):
  * the kernel does not stream K/V at the HBM rate: the best rows reach about 1.05 TB/s
    (MHA, d = 128, batch 64), 31 % of 3.35 TB/s, and the grouped rows (per_group, NR = 4)
    about 0.45 TB/s. Time scales with tiles x query rows per block, not with bytes: the
    main kernel is bound by the SM's issue rate of the tile loop (16-byte loads, the
    group-sum shuffles, two __syncthreads, the online softmax, P V from shared memory),
    not by DRAM. The DRAM term below is a floor that binds on none of the measured rows.
  * dram_bytes (K/V once, Q, O, L, block table) and iosim.decode's ledger_bytes differ
    only by the Opart / Lpart round trip of split_kv (at most 6 % of K/V bytes by the
    num_splits rule) and, for MHA, by nothing else: K/V are read once per reader. The
    bench rotates >= 200 MB of cache copies, so the 50 MB L2 serves none of K/V between
    calls even at the smallest caches (2 MB); the partials' round trip is small either way.

Model (per kernel; us unless named):
  main kernel   t_main = t_main0 + max(t_tiles, t_dram)
      t_tiles = max(latency, issue): a CTA's tile loop is either bound by its own
              dependent chain (one tile of loads in flight, barriers, the softmax) or by
              its SM's issue rate shared with the SM's other CTAs;
          latency = T x (L_kv + L_q x NR)
          issue   = n x ((C / TB) x (c_kv + c_row x TB / 64 + c_sh x NR x KPG log2(LPR) / 16)
                         + c_cta)
          T = tiles of the heaviest CTA (contiguous: ceil(C / TB); paged: its chunk cut at
              page boundaries, ceil(segment / TB) a segment), C / TB its tiles counted by
              rows (a ragged last tile issues for its rows only, but waits a whole tile);
          n = ceil(S x R / SMs): CTAs on the busiest SM (SMs from the preset; every CTA of
              these grids is resident at once: 128 threads, <= 35 KB shared memory);
          c_kv: a 16 KB tile's K/V loads and barriers; c_row: per key row (S store, softmax
              columns), x TB / 64; c_sh: per query row of the block, scaled by the warp's
              group-sum shuffle steps KPG log2(LPR) (12 at d = 64, 16 at d = 128): with d in
              {64, 128} only, this and c_row are the 2 x 2 table of (d, NR) costs, not
              separately tested; c_cta: a CTA's prologue (Q to shared) and epilogue.
      t_dram = the main kernel's HBM bytes (iosim.decode's ledger less the combine's)
               / (e_dram x hbm_bandwidth), e_dram = the form-9 runtime model's achieved
               DRAM fraction (analysis/runtime_constants.json): no decode row binds it, so
               it is not fitted here (the kernel reaches <= 31 % of the HBM peak).
      t_main0 = launch, ramp and the first tile's load latency, once a kernel.
  combine (S > 1)  t_comb = t_comb0 + S x c_s + combine bytes / (e_dram x hbm_bandwidth)
      t_comb0: the second launch's gap plus its fixed latency (fitted 0: the fit half cannot
      tell it from t_main0 and c_cta); c_s: each thread's serial loop over the S partials;
      the bytes are Opart / Lpart read and O / L written (small).
  predicted = t_main + t_comb; `binding` names the largest term.

Fitted constants (analysis/decode_time_constants.json): t_main0, L_kv, L_q, c_kv, c_row,
c_sh, c_cta, t_comb0, c_s, by least squares on log time (scipy.optimize.least_squares,
bounds >= 0; relative errors weigh small and large rows alike) over the 168 fit-half
flashsim rows (`split_of`); `python3 -m analysis.decode_time fit` refits and writes the
JSON, `... validate` rewrites the decode_time_validation rows and prints the scores,
`... constants` prints the constants. The form was chosen on the fit half's residuals
(a shuffle term in a first additive form fitted 0; a smooth max fitted a hard one).

Held-out accuracy (the 188 held-out rows; HELDOUT_SUMMARY, checked against the committed
rows by tests/test_decode_time.py): |pred/meas - 1| median 4.0 %, worst 19.6 %, 164 of
188 within 10 %; fa2_decode 3.2 % / 18.6 % / 43 of 47; split_kv 4.0 % / 19.6 % / 121 of
141; contiguous 4.0 % / 19.6 % / 102 of 115; paged 3.8 % / 19.2 % / 62 of 73; small
cache (N_kv <= 4096) 3.7 % / 17.6 % / 63 of 68; large 4.1 % / 19.6 % / 101 of 120.
Not a blind score: while the form was being developed, the held-out summaries of two
earlier, worse variants were printed (medians 7.7 % and 10.1 %); the changes were chosen
on the fit half's residuals, but the held-out half was not wholly unseen. A blind set of
decode rows, declared before measuring, is the test still to run.
Regimes it misses: (a) MHA at d = 128 with one or two CTAs a SM (batch 1, S <= 4: the
latency chain at d = 128 is shorter than the d-blind L_kv + L_q NR says), +18 to +20 %;
(b) grouped d = 128 at three CTAs on the busiest SM (S = 36..49 of the paged sweep),
-14 to -19 %: measured time jumps 64 % from two to three CTAs a SM where the model's issue
bound adds 50 %; (c) the sweep rows' own noise (neighbouring S differing by 20-40 %).

Kernel version. The rows were timed at commit e5d20a2. Since then gpu/decode gained a
shared lane-group reducer (d92cf59) and bf16 (352fecd, 70fcfa1); the normalised PTX of 16
fp16 main-kernel builds (d 64 / 128, NG 1 / 4, S = 1 / > 1, contiguous / paged) and of the
fp16 combine (d 64 / 128) compiled at e5d20a2 and at 2f78a13 is identical (checked
2026-11-27), so the model describes today's fp16 kernels. bf16 (element-by-element K/V
loads) and fp32 were never timed: predictions for them reuse the fp16 constants and are
unvalidated. No H200 decode rows exist: an H200 prediction is the H200 preset (SM count,
HBM bandwidth) with the H100 constants; since the H100 rows are issue-bound, it predicts
about the same time, which is untested.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

from iosim import DecodeProblem, choose_num_splits, decode_closed_form, get_hardware
from iosim.decode import split_bounds

HERE = Path(__file__).resolve().parent
CONSTANTS_PATH = HERE / "decode_time_constants.json"
ROOT = HERE.parent
BENCH_PATH = ROOT / "benchmarks" / "results" / "data" / "decode_bench.jsonl"
VALIDATION_PATH = ROOT / "benchmarks" / "results" / "data" / "decode_time_validation.jsonl"
KIND = "decode_time_validation"
MODEL_VERSION = "decode-time v1"

#: the fields of a decode_bench row that name its configuration (the split's key)
SPLIT_KEY_FIELDS = ("batch", "heads", "kv_heads", "seq_len_q", "seq_len_kv", "d", "dtype",
                    "paged", "kv_reads", "num_splits", "schedule", "sweep")
#: fitted constants (us), in the order of the fit
FITTED = ("t_main0", "L_kv", "L_q", "c_kv", "c_row", "c_sh", "c_cta", "t_comb0", "c_s")
#: cache rows at or below which a row counts as "small cache" in the per-group summary
SMALL_CACHE = 4096
ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}

#: the held-out half's scores at the committed constants (regenerate with `validate`;
#: tests/test_decode_time.py recomputes them from the committed validation rows)
HELDOUT_SUMMARY = {
    "all": {"rows": 188, "median": 0.0397, "worst": 0.1957, "within_10pct": 164},
    "schedule=fa2_decode": {"rows": 47, "median": 0.0325, "worst": 0.1855, "within_10pct": 43},
    "schedule=split_kv": {"rows": 141, "median": 0.0403, "worst": 0.1957, "within_10pct": 121},
    "layout=contiguous": {"rows": 115, "median": 0.0399, "worst": 0.1957, "within_10pct": 102},
    "layout=paged": {"rows": 73, "median": 0.0384, "worst": 0.1918, "within_10pct": 62},
    "cache=large": {"rows": 120, "median": 0.0407, "worst": 0.1957, "within_10pct": 101},
    "cache=small": {"rows": 68, "median": 0.0368, "worst": 0.1761, "within_10pct": 63},
}


def split_of(row: dict) -> str:
    """"heldout" or "fit" for a measured decode_bench row.

    Fixed before any fitting (committed first, on its own, in 8ec6d9c, before any constant
    was fitted): key = json.dumps({k: row.get(k) for k in SPLIT_KEY_FIELDS},
    sort_keys=True); the row is held out when the first byte of sha256(key) is odd, else
    it is in the fit half."""
    key = json.dumps({k: row.get(k) for k in SPLIT_KEY_FIELDS}, sort_keys=True)
    return "heldout" if hashlib.sha256(key.encode()).digest()[0] % 2 else "fit"


# ---------------------------------------------------------------------------------------
# The kernels' shape (no GPU, no Numba)
# ---------------------------------------------------------------------------------------
def layout(d: int, dtype: str, NR: int) -> dict:
    """gpu.decode.split_kv.plan's GPU layout (NT, VW, LPR, NGRP, KPG, TB), without Numba."""
    itemsize = ITEMSIZE[dtype]
    NT = 128
    VW = 16 // itemsize
    if d % VW or 32 % (d // VW) and d // VW > 32:
        VW = 1
    LPR = d // VW
    while LPR > 32:
        VW *= 2
        LPR = d // VW
    A = -(-NR * d // NT)
    while A > 64 and NT < 1024:
        NT *= 2
        A = -(-NR * d // NT)
    NGRP = NT // LPR
    KPG = max(1, min(64 // NGRP, 32 // VW))
    return dict(NT=NT, VW=VW, LPR=LPR, NGRP=NGRP, KPG=KPG, TB=NGRP * KPG)


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
    b = split_bounds(p.N_kv, num_splits)
    T = max(chunk_tiles(a, e, lay["TB"], p.page_size) for a, e in b)
    C = max(e - a for a, e in b)
    return dict(R=R, NR=NR, layout=lay, T=T, C=C, ctas=num_splits * R)


# ---------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------
def load_constants(path=None) -> dict:
    return json.loads(Path(path or CONSTANTS_PATH).read_text())


def e_dram_from_runtime() -> float:
    """The runtime model's achieved DRAM fraction (not fitted on decode rows)."""
    from analysis.runtime import RuntimeModel
    return float(RuntimeModel.load().e_dram)


def print_constants(constants=None) -> None:
    c = constants or load_constants()
    print(f"decode time model ({c.get('model_version', MODEL_VERSION)}), constants:")
    for k, v in c["constants"].items():
        unit = "" if k == "e_dram" else " us"
        print(f"  {k:8s} {v:10.4f}{unit}   {c['meaning'].get(k, '')}")
    print(f"source: {c['source']}")


# ---------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------
def _terms(problem: DecodeProblem, S: int, kv_reads: str, hw, k: dict) -> dict:
    p = problem
    sh = kernel_shape(p, S, kv_reads)
    schedule = "fa2_decode" if S == 1 else "split_kv"
    led = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads)
    comb_read = led.read_bytes_of("Opart") + led.read_bytes_of("Lpart")
    comb_write = (led.write_bytes_of("O") + led.write_bytes_of("L")) if S > 1 else 0
    main_bytes = led.hbm_bytes - comb_read - comb_write
    comb_bytes = led.hbm_bytes - main_bytes
    bw = k["e_dram"] * hw.hbm_bandwidth / 1e6          # bytes per us
    n = -(-sh["ctas"] // hw.sm_count)
    lay, NR = sh["layout"], sh["NR"]
    latency = sh["T"] * (k["L_kv"] + k["L_q"] * NR)
    steps = lay["KPG"] * math.log2(lay["LPR"])        # group-sum shuffle steps a warp, a row
    per_tile = (k["c_kv"] + k["c_row"] * lay["TB"] / 64
                + NR * k["c_sh"] * steps / 16)
    issue = n * (sh["C"] / lay["TB"] * per_tile + k["c_cta"])
    t_tiles = max(latency, issue)
    t_dram = main_bytes / bw
    terms = {"main_fixed": k["t_main0"], "main_tiles": t_tiles if t_tiles >= t_dram else 0.0,
             "main_dram": t_dram if t_dram > t_tiles else 0.0}
    if S > 1:
        terms.update(combine_fixed=k["t_comb0"], combine_splits=S * k["c_s"],
                     combine_dram=comb_bytes / bw)
    info = dict(schedule=schedule, num_splits=S, kv_reads=kv_reads, readers=sh["R"],
                NR=sh["NR"], tiles_per_cta=sh["T"], ctas=sh["ctas"], ctas_per_busiest_sm=n,
                sm_count=hw.sm_count, layout=sh["layout"], main_hbm_bytes=main_bytes,
                combine_hbm_bytes=comb_bytes, t_tiles_us=t_tiles, t_dram_us=t_dram)
    return terms, info


def predict_decode(problem: DecodeProblem, gpu: str = "H100-SXM", num_splits=None, *,
                   kv_reads: str = "per_query_head", constants=None) -> dict:
    """Predicted time of gpu.decode's kernels for one decoding step.

    num_splits None: the rule gpu.decode uses (iosim.choose_num_splits on the preset's SM
    count). Returns predicted_ms, main_ms, combine_ms (0 when S = 1), terms (us, each
    term's value), shares (of the total), binding (the largest term), main_binding ("tiles"
    or "dram": which of the main kernel's two bounds is taken), the shape numbers, and
    `warnings`: where the prediction leaves what was measured (a dtype other than fp16,
    N_q > 1, d other than 64 / 128, a preset other than the H100's), each a sentence."""
    hw = get_hardware(gpu)
    warnings = []
    if problem.dtype != "fp16":
        warnings.append(f"dtype={problem.dtype!r}: only fp16 decode kernels were timed; the "
                        f"fp16 constants are used, unvalidated")
    if problem.N_q != 1:
        warnings.append(f"N_q={problem.N_q}: only N_q = 1 was timed; unvalidated")
    if problem.d not in (64, 128):
        warnings.append(f"d={problem.d}: only d = 64 and 128 were timed; unvalidated")
    if hw.name != get_hardware("H100-SXM").name:
        warnings.append(f"gpu={gpu!r}: the constants were fitted on the H100; this preset "
                        f"changes only the SM count and HBM bandwidth, untested (no decode "
                        f"rows on it)")
    if num_splits is None:
        num_splits = choose_num_splits(problem, hw.sm_count, kv_reads=kv_reads).num_splits
    c = constants or load_constants()
    terms, info = _terms(problem, int(num_splits), kv_reads, hw, c["constants"])
    total = sum(terms.values())
    main = sum(v for t, v in terms.items() if t.startswith("main"))
    return dict(predicted_ms=total / 1e3, main_ms=main / 1e3, combine_ms=(total - main) / 1e3,
                gpu=gpu, terms_us=terms, shares={t: v / total for t, v in terms.items()},
                binding=max(terms, key=terms.get),
                main_binding="tiles" if info["t_tiles_us"] >= info["t_dram_us"] else "dram",
                model_version=c.get("model_version", MODEL_VERSION), warnings=warnings,
                **info)


# ---------------------------------------------------------------------------------------
# Rows, fit, validation
# ---------------------------------------------------------------------------------------
def measured_rows(path=None) -> list[dict]:
    """The flashsim decode_bench rows with status ok (torch_sdpa rows are never used)."""
    out = []
    for line in Path(path or BENCH_PATH).read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "decode_bench" and r.get("impl") == "flashsim" and r.get("status") == "ok":
            out.append(r)
    return out


def problem_of(row: dict) -> DecodeProblem:
    return DecodeProblem(N_kv=row["seq_len_kv"], d=row["d"], batch=row["batch"],
                         heads=row["heads"], kv_heads=row["kv_heads"], N_q=row["seq_len_q"],
                         dtype=row["dtype"], page_size=row["paged"])


def predict_row(row: dict, constants=None) -> dict:
    return predict_decode(problem_of(row), "H100-SXM", row["num_splits"],
                          kv_reads=row["kv_reads"], constants=constants)


def fit(rows=None) -> dict:
    """Least squares on log(predicted / measured) over the fit half; returns the constants
    document (as stored in decode_time_constants.json)."""
    import numpy as np
    from scipy.optimize import least_squares
    rows = [r for r in (rows or measured_rows()) if split_of(r) == "fit"]
    e_dram = e_dram_from_runtime()
    meas = np.array([r["ms_median"] * 1e3 for r in rows])

    def resid(x):
        k = dict(zip(FITTED, x), e_dram=e_dram)
        doc = {"constants": k}
        pred = np.array([predict_row(r, doc)["predicted_ms"] * 1e3 for r in rows])
        return np.log(pred / meas)

    x0 = np.array([5.0, 4.0, 1.0, 1.0, 0.3, 1.0, 1.0, 3.0, 0.05])
    sol = least_squares(resid, x0, bounds=(0, np.inf), x_scale="jac")
    k = {name: float(v) for name, v in zip(FITTED, sol.x)}
    k["e_dram"] = e_dram
    run_ids = sorted({r["run_id"] for r in rows})
    return {
        "model_version": MODEL_VERSION,
        "constants": k,
        "meaning": {
            "t_main0": "main kernel: launch, prologue, first tile's load latency (once)",
            "L_kv": "per tile of a CTA: latency its SM's other CTAs do not cover",
            "L_q": "per tile and query row of the block: the latency chain's part that grows with NR",
            "c_kv": "per tile of a CTA: SM issue cost (16-byte K/V loads, barriers), shared by its SM's n CTAs",
            "c_row": "per tile, x TB / 64: issue cost per key row (S store, softmax columns, loop)",
            "c_sh": "per tile and query row, x KPG log2(LPR) / 16: the query row's issue cost (dot products, group-sum shuffle steps, softmax, P V), scaled by its shuffle steps",
            "c_cta": "per CTA on its SM: issue cost of the prologue (Q to shared) and epilogue (O or Opart)",
            "t_comb0": "combine: launch gap after the main kernel and fixed latency",
            "c_s": "combine: per split (each thread's serial loop over the partials)",
            "e_dram": "achieved fraction of HBM bandwidth: the form-9 runtime model's e_dram, not fitted here",
        },
        "source": (f"least squares on log time over the {len(rows)} fit-half flashsim rows "
                   f"(analysis.decode_time.split_of) of {', '.join(run_ids)} "
                   f"(H100 SXM, fp16, commit e5d20a2); e_dram from analysis/runtime_constants.json"),
        "fit_rows": len(rows),
        "fit_rms_log": float(np.sqrt(np.mean(sol.fun ** 2))),
    }


def group_of(row: dict) -> dict:
    return {"schedule": row["schedule"], "layout": "paged" if row["paged"] else "contiguous",
            "cache": "small" if row["seq_len_kv"] <= SMALL_CACHE else "large"}


def validation_rows(rows=None, constants=None) -> list[dict]:
    c = constants or load_constants()
    out = []
    for r in rows or measured_rows():
        pr = predict_row(r, c)
        cfg = {k: r.get(k) for k in SPLIT_KEY_FIELDS}
        out.append({"kind": KIND, "run_id": r["run_id"], "device": r["device"],
                    "date": r["date"], "commit": r["commit"], "versions": r["versions"],
                    "config": cfg, "split": split_of(r), **group_of(r),
                    "measured_ms": r["ms_median"], "predicted_ms": round(pr["predicted_ms"], 6),
                    "rel_error": round(pr["predicted_ms"] / r["ms_median"] - 1, 6),
                    "binding": pr["binding"], "main_binding": pr["main_binding"],
                    "terms_us": {k: round(v, 4) for k, v in pr["terms_us"].items()},
                    "model_version": c.get("model_version", MODEL_VERSION),
                    "constants_source": c["source"]})
    return out


def summarise(vrows, split="heldout") -> dict:
    """median and worst |pred/meas - 1|, rows within 10 %, overall and per group."""
    sel = [v for v in vrows if v["split"] == split]

    def score(rs):
        e = sorted(abs(v["rel_error"]) for v in rs)
        if not e:
            return None
        m = len(e)
        med = e[m // 2] if m % 2 else (e[m // 2 - 1] + e[m // 2]) / 2
        return {"rows": m, "median": round(med, 4), "worst": round(e[-1], 4),
                "within_10pct": sum(x <= 0.10 for x in e)}

    out = {"all": score(sel)}
    for g in ("schedule", "layout", "cache"):
        for val in sorted({v[g] for v in sel}):
            out[f"{g}={val}"] = score([v for v in sel if v[g] == val])
    return out


def print_summary(vrows) -> None:
    for split in ("fit", "heldout"):
        print(f"{split}:")
        for g, s in summarise(vrows, split).items():
            print(f"  {g:22s} {s['rows']:4d} rows  median {100 * s['median']:5.1f} %  "
                  f"worst {100 * s['worst']:5.1f} %  within 10 %: {s['within_10pct']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m analysis.decode_time",
                                 description="time model of gpu.decode's kernels")
    ap.add_argument("command", choices=("fit", "validate", "constants"))
    a = ap.parse_args(argv)
    if a.command == "fit":
        doc = fit()
        CONSTANTS_PATH.write_text(json.dumps(doc, indent=2) + "\n")
        print_constants(doc)
        print(f"fit rms log error {doc['fit_rms_log']:.4f} on {doc['fit_rows']} rows")
    elif a.command == "constants":
        print_constants()
    else:
        v = validation_rows()
        VALIDATION_PATH.write_text("".join(json.dumps(r) + "\n" for r in v))
        print(f"{len(v)} rows -> {VALIDATION_PATH.relative_to(ROOT)}")
        print_constants()
        print_summary(v)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
