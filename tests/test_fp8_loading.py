"""fp8 (e4m3, per-output-channel fp32 scales) draft heads: quantizing, validating, saving, loading,
planning from metadata, describing (``frontier inspect``) and drafting with them. CPU, tiny heads."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from frontier import InputError, WeightsError, frontier_generate, load_draft_head
from frontier.loading import describe_draft_head, format_description, save_draft_head
from frontier.random_head import random_inputs, random_weights
from frontier.weights import FP8, FP8_MAX, DraftWeights, dequantize_fp8, is_linear_key, quantize_fp8, scale_key

from loading_support import head_cfg, needs_torch_ref

# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def _weights(cfg, *, seed=0, dtype=torch.bfloat16) -> DraftWeights:
    return random_weights(cfg, seed=seed, dtype=dtype, lm_head_scale=6.0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _assert_identical(a: DraftWeights, b: DraftWeights, *, skip=()):
    """Same keys, dtypes and bytes (fp8 compared bit for bit)."""
    sa = {k: v for k, v in a.state_dict().items() if k not in skip}
    sb = {k: v for k, v in b.state_dict().items() if k not in skip}
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(_bits(sa[k]), _bits(sb[k])), k


def _head_state(path: Path) -> dict:
    """key -> tensor of every weights file of a saved head."""
    from safetensors.torch import load_file

    out = {}
    for f in sorted(path.iterdir()):
        if f.suffix == ".safetensors":
            out.update(load_file(str(f)))
        elif f.suffix == ".bin":
            out.update(torch.load(str(f), weights_only=True))
    return out


def _write_head(path: Path, cfg, state: dict, *, fmt="safetensors") -> Path:
    """A head written by hand: config.json (frontier's, no quantization_config) + one weights file."""
    from frontier.loading import head_config_json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(head_config_json(cfg, dtype=torch.bfloat16)))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    else:
        torch.save(state, str(path / "pytorch_model.bin"))
    return path


def _fp8_state(cfg, seed=0) -> dict:
    """The full public state of an fp8 eagle3 head (t2d added), as an fp8 serving checkpoint stores it."""
    w = _weights(cfg, seed=seed)
    state = dict(w.quantized().state_dict())
    t2d = torch.zeros(cfg.target_vocab_size, dtype=torch.bool)
    t2d[torch.arange(cfg.vocab_size) + w.d2t] = True
    state["t2d"] = t2d
    return state


def _draft(cfg, weights, seed):
    ids, feats = random_inputs(cfg, context=5 + seed, seed=200 + seed, dtype=weights.dtype)
    return frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=weights)


# ----------------------------------------------------------------------------------------------
# quantize_fp8 / dequantize_fp8
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,seed", [((7, 13), 0), ((1, 5), 1), ((33, 64), 2)])
def test_quantize_fp8_scales_per_row_in_range_and_bounded_error(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(shape, generator=g) * torch.logspace(-3, 2, shape[0])[:, None]).to(dtype)
    q, s = quantize_fp8(w)
    assert q.dtype == FP8 and q.shape == w.shape
    assert s.dtype == torch.float32 and s.shape == (shape[0],)
    # one power-of-two scale per row, just large enough to map the row's largest magnitude into range
    assert torch.equal(torch.exp2(torch.round(torch.log2(s))), s)
    amax = w.float().abs().amax(dim=1)
    assert bool((amax / s <= FP8_MAX).all()) and bool((amax / s > FP8_MAX / 2).all())
    assert bool((q.float().abs() <= FP8_MAX).all())
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals, plus the subnormal step 2^-9 * scale
    deq = dequantize_fp8(q, s, torch.float32)
    err = (deq - w.float()).abs()
    assert bool((err <= w.float().abs() * 2.0**-4 + s[:, None] * 2.0**-9).all())
    # dequantized to the activation dtype: one rounding of the exact fp32 product
    assert torch.equal(dequantize_fp8(q, s, dtype), (q.float() * s[:, None]).to(dtype))


def test_quantize_fp8_zero_row_and_non_power_of_two():
    w = torch.tensor([[0.0, 0.0, 0.0], [1.0, -3.0, 0.5], [448.0, 1.0, -2.0]])
    q, s = quantize_fp8(w)
    assert s[0] == 1 and bool((q[0].float() == 0).all())
    assert s[1] == 2.0**-7 and s[2] == 1.0  # 3/448 -> 2^-7; 448/448 = 1 exactly
    q2, s2 = quantize_fp8(w, power_of_two=False)
    assert s2[1] == pytest.approx(3 / 448) and q2[1].float().abs().max() == FP8_MAX


