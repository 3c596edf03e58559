"""Load published EAGLE-2 / EAGLE-3 draft heads from local directories (nothing downloads).

A head directory holds ``config.json`` plus the weights in one of the layouts the public
EAGLE releases use::

    model.safetensors                       (preferred when several layouts are present)
    model.safetensors.index.json + model-0000i-of-0000n.safetensors
    pytorch_model.bin
    pytorch_model.bin.index.json + pytorch_model-0000i-of-0000n.bin

Key names are the public ones (see :mod:`frontier.weights`). EAGLE-3 heads carry ``d2t``
(``[draft_vocab]`` int64 OFFSETS: ``target_id = draft_id + d2t[draft_id]``) and ``t2d``
(``[vocab]`` bool: which target ids the draft vocabulary covers). EAGLE-3 LLaMA heads do not ship
the token embedding and EAGLE-2 heads never ship an lm_head: both come from the target model,
either a local checkpoint directory (only ``model.embed_tokens.weight`` / ``lm_head.weight`` are
read, lazily, through the index json) or a loaded Hugging Face model.

Everything is checked from the checkpoint metadata before a single weight is read, and every
error names the file, the key and the expected vs found shape. A failed load returns nothing
and changes nothing: no global state, no argument is modified.

Behaviour where the public code is silent or lenient (documented choices):

* The public loader calls ``load_state_dict(strict=False)``, so a missing key silently keeps a
  random initialisation. Here a missing key is always an error; an unexpected key is an error
  with ``strict=True`` and a warning otherwise (rotary ``inv_freq`` buffers are always ignored).
* ``rope_scaling``: the public EAGLE config accepts only ``{"type": "linear"|"dynamic", "factor": f}``
  and rejects anything else (a ``llama3`` dict fails there). frontier drafts with ``None`` or
  ``linear`` only; any other kind is an error naming config.json. To draft anyway, pass
  ``config_overrides={"rope_scaling": None}`` — then positions use plain RoPE, which is not what
  a head trained with that scaling saw.
* When ``draft_vocab_size == vocab_size`` the public code drops ``d2t``/``t2d``; so do we.
* A head that ships ``embed_tokens.weight`` uses it (as the public loader does, the head's own
  tensor wins over the target's); ``embed_tokens=`` given explicitly wins over both.
* ``dtype=None`` keeps the head's stored floating dtype (which must be uniform); tensors taken
  from the target are cast to it. ``dtype=...`` casts everything.
* Tensors read from files are copied into fresh memory; the embedding / lm_head of a loaded
  target model (or given as ``embed_tokens=``/``lm_head=``) is shared, not copied, when its dtype
  and device already match (a 70B target's embedding is 2 GB).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

import torch

from .config import FrontierConfig
from .errors import ConfigError, InputError, WeightsError
from .weights import DraftWeights, detect_architecture, head_tensor_shapes

PathLike = Union[str, os.PathLike]

#: Weight layouts tried in a checkpoint directory, in order of preference: (kind, single file, index file).
LAYOUTS = (
    ("safetensors", "model.safetensors", "model.safetensors.index.json"),
    ("bin", "pytorch_model.bin", "pytorch_model.bin.index.json"),
)

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

#: Keys the public checkpoints may carry that describe nothing to load (recomputed from the config).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

_HEAD_ARCH_NAMES = {"eagle3": "LlamaForCausalLMEagle3", "eagle2": "LlamaForCausalLM"}


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


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _shape(shape: Iterable[int]) -> str:
    return str(list(shape))


# ==============================================================================================
# Reading checkpoints lazily
# ==============================================================================================
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
        others = [
            name
            for kind, single, index in LAYOUTS
            for name in (single, index)
            if kind != self.kind and (self.directory / name).exists()
        ]
        #: Layout files present but not used (a safetensors layout wins over .bin).
        self.ignored_layouts = others

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
            for _, single, index in LAYOUTS
            for name in (single, index)
            if (self.directory / name).is_symlink() or ((self.directory / name).exists() and not (self.directory / name).is_file())
        ]
        if broken:
            raise WeightsError(f"{self.role} weights in {str(self.directory)!r} cannot be opened: {broken}")
        present = sorted(p.name for p in self.directory.iterdir())[:20]
        wanted = ", ".join(name for _, single, index in LAYOUTS for name in (single, index))
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


def _read_json(path: Path, role: str) -> dict[str, Any]:
    try:
        data = _read_json_file(path, f"{role} config")
    except FileNotFoundError:
        raise WeightsError(f"{role} config {str(path)!r} not found (a head directory holds config.json + weights)") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{role} config {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


# ==============================================================================================
# config.json -> dimensions
# ==============================================================================================
@dataclass(frozen=True)
class HeadDims:
    """The draft head's dimensions as its config.json states them (docs/contract.md symbols)."""

    architecture: str
    hidden_size: int  # H
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # I
    feature_size: int  # F = 3 * target_hidden_size (eagle3) | H (eagle2)
    vocab_size: int  # V: draft vocabulary (lm_head rows)
    target_vocab_size: int  # V_t: embedding rows
    num_layers: int
    fc_bias: bool
    rope_theta: float
    rope_scaling: Optional[dict]
    rms_norm_eps: float

    @property
    def target_hidden_size(self) -> int:
        return self.feature_size // 3 if self.architecture == "eagle3" else self.hidden_size

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Public key -> shape of every tensor of the head (embedding and lm_head included)."""
        return head_tensor_shapes(self)

    def byte_counts(self, element_size: int) -> dict[str, int]:
        """Bytes of the parameter groups at ``element_size`` bytes per weight.

        ``per_depth``: what one forward of the draft layer streams (all layers, norms, lm_head) —
        the same sum as :meth:`DraftWeights.layer_bytes`; ``fc``: read once per call (context
        rows only); ``embedding``: not streamed (only the K rows of the frontier are gathered).
        """
        shapes = self.expected_shapes()
        n = {k: math.prod(s) for k, s in shapes.items()}
        fc = n["fc.weight"] + n.get("fc.bias", 0)
        emb = n["embed_tokens.weight"]
        per_depth = sum(n.values()) - fc - emb
        lm = n["lm_head.weight"]
        return {
            "per_depth": per_depth * element_size,
            "layer": (per_depth - lm) * element_size,
            "lm_head": lm * element_size,
            "fc": fc * element_size,
            "embedding": emb * element_size,
            "total": sum(n.values()) * element_size,
        }

    def frontier_config(self, *, total_token: int, depth: int, top_k: int, **overrides: Any) -> FrontierConfig:
        data: dict[str, Any] = dict(
            total_token=total_token,
            depth=depth,
            top_k=top_k,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            feature_size=self.feature_size,
            target_vocab_size=self.target_vocab_size,
            num_layers=self.num_layers,
            fc_bias=self.fc_bias,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            rms_norm_eps=self.rms_norm_eps,
            architecture=self.architecture,
        )
        data.update(overrides)
        return FrontierConfig(**data)


def _rope_from_config(cfg: Mapping[str, Any], where: str) -> tuple[float, Optional[dict], Optional[str]]:
    """(rope_theta, rope_scaling for FrontierConfig, problem or None)."""
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else None
    theta = cfg.get("rope_theta")
    for nested in (params, cfg.get("rope_scaling")):  # transformers >= 5 nests rope_theta
        if theta is None and isinstance(nested, dict):
            theta = nested.get("rope_theta")
    theta = 10000.0 if theta is None else theta
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        return 10000.0, None, f"{where}: 'rope_theta' must be a positive number, got {theta!r}"
    scaling = cfg.get("rope_scaling")
    if scaling is None and params is not None and params.get("rope_type", "default") != "default":
        scaling = params
    if scaling is None:
        return float(theta), None, None
    if not isinstance(scaling, dict):
        return float(theta), None, f"{where}: 'rope_scaling' must be null or an object, got {scaling!r}"
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default") and "factor" not in scaling:
        return float(theta), None, None
    factor = scaling.get("factor")
    if kind == "linear" and isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0:
        return float(theta), {"type": "linear", "factor": float(factor)}, None
    if kind == "linear":
        return float(theta), None, f"{where}: rope_scaling 'linear' needs a positive 'factor', got rope_scaling={scaling}"
    return (
        float(theta),
        None,
        f"{where}: rope_scaling type {kind!r} is not supported (frontier drafts with rope_scaling null or "
        f"{{'type': 'linear', 'factor': f}}; the public EAGLE config accepts only 'linear'/'dynamic'), "
        f"got rope_scaling={scaling}. To draft anyway with plain RoPE (rope_theta={theta}), pass "
        "config_overrides={'rope_scaling': None} (CLI: --override rope_scaling=null); the tree then differs "
        "from what a head trained with this scaling would draft",
    )


def _dims_from_config(cfg: Mapping[str, Any], arch: str, where: str, problems: list[str]) -> Optional[HeadDims]:
    def get_int(name: str, default: Optional[int] = None, required: bool = True) -> Optional[int]:
        value = cfg.get(name, default)
        if value is None:
            if required:
                problems.append(f"{where}: missing field {name!r} (needed to shape the {arch} head)")
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{where}: field {name!r} must be a positive integer, got {value!r}")
            return None
        return value

    before = len(problems)
    h = get_int("hidden_size")
    heads = get_int("num_attention_heads")
    kv = get_int("num_key_value_heads", heads, required=False) or heads
    inter = get_int("intermediate_size")
    vt = get_int("vocab_size")
    v = get_int("draft_vocab_size", vt) if arch == "eagle3" else vt
    head_dim = get_int("head_dim", required=False)
    if arch == "eagle3":
        th = get_int("target_hidden_size", required=False)
        layers = 1
        fc_bias = False
    else:
        th = None
        layers = get_int("num_hidden_layers", 1)
        bias = cfg.get("bias", True)  # the public loader defaults to a biased fc
        if not isinstance(bias, bool):
            problems.append(f"{where}: field 'bias' must be true or false, got {bias!r}")
        fc_bias = bool(bias)
        if cfg.get("qkv_bias"):
            problems.append(
                f"{where}: 'qkv_bias' is set (Qwen-style biased q/k/v projections); frontier's draft layer has no "
                "attention biases, so this head is not supported"
            )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"{where}: hidden_act={act!r} is not supported (the draft layer's MLP is SiLU-gated)")
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        problems.append(f"{where}: 'rms_norm_eps' must be a positive number, got {eps!r}")
        eps = 1e-6
    if len(problems) > before or None in (h, heads, inter, vt, v):
        return None
    # An unsupported rope scaling is a problem of the load, not of the shapes: the head can still be described.
    theta, scaling, rope_problem = _rope_from_config(cfg, where)
    if rope_problem:
        problems.append(rope_problem)
    if head_dim is None:
        if h % heads:
            problems.append(f"{where}: num_attention_heads={heads} must divide hidden_size={h}")
            return None
        head_dim = h // heads
    if heads % kv:
        problems.append(f"{where}: num_key_value_heads={kv} must divide num_attention_heads={heads}")
        return None
    if v > vt:
        problems.append(f"{where}: draft_vocab_size={v} cannot exceed vocab_size={vt} (the target vocabulary)")
        return None
    return HeadDims(
        architecture=arch,
        hidden_size=h,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        feature_size=3 * (th or h) if arch == "eagle3" else h,
        vocab_size=v,
        target_vocab_size=vt,
        num_layers=layers,
        fc_bias=fc_bias,
        rope_theta=float(theta),
        rope_scaling=scaling,
        rms_norm_eps=float(eps),
    )


# ==============================================================================================
# Planning a load from metadata
# ==============================================================================================
@dataclass
class _External:
    """A tensor the head does not ship (the embedding, or the eagle2 lm_head)."""

    source: str  # human description
    shape: tuple[int, ...]
    dtype: torch.dtype
    fetch: Any  # () -> CPU/any-device tensor
    where: str  # for messages
    shared: bool = False  # the caller's tensor (explicit or a loaded model's): share it when dtype/device match


@dataclass
class _Plan:
    path: Path
    hf_config: dict
    files: Optional[CheckpointFiles]
    architecture: Optional[str]
    arch_note: str
    dims: Optional[HeadDims]
    head_info: dict[str, TensorInfo] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # always fatal
    strict_issues: list[str] = field(default_factory=list)  # fatal when strict, warnings otherwise
    notes: list[str] = field(default_factory=list)  # warnings
    embedding: Optional[_External] = None
    embedding_source: str = ""
    lm_head: Optional[_External] = None
    lm_head_source: str = ""
    stored_dtype: Optional[torch.dtype] = None
    d2t: Optional[torch.Tensor] = None  # validated offsets (None: identity)
    d2t_summary: dict = field(default_factory=dict)

    def problems(self, strict: bool) -> list[str]:
        return self.errors + (self.strict_issues if strict else [])

    def warnings(self, strict: bool) -> list[str]:
        return ([] if strict else self.strict_issues) + self.notes


def _raise_problems(problems: list[str], path: Path) -> None:
    if not problems:
        return
    if len(problems) == 1:
        raise WeightsError(problems[0])
    shown = problems[:12]
    more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    raise WeightsError(
        f"cannot load the draft head in {str(path)!r}: {len(problems)} problems:\n  " + "\n  ".join(shown) + more
    )


def _weight_of(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    w = getattr(x, "weight", None)
    if isinstance(w, torch.Tensor):
        return w.detach()
    raise InputError(f"{name} must be a torch.Tensor or a module with .weight, got {type(x).__name__}")


def _plan(
    path: PathLike,
    *,
    target: Any,
    embed_tokens: Any,
    lm_head: Any,
    architecture: Optional[str],
    dtype: Optional[torch.dtype],
    config_overrides: Optional[Mapping[str, Any]],
    need_external: bool,
) -> _Plan:
    """Everything about the load that metadata can tell, with every problem collected."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"path must be a local directory (str or os.PathLike), got {type(path).__name__}")
    if architecture not in (None, "eagle3", "eagle2"):
        raise InputError(f"architecture must be 'eagle3', 'eagle2' or None (detect from the keys), got {architecture!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputError(f"dtype must be a floating torch.dtype or None (keep the stored dtype), got {dtype!r}")
    if config_overrides is not None and not isinstance(config_overrides, Mapping):
        raise InputError(f"config_overrides must be a dict of config.json fields, got {type(config_overrides).__name__}")
    root = Path(path)
    if root.is_file():  # a weights file or config.json: use its directory
        root = root.parent
    files = CheckpointFiles(root, role="head")
    cfg_path = root / "config.json"
    hf_config = _read_json(cfg_path, "head")
    if config_overrides:
        hf_config = {**hf_config, **dict(config_overrides)}
    where_cfg = f"head config {str(cfg_path)!r}"

    info = files.all_info()
    keys = set(info)
    try:
        detected: Optional[str] = detect_architecture(keys)
    except WeightsError:
        detected = None
    arch = architecture or detected
    hinted = [a for a in hf_config.get("architectures") or [] if isinstance(a, str)]
    if arch is None:
        if any("eagle3" in a.lower() for a in hinted):
            arch = "eagle3"
        else:
            raise WeightsError(
                f"cannot tell the architecture of the head in {files.source!r}: no 'midlayer.*' keys (eagle3) and no "
                f"'layers.N.*' keys (eagle2); keys found: {sorted(keys)[:12]}. Pass architecture='eagle3'|'eagle2'"
            )
    if architecture:
        note = f"forced by architecture={architecture!r}"
        if detected and detected != architecture:
            note += f"; the keys look like {detected!r}"
    else:
        note = "detected from the keys: " + ("midlayer.*" if arch == "eagle3" else "layers.N.*")
    plan = _Plan(path=root, hf_config=hf_config, files=files, architecture=arch, arch_note=note, dims=None, head_info=info)
    if files.ignored_layouts:
        plan.notes.append(f"head {str(root)!r}: using {files.source}; also present and ignored: {files.ignored_layouts}")
    plan.dims = dims = _dims_from_config(hf_config, arch, where_cfg, plan.errors)
    if dims is None:
        return plan

    # --- the head's own tensors against config.json -------------------------------------------
    expected = dims.expected_shapes()
    optional = {"embed_tokens.weight"}
    if arch == "eagle2":
        optional.add("lm_head.weight")  # eagle2 heads use the target's lm_head
    hint = f" ({note})" if architecture and detected and detected != architecture else ""
    for key, shape in expected.items():
        if key in info:
            t = info[key]
            if tuple(t.shape) != shape:
                plan.errors.append(
                    f"head file {str(t.file)!r}: tensor {key!r} has shape {_shape(t.shape)}, expected {_shape(shape)} "
                    f"(from {where_cfg}){hint}"
                )
            elif not t.dtype.is_floating_point:
                plan.errors.append(
                    f"head file {str(t.file)!r}: tensor {key!r} has dtype {_dt(t.dtype)}, expected a floating dtype"
                )
        elif key not in optional:
            bias_hint = ""
            if key == "fc.bias":
                said = "says" if "bias" in hf_config else "omits"
                bias_hint = (
                    f"; config.json {said} 'bias' (the public loader defaults to a biased fc) — if this head's fc has "
                    'no bias, set "bias": false'
                )
            plan.errors.append(
                f"head {files.source}: missing tensor {key!r} (expected shape {_shape(shape)} from {where_cfg}){hint}{bias_hint}"
            )
    if arch == "eagle2" and "lm_head.weight" in info:
        plan.strict_issues.append(
            f"head file {str(info['lm_head.weight'].file)!r}: unexpected tensor 'lm_head.weight' — eagle2 heads draft with "
            "the target's lm_head (pass target= or lm_head=); this tensor is ignored"
        )
    known = set(expected) | {"d2t", "t2d"}
    for key, t in info.items():
        if key in known or key.endswith(_IGNORED_SUFFIXES):
            continue
        plan.strict_issues.append(
            f"head file {str(t.file)!r}: unexpected tensor {key!r} {_shape(t.shape)} for an {arch} head with this "
            f"config{hint} (strict=False ignores it)"
        )
    if arch == "eagle2":
        for key in ("d2t", "t2d"):
            if key in info:
                plan.strict_issues.append(
                    f"head file {str(info[key].file)!r}: unexpected tensor {key!r} — eagle2 heads have no vocabulary mapping"
                )

    # --- dtype: one floating dtype across the head unless dtype= casts ------------------------
    floats = [(k, t) for k, t in info.items() if k in expected and t.dtype.is_floating_point]
    if floats:
        counts: dict[torch.dtype, int] = {}
        for _, t in floats:
            counts[t.dtype] = counts.get(t.dtype, 0) + 1
        plan.stored_dtype = max(counts, key=lambda d: counts[d])
        if dtype is None and len(counts) > 1:
            for k, t in floats:
                if t.dtype != plan.stored_dtype:
                    plan.errors.append(
                        f"head file {str(t.file)!r}: tensor {k!r} is {_dt(t.dtype)} but the rest of the head is "
                        f"{_dt(plan.stored_dtype)}; pass dtype= to cast every tensor to one dtype"
                    )

    # --- vocabulary mapping --------------------------------------------------------------------
    if arch == "eagle3":
        _check_vocab_mapping(plan, dims, info, files)

    # --- tensors the head does not ship --------------------------------------------------------
    _plan_externals(plan, dims, info, target=target, embed_tokens=embed_tokens, lm_head=lm_head, need=need_external)
    return plan


def _check_vocab_mapping(plan: _Plan, dims: HeadDims, info: dict[str, TensorInfo], files: CheckpointFiles) -> None:
    v, vt = dims.vocab_size, dims.target_vocab_size
    summary: dict[str, Any] = {"draft_vocab": v, "target_vocab": vt}
    plan.d2t_summary = summary
    d2t_info, t2d_info = info.get("d2t"), info.get("t2d")
    for key, t, shape in (("d2t", d2t_info, (v,)), ("t2d", t2d_info, (vt,))):
        if t is not None and tuple(t.shape) != shape:
            plan.errors.append(
                f"head file {str(t.file)!r}: tensor {key!r} has shape {_shape(t.shape)}, expected {_shape(shape)} "
                f"({'draft_vocab_size' if key == 'd2t' else 'vocab_size'} from config.json)"
            )
            return
    if d2t_info is not None and (d2t_info.dtype.is_floating_point or d2t_info.dtype == torch.bool):
        plan.errors.append(
            f"head file {str(d2t_info.file)!r}: tensor 'd2t' has dtype {_dt(d2t_info.dtype)}, expected int64 offsets"
        )
        return
    if v == vt:
        summary["mapping"] = "identity (draft vocabulary = target vocabulary)"
        if d2t_info is not None:
            d2t = files.load("d2t")
            if bool((d2t != 0).any()):
                plan.notes.append(
                    f"head file {str(d2t_info.file)!r}: d2t is ignored because draft_vocab_size == vocab_size == {v} "
                    "(as in the public code)"
                )
        return
    if d2t_info is None:
        plan.errors.append(
            f"head {files.source}: missing tensor 'd2t' (expected shape [{v}], int64 offsets): draft_vocab_size={v} < "
            f"vocab_size={vt} needs the draft->target mapping"
        )
        return
    where = f"head file {str(d2t_info.file)!r}: tensor 'd2t'"
    d2t = files.load("d2t").to(torch.int64).clone()
    ar = torch.arange(v, dtype=torch.int64)
    targets = ar + d2t
    in_range_abs = bool(((d2t >= 0) & (d2t < vt)).all()) and int(torch.unique(d2t).numel()) == v
    absolute_hint = (
        f" It looks like ABSOLUTE target ids (every value lies in [0, {vt}) and they are distinct); the published "
        f"format stores OFFSETS (target_id = draft_id + d2t[draft_id]): convert with d2t - torch.arange({v})"
        if in_range_abs
        else ""
    )
    summary.update(
        mapping="d2t offsets",
        offset_min=int(d2t.min()),
        offset_max=int(d2t.max()),
        target_min=int(targets.min()),
        target_max=int(targets.max()),
        monotone=bool((targets[1:] > targets[:-1]).all()) if v > 1 else True,
    )
    if not bool(d2t.any()):
        summary["mapping"] = "d2t all zeros"
        plan.strict_issues.append(
            f"{where} is all zeros but draft_vocab_size={v} < vocab_size={vt}: every draft id j would map to target "
            f"id j, i.e. only the first {v} target ids could ever be drafted. That is the unfilled buffer of a head "
            "saved before its vocabulary mapping was set (or with the mapping lost); the published format stores "
            "offsets target_id = draft_id + d2t[draft_id]"
        )
        plan.d2t = d2t
        return
    lo, hi = int(targets.min()), int(targets.max())
    if lo < 0 or hi >= vt:
        bad = int(((targets < 0) | (targets >= vt)).nonzero()[0, 0])
        plan.errors.append(
            f"{where} maps draft id {bad} to target id {int(targets[bad])}, outside [0, {vt}) "
            f"(target ids span [{lo}, {hi}]).{absolute_hint}"
        )
        return
    n_unique = int(torch.unique(targets).numel())
    if n_unique != v:
        plan.strict_issues.append(
            f"{where} maps {v} draft ids onto only {n_unique} distinct target ids (two draft ids share a target).{absolute_hint}"
        )
    if t2d_info is not None:
        t2d = files.load("t2d")
        if t2d.dtype != torch.bool:
            t2d = t2d != 0
        if bool(t2d.any()):
            covered = t2d.nonzero().flatten()
            mine = torch.zeros(vt, dtype=torch.bool)
            mine[targets] = True
            if torch.equal(mine, t2d):
                summary["t2d"] = "consistent with d2t"
            elif in_range_abs and covered.numel() == v and torch.equal(covered, torch.sort(d2t).values):
                plan.errors.append(
                    f"{where} holds ABSOLUTE target ids: its values are exactly the target ids marked in 't2d', so "
                    f"draft id j would map to j + d2t[j]. The published format stores OFFSETS: convert with "
                    f"d2t - torch.arange({v})"
                )
                return
            else:
                differ = int((mine ^ t2d).sum())
                plan.strict_issues.append(
                    f"{where} disagrees with 't2d' ({str(t2d_info.file)!r}): {differ} target ids are marked in one and "
                    "not the other (t2d[target_id] should be True exactly for target_id = j + d2t[j])"
                )
                summary["t2d"] = f"DISAGREES with d2t on {differ} ids"
        else:
            summary["t2d"] = "all false (unused)"
    else:
        summary["t2d"] = "absent"
    steps = d2t[1:] - d2t[:-1]
    if (
        t2d_info is None or summary.get("t2d") == "all false (unused)"
    ) and v > 1 and bool((steps >= 1).all()) and v * (v - 1) / vt >= 8:
        plan.notes.append(
            f"{where} increases by at least 1 at every step; real offsets stay flat wherever the draft vocabulary "
            f"holds consecutive target ids, so this looks like ABSOLUTE target ids. The published format stores "
            f"OFFSETS (target_id = draft_id + d2t[draft_id]); if yours are absolute, convert with d2t - torch.arange({v})"
        )
    plan.d2t = d2t


def _target_config(directory: Path) -> dict:
    p = directory / "config.json"
    if not p.is_file():
        return {}
    try:
        data = _read_json_file(p, "target config")
    except WeightsError:
        return {}
    return data if isinstance(data, dict) else {}


def _plan_externals(
    plan: _Plan, dims: HeadDims, info: dict[str, TensorInfo], *, target: Any, embed_tokens: Any, lm_head: Any, need: bool
) -> None:
    arch = plan.architecture
    exp_emb = (dims.target_vocab_size, dims.hidden_size)
    exp_head = (dims.target_vocab_size, dims.hidden_size)
    want_emb = embed_tokens is None and "embed_tokens.weight" not in info
    want_head = arch == "eagle2" and lm_head is None
    if arch == "eagle3" and lm_head is not None:
        raise InputError("lm_head= is for eagle2 heads (they use the target's lm_head); eagle3 heads ship their own")

    tcfg: dict = {}
    tfiles: Optional[CheckpointFiles] = None
    module = None
    if target is not None:
        if isinstance(target, (str, os.PathLike)):
            tdir = Path(target)
            if tdir.is_file():
                tdir = tdir.parent
            tcfg = _target_config(tdir)
            if want_emb or want_head:
                tfiles = CheckpointFiles(tdir, role="target")
        elif isinstance(target, torch.nn.Module):
            module = target
            c = getattr(target, "config", None)
            tcfg = c.to_dict() if hasattr(c, "to_dict") else dict(vars(c)) if c is not None else {}
        else:
            raise InputError(
                f"target must be a local target checkpoint directory or a loaded Hugging Face model, got {type(target).__name__}"
            )
        # The target's own config, when known, must agree with the head's.
        th = tcfg.get("hidden_size")
        if isinstance(th, int) and th != dims.target_hidden_size:
            what = "3 x target_hidden_size = F" if arch == "eagle3" else "hidden_size"
            plan.errors.append(
                f"head/target hidden-size mismatch: the target's config says hidden_size={th}, but the head expects "
                f"{dims.target_hidden_size} (its {what}={dims.feature_size if arch == 'eagle3' else dims.hidden_size}, "
                "from config.json) — is this the head's target model?"
            )
        tv = tcfg.get("vocab_size")
        if isinstance(tv, int) and tv != dims.target_vocab_size:
            plan.errors.append(
                f"head/target vocabulary mismatch: the target's config says vocab_size={tv}, the head's config.json "
                f"vocab_size={dims.target_vocab_size} — is this the head's target model?"
            )

    def from_tensor(x: Any, name: str, expect: tuple[int, ...]) -> _External:
        t = _weight_of(x, name)
        return _External(f"{name}= argument", tuple(t.shape), t.dtype, lambda: t, f"{name}=", shared=True)

    def from_files(kind: str, expect: tuple[int, ...]) -> Optional[_External]:
        assert tfiles is not None
        if kind == "embed":
            key = tfiles.find("model.embed_tokens.weight", "embed_tokens.weight", suffix=".embed_tokens.weight")
        else:
            key = tfiles.find("lm_head.weight", suffix=".lm_head.weight")
            if key is None and tcfg.get("tie_word_embeddings") is True:
                key = tfiles.find("model.embed_tokens.weight", "embed_tokens.weight", suffix=".embed_tokens.weight")
        if key is None:
            extra = "" if kind == "embed" else " (and its config.json does not set tie_word_embeddings=true)"
            want = "model.embed_tokens.weight" if kind == "embed" else "lm_head.weight"
            plan.errors.append(f"target {tfiles.source}: no {want!r} tensor{extra}")
            return None
        t = tfiles.info(key)
        files = tfiles
        return _External(f"target {str(t.file)!r} [{key}]", t.shape, t.dtype, lambda: files.load(key), f"target file {str(t.file)!r}: tensor {key!r}")

    def from_module(kind: str) -> Optional[_External]:
        assert module is not None
        getter = "get_input_embeddings" if kind == "embed" else "get_output_embeddings"
        fn = getattr(module, getter, None)
        mod = fn() if callable(fn) else None
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor):
            plan.errors.append(f"target model {type(module).__name__}.{getter}() gives no weight tensor")
            return None
        w = w.detach()
        name = f"target model {type(module).__name__}.{getter}()"
        return _External(name, tuple(w.shape), w.dtype, lambda: w, f"{name}.weight", shared=True)

    def resolve(kind: str, explicit: Any, want: bool, expect: tuple[int, ...]) -> Optional[_External]:
        name = "embed_tokens" if kind == "embed" else "lm_head"
        if explicit is not None:
            return from_tensor(explicit, name, expect)
        if not want:
            return None
        if tfiles is not None:
            return from_files(kind, expect)
        if module is not None:
            return from_module(kind)
        return None

    emb = resolve("embed", embed_tokens, want_emb, exp_emb)
    if emb is None and "embed_tokens.weight" in info:
        plan.embedding_source = f"head {str(info['embed_tokens.weight'].file)!r}"
        if target is not None:  # as in the public loader, the head's own tensor wins over the target's
            plan.embedding_source += " (the head's own; the target's is not used)"
    elif emb is not None:
        plan.embedding, plan.embedding_source = emb, emb.source
    elif need:
        plan.errors.append(
            f"the {arch} head in {str(plan.path)!r} does not ship 'embed_tokens.weight' (expected shape {_shape(exp_emb)}): "
            "it comes from the target model — pass target=<target checkpoint dir or loaded model> or embed_tokens="
        )
    else:
        plan.embedding_source = "not in the head; from the target model (not given)"
    if arch == "eagle2":
        head = resolve("head", lm_head, want_head, exp_head)
        if head is not None:
            plan.lm_head, plan.lm_head_source = head, head.source
        elif need:
            plan.errors.append(
                f"the eagle2 head in {str(plan.path)!r} drafts with the target's lm_head (expected shape {_shape(exp_head)}): "
                "pass target=<target checkpoint dir or loaded model> or lm_head="
            )
        else:
            plan.lm_head_source = "the target's lm_head (not given)"
    else:
        plan.lm_head_source = f"head {str(info['lm_head.weight'].file)!r}" if "lm_head.weight" in info else "missing"

    for ext, expect, label in ((plan.embedding, exp_emb, "embedding"), (plan.lm_head, exp_head, "lm_head")):
        if ext is None:
            continue
        if tuple(ext.shape) != expect:
            rows, cols = (ext.shape + (None, None))[:2]
            why = []
            if len(ext.shape) == 2 and cols != expect[1]:
                why.append(f"hidden-size mismatch: the head's hidden_size={dims.hidden_size}")
            if len(ext.shape) == 2 and rows != expect[0]:
                why.append(f"vocabulary mismatch: the head's config.json vocab_size={dims.target_vocab_size}")
            plan.errors.append(
                f"{ext.where} ({label}) has shape {_shape(ext.shape)}, expected {_shape(expect)}"
                + (f" — head/target {'; '.join(why)}" if why else "")
            )
        elif not ext.dtype.is_floating_point:
            plan.errors.append(f"{ext.where} ({label}) has dtype {_dt(ext.dtype)}, expected a floating dtype")


