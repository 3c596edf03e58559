"""torch_ref over a :class:`frontier.Drafter`'s fixed-size buffers: the same steps as
:mod:`.draft`, with every shape fixed by the drafter's budget so that a CUDA graph can capture it.

Each slot's context is the whole K/V storage (S rows) with the rows past its length masked, and
its new rows are all R staged rows with those past ``n`` masked; lengths and row counts stay on
the device. Masked keys get the same additive mask as the public EAGLE code (their softmax
weight is exactly 0), but the softmax and ``@ v`` sum over more (zero) terms than
:mod:`.draft`'s, and the projections run over R rows rather than n, which may round differently
in the last bit: trees equal :mod:`.draft`'s except at near-ties.
"""

from __future__ import annotations

import torch

from ...drafter import StaticStep
from ...tree import frontier_from_candidates
from .draft import Candidates, expand_depth, root_children
from .layer import MASKED, draft_forward


class StaticTorchRef(StaticStep):
    """``Drafter.draft`` for torch_ref: one slot after the other, fixed shapes, no host read."""

    def __init__(self, drafter) -> None:
        super().__init__(drafter)
        # an fp8 head's dequantized copy, made once and held here: captured graphs read it, so
        # it must outlive the head's memo (``DraftWeights.clear_memo``, a refresh after a change)
        self.w = drafter.weights.dequantized()

    def draft(self, batch: int, st) -> None:
        for b in range(batch):
            self._draft_slot(b, st.c[b], st.n[b], st.ids[b], st.root[b])

    def _draft_slot(self, b: int, c: torch.Tensor, n: torch.Tensor, ids: torch.Tensor, root: torch.Tensor) -> None:
        d = self.d
        cfg, w, bufs = d.cfg, self.w, d.buffers
        r, s = d.max_new_rows, d.storage_rows
        dev = d.device
        layers = range(cfg.num_layers)
        k_store, v_store = bufs.k[b], bufs.v[b]  # [layers, nkv, S, d]

        # 1. context step: all R staged rows at positions c + j; row j sees the cached rows
        #    [0, c) and the new rows j' <= j with j' < n
        j = torch.arange(r, device=dev)  # [R]
        cached = torch.arange(s, device=dev) < c  # [S]
        new = (j[None, :] <= j[:, None]) & (j[None, :] < n)  # [R, R]
        visible = torch.cat((cached[None, :].expand(r, -1), new), dim=1)  # [R, S + R]
        mask = torch.zeros(visible.shape, dtype=torch.float32, device=dev).masked_fill_(~visible, MASKED)
        # rows nobody may see are zeroed, not only masked: a NaN there (scratch of a flagged call,
        # stale staging) would turn a masked score or a zero weight times its value into NaN
        keep = cached[None, :, None]  # [1, S, 1]
        past_k = [torch.where(keep, k_store[layer], 0) for layer in layers]  # [nkv, S, d] each
        past_v = [torch.where(keep, v_store[layer], 0) for layer in layers]
        feats = torch.where((j < n)[:, None], bufs.features[b], 0)  # [R, F]
        out = draft_forward(cfg, w, ids, feats, c + j, past_k, past_v, mask)
        h_last = out.hidden.index_select(0, (n - 1).reshape(1))[0]  # [H]

        # 2. the depth loop over [storage rows, staged rows, tree rows]; the context's real rows
        #    are the cached ones and the first n staged ones
        cand = Candidates(scores=[], tokens=[], row_parents=[])
        rows = root_children(cfg, w, h_last, cand)
        context = torch.cat((cached, j < n))  # [S + R]
        scratch_k = [torch.cat((past_k[layer], out.keys[layer]), dim=1) for layer in layers]
        scratch_v = [torch.cat((past_v[layer], out.values[layer]), dim=1) for layer in layers]
        for i in range(cfg.depth):
            rows = expand_depth(cfg, w, i, rows, c + n, scratch_k, scratch_v, cand, visible=context)

        # 3. final selection and packing, into the slot's outputs
        fr = frontier_from_candidates(
            torch.cat(cand.scores), torch.cat(cand.tokens), torch.cat(cand.row_parents), root.reshape(1),
            total_token=cfg.total_token, top_k=cfg.top_k, depth=cfg.depth, sampling=d.sampling, padded=True,
        )
        d.outputs.write(b, fr)

        # the staged rows' K/V into storage rows [c, c + R): the first n become the slot's new
        # context when the call commits, the rest stay scratch (c <= max_context keeps them in bounds)
        at = c + j  # [R]
        for layer in layers:
            k_store[layer].index_copy_(1, at, out.keys[layer])
            v_store[layer].index_copy_(1, at, out.values[layer])

