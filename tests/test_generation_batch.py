"""Batched speculative generation: a ragged batch of prompts drafted in one call and verified in one
target forward per step, each sequence's output identical to generating it alone (CPU, tiny random
models, no downloads)."""

from __future__ import annotations

import random

import pytest
import torch

import frontier
from frontier import FrontierConfig, InputError
from frontier.backends.stub import StubBackend
from frontier.generation import (
    BatchGenerationResult,
    GenerationResult,
    SpeculativeGenerator,
    generate,
    random_pair,
)
from frontier.random_head import random_config, random_weights
from frontier.registry import Backend, register_backend, unregister_backend
from gen_support import (  # noqa: F401
    DEPRECATIONS_FAIL,
    TREES, V, _head, _one_thread, _reference, _weights_for, interpreted, on_backend_device, pair,
    plant_continuation, registered,
)

pytestmark = DEPRECATIONS_FAIL


def _ragged(seed, batch=None, lo=1, hi=14):
    """A random ragged batch of 1-D prompts (B = 2..4 unless given), lengths in [lo, hi], distinct."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    b = batch or rng.randint(2, 4)
    return [torch.randint(3, V, (rng.randint(lo, hi),), generator=g) for _ in range(b)]


class BatchOracle(Backend):
    """The stub's tree with its deepest path carrying the target's true greedy continuation of
    THAT sequence up to a random depth (sequences are told apart by their prompt)."""

    name = "test_batch_oracle"
    requires_weights = False
    dtypes = (torch.float32,)

    def __init__(self):
        self.references: list[list[int]] = []
        self.prompt_lens: list[int] = []
        self.rng = random.Random(0)
        self.calls: dict[int, list[tuple[int, int]]] = {}

    def _which(self, ids):
        hits = [b for b, ref in enumerate(self.references) if ids[: self.prompt_lens[b]] == ref[: self.prompt_lens[b]]]
        assert hits, "a drafted sequence matches no prompt of the batch"
        b = max(hits, key=lambda i: self.prompt_lens[i])
        assert ids == self.references[b][: len(ids)], f"sequence {b} left the target's greedy output"
        return b

    def generate(self, request):
        fr = StubBackend().generate(request)
        ids = request.input_ids[0].tolist()
        b = self._which(ids)
        self.calls.setdefault(b, []).append((len(ids) - 1, request.features.shape[1]))
        future = self.references[b][len(ids) :]
        return plant_continuation(fr, future, self.rng)


@pytest.fixture
def oracle():
    with registered(BatchOracle()) as b:
        yield b


# ----------------------------------------------------------------------------------------------
# Lossless greedy, per sequence
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow_case(backend_name="triton", tree=TREES[0])
@pytest.mark.parametrize("tree", TREES[:3], ids=lambda t: f"T{t[0]}-D{t[1]}-K{t[2]}")
def test_batch_greedy_equals_each_prompt_alone(pair, tree, backend_name):
    target, _, _ = pair
    cfg, w = _head(target, *tree, seed=11 + tree[0])
    target, w = on_backend_device(backend_name, target, _weights_for(backend_name, w))
    seeds = [0, 1, 2]
    if interpreted(backend_name):
        if tree == TREES[1]:
            pytest.skip("interpreted triton: the bushy tree and the depth-2 one are enough")
        seeds = [0]
    for seed in seeds:
        prompts = _ragged(1000 * seed + tree[0])
        rng = random.Random(seed)
        n = [rng.randint(1, 4) if interpreted(backend_name) else rng.randint(1, 16) for _ in prompts]
        out = generate(target, prompts, cfg=cfg, weights=w, backend=backend_name, max_new_tokens=n)
        assert isinstance(out, BatchGenerationResult) and len(out) == len(prompts)
        for b, p in enumerate(prompts):
            ref = _reference(target, p, n[b])
            assert torch.equal(out[b].sequences, ref), f"{backend_name} seed {seed} sequence {b} differs from target.generate"
            alone = generate(target, p[None], cfg=cfg, weights=w, backend=backend_name, max_new_tokens=n[b])
            assert torch.equal(alone.sequences, out[b].sequences)
            assert out[b].stats.new_tokens == ref.shape[1] - p.shape[0] == out[b].new_tokens.shape[1]
        s = out.stats
        assert s.target_forwards == 1 + s.verify_steps and s.draft_calls == s.verify_steps
        assert s.new_tokens_per_sequence == [r.stats.new_tokens for r in out]


@pytest.mark.parametrize(
    "tree, padded", [(t, True) for t in TREES] + [(TREES[0], False)], ids=lambda x: str(x)
)
def test_batch_long_acceptances(pair, oracle, tree, padded):
    """The oracle's paths get accepted: compaction of ragged accepted runs, per-sequence budgets."""
    target, _, _ = pair
    t, d, k = tree
    cfg = FrontierConfig(total_token=t, depth=d, top_k=k, vocab_size=V, hidden_size=64, feature_size=3 * 64)
    total_accepted = 0
    for seed in range(3):
        prompts = _ragged(50 + seed + 7 * t)
        rng = random.Random(seed)
        n = [rng.randint(1, 25) for _ in prompts]
        refs = [_reference(target, p, n_b + t + 2, eos_token_id=None) for p, n_b in zip(prompts, n)]
        oracle.references = [r[0].tolist() for r in refs]
        oracle.prompt_lens = [p.shape[0] for p in prompts]
        oracle.rng = random.Random(seed)
        oracle.calls.clear()
        out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=n, eos_token_id=None, padded=padded)
        for b, p in enumerate(prompts):
            assert torch.equal(out[b].sequences, refs[b][:, : p.shape[0] + n[b]]), f"seed {seed} sequence {b}"
            assert out[b].stats.stop_reason == "max_new_tokens"
            # each sequence's draft calls: cached rows + new rows == L, and it stops drafting once done
            fed = 0
            for big_l, new in oracle.calls.get(b, []):
                assert fed + new == big_l
                fed = big_l
            assert len(oracle.calls.get(b, [])) == out[b].stats.draft_calls == len(out[b].stats.accepted_lengths)
            total_accepted += sum(a - 1 for a in out[b].stats.accepted_lengths)
        s = out.stats
        assert s.active == sorted(s.active, reverse=True) and s.active[0] <= len(prompts)
        assert s.verify_steps == max(len(r.stats.accepted_lengths) for r in out)
    if t > 2:
        assert total_accepted > 0, "the oracle's paths were never accepted: batched acceptance is broken"


