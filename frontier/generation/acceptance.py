"""Tree verification on the device: which draft tokens the target accepts, and its next token.

Greedy (:func:`greedy_accept`, :func:`greedy_accept_batch`): a node is accepted when every node
on its path is the target's argmax at its parent, so the output equals
``target.generate(do_sample=False)``. Sampling (:func:`sampling_accept`) is EAGLE's tree rejection
scheme: at each accepted node the children are tried in node order, child ``x`` is accepted with
probability ``p(x)`` under the target's warped distribution (:func:`warp_logits`) renormalised
after the earlier siblings' rejections, and if all are rejected the next token is drawn from the
residual. With a deterministic draft this leaves the output distribution exactly the target's.

Every function returns device tensors and reads nothing back to the host.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ..errors import InputError

__all__ = [
    "SamplingParams", "greedy_accept", "greedy_accept_batch", "sampling_accept", "tree_parents", "warp_logits",
]


# ----------------------------------------------------------------------------------------------
# Sampling parameters and logits warping (Hugging Face generate's definitions and order)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingParams:
    """``temperature <= 1e-5`` means greedy. ``top_k=0`` and ``top_p=1.0`` switch those off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5

    def check(self) -> "SamplingParams":
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise InputError(
                f"temperature must be a finite number >= 0 (0 = greedy), got temperature={self.temperature!r}"
            )
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p must be a number in (0, 1] (1 = off), got top_p={self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InputError(f"top_k must be an int >= 0 (0 = off), got top_k={self.top_k!r}")
        return self

    @classmethod
    def of(cls, temperature: Any, top_p: Any, top_k: Any) -> "SamplingParams":
        """Checked parameters from a caller's values (ints and floats; never strings or bools)."""
        params = cls(temperature, top_p, top_k).check()
        return cls(float(params.temperature), float(params.top_p), int(params.top_k))


def _is_real(x: Any) -> bool:
    """A real number: an int or a float (numpy's too), never a bool or a string."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _is_int(x: Any) -> bool:
    """An integer (numpy's too), never a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as ``transformers``' generate applies them.

    logits: [R, V] (any number of rows; each row independent). Returns float32 [R, V] logits
    with filtered entries at -inf.
    """
    x = logits.float() / params.temperature  # [R, V]
    v = x.shape[-1]
    if params.top_k > 0 and params.top_k < v:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [R, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)  # ascending, like HF
        cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)  # [R, V]
        remove_sorted = cum <= (1.0 - params.top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        x = x.masked_fill(remove, float("-inf"))
    return x

# ----------------------------------------------------------------------------------------------
# Tree verification, on the device
# ----------------------------------------------------------------------------------------------
def tree_parents(tree_mask: torch.Tensor) -> torch.Tensor:
    """[T] parent position of every node (root -> 0), from the [1, 1, T, T] ancestor mask.

    Ancestors precede their descendants, so a node's parent is its largest strict ancestor.
    """
    m = tree_mask[0, 0] > 0  # [T, T]
    t = m.shape[0]
    cols = torch.arange(t, device=m.device)  # [T]
    strict = m & (cols[None, :] < cols[:, None])  # [T, T]
    return torch.where(strict, cols[None, :], torch.zeros_like(cols)[None, :]).amax(dim=1)  # [T]


def _path_of(mask: torch.Tensor, node: torch.Tensor, width: int) -> torch.Tensor:
    """[width] positions root -> node (ascending ancestors), padded with T."""
    t = mask.shape[0]
    cols = torch.arange(t, device=mask.device)
    keyed = torch.where(mask[node], cols, torch.full_like(cols, t))  # [T]
    return torch.sort(keyed).values[:width]  # [width]


def greedy_accept(
    logits: torch.Tensor, draft_tokens: torch.Tensor, tree_mask: torch.Tensor, depth: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of one tree, with no host read.

    logits: [T, V] target logits of the tree nodes; draft_tokens: [T] (root first);
    tree_mask [1, 1, T, T]; depth [T] (tree_position_ids); width >= 1 + max depth.
    A node is accepted when every node on its path (root excluded) is the target's argmax at
    its parent. Returns (best [] deepest accepted node, path [width] positions root -> best
    padded with T, next_token [] the target's argmax at best). The accepted draft tokens are
    ``draft_tokens[path[1 : depth[best] + 1]]``.
    """
    m = tree_mask[0, 0] > 0  # [T, T]
    parent = tree_parents(tree_mask)  # [T]
    target_next = logits.argmax(dim=-1)  # [T] argmax is the first maximum, like generate
    ok = draft_tokens == target_next[parent]  # [T]
    ok[0] = True  # the root was produced by the target itself
    accepted = ~(m & ~ok[None, :]).any(dim=1)  # [T] whole path agrees
    best = torch.where(accepted, depth, torch.full_like(depth, -1)).argmax()  # [] unique deepest
    return best, _path_of(m, best, width), target_next[best]


def greedy_accept_batch(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    tree_masks: torch.Tensor,
    depth: torch.Tensor,
    width: int,
    valid: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`greedy_accept` for B trees at once (same result per tree), with no host read.

    logits [B, T, V]; draft_tokens [B, T]; tree_masks [B, T, T] bool (ancestors-or-self);
    depth [B, T]; valid [B, T] bool marks real nodes when trees of different sizes share T
    (padding nodes are never accepted). Returns (best [B], path [B, width] padded with T,
    next_token [B]).
    """
    bsz, t = draft_tokens.shape
    m = tree_masks  # [B, T, T]
    cols = torch.arange(t, device=m.device)  # [T]
    strict = m & (cols[None, :] < cols[:, None])[None]  # [B, T, T]
    parent = torch.where(strict, cols, torch.zeros_like(cols)).amax(dim=2)  # [B, T]
    target_next = logits.argmax(dim=-1)  # [B, T]
    ok = draft_tokens == target_next.gather(1, parent)  # [B, T]
    ok[:, 0] = True  # the roots were produced by the target itself
    if valid is not None:
        ok &= valid
    accepted = ~(m & ~ok[:, None, :]).any(dim=2)  # [B, T] whole path agrees
    best = torch.where(accepted, depth, torch.full_like(depth, -1)).argmax(dim=1)  # [B]
    on_path = m.gather(1, best[:, None, None].expand(bsz, 1, t))[:, 0]  # [B, T] ancestors-or-self of best
    keyed = torch.where(on_path, cols, torch.full_like(cols, t))  # [B, T]
    path = torch.sort(keyed, dim=1).values[:, :width]  # [B, width]
    return best, path, target_next.gather(1, best[:, None])[:, 0]


def sampling_accept(
    probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    tree_mask: torch.Tensor,
    depth: torch.Tensor,
    width: int,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampling verification of one tree (EAGLE's tree rejection scheme), with no host read.

    probs: [T, V] the target's warped next-token distribution at every node. Walking down from
    the root, the children of the current node are tried in node order; child ``x`` is accepted
    with probability ``p(x) / (1 - sum of p over the siblings tried before it)``; the first
    accepted child becomes the current node. When every child is rejected (or the node is a
    leaf) the next token is drawn from the residual ``p`` with the tried children removed. All
    coin flips are drawn at once (one uniform per node), so the walk is a few tensor ops.
    Returns (best, path, next_token) like :func:`greedy_accept`.
    """
    t = draft_tokens.shape[0]
    m = tree_mask[0, 0] > 0  # [T, T]
    parent = tree_parents(tree_mask)  # [T]
    idx = torch.arange(t, device=probs.device)
    is_child = idx > 0  # [T]
    p_self = probs[parent, draft_tokens]  # [T] p_parent(x_i)
    p_self = torch.where(is_child, p_self, torch.zeros_like(p_self))
    earlier_sib = (parent[:, None] == parent[None, :]) & (idx[None, :] < idx[:, None])  # [T, T]
    earlier_sib &= is_child[:, None] & is_child[None, :]
    tried_mass = (earlier_sib.to(probs.dtype) * p_self[None, :]).sum(dim=1)  # [T]
    accept_p = p_self / (1.0 - tried_mass).clamp_min(1e-20)  # [T]
    u = torch.rand(t, device=probs.device, generator=generator, dtype=probs.dtype)  # [T]
    ok = (u < accept_p) & is_child  # [T]
    first_ok = ok & ~(earlier_sib & ok[None, :]).any(dim=1)  # [T] the first accepted sibling
    first_ok[0] = True
    on_path = ~(m & ~first_ok[None, :]).any(dim=1)  # [T]
    best = torch.where(on_path, depth, torch.full_like(depth, -1)).argmax()  # []
    # Residual at best: its children (all tried and rejected, else a child would be deeper).
    children = (parent == best) & is_child  # [T]
    p = probs[best]  # [V]
    removed = torch.zeros_like(p).scatter_add_(0, draft_tokens, children.to(p.dtype))  # [V] > 0: a child
    residual = torch.where(removed > 0, torch.zeros_like(p), p)
    mass = residual.sum()
    residual = torch.where(mass > 1e-12, residual, p)  # rounding guard: all mass was in the children
    next_token = torch.multinomial(residual, 1, generator=generator)[0]  # [] (normalises itself)
    return best, _path_of(m, best, width), next_token
