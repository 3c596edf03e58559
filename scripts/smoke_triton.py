"""GPU smoke test of the triton backend: one tiny call per mode vs torch_ref, then a timed 8B call."""
import sys, time, traceback
import torch, triton
import frontier
from frontier import frontier_generate
from frontier.random_head import random_config, random_weights, random_inputs

print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), flush=True)
for arch, over in [("eagle3", dict(vocab_size=64, target_vocab_size=100)), ("eagle2", dict(vocab_size=64))]:
    cfg = random_config(architecture=arch, total_token=12, depth=3, top_k=3, **over)
    w = random_weights(cfg, seed=1, device="cuda")
    ids, feats = random_inputs(cfg, context=7, seed=2, device="cuda")
    ref = frontier_generate(cfg, feats, backend="torch_ref", input_ids=ids, weights=w)
    for mode in ["steps", "persistent"]:
        t = time.time()
        try:
            fr = frontier_generate(cfg, feats, backend="triton", input_ids=ids, weights=w, mode=mode)
            torch.cuda.synchronize()
            print(arch, mode, "same", ref.same_tree(fr), "first call %.1fs" % (time.time() - t), flush=True)
        except Exception:
            traceback.print_exc()
            print(arch, mode, "FAILED", flush=True)
