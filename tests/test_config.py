"""FrontierConfig: the five tree fields suffice, derived defaults, cross-field rules and their messages."""

from __future__ import annotations

import pickle

import pytest

import frontier
from frontier import ConfigError, FrontierConfig, FrontierError

from eagle_module import eagle_style_module

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


def test_rope_scaling_is_frozen_with_the_config():
    """rope_scaling is the one field whose value could change in place; it refuses, so the config
    keeps the hash and the checks it was made with, and copies and pickles stay equal to it."""
    import copy

    given = {"type": "linear", "factor": 2.0}
    cfg = FrontierConfig(**BASE, num_attention_heads=32, intermediate_size=64, rope_scaling=given)
    given["factor"] = 0.0  # the caller's dict is not the config's
    h = hash(cfg)
    for change in (lambda d: d.update(factor=0.0), lambda d: d.__setitem__("type", "yarn"), lambda d: d.pop("factor"),
                   lambda d: d.clear(), lambda d: d.setdefault("x", 1), lambda d: d.popitem(),
                   lambda d: d.__delitem__("type")):
        with pytest.raises(ConfigError, match=r"frozen: rope_scaling=\{'type': 'linear', 'factor': 2\.0\} cannot change"):
            change(cfg.rope_scaling)
    assert cfg.rope_scaling == {"type": "linear", "factor": 2.0} and hash(cfg) == h
    assert copy.deepcopy(cfg) == cfg and pickle.loads(pickle.dumps(cfg)) == cfg and hash(copy.copy(cfg)) == h
    assert cfg.replace(rope_scaling={"type": "linear", "factor": 4.0}).rope_scaling_factor == 4.0
    assert cfg.model_dump()["rope_scaling"] == {"type": "linear", "factor": 2.0}


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


