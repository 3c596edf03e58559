"""The attention phases alone, outside the persistent kernel (GPU machine).

Runs one real call (so the caches, the tree K/V scratch, the ancestor table and the metadata hold
a real depth's data), then launches small kernels that call only the attention phase functions of
``kernels.py`` (the same device code) with the same arguments, timed as CUDA graphs of many
launches; and prints the persistent kernel's in-kernel times of the same phases beside them. So
the phase's own cost is told apart from what running inside the big kernel adds (one register
allocation for every phase, instruction fetch). Source variants (``--variants``) are textual
edits of ``kernels.py`` for measurement only (some are not exact).

    python3 scripts/attn_probe.py --batch 16 --variants base,w4,s2,n32,n128
"""
import argparse
import importlib.util
import inspect
import os
import statistics
import sys
import tempfile

import torch

from frontier.backends.triton import kernels as K_
from frontier.backends.triton.launch import Drafter, Tuning
from frontier.bench import BatchCallSetup, BenchCase

PROBES = '''

@triton.jit
def probe_fused(B, R, meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr, t_head_stride, anc_ptr, anc_stride, n_anc,
                NH, NKV, HD, sqrt_d, ao_ptr, SK, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr):
    _ph_attn_fused(tl.program_id(0), tl.num_programs(0), B, R, meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr,
                   t_head_stride, anc_ptr, anc_stride, SK, n_anc, NH, NKV, HD, sqrt_d, ao_ptr, BLOCK_Q, BLOCK_N,
                   BLOCK_D, IEEE, VEC)


@triton.jit
def probe_part(B, R, meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr, t_head_stride, anc_ptr, anc_stride, n_anc,
               NH, NKV, HD, sqrt_d, pm_ptr, pl_ptr, pacc_ptr, NCH, PASS: tl.constexpr, BLOCK_Q: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_CH: tl.constexpr, IEEE: tl.constexpr,
               VEC: tl.constexpr):
    _ph_attn_part(tl.program_id(0), tl.num_programs(0), B, R, meta_ptr, qr_ptr, kv_ptr, tk_ptr, tv_ptr,
                  t_head_stride, anc_ptr, anc_stride, n_anc, NH, NKV, HD, sqrt_d, pm_ptr, pl_ptr, pacc_ptr, NCH,
                  PASS, BLOCK_Q, BLOCK_N, BLOCK_D, BLOCK_CH, IEEE, VEC)


@triton.jit
def probe_sum(B, R, ao_ptr, pacc_ptr, NH, NKV, HD, NCH, n_anc, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    _ph_attn_sum(tl.program_id(0), tl.num_programs(0), B, R, ao_ptr, pacc_ptr, NH, NKV, HD, NCH, n_anc, BLOCK_Q,
                 BLOCK_D, 16)


@triton.jit
def probe_empty(x_ptr):
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0)
'''

# textual edits of kernels.py (measurement only)
EDITS = {
    # the attention's divisions back on div.rn.f32 (before _div_rn_by)
    "divrn": [("    q = x * r\n    return tl.fma(tl.fma(-q, d, x), r, q)", "    return tl.math.div_rn(x, d)")],
    # a plain multiply by the reciprocal, no correction (not exact)
    "mul": [("    q = x * r\n    return tl.fma(tl.fma(-q, d, x), r, q)", "    return x * r")],
}
LAUNCH = {"w4": dict(num_warps=4), "w8": dict(num_warps=8), "s2": dict(num_stages=2), "s3": dict(num_stages=3),
          "s4": dict(num_stages=4), "n32": dict(BLOCK_N=32), "n64": dict(BLOCK_N=64), "n128": dict(BLOCK_N=128)}


