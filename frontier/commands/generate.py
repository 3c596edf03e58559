"""``frontier generate``: speculative generation with a Hugging Face target and an EAGLE head.

    frontier generate --random-tiny --backend torch_ref --max-new-tokens 64
    frontier generate --target ./llama-3.1-8b-instruct --head ./eagle3-head --prompt "Hello" --dtype bf16 --device cuda
    frontier generate --target ./llama-3.1-70b-instruct --head ./eagle3-head --prompt "Hello" --tp 4

``--tp N`` relaunches the command through ``torch.distributed.run`` with N processes (one GPU each
on CUDA, gloo on the CPU); the target is sharded by transformers' TP plan, the draft head is whole
on every rank, and rank 0 prints.

Prints the generated text (or tokens) and the stats table. ``--compare`` also runs
``target.generate`` (greedy) and reports whether the outputs are identical and its tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .argtypes import add_tree_shape, dtype_name, nonnegative_float, nonnegative_int, positive_int, probability
from .argtypes import device as device_arg


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate",
        help="speculative generation with a Hugging Face target + EAGLE head (or --random-tiny, no downloads)",
        description="Lossless EAGLE speculative generation: draft a tree with a frontier backend, verify it in one "
        "target forward, accept, repeat. Greedy output equals target.generate(do_sample=False).",
    )
    src = p.add_argument_group("models")
    src.add_argument("--target", default=None, help="local Hugging Face causal-LM directory (Llama family)")
    src.add_argument("--head", default=None, help="local EAGLE-3/EAGLE-2 draft-head directory")
    src.add_argument("--random-tiny", action="store_true", help="random tiny Llama target + random EAGLE-3 head (CPU ok)")
    src.add_argument(
        "--random", default=None, metavar="PRESET", help="random target + head of a preset size: tiny, small, large"
    )
    src.add_argument("--seed", type=nonnegative_int, default=0, help="seed for random models and for sampling")
    inp = p.add_argument_group("input")
    inp.add_argument(
        "--prompt", default=None, action="append",
        help="prompt text (needs the target's tokenizer); repeat it to generate for a batch of prompts",
    )
    inp.add_argument(
        "--input-ids", default=None, help="comma-separated prompt token ids; several prompts separated by ';' (a batch)"
    )
    inp.add_argument(
        "--batch", type=positive_int, default=None, metavar="N",
        help="with --random-tiny/--random and no prompt: N random prompts of different lengths, generated as one batch",
    )
    inp.add_argument("--chat", action="store_true", help="wrap --prompt in the tokenizer's chat template")
    gen = p.add_argument_group("generation")
    gen.add_argument("--backend", default="torch_ref", help="draft backend (default torch_ref)")
    gen.add_argument("--draft-mode", choices=["persistent", "steps", "graph"], default=None,
                     help="triton backend: launch mode of the draft calls (default graph on a GPU: per-phase kernels replayed "
                     "as a CUDA graph; persistent: one cooperative launch)")
    gen.add_argument("--max-new-tokens", type=positive_int, default=128)
    gen.add_argument("--max-length", type=positive_int, default=None, help="stop when prompt + new tokens reach this")
    gen.add_argument("--temperature", type=nonnegative_float, default=0.0, help="0 = greedy (lossless vs target.generate)")
    gen.add_argument("--top-p", type=probability, default=1.0)
    gen.add_argument("--top-k", type=nonnegative_int, default=0, help="sampling top-k (0 = off); the tree's K is --tree-top-k")
    tree = p.add_argument_group("draft tree")
    add_tree_shape(tree, total_tokens="60; 16 with random models", depth="5; 4 with random models",
                   tree_top_k="10; 4 with random models")
    gen.add_argument("--no-eos", action="store_true", help="ignore EOS (always run to --max-new-tokens)")
    gen.add_argument("--stop-token-ids", default=None, help="comma-separated extra stop token ids")
    run_g = p.add_argument_group("runtime")
    run_g.add_argument("--device", type=device_arg, default=None, help="cpu | cuda (default: cuda when available)")
    run_g.add_argument("--dtype", type=dtype_name, default=None,
                       help="bf16, fp16 or fp32 (also bfloat16, float16, float32); default fp32 on cpu, bf16 on cuda")
    run_g.add_argument("--tp", type=positive_int, default=1, metavar="N",
                       help="shard the target over N processes with transformers' tensor parallelism, launched "
                       "through torch.distributed.run (one GPU each on CUDA, gloo on the CPU); rank 0 prints")
    run_g.add_argument("--compare", action="store_true", help="also run target.generate (greedy) and compare")
    run_g.add_argument("--warmup", action="store_true", help="run once untimed first (kernel compilation, caches)")
    run_g.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    run_g.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)
    return p


def _default(value, default):
    """``value`` unless the flag was not given (None); 0 is a value, not "unset"."""
    return default if value is None else value


def _check_model_dir(path: str, flag: str) -> None:
    """A local checkpoint directory, one holding config.json (InputError naming the flag otherwise)."""
    from ..errors import InputError

    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{flag} {path!r} is not a directory (pass a local checkpoint directory)")
    if not (p / "config.json").is_file():
        raise InputError(f"{flag} {path!r} holds no config.json: it is not a model checkpoint directory")


def _ids(text: str, what: str) -> list[int]:
    from ..errors import InputError

    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise InputError(f"{what} must be comma-separated integers, got {text!r}") from None


class Progress:
    """A one-line progress display on stderr (tokens, tokens/s, mean accepted length)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.t0 = time.perf_counter()
        self.last = 0.0

    def __call__(self, tokens, stats) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        n = tokens.shape[1]
        if now - self.last < 0.1 and n < self.total:
            return
        self.last = now
        rate = n / max(now - self.t0, 1e-9)
        width = 24
        done = int(width * n / max(self.total, 1))
        bar = "#" * done + "." * (width - done)
        sys.stderr.write(
            f"\r[{bar}] {n}/{self.total} tokens  {rate:7.1f} tok/s  accepted {stats.mean_accepted_length:.2f}/verify"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    import torch

    from ..errors import InputError

    preset = "tiny" if args.random_tiny else args.random
    if preset and (args.target or args.head):
        raise InputError("--random-tiny/--random build their own models; drop --target/--head")
    if not preset and not (args.target and args.head):
        raise InputError("give --target DIR and --head DIR (local checkpoints), or --random-tiny for a self-contained run")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if args.tp == 1:
        return _generate(args, preset, device, dtype)
    if os.environ.get(TP_WORKER) != "1":
        return _launch_tp(args, preset, device)
    device = _join_tp(device)
    try:
        return _generate(args, preset, device, dtype)
    finally:
        _leave_tp()


def _generate(args: argparse.Namespace, preset, device, dtype) -> int:
    """Load the models, generate, print the report (on every rank of a --tp run; rank 0 prints)."""
    import torch

    from ..errors import InputError
    from ..generation import SpeculativeGenerator, random_pair

    tokenizer = None
    if args.tp > 1:
        target, cfg, weights, source = _tp_models(args, preset, device, dtype)
    elif preset:
        tree = dict(total_token=_default(args.total_tokens, 16), depth=_default(args.depth, 4),
                    top_k=_default(args.tree_top_k, 4))
        target, cfg, weights = random_pair(preset, seed=args.seed, dtype=dtype, device=device, **tree)
        source = f"random {preset} Llama target ({target.config.num_hidden_layers} layers, hidden {target.config.hidden_size}) + random EAGLE-3 head"
    else:
        from transformers import AutoModelForCausalLM

        from ..loading import load_draft_head

        _check_model_dir(args.target, "--target")
        _check_model_dir(args.head, "--head")
        target = AutoModelForCausalLM.from_pretrained(
            args.target, dtype=dtype, local_files_only=True, attn_implementation="sdpa"
        ).to(device).eval()
        head = load_draft_head(args.head, target=target, dtype=dtype, device=device)
        cfg = head.config(total_token=_default(args.total_tokens, 60), depth=_default(args.depth, 5),
                          top_k=_default(args.tree_top_k, 10))
        weights = head.weights
        source = f"{args.target} + {args.head}"
    if not preset and args.prompt is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.target, local_files_only=True)

    if args.batch is not None and (args.batch < 1 or not preset or args.input_ids is not None or args.prompt):
        raise InputError("--batch N (N >= 1) makes N random prompts for --random-tiny/--random; with your own "
                         "prompts repeat --prompt or separate --input-ids prompts with ';'")
    prompts = []
    if args.input_ids is not None:
        for part in args.input_ids.split(";"):
            prompts.append(torch.tensor([_ids(part, "--input-ids")], dtype=torch.long))
    elif args.prompt is not None:
        if tokenizer is None:
            raise InputError("--prompt needs a tokenizer (a --target directory); with random models use --input-ids")
        for text in args.prompt:
            if args.chat:
                text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
                prompts.append(tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids)
            else:
                prompts.append(tokenizer(text, return_tensors="pt").input_ids)
    elif preset:
        g = torch.Generator().manual_seed(args.seed)
        for b in range(args.batch or 1):
            n = 16 if b == 0 else 3 + (7 * b) % 23  # ragged lengths
            prompts.append(torch.randint(3, target.config.vocab_size, (1, n), generator=g))
    else:
        raise InputError("give --prompt TEXT or --input-ids 1,2,3")
    prompts = [p.to(device) for p in prompts]
    prompt = prompts[0]
    batched = len(prompts) > 1 or args.batch is not None

    if args.draft_mode is not None and args.backend != "triton":
        raise InputError(f"--draft-mode is an option of the triton backend, not of --backend {args.backend}")
    gen = SpeculativeGenerator(target, cfg, weights, backend=args.backend,
                               draft_options=None if args.draft_mode is None else {"mode": args.draft_mode})
    kwargs = dict(
        max_new_tokens=args.max_new_tokens,
        max_length=args.max_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        stop_token_ids=_ids(args.stop_token_ids, "--stop-token-ids") if args.stop_token_ids else None,
        seed=args.seed,
    )
    if args.no_eos or preset:
        kwargs["eos_token_id"] = None  # random models have no meaningful EOS
    if batched:
        return _run_batch(args, gen, target, prompts, kwargs, source, tokenizer, device)
    if args.warmup:
        gen.generate(prompt, **{**kwargs, "max_new_tokens": min(8, args.max_new_tokens)})
    show = not args.no_progress and not args.json and sys.stderr.isatty() and _rank() == 0
    progress = Progress(args.max_new_tokens, show)
    try:
        out = gen.generate(prompt, callback=progress, **kwargs)
    finally:
        progress.close()

    report: dict = {"source": source, "backend": args.backend, "stats": out.stats.to_dict()}
    new = out.new_tokens[0].tolist()
    report["new_token_ids"] = new
    if tokenizer is not None:
        report["text"] = tokenizer.decode(new, skip_special_tokens=False)
    if args.compare:
        if args.temperature > 1e-5:
            raise InputError("--compare checks greedy losslessness; drop --temperature")
        eos = kwargs.get("eos_token_id", "default")
        gkw = {} if eos == "default" else {"eos_token_id": eos}
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            ref = target.generate(
                prompt, do_sample=False, max_new_tokens=out.sequences.shape[1] - prompt.shape[1] if args.max_length else args.max_new_tokens,
                pad_token_id=getattr(target.config, "pad_token_id", None) or 0, **gkw,
            )
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        n_ref = ref.shape[1] - prompt.shape[1]
        report["compare"] = {
            "identical": bool(torch.equal(ref.to(out.sequences.device), out.sequences)),
            "target_generate_tokens_per_s": n_ref / dt if dt > 0 else 0.0,
            "speedup": (out.stats.tokens_per_second / (n_ref / dt)) if dt > 0 and n_ref else 0.0,
        }
    if args.json:
        print(json.dumps(report))
        return 0 if report.get("compare", {}).get("identical", True) else 1
    print(f"frontier generate: {source}")
    print(f"prompt: {prompt.shape[1]} tokens")
    if "text" in report:
        print("text:", report["text"])
    print("new tokens:", " ".join(str(t) for t in new))
    print()
    print(out.stats.table())
    if "compare" in report:
        c = report["compare"]
        print(
            f"\ntarget.generate (greedy): identical={c['identical']}  {c['target_generate_tokens_per_s']:.1f} tok/s  "
            f"speedup x{c['speedup']:.2f}"
        )
        if not c["identical"]:
            return 1
    return 0


