"""Describing a head on disk from metadata (``frontier inspect``): dimensions, bytes, bandwidth floor.

:func:`describe_draft_head` returns a dict; :func:`format_description` its human-readable
form; :func:`bandwidth_floor_ms` the memory-bandwidth floor of one draft call.

Bytes count what one draft call streams: a weight in the activation dtype at its element size,
an fp8 (e4m3) linear at 1 byte per weight plus a 4-byte fp32 scale per output channel. Beside
the head's own figures the description always carries the fp8 figures (``"fp8"``: every linear
in fp8, as ``load_draft_head(..., quantize="fp8")`` loads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from ..errors import InputError
from ..weights import is_8bit_float, scale_owner
from .config_json import HeadDims
from .files import PathLike, _dt
from .plan import _plan, _raise_problems

#: What ``quantize=`` accepts (load, describe, ``frontier inspect --quantize``): None (as stored)
#: or "fp8" (e4m3 weights, one fp32 scale per output channel).
QUANTIZE_METHODS = (None, "fp8")


def check_quantize(quantize: Optional[str]) -> None:
    """``quantize=`` must be one of :data:`QUANTIZE_METHODS` (an :class:`InputError` otherwise)."""
    if quantize not in QUANTIZE_METHODS:
        raise InputError(f"quantize must be one of {list(QUANTIZE_METHODS)}, got {quantize!r}")


def _fp8_keys(dims: HeadDims, quantize: Optional[str], stored: set[str]) -> set[str]:
    """The linear keys counted as fp8: those ``stored`` in fp8, or all of them with ``quantize="fp8"``."""
    check_quantize(quantize)
    return set(dims.linear_keys()) if quantize == "fp8" else set(stored)


def _format_name(n_fp8: int, n_linear: int, dtype: torch.dtype, *, short: bool = False) -> str:
    """``bfloat16``, or ``fp8 e4m3 ...`` naming how many linears are fp8 and the activation dtype."""
    if not n_fp8:
        return _dt(dtype)
    which = f"all {n_linear} linears" if n_fp8 == n_linear else f"{n_fp8} of {n_linear} linears"
    if short:
        return f"fp8 e4m3 + fp32 scales for {which}, {_dt(dtype)} rest"
    return f"fp8 e4m3 with per-channel fp32 scales, {which}; activations {_dt(dtype)}"


def _floor(b: dict, bandwidth_tbs: float, depth: int) -> dict:
    return {
        "bandwidth_tbs": bandwidth_tbs,
        "depth": depth,
        "bytes": b["fc"] + (depth + 1) * b["per_depth"],
        "ms": bandwidth_floor_ms(b["per_depth"], b["fc"], depth, bandwidth_tbs),
    }


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
    stored_fp8: set[str] = frozenset(),
    fp8_keys: set[str] = frozenset(),
    quantization: Optional[dict] = None,
) -> dict:
    """The description dict. ``stored_fp8``: the linears the head holds in fp8; ``fp8_keys``: the
    linears counted in fp8 for ``bytes``/``floor``; ``quantization``: what the loader did."""
    esize = torch.empty((), dtype=dtype).element_size()
    b = dims.byte_counts(esize, fp8=fp8_keys)
    linears = dims.linear_keys()
    b8 = dims.byte_counts(esize, fp8=linears)
    out: dict[str, Any] = {
        "path": str(path),
        "weights": source,
        "architecture": architecture,
        "architecture_note": arch_note,
        "stored_dtype": _dt(stored_dtype) if stored_dtype is not None else None,
        "weight_format": {
            "name": _format_name(len(stored_fp8), len(linears), stored_dtype or dtype),
            "fp8_linears": len(stored_fp8),
            "linears": len(linears),
            "fp8": "float8_e4m3fn, float32 scale per output channel" if stored_fp8 else None,
        },
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
        "bytes": {"dtype": _dt(dtype), "format": _format_name(len(fp8_keys), len(linears), dtype, short=True), **b},
        "fp8": {"bytes": {"dtype": _dt(dtype), "format": _format_name(len(linears), len(linears), dtype, short=True), **b8}},
        "quantization": dict(quantization or {}),
        "problems": list(problems),
        "warnings": list(warnings),
    }
    if bandwidth_tbs is not None and depth is not None:
        out["floor"] = _floor(b, bandwidth_tbs, depth)
        out["fp8"]["floor"] = _floor(b8, bandwidth_tbs, depth)
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
    quantize: Optional[str] = None,
) -> dict:
    """What a head on disk is, from metadata only (the weights are not read; d2t/t2d are).

    Works without a target (EAGLE-3 heads need the target only to draft, not to be described).
    Issues a strict load would reject are listed under ``problems`` instead of raised; a head
    whose config.json or layout cannot be read at all raises :class:`WeightsError`.

    ``dtype``: the activation dtype the bytes are counted in (default: the stored one); linears
    stored in fp8 count 1 byte per weight plus their fp32 scales. ``quantize="fp8"``: count every
    linear in fp8, as ``load_draft_head(..., quantize="fp8")`` would load it. ``weight_format``
    names what the head stores; ``fp8`` always holds the all-fp8 bytes (and floor).
    """
    check_quantize(quantize)
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
    stored = sorted({
        _dt(t.dtype)
        for k, t in plan.head_info.items()
        if t.dtype.is_floating_point and k not in plan.fp8_keys and scale_owner(k) is None
        and not (is_8bit_float(t.dtype) and k not in plan.dims.expected_shapes())
    })
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
        stored_fp8=set(plan.fp8_keys),
        fp8_keys=_fp8_keys(plan.dims, quantize, plan.fp8_keys),
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
    if d.get("weight_format"):
        lines.append(f"format        {d['weight_format']['name']}")
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
    lines.append(f"bytes ({b.get('format', b['dtype'])})")
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
    f8 = d.get("fp8") or {}
    if "floor" in f8 and f8["bytes"] != b:
        fl, b8 = f8["floor"], f8["bytes"]
        lines.append(
            f"fp8 floor     {fl['ms']:.4g} ms with every linear fp8 e4m3 + fp32 scales (quantize='fp8'): "
            f"{_mb(fl['bytes'])}; per depth {_mb(b8['per_depth'])}, fc {_mb(b8['fc'])}"
        )
    q = d.get("quantization") or {}
    if q:
        lines.append(
            f"quantized     {q['method']} at load ({len(q['quantized'])} linears quantized, {len(q['kept'])} stored fp8): "
            f"streamed weights {_mb(q['streamed_bytes_before'])} -> {_mb(q['streamed_bytes_after'])} "
            f"(saved {_mb(q['bytes_saved'])})"
        )
    for w in d.get("warnings", []):
        lines.append(f"warning       {w}")
    for p in d.get("problems", []):
        lines.append(f"PROBLEM       {p}")
    return "\n".join(lines)
