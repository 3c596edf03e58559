"""A deliberately naive, independently written EAGLE draft head for tests.

It follows the structure of the public EAGLE code rather than frontier's: a stateful object
keeping the context K/V as a growing list, batch-first [1, N, ...] tensors, a full additive
attention mask over (context + all tree rows so far) built from a tree-mask matrix, and plain
Python loops/lists for the candidate bookkeeping, the parent search, the tree mask and the
retrieve paths. Floating-point operations are done in the same order as the reference so
that float32 results are bitwise comparable.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _norm(x, w, eps):
    t = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(t)


def _rot(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class NaiveEagle:
    def __init__(self, cfg, weights):
        self.cfg, self.w = cfg, weights
        self.ctx_k = None  # per layer [1, nkv, c, d]
        self.ctx_v = None

    # ---- the layer ----------------------------------------------------------------------
    def _rope(self, positions, dtype):
        d = self.cfg.head_dim
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, d, 2).float() / d))
        t = positions.float()
        if self.cfg.rope_scaling is not None:
            t = t / float(self.cfg.rope_scaling["factor"])
        f = torch.einsum("i,j->ij", t, inv)
        e = torch.cat((f, f), dim=-1)
        return e.cos().to(dtype), e.sin().to(dtype)

    def _attn(self, lw, x, positions, past_k, past_v, mask):
        cfg = self.cfg
        b, n, _ = x.shape
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = F.linear(x, lw.q_proj).view(b, n, nh, d).transpose(1, 2)
        k = F.linear(x, lw.k_proj).view(b, n, nkv, d).transpose(1, 2)
        v = F.linear(x, lw.v_proj).view(b, n, nkv, d).transpose(1, 2)
        cos, sin = self._rope(positions, x.dtype)
        cos, sin = cos[None, None], sin[None, None]
        q = q * cos + _rot(q) * sin
        k = k * cos + _rot(k) * sin
        kk = torch.cat((past_k, k), dim=2) if past_k is not None else k
        vv = torch.cat((past_v, v), dim=2) if past_v is not None else v
        rep = nh // nkv
        kr = kk[:, :, None].expand(b, nkv, rep, kk.shape[2], d).reshape(b, nh, kk.shape[2], d)
        vr = vv[:, :, None].expand(b, nkv, rep, vv.shape[2], d).reshape(b, nh, vv.shape[2], d)
        s = torch.matmul(q, kr.transpose(2, 3)) / math.sqrt(d)
        s = s + mask[None, None]
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(p, vr).transpose(1, 2).reshape(b, n, nh * d)
        return F.linear(o, lw.o_proj), kk, vv

    def _mlp(self, lw, x):
        return F.linear(F.silu(F.linear(x, lw.gate_proj)) * F.linear(x, lw.up_proj), lw.down_proj)

    def forward(self, hidden, ids, positions, past, mask):
        """hidden [1, N, F|H], ids [1, N], past: list per layer of (k, v) or None. Returns h, new past."""
        cfg, w = self.cfg, self.w
        eps = cfg.rms_norm_eps
        emb = w.embed_tokens[ids].to(hidden.dtype)
        new_past = []
        if cfg.architecture == "eagle3":
            if hidden.shape[-1] != emb.shape[-1]:
                hidden = F.linear(hidden, w.fc_weight)
            lw = w.layers[0]
            res = hidden
            x = torch.cat((_norm(emb, lw.input_layernorm, eps), _norm(hidden, w.hidden_norm, eps)), dim=-1)
            pk, pv = past[0] if past else (None, None)
            a, kk, vv = self._attn(lw, x, positions, pk, pv, mask)
            h = res + a
            h = h + self._mlp(lw, _norm(h, lw.post_attention_layernorm, eps))
            return h, [(kk, vv)]
        h = F.linear(torch.cat((emb, hidden), dim=-1), w.fc_weight, w.fc_bias)
        for i, lw in enumerate(w.layers):
            res = h
            x = h if i == 0 else _norm(h, lw.input_layernorm, eps)
            pk, pv = past[i] if past else (None, None)
            a, kk, vv = self._attn(lw, x, positions, pk, pv, mask)
            h = res + a
            h = h + self._mlp(lw, _norm(h, lw.post_attention_layernorm, eps))
            new_past.append((kk, vv))
        return h, new_past

    def logp(self, h):
        if self.cfg.architecture == "eagle3":
            h = _norm(h, self.w.norm, self.cfg.rms_norm_eps)
        return torch.log_softmax(F.linear(h, self.w.lm_head), dim=-1)

    def to_target(self, idx):
        if self.cfg.vocab_size == self.cfg.target_vocab_size or self.w.d2t is None:
            return idx
        return idx + self.w.d2t[idx]

    # ---- one draft call -------------------------------------------------------------------
    def draft(self, features, input_ids, sampling=False):
        cfg = self.cfg
        K, D, T = cfg.top_k, cfg.depth, cfg.total_token
        root = int(input_ids[0, -1])
        ids = input_ids[:, 1:]
        L = ids.shape[1]
        c = 0 if self.ctx_k is None else self.ctx_k[0].shape[2]
        n = features.shape[1]
        assert c + n == L
        # full causal mask over (c cached + n new), as the reference builds it
        mask = torch.zeros(n, c + n)
        for r in range(n):
            for col in range(c + n):
                if col > c + r:
                    mask[r, col] = torch.finfo(torch.float32).min
        past = None if self.ctx_k is None else list(zip(self.ctx_k, self.ctx_v))
        h, past = self.forward(features, ids[:, c:], torch.arange(c, L), past, mask)
        self.ctx_k = [p[0] for p in past]
        self.ctx_v = [p[1] for p in past]

        h_last = h[:, -1]
        lp = self.logp(h_last)[0]
        top = torch.topk(lp, K)
        cand_scores_t = [top.values]
        cand_tokens = [int(x) for x in self.to_target(top.indices)]
        cand_parent = [0] * K  # stored parent per candidate (candidate index + 1, 0 = root)
        cand_index_of_row = list(range(K))
        rows_tokens = self.to_target(top.indices)
        rows_hidden = h_last[:, None].repeat(1, K, 1)
        rows_scores = top.values
        tree_rows_mask = [[1 if a == b else 0 for b in range(K)] for a in range(K)]  # [K][K*(i+1)]
        for i in range(D):
            width = len(tree_rows_mask[0])
            m = torch.zeros(K, L + width)
            for r in range(K):
                for col in range(width):
                    if tree_rows_mask[r][col] == 0:
                        m[r, L + col] = torch.finfo(torch.float32).min
            hh, past = self.forward(rows_hidden, rows_tokens[None], torch.full((K,), L + i), past, m)
            lp = self.logp(hh[0])
            top = torch.topk(lp, K, dim=-1)
            cs = top.values + rows_scores[:, None]
            cand_scores_t.append(cs.reshape(-1))
            for r in range(K):
                for j in range(K):
                    cand_tokens.append(int(self.to_target(top.indices[r, j])))
                    cand_parent.append(cand_index_of_row[r] + 1)
            best = torch.topk(cs.reshape(-1), K)
            base = K + i * K * K
            cand_index_of_row = [base + int(b) for b in best.indices]
            parent_rows = [int(b) // K for b in best.indices]
            rows_tokens = torch.tensor([cand_tokens[ci] for ci in cand_index_of_row])
            rows_hidden = hh[:, parent_rows]
            rows_scores = best.values
            tree_rows_mask = [
                tree_rows_mask[p] + [1 if a == b else 0 for b in range(K)] for a, p in enumerate(parent_rows)
            ]
        all_scores = torch.cat(cand_scores_t).tolist()
        # best T-1 scores, equal scores ranked by lower candidate index (keeps parents)
        ranked = sorted(range(len(all_scores)), key=lambda idx: (-all_scores[idx], idx))
        chosen = sorted(ranked[: T - 1])
        draft = [root] + [cand_tokens[x] for x in chosen]
        # parent position in draft_tokens, by linear search
        par = [0]
        for x in chosen:
            p = cand_parent[x]
            par.append(0 if p == 0 else 1 + chosen.index(p - 1))
        mask_rows = []
        for node in range(T):
            row = [0] * T
            a = node
            row[a] = 1
            while a != 0:
                a = par[a]
                row[a] = 1
            mask_rows.append(row)
        depth = [sum(r) - 1 for r in mask_rows]
        is_parent = set(par[1:])
        paths = []
        for node in range(T):
            if node in is_parent:
                continue
            path = [node]
            while path[-1] != 0:
                path.append(par[path[-1]])
            paths.append(path[::-1])
        width = max(depth) + 1
        paths = [p + [-1] * (width - len(p)) for p in paths]
        if sampling:
            paths.sort(key=lambda p: [x if x >= 0 else T + 5 for x in p])
        return (
            torch.tensor([draft]),
            torch.tensor(paths, dtype=torch.long),
            torch.tensor(mask_rows, dtype=torch.float32)[None, None],
            torch.tensor(depth, dtype=torch.long),
        )
