"""`Drafter`: the draft step over buffers it owns, for engines that capture their decode step.

A :class:`Drafter` is built once per head and shape budget (batch slots, context rows, new rows
per call, tree shape, dtype, device). It owns every tensor a draft step touches: the input
staging, the draft K/V cache with its per-slot lengths *on the device*, and padded outputs.
:meth:`Drafter.draft` drafts the first ``batch`` slots from those buffers with no host read and
no host-side bookkeeping, so the caller can capture it in a CUDA graph (alone, or inside a graph
of its own with the target's verify forward) and replay it; :meth:`Drafter.replay` captures
and replays it itself.

One step for slot b, the sequence so far being ``input_ids`` [L + 1] (root last) with ``c_b``
rows cached:

* stage the ``n_b = L - c_b`` new rows: ``features[b, :n_b]`` their target features,
  ``token_ids[b, :n_b]`` = ``input_ids[1:][c_b:]`` (the token paired with each row; the last one
  is the tree's root), ``new_rows[b] = n_b``;
* draft: the new rows' K/V are written to cache rows ``[c_b, c_b + n_b)``, the tree lands in
  :attr:`Drafter.outputs`, and ``lengths[b]`` advances by ``n_b`` on the device unless the
  slot's ``invalid`` flag is set (then the cache is as it was: nothing committed);
* ``rollback``/``reset`` move lengths back, as device operations too.

Bad values never make a kernel read or write out of bounds and never touch committed rows:
``new_rows`` outside ``[1, max_new_rows]``, a context that would pass ``max_context``, token ids
outside the vocabulary and non-finite features or scores set the slot's ``invalid`` flag (its
outputs are then meaningless and its length does not advance). The storage keeps
``max_new_rows`` scratch rows past ``max_context`` for exactly that.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Any, Optional

import torch

from .config import FrontierConfig
from .errors import InputError
from .registry import get_backend
from .request import _caller_level, resolve_backend, resolve_weights
from .result import Frontier
from .weights import DraftWeights


@dataclass
class DrafterBuffers:
    """The inputs and the draft cache a :class:`Drafter` owns (B slots, R = ``max_new_rows``,
    S = ``max_context + R`` storage rows). Write the inputs in place (``copy_``, slicing): the
    tensors themselves never change, which is what makes a captured graph replayable."""

    features: torch.Tensor  # [B, R, F] new rows' target features, slot b's in [b, :n_b]
    token_ids: torch.Tensor  # [B, R] int64 token paired with each new row; [b, n_b - 1] is the root
    new_rows: torch.Tensor  # [B] int64 n_b, the new rows of the next draft
    lengths: torch.Tensor  # [B] int64 committed cache rows c_b
    pending: torch.Tensor  # [B] int64 rows the last draft(commit=False) wrote, added by commit()
    k: torch.Tensor  # [B, layers, kv heads, S, head_dim] draft keys
    v: torch.Tensor  # [B, layers, kv heads, S, head_dim] draft values


@dataclass
class DrafterOutputs:
    """One draft step's trees, one row per slot (T = total_token, D = depth). The same layout as
    a padded :class:`~frontier.Frontier` per slot."""

    draft_tokens: torch.Tensor  # [B, T] int64, root first
    retrieve_indices: torch.Tensor  # [B, T, D + 2] int64, leaf_count real rows first, -1 padded
    tree_mask: torch.Tensor  # [B, T, T] float32 0/1, ancestors-or-self
    tree_position_ids: torch.Tensor  # [B, T] int64 depth of each node
    leaf_count: torch.Tensor  # [B] int64
    scores: torch.Tensor  # [B, T] float32 cumulative log-probs (root 0)
    parents: torch.Tensor  # [B, T] int64 parent positions (root -> 0)
    invalid: torch.Tensor  # [B] bool: bad inputs or non-finite outputs; nothing was committed

    def write(self, slot: int, fr: Frontier) -> None:
        """A padded Frontier's tensors into row ``slot``."""
        self.draft_tokens[slot].copy_(fr.draft_tokens[0])
        self.retrieve_indices[slot].copy_(fr.retrieve_indices)
        self.tree_mask[slot].copy_(fr.tree_mask[0, 0])
        self.tree_position_ids[slot].copy_(fr.tree_position_ids)
        self.leaf_count[slot].copy_(fr.leaf_count)
        self.scores[slot].copy_(fr.scores)
        self.parents[slot].copy_(fr.parents)
        if fr.invalid is not None:
            self.invalid[slot].copy_(fr.invalid)

    def head(self, batch: int) -> "DrafterOutputs":
        """Views of the first ``batch`` slots."""
        return DrafterOutputs(**{f.name: getattr(self, f.name)[:batch] for f in fields(self)})


