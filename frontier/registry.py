"""Backend registry: built-ins, explicit registrations and lazily discovered plugins.

A backend is registered under a name with either an object (a :class:`Backend` instance or
class) or a lazy ``"module:attr"`` string that is imported only when the backend is first
requested. Third-party packages advertise backends in the entry-point group
``frontier.backends``; listing them imports nothing, and a plugin that fails to import raises
:class:`BackendUnavailableError` when (and only when) it is requested. Set
``FRONTIER_DISABLE_PLUGIN_AUTOLOAD=1`` to ignore entry points altogether.
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from .errors import BackendNotFoundError, BackendUnavailableError, RegistryError

ENTRY_POINT_GROUP = "frontier.backends"
AUTOLOAD_ENV = "FRONTIER_DISABLE_PLUGIN_AUTOLOAD"


class Backend:
    """Base class (and protocol) of a frontier backend.

    A backend receives inputs already validated by :func:`frontier.frontier_generate`
    (a :class:`frontier.api.DraftRequest`) and returns a :class:`frontier.Frontier`.
    Class attributes declare what it needs and supports; ``frontier_generate`` checks them.
    """

    name: str = ""
    requires_weights: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    #: Names of the backend's own call options (``frontier_generate(..., name=value)``); any
    #: other name is refused as a typo. ``None`` accepts every name unchecked.
    options: Optional[tuple[str, ...]] = ()
    description: str = ""

    def availability(self) -> tuple[bool, str]:
        """(True, "") when the backend can run here, else (False, why not)."""
        return True, ""

    def generate(self, request: Any) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    # Optional: ``static_drafter(drafter, **options)`` returns the draft step of a
    # :class:`frontier.Drafter` over its buffers: an object whose ``step(batch, commit)`` drafts
    # slots [0, batch) with fixed shapes and no host read (subclass frontier.drafter.StaticStep
    # and write its ``draft``). Backends without it draft through ``frontier_generate`` only.


Target = Union[str, Backend, type]


@dataclass
class _Entry:
    target: Target
    source: str  # "frontier" for built-ins, the distribution name for plugins, "user" otherwise
    instance: Optional[Backend] = None
    error: Optional[BaseException] = None


_BUILTINS: dict[str, str] = {
    "stub": "frontier.backends.stub:StubBackend",
    "torch_ref": "frontier.backends.torch_ref:TorchRefBackend",
    "triton": "frontier.backends.triton:TritonBackend",
}

_lock = threading.RLock()
_entries: dict[str, _Entry] = {name: _Entry(target, "frontier") for name, target in _BUILTINS.items()}
_plugins_scanned = False


def _autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _scan_entry_points() -> None:
    """Add entry points of the ``frontier.backends`` group as lazy targets (imports nothing)."""
    global _plugins_scanned
    if _plugins_scanned or _autoload_disabled():
        return
    from importlib.metadata import entry_points

    with _lock:
        if _plugins_scanned:
            return
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in _entries:
                continue  # explicit registrations and built-ins win over plugins
            dist = getattr(ep, "dist", None)
            source = getattr(dist, "name", None) or "entry point"
            _entries[ep.name] = _Entry(ep.value, f"{source} (entry point)")
        _plugins_scanned = True


def register_backend(name: str, target: Target, *, clobber: bool = False) -> None:
    """Register ``target`` under ``name``.

    ``target`` is a :class:`Backend` instance, a Backend class (instantiated on first use) or a
    lazy ``"package.module:attr"`` string. Registering the same target again is a no-op; a
    different target under a taken name raises :class:`RegistryError` unless ``clobber=True``.
    """
    if not isinstance(name, str) or not name.strip():
        raise RegistryError(f"backend name must be a non-empty string, got {name!r}")
    if isinstance(target, str):
        if ":" not in target:
            raise RegistryError(f"lazy backend target must look like 'module:attr', got {target!r}")
    elif not (isinstance(target, Backend) or isinstance(target, type) or callable(getattr(target, "generate", None))):
        raise RegistryError(
            f"backend target for {name!r} must be a Backend instance or class or a 'module:attr' string, "
            f"got {type(target).__name__}"
        )
    _scan_entry_points()
    with _lock:
        existing = _entries.get(name)
        if existing is not None and not clobber:
            if existing.target is target or existing.target == target or existing.instance is target:
                return
            raise RegistryError(
                f"backend name {name!r} is already registered to {_describe(existing.target)} "
                f"(from {existing.source}); pass clobber=True to replace it"
            )
        _entries[name] = _Entry(target, "user")


def unregister_backend(name: str) -> None:
    """Remove a registration (built-ins included); unknown names raise BackendNotFoundError."""
    _scan_entry_points()
    with _lock:
        if name not in _entries:
            raise BackendNotFoundError(_unknown_message(name))
        del _entries[name]


def available_backends() -> list[str]:
    """Names of every registered backend (built-ins, registrations and discovered plugins)."""
    _scan_entry_points()
    with _lock:
        return sorted(_entries)


def get_backend(name: str) -> Backend:
    """Resolve (importing lazily) and return the backend registered under ``name``."""
    _scan_entry_points()
    with _lock:
        entry = _entries.get(name)
        if entry is None:
            raise BackendNotFoundError(_unknown_message(name))
        if entry.instance is not None:
            return entry.instance
        try:
            obj = _resolve(entry.target)
            instance = obj() if isinstance(obj, type) else obj
        except (Exception, SystemExit) as exc:  # a broken plugin must not break the registry (or exit)
            raise BackendUnavailableError(
                f"backend {name!r} ({_describe(entry.target)}, from {entry.source}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not callable(getattr(instance, "generate", None)):
            raise BackendUnavailableError(
                f"backend {name!r} ({_describe(entry.target)}) has no generate(request) method"
            )
        if not getattr(instance, "name", ""):
            try:
                instance.name = name
            except AttributeError:
                pass
        entry.instance = instance
        return instance


def backend_report() -> list[dict[str, Any]]:
    """One row per backend: name, whether it can run here (and why not), where it comes from."""
    rows = []
    for name in available_backends():
        with _lock:
            source = _entries[name].source
        try:
            backend = get_backend(name)
            ok, why = backend.availability()
            needs = "weights" if getattr(backend, "requires_weights", False) else "no weights"
            devices = ",".join(getattr(backend, "devices", ()))
        except (Exception, SystemExit) as exc:  # report, don't raise
            ok, why, needs, devices = False, str(exc), "?", "?"
        rows.append({"name": name, "available": ok, "why": why, "source": source, "needs": needs, "devices": devices})
    return rows


def _resolve(target: Target) -> Any:
    if not isinstance(target, str):
        return target
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _describe(target: Target) -> str:
    if isinstance(target, str):
        return repr(target)
    if isinstance(target, type):
        return f"{target.__module__}.{target.__qualname__}"
    return f"{type(target).__module__}.{type(target).__qualname__} instance"


def _unknown_message(name: str) -> str:
    known = ", ".join(sorted(_entries)) or "(none)"
    return f"unknown backend {name!r}; registered backends: {known}"


def _reset_plugin_scan() -> None:
    """Forget discovered plugins so the next lookup scans entry points again (for tests)."""
    global _plugins_scanned
    with _lock:
        for name in [n for n, e in _entries.items() if e.source.endswith("(entry point)")]:
            del _entries[name]
        _plugins_scanned = False


__all__ = [
    "Backend",
    "register_backend",
    "unregister_backend",
    "get_backend",
    "available_backends",
    "backend_report",
    "ENTRY_POINT_GROUP",
    "AUTOLOAD_ENV",
]
