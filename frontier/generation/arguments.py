"""Checks of everything a caller hands to generation, before any forward runs.

:func:`check_head_matches_target` and :func:`check_draft_options` run when a
:class:`~frontier.generation.SpeculativeGenerator` is made; :func:`generation_args` turns the
arguments of one ``generate`` call (a prompt or a batch of them, budgets, sampling, stop tokens,
random generators) into a checked :class:`GenerationArgs`. Every failure is an
:class:`~frontier.InputError` naming the argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..config import FrontierConfig
from ..errors import InputError
from .acceptance import SamplingParams, _is_int
from .target import TargetRunner

__all__ = ["GenerationArgs", "check_draft_options", "check_head_matches_target", "generation_args", "is_batch"]

# what the generation loop passes to every draft call itself (cfg and features_concat positionally)
LOOP_DRAFT_ARGS = ("cfg", "features_concat", "input_ids", "cache", "weights", "sampling", "padded",
                   "cache_max_length", "backend", "check_token_range")


@dataclass
class GenerationArgs:
    """One ``generate`` call's checked arguments, per prompt where they can differ."""

    prompts: list[torch.Tensor]  # 1-D int64 on the target's device, padding removed
    batch: bool  # the caller passed a batch (a list, or a [B > 1, P] tensor)
    asked: list[int]  # max_new_tokens
    budgets: list[int]  # new tokens allowed: max_new_tokens, capped by max_length
    params: SamplingParams
    stop_names: dict[int, str]  # stop token id -> stop reason ("eos" or "stop_token")
    generators: list[Optional[torch.Generator]]  # None: the global generator (or greedy)

    def budget_reason(self, b: int) -> str:
        """The stop reason when prompt b runs out of budget."""
        return "max_new_tokens" if self.budgets[b] == self.asked[b] else "max_length"


def is_batch(input_ids: Any) -> bool:
    """A list of prompts or a [B > 1, P] tensor (a [1, P] or [P] tensor is one prompt)."""
    return isinstance(input_ids, (list, tuple)) or (
        isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1
    )


def generation_args(
    runner: TargetRunner,
    input_ids: Any,
    attention_mask: Any,
    *,
    max_new_tokens: Any,
    max_length: Any,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    eos_token_id: Any,
    stop_token_ids: Any,
    seed: Any,
    generator: Any,
) -> GenerationArgs:
    """The checked arguments of one ``generate`` call, in the order the caller reads them:
    prompts, budgets, sampling, stop tokens, randomness."""
    batch = is_batch(input_ids)
    if batch:
        prompts = _batch_prompts(runner, input_ids, attention_mask)
    else:
        if attention_mask is not None:  # one padded prompt: drop its padding
            input_ids = _batch_prompts(runner, input_ids, attention_mask)[0][None]
        prompts = [_check_prompt(runner, input_ids)[0]]
    lens = [int(p.shape[0]) for p in prompts]
    asked = _max_new_tokens(max_new_tokens, len(prompts), batch)
    budgets = list(asked)
    if max_length is not None:
        if not isinstance(max_length, int) or isinstance(max_length, bool):
            raise InputError(f"max_length must be an int, got max_length={max_length!r}")
        for b, p_len in enumerate(lens):
            if max_length <= p_len:
                where = f" for prompt {b}: it already has" if batch else ": the prompt already has"
                raise InputError(
                    f"max_length={max_length} leaves no room to generate{where} {p_len} tokens "
                    "(max_length counts the prompt plus the new tokens)"
                )
            budgets[b] = min(budgets[b], max_length - p_len)
    params = SamplingParams.of(temperature, top_p, top_k)
    if eos_token_id == "default":
        gc = getattr(runner.target, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
    stops = _as_id_set(eos_token_id, "eos_token_id")
    extra_stops = _as_id_set(stop_token_ids, "stop_token_ids")
    stop_names = {**{t: "stop_token" for t in extra_stops}, **{t: "eos" for t in stops}}
    generators = _generators(generator, seed, len(prompts), batch, runner.device)
    return GenerationArgs(prompts, batch, asked, budgets, params, stop_names, generators)


def _max_new_tokens(max_new_tokens: Any, bsz: int, batch: bool) -> list[int]:
    """One positive int per prompt (a batch may give a list of them)."""
    if not batch:
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive int, got max_new_tokens={max_new_tokens!r}")
        return [max_new_tokens]
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
    return asked


def _generators(generator: Any, seed: Any, bsz: int, batch: bool, device: torch.device) -> list[Optional[torch.Generator]]:
    """One torch.Generator (or None) per prompt: the caller's, or seeded with ``seed + b``."""
    if generator is not None:
        if not batch:
            if not isinstance(generator, torch.Generator):
                raise InputError(f"generator must be a torch.Generator, got {type(generator).__name__}")
            if generator.device.type != device.type:
                raise InputError(
                    f"generator is on {generator.device} but the target on {device}; "
                    f"use torch.Generator(device={str(device)!r}) or seed="
                )
            return [generator]
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
        return list(generator)
    if seed is not None:
        if not isinstance(seed, int):
            raise InputError(f"seed must be an int, got {seed!r}")
        return [torch.Generator(device=device).manual_seed(seed + b) for b in range(bsz)]
    return [None] * bsz


def _check_prompt(runner: TargetRunner, input_ids: Any) -> torch.Tensor:
    """One prompt, [P] or [1, P], as a [1, P] int64 tensor on the target's device."""
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
    if lo < 0 or hi >= runner.vocab_size:
        raise InputError(
            f"input_ids must lie in [0, {runner.vocab_size}) (the target's vocabulary), got range [{lo}, {hi}]"
        )
    return input_ids.to(device=runner.device, dtype=torch.long)


def _batch_prompts(runner: TargetRunner, input_ids: Any, attention_mask: Any) -> list[torch.Tensor]:
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
                out.append(_check_prompt(runner, p)[0])
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
                out.append(_check_prompt(runner, row)[0])
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
            out.append(_check_prompt(runner, ids[b, lo : hi + 1])[0])
        except InputError as exc:
            raise InputError(f"prompt {b}: {exc}") from None
    return out


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


def check_draft_options(options: Any) -> dict[str, Any]:
    """``draft_options``: None or a dict (any mapping) of backend options keyed by str, none of
    them an argument the loop sets itself (InputError otherwise); a plain dict copy."""
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise InputError(f"draft_options must be a dict of backend options keyed by str, got {options!r}")
    taken = sorted(k for k in options if k in LOOP_DRAFT_ARGS)
    if taken:
        raise InputError(f"draft_options cannot set {taken}: the generation loop passes those to every draft call")
    return dict(options)


def check_head_matches_target(cfg: FrontierConfig, weights: Any, runner: TargetRunner) -> None:
    """The draft head reads the target's features and proposes the target's tokens: its feature
    size and vocabulary must be the target's, and its weights on the target's device."""
    r = runner
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
