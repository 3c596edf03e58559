"""Tree packing shared by every backend (docs/contract.md, "Outputs").

Input is the parent of every chosen node as a *position in draft_tokens* (0 is the root);
output is ``tree_mask``, ``tree_position_ids`` and ``retrieve_indices``. Everything runs
vectorised on the tensors' own device: no per-node Python loop, no ``.tolist()``. The only
host read is the single one that sizes ``retrieve_indices`` in unpadded mode; the padded
mode (fixed ``[T, D+2]``, -1 padded, plus a leaf count tensor) needs none, so it can be
captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .result import Frontier


@dataclass(frozen=True)
class PackedTree:
    tree_mask: torch.Tensor  # [1, 1, T, T] float 0/1
    tree_position_ids: torch.Tensor  # [T] int64
    retrieve_indices: torch.Tensor  # [leaves, 1 + max depth] int64, or [T, D+2] when padded
    leaf_count: torch.Tensor  # [] int64 (device tensor; rows of retrieve_indices that are real)


def parent_positions(chosen_sorted: torch.Tensor, stored_parents: torch.Tensor) -> torch.Tensor:
    """Map stored parents to positions in draft_tokens (docs/contract.md, "One draft call").

    chosen_sorted: [T-1] int64, the chosen candidate-list indices in ascending order.
    stored_parents: [T-1] int64, each chosen candidate's stored parent (candidate index + 1,
    0 for the root). Returns [T-1] int64 positions, 0 for the root, else 1 + the parent's
    rank among the chosen indices.
    """
    pos = torch.searchsorted(chosen_sorted, stored_parents - 1, right=False)  # [T-1]
    return torch.where(stored_parents == 0, torch.zeros_like(pos), pos + 1)  # [T-1]


def ancestor_mask(parent_pos: torch.Tensor, max_depth: Optional[int] = None) -> torch.Tensor:
    """Boolean [T, T] matrix: row i is set at i and at every ancestor of i (column 0 included).

    parent_pos: [T-1] positions of the parents of nodes 1..T-1. ``max_depth`` bounds the
    tree depth (D+1 for a draft of depth D); it only sets how many pointer steps are taken.
    """
    t = parent_pos.shape[0] + 1
    device = parent_pos.device
    parent = torch.cat([torch.zeros(1, dtype=torch.long, device=device), parent_pos.long()])  # [T]
    steps = (t - 1) if max_depth is None else min(max_depth, t - 1)
    rows = torch.arange(t, device=device)  # [T]
    mask = torch.zeros(t, t, dtype=torch.bool, device=device)  # [T, T]
    cur = rows.clone()  # [T] current ancestor of each row
    # scatter_ with a Python scalar: no host->device copy of the value (graph-capturable, no sync)
    mask.scatter_(1, cur[:, None], True)
    for _ in range(steps):  # one step per tree level, not per node
        cur = parent[cur]  # [T]
        mask.scatter_(1, cur[:, None], True)
    return mask


def pack_tree(
    parent_pos: torch.Tensor,
    *,
    sampling: bool = False,
    padded: bool = False,
    max_depth: Optional[int] = None,
    mask_dtype: torch.dtype = torch.float32,
) -> PackedTree:
    """Build tree_mask, tree_position_ids and retrieve_indices from parent positions.

    parent_pos: [T-1] int64, parent position in draft_tokens of nodes 1..T-1 (each < its node).
    sampling: sort retrieve rows lexicographically, -1 after every real index (docs/contract.md).
    padded: return retrieve_indices as [T, W] with W = max_depth + 1 (or T when max_depth is
      None), real rows first, -1 rows after, and no host read at all.
    max_depth: upper bound on node depth (D + 1 for depth D).
    """
    if parent_pos.dim() != 1:
        raise ValueError(f"parent_pos must be 1-D [T-1], got shape {tuple(parent_pos.shape)}")
    t = parent_pos.shape[0] + 1
    device = parent_pos.device
    mask = ancestor_mask(parent_pos, max_depth)  # [T, T] bool
    position_ids = mask.sum(dim=1) - 1  # [T] int64, depth of each node

    # Leaves: nodes that are nobody's parent, in ascending node order.
    is_parent = torch.zeros(t, dtype=torch.bool, device=device)  # [T]
    is_parent.scatter_(0, parent_pos.long(), True)
    is_leaf = ~is_parent  # [T]
    leaf_count = is_leaf.sum()  # [] int64

    width = t if max_depth is None else max_depth + 1  # padded: [T, D+2] for max_depth = D + 1
    # A node's path root->node is its ancestor columns in ascending order (ancestors come first).
    cols = torch.arange(t, device=device).expand(t, t)  # [T, T]
    big = torch.full_like(cols, t)  # [T, T] sentinel, ranks after every real index
    keyed = torch.where(mask, cols, big)  # [T, T]
    paths = torch.sort(keyed, dim=1).values  # [T, T], padded with the sentinel T
    if width <= t:
        paths = paths[:, :width]  # [T, W]
    else:  # max_depth + 1 > T (a tiny tree with a deep bound): widen with the sentinel
        paths = torch.cat([paths, torch.full((t, width - t), t, dtype=paths.dtype, device=device)], dim=1)

    order = torch.argsort((~is_leaf).to(torch.int8), stable=True)  # [T] leaves first, ascending
    rows = paths[order]  # [T, W]
    rows = rows.masked_fill((~is_leaf[order])[:, None], t)  # [T, W] non-leaf rows -> all sentinel
    if sampling:
        rows = _lexsort_rows(rows)  # sentinel ranks after real indices; sentinel rows stay last
    retrieve = torch.where(rows == t, torch.full_like(rows, -1), rows)  # [T, W]

    if not padded:
        # The single host read: number of leaves and the deepest node.
        n_leaves, deepest = torch.stack([leaf_count, position_ids.max()]).tolist()
        retrieve = retrieve[:n_leaves, : deepest + 1].contiguous()

    return PackedTree(
        tree_mask=mask.to(mask_dtype)[None, None],
        tree_position_ids=position_ids,
        retrieve_indices=retrieve,
        leaf_count=leaf_count,
    )


def _lexsort_rows(rows: torch.Tensor) -> torch.Tensor:
    """Sort the rows of an integer matrix lexicographically (first column most significant)."""
    idx = torch.arange(rows.shape[0], device=rows.device)
    for c in range(rows.shape[1] - 1, -1, -1):  # least significant column first; stable sorts
        idx = idx[torch.argsort(rows[idx, c], stable=True)]
    return rows[idx]


__all__ = ["PackedTree", "parent_positions", "ancestor_mask", "pack_tree"]


# ----------------------------------------------------------------------------------------------
# Candidate bookkeeping of the EAGLE dynamic tree (docs/contract.md, "One draft call", steps 2-3).
# ----------------------------------------------------------------------------------------------
def expansion_parents(pick: torch.Tensor, depth_index: int, top_k: int) -> torch.Tensor:
    """Stored parents of the K*K candidates produced at depth ``depth_index``.

    pick: [K] int64, the frontier rows' picks among the previous depth's K*K block (at depth 0
    the frontier is the first K candidates, so pass ``arange(K)``). Each of a row's K children
    stores ``candidate index of the row + 1``. Returns [K] (one value per frontier row; the
    K children of row r share entry r).
    """
    offset = 1 if depth_index == 0 else 1 + top_k + (depth_index - 1) * top_k * top_k
    return pick + offset  # [K]


def best_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``scores`` [..., N], best first, exactly equal
    scores ranking the lower index first (the contract's tie rule, for a row's top-K children
    and the per-depth K*K -> K prune). Returns (values [..., k], indices [..., k] int64)."""
    top = torch.sort(scores, dim=-1, descending=True, stable=True)  # a stable sort keeps index order among ties
    return top.values[..., :k], top.indices[..., :k]


