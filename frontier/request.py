"""One draft call's inputs, checked, and the guarded dispatch to a backend.

:func:`validate_request` turns the arguments of :func:`frontier.frontier_generate` into a
:class:`DraftRequest` or raises an error naming the argument. :func:`run_requests` hands
requests to a backend and keeps the caches atomic: a backend that raises, returns something
that is not a well-formed :class:`~frontier.Frontier`, or (with the default checks) produces
non-finite values leaves every draft cache as it was before the call.

Non-finite values and out-of-vocabulary token ids, for backends that run the draft layer (a
weight-free backend such as the stub never reads the features' values):

* ``check_finite=True`` (default with ``padded=False``): NaN/Inf in the features raise
  :class:`InputError` before anything runs, and a draft that turns finite inputs into NaN/Inf
  scores (an fp16 overflow inside the layer) raises :class:`NonFiniteError` with the cache rolled
  back. Each costs one host read.
* ``check_finite=False`` (default with ``padded=True``, the layout that reads nothing from the
  host): the result's ``invalid`` flag (a device tensor) is set when the features or the outputs
  were non-finite, and the call's new cache rows hold zeros instead of the poison (the cache's
  length still advances: ``truncate`` it when the flag is set).
* ``check_token_range=True`` (default): ids outside the target vocabulary raise
  :class:`InputError` (sharing the host read above). With False the ids are clamped into the
  vocabulary on the device and ``invalid`` is set, so no kernel ever indexes outside the
  embedding.
"""

from __future__ import annotations

import difflib
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from .cache import DraftCache
from .config import FrontierConfig
from .errors import (
    BackendUnavailableError,
    CacheError,
    InputError,
    InvariantError,
    NonFiniteError,
)
from .registry import get_backend
from .result import Frontier
from .weights import DraftWeights

#: Options every call takes, whatever the backend (defaults: check_token_range True,
#: check_finite ``not padded``).
CALL_OPTIONS = ("check_token_range", "check_finite")


@dataclass
class DraftRequest:
    """The validated inputs a backend receives (docs/contract.md, "One draft call")."""

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
    check_finite: bool = True
    # The caller's input_ids where check_token_range=False clamped them (input_ids holds the
    # clamped copy): the result's flag compares the two after the launch, off the critical path.
    unclamped_ids: Optional[torch.Tensor] = None

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


# ----------------------------------------------------------------------------------------------
# Backend and weights
# ----------------------------------------------------------------------------------------------
def _availability(impl: Any) -> tuple[bool, str]:
    """``impl.availability()``, with a backend that raises or answers nonsense reported as unavailable."""
    try:
        answer = impl.availability()
        ok, why = answer
    except Exception as exc:
        return False, f"its availability() raised {type(exc).__name__}: {exc}"
    return bool(ok), str(why)


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning raised by our caller at the first frame outside
    this package (the user's call, however many of frontier's functions lie between)."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        level, frame = level + 1, frame.f_back
    return level


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def resolve_backend(backend: Any, fallback: bool) -> tuple[str, Any]:
    """(name, backend object) ready to run; with ``fallback`` an unavailable backend becomes torch_ref."""
    if not isinstance(backend, str):
        raise InputError(f"backend must be a backend name (str), got {type(backend).__name__}")
    if not isinstance(fallback, bool):
        raise InputError(f"fallback must be True or False, got fallback={fallback!r}")
    impl = get_backend(backend)
    ok, why = _availability(impl)
    if not ok:
        if fallback and backend != "torch_ref":
            ref = get_backend("torch_ref")
            ref_ok, ref_why = _availability(ref)
            if not ref_ok:
                raise BackendUnavailableError(
                    f"backend {backend!r} cannot run here ({why}) and the fallback 'torch_ref' cannot either ({ref_why})"
                )
            warnings.warn(f"backend {backend!r} is unavailable ({why}); falling back to 'torch_ref'", RuntimeWarning,
                          stacklevel=_caller_level())
            return "torch_ref", ref
        raise BackendUnavailableError(f"backend {backend!r} cannot run here: {why}")
    return backend, impl