def test_batch_stops_at_different_steps(pair, oracle):
    """EOS / stop tokens end sequences at different steps (also inside accepted runs); max_length is shared."""
    target, _, _ = pair
    cfg = FrontierConfig(total_token=12, depth=6, top_k=2, vocab_size=V, hidden_size=64, feature_size=192)
    prompts = _ragged(77, batch=4, lo=2, hi=11)
    free = [_reference(target, p, 40, eos_token_id=None)[0].tolist() for p in prompts]
    oracle.references, oracle.prompt_lens = free, [p.shape[0] for p in prompts]
    for trial, offsets in enumerate([(1, 9, 17, 30), (5, 2, 12, 3)]):
        # one stop token taken from each of two sequences' continuations at different offsets
        eos = free[0][prompts[0].shape[0] + offsets[0]]
        stop = free[2][prompts[2].shape[0] + offsets[2]]
        oracle.rng = random.Random(trial)
        out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=40, eos_token_id=eos,
                       stop_token_ids=[stop])
        lengths = []
        for b, p in enumerate(prompts):
            ref = _reference(target, p, 40, eos_token_id=[eos, stop])
            assert torch.equal(out[b].sequences, ref), f"trial {trial} sequence {b}"
            last = ref[0, -1].item()
            want = "eos" if last == eos else "stop_token" if last == stop else "max_new_tokens"
            assert out[b].stats.stop_reason == want
            lengths.append(ref.shape[1] - p.shape[0])
        assert len(set(lengths)) > 1, "the sequences should stop at different lengths"
        assert out.stats.stop_reasons[0] == "eos"
    # a shared max_length gives each ragged prompt its own budget
    out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=30, max_length=14, eos_token_id=None)
    for b, p in enumerate(prompts):
        n = min(30, 14 - p.shape[0])
        assert torch.equal(out[b].sequences, torch.tensor([free[b][: p.shape[0] + n]]))
        assert out[b].stats.stop_reason == ("max_length" if n < 30 else "max_new_tokens")


