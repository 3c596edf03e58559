"""frontier_generate: input validation (with message checks) and every backend's output contract.

One file because the contract's checks are parametrized over every registered backend with
shared input builders; the validation tests are one per argument."""

from __future__ import annotations

import os
import re

import pytest
import torch

from frontier import (
    Backend,
    BackendNotFoundError,
    BackendUnavailableError,
    CacheError,
    ConfigError,
    FrontierConfig,
    FrontierError,
    InputError,
    WeightsError,
    frontier_generate,
    get_backend,
    register_backend,
)
import frontier
from frontier import registry
from frontier.backends.stub import StubBackend
from frontier.random_head import random_config, random_inputs, random_weights

from eagle_module import eagle_style_module

CFG = FrontierConfig(total_token=20, depth=3, top_k=4, vocab_size=100, hidden_size=8)  # F = 24


def feats(n=3, f=24, dtype=torch.float32, **kw):
    return torch.randn(1, n, f, dtype=dtype, **kw)


@pytest.fixture
def clean_registry():
    saved = dict(registry._entries)
    yield
    with registry._lock:
        registry._entries.clear()
        registry._entries.update(saved)


# ----------------------------------------------------------------------------------------------
# Bad inputs: each raises before dispatch, with a message naming the argument and the expectation
# ----------------------------------------------------------------------------------------------
BAD_INPUTS = [
    # (description, call kwargs, error class, regex on the message)
    ("cfg not a config", dict(cfg={"total_token": 20}), InputError, r"cfg must be a FrontierConfig, got dict"),
    ("features not a tensor", dict(features_concat=[[0.0] * 24]), InputError,
     r"sequence 0: features_concat must be a torch\.Tensor \[1, n, F\], got list"),  # a list is a batch
    ("features 2-D", dict(features_concat=torch.randn(3, 24)), InputError,
     r"features_concat must be 3-D \[1, n, F\], got shape \[3, 24\]"),
    ("features 4-D", dict(features_concat=torch.randn(1, 1, 3, 24)), InputError,
     r"features_concat must be 3-D \[1, n, F\], got shape \[1, 1, 3, 24\]"),
    ("batch of 2", dict(features_concat=torch.randn(2, 3, 24)), InputError,
     r"features_concat must have batch size 1 \(\[1, n, F\]\), got shape \[2, 3, 24\]"),
    ("no new rows", dict(features_concat=torch.randn(1, 0, 24)), InputError,
     r"features_concat must hold at least one new row \(n >= 1\), got shape \[1, 0, 24\]"),
    ("wrong feature width", dict(features_concat=torch.randn(1, 3, 8)), InputError,
     r"features_concat last dimension must be feature_size F=24, got shape \[1, 3, 8\]"),
    ("integer features", dict(features_concat=torch.zeros(1, 3, 24, dtype=torch.int64)), InputError,
     r"features_concat must be a floating tensor, got dtype torch\.int64"),
    ("features on an unsupported device", dict(features_concat=torch.zeros(1, 3, 24, device="meta")), InputError,
     r"backend 'stub' runs on cpu, cuda; features_concat is on meta"),
    ("input_ids not a tensor", dict(input_ids=[[1, 2, 3]]), InputError, r"input_ids must be a torch\.Tensor \[1, L\+1\], got list"),
    ("input_ids 1-D", dict(input_ids=torch.tensor([1, 2, 3])), InputError, r"input_ids must be \[1, L\+1\], got shape \[3\]"),
    ("input_ids batch 2", dict(input_ids=torch.zeros(2, 4, dtype=torch.long)), InputError, r"input_ids must be \[1, L\+1\], got shape \[2, 4\]"),
    ("input_ids float", dict(input_ids=torch.zeros(1, 4)), InputError, r"input_ids must be an integer tensor \(int64\), got dtype torch\.float32"),
    ("input_ids on another device", dict(input_ids=torch.zeros(1, 4, dtype=torch.long, device="meta")), InputError,
     r"input_ids is on meta but features_concat on cpu"),
    ("input_ids without a context token", dict(input_ids=torch.zeros(1, 1, dtype=torch.long)), InputError,
     r"input_ids must hold at least two tokens \(context \+ root\), got shape \[1, 1\]"),
    ("unknown backend", dict(backend="tirton"), BackendNotFoundError,
     r"unknown backend 'tirton'; registered backends: .*stub, .*torch_ref, triton.*"),
    ("backend not a name", dict(backend=StubBackend()), InputError, r"backend must be a backend name \(str\), got StubBackend"),
    ("weights for the stub", dict(weights="w"), InputError, r"backend 'stub' takes no weights; drop weights=/ea_layer="),
    ("lm_head without ea_layer", dict(lm_head=torch.zeros(3, 3)), InputError,
     r"lm_head= goes with ea_layer= \(DraftWeights already hold their lm_head\)"),
    ("bad cache_max_length", dict(cache_max_length=0), InputError, r"cache_max_length must be a positive int, got 0"),
    ("seed not an int", dict(seed="7"), InputError, r"seed must be an int, got str '7'"),
]


