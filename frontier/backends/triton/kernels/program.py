"""The fused drafter's program: one ``@triton.jit`` kernel that walks a schedule of phases.

One draft call is a *schedule* (built by ``schedule.build_schedule``): the context step (fc,
norms, QKV, RoPE + cache write, attention, o_proj, MLP, final norm, lm_head with streaming
top-K, merge, root selection), then per depth the same layer phases on the K frontier rows of
every sequence followed by the K*K -> K prune, and at the end FINAL's top-(T-1) and packing.
Every phase is a ``@triton.jit`` function of ``(pid, nprog)`` (in the sibling modules) that
spreads its work over whatever grid it gets.

A call drafts B sequences at once: the context step's new rows of all sequences are packed, the
tree rows are B*K, and the metadata block (``layout.META_*``) gives each sequence's cache
length, new rows, first packed row and cache offsets from one base pointer. Weight phases
stream each weight tile once for the rows of every sequence.

``PERSISTENT=True``: one launch walks the whole schedule on a co-resident grid, separating the
phases with the bounded grid barrier. ``PERSISTENT=False`` with ``PHASE >= 0``: each launch runs
one schedule entry and is built for that phase alone (step launches: the graph mode's body and
the interpreter path, where programs run one after another and a spinning barrier would hang).
Both paths run the same phase code.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import (
    CTX_DEPTH, META_ROWS, PH_ATTN, PH_ATTN2, PH_ATTN3, PH_ATTN_F, PH_DOWN, PH_FC, PH_FINAL,
    PH_GATEUP, PH_LMHEAD, PH_MERGE, PH_NORM_F, PH_NORM_POST, PH_OPROJ, PH_PREP2, PH_PREP3, PH_QKV,
    PH_RED_D, PH_ROPE, PH_SELECT,
)
from .barrier import _gdc_launch_dependents, _gdc_wait, _globaltimer, _grid_sync, _last_arrival
from .stream import _ph_gateup, _ph_linear, _ph_linear_ctx, _ph_linear_split, _ph_qkv_hidden, _ph_reduce
from .norm_rope import _ph_norm, _ph_norm_after, _ph_prep, _ph_rope_ctx, _ph_rope_tree
from .attention import _ph_attn_fused, _ph_attn_part, _ph_attn_sum
from .lm_head import _merge_row, _ph_lmhead, _ph_lmhead_wide, _ph_merge, _ph_merge_rows
from .select import _ph_final, _ph_select_step


# The batch size changes from call to call: without this, Triton specialises it (== 1, % 16 == 0)
# and recompiles the kernel as generation proceeds. (The packed new rows N come in the metadata.)


@triton.jit(do_not_specialize=["B"])
def drafter_kernel(
    # schedule
    sched_ptr, n_steps, sync_ptr, time_ptr,
    # weights
    emb_ptr, fcw_ptr, fcb_ptr, wq_ptr, wk_ptr, wv_ptr, wo_ptr, wg_ptr, wu_ptr, wd_ptr,
    ln_in_ptr, ln_post_ptr, ln_hid_ptr, ln_f_ptr, lm_ptr, d2t_ptr, cos_ptr, sin_ptr,
    # fp8 weights' fp32 row scales (QKV: of the [q; k; v] row space)
    sfc_ptr, sqkv_ptr, so_ptr, sg_ptr, su_ptr, sd_ptr, slm_ptr,
    # inputs (packed over the batch) and the caches
    meta_ptr, row_seq_ptr, feat_ptr, ids_ptr, root_ptr, kv_ptr,
    # workspace
    hcur_ptr, hres_ptr, xin_ptr, qkv_ptr, qr_ptr, ao_ptr, h1_ptr, n2_ptr, act_ptr, hout_ptr, nf_ptr, xh_ptr, qh_ptr,
    tab_ptr, t2d_ptr,
    tk_ptr, tv_ptr, apm_ptr, apl_ptr, aacc_ptr, lmk_ptr, lmmax_ptr, lmsum_ptr, lml_ptr, part_ptr, sel_lp_ptr, sel_tok_ptr,
    fr_score_ptr, fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr,
    cand_score_ptr, cand_tok_ptr, row_par_ptr, cnt_ptr, pf_ptr, out_tok_ptr, out_par_ptr, out_score_ptr,
    out_mask_ptr, out_pos_ptr, out_ret_ptr, out_leaf_ptr,
    # sizes
    B, H, F, I, V, Vt, NH, NKV, HD, K, C, T, D, SK, MR, PFW, eps, sqrt_d,
    RP_FC, RP_QKV, RP_O, RP_GU, RP_D, RP_LM, NCH, RPS_QKV, RPS_O, RPS_D, SPL_QKV, SPL_O, SPL_D, RP_QH,
    # compile-time
    EAGLE3: tl.constexpr, HAS_D2T: tl.constexpr, HAS_FCB: tl.constexpr, IEEE: tl.constexpr,
    PERSISTENT: tl.constexpr, MAX_SPIN: tl.constexpr, TIMING: tl.constexpr,
    BM: tl.constexpr, KP: tl.constexpr,
    BNS_FC: tl.constexpr, BK_FC: tl.constexpr, BNS_QKV: tl.constexpr, BK_QKV: tl.constexpr,
    BNS_O: tl.constexpr, BK_O: tl.constexpr, BNS_GU: tl.constexpr, BK_GU: tl.constexpr,
    BNS_D: tl.constexpr, BK_D: tl.constexpr, BNS_LM: tl.constexpr, BK_LM: tl.constexpr, LM_WIDE: tl.constexpr, BNP_LM: tl.constexpr,
    SPLITK: tl.constexpr, BNSS_QKV: tl.constexpr, BKS_QKV: tl.constexpr, BNSS_O: tl.constexpr, BKS_O: tl.constexpr,
    BNSS_D: tl.constexpr, BKS_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_NA: tl.constexpr, BLOCK_NF: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_CH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
    VEC_W: tl.constexpr = 1, VEC_KV: tl.constexpr = 1, BM2: tl.constexpr = 0, BMP: tl.constexpr = 16,
    BMP_B: tl.constexpr = 16,
    QH: tl.constexpr = False, BNS_QH: tl.constexpr = 16, BK_QH: tl.constexpr = 16, VEC_QH: tl.constexpr = 1,
    ST_LIN: tl.constexpr = 3, ST_GU: tl.constexpr = 3, ST_LM: tl.constexpr = 3,
    FOLD_FC: tl.constexpr = 1, FOLD_O: tl.constexpr = 1, FOLD_D: tl.constexpr = 1, ST_FOLD: tl.constexpr = 0,
    BMK_LM: tl.constexpr = 16, KEY16_LM: tl.constexpr = False, KEY32_MG: tl.constexpr = False,
    BMC: tl.constexpr = 0, BNS_FCC: tl.constexpr = 16, BK_FCC: tl.constexpr = 16, FOLD_FCC: tl.constexpr = 1,
    ST_FCC: tl.constexpr = 3, BNS_QKVC: tl.constexpr = 16, BK_QKVC: tl.constexpr = 16, PHASE: tl.constexpr = -1,
    PDL: tl.constexpr = 0, TREE_BLOCKS: tl.constexpr = True,
    MG_ROWS: tl.constexpr = False, BV_MG: tl.constexpr = 16, G_MG: tl.constexpr = 8, SEL_MG: tl.constexpr = False,
    KEY32_SEL: tl.constexpr = False, PACK_W: tl.constexpr = False,
    W8_FC: tl.constexpr = 0, W8_QKV: tl.constexpr = 0, W8_O: tl.constexpr = 0, W8_GU: tl.constexpr = 0,
    W8_D: tl.constexpr = 0, W8_LM: tl.constexpr = 0, TAB: tl.constexpr = False, BLOCK_QKV: tl.constexpr = 16,
):
    """B sequences at once. Context step rows: the N new rows of all sequences, packed in
    sequence order (``meta`` gives each sequence's first row and count, ``row_seq`` each row's
    sequence); after attention one row per sequence. Tree rows: B*K, sequence b's at b*K.
    Every weight-streaming phase runs over all rows of all sequences together.
    VEC_W / VEC_KV > 1: the launcher proved the QKV weight rows / every cache's K/V offset 16-byte
    aligned (that many elements), so loads that Triton cannot prove aligned itself are declared so.
    BM2 > 0 (wide launches): the tree depths' weight-streaming phases take activation rows in tiles
    of BM + BM2 (two accumulators per weight chunk), covering e.g. 160 rows without padding them to
    256. The unsplit linear phases (every one at narrow launches, the context step's at wide ones,
    with slabs too short for the tensor-core tiles of two accumulators) take one tile of BMP rows;
    o_proj and down, whose unsplit forms at wide launches serve only the context step's one row
    per sequence, one of BMP_B rows (BMP at narrow launches).
    QH (eagle3; the launcher enables it at batch 1): the tree depths' QKV is split along its input - the hidden half
    streamed one step early, during MERGE (``_ph_qkv_hidden``: NORM_F also writes the rows'
    hidden_norm into xh, qh holds the fp32 partials), the embedding half in PH_QKV, which adds
    each row's parent partial (or, with TAB, read from the embedding-QKV table by RoPE).
    ST_LIN / ST_GU / ST_LM: software-pipeline stages of the weight streams' k-loops - the linear
    phases (fc, QKV, o_proj, down and their split-K forms), gate/up, the lm_head.
    FOLD_FC / FOLD_O / FOLD_D: the unsplit fc, o_proj and down streams' k-chunks folded that
    many ways (``_stream_folded``; the launcher folds where the folded accumulator stays small,
    up to ``Tuning.lin_fold`` ways; in wide launches only the context step's o_proj and down, on
    their BMP_B tile) - or, in swapped fp8 streams of a 16-row tile, split that many ways
    (``_stream_split``; up to ``Tuning.swap_split``) - pipelined ST_FOLD stages (0: ST_LIN).
    PHASE >= 0 (step launches, one schedule entry each): the kernel is built for that phase
    alone - the phase switch below is decided at compile time, so the build holds one phase's
    code and gets that phase's own register allocation.
    SPLITK (wide launches): the tree depths' QKV, o_proj and down are split along K; the phase after
    each sums the partials itself (RoPE, the post-attention norm, EAGLE-3's final norm; EAGLE-2's
    down has its own reduction phase RED_D).
    TREE_BLOCKS: how the fused attention (batched launches) takes the rows' ancestors
    (``_ph_attn_fused``).
    MG_ROWS (wide launches, vocabularies up to 65536): at the tree depths the wide lm_head writes its
    logits scratch only and MERGE ranks each row from it (``_ph_merge_rows``, chunks of BV_MG
    logits, groups of G_MG); the context step keeps the per-program partials.
    SEL_MG (narrow launches that stream the QKV hidden half during MERGE; the schedule then has no
    PH_SELECT):
    MERGE counts each sequence's merged rows (``_last_arrival`` on sync_ptr[2 + b]) and the
    program that merges its last one runs its SELECT right away, while the other programs still
    stream the next depth's QKV hidden half (QH), instead of a phase of its own after MERGE.
    KEY32_SEL (16-bit dtypes): SELECT's prune ranks 32-bit keys (``_ph_select``).
    PACK_W (launches whose tree rows fit one BM-row tile, unless the backend's ``pack_weights=False``): gate, up and
    lm_head are the launcher's copies packed per slab (``_slab_base``, ``plan.pack_slabs``),
    each stage's tile one contiguous block; no other phase reads them.
    PDL > 0 (step launches on sm_90+ made with programmatic dependent launch): the launch may
    start while the one before it still runs, so every program first waits for that one to
    complete (``griddepcontrol.wait``: its writes are then visible, and by induction every earlier
    launch's). Before the wait nothing is read but the schedule (never written) and nothing is
    written. The launch lets the next one start (which then waits the same way) right after the
    wait (PDL 1) or after its own phase's work (PDL 2).
    W8_FC / W8_QKV / W8_O / W8_GU / W8_D / W8_LM: each stream's weight format (``stream``'s module
    docstring: 0 the compute dtype, 1 and 2 fp8 e4m3 with the row scales s*_ptr).
    TAB (QH launches, where the launcher holds the head's embedding-QKV table ``tab`` [V, NQ +
    2 * NKVD] fp32 and ``t2d``, each target token's draft index; ``table``): the tree depths
    have no PREP and QKV entries; their RoPE makes each row's QKV (BLOCK_QKV columns at once) from
    the table and the QH partial, and gathers the row's hidden input, itself."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT = hcur_ptr.dtype.element_ty
    NQ = NH * HD
    NKVD = NKV * HD
    RPW = 1 + D * K  # row-parent entries per sequence
    # TIMING: program 0 stamps the global timer at the start and after every barrier;
    # TIMING >= 2 also stamps every program: its start, and per schedule entry its arrival at the
    # barrier and its leaving it (ps_ptr: [1 + 2 * n_steps, nprog] after program 0's stamps)
    ps_ptr = time_ptr + n_steps + 1
    if TIMING:
        if pid == 0:
            tl.store(time_ptr, _globaltimer(pid))
        if TIMING >= 2:
            tl.store(ps_ptr + pid, _globaltimer(pid))
    for step in range(n_steps):
        code = tl.load(sched_ptr + step)
        if PHASE >= 0:
            ph = PHASE
        else:
            ph = code // 256
        i = code % 256
        is_ctx = i == CTX_DEPTH
        # QH: this step's rows are parents of a next depth's rows (every step but the last depth)
        ahead = (is_ctx & (D > 0)) | (i + 1 < D)
        if PDL > 0:
            _gdc_wait()
            if PDL == 1:
                _gdc_launch_dependents()
        # rows of this step: the N packed new rows (context step, up to attention), else B or B*K
        N = tl.load(meta_ptr + META_ROWS).to(tl.int32)
        m_in = tl.where(is_ctx, N, B * K)
        m_out = tl.where(is_ctx, B, B * K)
        # wide launches: the context step's fc and QKV on a tile of BMC rows when the call's new
        # rows fit in it (a run-time choice; both forms are built)
        small = is_ctx & (N <= BMC)
        if ph == PH_FC:
            if EAGLE3:
                _ph_linear_ctx(pid, nprog, small, feat_ptr, F, N, fcw_ptr, H, F, hcur_ptr, H, fcb_ptr, fcw_ptr, fcw_ptr,
                               0, RP_FC, 0, IEEE, 1, ST_LIN, BMP, BNS_FC, BK_FC, FOLD_FC, ST_FOLD, BMC, BNS_FCC,
                               BK_FCC, FOLD_FCC, ST_FCC, s_ptr=sfc_ptr, W8=W8_FC)
            elif HAS_FCB:  # (eagle2: fc at every depth; MODE 2 adds its bias)
                _ph_linear_ctx(pid, nprog, small, xin_ptr, 2 * H, m_in, fcw_ptr, H, 2 * H, hcur_ptr, H, fcb_ptr,
                               fcw_ptr, fcw_ptr, 0, RP_FC, 2, IEEE, 1, ST_LIN, BMP, BNS_FC, BK_FC, FOLD_FC, ST_FOLD,
                               BMC, BNS_FCC, BK_FCC, FOLD_FCC, ST_FCC, s_ptr=sfc_ptr, W8=W8_FC)
            else:
                _ph_linear_ctx(pid, nprog, small, xin_ptr, 2 * H, m_in, fcw_ptr, H, 2 * H, hcur_ptr, H, fcb_ptr,
                               fcw_ptr, fcw_ptr, 0, RP_FC, 0, IEEE, 1, ST_LIN, BMP, BNS_FC, BK_FC, FOLD_FC, ST_FOLD,
                               BMC, BNS_FCC, BK_FCC, FOLD_FCC, ST_FCC, s_ptr=sfc_ptr, W8=W8_FC)
        elif ph == PH_PREP3:  # (eagle3)
            if is_ctx:
                _ph_prep(pid, nprog, N, ids_ptr, emb_ptr, hcur_ptr, H, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, False, True, BLOCK_H)
            else:
                _ph_prep(pid, nprog, B * K, fr_tok_ptr, emb_ptr, hout_ptr, H, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, True, True, BLOCK_H, not QH)
        elif ph == PH_PREP2:  # (eagle2)
            if is_ctx:
                _ph_prep(pid, nprog, N, ids_ptr, emb_ptr, feat_ptr, F, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, False, False, BLOCK_H)
            else:
                _ph_prep(pid, nprog, B * K, fr_tok_ptr, emb_ptr, hout_ptr, H, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, True, False, BLOCK_H)
        elif ph == PH_QKV:
            if EAGLE3:
                x_a = xin_ptr
                k_a = 2 * H
            else:
                x_a = hcur_ptr
                k_a = H
            split = False
            if SPLITK:
                split = i != CTX_DEPTH
            if split:
                _ph_linear_split(pid, nprog, x_a, k_a, m_in, wq_ptr, NQ, k_a, part_ptr, MR, wk_ptr, wv_ptr, NKVD,
                                 RPS_QKV, SPL_QKV, True, BM, BNSS_QKV, BKS_QKV, IEEE, VEC_W, BM2=BM2, ST=ST_LIN,
                                 s_ptr=sqkv_ptr, W8=W8_QKV)
            elif QH and not is_ctx:  # the embedding half + each row's parent partial from MERGE
                _ph_linear(pid, nprog, xin_ptr, 2 * H, m_in, wq_ptr, NQ, 2 * H, H, qkv_ptr, NQ + 2 * NKVD, qh_ptr,
                           NQ + 2 * NKVD, fr_src_ptr, wk_ptr, wv_ptr, NKVD, RP_QKV, 7, BMP, BNS_QKV, BK_QKV, IEEE, VEC_W, ST=ST_LIN,
                           s_ptr=sqkv_ptr, W8=W8_QKV)
            else:
                _ph_linear_ctx(pid, nprog, small, x_a, k_a, m_in, wq_ptr, NQ, k_a, qkv_ptr, NQ + 2 * NKVD, fcb_ptr,
                               wk_ptr, wv_ptr, NKVD, RP_QKV, 4, IEEE, VEC_W, ST_LIN, BMP, BNS_QKV, BK_QKV, 1, 0, BMC,
                               BNS_QKVC, BK_QKVC, 1, 0, s_ptr=sqkv_ptr, W8=W8_QKV)
        elif ph == PH_ROPE:
            if is_ctx:
                _ph_rope_ctx(pid, nprog, N, meta_ptr, row_seq_ptr, qkv_ptr, qr_ptr, hcur_ptr, hres_ptr, kv_ptr,
                             cos_ptr, sin_ptr, NH, NKV, HD, H, BLOCK_R, BLOCK_D, BLOCK_H, VEC_KV)
            else:
                _ph_rope_tree(pid, nprog, B * K, K, i, meta_ptr, qkv_ptr, qr_ptr, tk_ptr, tv_ptr, B * SK * HD, SK,
                              cos_ptr, sin_ptr, NH, NKV, HD, BLOCK_R, BLOCK_D, SPLITK, part_ptr, SPL_QKV, MR,
                              TAB=TAB, tab_ptr=tab_ptr, t2d_ptr=t2d_ptr, tok_ptr=fr_tok_ptr, src_ptr=fr_src_ptr,
                              qh_ptr=qh_ptr, hout_ptr=hout_ptr, hcur_ptr=hcur_ptr, H=H, V=V, Vt=Vt,
                              HAS_D2T=HAS_D2T, BLOCK_H=BLOCK_H, BLOCK_QKV=BLOCK_QKV)
        elif (ph == PH_ATTN) | (ph == PH_ATTN2):
            r_att = tl.where(is_ctx, 1, K)
            n_anc = tl.where(is_ctx, 0, i + 1)
            if ph == PH_ATTN:
                _ph_attn_part(pid, nprog, B, r_att, meta_ptr, qr_ptr, kv_ptr,
                              tk_ptr, tv_ptr, B * SK * HD, anc_ptr, BLOCK_A, n_anc, NH, NKV, HD, sqrt_d,
                              apm_ptr, apl_ptr, aacc_ptr, NCH, 1, BLOCK_Q, BLOCK_NA, BLOCK_D, BLOCK_CH, IEEE, VEC_KV)
            else:
                _ph_attn_part(pid, nprog, B, r_att, meta_ptr, qr_ptr, kv_ptr,
                              tk_ptr, tv_ptr, B * SK * HD, anc_ptr, BLOCK_A, n_anc, NH, NKV, HD, sqrt_d,
                              apm_ptr, apl_ptr, aacc_ptr, NCH, 2, BLOCK_Q, BLOCK_NA, BLOCK_D, BLOCK_CH, IEEE, VEC_KV)
        elif ph == PH_ATTN_F:
            _ph_attn_fused(pid, nprog, B, tl.where(is_ctx, 1, K), meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr, B * SK * HD,
                           anc_ptr, BLOCK_A, SK, tl.where(is_ctx, 0, i + 1), NH, NKV, HD, sqrt_d, ao_ptr,
                           BLOCK_Q, BLOCK_NF, BLOCK_D, IEEE, VEC_KV, TREE_BLOCKS)
        elif ph == PH_ATTN3:
            _ph_attn_sum(pid, nprog, B, tl.where(is_ctx, 1, K), ao_ptr, aacc_ptr, NH, NKV, HD, NCH,
                         tl.where(is_ctx, 0, i + 1), BLOCK_Q, BLOCK_D, 16)
        elif ph == PH_OPROJ:  # h1 = h + o_proj(attn); the context step's residual is each sequence's last row
            if is_ctx:
                _ph_linear(pid, nprog, ao_ptr, NQ, m_out, wo_ptr, H, NQ, NQ, h1_ptr, H, hres_ptr, H, fcb_ptr,
                           wo_ptr, wo_ptr, 0, RP_O, 1, BMP_B, BNS_O, BK_O, IEEE, VEC=1, ST=ST_LIN, FOLD=FOLD_O,
                           STF=ST_FOLD, s_ptr=so_ptr, W8=W8_O)
            elif SPLITK:
                _ph_linear_split(pid, nprog, ao_ptr, NQ, m_out, wo_ptr, H, NQ, part_ptr, MR, wo_ptr, wo_ptr, 0,
                                 RPS_O, SPL_O, False, BM, BNSS_O, BKS_O, IEEE, VEC=1, BM2=BM2, ST=ST_LIN,
                                 s_ptr=so_ptr, W8=W8_O)
            else:
                _ph_linear(pid, nprog, ao_ptr, NQ, m_out, wo_ptr, H, NQ, NQ, h1_ptr, H, hcur_ptr, H, fcb_ptr,
                           wo_ptr, wo_ptr, 0, RP_O, 1, BMP_B, BNS_O, BK_O, IEEE, VEC=1, ST=ST_LIN, FOLD=FOLD_O,
                           STF=ST_FOLD, s_ptr=so_ptr, W8=W8_O)
        elif ph == PH_NORM_POST:  # (SPLITK: h1 = h + the split-K o_proj's partials, first)
            _ph_norm_after(pid, nprog, m_out, is_ctx, part_ptr, SPL_O, MR, hcur_ptr, h1_ptr, ln_post_ptr, n2_ptr, H, eps,
                           BLOCK_H, SPLITK)
        elif ph == PH_GATEUP:
            _ph_gateup(pid, nprog, n2_ptr, m_out, wg_ptr, wu_ptr, I, H, act_ptr, RP_GU, BM, BNS_GU, BK_GU, IEEE, BM2=BM2, ST=ST_GU,
                       PACK=PACK_W, sg_ptr=sg_ptr, su_ptr=su_ptr, W8=W8_GU)
        elif ph == PH_DOWN:  # h2 = h1 + down(act)
            split = False
            if SPLITK:
                split = i != CTX_DEPTH
            if split:
                _ph_linear_split(pid, nprog, act_ptr, I, m_out, wd_ptr, H, I, part_ptr, MR, wd_ptr, wd_ptr, 0,
                                 RPS_D, SPL_D, False, BM, BNSS_D, BKS_D, IEEE, VEC=1, BM2=BM2, ST=ST_LIN,
                                 s_ptr=sd_ptr, W8=W8_D)
            else:
                _ph_linear(pid, nprog, act_ptr, I, m_out, wd_ptr, H, I, I, hout_ptr, H, h1_ptr, H, fcb_ptr,
                           wd_ptr, wd_ptr, 0, RP_D, 1, BMP_B, BNS_D, BK_D, IEEE, VEC=1, ST=ST_LIN, FOLD=FOLD_D,
                           STF=ST_FOLD, s_ptr=sd_ptr, W8=W8_D)
        elif ph == PH_RED_D:  # h2 = h1 + sum
            _ph_reduce(pid, nprog, part_ptr, SPL_D, m_out, H, MR, hout_ptr, H, h1_ptr, H, 1, 1024)
        elif ph == PH_NORM_F:  # (SPLITK: h2 = h1 + the split-K down's partials, first)
            _ph_norm_after(pid, nprog, m_out, is_ctx, part_ptr, SPL_D, MR, h1_ptr, hout_ptr, ln_f_ptr, nf_ptr, H, eps,
                           BLOCK_H, SPLITK)
            if QH and ahead:  # the next depth's hidden_norm of every possible parent, on the programs after these
                _ph_norm((pid + nprog - m_out % nprog) % nprog, nprog, m_out, hout_ptr, ln_hid_ptr, xh_ptr, H, eps,
                         BLOCK_H)
        elif ph == PH_LMHEAD:
            if EAGLE3:
                x_lm = nf_ptr
            else:
                x_lm = hout_ptr
            if LM_WIDE:
                lm_stats = True
                if MG_ROWS:  # (the context step keeps its per-program partials: the same bits as step launches'
                    lm_stats = is_ctx  # own context builds, whose register lm_head leaves them)
                _ph_lmhead_wide(pid, nprog, x_lm, m_out, lm_ptr, V, H, lml_ptr, lmk_ptr, lmmax_ptr, lmsum_ptr, RP_LM, MR, K,
                                BM, KP, BNS_LM, BK_LM, IEEE, BMK_LM, BNP_LM, BM2=BM2, ST=ST_LM, KEY16=KEY16_LM,
                                stats=lm_stats, s_ptr=slm_ptr, W8=W8_LM)
            else:
                _ph_lmhead(pid, nprog, x_lm, m_out, lm_ptr, V, H, lmk_ptr, lmmax_ptr, lmsum_ptr, RP_LM, MR, K,
                           BM, KP, BNS_LM, BK_LM, IEEE, BNP_LM <= BNS_LM, ST=ST_LM, KEY16=KEY16_LM, PACK=PACK_W,
                           s_ptr=slm_ptr, W8=W8_LM)
        elif ph == PH_MERGE:  # (partials: the lm_head programs whose slab holds vocabulary rows)
            if MG_ROWS and not is_ctx:  # (tree depths: each row from the wide lm_head's logits scratch)
                _ph_merge_rows(pid, nprog, m_out, lml_ptr, V, sel_lp_ptr, sel_tok_ptr, K, KP, BV_MG, DT, KEY32_MG, G_MG)
            elif SEL_MG:  # the program that merges a sequence's last row runs that sequence's SELECT
                per_seq = tl.where(is_ctx, 1, K)  # rows per sequence: the root, or the K frontier rows
                for r in range(pid, m_out, nprog):
                    _merge_row(r, tl.cdiv(V, RP_LM), lmk_ptr, lmmax_ptr, lmsum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR, KP,
                               BLOCK_P, DT, KEY32_MG)
                    b = r // per_seq
                    if _last_arrival(sync_ptr + 2 + b, per_seq):  # (program b of B: sequence b alone)
                        _ph_select_step(b, B, is_ctx, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr,
                                        fr_score_ptr, fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr,
                                        cand_tok_ptr, row_par_ptr, V, HAS_D2T, BLOCK_K, BLOCK_A, DT, KEY32_SEL)
            else:
                _ph_merge(pid, nprog, m_out, tl.cdiv(V, RP_LM), lmk_ptr, lmmax_ptr, lmsum_ptr, sel_lp_ptr, sel_tok_ptr,
                          K, MR, KP, BLOCK_P, DT, KEY32_MG)
            if QH and ahead:
                _ph_qkv_hidden(pid, nprog, m_out, xh_ptr, H, wq_ptr, wk_ptr, wv_ptr, NQ, NKVD, qh_ptr, RP_QH,
                               BMP, BNS_QH, BK_QH, IEEE, VEC_QH, ST=ST_LIN, s_ptr=sqkv_ptr, W8=W8_QKV)
        elif ph == PH_SELECT:
            _ph_select_step(pid, nprog, is_ctx, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr,
                            fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V,
                            HAS_D2T, BLOCK_K, BLOCK_A, DT, KEY32_SEL)
        elif ph == PH_FINAL:
            _ph_final(pid, nprog, B, C, T, K, tl.minimum(D + 1, T - 1), D + 2, RPW, PFW, cand_score_ptr, cand_tok_ptr,
                      row_par_ptr, root_ptr, cnt_ptr, pf_ptr, out_tok_ptr, out_par_ptr, out_score_ptr, out_mask_ptr,
                      out_pos_ptr, out_ret_ptr, out_leaf_ptr, BLOCK_C, BLOCK_T, BLOCK_W)
        if PDL == 2:
            _gdc_launch_dependents()
        if PERSISTENT:
            if TIMING >= 2:
                tl.debug_barrier()
                tl.store(ps_ptr + (1 + 2 * step) * nprog + pid, _globaltimer(pid))
            _grid_sync(sync_ptr, (step + 1) * nprog, MAX_SPIN)
            if TIMING:
                if pid == 0:
                    tl.store(time_ptr + 1 + step, _globaltimer(pid))
                if TIMING >= 2:
                    tl.store(ps_ptr + (2 + 2 * step) * nprog + pid, _globaltimer(pid))
