"""Time launch variants of the triton drafter on one bench case (kernel only, CUDA events, median):
persistent with several tunings, step-by-step launches, and the steps captured in a CUDA graph."""
import argparse, json, time, traceback
import torch
from frontier.bench import BenchCase, CallSetup, copy_bandwidth, floor_bytes, phase_totals, time_calls
from frontier.backends.triton.launch import Drafter, Tuning

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.1-8b")
ap.add_argument("--depth", type=int, default=7)
ap.add_argument("--variants", default="base")
ap.add_argument("--json", default=None)
ap.add_argument("--timing", action="store_true")
a = ap.parse_args()
dev = torch.device("cuda")
bw = copy_bandwidth(dev)
case = BenchCase(preset=a.preset, depth=a.depth)
setup = CallSetup(case, device=dev, dtype=torch.bfloat16)
floor = 1e3 * floor_bytes(setup.cfg, setup.weights) / bw
print(f"{a.preset} depth {a.depth}: bandwidth {bw/1e12:.2f} TB/s floor {floor:.3f} ms", flush=True)
ids = setup.ids[0, 1:]
VARIANTS = {
    "base": dict(),
    "w8": dict(num_warps=8),
    "sb64s3": dict(stage_bytes=65536, num_stages=3),
    "sb16s6": dict(stage_bytes=16384, num_stages=6),
    "sb32s5": dict(stage_bytes=32768, num_stages=5),
    "w8sb64s3": dict(num_warps=8, stage_bytes=65536, num_stages=3),
    "w8lm64s3": dict(num_warps=8, lm_stage_bytes=65536, num_stages=3),
    "w8s3": dict(num_warps=8, num_stages=3),
    "w8s5": dict(num_warps=8, num_stages=5),
    "lmhalves": dict(lm_halves=2),
}
res = {}
ref_tokens = None
for name in a.variants.split(","):
    for mode in (["persistent"] if name != "steps" and name != "graph" else ["steps"]):
        try:
            tn = Tuning(**VARIANTS.get(name, {}))
            d = Drafter(setup.cfg, torch.bfloat16, dev, tn)
            d.alloc_outputs()
            def go():
                setup.cache.truncate(setup.c)
                d.run(setup.weights, setup.features[0], ids[setup.c:], setup.ids[0, -1:], setup.cache, setup.c,
                      case.new_rows, mode)
            t0 = time.time(); go(); torch.cuda.synchronize(); comp = time.time() - t0
            if name == "graph":
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    go()
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(g):
                    d.run(setup.weights, setup.features[0], ids[setup.c:], setup.ids[0, -1:], setup.cache, setup.c,
                          case.new_rows, mode)
                ms = time_calls(lambda: (setup.cache.truncate(setup.c), g.replay()), reps=50)
            else:
                ms = time_calls(go, reps=50)
            if mode == "persistent":
                d.check_error()
            toks = d.out_tok.tolist()
            if ref_tokens is None:
                ref_tokens = toks
            res[name] = ms
            if mode == "persistent" and a.timing:
                runs = []
                for _ in range(7):
                    setup.cache.truncate(setup.c)
                    d.run(setup.weights, setup.features[0], ids[setup.c:], setup.ids[0, -1:], setup.cache, setup.c,
                          case.new_rows, mode, timing=True)
                    torch.cuda.synchronize()
                    runs.append(d.step_times_us())
                per = {k: 1e3 * ms for k, ms in phase_totals(d.schedule.tolist(), runs).items()}  # us
                tot = sum(per.values())
                print(f"    in-kernel breakdown (us, summed over depths; barrier included), total {tot:.0f} us:")
                for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
                    print(f"      {k:14s} {v:8.1f}  {100*v/tot:5.1f}%")
            print(f"  {name:12s} {mode:10s} {ms:7.3f} ms  {100*floor/ms:5.1f}% floor  (first call {comp:.1f}s) same-tokens={toks == ref_tokens}", flush=True)
        except Exception:
            traceback.print_exc()
            print(f"  {name} FAILED", flush=True)
if a.json:
    json.dump({"floor_ms": floor, "bw": bw, "res": res}, open(a.json, "w"), indent=1)
