"""The `frontier` command line, run in-process: `backends` and `demo`, and the flags every
subcommand shares (one spelling, one meaning)."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

from frontier import Frontier, get_backend
from frontier.cli import build_parser, main
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
    code, out, err = run(capsys, "demo", "--backend", "stub", "--total-tokens", "24", "--depth", "4", "--tree-top-k",
                          "4")
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
    code, out, _ = run(capsys, "demo", "--backend", "stub", "--json", "--total-tokens", "11", "--depth", "2",
                       "--tree-top-k", "3", "--sampling", "--seed", "3")
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
    code, out, err = run(capsys, "demo", "--total-tokens", "12", "--depth", "3", "--tree-top-k", "3")
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
        (["demo", "--backend", "stub", "--total-tokens", "1000"], r"frontier demo: error: invalid FrontierConfig: "
                                                                  r"total_token - 1 cannot exceed .*total_token=1000"),
        (["demo", "--backend", "stub", "--tree-top-k", "0"], r"frontier demo: error: argument --tree-top-k: must be "
                                                               r"a positive integer, got '0'"),
        # --top-k is sampling top-k everywhere; the demo's tree K used to be spelled so, and is refused
        (["demo", "--backend", "stub", "--top-k", "3"], r"frontier demo: error: argument --top-k: the tree's "
                                                          r"branching K is --tree-top-k"),
        (["demo", "--tree", "3"], r"unrecognized arguments: --tree 3"),  # no prefixes of flags
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


# ----------------------------------------------------------------------------------------------
# One vocabulary: a flag is spelled, typed and meant the same in every subcommand that takes it
# ----------------------------------------------------------------------------------------------
def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _flags(p: argparse.ArgumentParser, *, hidden: bool = False) -> dict[str, argparse.Action]:
    return {opt: a for a in p._actions for opt in a.option_strings
            if opt.startswith("--") and opt != "--help" and (hidden or a.help is not argparse.SUPPRESS)}


#: flag -> (dest, the subcommands that take it)
VOCABULARY = {
    "--backend": ("backend", {"demo", "generate", "bench"}),
    "--total-tokens": ("total_tokens", {"demo", "generate"}),
    "--depth": ("depth", {"demo", "generate", "bench", "inspect"}),
    "--tree-top-k": ("tree_top_k", {"demo", "generate"}),
    "--temperature": ("temperature", {"generate"}),
    "--top-k": ("top_k", {"generate"}),
    "--top-p": ("top_p", {"generate"}),
    "--dtype": ("dtype", {"generate", "bench", "inspect"}),
    "--device": ("device", {"generate"}),
    "--seed": ("seed", {"demo", "generate"}),
    "--context": ("context", {"demo", "bench"}),
    "--head": ("head", {"demo", "generate", "bench"}),
    "--target": ("target", {"demo", "generate", "bench", "inspect"}),
    "--batch": ("batch", {"generate", "bench"}),
    "--json": ("json", {"backends", "demo", "generate", "bench", "inspect"}),
}
#: spellings no subcommand shows (hidden aliases of the same meaning may remain)
RETIRED = {"--total-token", "--backends", "--tree-depth", "--tree-k", "--top_k", "--total_token", "--json-path"}


def test_every_subcommand_is_checked():
    assert set(_subcommands()) == {"backends", "demo", "generate", "bench", "inspect"}


@pytest.mark.parametrize("flag", sorted(VOCABULARY))
def test_shared_flag_has_one_spelling_and_dest(flag):
    dest, expected = VOCABULARY[flag]
    subs = _subcommands()
    having = {name for name, p in subs.items() if flag in _flags(p)}
    assert having == expected, f"{flag} is taken by {sorted(having)}"
    for name in having:
        assert _flags(subs[name])[flag].dest == dest, (name, flag)


def test_a_flag_means_one_thing_across_subcommands():
    """The same option string has the same dest, and the same nargs, in every subcommand."""
    seen: dict[str, tuple] = {}
    for name, p in _subcommands().items():
        for flag, action in _flags(p).items():
            key = (action.dest, action.nargs, action.const)
            assert seen.setdefault(flag, (name, key))[1] == key, f"{flag}: {name} {key} vs {seen[flag]}"


def test_no_subcommand_shows_a_retired_spelling():
    for name, p in _subcommands().items():
        assert not RETIRED & set(_flags(p)), (name, RETIRED & set(_flags(p)))


def test_hidden_aliases_keep_the_meaning_of_a_shown_flag():
    """A hidden spelling either writes the dest of a shown flag of that subcommand (an alias) or is
    refused with a pointer to the right flag (it meant something else here once)."""
    from frontier.commands.argtypes import Refused

    for name, p in _subcommands().items():
        shown = {a.dest for a in _flags(p).values()}
        for flag, action in _flags(p, hidden=True).items():
            if action.help is argparse.SUPPRESS:
                assert isinstance(action, Refused) or action.dest in shown, (name, flag)


def test_tree_shape_flags_take_positive_ints_everywhere():
    from frontier.commands.argtypes import positive_int

    for name, p in _subcommands().items():
        flags = _flags(p)
        for flag in ("--total-tokens", "--tree-top-k", "--depth"):
            if flag in flags and name != "bench":  # bench's --depth is a list of depths to time
                assert flags[flag].type is positive_int, (name, flag)


@pytest.mark.parametrize("spelling,name", [("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("fp16", "float16"),
                                           ("float16", "float16"), ("fp32", "float32"), ("float32", "float32"),
                                           ("BF16", "bfloat16")])
def test_every_dtype_flag_takes_every_spelling(spelling, name):
    for sub, p in _subcommands().items():
        flag = _flags(p).get("--dtype")
        if flag is not None:
            assert flag.type(spelling) == name, sub


def test_every_dtype_flag_refuses_the_same_way(capsys):
    for argv in (["generate", "--random-tiny", "--dtype", "int8"], ["bench", "--dtype", "int8"],
                 ["inspect", ".", "--dtype", "int8"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and "argument --dtype: must be bf16, fp16 or fp32" in err, argv


def test_json_prints_on_stdout_everywhere():
    for name, p in _subcommands().items():
        action = _flags(p)["--json"]
        assert action.nargs == 0 and action.const is True, name  # a switch, never a path
