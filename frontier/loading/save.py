"""Writing a head in the published layout: config.json plus safetensors or .bin weights, optionally sharded.

fp8 linears are written as fp8 serving checkpoints store them: ``<linear>.weight`` float8_e4m3fn
followed by ``<linear>.weight_scale`` float32 ``[out]``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from ..config import FrontierConfig
from ..errors import InputError
from ..weights import DraftWeights, scale_key
from .checkpoint import _safetensors
from .config_json import head_config_json
from .files import PathLike


def _nbytes(items: list[tuple[str, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in items)


def _split_shards(items: list[tuple[str, torch.Tensor]], shards: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive, non-empty groups of roughly equal byte size."""
    total = _nbytes(items)
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

    fp8 heads (:attr:`DraftWeights.is_fp8`) keep their fp8 linears bit for bit, each followed by
    its float32 scale ``<key>_scale``; config.json records ``torch_dtype`` = the activation dtype
    and, when an fp8 tensor is written, a ``quantization_config`` (fp8 e4m3, per-channel
    scales). The eagle2 lm_head (the target's) is not written, fp8 or not.
    """
    if format not in ("safetensors", "bin"):
        raise InputError(f"format must be 'safetensors' or 'bin', got {format!r}")
    if not isinstance(shards, int) or shards < 1:
        raise InputError(f"shards must be a positive int, got {shards!r}")
    if not isinstance(weights, DraftWeights):
        raise InputError(f"weights must be a frontier.DraftWeights, got {type(weights).__name__}")
    weights.validate(cfg, where="save_draft_head")
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
            if key in weights.scales:
                warnings.warn("save_draft_head: the eagle2 head's lm_head (the target's) is fp8 here but is not "
                              "written; the saved head drafts with the target's lm_head as loaded (quantize='fp8' "
                              "on load quantizes it again)", UserWarning, stacklevel=2)
            continue
        if key == "d2t":
            continue
        items.append((key, t.detach().to("cpu").contiguous().clone()))
        if key in weights.scales:
            items.append((scale_key(key), weights.scales[key].detach().to("cpu").contiguous().clone()))
    if cfg.architecture == "eagle3" and weights.d2t is not None:
        d2t = weights.d2t.detach().to("cpu", torch.int64).contiguous().clone()
        t2d = torch.zeros(cfg.target_vocab_size, dtype=torch.bool)
        t2d[torch.arange(cfg.vocab_size) + d2t] = True
        items += [("d2t", d2t), ("t2d", t2d)]
    config = head_config_json(cfg, dtype=weights.dtype, fp8=any(k.endswith("_scale") for k, _ in items))
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
            index = {"metadata": {"total_size": _nbytes(items)}, "weight_map": weight_map}
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
