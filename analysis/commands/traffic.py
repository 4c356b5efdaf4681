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
    p.add_argument("--seq-len", type=int, required=True, metavar="N", help="sequence length N")
    p.add_argument("--head-dim", type=int, required=True, metavar="d", help="head dimension d")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sram-bytes", type=int, metavar="M", help="SRAM capacity M per thread block, in bytes")
    g.add_argument("--gpu", metavar="PRESET", help=f"hardware preset for M: {', '.join(PRESETS)}")
    p.add_argument("--block-rows", type=int, metavar="B_r", help="query rows per tile")
    p.add_argument("--block-cols", type=int, metavar="B_c", help="key/value rows per tile")
    p.add_argument("--dtype", default="fp16", help="fp16 (default) or fp32")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (default: heads)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=main)


def main(args) -> int:
    problem = Problem(N=args.seq_len, d=args.head_dim, batch=args.batch, heads=args.heads,
                      kv_heads=args.kv_heads, dtype=args.dtype, causal=args.causal)
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
    print(f"{args.algorithm}: N={p.N} d={p.d} {p.dtype} batch={p.batch} heads={p.heads} "
          f"kv_heads={p.kv_heads} causal={p.causal}")
    print(f"tiling: B_r={tiling.B_r} B_c={tiling.B_c} (T_r={tiling.T_r(p.N)}, T_c={tiling.T_c(p.N)}); "
          f"on-chip footprint {footprint:,} bytes")
    if sram is not None:
        M = sram_to_elements(sram, p.dtype)
        note = "  (exceeds M: the paper's rule ignores S and the statistics)" if footprint > sram else ""
        print(f"SRAM M = {sram:,} bytes = {M:,} {p.dtype} elements{note}")
    print(ledger.table())
    print(f"HBM traffic: {ledger.hbm_bytes:,} bytes total "
          f"({ledger.hbm_read_bytes:,} read, {ledger.hbm_write_bytes:,} written); "
          f"{ledger.hbm_bytes_per_head:,.0f} bytes per head")
    return 0
