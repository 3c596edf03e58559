"""The stub backend: EAGLE-shaped draft trees with no weights.

It runs the real dynamic-tree bookkeeping of docs/contract.md (top-K children per frontier row,
cumulative scores, top-K prune, final top-(T-1) + sort, shared tree packing) but replaces the
draft layer with a counter-based hash that yields deterministic pseudo-random log-probs and
tokens. So its trees have EAGLE's shape (neither chains nor stars, depth <= D+1, at most K
children per node), depend only on (inputs, seed), and it runs on the features' device with
integer/elementwise ops and no host read in padded mode, so it can be traced, compiled or
graph-captured to exercise generation control flow without weights.
"""

from __future__ import annotations

import math

import torch

from ...drafter import StaticStep
from ...registry import Backend
from ...result import Frontier
from ...tree import best_k, expansion_parents, frontier_from_candidates

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xorshift-multiply), elementwise on int64 tensors."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    x = x ^ (x >> 16)
    return x


def _hash(seed: int, root: torch.Tensor, level: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """[R, C] int64 hash of (seed, root token, level, row id, column)."""
    x = rows[:, None] * 0x9E3779B1 + cols[None, :] * 0x85EBCA77 + (level * 0xC2B2AE3D + seed * 0x27D4EB2F)
    x = x + root * 0x165667B1
    return _mix32(_mix32(x))


class StubBackend(Backend):
    name = "stub"
    requires_weights = False
    devices = ("cpu", "cuda")
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    description = "EAGLE-shaped trees without weights (tracing, tests, control flow)"

    def generate(self, request) -> Frontier:
        cfg = request.cfg
        device = request.features.device
        if request.input_ids is not None:
            root = request.input_ids[0, -1:].long()  # [1]
        else:
            root = torch.zeros(1, dtype=torch.long, device=device)  # [1]
        return stub_frontier(cfg, root, _call_seed(request.seed, request.features.shape[1]),
                             sampling=request.sampling, padded=request.padded)

    def static_drafter(self, drafter):
        """The draft step over a :class:`frontier.Drafter`'s buffers: each slot's tree from its
        root token, the drafter's seed and its new-row count, all on the device."""
        return _StaticStub(drafter)


def _call_seed(seed, n):
    """32 bits of (seed, n): any int seed and any row count keep the hash inside int64 (``n``
    an int or a device tensor)."""
    return (seed + 1000003 * n) & _MASK32


def stub_frontier(cfg, root: torch.Tensor, seed, *, sampling: bool, padded: bool) -> Frontier:
    """The stub's tree rooted at ``root`` [1]; ``seed`` an int or a 0-d int64 device tensor."""
    k, depth, t = cfg.top_k, cfg.depth, cfg.total_token
    device = root.device
    cols = torch.arange(k, device=device)  # [K]
    tail = math.log(max(cfg.vocab_size - k, 1))  # log-mass of the rest of the vocabulary

    def children(level: int, row_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-K (log-prob, token) of each row, log-probs sorted descending: [R, K] each."""
        h = _hash(seed, root, level, row_ids, cols)  # [R, K]
        u = ((h & 0xFFFFFF).double() + 0.5) / float(1 << 24)  # [R, K] in (0, 1)
        logits = 6.0 * u  # [R, K]
        rest = torch.full_like(logits[:, :1], tail)  # [R, 1]
        logz = torch.logsumexp(torch.cat([logits, rest], dim=1), dim=1, keepdim=True)  # [R, 1]
        lp = torch.sort(logits - logz, dim=1, descending=True).values.float()  # [R, K]
        base = _mix32(h[:, :1] + 0x5BD1E995)  # [R, 1]
        tokens = (base + cols[None, :]) % cfg.vocab_size  # [R, K] distinct per row
        return lp, tokens

    lp0, tok0 = children(0, torch.zeros(1, dtype=torch.long, device=device))  # [1, K]
    scores = lp0[0]  # [K]
    cand_scores, cand_tokens = [scores], [tok0[0]]
    row_parents = [torch.zeros(1, dtype=torch.long, device=device)]
    pick = torch.arange(k, device=device)  # [K] frontier rows' picks (depth 0: the first K)
    for i in range(depth):
        parents = expansion_parents(pick, i, k)  # [K] stored parent = candidate index + 1
        row_parents.append(parents)
        lp, tok = children(i + 1, parents - 1)  # [K, K]
        cs = scores[:, None] + lp  # [K, K] cumulative scores
        cand_scores.append(cs.reshape(-1))
        cand_tokens.append(tok.reshape(-1))
        scores, pick = best_k(cs.reshape(-1), k)  # [K] each

    return frontier_from_candidates(
        torch.cat(cand_scores), torch.cat(cand_tokens), torch.cat(row_parents), root, total_token=t, top_k=k,
        depth=depth, sampling=sampling, padded=padded,
    )


class _StaticStub(StaticStep):
    def draft(self, batch: int, st) -> None:
        d = self.d
        for b in range(batch):
            fr = stub_frontier(d.cfg, st.root[b].reshape(1), _call_seed(d.seed, st.n[b]), sampling=d.sampling,
                               padded=True)
            d.outputs.write(b, fr)
