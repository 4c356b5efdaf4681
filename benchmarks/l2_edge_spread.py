"""The effective L2 capacity each measured fa1 pass implies (a tool: prints, writes nothing).

    PYTHONPATH=<tree> python3 benchmarks/l2_edge_spread.py [--model v10|v11] [--rows]

For every fa1 pass measured under Nsight Compute (levels_measurement.jsonl, H100 and H200,
and the levels_repeat rows: the same passes four times on another H100), the model
(`iosim.memory.FITTED` unless --model) is inverted: the factor k of its effective L2
capacity C (every tile's edge, the dirty cap and the drain with it: `levels`'
capacity_scales) at which it reproduces the measured DRAM reads, and the one for the
measured writes (log-linear interpolation on a grid of k = 0.5 ... 1.6, step 0.02). A count
is on the edge where the model's bytes at k = 0.9 and 1.1 differ by more than the bound
(15 % or 16 MB): only there does the measurement pin k down (elsewhere it is printed with
a '*' and left out of the summaries; '>1.60': the measured bytes are at or below the
model's compulsory traffic, '<0.50': above its bytes at half the capacity).
Machines: "A" is the H100 of run 2026-11-27-h100-levels-dev8, "B" the H100 of
2026-11-27-h100-l2-repeat (four repeats, averaged; their spread printed), "C" and "D" the
thirteenth session's H100s (by GPU UUID, `MACHINE_OF_UUID`), "?" an older row (its
machine was not recorded); the H200 rows' machine letters say nothing (one letter set). H200 rows are reported apart (held out: nothing here is
fitted on them).
"""
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "results" / "data"
GRID = tuple(np.round(np.arange(0.50, 1.6001, 0.02), 4))
MACHINE = {"2026-11-27-h100-levels-dev8": "A", "2026-11-27-h100-l2-repeat": "B"}
#: the H100s by GPU UUID (rows carry it from the twelfth session's second call on): B of
#: the twelfth session; C and D of the thirteenth (D behaves as B on fa1's onset); E and F
#: and G of the fourteenth (spilling builds only, no fa1 pass yet)
MACHINE_OF_UUID = {"GPU-a0c8e126": "B", "GPU-6a0b2fb0": "C", "GPU-4ab63188": "D",
                   "GPU-f9e71482": "E", "GPU-89aae31d": "F", "GPU-8624f543": "G"}


def machine_of(r: dict, default: str = "?") -> str:
    """The machine letter of a measured row: by its GPU UUID where it has one, else by its
    run (`MACHINE`), else `default`."""
    uuid = (r.get("device_uuid") or "")[:12]
    return MACHINE_OF_UUID.get(uuid) or MACHINE.get(r.get("run_id"), default)


def load(name):
    p = DATA / f"{name}.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def invert(ks, ys, meas):
    """k at which the (decreasing) model bytes ys(k) equal meas; a bound where outside."""
    ys = np.maximum(np.asarray(ys, float), 1.0)
    lm = math.log(max(meas, 1.0))
    ly = np.log(ys)
    if lm >= ly[0]:
        return ks[0], "<"
    if lm <= ly[-1]:
        return ks[-1], ">"
    # first crossing from above
    for i in range(len(ks) - 1):
        if ly[i] >= lm >= ly[i + 1]:
            f = 0.0 if ly[i] == ly[i + 1] else (ly[i] - lm) / (ly[i] - ly[i + 1])
            return ks[i] + f * (ks[i + 1] - ks[i]), ""
    return float("nan"), "?"


def edge(ks, ys, lo=0.9, hi=1.1):
    """On the edge: the model's bytes at C x lo and C x hi differ by more than the bound."""
    from iosim.memory import within
    a, b = (ys[int(np.argmin(np.abs(np.asarray(ks) - x)))] for x in (lo, hi))
    return not within(a, b)


def rows_of(model):
    """[(device, machine, config, measured {reads, writes}, repeat spread)]"""
    out = []
    for r in load("levels_measurement"):
        if r.get("status") == "ok" and r["config"]["algorithm"] == "fa1":
            m = r["measured"]
            out.append((r["device"], machine_of(r), r["config"],
                        (m["dram_read_bytes"], m["dram_write_bytes"]), None))
    rep = defaultdict(list)
    for r in load("levels_repeat"):
        if r.get("status") == "ok" and r["config"]["algorithm"] == "fa1":
            rep[(r["device"], machine_of(r, "B?"), r["config"]["id"])].append(r)
    for (dev, mach, _), rs in sorted(rep.items()):
        rd = [x["measured"]["dram_read_bytes"] for x in rs]
        wr = [x["measured"]["dram_write_bytes"] for x in rs]
        spread = (max(rd) / min(rd) - 1, max(wr) / min(wr) - 1, len(rs))
        out.append((dev, mach, rs[0]["config"],
                    (float(np.mean(rd)), float(np.mean(wr))), spread))
    return out