# ==============================================================================================
# The loaded head
# ==============================================================================================
@dataclass(frozen=True)
class DraftHead:
    """A draft head loaded from disk: its weights, its config.json and where things came from."""

    weights: DraftWeights
    hf_config: dict
    architecture: str
    path: Path
    dims: HeadDims
    source: str = ""
    embedding_source: str = ""
    lm_head_source: str = ""
    vocab_mapping: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def config(self, total_token: int, depth: int, top_k: int, **overrides: Any) -> FrontierConfig:
        """The :class:`FrontierConfig` for drafting with this head at the given tree shape."""
        return self.dims.frontier_config(total_token=total_token, depth=depth, top_k=top_k, **overrides)

    def describe(self, *, bandwidth_tbs: Optional[float] = None, depth: Optional[int] = None, dtype: Optional[torch.dtype] = None) -> dict:
        """What the head is (see :func:`describe_draft_head`); bytes at ``dtype`` (default: the loaded dtype)."""
        return _describe(
            path=self.path,
            source=self.source,
            architecture=self.architecture,
            arch_note="",
            dims=self.dims,
            stored_dtype=self.weights.dtype,
            dtype=dtype or self.weights.dtype,
            embedding_source=self.embedding_source,
            lm_head_source=self.lm_head_source,
            vocab=self.vocab_mapping,
            problems=[],
            warnings=list(self.warnings),
            bandwidth_tbs=bandwidth_tbs,
            depth=depth,
        )

    def summary(self, **kwargs: Any) -> str:
        return format_description(self.describe(**kwargs))