def test_quantized_head_keeps_embeddings_norms_biases_and_shares_them():
    cfg = head_cfg("eagle2", layers=2)
    w = _weights(cfg)
    q = w.quantized()
    assert q.is_fp8 and not w.is_fp8 and q.dtype == w.dtype == torch.bfloat16
    linear = [k for k, _ in w.tensors() if is_linear_key(k)]
    assert sorted(q.scales) == sorted(linear) and "lm_head.weight" in linear
    for k, t in q.tensors():
        if is_linear_key(k):
            assert t.dtype == FP8 and q.scales[k].shape == (t.shape[0],), k
        else:
            assert t is dict(w.tensors())[k], k  # shared, not copied
    assert q.quantized().scales.keys() == q.scales.keys()
    assert all(torch.equal(_bits(a), _bits(b)) for (_, a), (_, b) in zip(q.quantized().tensors(), q.tensors()))
    assert q.dequantized().fc_weight.dtype == torch.bfloat16 and not q.dequantized().is_fp8


# ----------------------------------------------------------------------------------------------
# DraftWeights.validate
# ----------------------------------------------------------------------------------------------
def _no_fc_scale(q):
    return replace(q, scales={k: v for k, v in q.scales.items() if k != "fc.weight"})


def _set_scale(key, fn):
    return lambda q: replace(q, scales={**q.scales, key: fn(q.scales[key])})


def _nan_fp8(q):
    bits = q.fc_weight.view(torch.uint8).clone()
    bits[1, 2] = 0x7F
    return replace(q, fc_weight=bits.view(FP8))


def _norm_scale(q):
    return replace(q, scales={**q.scales, "norm.weight": torch.ones(q.norm.shape[0])})


def _fp8_embedding(q):
    return replace(q, embed_tokens=q.embed_tokens.to(FP8))


VALIDATE_ERRORS = [
    ("no scale", _no_fc_scale, r"'fc\.weight' is float8_e4m3fn but has no scale.*'fc\.weight_scale'"),
    ("scale shape", _set_scale("fc.weight", lambda s: s[:-1]), r"'fc\.weight_scale' must be a contiguous float32 tensor of shape \[24\]"),
    ("scale dtype", _set_scale("fc.weight", lambda s: s.to(torch.bfloat16)), r"'fc\.weight_scale' must be a contiguous float32.*bfloat16"),
    ("scale zero", _set_scale("lm_head.weight", lambda s: s.index_fill(0, torch.tensor([3]), 0.0)),
     r"'lm_head\.weight_scale' row 3 is 0.0; scales must be positive"),
    ("scale negative", _set_scale("fc.weight", lambda s: -s), r"'fc\.weight_scale' row 0 is -.*; scales must be positive"),
    ("scale nan", _set_scale("fc.weight", lambda s: s.index_fill(0, torch.tensor([0]), float("nan"))),
     r"'fc\.weight_scale'.*(non-finite|row 0 is nan)"),
    ("nan bits", _nan_fp8, r"'fc\.weight' holds non-finite"),
    ("scale on a norm", _norm_scale, r"fp8 scale for 'norm\.weight'.*not a linear weight"),
    ("fp8 embedding", _fp8_embedding, r"'embed_tokens\.weight' is torch\.float8_e4m3fn.*activation dtype"),
]


@pytest.mark.parametrize("name,change,match", VALIDATE_ERRORS, ids=[c[0] for c in VALIDATE_ERRORS])
def test_validate_refuses_broken_fp8_heads(name, change, match):
    cfg = head_cfg()
    q = _weights(cfg).quantized()
    assert q.validate(cfg) is q
    with pytest.raises(WeightsError, match=match):
        change(q).validate(cfg)


# ----------------------------------------------------------------------------------------------
# save -> load
# ----------------------------------------------------------------------------------------------
SAVES = [("eagle3", "safetensors", 1), ("eagle3", "bin", 1), ("eagle3", "safetensors", 3), ("eagle3", "bin", 4),
         ("eagle2", "safetensors", 2), ("eagle2", "bin", 1)]


