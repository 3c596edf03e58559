"""Hostile inputs: every bad value gets an error naming the argument and leaves every draft cache
as it was (its length, its committed rows bit for bit); no value makes a kernel index out of
bounds, hang, or read outside a checkpoint; exact score ties go to the lower index in every
backend. One file: the Hypothesis strategies at the top serve every class of bad input.

The property tests draw configs, shapes, dtypes, values (NaN, +-Inf, extremes), token ids and
cache states with Hypothesis. Profiles: ``ci`` (the default, small) and ``deep`` (on demand:
``HYPOTHESIS_PROFILE=deep python -m pytest tests/test_hostile_inputs.py``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import frontier
from frontier import (
    BackendUnavailableError,
    CacheError,
    ConfigError,
    DraftCache,
    FrontierConfig,
    FrontierError,
    InputError,
    InvariantError,
    WeightsError,
    frontier_generate,
    register_backend,
    unregister_backend,
)
from frontier.cli import main
from frontier.errors import NonFiniteError
from frontier.loading import load_draft_head, save_draft_head
from frontier.random_head import random_config, random_inputs, random_weights
from frontier.tree import best_k, chosen_candidates

from conftest import backend_device, runnable_backends

settings.register_profile(
    "ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
settings.register_profile("deep", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

WEIGHTED = [b for b in runnable_backends() if getattr(frontier.get_backend(b), "requires_weights", False)]
# the property tests run the interpreted triton kernels only in the deep profile (seconds a call)
PROPERTY_BACKENDS = [b for b in WEIGHTED if b != "triton" or os.environ.get("HYPOTHESIS_PROFILE") == "deep"]
CFG = random_config(total_token=10, depth=2, top_k=3, vocab_size=40, target_vocab_size=64, hidden_size=32,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48)
W = random_weights(CFG, seed=0)


def _snapshot(cache):
    return None if cache is None else (cache.length, cache.k.clone(), cache.v.clone())


def _assert_unchanged(cache, snap):
    """The length, and the committed rows bit for bit (rows past the length are scratch)."""
    length, k, v = snap
    assert cache.length == length
    for now, then in ((cache.k, k), (cache.v, v)):
        assert torch.equal(now[:, :, :length].contiguous().view(torch.uint8), then[:, :, :length].contiguous().view(torch.uint8))


def _prefilled(backend, cfg=CFG, w=W, context=8, new_rows=3, seed=0):
    """(cache holding context - new_rows rows, ids [1, context+1], the new rows' features)."""
    dev = backend_device(backend)
    ids, feats = random_inputs(cfg, context=context, seed=seed, device=dev)
    c = context - new_rows
    fr = frontier_generate(cfg, feats[:, :c], backend=backend, input_ids=ids[:, : c + 1], weights=w.to(dev),
                           cache_max_length=context + 4)
    return fr.cache, ids, feats[:, c:]


# ==============================================================================================
# 1. Non-finite values
# ==============================================================================================
@pytest.mark.parametrize("backend", WEIGHTED)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_features_raise_before_anything_is_committed(backend, value):
    cache, ids, new = _prefilled(backend)
    snap = _snapshot(cache)
    bad = new.clone()
    bad[0, 1, 5] = value
    with pytest.raises(InputError, match=r"features_concat holds non-finite values"):
        frontier_generate(CFG, bad, backend=backend, input_ids=ids, weights=W.to(new.device), cache=cache)
    _assert_unchanged(cache, snap)


@pytest.mark.parametrize("backend", WEIGHTED)
def test_padded_layout_flags_non_finite_features_on_the_device_and_keeps_the_rows(backend):
    """The padded layout reads nothing from the host: the flag reports the poison, and the call's
    new cache rows hold zeros instead of it (the committed ones are never touched)."""
    cache, ids, new = _prefilled(backend)
    c, n = cache.length, new.shape[1]
    rows_before = cache.k[:, :, :c].clone(), cache.v[:, :, :c].clone()
    bad = new.clone()
    bad[0, 0, 0] = float("nan")
    fr = frontier_generate(CFG, bad, backend=backend, input_ids=ids, weights=W.to(new.device), cache=cache, padded=True)
    assert isinstance(fr.invalid, torch.Tensor) and fr.invalid.device == new.device and bool(fr.invalid)
    assert cache.length == c + n  # the host cannot know without a read; the flag says to truncate
    assert torch.equal(cache.k[:, :, :c], rows_before[0]) and torch.equal(cache.v[:, :, :c], rows_before[1])
    assert not cache.k[:, :, c : c + n].any() and not cache.v[:, :, c : c + n].any()
    cache.truncate(c)  # what a caller does on the flag; the next call is then clean
    fr = frontier_generate(CFG, new, backend=backend, input_ids=ids, weights=W.to(new.device), cache=cache, padded=True)
    assert not bool(fr.invalid) and cache.length == c + n
    fr.check_invariants(total_token=CFG.total_token, depth=CFG.depth, top_k=CFG.top_k)


def test_a_draft_that_overflows_raises_and_rolls_the_cache_back():
    """fp16 weights whose logits overflow turn finite features into NaN log-probs."""
    w = random_weights(CFG, seed=3, dtype=torch.float16, lm_head_scale=3e4)
    ids, feats = random_inputs(CFG, context=6, seed=1, dtype=torch.float16)
    first = frontier_generate(CFG, feats[:, :4], backend="torch_ref", input_ids=ids[:, :5], weights=w,
                              check_finite=False, padded=True)
    assert bool(first.invalid)
    cache = first.cache
    cache.truncate(0)
    snap = _snapshot(cache)
    with pytest.raises(NonFiniteError, match=r"non-finite scores from finite inputs.*rolled back"):
        frontier_generate(CFG, feats[:, :4], backend="torch_ref", input_ids=ids[:, :5], weights=w, cache=cache)
    _assert_unchanged(cache, snap)


@pytest.mark.parametrize("key", ["fc.weight", "midlayer.mlp.up_proj.weight", "lm_head.weight", "norm.weight"])
def test_non_finite_weights_are_refused_naming_the_tensor(key):
    w = random_weights(CFG, seed=2)
    t = w.state_dict()[key]
    ids, feats = random_inputs(CFG, context=5, seed=2)
    frontier_generate(CFG, feats, backend="torch_ref", input_ids=ids, weights=w)  # passes, and is remembered
    t.view(-1)[3] = float("nan")  # in place: the tensor's version moves, so the check runs again
    with pytest.raises(WeightsError, match=re.escape(f"tensor {key!r} holds non-finite values")):
        frontier_generate(CFG, feats, backend="torch_ref", input_ids=ids, weights=w)


@pytest.mark.parametrize("backend", WEIGHTED)
@pytest.mark.parametrize("key", ["d2t", "lm_head.weight"])
def test_weights_given_new_data_are_checked_again(backend, key):
    """``t.data = other`` keeps the tensor and its version counter but not its storage: the
    checks that passed on the old data (remembered while no tensor changes) run again."""
    dev = backend_device(backend)
    w = random_weights(CFG, seed=5, device=dev)
    ids, feats = random_inputs(CFG, context=5, seed=5, device=dev)
    frontier_generate(CFG, feats, backend=backend, input_ids=ids, weights=w)  # passes, and is remembered
    t = w.state_dict()[key]
    bad = t.clone()
    if key == "d2t":
        bad[7] = 64 - 7 + 5  # target id 69 >= target_vocab_size
        match = r"tensor 'd2t' maps draft id 7 to target id 69, outside the target vocabulary"
    else:
        bad.view(-1)[3] = float("inf")
        match = re.escape(f"tensor {key!r} holds non-finite values")
    version = t._version
    t.data = bad
    assert t._version == version
    with pytest.raises(WeightsError, match=match):
        frontier_generate(CFG, feats, backend=backend, input_ids=ids, weights=w)


@pytest.mark.parametrize(
    "field,value",
    [("rope_theta", float("nan")), ("rope_theta", float("inf")), ("rope_theta", 0.0), ("rms_norm_eps", float("nan")),
     ("rms_norm_eps", -float("inf")), ("rms_norm_eps", float("inf"))],
)
def test_config_floats_must_be_positive_and_finite(field, value):
    with pytest.raises(ConfigError, match=rf"{field} must be positive and finite, got {field}={value}"):
        CFG.replace(**{field: value})


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), 0, -2.0, True, "2"])
@pytest.mark.parametrize("key", ["type", "rope_type"])
def test_rope_scaling_factor_must_be_positive_and_finite(key, factor):
    with pytest.raises(ConfigError, match=r"rope_scaling 'linear' needs a finite positive 'factor'"):
        CFG.replace(rope_scaling={key: "linear", "factor": factor})


