"""`flashsim explore`: write the explorer page, one self-contained HTML file that plays a
forward schedule as iosim executed it (analysis.explore)."""
from __future__ import annotations

import argparse
import os

from iosim import ALGORITHMS, ConfigError, PRESETS, Problem, Tiling, get_hardware, resolve_tiling

EPILOG = """examples:
  flashsim explore --algorithm fa2 --seq-len 1024 --head-dim 64 --block-rows 64 --block-cols 64 --causal --out fa2.html
  flashsim explore --algorithm fa2 --seq-len 1024 --head-dim 64 --block-rows 64 --block-cols 64 --compare fa1 --out fa2_fa1.html
  flashsim explore --algorithm fa2 --seq-len 512 --head-dim 64 --block-rows 64 --block-cols 64 --compare-tiling 128x64 --out tilings.html
  flashsim explore --algorithm fa2 --seq-len 512 --head-dim 64 --block-rows 64 --block-cols 64 --backward --out fa2_bwd.html
  flashsim explore --algorithm fa2 --decode --seq-len 1 --seq-len-kv 4096 --heads 8 --kv-heads 2 --head-dim 64 --num-splits 4 --out decode.html
  flashsim explore --algorithm fa2 --seq-len 256 --seq-len-kv 512 --heads 4 --kv-heads 2 --head-dim 32 --block-rows 32 --block-cols 64 --causal --out gqa.html"""


def register(sub):
    from .traffic import _window
    p = sub.add_parser("explore", help="write the explorer page: a schedule played tile by tile",
                       description="Write one self-contained HTML page (no network, no server) "
                                   "that plays a forward (or, with --backward, backward) schedule as iosim executes it: the "
                                   "tiles each thread block reads and writes, per-tensor "
                                   "counters ending at the ledger, the waves on --gpu, the L2 / "
                                   "DRAM model's bytes, and what-if controls over closed forms "
                                   "computed here. Open the file in a browser.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithm", required=True, choices=ALGORITHMS)
    p.add_argument("--seq-len", type=int, required=True, metavar="N", help="query rows N")
    p.add_argument("--seq-len-kv", type=int, metavar="N_k", help="key/value rows (default N)")
    p.add_argument("--head-dim", type=int, required=True, metavar="d", help="head dimension d")
    p.add_argument("--block-rows", type=int, metavar="B_r",
                   help="query rows per tile (default: the paper's rule for --gpu's SRAM)")
    p.add_argument("--block-cols", type=int, metavar="B_c", help="key/value rows per tile")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (default: heads)")
    p.add_argument("--causal", action="store_true", help="causal mask, bottom-right aligned")
    p.add_argument("--window", metavar="LEFT,RIGHT", type=_window,
                   help="local window (as flashsim traffic); -1 = unbounded")
    p.add_argument("--sparsity", type=float, default=1.0, metavar="S",
                   help="a random block-sparse mask keeping a fraction S in (0, 1] of the "
                        "tiles (analysis.sweeps.random_block_mask; default 1: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random block mask")
    p.add_argument("--gpu", default="H100-SXM", metavar="PRESET",
                   help=f"preset for the waves, the L2 / DRAM model and times: {', '.join(PRESETS)}")
    cmp_ = p.add_mutually_exclusive_group()
    cmp_.add_argument("--compare", choices=ALGORITHMS, metavar="ALGORITHM",
                      help="a second schedule on the same problem, in lockstep")
    cmp_.add_argument("--compare-tiling", metavar="BRxBC", type=_tiling,
                      help="the same schedule at a second tiling, e.g. 128x64")
    cmp_.add_argument("--compare-causal", action="store_true",
                      help="the same schedule with the causal mask toggled")
    p.add_argument("--backward", action="store_true",
                   help="the backward pass (dQ, dK, dV) instead of the forward")
    dec = p.add_argument_group("decoding (--decode)",
                               "one decoding step (iosim.execute_decode): --seq-len new rows "
                               "(1..16) of each query head against a contiguous cache of "
                               "--seq-len-kv rows; the fa2 schedule (one block per head) or "
                               "split-KV (--num-splits S > 1, then the combine)")
    dec.add_argument("--decode", action="store_true", help="a decoding step")
    dec.add_argument("--num-splits", type=int, default=1, metavar="S",
                     help="split-KV splits (default 1: the fa2 decode schedule)")
    dec.add_argument("--kv-reads", choices=("per_query_head", "per_group"),
                     default="per_query_head",
                     help="grouped heads: each query head reads its group's K/V (default), "
                          "or one block per K/V head reads it once")
    p.add_argument("--no-whatif", action="store_true",
                   help="leave out the what-if panel (its time grid takes a few seconds)")
    p.add_argument("--out", required=True, metavar="FILE.html", help="the page to write")
    p.set_defaults(func=main)


