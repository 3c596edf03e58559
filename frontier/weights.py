"""Draft-head weights: one container shared by every weight-carrying backend and the loader.

Built from an EAGLE-style module (public attribute names) or a state dict with the public
key names. EAGLE-3 keys::

    fc.weight [H, F]            midlayer.self_attn.{q,k,v,o}_proj.weight
    midlayer.mlp.{gate,up,down}_proj.weight
    midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight
    norm.weight [H]             lm_head.weight [V, H]
    embed_tokens.weight [V_t, H]  d2t [V] (offsets)   (t2d is accepted and ignored)

EAGLE-2 keys: ``fc.weight [H, 2H]``, ``fc.bias [H]``, ``layers.N.self_attn.*``,
``layers.N.mlp.*``, ``layers.N.post_attention_layernorm.weight``,
``layers.N.input_layernorm.weight`` (N >= 1 only), ``embed_tokens.weight``; the target's
lm_head is passed separately (``lm_head=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Optional

import torch

from .config import FrontierConfig, config_from_ea_layer, detect_architecture
from .errors import WeightsError


def head_tensor_shapes(dims: Any) -> dict[str, tuple[int, ...]]:
    """Public key -> shape of every tensor of a draft head (embedding and lm_head included),
    from its dimensions: a :class:`FrontierConfig` or a checkpoint's ``loading.HeadDims``.
    EAGLE-2 drafts with the target's lm_head ([target_vocab_size, H])."""
    h, v, vt, inter = dims.hidden_size, dims.vocab_size, dims.target_vocab_size, dims.intermediate_size
    qd, kvd = dims.num_attention_heads * dims.head_dim, dims.num_key_value_heads * dims.head_dim
    eagle3 = dims.architecture == "eagle3"
    attn_in = 2 * h if eagle3 else h
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (vt, h)}
    out["fc.weight"] = (h, dims.feature_size) if eagle3 else (h, 2 * h)
    if dims.fc_bias:
        out["fc.bias"] = (h,)
    for i in range(dims.num_layers):
        p = "midlayer" if eagle3 else f"layers.{i}"
        out[f"{p}.self_attn.q_proj.weight"] = (qd, attn_in)
        out[f"{p}.self_attn.k_proj.weight"] = (kvd, attn_in)
        out[f"{p}.self_attn.v_proj.weight"] = (kvd, attn_in)
        out[f"{p}.self_attn.o_proj.weight"] = (h, qd)
        out[f"{p}.mlp.gate_proj.weight"] = (inter, h)
        out[f"{p}.mlp.up_proj.weight"] = (inter, h)
        out[f"{p}.mlp.down_proj.weight"] = (h, inter)
        if eagle3 or i > 0:
            out[f"{p}.input_layernorm.weight"] = (h,)
        out[f"{p}.post_attention_layernorm.weight"] = (h,)
    if eagle3:
        out["midlayer.hidden_norm.weight"] = (h,)
        out["norm.weight"] = (h,)
    out["lm_head.weight"] = (v, h) if eagle3 else (vt, h)
    return out


@dataclass
class LayerWeights:
    """One decoder layer. Linear weights are stored as ``[out, in]`` (nn.Linear layout)."""

    q_proj: torch.Tensor  # [n_heads*d, in]  in = 2H (eagle3) or H (eagle2)
    k_proj: torch.Tensor  # [n_kv*d, in]
    v_proj: torch.Tensor  # [n_kv*d, in]
    o_proj: torch.Tensor  # [H, n_heads*d]
    gate_proj: torch.Tensor  # [I, H]
    up_proj: torch.Tensor  # [I, H]
    down_proj: torch.Tensor  # [H, I]
    post_attention_layernorm: torch.Tensor  # [H]
    input_layernorm: Optional[torch.Tensor] = None  # [H]; absent for eagle2 layer 0


