"""``frontier inspect PATH``: what a local EAGLE head is, and the bandwidth floor of drafting with it.

Reads config.json and the tensor headers only (plus d2t/t2d); the weights are not loaded, so
inspecting a multi-GB head is instant and needs no target model. Exit status: 0 when the head
would load (``load_draft_head(..., strict=True)``), 1 when it has problems (printed), 2 when it
cannot be read at all or a flag is wrong.

The bytes and floor count linears stored in fp8 (float8_e4m3fn + ``<key>_scale``) at 1 byte per
weight plus 4 per scale; an ``fp8 floor`` line gives the figure with every linear in fp8, and
``--quantize fp8`` makes that the head's bytes and floor (as ``load_draft_head(quantize="fp8")``).
"""

from __future__ import annotations

import argparse
import json

from .argtypes import dtype_name, positive_float, positive_int


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


def _dtype_or_stored(text: str) -> str:
    """--dtype: what every subcommand's --dtype takes, or ``stored`` (the bytes as on disk)."""
    if text.strip().lower() == "stored":
        return "stored"
    try:
        return dtype_name(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be bf16, fp16 or fp32 (or bfloat16, float16, float32) or 'stored', got {text!r}"
        ) from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="describe a local EAGLE-2/EAGLE-3 head: architecture, dims, vocab mapping, bytes, bandwidth floor",
    )
    p.add_argument("path", help="head directory (config.json + model.safetensors / pytorch_model.bin, sharded or not)")
    p.add_argument("--target", default=None, help="target model checkpoint directory (checks the embedding/lm_head it would supply)")
    p.add_argument("--bandwidth-tbs", type=positive_float, default=4.27, help="GPU memory bandwidth in TB/s for the floor (default 4.27)")
    p.add_argument("--dtype", type=_dtype_or_stored, default="bf16",
                   help="dtype the bytes are counted in: bf16, fp16 or fp32 (also bfloat16, float16, float32), or "
                   "'stored' = as on disk (default bf16)")
    p.add_argument("--depth", type=positive_int, default=7, metavar="D", help="tree depth D for the floor (default 7)")
    p.add_argument("--architecture", choices=("eagle3", "eagle2"), default=None, help="override detection from the keys")
    p.add_argument("--quantize", choices=("fp8",), default=None,
                   help="count the bytes and floor with every linear weight in fp8 e4m3 + fp32 per-channel scales, "
                   "as load_draft_head(quantize='fp8') loads it (default: as stored)")
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

    from ..loading import describe_draft_head, format_description

    dtype = None if args.dtype == "stored" else getattr(torch, args.dtype)
    d = describe_draft_head(
        args.path,
        target=args.target,
        architecture=args.architecture,
        dtype=dtype,
        bandwidth_tbs=args.bandwidth_tbs,
        depth=args.depth,
        config_overrides=dict(args.override) or None,
        quantize=args.quantize,
    )
    print(json.dumps(d, indent=2) if args.json else format_description(d))
    return 1 if d["problems"] else 0
