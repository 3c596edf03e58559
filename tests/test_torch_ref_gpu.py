"""torch_ref on CUDA: no host synchronisation inside the draft call, same trees as on CPU."""

from __future__ import annotations

import pytest
import torch

from frontier import frontier_generate
from frontier.random_head import random_config, random_inputs, random_weights

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_padded_draft_call_never_syncs(arch):
    cfg = random_config(total_token=60, depth=5, top_k=10, vocab_size=500, target_vocab_size=500 if arch == "eagle2" else 2000,
                        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256, architecture=arch)
    w = random_weights(cfg, seed=0, device="cuda", lm_head_scale=6.0)
    ids, feats = random_inputs(cfg, context=40, seed=0, device="cuda")
    warm = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, padded=True)
    more = torch.cat([ids, torch.randint(0, cfg.target_vocab_size, (1, 3), device="cuda")], dim=1)
    feats2 = torch.randn(1, 3, cfg.feature_size, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fr = frontier_generate(cfg, feats2, backend="torch_ref", input_ids=more, weights=w, cache=warm.cache,
                               padded=True, check_token_range=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert fr.cache.length == 43  # 40 context rows, then 3 new ones
    fr.check_invariants(total_token=60, depth=5, top_k=10)


def test_cuda_matches_cpu_in_float64():
    """float64 removes rounding near-ties, so CPU and CUDA must give the same tree."""
    cfg = random_config(total_token=40, depth=5, top_k=6, vocab_size=300, target_vocab_size=900, hidden_size=64,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    for seed in range(3):
        w = random_weights(cfg, seed=seed, dtype=torch.float64, lm_head_scale=6.0)
        ids, feats = random_inputs(cfg, context=30, seed=seed, dtype=torch.float64)
        cpu = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
        gpu = frontier_generate(cfg, feats.cuda(), backend="torch_ref", input_ids=ids.cuda(), weights=w.to("cuda"))
        assert gpu.draft_tokens.device.type == "cuda"
        assert cpu.same_tree(gpu)
