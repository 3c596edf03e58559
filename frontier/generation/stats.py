"""What a generation call returns: the output sequences and the counters and timings of the run.

:class:`GenerationResult` / :class:`GenerationStats` for one prompt; :class:`BatchGenerationResult`
/ :class:`BatchGenerationStats` for a batch (one :class:`GenerationResult` per prompt, plus the
batch's counts of batched forwards and draft calls). Each stats object renders a two-column text
table (``table()``) and a flat dict (``to_dict()``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..errors import InputError

__all__ = ["BatchGenerationResult", "BatchGenerationStats", "GenerationResult", "GenerationStats"]


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
