"""Weight-streaming phases: the linear layers (fc, QKV, o_proj, down), gate/up with SiLU, their
split-K forms and reductions, and the hidden-half QKV stream that runs ahead during MERGE.

Every program owns a slab of weight rows (``RP``), walks it in sub-slabs of ``BNS`` rows and
streams each sub-slab's k-chunks (``BK`` columns) once, through a software pipeline, for all
activation rows of the call (one tile of ``BM`` rows, or two of ``BM + BM2`` in wide launches).

Weight formats (``W8``, one per stream; ``frontier.backends.triton.fp8``): 0, the compute dtype;
1, e4m3 with power-of-two row scales that dequantize exactly - each weight converted exactly to
the compute dtype, the row's scale applied to the fp32 accumulator after the k-loop, which gives
the bits of the dequantized weight's dot; 2, e4m3 with any row scales - each weight dequantized
in registers, ``(w * scale)`` rounded to the compute dtype, as the reference dequantizes. Plus 4
(bf16 on a GPU): the e4m3 -> bf16 conversion is done with integer ops (``_e4m3_bf16``). Plus 8
(16-bit dtypes): where the activation rows are one tile of at most ``SWAP_ROWS`` rows, an unfolded
stream's dot takes the activations as its first operand (``acc^T += x @ w^T``, ``_w_dot``): Triton
then runs it on mma.sync with the weights read from shared memory by ldmatrix, 16 bytes at a time
(or, on 64-row tiles, on wgmma with the converted weights stored to shared memory), rather than on
wgmma with the converted weights as its register operand, which it gathers two bytes at a time (the
8B gate/up at batch 1 on an H200: 34 us swapped at 32 KB stages, 50 us unswapped at its best; bf16
56 us; at batch 4, one 64-row tile swapped: 62 us, 32 + 16 rows unswapped 73 us, or 60 us read as
words (plus 16, below), which the 1B stream reverses: 24.8 against 25.3 us;
docs/results/fp8_stream_h200.json). Two tiles are never swapped. The streams whose k-chunks fold in
the compute dtype (FOLD > 1: fc, o_proj and down at batch 1) have slabs of 16 to 32 rows, and every
warp of one swapped dot would read the whole activation chunk from shared memory (the 8B down: 35.4
us swapped, 29.4 us folded): swapped, they split each k-chunk FOLD ways instead
(``_stream_split``), one k-slice per warp (23.8 us); folded streams on wider tiles stay folded and
unswapped. Plus 16 (16-bit dtypes, rows on 16-byte boundaries): unswapped, unfolded dots read the
e4m3 bytes as int32 words (``_w_chunk``).
``s_ptr``: the stream's fp32 row scales, indexed by global weight row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import W_EVICT
from .numerics import _mma, _silu_rn

SWAP_ROWS = tl.constexpr(64)  # the widest one-tile activation block whose fp8 dots are swapped (``_w_dot``)


def _e4m3_pair_asm(word: str, lo: str, hi: str) -> str:
    """PTX that turns the four e4m3 bytes of the 32-bit register ``word`` into two bf16x2
    registers, ``lo`` (bytes 0, 1) and ``hi`` (bytes 2, 3), with the scratch registers a, b, k,
    z (``_e4m3_bf16`` says how)."""
    return f"""
        prmt.b32 a, {word}, 0, 0x9180;
        prmt.b32 b, {word}, 0, 0xB3A2;
        shl.b32 a, a, 4;
        shl.b32 b, b, 4;
        and.b32 a, a, 0x87F087F0;
        and.b32 b, b, 0x87F087F0;
        mov.b32 k, 0x7B807B80;
        mov.b32 z, 0x80008000;
        fma.rn.bf16x2 {lo}, a, k, z;
        fma.rn.bf16x2 {hi}, b, k, z;"""


# four e4m3 packed by Triton into $2 -> two bf16x2 ($0, $1); one int32 word $4 -> four bf16 ($0-$3)
_E4M3_PACKED_ASM = tl.constexpr("{\n        .reg .b32 a, b, k, z;" + _e4m3_pair_asm("$2", "$0", "$1") + "\n        }")
_E4M3_WORD_ASM = tl.constexpr("{\n        .reg .b32 a, b, k, z, lo, hi;" + _e4m3_pair_asm("$4", "lo", "hi")
                              + "\n        mov.b32 {$0, $1}, lo;\n        mov.b32 {$2, $3}, hi;\n        }")


@triton.jit
def _e4m3_bf16(w):
    """e4m3 -> bf16, exactly, with integer ops, four elements per instance: ``prmt`` puts each byte
    in the low byte of a 16-bit lane with its sign replicated through the high byte, so that a
    shift by 4 and one mask leave sign, exponent and mantissa at bf16's places - the value times
    2^-120, subnormals included - and one bf16x2 multiply by 2^120 restores it: four ALU ops per
    pair in place of Triton's conversion sequence (the 8B gate/up at batch 1 on an H200, swapped:
    34 us against 53 us; docs/results/fp8_stream_h200.json). (The two NaN bytes become +-480;
    quantizing finite weights never produces them.)"""
    return tl.inline_asm_elementwise(asm=_E4M3_PACKED_ASM, constraints="=r,=r,r", args=[w.to(tl.uint8, bitcast=True)],
                                     dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def _row_scale(s_ptr, rows, rmask, W8: tl.constexpr):
    """The fp32 scales of weight rows ``rows`` (valid where rmask; 1 elsewhere) of an fp8 stream
    (W8 > 0); an unused placeholder of their shape otherwise."""
    if W8 > 0:
        sc = tl.load(s_ptr + rows, mask=rmask, other=1.0)
    else:
        sc = rows.to(tl.float32)
    return sc


@triton.jit
def _w_operand(w, sc, DT: tl.constexpr, W8: tl.constexpr):
    """A loaded weight tile [rows, k] as the dot's operand in the compute dtype DT: as it is (W8
    0), e4m3 converted exactly (1), or dequantized with its rows' scales ``sc`` (2); + 4: the
    conversion to bf16 with integer ops (``_e4m3_bf16``); + 8 (the swapped dot) changes nothing here."""
    if W8 % 4 == 1:
        if W8 % 8 >= 4:
            w = _e4m3_bf16(w)
        else:
            w = w.to(DT)
    elif W8 % 4 == 2:
        if W8 % 8 >= 4:
            wf = _e4m3_bf16(w).to(tl.float32)
        else:
            wf = w.to(tl.float32)
        w = (wf * sc[:, None]).to(DT)
    return w


@triton.jit
def _e4m3_byte(p, shift: tl.constexpr, DT: tl.constexpr):
    """The e4m3 byte at bit ``shift`` of each int32 word of ``p``, converted exactly to DT."""
    return (p >> shift).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DT)


@triton.jit
def _e4m3_words(p, DT: tl.constexpr, W8: tl.constexpr):
    """int32 words [rows, n] of four e4m3 bytes each -> their [rows, 4n] values in DT, exactly, in
    memory order (byte j of word i is element 4i + j). With W8's ``BF16_BITS`` one ``_e4m3_bf16``
    sequence makes the four bf16 of a word; otherwise each byte is converted on its own. The
    four results are joined back along the row, a layout Triton cannot hoist into the shared-memory
    read of the words, so the read stays 16 bytes per thread (``_w_chunk``)."""
    if W8 % 8 >= 4:
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            asm=_E4M3_WORD_ASM, constraints="=h,=h,=h,=h,r", args=[p],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
    else:
        o0 = _e4m3_byte(p, 0, DT)
        o1 = _e4m3_byte(p, 8, DT)
        o2 = _e4m3_byte(p, 16, DT)
        o3 = _e4m3_byte(p, 24, DT)
    w = tl.join(tl.join(o0, o2), tl.join(o1, o3))  # [rows, n, 2, 2]: element 4i + 2a + b at [i, a, b]
    return tl.reshape(w, [p.shape[0], 4 * p.shape[1]])


@triton.jit
def _w_chunk(wrow, k0, kstep, rmask, k_hi, sc, DT: tl.constexpr, W8: tl.constexpr, BK: tl.constexpr,
             SWAP: tl.constexpr):
    """The weight chunk [rows, BK] at column k0 (row pointers ``wrow``, valid where rmask, columns
    below k_hi; a row's column k at ``wrow + k0 * kstep + (k - k0)``) as the dot's operand in DT
    (``_w_operand``). An fp8 stream with ``PACK_WORDS`` whose dot is not swapped reads its bytes
    four to an int32 word (``_e4m3_words``): with the weights the register operand of wgmma, a
    byte-wide read lets Triton gather them from shared memory two bytes at a time (the 8B gate/up
    at batch 16 on an H200: 95 us as words, 132 us as bytes, bf16 83 us;
    docs/results/fp8_stream_h200.json). Such a stream's rows start on 16-byte boundaries
    (``fp8.PACK_WORDS``), and so do its chunks (k0 and k_hi are multiples of 16): the cast
    pointers and the word count are declared so, or Triton would load 4 bytes at a time."""
    if W8 % 32 >= 16 and not SWAP:
        rw = tl.arange(0, BK // 4)
        words = tl.multiple_of((wrow + k0 * kstep).to(tl.pointer_type(tl.int32), bitcast=True), 16)
        nw = tl.multiple_of((k_hi - k0) // 4, 4)  # the words left in the row (k0, k_hi: multiples of 16)
        p = tl.load(words[:, None] + rw[None, :], mask=rmask[:, None] & (rw[None, :] < nw), other=0,
                    eviction_policy=W_EVICT)
        w = _e4m3_words(p, DT, W8)
        if W8 % 4 == 2:
            w = (w.to(tl.float32) * sc[:, None]).to(DT)
    else:
        rk = tl.arange(0, BK)
        w = tl.load(wrow[:, None] + k0 * kstep + rk[None, :], mask=rmask[:, None] & (k0 + rk[None, :] < k_hi),
                    other=0.0, eviction_policy=W_EVICT)
        w = _w_operand(w, sc, DT, W8)
    return w


@triton.jit
def _acc_scaled(acc, sc, W8: tl.constexpr):
    """An accumulator [rows, m] with the rows' power-of-two scales ``sc`` applied (W8 1); as it is
    otherwise. Scaling by a power of two commutes with every rounding of the k-loop's sums."""
    if W8 % 4 == 1:
        acc = acc * sc[:, None]
    return acc


@triton.jit
def _x_chunk(x_ptr, x_stride, rm, kk, M, k_hi):
    """The activation chunk [BK, rows] of rows ``rm`` (valid below M) at columns ``kk`` (valid
    below k_hi), the B operand of a weight-streaming dot; zeros elsewhere."""
    return tl.load(x_ptr + rm[None, :] * x_stride + kk[:, None], mask=(rm[None, :] < M) & (kk[:, None] < k_hi),
                   other=0.0, cache_modifier=".cg")


@triton.jit
def _acc_init(BNS: tl.constexpr, BM: tl.constexpr, SWAP: tl.constexpr):
    """A zero fp32 accumulator of BNS weight rows x BM activation rows: [BNS, BM], or [BM, BNS]
    when the dot is swapped (SWAP, ``_w_dot``)."""
    if SWAP:
        acc = tl.zeros([BM, BNS], dtype=tl.float32)
    else:
        acc = tl.zeros([BNS, BM], dtype=tl.float32)
    return acc


@triton.jit
def _x_operand(x_ptr, x_stride, rm, kk, M, k_hi, SWAP: tl.constexpr):
    """The activation chunk of rows ``rm`` at columns ``kk`` as ``_w_dot`` takes it: [BK, rows]
    (``_x_chunk``), or [rows, BK] when the dot is swapped."""
    if SWAP:
        x = tl.load(x_ptr + rm[:, None] * x_stride + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < k_hi),
                    other=0.0, cache_modifier=".cg")
    else:
        x = _x_chunk(x_ptr, x_stride, rm, kk, M, k_hi)
    return x


