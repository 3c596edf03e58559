"""The draft KV cache: the draft layer's keys/values for the context rows.

Preallocated to ``max_length`` rows. A draft call writes the K/V of its ``n`` new context rows
into rows ``[length, length + n)`` and only then advances ``length`` (:meth:`commit`), so a call
that fails part-way leaves the cache exactly as it was (rows past ``length`` are scratch).
The tree's own K/V never enter the cache.

Kernels index the storage with ``length``, so the storage tensors are read-only attributes and
every assignment to ``length`` is checked against ``[0, max_length]``.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch

from .config import FrontierConfig
from .errors import CacheError

DEFAULT_MAX_LENGTH = 4096


def default_max_length(context_length: int) -> int:
    """Rows preallocated for a fresh cache: 4096, or twice the context when that is longer."""
    return max(DEFAULT_MAX_LENGTH, 2 * context_length)


def _row_count(value: Any, name: str, max_length: int) -> int:
    """``value`` as a Python int (ints and integer-like objects; never bools or floats)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise CacheError(f"{name} must be an int in [0, max_length={max_length}], got {value!r}")
    return operator.index(value)


class DraftCache:
    """Keys/values ``[num_layers, num_kv_heads, max_length, head_dim]`` plus a committed length."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_length: int,
        *,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        if max_length < 1:
            raise CacheError(f"max_length must be positive, got max_length={max_length}")
        self._k = torch.zeros(num_layers, num_kv_heads, max_length, head_dim, dtype=dtype, device=device)
        self._v = torch.zeros_like(self._k)
        self._length = 0

    @classmethod
    def from_tensors(cls, k: torch.Tensor, v: torch.Tensor, length: int = 0) -> "DraftCache":
        """Wrap existing storage (e.g. one slot of a :class:`frontier.batch.BatchDraftCache`)."""
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise CacheError(f"k and v must be torch.Tensors, got {type(k).__name__} and {type(v).__name__}")
        if k.dim() != 4 or k.shape != v.shape:
            raise CacheError(f"k and v must both be [layers, kv heads, max_length, head_dim], got {list(k.shape)} and {list(v.shape)}")
        if k.dtype != v.dtype or k.device != v.device:
            raise CacheError(f"k and v must share dtype and device, got {k.dtype} on {k.device} and {v.dtype} on {v.device}")
        if k.shape[2] < 1:
            raise CacheError(f"k and v must hold at least one row (max_length >= 1), got shape {list(k.shape)}")
        cache = cls.__new__(cls)
        cache._k, cache._v, cache._length = k, v, 0
        cache.length = length  # checked by the setter
        return cache

    @classmethod
    def fresh(
        cls, cfg: FrontierConfig, *, context_length: int, dtype: torch.dtype, device: Any, max_length: Optional[int] = None
    ) -> "DraftCache":
        """An empty cache sized for a first call over ``context_length`` rows (CacheError if it cannot fit)."""
        cache = cls.for_config(cfg, max_length=max_length or default_max_length(context_length), dtype=dtype, device=device)
        cache.check_room(context_length)
        return cache

    @classmethod
    def for_config(
        cls, cfg: FrontierConfig, *, max_length: int = DEFAULT_MAX_LENGTH, dtype: torch.dtype, device: Any
    ) -> "DraftCache":
        cfg.require_layer_dims("DraftCache")
        return cls(cfg.num_layers, cfg.num_key_value_heads, cfg.head_dim, max_length, dtype=dtype, device=device)

    # --------------------------------------------------------------------------------------
    @property
    def k(self) -> torch.Tensor:
        """Keys ``[num_layers, num_kv_heads, max_length, head_dim]`` (the storage; read-only attribute)."""
        return self._k

    @property
    def v(self) -> torch.Tensor:
        """Values, same shape as :attr:`k`."""
        return self._v

    @property
    def length(self) -> int:
        """Committed rows: ``[0, length)`` hold the context's K/V."""
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        value = _row_count(value, "length", self.max_length)
        if not 0 <= value <= self.max_length:
            raise CacheError(f"length must lie in [0, max_length={self.max_length}], got length={value}")
        self._length = value

    @property
    def max_length(self) -> int:
        return self._k.shape[2]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    def check_compatible(self, cfg: FrontierConfig, dtype: torch.dtype, device: torch.device) -> None:
        if self._k.shape != self._v.shape or self._k.dim() != 4 or self._length > self._k.shape[2]:
            # only in-place surgery on the storage (resize_, set_) gets here
            raise CacheError(
                f"cache storage is inconsistent: k {list(self._k.shape)}, v {list(self._v.shape)}, length {self._length}"
            )
        expect = (cfg.num_layers, cfg.num_key_value_heads, cfg.head_dim)
        have = (self.k.shape[0], self.k.shape[1], self.k.shape[3])
        if have != expect:
            raise CacheError(
                f"cache has (layers, kv heads, head dim) = {have}, the config needs {expect}"
            )
        if self.dtype != dtype:
            raise CacheError(f"cache dtype is {self.dtype}, the weights are {dtype}")
        if self.device != device:
            raise CacheError(f"cache is on {self.device}, the weights on {device}")

    def check_room(self, n: int) -> None:
        if self.length + n > self.max_length:
            raise CacheError(
                f"draft cache overflow: {self.length} cached + {n} new rows > max_length={self.max_length}; "
                "start a larger cache (cache_max_length=...) or truncate it"
            )

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write rows ``[start, start + n)`` of one layer (k, v: [n_kv, n, d]); does not commit."""
        n = k.shape[1]
        if start < self.length:
            raise CacheError(f"refusing to overwrite committed cache rows ({start} < length {self.length})")
        if start + n > self.max_length:
            raise CacheError(f"draft cache overflow: rows up to {start + n} > max_length={self.max_length}")
        self.k[layer, :, start : start + n] = k
        self.v[layer, :, start : start + n] = v

    def keys(self, layer: int, upto: Optional[int] = None) -> torch.Tensor:
        """[n_kv, upto, d] view of one layer's keys (default: the committed rows)."""
        return self.k[layer, :, : self.length if upto is None else upto]

    def values(self, layer: int, upto: Optional[int] = None) -> torch.Tensor:
        return self.v[layer, :, : self.length if upto is None else upto]

    def commit(self, new_length: int) -> None:
        new_length = _row_count(new_length, "new_length", self.max_length)
        if not self.length <= new_length <= self.max_length:
            raise CacheError(f"cannot commit length {new_length} (length {self.length}, max {self.max_length})")
        self._length = new_length

    def truncate(self, length: int) -> None:
        """Forget rows past ``length`` (e.g. to roll the draft back with the target)."""
        length = _row_count(length, "length", self.max_length)
        if not 0 <= length <= self.length:
            raise CacheError(f"cannot truncate to {length}: the cache holds {self.length} rows")
        self._length = length

    def clone(self) -> "DraftCache":
        return DraftCache.from_tensors(self._k.clone(), self._v.clone(), self._length)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def __repr__(self) -> str:
        return (
            f"DraftCache(length={self.length}, max_length={self.max_length}, layers={self.num_layers}, "
            f"kv_heads={self.k.shape[1]}, head_dim={self.k.shape[3]}, dtype={self.dtype}, device={self.device})"
        )


__all__ = ["DraftCache", "DEFAULT_MAX_LENGTH", "default_max_length"]
