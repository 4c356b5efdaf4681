"""How far a time or DRAM prediction can be trusted: the models' own blind errors on the
nearest validated kernel family, and where a problem lies outside what was validated.

The table (trust.json beside this module) is generated from the results data set by
`python3 -m analysis.fit_runtime trust` (blind rows only: configurations declared and
predictions frozen before they were measured, `split` "blind*"; rows the models were
fitted on never count). It holds, per kernel family x dtype x pass x GPU preset, the
errors of those frozen predictions and the ranges the rows span (head dims d, N, causal,
grouped K/V heads, tilings). `trust_for` looks a prediction up in it:

* inside: "time ±6 % (95th pct of 47 blind rows; median 2.1 %, ...)";
* outside (a head dim, N, dtype, tiling, mask or preset no blind row had): "outside
  validated range: d = 96 never measured (validated d 64, 128); nearest: ...".

Nothing here changes a prediction; it only says how far the data set vouches for it."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

TABLE_PATH = os.path.join(os.path.dirname(__file__), "trust.json")

_TABLE = None


def table() -> dict:
    """The generated trust table (trust.json), read once."""
    global _TABLE
    if _TABLE is None:
        with open(TABLE_PATH) as f:
            _TABLE = json.load(f)
    return _TABLE


def family_of(algorithm: str, pass_: str, kernel: str) -> str:
    """The validation family of a pass (as analysis.validation_configs.family_of names a
    configuration's), from what `iosim.kernel_plan` says runs: fa2_tc, fa2_fast, fa2_plain,
    fa1_tc, fa1_fast, fa1, standard_tc, standard_fast, standard, fa2_bwd_tc, fa2_bwd_fast,
    fa2_bwd, standard_bwd_tc, standard_bwd."""
    if algorithm == "fa2" and pass_ == "fwd":
        return f"fa2_{kernel}"
    newer = f"_{kernel}" if kernel in ("tc", "fast") else ""
    return algorithm + ("_bwd" if pass_ == "bwd" else "") + newer


#: the tensor-core families whose kernels copy rows element by element at d % 8 != 0: a
#: time prediction there is judged by that path's own blind rows (trust.json's
#: "time_elementwise", runtime_blind13 on), not by the family's 16-byte-copy rows
ELEMENTWISE_FAMILIES = ("fa2_tc", "fa2_bwd_tc")


def key_of(family: str, dtype: str, pass_: str, preset: str) -> str:
    """The table's key of a family on a preset: 'fa2_tc|fp16|fwd|H100-SXM'."""
    return f"{family}|{dtype}|{pass_}|{preset}"


@dataclass(frozen=True)
class Trust:
    """How far one prediction (`what`: "time" or "dram") can be trusted.

    validated: every trait of the problem (family, dtype, pass, preset, d, N range, causal,
        grouped heads, tiling) was covered by the blind rows of `basis`.
    statement: one line saying so, with the blind errors (percent) of `basis`.
    basis: the table key whose rows vouch (or the nearest one), None where there is none.
    outside: why the problem is outside the validated range (empty when validated).
    stats: that entry's numbers (n rows, median / 95th percentile |error|, ...)."""
    what: str
    validated: bool
    statement: str
    basis: str | None = None
    outside: tuple = ()
    stats: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["outside"] = list(self.outside)
        return d


def _span(xs) -> str:
    xs = sorted(xs)
    return ", ".join(str(x) for x in xs) if len(xs) <= 4 else f"{xs[0]}-{xs[-1]} ({len(xs)} values)"


def _nearest(tab: dict, family: str, dtype: str, pass_: str, preset: str):
    """The entry standing in for a key with no blind rows: the same family and dtype on
    another preset, else the family in another dtype (same preset first)."""
    for k in (key_of(family, dtype, pass_, "H100-SXM"), key_of(family, dtype, pass_, "H200")):
        if k in tab:
            return k
    for dt in ("fp16", "fp32"):
        for pr in (preset, "H100-SXM", "H200"):
            k = key_of(family, dt, pass_, pr)
            if k in tab:
                return k
    return None


def _summary(what: str, e: dict) -> str:
    if what == "time":
        return (f"median {100 * e['median']:.1f} %, 95th pct {100 * e['p95']:.0f} %, "
                f"{e['n']} blind rows")
    return (f"in bound on {100 * e['within_bound']:.0f} %, in chip range on "
            f"{100 * e['within_range']:.0f} % of {e['n']} blind rows")


def trust_for(what: str, algorithm: str, pass_: str, kernel: str, problem, preset: str,
              tiling: tuple | None = None, modelled_as: str | None = None) -> Trust:
    """The trust statement of a `what` ("time" or "dram") prediction for `problem` run by
    `kernel` (kernel_plan's: tc, fast, plain / default) with `tiling` (B_r, B_c) on the
    preset named `preset`. modelled_as: the dtype the models took in place of the
    problem's ("fp16" for a bf16 tensor-core pass)."""
    if what not in ("time", "dram"):
        raise ValueError(f"what={what!r} is not allowed; allowed: 'time', 'dram'")
    tab = table()[what]
    family = family_of(algorithm, pass_, kernel)
    outside = []
    dtype = problem.dtype
    if modelled_as and modelled_as != dtype and key_of(family, dtype, pass_, preset) not in tab:
        # no blind rows of this dtype: judged by the rows of the build the model took
        outside.append(f"{dtype} never measured (modelled as its {modelled_as} build)")
        dtype = modelled_as
    key = key_of(family, dtype, pass_, preset)
    e = tab.get(key)
    basis = key
    if e is None:
        basis = _nearest(tab, family, dtype, pass_, preset)
        outside.append(f"no blind rows for {family} {dtype} {pass_} on {preset}")
        e = tab.get(basis) if basis else None
    if e is not None:
        if problem.d not in e["d"]:
            outside.append(f"d = {problem.d} never measured (validated d {_span(e['d'])})")
        lo, hi = e["N"]
        if not lo <= problem.N <= hi:
            outside.append(f"N = {problem.N} outside the measured N {lo}-{hi}")
        if bool(problem.causal) not in e["causal"]:
            outside.append(("causal" if problem.causal else "non-causal") + " never measured")
        if problem.kv_heads != problem.heads and not e["grouped"]:
            outside.append("grouped K/V heads never measured")
        if problem.N_k != problem.N and not e.get("unequal_kv", False):
            outside.append(f"N_k != N (N_k = {problem.N_k}) never measured")
        if tuple(problem.window) != (-1, -1) and not e.get("windowed", False):
            outside.append(f"local window {tuple(problem.window)} never measured")
        if tiling is not None and list(tiling) not in e["tilings"]:
            outside.append(f"tiling {tiling[0]} x {tiling[1]} never measured (validated "
                           + ", ".join(f"{a} x {b}" for a, b in e["tilings"]) + ")")
    if what == "time" and family in ELEMENTWISE_FAMILIES and problem.d % 8:
        ew = table().get("time_elementwise", {})
        k = key_of(family, dtype, pass_, preset)
        if k not in ew:
            k = _nearest(ew, family, dtype, pass_, preset)
        if k is None:
            outside.append(f"d = {problem.d}: the element-wise copy path (d % 8 != 0), no "
                           f"blind row of it")
        else:
            x = ew[k]
            outside.append(f"d = {problem.d}: the element-wise copy path (d % 8 != 0), blind "
                           f"rows of it miss by median {100 * x['median']:.1f} %, 95th pct "
                           f"{100 * x['p95']:.0f} %, {100 * x['within_10']:.0f} % within 10 % "
                           f"({x['n']} row{'s' if x['n'] != 1 else ''}, {x['dtype']} {x['pass']} on "
                           f"{x['preset']})")
    label = "time" if what == "time" else "DRAM"
    if e is None:
        return Trust(what, False, f"{label}: outside validated range: "
                     + "; ".join(outside) + " (no validated family near it)", None,
                     tuple(outside), {})
    where = f"{e['family']} {e['dtype']} {e['pass']} on {e['preset']}"
    if outside:
        return Trust(what, False, f"{label}: outside validated range: " + "; ".join(outside)
                     + f" (nearest validated: {where}: {_summary(what, e)}, d {_span(e['d'])})",
                     basis, tuple(outside), dict(e))
    if what == "time":
        text = (f"time ±{100 * e['p95']:.0f} % (95th pct of {e['n']} blind rows; median "
                f"{100 * e['median']:.1f} %, {100 * e['within_10']:.0f} % within 10 %; {where}, "
                f"d {_span(e['d'])}, N {e['N'][0]}-{e['N'][1]})")
    else:
        text = (f"DRAM in the 15 % / 16 MB bound on {100 * e['within_bound']:.0f} % and in the "
                f"chip range on {100 * e['within_range']:.0f} % of {e['n']} blind rows (median "
                f"|error| reads {100 * e['median_read']:.0f} %, writes "
                f"{100 * e['median_write']:.0f} %; {where}, d {_span(e['d'])}, "
                f"N {e['N'][0]}-{e['N'][1]})")
    if e["n"] < 5:
        text += f"; few rows ({e['n']})"
    return Trust(what, True, text, basis, (), dict(e))


__all__ = ["Trust", "trust_for", "family_of", "key_of", "table", "TABLE_PATH"]
