"""fp8 heads on the triton backend: the e4m3 streams draft the bits of the dequantized head.

An fp8 head's value is its dequantized weights (``DraftWeights.dequantized``). With the same
k-chunks summed in the same order (the tiny heads here get the same chunking in both formats)
the triton launch over the e4m3 bytes must equal, bit for bit, the launch over the dequantized
weights (under the interpreter; on a GPU in fp32, whose IEEE dots add in k order) - in both
kernel forms (power-of-two scales on the accumulator; any scale dequantized in registers) and
on every launch shape (narrow, wide split-K, unpacked, the QKV hidden half ahead, two tiles whose
e4m3 bytes are read as words). In 16-bit dtypes the fp8 fc / o_proj / down streams of 16-row
tiles split their k-chunks where the plain ones fold them (another order of the same sums):
there the launches agree to rounding. In fp32 the trees also equal torch_ref's on the fp8 head. GPU-only tests add bf16 and
the real launch modes.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import triton
import triton.language as tl

import frontier
from frontier import Drafter, InputError, frontier_generate
from frontier.backends.triton.fp8 import (
    BF16_BITS, FP8_DEQUANT, FP8_EXACT, PACK_WORDS, PLAIN, SWAP_DOT, StreamFormats, stream_formats,
)
from frontier.backends.triton.kernels.stream import (
    _e4m3_bf16, _e4m3_words, _row_scale, _stream_split, _stream_tile, _w_chunk,
)
from frontier.backends.triton.launch import Launcher
from frontier.backends.triton.tuning import Tuning
from frontier.random_head import random_config, random_inputs, random_weights
from frontier.weights import FP8, quantize_fp8

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"

pytestmark = pytest.mark.skipif(
    not (INTERPRET or HAS_CUDA) or frontier.get_backend("triton").availability()[0] is False,
    reason="triton backend unavailable here",
)

HEADS = {
    "eagle3": dict(vocab_size=64, target_vocab_size=100, total_token=12, depth=3, top_k=3),
    "eagle2": dict(vocab_size=40, total_token=9, depth=2, top_k=3, hidden_size=40, num_attention_heads=5,
                   num_key_value_heads=1, intermediate_size=56),
}
LAUNCHES = {  # launch shapes of the GPU, on the interpreter's tiny heads
    "narrow": Tuning(),
    "wide": Tuning(bm_max=16, wide_bm=16, wide_acc_elems=256, split_rows=64),
    "unpacked": Tuning(pack_weights=False, lin_fold=1),
    "ahead": Tuning(grid=12, BM=32, wide_bm=64),  # EAGLE-3's QKV hidden half streamed during MERGE
    "tile64": Tuning(BM=64, wide_bm=128),  # a narrow launch of one 64-row tile: the widest swapped one
    # a wide launch whose tree rows (36) fp8 streams take as one swapped 64-row tile (plain: 32 + 16)
    "wide64": Tuning(bm_max=64, wide_bm=16, wide_acc_elems=512, split_rows=64),
    # a wide launch of two tiles (batch 22: 66 tree rows, 64 + 16): no dot is swapped, and in 16-bit
    # dtypes the e4m3 bytes are read four to a word
    "two_tiles": Tuning(),
}


def _head(arch, dtype, power_of_two, seed=0):
    cfg = random_config(architecture=arch, **HEADS[arch])
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, dtype=dtype, device=DEVICE)
    return cfg, w.quantized(power_of_two=power_of_two)


def _draft_sequence(cfg, w, seed, tuning, chunks=(6, 2), batch=1):
    """Two calls per sequence on one cache each; ``batch`` sequences per call."""
    out, caches, c = [], None, 0
    inputs = [random_inputs(cfg, context=sum(chunks), seed=seed + b, dtype=w.dtype) for b in range(batch)]
    for n in chunks:
        frs = frontier_generate(cfg, [f[:, c:c + n].to(DEVICE) for _, f in inputs], backend="triton",
                                input_ids=[ids[:, : c + n + 1].to(DEVICE) for ids, _ in inputs], weights=w,
                                cache=caches, tuning=tuning, padded=True)
        caches = [fr.cache for fr in frs]
        out.append(frs)
        c += n
    return out


def _assert_identical(a_calls, b_calls):
    for a_frs, b_frs in zip(a_calls, b_calls):
        for a, b in zip(a_frs, b_frs):
            assert torch.equal(a.draft_tokens, b.draft_tokens)
            assert torch.equal(a.retrieve_indices, b.retrieve_indices)
            assert torch.equal(a.tree_mask, b.tree_mask)
            assert torch.equal(a.scores, b.scores)
            n = a.cache.length
            assert n == b.cache.length
            assert torch.equal(a.cache.k[:, :, :n], b.cache.k[:, :, :n])
            assert torch.equal(a.cache.v[:, :, :n], b.cache.v[:, :, :n])


# (architecture, dtype, power-of-two scales, launch, batch)
_slow = pytest.mark.slow
BITS = [
    ("eagle3", torch.float32, True, "narrow", 1),
    pytest.param("eagle3", torch.float32, False, "narrow", 1, marks=_slow),
    ("eagle3", torch.float16, True, "narrow", 1),  # (batch 1 as shipped: packed, swapped dots)
    pytest.param("eagle3", torch.float16, False, "ahead", 1, marks=_slow),
    pytest.param("eagle3", torch.float32, True, "ahead", 1, marks=_slow),
    ("eagle3", torch.float16, True, "wide", 2),
    ("eagle3", torch.float16, True, "tile64", 2),
    ("eagle3", torch.float16, True, "wide64", 12),
    pytest.param("eagle3", torch.float16, True, "two_tiles", 22, marks=_slow),
    pytest.param("eagle3", torch.float16, False, "two_tiles", 22, marks=_slow),
    pytest.param("eagle3", torch.float32, False, "wide", 2, marks=_slow),
    ("eagle3", torch.float16, False, "unpacked", 1),
    ("eagle2", torch.float32, True, "narrow", 1),
    pytest.param("eagle2", torch.float16, False, "wide", 2, marks=_slow),
]


@pytest.mark.parametrize("arch,dtype,pow2,launch,batch", BITS)
def test_fp8_streams_draw_the_bits_of_the_dequantized_head(arch, dtype, pow2, launch, batch):
    if dtype.itemsize == 2 and not INTERPRET:  # (the GPU tests below compare with torch_ref up to near-ties)
        pytest.skip("16-bit dots on tensor cores may round the sums of scaled and unscaled weights apart")
    cfg, q = _head(arch, dtype, pow2, seed=len(arch) + batch)
    tuning = LAUNCHES[launch]
    tiles = Launcher(cfg, dtype, torch.device(DEVICE), tuning).plan(batch).const
    if dtype.itemsize == 2 and 16 in (tiles["BMP"], tiles["BMP_B"]):
        # 16-row tiles: the fp8 streams would split the k-chunks the plain ones fold; both off
        tuning = dataclasses.replace(tuning, lin_fold=1)
    form = stream_formats(q, dtype)
    # 16-bit dtypes: the swapped dot on one tile of up to 64 rows; words where no dot is swapped,
    # for streams whose rows start on 16 bytes (all of the EAGLE-3 head's, not all of EAGLE-2's)
    swap = SWAP_DOT if dtype.itemsize == 2 else 0
    assert {f & ~PACK_WORDS for f in vars(form).values()} == {(FP8_EXACT if pow2 else FP8_DEQUANT) + swap}
    if arch == "eagle3":
        assert {bool(f & PACK_WORDS) for f in vars(form).values()} == {dtype.itemsize == 2}
    plain = Launcher(cfg, dtype, torch.device(DEVICE), tuning).plan(batch).const
    fp8 = Launcher(cfg, dtype, torch.device(DEVICE), tuning, form).plan(batch).const
    if launch == "wide64":  # the fp8 launch's one swapped tile against the plain launch's two
        assert (fp8["BM"], fp8["BM2"], plain["BM"], plain["BM2"]) == (64, 0, 32, 16)
    if launch == "two_tiles":  # two tiles: the tree depths' streams read words
        assert (fp8["BM"], fp8["BM2"], fp8["SPLITK"], fp8["LM_WIDE"]) == (64, 16, True, True)
    chunks = [k for k in plain if k.startswith("BK")]
    assert {k: plain[k] for k in chunks} == {k: fp8[k] for k in chunks}  # the same k-chunks: the same sums
    _assert_identical(_draft_sequence(cfg, q, 11, tuning, batch=batch),
                      _draft_sequence(cfg, q.dequantized(), 11, tuning, batch=batch))


@triton.jit
def _split_kernel(w_ptr, x_ptr, s_ptr, y_ptr, Kd, N, M, RP, K_LO, K_HI,
                  BNS: tl.constexpr, BK: tl.constexpr, S: tl.constexpr, W8: tl.constexpr):
    """Program p: rows [p * RP, p * RP + RP) of W[:, K_LO:K_HI] @ X[:, K_LO:K_HI]^T (``_stream_split``)."""
    row0 = tl.program_id(0) * RP
    nrows = tl.minimum(RP, N - row0)
    acc = _stream_split(w_ptr, Kd, row0, nrows, x_ptr, Kd, 0, M, K_LO, K_HI, BNS, 16, BK, 2, S, s_ptr, W8)
    rj = tl.arange(0, BNS)
    rm = tl.arange(0, 16)
    tl.store(y_ptr + rm[None, :] * N + (row0 + rj)[:, None], acc, mask=(rj[:, None] < nrows) & (rm[None, :] < M))


@pytest.mark.parametrize("pow2", [True, False])
def test_split_stream_is_the_dot_of_the_dequantized_weights(pow2):
    """``_stream_split`` alone: slabs of 20 rows on 32-row tiles (the last one 16 rows), 10 of
    16 activation rows, a k-range [24, 290) of 300 columns (k-chunks of 128, the last one cut),
    8 k-slices of 16 columns: the fp32 product of the activations and the dequantized weights
    (the sums in another order: to fp32 rounding)."""
    g = torch.Generator().manual_seed(3)
    n, kd, m, rp, k_lo, k_hi = 56, 300, 10, 20, 24, 290
    q, sc = quantize_fp8((torch.randn(n, kd, generator=g) * 0.05).to(DEVICE), power_of_two=pow2)
    deq = (q.float() * sc[:, None]).half()
    x = torch.randn(m, kd, generator=g).half().to(DEVICE)
    y = torch.zeros(m, n, dtype=torch.float32, device=DEVICE)
    w8 = (FP8_EXACT if pow2 else FP8_DEQUANT) + SWAP_DOT
    _split_kernel[(-(-n // rp),)](q, x, sc, y, kd, n, m, rp, k_lo, k_hi, BNS=32, BK=128, S=8, W8=w8)
    ref = x[:, k_lo:k_hi].float() @ deq[:, k_lo:k_hi].float().T
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@triton.jit
def _tile_kernel(w_ptr, x_ptr, s_ptr, y_ptr, Kd, N, M, RP, K_LO, K_HI,
                 BNS: tl.constexpr, BM: tl.constexpr, BM2: tl.constexpr, BK: tl.constexpr, W8: tl.constexpr):
    """Program p: rows [p * RP, p * RP + RP) of W[:, K_LO:K_HI] @ X[:, K_LO:K_HI]^T for two activation
    tiles (``_stream_tile``), rounded to X's dtype."""
    rj = tl.arange(0, BNS)
    rr = tl.program_id(0) * RP + rj
    rmask = (rj < RP) & (rr < N)
    rm = tl.arange(0, BM)
    rm2 = BM + tl.arange(0, BM2)
    acc, acc2 = _stream_tile(w_ptr + rr * Kd, rmask, x_ptr, Kd, rm, rm2, M, K_LO, K_HI, BNS, BM, BK, False, BM2, 2,
                             _row_scale(s_ptr, rr, rmask, W8), W8)
    DT = x_ptr.dtype.element_ty
    tl.store(y_ptr + rm[None, :] * N + rr[:, None], acc.to(DT), mask=rmask[:, None] & (rm[None, :] < M))
    tl.store(y_ptr + rm2[None, :] * N + rr[:, None], acc2.to(DT), mask=rmask[:, None] & (rm2[None, :] < M))