@pytest.mark.parametrize("what,kwargs,error,pattern", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_clear_errors(what, kwargs, error, pattern):
    call = dict(cfg=CFG, features_concat=feats(), backend="stub")
    call.update(kwargs)
    with pytest.raises(error) as info:
        frontier_generate(**call)
    assert re.fullmatch(pattern, str(info.value)), f"{pattern!r} is not the whole message {str(info.value)!r}"
    assert isinstance(info.value, FrontierError)


def test_config_violations_surface_as_config_errors():
    with pytest.raises(ConfigError, match=r"total_token=200.*top_k=4.*depth=3.*<= 53"):
        frontier_generate(CFG.replace(total_token=200), feats(), backend="stub")


def test_int32_input_ids_are_accepted():
    ids = torch.tensor([[3, 1, 4, 1]], dtype=torch.int32)
    fr = frontier_generate(CFG, feats(), backend="stub", input_ids=ids)
    assert fr.draft_tokens.dtype == torch.int64 and int(fr.draft_tokens[0, 0]) == 1


# ----------------------------------------------------------------------------------------------
# What a backend declares is enforced before dispatch; what it returns is checked
# ----------------------------------------------------------------------------------------------
class Declared(Backend):
    """Runs the stub; declarations are set per test. Counts calls to prove nothing was dispatched."""

    requires_weights = False
    devices = ("cpu",)
    dtypes = (torch.float64,)

    def __init__(self, available=(True, ""), result=None, requires_weights=False):
        self._available = available
        self._result = result
        self.requires_weights = requires_weights
        self.calls = 0

    def availability(self):
        return self._available

    def generate(self, request):
        self.calls += 1
        if self._result is not None:
            return self._result
        return StubBackend().generate(request)


def test_declared_dtypes_and_devices_are_enforced(clean_registry):
    b = Declared()
    register_backend("f64only", b)
    with pytest.raises(InputError, match=r"backend 'f64only' supports dtypes float64; features_concat is float32"):
        frontier_generate(CFG, feats(), backend="f64only")
    with pytest.raises(InputError, match=r"backend 'f64only' runs on cpu; features_concat is on meta"):
        frontier_generate(CFG, feats(dtype=torch.float64, device="meta"), backend="f64only")
    assert b.calls == 0
    frontier_generate(CFG, feats(dtype=torch.float64), backend="f64only").check_invariants(total_token=20)
    assert b.calls == 1


def test_unavailable_backend_raises_or_falls_back(clean_registry):
    b = Declared(available=(False, "needs a Hopper GPU"))
    register_backend("hopper_only", b)
    with pytest.raises(BackendUnavailableError, match=r"backend 'hopper_only' cannot run here: needs a Hopper GPU"):
        frontier_generate(CFG, feats(dtype=torch.float64), backend="hopper_only")
    assert b.calls == 0
    ok, _ = get_backend("torch_ref").availability()
    if not ok:
        pytest.skip("torch_ref cannot run here, so there is nothing to fall back to")
    cfg = random_config(total_token=10, depth=2, top_k=3)
    w = random_weights(cfg, dtype=torch.float64)
    ids, f = random_inputs(cfg, context=5, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=r"backend 'hopper_only' is unavailable \(needs a Hopper GPU\); falling back to 'torch_ref'"):
        fr = frontier_generate(cfg, f, backend="hopper_only", input_ids=ids, weights=w, fallback=True)
    fr.check_invariants(total_token=10, depth=2, top_k=3)
    assert b.calls == 0


def test_backend_returning_something_else_is_reported(clean_registry):
    register_backend("liar", Declared(result={"draft_tokens": None}))
    with pytest.raises(FrontierError, match=r"backend 'liar' returned dict, expected a Frontier"):
        frontier_generate(CFG, feats(dtype=torch.float64), backend="liar")


# Weight-carrying backends: validation is generic, so a declared test backend exercises it
# without depending on any particular implementation.
LAYER_CFG = random_config(total_token=12, depth=3, top_k=3, vocab_size=64, target_vocab_size=80, hidden_size=32)


@pytest.fixture
def weighted(clean_registry):
    b = Declared(requires_weights=True)
    b.dtypes = (torch.float32,)
    register_backend("weighted", b)
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)
    return b, w, ids, f


def test_weighted_backend_accepts_consistent_inputs(weighted):
    b, w, ids, f = weighted
    frontier_generate(LAYER_CFG, f, backend="weighted", input_ids=ids, weights=w).check_invariants(total_token=12)
    assert b.calls == 1


@pytest.mark.parametrize(
    "what,change,error,pattern",
    [
        ("no layer dims", dict(cfg=FrontierConfig(total_token=12, depth=3, top_k=3, vocab_size=64, hidden_size=32,
                                                  target_vocab_size=80)),
         ConfigError, r"backend 'weighted' runs the draft layer and needs num_attention_heads, intermediate_size in "
         r"FrontierConfig \(only the tree fields were given\); use FrontierConfig\.from_ea_layer\(\.\.\.\) or set them"),
        ("no weights", dict(weights=None), InputError, r"backend 'weighted' needs the draft head: pass weights= or ea_layer="),
        ("weights of another type", dict(weights={"fc.weight": 1}), InputError,
         r"weights must be a frontier\.DraftWeights, got dict \(a loaded DraftHead passes too\)"),
        ("weights for another config", dict(cfg=LAYER_CFG.replace(intermediate_size=40)), WeightsError,
         r"weights: tensor 'midlayer\.mlp\.gate_proj\.weight' has shape \[48, 32\], expected \[40, 32\]"),
        ("weights in another dtype", dict(features_concat="f64", weights="f64"), InputError,
         r"backend 'weighted' supports dtypes float32; features_concat is float64"),
        ("no input_ids", dict(input_ids=None), InputError,
         r"backend 'weighted' needs input_ids \[1, L\+1\] \(the sequence so far, root last\)"),
        ("context mismatch", dict(input_ids="longer"), CacheError,
         r"cache length \+ new rows must equal the context length: the cache holds 0 rows, features_concat brings "
         r"n=6, but input_ids has L=8 tokens before the root \(the contract's 'One draft call': c \+ n == L\)"),
        ("token out of range", dict(input_ids="out_of_range"), InputError,
         r"input_ids must lie in \[0, target_vocab_size=80\), got range \[0, 80\]"),
        ("negative token", dict(input_ids="negative"), InputError,
         r"input_ids must lie in \[0, target_vocab_size=80\), got range \[-1, \d+\]"),
        ("both weights and ea_layer", dict(ea_layer=object()), InputError, r"pass either weights= or ea_layer=, not both"),
        ("cache of another type", dict(cache="not a cache"), InputError,
         r"cache must be a frontier\.DraftCache \(Frontier\.cache\), got str"),
    ],
)
def test_weighted_backend_bad_inputs(weighted, what, change, error, pattern):
    b, w, ids, f = weighted
    call = dict(cfg=LAYER_CFG, features_concat=f, backend="weighted", input_ids=ids, weights=w)
    if change.get("features_concat") == "f64":
        change = dict(features_concat=f.double(), weights=w.to(dtype=torch.float64))
    elif change.get("input_ids") == "longer":
        change = dict(input_ids=torch.cat([ids, ids[:, :2]], dim=1))
    elif change.get("input_ids") == "out_of_range":
        bad = ids.clone()
        bad[0, 2] = 80
        bad[0, 0] = 0
        change = dict(input_ids=bad)
    elif change.get("input_ids") == "negative":
        bad = ids.clone()
        bad[0, 1] = -1
        change = dict(input_ids=bad)
    call.update(change)
    with pytest.raises(error) as info:
        frontier_generate(**call)
    assert re.fullmatch(pattern, str(info.value)), f"{pattern!r} is not the whole message {str(info.value)!r}"
    assert b.calls == 0


