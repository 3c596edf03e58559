"""Load, describe and save published EAGLE-2 / EAGLE-3 draft heads in local directories (nothing downloads).

A head directory holds ``config.json`` plus the weights in one of the layouts the public
EAGLE releases use::

    model.safetensors                       (preferred when several layouts are present)
    model.safetensors.index.json + model-0000i-of-0000n.safetensors
    pytorch_model.bin
    pytorch_model.bin.index.json + pytorch_model-0000i-of-0000n.bin

Key names are the public ones (see :mod:`frontier.weights`). EAGLE-3 heads carry ``d2t``
(``[draft_vocab]`` int64 OFFSETS: ``target_id = draft_id + d2t[draft_id]``) and ``t2d``
(``[vocab]`` bool: which target ids the draft vocabulary covers). EAGLE-3 LLaMA heads do not ship
the token embedding and EAGLE-2 heads never ship an lm_head: both come from the target model,
either a local checkpoint directory (only ``model.embed_tokens.weight`` / ``lm_head.weight`` are
read, lazily, through the index json) or a loaded Hugging Face model.

Everything is checked from the checkpoint metadata before a single weight is read, and every
error names the file, the key and the expected vs found shape. A failed load returns nothing
and changes nothing: no global state, no argument is modified.

Behaviour where the public code is silent or lenient (documented choices):

* The public loader calls ``load_state_dict(strict=False)``, so a missing key silently keeps a
  random initialisation. Here a missing key is always an error; an unexpected key is an error
  with ``strict=True`` and a warning otherwise (rotary ``inv_freq`` buffers are always ignored).
* ``rope_scaling``: the public EAGLE config accepts only ``{"type": "linear"|"dynamic", "factor": f}``
  and rejects anything else (a ``llama3`` dict fails there). frontier drafts with ``None`` or
  ``linear`` only; any other kind is an error naming config.json. To draft anyway, pass
  ``config_overrides={"rope_scaling": None}`` — then positions use plain RoPE, which is not what
  a head trained with that scaling saw.
* When ``draft_vocab_size == vocab_size`` the public code drops ``d2t``/``t2d``; so do we.
* A head that ships ``embed_tokens.weight`` uses it (as the public loader does, the head's own
  tensor wins over the target's); ``embed_tokens=`` given explicitly wins over both.
* ``dtype=None`` keeps the head's stored floating dtype (which must be uniform); tensors taken
  from the target are cast to it. ``dtype=...`` casts everything. fp8 linears aside: a linear
  weight stored as float8_e4m3fn with its float32 ``<key>_scale`` ``[out]`` (the fp8 serving
  layout) stays fp8, its scale fp32, and ``dtype`` is the activation dtype of the rest.
  ``quantize="fp8"`` quantizes every other linear after the load (``DraftHead.quantization``
  reports the streamed bytes before and after).
* Tensors read from files are copied into fresh memory; the embedding / lm_head of a loaded
  target model (or given as ``embed_tokens=``/``lm_head=``) is shared, not copied, when its dtype
  and device already match (a 70B target's embedding is 2 GB).

The package's modules, lowest first:

* :mod:`.files`: locating files, reading config.json / index json safely, shard names.
* :mod:`.checkpoint`: :class:`CheckpointFiles`, tensors read lazily from safetensors / .bin shards.
* :mod:`.config_json`: the published config.json fields <-> :class:`HeadDims` / :class:`FrontierConfig`.
* :mod:`.plan`: every check of a load, from metadata only.
* :mod:`.describe`: :func:`describe_draft_head`, :func:`format_description`, :func:`bandwidth_floor_ms`.
* :mod:`.head`: :func:`load_draft_head` and :class:`DraftHead`.
* :mod:`.save`: :func:`save_draft_head`.
"""

from .checkpoint import LAYOUTS, CheckpointFiles, TensorInfo
from .config_json import HeadDims, head_config_json
from .describe import bandwidth_floor_ms, describe_draft_head, format_description
from .head import DraftHead, load_draft_head
from .save import save_draft_head

# The validation helpers, importable from frontier.loading for their unit tests.
from .config_json import _dims_from_config, _rope_from_config  # noqa: F401
from .files import MAX_JSON_BYTES, PathLike, _read_json, _read_json_file, _shard_name  # noqa: F401
from .plan import _raise_problems, _weight_of  # noqa: F401

__all__ = [
    "DraftHead",
    "HeadDims",
    "CheckpointFiles",
    "TensorInfo",
    "load_draft_head",
    "describe_draft_head",
    "format_description",
    "save_draft_head",
    "head_config_json",
    "bandwidth_floor_ms",
    "LAYOUTS",
]
