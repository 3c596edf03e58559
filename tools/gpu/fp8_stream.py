"""One weight stream alone, on one program per SM (two in one form below): at batch 1 (10 activation
rows, one 16-row tile), in each weight format the triton backend streams - bf16, and e4m3 with
power-of-two row scales (``fp8.FP8_EXACT``) with and without the swapped dot (``SWAP_DOT``), the
integer conversion (``BF16_BITS``) and the word reads of unswapped dots (``PACK_WORDS``) - at a few
stage sizes: the gate/up phase (``kernels.stream._ph_gateup``, both matrices packed per slab) and
the down projection (``_ph_linear`` with the residual: bf16 and unswapped fp8 with the k-chunks
folded 4 ways, swapped fp8 unsplit and split ``Tuning.swap_split`` ways in k-chunks of up to
``Tuning.split_bk`` columns, the launcher's batch-1 form); and gate/up for the tree rows of batches
2, 4 and 16 in the launcher's geometry of those batches (its row tiles: bf16, fp8 read as bytes and
as words, and fp8 swapped where one tile of at most 64 rows holds them); and the batch-1 swapped
gate/up and split down in two other forms beside the shipped one: the same activation values in fp16
(each e4m3 pair then converted by one hardware instruction, no integer sequence) and two programs of
half the warps on each SM (half the rows and shared memory each). Each stream is timed as a CUDA
graph of back-to-back calls (device time, no host gaps) over copies of its weights that rotate so
that no call finds its weights in L2. Prints microseconds per call and the bytes streamed per second
against the device's copy bandwidth (``frontier.bench.copy_bandwidth``); every fp8 output is
compared with the bf16 stream of the dequantized weights (identical, or off in the last bits where
the dot's sums are ordered differently), and each other form's with the shipped form's.

    python tools/gpu/fp8_stream.py --json-out fp8_stream.json     # needs a CUDA GPU

The shapes are the bench presets': 8B (gate/up 14336 x 4096 per matrix, down 4096 x 14336) and 1B
(8192 x 2048, down 2048 x 8192).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(_REPO))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from frontier.backends.triton.fp8 import BF16_BITS, FP8_EXACT, PACK_WORDS, PLAIN, SWAP_DOT, StreamFormats  # noqa: E402
from frontier.backends.triton.kernels.stream import SWAP_ROWS, _ph_gateup, _ph_linear  # noqa: E402
from frontier.backends.triton.plan import LaunchPlanner, pack_slabs  # noqa: E402
from frontier.backends.triton.tuning import Tuning, slab  # noqa: E402
from frontier.bench import BenchCase, copy_bandwidth  # noqa: E402
from frontier.weights import quantize_fp8  # noqa: E402

SHAPES = {"8B": (14336, 4096), "1B": (8192, 2048)}  # gate/up [N, K]; down is [K, N]
PRESET = {"8B": "eagle3-llama3.1-8b", "1B": "eagle3-llama3.2-1b"}
ROWS = 10  # the tree rows of one sequence at top_k 10
FORMATS = {  # name -> W8
    "bf16": PLAIN,
    "fp8": FP8_EXACT + BF16_BITS,
    "fp8, words": FP8_EXACT + BF16_BITS + PACK_WORDS,
    "fp8 swapped, Triton's conversion": FP8_EXACT + SWAP_DOT,
    "fp8 swapped": FP8_EXACT + BF16_BITS + SWAP_DOT,
}


@triton.jit
def _gateup_kernel(x_ptr, wg_ptr, wu_ptr, y_ptr, sg_ptr, su_ptr, M, N, Kd, RP,
                   BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, W8: tl.constexpr,
                   BM: tl.constexpr = 16, BM2: tl.constexpr = 0, PACK: tl.constexpr = True):
    _ph_gateup(tl.program_id(0), tl.num_programs(0), x_ptr, M, wg_ptr, wu_ptr, N, Kd, y_ptr, RP, BM=BM, BNS=BNS,
               BK=BK, IEEE=False, BM2=BM2, ST=ST, PACK=PACK, sg_ptr=sg_ptr, su_ptr=su_ptr, W8=W8)


@triton.jit
def _down_kernel(x_ptr, w_ptr, y_ptr, r_ptr, s_ptr, M, N, Kd, RP,
                 BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, FOLD: tl.constexpr, W8: tl.constexpr):
    _ph_linear(tl.program_id(0), tl.num_programs(0), x_ptr, Kd, M, w_ptr, N, Kd, Kd, y_ptr, N, r_ptr, N, r_ptr, w_ptr,
               w_ptr, 0, RP, MODE=1, BM=16, BNS=BNS, BK=BK, IEEE=False, VEC=1, ST=ST, FOLD=FOLD, STF=0, s_ptr=s_ptr,
               W8=W8)


DOWN = {  # name -> (W8, FOLD, longest k-chunk)
    "bf16, folded": (PLAIN, 4, 512),
    "fp8 unswapped, folded": (FP8_EXACT + BF16_BITS, 4, 512),
    "fp8 swapped, unsplit": (FP8_EXACT + BF16_BITS + SWAP_DOT, 1, 512),
    "fp8 swapped, split": (FP8_EXACT + BF16_BITS + SWAP_DOT, Tuning().swap_split, Tuning().split_bk),
}
# bytes of all the copies of a stream's weights: the others' (at least 75 MB, more than L2) stream
# between two reads of one copy
L2_CLEAR = 150_000_000


def _time_us(calls: list, reps: int) -> float:
    """Device microseconds per call: ``reps`` calls cycling through ``calls`` (one per weight
    copy), captured in one CUDA graph; the best of three replays."""
    for fn in calls[:2]:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) * 1e3 / reps)
    return best


def _copies(nbytes: int) -> int:
    return max(1, -(-L2_CLEAR // nbytes))


def _gateup_mats(n: int, k: int, gen: torch.Generator) -> tuple[list, list]:
    """Gate and up [n, k] drawn from ``gen``: their e4m3 form (weights, fp32 power-of-two scales
    [n]) and its dequantized bf16 weights."""
    w = [(torch.randn(n, k, device=gen.device, generator=gen) * 0.05).to(torch.bfloat16) for _ in range(2)]
    q = [quantize_fp8(m) for m in w]
    return q, [(a.float() * s[:, None]).to(torch.bfloat16) for a, s in q]


def _pct(nbytes: int, us: float, bw: float) -> float:
    """Bytes streamed per second as a percentage of the copy bandwidth ``bw``."""
    return 100 * nbytes / (us * 1e-6) / bw


def run(shapes: list[str], stage_kb: list[int], reps: int) -> dict:
    dev = torch.device("cuda")
    grid = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = copy_bandwidth(dev)
    rows = []
    print(f"{torch.cuda.get_device_name(dev)}: {grid} programs, copy bandwidth {bw / 1e12:.2f} TB/s")
    for shape in shapes:
        n, k = SHAPES[shape]
        gen = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(ROWS, k, device=dev, generator=gen).to(torch.bfloat16)
        q, deq = _gateup_mats(n, k, gen)
        ref = None
        for name, w8 in FORMATS.items():
            mats = deq if w8 == PLAIN else [a for a, _ in q]
            for kb in stage_kb:
                # the launcher's gate/up geometry (plan.py) with this stage size
                tn = Tuning(stage_bytes=kb * 1024, fp8_stage_bytes=kb * 1024)
                rp, bns, bk = slab(n, k, grid, mats[0].element_size(), 2, tn, 16, stages=4, x_elsize=2)
                nbytes = 2 * n * k * mats[0].element_size()
                packs = [[pack_slabs(m, grid, rp, bk) for m in mats] for _ in range(_copies(nbytes))]
                y = torch.zeros(ROWS, n, device=dev, dtype=torch.bfloat16)

                def call(g, u):
                    _gateup_kernel[(grid,)](x, g, u, y, q[0][1], q[1][1], ROWS, n, k, rp, BNS=bns, BK=bk, ST=4, W8=w8,
                                            num_warps=8)

                us = _time_us([lambda g=g, u=u: call(g, u) for g, u in packs], reps)
                del packs
                if ref is None:
                    ref = y.clone()
                same = (y == ref).float().mean().item()
                diff = (y.float() - ref.float()).abs().max().item()
                rows.append(dict(shape=shape, stream="gate/up", weights=name, stage_kb=kb, BK=bk, us=us, bytes=nbytes,
                                 pct_bandwidth=_pct(nbytes, us, bw), identical=same, max_diff=diff))
                print(f"{shape} {name:34s} {kb:3d} KB stages (BK {bk:3d}): {us:7.2f} us, "
                      f"{_pct(nbytes, us, bw):5.1f}% of copy bandwidth; vs bf16: {100 * same:.2f}% identical, "
                      f"max diff {diff:.3g}", flush=True)
        rows += _down(shape, k=n, n=k, grid=grid, bw=bw, reps=reps)
        rows += _tiles(shape, grid, bw, reps)
        rows += _forms(shape, grid, bw, reps)
    return {"device": torch.cuda.get_device_name(dev), "programs": grid, "copy_bandwidth_Bps": bw, "rows": rows}


def _down(shape: str, k: int, n: int, grid: int, bw: float, reps: int) -> list[dict]:
    """The down projection [n, k] (+ residual) in each format of ``DOWN``, in the launcher's
    batch-1 geometry (plan.py: default tuning, 3 stages)."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(ROWS, k, device=dev, generator=gen).to(torch.bfloat16)
    res = torch.randn(ROWS, n, device=dev, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    q, sc = quantize_fp8(w)
    deq = (q.float() * sc[:, None]).to(torch.bfloat16)
    rows, ref = [], None
    for name, (w8, fold, bk_max) in DOWN.items():
        mat = deq if w8 == PLAIN else q
        rp, bns, bk = slab(n, k, grid, mat.element_size(), 1, Tuning(), 16, stages=3, x_elsize=2, bk_max=bk_max)
        nbytes = n * k * mat.element_size()
        mats = [mat] + [mat.clone() for _ in range(_copies(nbytes) - 1)]
        y = torch.empty(ROWS, n, device=dev, dtype=torch.bfloat16)

        def call(m):
            _down_kernel[(grid,)](x, m, y, res, sc, ROWS, n, k, rp, BNS=bns, BK=bk, ST=3, FOLD=fold, W8=w8,
                                  num_warps=8)

        us = _time_us([lambda m=m: call(m) for m in mats], reps)
        del mats
        if ref is None:
            ref = y.clone()
        same = (y == ref).float().mean().item()
        rows.append(dict(shape=shape, stream="down", weights=name, stage_kb=None, BK=bk, us=us, bytes=nbytes,
                         pct_bandwidth=_pct(nbytes, us, bw), identical=same,
                         max_diff=(y.float() - ref.float()).abs().max().item()))
        print(f"{shape} down {name:29s} (BK {bk:4d}): {us:7.2f} us, {_pct(nbytes, us, bw):5.1f}% of copy "
              f"bandwidth; vs bf16: {100 * same:.2f}% identical", flush=True)
    return rows


TILE_BATCHES = (2, 4, 16)
TILE_FORMATS = {"bf16": PLAIN, "fp8": FP8_EXACT + BF16_BITS, "fp8 words": FP8_EXACT + BF16_BITS + PACK_WORDS,
                "fp8 swapped": FP8_EXACT + BF16_BITS + SWAP_DOT}


def _tiles(shape: str, grid: int, bw: float, reps: int) -> list[dict]:
    """gate/up for the tree rows of batches 2, 4 and 16 in the launcher's geometry for each format
    (``LaunchPlanner.plan``: its row tiles, slab, k-chunk and stages); the swapped form only where
    that launch's one tile has at most ``SWAP_ROWS`` rows (with two tiles the dots are not swapped)."""
    dev = torch.device("cuda")
    cfg = BenchCase(preset=PRESET[shape], depth=7).config()
    n, k = SHAPES[shape]
    gen = torch.Generator(device=dev).manual_seed(2)
    q, deq = _gateup_mats(n, k, gen)
    out = []
    for b in TILE_BATCHES:
        rows = b * cfg.top_k
        x = torch.randn(rows, k, device=dev, generator=gen).to(torch.bfloat16)
        ref = None
        for name, w8 in TILE_FORMATS.items():
            plan = LaunchPlanner(cfg, torch.bfloat16, grid, Tuning(), StreamFormats(gu=w8)).plan(b)
            c = plan.const
            if w8 & SWAP_DOT and (c["BM2"] or c["BM"] > SWAP_ROWS.value):
                continue
            mats = deq if w8 == PLAIN else [a for a, _ in q]
            nbytes = 2 * n * k * mats[0].element_size()
            copies = [mats] + [[m.clone() for m in mats] for _ in range(_copies(nbytes) - 1)]
            y = torch.zeros(rows, n, device=dev, dtype=torch.bfloat16)

            def call(g, u, c=c, rp=plan.slabs["RP_GU"], w8=w8):
                _gateup_kernel[(grid,)](x, g, u, y, q[0][1], q[1][1], rows, n, k, rp, BNS=c["BNS_GU"], BK=c["BK_GU"],
                                        ST=c["ST_GU"], W8=w8, BM=c["BM"], BM2=c["BM2"], PACK=False,
                                        num_warps=c["num_warps"])

            us = _time_us([lambda g=g, u=u: call(g, u) for g, u in copies], reps)
            del copies
            if ref is None:
                ref = y.clone()
            same = (y == ref).float().mean().item()
            tiles = f"{c['BM']}+{c['BM2']}" if c["BM2"] else str(c["BM"])
            out.append(dict(shape=shape, stream="gate/up", batch=b, rows=rows, tiles=tiles, weights=name, BK=c["BK_GU"],
                            us=us, bytes=nbytes, pct_bandwidth=_pct(nbytes, us, bw), identical=same,
                            max_diff=(y.float() - ref.float()).abs().max().item()))
            print(f"{shape} gate/up batch {b:2d} ({rows} rows, tiles {tiles:6s}) {name:12s} (BK {c['BK_GU']:3d}): "
                  f"{us:7.2f} us, {_pct(nbytes, us, bw):5.1f}% of copy bandwidth; vs bf16: "
                  f"{100 * same:.2f}% identical", flush=True)
    return out


FORMS = {  # name -> (activations in fp16, programs per SM: each with 8 / that many warps)
    "shipped": (False, 1),
    "fp16 activations": (True, 1),
    "two programs of 4 warps per SM": (False, 2),
}


def _forms(shape: str, grid: int, bw: float, reps: int) -> list[dict]:
    """The batch-1 swapped gate/up (packed, 32 KB stages) and split down (k-chunks of up to
    ``Tuning.split_bk`` columns, split one k-slice per warp) in each form of ``FORMS``, the
    launcher's slab geometry for the form's grid. fp16 activations hold the same values (drawn
    where bf16 and fp16 agree), so that form should give the shipped one's bits; two programs per SM
    each take half the rows, stage bytes and shared memory on half the warps, in a grid of twice
    the SMs (the down's k-chunks then fall to 512 columns in 3 stages, split 4 ways: its sums run
    in another order)."""
    dev = torch.device("cuda")
    n, k = SHAPES[shape]
    gen = torch.Generator(device=dev).manual_seed(3)
    x = torch.randn(ROWS, max(n, k), device=dev, generator=gen)
    x = torch.where(x.abs() < 2.0 ** -14, 0.0, x).to(torch.bfloat16)  # values fp16 holds exactly too
    q, _ = _gateup_mats(n, k, gen)
    wd, sd = quantize_fp8((torch.randn(k, n, device=dev, generator=gen) * 0.02).to(torch.bfloat16))
    res = torch.randn(ROWS, k, device=dev, generator=gen).to(torch.bfloat16)
    out, refs = [], {}
    for name, (half, per) in FORMS.items():
        xa = x.to(torch.float16) if half else x
        w8 = FP8_EXACT + SWAP_DOT + (0 if half else BF16_BITS)  # (fp16 activations: Triton's e4m3 -> f16)
        g = grid * per
        tn = Tuning(stage_bytes=32768 // per, fp8_stage_bytes=32768 // per, smem_bytes=Tuning().smem_bytes // per)
        for stream in ("gate/up", "down"):
            if stream == "gate/up":
                rp, bns, bk = slab(n, k, g, 1, 2, tn, 16, stages=4, x_elsize=2)
                nbytes = 2 * n * k
                copies = [[pack_slabs(m, g, rp, bk) for m, _ in q] for _ in range(_copies(nbytes))]
                y = torch.zeros(ROWS, n, device=dev, dtype=torch.bfloat16)
                xs = xa[:, :k].contiguous()

                def call(c, rp=rp, bns=bns, bk=bk, y=y, xs=xs, g=g, w8=w8, per=per):
                    _gateup_kernel[(g,)](xs, c[0], c[1], y, q[0][1], q[1][1], ROWS, n, k, rp, BNS=bns, BK=bk, ST=4,
                                         W8=w8, num_warps=8 // per)
            else:
                rp, bns, bk = slab(k, n, g, 1, 1, tn, 16, stages=3, x_elsize=2, bk_max=Tuning().split_bk)
                nbytes = k * n
                copies = [wd] + [wd.clone() for _ in range(_copies(nbytes) - 1)]
                y = torch.empty(ROWS, k, device=dev, dtype=torch.bfloat16)
                xs = xa[:, :n].contiguous()

                def call(c, rp=rp, bns=bns, bk=bk, y=y, xs=xs, g=g, w8=w8, per=per):
                    _down_kernel[(g,)](xs, c, y, res, sd, ROWS, k, n, rp, BNS=bns, BK=bk, ST=3,
                                       FOLD=Tuning().swap_split // per, W8=w8, num_warps=8 // per)

            us = _time_us([lambda c=c, call=call: call(c) for c in copies], reps)
            del copies
            ref = refs.setdefault(stream, y.clone())
            same = (y == ref).float().mean().item()
            out.append(dict(shape=shape, stream=stream, batch=1, weights="fp8 swapped", form=name, BK=bk,
                            rows_per_program=rp, us=us, bytes=nbytes, pct_bandwidth=_pct(nbytes, us, bw),
                            identical_to_shipped=same))
            print(f"{shape} {stream:7s} batch 1, {name:31s} (RP {rp:3d}, BK {bk:4d}): {us:7.2f} us, "
                  f"{_pct(nbytes, us, bw):5.1f}% of copy bandwidth; vs shipped: {100 * same:.2f}% identical",
                  flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8B,1B", help="comma-separated: 8B, 1B")
    ap.add_argument("--stage-kb", default="16,32", help="weight bytes per pipeline stage, in KB (comma-separated)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tools/gpu/fp8_stream.py needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = [s for s in a.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        ap.error(f"--shapes: unknown {bad}; choose from {sorted(SHAPES)}")
    res = run(shapes, [int(v) for v in a.stage_kb.split(",") if v], a.reps)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
