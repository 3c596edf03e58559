"""Where the host time of one triton call goes, on the GPU machine: the whole
``frontier_generate`` call (CUDA events, GPU idle at the start), then a cProfile of many calls
(Python functions by own time) and torch.profiler's CUDA API calls and kernels.

    python3 scripts/call_profile.py [--preset eagle3-llama3.1-8b] [--depth 7] [--calls 200] [--time-only]
"""
import argparse
import cProfile
import io
import pstats

import torch

from frontier.bench import BenchCase, CallSetup, time_calls

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.1-8b")
ap.add_argument("--depth", type=int, default=7)
ap.add_argument("--calls", type=int, default=200)
ap.add_argument("--time-only", action="store_true", help="only the first line (for A/B runs)")
a = ap.parse_args()

s = CallSetup(BenchCase(preset=a.preset, depth=a.depth), device=torch.device("cuda"), dtype=torch.bfloat16)


def call():
    return s.call("triton")


# (the call reads the error flag, a sync, so only the host-inclusive time is meaningful here)
print(f"{a.preset} depth {a.depth}: call {time_calls(call, reps=100):.3f} ms (median of 100, GPU idle at each start)")
if a.time_only:
    raise SystemExit
for _ in range(10):
    call()
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(a.calls):
    call()
torch.cuda.synchronize()
pr.disable()
buf = io.StringIO()
st = pstats.Stats(pr, stream=buf)
st.sort_stats("tottime").print_stats(28)
st.sort_stats("cumtime").print_stats(40)
print(buf.getvalue())

from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
