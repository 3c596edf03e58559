"""Sampling verification keeps the target's distribution exactly: warping as transformers does it,
the tree rejection scheme's outcome distribution (chi-square), end-to-end token distributions,
and seeded reproducibility."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from frontier import FrontierConfig
from frontier.generation import SamplingParams, generate, random_pair, sampling_accept, warp_logits
from frontier.tree import pack_tree
from gen_support import DEPRECATIONS_FAIL, _one_thread  # noqa: F401

pytestmark = DEPRECATIONS_FAIL


def chi_square_pvalue(counts: dict, expected: dict, n: int) -> float:
    """Pearson chi-square p-value; categories expected < 5 times are pooled into one."""
    small_obs = small_exp = 0.0
    stat, cats = 0.0, 0
    for key, p in expected.items():
        e = p * n
        o = counts.get(key, 0)
        if e < 5:
            small_obs += o
            small_exp += e
            continue
        stat += (o - e) ** 2 / e
        cats += 1
    unexpected = sum(c for k, c in counts.items() if k not in expected)
    assert unexpected == 0, f"{unexpected} draws fell on outcomes of probability 0"
    if small_exp > 0:
        stat += (small_obs - small_exp) ** 2 / max(small_exp, 1e-9)
        cats += 1
    df = max(cats - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)))


# ----------------------------------------------------------------------------------------------
def test_warp_logits_matches_transformers():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 3
    for temp, top_k, top_p in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.6), (2.0, 1, 0.9), (1.0, 50, 0.999)]:
        want = logits.clone()
        want = TemperatureLogitsWarper(temp)(None, want)
        if top_k:
            want = TopKLogitsWarper(top_k)(None, want)
        if top_p < 1.0:
            want = TopPLogitsWarper(top_p)(None, want)
        got = warp_logits(logits, SamplingParams(temp, top_p, top_k))
        assert torch.equal(torch.isinf(got), torch.isinf(want)), (temp, top_k, top_p)
        torch.testing.assert_close(got.softmax(-1), want.softmax(-1))


# ----------------------------------------------------------------------------------------------
def _expected_outcomes(probs, tokens, parent):
    """Exact distribution of the emitted token sequence (accepted path tokens + next token)."""
    t, v = probs.shape
    children = {i: [c for c in range(1, t) if parent[c] == i] for i in range(t)}
    out = {}

    def walk(node, prefix, mass):
        kids = {int(tokens[c]): c for c in children[node]}
        for x in range(v):
            p = mass * float(probs[node, x])
            if p == 0:
                continue
            if x in kids:
                walk(kids[x], prefix + (x,), p)
            else:
                out[prefix + (x,)] = out.get(prefix + (x,), 0.0) + p

    walk(0, (), 1.0)
    return out


def _tree(parents):
    packed = pack_tree(torch.tensor(parents[1:]))
    return packed.tree_mask, packed.tree_position_ids


TREE_CASES = {
    # parents (root first, its entry unused), node tokens, how the probabilities are shaped
    "bushy": ([0, 0, 0, 0, 1, 1, 2, 4], [0, 0, 1, 2, 0, 3, 4, 1], "dirichlet"),
    "chain": ([0, 0, 1, 2, 3], [0, 2, 2, 1, 0], "peaked"),
    "zeros": ([0, 0, 0, 1, 1, 3], [0, 0, 1, 2, 3, 4], "topk2"),  # some children have p = 0
    "cover": ([0, 0, 0, 0, 0, 0], [0, 0, 1, 2, 3, 4], "dirichlet"),  # root's children cover V
}


@pytest.mark.parametrize("case", list(TREE_CASES))
def test_sampling_accept_keeps_the_target_distribution(case):
    parents, tokens, shape = TREE_CASES[case]
    v, t = 5, len(parents)
    g = torch.Generator().manual_seed(list(TREE_CASES).index(case))
    if shape == "peaked":
        probs = torch.softmax(torch.randn(t, v, generator=g) * 2.5, dim=-1)
    else:
        probs = -torch.log(torch.rand(t, v, generator=g))  # Dirichlet(1, ..., 1) rows, seeded
        probs /= probs.sum(-1, keepdim=True)
        if shape == "topk2":
            keep = probs.topk(2, dim=-1).indices
            probs = torch.zeros_like(probs).scatter(1, keep, probs.gather(1, keep))
            probs /= probs.sum(-1, keepdim=True)
    tokens_t = torch.tensor(tokens)
    mask, depth = _tree(parents)
    expected = _expected_outcomes(probs, tokens, parents)
    assert abs(sum(expected.values()) - 1.0) < 1e-5
    n = 6000
    gen = torch.Generator().manual_seed(1234)
    counts: dict = {}
    for _ in range(n):
        best, path, nxt = sampling_accept(probs, tokens_t, mask, depth, t, gen)
        acc = int(depth[best])
        key = tuple(int(tokens_t[i]) for i in path[1 : acc + 1]) + (int(nxt),)
        counts[key] = counts.get(key, 0) + 1
    p = chi_square_pvalue(counts, expected, n)
    assert p > 1e-3, f"{case}: emitted sequences do not follow the target distribution (p={p:.2e})"


# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_vocab_target():
    torch.manual_seed(11)
    cfg = LlamaConfig(
        hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=24, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # a less flat next-token distribution
    return model


def test_first_two_tokens_follow_the_target(small_vocab_target):
    """Through prefill sampling and one tree verification, token 1 and token 2 follow the target."""
    target = small_vocab_target
    v = target.config.vocab_size
    temp = 0.9
    cfg = FrontierConfig(total_token=16, depth=2, top_k=6, vocab_size=v, hidden_size=64, feature_size=192)
    prompt = torch.tensor([[5, 9, 3, 17]])
    with torch.no_grad():
        p1 = torch.softmax(target(prompt).logits[0, -1] / temp, -1)  # [V]
        seqs = torch.cat([prompt.expand(v, -1), torch.arange(v)[:, None]], dim=1)
        p2_given = torch.softmax(target(seqs).logits[:, -1] / temp, -1)  # [V, V]
    p2 = (p1[:, None] * p2_given).sum(0)
    n = 900
    c1: dict = {}
    c2: dict = {}
    multi = 0
    for s in range(n):
        out = generate(target, prompt, cfg=cfg, backend="stub", max_new_tokens=2, temperature=temp, seed=s, eos_token_id=None)
        a, b = out.new_tokens[0].tolist()
        c1[a] = c1.get(a, 0) + 1
        c2[b] = c2.get(b, 0) + 1
        multi += out.stats.accepted_lengths[0] > 1
    assert multi > 0, "no tree token was ever accepted: the test exercises nothing"
    exp1 = {i: float(p1[i]) for i in range(v) if p1[i] > 0}
    exp2 = {i: float(p2[i]) for i in range(v) if p2[i] > 0}
    assert chi_square_pvalue(c1, exp1, n) > 1e-3
    assert chi_square_pvalue(c2, exp2, n) > 1e-3


def test_seeded_sampling_is_reproducible():
    target, cfg, w = random_pair("tiny", total_token=12, depth=3, top_k=3, seed=2)
    prompt = torch.tensor([[4, 8, 15, 16, 23]])
    kw = dict(cfg=cfg, weights=w, backend="torch_ref", max_new_tokens=14, temperature=0.8, top_p=0.95, top_k=40, eos_token_id=None)
    a = generate(target, prompt, seed=7, **kw).sequences
    b = generate(target, prompt, seed=7, **kw).sequences
    c = generate(target, prompt, generator=torch.Generator().manual_seed(7), **kw).sequences
    assert torch.equal(a, b) and torch.equal(a, c)
    others = [generate(target, prompt, seed=s, **kw).sequences for s in (8, 9, 10)]
    assert any(not torch.equal(a, o) for o in others)
    assert a.shape == (1, 5 + 14) and int(a.max()) < target.config.vocab_size and int(a.min()) >= 0
