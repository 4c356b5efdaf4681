"""`flashsim model`: a model's attention traffic per layer, from its config (no GPU)."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from iosim import PRESETS
from iosim.workload import KNOWN_CONFIGS

#: most calls one run prices (layers x (1 + decode steps)): about 20 s on one core
MAX_CALLS = 500_000

EXAMPLES = [
    "flashsim model llama3.1-8b --prefill 8192 --decode 100",
    "flashsim model gemma2-9b --prefill 8192 --decode 10 --gpu H200 --json out.json",
    "flashsim model mistral-7b --prefill 4096 --train          # a training step",
    "flashsim model path/to/config.json --prefill 2048 --decode 20 --figure layers.png",
]


def register(sub):
    p = sub.add_parser(
        "model", help="a model's attention traffic per layer: prefill, decode steps",
        description="From a model's config (its shape only: layers, heads, K/V heads, head "
                    "dim, sliding windows; no weights, no GPU), the attention calls of a "
                    "prefill of --prefill tokens and --decode decoding steps (or a --train "
                    "step), each at the kernel, tiling and num_splits flashsim's gpu runs on "
                    "--gpu; per layer the exact ledger bytes, and the predicted DRAM bytes "
                    "and time where the L2 / DRAM and time models cover the call, else a "
                    "note saying why. Bytes are totals over batch x heads. "
                    "(iosim.workload.calls_from_config, traffic_table)",
        epilog="examples:\n" + "\n".join("  " + e for e in EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="CONFIG",
                   help=f"a known shape ({', '.join(KNOWN_CONFIGS)}) or the path of a "
                        f"transformers config.json")
    p.add_argument("--prefill", type=int, default=8192, metavar="N",
                   help="prompt tokens per sequence (default 8192)")
    p.add_argument("--decode", type=int, default=None, metavar="K",
                   help="decoding steps after the prefill, one token each (default 100; "
                        "0 with --train)")
    p.add_argument("--train", action="store_true",
                   help="a training step on --prefill tokens instead (forward and backward)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--dtype", default="fp16",
                   help="fp16 (default), bf16 or fp32 (the L2 / DRAM and time models take "
                        "fp16 and fp32)")
    p.add_argument("--gpu", "--preset", dest="gpu", default="H100-SXM", metavar="PRESET",
                   help=f"hardware preset: {', '.join(PRESETS)} (default H100-SXM)")
    p.add_argument("--kv-reads", choices=("auto", "per_query_head", "per_group"),
                   default="auto",
                   help="decode: auto (default, as gpu.decode: one block per K/V head on "
                        "grouped heads where its flat kernel runs), each query head reads "
                        "its group's K/V, or one block per K/V head")
    p.add_argument("--every-layer", action="store_true",
                   help="one line per layer (default: equal consecutive layers on one line)")
    p.add_argument("--json", metavar="FILE",
                   help="also write the summary as JSON to FILE ('-': print it instead of "
                        "the table)")
    p.add_argument("--figure", metavar="FILE.png",
                   help="also draw the per-layer figure: FILE.png and FILE.svg")
    p.set_defaults(func=main)


def main(args) -> int:
    from iosim import ConfigError
    from iosim.workload import (calls_from_config, load_config, model_shape,
                                traffic_table)
    from analysis.model_traffic import format_summary, summarise
    from analysis.paths import check_out_file
    if args.figure is not None:
        check_out_file(args.figure, "--figure")
        if not args.figure.endswith(".png"):
            raise ConfigError(f"--figure={args.figure!r} is not allowed; allowed: a path "
                              f"ending in .png (the SVG is written beside it)")
    if args.json not in (None, "-"):
        check_out_file(args.json, "--json")
    decode = args.decode if args.decode is not None else (0 if args.train else 100)
    if args.train and decode:
        raise ConfigError(f"--decode={decode} does not go with --train: a training step "
                          f"does not decode (drop --decode)")
    name, config = load_config(args.config)
    shape = model_shape(config, name)
    n = shape.layers * (2 if args.train else 1 + max(decode, 0))
    if n > MAX_CALLS:
        raise ConfigError(f"--decode={decode} gives {n:,} calls ({shape.layers} layers x "
                          f"(1 + {decode})); allowed: at most {MAX_CALLS:,} calls, "
                          f"--decode <= {MAX_CALLS // shape.layers - 1:,} for this model "
                          f"(each call is priced; iosim.workload has no such limit)")
    calls = calls_from_config(shape, batch=args.batch, prefill=args.prefill,
                              decode_steps=decode, dtype=args.dtype, preset=args.gpu,
                              kv_reads=args.kv_reads, train=args.train)
    table = traffic_table(calls, args.gpu)
    summary = summarise(table)
    p0 = calls[0].problem
    positions = args.prefill + decode
    summary.update(model=name, shape=dict(asdict(shape), windows=list(shape.windows)),
                   batch=args.batch, prefill=args.prefill, decode_steps=decode,
                   train=args.train, dtype=p0.dtype, kv_reads=args.kv_reads)
    warnings = []
    if shape.max_positions is not None and positions > shape.max_positions:
        warnings.append(f"{positions:,} positions (prefill + decode) exceed this config's "
                        f"max_position_embeddings={shape.max_positions:,}: the traffic is "
                        f"what the shapes cost, whatever the model makes of them")
    summary["warnings"] = warnings
    if args.json == "-":
        print(json.dumps(summary, indent=2))
    else:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
        print(format_summary(summary, _heading(shape, summary, args),
                             every_layer=args.every_layer))
        for w in warnings:
            print(f"warning: {w}")
    if args.figure:
        import os
        from analysis.figures import model_layers
        out_dir, stem = os.path.split(args.figure[:-len(".png")])
        for path in model_layers.save_summary(summary, out_dir or ".", stem):
            print(f"figure: {path}")
    return 0


def _heading(shape, summary, args) -> str:
    sliding = sorted({w for w in shape.windows if w is not None})
    attn = ("full attention" if not sliding else
            f"{shape.sliding_layers} of {shape.layers} layers slide (window "
            f"{', '.join(map(str, sliding))} keys)")
    run = (f"a training step on {args.prefill:,} tokens" if args.train else
           f"prefill {args.prefill:,} tokens, then {summary['decode_steps']} decode steps")
    return (f"{summary['model']}: {shape.layers} layers, {shape.heads} query heads, "
            f"{shape.kv_heads} K/V heads, d={shape.head_dim}, {attn}\n"
            f"{run}; batch {args.batch}, {summary['dtype']}, on {summary['preset']}")
