"""The embedding-QKV table of EAGLE-3 heads: the embedding half of every draft token's QKV input,
computed once per head instead of streamed at every tree depth.

A tree row's QKV input is ``[norm(embed(token)) | hidden_norm(parent's hidden)]``, and its
token is always one of the head's V draft tokens (target id ``d + d2t[d]``). So the first half's
share of the row's Q/K/V depends on the draft token alone:

    tab[d] = input_layernorm(embed[d + d2t[d]]) @ Wqkv[:, :H]^T        (fp32, [V, NQ + 2 * NKVD])

These two kernels compute it with the phase code the tree depths' QKV runs (the embedding norm of
PREP, then ``_ph_linear``'s QKV mode over V activation rows, launched with that phase's tile,
k-chunks, dot form, constants and grid), so every entry has the bits of the fp32 accumulator
that phase would have made for the token: a launch that reads the table drafts exactly the tree
of one that streams. The tree depths then read one table row per frontier row (RoPE, with
``TAB``) and skip PREP and the QKV stream; the hidden half is still streamed, one depth
early, during MERGE (``stream._ph_qkv_hidden``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .norm_rope import _rms_row
from .stream import _ph_linear


@triton.jit
def emb_norm_kernel(emb_ptr, d2t_ptr, ln_ptr, xn_ptr, V, Vt, H, eps,
                    HAS_D2T: tl.constexpr, BLOCK_H: tl.constexpr):
    """xn[d] = input_layernorm(embed[t]), t = d + d2t[d] (d without a d2t map), for the V draft
    tokens d: PREP's embedding norm (``_rms_row``), one row per program in turn."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT = xn_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_H)
    for d in range(pid, V, nprog):
        row = tl.full([], 0, tl.int64) + d
        tok = row
        if HAS_D2T:
            tok += tl.load(d2t_ptr + d)
        tok = tl.minimum(tl.maximum(tok, 0), Vt - 1)
        tl.store(xn_ptr + row * H + rh, _rms_row(emb_ptr + tok * H, ln_ptr, H, eps, BLOCK_H, DT), mask=rh < H)


@triton.jit
def emb_qkv_kernel(xn_ptr, V, H, wq_ptr, wk_ptr, wv_ptr, NQ, NKVD, s_ptr, tab_ptr, RP,
                   BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr,
                   ST: tl.constexpr, W8: tl.constexpr):
    """tab = xn @ Wqkv[:, :H]^T in fp32: the tree QKV phase's stream (``_ph_linear`` over the
    first H of the 2H input columns, program ``pid`` owning weight rows [pid * RP, pid * RP + RP)
    of [Wq; Wk; Wv]) with the V rows of ``xn`` as its activation rows, stored unrounded."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NT = NQ + 2 * NKVD
    _ph_linear(pid, nprog, xn_ptr, H, V, wq_ptr, NQ, 2 * H, H, tab_ptr, NT, tab_ptr, NT, tab_ptr,
               wk_ptr, wv_ptr, NKVD, RP, 4, BM, BNS, BK, IEEE, VEC, ST, s_ptr=s_ptr, W8=W8)
