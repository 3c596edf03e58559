"""Lossless speculative generation with a Hugging Face causal-LM target.

One call, the target's own output, faster::

    from frontier import generate
    out = generate(target, input_ids, cfg=cfg, weights=weights, backend="torch_ref", max_new_tokens=64)
    out.sequences          # [1, P + N], what target.generate(...) returns
    print(out.stats.table())

The loop (EAGLE-2/EAGLE-3 dynamic trees):

1. Prefill: one target forward over the prompt (P tokens). Its last logits give the first
   new token (the first tree root); its features (EAGLE-3: the hidden states entering layers
   2, L//2 and L-3, concatenated; EAGLE-2: the final, normed hidden state) seed the drafter.
2. Draft: ``frontier_generate`` builds a tree of T tokens rooted at the last new token.
3. Verify: ONE target forward over the T tree tokens at positions ``context + tree_position_ids``,
   attending to the whole cached context plus the tree mask (an additive 4-D mask). The target
   KV cache grows by T rows.
4. Accept (on the device, see :func:`greedy_accept` / :func:`sampling_accept`): the deepest
   tree node whose whole path the target agrees with, plus the target's next token. One small
   host read per step fetches how many tokens were accepted and which ones.
5. Compact: the accepted path's K/V rows move to the end of the context, the rest is dropped.
   The accepted rows' target features, with the new root token, feed the next draft call.
   (The draft cache never holds tree rows, so it needs no compaction: the next draft call
   appends the accepted rows' draft K/V from their target features.)

Batches (a list of ragged prompts, or a padded [B, P] tensor with its attention_mask) run the
same loop for all sequences at once: one draft call (``frontier_generate`` with per-sequence
lists) and one target forward per step, over one padded target KV buffer with per-sequence
lengths; see :meth:`SpeculativeGenerator._generate_batch`.

Greedy verification accepts exactly the tokens the target's argmax would produce, so the output
equals ``target.generate(do_sample=False)``. Sampling verification is EAGLE's tree rejection
scheme: at each accepted node the children are tried in node order, child ``x`` is accepted with
probability ``p(x)`` under the target's (warped) distribution renormalised after the earlier
siblings' rejections, and if all are rejected the next token is drawn from the residual. With a
deterministic draft this leaves the output distribution exactly the target's.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np
import torch

from .api import frontier_generate
from .config import FrontierConfig
from .errors import FrontierError, InputError, NonFiniteError
from .registry import get_backend
from .request import check_options
from .weights import DraftWeights

__all__ = [
    "generate",
    "BatchGenerationResult",
    "BatchGenerationStats",
    "SpeculativeGenerator",
    "GenerationResult",
    "GenerationStats",
    "SamplingParams",
    "eagle3_tap_layers",
    "greedy_accept",
    "greedy_accept_batch",
    "sampling_accept",
    "tree_parents",
    "warp_logits",
]


# ----------------------------------------------------------------------------------------------
# Stats
# ----------------------------------------------------------------------------------------------
def _time_rows(stats: Any) -> list[tuple[str, str]]:
    """The time split of a stats object (prefill, draft, verify, other, total) as table rows."""
    total = stats.time_total or 1e-12

    def pct(t: float) -> str:
        return f"{t * 1e3:9.1f} ms  ({100 * t / total:5.1f}%)"

    return [
        ("time prefill", pct(stats.time_prefill)),
        ("time draft", pct(stats.time_draft)),
        ("time verify", pct(stats.time_verify)),
        ("time other", pct(stats.time_other)),
        ("time total", f"{stats.time_total * 1e3:9.1f} ms"),
    ]


def _two_columns(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


@dataclass
class GenerationStats:
    """What one :meth:`SpeculativeGenerator.generate` call did and how long it took.

    ``accepted_lengths`` holds, per verify forward, the tokens it produced: the accepted draft
    tokens plus the target's own next token (EAGLE's "accept length" tau counts the same way),
    so ``mean_accepted_length`` is 1.0 when no draft token is ever accepted.
    """

    backend: str = ""
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0  # prefill + verify forwards
    draft_calls: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    time_total: float = 0.0
    stop_reason: str = ""

    @property
    def verify_steps(self) -> int:
        return len(self.accepted_lengths)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verify forward (accepted draft tokens + 1); 0.0 before the first verify."""
        if not self.accepted_lengths:
            return 0.0
        return sum(self.accepted_lengths) / len(self.accepted_lengths)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            verify_steps=self.verify_steps,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_second=self.tokens_per_second,
        )
        return d

    def table(self) -> str:
        """A small two-column text table of the headline numbers."""
        rows = [
            ("backend", self.backend),
            ("prompt tokens", str(self.prompt_tokens)),
            ("new tokens", str(self.new_tokens)),
            ("target forwards", f"{self.target_forwards} (1 prefill + {self.verify_steps} verify)"),
            ("mean accepted length", f"{self.mean_accepted_length:.3f} tokens / verify"),
            ("tokens/s", f"{self.tokens_per_second:.1f}"),
            *_time_rows(self),
            ("stopped by", self.stop_reason),
        ]
        return _two_columns(rows)


@dataclass
class GenerationResult:
    """``sequences`` [1, P + N] (prompt + new tokens, like ``target.generate``) and the stats."""

    sequences: torch.Tensor
    prompt_length: int
    stats: GenerationStats

    @property
    def new_tokens(self) -> torch.Tensor:
        """[1, N] the generated tokens only."""
        return self.sequences[:, self.prompt_length :]


@dataclass
class BatchGenerationStats:
    """What one batched :meth:`SpeculativeGenerator.generate` call did.

    ``sequences[b]`` is sequence b's own :class:`GenerationStats` (its new tokens, accepted
    lengths, stop reason, the forwards it took part in; its times are the batch's, since the
    sequences share every forward). ``target_forwards`` / ``draft_calls`` count BATCHED calls:
    one prefill plus one verify forward per step for all active sequences at once, and one
    draft call per step. ``active`` holds how many sequences took part in each step.
    """

    backend: str = ""
    batch_size: int = 0
    sequences: list[GenerationStats] = field(default_factory=list)
    target_forwards: int = 0
    draft_calls: int = 0
    active: list[int] = field(default_factory=list)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    time_total: float = 0.0

    @property
    def verify_steps(self) -> int:
        return len(self.active)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.sequences)

    @property
    def new_tokens(self) -> int:
        """New tokens over the whole batch."""
        return sum(s.new_tokens for s in self.sequences)

    @property
    def new_tokens_per_sequence(self) -> list[int]:
        return [s.new_tokens for s in self.sequences]

    @property
    def stop_reasons(self) -> list[str]:
        return [s.stop_reason for s in self.sequences]

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per (sequence, verify step) pair, over the whole batch; 0.0 before any verify."""
        n = sum(len(s.accepted_lengths) for s in self.sequences)
        return sum(sum(s.accepted_lengths) for s in self.sequences) / n if n else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens of all sequences per second of the whole call."""
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sequences"] = [s.to_dict() for s in self.sequences]
        d.update(
            verify_steps=self.verify_steps,
            prompt_tokens=self.prompt_tokens,
            new_tokens=self.new_tokens,
            new_tokens_per_sequence=self.new_tokens_per_sequence,
            stop_reasons=self.stop_reasons,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_second=self.tokens_per_second,
        )
        return d

    def table(self) -> str:
        """A small text table: the batch's headline numbers, then one line per sequence."""
        rows = [
            ("backend", self.backend),
            ("batch size", str(self.batch_size)),
            ("prompt tokens", str(self.prompt_tokens)),
            ("new tokens", f"{self.new_tokens} ({' + '.join(map(str, self.new_tokens_per_sequence))})"),
            ("target forwards", f"{self.target_forwards} batched (1 prefill + {self.verify_steps} verify)"),
            ("mean accepted length", f"{self.mean_accepted_length:.3f} tokens / verify / sequence"),
            ("tokens/s", f"{self.tokens_per_second:.1f} (all sequences)"),
            *_time_rows(self),
        ]
        for b, s in enumerate(self.sequences):
            rows.append(
                (f"sequence {b}", f"{s.prompt_tokens} + {s.new_tokens} tokens, {s.mean_accepted_length:.3f} / verify, "
                 f"stopped by {s.stop_reason}")
            )
        return _two_columns(rows)


