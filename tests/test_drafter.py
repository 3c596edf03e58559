"""The static-buffer Drafter: its trees and caches equal frontier_generate's over multi-step
ragged sequences, commit/rollback are device operations, bad values are flagged without
touching committed rows, and on a GPU captured replays equal eager drafts."""

from __future__ import annotations

import pytest
import torch

import frontier
from frontier import Drafter, InputError, frontier_generate
from frontier.random_head import random_config, random_weights

from conftest import HAS_CUDA, backend_device

CFG = dict(total_token=12, depth=3, top_k=3, vocab_size=48, target_vocab_size=80)


def _weights(backend, cfg, dtype=torch.float32, device="cpu", seed=0):
    if frontier.get_backend(backend).requires_weights:
        return random_weights(cfg, seed=seed, lm_head_scale=6.0, dtype=dtype, device=device)
    return None


class _Sequences:
    """B sequences drafted two ways: by a Drafter (one slot each) and by frontier_generate calls
    (one batched call per step, caches passed along), fed the same random steps."""

    def __init__(self, cfg, backend, drafter, weights, seed, sampling=False):
        self.cfg, self.backend, self.d, self.w = cfg, backend, drafter, weights
        self.dev, self.sampling = drafter.device, sampling
        self.g = torch.Generator().manual_seed(seed)
        self.ids, self.caches = [], []

    def _rand_ids(self, n):
        return torch.randint(0, self.cfg.target_vocab_size, (1, n), generator=self.g).to(self.dev)

    def _rand_feats(self, n):
        return torch.randn(1, n, self.cfg.feature_size, generator=self.g).to(self.d.dtype).to(self.dev)

    def prefill(self, contexts):
        for slot, big_l in enumerate(contexts):
            ids, feats = self._rand_ids(big_l + 1), self._rand_feats(big_l)
            fr = self.d.prefill(slot, feats, ids)
            ref = frontier_generate(self.cfg, feats, backend=self.backend, input_ids=ids, weights=self.w,
                                    padded=True, sampling=self.sampling, cache_max_length=self.d.max_context)
            assert fr.same_tree(ref)
            self.ids.append(ids)
            self.caches.append(ref.cache)

    def step(self, rows, commit=True, replay=False):
        """Every sequence brings ``rows[b]`` new rows, drafted with ``draft`` (or ``replay``: the
        captured step); returns the reference Frontiers."""
        feats = []
        for slot, n in enumerate(rows):
            self.ids[slot] = torch.cat([self.ids[slot], self._rand_ids(n)], dim=1)
            feats.append(self._rand_feats(n))
            self.d.stage(slot, feats[-1], self.ids[slot][0, -n:])
        out = (self.d.replay if replay else self.d.draft)(len(rows), commit=commit)
        caches = self.caches if self.w is not None else None
        refs = frontier_generate(self.cfg, feats, backend=self.backend, input_ids=self.ids, weights=self.w,
                                 cache=caches, padded=True, sampling=self.sampling)
        self.caches = [r.cache for r in refs]
        return out, refs

    def check(self, refs, exact_scores=False):
        for slot, ref in enumerate(refs):
            fr = self.d.frontier(slot)
            assert fr.same_tree(ref), f"slot {slot}"
            assert int(fr.leaf_count) == int(ref.leaf_count)
            assert not bool(fr.invalid)
            fr.check_invariants(total_token=self.cfg.total_token, depth=self.cfg.depth, top_k=self.cfg.top_k)
            if exact_scores:
                assert torch.equal(fr.scores, ref.scores)
            if self.w is not None:  # the committed rows hold the reference cache's K/V
                c = ref.cache.length
                assert int(self.d.buffers.lengths[slot]) == c
                # (torch_ref's fixed-size matmuls may round a row's K/V differently in the last bit)
                same = torch.equal if exact_scores else lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5)
                assert same(self.d.buffers.k[slot, :, :, :c], ref.cache.k[:, :, :c])
                assert same(self.d.buffers.v[slot, :, :, :c], ref.cache.v[:, :, :c])


