"""triton backend: integer outputs identical to torch_ref in fp32 (IEEE dots), over call sequences
sharing one cache, both architectures, with d2t, greedy and sampling.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest) on tiny heads, one launch per
schedule entry; on a GPU the same device code also runs as one persistent launch.

One file because its tests share the ragged-batch and drafting helpers at the top and the kernel
probes at the bottom; each part follows the kernels' modules (streams, attention, lm_head and
MERGE, selection, launch modes).
"""

from __future__ import annotations

import gc
import os
import warnings

import pytest
import torch

import frontier
from frontier import frontier_generate
from frontier.errors import BackendUnavailableError, InputError, KernelError
from frontier.random_head import random_config, random_inputs, random_weights

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()

pytestmark = pytest.mark.skipif(
    not (INTERPRET or HAS_CUDA) or frontier.get_backend("triton").availability()[0] is False,
    reason="triton backend unavailable here",
)

DEVICE = "cuda" if HAS_CUDA else "cpu"
NARROW32 = dict(BM=32, wide_bm=64)  # Tuning of a narrow launch of one 32-row tile (wide_bm above it)

# (architecture, config overrides, sampling) - tiny heads with odd sizes
CASES = [
    ("eagle3", dict(vocab_size=64, target_vocab_size=100, total_token=12, depth=3, top_k=3), False),
    ("eagle3", dict(vocab_size=50, total_token=10, depth=2, top_k=4, hidden_size=48, num_attention_heads=6,
                    num_key_value_heads=3, intermediate_size=40), True),
    ("eagle2", dict(vocab_size=64, total_token=12, depth=3, top_k=3), False),
    ("eagle2", dict(vocab_size=40, total_token=9, depth=2, top_k=3, hidden_size=40, num_attention_heads=5,
                    num_key_value_heads=1, intermediate_size=56), True),
]


def _sequence(cfg, w, ids, feats, backend, chunks, sampling, device=DEVICE, **opts):
    """Run one draft call per chunk of new rows, each on the previous call's cache."""
    out, cache, c = [], None, 0
    for n in chunks:
        fr = frontier_generate(cfg, feats[:, c:c + n].to(device), backend=backend, input_ids=ids[:, : c + n + 1].to(device),
                               weights=w, cache=cache, sampling=sampling, **opts)
        cache = fr.cache
        c += n
        out.append(fr)
    return out


def _assert_same(ref_list, tri_list, cfg):
    for call, (a, b) in enumerate(zip(ref_list, tri_list)):
        assert a.same_tree(b), (
            f"call {call}: draft_tokens ref {a.draft_tokens.tolist()} triton {b.draft_tokens.tolist()}\n"
            f"scores ref {a.scores.tolist()}\n       tri {b.scores.tolist()}"
        )
        torch.testing.assert_close(a.scores.cpu(), b.scores.cpu(), rtol=0, atol=1e-4)
        assert a.cache.length == b.cache.length
        n = a.cache.length
        torch.testing.assert_close(a.cache.k[:, :, :n].cpu(), b.cache.k[:, :, :n].cpu(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.cache.v[:, :, :n].cpu(), b.cache.v[:, :, :n].cpu(), rtol=1e-4, atol=1e-5)
        b.check_invariants(total_token=cfg.total_token, depth=cfg.depth, top_k=cfg.top_k)


@pytest.mark.parametrize("arch,over,sampling", CASES)
def test_fp32_sequence_matches_torch_ref(arch, over, sampling):
    cfg = random_config(architecture=arch, **over)
    seed = 7 + len(arch) + over["top_k"]
    w = random_weights(cfg, seed=seed, device=DEVICE)
    ids, feats = random_inputs(cfg, context=9, seed=seed + 1)
    chunks = [6, 2, 1]
    ref = _sequence(cfg, w, ids, feats, "torch_ref", chunks, sampling)
    tri = _sequence(cfg, w, ids, feats, "triton", chunks, sampling)
    _assert_same(ref, tri, cfg)


def test_fp32_padded_and_deep_tree_matches():
    # a sharper head gives deep trees: exercises every ancestor slot of the implicit mask
    cfg = random_config(total_token=14, depth=4, top_k=3, vocab_size=48, target_vocab_size=96)
    w = random_weights(cfg, seed=3, lm_head_scale=12.0, device=DEVICE)
    ids, feats = random_inputs(cfg, context=5, seed=4)
    ref = _sequence(cfg, w, ids, feats, "torch_ref", [5], False, padded=True)
    tri = _sequence(cfg, w, ids, feats, "triton", [5], False, padded=True)
    assert int(ref[0].tree_position_ids.max()) >= 3
    _assert_same(ref, tri, cfg)
    assert torch.equal(ref[0].retrieve_indices.cpu(), tri[0].retrieve_indices.cpu())


def test_failed_call_leaves_cache_unchanged():
    cfg = random_config()
    w = random_weights(cfg, seed=1, device=DEVICE)
    ids, feats = random_inputs(cfg, context=6, seed=2)
    fr = frontier_generate(cfg, feats[:, :4].to(DEVICE), backend="triton", input_ids=ids[:, :5].to(DEVICE), weights=w)
    cache = fr.cache
    k0, v0, length = cache.k.clone(), cache.v.clone(), cache.length
    with pytest.raises(InputError, match="mode"):
        frontier_generate(cfg, feats[:, 4:].to(DEVICE), backend="triton", input_ids=ids.to(DEVICE), weights=w,
                          cache=cache, mode="bogus")
    assert cache.length == length and torch.equal(cache.k, k0) and torch.equal(cache.v, v0)


def test_pack_weights_option_picks_a_drafter_without_packed_copies():
    """Option ``pack_weights=False`` drafts with a drafter that streams the weights as they are
    (no packed copies: ``Launcher.packed_bytes`` 0) and the same trees bit for bit; a value that
    is not a bool is refused by name, and the cache is left as it was."""
    cfg = random_config(total_token=10, depth=2, top_k=3)
    w = random_weights(cfg, seed=5, device=DEVICE)
    ids, feats = random_inputs(cfg, context=7, seed=6)
    be = frontier.get_backend("triton")
    outs = {}
    for pack in (True, False):
        fr = frontier_generate(cfg, feats[:, :6].to(DEVICE), backend="triton", input_ids=ids[:, :7].to(DEVICE),
                               weights=w, pack_weights=pack)
        outs[pack] = fr
        assert (be.drafter(cfg, w.dtype, torch.device(DEVICE), pack).packed_bytes > 0) == pack
    assert torch.equal(outs[True].draft_tokens, outs[False].draft_tokens)
    assert torch.equal(outs[True].retrieve_indices, outs[False].retrieve_indices)
    cache = outs[True].cache
    k0, length = cache.k.clone(), cache.length
    with pytest.raises(InputError, match="pack_weights must be True or False, got 'no'"):
        frontier_generate(cfg, feats[:, 6:].to(DEVICE), backend="triton", input_ids=ids.to(DEVICE), weights=w,
                          cache=cache, pack_weights="no")
    assert cache.length == length and torch.equal(cache.k, k0)


def test_registration_is_idempotent_and_attributes():
    from frontier.backends.triton import TritonBackend, register_triton_backend

    register_triton_backend()
    register_triton_backend()
    be = frontier.get_backend("triton")
    assert isinstance(be, TritonBackend)
    assert be.requires_weights
    if INTERPRET:
        assert "cpu" in be.devices and torch.bfloat16 not in be.dtypes
    assert be.availability() == (True, "")


@pytest.mark.skipif(not INTERPRET, reason="interpreter-only rule")
@pytest.mark.parametrize("mode", ["persistent", "graph"])
def test_gpu_only_modes_refused_under_interpreter(mode):
    """The persistent launch (its grid barrier would spin) and graph mode (CUDA graphs) need a GPU."""
    cfg = random_config()
    w = random_weights(cfg, seed=1)
    ids, feats = random_inputs(cfg, context=4, seed=2)
    with pytest.raises(InputError, match=mode):
        frontier_generate(cfg, feats, backend="triton", input_ids=ids, weights=w, mode=mode)


def test_fallback_to_torch_ref_when_unavailable(monkeypatch):
    from frontier.backends.triton.backend import TritonBackend

    monkeypatch.setattr(TritonBackend, "availability", lambda self: (False, "no CUDA device"))
    cfg = random_config()
    w = random_weights(cfg, seed=5)
    ids, feats = random_inputs(cfg, context=4, seed=6)
    with pytest.raises(BackendUnavailableError, match="no CUDA device"):
        frontier_generate(cfg, feats, backend="triton", input_ids=ids, weights=w)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fr = frontier_generate(cfg, feats, backend="triton", input_ids=ids, weights=w, fallback=True)
    assert any("falling back" in str(r.message) for r in rec)
    ref = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    assert fr.same_tree(ref)


def test_multilayer_eagle2_is_refused_clearly():
    cfg = random_config(architecture="eagle2", num_layers=2)
    w = random_weights(cfg, seed=1, device=DEVICE)
    ids, feats = random_inputs(cfg, context=4, seed=2)
    with pytest.raises(InputError, match="num_layers=2"):
        frontier_generate(cfg, feats.to(DEVICE), backend="triton", input_ids=ids.to(DEVICE), weights=w)


# ----------------------------------------------------------------------------------------------
# GPU only: the persistent launch, the bounded barrier, larger heads
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("arch,over,sampling", CASES)
@pytest.mark.parametrize("mode", ["persistent", "steps"])
def test_gpu_fp32_modes_match_torch_ref(arch, over, sampling, mode):
    cfg = random_config(architecture=arch, **over)
    w = random_weights(cfg, seed=11, device="cuda")
    ids, feats = random_inputs(cfg, context=9, seed=12)
    ref = _sequence(cfg, w, ids, feats, "torch_ref", [6, 2, 1], sampling, device="cuda")
    tri = _sequence(cfg, w, ids, feats, "triton", [6, 2, 1], sampling, device="cuda", mode=mode)
    _assert_same(ref, tri, cfg)


def _medium_config(arch):
    """The GPU tests' medium head: H 256, 8 heads / 2 KV heads, K 10, depth 5, T 60 (EAGLE-3 with
    a d2t map onto a 3000-token target vocabulary)."""
    over = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=704,
                vocab_size=1000, total_token=60, depth=5, top_k=10)
    if arch == "eagle3":
        over["target_vocab_size"] = 3000
    return random_config(architecture=arch, **over)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_gpu_fp32_medium_head_matches(seed, arch):
    cfg = _medium_config(arch)
    w = random_weights(cfg, seed=seed, device="cuda", lm_head_scale=6.0)
    ids, feats = random_inputs(cfg, context=70, seed=seed + 100)
    ref = _sequence(cfg, w, ids, feats, "torch_ref", [64, 5, 1], seed % 2 == 1, device="cuda")
    tri = _sequence(cfg, w, ids, feats, "triton", [64, 5, 1], seed % 2 == 1, device="cuda")
    _assert_same(ref, tri, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("mode", ["graph", "persistent"])
def test_gpu_embedding_qkv_table_drafts_the_bits_of_the_qkv_stream(fp8, mode):
    """Compiled, in bf16 (an fp8 head: the table made by the swapped fp8 stream), a launch that
    reads the embedding-QKV table drafts the bits of one that streams the embedding half, over
    three calls (graph mode: launched, captured, replayed)."""
    from frontier.backends.triton.fp8 import stream_formats
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = _medium_config("eagle3")
    w = random_weights(cfg, seed=3, device="cuda", dtype=torch.bfloat16, lm_head_scale=6.0)
    if fp8:
        w = w.quantized(power_of_two=False)
    form = stream_formats(w, torch.bfloat16)
    seqs, _ = _ragged(cfg, 4, batch=1, lo=5, hi=12)
    on = Launcher(cfg, torch.bfloat16, torch.device("cuda"), Tuning(), form)
    off = Launcher(cfg, torch.bfloat16, torch.device("cuda"), Tuning(emb_table_mb=0), form)
    assert on.plan(1).tab and not off.plan(1).tab
    for call in range(3):
        _assert_same_bits(_launch_on(on, cfg, w, seqs, mode), _launch_on(off, cfg, w, seqs, mode))


@pytest.mark.gpu
def test_gpu_barrier_timeout_raises_and_keeps_cache(monkeypatch):
    cfg = random_config()
    w = random_weights(cfg, seed=1, device="cuda")
    ids, feats = random_inputs(cfg, context=6, seed=2)
    fr = frontier_generate(cfg, feats[:, :4].cuda(), backend="triton", input_ids=ids[:, :5].cuda(), weights=w)
    cache = fr.cache
    k0, length = cache.k.clone(), cache.length
    monkeypatch.setenv("FRONTIER_TRITON_MAX_SPIN", "0")
    with pytest.raises(KernelError, match="barrier"):
        frontier_generate(cfg, feats[:, 4:].cuda(), backend="triton", input_ids=ids.cuda(), weights=w, cache=cache,
                          mode="persistent")
    assert cache.length == length
    assert torch.equal(cache.k[:, :, :length], k0[:, :, :length])


@pytest.mark.gpu
def test_gpu_barrier_holds_every_program_and_drafts_as_separate_launches():
    """With every program's global-timer stamps (``timing=2``): no program leaves a grid barrier
    before the last one has reached it, and each program's stamps run in order; the persistent
    launch drafts the tree of the same schedule run as separate launches (no barrier at all) on
    fresh caches."""
    from frontier.backends.triton.launch import Tuning

    cfg = random_config(total_token=18, depth=3, top_k=4, vocab_size=90, target_vocab_size=150)
    w = random_weights(cfg, seed=71, lm_head_scale=6.0, device="cuda")
    seqs, _ = _ragged(cfg, 72, batch=3, lo=3, hi=9)
    tn = Tuning()
    ref = _draft_tuned(cfg, w, seqs, tn)[1]
    d, got = _draft_tuned(cfg, w, seqs, tn, mode="persistent", timing=2)
    d.check_error()
    start, arrive, leave = d.program_stamps()
    assert arrive.shape == leave.shape == (d.n_steps, d.grid) and start.shape == (d.grid,)
    assert bool((leave.min(dim=1).values >= arrive.max(dim=1).values).all())  # nobody left early
    assert bool((arrive[0] >= start).all() and (leave >= arrive).all() and (arrive[1:] >= leave[:-1]).all())
    _assert_same_launch(ref, got)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow)])
def test_kernel_tree_packing_equals_pack_tree(seed):
    # the final phase packs the tree itself (greedy); pack="torch" uses frontier.tree.pack_tree
    cfg = random_config(total_token=11 + seed, depth=3 + seed % 2, top_k=3, vocab_size=40)
    w = random_weights(cfg, seed=seed, lm_head_scale=(2.0, 8.0, 30.0)[seed], device=DEVICE)
    ids, feats = random_inputs(cfg, context=4, seed=seed + 9)
    for padded in (False, True):
        a = _sequence(cfg, w, ids, feats, "triton", [4], False, padded=padded)[0]
        b = _sequence(cfg, w, ids, feats, "triton", [4], False, padded=padded, pack="torch")[0]
        for x, y in zip((a.draft_tokens, a.retrieve_indices, a.tree_mask, a.tree_position_ids, a.leaf_count),
                        (b.draft_tokens, b.retrieve_indices, b.tree_mask, b.tree_position_ids, b.leaf_count)):
            assert x.shape == y.shape and torch.equal(x.cpu(), y.cpu())
        a.check_invariants(total_token=cfg.total_token, depth=cfg.depth, top_k=cfg.top_k, sampling=False)