def resolve_weights(weights: Any, ea_layer: Any, lm_head: Any) -> Optional[DraftWeights]:
    """The head as DraftWeights: given directly, as a loaded head (anything with a ``weights``
    attribute holding DraftWeights, e.g. :class:`frontier.DraftHead`), or built from an
    EAGLE-style ``ea_layer``."""
    if weights is not None and ea_layer is not None:
        raise InputError("pass either weights= or ea_layer=, not both")
    if lm_head is not None and ea_layer is None:
        raise InputError("lm_head= goes with ea_layer= (DraftWeights already hold their lm_head)")
    if ea_layer is not None:
        return DraftWeights.from_ea_layer(ea_layer, lm_head=lm_head)
    if weights is not None and not isinstance(weights, DraftWeights):
        inner = getattr(weights, "weights", None)
        if isinstance(inner, DraftWeights):
            return inner
    return weights  # its type is checked with the other inputs (validate_request)


def check_options(impl: Any, backend: str, options: dict[str, Any]) -> None:
    """Refuse option names that neither every call nor this backend takes (a typo must not be
    ignored). A backend lists its own in ``options``; one without that attribute takes any."""
    for name in ("check_token_range", "check_finite", "trace"):
        if name in options and not isinstance(options[name], bool):
            raise InputError(f"option {name} must be True or False, got {name}={options[name]!r}")
    accepted = getattr(impl, "options", None)
    if accepted is None:
        return
    known = set(CALL_OPTIONS) | set(accepted)
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known | _CALL_ARGUMENTS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            takes = ", ".join(sorted(known))
            raise InputError(f"unknown option {name!r} for backend {backend!r} (it takes: {takes}){hint}")


# The keyword arguments of frontier_generate, for the hint of a misspelled one.
_CALL_ARGUMENTS = {
    "input_ids", "weights", "ea_layer", "lm_head", "cache", "cache_max_length", "sampling", "padded", "seed",
    "fallback",
}


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------
def _finite_probe(x: torch.Tensor) -> torch.Tensor:
    """A float64 scalar that is finite exactly when every value of ``x`` is: their sum in float64
    (which no sum of float32/16 values can overflow; one reduction instead of isfinite's five
    ops), or for float64 values the largest magnitude (NaN propagates through it)."""
    if x.dtype == torch.float64:
        return x.abs().amax()
    return x.sum(dtype=torch.float64)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{name} must be True or False, got {name}={value!r}")
    return value


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
    """Check shapes, dtypes, devices, values and consistency with ``cfg``; raise
    :class:`InputError` (or :class:`CacheError`/:class:`WeightsError`) naming the argument.
    ``weights_checked``: the weights were already validated against ``cfg`` (a batch's later
    sequences), so only their device and dtype are compared here."""
    options = dict(options)
    check_options(impl, backend_name, options)
    sampling, padded = _flag("sampling", sampling), _flag("padded", padded)
    check_range = options.pop("check_token_range", True)
    check_finite = options.pop("check_finite", not padded)  # the padded layout reads nothing from the host
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if cache_max_length is not None and (
        isinstance(cache_max_length, bool) or not isinstance(cache_max_length, int) or cache_max_length < 1
    ):
        raise InputError(f"cache_max_length must be a positive int, got {cache_max_length!r}")

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
            raise InputError(f"weights must be a frontier.DraftWeights, got {type(weights).__name__} (a loaded DraftHead passes too)")
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
                "(the contract's 'One draft call': c + n == L)"
            )
        if cache is not None:
            cache.check_room(n)
    elif weights is not None:
        raise InputError(f"backend {backend_name!r} takes no weights; drop weights=/ea_layer=")

    # Values, where they feed the draft layer: the host checks share one host read; the device
    # checks leave their inputs on the request for the result's flag. A few small ops either way.
    unclamped_ids = None
    if requires_weights:
        host: list[torch.Tensor] = []
        if check_finite:  # else the features are checked on the device after the launch
            host.append(_finite_probe(features))
        vt = cfg.target_vocab_size
        if check_range:
            host += list(torch.aminmax(input_ids))
        else:  # the ids index the embedding: clamp them on the device, flag them after the launch
            unclamped_ids, input_ids = input_ids, input_ids.clamp(0, vt - 1)
        if host:
            values = torch.stack([h.to(torch.float64) for h in host]).tolist()  # the one host read
            if check_finite and not math.isfinite(values.pop(0)):
                raise InputError(
                    "features_concat holds non-finite values (NaN or +-Inf), e.g. from a target that overflowed "
                    "in fp16; nothing was drafted and the cache is unchanged"
                )
            if values:
                lo, hi = values
                if lo < 0 or hi >= vt:
                    raise InputError(
                        f"input_ids must lie in [0, target_vocab_size={vt}), got range [{int(lo)}, {int(hi)}]"
                    )
    return DraftRequest(
        cfg=cfg,
        features=features,
        input_ids=input_ids,
        weights=weights,
        cache=cache,
        cache_max_length=cache_max_length,
        sampling=sampling,
        padded=padded,
        seed=seed,
        options=options,
        check_finite=check_finite,
        unclamped_ids=unclamped_ids,
    )