@pytest.mark.slow_case(backend_name="triton", seed=1)
@pytest.mark.parametrize("seed", [0, 1])
def test_multi_step_ragged_batch_equals_frontier_generate(backend_name, seed):
    cfg = random_config(**CFG)
    dev = backend_device(backend_name)
    w = _weights(backend_name, cfg, device=dev, seed=seed)
    sampling = bool(seed)
    d = Drafter(cfg, w, backend=backend_name, max_batch=3, max_context=48, sampling=sampling, device=dev, seed=0)
    seqs = _Sequences(cfg, backend_name, d, w, seed, sampling=sampling)
    seqs.prefill([9, 4, 13])
    for rows in ([2, 5, 1], [1, 1, 3], [4, 2, 2]):  # up to depth + 2 accepted rows per step
        _, refs = seqs.step(rows)
        seqs.check(refs, exact_scores=backend_name != "torch_ref")


def test_a_smaller_batch_drafts_the_leading_slots_only(backend_name):
    cfg = random_config(**CFG)
    dev = backend_device(backend_name)
    w = _weights(backend_name, cfg, device=dev)
    d = Drafter(cfg, w, backend=backend_name, max_batch=3, max_context=32, device=dev)
    seqs = _Sequences(cfg, backend_name, d, w, seed=3)
    seqs.prefill([5, 7])
    d.buffers.lengths[2].fill_(11)  # slot 2 is not drafted: its length stays
    out, refs = seqs.step([3, 1])
    assert out.draft_tokens.shape == (2, cfg.total_token)
    seqs.check(refs, exact_scores=backend_name != "torch_ref")
    assert int(d.buffers.lengths[2]) == 11


@pytest.mark.parametrize("backend", ["stub", "torch_ref"])
def test_uncommitted_draft_then_commit_or_discard(backend):
    d, seqs = _cpu_drafter(backend, max_batch=2, seed=4)
    seqs.prefill([6, 3])
    _, refs = seqs.step([2, 3], commit=False)
    assert d.buffers.lengths.tolist() == [6, 3] and d.buffers.pending.tolist() == [2, 3]
    first = [d.frontier(b).draft_tokens.clone() for b in range(2)]
    d.discard()  # the cache stays as it was: drafting the same rows again gives the same trees
    assert d.buffers.lengths.tolist() == [6, 3] and d.buffers.pending.tolist() == [0, 0]
    d.draft(2, commit=False)
    assert all(torch.equal(d.frontier(b).draft_tokens, first[b]) for b in range(2))
    d.commit()
    assert d.buffers.lengths.tolist() == [8, 6] and d.buffers.pending.tolist() == [0, 0]
    seqs.check(refs)


@pytest.mark.parametrize("backend", ["stub", "torch_ref"])
def test_pending_rows_are_per_slot(backend):
    """A smaller uncommitted draft leaves no stale pending rows in the slots it did not draft; a
    rollback or reset drops only its own slots' pending rows; keep_slots moves them with the slot."""
    d, seqs = _cpu_drafter(backend, max_batch=3, seed=9)
    seqs.prefill([4, 6, 8])
    seqs.step([1, 2, 3], commit=False)
    assert d.buffers.pending.tolist() == [1, 2, 3]
    d.draft(2, commit=False)
    assert d.buffers.pending.tolist() == [1, 2, 0]
    d.rollback(torch.tensor([0]), slots=torch.tensor([0]))
    assert d.buffers.pending.tolist() == [0, 2, 0] and d.buffers.lengths.tolist() == [0, 6, 8]
    d.keep_slots([1, 2])
    assert d.buffers.pending.tolist() == [2, 0, 0] and d.buffers.lengths.tolist() == [6, 8, 0]
    d.commit()
    assert d.buffers.lengths.tolist() == [8, 8, 0]
    with pytest.raises(InputError, match="distinct"):
        d.keep_slots([1, 1])


def test_keep_slots_moves_caches_and_drafting_goes_on():
    cfg = random_config(**CFG)
    w = _weights("torch_ref", cfg)
    d = Drafter(cfg, w, backend="torch_ref", max_batch=3, max_context=32, device="cpu")
    seqs = _Sequences(cfg, "torch_ref", d, w, seed=10)
    seqs.prefill([5, 9, 7])
    seqs.step([2, 1, 3])
    d.keep_slots([0, 2])  # sequence 1 left the batch
    seqs.ids, seqs.caches = [seqs.ids[0], seqs.ids[2]], [seqs.caches[0], seqs.caches[2]]
    _, refs = seqs.step([3, 2])
    seqs.check(refs)
    d.keep_slots([1, 0])  # any order (through a copy)
    seqs.ids, seqs.caches = seqs.ids[::-1], seqs.caches[::-1]
    _, refs = seqs.step([1, 4])
    seqs.check(refs)