def load_draft_head(
    path: PathLike,
    *,
    target: Any = None,
    embed_tokens: Any = None,
    lm_head: Any = None,
    architecture: Optional[str] = None,
    dtype: Optional[torch.dtype] = None,
    device: Any = "cpu",
    strict: bool = True,
    config_overrides: Optional[Mapping[str, Any]] = None,
) -> DraftHead:
    """Load an EAGLE-3 or EAGLE-2 draft head from a local directory.

    Parameters
    ----------
    path: the head directory (``config.json`` + weights in a published layout).
    target: where the tensors the head does not ship come from — a local target checkpoint
        directory (reads ``model.embed_tokens.weight`` and, for eagle2, ``lm_head.weight``
        lazily) or a loaded Hugging Face model (``get_input_embeddings()``/``get_output_embeddings()``).
    embed_tokens / lm_head: those tensors given directly (they win over ``target``).
    architecture: 'eagle3' | 'eagle2' to override detection from the keys.
    dtype: cast every floating tensor to it (None: keep the head's stored dtype).
    device: where the weights go.
    strict: unexpected keys and suspicious vocabulary mappings are errors (else warnings).
    config_overrides: config.json fields replaced before reading it (e.g. ``{"rope_scaling": None}``).

    Raises :class:`WeightsError` naming file, key and expected vs found shape; nothing is
    returned or modified on failure.
    """
    plan = _plan(
        path,
        target=target,
        embed_tokens=embed_tokens,
        lm_head=lm_head,
        architecture=architecture,
        dtype=dtype,
        config_overrides=config_overrides,
        need_external=True,
    )
    _raise_problems(plan.problems(strict), plan.path)
    for msg in plan.warnings(strict):
        warnings.warn(msg, UserWarning, stacklevel=2)
    dims, files = plan.dims, plan.files
    assert dims is not None and files is not None
    out_dtype = dtype or plan.stored_dtype or torch.float32

    def own(t: torch.Tensor) -> torch.Tensor:
        # Always a fresh, aligned allocation: never a view of an mmap'd file or of a caller's tensor
        # (an unaligned view can also send BLAS down a differently-rounding path).
        out = t.to(device=device, dtype=out_dtype)
        return out.clone() if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() else out.contiguous()

    def get(key: str) -> torch.Tensor:
        return own(files.load(key))

    def ext(e: _External) -> torch.Tensor:
        # A loaded target's embedding / lm_head is shared, not copied, when dtype and device match.
        return e.fetch().to(device=device, dtype=out_dtype) if e.shared else own(e.fetch())

    state: dict[str, torch.Tensor] = {}
    for key in dims.expected_shapes():
        if key in ("embed_tokens.weight", "lm_head.weight") and key not in plan.head_info:
            continue
        if dims.architecture == "eagle2" and key == "lm_head.weight":
            continue
        state[key] = get(key)
    if plan.d2t is not None:
        state["d2t"] = plan.d2t.to(device=device)
    weights = DraftWeights.from_state_dict(
        state,
        architecture=dims.architecture,
        embed_tokens=ext(plan.embedding) if plan.embedding is not None else None,
        lm_head=ext(plan.lm_head) if plan.lm_head is not None else None,
        where=f"head {str(plan.path)!r}",
    )
    try:
        weights.validate(dims.frontier_config(total_token=2, depth=1, top_k=1), where=f"head {str(plan.path)!r}")
    except ConfigError as exc:  # pragma: no cover - dims were checked above
        raise WeightsError(f"head {str(plan.path)!r}: {exc}") from None
    return DraftHead(
        weights=weights,
        hf_config=dict(plan.hf_config),
        architecture=dims.architecture,
        path=plan.path,
        dims=dims,
        source=files.source,
        embedding_source=plan.embedding_source,
        lm_head_source=plan.lm_head_source,
        vocab_mapping=dict(plan.d2t_summary),
        warnings=tuple(plan.warnings(strict)),
    )