@pytest.mark.parametrize("arch,fmt,shards", SAVES, ids=lambda c: str(c))
def test_fp8_round_trip_keeps_weights_and_scales_bit_for_bit(tmp_path, arch, fmt, shards):
    cfg = head_cfg(arch)
    q = _weights(cfg, seed=shards).quantized()
    path = save_draft_head(q, cfg, tmp_path / "h", format=fmt, shards=shards, include_embedding=True)
    on_disk = _head_state(path)
    written = [k for k, _ in q.tensors() if k in q.scales and not (arch == "eagle2" and k == "lm_head.weight")]
    for k in written:
        assert on_disk[k].dtype == FP8 and on_disk[scale_key(k)].dtype == torch.float32, k
    assert (arch == "eagle2") == ("lm_head.weight_scale" not in on_disk)
    config = json.loads((path / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["quantization_config"]["quant_method"] == "fp8"
    head = load_draft_head(path, **({"lm_head": q.dequantized().lm_head} if arch == "eagle2" else {}))
    assert head.weights.is_fp8 and head.weights.dtype == torch.bfloat16 and head.quantization == {}
    skip = ("lm_head.weight", "lm_head.weight_scale") if arch == "eagle2" else ()
    _assert_identical(head.weights, q, skip=skip)
    # the eagle2 lm_head is the target's: as given (bf16), quantized only on request
    if arch == "eagle2":
        assert head.weights.lm_head.dtype == torch.bfloat16 and "lm_head.weight" not in head.weights.scales
        again = load_draft_head(path, lm_head=q.dequantized().lm_head, quantize="fp8")
        assert again.quantization["quantized"] == ["lm_head.weight"]
        lm, lm_scale = quantize_fp8(q.dequantized().lm_head)
        _assert_identical(again.weights, replace(q, lm_head=lm, scales={**q.scales, "lm_head.weight": lm_scale}))


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float16])
def test_dtype_is_the_activation_dtype_of_an_fp8_head(tmp_path, dtype):
    cfg = head_cfg()
    q = _weights(cfg).quantized()
    path = save_draft_head(q, cfg, tmp_path / "h", include_embedding=True)
    head = load_draft_head(path, dtype=dtype)
    want = dtype or torch.bfloat16
    assert head.weights.dtype == want and head.weights.norm.dtype == want
    assert head.weights.fc_weight.dtype == FP8 and all(s.dtype == torch.float32 for s in head.weights.scales.values())
    _assert_identical(head.weights, q.to(dtype=want))
    with pytest.raises(InputError, match="dtype must be a floating torch.dtype.*activation dtype"):
        load_draft_head(path, dtype=FP8)


@pytest.mark.parametrize("arch,fmt,shards", [("eagle3", "safetensors", 1), ("eagle3", "bin", 2), ("eagle2", "safetensors", 3)],
                         ids=str)
def test_quantize_fp8_at_load_equals_quantized_and_reports_bytes(tmp_path, arch, fmt, shards, recwarn):
    cfg = head_cfg(arch)
    w = _weights(cfg, seed=4)
    path = save_draft_head(w, cfg, tmp_path / "h", format=fmt, shards=shards, include_embedding=True)
    ext = {"lm_head": w.lm_head} if arch == "eagle2" else {}
    plain = load_draft_head(path, **ext)
    head = load_draft_head(path, quantize="fp8", **ext)
    assert not [str(x.message) for x in recwarn]
    _assert_identical(head.weights, plain.weights.quantized())
    q = head.quantization
    assert q["method"] == "fp8" and q["kept"] == [] and sorted(q["quantized"]) == sorted(head.weights.scales)
    assert q["streamed_bytes_before"] == plain.weights.fc_bytes() + plain.weights.layer_bytes()
    assert q["streamed_bytes_after"] == head.weights.fc_bytes() + head.weights.layer_bytes()
    assert q["bytes_saved"] == q["streamed_bytes_before"] - q["streamed_bytes_after"] > 0
    text = head.summary()
    assert "quantized     fp8 at load" in text and "format        fp8 e4m3" in text
    d = head.describe(bandwidth_tbs=2.0, depth=3)
    assert d["quantization"] == q and d["bytes"]["per_depth"] == head.weights.layer_bytes()


def test_quantize_fp8_on_an_fp8_head_keeps_its_fp8_linears(tmp_path):
    cfg = head_cfg()
    w = _weights(cfg)
    partial = w.quantized()
    keep = {"fc.weight", "midlayer.mlp.down_proj.weight"}
    state = {k: (v if k in keep or not is_linear_key(k) else dict(w.tensors())[k]) for k, v in partial.tensors()}
    mixed = DraftWeights.from_state_dict(state)
    mixed.scales = {k: partial.scales[k] for k in keep}
    path = save_draft_head(mixed, cfg, tmp_path / "h", include_embedding=True)
    head = load_draft_head(path)
    assert set(head.weights.scales) == keep
    _assert_identical(head.weights, mixed)
    full = load_draft_head(path, quantize="fp8")
    assert sorted(full.quantization["kept"]) == sorted(keep) and not keep & set(full.quantization["quantized"])
    _assert_identical(full.weights, mixed.quantized())
    d = head.describe()
    assert d["weight_format"]["fp8_linears"] == 2 and "2 of 9 linears" in d["weight_format"]["name"]


