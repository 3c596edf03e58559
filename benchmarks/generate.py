"""Speculative generation on the GPU: tokens/s and mean accepted length per backend.

For each random target + random EAGLE-3 head pair (no downloads) and dtype:
  * target.generate (greedy) as the baseline: tokens/s;
  * frontier's generate with every available backend: tokens/s (no profiling syncs), mean
    accepted length, whether the output equals the baseline's (and where it first differs),
    then one profiled run for the draft / verify / other time split.
Random heads are almost never right, so the mean accepted length stays near 1.0 and the speed
is below the baseline's: what this measures is the loop's overhead and the backends' draft cost.

    python3 benchmarks/generate.py --out $OUT [--quick] [--backends torch_ref,triton,triton:graph]

Prints one JSON line per (case, backend) as it goes and the table at the end; writes
generate.json and generate.md under --out (rewritten after every row, so a timeout keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import frontier
from frontier.generation import SpeculativeGenerator, random_pair

CASES = [
    # (preset, dtype, new tokens, prompt length, tree (T, D, K))
    ("tiny", torch.float32, 256, 64, (60, 5, 10)),
    ("tiny", torch.bfloat16, 256, 64, (60, 5, 10)),
    ("large", torch.bfloat16, 128, 128, (60, 5, 10)),
    ("large", torch.bfloat16, 128, 128, (16, 4, 4)),
]


class OracleBackend(frontier.Backend):
    """Upper bound for the loop: the stub's tree with its deepest path set to the target's own
    greedy continuation (precomputed), so nearly every step accepts depth + 1 tokens. It measures
    what verification, acceptance and compaction cost when drafts are right; its 'draft' time is
    the stub plus a host-side fix-up, not a real drafter's."""

    name = "oracle_upper_bound"
    requires_weights = False
    dtypes = (torch.float32, torch.float16, torch.bfloat16)

    def __init__(self):
        self.reference: list[int] = []

    def generate(self, request):
        from frontier.generation import tree_parents

        fr = frontier.get_backend("stub").generate(request)
        n = request.input_ids.shape[1]
        future = self.reference[n:]
        tokens = fr.draft_tokens[0].tolist()
        parent = tree_parents(fr.tree_mask).tolist()
        depth = fr.tree_position_ids.tolist()
        node = max(range(len(depth)), key=lambda i: depth[i])
        path = []
        while node != 0:
            path.append(node)
            node = parent[node]
        path.reverse()
        vocab = max(max(tokens), max(future or [0])) + 2
        for j, node in enumerate(path[: len(future)]):
            tokens[node] = future[j]
        for node in path:
            used = {tokens[i] for i in range(1, len(tokens)) if parent[i] == parent[node]}
            for s in range(1, len(tokens)):
                if s != node and parent[s] == parent[node] and tokens[s] == tokens[node]:
                    alt = next(x for x in range(vocab) if x not in used)
                    tokens[s] = alt
                    used.add(alt)
        fr.draft_tokens = torch.tensor([tokens], device=fr.draft_tokens.device)
        return fr


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[1], b.shape[1])
    diff = (a[0, :n] != b[0, :n]).nonzero()
    return int(diff[0]) if diff.numel() else (-1 if a.shape == b.shape else n)


