"""The whole triton draft call as a caller sees it, and where its host time goes (GPU machine).

1. The whole call (``frontier.bench.CallSetup.call``, i.e. ``frontier_generate`` on a warm cache;
   CUDA events, GPU idle at each start): median ms. ``--time-only`` stops here (the line that
   ``benchmarks/ab.sh`` alternates between builds).
2. A cProfile of many calls (Python functions by own and by cumulative time).
3. torch.profiler over 20 calls: CUDA API calls and kernels by self CPU time.

    python3 benchmarks/host_overhead.py [--preset eagle3-llama3.1-8b] [--depth 7] [--mode persistent|graph]
                                        [--dtype bf16] [--backend triton] [--calls 200] [--time-only]
"""

import argparse
import cProfile
import io
import pstats

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="eagle3-llama3.1-8b", help="frontier bench preset (head shape)")
    ap.add_argument("--depth", type=int, default=7, help="tree depth D")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--mode", choices=["persistent", "graph"], default=None,
                    help="triton launch mode (the option mode=...; default: the backend's default)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--calls", type=int, default=200, help="calls under cProfile")
    ap.add_argument("--reps", type=int, default=100, help="timed calls (median)")
    ap.add_argument("--time-only", action="store_true", help="only the whole call's time (for A/B runs)")
    a = ap.parse_args(argv)

    import torch

    from frontier.bench import BenchCase, CallSetup, time_calls

    if not torch.cuda.is_available():
        raise SystemExit("host_overhead.py needs a CUDA GPU")
    dev = torch.device("cuda")
    case = BenchCase(preset=a.preset, depth=a.depth)
    s = CallSetup(case, device=dev, dtype=getattr(torch, DTYPES[a.dtype]))
    options = {} if a.mode is None else {"mode": a.mode}

    def call():
        return s.call(a.backend, **options)

    # (the call reads the error flag, a sync, so only the host-inclusive time is meaningful here)
    ms = time_calls(call, reps=a.reps)
    print(f"{a.preset} depth {a.depth} {a.backend} {a.mode or 'default'} {a.dtype}: call {ms:.3f} ms "
          f"(median of {a.reps}, GPU idle at each start)", flush=True)
    if a.time_only:
        return 0

    for _ in range(10):
        call()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(a.calls):
        call()
    torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(28)
    st.sort_stats("cumtime").print_stats(40)
    print(buf.getvalue())

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            call()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
