"""frontier.tree against a deliberately naive, loop-based packing that follows docs/contract.md line by line.

The naive versions below use Python lists and per-node loops on purpose: they are the
readable statement of the contract; the library's versions are vectorised.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.overrides import TorchFunctionMode

from frontier.tree import (
    ancestor_mask,
    best_k,
    chosen_candidates,
    expansion_parents,
    frontier_from_candidates,
    pack_tree,
    parent_positions,
    select_nodes,
)
from frontier.tree import _lexsort_rows


# ----------------------------------------------------------------------------------------------
# Naive reference packing (docs/contract.md, "Outputs")
# ----------------------------------------------------------------------------------------------
def naive_pack(parents: list[int], sampling: bool) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """parents[i] = parent position of node i+1. Returns (mask rows, position ids, retrieve rows)."""
    t = len(parents) + 1
    mask = [[1 if c == r or c == 0 else 0 for c in range(t)] for r in range(t)]
    for i in range(1, t):  # a node's row = its parent's row plus itself (parents come first)
        p = parents[i - 1]
        for c in range(t):
            if mask[p][c]:
                mask[i][c] = 1
    position_ids = [sum(row) - 1 for row in mask]
    max_depth = max(position_ids)
    non_leaves = set(parents)
    retrieve = []
    for node in range(t):  # one row per leaf, ascending node order
        if node in non_leaves:
            continue
        path = [node]
        while path[-1] != 0:
            path.append(parents[path[-1] - 1])
        path.reverse()
        retrieve.append(path + [-1] * (max_depth + 1 - len(path)))
    if sampling:
        retrieve.sort(key=lambda row: [x if x >= 0 else t + 5 for x in row])
    return mask, position_ids, retrieve


def random_parents(rng: random.Random, t: int, style: str) -> list[int]:
    """A parent array where every node's parent comes before it."""
    out = []
    for node in range(1, t):
        if style == "uniform":
            out.append(rng.randrange(node))
        elif style == "deep":  # parents close behind: long paths
            out.append(rng.randrange(max(0, node - 3), node))
        elif style == "chain":
            out.append(node - 1)
        elif style == "star":
            out.append(0)
        elif style == "bushy":  # few parents, many children each
            out.append(rng.randrange(min(node, 1 + node // 4)))
        else:
            raise AssertionError(style)
    return out


CASES = [(t, style, seed) for t in (2, 3, 5, 17, 33, 61) for style in ("uniform", "deep", "bushy") for seed in range(2)]
CASES += [(t, style, 0) for t in (2, 9, 24) for style in ("chain", "star")]


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("t,style,seed", CASES)
def test_pack_tree_matches_naive(t, style, seed, sampling):
    rng = random.Random(f"{t}-{style}-{seed}")  # str seeds are hashed deterministically (sha512)
    parents = random_parents(rng, t, style)
    mask, pos, retrieve = naive_pack(parents, sampling)
    deepest = max(pos)
    parent_pos = torch.tensor(parents, dtype=torch.long)

    for max_depth in (None, deepest, deepest + 1 + rng.randrange(3)):
        got = pack_tree(parent_pos, sampling=sampling, max_depth=max_depth)
        assert got.tree_mask.shape == (1, 1, t, t) and got.tree_mask.dtype == torch.float32
        assert got.tree_mask[0, 0].tolist() == [[float(x) for x in row] for row in mask]
        assert got.tree_position_ids.dtype == torch.int64 and got.tree_position_ids.tolist() == pos
        assert got.retrieve_indices.dtype == torch.int64
        assert got.retrieve_indices.tolist() == retrieve, (max_depth, parents)
        assert int(got.leaf_count) == len(retrieve)

        padded = pack_tree(parent_pos, sampling=sampling, padded=True, max_depth=max_depth)
        width = t if max_depth is None else max_depth + 1
        assert padded.retrieve_indices.shape == (t, width)
        assert int(padded.leaf_count) == len(retrieve)
        ri = padded.retrieve_indices.tolist()
        assert [row[: deepest + 1] for row in ri[: len(retrieve)]] == retrieve
        assert all(x == -1 for row in ri[: len(retrieve)] for x in row[deepest + 1 :])
        assert all(x == -1 for row in ri[len(retrieve) :] for x in row)
        assert torch.equal(padded.tree_mask, got.tree_mask)
        assert torch.equal(padded.tree_position_ids, got.tree_position_ids)


def test_padded_shape_is_t_by_depth_plus_two():
    """With max_depth = D + 1 the padded layout is [T, D+2], whatever the tree looks like."""
    depth = 4
    for parents in ([0], [0, 0, 0], [0, 1, 2, 3, 4], [0, 1, 1, 0, 3]):
        packed = pack_tree(torch.tensor(parents), padded=True, max_depth=depth + 1)
        assert packed.retrieve_indices.shape == (len(parents) + 1, depth + 2)


def test_sampling_order_is_lexicographic_and_greedy_keeps_leaf_order():
    # Tree: 1<-0, 2<-1, 3<-0, 4<-3, 5<-1, so the leaves are 2, 4, 5.
    parents = torch.tensor([0, 1, 0, 3, 1])
    assert pack_tree(parents).retrieve_indices.tolist() == [[0, 1, 2], [0, 3, 4], [0, 1, 5]]
    assert pack_tree(parents, sampling=True).retrieve_indices.tolist() == [[0, 1, 2], [0, 1, 5], [0, 3, 4]]
    # Tree: 1<-0, 2<-0, 3<-1: leaf 2's short path (padded with -1) comes after 0-1-3.
    parents = torch.tensor([0, 0, 1])
    assert pack_tree(parents).retrieve_indices.tolist() == [[0, 2, -1], [0, 1, 3]]
    assert pack_tree(parents, sampling=True).retrieve_indices.tolist() == [[0, 1, 3], [0, 2, -1]]
    # Padded + sampling: the all -1 padding rows stay after every real row.
    padded = pack_tree(parents, sampling=True, padded=True, max_depth=3).retrieve_indices.tolist()
    assert padded == [[0, 1, 3, -1], [0, 2, -1, -1], [-1] * 4, [-1] * 4]


def test_ancestor_mask_matches_naive():
    rng = random.Random(7)
    for t in (2, 6, 40):
        parents = random_parents(rng, t, "uniform")
        mask, _, _ = naive_pack(parents, False)
        got = ancestor_mask(torch.tensor(parents))
        assert got.dtype == torch.bool and got.int().tolist() == mask


def test_pack_tree_rejects_non_vector():
    with pytest.raises(ValueError, match="parent_pos must be 1-D"):
        pack_tree(torch.zeros(2, 3, dtype=torch.long))


# ----------------------------------------------------------------------------------------------
# Host reads: none in padded mode, exactly one in unpadded mode
# ----------------------------------------------------------------------------------------------
HOST_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero", "cpu", "unique"}


class RecordHostReads(TorchFunctionMode):
    """Records every tensor operation that copies data to the host (a device sync on CUDA)."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in HOST_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("sampling", [False, True])
def test_padded_mode_reads_nothing_back_and_unpadded_reads_once(sampling):
    parents = torch.tensor(random_parents(random.Random(3), 30, "uniform"))
    with RecordHostReads() as rec:
        pack_tree(parents, sampling=sampling, padded=True, max_depth=29)
    assert rec.reads == []
    with RecordHostReads() as rec:
        pack_tree(parents, sampling=sampling, padded=False, max_depth=29)
    assert rec.reads == ["tolist"]


def test_record_host_reads_sees_a_read():
    """The recorder itself works (so the test above is not vacuous)."""
    with RecordHostReads() as rec:
        int(torch.tensor(3))
        torch.tensor([1, 2]).tolist()
    assert rec.reads == ["__int__", "tolist"]


# ----------------------------------------------------------------------------------------------
# parent_positions / select_nodes / expansion_parents against naive versions
# ----------------------------------------------------------------------------------------------
def test_parent_positions_matches_naive():
    rng = random.Random(11)
    for _ in range(30):
        c = rng.randrange(2, 200)
        chosen = sorted(rng.sample(range(c), rng.randrange(1, min(c, 60) + 1)))
        stored = []
        for idx, cand in enumerate(chosen):
            # a chosen candidate's parent is the root (0) or an earlier chosen candidate (+1)
            earlier = chosen[:idx]
            stored.append(0 if not earlier or rng.random() < 0.3 else rng.choice(earlier) + 1)
        expect = [0 if s == 0 else 1 + chosen.index(s - 1) for s in stored]
        got = parent_positions(torch.tensor(chosen), torch.tensor(stored))
        assert got.dtype == torch.int64 and got.tolist() == expect


def test_expansion_parents_numbering():
    k = 3
    pick = torch.tensor([4, 0, 7])
    # depth 0: the frontier is candidates 0..K-1, stored parent = index + 1
    assert expansion_parents(torch.arange(k), 0, k).tolist() == [1, 2, 3]
    # depth 1: frontier rows are picks in the depth-0 expansion block, which starts at K
    assert expansion_parents(pick, 1, k).tolist() == [k + 4 + 1, k + 0 + 1, k + 7 + 1]
    # depth 2: that block starts at K + K^2
    assert expansion_parents(pick, 2, k).tolist() == [k + k * k + 4 + 1, k + k * k + 1, k + k * k + 7 + 1]


def naive_dynamic_tree(lp_tables: list[list[list[float]]], k: int, depth: int, total_token: int):
    """docs/contract.md 'One draft call' steps 1-3 in plain Python, driven by per-row log-prob tables.

    lp_tables[0][0] are the root's K sorted log-probs; lp_tables[i+1][r] those of frontier row r
    at depth i. Tokens are the candidate indices themselves (so the chosen nodes are visible).
    Returns (draft_tokens, parent positions, node scores).
    """
    cand_scores = list(lp_tables[0][0])  # candidate list, K entries with parent 0
    cand_parent = [0] * k
    frontier_idx = list(range(k))  # candidate indices of the frontier rows
    frontier_score = list(lp_tables[0][0])
    for i in range(depth):
        block_start = len(cand_scores)
        block = []
        for r in range(k):
            for j in range(k):
                block.append(frontier_score[r] + lp_tables[i + 1][r][j])
                cand_parent.append(frontier_idx[r] + 1)
        cand_scores += block
        best = sorted(range(k * k), key=lambda b: -block[b])[:k]
        frontier_idx = [block_start + b for b in best]
        frontier_score = [block[b] for b in best]
    chosen = sorted(sorted(range(len(cand_scores)), key=lambda c: -cand_scores[c])[: total_token - 1])
    parents = [0 if cand_parent[c] == 0 else 1 + chosen.index(cand_parent[c] - 1) for c in chosen]
    return [-1] + chosen, parents, [0.0] + [cand_scores[c] for c in chosen]


@pytest.mark.parametrize("k,depth", [(1, 1), (1, 4), (2, 1), (3, 3), (4, 5), (5, 2), (7, 3)])
def test_select_nodes_matches_naive_dynamic_tree(k, depth):
    g = torch.Generator().manual_seed(100 * k + depth)
    max_t = 1 + k + depth * k * k
    for total_token in sorted({2, min(3, max_t), (max_t + 1) // 2, max_t}):
        # Distinct negative log-probs, sorted descending per row (what top-K returns).
        tables = [(-torch.rand(1, k, generator=g, dtype=torch.float64) * 3 - 1e-3).sort(dim=1, descending=True).values]
        tables += [
            (-torch.rand(k, k, generator=g, dtype=torch.float64) * 3 - 1e-3).sort(dim=1, descending=True).values
            for _ in range(depth)
        ]
        want_tokens, want_parents, want_scores = naive_dynamic_tree(
            [t.tolist() for t in tables], k, depth, total_token
        )

        # The vectorised bookkeeping, as a backend does it.
        scores = tables[0][0]
        cand_scores, row_parents = [scores], [torch.zeros(1, dtype=torch.long)]
        pick = torch.arange(k)
        for i in range(depth):
            row_parents.append(expansion_parents(pick, i, k))
            cs = scores[:, None] + tables[i + 1]  # [K, K]
            cand_scores.append(cs.reshape(-1))
            top = torch.topk(cs.reshape(-1), k)
            pick, scores = top.indices, top.values
        cand = torch.cat(cand_scores)
        cand_tokens = torch.arange(cand.numel())  # token = candidate index
        draft_tokens, parent_pos, node_scores = select_nodes(
            cand, cand_tokens, torch.cat(row_parents), torch.tensor([-1]), total_token, k
        )
        assert draft_tokens.shape == (1, total_token) and draft_tokens.dtype == torch.int64
        assert draft_tokens[0].tolist() == want_tokens
        assert parent_pos.tolist() == want_parents
        assert torch.allclose(node_scores, torch.tensor(want_scores, dtype=torch.float64))
        # ... and the packed tree of that selection agrees with the naive packing.
        _, pos, retrieve = naive_pack(want_parents, sampling=False)
        packed = pack_tree(parent_pos, max_depth=depth + 1)
        assert packed.tree_position_ids.tolist() == pos
        assert max(pos) <= depth + 1
        assert packed.retrieve_indices.tolist() == retrieve


# ----------------------------------------------------------------------------------------------
# The tie rule: exactly equal scores go to the lower index (docs/contract.md, "One draft call": ties)
# ----------------------------------------------------------------------------------------------
def naive_best_k(row: list[float], k: int) -> tuple[list[float], list[int]]:
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    return [row[i] for i in order], order


@pytest.mark.parametrize("n", [17, 40, 300])
def test_best_k_breaks_exact_ties_toward_the_lower_index(n):
    # Few distinct values, so most entries tie; beyond 16 entries torch's unstable sort
    # really does reorder equal values on the CPU.
    g = torch.Generator().manual_seed(n)
    scores = torch.randint(0, 3, (4, n), generator=g).float() * -0.5
    for k in (1, 5, n):
        values, indices = best_k(scores, k)
        assert values.shape == (4, k) and indices.shape == (4, k) and indices.dtype == torch.int64
        for r in range(4):
            want_values, want_indices = naive_best_k(scores[r].tolist(), k)
            assert indices[r].tolist() == want_indices
            assert values[r].tolist() == want_values


def test_best_k_of_a_vector_and_all_equal_scores():
    values, indices = best_k(torch.zeros(20), 6)
    assert indices.tolist() == [0, 1, 2, 3, 4, 5] and values.tolist() == [0.0] * 6
    values, indices = best_k(torch.tensor([-1.0, -3.0, -0.5, -2.0]), 2)
    assert indices.tolist() == [2, 0] and values.tolist() == [-0.5, -1.0]


def test_chosen_candidates_ties_go_to_the_lower_index():
    scores = torch.tensor([-1.0] * 10 + [-0.5] + [-1.0] * 10)  # 21 candidates
    assert chosen_candidates(scores, 6).tolist() == [0, 1, 2, 3, 10]
    assert chosen_candidates(scores, 2).tolist() == [10]
    assert chosen_candidates(torch.arange(30.0), 4).tolist() == [27, 28, 29]


def test_select_nodes_keeps_a_parent_whose_child_ties_with_it():
    """A child whose log-prob rounds to 0 ties its parent's score; the parent has the lower
    index and must be chosen with it, so the child's parent position is found."""
    k, depth = 3, 2  # 3 + 2 * 9 = 21 candidates
    cand = torch.full((k + depth * k * k,), -9.0)
    cand[:k] = torch.tensor([-1.0, -2.0, -3.0])
    pick = torch.tensor([0, 1, 2])
    row_parents = torch.cat([torch.zeros(1, dtype=torch.long), expansion_parents(torch.arange(k), 0, k),
                             expansion_parents(pick, 1, k)])
    cand[k : k + 3] = -1.0  # candidate 0's three children tie with it (indices 3, 4, 5)
    cand[k + k * k] = -1.0  # the first depth-1 expansion (child of candidate 3) ties too
    draft_tokens, parent_pos, node_scores = select_nodes(cand, torch.arange(cand.numel()) + 100, row_parents,
                                                         torch.tensor([7]), 6, k)
    assert draft_tokens.tolist() == [[7, 100, 103, 104, 105, 112]]
    assert parent_pos.tolist() == [0, 1, 1, 1, 2]
    assert node_scores.tolist() == [0.0, -1.0, -1.0, -1.0, -1.0, -1.0]


# ----------------------------------------------------------------------------------------------
# frontier_from_candidates: selection + packing as a Frontier
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_frontier_from_candidates(sampling, padded):
    k, depth, total_token = 2, 2, 6
    # Candidates 0,1 (root's children); 2..5 children of 0 and 1; 6..9 children of the picks 2, 4.
    cand = torch.tensor([-0.1, -0.2, -0.3, -5.0, -0.4, -6.0, -0.35, -7.0, -0.45, -8.0], dtype=torch.float64)
    row_parents = torch.cat([torch.zeros(1, dtype=torch.long), expansion_parents(torch.arange(k), 0, k),
                             expansion_parents(torch.tensor([0, 2]), 1, k)])
    cache = object()
    fr = frontier_from_candidates(cand, torch.arange(10) + 50, row_parents, torch.tensor([9]), total_token=total_token,
                                  top_k=k, depth=depth, sampling=sampling, padded=padded, cache=cache)
    # chosen, ascending: 0 (-0.1), 1 (-0.2), 2 (-0.3), 4 (-0.4), 6 (-0.35);
    # tree 1<-0, 2<-0, 3<-1, 4<-2, 5<-3, leaves 4 and 5
    assert fr.draft_tokens.tolist() == [[9, 50, 51, 52, 54, 56]]
    assert fr.parents.tolist() == [0, 0, 0, 1, 2, 3]
    assert fr.scores.dtype == torch.float32
    assert fr.scores.tolist() == torch.tensor([0.0, -0.1, -0.2, -0.3, -0.4, -0.35]).tolist()
    assert fr.cache is cache and fr.padded is padded
    assert int(fr.leaf_count) == 2
    assert fr.tree_position_ids.tolist() == [0, 1, 1, 2, 2, 3]
    leaf_rows = [[0, 1, 3, 5], [0, 2, 4, -1]] if sampling else [[0, 2, 4, -1], [0, 1, 3, 5]]
    if padded:
        assert fr.retrieve_indices.shape == (total_token, depth + 2)
        assert fr.retrieve_indices[:2].tolist() == leaf_rows and (fr.retrieve_indices[2:] == -1).all()
    else:
        assert fr.retrieve_indices.tolist() == leaf_rows
    fr.check_invariants(total_token=total_token, depth=depth, top_k=k, sampling=sampling)


def test_frontier_from_candidates_default_cache_is_none():
    row_parents = torch.cat([torch.zeros(1, dtype=torch.long), expansion_parents(torch.arange(2), 0, 2)])
    fr = frontier_from_candidates(torch.tensor([-1.0, -2.0, -1.5, -9.0, -9.0, -9.0]), torch.arange(6),
                                  row_parents, torch.tensor([3]), total_token=3, top_k=2, depth=1,
                                  sampling=False, padded=False)
    assert fr.cache is None and fr.draft_tokens.tolist() == [[3, 0, 2]] and fr.parents.tolist() == [0, 0, 1]


# ----------------------------------------------------------------------------------------------
# Device placement: every tensor is made on the input's device (checked on the "meta" device,
# which computes shapes only, so the padded mode, which reads nothing back, runs on it)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [False, True])
@pytest.mark.parametrize("max_depth", [3, 9])  # 9: wider than the tree (T = 6), padded with extra columns
def test_padded_pack_tree_stays_on_the_input_device(sampling, max_depth):
    parents = torch.tensor([0, 1, 0, 3, 1], device="meta")
    packed = pack_tree(parents, sampling=sampling, padded=True, max_depth=max_depth)
    for x in (packed.tree_mask, packed.tree_position_ids, packed.retrieve_indices, packed.leaf_count):
        assert x.device.type == "meta"
    assert packed.retrieve_indices.shape == (6, max_depth + 1) and packed.tree_mask.shape == (1, 1, 6, 6)
    assert ancestor_mask(parents).device.type == "meta"


def test_lexsort_rows_orders_any_integer_matrix():
    rng = random.Random(5)
    for rows, cols in ((1, 3), (6, 1), (12, 4), (40, 3)):
        m = [[rng.randrange(3) for _ in range(cols)] for _ in range(rows)]
        assert _lexsort_rows(torch.tensor(m)).tolist() == sorted(m)


class RecordDevices(TorchFunctionMode):
    """Records the device of every tensor a torch operation returns."""

    def __init__(self):
        super().__init__()
        self.devices: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, tuple) else (out,):
            if isinstance(x, torch.Tensor):
                self.devices.add(x.device.type)
        return out


@pytest.mark.parametrize("sampling", [False, True])
def test_padded_pack_tree_makes_no_tensor_off_the_input_device(sampling):
    """Not even an index tensor on the host (a host-to-device copy would break graph capture)."""
    parents = torch.tensor([0, 1, 0, 3, 1, 1, 6], device="meta")
    with RecordDevices() as rec:
        pack_tree(parents, sampling=sampling, padded=True, max_depth=9)
        ancestor_mask(parents, 3)
    assert rec.devices == {"meta"}