def test_padded_tensor_with_attention_mask(pair):
    target, cfg, w = pair
    prompts = _ragged(5, batch=3, lo=2, hi=9)
    n = 8
    want = generate(target, prompts, cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=n)
    p_max = max(p.shape[0] for p in prompts)
    for side in ("left", "right"):
        ids = torch.randint(3, V, (len(prompts), p_max), generator=torch.Generator().manual_seed(1))  # junk padding
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):
            sl = slice(p_max - p.shape[0], p_max) if side == "left" else slice(0, p.shape[0])
            ids[b, sl], mask[b, sl] = p, 1
        out = generate(target, ids, attention_mask=mask, cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=n)
        assert all(torch.equal(a, b) for a, b in zip(out.sequences, want.sequences)), side
        for pad_side in ("left", "right"):
            padded = out.padded(pad_token_id=-7, padding_side=pad_side)
            assert padded.shape == (len(prompts), max(s.shape[1] for s in want.sequences))
            for b, seq in enumerate(want.sequences):
                row = padded[b][padded[b] != -7]
                assert torch.equal(row, seq[0])
                assert (padded[b, : seq.shape[1]] if pad_side == "right" else padded[b, -seq.shape[1] :]).ne(-7).all()
    # an unpadded [B, P] tensor is B prompts of length P; a list of one prompt is a batch of one
    same = torch.stack([prompts[0][:2], prompts[1][:2]])
    out = generate(target, same, cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=5)
    assert torch.equal(out[1].sequences, _reference(target, prompts[1][:2], 5))
    one = generate(target, [prompts[2]], cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=5)
    assert isinstance(one, BatchGenerationResult) and torch.equal(one[0].sequences, _reference(target, prompts[2], 5))
    # a [1, P] tensor with its mask stays a batch-1 call
    single = generate(target, ids[:1], attention_mask=mask[:1], cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=4)
    assert isinstance(single, GenerationResult) and torch.equal(single.sequences, _reference(target, prompts[0], 4))


def test_batch_stats_and_callback(pair, oracle):
    target, _, _ = pair
    cfg = FrontierConfig(total_token=16, depth=4, top_k=3, vocab_size=V, hidden_size=64, feature_size=192)
    prompts = _ragged(3, batch=3)
    n = [30, 4, 12]
    oracle.references = [_reference(target, p, 60, eos_token_id=None)[0].tolist() for p in prompts]
    oracle.prompt_lens = [p.shape[0] for p in prompts]
    seen = []
    out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=n, eos_token_id=None,
                   callback=lambda toks, st: seen.append([t.shape[1] for t in toks]))
    s = out.stats
    assert s.batch_size == 3 and s.new_tokens_per_sequence == n and s.new_tokens == sum(n)
    assert s.prompt_tokens == sum(p.shape[0] for p in prompts)
    assert s.target_forwards == 1 + s.verify_steps and s.draft_calls == s.verify_steps
    for r in out:
        rs = r.stats
        assert rs.target_forwards == 1 + rs.verify_steps and rs.draft_calls == rs.verify_steps
        assert sum(rs.accepted_lengths) + 1 >= rs.new_tokens
    pairs = [a for r in out for a in r.stats.accepted_lengths]
    assert s.mean_accepted_length == sum(pairs) / len(pairs) and s.mean_accepted_length > 1.0
    assert s.active[0] == 3 and s.active[-1] == 1  # the short ones left the batch
    parts = s.time_prefill + s.time_draft + s.time_verify + s.time_other
    assert abs(parts - s.time_total) < 1e-6 + 1e-3 * s.time_total and s.tokens_per_second > 0
    assert seen[-1] == n and all(a <= b for x, y in zip(seen, seen[1:]) for a, b in zip(x, y))
    d = s.to_dict()
    assert d["new_tokens"] == sum(n) and len(d["sequences"]) == 3
    assert "sequence 2" in s.table() and "tokens/s" in s.table()


