"""Reading tensors from a local checkpoint directory: safetensors or torch .bin, single or sharded.

:class:`CheckpointFiles` finds the layout (see :data:`LAYOUTS`), lists the keys from the index
json or the single file's header, and reads one tensor at a time: a shard is opened only when
one of its tensors is asked for. :class:`TensorInfo` is what a header says of a tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from ..errors import WeightsError
from .files import PathLike, _describe_missing, _read_json_file, _shard_name

#: Weight layouts tried in a checkpoint directory, in order of preference: (kind, single file, index file).
LAYOUTS = (
    ("safetensors", "model.safetensors", "model.safetensors.index.json"),
    ("bin", "pytorch_model.bin", "pytorch_model.bin.index.json"),
)
#: (kind, file name) of every file name in :data:`LAYOUTS`, in the same order.
_LAYOUT_FILES = tuple((kind, name) for kind, single, index in LAYOUTS for name in (single, index))

_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _attr):
        _ST_DTYPES[_name] = getattr(torch, _attr)


def _safetensors() -> Any:
    try:
        import safetensors
        import safetensors.torch  # noqa: F401
    except ImportError:
        raise WeightsError(
            "reading or writing .safetensors files needs the 'safetensors' package: pip install 'frontier-eagle[hf]' "
            "(pytorch_model.bin layouts work without it)"
        ) from None
    return safetensors


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives and what it is, read from the file header (no data loaded)."""

    key: str
    file: Path
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