def test_padded_layout_and_rope_scaling_match_torch_ref():
    """Padded retrieve_indices is [T, D+2] on every backend, also when T-1 < D+1 (raw tensors
    compared, padding included), and a head with linear rope scaling drafts like torch_ref."""
    for t, d, k, extra in ((2, 4, 2, {}), (4, 5, 1, {}), (12, 3, 3, {"rope_scaling": {"type": "linear", "factor": 2.0}})):
        cfg = random_config(total_token=t, depth=d, top_k=k, vocab_size=40, target_vocab_size=90, hidden_size=32,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, **extra)
        w = random_weights(cfg, seed=t, lm_head_scale=6.0, device=DEVICE)
        ids, feats = random_inputs(cfg, context=7, seed=t, device=DEVICE)
        ref = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w, padded=True)
        tri = frontier_generate(cfg, feats, backend="triton", input_ids=ids, weights=w, padded=True)
        assert tri.retrieve_indices.shape == (t, d + 2) == ref.retrieve_indices.shape
        assert torch.equal(tri.retrieve_indices.cpu(), ref.retrieve_indices.cpu())
        assert tri.same_tree(ref)


def test_top_k_above_one_tile_is_refused():
    cfg = random_config(total_token=20, depth=1, top_k=17, vocab_size=40, hidden_size=32, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=48)
    w = random_weights(cfg, seed=0, device=DEVICE)
    ids, feats = random_inputs(cfg, context=5, seed=0, device=DEVICE)
    with pytest.raises(frontier.InputError, match="top_k <= 16"):
        frontier_generate(cfg, feats, backend="triton", input_ids=ids, weights=w)


def test_failure_midway_through_the_schedule_leaves_the_cache_as_it_was(monkeypatch):
    """The kernel writes the new context rows' K/V before the call ends; a failure after that
    (here injected between two schedule steps) must leave the committed cache untouched."""
    from frontier.backends.triton import launch

    cfg = random_config()
    w = random_weights(cfg, seed=3, device=DEVICE)
    ids, feats = random_inputs(cfg, context=9, seed=4, device=DEVICE)
    fr = frontier_generate(cfg, feats[:, :5], backend="triton", input_ids=ids[:, :6], weights=w, mode="steps")
    cache = fr.cache
    length = cache.length
    k0, v0 = cache.k[:, :, :length].clone(), cache.v[:, :, :length].clone()
    original = launch.Launcher.run_batch

    def failing_run(self, *args, **kwargs):
        def hook(step):
            if step == self.n_steps - 2:  # after the context step wrote its cache rows
                raise RuntimeError("injected failure mid-schedule")

        kwargs["step_hook"] = hook
        return original(self, *args, **kwargs)

    monkeypatch.setattr(launch.Launcher, "run_batch", failing_run)
    with pytest.raises(RuntimeError, match="injected failure"):
        frontier_generate(cfg, feats[:, 5:], backend="triton", input_ids=ids, weights=w, cache=cache, mode="steps")
    assert cache.length == length
    assert torch.equal(cache.k[:, :, :length], k0) and torch.equal(cache.v[:, :, :length], v0)
    monkeypatch.undo()
    after = frontier_generate(cfg, feats[:, 5:], backend="triton", input_ids=ids, weights=w, cache=cache, mode="steps")
    fresh = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    assert after.same_tree(fresh) and cache.length == 9


# ----------------------------------------------------------------------------------------------
# batches: one launch drafts every sequence (the weight tiles are shared by all tree rows)
# ----------------------------------------------------------------------------------------------
def _ragged(cfg, seed, batch, lo, hi):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        big_l = int(torch.randint(lo, hi, (1,), generator=g))
        out.append((torch.randint(0, cfg.target_vocab_size, (1, big_l + 1), generator=g),
                    torch.randn(1, big_l, cfg.feature_size, generator=g)))
    return out, g


def _drafting_with(monkeypatch, d):
    """Every triton call of the test drafts with the drafter ``d`` (built with a tuning of its own)
    instead of the backend's own drafter for its head."""
    from frontier.backends.triton.backend import TritonBackend

    monkeypatch.setattr(TritonBackend, "drafter",
                        lambda self, cfg_, dtype, device, pack_weights=True, tuning=None, formats=None: d)


def _batch_vs_single(cfg, w, seqs, g, device, calls, sampling=False, **opts):
    """Drafts the ragged batch ``calls`` times (each sequence then gets 1..5 new rows) on separate
    per-sequence caches, and checks every sequence against torch_ref drafting it alone."""
    from frontier.cache import DraftCache

    ids = [s[0].to(device) for s in seqs]
    feats = [s[1].to(device) for s in seqs]
    caches = [DraftCache.fresh(cfg, context_length=64, dtype=w.dtype, device=device, max_length=128 + 17 * b)
              for b in range(len(seqs))]  # separate allocations of different lengths
    singles = [c.clone() for c in caches]
    for call in range(calls):
        frs = frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w, cache=caches, sampling=sampling, **opts)
        for b, fr in enumerate(frs):
            ref = frontier_generate(cfg, feats[b], "torch_ref", input_ids=ids[b], weights=w, cache=singles[b],
                                    sampling=sampling)
            _assert_same([ref], [fr], cfg)
        for b in range(len(seqs)):
            n = int(torch.randint(1, 6, (1,), generator=g))
            ids[b] = torch.cat([ids[b], torch.randint(0, cfg.target_vocab_size, (1, n), generator=g).to(device)], dim=1)
            feats[b] = torch.randn(1, n, cfg.feature_size, generator=g).to(device)
    return frs


def _arch_config(arch, target_vocab, **over):
    """A random head of ``arch``; EAGLE-3's maps its draft vocabulary onto ``target_vocab`` tokens."""
    if arch == "eagle3":
        over["target_vocab_size"] = target_vocab
    return random_config(architecture=arch, **over)


@pytest.mark.parametrize("seed", [31, pytest.param(47, marks=pytest.mark.slow)])
@pytest.mark.parametrize("arch,sampling", [("eagle3", False), ("eagle2", True)])
def test_batch_on_separate_caches_matches_torch_ref(arch, sampling, seed):
    cfg = _arch_config(arch, 120, total_token=14, depth=3, top_k=3, vocab_size=56)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, g = _ragged(cfg, seed + 1, batch=3 + seed % 3, lo=2, hi=11)
    _batch_vs_single(cfg, w, seqs, g, DEVICE, calls=2, sampling=sampling)


@pytest.mark.parametrize("arch,seed", [("eagle3", 63), pytest.param("eagle2", 63, marks=pytest.mark.slow),
                                      pytest.param("eagle3", 81, marks=pytest.mark.slow)])