# ==============================================================================================
# 2. Memory safety: nothing a kernel indexes with can be set wrong
# ==============================================================================================
@pytest.mark.parametrize("value", [-1, 10**6, 2.5, True, "3", None])
def test_cache_length_cannot_be_set_outside_its_storage(value):
    cache = DraftCache(1, 2, 4, 8, dtype=torch.float32, device="cpu")
    cache.length = 5
    with pytest.raises(CacheError, match=r"length must"):
        cache.length = value
    assert cache.length == 5
    cache.length = 8  # exactly full is fine
    assert cache.length == 8


def test_cache_storage_is_read_only_and_checked():
    cache = DraftCache(1, 2, 4, 8, dtype=torch.float32, device="cpu")
    with pytest.raises(AttributeError):
        cache.k = torch.zeros(1, 2, 2, 4)
    batch = frontier.BatchDraftCache(CFG, 2, max_length=8, dtype=torch.float32, device="cpu")
    for name in ("k", "v"):  # the slots view this storage: another tensor there would leave them behind
        with pytest.raises(AttributeError):
            setattr(batch, name, torch.zeros(2, 1, 2, 16, 8))
    with pytest.raises(CacheError, match=r"length must lie in \[0, max_length=3\], got length=4"):
        DraftCache.from_tensors(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), length=4)
    with pytest.raises(CacheError, match=r"new_length must be an int"):
        cache.commit(2.0)
    cache.v.resize_(1, 2, 2, 4)  # in-place surgery on the storage is caught before any kernel runs
    with pytest.raises(CacheError, match=r"cache storage is inconsistent"):
        cache.check_compatible(CFG.replace(num_key_value_heads=2, num_attention_heads=4), torch.float32,
                               torch.device("cpu"))