class CheckpointFiles:
    """A local checkpoint directory in one of :data:`LAYOUTS`, read lazily.

    ``keys()`` comes from the index json (sharded) or the single file's header; a shard is opened
    only when one of its tensors is asked for, so reading one tensor of a large target model
    touches one shard header and that tensor's bytes only.
    """

    def __init__(self, directory: PathLike, *, role: str = "head") -> None:
        self.role = role
        self.directory = Path(directory)
        if not self.directory.exists():
            if self.directory.is_symlink():
                raise WeightsError(f"{role} directory {str(self.directory)!r} cannot be opened: "
                                   f"{_describe_missing(self.directory)}")
            raise WeightsError(f"{role} directory {str(self.directory)!r} does not exist")
        if not self.directory.is_dir():
            raise WeightsError(f"{role} path {str(self.directory)!r} is not a directory (pass the checkpoint directory)")
        self.kind, self.index_file, self._weight_map, self.files = self._find_layout()
        self._headers: dict[Path, dict[str, TensorInfo]] = {}
        self._bin: dict[Path, Mapping[str, torch.Tensor]] = {}
        #: Layout files present but not used (a safetensors layout wins over .bin).
        self.ignored_layouts = [
            name for kind, name in _LAYOUT_FILES if kind != self.kind and (self.directory / name).exists()
        ]

    # ------------------------------------------------------------------------------------------
    def _find_layout(self) -> tuple[str, Optional[Path], Optional[dict[str, str]], list[Path]]:
        for kind, single, index in LAYOUTS:
            if (self.directory / single).is_file():
                return kind, None, None, [self.directory / single]
            idx = self.directory / index
            if idx.is_file():
                data = _read_json_file(idx, f"{self.role} index")
                wmap = data.get("weight_map") if isinstance(data, dict) else None
                if not isinstance(wmap, dict) or not wmap:
                    raise WeightsError(f"{self.role} index {str(idx)!r} has no 'weight_map' object mapping keys to shard files")
                wmap = {str(k): _shard_name(v, idx, self.role) for k, v in wmap.items()}
                shards = sorted(set(wmap.values()))
                missing = [_describe_missing(self.directory / s) for s in shards if not (self.directory / s).is_file()]
                if missing:
                    raise WeightsError(
                        f"{self.role} index {str(idx)!r} names shard file(s) that are not in {str(self.directory)!r}: {missing}"
                    )
                return kind, idx, wmap, [self.directory / s for s in shards]
        broken = [
            _describe_missing(self.directory / name)
            for _, name in _LAYOUT_FILES
            if (self.directory / name).is_symlink() or ((self.directory / name).exists() and not (self.directory / name).is_file())
        ]
        if broken:
            raise WeightsError(f"{self.role} weights in {str(self.directory)!r} cannot be opened: {broken}")
        present = sorted(p.name for p in self.directory.iterdir())[:20]
        wanted = ", ".join(name for _, name in _LAYOUT_FILES)
        raise WeightsError(
            f"no {self.role} weights in {str(self.directory)!r}: expected one of {wanted}; found {present}"
        )

    @property
    def source(self) -> str:
        """Human description of the layout: the file, or the index and its shard count."""
        if self.index_file is None:
            return str(self.files[0])
        return f"{self.index_file} ({len(self.files)} shard{'s' if len(self.files) != 1 else ''})"

    def _header(self, file: Path) -> dict[str, TensorInfo]:
        if file in self._headers:
            return self._headers[file]
        out: dict[str, TensorInfo] = {}
        if self.kind == "safetensors":
            safe_open = _safetensors().safe_open
            try:
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for key in f.keys():
                        sl = f.get_slice(key)
                        code = sl.get_dtype()
                        if code not in _ST_DTYPES:
                            raise WeightsError(f"{self.role} file {str(file)!r}: tensor {key!r} has unsupported dtype {code}")
                        out[key] = TensorInfo(key, file, tuple(int(s) for s in sl.get_shape()), _ST_DTYPES[code])
            except WeightsError:
                raise
            except Exception as exc:  # safetensors raises its own error types
                raise WeightsError(f"cannot read {self.role} file {str(file)!r} as safetensors: {exc}") from None
        else:
            state = self._load_bin(file)
            for key, t in state.items():
                out[key] = TensorInfo(key, file, tuple(t.shape), t.dtype)
        self._headers[file] = out
        return out

    def _load_bin(self, file: Path) -> Mapping[str, torch.Tensor]:
        if file in self._bin:
            return self._bin[file]
        try:
            try:
                state = torch.load(str(file), map_location="cpu", mmap=True, weights_only=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc) and "zip" not in str(exc):
                    raise
                state = torch.load(str(file), map_location="cpu", weights_only=True)  # legacy (non-zip) format
        except Exception as exc:
            raise WeightsError(
                f"cannot read {self.role} file {str(file)!r} with torch.load(weights_only=True): {exc}"
            ) from None
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise WeightsError(f"{self.role} file {str(file)!r} does not hold a flat state dict of tensors")
        self._bin[file] = state
        return state

    # ------------------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        if self._weight_map is not None:
            return list(self._weight_map)
        return list(self._header(self.files[0]))

    def file_of(self, key: str) -> Path:
        if self._weight_map is not None:
            if key not in self._weight_map:
                raise KeyError(key)
            return self.directory / self._weight_map[key]
        return self.files[0]

    def info(self, key: str) -> TensorInfo:
        file = self.file_of(key)
        header = self._header(file)
        if key not in header:
            raise WeightsError(
                f"{self.role} index {str(self.index_file)!r} maps {key!r} to {str(file)!r}, but that file has no such tensor"
            )
        return header[key]

    def all_info(self) -> dict[str, TensorInfo]:
        return {k: self.info(k) for k in self.keys()}

    def load(self, key: str) -> torch.Tensor:
        """One tensor, on the CPU, as stored (a safetensors slice read or an mmap'd .bin tensor)."""
        info = self.info(key)
        if self.kind == "safetensors":
            with _safetensors().safe_open(str(info.file), framework="pt", device="cpu") as f:
                return f.get_tensor(key)
        return self._load_bin(info.file)[key]

    def find(self, *candidates: str, suffix: Optional[str] = None) -> Optional[str]:
        """The first candidate key present, else the unique key ending in ``suffix``."""
        keys = self.keys()
        have = set(keys)
        for c in candidates:
            if c in have:
                return c
        if suffix:
            hits = [k for k in keys if k.endswith(suffix)]
            if len(hits) == 1:
                return hits[0]
        return None