@dataclass
class BatchGenerationResult:
    """One :class:`GenerationResult` per prompt (``results[b].sequences`` is [1, P_b + N_b], what
    batch-1 generation returns for prompt b) and the batch's stats."""

    results: list[GenerationResult]
    stats: BatchGenerationStats

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, b: int) -> GenerationResult:
        return self.results[b]

    def __iter__(self):
        return iter(self.results)

    @property
    def sequences(self) -> list[torch.Tensor]:
        """Per prompt, [1, P_b + N_b] prompt + new tokens."""
        return [r.sequences for r in self.results]

    @property
    def new_tokens(self) -> list[torch.Tensor]:
        """Per prompt, [1, N_b] the generated tokens only."""
        return [r.new_tokens for r in self.results]

    def padded(self, pad_token_id: int = 0, padding_side: str = "right") -> torch.Tensor:
        """[B, max_b(P_b + N_b)] the sequences padded with ``pad_token_id`` on ``padding_side``."""
        if padding_side not in ("left", "right"):
            raise InputError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        seqs = self.sequences
        n = max(s.shape[1] for s in seqs)
        out = seqs[0].new_full((len(seqs), n), int(pad_token_id))
        for b, s in enumerate(seqs):
            if padding_side == "right":
                out[b, : s.shape[1]] = s[0]
            else:
                out[b, n - s.shape[1] :] = s[0]
        return out


# ----------------------------------------------------------------------------------------------
# Sampling parameters and logits warping (Hugging Face generate's definitions and order)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingParams:
    """``temperature <= 1e-5`` means greedy. ``top_k=0`` and ``top_p=1.0`` switch those off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5

    def check(self) -> "SamplingParams":
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise InputError(
                f"temperature must be a finite number >= 0 (0 = greedy), got temperature={self.temperature!r}"
            )
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p must be a number in (0, 1] (1 = off), got top_p={self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InputError(f"top_k must be an int >= 0 (0 = off), got top_k={self.top_k!r}")
        return self

    @classmethod
    def of(cls, temperature: Any, top_p: Any, top_k: Any) -> "SamplingParams":
        """Checked parameters from a caller's values (ints and floats; never strings or bools)."""
        params = cls(temperature, top_p, top_k).check()
        return cls(float(params.temperature), float(params.top_p), int(params.top_k))


