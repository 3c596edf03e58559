"""Numerics shared by the phases: fp32-accumulating dots, rounding helpers that round where the
reference rounds, and the order-preserving ranking keys.

A ranking key is ``(order-preserving float bits << 32) | (0x7FFFFFFF - index)``: descending key
order is descending value with ties to the lower index, so one integer max or sort ranks values
and breaks ties as the contract requires. 16-bit dtypes may rank 32-bit keys (16 bits of value,
16 of index) where the indices fit, and widen them back with :func:`_wide_key`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import KEY32_NONE, KEY_NONE


@triton.jit
def _key(v, idx):
    """64-bit ranking key of fp32 values ``v`` with indices ``idx`` (ties -> lower index)."""
    b = v.to(tl.int32, bitcast=True)
    b = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)
    return (b.to(tl.int64) << 32) | (0x7FFFFFFF - idx.to(tl.int64))


@triton.jit
def _key_val(k):
    b = (k >> 32).to(tl.int32)
    b = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _key_idx(k):
    return 0x7FFFFFFF - (k & 0x7FFFFFFF)


@triton.jit
def _recip_rn(d):
    """``1 / d`` correctly rounded (``div_rn``), for a scalar or a tensor d."""
    return tl.math.div_rn(1.0 + 0.0 * d, d)


@triton.jit
def _div_rn_by(x, d, r):
    """``x / d`` rounded to nearest like ``div_rn``, for a divisor shared by many x, given its
    correctly rounded reciprocal ``r = _recip_rn(d)``: q = x * r is within one ulp of x / d, and one
    correction with the exact residual x - q * d (an FMA) rounds it to the nearest (Markstein's
    theorem). Two FMAs and a multiply per element instead of ``div.rn.f32``'s sequence (which,
    measured, more than doubled the attention's time). The theorem needs an exact residual, so
    quotients below about 2^-100 in magnitude (a residual under the normal range) may be one unit
    off; in the attention those are scores or probabilities so small that no output moves by them
    (below fp32 rounding of the sums they enter; ``test_div_rn_by_matches_division``)."""
    q = x * r
    return tl.fma(tl.fma(-q, d, x), r, q)


@triton.jit
def _silu_rn(g):
    """``div_rn(g, 1 + exp(-g))`` (SiLU, the quotient rounded to nearest) for fp32 ``g`` holding
    16-bit float values, without ``div.rn.f32``: its slow-path branch fences every division, so
    an epilogue of hundreds of them per thread ran them one after another (18 us per depth in
    the batch-16 gate/up). Here: an approximate reciprocal of d, one Newton step, then the
    quotient with two residual corrections (FMAs, exact residuals); d is first scaled by 2^-64
    where it is above 2^64 (g < -44: keeps the reciprocal and the residuals normal; exact, as
    the quotient stays normal); d = inf (exp overflow) gives ``g * 0``, and g = +-0 or inf gives
    g (the corrections would lose the zero's sign or make NaN), as ``div_rn`` does.
    Equal to ``div_rn`` for every bf16 and fp16 g on the GPU (``test_silu_rn_matches_div_rn``,
    exhaustive over the 2 x 65536 inputs; the fp32 compute dtype keeps ``div_rn``)."""
    d = 1.0 + tl.exp(-g)
    s = tl.where(d > 18446744073709551616.0, 5.421010862427522e-20, 1.0)  # 2^64, 2^-64
    ds = d * s
    r = 1.0 / ds
    r = tl.fma(tl.fma(-ds, r, 1.0), r, r)
    q = g * r
    q = tl.fma(tl.fma(-q, ds, g), r, q)
    q = tl.fma(tl.fma(-q, ds, g), r, q)
    return tl.where(d == float("inf"), g * 0.0, tl.where((g == 0.0) | (g == float("inf")), g, q * s))


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b, accumulated in fp32 (IEEE-precision products for fp32 inputs)."""
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _key16(raw):
    """Order-preserving signed 16-bit image of 16-bit float bits ``raw`` (int32, sign-extended):
    the same order as ``_key``'s high half gives the value widened to fp32 (-0 below +0)."""
    return tl.where(raw >= 0, raw, raw ^ 0x7FFF)


@triton.jit
def _keys16(vals, idx, valid):
    """32-bit ranking keys of 16-bit float values ``vals`` at slab-local indices ``idx`` (< 65536;
    ties -> lower index), KEY32_NONE where not ``valid``."""
    return tl.where(valid, (_key16(vals.to(tl.int16, bitcast=True).to(tl.int32)) << 16) | (0xFFFF - idx), KEY32_NONE)


@triton.jit
def _wide_key(k, DT: tl.constexpr, base=0):
    """The 64-bit ``_key`` of 32-bit ``_keys16`` keys ``k``: (the value widened to fp32, base +
    the slab-local index); KEY_NONE where ``k`` is KEY32_NONE."""
    val = _key16(k >> 16).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
    return tl.where(k == KEY32_NONE, KEY_NONE, _key(val, base + 0xFFFF - (k & 0xFFFF)))


@triton.jit
def _rank_rounds(keys, top, rk, K, MERGE: tl.constexpr):
    """K rounds of the block maximum: the K best of the keys [n] (and, with MERGE, of the list
    ``top`` [KP] so far, whose entries are all distinct from ``keys``), best first, as a new
    [KP] list (entries from K on: the empty key of the keys' width, KEY32_NONE for 32-bit
    ``_keys16``, KEY_NONE for 64-bit ``_key``s)."""
    if top.dtype == tl.int32:
        NONE: tl.constexpr = KEY32_NONE
    else:
        NONE: tl.constexpr = KEY_NONE
    new = tl.full(top.shape, NONE, top.dtype)
    for j in range(K):
        best = tl.max(keys, axis=0)
        if MERGE:
            best = tl.maximum(best, tl.max(top, axis=0))
            top = tl.where(top == best, NONE, top)
        new = tl.where(rk == j, best, new)
        keys = tl.where(keys == best, NONE, keys)
    return new


@triton.jit
def _best_k(keys, rk, K, DT: tl.constexpr):
    """The K best of ``keys`` [n], 32-bit ``_keys16`` or 64-bit ``_key``s, as 64-bit ``_key``s
    [KP] (``rk`` = arange(KP)), best first, KEY_NONE from K on and where fewer than K keys are
    valid: ``_rank_rounds`` in the keys' own width, 32-bit picks widened once after the rounds."""
    top = _rank_rounds(keys, tl.zeros(rk.shape, keys.dtype), rk, K, False)  # (a fresh list: only its shape counts)
    if keys.dtype == tl.int32:
        top = _wide_key(top, DT)
    return top
