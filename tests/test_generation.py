"""Speculative generation with a Hugging Face target: lossless greedy output, the cache and
feature plumbing, stopping rules, stats and bad inputs (CPU, tiny random models, no downloads)."""

from __future__ import annotations

import random

import pytest
import torch

import frontier
from frontier import FrontierConfig, InputError
from frontier.backends.stub import StubBackend
from frontier.generation import (
    SpeculativeGenerator,
    eagle3_tap_layers,
    generate,
)
from frontier.random_head import random_config, random_weights
from frontier.registry import Backend, register_backend, unregister_backend
from gen_support import (  # noqa: F401
    DEPRECATIONS_FAIL,
    TREES, V, _head, _one_thread, _reference, _weights_for, interpreted, on_backend_device, pair,
    plant_continuation, registered,
)

pytestmark = DEPRECATIONS_FAIL


def _prompt(seed, length):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (1, length), generator=g)


# ----------------------------------------------------------------------------------------------
# An oracle drafter: the stub's tree with one deep path carrying the target's true greedy
# continuation up to a random depth, so that long acceptances, compaction and EOS inside an
# accepted run are all exercised (a random head almost never gets a token accepted).
# ----------------------------------------------------------------------------------------------
class OracleBackend(Backend):
    name = "test_oracle"
    requires_weights = False
    dtypes = (torch.float32,)

    def __init__(self):
        self.reference: list[int] = []
        self.rng = random.Random(0)
        self.calls: list[tuple[int, int]] = []  # (L, n) per call

    def generate(self, request):
        fr = StubBackend().generate(request)
        ids = request.input_ids[0].tolist()
        self.calls.append((len(ids) - 1, request.features.shape[1]))
        assert ids == self.reference[: len(ids)], "the loop's sequence left the target's greedy output"
        future = self.reference[len(ids) :]
        return plant_continuation(fr, future, self.rng)


class StaticOracleBackend(OracleBackend):
    """The oracle that also drafts from a Drafter's buffers: the slot's sequence length is read
    back from the device (a test may), the rest as the per-call oracle."""

    name = "test_static_oracle"

    def __init__(self):
        super().__init__()
        self.static_calls: list[tuple[int, int]] = []  # (L, n) per slot of each replayed step

    def static_drafter(self, drafter):
        from frontier.backends.stub.backend import stub_frontier
        from frontier.drafter import StaticStep

        oracle = self

        class Step(StaticStep):
            def draft(self, batch, st):
                for b in range(batch):
                    big_l, n = int(st.c[b] + st.n[b]), int(st.n[b])
                    root = int(st.root[b])
                    assert root == oracle.reference[big_l], "the loop's sequence left the target's greedy output"
                    staged = st.ids[b, :n].tolist()  # the tokens paired with the new rows end at the root
                    assert staged == oracle.reference[big_l - n + 1 : big_l + 1]
                    oracle.static_calls.append((big_l, n))
                    fr = stub_frontier(drafter.cfg, st.root[b].reshape(1), 7 + n, sampling=False, padded=True)
                    drafter.outputs.write(b, plant_continuation(fr, oracle.reference[big_l + 1 :], oracle.rng))

        return Step(drafter)


@pytest.fixture
def static_oracle():
    with registered(StaticOracleBackend()) as b:
        yield b


@pytest.fixture
def oracle():
    with registered(OracleBackend()) as b:
        yield b


# ----------------------------------------------------------------------------------------------
# Lossless greedy
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow_case(backend_name="triton", tree=TREES[:2])  # interpreted: the depth-1 and depth-2 trees by default
@pytest.mark.parametrize("tree", TREES, ids=lambda t: f"T{t[0]}-D{t[1]}-K{t[2]}")
def test_greedy_lossless_every_backend(pair, tree, backend_name):
    target, _, _ = pair
    cfg, w = _head(target, *tree, seed=3 + tree[0])
    target, w = on_backend_device(backend_name, target, w)
    cases = [(1, 9), (6, 23), (13, 17)]
    if interpreted(backend_name):
        cases = [(6, 4), (1, 3)] if tree == TREES[0] else [(6, 4)]
    for seed, (plen, n) in enumerate(cases):
        ids = _prompt(100 * seed + tree[0], plen)
        ref = _reference(target, ids, n)
        out = generate(target, ids, cfg=cfg, weights=_weights_for(backend_name, w), backend=backend_name, max_new_tokens=n)
        assert torch.equal(out.sequences, ref), f"backend {backend_name} prompt {seed}: output differs from target.generate"
        assert out.stats.new_tokens == ref.shape[1] - plen
        assert out.stats.target_forwards == 1 + out.stats.verify_steps


