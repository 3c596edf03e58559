"""The flags and argument types shared by the subcommands: one spelling and one meaning per flag
in every subcommand that takes it (tests/test_cli.py checks the parsers against each other).

    --backend NAME            the draft backend (bench: a comma-separated list to time)
    --total-tokens T          the tree's size incl. the root      (demo, generate)
    --depth D                 the tree's depth (bench: a comma-separated list to time)
    --tree-top-k K            the tree's branching                 (demo, generate)
    --temperature/--top-k/--top-p   sampling                       (generate)
    --dtype bf16|fp16|fp32    also bfloat16, float16, float32      (generate, bench, inspect)
    --device cpu|cuda|cuda:N                                       (generate)
    --json                    print JSON on stdout instead of text (every subcommand)

A bad value is a usage error naming the flag (argparse prints it and exits with status 2), never
a traceback or a silent default.
"""

from __future__ import annotations

import argparse
import math

#: Every dtype spelling a --dtype flag takes, and the torch dtype name it means.
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


def positive_int(text: str) -> int:
    """An int >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """An int >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0."""
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite float >= 0."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def probability(text: str) -> float:
    """A float in (0, 1]."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}")
    return value


def device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` naming a device this machine has."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r} needs a CUDA GPU, and this machine has none (use cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return text


def dtype_name(text: str) -> str:
    """A floating dtype, as bf16/bfloat16, fp16/float16 or fp32/float32: its torch name."""
    name = DTYPES.get(text.strip().lower())
    if name is None:
        raise argparse.ArgumentTypeError(f"must be bf16, fp16 or fp32 (or bfloat16, float16, float32), got {text!r}")
    return name


def add_tree_shape(p, *, total_tokens=None, depth=None, tree_top_k=None) -> None:
    """--total-tokens, --depth and --tree-top-k (the draft tree's T, D and K). Each default is an
    int, or a string that only describes it (the flag's value stays None and the subcommand picks
    one). ``--total-token`` stays as a hidden spelling of ``--total-tokens``."""

    def flag(*names, default, metavar, text, dest=None):
        kw = {"dest": dest} if dest else {}
        shown = f" (default {default})" if default is not None else ""
        p.add_argument(*names, type=positive_int, default=None if isinstance(default, str) else default,
                       metavar=metavar, help=text + shown, **kw)

    flag("--total-tokens", default=total_tokens, metavar="T", text="tree size T incl. the root")
    p.add_argument("--total-token", dest="total_tokens", type=positive_int, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)
    flag("--depth", default=depth, metavar="D", text="tree depth D")
    flag("--tree-top-k", default=tree_top_k, metavar="K", text="tree branching K: children kept per expanded node")


class Refused(argparse.Action):
    """A hidden flag that is a usage error saying what to use instead (a spelling that means
    something else in this command line than it once did here)."""

    def __init__(self, option_strings, dest, instead: str = "", **kwargs):
        kwargs.setdefault("nargs", "?")
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"argument {option_string}: {self.instead}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value
