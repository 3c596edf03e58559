"""A trained EAGLE-3 head on a real target: mean accepted length and end-to-end tokens/s.

On held-out prompts (one user turn each, under the tokenizer's chat template):

* accept: for each tree (total_token/depth/top_k) and weights format, the mean accepted length
  of greedy ``frontier.generate`` (tokens per verify forward, the target's own token included),
  pooled over the prompts;
* bench: tokens/s of ``target.generate(do_sample=False)`` and of ``frontier.generate`` per
  backend and weights format at one tree, batch 1, prompt by prompt (one untimed warm-up call
  first, which also compiles the triton kernels); whether every greedy output equals the
  baseline's; and, from a profiled pass over the first ``--split-prompts`` prompts, the draft /
  verify / other time per step.

Weights (``--weights plain,fp8``): ``plain`` is the loaded head in ``--dtype``; ``fp8`` the same
head quantized (:meth:`DraftWeights.quantized`: e4m3, a power-of-two scale per output channel).
With both, the accept phase's plain run also drafts every step's tree with the fp8 head from the
same features and token ids (the fp8 head on its own draft cache, fed the plain run's accepted
rows) and counts the steps whose trees are identical (draft_tokens, retrieve_indices, tree_mask)
and the share of tree nodes (as root-to-node token paths) the two trees have in common. That
comparison needs per-call drafting (``--accept-backend`` torch_ref, or ``NAME:calls``).

    python benchmarks/real_model.py --target DIR --head HEAD_DIR --device cuda --dtype bfloat16 \\
        --backends triton,torch_ref --json-out real_model.json

A backend may carry a draft mode: ``triton:persistent``. Prints compact tables; ``--json-out``
gets every number.

    python benchmarks/real_model.py --target DIR --head HEAD_DIR --device cpu --dtype bfloat16 \\
        --phases accept --weights plain,fp8 --json-out fp8_accept.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(_REPO))

import frontier  # noqa: E402
import frontier.bench  # noqa: E402
from frontier.generation import SpeculativeGenerator  # noqa: E402
from frontier.generation.drafting import CallDrafts  # noqa: E402

DEFAULT_PROMPTS = _REPO / "tools" / "prompts" / "heldout.jsonl"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS = frontier.bench.WEIGHTS


def _script(name: str, path: str) -> Any:
    """A script of this checkout imported as module ``name`` (once)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _REPO / path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _fp8_quality_module() -> Any:
    """benchmarks/fp8_quality.py (its tree comparison)."""
    return _script("frontier_benchmarks_fp8_quality", "benchmarks/fp8_quality.py")


def _train_head_module() -> Any:
    """tools/train_head.py (its prompt reading and chat-template helpers)."""
    return _script("frontier_tools_train_head", "tools/train_head.py")


def parse_tree(text: str) -> tuple[int, int, int]:
    """``"60/5/10"`` -> (total_token, depth, top_k)."""
    parts = text.split("/")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"a tree is total_token/depth/top_k, e.g. 60/5/10; got {text!r}")
    t, d, k = (int(p) for p in parts)
    return t, d, k


def parse_weights(text: str) -> list[str]:
    """``"plain,fp8"`` -> ["plain", "fp8"] (``frontier.bench.parse_weights``)."""
    try:
        return frontier.bench.parse_weights(text)
    except frontier.InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def head_weights(head: Any, names: Sequence[str]) -> dict[str, Any]:
    """Weights format -> DraftWeights: ``plain`` the head in its activation dtype (dequantized
    when it was saved in fp8), ``fp8`` the head in fp8 (quantized when it was not)."""
    w = head.weights
    return {n: (w if w.is_fp8 else w.quantized()) if n == "fp8" else w.dequantized() for n in names}


def parse_backend(text: str) -> tuple[str, dict, Optional[bool]]:
    """(backend name, draft options, static) of ``"triton"`` (the loop's default: a captured
    Drafter on a GPU), ``"triton:calls"`` (one frontier_generate call per step) or
    ``"triton:persistent"`` (per call, that launch mode)."""
    name, _, mode = text.partition(":")
    if mode == "calls":
        return name, {}, False
    return name, ({"mode": mode} if mode else {}), None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load(target_dir: str, head_dir: str, dtype: torch.dtype, device: str) -> tuple[Any, Any, Any]:
    """(target, tokenizer, DraftHead): the head's embedding is the loaded target's."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    head = frontier.load_draft_head(head_dir, target=target, dtype=dtype, device=device)
    return target, tokenizer, head


def prompt_tensors(tokenizer: Any, prompts_file: Path, count: int, device: Any) -> list[torch.Tensor]:
    """The first ``count`` prompts of the file under the chat template, each [1, P] on ``device``."""
    th = _train_head_module()
    ids = th.chat_ids(tokenizer, th.read_prompts(prompts_file, count))
    return [torch.tensor([p], device=device) for p in ids]


# ------------------------------------------------------------------------------------------------
class _ComparedDrafts:
    """A generation's drafts plus, per step, the tree of other weights drafted from the same
    features and token ids (one ``frontier_generate`` call per step on its own draft cache);
    each step's comparison is appended to ``tally``."""

    def __init__(self, drafts: Any, shadow: CallDrafts, tally: list) -> None:
        self.drafts, self.shadow, self.tally = drafts, shadow, tally

    def draft(self, feats: list[torch.Tensor], ids: list[torch.Tensor]) -> list:
        frs = self.drafts.draft(feats, ids)
        others = self.shadow.draft(feats, ids)
        compare = _fp8_quality_module().compare_trees
        self.tally.extend(compare(a, b) for a, b in zip(frs, others))
        return frs

    def keep(self, keep: list[int]) -> None:
        self.drafts.keep(keep)
        self.shadow.keep(keep)


