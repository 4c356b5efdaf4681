"""ONE-OFF A/B probe (ninth session): the causal tensor-core fa2 backward's main kernel at
commit fa03137 (before N_k != N_q and windows, 37df206) against today's, same process, same
inputs, CUDA events around 20 launches, median of 7 such runs after a warm-up. The old
module is gpu/backward/_fa2_tc_fa03137.py, `git show fa03137:gpu/backward/fa2_tc.py` with
its kernel renamed (made by hand on the machine that runs this; not committed)."""
import json
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np          # noqa: E402
import torch                # noqa: E402
from numba import cuda      # noqa: E402

import gpu                                   # noqa: E402
from gpu.backward import fa2_tc, fa2_fast    # noqa: E402
from gpu.backward import _fa2_tc_fa03137 as old   # noqa: E402
from gpu.backward.flash import _new_counters      # noqa: E402


def main(out):
    rows = []
    for (B, H, N, d, causal) in [(2, 16, 3072, 64, True), (2, 12, 4096, 64, True),
                                 (2, 16, 3072, 64, False), (1, 16, 3072, 128, True),
                                 (1, 16, 3072, 128, False), (2, 16, 8192, 64, True)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16, generator=g)
                       for _ in range(4))
        o, L = gpu.attention(q, k, v, causal=causal, return_stats=True)
        I = B * H
        A = cuda.as_cuda_array
        q3, k3, v3, do3, o3 = (A(x.reshape(I, N, d)) for x in (q, k, v, do, o.contiguous()))
        L2 = A(L.reshape(I, N).contiguous())
        D2 = cuda.device_array((I, N), np.float32)
        acc = cuda.device_array((I, N, d), np.float32)
        dk = A(torch.empty(I, N, d, device="cuda", dtype=torch.float16))
        dv = A(torch.empty(I, N, d, device="cuda", dtype=torch.float16))
        cnt = _new_counters(False)
        fa2_fast.run_pre(o3, do3, D2, acc, N, cnt, dt="fp16", count=False)
        t = fa2_tc.default_tiling(d, causal)
        kw = dict(B_r=t["B_r"], B_c=t["B_c"], causal=causal, count=False, MT=t.get("MT", 1),
                  kreg=t.get("kreg"), DN=t.get("DN"), dt="fp16")
        scale = 1.0 / np.sqrt(d)
        res = {}
        for name, mod in (("new", fa2_tc), ("old", old), ("new2", fa2_tc), ("old2", old)):
            f = lambda: mod.run(q3, k3, v3, do3, L2, D2, acc, dk, dv, scale, N, H, 1, None, cnt, **kw)
            f(); f(); torch.cuda.synchronize()
            ts = []
            for _ in range(7):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(20):
                    f()
                e1.record(); torch.cuda.synchronize()
                ts.append(e0.elapsed_time(e1) / 20)
            res[name] = float(np.median(ts))
        row = dict(kind="bwd_tc_tiling_probe", record="ab_fa03137", B=B, H=H, N=N, d=d,
                   causal=causal, tiling=[t["B_r"], t["B_c"]], device=torch.cuda.get_device_name(),
                   ms_new=min(res["new"], res["new2"]), ms_old=min(res["old"], res["old2"]), runs=res)
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