@pytest.mark.parametrize("backend", WEIGHTED)
@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
@pytest.mark.parametrize("offset", [-1, 64, 69])  # target ids -1, target_vocab_size and past it
def test_d2t_leaving_the_target_vocabulary_is_refused(backend, offset, fp8):
    dev = backend_device(backend)
    w = random_weights(CFG, seed=4, device=dev)
    w = w.quantized() if fp8 else w  # (an fp8 head's scales are checked beside d2t)
    w.d2t = w.d2t.clone()
    j = 7
    w.d2t[j] = offset - j
    ids, feats = random_inputs(CFG, context=5, seed=4, device=dev)
    with pytest.raises(WeightsError, match=rf"tensor 'd2t' maps draft id {j} to target id -?\d+, outside the target "
                                           r"vocabulary \[0, target_vocab_size=64\)"):
        frontier_generate(CFG, feats, backend=backend, input_ids=ids, weights=w)


@pytest.mark.parametrize("backend", WEIGHTED)
def test_unchecked_token_ids_are_clamped_on_the_device_and_flagged(backend):
    cache, ids, new = _prefilled(backend)
    c = cache.length
    bad = ids.clone()
    bad[0, -2] = 10**6
    with pytest.raises(InputError, match=r"input_ids must lie in \[0, target_vocab_size=64\), got range \[\d+, 1000000\]"):
        frontier_generate(CFG, new, backend=backend, input_ids=bad, weights=W.to(new.device), cache=cache)
    fr = frontier_generate(CFG, new, backend=backend, input_ids=bad, weights=W.to(new.device), cache=cache,
                           check_token_range=False, padded=True)
    assert bool(fr.invalid) and not cache.k[:, :, c : c + 3].any()
    assert int(fr.draft_tokens.max()) < CFG.target_vocab_size


# ==============================================================================================
# 3. Atomicity in every path
# ==============================================================================================
class Misbehaving(frontier.Backend):
    """torch_ref, then one kind of misbehaviour."""

    requires_weights = True
    devices = ("cpu",)
    options = ()

    def __init__(self, how):
        self.how = how

    def generate(self, request):
        from frontier.backends.torch_ref.draft import draft_call

        fr = draft_call(request)  # commits the cache
        if self.how == "raise":
            raise RuntimeError("plugin failed after committing")
        if self.how == "shape":
            fr.draft_tokens = fr.draft_tokens[:, :-1]
        if self.how == "dtype":
            fr.tree_position_ids = fr.tree_position_ids.int()
        if self.how == "uncommitted":
            fr.cache.truncate(fr.cache.length - 1)
        if self.how == "other_cache":
            fr.cache = fr.cache.clone()
        return fr


