"""Batched triton drafter on the GPU: kernel time per batch size and tuning (CUDA events, median,
device work only; the same launch with its host preparation in brackets), tokens compared
across tunings, and an in-kernel per-phase breakdown.

    python3 scripts/batch_variants.py --preset eagle3-llama3.1-8b --depth 7 --batches 1,4,16,64 \
        --tunings base,bm128,bm128a8k,bm256a16k --breakdown 16
"""
import argparse
import json
import time

import torch

from frontier.backends.triton.launch import Drafter, Tuning
from frontier.bench import BatchCallSetup, BenchCase, copy_bandwidth, entry_name, floor_bytes, phase_totals, time_calls

TUNINGS = {
    "base": {},
    "nokey32": dict(lm_key32=False),
    "nokey32r16": dict(lm_key32=False, lm_stat_rows=16),
    "r64": dict(lm_stat_rows=64),
    "bm32": dict(bm_max=32),
    "bm128": dict(bm_max=128),
    "a8k": dict(acc_elems=8192),
    "bm128a8k": dict(bm_max=128, acc_elems=8192),
    "bm128a16k": dict(bm_max=128, acc_elems=16384),
    "bm256a16k": dict(bm_max=256, acc_elems=16384),
    "bm256a8k": dict(bm_max=256, acc_elems=8192),
    "s4": dict(num_stages=4),
    "bm256a16kw16": dict(bm_max=256, acc_elems=16384, num_warps=16),
    "bm256a32kw16": dict(bm_max=256, acc_elems=32768, num_warps=16),
    "bm256a16kna128": dict(bm_max=256, acc_elems=16384, BLOCK_NA=128),
    "bm256a16kna64": dict(bm_max=256, acc_elems=16384, BLOCK_NA=64),
    "na128": dict(BLOCK_NA=128),
    "wide8": dict(wide_num_warps=8, wide_acc_elems=16384),
    "wa16k": dict(wide_acc_elems=16384),
    "wa64k": dict(wide_acc_elems=65536),
    "narrow": dict(wide_bm=1024, bm_max=64),
    "ch4": dict(attn_chunks=4),
    "split_attn": dict(fused_attention=False),
    "nf128": dict(fused_block_n=128),
    "nf32": dict(fused_block_n=32),
    "na64": dict(BLOCK_NA=64),
    "ch16": dict(attn_chunks=16),
    "ch8na64": dict(attn_chunks=8, BLOCK_NA=64),
    "al16": dict(slab_align=16),
    "al8": dict(slab_align=8),
    "na32": dict(BLOCK_NA=32),
    "na16": dict(BLOCK_NA=16),
    "lm32k": dict(lm_stage_bytes=32768),
    "st16k": dict(stage_bytes=16384),
    "st64k": dict(stage_bytes=65536),
    "s2": dict(num_stages=2),
    "s4lm32k": dict(num_stages=4, lm_stage_bytes=32768),
    "novw": dict(vec_w=False),
    "novkv": dict(vec_kv=False),
    "novec": dict(vec_w=False, vec_kv=False),
    "padrows": dict(exact_rows=False),
    # wide builds, spelled out (the default is 8 warps / 40960 since the fifth session)
    "w8a32k": dict(wide_num_warps=8, wide_acc_elems=32768),
    "w8a64k": dict(wide_num_warps=8, wide_acc_elems=65536),
    "w16a32k": dict(wide_num_warps=16, wide_acc_elems=32768),
    "w16a64k": dict(wide_num_warps=16, wide_acc_elems=65536),
    "nograph": dict(persistent_graph=False),
    "sr64": dict(split_rows=64),
    "sr256": dict(split_rows=256),
    "wal32": dict(wide_slab_align=32),
    "noqh": dict(qkv_ahead=False),
    "lin2": dict(lin_stages=2),
    "lin4": dict(lin_stages=4),
    "gu4": dict(gu_stages=4),
    "lin4gu4": dict(lin_stages=4, gu_stages=4),
    "lin3gu4": dict(lin_stages=3, gu_stages=4),
    "gu3": dict(gu_stages=3),
    "gu5": dict(gu_stages=5),
    "lm5s32": dict(lm_stages=5, lm_stage_bytes=32768),
    "lm4s32": dict(lm_stages=4, lm_stage_bytes=32768),
    "gu5lm5s32": dict(gu_stages=5, lm_stages=5, lm_stage_bytes=32768),
    "bar1": dict(barrier=1),
    "bar2": dict(barrier=2),
    "bar0": dict(barrier=0),
    "nophase": dict(phase_kernels=False),
    "nogrid": dict(step_grids=False),
    "nopdl": dict(pdl=False),
    "pdl": dict(pdl=True),
    "pdlstart": dict(pdl=True, pdl_trigger="start"),
    "pdlend": dict(pdl=True, pdl_trigger="end"),
    "pdlse": dict(pdl=True, pdl_trigger="streams_end"),
    "pdlso": dict(pdl=True, pdl_trigger="small_only"),
    "nofold": dict(lin_fold=1),
    "fold2": dict(lin_fold=2),
    "fst3": dict(fold_stages=3),
    # two programs per SM (H100 / H200: 132 SMs), each with 4 warps and half the shared memory
    "w4": dict(num_warps=4),
    "g2w4": dict(grid=264, num_warps=4, smem_bytes=112640),
    "g2w4s16": dict(grid=264, num_warps=4, smem_bytes=112640, stage_bytes=16384, lm_stage_bytes=16384),
}


