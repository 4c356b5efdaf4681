"""`flashsim traffic`: the HBM ledger of one schedule on one problem (closed form)."""
from __future__ import annotations

import json

from iosim import (ALGORITHMS, ConfigError, PRESETS, Problem, closed_form, get_hardware,
                   resolve_tiling, sram_footprint_bytes, sram_to_elements)


def register(sub):
    p = sub.add_parser("traffic", help="HBM reads and writes of one schedule, per tensor",
                       description="Print the HBM ledger of a forward schedule (closed form, "
                                   "equal to the executed schedule). Byte figures are totals "
                                   "for the whole problem (batch x heads).")
    p.add_argument("--algorithm", required=True, choices=ALGORITHMS)
    p.add_argument("--seq-len", type=int, metavar="N",
                   help="sequence length N (required unless --cu-seqlens-q is given)")
    p.add_argument("--head-dim", type=int, required=True, metavar="d", help="head dimension d")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sram-bytes", type=int, metavar="M", help="SRAM capacity M per thread block, in bytes")
    g.add_argument("--gpu", metavar="PRESET", help=f"hardware preset for M: {', '.join(PRESETS)}")
    p.add_argument("--block-rows", type=int, metavar="B_r", help="query rows per tile")
    p.add_argument("--block-cols", type=int, metavar="B_c", help="key/value rows per tile")
    p.add_argument("--dtype", default="fp16",
                   help="fp16 (default), bf16 (2 bytes, counted as fp16) or fp32")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (default: heads)")
    p.add_argument("--causal", action="store_true",
                   help="query row r sees key c iff c <= r + N_k - N_q (bottom-right aligned, "
                        "as flash-attn >= 2.1)")
    p.add_argument("--window", metavar="LEFT,RIGHT", type=_window,
                   help="local window (flash-attn's window_size): row r sees keys "
                        "r + N_k - N_q - LEFT .. r + N_k - N_q + RIGHT; -1 = unbounded; with "
                        "--causal RIGHT must be -1 or 0")
    p.add_argument("--dropout", type=float, default=0.0, metavar="P",
                   help="dropout probability p (0 <= p < 1; default 0): standard stores its "
                        "keep mask Z, 1 byte per element; fa1 and fa2 regenerate it on chip "
                        "(no traffic). Forward ledger only (not with --levels or --decode)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    vl = p.add_argument_group(
        "packed variable-length batches (--cu-seqlens-q, --cu-seqlens-k)",
        "flash-attn's flash_attn_varlen_func: sequence b has cu_q[b+1] - cu_q[b] query rows "
        "and cu_k[b+1] - cu_k[b] keys; causal and --window align bottom-right per sequence. "
        "The ledger is the sum over sequences of the per-sequence ledgers (tiles per "
        "sequence, no padding traffic; iosim.varlen). Replaces --seq-len, --seq-len-kv "
        "and --batch; not with --levels, --decode or --dropout.")
    vl.add_argument("--cu-seqlens-q", type=_ints, metavar="0,N_0,...",
                    help="cumulative query sequence starts (batch + 1 integers from 0)")
    vl.add_argument("--cu-seqlens-k", type=_ints, metavar="0,N_k0,...",
                    help="cumulative key sequence starts (batch + 1 integers from 0)")
    lv = p.add_argument_group(
        "below the ledger (--levels)",
        "Model what reaches L2 and DRAM and what the pass costs in time on --gpu (default "
        "H100-SXM), for the kernel and tiling gpu.attention (or the backward) runs by "
        "default there, or at --block-rows/--block-cols. Cold L2 per kernel, as Nsight "
        "Compute measures; times are the kernels' own, warm clocks.")
    lv.add_argument("--levels", action="store_true",
                    help="add l2_read_bytes, l2_write_bytes, dram_read_bytes, dram_write_bytes "
                         "and predicted_ms (with each kernel's breakdown); with --decode "
                         "(fp16): predicted_ms and decode_time (iosim.timing.decode: the main "
                         "and combine kernels gpu.decode runs, num_splits by its rule on --gpu, "
                         "default H100-SXM), no L2 / DRAM keys")
    lv.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd",
                    help="forward (default) or backward pass (--levels)")
    lv.add_argument("--kernel", choices=("auto", "tc", "fast", "plain"), default="auto",
                    help="kernel to model (--levels; default: what gpu.attention or the "
                         "backward picks; fa1, standard and the backward are modelled for "
                         "their 'plain' kernels only so far)")
    lv.add_argument("--grid-order", choices=("query-major", "head-major", "swizzle-8"),
                    default="query-major",
                    help="CTA dispatch order to model (--levels, fa2 forward; default: the kernels' own)")
    p.add_argument("--seq-len-kv", type=int, metavar="N_k",
                   help="key/value rows N_k (default: --seq-len); with --decode the cache "
                        "length N_kv")
    dec = p.add_argument_group(
        "decoding (--decode)",
        "Model KV-cache decoding (iosim.decode): --seq-len new query rows (1..16) against a "
        "cache of --seq-len-kv rows, with the fa2 schedule (one block per head) or split-KV "
        "(--num-splits; default: the iosim.choose_num_splits rule for --gpu, or 1 without "
        "one), contiguous or paged (--page-size). --num-splits, --page-size and --kv-reads "
        "imply --decode; without any of them --seq-len-kv gives the forward schedule's "
        "ledger for N_q = --seq-len query rows against N_k = --seq-len-kv keys.")
    dec.add_argument("--decode", action="store_true",
                     help="the decode model (iosim.decode) instead of the forward schedule")
    dec.add_argument("--num-splits", type=int, metavar="S", help="split-KV splits (decoding)")
    dec.add_argument("--page-size", type=int, metavar="P", help="paged cache: rows per page")
    dec.add_argument("--kv-reads", choices=("auto", "per_query_head", "per_group"),
                     default=None,
                     help="grouped heads: each query head reads its group's K/V, or one block "
                          "per K/V head reads it once; auto (the default): what gpu.decode's "
                          "default does for --main (per_group where that kernel takes the "
                          "group's rows, iosim.launch.decode.choose_kv_reads)")
    dec.add_argument("--main", choices=("auto", "tc", "flat", "tiled"), default=None,
                     help="gpu.decode's main kernel whose split rule and time --levels gives: "
                          "auto (the default: the kernel gpu.decode's default runs), tc, flat "
                          "or tiled")
    dec.add_argument("--cache-seqlens", type=_ints, metavar="N0,N1,...",
                     help="a ragged batch: one cache length per sequence (ints >= 0, before "
                          "any append; one value: every sequence of --batch), instead of "
                          "--seq-len-kv")
    dec.add_argument("--append", action="store_true", default=None,
                     help="append --seq-len new K/V rows per sequence to the cache before "
                          "attending (flash_attn_with_kvcache(k=, v=)); needs --cache-seqlens")
    p.set_defaults(func=main)