def _run_batch(args, gen, target, prompts, kwargs, source, tokenizer, device) -> int:
    """A batch of prompts: one draft call and one verify forward per step for all of them."""
    import torch

    from ..errors import InputError

    if args.warmup:
        gen.generate(prompts, **{**kwargs, "max_new_tokens": min(8, args.max_new_tokens)})
    out = gen.generate(prompts, **kwargs)
    report: dict = {"source": source, "backend": args.backend, "batch_size": len(prompts), "stats": out.stats.to_dict()}
    report["sequences"] = []
    for r in out:
        item = {"prompt_tokens": r.prompt_length, "new_token_ids": r.new_tokens[0].tolist()}
        if tokenizer is not None:
            item["text"] = tokenizer.decode(item["new_token_ids"], skip_special_tokens=False)
        report["sequences"].append(item)
    if args.compare:
        if args.temperature > 1e-5:
            raise InputError("--compare checks greedy losslessness; drop --temperature")
        eos = kwargs.get("eos_token_id", "default")
        gkw = {} if eos == "default" else {"eos_token_id": eos}
        identical, n_ref, dt = [], 0, 0.0
        for p, r in zip(prompts, out):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                ref = target.generate(
                    p, do_sample=False,
                    max_new_tokens=r.sequences.shape[1] - p.shape[1] if args.max_length else args.max_new_tokens,
                    pad_token_id=getattr(target.config, "pad_token_id", None) or 0, **gkw,
                )
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt += time.perf_counter() - t0
            n_ref += ref.shape[1] - p.shape[1]
            identical.append(bool(torch.equal(ref.to(r.sequences.device), r.sequences)))
        rate = n_ref / dt if dt > 0 else 0.0
        report["compare"] = {
            "identical": all(identical),
            "identical_per_sequence": identical,
            "target_generate_tokens_per_s": rate,  # one prompt at a time
            "speedup": out.stats.tokens_per_second / rate if rate else 0.0,
        }
    ok = report.get("compare", {}).get("identical", True)
    if args.json:
        print(json.dumps(report))
        return 0 if ok else 1
    print(f"frontier generate: {source}")
    print(f"batch: {len(prompts)} prompts of {', '.join(str(p.shape[1]) for p in prompts)} tokens")
    for b, item in enumerate(report["sequences"]):
        if "text" in item:
            print(f"[{b}] text:", item["text"])
        print(f"[{b}] new tokens:", " ".join(str(t) for t in item["new_token_ids"]))
    print()
    print(out.stats.table())
    if "compare" in report:
        c = report["compare"]
        print(
            f"\ntarget.generate (greedy, one prompt at a time): identical={c['identical']} "
            f"{c['identical_per_sequence']}  {c['target_generate_tokens_per_s']:.1f} tok/s  speedup x{c['speedup']:.2f}"
        )
    return 0 if ok else 1


