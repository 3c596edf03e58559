"""Random draft heads for demos, tests and benchmarks (no downloads).

``lm_head_scale`` sharpens the draft distribution: near-uniform logits give shallow, bushy
trees; a scaled lm_head gives peaked log-probs and deep, varied trees like a trained head's.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .config import FrontierConfig
from .weights import DraftWeights, LayerWeights


def random_config(
    *,
    total_token: int = 12,
    depth: int = 3,
    top_k: int = 3,
    vocab_size: int = 64,
    target_vocab_size: Optional[int] = None,
    hidden_size: int = 32,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 48,
    architecture: str = "eagle3",
    **extra: Any,
) -> FrontierConfig:
    """A small config with every layer dimension set (defaults fit CPU tests)."""
    return FrontierConfig(
        total_token=total_token,
        depth=depth,
        top_k=top_k,
        vocab_size=vocab_size,
        target_vocab_size=target_vocab_size,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        architecture=architecture,
        **extra,
    )


def random_weights(
    cfg: FrontierConfig,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    lm_head_scale: float = 4.0,
    with_d2t: Optional[bool] = None,
) -> DraftWeights:
    """Random weights shaped for ``cfg``, drawn on the CPU from ``seed`` then moved/cast.

    Linear layers use N(0, 1/fan_in); norms are 1 + small noise; the lm_head is scaled by
    ``lm_head_scale``. When ``vocab_size < target_vocab_size`` (or ``with_d2t``), d2t holds
    random increasing offsets mapping the draft vocabulary into the target vocabulary.
    """
    cfg.require_layer_dims("random_weights")
    g = torch.Generator().manual_seed(seed)
    h, f, inter = cfg.hidden_size, cfg.feature_size, cfg.intermediate_size
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def lin(out: int, inp: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(out, inp, generator=g) * (scale / inp**0.5)

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(h, generator=g)

    attn_in = 2 * h if cfg.architecture == "eagle3" else h
    layers = []
    for i in range(cfg.num_layers):
        layers.append(
            LayerWeights(
                q_proj=lin(qd, attn_in),
                k_proj=lin(kvd, attn_in),
                v_proj=lin(kvd, attn_in),
                o_proj=lin(h, qd),
                gate_proj=lin(inter, h),
                up_proj=lin(inter, h),
                down_proj=lin(h, inter),
                post_attention_layernorm=norm(),
                input_layernorm=norm() if (cfg.architecture == "eagle3" or i > 0) else None,
            )
        )
    d2t = None
    need_d2t = cfg.vocab_size < cfg.target_vocab_size if with_d2t is None else with_d2t
    if need_d2t and cfg.architecture == "eagle3":
        targets = torch.sort(torch.randperm(cfg.target_vocab_size, generator=g)[: cfg.vocab_size]).values
        d2t = targets - torch.arange(cfg.vocab_size)  # offsets: target = draft + d2t[draft]
    w = DraftWeights(
        architecture=cfg.architecture,
        embed_tokens=torch.randn(cfg.target_vocab_size, h, generator=g),
        fc_weight=lin(h, f if cfg.architecture == "eagle3" else 2 * h),
        fc_bias=(0.02 * torch.randn(h, generator=g)) if cfg.fc_bias else None,
        layers=layers,
        lm_head=lin(cfg.vocab_size, h, lm_head_scale),
        hidden_norm=norm() if cfg.architecture == "eagle3" else None,
        norm=norm() if cfg.architecture == "eagle3" else None,
        d2t=d2t,
    )
    return w.to(device=device, dtype=dtype).validate(cfg)


def random_inputs(
    cfg: FrontierConfig,
    *,
    context: int,
    new_rows: Optional[int] = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [1, context+1], features [1, new_rows, F]) for a fresh cache (new_rows=context)."""
    g = torch.Generator().manual_seed(seed)
    n = context if new_rows is None else new_rows
    ids = torch.randint(0, cfg.target_vocab_size, (1, context + 1), generator=g)
    feats = torch.randn(1, n, cfg.feature_size, generator=g)
    return ids.to(device), feats.to(device=device, dtype=dtype)


__all__ = ["random_config", "random_weights", "random_inputs"]