# ----------------------------------------------------------------------------------------------
# Every runnable backend honours the output contract
# ----------------------------------------------------------------------------------------------
CONTRACT_CONFIGS = [
    # total_token, depth, top_k, vocab_size, target_vocab_size, context
    (2, 1, 1, 16, 16, 1),  # smallest tree, top_k=1, depth=1
    (3, 1, 1, 16, 40, 4),  # top_k=1 at its largest T
    (2, 4, 5, 30, 30, 3),  # total_token=2 with a wide frontier
    (13, 1, 3, 33, 50, 7),  # depth=1 at its largest T (1 + 3 + 9)
    (17, 3, 4, 61, 61, 5),  # odd sizes
    (26, 5, 3, 47, 97, 9),
    (1 + 3 + 2 * 9, 2, 3, 64, 64, 2),  # largest T for K=3, D=2
]


@pytest.mark.slow_case(backend_name="triton", depth=[3, 4, 5])  # interpreted: the trees of depth 1 and 2 by default
@pytest.mark.parametrize("t,depth,k,v,vt,context", CONTRACT_CONFIGS,
                         ids=[f"T{c[0]}-D{c[1]}-K{c[2]}-V{c[3]}" for c in CONTRACT_CONFIGS])
def test_backend_output_contract(backend_name, t, depth, k, v, vt, context):
    backend = get_backend(backend_name)
    device = "cuda" if "cpu" not in backend.devices else "cpu"
    cfg = random_config(total_token=t, depth=depth, top_k=k, vocab_size=v, target_vocab_size=vt, hidden_size=16,
                        num_attention_heads=2, num_key_value_heads=1, intermediate_size=24)
    kwargs = {}
    if backend.requires_weights:
        kwargs["weights"] = random_weights(cfg, seed=t + k, device=device, lm_head_scale=5.0)
    ids, f = random_inputs(cfg, context=context, seed=depth, device=device)
    modes = [(False, False), (False, True), (True, False), (True, True)]
    if device == "cpu" and backend_name == "triton":  # the Triton interpreter is slow: two modes cover both switches
        modes = [(False, False), (True, True)]
    for sampling, padded in modes:
        fr = frontier_generate(cfg, f, backend=backend_name, input_ids=ids, sampling=sampling, padded=padded,
                               **kwargs)
        fr.check_invariants(total_token=t, depth=depth, top_k=k, sampling=sampling)
        assert fr.padded == padded
        assert int(fr.draft_tokens[0, 0]) == int(ids[0, -1])  # the root is the last input token
        assert bool((fr.draft_tokens >= 0).all()) and bool((fr.draft_tokens < vt).all())
        for x in (fr.draft_tokens, fr.retrieve_indices, fr.tree_mask, fr.tree_position_ids):
            assert x.device == f.device
        if padded:
            assert fr.retrieve_indices.shape == (t, depth + 2)


def test_backend_continues_from_its_cache(backend_name):
    """A second call passes the first call's cache and only the new rows' features."""
    backend = get_backend(backend_name)
    device = "cuda" if "cpu" not in backend.devices else "cpu"
    cfg = random_config(total_token=15, depth=3, top_k=3, vocab_size=50, target_vocab_size=70, hidden_size=16,
                        num_attention_heads=2, num_key_value_heads=2, intermediate_size=24)
    # float64 where the backend has it, so the one-shot/two-step comparison below is not at the
    # mercy of float32 rounding between the two attention orders.
    dtype = torch.float64 if torch.float64 in backend.dtypes else torch.float32
    kwargs = {"weights": random_weights(cfg, seed=3, device=device, dtype=dtype)} if backend.requires_weights else {}
    ids, f = random_inputs(cfg, context=8, seed=4, device=device, dtype=dtype)
    first = frontier_generate(cfg, f[:, :5], backend=backend_name, input_ids=ids[:, :6], **kwargs)
    first.check_invariants(total_token=15, depth=3, top_k=3)
    second = frontier_generate(cfg, f[:, 5:], backend=backend_name, input_ids=ids, cache=first.cache, **kwargs)
    second.check_invariants(total_token=15, depth=3, top_k=3)
    assert int(second.draft_tokens[0, 0]) == int(ids[0, -1])
    if backend.requires_weights:
        # Same tree as drafting the whole context in one go.
        whole = frontier_generate(cfg, f, backend=backend_name, input_ids=ids, **kwargs)
        assert whole.same_tree(second)