@pytest.mark.parametrize(
    "how,error,pattern",
    [
        ("raise", RuntimeError, r"plugin failed after committing"),
        ("shape", InvariantError, r"draft_tokens must be \[1, 10\] int64, got \[1, 9\]"),
        ("dtype", InvariantError, r"tree_position_ids must be \[10\] int64, got \[10\] torch.int32"),
        ("uncommitted", InvariantError, r"the cache holds 7 rows after the call, expected 5 \+ n=3"),
        ("other_cache", InvariantError, r"cache is not the DraftCache passed in"),
    ],
)
@pytest.mark.parametrize("batched", [False, True])
def test_a_misbehaving_backend_leaves_every_cache_as_it_was(how, error, pattern, batched):
    name = f"misbehaving_{how}"
    register_backend(name, Misbehaving(how), clobber=True)
    try:
        cache, ids, new = _prefilled("torch_ref")
        snap = _snapshot(cache)
        with pytest.raises(error, match=pattern):
            if batched:
                other, ids2, new2 = _prefilled("torch_ref", seed=5)
                snap2 = _snapshot(other)
                frontier_generate(CFG, [new, new2], backend=name, input_ids=[ids, ids2], weights=W,
                                  cache=[cache, other])
            else:
                frontier_generate(CFG, new, backend=name, input_ids=ids, weights=W, cache=cache)
        _assert_unchanged(cache, snap)
        if batched:
            _assert_unchanged(other, snap2)
    finally:
        unregister_backend(name)


# ==============================================================================================
# 4. Bounded sizes: no legal-looking config runs forever
# ==============================================================================================
@pytest.mark.parametrize(
    "field,value,bound",
    [("depth", 10**9, 256), ("top_k", 10**6, 256), ("total_token", 10**7, 4096), ("vocab_size", 2**40, 2**31 - 1),
     ("hidden_size", 2**30, 2**20), ("num_layers", 10**4, 256)],
)
def test_every_size_is_bounded_and_the_bound_is_named(field, value, bound):
    kw = dict(total_token=10, depth=3, top_k=3, vocab_size=100, hidden_size=8)
    kw[field] = value
    with pytest.raises(ConfigError, match=rf"{field} must be <= {bound}, got {field}={value}"):
        FrontierConfig(**kw)


def test_the_candidate_list_is_bounded():
    with pytest.raises(ConfigError, match=r"candidate list .* at most 16777216 entries, got 16777472"):
        FrontierConfig(total_token=10, depth=256, top_k=256, vocab_size=1000, hidden_size=8)


@pytest.mark.parametrize("seed", [0, -1, 2**31, 2**63, -(2**70), 10**30])
def test_the_stub_takes_any_int_seed_and_row_count(seed):
    cfg = FrontierConfig(total_token=12, depth=3, top_k=3, vocab_size=100, hidden_size=4)
    fr = frontier_generate(cfg, torch.zeros(1, 5000, cfg.feature_size), backend="stub", seed=seed)
    fr.check_invariants(total_token=12, depth=3, top_k=3)
    same = frontier_generate(cfg, torch.zeros(1, 5000, cfg.feature_size), backend="stub", seed=seed % 2**32)
    assert fr.same_tree(same)  # the hash reads 32 bits of the seed


# ==============================================================================================
# 5. Files stay inside the checkpoint
# ==============================================================================================
@pytest.fixture()
def sharded_head(tmp_path):
    path = tmp_path / "head"
    save_draft_head(W, CFG, path, shards=2, include_embedding=True)
    return path


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors", 7])
def test_index_shard_names_must_stay_inside_the_checkpoint(sharded_head, shard):
    (sharded_head.parent / "outside.safetensors").write_bytes(b"")
    idx = sharded_head / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"][next(iter(data["weight_map"]))] = shard
    idx.write_text(json.dumps(data))
    with pytest.raises(WeightsError, match=r"names shard .*not a relative path inside the checkpoint|shard names are file"):
        load_draft_head(sharded_head)


