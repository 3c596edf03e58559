"""The draft layer, one step per function (docs/contract.md, "The draft layer").

Every function mirrors the public EAGLE code's order of floating-point operations, so that in
float32 the outputs are bitwise equal to it: RMSNorm in fp32 cast back before the weight
multiply, attention scores ``(q @ k^T) / sqrt(d)`` plus an additive fp32 mask, softmax in fp32
cast back to the compute dtype, then ``@ v``.

Shapes use the contract's names: N rows in this forward, P = rows already attended to (cache + earlier
tree rows), H hidden, d head dim, nh heads, nkv KV heads.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ...config import FrontierConfig
from ...weights import DraftWeights, LayerWeights

MASKED = torch.finfo(torch.float32).min  # additive mask value for a forbidden key


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``w * (x * rsqrt(mean(x^2) + eps))`` in fp32, cast back to x's dtype before the weight."""
    dtype = x.dtype
    x32 = x.to(torch.float32)  # [N, H]
    variance = x32.pow(2).mean(-1, keepdim=True)  # [N, 1]
    x32 = x32 * torch.rsqrt(variance + eps)  # [N, H]
    return weight * x32.to(dtype)  # [N, H]


def rope_cos_sin(cfg: FrontierConfig, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables at ``positions`` ("rotate half" layout): cos, sin [N, d] in ``dtype``."""
    d = cfg.head_dim
    exponent = torch.arange(0, d, 2, device=positions.device).float() / d  # [d/2]
    inv_freq = 1.0 / (cfg.rope_theta**exponent)  # [d/2]
    t = positions.to(torch.float32)  # [N]
    if cfg.rope_scaling is not None:  # linear position interpolation
        t = t / cfg.rope_scaling_factor
    freqs = t[:, None] * inv_freq[None, :]  # [N, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [N, d]
    return emb.cos().to(dtype), emb.sin().to(dtype)  # [N, d] each


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, N, d]; cos/sin [N, d] broadcast over heads."""
    return (x * cos) + (rotate_half(x) * sin)  # [heads, N, d]


def qkv_rope(
    cfg: FrontierConfig, lw: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Projections + rotary: q [nh, N, d], k [nkv, N, d], v [nkv, N, d]."""
    n, d = x.shape[0], cfg.head_dim
    q = F.linear(x, lw.q_proj).view(n, cfg.num_attention_heads, d).transpose(0, 1)  # [nh, N, d]
    k = F.linear(x, lw.k_proj).view(n, cfg.num_key_value_heads, d).transpose(0, 1)  # [nkv, N, d]
    v = F.linear(x, lw.v_proj).view(n, cfg.num_key_value_heads, d).transpose(0, 1)  # [nkv, N, d]
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def attention(
    cfg: FrontierConfig,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: Optional[torch.Tensor],
) -> torch.Tensor:
    """Masked attention. q [nh, N, d]; keys/values [nkv, P+N, d]; mask [N, P+N] fp32 additive.

    Returns [N, nh*d].
    """
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    keys = keys.repeat_interleave(groups, dim=0)  # [nh, P+N, d]  (kv head = head // groups)
    values = values.repeat_interleave(groups, dim=0)  # [nh, P+N, d]
    scores = torch.matmul(q, keys.transpose(1, 2)) / math.sqrt(cfg.head_dim)  # [nh, N, P+N]
    if mask is not None:
        scores = scores + mask  # [nh, N, P+N] promoted to fp32
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # [nh, N, P+N]
    out = torch.matmul(probs, values)  # [nh, N, d]
    return out.transpose(0, 1).reshape(q.shape[1], -1)  # [N, nh*d]


def mlp(lw: LayerWeights, x: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))``: [N, H] -> [N, H]."""
    return F.linear(F.silu(F.linear(x, lw.gate_proj)) * F.linear(x, lw.up_proj), lw.down_proj)


def causal_mask(n: int, past: int, device: torch.device) -> torch.Tensor:
    """[n, past+n] additive mask: all past rows visible, causal among the n new rows."""
    mask = torch.zeros(n, past + n, dtype=torch.float32, device=device)  # [n, past+n]
    future = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)  # [n, n]
    mask[:, past:].masked_fill_(future, MASKED)
    return mask


def tree_attention_mask(ancestors: torch.Tensor, context) -> torch.Tensor:
    """[K, P + K*(i+1)] additive mask of depth i's rows.

    ancestors: [K, K*(i+1)] bool, row r's visible tree rows (its ancestors and itself) among the
    tree rows of depths 0..i. context: the P context rows, all visible (an int), or a bool [P]
    of which are (the static drafter's fixed-size cache, rows past each length hidden).
    """
    k = ancestors.shape[0]
    if isinstance(context, torch.Tensor):
        visible = torch.cat((context[None, :].expand(k, -1), ancestors), dim=1)  # [K, P + K*(i+1)]
        return torch.zeros(visible.shape, dtype=torch.float32, device=ancestors.device).masked_fill_(~visible, MASKED)
    mask = torch.zeros(k, context + ancestors.shape[1], dtype=torch.float32, device=ancestors.device)
    mask[:, context:].masked_fill_(~ancestors, MASKED)
    return mask


class LayerOutput:
    """Output rows of the draft layer(s) plus the K/V each layer produced for those rows."""

    def __init__(self, hidden: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]):
        self.hidden = hidden  # [N, H] pre-norm output (h2)
        self.keys = keys  # per layer [nkv, N, d] (after rotary)
        self.values = values  # per layer [nkv, N, d]


