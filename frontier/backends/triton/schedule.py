"""The schedule of one draft call: the phases the drafter program runs, in order.

An entry is ``phase * 256 + depth`` (``kernels.layout``; depth ``CONTEXT_STEP`` is the context step):

    context step:  [PREP2, FC] (EAGLE-2) | [FC, PREP3] (EAGLE-3), QKV, ROPE, attention, OPROJ,
                   NORM_POST, GATEUP, DOWN, [NORM_F], LMHEAD, MERGE, SELECT
    each depth i:  [PREP2, FC] | [PREP3], QKV, ROPE, attention, OPROJ, NORM_POST, GATEUP, DOWN,
                   [NORM_F], LMHEAD, MERGE, SELECT
    end:           FINAL

Attention is three phases (ATTN, ATTN2, ATTN3: per-part statistics, P @ V, the sum over parts)
or, in batched launches, the one fused phase ATTN_F. Launches whose MERGE runs each sequence's
SELECT itself drop the SELECT entries; those that read the embedding-QKV table (``kernels.table``)
also drop the tree depths' PREP3 and QKV (RoPE makes each row's QKV from the table). Wide
launches split K in the tree depths' QKV, o_proj and down; the phase after each sums the
partials, except EAGLE-2's down, which has no norm after it and gets the reduction phase RED_D.
"""

from __future__ import annotations

from .kernels.layout import CONTEXT_STEP, Phase

_ATTENTION = [Phase.ATTN, Phase.ATTN2, Phase.ATTN3]


def build_schedule(architecture: str, depth: int, split_k: bool = False, fused_attention: bool = False,
                   select_in_merge: bool = False, emb_table: bool = False) -> list[int]:
    """The schedule entries of one call. ``split_k``: a wide launch (adds EAGLE-2's RED_D after
    each tree depth's DOWN); ``fused_attention``: ATTN_F instead of the three attention phases;
    ``select_in_merge`` (narrow launches only): no SELECT entries; ``emb_table`` (EAGLE-3
    launches that select in MERGE): no PREP3 or QKV at the tree depths."""
    attention = [Phase.ATTN_F] if fused_attention else _ATTENTION
    layer = [Phase.QKV, Phase.ROPE, *attention, Phase.OPROJ, Phase.NORM_POST, Phase.GATEUP, Phase.DOWN]
    if architecture == "eagle3":
        ctx_head, tree_head = [Phase.FC, Phase.PREP3], [Phase.PREP3]
        tail = layer + [Phase.NORM_F, Phase.LMHEAD, Phase.MERGE, Phase.SELECT]
    else:
        ctx_head = tree_head = [Phase.PREP2, Phase.FC]
        tail = layer + [Phase.LMHEAD, Phase.MERGE, Phase.SELECT]
    if select_in_merge and not split_k:
        tail = [p for p in tail if p != Phase.SELECT]
    tree_tail = list(tail)
    if emb_table and select_in_merge and not split_k and architecture == "eagle3":
        tree_head = []
        tree_tail.remove(Phase.QKV)
    if split_k and architecture != "eagle3":
        tree_tail.insert(tree_tail.index(Phase.DOWN) + 1, Phase.RED_D)
    sched = [int(p) * 256 + CONTEXT_STEP for p in ctx_head + tail]
    for i in range(depth):
        sched += [int(p) * 256 + i for p in tree_head + tree_tail]
    sched.append(int(Phase.FINAL) * 256)
    return sched