def test_wide_launch_context_tile_matches_torch_ref(arch, seed, monkeypatch):
    """Wide launches run the context step's fc and QKV on their own smaller activation tile
    (``Tuning.ctx_rows``: BMC rows, own k-chunks and fold) when the call's new rows fit in it,
    and on the wide tile otherwise (the kernel chooses at run time): a first call of 21+ new rows
    (the wide tile) and later calls of at most 15 (the small one), each sequence as torch_ref
    drafts it alone."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = _arch_config(arch, 120, total_token=14, depth=3, top_k=8, vocab_size=56)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, g = _ragged(cfg, seed + 1, batch=3, lo=7, hi=12)
    tn = Tuning(bm_max=32, wide_bm=32, wide_acc_elems=512, split_rows=64, ctx_rows=2)
    d = Launcher(cfg, torch.float32, torch.device(DEVICE), tn)
    c = d.plan(3).const
    assert c["BMP"] == 32 and c["BMC"] == 16 and c["BK_FCC"] >= 16
    calls = []
    real = Launcher.run_batch

    def run_batch(self, weights, sq, *a, **kw):
        calls.append(sum(x.n for x in sq))
        return real(self, weights, sq, *a, **kw)

    monkeypatch.setattr(Launcher, "run_batch", run_batch)
    _drafting_with(monkeypatch, d)
    _batch_vs_single(cfg, w, seqs, g, DEVICE, calls=3)
    assert calls[0] > 16 and all(n <= 16 for n in calls[1:])  # the wide tile, then the small one


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's 2-program grid and step launches (GPU twin: "
                    "test_gpu_wide_context_step_builds_match_torch_ref)")
@pytest.mark.parametrize("arch,seed", [pytest.param("eagle3", 91, marks=pytest.mark.slow), ("eagle2", 93),
                                      pytest.param("eagle3", 95, marks=pytest.mark.slow)])
def test_context_step_builds_of_its_own_match_torch_ref(arch, seed, monkeypatch):
    """Step launches give the context step's phases over one row per sequence builds of their
    own (``LaunchPlan.ctx_const``): in wide plans gate/up and the lm_head on a tile of pow2(batch)
    rows with the register lm_head (whose partials that step's MERGE reads, not the wide
    launches' logits scratch), and the fused attention a query
    block of one row's heads; the tree depths keep the wide tile, the wide lm_head and a block of
    top_k rows. The unsplit o_proj and down (the context step's alone in wide plans) fold their
    k-chunks. Each sequence of a ragged batch drafts what torch_ref drafts for it alone, over
    three calls."""
    import frontier.backends.triton.launch as launch
    from frontier.backends.triton.kernels import CONTEXT_STEP, Phase
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = _arch_config(arch, 120, total_token=14, depth=3, top_k=8, vocab_size=56, hidden_size=64,
                       num_attention_heads=8)  # (4 query heads per KV head: 4 lanes a row)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, g = _ragged(cfg, seed + 1, batch=3, lo=2, hi=7)
    wide = dict(bm_max=32, wide_bm=32, wide_acc_elems=512)
    d = Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning(**wide))
    p = d.plan(3)
    c = p.const
    assert p.wide and p.fused and c["LM_WIDE"] and c["BM"] + c["BM2"] > 16 and c["BLOCK_Q"] == 32
    assert c["FOLD_O"] > 1 and c["FOLD_D"] > 1
    assert set(p.ctx_const) == {Phase.GATEUP, Phase.LMHEAD, Phase.MERGE, Phase.ATTN_F}
    assert not Launcher(cfg, torch.float32, torch.device(DEVICE)).plan(1).ctx_const  # narrow, split attention
    real = launch.drafter_kernel
    seen = []

    class Spy:  # records each launch's phase, depth and constants
        def __getitem__(self, grid):
            def run(**kw):
                seen.append((int(kw["sched_ptr"][0]), kw))
                return real[grid](**kw)
            return run

    monkeypatch.setattr(launch, "drafter_kernel", Spy())
    _drafting_with(monkeypatch, d)
    _batch_vs_single(cfg, w, seqs, g, DEVICE, calls=3)
    got = {}
    for code, kw in seen:
        ph, ctx = code // 256, code % 256 == CONTEXT_STEP
        if ph in (Phase.GATEUP, Phase.LMHEAD):
            got.setdefault((ph, ctx), set()).add((kw["BM"], kw["BM2"], kw["LM_WIDE"]))
        elif ph == Phase.ATTN_F:
            got.setdefault((ph, ctx), set()).add(kw["BLOCK_Q"])
    tree = {(c["BM"], c["BM2"], True)}
    assert got == {(Phase.GATEUP, True): {(16, 0, True)}, (Phase.LMHEAD, True): {(16, 0, False)},
                   (Phase.GATEUP, False): tree, (Phase.LMHEAD, False): tree,
                   (Phase.ATTN_F, True): {16}, (Phase.ATTN_F, False): {32}}


def test_batched_attention_over_tree_keys_of_several_blocks_matches_torch_ref(monkeypatch):
    """The fused (batched) attention takes a sequence's tree keys of every depth so far as
    dense blocks masked to each row's ancestors: the deepest step has more tree keys than one
    block holds (depth 5, top_k 4: 24 keys against the interpreter's blocks of 16; on a GPU,
    depth 7, top_k 9: 72 against 64), and each sequence of a ragged batch must still draft what
    torch_ref drafts for it alone. The grid is the interpreter's 2 programs on a GPU too: a batch
    of 3 takes the fused attention only where its items fill the grid."""
    from frontier.backends.triton.launch import Launcher, Tuning

    depth, top_k = (5, 4) if INTERPRET else (7, 9)
    cfg = random_config(total_token=20, depth=depth, top_k=top_k, vocab_size=56, target_vocab_size=100)
    w = random_weights(cfg, seed=57, lm_head_scale=6.0, device=DEVICE)
    seqs, g = _ragged(cfg, 58, batch=3, lo=2, hi=9)
    d = Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning(grid=2))
    p = d.plan(3)
    assert p.fused and (cfg.depth + 1) * cfg.top_k > p.const["BLOCK_NF"]
    _drafting_with(monkeypatch, d)
    _batch_vs_single(cfg, w, seqs, g, DEVICE, calls=2)


def test_batched_attention_takes_ancestors_as_blocks_or_gathers_alike():
    """``Tuning.tree_blocks`` (blocks in step launches, one gathered key per row and depth in the
    persistent launch, by default): both forms draft the same trees (scores to fp32 rounding:
    the dots sum in another order)."""
    from frontier.backends.triton.launch import Tuning

    cfg = random_config(total_token=20, depth=5, top_k=4, vocab_size=56, target_vocab_size=100)
    w = random_weights(cfg, seed=59, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, 60, batch=3, lo=2, hi=9)
    blocks = _draft_tuned(cfg, w, seqs, Tuning(tree_blocks=True))[1]
    _assert_same_launch(blocks, _draft_tuned(cfg, w, seqs, Tuning())[1])  # steps: blocks by default
    _assert_same_launch(blocks, _draft_tuned(cfg, w, seqs, Tuning(tree_blocks=False))[1])


def _draft_tuned(cfg, w, seqs, tn, mode="steps", timing=0):
    """One launch (``mode``: "steps", or "persistent" on a GPU, with ``timing`` stamps) of the
    ragged batch ``seqs`` (fresh caches) with tuning ``tn``: the drafter and (tokens, parents,
    scores, the SeqCalls with their caches)."""
    from frontier.backends.triton.launch import Launcher

    d = Launcher(cfg, w.dtype, torch.device(DEVICE), tn)
    return d, _launch_on(d, cfg, w, seqs, mode, timing)


def _with_consts(d, batch, **const):
    """Launcher ``d`` with its plan for ``batch`` changed by hand (constants of code paths that
    both exist in the kernel, e.g. 64-bit keys where the plan picks 32-bit ones)."""
    import dataclasses

    p = d.plan(batch)
    d._plans[next(k for k, v in d._plans.items() if v is p)] = dataclasses.replace(p, const=dict(p.const, **const))
    return d


def _launch_on(d, cfg, w, seqs, mode="steps", timing=0):
    """``_draft_tuned``'s launch on the drafter ``d`` (fresh caches): (tokens, parents, scores,
    the SeqCalls with their caches)."""
    from frontier.backends.triton.launch import SeqCall
    from frontier.cache import DraftCache

    calls = []
    for ids, feats in seqs:
        cache = DraftCache.fresh(cfg, context_length=16, dtype=w.dtype, device=DEVICE)
        calls.append(SeqCall(feats[0].to(DEVICE, w.dtype), ids[0, 1:].to(DEVICE), ids[0, -1:].to(DEVICE), cache, 0,
                             feats.shape[1]))
    d.alloc_outputs(len(calls))
    d.run_batch(w, calls, mode, timing=timing)
    return d.out_tok.clone(), d.out_par.clone(), d.out_score.clone(), calls


def _assert_same_launch(a, b, score_rtol=0.0):
    """Two launches' trees agree, their scores to 1e-5 (plus ``score_rtol``) and their new cache
    rows to fp32 rounding (tunings that cut or fold the k-chunks differently sum each dot in
    another order)."""
    (t0, p0, s0, c0), (t1, p1, s1, c1) = a, b
    assert torch.equal(t0, t1) and torch.equal(p0, p1)
    torch.testing.assert_close(s0, s1, rtol=score_rtol, atol=1e-5)
    for x, y in zip(c0, c1):  # the new rows' K/V reached each cache
        torch.testing.assert_close(x.cache.k[:, :, : x.n], y.cache.k[:, :, : y.n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x.cache.v[:, :, : x.n], y.cache.v[:, :, : y.n], rtol=1e-5, atol=1e-6)


def _assert_same_bits(a, b):
    """Two launches that sum every dot in the same order: trees, parents, scores and new cache
    rows equal bit for bit."""
    (t0, p0, s0, c0), (t1, p1, s1, c1) = a, b
    assert torch.equal(t0, t1) and torch.equal(p0, p1) and torch.equal(s0, s1)
    for x, y in zip(c0, c1):
        assert torch.equal(x.cache.k[:, :, : x.n], y.cache.k[:, :, : y.n])
        assert torch.equal(x.cache.v[:, :, : x.n], y.cache.v[:, :, : y.n])


def _assert_same_bits_across_tile_widths(a, b):
    """Two launches that sum every dot in the same order but multiply tiles of different widths
    (the context step's own builds against one build for every phase): bit for bit on the GPU,
    where a dot's sum for one output does not depend on the tile's width. Under the interpreter
    a dot is numpy's matmul, and OpenBLAS rounds a product of another width differently on some
    CPUs (seen on an AMD EPYC: fp32 16 x 32 by 32 x 16 against the first 16 columns of 32 x 64,
    2e-6 apart), so there the trees and parents must be equal and the scores and new cache rows
    agree to fp32 rounding (``_assert_same_launch``)."""
    if DEVICE == "cuda":
        _assert_same_bits(a, b)
    else:
        _assert_same_launch(a, b)


def test_batch_with_many_sub_slabs_and_row_tiles_matches_default_tuning():
    """Small accumulators force every weight phase through several sub-slabs and the 20 tree
    rows through two 16-row tiles: the lm_head's running max / sum / top-K merge across sub-slabs,
    the wide lm_head (logits scratch, statistics from there), the split-K reductions and the
    row-tile loops, and slabs of any row count (``slab_align=1``) must give the tokens and tree of
    16-row-aligned slabs (scores to 1e-5)."""
    from frontier.backends.triton.launch import Tuning

    cfg = random_config(total_token=18, depth=2, top_k=4, vocab_size=90, target_vocab_size=150)
    w = random_weights(cfg, seed=41, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, 42, batch=5, lo=3, hi=9)
    outs = []
    wide = Tuning(bm_max=16, wide_bm=16, wide_acc_elems=256, split_rows=64)
    # (the interpreter's 2-program grid makes every batch use the fused attention; the split
    # attention of small batches on big grids is forced by fused_attention=False)
    for tn in (Tuning(slab_align=16), Tuning(bm_max=16, acc_elems=256, fused_attention=False, slab_align=1), wide):
        d, out = _draft_tuned(cfg, w, seqs, tn)
        assert d.block_rows(len(seqs)) == (32 if tn.bm_max > 16 else 16)
        outs.append(out)
    for other in outs[1:]:
        _assert_same_launch(outs[0], other)
    # the wide launch split K in the tree depths' QKV / o_proj / down (its own schedule)
    from frontier.backends.triton.kernels import Phase
    from frontier.backends.triton.tuning import split_slab

    assert split_slab(cfg.hidden_size, cfg.intermediate_size, 2, 4, wide, 16, 256)[0] > 1
    from frontier.backends.triton.schedule import build_schedule

    assert Phase.RED_D * 256 not in build_schedule_codes(cfg, True)  # eagle3: the final norm sums down's parts
    assert Phase.RED_D * 256 in build_schedule("eagle2", cfg.depth, split_k=True)


@pytest.mark.parametrize("arch,seed", [("eagle3", 67), pytest.param("eagle2", 67, marks=pytest.mark.slow),
                                      pytest.param("eagle3", 85, marks=pytest.mark.slow)])
def test_phases_that_sum_split_k_partials_draft_what_unsplit_launches_draft(arch, seed):
    """Wide launches let the phase after each split-K phase sum its partials itself - RoPE the
    QKV's, the post-attention norm the o_proj's, eagle3's final norm down's - so only eagle2's
    down keeps a reduction phase (RED_D: no norm follows it); at the tree depths RoPE and the
    post-attention norm get one program per row. The trees, scores and cache rows are those of
    a narrow launch of the same batch (scores to fp32 rounding: split-K sums in another order)."""
    from frontier.backends.triton.kernels import CONTEXT_STEP, Phase
    from frontier.backends.triton.launch import Tuning

    cfg = _arch_config(arch, 150, total_token=18, depth=2, top_k=4, vocab_size=90)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, seed + 1, batch=5, lo=3, hi=9)
    d, wide = _draft_tuned(cfg, w, seqs, Tuning(bm_max=16, wide_bm=16, wide_acc_elems=256, split_rows=64))
    sched = [c // 256 for c in d.schedule_list]
    assert d.plan(len(seqs)).wide
    assert (Phase.RED_D in sched) == (arch == "eagle2")
    tree_rows = [g for c, g in zip(d.schedule_list, d.step_grid_list)
                 if c // 256 in (Phase.ROPE, Phase.NORM_POST) and c % 256 != CONTEXT_STEP]
    assert tree_rows and all(g == len(seqs) * cfg.top_k for g in tree_rows)
    d, narrow = _draft_tuned(cfg, w, seqs, Tuning(wide_bm=64))  # (32 rows: narrow below 64-row tiles)
    assert not d.plan(len(seqs)).wide
    _assert_same_launch(narrow, wide, score_rtol=2e-5)


def test_each_stream_sizes_its_k_chunk_for_its_own_pipeline_depth():
    """``Tuning.lin_stages / gu_stages / lm_stages`` set the software-pipeline depth of each
    weight stream's k-loop (the kernel's ST_LIN / ST_GU / ST_LM). ``slab`` must fit all of a
    phase's stages in shared memory (deeper pipelines get shorter k-chunks, never longer), the
    launch plan must carry each depth, and the k-chunks the depths choose must not change what
    is drafted (a tiny shared-memory budget forces different chunks per phase here; other
    chunks sum each dot in another order, so the new cache rows agree to fp32 rounding)."""
    from frontier.backends.triton.launch import Launcher, Tuning
    from frontier.backends.triton.tuning import slab

    tn = Tuning()
    prev = None
    for stages in (2, 3, 4, 6):
        _, bns, bk = slab(4096, 14336, 132, 2, 1, tn, 16, stages=stages)
        assert stages * (bns + 16) * bk * 2 <= tn.smem_bytes
        assert prev is None or bk <= prev
        prev = bk
    cfg = random_config(total_token=18, depth=2, top_k=4, vocab_size=90, target_vocab_size=150)
    deep = Tuning(lin_stages=2, gu_stages=6, lm_stages=5, smem_bytes=24576)
    c = Launcher(cfg, torch.float32, torch.device(DEVICE), deep).plan(3).const
    assert (c["ST_LIN"], c["ST_GU"], c["ST_LM"]) == (2, 6, 5)
    assert c["BK_GU"] < Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning()).plan(3).const["BK_GU"]
    w = random_weights(cfg, seed=43, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, 44, batch=3, lo=3, hi=9)
    _assert_same_launch(_draft_tuned(cfg, w, seqs, Tuning())[1], _draft_tuned(cfg, w, seqs, deep)[1])


def _fold_config(arch="eagle3"):
    """A tiny head whose fc / o_proj / down all fold (k-chunks of 64-256 columns)."""
    over = dict(target_vocab_size=130) if arch == "eagle3" else {}
    return random_config(architecture=arch, total_token=16, depth=2, top_k=4, vocab_size=72, hidden_size=64,
                         intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, **over)


@pytest.mark.parametrize("arch", ["eagle3", pytest.param("eagle2", marks=pytest.mark.slow)])
def test_folded_linear_streams_match_unfolded_and_torch_ref(arch):
    """``Tuning.lin_fold`` folds each k-chunk of the unsplit fc / o_proj / down streams F ways
    (``kernels._stream_folded``: a taller dot whose diagonal blocks are summed after the
    k-loop). Sizes here let every one of them fold (k-chunks of 64-128 columns); folds of 2 and
    4 must draft the unfolded launch's trees and cache rows (to fp32 rounding: the dots sum in
    another order), and the default tuning torch_ref's trees; the plan folds only where a fold
    keeps 16 columns and the folded accumulator stays small."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = _fold_config(arch)
    w = random_weights(cfg, seed=53, lm_head_scale=6.0, device=DEVICE)
    seqs, g = _ragged(cfg, 54, batch=2, lo=3, hi=9)
    # the plan checks pin the interpreter's grid of 2 (slab heights, and so the folds, follow the grid)
    plans = {f: Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning(lin_fold=f, grid=2)).plan(2).const
             for f in (1, 2, 4)}
    assert all(plans[1][k] == 1 for k in ("FOLD_FC", "FOLD_O", "FOLD_D"))
    for f in (2, 4):
        c = plans[f]
        for fk, bk in (("FOLD_FC", "BK_FC"), ("FOLD_O", "BK_O"), ("FOLD_D", "BK_D")):
            assert c[fk] in (1, 2, 4) and c[fk] <= f and c[bk] // c[fk] >= 16
        assert c["FOLD_D"] == f and c["FOLD_O"] == f  # this config folds the tree depths' o_proj and down
    # a fold that does not fit steps down to the largest power of two that does: down's 128-column
    # chunks keep 16 columns up to a fold of 8, whose accumulator (8^2 x 32 x 16) is too big
    big = Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning(lin_fold=64, grid=2)).plan(2).const
    assert (big["BK_D"], big["BNS_D"], big["BMP"], big["FOLD_D"]) == (128, 32, 16, 4)
    base = _draft_tuned(cfg, w, seqs, Tuning(lin_fold=1))[1]
    for f in (2, 4):  # (scores near 2 differ by up to 1.3e-5 in the eagle2 head)
        _assert_same_launch(base, _draft_tuned(cfg, w, seqs, Tuning(lin_fold=f))[1], score_rtol=2e-5)
    # a wide launch (many rows) keeps the fc on the tree rows' tile unfolded; its unsplit o_proj and
    # down serve only the context step's one row per sequence (the tree depths split K) on a tile of
    # BMP_B rows, and fold as a narrow launch of that tile does
    wide = Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning(wide_bm=16, grid=2)).plan(2)
    c = wide.const
    assert wide.wide and c["SPLITK"] and c["BMP_B"] == 16 and c["FOLD_FC"] == 1
    assert (c["FOLD_O"], c["FOLD_D"]) == (plans[4]["FOLD_O"], plans[4]["FOLD_D"]) == (4, 4)
    _batch_vs_single(cfg, w, seqs, g, DEVICE, calls=2)