# ----------------------------------------------------------------------------------------------
# A list of features drafts a ragged batch: every argument reaches it
# ----------------------------------------------------------------------------------------------
def test_a_list_of_features_drafts_a_batch_with_every_argument_passed_on():
    g = torch.Generator().manual_seed(2)
    fs = [torch.randn(1, n, 24, generator=g) for n in (2, 4)]
    ids = [torch.randint(0, 100, (1, n + 1), generator=g) for n in (2, 4)]
    frs = frontier_generate(CFG, fs, "stub", input_ids=ids, sampling=True, padded=True, seed=5)
    for b in range(2):
        alone = frontier_generate(CFG, fs[b], "stub", input_ids=ids[b], sampling=True, padded=True, seed=5)
        assert frs[b].same_tree(alone) and frs[b].padded
        assert torch.equal(frs[b].retrieve_indices, alone.retrieve_indices)
    with pytest.raises(InputError, match=r"^sequence 0: unknown option 'bogus' for backend 'stub'"):
        frontier_generate(CFG, fs, "stub", bogus=1)
    with pytest.raises(InputError, match=r"^fallback must be True or False, got fallback='yes'$"):
        frontier_generate(CFG, fs, "stub", fallback="yes")
    with pytest.raises(InputError, match=r"^lm_head= goes with ea_layer= "):
        frontier_generate(CFG, fs, "stub", lm_head=torch.zeros(2, 2))
    with pytest.raises(InputError, match=r"^pass either weights= or ea_layer=, not both$"):
        frontier_generate(CFG, fs, "stub", weights="w", ea_layer=object())
    with pytest.raises(InputError, match=(
        r"^with a batch of features, cache must be a BatchDraftCache or a list of DraftCache/None$"
    )):
        frontier_generate(CFG, fs, "stub", cache=object())


def test_a_batch_with_weights_and_caches():
    cfg = random_config(total_token=6, depth=2, top_k=2, vocab_size=20, hidden_size=8, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=8)
    w = random_weights(cfg, seed=2)
    g = torch.Generator().manual_seed(3)
    fs = [torch.randn(1, n, cfg.feature_size, generator=g) for n in (3, 2)]
    ids = [torch.randint(0, 20, (1, n + 1), generator=g) for n in (3, 2)]
    frs = frontier_generate(cfg, fs, "torch_ref", input_ids=ids, weights=w, cache_max_length=7)
    assert [fr.cache.max_length for fr in frs] == [7, 7] and [fr.cache.length for fr in frs] == [3, 2]
    bc = frontier.BatchDraftCache(cfg, 2, max_length=9, dtype=torch.float32, device="cpu")
    frs = frontier_generate(cfg, fs, "torch_ref", input_ids=ids, weights=w, cache=bc)
    assert frs[0].cache is bc[0] and frs[1].cache is bc[1] and bc.lengths == [3, 2]
    single = frontier_generate(cfg, fs[0], "torch_ref", input_ids=ids[0], weights=w, cache_max_length=3)
    assert single.cache.max_length == 3 and single.cache.length == 3


def test_defaults_are_the_stub_seed_0_greedy_unpadded():
    f = feats()
    fr = frontier_generate(CFG, f)
    assert fr.same_tree(frontier_generate(CFG, f, "stub", seed=0, sampling=False, padded=False))
    assert fr.padded is False and fr.retrieve_indices.shape[0] == int(fr.leaf_count)
    assert not fr.same_tree(frontier_generate(CFG, f, seed=1))
    assert not fr.same_tree(frontier_generate(CFG, f, sampling=True))
    ids = torch.tensor([[5, 6, 7, 8]])
    assert int(frontier_generate(CFG, f, input_ids=ids).draft_tokens[0, 0]) == 8


# ----------------------------------------------------------------------------------------------
# What a backend returns is checked before the caller sees it (types, shapes, devices, the cache)
# ----------------------------------------------------------------------------------------------
class Tamper(Backend):
    """The stub's tree, changed by ``change(frontier, request)`` before it is returned."""

    devices = ("cpu",)
    dtypes = (torch.float32,)

    def __init__(self, change, requires_weights=False):
        self.change = change
        self.requires_weights = requires_weights

    def generate(self, request):
        fr = StubBackend().generate(request)
        return self.change(fr, request) or fr


def _set(**fields):
    def change(fr, request):
        for name, value in fields.items():
            setattr(fr, name, value(fr) if callable(value) else value)
    return change


