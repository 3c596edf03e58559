"""``frontier bench``: the draft call against the GPU's memory-bandwidth floor.

At batch 1 one draft call is bound by reading weights: the fc once, then the layer and the
lm_head once per forward (the context step plus ``depth`` tree depths). In one run this module
measures the device's copy bandwidth (a large device-to-device copy, bytes read + written),
computes that floor, and times the backends on the same random head (warm, CUDA events, median
of many calls), reporting ms, % of the floor (floor / time) and speed-ups.

The timed call is the steady-state one of a generation loop: the cache already holds
``context - new_rows`` rows and ``new_rows`` new target features arrive. Between calls the cache
is truncated back, so every timed call does the same work.

Batches (``--batch 1,4,16,64``). Batch 1 is the single-sequence call above
(:class:`CallSetup`, ``frontier_generate``), so batch-1 numbers compare across batch runs.
A batch of B > 1 (:class:`BatchCallSetup`) is B sequences on the same head, each with its own
random ids and features, their caches the slots of one :class:`~frontier.batch.BatchDraftCache`
prefilled by torch_ref; each timed call truncates every slot back to its prefill length and
drafts all B trees with one ``frontier_generate_batch`` (``ragged=True`` spreads the sequences'
contexts over ±25% of ``context`` so the ragged path is timed too). The floor of a batch call is
the same weight bytes as at batch 1: a batched kernel reads the weights once for all sequences,
so ``% floor`` says how close the whole batch call comes to one weight pass. It leaves out the
cached K/V rows every forward attends over; they grow with B x context and are reported apart
(``kv_mb``: at B=64, context 512 on the 8B head they add about a sixth to the weight bytes) — at
large B the call also stops being bandwidth-bound (B x top_k rows per matmul). Each batch row
also reports ms per sequence (ms / B) and its ms per call over the batch-1 row's (``x b1``).

Variants. ``<backend>`` is the whole ``frontier_generate`` call as a user makes it (validation,
launch, the Frontier's assembly). ``triton launch`` is the triton drafter's launch (graph replay)
with its host work but no validation; ``triton kernel`` its device work alone. ``<backend>
captured`` is a :class:`frontier.Drafter`'s whole step (device-side staging, the draft, the
validity flags) replayed as one CUDA graph, timed like a call (host included), and ``triton
captured kernel`` the same replay's device time.

Weights (``--weights plain,fp8``). ``plain`` times the head in the compute dtype; ``fp8`` the same
head quantized (:meth:`DraftWeights.quantized`: e4m3, a power-of-two scale per output channel),
whose floor counts one byte per weight plus the scales. Both run in one table, a row each.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from .config import FrontierConfig
from .errors import InputError
from .weights import DraftWeights, LayerWeights

#: Head shapes of the presets (random weights of these shapes).
PRESETS: dict[str, dict[str, Any]] = {
    "eagle3-llama3.1-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=32000, target_vocab_size=128256, feature_size=12288, rope_theta=500000.0, rms_norm_eps=1e-5,
    ),
    "eagle3-llama3.2-1b": dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=32000, target_vocab_size=128256, feature_size=6144, rope_theta=500000.0, rms_norm_eps=1e-5,
    ),
}


#: Relative context spread of a ragged batch (``BenchCase.ragged``).
RAGGED_SPREAD = 0.25


@dataclass
class BenchCase:
    preset: str
    depth: int
    top_k: int = 10
    total_token: int = 60
    context: int = 512
    new_rows: int = 4
    batch: int = 1
    head: Any = None  # a frontier.loading.DraftHead: time a real head instead of a random preset
    ragged: bool = False  # batch > 1: spread the sequences' contexts over context ± 25%
    weights: str = "plain"  # "plain": the compute dtype; "fp8": quantized to e4m3 with per-channel scales

    def config(self) -> FrontierConfig:
        if self.head is not None:
            return self.head.config(total_token=self.total_token, depth=self.depth, top_k=self.top_k)
        return FrontierConfig(total_token=self.total_token, depth=self.depth, top_k=self.top_k,
                              architecture="eagle3", **PRESETS[self.preset])

    def contexts(self) -> list[int]:
        """Each sequence's context length L_b (cached rows + ``new_rows``).

        All ``context`` unless ``ragged``: then evenly spread over ``context`` ± 25% (mean
        ``context``), in a fixed shuffled order so the longest sequence is not always last, and
        never below ``new_rows + 1`` (every sequence keeps at least one cached row).
        """
        if self.batch < 1:
            raise InputError(f"batch must be a positive int, got batch={self.batch}")
        if self.context <= self.new_rows or self.new_rows < 1:
            raise InputError(f"context must exceed new_rows >= 1 (the cache holds context - new_rows rows), "
                             f"got context={self.context}, new_rows={self.new_rows}")
        if not self.ragged or self.batch == 1:
            return [self.context] * self.batch
        spread = RAGGED_SPREAD * self.context
        lengths = [round(self.context + spread * (2 * i / (self.batch - 1) - 1)) for i in range(self.batch)]
        order = torch.randperm(self.batch, generator=torch.Generator().manual_seed(self.batch)).tolist()
        return [max(self.new_rows + 1, lengths[i]) for i in order]


@dataclass
class BenchRow:
    preset: str
    depth: int
    batch: int
    device: str
    floor_ms: float
    weight_mb: float
    results: dict[str, float] = field(default_factory=dict)  # variant -> median ms per call
    ragged: bool = False
    contexts: list[int] = field(default_factory=list)  # each sequence's context length
    kv_mb: float = 0.0  # cached K/V rows the call's forwards attend over (not in the floor)
    packed_mb: float = 0.0  # the triton drafter's packed weight copies and embedding-QKV table after the run
    weights: str = "plain"  # BenchCase.weights

    def pct(self, variant: str) -> float:
        return 100.0 * self.floor_ms / self.results[variant]

    def per_seq(self, variant: str) -> float:
        """ms per sequence: the call's ms over the batch size."""
        return self.results[variant] / self.batch

    @property
    def label(self) -> str:
        return f"{self.batch} ragged" if self.ragged and self.batch > 1 else str(self.batch)