# ----------------------------------------------------------------------------------------------
# Every rule's whole message (on top of BASE: T=60, D=5, K=10, V=32000, H=4096)
# ----------------------------------------------------------------------------------------------
EXACT = [
    (dict(depth=0), 'depth must be positive, got depth=0'),
    (dict(top_k=-2), 'top_k must be positive, got top_k=-2'),
    (dict(vocab_size=0), 'vocab_size must be positive, got vocab_size=0'),
    (dict(hidden_size=-1), 'hidden_size must be positive, got hidden_size=-1'),
    (dict(total_token=0), 'total_token must be positive, got total_token=0; total_token counts the root, so it must be at least 2, got total_token=0'),
    (dict(total_token=1), 'total_token counts the root, so it must be at least 2, got total_token=1'),
    (dict(num_layers=0), 'num_layers must be positive, got num_layers=0'),
    (dict(num_attention_heads=0), 'num_attention_heads must be positive, got num_attention_heads=0'),
    (dict(num_attention_heads=4, num_key_value_heads=0), 'num_key_value_heads must be positive, got num_key_value_heads=0'),
    (dict(num_attention_heads=4, head_dim=0), 'head_dim must be positive, got head_dim=0'),
    (dict(intermediate_size=-5), 'intermediate_size must be positive, got intermediate_size=-5'),
    (dict(feature_size=0), 'feature_size must be positive, got feature_size=0'),
    (dict(target_vocab_size=0), 'target_vocab_size must be positive, got target_vocab_size=0'),
    (dict(rope_theta=0.0), 'rope_theta must be positive and finite, got rope_theta=0.0'),
    (dict(rope_theta=-1.0), 'rope_theta must be positive and finite, got rope_theta=-1.0'),
    (dict(rope_theta=float("inf")), 'rope_theta must be positive and finite, got rope_theta=inf'),
    (dict(rms_norm_eps=-1e-6), 'rms_norm_eps must be positive and finite, got rms_norm_eps=-1e-06'),
    (dict(rms_norm_eps=float("nan")), 'rms_norm_eps must be positive and finite, got rms_norm_eps=nan'),
    (dict(total_token=4097), 'total_token must be <= 4096, got total_token=4097'),
    (dict(depth=257), 'depth must be <= 256, got depth=257'),
    (dict(top_k=257, vocab_size=32000), 'top_k must be <= 256, got top_k=257'),
    (dict(vocab_size=2**31, target_vocab_size=2**31 - 1), 'vocab_size must be <= 2147483647, got vocab_size=2147483648'),
    (dict(target_vocab_size=2**31), 'target_vocab_size must be <= 2147483647, got target_vocab_size=2147483648'),
    (dict(hidden_size=2**20 + 1), 'hidden_size must be <= 1048576, got hidden_size=1048577'),
    (dict(feature_size=2**20 + 1), 'feature_size must be <= 1048576, got feature_size=1048577'),
    (dict(intermediate_size=2**20 + 1), 'intermediate_size must be <= 1048576, got intermediate_size=1048577'),
    (dict(num_attention_heads=4, head_dim=2**20 + 2), 'head_dim must be <= 1048576, got head_dim=1048578'),
    (dict(num_attention_heads=4097), 'num_attention_heads must be <= 4096, got num_attention_heads=4097'),
    (dict(num_attention_heads=4, num_key_value_heads=4097), 'num_key_value_heads must be <= 4096, got num_key_value_heads=4097'),
    (dict(architecture="eagle2", num_layers=257), 'num_layers must be <= 256, got num_layers=257'),
    (dict(top_k=256, depth=256), 'the candidate list top_k + depth * top_k**2 must hold at most 16777216 entries, got 16777472 (top_k=256, depth=256)'),
    (dict(total_token=512), 'total_token - 1 cannot exceed top_k + depth * top_k**2 (the candidate list length): total_token=512, top_k=10, depth=5, so total_token must be <= 511'),
    (dict(top_k=1, depth=3, total_token=6), 'total_token - 1 cannot exceed top_k + depth * top_k**2 (the candidate list length): total_token=6, top_k=1, depth=3, so total_token must be <= 5'),
    (dict(vocab_size=8, total_token=5), 'top_k must be <= vocab_size, got top_k=10, vocab_size=8'),
    (dict(num_attention_heads=3), 'num_attention_heads must divide hidden_size, got hidden_size=4096, num_attention_heads=3'),
    (dict(num_attention_heads=32, num_key_value_heads=5), 'num_key_value_heads must divide num_attention_heads, got num_attention_heads=32, num_key_value_heads=5'),
    (dict(num_key_value_heads=8), 'num_key_value_heads/head_dim given without num_attention_heads'),
    (dict(head_dim=64), 'num_key_value_heads/head_dim given without num_attention_heads'),
    (dict(num_attention_heads=4, head_dim=7), 'head_dim must be even for rotary embeddings, got head_dim=7'),
    (dict(target_vocab_size=1000), 'vocab_size (draft vocabulary) cannot exceed target_vocab_size, got vocab_size=32000, target_vocab_size=1000'),
    (dict(feature_size=4096), "architecture='eagle3' applies fc only to F-wide target features, so feature_size must differ from hidden_size (EAGLE-3 uses 3*hidden), got feature_size=4096, hidden_size=4096"),
    (dict(num_layers=2), "architecture='eagle3' has exactly one layer, got num_layers=2"),
    (dict(fc_bias=True), "architecture='eagle3' has no fc bias, got fc_bias=True"),
    (dict(architecture="eagle2", target_vocab_size=128256), "architecture='eagle2' uses the target's lm_head, so vocab_size must equal target_vocab_size, got vocab_size=32000, target_vocab_size=128256"),
    (dict(architecture="eagle2", feature_size=12288), "architecture='eagle2' takes the target's last hidden state, so feature_size must equal hidden_size, got feature_size=12288, hidden_size=4096"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0}), "rope_scaling type 'yarn' is not supported (supported: None, 'linear'), got rope_scaling={'type': 'yarn', 'factor': 4.0}"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 4.0}), "rope_scaling type 'dynamic' is not supported (supported: None, 'linear'), got rope_scaling={'rope_type': 'dynamic', 'factor': 4.0}"),
    (dict(rope_scaling={"rope_type": "yarn", "type": "linear", "factor": 4.0}), "rope_scaling type 'yarn' is not supported (supported: None, 'linear'), got rope_scaling={'rope_type': 'yarn', 'type': 'linear', 'factor': 4.0}"),
    (dict(rope_scaling={"factor": 4.0}), "rope_scaling type None is not supported (supported: None, 'linear'), got rope_scaling={'factor': 4.0}"),
    (dict(rope_scaling={"type": "linear"}), "rope_scaling 'linear' needs a finite positive 'factor', got rope_scaling={'type': 'linear'}"),
    (dict(rope_scaling={"type": "linear", "factor": 0}), "rope_scaling 'linear' needs a finite positive 'factor', got rope_scaling={'type': 'linear', 'factor': 0}"),
    (dict(rope_scaling={"type": "linear", "factor": -2.0}), "rope_scaling 'linear' needs a finite positive 'factor', got rope_scaling={'type': 'linear', 'factor': -2.0}"),
    (dict(rope_scaling={"type": "linear", "factor": float("inf")}), "rope_scaling 'linear' needs a finite positive 'factor', got rope_scaling={'type': 'linear', 'factor': inf}"),
    (dict(rope_scaling={"type": "linear", "factor": True}), "rope_scaling 'linear' needs a finite positive 'factor', got rope_scaling={'type': 'linear', 'factor': True}"),
    (dict(rope_scaling={"type": "linear", "factor": "2"}), "rope_scaling 'linear' needs a finite positive 'factor', got rope_scaling={'type': 'linear', 'factor': '2'}"),
    (dict(architecture="eagle4"), "architecture: Input should be 'eagle3' or 'eagle2' (got architecture='eagle4')"),
    (dict(depth=2.5), 'depth: Input should be a valid integer (got depth=2.5)'),
    (dict(top_k="ten"), "top_k: Input should be a valid integer (got top_k='ten')"),
    (dict(rope_scaling=[1]), 'rope_scaling: Input should be a valid dictionary (got rope_scaling=[1])'),
]