# -- --tp N: a tensor-parallel target over N processes ---------------------------------------------
TP_WORKER = "FRONTIER_TP_WORKER"  # set in the processes that torch.distributed.run starts


def _rank() -> int:
    return int(os.environ.get("RANK", "0")) if os.environ.get(TP_WORKER) == "1" else 0


def _target_heads(args: argparse.Namespace, preset) -> object:
    """The target's head counts (attention, key/value), read without loading it."""
    from types import SimpleNamespace

    from ..errors import InputError
    from ..generation import RANDOM_PRESETS

    if preset:
        if preset not in RANDOM_PRESETS:
            raise InputError(f"unknown random preset {preset!r}; choose one of {sorted(RANDOM_PRESETS)}")
        p = RANDOM_PRESETS[preset]
        return SimpleNamespace(num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"])
    _check_model_dir(args.target, "--target")
    _check_model_dir(args.head, "--head")
    cfg = json.loads((Path(args.target) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    heads = cfg.get("num_attention_heads")
    if heads is None:
        raise InputError(f"--target {args.target!r}: its config.json has no num_attention_heads")
    return SimpleNamespace(num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads") or heads)


def _launch_tp(args: argparse.Namespace, preset, device) -> int:
    """Check --tp N, then rerun this command line under torch.distributed.run with N processes."""
    import torch

    from ..errors import InputError
    from ..generation.distributed import check_tp_size

    n = args.tp
    argv = getattr(args, "cli_argv", None)
    if argv is None:
        raise InputError("--tp N relaunches the command line; run it through frontier.cli.main or the frontier command")
    if device.type == "cuda" and n > torch.cuda.device_count():
        raise InputError(f"--tp {n} needs {n} CUDA devices, this machine has {torch.cuda.device_count()}")
    if device.type == "cuda" and device.index is not None:
        raise InputError(f"--tp {n} gives each process its own GPU; pass --device cuda, not {device}")
    if device.type not in ("cuda", "cpu"):
        raise InputError(f"--tp runs on cuda (NCCL) or cpu (gloo), not on {device.type}")
    check_tp_size(_target_heads(args, preset), n, where="--target" if not preset else f"the random {preset} target")
    env = dict(os.environ, **{TP_WORKER: "1"})
    if device.type == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "frontier.cli", *argv]
    return subprocess.run(cmd, env=env, check=False).returncode


def _join_tp(device):
    """In a process of a --tp run: bind its device (cuda:LOCAL_RANK), join the process group, and
    silence stdout on every rank but 0. Returns the rank's device."""
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    if dist.get_rank() != 0:
        sys.stdout = open(os.devnull, "w")
    return device


def _leave_tp() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _tp_models(args: argparse.Namespace, preset, device, dtype):
    """(target sharded over the ranks, cfg, head weights on this rank's device, source line).

    Random models: rank 0 builds the pair and saves it to a temporary directory that every rank
    then loads from, the target with its TP plan (transformers shards a checkpoint as it loads it)."""
    import shutil
    import tempfile

    import torch.distributed as dist

    from ..generation import random_pair
    from ..generation.distributed import load_tp_target
    from ..loading import load_draft_head, save_draft_head

    tmp = None
    if preset:
        box = [tempfile.mkdtemp(prefix="frontier-tp-") if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        tmp = box[0]
        target_dir, head_dir = os.path.join(tmp, "target"), os.path.join(tmp, "head")
        if dist.get_rank() == 0:
            tree = dict(total_token=_default(args.total_tokens, 16), depth=_default(args.depth, 4),
                        top_k=_default(args.tree_top_k, 4))
            full, cfg, w = random_pair(preset, seed=args.seed, dtype=dtype, device=device, **tree)
            full.save_pretrained(target_dir)
            save_draft_head(w, cfg, head_dir, include_embedding=True, overwrite=True)
            del full, w
        dist.barrier()
        total, depth, top_k = _default(args.total_tokens, 16), _default(args.depth, 4), _default(args.tree_top_k, 4)
    else:
        target_dir, head_dir = args.target, args.head
        total, depth, top_k = _default(args.total_tokens, 60), _default(args.depth, 5), _default(args.tree_top_k, 10)
    try:
        target = load_tp_target(target_dir, dtype=dtype)
        head = load_draft_head(head_dir, target=target_dir, dtype=dtype, device=device)
    finally:
        if tmp is not None:
            dist.barrier()
            if dist.get_rank() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
    cfg = head.config(total_token=total, depth=depth, top_k=top_k)
    what = f"random {preset} Llama target" if preset else args.target
    c = target.config
    source = (f"{what} ({c.num_hidden_layers} layers, hidden {c.hidden_size}) over {dist.get_world_size()} "
              f"tensor-parallel ranks + {'random EAGLE-3 head' if preset else args.head}")
    return target, cfg, head.weights, source
