#!/usr/bin/env python3
"""Probe: which L2 reads miss in a spilling build, local memory's or the K/V's?

Why: the spilling explicit tilings (fa2_tc 128 x 128 and 64 x 128 at d = 64, fa2_fast
256 x 32 at d = 128; `iosim.launch.plan.LOCAL`) read 4-99 % of their global loads, or
equally 3-14 % of their local loads, from DRAM (LEVELS_DEV10). Nsight Compute's DRAM and
L2 totals cannot say which: both are device memory. Its L2 counters do split every
request by the eviction class it carries (evict_first / evict_last / evict_normal /
evict_normal_demote), and local memory and the kernels' global loads (cp.async,
ld.global) may carry different ones. This probe runs a set's configurations under ncu
with the L2 read and write sectors split by class and by hit / miss, next to the DRAM
bytes and the L1's local and global bytes, and writes one row per configuration.

    python3 scripts/l2_class_probe.py --set levels_dev10 --out OUT.jsonl [--ids a,b]

Rows: kind "l2_class_probe"; measured: {metric: value} summed over the pass's kernels
(sectors of 32 bytes for lts__, bytes for dram__ and l1tex__). Needs a GPU, Nsight
Compute and torch (as analysis.hwmeasure's counters).
"""
import argparse
import json
import sys

from analysis import hwmeasure
from analysis.ncu import find_ncu
from analysis.validation_configs import SETS

CLASSES = ("evict_first", "evict_last", "evict_normal", "evict_normal_demote")
METRICS = (["dram__bytes_read.sum", "dram__bytes_write.sum",
            "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
            "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
            "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
            "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
            "lts__t_sectors_srcunit_tex_op_write_lookup_miss.sum"]
           + [f"lts__t_sectors_srcunit_tex_op_{op}_{c}_lookup_{h}.sum"
              for op in ("read", "write") for c in CLASSES for h in ("hit", "miss")])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", required=True, help="a set of analysis.validation_configs.SETS")
    ap.add_argument("--ids", default="", help="comma-separated configuration ids (default: all)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    configs = SETS[a.set]
    if a.ids:
        want = set(a.ids.split(","))
        configs = [c for c in configs if c["id"] in want]
    ncu = find_ncu()
    if not ncu:
        raise SystemExit("l2_class_probe: ncu (Nsight Compute) not found")
    env = hwmeasure.environment()
    with open(a.out, "a") as out:
        for c in configs:                      # one child each: a failure costs one row
            got = hwmeasure.ncu_passes([c], ncu, METRICS, timeout=500)
            row = {"kind": "l2_class_probe", **env, "config": c, "status": "error"}
            if got and got[0][2]:
                kernels = got[0][2]
                row["status"] = "ok"
                row["measured"] = {m: sum(k["metrics"].get(m, 0.0) for k in kernels)
                                   for m in METRICS}
                row["kernels"] = [k["kernel"] for k in kernels]
            else:
                row["error"] = (got[0][1].get("error") if got else None) or "no ncu rows for this pass"
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(c["id"], row["status"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
