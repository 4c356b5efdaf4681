"""The split-KV combine alone, on a GPU: version 1 (one thread a column sums every split
in order; gpu.decode's combine until 2026-12-07) beside versions 2 and 3 (
gpu.decode.split_kv.combine_kernel: the splits shared among the block's warps, U loads of
each lane in flight; 8 warps in version 2, gpu.decode's; as many as S needs in version 3,
its candidate), same run, same inputs.

    v1  combine_v1 below: thread t owns column t, loops s = 0 .. S-1, one Opart load a
        split, used at once: S load latencies in a chain (and thread 0 alone reads the
        S Lpart values first: S more)
    v2  split_kv.combine_kernel: every thread a share of Lpart, block max and sum; warp w
        sums splits w, w + NW, .. in rounds of U; ceil(S / (NW U)) latencies in a chain;
        NW = 8
    v3  the same kernel, NW = iosim.launch.decode.combine_warps(S) (1 warp up to S = 4, ..,
        8 from S = 17): 8-warp blocks with no split for most warps held 2 waves of the
        SMs' thread slots at 2,048 rows

Per (version, d, rows = batch x heads, S): N_q = 1, Opart / Lpart float32 from a fixed
seed (Lpart in [-3, 3], some splits -inf: empty chunks), O fp16. Each version's output is
checked against iosim.combine_partials in float64 (max relative error of O, of L).
Timing: analysis.bench_decode.Timer, as the decode bench: 3 warm-up launches, a
torch.cuda._sleep holds the stream while `reps` launches are enqueued, each between two
CUDA events; ms_median, ms_min. (The run of 2026-12-07 held the stream 2e5 cycles a
launch, the Timer 5e5: either outlasts the enqueueing.) The partials are not
rotated: in a decoding step the main kernel has just written them (at most a few MB at
the split rule's S), so the L2 holds them, as here.

Rows: kind "decode_combine", one per (version, d, rows, S). The time model's combine
constants (iosim/timing/decode_combine_constants.json) are fitted on the v2 and v3 rows with
S in FIT_S and scored on those with S in HELD_S (chosen before any row was measured).

    python3 benchmarks/decode_combine.py --out decode_combine.jsonl [--reps 30]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time

from numba import cuda, float32

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS = (8, 32, 128, 512, 2048)
FIT_S = (2, 4, 16, 66, 264)
HELD_S = (3, 8, 33, 132, 528)
#: largest S x rows timed (8,448 x d x 4 bytes of Opart: 4.3 MB at d = 128)
MAX_PARTIALS = 8448


def combine_v1(d, dt, N_q, NT):
    """Version 1 of the combine (as it was before 2026-12-07), for comparison only."""
    import math as m
    from gpu._launch import NEG_INF, ZERO, storer
    st = storer(dt)

    @cuda.jit
    def kernel(opart, lpart, o, L, S, H):
        z = cuda.blockIdx.x
        t = cuda.threadIdx.x
        b = z // H
        h = z % H
        ws = cuda.shared.array(0, float32)
        SW = S * N_q
        for r in range(t, N_q, NT):
            M = NEG_INF
            for s in range(S):
                lp = lpart[b, h, s, r]
                ws[s * N_q + r] = lp
                if lp > M or lp != lp:
                    M = lp if M == M else M
            none = M == NEG_INF
            Ms = ZERO if none else M
            sw = ZERO
            for s in range(S):
                w = m.exp(ws[s * N_q + r] - Ms)
                ws[s * N_q + r] = w
                sw += w
            if none:
                L[b, h, r] = NEG_INF
                ws[SW + r] = ZERO
            else:
                L[b, h, r] = Ms + m.log(sw)
                ws[SW + r] = sw
        cuda.syncthreads()
        for i in range(t, N_q * d, NT):
            r = i // d
            x = i % d
            acc = ZERO
            for s in range(S):
                acc += ws[s * N_q + r] * opart[b, h, s, r, x]
            sw = ws[SW + r]
            o[b, h, r, x] = st(acc / sw if sw != ZERO else ZERO)
    return kernel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="decode_combine.jsonl")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args(argv)
    if a.reps < 3:
        ap.error(f"--reps={a.reps} is not allowed; allowed: an integer >= 3")
    import numpy as np
    import torch
    from analysis import bench_decode as D
    from analysis import results as R
    from analysis.bench import versions
    from gpu._launch import launch
    from gpu.decode import split_kv as K
    from iosim import combine_partials
    from iosim.launch.decode import combine_plan, combine_warps
    base = dict(run_id=R.new_run_id("decode_combine"), device=torch.cuda.get_device_name(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                commit=os.environ.get("FLASHSIM_COMMIT") or R.current_commit(),
                versions=versions())
    w = D.Writer(a.out, base)
    timer = D.Timer(torch, a.reps)      # the decode bench's events and stream hold
    t0 = time.monotonic()
    rng = np.random.default_rng(0)
    points = [(d, rows, S) for d in (64, 128) for rows in ROWS
              for S in sorted(FIT_S + HELD_S) if S * rows <= MAX_PARTIALS]
    for i, (d, rows, S) in enumerate(points):
        H = min(rows, 32)
        B = rows // H
        Lp = rng.uniform(-3, 3, (B, H, S, 1)).astype(np.float32)
        Lp[rng.random((B, H, S, 1)) < 0.1] = -np.inf     # splits that saw no key
        Lp[:, :, 0] = rng.uniform(-3, 3, (B, H, 1))      # every row sees one
        Op = rng.standard_normal((B, H, S, 1, d)).astype(np.float32)
        Op[np.isneginf(Lp)[..., 0]] = 0.0
        O_ref, L_ref = combine_partials(np.moveaxis(Op.astype(np.float64), 2, 0),
                                        np.moveaxis(Lp.astype(np.float64), 2, 0))
        dop, dlp = cuda.to_device(Op), cuda.to_device(Lp)
        o = cuda.device_array((B, H, 1, d), np.float16)
        L = cuda.device_array((B, H, 1), np.float32)
        ctr = cuda.to_device(np.zeros((len(K.COUNTED), 2), np.int64))
        plans = {"v2_warps": combine_plan(S, 1, d, warps=8),
                 "v3_by_splits": combine_plan(S, 1, d, warps=combine_warps(S))}
        v1 = combine_v1(d, "fp16", 1, 128)

        def warps(pl):
            ker = K.combine_kernel(d, "fp16", 1, False, pl["NT"])
            return lambda: launch(ker, B * H, pl["NT"], pl["smem_bytes"], dop, dlp, o, L,
                                  np.int64(S), np.int64(H), ctr)
        runs = {"v1_serial": lambda: v1[B * H, 128, 0, 4 * (S + 1)](dop, dlp, o, L, np.int64(S),
                                                                     np.int64(H)),
                **{ver: warps(pl) for ver, pl in plans.items()}}
        for ver, fn in runs.items():
            pl = plans.get(ver)
            fn()
            cuda.synchronize()
            err_o = float(np.max(np.abs(o.copy_to_host().astype(np.float64).reshape(O_ref.shape)
                                        - O_ref)) / max(np.max(np.abs(O_ref)), 1e-30))
            err_l = float(np.max(np.abs(L.copy_to_host().reshape(L_ref.shape) - L_ref)))
            ms_median, ms_min = timer(lambda i: fn(), 1)
            w.row("decode_combine", version=ver, d=d, rows=rows, batch=B, heads=H, N_q=1,
                  num_splits=S, dtype="fp16", threads=128 if pl is None else pl["NT"],
                  unroll=None if pl is None else pl["U"],
                  rounds=S if pl is None else pl["rounds"],
                  split="fit" if S in FIT_S else "held_out", reps=a.reps,
                  ms_median=ms_median, ms_min=ms_min, max_rel_err_O=err_o,
                  max_abs_err_L=err_l, status="ok")
            print(f"[{i + 1}/{len(points)}] {ver} d={d} rows={rows} S={S}: "
                  f"{ms_median * 1e3:.1f} us, err O {err_o:.1e} L {err_l:.1e}",
                  flush=True)
    print(f"done: {w.n} rows in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