def test_folded_streams_pipeline_depth_follows_the_activation_tile():
    """``Tuning.fold_stages`` pipelines the folded streams deeper (the kernel's ST_FOLD) only
    where their activation tile has 64 rows or more (batch 9 x top_k 4 = 36 rows here, in a
    narrow launch: ``wide_bm`` above its tile), and only if every folded stream's stages then fit
    in shared memory; otherwise, and at 16-row tiles, they keep the linear phases' depth."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = _fold_config()
    seen = set()
    for smem in (225280, 120000, 90000):
        tn = Tuning(smem_bytes=smem, grid=2, wide_bm=128)  # the interpreter's grid (slab heights follow the grid)
        d = Launcher(cfg, torch.float32, torch.device(DEVICE), tn)
        narrow = d.plan(2).const
        assert narrow["BMP"] == 16 and narrow["FOLD_D"] == 4 and narrow["ST_FOLD"] == narrow["ST_LIN"] == 3
        c = d.plan(9).const
        assert c["BMP"] == 64 and c["FOLD_D"] == 2 and c["ST_LIN"] == 3
        fits = all(c["FOLD_" + k] == 1 or 4 * (c["BNS_" + k] + 64) * c["BK_" + k] * 4 <= smem for k in ("FC", "O", "D"))
        assert c["ST_FOLD"] == (4 if fits else 3)
        seen.add(c["ST_FOLD"])
    assert seen == {3, 4}  # 90 KB cannot hold four 64-column stages of 32 + 64 fp32 rows
    no_deeper = Tuning(fold_stages=None, grid=2, wide_bm=128)
    assert Launcher(cfg, torch.float32, torch.device(DEVICE), no_deeper).plan(9).const["ST_FOLD"] == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("seed", [81, 91])
def test_gpu_deeper_folded_pipeline_drafts_alike(seed):
    """On the GPU the pipeline depth changes when each k-chunk arrives, not what is summed:
    four stages of the folded streams (batch 9, a narrow launch's 64-row tiles, folds of 2) draft
    the same trees, scores and cache rows as three, and each sequence as torch_ref drafts it alone."""
    from frontier.backends.triton.launch import Tuning

    cfg = _fold_config()
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device="cuda")
    seqs, g = _ragged(cfg, seed + 1, batch=9, lo=3, hi=9)
    d3, a = _draft_tuned(cfg, w, seqs, Tuning(fold_stages=3, wide_bm=128), mode="persistent")
    d4, b = _draft_tuned(cfg, w, seqs, Tuning(fold_stages=4, wide_bm=128), mode="persistent")
    assert (d3.plan(9).const["ST_FOLD"], d4.plan(9).const["ST_FOLD"]) == (3, 4)
    _assert_same_bits(a, b)  # the same sums
    _batch_vs_single(cfg, w, seqs, g, "cuda", calls=2)


@pytest.mark.parametrize("seed", [61, pytest.param(73, marks=pytest.mark.slow)])
def test_wide_rows_in_two_tiles_match_one_padded_tile_and_torch_ref(seed):
    """Wide launches cover the tree rows with two power-of-two tiles (``Launcher.row_tiles``):
    6 sequences x top_k 6 = 36 rows as 32 + 16 instead of one 64-row tile, so every weight chunk
    meets two accumulators (QKV / o_proj / down split-K partials, gate/up, the wide lm_head's
    logits). The tokens and tree must be torch_ref's for each sequence drafted alone. The context step's unsplit o_proj and down
    (one row per sequence) take their own 16-row tile (``BMP_B``), not the 64-row one."""
    from frontier.backends.triton.launch import Tuning
    from frontier.cache import DraftCache

    cfg = random_config(total_token=14, depth=2, top_k=6, vocab_size=90, target_vocab_size=150)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, seed + 1, batch=6, lo=3, hi=9)
    tn = Tuning(bm_max=64, wide_bm=16, wide_acc_elems=512, split_rows=64)
    d, out = _draft_tuned(cfg, w, seqs, tn)
    assert d.row_tiles(6) == (32, 16)
    assert (d.plan(6).const["BMP"], d.plan(6).const["BMP_B"]) == (64, 16)
    t0 = out[0]
    for b, (ids, feats) in enumerate(seqs):
        ref = frontier_generate(cfg, feats.to(DEVICE), "torch_ref", input_ids=ids.to(DEVICE), weights=w,
                                cache=DraftCache.fresh(cfg, context_length=16, dtype=w.dtype, device=DEVICE))
        assert torch.equal(ref.draft_tokens.reshape(-1).cpu(), t0[b].cpu())
        assert torch.equal(ref.tree_position_ids.reshape(-1).cpu(), d.out_pos[b].cpu())


@pytest.mark.parametrize("seed,hidden,heads,kv_heads",
                         [pytest.param(83, 32, 4, 2, marks=pytest.mark.slow), (97, 30, 3, 1)])
def test_qkv_hidden_half_ahead_matches_one_stream_and_torch_ref(seed, hidden, heads, kv_heads):
    """Narrow eagle3 launches stream the next depth's QKV over the hidden half of its input during
    MERGE and the QKV phase only over the embedding half plus each row's parent partial. It runs
    when the tree rows fit the batch-1 tile (``Tuning.BM``); here two sequences' 2 x 3 rows share
    a 32-row one (``BM=32``), and ``BM=8`` (below every tile) gives the one-stream launch. Over grids where the streaming programs
    are the ones after the merged rows (12 and 8 programs) and the interpreter's 2 programs (every
    program streams after its rows), and for a hidden size whose half is not 16-byte aligned
    (30 x fp32): trees, scores and cache rows equal the one-stream launch, tokens and tree
    torch_ref's, and the last partials are hidden_norm(rows) @ Wqkv[:, H:]^T. Slabs that would
    need two sub-slabs, eagle2 heads and rows beyond the batch-1 tile turn it off."""
    from frontier.backends.triton.launch import Tuning
    from frontier.cache import DraftCache

    cfg = random_config(total_token=14, depth=3, top_k=3, vocab_size=70, target_vocab_size=110, hidden_size=hidden,
                        num_attention_heads=heads, num_key_value_heads=kv_heads)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, seed + 1, batch=2, lo=3, hi=9)
    outs = []
    for tn in (Tuning(BM=8), Tuning(**NARROW32), Tuning(grid=12, **NARROW32), Tuning(grid=8, **NARROW32)):
        d, out = _draft_tuned(cfg, w, seqs, tn)
        assert d.qkv_ahead(2) == (tn.BM == 32)
        outs.append(out)
        if tn.BM == 32:  # the partials of the last step that streamed them (depth D-2's rows)
            lw = w.layers[0]
            wh = torch.cat([lw.q_proj, lw.k_proj, lw.v_proj])[:, hidden:]
            rows = 2 * cfg.top_k
            torch.testing.assert_close(d.ws.qh[:rows], d.ws.xh[:rows].float() @ wh.float().T, rtol=1e-5, atol=1e-5)
    for other in outs[1:]:
        _assert_same_launch(outs[0], other)
    for b, (ids, feats) in enumerate(seqs):
        ref = frontier_generate(cfg, feats.to(DEVICE), "torch_ref", input_ids=ids.to(DEVICE), weights=w,
                                cache=DraftCache.fresh(cfg, context_length=16, dtype=w.dtype, device=DEVICE))
        assert torch.equal(ref.draft_tokens.reshape(-1).cpu(), outs[1][0][b].cpu())
        assert torch.equal(ref.tree_position_ids.reshape(-1).cpu(), d.out_pos[b].cpu())
    from frontier.backends.triton.launch import Launcher

    small = Launcher(cfg, torch.float32, torch.device("cpu"), Tuning(grid=8, **NARROW32, acc_elems=512))
    rp, bns, _ = small.qkv_ahead_slab(2)  # 2 free programs, 16-row sub-slabs
    assert rp > bns and not small.qkv_ahead(2)  # two sub-slabs per slab: off
    eagle2 = random_config(architecture="eagle2")
    assert not Launcher(eagle2, torch.float32, torch.device("cpu"), Tuning(grid=12)).qkv_ahead(2)
    assert not Launcher(cfg, torch.float32, torch.device("cpu"), Tuning(grid=12)).qkv_ahead(6)  # 18 rows > BM 16
    wide = Launcher(cfg, torch.float32, torch.device("cpu"), Tuning(grid=12, BM=32, wide_bm=32))
    assert not wide.qkv_ahead(2)  # a wide launch splits K in its QKV (and PREP3 must write both halves)


@pytest.mark.parametrize("arch,fused,seed,hidden,heads,kv_heads",
                         [pytest.param("eagle3", False, 61, 32, 4, 2, marks=pytest.mark.slow),
                          ("eagle2", True, 71, 32, 4, 2),
                          pytest.param("eagle3", False, 83, 30, 3, 1, marks=pytest.mark.slow)])
def test_phase_kernels_on_their_own_grids_draft_what_the_small_grid_drafts(arch, fused, seed, hidden, heads,
                                                                             kv_heads):
    """Step launches build the kernel for each entry's phase alone and give the phases that loop
    over a few items no more programs than items: on a 12-program grid a ragged batch of 3 (split
    and fused attention, the hidden-half QKV ahead for eagle3) drafts the trees of the
    interpreter's 2-program grid (scores to fp32 rounding; several seeds; one head with a hidden
    size of 30 and 3 heads over 1 KV head) - and FINAL and SELECT run one program per sequence (SELECT is no entry of its
    own where MERGE runs it: eagle3, whose MERGE streams the next depth's QKV half here), the
    weight streams on the whole grid, MERGE on the whole grid where it streams the next depth's
    QKV and else one program per row."""
    from frontier.backends.triton.kernels import CONTEXT_STEP, Phase
    from frontier.backends.triton.launch import Tuning

    cfg = random_config(architecture=arch, total_token=14, depth=3, top_k=3, vocab_size=70,
                        target_vocab_size=110 if arch == "eagle3" else 70, hidden_size=hidden,
                        num_attention_heads=heads, num_key_value_heads=kv_heads)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, seed + 1, batch=3, lo=3, hi=9)
    d, new = _draft_tuned(cfg, w, seqs, Tuning(grid=12, **NARROW32, fused_attention=fused))
    _, small = _draft_tuned(cfg, w, seqs, Tuning(grid=2, **NARROW32, fused_attention=fused))
    _assert_same_launch(small, new)
    grids = {code // 256: g for code, g in zip(d.schedule_list, d.step_grid_list)}
    assert d.plan(3).sel == (arch == "eagle3") == d.plan(3).qh
    assert (Phase.SELECT not in grids) if d.plan(3).sel else grids[Phase.SELECT] == 3
    assert grids[Phase.FINAL] == 3
    assert grids[Phase.LMHEAD] == grids[Phase.GATEUP] == 12
    merges = [(code % 256, g) for code, g in zip(d.schedule_list, d.step_grid_list) if code // 256 == Phase.MERGE]
    for i, g in merges:  # the whole grid where it streams the next depth's QKV, else one program per row
        ahead = arch == "eagle3" and d.plan(3).qh and (i == CONTEXT_STEP or i + 1 < cfg.depth)
        assert g == (12 if ahead else 3 if i == CONTEXT_STEP else 9), (i, g)
    assert (arch == "eagle3") == any(g == 12 for _, g in merges)
    assert d.plan(3).fused == fused
    assert grids[Phase.ATTN_F if fused else Phase.ATTN] <= 12


def test_pdl_lets_a_launch_start_early_unless_it_would_crowd_a_weight_stream():
    """Programmatic dependent launch of the step launches (``Tuning.pdl``): every launch is made
    with it and waits in the kernel; a launch lets the next one start right after its wait (PDL
    1) unless it is a weight stream followed by a launch that is neither a stream nor small (at
    most ``pdl_max_grid`` programs) - then after its work (PDL 2). Off on a CPU and under the
    interpreter."""
    from frontier.backends.triton.kernels import Phase
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config()
    # a weight stream before a stream, before a small launch, before a full-grid one; the last
    sched = [(Phase.GATEUP, 12), (Phase.DOWN, 12), (Phase.SELECT, 1), (Phase.LMHEAD, 12), (Phase.MERGE, 12),
             (Phase.QKV, 12), (Phase.ROPE, 3), (Phase.FINAL, 1)]
    d = Launcher(cfg, torch.float32, torch.device("cpu"), Tuning(grid=12, pdl=True, pdl_max_grid=4))
    d.schedule_list = [ph * 256 for ph, _ in sched]
    d.step_grid_list = [g for _, g in sched]
    d.n_steps = len(sched)
    got = [d.pdl_const(st) for st in range(len(sched))]
    assert all(c["launch_pdl"] for c in got)
    assert [c["PDL"] for c in got] == [1, 1, 1, 2, 1, 1, 1, 1]
    assert not d.pdl_on()  # a CPU drafter never sets it


def test_tuning_overrides_parse_each_field_as_its_type():
    """``Tuning.overrides`` (the scripts' ``field=value`` tunings): each value parsed as its
    field's type, ``none`` for Optional fields; an unknown field or a value of the wrong type is a
    ValueError naming the override."""
    from frontier.backends.triton.launch import Tuning

    got = Tuning.overrides(["pack_weights=false", "merge_chunk=8192", "BLOCK_NA=none", "lin_stages=3",
                            "fused_attention=1", "gu_stages=None"])
    assert got == dict(pack_weights=False, merge_chunk=8192, BLOCK_NA=None, lin_stages=3, fused_attention=True,
                       gu_stages=None)
    assert type(got["merge_chunk"]) is int and type(got["pack_weights"]) is bool
    assert Tuning(**got).merge_chunk == 8192
    assert Tuning.overrides([]) == {}
    for bad, msg in [("pack_weights", "expected field=value"), ("no_such=1", "no field 'no_such'"),
                     ("pack_weights=maybe", "pack_weights takes true or false"),
                     ("merge_chunk=big", "merge_chunk takes an integer"),
                     ("merge_chunk=none", "merge_chunk takes an integer")]:
        with pytest.raises(ValueError, match=msg):
            Tuning.overrides([bad])


@pytest.mark.slow
def test_pdl_tuning_drafts_the_same_bits_where_it_cannot_apply():
    """``Tuning(pdl=True)`` under the interpreter (and on a CPU) makes plain step launches: the
    same trees, scores and cache rows as without it."""
    from frontier.backends.triton.launch import Tuning

    cfg = random_config(total_token=14, depth=3, top_k=3, vocab_size=70, target_vocab_size=110, hidden_size=32,
                        num_attention_heads=4, num_key_value_heads=2)
    w = random_weights(cfg, seed=91, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, 92, batch=2, lo=3, hi=9)
    _, a = _draft_tuned(cfg, w, seqs, Tuning(grid=12, **NARROW32, pdl=False))
    _, b = _draft_tuned(cfg, w, seqs, Tuning(grid=12, **NARROW32, pdl=True))
    _assert_same_bits(a, b)


@pytest.mark.parametrize("batch,grid,seed", [pytest.param(1, 12, 31, marks=pytest.mark.slow), (2, 2, 37),
                                             pytest.param(2, 5, 43, marks=pytest.mark.slow)])
def test_select_in_merge_drafts_what_select_of_its_own_drafts(batch, grid, seed):
    """Launches whose MERGE streams the next depth's QKV half (eagle3, tree rows in one BM tile)
    let the MERGE program that merges a sequence's last row run its SELECT: the schedule has no
    SELECT entry. Over three calls on one drafter (fresh caches each) it drafts the trees of a
    launch with SELECT's own phase (``BM=8``: no tile fits, so neither runs) - one sequence and
    ragged batches, each program merging one row (12 programs) or several, whose last may come
    from any program (2 and 5) - and each sequence's count of merged rows is back at 0 after
    every call. (Without the embedding-QKV table, so that only SELECT's entries differ.)"""
    from frontier.backends.triton.kernels import Phase
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config(total_token=14, depth=3, top_k=3, vocab_size=70, target_vocab_size=110, hidden_size=32,
                        num_attention_heads=4, num_key_value_heads=2)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, seed + 1, batch=batch, lo=3, hi=9)
    on = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning(grid=grid, emb_table_mb=0, **NARROW32))
    off = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning(grid=grid, BM=8))
    assert on.plan(batch).sel and on.plan(batch).const["SEL_MG"] and not off.plan(batch).const["SEL_MG"]
    for call in range(3):
        _assert_same_launch(_launch_on(off, cfg, w, seqs), _launch_on(on, cfg, w, seqs))
        assert not on.ws.sync[2:].any(), call
    phases = lambda d: {c // 256 for c in d.schedule_list}  # noqa: E731
    assert Phase.SELECT not in phases(on) and Phase.SELECT in phases(off)
    assert len(on.schedule_list) == len(off.schedule_list) - (cfg.depth + 1)
    assert on.ws.sync.numel() >= 2 + batch


@pytest.mark.parametrize("n,kd,grid,rp,bk", [(37, 48, 3, 13, 16), (100, 30, 4, 25, 32), (20, 64, 5, 3, 16),
                                             (9, 16, 4, 2, 16)])
def test_pack_slabs_lays_out_each_program_slab_chunk_by_chunk(n, kd, grid, rp, bk):
    """``plan.pack_slabs``: element [g, c, r, j] is row g * RP + r, column c * BK + j of the
    weight, zero past its rows or columns - whether the last program's slab is partial, several
    programs have no rows (20 rows on 5 x 3), the grid covers fewer rows than the weight (9 rows
    on 4 x 2: the last is no program's) or BK does not divide Kd; from a column-major weight too."""
    from frontier.backends.triton.plan import pack_slabs

    w = torch.randn(n, kd, generator=torch.Generator().manual_seed(n + kd))
    out = pack_slabs(w, grid, rp, bk)
    kc = -(-kd // bk)
    assert out.shape == (grid, kc, rp, bk) and out.is_contiguous()
    g, c, r, j = torch.meshgrid(*(torch.arange(x) for x in out.shape), indexing="ij")
    row, col = g * rp + r, c * bk + j
    inside = (row < n) & (col < kd)
    assert torch.equal(out[inside], w[row[inside], col[inside]])
    assert not out[~inside].any()
    assert torch.equal(pack_slabs(w.t().contiguous().t(), grid, rp, bk), out)  # a column-major weight alike


@pytest.mark.parametrize("arch,hidden,grid,seed", [("eagle3", 32, 2, 21),
                                                  pytest.param("eagle3", 30, 5, 23, marks=pytest.mark.slow),
                                                  pytest.param("eagle2", 40, 3, 25, marks=pytest.mark.slow)])
def test_packed_weights_draft_the_same_bits_as_row_major(arch, hidden, grid, seed):
    """``Tuning.pack_weights``: launches whose tree rows fit one BM-row tile stream gate, up and
    the lm_head from copies packed per slab (``pack_slabs``), addressed by ``_slab_base``. The
    same tiles in the same order, so over calls on one drafter the trees, scores and cache rows
    equal the row-major launch's bit for bit (slabs of several rows, a hidden size that no
    k-chunk divides: 30). The copies are made once and kept (``packed_bytes``) while the same
    tensors come back unmodified; a weight changed in place (its version counter) or given
    other data (``.data =``) is packed again, another head's weights replace them and take them along when freed, and a batch
    whose rows need a wider tile streams the row-major weights. Small
    pipeline stages make every row two or more k-chunks, so a chunk's place in the copy matters.
    (Without the embedding-QKV table, which ``packed_bytes`` counts too.)"""
    from frontier.backends.triton.launch import Launcher, Tuning
    from frontier.backends.triton.plan import pack_slabs

    over = dict(target_vocab_size=110) if arch == "eagle3" else {}
    cfg = random_config(architecture=arch, total_token=14, depth=3, top_k=3, vocab_size=70, hidden_size=hidden,
                        intermediate_size=52, num_attention_heads=4 if hidden % 4 == 0 else 3,
                        num_key_value_heads=2 if hidden % 4 == 0 else 1, **over)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, seed + 1, batch=1, lo=3, hi=9)
    small = dict(grid=grid, stage_bytes=1024, emb_table_mb=0)  # k-chunks of 16 columns: two or more per row
    on = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning(**small))
    off = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning(**small, pack_weights=False))
    p = on.plan(1)
    assert p.pack and p.const["PACK_W"] and not off.plan(1).pack
    assert p.const["BK_GU"] == p.const["BK_LM"] == 16
    for call in range(2):
        _assert_same_bits(_launch_on(on, cfg, w, seqs), _launch_on(off, cfg, w, seqs))
    lw = w.layers[0]
    kept = {role: e[4] for role, e in on._packed.items()}
    assert set(kept) == {"gate", "up", "lm_head"} and off.packed_bytes == 0
    rp_gu, rp_lm = p.slabs["RP_GU"], p.slabs["RP_LM"]
    kc = lambda bk: -(-hidden // bk) * bk  # noqa: E731
    assert on.packed_bytes == 4 * grid * (2 * rp_gu * kc(p.const["BK_GU"]) + rp_lm * kc(p.const["BK_LM"]))
    assert torch.equal(kept["lm_head"], pack_slabs(w.lm_head, grid, rp_lm, p.const["BK_LM"]))
    lw.gate_proj.mul_(1.5)  # in place: the same tensor, a new version
    try:
        _assert_same_bits(_launch_on(on, cfg, w, seqs), _launch_on(off, cfg, w, seqs))
        assert on._packed["gate"][4] is not kept["gate"] and on._packed["lm_head"][4] is kept["lm_head"]
    finally:
        lw.gate_proj.div_(1.5)
    before, old = on._packed["up"][4], lw.up_proj.data
    lw.up_proj.data = old * 1.5  # other storage, the same version counter
    try:
        _assert_same_bits(_launch_on(on, cfg, w, seqs), _launch_on(off, cfg, w, seqs))
        assert on._packed["up"][4] is not before
    finally:
        lw.up_proj.data = old
    wide = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning(grid=grid, BM=16, bm_max=64)).plan(8)
    assert not wide.pack and not wide.const["PACK_W"]  # 24 tree rows: a 32-row tile
    other = random_weights(cfg, seed=seed + 2, device=DEVICE)  # another head: its own copies, freed with it
    _launch_on(on, cfg, other, seqs)
    assert on._packed["lm_head"][0]() is other.lm_head and on.packed_bytes > 0
    del other
    gc.collect()
    assert on.packed_bytes == 0 and not on._packed


