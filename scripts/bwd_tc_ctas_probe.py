"""ONE-OFF probe (ninth session): the causal tensor-core fa2 backward at d = 64 took the
non-causal cost per unit of work on two grids of 768 CTAs (b2 h12 N4096 on the H100 and the
H200; b2 h16 N3072 on the H200 only), where other causal d = 64 grids take 0.5-0.65 of it.
This times causal d = 64 passes whose grids have 768 CTAs by other (batch, heads, N) and
neighbouring CTA counts, with non-causal twins, each pass's kernels alone as
analysis.hwmeasure times them (CUPTI, inputs rotated), one JSON line per configuration to
--out. The default tiling at d = 64 is 64 x 128 (T_c = N / 128 key blocks, 1 CTA per SM),
so CTAs = batch x heads x N / 128. Not a validation set: nothing here is fitted."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis.validation_configs import cfg                   # noqa: E402

K = 1024
#: (batch, heads, N): 768 CTAs four ways, then 640, 704, 832, 1024 CTAs
SHAPES = [(2, 12, 4 * K), (1, 24, 4 * K), (3, 8, 4 * K), (2, 16, 3 * K), (1, 32, 3 * K),
          (2, 10, 4 * K), (2, 11, 4 * K), (2, 13, 4 * K), (2, 16, 4 * K)]
CONFIGS = [c for (b, h, n) in SHAPES
           for c in (cfg("bwd", "fa2", "tc", "fp16", b, h, n, 64, causal=True),
                     cfg("bwd", "fa2", "tc", "fp16", b, h, n, 64))]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bwd_tc_causal_tiling_probe import time_configs
    time_configs(CONFIGS, description=__doc__)
