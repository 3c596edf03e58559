"""Drop frontier's drafting into the public EAGLE code's model.

    from frontier import patch_ea_model_with_triton_drafter, unpatch_ea_model
    patch_ea_model_with_triton_drafter(model)          # model = EAGLE's EaModel
    out = model.eagenerate(input_ids, max_new_tokens=256)   # drafts through frontier
    unpatch_ea_model(model)

The patch replaces ``model.ea_layer.topK_genrate(hidden_states, input_ids, head, logits_processor)``
on that one module instance (the class is untouched) with a call to
:func:`frontier.frontier_generate`. EAGLE's own cache protocol is kept: ``ea_layer.stable_kv``
holds the draft cache between calls (now a :class:`frontier.DraftCache`), and
``ea_layer.reset_kv()`` (called by ``eagenerate`` at the start of every generation) clears it,
so the next call starts a fresh cache. ``hidden_states`` brings the target features of the
rows the cache does not hold yet, exactly as the reference passes them. The weights are the
module's own tensors (no copy); the config comes from the module's ``config``, ``total_tokens``,
``depth`` and ``top_k``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .api import frontier_generate
from .cache import DEFAULT_MAX_LENGTH, DraftCache
from .config import FrontierConfig
from .errors import BackendUnavailableError, CacheError, InputError
from .registry import get_backend
from .weights import DraftWeights, config_from_ea_layer, stamp_matches, tensors_stamp

__all__ = ["patch_ea_model_with_triton_drafter", "unpatch_ea_model", "is_patched"]

_STATE = "_frontier_patch"


def _ea_layer(model: Any) -> Any:
    layer = getattr(model, "ea_layer", None)
    if layer is None:
        raise InputError(
            f"{type(model).__name__} has no ea_layer: pass the public EAGLE EaModel (model.ea_layer is the draft head)"
        )
    for name in ("total_tokens", "depth", "top_k"):
        if not hasattr(layer, name):
            raise InputError(f"model.ea_layer has no {name!r} attribute (the public EAGLE draft head sets it)")
    return layer


def is_patched(model: Any) -> bool:
    layer = getattr(model, "ea_layer", None)
    return layer is not None and hasattr(layer, _STATE)


def _grown(cache: DraftCache, need: int) -> DraftCache:
    """A copy of ``cache`` with room for ``need`` rows (doubling), committed rows kept."""
    new_len = max(need, 2 * cache.max_length)
    bigger = DraftCache(
        cache.num_layers, cache.k.shape[1], cache.k.shape[3], new_len, dtype=cache.dtype, device=cache.device
    )
    bigger.k[:, :, : cache.length] = cache.k[:, :, : cache.length]
    bigger.v[:, :, : cache.length] = cache.v[:, :, : cache.length]
    bigger.length = cache.length
    return bigger


class _FrontierDrafter:
    """The replacement ``topK_genrate`` bound to one ea_layer."""

    def __init__(self, layer: Any, backend: str, fallback: bool, cache_max_length: int) -> None:
        self.layer = layer
        self.backend = backend
        self.fallback = fallback
        self.cache_max_length = cache_max_length
        self.calls = 0
        self._head_key: Optional[tuple] = None
        self.cfg: Optional[FrontierConfig] = None
        self.weights: Optional[DraftWeights] = None
        # eagle3 heads have a `midlayer`; decided once, not per draft call
        self.eagle2 = not any(k.startswith("midlayer.") for k in layer.state_dict().keys())

    def _prepare(self, head: Any) -> None:
        """Config and weights, built on the first call (eagle2 heads need the target's lm_head)
        and again when the tree shape attributes change or any parameter or buffer of the layer
        (and of an eagle2 head's lm_head) is replaced, given other data or written in place."""
        layer = self.layer
        eagle2 = self.eagle2
        tensors = list(layer.parameters()) + list(layer.buffers())
        if eagle2 and isinstance(head, torch.nn.Module):
            tensors += list(head.parameters())
        elif eagle2 and isinstance(head, torch.Tensor):
            tensors.append(head)
        shape = (int(layer.total_tokens), int(layer.depth), int(layer.top_k), eagle2 and head is None)
        if (self.cfg is not None and self._head_key is not None and self._head_key[0] == shape
                and stamp_matches(self._head_key[1], tensors)):
            return
        lm_head = head if eagle2 else None
        self.cfg = config_from_ea_layer(
            layer,
            total_token=int(layer.total_tokens) + 1,  # EAGLE stores total_tokens without the root
            depth=int(layer.depth),
            top_k=int(layer.top_k),
            lm_head=lm_head,
        )
        impl = get_backend(self.backend)
        self.weights = DraftWeights.from_ea_layer(layer, lm_head=lm_head) if getattr(impl, "requires_weights", False) else None
        self._head_key = (shape, tensors_stamp(tensors))

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, head: Any = None, logits_processor: Any = None):
        self._prepare(head)
        layer = self.layer
        input_ids = input_ids.to(hidden_states.device)
        cache = getattr(layer, "stable_kv", None)
        if cache is not None and not isinstance(cache, DraftCache):
            raise CacheError(
                "model.ea_layer.stable_kv holds the reference implementation's cache; call "
                "model.ea_layer.reset_kv() (eagenerate does) before drafting through frontier"
            )
        kwargs: dict[str, Any] = {}
        if self.weights is not None:
            kwargs["weights"] = self.weights
            if cache is None:
                kwargs["cache_max_length"] = max(self.cache_max_length, int(input_ids.shape[1]) + 1)
            elif cache.length + hidden_states.shape[1] > cache.max_length:
                cache = _grown(cache, cache.length + hidden_states.shape[1])
        fr = frontier_generate(
            self.cfg,
            hidden_states,
            backend=self.backend,
            input_ids=input_ids,
            cache=cache,
            sampling=logits_processor is not None,
            fallback=self.fallback,
            **kwargs,
        )
        layer.stable_kv = fr.cache
        self.calls += 1
        return fr.draft_tokens, fr.real_retrieve_indices(), fr.tree_mask, fr.tree_position_ids


def patch_ea_model_with_triton_drafter(
    model: Any,
    backend: str = "triton",
    *,
    fallback: bool = False,
    cache_max_length: int = DEFAULT_MAX_LENGTH,
) -> Any:
    """Make ``model.eagenerate`` (public EAGLE code) draft through frontier's ``backend``.

    ``fallback=True`` drafts with torch_ref (with a warning) when ``backend`` cannot run here;
    otherwise an unavailable backend raises :class:`BackendUnavailableError` now. Patching an
    already patched model switches its backend. The draft cache starts with
    ``cache_max_length`` rows and grows when a generation outruns it. Returns ``model``.
    """
    layer = _ea_layer(model)
    if not isinstance(backend, str):
        raise InputError(f"backend must be a backend name (str), got {type(backend).__name__}")
    impl = get_backend(backend)
    ok, why = impl.availability()
    if not ok and not fallback:
        raise BackendUnavailableError(
            f"backend {backend!r} cannot run here: {why} (pass fallback=True to draft with torch_ref instead)"
        )
    if is_patched(model):
        unpatch_ea_model(model)
    drafter = _FrontierDrafter(layer, backend, fallback, int(cache_max_length))
    saved = layer.__dict__.get("topK_genrate", None)  # an instance-level override, if any
    setattr(layer, _STATE, {"backend": backend, "drafter": drafter, "saved": saved})
    layer.topK_genrate = drafter  # instance attribute shadows the class's method
    layer.stable_kv = None  # the reference's cache (if any) cannot continue into frontier's
    return model


def unpatch_ea_model(model: Any) -> Any:
    """Undo :func:`patch_ea_model_with_triton_drafter`: the module drafts with its own code again.

    The draft cache is dropped (``stable_kv = None``). Unpatching an unpatched model is a no-op.
    """
    layer = _ea_layer(model)
    state = layer.__dict__.pop(_STATE, None)
    if state is None:
        return model
    layer.__dict__.pop("topK_genrate", None)
    if state["saved"] is not None:
        layer.topK_genrate = state["saved"]
    layer.stable_kv = None
    return model
