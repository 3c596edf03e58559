"""Describing a head on disk from metadata (``frontier inspect``): dimensions, bytes, bandwidth floor.

:func:`describe_draft_head` returns a dict; :func:`format_description` its human-readable
form; :func:`bandwidth_floor_ms` the memory-bandwidth floor of one draft call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from ..errors import InputError
from .config_json import HeadDims
from .files import PathLike, _dt
from .plan import _plan, _raise_problems


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
