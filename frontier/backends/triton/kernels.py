"""Triton device code of the fused drafter: phase functions and the one kernel that runs them.

One draft call is a *schedule* of phases (see ``launch.py``): the context step (fc, norms,
QKV, RoPE + cache write, attention, o_proj, MLP, final norm, lm_head with streaming top-K,
merge, root selection), then per depth the same layer phases on the K frontier rows followed
by the K*K -> K prune, and at the end the top-(T-1) selection. Every phase is a ``@triton.jit``
function of ``(pid, nprog)`` that spreads its work over whatever grid it gets.

A call drafts B sequences at once (B = 1 is the single-sequence call): the context step's new
rows of all sequences are packed, the tree rows are B*K, and an int64 metadata block gives each
sequence's cache length, new rows, first packed row and cache offsets from one base pointer.
Weight phases stream each weight tile once for the rows of every sequence.

:func:`drafter_kernel` walks a schedule. With ``PERSISTENT=True`` (GPU) one launch walks the
whole schedule on a co-resident grid, separating phases with a bounded grid barrier; with
``PERSISTENT=False`` each launch runs one schedule entry (the interpreter path: programs run one
after another there, so a spinning barrier would hang). Both paths execute the same code.

Numerics: dot products accumulate in fp32 (IEEE-precision for fp32 inputs). Wherever the
reference rounds an intermediate to the compute dtype (a matmul output, an elementwise op in
bf16/fp16), the kernel rounds at the same point (``.to(DT).to(tl.float32)``; a no-op in fp32).
Rankings (top-K of logits, of cumulative scores, the final top-(T-1)) use 64-bit keys
``(order-preserving float bits << 32) | (0x7FFFFFFF - index)``: descending key order is
descending value with ties to the lower index, and one integer max or sort ranks both.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # grid dependency control (programmatic dependent launch), sm_90+; Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait
    HAS_GDC = True
except ImportError:  # pragma: no cover - older Triton: the launcher never sets PDL
    HAS_GDC = False

    @triton.jit
    def _gdc_wait():
        pass

    @triton.jit
    def _gdc_launch_dependents():
        pass

# Phase codes of a schedule entry (entry = phase * 256 + depth; depth CTX_DEPTH = context step).
PH_FC = 0
PH_PREP3 = 1
PH_PREP2 = 2
PH_QKV = 4
PH_ROPE = 5
PH_ATTN = 6  # attention pass 1 (per-part max / sum)
PH_ATTN2 = 16  # attention pass 2 (per-part P @ V)
PH_ATTN3 = 17  # attention sum over parts
PH_OPROJ = 7
PH_NORM_POST = 8
PH_GATEUP = 9
PH_DOWN = 10
PH_NORM_F = 11
PH_LMHEAD = 12
PH_MERGE = 13
PH_SELECT = 14
PH_FINAL = 15
PH_RED_QKV = 18  # split-K reductions (wide launches, tree depths)
PH_RED_O = 19
PH_RED_D = 20
PH_ATTN_F = 21  # attention in one phase, one item per (sequence, KV head) (batched launches)
CTX_DEPTH = 255

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
KEY32_NONE = tl.constexpr(-0x80000000)  # below every real 32-bit key (_lm_slab_stats)

# Cache policy of the weight streams (read once per forward, never reused before the next one):
# evict_first leaves L2 to what is reused - the kernel's own code, the context K/V, activations.
W_EVICT = tl.constexpr("evict_first")


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------
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
def _rms_row(x_ptr, w_ptr, H, eps, BLOCK_H: tl.constexpr, DT: tl.constexpr):
    """RMSNorm of one row as the reference computes it: fp32, cast, then the weight multiply."""
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    x = tl.load(x_ptr + rh, mask=hm, other=0.0, cache_modifier=".cg").to(tl.float32)
    return _rms_of(x, w_ptr, H, eps, BLOCK_H, DT)


@triton.jit
def _rms_of(x, w_ptr, H, eps, BLOCK_H: tl.constexpr, DT: tl.constexpr):
    """``_rms_row`` of a row already in registers (fp32 [BLOCK_H], zeros past H)."""
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    var = tl.math.div_rn(tl.sum(x * x, axis=0), H.to(tl.float32))
    rstd = _recip_rn(tl.sqrt_rn(var + eps))
    y = (x * rstd).to(DT).to(tl.float32)
    w = tl.load(w_ptr + rh, mask=hm, other=0.0).to(tl.float32)
    return (w * y).to(DT)


# ----------------------------------------------------------------------------------------------
# phases
# ----------------------------------------------------------------------------------------------
@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b, accumulated in fp32 (IEEE-precision products for fp32 inputs)."""
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _x_chunk(x_ptr, x_stride, rm, kk, M, k_hi):
    """The activation chunk [BK, rows] of rows ``rm`` (valid below M) at columns ``kk`` (valid
    below k_hi), the B operand of a weight-streaming dot; zeros elsewhere."""
    return tl.load(x_ptr + rm[None, :] * x_stride + kk[:, None], mask=(rm[None, :] < M) & (kk[:, None] < k_hi),
                   other=0.0, cache_modifier=".cg")


