"""Shared scaffolding of the generation tests: a tiny random target + EAGLE-3 head, one torch
thread, the greedy reference, and backend helpers. Import the names into a test module (fixtures
included) to use them there."""

from __future__ import annotations

import contextlib
import copy
import os

import pytest
import torch

import frontier
from frontier.generation import random_pair
from frontier.random_head import random_config, random_weights
from frontier.registry import register_backend, unregister_backend

V = 256  # the tiny target's vocabulary

# The generation tests' model calls are frontier's target forwards (and the reference
# target.generate): a deprecated keyword passed into a forward, which torch.nn.Module's call site
# reports, fails the test. Each generation test module sets ``pytestmark = DEPRECATIONS_FAIL``.
DEPRECATIONS_FAIL = [
    pytest.mark.filterwarnings("error::FutureWarning:torch.nn.modules.module"),
    pytest.mark.filterwarnings("error::DeprecationWarning:torch.nn.modules.module"),
]

# (total_token, depth, top_k): a bushy tree, a top_k=1 chain at its maximum size (D + 2),
# total_token at its maximum 1 + K + D*K^2, and the smallest tree.
TREES = [(16, 4, 4), (7, 5, 1), (22, 2, 3), (2, 1, 1)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one intra-op thread (and don't stall on a busy 2-core box)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def pair():
    """A tiny random Llama target (8 layers: taps 2 < 4 < 5 distinct) and a random EAGLE-3 head."""
    return random_pair("tiny", total_token=16, depth=4, top_k=4, seed=0)


def _head(target, t, d, k, seed=1):
    """A random EAGLE-3 head of the given tree shape for ``target`` (sharing its embedding)."""
    h = target.config.hidden_size
    cfg = random_config(
        total_token=t, depth=d, top_k=k, vocab_size=V // 2, target_vocab_size=V, hidden_size=h,
        feature_size=3 * h, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
    )
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0)
    w.embed_tokens = target.get_input_embeddings().weight.detach()
    return cfg, w


def _reference(target, ids, n, **kw):
    """``target.generate(do_sample=False)`` for one prompt ([P] or [1, P]), on the target's device."""
    if ids.dim() == 1:
        ids = ids[None]
    return target.generate(ids.to(target.device), do_sample=False, max_new_tokens=n, pad_token_id=0, **kw)


_ON_DEVICE = {}


def on_backend_device(backend, target, w):
    """``target`` and the head ``w`` where ``backend`` takes its inputs (``conftest.backend_device``):
    as they are on the CPU; else a copy of the target moved to that device (one per target and
    device, kept for the session: the module fixture stays on the CPU) and the head moved there."""
    from conftest import backend_device

    dev = backend_device(backend)
    if dev.type == "cpu":
        return target, w
    key = (target, str(dev))  # (a module hashes by identity)
    if key not in _ON_DEVICE:
        _ON_DEVICE[key] = copy.deepcopy(target).to(dev)
    return _ON_DEVICE[key], (w.to(dev) if w is not None else None)


def _weights_for(backend, w):
    return w if getattr(frontier.get_backend(backend), "requires_weights", False) else None


def interpreted(backend: str) -> bool:
    """Triton kernels under TRITON_INTERPRET=1 (CPU CI) take seconds per draft call."""
    return backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1"


def plant_continuation(fr, future, rng, vocab=V):
    """An oracle drafter's tree: ``fr``'s deepest path gets the target's true continuation
    ``future`` for its first ``rng.randint(0, len(path))`` nodes and a wrong token after that
    (siblings keep distinct tokens), so the loop sees acceptances of every length."""
    from frontier.generation import tree_parents

    tokens = fr.draft_tokens[0].clone()
    parent = tree_parents(fr.tree_mask).tolist()
    depth = fr.tree_position_ids.tolist()
    deepest = max(range(len(depth)), key=lambda i: depth[i])
    path = [deepest]
    while path[-1] != 0:
        path.append(parent[path[-1]])
    path = path[::-1][1:]  # root excluded
    correct = rng.randint(0, len(path))  # the first `correct` path nodes are right
    for j, node in enumerate(path):
        if j < len(future):
            tokens[node] = future[j] if j < correct else (future[j] + 1) % vocab
    for node in path:  # siblings keep distinct tokens
        sibs = [i for i in range(1, len(parent)) if parent[i] == parent[node] and i != node]
        used = {int(tokens[i]) for i in sibs} | {int(tokens[node])}
        for s in sibs:
            if int(tokens[s]) == int(tokens[node]):
                alt = next(x for x in range(vocab) if x not in used)
                tokens[s] = alt
                used.add(alt)
    fr.draft_tokens = tokens[None]
    return fr


@contextlib.contextmanager
def registered(backend):
    """``backend`` registered under its name (replacing any) while the block runs; a fixture
    yields inside it."""
    register_backend(backend.name, backend, clobber=True)
    try:
        yield backend
    finally:
        unregister_backend(backend.name)
