"""Exact-match rate of triton vs torch_ref over many seeds, per dtype, with the near-tie check of
every call (frontier.parity.near_tie_report): GPU.

Two calls per seed on one cache (64 context rows, then 4 new rows), both traced. A call counts as
identical when the integer outputs are equal; every call is also checked decision by decision
(is the first differing decision a near-tie of the reference's own scores, and do the scores agree
within rounding up to it?). For the first --cpu-seeds seeds the same reference also runs on the
CPU, and the GPU reference is checked against it the same way: the reference's own cross-device
near-ties, the yardstick for the triton numbers.

    python3 benchmarks/bf16_match.py --seeds 24 --cpu-seeds 6 --dtypes fp32,bf16,fp16

Prints, per dtype, one block: the triton-vs-torch_ref tally (trees identical, calls with no
differing decision, differences explained by near-ties, the score gap at the first difference)
and the same tally for torch_ref on the GPU against torch_ref on the CPU.
"""
import argparse
import statistics
import time

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=24)
    ap.add_argument("--dtypes", default="fp32,bf16,fp16", help="comma-separated: bf16/bfloat16, fp16/float16, fp32/float32")
    ap.add_argument("--cpu-seeds", type=int, default=6, help="seeds whose reference also runs on the CPU")
    ap.add_argument("--ulps", type=float, default=2.0, help="near_tie_report tolerance per summed log-prob")
    a = ap.parse_args(argv)
    bad = [d for d in a.dtypes.split(",") if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes: unknown {bad} (use {', '.join(DTYPES)})")
    return a


a = parse_args()

import torch  # noqa: E402

from frontier import frontier_generate  # noqa: E402
from frontier.parity import near_tie_report  # noqa: E402
from frontier.random_head import random_config, random_inputs, random_weights  # noqa: E402

cfg = random_config(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1408,
                    vocab_size=4000, target_vocab_size=16000, total_token=60, depth=6, top_k=10)


class Tally:
    def __init__(self):
        self.reports = []

    def add(self, rep):
        self.reports.append(rep)

    def line(self) -> str:
        rs = self.reports
        if not rs:
            return "-"
        n = len(rs)
        same = sum(r.identical for r in rs)
        nodiff = sum(r.stage is None for r in rs)
        ok = sum(r.explained for r in rs)
        gaps = [r.gap for r in rs if r.stage is not None]
        noise = [r.noise for r in rs]
        stages = sorted({r.stage.split()[0] for r in rs if r.stage})
        bad = [str(r) for r in rs if not r.explained][:3]
        return (f"trees identical {same}/{n} ({100 * same / n:.1f}%), no differing decision {nodiff}/{n}, "
                f"explained {ok}/{n}; gap at first difference (units) median "
                f"{statistics.median(gaps) if gaps else 0:.2f} max {max(gaps) if gaps else 0:.2f}; noise median "
                f"{statistics.median(noise):.2f} max {max(noise):.2f}; stages {stages}"
                + (f"\n    not explained: {bad}" if bad else ""))


for dtn in a.dtypes.split(","):
    dt = getattr(torch, DTYPES[dtn])
    tri, cross = Tally(), Tally()
    t0 = time.time()
    for seed in range(a.seeds):
        sampling = seed % 2 == 1
        w = random_weights(cfg, seed=seed, device="cuda", dtype=dt, lm_head_scale=6.0)
        ids, feats = random_inputs(cfg, context=68, seed=seed + 1000, device="cuda", dtype=dt)
        wc = w.to("cpu") if seed < a.cpu_seeds else None
        cr = ct = cb = None
        c = 0
        for n in (64, 4):
            kw = dict(input_ids=ids[:, : c + n + 1], sampling=sampling, trace=True)
            r = frontier_generate(cfg, feats[:, c:c + n], backend="torch_ref", weights=w, cache=cr, **kw)
            t = frontier_generate(cfg, feats[:, c:c + n], backend="triton", weights=w, cache=ct, **kw)
            tri.add(near_tie_report(r, t, cfg, ulps=a.ulps))
            if wc is not None:  # the same reference on the CPU: same dtype, another summation order
                kwc = dict(kw, input_ids=kw["input_ids"].cpu())
                b = frontier_generate(cfg, feats[:, c:c + n].cpu(), backend="torch_ref", weights=wc, cache=cb, **kwc)
                cross.add(near_tie_report(b, r, cfg, ulps=a.ulps))
                cb = b.cache
            cr, ct, c = r.cache, t.cache, c + n
    print(f"{dtn} [{time.time() - t0:.0f}s]\n  triton vs torch_ref (GPU): {tri.line()}\n"
          f"  torch_ref GPU vs torch_ref CPU: {cross.line()}", flush=True)
