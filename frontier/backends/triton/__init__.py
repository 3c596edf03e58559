"""triton backend: the whole draft call in one persistent fused Triton kernel (issue 4).

``kernels.py`` holds the ``@triton.jit`` device code, ``launch.py`` the typed launchers
(workspace, schedule, grid), ``backend.py`` the :class:`TritonBackend`.
"""

from .backend import TritonBackend


def register_triton_backend() -> None:
    """Register the backend under "triton" (idempotent; the registry already knows the name)."""
    from ...registry import register_backend

    register_backend("triton", "frontier.backends.triton:TritonBackend")


__all__ = ["TritonBackend", "register_triton_backend"]
