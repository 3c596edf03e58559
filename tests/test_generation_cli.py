"""``frontier generate`` on random tiny models (no downloads): output, stats, lossless --compare."""

from __future__ import annotations

import json

from frontier.cli import main
from gen_support import _one_thread  # noqa: F401


def test_generate_random_tiny_json_compare(capsys):
    rc = main(["generate", "--random-tiny", "--backend", "torch_ref", "--max-new-tokens", "9", "--compare", "--json",
               "--device", "cpu", "--dtype", "float32", "--total-tokens", "10", "--depth", "3", "--tree-top-k", "3"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["compare"]["identical"] is True
    assert len(out["new_token_ids"]) == 9 and out["stats"]["new_tokens"] == 9
    assert out["stats"]["target_forwards"] == 1 + out["stats"]["verify_steps"]


def test_generate_text_table_and_sampling(capsys):
    rc = main(["generate", "--random-tiny", "--backend", "stub", "--max-new-tokens", "6", "--temperature", "0.7",
               "--input-ids", "5,6,7", "--device", "cpu", "--seed", "3"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "prompt: 3 tokens" in text and "mean accepted length" in text and "tokens/s" in text
    new = text.split("new tokens:")[1].splitlines()[0].split()
    assert len(new) == 6
    rc = main(["generate", "--random-tiny", "--backend", "stub", "--max-new-tokens", "6", "--temperature", "0.7",
               "--input-ids", "5,6,7", "--device", "cpu", "--seed", "3"])
    again = capsys.readouterr().out.split("new tokens:")[1].splitlines()[0].split()
    assert again == new  # seeded


def test_generate_tree_and_sampling_flags_are_apart(capsys):
    """--tree-top-k is the tree's K, --top-k sampling top-k; --total-token is --total-tokens' old spelling."""
    base = ["generate", "--random-tiny", "--backend", "stub", "--max-new-tokens", "5", "--input-ids", "5,6,7",
            "--device", "cpu", "--dtype", "fp32", "--json", "--depth", "2", "--tree-top-k", "2"]
    outs = []
    for argv in (["--total-tokens", "5"], ["--total-token", "5"], ["--total-tokens", "5", "--top-k", "3"]):
        assert main(base + argv) == 0
        outs.append(json.loads(capsys.readouterr().out)["new_token_ids"])
    assert outs[0] == outs[1] == outs[2]  # greedy: sampling top-k changes nothing
    assert main(base + ["--total-tokens", "99"]) == 2  # K 2, depth 2 cannot hold 99 nodes: the tree's K was taken
    assert "total_token" in capsys.readouterr().err


def test_generate_cli_errors(capsys):
    assert main(["generate", "--max-new-tokens", "3"]) == 2
    assert "--random-tiny" in capsys.readouterr().err
    assert main(["generate", "--random-tiny", "--prompt", "hi", "--device", "cpu"]) == 2
    assert "--input-ids" in capsys.readouterr().err
    assert main(["generate", "--random-tiny", "--input-ids", "1,x", "--device", "cpu"]) == 2
    assert main(["generate", "--random-tiny", "--input-ids", "4,5,6", "--max-length", "2", "--device", "cpu"]) == 2
    assert "max_length=2 leaves no room" in capsys.readouterr().err
    assert main(["generate", "--random-tiny", "--input-ids", "4,5,6", "--draft-mode", "graph", "--device", "cpu"]) == 2
    assert "--draft-mode is an option of the triton backend" in capsys.readouterr().err


def test_generate_from_local_checkpoints(tmp_path, capsys):
    """--target/--head: a saved random Llama and a head saved in the published layout (no embedding)."""
    from frontier.generation import random_pair
    from frontier.loading import save_draft_head

    target, cfg, w = random_pair("tiny", total_token=12, depth=3, top_k=3, seed=5)
    target.save_pretrained(tmp_path / "target")
    save_draft_head(w, cfg, tmp_path / "head")
    rc = main(["generate", "--target", str(tmp_path / "target"), "--head", str(tmp_path / "head"),
               "--input-ids", "5,6,7,8", "--max-new-tokens", "8", "--compare", "--json", "--device", "cpu",
               "--total-tokens", "12", "--depth", "3", "--tree-top-k", "3", "--no-eos"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["compare"]["identical"] is True
    assert len(out["new_token_ids"]) == 8