@dataclass
class StagedInputs:
    """A step's inputs made safe on the device (``Drafter.stage_inputs``), b = the call's batch:
    every value in range, whatever was written to the buffers."""

    c: torch.Tensor  # [b] int64 cached rows, in [0, max_context] (max_context for a flagged slot)
    n: torch.Tensor  # [b] int64 new rows, in [1, R]
    ids: torch.Tensor  # [b, R] int64 token ids, in [0, target vocabulary)
    root: torch.Tensor  # [b] int64 ids[n - 1]
    invalid: torch.Tensor  # [b] bool the slot's inputs were out of range or non-finite


class StaticStep:
    """A backend's draft step over a :class:`Drafter`'s buffers written with PyTorch ops:
    :meth:`Drafter.stage_inputs`, the backend's :meth:`draft`, then :meth:`Drafter.finish`.
    ``Backend.static_drafter(drafter, **options)`` returns one (or any object with the same
    ``step(batch, commit)``)."""

    def __init__(self, drafter: "Drafter") -> None:
        self.d = drafter

    def step(self, batch: int, commit: bool) -> None:
        st = self.d.stage_inputs(batch)
        self.draft(batch, st)
        self.d.finish(batch, st, commit)

    def draft(self, batch: int, st: StagedInputs) -> None:  # pragma: no cover - interface
        """Slots [0, batch): trees into ``drafter.outputs``, new K/V rows into the storage at
        rows [st.c, st.c + st.n)."""
        raise NotImplementedError


