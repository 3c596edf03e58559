"""Where a graph-mode draft call goes, phase by phase: the triton drafter's step launches of one
batch-1 call (a bench preset at depth 7, context 512, 4 new rows, bf16 activations), replayed as
its CUDA graph, recorded by torch.profiler; each launch's share is the time from the previous
launch's end to its own end (with programmatic dependent launch the next launch starts early and
waits, so its own duration would count that wait). Prints, per case, the call's total and the
shares summed by phase; ``--json-out`` also keeps every schedule entry's median share.

    python tools/gpu/phases.py --json-out phases.json     # needs a CUDA GPU

Cases: ``--preset`` (repeatable; default both bench presets) x ``--weights`` (plain, fp8).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from frontier.backends.triton.fp8 import stream_formats  # noqa: E402
from frontier.backends.triton.kernels.layout import CONTEXT_STEP, Phase  # noqa: E402
from frontier.bench import BenchCase, CallSetup  # noqa: E402
from frontier.registry import get_backend  # noqa: E402


def phase_shares(preset: str, weights: str, reps: int) -> dict:
    """One case: the median call's total (us) and each schedule entry's median share (us)."""
    case = BenchCase(preset=preset, depth=7, weights=weights, batch=1, context=512)
    setup = CallSetup(case, device="cuda", dtype=torch.bfloat16)
    d = get_backend("triton").drafter(setup.cfg, torch.bfloat16, torch.device("cuda"),
                                      formats=stream_formats(setup.weights, torch.bfloat16))
    ids = setup.ids[0, 1:]

    def call():
        d.alloc_outputs()
        d.run(setup.weights, setup.features[0], ids[setup.c:], setup.ids[0, -1:], setup.cache, setup.c,
              case.new_rows, "graph")

    for _ in range(5):  # compile, capture, replay
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA and "drafter_kernel" in e.name),
                     key=lambda e: e.time_range.start)
    n = len(d.schedule_list)
    if len(kernels) != reps * n:
        raise RuntimeError(f"{len(kernels)} drafter launches recorded, expected {reps} x {n}")
    calls = [kernels[i * n:(i + 1) * n] for i in range(reps)]
    shares = [[c[0].time_range.end - c[0].time_range.start if j == 0 else c[j].time_range.end - c[j - 1].time_range.end
               for c in calls] for j in range(n)]
    steps = []
    for j, code in enumerate(d.schedule_list):
        ph, depth = divmod(code, 256)
        steps.append(dict(phase=Phase(ph).name, depth="context" if depth == CONTEXT_STEP else depth,
                          share_us=round(statistics.median(shares[j]), 2)))
    by_phase: dict[str, float] = {}
    for s in steps:
        by_phase[s["phase"]] = round(by_phase.get(s["phase"], 0.0) + s["share_us"], 2)
    total = statistics.median(c[-1].time_range.end - c[0].time_range.start for c in calls)
    return dict(preset=preset, weights=weights, total_us=round(total, 1),
                by_phase_us=dict(sorted(by_phase.items(), key=lambda kv: -kv[1])), steps=steps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="bench preset (repeatable)")
    ap.add_argument("--weights", default="plain,fp8", help="comma-separated: plain, fp8")
    ap.add_argument("--reps", type=int, default=20, help="calls recorded per case")
    ap.add_argument("--json-out", help="write every case's shares here")
    args = ap.parse_args(argv)
    presets = args.preset or ["eagle3-llama3.1-8b", "eagle3-llama3.2-1b"]
    out = dict(device=torch.cuda.get_device_name(), cases=[])
    for preset in presets:
        for weights in args.weights.split(","):
            r = phase_shares(preset, weights, args.reps)
            out["cases"].append(r)
            print(f"{preset} {weights}: {r['total_us']} us per call;",
                  ", ".join(f"{k} {v:.1f}" for k, v in r["by_phase_us"].items()), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
