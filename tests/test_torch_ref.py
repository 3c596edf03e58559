"""torch_ref exactness: against a naive independent EAGLE draft head, hand-checked cases,
cache semantics and errors."""

from __future__ import annotations

import pytest
import torch

import frontier
from frontier import CacheError, DraftCache, FrontierConfig, InputError, WeightsError, frontier_generate
from frontier.random_head import random_config, random_inputs, random_weights
from eagle_module import eagle_style_module
from naive_eagle import NaiveEagle

# (architecture, T, D, K, V, V_t, H, heads, kv heads, I, lm_head scale, eagle2 layers)
SHAPES = [
    ("eagle3", 60, 5, 10, 96, 300, 64, 4, 2, 96, 8.0, 1),  # the real tree shape, d2t, GQA
    ("eagle3", 25, 6, 4, 50, 50, 48, 6, 3, 80, 12.0, 1),  # V == V_t (no d2t), very peaked
    ("eagle3", 2, 1, 1, 40, 70, 32, 4, 4, 40, 3.0, 1),  # the smallest tree
    ("eagle3", 31, 3, 3, 33, 90, 40, 2, 1, 56, 6.0, 1),  # total_token at its maximum, MQA
    ("eagle3", 9, 7, 1, 17, 23, 24, 3, 1, 20, 5.0, 1),  # top_k=1 chain, odd sizes
    ("eagle2", 30, 5, 5, 80, 80, 64, 4, 2, 96, 8.0, 1),
    ("eagle2", 17, 4, 3, 45, 45, 40, 5, 5, 72, 6.0, 2),  # two layers, odd sizes
]


def _cfg(arch, t, d, k, v, vt, h, nh, nkv, inter, layers, **extra):
    return random_config(
        total_token=t,
        depth=d,
        top_k=k,
        vocab_size=v,
        target_vocab_size=vt,
        hidden_size=h,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        intermediate_size=inter,
        architecture=arch,
        rms_norm_eps=1e-5,
        **({"num_layers": layers} if arch == "eagle2" else {}),
        **extra,
    )


def _call_sequence(cfg, seed, n_calls=5, first=29):
    """(input_ids, features) of a long first context then calls with 1..6 new rows."""
    g = torch.Generator().manual_seed(10_000 + seed)
    ids = torch.randint(0, cfg.target_vocab_size, (1, first + 1), generator=g)
    out = [(ids, torch.randn(1, first, cfg.feature_size, generator=g))]
    for call in range(1, n_calls):
        n = 1 + (call * 5 + seed) % 6
        ids = torch.cat([ids, torch.randint(0, cfg.target_vocab_size, (1, n), generator=g)], dim=1)
        out.append((ids, torch.randn(1, n, cfg.feature_size, generator=g)))
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-T{s[1]}-D{s[2]}-K{s[3]}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_head_over_call_sequence(shape, seed):
    arch, t, d, k, v, vt, h, nh, nkv, inter, scale, layers = shape
    theta = 500000.0 if seed % 2 else 10000.0
    cfg = _cfg(arch, t, d, k, v, vt, h, nh, nkv, inter, layers, rope_theta=theta)
    w = random_weights(cfg, seed=100 + seed, lm_head_scale=scale)
    naive = NaiveEagle(cfg, w)
    sampling = seed == 1
    cache = None
    for ids, feats in _call_sequence(cfg, seed):
        want = naive.draft(feats, ids, sampling=sampling)
        fr = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, cache=cache, sampling=sampling)
        fr.check_invariants(total_token=t, depth=d, top_k=k, sampling=sampling)
        for name, a, b in zip(("draft_tokens", "retrieve_indices", "tree_mask", "tree_position_ids"), want, fr.integer_outputs()):
            assert a.shape == b.shape and torch.equal(a, b), f"{name} differs from the naive head"
        assert fr.cache.length == ids.shape[1] - 1
        cache = fr.cache


def test_peaked_heads_give_deep_trees():
    """The exactness matrix is only meaningful if trees are deep and varied, not shallow stars."""
    cfg = _cfg("eagle3", 60, 5, 10, 96, 300, 64, 4, 2, 96, 1)
    depths = set()
    for seed in range(4):
        w = random_weights(cfg, seed=seed, lm_head_scale=8.0)
        ids, feats = random_inputs(cfg, context=20, seed=seed)
        fr = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
        depths.add(int(fr.tree_position_ids.max()))
    assert max(depths) >= 4, depths


