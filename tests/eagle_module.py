"""An EAGLE-style draft module (the public attribute names: ``fc``, ``midlayer.self_attn.q_proj``,
``lm_head``, ``d2t`` ...) holding given weights, as the public EAGLE code's ``ea_layer`` does."""

from __future__ import annotations

import torch


def eagle_style_module(state: dict, config) -> torch.nn.Module:
    """A module whose submodules and parameters follow the keys of ``state`` (``d2t`` as a
    buffer), with ``config`` as its ``.config``."""
    layer = torch.nn.Module()
    layer.config = config
    for key, tensor in state.items():
        *path, leaf = key.split(".")
        mod = layer
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        if leaf == "d2t":
            mod.register_buffer("d2t", tensor.clone())
        else:
            mod.register_parameter(leaf, torch.nn.Parameter(tensor.clone()))
    return layer
