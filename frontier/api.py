"""`frontier_generate`: the one call that drafts a tree (or a ragged batch of trees)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from .batch import frontier_generate_batch
from .cache import DraftCache
from .config import FrontierConfig
from .errors import InputError
from .request import DraftRequest, resolve_backend, resolve_weights, run_requests, validate_request
from .result import Frontier
from .weights import DraftWeights


def frontier_generate(
    cfg: FrontierConfig,
    features_concat: torch.Tensor,
    backend: str = "stub",
    *,
    input_ids: Optional[torch.Tensor] = None,
    weights: Optional[DraftWeights] = None,
    ea_layer: Any = None,
    lm_head: Any = None,
    cache: Optional[DraftCache] = None,
    cache_max_length: Optional[int] = None,
    sampling: bool = False,
    padded: bool = False,
    seed: int = 0,
    fallback: bool = False,
    **options: Any,
) -> Frontier:
    """Draft one EAGLE tree ("frontier") with the named backend.

    Parameters
    ----------
    cfg: the tree shape and draft-layer dimensions.
    features_concat: [1, n, F] target features of the n tokens whose draft K/V is not cached.
        A list of such tensors drafts a ragged batch (one tree per sequence; then input_ids and
        cache are per-sequence lists, and a list of Frontiers is returned — see frontier.batch).
    backend: a registered backend name ("stub", "torch_ref", "triton", or a plugin's).
    input_ids: [1, L+1] int64, the whole sequence so far (last token = the tree root). Needed by
        weight-carrying backends; optional for the stub (root token 0 when absent).
    weights / ea_layer (+ lm_head for eagle2): the draft head, for backends that need weights.
    cache: the draft KV cache returned by the previous call (``Frontier.cache``); None starts fresh.
    sampling: order retrieve_indices for sampling verification (docs/contract.md).
    padded: return retrieve_indices as [T, D+2] plus ``leaf_count`` (no host read at all).
    seed: determinism knob for backends that use randomness (the stub).
    fallback: if the backend cannot run here, warn and use torch_ref instead of raising.
    options: the backend's own options (each backend lists them in ``Backend.options``; an
        unknown name raises InputError), plus two checks every call makes (see frontier.request):
        ``check_token_range`` (default True): ids outside the target vocabulary raise InputError
        (one host read on CUDA); False clamps them on the device and sets ``Frontier.invalid``.
        ``check_finite`` (default ``not padded``): NaN/Inf features raise InputError, and a draft
        that overflows raises NonFiniteError, cache rolled back (one host read each); False
        reads nothing and reports both in ``Frontier.invalid``, the new cache rows zeroed
        rather than poisoned. ``padded=True`` with ``check_token_range=False`` makes no host
        read at all.
        torch_ref and triton accept ``trace=True``: the call's whole candidate list (and from
        torch_ref every top-K's log-prob rows) in ``Frontier.info["trace"]``, for the near-tie check
        of :func:`frontier.parity.near_tie_report`.

    Whatever goes wrong - a bad argument, a backend that raises or returns a malformed
    Frontier - the cache is left exactly as it was.
    """
    if isinstance(features_concat, (list, tuple)):
        # Ragged batch: one tree per sequence (see frontier.batch).
        if cache is not None and not isinstance(cache, (list, tuple)) and not hasattr(cache, "__getitem__"):
            raise InputError("with a batch of features, cache must be a BatchDraftCache or a list of DraftCache/None")
        return frontier_generate_batch(  # type: ignore[return-value]
            cfg, features_concat, backend, input_ids=input_ids, weights=weights, ea_layer=ea_layer, lm_head=lm_head,
            caches=cache, cache_max_length=cache_max_length, sampling=sampling, padded=padded, seed=seed,
            fallback=fallback, **options,
        )
    if not isinstance(cfg, FrontierConfig):
        raise InputError(f"cfg must be a FrontierConfig, got {type(cfg).__name__}")
    backend, impl = resolve_backend(backend, fallback)

    weights = resolve_weights(weights, ea_layer, lm_head)

    request = validate_request(
        cfg,
        features_concat,
        impl,
        backend_name=backend,
        input_ids=input_ids,
        weights=weights,
        cache=cache,
        cache_max_length=cache_max_length,
        sampling=sampling,
        padded=padded,
        seed=seed,
        options=options,
    )
    return run_requests(impl, backend, [request])[0]


__all__ = ["frontier_generate", "DraftRequest", "validate_request", "resolve_backend", "resolve_weights"]