def _zeroed_head(total_token):
    """A head whose layer adds nothing (o_proj = down_proj = 0): every row's output equals its
    hidden input, so every row has the same, hand-chosen, next-token distribution."""
    cfg = FrontierConfig(
        total_token=total_token,
        depth=1,
        top_k=2,
        vocab_size=4,
        target_vocab_size=50,
        hidden_size=4,
        num_attention_heads=2,
        intermediate_size=8,
    )
    w = random_weights(cfg, seed=0)
    for lw in w.layers:
        lw.o_proj.zero_()
        lw.down_proj.zero_()
    w.fc_weight.zero_()
    w.fc_weight[:, :4] = torch.eye(4)  # h = first 4 features
    w.norm.fill_(1.0)
    w.lm_head.zero_()
    w.lm_head[:, 0] = torch.tensor([4.0, 0.5, 0.0, -1.0])  # logits = lm_head[:, 0] * norm(h)[0]
    w.d2t = torch.tensor([10, 20, 30, 40])  # draft j -> target j + d2t[j]
    return cfg, w


def test_hand_checked_small_tree():
    # h = (2, 0, 0, 0) -> norm(h) ~ (2, 0, 0, 0) -> logits ~ (8, 1, 0, -2): l0 ~ -0.001, l1 ~ -7.0.
    # Candidates: [l0, l1 | 2*l0, l0+l1, l1+l0, 2*l1]; the best 3 are indices 0, 2 and 1.
    cfg, w = _zeroed_head(4)
    feats = torch.zeros(1, 3, cfg.feature_size)
    feats[0, -1, 0] = 2.0
    ids = torch.tensor([[1, 2, 3, 7]])  # root token 7
    fr = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    assert fr.draft_tokens.tolist() == [[7, 10, 21, 10]]  # root, tok0, tok1, tok0 (child of node 1)
    assert fr.tree_mask[0, 0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert fr.tree_position_ids.tolist() == [0, 1, 1, 2]
    assert fr.retrieve_indices.tolist() == [[0, 2, -1], [0, 1, 3]]  # leaves 2 and 3, in node order

    fr_s = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, sampling=True)
    assert fr_s.retrieve_indices.tolist() == [[0, 1, 3], [0, 2, -1]]  # lexicographic, -1 last

    cfg3, w3 = _zeroed_head(3)  # T=3 keeps indices 0 and 2: a chain root -> 1 -> 2
    fr3 = frontier_generate(cfg3, feats, backend="torch_ref", input_ids=ids, weights=w3)
    assert fr3.draft_tokens.tolist() == [[7, 10, 10]]
    assert fr3.retrieve_indices.tolist() == [[0, 1, 2]]


def test_cache_appends_context_rows_only_and_matches_fresh_run():
    cfg = _cfg("eagle3", 20, 4, 4, 64, 200, 32, 4, 2, 48, 1)
    w = random_weights(cfg, seed=3, lm_head_scale=6.0)
    calls = _call_sequence(cfg, seed=3, n_calls=3, first=12)
    cache = None
    for ids, feats in calls:
        fr = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, cache=cache, cache_max_length=64)
        cache = fr.cache
    assert cache.length == calls[-1][0].shape[1] - 1
    assert cache.max_length == 64
    # Drafting everything at once from a fresh cache with the same features gives the same tree.
    all_feats = torch.cat([f for _, f in calls], dim=1)
    fresh = frontier_generate(cfg, all_feats, backend="torch_ref", input_ids=calls[-1][0], weights=w)
    assert fresh.same_tree(fr)
    assert torch.allclose(fresh.cache.k[:, :, : cache.length], cache.k[:, :, : cache.length], atol=1e-5)


def test_failed_call_leaves_cache_unchanged():
    cfg = _cfg("eagle3", 12, 3, 3, 64, 64, 32, 4, 2, 48, 1)
    w = random_weights(cfg, seed=5)
    ids, feats = random_inputs(cfg, context=10, seed=5)
    fr = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, cache_max_length=14)
    cache = fr.cache
    k_before, v_before, len_before = cache.k.clone(), cache.v.clone(), cache.length
    more = torch.cat([ids, torch.randint(0, 64, (1, 6))], dim=1)
    with pytest.raises(CacheError, match="overflow"):
        frontier_generate(cfg, torch.randn(1, 6, cfg.feature_size), backend="torch_ref", input_ids=more, weights=w, cache=cache)
    with pytest.raises(CacheError, match="c \\+ n == L"):
        frontier_generate(cfg, torch.randn(1, 2, cfg.feature_size), backend="torch_ref", input_ids=more, weights=w, cache=cache)
    bad_ids = more[:, :13].clone()
    bad_ids[0, 11] = 10_000  # outside the target vocabulary
    with pytest.raises(InputError, match="target_vocab_size"):
        frontier_generate(cfg, torch.randn(1, 2, cfg.feature_size), backend="torch_ref", input_ids=bad_ids, weights=w, cache=cache)
    # A failure inside the backend (after validation) must not touch the cache either.
    broken = random_weights(cfg, seed=5)
    broken.embed_tokens = broken.embed_tokens[:, :-1]  # mis-shaped after construction
    with pytest.raises(WeightsError, match="embed_tokens"):
        frontier_generate(cfg, torch.randn(1, 3, cfg.feature_size), backend="torch_ref", input_ids=more[:, :14], weights=broken, cache=cache)
    assert cache.length == len_before
    assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before)
    # and the cache still works afterwards
    ok = frontier_generate(cfg, torch.randn(1, 3, cfg.feature_size), backend="torch_ref", input_ids=more[:, :14], weights=w, cache=cache)
    assert ok.cache.length == 13