@pytest.mark.parametrize("pow2", [True, False])
def test_word_reads_of_unswapped_fp8_tiles_are_the_dequantized_dot(pow2):
    """``_stream_tile`` on two activation tiles (32 + 16 rows: the dot is not swapped), e4m3 bytes
    read four to an int32 word (``PACK_WORDS``): slabs of 20 rows, 40 of 48 activation rows, a
    k-range [32, 272) of 304 columns in k-chunks of 128 (the last one cut): the same bits as the
    byte reads, and under the interpreter as the stream over the dequantized fp16 weights (a GPU's
    tensor cores may round the sums of the scaled weights otherwise); the fp32 product to fp16
    rounding."""
    g = torch.Generator().manual_seed(4)
    n, kd, m, rp, k_lo, k_hi = 56, 304, 40, 20, 32, 272
    q, sc = quantize_fp8((torch.randn(n, kd, generator=g) * 0.05).to(DEVICE), power_of_two=pow2)
    deq = (q.float() * sc[:, None]).half()
    x = torch.randn(m, kd, generator=g).half().to(DEVICE)
    base = (FP8_EXACT if pow2 else FP8_DEQUANT) + SWAP_DOT
    out = []
    for w, w8 in [(q, base + PACK_WORDS), (q, base)] + ([(deq, PLAIN)] if INTERPRET else []):
        y = torch.zeros(m, n, dtype=torch.float16, device=DEVICE)
        _tile_kernel[(-(-n // rp),)](w, x, sc, y, kd, n, m, rp, k_lo, k_hi, BNS=32, BM=32, BM2=16, BK=128, W8=w8)
        out.append(y)
    assert all(torch.equal(out[0], o) for o in out[1:])
    ref = (x[:, k_lo:k_hi].float() @ deq[:, k_lo:k_hi].float().T).half()
    torch.testing.assert_close(out[0], ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype,pow2", [(torch.float16, False), (torch.float32, True),
                                        pytest.param(torch.float16, True, marks=_slow)])
def test_fp8_embedding_qkv_table_drafts_the_bits_of_the_qkv_stream(dtype, pow2):
    """An fp8 head's embedding-QKV table (``kernels.table``) is made by the QKV stream's own fp8
    form (16-bit dtypes: the swapped dot; scales applied or dequantized as that stream applies
    them): over two calls on one cache the launch that reads it drafts the trees, scores and
    cache rows of the launch that streams that half, bit for bit; a QKV scale written in place
    (clear_memo() too, which drops the concatenated QKV scales) makes it again."""
    cfg, q = _head("eagle3", dtype, pow2, seed=5)
    form = stream_formats(q, dtype)
    plan = Launcher(cfg, dtype, torch.device(DEVICE), LAUNCHES["narrow"], form).plan(1)
    off = dataclasses.replace(LAUNCHES["narrow"], emb_table_mb=0)  # (the tuning that streams that half)
    assert plan.tab and not Launcher(cfg, dtype, torch.device(DEVICE), off, form).plan(1).tab
    assert plan.const["W8_QKV"] & SWAP_DOT == (SWAP_DOT if dtype.itemsize == 2 else 0)
    _assert_identical(_draft_sequence(cfg, q, 3, LAUNCHES["narrow"]), _draft_sequence(cfg, q, 3, off))
    k_scale = q.scales["midlayer.self_attn.k_proj.weight"]
    with torch.no_grad():
        k_scale.mul_(2.0)  # (a power of two: the stream format stays)
    q.clear_memo()
    _assert_identical(_draft_sequence(cfg, q, 3, LAUNCHES["narrow"]), _draft_sequence(cfg, q, 3, off))


@pytest.mark.parametrize("arch,pow2,launch,batch", [("eagle3", True, "narrow", 1), ("eagle2", False, "narrow", 1),
                                                    pytest.param("eagle3", False, "narrow", 1, marks=_slow),
                                                    pytest.param("eagle3", True, "wide", 2, marks=_slow)])
def test_fp16_fp8_split_streams_agree_with_the_folded_launch(arch, pow2, launch, batch):
    """fp16 (a 16-bit dtype with the interpreter's dot): the fp8 fc / o_proj / down streams of a
    16-row tile (batch 1; the context step's o_proj and down in wide launches) split each k-chunk
    up to ``Tuning.swap_split`` ways (``_stream_split``), where the plain streams fold it. The same
    sums in another order: the trees equal the dequantized head's folded launch, scores and new
    cache rows agree to fp16 rounding."""
    cfg, q = _head(arch, torch.float16, pow2, seed=7)
    tuning = LAUNCHES[launch]
    plain = Launcher(cfg, torch.float16, torch.device(DEVICE), tuning).plan(batch).const
    fp8 = Launcher(cfg, torch.float16, torch.device(DEVICE), tuning, stream_formats(q, torch.float16)).plan(batch).const
    assert fp8["W8_D"] & SWAP_DOT and fp8["BMP_B"] == 16 and plain["FOLD_D"] > 1 and fp8["FOLD_D"] > 1
    tile = {"FOLD_FC": fp8["BMP"], "FOLD_O": fp8["BMP_B"], "FOLD_D": fp8["BMP_B"]}
    for k, bm in tile.items():
        bk = fp8["BK" + k[4:]]
        assert fp8[k] == 1 or (bm == 16 and bk // fp8[k] >= 16 and fp8[k] <= tuning.swap_split)
    a = _draft_sequence(cfg, q, 21, tuning, batch=batch)
    b = _draft_sequence(cfg, q.dequantized(), 21, tuning, batch=batch)
    for a_frs, b_frs in zip(a, b):
        for x, y in zip(a_frs, b_frs):
            assert x.same_tree(y)
            torch.testing.assert_close(x.scores, y.scores, rtol=2e-3, atol=1e-3)
            n = x.cache.length
            torch.testing.assert_close(x.cache.k[:, :, :n], y.cache.k[:, :, :n], rtol=2e-3, atol=1e-3)
            torch.testing.assert_close(x.cache.v[:, :, :n], y.cache.v[:, :, :n], rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_fp32_fp8_head_matches_torch_ref(arch):
    cfg, q = _head(arch, torch.float32, True, seed=5)
    ids, feats = random_inputs(cfg, context=9, seed=6)
    cache_r = cache_t = None
    c = 0
    for n in (6, 3):
        kw = dict(input_ids=ids[:, : c + n + 1].to(DEVICE), weights=q)
        ref = frontier_generate(cfg, feats[:, c:c + n].to(DEVICE), backend="torch_ref", cache=cache_r, **kw)
        tri = frontier_generate(cfg, feats[:, c:c + n].to(DEVICE), backend="triton", cache=cache_t, **kw)
        assert ref.same_tree(tri), (ref.draft_tokens.tolist(), tri.draft_tokens.tolist())
        torch.testing.assert_close(ref.scores.cpu(), tri.scores.cpu(), rtol=0, atol=1e-4)
        cache_r, cache_t, c = ref.cache, tri.cache, c + n


def test_stream_formats_follow_the_scales_and_the_compute_dtype():
    cfg, w = _head("eagle3", torch.float32, True)
    plain = random_weights(cfg, seed=0, device=DEVICE)
    assert stream_formats(plain, torch.float32) == StreamFormats()
    assert stream_formats(w, torch.float32) == StreamFormats(*[FP8_EXACT] * 6)
    # a scale that is no power of two: that stream is dequantized in registers, the rest stay exact
    lm = w.scales["lm_head.weight"]
    with torch.no_grad():
        lm[0] = lm[0] * 1.5
    assert stream_formats(w, torch.float32).lm == FP8_DEQUANT  # (the in-place write is seen)
    assert stream_formats(w, torch.float32).qkv == FP8_EXACT
    # powers of two whose products fall below fp16's range are not exact in fp16
    _, h = _head("eagle3", torch.float16, True)
    with torch.no_grad():
        h.scales["fc.weight"].fill_(2.0 ** -16)  # (the e4m3 quantum 2^-9 times it: 2^-25 < fp16's 2^-24)
        h.scales["midlayer.mlp.down_proj.weight"].fill_(2.0 ** -15)  # 2^-24: exact
    form = stream_formats(h, torch.float16)
    both = SWAP_DOT + PACK_WORDS
    assert form.fc == FP8_DEQUANT + both and form.d == FP8_EXACT + both and form.o == FP8_EXACT + both


def test_word_reads_only_where_every_row_starts_on_16_bytes():
    _, h = _head("eagle3", torch.float16, True)
    assert all(f & PACK_WORDS for f in vars(stream_formats(h, torch.float16)).values())
    assert not any(f & PACK_WORDS for f in vars(stream_formats(h.to(dtype=torch.float32), torch.float32)).values())
    lm = h.lm_head
    shifted = torch.empty(lm.numel() + 4, dtype=torch.uint8, device=lm.device)[4:].view(FP8).view(lm.shape)
    shifted.copy_(lm)  # the same bytes, 4 bytes off a 16-byte boundary
    h.lm_head = shifted
    form = stream_formats(h, torch.float16)
    assert form.lm == FP8_EXACT + SWAP_DOT and form.gu == FP8_EXACT + SWAP_DOT + PACK_WORDS
    # EAGLE-3's QKV streams its hidden half on its own: its rows of 80 bytes (2 x 40) read bytes
    cfg = random_config(architecture="eagle3", **dict(HEADS["eagle3"], hidden_size=40, num_attention_heads=2,
                                                      num_key_value_heads=1, intermediate_size=48))
    q = random_weights(cfg, seed=1, dtype=torch.float16, device=DEVICE).quantized()
    form = stream_formats(q, torch.float16)
    assert form.qkv == form.o == form.lm == FP8_EXACT + SWAP_DOT and form.d == FP8_EXACT + SWAP_DOT + PACK_WORDS


def test_bf16_on_a_gpu_converts_e4m3_with_integer_ops(monkeypatch):
    _, w = _head("eagle3", torch.float32, True)
    bf = w.to(dtype=torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # (the format is chosen for a GPU launch; nothing runs)
    both = SWAP_DOT + PACK_WORDS
    assert stream_formats(bf, torch.bfloat16) == StreamFormats(*[FP8_EXACT + BF16_BITS + both] * 6)
    assert (stream_formats(bf.dequantized().quantized(power_of_two=False), torch.bfloat16).lm
            == FP8_DEQUANT + BF16_BITS + both)
    # only bf16 has the bit form; every 16-bit dtype swaps the dot, fp32 keeps its IEEE dot as it is
    assert stream_formats(w.to(dtype=torch.float16), torch.float16).fc == FP8_EXACT + both
    assert stream_formats(w, torch.float32).fc == FP8_EXACT
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert stream_formats(bf, torch.bfloat16).fc == FP8_EXACT + both


def test_a_stream_mixing_fp8_and_plain_matrices_is_refused():
    cfg, w = _head("eagle3", torch.float32, True)
    k = "midlayer.self_attn.k_proj.weight"
    w.layers[0].k_proj = w.dequantized().layers[0].k_proj
    del w.scales[k]
    w.validate(cfg)  # a valid head: torch_ref drafts it
    ids, feats = random_inputs(cfg, context=5, seed=1)
    frontier_generate(cfg, feats.to(DEVICE), input_ids=ids.to(DEVICE), weights=w, backend="torch_ref")
    with pytest.raises(InputError, match="k_proj.*one matrix.*torch_ref"):
        frontier_generate(cfg, feats.to(DEVICE), input_ids=ids.to(DEVICE), weights=w, backend="triton")


def test_fp8_streams_size_their_k_chunks_by_fp8_stage_bytes():
    """On the GPU's launch shape (132 programs) an fp8 stream's stage holds ``fp8_stage_bytes`` of
    weights: at 16 KB the bf16 stream's elements (half its bytes); at 32 KB twice them."""
    from frontier.bench import PRESETS

    cfg = frontier.FrontierConfig(total_token=60, depth=7, top_k=10, architecture="eagle3",
                                  **PRESETS["eagle3-llama3.1-8b"])
    tn = Tuning(grid=132, fp8_stage_bytes=16384)
    form = StreamFormats(*[FP8_EXACT] * 6)
    plain = Launcher(cfg, torch.bfloat16, torch.device("cpu"), tn).plan(1)
    fp8 = Launcher(cfg, torch.bfloat16, torch.device("cpu"), tn, form).plan(1)
    big = Launcher(cfg, torch.bfloat16, torch.device("cpu"), Tuning(grid=132, fp8_stage_bytes=32768), form).plan(1)
    for bk, bns in (("BK_QKV", "BNS_QKV"), ("BK_GU", "BNS_GU"), ("BK_LM", "BNS_LM")):
        assert fp8.const[bns] == plain.const[bns] == big.const[bns]
        assert fp8.const[bk] == plain.const[bk] and big.const[bk] == 2 * plain.const[bk]
    assert fp8.const["W8_LM"] == FP8_EXACT and plain.const["W8_LM"] == PLAIN


def test_the_drafter_drafts_fp8_heads_as_frontier_generate_does():
    cfg, q = _head("eagle3", torch.float32, False, seed=3)
    d = Drafter(cfg, q, backend="triton", max_batch=2, max_context=24, device=DEVICE)
    g = torch.Generator().manual_seed(4)
    ids = [torch.randint(0, cfg.target_vocab_size, (1, n + 1), generator=g).to(DEVICE) for n in (7, 5)]
    feats = [torch.randn(1, n, cfg.feature_size, generator=g).to(DEVICE) for n in (7, 5)]
    refs = [frontier_generate(cfg, f, input_ids=i, weights=q, backend="triton", padded=True,
                              cache_max_length=d.max_context) for f, i in zip(feats, ids)]
    for slot, (f, i) in enumerate(zip(feats, ids)):
        d.prefill(slot, f, i)
    new_ids = [torch.randint(0, cfg.target_vocab_size, (1, n), generator=g).to(DEVICE) for n in (2, 3)]
    new_feats = [torch.randn(1, n, cfg.feature_size, generator=g).to(DEVICE) for n in (2, 3)]
    for slot in range(2):
        d.stage(slot, new_feats[slot], new_ids[slot][0])
    d.draft(2)
    steps = frontier_generate(cfg, new_feats, input_ids=[torch.cat([i, n], 1) for i, n in zip(ids, new_ids)],
                              weights=q, backend="triton", cache=[r.cache for r in refs], padded=True)
    for slot, ref in enumerate(steps):
        fr = d.frontier(slot)
        assert fr.same_tree(ref) and torch.equal(fr.scores, ref.scores)
        assert not bool(fr.invalid)


# ---------------------------------------------------------------------------------------------- GPU
@triton.jit
def _convert_kernel(x_ptr, y_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(y_ptr + r, _e4m3_bf16(tl.load(x_ptr + r)))


@pytest.mark.gpu
def test_gpu_integer_e4m3_to_bf16_is_exact_for_every_byte():
    x = torch.arange(256, dtype=torch.int32, device="cuda").to(torch.uint8).view(FP8)
    y = torch.empty(256, dtype=torch.bfloat16, device="cuda")
    _convert_kernel[(1,)](x, y, N=256)
    finite = (torch.arange(256, device="cuda") & 0x7F) != 0x7F  # 0x7F / 0xFF are NaN
    assert torch.equal(y.view(torch.int16)[finite], x.to(torch.bfloat16).view(torch.int16)[finite])


@triton.jit
def _chunk_kernel(w_ptr, s_ptr, y_ptr, R, ROW_STEP, K0, K_HI, KSTEP, BNS: tl.constexpr, BK: tl.constexpr,
                  W8: tl.constexpr):
    """``_w_chunk``'s unswapped operand [BNS, BK] at column K0 of rows ``w_ptr + r * ROW_STEP``
    (valid below R), chunk step KSTEP (1 row-major; the slab's rows when packed), to y."""
    rj = tl.arange(0, BNS)
    rmask = rj < R
    w = _w_chunk(w_ptr + rj * ROW_STEP, K0, KSTEP, rmask, K_HI, _row_scale(s_ptr, rj, rmask, W8), tl.float16, W8,
                 BK, False)
    tl.store(y_ptr + rj[:, None] * BK + tl.arange(0, BK)[None, :], w)


@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("packed", [False, True], ids=["row-major", "packed"])
def test_word_chunks_are_the_byte_chunks_and_stop_at_the_row_end(pow2, packed):
    """``_w_chunk`` reading words and reading bytes gives the same fp16 operand: 20 valid rows of a
    32-row tile, the chunk at column 256 of rows of 304 columns (k-chunks of 64: the last one
    cut at 304), row-major or packed per chunk ([chunk, rows, 64], the padding past column 304
    filled with e4m3 ones): the converted (power-of-two scales) or dequantized weights, and zero
    past the rows and past the row end."""
    g = torch.Generator().manual_seed(5)
    rows, kd, bk, k0 = 20, 304, 64, 256
    q, sc = quantize_fp8((torch.randn(rows, kd, generator=g) * 0.05).to(DEVICE), power_of_two=pow2)
    if packed:  # [chunks, rows, bk], chunk c holding columns c*bk..
        pad = torch.full((rows, 5 * bk), 0x38, dtype=torch.uint8, device=DEVICE).view(FP8)  # 0x38: 1.0
        pad[:, :kd] = q
        mat, row_step, kstep = pad.view(rows, 5, bk).transpose(0, 1).contiguous(), bk, rows
    else:
        mat, row_step, kstep = q, kd, 1
    base = (FP8_EXACT if pow2 else FP8_DEQUANT) + SWAP_DOT
    got = []
    for w8 in (base + PACK_WORDS, base):
        y = torch.full((32, bk), 7.0, dtype=torch.float16, device=DEVICE)
        _chunk_kernel[(1,)](mat, sc, y, rows, row_step, k0, kd, kstep, BNS=32, BK=bk, W8=w8)
        got.append(y)
    want = torch.zeros(32, bk, dtype=torch.float16, device=DEVICE)
    vals = q[:, k0:kd].float() * (1.0 if pow2 else sc[:, None])
    want[:rows, : kd - k0] = vals.half()
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], want)


@triton.jit
def _words_kernel(x_ptr, y_ptr, N: tl.constexpr, W8: tl.constexpr):
    p = tl.load(x_ptr + tl.arange(0, N // 4)[None, :])  # [1, N / 4] int32 words
    tl.store(y_ptr + tl.arange(0, N)[None, :], _e4m3_words(p, tl.bfloat16, W8))


@pytest.mark.parametrize("bits", [pytest.param(False, id="triton-ops"),
                                  pytest.param(True, id="integer-ops", marks=pytest.mark.gpu)])
def test_word_conversion_is_exact_for_every_byte_in_memory_order(bits):
    """``_e4m3_words`` on the 256 bytes as 64 int32 words: element i is byte i, exactly converted
    (the NaN bytes aside), with Triton's conversion or (GPU) the integer ops of ``_e4m3_bf16``."""
    if bits and not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    x = torch.arange(256, dtype=torch.int32, device=DEVICE).to(torch.uint8)
    y = torch.empty(256, dtype=torch.bfloat16, device=DEVICE)
    _words_kernel[(1,)](x.view(torch.int32), y, N=256, W8=FP8_EXACT + (BF16_BITS if bits else 0))
    finite = (torch.arange(256, device=DEVICE) & 0x7F) != 0x7F  # 0x7F / 0xFF are NaN
    assert torch.equal(y.view(torch.int16)[finite], x.view(FP8).to(torch.bfloat16).view(torch.int16)[finite])


def _medium(arch="eagle3"):
    return random_config(architecture=arch, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=1408, vocab_size=4000, target_vocab_size=16000 if arch == "eagle3" else None,
                         total_token=60, depth=6, top_k=10)


@pytest.mark.gpu
@pytest.mark.parametrize("arch,pow2,mode", [("eagle3", True, "graph"), ("eagle3", True, "persistent"),
                                            ("eagle3", False, "graph"), ("eagle2", True, "graph")])
def test_gpu_fp32_fp8_medium_head_matches_torch_ref(arch, pow2, mode):
    cfg = _medium(arch)
    for seed in range(3):
        q = random_weights(cfg, seed=seed, device="cuda", lm_head_scale=6.0).quantized(power_of_two=pow2)
        ids, feats = random_inputs(cfg, context=70, seed=seed + 100, device="cuda")
        cr = ct = None
        c = 0
        for n in (64, 6):
            kw = dict(input_ids=ids[:, : c + n + 1], weights=q, padded=True)
            ref = frontier_generate(cfg, feats[:, c:c + n], backend="torch_ref", cache=cr, **kw)
            tri = frontier_generate(cfg, feats[:, c:c + n], backend="triton", cache=ct, mode=mode, **kw)
            assert ref.same_tree(tri), f"seed {seed} call {n}"
            cr, ct, c = ref.cache, tri.cache, c + n


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pow2", [True, False])
def test_gpu_half_fp8_differences_are_near_ties_of_the_reference(dtype, pow2):
    """bf16/fp16: triton's fp8 trees equal torch_ref's on the same fp8 head except where the
    reference's own scores nearly tie (frontier.parity.near_tie_report), as for 16-bit heads."""
    from frontier.parity import near_tie_report

    cfg = _medium()
    reports = []
    for seed in range(6):
        q = random_weights(cfg, seed=seed, device="cuda", dtype=dtype, lm_head_scale=6.0).quantized(power_of_two=pow2)
        assert q.layers[0].q_proj.dtype == FP8
        ids, feats = random_inputs(cfg, context=68, seed=seed + 1000, device="cuda", dtype=dtype)
        cr = ct = None
        c = 0
        for n in (64, 4):
            kw = dict(input_ids=ids[:, : c + n + 1], weights=q, trace=True)
            r = frontier_generate(cfg, feats[:, c:c + n], backend="torch_ref", cache=cr, **kw)
            t = frontier_generate(cfg, feats[:, c:c + n], backend="triton", cache=ct, **kw)
            reports.append(near_tie_report(r, t, cfg))
            cr, ct, c = r.cache, t.cache, c + n
    assert all(rep.explained for rep in reports), [str(rep) for rep in reports if not rep.explained]


@pytest.mark.gpu
@pytest.mark.parametrize("pow2", [True, False])
def test_gpu_batched_bf16_fp8_drafts_are_the_reference_up_to_near_ties(pow2):
    """Batch 8 in bf16: 80 tree rows on tiles of 64 + 16, where no fp8 dot is swapped and the
    e4m3 bytes are read as words. Every sequence's tree equals torch_ref's on the same fp8 head
    except where the reference's own scores nearly tie."""
    from frontier.parity import near_tie_report

    cfg = _medium()
    q = random_weights(cfg, seed=3, device="cuda", dtype=torch.bfloat16, lm_head_scale=6.0).quantized(power_of_two=pow2)
    plan = Launcher(cfg, torch.bfloat16, torch.device("cuda"), Tuning(), stream_formats(q, torch.bfloat16)).plan(8)
    assert plan.const["BM2"] > 0 and plan.const["W8_GU"] & PACK_WORDS and plan.const["W8_LM"] & PACK_WORDS
    inputs = [random_inputs(cfg, context=40 + 3 * b, seed=200 + b, device="cuda", dtype=torch.bfloat16)
              for b in range(8)]
    kw = dict(input_ids=[ids for ids, _ in inputs], weights=q, trace=True)
    ref = frontier_generate(cfg, [f for _, f in inputs], backend="torch_ref", **kw)
    tri = frontier_generate(cfg, [f for _, f in inputs], backend="triton", **kw)
    reports = [near_tie_report(r, t, cfg) for r, t in zip(ref, tri)]
    assert all(rep.explained for rep in reports), [str(rep) for rep in reports if not rep.explained]


@pytest.mark.gpu
def test_gpu_captured_drafter_replays_fp8_drafts():
    cfg = _medium()
    q = random_weights(cfg, seed=2, device="cuda", dtype=torch.bfloat16, lm_head_scale=6.0).quantized()
    d = Drafter(cfg, q, backend="triton", max_batch=2, max_context=96, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    for slot, n in enumerate((40, 33)):
        ids = torch.randint(0, cfg.target_vocab_size, (1, n + 1), generator=g, device="cuda")
        d.prefill(slot, torch.randn(1, n, cfg.feature_size, generator=g, device="cuda").bfloat16(), ids)
    for slot in range(2):
        d.stage(slot, torch.randn(1, 3, cfg.feature_size, generator=g, device="cuda").bfloat16(),
                torch.randint(0, cfg.target_vocab_size, (3,), generator=g, device="cuda"))
    d.draft(2, commit=False)
    eager = [d.frontier(s).draft_tokens.clone() for s in range(2)]
    d.replay(2, commit=False)
    d.replay(2, commit=False)
    assert all(torch.equal(d.frontier(s).draft_tokens, eager[s]) for s in range(2))
