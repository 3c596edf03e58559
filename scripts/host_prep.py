"""Host time of the triton backend's per-call work, without a GPU: the kernel launch is
intercepted (as in scripts/compile_check.py) and the rest runs on CPU tensors of a preset's
shapes. CPU-side tensor copies (staging, the token-range check) are real work here but async
launches on a GPU, so read the numbers as this machine's Python cost, not a GPU host's.

    PYTHONPATH=. python3 scripts/host_prep.py --preset eagle3-llama3.2-1b --batches 1,16,64 [--call]

Default: ``Drafter.run_batch`` (staging, metadata, launch arguments). ``--call``: the whole
``frontier_generate_batch`` call on the persistent path (validation, packing, Frontier assembly).
"""
import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # lets the backend accept CPU tensors; nothing is interpreted
import torch  # noqa: E402

from frontier.backends.triton import backend as TB  # noqa: E402
from frontier.backends.triton import kernels as K_  # noqa: E402
from frontier.backends.triton import launch as L  # noqa: E402
from frontier.bench import BatchCallSetup, BenchCase  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.2-1b")
ap.add_argument("--batches", default="1,16,64")
ap.add_argument("--call", action="store_true")
ap.add_argument("--reps", type=int, default=40)
a = ap.parse_args()


class _NoLaunch:
    fn = K_.drafter_kernel.fn

    def __getitem__(self, grid):
        return lambda *args, **kw: None


K_.drafter_kernel = _NoLaunch()
TB.TritonBackend._check = lambda self, request: "persistent"  # the persistent path's host work
for b in map(int, a.batches.split(",")):
    setup = BatchCallSetup(BenchCase(preset=a.preset, depth=7, batch=b, context=64), device=torch.device("cpu"),
                           dtype=torch.float16)
    if a.call:
        def one():
            setup.call("triton")
    else:
        d = L.Drafter(setup.cfg, torch.float16, torch.device("cpu"), L.Tuning(grid=132))
        seqs = setup.triton_seqs()

        def one():
            d.alloc_outputs(len(seqs))
            d.run_batch(setup.weights, seqs, "persistent")
    for _ in range(3):
        one()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(a.reps):
            one()
        runs.append(1e3 * (time.perf_counter() - t) / a.reps)
    what = "frontier_generate_batch" if a.call else "Drafter.run_batch"
    print(f"{a.preset} batch {b}: {what} host {min(runs):.3f} ms (min of 5 x {a.reps}; median {sorted(runs)[2]:.3f})")
