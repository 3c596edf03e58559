"""The triton backend: the whole draft call on the GPU in one persistent fused Triton kernel."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from ...errors import InputError
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
    description = "fused persistent Triton drafter (GPU; CPU under TRITON_INTERPRET=1)"

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
    def drafter(self, cfg, dtype: torch.dtype, device: torch.device):
        from .launch import Drafter

        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # "cuda" and "cuda:0" share one drafter
        key = (cfg, dtype, str(device))
        with self._lock:
            d = self._drafters.get(key)
            if d is None:
                d = Drafter(cfg, dtype, device)
                self._drafters[key] = d
        return d

    def generate(self, request) -> Frontier:
        from .launch import interpreting

        cfg, w = request.cfg, request.weights
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
            mode = "steps" if (interpreting() or request.device.type != "cuda") else "persistent"
        if mode not in ("persistent", "steps"):
            raise InputError(f"option mode must be 'persistent' or 'steps', got {mode!r}")
        if mode == "persistent" and interpreting():
            raise InputError("option mode='persistent' cannot run under TRITON_INTERPRET=1 (its grid barrier would spin)")

        ids = request.input_ids[0, 1:]  # [L] token paired with each hidden state
        cache = request.draft_cache()
        c = cache.length
        n = request.num_new

        d = self.drafter(cfg, w.dtype, request.device)
        with d_lock(d):
            d.alloc_outputs()
            features = request.features[0].contiguous()  # [n, F]
            ids_new = ids[c:].contiguous()  # [n]
            root = request.input_ids[0, -1:].contiguous()  # [1]
            d.run(w, features, ids_new, root, cache, c, n, mode)
            out_tok, out_par, out_score = d.out_tok, d.out_par, d.out_score
            if request.sampling or request.options.get("pack") == "torch":
                # sampling orders retrieve rows lexicographically: the shared packer does it
                packed = pack_tree(out_par, sampling=request.sampling, padded=request.padded, max_depth=cfg.depth + 1)
                mask, pos, ret, leaf_count = packed.tree_mask, packed.tree_position_ids, packed.retrieve_indices, packed.leaf_count
            else:  # packed in the kernel's final phase, pack_tree's exact layout
                mask, pos, ret, leaf_count = d.out_mask[None, None], d.out_pos, d.out_ret, d.out_leaf[0]
                if not request.padded:  # the one host read that sizes retrieve_indices
                    n_leaves, deepest = d.out_leaf.tolist()
                    ret = ret[:n_leaves, : deepest + 1].contiguous()
            if mode == "persistent":
                d.check_error()  # one host read, after the packing work is queued behind the kernel
        cache.commit(c + n)  # the kernel wrote rows [c, c+n); only now do they count
        return Frontier(
            draft_tokens=out_tok[None],
            retrieve_indices=ret,
            tree_mask=mask,
            tree_position_ids=pos,
            cache=cache,
            scores=out_score,
            parents=torch.cat([out_par.new_zeros(1), out_par]),
            leaf_count=leaf_count,
            padded=request.padded,
        )


class d_lock:
    """Serialise calls that share one drafter's workspace."""

    _locks: dict[int, threading.Lock] = {}

    def __init__(self, drafter) -> None:
        self.lock = self._locks.setdefault(id(drafter), threading.Lock())

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()
