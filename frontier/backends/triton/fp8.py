"""How the triton drafter streams each weight matrix of a head: in the compute dtype, or as fp8
(e4m3) with per-output-channel scales, in whichever exact form the scales allow.

A weight's value is its dequantized form ``(w.float() * scale).to(dtype)``
(:func:`frontier.weights.dequantize_fp8`), what torch_ref computes with. The kernels stream the
e4m3 bytes and reproduce it in one of two ways (``kernels.stream``):

- ``FP8_EXACT`` (1): every scale of the matrix is a power of two ``2^k`` whose products with
  every e4m3 value are exact in the compute dtype: ``448 * 2^k`` finite and ``2^(k-9)`` (the
  e4m3 quantum times the scale) no finer than the dtype's smallest subnormal - decided from the
  scales alone, without reading the weights (the loader's power-of-two scales pass in bf16 and
  fp32). The weights are converted to the compute dtype without rounding and the row scale
  multiplies the fp32 accumulator once after the k-loop, which gives the same bits as the dot
  with the dequantized weights, at no per-element cost.
- ``FP8_DEQUANT`` (2): any other scales. Each weight is widened, multiplied by its row's scale
  and rounded to the compute dtype in registers, as the reference does.

In bf16 on a GPU either form adds ``BF16_BITS``: the e4m3 -> bf16 conversion is done with integer
ops and one exact bf16 multiply (``kernels.stream._e4m3_bf16``) instead of conversion
instructions. In a 16-bit compute dtype either form adds ``SWAP_DOT``: wherever a stream's
activation rows are one tile of at most 64 rows (``kernels.stream.SWAP_ROWS``: every stream at
batch 1; at top_k 10 the tree rows up to batch 6, and the context step's rows on tiles of their
own), its dot takes the activations as its first operand (``kernels.stream._w_dot``), which keeps
Triton from gathering the converted weights two bytes at a time. The planner gives a launch with
such streams one tile where two would hold the rows (all of its streams: a head that streams
some matrices in the compute dtype pads those to that tile too). The streams that fold their
k-chunks in the compute dtype (fc, o_proj and down) split them across the warps instead
(``kernels.stream._stream_split``) on 16-row tiles and stay folded and unswapped on wider ones.
In a 16-bit compute dtype a stream whose rows start on 16-byte boundaries (every matrix's data and
row length a multiple of 16 bytes; EAGLE-3's QKV also its hidden half) also adds ``PACK_WORDS``:
where its dot is neither swapped nor folded, it reads the e4m3 bytes four to an int32 word, 16
bytes per load (``kernels.stream._w_chunk``), for the same reason.

The streams are the kernel's: fc, QKV ([q; k; v] as one matrix), o_proj, gate/up (one loop), down
and the lm_head. The matrices of one stream share a format.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import InputError
from ...weights import FP8, FP8_MAX, stamp_matches, tensors_stamp

PLAIN, FP8_EXACT, FP8_DEQUANT = 0, 1, 2
BF16_BITS = 4  # added to an fp8 form: convert e4m3 to bf16 with integer ops (not under the interpreter)
SWAP_DOT = 8  # added to an fp8 form in 16-bit dtypes: the activations first in one-tile dots of up to 64 rows
PACK_WORDS = 16  # added in 16-bit dtypes to 16-byte aligned rows: dots neither swapped nor folded read int32 words


@dataclass(frozen=True)
class StreamFormats:
    """The weight format of every stream (``PLAIN``, ``FP8_EXACT`` or ``FP8_DEQUANT``, the latter two
    possibly + ``BF16_BITS``, + ``SWAP_DOT`` and + ``PACK_WORDS``)."""

    fc: int = PLAIN
    qkv: int = PLAIN
    o: int = PLAIN
    gu: int = PLAIN
    d: int = PLAIN
    lm: int = PLAIN

    def const(self) -> dict:
        """The kernel's compile-time constants W8_*."""
        return dict(W8_FC=self.fc, W8_QKV=self.qkv, W8_O=self.o, W8_GU=self.gu, W8_D=self.d, W8_LM=self.lm)

    def weight_bytes(self, stream: str, dtype: torch.dtype) -> int:
        """Bytes of one weight element of ``stream`` ('fc', 'qkv', ...)."""
        return 1 if getattr(self, stream) != PLAIN else dtype.itemsize