@triton.jit
def _stream_folded(w_ptr, Kd, row0, nrows, x_ptr, x_stride, m0, M, k_lo, k_hi,
                   BNS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                   ST: tl.constexpr, F: tl.constexpr):
    """acc [BNS, BM] = W[row0 + j, k_lo:k_hi] @ X[m0 + m, k_lo:k_hi]^T (rows j < nrows, m0 + m <
    M) with every k-chunk folded F ways: the weight chunk [BNS, BK] is read as F row blocks of
    BK/F columns stacked into [F*BNS, BK/F] (block f holds columns f*BK/F..), the activation
    chunk likewise side by side along the dot's N ([BK/F, F*BM], block g), and the wanted
    partial sums are the diagonal blocks f == g, added after the k-loop. The dot is F times
    taller, so the program's warps split weight rows instead of each reading the same few rows
    from shared memory. The row pointers are computed here from row indices (not gathered from
    a pointer tensor), so the loads keep their 16-byte alignment facts."""
    KF: tl.constexpr = BK // F
    rf = tl.arange(0, F * BNS)
    rc = tl.arange(0, F * BM)
    rk = tl.arange(0, KF)
    fw = (rf // BNS) * KF  # each stacked row's column offset in the chunk
    fx = (rc // BM) * KF
    wmask = (rf % BNS) < nrows
    wf = w_ptr + (row0 + rf % BNS) * Kd + fw
    mcol = m0 + rc % BM
    xcol = x_ptr + mcol * x_stride + fx
    acc = tl.zeros([F * BNS, F * BM], dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=ST):
        w = tl.load(wf[:, None] + k0 + rk[None, :], mask=wmask[:, None] & ((k0 + fw)[:, None] + rk[None, :] < k_hi),
                    other=0.0, eviction_policy=W_EVICT)
        x = tl.load(xcol[None, :] + k0 + rk[:, None], mask=(mcol < M)[None, :] & ((k0 + fx)[None, :] + rk[:, None] < k_hi),
                    other=0.0, cache_modifier=".cg")
        acc = _mma(w, x, acc, IEEE)
    acc = tl.where((rf // BNS)[:, None] == (rc // BM)[None, :], acc, 0.0)
    return tl.sum(tl.sum(tl.reshape(acc, [F, BNS, F, BM]), 2), 0)


@triton.jit
def _stream_tile(wrow, rmask, x_ptr, x_stride, rm, rm2, M, k_lo, k_hi,
                 BNS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                 BM2: tl.constexpr, ST: tl.constexpr):
    """acc[BNS, BM] = W[rows, k_lo:k_hi] @ X[rm, k_lo:k_hi]^T: the weight rows (pointers ``wrow``,
    valid where ``rmask``) streamed through a pipelined k-loop against one tile of activation rows
    ``rm`` (valid below M), fp32 accumulation (IEEE-precision for fp32 inputs). BM2 > 0: each
    weight chunk also meets a second, narrower tile ``rm2`` (acc2 [BNS, BM2]), so that BM + BM2
    rows (e.g. 128 + 32 for 160 rows) cost no padding to the next power of two; with BM2 = 0
    acc2 is acc (unused). ST: the k-loop's software-pipeline depth (stages)."""
    rk = tl.arange(0, BK)
    acc = tl.zeros([BNS, BM], dtype=tl.float32)
    if BM2 > 0:
        acc2 = tl.zeros([BNS, BM2], dtype=tl.float32)
    else:
        acc2 = acc
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=ST):
        kk = k0 + rk
        w = tl.load(wrow[:, None] + kk[None, :], mask=rmask[:, None] & (kk[None, :] < k_hi), other=0.0,
                    eviction_policy=W_EVICT)
        acc = _mma(w, _x_chunk(x_ptr, x_stride, rm, kk, M, k_hi), acc, IEEE)
        if BM2 > 0:
            acc2 = _mma(w, _x_chunk(x_ptr, x_stride, rm2, kk, M, k_hi), acc2, IEEE)
    return acc, acc2


@triton.jit
def _row_tiles(m0, BM: tl.constexpr, BM2: tl.constexpr):
    """The activation rows of the tile(s) starting at m0: rm [BM] and rm2 [BM2] after them (rm
    again when BM2 = 0)."""
    rm = m0 + tl.arange(0, BM)
    if BM2 > 0:
        rm2 = m0 + BM + tl.arange(0, BM2)
    else:
        rm2 = rm
    return rm, rm2


@triton.jit
def _slab_rows(slab, RP, s0, N, N2, Kd, w_ptr, w2_ptr, w3_ptr, QKV: tl.constexpr, BNS: tl.constexpr,
               VEC: tl.constexpr):
    """Sub-slab s0 of weight slab ``slab`` (RP rows each): its global rows rr [BNS], their mask,
    and each row's weight pointer. QKV: the row space is [W; W2; W3] (N + 2*N2 rows), so a row
    points into whichever matrix holds it - no repacking. The select loses Triton's alignment
    facts (its loads would be 2-byte scalars, not pipelined), so with VEC > 1 (the launcher
    proved every row 16-byte aligned) the rows are declared aligned again."""
    rp = s0 + tl.arange(0, BNS)
    rr = slab * RP + rp
    if QKV:
        rmask = (rp < RP) & (rr < N + 2 * N2)
        wrow = tl.where(rr < N, w_ptr + rr * Kd,
                        tl.where(rr < N + N2, w2_ptr + (rr - N) * Kd, w3_ptr + (rr - N - N2) * Kd))
        if VEC > 1:
            wrow = tl.multiple_of(wrow, 16)
    else:
        rmask = (rp < RP) & (rr < N)
        wrow = w_ptr + rr * Kd
    return rr, rmask, wrow


@triton.jit
def _slab_base(w_ptr, pid, RP, Kd, rows, PACK: tl.constexpr, BK: tl.constexpr):
    """Row pointers [rows] of program pid's slab (slab-local ``rows``) and the step of a k-chunk:
    the chunk at column k0 of row r is ``base[r] + k0 * step + [0, BK)``. Row-major: row r at
    (pid * RP + r) * Kd, step 1. PACK (``launch.pack_slabs``): each program's RP-row slab stored
    as [ceil(Kd / BK), RP, BK], so a chunk's [RP, BK] tile is one contiguous block and the slab
    is read in memory order: row r at pid * RP * ceil(Kd / BK) * BK + r * BK, step RP."""
    if PACK:
        kd_pad = tl.cdiv(Kd, BK) * BK
        return w_ptr + pid.to(tl.int64) * RP * kd_pad + rows * BK, RP
    else:
        return w_ptr + (pid * RP + rows) * Kd, 1


@triton.jit
def _linear_out(acc, rr, rmask, rm, M, y_ptr, y_stride, res_ptr, res_stride, b_ptr, MODE: tl.constexpr):
    """The epilogue of ``_ph_linear`` for one accumulator [rows rr, activation rows rm]."""
    DT = y_ptr.dtype.element_ty
    msk = rmask[:, None] & (rm[None, :] < M)
    if MODE == 1:
        r = tl.load(res_ptr + rm[None, :] * res_stride + rr[:, None], mask=msk, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        out = (acc.to(DT).to(tl.float32) + r).to(DT)
    elif MODE == 2:
        b = tl.load(b_ptr + rr, mask=rmask, other=0.0).to(tl.float32)
        out = (acc + b[:, None]).to(DT)
    elif MODE == 3:  # + the fp32 partial of each row's source row (clamped into [0, M))
        src = tl.load(b_ptr + rm, mask=rm < M, other=0, cache_modifier=".cg")
        src = tl.minimum(tl.maximum(src, 0), M - 1)
        part = tl.load(res_ptr + src[None, :] * res_stride + rr[:, None], mask=msk, other=0.0, cache_modifier=".cg")
        out = (acc + part).to(DT)
    else:
        out = acc.to(DT)
    tl.store(y_ptr + rm[None, :] * y_stride + rr[:, None], out, mask=msk)


@triton.jit
def _ph_linear(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, KR, y_ptr, y_stride, res_ptr, res_stride, b_ptr,
               w2_ptr, w3_ptr, N2, RP,
               MODE: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
               VEC: tl.constexpr, ST: tl.constexpr, FOLD: tl.constexpr = 1, STF: tl.constexpr = 0):
    """Y = X W^T with each program owning one slab of RP weight rows ([pid*RP, pid*RP + RP)),
    streamed through a pipelined k-loop for all the activation rows. The slab is walked in
    sub-slabs of BNS rows; each sub-slab is streamed once per tile of BM activation rows. At
    batch 1 one sub-slab and one tile cover everything, so every weight byte is read once per
    call of the phase for all rows; with many rows (batching) a sub-slab (BNS x Kd, a few hundred
    KB per program) is re-read for the later tiles while it is still in L2.
    Weight rows are Kd elements apart; the dot runs over their first KR columns (KR = Kd but for
    the QKV of the hidden-half split below).
    MODE 0: store; 1: + residual (rounded as ``res + round(XW^T)``); 2: + bias;
    4: QKV (the row space is [Wq; Wk; Wv], N + 2*N2 rows; Y's columns likewise);
    7: QKV + the fp32 row ``res[src[m]]`` added before rounding, ``src = b_ptr`` (int32 per
    activation row): the other half of a K range that was streamed earlier (``_ph_qkv_hidden``).
    FOLD > 1 (MODE < 4): the k-chunks folded that many ways (``_stream_folded``), pipelined
    STF stages (0: ST)."""
    for s0 in range(0, RP, BNS):
        rr, rmask, wrow = _slab_rows(pid, RP, s0, N, N2, Kd, w_ptr, w2_ptr, w3_ptr, MODE >= 4, BNS, VEC)
        for m0 in range(0, M, BM):
            rm = m0 + tl.arange(0, BM)
            if FOLD > 1:  # (not QKV: one weight matrix)
                row0 = pid * RP + s0
                acc = _stream_folded(w_ptr, Kd, row0, tl.minimum(RP - s0, N - row0), x_ptr, x_stride, m0, M, 0, KR,
                                     BNS, BM, BK, IEEE, STF if STF > 0 else ST, FOLD)
            else:
                acc, _ = _stream_tile(wrow, rmask, x_ptr, x_stride, rm, rm, M, 0, KR, BNS, BM, BK, IEEE, 0, ST)
            _linear_out(acc, rr, rmask, rm, M, y_ptr, y_stride, res_ptr, res_stride, b_ptr, MODE % 4)


@triton.jit
def _ph_linear_ctx(pid, nprog, small, x_ptr, x_stride, M, w_ptr, N, Kd, y_ptr, y_stride, b_ptr, w2_ptr, w3_ptr, N2,
                   RP, MODE: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr, ST: tl.constexpr,
                   BMP: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr, STF: tl.constexpr,
                   BMC: tl.constexpr, BNSC: tl.constexpr, BKC: tl.constexpr, FOLDC: tl.constexpr,
                   STFC: tl.constexpr):
    """``_ph_linear`` (no residual) over the context step's new rows with the launch's tile BMP,
    or, where the launcher made a smaller one (BMC > 0, wide launches) and the rows fit in it
    (``small``, a run-time condition), with that tile and its own sub-slab, k-chunk and fold:
    the wide tile's padding and its short k-chunks cost batch 16's context fc 3x its stream.
    (The wide-tile call appears twice: with BMC = 0 the small tile's branch must not be built at
    all - a 0-row tile does not compile - so the run-time test sits inside a compile-time one.)"""
    if BMC > 0:
        if small:
            _ph_linear(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, Kd, y_ptr, y_stride, y_ptr, y_stride, b_ptr,
                       w2_ptr, w3_ptr, N2, RP, MODE, BMC, BNSC, BKC, IEEE, VEC, ST, FOLD=FOLDC, STF=STFC)
        else:
            _ph_linear(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, Kd, y_ptr, y_stride, y_ptr, y_stride, b_ptr,
                       w2_ptr, w3_ptr, N2, RP, MODE, BMP, BNS, BK, IEEE, VEC, ST, FOLD=FOLD, STF=STF)
    else:
        _ph_linear(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, Kd, y_ptr, y_stride, y_ptr, y_stride, b_ptr,
                   w2_ptr, w3_ptr, N2, RP, MODE, BMP, BNS, BK, IEEE, VEC, ST, FOLD=FOLD, STF=STF)


@triton.jit
def _ph_linear_split(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, part_ptr, MR, w2_ptr, w3_ptr, N2, RP, SPL,
                     QKV: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                     VEC: tl.constexpr, BM2: tl.constexpr, ST: tl.constexpr):
    """Split-K Y = X W^T for many activation rows: program p streams k-range (p % SPL) of weight
    slab (p // SPL) (RP rows), so it reads only 1/SPL of every activation row while its slab is
    SPL times taller than an unsplit one; x re-reads fall by SPL for the same accumulator size.
    Each program writes its fp32 partial ``part[p % SPL, rows, slab]``; ``_ph_reduce`` sums
    the SPL partials in a fixed order and applies the epilogue."""
    if QKV:
        NT = N + 2 * N2
    else:
        NT = N
    nslab = nprog // SPL
    r = pid // SPL
    sp = pid - r * SPL
    if r < nslab:
        kch = tl.cdiv(tl.cdiv(Kd, SPL), BK) * BK
        k_lo = sp * kch
        k_hi = tl.minimum(Kd, k_lo + kch)
        for s0 in range(0, RP, BNS):
            rr, rmask, wrow = _slab_rows(r, RP, s0, N, N2, Kd, w_ptr, w2_ptr, w3_ptr, QKV, BNS, VEC)
            for m0 in range(0, M, BM + BM2):
                rm, rm2 = _row_tiles(m0, BM, BM2)
                acc, acc2 = _stream_tile(wrow, rmask, x_ptr, x_stride, rm, rm2, M, k_lo, k_hi, BNS, BM, BK, IEEE, BM2,
                                         ST)
                tl.store(part_ptr + (sp * MR + rm[None, :]) * NT + rr[:, None], acc,
                         mask=rmask[:, None] & (rm[None, :] < M))
                if BM2 > 0:
                    tl.store(part_ptr + (sp * MR + rm2[None, :]) * NT + rr[:, None], acc2,
                             mask=rmask[:, None] & (rm2[None, :] < M))


@triton.jit
def _part_sum(part_ptr, SPL, MR, NT, m, c, cm):
    """Row m's columns c (valid where cm) of the SPL split-K fp32 partials ``part[sp, row, :]``
    (rows MR apart, NT columns each), summed in partial order - the one order every reader of
    the partials uses, so that their results agree bit for bit."""
    acc = tl.zeros(c.shape, tl.float32)  # (from +0, as every reader summed: -0 partials stay +0)
    for sp in range(SPL):
        acc += tl.load(part_ptr + (sp * MR + m) * NT + c, mask=cm, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _ph_reduce(pid, nprog, part_ptr, SPL, M, NT, MR, y_ptr, y_stride, res_ptr, res_stride,
               MODE: tl.constexpr, BLOCK: tl.constexpr):
    """Y = epilogue(sum over the SPL split-K partials, in order). MODE 0: store; 1: + residual
    (rounded as ``res + round(sum)``)."""
    DT = y_ptr.dtype.element_ty
    nblk = tl.cdiv(NT, BLOCK)
    rc = tl.arange(0, BLOCK)
    for t in range(pid, M * nblk, nprog):
        m = t // nblk
        c = (t - m * nblk) * BLOCK + rc
        cm = c < NT
        acc = _part_sum(part_ptr, SPL, MR, NT, m, c, cm)
        if MODE == 1:
            res = tl.load(res_ptr + m * res_stride + c, mask=cm, other=0.0, cache_modifier=".cg").to(tl.float32)
            out = (acc.to(DT).to(tl.float32) + res).to(DT)
        else:
            out = acc.to(DT)
        tl.store(y_ptr + m * y_stride + c, out, mask=cm)


@triton.jit
def _gateup_out(acc_g, acc_u, rr, rmask, rm, M, y_ptr, N):
    """act = silu(g) * u for one pair of accumulators, each op rounded like the reference."""
    DT = y_ptr.dtype.element_ty
    g = acc_g.to(DT).to(tl.float32)
    u = acc_u.to(DT).to(tl.float32)
    if DT.primitive_bitwidth == 16:
        sg = _silu_rn(g).to(DT).to(tl.float32)
    else:
        sg = tl.math.div_rn(g, 1.0 + tl.exp(-g)).to(DT).to(tl.float32)
    tl.store(y_ptr + rm[None, :] * N + rr[:, None], (sg * u).to(DT), mask=rmask[:, None] & (rm[None, :] < M))


@triton.jit
def _ph_gateup(pid, nprog, x_ptr, M, wg_ptr, wu_ptr, N, Kd, y_ptr, RP,
               BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, BM2: tl.constexpr,
               ST: tl.constexpr, PACK: tl.constexpr = False):
    """act = silu(x Wg^T) * (x Wu^T), each op rounded to the compute dtype like the reference.
    One slab of RP rows of both matrices per program (sub-slabs of BNS rows, tiles of BM (+ BM2)
    activation rows, as in ``_ph_linear``), both matrices streamed in the same k-loop. PACK:
    both matrices are packed per slab (``_slab_base``)."""
    rk = tl.arange(0, BK)
    for s0 in range(0, RP, BNS):
        rp = s0 + tl.arange(0, BNS)
        rr = pid * RP + rp
        rmask = (rp < RP) & (rr < N)
        wgrow, kstep = _slab_base(wg_ptr, pid, RP, Kd, rp, PACK, BK)
        wurow, _ = _slab_base(wu_ptr, pid, RP, Kd, rp, PACK, BK)
        for m0 in range(0, M, BM + BM2):
            rm, rm2 = _row_tiles(m0, BM, BM2)
            acc_g = tl.zeros([BNS, BM], dtype=tl.float32)
            acc_u = tl.zeros([BNS, BM], dtype=tl.float32)
            if BM2 > 0:
                acc_g2 = tl.zeros([BNS, BM2], dtype=tl.float32)
                acc_u2 = tl.zeros([BNS, BM2], dtype=tl.float32)
            else:
                acc_g2 = acc_g
                acc_u2 = acc_u
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                kk = k0 + rk
                wmask = rmask[:, None] & (kk[None, :] < Kd)
                wg = tl.load(wgrow[:, None] + k0 * kstep + rk[None, :], mask=wmask, other=0.0, eviction_policy=W_EVICT)
                wu = tl.load(wurow[:, None] + k0 * kstep + rk[None, :], mask=wmask, other=0.0, eviction_policy=W_EVICT)
                x = _x_chunk(x_ptr, Kd, rm, kk, M, Kd)
                acc_g = _mma(wg, x, acc_g, IEEE)
                acc_u = _mma(wu, x, acc_u, IEEE)
                if BM2 > 0:
                    x2 = _x_chunk(x_ptr, Kd, rm2, kk, M, Kd)
                    acc_g2 = _mma(wg, x2, acc_g2, IEEE)
                    acc_u2 = _mma(wu, x2, acc_u2, IEEE)
            _gateup_out(acc_g, acc_u, rr, rmask, rm, M, y_ptr, N)
            if BM2 > 0:
                _gateup_out(acc_g2, acc_u2, rr, rmask, rm2, M, y_ptr, N)


@triton.jit
def _ph_prep(pid, nprog, M, tok_ptr, emb_ptr, hsrc_ptr, hsrc_stride, src_ptr, hcur_ptr, xin_ptr,
             ln_in_ptr, ln_hid_ptr, H, Vt, eps,
             GATHER: tl.constexpr, EAGLE3: tl.constexpr, BLOCK_H: tl.constexpr, XH: tl.constexpr = True):
    """Per row: e = embed[t]; h = the row's hidden input (gathered from the parent's output row
    when GATHER). eagle3: hcur = h, xin = [norm(e) | hidden_norm(h)]; eagle2: xin = [e | h].
    XH = False (eagle3 with the hidden half of QKV streamed ahead, see ``_ph_qkv_hidden``): only
    xin's first half is written."""
    DT = xin_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    for m in range(pid, M, nprog):
        tok = tl.load(tok_ptr + m, cache_modifier=".cg")
        tok = tl.minimum(tl.maximum(tok, 0), Vt - 1)
        if GATHER:
            src = tl.load(src_ptr + m, cache_modifier=".cg")
            src = tl.minimum(tl.maximum(src, 0), M - 1)
            h_row = hsrc_ptr + src * hsrc_stride
        else:
            h_row = hsrc_ptr + m * hsrc_stride
        if EAGLE3:
            if GATHER:
                h = tl.load(h_row + rh, mask=hm, other=0.0, cache_modifier=".cg")
                tl.store(hcur_ptr + m * H + rh, h, mask=hm)
                tl.debug_barrier()
            xe = _rms_row(emb_ptr + tok * H, ln_in_ptr, H, eps, BLOCK_H, DT)
            tl.store(xin_ptr + m * 2 * H + rh, xe, mask=hm)
            if XH:
                xh = _rms_row(h_row, ln_hid_ptr, H, eps, BLOCK_H, DT)
                tl.store(xin_ptr + m * 2 * H + H + rh, xh, mask=hm)
        else:
            e = tl.load(emb_ptr + tok * H + rh, mask=hm, other=0.0)
            h = tl.load(h_row + rh, mask=hm, other=0.0, cache_modifier=".cg")
            tl.store(xin_ptr + m * 2 * H + rh, e.to(DT), mask=hm)
            tl.store(xin_ptr + m * 2 * H + H + rh, h.to(DT), mask=hm)


@triton.jit
def _ph_norm(pid, nprog, M, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H: tl.constexpr):
    DT = y_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_H)
    for m in range(pid, M, nprog):
        y = _rms_row(x_ptr + m * H, w_ptr, H, eps, BLOCK_H, DT)
        tl.store(y_ptr + m * H + rh, y, mask=rh < H)


@triton.jit
def _ph_norm_sum(pid, nprog, M, part_ptr, SPL, MR, res_ptr, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H: tl.constexpr):
    """A split-K phase's reduction and the RMSNorm after it, per row: x = res + round(sum of the
    SPL fp32 partials, in order) - what ``_ph_reduce`` (MODE 1) writes, the same bits - stored
    (the next residual), then y = RMSNorm(x) as ``_ph_norm`` computes it."""
    DT = y_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    for m in range(pid, M, nprog):
        acc = _part_sum(part_ptr, SPL, MR, H, m, rh, hm)
        res = tl.load(res_ptr + m * H + rh, mask=hm, other=0.0, cache_modifier=".cg").to(tl.float32)
        x = (acc.to(DT).to(tl.float32) + res).to(DT)
        tl.store(x_ptr + m * H + rh, x, mask=hm)
        tl.store(y_ptr + m * H + rh, _rms_of(x.to(tl.float32), w_ptr, H, eps, BLOCK_H, DT), mask=hm)


@triton.jit
def _ph_norm_after(pid, nprog, M, is_ctx, part_ptr, SPL, MR, res_ptr, x_ptr, w_ptr, y_ptr, H, eps,
                   BLOCK_H: tl.constexpr, SUMS: tl.constexpr):
    """The norm after a linear phase: y = RMSNorm(x); with SUMS (wide launches, whose tree depths
    split that phase's K) at the tree depths x is first res + the split-K partials
    (``_ph_norm_sum``)."""
    if SUMS:
        if is_ctx:
            _ph_norm(pid, nprog, M, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H)
        else:
            _ph_norm_sum(pid, nprog, M, part_ptr, SPL, MR, res_ptr, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H)
    else:
        _ph_norm(pid, nprog, M, x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H)


@triton.jit
def _ph_qkv_hidden(pid, nprog, R, x_ptr, H, wq_ptr, wk_ptr, wv_ptr, NQ, NKVD, qh_ptr, RP,
                   BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr,
                   ST: tl.constexpr):
    """EAGLE-3's next-depth QKV, hidden half, ahead of time: its input is
    ``[norm(embed(token)) | hidden_norm(parent's hidden)]``, and the second half depends only on
    the parent row, which is one of this depth's R rows. So ``qh[p] = x[p] @ Wqkv[:, H:2H]^T``
    (fp32, x = hidden_norm of this depth's output rows) is streamed during MERGE, while the
    ranking keeps a few programs busy and the rest would wait at the barrier; the next QKV
    streams only the embedding half and adds ``qh[parent]`` (``_ph_linear`` MODE 7). Slabs of
    RP rows go to the programs after the R that merge rows (all programs, after their rows,
    when the grid is too small for that)."""
    NT = NQ + 2 * NKVD
    S = tl.cdiv(NT, RP)
    off = tl.where(R + S <= nprog, R, 0)
    if pid >= off:
        for v in range(pid - off, S, nprog - off):  # slab v: _ph_linear's QKV mode, stored in fp32
            _ph_linear(v, nprog, x_ptr, H, R, wq_ptr + H, NQ, 2 * H, H, qh_ptr, NT, qh_ptr, NT, qh_ptr,
                       wk_ptr + H, wv_ptr + H, NKVD, RP, 4, BM, BNS, BK, IEEE, VEC, ST)


@triton.jit
def _rotary_heads(row_ptr, pos, cos_ptr, sin_ptr, NR, HD, DT: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """The NR head rows [NR, HD] at ``row_ptr`` (one token's q and k heads, contiguous) rotated
    to position ``pos``, rounded like the reference: ``round(round(x*cos) + round(rotate_half(x)*sin))``."""
    half = HD // 2
    rh = tl.arange(0, BLOCK_R)[:, None]
    rd = tl.arange(0, BLOCK_D)[None, :]
    m = (rh < NR) & (rd < HD)
    rot = tl.where(rd < half, rd + half, rd - half)
    sign = tl.where(rd < half, -1.0, 1.0)
    c = tl.load(cos_ptr + pos * HD + rd, mask=rd < HD, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * HD + rd, mask=rd < HD, other=0.0).to(tl.float32)
    x = tl.load(row_ptr + rh * HD + rd, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    xr = tl.load(row_ptr + rh * HD + rot, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32) * sign
    return ((x * c).to(DT).to(tl.float32) + (xr * s).to(DT).to(tl.float32)).to(DT)


@triton.jit
def _ph_rope_ctx(pid, nprog, N, meta_ptr, row_seq_ptr, qkv_ptr, qr_ptr, hcur_ptr, hres_ptr, kv_ptr,
                 cos_ptr, sin_ptr, NH, NKV, HD, H, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_H: tl.constexpr, VEC: tl.constexpr = 1):
    """Context step, the N packed new rows of all sequences, one row (all heads) per item. Row m
    belongs to sequence b = row_seq[m] at context position c_b + j: its rotated k heads and its
    v heads go to cache b's row c_b + j (the cache's own base offset and length from the
    metadata); the q of each sequence's last new row goes to qr[b], and that row's hidden state
    (the attention residual) to hres[b]."""
    DT = qr_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_R)[:, None]
    rd = tl.arange(0, BLOCK_D)[None, :]
    width = (NH + 2 * NKV) * HD
    for m in range(pid, N, nprog):
        b = tl.load(row_seq_ptr + m)
        mb = meta_ptr + b * META_W
        c_b = tl.load(mb + META_C)
        j = m - tl.load(mb + META_ROW)
        row = qkv_ptr + m * width
        y = _rotary_heads(row, c_b + j, cos_ptr, sin_ptr, NH + NKV, HD, DT, BLOCK_R, BLOCK_D)  # [q heads; k heads]
        kvrow = (c_b + j) * HD + (rh - NH) * tl.load(mb + META_MAXLEN) * HD + rd
        kmask = (rh >= NH) & (rh < NH + NKV) & (rd < HD)
        tl.store(kv_ptr + _kv_off(mb, META_KOFF, VEC) + kvrow, y, mask=kmask)
        v = tl.load(row + (rh + NKV) * HD + rd, mask=kmask, other=0.0, cache_modifier=".cg")
        tl.store(kv_ptr + _kv_off(mb, META_VOFF, VEC) + kvrow, v, mask=kmask)
        if j == tl.load(mb + META_N) - 1:
            tl.store(qr_ptr + b * NH * HD + rh * HD + rd, y, mask=(rh < NH) & (rd < HD))
            rhh = tl.arange(0, BLOCK_H)
            hrow = tl.load(hcur_ptr + m * H + rhh, mask=rhh < H, other=0.0, cache_modifier=".cg")
            tl.store(hres_ptr + b * H + rhh, hrow, mask=rhh < H)


@triton.jit
def _ph_rope_tree(pid, nprog, M, K, i, meta_ptr, qkv_ptr, qr_ptr, tk_ptr, tv_ptr, t_head_stride, SK,
                  cos_ptr, sin_ptr, NH, NKV, HD, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                  SUMS: tl.constexpr = False, part_ptr=0, SPL=1, MR=1):
    """Depth i, the M = B*K frontier rows, one row (all heads) per item: row r = b*K + j sits at
    position L_b + i; q goes to qr[r], k (rotated) and v to tree slot b*SK + i*K + j of the tree
    scratch. SUMS: the row is first the sum of the split-K QKV's SPL fp32 partials, in order,
    rounded and stored as ``_ph_reduce`` (MODE 0) writes it - the same bits."""
    DT = qr_ptr.dtype.element_ty
    rh = tl.arange(0, BLOCK_R)[:, None]
    rd = tl.arange(0, BLOCK_D)[None, :]
    width = (NH + 2 * NKV) * HD
    for r in range(pid, M, nprog):
        if SUMS:
            rc = tl.arange(0, 1024)
            for c0 in range(0, width, 1024):
                c = c0 + rc
                tl.store(qkv_ptr + r * width + c, _part_sum(part_ptr, SPL, MR, width, r, c, c < width).to(DT),
                         mask=c < width)
            tl.debug_barrier()  # (the rotation reads columns other threads stored)
        b = r // K
        mb = meta_ptr + b * META_W
        pos = tl.load(mb + META_C) + tl.load(mb + META_N) + i
        row = qkv_ptr + r * width
        y = _rotary_heads(row, pos, cos_ptr, sin_ptr, NH + NKV, HD, DT, BLOCK_R, BLOCK_D)
        tl.store(qr_ptr + r * NH * HD + rh * HD + rd, y, mask=(rh < NH) & (rd < HD))
        slot = b * SK + i * K + (r - b * K)
        kmask = (rh >= NH) & (rh < NH + NKV) & (rd < HD)
        toff = (rh - NH) * t_head_stride + slot * HD + rd
        tl.store(tk_ptr + toff, y, mask=kmask)
        v = tl.load(row + (rh + NKV) * HD + rd, mask=kmask, other=0.0, cache_modifier=".cg")
        tl.store(tv_ptr + toff, v, mask=kmask)


@triton.jit
def _ctx_scores(q, ck_ptr, g, c_head_stride, j0, nctx, sqrt_d, HD, DT: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                TREE: tl.constexpr = False, slot0=0, anc_b=0, r_of=0, qmask=0, anc_stride=0, R=1):
    """Scores [BLOCK_Q, BLOCK_N] of every query against context keys j0..j0+BLOCK_N-1, rounded
    like the reference: ``round(round(q @ k^T) / sqrt(d))``. TREE: the keys are instead the
    sequence's tree keys j (slot slot0 + j of the tree scratch: depth j // R, row j % R), and a
    score is kept only where key j is the query row's ancestor (or itself) at that depth, as the
    ancestor table says - the tree mask, for all depths in one block."""
    rj = j0 + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    k = tl.load(ck_ptr + g * c_head_stride + (slot0 + rj)[None, :] * HD + rd[:, None],
                mask=(rd[:, None] < HD) & (rj[None, :] < nctx), other=0.0, cache_modifier=".cg")
    if IEEE:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    s = _div_rn_by(s.to(DT).to(tl.float32), sqrt_d, _recip_rn(sqrt_d)).to(DT).to(tl.float32)
    keep = (rj < nctx)[None, :]
    if TREE:
        anc = tl.load(anc_b + r_of[:, None] * anc_stride + (rj // R)[None, :], mask=qmask[:, None] & keep, other=-1,
                      cache_modifier=".cg")
        keep = keep & (anc == (slot0 + rj)[None, :])
    return tl.where(keep, s, float("-inf")), rj


@triton.jit
def _tree_scores(q, tk_ptr, anc_ptr, g, t_head_stride, r_of, qmask, anc_stride, a, sqrt_d, HD,
                 DT: tl.constexpr, BLOCK_D: tl.constexpr):
    """Score [BLOCK_Q] of each query against its row's a-th ancestor slot (gathered keys)."""
    rd = tl.arange(0, BLOCK_D)
    slot = tl.load(anc_ptr + r_of * anc_stride + a, mask=qmask, other=0, cache_modifier=".cg")
    kt = tl.load(tk_ptr + g * t_head_stride + slot[:, None] * HD + rd[None, :],
                 mask=qmask[:, None] & (rd[None, :] < HD), other=0.0, cache_modifier=".cg")
    sa = tl.sum(q.to(tl.float32) * kt.to(tl.float32), axis=1)
    sa = _div_rn_by(sa.to(DT).to(tl.float32), sqrt_d, _recip_rn(sqrt_d)).to(DT).to(tl.float32)
    return sa, slot


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


@triton.jit
def _ctx_stats(q, m_i, l_i, ck_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
               TREE: tl.constexpr = False, slot0=0, anc_b=0, r_of=0, qmask=0, anc_stride=0, R=1):
    """Running max / sum of exp of the scores against context keys [j_lo, j_hi) (TREE: the
    sequence's tree keys, masked to each row's ancestors; see ``_ctx_scores``)."""
    for j0 in tl.range(j_lo, j_hi, BLOCK_N, num_stages=1 if TREE else None):  # (a block or two of tree keys)
        s, rj = _ctx_scores(q, ck_ptr, g, c_head_stride, j0, j_hi, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE,
                            TREE, slot0, anc_b, r_of, qmask, anc_stride, R)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp(m_i - safe) + tl.sum(tl.exp(s - safe[:, None]), axis=1)
        m_i = m_new
    return m_i, l_i


@triton.jit
def _tree_stats(q, m_i, l_i, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc, sqrt_d, HD,
                DT: tl.constexpr, BLOCK_D: tl.constexpr):
    """Running max / sum of exp over each row's n_anc ancestor slots."""
    for a in range(n_anc):
        sa, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, a, sqrt_d, HD, DT, BLOCK_D)
        m_new = tl.maximum(m_i, sa)
        l_i = l_i * tl.exp(m_i - m_new) + tl.exp(sa - m_new)
        m_i = m_new
    return m_i, l_i


@triton.jit
def _ctx_pv(acc, q, m_i, l_i, ck_ptr, cv_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
            TREE: tl.constexpr = False, slot0=0, anc_b=0, r_of=0, qmask=0, anc_stride=0, R=1):
    """acc += P V over context keys [j_lo, j_hi), P = round_dtype(exp(s - m) / l) with the
    row's final max m and sum l (the reference casts softmax's output before ``@ V``). TREE: over
    the sequence's tree keys instead, masked to each row's ancestors (``_ctx_scores``)."""
    rd = tl.arange(0, BLOCK_D)
    inv_l = _recip_rn(l_i)
    for j0 in tl.range(j_lo, j_hi, BLOCK_N, num_stages=1 if TREE else None):  # (a block or two of tree keys)
        s, rj = _ctx_scores(q, ck_ptr, g, c_head_stride, j0, j_hi, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE,
                            TREE, slot0, anc_b, r_of, qmask, anc_stride, R)
        p = _div_rn_by(tl.exp(s - m_i[:, None]), l_i[:, None], inv_l[:, None]).to(DT)
        v = tl.load(cv_ptr + g * c_head_stride + (slot0 + rj)[:, None] * HD + rd[None, :],
                    mask=(rj < j_hi)[:, None] & (rd < HD)[None, :], other=0.0, cache_modifier=".cg")
        acc = _mma(p, v, acc, IEEE)
    return acc


@triton.jit
def _tree_pv(acc, q, m_i, l_i, tk_ptr, tv_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc, sqrt_d,
             HD, DT: tl.constexpr, BLOCK_D: tl.constexpr):
    """acc += P V over each row's ancestor slots (gathered keys and values)."""
    rd = tl.arange(0, BLOCK_D)
    inv_l = _recip_rn(l_i)
    for a in range(n_anc):
        sa, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, a, sqrt_d, HD, DT, BLOCK_D)
        pa = _div_rn_by(tl.exp(sa - m_i), l_i, inv_l).to(DT).to(tl.float32)
        vt = tl.load(tv_ptr + g * t_head_stride + slot[:, None] * HD + rd[None, :],
                     mask=qmask[:, None] & (rd < HD)[None, :], other=0.0, cache_modifier=".cg").to(tl.float32)
        acc += pa[:, None] * vt
    return acc


@triton.jit
def _attn_item(b, g, R, meta_ptr, qr_ptr, kv_ptr, anc_ptr, anc_stride, NH, NKV, HD,
               BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, VEC: tl.constexpr):
    """One attention item's inputs: sequence b's context (``_seq_cache``), its rows' ancestor
    slots, and the BLOCK_Q queries of KV head g (query lane = row * G + head within the group, G
    = NH / NKV; lanes past R rows are masked) with their element offsets in qr (and ao)."""
    G = NH // NKV
    rq = tl.arange(0, BLOCK_Q)
    r_of = rq // G
    hl = rq - r_of * G
    qmask = r_of < R
    rd = tl.arange(0, BLOCK_D)
    nctx, c_head_stride, ck_ptr, cv_ptr = _seq_cache(meta_ptr, b, kv_ptr, HD, VEC)
    anc_b = anc_ptr + b * R * anc_stride
    qoff = (b * R + r_of) * NH * HD + (g * G + hl) * HD
    q = tl.load(qr_ptr + qoff[:, None] + rd[None, :], mask=qmask[:, None] & (rd < HD)[None, :], other=0.0,
                cache_modifier=".cg")
    return nctx, c_head_stride, ck_ptr, cv_ptr, anc_b, qoff, q, r_of, qmask


@triton.jit
def _ph_attn_part(pid, nprog, B, R, meta_ptr, qr_ptr, kv_ptr,
                  tk_ptr, tv_ptr, t_head_stride, anc_ptr, anc_stride, n_anc, NH, NKV, HD, sqrt_d,
                  pm_ptr, pl_ptr, pacc_ptr, NCH,
                  PASS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_CH: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr = 1):
    """Single-query attention of R rows per sequence (B sequences), split over the grid
    (flash-decoding with the reference's rounding). Work items: (sequence b, KV head g, part c)
    with NCH + n_anc parts: parts 0..NCH-1 = contiguous chunks of sequence b's context keys (its
    cache rows [0, c_b + n_b): the context step wrote the new rows before attention), part
    NCH + a = each row's a-th ancestor slot in the tree scratch (one gathered key per row: the
    tree mask is implicit, and a deep tree adds items instead of lengthening one). An item holds
    every (row, head) query of its sequence's KV group, so each K/V byte is read once for all of
    that sequence's rows.
    PASS 1: per-part max and sum of exp. PASS 2: global max/sum from all parts, probabilities
    rounded to the compute dtype (as the reference casts softmax's output) times V, per part."""
    DT = qr_ptr.dtype.element_ty
    rq = tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, BLOCK_D)
    dm = rd < HD
    parts = NCH + n_anc
    for t in range(pid, B * NKV * parts, nprog):
        bg = t // parts
        c = t - bg * parts
        b = bg // NKV
        g = bg - b * NKV
        nctx, c_head_stride, ck_ptr, cv_ptr, anc_b, qoff, q, r_of, qmask = _attn_item(
            b, g, R, meta_ptr, qr_ptr, kv_ptr, anc_ptr, anc_stride, NH, NKV, HD, BLOCK_Q, BLOCK_D, VEC)
        chunk = tl.cdiv(nctx, NCH)
        base = (bg * parts + c) * BLOCK_Q
        j_lo = c * chunk
        j_hi = tl.minimum(nctx, j_lo + chunk)
        if PASS == 1:
            if c < NCH:
                m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
                l_i = tl.zeros([BLOCK_Q], tl.float32)
                m_i, l_i = _ctx_stats(q, m_i, l_i, ck_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT, BLOCK_N,
                                      BLOCK_D, IEEE)
            else:  # one key per row: max = its score, sum of exp = 1
                m_i, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, c - NCH, sqrt_d,
                                         HD, DT, BLOCK_D)
                l_i = tl.full([BLOCK_Q], 1.0, tl.float32)
            tl.store(pm_ptr + base + rq, m_i)
            tl.store(pl_ptr + base + rq, l_i)
        else:
            rc = tl.arange(0, BLOCK_CH)
            pidx = (bg * parts + rc[:, None]) * BLOCK_Q + rq[None, :]
            cm = (rc < parts)[:, None]
            pms = tl.load(pm_ptr + pidx, mask=cm, other=float("-inf"), cache_modifier=".cg")
            pls = tl.load(pl_ptr + pidx, mask=cm, other=0.0, cache_modifier=".cg")
            m_i = tl.max(pms, axis=0)
            l_i = tl.sum(tl.where(pms == float("-inf"), 0.0, pls * tl.exp(pms - m_i[None, :])), axis=0)
            if c < NCH:
                acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
                acc = _ctx_pv(acc, q, m_i, l_i, ck_ptr, cv_ptr, g, c_head_stride, j_lo, j_hi, sqrt_d, HD, DT, BLOCK_N,
                              BLOCK_D, IEEE)
            else:
                sa, slot = _tree_scores(q, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, c - NCH, sqrt_d,
                                        HD, DT, BLOCK_D)
                pa = _div_rn_by(tl.exp(sa - m_i), l_i, _recip_rn(l_i)).to(DT).to(tl.float32)
                vt = tl.load(tv_ptr + g * t_head_stride + slot[:, None] * HD + rd[None, :],
                             mask=qmask[:, None] & dm[None, :], other=0.0, cache_modifier=".cg").to(tl.float32)
                acc = pa[:, None] * vt
            tl.store(pacc_ptr + (base + rq)[:, None] * BLOCK_D + rd[None, :], acc)


@triton.jit
def _ph_attn_fused(pid, nprog, B, R, meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr, t_head_stride, anc_ptr, anc_stride,
                   SK, n_anc, NH, NKV, HD, sqrt_d, ao_ptr,
                   BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                   VEC: tl.constexpr = 1, TREE_BLOCKS: tl.constexpr = True):
    """Attention in one phase (big batches, where B*NKV items already fill the grid): item
    (sequence b, KV head g) walks its whole context twice - max and sum of exp, then the
    probabilities rounded to the compute dtype times V - and after it, the same way, its rows'
    ancestors; it writes the attention output rows itself (no partials, no extra barriers).
    TREE_BLOCKS: the ancestors as the sequence's tree keys of depths 0..n_anc-1 (slots b*SK..,
    the R rows of each depth) in dense blocks masked to each row's ancestors (two blocks' dots
    per pass at the 8B preset); otherwise one gathered key per row and depth (n_anc dependent
    steps per pass). The launcher picks per launch mode (``Tuning.tree_blocks``)."""
    DT = qr_ptr.dtype.element_ty
    rd = tl.arange(0, BLOCK_D)
    dm = rd < HD
    for bg in range(pid, B * NKV, nprog):
        b = bg // NKV
        g = bg - b * NKV
        nctx, c_head_stride, ck_ptr, cv_ptr, anc_b, qoff, q, r_of, qmask = _attn_item(
            b, g, R, meta_ptr, qr_ptr, kv_ptr, anc_ptr, anc_stride, NH, NKV, HD, BLOCK_Q, BLOCK_D, VEC)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        nt = n_anc * R  # the tree keys of depths 0..n_anc-1
        m_i, l_i = _ctx_stats(q, m_i, l_i, ck_ptr, g, c_head_stride, 0, nctx, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE)
        if TREE_BLOCKS:
            m_i, l_i = _ctx_stats(q, m_i, l_i, tk_ptr, g, t_head_stride, 0, nt, sqrt_d, HD, DT, BLOCK_N, BLOCK_D, IEEE,
                                  True, b * SK, anc_b, r_of, qmask, anc_stride, R)
        else:
            m_i, l_i = _tree_stats(q, m_i, l_i, tk_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc,
                                   sqrt_d, HD, DT, BLOCK_D)
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        acc = _ctx_pv(acc, q, m_i, l_i, ck_ptr, cv_ptr, g, c_head_stride, 0, nctx, sqrt_d, HD, DT, BLOCK_N, BLOCK_D,
                      IEEE)
        if TREE_BLOCKS:
            acc = _ctx_pv(acc, q, m_i, l_i, tk_ptr, tv_ptr, g, t_head_stride, 0, nt, sqrt_d, HD, DT, BLOCK_N, BLOCK_D,
                          IEEE, True, b * SK, anc_b, r_of, qmask, anc_stride, R)
        else:
            acc = _tree_pv(acc, q, m_i, l_i, tk_ptr, tv_ptr, anc_b, g, t_head_stride, r_of, qmask, anc_stride, n_anc,
                           sqrt_d, HD, DT, BLOCK_D)
        tl.store(ao_ptr + qoff[:, None] + rd[None, :], acc.to(DT), mask=qmask[:, None] & dm[None, :])


@triton.jit
def _ph_attn_sum(pid, nprog, B, R, ao_ptr, pacc_ptr, NH, NKV, HD, NCH, n_anc,
                 BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, SUB_Q: tl.constexpr):
    """Attention output: the sum over parts of the per-part P@V (fp32), rounded to the dtype."""
    DT = ao_ptr.dtype.element_ty
    G = NH // NKV
    parts = NCH + n_anc
    nsub = BLOCK_Q // SUB_Q
    rs = tl.arange(0, SUB_Q)
    rd = tl.arange(0, BLOCK_D)
    for t in range(pid, B * NKV * nsub, nprog):
        bg = t // nsub
        b = bg // NKV
        g = bg - b * NKV
        rq = (t - bg * nsub) * SUB_Q + rs
        r_of = rq // G
        hl = rq - r_of * G
        acc = tl.zeros([SUB_Q, BLOCK_D], tl.float32)
        for c in range(parts):
            acc += tl.load(pacc_ptr + ((bg * parts + c) * BLOCK_Q + rq)[:, None] * BLOCK_D + rd[None, :],
                           cache_modifier=".cg")
        qoff = (b * R + r_of) * NH * HD + (g * G + hl) * HD
        tl.store(ao_ptr + qoff[:, None] + rd[None, :], acc.to(DT), mask=(r_of < R)[:, None] & (rd < HD)[None, :])


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
def _top_rounds16(keys, col, K, base, DT: tl.constexpr):
    """K rounds of row maxima over 32-bit keys [rows, n] (``_keys16``): [rows, KP] (KP = the
    columns ``col`` [1, KP] counts) whose column j is the j-th best as a ``_key`` of (value as
    fp32, base + slab-local index), KEY_NONE from column K on and where a row has fewer than
    j+1 valid keys. The rounds keep the 32-bit picks; they are widened once, after the last."""
    top = tl.full([keys.shape[0], col.shape[1]], KEY32_NONE, tl.int32)
    for j in range(K):
        best = tl.max(keys, axis=1)
        top = tl.where(col == j, best[:, None], top)
        keys = tl.where(keys == best[:, None], KEY32_NONE, keys)
    return _wide_key(top, DT, base)


@triton.jit
def _lm_keys(acc, rr, rmask, rm, M, DT: tl.constexpr, KEY16: tl.constexpr = False, base=0):
    """Logits of one accumulator block [rows, BM] -> ([BM, rows] keys, row max, valid logits).
    The keys are ``_key``s of (logit, row rr), or with KEY16 32-bit ``_keys16`` of (logit, rr -
    base)."""
    if KEY16:
        lt = tl.trans(acc.to(DT))  # [BM, rows]
        logit = lt.to(tl.float32)
    else:
        logit = tl.trans(acc.to(DT).to(tl.float32))  # [BM, rows]
    valid = rmask[None, :] & (rm < M)[:, None]
    logit = tl.where(valid, logit, float("-inf"))
    if KEY16:
        keys = _keys16(lt, rr[None, :] - base, valid)
    else:
        keys = tl.where(valid, _key(logit, rr[None, :]), KEY_NONE)
    return keys, tl.max(logit, axis=1), logit


@triton.jit
def _ph_lmhead(pid, nprog, x_ptr, M, w_ptr, V, Kd, keys_ptr, max_ptr, sum_ptr, RP, MR, K,
               BM: tl.constexpr, KP: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
               HALVES: tl.constexpr, ONE_SUB: tl.constexpr, ST: tl.constexpr, KEY16: tl.constexpr = False,
               PACK: tl.constexpr = False):
    """lm_head over one slab of RP vocabulary rows per program, then in registers: per
    activation row the slab's max and sum of exp (for the log-softmax) and its top-K logits as
    ranking keys. Each program writes only that partial (keys [MR, KP] with entries K..KP-1
    empty, max [MR], sum [MR]) to its slot: the [rows, V] logits never reach memory. The slab is
    walked in sub-slabs of BNS rows (one at batch 1), each against tiles of BM activation rows; a
    later sub-slab's results are merged into the program's partial (running max / rescaled sum /
    top-K), which only this program touches; ONE_SUB (the slab is one sub-slab, as at batch 1)
    compiles that merge out. HALVES=2 streams a sub-slab as two half-height tiles per stage (two
    accumulators, same k-chunks, so the same sums). KEY16 (16-bit dtypes; with ONE_SUB and one
    half): the K rounds rank 32-bit keys (``_keys16``, as in ``_lm_slab_stats``). PACK: the
    lm_head is packed per slab (``_slab_base``)."""
    DT = x_ptr.dtype.element_ty
    K16: tl.constexpr = KEY16 and ONE_SUB and HALVES == 1
    HB: tl.constexpr = BNS // HALVES
    rbm = tl.arange(0, BM)
    rp = tl.arange(0, HB)
    rk = tl.arange(0, BK)
    col = tl.arange(0, KP)[None, :]
    kslot = keys_ptr + pid * MR * KP
    mslot = max_ptr + pid * MR
    sslot = sum_ptr + pid * MR
    for s0 in range(0, RP, BNS):
        rr1 = pid * RP + s0 + rp
        m1 = (s0 + rp < RP) & (rr1 < V)
        rr2 = rr1 + HB
        m2 = (s0 + rp + HB < RP) & (rr2 < V)
        w1row, kstep = _slab_base(w_ptr, pid, RP, Kd, s0 + rp, PACK, BK)
        w2row, _ = _slab_base(w_ptr, pid, RP, Kd, s0 + rp + HB, PACK, BK)
        for m0 in range(0, M, BM):
            rm = m0 + rbm
            acc1 = tl.zeros([HB, BM], dtype=tl.float32)
            acc2 = tl.zeros([HB, BM], dtype=tl.float32)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                kk = k0 + rk
                km = (kk[None, :] < Kd)
                x = _x_chunk(x_ptr, Kd, rm, kk, M, Kd)
                w1 = tl.load(w1row[:, None] + k0 * kstep + rk[None, :], mask=m1[:, None] & km, other=0.0,
                             eviction_policy=W_EVICT)
                if HALVES == 2:
                    w2 = tl.load(w2row[:, None] + k0 * kstep + rk[None, :], mask=m2[:, None] & km, other=0.0,
                                 eviction_policy=W_EVICT)
                acc1 = _mma(w1, x, acc1, IEEE)
                if HALVES == 2:
                    acc2 = _mma(w2, x, acc2, IEEE)
            key1, max1, logit1 = _lm_keys(acc1, rr1, m1, rm, M, DT, K16, pid * RP)
            if HALVES == 2:
                key2, max2, logit2 = _lm_keys(acc2, rr2, m2, rm, M, DT)
                tmax = tl.maximum(max1, max2)
            else:
                tmax = max1
            safe = tl.where(tmax == float("-inf"), 0.0, tmax)
            tsum = tl.sum(tl.exp(logit1 - safe[:, None]), axis=1)
            if HALVES == 2:
                tsum += tl.sum(tl.exp(logit2 - safe[:, None]), axis=1)
            rmask = rm < MR
            top = tl.full([BM, KP], KEY_NONE, tl.int64)  # entries from K on stay empty
            if ONE_SUB:  # the slab is one sub-slab: no partial so far to merge with
                nmax = tmax
                nsum = tsum
                old = top
            else:  # the partial so far (nothing before the first sub-slab)
                old = tl.load(kslot + rm[:, None] * KP + col, mask=rmask[:, None] & (s0 > 0), other=KEY_NONE)
                omax = tl.load(mslot + rm, mask=rmask & (s0 > 0), other=float("-inf"))
                osum = tl.load(sslot + rm, mask=rmask & (s0 > 0), other=0.0)
                nmax = tl.maximum(omax, tmax)
                nsafe = tl.where(nmax == float("-inf"), 0.0, nmax)
                nsum = tl.where(omax == float("-inf"), 0.0, osum * tl.exp(omax - nsafe)) + \
                    tl.where(tmax == float("-inf"), 0.0, tsum * tl.exp(tmax - nsafe))
            if K16:
                top = _top_rounds16(key1, col, K, pid * RP, DT)
            else:
                for j in range(K):  # K rounds of the row max: the (running) top-K, ranked
                    best = tl.max(key1, axis=1)
                    if HALVES == 2:
                        best = tl.maximum(best, tl.max(key2, axis=1))
                    if not ONE_SUB:
                        best = tl.maximum(best, tl.max(old, axis=1))
                    top = tl.where(col == j, best[:, None], top)
                    key1 = tl.where(key1 == best[:, None], KEY_NONE, key1)
                    if HALVES == 2:
                        key2 = tl.where(key2 == best[:, None], KEY_NONE, key2)
                    if not ONE_SUB:
                        old = tl.where(old == best[:, None], KEY_NONE, old)
            tl.debug_barrier()
            tl.store(kslot + rm[:, None] * KP + col, top, mask=rmask[:, None])
            tl.store(mslot + rm, nmax, mask=rmask)
            tl.store(sslot + rm, nsum, mask=rmask)
            tl.debug_barrier()


@triton.jit
def _ph_lmhead_wide(pid, nprog, x_ptr, M, w_ptr, V, Kd, logit_ptr, keys_ptr, max_ptr, sum_ptr, RP, MR, K,
                    BM: tl.constexpr, KP: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                    BMK: tl.constexpr, BNP: tl.constexpr, BM2: tl.constexpr, ST: tl.constexpr,
                    KEY16: tl.constexpr = False, stats=True):
    """lm_head for many activation rows (batches): the same per-program partials as
    ``_ph_lmhead``, but the slab's logits (rounded to the compute dtype, as the reference
    rounds them) go to a scratch ``[MR, V]`` first and the statistics are taken from there in
    tiles of BMK rows x the whole slab. The GEMM can then use wide accumulators (few x re-reads)
    without also holding a 64-bit key per logit in registers. Only this program reads back what
    it wrote (the block barrier orders it), and the scratch rows stay in L2. ``stats`` false
    (``Tuning.merge_rows``, tree depths): the logits only; MERGE takes the statistics per row
    (``_ph_merge_rows``)."""
    DT = x_ptr.dtype.element_ty
    for s0 in range(0, RP, BNS):
        rr, rmask, wrow = _slab_rows(pid, RP, s0, V, 0, Kd, w_ptr, w_ptr, w_ptr, False, BNS, 1)
        for m0 in range(0, M, BM + BM2):
            rm, rm2 = _row_tiles(m0, BM, BM2)
            acc, acc2 = _stream_tile(wrow, rmask, x_ptr, Kd, rm, rm2, M, 0, Kd, BNS, BM, BK, IEEE, BM2, ST)
            tl.store(logit_ptr + rm[None, :] * V + rr[:, None], acc.to(DT), mask=rmask[:, None] & (rm[None, :] < M))
            if BM2 > 0:
                tl.store(logit_ptr + rm2[None, :] * V + rr[:, None], acc2.to(DT),
                         mask=rmask[:, None] & (rm2[None, :] < M))
    if stats:
        tl.debug_barrier()
        _lm_slab_stats(pid, logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, MR, K, KP, BMK, BNP, DT, KEY16)


@triton.jit
def _lm_slab_stats(pid, logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, MR, K,
                   KP: tl.constexpr, BMK: tl.constexpr, BNP: tl.constexpr, DT: tl.constexpr, KEY16: tl.constexpr):
    """The wide lm_head's statistics from its logits scratch: per activation row, the program's
    slab max, sum of exp and top-K keys (``_key`` of (logit, vocabulary index)), in tiles of BMK
    rows x the whole slab. KEY16 (16-bit compute dtypes): the K rounds of row maxima rank 32-bit
    keys (the logit's 16 bits, order-preserving, above 16 bits of 0xFFFF - slab column) instead of
    64-bit ones - the same order, since a 16-bit logit widened to fp32 orders like its own bits -
    and only the K winners are widened to ``_key`` form."""
    rc = tl.arange(0, BNP)
    cols = pid * RP + rc
    cm = (rc < RP) & (cols < V)
    col = tl.arange(0, KP)[None, :]
    for m0 in range(0, M, BMK):
        rm = m0 + tl.arange(0, BMK)
        valid = (rm < M)[:, None] & cm[None, :]
        raw = tl.load(logit_ptr + rm[:, None] * V + cols[None, :], mask=valid, other=float("-inf"))
        logit = raw.to(tl.float32)
        rmax = tl.max(logit, axis=1)
        safe = tl.where(rmax == float("-inf"), 0.0, rmax)
        rsum = tl.sum(tl.exp(logit - safe[:, None]), axis=1)
        top = tl.full([BMK, KP], KEY_NONE, tl.int64)
        if KEY16:  # entries from K on stay empty
            top = _top_rounds16(_keys16(raw, rc[None, :], valid), col, K, pid * RP, DT)
        else:
            keys = tl.where(valid, _key(logit, cols[None, :]), KEY_NONE)
            for j in range(K):  # entries from K on stay empty
                best = tl.max(keys, axis=1)
                top = tl.where(col == j, best[:, None], top)
                keys = tl.where(keys == best[:, None], KEY_NONE, keys)
        rows_ok = rm < MR
        tl.store(keys_ptr + pid * MR * KP + rm[:, None] * KP + col, top, mask=rows_ok[:, None])
        tl.store(max_ptr + pid * MR + rm, rmax, mask=rows_ok)
        tl.store(sum_ptr + pid * MR + rm, rsum, mask=rows_ok)


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


@triton.jit
def _lp_keys(row, idx, V, gmax, logs, DT: tl.constexpr, KEY32: tl.constexpr):
    """Ranking keys of the log-probs at vocabulary indices ``idx`` (any shape) of one logits row:
    ``((logit - max) - log(sum of exp))`` rounded to DT, then 32-bit ``_keys16`` (KEY32) or
    64-bit ``_key``s; KEY32_NONE / KEY_NONE at and past V."""
    valid = idx < V
    x = tl.load(row + idx, mask=valid, other=float("-inf"))
    lp = ((x.to(tl.float32) - gmax) - logs).to(DT)
    if KEY32:
        keys = _keys16(lp, idx, valid)
    else:
        keys = tl.where(valid, _key(lp.to(tl.float32), idx), KEY_NONE)
    return keys


@triton.jit
def _ph_merge_rows(pid, nprog, R, logit_ptr, V, sel_lp_ptr, sel_tok_ptr, K,
                   KP: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, KEY32: tl.constexpr, G: tl.constexpr = 8):
    """MERGE from the wide lm_head's logits scratch (``Tuning.merge_rows``): each row's
    statistics over its whole vocabulary, one program per row, in chunks of BV logits - the
    max, the sum of exp, and then the top-K of every logit's log-prob rounded to the compute
    dtype, by (log-prob, lower index): the reference's ``topk(log_softmax(logits))``, ranked on
    all V entries rather than on the union of per-slab top lists by logit. The lm_head
    programs then write their logits only and leave the statistics (a chain of dependent block
    reductions that idles the weight stream) to this phase, which spreads them over the rows
    instead of over the slabs.
    The K rounds of maxima run on groups first: a chunk is read as [BV/G, G] (G adjacent
    entries, which one thread holds), each group ranked by its best key, and the K best groups
    are kept across chunks. They hold the row's top K (an entry outside them ranks below K
    group bests, so below K entries), and the last K rounds rank just their K*G entries. KEY32
    (16-bit dtypes, V <= 65536): the rounds rank 32-bit keys (``_keys16``), 64-bit ``_key``s
    otherwise."""
    rv = tl.arange(0, BV)
    rk = tl.arange(0, KP)
    rg = tl.arange(0, BV // G)[:, None] * G + tl.arange(0, G)[None, :]  # [BV/G, G]
    rkg = rk[:, None] * 0 + tl.arange(0, G)[None, :]  # [KP, G]
    for r in range(pid, R, nprog):
        row = logit_ptr + r * V
        mx = tl.full([BV], float("-inf"), tl.float32)
        for v0 in range(0, V, BV):  # the row max (lane-wise over the chunks, then one reduction)
            x = tl.load(row + v0 + rv, mask=v0 + rv < V, other=float("-inf"))
            mx = tl.maximum(mx, x.to(tl.float32))
        gmax = tl.max(mx, axis=0)
        sm = tl.zeros([BV], dtype=tl.float32)
        for v0 in range(0, V, BV):
            x = tl.load(row + v0 + rv, mask=v0 + rv < V, other=float("-inf"))
            sm += tl.exp(x.to(tl.float32) - gmax)
        logs = tl.log(tl.sum(sm, axis=0))
        if KEY32:
            gtop = tl.full([KP], KEY32_NONE, tl.int32)
        else:
            gtop = tl.full([KP], KEY_NONE, tl.int64)
        for v0 in range(0, V, BV):  # the K best groups (a later chunk's rounds also take the list so far)
            gbest = tl.max(_lp_keys(row, v0 + rg, V, gmax, logs, DT, KEY32), axis=1)  # [BV/G]
            if v0 == 0:  # (no list so far: the first chunk skips its reduction in each round)
                gtop = _rank_rounds(gbest, gtop, rk, K, False)
            else:
                gtop = _rank_rounds(gbest, gtop, rk, K, True)
        # the entries of those groups (none where fewer than K groups exist), ranked
        if KEY32:
            g0 = ((0xFFFF - (gtop & 0xFFFF)) // G) * G
            cand = tl.where((gtop != KEY32_NONE)[:, None], g0[:, None] + rkg, V)
        else:
            g0 = (_key_idx(gtop) // G) * G
            cand = tl.where((gtop != KEY_NONE)[:, None], g0[:, None] + rkg, V)
        keys = tl.reshape(_lp_keys(row, cand, V, gmax, logs, DT, KEY32), [KP * G])
        wide = _best_k(keys, rk, K, DT)  # (widened to 64-bit keys, as _ph_merge's KEY32 form stores them)
        tl.store(sel_lp_ptr + r * KP + rk, _key_val(wide), mask=rk < K)
        tl.store(sel_tok_ptr + r * KP + rk, _key_idx(wide), mask=rk < K)


@triton.jit
def _ph_merge(pid, nprog, R, P, keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR,
              KP: tl.constexpr, BLOCK_P: tl.constexpr, DT: tl.constexpr, KEY32: tl.constexpr = False):
    """Per row: log-sum-exp from the P partials, log-probs of the partial top lists rounded to
    the compute dtype, and the row's top-K by (log-prob, lower index). KEY32 (16-bit dtypes,
    vocabularies up to 65536): the K rounds of maxima rank 32-bit keys - the rounded log-prob's
    16 bits, order-preserving, above 16 bits of 0xFFFF - index (``_keys16``) - in the same
    order as the 64-bit ``_key``s, at half the width of every comparison and shuffle."""
    for r in range(pid, R, nprog):
        _merge_row(r, P, keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR, KP, BLOCK_P, DT, KEY32)


@triton.jit
def _merge_row(r, P, keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR,
               KP: tl.constexpr, BLOCK_P: tl.constexpr, DT: tl.constexpr, KEY32: tl.constexpr):
    """``_ph_merge`` for row r. The partials' top lists are loaded as one flat list (entry
    p * KP + rank), so that each of the K rounds takes its maximum in one reduction (a
    [BLOCK_P, KP] block took two: twenty-third session, 8B depth 7, -0.013 ms per call); the
    K picks are decoded and stored after the last round, two vector stores."""
    rp = tl.arange(0, BLOCK_P)
    pm = rp < P
    pmax = tl.load(max_ptr + rp * MR + r, mask=pm, other=float("-inf"), cache_modifier=".cg")
    psum = tl.load(sum_ptr + rp * MR + r, mask=pm, other=0.0, cache_modifier=".cg")
    gmax = tl.max(pmax, axis=0)
    scale = tl.where(pmax == float("-inf"), 0.0, tl.exp(pmax - gmax))
    logs = tl.log(tl.sum(psum * scale, axis=0))
    e = tl.arange(0, BLOCK_P * KP)  # entry e: rank e % KP of partial e // KP
    ks = tl.load(keys_ptr + (e // KP) * MR * KP + r * KP + e % KP, mask=e // KP < P, other=KEY_NONE, cache_modifier=".cg")
    lp = ((_key_val(ks) - gmax) - logs).to(DT)
    if KEY32:
        k2 = _keys16(lp, _key_idx(ks).to(tl.int32), ks != KEY_NONE)
    else:
        k2 = tl.where(ks == KEY_NONE, KEY_NONE, _key(lp.to(tl.float32), _key_idx(ks)))
    rk = tl.arange(0, KP)
    # (KEY32: no candidate left, which a vocabulary of >= K entries never leaves, stores what the
    # 64-bit ranking stores then)
    top = _best_k(k2, rk, K, DT)
    tl.store(sel_lp_ptr + r * KP + rk, _key_val(top), mask=rk < K)
    tl.store(sel_tok_ptr + r * KP + rk, _key_idx(top), mask=rk < K)


@triton.jit
def _ph_select(pid, nprog, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr, fr_tok_ptr,
               fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V,
               IS_CTX: tl.constexpr, HAS_D2T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_A: tl.constexpr,
               DT: tl.constexpr, KEY32: tl.constexpr):
    """One program per sequence b (its K frontier rows b*K.., its C candidates, its RPW
    row-parent entries). Context step: the root's top-K (row b of the lm_head output) become
    candidates 0..K-1 and the depth-0 frontier, whose hidden source is row b. Depth i:
    cumulative scores of the K*K children, their candidate entries, and the top-K prune into
    the next frontier (tokens, scores, source rows b*K + parent, ancestor slots b*SK + ...).
    The K*K children are one flat list (entry row * BLOCK_K + rank): each of the prune's K rounds
    takes its maximum in one reduction (a [BLOCK_K, BLOCK_K] block took two). KEY32 (16-bit
    dtypes, K*K <= 65536): the rounds rank 32-bit keys, ``_keys16`` of the children's scores
    (DT values) and flat indices, in the order of the 64-bit ``_key``s. The children's tokens are
    stored after the rounds, which their d2t lookups' latency then hides behind, and the picks'
    tokens are read back from there (twenty-fourth session, H200, 1B depth 7: MERGE, which runs
    this at batch 1, 0.100 -> 0.083 ms per call with both; a match of each pick's flat index
    over the list, [BLOCK_K, BLOCK_K * BLOCK_K], took 3.6 us per depth)."""
    rr = tl.arange(0, BLOCK_K)
    ra = tl.arange(0, BLOCK_A)
    rmask = rr < K
    for b in range(pid, B, nprog):
        fb = b * K  # first frontier row of sequence b
        cand_s = cand_score_ptr + b * C
        cand_t = cand_tok_ptr + b * C
        rpar = row_par_ptr + b * RPW
        if IS_CTX:
            lp = tl.load(sel_lp_ptr + b * KP + rr, mask=rmask, other=0.0, cache_modifier=".cg")
            tokd = tl.load(sel_tok_ptr + b * KP + rr, mask=rmask, other=0, cache_modifier=".cg")
            tokd = tl.minimum(tl.maximum(tokd, 0), V - 1)
            tok = tokd
            if HAS_D2T:
                tok = tokd + tl.load(d2t_ptr + tokd, mask=rmask, other=0)
            tl.store(cand_s + rr, lp, mask=rmask)
            tl.store(cand_t + rr, tok, mask=rmask)
            tl.store(rpar + rr * 0, tl.zeros([BLOCK_K], tl.int64), mask=rr == 0)
            tl.store(fr_score_ptr + fb + rr, lp, mask=rmask)
            tl.store(fr_tok_ptr + fb + rr, tok, mask=rmask)
            tl.store(fr_src_ptr + fb + rr, tl.zeros([BLOCK_K], tl.int32) + b, mask=rmask)
            tl.store(fr_pick_ptr + fb + rr, rr.to(tl.int64), mask=rmask)
            tl.store(anc_ptr + (fb + rr) * BLOCK_A, b * SK + rr, mask=rmask)
        else:  # the K*K children as one flat list: entry e = row * BLOCK_K + rank
            e = tl.arange(0, BLOCK_K * BLOCK_K)
            er = e // BLOCK_K
            ej = e % BLOCK_K
            valid = (er < K) & (ej < K)
            lp = tl.load(sel_lp_ptr + (fb + er) * KP + ej, mask=valid, other=0.0, cache_modifier=".cg")
            tokd = tl.load(sel_tok_ptr + (fb + er) * KP + ej, mask=valid, other=0, cache_modifier=".cg")
            tokd = tl.minimum(tl.maximum(tokd, 0), V - 1)
            tok = tokd
            if HAS_D2T:
                tok = tokd + tl.load(d2t_ptr + tokd, mask=valid, other=0)
            score = tl.load(fr_score_ptr + fb + er, mask=valid, other=0.0, cache_modifier=".cg")
            pick_old = tl.load(fr_pick_ptr + fb + rr, mask=rmask, other=0, cache_modifier=".cg")
            cs = (score + lp).to(DT).to(tl.float32)
            flat = er * K + ej
            base = K + i * K * K
            tl.store(cand_s + base + flat, cs, mask=valid)
            offset = tl.where(i == 0, 1, 1 + K + (i - 1) * K * K)
            tl.store(rpar + 1 + i * K + rr, pick_old + offset, mask=rmask)
            if KEY32:
                keys = _keys16(cs.to(DT), flat, valid)
            else:
                keys = tl.where(valid, _key(cs, flat), KEY_NONE)
            top = _best_k(keys, rr, K, DT)
            npick = _key_idx(top).to(tl.int32)  # (past K: no pick; every use below is masked or clamped)
            nscore = _key_val(top)
            tl.store(cand_t + base + flat, tok, mask=valid)
            tl.debug_barrier()  # (the block's stores, visible to all its threads)
            ntok = tl.load(cand_t + base + npick, mask=rmask, other=0, cache_modifier=".cg")  # pick j's token
            prow = npick // K
            prow = tl.minimum(tl.maximum(prow, 0), K - 1)
            old = tl.load(anc_ptr + (fb + prow)[:, None] * BLOCK_A + ra[None, :], mask=rmask[:, None] & (ra <= i)[None, :],
                          other=0, cache_modifier=".cg")
            tl.debug_barrier()
            new = tl.where((ra == i + 1)[None, :], (b * SK + (i + 1) * K + rr)[:, None], old)
            tl.store(anc_ptr + (fb + rr)[:, None] * BLOCK_A + ra[None, :], new, mask=rmask[:, None] & (ra <= i + 1)[None, :])
            tl.store(fr_score_ptr + fb + rr, nscore, mask=rmask)
            tl.store(fr_tok_ptr + fb + rr, ntok, mask=rmask)
            tl.store(fr_src_ptr + fb + rr, fb + prow, mask=rmask)
            tl.store(fr_pick_ptr + fb + rr, npick.to(tl.int64), mask=rmask)
        tl.debug_barrier()


@triton.jit
def _ph_select_step(pid, nprog, is_ctx, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr,
                    fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V,
                    HAS_D2T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_A: tl.constexpr, DT: tl.constexpr,
                    KEY32: tl.constexpr):
    """``_ph_select`` for a schedule step: its context-step form where ``is_ctx``, else its tree-depth form."""
    if is_ctx:
        _ph_select(pid, nprog, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr, fr_tok_ptr,
                   fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V, True, HAS_D2T,
                   BLOCK_K, BLOCK_A, DT, KEY32)
    else:
        _ph_select(pid, nprog, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr, fr_tok_ptr,
                   fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V, False, HAS_D2T,
                   BLOCK_K, BLOCK_A, DT, KEY32)


@triton.jit
def _top_n_mask(v, valid, n):
    """Which of the fp32 values ``v`` (one block; where ``valid``) are among the ``n`` largest, ties
    to the lower index: the set of the n largest ``_key(v, index)``s. A radix select: the
    threshold value's order-preserving 32-bit image is found 4 bits at a time, from the top
    (per digit, a 16-bin count of the values that share the digits found so far), and the values
    equal to it are taken in index order. Eight block-wide counts instead of n rounds of a
    block-wide 64-bit max."""
    b = v.to(tl.int32, bitcast=True)
    b = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)  # signed, ordered as the values (as in _key)
    u = (b ^ -0x80000000).to(tl.uint32, bitcast=True)  # unsigned, the same order
    bins = tl.arange(0, 16)
    need = tl.full([], 0, tl.int32) + n  # values still to take among those matching
    pre = tl.full([], 0, tl.uint32)  # the digits found so far
    for p in range(8):  # a loop, not unrolled: the code stays small (it shares the persistent build)
        pt = tl.full([], 0, tl.int32) + p  # a tensor also under the interpreter (p is an int there)
        d = ((u >> (28 - 4 * pt).to(tl.uint32)) & 15).to(tl.int32)
        top = u >> tl.minimum(32 - 4 * pt, 31).to(tl.uint32)  # the digits above this one (p > 0)
        match = valid & ((pt == 0) | (top == pre))
        cnt = tl.sum((match[:, None] & (d[:, None] == bins[None, :])).to(tl.int32), axis=0)  # [16]
        ge = tl.sum(tl.where(bins[None, :] >= bins[:, None], cnt[None, :], 0), axis=1)  # [16]: digit >= j
        dig = tl.max(tl.where(ge >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > dig, cnt, 0), axis=0)
        pre = (pre << 4) | dig.to(tl.uint32)
    eq = valid & (u == pre)
    take = valid & ((u > pre) | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need)))
    return tl.where(tl.sum(valid.to(tl.int32), axis=0) <= n, valid, take)


@triton.jit
def _final_one(C, T, K, D1, W, cand_score_ptr, cand_tok_ptr, row_par_ptr, root_ptr, cnt_ptr, pf_ptr,
              out_tok_ptr, out_par_ptr, out_score_ptr, out_mask_ptr, out_pos_ptr, out_ret_ptr, out_leaf_ptr,
              BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """One sequence: top-(T-1) of the C candidates (ties to the lower index), in ascending
    candidate order; tokens, scores and parent positions (searchsorted semantics); then the tree
    packed exactly as ``frontier.tree.pack_tree`` packs it (padded layout): tree_mask,
    tree_position_ids, retrieve_indices [T, W] with W = D+2 (leaves ascending, -1 padded), leaf
    count and deepest level. D1 = min(D+1, T-1) is the number of parent-pointer steps."""
    rc = tl.arange(0, BLOCK_C)
    cm = rc < C
    cs = tl.load(cand_score_ptr + rc, mask=cm, other=0.0, cache_modifier=".cg")
    chosen = _top_n_mask(cs, cm, T - 1)
    ch = chosen.to(tl.int32)
    incl = tl.cumsum(ch, axis=0)
    tl.store(cnt_ptr + rc, incl - ch)  # number of chosen candidates below each index
    tl.debug_barrier()
    pos = incl  # 1-based position in draft_tokens of a chosen candidate
    tok = tl.load(cand_tok_ptr + rc, mask=chosen, other=0, cache_modifier=".cg")
    stored = tl.load(row_par_ptr + rc // K, mask=chosen, other=0, cache_modifier=".cg")
    ppos = tl.load(cnt_ptr + tl.maximum(stored - 1, 0), mask=chosen & (stored > 0), other=0, cache_modifier=".cg") + 1
    ppos = tl.where(stored == 0, 0, ppos)
    tl.store(out_tok_ptr + pos, tok, mask=chosen)
    tl.store(out_score_ptr + pos, cs, mask=chosen)
    tl.store(out_par_ptr + pos - 1, ppos.to(tl.int64), mask=chosen)
    root = tl.load(root_ptr, cache_modifier=".cg")
    tl.store(out_tok_ptr, root)
    tl.store(out_score_ptr, 0.0)

    # ---- tree packing ----
    tl.store(pf_ptr + pos, ppos, mask=chosen)  # pf[node] = parent position
    tl.store(pf_ptr + rc, tl.zeros([BLOCK_C], tl.int32), mask=rc == 0)  # the root is its own parent
    tl.debug_barrier()
    rt = tl.arange(0, BLOCK_T)
    tm = rt < T
    both = tm[:, None] & tm[None, :]
    anc = (rt[:, None] == rt[None, :]) & both
    cur = rt
    for _s in range(D1):  # one parent-pointer step per tree level
        cur = tl.load(pf_ptr + cur, mask=tm, other=0)
        anc = anc | ((rt[None, :] == cur[:, None]) & both)
    posid = tl.sum(anc.to(tl.int32), axis=1) - 1
    pf = tl.load(pf_ptr + rt, mask=tm, other=-1)
    is_par = tl.max(((pf[None, :] == rt[:, None]) & (rt[None, :] >= 1) & both).to(tl.int32), axis=1)
    lf = tl.where(tm & (is_par == 0), 1, 0)
    rank = tl.cumsum(lf, axis=0) - 1
    tl.store(out_mask_ptr + rt[:, None] * T + rt[None, :], anc.to(tl.float32), mask=both)
    tl.store(out_pos_ptr + rt, posid.to(tl.int64), mask=tm)
    rw = tl.arange(0, BLOCK_W)
    tl.store(out_ret_ptr + rt[:, None] * W + rw[None, :], tl.full([BLOCK_T, BLOCK_W], -1, tl.int64),
             mask=tm[:, None] & (rw < W)[None, :])
    tl.debug_barrier()
    path = anc & (lf == 1)[:, None]  # leaf i's path: its ancestor columns j at depth posid[j]
    vals = tl.zeros([BLOCK_T, BLOCK_T], tl.int64) + rt[None, :].to(tl.int64)
    tl.store(out_ret_ptr + rank[:, None] * W + posid[None, :], vals, mask=path)
    tl.store(out_leaf_ptr, tl.sum(lf, axis=0).to(tl.int64))
    tl.store(out_leaf_ptr + 1, tl.max(tl.where(tm, posid, 0), axis=0).to(tl.int64))


@triton.jit
def _ph_final(pid, nprog, B, C, T, K, D1, W, RPW, PFW, cand_score_ptr, cand_tok_ptr, row_par_ptr, root_ptr, cnt_ptr,
              pf_ptr, out_tok_ptr, out_par_ptr, out_score_ptr, out_mask_ptr, out_pos_ptr, out_ret_ptr, out_leaf_ptr,
              BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """One program per sequence: its final selection and tree packing (``_final_one``) on its
    own slices of the candidate arrays, scratch and outputs."""
    for b in range(pid, B, nprog):
        _final_one(C, T, K, D1, W, cand_score_ptr + b * C, cand_tok_ptr + b * C, row_par_ptr + b * RPW, root_ptr + b,
                   cnt_ptr + b * BLOCK_C, pf_ptr + b * PFW, out_tok_ptr + b * T, out_par_ptr + b * (T - 1),
                   out_score_ptr + b * T, out_mask_ptr + b * T * T, out_pos_ptr + b * T, out_ret_ptr + b * T * W,
                   out_leaf_ptr + b * 2, BLOCK_C, BLOCK_T, BLOCK_W)
        tl.debug_barrier()


# ----------------------------------------------------------------------------------------------
# grid barrier
# ----------------------------------------------------------------------------------------------
@triton.jit
def _globaltimer(dummy):
    """Nanosecond global timer (GPU only; used by the TIMING build for per-phase breakdowns)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _ld_acquire(ptr):
    """A gpu-scope acquiring load of one int32 (``ld.global.acquire.gpu``): orders what follows
    after every write released before the value it reads, without a read-modify-write."""
    return tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _poll(sync_ptr, ACQUIRE: tl.constexpr):
    """One poll of the barrier's arrival counter: an acquiring load, or a volatile one."""
    if ACQUIRE:
        cur = _ld_acquire(sync_ptr)
    else:
        cur = tl.load(sync_ptr, volatile=True)
    return cur


@triton.jit
def _grid_sync(sync_ptr, target, MAX_SPIN: tl.constexpr, BAR: tl.constexpr = 0):
    """Bounded device-wide barrier. sync_ptr[0] counts arrivals (a release atomic per program);
    waiting programs poll it with loads (no read-modify-write traffic on the line), and an
    acquire orders what follows. BAR (the launcher's default is 2): 2 - the polls are acquiring
    loads, so the poll that sees every arrival is the acquire (no extra round trip); 1 - volatile
    polls, then an acquiring load; 0 - volatile polls, then an atomic add of 0 with acquire
    semantics. A program that polls MAX_SPIN times without seeing every arrival sets the error
    flag sync_ptr[1] and adds 2^30 to the counter, which releases every waiter of this and all
    later barriers at once; the launcher then raises."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    cur = _poll(sync_ptr, BAR == 2)
    spins = cur * 0
    while (cur < target) & (spins < MAX_SPIN):
        cur = _poll(sync_ptr, BAR == 2)
        spins += 1
    if BAR == 2:
        seen = cur
    elif BAR == 1:
        seen = _ld_acquire(sync_ptr)
    else:
        # The acquire: its result is used, so it stays a real acquiring atomic (an unused one may
        # be lowered to a fire-and-forget reduction, which cannot acquire).
        seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    if seen < target:
        tl.atomic_xchg(sync_ptr + 1, 1, sem="relaxed", scope="gpu")
        tl.atomic_add(sync_ptr, 1 << 30, sem="relaxed", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _last_arrival(ticket_ptr, n):
    """Whether this program is the n-th (last) to arrive at the counter ``ticket_ptr`` (each
    program that arrives adds 1: a release, so what it wrote before is visible to the last one,
    whose add also acquires). The last one sets the counter back to 0 for its next use (a later
    launch, or a later phase after a barrier). No program waits, so the order the programs run
    in does not matter (the interpreter runs them one after another)."""
    tl.debug_barrier()
    old = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    last = old == n - 1
    if last:
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    return last


# ----------------------------------------------------------------------------------------------
# the kernel
# ----------------------------------------------------------------------------------------------
# The batch size changes from call to call: without this, Triton specialises it (== 1, % 16 == 0)
# and recompiles the kernel as generation proceeds. (The packed new rows N come in the metadata.)
@triton.jit(do_not_specialize=["B"])
def drafter_kernel(
    # schedule
    sched_ptr, n_steps, sync_ptr, time_ptr,
    # weights
    emb_ptr, fcw_ptr, fcb_ptr, wq_ptr, wk_ptr, wv_ptr, wo_ptr, wg_ptr, wu_ptr, wd_ptr,
    ln_in_ptr, ln_post_ptr, ln_hid_ptr, ln_f_ptr, lm_ptr, d2t_ptr, cos_ptr, sin_ptr,
    # inputs (packed over the batch) and the caches
    meta_ptr, row_seq_ptr, feat_ptr, ids_ptr, root_ptr, kv_ptr,
    # workspace
    hcur_ptr, hres_ptr, xin_ptr, qkv_ptr, qr_ptr, ao_ptr, h1_ptr, n2_ptr, act_ptr, hout_ptr, nf_ptr, xh_ptr, qh_ptr,
    tk_ptr, tv_ptr, apm_ptr, apl_ptr, aacc_ptr, lmk_ptr, lmmax_ptr, lmsum_ptr, lml_ptr, part_ptr, sel_lp_ptr, sel_tok_ptr,
    fr_score_ptr, fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr,
    cand_score_ptr, cand_tok_ptr, row_par_ptr, cnt_ptr, pf_ptr, out_tok_ptr, out_par_ptr, out_score_ptr,
    out_mask_ptr, out_pos_ptr, out_ret_ptr, out_leaf_ptr,
    # sizes
    B, H, F, I, V, Vt, NH, NKV, HD, K, C, T, D, SK, MR, PFW, eps, sqrt_d,
    RP_FC, RP_QKV, RP_O, RP_GU, RP_D, RP_LM, NCH, RPS_QKV, RPS_O, RPS_D, SPL_QKV, SPL_O, SPL_D, RP_QH,
    # compile-time
    EAGLE3: tl.constexpr, HAS_D2T: tl.constexpr, HAS_FCB: tl.constexpr, IEEE: tl.constexpr,
    PERSISTENT: tl.constexpr, MAX_SPIN: tl.constexpr, TIMING: tl.constexpr,
    BM: tl.constexpr, KP: tl.constexpr,
    BNS_FC: tl.constexpr, BK_FC: tl.constexpr, BNS_QKV: tl.constexpr, BK_QKV: tl.constexpr,
    BNS_O: tl.constexpr, BK_O: tl.constexpr, BNS_GU: tl.constexpr, BK_GU: tl.constexpr,
    BNS_D: tl.constexpr, BK_D: tl.constexpr, BNS_LM: tl.constexpr, BK_LM: tl.constexpr, LM_HALVES: tl.constexpr, LM_WIDE: tl.constexpr, BNP_LM: tl.constexpr,
    SPLITK: tl.constexpr, BNSS_QKV: tl.constexpr, BKS_QKV: tl.constexpr, BNSS_O: tl.constexpr, BKS_O: tl.constexpr,
    BNSS_D: tl.constexpr, BKS_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_NA: tl.constexpr, BLOCK_NF: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_CH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
    VEC_W: tl.constexpr = 1, VEC_KV: tl.constexpr = 1, BM2: tl.constexpr = 0, BMP: tl.constexpr = 16,
    BMP_B: tl.constexpr = 16,
    QH: tl.constexpr = False, BNS_QH: tl.constexpr = 16, BK_QH: tl.constexpr = 16, VEC_QH: tl.constexpr = 1,
    ST_LIN: tl.constexpr = 3, ST_GU: tl.constexpr = 3, ST_LM: tl.constexpr = 3, BAR: tl.constexpr = 0,
    FOLD_FC: tl.constexpr = 1, FOLD_O: tl.constexpr = 1, FOLD_D: tl.constexpr = 1, ST_FOLD: tl.constexpr = 0,
    BMK_LM: tl.constexpr = 16, KEY16_LM: tl.constexpr = False, KEY32_MG: tl.constexpr = False,
    BMC: tl.constexpr = 0, BNS_FCC: tl.constexpr = 16, BK_FCC: tl.constexpr = 16, FOLD_FCC: tl.constexpr = 1,
    ST_FCC: tl.constexpr = 3, BNS_QKVC: tl.constexpr = 16, BK_QKVC: tl.constexpr = 16, PHASE: tl.constexpr = -1,
    PDL: tl.constexpr = 0, TREE_BLOCKS: tl.constexpr = True, INLINE_SUMS: tl.constexpr = False,
    MG_ROWS: tl.constexpr = False, BV_MG: tl.constexpr = 16, G_MG: tl.constexpr = 8, SEL_MG: tl.constexpr = False,
    KEY32_SEL: tl.constexpr = False, PACK_W: tl.constexpr = False,
):
    """B sequences at once. Context step rows: the N new rows of all sequences, packed in
    sequence order (``meta`` gives each sequence's first row and count, ``row_seq`` each row's
    sequence); after attention one row per sequence. Tree rows: B*K, sequence b's at b*K.
    Every weight-streaming phase runs over all rows of all sequences together.
    VEC_W / VEC_KV > 1: the launcher proved the QKV weight rows / every cache's K/V offset 16-byte
    aligned (that many elements), so loads that Triton cannot prove aligned itself are declared so.
    BM2 > 0 (wide launches): the tree depths' weight-streaming phases take activation rows in tiles
    of BM + BM2 (two accumulators per weight chunk), covering e.g. 160 rows without padding them to
    256. The unsplit linear phases (every one at narrow launches, the context step's at wide ones,
    with slabs too short for the tensor-core tiles of two accumulators) take one tile of BMP rows;
    o_proj and down, whose unsplit forms at wide launches serve only the context step's one row
    per sequence, one of BMP_B rows (BMP at narrow launches).
    QH (eagle3; the launcher enables it at batch 1): the tree depths' QKV is split along its input - the hidden half
    streamed one step early, during MERGE (``_ph_qkv_hidden``: NORM_F also writes the rows'
    hidden_norm into xh, qh holds the fp32 partials), the embedding half in PH_QKV, which adds
    each row's parent partial.
    ST_LIN / ST_GU / ST_LM: software-pipeline stages of the weight streams' k-loops - the linear
    phases (fc, QKV, o_proj, down and their split-K forms), gate/up, the lm_head.
    FOLD_FC / FOLD_O / FOLD_D: the unsplit fc, o_proj and down streams' k-chunks folded that
    many ways (``_stream_folded``; the launcher folds where the folded accumulator stays small:
    batch 1 by 4, batch 4 by 2, never in wide launches), pipelined ST_FOLD stages (0: ST_LIN).
    PHASE >= 0 (step launches, one schedule entry each): the kernel is built for that phase
    alone - the phase switch below is decided at compile time, so the build holds one phase's
    code and gets that phase's own register allocation.
    TREE_BLOCKS: how the fused attention (batched launches) takes the rows' ancestors
    (``_ph_attn_fused``).
    MG_ROWS (wide launches, ``Tuning.merge_rows``): at the tree depths the wide lm_head writes its
    logits scratch only and MERGE ranks each row from it (``_ph_merge_rows``, chunks of BV_MG
    logits, groups of G_MG); the context step keeps the per-program partials.
    SEL_MG (narrow launches, ``Tuning.select_in_merge``; the schedule then has no PH_SELECT):
    MERGE counts each sequence's merged rows (``_last_arrival`` on sync_ptr[2 + b]) and the
    program that merges its last one runs its SELECT right away, while the other programs still
    stream the next depth's QKV hidden half (QH), instead of a phase of its own after MERGE.
    KEY32_SEL (16-bit dtypes): SELECT's prune ranks 32-bit keys (``_ph_select``).
    PACK_W (launches whose tree rows fit one BM-row tile, ``Tuning.pack_weights``): gate, up and
    lm_head are the launcher's copies packed per slab (``_slab_base``, ``launch.pack_slabs``),
    each stage's tile one contiguous block; no other phase reads them.
    PDL > 0 (step launches on sm_90+ made with programmatic dependent launch): the launch may
    start while the one before it still runs, so every program first waits for that one to
    complete (``griddepcontrol.wait``: its writes are then visible, and by induction every earlier
    launch's). Before the wait nothing is read but the schedule (never written) and nothing is
    written. The launch lets the next one start (which then waits the same way) right after the
    wait (PDL 1) or after its own phase's work (PDL 2)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT = hcur_ptr.dtype.element_ty
    NQ = NH * HD
    NKVD = NKV * HD
    RPW = 1 + D * K  # row-parent entries per sequence
    # TIMING: program 0 stamps the global timer at the start and after every barrier;
    # TIMING >= 2 also stamps every program: its start, and per schedule entry its arrival at the
    # barrier and its leaving it (ps_ptr: [1 + 2 * n_steps, nprog] after program 0's stamps)
    ps_ptr = time_ptr + n_steps + 1
    if TIMING:
        if pid == 0:
            tl.store(time_ptr, _globaltimer(pid))
        if TIMING >= 2:
            tl.store(ps_ptr + pid, _globaltimer(pid))
    for step in range(n_steps):
        code = tl.load(sched_ptr + step)
        if PHASE >= 0:
            ph = PHASE
        else:
            ph = code // 256
        i = code % 256
        is_ctx = i == 255
        # QH: this step's rows are parents of a next depth's rows (every step but the last depth)
        ahead = (is_ctx & (D > 0)) | (i + 1 < D)
        if PDL > 0:
            _gdc_wait()
            if PDL == 1:
                _gdc_launch_dependents()
        # rows of this step: the N packed new rows (context step, up to attention), else B or B*K
        N = tl.load(meta_ptr + META_ROWS).to(tl.int32)
        m_in = tl.where(is_ctx, N, B * K)
        m_out = tl.where(is_ctx, B, B * K)
        # wide launches: the context step's fc and QKV on a tile of BMC rows when the call's new
        # rows fit in it (a run-time choice; both forms are built)
        small = is_ctx & (N <= BMC)
        if ph == 0:  # PH_FC
            if EAGLE3:
                _ph_linear_ctx(pid, nprog, small, feat_ptr, F, N, fcw_ptr, H, F, hcur_ptr, H, fcb_ptr, fcw_ptr, fcw_ptr,
                               0, RP_FC, 0, IEEE, 1, ST_LIN, BMP, BNS_FC, BK_FC, FOLD_FC, ST_FOLD, BMC, BNS_FCC,
                               BK_FCC, FOLD_FCC, ST_FCC)
            elif HAS_FCB:  # (eagle2: fc at every depth; MODE 2 adds its bias)
                _ph_linear_ctx(pid, nprog, small, xin_ptr, 2 * H, m_in, fcw_ptr, H, 2 * H, hcur_ptr, H, fcb_ptr,
                               fcw_ptr, fcw_ptr, 0, RP_FC, 2, IEEE, 1, ST_LIN, BMP, BNS_FC, BK_FC, FOLD_FC, ST_FOLD,
                               BMC, BNS_FCC, BK_FCC, FOLD_FCC, ST_FCC)
            else:
                _ph_linear_ctx(pid, nprog, small, xin_ptr, 2 * H, m_in, fcw_ptr, H, 2 * H, hcur_ptr, H, fcb_ptr,
                               fcw_ptr, fcw_ptr, 0, RP_FC, 0, IEEE, 1, ST_LIN, BMP, BNS_FC, BK_FC, FOLD_FC, ST_FOLD,
                               BMC, BNS_FCC, BK_FCC, FOLD_FCC, ST_FCC)
        elif ph == 1:  # PH_PREP3 (eagle3)
            if is_ctx:
                _ph_prep(pid, nprog, N, ids_ptr, emb_ptr, hcur_ptr, H, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, False, True, BLOCK_H)
            else:
                _ph_prep(pid, nprog, B * K, fr_tok_ptr, emb_ptr, hout_ptr, H, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, True, True, BLOCK_H, not QH)
        elif ph == 2:  # PH_PREP2 (eagle2)
            if is_ctx:
                _ph_prep(pid, nprog, N, ids_ptr, emb_ptr, feat_ptr, F, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, False, False, BLOCK_H)
            else:
                _ph_prep(pid, nprog, B * K, fr_tok_ptr, emb_ptr, hout_ptr, H, fr_src_ptr, hcur_ptr, xin_ptr,
                         ln_in_ptr, ln_hid_ptr, H, Vt, eps, True, False, BLOCK_H)
        elif ph == 4:  # PH_QKV
            if EAGLE3:
                x_a = xin_ptr
                k_a = 2 * H
            else:
                x_a = hcur_ptr
                k_a = H
            split = False
            if SPLITK:
                split = i != 255
            if split:
                _ph_linear_split(pid, nprog, x_a, k_a, m_in, wq_ptr, NQ, k_a, part_ptr, MR, wk_ptr, wv_ptr, NKVD,
                                 RPS_QKV, SPL_QKV, True, BM, BNSS_QKV, BKS_QKV, IEEE, VEC_W, BM2=BM2, ST=ST_LIN)
            elif QH and not is_ctx:  # the embedding half + each row's parent partial from MERGE
                _ph_linear(pid, nprog, xin_ptr, 2 * H, m_in, wq_ptr, NQ, 2 * H, H, qkv_ptr, NQ + 2 * NKVD, qh_ptr,
                           NQ + 2 * NKVD, fr_src_ptr, wk_ptr, wv_ptr, NKVD, RP_QKV, 7, BMP, BNS_QKV, BK_QKV, IEEE, VEC_W, ST=ST_LIN)
            else:
                _ph_linear_ctx(pid, nprog, small, x_a, k_a, m_in, wq_ptr, NQ, k_a, qkv_ptr, NQ + 2 * NKVD, fcb_ptr,
                               wk_ptr, wv_ptr, NKVD, RP_QKV, 4, IEEE, VEC_W, ST_LIN, BMP, BNS_QKV, BK_QKV, 1, 0, BMC,
                               BNS_QKVC, BK_QKVC, 1, 0)
        elif ph == 5:  # PH_ROPE
            if is_ctx:
                _ph_rope_ctx(pid, nprog, N, meta_ptr, row_seq_ptr, qkv_ptr, qr_ptr, hcur_ptr, hres_ptr, kv_ptr,
                             cos_ptr, sin_ptr, NH, NKV, HD, H, BLOCK_R, BLOCK_D, BLOCK_H, VEC_KV)
            else:
                _ph_rope_tree(pid, nprog, B * K, K, i, meta_ptr, qkv_ptr, qr_ptr, tk_ptr, tv_ptr, B * SK * HD, SK,
                              cos_ptr, sin_ptr, NH, NKV, HD, BLOCK_R, BLOCK_D, INLINE_SUMS, part_ptr, SPL_QKV, MR)
        elif (ph == 6) | (ph == 16):  # PH_ATTN / PH_ATTN2
            r_att = tl.where(is_ctx, 1, K)
            n_anc = tl.where(is_ctx, 0, i + 1)
            if ph == 6:
                _ph_attn_part(pid, nprog, B, r_att, meta_ptr, qr_ptr, kv_ptr,
                              tk_ptr, tv_ptr, B * SK * HD, anc_ptr, BLOCK_A, n_anc, NH, NKV, HD, sqrt_d,
                              apm_ptr, apl_ptr, aacc_ptr, NCH, 1, BLOCK_Q, BLOCK_NA, BLOCK_D, BLOCK_CH, IEEE, VEC_KV)
            else:
                _ph_attn_part(pid, nprog, B, r_att, meta_ptr, qr_ptr, kv_ptr,
                              tk_ptr, tv_ptr, B * SK * HD, anc_ptr, BLOCK_A, n_anc, NH, NKV, HD, sqrt_d,
                              apm_ptr, apl_ptr, aacc_ptr, NCH, 2, BLOCK_Q, BLOCK_NA, BLOCK_D, BLOCK_CH, IEEE, VEC_KV)
        elif ph == 21:  # PH_ATTN_F
            _ph_attn_fused(pid, nprog, B, tl.where(is_ctx, 1, K), meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr, B * SK * HD,
                           anc_ptr, BLOCK_A, SK, tl.where(is_ctx, 0, i + 1), NH, NKV, HD, sqrt_d, ao_ptr,
                           BLOCK_Q, BLOCK_NF, BLOCK_D, IEEE, VEC_KV, TREE_BLOCKS)
        elif ph == 17:  # PH_ATTN3
            _ph_attn_sum(pid, nprog, B, tl.where(is_ctx, 1, K), ao_ptr, aacc_ptr, NH, NKV, HD, NCH,
                         tl.where(is_ctx, 0, i + 1), BLOCK_Q, BLOCK_D, 16)
        elif ph == 7:  # PH_OPROJ: h1 = h + o_proj(attn); the context step's residual is each sequence's last row
            if is_ctx:
                _ph_linear(pid, nprog, ao_ptr, NQ, m_out, wo_ptr, H, NQ, NQ, h1_ptr, H, hres_ptr, H, fcb_ptr,
                           wo_ptr, wo_ptr, 0, RP_O, 1, BMP_B, BNS_O, BK_O, IEEE, VEC=1, ST=ST_LIN, FOLD=FOLD_O,
                           STF=ST_FOLD)
            elif SPLITK:
                _ph_linear_split(pid, nprog, ao_ptr, NQ, m_out, wo_ptr, H, NQ, part_ptr, MR, wo_ptr, wo_ptr, 0,
                                 RPS_O, SPL_O, False, BM, BNSS_O, BKS_O, IEEE, VEC=1, BM2=BM2, ST=ST_LIN)
            else:
                _ph_linear(pid, nprog, ao_ptr, NQ, m_out, wo_ptr, H, NQ, NQ, h1_ptr, H, hcur_ptr, H, fcb_ptr,
                           wo_ptr, wo_ptr, 0, RP_O, 1, BMP_B, BNS_O, BK_O, IEEE, VEC=1, ST=ST_LIN, FOLD=FOLD_O,
                           STF=ST_FOLD)
        elif ph == 8:  # PH_NORM_POST (INLINE_SUMS: h1 = h + the split-K o_proj's partials, first)
            _ph_norm_after(pid, nprog, m_out, is_ctx, part_ptr, SPL_O, MR, hcur_ptr, h1_ptr, ln_post_ptr, n2_ptr, H, eps,
                           BLOCK_H, INLINE_SUMS)
        elif ph == 9:  # PH_GATEUP
            _ph_gateup(pid, nprog, n2_ptr, m_out, wg_ptr, wu_ptr, I, H, act_ptr, RP_GU, BM, BNS_GU, BK_GU, IEEE, BM2=BM2, ST=ST_GU,
                       PACK=PACK_W)
        elif ph == 10:  # PH_DOWN: h2 = h1 + down(act)
            split = False
            if SPLITK:
                split = i != 255
            if split:
                _ph_linear_split(pid, nprog, act_ptr, I, m_out, wd_ptr, H, I, part_ptr, MR, wd_ptr, wd_ptr, 0,
                                 RPS_D, SPL_D, False, BM, BNSS_D, BKS_D, IEEE, VEC=1, BM2=BM2, ST=ST_LIN)
            else:
                _ph_linear(pid, nprog, act_ptr, I, m_out, wd_ptr, H, I, I, hout_ptr, H, h1_ptr, H, fcb_ptr,
                           wd_ptr, wd_ptr, 0, RP_D, 1, BMP_B, BNS_D, BK_D, IEEE, VEC=1, ST=ST_LIN, FOLD=FOLD_D,
                           STF=ST_FOLD)
        elif ph == 18:  # PH_RED_QKV
            _ph_reduce(pid, nprog, part_ptr, SPL_QKV, m_in, NQ + 2 * NKVD, MR, qkv_ptr, NQ + 2 * NKVD, qkv_ptr, 0,
                       0, 1024)
        elif ph == 19:  # PH_RED_O: h1 = h + sum
            _ph_reduce(pid, nprog, part_ptr, SPL_O, m_out, H, MR, h1_ptr, H, hcur_ptr, H, 1, 1024)
        elif ph == 20:  # PH_RED_D: h2 = h1 + sum
            _ph_reduce(pid, nprog, part_ptr, SPL_D, m_out, H, MR, hout_ptr, H, h1_ptr, H, 1, 1024)
        elif ph == 11:  # PH_NORM_F (INLINE_SUMS: h2 = h1 + the split-K down's partials, first)
            _ph_norm_after(pid, nprog, m_out, is_ctx, part_ptr, SPL_D, MR, h1_ptr, hout_ptr, ln_f_ptr, nf_ptr, H, eps,
                           BLOCK_H, INLINE_SUMS)
            if QH and ahead:  # the next depth's hidden_norm of every possible parent, on the programs after these
                _ph_norm((pid + nprog - m_out % nprog) % nprog, nprog, m_out, hout_ptr, ln_hid_ptr, xh_ptr, H, eps,
                         BLOCK_H)
        elif ph == 12:  # PH_LMHEAD
            if EAGLE3:
                x_lm = nf_ptr
            else:
                x_lm = hout_ptr
            if LM_WIDE:
                lm_stats = True
                if MG_ROWS:  # (the context step keeps its per-program partials: the same bits as step launches'
                    lm_stats = is_ctx  # own context builds, whose register lm_head leaves them)
                _ph_lmhead_wide(pid, nprog, x_lm, m_out, lm_ptr, V, H, lml_ptr, lmk_ptr, lmmax_ptr, lmsum_ptr, RP_LM, MR, K,
                                BM, KP, BNS_LM, BK_LM, IEEE, BMK_LM, BNP_LM, BM2=BM2, ST=ST_LM, KEY16=KEY16_LM,
                                stats=lm_stats)
            else:
                _ph_lmhead(pid, nprog, x_lm, m_out, lm_ptr, V, H, lmk_ptr, lmmax_ptr, lmsum_ptr, RP_LM, MR, K,
                           BM, KP, BNS_LM, BK_LM, IEEE, LM_HALVES, BNP_LM <= BNS_LM, ST=ST_LM, KEY16=KEY16_LM, PACK=PACK_W)
        elif ph == 13:  # PH_MERGE (partials: the lm_head programs whose slab holds vocabulary rows)
            if MG_ROWS and not is_ctx:  # (tree depths: each row from the wide lm_head's logits scratch)
                _ph_merge_rows(pid, nprog, m_out, lml_ptr, V, sel_lp_ptr, sel_tok_ptr, K, KP, BV_MG, DT, KEY32_MG, G_MG)
            elif SEL_MG:  # the program that merges a sequence's last row runs that sequence's SELECT
                per_seq = tl.where(is_ctx, 1, K)  # rows per sequence: the root, or the K frontier rows
                for r in range(pid, m_out, nprog):
                    _merge_row(r, tl.cdiv(V, RP_LM), lmk_ptr, lmmax_ptr, lmsum_ptr, sel_lp_ptr, sel_tok_ptr, K, MR, KP,
                               BLOCK_P, DT, KEY32_MG)
                    b = r // per_seq
                    if _last_arrival(sync_ptr + 2 + b, per_seq):  # (program b of B: sequence b alone)
                        _ph_select_step(b, B, is_ctx, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr,
                                        fr_score_ptr, fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr,
                                        cand_tok_ptr, row_par_ptr, V, HAS_D2T, BLOCK_K, BLOCK_A, DT, KEY32_SEL)
            else:
                _ph_merge(pid, nprog, m_out, tl.cdiv(V, RP_LM), lmk_ptr, lmmax_ptr, lmsum_ptr, sel_lp_ptr, sel_tok_ptr,
                          K, MR, KP, BLOCK_P, DT, KEY32_MG)
            if QH and ahead:
                _ph_qkv_hidden(pid, nprog, m_out, xh_ptr, H, wq_ptr, wk_ptr, wv_ptr, NQ, NKVD, qh_ptr, RP_QH,
                               BMP, BNS_QH, BK_QH, IEEE, VEC_QH, ST=ST_LIN)
        elif ph == 14:  # PH_SELECT
            _ph_select_step(pid, nprog, is_ctx, B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr,
                            fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr, row_par_ptr, V,
                            HAS_D2T, BLOCK_K, BLOCK_A, DT, KEY32_SEL)
        elif ph == 15:  # PH_FINAL
            _ph_final(pid, nprog, B, C, T, K, tl.minimum(D + 1, T - 1), D + 2, RPW, PFW, cand_score_ptr, cand_tok_ptr,
                      row_par_ptr, root_ptr, cnt_ptr, pf_ptr, out_tok_ptr, out_par_ptr, out_score_ptr, out_mask_ptr,
                      out_pos_ptr, out_ret_ptr, out_leaf_ptr, BLOCK_C, BLOCK_T, BLOCK_W)
        if PDL == 2:
            _gdc_launch_dependents()
        if PERSISTENT:
            if TIMING >= 2:
                tl.debug_barrier()
                tl.store(ps_ptr + (1 + 2 * step) * nprog + pid, _globaltimer(pid))
            _grid_sync(sync_ptr, (step + 1) * nprog, MAX_SPIN, BAR)
            if TIMING:
                if pid == 0:
                    tl.store(time_ptr + 1 + step, _globaltimer(pid))
                if TIMING >= 2:
                    tl.store(ps_ptr + (2 + 2 * step) * nprog + pid, _globaltimer(pid))
