"""The maintained tools under benchmarks/ and tools/ still start (CPU only, no GPU work): every
Python tool answers --help, every shell script parses, and none reaches into the triton backend's
internals (its tuning knobs or private launch functions)."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PY_TOOLS = sorted(p.relative_to(REPO).as_posix() for d in ("benchmarks", "tools") for p in (REPO / d).rglob("*.py"))
SH_TOOLS = sorted(p.relative_to(REPO).as_posix() for d in ("benchmarks", "tools") for p in (REPO / d).rglob("*.sh"))


def test_the_tools_are_found():
    assert {"benchmarks/host_overhead.py", "benchmarks/bf16_match.py", "benchmarks/generate.py",
            "tools/mutation.py", "tools/gpu/parity_summary.py"} <= set(PY_TOOLS)
    assert {"benchmarks/ab.sh", "tools/gpu/env.sh", "tools/gpu/test_suite.sh"} <= set(SH_TOOLS)
    assert not (REPO / "scripts").exists()


@pytest.mark.parametrize("tool", PY_TOOLS)
def test_python_tool_answers_help(tool, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [tool, "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / tool), run_name="__main__")
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("tool", SH_TOOLS)
def test_shell_tool_parses(tool):
    proc = subprocess.run(["bash", "-n", str(REPO / tool)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_tools_reference_only_existing_paths():
    """Paths of tools that the tools and their guide name exist (a moved tool leaves no dangling name)."""
    import re

    pattern = re.compile(r"\b((?:benchmarks|tools)/[\w/.-]+\.(?:py|sh|md))")
    for f in PY_TOOLS + SH_TOOLS + ["benchmarks/README.md", "tools/mutation_equivalents.md"]:
        for path in pattern.findall((REPO / f).read_text()):
            assert (REPO / path).exists(), f"{f} names {path}, which does not exist"


@pytest.mark.parametrize("tool", [t for t in PY_TOOLS + SH_TOOLS if t.startswith("benchmarks/")])
def test_benchmarks_use_the_public_surface(tool):
    """Maintained timing tools pass at most the triton option mode; no Tuning, no backend internals."""
    text = (REPO / tool).read_text()
    for word in ("Tuning", "frontier.backends", "tuning=", "_launch"):
        assert word not in text, f"{tool} uses {word}"


def test_mutation_tool_lists_its_modules(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["tools/mutation.py", "--list"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "tools" / "mutation.py"), run_name="__main__")
    assert exc.value.code == 0
    listed = capsys.readouterr().out.split()
    assert "tree" in listed
    for word in listed:
        if word.startswith("tests/"):
            assert (REPO / word.split("::")[0]).exists(), word
    assert (REPO / "tools" / "mutation_equivalents.md").exists()


# -- benchmarks/fp8_quality.py and real_model.py --weights: their core functions on tiny random heads --
def _load_tool(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_tool_{name}", REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fp8_quality_measures_plain_against_quantized_trees(one_thread):
    import torch

    from frontier.random_head import random_config, random_weights

    fq = _load_tool("fp8_quality")
    cfg = random_config(total_token=12, depth=3, top_k=3, vocab_size=64, target_vocab_size=96, hidden_size=32)
    make = lambda seed: random_weights(cfg, seed=seed, lm_head_scale=6.0)  # noqa: E731
    res = fq.measure(cfg, make, seeds=[0, 1], device="cpu", dtype=torch.float32, context=10, new_rows=3)
    assert set(res) == {"pow2", "absmax"}
    for s in res.values():
        assert s["calls"] == 4 and 0 <= s["identical"] <= 4
        for key in ("identical_rate", "mean_shared_nodes", "mean_root_topk", "root_topk_same_order_rate"):
            assert 0.0 <= s[key] <= 1.0, (key, s)
        assert s["mean_shared_nodes"] >= s["identical_rate"]  # an identical tree shares every node
    # a head that is already fp8 quantizes to itself: every tree and root top-K the same
    same = fq.measure(cfg, lambda seed: make(seed).quantized(), seeds=[0], device="cpu", dtype=torch.float32,
                      context=10, new_rows=3, variants=["pow2"])["pow2"]
    assert same == {"calls": 2, "identical": 2, "identical_rate": 1.0, "mean_shared_nodes": 1.0,
                    "mean_root_topk": 1.0, "root_topk_same_order_rate": 1.0}


def test_fp8_quality_node_paths_and_overlap():
    import torch

    from frontier import Frontier

    fq = _load_tool("fp8_quality")

    def tree(tokens, parents):  # a Frontier of the given tokens, node i's parent parents[i] (root: -1)
        n = len(tokens)
        mask = torch.zeros(1, 1, n, n)
        for i in range(n):
            j = i
            while j >= 0:
                mask[0, 0, i, j], j = 1.0, parents[j]
        return Frontier(draft_tokens=torch.tensor([tokens]), retrieve_indices=torch.zeros(1, 1, dtype=torch.long),
                        tree_mask=mask, tree_position_ids=torch.zeros(n, dtype=torch.long))

    a = tree([5, 7, 8, 9], [-1, 0, 0, 1])
    assert fq.node_paths(a) == {(5,), (5, 7), (5, 8), (5, 7, 9)}
    b = tree([5, 8, 7, 9], [-1, 0, 0, 1])  # token 9 now under 8: a different node
    c = fq.compare_trees(a, b)
    assert c == {"identical": False, "shared_nodes": 0.75}
    assert fq.compare_trees(a, a) == {"identical": True, "shared_nodes": 1.0}
    assert fq.summarize([c, {"identical": True, "shared_nodes": 1.0}]) == {
        "calls": 2, "identical": 1, "identical_rate": 0.5, "mean_shared_nodes": 0.875}


def test_fp8_quality_options():
    fq = _load_tool("fp8_quality")
    a = fq.parse_args(["--configs", "medium,eagle3-llama3.2-1b", "--seeds", "2", "--device", "cpu"])
    assert a.configs == ["medium", "eagle3-llama3.2-1b"] and a.seeds == 2
    for bad in (["--configs", "llama"], ["--seeds", "0"], ["--context", "4", "--new-rows", "4"]):
        with pytest.raises(SystemExit):
            fq.parse_args(bad)
    cfg = fq.preset_config("eagle3-llama3.1-8b")
    assert (cfg.total_token, cfg.depth, cfg.top_k, cfg.hidden_size) == (60, 7, 10, 4096)


def test_real_model_weights_option():
    rm = _load_tool("real_model")
    base = ["--target", "T", "--head", "H"]
    assert rm.parse_args(base).weights == ["plain"]
    assert rm.parse_args(base + ["--weights", "plain,fp8"]).weights == ["plain", "fp8"]
    assert rm.parse_args(base + ["--weights", "fp8,fp8"]).weights == ["fp8"]
    for bad in ("int8", "", "plain,bf16"):
        with pytest.raises(SystemExit):
            rm.parse_args(base + ["--weights", bad])


def test_real_model_accept_rows_per_weights_with_tree_comparison(one_thread):
    """The accept phase's row of plain weights, with every step's tree compared to other weights:
    against the same weights every tree is identical; against fp8 one comparison per step."""
    from types import SimpleNamespace

    import torch

    from frontier.generation import random_pair

    rm = _load_tool("real_model")
    target, cfg, w = random_pair("tiny", total_token=16, depth=4, top_k=4, seed=0)
    head = SimpleNamespace(weights=w, config=lambda t, d, k: cfg.model_copy(update=dict(total_token=t, depth=d, top_k=k)))
    prompts = [torch.tensor([[3, 17, 42, 9, 100, 7]])]
    fp8 = rm.head_weights(head, ["plain", "fp8"])
    assert fp8["plain"] is w and fp8["fp8"].is_fp8
    # a head saved in fp8: plain is its dequantized form, fp8 the head as loaded
    saved = rm.head_weights(SimpleNamespace(weights=fp8["fp8"]), ["plain", "fp8"])
    assert saved["fp8"] is fp8["fp8"] and not saved["plain"].is_fp8
    assert torch.equal(saved["plain"].layers[0].q_proj, fp8["fp8"].dequantized().layers[0].q_proj)
    same = rm.accepted_lengths(target, head, prompts, (16, 4, 4), "torch_ref", 10, compare=("plain", w))
    assert same["weights"] == "plain"
    assert same["trees_vs_plain"]["calls"] == same["verify_steps"] > 0
    assert same["trees_vs_plain"]["identical_rate"] == 1.0 and same["trees_vs_plain"]["mean_shared_nodes"] == 1.0
    row = rm.accepted_lengths(target, head, prompts, (16, 4, 4), "torch_ref", 10, compare=("fp8", fp8["fp8"]))
    assert row["mean_accepted_length"] == same["mean_accepted_length"]  # the comparison does not steer generation
    assert row["trees_vs_fp8"]["calls"] == row["verify_steps"]
    q = rm.accepted_lengths(target, head, prompts, (16, 4, 4), "torch_ref", 10, weights=fp8["fp8"], weights_name="fp8")
    assert q["weights"] == "fp8" and q["verify_steps"] > 0 and "trees_vs_fp8" not in q
    assert "vs fp8: identical" in rm.accept_table([row, q])