# ==============================================================================================
# Describing a head (frontier inspect)
# ==============================================================================================
def bandwidth_floor_ms(per_depth_bytes: int, fc_bytes: int, depth: int, bandwidth_tbs: float) -> float:
    """Memory-bandwidth floor of one draft call, in ms.

    One call streams the fc once (context rows) and the layer + lm_head ``depth + 1`` times
    (the context forward plus ``depth`` tree forwards); the embedding contributes only the K
    gathered rows and is ignored. ``bandwidth_tbs`` is in TB/s (1e12 bytes/s).
    """
    if bandwidth_tbs <= 0:
        raise InputError(f"bandwidth_tbs must be positive, got {bandwidth_tbs}")
    if depth < 0:
        raise InputError(f"depth must be >= 0, got {depth}")
    return (fc_bytes + (depth + 1) * per_depth_bytes) / (bandwidth_tbs * 1e12) * 1e3


def _describe(
    *,
    path: Path,
    source: str,
    architecture: str,
    arch_note: str,
    dims: HeadDims,
    stored_dtype: Optional[torch.dtype],
    dtype: torch.dtype,
    embedding_source: str,
    lm_head_source: str,
    vocab: dict,
    problems: list[str],
    warnings: list[str],
    bandwidth_tbs: Optional[float],
    depth: Optional[int],
) -> dict:
    esize = torch.empty((), dtype=dtype).element_size()
    b = dims.byte_counts(esize)
    out: dict[str, Any] = {
        "path": str(path),
        "weights": source,
        "architecture": architecture,
        "architecture_note": arch_note,
        "stored_dtype": _dt(stored_dtype) if stored_dtype is not None else None,
        "dims": {
            "hidden_size": dims.hidden_size,
            "num_attention_heads": dims.num_attention_heads,
            "num_key_value_heads": dims.num_key_value_heads,
            "head_dim": dims.head_dim,
            "intermediate_size": dims.intermediate_size,
            "feature_size": dims.feature_size,
            "target_hidden_size": dims.target_hidden_size,
            "num_layers": dims.num_layers,
            "fc_bias": dims.fc_bias,
            "rope_theta": dims.rope_theta,
            "rope_scaling": dims.rope_scaling,
            "rms_norm_eps": dims.rms_norm_eps,
        },
        "vocab": {"draft_vocab_size": dims.vocab_size, "target_vocab_size": dims.target_vocab_size, **vocab},
        "embedding": embedding_source,
        "lm_head": lm_head_source,
        "bytes": {"dtype": _dt(dtype), **b},
        "problems": list(problems),
        "warnings": list(warnings),
    }
    if bandwidth_tbs is not None and depth is not None:
        out["floor"] = {
            "bandwidth_tbs": bandwidth_tbs,
            "depth": depth,
            "bytes": b["fc"] + (depth + 1) * b["per_depth"],
            "ms": bandwidth_floor_ms(b["per_depth"], b["fc"], depth, bandwidth_tbs),
        }
    return out


