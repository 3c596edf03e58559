"""``frontier bench``: the draft call against the GPU's memory-bandwidth floor.

At batch 1 one draft call is bound by reading weights: the fc once, then the layer and the
lm_head once per forward (the context step plus ``depth`` tree depths). In one run this module
measures the device's copy bandwidth (a large device-to-device copy, bytes read + written),
computes that floor, and times the backends on the same random head (warm, CUDA events, median
of many calls), reporting ms, % of the floor (floor / time) and speed-ups.

The timed call is the steady-state one of a generation loop: the cache already holds
``context - new_rows`` rows and ``new_rows`` new target features arrive. Between calls the cache
is truncated back, so every timed call does the same work.

Batching is a later issue: :class:`BenchCase` carries ``batch`` so ``--batch 1,4,16`` can be
added without changing the table's shape; only ``batch=1`` runs today.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from .config import FrontierConfig
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

    def config(self) -> FrontierConfig:
        if self.head is not None:
            return self.head.config(total_token=self.total_token, depth=self.depth, top_k=self.top_k)
        return FrontierConfig(total_token=self.total_token, depth=self.depth, top_k=self.top_k,
                              architecture="eagle3", **PRESETS[self.preset])


@dataclass
class BenchRow:
    preset: str
    depth: int
    batch: int
    device: str
    floor_ms: float
    weight_mb: float
    results: dict[str, float] = field(default_factory=dict)  # variant -> median ms

    def pct(self, variant: str) -> float:
        return 100.0 * self.floor_ms / self.results[variant]


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
    """Bytes a draft call must stream: the fc once, layer + lm_head once per forward."""
    return w.fc_bytes() + (cfg.depth + 1) * w.layer_bytes()


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


def time_calls(fn, *, warmup: int = 5, reps: int = 50) -> float:
    """Median ms of ``fn()`` (CUDA events around each call, synchronised after each)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


class CallSetup:
    """A head, a cache holding ``context - new_rows`` rows, and the next call's inputs."""

    def __init__(self, case: BenchCase, *, device: Any, dtype: torch.dtype, seed: int = 0, backend_for_prefill="torch_ref"):
        from .api import frontier_generate

        self.case, self.device, self.dtype = case, device, dtype
        cfg = self.cfg = case.config()
        if case.head is not None:
            self.weights = case.head.weights.to(device=device, dtype=dtype)
        else:
            self.weights = device_weights(cfg, device=device, dtype=dtype, seed=seed)
        g = torch.Generator(device=device).manual_seed(seed + 1)
        ctx = case.context
        self.ids = torch.randint(0, cfg.target_vocab_size, (1, ctx + 1), generator=g, device=device)
        feats = torch.randn(1, ctx, cfg.feature_size, generator=g, device=device, dtype=torch.float32).to(dtype)
        self.c = ctx - case.new_rows
        fr = frontier_generate(cfg, feats[:, : self.c], backend=backend_for_prefill, input_ids=self.ids[:, : self.c + 1],
                               weights=self.weights, cache_max_length=ctx + 64)
        self.cache = fr.cache
        self.features = feats[:, self.c:].contiguous()

    def call(self, backend: str, **options: Any):
        from .api import frontier_generate

        self.cache.truncate(self.c)
        return frontier_generate(self.cfg, self.features, backend=backend, input_ids=self.ids, weights=self.weights,
                                 cache=self.cache, padded=True, check_token_range=False, **options)


