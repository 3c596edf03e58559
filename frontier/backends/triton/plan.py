"""What a launch for a given batch size needs: tiles, slabs, folds, the schedule variant and the
kernel's compile-time constants (:class:`LaunchPlan`), worked out once per batch size by
:class:`LaunchPlanner` from the config, dtype, grid and :class:`~.tuning.Tuning`; and the grid
of each step launch.

Batch sizes fall in two regimes. *Narrow* launches (batch 1 at top_k 10) have an activation
tile below ``Tuning.wide_bm`` rows: every weight stream is unsplit, the lm_head ranks its slab
in registers, and (EAGLE-3) MERGE streams the next depth's QKV hidden half and runs SELECT.
*Wide* launches (every batch from 2 at top_k 10) split K in the tree depths' QKV / o_proj /
down, rank the lm_head's rows from a logits scratch, and give the context step's phases tiles
of their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from .fp8 import SWAP_DOT, StreamFormats
from .kernels.layout import CONTEXT_STEP, Phase
from .kernels.stream import SWAP_ROWS
from .tuning import Tuning, _pow2, slab, split_slab


def interpreting() -> bool:
    """Whether Triton runs under its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def rows_aligned(tensors, skip: int = 0) -> bool:
    """Whether every row of every tensor starts on a 16-byte boundary: its data, and each stride
    from dimension ``skip`` to the last but one a multiple of 16 bytes, the last stride 1."""
    return all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1
               and all(st * t.element_size() % 16 == 0 for st in t.stride()[skip:-1]) for t in tensors)


