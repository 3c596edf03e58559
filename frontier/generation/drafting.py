"""How a generation's steps draft: :class:`CallDrafts` makes one ``frontier_generate`` call per
step (the draft caches passed along), :class:`StaticDrafts` stages each step's rows into a
:class:`frontier.Drafter` and replays its captured step (on CUDA one graph replay: the step costs
its device time, not the host's validation and bookkeeping).

Both take, per active sequence, the target features of the rows its draft cache lacks
(``[1, n, F]``) and the sequence so far (``[L + 1]``, root last), and return one padded
:class:`~frontier.Frontier` per sequence. Sequence i of a step is the i-th active one;
:meth:`keep` follows the batch when sequences leave it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..api import frontier_generate
from ..drafter import Drafter
from ..result import Frontier


class CallDrafts:
    """One ``frontier_generate`` call per step (a batch call for several sequences)."""

    def __init__(self, gen: Any, *, sampling: bool, max_length: int) -> None:
        self.gen, self.sampling = gen, sampling
        self.kwargs = gen._draft_kwargs(max_length)
        self.caches: Optional[list] = None

    def draft(self, feats: list[torch.Tensor], ids: list[torch.Tensor]) -> list[Frontier]:
        g = self.gen
        common = dict(backend=g.backend, sampling=self.sampling, padded=g.padded, **self.kwargs)
        if len(feats) == 1:  # one sequence: the single call (a batch of one would take the batched launch)
            cache = self.caches[0] if self.caches is not None else None
            frs = [frontier_generate(g.cfg, feats[0], input_ids=ids[0][None], cache=cache, **common)]
        else:
            frs = frontier_generate(g.cfg, feats, input_ids=[i[None] for i in ids], cache=self.caches, **common)
        self.caches = [fr.cache for fr in frs]
        return frs

    def keep(self, keep: list[int]) -> None:
        if self.caches is not None:
            self.caches = [self.caches[i] for i in keep]


class StaticDrafts:
    """A :class:`~frontier.Drafter` (one slot per active sequence): the first step drafts each
    sequence's prompt with :meth:`Drafter.prefill`, every later one stages the accepted rows and
    replays the captured step."""

    def __init__(self, drafter: Drafter, *, prefill_options: dict[str, Any]) -> None:
        self.d = drafter
        self.prefill_options = prefill_options
        self.started = False
        drafter.reset()

    def draft(self, feats: list[torch.Tensor], ids: list[torch.Tensor]) -> list[Frontier]:
        d = self.d
        if not self.started:  # prompts of any length: frontier_generate on each slot's cache
            self.started = True
            return [d.prefill(i, f, s[None], **self.prefill_options) for i, (f, s) in enumerate(zip(feats, ids))]
        for i, (f, s) in enumerate(zip(feats, ids)):
            d.stage(i, f, s[-f.shape[1]:])  # the new rows' tokens: the last n of the sequence
        d.replay(len(feats))
        return [d.frontier(i) for i in range(len(feats))]

    def keep(self, keep: list[int]) -> None:
        self.d.keep_slots(keep)
