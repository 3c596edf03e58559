"""Row-wise phases: PREP (embedding + the EAGLE-3 input norms), the RMSNorm phases (with the
split-K partial sums folded in), and RoPE, which also writes each row's K/V into the draft cache
(context step) or the tree scratch (tree depths).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import META_C, META_KOFF, META_MAXLEN, META_N, META_ROW, META_VOFF, META_W, _kv_off
from .numerics import _recip_rn
from .stream import _part_sum


@triton.jit
def _rms_row(x_ptr, w_ptr, H, eps, BLOCK_H: tl.constexpr, DT: tl.constexpr):
    """RMSNorm of one row as the reference computes it: fp32, cast, then the weight multiply."""
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    x = tl.load(x_ptr + rh, mask=hm, other=0.0, cache_modifier=".cg").to(tl.float32)
    return _rms_of(x, w_ptr, H, eps, BLOCK_H, DT)


@triton.jit
def _rms_of(x, w_ptr, H, eps, BLOCK_H: tl.constexpr, DT: tl.constexpr):
    """``_rms_row`` of a row already in registers (fp32 [BLOCK_H], zeros past H)."""
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    var = tl.math.div_rn(tl.sum(x * x, axis=0), H.to(tl.float32))
    rstd = _recip_rn(tl.sqrt_rn(var + eps))
    y = (x * rstd).to(DT).to(tl.float32)
    w = tl.load(w_ptr + rh, mask=hm, other=0.0).to(tl.float32)
    return (w * y).to(DT)


@triton.jit
def _ph_prep(pid, nprog, M, tok_ptr, emb_ptr, hsrc_ptr, hsrc_stride, src_ptr, hcur_ptr, xin_ptr,
             ln_in_ptr, ln_hid_ptr, H, Vt, eps,
             GATHER: tl.constexpr, EAGLE3: tl.constexpr, BLOCK_H: tl.constexpr, XH: tl.constexpr = True):
    """Per row: e = embed[t]; h = the row's hidden input (gathered from the parent's output row
    when GATHER). eagle3: hcur = h, xin = [norm(e) | hidden_norm(h)]; eagle2: xin = [e | h].
    XH = False (eagle3 with the hidden half of QKV streamed ahead, see ``_ph_qkv_hidden``): only
    xin's first half is written."""
    DT = xin_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    for m in range(pid, M, nprog):
        tok = tl.load(tok_ptr + m, cache_modifier=".cg")
        tok = tl.minimum(tl.maximum(tok, 0), Vt - 1)
        if GATHER:
            src = tl.load(src_ptr + m, cache_modifier=".cg")
            src = tl.minimum(tl.maximum(src, 0), M - 1)
            h_row = hsrc_ptr + src * hsrc_stride
        else:
            h_row = hsrc_ptr + m * hsrc_stride
        if EAGLE3:
            if GATHER:
                h = tl.load(h_row + rh, mask=hm, other=0.0, cache_modifier=".cg")
                tl.store(hcur_ptr + m * H + rh, h, mask=hm)
                tl.debug_barrier()
            xe = _rms_row(emb_ptr + tok * H, ln_in_ptr, H, eps, BLOCK_H, DT)
            tl.store(xin_ptr + m * 2 * H + rh, xe, mask=hm)
            if XH:
                xh = _rms_row(h_row, ln_hid_ptr, H, eps, BLOCK_H, DT)
                tl.store(xin_ptr + m * 2 * H + H + rh, xh, mask=hm)
        else:
            e = tl.load(emb_ptr + tok * H + rh, mask=hm, other=0.0)
            h = tl.load(h_row + rh, mask=hm, other=0.0, cache_modifier=".cg")
            tl.store(xin_ptr + m * 2 * H + rh, e.to(DT), mask=hm)
            tl.store(xin_ptr + m * 2 * H + H + rh, h.to(DT), mask=hm)


@triton.jit
def _ph_norm(pid, nprog, M, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H: tl.constexpr):
    DT = y_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_H)
    for m in range(pid, M, nprog):
        y = _rms_row(x_ptr + m * H, w_ptr, H, eps, BLOCK_H, DT)
        tl.store(y_ptr + m * H + rh, y, mask=rh < H)


@triton.jit
def _ph_norm_sum(pid, nprog, M, part_ptr, SPL, MR, res_ptr, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H: tl.constexpr):
    """A split-K phase's reduction and the RMSNorm after it, per row: x = res + round(sum of the
    SPL fp32 partials, in order) - what ``_ph_reduce`` (MODE 1) writes, the same bits - stored
    (the next residual), then y = RMSNorm(x) as ``_ph_norm`` computes it."""
    DT = y_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    for m in range(pid, M, nprog):
        acc = _part_sum(part_ptr, SPL, MR, H, m, rh, hm)
        res = tl.load(res_ptr + m * H + rh, mask=hm, other=0.0, cache_modifier=".cg").to(tl.float32)
        x = (acc.to(DT).to(tl.float32) + res).to(DT)
        tl.store(x_ptr + m * H + rh, x, mask=hm)
        tl.store(y_ptr + m * H + rh, _rms_of(x.to(tl.float32), w_ptr, H, eps, BLOCK_H, DT), mask=hm)