@pytest.mark.parametrize("backend", ["stub", "torch_ref"])
def test_rollback_then_redraft_equals_a_truncated_cache(backend):
    d, seqs = _cpu_drafter(backend, max_batch=2, seed=5)
    w = seqs.w
    seqs.prefill([7, 5])
    seqs.step([3, 2])
    # roll slot 0 back by its last 3 rows and slot 1 by 1, as after a rejected verify
    d.rollback(torch.tensor([7, 6]))
    assert d.buffers.lengths.tolist() == [7, 6]
    d.rollback(100)  # never grows
    assert d.buffers.lengths.tolist() == [7, 6]
    if w is not None:
        seqs.caches[0].truncate(7)
        seqs.caches[1].truncate(6)
    seqs.ids = [seqs.ids[0][:, :8], seqs.ids[1][:, :7]]
    _, refs = seqs.step([2, 4])
    seqs.check(refs)
    d.reset([1])
    assert d.buffers.lengths.tolist() == [9, 0]


def _cpu_drafter(backend, *, max_batch, seed, max_context=32):
    """A CPU Drafter of ``max_batch`` slots on a random head, and the sequences that feed it."""
    cfg = random_config(**CFG)
    w = _weights(backend, cfg)
    d = Drafter(cfg, w, backend=backend, max_batch=max_batch, max_context=max_context, device="cpu")
    return d, _Sequences(cfg, backend, d, w, seed=seed)


def _hostile_setup(backend):
    cfg = random_config(**CFG)
    w = _weights(backend, cfg, device=backend_device(backend))
    d = Drafter(cfg, w, backend=backend, max_batch=2, max_context=24, device=backend_device(backend))
    seqs = _Sequences(cfg, backend, d, w, seed=6)
    seqs.prefill([10, 8])
    return d, seqs


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.slow_case(backend_name="triton", poison=["no_rows", "too_many_rows", "bad_length", "token_low", "token_high"])
@pytest.mark.parametrize("poison", ["no_rows", "too_many_rows", "overflow", "bad_length", "token_low", "token_high", "nan"])
def test_bad_values_flag_the_slot_and_leave_its_cache(backend_name, poison):
    """Whatever is written to the buffers, no kernel reads or writes out of bounds, the bad slot is
    flagged, its length and committed rows stay, and the other slot drafts as usual."""
    if poison == "nan" and backend_name == "stub":
        pytest.skip("the stub never reads feature values")
    d, seqs = _hostile_setup(backend_name)
    k0, v0 = d.buffers.k[0, :, :, :10].clone(), d.buffers.v[0, :, :, :10].clone()
    seqs.d.stage(0, seqs._rand_feats(2), torch.tensor([1, 2], device=d.device))
    seqs.ids[1] = torch.cat([seqs.ids[1], seqs._rand_ids(3)], dim=1)
    feats1 = seqs._rand_feats(3)
    d.stage(1, feats1, seqs.ids[1][0, -3:])
    b = d.buffers
    if poison == "no_rows":
        b.new_rows[0] = 0
    elif poison == "too_many_rows":
        b.new_rows[0] = d.max_new_rows + 7
    elif poison == "overflow":
        b.lengths[0] = d.max_context - 1  # + 2 new rows > max_context
    elif poison == "bad_length":
        b.lengths[0] = -3
    elif poison == "token_low":
        b.token_ids[0, 0] = -1
    elif poison == "token_high":
        b.token_ids[0, 1] = d.cfg.target_vocab_size
    else:
        b.features[0, 1, 0] = float("nan")
    before = b.lengths[0].item()
    out = d.draft(2)
    assert out.invalid.tolist() == [True, False]
    assert b.lengths[0].item() == before
    assert torch.equal(b.k[0, :, :, :10], k0) and torch.equal(b.v[0, :, :, :10], v0)
    ref = frontier_generate(d.cfg, feats1, backend=backend_name, input_ids=seqs.ids[1], weights=seqs.w,
                            cache=seqs.caches[1], padded=True)
    assert d.frontier(1).same_tree(ref)
    assert b.lengths[1].item() == 11
    # repaired, the slot drafts as if the bad call never happened
    b.lengths[0] = 10
    seqs.ids[0] = torch.cat([seqs.ids[0], seqs._rand_ids(2)], dim=1)
    feats0 = seqs._rand_feats(2)
    d.stage(0, feats0, seqs.ids[0][0, -2:])
    assert d.draft(1).invalid.tolist() == [False]
    ref = frontier_generate(d.cfg, feats0, backend=backend_name, input_ids=seqs.ids[0], weights=seqs.w,
                            cache=seqs.caches[0], padded=True)
    assert d.frontier(0).same_tree(ref)
    assert b.lengths[0].item() == 12