def test_batch_sampling_reproducible(pair):
    """Sampling in a batch: prompt b with seed s draws what batch-1 generation with seed s + b draws."""
    target, cfg, w = pair
    prompts = _ragged(9, batch=3, lo=3, hi=10)
    for backend in ("stub", "torch_ref"):
        kw = dict(cfg=cfg, weights=_weights_for(backend, w), backend=backend, max_new_tokens=10, temperature=0.9,
                  top_k=20, eos_token_id=None)
        a = generate(target, prompts, seed=4, **kw)
        b = generate(target, prompts, seed=4, **kw)
        assert all(torch.equal(x, y) for x, y in zip(a.sequences, b.sequences))
        for i, p in enumerate(prompts):
            alone = generate(target, p[None], seed=4 + i, **kw)
            assert torch.equal(alone.sequences, a[i].sequences), f"{backend} sequence {i}"
        gens = [torch.Generator().manual_seed(4 + i) for i in range(len(prompts))]
        c = generate(target, prompts, generator=gens, **kw)
        assert all(torch.equal(x, y) for x, y in zip(a.sequences, c.sequences))
    other = generate(target, prompts, seed=5, **kw)
    assert any(not torch.equal(x, y) for x, y in zip(a.sequences, other.sequences))


def test_batch_bad_inputs(pair):
    target, cfg, w = pair
    gen = SpeculativeGenerator(target, cfg, w, backend="torch_ref")
    p = _ragged(1, batch=3, lo=3, hi=6)
    with pytest.raises(InputError, match=r"input_ids\[1\]: input_ids is empty"):
        gen.generate([p[0], p[1][:0], p[2]])
    with pytest.raises(InputError, match=r"input_ids\[1\] must be a torch.Tensor.*got list"):
        gen.generate([p[0], [5, 6, 7]])
    with pytest.raises(InputError, match=r"input_ids\[0\] must be one prompt.*\[2, 3\]"):
        gen.generate([torch.stack([p[0][:3], p[1][:3]]), p[2]])
    with pytest.raises(InputError, match=r"input_ids\[2\]: input_ids must lie in \[0, 256\)"):
        gen.generate([p[0], p[1], torch.tensor([1, 300])])
    with pytest.raises(InputError, match=r"input_ids\[0\]: input_ids must hold integer"):
        gen.generate([p[0].float(), p[1]])
    with pytest.raises(InputError, match=r"prompt 1: input_ids must lie in \[0, 256\)"):
        gen.generate(torch.tensor([[4, 5], [6, 256]]))
    with pytest.raises(InputError, match="empty list"):
        gen.generate([])
    with pytest.raises(InputError, match="a list of prompts needs none"):
        gen.generate(p, attention_mask=torch.ones(3, 3))
    ids = torch.stack([q[:3] for q in p])
    with pytest.raises(InputError, match=r"attention_mask must have input_ids' shape \[3, 3\]"):
        gen.generate(ids, attention_mask=torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(InputError, match="row 1 is all zeros"):
        gen.generate(ids, attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0], [0, 1, 1]]))
    with pytest.raises(InputError, match="row 2 has holes"):
        gen.generate(ids, attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1]]))
    with pytest.raises(InputError, match="only 0 .padding. and 1"):
        gen.generate(ids, attention_mask=torch.full((3, 3), 2))
    with pytest.raises(InputError, match="list of 3 ints"):
        gen.generate(p, max_new_tokens=[4, 5])
    with pytest.raises(InputError, match="max_new_tokens must be a positive int"):
        gen.generate(p, max_new_tokens=[4, 0, 2])
    longest = max(range(3), key=lambda b: p[b].shape[0])
    top = p[longest].shape[0]
    with pytest.raises(InputError, match=f"max_length={top} leaves no room to generate for prompt {longest}"):
        gen.generate(p, max_length=top)
    with pytest.raises(InputError, match="list of 3 torch.Generators"):
        gen.generate(p, temperature=1.0, generator=torch.Generator())
    g = torch.Generator()
    with pytest.raises(InputError, match="distinct"):
        gen.generate(p, temperature=1.0, generator=[g, g, torch.Generator()])
    with pytest.raises(InputError, match=r"generator\[1\] must be a torch.Generator"):
        gen.generate(p, temperature=1.0, generator=[g, 3, torch.Generator()])
    with pytest.raises(InputError, match="temperature"):
        gen.generate(p, temperature=-1.0)
    # failed calls leave no hooks behind, and the generator still works
    assert not any(layer._forward_pre_hooks for layer in target.model.layers)
    out = gen.generate(p, max_new_tokens=3)
    assert all(torch.equal(out[b].sequences, _reference(target, p[b], 3)) for b in range(3))