@pytest.mark.slow_case(backend_name="triton")  # interpreted: two prompts of test_greedy_lossless_every_backend run by default
@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_static_drafting_is_lossless(pair, backend_name, batch):
    """static=True: the loop drafts through a Drafter (prefill, then staged rows and replays; a
    batch's finished sequences leave its slots) and the output is the target's own."""
    target, _, _ = pair
    cfg, w = _head(target, 12, 3, 3, seed=5)
    target, w = on_backend_device(backend_name, target, w)
    gen = SpeculativeGenerator(target, cfg, _weights_for(backend_name, w), backend=backend_name, static=True)
    assert gen.static
    prompts = [_prompt(31, 5), _prompt(32, 3), _prompt(33, 8)]
    budgets = [6, 2, 4]  # the second sequence stops first and leaves the batch
    if batch:
        out = gen.generate([p[0] for p in prompts], max_new_tokens=budgets, eos_token_id=None)
        for p, n, res in zip(prompts, budgets, out.results):
            assert torch.equal(res.sequences, _reference(target, p, n, eos_token_id=None))
    for p, n in zip(prompts[:2], budgets[:2]):  # the same generator again: its Drafter is reused
        out = gen.generate(p, max_new_tokens=n, eos_token_id=None)
        assert torch.equal(out.sequences, _reference(target, p, n, eos_token_id=None))
    assert len(gen._drafters) == 1


def test_a_kept_drafter_follows_the_head_and_the_generators_head_is_fixed(pair):
    """The Drafter kept between ``generate`` calls (which holds what it derives from the head:
    here an fp8 head's dequantized copy) is made again after a tensor of the head changes in
    place, so the next call drafts what a new generator with the changed head drafts; the head,
    config, backend and options themselves cannot be swapped on a generator."""
    target, _, _ = pair
    cfg, w = _head(target, 12, 3, 3, seed=5)
    w = w.quantized()
    gen = SpeculativeGenerator(target, cfg, w, backend="torch_ref", static=True)
    p = _prompt(34, 5)
    gen.generate(p, max_new_tokens=4, eos_token_id=None)
    kept = gen._drafters[False][0]
    scale = next(t for k, t in w.scales.items() if "down_proj" in k)
    scale.mul_(8.0)  # in place: another head, the same tensors
    out = gen.generate(p, max_new_tokens=8, eos_token_id=None)
    drafter = gen._drafters[False][0]
    assert drafter is not kept  # and it drafts with the changed head's dequantized weights:
    assert torch.equal(drafter._impl.w.layers[0].down_proj, w.dequantized().layers[0].down_proj)
    fresh = SpeculativeGenerator(target, cfg, w, backend="torch_ref", static=True).generate(
        p, max_new_tokens=8, eos_token_id=None)
    assert out.stats.accepted_lengths == fresh.stats.accepted_lengths
    assert torch.equal(out.sequences, fresh.sequences)
    for name, value in [("weights", random_weights(cfg, seed=6)), ("cfg", cfg), ("backend", "stub"),
                        ("draft_options", {}), ("static", False), ("padded", False)]:
        with pytest.raises(AttributeError, match=f"SpeculativeGenerator.{name} is fixed when the generator is made"):
            setattr(gen, name, value)
    with pytest.raises(TypeError):
        gen.draft_options["mode"] = "steps"


