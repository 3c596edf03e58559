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

fp8 heads: any linear weight (``fc``, ``q/k/v/o_proj``, ``gate/up/down_proj``, ``lm_head``) may
be float8_e4m3fn with a per-output-channel fp32 scale under ``<key>_scale`` (``fc.weight`` ->
``fc.weight_scale [H]``), the layout fp8 serving checkpoints use. Its value is the dequantized
weight ``(weight.float() * scale[:, None]).to(dtype)``: that is what the reference computes with
and what the fused kernels reproduce. Embeddings, norms, biases stay in the activation dtype.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .config import FrontierConfig, config_from_ea_layer, detect_architecture
from .errors import WeightsError

#: The fp8 weight format (e4m3, no infinities; 0x7F / 0xFF are NaN) and its largest finite value.
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def is_8bit_float(dtype: torch.dtype) -> bool:
    """Whether a dtype is one of torch's 8-bit floating formats (e4m3fn, e5m2, ...): never an
    activation dtype; e4m3fn is the one fp8 weight format."""
    return dtype.is_floating_point and dtype.itemsize == 1


#: The linear weights a draft step streams, as error messages name them.
LINEAR_NAMES = "fc, q/k/v/o_proj, gate/up/down_proj, lm_head"


def tensor_state(t: torch.Tensor) -> tuple:
    """What derived data of a tensor depends on, besides its identity: its in-place version, its
    storage (the storage object's address), data pointer, dtype, shape and strides (rebinding
    ``t.data`` moves these but not the version)."""
    return t._version, t.untyped_storage()._cdata, t.data_ptr(), t.dtype, t.shape, t.stride()


def tensors_stamp(tensors: Sequence[torch.Tensor]) -> tuple:
    """A stamp of tensors' identity and state (:func:`tensor_state`, checked by
    :func:`stamp_matches`). It holds weak references to the tensors, so a freed tensor whose id
    is reused never matches, and to their storages, which keeps a freed storage's address from
    being taken by another storage while the stamp lives."""
    return (tuple(map(weakref.ref, tensors)), tuple(StorageWeakRef(t.untyped_storage()) for t in tensors),
            list(map(tensor_state, tensors)))