# ----------------------------------------------------------------------------------------------
# Plumbing: one forward and one draft call per step, features of the real rows, the draft cache
# ----------------------------------------------------------------------------------------------
class RecordingBackend(Backend):
    """Delegates to torch_ref and records every per-sequence request."""

    name = "test_batch_recording"
    requires_weights = True
    dtypes = (torch.float32,)

    def __init__(self):
        self.requests = []

    def generate(self, request):
        length = 0 if request.cache is None else request.cache.length
        self.requests.append((request.input_ids.clone(), request.features.clone(), length, request.cache))
        return frontier.get_backend("torch_ref").generate(request)


def test_one_forward_one_draft_call_per_step_and_features(pair, monkeypatch):
    target, _, _ = pair
    cfg, w = _head(target, 10, 3, 3)
    rec = RecordingBackend()
    register_backend(rec.name, rec, clobber=True)
    import frontier.generation.drafting as gmod

    draft_calls = []
    real = gmod.frontier_generate

    def counting(cfg_, feats, **kw):
        draft_calls.append(len(feats))
        return real(cfg_, feats, **kw)

    monkeypatch.setattr(gmod, "frontier_generate", counting)
    forwards = []
    hook = target.register_forward_hook(lambda m, a, kw, out: forwards.append(kw["input_ids"].shape), with_kwargs=True)
    prompts = _ragged(21, batch=4, lo=1, hi=12)
    n = [12, 3, 9, 1]
    try:
        out = generate(target, prompts, cfg=cfg, weights=w, backend=rec.name, max_new_tokens=n, eos_token_id=None)
    finally:
        hook.remove()
        unregister_backend(rec.name)
    s = out.stats
    assert len(forwards) == s.target_forwards == 1 + s.verify_steps
    assert forwards[0] == (4, max(p.shape[0] for p in prompts))  # one prefill over the padded batch
    assert [f[0] for f in forwards[1:]] == s.active  # then one verify forward per step, active trees only
    assert all(f[1] == cfg.total_token for f in forwards[1:])
    assert draft_calls == s.active  # one batched draft call per step
    assert s.active[0] == 3  # the max_new_tokens=1 sequence left after the prefill
    # Every sequence's draft caches are slots of the one batch allocation made by the first call.
    bases = {c.k.untyped_storage().data_ptr() for _, _, _, c in rec.requests}
    assert len(bases) == 1
    for b, p in enumerate(prompts):
        mine = [r for r in rec.requests if r[0][0, : p.shape[0]].tolist() == p.tolist()]
        assert len(mine) == out[b].stats.draft_calls
        if not mine:  # max_new_tokens=1: done after the prefill, never drafted
            assert n[b] == 1
            continue
        seq = out[b].sequences
        feats = torch.cat([f for _, f, _, _ in mine], dim=1)  # [1, L_last, F]
        last_ids, _, last_c, _ = mine[-1]
        big_l = last_ids.shape[1] - 1
        assert feats.shape[1] == big_l and last_c + mine[-1][1].shape[1] == big_l
        assert torch.equal(last_ids[0], seq[0, : big_l + 1])
        hs = target(seq[:, :big_l], output_hidden_states=True).hidden_states  # hs[i] enters layer i
        want = torch.cat([hs[2], hs[4], hs[5]], dim=-1)
        torch.testing.assert_close(feats, want, atol=5e-5, rtol=5e-5)