def batch1_ratios(rows: list[BenchRow], row: BenchRow) -> dict[str, float]:
    """``row``'s ms per call over the batch-1 row's of the same preset and depth, per variant
    timed in both (empty when the run has no such batch-1 row)."""
    base = next((r for r in rows if r.batch == 1 and r.preset == row.preset and r.depth == row.depth
                 and r.weights == row.weights), None)
    if base is None:
        return {}
    return {v: ms / base.results[v] for v, ms in row.results.items() if v in base.results}


def row_json(rows: list[BenchRow], row: BenchRow) -> dict[str, Any]:
    """One row of the JSON report: the row's fields plus % floor, ms per sequence and x b1."""
    out = asdict(row)
    out["pct_floor"] = {v: row.pct(v) for v in row.results}
    out["per_seq_ms"] = {v: row.per_seq(v) for v in row.results}
    out["x_b1"] = batch1_ratios(rows, row)
    return out


# ----------------------------------------------------------------------------------------------
def device_weights(cfg: FrontierConfig, *, device: Any, dtype: torch.dtype, seed: int = 0,
                   lm_head_scale: float = 4.0) -> DraftWeights:
    """Random head drawn directly on the device (the 8B head's embedding alone is 1 GB)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, f, inter = cfg.hidden_size, cfg.feature_size, cfg.intermediate_size
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def lin(out: int, inp: int, scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(out, inp, generator=g, device=device, dtype=torch.float32)
        return t.mul_(scale / math.sqrt(inp)).to(dtype)

    def norm() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(h, generator=g, device=device)).to(dtype)

    layer = LayerWeights(
        q_proj=lin(qd, 2 * h), k_proj=lin(kvd, 2 * h), v_proj=lin(kvd, 2 * h), o_proj=lin(h, qd),
        gate_proj=lin(inter, h), up_proj=lin(inter, h), down_proj=lin(h, inter),
        post_attention_layernorm=norm(), input_layernorm=norm(),
    )
    d2t = None
    if cfg.vocab_size < cfg.target_vocab_size:
        cpu = torch.Generator().manual_seed(seed)
        targets = torch.sort(torch.randperm(cfg.target_vocab_size, generator=cpu)[: cfg.vocab_size]).values
        d2t = (targets - torch.arange(cfg.vocab_size)).to(device)
    emb = torch.randn(cfg.target_vocab_size, h, generator=g, device=device, dtype=torch.float32).to(dtype)
    w = DraftWeights(architecture="eagle3", embed_tokens=emb, fc_weight=lin(h, f), layers=[layer],
                     lm_head=lin(cfg.vocab_size, h, lm_head_scale), hidden_norm=norm(), norm=norm(), d2t=d2t)
    return w.validate(cfg)


def floor_bytes(cfg: FrontierConfig, w: DraftWeights) -> int:
    """Bytes a draft call must stream: the fc once, layer + lm_head once per forward (the same
    for a batch call: one weight pass serves every sequence). (The triton backend's batch-1
    EAGLE-3 launches read the tree depths' QKV embedding half from a per-head table instead of
    streaming it; the floor still counts it.)"""
    return w.fc_bytes() + (cfg.depth + 1) * w.layer_bytes()


def kv_bytes(cfg: FrontierConfig, contexts: list[int], dtype: torch.dtype) -> int:
    """Cached K/V bytes one call's forwards attend over: each of the ``depth + 1`` forwards reads
    every sequence's context rows (keys and values, all layers). Not part of the floor."""
    row = cfg.num_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * torch.empty((), dtype=dtype).element_size()
    return (cfg.depth + 1) * sum(contexts) * row