def stamp_matches(stamp: Optional[tuple], tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` are the very tensors of ``stamp``, on the same storages, none written
    in place nor given other data (``t.data = ...``) since. (Writes through ``t.data`` itself,
    which move no version counter, are not seen.)"""
    if stamp is None or len(stamp[0]) != len(tensors):
        return False
    refs, _, states = stamp
    return all(r() is t for r, t in zip(refs, tensors)) and states == list(map(tensor_state, tensors))


def is_linear_key(key: str) -> bool:
    """Whether a public key names a linear weight that the draft step streams (fp8-capable)."""
    return key in ("fc.weight", "lm_head.weight") or key.endswith("_proj.weight")


def scale_key(key: str) -> str:
    """The public key of a linear weight's fp8 scale: ``fc.weight`` -> ``fc.weight_scale``."""
    return key + "_scale"


def scale_owner(key: str) -> Optional[str]:
    """The weight key an fp8 scale key belongs to (``fc.weight_scale`` -> ``fc.weight``, the
    inverse of :func:`scale_key`); None when ``key`` names no scale."""
    return key[: -len("_scale")] if key.endswith(".weight_scale") else None


_CHUNK_ELEMS = 1 << 24  # (rows per step of the row-wise loops: about 64 MB of fp32 at a time)


def _row_chunks(n_rows: int, n_cols: int) -> Iterable[slice]:
    step = max(1, _CHUNK_ELEMS // max(1, n_cols))
    for r in range(0, n_rows, step):
        yield slice(r, min(n_rows, r + step))


def dequantize_fp8(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An fp8 weight [N, K] with per-row scales [N] as a ``dtype`` tensor: each element widened to
    fp32, multiplied by its row's scale in fp32, rounded once to ``dtype`` (row blocks at a time,
    so no fp32 copy of the whole matrix is made)."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    for rows in _row_chunks(w.shape[0], w.shape[1]):
        out[rows] = (w[rows].to(torch.float32) * scale[rows].to(torch.float32)[:, None]).to(dtype)
    return out


def quantize_fp8(w: torch.Tensor, *, power_of_two: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, fp32 scale [N]) of a weight [N, K], one scale per output row.

    The scale maps the row's largest magnitude onto the e4m3 range: ``absmax / 448``, rounded up
    to a power of two by default. A power-of-two scale loses at most one binade at the bottom of
    the range, and makes ``weight * scale`` exact wherever it stays in the dtype's range, so a
    kernel may apply the scale to its fp32 accumulator instead of to every weight element and get
    the same bits. An all-zero row gets scale 1; a value that rounds up past ``w.dtype``'s
    largest finite value once scaled back is rounded toward zero instead. A weight with NaN
    or Inf is a :class:`WeightsError`. Row blocks at a time (no fp32 copy of the whole matrix)."""
    if w.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise WeightsError(f"quantize_fp8 takes a float32, float16 or bfloat16 weight, got {w.dtype}")
    w = w.detach()
    limit = torch.finfo(w.dtype).max
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    scales = []
    tiny = torch.finfo(torch.float32).tiny  # (a row of subnormal values keeps a normal, non-zero scale)
    for rows in _row_chunks(w.shape[0], w.shape[1]):
        wf = w[rows].to(torch.float32)
        amax = wf.abs().amax(dim=1)
        if not bool(torch.isfinite(amax).all()):
            bad = rows.start + int((~torch.isfinite(amax)).nonzero()[0, 0])
            raise WeightsError(f"quantize_fp8: row {bad} of the weight holds non-finite values (NaN or +-Inf)")
        scale = torch.where(amax > 0, (amax / FP8_MAX).clamp_min(tiny), torch.ones_like(amax))
        if power_of_two:
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        qr = (wf / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
        over = qr.to(torch.float32).abs() * scale[:, None] > limit
        if bool(over.any()):  # rounded up past the dtype's range: one e4m3 step toward zero instead
            bits = qr.view(torch.uint8)
            bits[over] -= 1
        q[rows] = qr
        scales.append(scale)
    return q, torch.cat(scales).contiguous()


def fp8_nan(w: torch.Tensor) -> torch.Tensor:
    """Whether an e4m3 tensor holds a NaN (its only non-finite value), read from the bits."""
    return ((w.view(torch.uint8) & 0x7F) == 0x7F).any()


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
    # fp8 linears: public weight key -> fp32 [out] scale (empty: no fp8 weight)
    scales: dict[str, torch.Tensor] = field(default_factory=dict)
    # (target vocabulary, identity and version of every tensor) when their values last passed
    # check_values; an in-place write bumps a tensor's version and so forces a new check
    _values_ok: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)
    # derived data kept while the head's tensors stay the same (memo): key -> (stamp, value)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # --------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The activation (compute) dtype: the embedding's, which fp8 heads keep unquantized."""
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    @property
    def is_fp8(self) -> bool:
        """Whether any linear weight is fp8 (e4m3 with per-output-channel scales)."""
        return bool(self.scales)

    def memo(self, key: Any, make: Any) -> Any:
        """``make()``, kept under ``key`` while no tensor of the head is replaced or written in
        place (derived data: the dequantized head, a backend's stream formats). ``clear_memo()``
        drops what is kept."""
        tensors = list(self.state_dict().values())
        hit = self._memo.get(key)
        if hit is not None and stamp_matches(hit[0], tensors):
            return hit[1]
        value = make()
        self._memo[key] = (tensors_stamp(tensors), value)
        return value

    def clear_memo(self) -> None:
        """Drop the derived data kept by :meth:`memo` (e.g. the dequantized copy torch_ref drafts
        an fp8 head with, about the size of the head in the activation dtype)."""
        self._memo.clear()

    def dequantized(self) -> "DraftWeights":
        """The same head with every fp8 linear dequantized to the activation dtype
        (:func:`dequantize_fp8`); ``self`` when it has none. Kept while no tensor changes (a
        copy of the linears in the activation dtype; :meth:`clear_memo` drops it)."""
        if not self.scales:
            return self
        return self.memo("dequantized", self._dequantize)

    def _dequantize(self) -> "DraftWeights":
        state = {k: v for k, v in self.tensors()}
        for key, s in self.scales.items():
            state[key] = dequantize_fp8(state[key], s, self.dtype)
        return DraftWeights.from_state_dict(state)  # (this head's keys: the same architecture)

    def quantized(self, *, power_of_two: bool = True) -> "DraftWeights":
        """A copy with every linear weight in fp8 (:func:`quantize_fp8`, one scale per output
        channel); embeddings, norms, biases and ``d2t`` are shared. Already-fp8 linears are kept."""
        state = dict(self.tensors())
        scales = dict(self.scales)
        for key, t in list(state.items()):
            if is_linear_key(key) and t.dtype != FP8:
                try:
                    state[key], scales[key] = quantize_fp8(t, power_of_two=power_of_two)
                except WeightsError as exc:
                    raise WeightsError(f"quantized: tensor {key!r}: {exc}") from None
        out = DraftWeights.from_state_dict(state)  # (this head's keys: the same architecture)
        out.scales = scales
        return out

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

    def scale_items(self) -> Iterable[tuple[str, torch.Tensor]]:
        """(``<weight key>_scale``, fp32 [out]) of every fp8 linear, in ``tensors()`` order."""
        for key, _ in self.tensors():
            if key in self.scales:
                yield scale_key(key), self.scales[key]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor by public key, the fp8 scales under ``<weight key>_scale``."""
        return dict(self.tensors()) | dict(self.scale_items())

    def to(self, device: Any = None, dtype: Optional[torch.dtype] = None) -> "DraftWeights":
        """A copy moved/cast (floating tensors take ``dtype``; d2t stays int64; fp8 weights stay
        fp8 and their scales fp32 - ``dtype`` is the activation dtype)."""

        if dtype is not None and (is_8bit_float(dtype) or not dtype.is_floating_point):
            raise WeightsError(f"DraftWeights.to: dtype is the activation dtype (float32, float16 or bfloat16), got "
                               f"{dtype}; quantize linear weights with quantized()")

        def conv(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            if t is None:
                return None
            if t.is_floating_point() and t.dtype != FP8:
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
            scales={k: v.to(device=device) for k, v in self.scales.items()},
        )

    def _scale_bytes(self, keys) -> int:
        return sum(s.numel() * s.element_size() for k, s in self.scales.items() if k in keys)

    def layer_bytes(self) -> int:
        """Bytes of the layer weights (all layers) plus the lm_head, fp8 scales included: what
        one depth streams."""
        total = self.lm_head.numel() * self.lm_head.element_size()
        total += self._scale_bytes({k for k in self.scales if k != "fc.weight"})
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
        n = self.fc_weight.numel() * self.fc_weight.element_size() + self._scale_bytes({"fc.weight"})
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
        scale_keys = {scale_key(k): k for k in self.scales}
        for key, t in have.items():
            if key in expect or key == "d2t" or key in scale_keys:
                continue
            raise WeightsError(f"{where}: unexpected tensor {key!r} for architecture {cfg.architecture!r}")
        dtype, device = self.dtype, self.device
        if is_8bit_float(dtype) or not dtype.is_floating_point:
            raise WeightsError(f"{where}: tensor 'embed_tokens.weight' is {dtype}; embeddings stay in the "
                               "activation dtype (float32, float16 or bfloat16)")
        for key in self.scales:
            if key not in expect or not is_linear_key(key):
                raise WeightsError(f"{where}: fp8 scale for {key!r}, which is not a linear weight of this head "
                                   f"({LINEAR_NAMES})")
        for key, t in have.items():
            if key == "d2t":
                continue
            if t.device != device:
                raise WeightsError(f"{where}: tensor {key!r} is on {t.device}, the rest of the head on {device}")
            if key in scale_keys:
                w = scale_keys[key]
                if t.dtype != torch.float32 or tuple(t.shape) != (expect[w][0],) or not t.is_contiguous():
                    raise WeightsError(f"{where}: fp8 scale {key!r} must be a contiguous float32 tensor of shape "
                                       f"[{expect[w][0]}] (one per output channel of {w!r}), got {t.dtype} "
                                       f"{list(t.shape)}{'' if t.is_contiguous() else ' with strides ' + str(t.stride())}")
                continue
            if t.dtype == FP8:
                if key not in self.scales:
                    raise WeightsError(f"{where}: tensor {key!r} is float8_e4m3fn but has no scale; fp8 weights need "
                                       f"a float32 per-output-channel scale {scale_key(key)!r}")
                continue
            if t.dtype != dtype:
                kind = " or float8_e4m3fn with a scale" if is_linear_key(key) else ""
                raise WeightsError(f"{where}: tensor {key!r} is {t.dtype}, expected the activation dtype {dtype}{kind}")
            if key in self.scales:
                raise WeightsError(f"{where}: tensor {key!r} has an fp8 scale but is {t.dtype}, not float8_e4m3fn")
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
        if self._values_ok is not None and self._values_ok[0] == target_vocab_size and stamp_matches(
                self._values_ok[1], [t for _, t in have]):
            return self
        floats = [(key, t) for key, t in have if t.is_floating_point()]
        flags = [~fp8_nan(t) if t.dtype == FP8 else torch.isfinite(t).all() for _, t in floats]
        # fp8 scales: positive, and the largest e4m3 value times the scale finite in the activation dtype
        limit = torch.finfo(self.dtype).max / FP8_MAX
        scale_items = list(self.scales.items())
        flags += [((s > 0) & (s <= limit)).all() for _, s in scale_items]
        if self.d2t is not None:
            target = self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)  # [V] target ids
            flags.append(((target >= 0) & (target < target_vocab_size)).all())
        ok = torch.stack(flags).tolist()
        for (key, _), good in zip(floats, ok):
            if not good:
                raise WeightsError(f"{where}: tensor {key!r} holds non-finite values (NaN or +-Inf)")
        for (key, s), good in zip(scale_items, ok[len(floats):]):
            if not good:
                row = int((~((s > 0) & (s <= limit))).nonzero()[0, 0])
                raise WeightsError(
                    f"{where}: fp8 scale {scale_key(key)!r} row {row} is {float(s[row])!r}; scales must be positive and "
                    f"at most {limit:.6g} (448 times it must stay finite in {self.dtype})")
        if self.d2t is not None and not ok[len(floats) + len(scale_items)]:
            bad = int((~((target >= 0) & (target < target_vocab_size))).nonzero()[0])
            raise WeightsError(
                f"{where}: tensor 'd2t' maps draft id {bad} to target id {int(target[bad])}, outside the target "
                f"vocabulary [0, target_vocab_size={target_vocab_size})"
            )
        self._values_ok = (target_vocab_size, tensors_stamp([t for _, t in have]))
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
        # (a [out, 1] scale, as some fp8 checkpoints store it, is taken as [out])
        scales = {scale_owner(k): (v.reshape(-1) if v.dim() == 2 and v.shape[1] == 1 else v)
                  for k, v in state.items() if scale_owner(k)}
        return cls(
            scales=scales,
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


__all__ = ["DraftWeights", "LayerWeights", "detect_architecture", "config_from_ea_layer", "head_tensor_shapes",
           "FP8", "FP8_MAX", "quantize_fp8", "dequantize_fp8", "is_linear_key", "scale_key", "scale_owner",
           "is_8bit_float"]