def test_static_drafting_with_accepted_runs(pair, static_oracle):
    """Long accepted runs stage several rows per step (up to depth + 2) into the Drafter."""
    target, _, _ = pair
    cfg = FrontierConfig(total_token=12, depth=4, top_k=2, vocab_size=V, hidden_size=64, feature_size=192)
    prompts = [_prompt(41, 4), _prompt(42, 9)]
    refs = [_reference(target, p, 40, eos_token_id=None) for p in prompts]
    gen = SpeculativeGenerator(target, cfg, backend=static_oracle.name, static=True)
    outs = []
    for p, ref in zip(prompts, refs):
        static_oracle.reference = ref[0].tolist()
        static_oracle.rng = random.Random(3)
        outs.append(gen.generate(p, max_new_tokens=30, eos_token_id=None))
        assert torch.equal(outs[-1].sequences, ref[:, : p.shape[1] + 30])
    assert [n for _, n in static_oracle.calls] == [4, 9]  # the prompts: prefill's frontier_generate calls
    rows = [n for _, n in static_oracle.static_calls]
    assert max(rows) > 1 and max(rows) <= cfg.depth + 2  # several accepted rows staged at once
    assert sum(a - 1 for o in outs for a in o.stats.accepted_lengths) > 0


def test_static_option_is_checked(pair, oracle):
    target, cfg, w = pair
    with pytest.raises(InputError, match="cannot draft from static buffers"):
        SpeculativeGenerator(target, cfg, backend=oracle.name, static=True)
    with pytest.raises(InputError, match="padded=True"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", static=True, padded=False)
    with pytest.raises(InputError, match="draft options"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", static=True, draft_options={"trace": True})
    with pytest.raises(InputError, match="static must be"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", static="yes")
    # default: per-call drafting on a CPU target, a Drafter on a GPU one
    assert SpeculativeGenerator(target, cfg, w, backend="torch_ref").static is False


@pytest.mark.parametrize(
    "tree, padded", [(t, True) for t in TREES] + [(TREES[0], False)], ids=lambda x: str(x)
)
def test_greedy_lossless_with_accepted_runs(pair, oracle, tree, padded):
    target, _, _ = pair
    t, d, k = tree
    cfg = FrontierConfig(total_token=t, depth=d, top_k=k, vocab_size=V, hidden_size=64, feature_size=3 * 64)
    total_accepted = 0
    for seed, (plen, n) in enumerate([(3, 30), (11, 23), (1, 17)]):
        ids = _prompt(7 + seed, plen)
        ref = _reference(target, ids, n + t + 2, eos_token_id=None)
        oracle.reference = ref[0].tolist()
        oracle.rng = random.Random(seed)
        out = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=n, eos_token_id=None, padded=padded)
        assert torch.equal(out.sequences, ref[:, : plen + n])
        # every draft call: c + n == L (context rows fed so far + new rows)
        fed = 0
        for big_l, new in oracle.calls:
            assert fed + new == big_l
            fed = big_l
        oracle.calls.clear()
        total_accepted += sum(a - 1 for a in out.stats.accepted_lengths)
        assert sum(out.stats.accepted_lengths) + 1 >= out.stats.new_tokens
    if d > 0 and t > 2:
        assert total_accepted > 0, "the oracle's paths were never accepted: acceptance is broken"


def test_eos_inside_an_accepted_run(pair, oracle):
    target, _, _ = pair
    cfg = FrontierConfig(total_token=12, depth=6, top_k=2, vocab_size=V, hidden_size=64, feature_size=192)
    ids = _prompt(5, 4)
    free = _reference(target, ids, 40, eos_token_id=None)[0].tolist()
    oracle.reference = free
    for stop_at in (4 + 1, 4 + 9, 4 + 17):
        eos = free[stop_at]
        first = free.index(eos, 4)  # the first occurrence after the prompt ends generation
        ref = _reference(target, ids, 40, eos_token_id=eos)
        assert ref.shape[1] == first + 1
        oracle.rng = random.Random(stop_at)
        out = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=40, eos_token_id=eos)
        assert torch.equal(out.sequences, ref)
        assert out.stats.stop_reason == "eos"
        # the same token as an extra stop token (EOS off)
        out2 = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=40, eos_token_id=None, stop_token_ids=[eos])
        assert torch.equal(out2.sequences, ref) and out2.stats.stop_reason == "stop_token"


