"""The triton backend: the whole draft call on the GPU as fused Triton kernels (CUDA-graph replayed
step launches by default, or one persistent launch)."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from ...errors import InputError
from ...parity import CandidateTrace
from ...registry import Backend
from ...result import Frontier
from ...tree import pack_tree


def _triton_importable() -> tuple[bool, str]:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the install
        return False, f"triton is not importable ({type(exc).__name__}: {exc}); pip install triton"
    return True, ""


class TritonBackend(Backend):
    name = "triton"
    requires_weights = True
    # mode: how the phases launch; pack_weights: stream packed weight copies and read the
    # embedding-QKV table (copies derived from the head's weights); tuning: tile and
    # launch-shape overrides (a Tuning, or "field=value,..."); pack: who packs the tree ("kernel"
    # or "torch"); trace: the candidate list in Frontier.info
    options = ("mode", "pack_weights", "tuning", "pack", "trace")
    description = "fused Triton drafter (GPU; CPU under TRITON_INTERPRET=1)"

    def __init__(self) -> None:
        self._drafters: dict[Any, Any] = {}
        self._lock = threading.Lock()

    # Attributes read by frontier_generate's validation --------------------------------------
    @property
    def devices(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("cuda", "cpu") if os.environ.get("TRITON_INTERPRET") == "1" else ("cuda",)

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:  # type: ignore[override]
        if os.environ.get("TRITON_INTERPRET") == "1":
            return (torch.float32, torch.float16)
        return (torch.float32, torch.float16, torch.bfloat16)

    def availability(self) -> tuple[bool, str]:
        ok, why = _triton_importable()
        if not ok:
            return ok, why
        if os.environ.get("TRITON_INTERPRET") == "1":
            return True, ""
        if not torch.cuda.is_available():
            return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels on the CPU interpreter)"
        return True, ""

    # ------------------------------------------------------------------------------------------
    def drafter(self, cfg, dtype: torch.dtype, device: torch.device, pack_weights: bool = True,
                tuning=None, formats=None):
        """The drafter of (cfg, dtype, device, tuning, weight formats), made on first use and
        kept; ``tuning`` (a :class:`~.tuning.Tuning`, default the measured one) with
        ``pack_weights`` False: one that streams the weights as they are (no packed copies or
        embedding-QKV table, none of their memory); ``formats``: the head's
        ``fp8.stream_formats`` (default: no fp8)."""
        import dataclasses

        from .fp8 import StreamFormats
        from .launch import Launcher
        from .tuning import Tuning

        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # "cuda" and "cuda:0" share one drafter
        tuning = dataclasses.replace(tuning or Tuning(), pack_weights=pack_weights)
        formats = formats or StreamFormats()
        key = (cfg, dtype, str(device), tuning, formats)
        with self._lock:
            d = self._drafters.get(key)
            if d is None:
                d = Launcher(cfg, dtype, device, tuning, formats)
                self._drafters[key] = d
        return d

    @staticmethod
    def _tuning(value):
        """The ``tuning`` option as a Tuning: None (the default), a Tuning, or ``"field=value"``
        overrides separated by commas (``Tuning.overrides`` parses each as its field's type)."""
        from .tuning import Tuning

        if value is None or isinstance(value, Tuning):
            return value
        if not isinstance(value, str):
            raise InputError(f"option tuning must be a Tuning or a 'field=value,...' string, got {type(value).__name__}")
        try:
            return Tuning(**Tuning.overrides([kv.strip() for kv in value.split(",") if kv.strip()]))
        except ValueError as exc:
            raise InputError(f"option tuning: {exc}") from None

    def generate(self, request) -> Frontier:
        return self.generate_batch([request])[0]

    def static_drafter(self, drafter, *, tuning=None, pack_weights: bool = True):
        """The draft step over a :class:`frontier.Drafter`'s buffers: the step launches with the
        metadata built on the device (options ``tuning``, ``pack_weights`` as for a call)."""
        from .static import StaticTriton

        return StaticTriton(drafter, tuning=tuning, pack_weights=pack_weights)

    def _check(self, request) -> tuple[str, bool, Any]:
        """Refusals of this backend (clear errors); returns the launch mode, ``pack_weights`` and
        the tuning (None: the default)."""
        from .launch import interpreting

        cfg = request.cfg
        if cfg.num_layers != 1:
            raise InputError(
                f"backend 'triton' runs single-layer draft heads (every EAGLE-3 head, the usual EAGLE-2 head); "
                f"got num_layers={cfg.num_layers}: use backend='torch_ref'"
            )
        if cfg.top_k > 16:
            raise InputError(
                f"backend 'triton' supports top_k <= 16 (one 16-row activation tile), got top_k={cfg.top_k}: "
                "use backend='torch_ref'"
            )
        if request.device.type == "cpu" and not interpreting():
            raise InputError("backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter)")
        mode = request.options.get("mode")
        if mode is None:
            mode = "steps" if (interpreting() or request.device.type != "cuda") else "graph"
        if mode not in ("persistent", "steps", "graph"):
            raise InputError(f"option mode must be 'persistent', 'steps' or 'graph', got {mode!r}")
        if mode == "persistent" and interpreting():
            raise InputError("option mode='persistent' cannot run under TRITON_INTERPRET=1 (its grid barrier would spin)")
        if mode == "graph" and (interpreting() or request.device.type != "cuda"):
            raise InputError("option mode='graph' (the step launches replayed as a CUDA graph) needs a CUDA device")
        pack = request.options.get("pack_weights", True)
        if not isinstance(pack, bool):
            raise InputError(f"option pack_weights must be True or False, got {pack!r}")
        if request.options.get("pack", "kernel") not in ("kernel", "torch"):
            raise InputError(f"option pack must be 'kernel' or 'torch', got {request.options['pack']!r}")
        return mode, pack, self._tuning(request.options.get("tuning"))

    def generate_batch(self, requests) -> list[Frontier]:
        """Draft B sequences in one launch: every weight tile is streamed once for the tree rows
        of all sequences. In fp32 each sequence's Frontier equals drafting it alone; the tiling
        depends on the batch size, so bf16 near-ties may resolve differently (docs/triton.md)."""
        from .launch import SeqCall

        # a batch shares cfg, weights, device and options (frontier_generate_batch), so one check
        modes = {r.options.get("mode") for r in requests}
        if len(modes) != 1:
            raise InputError(f"all sequences of a batch must use one launch mode, got {sorted(map(str, modes))}")
        mode, pack, tuning = self._check(requests[0])
        r0 = requests[0]
        cfg, w = r0.cfg, r0.weights
        seqs, caches = [], []
        for b, r in enumerate(requests):
            cache = r.draft_cache()
            if not (_layer_contiguous(cache.k) and _layer_contiguous(cache.v)):
                raise InputError(f"sequence {b}: backend 'triton' needs each draft cache's K/V storage contiguous "
                                 f"per layer ([kv heads, max_length, head_dim] rows), got strides "
                                 f"{tuple(cache.k.stride()[1:])} and {tuple(cache.v.stride()[1:])}")
            ids = r.input_ids[0, 1:]  # [L] the token paired with each hidden state
            c, n = cache.length, r.num_new
            seqs.append(SeqCall(r.features[0], ids[c:], r.input_ids[0, -1:], cache, c, n))
            caches.append(cache)
        if len({id(c) for c in caches}) != len(caches):
            raise InputError("two sequences of a batch cannot share one draft cache")

        from .fp8 import stream_formats

        d = self.drafter(cfg, w.dtype, r0.device, pack, tuning, stream_formats(w, w.dtype))
        with d_lock(d):
            ws = d.run_batch(w, seqs, mode, fresh_outputs=True)
            # The Frontiers are built while the GPU drafts (their ops queue behind the kernel),
            # then the error flag is read: the call's one host read. A failed call commits nothing,
            # and a flagged kernel is reported as such even if its garbage broke the assembly.
            try:
                results = self._frontiers(d, ws, requests, caches)
            except Exception:
                if mode == "persistent":
                    d.check_error()
                raise
            if mode == "persistent":
                d.check_error()
        for cache, s in zip(caches, seqs):
            cache.commit(s.c + s.n)  # the kernel wrote rows [c, c+n); only now do they count
        return results

    @staticmethod
    def _frontiers(d, ws, requests, caches) -> list[Frontier]:
        """One Frontier per sequence: views of the launch's batched outputs (one op per output)."""
        cfg = requests[0].cfg
        need_host = any(not r.padded for r in requests)
        leaf_info = d.out_leaf.tolist() if need_host else None  # the one host read that sizes retrieve rows
        parents = torch.cat([d.out_par.new_zeros(len(requests), 1), d.out_par], dim=1).unbind(0)
        toks, pars, scores = d.out_tok.unbind(0), d.out_par.unbind(0), d.out_score.unbind(0)
        masks, poss, rets, leaves = (d.out_mask[:, None, None].unbind(0), d.out_pos.unbind(0), d.out_ret.unbind(0),
                                     d.out_leaf[:, 0].unbind(0))
        results = []
        for b, r in enumerate(requests):
            out_tok, out_par, out_score = toks[b], pars[b], scores[b]
            if r.sampling or r.options.get("pack") == "torch":
                # sampling orders retrieve rows lexicographically: the shared packer does it
                packed = pack_tree(out_par, sampling=r.sampling, padded=r.padded, max_depth=cfg.depth + 1)
                mask, pos, ret, leaf_count = (packed.tree_mask, packed.tree_position_ids,
                                              packed.retrieve_indices, packed.leaf_count)
            else:  # packed in the kernel's final phase, pack_tree's exact layout
                mask, pos, ret, leaf_count = masks[b], poss[b], rets[b], leaves[b]
                if not r.padded:
                    n_leaves, deepest = leaf_info[b]
                    ret = ret[:n_leaves, : deepest + 1].contiguous()
            fr = Frontier(
                draft_tokens=out_tok[None],
                retrieve_indices=ret,
                tree_mask=mask,
                tree_position_ids=pos,
                cache=caches[b],
                scores=out_score,
                parents=parents[b],
                leaf_count=leaf_count,
                padded=r.padded,
            )
            if r.options.get("trace"):  # the candidate list as the kernel built it (frontier.parity)
                fr.info["trace"] = CandidateTrace(scores=ws.cand_score[b].clone(), tokens=ws.cand_tok[b].clone(),
                                                  row_parents=ws.row_par[b].clone())
            results.append(fr)
        return results


def _layer_contiguous(t: torch.Tensor) -> bool:
    """Whether each layer ``t[l]`` of a [layers, kv heads, max_length, head_dim] storage is
    contiguous (what ``t[0].is_contiguous()`` says, without making the view on every call)."""
    expect = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


class d_lock:
    """Serialise calls that share one drafter's workspace."""

    _locks: dict[int, threading.Lock] = {}

    def __init__(self, drafter) -> None:
        self.lock = self._locks.setdefault(id(drafter), threading.Lock())

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()