@pytest.mark.parametrize("bad", ["int8", "FP8", "", True, 8])
def test_bad_quantize_value_is_an_input_error(tmp_path, bad):
    cfg = head_cfg()
    path = save_draft_head(_weights(cfg), cfg, tmp_path / "h", include_embedding=True)
    for call in (lambda: load_draft_head(path, quantize=bad), lambda: describe_draft_head(path, quantize=bad)):
        with pytest.raises(InputError, match=r"quantize must be one of \[None, 'fp8'\], got " + repr(bad).replace("[", r"\[")):
            call()


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_hand_written_fp8_checkpoint_loads(tmp_path, fmt):
    cfg = head_cfg()
    state = _fp8_state(cfg)
    path = _write_head(tmp_path / "h", cfg, state, fmt=fmt)
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        head = load_draft_head(path)
    want = DraftWeights.from_state_dict({k: v for k, v in state.items() if k != "t2d"})
    _assert_identical(head.weights, want)
    assert head.weights.dtype == torch.bfloat16 and len(head.weights.scales) == 9


# ----------------------------------------------------------------------------------------------
# planning from metadata: every fp8 problem names the key
# ----------------------------------------------------------------------------------------------
def _drop(key):
    return lambda s: {k: v for k, v in s.items() if k != key}


def _with(key, value):
    return lambda s: {**s, key: value(s) if callable(value) else value}


PLAN_ERRORS = [
    ("fp8 linear without scale", _drop("midlayer.self_attn.q_proj.weight_scale"),
     r"tensor 'midlayer\.self_attn\.q_proj\.weight' is float8_e4m3fn but the head has no scale for it: expected tensor "
     r"'midlayer\.self_attn\.q_proj\.weight_scale' float32 \[24\]"),
    ("scale wrong shape", _with("fc.weight_scale", torch.ones(23)),
     r"fp8 scale 'fc\.weight_scale' has dtype float32 and shape \[23\], expected float32 \[24\]"),
    ("scale wrong dtype", _with("lm_head.weight_scale", torch.ones(40, dtype=torch.float16)),
     r"fp8 scale 'lm_head\.weight_scale' has dtype float16 and shape \[40\], expected float32 \[40\]"),
    ("scale of a norm", _with("norm.weight_scale", torch.ones(24)),
     r"fp8 scale 'norm\.weight_scale' belongs to 'norm\.weight', which is not a linear weight"),
    ("scale of an absent key", _with("midlayer.mlp.extra_proj.weight_scale", torch.ones(4)),
     r"fp8 scale 'midlayer\.mlp\.extra_proj\.weight_scale' belongs to 'midlayer\.mlp\.extra_proj\.weight', which is not "
     r"a tensor of"),
    ("scale of a bf16 linear", _with("midlayer.mlp.up_proj.weight", lambda s: torch.ones(40, 24, dtype=torch.bfloat16)),
     r"fp8 scale 'midlayer\.mlp\.up_proj\.weight_scale' belongs to 'midlayer\.mlp\.up_proj\.weight', which is bfloat16, "
     r"expected float8_e4m3fn"),
    ("fp8 norm", _with("midlayer.input_layernorm.weight", lambda s: s["midlayer.input_layernorm.weight"].to(FP8)),
     r"tensor 'midlayer\.input_layernorm\.weight' is float8_e4m3fn, expected a floating activation dtype"),
    ("fp8 embedding", _with("embed_tokens.weight", lambda s: s["embed_tokens.weight"].to(FP8)),
     r"tensor 'embed_tokens\.weight' is float8_e4m3fn, expected a floating activation dtype"),
    ("e5m2 linear", _with("fc.weight", lambda s: s["fc.weight"].float().to(torch.float8_e5m2)),
     r"tensor 'fc\.weight' is float8_e5m2; fp8 weights must be float8_e4m3fn"),
]


@pytest.mark.parametrize("name,change,match", PLAN_ERRORS, ids=[c[0] for c in PLAN_ERRORS])
def test_plan_errors_name_file_and_key(tmp_path, name, change, match):
    cfg = head_cfg(layers=1)
    path = _write_head(tmp_path / "h", cfg, change(_fp8_state(cfg)))
    with pytest.raises(WeightsError, match=match) as err:
        load_draft_head(path)
    assert "model.safetensors" in str(err.value)
    d = describe_draft_head(path)
    assert any(re.search(match, p) for p in d["problems"]), d["problems"]
    # a scale is never reported as an unexpected tensor
    assert not any("unexpected tensor" in p and "_scale" in p for p in d["problems"])


