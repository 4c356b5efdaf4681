"""The configurations that validate the models below the ledger, fixed before measuring.

Each set is a list of plain dicts, one kernel pass of `gpu.attention` or
`gpu.backward.attention_backward` each, kept as data in `analysis/configs/NAME.json`
(NAME: the set's key in `SETS`; the file's `about` says what the set is for and when it
was declared, each group's `about` what its rows cover). This module loads them under
their names:

* `LEVELS` (and `LEVELS_NEW`, `LEVELS_DEV*`, `LEVELS_BLIND*`, `LEVELS_FP32_FAST`): the
  hierarchy-model validation (what reaches L2 and DRAM), measured with Nsight Compute.
* `RUNTIME` (and `RUNTIME_DEV*`, `RUNTIME_BLIND*`): the time-model calibration and
  validation; `RUNTIME_FAMILIES` is RUNTIME by kernel family without its split keys.
  `FAST_VARIANTS`: fp32 fast-kernel tilings compared (timed, not fitted).
* A blind set (`split: "blind"`) is never fitted on nor used to choose a model form.

Keys: `id` (stable name), `pass` ("fwd" | "bwd"), `algorithm` ("fa2" | "fa1" |
"standard"), `kernel` ("tc" | "fast" | "plain" | "default": which kernel; "default" is
what gpu.attention picks), `dtype`, `batch`, `heads`, `kv_heads`, `N`, `d`, `causal`,
`block_rows` / `block_cols` (None: what `gpu.attention` picks by default), and where set
`split` ("fit" | "heldout" | "blind" | "devN" | "variant"), `family`, `split3`.
"""
from __future__ import annotations

import json
import os

_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def cfg(pass_, algorithm, kernel, dtype, batch, heads, N, d, causal=False, kv_heads=None,
        tiles=None):
    """One configuration dict with a readable, stable id."""
    kv = heads if kv_heads is None else kv_heads
    br, bc = tiles if tiles else (None, None)
    parts = [pass_, algorithm if kernel == "default" else f"{algorithm}-{kernel}", dtype,
             f"b{batch}h{heads}" + (f"kv{kv}" if kv != heads else ""), f"n{N}", f"d{d}"]
    if causal:
        parts.append("causal")
    if tiles:
        parts.append(f"{br}x{bc}")
    return {"id": "_".join(parts), "pass": pass_, "algorithm": algorithm, "kernel": kernel,
            "dtype": dtype, "batch": batch, "heads": heads, "kv_heads": kv, "N": N, "d": d,
            "causal": causal, "block_rows": br, "block_cols": bc}


K = 1024
F, B = "fwd", "bwd"

#: The sets' names (SETS keys and analysis/configs/NAME.json), in the order declared.
NAMES = ("levels", "levels_new", "runtime", "variants", "runtime_blind", "levels_blind",
         "levels_fp32_fast", "runtime_blind2", "levels_blind2", "runtime_dev3", "levels_dev3",
         "runtime_blind3", "levels_blind3", "runtime_dev4", "runtime_blind4", "levels_blind4",
         "runtime_dev5", "levels_dev5", "runtime_blind5", "levels_blind5", "runtime_dev6",
         "levels_dev6", "runtime_blind6", "levels_blind6", "runtime_dev7", "levels_dev7",
         "runtime_blind7", "levels_blind7", "runtime_dev8", "levels_dev8", "runtime_blind8",
         "levels_blind8", "levels_blind9", "levels_dev10", "levels_blind10", "runtime_blind11",
         "levels_blind11", "runtime_blind12", "levels_blind12", "runtime_blind13")


def load(name: str) -> list[dict]:
    """The configurations of set `name` (analysis/configs/NAME.json), in listed order."""
    if name not in NAMES:
        raise ValueError(f"set={name!r} is not known; allowed: {', '.join(NAMES)}")
    with open(os.path.join(_DIR, f"{name}.json")) as f:
        data = json.load(f)
    return [c for g in data["groups"] for c in g["configs"]]


SETS = {name: load(name) for name in NAMES}