def copy_bandwidth(device: Any, nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times)


def timing_reps(backend: str, batch: int, reps: int) -> tuple[int, int]:
    """(warmup, timed) calls for one backend: torch_ref loops sequences in Python, so it runs a
    fifth of ``reps`` at batch 1 and ``reps / (5 B)`` (at least 3, after 2 warm-ups) at batch B."""
    if backend != "torch_ref":
        return 5, reps
    if batch == 1:
        return 5, max(10, reps // 5)
    return 2, max(3, reps // (5 * batch))


# GPU cycles of the busy kernel that device-only timing queues before each timed call: ~2.5 ms at
# 2 GHz, longer than any call's host work (validation, packing, argument binding)
_BUSY_CYCLES = 5_000_000


def time_calls(fn, *, warmup: int = 5, reps: int = 50, device_only: bool = False) -> float:
    """Median ms of ``fn()`` (CUDA events around each call, synchronised after each).

    By default the GPU is idle when the start event is recorded, so the time includes the host
    work before the call's first launch (the latency a caller sees). ``device_only`` queues a
    busy kernel first: the host enqueues the start event, its launches and the end event while the
    GPU is still busy, so the events time the device work alone (``fn`` must not synchronise)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if device_only:
            torch.cuda._sleep(_BUSY_CYCLES)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


WEIGHTS = ("plain", "fp8")


def parse_weights(text: str) -> list[str]:
    """``--weights``: ``"plain,fp8"`` -> ["plain", "fp8"] (each format once, in the given order);
    an :class:`InputError` naming ``--weights`` and the formats otherwise."""
    names = [w.strip() for w in text.split(",") if w.strip()]
    if not names or any(w not in WEIGHTS for w in names):
        raise InputError(f"--weights takes comma-separated formats from {', '.join(WEIGHTS)}, got {text!r}")
    return list(dict.fromkeys(names))


def bench_weights(case: BenchCase, cfg: FrontierConfig, *, device: Any, dtype: torch.dtype, seed: int) -> DraftWeights:
    """The timed head: the loaded one when ``case.head`` is set, else random of the preset's shape;
    quantized to fp8 when ``case.weights`` says so."""
    if case.weights not in WEIGHTS:
        raise InputError(f"weights must be one of {WEIGHTS}, got {case.weights!r}")
    if case.head is not None:
        w = case.head.weights.to(device=device, dtype=dtype)
    else:
        w = device_weights(cfg, device=device, dtype=dtype, seed=seed)
    return w.quantized() if case.weights == "fp8" else w.dequantized()  # (plain: an fp8 head's dequantized form)


def launcher(cfg: FrontierConfig, weights: DraftWeights, dtype: torch.dtype, device: Any):
    """The triton backend's drafter for a head (its weight formats included)."""
    from .backends.triton.fp8 import stream_formats
    from .registry import get_backend

    return get_backend("triton").drafter(cfg, dtype, torch.device(device), formats=stream_formats(weights, dtype))


@functools.lru_cache(maxsize=None)
def _requires_weights(backend: str) -> bool:
    from .registry import get_backend

    return bool(getattr(get_backend(backend), "requires_weights", False))


def head_for(backend: str, weights: DraftWeights) -> Optional[DraftWeights]:
    """The weights to pass ``backend``: none for a backend that takes none (the stub)."""
    return weights if _requires_weights(backend) else None


def sequence_inputs(cfg: FrontierConfig, context: int, *, device: Any, dtype: torch.dtype,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids [1, context + 1] and features [1, context, F] of one sequence (from ``seed``)."""
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(0, cfg.target_vocab_size, (1, context + 1), generator=g, device=device)
    feats = torch.randn(1, context, cfg.feature_size, generator=g, device=device, dtype=torch.float32).to(dtype)
    return ids, feats


class CallSetup:
    """A head, a cache holding ``context - new_rows`` rows, and the next call's inputs."""

    def __init__(self, case: BenchCase, *, device: Any, dtype: torch.dtype, seed: int = 0, backend_for_prefill="torch_ref"):
        from .api import frontier_generate

        self.case, self.device, self.dtype = case, device, dtype
        cfg = self.cfg = case.config()
        self.weights = bench_weights(case, cfg, device=device, dtype=dtype, seed=seed)
        ctx = case.context
        self.ids, feats = sequence_inputs(cfg, ctx, device=device, dtype=dtype, seed=seed + 1)
        self.c = ctx - case.new_rows
        fr = frontier_generate(cfg, feats[:, : self.c], backend=backend_for_prefill, input_ids=self.ids[:, : self.c + 1],
                               weights=self.weights, cache_max_length=ctx + 64)
        self.cache = fr.cache
        self.features = feats[:, self.c:].contiguous()

    def call(self, backend: str, **options: Any):
        from .api import frontier_generate

        self.cache.truncate(self.c)
        return frontier_generate(self.cfg, self.features, backend=backend, input_ids=self.ids,
                                 weights=head_for(backend, self.weights), cache=self.cache, padded=True,
                                 check_token_range=False, **options)


class BatchCallSetup:
    """B sequences on one head: a :class:`~frontier.batch.BatchDraftCache` whose slot b holds
    ``contexts[b] - new_rows`` rows (prefilled sequence by sequence with ``backend_for_prefill``),
    and the next batch call's per-sequence inputs.

    Sequence b draws its ids and features from seed ``seed + 1 + b``: sequence 0 of an even batch
    has the inputs of :class:`CallSetup` with the same seed.
    """

    def __init__(self, case: BenchCase, *, device: Any, dtype: torch.dtype, seed: int = 0,
                 backend_for_prefill: str = "torch_ref", headroom: int = 64):
        from .api import frontier_generate
        from .batch import BatchDraftCache

        self.case, self.device, self.dtype = case, device, dtype
        cfg = self.cfg = case.config()
        self.weights = bench_weights(case, cfg, device=device, dtype=dtype, seed=seed)
        self.contexts = case.contexts()
        n = case.new_rows
        self.prefill = [length - n for length in self.contexts]  # cached rows before each timed call
        self.cache = BatchDraftCache(cfg, case.batch, max_length=max(self.contexts) + headroom, dtype=dtype,
                                     device=device)
        self.ids: list[torch.Tensor] = []
        self.features: list[torch.Tensor] = []
        for b, (length, c) in enumerate(zip(self.contexts, self.prefill)):
            ids, feats = sequence_inputs(cfg, length, device=device, dtype=dtype, seed=seed + 1 + b)
            frontier_generate(cfg, feats[:, :c], backend=backend_for_prefill, input_ids=ids[:, : c + 1],
                              weights=self.weights, cache=self.cache[b], padded=True)
            self.ids.append(ids)
            self.features.append(feats[:, c:].contiguous())  # [1, new_rows, F]; the prefill rows are dropped

    def triton_seqs(self) -> list:
        """The batch call's sequences as the triton launcher takes them (``SeqCall``s), each cache
        truncated to its prefill first, as before every timed call."""
        from .backends.triton.launch import SeqCall

        seqs = []
        for slot, c, ids, feats in zip(self.cache, self.prefill, self.ids, self.features):
            slot.truncate(c)
            seqs.append(SeqCall(feats[0], ids[0, 1 + c:], ids[0, -1:], slot, c, feats.shape[1]))
        return seqs

    def call(self, backend: str, **options: Any):
        from .batch import frontier_generate_batch

        for slot, c in zip(self.cache, self.prefill):
            slot.truncate(c)
        return frontier_generate_batch(self.cfg, self.features, backend=backend, input_ids=self.ids,
                                       weights=head_for(backend, self.weights), caches=self.cache, padded=True,
                                       check_token_range=False, **options)


def run_case(case: BenchCase, *, backends: list[str], device: Any, dtype: torch.dtype, bandwidth: float,
             reps: int = 50, kernel_only: bool = True, persistent: bool = False, captured: bool = True) -> BenchRow:
    make = CallSetup if case.batch == 1 else BatchCallSetup  # batch 1 stays the single-sequence call
    setup = make(case, device=device, dtype=dtype)
    fb = floor_bytes(setup.cfg, setup.weights)
    contexts = case.contexts()
    row = BenchRow(case.preset, case.depth, case.batch, torch.cuda.get_device_name(device),
                   floor_ms=1e3 * fb / bandwidth, weight_mb=fb / 1e6, ragged=case.ragged and case.batch > 1,
                   contexts=contexts, kv_mb=kv_bytes(setup.cfg, contexts, dtype) / 1e6, weights=case.weights)
    for name in backends:
        warmup, r = timing_reps(name, case.batch, reps)
        row.results[name] = time_calls(lambda: setup.call(name), warmup=warmup, reps=r)
        if name == "triton" and kernel_only:  # the default mode's launch with its host work, and the device alone
            row.results["triton launch"] = time_calls(lambda: triton_kernel_only(setup), reps=r)
            row.results["triton kernel"] = time_calls(lambda: triton_kernel_only(setup), reps=r, device_only=True)
        if name == "triton" and persistent:  # the one-launch mode beside the default
            row.results["triton persistent"] = time_calls(lambda: setup.call(name, mode="persistent"), warmup=warmup,
                                                          reps=r)
            if kernel_only:
                row.results["triton persistent kernel"] = time_calls(
                    lambda: triton_kernel_only(setup, "persistent"), reps=r, device_only=True)
        if captured and name in ("triton", "torch_ref"):  # the Drafter's whole step as one graph replay
            drafter = static_drafter(setup, name)
            row.results[f"{name} captured"] = time_calls(lambda: drafter.replay(commit=False), warmup=warmup, reps=r)
            if name == "triton" and kernel_only:
                row.results["triton captured kernel"] = time_calls(lambda: drafter.replay(commit=False), reps=r,
                                                                   device_only=True)
            del drafter
        if name == "triton":
            row.packed_mb = launcher(setup.cfg, setup.weights, dtype, device).packed_bytes / 1e6
    del setup
    torch.cuda.empty_cache()
    return row


def static_drafter(setup, backend: str):
    """A :class:`frontier.Drafter` holding the setup's sequences: each slot's cache rows copied
    from the setup's cache, the timed call's new rows staged. Timed as ``replay(commit=False)``,
    so every replay drafts the same rows from the same cache."""
    from .drafter import Drafter

    if isinstance(setup, BatchCallSetup):
        caches, prefill, ids, feats = list(setup.cache), setup.prefill, setup.ids, setup.features
    else:
        caches, prefill, ids, feats = [setup.cache], [setup.c], [setup.ids], [setup.features]
    d = Drafter(setup.cfg, setup.weights, backend=backend, max_batch=len(caches), max_context=max(
        c + f.shape[1] for c, f in zip(prefill, feats)), max_new_rows=setup.case.new_rows)
    for b, (cache, c) in enumerate(zip(caches, prefill)):
        d.buffers.k[b, :, :, :c].copy_(cache.k[:, :, :c])
        d.buffers.v[b, :, :, :c].copy_(cache.v[:, :, :c])
        d.buffers.lengths[b] = c
        d.stage(b, feats[b], ids[b][0, 1 + c:])
    return d


def triton_kernel_only(setup, mode: str = "graph") -> None:
    """The triton backend's device work alone (no validation, no tree packing): one launch (or
    graph replay) for the setup's sequence (CallSetup) or its whole batch (BatchCallSetup)."""
    d = launcher(setup.cfg, setup.weights, setup.dtype, setup.device)
    if isinstance(setup, BatchCallSetup):
        seqs = setup.triton_seqs()
        d.alloc_outputs(len(seqs))
        d.run_batch(setup.weights, seqs, mode)
        return
    d.alloc_outputs()
    ids = setup.ids[0, 1:]
    d.run(setup.weights, setup.features[0], ids[setup.c:], setup.ids[0, -1:], setup.cache, setup.c,
          setup.case.new_rows, mode)


def phase_breakdown(case: BenchCase, *, device: Any, dtype: torch.dtype, reps: int = 7) -> dict[str, float]:
    """Per-phase ms of one persistent call, from the kernel's TIMING build: program 0 stamps the
    global timer after every grid barrier, so each phase's time includes its barrier. Summed
    over depths (context-step phases listed separately)."""
    setup = CallSetup(case, device=device, dtype=dtype)
    d = launcher(setup.cfg, setup.weights, setup.dtype, setup.device)
    ids = setup.ids[0, 1:]
    d.alloc_outputs()
    runs = []
    for rep in range(reps + 1):
        setup.cache.truncate(setup.c)
        d.run(setup.weights, setup.features[0], ids[setup.c:], setup.ids[0, -1:], setup.cache, setup.c,
              case.new_rows, "persistent", timing=True)
        torch.cuda.synchronize()
        if rep:
            runs.append(d.step_times_us())
    del setup
    return phase_totals(d.schedule.tolist(), runs)


@functools.lru_cache(maxsize=1)
def _phase_names() -> dict[int, str]:
    from .backends.triton.kernels import Phase

    return {int(p): p.name.lower() for p in Phase}


def entry_name(code: int) -> str:
    """The phase name of a triton schedule entry (``phase * 256 + depth``) as the breakdowns print
    it: the lower-case ``Phase`` name, ``"ctx <phase>"`` in the context step, the bare code for a
    phase that has no name."""
    from .backends.triton.kernels import CONTEXT_STEP

    ph, i = divmod(code, 256)
    return ("ctx " if i == CONTEXT_STEP else "") + _phase_names().get(ph, str(ph))


def phase_totals(schedule: list[int], runs: list[list[float]]) -> dict[str, float]:
    """ms per phase of a TIMING run: the median over ``runs`` of each schedule entry's µs (as
    ``Launcher.step_times_us`` returns them), summed over depths per phase name; context-step
    phases are listed separately as ``"ctx <phase>"``."""
    per: dict[str, float] = {}
    for code, us in zip(schedule, (statistics.median(x) for x in zip(*runs))):
        key = entry_name(code)
        per[key] = per.get(key, 0.0) + us / 1e3
    return per


def format_table(rows: list[BenchRow], bandwidth: float) -> str:
    """The bench table: per variant ms and % of the floor (and the speedup over torch_ref when it
    ran); a run with batch rows appends per variant ``ms/seq`` and ``x b1`` (ms per call over the batch-1 row's)."""
    batched = any(r.batch > 1 for r in rows)
    variants: list[str] = []
    for r in rows:
        for v in r.results:
            if v not in variants:
                variants.append(v)
    head = f"device: {rows[0].device if rows else '?'}   copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read+write)\n"
    formats = any(r.weights != "plain" for r in rows)  # a weights column once a row is not plain
    cols = ["preset"] + (["weights"] if formats else []) + ["depth", "batch", "MB/call", "floor ms"]
    for v in variants:
        cols += [f"{v} ms", f"{v} %floor"]
    if "torch_ref" in variants:
        cols += [f"{v} speedup" for v in variants if v != "torch_ref"]
    if batched:
        cols += [f"{v} ms/seq" for v in variants] + [f"{v} x b1" for v in variants]
    lines = [cols]
    for r in rows:
        line = [r.preset] + ([r.weights] if formats else []) + [str(r.depth), r.label, f"{r.weight_mb:.0f}",
                                                                 f"{r.floor_ms:.3f}"]
        for v in variants:
            if v in r.results:
                line += [f"{r.results[v]:.3f}", f"{r.pct(v):.1f}%"]
            else:
                line += ["-", "-"]
        if "torch_ref" in variants:
            for v in variants:
                if v == "torch_ref":
                    continue
                ok = v in r.results and "torch_ref" in r.results
                line.append(f"{r.results['torch_ref'] / r.results[v]:.2f}x" if ok else "-")
        if batched:
            line += [f"{r.per_seq(v):.3f}" if v in r.results else "-" for v in variants]
            ratios = batch1_ratios(rows, r)
            line += [f"{ratios[v]:.2f}x" if v in ratios else "-" for v in variants]
        lines.append(line)
    widths = [max(len(l[i]) for l in lines) for i in range(len(cols))]
    out = [" | ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    packed = {r.preset + (f" {r.weights}" if formats else ""): r.packed_mb for r in rows if r.packed_mb > 0}
    if packed:  # the memory the speed costs (extra to the head's weights)
        out.append("triton's packed weight copies and embedding-QKV table (Tuning.pack_weights, emb_table_mb; "
                   "kept per head): "
                   + ", ".join(f"{p} {mb:.0f} MB" for p, mb in packed.items()))
    return head + "\n".join(out)


def check_batches(batches: Any) -> list[int]:
    """The batch sizes of a run: a non-empty list of positive ints (InputError otherwise)."""
    if not isinstance(batches, (list, tuple)) or not batches:
        raise InputError(f"batches must be a non-empty list of positive ints, got {batches!r}")
    bad = [b for b in batches if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise InputError(f"batch sizes must be positive ints, got {list(batches)} (bad: {bad})")
    return list(batches)


def run_bench(presets: list[str], depths: list[int], *, backends: list[str], dtype: torch.dtype = torch.bfloat16,
              reps: int = 50, json_path: Optional[str] = None, batches: Optional[list[int]] = None,
              breakdown: bool = False, context: int = 512, new_rows: int = 4, head: Any = None,
              ragged: bool = False, persistent: bool = False, captured: bool = True,
              weights: Optional[list[str]] = None) -> str:
    """Bench table text. ``head`` (a loaded DraftHead) replaces the presets with that head; each
    preset and depth is timed at every batch size of ``batches`` (default [1]) for every weight
    format of ``weights`` (default ["plain"]; see the module docstring); ``ragged`` spreads the
    contexts of batch > 1 sequences (see :meth:`BenchCase.contexts`)."""
    batches = check_batches([1] if batches is None else batches)
    weights = ["plain"] if weights is None else list(weights)
    if not weights or any(x not in WEIGHTS for x in weights):
        raise InputError(f"weights must be a non-empty list of {WEIGHTS}, got {weights!r}")
    BenchCase(preset="", depth=1, context=context, new_rows=new_rows).contexts()  # refuse bad sizes before any GPU work
    if not torch.cuda.is_available():
        from .errors import BackendUnavailableError

        raise BackendUnavailableError("frontier bench needs a CUDA GPU (it measures the GPU's bandwidth floor)")
    device = torch.device("cuda")
    bw = copy_bandwidth(device)
    rows = []
    breakdowns = {}
    for preset in presets:
        for depth in depths:
            for fmt in weights:
                for batch in batches:
                    case = BenchCase(preset=preset, depth=depth, context=context, new_rows=new_rows, head=head,
                                     batch=batch, ragged=ragged, weights=fmt)
                    rows.append(run_case(case, backends=backends, device=device, dtype=dtype, bandwidth=bw, reps=reps,
                                         persistent=persistent, captured=captured))
                if breakdown and "triton" in backends:  # the in-kernel phase timer is a batch-1 tool
                    case = BenchCase(preset=preset, depth=depth, context=context, new_rows=new_rows, head=head,
                                     weights=fmt)
                    name = f"{preset} {fmt} depth {depth}" if len(weights) > 1 else f"{preset} depth {depth}"
                    breakdowns[name] = phase_breakdown(case, device=device, dtype=dtype)
    text = format_table(rows, bw)
    for name, ph in breakdowns.items():
        total = sum(ph.values())
        text += f"\n\nper-phase breakdown (in-kernel timer, ms, barrier included) {name}: total {total:.3f}\n"
        text += "\n".join(f"  {k:16s} {v:8.3f}  {100 * v / total:5.1f}%" for k, v in sorted(ph.items(), key=lambda kv: -kv[1]))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"bandwidth_Bps": bw, "rows": [row_json(rows, r) for r in rows], "breakdown": breakdowns,
                       "dtype": str(dtype)}, fh, indent=2)
    return text


__all__ = ["PRESETS", "BenchCase", "BenchRow", "run_bench", "copy_bandwidth", "floor_bytes", "kv_bytes",
           "device_weights", "CallSetup", "BatchCallSetup", "time_calls", "timing_reps", "format_table",
           "batch1_ratios", "row_json", "check_batches", "phase_breakdown", "phase_totals"]