def run_case(case: BenchCase, *, backends: list[str], device: Any, dtype: torch.dtype, bandwidth: float,
             reps: int = 50, kernel_only: bool = True) -> BenchRow:
    setup = CallSetup(case, device=device, dtype=dtype)
    fb = floor_bytes(setup.cfg, setup.weights)
    row = BenchRow(case.preset, case.depth, case.batch, torch.cuda.get_device_name(device),
                   floor_ms=1e3 * fb / bandwidth, weight_mb=fb / 1e6)
    for name in backends:
        r = reps if name != "torch_ref" else max(10, reps // 5)
        row.results[name] = time_calls(lambda: setup.call(name), reps=r)
        if name == "triton" and kernel_only:
            row.results["triton kernel"] = time_calls(lambda: triton_kernel_only(setup), reps=r)
    del setup
    torch.cuda.empty_cache()
    return row


def triton_kernel_only(setup: CallSetup, mode: str = "persistent") -> None:
    """The triton backend's device work alone (no validation, no tree packing)."""
    from .backends.triton.launch import Drafter
    from .registry import get_backend

    be = get_backend("triton")
    d: Drafter = be.drafter(setup.cfg, setup.dtype, torch.device(setup.device))
    d.alloc_outputs()
    ids = setup.ids[0, 1:]
    d.run(setup.weights, setup.features[0], ids[setup.c:], setup.ids[0, -1:], setup.cache, setup.c,
          setup.case.new_rows, mode)


def phase_breakdown(case: BenchCase, *, device: Any, dtype: torch.dtype, reps: int = 7) -> dict[str, float]:
    """Per-phase ms of one persistent call, from the kernel's TIMING build: program 0 stamps the
    global timer after every grid barrier, so each phase's time includes its barrier. Summed
    over depths (context-step phases listed separately)."""
    from .backends.triton import kernels as K_
    from .backends.triton.launch import Drafter
    from .registry import get_backend

    setup = CallSetup(case, device=device, dtype=dtype)
    be = get_backend("triton")
    d: Drafter = be.drafter(setup.cfg, dtype, torch.device(device))
    names = {v: k[3:].lower() for k, v in vars(K_).items() if k.startswith("PH_")}
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
    med = [statistics.median(x) for x in zip(*runs)]
    per: dict[str, float] = {}
    for code, us in zip(d.schedule.tolist(), med):
        ph, i = divmod(code, 256)
        key = ("ctx " if i == K_.CTX_DEPTH else "") + names.get(ph, str(ph))
        per[key] = per.get(key, 0.0) + us / 1e3
    del setup
    return per


def format_table(rows: list[BenchRow], bandwidth: float) -> str:
    variants: list[str] = []
    for r in rows:
        for v in r.results:
            if v not in variants:
                variants.append(v)
    head = f"device: {rows[0].device if rows else '?'}   copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read+write)\n"
    cols = ["preset", "depth", "batch", "MB/call", "floor ms"]
    for v in variants:
        cols += [f"{v} ms", f"{v} %floor"]
    if "torch_ref" in variants:
        cols += [f"{v} speedup" for v in variants if v != "torch_ref"]
    lines = [cols]
    for r in rows:
        line = [r.preset, str(r.depth), str(r.batch), f"{r.weight_mb:.0f}", f"{r.floor_ms:.3f}"]
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
        lines.append(line)
    widths = [max(len(l[i]) for l in lines) for i in range(len(cols))]
    out = [" | ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return head + "\n".join(out)


def run_bench(presets: list[str], depths: list[int], *, backends: list[str], dtype: torch.dtype = torch.bfloat16,
              reps: int = 50, json_path: Optional[str] = None, batches: Optional[list[int]] = None,
              breakdown: bool = False, context: int = 512, new_rows: int = 4, head: Any = None) -> str:
    """Bench table text. ``head`` (a loaded DraftHead) replaces the presets with that head."""
    if not torch.cuda.is_available():
        from .errors import BackendUnavailableError

        raise BackendUnavailableError("frontier bench needs a CUDA GPU (it measures the GPU's bandwidth floor)")
    batches = batches or [1]
    if batches != [1]:
        from .errors import InputError

        raise InputError(f"--batch: only batch 1 is implemented so far, got {batches}")
    device = torch.device("cuda")
    bw = copy_bandwidth(device)
    rows = []
    breakdowns = {}
    for preset in presets:
        for depth in depths:
            case = BenchCase(preset=preset, depth=depth, context=context, new_rows=new_rows, head=head)
            rows.append(run_case(case, backends=backends, device=device, dtype=dtype, bandwidth=bw, reps=reps))
            if breakdown and "triton" in backends:
                breakdowns[f"{preset} depth {depth}"] = phase_breakdown(case, device=device, dtype=dtype)
    text = format_table(rows, bw)
    for name, ph in breakdowns.items():
        total = sum(ph.values())
        text += f"\n\nper-phase breakdown (in-kernel timer, ms, barrier included) {name}: total {total:.3f}\n"
        text += "\n".join(f"  {k:16s} {v:8.3f}  {100 * v / total:5.1f}%" for k, v in sorted(ph.items(), key=lambda kv: -kv[1]))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"bandwidth_Bps": bw, "rows": [asdict(r) for r in rows], "breakdown": breakdowns,
                       "dtype": str(dtype)}, fh, indent=2)
    return text


__all__ = ["PRESETS", "BenchCase", "BenchRow", "run_bench", "copy_bandwidth", "floor_bytes", "device_weights",
           "CallSetup", "time_calls", "format_table", "phase_breakdown"]