def test_default_eos_is_the_targets(pair, oracle):
    target, _, _ = pair
    cfg = FrontierConfig(total_token=10, depth=4, top_k=2, vocab_size=V, hidden_size=64, feature_size=192)
    ids = _prompt(9, 5)
    free = _reference(target, ids, 30, eos_token_id=None)[0].tolist()
    old = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = free[5 + 6]
    try:
        oracle.reference = free
        out = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=30)
        ref = _reference(target, ids, 30)
    finally:
        target.generation_config.eos_token_id = old
    assert torch.equal(out.sequences, ref) and out.stats.stop_reason == "eos"


def test_max_new_tokens_and_max_length(pair, oracle):
    target, _, _ = pair
    cfg = FrontierConfig(total_token=20, depth=5, top_k=3, vocab_size=V, hidden_size=64, feature_size=192)
    ids = _prompt(3, 7)
    free = _reference(target, ids, 60, eos_token_id=None)
    oracle.reference = free[0].tolist()
    for n in (1, 2, 5, 13):
        out = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=n, eos_token_id=None)
        assert torch.equal(out.sequences, free[:, : 7 + n]) and out.stats.stop_reason == "max_new_tokens"
        assert out.new_tokens.shape == (1, n)
    out = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=50, max_length=7 + 11, eos_token_id=None)
    assert torch.equal(out.sequences, free[:, :18]) and out.stats.stop_reason == "max_length"
    out = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=4, max_length=100, eos_token_id=None)
    assert out.sequences.shape[1] == 11 and out.stats.stop_reason == "max_new_tokens"


def test_eagle2_head_lossless(pair):
    target, _, _ = pair
    h = target.config.hidden_size
    cfg = random_config(
        total_token=14, depth=3, top_k=3, vocab_size=V, hidden_size=h, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=96, architecture="eagle2",
    )
    w = random_weights(cfg, seed=5)
    w.lm_head = target.lm_head.weight.detach()
    w.embed_tokens = target.get_input_embeddings().weight.detach()
    ids = _prompt(77, 8)
    out = generate(target, ids, cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=15)
    assert torch.equal(out.sequences, _reference(target, ids, 15))


# ----------------------------------------------------------------------------------------------
# Features and the draft cache
# ----------------------------------------------------------------------------------------------
def test_eagle3_tap_layers():
    assert eagle3_tap_layers(32) == [2, 16, 29]
    assert eagle3_tap_layers(8) == [2, 4, 5]
    assert eagle3_tap_layers(6) == [2, 3]  # L//2 == L-3: tapped once
    assert eagle3_tap_layers(5) == [2]
    assert eagle3_tap_layers(4) == [1, 2]  # L-3 = 1 comes first


class RecordingBackend(Backend):
    """Delegates to torch_ref and records every request."""

    name = "test_recording"
    requires_weights = True
    dtypes = (torch.float32,)

    def __init__(self):
        self.requests = []

    def generate(self, request):
        self.requests.append((request.input_ids.clone(), request.features.clone(), 0 if request.cache is None else request.cache.length))
        return frontier.get_backend("torch_ref").generate(request)


def test_features_are_the_targets_hidden_states_at_the_accepted_tokens(pair, oracle):
    """Recorded draft inputs, concatenated, equal the target's taps over the final sequence."""
    target, _, _ = pair
    cfg, w = _head(target, 10, 3, 3)
    rec = RecordingBackend()
    register_backend(rec.name, rec, clobber=True)
    try:
        ids = _prompt(21, 9)
        out = generate(target, ids, cfg=cfg, weights=w, backend=rec.name, max_new_tokens=12, eos_token_id=None)
    finally:
        unregister_backend(rec.name)
    seq = out.sequences
    feats = torch.cat([f for _, f, _ in rec.requests], dim=1)  # [1, L_last, F]
    last_ids, _, last_c = rec.requests[-1]
    big_l = last_ids.shape[1] - 1
    assert feats.shape[1] == big_l and last_c + rec.requests[-1][1].shape[1] == big_l
    assert torch.equal(last_ids[0], seq[0, : big_l + 1])
    hs = target(seq[:, :big_l], output_hidden_states=True).hidden_states  # hs[i] enters layer i
    want = torch.cat([hs[2], hs[4], hs[5]], dim=-1)
    torch.testing.assert_close(feats, want, atol=2e-5, rtol=2e-5)