@pytest.mark.parametrize(
    "make,pattern",
    [
        (lambda p: os.symlink("/dev/zero", p), r"head config '.*config\.json' is not a regular file"),
        (lambda p: os.symlink(p.name, p), r"head config '.*config\.json' cannot be opened: Too many levels"),
        (lambda p: os.symlink("gone.json", p), r"head config '.*config\.json' is a symlink to 'gone\.json', which does "
                                               r"not exist"),
        (lambda p: p.write_text("[" * 50000 + "]" * 50000), r"head config '.*config\.json' is not valid JSON: "
                                                           r"RecursionError"),
        (lambda p: p.write_bytes(b" " * (16 << 20) + b"{}"), r"head config '.*config\.json' is larger than 16777216 "
                                                             r"bytes"),
    ],
    ids=["dev-zero", "loop", "dangling", "deep", "huge"],
)
def test_config_json_is_read_only_as_a_small_regular_file(sharded_head, make, pattern):
    cfg_file = sharded_head / "config.json"
    cfg_file.unlink()
    make(cfg_file)
    with pytest.raises(WeightsError, match=pattern):
        load_draft_head(sharded_head)


def test_broken_weight_links_are_named_as_such(sharded_head):
    idx = sharded_head / "model.safetensors.index.json"
    shard = sorted(sharded_head.glob("model-*.safetensors"))[0]
    shard.unlink()
    os.symlink("nowhere.safetensors", shard)
    with pytest.raises(WeightsError, match=rf"{shard.name} \(a symlink to 'nowhere\.safetensors', which does not exist\)"):
        load_draft_head(sharded_head)
    idx.unlink()
    os.symlink(idx.name, idx)  # a loop where the index should be
    with pytest.raises(WeightsError, match=r"cannot be opened: \['model\.safetensors\.index\.json \(a symlink that "
                                           r"cannot be followed"):
        load_draft_head(sharded_head)


# ==============================================================================================
# 6. Typos are errors
# ==============================================================================================
@pytest.mark.parametrize(
    "backend,option,suggestion",
    [("stub", "padd", "padded"), ("torch_ref", "trcae", "trace"), ("triton", "mdoe", "mode"),
     ("torch_ref", "check_finit", "check_finite"), ("stub", "sede", "seed")],
)
def test_misspelled_options_are_refused_with_the_nearest_name(backend, option, suggestion):
    dev = backend_device(backend) if backend in runnable_backends() else torch.device("cpu")
    ids, feats = random_inputs(CFG, context=5, device=dev)
    with pytest.raises(InputError, match=rf"unknown option {option!r} for backend {backend!r} \(it takes: .*\); did "
                                         rf"you mean {suggestion!r}\?"):
        frontier_generate(CFG, feats, backend=backend, input_ids=ids, weights=W.to(dev) if backend != "stub" else None,
                          **{option: True})


@pytest.mark.parametrize("option,value", [("check_finite", 1), ("check_token_range", "no"), ("trace", None)])
def test_check_options_must_be_bools(option, value):
    ids, feats = random_inputs(CFG, context=5)
    with pytest.raises(InputError, match=rf"option {option} must be True or False, got {option}={value!r}"):
        frontier_generate(CFG, feats, backend="torch_ref", input_ids=ids, weights=W, **{option: value})


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(temperature="hot"), r"temperature must be a finite number >= 0"),
        (dict(temperature=float("nan")), r"temperature must be a finite number >= 0"),
        (dict(top_p="0.5"), r"top_p must be a number in \(0, 1\]"),
        (dict(top_k=2.5), r"top_k must be an int >= 0 \(0 = off\), got top_k=2.5"),
        (dict(top_k=True), r"top_k must be an int >= 0"),
        (dict(stop_token_ids=[1.5]), r"stop_token_ids must be a token id or a list of token ids \(ints >= 0\)"),
        (dict(stop_token_ids="12"), r"stop_token_ids must be a token id"),
        (dict(eos_token_id=-3), r"eos_token_id must be a token id"),
    ],
)
def test_generation_parameters_are_type_checked(kwargs, pattern):
    from frontier.generation import SpeculativeGenerator, random_pair

    target, cfg, w = random_pair("tiny", total_token=8, depth=2, top_k=2, seed=0)
    gen = SpeculativeGenerator(target, cfg, None, backend="stub")
    with pytest.raises(InputError, match=pattern):
        gen.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, **kwargs)


