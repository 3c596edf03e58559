"""The triton drafter over a :class:`frontier.Drafter`'s fixed-size buffers.

The kernels already read each sequence's cache length and new-row count from a device metadata
block; here that block is built on the device from the drafter's ``lengths`` and ``new_rows``,
and the staged rows are packed (slot after slot) into the workspace by one gather. Every launch
covers the workspace's row capacity (rows past the call's N exit), so one captured graph serves
any mix of row counts. The launcher (workspace, rotary tables, packed weight copies) is private
to the Drafter: nothing another call does can move a buffer a captured graph points at.
"""

from __future__ import annotations

import torch

from ...errors import InputError
from ...tree import pack_tree
from .kernels import META_W
from .launch import Drafter as Launcher
from .plan import interpreting


class StaticTriton:
    """``Drafter.draft`` for triton: stage on the device, then the step launches."""

    def __init__(self, drafter, *, tuning=None, pack_weights: bool = True) -> None:
        import dataclasses

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
        tuning = dataclasses.replace(TritonBackend._tuning(tuning) or Tuning(), pack_weights=pack_weights)
        self.d = drafter
        dev, bsz, r = drafter.device, drafter.max_batch, drafter.max_new_rows
        self.launcher = Launcher(cfg, drafter.dtype, dev, tuning)
        ws = self.launcher.workspace(bsz, bsz * r)  # sized once: never regrown, so graphs stay valid
        self.launcher.rope_tables(drafter.storage_rows + cfg.depth + 1)  # every position a slot can reach
        kv = drafter.kv  # [2, B, 1, nkv, S, d]: K of slot b at element b * stride(1), V one stride(0) on
        slots = torch.arange(bsz, device=dev)
        self.k_off = slots * kv.stride(1)  # [B]
        self.v_off = kv.stride(0) + slots * kv.stride(1)  # [B]
        self.meta = torch.zeros(bsz, META_W, dtype=torch.int64, device=dev)
        self.row_seq = torch.zeros(ws.rows, dtype=torch.int64, device=dev)
        self.rows = torch.arange(ws.rows, device=dev)  # [rows] packed row ids
        self.parents = torch.zeros(bsz, cfg.total_token - 1, dtype=torch.int64, device=dev)
        self.leaf = torch.zeros(bsz, 2, dtype=torch.int64, device=dev)  # [leaf count, deepest level]

    def draft(self, batch: int, st) -> None:
        d, ws, o = self.d, self.launcher.ws, self.d.outputs
        r = d.max_new_rows
        # the metadata block: [c, n, first packed row, K offset, V offset, storage rows, N, 0]
        ends = st.n.cumsum(0)  # [b]
        first = ends - st.n  # [b]
        cols = (st.c, st.n, first, self.k_off[:batch], self.v_off[:batch], torch.full_like(st.c, d.storage_rows),
                ends[-1:].expand(batch), torch.zeros_like(st.c))
        self.meta[:batch].copy_(torch.stack(cols, dim=1))
        # packed rows: row m belongs to slot seq[m], its staged row m - first[seq[m]]
        seq = torch.searchsorted(ends, self.rows, right=True).clamp_(max=batch - 1)  # [rows]
        self.row_seq.copy_(seq)
        src = seq * r + (self.rows - first[seq]).clamp(0, r - 1)  # [rows] (rows past N: any staged row)
        torch.index_select(d.buffers.features.view(-1, d.cfg.feature_size), 0, src, out=ws.feat[: ws.rows])
        torch.index_select(st.ids.reshape(-1), 0, src, out=ws.ids[: ws.rows])
        ws.root[:batch].copy_(st.root)
        outputs = (o.draft_tokens[:batch], self.parents[:batch], o.scores[:batch], o.tree_mask[:batch],
                   o.tree_position_ids[:batch], o.retrieve_indices[:batch], self.leaf[:batch])
        kv = [t for b in range(batch) for t in (d.buffers.k[b], d.buffers.v[b])]
        self.launcher.run_static(d.weights, batch, meta=self.meta[:batch], row_seq=self.row_seq, kv_base=d.kv,
                                 kv=kv, outputs=outputs)
        o.leaf_count[:batch].copy_(self.leaf[:batch, 0])
        o.parents[:batch, 1:].copy_(self.parents[:batch])
        o.parents[:batch, 0].zero_()
        if d.sampling:  # sampling orders retrieve rows lexicographically: the shared packer does it
            for b in range(batch):
                packed = pack_tree(self.parents[b], sampling=True, padded=True, max_depth=d.cfg.depth + 1)
                o.retrieve_indices[b].copy_(packed.retrieve_indices)
