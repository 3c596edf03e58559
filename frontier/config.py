"""`FrontierConfig`: the tree shape of a draft call plus the draft layer's dimensions.

The five tree/vocabulary fields (``total_token``, ``depth``, ``top_k``, ``vocab_size``,
``hidden_size``) are enough for the weight-free stub backend. Backends that run the real
draft layer also need the layer dimensions; :meth:`FrontierConfig.require_layer_dims`
checks for them and names what is missing.

:func:`config_from_ea_layer` derives a config from an EAGLE-style module's config and tensor
shapes; :func:`detect_architecture` tells EAGLE-3 from EAGLE-2 by the public key names. Both
live here, below :mod:`frontier.weights`, which imports this module and never the reverse.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterable, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from .errors import ConfigError, WeightsError

Architecture = Literal["eagle3", "eagle2"]

#: Layer-dimension fields that only weight-carrying backends need.
LAYER_FIELDS = ("num_attention_heads", "intermediate_size")

#: Upper bounds of the integer fields. The tree bounds keep every draft call finite and its
#: buffers small (tree_mask is T x T; the candidate list K + D*K^2 entries); the vocabulary and
#: layer bounds keep every index a kernel computes inside 32-bit signed integers.
MAX_TOTAL_TOKEN = 4096
MAX_DEPTH = 256
MAX_TOP_K = 256
MAX_CANDIDATES = 1 << 24
MAX_VOCAB = (1 << 31) - 1
MAX_WIDTH = 1 << 20  # hidden_size, feature_size, intermediate_size, head_dim
MAX_HEADS = 4096
MAX_LAYERS = 256
_UPPER_BOUNDS = {
    "total_token": MAX_TOTAL_TOKEN,
    "depth": MAX_DEPTH,
    "top_k": MAX_TOP_K,
    "vocab_size": MAX_VOCAB,
    "target_vocab_size": MAX_VOCAB,
    "hidden_size": MAX_WIDTH,
    "feature_size": MAX_WIDTH,
    "intermediate_size": MAX_WIDTH,
    "head_dim": MAX_WIDTH,
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "num_layers": MAX_LAYERS,
}


class _ReadOnlyDict(dict):
    """``FrontierConfig.rope_scaling`` once validated: a dict that refuses changes (the config is
    frozen, and its hash and every check were made from these values)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(f"FrontierConfig is frozen: rope_scaling={dict(self)} cannot change; use "
                          "cfg.replace(rope_scaling=...) for a copy")

    __setitem__ = __delitem__ = __ior__ = update = pop = popitem = clear = setdefault = _refuse

    def __reduce__(self) -> tuple:  # copies and pickles build it whole, not key by key
        return type(self), (dict(self),)


