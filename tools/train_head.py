"""Distil an EAGLE-3 draft head for a local Hugging Face Llama-family target.

Four phases, all seeded:

1. data: the prompts of a JSONL file (``{"prompt": ...}`` per line) under the tokenizer's chat
   template; the target answers them (batched ``target.generate``, greedy unless
   ``--temperature``);
2. features: one target forward per batch over prompt + answer gives the hidden states ENTERING
   the three decoder layers frontier's :class:`~frontier.generation.TargetRunner` taps
   (:func:`~frontier.generation.eagle3_tap_layers`: 2, L//2, L-3) and the final normed hidden
   state, from which the target's next-token distribution is recomputed during training;
3. train: the draft layer — the same functions as frontier's ``torch_ref`` backend
   (:mod:`frontier.backends.torch_ref.layer`) — learns the target's distribution over the draft
   vocabulary (forward KL, i.e. the soft cross-entropy less the target's entropy) on the answer's rows, unrolled
   on its own outputs for ``--ttt-steps`` steps (EAGLE-3's training-time test): step k at row p
   takes token ``p + k + 1`` with the draft's step-(k-1) output, sits at position ``p + k`` and
   attends to the step-0 rows 0..p and to its own row of steps 1..k — exactly what a depth-k tree
   node sees at inference;
4. save: the published EAGLE-3 layout (``config.json``, safetensors, ``d2t``/``t2d`` for the draft
   vocabulary, no embedding: it is the target's), then a check that frontier's ``torch_ref``
   forward of the saved head gives the training forward's log-probabilities.

The draft vocabulary is the ``--draft-vocab`` most frequent answer tokens (EAGLE-3's choice);
the lm_head starts from the target's rows for them.

    python tools/train_head.py --target DIR --out HEAD_DIR [--device cuda] [--num-prompts N] [--steps N]

``main(argv)`` returns the summary dict it also writes to ``HEAD_DIR/training.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(_REPO))

from frontier import FrontierConfig, frontier_generate, load_draft_head  # noqa: E402
from frontier.backends.torch_ref import layer as ref  # noqa: E402
from frontier.generation import eagle3_tap_layers  # noqa: E402
from frontier.loading import save_draft_head  # noqa: E402
from frontier.weights import DraftWeights  # noqa: E402

DEFAULT_PROMPTS = _REPO / "tools" / "prompts" / "train.jsonl"
MAX_FILE_BYTES = 12 * 2**20  # shard the saved head so that every file stays below this


# ------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------
def read_prompts(path: Path, limit: Optional[int] = None) -> list[str]:
    """The ``prompt`` field of each JSONL line of ``path``, the first ``limit`` of them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    prompts = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{i + 1}: each line must be a JSON object with a string 'prompt'")
        prompts.append(row["prompt"])
    if limit is not None:
        if limit < 1:
            raise ValueError(f"num_prompts must be positive, got {limit}")
        prompts = prompts[:limit]
    if not prompts:
        raise ValueError(f"prompts file {str(path)!r} holds no prompts")
    return prompts


