"""Tile and launch-shape choices of the triton drafter, and the slab sizing that follows from them.

Every field is either the fastest measured setting on Hopper (H100/H200), a limit of the device,
or a size the tests shrink so that the interpreter's tiny heads take the GPU's code paths. The
measurements behind them are in ``docs/results/tuning_decisions.csv``; ``docs/triton.md`` has the
decisions table. Overrides are parsed in one place, :meth:`Tuning.overrides`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional


def _pow2(n: int, lo: int = 1) -> int:
    """The least power of two >= max(n, lo)."""
    return max(lo, 1 << max(0, (int(n) - 1).bit_length()))


@dataclass(frozen=True)
class Tuning:
    """Block sizes and launch shape (compile-time constants of the kernel).

    Each weight-streaming phase gives every program one slab of ``ceil(N / grid)`` rows (rounded
    up to ``slab_align``, ``wide_slab_align`` in wide launches), walked in sub-slabs of at most
    ``acc_elems / BM`` rows (one sub-slab at batch 1); its k-chunk is sized so that one pipeline
    stage holds about ``stage_bytes`` of weights (and at most that much of the activation tile).
    A launch is *wide* when its activation tile reaches ``wide_bm`` rows (every batch from 2 at top_k 10).
    """

    BM: int = 16  # activation rows per tile at batch 1 (tl.dot needs >= 16)
    bm_max: int = 256  # largest activation tile when batching (more rows take more tiles)
    acc_elems: int = 4096  # fp32 accumulator elements per program per weight matrix: 32 registers a thread
    # tiles this wide make a wide launch: split-K streams, logits scratch for MERGE. 32: every batch
    # from 2 at top_k 10 (8B on an H200, batch 4: 2.33 ms wide against 2.98 narrow; batch 2 fp8:
    # 1.97 against 2.25)
    wide_bm: int = 32
    wide_acc_elems: int = 40960  # 160 registers a thread: 64K spilled at batch 64
    wide_num_warps: int = 8  # two warpgroups split the weight rows; each wgmma spans all activation rows
    split_rows: int = 128  # wide launches split K in QKV / o_proj / down until slabs hold about this many rows
    slab_align: int = 1  # batch 1 spreads each stream most evenly over the grid
    wide_slab_align: int = 16  # wide launches: whole 16-row MMA tiles per slab
    stage_bytes: int = 32768  # weights per pipeline stage (the lm_head's too)
    # fp8 streams of narrow launches: twice the bf16 stream's elements per stage (8B at batch 1 on
    # an H200, in a build that swapped fc, o_proj and down too: 1.47 ms against 1.56 ms at 16 KB;
    # docs/results/fp8_stage_bytes_h200.json)
    fp8_stage_bytes: int = 32768
    smem_bytes: int = 225280  # shared memory one program may use for pipeline buffers (Hopper: 227 KB)
    num_warps: int = 8
    num_stages: int = 3  # Triton's default pipelining of the kernel's other loops
    lin_stages: Optional[int] = None  # fc / QKV / o_proj / down k-loops (None: num_stages; 2 and 4 were slower)
    gu_stages: Optional[int] = 4  # gate/up k-loop
    lm_stages: Optional[int] = 4  # lm_head k-loop
    # context keys per split-attention block (None: 64, but 32 in the persistent launch at batch 1;
    # docs/results/tuning_decisions.csv)
    BLOCK_NA: Optional[int] = None
    attn_chunks: int = 4  # least context chunks per (sequence, KV head) when batching, for an even spread
    fused_attention: bool = True  # big batches: one attention phase per (sequence, KV head)
    fused_block_n: int = 64  # context keys per block of the fused attention
    grid: Optional[int] = None  # programs (None: one per SM on a GPU, 2 under the interpreter)
    lin_fold: int = 4  # fold the unsplit fc / o_proj / down k-chunks up to this many ways (1: off, and no split)
    # swapped fp8 fc / o_proj / down streams of a 16-row tile split each k-chunk this many ways, one
    # k-slice per warp, where bf16 streams fold (1: swapped and unsplit). 8B fp8 at batch 1 on an H200,
    # 512-column chunks: 1.385 ms split 8 ways, 1.425 at 4, 1.410 folded; 1B 0.841 / 0.856 / 0.882
    swap_split: int = 8
    split_bk: int = 1024  # the split streams' longest k-chunk (others: 512): 8B fp8 1.369 ms against 1.393 at 512
    fold_stages: Optional[int] = 4  # pipeline depth of folded streams with 64+ activation rows
    lm_stat_rows: int = 32  # activation rows per tile of the wide lm_head's statistics
    merge_chunk: int = 32768  # logits per chunk of MERGE's per-row ranking in wide launches
    merge_group: int = 8  # logits per group of that ranking's first round
    ctx_rows: int = 4  # wide launches: the context step's fc / QKV tile covers this many new rows a sequence
    pdl: bool = True  # programmatic dependent launch of step launches (sm_90+); False to rule it out
    pdl_max_grid: int = 32  # a weight stream lets the next launch start early when that launch is this small
    # None: dense blocks of tree keys in step launches, gathered ancestor keys in the persistent
    # one (each the faster there); True / False force one form (the interpreter runs steps only)
    tree_blocks: Optional[bool] = None
    # gate, up and lm_head streamed from copies packed per slab where the tree rows fit one tile
    # (batch 1): each stage reads one contiguous block. Costs about the three matrices' size in
    # memory; the backend's option pack_weights=False drafts without the copies.
    pack_weights: bool = True
    # EAGLE-3 launches that stream the QKV hidden half during MERGE (tree rows in the batch-1 tile:
    # batch 1 at top_k 10) read the embedding half of every tree row's QKV from a per-head table of
    # the V draft tokens (fp32, V x (NQ + 2 NKVD): 786 MB at 8B) where it takes at most this many MB
    # (10^6 bytes; 0: never), instead of streaming that half of Wqkv at every depth (8B at batch 1
    # on an H200: fp8 1.276 against 1.365 ms, bf16 1.743 against 1.866; the same bits). A derived
    # copy like the packed ones: pack_weights=False drafts without it too.
    emb_table_mb: int = 1024

    # tile sizes that become tl.arange / tl.dot extents
    _POW2 = ("BM", "bm_max", "wide_bm", "BLOCK_NA", "fused_block_n", "lm_stat_rows", "merge_chunk", "merge_group",
             "swap_split", "split_bk")
    _ZERO_OFF = ("emb_table_mb",)  # sizes where 0 turns the feature off

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and str(f.type).startswith("Optional["):
                continue
            if "bool" in str(f.type):
                if not isinstance(v, bool):
                    raise ValueError(f"Tuning.{f.name} must be True or False, got {v!r}")
                continue
            if f.name in self._ZERO_OFF:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"Tuning.{f.name} must be an integer >= 0, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Tuning.{f.name} must be a positive integer, got {v!r}")
            if f.name in self._POW2 and v & (v - 1):
                raise ValueError(f"Tuning.{f.name} must be a power of two, got {v}")

    @classmethod
    def overrides(cls, pairs) -> dict:
        """Field overrides from ``"field=value"`` strings, each value parsed as its field's type:
        ``true`` / ``false`` (or 1 / 0) for a bool, an integer for an int, ``none`` for an
        Optional field. An unknown field or a value of the wrong type is a ValueError naming it."""
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
            else:
                try:
                    out[name] = int(text)
                except ValueError:
                    raise ValueError(f"tuning override {kv!r}: {name} takes an integer") from None
        return out


def slab(n_rows: int, kd: int, grid: int, elsize: int, n_mats: int, tn: Tuning, bm: int,
         acc_elems: Optional[int] = None, wide: Optional[bool] = None,
         stages: Optional[int] = None, x_elsize: Optional[int] = None, bk_max: int = 512) -> tuple[int, int, int]:
    """(rows per program RP, sub-slab rows BNS, k-chunk BK) of a weight-streaming phase whose
    activation tile is ``bm`` rows wide (BM + BM2). The k-chunk holds about ``stage_bytes`` of
    weights per stage (``fp8_stage_bytes`` for 1-byte weights in narrow launches), and the weight + activation tiles of all ``stages`` (default
    ``num_stages``) stages fit in ``smem_bytes``. ``wide`` (default: ``bm >= wide_bm``) picks
    the slab alignment. ``elsize``: bytes per weight element; ``x_elsize``: per activation
    element (default the same; fp8 weights stream 1 byte beside 2- or 4-byte activations);
    ``bk_max``: the longest k-chunk."""
    per = -(-n_rows // grid)
    if wide is None:
        wide = bm >= tn.wide_bm
    al = max(1, tn.wide_slab_align if wide else tn.slab_align)
    rp = max(al, -(-per // al) * al)
    bnp = _pow2(rp, 16)
    cap = max(16, 1 << max(0, ((acc_elems or tn.acc_elems) // (bm * n_mats)).bit_length() - 1))
    bns = min(bnp, cap)
    x_el = x_elsize or elsize
    stage = tn.fp8_stage_bytes if elsize == 1 and not wide else tn.stage_bytes  # (1-byte weights: fp8)
    bk = min(stage // (bns * elsize * n_mats),
             tn.smem_bytes // ((stages or tn.num_stages) * (bns * n_mats * elsize + bm * x_el)))
    bk = max(16, min(bk_max, 1 << max(0, bk.bit_length() - 1), _pow2(kd, 16)))
    return rp, bns, bk


def split_slab(n_rows: int, kd: int, grid: int, elsize: int, tn: Tuning, bm: int, acc: int,
               wide: Optional[bool] = None, stages: Optional[int] = None,
               x_elsize: Optional[int] = None) -> tuple[int, int, int, int]:
    """(split factor S, rows per slab RP, sub-slab rows BNS, k-chunk BK) of a split-K phase:
    grid // S slabs of about ``tn.split_rows`` rows, each streamed as S k-ranges."""
    spl = 1
    while spl < 8 and 2 * spl <= grid and n_rows * 2 * spl <= tn.split_rows * grid:
        spl *= 2
    nslab = grid // spl
    rp, bns, bk = slab(n_rows, max(16, -(-kd // spl)), nslab, elsize, 1, tn, bm, acc_elems=acc, wide=wide,
                       stages=stages, x_elsize=x_elsize)
    return spl, rp, bns, bk
