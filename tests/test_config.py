"""FrontierConfig: the five tree fields suffice, derived defaults, cross-field rules and their messages."""

from __future__ import annotations

import pickle

import pytest

import frontier
from frontier import ConfigError, FrontierConfig, FrontierError

BASE = dict(total_token=60, depth=5, top_k=10, vocab_size=32000, hidden_size=4096)


def test_five_fields_are_enough_and_defaults_are_derived():
    cfg = FrontierConfig(**BASE)
    assert (cfg.total_token, cfg.depth, cfg.top_k, cfg.vocab_size, cfg.hidden_size) == (60, 5, 10, 32000, 4096)
    assert cfg.architecture == "eagle3"
    assert cfg.feature_size == 3 * 4096  # EAGLE-3 taps three target layers
    assert cfg.target_vocab_size == 32000
    assert cfg.fc_bias is False and cfg.num_layers == 1
    assert cfg.num_attention_heads is None and cfg.head_dim is None
    assert not cfg.has_layer_dims
    assert cfg.num_candidates == 10 + 5 * 100
    assert cfg.max_total_token == 1 + 10 + 5 * 100
    assert cfg.rope_scaling_factor == 1.0


def test_layer_dims_defaults():
    cfg = FrontierConfig(**BASE, num_attention_heads=32, intermediate_size=14336)
    assert cfg.num_key_value_heads == 32 and cfg.head_dim == 128 and cfg.has_layer_dims
    cfg = FrontierConfig(**BASE, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336)
    assert cfg.num_key_value_heads == 8 and cfg.head_dim == 128
    # An explicit head_dim need not be hidden_size / heads (some heads are built that way).
    cfg = FrontierConfig(**BASE, num_attention_heads=24, head_dim=128, intermediate_size=8)
    assert cfg.head_dim == 128
    e2 = FrontierConfig(**BASE, architecture="eagle2")
    assert e2.feature_size == 4096 and e2.fc_bias is True


def test_require_layer_dims_names_missing_fields():
    cfg = FrontierConfig(**BASE)
    with pytest.raises(ConfigError, match="num_attention_heads, intermediate_size"):
        cfg.require_layer_dims("backend 'torch_ref'")
    FrontierConfig(**BASE, num_attention_heads=32, intermediate_size=64).require_layer_dims()


def test_frozen_and_replace():
    cfg = FrontierConfig(**BASE, num_attention_heads=32, intermediate_size=64)
    with pytest.raises(ConfigError, match=r"frozen.*depth=3.*replace"):
        cfg.depth = 3
    assert cfg.depth == 5
    deeper = cfg.replace(depth=7, total_token=80)
    assert (deeper.depth, deeper.total_token, cfg.depth) == (7, 80, 5)
    # Derived defaults follow the changed fields (they were not set explicitly).
    wider = cfg.replace(hidden_size=2048)
    assert wider.feature_size == 3 * 2048 and wider.head_dim == 64
    with pytest.raises(ConfigError, match="total_token=600"):
        cfg.replace(total_token=600)


def test_equality_hash_and_round_trips():
    cfg = FrontierConfig(**BASE, num_attention_heads=32, num_key_value_heads=8, intermediate_size=64)
    again = FrontierConfig(**cfg.model_dump())
    assert again == cfg and hash(again) == hash(cfg)
    assert FrontierConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg != cfg.replace(top_k=9)


