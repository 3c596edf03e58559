"""tools/train_head.py on the CPU: a tiny random Llama target (8 layers, so three distinct tap
layers) with a byte-level tokenizer and a chat template, a few training steps; the saved head
loads, matches frontier's torch_ref forward and drafts in frontier.generate."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import frontier
from frontier.generation import random_pair

REPO = Path(__file__).resolve().parent.parent
PROMPTS = REPO / "tools" / "prompts"
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


def _load(name: str, path: Path):
    """A script of the repository as a module (registered first: dataclasses look it up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return sys.modules[name]


train_head = _load("train_head", REPO / "tools" / "train_head.py")
bench = _load("real_model_bench", REPO / "benchmarks" / "real_model.py")


def _byte_tokenizer():
    """256 byte-level tokens (the tiny target's vocabulary) and a plain chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return fast


@pytest.fixture(scope="module")
def tiny_target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_target")
    target, _, _ = random_pair("tiny", seed=3)
    with torch.no_grad():
        target.lm_head.weight.mul_(40.0)  # peaked next-token distributions, as a trained model's
    target.save_pretrained(path)
    _byte_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def trained(tiny_target_dir, tmp_path_factory):
    """(summary, head dir) of one short CPU run (float32 weights, a 64-token draft vocabulary)."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("head") / "head"
    summary = train_head.main([
        "--target", str(tiny_target_dir), "--out", str(out), "--device", "cpu", "--num-prompts", "8",
        "--max-new-tokens", "24", "--gen-batch", "4", "--draft-vocab", "64", "--steps", "40", "--batch-size", "4",
        "--ttt-steps", "3", "--lr", "3e-3", "--save-dtype", "float32", "--log-every", "1000", "--seed", "0",
        "--val-fraction", "0.25",
    ])
    return summary, out


def test_saves_the_published_layout(trained):
    summary, out = trained
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 64 and config["vocab_size"] == 256
    assert (out / "model.safetensors").is_file() and (out / "training.json").is_file()
    assert summary["samples"] == 8 and summary["answer_tokens"] > 0 and summary["held_out_samples"] == 2
    held_out = summary["held_out"]
    assert len(held_out["kl"]) == len(held_out["acc"]) == 3 and all(0.0 <= a <= 1.0 for a in held_out["acc"])


def test_loss_decreases(trained):
    curve = trained[0]["loss_curve"]  # weighted KL(target || draft) per step
    assert len(curve) == 40
    assert sum(curve[-5:]) / 5 < 0.7 * sum(curve[:5]) / 5, curve


def test_saved_head_is_frontiers_forward(trained):
    check = trained[0]["check"]
    assert check["max_abs_logprob_diff"] < 1e-4, check
    assert check["top1_agree"] and check["root_top1_in_tree"], check


def test_frontier_generates_with_the_head(trained, tiny_target_dir):
    from transformers import LlamaForCausalLM

    _, out = trained
    target = LlamaForCausalLM.from_pretrained(tiny_target_dir, attn_implementation="sdpa").eval()
    head = frontier.load_draft_head(out, target=tiny_target_dir)
    assert head.weights.d2t is not None and head.weights.lm_head.shape == (64, 64)
    cfg = head.config(total_token=16, depth=4, top_k=4)
    ids = torch.tensor([[60, 70, 80, 90, 100, 110]])
    res = frontier.generate(target, ids, cfg=cfg, weights=head.weights, backend="torch_ref", max_new_tokens=12, eos_token_id=None)
    ref = target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0
    )
    assert torch.equal(res.sequences, ref)
    assert res.stats.mean_accepted_length >= 1.0