@dataclass
class DraftWeights:
    """All tensors of a draft head, on one device, in one floating dtype (d2t is int64)."""

    architecture: str
    embed_tokens: torch.Tensor  # [V_t, H]
    fc_weight: torch.Tensor  # [H, F] (eagle3) | [H, 2H] (eagle2)
    layers: list[LayerWeights]
    lm_head: torch.Tensor  # [V, H] draft lm_head (eagle3) | target lm_head (eagle2)
    fc_bias: Optional[torch.Tensor] = None  # [H] (eagle2 with bias)
    hidden_norm: Optional[torch.Tensor] = None  # [H] (eagle3)
    norm: Optional[torch.Tensor] = None  # [H] final norm before lm_head (eagle3)
    d2t: Optional[torch.Tensor] = None  # [V] int64 offsets: target = draft + d2t[draft]
    # (target vocabulary, identity and version of every tensor) when their values last passed
    # check_values; an in-place write bumps a tensor's version and so forces a new check
    _values_ok: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)

    # --------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    def tensors(self) -> Iterable[tuple[str, torch.Tensor]]:
        """(public key name, tensor) pairs."""
        prefix = "midlayer" if self.architecture == "eagle3" else "layers.{i}"
        yield "embed_tokens.weight", self.embed_tokens
        yield "fc.weight", self.fc_weight
        if self.fc_bias is not None:
            yield "fc.bias", self.fc_bias
        for i, layer in enumerate(self.layers):
            p = prefix.format(i=i)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                yield f"{p}.self_attn.{name}.weight", getattr(layer, name)
            for name in ("gate_proj", "up_proj", "down_proj"):
                yield f"{p}.mlp.{name}.weight", getattr(layer, name)
            if layer.input_layernorm is not None:
                yield f"{p}.input_layernorm.weight", layer.input_layernorm
            yield f"{p}.post_attention_layernorm.weight", layer.post_attention_layernorm
        if self.hidden_norm is not None:
            yield "midlayer.hidden_norm.weight", self.hidden_norm
        if self.norm is not None:
            yield "norm.weight", self.norm
        yield "lm_head.weight", self.lm_head
        if self.d2t is not None:
            yield "d2t", self.d2t

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors())

    def to(self, device: Any = None, dtype: Optional[torch.dtype] = None) -> "DraftWeights":
        """A copy moved/cast (floating tensors take ``dtype``; d2t stays int64)."""

        def conv(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            if t is None:
                return None
            if t.is_floating_point():
                return t.to(device=device, dtype=dtype or t.dtype)
            return t.to(device=device)

        layers = [LayerWeights(**{f.name: conv(getattr(l, f.name)) for f in fields(LayerWeights)}) for l in self.layers]
        return replace(
            self,
            embed_tokens=conv(self.embed_tokens),
            fc_weight=conv(self.fc_weight),
            fc_bias=conv(self.fc_bias),
            layers=layers,
            lm_head=conv(self.lm_head),
            hidden_norm=conv(self.hidden_norm),
            norm=conv(self.norm),
            d2t=conv(self.d2t),
        )

    def layer_bytes(self) -> int:
        """Bytes of the layer weights (all layers) plus the lm_head: what one depth streams."""
        total = self.lm_head.numel() * self.lm_head.element_size()
        for layer in self.layers:
            for f in fields(LayerWeights):
                t = getattr(layer, f.name)
                if t is not None:
                    total += t.numel() * t.element_size()
        if self.norm is not None:
            total += self.norm.numel() * self.norm.element_size()
        if self.hidden_norm is not None:
            total += self.hidden_norm.numel() * self.hidden_norm.element_size()
        return total

    def fc_bytes(self) -> int:
        n = self.fc_weight.numel() * self.fc_weight.element_size()
        if self.fc_bias is not None:
            n += self.fc_bias.numel() * self.fc_bias.element_size()
        return n

    # --------------------------------------------------------------------------------------
    def validate(self, cfg: FrontierConfig, *, where: str = "weights") -> "DraftWeights":
        """Check every tensor against ``cfg``; raise :class:`WeightsError` naming key and shapes."""
        cfg.require_layer_dims("validating draft weights")
        if self.architecture != cfg.architecture:
            raise WeightsError(
                f"{where}: weights are for architecture {self.architecture!r} but the config says {cfg.architecture!r}"
            )
        if len(self.layers) != cfg.num_layers:
            raise WeightsError(f"{where}: {len(self.layers)} layer(s) in the weights, config num_layers={cfg.num_layers}")
        v, vt = cfg.vocab_size, cfg.target_vocab_size
        expect = head_tensor_shapes(cfg)
        have = self.state_dict()
        for key, shape in expect.items():
            t = have.get(key)
            if t is None:
                raise WeightsError(f"{where}: missing tensor {key!r} (expected shape {list(shape)})")
            if tuple(t.shape) != shape:
                raise WeightsError(
                    f"{where}: tensor {key!r} has shape {list(t.shape)}, expected {list(shape)}"
                )
        for key, t in have.items():
            if key in expect or key == "d2t":
                continue
            raise WeightsError(f"{where}: unexpected tensor {key!r} for architecture {cfg.architecture!r}")
        dtype, device = self.dtype, self.device
        for key, t in have.items():
            if key == "d2t":
                continue
            if t.dtype != dtype:
                raise WeightsError(f"{where}: tensor {key!r} is {t.dtype}, the rest of the head is {dtype}")
            if t.device != device:
                raise WeightsError(f"{where}: tensor {key!r} is on {t.device}, the rest of the head on {device}")
        if self.d2t is not None:
            if tuple(self.d2t.shape) != (v,):
                raise WeightsError(f"{where}: tensor 'd2t' has shape {list(self.d2t.shape)}, expected [{v}]")
            if self.d2t.dtype != torch.int64:
                raise WeightsError(f"{where}: tensor 'd2t' must be int64 offsets, got {self.d2t.dtype}")
            if self.d2t.device != device:
                raise WeightsError(f"{where}: tensor 'd2t' is on {self.d2t.device}, the rest of the head on {device}")
        elif v != vt and cfg.architecture == "eagle3":
            raise WeightsError(
                f"{where}: missing tensor 'd2t' (expected shape [{v}]): vocab_size={v} < target_vocab_size={vt} "
                "needs the draft->target offsets"
            )
        return self.check_values(vt, where=where, tensors=have)

    def check_values(
        self, target_vocab_size: int, *, where: str = "weights", tensors: Optional[Mapping[str, torch.Tensor]] = None
    ) -> "DraftWeights":
        """Every floating tensor finite, and every draft id mapped by ``d2t`` into
        ``[0, target_vocab_size)``; raise :class:`WeightsError` naming the tensor.

        The check reads the values (one host read); it is skipped while no tensor was replaced
        or written in place since it last passed for this target vocabulary (``tensors``: the
        state dict, when the caller has it already)."""
        have = list((self.state_dict() if tensors is None else tensors).items())
        stamp = (target_vocab_size,) + tuple((id(t), t._version) for _, t in have)
        if self._values_ok == stamp:
            return self
        floats = [(key, t) for key, t in have if t.is_floating_point()]
        flags = [torch.isfinite(t).all() for _, t in floats]
        if self.d2t is not None:
            target = self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)  # [V] target ids
            flags.append(((target >= 0) & (target < target_vocab_size)).all())
        ok = torch.stack(flags).tolist()
        for (key, _), good in zip(floats, ok):
            if not good:
                raise WeightsError(f"{where}: tensor {key!r} holds non-finite values (NaN or +-Inf)")
        if self.d2t is not None and not ok[-1]:
            bad = int((~((target >= 0) & (target < target_vocab_size))).nonzero()[0])
            raise WeightsError(
                f"{where}: tensor 'd2t' maps draft id {bad} to target id {int(target[bad])}, outside the target "
                f"vocabulary [0, target_vocab_size={target_vocab_size})"
            )
        self._values_ok = stamp
        return self

    # --------------------------------------------------------------------------------------
    @classmethod
    def from_state_dict(
        cls,
        state: Mapping[str, torch.Tensor],
        *,
        architecture: Optional[str] = None,
        lm_head: Optional[torch.Tensor] = None,
        embed_tokens: Optional[torch.Tensor] = None,
        where: str = "state dict",
    ) -> "DraftWeights":
        """Build from public key names. The architecture is detected from the keys unless given.

        ``lm_head``/``embed_tokens`` supply tensors the head does not ship (the target's lm_head
        for eagle2, the target's embedding for eagle3 heads).
        """
        keys = set(state)
        arch = architecture or detect_architecture(keys)
        if arch not in ("eagle3", "eagle2"):
            raise WeightsError(f"{where}: architecture must be 'eagle3' or 'eagle2', got {arch!r}")

        def need(key: str, value: Optional[torch.Tensor] = None) -> torch.Tensor:
            t = value if value is not None else state.get(key)
            if t is None:
                raise WeightsError(f"{where}: missing tensor {key!r}")
            return t

        emb = need("embed_tokens.weight", embed_tokens)
        if arch == "eagle3":
            layer_prefixes = ["midlayer"]
        else:
            idx = sorted({int(k.split(".")[1]) for k in keys if k.startswith("layers.") and k.split(".")[1].isdigit()})
            if not idx:
                raise WeightsError(f"{where}: no 'layers.N.*' tensors found for an eagle2 head")
            if idx != list(range(len(idx))):
                raise WeightsError(f"{where}: eagle2 layers must be numbered 0..N-1, found {idx}")
            layer_prefixes = [f"layers.{i}" for i in idx]
        layers = []
        for i, p in enumerate(layer_prefixes):
            has_in_norm = arch == "eagle3" or i > 0
            layers.append(
                LayerWeights(
                    q_proj=need(f"{p}.self_attn.q_proj.weight"),
                    k_proj=need(f"{p}.self_attn.k_proj.weight"),
                    v_proj=need(f"{p}.self_attn.v_proj.weight"),
                    o_proj=need(f"{p}.self_attn.o_proj.weight"),
                    gate_proj=need(f"{p}.mlp.gate_proj.weight"),
                    up_proj=need(f"{p}.mlp.up_proj.weight"),
                    down_proj=need(f"{p}.mlp.down_proj.weight"),
                    post_attention_layernorm=need(f"{p}.post_attention_layernorm.weight"),
                    input_layernorm=need(f"{p}.input_layernorm.weight") if has_in_norm else None,
                )
            )
        head = lm_head if lm_head is not None else state.get("lm_head.weight")
        if head is None:
            hint = " (eagle2 heads use the target's lm_head: pass lm_head=)" if arch == "eagle2" else ""
            raise WeightsError(f"{where}: missing tensor 'lm_head.weight'{hint}")
        d2t = state.get("d2t")
        return cls(
            architecture=arch,
            embed_tokens=emb,
            fc_weight=need("fc.weight"),
            fc_bias=state.get("fc.bias"),
            layers=layers,
            lm_head=head,
            hidden_norm=need("midlayer.hidden_norm.weight") if arch == "eagle3" else None,
            norm=need("norm.weight") if arch == "eagle3" else None,
            d2t=d2t.long() if d2t is not None else None,
        )

    @classmethod
    def from_ea_layer(cls, layer: Any, *, lm_head: Any = None) -> "DraftWeights":
        """Build from an EAGLE-style module (``model.ea_layer``) with the public attribute names."""
        if not hasattr(layer, "state_dict"):
            raise WeightsError(f"ea_layer must be a torch.nn.Module with the EAGLE attribute names, got {type(layer).__name__}")
        state = {k: v.detach() for k, v in layer.state_dict().items()}
        head = lm_head.weight if isinstance(lm_head, torch.nn.Module) else lm_head
        arch = detect_architecture(set(state))
        if arch == "eagle3" and hasattr(layer, "config"):
            # Public EAGLE-3 modules always carry a d2t buffer; when the draft vocabulary equals the
            # target vocabulary the reference ignores it, and so do we.
            c = layer.config
            if getattr(c, "draft_vocab_size", None) == getattr(c, "vocab_size", None):
                state.pop("d2t", None)
        state.pop("t2d", None)
        return cls.from_state_dict(state, architecture=arch, lm_head=None if head is None else head.detach(), where="ea_layer")


__all__ = ["DraftWeights", "LayerWeights", "detect_architecture", "config_from_ea_layer", "head_tensor_shapes"]