def test_draft_cache_matches_a_fresh_draft(pair, oracle):
    """The incremental draft cache gives the same tree as one fresh call over all features."""
    target, _, _ = pair
    cfg, w = _head(target, 12, 3, 3, seed=9)
    rec = RecordingBackend()
    register_backend(rec.name, rec, clobber=True)
    try:
        generate(target, _prompt(4, 6), cfg=cfg, weights=w, backend=rec.name, max_new_tokens=10, eos_token_id=None)
    finally:
        unregister_backend(rec.name)
    feats = torch.cat([f for _, f, _ in rec.requests], dim=1)
    ids = rec.requests[-1][0]
    fresh = frontier.frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    again = frontier.frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    assert fresh.same_tree(again)
    # Replaying the recorded calls with a cache must end in the same tree as the fresh call.
    cache, fr = None, None
    for ids_i, f_i, _ in rec.requests:
        fr = frontier.frontier_generate(cfg, f_i, backend="torch_ref", input_ids=ids_i, weights=w, cache=cache)
        cache = fr.cache
    assert fr.same_tree(fresh)


# ----------------------------------------------------------------------------------------------
# Stats
# ----------------------------------------------------------------------------------------------
def test_stats_and_callback(pair, oracle):
    target, _, _ = pair
    cfg = FrontierConfig(total_token=16, depth=4, top_k=3, vocab_size=V, hidden_size=64, feature_size=192)
    ids = _prompt(2, 5)
    oracle.reference = _reference(target, ids, 60, eos_token_id=None)[0].tolist()
    seen = []
    out = generate(
        target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=30, eos_token_id=None,
        callback=lambda toks, st: seen.append((toks.shape[1], st.verify_steps)),
    )
    s = out.stats
    assert s.new_tokens == 30 and s.prompt_tokens == 5 and s.backend == oracle.name
    assert s.target_forwards == 1 + s.verify_steps and s.draft_calls == s.verify_steps
    assert 1.0 <= s.mean_accepted_length <= cfg.depth + 2
    assert s.mean_accepted_length == sum(s.accepted_lengths) / len(s.accepted_lengths)
    parts = s.time_prefill + s.time_draft + s.time_verify + s.time_other
    assert abs(parts - s.time_total) < 1e-6 + 1e-3 * s.time_total
    assert s.tokens_per_second > 0
    assert [n for n, _ in seen] == sorted(n for n, _ in seen) and seen[-1][0] == 30
    d = s.to_dict()
    assert d["mean_accepted_length"] == s.mean_accepted_length and "tokens/s" in s.table()