def test_misspelled_draft_options_fail_when_the_generator_is_built():
    from frontier.generation import SpeculativeGenerator, random_pair

    target, cfg, w = random_pair("tiny", total_token=8, depth=2, top_k=2, seed=0)
    with pytest.raises(InputError, match=r"unknown option 'mdoe' for backend 'torch_ref'"):
        SpeculativeGenerator(target, cfg, w, backend="torch_ref", draft_options={"mdoe": "graph"})


class Exits(frontier.Backend):
    def availability(self):
        raise OSError("driver went away")

    def generate(self, request):  # pragma: no cover - never reached
        raise AssertionError


def test_a_plugin_that_exits_on_import_or_raises_in_availability_is_reported(tmp_path, monkeypatch, capsys):
    mod = tmp_path / "exiting_plugin.py"
    mod.write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register_backend("exits_on_import", "exiting_plugin:Backend")
    register_backend("raises_availability", Exits())
    try:
        with pytest.raises(BackendUnavailableError, match=r"'exits_on_import' .* failed to load: SystemExit: 3"):
            frontier.get_backend("exits_on_import")
        with pytest.raises(BackendUnavailableError, match=r"'raises_availability' cannot run here: its availability\(\) "
                                                          r"raised OSError: driver went away"):
            frontier_generate(CFG, torch.zeros(1, 2, CFG.feature_size), backend="raises_availability")
        assert main(["backends"]) == 0
        out = capsys.readouterr().out
        assert re.search(r"exits_on_import\s+no: .*SystemExit: 3", out)
    finally:
        unregister_backend("exits_on_import")
        unregister_backend("raises_availability")


# ==============================================================================================
# 7. The CLI: one line naming the flag, exit 2 for usage errors, never a traceback
# ==============================================================================================
@pytest.mark.parametrize(
    "argv,pattern",
    [
        (["generate", "--random-tiny", "--total-token", "0"], r"argument --total-token: must be a positive integer"),
        (["generate", "--random-tiny", "--depth", "-2"], r"argument --depth: must be a positive integer"),
        (["generate", "--random-tiny", "--temperature", "nan"], r"argument --temperature: must be a finite number"),
        (["generate", "--random-tiny", "--top-p", "1.5"], r"argument --top-p: must be a number in \(0, 1\]"),
        (["generate", "--random-tiny", "--device", "tpu"], r"argument --device: must be cpu, cuda or cuda:N"),
        (["generate", "--target", "/nonexistent", "--head", "/nonexistent"], r"--target '/nonexistent' is not a "
                                                                             r"directory"),
        (["inspect", ".", "--bandwidth-tbs", "nan"], r"argument --bandwidth-tbs: must be a finite number"),
        (["inspect", ".", "--bandwidth-tbs", "0"], r"argument --bandwidth-tbs: must be a finite number > 0"),
        (["inspect", ".", "--override", "x=" + "[" * 100000], r"argument --override: the JSON of 'x' is nested too "
                                                              r"deeply"),
        (["bench", "--reps", "0"], r"argument --reps: must be a positive integer"),
        (["bench", "--depth", "0"], r"--depth takes comma-separated positive integers"),
        (["demo", "--context", "-1"], r"argument --context: must be a positive integer"),
    ],
)
def test_cli_usage_errors_are_one_line_naming_the_flag(capsys, argv, pattern):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert re.search(pattern, err) and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cli_cuda_without_a_gpu_is_a_usage_error(capsys):
    assert main(["generate", "--random-tiny", "--device", "cuda"]) == 2
    assert "argument --device: 'cuda' needs a CUDA GPU, and this machine has none" in capsys.readouterr().err


def test_cli_json_into_a_closed_pipe_ends_quietly():
    cmd = f"{sys.executable} -m frontier.cli backends --json | head -c 1"
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, timeout=120)
    assert proc.stdout == "[" and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