LEVELS = SETS["levels"]
LEVELS_NEW = SETS["levels_new"]
RUNTIME = SETS["runtime"]
FAST_VARIANTS = SETS["variants"]
RUNTIME_BLIND = SETS["runtime_blind"]
LEVELS_BLIND = SETS["levels_blind"]
LEVELS_FP32_FAST = SETS["levels_fp32_fast"]
RUNTIME_BLIND2 = SETS["runtime_blind2"]
LEVELS_BLIND2 = SETS["levels_blind2"]
RUNTIME_DEV3 = SETS["runtime_dev3"]
LEVELS_DEV3 = SETS["levels_dev3"]
RUNTIME_BLIND3 = SETS["runtime_blind3"]
LEVELS_BLIND3 = SETS["levels_blind3"]
RUNTIME_DEV4 = SETS["runtime_dev4"]
RUNTIME_BLIND4 = SETS["runtime_blind4"]
LEVELS_BLIND4 = SETS["levels_blind4"]
RUNTIME_DEV5 = SETS["runtime_dev5"]
LEVELS_DEV5 = SETS["levels_dev5"]
RUNTIME_BLIND5 = SETS["runtime_blind5"]
LEVELS_BLIND5 = SETS["levels_blind5"]
RUNTIME_DEV6 = SETS["runtime_dev6"]
LEVELS_DEV6 = SETS["levels_dev6"]
RUNTIME_BLIND6 = SETS["runtime_blind6"]
LEVELS_BLIND6 = SETS["levels_blind6"]
RUNTIME_DEV7 = SETS["runtime_dev7"]
LEVELS_DEV7 = SETS["levels_dev7"]
RUNTIME_BLIND7 = SETS["runtime_blind7"]
LEVELS_BLIND7 = SETS["levels_blind7"]
RUNTIME_DEV8 = SETS["runtime_dev8"]
LEVELS_DEV8 = SETS["levels_dev8"]
RUNTIME_BLIND8 = SETS["runtime_blind8"]
LEVELS_BLIND8 = SETS["levels_blind8"]
LEVELS_BLIND9 = SETS["levels_blind9"]
LEVELS_DEV10 = SETS["levels_dev10"]
LEVELS_BLIND10 = SETS["levels_blind10"]
RUNTIME_BLIND11 = SETS["runtime_blind11"]
LEVELS_BLIND11 = SETS["levels_blind11"]
RUNTIME_BLIND12 = SETS["runtime_blind12"]
LEVELS_BLIND12 = SETS["levels_blind12"]
RUNTIME_BLIND13 = SETS["runtime_blind13"]

#: RUNTIME by kernel family (in listed order), each configuration without the keys the
#: set adds (family, split, split3).
RUNTIME_FAMILIES: dict[str, list[dict]] = {}
for _c in RUNTIME:
    RUNTIME_FAMILIES.setdefault(_c["family"], []).append(
        {k: v for k, v in _c.items() if k not in ("family", "split", "split3")})
del _c


def _hash_split(c: dict) -> str:
    """split3: "fit" or "heldout" by the first byte of sha256(id), about half each (no grid
    axis decides it; analysis/configs/runtime.json's `about` says why it replaced `split`).
    All splits are reported (analysis.validate)."""
    import hashlib
    return "fit" if hashlib.sha256(c["id"].encode()).digest()[0] % 2 == 0 else "heldout"


def levels_split(c: dict) -> str:
    """The hierarchy model's fit / heldout side of a LEVELS configuration: the same hash
    rule as the runtime set's split3 (declared before the L2 model was fitted; an earlier
    exploratory scan of its two constants looked at all H100 rows, see
    iosim.memory.FITTED). The H200 rows are held out entirely (preset change only)."""
    return _hash_split(c)


def family_of(c: dict) -> str:
    """Kernel family name of a configuration (as RUNTIME_FAMILIES names them)."""
    if c["algorithm"] == "fa2" and c["pass"] == "fwd":
        k = c["kernel"]
        if k == "default":
            k = "tc" if c["dtype"] == "fp16" else "fast"
        return f"fa2_{k}"
    newer = f"_{c['kernel']}" if c["kernel"] in ("tc", "fast") else ""
    return c["algorithm"] + ("_bwd" if c["pass"] == "bwd" else "") + newer


__all__ = ["LEVELS", "LEVELS_NEW", "RUNTIME_BLIND", "LEVELS_BLIND", "RUNTIME_BLIND2", "LEVELS_BLIND2",
           "RUNTIME_DEV3", "LEVELS_DEV3", "RUNTIME_BLIND3", "LEVELS_BLIND3",
           "RUNTIME_DEV4", "RUNTIME_BLIND4", "LEVELS_BLIND4",
           "RUNTIME_DEV5", "LEVELS_DEV5", "RUNTIME_BLIND5", "LEVELS_BLIND5",
           "RUNTIME_DEV6", "LEVELS_DEV6", "RUNTIME_BLIND6", "LEVELS_BLIND6",
           "RUNTIME_DEV7", "LEVELS_DEV7", "RUNTIME_BLIND7", "LEVELS_BLIND7",
           "RUNTIME_DEV8", "LEVELS_DEV8", "RUNTIME_BLIND8", "LEVELS_BLIND8", "LEVELS_BLIND9", "LEVELS_DEV10",
           "LEVELS_BLIND10", "RUNTIME_BLIND11", "LEVELS_BLIND11", "RUNTIME_BLIND12", "LEVELS_BLIND12", "RUNTIME_BLIND13", "RUNTIME", "FAST_VARIANTS", "RUNTIME_FAMILIES", "SETS", "cfg", "family_of"]
