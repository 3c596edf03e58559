"""Random target + draft head pairs for tests, examples and timings (no downloads).

:func:`random_pair` builds a randomly initialised Llama target (``transformers``) and a matching
EAGLE-3 head from one of the :data:`RANDOM_PRESETS` sizes.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..config import FrontierConfig
from ..errors import InputError
from ..weights import DraftWeights
from .target import eagle3_tap_layers

__all__ = ["RANDOM_PRESETS", "random_pair"]

RANDOM_PRESETS: dict[str, dict[str, int]] = {
    # hidden, layers, heads, kv heads, intermediate, vocab; the head shares hidden and vocab.
    "tiny": dict(hidden=64, layers=8, heads=4, kv_heads=2, intermediate=128, vocab=256),
    "small": dict(hidden=512, layers=12, heads=8, kv_heads=4, intermediate=1408, vocab=8192),
    "large": dict(hidden=2048, layers=16, heads=16, kv_heads=8, intermediate=5632, vocab=32000),
}


def random_pair(
    preset: str = "tiny",
    *,
    total_token: int = 16,
    depth: int = 4,
    top_k: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    draft_vocab_size: Optional[int] = None,
    attn_implementation: str = "sdpa",
) -> tuple[Any, FrontierConfig, DraftWeights]:
    """(target LlamaForCausalLM, cfg, EAGLE-3 weights), randomly initialised from ``seed``.

    The head embeds with the target's own embedding table (as EAGLE-3 heads do).
    """
    if preset not in RANDOM_PRESETS:
        raise InputError(f"unknown random preset {preset!r}; choose one of {sorted(RANDOM_PRESETS)}")
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..random_head import random_config, random_weights

    p = RANDOM_PRESETS[preset]
    torch.manual_seed(seed)
    tcfg = LlamaConfig(
        hidden_size=p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        intermediate_size=p["intermediate"],
        vocab_size=p["vocab"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation=attn_implementation,
    )
    with torch.device(device):  # initialise where it will run (large presets)
        target = LlamaForCausalLM(tcfg)
    target = target.to(dtype=dtype).eval()
    n_taps = len(eagle3_tap_layers(p["layers"]))
    cfg = random_config(
        total_token=total_token,
        depth=depth,
        top_k=top_k,
        vocab_size=draft_vocab_size or p["vocab"],
        target_vocab_size=p["vocab"],
        hidden_size=p["hidden"],
        feature_size=n_taps * p["hidden"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        intermediate_size=p["intermediate"],
    )
    w = random_weights(cfg, seed=seed + 1, dtype=dtype, device=device)
    w.embed_tokens = target.get_input_embeddings().weight.detach()
    return target, cfg, w.validate(cfg)