class ComparingGenerator(SpeculativeGenerator):
    """A per-call :class:`SpeculativeGenerator` whose every draft step also drafts the tree of
    ``other`` weights from the same inputs; :attr:`tally` collects one comparison per step
    (``fp8_quality.compare_trees``). The generated tokens are those of ``weights`` alone."""

    def __init__(self, target: Any, cfg: Any, weights: Any, other: Any, **kwargs: Any) -> None:
        super().__init__(target, cfg, weights, **kwargs)
        if self.static:
            raise ValueError("comparing trees needs per-call drafting (a backend NAME:calls, or torch_ref)")
        self.other = SpeculativeGenerator(target, cfg, other, backend=self.backend, padded=self.padded,
                                          draft_options=self.draft_options, static=False)
        self.tally: list[dict] = []

    def _drafts(self, batch: int, max_length: int, *, sampling: bool) -> Any:
        return _ComparedDrafts(super()._drafts(batch, max_length, sampling=sampling),
                               CallDrafts(self.other, sampling=sampling, max_length=max_length), self.tally)


def accepted_lengths(
    target: Any, head: Any, prompts: list[torch.Tensor], tree: tuple[int, int, int], backend: str, max_new_tokens: int,
    *, weights: Any = None, weights_name: str = "plain", compare: Optional[tuple[str, Any]] = None,
) -> dict:
    """Greedy generation of every prompt with ``weights`` (default: the head's): tokens per
    verify forward, pooled and per prompt. ``compare=(name, other weights)`` also drafts every
    step's tree with the other weights from the same inputs: the row's ``trees_vs_<name>`` gives
    the share of steps with identical trees and the mean share of shared nodes."""
    name, options, static = parse_backend(backend)
    w = head.weights if weights is None else weights
    cfg = head.config(*tree)
    gen = None
    if compare is not None:
        try:
            gen = ComparingGenerator(target, cfg, w, compare[1], backend=name, draft_options=options, static=static)
        except ValueError as exc:  # a captured Drafter: the trees are not compared
            print(f"## trees not compared: {exc}", flush=True)
            compare = None
    if gen is None:
        gen = SpeculativeGenerator(target, cfg, w, backend=name, draft_options=options, static=static)
    per_prompt, tokens, steps = [], 0, 0
    for ids in prompts:
        stats = gen.generate(ids, max_new_tokens=max_new_tokens, profile=False).stats
        per_prompt.append(round(stats.mean_accepted_length, 4))
        tokens += sum(stats.accepted_lengths)
        steps += stats.verify_steps
    row = {
        "tree": "/".join(map(str, tree)), "backend": backend, "weights": weights_name, "prompts": len(prompts),
        "verify_steps": steps, "tokens": tokens, "mean_accepted_length": tokens / max(steps, 1),
        "per_prompt": per_prompt,
    }
    if compare is not None:
        row[f"trees_vs_{compare[0]}"] = _fp8_quality_module().summarize(gen.tally)
    return row


def baseline(target: Any, prompts: list[torch.Tensor], max_new_tokens: int) -> dict:
    """``target.generate(do_sample=False)`` per prompt after one warm-up call: outputs and tokens/s."""
    device = prompts[0].device

    def run(ids: torch.Tensor) -> torch.Tensor:
        return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens)

    run(prompts[0])
    outputs, elapsed, new = [], 0.0, 0
    for ids in prompts:
        _sync(device)
        t0 = time.perf_counter()
        out = run(ids)
        _sync(device)
        elapsed += time.perf_counter() - t0
        outputs.append(out)
        new += out.shape[1] - ids.shape[1]
    return {"name": "target.generate", "new_tokens": new, "seconds": elapsed, "tokens_per_s": new / elapsed, "outputs": outputs}


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    """Index of the first differing token of two [1, n] sequences (the shorter length if one is a prefix)."""
    n = min(a.shape[1], b.shape[1])
    diff = (a[0, :n] != b[0, :n]).nonzero()
    return int(diff[0]) if len(diff) else n


