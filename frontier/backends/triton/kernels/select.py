"""Selection: the per-depth prune (each sequence's K x K children -> its K best cumulative
scores, ancestors kept per row) and FINAL (the top ``T - 1`` candidates packed into the tree:
tokens, parents, mask, positions, retrieve indices).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import KEY_NONE
from .numerics import _best_k, _key, _key_idx, _key_val, _keys16


@triton.jit
def _ph_select(pid, nprog, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr, fr_tok_ptr,
               fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V,
               IS_CTX: tl.constexpr, HAS_D2T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_A: tl.constexpr,
               DT: tl.constexpr, KEY32: tl.constexpr):
    """One program per sequence b (its K frontier rows b*K.., its C candidates, its RPW
    row-parent entries). Context step: the root's top-K (row b of the lm_head output) become
    candidates 0..K-1 and the depth-0 frontier, whose hidden source is row b. Depth i:
    cumulative scores of the K*K children, their candidate entries, and the top-K prune into
    the next frontier (tokens, scores, source rows b*K + parent, ancestor slots b*SK + ...).
    The K*K children are one flat list (entry row * BLOCK_K + rank): each of the prune's K rounds
    takes its maximum in one reduction (a [BLOCK_K, BLOCK_K] block took two). KEY32 (16-bit
    dtypes, K*K <= 65536): the rounds rank 32-bit keys, ``_keys16`` of the children's scores
    (DT values) and flat indices, in the order of the 64-bit ``_key``s. The children's tokens are
    stored after the rounds, which their d2t lookups' latency then hides behind, and the picks'
    tokens are read back from there (cheaper than matching each pick's flat index over the list)."""
    rr = tl.arange(0, BLOCK_K)
    ra = tl.arange(0, BLOCK_A)
    rmask = rr < K
    for b in range(pid, B, nprog):
        fb = b * K  # first frontier row of sequence b
        cand_s = cand_score_ptr + b * C
        cand_t = cand_tok_ptr + b * C
        rpar = row_par_ptr + b * RPW
        if IS_CTX:
            lp = tl.load(sel_lp_ptr + b * KP + rr, mask=rmask, other=0.0, cache_modifier=".cg")
            tokd = tl.load(sel_tok_ptr + b * KP + rr, mask=rmask, other=0, cache_modifier=".cg")
            tokd = tl.minimum(tl.maximum(tokd, 0), V - 1)
            tok = tokd
            if HAS_D2T:
                tok = tokd + tl.load(d2t_ptr + tokd, mask=rmask, other=0)
            tl.store(cand_s + rr, lp, mask=rmask)
            tl.store(cand_t + rr, tok, mask=rmask)
            tl.store(rpar + rr * 0, tl.zeros([BLOCK_K], tl.int64), mask=rr == 0)
            tl.store(fr_score_ptr + fb + rr, lp, mask=rmask)
            tl.store(fr_tok_ptr + fb + rr, tok, mask=rmask)
            tl.store(fr_src_ptr + fb + rr, tl.zeros([BLOCK_K], tl.int32) + b, mask=rmask)
            tl.store(fr_pick_ptr + fb + rr, rr.to(tl.int64), mask=rmask)
            tl.store(anc_ptr + (fb + rr) * BLOCK_A, b * SK + rr, mask=rmask)
        else:  # the K*K children as one flat list: entry e = row * BLOCK_K + rank
            e = tl.arange(0, BLOCK_K * BLOCK_K)
            er = e // BLOCK_K
            ej = e % BLOCK_K
            valid = (er < K) & (ej < K)
            lp = tl.load(sel_lp_ptr + (fb + er) * KP + ej, mask=valid, other=0.0, cache_modifier=".cg")
            tokd = tl.load(sel_tok_ptr + (fb + er) * KP + ej, mask=valid, other=0, cache_modifier=".cg")
            tokd = tl.minimum(tl.maximum(tokd, 0), V - 1)
            tok = tokd
            if HAS_D2T:
                tok = tokd + tl.load(d2t_ptr + tokd, mask=valid, other=0)
            score = tl.load(fr_score_ptr + fb + er, mask=valid, other=0.0, cache_modifier=".cg")
            pick_old = tl.load(fr_pick_ptr + fb + rr, mask=rmask, other=0, cache_modifier=".cg")
            cs = (score + lp).to(DT).to(tl.float32)
            flat = er * K + ej
            base = K + i * K * K
            tl.store(cand_s + base + flat, cs, mask=valid)
            offset = tl.where(i == 0, 1, 1 + K + (i - 1) * K * K)
            tl.store(rpar + 1 + i * K + rr, pick_old + offset, mask=rmask)
            if KEY32:
                keys = _keys16(cs.to(DT), flat, valid)
            else:
                keys = tl.where(valid, _key(cs, flat), KEY_NONE)
            top = _best_k(keys, rr, K, DT)
            npick = _key_idx(top).to(tl.int32)  # (past K: no pick; every use below is masked or clamped)
            nscore = _key_val(top)
            tl.store(cand_t + base + flat, tok, mask=valid)
            tl.debug_barrier()  # (the block's stores, visible to all its threads)
            ntok = tl.load(cand_t + base + npick, mask=rmask, other=0, cache_modifier=".cg")  # pick j's token
            prow = npick // K
            prow = tl.minimum(tl.maximum(prow, 0), K - 1)
            old = tl.load(anc_ptr + (fb + prow)[:, None] * BLOCK_A + ra[None, :], mask=rmask[:, None] & (ra <= i)[None, :],
                          other=0, cache_modifier=".cg")
            tl.debug_barrier()
            new = tl.where((ra == i + 1)[None, :], (b * SK + (i + 1) * K + rr)[:, None], old)
            tl.store(anc_ptr + (fb + rr)[:, None] * BLOCK_A + ra[None, :], new, mask=rmask[:, None] & (ra <= i + 1)[None, :])
            tl.store(fr_score_ptr + fb + rr, nscore, mask=rmask)
            tl.store(fr_tok_ptr + fb + rr, ntok, mask=rmask)
            tl.store(fr_src_ptr + fb + rr, fb + prow, mask=rmask)
            tl.store(fr_pick_ptr + fb + rr, npick.to(tl.int64), mask=rmask)
        tl.debug_barrier()


@triton.jit
def _ph_select_step(pid, nprog, is_ctx, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr,
                    fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V,
                    HAS_D2T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_A: tl.constexpr, DT: tl.constexpr,
                    KEY32: tl.constexpr):
    """``_ph_select`` for a schedule step: its context-step form where ``is_ctx``, else its tree-depth form."""
    if is_ctx:
        _ph_select(pid, nprog, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr, fr_tok_ptr,
                   fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V, True, HAS_D2T,
                   BLOCK_K, BLOCK_A, DT, KEY32)
    else:
        _ph_select(pid, nprog, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr, fr_tok_ptr,
                   fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V, False, HAS_D2T,
                   BLOCK_K, BLOCK_A, DT, KEY32)


@triton.jit
def _top_n_mask(v, valid, n):
    """Which of the fp32 values ``v`` (one block; where ``valid``) are among the ``n`` largest, ties
    to the lower index: the set of the n largest ``_key(v, index)``s. A radix select: the
    threshold value's order-preserving 32-bit image is found 4 bits at a time, from the top
    (per digit, a 16-bin count of the values that share the digits found so far), and the values
    equal to it are taken in index order. Eight block-wide counts instead of n rounds of a
    block-wide 64-bit max."""
    b = v.to(tl.int32, bitcast=True)
    b = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)  # signed, ordered as the values (as in _key)
    u = (b ^ -0x80000000).to(tl.uint32, bitcast=True)  # unsigned, the same order
    bins = tl.arange(0, 16)
    need = tl.full([], 0, tl.int32) + n  # values still to take among those matching
    pre = tl.full([], 0, tl.uint32)  # the digits found so far
    for p in range(8):  # a loop, not unrolled: the code stays small (it shares the persistent build)
        pt = tl.full([], 0, tl.int32) + p  # a tensor also under the interpreter (p is an int there)
        d = ((u >> (28 - 4 * pt).to(tl.uint32)) & 15).to(tl.int32)
        top = u >> tl.minimum(32 - 4 * pt, 31).to(tl.uint32)  # the digits above this one (p > 0)
        match = valid & ((pt == 0) | (top == pre))
        cnt = tl.sum((match[:, None] & (d[:, None] == bins[None, :])).to(tl.int32), axis=0)  # [16]
        ge = tl.sum(tl.where(bins[None, :] >= bins[:, None], cnt[None, :], 0), axis=1)  # [16]: digit >= j
        dig = tl.max(tl.where(ge >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > dig, cnt, 0), axis=0)
        pre = (pre << 4) | dig.to(tl.uint32)
    eq = valid & (u == pre)
    take = valid & ((u > pre) | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need)))
    return tl.where(tl.sum(valid.to(tl.int32), axis=0) <= n, valid, take)