MALFORMED = [
    ("tokens not a tensor", _set(draft_tokens=lambda fr: fr.draft_tokens.tolist()), False,
     "draft_tokens is list, not a tensor"),
    ("mask not a tensor", _set(tree_mask=None), False, "tree_mask is NoneType, not a tensor"),
    ("retrieve on meta", _set(retrieve_indices=lambda fr: fr.retrieve_indices.to("meta")), False,
     "retrieve_indices is on meta, the inputs on cpu"),
    ("positions on meta", _set(tree_position_ids=lambda fr: fr.tree_position_ids.to("meta")), False,
     "tree_position_ids is on meta, the inputs on cpu"),
    ("tokens short", _set(draft_tokens=lambda fr: fr.draft_tokens[:, :-1]), False,
     r"draft_tokens must be \[1, 20\] int64, got \[1, 19\] torch.int64"),
    ("tokens 1-D", _set(draft_tokens=lambda fr: fr.draft_tokens[0]), False,
     r"draft_tokens must be \[1, 20\] int64, got \[20\] torch.int64"),
    ("tokens int32", _set(draft_tokens=lambda fr: fr.draft_tokens.int()), False,
     r"draft_tokens must be \[1, 20\] int64, got \[1, 20\] torch.int32"),
    ("mask int", _set(tree_mask=lambda fr: fr.tree_mask.long()), False,
     r"tree_mask must be a float \[1, 1, 20, 20\], got \[1, 1, 20, 20\] torch.int64"),
    ("mask 2-D", _set(tree_mask=lambda fr: fr.tree_mask[0, 0]), False,
     r"tree_mask must be a float \[1, 1, 20, 20\], got \[20, 20\] torch.float32"),
    ("positions short", _set(tree_position_ids=lambda fr: fr.tree_position_ids[1:]), False,
     r"tree_position_ids must be \[20\] int64, got \[19\] torch.int64"),
    ("positions int32", _set(tree_position_ids=lambda fr: fr.tree_position_ids.int()), False,
     r"tree_position_ids must be \[20\] int64, got \[20\] torch.int32"),
    ("retrieve 1-D", _set(retrieve_indices=lambda fr: fr.retrieve_indices[0]), False,
     r"retrieve_indices must be 2-D int64, got \[\d+\] torch.int64"),
    ("retrieve int32", _set(retrieve_indices=lambda fr: fr.retrieve_indices.int()), False,
     r"retrieve_indices must be 2-D int64, got \[\d+, \d+\] torch.int32"),
    ("padded too narrow", _set(retrieve_indices=lambda fr: fr.retrieve_indices[:, :-1]), True,
     r"padded retrieve_indices must be \[20, 5\], got \[20, 4\]"),
    ("padded too short", _set(retrieve_indices=lambda fr: fr.retrieve_indices[:-1]), True,
     r"padded retrieve_indices must be \[20, 5\], got \[19, 5\]"),
    ("too many rows", _set(retrieve_indices=lambda fr: torch.zeros(21, 2, dtype=torch.int64)), False,
     r"retrieve_indices must be \[leaves <= 20, columns <= 5\], got \[21, 2\]"),
    ("no rows", _set(retrieve_indices=lambda fr: torch.zeros(0, 2, dtype=torch.int64)), False,
     r"retrieve_indices must be \[leaves <= 20, columns <= 5\], got \[0, 2\]"),
    ("too many columns", _set(retrieve_indices=lambda fr: torch.zeros(3, 6, dtype=torch.int64)), False,
     r"retrieve_indices must be \[leaves <= 20, columns <= 5\], got \[3, 6\]"),
    ("no columns", _set(retrieve_indices=lambda fr: torch.zeros(3, 0, dtype=torch.int64)), False,
     r"retrieve_indices must be \[leaves <= 20, columns <= 5\], got \[3, 0\]"),
]


@pytest.mark.parametrize("what,change,padded,problem", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_results_are_refused_with_the_backend_named(clean_registry, what, change, padded, problem):
    register_backend("tamper", Tamper(change))
    with pytest.raises(frontier.InvariantError, match=rf"^backend 'tamper' returned a malformed Frontier: {problem}$"):
        frontier_generate(CFG, feats(), backend="tamper", padded=padded)


def test_boundary_shapes_of_retrieve_indices_pass(clean_registry):
    for rows, cols in ((1, 1), (20, 5)):
        register_backend(f"edge{rows}", Tamper(_set(retrieve_indices=torch.zeros(rows, cols, dtype=torch.int64))))
        fr = frontier_generate(CFG, feats(), backend=f"edge{rows}")
        assert fr.retrieve_indices.shape == (rows, cols)


def test_the_callers_cache_must_come_back_advanced(clean_registry):
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)

    def call(change):
        register_backend("tamper_w", Tamper(change, requires_weights=True))
        cache = frontier.DraftCache.for_config(LAYER_CFG, max_length=16, dtype=torch.float32, device="cpu")
        try:
            return frontier_generate(LAYER_CFG, f, backend="tamper_w", input_ids=ids, weights=w, cache=cache), cache
        finally:
            registry._entries.pop("tamper_w")

    def advance(fr, request):
        request.cache.length = request.cache.length + request.num_new
        fr.cache = request.cache

    fr, cache = call(advance)
    assert fr.cache is cache and cache.length == 6
    for change, problem in (
        (lambda fr, r: None, "cache is NoneType, expected the DraftCache the call appended to"),
        (_set(cache=lambda fr: frontier.DraftCache(1, 1, 2, 4, dtype=torch.float32, device="cpu")),
         "cache is not the DraftCache passed in"),
        (lambda fr, r: setattr(fr, "cache", r.cache), r"the cache holds 0 rows after the call, expected 0 \+ n=6"),
        (lambda fr, r: (setattr(fr, "cache", r.cache), setattr(r.cache, "length", 7)) and None,
         r"the cache holds 7 rows after the call, expected 0 \+ n=6"),
    ):
        with pytest.raises(frontier.InvariantError, match=rf"^backend 'tamper_w' returned a malformed Frontier: {problem}$"):
            call(change)


def test_a_batch_backend_must_return_one_frontier_per_sequence(clean_registry):
    class Short(Backend):
        def generate(self, request):  # pragma: no cover - the batch method is used
            raise AssertionError

        def generate_batch(self, requests):
            return [StubBackend().generate(requests[0])]

    register_backend("short", Short())
    with pytest.raises(frontier.InvariantError, match=r"^backend 'short' must return one Frontier per sequence \(2\)$"):
        frontier_generate(CFG, [feats(), feats()], backend="short")