def pack_slabs(w: torch.Tensor, grid: int, rp: int, bk: int) -> torch.Tensor:
    """A weight [N, Kd] packed per slab for a stream whose ``grid`` programs own RP rows each,
    read in k-chunks of BK: [grid, ceil(Kd / BK), RP, BK], program g's rows [g * RP, g * RP +
    RP) with chunk c's columns [c * BK, c * BK + BK) at [g, c] (rows past N and columns past Kd
    zero). The kernel's ``_slab_base`` addresses it."""
    n, kd = w.shape
    kc = -(-kd // bk)
    out = torch.zeros(grid, kc, rp, bk, dtype=w.dtype, device=w.device)
    if kc * bk != kd:  # (small heads only: a padded copy first)
        wp = torch.zeros(n, kc * bk, dtype=w.dtype, device=w.device)
        wp[:, :kd] = w
        w = wp
    full = min(grid, n // rp)  # programs whose slab is all rows of w
    if full:
        out[:full].copy_(w[:full * rp].reshape(full, rp, kc, bk).transpose(1, 2))
    rest = min(n - full * rp, rp) if full < grid else 0
    if rest > 0:
        out[full, :, :rest].copy_(w[full * rp:full * rp + rest].reshape(rest, kc, bk).transpose(0, 1))
    return out



def block_sizes(cfg) -> dict:
    """The kernel block sizes that follow from the config alone: ancestor slots per row
    (block_a), candidates (block_c), queries per KV-head item (block_q), head dim (block_d)."""
    k, depth = cfg.top_k, cfg.depth
    return dict(block_a=_pow2(depth + 1), block_c=_pow2(k + depth * k * k, 16),
                block_q=_pow2(k * (cfg.num_attention_heads // cfg.num_key_value_heads), 16),
                block_d=_pow2(cfg.head_dim, 16))


@dataclass(frozen=True)
class LaunchPlan:
    """The batch-size-only part of a launch (``Launcher.plan``): ``wide`` (split-K phases, wide
    lm_head), ``fused`` (one attention phase), ``qh`` (the hidden-half QKV stream, ``qh_vec``: its
    rows 16-byte aligned), ``part_elems`` split-K scratch per tree row,
    the slab sizes, and the compile-time constants except
    those that depend on the call's tensors (VEC_W, VEC_KV, VEC_QH, HAS_D2T, HAS_FCB) and launch mode."""

    wide: bool
    fused: bool
    qh: bool
    sel: bool  # MERGE runs SELECT; the schedule has no SELECT entries
    tab: bool  # the tree depths read the embedding-QKV table (``kernels.table``): no PREP3 / QKV entries
    pack: bool  # gate, up and lm_head streamed from packed copies (Tuning.pack_weights)
    qh_vec: bool
    part_elems: int
    slabs: dict  # the kernel's run-time slab sizes (RP_*, RPS_*, SPL_*, NCH), by argument name
    const: dict
    # step launches: per phase, the constants that the context step's launch of that phase
    # replaces (its own tile / query block); empty: none
    ctx_const: dict = field(default_factory=dict)


class LaunchPlanner:
    """Launch geometry of one (config, dtype, grid, tuning, weight formats), with its plans cached
    per batch size. ``formats``: each weight stream's format (``fp8.StreamFormats``); an fp8
    stream's k-chunk is sized by ``Tuning.fp8_stage_bytes`` in narrow launches."""

    def __init__(self, cfg, dtype: torch.dtype, grid: int, tuning: Tuning, formats: Optional[StreamFormats] = None):
        self.cfg, self.dtype, self.grid, self.tuning = cfg, dtype, grid, tuning
        self.formats = formats or StreamFormats()
        self.kp = _pow2(cfg.top_k, 16)
        self.swaps = any(f & SWAP_DOT for f in vars(self.formats).values())  # fp8 streams with swapped dots
        self._plans: dict = {}  # LaunchPlan by (batch size, interpreting)

    @property
    def ret_width(self) -> int:
        """Columns of padded retrieve_indices: D + 2, as pack_tree(max_depth=D+1) gives."""
        return self.cfg.depth + 2

    @property
    def table_bytes(self) -> int:
        """Size of the embedding-QKV table (``kernels.table``): fp32, one row per draft token."""
        cfg = self.cfg
        return 4 * cfg.vocab_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim

    def attn_chunks(self, batch: int) -> int:
        """Context chunks per (sequence, KV head) of the split attention: together with the
        deepest step's depth + 1 ancestor parts, about one item per program at batch 1; when
        batching, at least ``Tuning.attn_chunks`` so the context work spreads evenly."""
        per = self.grid // (_pow2(batch) * self.cfg.num_key_value_heads) - (self.cfg.depth + 1)
        return max(1, per, self.tuning.attn_chunks if batch > 1 else 1)

    def block_rows(self, batch: int) -> int:
        """Activation rows per tile (BM) for a batch: one tile holds every tree row of the
        batch up to ``Tuning.bm_max`` (16 at batch 1 with top_k <= 16)."""
        k = self.cfg.top_k
        return max(self.tuning.BM, min(self.tuning.bm_max, _pow2(_pow2(batch) * k, 16)))

    def qkv_ahead_slab(self, batch: int) -> tuple[int, int, int]:
        """(RP, BNS, BK) of the hidden-half QKV stream during MERGE: its rows spread over the
        programs that merge no tree row (all programs when the grid has none to spare)."""
        cfg, tn = self.cfg, self.tuning
        free = self.grid - batch * cfg.top_k
        nt = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
        return slab(nt, cfg.hidden_size, free if free > 0 else self.grid, self.formats.weight_bytes("qkv", self.dtype),
                    1, tn, self.block_rows(batch), acc_elems=tn.acc_elems, wide=False, stages=tn.lin_stages,
                    x_elsize=self.dtype.itemsize)

    def qkv_ahead(self, batch: int, slab_: Optional[tuple[int, int, int]] = None) -> bool:
        """Whether the launch streams the next depth's QKV over the hidden half of its input
        during MERGE: eagle3 heads whose tree rows fit the batch-1 tile (``Tuning.BM``), when
        each streaming program's slab is one sub-slab (measured faster at batch 1 only: larger
        batches leave too few free programs). ``slab_``: ``qkv_ahead_slab(batch)`` if known."""
        if self.cfg.architecture != "eagle3":
            return False
        bm = self.block_rows(batch)
        if bm > self.tuning.BM or bm >= self.tuning.wide_bm:  # (wide launches split K in their QKV)
            return False
        rp, bns, _ = slab_ or self.qkv_ahead_slab(batch)
        return rp <= bns

    def row_tiles(self, batch: int) -> tuple[int, int]:
        """(BM, BM2): the activation tile(s) of the weight-streaming phases. Narrow launches use
        one tile, BM = ``block_rows``. Wide ones (``block_rows >= wide_bm``) cover the B*K tree
        rows with two power-of-two tiles when that pads less (160 rows: 128 + 32 instead of 256):
        the tensor-core work and the activation traffic of every weight chunk scale with the
        padded width, and at batch 16 these GEMMs are bound by them rather than by the weight
        stream. Launches with swapped fp8 dots (``self.swaps``) take one tile where it has at
        most ``SWAP_ROWS`` rows (40 rows: 64, not 32 + 16): only one tile's dots swap."""
        bm = self.block_rows(batch)
        rows = batch * self.cfg.top_k
        tn = self.tuning
        if bm < tn.wide_bm or rows > tn.bm_max:
            return bm, 0
        lo = max(16, 1 << (rows.bit_length() - 1))
        if rows <= lo:
            return lo, 0
        hi = _pow2(rows - lo, 16)
        one = min(bm, 2 * lo)
        if hi == lo or lo + hi >= bm or (self.swaps and one <= SWAP_ROWS.value):
            return one, 0  # one power-of-two tile pads no more, or its fp8 dots are swapped (two tiles' are not)
        return lo, hi


    def plan(self, batch: int) -> "LaunchPlan":
        """What a launch for ``batch`` sequences needs that depends on nothing but the batch size
        (and this drafter's config, dtype, grid and tuning, all fixed when it is made - replace
        the drafter rather than its ``tuning``): tiles, slabs, schedule and most
        compile-time constants. Computed once per batch size: every call of a generation loop
        would otherwise redo the same ~50 small computations on the host before its launch."""
        key = (batch, interpreting())
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self._make_plan(batch)
        return p

    def _make_plan(self, nb: int) -> "LaunchPlan":
        cfg, tn = self.cfg, self.tuning
        bmp = self.block_rows(nb)  # the unsplit linear phases' one tile (see drafter_kernel)
        wide = bmp >= tn.wide_bm
        bm, bm2 = self.row_tiles(nb)
        # one attention item per (sequence, KV head) once those items fill half the grid
        fused = tn.fused_attention and nb > 1 and 2 * _pow2(nb) * cfg.num_key_value_heads >= self.grid
        eagle3 = cfg.architecture == "eagle3"
        nkv_heads = cfg.num_key_value_heads
        nch = self.attn_chunks(nb)
        h, el, g = cfg.hidden_size, self.dtype.itemsize, self.grid
        # bytes per weight element of each stream (fp8: 1), beside the activations' el
        w_fc, w_qkv, w_o, w_gu, w_d, w_lm = (self.formats.weight_bytes(s, self.dtype)
                                            for s in ("fc", "qkv", "o", "gu", "d", "lm"))
        nq, nkv = cfg.num_attention_heads * cfg.head_dim, nkv_heads * cfg.head_dim
        attn_in = 2 * h if eagle3 else h
        fc_in = cfg.feature_size if eagle3 else 2 * h
        acc = tn.wide_acc_elems if wide else tn.acc_elems
        st_lin, st_gu, st_lm = (s or tn.num_stages for s in (tn.lin_stages, tn.gu_stages, tn.lm_stages))
        rp_fc, bns_fc, bk_fc = slab(h, fc_in, g, w_fc, 1, tn, bmp, acc_elems=acc, wide=wide, stages=st_lin, x_elsize=el)
        rp_qkv, bns_qkv, bk_qkv = slab(nq + 2 * nkv, attn_in, g, w_qkv, 1, tn, bmp, acc_elems=acc, wide=wide,
                                       stages=st_lin, x_elsize=el)
        # wide launches split K in the tree depths' o_proj and down, so their unsplit forms serve only
        # the context step, whose rows there are one per sequence: sized for that tile (BMP_B), not
        # for the tree rows' (a 256-row tile for 16 rows cut down's k-chunk to 128 columns)
        bmb = max(16, _pow2(nb)) if wide else bmp
        rp_o, bns_o, bk_o = slab(h, nq, g, w_o, 1, tn, bmb, acc_elems=acc, wide=wide, stages=st_lin, x_elsize=el)
        rp_gu, bns_gu, bk_gu = slab(cfg.intermediate_size, h, g, w_gu, 2, tn, bm + bm2, acc_elems=acc, wide=wide,
                                    stages=st_gu, x_elsize=el)
        rp_d, bns_d, bk_d = slab(h, cfg.intermediate_size, g, w_d, 1, tn, bmb, acc_elems=acc, wide=wide, stages=st_lin,
                                 x_elsize=el)
        rp_lm, bns_lm, bk_lm = slab(cfg.vocab_size, h, g, w_lm, 1, tn, bm + bm2, acc_elems=acc, wide=wide,
                                    stages=st_lm, x_elsize=el)
        s_qkv, rps_qkv, bnss_qkv, bks_qkv = split_slab(nq + 2 * nkv, attn_in, g, w_qkv, tn, bm + bm2, acc, wide, st_lin,
                                                       x_elsize=el)
        s_o, rps_o, bnss_o, bks_o = split_slab(h, nq, g, w_o, tn, bm + bm2, acc, wide, st_lin, x_elsize=el)
        s_d, rps_d, bnss_d, bks_d = split_slab(h, cfg.intermediate_size, g, w_d, tn, bm + bm2, acc, wide, st_lin,
                                               x_elsize=el)
        rp_qh, bns_qh, bk_qh = slab_qh = self.qkv_ahead_slab(nb)

        def fold(bns: int, bk: int, bm_: int = bmp, acc_: int = acc, wide_: bool = wide) -> int:
            f = tn.lin_fold  # the largest power of two <= lin_fold that fits
            while f > 1 and (wide_ or bk % f or bk // f < 16 or f * f * bns * bm_ > 4 * acc_):
                f //= 2
            return max(f, 1)

        def ways(fmt: int, bns: int, bk: int, bm_: int, folded: int, kd: int, acc_: int = acc, wide_: bool = wide,
                 stages: int = st_lin) -> tuple[int, int]:
            """(ways, k-chunk) of an unsplit fc / o_proj / down stream (h rows; its slab sized with
            ``acc_`` / ``wide_`` / ``stages``) that would fold ``folded`` ways: a swapped stream
            of a 16-row tile splits instead (the kernel splits every such stream with ways > 1),
            into ``Tuning.swap_split`` k-slices (the warps' count: one each) while the slices keep
            16 columns and the accumulator stays within a narrow fold's bound, in k-chunks of up
            to ``Tuning.split_bk`` columns; any other stream keeps its fold and k-chunk."""
            if not fmt & SWAP_DOT or bm_ != 16 or folded == 1:
                return folded, bk
            bk = slab(h, kd, g, 1, 1, tn, bm_, acc_elems=acc_, wide=wide_, stages=stages, x_elsize=el,
                      bk_max=tn.split_bk)[2]
            s = tn.swap_split
            while s > 1 and (bk % s or bk // s < 16 or s * bm_ * bns > 4 * tn.acc_elems):
                s //= 2
            return s, bk

        qh = self.qkv_ahead(nb, slab_qh)
        pack = tn.pack_weights and not wide and bm + bm2 <= tn.BM
        sel = not wide and qh  # MERGE runs SELECT where it streams the QKV hidden half beside it
        # the embedding-QKV table where it fits Tuning.emb_table_mb (and the int32 offsets of its kernels)
        tab = (sel and tn.pack_weights and self.table_bytes <= tn.emb_table_mb * 10**6
               and self.table_bytes // 4 < 2**31 and cfg.vocab_size * h < 2**31)
        # the context step's small tile (Tuning.ctx_rows): its own sub-slabs, k-chunks and fold
        bmc = max(16, _pow2(nb * tn.ctx_rows)) if wide and tn.ctx_rows > 0 else 0
        if bmc >= bmp:
            bmc = 0
        bns_fcc = bk_fcc = bns_qkvc = bk_qkvc = 16
        fold_c, st_fc_c = 1, st_lin
        if bmc:  # (narrow accumulators and folds, as a narrow launch of that many rows has)
            _, bns_fcc, bk_fcc = slab(h, fc_in, g, w_fc, 1, tn, bmc, acc_elems=tn.acc_elems, wide=True, stages=st_lin,
                                      x_elsize=el)
            fold_c = fold(bns_fcc, bk_fcc, bmc, tn.acc_elems, False)
            if fold_c > 1 and bmc >= 64 and tn.fold_stages:  # folded streams of 64+ rows: fold_stages deep
                st_fc_c = tn.fold_stages
                _, bns_fcc, bk_fcc = slab(h, fc_in, g, w_fc, 1, tn, bmc, acc_elems=tn.acc_elems, wide=True,
                                          stages=st_fc_c, x_elsize=el)
                fold_c = fold(bns_fcc, bk_fcc, bmc, tn.acc_elems, False)
            fold_c, bk_fcc = ways(self.formats.fc, bns_fcc, bk_fcc, bmc, fold_c, fc_in, tn.acc_elems, True, st_fc_c)
            _, bns_qkvc, bk_qkvc = slab(nq + 2 * nkv, attn_in, g, w_qkv, 1, tn, bmc, acc_elems=tn.acc_elems, wide=True,
                                        stages=st_lin, x_elsize=el)
        bnp_lm = _pow2(rp_lm, 16)  # the lm_head slab's rows, padded (the 32-bit keys index them in 16 bits)
        ctx_const = {}
        if wide:
            # the context step's gate/up and lm_head stream for one row per sequence: in step
            # launches (each phase its own build) they take a tile of pow2(batch) rows with narrow
            # accumulators and the register lm_head, as a narrow launch of that many rows does
            # (the slabs keep the wide alignment, so RP_GU / RP_LM stay the plan's)
            _, bns_guc, bk_guc = slab(cfg.intermediate_size, h, g, w_gu, 2, tn, bmb, acc_elems=tn.acc_elems,
                                      wide=True, stages=st_gu, x_elsize=el)
            _, bns_lmc, bk_lmc = slab(cfg.vocab_size, h, g, w_lm, 1, tn, bmb, acc_elems=tn.acc_elems, wide=True,
                                      stages=st_lm, x_elsize=el)
            ctx_const[Phase.GATEUP] = dict(BM=bmb, BM2=0, BNS_GU=bns_guc, BK_GU=bk_guc)
            ctx_const[Phase.LMHEAD] = dict(BM=bmb, BM2=0, BNS_LM=bns_lmc, BK_LM=bk_lmc, LM_WIDE=False)
            ctx_const[Phase.MERGE] = dict(MG_ROWS=False)  # (that lm_head leaves per-program partials)
        if fused:
            # the fused attention's context step has one row per sequence: a query block of one
            # row's heads (the tree depths' holds top_k rows')
            ctx_const[Phase.ATTN_F] = dict(BLOCK_Q=_pow2(cfg.num_attention_heads // nkv_heads, 16))
        # wide launches fold the unsplit o_proj and down too: they serve only the context step's
        # one row per sequence there, on a tile of BMP_B rows (as narrow launches do)
        def fold_b(bns: int, bk: int) -> int:  # (o_proj and down, on the BMP_B tile)
            return fold(bns, bk, bmb, tn.acc_elems, False) if wide else fold(bns, bk)

        fm = self.formats
        f_fc, bk_fc = ways(fm.fc, bns_fc, bk_fc, bmp, fold(bns_fc, bk_fc), fc_in)
        f_o, bk_o = ways(fm.o, bns_o, bk_o, bmb, fold_b(bns_o, bk_o), nq)
        f_d, bk_d = ways(fm.d, bns_d, bk_d, bmb, fold_b(bns_d, bk_d), cfg.intermediate_size)
        folds = [(f_fc, bns_fc, bk_fc, bmp), (f_o, bns_o, bk_o, bmb), (f_d, bns_d, bk_d, bmb)]
        st_fold = (tn.fold_stages or st_lin) if (bmb if wide else bmp) >= 64 else st_lin
        if any(f > 1 and st_fold * (bns + t) * bk * el > tn.smem_bytes for f, bns, bk, t in folds):
            st_fold = st_lin
        key32_mg = el == 2 and cfg.vocab_size <= 65536  # 16-bit value + 16-bit index keys fit
        bv_mg = min(_pow2(cfg.vocab_size, 16), max(16, tn.merge_chunk if key32_mg else tn.merge_chunk // 2))
        # the workspace's block sizes depend on the config alone (not on its capacity)
        bs = block_sizes(cfg)
        const = dict(
            QH=qh, BNS_QH=bns_qh, BK_QH=bk_qh, ST_LIN=st_lin, ST_GU=st_gu, ST_LM=st_lm,
            BMC=bmc, BNS_FCC=bns_fcc, BK_FCC=bk_fcc, FOLD_FCC=fold_c, ST_FCC=st_fc_c, BNS_QKVC=bns_qkvc,
            BK_QKVC=bk_qkvc,
            FOLD_FC=folds[0][0], FOLD_O=folds[1][0], FOLD_D=folds[2][0], ST_FOLD=st_fold,
            BMK_LM=tn.lm_stat_rows, KEY16_LM=el == 2 and bnp_lm <= 65536,
            KEY32_MG=key32_mg, PACK_W=pack,
            MG_ROWS=wide and cfg.vocab_size <= 65536, BV_MG=bv_mg, G_MG=min(tn.merge_group, bv_mg),
            SEL_MG=sel, TAB=tab, BLOCK_QKV=_pow2(nq + 2 * nkv) if tab else 16,
            KEY32_SEL=el == 2 and cfg.top_k ** 2 <= 65536,
            EAGLE3=eagle3, IEEE=self.dtype == torch.float32,
            BM=bm, BM2=bm2, BMP=bmp, BMP_B=bmb, KP=self.kp,
            BNS_FC=bns_fc, BK_FC=bk_fc, BNS_QKV=bns_qkv, BK_QKV=bk_qkv, BNS_O=bns_o, BK_O=bk_o,
            BNS_GU=bns_gu, BK_GU=bk_gu, BNS_D=bns_d, BK_D=bk_d, BNS_LM=bns_lm, BK_LM=bk_lm,
            LM_WIDE=wide, BNP_LM=bnp_lm,
            SPLITK=wide, BNSS_QKV=bnss_qkv, BKS_QKV=bks_qkv, BNSS_O=bnss_o, BKS_O=bks_o, BNSS_D=bnss_d, BKS_D=bks_d,
            BLOCK_H=_pow2(cfg.hidden_size), BLOCK_D=bs["block_d"], BLOCK_R=_pow2(cfg.num_attention_heads + nkv_heads),
            BLOCK_Q=bs["block_q"], BLOCK_CH=_pow2(nch + cfg.depth + 1),
            BLOCK_NA=(tn.BLOCK_NA or 64) if not interpreting() else 16,
            BLOCK_NF=tn.fused_block_n if not interpreting() else 16, BLOCK_A=bs["block_a"], BLOCK_K=_pow2(cfg.top_k),
            BLOCK_P=_pow2(-(-cfg.vocab_size // rp_lm)), BLOCK_C=bs["block_c"],
            BLOCK_T=_pow2(cfg.total_token), BLOCK_W=_pow2(self.ret_width),
            num_warps=tn.wide_num_warps if wide else tn.num_warps, num_stages=tn.num_stages,
            # Contracted multiply-adds, pinned: what every measurement and parity run so far compiled
            # with (Triton's default until 3.9; 3.10 turns the default off, which changes bits and speed).
            enable_fp_fusion=True,
            **self.formats.const(),
        )
        return LaunchPlan(
            wide=wide, fused=fused, qh=qh, sel=sel, tab=tab, pack=pack, qh_vec=h * w_qkv % 16 == 0,
            part_elems=max(s_qkv * (nq + 2 * nkv), s_o * h, s_d * h) if wide else 0,
            slabs=dict(RP_FC=rp_fc, RP_QKV=rp_qkv, RP_O=rp_o, RP_GU=rp_gu, RP_D=rp_d, RP_LM=rp_lm, NCH=nch,
                       RPS_QKV=rps_qkv, RPS_O=rps_o, RPS_D=rps_d, SPL_QKV=s_qkv, SPL_O=s_o, SPL_D=s_d, RP_QH=rp_qh),
            const=const, ctx_const=ctx_const,
        )


    def step_grid(self, code: int, nb: int, n_rows: int) -> int:
        """Programs of the step launch of schedule entry ``code`` : the
        phases that loop over a few items - sequences (SELECT, FINAL), rows (PREP, RoPE, the
        post-attention norm) or attention parts - launch at most one program per item; the
        weight streams (their slabs are sized for the whole grid), MERGE (one partial per
        lm_head program) and the final norm (its second half is placed after the rows'
        programs) keep the grid where they stream the next depth's QKV. At the tree depths the
        row phases otherwise get one program per row, more than the grid where there are more
        rows (their builds are small, several programs fit on an SM, so no
        program takes two rows in turn)."""
        ph, i = divmod(code, 256)
        cfg = self.cfg
        ctx = i == CONTEXT_STEP
        rows_in = n_rows if ctx else nb * cfg.top_k
        kv = nb * cfg.num_key_value_heads
        parts = self.attn_chunks(nb) + (0 if ctx else i + 1)
        items = {
            Phase.SELECT: nb, Phase.FINAL: nb, Phase.PREP3: rows_in, Phase.PREP2: rows_in, Phase.ROPE: rows_in,
            Phase.NORM_POST: nb if ctx else nb * cfg.top_k, Phase.ATTN: kv * parts, Phase.ATTN2: kv * parts,
            Phase.ATTN3: kv * (block_sizes(cfg)["block_q"] // 16), Phase.ATTN_F: kv,
        }.get(ph)
        rows = nb if ctx else nb * cfg.top_k
        ahead = (ctx and cfg.depth > 0) or (not ctx and i + 1 < cfg.depth)
        if ph in (Phase.MERGE, Phase.NORM_F) and not (ahead and self.plan(nb).qh):
            return max(1, rows)
        if not ctx and ph in (Phase.PREP3, Phase.PREP2, Phase.ROPE, Phase.NORM_POST):
            return max(1, rows)
        return self.grid if items is None else max(1, min(self.grid, items))
