"""What each small phase costs the persistent drafter (or, ``--mode graph``, the CUDA graph of
phase kernels): the same launch with phases removed from (or no-op entries added to) its
schedule, timed alternately with the real schedule.

A schedule without a phase computes garbage (its consumers read stale buffers), so only the
times mean anything: the difference to the real schedule bounds what fusing that phase into a
neighbour could save (its work, its barrier and its cold start). ``+noopN`` adds N entries per
tree depth that match no phase: a program's cost of one barrier with nothing to do. ``*name``
runs a tree depth's (idempotent) phase twice in a row: the second run finds its code in the
instruction caches (a weight stream also part of its weights still in L2), so first minus
second bounds what a cold start costs. SELECT and FINAL cannot be dropped (FINAL would index with
row-parent entries that SELECT never wrote) and SELECT is not idempotent; at batch 1 (eagle3)
MERGE runs SELECT (``Tuning.select_in_merge``), so the same holds for MERGE there.

    python3 scripts/phase_drop.py --variants base,-norm_post+norm_f,-prep3,+noop5,*rope --rounds 4
"""
import argparse

import torch

from frontier.backends.triton import kernels as K_
from frontier.backends.triton.launch import Drafter, Tuning
from frontier.bench import BatchCallSetup, BenchCase, entry_name, phase_totals, time_calls

NOOP = 30  # a phase code no branch of the kernel takes

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.1-8b")
ap.add_argument("--depth", type=int, default=7)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--variants", default="base,-norm_post+norm_f,-prep3,-rope,+noop5")
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--reps", type=int, default=30)
ap.add_argument("--ctx", action="store_true", help="drop the phases in the context step too")
ap.add_argument("--mode", default="persistent", choices=["persistent", "graph"],
                help="graph: the CUDA graph of phase kernels (each entry its own launch, so a doubled "
                     "entry's second launch finds the first one's code in the instruction caches)")
a = ap.parse_args()


def variant_schedule(sched: list[int], spec: str) -> list[int]:
    if spec == "base":
        return sched
    # the entry that ends a tree depth: SELECT, or MERGE where it runs SELECT (Tuning.select_in_merge)
    last = K_.PH_SELECT if any(c // 256 == K_.PH_SELECT for c in sched) else K_.PH_MERGE
    if spec.startswith("+noop"):
        n = int(spec[5:])
        out = []
        for code in sched:
            out.append(code)
            ph, i = divmod(code, 256)
            if i != K_.CTX_DEPTH and ph == last:
                out += [NOOP * 256 + i] * n
        return out
    if spec.startswith("*"):
        dup = {getattr(K_, "PH_" + name.upper()) for name in spec[1:].split("+")}
        out = []
        for code in sched:
            out += [code, code] if code // 256 in dup and code % 256 != K_.CTX_DEPTH else [code]
        return out
    drop = {getattr(K_, "PH_" + name.upper()) for name in spec.lstrip("-").split("+")}
    # without SELECT the row-parent entries stay unwritten and FINAL would index with garbage
    assert not drop & {K_.PH_SELECT, K_.PH_FINAL, last}, "SELECT / FINAL (and a MERGE that runs SELECT) cannot be dropped"
    return [c for c in sched if not (c // 256 in drop and (a.ctx or c % 256 != K_.CTX_DEPTH))]


dev = torch.device("cuda")
case = BenchCase(preset=a.preset, depth=a.depth, batch=a.batch)
setup = BatchCallSetup(case, device=dev, dtype=torch.bfloat16)
specs = a.variants.split(",")
drafters = {}
for spec in specs:
    d = Drafter(setup.cfg, torch.bfloat16, dev, Tuning())
    for key, s in d.schedules.items():
        codes = variant_schedule(s.tolist(), spec)
        d.schedules[key] = torch.tensor(codes, dtype=torch.int32, device=dev)
        d.schedule_codes[key] = codes  # the host copy that step launches (graph mode) walk
    drafters[spec] = d


def go(d, timing=0):
    d.alloc_outputs(a.batch)
    d.run_batch(setup.weights, setup.triton_seqs(), "persistent" if timing else a.mode, timing=timing)


for spec, d in drafters.items():
    go(d)
    torch.cuda.synchronize()
    d.check_error()
times = {s: [] for s in specs}
for r in range(a.rounds):
    for spec in specs:
        times[spec].append(time_calls(lambda: go(drafters[spec]), reps=a.reps, device_only=True))
base = sorted(times[specs[0]])[a.rounds // 2]
print(f"{a.preset} depth {a.depth} batch {a.batch}, {a.mode}: device ms per call, {a.rounds} alternated rounds "
      f"(median of {a.reps} each); difference to {specs[0]} per call and per tree depth")
for spec in specs:
    t = sorted(times[spec])
    med = t[a.rounds // 2]
    n = len(drafters[spec].schedule_list)
    print(f"  {spec:28s} {med:7.3f} ms  (rounds {' '.join(f'{x:.3f}' for x in times[spec])})  "
          f"{1e3 * (med - base):+7.1f} us/call {1e3 * (med - base) / a.depth:+6.1f} us/depth  entries {n}")
for spec in specs if a.mode == "persistent" else []:  # (the in-kernel timer is the persistent launch's)
    runs = []
    d = drafters[spec]
    for _ in range(5):
        go(d, timing=True)
        torch.cuda.synchronize()
        runs.append(d.step_times_us())
    per = phase_totals(d.schedule.tolist(), runs)
    print(f"  breakdown {spec}: total {sum(per.values()):.3f} ms: " + ", ".join(
        f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.01))
    if spec.startswith("*"):  # each doubled phase: its first (cold) and second (warm) run, us per tree depth
        sched = d.schedule.tolist()
        med = [sorted(r[s] for r in runs)[len(runs) // 2] for s in range(len(sched))]
        acc = {}
        for s in range(1, len(sched)):
            if sched[s] == sched[s - 1] and sched[s] % 256 != K_.CTX_DEPTH:
                a_ = acc.setdefault(entry_name(sched[s]), [0.0, 0.0])
                a_[0] += med[s - 1] / a.depth
                a_[1] += med[s] / a.depth
        print("    cold / warm run, us per tree depth (barrier included): " + ", ".join(
            f"{k} {v[0]:.1f} / {v[1]:.1f}" for k, v in acc.items()))