@pytest.mark.parametrize("target_vocab,dtype,grid,batch,seed", [
    (110, torch.float32, 3, 1, 0), (None, torch.float16, 5, 2, 1),
    pytest.param(110, torch.float16, 12, 3, 2, marks=pytest.mark.slow)])
def test_embedding_qkv_table_drafts_the_bits_of_the_qkv_stream(target_vocab, dtype, grid, batch, seed):
    """EAGLE-3 launches that stream the QKV hidden half during MERGE read each tree row's
    embedding half of QKV from the head's table (``kernels.table``): the tree depths have no PREP3
    or QKV entries, and over calls on one drafter the trees, scores and cache rows equal those of
    a launch that streams that half, bit for bit (with a d2t map onto a larger target vocabulary
    and without one; one sequence and ragged batches whose tree rows fit the tile; rows of several
    k-chunks). The table is the embedding norm's product with Wqkv's first half, made once and
    kept (``packed_bytes``) while the head is unchanged; any of its sources written in place
    makes it again (in the same memory under a Drafter's ``pin_packed``), and it goes with the
    head that made it. ``emb_table_mb=0`` and ``pack_weights=False`` draft without it."""
    from frontier.backends.triton.kernels import Phase
    from frontier.backends.torch_ref.layer import rms_norm
    from frontier.backends.triton.launch import Launcher, Tuning

    over = dict(target_vocab_size=target_vocab) if target_vocab else {}
    cfg = random_config(total_token=14, depth=3, top_k=3, vocab_size=70, hidden_size=32, num_attention_heads=4,
                        num_key_value_heads=2, **over)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, dtype=dtype, device=DEVICE)
    seqs, _ = _ragged(cfg, seed + 1, batch=batch, lo=3, hi=9)
    small = dict(grid=grid, stage_bytes=256 * dtype.itemsize)  # k-chunks of 16 columns: two per row
    on = Launcher(cfg, dtype, torch.device(DEVICE), Tuning(**small))
    pinned = Launcher(cfg, dtype, torch.device(DEVICE), Tuning(**small))
    pinned.pin_packed = True
    off = Launcher(cfg, dtype, torch.device(DEVICE), Tuning(**small, emb_table_mb=0))
    assert on.plan(batch).tab and on.plan(batch).const["TAB"] and not off.plan(batch).tab
    assert on.plan(batch).const["BK_QKV"] == 16
    assert not Launcher(cfg, dtype, torch.device(DEVICE), Tuning(grid=grid, pack_weights=False)).plan(batch).tab
    for call in range(2):
        _assert_same_bits(_launch_on(on, cfg, w, seqs), _launch_on(off, cfg, w, seqs))
    tree = lambda d: [c // 256 for c in d.schedule_list if c % 256 != 255]  # noqa: E731 (the tree depths' phases)
    assert Phase.QKV not in tree(on) and Phase.PREP3 not in tree(on)
    assert tree(off).count(Phase.QKV) == tree(off).count(Phase.PREP3) == cfg.depth
    assert len(on.schedule_list) == len(off.schedule_list) - 2 * cfg.depth
    tab, t2d = on._table.tab, on._table.t2d
    nt = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    assert tab.shape == (cfg.vocab_size, nt) and tab.dtype == torch.float32
    assert on.packed_bytes - off.packed_bytes == on.table_bytes + (0 if t2d is None else 4 * cfg.target_vocab_size)
    lw = w.layers[0]
    targets = torch.arange(cfg.vocab_size) + (w.d2t.cpu() if w.d2t is not None else 0)
    assert (t2d is None) == (w.d2t is None)
    if t2d is not None:  # every draft token's target id maps back to it
        assert torch.equal(t2d.cpu()[targets], torch.arange(cfg.vocab_size, dtype=torch.int32))
    x = rms_norm(w.embed_tokens[targets.to(DEVICE)], lw.input_layernorm, cfg.rms_norm_eps).float()
    wqkv = torch.cat([lw.q_proj, lw.k_proj, lw.v_proj])[:, : cfg.hidden_size].float()
    torch.testing.assert_close(tab, x @ wqkv.T, rtol=1e-5, atol=1e-5)  # (another summation order)
    _launch_on(pinned, cfg, w, seqs)
    pinned_tab = pinned._table.tab
    sources = [w.embed_tokens, lw.input_layernorm, lw.k_proj] + ([w.d2t] if w.d2t is not None else [])
    for src in sources:  # in place, one at a time: the same tensor, a new version
        before = on._table.tab
        with torch.no_grad():
            saved = src.clone()
            if src.dtype == torch.int64:  # d2t: every draft token's target id moves up by one
                d = torch.arange(len(src), device=src.device)
                src.copy_((src + d + 1) % cfg.target_vocab_size - d)
            else:
                src.mul_(1.5)
        try:
            _assert_same_bits(_launch_on(on, cfg, w, seqs), _launch_on(off, cfg, w, seqs))
            _assert_same_bits(_launch_on(pinned, cfg, w, seqs), _launch_on(off, cfg, w, seqs))
            assert on._table.tab is not before and pinned._table.tab is pinned_tab, src.shape
        finally:
            with torch.no_grad():
                src.copy_(saved)
        _launch_on(on, cfg, w, seqs)  # (both tables follow the restored head before the next change)
        _launch_on(pinned, cfg, w, seqs)
    other = random_weights(cfg, seed=seed + 2, lm_head_scale=6.0, dtype=dtype, device=DEVICE)
    _assert_same_bits(_launch_on(on, cfg, other, seqs), _launch_on(off, cfg, other, seqs))
    assert on._table.ref() is other.layers[0].q_proj
    del other
    gc.collect()
    assert on._table is None and on.packed_bytes == 0


def test_embedding_qkv_table_only_where_it_fits_its_limit():
    """``Tuning.emb_table_mb`` bounds the table (fp32, one row per draft token): a head whose
    table is larger streams the embedding half instead; 0 never makes one; a negative limit is
    refused by name."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config(total_token=14, depth=3, top_k=3, vocab_size=40000, target_vocab_size=50000, hidden_size=32,
                        num_attention_heads=4, num_key_value_heads=2)
    d = Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning(grid=3))
    assert d.table_bytes == 4 * 40000 * 8 * 8  # 10.24 MB: (4 + 2 * 2) heads of 8
    assert {mb: Launcher(cfg, torch.float32, torch.device(DEVICE), Tuning(grid=3, emb_table_mb=mb)).plan(1).tab
            for mb in (0, 10, 11)} == {0: False, 10: False, 11: True}
    with pytest.raises(ValueError, match="emb_table_mb must be an integer >= 0"):
        Tuning(emb_table_mb=-1)


def test_select_in_merge_by_default_only_where_merge_streams_the_qkv_half():
    """MERGE runs SELECT only in launches whose MERGE streams the next depth's QKV hidden half
    (``LaunchPlan.qh``: eagle3 at the batch-1 tile), and the schedule drops SELECT's entries
    exactly there; wide launches keep SELECT's own phase."""
    from frontier.backends.triton.kernels import Phase
    from frontier.backends.triton.launch import Launcher, Tuning

    for arch in ("eagle3", "eagle2"):
        cfg = random_config(architecture=arch, total_token=14, depth=3, top_k=3, vocab_size=70,
                            target_vocab_size=110 if arch == "eagle3" else 70, hidden_size=32, num_attention_heads=4,
                            num_key_value_heads=2)
        w = random_weights(cfg, seed=7, device=DEVICE)
        d = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning(grid=12, BM=16, wide_bm=64))
        seen = set()
        for batch in (1, 2, 6, 11):
            p = d.plan(batch)
            assert p.sel == (p.qh and not p.wide) and p.const["SEL_MG"] == p.sel, (arch, batch)
            seen.add((p.qh, p.wide))
            if batch == 1:
                seqs, _ = _ragged(cfg, 8, batch=1, lo=3, hi=6)
                _launch_on(d, cfg, w, seqs)
                assert (Phase.SELECT not in {c // 256 for c in d.schedule_list}) == p.sel, arch
        # eagle3 has batches with and without the QKV half, and a wide one; eagle2 never streams it
        assert seen == ({(True, False), (False, False), (False, True)} if arch == "eagle3"
                        else {(False, False), (False, True)}), (arch, seen)


@pytest.mark.slow
def test_step_launches_sized_for_more_rows_than_the_call_has_draft_the_same_bits(monkeypatch):
    """A graph is captured with its per-row launches sized for the workspace's row capacity and
    replayed for any N up to it: the kernel reads N from the metadata, and programs past the
    call's rows do nothing. Under the interpreter: step launches whose per-row phases get
    programs for 16 rows, for a ragged batch of fewer new rows, draft the same bits as launches
    sized for its rows."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config(total_token=12, depth=2, top_k=3, vocab_size=60, target_vocab_size=90, hidden_size=32,
                        num_attention_heads=4, num_key_value_heads=2)
    w = random_weights(cfg, seed=95, lm_head_scale=6.0, device=DEVICE)
    seqs, _ = _ragged(cfg, 96, batch=2, lo=3, hi=5)
    assert sum(feats.shape[1] for _, feats in seqs) < 16
    _, a = _draft_tuned(cfg, w, seqs, Tuning(grid=16))
    grids = []
    real = Launcher.step_grid

    def wide_rows(self, code, nb, n_rows):
        grids.append(real(self, code, nb, 16))
        return grids[-1]

    monkeypatch.setattr(Launcher, "step_grid", wide_rows)
    _, b = _draft_tuned(cfg, w, seqs, Tuning(grid=16))
    assert 16 in grids  # the context step's per-row phases got programs past the call's rows
    _assert_same_bits(a, b)


def test_context_rows_of_wide_launches_get_their_own_tile():
    """At wide launches (the 8B preset at batch 4, 16 and 64) the tree depths split K in o_proj
    and down, so the unsplit forms run only in the context step, over one row per sequence: their
    tile is the batch's (16 rows at batches 4 and 16, 64 at batch 64; the tree rows take 64 / 256 /
    256) and their k-chunks follow from it (512 / 512 / 256 columns; a 256-row tile would leave
    128). Narrow launches (batch 1) keep one tile for both."""
    from frontier.backends.triton.launch import Launcher, Tuning
    from frontier.bench import BenchCase

    cfg = BenchCase(preset="eagle3-llama3.1-8b", depth=7).config()
    d = Launcher(cfg, torch.bfloat16, torch.device("cpu"), Tuning(grid=132))
    got = {nb: tuple(d.plan(nb).const[k] for k in ("BMP", "BMP_B", "BK_O", "BK_D")) for nb in (1, 4, 16, 64)}
    assert got == {1: (16, 16, 512, 512), 4: (64, 16, 512, 512), 16: (256, 16, 512, 512), 64: (256, 64, 256, 256)}
    assert d.plan(4).wide and not d.plan(1).wide


def test_row_tiles_cover_the_tree_rows_with_less_padding():
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config(top_k=10)
    d = Launcher(cfg, torch.float32, torch.device("cpu"), Tuning(grid=2))
    assert d.row_tiles(1) == (16, 0)  # narrow: one tile
    assert d.row_tiles(4) == (32, 16)  # 40 rows in a wide launch (block_rows 64)
    assert d.row_tiles(16) == (128, 32)  # 160 rows, not 256
    assert d.row_tiles(13) == (128, 16)
    assert d.row_tiles(12) == (128, 0)  # 120 rows: one 128-row tile pads least
    assert d.row_tiles(9) == (64, 32)  # 90 rows in a wide launch (block_rows 256)
    assert d.row_tiles(64) == (256, 0)  # beyond bm_max: 256-row tiles
    for b in range(1, 40):  # the tiles always hold the rows (or tile them at bm_max)
        bm, bm2 = d.row_tiles(b)
        assert bm + bm2 >= min(b * 10, 256) and bm >= 16 and bm2 in (0, 16, 32, 64, 128)
    # fp8 streams whose dots are swapped (16-bit dtypes) take one tile where it has at most
    # SWAP_ROWS rows: two tiles' dots are not swapped
    from frontier.backends.triton.fp8 import BF16_BITS, FP8_EXACT, SWAP_DOT, StreamFormats
    from frontier.backends.triton.kernels.stream import SWAP_ROWS

    f8 = Launcher(cfg, torch.bfloat16, torch.device("cpu"), Tuning(grid=2),
                  StreamFormats(*[FP8_EXACT + BF16_BITS + SWAP_DOT] * 6))
    assert SWAP_ROWS.value == 64 and f8.row_tiles(4) == (64, 0) and f8.row_tiles(2) == (32, 0)
    assert f8.row_tiles(8) == (64, 16) and f8.row_tiles(16) == (128, 32)  # one tile would exceed 64 rows


def build_schedule_codes(cfg, split):
    from frontier.backends.triton.schedule import build_schedule

    return build_schedule(cfg.architecture, cfg.depth, split)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["persistent", "steps"])
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_gpu_batch_matches_torch_ref(arch, mode):
    cfg = _medium_config(arch)
    w = random_weights(cfg, seed=51, device="cuda", lm_head_scale=6.0)
    seqs, g = _ragged(cfg, 52, batch=7, lo=20, hi=70)
    _batch_vs_single(cfg, w, seqs, g, "cuda", calls=3, sampling=arch == "eagle2", mode=mode)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [57, 73])
@pytest.mark.parametrize("mode", ["steps", "graph"])
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_gpu_wide_context_step_builds_match_torch_ref(arch, mode, seed, monkeypatch):
    """Compiled, the wide plan's own builds of the context step (gate/up and the register lm_head on a pow2(batch)-row tile, the fused attention's one-row query
    block) and its folded o_proj / down draft in fp32 what torch_ref drafts for each sequence
    alone: a ragged batch of 12 (120 tree rows: a wide launch), on a grid of 48 so that the
    medium head's 2 KV heads take the fused attention, over three calls, on two seeds."""
    from frontier.backends.triton.kernels import Phase
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = _medium_config(arch)
    w = random_weights(cfg, seed=seed, device="cuda", lm_head_scale=6.0)
    seqs, g = _ragged(cfg, seed + 1, batch=12, lo=20, hi=60)
    d = Launcher(cfg, torch.float32, torch.device("cuda"), Tuning(grid=48))
    p = d.plan(12)
    assert p.wide and p.fused and set(p.ctx_const) == {Phase.GATEUP, Phase.LMHEAD, Phase.MERGE, Phase.ATTN_F}
    assert p.const["FOLD_O"] > 1 and p.const["FOLD_D"] > 1
    _drafting_with(monkeypatch, d)
    _batch_vs_single(cfg, w, seqs, g, "cuda", calls=3, sampling=arch == "eagle2", mode=mode)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_gpu_graph_mode_matches_persistent(arch):
    """mode='graph' replays the step launches as a CUDA graph: the same trees as the persistent
    launch over call sequences (new shapes capture new graphs, repeated shapes replay), single
    sequences and a batch, and returned tensors are not overwritten by the next call."""
    cfg = _medium_config(arch)
    w = random_weights(cfg, seed=61, device="cuda", lm_head_scale=6.0)
    ids, feats = random_inputs(cfg, context=70, seed=62)
    chunks = [64, 3, 1, 1, 1]  # the repeated 1-row calls replay one graph
    per = _sequence(cfg, w, ids, feats, "triton", chunks, False, device="cuda", mode="persistent")
    gra = _sequence(cfg, w, ids, feats, "triton", chunks, False, device="cuda", mode="graph")
    _assert_same(per, gra, cfg)
    first = gra[-1].draft_tokens.clone()
    _sequence(cfg, w, ids, feats, "triton", chunks, False, device="cuda", mode="graph")
    assert torch.equal(gra[-1].draft_tokens, first)  # an earlier result is not a view of the graph's buffers
    seqs, g = _ragged(cfg, 63, batch=5, lo=20, hi=60)
    _batch_vs_single(cfg, w, seqs, g, "cuda", calls=3, mode="graph")


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_gpu_graph_with_pdl_drafts_the_same_bits(arch):
    """Graph mode with programmatic dependent launch (each launch starts while the one before it
    runs and waits in the kernel): one sequence and a ragged batch of 5 draft the same trees, scores and
    cache rows, bit for bit, as the graph without it, on every one of 10 replays (a missing wait
    would show up as a race)."""
    from frontier.backends.triton.launch import Tuning

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90+")
    cfg = _medium_config(arch)
    w = random_weights(cfg, seed=81, device="cuda", lm_head_scale=6.0)
    for batch in (1, 5):
        seqs, _ = _ragged(cfg, 82 + batch, batch=batch, lo=20, hi=60)
        _, ref = _draft_tuned(cfg, w, seqs, Tuning(pdl=False), mode="graph")
        d, out = _draft_tuned(cfg, w, seqs, Tuning(pdl=True), mode="graph")
        assert d.pdl_on()
        _assert_same_bits(ref, out)
        for _ in range(10):  # (the second run captures the graph, the rest replay it)
            d.run_batch(w, out[3], "graph")
            assert torch.equal(d.out_tok, ref[0]) and torch.equal(d.out_score, ref[2]), batch


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_gpu_persistent_graph_replays_the_direct_launch(arch):
    """mode='persistent' captures its one cooperative launch as a CUDA graph once the same
    arguments come twice, and replays it after: calls 1-2 launch directly (the second also
    captures), calls 3-5 replay. Every call must give the direct launch's tree, scores and cache
    rows, and the returned outputs must not be the graph's fixed buffers."""
    from frontier.backends.triton.launch import Launcher, Tuning
    from frontier.cache import DraftCache

    cfg = _medium_config(arch)
    w = random_weights(cfg, seed=71, device="cuda", lm_head_scale=6.0)
    ids, feats = random_inputs(cfg, context=40, seed=72)
    ids, feats = ids.cuda(), feats.cuda()
    runs = {}
    for graph in (False, True):
        d = Launcher(cfg, torch.float32, torch.device("cuda"), Tuning())
        if not graph:
            d.graph_error = "direct launches only"  # (how a drafter that failed to capture goes on)
        cache = DraftCache.fresh(cfg, context_length=40, dtype=w.dtype, device="cuda")
        res = []
        for call in range(5):
            d.alloc_outputs(1)
            d.run(w, feats[0], ids[0, 1:], ids[0, -1:], cache, 0, feats.shape[1], "persistent")
            d.check_error()
            assert d.out_tok.data_ptr() != d._graph_outputs(1)[0].data_ptr()
            res.append((d.out_tok, d.out_par, d.out_score, cache.k[:, :, : feats.shape[1]].clone()))
        assert (d.graph_error is None) == graph
        assert len(d._pgraphs) == (1 if graph else 0)
        runs[graph] = res
    for (t0, p0, s0, k0), (t1, p1, s1, k1) in zip(runs[False], runs[True]):
        assert torch.equal(t0, t1) and torch.equal(p0, p1) and torch.equal(s0, s1) and torch.equal(k0, k1)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["eagle3", "eagle2"])