# ----------------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------------
def run_requests(impl: Any, backend: str, requests: Sequence[DraftRequest]) -> list[Frontier]:
    """Run validated requests on ``impl`` (its ``generate_batch`` when it has one and there are
    several) and return one checked Frontier each. Any failure - an exception, a malformed
    result, non-finite values under ``check_finite`` - rolls every caller's cache back to its
    length before the call: its committed rows are never written, so they are bit for bit as they
    were (rows past the length are scratch, as ever)."""
    before = [None if r.cache is None else r.cache.length for r in requests]
    try:
        with torch.no_grad():
            run_batch = getattr(impl, "generate_batch", None)
            if len(requests) > 1 and run_batch is not None:
                results = run_batch(list(requests))
            else:
                results = [impl.generate(r) for r in requests]
            if not isinstance(results, (list, tuple)) or len(results) != len(requests):
                raise InvariantError(f"backend {backend!r} must return one Frontier per sequence ({len(requests)})")
            for r, fr, length in zip(requests, results, before):
                _check_result(backend, r, fr, before_length=length)
            _finish_values(requests, results, before)
    except BaseException:
        for r, length in zip(requests, before):
            if r.cache is not None:
                r.cache.length = length
        raise
    return list(results)


def _check_result(backend: str, r: DraftRequest, fr: Any, *, before_length: int) -> None:
    """The cheap part of the output contract (types, shapes, dtypes, devices, the cache length),
    with no host read; :meth:`Frontier.check_invariants` checks the rest."""

    def fail(msg: str) -> None:
        raise InvariantError(f"backend {backend!r} returned a malformed Frontier: {msg}")

    if not isinstance(fr, Frontier):
        raise InvariantError(f"backend {backend!r} returned {type(fr).__name__}, expected a Frontier")
    t, depth, device = r.cfg.total_token, r.cfg.depth, r.device
    tensors = {"draft_tokens": fr.draft_tokens, "retrieve_indices": fr.retrieve_indices, "tree_mask": fr.tree_mask,
               "tree_position_ids": fr.tree_position_ids}
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            fail(f"{name} is {type(x).__name__}, not a tensor")
        if x.device != device:
            fail(f"{name} is on {x.device}, the inputs on {device}")
    if tuple(fr.draft_tokens.shape) != (1, t) or fr.draft_tokens.dtype != torch.int64:
        fail(f"draft_tokens must be [1, {t}] int64, got {list(fr.draft_tokens.shape)} {fr.draft_tokens.dtype}")
    if tuple(fr.tree_mask.shape) != (1, 1, t, t) or not fr.tree_mask.is_floating_point():
        fail(f"tree_mask must be a float [1, 1, {t}, {t}], got {list(fr.tree_mask.shape)} {fr.tree_mask.dtype}")
    if tuple(fr.tree_position_ids.shape) != (t,) or fr.tree_position_ids.dtype != torch.int64:
        fail(f"tree_position_ids must be [{t}] int64, got {list(fr.tree_position_ids.shape)} {fr.tree_position_ids.dtype}")
    ri = fr.retrieve_indices
    if ri.dim() != 2 or ri.dtype != torch.int64:
        fail(f"retrieve_indices must be 2-D int64, got {list(ri.shape)} {ri.dtype}")
    if r.padded and tuple(ri.shape) != (t, depth + 2):
        fail(f"padded retrieve_indices must be [{t}, {depth + 2}], got {list(ri.shape)}")
    if not r.padded and not (1 <= ri.shape[0] <= t and 1 <= ri.shape[1] <= depth + 2):
        fail(f"retrieve_indices must be [leaves <= {t}, columns <= {depth + 2}], got {list(ri.shape)}")
    if r.cache is not None and r.weights is not None:  # the backend appended the n new rows to the caller's cache
        cache = fr.cache
        if not isinstance(cache, DraftCache):
            fail(f"cache is {type(cache).__name__}, expected the DraftCache the call appended to")
        if cache is not r.cache:
            fail("cache is not the DraftCache passed in")
        if cache.length != before_length + r.num_new:
            fail(f"the cache holds {cache.length} rows after the call, expected {before_length} + n={r.num_new}")