def _is_real(x: Any) -> bool:
    """A real number: an int or a float (numpy's too), never a bool or a string."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _is_int(x: Any) -> bool:
    """An integer (numpy's too), never a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as ``transformers``' generate applies them.

    logits: [R, V] (any number of rows; each row independent). Returns float32 [R, V] logits
    with filtered entries at -inf.
    """
    x = logits.float() / params.temperature  # [R, V]
    v = x.shape[-1]
    if params.top_k > 0 and params.top_k < v:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [R, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)  # ascending, like HF
        cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)  # [R, V]
        remove_sorted = cum <= (1.0 - params.top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        x = x.masked_fill(remove, float("-inf"))
    return x


# ----------------------------------------------------------------------------------------------
# Tree verification, on the device
# ----------------------------------------------------------------------------------------------
def tree_parents(tree_mask: torch.Tensor) -> torch.Tensor:
    """[T] parent position of every node (root -> 0), from the [1, 1, T, T] ancestor mask.

    Ancestors precede their descendants, so a node's parent is its largest strict ancestor.
    """
    m = tree_mask[0, 0] > 0  # [T, T]
    t = m.shape[0]
    cols = torch.arange(t, device=m.device)  # [T]
    strict = m & (cols[None, :] < cols[:, None])  # [T, T]
    return torch.where(strict, cols[None, :], torch.zeros_like(cols)[None, :]).amax(dim=1)  # [T]


def _path_of(mask: torch.Tensor, node: torch.Tensor, width: int) -> torch.Tensor:
    """[width] positions root -> node (ascending ancestors), padded with T."""
    t = mask.shape[0]
    cols = torch.arange(t, device=mask.device)
    keyed = torch.where(mask[node], cols, torch.full_like(cols, t))  # [T]
    return torch.sort(keyed).values[:width]  # [width]


def greedy_accept(
    logits: torch.Tensor, draft_tokens: torch.Tensor, tree_mask: torch.Tensor, depth: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of one tree, with no host read.

    logits: [T, V] target logits of the tree nodes; draft_tokens: [T] (root first);
    tree_mask [1, 1, T, T]; depth [T] (tree_position_ids); width >= 1 + max depth.
    A node is accepted when every node on its path (root excluded) is the target's argmax at
    its parent. Returns (best [] deepest accepted node, path [width] positions root -> best
    padded with T, next_token [] the target's argmax at best). The accepted draft tokens are
    ``draft_tokens[path[1 : depth[best] + 1]]``.
    """
    m = tree_mask[0, 0] > 0  # [T, T]
    parent = tree_parents(tree_mask)  # [T]
    target_next = logits.argmax(dim=-1)  # [T] argmax is the first maximum, like generate
    ok = draft_tokens == target_next[parent]  # [T]
    ok[0] = True  # the root was produced by the target itself
    accepted = ~(m & ~ok[None, :]).any(dim=1)  # [T] whole path agrees
    best = torch.where(accepted, depth, torch.full_like(depth, -1)).argmax()  # [] unique deepest
    return best, _path_of(m, best, width), target_next[best]


def greedy_accept_batch(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    tree_masks: torch.Tensor,
    depth: torch.Tensor,
    width: int,
    valid: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`greedy_accept` for B trees at once (same result per tree), with no host read.

    logits [B, T, V]; draft_tokens [B, T]; tree_masks [B, T, T] bool (ancestors-or-self);
    depth [B, T]; valid [B, T] bool marks real nodes when trees of different sizes share T
    (padding nodes are never accepted). Returns (best [B], path [B, width] padded with T,
    next_token [B]).
    """
    bsz, t = draft_tokens.shape
    m = tree_masks  # [B, T, T]
    cols = torch.arange(t, device=m.device)  # [T]
    strict = m & (cols[None, :] < cols[:, None])[None]  # [B, T, T]
    parent = torch.where(strict, cols, torch.zeros_like(cols)).amax(dim=2)  # [B, T]
    target_next = logits.argmax(dim=-1)  # [B, T]
    ok = draft_tokens == target_next.gather(1, parent)  # [B, T]
    ok[:, 0] = True  # the roots were produced by the target itself
    if valid is not None:
        ok &= valid
    accepted = ~(m & ~ok[:, None, :]).any(dim=2)  # [B, T] whole path agrees
    best = torch.where(accepted, depth, torch.full_like(depth, -1)).argmax(dim=1)  # [B]
    on_path = m.gather(1, best[:, None, None].expand(bsz, 1, t))[:, 0]  # [B, T] ancestors-or-self of best
    keyed = torch.where(on_path, cols, torch.full_like(cols, t))  # [B, T]
    path = torch.sort(keyed, dim=1).values[:, :width]  # [B, width]
    return best, path, target_next.gather(1, best[:, None])[:, 0]


def sampling_accept(
    probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    tree_mask: torch.Tensor,
    depth: torch.Tensor,
    width: int,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampling verification of one tree (EAGLE's tree rejection scheme), with no host read.

    probs: [T, V] the target's warped next-token distribution at every node. Walking down from
    the root, the children of the current node are tried in node order; child ``x`` is accepted
    with probability ``p(x) / (1 - sum of p over the siblings tried before it)``; the first
    accepted child becomes the current node. When every child is rejected (or the node is a
    leaf) the next token is drawn from the residual ``p`` with the tried children removed. All
    coin flips are drawn at once (one uniform per node), so the walk is a few tensor ops.
    Returns (best, path, next_token) like :func:`greedy_accept`.
    """
    t = draft_tokens.shape[0]
    m = tree_mask[0, 0] > 0  # [T, T]
    parent = tree_parents(tree_mask)  # [T]
    idx = torch.arange(t, device=probs.device)
    is_child = idx > 0  # [T]
    p_self = probs[parent, draft_tokens]  # [T] p_parent(x_i)
    p_self = torch.where(is_child, p_self, torch.zeros_like(p_self))
    earlier_sib = (parent[:, None] == parent[None, :]) & (idx[None, :] < idx[:, None])  # [T, T]
    earlier_sib &= is_child[:, None] & is_child[None, :]
    tried_mass = (earlier_sib.to(probs.dtype) * p_self[None, :]).sum(dim=1)  # [T]
    accept_p = p_self / (1.0 - tried_mass).clamp_min(1e-20)  # [T]
    u = torch.rand(t, device=probs.device, generator=generator, dtype=probs.dtype)  # [T]
    ok = (u < accept_p) & is_child  # [T]
    first_ok = ok & ~(earlier_sib & ok[None, :]).any(dim=1)  # [T] the first accepted sibling
    first_ok[0] = True
    on_path = ~(m & ~first_ok[None, :]).any(dim=1)  # [T]
    best = torch.where(on_path, depth, torch.full_like(depth, -1)).argmax()  # []
    # Residual at best: its children (all tried and rejected, else a child would be deeper).
    children = (parent == best) & is_child  # [T]
    p = probs[best]  # [V]
    removed = torch.zeros_like(p).scatter_add_(0, draft_tokens, children.to(p.dtype))  # [V] > 0: a child
    residual = torch.where(removed > 0, torch.zeros_like(p), p)
    mass = residual.sum()
    residual = torch.where(mass > 1e-12, residual, p)  # rounding guard: all mass was in the children
    next_token = torch.multinomial(residual, 1, generator=generator)[0]  # [] (normalises itself)
    return best, _path_of(m, best, width), next_token


# ----------------------------------------------------------------------------------------------
# Target adapter: prefill / verify / compact on a Hugging Face causal LM
# ----------------------------------------------------------------------------------------------
def eagle3_tap_layers(num_layers: int) -> list[int]:
    """Decoder layers whose INPUT hidden states EAGLE-3 concatenates: 2, L//2, L-3.

    Like the public EAGLE target code, a layer is tapped once even if two of the three indices
    coincide (small L), in ascending order; indices outside [0, L) are dropped.
    """
    return sorted({i for i in (2, num_layers // 2, num_layers - 3) if 0 <= i < num_layers})


def _decoder_layers(target: Any) -> Any:
    base = getattr(target, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None and hasattr(target, "get_decoder"):
        layers = getattr(target.get_decoder(), "layers", None)
    if layers is None:
        raise InputError(
            f"target {type(target).__name__} has no decoder layers at .model.layers; "
            "frontier.generate supports Llama-family causal LMs"
        )
    return layers


class _TargetRunner:
    """Runs the target and captures the draft features through forward hooks."""

    SUPPORTED_ATTN = ("eager", "sdpa")

    def __init__(self, target: Any, architecture: str) -> None:
        if not isinstance(target, torch.nn.Module) or not callable(getattr(target, "forward", None)):
            raise InputError(f"target must be a Hugging Face causal LM (torch.nn.Module), got {type(target).__name__}")
        self.target = target
        cfg = getattr(target, "config", None)
        if cfg is None:
            raise InputError(f"target {type(target).__name__} has no .config")
        attn = getattr(cfg, "_attn_implementation", None) or "eager"
        if attn not in self.SUPPORTED_ATTN:
            raise InputError(
                f"target uses attn_implementation={attn!r}, which cannot take the tree's 4-D attention mask; "
                "load it with attn_implementation='sdpa' or 'eager'"
            )
        self.layers = _decoder_layers(target)
        self.num_layers = len(self.layers)
        self.hidden_size = int(cfg.hidden_size)
        head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        self.vocab_size = int(head.weight.shape[0]) if head is not None else int(cfg.vocab_size)
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.architecture = architecture
        self.taps = eagle3_tap_layers(self.num_layers) if architecture == "eagle3" else []
        self.feature_size = len(self.taps) * self.hidden_size if architecture == "eagle3" else self.hidden_size
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list[Any] = []

    # -- hooks -----------------------------------------------------------------------------
    def attach(self) -> None:
        if self._hooks:
            return
        if self.architecture == "eagle3":
            for i in self.taps:

                def pre_hook(module, args, kwargs, _i=i):
                    h = args[0] if args else kwargs.get("hidden_states")
                    self._captured[_i] = h

                self._hooks.append(self.layers[i].register_forward_pre_hook(pre_hook, with_kwargs=True))
        else:
            base = getattr(self.target, "model", None) or self.target.get_decoder()

            def post_hook(module, args, output):
                h = output[0] if isinstance(output, tuple) else getattr(output, "last_hidden_state", output)
                self._captured[-1] = h

            self._hooks.append(base.register_forward_hook(post_hook))

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._captured.clear()

    def _features(self) -> torch.Tensor:
        if self.architecture == "eagle3":
            # (.to: a target split over devices taps its layers on different ones)
            feats = torch.cat([self._captured[i].to(self.device) for i in self.taps], dim=-1)  # [1, n, k*H]
        else:
            feats = self._captured[-1].to(self.device)  # [1, n, H]
        self._captured.clear()
        return feats

    # -- forwards --------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Returns (last logits [1, V_t], features [1, P, F], cache)."""
        out = self.target(input_ids=input_ids, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        check_cache(cache)
        return out.logits[:, -1].to(self.device), self._features(), cache

    def verify(
        self, tokens: torch.Tensor, tree_mask: torch.Tensor, tree_position_ids: torch.Tensor, context: int, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over the T tree tokens. Returns (logits [T, V_t], features [1, T, F])."""
        t = tokens.shape[-1]
        neg = torch.finfo(self.dtype).min
        tree_part = torch.where(tree_mask[0, 0] > 0, 0.0, neg).to(self.dtype)  # [T, T]
        mask = torch.cat(
            [torch.zeros(t, context, dtype=self.dtype, device=self.device), tree_part], dim=1
        )[None, None]  # [1, 1, T, context + T]: full context + the tree's ancestors-or-self
        position_ids = (tree_position_ids + context)[None]  # [1, T]
        out = self.target(
            input_ids=tokens, attention_mask=mask, position_ids=position_ids, past_key_values=cache, use_cache=True
        )
        return out.logits[0].to(self.device), self._features()

    def prefill_batch(self, prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One forward over B ragged prompts (1-D each), right-padded to P = max P_b.

        Each real row attends causally to its own prompt; padding rows (position ids past the
        prompt, token 0) are masked out as keys and attend only to themselves. Returns
        (last logits [B, V_t] at each prompt's last token, features [B, P, F], cache) — the
        cache holds P rows per sequence, sequence b's valid rows being [0, P_b).
        """
        lens = [int(p.shape[0]) for p in prompts]
        bsz, p_max = len(prompts), max(lens)
        ids = torch.zeros(bsz, p_max, dtype=torch.long, device=self.device)  # [B, P] right-padded with 0
        for b, p in enumerate(prompts):
            ids[b, : lens[b]] = p
        lens_t = torch.tensor(lens, device=self.device)  # [B]
        cols = torch.arange(p_max, device=self.device)  # [P]
        key_ok = cols[None, :] < lens_t[:, None]  # [B, P] real rows
        causal = cols[None, :] <= cols[:, None]  # [P, P]
        allowed = (causal[None] & key_ok[:, None, :]) | torch.eye(p_max, dtype=torch.bool, device=self.device)[None]
        mask = torch.where(allowed, 0.0, torch.finfo(self.dtype).min).to(self.dtype)[:, None]  # [B, 1, P, P]
        position_ids = cols[None].expand(bsz, p_max)  # [B, P]
        last = sorted(set(n - 1 for n in lens))
        out = self.target(
            input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
            logits_to_keep=torch.tensor(last, device=self.device),
        )
        cache = out.past_key_values
        check_cache(cache)
        where = torch.tensor([last.index(n - 1) for n in lens], device=out.logits.device)  # [B]
        logits = out.logits[torch.arange(bsz, device=out.logits.device), where]  # [B, V]
        return logits.to(self.device), self._features(), cache

    def verify_batch(
        self, tokens: torch.Tensor, tree_masks: torch.Tensor, tree_position_ids: torch.Tensor, lengths: torch.Tensor,
        phys: int, cache: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over B trees of T tokens each, appended at the cache's physical end.

        tokens [B, T]; tree_masks [B, T, T] bool (ancestors-or-self); tree_position_ids [B, T];
        lengths [B] each sequence's valid context rows [0, len_b) of the ``phys`` cached rows.
        Returns (logits [B, T, V_t], features [B, T, F]).
        """
        bsz, t = tokens.shape
        ctx_ok = torch.arange(phys, device=self.device)[None, :] < lengths[:, None]  # [B, phys]
        allowed = torch.cat([ctx_ok[:, None, :].expand(bsz, t, phys), tree_masks], dim=2)  # [B, T, phys + T]
        mask = torch.where(allowed, 0.0, torch.finfo(self.dtype).min).to(self.dtype)[:, None]  # [B, 1, T, phys + T]
        position_ids = lengths[:, None] + tree_position_ids  # [B, T]
        out = self.target(
            input_ids=tokens, attention_mask=mask, position_ids=position_ids, past_key_values=cache, use_cache=True
        )
        return out.logits.to(self.device), self._features()


def compact_cache_batch(cache: Any, phys: int, lengths: torch.Tensor, paths: torch.Tensor, new_phys: int) -> None:
    """Batched compaction after a verify forward that appended T tree rows at ``phys``.

    Sequence b's accepted path ``paths[b, :m_b]`` (tree positions, root first; entries past m_b
    are ignored) moves to rows [len_b, len_b + m_b); then every sequence keeps ``new_phys``
    physical rows. Rows past a sequence's new length are holes, masked by the next verify.
    One gather and one scatter per layer tensor, on the device.
    """
    bsz, width = paths.shape
    dst = lengths[:, None] + torch.arange(width, device=paths.device)[None, :]  # [B, W] (<= phys + T - 1)
    for holder, ka, va in _cache_tensors(cache):
        for attr in (ka, va):
            x = getattr(holder, attr)  # [B, n_kv, phys + T, d]
            t = x.shape[2] - phys
            src = (paths.clamp(max=t - 1) + phys).to(x.device)  # [B, W]
            shape = (bsz, x.shape[1], width, x.shape[3])
            rows = x.gather(2, src[:, None, :, None].expand(shape))  # [B, n_kv, W, d]
            x.scatter_(2, dst.to(x.device)[:, None, :, None].expand(shape), rows)
            setattr(holder, attr, x[:, :, :new_phys])


def select_cache_rows(cache: Any, rows: torch.Tensor, new_phys: int) -> None:
    """Keep only the batch rows ``rows`` (the sequences still generating), trimmed to ``new_phys``."""
    for holder, ka, va in _cache_tensors(cache):
        for attr in (ka, va):
            x = getattr(holder, attr)  # [B, n_kv, phys, d]
            setattr(holder, attr, x.index_select(0, rows.to(x.device))[:, :, :new_phys])


def _cache_tensors(cache: Any) -> list[tuple[Any, str, str]]:
    """(holder, key attribute, value attribute) per layer, for the supported cache layouts."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer, "keys", "values") for layer in layers]
    if hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):  # older DynamicCache
        return [(_ListSlot(cache, i), "keys", "values") for i in range(len(cache.key_cache))]
    raise InputError(f"the target returned a {type(cache).__name__} cache, which frontier cannot compact")


class _ListSlot:
    def __init__(self, cache: Any, i: int) -> None:
        self.cache, self.i = cache, i

    @property
    def keys(self):
        return self.cache.key_cache[self.i]

    @keys.setter
    def keys(self, value):
        self.cache.key_cache[self.i] = value

    @property
    def values(self):
        return self.cache.value_cache[self.i]

    @values.setter
    def values(self, value):
        self.cache.value_cache[self.i] = value


def check_cache(cache: Any) -> None:
    """Only plain dynamic (full-attention) caches can be extended by a tree and compacted."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            name = type(layer).__name__
            if name != "DynamicLayer":
                raise InputError(
                    f"the target's cache has a {name} layer (sliding window or hybrid attention); "
                    "frontier.generate needs full attention (DynamicLayer) in every layer"
                )
    else:
        _cache_tensors(cache)


def compact_cache(cache: Any, context: int, keep: torch.Tensor) -> None:
    """Keep the tree rows ``context + keep`` (in order) right after the context; drop the rest.

    keep: [m] int64 device tensor of tree positions (the accepted path, root first). Runs on the
    cache's device: an index_select and a copy per layer, no host read.
    """
    m = keep.shape[0]
    for holder, ka, va in _cache_tensors(cache):
        for attr in (ka, va):
            x = getattr(holder, attr)  # [B, n_kv, context + T, d]
            rows = x.index_select(2, keep + context)  # [B, n_kv, m, d]
            x[:, :, context : context + m] = rows
            setattr(holder, attr, x[:, :, : context + m])


# ----------------------------------------------------------------------------------------------
# The generator
# ----------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _raise_if_invalid(flags: list[int], step: int) -> None:
    """Raise when a draft call of the loop flagged its inputs (``Frontier.invalid``): the target's
    features were non-finite (an fp16 overflow) or the draft overflowed."""
    bad = [b for b, f in enumerate(flags) if f]
    if bad:
        which = "" if len(flags) == 1 else f" (sequence(s) {bad} of the active batch)"
        raise NonFiniteError(
            f"draft call {step}{which}: the target's features or the draft head's outputs were non-finite "
            "(NaN/Inf, e.g. an fp16 overflow); generation stopped"
        )


def _as_id_set(x: Any, name: str) -> set[int]:
    """Token ids as a set of ints: None, an int, or an iterable (a tensor too) of ints >= 0."""
    if x is None:
        return set()
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.dtype == torch.bool:
            raise InputError(f"{name} must hold integer token ids, got a {x.dtype} tensor")
        x = x.flatten().tolist()
    items = list(x) if hasattr(x, "__iter__") and not isinstance(x, (str, bytes)) else [x]
    for v in items:
        if not _is_int(v) or v < 0:
            raise InputError(f"{name} must be a token id or a list of token ids (ints >= 0), got {x!r}")
    return {int(v) for v in items}


# what the generation loop passes to every draft call itself (cfg and features_concat positionally)
_LOOP_DRAFT_ARGS = ("cfg", "features_concat", "input_ids", "cache", "weights", "sampling", "padded",
                    "cache_max_length", "backend", "check_token_range")


def _check_draft_options(options: Any) -> dict[str, Any]:
    """``draft_options``: None or a dict of backend options keyed by str, none of them an
    argument the loop sets itself (InputError otherwise)."""
    if options is None:
        return {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise InputError(f"draft_options must be a dict of backend options keyed by str, got {options!r}")
    taken = sorted(k for k in options if k in _LOOP_DRAFT_ARGS)
    if taken:
        raise InputError(f"draft_options cannot set {taken}: the generation loop passes those to every draft call")
    return dict(options)


class SpeculativeGenerator:
    """A target + draft head pair that generates with EAGLE speculative decoding.

    Parameters
    ----------
    target: a Hugging Face causal LM (Llama family), eager or sdpa attention, in eval mode.
    cfg: the draft head's :class:`FrontierConfig` (tree shape: total_token, depth, top_k).
    weights: the draft head (:class:`DraftWeights`); None for weight-free backends (stub).
    backend: a registered backend name.
    padded: draft with ``padded=True`` (no host read inside the draft call); verification uses
        only the tree mask and depths, so both layouts work.
    draft_options: backend options passed to every draft call (e.g. ``{"mode": "graph"}`` for
        the triton backend's CUDA-graph launches); the loop's own arguments (input ids, cache,
        weights, sampling, layout) cannot be set here.

    The hooks that capture the target's features are attached for the duration of each
    :meth:`generate` call only.
    """

    def __init__(
        self,
        target: Any,
        cfg: FrontierConfig,
        weights: Optional[DraftWeights] = None,
        *,
        backend: str = "torch_ref",
        padded: bool = True,
        draft_options: Optional[dict[str, Any]] = None,
    ) -> None:
        if not isinstance(cfg, FrontierConfig):
            raise InputError(f"cfg must be a frontier.FrontierConfig, got {type(cfg).__name__}")
        if not isinstance(backend, str):
            raise InputError(f"backend must be a backend name (str), got {type(backend).__name__}")
        impl = get_backend(backend)
        self.requires_weights = bool(getattr(impl, "requires_weights", False))
        if self.requires_weights and weights is None:
            raise InputError(f"backend {backend!r} needs the draft head: pass weights=")
        if weights is not None and not isinstance(weights, DraftWeights):
            raise InputError(f"weights must be a frontier.DraftWeights, got {type(weights).__name__}")
        if not self.requires_weights:
            weights = None  # weight-free backends (the stub) take none
        self.cfg, self.weights, self.backend, self.padded = cfg, weights, backend, bool(padded)
        self.draft_options = _check_draft_options(draft_options)
        check_options(impl, backend, self.draft_options)  # a misspelled option fails here, not mid-generation
        self.runner = _TargetRunner(target, cfg.architecture)
        r = self.runner
        if cfg.feature_size != r.feature_size:
            if cfg.architecture == "eagle3":
                why = (
                    f"EAGLE-3 taps the hidden states entering layers {r.taps} of the target's {r.num_layers} layers, "
                    f"{len(r.taps)} x hidden_size {r.hidden_size} = {r.feature_size}"
                )
            else:
                why = f"EAGLE-2 takes the target's last hidden state, hidden_size {r.hidden_size}"
            raise InputError(
                f"draft head and target hidden sizes do not match: the head's feature_size is {cfg.feature_size} "
                f"but {why}"
            )
        if cfg.target_vocab_size != r.vocab_size:
            raise InputError(
                f"draft head and target vocabularies do not match: the head's target_vocab_size is "
                f"{cfg.target_vocab_size}, the target's lm_head has {r.vocab_size} rows"
            )
        if weights is not None:
            weights.validate(cfg)
            if weights.device != r.device:
                raise InputError(f"the draft head is on {weights.device} but the target on {r.device}; move one")
        self.feature_dtype = weights.dtype if weights is not None else r.dtype

    # ------------------------------------------------------------------------------------------
    def _check_prompt(self, input_ids: Any) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor):
            raise InputError(
                f"input_ids must be a torch.Tensor [1, P] of token ids (or a batch: [B, P] or a list of prompts), "
                f"got {type(input_ids).__name__}"
            )
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be [1, P], got shape {list(input_ids.shape)}")
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise InputError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        if input_ids.shape[0] != 1:  # batches ([B > 1, P] or lists) go through _batch_prompts
            raise InputError(
                f"input_ids has batch size {input_ids.shape[0]}: pass at least one prompt, [1, P], [B, P] or a list "
                f"of prompts (got shape {list(input_ids.shape)})"
            )
        if input_ids.shape[1] == 0:
            raise InputError("input_ids is empty: the prompt needs at least one token")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.runner.vocab_size:
            raise InputError(
                f"input_ids must lie in [0, {self.runner.vocab_size}) (the target's vocabulary), got range [{lo}, {hi}]"
            )
        return input_ids.to(device=self.runner.device, dtype=torch.long)

    def _batch_prompts(self, input_ids: Any, attention_mask: Any) -> list[torch.Tensor]:
        """The prompts of a batch as 1-D long tensors on the target's device (padding removed)."""
        if isinstance(input_ids, (list, tuple)):
            if attention_mask is not None:
                raise InputError(
                    "attention_mask goes with a padded [B, P] input_ids tensor; a list of prompts needs none"
                )
            if len(input_ids) == 0:
                raise InputError("input_ids is an empty list: pass at least one prompt")
            out = []
            for b, p in enumerate(input_ids):
                if not isinstance(p, torch.Tensor):
                    raise InputError(
                        f"input_ids[{b}] must be a torch.Tensor of token ids ([P] or [1, P]) like every prompt of "
                        f"a batch list, got {type(p).__name__}"
                    )
                if p.dim() == 2 and p.shape[0] != 1:
                    raise InputError(
                        f"input_ids[{b}] must be one prompt, [P] or [1, P], got shape {list(p.shape)} "
                        "(a list holds one prompt per entry)"
                    )
                try:
                    out.append(self._check_prompt(p)[0])
                except InputError as exc:
                    raise InputError(f"input_ids[{b}]: {exc}") from None
            return out
        if not isinstance(input_ids, torch.Tensor):
            raise InputError(
                f"input_ids must be a torch.Tensor [B, P] or a list of [P] / [1, P] prompts, got {type(input_ids).__name__}"
            )
        ids = input_ids[None] if input_ids.dim() == 1 else input_ids
        if ids.dim() != 2:
            raise InputError(f"input_ids must be [B, P], got shape {list(input_ids.shape)}")
        if attention_mask is None:
            out = []
            for b, row in enumerate(ids):
                try:
                    out.append(self._check_prompt(row)[0])
                except InputError as exc:
                    raise InputError(f"prompt {b}: {exc}") from None
            return out
        if not isinstance(attention_mask, torch.Tensor):
            raise InputError(f"attention_mask must be a torch.Tensor [B, P] of 0/1, got {type(attention_mask).__name__}")
        am = attention_mask[None] if attention_mask.dim() == 1 else attention_mask
        if am.shape != ids.shape:
            raise InputError(
                f"attention_mask must have input_ids' shape {list(ids.shape)}, got {list(attention_mask.shape)}"
            )
        if bool(((am != 0) & (am != 1)).any()):
            raise InputError("attention_mask must hold only 0 (padding) and 1 (token)")
        out = []
        for b in range(ids.shape[0]):
            idx = am[b].nonzero()[:, 0]
            if idx.numel() == 0:
                raise InputError(f"attention_mask row {b} is all zeros: prompt {b} is empty (it needs at least one token)")
            lo, hi = int(idx[0]), int(idx[-1])
            if hi - lo + 1 != idx.numel():
                raise InputError(
                    f"attention_mask row {b} has holes: expected left or right padding (one run of 1s per row)"
                )
            try:
                out.append(self._check_prompt(ids[b, lo : hi + 1])[0])
            except InputError as exc:
                raise InputError(f"prompt {b}: {exc}") from None
        return out

    @torch.no_grad()
    def generate(
        self,
        input_ids: Union[torch.Tensor, Sequence[torch.Tensor]],
        *,
        attention_mask: Optional[torch.Tensor] = None,
        max_new_tokens: Union[int, Sequence[int]] = 128,
        max_length: Optional[int] = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        eos_token_id: Union[None, int, Sequence[int]] = "default",  # type: ignore[assignment]
        stop_token_ids: Optional[Iterable[int]] = None,
        seed: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        callback: Optional[Callable[[torch.Tensor, GenerationStats], Any]] = None,
        profile: bool = True,
    ) -> Union[GenerationResult, BatchGenerationResult]:
        """Generate up to ``max_new_tokens`` tokens after ``input_ids`` [1, P].

        Stops at the first EOS / stop token (kept in the output, like ``generate``), after
        ``max_new_tokens`` new tokens, or when the sequence reaches ``max_length`` tokens.
        ``eos_token_id`` defaults to the target's ``generation_config.eos_token_id``; pass
        None to ignore EOS. ``temperature > 0`` samples (with ``top_k``/``top_p``); ``seed``
        or ``generator`` make sampling reproducible. ``callback(new_token_ids [1, n], stats)``
        runs after every step (progress displays). ``profile`` synchronises the device around
        each phase so the time split is exact.

        Batches: ``input_ids`` a list of prompts ([P_b] or [1, P_b], lengths may differ), or a
        [B, P] tensor with B > 1 (with ``attention_mask`` [B, P] of 0/1 when it is left- or
        right-padded), returns a :class:`BatchGenerationResult`: per prompt exactly what batch-1
        generation returns for it. ``max_new_tokens`` may then be a list (one per prompt);
        sampling takes ``seed`` (prompt b uses ``seed + b``) or ``generator``, a list of one
        torch.Generator per prompt; ``callback(list of [1, n_b] new tokens, batch stats)``. See
        :meth:`_generate_batch`.
        """
        kwargs = dict(
            max_new_tokens=max_new_tokens, max_length=max_length, temperature=temperature, top_p=top_p, top_k=top_k,
            eos_token_id=eos_token_id, stop_token_ids=stop_token_ids, seed=seed, generator=generator,
            callback=callback, profile=profile,
        )
        if isinstance(input_ids, (list, tuple)) or (
            isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1
        ):
            return self._generate_batch(self._batch_prompts(input_ids, attention_mask), **kwargs)
        if attention_mask is not None:  # one padded prompt: drop its padding
            input_ids = self._batch_prompts(input_ids, attention_mask)[0][None]
        prompt = self._check_prompt(input_ids)
        p_len = prompt.shape[1]
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive int, got max_new_tokens={max_new_tokens!r}")
        budget = max_new_tokens
        if max_length is not None:
            if not isinstance(max_length, int) or isinstance(max_length, bool):
                raise InputError(f"max_length must be an int, got max_length={max_length!r}")
            if max_length <= p_len:
                raise InputError(
                    f"max_length={max_length} leaves no room to generate: the prompt already has {p_len} tokens "
                    "(max_length counts the prompt plus the new tokens)"
                )
            budget = min(budget, max_length - p_len)
        params = SamplingParams.of(temperature, top_p, top_k)
        if eos_token_id == "default":
            gc = getattr(self.runner.target, "generation_config", None)
            eos_token_id = getattr(gc, "eos_token_id", None)
        stops = _as_id_set(eos_token_id, "eos_token_id")
        extra_stops = _as_id_set(stop_token_ids, "stop_token_ids")
        if generator is not None:
            if not isinstance(generator, torch.Generator):
                raise InputError(f"generator must be a torch.Generator, got {type(generator).__name__}")
            if generator.device.type != self.runner.device.type:
                raise InputError(
                    f"generator is on {generator.device} but the target on {self.runner.device}; "
                    f"use torch.Generator(device={str(self.runner.device)!r}) or seed="
                )
        elif seed is not None:
            if not isinstance(seed, int):
                raise InputError(f"seed must be an int, got {seed!r}")
            generator = torch.Generator(device=self.runner.device).manual_seed(seed)

        r, cfg = self.runner, self.cfg
        device = r.device
        stats = GenerationStats(backend=self.backend, prompt_tokens=p_len)
        width = min(cfg.total_token, cfg.depth + 2)
        state = _SequenceState.start(prompt[0], budget, device)
        stop_names = {**{t: "stop_token" for t in extra_stops}, **{t: "eos" for t in stops}}
        budget_reason = "max_new_tokens" if budget == max_new_tokens else "max_length"
        sync = (lambda: _sync(device)) if profile else (lambda: None)
        draft_kwargs: dict[str, Any] = dict(self.draft_options)
        if self.requires_weights:
            draft_kwargs["weights"] = self.weights
            draft_kwargs["cache_max_length"] = p_len + budget + 2
            if device.type == "cuda":
                draft_kwargs["check_token_range"] = False  # token ids come from the target/drafter

        r.attach()
        try:
            t_start = time.perf_counter()
            # ---- prefill ------------------------------------------------------------------
            last_logits, feats, cache = r.prefill(prompt)
            if params.greedy:
                root = last_logits.argmax(dim=-1)  # [1]
            else:
                probs0 = warp_logits(last_logits, params).softmax(dim=-1)  # [1, V]
                root = torch.multinomial(probs0, 1, generator=generator)[:, 0]  # [1]
            state.target_cache, state.fed_len, state.new_feats = cache, p_len, feats
            stats.target_forwards += 1
            state.emit([int(root)], root, stop_names, budget_reason)  # host read: the first token
            sync()
            stats.time_prefill = time.perf_counter() - t_start
            if callback is not None:
                callback(state.new_tokens()[None], stats)

            while state.reason is None:
                # ---- draft ----------------------------------------------------------------
                t0 = time.perf_counter()
                fr = frontier_generate(
                    cfg,
                    state.new_feats.to(self.feature_dtype),
                    backend=self.backend,
                    input_ids=state.input_ids()[None],  # [1, L + 1], root last
                    cache=state.draft_cache,
                    sampling=not params.greedy,
                    padded=self.padded,
                    **draft_kwargs,
                )
                state.draft_cache = fr.cache
                stats.draft_calls += 1
                sync()
                t1 = time.perf_counter()
                stats.time_draft += t1 - t0

                # ---- verify ---------------------------------------------------------------
                tokens = fr.draft_tokens.to(device)  # [1, T]
                tmask = fr.tree_mask.to(device)
                tpos = fr.tree_position_ids.to(device)
                logits, tree_feats = r.verify(tokens, tmask, tpos, state.fed_len, state.target_cache)  # [T, V], [1, T, F]
                stats.target_forwards += 1
                if params.greedy:
                    best, path, nxt = greedy_accept(logits, tokens[0], tmask, tpos, width)
                else:
                    probs = warp_logits(logits, params).softmax(dim=-1)  # [T, V]
                    best, path, nxt = sampling_accept(probs, tokens[0], tmask, tpos, width, generator)
                padded_tokens = torch.cat([tokens[0], tokens.new_full((1,), -1)])  # [T + 1], T -> -1
                invalid = fr.invalid.to(device=device, dtype=torch.long).reshape(1)  # [1] the draft's device-side check
                small = torch.cat([invalid, tpos[best][None], nxt[None], padded_tokens[path]])  # [3 + width]
                vals = small.tolist()  # the one host read of the step
                _raise_if_invalid(vals[:1], stats.draft_calls)
                acc, next_tok, path_tokens = vals[1], vals[2], vals[3:]
                t2 = time.perf_counter()
                stats.time_verify += t2 - t1
                stats.accepted_lengths.append(acc + 1)

                # ---- accept ---------------------------------------------------------------
                run = torch.cat([padded_tokens[path[1 : acc + 1]], nxt.reshape(1)])  # [acc + 1] on the device
                state.emit(path_tokens[1 : acc + 1] + [next_tok], run, stop_names, budget_reason)
                if state.reason is None:
                    keep = path[: acc + 1]  # [acc + 1] tree positions, root first
                    compact_cache(state.target_cache, state.fed_len, keep)
                    state.new_feats = tree_feats.index_select(1, keep)  # [1, acc + 1, F]
                    state.fed_len += acc + 1
                    if stats.verify_steps == 1:
                        _check_cache_length(state.target_cache, state.fed_len)
                if callback is not None:
                    callback(state.new_tokens()[None], stats)
            stats.stop_reason = state.reason
        finally:
            r.detach()
        stats.new_tokens = len(state.emitted)
        stats.time_total = time.perf_counter() - t_start
        stats.time_other = max(0.0, stats.time_total - stats.time_prefill - stats.time_draft - stats.time_verify)
        out = state.sequence()[None].clone()
        return GenerationResult(sequences=out, prompt_length=p_len, stats=stats)


    def _generate_batch(
        self,
        prompts: list[torch.Tensor],
        *,
        max_new_tokens: Union[int, Sequence[int]],
        max_length: Optional[int],
        temperature: float,
        top_p: float,
        top_k: int,
        eos_token_id: Any,
        stop_token_ids: Optional[Iterable[int]],
        seed: Optional[int],
        generator: Any,
        callback: Optional[Callable[[list[torch.Tensor], BatchGenerationStats], Any]],
        profile: bool,
    ) -> BatchGenerationResult:
        """The batched loop: every step drafts all active sequences in ONE draft call and verifies
        all their trees in ONE target forward.

        The target KV cache is one padded buffer [B, kv heads, phys, d]: sequence b's context is
        rows [0, len_b); rows [len_b, phys) are holes, masked in every verify forward. A verify
        forward appends each tree's T rows at ``phys`` (positions ``len_b + tree depth``); the
        compaction then moves each accepted path to [len_b, len_b + m_b) and trims the buffer to
        max_b(len_b + m_b). A sequence that stops (EOS, stop token, budget) leaves the batch: its
        cache rows are dropped and it is neither drafted nor verified again. One host read per
        step fetches every sequence's acceptance.
        """
        bsz = len(prompts)
        lens0 = [int(p.shape[0]) for p in prompts]
        if isinstance(max_new_tokens, (list, tuple)):
            if len(max_new_tokens) != bsz:
                raise InputError(
                    f"max_new_tokens must be one int or a list of {bsz} ints (one per prompt), got {len(max_new_tokens)}"
                )
            asked = list(max_new_tokens)
        else:
            asked = [max_new_tokens] * bsz
        for n in asked:
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise InputError(f"max_new_tokens must be a positive int (or a list of them), got max_new_tokens={n!r}")
        budgets = list(asked)
        if max_length is not None:
            if not isinstance(max_length, int) or isinstance(max_length, bool):
                raise InputError(f"max_length must be an int, got max_length={max_length!r}")
            for b, p_len in enumerate(lens0):
                if max_length <= p_len:
                    raise InputError(
                        f"max_length={max_length} leaves no room to generate for prompt {b}: it already has {p_len} "
                        "tokens (max_length counts the prompt plus the new tokens)"
                    )
                budgets[b] = min(budgets[b], max_length - p_len)
        params = SamplingParams.of(temperature, top_p, top_k)
        if eos_token_id == "default":
            gc = getattr(self.runner.target, "generation_config", None)
            eos_token_id = getattr(gc, "eos_token_id", None)
        stops = _as_id_set(eos_token_id, "eos_token_id")
        extra_stops = _as_id_set(stop_token_ids, "stop_token_ids")
        r, cfg = self.runner, self.cfg
        device = r.device
        generators: list[Optional[torch.Generator]] = [None] * bsz
        if generator is not None:
            if not isinstance(generator, (list, tuple)) or len(generator) != bsz:
                raise InputError(
                    f"with a batch, generator must be a list of {bsz} torch.Generators (one per prompt), "
                    f"got {type(generator).__name__}; or pass seed= (prompt b samples with seed + b)"
                )
            for b, g in enumerate(generator):
                if not isinstance(g, torch.Generator):
                    raise InputError(f"generator[{b}] must be a torch.Generator, got {type(g).__name__}")
                if g.device.type != device.type:
                    raise InputError(f"generator[{b}] is on {g.device} but the target on {device}")
            if len({id(g) for g in generator}) != bsz:
                raise InputError("generator must hold distinct torch.Generators: each prompt draws its own stream")
            generators = list(generator)
        elif seed is not None:
            if not isinstance(seed, int):
                raise InputError(f"seed must be an int, got {seed!r}")
            generators = [torch.Generator(device=device).manual_seed(seed + b) for b in range(bsz)]

        bstats = BatchGenerationStats(backend=self.backend, batch_size=bsz)
        bstats.sequences = [GenerationStats(backend=self.backend, prompt_tokens=n) for n in lens0]
        width = min(cfg.total_token, cfg.depth + 2)
        states = [_SequenceState.start(p, budgets[b], device) for b, p in enumerate(prompts)]
        stop_names = {**{t: "stop_token" for t in extra_stops}, **{t: "eos" for t in stops}}
        reasons = ["max_new_tokens" if budgets[b] == asked[b] else "max_length" for b in range(bsz)]
        sync = (lambda: _sync(device)) if profile else (lambda: None)
        draft_kwargs: dict[str, Any] = dict(self.draft_options)
        if self.requires_weights:
            draft_kwargs["weights"] = self.weights
            draft_kwargs["cache_max_length"] = max(n + m for n, m in zip(lens0, budgets)) + 2
            if device.type == "cuda":
                draft_kwargs["check_token_range"] = False

        def report() -> None:
            if callback is not None:
                callback([st.new_tokens()[None] for st in states], bstats)

        r.attach()
        try:
            t_start = time.perf_counter()
            # ---- prefill: one forward over the right-padded prompts --------------------------
            last_logits, feats, cache = r.prefill_batch(prompts)  # [B, V], [B, P, F]
            if params.greedy:
                roots = last_logits.argmax(dim=-1)  # [B]
            else:
                probs0 = warp_logits(last_logits, params).softmax(dim=-1)  # [B, V]
                roots = torch.cat(
                    [torch.multinomial(probs0[b : b + 1], 1, generator=generators[b])[:, 0] for b in range(bsz)]
                )  # [B]
            bstats.target_forwards += 1
            for b, (st, tok) in enumerate(zip(states, roots.tolist())):  # host read: the first tokens
                st.fed_len, st.new_feats = lens0[b], feats[b : b + 1, : lens0[b]]
                bstats.sequences[b].target_forwards += 1
                st.emit([tok], roots[b : b + 1], stop_names, reasons[b])
            active = list(range(bsz))
            phys = max(lens0)
            active, phys = self._drop_finished(cache, states, active, phys)
            sync()
            bstats.time_prefill = time.perf_counter() - t_start
            report()

            first_draft = True
            while active:
                # ---- draft: one batched call ------------------------------------------------
                t0 = time.perf_counter()
                frs = frontier_generate(
                    cfg,
                    [states[b].new_feats.to(self.feature_dtype) for b in active],
                    backend=self.backend,
                    input_ids=[states[b].input_ids()[None] for b in active],  # [1, L_b + 1] each
                    cache=None if first_draft else [states[b].draft_cache for b in active],
                    sampling=not params.greedy,
                    padded=self.padded,
                    **draft_kwargs,
                )
                first_draft = False
                for b, fr in zip(active, frs):
                    states[b].draft_cache = fr.cache
                    bstats.sequences[b].draft_calls += 1
                bstats.draft_calls += 1
                bstats.active.append(len(active))
                sync()
                t1 = time.perf_counter()
                bstats.time_draft += t1 - t0

                # ---- verify: one forward over all trees -------------------------------------
                n_act = len(active)
                t_max = max(int(fr.draft_tokens.shape[1]) for fr in frs)
                tokens = torch.zeros(n_act, t_max, dtype=torch.long, device=device)  # [A, T] pad rows: token 0
                tmasks = torch.eye(t_max, dtype=torch.bool, device=device).repeat(n_act, 1, 1)  # [A, T, T]
                tpos = torch.zeros(n_act, t_max, dtype=torch.long, device=device)  # [A, T]
                for i, fr in enumerate(frs):
                    t_i = fr.draft_tokens.shape[1]
                    tokens[i, :t_i] = fr.draft_tokens[0].to(device)
                    tmasks[i, :t_i, :t_i] = fr.tree_mask[0, 0].to(device) > 0
                    tpos[i, :t_i] = fr.tree_position_ids.to(device)
                lengths = torch.tensor([states[b].fed_len for b in active], device=device)  # [A]
                logits, tree_feats = r.verify_batch(tokens, tmasks, tpos, lengths, phys, cache)  # [A, T, V], [A, T, F]
                bstats.target_forwards += 1
                t_sizes = [int(fr.draft_tokens.shape[1]) for fr in frs]
                if params.greedy:
                    valid = None
                    if min(t_sizes) < t_max:
                        valid = torch.arange(t_max, device=device)[None, :] < torch.tensor(t_sizes, device=device)[:, None]
                    best, path_all, nxt_all = greedy_accept_batch(logits, tokens, tmasks, tpos, width, valid)
                else:
                    bests, path_list, nxt_list = [], [], []
                    probs_all = warp_logits(logits.flatten(0, 1), params).softmax(dim=-1).view(n_act, t_max, -1)
                    for i, fr in enumerate(frs):  # each sequence draws from its own generator
                        t_i = t_sizes[i]
                        b_i, p_i, n_i = sampling_accept(
                            probs_all[i, :t_i], tokens[i, :t_i], fr.tree_mask.to(device), tpos[i, :t_i], width,
                            generators[active[i]],
                        )
                        bests.append(b_i)
                        path_list.append(torch.where(p_i >= t_i, t_max, p_i))  # padding -> t_max
                        nxt_list.append(n_i)
                    best, path_all, nxt_all = torch.stack(bests), torch.stack(path_list), torch.stack(nxt_list)
                padded_tokens = torch.cat([tokens, tokens.new_full((n_act, 1), -1)], dim=1)  # [A, T + 1], T -> -1
                invalid = torch.stack([fr.invalid.to(device=device, dtype=torch.long) for fr in frs])[:, None]  # [A, 1]
                small = torch.cat(
                    [invalid, tpos.gather(1, best[:, None]), nxt_all[:, None], padded_tokens.gather(1, path_all)], dim=1
                )  # [A, 3 + width]
                vals = small.tolist()  # the one host read of the step, for all sequences
                _raise_if_invalid([v[0] for v in vals], bstats.draft_calls)
                vals = [v[1:] for v in vals]
                t2 = time.perf_counter()
                bstats.time_verify += t2 - t1

                # ---- accept, compact, drop finished sequences -------------------------------
                new_lens = []
                for i, b in enumerate(active):
                    st, sst = states[b], bstats.sequences[b]
                    acc, next_tok, path_tokens = vals[i][0], vals[i][1], vals[i][2:]
                    sst.accepted_lengths.append(acc + 1)
                    sst.target_forwards += 1
                    run = torch.cat([padded_tokens[i, path_all[i, 1 : acc + 1]], nxt_all[i : i + 1]])  # [acc + 1]
                    st.emit(path_tokens[1 : acc + 1] + [next_tok], run, stop_names, reasons[b])
                    if st.reason is None:
                        st.new_feats = tree_feats[i : i + 1].index_select(1, path_all[i, : acc + 1])  # [1, acc + 1, F]
                    new_lens.append(st.fed_len + acc + 1)
                new_phys = max(new_lens)
                compact_cache_batch(cache, phys, lengths, path_all, new_phys)
                for b, n in zip(active, new_lens):
                    states[b].fed_len = n
                phys = new_phys
                if bstats.verify_steps == 1:
                    _check_cache_length(cache, phys)
                active, phys = self._drop_finished(cache, states, active, phys)
                report()
        finally:
            r.detach()
        bstats.time_total = time.perf_counter() - t_start
        bstats.time_other = max(
            0.0, bstats.time_total - bstats.time_prefill - bstats.time_draft - bstats.time_verify
        )
        results = []
        for b, st in enumerate(states):
            sst = bstats.sequences[b]
            sst.new_tokens, sst.stop_reason = len(st.emitted), st.reason or ""
            for name in ("time_prefill", "time_draft", "time_verify", "time_other", "time_total"):
                setattr(sst, name, getattr(bstats, name))
            results.append(GenerationResult(sequences=st.sequence()[None].clone(), prompt_length=lens0[b], stats=sst))
        return BatchGenerationResult(results=results, stats=bstats)

    @staticmethod
    def _drop_finished(cache: Any, states: list, active: list[int], phys: int) -> tuple[list[int], int]:
        """Remove the stopped sequences' rows from the target cache; returns (active, phys)."""
        keep = [i for i, b in enumerate(active) if states[b].reason is None]
        if len(keep) == len(active):
            return active, phys
        active = [active[i] for i in keep]
        if not active:
            return active, 0
        phys = max(states[b].fed_len for b in active)
        device = states[active[0]].buffer.device
        select_cache_rows(cache, torch.tensor(keep, device=device), phys)
        return active, phys


@dataclass
class _SequenceState:
    """Everything one sequence carries between steps (batching keeps one per sequence).

    ``buffer`` holds the prompt, then the emitted tokens; the last emitted token is the next
    tree root, whose target K/V are not cached yet. ``fed_len`` tokens are in the target's KV
    cache; ``new_feats`` are the target features of the rows the draft cache lacks.
    """

    buffer: torch.Tensor  # [P + budget + 1] int64 on the device
    prompt_len: int
    budget: int
    emitted: list[int] = field(default_factory=list)
    fed_len: int = 0
    target_cache: Any = None
    draft_cache: Any = None
    new_feats: Optional[torch.Tensor] = None  # [1, n, F]
    reason: Optional[str] = None

    @classmethod
    def start(cls, prompt: torch.Tensor, budget: int, device: torch.device) -> "_SequenceState":
        buf = torch.empty(prompt.shape[0] + budget + 1, dtype=torch.long, device=device)
        buf[: prompt.shape[0]] = prompt
        return cls(buffer=buf, prompt_len=prompt.shape[0], budget=budget)

    def input_ids(self) -> torch.Tensor:
        """[L + 1] the sequence so far, the root last."""
        return self.buffer[: self.prompt_len + len(self.emitted)]

    def sequence(self) -> torch.Tensor:
        return self.buffer[: self.prompt_len + len(self.emitted)]

    def new_tokens(self) -> torch.Tensor:
        return self.buffer[self.prompt_len : self.prompt_len + len(self.emitted)]

    def emit(self, tokens: list[int], on_device: torch.Tensor, stop_names: dict, budget_reason: str) -> None:
        """Append ``tokens`` (host copy of ``on_device``), cut at the first stop token or the budget."""
        keep, reason = len(tokens), None
        for i, tok in enumerate(tokens):
            if tok in stop_names:
                keep, reason = i + 1, stop_names[tok]
                break
        room = self.budget - len(self.emitted)
        if reason is None and keep >= room:
            keep, reason = room, budget_reason
        start = self.prompt_len + len(self.emitted)
        self.buffer[start : start + keep] = on_device[:keep]
        self.emitted += tokens[:keep]
        self.reason = reason


def _check_cache_length(cache: Any, expect: int) -> None:
    """Once per call: the compacted cache reports the expected length (a transformers API guard)."""
    get = getattr(cache, "get_seq_length", None)
    if get is not None and int(get()) != expect:
        raise FrontierError(
            f"the target's cache reports {int(get())} tokens after compaction, expected {expect}: this transformers "
            "version's cache layout is not supported by frontier.generate"
        )


def generate(
    target: Any,
    input_ids: Union[torch.Tensor, Sequence[torch.Tensor]],
    *,
    cfg: FrontierConfig,
    weights: Optional[DraftWeights] = None,
    backend: str = "torch_ref",
    padded: bool = True,
    **kwargs: Any,
) -> Union[GenerationResult, "BatchGenerationResult"]:
    """Speculative generation in one call; see :class:`SpeculativeGenerator` and its ``generate``.

    ``input_ids``: one prompt [1, P] (returns a :class:`GenerationResult`), or a batch — a list of
    prompts or a [B, P] tensor, B > 1 — (returns a :class:`BatchGenerationResult`).
    ``kwargs``: attention_mask, max_new_tokens, max_length, temperature, top_p, top_k,
    eos_token_id, stop_token_ids, seed, generator, callback, profile.
    """
    gen = SpeculativeGenerator(target, cfg, weights, backend=backend, padded=padded)
    return gen.generate(input_ids, **kwargs)


# ----------------------------------------------------------------------------------------------
# Random pairs (no downloads): a randomly initialised Llama target and a matching EAGLE-3 head
# ----------------------------------------------------------------------------------------------
RANDOM_PRESETS: dict[str, dict[str, int]] = {
    # hidden, layers, heads, kv heads, intermediate, vocab; the head shares hidden and vocab.
    "tiny": dict(hidden=64, layers=8, heads=4, kv_heads=2, intermediate=128, vocab=256),
    "small": dict(hidden=512, layers=12, heads=8, kv_heads=4, intermediate=1408, vocab=8192),
    "large": dict(hidden=2048, layers=16, heads=16, kv_heads=8, intermediate=5632, vocab=32000),
}


def random_pair(
    preset: str = "tiny",
    *,
    total_token: int = 16,
    depth: int = 4,
    top_k: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    draft_vocab_size: Optional[int] = None,
    attn_implementation: str = "sdpa",
) -> tuple[Any, FrontierConfig, DraftWeights]:
    """(target LlamaForCausalLM, cfg, EAGLE-3 weights), randomly initialised from ``seed``.

    The head embeds with the target's own embedding table (as EAGLE-3 heads do).
    """
    if preset not in RANDOM_PRESETS:
        raise InputError(f"unknown random preset {preset!r}; choose one of {sorted(RANDOM_PRESETS)}")
    from transformers import LlamaConfig, LlamaForCausalLM

    from .random_head import random_config, random_weights

    p = RANDOM_PRESETS[preset]
    torch.manual_seed(seed)
    tcfg = LlamaConfig(
        hidden_size=p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        intermediate_size=p["intermediate"],
        vocab_size=p["vocab"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation=attn_implementation,
    )
    with torch.device(device):  # initialise where it will run (large presets)
        target = LlamaForCausalLM(tcfg)
    target = target.to(dtype=dtype).eval()
    n_taps = len(eagle3_tap_layers(p["layers"]))
    cfg = random_config(
        total_token=total_token,
        depth=depth,
        top_k=top_k,
        vocab_size=draft_vocab_size or p["vocab"],
        target_vocab_size=p["vocab"],
        hidden_size=p["hidden"],
        feature_size=n_taps * p["hidden"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        intermediate_size=p["intermediate"],
    )
    w = random_weights(cfg, seed=seed + 1, dtype=dtype, device=device)
    w.embed_tokens = target.get_input_embeddings().weight.detach()
    return target, cfg, w.validate(cfg)
