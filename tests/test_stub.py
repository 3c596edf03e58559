"""The stub backend: valid, EAGLE-shaped, deterministic trees with no weights, on the features' device."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch.overrides import TorchFunctionMode

from frontier import FrontierConfig, InputError, frontier_generate
from frontier.api import DraftRequest
from frontier.backends.stub import StubBackend


def _config_matrix() -> list[tuple[int, int, int, int]]:
    """(total_token, depth, top_k, vocab_size): the edges, EAGLE's usual shapes and random odd ones."""
    cases = [
        (2, 1, 1, 1),  # the smallest tree: root + one node, K = V = 1
        (3, 1, 1, 5),  # top_k=1, depth=1, largest T (1 + K + D*K^2 = 3)
        (7, 5, 1, 9),  # top_k=1: a chain is the only possible tree; largest T
        (2, 1, 10, 10),  # total_token=2 with a wide frontier, K == V
        (2, 6, 4, 50),
        (1 + 4 + 1 * 16, 1, 4, 40),  # depth=1, largest T
        (1 + 10 + 5 * 100, 5, 10, 32000),  # EAGLE's K=10, D=5 at the largest T allowed
        (60, 5, 10, 32000),  # EAGLE-3 defaults
        (64, 7, 8, 128256),
        (12, 3, 3, 64),
    ]
    rng = random.Random(2024)
    for _ in range(24):  # odd sizes
        k = rng.randint(1, 11)
        depth = rng.randint(1, 8)
        max_t = 1 + k + depth * k * k
        t = rng.choice([2, rng.randint(2, max_t), max_t, min(max_t, rng.randint(k + 1, 3 * k + 2))])
        v = rng.choice([k, k + rng.randint(1, 9), rng.randint(k, 50000)])
        cases.append((t, depth, k, v))
    return cases


CONFIGS = _config_matrix()


def make(t, depth, k, v, hidden=5) -> FrontierConfig:
    return FrontierConfig(total_token=t, depth=depth, top_k=k, vocab_size=v, hidden_size=hidden)


def inputs(cfg: FrontierConfig, n=4, root=7, dtype=torch.float32, device="cpu"):
    feats = torch.randn(1, n, cfg.feature_size, dtype=dtype, device=device)
    ids = torch.arange(n + 1, device=device)[None] % cfg.vocab_size
    ids[0, -1] = root
    return feats, ids


@pytest.mark.parametrize("t,depth,k,v", CONFIGS, ids=[f"T{t}-D{d}-K{k}-V{v}" for t, d, k, v in CONFIGS])
def test_stub_output_passes_the_invariant_checker(t, depth, k, v):
    cfg = make(t, depth, k, v)
    feats, ids = inputs(cfg, root=v - 1)
    results = {}
    for sampling, padded in itertools.product((False, True), (False, True)):
        fr = frontier_generate(cfg, feats, backend="stub", input_ids=ids, sampling=sampling, padded=padded, seed=1)
        fr.check_invariants(total_token=t, depth=depth, top_k=k, sampling=sampling)
        assert fr.draft_tokens.shape == (1, t) and fr.draft_tokens.dtype == torch.int64
        assert fr.tree_mask.shape == (1, 1, t, t) and fr.tree_mask.dtype == torch.float32
        assert fr.tree_position_ids.shape == (t,) and fr.tree_position_ids.dtype == torch.int64
        assert int(fr.draft_tokens[0, 0]) == v - 1  # the root is the last input token
        assert bool((fr.draft_tokens[0, 1:] < v).all())  # drafted tokens come from the draft vocabulary
        if padded:
            assert fr.retrieve_indices.shape == (t, depth + 2)
            assert int(fr.leaf_count) == fr.real_retrieve_indices().shape[0]
        else:
            leaves = t - len(set(fr.parents[1:].tolist()))
            assert fr.retrieve_indices.shape == (leaves, int(fr.tree_position_ids.max()) + 1)
        results[sampling, padded] = fr

        # Scores: root 0, and every node scores strictly below its parent (log-probs are < 0).
        assert fr.scores.shape == (t,) and float(fr.scores[0]) == 0.0
        parents = fr.parents
        assert torch.all(fr.scores[1:] < fr.scores[parents[1:]])
        # parents agrees with the mask: the parent is the deepest strict ancestor.
        depth_of = fr.tree_position_ids
        assert torch.equal(depth_of[parents[1:]] + 1, depth_of[1:])
        assert bool(fr.tree_mask[0, 0, torch.arange(1, t), parents[1:]].all())

    # Padding and sampling change only the layout of retrieve_indices, never the tree.
    base = results[False, False]
    for (sampling, padded), fr in results.items():
        assert torch.equal(fr.draft_tokens, base.draft_tokens)
        assert torch.equal(fr.tree_mask, base.tree_mask)
        assert torch.equal(fr.tree_position_ids, base.tree_position_ids)
        rows = sorted(map(tuple, fr.real_retrieve_indices().tolist()))
        assert rows == sorted(map(tuple, base.retrieve_indices.tolist()))
    assert results[False, True].same_tree(base) and results[True, True].same_tree(results[True, False])