def draft_forward(
    cfg: FrontierConfig,
    w: DraftWeights,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    past_keys: list[torch.Tensor],
    past_values: list[torch.Tensor],
    mask: Optional[torch.Tensor],
) -> LayerOutput:
    """Run the draft head on N rows.

    tokens [N] target ids; hidden [N, F] features (fc applied when F-wide) or [N, H] layer
    outputs; positions [N]; past_keys/values per layer [nkv, P, d]; mask [N, P+N] or None.
    """
    emb = w.embed_tokens[tokens].to(hidden.dtype)  # [N, H]  e = embed_tokens[t]
    cos, sin = rope_cos_sin(cfg, positions, hidden.dtype)  # [N, d]
    if cfg.architecture == "eagle3":
        return _eagle3_forward(cfg, w, emb, hidden, cos, sin, past_keys, past_values, mask)
    return _eagle2_forward(cfg, w, emb, hidden, cos, sin, past_keys, past_values, mask)


def _eagle3_forward(cfg, w, emb, hidden, cos, sin, past_keys, past_values, mask) -> LayerOutput:
    if hidden.shape[-1] != cfg.hidden_size:
        hidden = F.linear(hidden, w.fc_weight)  # [N, H]  h = fc(features)
    lw = w.layers[0]
    residual = hidden  # [N, H]
    x = torch.cat(
        (rms_norm(emb, lw.input_layernorm, cfg.rms_norm_eps), rms_norm(hidden, w.hidden_norm, cfg.rms_norm_eps)),
        dim=-1,
    )  # [N, 2H]
    q, k, v = qkv_rope(cfg, lw, x, cos, sin)
    keys = torch.cat((past_keys[0], k), dim=1)  # [nkv, P+N, d]
    values = torch.cat((past_values[0], v), dim=1)  # [nkv, P+N, d]
    a = F.linear(attention(cfg, q, keys, values, mask), lw.o_proj)  # [N, H]
    h1 = residual + a  # [N, H]
    h2 = h1 + mlp(lw, rms_norm(h1, lw.post_attention_layernorm, cfg.rms_norm_eps))  # [N, H]
    return LayerOutput(h2, [k], [v])


def _eagle2_forward(cfg, w, emb, hidden, cos, sin, past_keys, past_values, mask) -> LayerOutput:
    h = F.linear(torch.cat((emb, hidden), dim=-1), w.fc_weight, w.fc_bias)  # [N, H]  fc(cat(e, h))
    new_keys, new_values = [], []
    for idx, lw in enumerate(w.layers):
        residual = h  # [N, H]
        x = h if idx == 0 else rms_norm(h, lw.input_layernorm, cfg.rms_norm_eps)  # [N, H]
        q, k, v = qkv_rope(cfg, lw, x, cos, sin)
        keys = torch.cat((past_keys[idx], k), dim=1)  # [nkv, P+N, d]
        values = torch.cat((past_values[idx], v), dim=1)  # [nkv, P+N, d]
        h = residual + F.linear(attention(cfg, q, keys, values, mask), lw.o_proj)  # [N, H]
        h = h + mlp(lw, rms_norm(h, lw.post_attention_layernorm, cfg.rms_norm_eps))  # [N, H]
        new_keys.append(k)
        new_values.append(v)
    return LayerOutput(h, new_keys, new_values)


def log_probs(cfg: FrontierConfig, w: DraftWeights, h: torch.Tensor) -> torch.Tensor:
    """Draft log-probabilities [N, V] of layer outputs h [N, H], in the compute dtype.

    eagle3: ``log_softmax(lm_head(norm(h)))``; eagle2: ``log_softmax(target_lm_head(h))``.
    """
    if cfg.architecture == "eagle3":
        h = rms_norm(h, w.norm, cfg.rms_norm_eps)  # [N, H]
    return torch.log_softmax(F.linear(h, w.lm_head), dim=-1)  # [N, V]


def to_target_ids(cfg: FrontierConfig, w: DraftWeights, draft_ids: torch.Tensor) -> torch.Tensor:
    """Map draft-vocabulary indices to target token ids: ``j + d2t[j]`` when V < V_t."""
    if cfg.vocab_size == cfg.target_vocab_size or w.d2t is None:
        return draft_ids
    return draft_ids + w.d2t[draft_ids]