def tuning_of(name):
    """A named tuning, or one spelled inline as ``field=value+field=value`` (each value parsed
    as its field's type: ``Tuning.overrides``)."""
    if "=" not in name:
        return TUNINGS[name]
    return Tuning.overrides(name.split("+"))


def program_skew(schedule, start, arrive, leave):
    """Per phase (tree depths summed, context step apart) from every program's stamps (ns):
    the phase's time (last leave to last leave), each program's own work (its arrival minus its
    leaving the previous barrier: median and max over programs), how late the last arrival is
    after the median one, and how long the barrier takes to release (median leave minus last
    arrival); µs."""
    prev = start.unsqueeze(0)
    leave_prev = torch.cat([prev, leave[:-1]], 0).double()
    arrive, leave = arrive.double(), leave.double()
    work = (arrive - leave_prev) / 1e3
    rows = {}
    last_pid = {}
    for s, code in enumerate(schedule):
        key = entry_name(code)
        r = rows.setdefault(key, [0.0] * 6)
        r[0] += (leave[s].max() - leave_prev[s].max()).item() / 1e3
        r[1] += work[s].median().item()
        r[2] += work[s].max().item()
        r[3] += (arrive[s].max() - arrive[s].median()).item() / 1e3
        r[4] += (leave[s].median() - arrive[s].max()).item() / 1e3
        r[5] += (leave_prev[s].max() - leave_prev[s].min()).item() / 1e3
        last_pid.setdefault(key, []).append(int(arrive[s].argmax()))
    return rows, last_pid

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.1-8b")
ap.add_argument("--depth", type=int, default=7)
ap.add_argument("--batches", default="1,4,16,64")
ap.add_argument("--tunings", default="base", help="comma-separated TUNINGS names or inline field=value+field=value")
ap.add_argument("--breakdown", type=int, default=0, help="batch size to break down per phase (0: none)")
ap.add_argument("--stamps", type=int, default=0, help="batch size whose every program's barrier stamps to analyse")
ap.add_argument("--stamps-out", default=None, help="save the raw stamps here (torch.save)")
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--modes", default="persistent", help="launch modes to time, e.g. persistent,graph")
ap.add_argument("--step-breakdown", default="",
                help="batch sizes (comma-separated) whose graph-mode step kernels to time one by one (profiler, per "
                "phase); with PDL (Tuning.pdl, the default) a kernel's time includes its wait for the one before and "
                "the gaps come out negative: time tuning nopdl for per-phase costs")
ap.add_argument("--json", default=None)
ap.add_argument("--identity", action="store_true",
                help="also draft each sequence alone (same tuning) and count identical trees")