def describe_draft_head(
    path: PathLike,
    *,
    target: Any = None,
    architecture: Optional[str] = None,
    dtype: Optional[torch.dtype] = None,
    bandwidth_tbs: Optional[float] = 4.27,
    depth: Optional[int] = 7,
    config_overrides: Optional[Mapping[str, Any]] = None,
) -> dict:
    """What a head on disk is, from metadata only (the weights are not read; d2t/t2d are).

    Works without a target (EAGLE-3 heads need the target only to draft, not to be described).
    Issues a strict load would reject are listed under ``problems`` instead of raised; a head
    whose config.json or layout cannot be read at all raises :class:`WeightsError`.
    """
    plan = _plan(
        path,
        target=target,
        embed_tokens=None,
        lm_head=None,
        architecture=architecture,
        dtype=torch.float32 if dtype is None else dtype,  # describing never needs a uniform stored dtype
        config_overrides=config_overrides,
        need_external=False,
    )
    if plan.dims is None:
        _raise_problems(plan.errors, plan.path)
    assert plan.dims is not None and plan.files is not None and plan.architecture is not None
    stored = sorted({_dt(t.dtype) for t in plan.head_info.values() if t.dtype.is_floating_point})
    if len(stored) > 1:
        plan.notes.append(f"the head stores several floating dtypes ({', '.join(stored)}): load it with dtype=")
    return _describe(
        path=plan.path,
        source=plan.files.source,
        architecture=plan.architecture,
        arch_note=plan.arch_note,
        dims=plan.dims,
        stored_dtype=plan.stored_dtype,
        dtype=dtype or plan.stored_dtype or torch.float32,
        embedding_source=plan.embedding_source,
        lm_head_source=plan.lm_head_source,
        vocab=plan.d2t_summary,
        problems=plan.problems(strict=True),
        warnings=plan.notes,
        bandwidth_tbs=bandwidth_tbs,
        depth=depth,
    )


