"""torch_ref: the exact EAGLE draft layer in plain PyTorch — the readable specification."""

from __future__ import annotations

import torch

from ...registry import Backend
from ...result import Frontier
from .draft import draft_call


class TorchRefBackend(Backend):
    name = "torch_ref"
    requires_weights = True
    devices = ("cpu", "cuda")
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    options = ("trace",)  # trace=True: the candidate list and every top-K's log-probs in Frontier.info
    description = "exact PyTorch mirror of the EAGLE-3/EAGLE-2 draft layer (the yardstick)"

    def generate(self, request) -> Frontier:
        return draft_call(request)

    def static_drafter(self, drafter):
        """The draft step over a :class:`frontier.Drafter`'s buffers (fixed shapes, capturable)."""
        from .static import StaticTorchRef

        return StaticTorchRef(drafter)