def test_a_fresh_cache_takes_the_weights_dtype_and_the_requested_length():
    cfg = random_config(total_token=6, depth=2, top_k=2, vocab_size=20, hidden_size=8, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=8)
    w = random_weights(cfg, seed=2, dtype=torch.float64)
    ids, f = random_inputs(cfg, context=4, seed=2, dtype=torch.float64)
    fr = frontier_generate(cfg, f, "torch_ref", input_ids=ids, weights=w, cache_max_length=6)
    assert fr.cache.dtype == torch.float64 and fr.cache.device == torch.device("cpu")
    assert fr.cache.max_length == 6 and fr.cache.length == 4
    assert frontier_generate(cfg, f, "torch_ref", input_ids=ids, weights=w).cache.max_length == 4096


# ----------------------------------------------------------------------------------------------
# Call options and flags: exact messages
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,message", [
    (dict(check_finite=1), "option check_finite must be True or False, got check_finite=1"),
    (dict(check_token_range="no"), "option check_token_range must be True or False, got check_token_range='no'"),
    (dict(trace=0), "option trace must be True or False, got trace=0"),
    (dict(chek_finite=True), "unknown option 'chek_finite' for backend 'stub' (it takes: check_finite, "
                             "check_token_range); did you mean 'check_finite'?"),
    (dict(inpt_ids=1), "unknown option 'inpt_ids' for backend 'stub' (it takes: check_finite, check_token_range); "
                       "did you mean 'input_ids'?"),
    (dict(zzz=1), "unknown option 'zzz' for backend 'stub' (it takes: check_finite, check_token_range)"),
    (dict(sampling="yes"), "sampling must be True or False, got sampling='yes'"),
    (dict(padded=1), "padded must be True or False, got padded=1"),
    (dict(cache_max_length=True), "cache_max_length must be a positive int, got True"),
    (dict(cache_max_length=2.5), "cache_max_length must be a positive int, got 2.5"),
    (dict(fallback=1), "fallback must be True or False, got fallback=1"),
])
def test_option_and_flag_messages(kwargs, message):
    with pytest.raises(InputError) as info:
        frontier_generate(CFG, feats(), **kwargs)
    assert str(info.value) == message


def test_options_accepted_per_backend(clean_registry):
    fr = frontier_generate(CFG, feats(), check_finite=False, check_token_range=True)
    assert bool(fr.invalid) is False
    with pytest.raises(InputError, match=(
        r"^unknown option 'trace' for backend 'stub' \(it takes: check_finite, check_token_range\); did you mean 'cache'\?$"
    )):
        frontier_generate(CFG, feats(), trace=True)

    class TakesAnything(Backend):
        options = None

        def generate(self, request):
            self.seen = dict(request.options)
            return StubBackend().generate(request)

    anything = TakesAnything()
    register_backend("anything", anything)
    frontier_generate(CFG, feats(), backend="anything", whatever=3, check_finite=True)
    assert anything.seen == {"whatever": 3}  # the call's own checks are taken out


@pytest.mark.parametrize("answer,why", [
    (RuntimeError("boom"), "its availability() raised RuntimeError: boom"),
    ("yes", "its availability() raised ValueError: too many values to unpack (expected 2)"),
])
def test_an_availability_that_raises_or_answers_nonsense_means_unavailable(clean_registry, answer, why):
    class Odd(Backend):
        def availability(self):
            if isinstance(answer, Exception):
                raise answer
            return answer

        def generate(self, request):  # pragma: no cover - never dispatched
            raise AssertionError

    register_backend("odd", Odd())
    with pytest.raises(BackendUnavailableError) as info:
        frontier_generate(CFG, feats(), backend="odd")
    assert str(info.value) == f"backend 'odd' cannot run here: {why}"


def test_fallback_warns_and_names_both_when_neither_runs(clean_registry, monkeypatch):
    register_backend("down", Declared(available=(False, "no GPU")))
    ref = get_backend("torch_ref")
    monkeypatch.setattr(ref, "availability", lambda: (False, "no torch_ref"))
    with pytest.raises(BackendUnavailableError) as info:
        frontier_generate(CFG, feats(dtype=torch.float64), backend="down", fallback=True)
    assert str(info.value) == "backend 'down' cannot run here (no GPU) and the fallback 'torch_ref' cannot either (no torch_ref)"
    monkeypatch.setattr(ref, "availability", lambda: (False, "no torch_ref"))
    with pytest.raises(BackendUnavailableError) as info:  # torch_ref itself never falls back to itself
        frontier_generate(CFG, feats(), backend="torch_ref", fallback=True)
    assert str(info.value) == "backend 'torch_ref' cannot run here: no torch_ref"


def test_fallback_runs_torch_ref_under_its_own_name(clean_registry):
    register_backend("down", Declared(available=(False, "no GPU")))
    cfg = random_config(total_token=6, depth=2, top_k=2, vocab_size=20, hidden_size=8, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=8)
    w = random_weights(cfg, seed=1)
    ids, f = random_inputs(cfg, context=3, seed=1)
    with pytest.warns(RuntimeWarning) as caught:
        fr = frontier_generate(cfg, f, backend="down", input_ids=ids, weights=w, fallback=True, trace=True)
    assert str(caught[0].message) == "backend 'down' is unavailable (no GPU); falling back to 'torch_ref'"
    assert "trace" in fr.info  # torch_ref's own option reached torch_ref
    assert fr.same_tree(frontier_generate(cfg, f, backend="torch_ref", input_ids=ids, weights=w))


def test_a_loaded_head_passes_as_weights(weighted):
    from types import SimpleNamespace

    b, w, ids, f = weighted
    fr = frontier_generate(LAYER_CFG, f, backend="weighted", input_ids=ids, weights=SimpleNamespace(weights=w))
    assert b.calls == 1 and fr.total_token == 12
    with pytest.raises(InputError, match=r"^weights must be a frontier\.DraftWeights, got SimpleNamespace"):
        frontier_generate(LAYER_CFG, f, backend="weighted", input_ids=ids, weights=SimpleNamespace(weights="w"))