def test_token_ids_past_the_new_rows_are_not_read():
    d, seqs = _hostile_setup("torch_ref")
    d.stage(0, seqs._rand_feats(2), torch.tensor([1, 2]))
    d.buffers.token_ids[0, 2:] = -99  # stale staging beyond n: ignored
    d.buffers.features[0, 2:] = float("nan")
    assert d.draft(1).invalid.tolist() == [False]


def test_constructor_and_argument_errors():
    cfg = random_config(**CFG)
    w = random_weights(cfg, seed=0)
    with pytest.raises(InputError, match="max_batch"):
        Drafter(cfg, w, backend="torch_ref", max_batch=0)
    with pytest.raises(InputError, match="max_new_rows"):
        Drafter(cfg, w, backend="torch_ref", max_new_rows=0)
    with pytest.raises(InputError, match="needs the draft head"):
        Drafter(cfg, None, backend="torch_ref")
    with pytest.raises(InputError, match="dtype"):
        Drafter(cfg, w, backend="torch_ref", dtype=torch.float16)
    d = Drafter(cfg, w, backend="torch_ref", max_batch=2, max_context=16)
    with pytest.raises(InputError, match="batch must be an int in"):
        d.draft(3)
    with pytest.raises(InputError, match="slot must be an int in"):
        d.stage(2, torch.zeros(1, cfg.feature_size), torch.zeros(1, dtype=torch.long))
    with pytest.raises(InputError, match="max_new_rows"):
        d.stage(0, torch.zeros(d.max_new_rows + 1, cfg.feature_size), torch.zeros(d.max_new_rows + 1, dtype=torch.long))
    with pytest.raises(InputError, match="token_ids must be"):
        d.stage(0, torch.zeros(2, cfg.feature_size), torch.zeros(3, dtype=torch.long))
    with pytest.raises(InputError, match="max_context"):
        d.prefill(0, torch.zeros(1, 20, cfg.feature_size), torch.zeros(1, 21, dtype=torch.long))
    assert d.buffers.lengths.tolist() == [0, 0]


def test_a_head_triton_cannot_run_falls_back_when_asked():
    cfg = random_config(total_token=20, depth=1, top_k=17, vocab_size=48, target_vocab_size=80)
    dev = backend_device("triton")
    w = random_weights(cfg, seed=0, device=dev)
    with pytest.raises(InputError, match="top_k <= 16"):
        Drafter(cfg, w, backend="triton", device=dev)
    with pytest.warns(RuntimeWarning, match="top_k <= 16.*falling back to 'torch_ref'"):
        d = Drafter(cfg, w, backend="triton", device=dev, fallback=True)
    assert d.backend == "torch_ref" and d.options == {}


@pytest.mark.parametrize("backend", ["torch_ref", "triton"])
def test_what_a_drafter_derives_from_an_fp8_head_outlives_the_heads_memo(backend):
    """A Drafter's steps (and the graphs that capture them) read tensors derived from an fp8 head
    (torch_ref: the dequantized copy; triton: the concatenated q/k/v scales) that the head keeps
    in its memo; the Drafter holds them too, so ``clear_memo()`` frees none of them and the next
    step drafts the same tree."""
    import gc
    import weakref

    cfg = random_config(**CFG)
    dev = backend_device(backend)
    w = random_weights(cfg, seed=3, lm_head_scale=6.0, device=dev).quantized()
    d = Drafter(cfg, w, backend=backend, max_context=24, device=dev)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, cfg.target_vocab_size, (5,), generator=g)
    d.stage(0, torch.randn(5, cfg.feature_size, generator=g).to(dev), ids.to(dev))
    first = d.draft(1, commit=False).draft_tokens.clone()
    memo = w._memo  # (the head's derived data: key -> (stamp, value))
    derived = [memo["dequantized"][1].layers[0].q_proj] if backend == "torch_ref" else [memo["triton_qkv_scale"][1]]
    refs = [weakref.ref(t) for t in derived]
    del derived
    w.clear_memo()
    gc.collect()
    assert all(r() is not None for r in refs)
    assert torch.equal(d.draft(1, commit=False).draft_tokens, first)


