"""Each weight stream of a batch-1 tree depth against the best a step launch of its bytes does:
the triton drafter's graph-mode share of that launch (``tools/gpu/phases.py``: a bench preset at
depth 7, median over the tree depths 1 to 5, which all stream the QKV hidden half) beside a
**chained read** of the same bytes - a Triton kernel that only loads them (one program per SM,
32 KB pipeline stages, 3 stages, summing the words it reads) launched back to back as CUDA-graph
nodes with programmatic dependent launch (each launch waits for the one before it, as the
drafter's launches do) over copies that do not fit in L2 - and the copy-bandwidth floor (bytes /
``frontier.bench.copy_bandwidth``, which counts bytes read and written, so a read can pass it).

A stream's share over its chained read is what the stream's own code costs beyond moving its
bytes in this launch form: its dot, the fp8 conversion, its epilogue and ranking. The chained
read over the floor is what a launch costs at all (its start, its first loads, its tail). The
QKV hidden half is MERGE's launch, which also merges the lm_head's partials and selects.

    python tools/gpu/stream_floor.py --json-out stream_floor.json     # needs a CUDA GPU

Cases: ``--preset`` (repeatable; default both bench presets) x ``--weights`` (plain, fp8).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[1]))
sys.path.insert(0, str(_HERE))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from frontier.backends.triton.kernels.barrier import HAS_GDC, _gdc_launch_dependents, _gdc_wait  # noqa: E402
from frontier.bench import PRESETS, copy_bandwidth  # noqa: E402
from phases import phase_shares  # noqa: E402

STAGE_WORDS = 8192  # 32 KB of int32 words per pipeline stage, the drafter's narrow fp8 stage size
STAGES = 3
CHAIN = 16  # launches per captured graph, at least (one per copy of the bytes)
L2_CLEAR = 150_000_000  # bytes of copies a launch's bytes rotate through (more than L2)


@triton.jit
def _read_kernel(src_ptr, out_ptr, n_words, per, WORDS: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    """Program p sums words [p * per, (p + 1) * per) of ``src`` (int32, n_words), WORDS at a time.
    ``per`` is a multiple of 16 (so the loads are 16-byte vectors)."""
    if PDL:
        _gdc_wait()
        _gdc_launch_dependents()
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * per
    rw = tl.arange(0, WORDS)
    acc = tl.zeros([WORDS], tl.int32)
    for off in tl.range(0, per, WORDS, num_stages=STAGES):
        idx = off + rw
        acc += tl.load(src_ptr + base + idx, mask=(idx < per) & (base + idx < n_words), other=0,
                       eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def chained_read_us(nbytes: int, device: torch.device) -> float:
    """Device microseconds per launch of ``_read_kernel`` over ``nbytes``: one launch per copy of
    the bytes (at least CHAIN) back to back in one CUDA graph (with PDL where the GPU and Triton
    have it), so that each launch's bytes were last read by a launch L2_CLEAR bytes earlier; the
    median of five timings of ten replays."""
    grid = torch.cuda.get_device_properties(device).multi_processor_count
    pdl = HAS_GDC and torch.cuda.get_device_capability(device) >= (9, 0)
    n_words = -(-nbytes // 64) * 16  # (a multiple of 16 words, so the masks keep the vectors whole)
    per = -(-n_words // (16 * grid)) * 16
    copies = [torch.zeros(n_words, dtype=torch.int32, device=device) for _ in range(max(2, -(-L2_CLEAR // nbytes)))]
    chain = max(CHAIN, len(copies))
    out = torch.empty(grid, dtype=torch.int32, device=device)

    def body():
        for i in range(chain):
            _read_kernel[(grid,)](copies[i % len(copies)], out, n_words, per, WORDS=STAGE_WORDS, STAGES=STAGES, PDL=pdl,
                                  num_warps=8, launch_pdl=pdl)

    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / (10 * chain))
    return statistics.median(times)


def stream_bytes(preset: str, weights: str) -> dict[str, tuple[str, int]]:
    """Stream -> (its schedule phase, bytes it reads at one tree depth: weights, plus one fp32 scale
    per row in fp8) of an EAGLE-3 preset's head in bf16 (plain) or e4m3 (fp8)."""
    p = PRESETS[preset]
    h, i, v = p["hidden_size"], p["intermediate_size"], p["vocab_size"]
    hd = h // p["num_attention_heads"]
    nq, nkv = h, p["num_key_value_heads"] * hd
    el, sc = (1, 4) if weights == "fp8" else (2, 0)
    mats = {  # name -> (phase, rows, columns)
        "o_proj": ("OPROJ", h, nq),
        "gate/up": ("GATEUP", 2 * i, h),
        "down": ("DOWN", h, i),
        "lm_head": ("LMHEAD", v, h),
        "QKV hidden half": ("MERGE", nq + 2 * nkv, h),
    }
    return {name: (ph, rows * cols * el + rows * sc) for name, (ph, rows, cols) in mats.items()}


def run(presets: list[str], weights: list[str], reps: int) -> dict:
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name(dev)}: copy bandwidth {bw / 1e12:.2f} TB/s")
    cases = []
    for preset in presets:
        for w in weights:
            shares = phase_shares(preset, w, reps)
            rows = []
            for name, (ph, nbytes) in stream_bytes(preset, w).items():
                share = statistics.median(s["share_us"] for s in shares["steps"]
                                          if s["phase"] == ph and s["depth"] != "context" and 1 <= s["depth"] <= 5)
                read = chained_read_us(nbytes, dev)
                floor = nbytes / bw * 1e6
                rows.append(dict(stream=name, phase=ph, mb=round(nbytes / 1e6, 1), floor_us=round(floor, 2),
                                 read_us=round(read, 2), share_us=round(share, 2),
                                 share_over_read=round(share / read, 2), read_pct_floor=round(100 * floor / read, 1)))
                print(f"{preset} {w:5s} {name:16s} {nbytes / 1e6:7.1f} MB  floor {floor:6.2f} us  chained read "
                      f"{read:6.2f} us  drafter {share:6.2f} us  ({share / read:.2f}x the read)", flush=True)
            cases.append(dict(preset=preset, weights=w, total_us=shares["total_us"], streams=rows))
    return dict(device=torch.cuda.get_device_name(dev), copy_bandwidth_Bps=bw, stage_bytes=4 * STAGE_WORDS,
                stages=STAGES, cases=cases)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="bench preset (repeatable)")
    ap.add_argument("--weights", default="plain,fp8", help="comma-separated: plain, fp8")
    ap.add_argument("--reps", type=int, default=20, help="drafter calls recorded per case")
    ap.add_argument("--json-out", help="write the table here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tools/gpu/stream_floor.py needs a CUDA GPU", file=sys.stderr)
        return 2
    presets = a.preset or ["eagle3-llama3.1-8b", "eagle3-llama3.2-1b"]
    bad = [p for p in presets if p not in PRESETS]
    if bad:
        ap.error(f"--preset: unknown {bad}; choose from {sorted(PRESETS)}")
    weights = [w for w in a.weights.split(",") if w]
    if not weights or set(weights) - {"plain", "fp8"}:
        ap.error(f"--weights: expected a comma-separated list of plain and fp8, got {a.weights!r}")
    res = run(presets, weights, a.reps)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