def analyse(model=None):
    from analysis.fit_levels import GPU_OF_DEVICE, config_kernel, problem_of
    from iosim import levels
    from iosim import Tiling, get_hardware
    res = []
    for dev, mach, c, (mr, mw), spread in rows_of(model):
        gpu = GPU_OF_DEVICE.get(dev, "H100-SXM")
        hw = get_hardware(gpu)
        p = problem_of(c)
        tiling = None if c.get("block_rows") is None else Tiling(c["block_rows"], c["block_cols"])
        out = levels(c["algorithm"], p, gpu, pass_=c["pass"], kernel=config_kernel(c),
                     tiling=tiling, model=model, capacity_scales=GRID, chip_range=None)
        ks = [x[0] for x in out["dram_at_capacity_scales"]]
        yr = [x[1] for x in out["dram_at_capacity_scales"]]
        yw = [x[2] for x in out["dram_at_capacity_scales"]]
        W = p.instances * p.N * (2 * p.d * p.itemsize + 8)
        kr, br = invert(ks, yr, mr)
        kw, bw = invert(ks, yw, mw)
        res.append(dict(device="H200" if gpu == "H200" else "H100", machine=mach, id=c["id"],
                        W_L2=W / hw.l2_bytes, meas=(mr, mw),
                        point=(out["dram_read_bytes"], out["dram_write_bytes"]),
                        k_read=kr, k_read_bound=br, k_write=kw, k_write_bound=bw,
                        edge_read=edge(ks, yr), edge_write=edge(ks, yw), repeat_spread=spread))
    return res


def _k(k, b, on_edge):
    s = f"{b}{k:.2f}" if b in "<>" else f"{k:.2f}"
    return f"{s:>6}" + ("" if on_edge else "*")


def summary(res, dev, machines=None):
    ks = [x["k_read"] for x in res if x["device"] == dev and x["edge_read"] and not x["k_read_bound"]
          and (machines is None or x["machine"] in machines)]
    ks += [x["k_write"] for x in res if x["device"] == dev and x["edge_write"] and not x["k_write_bound"]
           and (machines is None or x["machine"] in machines)]
    if not ks:
        return "none"
    q = np.percentile(ks, [0, 10, 50, 90, 100])
    return (f"{len(ks)} factors (reads and writes on the edge): min {q[0]:.3f}, p10 {q[1]:.3f}, "
            f"median {q[2]:.3f}, p90 {q[3]:.3f}, max {q[4]:.3f}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    import iosim.memory as M
    model = None
    if "--model" in argv:
        model = getattr(M, "FITTED_" + argv[argv.index("--model") + 1].upper())
    res = analyse(model)
    res.sort(key=lambda x: (x["device"], x["W_L2"], x["id"], x["machine"]))
    print("k: the factor of the model's effective L2 capacity at which it reproduces the measured DRAM bytes "
          "(* = the model's bytes at k 0.9 and 1.1 within the bound of each other: "
          "off the edge, k not pinned down)")
    print(f"{'dev':<5}{'m':<3}{'config':<44}{'W/L2':>6}{'meas rd':>9}{'wr':>7}{'pred rd':>9}"
          f"{'wr':>7}{'k_rd':>8}{'k_wr':>8}  repeats")
    for x in res:
        sp = x["repeat_spread"]
        print(f"{x['device']:<5}{x['machine']:<3}{x['id']:<44}{x['W_L2']:>6.2f}"
              f"{x['meas'][0] / 1e6:>9.0f}{x['meas'][1] / 1e6:>7.0f}{x['point'][0] / 1e6:>9.0f}"
              f"{x['point'][1] / 1e6:>7.0f}{_k(x['k_read'], x['k_read_bound'], x['edge_read']):>8}"
              f"{_k(x['k_write'], x['k_write_bound'], x['edge_write']):>8}"
              + (f"  n={sp[2]} rd +{sp[0]:.1%} wr +{sp[1]:.1%}" if sp else ""))
    print()
    print("machine A vs B (the same configuration):")
    by = defaultdict(dict)
    for x in res:
        if x["device"] == "H100":
            by[x["id"]][x["machine"]] = x
    for cid, d in sorted(by.items()):
        if "A" in d and "B" in d:
            a, b = d["A"], d["B"]
            print(f"  {cid:<44} k_rd A {_k(a['k_read'], a['k_read_bound'], a['edge_read'])} "
                  f"B {_k(b['k_read'], b['k_read_bound'], b['edge_read'])}   k_wr A "
                  f"{_k(a['k_write'], a['k_write_bound'], a['edge_write'])} B "
                  f"{_k(b['k_write'], b['k_write_bound'], b['edge_write'])}")
    h200 = [x for x in res if x["device"] == "H200"]
    byh = {x["id"]: x for x in h200}
    print()
    print("H100 (all machines):  " + summary(res, "H100"))
    print("H100 machine A (dev8): " + summary(res, "H100", {"A"}))
    print("H100 machine B (repeat): " + summary(res, "H100", {"B"}))
    print("H100 machine C:        " + summary(res, "H100", {"C"}))
    print("H100 machine D:        " + summary(res, "H100", {"D"}))
    print("H100 older rows (?):  " + summary(res, "H100", {"?"}))
    print("H200 (held out):      " + summary(res, "H200"))
    if "--rows" in argv:
        print(json.dumps(res, default=str))
    return res


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
