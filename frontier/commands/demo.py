"""``frontier demo``: draft one tree on the CPU from a small random head and draw it."""

from __future__ import annotations

import argparse
import sys
import time

from .argtypes import Refused, add_tree_shape, nonnegative_int, positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="draft a tree on CPU with a small random EAGLE-3 head (no downloads) and draw it")
    p.add_argument(
        "--backend",
        default=None,
        help="backend to draft with (default: torch_ref with a random head, or stub when torch_ref cannot run here)",
    )
    add_tree_shape(p, total_tokens=24, depth=4, tree_top_k=4)
    p.add_argument("--top-k", action=Refused,
                   instead="the tree's branching K is --tree-top-k (--top-k is sampling top-k, a generate flag)")
    p.add_argument("--context", type=positive_int, default=16, help="context length L (default 16)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--head", default=None, help="local EAGLE head directory instead of a random head")
    p.add_argument(
        "--target",
        default=None,
        help="local target checkpoint directory supplying what the head does not ship (the token embedding of "
        "EAGLE-3 heads, the lm_head of EAGLE-2 heads); only those tensors are read",
    )
    p.add_argument("--sampling", action="store_true", help="order retrieve_indices for sampling verification")
    p.add_argument("--json", action="store_true", help="print the Frontier as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    from ..api import frontier_generate
    from ..random_head import random_config, random_inputs, random_weights
    from ..registry import get_backend
    from .render import render_tree

    torch.manual_seed(args.seed)
    cfg = random_config(
        total_token=args.total_tokens,
        depth=args.depth,
        top_k=args.tree_top_k,
        vocab_size=256,
        target_vocab_size=1024,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    )
    weights = None
    if args.target and not args.head:
        from ..errors import InputError

        raise InputError("--target goes with --head (it supplies tensors the head does not ship)")
    if args.head:
        from ..loading import load_draft_head

        head = load_draft_head(args.head, target=args.target, device="cpu", dtype=torch.float32)
        weights, cfg = head.weights, head.config(total_token=args.total_tokens, depth=args.depth, top_k=args.tree_top_k)
    if args.backend is None:
        ok, why = get_backend("torch_ref").availability()
        args.backend = "torch_ref" if ok else "stub"
        if not ok:
            print(f"(torch_ref cannot run here: {why}; drafting with the weight-free stub backend)", file=sys.stderr)
    backend = get_backend(args.backend)
    if getattr(backend, "requires_weights", False) and weights is None:
        weights = random_weights(cfg, seed=args.seed, lm_head_scale=6.0)
    ids, feats = random_inputs(cfg, context=args.context, seed=args.seed)
    kwargs = {"weights": weights} if getattr(backend, "requires_weights", False) else {}
    t0 = time.perf_counter()
    fr = frontier_generate(cfg, feats, backend=args.backend, input_ids=ids, sampling=args.sampling, **kwargs)
    ms = (time.perf_counter() - t0) * 1e3
    fr.check_invariants(total_token=cfg.total_token, depth=cfg.depth, top_k=cfg.top_k, sampling=args.sampling)
    if args.json:
        print(json.dumps(fr.to_dict()))
        return 0
    if args.head:
        head_desc = args.head
    elif weights is None:
        head_desc = "none (the backend needs no weights)"
    else:
        head_desc = f"random EAGLE-3 (H={cfg.hidden_size}, V={cfg.vocab_size})"
    print(
        f"backend={args.backend}  T={cfg.total_token} depth={cfg.depth} top_k={cfg.top_k}  "
        f"context L={args.context}  head={head_desc}"
    )
    print(render_tree(fr))
    leaves = fr.retrieve_indices.shape[0]
    print(f"\n{cfg.total_token} nodes, {leaves} leaves, max depth {int(fr.tree_position_ids.max())}, drafted in {ms:.1f} ms")
    return 0
