"""patch_ea_model_with_triton_drafter: an EAGLE-shaped model drafts through frontier.

The model here is written for this test, following the public EAGLE attribute names and cache
protocol (``ea_layer.fc``, ``ea_layer.midlayer.self_attn.{q,k,v,o}_proj``, ``midlayer.mlp.*``,
the norms, ``lm_head``, ``embed_tokens``, ``d2t``/``t2d``, ``total_tokens``/``depth``/``top_k``,
``stable_kv``/``reset_kv()``, ``topK_genrate(hidden_states, input_ids, head, logits_processor)``)
and an ``eagenerate`` loop in the reference's style (retrieve-row greedy verification). Its own
``topK_genrate`` is absent on purpose: only the patch can make it draft.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import frontier
from frontier import BackendUnavailableError, DraftCache, InputError, frontier_generate
from frontier.eagle_patch import is_patched, patch_ea_model_with_triton_drafter, unpatch_ea_model
from frontier.generation import generate, random_pair
from frontier.registry import Backend, register_backend, unregister_backend

from conftest import backend_device, runnable_backends
from gen_support import _one_thread, on_backend_device  # noqa: F401

H, V_T, V_D = 64, 256, 128


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class FakeEaLayer(nn.Module):
    """An EAGLE-3 draft head with the public attribute names (weights only; no drafting code)."""

    def __init__(self, seed=0, total_tokens=16, depth=4, top_k=4, heads=4, kv_heads=2, inter=96):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.config = SimpleNamespace(
            hidden_size=H, num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter,
            vocab_size=V_T, draft_vocab_size=V_D, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
        )
        d = H // heads

        def lin(i, o, scale=1.0):
            m = nn.Linear(i, o, bias=False)
            m.weight.data = torch.randn(o, i, generator=g) * scale / i**0.5
            return m

        self.embed_tokens = nn.Embedding(V_T, H)
        self.fc = lin(3 * H, H)
        self.midlayer = nn.Module()
        self.midlayer.self_attn = nn.Module()
        for name, o in (("q_proj", heads * d), ("k_proj", kv_heads * d), ("v_proj", kv_heads * d)):
            setattr(self.midlayer.self_attn, name, lin(2 * H, o))
        self.midlayer.self_attn.o_proj = lin(heads * d, H)
        self.midlayer.mlp = nn.Module()
        self.midlayer.mlp.gate_proj = lin(H, inter)
        self.midlayer.mlp.up_proj = lin(H, inter)
        self.midlayer.mlp.down_proj = lin(inter, H)
        self.midlayer.hidden_norm = RMSNorm(H)
        self.midlayer.input_layernorm = RMSNorm(H)
        self.midlayer.post_attention_layernorm = RMSNorm(H)
        self.norm = RMSNorm(H)
        self.lm_head = lin(H, V_D, scale=6.0)
        targets = torch.sort(torch.randperm(V_T, generator=g)[:V_D]).values
        self.register_buffer("d2t", targets - torch.arange(V_D))
        self.register_buffer("t2d", torch.zeros(V_T, dtype=torch.bool))
        self.total_tokens = total_tokens - 1  # the reference stores it without the root
        self.depth = depth
        self.top_k = top_k
        self.stable_kv = None

    def reset_kv(self):
        self.stable_kv = None

    def topK_genrate(self, hidden_states, input_ids, head, logits_processor):
        raise NotImplementedError("this test head has no drafting code of its own")


class FakeEaModel(nn.Module):
    """base_model + ea_layer, with an eagenerate loop in the reference's style (greedy)."""

    def __init__(self, base_model, ea_layer):
        super().__init__()
        self.base_model = base_model
        self.ea_layer = ea_layer
        self.use_eagle3 = True
        n = base_model.config.num_hidden_layers
        self.taps = sorted({2, n // 2, n - 3})

    def _forward(self, ids, cache, mask=None, position_ids=None):
        from frontier.generation.target import cache_keyword, returned_cache

        out = self.base_model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True, output_hidden_states=True,
            **{cache_keyword(self.base_model): cache},
        )
        return out.logits, torch.cat([out.hidden_states[i] for i in self.taps], dim=-1), returned_cache(out)

    @torch.no_grad()
    def eagenerate(self, input_ids, max_new_tokens=32):
        self.ea_layer.reset_kv()
        head = self.base_model.lm_head
        p_len = input_ids.shape[1]
        logits, hidden, cache = self._forward(input_ids, None)
        token = logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
        draft, retrieve, tmask, tpos = self.ea_layer.topK_genrate(hidden, torch.cat([input_ids, token], 1), head, None)
        new = 0
        while new < max_new_tokens:
            ctx = input_ids.shape[1]
            t = draft.shape[1]
            add = torch.zeros(t, ctx + t, device=input_ids.device)
            add[:, ctx:][tmask[0, 0] == 0] = torch.finfo(torch.float32).min
            logits, hidden_new, cache = self._forward(draft, cache, add[None, None], (tpos + ctx)[None])
            ext = torch.cat([draft[0], torch.tensor([-1], device=draft.device)])
            candidates = ext[retrieve]  # [leaves, depth+1]
            row_logits = logits[0][retrieve]  # [leaves, depth+1, V]
            match = (candidates[:, 1:] == row_logits[:, :-1].argmax(-1)).int()
            lengths = torch.cumprod(match, dim=1).sum(1)
            acc = int(lengths.max())
            best = int(lengths.argmax()) if acc > 0 else 0
            sel = retrieve[best, : acc + 1]
            input_ids = torch.cat([input_ids, candidates[best, : acc + 1][None]], 1)
            for layer in cache.layers:
                for attr in ("keys", "values"):
                    x = getattr(layer, attr)
                    setattr(layer, attr, torch.cat([x[:, :, :ctx], x[:, :, ctx + sel]], dim=2))
            token = row_logits[best, acc].argmax()[None, None]
            accept_hidden = hidden_new[:, sel]
            new += acc + 1
            draft, retrieve, tmask, tpos = self.ea_layer.topK_genrate(
                accept_hidden, torch.cat([input_ids, token], 1), head, None
            )
        return input_ids[:, : p_len + max_new_tokens]


@pytest.fixture(scope="module")
def target():
    t, _, _ = random_pair("tiny", seed=4)
    return t


def _model(target, **kw):
    layer = FakeEaLayer(**kw)
    layer.embed_tokens.weight.data = target.get_input_embeddings().weight.detach().clone()
    return FakeEaModel(target, layer)


class Recorder(Backend):
    name = "test_patch_recorder"
    requires_weights = True
    dtypes = (torch.float32,)

    def __init__(self):
        self.trees = []

    def generate(self, request):
        fr = frontier.get_backend("torch_ref").generate(request)
        self.trees.append(fr.draft_tokens.clone())
        return fr


def test_unpatched_model_cannot_draft(target):
    model = _model(target)
    with pytest.raises(NotImplementedError):
        model.eagenerate(torch.tensor([[3, 4, 5]]), max_new_tokens=4)


@pytest.mark.slow_case(backend="triton")
@pytest.mark.parametrize("backend", runnable_backends())
def test_patched_eagenerate_is_lossless(target, backend):
    dev = backend_device(backend)
    target, _ = on_backend_device(backend, target, None)  # (a copy off the CPU: the module's target stays)
    model = _model(target, seed=1).to(dev)
    patch_ea_model_with_triton_drafter(model, backend=backend)
    assert is_patched(model)
    cases = [(5, 20), (12, 9)]
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        cases = [(5, 4)]  # seconds per draft call under the interpreter
    for seed, (plen, n) in enumerate(cases):
        ids = torch.randint(3, V_T, (1, plen), generator=torch.Generator().manual_seed(seed)).to(dev)
        out = model.eagenerate(ids, max_new_tokens=n)
        ref = target.generate(ids, do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out, ref)
        if frontier.get_backend(backend).requires_weights:
            cache = model.ea_layer.stable_kv
            assert isinstance(cache, DraftCache) and cache.length >= plen + n - 1


def test_patched_drafts_equal_frontier_generate(target):
    """Through the patch, the draft trees are the ones frontier.generate drafts with the same head."""
    model = _model(target, seed=2, total_tokens=12, depth=3, top_k=3)
    rec = Recorder()
    register_backend(rec.name, rec, clobber=True)
    try:
        patch_ea_model_with_triton_drafter(model, backend=rec.name)
        ids = torch.tensor([[7, 100, 42, 9, 250, 31]])
        model.eagenerate(ids, max_new_tokens=12)
        patched_trees = list(rec.trees)
        rec.trees.clear()
        drafter = model.ea_layer._frontier_patch["drafter"]
        assert drafter.calls == len(patched_trees) and drafter.cfg.total_token == 12
        generate(target, ids, cfg=drafter.cfg, weights=drafter.weights, backend=rec.name, max_new_tokens=12, eos_token_id=None)
        ours = list(rec.trees)
    finally:
        unregister_backend(rec.name)
    # eagenerate drafts once more after its last verify; frontier.generate stops first.
    assert len(patched_trees) >= len(ours) > 0
    for a, b in zip(patched_trees, ours):
        assert torch.equal(a, b)


def test_a_patched_layer_given_another_heads_weights_drafts_with_them(target):
    """The patch keeps the config and weights it read from the layer while the layer's tensors
    stay the same; loading another head's weights into it (``load_state_dict(assign=True)``,
    which replaces the parameters) or replacing one parameter makes the next draft read them."""
    torch.manual_seed(0)  # (FakeEaLayer's embedding is drawn from the global generator)
    model, other = _model(target, seed=1), _model(target, seed=7)
    patch_ea_model_with_triton_drafter(model, backend="torch_ref")
    patch_ea_model_with_triton_drafter(other, backend="torch_ref")
    hid = torch.randn(1, 6, 3 * H, generator=torch.Generator().manual_seed(2))
    ids = torch.randint(3, V_T, (1, 7), generator=torch.Generator().manual_seed(3))

    def draft(m):
        m.ea_layer.reset_kv()
        return m.ea_layer.topK_genrate(hid, ids, None, None)[0]

    first, theirs = draft(model), draft(other)
    assert not torch.equal(first, theirs)
    model.ea_layer.load_state_dict({k: v.clone() for k, v in other.ea_layer.state_dict().items()}, assign=True)
    assert torch.equal(draft(model), theirs)
    neg = -other.ea_layer.lm_head.weight.detach()
    model.ea_layer.lm_head.weight = nn.Parameter(neg.clone())
    other.ea_layer.lm_head.weight = nn.Parameter(neg.clone())
    changed = draft(model)
    assert torch.equal(changed, draft(other)) and not torch.equal(changed, theirs)


def test_an_eagle2_layer_drafts_with_the_head_tensor_it_is_given():
    """EAGLE-2 heads take the target's lm_head from the caller (``head``), here as a tensor: a call
    with another head tensor drafts with that one, as frontier_generate does with it."""
    from eagle_module import eagle_style_module
    from frontier.random_head import random_config, random_inputs, random_weights

    cfg = random_config(architecture="eagle2", total_token=12, depth=3, top_k=3, vocab_size=60, hidden_size=32,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=48)
    w = random_weights(cfg, seed=1, lm_head_scale=6.0)
    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, rope_theta=cfg.rope_theta,
                             rms_norm_eps=cfg.rms_norm_eps, rope_scaling=None)
    layer = eagle_style_module({k: v for k, v in w.state_dict().items() if k != "lm_head.weight"}, config)
    layer.layers = nn.ModuleList([layer.layers._modules["0"]])
    layer.total_tokens, layer.depth, layer.top_k, layer.stable_kv = cfg.total_token - 1, cfg.depth, cfg.top_k, None
    layer.reset_kv = lambda: setattr(layer, "stable_kv", None)
    model = nn.Module()
    model.ea_layer = layer
    patch_ea_model_with_triton_drafter(model, backend="torch_ref")
    ids, feats = random_inputs(cfg, context=6, seed=2)

    def draft(head):
        layer.reset_kv()
        return layer.topK_genrate(feats, ids, head, None)[0]

    first = draft(-w.lm_head)
    ours = draft(w.lm_head.clone())
    ref = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    assert torch.equal(ours, ref.draft_tokens) and not torch.equal(ours, first)