def _mb(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n} B"


def format_description(d: dict) -> str:
    """The human-readable form of :func:`describe_draft_head`'s dict."""
    dims, voc, b = d["dims"], d["vocab"], d["bytes"]
    lines = [f"head          {d['path']}", f"weights       {d['weights']}"]
    arch = d["architecture"] + (f"  ({d['architecture_note']})" if d.get("architecture_note") else "")
    lines.append(f"architecture  {arch}")
    if d.get("stored_dtype"):
        lines.append(f"stored dtype  {d['stored_dtype']}")
    f_note = f"3 x target hidden {dims['target_hidden_size']}" if d["architecture"] == "eagle3" else "target hidden = H"
    lines.append(
        f"dims          H={dims['hidden_size']}  heads={dims['num_attention_heads']}  kv_heads={dims['num_key_value_heads']}  "
        f"head_dim={dims['head_dim']}  I={dims['intermediate_size']}  F={dims['feature_size']} ({f_note})  "
        f"layers={dims['num_layers']}  fc_bias={dims['fc_bias']}"
    )
    lines.append(
        f"rope          theta={dims['rope_theta']:g}  scaling={dims['rope_scaling']}  rms_norm_eps={dims['rms_norm_eps']:g}"
    )
    mapping = voc.get("mapping", "identity" if voc["draft_vocab_size"] == voc["target_vocab_size"] else "?")
    vline = f"vocab         draft V={voc['draft_vocab_size']} -> target V_t={voc['target_vocab_size']}  via {mapping}"
    if "target_min" in voc:
        vline += (
            f"; offsets in [{voc['offset_min']}, {voc['offset_max']}], target ids in [{voc['target_min']}, "
            f"{voc['target_max']}], {'increasing' if voc.get('monotone') else 'NOT increasing'}"
        )
    if "t2d" in voc:
        vline += f"; t2d {voc['t2d']}"
    lines.append(vline)
    lines.append(f"embedding     {d['embedding']}")
    lines.append(f"lm_head       {d['lm_head']}")
    lines.append(f"bytes ({b['dtype']})")
    lines.append(
        f"  per depth   {_mb(b['per_depth'])}  (layer{'s' if dims['num_layers'] > 1 else ''} {_mb(b['layer'])} + lm_head {_mb(b['lm_head'])})"
    )
    lines.append(f"  fc (once)   {_mb(b['fc'])}")
    lines.append(f"  embedding   {_mb(b['embedding'])}  (not streamed: only the K frontier rows are gathered)")
    lines.append(f"  total       {_mb(b['total'])}")
    if "floor" in d:
        fl = d["floor"]
        lines.append(
            f"floor         {fl['ms']:.4g} ms per draft call at {fl['bandwidth_tbs']:g} TB/s, depth {fl['depth']}: "
            f"fc + {fl['depth'] + 1} x per-depth = {_mb(fl['bytes'])} (context forward + {fl['depth']} tree forwards)"
        )
    for w in d.get("warnings", []):
        lines.append(f"warning       {w}")
    for p in d.get("problems", []):
        lines.append(f"PROBLEM       {p}")
    return "\n".join(lines)


