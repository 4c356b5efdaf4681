"""The time model's constants (`RuntimeModel`, fitted: runtime_constants.json) and the kernel
families they are fitted per (`family_key`)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

P_NORM = 4.0


#: the model form the constants were fitted for (it names them in `source`)
FORM = ("form 12 (form 11 + the tensor-core kernels' element-wise row copies where d % 8 "
        "!= 0 as latency rounds, t_round each; no constant added); form 11 (form 10 + the share of its SM that a lone fa2 tensor-core forward CTA "
        "gets, w_sat_tc, where an SM holds one; form 10: form 9 + the plain row passes' "
        "rounds per warp holding a tile's entries, "
        "sigma_w; form 9: form 8 (form 7 + a prologue / epilogue latency per wave of CTAs of "
        "the fa2 tensor-core and fast kernels, the tensor-core backward's lockstep phases at "
        "one CTA a SM) + the causal fast fa2 backward's grid heaviest first across heads, "
        "g_mem held at the SM count)")


#: kernels that only move data: their work W is their requested bytes, R the HBM peak (the
#: row passes std_softmax, std_bwd_dS keep their family keys here; their W: ROW_PASSES)
MEMORY_KERNELS = ("std_softmax", "std_bwd_dS", "fa2_bwd_pre", "bwd_convert", "bwd_group_sum")


CONSTANTS_PATH = os.path.join(os.path.dirname(__file__), "runtime_constants.json")


#: the newer default kernels (iosim.launch.plan's launch names) -> the kernel
#: whose work and traffic formulas they share (same products, same operands)
NEWER = {"fa1_tc": "fa1_fwd", "std_tc_softmax": "std_softmax", "std_tc_S": "std_S",
         "std_tc_PV": "std_PV", "std_tc_bwd_dV": "std_bwd_dV", "std_tc_bwd_dP": "std_bwd_dP",
         "std_tc_bwd_dS": "std_bwd_dS", "std_tc_bwd_dQ": "std_bwd_dQ",
         "std_tc_bwd_dK": "std_bwd_dK", "fa2_bwd_tc": "fa2_bwd_main",
         "fa2_bwd_fast": "fa2_bwd_main", "fa2_bwd_pre_fast": "fa2_bwd_pre",
         "std_fast_S": "std_S", "std_fast_PV": "std_PV", "fa1_fast": "fa1_fwd"}


#: kernels on the tensor cores (W over Hardware.fp16_tensor_flops)
TENSOR_KERNELS = ("fa2_tc", "fa1_tc", "std_tc_S", "std_tc_PV", "std_tc_bwd_dV", "std_tc_bwd_dP",
                  "std_tc_bwd_dQ", "std_tc_bwd_dK", "fa2_bwd_tc")


#: constants shared by sibling launches (few measured rows each): the standard tensor-core
#: tile products share one efficiency, its two row passes (softmax, dS) another
SHARED = {"std_tc_S": "std_tc_mm", "std_tc_PV": "std_tc_mm", "std_tc_bwd_dV": "std_tc_mm",
          "std_tc_bwd_dP": "std_tc_mm", "std_tc_bwd_dQ": "std_tc_mm", "std_tc_bwd_dK": "std_tc_mm",
          "std_tc_softmax": "std_tc_row", "std_tc_bwd_dS": "std_tc_row"}


#: a family without a fitted constant (too few rows: a cross-validation fold may hold all
#: of them) takes its sibling's: the fast fp32 fa2 forward's register-tiled products
FALLBACK = {"fa1_fast": "fa2_fast_fp32", "std_fast_S": "fa2_fast_fp32",
            "std_fast_PV": "fa2_fast_fp32"}


def family_key(name: str) -> str:
    """The kernel a launch is (fa2_tc, std_S, std_tc_S, fa2_bwd_fast, ...), from its name
    (a launch name of iosim.memory or a measured CUDA kernel name)."""
    if "std_fast_softmax" in name:       # the fast standard runs the plain softmax kernel
        return "std_softmax"
    for k in ("std_fast_S", "std_fast_PV", "fa1_fast", "fa2_bwd_pre_fast", "fa2_bwd_tc", "fa2_bwd_fast", "fa1_tc", "std_tc_softmax",
              "std_tc_S", "std_tc_PV", "std_tc_bwd_dV", "std_tc_bwd_dP", "std_tc_bwd_dS",
              "std_tc_bwd_dQ", "std_tc_bwd_dK",
              "fa2_tc", "fa2_fast", "fa2_fwd", "fa1_fwd", "std_softmax", "std_S", "std_PV",
              "fa2_bwd_pre", "fa2_bwd_main", "bwd_convert", "bwd_group_sum", "std_bwd_dV",
              "std_bwd_dP", "std_bwd_dS", "std_bwd_dQ", "std_bwd_dK"):
        if k in name:
            return k
    raise ValueError(f"kernel {name!r} has no time-model family")


@dataclass(frozen=True)
class RuntimeModel:
    """The fitted constants: e (family -> achieved fraction of its unit's peak), e_l2,
    e_dram, t_launch_ms. `source`: what they were fitted on."""
    e: dict
    e_l2: float
    e_dram: float
    t_launch_ms: float
    w_sat: float = 8.0
    e_local: float = 0.2
    kappa: float = 0.0
    source: str = ""
    rho: float = 0.0
    kappa_c: float = 0.0
    e_smem: float = 0.5
    kappa_b: float = 0.0
    e_dram_w: float = 0.1
    sigma: float = 0.0
    sigma_r: float = 0.0
    g_mem: float = 1.0
    kappa_c1: float = 0.0
    t_round_us: float = 0.0
    t_miss_us: float = 0.0
    kappa_o: float = 0.0
    t_cta_us: float = 0.0
    sigma_w: float = 0.0
    #: form 11: the warps an fa2 tensor-core forward CTA needs to fill its SM where an SM
    #: holds one of them (0: w_sat)
    w_sat_tc: float = 0.0

    @classmethod
    def load(cls, path: str = CONSTANTS_PATH) -> "RuntimeModel":
        with open(path) as f:
            d = json.load(f)
        return cls(d["e"], d["e_l2"], d["e_dram"], d["t_launch_ms"], d.get("w_sat", 8.0),
                   d.get("e_local", 0.2), d.get("kappa", 0.0), d.get("source", ""),
                   d.get("rho", 0.0), d.get("kappa_c", 0.0),
                   d.get("e_smem", 0.5), d.get("kappa_b", 0.0), d.get("e_dram_w", 0.1),
                   d.get("sigma", 0.0), d.get("sigma_r", 0.0), d.get("g_mem", 1.0),
                   d.get("kappa_c1", 0.0), d.get("t_round_us", 0.0),
                   d.get("t_miss_us", 0.0), d.get("kappa_o", 0.0), d.get("t_cta_us", 0.0),
                   d.get("sigma_w", 0.0), d.get("w_sat_tc", 0.0))

    def save(self, path: str = CONSTANTS_PATH):
        with open(path, "w") as f:
            json.dump({"e": self.e, "e_l2": self.e_l2, "e_dram": self.e_dram,
                       "t_launch_ms": self.t_launch_ms, "w_sat": self.w_sat,
                       "kappa": self.kappa, "e_local": self.e_local, "rho": self.rho,
                       "kappa_c": self.kappa_c, "e_smem": self.e_smem,
                       "kappa_b": self.kappa_b, "e_dram_w": self.e_dram_w,
                       "sigma": self.sigma, "sigma_r": self.sigma_r, "g_mem": self.g_mem,
                       "kappa_c1": self.kappa_c1, "t_round_us": self.t_round_us,
                       "t_miss_us": self.t_miss_us, "kappa_o": self.kappa_o, "t_cta_us": self.t_cta_us,
                       "sigma_w": self.sigma_w, "w_sat_tc": self.w_sat_tc,
                       "source": self.source}, f, indent=1,
                      sort_keys=True)
            f.write("\n")

    def table(self) -> str:
        rows = [f"  e[{k}] = {v:.4f}" for k, v in sorted(self.e.items())]
        return "\n".join([f"time-model constants ({self.source}):"] + rows +
                         [f"  e_l2 = {self.e_l2:.4f}", f"  e_dram = {self.e_dram:.4f}",
                          f"  e_dram_w = {self.e_dram_w:.4f} of the L2 bandwidth (DRAM writes: the L2 write-back rate)",
                          f"  t_launch = {self.t_launch_ms * 1e3:.2f} us",
                          f"  w_sat = {self.w_sat:.2f} warps",
                          f"  w_sat_tc = {self.w_sat_tc:.2f} warps (an fa2 tensor-core forward CTA alone on its SM)",
                          f"  e_local = {self.e_local:.4f}",
                          f"  g_mem = {self.g_mem:.2f} (an SM's L2 / DRAM bandwidth over its even share; held, not fitted)",
                          f"  e_smem = {self.e_smem:.4f}",
                          f"  kappa = {self.kappa:.1f} FLOP-equivalents per score entry",
                          f"  kappa_c = {self.kappa_c:.1f} more per score entry of a causal fa2 forward build",
                          f"  kappa_c1 = {self.kappa_c1:.1f} more per score entry of a causal fa1_tc / fa1_fast build",
                          f"  kappa_b = {self.kappa_b:.1f} per score entry and product of the fa2 backward",
                          f"  rho = {self.rho:.1f} FLOP-equivalents per query row and key tile",
                          f"  sigma = {self.sigma:.0f} FLOP-equivalents per warp and row step of a row pass",
                          f"  sigma_r = {self.sigma_r:.1f} FLOP-equivalents per partial value read in a row reduction",
                          f"  sigma_w = {self.sigma_w:.0f} FLOP-equivalents per warp and row step that holds entries (one load round)",
                          f"  t_round = {self.t_round_us:.3f} us per element-wise load round on a CTA's path (fa1 plain / fast, fast standard)",
                          f"  t_miss = {self.t_miss_us:.3f} us more per round that misses the L2 (DRAM)",
                          f"  kappa_o = {self.kappa_o:.1f} per element of O_i a fa1 tile step re-reads and re-writes",
                          f"  t_cta = {self.t_cta_us:.3f} us per wave of CTAs (prologue / epilogue latency: first tiles in, O out)",
                          f"  p = {P_NORM}"])