def _tiling(text: str) -> tuple[int, int]:
    try:
        br, bc = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--compare-tiling={text!r} is not allowed; allowed: BRxBC, e.g. 128x64") from None
    return br, bc


def _label(alg: str, t: Tiling, causal: bool, pass_: str = "fwd") -> str:
    return (f"{alg}{' backward' if pass_ == 'bwd' else ''} {t.B_r}x{t.B_c}"
            f"{' causal' if causal else ''}")


def main(args) -> int:
    from analysis.explore import build_view, page, whatif_grid
    hw = get_hardware(args.gpu)
    if not args.out.endswith((".html", ".htm")):
        raise ConfigError(f"--out={args.out!r} is not allowed; allowed: a file name ending in .html")
    if args.decode:
        return decode_main(args, hw)
    if args.num_splits != 1 or args.kv_reads != "per_query_head":
        raise ConfigError("--num-splits and --kv-reads need --decode")
    window = (-1, -1) if args.window is None else args.window
    problem = Problem(N=args.seq_len, d=args.head_dim, batch=args.batch, heads=args.heads,
                      kv_heads=args.kv_heads, dtype=args.dtype, causal=args.causal,
                      N_k=args.seq_len_kv, window=window)
    tiling = resolve_tiling(args.algorithm, problem.d, problem.dtype, block_rows=args.block_rows,
                            block_cols=args.block_cols,
                            sram_bytes=None if args.block_rows else hw.sram_bytes)
    from dataclasses import replace

    def masked(prob, t):
        """prob with the random block mask of --sparsity over tiling t (one per tiling)."""
        if args.sparsity == 1.0:
            return prob
        from analysis.sweeps import random_block_mask
        return replace(prob, block_mask=random_block_mask(t.T_r(prob.N), t.T_c(prob.N_k),
                                                          args.sparsity, args.seed))
    runs = [(args.algorithm, masked(problem, tiling), tiling)]
    if args.compare:
        runs.append((args.compare, runs[0][1], tiling))
    elif args.compare_tiling:
        other = Tiling(*args.compare_tiling)
        runs.append((args.algorithm, masked(problem, other), other))
    elif args.compare_causal:
        runs.append((args.algorithm, replace(runs[0][1], causal=not problem.causal), tiling))
    from analysis.explore import check_size
    pass_ = "bwd" if args.backward else "fwd"
    for alg, prob, t in runs:          # refuse before any work
        check_size(alg, prob, t, pass_)
    views = [build_view(alg, prob, t, hw.name, _label(alg, t, prob.causal, pass_), pass_)
             for alg, prob, t in runs]
    algs = list(dict.fromkeys(a for a, _, _ in runs))
    whatif = None if args.no_whatif else whatif_grid(algs, problem, pass_)
    if whatif and args.sparsity != 1.0:
        whatif["note"] = "The grid is of the dense (or causal) problem: the block mask is not in it."
    title = " vs ".join(v["label"] for v in views) + f", N={problem.N} d={problem.d}"
    html = page(views, whatif, title)
    d = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(d, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(html)
    print(f"wrote {args.out} ({len(html) / 1e6:.2f} MB): {title}; "
          f"{sum(len(v['steps']) for v in views):,} steps")
    return 0


def decode_main(args, hw) -> int:
    """`--decode`: one decoding step's page (no compare, no what-if)."""
    from iosim import DecodeProblem
    from analysis.explore import build_decode_view, page
    clash = [f for f, bad in (("--compare", args.compare), ("--compare-tiling", args.compare_tiling),
                              ("--compare-causal", args.compare_causal),
                              ("--backward", args.backward), ("--causal", args.causal),
                              ("--window", args.window is not None),
                              ("--sparsity", args.sparsity != 1.0),
                              ("--block-rows", args.block_rows is not None),
                              ("--block-cols", args.block_cols is not None)) if bad]
    if clash:
        raise ConfigError(f"--decode does not go with {', '.join(clash)}: a decoding step "
                          f"sees its whole cache, in pieces the page chooses")
    if args.seq_len_kv is None:
        raise ConfigError("--decode needs --seq-len-kv (the cache length N_kv)")
    problem = DecodeProblem(N_kv=args.seq_len_kv, d=args.head_dim, N_q=args.seq_len,
                            batch=args.batch, heads=args.heads, kv_heads=args.kv_heads,
                            dtype=args.dtype)
    view = build_decode_view(problem, args.num_splits, args.kv_reads, hw.name)
    title = f"{view['label']}, N_q={problem.N_q} N_kv={problem.N_kv} d={problem.d}"
    html = page([view], None, title)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(html)
    print(f"wrote {args.out} ({len(html) / 1e6:.2f} MB): {title}; {len(view['steps']):,} steps")
    return 0