def test_input_ids_are_optional():
    cfg = make(20, 3, 4, 100)
    fr = frontier_generate(cfg, torch.randn(1, 3, cfg.feature_size), backend="stub")
    fr.check_invariants(total_token=20, depth=3, top_k=4)
    assert int(fr.draft_tokens[0, 0]) == 0


def test_deterministic_for_same_inputs_and_seed():
    cfg = make(60, 5, 10, 32000)
    feats, ids = inputs(cfg)
    a = frontier_generate(cfg, feats, backend="stub", input_ids=ids, seed=5)
    b = frontier_generate(cfg, feats.clone(), backend="stub", input_ids=ids.clone(), seed=5)
    assert a.same_tree(b) and torch.equal(a.scores, b.scores)
    # A fresh backend object gives the same tree too (no hidden state).
    req = DraftRequest(cfg=cfg, features=feats, input_ids=ids, seed=5)
    assert StubBackend().generate(req).same_tree(a)
    # The feature values and dtype do not matter, only their count n, the root token and the seed.
    c = frontier_generate(cfg, torch.randn_like(feats).to(torch.bfloat16), backend="stub", input_ids=ids, seed=5)
    assert c.same_tree(a)


def test_seed_root_and_context_length_change_the_tree():
    cfg = make(60, 5, 10, 32000)
    feats, ids = inputs(cfg)
    trees = [frontier_generate(cfg, feats, backend="stub", input_ids=ids, seed=s) for s in range(6)]
    for x, y in itertools.combinations(trees, 2):
        assert not torch.equal(x.draft_tokens, y.draft_tokens)
    # Different seeds also give different shapes, not just different tokens.
    assert len({tuple(t.tree_position_ids.tolist()) for t in trees}) > 1
    other_root = frontier_generate(cfg, feats, backend="stub", input_ids=inputs(cfg, root=8)[1], seed=0)
    assert not torch.equal(other_root.draft_tokens[:, 1:], trees[0].draft_tokens[:, 1:])
    longer = frontier_generate(cfg, torch.randn(1, 9, cfg.feature_size), backend="stub", seed=0)
    shorter = frontier_generate(cfg, torch.randn(1, 4, cfg.feature_size), backend="stub", seed=0)
    assert not torch.equal(longer.draft_tokens, shorter.draft_tokens)


@pytest.mark.parametrize("t,depth,k", [(60, 5, 10), (24, 4, 4), (40, 6, 3), (30, 3, 8), (16, 2, 5)])
def test_trees_look_like_eagle_trees(t, depth, k):
    """Neither a chain nor a star: branching at the root and below it, several levels, many leaves."""
    cfg = make(t, depth, k, 1000)
    for seed in range(8):
        fr = frontier_generate(cfg, torch.zeros(1, 3, cfg.feature_size), backend="stub", seed=seed)
        children = torch.bincount(fr.parents[1:], minlength=t)
        deepest = int(fr.tree_position_ids.max())
        assert 2 <= deepest <= depth + 1  # not a star
        assert int(children[0]) >= 2  # the root branches
        assert int((children[1:] >= 2).sum()) >= 1  # some inner node branches: not a chain below the root
        assert int(children.max()) <= k
        leaves = int((children == 0).sum())
        assert 2 <= leaves <= t - 2
        # Several nodes per level below the root on the way down (a bushy top, a thinner tail).
        per_level = torch.bincount(fr.tree_position_ids, minlength=deepest + 1)
        assert int(per_level[1]) >= 2 and int(per_level[2]) >= 1


