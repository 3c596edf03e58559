"""The ``frontier`` command line.

Subcommands live in their own modules; each module exposes ``add_parser(subparsers)`` which
registers its parser and sets ``func`` (called with the parsed args, returns an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

#: (module, description) of every subcommand, in help order.
SUBCOMMANDS: list[str] = [
    "frontier.commands.backends",
    "frontier.commands.demo",
    "frontier.commands.bench",
    "frontier.commands.generate",
    "frontier.commands.inspect",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="frontier",
        description="EAGLE-2/EAGLE-3 draft trees, fast and exact, behind one call.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # subcommand not shipped in this build
            raise
        module.add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from .errors import FrontierError

    try:
        return int(args.func(args) or 0)
    except FrontierError as exc:
        print(f"frontier {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
