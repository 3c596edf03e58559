"""The public loader: :func:`load_draft_head` and the :class:`DraftHead` it returns.

A load is planned from metadata first (:mod:`.plan`); only when no problem is left are the
weights read, copied into fresh memory at the requested dtype and device, and validated as
:class:`DraftWeights`. Linear weights stored in fp8 (float8_e4m3fn + float32 ``<key>_scale``)
stay fp8; ``quantize="fp8"`` quantizes the others after the load.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from ..config import FrontierConfig
from ..errors import ConfigError, WeightsError
from ..weights import DraftWeights, scale_key
from .config_json import HeadDims
from .describe import _describe, _fp8_keys, check_quantize, format_description
from .files import PathLike
from .plan import _External, _plan, _raise_problems


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
    #: What ``quantize=`` did (empty when the load quantized nothing): ``method`` ("fp8"),
    #: ``quantized``/``kept`` (linear keys quantized / already fp8 on disk), ``scales``, and the
    #: bytes of the streamed weights (fc + layers + norms + lm_head, fp8 scales included)
    #: ``streamed_bytes_before`` / ``streamed_bytes_after`` / ``bytes_saved``.
    quantization: dict = field(default_factory=dict)

    def config(self, total_token: int, depth: int, top_k: int, **overrides: Any) -> FrontierConfig:
        """The :class:`FrontierConfig` for drafting with this head at the given tree shape."""
        return self.dims.frontier_config(total_token=total_token, depth=depth, top_k=top_k, **overrides)

    def describe(
        self,
        *,
        bandwidth_tbs: Optional[float] = None,
        depth: Optional[int] = None,
        dtype: Optional[torch.dtype] = None,
        quantize: Optional[str] = None,
    ) -> dict:
        """What the head is (see :func:`describe_draft_head`); bytes at ``dtype`` (the activation
        dtype, default: the loaded one) with the loaded fp8 linears at 1 byte per weight plus
        their fp32 scales; ``quantize="fp8"``: the bytes with every linear in fp8."""
        fp8 = _fp8_keys(self.dims, quantize, set(self.weights.scales))
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
            stored_fp8=set(self.weights.scales),
            fp8_keys=fp8,
            quantization=self.quantization,
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
    quantize: Optional[str] = None,
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
    dtype: the activation dtype: every floating tensor is cast to it except fp8 linears stored
        as float8_e4m3fn, which stay fp8, and their float32 scales (None: the head's stored
        dtype of the other floating tensors).
    device: where the weights go.
    strict: unexpected keys and suspicious vocabulary mappings are errors (else warnings).
    config_overrides: config.json fields replaced before reading it (e.g. ``{"rope_scaling": None}``).
    quantize: None, or "fp8": after the load every linear weight (fc, q/k/v/o_proj,
        gate/up/down_proj, lm_head - for eagle2 the target's) not already fp8 is quantized to
        e4m3 with one power-of-two fp32 scale per output channel (:meth:`DraftWeights.quantized`);
        embeddings, norms and biases stay in ``dtype``. ``DraftHead.quantization`` reports it.

    Raises :class:`WeightsError` naming file, key and expected vs found shape; nothing is
    returned or modified on failure.
    """
    check_quantize(quantize)
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

    def own(t: torch.Tensor, to: torch.dtype = out_dtype) -> torch.Tensor:
        # Always a fresh, aligned allocation: never a view of an mmap'd file or of a caller's tensor
        # (an unaligned view can also send BLAS down a differently-rounding path).
        out = t.to(device=device, dtype=to)
        return out.clone() if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() else out.contiguous()

    def get(key: str) -> torch.Tensor:
        t = files.load(key)
        return own(t, t.dtype) if key in plan.fp8_keys else own(t)

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
        if key in plan.fp8_keys:
            state[scale_key(key)] = own(files.load(scale_key(key)), torch.float32)
    if plan.d2t is not None:
        state["d2t"] = plan.d2t.to(device=device)
    weights = DraftWeights.from_state_dict(
        state,
        architecture=dims.architecture,
        embed_tokens=ext(plan.embedding) if plan.embedding is not None else None,
        lm_head=ext(plan.lm_head) if plan.lm_head is not None else None,
        where=f"head {str(plan.path)!r}",
    )
    cfg = dims.frontier_config(total_token=2, depth=1, top_k=1)
    try:
        weights.validate(cfg, where=f"head {str(plan.path)!r}")
    except ConfigError as exc:  # pragma: no cover - dims were checked above
        raise WeightsError(f"head {str(plan.path)!r}: {exc}") from None
    quantization: dict = {}
    if quantize == "fp8":
        before = weights.fc_bytes() + weights.layer_bytes()
        kept = [k for k in dims.linear_keys() if k in weights.scales]
        weights = weights.quantized().validate(cfg, where=f"head {str(plan.path)!r} quantized to fp8")
        after = weights.fc_bytes() + weights.layer_bytes()
        quantization = {
            "method": "fp8",
            "format": "float8_e4m3fn",
            "scales": "float32 per output channel, powers of two",
            "quantized": [k for k in dims.linear_keys() if k not in kept],
            "kept": kept,
            "streamed_bytes_before": before,
            "streamed_bytes_after": after,
            "bytes_saved": before - after,
        }
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
        quantization=quantization,
    )