def test_fp8_linears_and_scales_do_not_count_as_mixed_dtypes(tmp_path):
    cfg = head_cfg()
    state = _fp8_state(cfg)
    path = _write_head(tmp_path / "h", cfg, state)
    d = describe_draft_head(path)
    assert d["problems"] == [] and d["warnings"] == [] and d["stored_dtype"] == "bfloat16"
    # a bf16 weight among fp32 norms is still a mixed head
    state["norm.weight"] = state["norm.weight"].float()
    path = _write_head(tmp_path / "mixed", cfg, state)
    with pytest.raises(WeightsError, match=r"'norm\.weight' is float32 but the rest of the head is bfloat16"):
        load_draft_head(path)
    assert load_draft_head(path, dtype=torch.float32).weights.norm.dtype == torch.float32


def test_fp8_target_embedding_is_refused(tmp_path):
    cfg = head_cfg()
    w = _weights(cfg).quantized()
    path = save_draft_head(w, cfg, tmp_path / "h", include_embedding=False)
    with pytest.raises(WeightsError, match=r"embed_tokens= \(embedding\) has dtype float8_e4m3fn, expected a floating activation"):
        load_draft_head(path, embed_tokens=w.embed_tokens.to(FP8))
    assert load_draft_head(path, embed_tokens=w.embed_tokens).weights.is_fp8


# ----------------------------------------------------------------------------------------------
# describe / inspect
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_describe_counts_fp8_bytes_and_floor(tmp_path, arch):
    cfg = head_cfg(arch)
    w = _weights(cfg)
    q = w.quantized()
    plain_path = save_draft_head(w, cfg, tmp_path / "plain", include_embedding=True)
    fp8_path = save_draft_head(q, cfg, tmp_path / "fp8", include_embedding=True)
    depth, bw = 5, 3.0

    def floor(x):
        return (x.fc_bytes() + (depth + 1) * x.layer_bytes()) / (bw * 1e12) * 1e3

    plain = describe_draft_head(plain_path, depth=depth, bandwidth_tbs=bw)
    assert plain["weight_format"]["name"] == "bfloat16" and plain["bytes"]["per_depth"] == w.layer_bytes()
    assert plain["floor"]["ms"] == pytest.approx(floor(w))
    # the fp8 figure beside the bf16 one, and the same figure when asked for (quantize="fp8")
    assert plain["fp8"]["bytes"]["per_depth"] == q.layer_bytes() and plain["fp8"]["bytes"]["fc"] == q.fc_bytes()
    assert plain["fp8"]["floor"]["ms"] == pytest.approx(floor(q))
    asked = describe_draft_head(plain_path, depth=depth, bandwidth_tbs=bw, quantize="fp8")
    assert asked["bytes"] == plain["fp8"]["bytes"] and asked["floor"] == plain["fp8"]["floor"]
    assert asked["weight_format"] == plain["weight_format"]
    # for eagle2 the lm_head is the target's: stored heads count it in the activation dtype
    on_disk = describe_draft_head(fp8_path, depth=depth, bandwidth_tbs=bw)
    stored = q if arch == "eagle3" else replace(q, lm_head=w.lm_head, scales={k: v for k, v in q.scales.items() if k != "lm_head.weight"})
    assert on_disk["bytes"]["per_depth"] == stored.layer_bytes() and on_disk["bytes"]["fc"] == stored.fc_bytes()
    assert on_disk["floor"]["ms"] == pytest.approx(floor(stored)) and on_disk["problems"] == []
    n = len([k for k, _ in w.tensors() if is_linear_key(k)])
    k = n - (arch == "eagle2")
    assert on_disk["weight_format"]["fp8_linears"] == k and on_disk["weight_format"]["linears"] == n
    # a loaded head describes what it holds
    head = load_draft_head(fp8_path, **({"lm_head": w.lm_head} if arch == "eagle2" else {}))
    hd = head.describe(depth=depth, bandwidth_tbs=bw)
    assert hd["bytes"] == on_disk["bytes"] and hd["floor"] == on_disk["floor"]
    text = format_description(plain)
    assert "format        bfloat16" in text and "bytes (bfloat16)" in text
    assert f"fp8 floor     {plain['fp8']['floor']['ms']:.4g} ms" in text
    text = format_description(describe_draft_head(plain_path, quantize="fp8"))
    assert "bytes (fp8 e4m3 + fp32 scales for all" in text and "fp8 floor" not in text


