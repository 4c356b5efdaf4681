"""Registers per thread of the fa2 tensor-core builds at every head dim, from ptxas: the
table `iosim.launch.plan` reads for d the hand-written entries do not list
(iosim/launch/tc_registers.json).

A build's registers decide how many of its CTAs an SM holds, and so the L2 / DRAM and
time models' occupancy. They are facts of the build, not fitted: ptxas -v on the linked
PTX (gpu.forward.fa2_tc.linked_ptx, gpu.backward.fa2_tc.linked_ptx; sm_90) of the tiling
`iosim.kernel_plan` picks on the H100 preset, for every d the kernel takes (forward 1-256,
backward 1-128), causal or not. ptxas gives the measured builds' counts within 1-5
(Nsight Compute's launch__registers_per_thread, 2026-11-25).

    NUMBA_ENABLE_CUDASIM=0 python3 benchmarks/tc_registers.py [--out FILE] [--check]

No GPU needed: Numba's NVVM, NVRTC and nvJitLink build the PTX; ptxas (CUDA's, on the
PATH) assembles it. An older ptxas than NVVM's PTX version gets the version it takes (the
same code). About 2 s a build, 768 builds. --check: compare with the committed file."""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "iosim", "launch", "tc_registers.json")


def ptxas_registers(ptx: str) -> tuple[int, int]:
    """(registers, spill store bytes) of one kernel's PTX (gpu._tc.ptxas_registers, sm_90)."""
    from gpu._tc import ptxas_registers as count
    regs, spill = count(ptx)
    if regs is None:
        raise RuntimeError("ptxas gave no register count")
    return regs, spill


def table(progress=print) -> dict:
    """{"fa2_tc": [[B_r, B_c, d, causal, registers, spill_stores], ...], "fa2_bwd_tc": ...}"""
    import iosim
    from iosim.launch import kernel_plan
    from gpu.backward import fa2_tc as bwd
    from gpu.forward import fa2_tc as fwd
    hw = iosim.get_hardware("H100-SXM")
    out = {"fa2_tc": [], "fa2_bwd_tc": []}
    for key, mod, pass_, d_max in (("fa2_tc", fwd, "fwd", 256), ("fa2_bwd_tc", bwd, "bwd", 128)):
        for d in range(1, d_max + 1):
            for causal in (False, True):
                p = iosim.Problem(N=4096, d=d, heads=16, dtype="fp16", causal=causal)
                plan = kernel_plan("fa2", p, hw, pass_=pass_)
                if plan.kernel != "tc":
                    continue
                B_r, B_c = plan.tiling.B_r, plan.tiling.B_c
                regs, spill = ptxas_registers(mod.linked_ptx(B_r, B_c, d, causal))
                out[key].append([B_r, B_c, d, causal, regs, spill])
                progress(f"{key} {B_r}x{B_c} d={d} causal={causal}: {regs} registers")
    return out


def write(t: dict, path: str = OUT) -> None:
    """The table as JSON, one build a line."""
    about = (" ".join(__doc__.split("\n\n")[0].split()) + " Rows: [B_r, B_c, d, causal, registers, spill "
             "store bytes]. Remake: NUMBA_ENABLE_CUDASIM=0 python3 benchmarks/tc_registers.py")
    parts = [f'  {json.dumps(k)}: [\n' + ",\n".join(f"    {json.dumps(r)}" for r in rows) + "\n  ]"
             for k, rows in t.items()]
    with open(path, "w") as f:
        f.write('{\n "about": ' + json.dumps(about) + ',\n "builds": {\n' + ",\n".join(parts)
                + "\n }\n}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with the committed file")
    a = ap.parse_args(argv)
    t = table()
    if a.check:
        with open(OUT) as f:
            same = json.load(f)["builds"] == t
        print(f"{OUT}: {'the same' if same else 'differs'}")
        return 0 if same else 1
    write(t, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
