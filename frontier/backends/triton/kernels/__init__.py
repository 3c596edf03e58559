"""Device code of the fused drafter, one module per phase family (see ``program`` for how a draft
call's schedule is walked, and ``docs/triton.md`` for the design)."""

from .barrier import HAS_GDC
from .layout import CONTEXT_STEP, META_W, Phase
from .program import drafter_kernel

__all__ = ["CONTEXT_STEP", "HAS_GDC", "META_W", "Phase", "drafter_kernel"]