# ==============================================================================================
# Writing heads in the published layout
# ==============================================================================================
def head_config_json(cfg: FrontierConfig, *, dtype: Optional[torch.dtype] = None) -> dict:
    """config.json of a head in the published layout (field names as the public EAGLE configs)."""
    cfg.require_layer_dims("save_draft_head")
    eagle3 = cfg.architecture == "eagle3"
    data: dict[str, Any] = {
        "architectures": [_HEAD_ARCH_NAMES[cfg.architecture]],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "num_hidden_layers": cfg.num_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "vocab_size": cfg.target_vocab_size,
    }
    if cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads:
        data["head_dim"] = cfg.head_dim  # not read by the public code, which assumes H // heads
    if cfg.rope_scaling is not None:
        data["rope_scaling"] = {"type": "linear", "factor": float(cfg.rope_scaling_factor)}
    if eagle3:
        data["draft_vocab_size"] = cfg.vocab_size
        if cfg.feature_size != 3 * cfg.hidden_size:
            if cfg.feature_size % 3:
                raise ConfigError(
                    f"the published eagle3 format stores F as 3 * target_hidden_size; feature_size={cfg.feature_size} "
                    "is not a multiple of 3"
                )
            data["target_hidden_size"] = cfg.feature_size // 3
    else:
        data["bias"] = bool(cfg.fc_bias)
    if dtype is not None:
        data["torch_dtype"] = _dt(dtype)
    return data


