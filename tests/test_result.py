"""Frontier.check_invariants catches each broken rule and names it (so the invariant tests bite)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from frontier import Frontier, InvariantError
from frontier.tree import pack_tree

# Tree: 1,2,3 <- root; 4,5 <- 1; 6 <- 4; 7 <- 2.  Leaves: 3, 5, 6, 7.  Depths 0 1 1 1 2 2 3 2.
PARENTS = [0, 0, 0, 1, 1, 4, 2]
T = len(PARENTS) + 1


def good(sampling=False, padded=False) -> Frontier:
    packed = pack_tree(torch.tensor(PARENTS), sampling=sampling, padded=padded, max_depth=4 if padded else None)
    return Frontier(
        draft_tokens=torch.arange(100, 100 + T)[None],
        retrieve_indices=packed.retrieve_indices,
        tree_mask=packed.tree_mask,
        tree_position_ids=packed.tree_position_ids,
        leaf_count=packed.leaf_count,
        padded=padded,
    )


def test_a_valid_frontier_passes_every_check():
    assert good().retrieve_indices.tolist() == [[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 4, 6], [0, 2, 7, -1]]
    good().check_invariants(total_token=T, depth=2, top_k=3, sampling=False)
    good(sampling=True).check_invariants(total_token=T, depth=2, top_k=3, sampling=True)
    good(padded=True).check_invariants(total_token=T, depth=3, top_k=3)
    good(sampling=True, padded=True).check_invariants(sampling=True)


def edit(fr: Frontier, **changes) -> Frontier:
    return dataclasses.replace(fr, **changes)


def mask_with(fn) -> torch.Tensor:
    m = good().tree_mask.clone()
    fn(m[0, 0])
    return m


def ri_with(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def full_message(pattern: str) -> str:
    """The whole message: the prefix, the broken rule, nothing after it."""
    return rf"^Frontier invariant broken: {pattern}$"


BROKEN = [
    ("draft_tokens 1-D", dict(draft_tokens=torch.arange(T)), {}, r"draft_tokens must be \[1, T\], got \(8,\)"),
    ("draft_tokens int32", dict(draft_tokens=torch.arange(T, dtype=torch.int32)[None]), {}, "draft_tokens must be int64, got torch.int32"),
    ("negative token", dict(draft_tokens=torch.tensor([[5, 1, 2, -3, 4, 5, 6, 7]])), {}, "draft_tokens holds a negative token id"),
    ("wrong total_token", {}, dict(total_token=9), r"draft_tokens has 8 nodes, expected total_token=9"),
    ("mask shape", dict(tree_mask=torch.ones(1, T, T)), {}, r"tree_mask must be \[1, 1, 8, 8\], got \(1, 8, 8\)"),
    ("mask dtype", dict(tree_mask=good().tree_mask.long()), {}, "tree_mask must be a float tensor of 0/1, got torch.int64"),
    ("mask value 2", dict(tree_mask=mask_with(lambda m: m.__setitem__((4, 1), 2.0))), {}, "tree_mask holds values other than 0 and 1"),
    ("mask upper", dict(tree_mask=mask_with(lambda m: m.__setitem__((1, 2), 1.0))), {}, r"tree_mask is not lower-triangular \(a node attends to a later node\)"),
    ("mask diagonal", dict(tree_mask=mask_with(lambda m: m.__setitem__((5, 5), 0.0))), {}, "tree_mask diagonal is not all ones"),
    ("mask column 0", dict(tree_mask=mask_with(lambda m: m.__setitem__((3, 0), 0.0))), {}, r"tree_mask column 0 \(the root\) is not all ones"),
    # node 7's row also marks node 3, which is not its ancestor
    ("mask row", dict(tree_mask=mask_with(lambda m: m.__setitem__((7, 3), 1.0))), {},
     r"tree_mask row 7 is not its parent's row \(row 3\) plus itself"),
    ("position ids", dict(tree_position_ids=torch.tensor([0, 1, 1, 1, 2, 2, 2, 2])), {},
     r"tree_position_ids\[6\]=2 but tree_mask row 6 sums to 4"),
    ("position ids dtype", dict(tree_position_ids=torch.tensor([0, 1, 1, 1, 2, 2, 3, 2], dtype=torch.int32)), {},
     r"tree_position_ids must be \[8\] int64, got \(8,\) torch.int32"),
    ("too deep", {}, dict(depth=1), r"tree depth 3 exceeds depth \+ 1 = 2"),
    ("too many children", {}, dict(top_k=2), r"node 0 has 3 children, more than top_k=2"),
    ("device", dict(tree_position_ids=torch.zeros(T, dtype=torch.int64, device="meta")), {},
     "tree_position_ids is on meta but draft_tokens on cpu"),
    ("retrieve dtype", dict(retrieve_indices=good().retrieve_indices.int()), {}, r"retrieve_indices must be 2-D int64, got \(4, 4\) torch.int32"),
    ("missing leaf row", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 4, 6]])), {},
     "retrieve_indices has 3 rows but the tree has 4 leaves"),
    ("too narrow", dict(retrieve_indices=ri_with([[0, 3, -1], [0, 1, 5], [0, 1, 4], [0, 2, 7]])), {},
     r"retrieve_indices has 3 columns, expected 1 \+ max depth = 4"),
    ("not from root", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [1, 5, -1, -1], [0, 1, 4, 6], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 1 does not start at the root \(0\)"),
    ("hole in padding", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, -1, 5], [0, 1, 4, 6], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 1 is not right-padded with -1"),
    ("past the tree", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 4, 6], [0, 2, 8, -1]])), {},
     r"retrieve_indices row 3 points past the tree \(8 nodes\)"),
    ("wrong path", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 2, 5, -1], [0, 1, 4, 6], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 1 does not follow parent links at column 2"),
    ("ends inside", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 4, -1], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 2 ends at node 4, which is not a leaf"),
    ("duplicate leaf", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 5, -1], [0, 2, 7, -1]])), {},
     "retrieve_indices does not list every leaf exactly once"),
    ("greedy order", dict(retrieve_indices=good(sampling=True).retrieve_indices), dict(sampling=False),
     r"retrieve_indices rows are not in ascending leaf order \(greedy mode\)"),
    ("draft_tokens two rows", dict(draft_tokens=torch.arange(2 * T).reshape(2, T)), {},
     r"draft_tokens must be \[1, T\], got \(2, 8\)"),
    ("mask device", dict(tree_mask=torch.zeros(1, 1, T, T, device="meta")), {},
     "tree_mask is on meta but draft_tokens on cpu"),
    ("retrieve device", dict(retrieve_indices=torch.zeros(4, 4, dtype=torch.int64, device="meta")), {},
     "retrieve_indices is on meta but draft_tokens on cpu"),
    ("padded with -2", dict(retrieve_indices=ri_with([[0, 3, -2, -2], [0, 1, 5, -1], [0, 1, 4, 6], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 0 is not right-padded with -1"),
    ("first step off the root", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 4, 6, -1], [0, 2, 7, -1]])),
     {}, r"retrieve_indices row 2 does not follow parent links at column 1"),
    ("sampling order", {}, dict(sampling=True), r"retrieve_indices rows are not sorted lexicographically with -1 last \(sampling mode\)"),
]


@pytest.mark.parametrize("what,changes,kwargs,pattern", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_invariant_is_named(what, changes, kwargs, pattern):
    fr = edit(good(), **changes)
    with pytest.raises(InvariantError, match=full_message(pattern)):
        fr.check_invariants(**kwargs)


def test_padded_layout_checks():
    fr = good(padded=True)
    assert fr.retrieve_indices.shape == (T, 5) and int(fr.leaf_count) == 4
    ri = fr.retrieve_indices.clone()
    ri[5, 0] = 0
    with pytest.raises(InvariantError, match=full_message("padded retrieve_indices has a non -1 entry after the leaf rows")):
        edit(fr, retrieve_indices=ri).check_invariants()
    ri = fr.retrieve_indices.clone()
    ri[0, 4] = 3
    with pytest.raises(InvariantError, match=full_message("padded retrieve_indices has a non -1 entry past the deepest level")):
        edit(fr, retrieve_indices=ri).check_invariants()
    with pytest.raises(InvariantError, match=full_message("retrieve_indices has 3 rows but the tree has 4 leaves")):
        edit(fr, leaf_count=torch.tensor(3)).check_invariants()


def test_real_retrieve_indices_and_same_tree():
    padded, plain = good(padded=True), good()
    assert torch.equal(padded.real_retrieve_indices(), plain.retrieve_indices)
    assert padded.same_tree(plain) and plain.same_tree(padded)
    assert not plain.same_tree(good(sampling=True))
    d = plain.to_dict()
    assert d["retrieve_indices"] == plain.retrieve_indices.tolist() and d["tree_mask"][7] == [1, 0, 1, 0, 0, 0, 0, 1]


# ----------------------------------------------------------------------------------------------
# Trees of other shapes: more columns than leaf rows, more leaf rows than columns, 2 and 1 nodes
# ----------------------------------------------------------------------------------------------
DEEP = [0, 1, 2, 3, 1]  # 1 <- root; 2 <- 1 <- ...; 5 <- 1.  Leaves 4, 5: 2 rows x 5 columns.
WIDE = [0, 0, 0, 0, 1]  # 1..4 <- root; 5 <- 1.  Leaves 2, 3, 4, 5: 4 rows x 3 columns.


def frontier_of(parents, *, tokens=None, sampling=False, padded=False, max_depth=None, leaf_count=True) -> Frontier:
    t = len(parents) + 1
    packed = pack_tree(torch.tensor(parents, dtype=torch.int64), sampling=sampling, padded=padded, max_depth=max_depth)
    return Frontier(
        draft_tokens=torch.tensor([tokens if tokens is not None else list(range(200, 200 + t))]),
        retrieve_indices=packed.retrieve_indices,
        tree_mask=packed.tree_mask,
        tree_position_ids=packed.tree_position_ids,
        leaf_count=packed.leaf_count if leaf_count else None,
        padded=padded,
    )


@pytest.mark.parametrize("parents,shape", [(DEEP, (2, 5)), (WIDE, (4, 3))], ids=["deep", "wide"])
def test_non_square_trees_pass(parents, shape):
    t = len(parents) + 1
    depth = shape[1] - 2
    for sampling in (False, True):
        fr = frontier_of(parents, sampling=sampling)
        assert fr.retrieve_indices.shape == shape
        fr.check_invariants(total_token=t, depth=depth, top_k=4, sampling=sampling)
        padded = frontier_of(parents, sampling=sampling, padded=True, max_depth=depth + 1)
        assert padded.retrieve_indices.shape == (t, depth + 2)
        padded.check_invariants(total_token=t, depth=depth, top_k=4, sampling=sampling)
        assert torch.equal(padded.real_retrieve_indices(), fr.retrieve_indices)


def test_deep_tree_path_and_leaf_checks():
    fr = frontier_of(DEEP)
    assert fr.retrieve_indices.tolist() == [[0, 1, 2, 3, 4], [0, 1, 5, -1, -1]]
    with pytest.raises(InvariantError, match=full_message("retrieve_indices has 1 rows but the tree has 2 leaves")):
        edit(fr, retrieve_indices=ri_with([[0, 1, 2, 3, 4]])).check_invariants()
    with pytest.raises(InvariantError, match=full_message("retrieve_indices row 1 does not follow parent links at column 2")):
        edit(fr, retrieve_indices=ri_with([[0, 1, 2, 3, 4], [0, 1, 3, -1, -1]])).check_invariants()
    with pytest.raises(InvariantError, match=full_message(r"tree depth 4 exceeds depth \+ 1 = 3")):
        fr.check_invariants(depth=2)
    with pytest.raises(InvariantError, match=full_message("node 1 has 2 children, more than top_k=1")):
        fr.check_invariants(top_k=1)


def test_padded_checks_on_non_square_trees():
    deep = frontier_of(DEEP, padded=True, max_depth=5)  # [6, 6], leaf rows 0-1, levels 0-4
    ri = deep.retrieve_indices.clone()
    ri[3, 0] = 0
    with pytest.raises(InvariantError, match=full_message("padded retrieve_indices has a non -1 entry after the leaf rows")):
        edit(deep, retrieve_indices=ri).check_invariants()
    with pytest.raises(InvariantError, match=full_message("padded retrieve_indices must have T=6 rows, got 4")):
        edit(deep, retrieve_indices=deep.retrieve_indices[:4]).check_invariants()

    wide = frontier_of(WIDE, padded=True, max_depth=3)  # [6, 4], leaf rows 0-3, levels 0-2
    ri = wide.retrieve_indices.clone()
    ri[3, 3] = 1
    with pytest.raises(InvariantError, match=full_message("padded retrieve_indices has a non -1 entry past the deepest level")):
        edit(wide, retrieve_indices=ri).check_invariants()


def test_token_id_zero_is_a_valid_token():
    good_tokens = [0, 0, 5, 0, 1, 0, 0, 3]
    edit(good(), draft_tokens=torch.tensor([good_tokens])).check_invariants(total_token=T)
    frontier_of(WIDE, tokens=[0] * 6).check_invariants()


def test_two_node_tree():
    fr = frontier_of([0])
    assert fr.retrieve_indices.tolist() == [[0, 1]] and fr.tree_mask[0, 0].tolist() == [[1.0, 0.0], [1.0, 1.0]]
    fr.check_invariants(total_token=2, depth=0, top_k=1, sampling=False)
    fr.check_invariants(sampling=True)
    frontier_of([0], padded=True, max_depth=1).check_invariants(total_token=2, depth=0, top_k=1)
    with pytest.raises(InvariantError, match=full_message("node 0 has 1 children, more than top_k=0")):
        fr.check_invariants(top_k=0)
    with pytest.raises(InvariantError, match=full_message("retrieve_indices has 2 rows but the tree has 1 leaves")):
        edit(fr, retrieve_indices=ri_with([[0, 1], [0, 1]])).check_invariants()


def test_root_only_tree():
    fr = frontier_of([])
    assert fr.retrieve_indices.tolist() == [[0]] and fr.tree_position_ids.tolist() == [0]
    fr.check_invariants(total_token=1, depth=0, top_k=1, sampling=False)
    fr.check_invariants(sampling=True)
    padded = frontier_of([], padded=True, max_depth=2, leaf_count=False)
    assert padded.retrieve_indices.tolist() == [[0, -1, -1]]
    assert padded.real_retrieve_indices().tolist() == [[0]]
    padded.check_invariants(total_token=1, top_k=1)


def test_padded_leaf_rows_counted_from_the_indices_without_leaf_count():
    for parents in (PARENTS, DEEP, WIDE):
        plain = frontier_of(parents)
        padded = frontier_of(parents, padded=True, max_depth=len(parents) + 1, leaf_count=False)
        assert padded.leaf_count is None
        assert torch.equal(padded.real_retrieve_indices(), plain.retrieve_indices)
        padded.check_invariants()
    plain = good()
    assert plain.real_retrieve_indices() is plain.retrieve_indices  # unpadded: returned as is


def test_total_token_and_device():
    assert good().total_token == T and isinstance(good().total_token, int)
    assert frontier_of(DEEP).total_token == 6
    assert good().device == torch.device("cpu")
    assert edit(good(), draft_tokens=torch.zeros(1, T, dtype=torch.int64, device="meta")).device == torch.device("meta")


def test_to_dict_is_plain_json():
    fr = frontier_of([0, 1])
    assert json.dumps(fr.to_dict()) == json.dumps({
        "draft_tokens": [[200, 201, 202]],
        "retrieve_indices": [[0, 1, 2]],
        "tree_position_ids": [0, 1, 2],
        "tree_mask": [[1, 0, 0], [1, 1, 0], [1, 1, 1]],
    })
    scored = edit(frontier_of(DEEP, padded=True, max_depth=5), scores=torch.tensor([0.0, -0.5, -1.0, -1.5, -2.0, -0.75],
                                                                                    dtype=torch.float64))
    d = scored.to_dict()
    assert list(d) == ["draft_tokens", "retrieve_indices", "tree_position_ids", "tree_mask", "scores"]
    assert d["retrieve_indices"] == [[0, 1, 2, 3, 4], [0, 1, 5, -1, -1]]  # the real rows, not the padding
    assert d["scores"] == [0.0, -0.5, -1.0, -1.5, -2.0, -0.75]
    assert json.dumps(d["scores"]) == "[0.0, -0.5, -1.0, -1.5, -2.0, -0.75]"