# ==============================================================================================
# 8. Ties: exactly equal scores go to the lower index at all three places
# ==============================================================================================
def test_best_k_and_the_final_selection_rank_ties_by_index():
    x = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0, 2.0])
    values, idx = best_k(x, 4)
    assert idx.tolist() == [1, 2, 4, 3] and values.tolist() == [3.0, 3.0, 3.0, 2.0]
    assert best_k(torch.zeros(2, 5), 3)[1].tolist() == [[0, 1, 2], [0, 1, 2]]
    assert chosen_candidates(torch.tensor([0.5, 1.0, 1.0, 0.5, 1.0]), total_token=4).tolist() == [1, 2, 4]
    assert chosen_candidates(torch.tensor([0.5, 1.0, 0.5, 0.5]), total_token=3).tolist() == [0, 1]


def _tied_head(dtype=torch.float32, device="cpu"):
    """A head whose lm_head rows come in identical pairs (2m, 2m+1): every row's log-probs, every
    depth's cumulative scores and the final candidates all hold exact ties, and d2t sends the two
    ids of a pair to different target tokens, so the wrong pick shows in the tree."""
    cfg = random_config(total_token=14, depth=3, top_k=3, vocab_size=40, target_vocab_size=64, hidden_size=32,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=48)
    w = random_weights(cfg, seed=11, lm_head_scale=8.0)
    w.lm_head[1::2] = w.lm_head[0::2]
    return cfg, w.to(device=device, dtype=dtype)


def _lower_index_reference(trace, k, t):
    """Redo the three selections from the traced log-probs with the rule written out: sort by
    (score descending, index ascending) in plain Python."""

    def top(values, n):
        return sorted(range(len(values)), key=lambda i: (-values[i], i))[:n]

    lps = [lp.tolist() for lp in trace.log_probs]
    children = [top(lps[0], k)] + [[top(row, k) for row in lp] for lp in lps[1:]]
    scores = trace.scores.tolist()
    prunes = [top(scores[k + d * k * k : k + (d + 1) * k * k], k) for d in range(len(lps) - 2)]
    return children, prunes, sorted(top(scores, t - 1))


@pytest.mark.parametrize("sampling", [False, True])
def test_torch_ref_breaks_exact_ties_toward_the_lower_index_everywhere(sampling):
    cfg, w = _tied_head()
    ids, feats = random_inputs(cfg, context=6, seed=2)
    fr = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, trace=True, sampling=sampling)
    tr = fr.info["trace"]
    k = cfg.top_k
    children, prunes, chosen = _lower_index_reference(tr, k, cfg.total_token)
    d2t = tr.draft_to_target
    # a row's top-K: the root's K candidates, then each depth's rows in order
    assert tr.tokens[:k].tolist() == d2t[children[0]].tolist()
    pair_ties = sum(len(set(r) & {i ^ 1 for i in r}) > 0 for rows in children[1:] for r in rows)
    assert pair_ties > 0  # the head really produced ties inside the rows
    for d, rows in enumerate(children[1:]):
        block = tr.tokens[k + d * k * k : k + (d + 1) * k * k].view(k, k)
        assert block.tolist() == [d2t[r].tolist() for r in rows]
    # the per-depth prune: the next depth's rows are the picks, stored as parents
    for d, picks in enumerate(prunes):
        stored = tr.row_parents[1 + (d + 1) * k : 1 + (d + 2) * k] - (1 + k + d * k * k)  # group 0 is the root's
        assert stored.tolist() == picks
    # the final T-1
    assert fr.draft_tokens[0, 1:].tolist() == tr.tokens[chosen].tolist()


@pytest.mark.parametrize("backend", [b for b in WEIGHTED if b != "torch_ref"])
def test_every_weighted_backend_breaks_the_ties_as_torch_ref_does(backend):
    dev = backend_device(backend)
    cfg, w = _tied_head(device=dev)
    ids, feats = random_inputs(cfg, context=6, seed=2, device=dev)
    ref = frontier_generate(cfg, feats.cpu(), backend="torch_ref", input_ids=ids.cpu(), weights=w.to("cpu"))
    got = frontier_generate(cfg, feats, backend=backend, input_ids=ids, weights=w)
    assert ref.same_tree(got)


# ==============================================================================================
# Properties: any input gives a valid tree or an error naming an argument, the cache untouched
# ==============================================================================================
SPECIAL = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 0.0, -0.0, 1e-30])
ARGUMENT_NAMES = ("features_concat", "input_ids", "cache", "weights", "target_vocab_size", "context", "n=")