def test_a_backend_without_static_drafting_is_refused_or_falls_back():
    class Plain(frontier.Backend):
        name = "plain_for_drafter_test"
        requires_weights = True

        def generate(self, request):
            raise AssertionError("not called")

    cfg = random_config(**CFG)
    w = random_weights(cfg, seed=0)
    frontier.register_backend("plain_for_drafter_test", Plain())
    try:
        with pytest.raises(InputError, match="cannot draft from static buffers"):
            Drafter(cfg, w, backend="plain_for_drafter_test")
        with pytest.warns(RuntimeWarning, match="falling back to 'torch_ref'"):
            d = Drafter(cfg, w, backend="plain_for_drafter_test", fallback=True)
        assert d.backend == "torch_ref"
    finally:
        frontier.unregister_backend("plain_for_drafter_test")


# -- GPU: capture and replay -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["triton", "torch_ref", "stub"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replays_equal_frontier_generate_over_steps(backend, dtype):
    cfg = random_config(**CFG)
    w = _weights(backend, cfg, dtype=dtype, device="cuda")
    d = Drafter(cfg, w, backend=backend, max_batch=3, max_context=64, device="cuda", dtype=dtype)

    seqs = _Sequences(cfg, backend, d, w, seed=7)
    seqs.prefill([9, 4, 13])
    for rows in ([2, 5, 1], [1, 1, 3], [4, 2, 2], [5, 5, 5]):
        _, refs = seqs.step(rows, replay=True)
        if backend == "torch_ref" and dtype != torch.float32:
            continue  # masked sums round differently: bf16 near-ties may resolve otherwise
        seqs.check(refs, exact_scores=backend == "triton")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_draft_captured_inside_a_callers_graph():
    """The engine's view: staging from device tensors, the draft and a consumer of its outputs in
    one graph of the caller's; each replay drafts the currently staged rows."""
    cfg = random_config(**CFG)
    w = random_weights(cfg, seed=1, device="cuda")
    d = Drafter(cfg, w, backend="triton", max_batch=2, max_context=64, device="cuda")
    seqs = _Sequences(cfg, "triton", d, w, seed=8)
    seqs.prefill([6, 9])
    src_feats = torch.zeros(2, d.max_new_rows, cfg.feature_size, device="cuda")
    src_ids = torch.zeros(2, d.max_new_rows, dtype=torch.long, device="cuda")
    src_rows = torch.ones(2, dtype=torch.long, device="cuda")
    total = torch.zeros((), dtype=torch.long, device="cuda")
    d.warmup(2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d.buffers.features.copy_(src_feats)
        d.buffers.token_ids.copy_(src_ids)
        d.buffers.new_rows.copy_(src_rows)
        out = d.draft(2)
        total.copy_(out.draft_tokens.sum())
    for rows in ([2, 1], [3, 4]):
        feats = []
        for slot, n in enumerate(rows):
            seqs.ids[slot] = torch.cat([seqs.ids[slot], seqs._rand_ids(n)], dim=1)
            feats.append(seqs._rand_feats(n))
            src_feats[slot, :n] = feats[-1][0]
            src_ids[slot, :n] = seqs.ids[slot][0, -n:]
            src_rows[slot] = n
        graph.replay()
        refs = frontier_generate(cfg, feats, backend="triton", input_ids=seqs.ids, weights=w, cache=seqs.caches,
                                 padded=True)
        seqs.caches = [r.cache for r in refs]
        seqs.check(refs, exact_scores=True)
        assert int(total) == int(d.outputs.draft_tokens.sum())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_capture_before_warmup_is_refused():
    cfg = random_config(**CFG)
    d = Drafter(cfg, random_weights(cfg, seed=0, device="cuda"), backend="triton", device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(InputError, match="warmup"):
        with torch.cuda.graph(graph):
            d.draft(1)
