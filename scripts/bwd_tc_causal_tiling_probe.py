"""ONE-OFF probe (ninth session): the causal tensor-core fa2 backward at d = 128 runs its
default 32 x 128 tiling (8 warps, 1 CTA per SM) because 32 x 64 (the non-causal default:
4 warps, 2 CTAs per SM) spilled 12 bytes with the masking code; Nsight Compute gave
142-154 TFLOP/s for the causal build against 182 for the non-causal one, and the causal
pass took 0.86 (N = 3072) and 0.76 (N = 8192) of the non-causal time for about half the
work. This times the causal pass at both tilings (and the non-causal default beside it),
each pass's kernels alone as analysis.hwmeasure times them (CUPTI, inputs rotated), one
JSON line per configuration to --out. Not a validation set: nothing here is fitted."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analysis.hwmeasure import time_row                       # noqa: E402
from analysis.validation_configs import cfg                   # noqa: E402

K = 1024
CONFIGS = [c for (b, h, n) in ((1, 16, 3 * K), (1, 8, 8 * K), (2, 16, 4 * K))
           for c in (cfg("bwd", "fa2", "tc", "fp16", b, h, n, 128, causal=True),
                     cfg("bwd", "fa2", "tc", "fp16", b, h, n, 128, causal=True, tiles=(32, 64)),
                     cfg("bwd", "fa2", "tc", "fp16", b, h, n, 128))]


def time_configs(configs, argv=None, description=__doc__, kind="bwd_tc_tiling_probe"):
    """Time each configuration (analysis.hwmeasure.time_row) into --out, a row as made,
    each row of `kind`."""
    ap = argparse.ArgumentParser(description=description.split("\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    for c in configs:
        row = time_row(c)
        row["kind"] = kind
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(c["id"], row["status"], row.get("tiling"),
              row.get("measured", {}).get("measured_ms"), flush=True)


if __name__ == "__main__":
    time_configs(CONFIGS)
