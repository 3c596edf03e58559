"""The target model's side of the loop: prefill, verify, and the KV cache bookkeeping.

:class:`TargetRunner` runs a Hugging Face causal LM (Llama family, eager or sdpa attention) and
captures the draft head's features through forward hooks: EAGLE-3 concatenates the hidden states
entering layers 2, L//2 and L-3 (:func:`eagle3_tap_layers`), EAGLE-2 takes the final, normed
hidden state.

- ``prefill`` / ``prefill_batch``: one forward over the prompt(s); the last logits and the
  features of every prompt row.
- ``verify`` / ``verify_batch``: one forward over the T tree tokens of each sequence at positions
  ``context + tree depth``, attending to the cached context plus the tree's ancestors (an
  additive 4-D mask). The cache grows by T rows.
- ``compact_cache`` / ``compact_cache_batch``: the accepted path's K/V rows move right after the
  context; the other tree rows are dropped (batch: left as holes past each sequence's length,
  masked by the next verify). ``select_cache_rows`` drops the sequences that stopped.

The cache is passed to the model under the name its ``forward`` declares (:func:`cache_keyword`:
``cache`` in current transformers, ``past_key_values`` in older releases) and read back from the
output under the same name (:func:`returned_cache`).

A tensor-parallel target (transformers' TP plans, :mod:`.distributed`) runs the same forwards on
every rank: its logits and the hidden states the hooks capture come out replicated (a DTensor
output is gathered to a full tensor), and its KV cache holds this rank's key/value heads, which
the compaction indexes along the sequence dimension like any other cache.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..errors import FrontierError, InputError

__all__ = [
    "TargetRunner", "cache_keyword", "check_cache", "check_cache_length", "compact_cache", "compact_cache_batch",
    "eagle3_tap_layers", "returned_cache", "select_cache_rows",
]


def eagle3_tap_layers(num_layers: int) -> list[int]:
    """Decoder layers whose INPUT hidden states EAGLE-3 concatenates: 2, L//2, L-3.

    Like the public EAGLE target code, a layer is tapped once even if two of the three indices
    coincide (small L), in ascending order; indices outside [0, L) are dropped.
    """
    return sorted({i for i in (2, num_layers // 2, num_layers - 3) if 0 <= i < num_layers})


def _full(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a plain tensor holding every element: a DTensor output of a TP forward is gathered."""
    full_tensor = getattr(x, "full_tensor", None)
    return full_tensor() if full_tensor is not None else x


