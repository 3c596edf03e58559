"""The lm_head stream with the log-softmax statistics and the top-K of every row, and MERGE,
which combines the per-program partial statistics (or, in wide launches, ranks each row from a
logits scratch) into each row's K best log-probabilities.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import KEY32_NONE, KEY_NONE
from .numerics import _best_k, _key, _key_idx, _key_val, _keys16, _rank_rounds, _wide_key
from .stream import (
    SWAP_ROWS, _acc_init, _acc_rows, _acc_scaled, _row_scale, _row_tiles, _slab_base, _slab_rows, _stream_tile, _w_chunk,
    _w_dot, _x_operand,
)


@triton.jit
def _top_rounds16(keys, col, K, base, DT: tl.constexpr):
    """K rounds of row maxima over 32-bit keys [rows, n] (``_keys16``): [rows, KP] (KP = the
    columns ``col`` [1, KP] counts) whose column j is the j-th best as a ``_key`` of (value as
    fp32, base + slab-local index), KEY_NONE from column K on and where a row has fewer than
    j+1 valid keys. The rounds keep the 32-bit picks; they are widened once, after the last."""
    top = tl.full([keys.shape[0], col.shape[1]], KEY32_NONE, tl.int32)
    for j in range(K):
        best = tl.max(keys, axis=1)
        top = tl.where(col == j, best[:, None], top)
        keys = tl.where(keys == best[:, None], KEY32_NONE, keys)
    return _wide_key(top, DT, base)


@triton.jit
def _lm_keys(acc, rr, rmask, rm, M, DT: tl.constexpr, KEY16: tl.constexpr = False, base=0):
    """Logits of one accumulator block [rows, BM] -> ([BM, rows] keys, row max, valid logits).
    The keys are ``_key``s of (logit, row rr), or with KEY16 32-bit ``_keys16`` of (logit, rr -
    base)."""
    if KEY16:
        lt = tl.trans(acc.to(DT))  # [BM, rows]
        logit = lt.to(tl.float32)
    else:
        logit = tl.trans(acc.to(DT).to(tl.float32))  # [BM, rows]
    valid = rmask[None, :] & (rm < M)[:, None]
    logit = tl.where(valid, logit, float("-inf"))
    if KEY16:
        keys = _keys16(lt, rr[None, :] - base, valid)
    else:
        keys = tl.where(valid, _key(logit, rr[None, :]), KEY_NONE)
    return keys, tl.max(logit, axis=1), logit


@triton.jit
def _ph_lmhead(pid, nprog, x_ptr, M, w_ptr, V, Kd, keys_ptr, max_ptr, sum_ptr, RP, MR, K,
               BM: tl.constexpr, KP: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
               ONE_SUB: tl.constexpr, ST: tl.constexpr, KEY16: tl.constexpr = False,
               PACK: tl.constexpr = False, s_ptr=0, W8: tl.constexpr = 0):
    """lm_head over one slab of RP vocabulary rows per program, then in registers: per
    activation row the slab's max and sum of exp (for the log-softmax) and its top-K logits as
    ranking keys. Each program writes only that partial (keys [MR, KP] with entries K..KP-1
    empty, max [MR], sum [MR]) to its slot: the [rows, V] logits never reach memory. The slab is
    walked in sub-slabs of BNS rows (one at batch 1), each against tiles of BM activation rows; a
    later sub-slab's results are merged into the program's partial (running max / rescaled sum /
    top-K), which only this program touches; ONE_SUB (the slab is one sub-slab, as at batch 1)
    compiles that merge out. KEY16 (16-bit dtypes; with ONE_SUB): the K rounds rank 32-bit keys (``_keys16``, as in
    ``_lm_slab_stats``). PACK: the
    lm_head is packed per slab (``_slab_base``). W8 / s_ptr: its weight format and row scales
    (``stream``'s module docstring)."""
    DT = x_ptr.dtype.element_ty
    K16: tl.constexpr = KEY16 and ONE_SUB
    SWAP: tl.constexpr = W8 % 16 >= 8 and BM <= SWAP_ROWS  # (``stream._w_dot``)
    rbm = tl.arange(0, BM)
    rp = tl.arange(0, BNS)
    rk = tl.arange(0, BK)
    col = tl.arange(0, KP)[None, :]
    kslot = keys_ptr + pid * MR * KP
    mslot = max_ptr + pid * MR
    sslot = sum_ptr + pid * MR
    for s0 in range(0, RP, BNS):
        rr1 = pid * RP + s0 + rp
        m1 = (s0 + rp < RP) & (rr1 < V)
        w1row, kstep = _slab_base(w_ptr, pid, RP, Kd, s0 + rp, PACK, BK)
        sc1 = _row_scale(s_ptr, rr1, m1, W8)
        for m0 in range(0, M, BM):
            rm = m0 + rbm
            acc1 = _acc_init(BNS, BM, SWAP)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                kk = k0 + rk
                w1 = _w_chunk(w1row, k0, kstep, m1, Kd, sc1, DT, W8, BK, SWAP)
                acc1 = _w_dot(acc1, w1, _x_operand(x_ptr, Kd, rm, kk, M, Kd, SWAP), IEEE, SWAP)
            key1, tmax, logit1 = _lm_keys(_acc_scaled(_acc_rows(acc1, SWAP), sc1, W8), rr1, m1, rm, M, DT, K16,
                                          pid * RP)
            safe = tl.where(tmax == float("-inf"), 0.0, tmax)
            tsum = tl.sum(tl.exp(logit1 - safe[:, None]), axis=1)
            rmask = rm < MR
            top = tl.full([BM, KP], KEY_NONE, tl.int64)  # entries from K on stay empty
            if ONE_SUB:  # the slab is one sub-slab: no partial so far to merge with
                nmax = tmax
                nsum = tsum
                old = top
            else:  # the partial so far (nothing before the first sub-slab)
                old = tl.load(kslot + rm[:, None] * KP + col, mask=rmask[:, None] & (s0 > 0), other=KEY_NONE)
                omax = tl.load(mslot + rm, mask=rmask & (s0 > 0), other=float("-inf"))
                osum = tl.load(sslot + rm, mask=rmask & (s0 > 0), other=0.0)
                nmax = tl.maximum(omax, tmax)
                nsafe = tl.where(nmax == float("-inf"), 0.0, nmax)
                nsum = tl.where(omax == float("-inf"), 0.0, osum * tl.exp(omax - nsafe)) + \
                    tl.where(tmax == float("-inf"), 0.0, tsum * tl.exp(tmax - nsafe))
            if K16:
                top = _top_rounds16(key1, col, K, pid * RP, DT)
            else:
                for j in range(K):  # K rounds of the row max: the (running) top-K, ranked
                    best = tl.max(key1, axis=1)
                    if not ONE_SUB:
                        best = tl.maximum(best, tl.max(old, axis=1))
                    top = tl.where(col == j, best[:, None], top)
                    key1 = tl.where(key1 == best[:, None], KEY_NONE, key1)
                    if not ONE_SUB:
                        old = tl.where(old == best[:, None], KEY_NONE, old)
            tl.debug_barrier()
            tl.store(kslot + rm[:, None] * KP + col, top, mask=rmask[:, None])
            tl.store(mslot + rm, nmax, mask=rmask)
            tl.store(sslot + rm, nsum, mask=rmask)
            tl.debug_barrier()


@triton.jit
def _ph_lmhead_wide(pid, nprog, x_ptr, M, w_ptr, V, Kd, logit_ptr, keys_ptr, max_ptr, sum_ptr, RP, MR, K,
                    BM: tl.constexpr, KP: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                    BMK: tl.constexpr, BNP: tl.constexpr, BM2: tl.constexpr, ST: tl.constexpr,
                    KEY16: tl.constexpr = False, stats=True, s_ptr=0, W8: tl.constexpr = 0):
    """lm_head for many activation rows (batches): the same per-program partials as
    ``_ph_lmhead``, but the slab's logits (rounded to the compute dtype, as the reference
    rounds them) go to a scratch ``[MR, V]`` first and the statistics are taken from there in
    tiles of BMK rows x the whole slab. The GEMM can then use wide accumulators (few x re-reads)
    without also holding a 64-bit key per logit in registers. Only this program reads back what
    it wrote (the block barrier orders it), and the scratch rows stay in L2. ``stats`` false
    (MG_ROWS, tree depths): the logits only; MERGE takes the statistics per row
    (``_ph_merge_rows``). W8 / s_ptr: the weight format and row scales."""
    DT = x_ptr.dtype.element_ty
    for s0 in range(0, RP, BNS):
        rr, rmask, wrow = _slab_rows(pid, RP, s0, V, 0, Kd, w_ptr, w_ptr, w_ptr, False, BNS, 1)
        for m0 in range(0, M, BM + BM2):
            rm, rm2 = _row_tiles(m0, BM, BM2)
            acc, acc2 = _stream_tile(wrow, rmask, x_ptr, Kd, rm, rm2, M, 0, Kd, BNS, BM, BK, IEEE, BM2, ST,
                                     _row_scale(s_ptr, rr, rmask, W8), W8)
            tl.store(logit_ptr + rm[None, :] * V + rr[:, None], acc.to(DT), mask=rmask[:, None] & (rm[None, :] < M))
            if BM2 > 0:
                tl.store(logit_ptr + rm2[None, :] * V + rr[:, None], acc2.to(DT),
                         mask=rmask[:, None] & (rm2[None, :] < M))
    if stats:
        tl.debug_barrier()
        _lm_slab_stats(pid, logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, MR, K, KP, BMK, BNP, DT, KEY16)


@triton.jit
def _lm_slab_stats(pid, logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, MR, K,
                   KP: tl.constexpr, BMK: tl.constexpr, BNP: tl.constexpr, DT: tl.constexpr, KEY16: tl.constexpr):
    """The wide lm_head's statistics from its logits scratch: per activation row, the program's
    slab max, sum of exp and top-K keys (``_key`` of (logit, vocabulary index)), in tiles of BMK
    rows x the whole slab. KEY16 (16-bit compute dtypes): the K rounds of row maxima rank 32-bit
    keys (the logit's 16 bits, order-preserving, above 16 bits of 0xFFFF - slab column) instead of
    64-bit ones - the same order, since a 16-bit logit widened to fp32 orders like its own bits -
    and only the K winners are widened to ``_key`` form."""
    rc = tl.arange(0, BNP)
    cols = pid * RP + rc
    cm = (rc < RP) & (cols < V)
    col = tl.arange(0, KP)[None, :]
    for m0 in range(0, M, BMK):
        rm = m0 + tl.arange(0, BMK)
        valid = (rm < M)[:, None] & cm[None, :]
        raw = tl.load(logit_ptr + rm[:, None] * V + cols[None, :], mask=valid, other=float("-inf"))
        logit = raw.to(tl.float32)
        rmax = tl.max(logit, axis=1)
        safe = tl.where(rmax == float("-inf"), 0.0, rmax)
        rsum = tl.sum(tl.exp(logit - safe[:, None]), axis=1)
        top = tl.full([BMK, KP], KEY_NONE, tl.int64)
        if KEY16:  # entries from K on stay empty
            top = _top_rounds16(_keys16(raw, rc[None, :], valid), col, K, pid * RP, DT)
        else:
            keys = tl.where(valid, _key(logit, cols[None, :]), KEY_NONE)
            for j in range(K):  # entries from K on stay empty
                best = tl.max(keys, axis=1)
                top = tl.where(col == j, best[:, None], top)
                keys = tl.where(keys == best[:, None], KEY_NONE, keys)
        rows_ok = rm < MR
        tl.store(keys_ptr + pid * MR * KP + rm[:, None] * KP + col, top, mask=rows_ok[:, None])
        tl.store(max_ptr + pid * MR + rm, rmax, mask=rows_ok)
        tl.store(sum_ptr + pid * MR + rm, rsum, mask=rows_ok)


@triton.jit
def _lp_keys(row, idx, V, gmax, logs, DT: tl.constexpr, KEY32: tl.constexpr):
    """Ranking keys of the log-probs at vocabulary indices ``idx`` (any shape) of one logits row:
    ``((logit - max) - log(sum of exp))`` rounded to DT, then 32-bit ``_keys16`` (KEY32) or
    64-bit ``_key``s; KEY32_NONE / KEY_NONE at and past V."""
    valid = idx < V
    x = tl.load(row + idx, mask=valid, other=float("-inf"))
    lp = ((x.to(tl.float32) - gmax) - logs).to(DT)
    if KEY32:
        keys = _keys16(lp, idx, valid)
    else:
        keys = tl.where(valid, _key(lp.to(tl.float32), idx), KEY_NONE)
    return keys


@triton.jit
def _ph_merge_rows(pid, nprog, R, logit_ptr, V, sel_lp_ptr, sel_tok_ptr, K,
                   KP: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, KEY32: tl.constexpr, G: tl.constexpr = 8):
    """MERGE from the wide lm_head's logits scratch (MG_ROWS): each row's
    statistics over its whole vocabulary, one program per row, in chunks of BV logits - the
    max, the sum of exp, and then the top-K of every logit's log-prob rounded to the compute
    dtype, by (log-prob, lower index): the reference's ``topk(log_softmax(logits))``, ranked on
    all V entries rather than on the union of per-slab top lists by logit. The lm_head
    programs then write their logits only and leave the statistics (a chain of dependent block
    reductions that idles the weight stream) to this phase, which spreads them over the rows
    instead of over the slabs.
    The K rounds of maxima run on groups first: a chunk is read as [BV/G, G] (G adjacent
    entries, which one thread holds), each group ranked by its best key, and the K best groups
    are kept across chunks. They hold the row's top K (an entry outside them ranks below K
    group bests, so below K entries), and the last K rounds rank just their K*G entries. KEY32
    (16-bit dtypes, V <= 65536): the rounds rank 32-bit keys (``_keys16``), 64-bit ``_key``s
    otherwise."""
    rv = tl.arange(0, BV)
    rk = tl.arange(0, KP)
    rg = tl.arange(0, BV // G)[:, None] * G + tl.arange(0, G)[None, :]  # [BV/G, G]
    rkg = rk[:, None] * 0 + tl.arange(0, G)[None, :]  # [KP, G]
    for r in range(pid, R, nprog):
        row = logit_ptr + r * V
        mx = tl.full([BV], float("-inf"), tl.float32)
        for v0 in range(0, V, BV):  # the row max (lane-wise over the chunks, then one reduction)
            x = tl.load(row + v0 + rv, mask=v0 + rv < V, other=float("-inf"))
            mx = tl.maximum(mx, x.to(tl.float32))
        gmax = tl.max(mx, axis=0)
        sm = tl.zeros([BV], dtype=tl.float32)
        for v0 in range(0, V, BV):
            x = tl.load(row + v0 + rv, mask=v0 + rv < V, other=float("-inf"))
            sm += tl.exp(x.to(tl.float32) - gmax)
        logs = tl.log(tl.sum(sm, axis=0))
        if KEY32:
            gtop = tl.full([KP], KEY32_NONE, tl.int32)
        else:
            gtop = tl.full([KP], KEY_NONE, tl.int64)
        for v0 in range(0, V, BV):  # the K best groups (a later chunk's rounds also take the list so far)
            gbest = tl.max(_lp_keys(row, v0 + rg, V, gmax, logs, DT, KEY32), axis=1)  # [BV/G]
            if v0 == 0:  # (no list so far: the first chunk skips its reduction in each round)
                gtop = _rank_rounds(gbest, gtop, rk, K, False)
            else:
                gtop = _rank_rounds(gbest, gtop, rk, K, True)
        # the entries of those groups (none where fewer than K groups exist), ranked
        if KEY32:
            g0 = ((0xFFFF - (gtop & 0xFFFF)) // G) * G
            cand = tl.where((gtop != KEY32_NONE)[:, None], g0[:, None] + rkg, V)
        else:
            g0 = (_key_idx(gtop) // G) * G
            cand = tl.where((gtop != KEY_NONE)[:, None], g0[:, None] + rkg, V)
        keys = tl.reshape(_lp_keys(row, cand, V, gmax, logs, DT, KEY32), [KP * G])
        wide = _best_k(keys, rk, K, DT)  # (widened to 64-bit keys, as _ph_merge's KEY32 form stores them)
        tl.store(sel_lp_ptr + r * KP + rk, _key_val(wide), mask=rk < K)
        tl.store(sel_tok_ptr + r * KP + rk, _key_idx(wide), mask=rk < K)


@triton.jit
def _ph_merge(pid, nprog, R, P, keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR,
              KP: tl.constexpr, BLOCK_P: tl.constexpr, DT: tl.constexpr, KEY32: tl.constexpr = False):
    """Per row: log-sum-exp from the P partials, log-probs of the partial top lists rounded to
    the compute dtype, and the row's top-K by (log-prob, lower index). KEY32 (16-bit dtypes,
    vocabularies up to 65536): the K rounds of maxima rank 32-bit keys - the rounded log-prob's
    16 bits, order-preserving, above 16 bits of 0xFFFF - index (``_keys16``) - in the same
    order as the 64-bit ``_key``s, at half the width of every comparison and shuffle."""
    for r in range(pid, R, nprog):
        _merge_row(r, P, keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR, KP, BLOCK_P, DT, KEY32)


@triton.jit
def _merge_row(r, P, keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR,
               KP: tl.constexpr, BLOCK_P: tl.constexpr, DT: tl.constexpr, KEY32: tl.constexpr):
    """``_ph_merge`` for row r. The partials' top lists are loaded as one flat list (entry
    p * KP + rank), so that each of the K rounds takes its maximum in one reduction (a
    [BLOCK_P, KP] block takes two); the K picks are decoded and stored after the last round, two vector stores."""
    rp = tl.arange(0, BLOCK_P)
    pm = rp < P
    pmax = tl.load(max_ptr + rp * MR + r, mask=pm, other=float("-inf"), cache_modifier=".cg")
    psum = tl.load(sum_ptr + rp * MR + r, mask=pm, other=0.0, cache_modifier=".cg")
    gmax = tl.max(pmax, axis=0)
    scale = tl.where(pmax == float("-inf"), 0.0, tl.exp(pmax - gmax))
    logs = tl.log(tl.sum(psum * scale, axis=0))
    e = tl.arange(0, BLOCK_P * KP)  # entry e: rank e % KP of partial e // KP
    ks = tl.load(keys_ptr + (e // KP) * MR * KP + r * KP + e % KP, mask=e // KP < P, other=KEY_NONE, cache_modifier=".cg")
    lp = ((_key_val(ks) - gmax) - logs).to(DT)
    if KEY32:
        k2 = _keys16(lp, _key_idx(ks).to(tl.int32), ks != KEY_NONE)
    else:
        k2 = tl.where(ks == KEY_NONE, KEY_NONE, _key(lp.to(tl.float32), _key_idx(ks)))
    rk = tl.arange(0, KP)
    # (KEY32: no candidate left, which a vocabulary of >= K entries never leaves, stores what the
    # 64-bit ranking stores then)
    top = _best_k(k2, rk, K, DT)
    tl.store(sel_lp_ptr + r * KP + rk, _key_val(top), mask=rk < K)
    tl.store(sel_tok_ptr + r * KP + rk, _key_idx(top), mask=rk < K)