def test_gpu_one_graph_serves_every_new_row_count(arch):
    """The kernel reads the call's packed new rows N from the metadata, so a generation-like
    call sequence (the cache growing by a different number of rows each call) captures one graph
    in mode='graph' and one cooperative-launch graph in mode='persistent', and every replay drafts
    the direct persistent launch's tree, scores and cache rows."""
    from frontier.backends.triton.launch import Launcher, Tuning
    from frontier.cache import DraftCache

    cfg = _medium_config(arch)
    w = random_weights(cfg, seed=75, device="cuda", lm_head_scale=6.0)
    ids, feats = random_inputs(cfg, context=40, seed=76)
    ids, feats = ids.cuda(), feats.cuda()
    chunks = [24, 3, 1, 5, 2, 5]  # new rows per call; c grows by each
    runs = {}
    for name, mode in [("direct", "persistent"), ("pgraph", "persistent"), ("graph", "graph")]:
        d = Launcher(cfg, torch.float32, torch.device("cuda"), Tuning())
        if name == "direct":
            d.graph_error = "direct launches only"  # (how a drafter that failed to capture goes on)
        cache = DraftCache.fresh(cfg, context_length=40, dtype=w.dtype, device="cuda")
        res, c = [], 0
        for n in chunks:
            d.alloc_outputs(1)
            d.run(w, feats[0, c:c + n], ids[0, 1 + c:1 + c + n], ids[0, c + n:c + n + 1], cache, c, n, mode)
            d.check_error()
            c += n
            res.append((d.out_tok.clone(), d.out_par.clone(), d.out_score.clone(), cache.k[:, :, :c].clone()))
        runs[name] = res
        if name == "graph":
            assert len(d._graphs) == 1
        if name == "pgraph":
            assert d.graph_error is None and len(d._pgraphs) == 1
    for name in ("pgraph", "graph"):
        for call, (a, b) in enumerate(zip(runs["direct"], runs[name])):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), (name, call)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "persistent"])
def test_gpu_replayed_calls_return_their_own_outputs(mode):
    """frontier_generate replays a captured graph (the default mode's step launches, or the
    persistent launch) when a call repeats the last ones' shapes and buffers; its outputs are
    allocated after the replay is queued and its Frontiers built before the error flag is read.
    Two inputs alternated on one cache (the same shapes: every call after the second replays):
    each result equals the same input's others, the two differ, and no earlier result is
    overwritten by a later call."""
    cfg = _medium_config("eagle3")
    w = random_weights(cfg, seed=73, device="cuda", lm_head_scale=6.0)
    ids, feats = random_inputs(cfg, context=40, seed=74)
    ids, feats = ids.cuda(), feats.cuda()
    options = {} if mode is None else {"mode": mode}
    cache = frontier_generate(cfg, feats[:, :36], "triton", input_ids=ids[:, :37], weights=w, **options).cache
    got = []
    for call in range(6):
        cache.truncate(36)
        fr = frontier_generate(cfg, feats[:, 36:] * (1 + call % 2), "triton", input_ids=ids, weights=w, cache=cache,
                               padded=True, check_token_range=False, **options)
        got.append((fr, [t.clone() for t in (fr.draft_tokens, fr.parents, fr.scores, fr.tree_mask, fr.retrieve_indices)]))
    d = frontier.get_backend("triton").drafter(cfg, w.dtype, torch.device("cuda"))
    assert len(d._pgraphs if mode == "persistent" else d._graphs) >= 1
    for fr, saved in got:  # nothing returned earlier was written by a later call
        now = (fr.draft_tokens, fr.parents, fr.scores, fr.tree_mask, fr.retrieve_indices)
        assert all(torch.equal(a, b) for a, b in zip(now, saved))
    for i in range(2, 6):
        assert all(torch.equal(a, b) for a, b in zip(got[i][1], got[i - 2][1]))
    assert not torch.equal(got[0][1][2], got[1][1][2])  # the two inputs draft different scores


@pytest.mark.parametrize("key", ["o_proj", "embed", "norm"])
def test_weights_that_are_not_row_major_are_refused_by_name(key):
    """The kernels address every weight as dense row-major storage: a transposed matrix, a
    sliced embedding or a strided norm vector would be read as other values, so the call and a
    Drafter are refused, naming the tensor; its contiguous copy drafts what torch_ref drafts."""
    from frontier import Drafter

    cfg = random_config()
    w = random_weights(cfg, seed=83, device=DEVICE)
    lw = w.layers[0]
    if key == "o_proj":
        lw.o_proj, name = lw.o_proj.t().contiguous().t(), "o_proj.weight"
    elif key == "embed":
        wide = torch.zeros(cfg.target_vocab_size, cfg.hidden_size + 8, device=DEVICE)
        wide[:, : cfg.hidden_size] = w.embed_tokens
        w.embed_tokens, name = wide[:, : cfg.hidden_size], "embed_tokens.weight"
    else:
        lw.post_attention_layernorm = torch.stack([lw.post_attention_layernorm] * 2, dim=1)[:, 0]
        name = "post_attention_layernorm.weight"
    ids, feats = random_inputs(cfg, context=6, seed=84)
    ids, feats = ids.to(DEVICE), feats.to(DEVICE)
    with pytest.raises(InputError, match=f"row-major.*{name}.*strides"):
        frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w)
    with pytest.raises(InputError, match=f"row-major.*{name}"):
        Drafter(cfg, w, backend="triton", max_batch=1, max_context=16, device=DEVICE)
    ref = frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w)
    if key == "o_proj":
        lw.o_proj = lw.o_proj.contiguous()
    elif key == "embed":
        w.embed_tokens = w.embed_tokens.contiguous()
    else:
        lw.post_attention_layernorm = lw.post_attention_layernorm.contiguous()
    _assert_same([ref], [frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w)], cfg)


def test_a_weight_given_a_transposed_layout_through_data_is_refused():
    """The look at the head's layout is kept while its tensors stay the same; ``o_proj.data =``
    a transposed copy keeps the tensor and its version counter but not its strides, so the next
    call looks again and refuses it by name, and contiguous data drafts what torch_ref drafts."""
    cfg = random_config()
    w = random_weights(cfg, seed=85, device=DEVICE)
    ids, feats = random_inputs(cfg, context=6, seed=86)
    ids, feats = ids.to(DEVICE), feats.to(DEVICE)
    frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w)
    o = w.layers[0].o_proj
    o.data = o.t().contiguous().t()
    with pytest.raises(InputError, match="row-major.*o_proj.weight.*strides"):
        frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w)
    o.data = o.contiguous() * 2
    ref = frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w)
    _assert_same([ref], [frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w)], cfg)


