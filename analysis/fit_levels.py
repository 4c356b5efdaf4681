"""The L2 / DRAM model (`iosim.memory`, `iosim.levels`) against measured rows: each
levels_measurement row's prediction (`predict_row`), its errors and whether it is inside
the bound (`errors`, `within`) or the chip range (`within_chip_range`), the comparison over
a data set (`compare`), and the grid fit of the model's constants (`fit_l2`)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from iosim import Problem, Tiling, levels
from iosim.memory import FITTED, L2Model, within


# ---------------------------------------------------------------------------------------
# Validation against measured rows
# ---------------------------------------------------------------------------------------
def problem_of(c: dict) -> Problem:
    """The Problem of a validation configuration (its optional keys N_k and window as
    analysis.hwmeasure reads them)."""
    return Problem(N=c["N"], d=c["d"], batch=c["batch"], heads=c["heads"],
                   kv_heads=c["kv_heads"], dtype=c["dtype"], causal=c["causal"],
                   N_k=c.get("N_k"), window=tuple(c["window"]) if c.get("window") else (-1, -1))


def config_kernel(c: dict) -> str:
    """The kernel a validation configuration names, as `levels` takes it: 'default' was the
    plain kernel for every pass but the fa2 forward when the configurations were measured
    (before the tensor-core and fast backward / fa1 / standard kernels), 'auto' there."""
    if c["kernel"] != "default":
        return c["kernel"]
    return "auto" if (c["algorithm"] == "fa2" and c["pass"] == "fwd") else "plain"


def predict_row(c: dict, gpu: str, model: L2Model | None = None) -> dict:
    tiling = None if c.get("block_rows") is None else Tiling(c["block_rows"], c["block_cols"])
    kernel = config_kernel(c)
    return levels(c["algorithm"], problem_of(c), gpu, pass_=c["pass"], kernel=kernel,
                  tiling=tiling, model=model)


#: (capacity_fraction, associativity, shared_footprint, dirty_fraction); all replicate,
#: home_written, private x1.0, drain_fraction 0.06 (the v5 grid)
FIT_GRID = tuple(sorted({(f, a, sf, 0.4) for f in (0.75, 0.8, 0.85) for a in (24, 32, 48, 64, 96)
                         for sf in (1.4, 1.5, 1.6, 1.75)} |
                        {(f, a, sf, 0.4) for f in (0.7, 0.75) for a in (96, 128, 192)
                         for sf in (1.25, 1.3, 1.4, 1.5)}))


def fit_l2(rows, grid=FIT_GRID) -> L2Model:
    """The grid point (capacity_fraction, associativity, shared_footprint, dirty_fraction)
    with the most `rows` inside the bound (DRAM reads and writes), ties broken by the
    smallest median |log(pred / meas)| of DRAM bytes; the other constants and mechanisms
    (replicate, home_written, private x1.0, drain 0.06, partial_refetch, local_memory) as
    FITTED."""
    best = None
    for f, a, sf, df in grid:
        m = replace(FITTED, capacity_fraction=f, associativity=a, dirty_fraction=df,
                    shared_footprint=sf)
        res = compare(rows, m)
        errs = [abs(math.log(max(p[k], 1e6) / max(r["measured"][k], 1e6)))
                for r, p, _, _ in res for k in ("dram_read_bytes", "dram_write_bytes")]
        score = (-sum(all(ok.values()) for _, _, _, ok in res), float(np.median(errs)))
        if best is None or score < best[0]:
            best = (score, m)
    return best[1]


GPU_OF_DEVICE = {"NVIDIA H100 80GB HBM3": "H100-SXM", "NVIDIA H200": "H200"}


#: the byte counts a levels prediction is compared on (bytes, whole pass)
LEVEL_KEYS = ("dram_read_bytes", "dram_write_bytes", "l2_read_bytes", "l2_write_bytes")


def within_range(lo_hi, meas: float, rel: float = 0.15, floor: float = 16e6) -> bool:
    """The chip-range check: `meas` inside [low, high] widened by the bound's tolerance (15 %
    of the measured bytes or 16 MB, as `within`)."""
    lo, hi = lo_hi
    return lo <= meas <= hi or within(lo, meas, rel, floor) or within(hi, meas, rel, floor)


def within_chip_range(pred: dict, measured: dict) -> dict:
    """Whether DRAM reads and writes are inside the predicted chip-to-chip range
    (`levels`' dram_*_bytes_range, `within_range`); the point where a prediction has none."""
    return {k: within_range(pred.get(k + "_range", (pred[k], pred[k])), measured[k])
            for k in ("dram_read_bytes", "dram_write_bytes")}


def errors(pred: dict, measured: dict) -> tuple[dict, dict]:
    """(relative error of each LEVEL_KEYS count, None where nothing was measured; whether
    DRAM reads and writes are inside the bound, `within`)."""
    err = {k: (pred[k] - measured[k]) / measured[k] if measured[k] else None
           for k in LEVEL_KEYS}
    ok = {k: within(pred[k], measured[k]) for k in ("dram_read_bytes", "dram_write_bytes")}
    return err, ok


def compare(rows, model: L2Model | None = None):
    """[(row, prediction, errors, inside the bound)] for measured levels rows (status ok)."""
    out = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        gpu = GPU_OF_DEVICE.get(r["device"], "H100-SXM")
        pred = predict_row(r["config"], gpu, model)
        out.append((r, pred, *errors(pred, r["measured"])))
    return out


__all__ = ["problem_of", "config_kernel", "predict_row", "fit_l2", "FIT_GRID", "GPU_OF_DEVICE",
           "LEVEL_KEYS", "within_range", "within_chip_range", "errors", "compare"]