def test_sequences_that_stop_at_the_first_token(pair, oracle):
    target, _, _ = pair
    cfg = FrontierConfig(total_token=10, depth=4, top_k=2, vocab_size=V, hidden_size=64, feature_size=192)
    prompts = _ragged(31, batch=3, lo=2, hi=9)
    free = [_reference(target, p, 20, eos_token_id=None)[0].tolist() for p in prompts]
    oracle.references, oracle.prompt_lens = free, [p.shape[0] for p in prompts]
    eos = free[1][prompts[1].shape[0]]  # sequence 1's first new token
    out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=20, eos_token_id=eos)
    for b, p in enumerate(prompts):
        assert torch.equal(out[b].sequences, _reference(target, p, 20, eos_token_id=eos))
    assert out[1].stats.new_tokens == 1 and out[1].stats.draft_calls == 0 and out[1].stats.stop_reason == "eos"
    # every sequence done after the prefill: no draft, no verify
    out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=1, eos_token_id=None)
    assert out.stats.verify_steps == 0 and out.stats.target_forwards == 1
    assert [s[0, -1].item() for s in out.sequences] == [free[b][p.shape[0]] for b, p in enumerate(prompts)]


def test_batch_eagle2_head(pair):
    target, _, _ = pair
    h = target.config.hidden_size
    cfg = random_config(
        total_token=14, depth=3, top_k=3, vocab_size=V, hidden_size=h, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=96, architecture="eagle2",
    )
    w = random_weights(cfg, seed=5)
    w.lm_head = target.lm_head.weight.detach()
    w.embed_tokens = target.get_input_embeddings().weight.detach()
    prompts = _ragged(8, batch=3)
    out = generate(target, prompts, cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=11)
    for b, p in enumerate(prompts):
        assert torch.equal(out[b].sequences, _reference(target, p, 11))


