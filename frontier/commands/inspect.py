"""``frontier inspect PATH``: what a local EAGLE head is, and the bandwidth floor of drafting with it.

Reads config.json and the tensor headers only (plus d2t/t2d); the weights are not loaded, so
inspecting a multi-GB head is instant and needs no target model. Exit status: 0 when the head
would load (``load_draft_head(..., strict=True)``), 1 when it has problems (printed), 2 when it
cannot be read at all or a flag is wrong.
"""

from __future__ import annotations

import argparse
import json

from .argtypes import nonnegative_int, positive_float


def _override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=JSON (e.g. rope_scaling=null), got {text!r}")
    try:
        return key, json.loads(value)
    except RecursionError:
        raise argparse.ArgumentTypeError(f"the JSON of {key!r} is nested too deeply") from None
    except ValueError:
        return key, value  # a bare string


#: The short dtype names that generate and bench take, accepted here too.
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="describe a local EAGLE-2/EAGLE-3 head: architecture, dims, vocab mapping, bytes, bandwidth floor",
    )
    p.add_argument("path", help="head directory (config.json + model.safetensors / pytorch_model.bin, sharded or not)")
    p.add_argument("--target", default=None, help="target model checkpoint directory (checks the embedding/lm_head it would supply)")
    p.add_argument("--bandwidth-tbs", type=positive_float, default=4.27, help="GPU memory bandwidth in TB/s for the floor (default 4.27)")
    p.add_argument("--dtype", default="bfloat16", help="dtype the bytes are counted in (default bfloat16; 'stored' = as on disk)")
    p.add_argument("--depth", type=nonnegative_int, default=7, help="tree depth D for the floor (default 7)")
    p.add_argument("--architecture", choices=("eagle3", "eagle2"), default=None, help="override detection from the keys")
    p.add_argument(
        "--override",
        type=_override,
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="replace a config.json field before reading it (repeatable), e.g. rope_scaling=null",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..errors import InputError
    from ..loading import describe_draft_head, format_description

    dtype = None
    if args.dtype != "stored":
        dtype = getattr(torch, DTYPE_ALIASES.get(args.dtype, args.dtype), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InputError(
                f"--dtype must name a floating dtype (bf16, fp16, fp32, bfloat16, float16, float32) or 'stored', "
                f"got {args.dtype!r}"
            )
    d = describe_draft_head(
        args.path,
        target=args.target,
        architecture=args.architecture,
        dtype=dtype,
        bandwidth_tbs=args.bandwidth_tbs,
        depth=args.depth,
        config_overrides=dict(args.override) or None,
    )
    print(json.dumps(d, indent=2) if args.json else format_description(d))
    return 1 if d["problems"] else 0