class FrontierConfig(BaseModel):
    """Frozen configuration of one draft head and its tree.

    Symbols follow docs/contract.md: ``T = total_token`` (tree size including the root),
    ``D = depth``, ``K = top_k``, ``V = vocab_size`` (draft vocabulary), ``H = hidden_size``,
    ``F = feature_size``, ``V_t = target_vocab_size``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # --- tree shape and vocabulary (enough for the stub) -------------------------------------
    total_token: int
    depth: int
    top_k: int
    vocab_size: int
    hidden_size: int

    # --- the draft layer (needed by torch_ref / triton) --------------------------------------
    num_attention_heads: Optional[int] = None
    num_key_value_heads: Optional[int] = None  # defaults to num_attention_heads
    head_dim: Optional[int] = None  # defaults to hidden_size // num_attention_heads
    intermediate_size: Optional[int] = None
    feature_size: Optional[int] = None  # F; defaults to 3*H (eagle3) or H (eagle2)
    target_vocab_size: Optional[int] = None  # V_t; defaults to vocab_size
    num_layers: int = 1  # eagle2 heads may stack layers; eagle3 has exactly one
    fc_bias: Optional[bool] = None  # eagle2 fc has a bias by default; eagle3 never
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict[str, Any]] = None  # None or {"type": "linear", "factor": f}
    rms_norm_eps: float = 1e-6
    architecture: Architecture = "eagle3"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_format_validation_error(exc)) from None

    def __hash__(self) -> int:
        # rope_scaling is a dict, so pydantic's field-tuple hash would fail; the canonical JSON
        # of the fields is hashable and equal configs give equal JSON.
        return hash(self.model_dump_json())

    @field_validator(
        "total_token", "depth", "top_k", "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "feature_size", "target_vocab_size", "num_layers", mode="before",
    )
    @classmethod
    def _integer(cls, value: Any) -> Any:
        """Integers and integer-like objects (numpy ints); never bools, strings or floats."""
        if value is None or isinstance(value, bool) or isinstance(value, int):
            return value
        if hasattr(value, "__index__") and not isinstance(value, float):
            return operator.index(value)
        return value  # strict validation rejects it with the field's name

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> "FrontierConfig":
        """As pydantic's, but errors are :class:`ConfigError` like the constructor's."""
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise ConfigError(_format_validation_error(exc)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise ConfigError(
            f"FrontierConfig is frozen: cannot set {name}={value!r}; use cfg.replace({name}=...) for a copy"
        )

    # ------------------------------------------------------------------------------------------
    @model_validator(mode="after")
    def _derive_and_check(self) -> "FrontierConfig":
        problems: list[str] = []
        for name in ("total_token", "depth", "top_k", "vocab_size", "hidden_size", "num_layers"):
            value = getattr(self, name)
            if value < 1:
                problems.append(f"{name} must be positive, got {name}={value}")
        if self.total_token < 2:
            problems.append(
                f"total_token counts the root, so it must be at least 2, got total_token={self.total_token}"
            )
        for name in (
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "feature_size",
            "target_vocab_size",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be positive, got {name}={value}")
        for name, bound in _UPPER_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and value > bound:
                problems.append(f"{name} must be <= {bound}, got {name}={value}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"{name} must be positive and finite, got {name}={value}")
        if problems:
            raise ValueError("; ".join(problems))

        # Derived defaults (the model is frozen, so set through object.__setattr__).
        if self.num_attention_heads is not None:
            if self.num_key_value_heads is None:
                object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
            if self.head_dim is None:
                if self.hidden_size % self.num_attention_heads:
                    problems.append(
                        f"num_attention_heads must divide hidden_size, got hidden_size={self.hidden_size}, "
                        f"num_attention_heads={self.num_attention_heads}"
                    )
                else:
                    object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
            if self.num_attention_heads % self.num_key_value_heads:
                problems.append(
                    f"num_key_value_heads must divide num_attention_heads, got "
                    f"num_attention_heads={self.num_attention_heads}, num_key_value_heads={self.num_key_value_heads}"
                )
        elif self.num_key_value_heads is not None or self.head_dim is not None:
            problems.append("num_key_value_heads/head_dim given without num_attention_heads")
        if self.head_dim is not None and self.head_dim % 2:
            problems.append(f"head_dim must be even for rotary embeddings, got head_dim={self.head_dim}")
        if self.feature_size is None:
            object.__setattr__(
                self, "feature_size", 3 * self.hidden_size if self.architecture == "eagle3" else self.hidden_size
            )
        if self.target_vocab_size is None:
            object.__setattr__(self, "target_vocab_size", self.vocab_size)
        if self.fc_bias is None:
            object.__setattr__(self, "fc_bias", self.architecture == "eagle2")

        # Cross-field rules of the tree.
        max_nodes = self.top_k + self.depth * self.top_k**2
        if max_nodes > MAX_CANDIDATES:
            problems.append(
                f"the candidate list top_k + depth * top_k**2 must hold at most {MAX_CANDIDATES} entries, got "
                f"{max_nodes} (top_k={self.top_k}, depth={self.depth})"
            )
        if self.total_token - 1 > max_nodes:
            problems.append(
                f"total_token - 1 cannot exceed top_k + depth * top_k**2 (the candidate list length): "
                f"total_token={self.total_token}, top_k={self.top_k}, depth={self.depth}, "
                f"so total_token must be <= {max_nodes + 1}"
            )
        if self.top_k > self.vocab_size:
            problems.append(f"top_k must be <= vocab_size, got top_k={self.top_k}, vocab_size={self.vocab_size}")
        if self.vocab_size > self.target_vocab_size:
            problems.append(
                f"vocab_size (draft vocabulary) cannot exceed target_vocab_size, got vocab_size={self.vocab_size}, "
                f"target_vocab_size={self.target_vocab_size}"
            )
        if self.architecture == "eagle3":
            if self.feature_size == self.hidden_size:
                problems.append(
                    "architecture='eagle3' applies fc only to F-wide target features, so feature_size must differ "
                    f"from hidden_size (EAGLE-3 uses 3*hidden), got feature_size={self.feature_size}, "
                    f"hidden_size={self.hidden_size}"
                )
            if self.num_layers != 1:
                problems.append(f"architecture='eagle3' has exactly one layer, got num_layers={self.num_layers}")
            if self.fc_bias:
                problems.append("architecture='eagle3' has no fc bias, got fc_bias=True")
        else:
            if self.vocab_size != self.target_vocab_size:
                problems.append(
                    "architecture='eagle2' uses the target's lm_head, so vocab_size must equal target_vocab_size, "
                    f"got vocab_size={self.vocab_size}, target_vocab_size={self.target_vocab_size}"
                )
            if self.feature_size != self.hidden_size:
                problems.append(
                    "architecture='eagle2' takes the target's last hidden state, so feature_size must equal "
                    f"hidden_size, got feature_size={self.feature_size}, hidden_size={self.hidden_size}"
                )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            factor = self.rope_scaling.get("factor")
            if kind != "linear":
                problems.append(
                    f"rope_scaling type {kind!r} is not supported (supported: None, 'linear'), "
                    f"got rope_scaling={self.rope_scaling}"
                )
            elif (
                isinstance(factor, bool)
                or not isinstance(factor, (int, float))
                or not (math.isfinite(factor) and factor > 0)
            ):
                problems.append(
                    f"rope_scaling 'linear' needs a finite positive 'factor', got rope_scaling={self.rope_scaling}"
                )
        if problems:
            raise ValueError("; ".join(problems))
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", _ReadOnlyDict(self.rope_scaling))
        return self

    # ------------------------------------------------------------------------------------------
    @property
    def max_total_token(self) -> int:
        """Largest allowed ``total_token`` for this ``top_k``/``depth``: ``1 + K + D*K^2``."""
        return 1 + self.top_k + self.depth * self.top_k**2

    @property
    def num_candidates(self) -> int:
        """Candidate-list length ``K + D*K^2`` (docs/contract.md, "One draft call" step 3)."""
        return self.top_k + self.depth * self.top_k**2

    @property
    def has_layer_dims(self) -> bool:
        return all(getattr(self, f) is not None for f in LAYER_FIELDS)

    @property
    def rope_scaling_factor(self) -> float:
        """Linear position-interpolation factor (1.0 when ``rope_scaling`` is None)."""
        if self.rope_scaling is None:
            return 1.0
        return float(self.rope_scaling["factor"])

    def require_layer_dims(self, who: str = "this backend") -> None:
        """Raise :class:`ConfigError` naming the layer fields a weight-carrying backend needs."""
        missing = [f for f in LAYER_FIELDS if getattr(self, f) is None]
        if missing:
            raise ConfigError(
                f"{who} runs the draft layer and needs {', '.join(missing)} in FrontierConfig "
                f"(only the tree fields were given); use FrontierConfig.from_ea_layer(...) or set them"
            )

    def replace(self, **changes: Any) -> "FrontierConfig":
        """A copy with some fields changed, re-validated (derived defaults are recomputed
        only for the fields that were not set explicitly)."""
        data = self.model_dump(exclude_unset=True)
        data.update(changes)
        return FrontierConfig(**data)

    @classmethod
    def from_ea_layer(cls, layer: Any, *, total_token: int, depth: int, top_k: int, **overrides: Any) -> "FrontierConfig":
        """Derive the config from an EAGLE-style module (public attribute names).

        See :func:`config_from_ea_layer`.
        """
        return config_from_ea_layer(layer, total_token=total_token, depth=depth, top_k=top_k, **overrides)


def _format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = err.get("msg", "")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if msg.startswith("invalid FrontierConfig: "):
            msg = msg[len("invalid FrontierConfig: ") :]
        if err.get("type") == "extra_forbidden":
            msg = f"unknown field {loc!r} (FrontierConfig rejects unknown fields)"
            loc = ""
        elif err.get("type") == "missing":
            msg = f"missing required field {loc!r}"
            loc = ""
        elif loc and "input" in err:
            msg = f"{msg} (got {loc}={err['input']!r})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid FrontierConfig: " + "; ".join(parts)


def detect_architecture(keys: Iterable[str]) -> str:
    """'eagle3' for keys with a ``midlayer.*`` entry, 'eagle2' for ``layers.N.*``; else :class:`WeightsError`."""
    keys = set(keys)
    if any(k.startswith("midlayer.") for k in keys):
        return "eagle3"
    if any(k.startswith("layers.") for k in keys):
        return "eagle2"
    raise WeightsError(
        "cannot tell the head's architecture: expected 'midlayer.*' keys (eagle3) or 'layers.N.*' keys (eagle2)"
    )


def config_from_ea_layer(layer: Any, *, total_token: int, depth: int, top_k: int, lm_head: Any = None, **overrides: Any) -> FrontierConfig:
    """Derive a :class:`FrontierConfig` from an EAGLE-style module (its ``config`` and shapes)."""
    state = layer.state_dict()
    arch = overrides.pop("architecture", None) or detect_architecture(state)
    c = getattr(layer, "config", None)
    fc = state["fc.weight"]
    hidden = fc.shape[0]
    p = "midlayer" if arch == "eagle3" else "layers.0"
    q = state[f"{p}.self_attn.q_proj.weight"]
    kproj = state[f"{p}.self_attn.k_proj.weight"]
    attn = None
    try:
        attn = layer.midlayer.self_attn if arch == "eagle3" else layer.layers[0].self_attn
    except AttributeError:
        pass
    heads = getattr(c, "num_attention_heads", None) or getattr(attn, "num_heads", None)
    kv_heads = getattr(c, "num_key_value_heads", None) or getattr(attn, "num_key_value_heads", None)
    head_dim = getattr(attn, "head_dim", None)
    if heads is None and "num_attention_heads" not in overrides:
        raise WeightsError("ea_layer has no config.num_attention_heads; pass num_attention_heads= explicitly")
    if head_dim is None and heads:
        head_dim = q.shape[0] // heads
    if kv_heads is None and head_dim:
        kv_heads = kproj.shape[0] // head_dim
    if lm_head is not None:
        head_rows = (lm_head.weight if isinstance(lm_head, torch.nn.Module) else lm_head).shape[0]
    elif "lm_head.weight" in state:
        head_rows = state["lm_head.weight"].shape[0]
    else:
        raise WeightsError("eagle2 heads use the target's lm_head: pass lm_head= to derive the vocabulary")
    data: dict[str, Any] = dict(
        total_token=total_token,
        depth=depth,
        top_k=top_k,
        hidden_size=hidden,
        vocab_size=head_rows,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=state[f"{p}.mlp.gate_proj.weight"].shape[0],
        feature_size=fc.shape[1] if arch == "eagle3" else hidden,
        target_vocab_size=state["embed_tokens.weight"].shape[0] if "embed_tokens.weight" in state else head_rows,
        architecture=arch,
        rope_theta=float(getattr(c, "rope_theta", 10000.0) or 10000.0),
        rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6) or 1e-6),
        rope_scaling=getattr(c, "rope_scaling", None),
    )
    if arch == "eagle2":
        data["num_layers"] = len({k.split(".")[1] for k in state if k.startswith("layers.")})
        data["fc_bias"] = "fc.bias" in state
    data.update(overrides)
    return FrontierConfig(**data)


__all__ = ["FrontierConfig", "Architecture", "detect_architecture", "config_from_ea_layer"]
