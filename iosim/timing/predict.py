"""The time of one pass: each launch's terms (`terms`: work, L2, DRAM, shared memory, local
memory, in ms), blended into its time (`predict_launch`), summed over the pass
(`predict_time`).

    T = t_launch + ( (imbalance t_work)^p + (imb_m t_L2)^p + (imb_m t_DRAM)^p
                     [+ (imbalance t_smem)^p + (imbalance t_local)^p] )^(1/p) [+ t_lat]

(the terms and constants: `iosim.timing`'s docstring; their derivation and fits:
docs/models-history.md)."""
from __future__ import annotations

from dataclasses import replace

from ..hardware import get_hardware
from ..memory.levels import FITTED, pass_levels
from ..problem import Problem
from ..tiling import Tiling
from .features import launch_features
from .makespan import imbalance
from .model import FALLBACK, P_NORM, RuntimeModel
from .trust import trust_for


# ---------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------
def terms(f: dict, m: RuntimeModel, hw) -> dict:
    """Each resource's time (ms) for one launch, before imbalance and launch cost."""
    e = m.e.get(f["family"], m.e.get(FALLBACK.get(f["family"], "")))
    if e is None:
        raise ValueError(f"no fitted constant for kernel family {f['family']!r}")
    kap = m.kappa_b if f.get("backward") else m.kappa + (m.kappa_c if f.get("causal") else 0.0) \
        + (m.kappa_c1 if f.get("causal_fa1") else 0.0)
    ops = (kap * f.get("entries", 0.0)
           + m.rho * f.get("rows", 0.0)
           + m.sigma * f.get("row_steps", 0.0) + m.sigma_r * f.get("row_rows", 0.0)
           + m.sigma_w * f.get("row_wsteps", 0.0)
           + m.kappa_o * f.get("o_elems", 0.0))
    out = {"work": (f["W"] / f["R"] + ops / hw.fp32_flops) / e * 1e3,
           "l2": f["B_l2"] / (hw.l2_bandwidth * m.e_l2) * 1e3,
           # DRAM reads at the HBM's rate; DRAM writes (dirty lines evicted from L2) at
           # the L2's write-back rate, a fraction of the L2 bandwidth: the same on the H100
           # and the H200 (same L2 slices and clocks), whatever their HBM
           "dram": ((f["B_dram"] - f.get("B_dram_write", 0.0)) / (m.e_dram * hw.hbm_bandwidth)
                    + f.get("B_dram_write", 0.0) / (m.e_dram_w * hw.l2_bandwidth)) * 1e3}
    if f.get("B_smem"):                 # 128 bytes per clock per SM: fp32_flops / 2 bytes/s
        out["smem"] = f["B_smem"] / (hw.fp32_flops / 2 * m.e_smem) * 1e3
    if f.get("B_local"):
        out["local"] = f["B_local"] / (hw.l2_bandwidth * m.e_local) * 1e3
    return out


def predict_launch(f: dict, m: RuntimeModel, hw) -> dict:
    tt = terms(f, m, hw)
    # form 11: an fa2 tensor-core forward CTA alone on its SM (the 128 x 64 build where
    # its registers or shared memory leave room for one: most d from 72 to 127, every d
    # above 128; iosim/launch/tc_registers.json) gets less of it than w_sat says: its warps
    # cross each key tile's barriers together and no second CTA runs in their softmax and
    # copy phases
    lone_tc = m.w_sat_tc and f.get("kernel") == "fa2_tc" and f.get("ctas_per_sm") == 1
    imb = imbalance(f, m.w_sat_tc if lone_tc else m.w_sat)
    imb_m = max(1.0, imb / m.g_mem)
    blend = sum((v * (imb_m if k in ("l2", "dram") else imb)) ** P_NORM
                for k, v in tt.items()) ** (1 / P_NORM)
    lat = (m.t_round_us + m.t_miss_us * f.get("lat_miss", 0.0)) * 1e-3 * f.get("lat_rounds", 0.0) \
        + m.t_cta_us * 1e-3 * f.get("cta_waves", 0.0)
    ms = m.t_launch_ms + blend + lat
    share = {k: v ** P_NORM / max(1e-300, sum(x ** P_NORM for x in tt.values()))
             * blend / max(1e-300, blend + lat) for k, v in tt.items()}
    if lat:
        tt["latency"] = lat
        share["latency"] = lat / (blend + lat)
    return {"name": f["name"], "family": f["family"], "predicted_ms": ms, "terms_ms": tt,
            "share": share, "binds": max(tt, key=tt.get), "imbalance": imb}