def chat_ids(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Each prompt as one user turn under the chat template, with the assistant header appended."""
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        out.append([int(t) for t in ids])
    return out


@dataclass
class Sample:
    """One training sequence: prompt + the target's answer (EOS kept), and the prompt length."""

    ids: list[int]
    prompt_len: int


def eos_ids(target: Any) -> set[int]:
    eos = getattr(target.generation_config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


@torch.no_grad()
def generate_answers(
    target: Any, prompts: list[list[int]], *, max_new_tokens: int, batch_size: int, temperature: float, seed: int,
    pad_id: int,
) -> list[Sample]:
    """The target's answers, ``batch_size`` left-padded prompts per ``target.generate`` call."""
    device, stops = next(target.parameters()).device, eos_ids(target)
    samples = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # [B, P] left-padded
        mask = torch.zeros(len(chunk), width, dtype=torch.long)  # [B, P]
        for b, p in enumerate(chunk):
            ids[b, width - len(p) :] = torch.tensor(p)
            mask[b, width - len(p) :] = 1
        sampling = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature > 0 else dict(do_sample=False)
        torch.manual_seed(seed + start)
        out = target.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
            pad_token_id=pad_id, **sampling,
        )  # [B, P + N]
        for b, p in enumerate(chunk):
            answer = out[b, width:].tolist()
            cut = next((i + 1 for i, t in enumerate(answer) if t in stops), len(answer))
            samples.append(Sample(ids=p + answer[:cut], prompt_len=len(p)))
    return samples


@dataclass
class Features:
    """Per sample, on the training device: features [n, F], final hidden [n, H], ids [n]."""

    feats: list[torch.Tensor]
    final: list[torch.Tensor]
    ids: list[torch.Tensor]
    prompt_lens: list[int]


@torch.no_grad()
def extract_features(target: Any, samples: list[Sample], *, batch_size: int, store_dtype: torch.dtype) -> Features:
    """One forward per ``batch_size`` right-padded samples: the taps' input hidden states
    concatenated (the features a draft call gets) and the final normed hidden state."""
    device = next(target.parameters()).device
    taps = eagle3_tap_layers(target.config.num_hidden_layers)
    if len(taps) != 3:
        raise ValueError(f"an EAGLE-3 head needs three distinct tap layers; {target.config.num_hidden_layers} layers give {taps}")
    out = Features([], [], [], [])
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        lens = [len(s.ids) for s in chunk]
        ids = torch.zeros(len(chunk), max(lens), dtype=torch.long)  # [B, n] right-padded
        mask = torch.zeros_like(ids)
        for b, s in enumerate(chunk):
            ids[b, : lens[b]] = torch.tensor(s.ids)
            mask[b, : lens[b]] = 1
        res = target.model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
        feats = torch.cat([res.hidden_states[i] for i in taps], dim=-1)  # [B, n, 3H]
        for b, s in enumerate(chunk):
            out.feats.append(feats[b, : lens[b]].to(store_dtype))
            out.final.append(res.last_hidden_state[b, : lens[b]].to(store_dtype))
            out.ids.append(ids[b, : lens[b]].to(device))
            out.prompt_lens.append(s.prompt_len)
    return out


def draft_vocabulary(samples: list[Sample], size: int, target_vocab: int) -> torch.Tensor:
    """[V] sorted target ids: the ``size`` most frequent answer tokens (ties: lower id first),
    topped up with the lowest unused ids when the answers hold fewer distinct tokens."""
    if not 1 <= size <= target_vocab:
        raise ValueError(f"draft_vocab must be in [1, {target_vocab}], got {size}")
    counts = torch.zeros(target_vocab, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(torch.tensor(s.ids[s.prompt_len :], dtype=torch.long), minlength=target_vocab)
    order = torch.argsort(-counts, stable=True)  # [V_t] most frequent first
    return torch.sort(order[:size]).values


# ------------------------------------------------------------------------------------------------
# the draft model: frontier's EAGLE-3 layer, batched, with the public parameter names
# ------------------------------------------------------------------------------------------------
class DraftModel(torch.nn.Module):
    """EAGLE-3 draft head whose ``state_dict`` keys are the published ones."""

    def __init__(self, cfg: FrontierConfig, embed: torch.Tensor, lm_head_init: torch.Tensor) -> None:
        super().__init__()
        h, qd, kvd = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.cfg = cfg
        self.fc = lin(cfg.feature_size, h)
        self.midlayer = torch.nn.Module()
        self.midlayer.self_attn = torch.nn.ModuleDict(
            dict(q_proj=lin(2 * h, qd), k_proj=lin(2 * h, kvd), v_proj=lin(2 * h, kvd), o_proj=lin(qd, h))
        )
        inter = cfg.intermediate_size
        self.midlayer.mlp = torch.nn.ModuleDict(dict(gate_proj=lin(h, inter), up_proj=lin(h, inter), down_proj=lin(inter, h)))
        for name in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
            setattr(self.midlayer, name, _Norm(h))
        self.norm = _Norm(h)
        self.lm_head = lin(h, cfg.vocab_size)
        with torch.no_grad():
            self.lm_head.weight.copy_(lm_head_init)
        self.register_buffer("embed", embed.detach().clone(), persistent=False)  # [V_t, H], frozen

    def step(
        self, tokens: torch.Tensor, hidden: torch.Tensor, offset: int, past: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One unrolled step over all rows. tokens [B, n]; hidden [B, n, H] (fc applied);
        positions ``arange(n) + offset``; past: step 0's K/V (causal) then steps 1..k-1's (own row).
        Returns (layer output h2 [B, n, H], this step's (k, v) [B, nkv, n, d])."""
        cfg, layer, eps = self.cfg, self.midlayer, self.cfg.rms_norm_eps
        att = layer.self_attn
        bsz, n, _ = hidden.shape
        emb = self.embed[tokens].to(hidden.dtype)  # [B, n, H]
        x = torch.cat(
            (ref.rms_norm(emb, layer.input_layernorm.weight, eps), ref.rms_norm(hidden, layer.hidden_norm.weight, eps)), dim=-1
        )  # [B, n, 2H]
        positions = torch.arange(offset, offset + n, device=hidden.device)
        cos, sin = ref.rope_cos_sin(cfg, positions, hidden.dtype)  # [n, d]
        heads = lambda t, nh: t.view(bsz, n, nh, cfg.head_dim).transpose(1, 2)  # noqa: E731  [B, nh, n, d]
        q = ref.apply_rope(heads(att["q_proj"](x), cfg.num_attention_heads), cos, sin)
        k = ref.apply_rope(heads(att["k_proj"](x), cfg.num_key_value_heads), cos, sin)
        v = heads(att["v_proj"](x), cfg.num_key_value_heads)
        if not past:  # step 0: causal over its own rows
            context, own = (k, v), []
        else:  # step k: step 0's rows causally, and this row's keys of steps 1..k
            context, own = past[0], past[1:] + [(k, v)]
        h1 = hidden + att["o_proj"](_ttt_attention(cfg, q, context, own))  # [B, n, H]
        mlp = SimpleNamespace(**{name: m.weight for name, m in layer.mlp.items()})
        h2 = h1 + ref.mlp(mlp, ref.rms_norm(h1, layer.post_attention_layernorm.weight, eps))  # [B, n, H]
        return h2, (k, v)

    def log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """[..., V] draft log-probabilities of layer outputs h [..., H] (fp32)."""
        return torch.log_softmax(self.lm_head(ref.rms_norm(h, self.norm.weight, self.cfg.rms_norm_eps)).float(), dim=-1)

    def unroll(self, feats: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The training-time test. feats [B, n, F]; ids [B, m >= n] (right-padded). Row p of step k
        takes token ``ids[p + k + 1]`` (0 past the end); returns per step log-probs [B, n, V]."""
        hidden = self.fc(feats.to(self.fc.weight.dtype))  # [B, n, H]
        n = feats.shape[1]
        past: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = []
        for k in range(steps):
            tokens = F.pad(ids[:, k + 1 :], (0, k + 1))[:, :n]  # [B, n]
            hidden, kv = self.step(tokens, hidden, k, past)
            past.append(kv)
            out.append(self.log_probs(hidden))
        return out


class _Norm(torch.nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))


def _ttt_attention(
    cfg: FrontierConfig, q: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor], own: list[tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """Attention of step k's queries q [B, nh, n, d]: causal over step 0's (keys, values)
    ``context`` ([B, nkv, n, d] each), plus each row's own key of steps 1..k (``own``, empty at
    step 0). Scores, mask and softmax as :func:`frontier.backends.torch_ref.layer.attention`.
    Returns [B, n, nh*d]."""
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    rep = lambda t: t.repeat_interleave(groups, dim=1)  # noqa: E731  [B, nh, n, d]
    bsz, nh, n, d = q.shape
    scale = math.sqrt(d)
    k0, v0 = rep(context[0]), rep(context[1])
    scores = [(torch.matmul(q, k0.transpose(-1, -2)) / scale).float() + ref.causal_mask(n, 0, q.device)]  # [B, nh, n, n]
    values = []
    for kj, vj in own:
        scores.append(((q * rep(kj)).sum(-1, keepdim=True) / scale).float())  # [B, nh, n, 1]
        values.append(rep(vj))
    probs = F.softmax(torch.cat(scores, dim=-1), dim=-1, dtype=torch.float32).to(q.dtype)  # [B, nh, n, n + k]
    out = torch.matmul(probs[..., :n], v0)  # [B, nh, n, d]
    for j, vj in enumerate(values):
        out = out + probs[..., n + j : n + j + 1] * vj
    return out.transpose(1, 2).reshape(bsz, n, nh * d)


# ------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------
@dataclass
class Batch:
    feats: torch.Tensor  # [B, n, F]
    ids: torch.Tensor  # [B, n]
    target_p: torch.Tensor  # [B, n, V] the target's next-token distribution over the draft vocabulary at each row
    target_negent: torch.Tensor  # [B, n] sum p log p of that distribution
    target_top1: torch.Tensor  # [B, n] its most likely draft token
    label_ok: torch.Tensor  # [B, n] rows whose next token is an answer token


def make_batch(data: Features, rows: list[int], lm_head_draft: torch.Tensor, max_len: int) -> Batch:
    """Right-pad the samples ``rows`` (cut to ``max_len``) into one batch."""
    lens = [min(len(data.ids[r]), max_len) for r in rows]
    n, dev = max(lens), data.ids[rows[0]].device
    pad = lambda ts: torch.nn.utils.rnn.pad_sequence([t[:m] for t, m in zip(ts, lens)], batch_first=True)  # noqa: E731
    feats = pad([data.feats[r] for r in rows])  # [B, n, F]
    final = pad([data.final[r] for r in rows])  # [B, n, H]
    ids = pad([data.ids[r] for r in rows])  # [B, n]
    logits = torch.matmul(final.to(lm_head_draft.dtype), lm_head_draft.T)  # [B, n, V]
    cols = torch.arange(n, device=dev)[None]  # [1, n]
    plen = torch.tensor([data.prompt_lens[r] for r in rows], device=dev)[:, None]  # [B, 1]
    label_ok = (cols >= plen - 1) & (cols < torch.tensor(lens, device=dev)[:, None])  # [B, n]
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, n, V]
    p = logp.exp()
    return Batch(feats, ids, p, (p * logp).sum(-1), logp.argmax(-1), label_ok)


def ttt_loss(model: DraftModel, batch: Batch, steps: int, decay: float) -> tuple[torch.Tensor, list[float], list[float]]:
    """Sum over steps k of ``decay**k`` x the mean forward KL(target || draft) of step k's rows
    (the soft cross-entropy minus the target's entropy: the same gradient, 0 when the draft is
    the target); also per step that KL and the top-1 agreement with the target."""
    total = torch.zeros((), device=batch.feats.device)
    losses, accs = [], []
    shift = lambda t, k: t[:, k + 1 :]  # noqa: E731  the label of row p at step k is row p + k + 1
    for k, logp in enumerate(model.unroll(batch.feats, batch.ids, steps)):
        m = batch.ids.shape[1] - k - 1  # rows that have a label
        ok = shift(batch.label_ok, k)  # [B, m]
        if m < 1 or not bool(ok.any()):
            break
        kl = shift(batch.target_negent, k) - (shift(batch.target_p, k) * logp[:, :m]).sum(-1)  # [B, m]
        loss = kl[ok].mean()
        total = total + decay**k * loss
        losses.append(float(loss.detach()))
        accs.append(float((logp[:, :m].argmax(-1) == shift(batch.target_top1, k))[ok].float().mean()))
    return total, losses, accs


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak``, then cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(model: DraftModel, data: Features, rows: list[int], lm_head_draft: torch.Tensor, args: argparse.Namespace) -> dict:
    """Per-step KL and top-1 agreement on the samples ``rows`` (held out of training), averaged over batches."""
    autocast = args.device.startswith("cuda") and args.train_dtype == "bfloat16"
    kls, accs = [], []
    for start in range(0, len(rows), args.batch_size):
        batch = make_batch(data, rows[start : start + args.batch_size], lm_head_draft, args.max_len)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            _, kl, acc = ttt_loss(model, batch, args.ttt_steps, args.step_decay)
        kls.append(kl)
        accs.append(acc)
    mean = lambda xs: [sum(c) / len(c) for c in zip(*xs)]  # noqa: E731  per step, over batches
    return {"kl": mean(kls), "acc": mean(accs)}


def train(
    model: DraftModel, data: Features, train_rows: list[int], val_rows: list[int], lm_head_draft: torch.Tensor,
    args: argparse.Namespace, log: Any,
) -> list[dict]:
    """AdamW over ``args.steps`` batches of ``args.batch_size`` of the samples ``train_rows`` in a
    seeded order; at every ``args.log_every`` steps, the per-step agreement on ``val_rows``."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    order_gen = torch.Generator().manual_seed(args.seed)
    order: list[int] = []
    history = []
    autocast = args.device.startswith("cuda") and args.train_dtype == "bfloat16"
    warmup = max(1, args.steps // 20)
    for step in range(args.steps):
        if len(order) < args.batch_size:
            order += [train_rows[i] for i in torch.randperm(len(train_rows), generator=order_gen).tolist()]
        rows, order = order[: args.batch_size], order[args.batch_size :]
        batch = make_batch(data, rows, lm_head_draft, args.max_len)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, warmup)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss, losses, accs = ttt_loss(model, batch, args.ttt_steps, args.step_decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        history.append({"step": step, "loss": float(loss.detach()), "step_loss": losses, "step_acc": accs})
        if step % args.log_every == 0 or step == args.steps - 1:
            line = f"step {step:5d}  kl {history[-1]['loss']:.4f}  acc " + " ".join(f"{a:.3f}" for a in accs)
            if val_rows:
                history[-1]["val"] = evaluate(model, data, val_rows, lm_head_draft, args)
                line += "  | held-out acc " + " ".join(f"{a:.3f}" for a in history[-1]["val"]["acc"])
            log(line)
    return history


# ------------------------------------------------------------------------------------------------
# the config, saving and the check against frontier's torch_ref
# ------------------------------------------------------------------------------------------------
def head_config(target_config: Any, draft_vocab: int, intermediate: Optional[int]) -> FrontierConfig:
    """The head's dimensions: the target's hidden size, heads, RoPE and norm epsilon."""
    c = target_config
    rope = getattr(c, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") not in ("default", None):
        raise ValueError(f"target rope_parameters {rope} are not supported; the head drafts with plain RoPE")
    return FrontierConfig(
        total_token=2, depth=1, top_k=1, vocab_size=draft_vocab, target_vocab_size=int(c.vocab_size),
        hidden_size=int(c.hidden_size), num_attention_heads=int(c.num_attention_heads),
        num_key_value_heads=int(c.num_key_value_heads),
        head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads),
        intermediate_size=int(intermediate or c.intermediate_size), feature_size=3 * int(c.hidden_size),
        rope_theta=float(theta), rms_norm_eps=float(c.rms_norm_eps), architecture="eagle3",
    )


def to_draft_weights(model: DraftModel, vocab_ids: torch.Tensor, dtype: torch.dtype) -> DraftWeights:
    """The trained head as :class:`DraftWeights` (``d2t`` offsets when the vocabulary is smaller)."""
    state = {k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}
    small = model.cfg.vocab_size < model.cfg.target_vocab_size
    if small:
        state["d2t"] = vocab_ids.cpu() - torch.arange(len(vocab_ids))  # target = draft + d2t[draft]
    return DraftWeights.from_state_dict(state, architecture="eagle3", embed_tokens=model.embed.to("cpu", dtype))


def save_head(model: DraftModel, vocab_ids: torch.Tensor, out: Path, dtype: torch.dtype) -> Path:
    weights = to_draft_weights(model, vocab_ids, dtype)
    nbytes = sum(t.numel() * t.element_size() for k, t in weights.tensors() if k != "embed_tokens.weight")
    shards = max(1, math.ceil(nbytes / MAX_FILE_BYTES))
    return save_draft_head(weights, model.cfg, out, shards=shards, overwrite=True)


@torch.no_grad()
def check_saved_head(
    model: DraftModel, head_dir: Path, target: Any, data: Features, vocab_ids: torch.Tensor, rows: int = 8
) -> dict:
    """Load the saved head with ``load_draft_head`` (fp32, CPU) and run the training forward with
    its weights (fp32) on one sample: step 0 over its first rows and step 1 at one row (a depth-1
    tree node) against frontier's torch_ref layer, and
    the top-1 draft token at the last of those rows against the depth-1 nodes that
    ``frontier_generate(backend="torch_ref")`` drafts there."""
    head = load_draft_head(head_dir, target=target, dtype=torch.float32, device="cpu")
    cfg = head.config(total_token=8, depth=2, top_k=4)
    saved = {k: v for k, v in head.weights.state_dict().items() if k not in ("embed_tokens.weight", "d2t")}
    ref_model = DraftModel(model.cfg, head.weights.embed_tokens, saved["lm_head.weight"])
    ref_model.load_state_dict(saved)  # the training forward with the saved (possibly rounded) weights
    n = min(rows, len(data.ids[0]) - 1)
    if n < 2:
        raise ValueError("the first training sample is too short to check the saved head (fewer than 3 tokens)")
    feats, ids = data.feats[0][:n].float().cpu(), data.ids[0][: n + 1].cpu()  # [n, F], [n + 1]
    train_steps = ref_model.unroll(feats[None], ids[None], 2)
    train_logp, train_step1 = train_steps[0][0], train_steps[1][0]  # [n, V] each
    past = [torch.zeros(cfg.num_key_value_heads, 0, cfg.head_dim)]
    mask = ref.causal_mask(n, 0, torch.device("cpu"))
    out = ref.draft_forward(cfg, head.weights, ids[1 : n + 1], feats, torch.arange(n), past, list(past), mask)
    frontier_logp = ref.log_probs(cfg, head.weights, out.hidden)  # [n, V]
    # step 1 at row p = a depth-1 tree node under root row p: token p + 2, the root row's output,
    # position p + 1, attending to context rows 0..p and itself
    p = n - 2
    node = ref.draft_forward(
        cfg, head.weights, ids[p + 2 : p + 3], out.hidden[p : p + 1], torch.tensor([p + 1]),
        [out.keys[0][:, : p + 1]], [out.values[0][:, : p + 1]], None,
    )
    node_logp = ref.log_probs(cfg, head.weights, node.hidden)[0]  # [V]
    diff = float(torch.maximum((frontier_logp - train_logp).abs().max(), (node_logp - train_step1[p]).abs().max()))
    top_train = int(vocab_ids[train_logp[n - 1].argmax()])  # the training forward's top-1 (a target id) at the root row
    fr = frontier_generate(cfg, feats[None], backend="torch_ref", input_ids=ids[None, : n + 1], weights=head.weights)
    depth1 = fr.draft_tokens[0][fr.tree_position_ids == 1].tolist()
    return {
        "max_abs_logprob_diff": diff,
        "top1_agree": bool((frontier_logp.argmax(-1) == train_logp.argmax(-1)).all()),
        "root_top1_in_tree": top_train in depth1,
    }


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--target", required=True, help="local Hugging Face directory of the target (tokenizer, chat template)")
    p.add_argument("--out", required=True, help="directory the head is written to")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSONL file, one {'prompt': ...} per line")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer length the target generates per prompt")
    p.add_argument("--gen-batch", type=int, default=256, help="prompts per target.generate call")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy answers; > 0: seeded sampling")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--target-dtype", choices=sorted(_DTYPES), default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--train-dtype", choices=sorted(_DTYPES), default="bfloat16",
                   help="autocast dtype on CUDA (CPU trains in float32)")
    p.add_argument("--save-dtype", choices=sorted(_DTYPES), default="bfloat16")
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size (0: the target's whole vocabulary)")
    p.add_argument("--intermediate-size", type=int, default=None, help="MLP width (default: the target's)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per training step")
    p.add_argument("--max-len", type=int, default=512, help="rows per sequence used in training")
    p.add_argument("--ttt-steps", type=int, default=5, help="unrolled draft steps (training-time test)")
    p.add_argument("--step-decay", type=float, default=0.8, help="loss weight of step k is decay**k")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--val-fraction", type=float, default=0.05, help="answers held out of training to report agreement on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    args = p.parse_args(argv)
    for name in ("max_new_tokens", "gen_batch", "steps", "batch_size", "max_len", "ttt_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not 0.0 <= args.val_fraction < 1.0:
        p.error(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.draft_vocab < 0:
        p.error(f"--draft-vocab must be >= 0, got {args.draft_vocab}")
    return args


def load_target(path: str, device: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoTokenizer, LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"target {path!r}: the tokenizer has no chat template")
    return target, tokenizer


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    torch.manual_seed(args.seed)
    target_dtype = _DTYPES[args.target_dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")]
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    target, tokenizer = load_target(args.target, args.device, target_dtype)
    prompts = chat_ids(tokenizer, read_prompts(Path(args.prompts), args.num_prompts))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids(target) or {0})
    samples = generate_answers(
        target, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch,
        temperature=args.temperature, seed=args.seed, pad_id=pad_id,
    )
    _sync(args.device)
    times["generate_s"] = time.perf_counter() - t0
    answer_tokens = sum(len(s.ids) - s.prompt_len for s in samples)
    log(f"data: {len(samples)} answers, {answer_tokens} answer tokens in {times['generate_s']:.1f} s")

    t0 = time.perf_counter()
    data = extract_features(target, samples, batch_size=max(1, args.gen_batch // 4), store_dtype=target_dtype)
    _sync(args.device)
    times["features_s"] = time.perf_counter() - t0

    vt = int(target.config.vocab_size)
    vocab_ids = draft_vocabulary(samples, args.draft_vocab or vt, vt).to(args.device)  # [V]
    answer = torch.cat([torch.tensor(s.ids[s.prompt_len :]) for s in samples])
    coverage = float(torch.isin(answer, vocab_ids.cpu()).float().mean())
    log(f"draft vocabulary {len(vocab_ids)} of {vt}: covers {100 * coverage:.2f}% of the answer tokens")
    cfg = head_config(target.config, len(vocab_ids), args.intermediate_size)
    lm_head_t = target.get_output_embeddings().weight.detach().float()  # [V_t, H]
    lm_head_draft = lm_head_t[vocab_ids]  # [V, H]
    torch.manual_seed(args.seed)
    model = DraftModel(cfg, target.get_input_embeddings().weight.detach().float(), lm_head_draft).to(args.device)

    n_val = int(len(samples) * args.val_fraction)
    split = torch.randperm(len(samples), generator=torch.Generator().manual_seed(args.seed + 1)).tolist()
    val_rows, train_rows = sorted(split[:n_val]), sorted(split[n_val:])
    if not train_rows:
        raise ValueError(f"--val-fraction {args.val_fraction} leaves no answer to train on ({len(samples)} answers)")
    t0 = time.perf_counter()
    history = train(model, data, train_rows, val_rows, lm_head_draft, args, log)
    _sync(args.device)
    times["train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    out = save_head(model, vocab_ids, Path(args.out), _DTYPES[args.save_dtype])
    check = check_saved_head(model.float(), out, target, data, vocab_ids.cpu())
    times["save_check_s"] = time.perf_counter() - t0
    log(f"saved {out}; frontier torch_ref vs training forward: {check}")
    first, last = history[0], history[-1]
    summary = {
        "target": str(args.target), "head": str(out), "args": vars(args), "samples": len(samples),
        "answer_tokens": answer_tokens, "draft_vocab": len(vocab_ids), "vocab_coverage": coverage,
        "first_loss": first["loss"], "last_loss": last["loss"],
        "last_step_acc": last["step_acc"], "held_out": last.get("val"), "held_out_samples": len(val_rows),
        "check": check, "times": times,
        "loss_curve": [h["loss"] for h in history],
    }
    (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    log("times: " + "  ".join(f"{k} {v:.1f}" for k, v in times.items()))
    return summary


if __name__ == "__main__":
    main()
