"""Tree attention: each query row attends to its sequence's cache (context) and to its own
ancestors in the tree. Small batches split the context into chunks and combine per-part
maxima and sums (three phases); big batches run one fused phase per (sequence, KV head).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import _seq_cache
from .numerics import _div_rn_by, _mma, _recip_rn

SUM_GROUP = tl.constexpr(8)  # attention partials summed per group of loads in flight


@triton.jit
def _ctx_scores(q, ck_ptr, g, c_head_stride, j0, nctx, sqrt_d, HD, DT: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                TREE: tl.constexpr = False, slot0=0, anc_b=0, r_of=0, qmask=0, anc_stride=0, R=1):
    """Scores [BLOCK_Q, BLOCK_N] of every query against context keys j0..j0+BLOCK_N-1, rounded
    like the reference: ``round(round(q @ k^T) / sqrt(d))``. TREE: the keys are instead the
    sequence's tree keys j (slot slot0 + j of the tree scratch: depth j // R, row j % R), and a
    score is kept only where key j is the query row's ancestor (or itself) at that depth, as the
    ancestor table says - the tree mask, for all depths in one block."""
    rj = j0 + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    k = tl.load(ck_ptr + g * c_head_stride + (slot0 + rj)[None, :] * HD + rd[:, None],
                mask=(rd[:, None] < HD) & (rj[None, :] < nctx), other=0.0, cache_modifier=".cg")
    if IEEE:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    s = _div_rn_by(s.to(DT).to(tl.float32), sqrt_d, _recip_rn(sqrt_d)).to(DT).to(tl.float32)
    keep = (rj < nctx)[None, :]
    if TREE:
        anc = tl.load(anc_b + r_of[:, None] * anc_stride + (rj // R)[None, :], mask=qmask[:, None] & keep, other=-1,
                      cache_modifier=".cg")
        keep = keep & (anc == (slot0 + rj)[None, :])
    return tl.where(keep, s, float("-inf")), rj


@triton.jit
def _tree_scores(q, tk_ptr, anc_ptr, g, t_head_stride, r_of, qmask, anc_stride, a, sqrt_d, HD,
                 DT: tl.constexpr, BLOCK_D: tl.constexpr):
    """Score [BLOCK_Q] of each query against its row's a-th ancestor slot (gathered keys)."""
    rd = tl.arange(0, BLOCK_D)
    slot = tl.load(anc_ptr + r_of * anc_stride + a, mask=qmask, other=0, cache_modifier=".cg")
    kt = tl.load(tk_ptr + g * t_head_stride + slot[:, None] * HD + rd[None, :],
                 mask=qmask[:, None] & (rd[None, :] < HD), other=0.0, cache_modifier=".cg")
    sa = tl.sum(q.to(tl.float32) * kt.to(tl.float32), axis=1)
    sa = _div_rn_by(sa.to(DT).to(tl.float32), sqrt_d, _recip_rn(sqrt_d)).to(DT).to(tl.float32)
    return sa, slot


@triton.jit
def _ctx_stats(q, m_i, l_i, ck_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
               TREE: tl.constexpr = False, slot0=0, anc_b=0, r_of=0, qmask=0, anc_stride=0, R=1):
    """Running max / sum of exp of the scores against context keys [j_lo, j_hi) (TREE: the
    sequence's tree keys, masked to each row's ancestors; see ``_ctx_scores``)."""
    for j0 in tl.range(j_lo, j_hi, BLOCK_N, num_stages=1 if TREE else None):  # (a block or two of tree keys)
        s, rj = _ctx_scores(q, ck_ptr, g, c_head_stride, j0, j_hi, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE,
                            TREE, slot0, anc_b, r_of, qmask, anc_stride, R)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp(m_i - safe) + tl.sum(tl.exp(s - safe[:, None]), axis=1)
        m_i = m_new
    return m_i, l_i


@triton.jit
def _tree_stats(q, m_i, l_i, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc, sqrt_d, HD,
                DT: tl.constexpr, BLOCK_D: tl.constexpr):
    """Running max / sum of exp over each row's n_anc ancestor slots."""
    for a in range(n_anc):
        sa, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, a, sqrt_d, HD, DT, BLOCK_D)
        m_new = tl.maximum(m_i, sa)
        l_i = l_i * tl.exp(m_i - m_new) + tl.exp(sa - m_new)
        m_i = m_new
    return m_i, l_i


