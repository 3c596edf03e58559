"""The speculative decoding loop: :class:`SpeculativeGenerator` and :func:`generate`.

Every step is four named phases over the target (:mod:`.target`) and the draft backend:

1. draft: a tree of T tokens rooted at the last new token, from the target features of the rows
   the draft cache lacks: one ``frontier_generate`` call, or on a GPU a :class:`~frontier.Drafter`
   step replayed as one CUDA graph (:mod:`.drafting`);
2. verify: one target forward over the T tree tokens;
3. accept: the deepest tree node whose path the target agrees with, plus the target's next token
   (:mod:`.acceptance`, on the device); one small host read per step fetches them;
4. compact: the accepted path's K/V rows stay in the target cache, the rest go; the accepted
   rows' features feed the next draft call.

A batch runs the same phases for all its sequences at once: one draft call with per-sequence
lists and one target forward per step over a padded KV buffer with per-sequence lengths; a
sequence that stops leaves the batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

from ..config import FrontierConfig
from ..drafter import Drafter, supports_static
from ..errors import InputError, NonFiniteError
from ..registry import get_backend
from ..request import check_options
from ..weights import DraftWeights, stamp_matches, tensors_stamp
from .acceptance import SamplingParams, greedy_accept, greedy_accept_batch, sampling_accept, warp_logits
from .arguments import GenerationArgs, check_draft_options, check_head_matches_target, generation_args
from .distributed import check_tp_device, read_agreed, shared_seed, tp_group
from .drafting import CallDrafts, StaticDrafts
from .stats import BatchGenerationResult, BatchGenerationStats, GenerationResult, GenerationStats
from .target import (
    TargetRunner, check_cache_length, compact_cache, compact_cache_batch, select_cache_rows,
)

__all__ = ["SpeculativeGenerator", "generate"]

#: Draft options a static Drafter takes (the triton backend's); any other option drafts per call.
STATIC_OPTIONS = ("tuning", "pack_weights")


class SpeculativeGenerator:
    """A target + draft head pair that generates with EAGLE speculative decoding.

    Parameters
    ----------
    target: a Hugging Face causal LM (Llama family), eager or sdpa attention, in eval mode.
    cfg: the draft head's :class:`FrontierConfig` (tree shape: total_token, depth, top_k).
    weights: the draft head (:class:`DraftWeights`); None for weight-free backends (stub).
    backend: a registered backend name.
    padded: draft with ``padded=True`` (no host read inside the draft call); verification uses
        only the tree mask and depths, so both layouts work.
    draft_options: backend options passed to every draft call (e.g. ``{"mode": "graph"}`` for
        the triton backend's CUDA-graph launches); the loop's own arguments (input ids, cache,
        weights, sampling, layout) cannot be set here.
    static: draft through a :class:`~frontier.Drafter` whose step is captured once and replayed
        (True), with one ``frontier_generate`` call per step (False), or (None, the default) the
        Drafter where it helps: the triton backend on a CUDA target, ``padded=True`` and no draft
        option but ``tuning``/``pack_weights``. The Drafter is kept between ``generate`` calls
        (its cache sized for the longest so far), and made again when a tensor of the head was
        written in place or given other data since.

    ``cfg``, ``weights``, ``backend``, ``padded``, ``draft_options`` and ``static`` are fixed when the
    generator is made (they were checked against the target): another head or backend takes a
    new SpeculativeGenerator.

    The hooks that capture the target's features are attached for the duration of each
    :meth:`generate` call only.
    """

    _FIXED = frozenset({"cfg", "weights", "backend", "padded", "draft_options", "static"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._FIXED and name in self.__dict__:
            raise AttributeError(f"SpeculativeGenerator.{name} is fixed when the generator is made (it was checked "
                                 f"against the target, and a kept Drafter was made from it): make a new "
                                 f"SpeculativeGenerator")
        super().__setattr__(name, value)

    def __init__(
        self,
        target: Any,
        cfg: FrontierConfig,
        weights: Optional[DraftWeights] = None,
        *,
        backend: str = "torch_ref",
        padded: bool = True,
        draft_options: Optional[dict[str, Any]] = None,
        static: Optional[bool] = None,
    ) -> None:
        if not isinstance(cfg, FrontierConfig):
            raise InputError(f"cfg must be a frontier.FrontierConfig, got {type(cfg).__name__}")
        if not isinstance(backend, str):
            raise InputError(f"backend must be a backend name (str), got {type(backend).__name__}")
        impl = get_backend(backend)
        self.requires_weights = bool(getattr(impl, "requires_weights", False))
        if self.requires_weights and weights is None:
            raise InputError(f"backend {backend!r} needs the draft head: pass weights=")
        if weights is not None and not isinstance(weights, DraftWeights):
            raise InputError(f"weights must be a frontier.DraftWeights, got {type(weights).__name__}")
        if not self.requires_weights:
            weights = None  # weight-free backends (the stub) take none
        self.cfg, self.weights, self.backend, self.padded = cfg, weights, backend, bool(padded)
        self.draft_options = MappingProxyType(check_draft_options(draft_options))  # read-only
        check_options(impl, backend, dict(self.draft_options))  # a misspelled option fails here, not mid-generation
        self.runner = TargetRunner(target, cfg.architecture)
        check_head_matches_target(cfg, weights, self.runner)
        self.tp_group = tp_group(target)  # None unless the target is tensor-parallel
        check_tp_device(self.tp_group, self.runner.device)
        self.static = self._check_static(static, impl)
        # static drafting: one Drafter per sampling flag, kept with the stamp of the head's tensors
        self._drafters: dict[bool, tuple[Drafter, tuple]] = {}
        self.feature_dtype = weights.dtype if weights is not None else self.runner.dtype
        self.width = min(cfg.total_token, cfg.depth + 2)  # longest accepted path: root + depth + 1

    @torch.no_grad()
    def generate(
        self,
        input_ids: Union[torch.Tensor, Sequence[torch.Tensor]],
        *,
        attention_mask: Optional[torch.Tensor] = None,
        max_new_tokens: Union[int, Sequence[int]] = 128,
        max_length: Optional[int] = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        eos_token_id: Union[None, int, Sequence[int]] = "default",  # type: ignore[assignment]
        stop_token_ids: Optional[Iterable[int]] = None,
        seed: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        callback: Optional[Callable[[torch.Tensor, GenerationStats], Any]] = None,
        profile: bool = True,
    ) -> Union[GenerationResult, BatchGenerationResult]:
        """Generate up to ``max_new_tokens`` tokens after ``input_ids`` [1, P].

        Stops at the first EOS / stop token (kept in the output, like ``generate``), after
        ``max_new_tokens`` new tokens, or when the sequence reaches ``max_length`` tokens.
        ``eos_token_id`` defaults to the target's ``generation_config.eos_token_id``; pass
        None to ignore EOS. ``temperature > 0`` samples (with ``top_k``/``top_p``); ``seed``
        or ``generator`` make sampling reproducible. ``callback(new_token_ids [1, n], stats)``
        runs after every step (progress displays). ``profile`` synchronises the device around
        each phase so the time split is exact.

        Batches: ``input_ids`` a list of prompts ([P_b] or [1, P_b], lengths may differ), or a
        [B, P] tensor with B > 1 (with ``attention_mask`` [B, P] of 0/1 when it is left- or
        right-padded), returns a :class:`BatchGenerationResult`: per prompt exactly what batch-1
        generation returns for it. ``max_new_tokens`` may then be a list (one per prompt);
        sampling takes ``seed`` (prompt b uses ``seed + b``) or ``generator``, a list of one
        torch.Generator per prompt; ``callback(list of [1, n_b] new tokens, batch stats)``.

        A tensor-parallel target: call it on every rank with the same arguments; every rank returns
        the same result. Sampling without ``seed``/``generator`` draws one seed on rank 0 for all.
        """
        sampling = isinstance(temperature, (int, float)) and temperature > 0
        if self.tp_group is not None and sampling and seed is None and generator is None:
            seed = shared_seed(self.tp_group, self.runner.device)
        args = generation_args(
            self.runner, input_ids, attention_mask, max_new_tokens=max_new_tokens, max_length=max_length,
            temperature=temperature, top_p=top_p, top_k=top_k, eos_token_id=eos_token_id,
            stop_token_ids=stop_token_ids, seed=seed, generator=generator,
        )
        # Two loops sharing their steps: as a batch of one, a single prompt would take the batched
        # draft call and masked prefill (bf16 drafts may differ) and a blocking length upload per step.
        if args.batch:
            return self._generate_batch(args, callback, profile)
        return self._generate_one(args, callback, profile)

    # ------------------------------------------------------------------------------------------
    def _generate_one(self, args: GenerationArgs, callback: Optional[Callable], profile: bool) -> GenerationResult:
        """One prompt: its tree is drafted and verified alone, the cache compacted in place."""
        r, params, device = self.runner, args.params, self.runner.device
        prompt, generator, budget_reason = args.prompts[0], args.generators[0], args.budget_reason(0)
        p_len = prompt.shape[0]
        stats = GenerationStats(backend=self.backend, prompt_tokens=p_len)
        state = _SequenceState.start(prompt, args.budgets[0], device)
        drafts = self._drafts(1, p_len + args.budgets[0] + 2, sampling=not params.greedy)
        sync = _syncer(device, profile)

        def report() -> None:
            if callback is not None:
                callback(state.new_tokens()[None], stats)

        r.attach()
        try:
            t_start = time.perf_counter()
            # ---- prefill: the prompt's last logits give the first new token (the first root) ----
            last_logits, feats, cache = r.prefill(prompt[None])
            root = _first_tokens(last_logits, params, [generator])  # [1]
            state.target_cache, state.fed_len, state.new_feats = cache, p_len, feats
            stats.target_forwards += 1
            state.emit([int(root)], root, args.stop_names, budget_reason)  # host read: the first token
            sync()
            stats.time_prefill = time.perf_counter() - t_start
            report()

            while state.reason is None:
                # ---- draft --------------------------------------------------------------------
                t0 = time.perf_counter()
                (fr,) = drafts.draft([state.new_feats.to(self.feature_dtype)], [state.input_ids()])
                stats.draft_calls += 1
                sync()
                t1 = time.perf_counter()
                stats.time_draft += t1 - t0

                # ---- verify: one forward over the T tree tokens ---------------------------------
                tokens = fr.draft_tokens.to(device)  # [1, T]
                tmask, tpos = fr.tree_mask.to(device), fr.tree_position_ids.to(device)
                logits, tree_feats = r.verify(tokens, tmask, tpos, state.fed_len, state.target_cache)  # [T, V], [1, T, F]
                stats.target_forwards += 1

                # ---- accept -------------------------------------------------------------------
                if params.greedy:
                    best, path, nxt = greedy_accept(logits, tokens[0], tmask, tpos, self.width)
                else:
                    probs = warp_logits(logits, params).softmax(dim=-1)  # [T, V]
                    best, path, nxt = sampling_accept(probs, tokens[0], tmask, tpos, self.width, generator)
                padded_tokens = torch.cat([tokens[0], tokens.new_full((1,), -1)])  # [T + 1], T -> -1
                invalid = fr.invalid.to(device=device, dtype=torch.long).reshape(1)  # [1]
                ((acc, next_tok, path_tokens),) = _read_step(
                    invalid, tpos[best][None], nxt[None], padded_tokens[path][None], stats.draft_calls,
                    self.tp_group,
                )
                t2 = time.perf_counter()
                stats.time_verify += t2 - t1
                stats.accepted_lengths.append(acc + 1)
                run = torch.cat([padded_tokens[path[1 : acc + 1]], nxt.reshape(1)])  # [acc + 1] on the device
                state.emit(path_tokens[1 : acc + 1] + [next_tok], run, args.stop_names, budget_reason)

                # ---- compact: the accepted path's rows follow the context -----------------------
                if state.reason is None:
                    keep = path[: acc + 1]  # [acc + 1] tree positions, root first
                    compact_cache(state.target_cache, state.fed_len, keep)
                    state.new_feats = tree_feats.index_select(1, keep)  # [1, acc + 1, F]
                    state.fed_len += acc + 1
                    if stats.verify_steps == 1:
                        check_cache_length(state.target_cache, state.fed_len)
                report()
            stats.stop_reason = state.reason
        finally:
            r.detach()
        stats.new_tokens = len(state.emitted)
        _finish_times(stats, t_start)
        return GenerationResult(sequences=state.sequence()[None].clone(), prompt_length=p_len, stats=stats)

    # ------------------------------------------------------------------------------------------
    def _generate_batch(
        self, args: GenerationArgs, callback: Optional[Callable], profile: bool
    ) -> BatchGenerationResult:
        """A batch: every step drafts all active sequences in ONE draft call and verifies all their
        trees in ONE target forward.

        The target KV cache is one padded buffer [B, kv heads, phys, d]: sequence b's context is
        rows [0, len_b); rows [len_b, phys) are holes, masked in every verify forward. A verify
        forward appends each tree's T rows at ``phys`` (positions ``len_b + tree depth``); the
        compaction then moves each accepted path to [len_b, len_b + m_b) and trims the buffer to
        max_b(len_b + m_b). A sequence that stops (EOS, stop token, budget) leaves the batch: its
        cache rows are dropped and it is neither drafted nor verified again. One host read per
        step fetches every sequence's acceptance.
        """
        r, params, device = self.runner, args.params, self.runner.device
        prompts, generators = args.prompts, args.generators
        bsz, lens0 = len(prompts), [int(p.shape[0]) for p in prompts]
        bstats = BatchGenerationStats(backend=self.backend, batch_size=bsz)
        bstats.sequences = [GenerationStats(backend=self.backend, prompt_tokens=n) for n in lens0]
        states = [_SequenceState.start(p, args.budgets[b], device) for b, p in enumerate(prompts)]
        drafts = self._drafts(bsz, max(n + m for n, m in zip(lens0, args.budgets)) + 2, sampling=not params.greedy)
        sync = _syncer(device, profile)

        def report() -> None:
            if callback is not None:
                callback([st.new_tokens()[None] for st in states], bstats)

        r.attach()
        try:
            t_start = time.perf_counter()
            # ---- prefill: one forward over the right-padded prompts ------------------------------
            last_logits, feats, cache = r.prefill_batch(prompts)  # [B, V], [B, P, F]
            roots = _first_tokens(last_logits, params, generators)  # [B]
            bstats.target_forwards += 1
            for b, (st, tok) in enumerate(zip(states, roots.tolist())):  # host read: the first tokens
                st.fed_len, st.new_feats = lens0[b], feats[b : b + 1, : lens0[b]]
                bstats.sequences[b].target_forwards += 1
                st.emit([tok], roots[b : b + 1], args.stop_names, args.budget_reason(b))
            active, phys = _drop_finished(cache, states, list(range(bsz)), max(lens0), drafts)
            sync()
            bstats.time_prefill = time.perf_counter() - t_start
            report()

            while active:
                # ---- draft: one batched call ----------------------------------------------------
                t0 = time.perf_counter()
                frs = drafts.draft([states[b].new_feats.to(self.feature_dtype) for b in active],
                                   [states[b].input_ids() for b in active])  # [L_b + 1] each, root last
                for b in active:
                    bstats.sequences[b].draft_calls += 1
                bstats.draft_calls += 1
                bstats.active.append(len(active))
                sync()
                t1 = time.perf_counter()
                bstats.time_draft += t1 - t0

                # ---- verify: one forward over all trees -----------------------------------------
                tokens, tmasks, tpos, t_sizes = _pad_trees(frs, device)  # [A, T], [A, T, T], [A, T]
                lengths = torch.tensor([states[b].fed_len for b in active], device=device)  # [A]
                logits, tree_feats = r.verify_batch(tokens, tmasks, tpos, lengths, phys, cache)  # [A, T, V], [A, T, F]
                bstats.target_forwards += 1

                # ---- accept ---------------------------------------------------------------------
                best, paths, nxt = self._accept_batch(
                    logits, tokens, tmasks, tpos, t_sizes, frs, params, [generators[b] for b in active]
                )
                padded_tokens = torch.cat([tokens, tokens.new_full((len(active), 1), -1)], dim=1)  # [A, T + 1]
                invalid = torch.stack([fr.invalid.to(device=device, dtype=torch.long) for fr in frs])  # [A]
                steps = _read_step(
                    invalid, tpos.gather(1, best[:, None])[:, 0], nxt, padded_tokens.gather(1, paths),
                    bstats.draft_calls, self.tp_group,
                )
                t2 = time.perf_counter()
                bstats.time_verify += t2 - t1
                new_lens = []
                for i, b in enumerate(active):
                    st, sst = states[b], bstats.sequences[b]
                    acc, next_tok, path_tokens = steps[i]
                    sst.accepted_lengths.append(acc + 1)
                    sst.target_forwards += 1
                    run = torch.cat([padded_tokens[i, paths[i, 1 : acc + 1]], nxt[i : i + 1]])  # [acc + 1]
                    st.emit(path_tokens[1 : acc + 1] + [next_tok], run, args.stop_names, args.budget_reason(b))
                    if st.reason is None:
                        st.new_feats = tree_feats[i : i + 1].index_select(1, paths[i, : acc + 1])  # [1, acc + 1, F]
                    new_lens.append(st.fed_len + acc + 1)

                # ---- compact, then drop the sequences that stopped ------------------------------
                new_phys = max(new_lens)
                compact_cache_batch(cache, phys, lengths, paths, new_phys)
                for b, n in zip(active, new_lens):
                    states[b].fed_len = n
                phys = new_phys
                if bstats.verify_steps == 1:
                    check_cache_length(cache, phys)
                active, phys = _drop_finished(cache, states, active, phys, drafts)
                report()
        finally:
            r.detach()
        _finish_times(bstats, t_start)
        results = []
        for b, st in enumerate(states):
            sst = bstats.sequences[b]
            sst.new_tokens, sst.stop_reason = len(st.emitted), st.reason or ""
            for name in ("time_prefill", "time_draft", "time_verify", "time_other", "time_total"):
                setattr(sst, name, getattr(bstats, name))
            results.append(GenerationResult(sequences=st.sequence()[None].clone(), prompt_length=lens0[b], stats=sst))
        return BatchGenerationResult(results=results, stats=bstats)

    # -- the steps' shared pieces --------------------------------------------------------------
    def _draft_kwargs(self, max_length: int) -> dict[str, Any]:
        """The draft calls' keyword arguments besides features, ids, cache and sampling."""
        kwargs: dict[str, Any] = dict(self.draft_options)
        if self.requires_weights:
            kwargs["weights"] = self.weights
            kwargs["cache_max_length"] = max_length
            if self.runner.device.type == "cuda":
                kwargs["check_token_range"] = False  # token ids come from the target/drafter
        return kwargs

    def _drafts(self, batch: int, max_length: int, *, sampling: bool) -> Union[CallDrafts, StaticDrafts]:
        """How this generation drafts: a (kept) Drafter's replays when ``self.static``, else one
        ``frontier_generate`` call per step."""
        if not self.static:
            return CallDrafts(self, sampling=sampling, max_length=max_length)
        d, stamp = self._drafters.get(sampling, (None, None))
        tensors = list(self.weights.state_dict().values()) if self.weights is not None else []
        if d is None or d.max_batch < batch or d.max_context < max_length or not stamp_matches(stamp, tensors):
            had_batch, had_context = (d.max_batch, d.max_context) if d is not None else (1, 0)
            d = None
            self._drafters.pop(sampling, None)  # its buffers (and captured graphs) go first
            grown = max(max_length, had_context)
            d = Drafter(self.cfg, self.weights, backend=self.backend, max_batch=max(batch, had_batch),
                        max_context=-(-grown // 1024) * 1024, sampling=sampling, device=self.runner.device,
                        dtype=self.feature_dtype, **self.draft_options)
            self._drafters[sampling] = (d, tensors_stamp(tensors))
        on_cuda = self.runner.device.type == "cuda"
        return StaticDrafts(d, prefill_options={"check_token_range": False} if on_cuda and self.requires_weights else {})

    def _check_static(self, static: Optional[bool], impl: Any) -> bool:
        """``static``: draft through a :class:`~frontier.Drafter` (True), one call per step (False), or
        (None) a Drafter where it helps: the triton backend on a CUDA target, padded trees, no
        draft option but the Drafter's own, one device. (torch_ref, the reference, keeps its
        per-call path unless asked: its fixed-shape step rounds some sums differently.)"""
        if static is not None and not isinstance(static, bool):
            raise InputError(f"static must be True, False or None, got static={static!r}")
        own = set(self.draft_options) <= set(STATIC_OPTIONS)
        if static is None:
            return bool(self.backend == "triton" and supports_static(impl) and self.runner.device.type == "cuda"
                        and self.padded and own and self.tp_group is None)
        if static:
            if not supports_static(impl):
                raise InputError(f"static=True: backend {self.backend!r} cannot draft from static buffers")
            if not self.padded:
                raise InputError("static=True drafts padded trees: pass padded=True")
            if not own:
                raise InputError(f"static=True takes the draft options {list(STATIC_OPTIONS)} only, "
                                 f"got {sorted(self.draft_options)}")
        return static

    def _accept_batch(
        self, logits: torch.Tensor, tokens: torch.Tensor, tmasks: torch.Tensor, tpos: torch.Tensor,
        t_sizes: list[int], frs: list, params: SamplingParams, generators: list[Optional[torch.Generator]],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(best [A], paths [A, width] padded with T, next token [A]) of A padded trees."""
        n_act, t_max = tokens.shape
        device = tokens.device
        if params.greedy:
            valid = None
            if min(t_sizes) < t_max:
                valid = torch.arange(t_max, device=device)[None, :] < torch.tensor(t_sizes, device=device)[:, None]
            return greedy_accept_batch(logits, tokens, tmasks, tpos, self.width, valid)
        bests, paths, nxts = [], [], []
        probs = warp_logits(logits.flatten(0, 1), params).softmax(dim=-1).view(n_act, t_max, -1)
        for i, fr in enumerate(frs):  # each sequence draws from its own generator
            t_i = t_sizes[i]
            b_i, p_i, n_i = sampling_accept(
                probs[i, :t_i], tokens[i, :t_i], fr.tree_mask.to(device), tpos[i, :t_i], self.width, generators[i]
            )
            bests.append(b_i)
            paths.append(torch.where(p_i >= t_i, t_max, p_i))  # padding -> t_max
            nxts.append(n_i)
        return torch.stack(bests), torch.stack(paths), torch.stack(nxts)


def _syncer(device: torch.device, profile: bool) -> Callable[[], None]:
    """With ``profile``, a device synchronisation that closes each timed phase; else a no-op."""
    if profile and device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _first_tokens(
    last_logits: torch.Tensor, params: SamplingParams, generators: list[Optional[torch.Generator]]
) -> torch.Tensor:
    """[B] the first new token of each prompt from its last logits [B, V] (the first tree roots)."""
    if params.greedy:
        return last_logits.argmax(dim=-1)
    probs = warp_logits(last_logits, params).softmax(dim=-1)  # [B, V]
    return torch.cat(
        [torch.multinomial(probs[b : b + 1], 1, generator=g)[:, 0] for b, g in enumerate(generators)]
    )


def _pad_trees(frs: list, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """The trees of a batch padded to the largest T: tokens [A, T] (padding 0), ancestor masks
    [A, T, T] bool (padding attends to itself), depths [A, T]; and each tree's own size."""
    n_act = len(frs)
    t_sizes = [int(fr.draft_tokens.shape[1]) for fr in frs]
    t_max = max(t_sizes)
    tokens = torch.zeros(n_act, t_max, dtype=torch.long, device=device)
    tmasks = torch.eye(t_max, dtype=torch.bool, device=device).repeat(n_act, 1, 1)
    tpos = torch.zeros(n_act, t_max, dtype=torch.long, device=device)
    for i, fr in enumerate(frs):
        t_i = t_sizes[i]
        tokens[i, :t_i] = fr.draft_tokens[0].to(device)
        tmasks[i, :t_i, :t_i] = fr.tree_mask[0, 0].to(device) > 0
        tpos[i, :t_i] = fr.tree_position_ids.to(device)
    return tokens, tmasks, tpos, t_sizes


def _read_step(
    invalid: torch.Tensor, depth: torch.Tensor, nxt: torch.Tensor, path_tokens: torch.Tensor, step: int,
    group: Any = None,
) -> list[tuple[int, int, list[int]]]:
    """The one host read of a step: per sequence (accepted draft tokens, next token, the path's
    tokens root first). invalid [A] is each draft call's device-side check (``Frontier.invalid``),
    depth [A] the accepted node's depth, nxt [A] the next token, path_tokens [A, width]. With a
    tensor-parallel target's ``group``, the read also checks that every rank holds the same values."""
    small = torch.cat([invalid[:, None], depth[:, None], nxt[:, None], path_tokens], dim=1)  # [A, 3 + width]
    vals = read_agreed(small, group, step)
    bad = [b for b, v in enumerate(vals) if v[0]]
    if bad:
        which = "" if len(vals) == 1 else f" (sequence(s) {bad} of the active batch)"
        raise NonFiniteError(
            f"draft call {step}{which}: the target's features or the draft head's outputs were non-finite "
            "(NaN/Inf, e.g. an fp16 overflow); generation stopped"
        )
    return [(v[1], v[2], v[3:]) for v in vals]


def _drop_finished(cache: Any, states: list, active: list[int], phys: int, drafts: Any) -> tuple[list[int], int]:
    """Remove the stopped sequences' rows from the batch's target cache and its drafts; returns
    (active, phys)."""
    keep = [i for i, b in enumerate(active) if states[b].reason is None]
    if len(keep) == len(active):
        return active, phys
    drafts.keep(keep)
    active = [active[i] for i in keep]
    if not active:
        return active, 0
    phys = max(states[b].fed_len for b in active)
    device = states[active[0]].buffer.device
    select_cache_rows(cache, torch.tensor(keep, device=device), phys)
    return active, phys


def _finish_times(stats: Any, t_start: float) -> None:
    """The call's total time, and the part no phase accounts for."""
    stats.time_total = time.perf_counter() - t_start
    stats.time_other = max(0.0, stats.time_total - stats.time_prefill - stats.time_draft - stats.time_verify)


@dataclass
class _SequenceState:
    """Everything one sequence carries between steps (batching keeps one per sequence).

    ``buffer`` holds the prompt, then the emitted tokens; the last emitted token is the next
    tree root, whose target K/V are not cached yet. ``fed_len`` tokens are in the target's KV
    cache; ``new_feats`` are the target features of the rows the draft cache lacks (the draft
    caches themselves live with the step's drafts, :mod:`.drafting`).
    """

    buffer: torch.Tensor  # [P + budget + 1] int64 on the device
    prompt_len: int
    budget: int
    emitted: list[int] = field(default_factory=list)
    fed_len: int = 0
    target_cache: Any = None
    new_feats: Optional[torch.Tensor] = None  # [1, n, F]
    reason: Optional[str] = None

    @classmethod
    def start(cls, prompt: torch.Tensor, budget: int, device: torch.device) -> "_SequenceState":
        buf = torch.empty(prompt.shape[0] + budget + 1, dtype=torch.long, device=device)
        buf[: prompt.shape[0]] = prompt
        return cls(buffer=buf, prompt_len=prompt.shape[0], budget=budget)

    def input_ids(self) -> torch.Tensor:
        """[L + 1] the sequence so far, the root last."""
        return self.buffer[: self.prompt_len + len(self.emitted)]

    def sequence(self) -> torch.Tensor:
        return self.buffer[: self.prompt_len + len(self.emitted)]

    def new_tokens(self) -> torch.Tensor:
        return self.buffer[self.prompt_len : self.prompt_len + len(self.emitted)]

    def emit(self, tokens: list[int], on_device: torch.Tensor, stop_names: dict, budget_reason: str) -> None:
        """Append ``tokens`` (host copy of ``on_device``), cut at the first stop token or the budget."""
        keep, reason = len(tokens), None
        for i, tok in enumerate(tokens):
            if tok in stop_names:
                keep, reason = i + 1, stop_names[tok]
                break
        room = self.budget - len(self.emitted)
        if reason is None and keep >= room:
            keep, reason = room, budget_reason
        start = self.prompt_len + len(self.emitted)
        self.buffer[start : start + keep] = on_device[:keep]
        self.emitted += tokens[:keep]
        self.reason = reason


def generate(
    target: Any,
    input_ids: Union[torch.Tensor, Sequence[torch.Tensor]],
    *,
    cfg: FrontierConfig,
    weights: Optional[DraftWeights] = None,
    backend: str = "torch_ref",
    padded: bool = True,
    static: Optional[bool] = None,
    **kwargs: Any,
) -> Union[GenerationResult, BatchGenerationResult]:
    """Speculative generation in one call; see :class:`SpeculativeGenerator` and its ``generate``.

    ``input_ids``: one prompt [1, P] (returns a :class:`GenerationResult`), or a batch — a list of
    prompts or a [B, P] tensor, B > 1 — (returns a :class:`BatchGenerationResult`).
    ``static``: as :class:`SpeculativeGenerator`'s (default: a captured Drafter on a GPU).
    ``kwargs``: attention_mask, max_new_tokens, max_length, temperature, top_p, top_k,
    eos_token_id, stop_token_ids, seed, generator, callback, profile.
    """
    gen = SpeculativeGenerator(target, cfg, weights, backend=backend, padded=padded, static=static)
    return gen.generate(input_ids, **kwargs)