def _stream_keys(weights) -> dict[str, tuple[str, ...]]:
    p = "midlayer" if weights.architecture == "eagle3" else "layers.0"
    attn, mlp = f"{p}.self_attn", f"{p}.mlp"
    return {
        "fc": ("fc.weight",),
        "qkv": tuple(f"{attn}.{n}_proj.weight" for n in "qkv"),
        "o": (f"{attn}.o_proj.weight",),
        "gu": (f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"),
        "d": (f"{mlp}.down_proj.weight",),
        "lm": ("lm_head.weight",),
    }


def qkv_scales(weights) -> list[torch.Tensor]:
    """The q, k and v projections' own fp32 row scales (none for a head whose QKV is not fp8):
    what the QKV stream's scales are made of."""
    return [weights.scales[k] for k in _stream_keys(weights)["qkv"] if k in weights.scales]


def _exact(scale: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every scale is a power of two whose products with every e4m3 value are exact in
    ``dtype`` (e4m3 values are multiples of 2^-9 of at most 448, with 4 significant bits)."""
    fi = torch.finfo(dtype)
    quantum = fi.smallest_normal * fi.eps  # the dtype's smallest subnormal
    m, _ = torch.frexp(scale)
    ok = (m == 0.5) & (scale * FP8_MAX <= fi.max) & (scale * 2.0 ** -9 >= quantum)
    return bool(ok.all())


def stream_formats(weights, dtype: torch.dtype) -> StreamFormats:
    """Each stream's format for drafting ``weights`` in ``dtype``; an :class:`InputError` when a
    tensor of the head is not contiguous (the kernels address every weight as dense row-major
    storage, row r of a matrix at r times its row length, so a transposed or sliced view would be
    read as other values) or when the matrices of one stream mix fp8 and the compute dtype. Kept
    while no tensor of the head changes (``DraftWeights.memo``; a refused head is checked again
    at every call)."""
    from .plan import interpreting

    bits = BF16_BITS if dtype == torch.bfloat16 and not interpreting() else 0
    if dtype.itemsize == 2:
        bits += SWAP_DOT
    return weights.memo(("triton_formats", dtype, bits), lambda: _formats(weights, dtype, bits))


def _formats(weights, dtype: torch.dtype, bits: int) -> StreamFormats:
    state = weights.state_dict()
    for key, t in state.items():
        if not t.is_contiguous():
            raise InputError(f"backend 'triton' reads every weight as contiguous row-major storage: {key!r} of shape "
                             f"{list(t.shape)} has strides {t.stride()}; pass a contiguous copy (tensor.contiguous())")
    if not weights.is_fp8:
        return StreamFormats()
    out = {}
    for stream, keys in _stream_keys(weights).items():
        fp8 = [state[k].dtype == FP8 for k in keys]
        if any(fp8) and not all(fp8):
            raise InputError(
                f"backend 'triton' streams {', '.join(repr(k) for k in keys)} as one matrix: they must all be fp8 "
                f"or all {dtype}, got {[str(state[k].dtype) for k in keys]}; use backend='torch_ref'"
            )
        if not fp8[0]:
            out[stream] = PLAIN
            continue
        form = FP8_EXACT if all(_exact(weights.scales[k], dtype) for k in keys) else FP8_DEQUANT
        words = dtype.itemsize == 2 and _word_aligned([state[k] for k in keys],
                                                      halves=stream == "qkv" and weights.architecture == "eagle3")
        out[stream] = form + bits + (PACK_WORDS if words else 0)
    return StreamFormats(**out)


def _word_aligned(mats: list, halves: bool) -> bool:
    """Whether every row of every e4m3 matrix starts on a 16-byte boundary, and with ``halves``
    also its second half (EAGLE-3's QKV streams its hidden half on its own)."""
    from .plan import rows_aligned

    return rows_aligned(mats) and not (halves and any(m.shape[1] % 32 for m in mats))


def stream_scales(weights, dummy: torch.Tensor) -> dict[str, torch.Tensor]:
    """The kernel's scale arguments (s*_ptr): each fp8 stream's fp32 row scales, the QKV stream's
    concatenated over [q; k; v] (made once and kept while the head is unchanged); ``dummy``
    stands in for the streams in the compute dtype (never read)."""
    keys = _stream_keys(weights)
    sc = weights.scales

    def one(stream: str) -> torch.Tensor:
        ks = keys[stream]
        return sc[ks[0]] if ks[0] in sc else dummy

    qkv = dummy
    parts = qkv_scales(weights)
    if parts:
        hit = weights._memo.get("triton_qkv_scale")
        if hit is None or not stamp_matches(hit[0], parts):
            cat = torch.cat(parts)
            if hit is not None and hit[1].shape == cat.shape:  # in place: a captured graph keeps its address
                hit[1].copy_(cat)
                cat = hit[1]
            hit = (tensors_stamp(parts), cat)
            weights._memo["triton_qkv_scale"] = hit
        qkv = hit[1]
    gate, up = keys["gu"]
    return dict(sfc_ptr=one("fc"), sqkv_ptr=qkv, so_ptr=one("o"), sg_ptr=sc.get(gate, dummy),
                su_ptr=sc.get(up, dummy), sd_ptr=one("d"), slm_ptr=one("lm"))
