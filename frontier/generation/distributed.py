"""Speculative generation over a tensor-parallel target (``torch.distributed`` + transformers' TP).

The target is sharded by transformers (``from_pretrained(..., tp_plan="auto")`` under ``torchrun``,
see :func:`load_tp_target`); its parameters are DTensors on a 1-D device mesh, one rank per device.
The draft head stays whole: every rank holds its own copy and runs the same draft call on the same
inputs. The features a rank drafts from are the target's hidden states, which the TP forward leaves
replicated (the row-parallel projections all-reduce, the lm_head gathers its logits), so every rank
drafts the same tree without a collective. Each step's acceptance is then checked to be the same on
every rank (:func:`read_agreed`: one all-reduce of a few integers, read with the step's one host
read); a rank that diverged makes every rank raise :class:`RankDivergenceError` together.

Nothing here runs for a target on one device (``tp_group(target)`` is None).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from ..errors import FrontierError, InputError

__all__ = [
    "RankDivergenceError", "check_tp_size", "check_agreement", "is_rank_zero", "load_tp_target", "read_agreed",
    "shared_seed", "tp_group",
]


class RankDivergenceError(FrontierError, RuntimeError):
    """The ranks of a tensor-parallel target accepted different tokens in one step."""


def _dtensor_type() -> Optional[type]:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


def tp_group(target: torch.nn.Module) -> Any:
    """The process group ``target``'s parameters are sharded over; None for a target on one device.

    A tensor-parallel target (transformers' TP plans) holds DTensor parameters on a 1-D mesh.
    """
    dtensor = _dtensor_type()
    if dtensor is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    mesh = next((p.device_mesh for p in target.parameters() if isinstance(p, dtensor)), None)
    if mesh is None:
        return None
    if mesh.ndim != 1:
        raise InputError(
            f"the target's parameters are sharded over a {mesh.ndim}-D device mesh {tuple(mesh.shape)}; "
            "frontier.generate takes a tensor-parallel target on a 1-D mesh (tp_plan=..., one TP group)"
        )
    group = mesh.get_group()
    return group if torch.distributed.get_world_size(group) > 1 else None


def check_tp_device(group: Any, device: torch.device) -> None:
    """On CUDA, a rank's target must live on its current device (the draft kernels launch there)."""
    if group is None or device.type != "cuda":
        return
    current = torch.cuda.current_device()
    if device.index is not None and device.index != current:
        raise InputError(
            f"rank {torch.distributed.get_rank()}: the target is on {device} but the current CUDA device is "
            f"cuda:{current}; call torch.cuda.set_device(local_rank) before loading the target and the head"
        )


def check_agreement(local: torch.Tensor, high: torch.Tensor, low: torch.Tensor, step: int) -> None:
    """Raise :class:`RankDivergenceError` unless every rank's ``local`` equals the group's maximum
    ``high`` and minimum ``low`` (all [A, W] int64; host or device)."""
    if torch.equal(high, low) and torch.equal(local, high):
        return
    seqs = sorted({int(i) for i in (high != low).any(dim=1).nonzero()[:, 0].tolist()})
    raise RankDivergenceError(
        f"verify step {step}: the ranks of the tensor-parallel target accepted different tokens "
        f"(sequence(s) {seqs} of the active batch; per rank min {low[seqs].tolist()}, max {high[seqs].tolist()}); "
        "the draft head or its inputs differ between ranks (a non-deterministic backend, different head weights, "
        "or sampling without the same seed on every rank)"
    )


def read_agreed(small: torch.Tensor, group: Any, step: int) -> list[list[int]]:
    """``small.tolist()`` ([A, W] int64 on the device), after checking every rank of ``group`` holds
    the same values (one all-reduce MAX of ``[small, -small]``; no collective when ``group`` is None).
    Every rank sees the same reduced values, so on a divergence every rank raises together."""
    if group is None:
        return small.tolist()
    width = small.shape[1]
    both = torch.cat([small, -small], dim=1)  # [A, 2W]: max and -min in one all-reduce
    torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX, group=group)
    host = torch.cat([small, both], dim=1).cpu()  # [A, 3W]: the step's one host read
    local, high, low = host[:, :width], host[:, width : 2 * width], -host[:, 2 * width :]
    check_agreement(local, high, low, step)
    return local.tolist()


def shared_seed(group: Any, device: torch.device) -> int:
    """A sampling seed drawn on the group's first rank and broadcast to every rank."""
    seed = torch.randint(0, 2**62, (1,), device=device)  # [1]
    src = torch.distributed.get_global_rank(group, 0)
    torch.distributed.broadcast(seed, src=src, group=group)
    return int(seed.item())


def is_rank_zero() -> bool:
    """True outside torch.distributed, and on global rank 0 inside it (the rank that prints)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def check_tp_size(config: Any, tp: int, where: str = "the target") -> None:
    """``tp`` must divide the target's attention and key/value heads (transformers shards by head)."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise InputError(f"the tensor-parallel size must be an integer >= 1, got {tp!r}")
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % tp or kv % tp:
        raise InputError(
            f"tensor-parallel size {tp} must divide {where}'s {heads} attention heads and {kv} key/value heads"
        )


def load_tp_target(path: str, *, dtype: torch.dtype, attn_implementation: str = "sdpa", **kwargs: Any) -> Any:
    """A Hugging Face causal LM sharded over every rank with its own TP plan (``tp_plan="auto"``).

    Call it on every rank, under ``torchrun`` (or with the process group initialised and, on CUDA,
    ``torch.cuda.set_device(local_rank)`` done). Uses ``distributed_config=DistributedConfig(...)``
    where transformers has it (5.x), else the older ``tp_plan=`` keyword.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else int(
        os.environ.get("WORLD_SIZE", "1"))
    check_tp_size(AutoConfig.from_pretrained(path, local_files_only=True), world, where=path)
    try:
        from transformers.distributed import DistributedConfig

        plan = {"distributed_config": DistributedConfig(tp_plan="auto")}
    except ImportError:
        plan = {"tp_plan": "auto"}
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True, **plan, **kwargs
    )
    return model.eval()