def test_inspect_cli_prints_the_fp8_format_bytes_and_floor(tmp_path, capsys):
    from frontier.cli import main

    cfg = head_cfg()
    w = _weights(cfg)
    q = w.quantized()
    plain = save_draft_head(w, cfg, tmp_path / "plain", include_embedding=False, shards=2)
    fp8 = save_draft_head(q, cfg, tmp_path / "fp8", include_embedding=False)
    assert main(["inspect", str(plain), "--depth", "4", "--bandwidth-tbs", "2"]) == 0
    out = capsys.readouterr().out
    fl = (q.fc_bytes() + 5 * q.layer_bytes()) / 2e12 * 1e3
    assert "format        bfloat16" in out and f"fp8 floor     {fl:.4g} ms" in out and "floor         " in out
    assert main(["inspect", str(plain), "--quantize", "fp8", "--json", "--depth", "4", "--bandwidth-tbs", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bytes"]["per_depth"] == q.layer_bytes() and d["floor"]["ms"] == pytest.approx(fl)
    assert main(["inspect", str(fp8), "--dtype", "stored"]) == 0
    out = capsys.readouterr().out
    assert "format        fp8 e4m3 with per-channel fp32 scales, all 9 linears; activations bfloat16" in out
    assert main(["inspect", str(fp8), "--json", "--depth", "4", "--bandwidth-tbs", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bytes"]["per_depth"] == q.layer_bytes() and d["bytes"]["fc"] == q.fc_bytes()
    assert d["weight_format"]["fp8"].startswith("float8_e4m3fn") and d["problems"] == []
    assert main(["inspect", str(fp8), "--quantize", "int8"]) == 2
    assert "argument --quantize: invalid choice: 'int8'" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# drafting: an fp8 head drafts exactly as its dequantized weights
# ----------------------------------------------------------------------------------------------
@needs_torch_ref
@pytest.mark.parametrize("arch,sizes", [("eagle3", dict(v=37, vt=83, h=30, nh=5, nkv=1, inter=46)),
                                        ("eagle2", dict(v=53, h=18, nh=3, nkv=3, inter=22, layers=2))],
                         ids=["eagle3", "eagle2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_fp8_head_drafts_as_its_dequantized_weights(tmp_path, arch, sizes, dtype):
    cfg = head_cfg(arch, **sizes)
    q = _weights(cfg, seed=11, dtype=dtype).quantized()
    path = save_draft_head(q, cfg, tmp_path / "h", include_embedding=True)
    head = load_draft_head(path, **({"lm_head": q.dequantized().lm_head, "quantize": "fp8"} if arch == "eagle2" else {}))
    deq = head.weights.dequantized()
    assert not deq.is_fp8
    for t, d, k in ((2, 1, 1), (13, 3, 3), (19, 5, 4)):
        c = head.config(total_token=t, depth=d, top_k=k)
        for seed in (0, 1, 2):
            a, b = _draft(c, head.weights, seed), _draft(c, deq, seed)
            assert torch.equal(a.draft_tokens, b.draft_tokens), (t, d, k, seed)
            assert torch.equal(a.retrieve_indices, b.retrieve_indices), (t, d, k, seed)
            assert torch.equal(a.tree_mask, b.tree_mask), (t, d, k, seed)
            a.check_invariants(total_token=t, depth=d, top_k=k)


# ----------------------------------------------------------------------------------------------
# scales that a kernel could misread, and layouts of other fp8 checkpoints
# ----------------------------------------------------------------------------------------------
def test_a_strided_scale_is_refused_by_name():
    cfg = head_cfg()
    q = _weights(cfg, dtype=torch.float32).quantized()
    s = q.scales["lm_head.weight"]
    q.scales["lm_head.weight"] = torch.stack([s, s], 1)[:, 0]  # the values, every other element
    with pytest.raises(WeightsError, match="lm_head.weight_scale.*contiguous.*strides"):
        q.validate(cfg)


def test_a_scale_past_the_activation_dtypes_range_is_refused():
    cfg = head_cfg()
    q = _weights(cfg, dtype=torch.float16).quantized()
    q.scales["fc.weight"][3] = 512.0  # 448 * 512 > 65504: the dequantized weight could be Inf in fp16
    with pytest.raises(WeightsError, match=r"fc.weight_scale' row 3 is 512.0.*finite in torch.float16"):
        q.validate(cfg)


def test_quantizing_fp16_weights_near_its_largest_value_keeps_them_finite():
    w = torch.tensor([[65504.0, -60000.0, 1.0, 0.0], [0.001, 0.002, -0.003, 0.0]], dtype=torch.float16)
    q, s = quantize_fp8(w)
    deq = dequantize_fp8(q, s, torch.float16)
    assert torch.isfinite(deq).all()
    assert float(s[0]) == 256.0 and float(deq[0, 0]) == 240.0 * 256  # (65504 / 256 rounds up to 256: 65536 is Inf)
    assert float(deq[0, 1]) == -240.0 * 256  # (rounded to nearest: in range, unchanged)


def test_an_e5m2_head_is_refused():
    cfg = head_cfg()
    w = _weights(cfg, dtype=torch.float32)
    e5 = DraftWeights.from_state_dict({k: v.to(torch.float8_e5m2) if v.is_floating_point() else v
                                       for k, v in w.state_dict().items()})
    with pytest.raises(WeightsError, match="activation dtype"):
        e5.validate(cfg)
    with pytest.raises(WeightsError, match="activation dtype"):
        w.to(dtype=torch.float8_e5m2)


def test_quantized_names_the_tensor_with_non_finite_values():
    cfg = head_cfg()
    w = _weights(cfg, dtype=torch.float32)
    w.layers[0].down_proj[2, 1] = float("nan")
    with pytest.raises(WeightsError, match="down_proj.weight.*row 2"):
        w.quantized()


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_scales_stored_as_a_column_load_as_one_per_output_channel(tmp_path, fmt):
    """Some fp8 checkpoints store each scale as [out, 1]; it loads as [out]."""
    cfg = head_cfg()
    q = _weights(cfg, dtype=torch.float32).quantized()
    save_draft_head(q, cfg, tmp_path, format=fmt, include_embedding=True, overwrite=True)
    name = "model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"
    if fmt == "safetensors":
        from safetensors.torch import load_file, save_file

        state = load_file(str(tmp_path / name))
        save_file({k: (v[:, None].contiguous() if k.endswith("_scale") else v) for k, v in state.items()},
                  str(tmp_path / name), metadata={"format": "pt"})
    else:
        state = torch.load(tmp_path / name)
        torch.save({k: (v[:, None].contiguous() if k.endswith("_scale") else v) for k, v in state.items()},
                   tmp_path / name)
    head = load_draft_head(tmp_path)
    for key, s in q.scales.items():
        assert torch.equal(head.weights.scales[key], s)


def test_derived_data_and_value_checks_are_kept_until_a_tensor_changes():
    """``DraftWeights.memo`` and the remembered value check are reused while every tensor of the
    head is the same object in the same state, and made again when one is written in place, given
    other data (``.data =``), replaced by another tensor, or (the value check) asked about another
    target vocabulary."""
    cfg = head_cfg()
    w = _weights(cfg).quantized()
    calls = []

    def make():
        calls.append(1)
        return len(calls)

    vt = cfg.target_vocab_size
    w.check_values(vt)  # (no state dict given: the head's own)
    seen = w._values_ok
    assert w.memo("k", make) == 1 and w.memo("k", make) == 1
    assert w.check_values(vt) is w and w._values_ok is seen
    w.check_values(vt + 1)
    assert w._values_ok is not seen and w._values_ok[0] == vt + 1
    changes = [
        lambda: w.embed_tokens.mul_(1.0),  # in place: a new version, the same values
        lambda: setattr(w.embed_tokens, "data", w.embed_tokens.detach().clone()),  # other storage
        lambda: setattr(w.layers[0], "o_proj", w.layers[0].o_proj.clone()),  # another tensor
        lambda: setattr(w.scales[next(iter(w.scales))], "data", w.scales[next(iter(w.scales))].clone()),  # a scale
    ]
    for n, change in enumerate(changes, start=2):
        seen = w._values_ok
        with torch.no_grad():
            change()
        assert w.memo("k", make) == n and w.memo("k", make) == n
        w.check_values(vt + 1)
        assert w._values_ok is not seen
    w.clear_memo()
    assert w.memo("k", make) == len(changes) + 2


def test_a_scale_at_the_activation_dtypes_limit_is_accepted():
    """The largest scale whose products with every e4m3 value stay finite in the activation dtype
    (its largest value / 448) is accepted; the next larger float32 is refused, naming its row."""
    cfg = head_cfg()
    q = _weights(cfg, dtype=torch.float16).quantized()
    limit = torch.finfo(torch.float16).max / FP8_MAX
    s = q.scales["fc.weight"]
    s[3] = limit
    assert float(s[3]) <= limit  # (float32 rounding kept it within the limit)
    q.validate(cfg)
    s[5] = torch.nextafter(s[3], torch.tensor(float("inf")))
    with pytest.raises(WeightsError, match=r"^weights: fp8 scale 'fc.weight_scale' row 5 .*finite in torch.float16"):
        q.check_values(cfg.target_vocab_size)  # (the first bad row is named, not row 3 at the limit)


def test_quantized_keeps_any_scale_when_asked():
    """``quantized(power_of_two=False)``: each row's scale is its largest magnitude / 448, not
    rounded up to a power of two (the loader's default), and the head dequantizes close to the
    original weights."""
    cfg = head_cfg()
    w = _weights(cfg, dtype=torch.float32)
    exact, free = w.quantized(), w.quantized(power_of_two=False)
    s_exact, s_free = exact.scales["fc.weight"], free.scales["fc.weight"]
    assert torch.equal(torch.exp2(torch.log2(s_exact).round()), s_exact)
    assert not torch.equal(torch.exp2(torch.log2(s_free).round()), s_free)
    assert torch.allclose(s_free, w.fc_weight.abs().amax(dim=1) / FP8_MAX)


def test_dequantize_fp8_makes_its_output_on_the_weights_device():
    q = torch.zeros(4, 8, dtype=FP8, device="meta")
    assert dequantize_fp8(q, torch.ones(4, device="meta"), torch.bfloat16).device.type == "meta"


def test_quantizing_the_largest_float32_keeps_it():
    """A scale that is not a power of two can bring 448 * scale back to exactly the dtype's
    largest value: that is in range, so the e4m3 value stays 448 (only values past it step down)."""
    big = torch.finfo(torch.float32).max
    q, s = quantize_fp8(torch.tensor([[big, 1.0]]), power_of_two=False)
    assert float(q[0, 0].float()) == FP8_MAX
    assert float(dequantize_fp8(q, s, torch.float32)[0, 0]) == big


def test_row_blocks_cover_every_row_once_within_the_element_budget():
    """quantize_fp8 / dequantize_fp8 convert in row blocks of at most ``_CHUNK_ELEMS`` elements
    (at least one row), so no fp32 copy of a whole matrix is made."""
    from frontier.weights import _CHUNK_ELEMS, _row_chunks

    for n_rows, n_cols in [(_CHUNK_ELEMS, 1), (7, _CHUNK_ELEMS), (3, 2 * _CHUNK_ELEMS), (9, _CHUNK_ELEMS // 4 + 1)]:
        blocks = list(_row_chunks(n_rows, n_cols))
        assert blocks[0].start == 0 and blocks[-1].stop == n_rows
        assert all(a.stop == b.start for a, b in zip(blocks, blocks[1:]))  # each row once, in order
        assert all((b.stop - b.start) * n_cols <= _CHUNK_ELEMS or b.stop - b.start == 1 for b in blocks)
        assert all((b.stop - b.start + 1) * n_cols > _CHUNK_ELEMS for b in blocks[:-1])  # no smaller than need be


@pytest.mark.parametrize("dtype", [torch.int32, torch.float8_e4m3fn, torch.float64])
def test_quantize_fp8_refuses_weights_that_are_not_16_or_32_bit_floats(dtype):
    with pytest.raises(WeightsError, match=rf"quantize_fp8 takes a float32, float16 or bfloat16 weight, got {dtype}"):
        quantize_fp8(torch.zeros(2, 4).to(dtype))


def test_a_stamp_never_matches_new_data_at_a_freed_storages_address():
    """``t.data = other`` moves no version counter, and new data may land at the address of the
    storage it replaced once that is freed (allocators reuse blocks): the stamp holds a weak
    reference to the storage itself, so such a tensor is never taken for the one stamped. (Two
    storages over one buffer stand for the allocator handing the same block out twice.)"""
    from frontier.weights import stamp_matches, tensors_stamp

    a, b = torch.zeros(3), torch.zeros(3)
    assert stamp_matches(tensors_stamp([a, b]), [a, b])
    assert not stamp_matches(None, [a]) and not stamp_matches(tensors_stamp([a]), [a, b])
    assert not stamp_matches(tensors_stamp([a, b]), [b, a])
    block = bytearray(4 * 64)
    t = torch.zeros(64)
    t.data = torch.frombuffer(block, dtype=torch.float32)
    stamp, address = tensors_stamp([t]), t.data_ptr()
    assert stamp_matches(stamp, [t])
    t.data = torch.zeros(64)  # the stamped storage is freed here
    t.data = torch.frombuffer(block, dtype=torch.float32)  # another storage at the same address
    assert t.data_ptr() == address and not stamp_matches(stamp, [t])