def _finish_values(requests: Sequence[DraftRequest], results: Sequence[Frontier], before: list) -> None:
    """Finite scores (where NaN/Inf anywhere in the layer arrives), checked on the host
    (``check_finite``, default) or flagged on the device with the new cache rows restored; sets
    every result's ``invalid`` flag."""
    host = []
    for r, fr, length in zip(requests, results, before):
        # Queued after the launch, so that on a GPU they overlap the draft instead of delaying it.
        total = None  # float64: finite exactly when the checked values all are
        if r.weights is not None:
            total = None if fr.scores is None else _finite_probe(fr.scores)
            if r.check_finite:
                if total is not None:
                    host.append(total)
                total = None
            else:
                feature_total = _finite_probe(r.features)
                total = feature_total if total is None else total + feature_total
        invalid = None if total is None else torch.ne(total - total, 0)  # x - x is 0, or NaN for NaN/Inf
        if r.unclamped_ids is not None:
            clamped = torch.ne(r.input_ids, r.unclamped_ids).any()
            invalid = clamped if invalid is None else invalid | clamped
        if invalid is None:
            fr.invalid = torch.zeros((), dtype=torch.bool, device=r.device)
            continue
        if isinstance(fr.cache, DraftCache) and r.weights is not None:  # the new rows: zeros, never the poison
            c, n = length or 0, r.num_new
            for store in (fr.cache.k, fr.cache.v):
                rows = store[:, :, c : c + n]
                torch.where(invalid, rows.new_zeros(()), rows, out=rows)
        fr.invalid = invalid
    if host:
        totals = torch.stack(host).tolist()  # the one host read of check_finite
        bad = [b for b, x in enumerate(totals) if not math.isfinite(x)]
        if bad:
            where = "" if len(requests) == 1 else f" (sequence(s) {bad})"
            raise NonFiniteError(
                f"the draft produced non-finite scores from finite inputs{where}: the draft layer overflowed "
                f"(an fp16 head?). The cache was rolled back"
            )


__all__ = [
    "DraftRequest",
    "CALL_OPTIONS",
    "validate_request",
    "resolve_backend",
    "resolve_weights",
    "check_options",
    "run_requests",
]