@triton.jit
def _final_one(C, T, K, D1, W, cand_score_ptr, cand_tok_ptr, row_par_ptr, root_ptr, cnt_ptr, pf_ptr,
              out_tok_ptr, out_par_ptr, out_score_ptr, out_mask_ptr, out_pos_ptr, out_ret_ptr, out_leaf_ptr,
              BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """One sequence: top-(T-1) of the C candidates (ties to the lower index), in ascending
    candidate order; tokens, scores and parent positions (searchsorted semantics); then the tree
    packed exactly as ``frontier.tree.pack_tree`` packs it (padded layout): tree_mask,
    tree_position_ids, retrieve_indices [T, W] with W = D+2 (leaves ascending, -1 padded), leaf
    count and deepest level. D1 = min(D+1, T-1) is the number of parent-pointer steps."""
    rc = tl.arange(0, BLOCK_C)
    cm = rc < C
    cs = tl.load(cand_score_ptr + rc, mask=cm, other=0.0, cache_modifier=".cg")
    chosen = _top_n_mask(cs, cm, T - 1)
    ch = chosen.to(tl.int32)
    incl = tl.cumsum(ch, axis=0)
    tl.store(cnt_ptr + rc, incl - ch)  # number of chosen candidates below each index
    tl.debug_barrier()
    pos = incl  # 1-based position in draft_tokens of a chosen candidate
    tok = tl.load(cand_tok_ptr + rc, mask=chosen, other=0, cache_modifier=".cg")
    stored = tl.load(row_par_ptr + rc // K, mask=chosen, other=0, cache_modifier=".cg")
    ppos = tl.load(cnt_ptr + tl.maximum(stored - 1, 0), mask=chosen & (stored > 0), other=0, cache_modifier=".cg") + 1
    ppos = tl.where(stored == 0, 0, ppos)
    tl.store(out_tok_ptr + pos, tok, mask=chosen)
    tl.store(out_score_ptr + pos, cs, mask=chosen)
    tl.store(out_par_ptr + pos - 1, ppos.to(tl.int64), mask=chosen)
    root = tl.load(root_ptr, cache_modifier=".cg")
    tl.store(out_tok_ptr, root)
    tl.store(out_score_ptr, 0.0)

    # ---- tree packing ----
    tl.store(pf_ptr + pos, ppos, mask=chosen)  # pf[node] = parent position
    tl.store(pf_ptr + rc, tl.zeros([BLOCK_C], tl.int32), mask=rc == 0)  # the root is its own parent
    tl.debug_barrier()
    rt = tl.arange(0, BLOCK_T)
    tm = rt < T
    both = tm[:, None] & tm[None, :]
    anc = (rt[:, None] == rt[None, :]) & both
    pf = tl.load(pf_ptr + rt, mask=tm, other=-1)
    up = tl.where(tm, pf, 0)  # (every parent position is below T)
    cur = rt
    for _s in range(D1):  # one parent-pointer step per tree level, in registers
        cur = tl.gather(up, cur, 0)
        anc = anc | ((rt[None, :] == cur[:, None]) & both)
    posid = tl.sum(anc.to(tl.int32), axis=1) - 1
    is_par = tl.max(((pf[None, :] == rt[:, None]) & (rt[None, :] >= 1) & both).to(tl.int32), axis=1)
    lf = tl.where(tm & (is_par == 0), 1, 0)
    rank = tl.cumsum(lf, axis=0) - 1
    tl.store(out_mask_ptr + rt[:, None] * T + rt[None, :], anc.to(tl.float32), mask=both)
    tl.store(out_pos_ptr + rt, posid.to(tl.int64), mask=tm)
    rw = tl.arange(0, BLOCK_W)
    tl.store(out_ret_ptr + rt[:, None] * W + rw[None, :], tl.full([BLOCK_T, BLOCK_W], -1, tl.int64),
             mask=tm[:, None] & (rw < W)[None, :])
    tl.debug_barrier()
    path = anc & (lf == 1)[:, None]  # leaf i's path: its ancestor columns j at depth posid[j]
    vals = tl.zeros([BLOCK_T, BLOCK_T], tl.int64) + rt[None, :].to(tl.int64)
    tl.store(out_ret_ptr + rank[:, None] * W + posid[None, :], vals, mask=path)
    tl.store(out_leaf_ptr, tl.sum(lf, axis=0).to(tl.int64))
    tl.store(out_leaf_ptr + 1, tl.max(tl.where(tm, posid, 0), axis=0).to(tl.int64))


@triton.jit
def _ph_final(pid, nprog, B, C, T, K, D1, W, RPW, PFW, cand_score_ptr, cand_tok_ptr, row_par_ptr, root_ptr, cnt_ptr,
              pf_ptr, out_tok_ptr, out_par_ptr, out_score_ptr, out_mask_ptr, out_pos_ptr, out_ret_ptr, out_leaf_ptr,
              BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """One program per sequence: its final selection and tree packing (``_final_one``) on its
    own slices of the candidate arrays, scratch and outputs."""
    for b in range(pid, B, nprog):
        _final_one(C, T, K, D1, W, cand_score_ptr + b * C, cand_tok_ptr + b * C, row_par_ptr + b * RPW, root_ptr + b,
                   cnt_ptr + b * BLOCK_C, pf_ptr + b * PFW, out_tok_ptr + b * T, out_par_ptr + b * (T - 1),
                   out_score_ptr + b * T, out_mask_ptr + b * T * T, out_pos_ptr + b * T, out_ret_ptr + b * T * W,
                   out_leaf_ptr + b * 2, BLOCK_C, BLOCK_T, BLOCK_W)
        tl.debug_barrier()
