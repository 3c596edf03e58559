"""The triton drafter's launcher: stages a call's inputs, builds the kernel's keyword arguments
and launches the schedule in one of three modes.

``mode="graph"`` (the GPU default) captures the step launches - one per schedule entry, each the
kernel built for that phase alone, on its own grid, chained with programmatic dependent launch on
sm_90+ - once per batch shape as a CUDA graph and replays it; the per-call inputs and metadata
live in fixed workspace buffers refreshed before each replay, and the number of new rows is read
from the metadata, so it may change between replays up to the workspace's row capacity.
``mode="persistent"`` runs the whole schedule in one cooperative launch with a bounded grid
barrier between entries (captured as a graph once the same arguments come back).
``mode="steps"`` makes the step launches directly (the interpreter's mode).
"""

from __future__ import annotations

import math
import os
import weakref
from typing import NamedTuple, Optional

import torch

from ...errors import KernelError
from ...weights import stamp_matches, tensors_stamp
from .kernels import HAS_GDC, META_W, drafter_kernel
from .kernels.layout import CONTEXT_STEP, Phase
from .fp8 import StreamFormats, qkv_scales, stream_scales
from .plan import LaunchPlanner, interpreting, pack_slabs, rows_aligned
from .schedule import build_schedule
from .tuning import Tuning, _pow2
from .workspace import SeqCall, Workspace

