"""Per-phase hardware counters of the triton drafter (run under ncu on the GPU machine).

Runs one warm call in ``mode="steps"`` (one launch per schedule entry: the same phase code as the
persistent kernel) and brackets the launches of one depth with cudaProfilerStart/Stop, so
``ncu --profile-from-start off`` profiles only those. Also prints the compiled kernels' register
and spill counts (persistent and steps builds) and writes the profiled entries' phase names.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python3 scripts/ncu_phases.py --batch 1 --depth-index 3
"""
import argparse
import json

import torch

from frontier.backends.triton import kernels as K_
from frontier.backends.triton.launch import Drafter, Tuning
from frontier.bench import BatchCallSetup, BenchCase

NAMES = {v: k[3:].lower() for k, v in vars(K_).items() if k.startswith("PH_") and isinstance(v, int)}

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.1-8b")
ap.add_argument("--depth", type=int, default=7)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--depth-index", type=int, default=3, help="tree depth whose launches are profiled (255: context)")
ap.add_argument("--out", default=None, help="JSON of the profiled entries' phase names")
ap.add_argument("--regs", action="store_true", help="print register / spill counts of the compiled kernels")
a = ap.parse_args()

dev = torch.device("cuda")
setup = BatchCallSetup(BenchCase(preset=a.preset, depth=a.depth, batch=a.batch), device=dev, dtype=torch.bfloat16)
d = Drafter(setup.cfg, torch.bfloat16, dev, Tuning())


def call(mode, hook=None):
    d.alloc_outputs(a.batch)
    d.run_batch(setup.weights, setup.triton_seqs(), mode, step_hook=hook)


call("persistent")
call("steps")
torch.cuda.synchronize()
if a.regs:
    for cache in K_.drafter_kernel.device_caches.values():
        for key, kern in cache[0].items():
            md = kern.metadata
            print(f"compiled drafter_kernel: regs {kern.n_regs} spills {kern.n_spills} shared {md.shared} "
                  f"warps {md.num_warps} stages {md.num_stages}", flush=True)
sched = d.schedule.tolist()
wanted = [st for st, code in enumerate(sched) if code % 256 == a.depth_index]
cudart = torch.cuda.cudart()


def hook(st):
    torch.cuda.synchronize()
    if st in wanted:
        cudart.cudaProfilerStart()
    else:
        cudart.cudaProfilerStop()


call("steps", hook)
torch.cuda.synchronize()
cudart.cudaProfilerStop()
names = [f"{NAMES.get(sched[st] // 256, sched[st] // 256)}" for st in wanted]
print("profiled entries:", " ".join(names), flush=True)
if a.out:
    json.dump(names, open(a.out, "w"))