@triton.jit
def _w_dot(acc, w, x, IEEE: tl.constexpr, SWAP: tl.constexpr):
    """One k-chunk of a weight stream: acc [BNS, BM] += w [BNS, BK] @ x [BK, BM], or with SWAP
    acc [BM, BNS] += x [BM, BK] @ w^T - the same products, the activations the dot's first operand
    (the module docstring says why; 16-bit dtypes only, so no IEEE dot). On a GPU the tensor cores
    may add a swapped dot's products in another order: its bf16 / fp16 bits can differ in the last
    place."""
    if SWAP:
        tl.static_assert(not IEEE, "a swapped dot is a 16-bit dot")
        acc = tl.dot(x, tl.trans(w), acc)
    else:
        acc = _mma(w, x, acc, IEEE)
    return acc


@triton.jit
def _acc_rows(acc, SWAP: tl.constexpr):
    """An accumulator of ``_w_dot`` as [weight rows, activation rows]."""
    if SWAP:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _stream_folded(w_ptr, Kd, row0, nrows, x_ptr, x_stride, m0, M, k_lo, k_hi,
                   BNS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                   ST: tl.constexpr, F: tl.constexpr, s_ptr=0, W8: tl.constexpr = 0):
    """acc [BNS, BM] = W[row0 + j, k_lo:k_hi] @ X[m0 + m, k_lo:k_hi]^T (rows j < nrows, m0 + m <
    M) with every k-chunk folded F ways: the weight chunk [BNS, BK] is read as F row blocks of
    BK/F columns stacked into [F*BNS, BK/F] (block f holds columns f*BK/F..), the activation
    chunk likewise side by side along the dot's N ([BK/F, F*BM], block g), and the wanted
    partial sums are the diagonal blocks f == g, added after the k-loop. The dot is F times
    taller, so the program's warps split weight rows instead of each reading the same few rows
    from shared memory. The row pointers are computed here from row indices (not gathered from
    a pointer tensor), so the loads keep their 16-byte alignment facts. W8 / s_ptr: the weight format and row scales (module docstring)."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
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
    scf = _row_scale(s_ptr, row0 + rf % BNS, wmask, W8 if W8 % 4 == 2 else 0)  # (2: per stacked row)
    acc = tl.zeros([F * BNS, F * BM], dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=ST):
        w = tl.load(wf[:, None] + k0 + rk[None, :], mask=wmask[:, None] & ((k0 + fw)[:, None] + rk[None, :] < k_hi),
                    other=0.0, eviction_policy=W_EVICT)
        w = _w_operand(w, scf, DT, W8)
        x = tl.load(xcol[None, :] + k0 + rk[:, None], mask=(mcol < M)[None, :] & ((k0 + fx)[None, :] + rk[:, None] < k_hi),
                    other=0.0, cache_modifier=".cg")
        acc = _mma(w, x, acc, IEEE)
    acc = tl.where((rf // BNS)[:, None] == (rc // BM)[None, :], acc, 0.0)
    acc = tl.sum(tl.sum(tl.reshape(acc, [F, BNS, F, BM]), 2), 0)
    rj = tl.arange(0, BNS)
    return _acc_scaled(acc, _row_scale(s_ptr, row0 + rj, rj < nrows, W8 if W8 % 4 == 1 else 0), W8)


@triton.jit
def _stream_split(w_ptr, Kd, row0, nrows, x_ptr, x_stride, m0, M, k_lo, k_hi,
                  BNS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, S: tl.constexpr,
                  s_ptr=0, W8: tl.constexpr = 0):
    """``_stream_folded``'s result for a swapped stream (``_w_dot``; 16-bit dtypes, a 16-row tile):
    every k-chunk split S ways into a batched dot ``[S, BM, BK/S] @ [S, BK/S, BNS]``, whose batch
    dimension Triton spreads over the warps, so that with S = num_warps each warp takes its own
    k-slice of both operands - one swapped dot of BNS = 16 to 32 weight rows would have every warp
    read the whole activation chunk. The S fp32 partial sums are added after the k-loop. W8 /
    s_ptr: the weight format and row scales (module docstring)."""
    tl.static_assert(BK % S == 0 and BK // S >= 16, "each k-slice is a whole number of 16-column MMA steps")
    DT: tl.constexpr = x_ptr.dtype.element_ty
    KS: tl.constexpr = BK // S
    rj = tl.arange(0, BNS)
    rows = row0 + rj
    wmask = rj < nrows
    rm = m0 + tl.arange(0, BM)
    ks = tl.arange(0, S)[:, None] * KS + tl.arange(0, KS)[None, :]  # [S, KS]: slice s holds columns s*KS..
    sc = _row_scale(s_ptr, rows, wmask, W8)
    acc = tl.zeros([S, BM, BNS], dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=ST):
        kk = k0 + ks
        w = tl.load(w_ptr + rows[None, :, None] * Kd + kk[:, None, :],
                    mask=wmask[None, :, None] & (kk[:, None, :] < k_hi), other=0.0, eviction_policy=W_EVICT)
        w = _w_operand(w, sc, DT, W8)  # (sc[:, None] broadcasts over the slices)
        x = tl.load(x_ptr + rm[None, :, None] * x_stride + kk[:, None, :],
                    mask=(rm[None, :, None] < M) & (kk[:, None, :] < k_hi), other=0.0, cache_modifier=".cg")
        acc = tl.dot(x, tl.permute(w, (0, 2, 1)), acc)
    return _acc_scaled(tl.trans(tl.sum(acc, axis=0)), sc, W8)


@triton.jit
def _stream_tile(wrow, rmask, x_ptr, x_stride, rm, rm2, M, k_lo, k_hi,
                 BNS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                 BM2: tl.constexpr, ST: tl.constexpr, sc=0, W8: tl.constexpr = 0):
    """acc[BNS, BM] = W[rows, k_lo:k_hi] @ X[rm, k_lo:k_hi]^T: the weight rows (pointers ``wrow``,
    valid where ``rmask``) streamed through a pipelined k-loop against one tile of activation rows
    ``rm`` (valid below M), fp32 accumulation (IEEE-precision for fp32 inputs). BM2 > 0: each
    weight chunk also meets a second, narrower tile ``rm2`` (acc2 [BNS, BM2]), so that BM + BM2
    rows (e.g. 128 + 32 for 160 rows) cost no padding to the next power of two; with BM2 = 0
    acc2 is acc (unused). ST: the k-loop's software-pipeline depth (stages). W8 / sc: the weight
    format and the rows' scales [BNS] (module docstring)."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
    SWAP: tl.constexpr = W8 % 16 >= 8 and BM <= SWAP_ROWS and BM2 == 0
    rk = tl.arange(0, BK)
    acc = _acc_init(BNS, BM, SWAP)
    if BM2 > 0:
        acc2 = tl.zeros([BNS, BM2], dtype=tl.float32)
    else:
        acc2 = acc
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=ST):
        kk = k0 + rk
        w = _w_chunk(wrow, k0, 1, rmask, k_hi, sc, DT, W8, BK, SWAP)
        acc = _w_dot(acc, w, _x_operand(x_ptr, x_stride, rm, kk, M, k_hi, SWAP), IEEE, SWAP)
        if BM2 > 0:
            acc2 = _mma(w, _x_chunk(x_ptr, x_stride, rm2, kk, M, k_hi), acc2, IEEE)
    acc = _acc_scaled(_acc_rows(acc, SWAP), sc, W8)
    if BM2 > 0:
        acc2 = _acc_scaled(acc2, sc, W8)
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
    (pid * RP + r) * Kd, step 1. PACK (``plan.pack_slabs``): each program's RP-row slab stored
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
               VEC: tl.constexpr, ST: tl.constexpr, FOLD: tl.constexpr = 1, STF: tl.constexpr = 0,
               s_ptr=0, W8: tl.constexpr = 0):
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
    FOLD > 1 (MODE < 4): the k-chunks folded that many ways (``_stream_folded``), or split that
    many ways where the dot is swapped (``_stream_split``), pipelined STF stages (0: ST).
    W8 / s_ptr: the weight format and row scales (QKV: of the [q; k; v] row space)."""
    for s0 in range(0, RP, BNS):
        rr, rmask, wrow = _slab_rows(pid, RP, s0, N, N2, Kd, w_ptr, w2_ptr, w3_ptr, MODE >= 4, BNS, VEC)
        for m0 in range(0, M, BM):
            rm = m0 + tl.arange(0, BM)
            if FOLD > 1:  # (not QKV: one weight matrix)
                row0 = pid * RP + s0
                if W8 % 16 >= 8 and BM == 16:  # swapped: each k-chunk split FOLD ways
                    acc = _stream_split(w_ptr, Kd, row0, tl.minimum(RP - s0, N - row0), x_ptr, x_stride, m0, M, 0,
                                        KR, BNS, BM, BK, STF if STF > 0 else ST, FOLD, s_ptr, W8)
                else:
                    acc = _stream_folded(w_ptr, Kd, row0, tl.minimum(RP - s0, N - row0), x_ptr, x_stride, m0, M, 0,
                                         KR, BNS, BM, BK, IEEE, STF if STF > 0 else ST, FOLD, s_ptr, W8)
            else:
                acc, _ = _stream_tile(wrow, rmask, x_ptr, x_stride, rm, rm, M, 0, KR, BNS, BM, BK, IEEE, 0, ST,
                                      _row_scale(s_ptr, rr, rmask, W8), W8)
            _linear_out(acc, rr, rmask, rm, M, y_ptr, y_stride, res_ptr, res_stride, b_ptr, MODE % 4)


@triton.jit
def _ph_linear_ctx(pid, nprog, small, x_ptr, x_stride, M, w_ptr, N, Kd, y_ptr, y_stride, b_ptr, w2_ptr, w3_ptr, N2,
                   RP, MODE: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr, ST: tl.constexpr,
                   BMP: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr, STF: tl.constexpr,
                   BMC: tl.constexpr, BNSC: tl.constexpr, BKC: tl.constexpr, FOLDC: tl.constexpr,
                   STFC: tl.constexpr, s_ptr=0, W8: tl.constexpr = 0):
    """``_ph_linear`` (no residual) over the context step's new rows with the launch's tile BMP,
    or, where the launcher made a smaller one (BMC > 0, wide launches) and the rows fit in it
    (``small``, a run-time condition), with that tile and its own sub-slab, k-chunk and fold:
    the wide tile's padding and its short k-chunks cost batch 16's context fc 3x its stream.
    (The wide-tile call appears twice: with BMC = 0 the small tile's branch must not be built at
    all - a 0-row tile does not compile - so the run-time test sits inside a compile-time one.)"""
    if BMC > 0:
        if small:
            _ph_linear(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, Kd, y_ptr, y_stride, y_ptr, y_stride, b_ptr,
                       w2_ptr, w3_ptr, N2, RP, MODE, BMC, BNSC, BKC, IEEE, VEC, ST, FOLD=FOLDC, STF=STFC,
                       s_ptr=s_ptr, W8=W8)
        else:
            _ph_linear(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, Kd, y_ptr, y_stride, y_ptr, y_stride, b_ptr,
                       w2_ptr, w3_ptr, N2, RP, MODE, BMP, BNS, BK, IEEE, VEC, ST, FOLD=FOLD, STF=STF,
                       s_ptr=s_ptr, W8=W8)
    else:
        _ph_linear(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, Kd, y_ptr, y_stride, y_ptr, y_stride, b_ptr,
                   w2_ptr, w3_ptr, N2, RP, MODE, BMP, BNS, BK, IEEE, VEC, ST, FOLD=FOLD, STF=STF,
                   s_ptr=s_ptr, W8=W8)


@triton.jit
def _ph_linear_split(pid, nprog, x_ptr, x_stride, M, w_ptr, N, Kd, part_ptr, MR, w2_ptr, w3_ptr, N2, RP, SPL,
                     QKV: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                     VEC: tl.constexpr, BM2: tl.constexpr, ST: tl.constexpr, s_ptr=0, W8: tl.constexpr = 0):
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
                                         ST, _row_scale(s_ptr, rr, rmask, W8), W8)
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
               ST: tl.constexpr, PACK: tl.constexpr = False, sg_ptr=0, su_ptr=0, W8: tl.constexpr = 0):
    """act = silu(x Wg^T) * (x Wu^T), each op rounded to the compute dtype like the reference.
    One slab of RP rows of both matrices per program (sub-slabs of BNS rows, tiles of BM (+ BM2)
    activation rows, as in ``_ph_linear``), both matrices streamed in the same k-loop. PACK:
    both matrices are packed per slab (``_slab_base``). W8 / sg_ptr, su_ptr: both matrices' weight
    format and row scales."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
    SWAP: tl.constexpr = W8 % 16 >= 8 and BM <= SWAP_ROWS and BM2 == 0
    rk = tl.arange(0, BK)
    for s0 in range(0, RP, BNS):
        rp = s0 + tl.arange(0, BNS)
        rr = pid * RP + rp
        rmask = (rp < RP) & (rr < N)
        wgrow, kstep = _slab_base(wg_ptr, pid, RP, Kd, rp, PACK, BK)
        wurow, _ = _slab_base(wu_ptr, pid, RP, Kd, rp, PACK, BK)
        sgr = _row_scale(sg_ptr, rr, rmask, W8)
        sur = _row_scale(su_ptr, rr, rmask, W8)
        for m0 in range(0, M, BM + BM2):
            rm, rm2 = _row_tiles(m0, BM, BM2)
            acc_g = _acc_init(BNS, BM, SWAP)
            acc_u = _acc_init(BNS, BM, SWAP)
            if BM2 > 0:
                acc_g2 = tl.zeros([BNS, BM2], dtype=tl.float32)
                acc_u2 = tl.zeros([BNS, BM2], dtype=tl.float32)
            else:
                acc_g2 = acc_g
                acc_u2 = acc_u
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                kk = k0 + rk
                wg = _w_chunk(wgrow, k0, kstep, rmask, Kd, sgr, DT, W8, BK, SWAP)
                wu = _w_chunk(wurow, k0, kstep, rmask, Kd, sur, DT, W8, BK, SWAP)
                x = _x_operand(x_ptr, Kd, rm, kk, M, Kd, SWAP)
                acc_g = _w_dot(acc_g, wg, x, IEEE, SWAP)
                acc_u = _w_dot(acc_u, wu, x, IEEE, SWAP)
                if BM2 > 0:
                    x2 = _x_chunk(x_ptr, Kd, rm2, kk, M, Kd)
                    acc_g2 = _mma(wg, x2, acc_g2, IEEE)
                    acc_u2 = _mma(wu, x2, acc_u2, IEEE)
            _gateup_out(_acc_scaled(_acc_rows(acc_g, SWAP), sgr, W8), _acc_scaled(_acc_rows(acc_u, SWAP), sur, W8),
                        rr, rmask, rm, M, y_ptr, N)
            if BM2 > 0:
                _gateup_out(_acc_scaled(acc_g2, sgr, W8), _acc_scaled(acc_u2, sur, W8), rr, rmask, rm2, M, y_ptr, N)


