"""How much fp8 heads change the drafted trees: plain vs quantized weights on random heads.

For each config and seed, one random head (the bench presets: ``frontier.bench.device_weights``;
``medium``: the random config of benchmarks/bf16_match.py, ``frontier.random_head.random_weights``
with lm_head scale 6) drafts two greedy calls on one draft cache - ``--context - --new-rows``
rows of a fresh cache, then ``--new-rows`` new rows - from the same random inputs, once with the
plain weights (``--dtype``) and once per fp8 variant (:meth:`DraftWeights.quantized`: e4m3, one
scale per output channel; ``pow2`` power-of-two scales, ``absmax`` plain absmax/448 scales), each
variant on its own cache. Per variant, over all calls:

* identical: the share of calls whose trees are identical (draft_tokens, retrieve_indices and
  tree_mask equal);
* shared nodes: the mean share of the plain tree's nodes that the fp8 tree also has, a node being
  its root-to-node path of token ids (so a node that moved to another position still counts, and
  the same token under another parent does not);
* root top-K: the mean share of the root's top-K tokens (the first K candidates of the call's
  trace) that the fp8 call's root top-K also holds, as a set; ``same order``: the share of calls
  whose root top-K is identical in order.

    python benchmarks/fp8_quality.py --device cuda --backend triton --seeds 8 --json-out fp8_quality.json
    python benchmarks/fp8_quality.py --device cpu --configs medium,eagle3-llama3.2-1b --seeds 4

Random heads have flat, near-tied draft distributions, so their trees react to small weight
changes far more than a trained head's; the numbers bound the effect from above rather than
predict a real head's acceptance (benchmarks/real_model.py --weights plain,fp8 measures that).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import torch

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(_REPO))

from frontier import frontier_generate  # noqa: E402
from frontier.config import FrontierConfig  # noqa: E402
from frontier.random_head import random_config, random_inputs, random_weights  # noqa: E402

CONFIGS = ("medium", "eagle3-llama3.2-1b", "eagle3-llama3.1-8b")
#: fp8 variants: name -> DraftWeights.quantized keyword
VARIANTS = {"pow2": {"power_of_two": True}, "absmax": {"power_of_two": False}}
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "float32": torch.float32, "fp32": torch.float32}


def medium_config() -> FrontierConfig:
    """The random config of benchmarks/bf16_match.py."""
    return random_config(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1408,
                         vocab_size=4000, target_vocab_size=16000, total_token=60, depth=6, top_k=10)


def preset_config(name: str, *, total_token: int = 60, depth: int = 7, top_k: int = 10) -> FrontierConfig:
    import frontier.bench

    return FrontierConfig(total_token=total_token, depth=depth, top_k=top_k, architecture="eagle3",
                          **frontier.bench.PRESETS[name])


def config_and_weights(name: str, *, device: Any, dtype: torch.dtype) -> tuple[FrontierConfig, Any]:
    """(config, seed -> random DraftWeights on ``device`` in ``dtype``) of a config name."""
    if name == "medium":
        cfg = medium_config()
        return cfg, lambda seed: random_weights(cfg, seed=seed, device=device, dtype=dtype, lm_head_scale=6.0)
    import frontier.bench

    cfg = preset_config(name)
    return cfg, lambda seed: frontier.bench.device_weights(cfg, device=device, dtype=dtype, seed=seed)


# ------------------------------------------------------------------------------------------------
def node_paths(fr: Any) -> set[tuple[int, ...]]:
    """The tree's nodes as root-to-node token paths (the root is the 1-tuple of its token).

    Node j's ancestors-or-self are the nonzero columns of ``tree_mask[0, 0, j]``; every node
    comes after its ancestors in ``draft_tokens``, so ascending positions are the path order."""
    tokens = fr.draft_tokens[0].tolist()
    mask = fr.tree_mask[0, 0].to("cpu") != 0
    return {tuple(tokens[i] for i in row.nonzero().flatten().tolist()) for row in mask}


def root_topk(fr: Any, k: int) -> Optional[list[int]]:
    """The root's top-K target token ids, best first (from a call drafted with ``trace=True``)."""
    trace = fr.info.get("trace") if getattr(fr, "info", None) else None
    return None if trace is None else trace.tokens[:k].tolist()


def compare_trees(a: Any, b: Any, top_k: Optional[int] = None) -> dict:
    """One call's plain tree ``a`` against another tree ``b`` of the same inputs: ``identical``
    (draft_tokens, retrieve_indices and tree_mask equal), ``shared_nodes`` (share of ``a``'s
    nodes, as token paths, that ``b`` has) and, with ``top_k`` and traces, ``root_topk`` (share of
    ``a``'s root top-K in ``b``'s, as sets) and ``root_topk_same_order``."""
    identical = (torch.equal(a.draft_tokens, b.draft_tokens) and torch.equal(a.retrieve_indices, b.retrieve_indices)
                 and torch.equal(a.tree_mask, b.tree_mask))
    pa = node_paths(a)
    out = {"identical": bool(identical), "shared_nodes": 1.0 if identical else len(pa & node_paths(b)) / len(pa)}
    if top_k:
        ka, kb = root_topk(a, top_k), root_topk(b, top_k)
        if ka is not None and kb is not None:
            out["root_topk"] = len(set(ka) & set(kb)) / len(ka)
            out["root_topk_same_order"] = ka == kb
    return out


