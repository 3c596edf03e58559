"""Frontier.check_invariants catches each broken rule and names it (so the invariant tests bite)."""

from __future__ import annotations

import dataclasses

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


BROKEN = [
    ("draft_tokens 1-D", dict(draft_tokens=torch.arange(T)), {}, r"draft_tokens must be \[1, T\], got \(8,\)"),
    ("draft_tokens int32", dict(draft_tokens=torch.arange(T, dtype=torch.int32)[None]), {}, "draft_tokens must be int64"),
    ("negative token", dict(draft_tokens=torch.tensor([[5, 1, 2, -3, 4, 5, 6, 7]])), {}, "negative token id"),
    ("wrong total_token", {}, dict(total_token=9), r"draft_tokens has 8 nodes, expected total_token=9"),
    ("mask shape", dict(tree_mask=torch.ones(1, T, T)), {}, r"tree_mask must be \[1, 1, 8, 8\]"),
    ("mask dtype", dict(tree_mask=good().tree_mask.long()), {}, "tree_mask must be a float tensor of 0/1"),
    ("mask value 2", dict(tree_mask=mask_with(lambda m: m.__setitem__((4, 1), 2.0))), {}, "values other than 0 and 1"),
    ("mask upper", dict(tree_mask=mask_with(lambda m: m.__setitem__((1, 2), 1.0))), {}, "not lower-triangular"),
    ("mask diagonal", dict(tree_mask=mask_with(lambda m: m.__setitem__((5, 5), 0.0))), {}, "diagonal is not all ones"),
    ("mask column 0", dict(tree_mask=mask_with(lambda m: m.__setitem__((3, 0), 0.0))), {}, r"column 0 \(the root\)"),
    # node 7's row also marks node 3, which is not its ancestor
    ("mask row", dict(tree_mask=mask_with(lambda m: m.__setitem__((7, 3), 1.0))), {},
     r"tree_mask row 7 is not its parent's row \(row 3\) plus itself"),
    ("position ids", dict(tree_position_ids=torch.tensor([0, 1, 1, 1, 2, 2, 2, 2])), {},
     r"tree_position_ids\[6\]=2 but tree_mask row 6 sums to 4"),
    ("position ids dtype", dict(tree_position_ids=torch.tensor([0, 1, 1, 1, 2, 2, 3, 2], dtype=torch.int32)), {},
     r"tree_position_ids must be \[8\] int64"),
    ("too deep", {}, dict(depth=1), r"tree depth 3 exceeds depth \+ 1 = 2"),
    ("too many children", {}, dict(top_k=2), r"node 0 has 3 children, more than top_k=2"),
    ("device", dict(tree_position_ids=torch.zeros(T, dtype=torch.int64, device="meta")), {},
     "tree_position_ids is on meta but draft_tokens on cpu"),
    ("retrieve dtype", dict(retrieve_indices=good().retrieve_indices.int()), {}, "retrieve_indices must be 2-D int64"),
    ("missing leaf row", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 4, 6]])), {},
     "retrieve_indices has 3 rows but the tree has 4 leaves"),
    ("too narrow", dict(retrieve_indices=ri_with([[0, 3, -1], [0, 1, 5], [0, 1, 4], [0, 2, 7]])), {},
     r"retrieve_indices has 3 columns, expected 1 \+ max depth = 4"),
    ("not from root", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [1, 5, -1, -1], [0, 1, 4, 6], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 1 does not start at the root"),
    ("hole in padding", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, -1, 5], [0, 1, 4, 6], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 1 is not right-padded with -1"),
    ("past the tree", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 4, 6], [0, 2, 8, -1]])), {},
     r"retrieve_indices row 3 points past the tree"),
    ("wrong path", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 2, 5, -1], [0, 1, 4, 6], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 1 does not follow parent links at column 2"),
    ("ends inside", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 4, -1], [0, 2, 7, -1]])), {},
     r"retrieve_indices row 2 ends at node 4, which is not a leaf"),
    ("duplicate leaf", dict(retrieve_indices=ri_with([[0, 3, -1, -1], [0, 1, 5, -1], [0, 1, 5, -1], [0, 2, 7, -1]])), {},
     "does not list every leaf exactly once"),
    ("greedy order", dict(retrieve_indices=good(sampling=True).retrieve_indices), dict(sampling=False),
     "not in ascending leaf order"),
    ("sampling order", {}, dict(sampling=True), "not sorted lexicographically with -1 last"),
]


@pytest.mark.parametrize("what,changes,kwargs,pattern", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_invariant_is_named(what, changes, kwargs, pattern):
    fr = edit(good(), **changes)
    with pytest.raises(InvariantError, match=pattern):
        fr.check_invariants(**kwargs)


def test_padded_layout_checks():
    fr = good(padded=True)
    assert fr.retrieve_indices.shape == (T, 5) and int(fr.leaf_count) == 4
    ri = fr.retrieve_indices.clone()
    ri[5, 0] = 0
    with pytest.raises(InvariantError, match="non -1 entry after the leaf rows"):
        edit(fr, retrieve_indices=ri).check_invariants()
    ri = fr.retrieve_indices.clone()
    ri[0, 4] = 3
    with pytest.raises(InvariantError, match="non -1 entry past the deepest level"):
        edit(fr, retrieve_indices=ri).check_invariants()
    with pytest.raises(InvariantError, match="retrieve_indices has 3 rows but the tree has 4 leaves"):
        edit(fr, leaf_count=torch.tensor(3)).check_invariants()


def test_real_retrieve_indices_and_same_tree():
    padded, plain = good(padded=True), good()
    assert torch.equal(padded.real_retrieve_indices(), plain.retrieve_indices)
    assert padded.same_tree(plain) and plain.same_tree(padded)
    assert not plain.same_tree(good(sampling=True))
    d = plain.to_dict()
    assert d["retrieve_indices"] == plain.retrieve_indices.tolist() and d["tree_mask"][7] == [1, 0, 1, 0, 0, 0, 0, 1]
