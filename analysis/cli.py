"""`flashsim`: a thin command line over iosim, gpu and analysis.

Each subcommand lives in analysis/commands/<name>.py and defines `register(subparsers)`,
which adds its parser and sets `func(args) -> exit status`. Bad input exits with status 2
and a one-line message naming the parameter, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys


COMMANDS = ["traffic", "reproduce", "bench", "check", "report", "sweep", "figure", "results"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, status 2
        self.exit(2, f"flashsim: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flashsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"analysis.commands.{name}").register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ValueError as e:  # ConfigError and the kernels' input errors: exit 2, one line
        print(f"flashsim {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
