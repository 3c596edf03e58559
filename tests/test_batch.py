"""Batched (ragged) drafting: every sequence's tree equals drafting it alone."""

from __future__ import annotations

import pytest
import torch

import frontier
from frontier import BatchDraftCache, CacheError, InputError, frontier_generate, frontier_generate_batch
from frontier.random_head import random_config, random_weights

from conftest import backend_device

BATCH_CFGS = [
    dict(total_token=20, depth=4, top_k=4, vocab_size=64, target_vocab_size=200, architecture="eagle3"),
    dict(total_token=13, depth=3, top_k=3, vocab_size=45, target_vocab_size=45, architecture="eagle2", hidden_size=40,
         num_attention_heads=5, num_key_value_heads=5),
]


def _ragged_batch(cfg, seed, batch):
    """Per-sequence (ids, feats) for a first call with different context lengths."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(batch):
        big_l = int(torch.randint(1, 24, (1,), generator=g))
        ids = torch.randint(0, cfg.target_vocab_size, (1, big_l + 1), generator=g)
        seqs.append((ids, torch.randn(1, big_l, cfg.feature_size, generator=g)))
    return seqs, g


def _kwargs(backend, cfg, seed, dtype=torch.float32, device="cpu"):
    if frontier.get_backend(backend).requires_weights:
        return {"weights": random_weights(cfg, seed=seed, lm_head_scale=6.0, dtype=dtype, device=device)}
    return {}


@pytest.mark.slow_case(backend_name="triton")  # (the default run drafts interpreted batches in test_triton.py)
@pytest.mark.parametrize("cfg_kw", BATCH_CFGS, ids=["eagle3", "eagle2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_batch_equals_single_sequence_drafting(backend_name, cfg_kw, seed):
    cfg = random_config(**cfg_kw)
    dev = backend_device(backend_name)
    kw = _kwargs(backend_name, cfg, seed, device=dev)
    seqs, g = _ragged_batch(cfg, seed, batch=3 + seed)
    ids = [s[0].to(dev) for s in seqs]
    feats = [s[1].to(dev) for s in seqs]
    singles = [None] * len(seqs)
    caches = None
    sampling = bool(seed)
    for call in range(3):
        frs = frontier_generate(cfg, feats, backend_name, input_ids=ids, cache=caches, sampling=sampling, **kw)
        assert isinstance(frs, list) and len(frs) == len(seqs)
        new_single = []
        for b, fr in enumerate(frs):
            alone = frontier_generate(cfg, feats[b], backend_name, input_ids=ids[b], cache=singles[b], sampling=sampling, **kw)
            fr.check_invariants(total_token=cfg.total_token, depth=cfg.depth, top_k=cfg.top_k, sampling=sampling)
            assert fr.same_tree(alone), f"sequence {b} differs from drafting it alone (call {call})"
            new_single.append(alone.cache)
        singles = new_single
        caches = [fr.cache for fr in frs] if frs[0].cache is not None else None
        # next call: each sequence accepts a different number of tokens (ragged n_b)
        nxt_ids, nxt_feats = [], []
        for b in range(len(seqs)):
            n = int(torch.randint(1, 7, (1,), generator=g))
            nxt_ids.append(torch.cat([ids[b], torch.randint(0, cfg.target_vocab_size, (1, n), generator=g).to(dev)], dim=1))
            nxt_feats.append(torch.randn(1, n, cfg.feature_size, generator=g).to(dev))
        ids, feats = nxt_ids, nxt_feats


def test_batch_cache_is_one_allocation_and_rolls_back_on_failure():
    cfg = random_config(**BATCH_CFGS[0])
    w = random_weights(cfg, seed=3)
    seqs, g = _ragged_batch(cfg, 3, batch=3)
    bc = BatchDraftCache(cfg, 3, max_length=40, dtype=torch.float32, device="cpu")
    frs = frontier_generate_batch(cfg, [s[1] for s in seqs], "torch_ref", input_ids=[s[0] for s in seqs], weights=w, caches=bc)
    assert bc.lengths == [s[0].shape[1] - 1 for s in seqs]
    assert all(fr.cache is bc[b] for b, fr in enumerate(frs))
    assert all(fr.cache.k.data_ptr() == bc.k[b].data_ptr() for b, fr in enumerate(frs))
    k_before, lengths = bc.k.clone(), bc.lengths
    # Sequence 2 overflows its slot: nothing may change for any sequence.
    ids = [torch.cat([s[0], torch.randint(0, 200, (1, n))], dim=1) for s, n in zip(seqs, (2, 3, 40))]
    feats = [torch.randn(1, n, cfg.feature_size) for n in (2, 3, 40)]
    with pytest.raises(CacheError, match="sequence 2: draft cache overflow"):
        frontier_generate_batch(cfg, feats, "torch_ref", input_ids=ids, weights=w, caches=bc)
    assert bc.lengths == lengths and torch.equal(bc.k, k_before)


def test_batch_rolls_back_when_the_backend_fails_midway():
    cfg = random_config(**BATCH_CFGS[0])
    w = random_weights(cfg, seed=4)
    seqs, _ = _ragged_batch(cfg, 4, batch=3)
    bc = BatchDraftCache(cfg, 3, max_length=64, dtype=torch.float32, device="cpu")

    class FailsOnThird(frontier.get_backend("torch_ref").__class__):
        calls = 0

        def generate(self, request):
            type(self).calls += 1
            if type(self).calls == 3:
                raise RuntimeError("boom")
            return super().generate(request)

    frontier.register_backend("fails_on_third", FailsOnThird())
    try:
        with pytest.raises(RuntimeError, match="boom"):
            frontier_generate_batch(cfg, [s[1] for s in seqs], "fails_on_third", input_ids=[s[0] for s in seqs], weights=w, caches=bc)
    finally:
        frontier.unregister_backend("fails_on_third")
    assert bc.lengths == [0, 0, 0]


def test_batch_input_errors():
    cfg = random_config(**BATCH_CFGS[0])
    w = random_weights(cfg, seed=5)
    seqs, _ = _ragged_batch(cfg, 5, batch=2)
    feats, ids = [s[1] for s in seqs], [s[0] for s in seqs]
    with pytest.raises(InputError, match="list of 2 tensors"):
        frontier_generate(cfg, feats, "torch_ref", input_ids=ids[:1], weights=w)
    with pytest.raises(InputError, match="non-empty list"):
        frontier_generate_batch(cfg, [], "torch_ref", input_ids=[], weights=w)
    with pytest.raises(InputError, match="sequence 1: features_concat last dimension"):
        frontier_generate(cfg, [feats[0], feats[1][..., :-1]], "torch_ref", input_ids=ids, weights=w)
    with pytest.raises(InputError, match="one dtype"):
        frontier_generate(cfg, [feats[0], feats[1].double()], "torch_ref", input_ids=ids, weights=w)
    shared = frontier.DraftCache.for_config(cfg, dtype=torch.float32, device="cpu")
    with pytest.raises(InputError, match="distinct"):
        frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w, cache=[shared, shared])
    with pytest.raises(InputError, match="one entry per sequence"):
        frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w, cache=[None])


def test_batch_rejects_bad_arguments_before_allocating():
    cfg = random_config(**BATCH_CFGS[0])
    w = random_weights(cfg, seed=6)
    seqs, _ = _ragged_batch(cfg, 6, batch=2)
    feats, ids = [s[1] for s in seqs], [s[0] for s in seqs]
    with pytest.raises(InputError, match="weights must be a frontier.DraftWeights"):
        frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights="x")
    with pytest.raises(InputError, match="cache_max_length must be a positive int"):
        frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w, cache_max_length=-3)
    with pytest.raises(InputError, match="lm_head= goes with ea_layer="):
        frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w, lm_head=w.lm_head)
    with pytest.raises(CacheError, match="cannot hold the longest context"):
        frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w, cache_max_length=1)


# ----------------------------------------------------------------------------------------------
# BatchDraftCache and the batch call's own checks (stub or a tiny torch_ref head: fast)
# ----------------------------------------------------------------------------------------------
TINY = dict(total_token=5, depth=2, top_k=2, vocab_size=16, hidden_size=8, num_attention_heads=2,
            num_key_value_heads=1, intermediate_size=8)


def test_batch_draft_cache_slots_are_views_of_one_allocation():
    cfg = random_config(**TINY)  # 1 layer, 1 kv head, head_dim 4
    bc = BatchDraftCache(cfg, 3, max_length=6, dtype=torch.float16, device="cpu")
    assert bc.k.shape == (3, 1, 1, 6, 4) and bc.v.shape == (3, 1, 1, 6, 4) and bc.k.dtype == torch.float16
    assert not bc.k.any() and bc.k.data_ptr() != bc.v.data_ptr()
    assert len(bc) == 3 and list(bc) == [bc[0], bc[1], bc[2]]
    assert all(isinstance(c, frontier.DraftCache) for c in bc)
    assert bc[1].k.data_ptr() == bc.k[1].data_ptr() and bc[2].v.data_ptr() == bc.v[2].data_ptr()
    assert bc.max_length == 6 and bc.lengths == [0, 0, 0]
    bc[1].length = 4
    assert bc.lengths == [0, 4, 0]
    assert repr(bc) == "BatchDraftCache(batch=3, lengths=[0, 4, 0], max_length=6, dtype=torch.float16)"
    assert BatchDraftCache(cfg, 1, dtype=torch.float32, device="cpu").max_length == 4096


@pytest.mark.parametrize("batch", [0, -2])
def test_batch_draft_cache_needs_a_positive_batch_and_layer_dims(batch):
    with pytest.raises(InputError, match=rf"^batch must be positive, got batch={batch}$"):
        BatchDraftCache(random_config(**TINY), batch, dtype=torch.float32, device="cpu")
    tree_only = frontier.FrontierConfig(total_token=5, depth=2, top_k=2, vocab_size=16, hidden_size=8)
    with pytest.raises(frontier.ConfigError, match=r"^BatchDraftCache runs the draft layer and needs"):
        BatchDraftCache(tree_only, 2, dtype=torch.float32, device="cpu")


def test_stub_batch_equals_drafting_each_sequence_alone():
    cfg = frontier.FrontierConfig(total_token=9, depth=3, top_k=3, vocab_size=50, hidden_size=8)
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(1, n, cfg.feature_size, generator=g) for n in (2, 5, 1)]
    ids = [torch.randint(0, 50, (1, n + 1), generator=g) for n in (2, 5, 1)]
    for sampling, padded in ((False, False), (True, True)):
        frs = frontier_generate_batch(cfg, feats, "stub", input_ids=ids, seed=7, sampling=sampling, padded=padded)
        assert len(frs) == 3
        for b in range(3):
            alone = frontier_generate(cfg, feats[b], "stub", input_ids=ids[b], seed=7, sampling=sampling, padded=padded)
            assert frs[b].same_tree(alone) and frs[b].padded is padded and frs[b].cache is None
    # a tuple works like a list, and frontier_generate hands a list to the batch call
    assert len(frontier_generate_batch(cfg, tuple(feats), "stub", input_ids=tuple(ids))) == 3
    assert len(frontier_generate(cfg, feats, "stub", input_ids=ids, seed=7)) == 3


def test_batch_argument_messages():
    cfg = frontier.FrontierConfig(total_token=9, depth=3, top_k=3, vocab_size=50, hidden_size=8)
    f = torch.randn(1, 2, cfg.feature_size)
    ids = torch.randint(0, 50, (1, 3))
    with pytest.raises(InputError, match=r"^cfg must be a FrontierConfig, got dict$"):
        frontier_generate_batch({}, [f], "stub")
    with pytest.raises(InputError, match=r"^features must be a non-empty list of \[1, n_b, F\] tensors, one per sequence$"):
        frontier_generate_batch(cfg, f, "stub")
    with pytest.raises(InputError, match=r"^features must be a non-empty list"):
        frontier_generate_batch(cfg, (), "stub")
    with pytest.raises(InputError, match=r"^input_ids must be a list of 2 tensors \[1, L_b\+1\] \(one per sequence\)$"):
        frontier_generate_batch(cfg, [f, f], "stub", input_ids=[ids])
    with pytest.raises(InputError, match=r"^input_ids must be a list of 2 tensors"):
        frontier_generate_batch(cfg, [f, f], "stub", input_ids=ids)
    with pytest.raises(InputError, match=r"^all sequences' features must be on one device, got \['cpu', 'meta'\]$"):
        frontier_generate_batch(cfg, [f, f.to("meta")], "stub")
    with pytest.raises(InputError, match=r"^all sequences' features must share one dtype, got \['torch.float32', 'torch.float64'\]$"):
        frontier_generate_batch(cfg, [f, f.double()], "stub")
    with pytest.raises(InputError, match=r"^caches must hold one entry per sequence \(2\), got 3$"):
        frontier_generate_batch(cfg, [f, f], "stub", caches=[None, None, None])
    with pytest.raises(InputError, match=r"^sequence 1: "):
        frontier_generate_batch(cfg, [f, f[..., :-1]], "stub")
    with pytest.raises(InputError, match=(
        r"^with a batch of features, cache must be a BatchDraftCache or a list of DraftCache/None$"
    )):
        frontier_generate(cfg, [f, f], "stub", cache=3)
    with pytest.raises(InputError, match=r"^cfg must be a FrontierConfig, got NoneType$"):
        frontier_generate(None, f, "stub")


def test_fresh_batch_cache_for_a_weighted_backend():
    cfg = random_config(**TINY)
    w = random_weights(cfg, seed=1)
    g = torch.Generator().manual_seed(1)
    feats = [torch.randn(1, n, cfg.feature_size, generator=g) for n in (3, 5)]
    ids = [torch.randint(0, 16, (1, n + 1), generator=g) for n in (3, 5)]
    frs = frontier_generate_batch(cfg, feats, "torch_ref", input_ids=ids, weights=w)
    assert [fr.cache.length for fr in frs] == [3, 5] and frs[0].cache.max_length == 4096
    assert frs[1].cache.k.data_ptr() == frs[0].cache.k.data_ptr() + frs[0].cache.k.numel() * 4  # one allocation
    frs = frontier_generate_batch(cfg, feats, "torch_ref", input_ids=ids, weights=w, cache_max_length=5)
    assert frs[0].cache.max_length == 5 and frs[1].cache.length == 5  # the longest context fills it exactly
    with pytest.raises(CacheError, match=r"^cache_max_length=4 cannot hold the longest context \(5 rows\)$"):
        frontier_generate_batch(cfg, feats, "torch_ref", input_ids=ids, weights=w, cache_max_length=4)
    one = [frontier.DraftCache.for_config(cfg, max_length=8, dtype=torch.float32, device="cpu"), None]
    frs = frontier_generate_batch(cfg, feats, "torch_ref", input_ids=ids, weights=w, caches=one)
    assert frs[0].cache is one[0] and one[0].length == 3 and frs[1].cache.length == 5


def test_batch_defaults_match_frontier_generate():
    cfg = frontier.FrontierConfig(total_token=12, depth=3, top_k=3, vocab_size=50, hidden_size=8)
    g = torch.Generator().manual_seed(4)
    feats = [torch.randn(1, n, cfg.feature_size, generator=g) for n in (3, 2)]
    frs = frontier_generate_batch(cfg, feats)
    for b in range(2):
        alone = frontier_generate(cfg, feats[b])  # stub, seed 0, greedy order, unpadded
        assert frs[b].same_tree(alone) and frs[b].padded is False
        assert not frs[b].same_tree(frontier_generate(cfg, feats[b], seed=1))
        assert not frs[b].same_tree(frontier_generate(cfg, feats[b], sampling=True))


def test_batch_names_the_backend_and_the_sequence():
    cfg = frontier.FrontierConfig(total_token=9, depth=3, top_k=3, vocab_size=50, hidden_size=8)
    f = torch.randn(1, 2, cfg.feature_size)
    with pytest.raises(InputError, match=r"^sequence 0: backend 'stub' runs on cpu, cuda; features_concat is on meta$"):
        frontier_generate_batch(cfg, [f.to("meta"), f.to("meta")], "stub")
    with pytest.raises(InputError, match=r"^caches must be distinct objects: two sequences cannot share one draft cache$"):
        shared = frontier.DraftCache(1, 1, 2, 4, dtype=torch.float32, device="cpu")
        frontier_generate_batch(cfg, [f, f], "stub", caches=[shared, shared])
    with pytest.raises(InputError, match=r"^pass either weights= or ea_layer=, not both$"):
        frontier_generate_batch(cfg, [f, f], "stub", weights="w", ea_layer=object())

    class Unavailable(frontier.Backend):
        def availability(self):
            return False, "not today"

        def generate(self, request):  # pragma: no cover - never reached
            raise AssertionError

    class Liar(frontier.Backend):
        def generate(self, request):
            return "a tree"

    frontier.register_backend("unavailable_b", Unavailable())
    frontier.register_backend("liar_b", Liar())
    try:
        with pytest.raises(frontier.BackendUnavailableError, match=r"^backend 'unavailable_b' cannot run here: not today$"):
            frontier_generate_batch(cfg, [f, f], "unavailable_b")  # no fallback by default
        with pytest.raises(frontier.FrontierError, match=r"backend 'liar_b' returned str, expected a Frontier"):
            frontier_generate_batch(cfg, [f, f], "liar_b")
    finally:
        frontier.unregister_backend("unavailable_b")
        frontier.unregister_backend("liar_b")


def test_a_backend_without_declarations_gets_no_cache():
    class Plain:
        def availability(self):
            return True, ""

        def generate(self, request):
            from frontier.backends.stub import StubBackend

            return StubBackend().generate(request)

    cfg = frontier.FrontierConfig(total_token=9, depth=3, top_k=3, vocab_size=50, hidden_size=8)
    frontier.register_backend("plain_b", Plain())
    try:
        frs = frontier_generate_batch(cfg, [torch.randn(1, 2, 24), torch.randn(1, 3, 24)], "plain_b")
        assert [fr.cache for fr in frs] == [None, None]
    finally:
        frontier.unregister_backend("plain_b")


def test_batch_validates_the_shared_weights_once(monkeypatch):
    cfg = random_config(**TINY)
    w = random_weights(cfg, seed=1, dtype=torch.float64)
    calls = []
    original = type(w).validate

    def counting(self, c):
        calls.append(c)
        return original(self, c)

    monkeypatch.setattr(type(w), "validate", counting)
    g = torch.Generator().manual_seed(5)
    feats = [torch.randn(1, n, cfg.feature_size, generator=g, dtype=torch.float64) for n in (2, 3, 1)]
    ids = [torch.randint(0, 16, (1, n + 1), generator=g) for n in (2, 3, 1)]
    frs = frontier_generate_batch(cfg, feats, "torch_ref", input_ids=ids, weights=w)
    assert len(calls) == 1
    assert frs[0].cache.dtype == torch.float64 and frs[2].cache.device == torch.device("cpu")
    with pytest.raises(frontier.WeightsError, match=r"^sequence 0: weights: tensor 'midlayer\.mlp\.gate_proj\.weight' has shape "):
        frontier_generate_batch(cfg.replace(intermediate_size=4), feats, "torch_ref", input_ids=ids, weights=w)


def test_batch_draft_cache_on_the_requested_device():
    bc = BatchDraftCache(random_config(**TINY), 2, max_length=3, dtype=torch.float32, device="meta")
    assert bc.k.device.type == "meta" and bc.v.device.type == "meta" and bc[1].device.type == "meta"
