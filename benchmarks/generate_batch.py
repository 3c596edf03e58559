"""Batched speculative generation on the GPU: B prompts of different lengths drafted by ONE
draft call and verified by ONE target forward per step. Greedy output of every prompt is
compared with ``target.generate(do_sample=False)`` on that prompt alone (fp32: must be identical).

    python3 benchmarks/generate_batch.py [--batches 1,4,8] [--new 64] [--backends triton,torch_ref]

Prints one line per (preset, batch, backend): new tokens, seconds, tokens/s, verify steps and how
many of the batch's outputs equal target.generate's.
"""
import argparse
import time

import torch

from frontier.generation import generate, random_pair

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--batches", default="1,4,8")
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--backends", default="triton,torch_ref")
ap.add_argument("--presets", default="tiny:float32,small:bfloat16")
ap.add_argument("--device", default="cuda")
a = ap.parse_args()
dev = a.device
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
for spec in a.presets.split(","):
    preset, dt = spec.split(":")
    dtype = getattr(torch, dt)
    target, cfg, w = random_pair(preset, total_token=60, depth=5, top_k=10, seed=0, dtype=dtype, device=dev)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, cfg.target_vocab_size, (1, int(torch.randint(24, 96, (1,), generator=g))), generator=g).to(dev)
               for _ in range(max(int(b) for b in a.batches.split(",")))]
    # both stop at the target's EOS (id 2) or after --new tokens
    refs = [target.generate(p, do_sample=False, max_new_tokens=a.new, pad_token_id=0)[0, p.shape[1]:] for p in prompts]
    for bsz in [int(b) for b in a.batches.split(",")]:
        for backend in a.backends.split(","):
            batch = prompts[:bsz]
            kw = dict(cfg=cfg, weights=w, backend=backend, max_new_tokens=a.new)
            generate(target, batch if bsz > 1 else batch[0], **kw)  # warm-up (compiles)
            sync()
            t0 = time.time()
            out = generate(target, batch if bsz > 1 else batch[0], **kw)
            sync()
            dt_s = time.time() - t0
            results = out.results if bsz > 1 else [out]
            same = sum(int(torch.equal(r.new_tokens[0], refs[b])) for b, r in enumerate(results))
            ntok = sum(r.new_tokens.shape[1] for r in results)
            st = out.stats
            steps = st.verify_steps if bsz > 1 else st.target_forwards - 1
            print(f"{preset} {dt} batch {bsz} {backend:9s}: {ntok} new tokens in {dt_s:.2f}s ({ntok / dt_s:7.1f} tok/s), "
                  f"{steps} steps, "
                  f"identical to target.generate: {same}/{bsz}", flush=True)