def _window(text: str) -> tuple[int, int]:
    """--window LEFT,RIGHT -> (left, right) (range checks: iosim.problem.check_window)."""
    import argparse
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--window={text!r} is not allowed; allowed: LEFT,RIGHT, two integers >= -1 "
            f"(-1: unbounded), e.g. 256,0") from None
    return left, right


def _ints(text: str) -> list[int]:
    """--cu-seqlens-q 0,5,5,22 -> [0, 5, 5, 22] (order checks: iosim.check_cu_seqlens)."""
    import argparse
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed; allowed: comma-separated integers, e.g. 0,5,5,22") from None


def varlen_main(args, dropout) -> int:
    """The ledger of a packed variable-length batch (--cu-seqlens-q, --cu-seqlens-k)."""
    from iosim import VarlenProblem, varlen_closed_form
    if args.cu_seqlens_q is None or args.cu_seqlens_k is None:
        given = "--cu-seqlens-q" if args.cu_seqlens_k is None else "--cu-seqlens-k"
        other = "--cu-seqlens-k" if args.cu_seqlens_k is None else "--cu-seqlens-q"
        raise ConfigError(f"{given} needs {other} as well (one entry per sequence + 1)")
    clash = [f for f, bad in (("--seq-len", args.seq_len is not None),
                              ("--seq-len-kv", args.seq_len_kv is not None),
                              ("--batch", args.batch != 1), ("--levels", args.levels),
                              ("--decode", args.decode or bool(decode_flags(args))),
                              ("--dropout", bool(dropout))) if bad]
    if clash:
        raise ConfigError(f"--cu-seqlens-q/--cu-seqlens-k do not go with {', '.join(clash)}: "
                          f"the packed lengths replace --seq-len, --seq-len-kv and --batch; "
                          f"the L2/time, decode and dropout models do not cover varlen yet")
    problem = VarlenProblem.from_cu_seqlens(
        args.cu_seqlens_q, args.cu_seqlens_k, args.head_dim, heads=args.heads,
        kv_heads=args.kv_heads, dtype=args.dtype, causal=args.causal,
        window=(-1, -1) if args.window is None else args.window)
    sram = args.sram_bytes
    if args.gpu is not None:
        sram = get_hardware(args.gpu).sram_bytes
    if sram is not None and (sram <= 0):
        raise ConfigError(f"sram_bytes={sram} must be a positive integer")
    tiling = resolve_tiling(args.algorithm, problem.d, problem.dtype, block_rows=args.block_rows,
                            block_cols=args.block_cols, sram_bytes=sram)
    ledger = varlen_closed_form(args.algorithm, problem, tiling)
    if args.json:
        out = ledger.to_dict()
        out["sram_bytes"] = sram
        print(json.dumps(out, indent=2))
        return 0
    p = problem
    print(f"{args.algorithm} varlen: {p.batch} sequences, N_q_b={list(p.seqlens_q)} "
          f"N_k_b={list(p.seqlens_k)} d={p.d} {p.dtype} heads={p.heads} "
          f"kv_heads={p.kv_heads} causal={p.causal} window={p.window}")
    print(f"tiling: B_r={tiling.B_r} B_c={tiling.B_c} per sequence (T_r_b={list(p.T_r(tiling))}); "
          f"on-chip footprint {ledger.to_dict()['sram_footprint_bytes']:,} bytes")
    print(ledger.table())
    print(f"HBM traffic: {ledger.hbm_bytes:,} bytes total "
          f"({ledger.hbm_read_bytes:,} read, {ledger.hbm_write_bytes:,} written); "
          f"{_mean(ledger.hbm_bytes, p.instances)} bytes per (sequence, head) on average")
    return 0