def test_weights_and_input_errors_name_the_problem():
    cfg = _cfg("eagle3", 12, 3, 3, 64, 128, 32, 4, 2, 48, 1)
    w = random_weights(cfg, seed=1)
    ids, feats = random_inputs(cfg, context=8, seed=1)
    with pytest.raises(InputError, match="needs the draft head"):
        frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids)
    with pytest.raises(InputError, match="needs input_ids"):
        frontier_generate(cfg, feats, backend="torch_ref", weights=w)
    with pytest.raises(InputError, match="dtype"):
        frontier_generate(cfg, feats.half(), backend="torch_ref", input_ids=ids, weights=w)
    w_bad = random_weights(cfg, seed=1)
    w_bad.layers[0].q_proj = w_bad.layers[0].q_proj[:-1]
    with pytest.raises(WeightsError, match=r"midlayer.self_attn.q_proj.weight.*expected \[32, 64\]"):
        frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w_bad)
    w_nod2t = random_weights(cfg, seed=1)
    w_nod2t.d2t = None
    with pytest.raises(WeightsError, match="d2t"):
        frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w_nod2t)
    stub_cfg = FrontierConfig(total_token=12, depth=3, top_k=3, vocab_size=64, hidden_size=32)
    with pytest.raises(frontier.ConfigError, match="num_attention_heads"):
        frontier_generate(stub_cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    other = DraftCache.for_config(_cfg("eagle3", 12, 3, 3, 64, 128, 32, 2, 2, 48, 1), dtype=torch.float32, device="cpu")
    with pytest.raises(CacheError, match="kv heads"):
        frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, cache=other)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_runs_and_is_valid(dtype):
    cfg = _cfg("eagle3", 30, 5, 5, 80, 200, 64, 4, 2, 96, 1)
    w = random_weights(cfg, seed=2, dtype=dtype, lm_head_scale=6.0)
    cache = None
    for ids, feats in _call_sequence(cfg, seed=2, n_calls=3, first=16):
        fr = frontier_generate(cfg, feats.to(dtype), backend="torch_ref", input_ids=ids, weights=w, cache=cache)
        fr.check_invariants(total_token=30, depth=5, top_k=5)
        cache = fr.cache
    assert cache.dtype == dtype


def test_padded_mode_equals_unpadded():
    cfg = _cfg("eagle3", 40, 5, 6, 80, 200, 48, 4, 2, 64, 1)
    w = random_weights(cfg, seed=7, lm_head_scale=8.0)
    ids, feats = random_inputs(cfg, context=15, seed=7)
    a = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    b = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, padded=True)
    assert b.retrieve_indices.shape == (40, cfg.depth + 2)
    assert a.same_tree(b)
    b.check_invariants(total_token=40, depth=5, top_k=6)


def test_ea_layer_adapter_and_config_derivation():
    """An EAGLE-style module with the public attribute names drafts like its weights."""
    cfg = _cfg("eagle3", 20, 4, 4, 64, 150, 32, 4, 2, 48, 1)
    w = random_weights(cfg, seed=11, lm_head_scale=6.0)

    class Cfg:
        num_attention_heads, num_key_value_heads = 4, 2
        rope_theta, rms_norm_eps, rope_scaling = cfg.rope_theta, cfg.rms_norm_eps, None
        vocab_size, draft_vocab_size = 150, 64

    layer = eagle_style_module(w.state_dict(), Cfg())
    layer.register_buffer("t2d", torch.zeros(150, dtype=torch.bool))

    derived = FrontierConfig.from_ea_layer(layer, total_token=20, depth=4, top_k=4)
    assert derived.hidden_size == 32 and derived.num_key_value_heads == 2 and derived.target_vocab_size == 150
    del Cfg.num_key_value_heads  # a config without it: GQA is read off k_proj's shape
    assert FrontierConfig.from_ea_layer(layer, total_token=20, depth=4, top_k=4) == derived
    ids, feats = random_inputs(cfg, context=9, seed=11)
    a = frontier_generate(derived, feats, backend="torch_ref", input_ids=ids, ea_layer=layer)
    b = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    assert a.same_tree(b)