@pytest.mark.parametrize("changes,problem", EXACT, ids=[str(c) for c, _ in EXACT])
def test_each_rule_has_its_whole_message(changes, problem):
    with pytest.raises(ConfigError) as info:
        FrontierConfig(**{**BASE, **changes})
    assert str(info.value) == "invalid FrontierConfig: " + problem


def test_upper_bounds_are_inclusive():
    cfg = FrontierConfig(total_token=4096, depth=41, top_k=10, vocab_size=2**31 - 1, hidden_size=2**20,
                         intermediate_size=2**20, num_attention_heads=4096, num_key_value_heads=4096)
    assert (cfg.total_token, cfg.vocab_size, cfg.target_vocab_size, cfg.head_dim) == (4096, 2**31 - 1, 2**31 - 1, 256)
    cfg = FrontierConfig(total_token=60, depth=256, top_k=1, vocab_size=10, hidden_size=8, feature_size=2**20)
    assert cfg.depth == 256 and cfg.feature_size == 2**20
    cfg = FrontierConfig(total_token=60, depth=255, top_k=256, vocab_size=256, hidden_size=8)  # 16711936 candidates
    assert cfg.num_candidates == 256 + 255 * 256**2
    cfg = FrontierConfig(total_token=7, depth=1, top_k=2, vocab_size=10, hidden_size=8, architecture="eagle2", num_layers=256,
                         num_attention_heads=1, head_dim=2**20)
    assert cfg.num_layers == 256 and cfg.head_dim == 2**20


def test_float_fields_at_their_limits():
    cfg = FrontierConfig(**BASE, rope_theta=1e-300, rms_norm_eps=1e300)
    assert cfg.rope_theta == 1e-300 and cfg.rms_norm_eps == 1e300


