"""`flashsim`: a thin command line over iosim, gpu and analysis.

Each subcommand lives in analysis/commands/<name>.py and defines `register(subparsers)`,
which adds its parser and sets `func(args) -> exit status`. Bad input and file-system
errors (ValueError, OSError) exit with status 2 and one line on stderr naming the
parameter or path, never a traceback; so does running out of memory (MemoryError), as a
last resort behind the commands' own size checks.
"""
from __future__ import annotations

import argparse
import importlib
import sys


COMMANDS = ["traffic", "reproduce", "bench", "check", "report", "sweep", "figure", "results",
            "validate", "explore", "model"]

#: Examples shown under a command's --help where its module gives no epilog of its own.
EXAMPLES = {
    "traffic": ["flashsim traffic --algorithm fa1 --seq-len 1024 --head-dim 64 --gpu A100-40GB",
                "flashsim traffic --algorithm fa2 --seq-len 4096 --head-dim 64 "
                "--block-rows 128 --block-cols 64 --json",
                "flashsim traffic --algorithm fa2 --seq-len 65536 --head-dim 64 --heads 16 "
                "--gpu H100-SXM --levels        # L2, DRAM, predicted time",
                "flashsim traffic --algorithm fa2 --seq-len 1 --seq-len-kv 32768 --head-dim 128 "
                "--heads 32 --gpu H100-SXM --decode     # decoding",
                "flashsim traffic --algorithm fa2 --seq-len 4096 --seq-len-kv 8192 --head-dim 64 "
                "--causal --window 1024,0 --gpu H100-SXM   # N_q != N_k, local window"],
    "reproduce": ["flashsim reproduce gpt2-table",
                  "flashsim reproduce gpt2-table --sram-bytes 98304 --json"],
    "bench": ["flashsim bench                      # every point, on a CUDA GPU with torch",
              "flashsim bench --seq-lens 1024,4096 --head-dims 64 --dtypes fp16 "
              "--impls fa2,torch_flash --out out/bench.json",
              "flashsim bench --record              # and append the rows to the results data set"],
    "report": ["flashsim report                     # figures/ and figures/REPORT.md",
               "flashsim report --out out/report --no-kernels"],
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, status 2
        self.exit(2, f"flashsim: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flashsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"analysis.commands.{name}").register(sub)
        cmd = sub.choices[name]
        cmd.set_defaults(command_name=name)   # for error lines (an option may be --command)
        if not cmd.epilog and name in EXAMPLES:
            cmd.epilog = "examples:\n" + "\n".join("  " + e for e in EXAMPLES[name])
            cmd.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("examples:\n  flashsim report\n  flashsim check --quick\n"
                     "  flashsim traffic --algorithm fa2 --seq-len 4096 --head-dim 64 "
                     "--sram-bytes 100000\n\nflashsim COMMAND --help: each command's options "
                     "and examples")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _join_negative_values(argv: list[str]) -> list[str]:
    """`--window -1,0` -> `--window=-1,0`: argparse takes a value starting with '-' (and
    not a plain number) for an option and would report a missing argument."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--window" and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"--window={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_negative_values(sys.argv[1:] if argv is None else list(argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ValueError as e:  # ConfigError, bad paths, the kernels' input errors: exit 2
        msg = str(e)
    except OSError as e:     # a file-system error met while working: exit 2, naming the path
        where = f" {e.filename!r}" if e.filename else ""
        msg = f"{e.strerror or type(e).__name__}:{where}" if e.strerror else f"{type(e).__name__}: {e}"
    except MemoryError as e:  # last resort (commands check sizes first): one line, exit 2
        msg = f"out of memory ({e or 'MemoryError'}); the problem is too large for this machine"
    print(f"flashsim {args.command_name}: error: {' '.join(msg.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