def bench_backend(
    target: Any, head: Any, prompts: list[torch.Tensor], tree: tuple[int, int, int], backend: str,
    max_new_tokens: int, reference: list[torch.Tensor], split_prompts: int, *, weights: Any = None,
    weights_name: str = "plain",
) -> dict:
    """Timed greedy generation of every prompt (no profiling syncs) after a warm-up call, the
    comparison with ``reference``, then the per-step time split of a profiled pass."""
    name, options, static = parse_backend(backend)
    gen = SpeculativeGenerator(target, head.config(*tree), head.weights if weights is None else weights,
                               backend=name, draft_options=options, static=static)
    device = prompts[0].device
    t0 = time.perf_counter()
    gen.generate(prompts[0], max_new_tokens=max_new_tokens, profile=False)  # warm-up (triton: compiles)
    _sync(device)
    warmup = time.perf_counter() - t0
    elapsed, new, steps, accepted, mismatches = 0.0, 0, 0, 0, []
    for i, (ids, ref) in enumerate(zip(prompts, reference)):
        _sync(device)
        t0 = time.perf_counter()
        res = gen.generate(ids, max_new_tokens=max_new_tokens, profile=False)
        _sync(device)
        elapsed += time.perf_counter() - t0
        new += res.stats.new_tokens
        steps += res.stats.verify_steps
        accepted += sum(res.stats.accepted_lengths)
        if not torch.equal(res.sequences, ref):
            mismatches.append({"prompt": i, "first_difference": _first_difference(res.sequences, ref) - ids.shape[1]})
    split = {"draft": 0.0, "verify": 0.0, "other": 0.0, "prefill": 0.0, "steps": 0}
    for ids in prompts[:split_prompts]:
        s = gen.generate(ids, max_new_tokens=max_new_tokens, profile=True).stats
        split["draft"] += s.time_draft
        split["verify"] += s.time_verify
        split["other"] += s.time_other
        split["prefill"] += s.time_prefill
        split["steps"] += s.verify_steps
    per_step = {f"{k}_ms_per_step": 1e3 * split[k] / max(split["steps"], 1) for k in ("draft", "verify", "other")}
    if gen.static and device.type == "cuda":  # the loop's Drafter: its captured step alone, as a replay
        drafter = gen._drafters[False][0]
        per_step["captured_ms"] = frontier.bench.time_calls(lambda: drafter.replay(1, commit=False), reps=50)
    return {
        "name": f"frontier {backend}", "tree": "/".join(map(str, tree)), "weights": weights_name,
        "warmup_s": warmup, "new_tokens": new,
        "seconds": elapsed, "tokens_per_s": new / elapsed, "verify_steps": steps,
        "mean_accepted_length": accepted / max(steps, 1), "identical": not mismatches, "mismatches": mismatches,
        "split_prompts": min(split_prompts, len(prompts)), **per_step,
    }


# ------------------------------------------------------------------------------------------------
def accept_table(rows: list[dict]) -> str:
    lines = [f"{'tree':>9}  {'backend':<10} {'weights':<7} {'tau':>6} {'steps':>6} {'tokens':>7}  "
             "trees vs other weights"]
    for r in rows:
        tau = r["mean_accepted_length"]
        line = (f"{r['tree']:>9}  {r['backend']:<10} {r.get('weights', 'plain'):<7} {tau:6.3f} {r['verify_steps']:6d} "
                f"{r['tokens']:7d}")
        for key in [k for k in r if k.startswith("trees_vs_")]:
            c = r[key]
            line += (f"  vs {key[len('trees_vs_'):]}: identical {c['identical']}/{c['calls']} "
                     f"({100 * c['identical_rate']:.1f}%), nodes shared {100 * c['mean_shared_nodes']:.1f}%")
        lines.append(line)
    return "\n".join(lines)