def test_linear_rope_scaling_under_either_key():
    cfg = FrontierConfig(**BASE, rope_scaling={"type": "linear", "factor": 2.0})
    assert cfg.rope_scaling_factor == 2.0
    cfg = FrontierConfig(**BASE, rope_scaling={"rope_type": "linear", "factor": 4})
    assert cfg.rope_scaling_factor == 4.0 and type(cfg.rope_scaling_factor) is float
    # rope_type (transformers' newer key) wins over type
    cfg = FrontierConfig(**BASE, rope_scaling={"rope_type": "linear", "type": "yarn", "factor": 0.5})
    assert cfg.rope_scaling_factor == 0.5
    assert FrontierConfig(**BASE, rope_scaling=None).rope_scaling_factor == 1.0


def test_explicit_eagle3_feature_size_and_eagle2_defaults():
    cfg = FrontierConfig(**BASE, feature_size=2 * 4096)
    assert cfg.feature_size == 8192
    e2 = FrontierConfig(**BASE, architecture="eagle2", num_layers=3, fc_bias=False)
    assert (e2.feature_size, e2.target_vocab_size, e2.num_layers, e2.fc_bias) == (4096, 32000, 3, False)
    e3 = FrontierConfig(**BASE, target_vocab_size=128256, fc_bias=False)
    assert e3.target_vocab_size == 128256 and e3.fc_bias is False


def test_derived_head_dim_and_kv_heads():
    cfg = FrontierConfig(**BASE, num_attention_heads=16)
    assert cfg.head_dim == 256 and cfg.num_key_value_heads == 16
    cfg = FrontierConfig(**BASE, num_attention_heads=16, num_key_value_heads=1, head_dim=6)
    assert cfg.head_dim == 6 and cfg.num_key_value_heads == 1


def test_frozen_message_and_require_layer_dims_messages():
    cfg = FrontierConfig(**BASE)
    with pytest.raises(ConfigError, match=r"^FrontierConfig is frozen: cannot set depth=3; use cfg\.replace\(depth=\.\.\.\) for a copy$"):
        cfg.depth = 3
    with pytest.raises(ConfigError, match=r"^this backend runs the draft layer and needs num_attention_heads, intermediate_size "
                                          r"in FrontierConfig \(only the tree fields were given\); use "
                                          r"FrontierConfig\.from_ea_layer\(\.\.\.\) or set them$"):
        cfg.require_layer_dims()
    with pytest.raises(ConfigError, match=r"^backend 'x' runs the draft layer and needs intermediate_size in FrontierConfig "):
        FrontierConfig(**BASE, num_attention_heads=32).require_layer_dims("backend 'x'")
    assert FrontierConfig(**BASE, num_attention_heads=32).has_layer_dims is False
    assert FrontierConfig(**BASE, intermediate_size=32).has_layer_dims is False


def test_hash_is_the_hash_of_the_json_and_works_with_rope_scaling():
    cfg = FrontierConfig(**BASE, rope_scaling={"type": "linear", "factor": 2.0})
    assert hash(cfg) == hash(cfg.model_dump_json())
    assert hash(cfg) == hash(FrontierConfig(**BASE, rope_scaling={"type": "linear", "factor": 2.0}))
    assert len({cfg, FrontierConfig(**BASE), FrontierConfig(**BASE)}) == 2


def test_integer_like_fields():
    import numpy as np
    import torch

    cfg = FrontierConfig(**{**BASE, "top_k": np.int16(4), "vocab_size": torch.tensor(50), "hidden_size": np.uint32(8)})
    assert (cfg.top_k, cfg.vocab_size, cfg.hidden_size) == (4, 50, 8)
    assert all(type(v) is int for v in (cfg.top_k, cfg.vocab_size, cfg.hidden_size))
    assert FrontierConfig(**BASE, head_dim=None, num_attention_heads=None).head_dim is None
    with pytest.raises(ConfigError, match=r"^invalid FrontierConfig: depth: Input should be a valid integer \(got depth=np\.float64\(2\.0\)\)$"):
        FrontierConfig(**{**BASE, "depth": np.float64(2.0)})


