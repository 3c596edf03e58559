"""The vocabulary shared by the launcher and the device code: phase ids, the per-sequence
metadata block, ranking-key sentinels and the weight streams' cache policy.

A schedule entry is ``phase * 256 + depth`` (depth ``CTX_DEPTH`` is the context step). The host
names phases with :class:`Phase`; the device code compares against the ``PH_*`` constexprs
(Triton reads module globals only as constexprs), which carry the same values.
"""

from __future__ import annotations

from enum import IntEnum

import triton
import triton.language as tl

class Phase(IntEnum):
    """Phase ids of schedule entries (``kernels.program.drafter_kernel`` dispatches on them)."""

    FC = 0  # fc: EAGLE-3 features -> hidden (context step), EAGLE-2 [embed, hidden] -> hidden
    PREP3 = 1  # EAGLE-3: embedding + input_layernorm, hidden_norm of the parent rows
    PREP2 = 2  # EAGLE-2: embedding beside the parent hidden state
    QKV = 4
    ROPE = 5  # rotary embedding + K/V rows written to the cache (context) or tree scratch
    ATTN = 6  # split attention pass 1: per-part max and sum
    OPROJ = 7
    NORM_POST = 8
    GATEUP = 9
    DOWN = 10
    NORM_F = 11  # EAGLE-3's final norm
    LMHEAD = 12
    MERGE = 13  # per-row top-K from the lm_head programs' partials
    SELECT = 14  # per-sequence prune to the K best cumulative scores
    FINAL = 15  # top-(T-1) and tree packing
    ATTN2 = 16  # split attention pass 2: per-part P @ V
    ATTN3 = 17  # split attention: sum over parts
    RED_D = 20  # EAGLE-2's split-K down reduction (wide launches, tree depths; no norm follows to sum it)
    ATTN_F = 21  # fused attention, one item per (sequence, KV head) (batched launches)


CONTEXT_STEP = 255  # the depth field of the context step's entries (host)
CTX_DEPTH = tl.constexpr(CONTEXT_STEP)

PH_FC = tl.constexpr(Phase.FC.value)
PH_PREP3 = tl.constexpr(Phase.PREP3.value)
PH_PREP2 = tl.constexpr(Phase.PREP2.value)
PH_QKV = tl.constexpr(Phase.QKV.value)
PH_ROPE = tl.constexpr(Phase.ROPE.value)
PH_ATTN = tl.constexpr(Phase.ATTN.value)
PH_OPROJ = tl.constexpr(Phase.OPROJ.value)
PH_NORM_POST = tl.constexpr(Phase.NORM_POST.value)
PH_GATEUP = tl.constexpr(Phase.GATEUP.value)
PH_DOWN = tl.constexpr(Phase.DOWN.value)
PH_NORM_F = tl.constexpr(Phase.NORM_F.value)
PH_LMHEAD = tl.constexpr(Phase.LMHEAD.value)
PH_MERGE = tl.constexpr(Phase.MERGE.value)
PH_SELECT = tl.constexpr(Phase.SELECT.value)
PH_FINAL = tl.constexpr(Phase.FINAL.value)
PH_ATTN2 = tl.constexpr(Phase.ATTN2.value)
PH_ATTN3 = tl.constexpr(Phase.ATTN3.value)
PH_RED_D = tl.constexpr(Phase.RED_D.value)
PH_ATTN_F = tl.constexpr(Phase.ATTN_F.value)

# Per-sequence metadata (int64 [B, META_W]): cached rows c_b, new rows n_b, first packed new row,
# element offsets of the sequence's cache K and V from the kernel's kv base pointer, the cache's
# max_length (its rows per KV head), and the call's packed new rows N (the same in every entry;
# the kernel reads N here rather than as an argument, so a captured launch serves any N).
META_W = tl.constexpr(8)
META_C = tl.constexpr(0)
META_N = tl.constexpr(1)
META_ROW = tl.constexpr(2)
META_KOFF = tl.constexpr(3)
META_VOFF = tl.constexpr(4)
META_MAXLEN = tl.constexpr(5)
META_ROWS = tl.constexpr(6)

KEY_NONE = tl.constexpr(-0x7FFFFFFFFFFFFFFF)  # below every real key
KEY32_NONE = tl.constexpr(-0x80000000)  # below every real 32-bit key

# Weight streams are read once per forward: evict_first leaves L2 to what is reused (the
# kernel's code, the context K/V, the activations).
W_EVICT = tl.constexpr("evict_first")


@triton.jit
def _kv_off(mb, field, VEC: tl.constexpr):
    """A cache's K or V element offset from the metadata row ``mb``. Loaded values carry no
    alignment facts (the cache loads would be 2-byte scalars); with VEC > 1 the launcher proved
    every offset a multiple of VEC elements (16 bytes)."""
    off = tl.load(mb + field)
    if VEC > 1:
        off = tl.multiple_of(off, VEC)
    return off


@triton.jit
def _seq_cache(meta_ptr, b, kv_ptr, HD, VEC: tl.constexpr):
    """Sequence b's attention context: its length (cached + new rows), the per-KV-head stride of
    its cache, and its K and V base pointers."""
    mb = meta_ptr + b * META_W
    nctx = tl.load(mb + META_C) + tl.load(mb + META_N)
    return (nctx, tl.load(mb + META_MAXLEN) * HD, kv_ptr + _kv_off(mb, META_KOFF, VEC),
            kv_ptr + _kv_off(mb, META_VOFF, VEC))