def _mean(total: int, n: int) -> str:
    """total / n as exact text: the integer when n divides total, else rounded to the
    nearest integer (halves up) with '~' (integers only: exact at any size)."""
    q, r = divmod(total, n)
    return f"{q:,}" if r == 0 else f"~{(2 * total + n) // (2 * n):,}"


def decode_flags(args) -> list[str]:
    """The decode-only options given (each implies --decode)."""
    return [f for f, v in (("--num-splits", args.num_splits), ("--page-size", args.page_size),
                           ("--kv-reads", args.kv_reads),
                           ("--main", getattr(args, "main", None)),
                           ("--cache-seqlens", getattr(args, "cache_seqlens", None)),
                           ("--append", getattr(args, "append", None))) if v is not None]


def main(args) -> int:
    dropout = getattr(args, "dropout", 0.0)
    if dropout and (args.decode or decode_flags(args) or args.levels):
        flag = "--levels" if args.levels else "--decode"
        raise ConfigError(f"--dropout={dropout} does not go with {flag}: the dropout mask is "
                          f"modelled in the forward ledger only (drop {flag})")
    if args.cu_seqlens_q is not None or args.cu_seqlens_k is not None:
        return varlen_main(args, dropout)
    if args.seq_len is None:
        raise ConfigError("--seq-len is required (or --cu-seqlens-q and --cu-seqlens-k for a "
                          "packed variable-length batch)")
    if args.decode or decode_flags(args):
        return decode_main(args)
    window = (-1, -1) if args.window is None else args.window
    problem = Problem(N=args.seq_len, d=args.head_dim, batch=args.batch, heads=args.heads,
                      kv_heads=args.kv_heads, dtype=args.dtype, causal=args.causal,
                      N_k=args.seq_len_kv, window=window, dropout_p=dropout)
    if args.levels:        # (N_k != N and windows: the fa2 forward only, levels_main)
        return levels_main(args, problem)
    for flag, val, default in (("--pass", args.pass_, "fwd"), ("--kernel", args.kernel, "auto"),
                               ("--grid-order", args.grid_order, "query-major")):
        if val != default:
            raise ConfigError(f"{flag}={val} needs --levels")
    sram = args.sram_bytes
    if args.gpu is not None:
        sram = get_hardware(args.gpu).sram_bytes
    if sram is not None and (sram <= 0):
        raise ConfigError(f"sram_bytes={sram} must be a positive integer")
    tiling = resolve_tiling(args.algorithm, problem.d, problem.dtype, block_rows=args.block_rows,
                            block_cols=args.block_cols, sram_bytes=sram)
    ledger = closed_form(args.algorithm, problem, tiling)
    footprint = sram_footprint_bytes(args.algorithm, tiling.B_r, tiling.B_c, problem.d, problem.dtype)
    if args.json:
        out = ledger.to_dict()
        out["sram_bytes"] = sram
        print(json.dumps(out, indent=2))
        return 0
    p = problem
    variant = (f" N_k={p.N_k} window={p.window}" if (p.N_k != p.N or p.window != (-1, -1))
               else "") + (f" dropout_p={p.dropout_p}" if p.dropout_p else "")
    print(f"{args.algorithm}: N={p.N} d={p.d} {p.dtype} batch={p.batch} heads={p.heads} "
          f"kv_heads={p.kv_heads} causal={p.causal}{variant}")
    print(f"tiling: B_r={tiling.B_r} B_c={tiling.B_c} (T_r={tiling.T_r(p.N)}, T_c={tiling.T_c(p.N_k)}); "
          f"on-chip footprint {footprint:,} bytes")
    if sram is not None:
        M = sram_to_elements(sram, p.dtype)
        note = "  (exceeds M: the paper's rule ignores S and the statistics)" if footprint > sram else ""
        print(f"SRAM M = {sram:,} bytes = {M:,} {p.dtype} elements{note}")
    print(ledger.table())
    print(f"HBM traffic: {ledger.hbm_bytes:,} bytes total "
          f"({ledger.hbm_read_bytes:,} read, {ledger.hbm_write_bytes:,} written); "
          f"{ledger.hbm_bytes_per_head:,} bytes per head")
    return 0