def chosen_candidates(cand_scores: torch.Tensor, total_token: int) -> torch.Tensor:
    """The final selection's rule (docs/contract.md, "One draft call" step 3): the T-1 best
    scores, equal scores ranking the lower candidate index first, as ascending candidate
    indices [T-1]."""
    order = best_k(cand_scores, total_token - 1)[1]  # [T-1]
    return torch.sort(order).values  # [T-1]


def select_nodes(
    cand_scores: torch.Tensor,
    cand_tokens: torch.Tensor,
    row_parents: torch.Tensor,
    root_token: torch.Tensor,
    total_token: int,
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Final selection: best T-1 candidates, sorted by candidate index (docs/contract.md, "One
    draft call" step 3), ties broken toward the lower candidate index.

    cand_scores: [C] cumulative scores, C = K + D*K^2, in candidate-list order.
    cand_tokens: [C] int64 target token ids, same order.
    row_parents: [C // K] int64 stored parent of each group of K siblings: entry 0 is the
      root's group (0), then :func:`expansion_parents` of every depth, concatenated.
    root_token: [1] int64.
    Returns (draft_tokens [1, T], parent_pos [T-1], node_scores [T] with the root at 0).
    """
    # Best T-1 scores; equal scores rank the lower candidate index first. With distinct scores
    # this is exactly torch.topk's choice. With ties (common in bf16, where a child's score can
    # round to its parent's) it guarantees that a chosen node's parent, which always has a
    # lower index and a score >= the child's, is chosen too; torch.topk may drop the parent,
    # which leaves the parent search below pointing at the wrong node.
    chosen = chosen_candidates(cand_scores, total_token)  # [T-1] ascending candidate indices
    draft_tokens = torch.cat([root_token.reshape(1), cand_tokens[chosen]])[None]  # [1, T]
    stored = row_parents[chosen // top_k]  # [T-1]
    parent_pos = parent_positions(chosen, stored)  # [T-1]
    node_scores = torch.cat([cand_scores.new_zeros(1), cand_scores[chosen]])  # [T]
    return draft_tokens, parent_pos, node_scores


def frontier_from_candidates(
    cand_scores: torch.Tensor,
    cand_tokens: torch.Tensor,
    row_parents: torch.Tensor,
    root_token: torch.Tensor,
    *,
    total_token: int,
    top_k: int,
    depth: int,
    sampling: bool,
    padded: bool,
    cache=None,
) -> Frontier:
    """The end of every draft call built on a candidate list: :func:`select_nodes`, then
    :func:`pack_tree`, as a :class:`~frontier.Frontier` (``cache`` is attached as given)."""
    draft_tokens, parent_pos, node_scores = select_nodes(cand_scores, cand_tokens, row_parents, root_token,
                                                         total_token, top_k)
    packed = pack_tree(parent_pos, sampling=sampling, padded=padded, max_depth=depth + 1)
    return Frontier(
        draft_tokens=draft_tokens,
        retrieve_indices=packed.retrieve_indices,
        tree_mask=packed.tree_mask,
        tree_position_ids=packed.tree_position_ids,
        cache=cache,
        scores=node_scores.float(),
        parents=torch.cat([parent_pos.new_zeros(1), parent_pos]),
        leaf_count=packed.leaf_count,
        padded=padded,
    )


__all__ += ["best_k", "expansion_parents", "chosen_candidates", "select_nodes", "frontier_from_candidates"]