@triton.jit
def _ph_norm_after(pid, nprog, M, is_ctx, part_ptr, SPL, MR, res_ptr, x_ptr, w_ptr, y_ptr, H, eps,
                   BLOCK_H: tl.constexpr, SUMS: tl.constexpr):
    """The norm after a linear phase: y = RMSNorm(x); with SUMS (wide launches, whose tree depths
    split that phase's K) at the tree depths x is first res + the split-K partials
    (``_ph_norm_sum``)."""
    if SUMS:
        if is_ctx:
            _ph_norm(pid, nprog, M, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H)
        else:
            _ph_norm_sum(pid, nprog, M, part_ptr, SPL, MR, res_ptr, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H)
    else:
        _ph_norm(pid, nprog, M, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H)


@triton.jit
def _rotary_heads(row_ptr, pos, cos_ptr, sin_ptr, NR, HD, DT: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """The NR head rows [NR, HD] at ``row_ptr`` (one token's q and k heads, contiguous) rotated
    to position ``pos``, rounded like the reference: ``round(round(x*cos) + round(rotate_half(x)*sin))``."""
    half = HD // 2
    rh = tl.arange(0, BLOCK_R)[:, None]
    rd = tl.arange(0, BLOCK_D)[None, :]
    m = (rh < NR) & (rd < HD)
    rot = tl.where(rd < half, rd + half, rd - half)
    sign = tl.where(rd < half, -1.0, 1.0)
    c = tl.load(cos_ptr + pos * HD + rd, mask=rd < HD, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * HD + rd, mask=rd < HD, other=0.0).to(tl.float32)
    x = tl.load(row_ptr + rh * HD + rd, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    xr = tl.load(row_ptr + rh * HD + rot, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32) * sign
    return ((x * c).to(DT).to(tl.float32) + (xr * s).to(DT).to(tl.float32)).to(DT)


@triton.jit
def _ph_rope_ctx(pid, nprog, N, meta_ptr, row_seq_ptr, qkv_ptr, qr_ptr, hcur_ptr, hres_ptr, kv_ptr,
                 cos_ptr, sin_ptr, NH, NKV, HD, H, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_H: tl.constexpr, VEC: tl.constexpr = 1):
    """Context step, the N packed new rows of all sequences, one row (all heads) per item. Row m
    belongs to sequence b = row_seq[m] at context position c_b + j: its rotated k heads and its
    v heads go to cache b's row c_b + j (the cache's own base offset and length from the
    metadata); the q of each sequence's last new row goes to qr[b], and that row's hidden state
    (the attention residual) to hres[b]."""
    DT = qr_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_R)[:, None]
    rd = tl.arange(0, BLOCK_D)[None, :]
    width = (NH + 2 * NKV) * HD
    for m in range(pid, N, nprog):
        b = tl.load(row_seq_ptr + m)
        mb = meta_ptr + b * META_W
        c_b = tl.load(mb + META_C)
        j = m - tl.load(mb + META_ROW)
        row = qkv_ptr + m * width
        y = _rotary_heads(row, c_b + j, cos_ptr, sin_ptr, NH + NKV, HD, DT, BLOCK_R, BLOCK_D)  # [q heads; k heads]
        kvrow = (c_b + j) * HD + (rh - NH) * tl.load(mb + META_MAXLEN) * HD + rd
        kmask = (rh >= NH) & (rh < NH + NKV) & (rd < HD)
        tl.store(kv_ptr + _kv_off(mb, META_KOFF, VEC) + kvrow, y, mask=kmask)
        v = tl.load(row + (rh + NKV) * HD + rd, mask=kmask, other=0.0, cache_modifier=".cg")
        tl.store(kv_ptr + _kv_off(mb, META_VOFF, VEC) + kvrow, v, mask=kmask)
        if j == tl.load(mb + META_N) - 1:
            tl.store(qr_ptr + b * NH * HD + rh * HD + rd, y, mask=(rh < NH) & (rd < HD))
            rhh = tl.arange(0, BLOCK_H)
            hrow = tl.load(hcur_ptr + m * H + rhh, mask=rhh < H, other=0.0, cache_modifier=".cg")
            tl.store(hres_ptr + b * H + rhh, hrow, mask=rhh < H)


@triton.jit
def _tree_qkv_row(r, M, qkv_ptr, width, tab_ptr, t2d_ptr, tok_ptr, src_ptr, qh_ptr, hout_ptr, hcur_ptr, H, V, Vt,
                  HAS_D2T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_QKV: tl.constexpr):
    """Frontier row r's QKV from the embedding-QKV table (``table``): tab[d] (d the row's draft
    token, ``t2d`` of its target id) + qh[src] (the hidden half, streamed during MERGE), rounded -
    what the QKV phase's MODE 7 stores, the same bits - and the row's hidden input hcur[r] =
    hout[src] (what PREP's gather stores; src clamped into [0, M) as both clamp it). The whole
    row (BLOCK_QKV >= its width) is read at once: one round of dependent loads, not one per chunk."""
    DT = qkv_ptr.dtype.element_ty
    tok = tl.load(tok_ptr + r, cache_modifier=".cg")
    src = tl.load(src_ptr + r, cache_modifier=".cg")
    src = tl.minimum(tl.maximum(src, 0), M - 1)
    rh = tl.arange(0, BLOCK_H)
    h = tl.load(hout_ptr + src * H + rh, mask=rh < H, other=0.0, cache_modifier=".cg")
    tok = tl.minimum(tl.maximum(tok, 0), Vt - 1)
    d = tok
    if HAS_D2T:
        d = tl.load(t2d_ptr + tok).to(tl.int64)
    d = tl.minimum(tl.maximum(d, 0), V - 1)
    c = tl.arange(0, BLOCK_QKV)
    part = tl.load(qh_ptr + src * width + c, mask=c < width, other=0.0, cache_modifier=".cg")
    e = tl.load(tab_ptr + d * width + c, mask=c < width, other=0.0)
    tl.store(qkv_ptr + r * width + c, (e + part).to(DT), mask=c < width)
    tl.store(hcur_ptr + r * H + rh, h, mask=rh < H)


@triton.jit
def _ph_rope_tree(pid, nprog, M, K, i, meta_ptr, qkv_ptr, qr_ptr, tk_ptr, tv_ptr, t_head_stride, SK,
                  cos_ptr, sin_ptr, NH, NKV, HD, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                  SUMS: tl.constexpr = False, part_ptr=0, SPL=1, MR=1,
                  TAB: tl.constexpr = False, tab_ptr=0, t2d_ptr=0, tok_ptr=0, src_ptr=0, qh_ptr=0, hout_ptr=0,
                  hcur_ptr=0, H=1, V=1, Vt=1, HAS_D2T: tl.constexpr = False, BLOCK_H: tl.constexpr = 16,
                  BLOCK_QKV: tl.constexpr = 16):
    """Depth i, the M = B*K frontier rows, one row (all heads) per item: row r = b*K + j sits at
    position L_b + i; q goes to qr[r], k (rotated) and v to tree slot b*SK + i*K + j of the tree
    scratch. SUMS: the row is first the sum of the split-K QKV's SPL fp32 partials, in order,
    rounded and stored as ``_ph_reduce`` (MODE 0) writes it - the same bits. TAB (launches with
    the embedding-QKV table, whose tree depths have no PREP and QKV phases): the row's QKV is first
    made from the table, and its hidden input gathered (``_tree_qkv_row``)."""
    DT = qr_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_R)[:, None]
    rd = tl.arange(0, BLOCK_D)[None, :]
    width = (NH + 2 * NKV) * HD
    for r in range(pid, M, nprog):
        if SUMS:
            rc = tl.arange(0, 1024)
            for c0 in range(0, width, 1024):
                c = c0 + rc
                tl.store(qkv_ptr + r * width + c, _part_sum(part_ptr, SPL, MR, width, r, c, c < width).to(DT),
                         mask=c < width)
            tl.debug_barrier()  # (the rotation reads columns other threads stored)
        elif TAB:
            _tree_qkv_row(r, M, qkv_ptr, width, tab_ptr, t2d_ptr, tok_ptr, src_ptr, qh_ptr, hout_ptr, hcur_ptr,
                          H, V, Vt, HAS_D2T, BLOCK_H, BLOCK_QKV)
            tl.debug_barrier()
        b = r // K
        mb = meta_ptr + b * META_W
        pos = tl.load(mb + META_C) + tl.load(mb + META_N) + i
        row = qkv_ptr + r * width
        y = _rotary_heads(row, pos, cos_ptr, sin_ptr, NH + NKV, HD, DT, BLOCK_R, BLOCK_D)
        tl.store(qr_ptr + r * NH * HD + rh * HD + rd, y, mask=(rh < NH) & (rd < HD))
        slot = b * SK + i * K + (r - b * K)
        kmask = (rh >= NH) & (rh < NH + NKV) & (rd < HD)
        toff = (rh - NH) * t_head_stride + slot * HD + rd
        tl.store(tk_ptr + toff, y, mask=kmask)
        v = tl.load(row + (rh + NKV) * HD + rd, mask=kmask, other=0.0, cache_modifier=".cg")
        tl.store(tv_ptr + toff, v, mask=kmask)
