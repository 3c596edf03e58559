"""Error hierarchy. Every error frontier raises on purpose derives from :class:`FrontierError`."""

from __future__ import annotations


class FrontierError(Exception):
    """Base class of every error frontier raises deliberately."""


class ConfigError(FrontierError, ValueError):
    """A :class:`~frontier.FrontierConfig` is inconsistent (names the fields and values)."""


class InputError(FrontierError, ValueError):
    """An argument to a frontier call has the wrong shape, dtype, device or value."""


class BackendNotFoundError(FrontierError, KeyError):
    """No backend is registered under the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class BackendUnavailableError(FrontierError, RuntimeError):
    """A backend is registered but cannot run here (import failure, no GPU, missing package)."""


class RegistryError(FrontierError, ValueError):
    """A registration conflicts with an existing one."""


class WeightsError(FrontierError, ValueError):
    """Draft-head weights are missing, mis-shaped or inconsistent with the config."""


class CacheError(FrontierError, ValueError):
    """The draft KV cache is inconsistent with the call, or would overflow."""


class InvariantError(FrontierError, AssertionError):
    """A :class:`~frontier.Frontier` breaks one of the contract's invariants (docs/contract.md)."""


class NonFiniteError(FrontierError, ArithmeticError):
    """The draft turned finite inputs into NaN/Inf (e.g. an fp16 head overflowing); nothing was committed."""


class KernelError(FrontierError, RuntimeError):
    """A device kernel reported a failure (e.g. a grid barrier timed out)."""


__all__ = [
    "FrontierError",
    "ConfigError",
    "InputError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "RegistryError",
    "WeightsError",
    "CacheError",
    "InvariantError",
    "NonFiniteError",
    "KernelError",
]