class Drafter:
    """The whole draft step for a batch of slots from buffers it owns (module docstring).

    Parameters
    ----------
    cfg: the head's :class:`FrontierConfig` (tree shape and dimensions).
    weights: the draft head (:class:`DraftWeights` or a loaded ``DraftHead``); None for the stub.
        Checked here, once, and what the backend derives from it is held by the Drafter (triton:
        packed weight copies and the embedding-QKV table, an fp8 head's formats and scales;
        torch_ref: an fp8 head's dequantized copy), while a replay runs no host code: make a new
        Drafter after changing the head's weights.
    backend: "triton" (GPU; the interpreter on CPU), "torch_ref" or "stub", or a plugin that
        implements ``Backend.static_drafter``.
    max_batch: slots B. max_context: committed cache rows per slot.
    max_new_rows: R, the most new rows one step brings (default depth + 2, the most a verified
        step accepts: the root, its path and the target's next token). Longer contexts enter
        through :meth:`prefill`.
    sampling: order retrieve_indices for sampling verification (as ``frontier_generate``).
    device / dtype: default the weights' (the stub: CUDA when available, float32).
    fallback: when the backend cannot run here, warn and use torch_ref.
    options: the backend's own (triton: ``tuning``, ``pack_weights``).
    """

    def __init__(
        self,
        cfg: FrontierConfig,
        weights: Any = None,
        *,
        backend: str = "triton",
        max_batch: int = 1,
        max_context: int = 4096,
        max_new_rows: Optional[int] = None,
        sampling: bool = False,
        device: Any = None,
        dtype: Optional[torch.dtype] = None,
        seed: int = 0,
        fallback: bool = False,
        **options: Any,
    ) -> None:
        if not isinstance(cfg, FrontierConfig):
            raise InputError(f"cfg must be a FrontierConfig, got {type(cfg).__name__}")
        max_new_rows = cfg.depth + 2 if max_new_rows is None else max_new_rows
        for name, value in (("max_batch", max_batch), ("max_context", max_context), ("max_new_rows", max_new_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an int >= 1, got {name}={value!r}")
        if not isinstance(sampling, bool):
            raise InputError(f"sampling must be True or False, got sampling={sampling!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InputError(f"seed must be an int, got seed={seed!r}")
        self.backend, impl = resolve_backend(backend, fallback)
        if not supports_static(impl):
            impl, options = self._fall_back(fallback, "it has no static_drafter"), {}
        weights = resolve_weights(weights, None, None)
        self.cfg, self.sampling, self.seed = cfg, sampling, seed
        self.max_batch, self.max_context, self.max_new_rows = max_batch, max_context, max_new_rows
        self._place(impl, weights, device, dtype)
        try:
            self._impl = self._start(impl, options)
        except InputError as exc:  # e.g. a head shape triton does not run
            if not fallback or self.backend == "torch_ref" or self.weights is None:
                raise
            self._impl = self._start(self._fall_back(True, str(exc)), {})
        self._warm: set = set()  # batch sizes whose draft has run once (compiled, buffers allocated)
        self._graphs: dict = {}  # (batch, commit) -> torch.cuda.CUDAGraph
        self._views: list[Optional[dict]] = [None] * max_batch  # frontier(slot)'s output views

    # -- construction --------------------------------------------------------------------------
    def _fall_back(self, fallback: bool, why: str) -> Any:
        """torch_ref in place of a backend that cannot draft from static buffers (``fallback``),
        with a warning; InputError otherwise."""
        if not fallback:
            raise InputError(f"backend {self.backend!r} cannot draft from static buffers ({why}); "
                             "pass fallback=True for torch_ref, or use frontier_generate")
        warnings.warn(f"backend {self.backend!r} cannot draft from static buffers ({why}); falling back to "
                      "'torch_ref'", RuntimeWarning, stacklevel=_caller_level())
        self.backend = "torch_ref"
        return get_backend("torch_ref")

    def _place(self, impl: Any, weights: Any, device: Any, dtype: Optional[torch.dtype]) -> None:
        """The weights (checked against the config), device and dtype the backend drafts with."""
        cfg = self.cfg
        self.requires_weights = bool(getattr(impl, "requires_weights", False))
        if self.requires_weights:
            if not isinstance(weights, DraftWeights):
                raise InputError(f"backend {self.backend!r} needs the draft head: pass weights= "
                                 f"(DraftWeights or a loaded DraftHead), got {type(weights).__name__}")
            weights.validate(cfg)
            device = weights.device if device is None else _same_index(torch.device(device), weights.device)
            dtype = weights.dtype if dtype is None else dtype
            if device != weights.device or dtype != weights.dtype:
                raise InputError(f"device/dtype must match the weights' ({weights.device}, {weights.dtype}), "
                                 f"got device={device}, dtype={dtype}")
        else:
            weights = None
            device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            dtype = dtype or torch.float32
        self.weights, self.device, self.dtype = weights, device, dtype

    def _start(self, impl: Any, options: dict) -> Any:
        """The backend's static step over freshly allocated buffers and outputs."""
        self._check_backend_supports(impl, self.device, self.dtype)
        self.buffers = self._alloc_buffers()
        self.outputs = self._alloc_outputs()
        self.options = dict(options)
        return impl.static_drafter(self, **self.options)

    def _check_backend_supports(self, impl: Any, device: torch.device, dtype: torch.dtype) -> None:
        devices, dtypes = tuple(getattr(impl, "devices", ())), tuple(getattr(impl, "dtypes", ()))
        if devices and device.type not in devices:
            raise InputError(f"backend {self.backend!r} runs on {', '.join(devices)}; the drafter's device is {device}")
        if dtypes and dtype not in dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise InputError(f"backend {self.backend!r} supports dtypes {names}; the drafter's dtype is {dtype}")

    def _alloc_buffers(self) -> DrafterBuffers:
        cfg, b, r, dev = self.cfg, self.max_batch, self.max_new_rows, self.device
        if self.requires_weights:
            kv_shape = (b, cfg.num_layers, cfg.num_key_value_heads, self.max_context + r, cfg.head_dim)
        else:
            kv_shape = (b, 0, 0, self.max_context + r, 0)  # the stub keeps no cache
        kv = torch.zeros((2,) + kv_shape, dtype=self.dtype, device=dev)  # one storage: K then V
        self.kv = kv
        return DrafterBuffers(
            features=torch.zeros(b, r, cfg.feature_size, dtype=self.dtype, device=dev),
            token_ids=torch.zeros(b, r, dtype=torch.int64, device=dev),
            new_rows=torch.ones(b, dtype=torch.int64, device=dev),
            lengths=torch.zeros(b, dtype=torch.int64, device=dev),
            pending=torch.zeros(b, dtype=torch.int64, device=dev),
            k=kv[0], v=kv[1],
        )

    def _alloc_outputs(self) -> DrafterOutputs:
        b, t, dev = self.max_batch, self.cfg.total_token, self.device
        return DrafterOutputs(
            draft_tokens=torch.zeros(b, t, dtype=torch.int64, device=dev),
            retrieve_indices=torch.full((b, t, self.cfg.depth + 2), -1, dtype=torch.int64, device=dev),
            tree_mask=torch.zeros(b, t, t, dtype=torch.float32, device=dev),
            tree_position_ids=torch.zeros(b, t, dtype=torch.int64, device=dev),
            leaf_count=torch.zeros(b, dtype=torch.int64, device=dev),
            scores=torch.zeros(b, t, dtype=torch.float32, device=dev),
            parents=torch.zeros(b, t, dtype=torch.int64, device=dev),
            invalid=torch.zeros(b, dtype=torch.bool, device=dev),
        )

    @property
    def storage_rows(self) -> int:
        """Rows per slot of the K/V storage: ``max_context`` plus ``max_new_rows`` of scratch."""
        return self.max_context + self.max_new_rows

    # -- staging (host conveniences; not part of a captured step) --------------------------------
    def stage(self, slot: int, features: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Copy one slot's new rows into the staging buffers: ``features`` [n, F] (or [1, n, F])
        and ``token_ids`` [n] (or [1, n]), n <= max_new_rows, and set ``new_rows[slot] = n``."""
        slot = self._slot(slot)
        features = features[0] if features.dim() == 3 and features.shape[0] == 1 else features
        token_ids = token_ids[0] if token_ids.dim() == 2 and token_ids.shape[0] == 1 else token_ids
        if features.dim() != 2 or features.shape[1] != self.cfg.feature_size:
            raise InputError(f"features must be [n, F={self.cfg.feature_size}], got shape {list(features.shape)}")
        n = features.shape[0]
        if not 1 <= n <= self.max_new_rows:
            raise InputError(f"features must hold 1..max_new_rows={self.max_new_rows} rows, got n={n} "
                             "(longer contexts enter through prefill)")
        if token_ids.shape != (n,) or token_ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"token_ids must be [n={n}] int64, got shape {list(token_ids.shape)} {token_ids.dtype}")
        b = self.buffers
        b.features[slot, :n].copy_(features)
        b.token_ids[slot, :n].copy_(token_ids)
        b.new_rows[slot].fill_(n)

    def prefill(self, slot: int, features: torch.Tensor, input_ids: torch.Tensor, **options: Any) -> Frontier:
        """Draft slot ``slot`` over a context of any length that fits (a prompt): one
        :func:`frontier.frontier_generate` call on the slot's cache (``features`` [1, n, F] the
        rows not cached yet, ``input_ids`` [1, L + 1], root last). It reads the slot's length from
        the device and sets it afterwards, so it is not part of a captured step; its tree is
        also written to the slot's outputs. Returns the (padded) Frontier."""
        from .api import frontier_generate
        from .cache import DraftCache

        slot = self._slot(slot)
        length = int(self.buffers.lengths[slot])
        if not 0 <= length <= self.max_context:
            raise InputError(f"lengths[{slot}] holds {length}, outside [0, max_context={self.max_context}]")
        if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[1] - 1 > self.max_context:
            raise InputError(f"input_ids holds {input_ids.shape[1] - 1} context rows, more than "
                             f"max_context={self.max_context}")
        cache = None
        if self.requires_weights:
            # the slot's whole storage (its scratch rows too: a cache view must be contiguous per
            # layer for triton); the context check above keeps the committed rows <= max_context
            cache = DraftCache.from_tensors(self.buffers.k[slot], self.buffers.v[slot], length)
        opts = {k: v for k, v in self.options.items() if k in ("tuning", "pack_weights")}
        opts.update(options)
        fr = frontier_generate(self.cfg, features, backend=self.backend, input_ids=input_ids, weights=self.weights,
                               cache=cache, sampling=self.sampling, padded=True, seed=self.seed, **opts)
        if cache is not None:
            self.buffers.lengths[slot].fill_(cache.length)
        else:
            self.buffers.lengths[slot].fill_(input_ids.shape[1] - 1)
        self.buffers.pending[slot].zero_()
        self.outputs.write(slot, fr)
        return fr

    # -- the step --------------------------------------------------------------------------------
    def draft(self, batch: Optional[int] = None, *, commit: bool = True) -> DrafterOutputs:
        """Draft slots ``[0, batch)`` (default all) from the buffers; returns views of their
        outputs. No host read, no allocation the caller sees, so it can be captured (run it once
        outside the capture first, or call :meth:`warmup`: that compiles kernels and allocates
        scratch). ``commit=False`` writes the new rows but leaves ``lengths`` alone and records
        them in ``pending`` for :meth:`commit` / :meth:`discard`."""
        batch = self._batch(batch)
        if batch not in self._warm and _capturing(self.device):
            raise InputError(f"Drafter.draft(batch={batch}) is being captured before it ever ran: "
                             f"call drafter.warmup({batch}) first (kernels compile and scratch is allocated then)")
        self._impl.step(batch, commit)
        self._warm.add(batch)
        return self.outputs.head(batch)

    def finish(self, batch: int, st: StagedInputs, commit: bool) -> None:
        """After a step's draft: the slots' ``invalid`` flags (bad inputs or non-finite scores)
        and the commit of the valid slots' rows (device ops only)."""
        o = self.outputs.head(batch)
        bad = st.invalid | ~torch.isfinite(o.scores).all(dim=1)  # [b]
        o.invalid.copy_(bad)
        advance = torch.where(bad, torch.zeros_like(st.n), st.n)  # [b] rows that count
        if commit:
            self.buffers.lengths[:batch].add_(advance)
            self.buffers.pending.zero_()
        else:
            self.buffers.pending[:batch].copy_(advance)
            self.buffers.pending[batch:].zero_()  # a later commit() adds this step's rows only

    def stage_inputs(self, batch: int) -> StagedInputs:
        """The step's inputs clamped into range, with a per-slot flag for whatever was not
        (device ops only)."""
        b, r, vt = self.buffers, self.max_new_rows, self.cfg.target_vocab_size
        n_raw, c_raw = b.new_rows[:batch], b.lengths[:batch]  # [b]
        n = n_raw.clamp(1, r)  # [b]
        c = c_raw.clamp(0, self.max_context)  # [b]
        bad = (n != n_raw) | (c != c_raw) | (c_raw + n_raw > self.max_context)  # [b]
        live = torch.arange(r, device=self.device)[None, :] < n[:, None]  # [b, R] rows this call reads
        raw_ids = b.token_ids[:batch]  # [b, R]
        ids = raw_ids.clamp(0, vt - 1)  # [b, R]
        bad = bad | ((ids != raw_ids) & live).any(dim=1)
        if self.requires_weights:
            feats = b.features[:batch].float()  # [b, R, F]
            total = torch.where(live[:, :, None], feats, feats.new_zeros(())).sum(dim=(1, 2), dtype=torch.float64)
            bad = bad | ~torch.isfinite(total)  # a NaN/Inf in a read row (an overflowing sum is finite in float64)
        root = ids.gather(1, (n - 1)[:, None])[:, 0]  # [b]
        # a flagged slot drafts from the scratch rows past max_context: whatever its length says,
        # its writes land past every committed row
        c = torch.where(bad, torch.full_like(c, self.max_context), c)
        return StagedInputs(c=c, n=n, ids=ids, root=root, invalid=bad)

    def commit(self) -> None:
        """Add the rows of the last ``draft(commit=False)`` to ``lengths`` (a device op)."""
        self.buffers.lengths.add_(self.buffers.pending)
        self.buffers.pending.zero_()

    def discard(self) -> None:
        """Forget the rows of the last ``draft(commit=False)`` (the cache stays as it was)."""
        self.buffers.pending.zero_()

    def rollback(self, lengths: Any, slots: Any = None) -> None:
        """Move committed lengths back: ``lengths`` an int or a tensor (one per slot of ``slots``,
        default every slot); a slot never grows here (min with its current length), and its
        pending rows are dropped. With no ``slots`` or a device tensor of slot indices, and an int
        or a device tensor of lengths, these are device ops only (capturable)."""
        b = self.buffers
        idx = None if slots is None else self._slots(slots)
        cur = b.lengths if idx is None else b.lengths[idx]
        if isinstance(lengths, torch.Tensor):
            new = lengths.to(device=self.device, dtype=torch.int64).expand_as(cur).clamp(min=0)
        else:
            new = torch.full_like(cur, max(0, int(lengths)))  # a fill, not a host-to-device copy
        new = torch.minimum(cur, new)
        if idx is None:
            b.lengths.copy_(new)
            b.pending.zero_()
        else:
            b.lengths[idx] = new
            b.pending[idx] = 0

    def reset(self, slots: Any = None) -> None:
        """Empty slots (default all): length 0, for a new sequence."""
        self.rollback(0, slots)

    def keep_slots(self, slots: Any) -> None:
        """Move slots ``slots`` to the front, in that order (slot i takes slot ``slots[i]``'s
        cache, length, pending rows and staging) and empty the rest: a batch whose finished
        sequences leave it. A host call (slots in increasing order are copied in place, one slot
        at a time; any other order through a copy of the kept slots), not part of a captured step."""
        order = [self._slot(s) for s in slots]
        if len(set(order)) != len(order):
            raise InputError(f"slots must be distinct, got {order}")
        n = len(order)
        b = self.buffers
        if order == sorted(order):  # each kept slot moves forward (or stays): copied once, in place
            for i, src in enumerate(order):
                if i != src:
                    self.kv[:, i].copy_(self.kv[:, src])
                    for t in (b.features, b.token_ids, b.new_rows, b.lengths, b.pending):
                        t[i].copy_(t[src])
        else:
            idx = torch.tensor(order, dtype=torch.long, device=self.device)
            self.kv[:, :n] = self.kv.index_select(1, idx)
            for t in (b.features, b.token_ids, b.new_rows, b.lengths, b.pending):
                t[:n] = t.index_select(0, idx)
        b.lengths[n:] = 0
        b.pending[n:] = 0

    def warmup(self, batch: Optional[int] = None) -> None:
        """Run a draft of ``batch`` slots once without committing (kernels compile, scratch is
        allocated), so that the step can then be captured. Outputs are overwritten; lengths not."""
        batch = self._batch(batch)
        pending = self.buffers.pending.clone()
        self.draft(batch, commit=False)
        self.buffers.pending.copy_(pending)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def capture(self, batch: Optional[int] = None, *, commit: bool = True) -> "torch.cuda.CUDAGraph":
        """A CUDA graph of ``draft(batch, commit=commit)`` (warmed up first on a side stream)."""
        batch = self._batch(batch)
        if self.device.type != "cuda":
            raise InputError(f"capture needs a CUDA device, the drafter is on {self.device}")
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.warmup(batch)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.draft(batch, commit=commit)
        return graph

    def replay(self, batch: Optional[int] = None, *, commit: bool = True) -> DrafterOutputs:
        """``draft(batch, commit=commit)`` through a CUDA graph captured on first use (on a CPU
        device: the draft itself)."""
        batch = self._batch(batch)
        if self.device.type != "cuda":
            return self.draft(batch, commit=commit)
        graph = self._graphs.get((batch, commit))
        if graph is None:
            graph = self._graphs[batch, commit] = self.capture(batch, commit=commit)
        graph.replay()
        return self.outputs.head(batch)

    # -- views -------------------------------------------------------------------------------------
    def frontier(self, slot: int) -> Frontier:
        """Slot ``slot``'s last tree as a padded :class:`~frontier.Frontier` of views of the outputs
        (no copy: the next draft overwrites them). The views are made once per slot."""
        slot = self._slot(slot)
        if self._views[slot] is None:
            o = self.outputs
            self._views[slot] = dict(
                draft_tokens=o.draft_tokens[slot][None], retrieve_indices=o.retrieve_indices[slot],
                tree_mask=o.tree_mask[slot][None, None], tree_position_ids=o.tree_position_ids[slot],
                scores=o.scores[slot], parents=o.parents[slot], leaf_count=o.leaf_count[slot],
                invalid=o.invalid[slot],
            )
        return Frontier(padded=True, **self._views[slot])

    def nbytes(self) -> int:
        """Device memory of the buffers and outputs this drafter owns (not its backend's scratch)."""
        ts = [getattr(self.buffers, f.name) for f in fields(self.buffers) if f.name not in ("k", "v")]
        ts += [getattr(self.outputs, f.name) for f in fields(self.outputs)] + [self.kv]
        return sum(t.numel() * t.element_size() for t in ts)

    def _batch(self, batch: Optional[int]) -> int:
        if batch is None:
            return self.max_batch
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= self.max_batch:
            raise InputError(f"batch must be an int in [1, max_batch={self.max_batch}], got batch={batch!r}")
        return batch

    def _slot(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.max_batch:
            raise InputError(f"slot must be an int in [0, max_batch={self.max_batch}), got slot={slot!r}")
        return slot

    def _slots(self, slots: Any) -> Any:
        if isinstance(slots, int) and not isinstance(slots, bool):
            return self._slot(slots)
        if isinstance(slots, torch.Tensor):
            return slots.to(self.device)
        return [self._slot(s) for s in slots]

    def __repr__(self) -> str:
        return (f"Drafter(backend={self.backend!r}, max_batch={self.max_batch}, max_context={self.max_context}, "
                f"max_new_rows={self.max_new_rows}, total_token={self.cfg.total_token}, depth={self.cfg.depth}, "
                f"top_k={self.cfg.top_k}, dtype={self.dtype}, device={self.device})")


def supports_static(backend_impl: Any) -> bool:
    """Whether a backend can draft from a Drafter's static buffers (``Backend.static_drafter``)."""
    return callable(getattr(backend_impl, "static_drafter", None))


def _same_index(device: torch.device, like: torch.device) -> torch.device:
    """``device`` with ``like``'s index when it names none ("cuda" beside "cuda:0")."""
    if device.index is None and device.type == like.type:
        return like
    return device


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


__all__ = ["Drafter", "DrafterBuffers", "DrafterOutputs", "StagedInputs", "StaticStep"]