_GRID_CACHE: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (the persistent grid: one program per SM)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _GRID_CACHE:
        _GRID_CACHE[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _GRID_CACHE[idx]


class _Table(NamedTuple):
    """The embedding-QKV table a launcher keeps (``Launcher.emb_table``)."""

    ref: weakref.ref  # the head's Wq (the table goes with it)
    stamp: tuple  # its sources' stamp (``weights.tensors_stamp``)
    key: tuple  # the constants, slab and grid it was made with
    tab: torch.Tensor  # [V, NQ + 2 * NKVD] fp32
    t2d: Optional[torch.Tensor]  # [Vt] int32: each target id's draft index (None without d2t)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The device tensors the table holds."""
        return [t for t in (self.tab, self.t2d) if t is not None]


class Launcher(LaunchPlanner):
    """Launch state for one (config, dtype, device, weight formats): workspace, rotary tables,
    schedules, packed weight copies, the embedding-QKV table and captured graphs."""

    def __init__(self, cfg, dtype: torch.dtype, device: torch.device, tuning: Optional[Tuning] = None,
                 formats: Optional[StreamFormats] = None):
        tuning = tuning or Tuning()
        if tuning.grid is not None:
            grid = tuning.grid
        elif device.type == "cuda" and not interpreting():
            grid = num_sms(device)
        else:
            grid = 2
        super().__init__(cfg, dtype, grid, tuning, formats)
        self.device = device
        self.ws: Optional[Workspace] = None
        self.cos: Optional[torch.Tensor] = None
        self.sin: Optional[torch.Tensor] = None
        self.schedule_codes = {  # keyed by LaunchPlan (wide, fused, sel, tab); sel and tab only at narrow launches
            (split, fused, sel, tab): build_schedule(cfg.architecture, cfg.depth, split, fused, sel, tab)
            for split in (False, True) for fused in (False, True) for sel in ((False,) if split else (False, True))
            for tab in ((False, True) if sel else (False,))
        }
        self.schedules = {key: torch.tensor(codes, dtype=torch.int32, device=device)
                          for key, codes in self.schedule_codes.items()}
        self.schedule = self.schedules[False, False, False, False]  # the schedule of the last launch
        self.schedule_list = self.schedule_codes[False, False, False, False]  # the same, on the host
        self.step_grid_list: list[int] = []  # programs per schedule entry of the last step launches
        self.n_steps = len(self.schedule)
        self._graphs: dict = {}  # mode="graph": captured step launches, by batch shape and buffers
        self._pgraphs: dict = {}  # mode="persistent": captured cooperative launches, likewise
        self._pseen: dict = {}  # persistent arguments launched once and not yet captured
        self._gseen: dict = {}  # mode="graph": arguments launched once and not yet captured
        self.graph_error: Optional[str] = None  # why capturing a persistent launch failed (then never retried)
        self._graph_outs: dict = {}
        self._two_fit: dict = {}  # whether two programs of a step build fit on one SM, by build
        self._packed: dict = {}  # Tuning.pack_weights: role -> (source ref, its stamp, rp, bk, packed copy)
        # captured graphs outlive a call (frontier.Drafter): then a copy is kept per (role, rp, bk),
        # a weight changed in place is repacked into the same memory, and no copy a graph may
        # read is freed
        self.pin_packed = False
        self._held: dict = {}  # pin_packed: tensors graphs may read that nothing else keeps, by address
        # (the embedding-QKV table is made again in place under pin_packed, as packed copies are)
        self._table: Optional[_Table] = None  # the embedding-QKV table (``emb_table``)

    # ------------------------------------------------------------------------------------------
    def packed(self, role: str, w: torch.Tensor, rp: int, bk: int) -> torch.Tensor:
        """The copy of weight ``w`` packed for a stream of RP rows per program in k-chunks of BK
        (``pack_slabs``), made on first use and kept per ``role`` for as long as the same
        tensor, unmodified (``weights.stamp_matches``: its version counter, storage and layout),
        comes back with the same slab plan; anything else replaces it (the old copy is freed
        before the new one is made, but under a Drafter, whose graphs may read it, it is held),
        and the copy goes when its source tensor is freed. (A write through ``w.data`` itself
        moves no version counter, so it is not seen: change weights in place on the tensor, e.g.
        ``copy_`` under ``torch.no_grad()``, or give it new data with ``w.data = ...``, or draft
        with ``pack_weights=False``.)"""
        key = (role, rp, bk) if self.pin_packed else role
        e = self._packed.get(key)
        if e is not None and e[2:4] == (rp, bk) and stamp_matches(e[1], [w]):
            return e[4]
        if (self.pin_packed and e is not None and e[0]() is w and e[4].dtype == w.dtype
                and e[4].shape == (self.grid, -(-w.shape[1] // bk), rp, bk)):  # repacked into the same memory
            e[4].copy_(pack_slabs(w, self.grid, rp, bk))
            self._packed[key] = (e[0], tensors_stamp([w]), rp, bk, e[4])
            return e[4]
        old = self._packed.pop(key, None)
        if self.pin_packed and old is not None:
            self._held[old[4].data_ptr()] = old[4]
        t = pack_slabs(w, self.grid, rp, bk)
        packed = self._packed

        def gone(ref, key=key):  # the source tensor was freed: so is its copy
            if packed.get(key, (None,))[0] is ref:
                del packed[key]

        packed[key] = (weakref.ref(w, gone), tensors_stamp([w]), rp, bk, t)
        return t

    def _scales(self, weights, dummy: torch.Tensor) -> dict:
        """``fp8.stream_scales``; with ``pin_packed`` (a Drafter, whose graphs outlive the call)
        every tensor handed to a launch is also held here, so that a graph never reads memory that
        the head's memo freed (``DraftWeights.clear_memo``)."""
        scales = stream_scales(weights, dummy)
        if self.pin_packed:
            self._held.update((t.data_ptr(), t) for t in scales.values())
        return scales

    @property
    def packed_bytes(self) -> int:
        """Device memory held by the packed weight copies (``Tuning.pack_weights``) and the
        embedding-QKV table (``Tuning.emb_table_mb``)."""
        held = [e[4] for e in self._packed.values()] + (self._table.tensors if self._table is not None else [])
        return sum(t.numel() * t.element_size() for t in held)

    _TABLE_CONST = ("BMP", "BNS_QKV", "BK_QKV", "ST_LIN", "IEEE", "VEC_W", "W8_QKV", "BLOCK_H", "HAS_D2T",
                    "num_warps", "num_stages", "enable_fp_fusion")  # what the tree QKV phase's bits depend on

    def emb_table(self, weights, args: dict, const: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's embedding-QKV table and its t2d map (``kernels.table``; without a d2t map
        the launch's placeholder ``sync_ptr``) for a launch with these arguments and constants: made on first use
        with the tree QKV phase's constants and grid, and kept while its sources (embeddings,
        input norm, Wq / Wk / Wv and their fp8 scales, d2t) are unchanged
        (``weights.stamp_matches``) and the constants the same. Otherwise it is made again, as
        a packed copy is: in the same memory under a Drafter (``pin_packed``: its graphs read
        that memory), else after the old one is freed; and like a packed copy it goes when its
        head's Wq is freed. (One table per launcher: drafting two heads by turns on one drafter
        makes it again on every switch.)"""
        srcs = [args[k] for k in ("emb_ptr", "ln_in_ptr", "wq_ptr", "wk_ptr", "wv_ptr")] + qkv_scales(weights)
        srcs += [args["d2t_ptr"]] if const["HAS_D2T"] else []
        key = tuple(const[k] for k in self._TABLE_CONST) + (args["RP_QKV"], self.grid)
        old = self._table
        if old is not None and old.key == key and stamp_matches(old.stamp, srcs):
            return old.tab, old.t2d if old.t2d is not None else args["sync_ptr"]
        self._table = None
        if old is not None and self.pin_packed and (old.t2d is not None) == const["HAS_D2T"]:
            tab, t2d = old.tab, old.t2d  # refilled in place: a captured graph reads this memory
        else:
            if old is not None and self.pin_packed:
                self._held.update((t.data_ptr(), t) for t in old.tensors)
            del old  # (so that, not held, it is freed before the new one is made)
            cfg = self.cfg
            nt = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
            tab = torch.empty(cfg.vocab_size, nt, dtype=torch.float32, device=self.device)
            t2d = (torch.empty(cfg.target_vocab_size, dtype=torch.int32, device=self.device)
                   if const["HAS_D2T"] else None)
        self._build_table(args, const, tab, t2d)
        me = weakref.ref(self)

        def gone(ref):  # the head's Wq was freed: so is its table
            launcher = me()
            if launcher is not None and launcher._table is not None and launcher._table.ref is ref:
                launcher._table = None

        self._table = _Table(weakref.ref(args["wq_ptr"], gone), tensors_stamp(srcs), key, tab, t2d)
        return tab, t2d if t2d is not None else args["sync_ptr"]

    def _build_table(self, args: dict, const: dict, tab: torch.Tensor, t2d: Optional[torch.Tensor]) -> None:
        """Fill ``tab`` [V, NQ + 2 * NKVD] and (with a d2t map) ``t2d`` [Vt]: the two table
        kernels on the tree QKV phase's constants and grid, and each draft token's index at its
        target id (ids no draft token maps to: 0; no tree row holds one)."""
        from .kernels.table import emb_norm_kernel, emb_qkv_kernel

        cfg = self.cfg
        v, h, vt = cfg.vocab_size, cfg.hidden_size, cfg.target_vocab_size
        nq, nkvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        if const["HAS_D2T"]:
            d = torch.arange(v, device=self.device)
            t2d.zero_()
            t2d[(d + args["d2t_ptr"][:v]).clamp(0, vt - 1)] = d.to(torch.int32)
        xn = torch.empty(v, h, dtype=self.dtype, device=self.device)  # the draft tokens' normed embeddings
        launch = dict(num_warps=const["num_warps"], num_stages=const["num_stages"],
                      enable_fp_fusion=const["enable_fp_fusion"])
        emb_norm_kernel[(min(v, 4 * self.grid),)](
            args["emb_ptr"], args["d2t_ptr"], args["ln_in_ptr"], xn, v, vt, h, float(cfg.rms_norm_eps),
            HAS_D2T=const["HAS_D2T"], BLOCK_H=const["BLOCK_H"], **launch)
        emb_qkv_kernel[(self.grid,)](
            xn, v, h, args["wq_ptr"], args["wk_ptr"], args["wv_ptr"], nq, nkvd, args["sqkv_ptr"], tab,
            args["RP_QKV"], BM=const["BMP"], BNS=const["BNS_QKV"], BK=const["BK_QKV"], IEEE=const["IEEE"],
            VEC=const["VEC_W"], ST=const["ST_LIN"], W8=const["W8_QKV"], **launch)

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
        longest = max(s.c + s.n for s in seqs)
        cos, sin = self.rope_tables(longest + cfg.depth + 1)
        meta, kv_base, n_rows = self.pack(seqs)
        graphed = mode == "graph" or (mode == "persistent" and self.graphable(timing))
        if graphed:  # captured launches write fixed output buffers, copied out after each run
            fresh = None if fresh_outputs else self.outputs
            self.outputs = self._graph_outputs(nb)
        elif fresh_outputs:
            self.alloc_outputs(nb)
        kv = [t for s in seqs for t in (s.cache.k, s.cache.v)]
        args, const = self.kernel_args(
            weights, nb, meta=meta, row_seq=meta[nb * META_W:] if n_rows else meta, kv_base=kv_base, kv=kv,
            rope=(cos, sin), outputs=self.outputs, tree_blocks=mode != "persistent", timing=timing)
        if mode == "persistent":
            args["n_steps"] = self.n_steps
            const = dict(const, PERSISTENT=True, MAX_SPIN=self.max_spin(), TIMING=int(timing), launch_cooperative_grid=True)
            if nb == 1 and self.tuning.BLOCK_NA is None and not interpreting():
                const["BLOCK_NA"] = 32  # (Tuning.BLOCK_NA: the persistent launch's batch-1 block)
            if graphed:
                self._persistent_graphed(args, const, (self.grid,))
            else:
                self._persistent_launch(args, const, (self.grid,))
        elif mode == "steps":
            self._launch_steps(args, const, (nb, n_rows), step_hook)
        elif mode == "graph":
            # N is read from the metadata, so one graph serves every N up to the workspace's row
            # capacity: its per-row launches get programs for that many rows (the rest exit)
            # (arguments seen for the first time launch directly: those that never come back,
            # e.g. a new set of caches every call, cost no capture)
            key = (self._graph_key(args, const), ws.rows)
            graph = self._graphs.pop(key, None)
            if graph is None and self._gseen.pop(key, None) is None:
                self._keep(self._gseen, key, True)
                self._launch_steps(args, const, (nb, n_rows))
            else:
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

    def run_static(self, weights, nb: int, *, meta: torch.Tensor, row_seq: torch.Tensor, kv_base: torch.Tensor,
                   kv: list, outputs: tuple, step_hook=None) -> None:
        """The step launches of one call whose inputs are already staged on the device: the
        workspace's ``feat``/``ids``/``root``, the per-sequence metadata ``meta`` [nb, META_W]
        and ``row_seq`` [rows] (every per-row launch covers the workspace's whole row capacity;
        rows past the metadata's N exit). Reads nothing from the host and allocates nothing once
        a first call at this ``nb`` has run, so it can be captured in a CUDA graph
        (:class:`frontier.Drafter`). The rotary tables must already cover every position
        (``rope_tables``)."""
        ws = self.ws
        args, const = self.kernel_args(weights, nb, meta=meta, row_seq=row_seq, kv_base=kv_base, kv=kv,
                                       rope=(self.cos, self.sin), outputs=outputs, tree_blocks=True)
        self._launch_steps(args, const, (nb, ws.rows), step_hook)

    def kernel_args(self, weights, nb: int, *, meta, row_seq, kv_base, kv: list, rope: tuple, outputs: tuple,
                    tree_blocks: bool, timing: int = 0) -> tuple[dict, dict]:
        """The kernel's run-time arguments and compile-time constants for a launch of ``nb``
        sequences (the schedule variant is chosen here too). ``kv``: every sequence's K and V
        storage (their alignment picks VEC_KV); ``outputs``: the seven output tensors, in
        ``_OUT`` order. Buffers a plan needs (split-K scratch, lm_head logits, the QKV-ahead
        rows, packed weight copies) are allocated on first use."""
        cfg, ws = self.cfg, self.ws
        p = self.plan(nb)
        self.schedule = self.schedules[p.wide, p.fused, p.sel, p.tab]
        self.schedule_list = self.schedule_codes[p.wide, p.fused, p.sel, p.tab]
        self.n_steps = len(self.schedule)
        if p.wide and (ws.lml is None or ws.lml.numel() < ws.mr * cfg.vocab_size):
            ws.lml = torch.empty(ws.mr, cfg.vocab_size, dtype=self.dtype, device=self.device)
        lw = weights.layers[0]
        eagle3 = cfg.architecture == "eagle3"
        dummy = ws.sync  # stands in for absent optional tensors (never read)
        has_d2t = bool(eagle3 and weights.d2t is not None and cfg.vocab_size != cfg.target_vocab_size)
        n_times = self.n_steps + 1 + (1 + 2 * self.n_steps) * self.grid * (int(timing) >= 2)
        gate, up, lm_head = lw.gate_proj, lw.up_proj, weights.lm_head
        if p.pack:
            gate = self.packed("gate", gate, p.slabs["RP_GU"], p.const["BK_GU"])
            up = self.packed("up", up, p.slabs["RP_GU"], p.const["BK_GU"])
            lm_head = self.packed("lm_head", lm_head, p.slabs["RP_LM"], p.const["BK_LM"])
        if timing and ws.times.numel() < n_times:
            ws.times = torch.zeros(n_times, dtype=torch.int64, device=self.device)
        if p.qh and (ws.qh is None or ws.qh.shape[0] < ws.mr):
            nt = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
            ws.xh = torch.empty(ws.mr, cfg.hidden_size, dtype=self.dtype, device=self.device)
            ws.qh = torch.empty(ws.mr, nt, dtype=torch.float32, device=self.device)
        if p.wide and (ws.part is None or ws.part.numel() < p.part_elems * ws.mr):
            ws.part = torch.empty(p.part_elems * ws.mr, dtype=torch.float32, device=self.device)
        post_norm = lw.post_attention_layernorm  # stands in for the norms an architecture lacks
        cos, sin = rope
        args = dict(
            sched_ptr=self.schedule, n_steps=0, sync_ptr=ws.sync, time_ptr=ws.times,
            # weights
            emb_ptr=weights.embed_tokens, fcw_ptr=weights.fc_weight,
            fcb_ptr=weights.fc_bias if weights.fc_bias is not None else weights.fc_weight,
            wq_ptr=lw.q_proj, wk_ptr=lw.k_proj, wv_ptr=lw.v_proj, wo_ptr=lw.o_proj, wg_ptr=gate, wu_ptr=up,
            wd_ptr=lw.down_proj,
            ln_in_ptr=lw.input_layernorm if lw.input_layernorm is not None else post_norm, ln_post_ptr=post_norm,
            ln_hid_ptr=weights.hidden_norm if weights.hidden_norm is not None else post_norm,
            ln_f_ptr=weights.norm if weights.norm is not None else post_norm,
            lm_ptr=lm_head, d2t_ptr=weights.d2t if has_d2t else dummy, cos_ptr=cos, sin_ptr=sin,
            **self._scales(weights, dummy),
            # inputs (packed over the batch) and the caches
            meta_ptr=meta, row_seq_ptr=row_seq, feat_ptr=ws.feat, ids_ptr=ws.ids,
            root_ptr=ws.root, kv_ptr=kv_base,
            # workspace
            hcur_ptr=ws.hcur, hres_ptr=ws.hres, xin_ptr=ws.xin, qkv_ptr=ws.qkv, qr_ptr=ws.qr, ao_ptr=ws.ao,
            h1_ptr=ws.h1, n2_ptr=ws.n2, act_ptr=ws.act, hout_ptr=ws.hout, nf_ptr=ws.nf,
            xh_ptr=ws.xh if p.qh else dummy, qh_ptr=ws.qh if p.qh else dummy,
            tk_ptr=ws.tk, tv_ptr=ws.tv, apm_ptr=ws.apm, apl_ptr=ws.apl, aacc_ptr=ws.aacc, lmk_ptr=ws.lmk,
            lmmax_ptr=ws.lmmax, lmsum_ptr=ws.lmsum, lml_ptr=ws.lml if p.wide else dummy,
            part_ptr=ws.part if p.wide else dummy, sel_lp_ptr=ws.sel_lp, sel_tok_ptr=ws.sel_tok,
            fr_score_ptr=ws.fr_score, fr_tok_ptr=ws.fr_tok, fr_src_ptr=ws.fr_src, fr_pick_ptr=ws.fr_pick,
            anc_ptr=ws.anc, cand_score_ptr=ws.cand_score, cand_tok_ptr=ws.cand_tok, row_par_ptr=ws.row_par,
            cnt_ptr=ws.cnt, pf_ptr=ws.pf,
            **{f"{name}_ptr": t for name, t in zip(self._OUT, outputs)},
            # sizes
            B=nb, H=cfg.hidden_size, F=cfg.feature_size, I=cfg.intermediate_size, V=cfg.vocab_size,
            Vt=cfg.target_vocab_size, NH=cfg.num_attention_heads, NKV=cfg.num_key_value_heads, HD=cfg.head_dim,
            K=cfg.top_k, C=ws.C, T=cfg.total_token, D=cfg.depth, SK=ws.sk, MR=ws.mr, PFW=ws.pfw,
            eps=float(cfg.rms_norm_eps), sqrt_d=float(math.sqrt(cfg.head_dim)),
            **p.slabs,
        )
        vec = self.vec16(lw, kv)
        tb = self.tuning.tree_blocks
        const = dict(p.const, **vec, VEC_QH=vec["VEC_W"] if p.qh_vec else 1, HAS_D2T=has_d2t,
                     HAS_FCB=weights.fc_bias is not None, TREE_BLOCKS=tree_blocks if tb is None else tb)
        args["tab_ptr"], args["t2d_ptr"] = self.emb_table(weights, args, const) if p.tab else (dummy, dummy)
        return args, const

    def graphable(self, timing: bool = False) -> bool:
        """Whether persistent launches go through CUDA graphs: on a CUDA device, without in-kernel
        timing, and unless a capture on this drafter failed (then it launches directly)."""
        return (not timing and self.device.type == "cuda" and not interpreting()
                and self.graph_error is None)

    def _persistent_launch(self, args, const, grid) -> None:
        """The one cooperative launch of the whole schedule (the barrier counter zeroed first)."""
        self.ws.sync.zero_()
        try:
            drafter_kernel[grid](**args, **const)
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
        return (tuple((k, a.data_ptr() if isinstance(a, torch.Tensor) else a) for k, a in args.items()),
                tuple(sorted(const.items())))

    def _keep(self, table: dict, key, value) -> None:
        """Insert as most recently used; drop the least recently used beyond ``max_graphs``."""
        table[key] = value
        while len(table) > self.max_graphs:
            table.pop(next(iter(table)))

    def vec16(self, lw, kv: list) -> dict:
        """The kernel's VEC_W / VEC_KV: elements per 16 bytes when the QKV weight rows / every
        cache's K/V rows and offsets are proven 16-byte aligned (the kernel then declares those
        loads aligned: vector loads in the cp.async pipeline instead of 2-byte scalars), else 1.
        True for contiguous real heads; odd test sizes may not be."""
        el_w, el = lw.q_proj.element_size(), self.dtype.itemsize
        w_ok = rows_aligned([lw.q_proj, lw.k_proj, lw.v_proj])
        # the caches' layer 0 ([kv heads, max_length, head_dim]: the storage without its layer stride)
        kv_ok = rows_aligned(kv, skip=1)
        return dict(VEC_W=16 // el_w if w_ok else 1, VEC_KV=16 // el if kv_ok else 1)

    max_graphs = 32  # captured graphs kept per drafter (one per batch size x row capacity x buffers)

    def _launch_steps(self, args, const, shape: tuple[int, int], step_hook=None) -> None:
        """One launch per schedule entry (the interpreter path; on GPU the graph mode's body):
        the kernel built for the entry's phase alone on its own grid
        (``step_grid`` for ``shape`` = (sequences, packed new rows)); the grids are worked out here,
        when launches are made, not on every replay of a captured graph."""
        args = dict(args)
        self.step_grid_list = [self.step_grid(code, *shape) for code in self.schedule_list]
        pdl = self.pdl_on()
        ctx_const = self.plan(shape[0]).ctx_const
        for st in range(self.n_steps):
            if step_hook is not None:
                step_hook(st)
            args["sched_ptr"] = self.schedule[st:]
            args["n_steps"] = 1
            ph, i = divmod(self.schedule_list[st], 256)
            grid = (self.step_grid_list[st],)
            kw = dict(const, PERSISTENT=False, MAX_SPIN=1, TIMING=False, PHASE=ph)
            if i == CONTEXT_STEP and ph in ctx_const:
                kw.update(ctx_const[ph])
            if pdl:
                kw.update(self.pdl_const(st))
                if ph in self._STREAM_PHASES and self._two_per_sm(args, grid, kw):
                    kw["launch_pdl"] = False  # launched early, its programs could pile up two to an SM
            drafter_kernel[grid](**args, **kw)

    _STREAM_PHASES = (Phase.FC, Phase.QKV, Phase.OPROJ, Phase.GATEUP, Phase.DOWN, Phase.LMHEAD)

    def pdl_on(self) -> bool:
        """Whether step launches may use programmatic dependent launch (``Tuning.pdl``): not
        under the interpreter, on a CPU, a GPU before sm_90, or a Triton without grid dependency
        control."""
        return bool(self.tuning.pdl and HAS_GDC and self.device.type == "cuda" and not interpreting()
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
            ck = drafter_kernel.warmup(**args, grid=grid, **kw)
            ck._init_handles()
            props = torch.cuda.get_device_properties(self.device)
            smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
            regs = getattr(props, "regs_per_multiprocessor", 65536)
            warps = kw.get("num_warps", 4)
            per_warp = -(-ck.n_regs * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
            self._two_fit[key] = (2 * (ck.metadata.shared + 1024) <= smem and 2 * warps * per_warp <= regs)
        return self._two_fit[key]

    def pdl_const(self, st: int) -> dict:
        """Step launch ``st``'s PDL settings: the launch option and the kernel's PDL (1: the next
        launch may start right after this one's wait; 2: after its work). Every launch waits for
        the one before it, so each one's writes are visible to all later ones. A weight stream
        lets the next launch start early only when that is another stream or a launch of at most
        ``Tuning.pdl_max_grid`` programs (which fit beside it); otherwise after its work, so the
        next launch's programs do not take SMs the stream still needs."""
        ph = self.schedule_list[st] // 256
        last = st + 1 == self.n_steps
        nph = -1 if last else self.schedule_list[st + 1] // 256
        small = not last and self.step_grid_list[st + 1] <= self.tuning.pdl_max_grid
        early = ph not in self._STREAM_PHASES or nph in self._STREAM_PHASES or small
        return dict(launch_pdl=True, PDL=1 if early else 2)

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


__all__ = ["Launcher", "SeqCall", "Tuning", "Workspace", "build_schedule", "interpreting", "num_sms"]