def _split_shards(items: list[tuple[str, torch.Tensor]], shards: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive, non-empty groups of roughly equal byte size."""
    total = sum(t.numel() * t.element_size() for _, t in items)
    out: list[list[tuple[str, torch.Tensor]]] = [[] for _ in range(shards)]
    idx = acc = 0
    for i, (k, t) in enumerate(items):
        later_shards = shards - idx - 1
        if out[idx] and later_shards and (acc >= total * (idx + 1) / shards or len(items) - i <= later_shards):
            idx += 1
        out[idx].append((k, t))
        acc += t.numel() * t.element_size()
    return out


def save_draft_head(
    weights: DraftWeights,
    cfg: FrontierConfig,
    path: PathLike,
    *,
    format: str = "safetensors",
    shards: int = 1,
    include_embedding: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write a head in the published layout: config.json + weights (+ index json when sharded).

    Key names are the public ones; eagle2 heads are written without an lm_head (it is the
    target's); eagle3 heads with ``d2t`` also get ``t2d``. ``include_embedding=False`` (the
    default) leaves ``embed_tokens.weight`` out, as the published EAGLE-3 LLaMA heads do; the
    loader then needs ``target=``. The directory is written in a temporary sibling and moved in
    place, so a failed save leaves no partial head behind.
    """
    if format not in ("safetensors", "bin"):
        raise InputError(f"format must be 'safetensors' or 'bin', got {format!r}")
    if not isinstance(shards, int) or shards < 1:
        raise InputError(f"shards must be a positive int, got {shards!r}")
    if not isinstance(weights, DraftWeights):
        raise InputError(f"weights must be a frontier.DraftWeights, got {type(weights).__name__}")
    weights.validate(cfg, where="save_draft_head")
    config = head_config_json(cfg, dtype=weights.dtype)
    dest = Path(path)
    if dest.exists() and not dest.is_dir():
        raise InputError(f"path {str(dest)!r} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise InputError(f"directory {str(dest)!r} is not empty; pass overwrite=True to replace its head files")

    items: list[tuple[str, torch.Tensor]] = []
    for key, t in weights.tensors():
        if key == "embed_tokens.weight" and not include_embedding:
            continue
        if key == "lm_head.weight" and cfg.architecture == "eagle2":
            continue
        if key == "d2t":
            continue
        items.append((key, t.detach().to("cpu").contiguous().clone()))
    if cfg.architecture == "eagle3" and weights.d2t is not None:
        d2t = weights.d2t.detach().to("cpu", torch.int64).contiguous().clone()
        t2d = torch.zeros(cfg.target_vocab_size, dtype=torch.bool)
        t2d[torch.arange(cfg.vocab_size) + d2t] = True
        items += [("d2t", d2t), ("t2d", t2d)]
    if shards > len(items):
        raise InputError(f"shards={shards} exceeds the number of tensors to write ({len(items)})")

    ext = "safetensors" if format == "safetensors" else "bin"
    single = "model.safetensors" if format == "safetensors" else "pytorch_model.bin"
    stem = "model" if format == "safetensors" else "pytorch_model"

    def write(file: Path, part: list[tuple[str, torch.Tensor]]) -> None:
        if format == "safetensors":
            _safetensors()
            from safetensors.torch import save_file

            save_file(dict(part), str(file), metadata={"format": "pt"})
        else:
            torch.save(dict(part), str(file))

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=str(dest.parent)))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the head directory should not be
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if shards == 1:
            write(tmp / single, items)
        else:
            weight_map: dict[str, str] = {}
            for i, part in enumerate(_split_shards(items, shards)):
                name = f"{stem}-{i + 1:05d}-of-{shards:05d}.{ext}"
                write(tmp / name, part)
                weight_map.update({k: name for k, _ in part})
            total = sum(t.numel() * t.element_size() for _, t in items)
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / f"{single}.index.json").write_text(json.dumps(index, indent=2) + "\n")
        if not dest.exists():
            os.replace(tmp, dest)
        else:
            for p in list(dest.iterdir()):
                if p.name == "config.json" or p.name.startswith(("model", "pytorch_model")):
                    p.unlink()
            for p in tmp.iterdir():
                os.replace(p, dest / p.name)
            tmp.rmdir()
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


__all__ = [
    "DraftHead",
    "HeadDims",
    "CheckpointFiles",
    "TensorInfo",
    "load_draft_head",
    "describe_draft_head",
    "format_description",
    "save_draft_head",
    "head_config_json",
    "bandwidth_floor_ms",
    "LAYOUTS",
]
