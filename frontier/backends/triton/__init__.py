"""triton backend (issue 4)."""

from ...registry import Backend


class TritonBackend(Backend):
    name = "triton"
    requires_weights = True
    devices = ("cuda",)

    def availability(self):
        return False, "not implemented yet"


def register_triton_backend() -> None:
    from ...registry import register_backend

    register_backend("triton", "frontier.backends.triton:TritonBackend")