def write_tables(rows, out_dir, final=False):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "generate.json"), "w") as f:
        json.dump(rows, f, indent=1)
    head = ("preset", "dtype", "tree", "backend", "tok/s", "target.generate tok/s", "mean acc. len", "identical",
            "draft ms/step", "verify ms/step", "other ms/step", "split")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['preset']} | {r['dtype']} | {r['tree']} | {r['backend']} | error: {r['error'][:80]} |")
            continue
        ident = "yes" if r["identical_to_target_generate"] else f"no (first diff at {r['first_difference']})"
        lines.append(
            f"| {r['preset']} | {r['dtype']} | {r['tree']} | {r['backend']} | {r['tokens_per_s']:.1f} | "
            f"{r['baseline_tokens_per_s']:.1f} | {r['mean_accepted_length']:.3f} | {ident} | "
            f"{r['ms_per_step_draft']:.2f} | {r['ms_per_step_verify']:.2f} | {r['ms_per_step_other']:.2f} | {r['split']} |"
        )
    table = "\n".join(lines)
    with open(os.path.join(out_dir, "generate.md"), "w") as f:
        f.write(table + "\n")
    if final:
        print("\n" + table)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="fewer tokens")
    ap.add_argument("--backends", default=None,
                    help="comma-separated (default: every available one); NAME:MODE drafts with option mode=MODE "
                    "(triton:persistent or triton:graph)")
    ap.add_argument("--presets", default="tiny,large", help="comma-separated random presets to run")
    ap.add_argument("--device", default="cuda", help="cuda (cpu only for a smoke run of this script)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        assert torch.cuda.is_available(), "needs a CUDA GPU"
    backends = args.backends.split(",") if args.backends else []
    if not backends:
        for name in frontier.available_backends():
            ok, why = frontier.get_backend(name).availability()
            print(f"backend {name}: {'available' if ok else 'unavailable: ' + why}")
            if ok:
                backends.append(name)
    print(torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch", torch.__version__, flush=True)
    import transformers

    print("transformers", transformers.__version__, flush=True)
    rows = []
    for preset, dtype, n_new, p_len, (t, d, k) in CASES:
        if preset not in args.presets.split(","):
            continue
        if args.quick:
            n_new = min(n_new, 64)
        t0 = time.perf_counter()
        target, cfg, w = random_pair(preset, total_token=t, depth=d, top_k=k, seed=0, dtype=dtype, device=dev)
        sync()
        n_params = sum(p.numel() for p in target.parameters())
        print(f"\n== {preset} ({n_params / 1e6:.0f}M params, {target.config.num_hidden_layers} layers, hidden "
              f"{target.config.hidden_size}) {str(dtype)[6:]} T={t} D={d} K={k}: built in {time.perf_counter() - t0:.1f}s", flush=True)
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(3, target.config.vocab_size, (1, p_len), generator=g).to(dev)
        with torch.no_grad():
            target.generate(prompt, do_sample=False, max_new_tokens=8, eos_token_id=None, pad_token_id=0)
            sync()
            t0 = time.perf_counter()
            ref = target.generate(prompt, do_sample=False, max_new_tokens=n_new, eos_token_id=None, pad_token_id=0)
            sync()
        base_tps = n_new / (time.perf_counter() - t0)
        print(f"target.generate: {base_tps:.1f} tok/s", flush=True)
        oracle = OracleBackend()
        frontier.register_backend(oracle.name, oracle, clobber=True)
        with torch.no_grad():
            oracle.reference = target.generate(
                prompt, do_sample=False, max_new_tokens=n_new + t + 2, eos_token_id=None, pad_token_id=0
            )[0].tolist()
        for name in backends + [oracle.name]:
            row = dict(preset=preset, dtype=str(dtype)[6:], tree=f"T{t}-D{d}-K{k}", backend=name, new_tokens=n_new,
                       baseline_tokens_per_s=base_tps)
            try:
                be, _, mode = name.partition(":")
                gen = SpeculativeGenerator(target, cfg, w, backend=be, draft_options={"mode": mode} if mode else None)
                gen.generate(prompt, max_new_tokens=16, eos_token_id=None, profile=False)  # warm-up / compile
                sync()
                t0 = time.perf_counter()
                out = gen.generate(prompt, max_new_tokens=n_new, eos_token_id=None, profile=False)
                sync()
                wall = time.perf_counter() - t0
                prof = gen.generate(prompt, max_new_tokens=n_new, eos_token_id=None, profile=True).stats
                s = out.stats
                row.update(
                    tokens_per_s=n_new / wall,
                    speedup_vs_target_generate=(n_new / wall) / base_tps,
                    mean_accepted_length=s.mean_accepted_length,
                    target_forwards=s.target_forwards,
                    identical_to_target_generate=bool(torch.equal(out.sequences, ref)),
                    first_difference=first_difference(out.sequences, ref),
                    ms_per_step_draft=1e3 * prof.time_draft / max(prof.draft_calls, 1),
                    ms_per_step_verify=1e3 * prof.time_verify / max(prof.verify_steps, 1),
                    ms_per_step_other=1e3 * prof.time_other / max(prof.verify_steps, 1),
                    split=f"draft {100 * prof.time_draft / prof.time_total:.0f}% / verify "
                    f"{100 * prof.time_verify / prof.time_total:.0f}% / other "
                    f"{100 * (prof.time_other + prof.time_prefill) / prof.time_total:.0f}%",
                )
            except Exception as exc:  # report and go on with the other backends
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_tables(rows, args.out)  # incrementally: a timeout keeps what was measured
        del target, w
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    write_tables(rows, args.out, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
