"""The ``frontier`` command line.

Subcommands live in their own modules; each module exposes ``add_parser(subparsers)`` which
registers its parser and sets ``func`` (called with the parsed args, returns an exit code).

Exit status: 0 on success; 2 when the request cannot be carried out as given (a bad flag or
value, a path that is no checkpoint, a backend that cannot run here; the message names it); 1
when the work itself failed (a kernel error, non-finite values, anything unexpected).
Errors are one line on stderr, never a traceback; ``FRONTIER_DEBUG=1`` adds the traceback of an
unexpected one.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import NoReturn, Optional, Sequence

#: (module, description) of every subcommand, in help order.
SUBCOMMANDS: list[str] = [
    "frontier.commands.backends",
    "frontier.commands.demo",
    "frontier.commands.bench",
    "frontier.commands.generate",
    "frontier.commands.inspect",
]

USAGE, FAILURE = 2, 1


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: ``frontier SUB: error: ...``. Flags are
    taken only as spelled (no prefixes: ``--tree`` is not ``--tree-top-k``), so the one vocabulary
    of :mod:`frontier.commands.argtypes` is the only one that parses."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="frontier",
        description="EAGLE-2/EAGLE-3 draft trees, fast and exact, behind one call.",
    )
    parser.add_argument("--version", action="version", version=f"frontier {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # subcommand not shipped in this build
            raise
        module.add_parser(sub)
    return parser


def _exit_status(exc: BaseException) -> int:
    from .errors import InvariantError, KernelError, NonFiniteError

    return FAILURE if isinstance(exc, (KernelError, NonFiniteError, InvariantError)) else USAGE


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else USAGE
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from .errors import FrontierError

    prog = f"frontier {args.command}"
    args.cli_argv = list(argv) if argv is not None else sys.argv[1:]  # generate --tp N relaunches it
    try:
        return int(args.func(args) or 0)
    except FrontierError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return _exit_status(exc)
    except BrokenPipeError:
        # the reader went away (``frontier ... --json | head``): not an error of ours
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an unexpected error: one line, the traceback on request
        if os.environ.get("FRONTIER_DEBUG"):
            traceback.print_exc()
        print(f"{prog}: error: {type(exc).__name__}: {exc} (FRONTIER_DEBUG=1 shows the traceback)", file=sys.stderr)
        return FAILURE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