def test_weights_on_another_device_or_dtype(weighted):
    b, w, ids, f = weighted
    b.dtypes = (torch.float32, torch.float64)
    with pytest.raises(InputError) as info:
        frontier_generate(LAYER_CFG, f.double(), backend="weighted", input_ids=ids, weights=w)
    assert str(info.value) == "features_concat dtype torch.float64 differs from the weights' dtype torch.float32; cast one"
    b.devices = ("cpu", "meta")
    with pytest.raises(InputError) as info:
        frontier_generate(LAYER_CFG, f.to("meta"), backend="weighted", input_ids=ids.to("meta"), weights=w)
    assert str(info.value) == "weights are on cpu but features_concat on meta"


# ----------------------------------------------------------------------------------------------
# Non-finite scores from finite inputs: raised (check_finite, default) or flagged on the device
# ----------------------------------------------------------------------------------------------
from frontier.errors import NonFiniteError  # noqa: E402


def _nan_scores(fr, request):
    fr.scores = torch.full((fr.total_token,), float("nan"))


def _fine_scores(fr, request):
    fr.scores = torch.zeros(fr.total_token)


def test_non_finite_scores_raise_by_default_and_are_flagged_when_unchecked(clean_registry):
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)
    register_backend("nan_scores", Tamper(_nan_scores, requires_weights=True))
    register_backend("fine_scores", Tamper(_fine_scores, requires_weights=True))
    with pytest.raises(NonFiniteError) as info:
        frontier_generate(LAYER_CFG, f, backend="nan_scores", input_ids=ids, weights=w)
    assert str(info.value) == (
        "the draft produced non-finite scores from finite inputs: the draft layer overflowed (an fp16 head?). "
        "The cache was rolled back"
    )
    fr = frontier_generate(LAYER_CFG, f, backend="nan_scores", input_ids=ids, weights=w, check_finite=False)
    assert fr.invalid.dtype == torch.bool and bool(fr.invalid) is True
    fr = frontier_generate(LAYER_CFG, f, backend="fine_scores", input_ids=ids, weights=w, check_finite=False)
    assert bool(fr.invalid) is False
    fr = frontier_generate(LAYER_CFG, f, backend="fine_scores", input_ids=ids, weights=w)
    assert fr.invalid.dtype == torch.bool and fr.invalid.shape == () and bool(fr.invalid) is False
    bad = f.clone()
    bad[0, 1, 0] = float("inf")
    fr = frontier_generate(LAYER_CFG, bad, backend="fine_scores", input_ids=ids, weights=w, check_finite=False)
    assert bool(fr.invalid) is True  # the features' probe joins the scores' under check_finite=False


def test_non_finite_scores_name_the_sequence_in_a_batch(clean_registry):
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)

    def second_is_nan(fr, request):
        fr.scores = torch.full((fr.total_token,), float("nan") if request.num_new == 2 else 0.0)
        request.cache.length = request.cache.length + request.num_new  # the batch's fresh slot, appended to
        fr.cache = request.cache

    register_backend("second_nan", Tamper(second_is_nan, requires_weights=True))
    with pytest.raises(NonFiniteError, match=r"^the draft produced non-finite scores from finite inputs \(sequence\(s\) \[1\]\): "):
        frontier_generate(LAYER_CFG, [f, f[:, :2]], backend="second_nan", input_ids=[ids, ids[:, :3]], weights=w)


def test_unchecked_token_ids_are_clamped_and_flagged(clean_registry):
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)
    seen = []

    def record(fr, request):
        seen.append(request.input_ids.clone())

    register_backend("record", Tamper(record, requires_weights=True))
    high = ids.clone()
    high[0, 2], high[0, 3] = 80, -5
    fr = frontier_generate(LAYER_CFG, f, backend="record", input_ids=high, weights=w, check_token_range=False)
    assert bool(fr.invalid) is True
    assert int(seen[-1][0, 2]) == 79 and int(seen[-1][0, 3]) == 0 and torch.equal(seen[-1][0, 4:], ids[0, 4:])
    fr = frontier_generate(LAYER_CFG, f, backend="record", input_ids=ids, weights=w, check_token_range=False)
    assert bool(fr.invalid) is False and torch.equal(seen[-1], ids)


def test_non_finite_features_are_refused_before_drafting(weighted):
    b, w, ids, f = weighted
    bad = f.clone()
    bad[0, 0, 3] = float("nan")
    with pytest.raises(InputError) as info:
        frontier_generate(LAYER_CFG, bad, backend="weighted", input_ids=ids, weights=w)
    assert str(info.value) == (
        "features_concat holds non-finite values (NaN or +-Inf), e.g. from a target that overflowed in fp16; "
        "nothing was drafted and the cache is unchanged"
    )
    assert b.calls == 0


def test_declared_dtypes_are_listed(clean_registry):
    b = Declared()
    b.dtypes = (torch.float32, torch.float64)
    register_backend("two_dtypes", b)
    with pytest.raises(InputError, match=r"^backend 'two_dtypes' supports dtypes float32, float64; features_concat is float16$"):
        frontier_generate(CFG, feats(dtype=torch.float16), backend="two_dtypes")


def _writes_rows(scores):
    """Appends n rows of ones to the caller's cache and reports ``scores``."""
    def change(fr, request):
        cache, c, n = request.cache, request.cache.length, request.num_new
        cache.k[:, :, c : c + n] = 1.0
        cache.v[:, :, c : c + n] = 2.0
        cache.length = c + n
        fr.cache = cache
        fr.scores = scores(fr.total_token)
    return change


