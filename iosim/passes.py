"""One pass's L2 / DRAM levels with the background writes priced by the time model:
`levels`, exported as `iosim.levels`.

The memory model (`iosim.memory`) predicts a pass's bytes; part of its DRAM writes grows
with the kernels' duration (L2Model.background_write_rate), which the time model
(`iosim.timing`) predicts from those bytes. This module joins the two one way: the memory
model takes the time model as an argument, and the time model reads the memory model."""
from __future__ import annotations

from .memory.levels import CHIP_CAPACITY_RANGE, pass_levels
from .memory.l2model import L2Model
from .problem import Problem
from .tiling import Tiling
from .timing.predict import predict_time
from .timing.trust import trust_for


def _launch_ms(res: dict, problem: Problem, hw) -> list[float]:
    """Each launch's predicted ms for the levels `res` (before their background writes)."""
    t = predict_time(res["algorithm"], problem, hw, pass_=res["pass"], levels_result=res)
    return [x["predicted_ms"] for x in t["launches"]]


def levels(algorithm: str, problem: Problem, gpu="H100-SXM", *, pass_: str = "fwd",
           kernel: str = "auto", tiling: Tiling | None = None,
           model: L2Model | None = None, grid_order: str = "query-major",
           chip_range: tuple[float, float] | None = CHIP_CAPACITY_RANGE,
           capacity_scales: tuple = ()) -> dict:
    """Requested, L2 and DRAM bytes of one pass (whole problem; cold L2 at each kernel),
    with the plan, each kernel's launch and prediction, and the model's constants: the
    arguments and result of `iosim.memory.pass_levels`, with the background DRAM writes
    (rate x the time model's predicted duration of each launch) added, and `trust`:
    {"time": ..., "dram": ...}, how far each prediction can be trusted for this kind of
    problem (`iosim.timing.trust.Trust.to_dict()`: validated, statement, basis, outside,
    stats; the models' blind errors on the nearest validated family). A problem the
    models do not cover (block-sparse masks, N_k != N, windows, dropout, bf16 on the plain
    kernels) raises ValueError in one line."""
    res = pass_levels(algorithm, problem, gpu, pass_=pass_, kernel=kernel, tiling=tiling,
                      model=model, grid_order=grid_order, chip_range=chip_range,
                      capacity_scales=capacity_scales, launch_ms=_launch_ms)
    res["trust"] = {w: trust_for(w, res["algorithm"], res["pass"], res["kernel"], problem,
                                 res["gpu"], (res["block_rows"], res["block_cols"]),
                                 modelled_as=res.get("dtype_modelled_as")).to_dict()
                    for w in ("time", "dram")}
    return res


__all__ = ["levels"]
