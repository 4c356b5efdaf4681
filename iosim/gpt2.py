"""HBM traffic of one GPT-2 medium attention layer, forward + backward: the paper's table.

Dao et al. 2022 (arXiv 2205.14135), Figure 2 left: GPT-2 medium attention, N = 1024,
d = 64, 16 heads, batch 64, fp16, A100; standard attention against FlashAttention.
The paper's figures are constants here, only to compare against:
  * arXiv v2 (causal mask, dropout):          standard 40.3 GB, FlashAttention 4.4 GB
  * other published version (key-padding mask, no dropout): 35.3 GB and 4.4 GB.

Standard attention is modelled as PyTorch's unfused graph (HuggingFace GPT2Attention._attn
style): every op is its own kernel that reads its operands from HBM and writes its result
to HBM (`standard_passes` lists them). FlashAttention is FlashAttention-1 as written,
Algorithm 2 (forward) and Algorithm 4 (backward), counted by iosim's closed forms with
block sizes from the paper's rule B_c = ceil(M/4d), B_r = min(B_c, d) and M = the A100's
on-chip SRAM. Its dropout mask is regenerated from the RNG state, so costs no traffic.
All byte counts are totals over batch x heads; GB = 10^9 bytes (GiB also given).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .backward import backward_closed_form
from .closed_form import closed_form
from .hardware import get_hardware
from .problem import ConfigError, Problem
from .tiling import paper_tiling, resolve_tiling, sram_to_elements

GB, GIB = 10 ** 9, 2 ** 30
#: GPT-2 medium attention as in the paper's Figure 2.
GPT2_MEDIUM = {"N": 1024, "d": 64, "heads": 16, "batch": 64, "dtype": "fp16"}
#: The paper, Section 2.1: "A100 GPU has ... 192KB of on-chip SRAM per each of 108 SMs".
PAPER_A100_SRAM_BYTES = 192 * 1024

#: The two published variants of the table (paper figures in GB, as printed).
VARIANTS = {
    "v2-causal-dropout": {
        "mask": "causal", "dropout": True, "paper_standard_gb": 40.3, "paper_flash_gb": 4.4,
        "source": "arXiv 2205.14135 v2, Figure 2 left (causal mask, dropout)"},
    "keypad-nodropout": {
        "mask": "key_padding", "dropout": False, "paper_standard_gb": 35.3, "paper_flash_gb": 4.4,
        "source": "the other published version of Figure 2 (key-padding mask, no dropout)"},
}
MASKS = ("causal", "key_padding", "none")
BROADCAST = ("once", "per_element")


@dataclass(frozen=True)
class Pass:
    """One kernel: bytes read and written in HBM per tensor (totals over batch x heads)."""

    phase: str                      # "forward" or "backward"
    name: str
    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return int(sum(self.reads.values()) + sum(self.writes.values()))

    def to_dict(self) -> dict:
        return {"phase": self.phase, "name": self.name, "reads": dict(self.reads),
                "writes": dict(self.writes), "bytes": self.bytes}


def standard_passes(N: int, d: int, batch: int, heads: int, itemsize: int = 2, *,
                    mask: str = "causal", dropout: bool = True,
                    broadcast: str = "once") -> list[Pass]:
    """The kernels of PyTorch's unfused attention graph, forward then backward.

    E = batch*heads*N*N elements (one N x N matrix per head), X = batch*heads*N*d.
    S, P, P_drop, dP_drop, dP, dS are stored in the problem dtype (itemsize bytes);
    the dropout mask Z is bool (1 byte, as torch.native_dropout returns). Mask operands:
    causal is a bool [1, 1, N, N] buffer (torch.where), key_padding an additive
    [batch, 1, 1, N] tensor in the problem dtype. They are broadcast; `broadcast="once"`
    counts each distinct element once per kernel (its stored size: the repeats are cache
    hits), "per_element" counts one load per output element.

    Forward:  1 S = Q K^T   2 S = S / sqrt(d)   3 mask   4 P = softmax(S)
              [5 P_drop, Z = dropout(P)]   6 O = P_drop V
    Backward: dV = P_drop^T dO;  dP_drop = dO V^T;  [dP = dP_drop * Z / (1 - p)];
              dS = softmax_backward(dP, P) (reads P, dP, writes dS);  mask backward
              (causal: where(mask, dS, 0), a kernel; key-padding add: identity, no kernel);
              dS = dS / sqrt(d);  dQ = dS K;  dK = dS^T Q.
    """
    if mask not in MASKS:
        raise ConfigError(f"mask={mask!r} is not known; allowed: {', '.join(MASKS)}")
    if broadcast not in BROADCAST:
        raise ConfigError(f"broadcast={broadcast!r} is not known; allowed: {', '.join(BROADCAST)}")
    s = int(itemsize)
    E, X = batch * heads * N * N, batch * heads * N * d
    if mask == "causal":
        mask_bytes = E * 1 if broadcast == "per_element" else N * N * 1
    else:
        mask_bytes = E * s if broadcast == "per_element" else batch * N * s
    p = "P_drop" if dropout else "P"
    F, B = "forward", "backward"
    out = [Pass(F, "S = Q K^T (matmul)", {"Q": X * s, "K": X * s}, {"S": E * s}),
           Pass(F, "S = S / sqrt(d) (scale)", {"S": E * s}, {"S": E * s})]
    if mask == "causal":
        out.append(Pass(F, "S = where(causal_mask, S, -inf)", {"S": E * s, "mask": mask_bytes},
                        {"S": E * s}))
    elif mask == "key_padding":
        out.append(Pass(F, "S = S + key_padding_mask", {"S": E * s, "mask": mask_bytes},
                        {"S": E * s}))
    out.append(Pass(F, "P = softmax(S)", {"S": E * s}, {"P": E * s}))
    if dropout:
        out.append(Pass(F, "P_drop, Z = dropout(P)", {"P": E * s}, {"P_drop": E * s, "Z": E}))
    out.append(Pass(F, f"O = {p} V (matmul)", {p: E * s, "V": X * s}, {"O": X * s}))
    out.append(Pass(B, f"dV = {p}^T dO (matmul)", {p: E * s, "dO": X * s}, {"dV": X * s}))
    dPname = "dP_drop" if dropout else "dP"
    out.append(Pass(B, f"{dPname} = dO V^T (matmul)", {"dO": X * s, "V": X * s}, {dPname: E * s}))
    if dropout:
        out.append(Pass(B, "dP = dP_drop * Z / (1 - p) (dropout backward)",
                        {"dP_drop": E * s, "Z": E}, {"dP": E * s}))
    out.append(Pass(B, "dS = P o (dP - rowsum(P o dP)) (softmax backward)",
                    {"P": E * s, "dP": E * s}, {"dS": E * s}))
    if mask == "causal":
        out.append(Pass(B, "dS = where(causal_mask, dS, 0) (mask backward)",
                        {"dS": E * s, "mask": mask_bytes}, {"dS": E * s}))
    elif mask == "key_padding":
        out.append(Pass(B, "mask backward: d(S + mask)/dS is the identity (no kernel)", {}, {}))
    out.append(Pass(B, "dS = dS / sqrt(d) (scale backward)", {"dS": E * s}, {"dS": E * s}))
    out.append(Pass(B, "dQ = dS K (matmul)", {"dS": E * s, "K": X * s}, {"dQ": X * s}))
    out.append(Pass(B, "dK = dS^T Q (matmul)", {"dS": E * s, "Q": X * s}, {"dK": X * s}))
    return out


def flash_passes(problem: Problem, tiling, algorithm: str = "fa1") -> list[Pass]:
    """Forward and backward of a FlashAttention schedule as two passes (closed forms)."""
    out = []
    for phase, led in (("forward", closed_form(algorithm, problem, tiling)),
                       ("backward", backward_closed_form(algorithm, problem, tiling))):
        ts = led.tensors()
        out.append(Pass(phase, f"{algorithm} {phase} (B_r={tiling.B_r}, B_c={tiling.B_c})",
                        {t: led.read_bytes_of(t) for t in ts if led.read_bytes_of(t)},
                        {t: led.write_bytes_of(t) for t in ts if led.write_bytes_of(t)}))
    return out


def total(passes) -> int:
    return sum(p.bytes for p in passes)


def _flash(variant: dict, sram_bytes: int, skip_masked_tiles: bool):
    g = GPT2_MEDIUM
    # Algorithm 2/4 apply the mask on chip; tile skipping only for causal if asked.
    causal = variant["mask"] == "causal" and skip_masked_tiles
    prob = Problem(N=g["N"], d=g["d"], batch=g["batch"], heads=g["heads"], dtype=g["dtype"],
                   causal=causal)
    # the paper's rule, with the checks `flashsim traffic` makes (M >= 4d, M > 0)
    tiling = resolve_tiling("fa1", g["d"], g["dtype"], sram_bytes=sram_bytes)
    return flash_passes(prob, tiling, "fa1"), tiling


def gpt2_table(sram_bytes: int = PAPER_A100_SRAM_BYTES, broadcast: str = "once") -> list[dict]:
    """One row per published variant: our standard and FlashAttention totals beside the
    paper's, the passes, and the sensitivity figures named in `assumptions()`."""
    g = GPT2_MEDIUM
    resolve_tiling("fa1", g["d"], g["dtype"], sram_bytes=sram_bytes)   # bad M: ConfigError now
    itemsize = Problem(N=1, d=1, dtype=g["dtype"]).itemsize
    alt_sram = get_hardware("A100-40GB").sram_bytes
    other_bc = "per_element" if broadcast == "once" else "once"
    rows = []
    for name, v in VARIANTS.items():
        std = standard_passes(g["N"], g["d"], g["batch"], g["heads"], itemsize, mask=v["mask"],
                              dropout=v["dropout"], broadcast=broadcast)
        fl, tiling = _flash(v, sram_bytes, skip_masked_tiles=False)
        std_b, fl_b = total(std), total(fl)
        row = {
            "variant": name,
            "standard_gb": std_b / GB, "flash_gb": fl_b / GB,
            "paper_standard_gb": v["paper_standard_gb"], "paper_flash_gb": v["paper_flash_gb"],
            "standard_gib": std_b / GIB, "flash_gib": fl_b / GIB,
            "standard_dev_pct": 100 * (std_b / GB / v["paper_standard_gb"] - 1),
            "flash_dev_pct": 100 * (fl_b / GB / v["paper_flash_gb"] - 1),
            "source": v["source"], "mask": v["mask"], "dropout": v["dropout"],
            "flash_tiling": {"B_r": tiling.B_r, "B_c": tiling.B_c, "T_r": tiling.T_r(g["N"]),
                             "T_c": tiling.T_c(g["N"]), "sram_bytes": sram_bytes},
            "sensitivity_gb": {
                f"standard, broadcast={other_bc}": total(standard_passes(
                    g["N"], g["d"], g["batch"], g["heads"], itemsize, mask=v["mask"],
                    dropout=v["dropout"], broadcast=other_bc)) / GB,
                f"flash, M={alt_sram} B (A100 per-block opt-in)":
                    total(_flash(v, alt_sram, False)[0]) / GB,
            },
            "standard_passes": [p.to_dict() for p in std],
            "flash_passes": [p.to_dict() for p in fl],
        }
        if v["mask"] == "causal":
            row["sensitivity_gb"]["flash, causal tiles skipped"] = \
                total(_flash(v, sram_bytes, True)[0]) / GB
        rows.append(row)
    return rows


