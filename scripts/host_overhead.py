"""Where the host time of one triton call goes, on the GPU machine (8B preset, depth 7 unless told).

1. The whole ``frontier_generate`` call (CUDA events, GPU idle at each start: the latency a
   caller sees). ``--time-only`` stops here (``scripts/call_ab.sh`` alternates package copies on it).
2. Its parts, host microseconds: validation, the launch with its preparation (no sync), the
   shared packer (the sampling path's), the error-flag read; the launch's device time.
3. A cProfile of many calls (Python functions by own and cumulative time) and torch.profiler's
   CUDA API calls and kernels.

    python3 scripts/host_overhead.py [--preset eagle3-llama3.1-8b] [--depth 7] [--calls 200] [--time-only]
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

from frontier.api import validate_request
from frontier.bench import BenchCase, CallSetup, time_calls
from frontier.registry import get_backend
from frontier.tree import pack_tree

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.1-8b")
ap.add_argument("--depth", type=int, default=7)
ap.add_argument("--calls", type=int, default=200)
ap.add_argument("--time-only", action="store_true", help="only the whole call's time (for A/B runs)")
a = ap.parse_args()

dev = torch.device("cuda")
case = BenchCase(preset=a.preset, depth=a.depth)
s = CallSetup(case, device=dev, dtype=torch.bfloat16)


def call():
    return s.call("triton")


# (the call reads the error flag, a sync, so only the host-inclusive time is meaningful here)
print(f"{a.preset} depth {a.depth}: call {time_calls(call, reps=100):.3f} ms (median of 100, GPU idle at each start)")
if a.time_only:
    raise SystemExit

be = get_backend("triton")
d = be.drafter(s.cfg, torch.bfloat16, dev)
ids = s.ids[0, 1:]


def cpu_us(fn, n=50):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def launch():
    s.cache.truncate(s.c)
    d.alloc_outputs()
    d.run(s.weights, s.features[0], ids[s.c:], s.ids[0, -1:], s.cache, s.c, case.new_rows, "persistent")


s.cache.truncate(s.c)  # as before a call: the validation checks cache length + new rows == context
print("validate_request CPU us", cpu_us(lambda: validate_request(
    s.cfg, s.features, be, backend_name="triton", input_ids=s.ids, weights=s.weights, cache=s.cache,
    cache_max_length=None, sampling=False, padded=True, seed=0, options={"check_token_range": False}), 200))
print("alloc+run (Triton launch) CPU us, no sync", cpu_us(launch, 20))
par = d.out_par[0].clone()  # [T-1] (outputs are batched: [B, T-1])
print("pack_tree CPU us (the sampling path's packer)", cpu_us(lambda: pack_tree(par, sampling=False, padded=True,
                                                                                max_depth=a.depth + 1), 100))
print("check_error CPU us (sync incl.)", cpu_us(d.check_error, 100))
print("launch ms (device time)", time_calls(launch, reps=30, device_only=True))

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