def bench_table(base: dict, rows: list[dict]) -> str:
    head = (f"{'method':<30} {'tok/s':>8} {'speedup':>7} {'tau':>6} {'same':>5} {'draft':>7} {'verify':>7} {'other':>7} "
            f"{'replay':>7}  (ms/step; replay: the loop's captured draft step alone)")
    lines = [head, f"{base['name']:<30} {base['tokens_per_s']:8.1f} {1.0:7.2f} {'':>6} {'':>5}"]
    for r in rows:
        replay = f"{r['captured_ms']:7.3f}" if "captured_ms" in r else f"{'-':>7}"
        name = f"{r['name']} {r['tree']}" + ("" if r.get("weights", "plain") == "plain" else f" {r['weights']}")
        lines.append(
            f"{name:<30} {r['tokens_per_s']:8.1f} {r['tokens_per_s'] / base['tokens_per_s']:7.2f} "
            f"{r['mean_accepted_length']:6.3f} {('yes' if r['identical'] else 'NO'):>5} {r['draft_ms_per_step']:7.2f} "
            f"{r['verify_ms_per_step']:7.2f} {r['other_ms_per_step']:7.2f} {replay}"
        )
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", required=True, help="local Hugging Face directory of the target")
    p.add_argument("--head", required=True, help="directory of the trained EAGLE-3 head")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--phases", default="accept,bench", help="comma-separated: accept, bench")
    p.add_argument("--trees", type=lambda s: [parse_tree(t) for t in s.split(",")], default=[(60, 5, 10), (20, 4, 4)],
                   help="trees of the accept phase, e.g. 60/5/10,20/4/4")
    p.add_argument("--accept-backend", default="torch_ref:calls",
                   help="backend of the accepted-length phase (default: torch_ref, one call per step)")
    p.add_argument("--bench-tree", type=parse_tree, default=(60, 5, 10))
    p.add_argument("--backends", default="triton,torch_ref", help="bench phase backends, e.g. triton,triton:calls,triton:persistent,torch_ref "
                   "(triton: the loop's default, a captured Drafter on a GPU; :calls one frontier_generate call per step)")
    p.add_argument("--split-prompts", type=int, default=4, help="prompts of the profiled pass that gives the time split")
    p.add_argument("--weights", type=parse_weights, default=["plain"],
                   help="comma-separated weights formats: plain (the head in --dtype) and/or fp8 (quantized, "
                        "e4m3 with a power-of-two scale per output channel); one row per format")
    p.add_argument("--no-compare-trees", dest="compare_trees", action="store_false",
                   help="with plain and fp8: skip drafting the fp8 tree beside every plain step in the accept phase")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json-out", default=None, help="write every number to this JSON file")
    args = p.parse_args(argv)
    phases = [x for x in args.phases.split(",") if x]
    unknown = sorted(set(phases) - {"accept", "bench"})
    if unknown or not phases:
        p.error(f"--phases takes accept and/or bench, got {args.phases!r}")
    args.phases = phases
    for name in ("num_prompts", "max_new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    dtype = _DTYPES[args.dtype]
    target, tokenizer, head = load(args.target, args.head, dtype, args.device)
    prompts = prompt_tensors(tokenizer, Path(args.prompts), args.num_prompts, args.device)
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    report: dict[str, Any] = {
        "device": device_name, "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "torch": torch.__version__, "head": str(args.head), "target": str(args.target), "weights": args.weights,
    }
    weights = head_weights(head, args.weights)

    def save() -> None:  # after every row, so a run cut short keeps what it measured
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")

    print(f"# {device_name}, {args.dtype}, {len(prompts)} held-out prompts, max {args.max_new_tokens} new tokens", flush=True)
    if "accept" in args.phases:
        compare = args.compare_trees and {"plain", "fp8"} <= set(weights)
        rows = []
        for t in args.trees:
            for wname, w in weights.items():
                cmp = ("fp8", weights["fp8"]) if compare and wname == "plain" else None
                t0 = time.perf_counter()
                rows.append(accepted_lengths(target, head, prompts, t, args.accept_backend, args.max_new_tokens,
                                             weights=w, weights_name=wname, compare=cmp))
                rows[-1]["seconds"] = round(time.perf_counter() - t0, 1)
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "per_prompt"}), flush=True)
                report["accept"] = rows
                save()
        print("## mean accepted length (greedy)\n" + accept_table(rows), flush=True)
    if "bench" in args.phases:
        base = baseline(target, prompts, args.max_new_tokens)
        rows = []
        for backend in [b for b in args.backends.split(",") if b]:
            for wname, w in weights.items():
                try:
                    rows.append(bench_backend(
                        target, head, prompts, args.bench_tree, backend, args.max_new_tokens, base["outputs"],
                        args.split_prompts, weights=w, weights_name=wname,
                    ))
                except Exception as exc:  # one backend failing leaves the others' rows
                    what = backend if wname == "plain" else f"{backend} {wname}"
                    print(f"## {what} failed: {type(exc).__name__}: {exc}", flush=True)
                    report.setdefault("failed", {})[what] = f"{type(exc).__name__}: {exc}"
                    continue
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "mismatches"}), flush=True)
        report["bench"] = {"baseline": {k: v for k, v in base.items() if k != "outputs"}, "frontier": rows}
        print("## end-to-end, batch 1\n" + bench_table(base, rows), flush=True)
    save()
    return report


if __name__ == "__main__":
    main()
