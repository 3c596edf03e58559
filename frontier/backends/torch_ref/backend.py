"""torch_ref: placeholder until the exact draft layer lands (issue 3)."""

from __future__ import annotations

from ...registry import Backend


class TorchRefBackend(Backend):
    name = "torch_ref"
    requires_weights = True

    def availability(self):
        return False, "not implemented yet"