@triton.jit
def _ctx_pv(acc, q, m_i, l_i, ck_ptr, cv_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
            TREE: tl.constexpr = False, slot0=0, anc_b=0, r_of=0, qmask=0, anc_stride=0, R=1):
    """acc += P V over context keys [j_lo, j_hi), P = round_dtype(exp(s - m) / l) with the
    row's final max m and sum l (the reference casts softmax's output before ``@ V``). TREE: over
    the sequence's tree keys instead, masked to each row's ancestors (``_ctx_scores``)."""
    rd = tl.arange(0, BLOCK_D)
    inv_l = _recip_rn(l_i)
    for j0 in tl.range(j_lo, j_hi, BLOCK_N, num_stages=1 if TREE else None):  # (a block or two of tree keys)
        s, rj = _ctx_scores(q, ck_ptr, g, c_head_stride, j0, j_hi, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE,
                            TREE, slot0, anc_b, r_of, qmask, anc_stride, R)
        p = _div_rn_by(tl.exp(s - m_i[:, None]), l_i[:, None], inv_l[:, None]).to(DT)
        v = tl.load(cv_ptr + g * c_head_stride + (slot0 + rj)[:, None] * HD + rd[None, :],
                    mask=(rj < j_hi)[:, None] & (rd < HD)[None, :], other=0.0, cache_modifier=".cg")
        acc = _mma(p, v, acc, IEEE)
    return acc


@triton.jit
def _tree_pv(acc, q, m_i, l_i, tk_ptr, tv_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc, sqrt_d,
             HD, DT: tl.constexpr, BLOCK_D: tl.constexpr):
    """acc += P V over each row's ancestor slots (gathered keys and values)."""
    rd = tl.arange(0, BLOCK_D)
    inv_l = _recip_rn(l_i)
    for a in range(n_anc):
        sa, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, a, sqrt_d, HD, DT, BLOCK_D)
        pa = _div_rn_by(tl.exp(sa - m_i), l_i, inv_l).to(DT).to(tl.float32)
        vt = tl.load(tv_ptr + g * t_head_stride + slot[:, None] * HD + rd[None, :],
                     mask=qmask[:, None] & (rd < HD)[None, :], other=0.0, cache_modifier=".cg").to(tl.float32)
        acc += pa[:, None] * vt
    return acc


@triton.jit
def _attn_item(b, g, R, meta_ptr, qr_ptr, kv_ptr, anc_ptr, anc_stride, NH, NKV, HD,
               BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, VEC: tl.constexpr):
    """One attention item's inputs: sequence b's context (``_seq_cache``), its rows' ancestor
    slots, and the BLOCK_Q queries of KV head g (query lane = row * G + head within the group, G
    = NH / NKV; lanes past R rows are masked) with their element offsets in qr (and ao)."""
    G = NH // NKV
    rq = tl.arange(0, BLOCK_Q)
    r_of = rq // G
    hl = rq - r_of * G
    qmask = r_of < R
    rd = tl.arange(0, BLOCK_D)
    nctx, c_head_stride, ck_ptr, cv_ptr = _seq_cache(meta_ptr, b, kv_ptr, HD, VEC)
    anc_b = anc_ptr + b * R * anc_stride
    qoff = (b * R + r_of) * NH * HD + (g * G + hl) * HD
    q = tl.load(qr_ptr + qoff[:, None] + rd[None, :], mask=qmask[:, None] & (rd < HD)[None, :], other=0.0,
                cache_modifier=".cg")
    return nctx, c_head_stride, ck_ptr, cv_ptr, anc_b, qoff, q, r_of, qmask