def test_reset_kv_sampling_order_and_unpatch(target):
    model = _model(target, seed=3)
    patch_ea_model_with_triton_drafter(model, backend="torch_ref")
    ids = torch.tensor([[11, 12, 13, 14]])
    a = model.eagenerate(ids, max_new_tokens=10)
    b = model.eagenerate(ids, max_new_tokens=10)  # reset_kv() at the start: a fresh draft cache
    assert torch.equal(a, b)
    model.ea_layer.reset_kv()
    assert model.ea_layer.stable_kv is None
    # Called directly: sampling (a logits processor) orders retrieve rows lexicographically.
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i] for i in (2, 4, 5)], dim=-1)
    root = out.logits[:, -1].argmax(-1, keepdim=True)
    draft, retrieve, tmask, tpos = model.ea_layer.topK_genrate(hidden, torch.cat([ids, root], 1), target.lm_head, object())
    fr = frontier.Frontier(draft_tokens=draft, retrieve_indices=retrieve, tree_mask=tmask, tree_position_ids=tpos)
    fr.check_invariants(total_token=16, depth=4, top_k=4, sampling=True)
    assert model.ea_layer.stable_kv.length == ids.shape[1]
    # The tree shape follows the module's attributes when they change between generations.
    model.ea_layer.depth, model.ea_layer.total_tokens = 2, 7
    model.eagenerate(ids, max_new_tokens=3)
    assert model.ea_layer._frontier_patch["drafter"].cfg.total_token == 8
    assert model.ea_layer._frontier_patch["drafter"].cfg.depth == 2
    # Switching backends re-patches; unpatching restores the module's own method.
    patch_ea_model_with_triton_drafter(model, backend="stub")
    assert model.ea_layer._frontier_patch["backend"] == "stub"
    unpatch_ea_model(model)
    assert not is_patched(model) and model.ea_layer.stable_kv is None
    with pytest.raises(NotImplementedError):
        model.eagenerate(ids, max_new_tokens=4)
    unpatch_ea_model(model)  # no-op


def test_patch_errors(target):
    with pytest.raises(InputError, match="no ea_layer"):
        patch_ea_model_with_triton_drafter(nn.Linear(2, 2))
    model = _model(target)
    with pytest.raises(frontier.BackendNotFoundError):
        patch_ea_model_with_triton_drafter(model, backend="no_such_backend")

    class Down(Backend):
        name = "test_down"
        requires_weights = True

        def availability(self):
            return False, "needs hardware this machine lacks"

    register_backend("test_down", Down(), clobber=True)
    try:
        with pytest.raises(BackendUnavailableError, match="needs hardware this machine lacks"):
            patch_ea_model_with_triton_drafter(model, backend="test_down")
        assert not is_patched(model)
        patch_ea_model_with_triton_drafter(model, backend="test_down", fallback=True)
        with pytest.warns(RuntimeWarning, match="falling back to 'torch_ref'"):
            out = model.eagenerate(torch.tensor([[5, 6, 7]]), max_new_tokens=5)
        assert out.shape == (1, 8)
    finally:
        unregister_backend("test_down")
