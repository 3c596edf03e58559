"""Why two backends' trees differ: candidate traces and the near-tie check (docs/contract.md, "Parity").

In float32 with IEEE dots, triton and torch_ref give identical trees. In bf16/fp16 the contract
allows a difference "only where two candidates' scores are within rounding of each other". This
module checks that claim one call at a time.

A call drafted with the option ``trace=True`` (torch_ref and triton accept it) carries a
:class:`CandidateTrace` in ``Frontier.info["trace"]``: the whole candidate list as the call built
it (scores, target tokens, the stored parent of each group of K siblings) and, from torch_ref, the
full log-prob row behind every top-K.

:func:`near_tie_report` walks two traces of the same call in the order the candidates were made:

1. the root's top-K;
2. for each depth i, the frontier (depth i >= 1: the top-K prune of depth i-1's K*K block, read
   off the stored parents), then each frontier row's top-K children;
3. the final top-(T-1) selection.

Until the first stage whose decision differs, both calls expanded the same paths, so the scores
of the same candidates can be set side by side: the largest difference is the *noise*. At the
first differing stage, the other backend's decision is held against the reference's own scores
for the same choice: the *gap* is how far the reference's scores contradict it (the largest
amount by which a score the other backend ranked lower - or left out - exceeds one it ranked
higher, 0 when the reference itself has a tie there). After that stage the two calls expand
different rows, so nothing further is compared.

Both numbers are given in rounding units of the call: ``eps(dtype) * max |log-prob|`` over the
reference's log-prob rows (the log-probs are computed and stored in the compute dtype, so their
rounding error scales with the row's range, not with each value). A difference is *explained* when
the gap and the noise are both within ``(ulps + acc) * (stage depth + 1)`` units, whether or not
the differing choice reached the final tree: the scores at that stage are sums of that many
log-probs, each carrying ``ulps`` units of its own rounding and ``acc = sqrt(n) * eps(float32) /
eps(dtype)`` units of the fp32 accumulations behind it (every backend accumulates its dots in
fp32, in its own order; ``n`` is the longest dot of the layer, ``max(hidden_size,
intermediate_size)``, and ``sqrt(n) * eps`` the usual probabilistic bound of such a sum). ``acc``
is below 0.01 units in bf16/fp16, where the rounding of the log-probs dominates; in float32 it
dominates (sqrt(n) units beside ``ulps``), since there the accumulation order is the only noise. The
default ``ulps=2`` leaves room above what was measured (docs/triton.md, "Near-ties": fp16 noise
below 2 units under the interpreter; bf16/fp16 below 1.4 units on an H200).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .result import Frontier
from .tree import chosen_candidates, frontier_from_candidates


@dataclass
class CandidateTrace:
    """One call's candidate list (C = K + D*K^2 entries), as the backend built it.

    scores: [C] float32 cumulative log-probs; tokens: [C] int64 target ids; row_parents:
    [C // K] int64 stored parent of each group of K siblings (docs/contract.md).
    log_probs (torch_ref only): the rows each top-K was taken from, in the compute dtype: the
    root's [V], then one [K, V] per depth. draft_to_target (torch_ref only): [V] int64 target
    id of each draft index (the identity when the vocabularies coincide).
    """

    scores: torch.Tensor
    tokens: torch.Tensor
    row_parents: torch.Tensor
    log_probs: Optional[list[torch.Tensor]] = None
    draft_to_target: Optional[torch.Tensor] = None

    def to(self, device) -> "CandidateTrace":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return CandidateTrace(mv(self.scores), mv(self.tokens), mv(self.row_parents),
                              None if self.log_probs is None else [mv(t) for t in self.log_probs],
                              mv(self.draft_to_target))


@dataclass
class TieReport:
    """The outcome of :func:`near_tie_report` for one call.

    identical: the two Frontiers' integer outputs are equal.
    stage: the first stage whose decision differs ("root", "prune@i", "children@i row r",
      "final"), None when every decision matched.
    gap, noise: in rounding units (``unit``); see the module docstring.
    explained: the gap and the noise are both within the tolerance at that stage (gap 0 when
      every decision matched), and ``consistent``. Identical trees are not enough: a decision
      taken against the reference's order, or scores beyond rounding, fail even when the
      differing choice did not reach the final tree.
    consistent: the other Frontier is exactly what the shared final selection and packing make
      of its own candidate list (checks the backend's on-device final selection).
    """

    identical: bool
    stage: Optional[str]
    gap: float
    noise: float
    unit: float
    tolerance: float
    explained: bool
    consistent: bool
    detail: str = ""

    def __str__(self) -> str:
        if self.identical and self.stage is None:
            verdict = "" if self.explained else " - NOT explained (scores beyond rounding or an inconsistent selection)"
            return f"identical (noise {self.noise:.2f} units, tolerance {self.tolerance:.1f}){verdict}"
        what = "explained" if self.explained else "NOT explained"
        return (f"{'identical trees, ' if self.identical else ''}first difference at {self.stage}: gap "
                f"{self.gap:.2f}, noise {self.noise:.2f} units (tolerance {self.tolerance:.1f}, unit "
                f"{self.unit:.3g}) - {what}{'' if self.consistent else '; the final selection is INCONSISTENT'}"
                f"{': ' + self.detail if self.detail else ''}")


def _trace(fr: Frontier, who: str) -> CandidateTrace:
    tr = fr.info.get("trace") if fr.info else None
    if not isinstance(tr, CandidateTrace):
        raise ValueError(f"{who}: no candidate trace in Frontier.info['trace']; draft the call with trace=True")
    return tr.to("cpu")


def order_gap(x: torch.Tensor, chosen: torch.Tensor, ordered: bool) -> float:
    """How far the scores ``x`` [U] contradict choosing ``chosen`` (indices into x) as a top-m.

    The largest excess of an unchosen score over the smallest chosen one and, when ``ordered``,
    of a later chosen score over an earlier one; 0 when ``chosen`` is an exact top-m of x (ties
    in any order). Out-of-range or repeated indices give inf."""
    x = x.double()
    if chosen.numel() and (int(chosen.min()) < 0 or int(chosen.max()) >= x.numel() or chosen.unique().numel() != chosen.numel()):
        return math.inf
    xc = x[chosen]  # [m]
    gap = 0.0
    if ordered and xc.numel() > 1:
        gap = max(gap, float((xc[1:] - xc[:-1]).max()))
    rest = torch.ones_like(x, dtype=torch.bool)
    rest[chosen] = False
    if bool(rest.any()) and xc.numel():
        gap = max(gap, float(x[rest].max() - xc.min()))
    return max(gap, 0.0)


def _draft_index(tr: CandidateTrace, vocab: int) -> dict[int, int]:
    d2t = tr.draft_to_target if tr.draft_to_target is not None else torch.arange(vocab)
    return {int(t): j for j, t in enumerate(d2t.tolist())}


def near_tie_report(ref: Frontier, other: Frontier, cfg, ulps: float = 2.0) -> TieReport:
    """Compare two traced drafts of one call (``ref`` from torch_ref, ``other`` from any backend
    that traces); see the module docstring. The compute dtype is read off the reference's log-probs."""
    r, o = _trace(ref, "ref"), _trace(other, "other")
    if r.log_probs is None:
        raise ValueError("ref: its trace has no log-prob rows (trace it with backend='torch_ref')")
    k, depth = cfg.top_k, cfg.depth
    rows = r.log_probs
    dtype = rows[0].dtype
    spread = max(float(lp.float().nan_to_num(0.0, 0.0, 0.0).abs().max()) for lp in rows)  # finite values only
    unit = torch.finfo(dtype).eps * max(spread, 1e-30)  # (a one-token vocabulary has log-probs of 0)
    n_dot = max(cfg.hidden_size, cfg.intermediate_size or 0)
    acc = math.sqrt(n_dot) * torch.finfo(torch.float32).eps / torch.finfo(dtype).eps  # fp32 sums, in units
    identical = ref.same_tree(other)
    # the other call's tree, rebuilt from its own candidate list by the shared selection/packing
    root = other.draft_tokens[0, :1].cpu()
    rebuilt = frontier_from_candidates(o.scores, o.tokens, o.row_parents, root, total_token=cfg.total_token,
                                       top_k=k, depth=depth, sampling=False, padded=False)
    consistent = (torch.equal(rebuilt.draft_tokens, other.draft_tokens.cpu())
                  and torch.equal(rebuilt.parents, other.parents.cpu()))
    index = _draft_index(r, rows[0].shape[-1])
    noise = 0.0

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0

    def done(stage, gap, level, detail=""):
        tol = (ulps + acc) * (level + 1)
        # identical trees do not excuse a decision made against the reference's order, or scores that
        # disagree beyond rounding; a differing tree with no differing decision means inconsistent packing
        ok = consistent and gap <= tol * unit and noise <= tol * unit and (identical or stage is not None)
        return TieReport(identical, stage, gap / unit, noise / unit, unit, tol, ok, consistent, detail)

    def children(lp_row: torch.Tensor, base: torch.Tensor, lo: int, level: int, stage: str):
        """Compare one sibling group (candidates lo..lo+K-1) of both lists; None when equal."""
        nonlocal noise
        rt, ot = r.tokens[lo:lo + k], o.tokens[lo:lo + k]
        ids = [index.get(int(t), -1) for t in ot.tolist()]
        known = torch.tensor([i for i in ids if i >= 0], dtype=torch.long)
        # the other call's scores for its own choices, against the reference's for the same tokens
        ref_same = (lp_row[known] + base).float()  # score = parent's + log-prob, rounded as torch_ref does
        oth_same = o.scores[lo:lo + k][torch.tensor([i >= 0 for i in ids])]
        noise = max(noise, diff(ref_same, oth_same))
        if torch.equal(rt, ot):
            return None
        gap = order_gap(lp_row, torch.tensor(ids, dtype=torch.long), ordered=True)
        return done(stage, gap, level, f"reference tokens {rt.tolist()}, other {ot.tolist()}")

    # 1. the root's top-K
    rep = children(rows[0], torch.zeros((), dtype=dtype), 0, 0, "root")
    if rep is not None:
        return rep
    for i in range(depth):
        g0 = 1 + i * k  # this depth's groups in row_parents
        block = k + (i - 1) * k * k  # start of the previous depth's K*K block (i >= 1)
        # 2a. the frontier: the prune of depth i-1 (depth 0's frontier is the root's children)
        if not torch.equal(r.row_parents[g0:g0 + k], o.row_parents[g0:g0 + k]):
            picks = o.row_parents[g0:g0 + k] - 1 - block
            gap = order_gap(r.scores[block:block + k * k], picks, ordered=True)
            return done(f"prune@{i - 1}", gap, i,
                        f"reference picks {(r.row_parents[g0:g0 + k] - 1 - block).tolist()}, other {picks.tolist()}")
        # 2b. each frontier row's children
        for row in range(k):
            parent = int(r.row_parents[g0 + row]) - 1
            base = r.scores[parent].to(dtype)  # the row's own score (exact: stored from the dtype)
            lo = k + i * k * k + row * k
            rep = children(rows[1 + i][row], base, lo, i + 1, f"children@{i} row {row}")
            if rep is not None:
                return rep
    # 3. the final selection (every candidate is the same path in both lists)
    noise = max(noise, diff(r.scores, o.scores))
    chosen, ref_chosen = chosen_candidates(o.scores, cfg.total_token), chosen_candidates(r.scores, cfg.total_token)
    if not torch.equal(chosen, ref_chosen):
        return done("final", order_gap(r.scores, chosen, ordered=False), depth,
                    f"{int((~torch.isin(chosen, ref_chosen)).sum())} of {chosen.numel()} chosen nodes differ")
    return done(None, 0.0, depth)


__all__ = ["CandidateTrace", "TieReport", "near_tie_report", "order_gap"]
