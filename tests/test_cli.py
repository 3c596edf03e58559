"""The `frontier` command line, run in-process: `backends` and `demo`."""

from __future__ import annotations

import json
import re

import pytest
import torch

from frontier import Frontier, get_backend
from frontier.cli import main
from frontier.commands.render import render_tree
from frontier.tree import pack_tree


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_no_command_prints_help(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    assert "usage: frontier" in out and "backends" in out and "demo" in out


def test_backends_table(capsys):
    code, out, _ = run(capsys, "backends")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["backend", "available", "needs", "devices", "source"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    rows = {line.split()[0]: line for line in lines[2:]}
    assert {"stub", "torch_ref", "triton"} <= set(rows)
    assert re.match(r"stub\s+yes\s+no weights\s+cpu,cuda\s+frontier\s*$", rows["stub"])
    for name in ("torch_ref", "triton"):
        ok, why = get_backend(name).availability()
        assert (" yes " in rows[name]) == ok
        if not ok:
            assert f"no: {why}" in rows[name]  # says why not
        assert "weights" in rows[name] and rows[name].rstrip().endswith("frontier")


def test_backends_json(capsys):
    code, out, _ = run(capsys, "backends", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["stub"] == {"name": "stub", "available": True, "why": "", "source": "frontier",
                            "needs": "no weights", "devices": "cpu,cuda"}
    assert rows["torch_ref"]["needs"] == "weights"


NODE = re.compile(r"\[(\d+)\] (\d+)  \(depth (\d+), score (-?\d+\.\d+)\)$")


def test_demo_stub_draws_the_tree(capsys):
    code, out, err = run(capsys, "demo", "--backend", "stub", "--total-token", "24", "--depth", "4", "--top-k", "4")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("backend=stub  T=24 depth=4 top_k=4")
    assert re.match(r"\[0\] \d+  \(root\)$", lines[1])
    nodes = [NODE.search(line) for line in lines[2:] if NODE.search(line)]
    assert sorted(int(m.group(1)) for m in nodes) == list(range(1, 24))  # every node drawn once
    # Tree glyphs: the indentation of a node is 4 characters per level below the root.
    for line in lines[2:]:
        m = NODE.search(line)
        if m:
            assert line.index("[") == 4 * (int(m.group(3)) - 1) + 4
            assert "── " in line
    assert re.search(r"^24 nodes, \d+ leaves, max depth [2-5], drafted in \d+\.\d ms$", out, re.M)


def test_demo_json_is_a_valid_frontier(capsys):
    code, out, _ = run(capsys, "demo", "--backend", "stub", "--json", "--total-token", "11", "--depth", "2",
                       "--top-k", "3", "--sampling", "--seed", "3")
    assert code == 0
    d = json.loads(out)
    fr = Frontier(
        draft_tokens=torch.tensor([d["draft_tokens"][0]]),
        retrieve_indices=torch.tensor(d["retrieve_indices"]),
        tree_mask=torch.tensor(d["tree_mask"], dtype=torch.float32)[None, None],
        tree_position_ids=torch.tensor(d["tree_position_ids"]),
    )
    fr.check_invariants(total_token=11, depth=2, top_k=3, sampling=True)
    assert len(d["scores"]) == 11 and d["scores"][0] == 0.0


def test_demo_default_backend_runs(capsys):
    code, out, err = run(capsys, "demo", "--total-token", "12", "--depth", "3", "--top-k", "3")
    assert code == 0, err
    ok, why = get_backend("torch_ref").availability()
    if ok:
        assert out.startswith("backend=torch_ref") and "random EAGLE-3" in out
    else:
        assert out.startswith("backend=stub") and f"torch_ref cannot run here: {why}" in err
    assert re.search(r"^12 nodes, \d+ leaves", out, re.M)


@pytest.mark.parametrize(
    "argv,pattern",
    [
        (["demo", "--backend", "nope"], r"frontier demo: error: unknown backend 'nope'; registered backends: stub"),
        (["demo", "--backend", "stub", "--total-token", "1000"], r"frontier demo: error: invalid FrontierConfig: "
                                                                 r"total_token - 1 cannot exceed .*total_token=1000"),
        (["demo", "--backend", "stub", "--top-k", "0"], r"frontier demo: error: argument --top-k: must be a positive "
                                                          r"integer, got '0'"),
    ],
)
def test_demo_errors_are_one_clear_line(capsys, argv, pattern):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert re.search(pattern, err) and err.count("\n") == 1  # no traceback


def test_render_tree_without_scores():
    parents = torch.tensor([0, 0, 1, 1, 3])  # 1,2 <- root; 3,4 <- 1; 5 <- 3
    packed = pack_tree(parents)
    fr = Frontier(draft_tokens=torch.tensor([[9, 8, 7, 6, 5, 4]]), retrieve_indices=packed.retrieve_indices,
                  tree_mask=packed.tree_mask, tree_position_ids=packed.tree_position_ids)
    assert render_tree(fr, token_text=lambda t: chr(ord("a") + t)) == "\n".join([
        "[0] 9  (root)",
        "├── [1] 8 'i'  (depth 1)",
        "│   ├── [3] 6 'g'  (depth 2)",
        "│   │   └── [5] 4 'e'  (depth 3)",
        "│   └── [4] 5 'f'  (depth 2)",
        "└── [2] 7 'h'  (depth 1)",
    ])
