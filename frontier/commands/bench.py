"""``frontier bench``: time the draft call against the GPU's memory-bandwidth floor."""

from __future__ import annotations

import argparse

from .argtypes import dtype_name, positive_int


def add_parser(sub) -> argparse.ArgumentParser:
    from ..bench import PRESETS

    p = sub.add_parser(
        "bench",
        help="time backends against the memory-bandwidth floor (needs a CUDA GPU)",
        description="Measure the GPU's copy bandwidth, compute the weight-streaming floor of one draft call, and time "
        "the backends on random heads of the preset shapes (warm, CUDA events, median).",
    )
    p.add_argument("--preset", action="append", choices=sorted(PRESETS), help="head shape (repeatable; default: all)")
    p.add_argument("--depth", type=str, default="5,7", metavar="D[,D...]",
                   help="tree depth D; comma-separated depths are each timed (default 5,7)")
    p.add_argument("--backend", type=str, default="triton,torch_ref", metavar="NAME[,NAME...]",
                   help="backend to time; comma-separated backends are each timed (default triton,torch_ref)")
    p.add_argument("--backends", dest="backend", type=str, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--dtype", type=dtype_name, default="bf16",
                   help="bf16, fp16 or fp32 (also bfloat16, float16, float32; default bf16)")
    p.add_argument("--weights", type=str, default="plain", metavar="FORMAT[,FORMAT...]",
                   help="plain (the head in --dtype) and/or fp8 (the same head quantized to e4m3 with a "
                   "power-of-two scale per output channel); comma-separated formats are each timed, a row "
                   "each (default plain)")
    p.add_argument("--batch", type=str, default="1", metavar="B[,B...]",
                   help="comma-separated batch sizes, e.g. 1,4,16,64 (default 1); batch B > 1 drafts B sequences "
                   "per call and also reports ms per sequence and the ratio to the batch-1 call")
    p.add_argument("--ragged", action="store_true",
                   help="batch > 1: spread the sequences' contexts over --context +/- 25%% (times the ragged path)")
    p.add_argument("--reps", type=positive_int, default=50,
                   help="timed calls per backend (torch_ref runs a fifth at batch 1, and reps/(5B), at least 3, "
                   "at batch B)")
    p.add_argument("--context", type=positive_int, default=512, help="context length L (default 512)")
    p.add_argument("--new-rows", type=positive_int, default=4, help="new context rows per call (default 4)")
    p.add_argument("--persistent", action="store_true",
                   help="also time triton's mode='persistent' (the whole schedule in one cooperative launch)")
    p.add_argument("--no-captured", dest="captured", action="store_false",
                   help="skip the captured rows (a frontier.Drafter's whole step replayed as one CUDA graph, "
                   "for triton and torch_ref)")
    p.add_argument("--breakdown", action="store_true", help="also print the per-phase breakdown of the triton kernel")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    p.add_argument("--json-out", type=str, default=None, metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--head", type=str, default=None, help="time a local EAGLE head directory instead of the presets")
    p.add_argument("--target", type=str, default=None,
                   help="local target checkpoint supplying what the head does not ship (EAGLE-3 embedding)")
    p.set_defaults(func=run)
    return p


def parse_batches(text: str) -> list[int]:
    """``--batch``: comma-separated positive ints (InputError naming ``--batch`` otherwise)."""
    from ..errors import InputError

    items = [x.strip() for x in text.split(",")]
    try:
        batches = [int(x) for x in items]
    except ValueError:
        batches = []
    if not batches or any(b < 1 for b in batches):
        raise InputError(f"--batch takes comma-separated positive integers (e.g. 1,4,16,64), got {text!r}")
    return batches


def run(args) -> int:
    import torch

    from ..bench import PRESETS, run_bench
    from ..errors import InputError

    dtype = getattr(torch, args.dtype)
    try:
        depths = [int(x) for x in args.depth.split(",") if x]
    except ValueError:
        depths = []
    if not depths or any(d < 1 for d in depths):
        raise InputError(f"--depth takes comma-separated positive integers (e.g. 5,7), got {args.depth!r}")
    batches = parse_batches(args.batch)
    from ..bench import parse_weights

    weights = parse_weights(args.weights)
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if not backends:
        raise InputError(f"--backend takes comma-separated backend names, got {args.backend!r}")
    head, presets = None, args.preset or list(PRESETS)
    if args.head:
        from ..loading import load_draft_head

        if args.preset:
            raise InputError("--head replaces the presets; drop --preset")
        head = load_draft_head(args.head, target=args.target, dtype=dtype, device="cpu")
        presets = [f"head:{args.head}"]
    elif args.target:
        raise InputError("--target goes with --head")
    json_path, scratch = args.json_out, None
    if args.json and json_path is None:  # run_bench writes its JSON to a file; read it back to print it
        import tempfile

        scratch = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
        scratch.close()
        json_path = scratch.name
    try:
        text = run_bench(presets, depths, backends=backends, dtype=dtype, reps=args.reps,
                         json_path=json_path, batches=batches, breakdown=args.breakdown, context=args.context,
                         new_rows=args.new_rows, head=head, ragged=args.ragged, persistent=args.persistent,
                         captured=args.captured, weights=weights)
        if args.json:
            with open(json_path) as fh:
                text = fh.read().rstrip("\n")
    finally:
        if scratch is not None:
            import os

            os.unlink(scratch.name)
    print(text)
    return 0