def _levels_without_background(algorithm, problem, hw, pass_, kernel, tiling):
    """`iosim.memory.pass_levels` with the L2 model's background DRAM writes left out, and
    that model's background_write_rate: the caller adds the background bytes from its own
    time prediction (`_with_background`), so a pass is predicted once."""
    quiet = replace(FITTED, background_write_rate=0.0)
    lv = pass_levels(algorithm, problem, hw, pass_=pass_, kernel=kernel, tiling=tiling, model=quiet)
    return lv, FITTED.background_write_rate


def _with_background(feats: list[dict], m: "RuntimeModel", hw, rate: float) -> list[dict]:
    """The launch features with `iosim.memory`' background DRAM writes added: rate
    (bytes/s) x each launch's time as model m predicts it without them (what
    `iosim.memory.levels._add_background_writes` adds to each kernel's dram_write_bytes; only B_dram
    and B_dram_write read them). rate 0: the features as they are."""
    if rate <= 0:
        return feats
    out = []
    for f in feats:
        extra = rate * predict_launch(f, m, hw)["predicted_ms"] / 1e3
        out.append(dict(f, B_dram=f["B_dram"] + extra,
                        B_dram_write=f.get("B_dram_write", 0.0) + extra))
    return out


def predict_time(algorithm: str, problem: Problem, gpu="H100-SXM", *, pass_: str = "fwd",
                 kernel: str = "auto", tiling: Tiling | None = None, model: RuntimeModel | None = None,
                 levels_result: dict | None = None) -> dict:
    """Predicted kernel time (ms) of one pass with the per-launch breakdown.
    Without levels_result, the levels are computed here without the L2 model's background
    DRAM writes, and those are added from this prediction's own launch times (the same
    bytes `iosim.levels` adds, from one time prediction instead of two)."""
    hw = get_hardware(gpu) if isinstance(gpu, str) else gpu
    m = model or RuntimeModel.load()
    rate = 0.0
    try:
        if levels_result is not None:
            lv = levels_result
        else:
            lv, rate = _levels_without_background(algorithm, problem, hw, pass_, kernel, tiling)
    except ValueError as e:
        raise ValueError(f"the time model cannot predict this pass: {e}") from e
    asked, modelled_as = problem, lv.get("dtype_modelled_as")
    if modelled_as:                 # a bf16 tensor-core pass: its fp16 build's features
        problem = replace(problem, dtype=modelled_as)
    feats = _with_background(launch_features(problem, lv, hw), m, hw, rate)
    launches = [predict_launch(f, m, hw) for f in feats]
    trust = trust_for("time", lv["algorithm"], lv["pass"], lv["kernel"], asked, hw.name,
                      (lv["block_rows"], lv["block_cols"]), modelled_as=modelled_as)
    return {"predicted_ms": sum(x["predicted_ms"] for x in launches), "launches": launches,
            "trust": trust.to_dict(),
            "constants": {"e": m.e, "e_l2": m.e_l2, "e_dram": m.e_dram,
                          "t_launch_ms": m.t_launch_ms, "w_sat": m.w_sat, "e_local": m.e_local,
                          "e_smem": m.e_smem, "kappa": m.kappa, "kappa_c": m.kappa_c,
                          "kappa_b": m.kappa_b, "rho": m.rho, "sigma": m.sigma,
                          "sigma_r": m.sigma_r, "g_mem": m.g_mem, "kappa_c1": m.kappa_c1,
                          "t_round_us": m.t_round_us, "t_miss_us": m.t_miss_us, "kappa_o": m.kappa_o,
                          "t_cta_us": m.t_cta_us, "sigma_w": m.sigma_w, "w_sat_tc": m.w_sat_tc, "p": P_NORM, "source": m.source}}
