"""The L2 model's ninth revision (iosim.memory): the causal sweeps' lag
(`L2Model.causal_lag`), and where `iosim.memory` applies it."""
import dataclasses

import pytest

from iosim import Problem
from iosim.memory import L2Model


def test_v9_is_v8_with_the_causal_lag():
    import iosim.memory as M
    assert M.FITTED is M.FITTED_V10
    assert M.FITTED_V8.causal_lag == 0.0 and M.FITTED_V9.causal_lag == pytest.approx(0.03)
    assert dataclasses.replace(M.FITTED_V9, causal_lag=0.0) == M.FITTED_V8


def test_levels_applies_the_causal_lag_to_the_causal_tc_forward_only():
    import iosim
    import iosim.memory as M
    deep = Problem(N=114688, d=64, heads=8, dtype="fp16", causal=True)
    v9 = iosim.levels("fa2", deep, "H100-SXM", model=M.FITTED_V9)
    v8 = iosim.levels("fa2", deep, "H100-SXM", model=M.FITTED_V8)
    # LEVELS_DEV6: 601 MB measured; v8 483 MB (-20 %), v9 534 MB (-11 %)
    assert v9["dram_read_bytes"] > 1.05 * v8["dram_read_bytes"]
    assert v9["l2_model"]["causal_lag"] == pytest.approx(0.03)
    # the non-causal forward (v8's sweep_lag) and the fast fp32 kernel (one CTA an SM) as v8
    for p, kernel in ((Problem(N=65536, d=64, heads=8, dtype="fp16"), "auto"),
                      (Problem(N=32768, d=64, heads=16, dtype="fp32", causal=True), "auto")):
        a = iosim.levels("fa2", p, "H100-SXM", kernel=kernel, model=M.FITTED_V9)
        b = iosim.levels("fa2", p, "H100-SXM", kernel=kernel, model=M.FITTED_V8)
        assert a["dram_read_bytes"] == b["dram_read_bytes"]


def test_causal_lag_is_checked():
    with pytest.raises(ValueError):
        L2Model(causal_lag=-0.1)
    with pytest.raises(ValueError):
        L2Model(causal_lag=1.5)