def levels_main(args, problem) -> int:
    """`--levels`: the pass's requested, L2 and DRAM bytes and its predicted time."""
    from iosim import Tiling, levels, predict_time
    from iosim.launch import kernel_plan
    from iosim.memory.levels import model_problem
    from iosim.memory.limits import levels_size_error
    if args.sram_bytes is not None:
        raise ConfigError(f"--sram-bytes={args.sram_bytes} does not go with --levels: the "
                          f"hierarchy and time models take a GPU (--gpu PRESET)")
    if (args.block_rows is None) != (args.block_cols is None):
        raise ConfigError("block_rows and block_cols must be given together "
                          f"(got block_rows={args.block_rows}, block_cols={args.block_cols})")
    gpu = get_hardware(args.gpu or "H100-SXM")
    tiling = None if args.block_rows is None else Tiling(args.block_rows, args.block_cols)
    # what the models cover: the problem itself, a bf16 tensor-core pass as its fp16
    # build, or one line saying what is not modelled (never a number)
    try:
        modelled, _, kern = model_problem(args.algorithm, problem, gpu, pass_=args.pass_,
                                          kernel=args.kernel, tiling=tiling)
    except ValueError as e:
        raise ConfigError(f"--levels: {e} (drop --levels for the ledger)") from None
    # the model checks a given tiling against the shared memory of the kernel that runs
    # it and the problem's size at its entry; the size is checked here first only to name
    # the command's options in the message
    plan = kernel_plan(args.algorithm, modelled, gpu, pass_=args.pass_, kernel=kern,
                       tiling=tiling)
    too_big = levels_size_error(args.algorithm, modelled, plan.tiling)
    if too_big:
        raise ConfigError(too_big)
    lv = levels(args.algorithm, problem, gpu, pass_=args.pass_, kernel=args.kernel,
                tiling=tiling, grid_order=args.grid_order)
    try:
        t = predict_time(args.algorithm, problem, gpu, levels_result=lv)
    except ValueError as exc:   # a kernel the time model has no family (constants) for
        t = None
        lv["warnings"].append(f"no predicted time: the time model (iosim.timing) cannot "
                              f"predict the {args.algorithm} {args.pass_} '{lv['kernel']}' "
                              f"kernels: {exc}")
    out = dict(lv, predicted_ms=t["predicted_ms"] if t else None, time=t)
    if args.json:
        print(json.dumps(out, indent=2, default=float))
        return 0
    p = problem
    variant = (f" N_k={p.N_k}" if p.N_k != p.N else "") + \
        (f" window={p.window}" if p.window != (-1, -1) else "")
    print(f"{args.algorithm} {args.pass_} on {gpu.name}: N={p.N} d={p.d} {p.dtype} batch={p.batch} "
          f"heads={p.heads} kv_heads={p.kv_heads} causal={p.causal}{variant}")
    print(f"kernel {lv['kernel']}, tiling B_r={lv['block_rows']} B_c={lv['block_cols']}; "
          f"L2 model: C = {lv['l2_model']['capacity_fraction']} x L2 = "
          f"{lv['l2_model']['capacity_bytes'] / 1e6:.1f} MB, associativity "
          f"{lv['l2_model']['associativity']}, shared tiles x{lv['l2_model']['shared_footprint']}, "
          f"private x{lv['l2_model']['private_footprint']}, dirty data <= "
          f"{lv['l2_model']['dirty_fraction']} x L2, end-of-kernel drain <= "
          f"{lv['l2_model'].get('drain_fraction', 0.0)} x L2, wave lag "
          f"{lv['l2_model'].get('sweep_lag', 0.0)} x sweep (causal "
          f"{lv['l2_model'].get('causal_lag', 0.0)}), fa1's read-modify-write round trips at "
          f"x{lv['l2_model'].get('private_rmw_capacity', 1.0)} of C")
    gb = lambda x: f"{x / 1e9:12.4f}"
    print(f"{'level (GB, whole problem)':<28}{'read':>12}{'write':>12}")
    print(f"{'requested (the ledger)':<28}{gb(lv['requested_read_bytes'])}{gb(lv['requested_write_bytes'])}")
    print(f"{'L2 (from the SMs)':<28}{gb(lv['l2_read_bytes'])}{gb(lv['l2_write_bytes'])}"
          + (f"   + atomics {lv['l2_atomic_bytes'] / 1e9:.4f}" if lv["l2_atomic_bytes"] else ""))
    if lv.get("l2_local_read_bytes") or lv.get("l2_local_write_bytes"):
        print(f"{'  of which local memory':<28}{gb(lv['l2_local_read_bytes'])}"
              f"{gb(lv['l2_local_write_bytes'])}   (spilled registers, not in the ledger)")
    print(f"{'DRAM (cold L2)':<28}{gb(lv['dram_read_bytes'])}{gb(lv['dram_write_bytes'])}")
    rr, wr = lv.get("dram_read_bytes_range"), lv.get("dram_write_bytes_range")
    if rr and wr and (rr[0] != rr[1] or wr[0] != wr[1]):
        g = lambda x: f"{x[0] / 1e9:.4f}-{x[1] / 1e9:.4f}"
        if lv.get("dram_range_basis") == "spill_bound":
            print(f"{'DRAM, spilling bound':<28}{g(rr):>16}{g(wr):>16}   (see the warning)")
        else:
            print(f"{'DRAM, edge range':<28}{g(rr):>16}{g(wr):>16}   (effective L2 x"
                  f"{lv['l2_model']['chip_capacity_range'][0]:g} to x"
                  f"{lv['l2_model']['chip_capacity_range'][1]:g})")
    if t:
        print(f"predicted time: {t['predicted_ms']:.4f} ms")
    for what in ("time", "dram"):      # how far the data set vouches for each (one line)
        if what in lv.get("trust", {}) and (t or what == "dram"):
            print(f"trust: {lv['trust'][what]['statement']}")
    for k in (t["launches"] if t else []):
        share = ", ".join(f"{n} {v:.0%}" for n, v in k["share"].items() if v >= 0.01)
        print(f"  {k['name'].split('[')[0]:<16}{k['predicted_ms']:10.4f} ms  binds: {k['binds']} "
              f"({share}); imbalance {k['imbalance']:.2f}")
    for w in lv["warnings"]:
        print(f"warning: {w}")
    return 0


