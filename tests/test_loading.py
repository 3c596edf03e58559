"""Loading EAGLE heads from local directories: round trips through the published layouts, every
validation error's message, atomicity, ``frontier inspect`` and ``frontier demo --head``.

One file because every test builds its checkpoint with the same writers at the top (published
layouts, shards, broken variants)."""

from __future__ import annotations

import json
import re
import os
import warnings
from pathlib import Path

import pytest
import torch

import frontier
from frontier import DraftHead, InputError, WeightsError, frontier_generate, load_draft_head
from frontier.loading import bandwidth_floor_ms, describe_draft_head, save_draft_head
from frontier.random_head import random_inputs, random_weights

from loading_support import head_cfg, needs_torch_ref, torch_ref_ok


# ----------------------------------------------------------------------------------------------
# helpers: heads and fake target checkpoints on disk
# ----------------------------------------------------------------------------------------------
def _write_tensors(directory: Path, tensors: dict, fmt: str, shards: int) -> None:
    from safetensors.torch import save_file

    items = list(tensors.items())
    ext, stem, single = ("safetensors", "model", "model.safetensors") if fmt == "safetensors" else ("bin", "pytorch_model", "pytorch_model.bin")

    def write(path: Path, part: dict) -> None:
        if fmt == "safetensors":
            save_file({k: v.contiguous() for k, v in part.items()}, str(path))
        else:
            torch.save(part, str(path))

    if shards == 1:
        write(directory / single, dict(items))
        return
    wmap = {}
    for i in range(shards):
        name = f"{stem}-{i + 1:05d}-of-{shards:05d}.{ext}"
        part = dict(items[i::shards])
        write(directory / name, part)
        wmap.update({k: name for k in part})
    (directory / f"{single}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))


def _write_target(directory: Path, emb: torch.Tensor, lm: torch.Tensor | None, *, fmt="safetensors", shards=1, tie=False, hidden=None, vocab=None):
    """A fake HF target checkpoint: config.json + model.embed_tokens.weight (+ lm_head) + a filler layer."""
    directory.mkdir(parents=True, exist_ok=True)
    vt, h = emb.shape
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden or h, "vocab_size": vocab or vt, "tie_word_embeddings": tie}
    (directory / "config.json").write_text(json.dumps(cfg))
    tensors = {"model.embed_tokens.weight": emb.clone(), "model.layers.0.mlp.down_proj.weight": torch.randn(h, 8), "model.norm.weight": torch.ones(h)}
    if lm is not None:
        tensors["lm_head.weight"] = lm.clone()
    _write_tensors(directory, tensors, fmt, shards)
    return directory


def _head_files(path: Path) -> dict:
    """key -> (file, tensor) of a saved head (all shards), for tampering tests."""
    out = {}
    for f in sorted(path.iterdir()):
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            out.update({k: (f, v) for k, v in load_file(str(f)).items()})
        elif f.suffix == ".bin":
            out.update({k: (f, v) for k, v in torch.load(str(f), weights_only=True).items()})
    return out


def _rewrite(path: Path, change) -> None:
    """Apply ``change(dict key->tensor) -> dict`` per weights file (keeps the layout)."""
    from safetensors.torch import load_file, save_file

    for f in sorted(path.iterdir()):
        if f.suffix == ".safetensors":
            state = change(dict(load_file(str(f))))
            save_file({k: v.contiguous() for k, v in state.items()}, str(f))
        elif f.suffix == ".bin":
            state = change(dict(torch.load(str(f), weights_only=True)))
            torch.save(state, str(f))


def _set_config(path: Path, **fields) -> None:
    p = path / "config.json"
    data = json.loads(p.read_text())
    for k, v in fields.items():
        if v is _DELETE:
            data.pop(k, None)
        else:
            data[k] = v
    p.write_text(json.dumps(data))


_DELETE = object()


def _saved(tmp_path, arch="eagle3", *, fmt="safetensors", shards=1, include_embedding=True, seed=0, name="head", **cfg_kw):
    cfg = head_cfg(arch, **cfg_kw)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0)
    path = save_draft_head(w, cfg, tmp_path / name, format=fmt, shards=shards, include_embedding=include_embedding)
    return cfg, w, path


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k


def _draft(cfg, weights, seed):
    ids, feats = random_inputs(cfg, context=7 + seed, seed=100 + seed)
    return frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=weights)


# ----------------------------------------------------------------------------------------------
# round trips
# ----------------------------------------------------------------------------------------------
# (architecture, format, shards, where the embedding / eagle2 lm_head comes from, config extras)
ROUND_TRIPS = [
    ("eagle3", "safetensors", 1, "target_dir", dict(rope_theta=500000.0)),
    ("eagle3", "safetensors", 3, "target_dir_sharded", dict(rms_norm_eps=1e-5)),
    ("eagle3", "bin", 1, "in_head", dict(rope_scaling={"type": "linear", "factor": 2.0})),
    ("eagle3", "bin", 4, "target_dir_bin_sharded", dict(v=90, vt=90)),  # V == V_t: no d2t
    ("eagle3", "safetensors", 2, "target_model", dict(feature_size=3 * 20)),  # target_hidden_size != H
    ("eagle2", "safetensors", 1, "target_dir", dict(layers=1)),
    ("eagle2", "safetensors", 3, "target_dir_sharded", dict(layers=2, rope_theta=500000.0)),
    ("eagle2", "bin", 1, "target_model", dict(layers=2, fc_bias=False)),
    ("eagle2", "bin", 2, "in_head_and_tensor", dict(layers=3)),
]


