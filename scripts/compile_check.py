"""Compile the drafter kernel for a GPU target on a machine without one, and print its registers,
spills and shared memory (catches compile errors and spills before any device time is spent).

    PYTHONPATH=. python3 scripts/compile_check.py --preset eagle3-llama3.1-8b --batch 1 [--tuning k=v ...]

The launch arguments come from the real launcher (``Drafter.run_batch`` on CPU tensors, with the
kernel launch intercepted); each tensor becomes a pointer of its dtype in the signature.
"""
import argparse
import inspect
import os

assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET"
import torch
import triton
from triton.backends.compiler import GPUTarget

from frontier.backends.triton import kernels as K_
from frontier.backends.triton import launch as L
from frontier.bench import BatchCallSetup, BenchCase

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="eagle3-llama3.1-8b")
ap.add_argument("--depth", type=int, default=7)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--arch", type=int, default=90)
ap.add_argument("--grid", type=int, default=132)
ap.add_argument("--tuning", nargs="*", default=[], help="Tuning field=value overrides")
ap.add_argument("--const", nargs="*", default=[], help="kernel constexpr=int overrides (e.g. TIMING=2)")
ap.add_argument("--ptx", default=None, help="also write the PTX here (e.g. to count vector loads)")
ap.add_argument("--cubin", default=None, help="also write the cubin here (cuobjdump -sass reads it)")
ap.add_argument("--ttgir", default=None, help="also write the TritonGPU IR here (layouts, conversions)")
a = ap.parse_args()

over = L.Tuning.overrides(a.tuning)
tn = L.Tuning(**{"grid": a.grid, **over})
setup = BatchCallSetup(BenchCase(preset=a.preset, depth=a.depth, batch=a.batch, context=64), device=torch.device("cpu"),
                       dtype=torch.bfloat16)
captured = {}


class _Capture:
    fn = K_.drafter_kernel.fn

    def __getitem__(self, grid):
        def launch(*args, **kw):
            captured["args"], captured["kw"] = args, kw
        return launch


real = K_.drafter_kernel
K_.drafter_kernel = _Capture()
try:
    d = L.Drafter(setup.cfg, torch.bfloat16, torch.device("cpu"), tn)
    d.alloc_outputs(a.batch)
    d.run_batch(setup.weights, setup.triton_seqs(), "persistent")
finally:
    K_.drafter_kernel = real

names = list(inspect.signature(real.fn).parameters)
kw = dict(captured["kw"])
kw.update({k: int(v) for k, v in (c.split("=") for c in a.const)})
opts = {k: kw.pop(k) for k in ("num_warps", "num_stages", "launch_cooperative_grid", "enable_fp_fusion") if k in kw}
short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64", torch.int32: "i32"}
# specialisation as Triton's launcher makes it on the GPU: 16-byte aligned pointers and integers
# divisible by 16 carry tt.divisibility=16, integers equal to 1 become constants (except the
# do_not_specialize ones)
nospec = {"B"}
sig, const, attrs = {}, {}, {}
div16 = [["tt.divisibility", 16]]
for idx, (name, val) in enumerate(zip(names, captured["args"])):
    if isinstance(val, torch.Tensor):
        sig[name] = "*" + short[val.dtype]
        attrs[(idx,)] = div16
    elif isinstance(val, float):
        sig[name] = "fp32"
    elif isinstance(val, int):
        if val == 1 and name not in nospec:
            sig[name] = "constexpr"
            const[(idx,)] = 1
            continue
        sig[name] = "i32" if abs(val) < 2**31 else "i64"
        if val % 16 == 0 and name not in nospec:
            attrs[(idx,)] = div16
    elif val is None:
        sig[name] = "*i32"
params = inspect.signature(real.fn).parameters
for name in names:
    if name in kw or (name not in sig and params[name].default is not inspect.Parameter.empty):
        sig[name] = "constexpr"  # given by the launcher, or left at the kernel's default
        const[(names.index(name),)] = kw.get(name, params[name].default)
src = triton.compiler.ASTSource(fn=real, signature=sig, constexprs=const, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", a.arch, 32),
                   options=dict(num_warps=opts.get("num_warps", 4), num_stages=opts.get("num_stages", 3),
                                **({"enable_fp_fusion": opts["enable_fp_fusion"]} if "enable_fp_fusion" in opts else {})))
import re
import subprocess
import tempfile

from triton.backends.nvidia.compiler import get_ptxas

arch = f"sm_{a.arch}a" if a.arch >= 90 else f"sm_{a.arch}"
with tempfile.TemporaryDirectory() as tmp:
    ptx = os.path.join(tmp, "k.ptx")
    open(ptx, "w").write(k.asm["ptx"])
    if a.ptx:
        open(a.ptx, "w").write(k.asm["ptx"])
    if a.cubin:
        open(a.cubin, "wb").write(k.asm["cubin"])
    if a.ttgir:
        open(a.ttgir, "w").write(k.asm["ttgir"])
    pt = get_ptxas(a.arch)
    exe = pt.path if hasattr(pt, "path") else pt[0]
    out = subprocess.run([exe, "-v", f"--gpu-name={arch}", ptx, "-o", os.path.join(tmp, "k.cubin")],
                         capture_output=True, text=True)
info = out.stderr
regs = re.findall(r"Used (\d+) registers", info)
spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
stack = re.findall(r"(\d+) bytes stack frame", info)
print(f"{a.preset} batch {a.batch} {over} {a.const}: cubin {len(k.asm['cubin'])} B, regs {regs} spill stores/loads {spill} stack {stack} "
      f"shared {k.metadata.shared} warps {opts.get('num_warps')} stages {opts.get('num_stages')}")