def decode_main(args) -> int:
    """`--decode` (or a decode-only option): the decode ledger (iosim.decode closed form)."""
    from iosim import DecodeProblem, decode_closed_form
    why = "--decode" if args.decode else decode_flags(args)[0]
    lens = args.cache_seqlens
    if lens is None and args.append:
        raise ConfigError("--append needs --cache-seqlens (the cache lengths before the "
                          "append, e.g. 100,0,4096,1)")
    if lens is not None and args.seq_len_kv is not None:
        raise ConfigError(f"--seq-len-kv={args.seq_len_kv} does not go with --cache-seqlens: "
                          f"the per-sequence lengths replace it (drop one)")
    if lens is not None and len(lens) == 1:
        lens = lens * args.batch
    elif lens is not None and args.batch not in (1, len(lens)):
        raise ConfigError(f"--batch={args.batch} does not go with --cache-seqlens of "
                          f"{len(lens)} sequences; allowed: --batch 1 (the default) or "
                          f"{len(lens)}")
    if lens is None and args.seq_len_kv is None:
        raise ConfigError(f"{why} (decoding) needs --seq-len-kv (the cache length) or "
                          f"--cache-seqlens (one a sequence)")
    if args.window is not None:
        raise ConfigError(f"--window={','.join(map(str, args.window))} does not go with {why}: "
                          f"the decode model has no local window (drop {why} for the forward "
                          f"schedule's ledger with a window)")
    if args.algorithm != "fa2":
        raise ConfigError(f"--algorithm={args.algorithm} with --seq-len-kv: decoding is modelled "
                          f"for fa2 (its schedules fa2_decode and split-KV)")
    for flag, val in (("--causal", args.causal), ("--block-rows", args.block_rows),
                      ("--block-cols", args.block_cols), ("--sram-bytes", args.sram_bytes)):
        if val is not None and val is not False:
            raise ConfigError(f"{flag} does not go with {why}: the decode model counts "
                              f"requested traffic, which no tiling changes (causal alignment "
                              f"of the new rows is built in; drop {why} for the forward "
                              f"schedule's ledger)")
    if args.levels:
        for flag, val, default in (("--pass", args.pass_, "fwd"), ("--kernel", args.kernel, "auto"),
                                   ("--grid-order", args.grid_order, "query-major")):
            if val != default:
                raise ConfigError(f"{flag}={val} does not go with {why} --levels: the decode "
                                  f"time model covers gpu.decode's own kernels (drop {flag})")
        if args.dtype != "fp16":
            raise ConfigError(f"--dtype={args.dtype} does not go with {why} --levels: the decode "
                              f"time model is fitted on fp16 rows only (drop --levels for the "
                              f"ledger)")
    prob = DecodeProblem(N_kv=args.seq_len_kv, d=args.head_dim,
                         batch=args.batch if lens is None else len(lens),
                         heads=args.heads, kv_heads=args.kv_heads, N_q=args.seq_len,
                         dtype=args.dtype, page_size=args.page_size,
                         cache_seqlens=None if lens is None else tuple(lens),
                         append=bool(args.append))
    choice = None
    S = args.num_splits
    gpu = args.gpu or ("H100-SXM" if args.levels else None)
    from iosim.launch.decode import auto_num_splits, choose_kv_reads, main_kernel
    main = args.main or "auto"
    try:
        args.kv_reads = choose_kv_reads(prob, args.kv_reads or "auto", main)
        kernel = main_kernel(prob, args.kv_reads, main)
    except ValueError as exc:
        raise ConfigError(f"--main={main}: {exc}") from None
    if S is None and gpu is not None:
        choice = auto_num_splits(prob, get_hardware(gpu).sm_count, args.kv_reads, kernel)
        S = choice.num_splits
    S = 1 if S is None else S
    schedule = "fa2_decode" if S == 1 else "split_kv"
    led = decode_closed_form(schedule, prob, num_splits=S, kv_reads=args.kv_reads)
    pred = declined = None
    if args.levels:
        from iosim import predict_decode
        try:
            pred = predict_decode(prob, gpu, S, kv_reads=args.kv_reads, main=kernel)
        except ValueError as exc:     # a problem the decode kernels (so the model) cannot run
            declined = (f"no predicted time: the decode time model (iosim.timing.decode) "
                        f"does not model this problem: {exc}")
    if args.json:
        out = led.to_dict()
        out["schedule"] = schedule
        out["main_kernel"] = kernel
        if choice is not None:
            out["num_splits_choice"] = choice.to_dict()
        if pred is not None:
            out["predicted_ms"] = pred["predicted_ms"]
            out["decode_time"] = pred
        if declined:
            out["predicted_ms"], out["warnings"] = None, [declined]
        print(json.dumps(out, indent=2))
        return 0
    if prob.is_ragged:
        print(f"ragged batch: cache_seqlens={list(prob.cache_seqlens)}"
              + (f", append N_q={prob.N_q} new K/V rows each (seen lengths "
                 f"{list(prob.seqlens)})" if prob.append else ""))
    print(f"decode {schedule}: N_q={prob.N_q} N_kv={prob.N_kv} d={prob.d} {prob.dtype} "
          f"batch={prob.batch} heads={prob.heads} kv_heads={prob.kv_heads} "
          f"num_splits={S} kv_reads={args.kv_reads} paged={prob.page_size} main={kernel}")
    if choice is not None:
        print(f"num_splits from the rule on {gpu}: {choice.num_splits} (binding: {choice.binding}; "
              f"fill {choice.s_fill}, block cap {choice.s_cap_blocks}, traffic cap {choice.s_cap_traffic})")
    print(led.table())
    print(f"HBM traffic: {led.hbm_bytes:,} bytes total ({led.hbm_read_bytes:,} read, "
          f"{led.hbm_write_bytes:,} written)")
    if pred is not None:
        print(f"predicted time on {gpu} (iosim.timing.decode): {pred['predicted_ms']:.4f} ms "
              f"(main {pred['main_ms']:.4f}, combine {pred['combine_ms']:.4f}; binding "
              f"{pred['binding']})")
        for t, v in pred["terms_us"].items():
            print(f"  {t:15s} {v:10.2f} us  {100 * pred['shares'][t]:5.1f} %")
        for w in pred["warnings"]:
            print(f"warning: {w}")
    if declined:
        print(declined)
    return 0
