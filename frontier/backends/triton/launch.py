"""Typed launchers of the fused drafter: workspace, schedule, grid, and the launch itself.

The schedule is the list of phases one draft call runs (``kernels.drafter_kernel`` walks it):

    context step:  [PREP2, FC] (eagle2) | [FC, PREP3] (eagle3), QKV, ROPE, ATTN (3 phases), OPROJ,
                   NORM_POST, GATEUP, DOWN, [NORM_F], LMHEAD, MERGE, SELECT
    each depth i:  [PREP2, FC] | [PREP3], QKV, ROPE, ATTN (3 phases), OPROJ, NORM_POST, GATEUP, DOWN,
                   [NORM_F], LMHEAD, MERGE, SELECT
    end:           FINAL

Launches whose MERGE streams the next depth's QKV hidden half (batch 1, eagle3;
``Tuning.select_in_merge``) drop the SELECT entries: MERGE runs SELECT.
Big batches use a variant (``build_schedule``): one fused attention phase, and split-K QKV,
o_proj and down, each followed by its reduction phase.

``mode="persistent"`` (GPU) runs the whole schedule in one cooperative launch with a bounded
grid barrier between entries; ``mode="steps"`` launches one entry at a time on the same grid
(the interpreter path, and a debugging aid on GPU); ``mode="graph"`` captures the step launches
once per batch size as a CUDA graph and replays it (the per-call inputs and metadata live in
fixed workspace buffers, refreshed before each replay; the number of new rows is read from the
metadata, so it may change between replays up to the workspace's row capacity).
"""

from __future__ import annotations

import inspect
import math
import os
import weakref
from dataclasses import dataclass, field, fields
from typing import Optional

import torch

from ...errors import KernelError
from . import kernels as K_

_GRID_CACHE: dict[int, int] = {}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(n: int, lo: int = 1) -> int:
    return max(lo, 1 << max(0, (int(n) - 1).bit_length()))