# ----------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------
def test_bad_inputs(pair):
    target, cfg, w = pair
    ids = _prompt(0, 5)
    gen = SpeculativeGenerator(target, cfg, w, backend="torch_ref")
    # A [2, P] tensor is a batch of two prompts (tests/test_generation_batch.py covers batches).
    assert all(torch.equal(s, _reference(target, ids, 2)) for s in gen.generate(torch.cat([ids, ids]), max_new_tokens=2).sequences)
    with pytest.raises(InputError, match="empty"):
        gen.generate(ids[:, :0])
    with pytest.raises(InputError, match="max_length=4 leaves no room"):
        gen.generate(ids, max_length=4)
    with pytest.raises(InputError, match="max_length=5 leaves no room"):
        gen.generate(ids, max_length=5)
    with pytest.raises(InputError, match="max_new_tokens"):
        gen.generate(ids, max_new_tokens=0)
    with pytest.raises(InputError, match=r"input_ids must lie in \[0, 256\)"):
        gen.generate(torch.tensor([[1, 2, 300]]))
    with pytest.raises(InputError, match="integer token ids"):
        gen.generate(ids.float())
    with pytest.raises(InputError, match="temperature"):
        gen.generate(ids, temperature=-1.0)
    with pytest.raises(InputError, match="top_p"):
        gen.generate(ids, temperature=1.0, top_p=0.0)
    with pytest.raises(InputError, match="top_k"):
        gen.generate(ids, temperature=1.0, top_k=-2)
    with pytest.raises(InputError, match="generator must be a torch.Generator"):
        gen.generate(ids, temperature=1.0, generator=5)
    with pytest.raises(InputError, match="seed must be an int"):
        gen.generate(ids, temperature=1.0, seed="7")
    with pytest.raises(InputError, match="eos_token_id must be"):
        gen.generate(ids, eos_token_id="two")
    # A 1-D prompt is taken as one sequence.
    assert torch.equal(gen.generate(ids[0], max_new_tokens=3).sequences, _reference(target, ids, 3))

    # Head built for another target: hidden sizes disagree.
    big = random_config(hidden_size=96, feature_size=3 * 96, vocab_size=V, target_vocab_size=V,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
    with pytest.raises(InputError, match=r"hidden sizes do not match.*feature_size is 288.*layers \[2, 4, 5\].*192"):
        SpeculativeGenerator(target, big, random_weights(big), backend="torch_ref")
    other_vocab = random_config(hidden_size=64, feature_size=192, vocab_size=100, target_vocab_size=300,
                                num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
    with pytest.raises(InputError, match="vocabularies do not match.*300.*256 rows"):
        SpeculativeGenerator(target, other_vocab, random_weights(other_vocab), backend="torch_ref")
    with pytest.raises(InputError, match="needs the draft head"):
        SpeculativeGenerator(target, cfg, None, backend="torch_ref")
    with pytest.raises(frontier.BackendNotFoundError):
        SpeculativeGenerator(target, cfg, w, backend="no_such_backend")
    with pytest.raises(InputError, match="cfg must be"):
        SpeculativeGenerator(target, {"total_token": 4}, w)
    with pytest.raises(InputError, match="Hugging Face causal LM"):
        SpeculativeGenerator(object(), cfg, w)
    old = target.config._attn_implementation
    target.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(InputError, match="attn_implementation='flash_attention_2'"):
            SpeculativeGenerator(target, cfg, w)
    finally:
        target.config._attn_implementation = old
    # A failed call leaves no hooks behind: generation still matches afterwards.
    assert not any(layer._forward_pre_hooks for layer in target.model.layers)


def test_draft_options_reach_every_draft_call(pair, monkeypatch):
    """``draft_options`` (e.g. the triton backend's ``mode``, torch_ref's ``trace``) go to every draft
    call, single and batched, beside the loop's own arguments; bad ones are refused when the
    generator is made."""
    import frontier.generation.drafting as gmod

    target, cfg, w = pair
    seen = []
    real = gmod.frontier_generate

    def recording(cfg_, feats, **kw):
        seen.append(kw)
        return real(cfg_, feats, **kw)

    monkeypatch.setattr(gmod, "frontier_generate", recording)
    ids = _prompt(3, 6)
    gen = SpeculativeGenerator(target, cfg, w, backend="torch_ref", draft_options={"trace": True})
    assert torch.equal(gen.generate(ids, max_new_tokens=4).sequences, _reference(target, ids, 4))
    n_single = len(seen)
    out = gen.generate(torch.cat([ids, _prompt(4, 6)]), max_new_tokens=3)
    assert torch.equal(out.sequences[0], _reference(target, ids, 3))
    assert n_single > 0 and len(seen) > n_single
    assert all(kw["trace"] is True and kw["weights"] is w and "input_ids" in kw for kw in seen)
    with pytest.raises(InputError, match=r"unknown option 'mode' for backend 'torch_ref'"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", draft_options={"mode": "graph"})
    with pytest.raises(InputError, match="draft_options must be a dict"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", draft_options=["mode"])
    with pytest.raises(InputError, match=r"draft_options cannot set \['cache', 'sampling'\]"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", draft_options={"sampling": True, "cache": None})
    # the loop passes these two positionally: refused at construction, not a TypeError at the first draft
    with pytest.raises(InputError, match=r"draft_options cannot set \['cfg', 'features_concat'\]"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", draft_options={"features_concat": None, "cfg": cfg})


# ----------------------------------------------------------------------------------------------
# The target's cache keyword: whatever name the installed transformers' forward declares
# ----------------------------------------------------------------------------------------------
def test_cache_keyword_follows_the_forward_signature(pair):
    """``cache`` where forward declares it (current transformers), else ``past_key_values``."""
    import inspect
    from dataclasses import dataclass
    from types import SimpleNamespace

    from frontier.generation.target import cache_keyword, returned_cache

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=None):
            return input_ids

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=None):
            return input_ids

    class Opaque(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return args

    def unreadable(*args, **kwargs):
        return args

    unreadable.__signature__ = "not a Signature"  # inspect.signature raises TypeError

    class Unreadable:
        forward = staticmethod(unreadable)

    assert cache_keyword(New()) == "cache"
    assert cache_keyword(Old()) == "past_key_values"
    assert cache_keyword(Opaque()) == "past_key_values"
    assert cache_keyword(Unreadable()) == "past_key_values"
    target = pair[0]
    declared = inspect.signature(target.forward).parameters
    assert cache_keyword(target) == ("cache" if "cache" in declared else "past_key_values")

    @dataclass
    class NewOutput:
        logits: object = None
        cache: object = None

    assert returned_cache(NewOutput(cache="kv")) == "kv"
    assert returned_cache(SimpleNamespace(logits=None, past_key_values="kv")) == "kv"


class _OldSignatureLlama:
    """Mixed into a copy of the tiny target: the forward of a transformers release that takes and
    returns the KV cache as ``past_key_values``, wrapping whichever name the installed one uses."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, logits_to_keep=0):
        from types import SimpleNamespace

        from frontier.generation.target import cache_keyword, returned_cache

        inner = cache_keyword(super())
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=use_cache, logits_to_keep=logits_to_keep, **{inner: past_key_values})
        return SimpleNamespace(logits=out.logits, past_key_values=returned_cache(out))


def test_old_cache_keyword_generates_the_same(pair):
    """A target whose forward takes ``past_key_values`` (older transformers) gets the cache under
    that name and generates what the current-API target does, one prompt and a batch."""
    import copy

    from frontier.generation.target import cache_keyword

    target, cfg, w = pair
    old = copy.deepcopy(target)
    old.__class__ = type("OldSignatureLlama", (_OldSignatureLlama, type(target)), {})
    assert cache_keyword(old) == "past_key_values"
    ids = _prompt(11, 7)
    want = generate(target, ids, cfg=cfg, weights=w, max_new_tokens=9, eos_token_id=None)
    got = generate(old, ids, cfg=cfg, weights=w, max_new_tokens=9, eos_token_id=None)
    assert torch.equal(got.sequences, want.sequences) and torch.equal(got.sequences, _reference(target, ids, 9))
    prompts = [ids[0], _prompt(12, 4)[0]]
    want_b = generate(target, prompts, cfg=cfg, weights=w, max_new_tokens=6, eos_token_id=None)
    got_b = generate(old, prompts, cfg=cfg, weights=w, max_new_tokens=6, eos_token_id=None)
    assert all(torch.equal(a, b) for a, b in zip(got_b.sequences, want_b.sequences))


def test_target_forwards_raise_no_deprecation_warning(pair):
    """The loop calls the target the way the installed transformers expects: no FutureWarning or
    DeprecationWarning from a generation, one prompt or a batch (whatever the pytest filters say)."""
    import warnings

    target, cfg, w = pair
    ids = _prompt(13, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate(target, ids, cfg=cfg, weights=w, max_new_tokens=5)
        generate(target, [ids[0], _prompt(14, 3)[0]], cfg=cfg, weights=w, max_new_tokens=4)
    deprecations = [str(c.message) for c in caught if issubclass(c.category, (FutureWarning, DeprecationWarning))]
    assert deprecations == []