@triton.jit
def _ph_qkv_hidden(pid, nprog, R, x_ptr, H, wq_ptr, wk_ptr, wv_ptr, NQ, NKVD, qh_ptr, RP,
                   BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr,
                   ST: tl.constexpr, s_ptr=0, W8: tl.constexpr = 0):
    """EAGLE-3's next-depth QKV, hidden half, ahead of time: its input is
    ``[norm(embed(token)) | hidden_norm(parent's hidden)]``, and the second half depends only on
    the parent row, which is one of this depth's R rows. So ``qh[p] = x[p] @ Wqkv[:, H:2H]^T``
    (fp32, x = hidden_norm of this depth's output rows) is streamed during MERGE, while the
    ranking keeps a few programs busy and the rest would wait at the barrier; the next QKV
    streams only the embedding half and adds ``qh[parent]`` (``_ph_linear`` MODE 7). Slabs of
    RP rows go to the programs after the R that merge rows (all programs, after their rows,
    when the grid is too small for that). With power-of-two scales (W8 1) each half is scaled
    on its own: s*a + s*b = s*(a + b) exactly."""
    NT = NQ + 2 * NKVD
    S = tl.cdiv(NT, RP)
    off = tl.where(R + S <= nprog, R, 0)
    if pid >= off:
        for v in range(pid - off, S, nprog - off):  # slab v: _ph_linear's QKV mode, stored in fp32
            _ph_linear(v, nprog, x_ptr, H, R, wq_ptr + H, NQ, 2 * H, H, qh_ptr, NT, qh_ptr, NT, qh_ptr,
                       wk_ptr + H, wv_ptr + H, NKVD, RP, 4, BM, BNS, BK, IEEE, VEC, ST, s_ptr=s_ptr, W8=W8)