def variant_module(name: str):
    src = open(K_.__file__).read()
    for part in name.split("+"):
        for old, new in EDITS.get(part, []):
            assert old in src, (part, old)
            src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), f"probe_{name.replace('+', '_')}.py")
    open(path, "w").write(src + PROBES)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def graph_time_us(launch, n: int = 20, reps: int = 30) -> float:
    """Median µs per launch of ``launch`` replayed as a CUDA graph of n launches."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            launch()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            launch()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / n)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="eagle3-llama3.1-8b")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--depth", type=int, default=7)
    ap.add_argument("--level", type=int, default=3, help="tree depth i whose attention is probed (i + 1 ancestors)")
    ap.add_argument("--variants", default="base")
    a = ap.parse_args()
    dev = torch.device("cuda")
    setup = BatchCallSetup(BenchCase(preset=a.preset, depth=a.depth, batch=a.batch), device=dev, dtype=torch.bfloat16)
    d = Drafter(setup.cfg, torch.bfloat16, dev, Tuning())
    d.alloc_outputs(a.batch)
    d.run_batch(setup.weights, setup.triton_seqs(), "persistent", timing=True)
    torch.cuda.synchronize()
    names = {v: k[3:].lower() for k, v in vars(K_).items() if k.startswith("PH_") and isinstance(v, int)}
    times = d.step_times_us()
    sched = d.schedule.tolist()
    rows = [(names.get(c // 256, c // 256), c % 256, t) for c, t in zip(sched, times)]
    print("in-kernel (persistent, barrier included), µs:")
    for ph in ("attn", "attn2", "attn3", "attn_f", "rope", "oproj"):
        per = [f"{t:.1f}" for n, i, t in rows if n == ph and i != 255]
        if per:
            print(f"  {ph:7s} depths 0..: {' '.join(per)}")

    captured = {}
    real = K_.drafter_kernel

    class _Capture:  # records the first launch's arguments instead of launching
        def __getitem__(self, grid):
            def launch(*args, **kw):
                captured.setdefault("args", args)
                captured.setdefault("kw", kw)
            return launch

        def warmup(self, *args, **kw):  # step launches with PDL compile each build first (co-residency)
            return real.warmup(*args, **kw)

    K_.drafter_kernel = _Capture()
    try:
        d.run_batch(setup.weights, setup.triton_seqs(), "steps")
    finally:
        K_.drafter_kernel = real
    v = dict(zip(inspect.signature(real.fn).parameters, captured["args"]))
    v.update(captured["kw"])
    B, R, i = v["B"], v["K"], a.level
    fused = "attn_f" in {n for n, _, _ in rows}
    common = (B, R, v["meta_ptr"], v["qr_ptr"], v["kv_ptr"], v["tk_ptr"], v["tv_ptr"], B * v["SK"] * v["HD"],
              v["anc_ptr"], v["BLOCK_A"], i + 1, v["NH"], v["NKV"], v["HD"], v["sqrt_d"])
    print(f"batch {B}, rows/seq {R}, level {i}, fused {fused}, warps {v['num_warps']}, stages {v['num_stages']}, "
          f"BLOCK_Q {v['BLOCK_Q']} NF {v['BLOCK_NF']} NA {v['BLOCK_NA']} NCH {v['NCH']}", flush=True)
    grid = (d.grid,)
    for name in a.variants.split(","):
        parts = name.split("+")
        mod = variant_module("+".join(p for p in parts if p in EDITS) or "base")
        opt = dict(num_warps=v["num_warps"], num_stages=v["num_stages"], enable_fp_fusion=v.get("enable_fp_fusion", True))
        bn = None
        for p in parts:
            for k, val in LAUNCH.get(p, {}).items():
                if k == "BLOCK_N":
                    bn = val
                else:
                    opt[k] = val
        empty = graph_time_us(lambda: mod.probe_empty[grid](v["sync_ptr"]))
        out = [f"{name:16s} empty {empty:5.1f}"]
        if fused:
            f = lambda: mod.probe_fused[grid](*common, v["ao_ptr"], v["SK"], v["BLOCK_Q"], bn or v["BLOCK_NF"], v["BLOCK_D"],
                                              v["IEEE"], v["VEC_KV"], **opt)
            out.append(f"fused {graph_time_us(f):6.1f}")
        else:
            for ps in (1, 2):
                f = lambda: mod.probe_part[grid](*common, v["apm_ptr"], v["apl_ptr"], v["aacc_ptr"], v["NCH"], ps,
                                                 v["BLOCK_Q"], bn or v["BLOCK_NA"], v["BLOCK_D"], v["BLOCK_CH"],
                                                 v["IEEE"], v["VEC_KV"], **opt)
                out.append(f"pass{ps} {graph_time_us(f):6.1f}")
            f = lambda: mod.probe_sum[grid](B, R, v["ao_ptr"], v["aacc_ptr"], v["NH"], v["NKV"], v["HD"], v["NCH"],
                                            i + 1, v["BLOCK_Q"], v["BLOCK_D"], **opt)
            out.append(f"sum {graph_time_us(f):6.1f}")
        k = (mod.probe_fused if fused else mod.probe_part).device_caches
        regs = [(kern.n_regs, kern.n_spills) for c in k.values() for kern in c[0].values()]
        print("  ".join(out), "µs/launch; regs/spills", regs[-1:], flush=True)


if __name__ == "__main__":
    main()
