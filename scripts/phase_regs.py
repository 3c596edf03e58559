"""Registers, spills and code size per phase, without a GPU: compiles copies of the drafter kernel
that keep one phase branch each (the other branches of ``drafter_kernel``'s dispatch become
``False``), through ``scripts/compile_check.py``. Run from the repository root:

    python3 scripts/phase_regs.py none,lmhead,attn,rope [--batch 16]
"""
import os
import re
import subprocess
import sys

KEEP = {"fc": ["0"], "prep": ["1"], "qkv": ["4"], "rope": ["5"], "attn": ["6) | (ph == 16"], "attnf": ["21"],
        "attn3": ["17"], "oproj": ["7"], "norm": ["8"], "gateup": ["9"], "down": ["10"], "red": ["18", "19", "20"],
        "lmhead": ["12"], "merge": ["13"], "select": ["14"], "final": ["15"], "none": []}
BRANCH = re.compile(r"(        (?:if|elif) \(?)ph == ([0-9]+\) \| \(ph == 16|[0-9]+)(\)?:)")
TMP = "/tmp/frontier_phase_regs"

src = open("frontier/backends/triton/kernels.py").read()
for name in sys.argv[1].split(","):
    keep = KEEP[name]
    kernel = BRANCH.sub(lambda m: m.group(1) + ("ph == " + m.group(2) if m.group(2) in keep else "False") + m.group(3),
                        src)
    subprocess.run(["rm", "-rf", TMP], check=True)
    subprocess.run(["mkdir", "-p", TMP], check=True)
    subprocess.run(["cp", "-r", "frontier", TMP], check=True)
    open(os.path.join(TMP, "frontier/backends/triton/kernels.py"), "w").write(kernel)
    out = subprocess.run([sys.executable, "scripts/compile_check.py", *sys.argv[2:]], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=TMP + ":."))
    print(name, (out.stdout.strip().splitlines() or [out.stderr[-500:]])[-1], flush=True)