@pytest.mark.parametrize(
    "changes,needles",
    [
        # positivity, each field named with its value
        (dict(depth=0), ["depth must be positive", "depth=0"]),
        (dict(top_k=-2), ["top_k must be positive", "top_k=-2"]),
        (dict(vocab_size=0), ["vocab_size must be positive", "vocab_size=0"]),
        (dict(hidden_size=-1), ["hidden_size must be positive", "hidden_size=-1"]),
        (dict(total_token=0), ["total_token must be positive", "total_token=0"]),
        (dict(total_token=1), ["at least 2", "total_token=1"]),
        (dict(num_attention_heads=0), ["num_attention_heads must be positive", "num_attention_heads=0"]),
        (dict(intermediate_size=-5), ["intermediate_size must be positive", "intermediate_size=-5"]),
        (dict(feature_size=0), ["feature_size must be positive", "feature_size=0"]),
        (dict(rope_theta=0.0), ["rope_theta must be positive", "rope_theta=0.0"]),
        (dict(rms_norm_eps=-1e-6), ["rms_norm_eps must be positive"]),
        (dict(num_layers=0), ["num_layers must be positive", "num_layers=0"]),
        # the tree-size rule: T - 1 <= K + D*K^2
        (dict(total_token=512), ["total_token - 1 cannot exceed top_k + depth * top_k**2", "total_token=512",
                                 "top_k=10", "depth=5", "<= 511"]),
        (dict(top_k=1, depth=3, total_token=6), ["total_token=6", "top_k=1", "depth=3", "<= 5"]),
        # top_k <= vocab_size
        (dict(vocab_size=8, total_token=5), ["top_k must be <= vocab_size", "top_k=10", "vocab_size=8"]),
        # heads divide hidden, kv heads divide heads
        (dict(num_attention_heads=3), ["num_attention_heads must divide hidden_size", "hidden_size=4096",
                                       "num_attention_heads=3"]),
        (dict(num_attention_heads=32, num_key_value_heads=5), ["num_key_value_heads must divide num_attention_heads",
                                                               "num_attention_heads=32", "num_key_value_heads=5"]),
        (dict(num_key_value_heads=8), ["without num_attention_heads"]),
        (dict(num_attention_heads=4, head_dim=7), ["head_dim must be even", "head_dim=7"]),
        # vocabularies and architectures
        (dict(target_vocab_size=1000), ["vocab_size (draft vocabulary) cannot exceed target_vocab_size",
                                        "vocab_size=32000", "target_vocab_size=1000"]),
        (dict(num_layers=2), ["architecture='eagle3' has exactly one layer", "num_layers=2"]),
        (dict(fc_bias=True), ["architecture='eagle3' has no fc bias"]),
        (dict(architecture="eagle2", target_vocab_size=128256), ["vocab_size must equal target_vocab_size",
                                                                 "vocab_size=32000", "target_vocab_size=128256"]),
        (dict(architecture="eagle2", feature_size=12288), ["feature_size must equal hidden_size",
                                                           "feature_size=12288", "hidden_size=4096"]),
        (dict(architecture="eagle4"), ["architecture", "eagle3", "eagle2"]),
        (dict(rope_scaling={"type": "yarn", "factor": 4.0}), ["rope_scaling type 'yarn' is not supported"]),
        (dict(rope_scaling={"type": "linear"}), ["positive 'factor'"]),
        # types
        (dict(depth=2.5), ["depth", "integer", "depth=2.5"]),
        (dict(top_k="ten"), ["top_k", "integer", "top_k='ten'"]),
    ],
)
def test_rule_violations_name_fields_and_values(changes, needles):
    with pytest.raises(ConfigError) as info:
        FrontierConfig(**{**BASE, **changes})
    msg = str(info.value)
    assert msg.startswith("invalid FrontierConfig: ")
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_several_problems_are_reported_together():
    with pytest.raises(ConfigError) as info:
        FrontierConfig(total_token=60, depth=0, top_k=0, vocab_size=10, hidden_size=8)
    msg = str(info.value)
    assert "depth must be positive, got depth=0" in msg and "top_k must be positive, got top_k=0" in msg


def test_unknown_and_missing_fields():
    with pytest.raises(ConfigError, match=r"unknown field 'topk' \(FrontierConfig rejects unknown fields\)"):
        FrontierConfig(**BASE, topk=3)
    partial = dict(BASE)
    del partial["hidden_size"]
    with pytest.raises(ConfigError, match="missing required field 'hidden_size'"):
        FrontierConfig(**partial)


@pytest.mark.parametrize(
    "fields",
    [
        dict(total_token=2, depth=1, top_k=1, vocab_size=1, hidden_size=1),  # the smallest config
        dict(total_token=3, depth=1, top_k=1, vocab_size=2, hidden_size=2),  # top_k=1: largest T is 1 + 1 + D
        dict(total_token=2, depth=1, top_k=10, vocab_size=10, hidden_size=8),  # top_k == vocab_size
        dict(total_token=1 + 10 + 5 * 100, depth=5, top_k=10, vocab_size=32000, hidden_size=16),  # largest T
        dict(total_token=1 + 3 + 1 * 9, depth=1, top_k=3, vocab_size=7, hidden_size=3),  # depth=1, largest T
    ],
)
def test_edge_configs_are_accepted(fields):
    cfg = FrontierConfig(**fields)
    assert cfg.total_token <= cfg.max_total_token
    with pytest.raises(ConfigError, match=f"total_token={cfg.max_total_token + 1}"):
        cfg.replace(total_token=cfg.max_total_token + 1)


def test_config_error_is_in_the_hierarchy():
    assert issubclass(ConfigError, FrontierError) and issubclass(ConfigError, ValueError)
    for name in ("InputError", "BackendNotFoundError", "BackendUnavailableError", "RegistryError",
                 "WeightsError", "CacheError", "InvariantError", "KernelError"):
        assert issubclass(getattr(frontier, name), FrontierError), name


def test_top_level_exports():
    for name in ("FrontierConfig", "Frontier", "frontier_generate", "register_backend", "get_backend",
                 "available_backends", "FrontierError", "ConfigError", "InputError"):
        assert name in frontier.__all__ and hasattr(frontier, name), name


@pytest.mark.parametrize("bad", [True, "5", 2.0])
def test_integer_fields_reject_bools_strings_and_floats(bad):
    with pytest.raises(ConfigError, match=r"top_k: Input should be a valid integer"):
        FrontierConfig(total_token=5, depth=2, top_k=bad, vocab_size=10, hidden_size=8)


def test_integer_like_values_are_accepted_as_int():
    import numpy as np

    cfg = FrontierConfig(total_token=np.int64(5), depth=np.int32(2), top_k=2, vocab_size=10, hidden_size=8, rope_theta=500000)
    assert type(cfg.total_token) is int and type(cfg.depth) is int and cfg.rope_theta == 500000.0


def test_model_validate_raises_config_error_once_prefixed():
    with pytest.raises(ConfigError) as info:
        FrontierConfig.model_validate({"total_token": 5})
    assert str(info.value).count("invalid FrontierConfig") == 1
    assert "missing required field 'depth'" in str(info.value)
