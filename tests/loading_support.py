"""Shared scaffolding of the loading tests: the small head config they save and load, and the
mark of tests that draft with torch_ref."""

from __future__ import annotations

import pytest

import frontier
from frontier import FrontierError
from frontier.random_head import random_config


def torch_ref_ok() -> bool:
    try:
        ok, _ = frontier.get_backend("torch_ref").availability()
    except FrontierError:
        return False
    return ok


needs_torch_ref = pytest.mark.skipif(not torch_ref_ok(), reason="torch_ref backend is not available")


def head_cfg(arch="eagle3", *, v=40, vt=90, h=24, nh=3, nkv=1, inter=40, layers=2, **extra):
    """A small head config of either architecture (eagle2: the target's vocabulary, ``layers`` layers)."""
    if arch == "eagle2":
        vt = v
        extra.setdefault("num_layers", layers)
    return random_config(total_token=14, depth=3, top_k=3, vocab_size=v, target_vocab_size=vt, hidden_size=h,
                         num_attention_heads=nh, num_key_value_heads=nkv, intermediate_size=inter, architecture=arch,
                         **extra)
