"""Locating a checkpoint's files and reading its small JSON files safely.

A config.json or index json is read only when it is a regular file of at most
:data:`MAX_JSON_BYTES`; a shard name from an index must stay inside the checkpoint directory.
Every refusal is a :class:`WeightsError` naming the file. ``_dt`` and ``_shape`` are the
forms in which every loading message writes a dtype and a shape.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterable, Union

import torch

from ..errors import WeightsError

PathLike = Union[str, os.PathLike]

#: Largest config.json / index json read (a real one is a few kB; an index of a 400B model ~100 kB).
MAX_JSON_BYTES = 16 << 20


def _read_json_file(path: Path, what: str) -> Any:
    """Parse a small JSON file, refusing what is not a regular file of at most
    :data:`MAX_JSON_BYTES` (a symlink to /dev/zero, a device, a fifo) with a message naming it;
    FileNotFoundError only when nothing, not even a symlink, is there."""
    try:
        st = path.stat()  # follows symlinks
    except FileNotFoundError:
        if path.is_symlink():
            raise WeightsError(f"{what} {str(path)!r} is a symlink to {os.readlink(path)!r}, which does not exist") from None
        raise
    except OSError as exc:  # a symlink loop (ELOOP), no permission, ...
        raise WeightsError(f"{what} {str(path)!r} cannot be opened: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise WeightsError(f"{what} {str(path)!r} is not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise WeightsError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise WeightsError(f"{what} {str(path)!r} is larger than {MAX_JSON_BYTES} bytes; that is no config file")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep to parse
        raise WeightsError(f"{what} {str(path)!r} is not valid JSON: {type(exc).__name__}: {exc}") from None


def _shard_name(name: Any, index: Path, role: str) -> str:
    """A shard file name from an index's weight_map: a relative path that stays inside the
    checkpoint directory (no absolute path, no '..')."""
    if not isinstance(name, str) or not name:
        raise WeightsError(f"{role} index {str(index)!r} maps a tensor to {name!r}; shard names are file names")
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or "\\" in name or ":" in name:
        raise WeightsError(
            f"{role} index {str(index)!r} names shard {name!r}, which is not a relative path inside the checkpoint "
            "directory"
        )
    return name


def _describe_missing(p: Path) -> str:
    """Why a listed file cannot be used: missing, a dangling symlink, a symlink loop, not a file."""
    if p.is_symlink():
        try:
            p.stat()
        except FileNotFoundError:
            return f"{p.name} (a symlink to {os.readlink(p)!r}, which does not exist)"
        except OSError as exc:
            return f"{p.name} (a symlink that cannot be followed: {exc.strerror or exc})"
    if p.exists() and not p.is_file():
        return f"{p.name} (not a regular file)"
    return p.name


def _read_json(path: Path, role: str) -> dict[str, Any]:
    try:
        data = _read_json_file(path, f"{role} config")
    except FileNotFoundError:
        raise WeightsError(f"{role} config {str(path)!r} not found (a head directory holds config.json + weights)") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{role} config {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _shape(shape: Iterable[int]) -> str:
    return str(list(shape))
