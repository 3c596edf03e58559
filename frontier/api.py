"""`frontier_generate`: validate the inputs of one draft call, dispatch to a backend."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .cache import DraftCache
from .config import FrontierConfig
from .errors import BackendUnavailableError, CacheError, FrontierError, InputError
from .registry import get_backend
from .result import Frontier
from .weights import DraftWeights


@dataclass
class DraftRequest:
    """The validated inputs a backend receives (SPEC "One draft call")."""

    cfg: FrontierConfig
    features: torch.Tensor  # [1, n, F] target features of the n new context rows
    input_ids: Optional[torch.Tensor]  # [1, L+1] int64, whole sequence; last token = root
    weights: Optional[DraftWeights] = None
    cache: Optional[DraftCache] = None  # None: the backend starts a fresh one
    cache_max_length: Optional[int] = None
    sampling: bool = False
    padded: bool = False
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.features.device

    @property
    def num_new(self) -> int:
        return self.features.shape[1]

    @property
    def context_length(self) -> int:
        """L: tokens before the root (None-safe only when input_ids is given)."""
        return self.input_ids.shape[1] - 1

    def draft_cache(self) -> DraftCache:
        """The cache this call appends to: the caller's, or a fresh one sized for the context."""
        if self.cache is not None:
            return self.cache
        w = self.weights
        return DraftCache.fresh(
            self.cfg, context_length=self.context_length, dtype=w.dtype, device=w.device, max_length=self.cache_max_length
        )


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
    sampling: order retrieve_indices for sampling verification (SPEC).
    padded: return retrieve_indices as [T, D+2] plus ``leaf_count`` (no host read at all).
    seed: determinism knob for backends that use randomness (the stub).
    fallback: if the backend cannot run here, warn and use torch_ref instead of raising.
    options: passed to the backend untouched, except ``check_token_range`` (default True): for
        weight-carrying backends the ids are checked against the target vocabulary, which on
        CUDA is one host read before the call; pass False to skip it (graph capture, no-sync loops).
        torch_ref and triton accept ``trace=True``: the call's whole candidate list (and from
        torch_ref every top-K's log-prob rows) in ``Frontier.info["trace"]``, for the near-tie check
        of :func:`frontier.parity.near_tie_report`.
    """
    if isinstance(features_concat, (list, tuple)):
        # Ragged batch: one tree per sequence (see frontier.batch).
        from .batch import frontier_generate_batch

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
    with torch.no_grad():
        result = impl.generate(request)
    if not isinstance(result, Frontier):
        raise FrontierError(f"backend {backend!r} returned {type(result).__name__}, expected a Frontier")
    return result


def resolve_weights(weights: Any, ea_layer: Any, lm_head: Any) -> Optional[DraftWeights]:
    """The head as DraftWeights: given directly, or built from an EAGLE-style ``ea_layer``."""
    if weights is not None and ea_layer is not None:
        raise InputError("pass either weights= or ea_layer=, not both")
    if lm_head is not None and ea_layer is None:
        raise InputError("lm_head= goes with ea_layer= (DraftWeights already hold their lm_head)")
    if ea_layer is not None:
        return DraftWeights.from_ea_layer(ea_layer, lm_head=lm_head)
    return weights  # its type is checked with the other inputs (validate_request)


def resolve_backend(backend: Any, fallback: bool) -> tuple[str, Any]:
    """(name, backend object) ready to run; with ``fallback`` an unavailable backend becomes torch_ref."""
    if not isinstance(backend, str):
        raise InputError(f"backend must be a backend name (str), got {type(backend).__name__}")
    impl = get_backend(backend)
    ok, why = impl.availability()
    if not ok:
        if fallback and backend != "torch_ref":
            ref = get_backend("torch_ref")
            ref_ok, ref_why = ref.availability()
            if not ref_ok:
                raise BackendUnavailableError(
                    f"backend {backend!r} cannot run here ({why}) and the fallback 'torch_ref' cannot either ({ref_why})"
                )
            warnings.warn(f"backend {backend!r} is unavailable ({why}); falling back to 'torch_ref'", RuntimeWarning, stacklevel=3)
            return "torch_ref", ref
        raise BackendUnavailableError(f"backend {backend!r} cannot run here: {why}")
    return backend, impl


def validate_request(
    cfg: FrontierConfig,
    features: Any,
    impl: Any,
    *,
    backend_name: str,
    input_ids: Any,
    weights: Optional[DraftWeights],
    cache: Optional[DraftCache],
    cache_max_length: Optional[int],
    sampling: bool,
    padded: bool,
    seed: int,
    options: dict[str, Any],
    weights_checked: bool = False,
) -> DraftRequest:
    """Check shapes, dtypes, devices and consistency with ``cfg``; raise :class:`InputError`.
    ``weights_checked``: the weights were already validated against ``cfg`` (a batch's later
    sequences), so only their device and dtype are compared here."""
    if not isinstance(features, torch.Tensor):
        raise InputError(f"features_concat must be a torch.Tensor [1, n, F], got {type(features).__name__}")
    if features.dim() != 3:
        raise InputError(f"features_concat must be 3-D [1, n, F], got shape {list(features.shape)}")
    if features.shape[0] != 1:
        raise InputError(
            f"features_concat must have batch size 1 ([1, n, F]), got shape {list(features.shape)}"
        )
    if features.shape[1] < 1:
        raise InputError(f"features_concat must hold at least one new row (n >= 1), got shape {list(features.shape)}")
    if features.shape[2] != cfg.feature_size:
        raise InputError(
            f"features_concat last dimension must be feature_size F={cfg.feature_size}, got shape {list(features.shape)}"
        )
    if not features.is_floating_point():
        raise InputError(f"features_concat must be a floating tensor, got dtype {features.dtype}")
    dtypes = tuple(getattr(impl, "dtypes", ()))
    if dtypes and features.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise InputError(
            f"backend {backend_name!r} supports dtypes {names}; features_concat is {str(features.dtype).replace('torch.', '')}"
        )
    devices = tuple(getattr(impl, "devices", ()))
    if devices and features.device.type not in devices:
        raise InputError(
            f"backend {backend_name!r} runs on {', '.join(devices)}; features_concat is on {features.device}"
        )

    if input_ids is not None:
        if not isinstance(input_ids, torch.Tensor):
            raise InputError(f"input_ids must be a torch.Tensor [1, L+1], got {type(input_ids).__name__}")
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise InputError(f"input_ids must be [1, L+1], got shape {list(input_ids.shape)}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"input_ids must be an integer tensor (int64), got dtype {input_ids.dtype}")
        if input_ids.device != features.device:
            raise InputError(f"input_ids is on {input_ids.device} but features_concat on {features.device}")
        if input_ids.shape[1] < 2:
            raise InputError(
                f"input_ids must hold at least two tokens (context + root), got shape {list(input_ids.shape)}"
            )
        input_ids = input_ids.long()

    requires_weights = bool(getattr(impl, "requires_weights", False))
    if requires_weights:
        cfg.require_layer_dims(f"backend {backend_name!r}")
        if weights is None:
            raise InputError(f"backend {backend_name!r} needs the draft head: pass weights= or ea_layer=")
        if not isinstance(weights, DraftWeights):
            raise InputError(f"weights must be a frontier.DraftWeights, got {type(weights).__name__}")
        if not weights_checked:
            weights.validate(cfg)
        if weights.device != features.device:
            raise InputError(f"weights are on {weights.device} but features_concat on {features.device}")
        if weights.dtype != features.dtype:
            raise InputError(
                f"features_concat dtype {features.dtype} differs from the weights' dtype {weights.dtype}; cast one"
            )
        if input_ids is None:
            raise InputError(f"backend {backend_name!r} needs input_ids [1, L+1] (the sequence so far, root last)")
        n, big_l = features.shape[1], input_ids.shape[1] - 1
        if cache is not None:
            if not isinstance(cache, DraftCache):
                raise InputError(f"cache must be a frontier.DraftCache (Frontier.cache), got {type(cache).__name__}")
            cache.check_compatible(cfg, weights.dtype, weights.device)
        cached = 0 if cache is None else cache.length
        if cached + n != big_l:
            raise CacheError(
                f"cache length + new rows must equal the context length: the cache holds {cached} rows, "
                f"features_concat brings n={n}, but input_ids has L={big_l} tokens before the root "
                "(SPEC 'One draft call': c + n == L)"
            )
        if cache is not None:
            cache.check_room(n)
        # Token ids must index the target vocabulary (they feed the embedding). On CUDA this is
        # one host read before the call; check_token_range=False skips it (e.g. graph capture).
        if options.pop("check_token_range", True) or input_ids.device.type == "cpu":
            lo, hi = torch.stack(torch.aminmax(input_ids)).tolist()
            if lo < 0 or hi >= cfg.target_vocab_size:
                raise InputError(
                    f"input_ids must lie in [0, target_vocab_size={cfg.target_vocab_size}), got range [{lo}, {hi}]"
                )
    elif weights is not None:
        raise InputError(f"backend {backend_name!r} takes no weights; drop weights=/ea_layer=")

    if cache_max_length is not None and (not isinstance(cache_max_length, int) or cache_max_length < 1):
        raise InputError(f"cache_max_length must be a positive int, got {cache_max_length!r}")
    if not isinstance(seed, int):
        raise InputError(f"seed must be an int, got {type(seed).__name__}")
    return DraftRequest(
        cfg=cfg,
        features=features,
        input_ids=input_ids,
        weights=weights,
        cache=cache,
        cache_max_length=cache_max_length,
        sampling=bool(sampling),
        padded=bool(padded),
        seed=seed,
        options=dict(options),
    )


__all__ = ["frontier_generate", "DraftRequest", "validate_request", "resolve_backend", "resolve_weights"]