a = ap.parse_args()
dev = torch.device("cuda")
bw = copy_bandwidth(dev)
res = {}
for bsz in [int(x) for x in a.batches.split(",")]:
    case = BenchCase(preset=a.preset, depth=a.depth, batch=bsz)
    setup = BatchCallSetup(case, device=dev, dtype=torch.bfloat16)
    floor = 1e3 * floor_bytes(setup.cfg, setup.weights) / bw
    ref = None
    for name, mode in [(n, m) for n in a.tunings.split(",") for m in a.modes.split(",")]:
        tn = Tuning(**tuning_of(name))
        d = Drafter(setup.cfg, torch.bfloat16, dev, tn)

        seqs = setup.triton_seqs

        def go(timing=False):
            d.alloc_outputs(bsz)
            d.run_batch(setup.weights, seqs(), "persistent" if timing else mode, timing=timing)

        try:
            t0 = time.time()
            go()
            torch.cuda.synchronize()
            comp = time.time() - t0
            d.check_error()
            ms = time_calls(go, reps=a.reps, device_only=True)
            launch_ms = time_calls(go, reps=a.reps)
            toks = d.out_tok.cpu()
            same = "ref" if ref is None else ("same" if torch.equal(ref, toks) else "DIFF")
            if ref is None:
                ref = toks
            res[f"b{bsz} {name} {mode}"] = ms
            print(f"{a.preset} d{a.depth} batch {bsz:3d} {name:10s} {mode:10s}: {ms:7.3f} ms/call  {ms / bsz:7.3f} ms/seq  "
                  f"{100 * floor / ms:5.1f}% of floor {floor:.3f}  (launch with host work {launch_ms:.3f} ms; first call "
                  f"{comp:.1f}s, tokens {same})", flush=True)
            if a.identity and bsz > 1:
                btok, bpar = d.out_tok.clone(), d.out_par.clone()
                same_n = 0
                for b, sq in enumerate(seqs()):
                    d.alloc_outputs(1)
                    d.run_batch(setup.weights, [sq], "persistent")
                    same_n += int(torch.equal(d.out_tok[0], btok[b]) and torch.equal(d.out_par[0], bpar[b]))
                print(f"  batch {bsz} {name}: {same_n}/{bsz} sequences drafted identically alone (bf16)", flush=True)
            if str(bsz) in a.step_breakdown.split(",") and mode == "graph":
                from torch.profiler import ProfilerActivity, profile
                go()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        go()
                    torch.cuda.synchronize()
                ks = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and "drafter_kernel" in e.name),
                            key=lambda e: e.time_range.start)
                sched = d.schedule_list
                n = len(sched)
                runs = [[k.time_range.elapsed_us() for k in ks[r * n:(r + 1) * n]] for r in range(len(ks) // n)]
                gaps = [sum(b.time_range.start - a.time_range.end for a, b in zip(ks[r * n:(r + 1) * n - 1],
                                                                                    ks[r * n + 1:(r + 1) * n])) / 1e3
                        for r in range(len(ks) // n)]
                per = phase_totals(sched, runs)
                print(f"  step kernels batch {bsz} {name} ({len(ks)} kernels, {len(runs)} runs): kernels "
                      f"{sum(per.values()):.3f} ms + gaps {sorted(gaps)[len(gaps) // 2]:.3f} ms: " + ", ".join(
                          f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.01), flush=True)
            if a.breakdown == bsz and mode == "persistent":
                runs = []
                for _ in range(5):
                    go(timing=True)
                    torch.cuda.synchronize()
                    runs.append(d.step_times_us())
                per = phase_totals(d.schedule.tolist(), runs)
                tot = sum(per.values())
                print(f"  breakdown batch {bsz} {name}: total {tot:.3f} ms: " + ", ".join(
                    f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.01))
            if a.stamps == bsz:
                runs = []
                for _ in range(3):
                    go(timing=2)
                    torch.cuda.synchronize()
                    runs.append(d.program_stamps())
                sched = d.schedule.tolist()
                if a.stamps_out:
                    torch.save({"schedule": sched, "runs": runs}, f"{a.stamps_out}.{name}.b{bsz}.pt")
                res_rows = [program_skew(sched, *r) for r in runs]
                print(f"  per-program stamps, batch {bsz} {name} (us summed over entries; median of 3 runs):")
                print(f"    {'phase':12s} {'phase':>8s} {'work med':>8s} {'work max':>8s} {'late':>7s} {'release':>7s} "
                      f"{'start skew':>10s}  last arrivals (pid: count)")
                for key in res_rows[0][0]:
                    vals = [sorted(rr[0][key][j] for rr in res_rows)[1] for j in range(6)]
                    lp = {}
                    for rr in res_rows:
                        for q in rr[1][key]:
                            lp[q] = lp.get(q, 0) + 1
                    top = sorted(lp.items(), key=lambda kv: -kv[1])[:4]
                    print(f"    {key:12s} " + " ".join(f"{v:8.1f}" for v in vals[:3]) + " " +
                          " ".join(f"{v:7.1f}" for v in vals[3:5]) + f" {vals[5]:10.1f}  " +
                          ", ".join(f"{q}: {c}" for q, c in top), flush=True)
        except Exception as exc:  # report and go on with the next variant
            print(f"batch {bsz} {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        del d
    del setup
    torch.cuda.empty_cache()
if a.json:
    json.dump({"bandwidth": bw, "ms": res}, open(a.json, "w"), indent=1)
