"""One draft call, step by step (docs/contract.md, "One draft call").

1. :func:`context_step` — the n new context rows through the layer; their K/V are kept.
2. :func:`expand_depth` — D times: the K frontier rows through the layer with the implicit
   tree mask (context + ancestors + self), top-K children, cumulative scores, top-K prune.
3. :func:`frontier.tree.select_nodes` + :func:`frontier.tree.pack_tree` — the final selection
   and the tree tensors, shared with every backend.

The tree rows' K/V are scratch; the context rows' K/V enter the draft cache only after the
whole call succeeded, so a failing call leaves the cache as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...cache import DraftCache
from ...config import FrontierConfig
from ...parity import CandidateTrace
from ...result import Frontier
from ...tree import best_k, expansion_parents, frontier_from_candidates
from ...weights import DraftWeights
from .layer import causal_mask, draft_forward, log_probs, to_target_ids, tree_attention_mask


@dataclass
class FrontierRows:
    """The K rows expanded at the next depth."""

    tokens: torch.Tensor  # [K] target ids fed back as t
    hidden: torch.Tensor  # [K, H] hidden input (the parent's output row)
    scores: torch.Tensor  # [K] cumulative log-probs
    pick: torch.Tensor  # [K] index of each row in the previous depth's K*K block (depth 0: arange)
    ancestors: torch.Tensor  # [K, K*i] bool: visible tree rows of earlier depths


@dataclass
class Candidates:
    """The candidate list in order: K entries from the root, then K*K per depth."""

    scores: list[torch.Tensor]  # each [K] or [K*K]
    tokens: list[torch.Tensor]  # each [K] or [K*K] target ids
    row_parents: list[torch.Tensor]  # each [1] (root group) or [K]: stored parent of each sibling group
    log_probs: Optional[list[torch.Tensor]] = None  # option trace=True: each top-K's rows, [V] then [K, V]


def context_step(cfg: FrontierConfig, w: DraftWeights, cache: DraftCache, ids: torch.Tensor, features: torch.Tensor):
    """Run the n new context rows (causal among themselves, full view of the c cached rows).

    ids: [L] token ids paired with the hidden states (``input_ids[0, 1:]``); features [n, F].
    Returns (h_last [H], keys, values): per-layer K/V of the n new rows, [nkv, n, d] each.
    """
    c, n = cache.length, features.shape[0]
    positions = torch.arange(c, c + n, device=features.device)  # [n]
    past_k = [cache.keys(layer) for layer in range(cfg.num_layers)]  # [nkv, c, d] each
    past_v = [cache.values(layer) for layer in range(cfg.num_layers)]
    mask = causal_mask(n, c, features.device) if n > 1 else None  # [n, c+n]
    out = draft_forward(cfg, w, ids[c:], features, positions, past_k, past_v, mask)
    return out.hidden[-1], out.keys, out.values  # [H]


def root_children(cfg: FrontierConfig, w: DraftWeights, h_last: torch.Tensor, cand: Candidates) -> FrontierRows:
    """Top-K of the root: the first K candidates and the depth-0 frontier."""
    k = cfg.top_k
    p0 = log_probs(cfg, w, h_last[None])[0]  # [V]
    top_lp, top_idx = best_k(p0, k)  # [K] each; exact ties go to the lower draft index
    tokens = to_target_ids(cfg, w, top_idx)  # [K]
    if cand.log_probs is not None:
        cand.log_probs.append(p0)
    cand.scores.append(top_lp)
    cand.tokens.append(tokens)
    cand.row_parents.append(torch.zeros(1, dtype=torch.long, device=h_last.device))
    return FrontierRows(
        tokens=tokens,
        hidden=h_last[None].expand(k, -1),  # [K, H] every root child carries h_last
        scores=top_lp,  # [K]
        pick=torch.arange(k, device=h_last.device),  # [K]
        ancestors=torch.zeros(k, 0, dtype=torch.bool, device=h_last.device),  # [K, 0]
    )


def expand_depth(
    cfg: FrontierConfig,
    w: DraftWeights,
    i: int,
    rows: FrontierRows,
    context_len,
    scratch_k: list[torch.Tensor],
    scratch_v: list[torch.Tensor],
    cand: Candidates,
    visible: Optional[torch.Tensor] = None,
) -> FrontierRows:
    """Depth i: the K frontier rows at position L + i; append K*K candidates; prune to K.

    scratch_k/v: per layer [nkv, P + K*i, d] (the P context rows then earlier tree rows);
    extended in place with this depth's K rows. context_len: L, an int (P = L, every context
    row visible) or a 0-d device tensor with ``visible`` [P] bool marking the L real rows of a
    fixed-size context (the static drafter).
    """
    k = cfg.top_k
    device = rows.hidden.device
    ancestors = torch.cat((rows.ancestors, torch.eye(k, dtype=torch.bool, device=device)), dim=1)  # [K, K*(i+1)]
    mask = tree_attention_mask(ancestors, context_len if visible is None else visible)  # [K, P + K*(i+1)]
    positions = (context_len + i) * torch.ones(k, dtype=torch.long, device=device)  # [K]
    out = draft_forward(cfg, w, rows.tokens, rows.hidden, positions, scratch_k, scratch_v, mask)
    for layer in range(cfg.num_layers):
        scratch_k[layer] = torch.cat((scratch_k[layer], out.keys[layer]), dim=1)
        scratch_v[layer] = torch.cat((scratch_v[layer], out.values[layer]), dim=1)

    cand.row_parents.append(expansion_parents(rows.pick, i, k))  # [K]
    lp = log_probs(cfg, w, out.hidden)  # [K, V]
    child_lp, child_idx = best_k(lp, k)  # children of each row: [K, K]
    if cand.log_probs is not None:
        cand.log_probs.append(lp)
    cu_scores = child_lp + rows.scores[:, None]  # [K, K] cs[r, j] = score[r] + lp[r, j]
    child_tokens = to_target_ids(cfg, w, child_idx)  # [K, K]
    cand.scores.append(cu_scores.reshape(-1))
    cand.tokens.append(child_tokens.reshape(-1))

    best_scores, best_pick = best_k(cu_scores.reshape(-1), k)  # next frontier among the K*K pairs
    parent_row = best_pick // k  # [K]
    return FrontierRows(
        tokens=child_tokens.reshape(-1)[best_pick],  # [K]
        hidden=out.hidden[parent_row],  # [K, H] the parent's output row
        scores=best_scores,  # [K]
        pick=best_pick,  # [K]
        ancestors=ancestors[parent_row],  # [K, K*(i+1)]
    )


def draft_call(request) -> Frontier:
    """The whole draft call for one sequence (a validated :class:`frontier.api.DraftRequest`).
    An fp8 head drafts with its dequantized weights (``DraftWeights.dequantized``)."""
    cfg, w = request.cfg, request.weights.dequantized()
    ids = request.input_ids[0, 1:]  # [L] the token paired with each hidden state
    big_l = ids.shape[0]
    cache = request.draft_cache()
    c = cache.length

    # 1. context step
    h_last, new_k, new_v = context_step(cfg, w, cache, ids, request.features[0])
    trace = bool(request.options.get("trace"))
    cand = Candidates(scores=[], tokens=[], row_parents=[], log_probs=[] if trace else None)
    rows = root_children(cfg, w, h_last, cand)

    # 2. depth loop over the tree; scratch K/V = context rows (cached + new) then tree rows
    scratch_k = [torch.cat((cache.keys(layer), new_k[layer]), dim=1) for layer in range(cfg.num_layers)]
    scratch_v = [torch.cat((cache.values(layer), new_v[layer]), dim=1) for layer in range(cfg.num_layers)]
    for i in range(cfg.depth):
        rows = expand_depth(cfg, w, i, rows, big_l, scratch_k, scratch_v, cand)

    # 3. final selection and packing
    root = request.input_ids[0, -1:]  # [1]
    fr = frontier_from_candidates(
        torch.cat(cand.scores), torch.cat(cand.tokens), torch.cat(cand.row_parents), root, total_token=cfg.total_token,
        top_k=cfg.top_k, depth=cfg.depth, sampling=request.sampling, padded=request.padded, cache=cache,
    )

    if trace:  # the candidate list and every top-K's log-probs, for frontier.parity
        vocab = torch.arange(cfg.vocab_size, device=root.device)  # [V]
        fr.info["trace"] = CandidateTrace(
            scores=torch.cat(cand.scores).float(), tokens=torch.cat(cand.tokens), row_parents=torch.cat(cand.row_parents),
            log_probs=cand.log_probs, draft_to_target=to_target_ids(cfg, w, vocab),
        )

    # Only now, with everything computed, do the new context rows enter the cache.
    for layer in range(cfg.num_layers):
        cache.write(layer, c, new_k[layer], new_v[layer])
    cache.commit(c + new_k[0].shape[1])
    return fr