@triton.jit
def _ph_attn_part(pid, nprog, B, R, meta_ptr, qr_ptr, kv_ptr,
                  tk_ptr, tv_ptr, t_head_stride, anc_ptr, anc_stride, n_anc, NH, NKV, HD, sqrt_d,
                  pm_ptr, pl_ptr, pacc_ptr, NCH,
                  PASS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_CH: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr = 1):
    """Single-query attention of R rows per sequence (B sequences), split over the grid
    (flash-decoding with the reference's rounding). Work items: (sequence b, KV head g, part c)
    with NCH + n_anc parts: parts 0..NCH-1 = contiguous chunks of sequence b's context keys (its
    cache rows [0, c_b + n_b): the context step wrote the new rows before attention), part
    NCH + a = each row's a-th ancestor slot in the tree scratch (one gathered key per row: the
    tree mask is implicit, and a deep tree adds items instead of lengthening one). An item holds
    every (row, head) query of its sequence's KV group, so each K/V byte is read once for all of
    that sequence's rows.
    PASS 1: per-part max and sum of exp. PASS 2: global max/sum from all parts, probabilities
    rounded to the compute dtype (as the reference casts softmax's output) times V, per part."""
    DT = qr_ptr.dtype.element_ty
    rq = tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    dm = rd < HD
    parts = NCH + n_anc
    for t in range(pid, B * NKV * parts, nprog):
        bg = t // parts
        c = t - bg * parts
        b = bg // NKV
        g = bg - b * NKV
        nctx, c_head_stride, ck_ptr, cv_ptr, anc_b, qoff, q, r_of, qmask = _attn_item(
            b, g, R, meta_ptr, qr_ptr, kv_ptr, anc_ptr, anc_stride, NH, NKV, HD, BLOCK_Q, BLOCK_D, VEC)
        chunk = tl.cdiv(nctx, NCH)
        base = (bg * parts + c) * BLOCK_Q
        j_lo = c * chunk
        j_hi = tl.minimum(nctx, j_lo + chunk)
        if PASS == 1:
            if c < NCH:
                m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
                l_i = tl.zeros([BLOCK_Q], tl.float32)
                m_i, l_i = _ctx_stats(q, m_i, l_i, ck_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT, BLOCK_N,
                                      BLOCK_D, IEEE)
            else:  # one key per row: max = its score, sum of exp = 1
                m_i, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, c - NCH, sqrt_d,
                                         HD, DT, BLOCK_D)
                l_i = tl.full([BLOCK_Q], 1.0, tl.float32)
            tl.store(pm_ptr + base + rq, m_i)
            tl.store(pl_ptr + base + rq, l_i)
        else:
            rc = tl.arange(0, BLOCK_CH)
            pidx = (bg * parts + rc[:, None]) * BLOCK_Q + rq[None, :]
            cm = (rc < parts)[:, None]
            pms = tl.load(pm_ptr + pidx, mask=cm, other=float("-inf"), cache_modifier=".cg")
            pls = tl.load(pl_ptr + pidx, mask=cm, other=0.0, cache_modifier=".cg")
            m_i = tl.max(pms, axis=0)
            l_i = tl.sum(tl.where(pms == float("-inf"), 0.0, pls * tl.exp(pms - m_i[None, :])), axis=0)
            if c < NCH:
                acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
                acc = _ctx_pv(acc, q, m_i, l_i, ck_ptr, cv_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT, BLOCK_N,
                              BLOCK_D, IEEE)
            else:
                sa, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, c - NCH, sqrt_d,
                                        HD, DT, BLOCK_D)
                pa = _div_rn_by(tl.exp(sa - m_i), l_i, _recip_rn(l_i)).to(DT).to(tl.float32)
                vt = tl.load(tv_ptr + g * t_head_stride + slot[:, None] * HD + rd[None, :],
                             mask=qmask[:, None] & dm[None, :], other=0.0, cache_modifier=".cg").to(tl.float32)
                acc = pa[:, None] * vt
            tl.store(pacc_ptr + (base + rq)[:, None] * BLOCK_D + rd[None, :], acc)