def test_dtype_of_features_is_accepted_and_kept_out_of_the_tree():
    cfg = make(20, 3, 4, 100)
    ref = frontier_generate(cfg, torch.zeros(1, 2, cfg.feature_size), backend="stub")
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        fr = frontier_generate(cfg, torch.zeros(1, 2, cfg.feature_size, dtype=dtype), backend="stub")
        assert fr.same_tree(ref) and fr.tree_mask.dtype == torch.float32


def test_outputs_live_on_the_features_device_cpu():
    cfg = make(20, 3, 4, 100)
    feats, ids = inputs(cfg)
    for padded in (False, True):
        fr = frontier_generate(cfg, feats, backend="stub", input_ids=ids, padded=padded)
        for x in (fr.draft_tokens, fr.retrieve_indices, fr.tree_mask, fr.tree_position_ids, fr.scores, fr.parents,
                  fr.leaf_count):
            assert x.device == feats.device
        assert fr.cache is None


def test_stub_rejects_devices_it_does_not_support():
    cfg = make(20, 3, 4, 100)
    with pytest.raises(InputError, match=r"backend 'stub' runs on cpu, cuda; features_concat is on meta"):
        frontier_generate(cfg, torch.zeros(1, 2, cfg.feature_size, device="meta"), backend="stub")


class RecordHostReads(TorchFunctionMode):
    """Records every tensor operation that copies data to the host (a device sync on CUDA)."""

    NAMES = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero", "cpu", "unique"}

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("sampling", [False, True])
def test_padded_mode_makes_no_host_read(sampling):
    cfg = make(60, 5, 10, 32000)
    feats, ids = inputs(cfg)
    with RecordHostReads() as rec:
        fr = frontier_generate(cfg, feats, backend="stub", input_ids=ids, padded=True, sampling=sampling)
    assert rec.reads == []
    with RecordHostReads() as rec:
        frontier_generate(cfg, feats, backend="stub", input_ids=ids, padded=False, sampling=sampling)
    assert rec.reads == ["tolist"]  # unpadded: the single read that sizes retrieve_indices
    fr.check_invariants(total_token=60, depth=5, top_k=10, sampling=sampling)


def test_padded_stub_traces_as_one_graph():
    """torch.compile(fullgraph=True) succeeds: no graph break anywhere in the padded stub."""
    cfg = make(24, 4, 4, 300)
    backend = StubBackend()

    def draft(feats, ids):
        fr = backend.generate(DraftRequest(cfg=cfg, features=feats, input_ids=ids, padded=True, sampling=True, seed=3))
        return fr.draft_tokens, fr.retrieve_indices, fr.tree_mask, fr.tree_position_ids, fr.leaf_count

    feats, ids = inputs(cfg)
    compiled = torch.compile(draft, backend="eager", fullgraph=True)
    got, want = compiled(feats, ids), draft(feats, ids)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_cuda_outputs_on_device_no_sync_and_same_tree_as_cpu():
    cfg = make(60, 5, 10, 32000)
    feats, ids = inputs(cfg)
    cpu = frontier_generate(cfg, feats, backend="stub", input_ids=ids, padded=True, sampling=True)
    gfeats, gids = feats.cuda(), ids.cuda()
    frontier_generate(cfg, gfeats, backend="stub", input_ids=gids, padded=True, sampling=True)  # warm up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu = frontier_generate(cfg, gfeats, backend="stub", input_ids=gids, padded=True, sampling=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for x in (gpu.draft_tokens, gpu.retrieve_indices, gpu.tree_mask, gpu.tree_position_ids, gpu.leaf_count):
        assert x.is_cuda
    assert gpu.same_tree(cpu)
    gpu.check_invariants(total_token=60, depth=5, top_k=10, sampling=True)


@pytest.mark.gpu
def test_cuda_graph_capture_of_padded_stub():
    cfg = make(60, 5, 10, 32000)
    feats, ids = inputs(cfg, device="cuda")
    backend = StubBackend()
    req = DraftRequest(cfg=cfg, features=feats, input_ids=ids, padded=True, seed=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        backend.generate(req)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backend.generate(req)
    ids[0, -1] = 11  # a new root: replay must pick it up
    graph.replay()
    torch.cuda.synchronize()
    want = backend.generate(req)
    assert captured.same_tree(want)