def summarize(tally: Iterable[dict]) -> dict:
    """The means of :func:`compare_trees` results (``calls``, ``identical`` count, ``identical_rate``,
    ``mean_shared_nodes``, and where present ``mean_root_topk``, ``root_topk_same_order_rate``)."""
    tally = list(tally)
    n = max(len(tally), 1)
    out = {"calls": len(tally), "identical": sum(t["identical"] for t in tally),
           "identical_rate": sum(t["identical"] for t in tally) / n,
           "mean_shared_nodes": sum(t["shared_nodes"] for t in tally) / n}
    with_k = [t for t in tally if "root_topk" in t]
    if with_k:
        out["mean_root_topk"] = sum(t["root_topk"] for t in with_k) / len(with_k)
        out["root_topk_same_order_rate"] = sum(t["root_topk_same_order"] for t in with_k) / len(with_k)
    return out


def draft_calls(cfg: FrontierConfig, weights: Any, ids: torch.Tensor, feats: torch.Tensor, new_rows: int,
                backend: str) -> list:
    """Two greedy traced calls on one fresh cache: the first ``len - new_rows`` rows, then the rest."""
    n0 = feats.shape[1] - new_rows
    out, cache = [], None
    for lo, hi in ((0, n0), (n0, feats.shape[1])):
        fr = frontier_generate(cfg, feats[:, lo:hi], backend=backend, weights=weights, input_ids=ids[:, : hi + 1],
                               cache=cache, cache_max_length=feats.shape[1] + 8, sampling=False, trace=True)
        cache = fr.cache
        out.append(fr)
    return out


def measure(
    cfg: FrontierConfig, make_weights: Any, *, seeds: Sequence[int], device: Any, dtype: torch.dtype,
    backend: str = "torch_ref", context: int = 256, new_rows: int = 4, variants: Sequence[str] = tuple(VARIANTS),
) -> dict[str, dict]:
    """Variant name -> :func:`summarize` of every call of every seed (plain vs that variant)."""
    if not 1 <= new_rows < context:
        raise ValueError(f"need 1 <= new_rows < context, got new_rows={new_rows}, context={context}")
    tallies: dict[str, list] = {v: [] for v in variants}
    for seed in seeds:
        w = make_weights(seed)
        ids, feats = random_inputs(cfg, context=context, seed=seed + 1000, device=device, dtype=dtype)
        plain = draft_calls(cfg, w, ids, feats, new_rows, backend)
        for v in variants:
            q = w.quantized(**VARIANTS[v])
            for a, b in zip(plain, draft_calls(cfg, q, ids, feats, new_rows, backend)):
                tallies[v].append(compare_trees(a, b, cfg.top_k))
            del q
        del w
    return {v: summarize(t) for v, t in tallies.items()}


def table(rows: list[dict]) -> str:
    lines = [f"{'config':<20} {'scales':<7} {'calls':>5} {'identical':>10} {'shared nodes':>12} {'root top-K':>10} "
             f"{'same order':>10} {'s':>6}"]
    for r in rows:
        lines.append(f"{r['config']:<20} {r['scales']:<7} {r['calls']:5d} {100 * r['identical_rate']:9.1f}% "
                     f"{100 * r['mean_shared_nodes']:11.1f}% {100 * r.get('mean_root_topk', float('nan')):9.1f}% "
                     f"{100 * r.get('root_topk_same_order_rate', float('nan')):9.1f}% {r['seconds']:6.1f}")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    p.add_argument("--backend", default="torch_ref", help="draft backend (torch_ref, or triton on a GPU)")
    p.add_argument("--context", type=int, default=256, help="rows of each seed's inputs (both calls together)")
    p.add_argument("--new-rows", type=int, default=4, help="rows of the second call")
    p.add_argument("--json-out", default=None)
    a = p.parse_args(argv)
    a.configs = [c for c in a.configs.split(",") if c]
    bad = [c for c in a.configs if c not in CONFIGS]
    if bad or not a.configs:
        p.error(f"--configs: unknown {bad} (use {', '.join(CONFIGS)})")
    if a.seeds < 1:
        p.error(f"--seeds must be positive, got {a.seeds}")
    if not 1 <= a.new_rows < a.context:
        p.error(f"need 1 <= --new-rows < --context, got {a.new_rows} and {a.context}")
    return a


def main(argv: Optional[Sequence[str]] = None) -> dict:
    a = parse_args(argv)
    dtype = _DTYPES[a.dtype]
    device_name = torch.cuda.get_device_name(a.device) if str(a.device).startswith("cuda") else "cpu"
    report: dict[str, Any] = {"device": device_name, "dtype": str(dtype).replace("torch.", ""), "backend": a.backend,
                              "seeds": a.seeds, "context": a.context, "new_rows": a.new_rows,
                              "calls_per_seed": 2, "torch": torch.__version__, "rows": []}
    print(f"# {device_name}, {report['dtype']}, {a.backend}, {a.seeds} seeds, context {a.context} "
          f"(+{a.new_rows} rows), plain vs fp8", flush=True)
    for name in a.configs:
        cfg, make = config_and_weights(name, device=a.device, dtype=dtype)
        t0 = time.perf_counter()
        res = measure(cfg, make, seeds=range(a.seeds), device=a.device, dtype=dtype, backend=a.backend,
                      context=a.context, new_rows=a.new_rows)
        secs = time.perf_counter() - t0
        for v, s in res.items():
            report["rows"].append({"config": name, "tree": f"{cfg.total_token}/{cfg.depth}/{cfg.top_k}", "scales": v,
                                   "seconds": round(secs, 1), **s})
        print(table([r for r in report["rows"] if r["config"] == name]).split("\n", 1)[1], flush=True)
    print("## plain vs fp8 trees (identical: draft_tokens, retrieve_indices, tree_mask; shared nodes: token paths;"
          " root top-K: set overlap)\n" + table(report["rows"]), flush=True)
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
