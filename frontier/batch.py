"""Batched drafting: one call drafts a tree for each of B sequences.

Ragged layout: a *list* of per-sequence inputs. Sequence b brings ``features[b]`` [1, n_b, F]
and ``input_ids[b]`` [1, L_b + 1]; context lengths L_b and new-row counts n_b may all differ.
The result is one :class:`~frontier.Frontier` per sequence, each identical to drafting that
sequence alone. The draft caches of a batch live in one :class:`BatchDraftCache` allocation
``[B, layers, kv heads, max_length, head_dim]`` whose slots are ordinary
:class:`~frontier.DraftCache` views (so kernels can address every sequence's K/V from one base
pointer); a list of independent ``DraftCache`` objects is accepted too.

A batch call is atomic for the caches: inputs are validated for every sequence before any
backend runs, and if the backend fails part-way, every cache is rolled back to its length
before the call (rows past a cache's length are scratch, so this restores it exactly).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from .cache import DEFAULT_MAX_LENGTH, DraftCache, default_max_length
from .config import FrontierConfig
from .errors import CacheError, FrontierError, InputError
from .request import resolve_backend, resolve_weights, run_requests, validate_request
from .result import Frontier
from .weights import DraftWeights


class BatchDraftCache:
    """Draft caches of B sequences in one allocation; ``cache[b]`` is sequence b's DraftCache."""

    def __init__(self, cfg: FrontierConfig, batch: int, *, max_length: int = DEFAULT_MAX_LENGTH, dtype: torch.dtype, device: Any):
        cfg.require_layer_dims("BatchDraftCache")
        if batch < 1:
            raise InputError(f"batch must be positive, got batch={batch}")
        shape = (batch, cfg.num_layers, cfg.num_key_value_heads, max_length, cfg.head_dim)
        self._k = torch.zeros(shape, dtype=dtype, device=device)  # [B, layers, nkv, max_len, d]
        self._v = torch.zeros_like(self._k)
        self._slots = [DraftCache.from_tensors(self._k[b], self._v[b]) for b in range(batch)]

    @property
    def k(self) -> torch.Tensor:
        """Keys ``[B, num_layers, num_kv_heads, max_length, head_dim]``: the storage the slots view
        (read-only attribute, like :attr:`DraftCache.k`)."""
        return self._k

    @property
    def v(self) -> torch.Tensor:
        """Values, same shape as :attr:`k`."""
        return self._v

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, b: int) -> DraftCache:
        return self._slots[b]

    def __iter__(self):
        return iter(self._slots)

    @property
    def lengths(self) -> list[int]:
        return [c.length for c in self._slots]

    @property
    def max_length(self) -> int:
        return self.k.shape[3]

    def __repr__(self) -> str:
        return f"BatchDraftCache(batch={len(self)}, lengths={self.lengths}, max_length={self.max_length}, dtype={self.k.dtype})"


def frontier_generate_batch(
    cfg: FrontierConfig,
    features: Sequence[torch.Tensor],
    backend: str = "stub",
    *,
    input_ids: Optional[Sequence[torch.Tensor]] = None,
    weights: Optional[DraftWeights] = None,
    ea_layer: Any = None,
    lm_head: Any = None,
    caches: Union[BatchDraftCache, Sequence[Optional[DraftCache]], None] = None,
    cache_max_length: Optional[int] = None,
    sampling: bool = False,
    padded: bool = False,
    seed: int = 0,
    fallback: bool = False,
    **options: Any,
) -> list[Frontier]:
    """Draft one tree per sequence. Arguments as :func:`frontier.frontier_generate`, but
    ``features``/``input_ids``/``caches`` are per-sequence lists (see the module docstring).

    With ``caches=None`` a fresh :class:`BatchDraftCache` is allocated for weight-carrying
    backends; each returned Frontier's ``cache`` is its sequence's slot.
    """
    if not isinstance(cfg, FrontierConfig):
        raise InputError(f"cfg must be a FrontierConfig, got {type(cfg).__name__}")
    if not isinstance(features, (list, tuple)) or not features:
        raise InputError("features must be a non-empty list of [1, n_b, F] tensors, one per sequence")
    batch = len(features)
    if input_ids is not None and (not isinstance(input_ids, (list, tuple)) or len(input_ids) != batch):
        raise InputError(f"input_ids must be a list of {batch} tensors [1, L_b+1] (one per sequence)")
    devices = {f.device for f in features if isinstance(f, torch.Tensor)}
    if len(devices) > 1:
        raise InputError(f"all sequences' features must be on one device, got {sorted(map(str, devices))}")
    dtypes = {f.dtype for f in features if isinstance(f, torch.Tensor)}
    if len(dtypes) > 1:
        raise InputError(f"all sequences' features must share one dtype, got {sorted(map(str, dtypes))}")
    backend, impl = resolve_backend(backend, fallback)
    weights = resolve_weights(weights, ea_layer, lm_head)

    if caches is None:
        cache_list: list[Optional[DraftCache]] = [None] * batch
    else:
        cache_list = list(caches)
        if len(cache_list) != batch:
            raise InputError(f"caches must hold one entry per sequence ({batch}), got {len(cache_list)}")
        if len({id(c) for c in cache_list if c is not None}) != sum(c is not None for c in cache_list):
            raise InputError("caches must be distinct objects: two sequences cannot share one draft cache")

    # Validate every sequence before allocating or touching anything.
    requests = []
    for b in range(batch):
        try:
            requests.append(
                validate_request(
                    cfg,
                    features[b],
                    impl,
                    backend_name=backend,
                    input_ids=None if input_ids is None else input_ids[b],
                    weights=weights,
                    cache=cache_list[b],
                    cache_max_length=cache_max_length,
                    sampling=sampling,
                    padded=padded,
                    seed=seed,
                    options=dict(options),
                    weights_checked=b > 0,  # the shared weights were validated with sequence 0
                )
            )
        except FrontierError as exc:
            raise type(exc)(f"sequence {b}: {exc}") from None

    # Fresh caches of a weight-carrying backend: one allocation for the whole batch.
    if caches is None and getattr(impl, "requires_weights", False):
        longest = max(r.context_length for r in requests)
        max_len = cache_max_length or default_max_length(longest)
        if longest > max_len:
            raise CacheError(f"cache_max_length={max_len} cannot hold the longest context ({longest} rows)")
        fresh = BatchDraftCache(cfg, batch, max_length=max_len, dtype=weights.dtype, device=weights.device)
        cache_list = list(fresh)
        for r, slot in zip(requests, cache_list):
            r.cache = slot

    return run_requests(impl, backend, requests)


__all__ = ["BatchDraftCache", "frontier_generate_batch"]
