"""ONE-OFF probe (tenth session): what the band code costs the kernels that run it.

Since issue 18, a causal problem with N_k != N_q or a local window compiles the kernels'
general band code (the int64 band lo, hi as kernel arguments, gpu.forward._band), while the
tensor-core backward compiles the square causal band (N_k = N, no window) as a special
case (289b8c6: the band build had made that pass 40 % slower at d = 64). This times each
kernel on the causal mask twice, as plain causal and as causal with the window
(N - 1, 0): the same visible pairs, the same tiles and counts, only the build differs
(`window` compiled in). A ratio near 1 says the band code is free; well above 1, that
band problems (N_k != N_q, windows) pay for the general code.

Each pass's kernels are timed alone as analysis.hwmeasure times them (CUPTI, inputs
rotated), one JSON line per configuration to --out (kind band_overhead_probe). Not a
validation set: nothing here is fitted."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis.validation_configs import cfg                   # noqa: E402
from bwd_tc_causal_tiling_probe import time_configs          # noqa: E402

K = 1024


def _pair(pass_, kernel, dtype, b, h, n, d):
    c = cfg(pass_, "fa2", kernel, dtype, b, h, n, d, causal=True)
    return [c, dict(c, id=c["id"] + f"_win{n - 1},0", window=[n - 1, 0])]


CONFIGS = [c for args in (("fwd", "tc", "fp16", 2, 16, 4 * K, 64),
                          ("fwd", "tc", "fp16", 2, 16, 4 * K, 128),
                          ("bwd", "tc", "fp16", 2, 16, 4 * K, 64),
                          ("bwd", "tc", "fp16", 2, 16, 4 * K, 128),
                          ("fwd", "fast", "fp32", 1, 16, 4 * K, 64),
                          ("bwd", "fast", "fp32", 1, 16, 4 * K, 64))
           for c in _pair(*args)]


if __name__ == "__main__":
    time_configs(CONFIGS, description=__doc__, kind="band_overhead_probe")
