"""The two small launches around a :class:`frontier.Drafter` step: ``stage_kernel`` turns the
drafter's buffers into the drafter kernel's inputs (metadata, packed rows, root tokens) and
flags bad values; ``finish_kernel`` combines the flags with the scores' finiteness, commits the
slot's rows (or records them as pending) and lays out the outputs. Two launches instead of the
few dozen elementwise ops the same work takes in PyTorch (each a few microseconds of device time).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import META_C, META_KOFF, META_MAXLEN, META_N, META_ROW, META_ROWS, META_VOFF, META_W


@triton.jit
def _clamp(x, lo, hi):
    return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def stage_kernel(new_rows_ptr, lengths_ptr, ids_in_ptr, feat_in_ptr, flag_ptr, k_off_ptr, v_off_ptr,
                 meta_ptr, row_seq_ptr, ids_out_ptr, feat_out_ptr, root_ptr,
                 R, F, Vt, MAX_CTX, S_ROWS,
                 BLOCK_B: tl.constexpr, BLOCK_F: tl.constexpr):
    """Program (s, j): slot s's staged row j. Rows j < n_s go to packed row first_s + j (their
    token id clamped into the vocabulary, their features copied and checked finite); program
    (s, 0) writes the slot's metadata. A slot whose row count or length is out of range drafts
    from the scratch rows past MAX_CTX (its writes never reach a committed row). Any bad value
    sets ``flag[s]`` (zero before the launch; ``finish_kernel`` reads and clears it)."""
    s = tl.program_id(0)
    j = tl.program_id(1)
    nb = tl.num_programs(0)
    sb = tl.arange(0, BLOCK_B)
    n_each = _clamp(tl.load(new_rows_ptr + sb, mask=sb < nb, other=0), 1, R)
    n_each = tl.where(sb < nb, n_each, 0)
    first = tl.sum(tl.where(sb < s, n_each, 0))  # packed rows of the slots before s
    n_raw = tl.load(new_rows_ptr + s)
    c_raw = tl.load(lengths_ptr + s)
    n = _clamp(n_raw, 1, R)
    range_bad = (n != n_raw) | (c_raw < 0) | (c_raw > MAX_CTX - n)
    c = tl.where(range_bad, MAX_CTX, c_raw)
    if j < n:
        row = first + j
        tok_raw = tl.load(ids_in_ptr + s * R + j)
        tok = _clamp(tok_raw, 0, Vt - 1)
        tl.store(ids_out_ptr + row, tok)
        tl.store(row_seq_ptr + row, s)
        if j == n - 1:
            tl.store(root_ptr + s, tok)
        nonfinite = 0
        src = feat_in_ptr + (s * R + j).to(tl.int64) * F
        dst = feat_out_ptr + row.to(tl.int64) * F
        for f0 in range(0, F, BLOCK_F):
            offs = f0 + tl.arange(0, BLOCK_F)
            x = tl.load(src + offs, mask=offs < F, other=0.0)
            tl.store(dst + offs, x, mask=offs < F)
            xf = x.to(tl.float32)
            nonfinite = tl.maximum(nonfinite, tl.max(((xf - xf) != 0).to(tl.int32)))  # NaN or +-Inf
        if (tok != tok_raw) | (nonfinite != 0):
            tl.atomic_max(flag_ptr + s, 1)
    if j == 0:
        mb = meta_ptr + s * META_W
        tl.store(mb + META_C, c)
        tl.store(mb + META_N, n)
        tl.store(mb + META_ROW, first)
        tl.store(mb + META_KOFF, tl.load(k_off_ptr + s))
        tl.store(mb + META_VOFF, tl.load(v_off_ptr + s))
        tl.store(mb + META_MAXLEN, S_ROWS)
        tl.store(mb + META_ROWS, tl.sum(n_each))
        tl.store(mb + META_ROWS + 1, 0)
        if range_bad:
            tl.atomic_max(flag_ptr + s, 1)


@triton.jit
def finish_kernel(flag_ptr, score_ptr, new_rows_ptr, lengths_ptr, pending_ptr, invalid_ptr, leaf_ptr, leaf_out_ptr,
                  par_ptr, par_out_ptr, NB, R, T, COMMIT, BLOCK_T: tl.constexpr):
    """Program s < NB: slot s is invalid when staging flagged it or a score is NaN/Inf; its n rows
    count (``lengths += n`` when COMMIT, else ``pending = n``) only when it is valid. Copies the
    leaf count and the parents (root 0 first) into the drafter's output layout, and clears the
    flag for the next step. Programs s >= NB (slots this step did not draft) clear their
    ``pending``, so that a later commit adds only this step's rows. (COMMIT is a run-time flag:
    one compiled kernel serves both, so a warm-up of either prepares a capture of both.)"""
    s = tl.program_id(0)
    if s >= NB:
        tl.store(pending_ptr + s, 0)
    else:
        t = tl.arange(0, BLOCK_T)
        sc = tl.load(score_ptr + s * T + t, mask=t < T, other=0.0)
        bad = (tl.load(flag_ptr + s) != 0) | (tl.max(((sc - sc) != 0).to(tl.int32)) != 0)
        tl.store(flag_ptr + s, 0)
        tl.store(invalid_ptr + s, bad.to(tl.int1))
        n = _clamp(tl.load(new_rows_ptr + s), 1, R)
        advance = tl.where(bad, 0, n)
        if COMMIT != 0:
            tl.store(lengths_ptr + s, tl.load(lengths_ptr + s) + advance)
            tl.store(pending_ptr + s, 0)
        else:
            tl.store(pending_ptr + s, advance)
        tl.store(leaf_out_ptr + s, tl.load(leaf_ptr + s * 2))
        par = tl.load(par_ptr + s * (T - 1) + t - 1, mask=(t >= 1) & (t < T), other=0)
        tl.store(par_out_ptr + s * T + t, par, mask=t < T)