def num_sms(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _GRID_CACHE:
        _GRID_CACHE[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _GRID_CACHE[idx]


def build_schedule(architecture: str, depth: int, split_k: bool = False, fused_attention: bool = False,
                   inline_sums: bool = False, select_in_merge: bool = False) -> list[int]:
    """Schedule entries ``phase * 256 + depth`` (depth 255 = the context step). ``split_k`` (wide
    launches) adds the reductions of the tree depths' split-K QKV, o_proj and down;
    ``fused_attention`` (batched launches) runs attention as one phase instead of three.
    ``inline_sums`` (with ``split_k``): the phase after each split-K phase sums its partials
    itself - RoPE the QKV's, the norm after o_proj the o_proj's and, for eagle3, the final norm
    down's - so no reduction is a phase of its own (eagle2's down keeps its own: no norm follows).
    ``select_in_merge`` (narrow launches only: without ``split_k``): no SELECT entries - MERGE
    runs each sequence's SELECT itself (the kernel's SEL_MG)."""
    if architecture == "eagle3":
        ctx_head, tree_head = [K_.PH_FC, K_.PH_PREP3], [K_.PH_PREP3]
        tail = [K_.PH_QKV, K_.PH_ROPE, K_.PH_ATTN, K_.PH_ATTN2, K_.PH_ATTN3, K_.PH_OPROJ, K_.PH_NORM_POST,
                K_.PH_GATEUP, K_.PH_DOWN, K_.PH_NORM_F, K_.PH_LMHEAD, K_.PH_MERGE, K_.PH_SELECT]
    else:
        ctx_head = tree_head = [K_.PH_PREP2, K_.PH_FC]
        tail = [K_.PH_QKV, K_.PH_ROPE, K_.PH_ATTN, K_.PH_ATTN2, K_.PH_ATTN3, K_.PH_OPROJ, K_.PH_NORM_POST,
                K_.PH_GATEUP, K_.PH_DOWN, K_.PH_LMHEAD, K_.PH_MERGE, K_.PH_SELECT]
    if fused_attention:
        at = tail.index(K_.PH_ATTN)
        tail = tail[:at] + [K_.PH_ATTN_F] + tail[at + 3:]
    if select_in_merge and not split_k:
        tail = [p for p in tail if p != K_.PH_SELECT]
    tree_tail = list(tail)
    if split_k:
        reds = []
        if not inline_sums:
            reds += [(K_.PH_QKV, K_.PH_RED_QKV), (K_.PH_OPROJ, K_.PH_RED_O)]
        if not (inline_sums and architecture == "eagle3"):  # (eagle2 has no final norm: lm_head reads h2)
            reds.append((K_.PH_DOWN, K_.PH_RED_D))
        for ph, red in reds:
            tree_tail.insert(tree_tail.index(ph) + 1, red)
    sched = [p * 256 + K_.CTX_DEPTH for p in ctx_head + tail]
    for i in range(depth):
        sched += [p * 256 + i for p in tree_head + tree_tail]
    sched.append(K_.PH_FINAL * 256)
    return sched


@dataclass
class Tuning:
    """Block sizes and launch shape (compile-time constants of the kernel).

    Each weight-streaming phase gives every program one slab of ``ceil(N / grid)`` rows (rounded
    up to ``slab_align``, ``wide_slab_align`` in wide launches), walked in sub-slabs of at most
    ``acc_elems / BM`` rows (one sub-slab at batch 1); its k-chunk is sized so that one pipeline stage holds about ``stage_bytes`` of weights (and
    at most that much of the activation tile).
    """

    BM: int = 16  # activation rows per tile at batch 1 (>= 16 for tl.dot)
    bm_max: int = 256  # largest activation tile when batching
    acc_elems: int = 4096  # fp32 accumulator elements per program per weight matrix (sub-slab rows x BM)
    # wide tiles (BM >= wide_bm, i.e. big batches): larger accumulators, and the
    # lm_head's statistics taken from a logits scratch instead of registers
    # (H200, 8B batch 16: 8 warps 5.35 ms, 16 warps 5.96 ms - with 8 warps the two warpgroups split
    # the weight rows only, so each wgmma spans all activation rows; 40960 elements = 160 fp32
    # registers per thread: 65536 gave the same batch-16 tiles but spilled at batch 64, 48 vs 18 ms)
    wide_bm: int = 128
    wide_acc_elems: int = 40960
    wide_num_warps: int = 8
    split_rows: int = 128  # wide launches split K in QKV / o_proj / down until slabs hold ~this many rows
    # a slab's rows are a multiple of this: 1 splits batch-1 streams most evenly over the grid;
    # wide launches keep 16 (H200, 8B batch 1: 2.95 vs 2.99 ms; batch 16: 8.1 vs 7.1 ms with 1)
    slab_align: int = 1
    wide_slab_align: int = 16
    stage_bytes: int = 32768
    smem_bytes: int = 225280  # pipeline buffers of one program (H100/H200: 227 KB per block)
    # lm_head's own (None: stage_bytes); tenth session, H200, device ms, lm_head 4 stages of 32 KB
    # vs 3 of 64 KB: 8B batch 1 2.511 / 2.513 vs 2.530 / 2.531, batch 4 3.846 vs 3.889, batch 16
    # 4.649 vs 4.648; 1B batch 1 1.544 vs 1.597, batch 16 2.978 vs 2.996
    lm_stage_bytes: Optional[int] = 32768
    num_warps: int = 8
    num_stages: int = 3
    # software-pipeline stages of the weight streams' k-loops (None: num_stages): the linear
    # phases (fc, QKV, o_proj, down), gate/up, the lm_head; each phase's k-chunk shrinks until
    # its stages fit in smem_bytes. Tenth session, H200, 8B depth 7, device ms: linear phases 2
    # stages 2.822, 3 2.560, 4 2.608 (down and o_proj unchanged, the QKV stream in MERGE slower);
    # gate/up 4 stages 2.540 / 2.522 / 2.533 vs 3 2.560 / 2.551 / 2.552, 5 2.530 (batch 4 3.889
    # vs 3.876, batch 16 4.668 vs 4.664; 1B 1.594 both)
    lin_stages: Optional[int] = None
    gu_stages: Optional[int] = 4
    lm_stages: Optional[int] = 4
    # context keys per attention block (split attention); None: 32 at batch 1, 64 above (H200,
    # seventh session: 8B batch 1 2.556 vs 2.582 ms, 1B 1.589 vs 1.605; batch 4 0.2-0.4% slower)
    BLOCK_NA: Optional[int] = None
    attn_chunks: int = 4  # least context chunks per (sequence, KV head) when batching (split attention)
    fused_attention: bool = True  # big batches: attention as one phase per (sequence, KV head)
    fused_block_n: int = 64  # context keys per block of the fused attention
    lm_halves: int = 1  # 2: stream each lm_head sub-slab as two half-height tiles per stage
    grid: Optional[int] = None  # None: one program per SM (GPU) / 2 (interpreter)
    vec_w: bool = True  # declare the QKV weight rows 16-byte aligned when proven (Drafter.vec16)
    vec_kv: bool = True  # the same for the caches' K/V offsets
    # wide launches: tiles of BM + BM2 activation rows (two powers of two, e.g. 128 + 32 for 160
    # tree rows) instead of one tile padded to the next power of two
    exact_rows: bool = True
    # mode="persistent" on a GPU: replay the one cooperative launch as a CUDA graph once the same
    # arguments come back (skips Triton's per-launch argument binding, ~0.1-0.3 ms of host time)
    persistent_graph: bool = True
    # eagle3, batch 1 (see Drafter.qkv_ahead): stream the next depth's QKV over the hidden half of
    # its input during MERGE (it depends only on the parent row); the QKV phase then streams half
    qkv_ahead: bool = True
    # the grid barrier's acquire (kernels._grid_sync): 0 an atomic add of 0 after the polls,
    # 1 an acquiring load after them, 2 acquiring polls. Eleventh session, H200, 8B depth 7,
    # device ms: 2 2.466 / 2.469 vs 0 2.507 / 2.508 (1 2.519 / 2.523); a barrier releases its
    # programs ~1.5 us after the last arrival (per-program stamps, scripts/batch_variants.py --stamps)
    barrier: int = 2
    # the unsplit fc / o_proj / down streams of narrow launches fold each k-chunk up to this many
    # ways (kernels._stream_folded): the largest power of two whose folded accumulator (fold^2 x
    # sub-slab rows x activation rows) stays within 4 x acc_elems and whose folds keep >= 16
    # columns (1: off). Wide launches keep their tree rows' streams unfolded and fold only the
    # context step's small tiles: the fc on its ctx_rows tile, and the unsplit o_proj and down,
    # which serve only the context step's one row per sequence there (BMP_B = pow2(batch) rows).
    # Eleventh session, H200, 8B depth 7, device ms: batch 1 (fold 4) 2.476 / 2.481 vs 2.531 /
    # 2.530 unfolded (down 0.279 -> 0.239 ms per call, o_proj 0.110 -> 0.103, the context
    # step's fc and down -10 us); batch 4 (fold 2) 3.753 / 3.754 vs 3.791 / 3.788
    lin_fold: int = 4
    # software-pipeline stages of the folded streams where their activation tile has >= 64 rows
    # (at top_k 10 batches 4 to 6, and wide launches' context tiles of 64+ rows; None: the
    # linear phases' stages), if every folded stream's stages fit in smem_bytes. Twelfth session, H200, device ms: 8B depth 7 batch 4 (fold 2) 3.666 / 3.679 vs
    # 3.753 / 3.760 with 3; at batch 1 (16-row tile, fold 4) 4 stages are slower (2.431 / 2.434 vs
    # 2.413 / 2.418: o_proj 0.100 -> 0.107 ms per call), 1B batch 1 the same within 0.5%
    fold_stages: Optional[int] = 4
    # the wide lm_head's statistics (kernels._lm_slab_stats): activation rows per tile; and for
    # 16-bit dtypes 32-bit ranking keys in the lm_head's K rounds of row maxima instead of 64-bit
    # ones (wide launches, and narrow ones whose slab is one sub-slab; slabs up to 65536 rows).
    # Fourteenth session, H200, the batch-16 lm_head phase alone (scripts/wide_probe.py): 141.4 us
    # with 16 rows and 64-bit keys, 118.7 with 32 rows and 32-bit keys (the statistics 55.9 -> 33.5
    # us; 64 rows: 46.1)
    lm_stat_rows: int = 32
    lm_key32: bool = True
    # MERGE (kernels._ph_merge): with 16-bit dtypes and vocabularies up to 65536, 32-bit ranking
    # keys in its K rounds of maxima. Eighteenth session, H200, 8B depth 7, device ms, with
    # row_grids' MERGE part vs neither: graph batch 16 3.237 / 3.237 vs 3.369 / 3.372 (MERGE per
    # call 0.135 -> 0.052), batch 64 11.085 / 11.069 vs 11.363 / 11.356; persistent batch 16
    # 4.103 / 4.108 vs 4.224 / 4.215, batch 1 2.372 / 2.369 vs 2.394 / 2.394
    merge_key32: bool = True
    # wide launches, vocabularies up to 65536 (larger ones keep the lm_head's own statistics): the
    # lm_head programs write their logits scratch only, and MERGE (one program per row) takes each
    # row's max, sum of exp and top-K log-probs from it (kernels._ph_merge_rows: chunks of
    # merge_chunk logits, half that with 64-bit keys; K rounds over the best of each group of
    # merge_group logits, then over the K best groups' entries), instead of every lm_head program
    # ranking its slab for all rows after its stream. Twenty-first session, H200, 8B depth 7,
    # device ms, batch 16, graph: chunks of 16384 2.905 / 2.910 vs 2.982 / 2.987 off (32768:
    # 2.885); on another machine 16384 2.892 / 2.907, 32768 2.881 / 2.893, groups of 16 / 32
    # 2.925 / 2.917, MERGE on 4 warps 2.888, on 16 (32768) 2.868. Breakdown without PDL, ms per
    # call (16384, first machine): lm_head 0.779 -> 0.559, MERGE 0.053 -> 0.151. Persistent 3.857
    # vs 3.993. 1B preset batch 16: graph 1.616 / 1.623 vs 1.705 / 1.694, persistent 2.445 vs 2.502
    merge_rows: bool = True
    merge_chunk: int = 32768
    merge_group: int = 8
    merge_warps: Optional[int] = None  # step launches: the tree depths' MERGE builds with merge_rows (None: the launch's)
    # step launches, tree depths: the phases that loop over the rows and stream no weights (PREP,
    # RoPE, the post-attention norm, MERGE and the final norm where they stream no QKV ahead) get
    # one program per row, more than the grid where there are more rows (their builds are small:
    # several programs fit on an SM), so that no program takes two rows one after the other
    # (batch 16: 160 tree rows on a 132-program grid). Eighteenth session, H200, 8B depth 7,
    # graph, device ms, on vs off (with inline_sums): batch 16 3.042 / 3.039 vs 3.123 / 3.121,
    # batch 64 10.687 / 10.668 vs 11.067 / 11.093, batch 4 3.109 / 3.110 vs 3.088 / 3.109
    row_grids: bool = True
    # narrow launches (wide ones keep PH_SELECT): SELECT is no phase of its own; the MERGE
    # program that merges a sequence's last row runs it (kernel SEL_MG), beside the programs
    # still streaming the next depth's QKV hidden half at batch 1 (eagle3), and without a launch
    # or barrier of its own elsewhere. Twenty-second session, H200, batch 1 depth 7, device ms,
    # on vs off, three alternated pairs: 8B graph 1.957 / 1.963 / 1.964 vs 1.998 / 1.999 / 1.999,
    # persistent 2.341 / 2.339 / 2.336 vs 2.381 / 2.381 / 2.392; 1B graph 1.058 / 1.074 / 1.073
    # vs 1.076 (x3), persistent 1.334 / 1.328 / 1.335 vs 1.335 / 1.334 / 1.336 (its QKV half is too
    # short a stream to hide SELECT behind); bf16 tokens the same. None (the default): only where
    # MERGE streams that QKV half (``LaunchPlan.qh``: batch 1, eagle3); with nothing to hide it
    # behind it is no gain. Twenty-third session, H200, 8B depth 7, graph, device ms, True vs
    # False, two alternated pairs on each of two machines: batch 2 2.228 / 2.233 vs 2.226 / 2.228
    # and 2.212 / 2.215 vs 2.212 / 2.214; batch 4 3.142 / 3.142 vs 3.125 / 3.124 and 3.135 /
    # 3.134 vs 3.119 / 3.117. True: every narrow launch (how the tests run it without QH)
    select_in_merge: Optional[bool] = None
    # wide launches: the context step's fc and QKV (the phases over the call's N new rows) take
    # an activation tile of pow2(batch x ctx_rows) rows (at least 16) with its own k-chunk and
    # fold, whenever N fits in it (the kernel picks at run time; more rows take the tree rows'
    # wide tile, so a long prompt does not stream the weights once per small tile); 0: off.
    # The wide tile (256 rows at batch 16) cut the fc's k-chunk to 128 columns of 32 rows.
    # Eighteenth session, H200, 8B depth 7 (4 new rows per sequence), device ms, ctx_rows 4 vs 0:
    # graph batch 16 3.136 / 3.135 vs 3.248 / 3.238 (context fc 0.108 -> 0.038 ms, QKV 0.069 ->
    # 0.033); persistent batch 16 4.027 / 4.036 vs 4.133 / 4.123
    ctx_rows: int = 4
    # step launches: the context step's phases over one row per sequence get builds of their
    # own (``LaunchPlan.ctx_const``; needs phase_kernels - the persistent launch keeps one build
    # of every phase): in wide launches gate/up and the lm_head take a tile of pow2(batch) rows,
    # narrow accumulators and the register lm_head instead of the tree rows' wide tile; the fused
    # attention takes a query block for one row's heads instead of top_k rows'. Nineteenth
    # session, H200, 8B depth 7, graph, device ms, gate/up and lm_head on vs off: batch 16
    # 2.965 / 2.964 vs 2.999 / 2.997 (context lm_head 0.080 -> 0.070 ms, gate/up 0.083 ->
    # 0.059), batch 64 10.491 / 10.470 vs 10.480 / 10.531; with the attention's too, on vs off:
    # batch 16 2.967 / 2.968 vs 3.013 / 3.018, batch 64 10.583 / 10.564 vs 10.666 / 10.641
    ctx_builds: bool = True
    # wide launches: the phase after each of the tree depths' split-K phases sums its partials
    # itself - RoPE the QKV's, the post-attention norm the o_proj's (+ the residual), eagle3's
    # final norm down's - instead of a reduction phase before it (three phases fewer per depth);
    # in step launches those phases then get one program per row. Eighteenth session, H200, 8B
    # depth 7, device ms, on vs off: graph batch 16 3.069 / 3.067 vs 3.159 / 3.160, batch 64
    # 10.759 / 10.654 vs 11.209 / 11.201; persistent batch 16 4.006 / 4.006 vs 4.029 / 4.029,
    # batch 64 12.787 / 12.788 vs 12.832 / 12.843
    inline_sums: bool = True
    # step launches (mode="steps", and the CUDA graph of mode="graph"): each launch is the kernel
    # built for its schedule entry's phase alone (kernel constexpr PHASE), instead of the whole
    # phase switch with its shared register allocation
    phase_kernels: bool = True
    # step launches: the phases that loop over a few items (sequences, rows, attention parts)
    # launch no more programs than they have items (the weight streams and MERGE keep the grid)
    step_grids: bool = True
    # step launches on sm_90+ (Triton with grid dependency control): every launch is made with
    # programmatic dependent launch - it may start while the one before it runs, and waits in the
    # kernel - so launch latency and program start-up overlap the previous phase.
    # pdl_trigger: when a launch lets the next one start - "start" (right after its own wait),
    # "end" (after its work), "streams_end" (the weight streams after their work, other phases
    # at start), "small" (a weight stream at start only before another stream or a launch of at
    # most pdl_max_grid programs), "small_only" (only before such a launch that is no stream).
    # Sixteenth session, H200, graph mode, device ms, off -> "small": 8B depth 7 batch 1 2.048 ->
    # 1.966, batch 4 3.167 -> 3.135, batch 16 3.445 -> 3.394-3.415; 1B batch 1 1.152 -> 1.092
    # ("start": 1.953 / 3.144 / 3.483 / 1.117; "small_only": 1.974 / 3.147 / 3.404 / 1.092)
    pdl: bool = True
    pdl_trigger: str = "small"
    pdl_max_grid: int = 32
    # the fused (batched) attention's ancestors (kernels._ph_attn_fused): as dense blocks of the
    # sequence's tree keys masked to each row's ancestors, or one gathered key per row and depth.
    # None: blocks in step launches, gathers in the persistent launch. Seventeenth session, H200,
    # 8B depth 7, device ms, blocks vs gathers: graph batch 16 3.328 / 3.326 vs 3.376 / 3.380
    # (attention 0.324 vs 0.369 ms per call), batch 64 11.339 / 11.339 vs 11.566 / 11.562; the
    # persistent launch slower with blocks (batch 16 4.265 / 4.270 vs 4.212 / 4.222, batch 64
    # 13.19 / 13.23 vs 13.08 / 13.06)
    tree_blocks: Optional[bool] = None
    # launches whose tree rows fit one activation tile of BM rows (batch 1 at top_k 10): gate,
    # up and the lm_head are streamed from copies packed per slab (``pack_slabs``: each
    # program's RP rows stored as [k-chunks, RP, BK], so that each pipeline stage reads one
    # contiguous block instead of RP runs of BK elements). Made once per weight tensor and kept
    # by the drafter (``Drafter.packed_bytes``: about the three matrices' size, 498 MB at the 8B
    # preset, 200 MB at 1B).
    # Other launches stream the row-major weights (their tiles differ; a second packing would
    # double the memory). Twenty-fifth session, H200, scripts/stream_probe.py --study blocked
    # (the bare k-loop, % of copy bandwidth, row-major vs packed): 8B lm_head 79.8 vs 82.5,
    # gate 75.5 vs 79.3, QKV 79.3 vs 82.5; 1B lm_head 80.3 vs 82.0, gate 63.1 vs 63.5. In the
    # drafter (batch_variants.py --tunings base,pack_weights=false x3, graph, depth 7, device ms):
    # 8B 1.876 / 1.883 / 1.882 vs 1.940 / 1.944 / 1.945 (per call, no PDL: lm_head 0.503 -> 0.471,
    # gate/up 0.429 -> 0.402), 1B 1.018 / 1.034 / 1.033 vs 1.041 x3. QKV packed as well (its
    # hidden half a second copy, +150 MB at 8B): MERGE 0.110 -> 0.106, QKV 0.120 -> 0.119; not kept.
    # The backend's option pack_weights=False picks a drafter without the copies.
    pack_weights: bool = True

    PDL_TRIGGERS = ("start", "end", "streams_end", "small", "small_only")

    def __post_init__(self):
        if self.pdl_trigger not in self.PDL_TRIGGERS:
            raise ValueError(f"Tuning.pdl_trigger must be one of {', '.join(self.PDL_TRIGGERS)}; "
                             f"got {self.pdl_trigger!r}")

    @classmethod
    def overrides(cls, pairs) -> dict:
        """Field overrides from ``"field=value"`` strings (the scripts' ``--tuning`` / inline
        tunings), each value parsed as its field's type: ``true`` / ``false`` (or 1 / 0) for a
        bool, an integer for an int, ``none`` for an Optional field, else the text. An unknown
        field or a value of the wrong type is a ValueError naming it."""
        types = {f.name: f.type for f in fields(cls)}
        out = {}
        for kv in pairs:
            name, sep, text = kv.partition("=")
            if not sep:
                raise ValueError(f"tuning override {kv!r}: expected field=value")
            if name not in types:
                raise ValueError(f"tuning override {kv!r}: Tuning has no field {name!r} "
                                 f"(fields: {', '.join(sorted(types))})")
            kind = str(types[name])
            low = text.strip().lower()
            if kind.startswith("Optional[") and low == "none":
                out[name] = None
            elif "bool" in kind:
                if low not in ("true", "false", "1", "0"):
                    raise ValueError(f"tuning override {kv!r}: {name} takes true or false")
                out[name] = low in ("true", "1")
            elif "int" in kind:
                try:
                    out[name] = int(text)
                except ValueError:
                    raise ValueError(f"tuning override {kv!r}: {name} takes an integer") from None
            else:
                out[name] = text
        return out


def slab(n_rows: int, kd: int, grid: int, elsize: int, n_mats: int, tn: Tuning, bm: int,
         stage_bytes: Optional[int] = None, acc_elems: Optional[int] = None,
         wide: Optional[bool] = None, stages: Optional[int] = None) -> tuple[int, int, int]:
    """(rows per program RP, sub-slab rows BNS, k-chunk BK) of a weight-streaming phase whose
    activation tile is ``bm`` rows wide (BM + BM2). The k-chunk holds about ``stage_bytes`` of
    weights per stage, and the weight + activation tiles of all ``stages`` (default
    ``num_stages``) stages fit in ``smem_bytes``. ``wide`` (default: ``bm >= wide_bm``) picks
    the slab alignment."""
    per = -(-n_rows // grid)
    if wide is None:
        wide = bm >= tn.wide_bm
    al = max(1, tn.wide_slab_align if wide else tn.slab_align)
    rp = max(al, -(-per // al) * al)
    bnp = _pow2(rp, 16)
    cap = max(16, 1 << max(0, ((acc_elems or tn.acc_elems) // (bm * n_mats)).bit_length() - 1))
    bns = min(bnp, cap)
    sb = stage_bytes or tn.stage_bytes
    bk = min(sb // (bns * elsize * n_mats), tn.smem_bytes // ((stages or tn.num_stages) * (bns * n_mats + bm) * elsize))
    bk = max(16, min(512, 1 << max(0, bk.bit_length() - 1), _pow2(kd, 16)))
    return rp, bns, bk


def split_slab(n_rows: int, kd: int, grid: int, elsize: int, tn: Tuning, bm: int, acc: int,
               wide: Optional[bool] = None, stages: Optional[int] = None) -> tuple[int, int, int, int]:
    """(split factor S, rows per slab RP, sub-slab rows BNS, k-chunk BK) of a split-K phase:
    grid // S slabs of about ``tn.split_rows`` rows, each streamed as S k-ranges."""
    spl = 1
    while spl < 8 and 2 * spl <= grid and n_rows * 2 * spl <= tn.split_rows * grid:
        spl *= 2
    nslab = grid // spl
    rp, bns, bk = slab(n_rows, max(16, -(-kd // spl)), nslab, elsize, 1, tn, bm, acc_elems=acc, wide=wide,
                       stages=stages)
    return spl, rp, bns, bk


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


@dataclass
class SeqCall:
    """One sequence of a (batched) call: its new rows' features [n, F] and token ids [n], its
    root token [1], its cache (holding ``c`` committed rows; the kernel writes rows [c, c+n))."""

    features: torch.Tensor
    ids_new: torch.Tensor
    root: torch.Tensor
    cache: object
    c: int
    n: int


@dataclass(frozen=True)
class LaunchPlan:
    """The batch-size-only part of a launch (``Drafter.plan``): ``wide`` (split-K phases, wide
    lm_head), ``fused`` (one attention phase), ``qh`` (the hidden-half QKV stream, ``qh_vec``: its
    rows 16-byte aligned), ``part_elems`` split-K scratch per tree row,
    the slab scalars that end the kernel's argument list, and the compile-time constants except
    those that depend on the call's tensors (VEC_W, VEC_KV, VEC_QH, HAS_D2T, HAS_FCB) and launch mode."""

    wide: bool
    fused: bool
    qh: bool
    sel: bool  # MERGE runs SELECT (Tuning.select_in_merge); the schedule has no SELECT entries
    pack: bool  # gate, up and lm_head streamed from packed copies (Tuning.pack_weights)
    qh_vec: bool
    part_elems: int
    slab_args: tuple
    const: dict
    # step launches (``Tuning.ctx_builds``): per phase, the constants that the context step's
    # launch of that phase replaces (its own tile / query block); empty: none
    ctx_const: dict = field(default_factory=dict)


class Workspace:
    """Scratch buffers of one draft call, reused across calls: sized for up to ``batch``
    sequences and ``rows`` packed new rows."""

    def __init__(self, cfg, dtype: torch.dtype, device: torch.device, batch: int, rows: int, grid: int, kp: int,
                 attn_chunks: int = 1):
        h, k, d = cfg.hidden_size, cfg.top_k, cfg.head_dim
        nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        depth = cfg.depth
        self.batch, self.rows, self.grid = batch, rows, grid
        bs = self.block_sizes(cfg)
        self.block_a, self.block_c, self.block_q, self.block_d = bs["block_a"], bs["block_c"], bs["block_q"], bs["block_d"]
        self.sk = max(1, depth * k)
        self.C = k + depth * k * k
        self.rpw = 1 + depth * k
        self.pfw = max(self.block_c, cfg.total_token)
        tr = batch * k  # tree rows
        mx = max(rows, tr)
        self.mr = tr

        def e(*shape, dt=dtype):
            return torch.empty(*shape, dtype=dt, device=device)

        self.feat = e(rows, cfg.feature_size if cfg.architecture == "eagle3" else cfg.hidden_size)
        self.ids = e(rows, dt=torch.int64)
        self.root = e(batch, dt=torch.int64)
        self.hcur = e(mx, h)
        self.hres = e(batch, h)
        self.xin = e(mx, 2 * h)
        self.qkv = e(mx, (nh + 2 * nkv) * d)
        self.qr = e(tr, nh * d)
        self.ao = e(tr, nh * d)
        self.h1 = e(tr, h)
        self.n2 = e(tr, h)
        self.act = e(tr, cfg.intermediate_size)
        self.hout = e(tr, h)
        self.nf = e(tr, h)
        # launches with Drafter.qkv_ahead (lazy, [mr, H] / [mr, q+k+v] fp32): the next depth's
        # hidden_norm rows and their QKV partials over the hidden half of its input
        self.xh: Optional[torch.Tensor] = None
        self.qh: Optional[torch.Tensor] = None
        self.tk = e(nkv, batch * self.sk, d)
        self.tv = e(nkv, batch * self.sk, d)
        # attention parts: per (sequence, KV head) NCH context chunks + one part per ancestor (up to
        # depth + 1), each for BLOCK_Q queries; with NCH as ``Drafter.attn_chunks`` picks it, for
        # every B <= batch: B*nkv*(NCH + depth + 1) <= max((chunks + depth + 1)*B*nkv, grid + nkv*(depth + 2))
        parts = max((max(1, attn_chunks) + depth + 1) * batch * nkv, grid + nkv * (depth + 2)) * self.block_q
        self.apm = e(parts, dt=torch.float32)
        self.apl = e(parts, dt=torch.float32)
        self.aacc = e(parts, self.block_d, dt=torch.float32)
        self.lmk = e(grid, self.mr, kp, dt=torch.int64)
        self.lmmax = e(grid, self.mr, dt=torch.float32)
        self.lmsum = e(grid, self.mr, dt=torch.float32)
        self.lml: Optional[torch.Tensor] = None  # lm_head logits scratch [mr, V] of wide launches (lazy)
        self.part: Optional[torch.Tensor] = None  # split-K partials [S, mr, N] fp32 of wide launches (lazy)
        self.meta: Optional[torch.Tensor] = None  # the per-call metadata (device copy, reused)
        self.sel_lp = e(tr, kp, dt=torch.float32)
        self.sel_tok = e(tr, kp, dt=torch.int64)
        self.fr_score = e(tr, dt=torch.float32)
        self.fr_tok = e(tr, dt=torch.int64)
        self.fr_src = e(tr, dt=torch.int32)
        self.fr_pick = e(tr, dt=torch.int64)
        self.anc = torch.zeros(tr, self.block_a, dtype=torch.int32, device=device)
        self.cand_score = e(batch, self.C, dt=torch.float32)
        self.cand_tok = e(batch, self.C, dt=torch.int64)
        self.row_par = e(batch, self.rpw, dt=torch.int64)
        self.cnt = e(batch, self.block_c, dt=torch.int32)
        self.pf = e(batch, self.pfw, dt=torch.int32)
        # [0] the persistent launch's barrier counter, [1] its error flag, [2 + b] sequence b's
        # count of merged rows (SEL_MG: back to 0 after each MERGE)
        self.sync = torch.zeros(2 + batch, dtype=torch.int32, device=device)
        self.times = torch.zeros(1, dtype=torch.int64, device=device)

    @staticmethod
    def block_sizes(cfg) -> dict:
        """The kernel block sizes that follow from the config alone: ancestor slots per row
        (block_a), candidates (block_c), queries per KV-head item (block_q), head dim (block_d)."""
        k, depth = cfg.top_k, cfg.depth
        return dict(block_a=_pow2(depth + 1), block_c=_pow2(k + depth * k * k, 16),
                    block_q=_pow2(k * (cfg.num_attention_heads // cfg.num_key_value_heads), 16),
                    block_d=_pow2(cfg.head_dim, 16))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values() if isinstance(t, torch.Tensor))


class Drafter:
    """Launch state for one (config, dtype, device): workspace, rotary tables, schedule."""

    # position of the split-K scratch in the kernel's argument list
    _PART_ARG = list(inspect.signature(K_.drafter_kernel.fn).parameters).index("part_ptr")
    _QH_ARG = list(inspect.signature(K_.drafter_kernel.fn).parameters).index("xh_ptr")  # xh, qh

    def __init__(self, cfg, dtype: torch.dtype, device: torch.device, tuning: Optional[Tuning] = None):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.tuning = tuning or Tuning()
        if self.tuning.grid is not None:
            self.grid = self.tuning.grid
        elif device.type == "cuda" and not interpreting():
            self.grid = num_sms(device)
        else:
            self.grid = 2
        self.kp = _pow2(cfg.top_k, 16)
        self.ws: Optional[Workspace] = None
        self.cos: Optional[torch.Tensor] = None
        self.sin: Optional[torch.Tensor] = None
        self.schedule_codes = {  # keyed by LaunchPlan (wide, fused, sel); sel only at narrow launches
            (split, fused, sel): build_schedule(cfg.architecture, cfg.depth, split, fused, self.tuning.inline_sums,
                                                sel)
            for split in (False, True) for fused in (False, True) for sel in ((False,) if split else (False, True))
        }
        self.schedules = {key: torch.tensor(codes, dtype=torch.int32, device=device)
                          for key, codes in self.schedule_codes.items()}
        self.schedule = self.schedules[False, False, False]  # the schedule of the last launch
        self.schedule_list = self.schedule_codes[False, False, False]  # the same, on the host
        self.step_grid_list: list[int] = []  # programs per schedule entry of the last step launches
        self.n_steps = len(self.schedule)
        self._graphs: dict = {}  # mode="graph": captured step launches, by batch shape and buffers
        self._pgraphs: dict = {}  # mode="persistent": captured cooperative launches, likewise
        self._pseen: dict = {}  # persistent arguments launched once and not yet captured
        self.graph_error: Optional[str] = None  # why capturing a persistent launch failed (then never retried)
        self._graph_outs: dict = {}
        self._plans: dict = {}  # LaunchPlan by (batch size, interpreting)
        self._two_fit: dict = {}  # whether two programs of a step build fit on one SM, by build
        self._packed: dict = {}  # Tuning.pack_weights: role -> (source ref, its version, rp, bk, packed copy)

    # ------------------------------------------------------------------------------------------
    def packed(self, role: str, w: torch.Tensor, rp: int, bk: int) -> torch.Tensor:
        """The copy of weight ``w`` packed for a stream of RP rows per program in k-chunks of BK
        (``pack_slabs``), made on first use and kept per ``role`` for as long as the same
        tensor, unmodified (its version counter), comes back with the same slab plan; anything
        else replaces it (the old copy is freed before the new one is made), and the copy goes
        when its source tensor is freed. (A change written through ``w.data`` does not move
        ``w``'s version counter, so it is not seen: change weights in place on the tensor
        itself, e.g. ``copy_`` under ``torch.no_grad()``, or draft with ``pack_weights=False``.)"""
        e = self._packed.get(role)
        if e is not None and e[0]() is w and e[1:4] == (w._version, rp, bk):
            return e[4]
        self._packed.pop(role, None)
        t = pack_slabs(w, self.grid, rp, bk)
        packed = self._packed

        def gone(ref, role=role):  # the source tensor was freed: so is its copy
            if packed.get(role, (None,))[0] is ref:
                del packed[role]

        packed[role] = (weakref.ref(w, gone), w._version, rp, bk, t)
        return t

    @property
    def packed_bytes(self) -> int:
        """Device memory held by the packed weight copies (``Tuning.pack_weights``)."""
        return sum(e[4].numel() * e[4].element_size() for e in self._packed.values())

    def workspace(self, batch: int, rows: int) -> Workspace:
        if self.ws is None or self.ws.batch < batch or self.ws.rows < rows:
            cap_b = max(batch, self.ws.batch if self.ws is not None else 1)
            cap_r = _pow2(max(rows, 16, self.ws.rows if self.ws is not None else 0))
            self.ws = Workspace(self.cfg, self.dtype, self.device, cap_b, cap_r, self.grid, self.kp,
                                self.tuning.attn_chunks)
        return self.ws

    def rope_tables(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [P, d] in the compute dtype, computed exactly as torch_ref computes them."""
        if self.cos is None or self.cos.shape[0] < positions:
            from ..torch_ref.layer import rope_cos_sin

            cap = _pow2(max(positions, 256))
            pos = torch.arange(cap, device=self.device)
            cos, sin = rope_cos_sin(self.cfg, pos, self.dtype)
            self.cos, self.sin = cos.contiguous(), sin.contiguous()
        return self.cos, self.sin

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
        return slab(nt, cfg.hidden_size, free if free > 0 else self.grid, self.dtype.itemsize, 1, tn,
                    self.block_rows(batch), acc_elems=tn.acc_elems, wide=False, stages=tn.lin_stages)

    def qkv_ahead(self, batch: int, slab_: Optional[tuple[int, int, int]] = None) -> bool:
        """Whether the launch streams the next depth's QKV over the hidden half of its input
        during MERGE (``Tuning.qkv_ahead``): eagle3 heads whose tree rows fit the batch-1 tile
        (``Tuning.BM``), when each streaming program's slab is one sub-slab. Measured on an H200,
        depth 7, device ms with / without: 8B preset batch 1 2.657 / 2.703; 1B batch 1 1.688 /
        1.684, batch 2 2.020 / 1.985, batch 4 2.523 / 2.531; 8B batch 4 4.34 / 4.21 (92 free
        programs: 67-row slabs, a 64-row and a 3-row sub-slab each). So batch 1 only.
        ``slab_``: ``qkv_ahead_slab(batch)`` when the caller has it already."""
        if not (self.tuning.qkv_ahead and self.cfg.architecture == "eagle3"):
            return False
        bm = self.block_rows(batch)
        if bm > self.tuning.BM or bm >= self.tuning.wide_bm:  # (wide launches split K in their QKV)
            return False
        rp, bns, _ = slab_ or self.qkv_ahead_slab(batch)
        return rp <= bns

    def row_tiles(self, batch: int) -> tuple[int, int]:
        """(BM, BM2): the activation tile(s) of the weight-streaming phases. Narrow launches use
        one tile, BM = ``block_rows``. Wide ones (``block_rows >= wide_bm``), with
        ``Tuning.exact_rows``, cover the B*K tree rows with two power-of-two tiles when that
        pads less (160 rows: 128 + 32 instead of 256): the tensor-core work and the activation
        traffic of every weight chunk scale with the padded width, and at batch 16 these GEMMs
        are bound by them rather than by the weight stream."""
        bm = self.block_rows(batch)
        rows = batch * self.cfg.top_k
        tn = self.tuning
        if bm < tn.wide_bm or not tn.exact_rows or rows > tn.bm_max:
            return bm, 0
        lo = max(16, 1 << (rows.bit_length() - 1))
        if rows <= lo:
            return lo, 0
        hi = _pow2(rows - lo, 16)
        if hi == lo or lo + hi >= bm:  # one power-of-two tile pads no more
            return min(bm, 2 * lo), 0
        return lo, hi

    # ------------------------------------------------------------------------------------------
    def run(self, weights, features: torch.Tensor, ids_new: torch.Tensor, root: torch.Tensor, cache, c_len: int,
            n_new: int, mode: str, step_hook=None, timing: int = 0) -> Workspace:
        """One sequence: ``ids_new`` [n] int64 token ids of the new rows; the new rows' K/V are
        written into cache rows [c_len, c_len + n) (not committed here)."""
        return self.run_batch(weights, [SeqCall(features, ids_new, root, cache, c_len, n_new)], mode,
                              step_hook=step_hook, timing=timing)

    def pack(self, seqs: list[SeqCall]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Stage the per-call inputs in the workspace (stable addresses and alignment, so
        Triton's pointer specialisation never changes between calls) and build the metadata:
        int64 [B * META_W + N] = per-sequence rows (the call's N in each), then each packed row's
        sequence. The kernel addresses every sequence's cache from one base pointer (the lowest
        of the caches' K/V storages) plus per-sequence element offsets. Returns (metadata on the
        device, the kv base tensor, N)."""
        ws = self.ws
        el = self.dtype.itemsize
        # layer 0 of each K / V storage starts at the storage's own address (no per-call views)
        ptrs = [(s.cache.k.data_ptr(), s.cache.v.data_ptr()) for s in seqs]
        lo = min(range(len(seqs)), key=lambda b: min(ptrs[b]))
        base = seqs[lo].cache.k if ptrs[lo][0] <= ptrs[lo][1] else seqs[lo].cache.v
        base_ptr = base.data_ptr()
        meta: list[int] = []
        row_seq: list[int] = []
        row = 0
        n_all = sum(s.n for s in seqs)
        for b, s in enumerate(seqs):
            kp, vp = ptrs[b]
            meta += [s.c, s.n, row, (kp - base_ptr) // el, (vp - base_ptr) // el, s.cache.k.shape[2], n_all, 0]
            row_seq += [b] * s.n
            row += s.n
        if len(seqs) == 1:
            s = seqs[0]
            ws.feat[:row].copy_(s.features)
            ws.ids[:row].copy_(s.ids_new)
            ws.root[:1].copy_(s.root)
        else:  # one copy kernel per input kind
            torch.cat([s.features for s in seqs], out=ws.feat[:row])
            torch.cat([s.ids_new for s in seqs], out=ws.ids[:row])
            torch.cat([s.root for s in seqs], out=ws.root[: len(seqs)])
        host = torch.tensor(meta + row_seq, dtype=torch.int64)
        if self.device.type == "cuda":
            host = host.pin_memory()
        if ws.meta is None or ws.meta.numel() < host.numel():
            ws.meta = torch.empty(max(host.numel(), 64), dtype=torch.int64, device=self.device)
        dev = ws.meta[: host.numel()]
        dev.copy_(host, non_blocking=True)  # one static device buffer (stream-ordered after the last launch)
        return dev, base, row

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
        nq, nkv = cfg.num_attention_heads * cfg.head_dim, nkv_heads * cfg.head_dim
        attn_in = 2 * h if eagle3 else h
        fc_in = cfg.feature_size if eagle3 else 2 * h
        acc = tn.wide_acc_elems if wide else tn.acc_elems
        st_lin, st_gu, st_lm = (s or tn.num_stages for s in (tn.lin_stages, tn.gu_stages, tn.lm_stages))
        rp_fc, bns_fc, bk_fc = slab(h, fc_in, g, el, 1, tn, bmp, acc_elems=acc, wide=wide, stages=st_lin)
        rp_qkv, bns_qkv, bk_qkv = slab(nq + 2 * nkv, attn_in, g, el, 1, tn, bmp, acc_elems=acc, wide=wide, stages=st_lin)
        # wide launches split K in the tree depths' o_proj and down, so their unsplit forms serve only
        # the context step, whose rows there are one per sequence: sized for that tile (BMP_B), not
        # for the tree rows' (a 256-row tile for 16 rows cut down's k-chunk to 128 columns)
        bmb = max(16, _pow2(nb)) if wide else bmp
        rp_o, bns_o, bk_o = slab(h, nq, g, el, 1, tn, bmb, acc_elems=acc, wide=wide, stages=st_lin)
        rp_gu, bns_gu, bk_gu = slab(cfg.intermediate_size, h, g, el, 2, tn, bm + bm2, acc_elems=acc, wide=wide,
                                    stages=st_gu)
        rp_d, bns_d, bk_d = slab(h, cfg.intermediate_size, g, el, 1, tn, bmb, acc_elems=acc, wide=wide, stages=st_lin)
        rp_lm, bns_lm, bk_lm = slab(cfg.vocab_size, h, g, el, 1, tn, bm + bm2, tn.lm_stage_bytes, acc_elems=acc, wide=wide,
                                    stages=st_lm)
        s_qkv, rps_qkv, bnss_qkv, bks_qkv = split_slab(nq + 2 * nkv, attn_in, g, el, tn, bm + bm2, acc, wide, st_lin)
        s_o, rps_o, bnss_o, bks_o = split_slab(h, nq, g, el, tn, bm + bm2, acc, wide, st_lin)
        s_d, rps_d, bnss_d, bks_d = split_slab(h, cfg.intermediate_size, g, el, tn, bm + bm2, acc, wide, st_lin)
        rp_qh, bns_qh, bk_qh = slab_qh = self.qkv_ahead_slab(nb)

        def fold(bns: int, bk: int, bm_: int = bmp, acc_: int = acc, wide_: bool = wide) -> int:
            f = tn.lin_fold  # the largest power of two <= lin_fold that fits
            while f > 1 and (wide_ or bk % f or bk // f < 16 or f * f * bns * bm_ > 4 * acc_):
                f //= 2
            return max(f, 1)

        qh = self.qkv_ahead(nb, slab_qh)
        pack = tn.pack_weights and not wide and bm + bm2 <= tn.BM
        sel = not wide and (qh if tn.select_in_merge is None else tn.select_in_merge)
        # the context step's small tile (Tuning.ctx_rows): its own sub-slabs, k-chunks and fold
        bmc = max(16, _pow2(nb * tn.ctx_rows)) if wide and tn.ctx_rows > 0 else 0
        if bmc >= bmp:
            bmc = 0
        bns_fcc = bk_fcc = bns_qkvc = bk_qkvc = 16
        fold_c, st_fc_c = 1, st_lin
        if bmc:  # (narrow accumulators and folds, as a narrow launch of that many rows has)
            _, bns_fcc, bk_fcc = slab(h, fc_in, g, el, 1, tn, bmc, acc_elems=tn.acc_elems, wide=True, stages=st_lin)
            fold_c = fold(bns_fcc, bk_fcc, bmc, tn.acc_elems, False)
            if fold_c > 1 and bmc >= 64 and tn.fold_stages:  # folded streams of 64+ rows: fold_stages deep
                st_fc_c = tn.fold_stages
                _, bns_fcc, bk_fcc = slab(h, fc_in, g, el, 1, tn, bmc, acc_elems=tn.acc_elems, wide=True,
                                          stages=st_fc_c)
                fold_c = fold(bns_fcc, bk_fcc, bmc, tn.acc_elems, False)
            _, bns_qkvc, bk_qkvc = slab(nq + 2 * nkv, attn_in, g, el, 1, tn, bmc, acc_elems=tn.acc_elems, wide=True,
                                        stages=st_lin)
        bnp_lm = _pow2(rp_lm, 16)  # the lm_head slab's rows, padded (the 32-bit keys index them in 16 bits)
        ctx_const = {}
        if wide and tn.ctx_builds and tn.phase_kernels:
            # the context step's gate/up and lm_head stream for one row per sequence: in step
            # launches (each phase its own build) they take a tile of pow2(batch) rows with narrow
            # accumulators and the register lm_head, as a narrow launch of that many rows does
            # (the slabs keep the wide alignment, so RP_GU / RP_LM stay the plan's)
            _, bns_guc, bk_guc = slab(cfg.intermediate_size, h, g, el, 2, tn, bmb, acc_elems=tn.acc_elems,
                                      wide=True, stages=st_gu)
            _, bns_lmc, bk_lmc = slab(cfg.vocab_size, h, g, el, 1, tn, bmb, tn.lm_stage_bytes,
                                      acc_elems=tn.acc_elems, wide=True, stages=st_lm)
            ctx_const[K_.PH_GATEUP] = dict(BM=bmb, BM2=0, BNS_GU=bns_guc, BK_GU=bk_guc)
            ctx_const[K_.PH_LMHEAD] = dict(BM=bmb, BM2=0, BNS_LM=bns_lmc, BK_LM=bk_lmc, LM_WIDE=False,
                                           LM_HALVES=tn.lm_halves if bns_lmc >= 32 else 1)
            ctx_const[K_.PH_MERGE] = dict(MG_ROWS=False)  # (that lm_head leaves per-program partials)
        if fused and tn.ctx_builds and tn.phase_kernels:
            # the fused attention's context step has one row per sequence: a query block of one
            # row's heads (the tree depths' holds top_k rows')
            ctx_const[K_.PH_ATTN_F] = dict(BLOCK_Q=_pow2(cfg.num_attention_heads // nkv_heads, 16))
        # wide launches fold the unsplit o_proj and down too: they serve only the context step's
        # one row per sequence there, on a tile of BMP_B rows (as narrow launches do)
        folds = [(fold(bns_fc, bk_fc), bns_fc, bk_fc, bmp)]
        folds += [(fold(bns, bk, bmb, tn.acc_elems, False) if wide else fold(bns, bk), bns, bk, bmb)
                  for bns, bk in ((bns_o, bk_o), (bns_d, bk_d))]
        st_fold = (tn.fold_stages or st_lin) if (bmb if wide else bmp) >= 64 else st_lin
        if any(f > 1 and st_fold * (bns + t) * bk * el > tn.smem_bytes for f, bns, bk, t in folds):
            st_fold = st_lin
        key32_mg = tn.merge_key32 and el == 2 and cfg.vocab_size <= 65536
        bv_mg = min(_pow2(cfg.vocab_size, 16), max(16, tn.merge_chunk if key32_mg else tn.merge_chunk // 2))
        # the workspace's block sizes depend on the config alone (not on its capacity)
        bs = Workspace.block_sizes(cfg)
        const = dict(
            QH=qh, BNS_QH=bns_qh, BK_QH=bk_qh, ST_LIN=st_lin, ST_GU=st_gu, ST_LM=st_lm, BAR=tn.barrier,
            BMC=bmc, BNS_FCC=bns_fcc, BK_FCC=bk_fcc, FOLD_FCC=fold_c, ST_FCC=st_fc_c, BNS_QKVC=bns_qkvc,
            BK_QKVC=bk_qkvc,
            FOLD_FC=folds[0][0], FOLD_O=folds[1][0], FOLD_D=folds[2][0], ST_FOLD=st_fold,
            BMK_LM=tn.lm_stat_rows, KEY16_LM=tn.lm_key32 and el == 2 and bnp_lm <= 65536,
            KEY32_MG=key32_mg, INLINE_SUMS=wide and tn.inline_sums, PACK_W=pack,
            MG_ROWS=wide and tn.merge_rows and cfg.vocab_size <= 65536, BV_MG=bv_mg, G_MG=min(tn.merge_group, bv_mg),
            SEL_MG=sel, KEY32_SEL=el == 2 and cfg.top_k ** 2 <= 65536,
            EAGLE3=eagle3, IEEE=self.dtype == torch.float32,
            BM=bm, BM2=bm2, BMP=bmp, BMP_B=bmb, KP=self.kp,
            BNS_FC=bns_fc, BK_FC=bk_fc, BNS_QKV=bns_qkv, BK_QKV=bk_qkv, BNS_O=bns_o, BK_O=bk_o,
            BNS_GU=bns_gu, BK_GU=bk_gu, BNS_D=bns_d, BK_D=bk_d, BNS_LM=bns_lm, BK_LM=bk_lm,
            LM_HALVES=tn.lm_halves if bns_lm >= 32 else 1, LM_WIDE=wide, BNP_LM=bnp_lm,
            SPLITK=wide, BNSS_QKV=bnss_qkv, BKS_QKV=bks_qkv, BNSS_O=bnss_o, BKS_O=bks_o, BNSS_D=bnss_d, BKS_D=bks_d,
            BLOCK_H=_pow2(cfg.hidden_size), BLOCK_D=bs["block_d"], BLOCK_R=_pow2(cfg.num_attention_heads + nkv_heads),
            BLOCK_Q=bs["block_q"], BLOCK_CH=_pow2(nch + cfg.depth + 1),
            BLOCK_NA=(tn.BLOCK_NA or (32 if nb == 1 else 64)) if not interpreting() else 16,
            BLOCK_NF=tn.fused_block_n if not interpreting() else 16, BLOCK_A=bs["block_a"], BLOCK_K=_pow2(cfg.top_k),
            BLOCK_P=_pow2(-(-cfg.vocab_size // rp_lm)), BLOCK_C=bs["block_c"],
            BLOCK_T=_pow2(cfg.total_token), BLOCK_W=_pow2(self.ret_width),
            num_warps=tn.wide_num_warps if wide else tn.num_warps, num_stages=tn.num_stages,
            # Contracted multiply-adds, pinned: what every measurement and parity run so far compiled
            # with (Triton's default until 3.9; 3.10 turns the default off, which changes bits and speed).
            enable_fp_fusion=True,
        )
        return LaunchPlan(
            wide=wide, fused=fused, qh=qh, sel=sel, pack=pack, qh_vec=h * el % 16 == 0,
            part_elems=max(s_qkv * (nq + 2 * nkv), s_o * h, s_d * h) if wide else 0,
            slab_args=(rp_fc, rp_qkv, rp_o, rp_gu, rp_d, rp_lm, nch, rps_qkv, rps_o, rps_d, s_qkv, s_o, s_d, rp_qh),
            const=const, ctx_const=ctx_const,
        )

    def run_batch(self, weights, seqs: list[SeqCall], mode: str, step_hook=None, timing: int = 0,
                  fresh_outputs: bool = False) -> Workspace:
        """Run the whole schedule for B sequences (outputs in ``self.out_*``, [B, ...]).
        ``fresh_outputs``: allocate this call's output tensors here (otherwise the caller did,
        with ``alloc_outputs``); a replayed graph's are allocated after its launch is queued, so
        the host does that while the GPU works."""
        cfg = self.cfg
        nb = len(seqs)
        n_rows = sum(s.n for s in seqs)
        ws = self.workspace(nb, n_rows)
        p = self.plan(nb)
        self.schedule = self.schedules[p.wide, p.fused, p.sel]
        self.schedule_list = self.schedule_codes[p.wide, p.fused, p.sel]
        self.n_steps = len(self.schedule)
        if p.wide and (ws.lml is None or ws.lml.numel() < ws.mr * cfg.vocab_size):
            ws.lml = torch.empty(ws.mr, cfg.vocab_size, dtype=self.dtype, device=self.device)
        longest = max(s.c + s.n for s in seqs)
        cos, sin = self.rope_tables(longest + cfg.depth + 1)
        meta, kv_base, n_rows = self.pack(seqs)
        graphed = mode == "graph" or (mode == "persistent" and self.graphable(timing))
        if graphed:  # captured launches write fixed output buffers, copied out after each run
            fresh = None if fresh_outputs else self.outputs
            self.outputs = self._graph_outputs(nb)
        elif fresh_outputs:
            self.alloc_outputs(nb)
        lw = weights.layers[0]
        eagle3 = cfg.architecture == "eagle3"
        dummy = ws.sync  # stands in for absent optional tensors (never read)
        has_d2t = bool(eagle3 and weights.d2t is not None and cfg.vocab_size != cfg.target_vocab_size)
        n_times = self.n_steps + 1 + (1 + 2 * self.n_steps) * self.grid * (int(timing) >= 2)
        gate, up, lm_head = lw.gate_proj, lw.up_proj, weights.lm_head
        if p.pack:  # (RP_GU, RP_LM: slab_args 3 and 5)
            gate = self.packed("gate", gate, p.slab_args[3], p.const["BK_GU"])
            up = self.packed("up", up, p.slab_args[3], p.const["BK_GU"])
            lm_head = self.packed("lm_head", lm_head, p.slab_args[5], p.const["BK_LM"])
        if timing and ws.times.numel() < n_times:
            ws.times = torch.zeros(n_times, dtype=torch.int64, device=self.device)
        args = [
            self.schedule, 0, ws.sync, ws.times,
            weights.embed_tokens, weights.fc_weight, weights.fc_bias if weights.fc_bias is not None else weights.fc_weight,
            lw.q_proj, lw.k_proj, lw.v_proj, lw.o_proj, gate, up, lw.down_proj,
            lw.input_layernorm if lw.input_layernorm is not None else lw.post_attention_layernorm,
            lw.post_attention_layernorm,
            weights.hidden_norm if weights.hidden_norm is not None else lw.post_attention_layernorm,
            weights.norm if weights.norm is not None else lw.post_attention_layernorm,
            lm_head, weights.d2t if has_d2t else dummy, cos, sin,
            meta, meta[nb * K_.META_W.value:] if n_rows else meta, ws.feat, ws.ids, ws.root, kv_base,
            ws.hcur, ws.hres, ws.xin, ws.qkv, ws.qr, ws.ao, ws.h1, ws.n2, ws.act, ws.hout, ws.nf, None, None,
            ws.tk, ws.tv, ws.apm, ws.apl, ws.aacc, ws.lmk, ws.lmmax, ws.lmsum, ws.lml if p.wide else dummy,
            None, ws.sel_lp, ws.sel_tok,
            ws.fr_score, ws.fr_tok, ws.fr_src, ws.fr_pick, ws.anc,
            ws.cand_score, ws.cand_tok, ws.row_par, ws.cnt, ws.pf, *self.outputs,
            nb, cfg.hidden_size, cfg.feature_size, cfg.intermediate_size, cfg.vocab_size,
            cfg.target_vocab_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.top_k,
            ws.C, cfg.total_token, cfg.depth, ws.sk, ws.mr, ws.pfw, float(cfg.rms_norm_eps), float(math.sqrt(cfg.head_dim)),
            *p.slab_args,
        ]
        if p.qh and (ws.qh is None or ws.qh.shape[0] < ws.mr):
            nt = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
            ws.xh = torch.empty(ws.mr, cfg.hidden_size, dtype=self.dtype, device=self.device)
            ws.qh = torch.empty(ws.mr, nt, dtype=torch.float32, device=self.device)
        args[self._QH_ARG:self._QH_ARG + 2] = [ws.xh, ws.qh] if p.qh else [dummy, dummy]
        if p.wide and (ws.part is None or ws.part.numel() < p.part_elems * ws.mr):
            ws.part = torch.empty(p.part_elems * ws.mr, dtype=torch.float32, device=self.device)
        args[self._PART_ARG] = ws.part if p.wide else dummy
        vec = self.vec16(lw, seqs)
        tb = self.tuning.tree_blocks
        const = dict(p.const, **vec, VEC_QH=vec["VEC_W"] if p.qh_vec else 1, HAS_D2T=has_d2t,
                     HAS_FCB=weights.fc_bias is not None, TREE_BLOCKS=mode != "persistent" if tb is None else tb)
        if mode == "persistent":
            args[1] = self.n_steps
            const = dict(const, PERSISTENT=True, MAX_SPIN=self.max_spin(), TIMING=int(timing), launch_cooperative_grid=True)
            if graphed:
                self._persistent_graphed(args, const, (self.grid,))
            else:
                self._persistent_launch(args, const, (self.grid,))
        elif mode == "steps":
            self._launch_steps(args, const, (nb, n_rows), step_hook)
        elif mode == "graph":
            # N is read from the metadata, so one graph serves every N up to the workspace's row
            # capacity: its per-row launches get programs for that many rows (the rest exit)
            key = (self._graph_key(args, const), ws.rows)
            graph = self._graphs.pop(key, None)
            if graph is None:
                graph = self._capture(args, const, (nb, ws.rows))
            self._keep(self._graphs, key, graph)
            graph.replay()
        else:
            raise ValueError(f"mode must be 'persistent', 'steps' or 'graph', got {mode!r}")
        if graphed:
            if fresh is None:
                fresh = self._new_outputs(nb)
            for dst, src in zip(fresh, self.outputs):
                dst.copy_(src)
            self.outputs = fresh
        return ws

    def graphable(self, timing: bool = False) -> bool:
        """Whether persistent launches go through CUDA graphs (``Tuning.persistent_graph``, a
        CUDA device, no in-kernel timing, and no failed capture on this drafter so far)."""
        return (self.tuning.persistent_graph and not timing and self.device.type == "cuda" and not interpreting()
                and self.graph_error is None)

    def _persistent_launch(self, args, const, grid) -> None:
        """The one cooperative launch of the whole schedule (the barrier counter zeroed first)."""
        self.ws.sync.zero_()
        try:
            K_.drafter_kernel[grid](*args, **const)
        except Exception as exc:  # e.g. out of resources, or a grid larger than co-residency allows
            raise KernelError(f"triton drafter: persistent launch of {grid[0]} programs failed: {exc}") from exc

    def _persistent_graphed(self, args, const, grid) -> None:
        """Persistent launch through a CUDA graph: replayed when these exact arguments (buffers,
        sizes, constants) were captured before; otherwise launched directly, and captured once
        the same arguments have come twice (so that arguments that never repeat - e.g. a new
        set of caches every call - cost no captures)."""
        key = self._graph_key(args, const)
        graph = self._pgraphs.pop(key, None)
        if graph is not None:
            self._keep(self._pgraphs, key, graph)
            graph.replay()
            return
        self._persistent_launch(args, const, grid)  # compiles on first use; capture needs that done
        if self._pseen.pop(key, None) is None:
            self._keep(self._pseen, key, True)
            return
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self._persistent_launch(args, const, grid)
        except Exception as exc:  # a driver without cooperative graph nodes: direct launches from now on
            self.graph_error = f"{type(exc).__name__}: {exc}"
            torch.cuda.synchronize(self.device)
            return
        self._keep(self._pgraphs, key, graph)

    @staticmethod
    def _graph_key(args, const) -> tuple:
        return (tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args), tuple(sorted(const.items())))

    def _keep(self, table: dict, key, value) -> None:
        """Insert as most recently used; drop the least recently used beyond ``max_graphs``."""
        table[key] = value
        while len(table) > self.max_graphs:
            table.pop(next(iter(table)))

    def vec16(self, lw, seqs: list[SeqCall]) -> dict:
        """The kernel's VEC_W / VEC_KV: elements per 16 bytes when the QKV weight rows / every
        cache's K/V rows and offsets are proven 16-byte aligned (the kernel then declares those
        loads aligned: vector loads in the cp.async pipeline instead of 2-byte scalars), else 1.
        True for contiguous real heads; odd test sizes may not be. ``Tuning.vec_w`` /
        ``Tuning.vec_kv`` turn the declarations off (to measure them)."""
        el = self.dtype.itemsize

        def aligned(tens, skip=0):  # every row of every tensor starts on a 16-byte boundary
            return all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1
                       and all(st * el % 16 == 0 for st in t.stride()[skip:-1]) for t in tens)

        w_ok = self.tuning.vec_w and aligned([lw.q_proj, lw.k_proj, lw.v_proj])
        # the caches' layer 0 ([kv heads, max_length, head_dim]: the storage without its layer stride)
        kv_ok = self.tuning.vec_kv and aligned([t for s in seqs for t in (s.cache.k, s.cache.v)], skip=1)
        return dict(VEC_W=16 // el if w_ok else 1, VEC_KV=16 // el if kv_ok else 1)

    max_graphs = 32  # captured graphs kept per drafter (one per batch size x row capacity x buffers)

    def step_grid(self, code: int, nb: int, n_rows: int) -> int:
        """Programs of the step launch of schedule entry ``code`` (``Tuning.step_grids``): the
        phases that loop over a few items - sequences (SELECT, FINAL), rows (PREP, RoPE, the
        post-attention norm) or attention parts - launch at most one program per item; the
        weight streams (their slabs are sized for the whole grid), MERGE (one partial per
        lm_head program) and the final norm (its second half is placed after the rows'
        programs) keep the grid where they stream the next depth's QKV. At the tree depths the
        row phases otherwise get one program per row, more than the grid where there are more
        rows (``Tuning.row_grids``: their builds are small, several programs fit on an SM, so no
        program takes two rows in turn)."""
        if not self.tuning.step_grids:
            return self.grid
        ph, i = divmod(code, 256)
        cfg = self.cfg
        ctx = i == K_.CTX_DEPTH
        rows_in = n_rows if ctx else nb * cfg.top_k
        kv = nb * cfg.num_key_value_heads
        parts = self.attn_chunks(nb) + (0 if ctx else i + 1)
        items = {
            K_.PH_SELECT: nb, K_.PH_FINAL: nb, K_.PH_PREP3: rows_in, K_.PH_PREP2: rows_in, K_.PH_ROPE: rows_in,
            K_.PH_NORM_POST: nb if ctx else nb * cfg.top_k, K_.PH_ATTN: kv * parts, K_.PH_ATTN2: kv * parts,
            K_.PH_ATTN3: kv * (Workspace.block_sizes(cfg)["block_q"] // 16), K_.PH_ATTN_F: kv,
        }.get(ph)
        if self.tuning.row_grids:
            rows = nb if ctx else nb * cfg.top_k
            ahead = (ctx and cfg.depth > 0) or (not ctx and i + 1 < cfg.depth)
            if ph in (K_.PH_MERGE, K_.PH_NORM_F) and not (ahead and self.plan(nb).qh):
                return max(1, rows)
            if not ctx and ph in (K_.PH_PREP3, K_.PH_PREP2, K_.PH_ROPE, K_.PH_NORM_POST):
                return max(1, rows)
        return self.grid if items is None else max(1, min(self.grid, items))

    def _launch_steps(self, args, const, shape: tuple[int, int], step_hook=None) -> None:
        """One launch per schedule entry (the interpreter path; on GPU the graph mode's body):
        the kernel built for the entry's phase (``Tuning.phase_kernels``) on its own grid
        (``step_grid`` for ``shape`` = (sequences, packed new rows)); the grids are worked out here,
        when launches are made, not on every replay of a captured graph."""
        args = list(args)
        self.step_grid_list = [self.step_grid(code, *shape) for code in self.schedule_list]
        pdl = self.pdl_on()
        ctx_const = self.plan(shape[0]).ctx_const
        for st in range(self.n_steps):
            if step_hook is not None:
                step_hook(st)
            args[0] = self.schedule[st:]
            args[1] = 1
            ph, i = divmod(self.schedule_list[st], 256)
            grid = (self.step_grid_list[st],)
            kw = dict(const, PERSISTENT=False, MAX_SPIN=1, TIMING=False, PHASE=ph if self.tuning.phase_kernels else -1)
            if i == K_.CTX_DEPTH and ph in ctx_const:
                kw.update(ctx_const[ph])
            elif ph == K_.PH_MERGE and kw.get("MG_ROWS") and self.tuning.merge_warps:
                kw["num_warps"] = self.tuning.merge_warps
            if pdl:
                kw.update(self.pdl_const(st))
                if ph in self._STREAM_PHASES and self._two_per_sm(args, grid, kw):
                    kw["launch_pdl"] = False  # launched early, its programs could pile up two to an SM
            K_.drafter_kernel[grid](*args, **kw)

    _STREAM_PHASES = (K_.PH_FC, K_.PH_QKV, K_.PH_OPROJ, K_.PH_GATEUP, K_.PH_DOWN, K_.PH_LMHEAD)

    def pdl_on(self) -> bool:
        """Whether step launches may use programmatic dependent launch (``Tuning.pdl``): not
        under the interpreter, on a CPU, a GPU before sm_90, or a Triton without grid dependency
        control."""
        return bool(self.tuning.pdl and K_.HAS_GDC and self.device.type == "cuda" and not interpreting()
                    and torch.cuda.get_device_capability(self.device) >= (9, 0))

    def _two_per_sm(self, args, grid, kw) -> bool:
        """Whether two programs of this step build fit on one SM (registers and shared memory of
        the compiled kernel, compiled here if it is not yet). A weight stream's slabs assume one
        program per SM: launched normally its programs spread over the idle SMs, but launched
        early, while the phase before it holds some SMs, they would be placed two to an SM where
        they fit, and those SMs take twice as long (8B batch 4: gate/up 1.5 instead of 0.86 ms
        per call). Such builds are launched without PDL. (Keyed by the build's constants: a
        drafter's arguments keep their dtypes and alignment from call to call.)"""
        key = tuple(sorted((k, v) for k, v in kw.items() if k != "launch_pdl"))
        if key not in self._two_fit:
            ck = K_.drafter_kernel.warmup(*args, grid=grid, **kw)
            ck._init_handles()
            props = torch.cuda.get_device_properties(self.device)
            smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
            regs = getattr(props, "regs_per_multiprocessor", 65536)
            warps = kw.get("num_warps", 4)
            per_warp = -(-ck.n_regs * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
            self._two_fit[key] = (2 * (ck.metadata.shared + 1024) <= smem and 2 * warps * per_warp <= regs)
        return self._two_fit[key]

    def pdl_const(self, st: int) -> dict:
        """Step launch ``st``'s PDL settings (``Tuning.pdl_trigger``): the launch option and the
        kernel's PDL (1 / 2: the next launch may start after this one's wait / after its work).
        Every launch waits for the one before it, so each one's writes are visible to all later."""
        tn = self.tuning
        ph = self.schedule_list[st] // 256
        last = st + 1 == self.n_steps
        nph = -1 if last else self.schedule_list[st + 1] // 256
        small = not last and self.step_grid_list[st + 1] <= tn.pdl_max_grid
        stream, next_stream = ph in self._STREAM_PHASES, nph in self._STREAM_PHASES
        start = {
            "start": True,
            "end": False,
            "streams_end": not stream,
            "small": not stream or next_stream or small,
            "small_only": not stream or (small and not next_stream),
        }[tn.pdl_trigger]
        return dict(launch_pdl=True, PDL=1 if start else 2)

    def _capture(self, args, const, shape: tuple[int, int]):
        """CUDA graph of the step launches for these exact arguments (compiled and run once on a
        side stream first, as capture requires)."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._launch_steps(args, const, shape)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._launch_steps(args, const, shape)
        return graph

    def _graph_outputs(self, batch: int) -> tuple:
        """This batch size's fixed graph output buffers (allocated once)."""
        if batch not in self._graph_outs:
            self._graph_outs[batch] = self._new_outputs(batch)
        return self._graph_outs[batch]

    def step_times_us(self) -> list[float]:
        """Per-schedule-entry durations (us) of the last TIMING persistent run, barrier included."""
        t = self.ws.times[: self.n_steps + 1].tolist()
        return [(b - a) / 1e3 for a, b in zip(t[:-1], t[1:])]

    def program_stamps(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every program's global-timer stamps (ns) of the last ``timing=2`` persistent run:
        ``start [grid]``, ``arrive [n_steps, grid]`` (reaching the barrier after a schedule entry)
        and ``leave [n_steps, grid]`` (leaving it)."""
        n, g = self.n_steps, self.grid
        ps = self.ws.times[n + 1: n + 1 + (1 + 2 * n) * g].view(1 + 2 * n, g).cpu()
        return ps[0], ps[1::2], ps[2::2]

    @staticmethod
    def max_spin() -> int:
        return int(os.environ.get("FRONTIER_TRITON_MAX_SPIN", "2000000"))

    @property
    def ret_width(self) -> int:
        """Columns of padded retrieve_indices: D + 2, as pack_tree(max_depth=D+1) gives."""
        return self.cfg.depth + 2

    _OUT = ("out_tok", "out_par", "out_score", "out_mask", "out_pos", "out_ret", "out_leaf")

    @property
    def outputs(self) -> tuple:
        """The output tensors the next launch writes (``out_tok`` ... ``out_leaf``, in ``_OUT`` order)."""
        return tuple(getattr(self, name) for name in self._OUT)

    @outputs.setter
    def outputs(self, tensors) -> None:
        for name, t in zip(self._OUT, tensors):
            setattr(self, name, t)

    def _new_outputs(self, batch: int) -> tuple:
        t, dev = self.cfg.total_token, self.device
        return (
            torch.empty(batch, t, dtype=torch.int64, device=dev),  # draft tokens
            torch.empty(batch, t - 1, dtype=torch.int64, device=dev),  # parent positions
            torch.empty(batch, t, dtype=torch.float32, device=dev),  # scores
            torch.empty(batch, t, t, dtype=torch.float32, device=dev),  # tree mask
            torch.empty(batch, t, dtype=torch.int64, device=dev),  # position ids
            torch.empty(batch, t, self.ret_width, dtype=torch.int64, device=dev),  # retrieve indices
            torch.empty(batch, 2, dtype=torch.int64, device=dev),  # leaf count, deepest level
        )

    def alloc_outputs(self, batch: int = 1) -> None:
        """Fresh output tensors for one call of ``batch`` sequences (returned in the Frontiers)."""
        self.outputs = self._new_outputs(batch)

    def check_error(self) -> None:
        """Raise KernelError when a grid barrier timed out (one host read)."""
        if self.ws is not None and int(self.ws.sync[1].item()) != 0:
            raise KernelError(
                "triton drafter: a grid barrier timed out (programs not co-resident, or a kernel bug); "
                "the draft cache was left unchanged"
            )


__all__ = ["Drafter", "SeqCall", "Tuning", "Workspace", "build_schedule", "interpreting", "num_sms"]
