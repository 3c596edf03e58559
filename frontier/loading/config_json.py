"""A head's config.json in the published EAGLE-2 / EAGLE-3 form, mapped to frontier's dimensions and back.

:func:`_dims_from_config` reads the public field names (``hidden_size``, ``draft_vocab_size``,
``target_hidden_size``, ``bias``, ``rope_theta`` / ``rope_scaling`` / ``rope_parameters``, ...)
into a :class:`HeadDims`, collecting every problem; :meth:`HeadDims.frontier_config` turns
those into a :class:`FrontierConfig`, and :func:`head_config_json` writes a config the other way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import torch

from ..config import FrontierConfig
from ..errors import ConfigError
from ..weights import head_tensor_shapes, is_linear_key
from .files import _dt

#: The ``architectures`` entry of a written config.json, as the public EAGLE configs name it.
_HEAD_ARCH_NAMES = {"eagle3": "LlamaForCausalLMEagle3", "eagle2": "LlamaForCausalLM"}


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

    def byte_counts(self, element_size: int, *, fp8: Iterable[str] = ()) -> dict[str, int]:
        """Bytes of the parameter groups at ``element_size`` bytes per weight.

        ``fp8``: the linear weight keys held in fp8 (e4m3): 1 byte per weight plus a 4-byte fp32
        scale per output channel. ``per_depth``: what one forward of the draft layer streams (all
        layers, norms, lm_head) — the same sum as :meth:`DraftWeights.layer_bytes`; ``fc``: read
        once per call (context rows only); ``embedding``: not streamed (only the K rows of the
        frontier are gathered).
        """
        shapes = self.expected_shapes()
        fp8 = set(fp8)
        unknown = sorted(k for k in fp8 if k not in shapes or not is_linear_key(k))
        if unknown:
            raise ConfigError(f"fp8 keys {unknown} are not linear weights of this {self.architecture} head")

        def size(key: str) -> int:
            s = shapes[key]
            return math.prod(s) + 4 * s[0] if key in fp8 else math.prod(s) * element_size

        n = {k: size(k) for k in shapes}
        fc = n["fc.weight"] + n.get("fc.bias", 0)
        emb = n["embed_tokens.weight"]
        per_depth = sum(n.values()) - fc - emb
        lm = n["lm_head.weight"]
        return {
            "per_depth": per_depth,
            "layer": per_depth - lm,
            "lm_head": lm,
            "fc": fc,
            "embedding": emb,
            "total": sum(n.values()),
        }

    def linear_keys(self) -> list[str]:
        """The keys of the head's linear weights (fc, q/k/v/o, gate/up/down, lm_head): the fp8-capable ones."""
        return [k for k in self.expected_shapes() if is_linear_key(k)]

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


#: The ``quantization_config`` of a written fp8 head: e4m3 weights, one fp32 scale per output
#: channel (``<linear>.weight_scale``), activations unquantized. Informative: the loader reads
#: the format from the tensors themselves.
FP8_QUANTIZATION_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "weight_scheme": "per-channel",
    "weight_block_size": None,
    "activation_scheme": "none",
}


def head_config_json(cfg: FrontierConfig, *, dtype: Optional[torch.dtype] = None, fp8: bool = False) -> dict:
    """config.json of a head in the published layout (field names as the public EAGLE configs).

    ``dtype``: the activation dtype (``torch_dtype``); ``fp8``: the head has fp8 linears, recorded
    as :data:`FP8_QUANTIZATION_CONFIG` under ``quantization_config``."""
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
    if fp8:
        data["quantization_config"] = dict(FP8_QUANTIZATION_CONFIG)
    return data
