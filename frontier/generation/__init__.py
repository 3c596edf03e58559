"""Lossless speculative generation with a Hugging Face causal-LM target.

One call, the target's own output, faster::

    from frontier import generate
    out = generate(target, input_ids, cfg=cfg, weights=weights, backend="torch_ref", max_new_tokens=64)
    out.sequences          # [1, P + N], what target.generate(...) returns
    print(out.stats.table())

The loop (EAGLE-2/EAGLE-3 dynamic trees):

1. Prefill: one target forward over the prompt (P tokens). Its last logits give the first
   new token (the first tree root); its features (EAGLE-3: the hidden states entering layers
   2, L//2 and L-3, concatenated; EAGLE-2: the final, normed hidden state) seed the drafter.
2. Draft: ``frontier_generate`` builds a tree of T tokens rooted at the last new token.
3. Verify: ONE target forward over the T tree tokens at positions ``context + tree_position_ids``,
   attending to the whole cached context plus the tree mask (an additive 4-D mask). The target
   KV cache grows by T rows.
4. Accept (on the device, see :func:`greedy_accept` / :func:`sampling_accept`): the deepest
   tree node whose whole path the target agrees with, plus the target's next token. One small
   host read per step fetches how many tokens were accepted and which ones.
5. Compact: the accepted path's K/V rows move to the end of the context, the rest is dropped.
   The accepted rows' target features, with the new root token, feed the next draft call.
   (The draft cache never holds tree rows, so it needs no compaction: the next draft call
   appends the accepted rows' draft K/V from their target features.)

Batches (a list of ragged prompts, or a padded [B, P] tensor with its attention_mask) run the
same loop for all sequences at once: one draft call (``frontier_generate`` with per-sequence
lists) and one target forward per step, over one padded target KV buffer with per-sequence
lengths.

Greedy verification accepts exactly the tokens the target's argmax would produce, so the output
equals ``target.generate(do_sample=False)``. Sampling verification is EAGLE's tree rejection
scheme, which leaves the output distribution exactly the target's (see :mod:`.acceptance`).

Modules: :mod:`.loop` (the generator and :func:`generate`), :mod:`.arguments` (checks of every
argument), :mod:`.target` (the target's forwards and KV cache), :mod:`.acceptance` (tree
verification), :mod:`.stats` (results and stats), :mod:`.random_models` (random pairs).
"""

from .acceptance import SamplingParams, greedy_accept, greedy_accept_batch, sampling_accept, tree_parents, warp_logits
from .loop import SpeculativeGenerator, generate
from .random_models import RANDOM_PRESETS, random_pair
from .stats import BatchGenerationResult, BatchGenerationStats, GenerationResult, GenerationStats
from .target import eagle3_tap_layers

__all__ = [
    "generate",
    "BatchGenerationResult",
    "BatchGenerationStats",
    "SpeculativeGenerator",
    "GenerationResult",
    "GenerationStats",
    "SamplingParams",
    "eagle3_tap_layers",
    "greedy_accept",
    "greedy_accept_batch",
    "random_pair",
    "sampling_accept",
    "tree_parents",
    "warp_logits",
]