@pytest.mark.parametrize("scores,invalid", [
    (lambda t: torch.full((t,), float("nan")), True),
    (lambda t: None, False),
    (lambda t: torch.full((t,), 3e38), False),  # finite float32 whose float32 sum would overflow
    (lambda t: torch.full((t,), 1e308, dtype=torch.float64), False),  # finite float64 whose sum would overflow
])
def test_unchecked_non_finite_scores_zero_the_new_rows(clean_registry, scores, invalid):
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)
    register_backend("writer", Tamper(_writes_rows(scores), requires_weights=True))
    cache = frontier.DraftCache.for_config(LAYER_CFG, max_length=16, dtype=torch.float32, device="cpu")
    first = frontier_generate(LAYER_CFG, f[:, :4], backend="writer", input_ids=ids[:, :5], weights=w, cache=cache,
                              check_finite=False)
    assert bool(first.invalid) is invalid and cache.length == 4
    fr = frontier_generate(LAYER_CFG, f[:, 4:], backend="writer", input_ids=ids, weights=w, cache=cache,
                           check_finite=False)
    assert bool(fr.invalid) is invalid and fr.invalid.dtype == torch.bool and cache.length == 6
    if invalid:  # the new rows [4, 6) are zeros; rows past them and before them as the calls left them
        assert not cache.k[:, :, :6].any() and not cache.v[:, :, :6].any()
    else:
        assert cache.k[:, :, :6].eq(1.0).all() and cache.v[:, :, :6].eq(2.0).all()
    assert not cache.k[:, :, 6:].any()


def test_clamped_ids_and_non_finite_scores_both_flag(clean_registry):
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)
    register_backend("nan_scores", Tamper(_nan_scores, requires_weights=True))
    fr = frontier_generate(LAYER_CFG, f, backend="nan_scores", input_ids=ids, weights=w, check_finite=False,
                           check_token_range=False)
    assert bool(fr.invalid) is True  # in-range ids, non-finite scores


def test_fallback_warning_points_at_the_caller_and_options_go_to_torch_ref(clean_registry):
    register_backend("down", Declared(available=(False, "no GPU")))
    cfg = random_config(total_token=6, depth=2, top_k=2, vocab_size=20, hidden_size=8, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=8)
    w = random_weights(cfg, seed=1)
    ids, f = random_inputs(cfg, context=3, seed=1)
    with pytest.warns(RuntimeWarning) as caught:
        frontier_generate(cfg, f, backend="down", input_ids=ids, weights=w, fallback=True)
        frontier_generate(cfg, [f], backend="down", input_ids=[ids], weights=w, fallback=True)
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutation testing's trampolines add frames outside frontier
        assert [c.filename for c in caught] == [__file__, __file__]  # the caller's line, single or batched
    with pytest.warns(RuntimeWarning), pytest.raises(InputError, match=(
        r"^unknown option 'bogus' for backend 'torch_ref' \(it takes: check_finite, check_token_range, trace\)$"
    )):
        frontier_generate(cfg, f, backend="down", input_ids=ids, weights=w, fallback=True, bogus=1)


def test_generate_batch_is_used_for_batches_only(clean_registry):
    class Both(Backend):
        def generate(self, request):
            self.single = getattr(self, "single", 0) + 1
            return StubBackend().generate(request)

        def generate_batch(self, requests):
            self.batched = getattr(self, "batched", 0) + 1
            return [StubBackend().generate(r) for r in requests]

    both = Both()
    register_backend("both", both)
    frontier_generate(CFG, feats(), backend="both")
    assert (getattr(both, "single", 0), getattr(both, "batched", 0)) == (1, 0)
    frs = frontier_generate(CFG, [feats(), feats(2)], backend="both")
    assert len(frs) == 2 and (both.single, both.batched) == (1, 1)


def test_a_cache_of_another_type_is_named(clean_registry):
    w = random_weights(LAYER_CFG, seed=1)
    ids, f = random_inputs(LAYER_CFG, context=6, seed=1)
    register_backend("str_cache", Tamper(lambda fr, r: setattr(fr, "cache", "rows"), requires_weights=True))
    cache = frontier.DraftCache.for_config(LAYER_CFG, max_length=16, dtype=torch.float32, device="cpu")
    with pytest.raises(frontier.InvariantError, match=(
        r"^backend 'str_cache' returned a malformed Frontier: cache is str, expected the DraftCache the call appended to$"
    )):
        frontier_generate(LAYER_CFG, f, backend="str_cache", input_ids=ids, weights=w, cache=cache)


def _ea_module(cfg, w):
    """An EAGLE-style module holding ``w`` under the public attribute names."""

    class HfConfig:
        num_attention_heads, num_key_value_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        rope_theta, rms_norm_eps, rope_scaling = cfg.rope_theta, cfg.rms_norm_eps, None
        vocab_size, draft_vocab_size = cfg.target_vocab_size, cfg.vocab_size

    return eagle_style_module(w.state_dict(), HfConfig())


def test_an_ea_layer_drafts_like_its_weights_and_takes_an_lm_head():
    cfg = random_config(total_token=8, depth=2, top_k=3, vocab_size=40, target_vocab_size=60, hidden_size=16,
                        num_attention_heads=2, num_key_value_heads=1, intermediate_size=24)
    w = random_weights(cfg, seed=3, lm_head_scale=6.0)
    ids, f = random_inputs(cfg, context=5, seed=3)
    layer = _ea_module(cfg, w)
    by_layer = frontier_generate(cfg, f, "torch_ref", input_ids=ids, ea_layer=layer)
    assert by_layer.same_tree(frontier_generate(cfg, f, "torch_ref", input_ids=ids, weights=w))
    other_head = torch.randn_like(w.lm_head) * 6.0
    with_head = frontier_generate(cfg, f, "torch_ref", input_ids=ids, ea_layer=layer, lm_head=other_head)
    assert not with_head.same_tree(by_layer)