@st.composite
def draft_calls(draw):
    ctx = draw(st.integers(2, 12))
    cached = draw(st.integers(0, ctx - 1))
    n = draw(st.integers(1, ctx - cached + 1))  # sometimes one row too many
    poison = draw(st.lists(st.tuples(st.integers(0, 10**6), SPECIAL), max_size=2))
    bad_id = draw(st.sampled_from([None, -1, 64, 2**40]))
    padded = draw(st.booleans())
    check_range = draw(st.booleans())
    return ctx, cached, n, poison, bad_id, padded, check_range


@pytest.mark.parametrize("backend", PROPERTY_BACKENDS)
@given(call=draft_calls(), seed=st.integers(0, 2**16))
def test_any_draft_call_gives_a_valid_tree_or_a_named_error_and_an_untouched_cache(backend, call, seed):
    ctx, cached, n, poison, bad_id, padded, check_range = call
    dev = backend_device(backend)
    ids, feats = random_inputs(CFG, context=ctx, new_rows=ctx + 1, seed=seed, device=dev)  # a row to spare
    w = W.to(dev)
    cache = None
    if cached:
        cache = frontier_generate(CFG, feats[:, :cached], backend=backend, input_ids=ids[:, : cached + 1], weights=w,
                                  cache_max_length=ctx + 2).cache
    new = feats[:, cached : cached + n].clone()
    flat = new.view(-1)
    for pos, value in poison:
        flat[pos % flat.numel()] = value
    if bad_id is not None:
        ids = ids.clone()
        ids[0, -1] = bad_id
    snap = _snapshot(cache)
    clean = bool(torch.isfinite(new).all()) and bad_id is None
    try:
        fr = frontier_generate(CFG, new, backend=backend, input_ids=ids, weights=w, cache=cache, padded=padded,
                               check_token_range=check_range)
    except FrontierError as exc:
        assert any(name in str(exc) for name in ARGUMENT_NAMES), str(exc)
        if cache is not None:
            _assert_unchanged(cache, snap)
        assert not clean or cached + n != ctx, f"a clean call failed: {exc}"
        return
    assert cached + n == ctx
    assert bool(fr.invalid) == (not clean)  # every bad value that got through is flagged
    fr.check_invariants(total_token=CFG.total_token, depth=CFG.depth, top_k=CFG.top_k)
    assert int(fr.draft_tokens.min()) >= 0 and int(fr.draft_tokens.max()) < CFG.target_vocab_size
    if cache is not None:
        assert cache.length == ctx
        assert torch.equal(cache.k[:, :, :cached], snap[1][:, :, :cached])  # committed rows never change
        if not clean:  # the flagged call's rows hold zeros, not the poison
            assert not cache.k[:, :, cached:ctx].any() and not cache.v[:, :, cached:ctx].any()


CONFIG_FIELDS = {
    "total_token": st.integers(-2, 5000),
    "depth": st.integers(-1, 300),
    "top_k": st.integers(-1, 300),
    "vocab_size": st.integers(-1, 2**32),
    "hidden_size": st.integers(-1, 2**21),
    "rope_theta": st.floats(allow_nan=True, allow_infinity=True),
    "rms_norm_eps": st.floats(allow_nan=True, allow_infinity=True),
}


@given(st.fixed_dictionaries({}, optional=CONFIG_FIELDS))
def test_any_config_is_valid_or_names_its_fields(changes):
    base = dict(total_token=10, depth=3, top_k=3, vocab_size=100, hidden_size=8)
    try:
        cfg = FrontierConfig(**{**base, **changes})
    except ConfigError as exc:
        assert any(f in str(exc) for f in [*changes, "total_token", "top_k"]), str(exc)
        return
    assert 2 <= cfg.total_token <= min(4096, cfg.max_total_token) and 1 <= cfg.depth <= 256
    assert cfg.top_k <= min(256, cfg.vocab_size) and math.isfinite(cfg.rope_theta) and cfg.rope_theta > 0
    assert math.isfinite(cfg.rms_norm_eps) and cfg.rms_norm_eps > 0
    # and the stub drafts it (the cheap end-to-end check that no bound is missing)
    if cfg.num_candidates <= 20000 and cfg.hidden_size <= 64:
        frontier_generate(cfg, torch.zeros(1, 1, cfg.feature_size), backend="stub").check_invariants(
            total_token=cfg.total_token, depth=cfg.depth, top_k=cfg.top_k)