def test_cache_with_strided_rows_is_refused_and_left_unchanged():
    """A draft cache whose layer storage is not contiguous (rows padded to head_dim + 1) is refused
    with an error that names the strides; the cache keeps its length and contents. A contiguous
    cache that starts inside a larger buffer (its address is not its storage's first byte) is
    accepted and drafts what torch_ref drafts."""
    from frontier.cache import DraftCache

    cfg = random_config()
    w = random_weights(cfg, seed=81, device=DEVICE)
    ids, feats = random_inputs(cfg, context=6, seed=82)
    ids, feats = ids.to(DEVICE), feats.to(DEVICE)
    shape = (1, cfg.num_key_value_heads, 32, cfg.head_dim)
    wide = torch.zeros(*shape[:3], cfg.head_dim + 1, device=DEVICE)
    bad = DraftCache.from_tensors(wide[..., : cfg.head_dim], torch.zeros(shape, device=DEVICE))
    before = bad.k.clone()
    with pytest.raises(InputError, match="contiguous per layer.*strides"):
        frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w, cache=bad)
    assert bad.length == 0 and torch.equal(bad.k, before)
    numel = torch.Size(shape).numel()
    buf = torch.zeros(3 * numel, device=DEVICE)  # K and V one and two cache sizes into one buffer
    ok = DraftCache.from_tensors(buf[numel: 2 * numel].view(shape), buf[2 * numel:].view(shape))
    fr = frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w, cache=ok)
    ref = frontier_generate(cfg, feats, "torch_ref", input_ids=ids, weights=w,
                            cache=DraftCache.fresh(cfg, context_length=6, dtype=w.dtype, device=DEVICE))
    _assert_same([ref], [fr], cfg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_alignment_is_declared_only_when_the_launcher_proves_it(dtype):
    """The kernel declares the QKV weight rows and the caches' K/V offsets 16-byte aligned (vector
    loads) only when ``Launcher.vec16`` proves it: an aligned head and cache give 16 bytes' worth of
    elements, a cache view one element off, or a head_dim whose rows are not 16-byte multiples, give 1
    for the cache."""
    from frontier.backends.triton.launch import Launcher
    from frontier.cache import DraftCache

    el = torch.empty((), dtype=dtype).element_size()

    def vec(cfg, cache):
        w = random_weights(cfg, seed=0, dtype=dtype)
        return Launcher(cfg, dtype, torch.device("cpu")).vec16(w.layers[0], [cache.k, cache.v])

    cfg = random_config()  # head_dim 8
    fresh = DraftCache.fresh(cfg, context_length=8, dtype=dtype, device="cpu")
    assert vec(cfg, fresh) == dict(VEC_W=16 // el, VEC_KV=16 // el)
    big_k = torch.zeros(1 + fresh.k.numel(), dtype=dtype)
    big_v = torch.zeros_like(big_k)
    shifted = DraftCache.from_tensors(big_k[1:].view(fresh.k.shape), big_v[1:].view(fresh.k.shape))
    assert vec(cfg, shifted) == dict(VEC_W=16 // el, VEC_KV=1)
    odd = random_config(hidden_size=8, num_attention_heads=4, num_key_value_heads=2)  # head_dim 2: 4 or 8 bytes
    assert vec(odd, DraftCache.fresh(odd, context_length=8, dtype=dtype, device="cpu"))["VEC_KV"] == 1


try:  # the division helper alone, in a one-phase kernel
    import triton
    import triton.language as tl

    from frontier.backends.triton.kernels import lm_head, numerics, select

    @triton.jit
    def _div_probe(x_ptr, d_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        d = tl.load(d_ptr + offs, mask=m, other=1.0)
        tl.store(y_ptr + offs, numerics._div_rn_by(x, d, numerics._recip_rn(d)), mask=m)

    @triton.jit
    def _lm_stats_probe(logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, K, KP: tl.constexpr, BMK: tl.constexpr,
                        BNP: tl.constexpr, KEY16: tl.constexpr):
        lm_head._lm_slab_stats(tl.program_id(0), logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, M, K, KP, BMK, BNP,
                          logit_ptr.dtype.element_ty, KEY16)

    @triton.jit
    def _silu_probe(g_ptr, y_ptr, ref_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        g = tl.load(g_ptr + offs, mask=m, other=0.0)
        tl.store(y_ptr + offs, numerics._silu_rn(g), mask=m)
        tl.store(ref_ptr + offs, tl.math.div_rn(g, 1.0 + tl.exp(-g)), mask=m)

    @triton.jit
    def _top_n_probe(v_ptr, valid_ptr, out_ptr, n, BLOCK: tl.constexpr):
        r = tl.arange(0, BLOCK)
        valid = tl.load(valid_ptr + r) != 0
        v = tl.load(v_ptr + r)
        tl.store(out_ptr + r, select._top_n_mask(v, valid, n).to(tl.int32))
    @triton.jit
    def _merge_probe(keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr, dt_ptr, R, P, K, MR, KP: tl.constexpr,
                     BLOCK_P: tl.constexpr, KEY32: tl.constexpr):
        lm_head._ph_merge(tl.program_id(0), tl.num_programs(0), R, P, keys_ptr, max_ptr, sum_ptr, sel_lp_ptr, sel_tok_ptr,
                     K, MR, KP, BLOCK_P, dt_ptr.dtype.element_ty, KEY32)

    @triton.jit
    def _merge_rows_probe(logit_ptr, V, sel_lp_ptr, sel_tok_ptr, R, K, KP: tl.constexpr, BV: tl.constexpr,
                          KEY32: tl.constexpr, G: tl.constexpr):
        lm_head._ph_merge_rows(tl.program_id(0), tl.num_programs(0), R, logit_ptr, V, sel_lp_ptr, sel_tok_ptr, K, KP, BV,
                          logit_ptr.dtype.element_ty, KEY32, G)

    @triton.jit
    def _select_probe(sel_lp_ptr, sel_tok_ptr, d2t_ptr, fr_score_ptr, fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr,
                      cand_score_ptr, cand_tok_ptr, row_par_ptr, dt_ptr, B, i, K, KP, SK, C, RPW, V,
                      HAS_D2T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_A: tl.constexpr, KEY32: tl.constexpr):
        select._ph_select(tl.program_id(0), tl.num_programs(0), B, i, K, KP, SK, C, RPW, sel_lp_ptr, sel_tok_ptr, d2t_ptr,
                      fr_score_ptr, fr_tok_ptr, fr_src_ptr, fr_pick_ptr, anc_ptr, cand_score_ptr, cand_tok_ptr,
                      row_par_ptr, V, False, HAS_D2T, BLOCK_K, BLOCK_A, dt_ptr.dtype.element_ty, KEY32)
except ImportError:  # the module's skip marker covers a missing triton
    _div_probe = _lm_stats_probe = _silu_probe = _top_n_probe = _merge_probe = _merge_rows_probe = None
    _select_probe = None


def test_top_n_mask_selects_the_n_largest_keys():
    """FINAL's selection (``_top_n_mask``, a radix select over the values' 32-bit images) picks
    the same set as the n largest 64-bit ranking keys (value, then lower index): values drawn
    from a few bf16 levels (long runs of ties at the threshold), +0 and -0, infinities, random
    fp32 bit patterns, masked entries, and n at or beyond the number of valid entries."""
    g = torch.Generator().manual_seed(5)
    block = 256
    levels = torch.tensor([-float("inf"), -3.5, -1.0, -0.0, 0.0, 0.25, 2.0, float("inf")])
    cases = []
    for trial in range(24):
        kind = trial % 3
        if kind == 0:  # a few levels: many ties
            v = levels[torch.randint(0, len(levels), (block,), generator=g)]
        elif kind == 1:  # bf16-rounded normals
            v = torch.randn(block, generator=g).to(torch.bfloat16).float()
        else:  # any finite fp32 bit pattern
            bits = torch.randint(-2**31, 2**31, (block,), generator=g, dtype=torch.int64).to(torch.int32)
            v = bits.view(torch.float32)
            v = torch.where(torch.isfinite(v), v, torch.zeros_like(v))
        valid = torch.rand(block, generator=g) < (1.0 if trial % 4 == 0 else 0.7)
        nv = int(valid.sum())
        for n in (1, 59, nv - 1, nv, nv + 3):
            if n >= 1:
                cases.append((v, valid, n))
    for v, valid, n in cases:
        out = torch.zeros(block, dtype=torch.int32, device=DEVICE)
        _top_n_probe[(1,)](v.to(DEVICE), valid.to(torch.int32).to(DEVICE), out, n, BLOCK=block)
        b = v.view(torch.int32).to(torch.int64)
        b = torch.where(b >= 0, b, b ^ 0x7FFFFFFF)
        key = (b << 32) | (0x7FFFFFFF - torch.arange(block))
        key = torch.where(valid, key, torch.full_like(key, -2**63))
        want = torch.zeros(block, dtype=torch.bool)
        want[key.argsort(descending=True)[:min(n, int(valid.sum()))]] = True
        assert torch.equal(out.cpu().bool(), want), (n, int(valid.sum()))


def _div_on_device(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    x, d = x.to(DEVICE).contiguous(), d.to(DEVICE).contiguous()
    y = torch.empty_like(x)
    block = 4096
    _div_probe[(-(-x.numel() // block),)](x, d, y, x.numel(), BLOCK=block)
    return y.cpu()


def test_div_rn_by_matches_division():
    """The attention's divisions (scores by sqrt(head_dim), probabilities by their row's sum of
    exp) are a multiply by the correctly rounded reciprocal plus one FMA correction: equal to the
    IEEE quotient (CPU fp32 division) for every quotient of magnitude >= 2^-100 - every finite
    bf16 score for several head dims, random fp32 bit patterns, and probabilities exp(-u) / l -
    and at most one unit apart below that."""
    import math

    g = torch.Generator().manual_seed(5)
    bits = torch.arange(65536, dtype=torch.int32) << 16  # every bf16 value, as fp32
    bf = bits.view(torch.float32)
    bf = bf[torch.isfinite(bf)]
    rand = torch.randint(-2**31, 2**31 - 1, (1 << 18,), generator=g, dtype=torch.int32).view(torch.float32)
    rand = rand[torch.isfinite(rand)]
    cases = [(bf, torch.full_like(bf, math.sqrt(hd))) for hd in (32, 64, 80, 96, 128, 256)]
    cases.append((rand, torch.full_like(rand, math.sqrt(128))))
    e = torch.exp(-torch.rand(1 << 18, generator=g, dtype=torch.float64) * 100).float()
    cases.append((e, (1 + torch.rand(1 << 18, generator=g) * 2047).float()))
    tiny = 2.0 ** -100
    for x, d in cases:
        want = x / d
        got = _div_on_device(x, d)
        big = want.abs() >= tiny
        assert torch.equal(got[big], want[big]), (x[big][got[big] != want[big]][:4], d[0])
        off = ~big & (got != want)  # (+0 and -0 compare equal: a -0 quotient may come out +0)
        ulps = (got[off].view(torch.int32).long() - want[off].view(torch.int32).long()).abs()
        assert ulps.numel() == 0 or int(ulps.max()) <= 1, ulps.max()
        assert big.sum() > 0.5 * x.numel()  # most of every case is in the exact range


def test_launches_pin_fp_fusion(monkeypatch):
    """Every launch asks for contracted multiply-adds explicitly: the bits and timings measured so
    far were compiled that way, and Triton 3.10 turns its default off."""
    from frontier.backends.triton.launch import Launcher

    seen = []
    for path in ("_launch_steps", "_persistent_launch", "_persistent_graphed", "_capture"):
        real = getattr(Launcher, path)

        def spy(self, args, const, grid, *rest, _real=real):
            seen.append(const.get("enable_fp_fusion"))
            return _real(self, args, const, grid, *rest)

        monkeypatch.setattr(Launcher, path, spy)
    cfg = random_config()
    w = random_weights(cfg, seed=1, device=DEVICE)
    ids, feats = random_inputs(cfg, context=4, seed=2)
    frontier_generate(cfg, feats.to(DEVICE), "triton", input_ids=ids.to(DEVICE), weights=w)
    assert seen and all(v is True for v in seen), seen


@pytest.mark.parametrize("seed,rows,vocab,bmk", [(3, 20, 300, 16), (8, 37, 251, 32), (13, 5, 64, 32)])
def test_lm_statistics_with_32_bit_keys_match_64_bit_keys_and_topk(seed, rows, vocab, bmk):
    """The wide lm_head's per-program statistics (``kernels._lm_slab_stats``) rank 16-bit logits
    by 32-bit keys (the plan's KEY16_LM): every program's top-K keys, max and sum of exp must be
    bit for bit those of the 64-bit keys - with ties (runs of equal logits, which go to the lower
    index), -0 next to +0, -inf, row tiles past the last row and a last slab cut short - and
    the kept logits must be torch.topk's values for each (row, slab)."""
    grid, K, KP = 3, 10, 16
    g = torch.Generator().manual_seed(seed)
    lg = (torch.randn(rows, vocab, generator=g) * 4).half()
    lg[0, :40] = 1.5  # a tie wider than K
    lg[1, 3], lg[1, 7] = -0.0, 0.0
    lg[1, 20:] = -0.0
    lg[2, ::3] = float("-inf")
    lg[-1] = lg[-1].round()  # few distinct values: ties everywhere
    rp = -(-vocab // grid)
    bnp = 1 << (rp - 1).bit_length()
    outs = []
    for key16 in (False, True):
        keys = torch.zeros(grid * rows * KP, dtype=torch.int64, device=DEVICE)
        mx = torch.zeros(grid * rows, device=DEVICE)
        sm = torch.zeros(grid * rows, device=DEVICE)
        _lm_stats_probe[(grid,)](lg.to(DEVICE), vocab, keys, mx, sm, rp, rows, K, KP=KP, BMK=bmk, BNP=bnp,
                                 KEY16=key16)
        outs.append((keys.cpu(), mx.cpu(), sm.cpu()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    keys = outs[1][0].view(grid, rows, KP)
    assert (keys[:, :, K:] == -0x7FFFFFFFFFFFFFFF).all()  # entries from K on stay empty
    for p in range(grid):
        sl = lg[:, p * rp: (p + 1) * rp].float()
        kk = keys[p, :, :K]
        idx = 0x7FFFFFFF - (kk & 0x7FFFFFFF)
        assert torch.equal(sl.gather(1, idx - p * rp), torch.topk(sl, K, dim=1).values)
        # within a run of equal logits the lower indices come first (+0 ranks above -0)
        bits = lg[:, p * rp: (p + 1) * rp].view(torch.int16).gather(1, idx - p * rp)
        same = bits[:, 1:] == bits[:, :-1]
        assert (idx[:, 1:][same] > idx[:, :-1][same]).all()
        torch.testing.assert_close(outs[1][1].view(grid, rows)[p], sl.max(1).values)


def _partials(lg: torch.Tensor, slab: int, K: int, KP: int, P: int):
    """What the lm_head leaves for MERGE, built on the host from 16-bit logits [rows, V]: per
    program p < P (slab p*slab..) and row, the slab's top-K as 64-bit ``_key``s (value as fp32,
    then lower index; empty entries past the slab's end), its max and its sum of exp."""
    rows, V = lg.shape
    keys = torch.full((P, rows, KP), -0x7FFFFFFFFFFFFFFF, dtype=torch.int64)
    mx = torch.full((P, rows), float("-inf"))
    sm = torch.zeros(P, rows)
    for p in range(P):
        sl = lg[:, p * slab: (p + 1) * slab].float()
        if sl.shape[1] == 0:
            continue
        b = sl.view(torch.int32).to(torch.int64)
        b = torch.where(b >= 0, b, b ^ 0x7FFFFFFF)
        key = (b << 32) | (0x7FFFFFFF - (p * slab + torch.arange(sl.shape[1])))
        n = min(K, sl.shape[1])
        keys[p, :, :n] = key.sort(dim=1, descending=True).values[:, :n]
        mx[p] = sl.max(1).values
        safe = torch.where(mx[p] == float("-inf"), 0.0, mx[p])  # (a slab of -inf logits sums to 0)
        sm[p] = torch.exp(sl - safe[:, None]).sum(1)
    return keys, mx, sm


@pytest.mark.parametrize("seed,rows,vocab,P,grid", [(2, 7, 200, 5, 3), (9, 12, 77, 9, 16), (4, 3, 40, 4, 1)])
def test_merge_with_32_bit_keys_matches_64_bit_keys(seed, rows, vocab, P, grid):
    """MERGE (``kernels._ph_merge``) ranks the rows' candidates by 32-bit keys for 16-bit dtypes
    (the plan's KEY32_MG): its log-probs and tokens must be bit for bit those of the 64-bit
    keys - with log-probs that tie after rounding (runs of equal and of nearly equal logits, so
    the lower index must win), +0 beside -0, -inf, a last slab shorter than K (empty entries),
    more programs than rows and fewer - and ranked: log-probs non-increasing, ties in index order."""
    K, KP = 10, 16
    g = torch.Generator().manual_seed(seed)
    lg = (torch.randn(rows, vocab, generator=g) * 3).half()
    lg[0, :30] = 20.0  # a tie wider than K, above every other logit
    lg[1, ::2] = (4.0 + torch.arange(0, vocab, 2) * 1e-3).half()  # distinct logits, log-probs that round alike
    lg[2, 5], lg[2, 9] = -0.0, 0.0
    lg[2, 10:] = float("-inf")
    slab = -(-vocab // P)
    keys, mx, sm = _partials(lg, slab, K, KP, P)
    # slots as the kernel lays them out: keys [program, MR rows, KP], max / sum [program, MR]
    MR = rows + 1
    pad = lambda t, fill: torch.cat([t, torch.full((P, 1) + t.shape[2:], fill, dtype=t.dtype)], 1)  # noqa: E731
    kk, mm, ss = pad(keys, -0x7FFFFFFFFFFFFFFF), pad(mx, float("-inf")), pad(sm, 0.0)
    outs = []
    for key32 in (False, True):
        lp = torch.zeros(rows * KP, device=DEVICE)
        tok = torch.zeros(rows * KP, dtype=torch.int32, device=DEVICE)
        _merge_probe[(grid,)](kk.to(DEVICE), mm.to(DEVICE), ss.to(DEVICE), lp, tok, torch.zeros(1, dtype=torch.float16,
                              device=DEVICE), rows, P, K, MR, KP=KP, BLOCK_P=1 << (P - 1).bit_length(), KEY32=key32)
        outs.append((lp.cpu().view(rows, KP)[:, :K], tok.cpu().view(rows, KP)[:, :K]))
    assert torch.equal(outs[0][0].view(torch.int32), outs[1][0].view(torch.int32))
    assert torch.equal(outs[0][1], outs[1][1])
    lp, tok = outs[1]
    assert torch.equal(lp, lp.half().float())  # rounded to the dtype
    assert (lp[:, 1:] <= lp[:, :-1]).all()
    tie = lp[:, 1:] == lp[:, :-1]
    assert tie.any() and (tok[:, 1:][tie] > tok[:, :-1][tie]).all()
    assert torch.equal(tok[0], torch.arange(K, dtype=torch.int32))  # the tie of the row's best logit
    assert ((tok >= 0) & (tok < vocab)).all() and all(len(set(t.tolist())) == K for t in tok)


@pytest.mark.parametrize("seed,rows,vocab,grid",
                         [pytest.param(5, 6, 200, 4, marks=pytest.mark.slow), (12, 9, 77, 2), (6, 3, 40, 5)])
def test_merge_rows_rank_every_log_prob(seed, rows, vocab, grid):
    """MERGE from the wide lm_head's logits scratch (``kernels._ph_merge_rows``,
    ``Tuning.merge_rows``) returns each row's top-K of ``log_softmax`` rounded to the dtype,
    ties to the lower index, as torch ranks it on the host: over one chunk of the row and over
    several (the later chunks' rounds merge the list so far), with 32-bit and 64-bit keys (the
    same bits), in groups of 8 and 16 entries, for rows with a tie wider than K, log-probs that
    round alike, +0 beside -0 and -inf, on fewer programs than rows and more."""
    K, KP = 10, 16
    g = torch.Generator().manual_seed(seed)
    lg = (torch.randn(rows, vocab, generator=g) * 3).half()
    lg[0, 7:37] = 20.0  # a tie wider than K, above every other logit
    lg[1, ::2] = (4.0 + torch.arange(0, vocab, 2) * 1e-3).half()  # distinct logits, log-probs that round alike
    lg[2, 5], lg[2, 9] = -0.0, 0.0
    lg[2, 10:] = float("-inf")
    x = lg.float()
    mx = x.max(1, keepdim=True).values
    ref_lp = ((x - mx) - torch.log(torch.exp(x - mx).sum(1, keepdim=True))).half().float()
    # rank by (log-prob, lower index): a stable sort of the negated log-probs
    order = torch.sort(-ref_lp, dim=1, stable=True).indices[:, :K]
    for bv, grp in ((16, 8), (64, 16), (1 << (vocab - 1).bit_length(), 8)):
        for key32 in (False, True):
            lp = torch.zeros(rows * KP, device=DEVICE)
            tok = torch.zeros(rows * KP, dtype=torch.int32, device=DEVICE)
            _merge_rows_probe[(grid,)](lg.to(DEVICE), vocab, lp, tok, rows, K, KP=KP, BV=bv, KEY32=key32, G=grp)
            lp, tok = lp.cpu().view(rows, KP)[:, :K], tok.cpu().view(rows, KP)[:, :K]
            assert torch.equal(tok.long(), order), (bv, grp, key32)
            assert torch.equal(lp, ref_lp.gather(1, order)), (bv, grp, key32)
    assert torch.equal(order[0], torch.arange(7, 7 + K))  # the tie of the row's best logit


@pytest.mark.slow  # (every wide launch merges from the logits scratch; in one chunk in the default run's tests)
@pytest.mark.parametrize("arch,seed", [("eagle3", 71), ("eagle2", 73)])
def test_wide_launch_merge_rows_match_torch_ref(arch, seed, monkeypatch):
    """Wide launches with MERGE ranking each row from the lm_head's logits scratch
    in several chunks (``merge_chunk`` 32, halved for fp32's 64-bit keys,
    of a 56-entry vocabulary): each sequence of a ragged batch drafts what torch_ref drafts for
    it alone, over three calls, with the context step's own builds (its register lm_head keeps
    its partials, and its MERGE reads those)."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = _arch_config(arch, 120, total_token=14, depth=3, top_k=8, vocab_size=56)
    w = random_weights(cfg, seed=seed, lm_head_scale=6.0, device=DEVICE)
    from frontier.backends.triton.kernels import Phase

    tn = Tuning(bm_max=32, wide_bm=32, wide_acc_elems=512, split_rows=64, merge_chunk=32)
    d = Launcher(cfg, torch.float32, torch.device(DEVICE), tn)
    p = d.plan(3)
    assert p.wide and p.const["MG_ROWS"] and p.const["BV_MG"] == 16 and not p.const["KEY32_MG"]
    assert p.ctx_const.get(Phase.MERGE) == dict(MG_ROWS=False)
    _drafting_with(monkeypatch, d)
    seqs, g = _ragged(cfg, seed + 1, batch=3, lo=2, hi=9)
    _batch_vs_single(cfg, w, seqs, g, DEVICE, calls=3)
    big = _arch_config(arch, 70000, vocab_size=70000)  # (past 65536: the lm_head keeps its own statistics)
    assert not Launcher(big, torch.float32, torch.device(DEVICE), tn).plan(3).const["MG_ROWS"]


def test_merge_keys_and_row_grids_draft_the_same_bits():
    """An fp16 launch drafts the same trees, scores and cache rows, bit for bit, with MERGE's
    32-bit keys (the plan's KEY32_MG for 16-bit dtypes) as with 64-bit ones (set by hand); the
    tree depths' row phases run on one program per row (step launches: more programs than the
    2-program grid), MERGE and the final norm too unless they stream the next QKV; the plan
    turns the 32-bit keys off for fp32 and for vocabularies past 65536."""
    from frontier.backends.triton.kernels import CONTEXT_STEP, Phase
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config(total_token=18, depth=2, top_k=4, vocab_size=90, target_vocab_size=150)
    w = random_weights(cfg, seed=47, lm_head_scale=6.0, device=DEVICE, dtype=torch.float16)
    seqs, _ = _ragged(cfg, 48, batch=3, lo=3, hi=9)
    nb, rows = len(seqs), len(seqs) * cfg.top_k
    outs = []
    for key32 in (False, True):
        d = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning())
        assert d.plan(nb).const["KEY32_MG"]
        if not key32:
            _with_consts(d, nb, KEY32_MG=False)
        outs.append(_launch_on(d, cfg, w, seqs))
        for c in d.schedule_list:  # the tree depths' row phases
            ph, i = divmod(c, 256)
            if i == CONTEXT_STEP:
                continue
            if ph in (Phase.MERGE, Phase.NORM_F):
                ahead = i + 1 < cfg.depth and d.qkv_ahead(nb)
                assert d.step_grid(c, nb, 9) == (d.grid if ahead else rows)
            elif ph in (Phase.PREP3, Phase.ROPE, Phase.NORM_POST):
                assert d.step_grid(c, nb, 9) == rows
    _assert_same_bits(*outs)

    def key32(dtype, vocab):
        c = random_config(vocab_size=vocab, target_vocab_size=vocab)
        return Launcher(c, dtype, torch.device("cpu"), Tuning(grid=2)).plan(1).const["KEY32_MG"]

    assert key32(torch.bfloat16, 65536) and key32(torch.float16, 300)
    assert not key32(torch.float32, 300) and not key32(torch.bfloat16, 65537)


@pytest.mark.parametrize("wide", [pytest.param(True, marks=pytest.mark.slow), False])
def test_fp16_launch_with_32_bit_lm_keys_matches_64_bit_keys(wide):
    """An fp16 launch drafts the same trees, scores and cache rows, bit for bit, with the
    lm_head's 32-bit ranking keys (the plan's KEY16_LM) as with 64-bit ones (set by hand): a
    wide launch (logits scratch, statistics from there) of 5 sequences, and a narrow one of 2
    whose slabs are one sub-slab (the keys of the accumulator in registers)."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config(total_token=18, depth=2, top_k=4, vocab_size=90, target_vocab_size=150)
    w = random_weights(cfg, seed=43, lm_head_scale=6.0, device=DEVICE, dtype=torch.float16)
    seqs, _ = _ragged(cfg, 44, batch=5 if wide else 2, lo=3, hi=9)
    nb = len(seqs)
    outs = []
    for key32 in (False, True):
        over = dict(bm_max=16, wide_bm=16, wide_acc_elems=256, split_rows=64) if wide else {}
        d = Launcher(cfg, w.dtype, torch.device(DEVICE), Tuning(**over))
        c = d.plan(nb).const
        assert c["KEY16_LM"] and c["LM_WIDE"] == wide
        assert wide or c["BNP_LM"] <= c["BNS_LM"]  # the narrow lm_head's one sub-slab
        if not key32:
            _with_consts(d, nb, KEY16_LM=False)
        outs.append(_launch_on(d, cfg, w, seqs))
    _assert_same_bits(*outs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_rn_matches_div_rn(dtype):
    """The gate/up epilogue's SiLU for 16-bit dtypes (``kernels._silu_rn``: reciprocal, Newton
    step, two residual corrections) equals ``div_rn(g, 1 + exp(-g))`` bit for bit for every value
    g of the dtype (all 65536 bit patterns: zeros, subnormals, infinities, NaNs), so the
    rounded activations match the reference's division. (The interpreter has no bf16: there
    the bf16 values run as fp32 too, which is all the kernel sees.)"""
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).float().to(DEVICE)
    y, ref = torch.empty_like(g), torch.empty_like(g)
    _silu_probe[(-(-g.numel() // 4096),)](g, y, ref, g.numel(), BLOCK=4096)
    y, ref = y.cpu(), ref.cpu()
    nan = ref.isnan()
    assert torch.equal(y.isnan(), nan)
    assert torch.equal(y[~nan].view(torch.int32), ref[~nan].view(torch.int32))


def test_32_bit_lm_keys_only_for_16_bit_dtypes_and_slabs_they_can_index():
    """The 32-bit keys hold a slab-local index in 16 bits: the plan turns them off for fp32 and
    for slabs wider than 65536 rows (a 70000-token vocabulary on one program), and on otherwise."""
    from frontier.backends.triton.launch import Launcher, Tuning

    cfg = random_config(vocab_size=70000, target_vocab_size=70000)

    def key16(dtype, grid, **over):
        return Launcher(cfg, dtype, torch.device("cpu"), Tuning(grid=grid, **over)).plan(1).const["KEY16_LM"]

    assert key16(torch.float16, 2) and key16(torch.bfloat16, 2)
    assert not key16(torch.float16, 1)
    assert not key16(torch.float32, 2)


@pytest.mark.parametrize("seed,B,K,i,grid,d2t", [(3, 2, 5, 1, 2, False), (8, 3, 10, 2, 2, True),
                                                 (11, 1, 3, 0, 1, True)])
def test_select_prunes_the_children_as_a_stable_sort_by_score(seed, B, K, i, grid, d2t):
    """SELECT at a tree depth (``kernels._ph_select``) on crafted rows: every child's score
    ``round(parent's score + its log-prob)`` and its token (mapped by d2t) go to the candidate
    list at flat index row * K + rank, and the next frontier is the K best children by (score,
    lower flat index) - a stable sort, on the host - with their scores, tokens, parent rows and
    ancestor slots, and each row's parent entry. Scores are drawn from a few fp16 levels, so
    many children tie; fp16 ranks by 32-bit keys (KEY32), and must give the bits of the 64-bit
    keys, as fp32 does."""
    g = torch.Generator().manual_seed(seed)
    KP, BLOCK_K, BLOCK_A, V = 16, 1 << (K - 1).bit_length(), 1 << (i + 2).bit_length(), 50
    SK, C, RPW = (i + 2) * K, K + (i + 1) * K * K, 1 + (i + 1) * K
    R = B * K
    levels = torch.tensor([-0.5, -1.0, -1.25, -2.0, -3.0])
    # each row's log-probs are ranked (non-increasing), as MERGE leaves them
    lp = levels[torch.randint(0, len(levels), (R, K), generator=g)].sort(dim=1, descending=True).values
    score = -levels[torch.randint(0, len(levels), (R,), generator=g)] * 2
    tok = torch.randint(0, V, (R, K), generator=g)
    d2t_tab = torch.randint(0, 1000, (V,), generator=g) if d2t else torch.zeros(1, dtype=torch.int64)
    pick_old = torch.randint(0, K * K, (R,), generator=g)
    anc0 = torch.randint(0, 99, (R, BLOCK_A), generator=g, dtype=torch.int32)
    results = []
    for dtype, key32 in ((torch.float32, False), (torch.float16, False), (torch.float16, True)):
        sel_lp = torch.zeros(R, KP)
        sel_lp[:, :K] = lp
        sel_tok = torch.zeros(R, KP, dtype=torch.int64)
        sel_tok[:, :K] = tok
        out = dict(fr_score=score.clone(), fr_tok=torch.zeros(R, dtype=torch.int64),
                   fr_src=torch.zeros(R, dtype=torch.int32), fr_pick=pick_old.clone(), anc=anc0.clone(),
                   cand_score=torch.zeros(B, C), cand_tok=torch.zeros(B, C, dtype=torch.int64),
                   row_par=torch.zeros(B, RPW, dtype=torch.int64))
        dev = {k: v.to(DEVICE) for k, v in out.items()}
        _select_probe[(grid,)](sel_lp.to(DEVICE), sel_tok.to(DEVICE), d2t_tab.to(DEVICE), dev["fr_score"], dev["fr_tok"],
                               dev["fr_src"], dev["fr_pick"], dev["anc"], dev["cand_score"], dev["cand_tok"],
                               dev["row_par"], torch.zeros(1, dtype=dtype, device=DEVICE), B, i, K, KP, SK, C, RPW, V,
                               HAS_D2T=d2t, BLOCK_K=BLOCK_K, BLOCK_A=BLOCK_A, KEY32=key32)
        results.append({k: v.cpu() for k, v in dev.items()})
    for r in results[1:]:  # fp16: 32-bit keys give the 64-bit keys' bits; fp32: the same, its sums being exact here
        for k in r:
            assert torch.equal(r[k], results[0][k]), k
    got = results[2]
    base = K + i * K * K
    for b in range(B):
        rows = slice(b * K, (b + 1) * K)
        cs = (score[rows, None] + lp[rows]).half().float().reshape(-1)  # [K*K], flat = row * K + rank
        ctok = tok[rows].reshape(-1) + (d2t_tab[tok[rows].reshape(-1)] if d2t else 0)
        assert torch.equal(got["cand_score"][b, base: base + K * K], cs)
        assert torch.equal(got["cand_tok"][b, base: base + K * K], ctok)
        order = torch.sort(-cs, stable=True).indices[:K]  # the best K, ties to the lower flat index
        assert len(set(cs[order].tolist())) < K or K < 4  # the levels make ties among the picks
        assert torch.equal(got["fr_pick"][rows], order)
        assert torch.equal(got["fr_score"][rows], cs[order])
        assert torch.equal(got["fr_tok"][rows], ctok[order])
        prow = order // K
        assert torch.equal(got["fr_src"][rows], (b * K + prow).int())
        assert torch.equal(got["anc"][rows, : i + 1], anc0[rows][prow, : i + 1])
        assert torch.equal(got["anc"][rows, i + 1], (b * SK + (i + 1) * K + torch.arange(K)).int())
        offset = 1 if i == 0 else 1 + K + (i - 1) * K * K
        assert torch.equal(got["row_par"][b, 1 + i * K: 1 + (i + 1) * K], pick_old[rows] + offset)


def test_tuning_option_overrides_fields_and_refuses_bad_values():
    """The backend's ``tuning`` option: "field=value" overrides (or a Tuning) pick a drafter of
    that tuning, kept apart from the default one, and draft what the default drafts here; an
    unknown field, a value of the wrong type, a non-positive size or a tile that is not a power of
    two is an InputError naming the option, and the cache is left as it was."""
    from frontier.backends.triton.tuning import Tuning

    cfg = random_config(total_token=12, depth=2, top_k=3, vocab_size=60, target_vocab_size=90)
    w = random_weights(cfg, seed=5, device=DEVICE)
    ids, feats = random_inputs(cfg, context=6, seed=6)
    ids, feats = ids.to(DEVICE), feats.to(DEVICE)
    ref = frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w)
    got = frontier_generate(cfg, feats, "triton", input_ids=ids, weights=w, tuning="merge_group=4, lin_fold=2")
    assert torch.equal(ref.draft_tokens, got.draft_tokens) and torch.equal(ref.retrieve_indices, got.retrieve_indices)
    be = frontier.get_backend("triton")
    tuned = be.drafter(cfg, w.dtype, torch.device(DEVICE), tuning=Tuning(merge_group=4, lin_fold=2))
    assert tuned is not be.drafter(cfg, w.dtype, torch.device(DEVICE))
    assert tuned.tuning.merge_group == 4 and tuned.tuning.lin_fold == 2
    cache = got.cache
    cache.truncate(cache.length - 1)  # (each bad call brings the last row again)
    n = cache.length
    for bad, msg in [("no_such=1", "no field 'no_such'"), ("grid=two", "grid takes an integer"),
                     ("grid=0", "grid must be a positive integer"), ("BM=24", "BM must be a power of two"),
                     ("fused_attention=maybe", "fused_attention takes true or false"), (3, "must be a Tuning")]:
        with pytest.raises(frontier.InputError, match=msg) as e:
            frontier_generate(cfg, feats[:, -1:], "triton", input_ids=ids, weights=w, cache=cache, tuning=bad)
        assert "tuning" in str(e.value)
        assert cache.length == n