def test_same_seed_same_head(tiny_target_dir, tmp_path):
    argv = ["--target", str(tiny_target_dir), "--device", "cpu", "--num-prompts", "2", "--max-new-tokens", "6",
            "--draft-vocab", "32", "--steps", "3", "--batch-size", "2", "--ttt-steps", "2", "--log-every", "1000"]
    a = train_head.main(argv + ["--out", str(tmp_path / "a")])
    b = train_head.main(argv + ["--out", str(tmp_path / "b")])
    assert a["loss_curve"] == b["loss_curve"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_prompt_files_do_not_overlap():
    train = train_head.read_prompts(PROMPTS / "train.jsonl")
    heldout = train_head.read_prompts(PROMPTS / "heldout.jsonl")
    assert len(train) >= 500 and len(heldout) >= 50
    assert len(set(train)) == len(train) and not set(train) & set(heldout)


def test_read_prompts_names_the_bad_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: .*'prompt'"):
        train_head.read_prompts(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_head.read_prompts(tmp_path / "missing.jsonl")


def test_draft_vocabulary_most_frequent_then_lowest_unused():
    samples = [train_head.Sample(ids=[9, 9, 5, 7, 7, 7, 9], prompt_len=1)]  # answer: 9, 5, 7, 7, 7, 9
    assert train_head.draft_vocabulary(samples, 2, 10).tolist() == [7, 9]
    assert train_head.draft_vocabulary(samples, 4, 10).tolist() == [0, 5, 7, 9]
    with pytest.raises(ValueError, match="draft_vocab"):
        train_head.draft_vocabulary(samples, 11, 10)


def test_ttt_attention_step_one_sees_context_and_itself():
    """Step 1's row p attends to step 0's rows 0..p and its own step-1 key only."""
    cfg = train_head.head_config(random_pair("tiny", seed=0)[0].config, 32, None)
    q = torch.randn(1, cfg.num_attention_heads, 5, cfg.head_dim)
    k0, v0 = (torch.randn(1, cfg.num_key_value_heads, 5, cfg.head_dim) for _ in range(2))
    k1, v1 = (torch.randn(1, cfg.num_key_value_heads, 5, cfg.head_dim) for _ in range(2))
    out = train_head._ttt_attention(cfg, q, (k0, v0), [(k1, v1)])  # [1, 5, nh*d]
    v1_changed = v1.clone()
    v1_changed[:, :, 3] += 10.0  # row 3's own value: only row 3 may change
    again = train_head._ttt_attention(cfg, q, (k0, v0), [(k1, v1_changed)])
    changed = (again - out).abs().amax(-1)[0] > 1e-6  # [5]
    assert changed.tolist() == [False, False, False, True, False]


def test_real_model_benchmark_on_the_cpu(trained, tiny_target_dir, tmp_path, capsys):
    """benchmarks/real_model.py with the trained head: torch_ref only, float32, two held-out prompts."""
    out = tmp_path / "rm.json"
    report = bench.main([
        "--target", str(tiny_target_dir), "--head", str(trained[1]), "--device", "cpu", "--dtype", "float32",
        "--num-prompts", "2", "--max-new-tokens", "8", "--trees", "16/4/4,6/2/2", "--bench-tree", "16/4/4",
        "--backends", "torch_ref", "--split-prompts", "1", "--json-out", str(out),
    ])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert [r["tree"] for r in report["accept"]] == ["16/4/4", "6/2/2"]
    assert all(r["mean_accepted_length"] >= 1.0 and r["verify_steps"] > 0 for r in report["accept"])
    (row,) = report["bench"]["frontier"]
    assert row["identical"] and row["new_tokens"] == report["bench"]["baseline"]["new_tokens"]
    assert row["draft_ms_per_step"] > 0 and row["verify_ms_per_step"] > 0
    printed = capsys.readouterr().out
    assert "mean accepted length" in printed and "target.generate" in printed


def test_real_model_benchmark_refuses_a_bad_tree():
    with pytest.raises(SystemExit):
        bench.parse_args(["--target", "t", "--head", "h", "--trees", "60/5"])
    assert bench.parse_tree("60/5/10") == (60, 5, 10)
    assert bench.parse_backend("triton:persistent") == ("triton", {"mode": "persistent"}, None)
    assert bench.parse_backend("triton:calls") == ("triton", {}, False)
    assert bench.parse_backend("torch_ref") == ("torch_ref", {}, None)


def test_smollm2_gguf_override(monkeypatch, tmp_path):
    """$FRONTIER_SMOLLM2_GGUF (what tools/gpu/real_model.sh sets) replaces the package lookup and
    names the cached directory after the file's size and content: another file of the same size
    is another directory."""
    from frontier.errors import FrontierError
    from frontier.models import smollm2

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"x" * 123)
    built = []

    def fake_build(out, dtype, version):
        built.append(version)
        for name in ("config.json", "model.safetensors", "tokenizer.json", "frontier_build.json"):
            (out / name).write_text("{}")

    monkeypatch.setattr(smollm2, "_build", fake_build)
    monkeypatch.setattr(smollm2, "package_version", lambda: pytest.fail("the package must not be looked up"))
    monkeypatch.setenv("FRONTIER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(smollm2.GGUF_ENV, str(gguf))
    version = "file-123-" + hashlib.sha256(b"x" * 123).hexdigest()[:16]
    assert smollm2.gguf_path() == gguf and smollm2.source_version() == version
    path = smollm2.smollm2_dir()
    assert path.name == f"smollm2-135m-instruct-q4_1-{version}-float32-v1" and built == [version]
    gguf.write_bytes(b"y" * 123)  # another file of the same size: built again, beside the first
    assert smollm2.smollm2_dir() != path and len(built) == 2 and path.exists()
    monkeypatch.setenv(smollm2.GGUF_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(FrontierError, match="FRONTIER_SMOLLM2_GGUF=.*missing.gguf.* is not a file"):
        smollm2.gguf_path()