NxN_TENSORS = frozenset({"S", "P", "P_drop", "Z", "dP_drop", "dP", "dS", "mask"})


def explain(row: dict) -> str:
    """Where the standard figure stands: bytes per attention-matrix element (one of the
    batch*heads*N*N) that the model spends and that the paper's figure leaves room for,
    after the model's N x d traffic (Q, K, V, O, dO, dQ, dK, dV)."""
    g = GPT2_MEDIUM
    E = g["batch"] * g["heads"] * g["N"] ** 2
    nd = sum(b for p in row["standard_passes"] for part in (p["reads"], p["writes"])
             for t, b in part.items() if t not in NxN_TENSORS)
    model = (row["standard_gb"] * GB - nd) / E
    paper = (row["paper_standard_gb"] * GB - nd) / E
    paper_gib = (row["paper_standard_gb"] * GIB - nd) / E
    return (f"N x d traffic {nd / GB:.2f} GB; N x N traffic: model {model:.1f} bytes per "
            f"attention element ({model / 2:.1f} fp16 passes), the paper's figure leaves "
            f"{paper:.1f} (GB) or {paper_gib:.1f} (GiB) bytes per element")


def assumptions(sram_bytes: int = PAPER_A100_SRAM_BYTES, broadcast: str = "once") -> list[str]:
    g = GPT2_MEDIUM
    t = paper_tiling(sram_to_elements(sram_bytes, g["dtype"]), g["d"])
    return [
        f"GPT-2 medium attention: N={g['N']}, d={g['d']}, heads={g['heads']}, batch={g['batch']}, "
        f"{g['dtype']}; one layer, forward + backward; totals over batch x heads.",
        "GB = 10^9 bytes (GiB = 2^30 bytes also printed); the paper does not say which.",
        "Standard: PyTorch's unfused graph, every op one kernel with an HBM round trip "
        "(passes listed); N x N intermediates in fp16, dropout mask bool (1 byte).",
        f"Standard: broadcast mask operands counted {broadcast!r} "
        "(once = stored size per kernel; per_element = one load per output element).",
        "Standard: key-padding add has an identity backward (no kernel); causal where() "
        "has a backward kernel.",
        f"FlashAttention: Algorithms 2 and 4 as written (FA1: outer loop over K/V blocks), "
        f"M = {sram_bytes:,} B = the paper's 192 KB A100 SRAM per SM, rule B_c = ceil(M/4d), "
        f"B_r = min(B_c, d): B_r={t.B_r}, B_c={t.B_c}, T_r={t.T_r(g['N'])}, T_c={t.T_c(g['N'])}.",
        "FlashAttention: mask applied on chip, every tile visited (as written); dropout mask "
        "regenerated from the RNG state (no traffic); O, l, m, dQ, dK, dV initialisation "
        "writes counted; the RNG state is not counted.",
        "The L2 cache is not modelled: these are the accesses the algorithms request.",
    ]


__all__ = ["GPT2_MEDIUM", "explain", "PAPER_A100_SRAM_BYTES", "VARIANTS", "Pass", "assumptions",
           "flash_passes", "gpt2_table", "standard_passes", "total", "GB", "GIB"]
