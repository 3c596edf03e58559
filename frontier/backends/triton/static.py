"""The triton drafter over a :class:`frontier.Drafter`'s fixed-size buffers.

The kernels already read each sequence's cache length and new-row count from a device metadata
block; here one small launch (``kernels.stage``) builds that block from the drafter's
``lengths`` and ``new_rows``, packs the staged rows (slot after slot) into the workspace and
flags bad values, and another one after the draft commits the valid slots' rows. Every launch
covers the workspace's row capacity (rows past the call's N exit), so one captured graph serves
any mix of row counts. The launcher (workspace, rotary tables, packed weight copies, the
embedding-QKV table) is private to the Drafter and sized for every batch up to ``max_batch`` when
it is made; packed weight copies are kept per slab plan and repacked in place, and the table is
made again in place: a graph captured at one batch size stays valid whatever the Drafter runs
afterwards.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ...errors import InputError
from ...tree import pack_tree
from .kernels import META_W
from .kernels.stage import finish_kernel, stage_kernel
from .fp8 import stream_formats
from .launch import Launcher
from .plan import interpreting
from .tuning import _pow2


class StaticTriton:
    """``Drafter.draft`` for triton: one staging launch, the step launches, one finishing launch."""

    def __init__(self, drafter, *, tuning=None, pack_weights: bool = True) -> None:
        from .backend import TritonBackend
        from .tuning import Tuning

        cfg = drafter.cfg
        if cfg.num_layers != 1:
            raise InputError(f"backend 'triton' runs single-layer draft heads, got num_layers={cfg.num_layers}: "
                             "use backend='torch_ref'")
        if cfg.top_k > 16:
            raise InputError(f"backend 'triton' supports top_k <= 16, got top_k={cfg.top_k}: use backend='torch_ref'")
        if drafter.device.type == "cpu" and not interpreting():
            raise InputError("backend 'triton' needs a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)")
        if not isinstance(pack_weights, bool):
            raise InputError(f"option pack_weights must be True or False, got {pack_weights!r}")
        tuning = replace(TritonBackend._tuning(tuning) or Tuning(), pack_weights=pack_weights)
        self.d = drafter
        dev, bsz, r = drafter.device, drafter.max_batch, drafter.max_new_rows
        self.launcher = Launcher(cfg, drafter.dtype, dev, tuning, stream_formats(drafter.weights, drafter.dtype))
        self.launcher.pin_packed = True
        ws = self.launcher.workspace(bsz, bsz * r)  # sized once: never regrown, so graphs stay valid
        self._scratch_for_every_batch(ws, bsz)
        self.launcher.rope_tables(drafter.storage_rows + cfg.depth + 1)  # every position a slot can reach
        kv = drafter.kv  # [2, B, 1, nkv, S, d]: K of slot b at element b * stride(1), V one stride(0) on
        slots = torch.arange(bsz, device=dev)
        self.k_off = slots * kv.stride(1)  # [B]
        self.v_off = kv.stride(0) + slots * kv.stride(1)  # [B]
        self.meta = torch.zeros(bsz, META_W, dtype=torch.int64, device=dev)
        self.row_seq = torch.zeros(ws.rows, dtype=torch.int64, device=dev)
        self.flag = torch.zeros(bsz, dtype=torch.int32, device=dev)  # staging's bad-value flags (zero between steps)
        self.parents = torch.zeros(bsz, cfg.total_token - 1, dtype=torch.int64, device=dev)
        self.leaf = torch.zeros(bsz, 2, dtype=torch.int64, device=dev)  # [leaf count, deepest level]

    def _scratch_for_every_batch(self, ws, bsz: int) -> None:
        """The plan-dependent scratch (split-K partials, lm_head logits, the QKV-ahead rows) at the
        largest size any batch up to ``bsz`` needs, so that no later batch size reallocates what an
        earlier captured graph points at."""
        cfg, dev, dtype = self.d.cfg, self.d.device, self.d.dtype
        plans = [self.launcher.plan(b) for b in range(1, bsz + 1)]
        if any(p.wide for p in plans):
            ws.lml = torch.empty(ws.mr, cfg.vocab_size, dtype=dtype, device=dev)
            ws.part = torch.empty(max(p.part_elems for p in plans) * ws.mr, dtype=torch.float32, device=dev)
        if any(p.qh for p in plans):
            nt = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
            ws.xh = torch.empty(ws.mr, cfg.hidden_size, dtype=dtype, device=dev)
            ws.qh = torch.empty(ws.mr, nt, dtype=torch.float32, device=dev)

    def step(self, batch: int, commit: bool) -> None:
        d, ws, o, bufs = self.d, self.launcher.ws, self.d.outputs, self.d.buffers
        cfg, r = d.cfg, d.max_new_rows
        stage_kernel[(batch, r)](
            new_rows_ptr=bufs.new_rows, lengths_ptr=bufs.lengths, ids_in_ptr=bufs.token_ids, feat_in_ptr=bufs.features,
            flag_ptr=self.flag, k_off_ptr=self.k_off, v_off_ptr=self.v_off, meta_ptr=self.meta,
            row_seq_ptr=self.row_seq, ids_out_ptr=ws.ids, feat_out_ptr=ws.feat, root_ptr=ws.root,
            R=r, F=cfg.feature_size, Vt=cfg.target_vocab_size, MAX_CTX=d.max_context, S_ROWS=d.storage_rows,
            BLOCK_B=_pow2(d.max_batch), BLOCK_F=min(1024, _pow2(cfg.feature_size)),
        )
        outputs = (o.draft_tokens[:batch], self.parents[:batch], o.scores[:batch], o.tree_mask[:batch],
                   o.tree_position_ids[:batch], o.retrieve_indices[:batch], self.leaf[:batch])
        kv = [t for b in range(batch) for t in (bufs.k[b], bufs.v[b])]
        self.launcher.run_static(d.weights, batch, meta=self.meta[:batch], row_seq=self.row_seq, kv_base=d.kv,
                                 kv=kv, outputs=outputs)
        finish_kernel[(d.max_batch,)](
            flag_ptr=self.flag, score_ptr=o.scores, new_rows_ptr=bufs.new_rows, lengths_ptr=bufs.lengths,
            pending_ptr=bufs.pending, invalid_ptr=o.invalid, leaf_ptr=self.leaf, leaf_out_ptr=o.leaf_count,
            par_ptr=self.parents, par_out_ptr=o.parents, NB=batch, R=r, T=cfg.total_token,
            COMMIT=int(commit), BLOCK_T=_pow2(cfg.total_token),
        )
        if d.sampling:  # sampling orders retrieve rows lexicographically: the shared packer does it
            for b in range(batch):
                # (clamped: a flagged slot's parents may be anything, and must not index out of the tree)
                parents = self.parents[b].clamp(0, cfg.total_token - 1)
                packed = pack_tree(parents, sampling=True, padded=True, max_depth=cfg.depth + 1)
                o.retrieve_indices[b].copy_(packed.retrieve_indices)