@triton.jit
def _ph_attn_fused(pid, nprog, B, R, meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr, t_head_stride, anc_ptr, anc_stride,
                   SK, n_anc, NH, NKV, HD, sqrt_d, ao_ptr,
                   BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                   VEC: tl.constexpr = 1, TREE_BLOCKS: tl.constexpr = True):
    """Attention in one phase (big batches, where B*NKV items already fill the grid): item
    (sequence b, KV head g) walks its whole context twice - max and sum of exp, then the
    probabilities rounded to the compute dtype times V - and after it, the same way, its rows'
    ancestors; it writes the attention output rows itself (no partials, no extra barriers).
    TREE_BLOCKS: the ancestors as the sequence's tree keys of depths 0..n_anc-1 (slots b*SK..,
    the R rows of each depth) in dense blocks masked to each row's ancestors (two blocks' dots
    per pass at the 8B preset); otherwise one gathered key per row and depth (n_anc dependent
    steps per pass). The launcher picks per launch mode (blocks in step launches, gathers in the persistent one)."""
    DT = qr_ptr.dtype.element_ty
    rd = tl.arange(0, BLOCK_D)
    dm = rd < HD
    for bg in range(pid, B * NKV, nprog):
        b = bg // NKV
        g = bg - b * NKV
        nctx, c_head_stride, ck_ptr, cv_ptr, anc_b, qoff, q, r_of, qmask = _attn_item(
            b, g, R, meta_ptr, qr_ptr, kv_ptr, anc_ptr, anc_stride, NH, NKV, HD, BLOCK_Q, BLOCK_D, VEC)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        nt = n_anc * R  # the tree keys of depths 0..n_anc-1
        m_i, l_i = _ctx_stats(q, m_i, l_i, ck_ptr, g, c_head_stride, 0, nctx, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE)
        if TREE_BLOCKS:
            m_i, l_i = _ctx_stats(q, m_i, l_i, tk_ptr, g, t_head_stride, 0, nt, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE,
                                  True, b * SK, anc_b, r_of, qmask, anc_stride, R)
        else:
            m_i, l_i = _tree_stats(q, m_i, l_i, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc,
                                   sqrt_d, HD, DT, BLOCK_D)
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        acc = _ctx_pv(acc, q, m_i, l_i, ck_ptr, cv_ptr, g, c_head_stride, 0, nctx, sqrt_d, HD, DT, BLOCK_N, BLOCK_D,
                      IEEE)
        if TREE_BLOCKS:
            acc = _ctx_pv(acc, q, m_i, l_i, tk_ptr, tv_ptr, g, t_head_stride, 0, nt, sqrt_d, HD, DT, BLOCK_N, BLOCK_D,
                          IEEE, True, b * SK, anc_b, r_of, qmask, anc_stride, R)
        else:
            acc = _tree_pv(acc, q, m_i, l_i, tk_ptr, tv_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc,
                           sqrt_d, HD, DT, BLOCK_D)
        tl.store(ao_ptr + qoff[:, None] + rd[None, :], acc.to(DT), mask=qmask[:, None] & dm[None, :])


@triton.jit
def _ph_attn_sum(pid, nprog, B, R, ao_ptr, pacc_ptr, NH, NKV, HD, NCH, n_anc,
                 BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, SUB_Q: tl.constexpr):
    """Attention output: the sum over parts of the per-part P@V (fp32), in part order, rounded to
    the dtype. The parts are read SUM_GROUP at a time (a masked part adds +0, which leaves the
    sum's bits as they are), so that their loads are in flight together rather than one L2
    round trip per part."""
    DT = ao_ptr.dtype.element_ty
    G = NH // NKV
    parts = NCH + n_anc
    nsub = BLOCK_Q // SUB_Q
    rs = tl.arange(0, SUB_Q)
    rd = tl.arange(0, BLOCK_D)
    for t in range(pid, B * NKV * nsub, nprog):
        bg = t // nsub
        b = bg // NKV
        g = bg - b * NKV
        rq = (t - bg * nsub) * SUB_Q + rs
        r_of = rq // G
        hl = rq - r_of * G
        acc = tl.zeros([SUB_Q, BLOCK_D], tl.float32)  # (+0: never -0, so adding +0 changes nothing)
        for c0 in range(0, parts, SUM_GROUP):
            for u in tl.static_range(SUM_GROUP):
                c = c0 + u
                acc += tl.load(pacc_ptr + ((bg * parts + c) * BLOCK_Q + rq)[:, None] * BLOCK_D + rd[None, :],
                               mask=(rq * 0 + c < parts)[:, None], other=0.0, cache_modifier=".cg")
        qoff = (b * R + r_of) * NH * HD + (g * G + hl) * HD
        tl.store(ao_ptr + qoff[:, None] + rd[None, :], acc.to(DT), mask=(r_of < R)[:, None] & (rd < HD)[None, :])
