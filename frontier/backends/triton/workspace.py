"""Device buffers of the drafter: the scratch of one draft call (:class:`Workspace`, reused
across calls and grown when a call needs more) and the per-sequence inputs it stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .plan import block_sizes


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



class Workspace:
    """Scratch buffers of one draft call, reused across calls: sized for up to ``batch``
    sequences and ``rows`` packed new rows."""

    def __init__(self, cfg, dtype: torch.dtype, device: torch.device, batch: int, rows: int, grid: int, kp: int,
                 attn_chunks: int = 1):
        h, k, d = cfg.hidden_size, cfg.top_k, cfg.head_dim
        nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        depth = cfg.depth
        self.batch, self.rows, self.grid = batch, rows, grid
        bs = block_sizes(cfg)
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
        # launches with Launcher.qkv_ahead (lazy, [mr, H] / [mr, q+k+v] fp32): the next depth's
        # hidden_norm rows and their QKV partials over the hidden half of its input
        self.xh: Optional[torch.Tensor] = None
        self.qh: Optional[torch.Tensor] = None
        self.tk = e(nkv, batch * self.sk, d)
        self.tv = e(nkv, batch * self.sk, d)
        # attention parts: per (sequence, KV head) NCH context chunks + one part per ancestor (up to
        # depth + 1), each for BLOCK_Q queries; with NCH as ``Launcher.attn_chunks`` picks it, for
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

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values() if isinstance(t, torch.Tensor))
