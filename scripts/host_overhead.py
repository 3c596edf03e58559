"""Where the ~0.7 ms between the triton call and its kernel goes (GPU; 8B preset, depth 7)."""
import statistics, time
import torch
from frontier.api import validate_request
from frontier.bench import BenchCase, CallSetup, time_calls
from frontier.registry import get_backend
from frontier.tree import pack_tree

dev = torch.device("cuda")
case = BenchCase(preset="eagle3-llama3.1-8b", depth=7)
s = CallSetup(case, device=dev, dtype=torch.bfloat16)
be = get_backend("triton")
d = be.drafter(s.cfg, torch.bfloat16, dev)
ids = s.ids[0, 1:]


def cpu_us(fn, n=50):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def launch():
    s.cache.truncate(s.c)
    d.alloc_outputs()
    d.run(s.weights, s.features[0], ids[s.c:], s.ids[0, -1:], s.cache, s.c, case.new_rows, "persistent")


print("validate_request CPU us", cpu_us(lambda: validate_request(
    s.cfg, s.features, be, backend_name="triton", input_ids=s.ids, weights=s.weights, cache=s.cache,
    cache_max_length=None, sampling=False, padded=True, seed=0, options={"check_token_range": False}), 200))
print("alloc+run (Triton launch) CPU us, no sync", cpu_us(launch, 20))
par = d.out_par.clone()
print("pack_tree CPU us", cpu_us(lambda: pack_tree(par, sampling=False, padded=True, max_depth=8), 100))
print("check_error CPU us (sync incl.)", cpu_us(d.check_error, 100))
print("kernel only ms", time_calls(launch, reps=30))
print("kernel + pack_tree ms", time_calls(lambda: (launch(), pack_tree(d.out_par, padded=True, max_depth=8)), reps=30))
print("full call ms", time_calls(lambda: s.call("triton"), reps=30))