def test_cli_batch(capsys):
    import json

    from frontier.cli import main

    rc = main(["generate", "--random-tiny", "--batch", "3", "--backend", "torch_ref", "--max-new-tokens", "7", "--compare",
               "--json", "--device", "cpu", "--total-token", "10", "--depth", "3", "--tree-top-k", "3"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["batch_size"] == 3
    assert out["compare"]["identical"] is True and out["compare"]["identical_per_sequence"] == [True] * 3
    assert [len(s["new_token_ids"]) for s in out["sequences"]] == [7, 7, 7]
    assert len({s["prompt_tokens"] for s in out["sequences"]}) == 3  # ragged prompts
    assert out["stats"]["target_forwards"] == 1 + out["stats"]["verify_steps"]
    rc = main(["generate", "--random-tiny", "--input-ids", "5,6,7;8,9", "--backend", "stub", "--max-new-tokens", "4",
               "--device", "cpu", "--compare"])
    text = capsys.readouterr().out
    assert rc == 0 and "batch: 2 prompts of 3, 2 tokens" in text and "identical=True" in text and "sequence 1" in text
    assert main(["generate", "--random-tiny", "--input-ids", "5,6", "--batch", "2", "--device", "cpu"]) == 2
    assert "--batch N" in capsys.readouterr().err


def test_batch_eager_attention(oracle):
    """The 4-D masks work the same with eager attention (long accepted runs through the oracle)."""
    target, _, _ = random_pair("tiny", seed=4, attn_implementation="eager")
    cfg = FrontierConfig(total_token=14, depth=5, top_k=3, vocab_size=V, hidden_size=64, feature_size=192)
    prompts = _ragged(12, batch=4)
    n = [18, 9, 25, 14]
    refs = [_reference(target, p, 40, eos_token_id=None) for p in prompts]
    oracle.references, oracle.prompt_lens = [r[0].tolist() for r in refs], [p.shape[0] for p in prompts]
    out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=n, eos_token_id=None)
    for b, p in enumerate(prompts):
        assert torch.equal(out[b].sequences, refs[b][:, : p.shape[0] + n[b]])
    assert out.stats.mean_accepted_length > 1.0


def test_greedy_accept_batch_equals_per_tree():
    """The batched acceptance is greedy_accept on each tree, with trees of different sizes padded."""
    from frontier.generation import greedy_accept, greedy_accept_batch

    g = torch.Generator().manual_seed(0)
    vocab = 3  # few tokens: many draft tokens agree with the target's argmax, deep acceptances
    deepest = 0
    for trial in range(12):
        rng = random.Random(trial)
        trees = []
        for _ in range(rng.randint(1, 5)):
            t, d, k = rng.choice(TREES + [(9, 3, 2), (30, 4, 3)])
            cfg = FrontierConfig(total_token=t, depth=d, top_k=k, vocab_size=V, hidden_size=64, feature_size=192)
            fr = frontier.frontier_generate(cfg, torch.randn(1, 3, 192, generator=g), backend="stub", seed=rng.randint(0, 99))
            trees.append(fr)
        width = max(min(fr.draft_tokens.shape[1], int(fr.tree_position_ids.max()) + 2) for fr in trees)
        t_max = max(fr.draft_tokens.shape[1] for fr in trees)
        b = len(trees)
        tokens = torch.zeros(b, t_max, dtype=torch.long)
        masks = torch.eye(t_max, dtype=torch.bool).repeat(b, 1, 1)
        depth = torch.zeros(b, t_max, dtype=torch.long)
        logits = torch.randn(b, t_max, vocab, generator=g)
        for i, fr in enumerate(trees):
            t = fr.draft_tokens.shape[1]
            tokens[i, :t] = torch.randint(0, vocab, (t,), generator=g)
            masks[i, :t, :t] = fr.tree_mask[0, 0] > 0
            depth[i, :t] = fr.tree_position_ids
        valid = torch.arange(t_max)[None] < torch.tensor([fr.draft_tokens.shape[1] for fr in trees])[:, None]
        best, path, nxt = greedy_accept_batch(logits, tokens, masks, depth, width, valid)
        for i, fr in enumerate(trees):
            t = fr.draft_tokens.shape[1]
            b1, p1, n1 = greedy_accept(logits[i, :t], tokens[i, :t], fr.tree_mask, depth[i, :t], width)
            assert int(best[i]) == int(b1) and int(nxt[i]) == int(n1), (trial, i)
            mine = torch.where(path[i] >= t, t_max, path[i])  # padding -> t_max
            n = p1.shape[0]  # a tree smaller than width has a shorter path
            assert torch.equal(mine[:n], torch.where(p1 >= t, t_max, p1)) and bool((mine[n:] == t_max).all())
            assert int(depth[i, b1]) + 1 == int((mine < t_max).sum())
            deepest = max(deepest, int(depth[i, b1]))
    assert deepest >= 3, "the random cases never accepted a deep path"


@pytest.mark.parametrize("seed", range(6))
def test_random_ragged_batches(pair, oracle, seed):
    """Random B, prompt lengths, tree shape, budgets, stop tokens and acceptance depths, against
    target.generate on each prompt alone."""
    target, _, _ = pair
    rng = random.Random(1234 + seed)
    t, d, k = rng.choice(TREES + [(12, 6, 2), (30, 4, 3)])
    cfg = FrontierConfig(total_token=t, depth=d, top_k=k, vocab_size=V, hidden_size=64, feature_size=192)
    prompts = _ragged(300 + seed, lo=1, hi=20)
    n = [rng.randint(1, 30) for _ in prompts]
    free = [_reference(target, p, 40, eos_token_id=None)[0].tolist() for p in prompts]
    oracle.references, oracle.prompt_lens = free, [p.shape[0] for p in prompts]
    oracle.rng = random.Random(seed)
    b0 = rng.randrange(len(prompts))
    eos = free[b0][prompts[b0].shape[0] + rng.randint(0, 25)]
    padded = rng.random() < 0.7
    out = generate(target, prompts, cfg=cfg, backend=oracle.name, max_new_tokens=n, eos_token_id=eos, padded=padded)
    for b, p in enumerate(prompts):
        ref = _reference(target, p, n[b], eos_token_id=eos)
        assert torch.equal(out[b].sequences, ref), f"seed {seed} sequence {b}"
        stops_early = eos in free[b][p.shape[0] : p.shape[0] + n[b]]  # within its budget
        assert out[b].stats.stop_reason == ("eos" if stops_early else "max_new_tokens")
    assert out.stats.target_forwards == 1 + out.stats.verify_steps