def _target_model(emb: torch.Tensor, lm: torch.Tensor):
    transformers = pytest.importorskip("transformers")
    vt, h = emb.shape
    tcfg = transformers.LlamaConfig(
        vocab_size=vt, hidden_size=h, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    model = transformers.LlamaForCausalLM(tcfg)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(emb)
        model.get_output_embeddings().weight.copy_(lm)
    return model


@pytest.mark.parametrize("case", ROUND_TRIPS, ids=lambda c: f"{c[0]}-{c[1]}-x{c[2]}-{c[3]}")
def test_round_trip_loads_identical_weights_and_config(tmp_path, case):
    arch, fmt, shards, source, extra = case
    cfg = head_cfg(arch, **extra)
    w = random_weights(cfg, seed=shards, lm_head_scale=6.0)
    in_head = source.startswith("in_head")
    path = save_draft_head(w, cfg, tmp_path / "head", format=fmt, shards=shards, include_embedding=in_head)

    # the published layout
    names = {p.name for p in path.iterdir()}
    single = "model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"
    assert "config.json" in names
    assert (single in names) == (shards == 1)
    assert (f"{single}.index.json" in names) == (shards > 1)
    assert len([n for n in names if n.endswith("." + fmt)]) == shards
    conf = json.loads((path / "config.json").read_text())
    assert conf["vocab_size"] == cfg.target_vocab_size and conf["hidden_size"] == cfg.hidden_size
    if arch == "eagle3":
        assert conf["draft_vocab_size"] == cfg.vocab_size
        assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    else:
        assert conf["bias"] == cfg.fc_bias and conf["num_hidden_layers"] == cfg.num_layers
    keys = set(_head_files(path))
    assert ("embed_tokens.weight" in keys) == in_head
    assert "lm_head.weight" in keys if arch == "eagle3" else "lm_head.weight" not in keys
    assert ("d2t" in keys) == ("t2d" in keys) == (w.d2t is not None)

    # the target side
    lm = w.lm_head if arch == "eagle2" else None
    kwargs = {}
    if source.startswith("target_dir"):
        tfmt = "bin" if source.endswith("bin_sharded") else "safetensors"
        tshards = 3 if "sharded" in source else 1
        kwargs["target"] = _write_target(tmp_path / "target", w.embed_tokens, lm, fmt=tfmt, shards=tshards, hidden=cfg.feature_size // 3 if arch == "eagle3" else None)
    elif source == "target_model":
        lm_t = lm if lm is not None else torch.randn(cfg.target_vocab_size, w.embed_tokens.shape[1])
        if arch == "eagle3" and cfg.feature_size != 3 * cfg.hidden_size:
            # the target's hidden size is F/3 != H: its embedding cannot serve the head, which must ship its own
            path = save_draft_head(w, cfg, tmp_path / "head", format=fmt, shards=shards, include_embedding=True, overwrite=True)
            model = _target_model(torch.randn(cfg.target_vocab_size, cfg.feature_size // 3), torch.randn(cfg.target_vocab_size, cfg.feature_size // 3))
        else:
            model = _target_model(w.embed_tokens, lm_t)
        kwargs["target"] = model
    elif source == "in_head_and_tensor":
        kwargs["lm_head"] = torch.nn.Linear(cfg.hidden_size, cfg.target_vocab_size, bias=False)
        with torch.no_grad():
            kwargs["lm_head"].weight.copy_(w.lm_head)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean head loads without a single warning
        head = load_draft_head(path, **kwargs)
    assert isinstance(head, DraftHead) and head.architecture == arch and head.path == path
    _assert_same_weights(head.weights, w)
    new_cfg = head.config(total_token=cfg.total_token, depth=cfg.depth, top_k=cfg.top_k)
    assert new_cfg == cfg
    assert head.hf_config["hidden_size"] == cfg.hidden_size

    if torch_ref_ok():
        for seed in range(2):
            a = _draft(cfg, w, seed)
            b = _draft(new_cfg, head.weights, seed)
            assert a.same_tree(b)
            assert torch.equal(a.scores, b.scores) if a.scores is not None else True


@needs_torch_ref
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_round_trip_drafts_the_same_frontier_over_tree_shapes(tmp_path, arch):
    cfg, w, path = _saved(tmp_path, arch, fmt="safetensors", shards=2, include_embedding=True, seed=7, v=61, vt=150, h=30, nh=5, nkv=5, inter=44)
    head = load_draft_head(path, **({"lm_head": w.lm_head} if arch == "eagle2" else {}))
    for t, d, k in ((2, 1, 1), (23, 4, 4), (9, 6, 2)):
        c0 = cfg.replace(total_token=t, depth=d, top_k=k)
        c1 = head.config(total_token=t, depth=d, top_k=k)
        for seed in (3, 4):
            a, b = _draft(c0, w, seed), _draft(c1, head.weights, seed)
            assert a.same_tree(b), (t, d, k, seed)
            a.check_invariants(total_token=t, depth=d, top_k=k)


def test_dtype_and_device_casting(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False)
    target = _write_target(tmp_path / "t", w.embed_tokens.to(torch.bfloat16), None)
    head = load_draft_head(path, target=target, dtype=torch.float16, device="cpu")
    assert head.weights.dtype == torch.float16 and head.weights.d2t.dtype == torch.int64
    from dataclasses import replace

    _assert_same_weights(head.weights, replace(w, embed_tokens=w.embed_tokens.to(torch.bfloat16)).to(dtype=torch.float16))
    # dtype=None keeps the head's stored dtype and casts the target's embedding to it
    head32 = load_draft_head(path, target=target)
    assert head32.weights.dtype == torch.float32
    assert head32.weights.embed_tokens.dtype == torch.float32
    assert torch.equal(head32.weights.embed_tokens, w.embed_tokens.to(torch.bfloat16).float())


def test_tied_target_lm_head_and_path_to_a_file(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle2", include_embedding=False, layers=1)
    target = _write_target(tmp_path / "t", w.lm_head, None, tie=True)  # tied: lm_head == embedding
    head = load_draft_head(path / "model.safetensors", target=target / "config.json")
    assert torch.equal(head.weights.lm_head, w.lm_head) and torch.equal(head.weights.embed_tokens, w.lm_head)


def test_explicit_embed_tokens_wins_and_architecture_override_agrees(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=True)
    other = torch.randn_like(w.embed_tokens)
    head = load_draft_head(path, embed_tokens=torch.nn.Embedding.from_pretrained(other), architecture="eagle3")
    assert torch.equal(head.weights.embed_tokens, other)
    assert torch.equal(head.weights.lm_head, w.lm_head)


def test_target_checkpoint_is_read_lazily(tmp_path):
    """Only the shard holding the embedding is opened: the others may be anything (here: garbage)."""
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False)
    target = _write_target(tmp_path / "t", w.embed_tokens, None, shards=3)
    idx = json.loads((target / "model.safetensors.index.json").read_text())
    emb_shard = idx["weight_map"]["model.embed_tokens.weight"]
    for f in target.glob("model-*.safetensors"):
        if f.name != emb_shard:
            f.write_bytes(b"not a safetensors file")
    head = load_draft_head(path, target=target)
    assert torch.equal(head.weights.embed_tokens, w.embed_tokens)
    assert "[model.embed_tokens.weight]" in head.embedding_source and emb_shard in head.embedding_source


def test_loaded_target_embedding_is_shared_not_copied(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle2", include_embedding=False, layers=1)
    model = _target_model(w.embed_tokens, w.lm_head)
    head = load_draft_head(path, target=model)
    assert head.weights.embed_tokens.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert head.weights.lm_head.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert not head.weights.embed_tokens.requires_grad
    half = load_draft_head(path, target=model, dtype=torch.float16)  # a cast copies
    assert half.weights.embed_tokens.data_ptr() != model.get_input_embeddings().weight.data_ptr()


def test_save_refuses_non_empty_dir_and_overwrite_replaces(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", shards=3)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o777 & ~umask  # not left private like a temporary dir
    with pytest.raises(InputError, match="not empty; pass overwrite=True"):
        save_draft_head(w, cfg, path)
    w2 = random_weights(cfg, seed=99)
    save_draft_head(w2, cfg, path, format="bin", overwrite=True, include_embedding=True)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "pytorch_model.bin"]
    _assert_same_weights(load_draft_head(path).weights, w2)


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    import safetensors.torch

    cfg = head_cfg("eagle3")
    w = random_weights(cfg)
    calls = []

    def broken(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real(tensors, filename, metadata=metadata)

    real = safetensors.torch.save_file
    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_draft_head(w, cfg, tmp_path / "head", shards=3)
    assert list(tmp_path.iterdir()) == []  # no head dir, no temporary dir


# ----------------------------------------------------------------------------------------------
# validation errors (each message names the file, the key and expected vs found)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,shards", [("safetensors", 1), ("bin", 3)])
def test_missing_key_names_file_key_and_expected_shape(tmp_path, fmt, shards):
    cfg, w, path = _saved(tmp_path, "eagle3", fmt=fmt, shards=shards)
    _rewrite(path, lambda s: {k: v for k, v in s.items() if k != "midlayer.mlp.up_proj.weight"})
    if shards > 1:  # keep the index consistent with the shards
        idx = path / "pytorch_model.bin.index.json"
        data = json.loads(idx.read_text())
        del data["weight_map"]["midlayer.mlp.up_proj.weight"]
        idx.write_text(json.dumps(data))
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    assert "missing tensor 'midlayer.mlp.up_proj.weight'" in msg
    assert f"expected shape [{cfg.intermediate_size}, {cfg.hidden_size}]" in msg
    assert (str(path / "pytorch_model.bin.index.json") if shards > 1 else str(path / "model.safetensors")) in msg
    assert "config.json" in msg


def test_eagle2_missing_input_layernorm_of_layer_1(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle2", layers=2)
    _rewrite(path, lambda s: {k: v for k, v in s.items() if k != "layers.1.input_layernorm.weight"})
    with pytest.raises(WeightsError, match=r"missing tensor 'layers\.1\.input_layernorm\.weight' \(expected shape \[24\]"):
        load_draft_head(path)


def test_shape_mismatch_names_shard_key_expected_and_found(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", shards=3)
    files = _head_files(path)
    shard = files["midlayer.self_attn.k_proj.weight"][0]
    _rewrite(path, lambda s: {k: (torch.zeros(5, 7) if k == "midlayer.self_attn.k_proj.weight" else v) for k, v in s.items()})
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    kvd = cfg.num_key_value_heads * cfg.head_dim
    assert f"head file {str(shard)!r}: tensor 'midlayer.self_attn.k_proj.weight' has shape [5, 7], expected [{kvd}, {2 * cfg.hidden_size}]" in msg


def test_several_problems_are_reported_together(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _rewrite(path, lambda s: {**{k: v for k, v in s.items() if k != "norm.weight"}, "fc.weight": torch.zeros(3, 3)})
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    assert "2 problems" in msg and "'norm.weight'" in msg and "'fc.weight' has shape [3, 3]" in msg


def test_unexpected_key_is_an_error_when_strict_and_a_warning_otherwise(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", fmt="bin")
    _rewrite(path, lambda s: {**s, "midlayer.extra_gate.weight": torch.zeros(2, 2), "midlayer.self_attn.rotary_emb.inv_freq": torch.zeros(4)})
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    assert f"head file {str(path / 'pytorch_model.bin')!r}: unexpected tensor 'midlayer.extra_gate.weight' [2, 2]" in msg
    assert "inv_freq" not in msg  # rotary buffers of old checkpoints are ignored
    with pytest.warns(UserWarning, match="unexpected tensor 'midlayer.extra_gate.weight'"):
        head = load_draft_head(path, strict=False)
    _assert_same_weights(head.weights, w)
    assert any("extra_gate" in m for m in head.warnings)


def test_mixed_dtypes_need_an_explicit_dtype(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _rewrite(path, lambda s: {k: (v.half() if k == "norm.weight" else v) for k, v in s.items()})
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    assert f"{str(path / 'model.safetensors')!r}: tensor 'norm.weight' is float16 but the rest of the head is float32; pass dtype=" in str(e.value)
    head = load_draft_head(path, dtype=torch.float32)
    assert torch.equal(head.weights.norm, w.norm.half().float())
    assert any("several floating dtypes (float16, float32)" in m for m in describe_draft_head(path)["warnings"])


def test_non_floating_weight_is_rejected(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _rewrite(path, lambda s: {k: (v.long() if k == "midlayer.hidden_norm.weight" else v) for k, v in s.items()})
    with pytest.raises(WeightsError, match=r"tensor 'midlayer\.hidden_norm\.weight' has dtype int64, expected a floating dtype"):
        load_draft_head(path)


def test_target_embedding_hidden_size_mismatch(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False)
    target = _write_target(tmp_path / "t", torch.randn(cfg.target_vocab_size, 16), None, hidden=cfg.hidden_size)
    with pytest.raises(WeightsError) as e:
        load_draft_head(path, target=target)
    msg = str(e.value)
    assert f"target file {str(target / 'model.safetensors')!r}: tensor 'model.embed_tokens.weight' (embedding) has shape [{cfg.target_vocab_size}, 16], expected [{cfg.target_vocab_size}, {cfg.hidden_size}]" in msg
    assert "hidden-size mismatch" in msg


def test_target_config_hidden_size_mismatch(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=True)
    target = _write_target(tmp_path / "t", w.embed_tokens, None, hidden=cfg.hidden_size + 8)
    with pytest.raises(WeightsError, match=rf"head/target hidden-size mismatch: the target's config says hidden_size={cfg.hidden_size + 8}, but the head expects {cfg.hidden_size}"):
        load_draft_head(path, target=target)


def test_target_vocabulary_mismatch(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle2", include_embedding=False, layers=1)
    emb = torch.randn(cfg.target_vocab_size + 3, cfg.hidden_size)
    target = _write_target(tmp_path / "t", emb, emb, shards=2, vocab=cfg.target_vocab_size)
    with pytest.raises(WeightsError) as e:
        load_draft_head(path, target=target)
    msg = str(e.value)
    assert "tensor 'model.embed_tokens.weight' (embedding) has shape" in msg and "tensor 'lm_head.weight' (lm_head)" in msg
    assert f"vocabulary mismatch: the head's config.json vocab_size={cfg.target_vocab_size}" in msg
    # the target's config.json disagreeing is caught too
    target2 = _write_target(tmp_path / "t2", w.embed_tokens, w.lm_head, vocab=cfg.target_vocab_size + 1)
    with pytest.raises(WeightsError, match="head/target vocabulary mismatch: the target's config says vocab_size="):
        load_draft_head(path, target=target2)


def test_loaded_target_model_with_wrong_vocab(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False)
    model = _target_model(torch.randn(cfg.target_vocab_size - 2, cfg.hidden_size), torch.randn(cfg.target_vocab_size - 2, cfg.hidden_size))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(WeightsError, match=r"target model LlamaForCausalLM.get_input_embeddings\(\)\.weight \(embedding\) has shape"):
        load_draft_head(path, target=model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched


@pytest.mark.parametrize(
    "scaling,kind",
    [
        ({"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "llama3"),
        ({"type": "dynamic", "factor": 2.0}, "dynamic"),
        ({"type": "yarn", "factor": 4.0}, "yarn"),
    ],
)
def test_unsupported_rope_scaling_is_an_error_with_an_explicit_override(tmp_path, scaling, kind):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _set_config(path, rope_scaling=scaling)
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    assert str(path / "config.json") in msg and f"rope_scaling type {kind!r} is not supported" in msg
    assert "config_overrides={'rope_scaling': None}" in msg
    head = load_draft_head(path, config_overrides={"rope_scaling": None})
    assert head.config(total_token=4, depth=1, top_k=2).rope_scaling is None


def test_linear_rope_scaling_in_either_spelling(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _set_config(path, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert load_draft_head(path).config(total_token=4, depth=1, top_k=2).rope_scaling_factor == 4.0
    _set_config(path, rope_scaling={"type": "linear", "factor": -1})
    with pytest.raises(WeightsError, match="rope_scaling 'linear' needs a positive 'factor'"):
        load_draft_head(path)


def test_transformers5_rope_parameters(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _set_config(path, rope_theta=_DELETE, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})
    c = load_draft_head(path).config(total_token=4, depth=1, top_k=2)
    assert c.rope_theta == 500000.0 and c.rope_scaling is None
    _set_config(path, rope_parameters={"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0})
    with pytest.raises(WeightsError, match="rope_scaling type 'llama3' is not supported"):
        load_draft_head(path)


def test_d2t_all_zero_with_smaller_draft_vocab(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _rewrite(path, lambda s: {k: (torch.zeros_like(v) if k in ("d2t", "t2d") else v) for k, v in s.items()})
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    assert f"{str(path / 'model.safetensors')!r}: tensor 'd2t' is all zeros but draft_vocab_size={cfg.vocab_size} < vocab_size={cfg.target_vocab_size}" in msg
    assert "offsets" in msg
    with pytest.warns(UserWarning, match="'d2t' is all zeros"):
        head = load_draft_head(path, strict=False)
    assert not head.weights.d2t.any()


def _absolute(path: Path, *, keep_t2d: bool) -> torch.Tensor:
    """Rewrite d2t as absolute target ids (the user trap); returns them."""
    holder = {}

    def change(s):
        if "d2t" in s:
            v = s["d2t"].numel()
            s["d2t"] = s["d2t"] + torch.arange(v)
            holder["ids"] = s["d2t"]
        if not keep_t2d:
            s.pop("t2d", None)
        return s

    _rewrite(path, change)
    return holder["ids"]


def _saved_with_targets(tmp_path, target_ids: torch.Tensor, vt: int, name="head"):
    """An eagle3 head whose draft id j maps to target_ids[j] (written as published: offsets + t2d)."""
    from dataclasses import replace

    cfg = head_cfg("eagle3", v=target_ids.numel(), vt=vt)
    w = random_weights(cfg, seed=5)
    w = replace(w, d2t=target_ids - torch.arange(target_ids.numel()))
    return cfg, w, save_draft_head(w, cfg, tmp_path / name, include_embedding=True)


def test_d2t_absolute_ids_caught_by_t2d(tmp_path):
    # target ids low enough that j + id stays inside the vocabulary: only t2d can tell
    ids = torch.sort(torch.randperm(120, generator=torch.Generator().manual_seed(0))[:40]).values
    cfg, w, path = _saved_with_targets(tmp_path, ids, vt=300)
    _absolute(path, keep_t2d=True)
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    assert f"{str(path / 'model.safetensors')!r}: tensor 'd2t' holds ABSOLUTE target ids" in msg
    assert f"d2t - torch.arange({cfg.vocab_size})" in msg


def test_d2t_absolute_ids_out_of_range(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", v=40, vt=60)  # dense: j + id overflows the vocabulary
    _absolute(path, keep_t2d=False)
    with pytest.raises(WeightsError) as e:
        load_draft_head(path, strict=False)  # out-of-range ids are an error even when not strict
    msg = str(e.value)
    assert "tensor 'd2t' maps draft id" in msg and f"outside [0, {cfg.target_vocab_size})" in msg
    assert "looks like ABSOLUTE target ids" in msg


def test_d2t_absolute_ids_heuristic_warning_without_t2d(tmp_path):
    # a sparse-but-in-range absolute list: offsets would be strictly increasing, which real offsets are not
    ids = torch.arange(64) * 2 + 3  # distinct, in range, and j + ids[j] = 3j + 3 < 400 too
    cfg, w, path = _saved_with_targets(tmp_path, ids, vt=400)
    _absolute(path, keep_t2d=False)
    with pytest.warns(UserWarning, match="looks like ABSOLUTE target ids"):
        head = load_draft_head(path)  # cannot be sure without t2d: a warning, the head loads as written
    assert torch.equal(head.weights.d2t, ids)


def test_d2t_disagreeing_with_t2d_and_duplicates(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")

    def flip(s):
        if "t2d" in s:
            t = s["t2d"].clone()
            t[int((~t).nonzero()[0, 0])] = True  # mark one target id the draft vocabulary does not cover
            s["t2d"] = t
        return s

    _rewrite(path, flip)
    with pytest.raises(WeightsError, match=r"'d2t' disagrees with 't2d' .*1 target ids are marked in one and not the other"):
        load_draft_head(path)

    cfg2, w2, path2 = _saved(tmp_path, "eagle3", name="dup")

    def dup(s):
        if "d2t" in s:
            d = s["d2t"].clone()
            d[1] = d[0] - 1  # draft id 1 -> same target as draft id 0
            s["d2t"] = d
            s.pop("t2d", None)
        return s

    _rewrite(path2, dup)
    with pytest.raises(WeightsError, match=rf"'d2t' maps {cfg2.vocab_size} draft ids onto only {cfg2.vocab_size - 1} distinct target ids"):
        load_draft_head(path2)


def test_d2t_missing_or_misshaped(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _rewrite(path, lambda s: {k: v for k, v in s.items() if k not in ("d2t", "t2d")})
    with pytest.raises(WeightsError, match=rf"missing tensor 'd2t' \(expected shape \[{cfg.vocab_size}\], int64 offsets\)"):
        load_draft_head(path)
    cfg, w, path = _saved(tmp_path, "eagle3", name="h2")
    _rewrite(path, lambda s: {**s, "d2t": torch.zeros(cfg.vocab_size + 1, dtype=torch.long)})
    with pytest.raises(WeightsError, match=rf"tensor 'd2t' has shape \[{cfg.vocab_size + 1}\], expected \[{cfg.vocab_size}\]"):
        load_draft_head(path)
    _rewrite(path, lambda s: {**s, "d2t": torch.zeros(cfg.vocab_size)})
    with pytest.raises(WeightsError, match="tensor 'd2t' has dtype float32, expected int64 offsets"):
        load_draft_head(path)


def test_eagle3_without_embedding_or_target(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False)
    with pytest.raises(WeightsError, match=r"does not ship 'embed_tokens.weight' \(expected shape \[90, 24\]\).*pass target="):
        load_draft_head(path)
    with pytest.raises(InputError, match="lm_head= is for eagle2 heads"):
        load_draft_head(path, lm_head=w.lm_head, embed_tokens=w.embed_tokens)


def test_eagle2_without_lm_head_or_target(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle2", include_embedding=True, layers=1)
    with pytest.raises(WeightsError, match=r"drafts with the target's lm_head \(expected shape \[40, 24\]\): pass target="):
        load_draft_head(path)
    target = _write_target(tmp_path / "t", w.embed_tokens, None)  # no lm_head, not tied
    with pytest.raises(WeightsError, match="no 'lm_head.weight' tensor \\(and its config.json does not set tie_word_embeddings=true\\)"):
        load_draft_head(path, target=target)


def test_eagle2_bias_flag_must_match_the_checkpoint(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle2", layers=1)
    _set_config(path, bias=_DELETE)  # the public default is a biased fc: still fine
    load_draft_head(path, lm_head=w.lm_head)
    _set_config(path, bias=False)
    with pytest.raises(WeightsError, match=r"unexpected tensor 'fc.bias' \[24\]"):
        load_draft_head(path, lm_head=w.lm_head)
    _set_config(path, bias=_DELETE)
    _rewrite(path, lambda s: {k: v for k, v in s.items() if k != "fc.bias"})
    with pytest.raises(WeightsError, match=r"missing tensor 'fc.bias' .*config.json omits 'bias' .* set \"bias\": false"):
        load_draft_head(path, lm_head=w.lm_head)
    _set_config(path, bias=False)
    load_draft_head(path, lm_head=w.lm_head)
    _set_config(path, bias=True, qkv_bias=True)
    with pytest.raises(WeightsError, match="'qkv_bias' is set"):
        load_draft_head(path, lm_head=w.lm_head)


def test_config_json_problems(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    _set_config(path, hidden_size=_DELETE, intermediate_size="big")
    with pytest.raises(WeightsError) as e:
        load_draft_head(path)
    msg = str(e.value)
    assert f"head config {str(path / 'config.json')!r}: missing field 'hidden_size'" in msg
    assert "field 'intermediate_size' must be a positive integer, got 'big'" in msg
    _set_config(path, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, hidden_act="gelu")
    with pytest.raises(WeightsError, match="hidden_act='gelu' is not supported"):
        load_draft_head(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(WeightsError, match="config.json' is not valid JSON"):
        load_draft_head(path)
    (path / "config.json").unlink()
    with pytest.raises(WeightsError, match="config.json' not found"):
        load_draft_head(path)


def test_layout_problems(tmp_path):
    with pytest.raises(WeightsError, match="head directory .* does not exist"):
        load_draft_head(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(WeightsError, match=r"no head weights in .*expected one of model.safetensors, .*found \['config.json'\]"):
        load_draft_head(tmp_path / "empty")
    cfg, w, path = _saved(tmp_path, "eagle3", shards=2)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightsError, match=r"index .*model.safetensors.index.json' names shard file\(s\) that are not in .*\['model-00002-of-00002.safetensors'\]"):
        load_draft_head(path)
    cfg, w, path = _saved(tmp_path, "eagle3", shards=2, name="h2")
    idx = path / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"]["norm.weight"] = "model-00001-of-00002.safetensors" if data["weight_map"]["norm.weight"].startswith("model-00002") else "model-00002-of-00002.safetensors"
    idx.write_text(json.dumps(data))
    with pytest.raises(WeightsError, match="maps 'norm.weight' to .*, but that file has no such tensor"):
        load_draft_head(path)
    (path / "model-00001-of-00002.safetensors").write_bytes(b"garbage")
    with pytest.raises(WeightsError, match="cannot read head file .* as safetensors"):
        load_draft_head(path)


def test_architecture_detection_and_override(tmp_path):
    cfg, w, path = _saved(tmp_path, "eagle3")
    with pytest.raises(WeightsError) as e:
        load_draft_head(path, architecture="eagle2", lm_head=w.lm_head)
    assert "forced by architecture='eagle2'; the keys look like 'eagle3'" in str(e.value)
    with pytest.raises(InputError, match="architecture must be 'eagle3', 'eagle2' or None"):
        load_draft_head(path, architecture="eagle1")
    with pytest.raises(InputError, match="dtype must be a floating torch.dtype"):
        load_draft_head(path, dtype=torch.int8)
    with pytest.raises(InputError, match="target must be a local target checkpoint directory or a loaded Hugging Face model"):
        load_draft_head(path, target=42)


def test_failed_load_changes_nothing(tmp_path):
    """A failing load raises before anything is built; its arguments and the files are untouched."""
    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False)
    emb = w.embed_tokens[:, :-1].clone()  # wrong width
    emb_before = emb.clone()
    listing = sorted((p.name, p.stat().st_mtime_ns) for p in path.iterdir())
    default_dtype = torch.get_default_dtype()
    with pytest.raises(WeightsError):
        load_draft_head(path, embed_tokens=emb, dtype=torch.float16)
    assert torch.equal(emb, emb_before) and emb.dtype == torch.float32
    assert sorted((p.name, p.stat().st_mtime_ns) for p in path.iterdir()) == listing
    assert torch.get_default_dtype() == default_dtype
    # and a good load afterwards is unaffected
    good = load_draft_head(path, embed_tokens=w.embed_tokens)
    _assert_same_weights(good.weights, w)


# ----------------------------------------------------------------------------------------------
# describe / inspect / demo
# ----------------------------------------------------------------------------------------------
def test_describe_bytes_match_the_loaded_weights(tmp_path):
    for arch in ("eagle3", "eagle2"):
        cfg, w, path = _saved(tmp_path, arch, include_embedding=True, name=arch)
        lm = {"lm_head": w.lm_head} if arch == "eagle2" else {}
        head = load_draft_head(path, dtype=torch.bfloat16, **lm)
        d = head.describe(bandwidth_tbs=3.35, depth=5)
        assert d["bytes"]["per_depth"] == head.weights.layer_bytes()
        assert d["bytes"]["fc"] == head.weights.fc_bytes()
        floor = (head.weights.fc_bytes() + 6 * head.weights.layer_bytes()) / 3.35e12 * 1e3
        assert d["floor"]["ms"] == pytest.approx(floor)
        assert bandwidth_floor_ms(head.weights.layer_bytes(), head.weights.fc_bytes(), 5, 3.35) == pytest.approx(floor)
        on_disk = describe_draft_head(path, dtype=torch.bfloat16, bandwidth_tbs=3.35, depth=5)
        assert on_disk["bytes"] == d["bytes"] and on_disk["floor"] == d["floor"]
        assert on_disk["problems"] == [] and on_disk["architecture"] == arch
        assert "detected from the keys" in on_disk["architecture_note"]
        assert "DraftHead" not in head.summary()


def test_inspect_cli_json_without_target(tmp_path, capsys):
    from frontier.cli import main

    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False, shards=2)
    assert main(["inspect", str(path), "--json", "--dtype", "float16", "--depth", "4", "--bandwidth-tbs", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    w16 = w.to(dtype=torch.float16)
    assert d["architecture"] == "eagle3"
    assert d["dims"]["hidden_size"] == cfg.hidden_size and d["dims"]["feature_size"] == cfg.feature_size
    assert d["vocab"]["draft_vocab_size"] == cfg.vocab_size and d["vocab"]["target_vocab_size"] == cfg.target_vocab_size
    assert d["vocab"]["mapping"] == "d2t offsets" and d["vocab"]["t2d"] == "consistent with d2t"
    targets = torch.arange(cfg.vocab_size) + w.d2t
    assert (d["vocab"]["target_min"], d["vocab"]["target_max"]) == (int(targets.min()), int(targets.max()))
    assert d["bytes"]["per_depth"] == w16.layer_bytes() and d["bytes"]["fc"] == w16.fc_bytes()
    assert d["floor"]["ms"] == pytest.approx((w16.fc_bytes() + 5 * w16.layer_bytes()) / 2e12 * 1e3)
    assert "target model (not given)" in d["embedding"]


def test_inspect_cli_text_problems_and_errors(tmp_path, capsys):
    from frontier.cli import main

    cfg, w, path = _saved(tmp_path, "eagle2", include_embedding=False, layers=2)
    target = _write_target(tmp_path / "t", w.embed_tokens, w.lm_head)
    assert main(["inspect", str(path), "--target", str(target)]) == 0
    out = capsys.readouterr().out
    assert "architecture  eagle2" in out and "layers=2" in out and "fc_bias=True" in out
    assert "lm_head       target" in out and "per depth" in out and "floor" in out and "ms per draft call at 4.27 TB/s, depth 7" in out

    cfg, w, path = _saved(tmp_path, "eagle3", name="zeros")
    _rewrite(path, lambda s: {k: (torch.zeros_like(v) if k in ("d2t", "t2d") else v) for k, v in s.items()})
    _set_config(path, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert main(["inspect", str(path)]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM" in out and "'d2t' is all zeros" in out and "rope_scaling type 'llama3' is not supported" in out
    assert main(["inspect", str(path), "--override", "rope_scaling=null", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert len(d["problems"]) == 1 and "d2t" in d["problems"][0]

    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demo_with_a_local_head(tmp_path, capsys):
    from frontier.cli import main

    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=True, v=70, vt=130, h=32, nh=4, nkv=2, inter=48)
    backend = "torch_ref" if torch_ref_ok() else "stub"
    assert main(["demo", "--head", str(path), "--backend", backend, "--total-token", "10", "--depth", "3", "--tree-top-k", "3", "--json"]) == 0
    fr = json.loads(capsys.readouterr().out)
    assert len(fr["draft_tokens"][0]) == 10
    assert all(0 <= t < cfg.target_vocab_size for t in fr["draft_tokens"][0])


def test_demo_with_a_head_that_needs_the_targets_embedding(tmp_path, capsys):
    """Published EAGLE-3 heads do not ship the embedding: `demo --head H --target T` reads it from T."""
    from frontier.cli import main

    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False, v=70, vt=130, h=32, nh=4, nkv=2, inter=48)
    target = _write_target(tmp_path / "t", w.embed_tokens, None)
    args = ["demo", "--head", str(path), "--backend", "torch_ref", "--total-token", "10", "--depth", "3", "--tree-top-k", "3", "--json"]
    assert main(args) == 2
    assert "target" in capsys.readouterr().err  # without --target: the loader's clear error
    assert main(args + ["--target", str(target)]) == 0
    fr = json.loads(capsys.readouterr().out)
    assert len(fr["draft_tokens"][0]) == 10
    assert main(["demo", "--target", str(target)]) == 2
    assert "--target goes with --head" in capsys.readouterr().err


def test_bench_times_a_local_head(tmp_path, capsys):
    """`frontier bench --head` builds its call from the loaded head (checked on the CPU: the timing
    itself needs CUDA and says so)."""
    from frontier.bench import BenchCase, CallSetup
    from frontier.cli import main

    cfg, w, path = _saved(tmp_path, "eagle3", include_embedding=False, v=70, vt=130, h=32, nh=4, nkv=2, inter=48)
    target = _write_target(tmp_path / "t", w.embed_tokens, None)
    head = load_draft_head(path, target=target)
    case = BenchCase(preset=f"head:{path}", depth=3, top_k=3, total_token=10, context=20, new_rows=4, head=head)
    setup = CallSetup(case, device="cpu", dtype=torch.float32)
    assert setup.cfg == head.config(total_token=10, depth=3, top_k=3)
    # the bench's call, on a copy of its prefilled cache, equals drafting with the in-memory weights
    same_cache = frontier.DraftCache.from_tensors(setup.cache.k.clone(), setup.cache.v.clone(), setup.c)
    fr = setup.call("torch_ref")
    ref = frontier_generate(setup.cfg, setup.features, backend="torch_ref", input_ids=setup.ids, weights=w,
                            cache=same_cache, padded=True)
    assert fr.same_tree(ref)
    if not torch.cuda.is_available():
        assert main(["bench", "--head", str(path), "--target", str(target)]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
    assert main(["bench", "--target", str(target)]) == 2
    assert "--target goes with --head" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# The validation helpers, case by case: config JSON, shard names, RoPE settings, dimensions
# ----------------------------------------------------------------------------------------------
from frontier.loading import (  # noqa: E402
    MAX_JSON_BYTES,
    HeadDims,
    _raise_problems,
    _read_json,
    _read_json_file,
    _rope_from_config,
    _shard_name,
    _weight_of,
)


def test_read_json_file_reads_regular_files_only(tmp_path):
    good = tmp_path / "config.json"
    good.write_text('{"a": [1, 2]}')
    assert _read_json_file(good, "head config") == {"a": [1, 2]}
    with pytest.raises(FileNotFoundError):
        _read_json_file(tmp_path / "missing.json", "head config")
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(WeightsError, match=rf"^head config {str(dangling)!r} is a symlink to {str(tmp_path / 'nowhere.json')!r}, which does not exist$"):
        _read_json_file(dangling, "head config")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    with pytest.raises(WeightsError, match=rf"^head config {str(loop)!r} cannot be opened: Too many levels of symbolic links$"):
        _read_json_file(loop, "head config")
    with pytest.raises(WeightsError, match=rf"^index {str(tmp_path)!r} is not a regular file$"):
        _read_json_file(tmp_path, "index")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * MAX_JSON_BYTES + b"{}")
    with pytest.raises(WeightsError, match=rf"^head config {str(big)!r} is larger than {MAX_JSON_BYTES} bytes; that is no config file$"):
        _read_json_file(big, "head config")
    exactly = tmp_path / "exact.json"
    exactly.write_bytes(b"{}" + b" " * (MAX_JSON_BYTES - 2))
    assert _read_json_file(exactly, "head config") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(WeightsError, match=rf"^head config {str(bad)!r} is not valid JSON: JSONDecodeError: Expecting property name"):
        _read_json_file(bad, "head config")


def test_read_json_wants_an_object(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text("[1, 2]")
    with pytest.raises(WeightsError, match=rf"^target config {str(cfg)!r} must hold a JSON object, got list$"):
        _read_json(cfg, "target")
    with pytest.raises(WeightsError, match=(
        rf"^head config {str(tmp_path / 'none.json')!r} not found \(a head directory holds config.json \+ weights\)$"
    )):
        _read_json(tmp_path / "none.json", "head")
    cfg.write_text('{"hidden_size": 8}')
    assert _read_json(cfg, "head") == {"hidden_size": 8}


@pytest.mark.parametrize("name", ["model.safetensors", "shards/model-00001-of-00002.safetensors", "a..b.bin"])
def test_shard_names_inside_the_checkpoint_pass(name):
    assert _shard_name(name, Path("/ckpt/model.safetensors.index.json"), "head") == name


@pytest.mark.parametrize("name", [3, None, "", ["a"]])
def test_shard_names_must_be_non_empty_strings(name):
    with pytest.raises(WeightsError, match=(
        rf"^head index '/ckpt/i.json' maps a tensor to {re.escape(repr(name))}; shard names are file names$"
    )):
        _shard_name(name, Path("/ckpt/i.json"), "head")


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.bin", "a/../../b.bin", "\\server\\x.bin", "a\\b.bin",
                                  "C:x.bin", "a:b"])
def test_shard_names_leaving_the_checkpoint_are_refused(name):
    with pytest.raises(WeightsError, match=(
        rf"^target index '/ckpt/i.json' names shard {re.escape(repr(name))}, which is not a relative path inside "
        r"the checkpoint directory$"
    )):
        _shard_name(name, Path("/ckpt/i.json"), "target")


UNSUPPORTED = (
    "w: rope_scaling type {kind!r} is not supported (frontier drafts with rope_scaling null or "
    "{{'type': 'linear', 'factor': f}}; the public EAGLE config accepts only 'linear'/'dynamic'), "
    "got rope_scaling={scaling}. To draft anyway with plain RoPE (rope_theta={theta}), pass "
    "config_overrides={{'rope_scaling': None}} (CLI: --override rope_scaling=null); the tree then differs "
    "from what a head trained with this scaling would draft"
)


@pytest.mark.parametrize("cfg,want", [
    ({}, (10000.0, None, None)),
    ({"rope_theta": 500000}, (500000.0, None, None)),
    ({"rope_theta": 3.0, "rope_parameters": {"rope_theta": 5.0}}, (3.0, None, None)),
    ({"rope_parameters": {"rope_theta": 7.0, "rope_type": "default"}, "rope_scaling": {"rope_theta": 9.0}},
     (7.0, None, None)),
    ({"rope_scaling": {"rope_theta": 9.0}}, (9.0, None, None)),
    ({"rope_parameters": 5, "rope_scaling": None}, (10000.0, None, None)),
    ({"rope_parameters": {"rope_theta": 10.0}}, (10.0, None, None)),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2, "rope_theta": 10.0}},
     (10.0, {"type": "linear", "factor": 2.0}, None)),
    ({"rope_scaling": {"type": "linear", "factor": 4}}, (10000.0, {"type": "linear", "factor": 4.0}, None)),
    ({"rope_scaling": {"rope_type": "linear", "type": "dynamic", "factor": 0.5}},
     (10000.0, {"type": "linear", "factor": 0.5}, None)),
    ({"rope_scaling": {"type": "default"}}, (10000.0, None, None)),
    ({"rope_scaling": {}}, (10000.0, None, None)),
    ({"rope_theta": 0}, (10000.0, None, "w: 'rope_theta' must be a positive number, got 0")),
    ({"rope_theta": -1.5}, (10000.0, None, "w: 'rope_theta' must be a positive number, got -1.5")),
    ({"rope_theta": True}, (10000.0, None, "w: 'rope_theta' must be a positive number, got True")),
    ({"rope_theta": "1e4"}, (10000.0, None, "w: 'rope_theta' must be a positive number, got '1e4'")),
    ({"rope_scaling": [1]}, (10000.0, None, "w: 'rope_scaling' must be null or an object, got [1]")),
    ({"rope_scaling": {"type": "linear", "factor": 0}},
     (10000.0, None, "w: rope_scaling 'linear' needs a positive 'factor', got rope_scaling={'type': 'linear', 'factor': 0}")),
    ({"rope_scaling": {"type": "linear", "factor": True}},
     (10000.0, None, "w: rope_scaling 'linear' needs a positive 'factor', got rope_scaling={'type': 'linear', 'factor': True}")),
    ({"rope_scaling": {"type": "linear"}},
     (10000.0, None, "w: rope_scaling 'linear' needs a positive 'factor', got rope_scaling={'type': 'linear'}")),
    ({"rope_theta": 20.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     (20.0, None, UNSUPPORTED.format(kind="dynamic", scaling={"type": "dynamic", "factor": 2.0}, theta=20.0))),
    ({"rope_scaling": {"rope_type": "default", "factor": 2.0}},
     (10000.0, None, UNSUPPORTED.format(kind="default", scaling={"rope_type": "default", "factor": 2.0}, theta=10000.0))),
    ({"rope_scaling": {"factor": 2.0}},
     (10000.0, None, UNSUPPORTED.format(kind=None, scaling={"factor": 2.0}, theta=10000.0))),
])
def test_rope_from_config(cfg, want):
    got = _rope_from_config(cfg, "w")
    assert got == want and type(got[0]) is float


def test_raise_problems():
    _raise_problems([], Path("/h"))
    with pytest.raises(WeightsError, match=r"^the one problem$"):
        _raise_problems(["the one problem"], Path("/h"))
    with pytest.raises(WeightsError) as info:
        _raise_problems(["a", "b"], Path("/h"))
    assert str(info.value) == "cannot load the draft head in '/h': 2 problems:\n  a\n  b"
    with pytest.raises(WeightsError) as info:
        _raise_problems([f"p{i}" for i in range(12)], Path("/h"))
    assert str(info.value).endswith("\n  p11") and "more" not in str(info.value)
    with pytest.raises(WeightsError) as info:
        _raise_problems([f"p{i}" for i in range(14)], Path("/h"))
    assert str(info.value) == (
        "cannot load the draft head in '/h': 14 problems:\n  " + "\n  ".join(f"p{i}" for i in range(12))
        + "\n  ... and 2 more"
    )


def test_weight_of():
    t = torch.ones(2, 3, requires_grad=True)
    assert torch.equal(_weight_of(t, "lm_head"), t) and not _weight_of(t, "lm_head").requires_grad
    lin = torch.nn.Linear(3, 2, bias=False)
    w = _weight_of(lin, "lm_head")
    assert w.data_ptr() == lin.weight.data_ptr() and not w.requires_grad

    class NoTensor:
        weight = [1.0]

    for bad, kind in ((object(), "object"), (NoTensor(), "NoTensor"), (None, "NoneType")):
        with pytest.raises(InputError, match=rf"^embed_tokens must be a torch.Tensor or a module with .weight, got {kind}$"):
            _weight_of(bad, "embed_tokens")


def _dims(arch="eagle3", **changes) -> HeadDims:
    fields = dict(architecture=arch, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                  intermediate_size=12, feature_size=24 if arch == "eagle3" else 8, vocab_size=10, target_vocab_size=20,
                  num_layers=1, fc_bias=arch == "eagle2", rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-6)
    fields.update(changes)
    return HeadDims(**fields)


@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_head_dims_byte_counts_add_up(arch):
    dims = _dims(arch, target_vocab_size=10 if arch == "eagle2" else 20)
    n = {k: int(torch.Size(s).numel()) for k, s in dims.expected_shapes().items()}
    counts = dims.byte_counts(2)
    fc = n["fc.weight"] + n.get("fc.bias", 0)
    assert counts["total"] == 2 * sum(n.values())
    assert counts["embedding"] == 2 * n["embed_tokens.weight"] == 2 * dims.target_vocab_size * 8
    assert counts["lm_head"] == 2 * n["lm_head.weight"] == 2 * dims.vocab_size * 8
    assert counts["fc"] == 2 * fc
    assert counts["per_depth"] == counts["total"] - counts["fc"] - counts["embedding"]
    assert counts["layer"] == counts["per_depth"] - counts["lm_head"]
    assert dims.byte_counts(1)["total"] * 2 == counts["total"]
    assert dims.target_hidden_size == (8 if arch == "eagle3" else 8)


def test_head_dims_target_hidden_size_and_config():
    assert _dims(feature_size=3 * 16).target_hidden_size == 16
    assert _dims("eagle2").target_hidden_size == 8
    cfg = _dims(rope_theta=5.0).frontier_config(total_token=6, depth=2, top_k=2)
    assert (cfg.total_token, cfg.depth, cfg.top_k, cfg.vocab_size, cfg.target_vocab_size, cfg.feature_size,
            cfg.head_dim, cfg.rope_theta, cfg.architecture) == (6, 2, 2, 10, 20, 24, 4, 5.0, "eagle3")
    assert _dims().frontier_config(total_token=6, depth=2, top_k=2, rope_theta=7.0).rope_theta == 7.0


from frontier.loading import _dims_from_config  # noqa: E402

E3 = {"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 12, "vocab_size": 20}


def dims_of(cfg, arch="eagle3"):
    problems: list[str] = []
    return _dims_from_config(cfg, arch, "w", problems), problems


def test_dims_from_an_eagle3_config():
    dims, problems = dims_of(dict(E3, draft_vocab_size=10, target_hidden_size=16, num_key_value_heads=1,
                                  rms_norm_eps=1e-5, rope_theta=500.0))
    assert problems == []
    assert dims == HeadDims(architecture="eagle3", hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                            intermediate_size=12, feature_size=48, vocab_size=10, target_vocab_size=20, num_layers=1,
                            fc_bias=False, rope_theta=500.0, rope_scaling=None, rms_norm_eps=1e-5)
    assert type(dims.rms_norm_eps) is float and type(dims.rope_theta) is float
    dims, _ = dims_of(dict(E3, head_dim=6, rms_norm_eps=1, num_hidden_layers=3, bias=False))
    assert (dims.head_dim, dims.num_key_value_heads, dims.vocab_size, dims.feature_size, dims.num_layers) == (6, 2, 20, 24, 1)
    assert dims.rms_norm_eps == 1.0 and type(dims.rms_norm_eps) is float and dims.fc_bias is False
    dims, _ = dims_of(dict(E3, rope_scaling={"type": "linear", "factor": 2}))
    assert dims.rope_scaling == {"type": "linear", "factor": 2.0} and dims.rms_norm_eps == 1e-6


def test_dims_from_an_eagle2_config():
    dims, problems = dims_of(dict(E3, num_hidden_layers=2, draft_vocab_size=5, target_hidden_size=99), "eagle2")
    assert problems == []
    assert (dims.architecture, dims.num_layers, dims.fc_bias, dims.vocab_size, dims.target_vocab_size, dims.feature_size) == (
        "eagle2", 2, True, 20, 20, 8)
    assert dims_of(dict(E3, bias=False), "eagle2")[0].fc_bias is False
    assert dims_of(dict(E3), "eagle2")[0].num_layers == 1


@pytest.mark.parametrize("changes,arch,problem", [
    (dict(hidden_size=None), "eagle3", "w: missing field 'hidden_size' (needed to shape the eagle3 head)"),
    (dict(vocab_size=None), "eagle2", "w: missing field 'vocab_size' (needed to shape the eagle2 head)"),
    (dict(num_attention_heads=0), "eagle3", "w: field 'num_attention_heads' must be a positive integer, got 0"),
    (dict(intermediate_size=True), "eagle3", "w: field 'intermediate_size' must be a positive integer, got True"),
    (dict(hidden_size=8.0), "eagle3", "w: field 'hidden_size' must be a positive integer, got 8.0"),
    (dict(num_key_value_heads=-1), "eagle3", "w: field 'num_key_value_heads' must be a positive integer, got -1"),
    (dict(draft_vocab_size="10"), "eagle3", "w: field 'draft_vocab_size' must be a positive integer, got '10'"),
    (dict(head_dim=0), "eagle3", "w: field 'head_dim' must be a positive integer, got 0"),
    (dict(target_hidden_size=0), "eagle3", "w: field 'target_hidden_size' must be a positive integer, got 0"),
    (dict(num_hidden_layers=0), "eagle2", "w: field 'num_hidden_layers' must be a positive integer, got 0"),
    (dict(bias="yes"), "eagle2", "w: field 'bias' must be true or false, got 'yes'"),
    (dict(qkv_bias=True), "eagle2", "w: 'qkv_bias' is set (Qwen-style biased q/k/v projections); frontier's draft layer "
                                    "has no attention biases, so this head is not supported"),
    (dict(hidden_act="gelu"), "eagle3", "w: hidden_act='gelu' is not supported (the draft layer's MLP is SiLU-gated)"),
    (dict(rms_norm_eps=0), "eagle3", "w: 'rms_norm_eps' must be a positive number, got 0"),
    (dict(rms_norm_eps=False), "eagle3", "w: 'rms_norm_eps' must be a positive number, got False"),
    (dict(rms_norm_eps="1e-6"), "eagle3", "w: 'rms_norm_eps' must be a positive number, got '1e-6'"),
    (dict(num_attention_heads=3), "eagle3", "w: num_attention_heads=3 must divide hidden_size=8"),
    (dict(num_key_value_heads=3, num_attention_heads=4), "eagle3", "w: num_key_value_heads=3 must divide num_attention_heads=4"),
    (dict(draft_vocab_size=21), "eagle3", "w: draft_vocab_size=21 cannot exceed vocab_size=20 (the target vocabulary)"),
])
def test_dims_problems(changes, arch, problem):
    cfg = {k: v for k, v in dict(E3, **changes).items() if v is not None}
    dims, problems = dims_of(cfg, arch)
    assert dims is None and problems == [problem]


def test_dims_problems_are_collected_and_rope_problems_keep_the_dims():
    problems = ["earlier"]
    assert _dims_from_config({"hidden_size": 0, "hidden_act": "relu"}, "eagle3", "w", problems) is None
    assert problems == ["earlier", "w: field 'hidden_size' must be a positive integer, got 0",
                        "w: missing field 'num_attention_heads' (needed to shape the eagle3 head)",
                        "w: missing field 'intermediate_size' (needed to shape the eagle3 head)",
                        "w: missing field 'vocab_size' (needed to shape the eagle3 head)",
                        "w: missing field 'draft_vocab_size' (needed to shape the eagle3 head)",
                        "w: hidden_act='relu' is not supported (the draft layer's MLP is SiLU-gated)"]
    problems = ["earlier"]
    dims = _dims_from_config(dict(E3, rope_scaling={"type": "yarn", "factor": 2.0}), "eagle3", "w", problems)
    assert dims is not None and dims.rope_scaling is None and len(problems) == 2
    assert problems[1].startswith("w: rope_scaling type 'yarn' is not supported")
    # an explicit head_dim skips the divisibility of hidden_size
    assert dims_of(dict(E3, num_attention_heads=3, head_dim=4))[0].head_dim == 4


def test_read_json_file_names_a_file_that_cannot_be_read(tmp_path, monkeypatch):
    import frontier.loading.files as loading  # _read_json_file opens through this module

    cfg = tmp_path / "config.json"
    cfg.write_text("{}")

    def refuse(errno_error):
        def fake_open(*args, **kwargs):
            raise errno_error
        return fake_open

    monkeypatch.setattr(loading, "open", refuse(PermissionError(13, "Permission denied")), raising=False)
    with pytest.raises(WeightsError, match=rf"^head config {re.escape(repr(str(cfg)))} cannot be read: Permission denied$"):
        _read_json_file(cfg, "head config")
    monkeypatch.setattr(loading, "open", refuse(OSError("no reason given")), raising=False)
    with pytest.raises(WeightsError, match=rf"^head config {re.escape(repr(str(cfg)))} cannot be read: no reason given$"):
        _read_json_file(cfg, "head config")


def test_read_json_names_the_role_in_file_errors(tmp_path):
    with pytest.raises(WeightsError, match=rf"^head config {re.escape(repr(str(tmp_path)))} is not a regular file$"):
        _read_json(tmp_path, "head")


@pytest.mark.parametrize("cfg,want", [
    ({"rope_theta": 1}, (1.0, None, None)),
    ({"rope_theta": 0.5}, (0.5, None, None)),
    # rope_scaling given: rope_parameters only supplies rope_theta
    ({"rope_scaling": {"type": "linear", "factor": 2}, "rope_parameters": {"rope_type": "yarn", "rope_theta": 4.0}},
     (4.0, {"type": "linear", "factor": 2.0}, None)),
    # rope_parameters without a rope_type, or with "default", is plain RoPE even with a factor
    ({"rope_parameters": {"factor": 2.0}}, (10000.0, None, None)),
    ({"rope_parameters": {"rope_type": "default", "factor": 2.0}}, (10000.0, None, None)),
])
def test_rope_parameters_forms(cfg, want):
    assert _rope_from_config(cfg, "w") == want


def test_dims_are_ints():
    dims, _ = dims_of(dict(E3))
    assert type(dims.head_dim) is int and dims.head_dim == 4
    assert type(_dims(feature_size=48).target_hidden_size) is int and _dims(feature_size=48).target_hidden_size == 16


def test_head_dims_frontier_config_carries_every_field():
    dims = _dims("eagle2", num_key_value_heads=1, head_dim=6, intermediate_size=20, feature_size=8, vocab_size=20,
                 target_vocab_size=20, num_layers=3, fc_bias=False, rope_theta=5.0,
                 rope_scaling={"type": "linear", "factor": 2.0}, rms_norm_eps=1e-5)
    cfg = dims.frontier_config(total_token=6, depth=2, top_k=2)
    assert cfg.model_dump() == dict(
        total_token=6, depth=2, top_k=2, vocab_size=20, hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
        head_dim=6, intermediate_size=20, feature_size=8, target_vocab_size=20, num_layers=3, fc_bias=False,
        rope_theta=5.0, rope_scaling={"type": "linear", "factor": 2.0}, rms_norm_eps=1e-5, architecture="eagle2",
    )
    e3 = _dims(feature_size=48, num_key_value_heads=2).frontier_config(total_token=6, depth=2, top_k=2)
    assert (e3.feature_size, e3.fc_bias, e3.num_layers, e3.architecture) == (48, False, 1, "eagle3")
