"""`Frontier`: the draft tree one call produces, plus the draft cache to pass to the next call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .errors import InvariantError


@dataclass
class Frontier:
    """Result of :func:`frontier.frontier_generate` (docs/contract.md, "Outputs").

    Attributes
    ----------
    draft_tokens: [1, T] int64 — the root first, then the chosen nodes in candidate-list order.
    retrieve_indices: [leaves, 1 + max depth] int64 — root->leaf paths, -1 padded
        (``[T, D+2]`` with ``leaf_count`` real rows when drafted with ``padded=True``).
    tree_mask: [1, 1, T, T] float 0/1 — ancestors-or-self of each node.
    tree_position_ids: [T] int64 — depth of each node.
    cache: the draft KV cache after this call (None for backends without weights).
    scores: [T] float32 cumulative log-prob of each node (root 0), when the backend knows them.
    parents: [T] int64 parent position of each node (root -> 0), when the backend provides it.
    leaf_count: [] int64 device tensor, number of real rows of retrieve_indices.
    invalid: [] bool device tensor, True when the call's inputs or outputs were invalid
        (non-finite values, token ids outside the vocabulary) under the device-side checks
        (``check_finite=False`` / ``check_token_range=False``): the tree is then meaningless
        and this call's new cache rows hold zeros instead of the poison. Always False after the
        host-side checks, which raise instead.
    """

    draft_tokens: torch.Tensor
    retrieve_indices: torch.Tensor
    tree_mask: torch.Tensor
    tree_position_ids: torch.Tensor
    cache: Any = None
    scores: Optional[torch.Tensor] = None
    parents: Optional[torch.Tensor] = None
    leaf_count: Optional[torch.Tensor] = None
    padded: bool = False
    info: dict = field(default_factory=dict)
    invalid: Optional[torch.Tensor] = None

    @property
    def total_token(self) -> int:
        return int(self.draft_tokens.shape[-1])

    @property
    def device(self) -> torch.device:
        return self.draft_tokens.device

    def real_retrieve_indices(self) -> torch.Tensor:
        """retrieve_indices without padding rows/columns (reads the leaf count if padded)."""
        if not self.padded:
            return self.retrieve_indices
        n = int(self.leaf_count) if self.leaf_count is not None else int((self.retrieve_indices[:, 0] >= 0).sum())
        rows = self.retrieve_indices[:n]
        width = int(self.tree_position_ids.max()) + 1
        return rows[:, :width]

    def integer_outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(draft_tokens, retrieve_indices, tree_mask, tree_position_ids) for equality checks."""
        return (self.draft_tokens, self.real_retrieve_indices(), self.tree_mask, self.tree_position_ids)

    def same_tree(self, other: "Frontier") -> bool:
        """True when both frontiers' integer outputs are identical."""
        return all(
            a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
            for a, b in zip(self.integer_outputs(), other.integer_outputs())
        )

    # ------------------------------------------------------------------------------------------
    def check_invariants(
        self,
        *,
        total_token: Optional[int] = None,
        depth: Optional[int] = None,
        top_k: Optional[int] = None,
        sampling: Optional[bool] = None,
    ) -> "Frontier":
        """Check every invariant of docs/contract.md; raise :class:`InvariantError` naming the
        first one broken.

        ``total_token``/``depth``/``top_k`` add the config-dependent checks (tree size, depth
        bound D+1, at most K children per node); ``sampling`` checks the retrieve row order
        (True: lexicographic with -1 last; False: ascending leaf order). Returns self.
        """
        dt, ri, tm, tp = self.draft_tokens, self.real_retrieve_indices(), self.tree_mask, self.tree_position_ids

        def fail(msg: str) -> None:
            raise InvariantError(f"Frontier invariant broken: {msg}")

        # dtypes and shapes
        if dt.dim() != 2 or dt.shape[0] != 1:
            fail(f"draft_tokens must be [1, T], got {tuple(dt.shape)}")
        t = dt.shape[1]
        if dt.dtype != torch.int64:
            fail(f"draft_tokens must be int64, got {dt.dtype}")
        if tuple(tm.shape) != (1, 1, t, t):
            fail(f"tree_mask must be [1, 1, {t}, {t}], got {tuple(tm.shape)}")
        if not tm.is_floating_point():
            fail(f"tree_mask must be a float tensor of 0/1, got {tm.dtype}")
        if tuple(tp.shape) != (t,) or tp.dtype != torch.int64:
            fail(f"tree_position_ids must be [{t}] int64, got {tuple(tp.shape)} {tp.dtype}")
        if ri.dim() != 2 or ri.dtype != torch.int64:
            fail(f"retrieve_indices must be 2-D int64, got {tuple(ri.shape)} {ri.dtype}")
        for name, x in (("retrieve_indices", self.retrieve_indices), ("tree_mask", tm), ("tree_position_ids", tp)):
            if x.device != dt.device:
                fail(f"{name} is on {x.device} but draft_tokens on {dt.device}")
        if total_token is not None and t != total_token:
            fail(f"draft_tokens has {t} nodes, expected total_token={total_token}")
        if (dt < 0).any():
            fail("draft_tokens holds a negative token id")

        m = tm[0, 0].detach().cpu()
        if not torch.all((m == 0) | (m == 1)):
            fail("tree_mask holds values other than 0 and 1")
        mb = m.bool()
        if not torch.equal(mb, torch.tril(mb)):
            fail("tree_mask is not lower-triangular (a node attends to a later node)")
        if not bool(mb.diagonal().all()):
            fail("tree_mask diagonal is not all ones")
        if not bool(mb[:, 0].all()):
            fail("tree_mask column 0 (the root) is not all ones")
        if t > 1:
            # Each node's row equals its parent's row plus itself; the parent is the deepest
            # strict ancestor, i.e. the last set column before the diagonal.
            strict = mb.clone()
            strict.fill_diagonal_(False)
            cols = torch.arange(t)
            parent = torch.where(strict, cols, torch.full_like(cols, -1)).max(dim=1).values  # [T]
            if int(parent[0]) != -1:
                fail("the root (row 0) has an ancestor")
            for i in range(1, t):
                expect = mb[int(parent[i])].clone()
                expect[i] = True
                if not torch.equal(mb[i], expect):
                    fail(f"tree_mask row {i} is not its parent's row (row {int(parent[i])}) plus itself")
        else:
            parent = torch.tensor([-1])
        depths = mb.sum(dim=1) - 1
        tpc = tp.detach().cpu()
        if not torch.equal(tpc, depths):
            bad = int((tpc != depths).nonzero()[0])
            fail(f"tree_position_ids[{bad}]={int(tpc[bad])} but tree_mask row {bad} sums to {int(depths[bad]) + 1}")
        if depth is not None and int(tpc.max()) > depth + 1:
            fail(f"tree depth {int(tpc.max())} exceeds depth + 1 = {depth + 1}")
        if top_k is not None and t > 1:
            children = torch.bincount(parent[1:], minlength=t)
            if int(children.max()) > top_k:
                node = int(children.argmax())
                fail(f"node {node} has {int(children.max())} children, more than top_k={top_k}")

        # retrieve_indices: one row per leaf, root->leaf along parent links, -1 right-padded.
        ric = ri.detach().cpu()
        is_parent = torch.zeros(t, dtype=torch.bool)
        if t > 1:
            is_parent[parent[1:]] = True
        leaves = (~is_parent).nonzero().flatten()
        if ric.shape[0] != leaves.numel():
            fail(f"retrieve_indices has {ric.shape[0]} rows but the tree has {leaves.numel()} leaves")
        if ric.shape[1] != int(tpc.max()) + 1:
            fail(f"retrieve_indices has {ric.shape[1]} columns, expected 1 + max depth = {int(tpc.max()) + 1}")
        seen = []
        for r in range(ric.shape[0]):
            row = ric[r]
            real = row[row >= 0]
            n = real.numel()
            if n == 0 or int(row[0]) != 0:
                fail(f"retrieve_indices row {r} does not start at the root (0)")
            if not bool((row[n:] == -1).all()) or bool((row[:n] < 0).any()):
                fail(f"retrieve_indices row {r} is not right-padded with -1")
            if bool((real >= t).any()):
                fail(f"retrieve_indices row {r} points past the tree ({t} nodes)")
            for j in range(1, n):
                if int(parent[int(real[j])]) != int(real[j - 1]):
                    fail(f"retrieve_indices row {r} does not follow parent links at column {j}")
            leaf = int(real[-1])
            if is_parent[leaf]:
                fail(f"retrieve_indices row {r} ends at node {leaf}, which is not a leaf")
            seen.append(leaf)
        if sorted(seen) != leaves.tolist():
            fail("retrieve_indices does not list every leaf exactly once")
        if sampling is False and seen != sorted(seen):
            fail("retrieve_indices rows are not in ascending leaf order (greedy mode)")
        if sampling is True:
            key = torch.where(ric < 0, torch.full_like(ric, t), ric).tolist()
            if key != sorted(key):
                fail("retrieve_indices rows are not sorted lexicographically with -1 last (sampling mode)")

        # Padded layout: padding rows are all -1.
        if self.padded:
            pad = self.retrieve_indices[ric.shape[0] :].detach().cpu()
            if not bool((pad == -1).all()):
                fail("padded retrieve_indices has a non -1 entry after the leaf rows")
            extra = self.retrieve_indices[: ric.shape[0], ric.shape[1] :].detach().cpu()
            if not bool((extra == -1).all()):
                fail("padded retrieve_indices has a non -1 entry past the deepest level")
            if self.retrieve_indices.shape[0] != t:
                fail(f"padded retrieve_indices must have T={t} rows, got {self.retrieve_indices.shape[0]}")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, for JSON output."""
        out = {
            "draft_tokens": self.draft_tokens.tolist(),
            "retrieve_indices": self.real_retrieve_indices().tolist(),
            "tree_position_ids": self.tree_position_ids.tolist(),
            "tree_mask": self.tree_mask[0, 0].to(torch.int8).tolist(),
        }
        if self.scores is not None:
            out["scores"] = self.scores.float().tolist()
        return out


__all__ = ["Frontier"]