def _decoder_layers(target: Any) -> Any:
    base = getattr(target, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None and hasattr(target, "get_decoder"):
        layers = getattr(target.get_decoder(), "layers", None)
    if layers is None:
        raise InputError(
            f"target {type(target).__name__} has no decoder layers at .model.layers; "
            "frontier.generate supports Llama-family causal LMs"
        )
    return layers


def cache_keyword(model: Any) -> str:
    """The keyword under which ``model.forward`` takes the KV cache: ``"cache"`` where it declares
    that parameter (current transformers), else ``"past_key_values"`` (older releases)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature: the long-standing name
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The KV cache of a model output: its ``cache`` field where the output class declares one,
    else ``past_key_values``."""
    if "cache" in getattr(type(out), "__dataclass_fields__", {}):
        return out.cache
    return out.past_key_values


class TargetRunner:
    """Runs the target and captures the draft features through forward hooks."""

    SUPPORTED_ATTN = ("eager", "sdpa")

    def __init__(self, target: Any, architecture: str) -> None:
        if not isinstance(target, torch.nn.Module) or not callable(getattr(target, "forward", None)):
            raise InputError(f"target must be a Hugging Face causal LM (torch.nn.Module), got {type(target).__name__}")
        self.target = target
        cfg = getattr(target, "config", None)
        if cfg is None:
            raise InputError(f"target {type(target).__name__} has no .config")
        attn = getattr(cfg, "_attn_implementation", None) or "eager"
        if attn not in self.SUPPORTED_ATTN:
            raise InputError(
                f"target uses attn_implementation={attn!r}, which cannot take the tree's 4-D attention mask; "
                "load it with attn_implementation='sdpa' or 'eager'"
            )
        self.layers = _decoder_layers(target)
        self.num_layers = len(self.layers)
        self.hidden_size = int(cfg.hidden_size)
        head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        self.vocab_size = int(head.weight.shape[0]) if head is not None else int(cfg.vocab_size)
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.architecture = architecture
        self.taps = eagle3_tap_layers(self.num_layers) if architecture == "eagle3" else []
        self.feature_size = len(self.taps) * self.hidden_size if architecture == "eagle3" else self.hidden_size
        self.cache_kwarg = cache_keyword(target)  # "cache" or "past_key_values"
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list[Any] = []

    # -- hooks -----------------------------------------------------------------------------
    def attach(self) -> None:
        if self._hooks:
            return
        if self.architecture == "eagle3":
            for i in self.taps:

                def pre_hook(module, args, kwargs, _i=i):
                    h = args[0] if args else kwargs.get("hidden_states")
                    self._captured[_i] = _full(h)

                self._hooks.append(self.layers[i].register_forward_pre_hook(pre_hook, with_kwargs=True))
        else:
            base = getattr(self.target, "model", None) or self.target.get_decoder()

            def post_hook(module, args, output):
                h = output[0] if isinstance(output, tuple) else getattr(output, "last_hidden_state", output)
                self._captured[-1] = _full(h)

            self._hooks.append(base.register_forward_hook(post_hook))

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._captured.clear()

    def _features(self) -> torch.Tensor:
        if self.architecture == "eagle3":
            # (.to: a target split over devices taps its layers on different ones)
            feats = torch.cat([self._captured[i].to(self.device) for i in self.taps], dim=-1)  # [1, n, k*H]
        else:
            feats = self._captured[-1].to(self.device)  # [1, n, H]
        self._captured.clear()
        return feats

    def _logits(self, out: Any) -> torch.Tensor:
        """The forward's logits [..., V_t], whole: a tensor-parallel plan must gather the lm_head's output."""
        logits = _full(out.logits)
        if logits.shape[-1] != self.vocab_size:
            raise InputError(
                f"the target's logits have {logits.shape[-1]} columns but its lm_head has {self.vocab_size} rows: its "
                "tensor-parallel plan leaves the lm_head's output sharded (e.g. 'colwise'); use a plan whose lm_head "
                "gathers it ('colwise_gather_output', transformers' plan for Llama)"
            )
        return logits

    # -- forwards --------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Returns (last logits [1, V_t], features [1, P, F], cache)."""
        out = self.target(input_ids=input_ids, use_cache=True, logits_to_keep=1)
        cache = returned_cache(out)
        check_cache(cache)
        return self._logits(out)[:, -1].to(self.device), self._features(), cache

    def verify(
        self, tokens: torch.Tensor, tree_mask: torch.Tensor, tree_position_ids: torch.Tensor, context: int, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over the T tree tokens. Returns (logits [T, V_t], features [1, T, F])."""
        t = tokens.shape[-1]
        neg = torch.finfo(self.dtype).min
        tree_part = torch.where(tree_mask[0, 0] > 0, 0.0, neg).to(self.dtype)  # [T, T]
        mask = torch.cat(
            [torch.zeros(t, context, dtype=self.dtype, device=self.device), tree_part], dim=1
        )[None, None]  # [1, 1, T, context + T]: full context + the tree's ancestors-or-self
        position_ids = (tree_position_ids + context)[None]  # [1, T]
        out = self.target(
            input_ids=tokens, attention_mask=mask, position_ids=position_ids, use_cache=True,
            **{self.cache_kwarg: cache},
        )
        return self._logits(out)[0].to(self.device), self._features()

    def prefill_batch(self, prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One forward over B ragged prompts (1-D each), right-padded to P = max P_b.

        Each real row attends causally to its own prompt; padding rows (position ids past the
        prompt, token 0) are masked out as keys and attend only to themselves. Returns
        (last logits [B, V_t] at each prompt's last token, features [B, P, F], cache) — the
        cache holds P rows per sequence, sequence b's valid rows being [0, P_b).
        """
        lens = [int(p.shape[0]) for p in prompts]
        bsz, p_max = len(prompts), max(lens)
        ids = torch.zeros(bsz, p_max, dtype=torch.long, device=self.device)  # [B, P] right-padded with 0
        for b, p in enumerate(prompts):
            ids[b, : lens[b]] = p
        lens_t = torch.tensor(lens, device=self.device)  # [B]
        cols = torch.arange(p_max, device=self.device)  # [P]
        key_ok = cols[None, :] < lens_t[:, None]  # [B, P] real rows
        causal = cols[None, :] <= cols[:, None]  # [P, P]
        allowed = (causal[None] & key_ok[:, None, :]) | torch.eye(p_max, dtype=torch.bool, device=self.device)[None]
        mask = torch.where(allowed, 0.0, torch.finfo(self.dtype).min).to(self.dtype)[:, None]  # [B, 1, P, P]
        position_ids = cols[None].expand(bsz, p_max)  # [B, P]
        last = sorted(set(n - 1 for n in lens))
        out = self.target(
            input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
            logits_to_keep=torch.tensor(last, device=self.device),
        )
        cache = returned_cache(out)
        check_cache(cache)
        full = self._logits(out)  # [B, len(last), V]
        where = torch.tensor([last.index(n - 1) for n in lens], device=full.device)  # [B]
        logits = full[torch.arange(bsz, device=full.device), where]  # [B, V]
        return logits.to(self.device), self._features(), cache

    def verify_batch(
        self, tokens: torch.Tensor, tree_masks: torch.Tensor, tree_position_ids: torch.Tensor, lengths: torch.Tensor,
        phys: int, cache: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over B trees of T tokens each, appended at the cache's physical end.

        tokens [B, T]; tree_masks [B, T, T] bool (ancestors-or-self); tree_position_ids [B, T];
        lengths [B] each sequence's valid context rows [0, len_b) of the ``phys`` cached rows.
        Returns (logits [B, T, V_t], features [B, T, F]).
        """
        bsz, t = tokens.shape
        ctx_ok = torch.arange(phys, device=self.device)[None, :] < lengths[:, None]  # [B, phys]
        allowed = torch.cat([ctx_ok[:, None, :].expand(bsz, t, phys), tree_masks], dim=2)  # [B, T, phys + T]
        mask = torch.where(allowed, 0.0, torch.finfo(self.dtype).min).to(self.dtype)[:, None]  # [B, 1, T, phys + T]
        position_ids = lengths[:, None] + tree_position_ids  # [B, T]
        out = self.target(
            input_ids=tokens, attention_mask=mask, position_ids=position_ids, use_cache=True,
            **{self.cache_kwarg: cache},
        )
        return self._logits(out).to(self.device), self._features()


def compact_cache_batch(cache: Any, phys: int, lengths: torch.Tensor, paths: torch.Tensor, new_phys: int) -> None:
    """Batched compaction after a verify forward that appended T tree rows at ``phys``.

    Sequence b's accepted path ``paths[b, :m_b]`` (tree positions, root first; entries past m_b
    are ignored) moves to rows [len_b, len_b + m_b); then every sequence keeps ``new_phys``
    physical rows. Rows past a sequence's new length are holes, masked by the next verify.
    One gather and one scatter per layer tensor, on the device.
    """
    bsz, width = paths.shape
    dst = lengths[:, None] + torch.arange(width, device=paths.device)[None, :]  # [B, W] (<= phys + T - 1)
    for holder, ka, va in _cache_tensors(cache):
        for attr in (ka, va):
            x = getattr(holder, attr)  # [B, n_kv, phys + T, d]
            t = x.shape[2] - phys
            src = (paths.clamp(max=t - 1) + phys).to(x.device)  # [B, W]
            shape = (bsz, x.shape[1], width, x.shape[3])
            rows = x.gather(2, src[:, None, :, None].expand(shape))  # [B, n_kv, W, d]
            x.scatter_(2, dst.to(x.device)[:, None, :, None].expand(shape), rows)
            setattr(holder, attr, x[:, :, :new_phys])


def select_cache_rows(cache: Any, rows: torch.Tensor, new_phys: int) -> None:
    """Keep only the batch rows ``rows`` (the sequences still generating), trimmed to ``new_phys``."""
    for holder, ka, va in _cache_tensors(cache):
        for attr in (ka, va):
            x = getattr(holder, attr)  # [B, n_kv, phys, d]
            setattr(holder, attr, x.index_select(0, rows.to(x.device))[:, :, :new_phys])


def _cache_tensors(cache: Any) -> list[tuple[Any, str, str]]:
    """(holder, key attribute, value attribute) per layer, for the supported cache layouts."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer, "keys", "values") for layer in layers]
    if hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):  # older DynamicCache
        return [(_ListSlot(cache, i), "keys", "values") for i in range(len(cache.key_cache))]
    raise InputError(f"the target returned a {type(cache).__name__} cache, which frontier cannot compact")


class _ListSlot:
    def __init__(self, cache: Any, i: int) -> None:
        self.cache, self.i = cache, i

    @property
    def keys(self):
        return self.cache.key_cache[self.i]

    @keys.setter
    def keys(self, value):
        self.cache.key_cache[self.i] = value

    @property
    def values(self):
        return self.cache.value_cache[self.i]

    @values.setter
    def values(self, value):
        self.cache.value_cache[self.i] = value


def check_cache(cache: Any) -> None:
    """Only plain dynamic (full-attention) caches can be extended by a tree and compacted."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            name = type(layer).__name__
            if name != "DynamicLayer":
                raise InputError(
                    f"the target's cache has a {name} layer (sliding window or hybrid attention); "
                    "frontier.generate needs full attention (DynamicLayer) in every layer"
                )
    else:
        _cache_tensors(cache)


def compact_cache(cache: Any, context: int, keep: torch.Tensor) -> None:
    """Keep the tree rows ``context + keep`` (in order) right after the context; drop the rest.

    keep: [m] int64 device tensor of tree positions (the accepted path, root first). Runs on the
    cache's device: an index_select and a copy per layer, no host read.
    """
    m = keep.shape[0]
    for holder, ka, va in _cache_tensors(cache):
        for attr in (ka, va):
            x = getattr(holder, attr)  # [B, n_kv, context + T, d]
            rows = x.index_select(2, keep + context)  # [B, n_kv, m, d]
            x[:, :, context : context + m] = rows
            setattr(holder, attr, x[:, :, : context + m])


def check_cache_length(cache: Any, expect: int) -> None:
    """Once per call: the compacted cache reports the expected length (a transformers API guard)."""
    get = getattr(cache, "get_seq_length", None)
    if get is not None and int(get()) != expect:
        raise FrontierError(
            f"the target's cache reports {int(get())} tokens after compaction, expected {expect}: this transformers "
            "version's cache layout is not supported by frontier.generate"
        )
