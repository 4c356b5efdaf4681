"""Split counts on ragged batches, on a GPU: gpu.decode's main kernel at every S in SPLITS
on the ragged batches of `flashsim bench --decode` (analysis.bench_decode.RAGGED: lengths
uniform in [N_kv / 8, N_kv], the longest N_kv), contiguous and in pages of 16, with the
split rule's own S in each row (rule_num_splits). What the ragged split rule
(iosim.choose_num_splits) is chosen from: on a ragged batch the longest sequence's chunks
can outlast the rest, which a uniform batch's rule does not see.

Rows: kind "decode_bench", sweep "num_splits_ragged", the bench's timing method (rotated
inputs, events around each call, median of 20) and fields.

    python3 benchmarks/decode_ragged_splits.py --out decode_ragged_splits.jsonl \
        [--main auto|flat|tc] [--budget-s 200]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: split counts timed at every shape (and the rule's own, where it is not among them)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
#: cache layouts: contiguous and pages of 16 rows
PAGES = (None, 16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="decode_ragged_splits.jsonl")
    ap.add_argument("--main", default="auto", choices=("auto", "flat", "tc"))
    ap.add_argument("--budget-s", type=float, default=200.0)
    a = ap.parse_args(argv)
    if not a.budget_s > 0:
        ap.error(f"--budget-s={a.budget_s} is not allowed; allowed: a number > 0")
    import torch
    from analysis import bench_decode as D
    from analysis import results as R
    from analysis.bench import versions
    vers = versions()
    base = dict(run_id=R.new_run_id("decode_ragged_splits"),
                device=torch.cuda.get_device_name(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                commit=os.environ.get("FLASHSIM_COMMIT") or R.current_commit(),
                versions=vers)
    w = D.Writer(a.out, base)
    bench = D.Bench(w, D.MIN_REPS, a.main)
    t0 = time.monotonic()
    shapes = [(b, attn, n, page) for b, n in D.RAGGED for attn in D.ATTN for page in PAGES]
    shapes.sort(key=lambda s: s[0] * D.ATTN[s[1]][1] * s[2])
    for b, attn, n, page in shapes:
        lens = D.ragged_lengths(b, n)
        for S in SPLITS:
            if time.monotonic() - t0 > a.budget_s:
                print("budget: stopped", flush=True)
                return 0
            impls = ("flashsim", "torch_sdpa") if S == 1 and page is None else ("flashsim",)
            bench.point(b, attn, 128, n, page, num_splits=S, sweep="num_splits_ragged",
                        impls=impls, name=f"b{b}_{attn}_d128_{n}_ragged_p{page}", lens=lens)
    print(f"done: {w.n} rows in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