def test_unknown_missing_and_several_type_errors_are_joined():
    partial = dict(BASE, topk=3, depth="5", top_k=1.5)
    del partial["hidden_size"]
    with pytest.raises(ConfigError) as info:
        FrontierConfig(**partial)
    assert str(info.value) == (
        "invalid FrontierConfig: depth: Input should be a valid integer (got depth='5'); "
        "top_k: Input should be a valid integer (got top_k=1.5); missing required field 'hidden_size'; "
        "unknown field 'topk' (FrontierConfig rejects unknown fields)"
    )


def test_model_validate_accepts_a_mapping():
    cfg = FrontierConfig.model_validate(dict(BASE, num_attention_heads=32))
    assert isinstance(cfg, FrontierConfig) and cfg.head_dim == 128
    with pytest.raises(ConfigError, match=r"^invalid FrontierConfig: depth must be positive, got depth=0$"):
        FrontierConfig.model_validate(dict(BASE, depth=0))


def test_replace_keeps_explicit_fields_and_rederives_the_rest():
    cfg = FrontierConfig(**BASE, num_attention_heads=32, num_key_value_heads=8, intermediate_size=64)
    narrower = cfg.replace(hidden_size=2048, num_attention_heads=16)
    assert (narrower.head_dim, narrower.num_key_value_heads, narrower.feature_size) == (128, 8, 6144)
    assert cfg.replace() == cfg


def test_from_ea_layer_reads_an_eagle_module():
    from frontier.random_head import random_config, random_weights

    cfg = random_config(total_token=20, depth=4, top_k=4, vocab_size=64, target_vocab_size=150, hidden_size=32,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=48)

    class HfConfig:
        num_attention_heads, num_key_value_heads = 4, 2
        rope_theta, rms_norm_eps, rope_scaling = cfg.rope_theta, cfg.rms_norm_eps, None
        vocab_size, draft_vocab_size = 150, 64

    layer = eagle_style_module(random_weights(cfg, seed=1).state_dict(), HfConfig())
    derived = FrontierConfig.from_ea_layer(layer, total_token=20, depth=4, top_k=4)
    assert derived == cfg
    other = FrontierConfig.from_ea_layer(layer, total_token=9, depth=2, top_k=3, rope_theta=500.0)
    assert (other.total_token, other.depth, other.top_k, other.rope_theta) == (9, 2, 3, 500.0)
    assert other.replace(total_token=20, depth=4, top_k=4, rope_theta=cfg.rope_theta) == cfg


def test_model_validate_passes_pydantic_options_on():
    from types import SimpleNamespace

    cfg = FrontierConfig.model_validate(SimpleNamespace(**BASE), from_attributes=True)
    assert cfg == FrontierConfig(**BASE)
    with pytest.raises(ConfigError, match=r"^invalid FrontierConfig: Input should be a valid dictionary or instance of FrontierConfig"):
        FrontierConfig.model_validate(SimpleNamespace(**BASE))


def test_cross_field_problems_are_reported_together():
    with pytest.raises(ConfigError) as info:
        FrontierConfig(total_token=5, depth=2, top_k=10, vocab_size=8, hidden_size=8, target_vocab_size=4)
    assert str(info.value) == (
        "invalid FrontierConfig: top_k must be <= vocab_size, got top_k=10, vocab_size=8; "
        "vocab_size (draft vocabulary) cannot exceed target_vocab_size, got vocab_size=8, target_vocab_size=4"
    )


def test_nested_error_locations_are_dotted():
    with pytest.raises(ConfigError) as info:
        FrontierConfig(**BASE, rope_scaling={1: 2.0})
    assert str(info.value) == (
        "invalid FrontierConfig: rope_scaling.1.[key]: Input should be a valid string (got rope_scaling.1.[key]=1)"
    )
