"""How fast one program per SM streams a weight matrix through the drafter's own k-loop
(``kernels._stream_tile``) and variants of it, outside the drafter (no barriers, no epilogues).

Each program owns a slab of ``ceil(N / grid)`` rows (as the drafter's weight phases do) and
streams it against a 16-row activation tile (10 rows valid, as at top_k 10); the matrix is
repeated R times (R slabs per program, one after another) so a launch moves a few hundred MB and
its launch cost is amortised. Prints the achieved bandwidth and its ratio to a device-to-device
copy. Studies (``--study``): ``fold`` - the dot folded F ways (``kernels._stream_folded``) vs the
plain one at 8 and 4 warps; ``packed`` - weights repacked per slab so that each stage's tile is
one contiguous block; ``read`` - plain reads with no dot (contiguous per program, and in the
slab's tiles); ``tiles`` - tile shapes, warps, a 3-D k-split dot, swapped operands, bulk tensor
copies (TMA); ``l2`` - the same stream from HBM and from L2 (one copy re-read), which tells a
memory-bound k-loop from an SM-bound one; ``ksplit`` - shorter accumulator chains per k-chunk
(folded, a 3-D dot, 2 or 4 separate accumulators), from HBM and L2; ``blocked`` - row-major
against packed per slab (as ``Tuning.pack_weights`` packs) and row-blocked layouts (blocks of 16
or 32 rows, each [k-chunks, rows, BK]: any grid). The A/B studies alternate their variants over
several rounds, because the device's speed drifts between runs by more than the differences sought.

    python3 scripts/stream_probe.py --study fold,packed      # the 8B preset's streams at batch 1
"""
import argparse
import statistics

import torch
import triton
import triton.language as tl

from frontier.backends.triton import kernels as K_
from frontier.bench import copy_bandwidth, time_calls


def median_ms(f, reps: int = 30) -> float:
    """Median ms of ``reps`` calls of ``f``, CUDA events around each (``frontier.bench.time_calls``)."""
    return time_calls(f, warmup=1, reps=reps)


def alternate(calls: dict, rounds: int) -> dict:
    """Each round times every call once (median of 15): {key: [ms per round]}."""
    got = {k: [] for k in calls}
    for _ in range(rounds):
        for key, f in calls.items():
            got[key].append(median_ms(f, 15))
    return got


def checked(calls: dict, out, ref, label: str) -> dict:
    """Runs each call once; drops (and reports) those that fail to compile or launch. Returns
    each remaining call's largest relative difference of ``out`` from ``ref``."""
    errs = {}
    for key, f in list(calls.items()):
        try:
            f()
            torch.cuda.synchronize()
            errs[key] = ((out - ref).abs() / ref.abs().clamp_min(1)).max().item()
        except Exception as exc:
            print(f"{label} {key}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            calls.pop(key)
    return errs


def ab_lines(calls: dict, rounds: int, nbytes: int, reps: int, bw: float, extra=None) -> list[str]:
    """Alternates ``calls`` (each moving ``reps`` matrices of ``nbytes``) and gives per call its
    median µs per matrix and % of the copy bandwidth (plus ``extra(key, per-round ms)``)."""
    got = alternate(calls, rounds)
    line = []
    for key, v in got.items():
        ms = statistics.median(v)
        rate = reps * nbytes / ms / 1e9
        line.append(f"{key} {ms * 1e3 / reps:6.2f} us {100 * rate * 1e12 / bw:5.1f}%" + (extra(key, v) if extra else ""))
    return line


@triton.jit
def _first_row(rr, r, N, L2: tl.constexpr):
    """Where row(s) ``rr`` of repetition r lie in the [R * N, Kd] weight: in copy r, or with L2
    in the first copy, which every repetition then reads again (so it stays in L2)."""
    if L2:
        return rr
    else:
        return r * N + rr


@triton.jit
def _slab_rows(w_ptr, pid, r, s0, N, Kd, RP, BNS: tl.constexpr, L2: tl.constexpr = False):
    """Sub-slab s0 of program pid's slab in repetition r: its rows' mask and pointers [BNS]."""
    rp = s0 + tl.arange(0, BNS)
    rr = pid * RP + rp
    return (rp < RP) & (rr < N), w_ptr + _first_row(rr, r, N, L2).to(tl.int64) * Kd


@triton.jit
def probe_kernel(w_ptr, x_ptr, out_ptr, N, Kd, RP, R, M,
                 BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr, L2: tl.constexpr = False):
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    tot = tl.zeros([BNS, BM], dtype=tl.float32)
    for r in range(R):
        for s0 in range(0, RP, BNS):
            rmask, wrow = _slab_rows(w_ptr, pid, r, s0, N, Kd, RP, BNS, L2)
            acc, _ = K_._stream_tile(wrow, rmask, x_ptr, Kd, rm, rm, M, 0, Kd, BNS, BM, BK, False, 0, ST)
            tot += acc
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


@triton.jit
def probe3_kernel(w_ptr, x_ptr, out_ptr, N, Kd, RP, R, M,
                  BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr, S: tl.constexpr,
                  L2: tl.constexpr = False):
    """The same stream with each k-chunk split into S slices that a batched dot gives to
    different warps ([S, BNS, BK/S] @ [S, BK/S, BM]), summed over S after the k-loop."""
    pid = tl.program_id(0)
    KS: tl.constexpr = BK // S
    rm = tl.arange(0, BM)
    rs = tl.arange(0, S)
    rk = tl.arange(0, KS)
    tot = tl.zeros([BNS, BM], dtype=tl.float32)
    for r in range(R):
        for s0 in range(0, RP, BNS):
            rmask, wrow = _slab_rows(w_ptr, pid, r, s0, N, Kd, RP, BNS, L2)
            acc = tl.zeros([S, BNS, BM], dtype=tl.float32)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                kw = k0 + rs[:, None, None] * KS + rk[None, None, :]
                w = tl.load(wrow[None, :, None] + kw, mask=rmask[None, :, None], other=0.0,
                            eviction_policy="evict_first")
                kx = k0 + rs[:, None, None] * KS + rk[None, :, None]
                x = tl.load(x_ptr + rm[None, None, :] * Kd + kx, mask=rm[None, None, :] < M, other=0.0,
                            cache_modifier=".cg")
                acc = tl.dot(w, x, acc)
            tot += tl.sum(acc, 0)
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


@triton.jit
def _acc_part(wrow, rmask, x_ptr, Kd, rm, M, k0, rk, acc):
    """acc += W[rows, k0 + rk] @ X[rm, k0 + rk]^T (one column block of a k-chunk)."""
    w = tl.load(wrow[:, None] + k0 + rk[None, :], mask=rmask[:, None], other=0.0, eviction_policy="evict_first")
    x = tl.load(x_ptr + rm[None, :] * Kd + k0 + rk[:, None], mask=rm[None, :] < M, other=0.0, cache_modifier=".cg")
    return tl.dot(w, x, acc)


@triton.jit
def probe_acc_kernel(w_ptr, x_ptr, out_ptr, N, Kd, RP, R, M,
                     BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr, S: tl.constexpr,
                     L2: tl.constexpr = False):
    """The stream with each k-chunk split into S (2 or 4) column blocks, each with its own
    accumulator: S independent dot chains of BK/S columns (no wasted products, unlike the fold;
    no batched dot, unlike probe3), summed after the k-loop."""
    pid = tl.program_id(0)
    KS: tl.constexpr = BK // S
    rm = tl.arange(0, BM)
    rk = tl.arange(0, KS)
    tot = tl.zeros([BNS, BM], dtype=tl.float32)
    for r in range(R):
        for s0 in range(0, RP, BNS):
            rmask, wrow = _slab_rows(w_ptr, pid, r, s0, N, Kd, RP, BNS, L2)
            a0 = tl.zeros([BNS, BM], dtype=tl.float32)
            a1 = tl.zeros([BNS, BM], dtype=tl.float32)
            a2 = tl.zeros([BNS, BM], dtype=tl.float32)
            a3 = tl.zeros([BNS, BM], dtype=tl.float32)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                a0 = _acc_part(wrow, rmask, x_ptr, Kd, rm, M, k0, rk, a0)
                a1 = _acc_part(wrow, rmask, x_ptr, Kd, rm, M, k0 + KS, rk, a1)
                if S == 4:
                    a2 = _acc_part(wrow, rmask, x_ptr, Kd, rm, M, k0 + 2 * KS, rk, a2)
                    a3 = _acc_part(wrow, rmask, x_ptr, Kd, rm, M, k0 + 3 * KS, rk, a3)
            tot += (a0 + a1) + (a2 + a3)
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


@triton.jit
def probe_swap_kernel(w_ptr, x_ptr, out_ptr, N, Kd, RP, R, M,
                      BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr):
    """The same stream with the operands swapped: acc^T [BM, BNS] += X [BM, BK] @ W^T [BK, BNS]
    (the weight tile is the dot's B operand, so warps split its rows instead of each reading it)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    tot = tl.zeros([BM, BNS], dtype=tl.float32)
    for r in range(R):
        for s0 in range(0, RP, BNS):
            rmask, wrow = _slab_rows(w_ptr, pid, r, s0, N, Kd, RP, BNS)
            acc = tl.zeros([BM, BNS], dtype=tl.float32)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                kk = k0 + rk
                w = tl.load(wrow[:, None] + kk[None, :], mask=rmask[:, None], other=0.0, eviction_policy="evict_first")
                x = tl.load(x_ptr + rm[:, None] * Kd + kk[None, :], mask=rm[:, None] < M, other=0.0,
                            cache_modifier=".cg")
                acc = tl.dot(x, tl.trans(w), acc)
            tot += acc
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


@triton.jit
def probe_tma_kernel(w_desc, x_ptr, out_ptr, N, Kd, RP, R, M,
                     BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr, SWAP: tl.constexpr):
    """The same stream with the weight tiles fetched by the bulk tensor copy engine (a host
    tensor descriptor with a [BNS, BK] box; rows past the slab are read, not masked)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    if SWAP:
        tot = tl.zeros([BM, BNS], dtype=tl.float32)
    else:
        tot = tl.zeros([BNS, BM], dtype=tl.float32)
    for r in range(R):
        for s0 in range(0, RP, BNS):
            row0 = r * N + pid * RP + s0
            if SWAP:
                acc = tl.zeros([BM, BNS], dtype=tl.float32)
            else:
                acc = tl.zeros([BNS, BM], dtype=tl.float32)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                w = w_desc.load([row0, k0])
                kk = k0 + rk
                if SWAP:
                    x = tl.load(x_ptr + rm[:, None] * Kd + kk[None, :], mask=rm[:, None] < M, other=0.0,
                                cache_modifier=".cg")
                    acc = tl.dot(x, tl.trans(w), acc)
                else:
                    x = tl.load(x_ptr + rm[None, :] * Kd + kk[:, None], mask=rm[None, :] < M, other=0.0,
                                cache_modifier=".cg")
                    acc = tl.dot(w, x, acc)
            tot += acc
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


@triton.jit
def read_kernel(w_ptr, out_ptr, per, BLOCK: tl.constexpr, ST: tl.constexpr):
    """A plain read: each program sums its contiguous ``per`` elements (the ceiling of one
    program per SM, no dot, no shared-memory round trip unless the pipeliner adds one)."""
    pid = tl.program_id(0)
    base = w_ptr + pid.to(tl.int64) * per
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in tl.range(0, per, BLOCK, num_stages=ST):
        acc += tl.load(base + k0 + tl.arange(0, BLOCK), eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


@triton.jit
def read2d_kernel(w_ptr, out_ptr, N, Kd, RP, BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr):
    """A plain read of the drafter's slab pattern: [BNS, BK] tiles of a program's RP rows."""
    pid = tl.program_id(0)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BNS, BK], dtype=tl.float32)
    for s0 in range(0, RP, BNS):
        rp = s0 + tl.arange(0, BNS)
        rr = pid * RP + rp
        rmask = (rp < RP) & (rr < N)
        wrow = w_ptr + rr.to(tl.int64) * Kd
        for k0 in tl.range(0, Kd, BK, num_stages=ST):
            acc += tl.load(wrow[:, None] + k0 + rk[None, :], mask=rmask[:, None], other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def probe_packed_kernel(wp_ptr, x_ptr, out_ptr, Kd, RP, R, M, G,
                        BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr):
    """The drafter's stream over weights repacked per slab as [k-chunks, RP rows, BK]: each
    stage's [RP, BK] tile is one contiguous block, and a program's slab is read in memory order."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    rp = tl.arange(0, BNS)
    tot = tl.zeros([BNS, BM], dtype=tl.float32)
    for r in range(R):
        base = wp_ptr + (r * G + pid).to(tl.int64) * RP * Kd
        acc = tl.zeros([BNS, BM], dtype=tl.float32)
        for k0 in tl.range(0, Kd, BK, num_stages=ST):
            w = tl.load(base + k0 * RP + rp[:, None] * BK + rk[None, :], mask=rp[:, None] < RP, other=0.0,
                        eviction_policy="evict_first")
            acc = K_._mma(w, K_._x_chunk(x_ptr, Kd, rm, k0 + rk, M, Kd), acc, False)
        tot += acc
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


@triton.jit
def probe_fold_kernel(w_ptr, x_ptr, out_ptr, N, Kd, RP, R, M,
                      BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr, F: tl.constexpr,
                      L2: tl.constexpr = False):
    """The drafter's folded stream (``kernels._stream_folded``: each [BNS, BK] weight chunk read
    as F row blocks of BK/F columns against the activations folded the same way along the dot's
    N, the diagonal blocks summed after the k-loop) over each program's slab."""
    pid = tl.program_id(0)
    tot = tl.zeros([BNS, BM], dtype=tl.float32)
    for r in range(R):
        for s0 in range(0, RP, BNS):
            row = pid * RP + s0
            tot += K_._stream_folded(w_ptr, Kd, _first_row(row, r, N, L2), tl.minimum(RP - s0, N - row), x_ptr, Kd,
                                     0, M, 0, Kd, BNS, BM, BK, False, ST, F)
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


def ab_fold(name, n, kd, reps, bns, bk, st, folds, grid, dev, bw, rounds=6):
    """The plain stream (8 and 4 warps) against folded ones (8 warps), alternated."""
    w = torch.randn(reps * n, kd, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    ref = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    args = (w, x, out, n, kd, rp, reps, 10)
    kw = dict(BNS=bns, BK=bk, ST=st, BM=16)
    calls = {"plain w8": lambda: probe_kernel[(grid,)](*args, **kw, num_warps=8),
             "plain w4": lambda: probe_kernel[(grid,)](*args, **kw, num_warps=4)}
    for f in folds:
        calls[f"fold{f} w8"] = (lambda f=f: probe_fold_kernel[(grid,)](*args, **kw, F=f, num_warps=8))
    try:
        probe_kernel[(grid,)](w, x, ref, n, kd, rp, reps, 10, **kw, num_warps=8)
    except Exception as exc:
        print(f"{name} BNS {bns} BK {bk} stages {st}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return
    errs = checked(calls, out, ref, name)
    line = ab_lines(calls, rounds, n * kd * 2, reps, bw, lambda key, v: f" (err {errs[key]:.0e})")
    print(f"A/B {name:8s} RP {rp:4d} BNS {bns:4d} BK {bk:4d} stages {st}: " + "  ".join(line), flush=True)
    del w


def pack(w, n, kd, reps, grid, bk):
    """[reps * n, kd] -> per repetition and slab [kd / bk, RP, bk] (rows padded to grid * RP)."""
    rp = -(-n // grid)
    wr = w.view(reps, n, kd)
    pad = torch.zeros(reps, grid * rp, kd, dtype=w.dtype, device=w.device)
    pad[:, :n] = wr
    return pad.view(reps, grid, rp, kd // bk, bk).permute(0, 1, 3, 2, 4).contiguous()


def run_packed(name, n, kd, reps, variants, grid, dev, bw):
    w = torch.randn(reps * n, kd, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    ref = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    for bns, bk, st, nw in variants:
        wp = pack(w, n, kd, reps, grid, bk)
        args = (wp, x, out, kd, rp, reps, 10, grid)
        kw = dict(BNS=bns, BK=bk, ST=st, BM=16, num_warps=nw)
        try:
            k = probe_packed_kernel[(grid,)]
            k(*args, **kw)
            probe_kernel[(grid,)](w, x, ref, n, kd, rp, reps, 10, BNS=bns, BK=bk, ST=st, BM=16, num_warps=8)
            torch.cuda.synchronize()
            err = ((out - ref).abs() / ref.abs().clamp_min(1)).max().item()
            ms = median_ms(lambda: k(*args, **kw), 30)
            rate = reps * n * kd * 2 / ms / 1e9
            print(f"packed {name:8s} N {n:6d} Kd {kd:6d} RP {rp:4d}  BNS {bns:4d} BK {bk:5d} stages {st} warps {nw:2d}: "
                  f"{ms * 1e3 / reps:8.2f} us per matrix  {rate:6.3f} TB/s  {100 * rate * 1e12 / bw:5.1f}% of copy "
                  f"(rel. err vs unpacked {err:.1e})", flush=True)
        except Exception as exc:
            print(f"packed {name} BNS {bns} BK {bk} stages {st}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        del wp
    del w


def ab_packed(name, n, kd, reps, bns, bk, st, grid, dev, bw, rounds=6, nw=8):
    """Unpacked and packed streams of one shape, alternated ``rounds`` times (the device's
    speed drifts between runs by more than the difference sought)."""
    w = torch.randn(reps * n, kd, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    wp = pack(w, n, kd, reps, grid, bk)
    kw = dict(BNS=bns, BK=bk, ST=st, BM=16, num_warps=nw)
    calls = {
        "unpacked": lambda: probe_kernel[(grid,)](w, x, out, n, kd, rp, reps, 10, **kw),
        "packed": lambda: probe_packed_kernel[(grid,)](wp, x, out, kd, rp, reps, 10, grid, **kw),
    }
    for f in calls.values():
        f()
    torch.cuda.synchronize()
    line = ab_lines(calls, rounds, n * kd * 2, reps, bw,
                    lambda key, v: f" (rounds {min(v) * 1e3 / reps:.2f}-{max(v) * 1e3 / reps:.2f})")
    print(f"A/B {name:8s} RP {rp:4d} BNS {bns:4d} BK {bk:4d} stages {st} warps {nw}: " + "  ".join(line), flush=True)
    del w, wp


@triton.jit
def probe_blocked_kernel(wb_ptr, x_ptr, out_ptr, N, Kd, RP, R, M,
                         BNS: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, BM: tl.constexpr, RB: tl.constexpr):
    """The drafter's stream over weights stored row-blocked (``block_rows``): blocks of RB rows,
    each as [Kd / BK, RB, BK], so a [BNS, BK] tile is BNS / RB contiguous runs of RB * BK elements
    (whatever the grid) instead of BNS runs of BK."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    tot = tl.zeros([BNS, BM], dtype=tl.float32)
    for r in range(R):
        for s0 in range(0, RP, BNS):
            rp = s0 + tl.arange(0, BNS)
            rr = pid * RP + rp
            rmask = (rp < RP) & (rr < N)
            rr = r * N + rr
            wrow = wb_ptr + (rr // RB).to(tl.int64) * (RB * Kd) + (rr % RB) * BK
            acc = tl.zeros([BNS, BM], dtype=tl.float32)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                w = tl.load(wrow[:, None] + (k0 // BK) * (RB * BK) + rk[None, :], mask=rmask[:, None], other=0.0,
                            eviction_policy="evict_first")
                acc = K_._mma(w, K_._x_chunk(x_ptr, Kd, rm, k0 + rk, M, Kd), acc, False)
            tot += acc
    tl.store(out_ptr + pid, tl.sum(tl.sum(tot, 1), 0))


def block_rows(w, rb, bk):
    """[N, Kd] (N a multiple of rb) -> blocks of rb rows, each [Kd / bk, rb, bk], flat."""
    n, kd = w.shape
    return w.view(n // rb, rb, kd // bk, bk).permute(0, 2, 1, 3).contiguous().view(n, kd)


def ab_blocked(name, n, kd, reps, bns, bk, st, grid, dev, bw, rbs=(16, 32), rounds=6, nw=8):
    """Row-major, per-slab packed and row-blocked streams of one shape, alternated; the blocked
    ones' results checked against the row-major one, and their PTX's 16-byte copies counted."""
    w = torch.randn(reps * n, kd, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    ref = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    wp = pack(w, n, kd, reps, grid, bk)
    kw = dict(BNS=bns, BK=bk, ST=st, BM=16, num_warps=nw)
    calls = {"row-major": lambda: probe_kernel[(grid,)](w, x, out, n, kd, rp, reps, 10, **kw),
             "packed": lambda: probe_packed_kernel[(grid,)](wp, x, out, kd, rp, reps, 10, grid, **kw)}
    probe_kernel[(grid,)](w, x, ref, n, kd, rp, reps, 10, **kw)
    blocked = {}
    for rb in rbs:
        blocked[rb] = block_rows(w, rb, bk)
        calls[f"rb{rb}"] = (lambda rb=rb: probe_blocked_kernel[(grid,)](blocked[rb], x, out, n, kd, rp, reps, 10,
                                                                      RB=rb, **kw))
        ck = probe_blocked_kernel[(grid,)](blocked[rb], x, out, n, kd, rp, reps, 10, RB=rb, **kw)
        ptx = ck.asm["ptx"]
        print(f"  rb{rb}: cp.async 16-byte {ptx.count('cp.async.cg.shared.global') + ptx.count('cp.async.ca.shared.global')}"
              f" (of which .cg 16: {ptx.count(', 16;') + ptx.count(', 16, ')})", flush=True)
    errs = checked(calls, out, ref, name)
    line = ab_lines(calls, rounds, n * kd * 2, reps, bw, lambda key, v: f" (err {errs[key]:.0e})")
    print(f"A/B {name:8s} RP {rp:4d} BNS {bns:4d} BK {bk:4d} stages {st} warps {nw}: " + "  ".join(line), flush=True)
    del w, wp, blocked


def ab_l2(name, n, kd, reps, bns, bk, st, fold, grid, dev, bw, rounds=6):
    """The drafter's stream (plain, and folded ``fold`` ways) over ``reps`` distinct copies of a
    matrix (HBM) against ``reps`` passes over one copy that stays in L2, alternated: whether the
    k-loop is bound by the memory it reads or by the SM that runs it."""
    w = torch.randn(reps * n, kd, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    args = (w, x, out, n, kd, rp, reps, 10)
    kw = dict(BNS=bns, BK=bk, ST=st, BM=16, num_warps=8)
    calls = {"plain HBM": lambda: probe_kernel[(grid,)](*args, **kw),
             "plain L2": lambda: probe_kernel[(grid,)](*args, **kw, L2=True),
             f"fold{fold} HBM": lambda: probe_fold_kernel[(grid,)](*args, **kw, F=fold),
             f"fold{fold} L2": lambda: probe_fold_kernel[(grid,)](*args, **kw, F=fold, L2=True)}
    checked(calls, out, out, name)
    line = ab_lines(calls, rounds, n * kd * 2, reps, bw)
    print(f"L2/HBM {name:8s} {n * kd * 2 / 2 ** 20:5.1f} MB RP {rp:4d} BNS {bns:4d} BK {bk:4d} stages {st}: "
          + "  ".join(line), flush=True)
    del w


def ab_ksplit(name, n, kd, reps, bns, bk, st, grid, dev, bw, rounds=5, l2=(False, True)):
    """Ways to shorten the dot's accumulator chain (each chunk's BK/16 dependent MMAs): the plain
    loop, folded by 4, a 3-D batched k-split dot, and 2 or 4 separate accumulators; from HBM
    and from L2, alternated."""
    w = torch.randn(reps * n, kd, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    ref = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    args = (w, x, out, n, kd, rp, reps, 10)
    kw = dict(BNS=bns, BK=bk, ST=st, BM=16, num_warps=8)
    calls = {}
    for m in l2:
        tag = "L2" if m else "HBM"
        calls[f"plain {tag}"] = lambda m=m: probe_kernel[(grid,)](*args, **kw, L2=m)
        calls[f"fold4 {tag}"] = lambda m=m: probe_fold_kernel[(grid,)](*args, **kw, F=4, L2=m)
        calls[f"3d4 {tag}"] = lambda m=m: probe3_kernel[(grid,)](*args, **kw, S=4, L2=m)
        calls[f"acc2 {tag}"] = lambda m=m: probe_acc_kernel[(grid,)](*args, **kw, S=2, L2=m)
        calls[f"acc4 {tag}"] = lambda m=m: probe_acc_kernel[(grid,)](*args, **kw, S=4, L2=m)
    probe_kernel[(grid,)](w, x, ref, n, kd, rp, reps, 10, **kw)
    errs = checked(calls, out, ref, f"ksplit {name}")  # (L2 calls sum one copy 8 times: not comparable)
    line = ab_lines(calls, rounds, n * kd * 2, reps, bw, lambda key, v: "" if "L2" in key else f" (err {errs[key]:.0e})")
    print(f"ksplit {name:8s} RP {rp:4d} BNS {bns:4d} BK {bk:4d} stages {st}:\n    " + "\n    ".join(line), flush=True)
    del w


def run_read2d(n, kd, variants, grid, dev, bw):
    w = torch.randn(n, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    for bns, bk, st, nw in variants:
        k = read2d_kernel[(grid,)]
        k(w, out, n, kd, rp, BNS=bns, BK=bk, ST=st, num_warps=nw)
        torch.cuda.synchronize()
        ms = median_ms(lambda: k(w, out, n, kd, rp, BNS=bns, BK=bk, ST=st, num_warps=nw), 30)
        rate = n * kd * 2 / ms / 1e9
        print(f"read2d   N {n:6d} Kd {kd:6d} RP {rp:4d}  BNS {bns:4d} BK {bk:5d} stages {st} warps {nw:2d}: "
              f"{ms * 1e3:8.2f} us  {rate:6.3f} TB/s  {100 * rate * 1e12 / bw:5.1f}% of copy", flush=True)
    del w


def run_read(total_elems, variants, grid0, dev, bw):
    w = torch.randn(total_elems, device=dev, dtype=torch.bfloat16)
    for block, st, nw, per_sm in variants:
        grid = grid0 * per_sm
        per = total_elems // grid // block * block
        out = torch.empty(grid, device=dev, dtype=torch.float32)
        k = read_kernel[(grid,)]
        k(w, out, per, BLOCK=block, ST=st, num_warps=nw)
        torch.cuda.synchronize()
        ms = median_ms(lambda: k(w, out, per, BLOCK=block, ST=st, num_warps=nw), 30)
        rate = per * grid * 2 / ms / 1e9
        print(f"read     {per * grid * 2 / 1e6:7.1f} MB  BLOCK {block:5d} stages {st} warps {nw:2d} programs/SM {per_sm}: "
              f"{ms * 1e3:8.2f} us  {rate:6.3f} TB/s  {100 * rate * 1e12 / bw:5.1f}% of copy", flush=True)
    del w


def run(name, n, kd, reps_mat, variants, grid, dev, bw):
    w = torch.randn(reps_mat * n, kd, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16, kd, device=dev, dtype=torch.bfloat16)
    out = torch.empty(grid, device=dev, dtype=torch.float32)
    rp = -(-n // grid)
    nbytes = w.numel() * 2
    for v in variants:
        bns, bk, st = v[:3]
        nw = v[3] if len(v) > 3 else 8
        split = v[4] if len(v) > 4 else 1
        args = (w, x, out, n, kd, rp, reps_mat, 10)
        kw = dict(BNS=bns, BK=bk, ST=st, BM=16, num_warps=nw)
        if split in (-2, -3):  # bulk tensor copies (-3: swapped operands)
            from triton.tools.tensor_descriptor import TensorDescriptor
            k = probe_tma_kernel[(grid,)]
            args = (TensorDescriptor.from_tensor(w, [bns, bk]),) + args[1:]
            kw["SWAP"] = split == -3
        elif split == -1:
            k = probe_swap_kernel[(grid,)]
        elif split > 1:
            k = probe3_kernel[(grid,)]
            kw["S"] = split
        else:
            k = probe_kernel[(grid,)]
        try:
            k(*args, **kw)
            torch.cuda.synchronize()
            ms = median_ms(lambda: k(*args, **kw), 30)
            rate = nbytes / ms / 1e9
            if split not in (1, -2, -3):  # (the bulk-copy probe reads whole boxes past the slab)
                ref = out.clone()
                probe_kernel[(grid,)](*args, BNS=bns, BK=bk, ST=st, BM=16, num_warps=8)
                err = ((out - ref).abs() / ref.abs().clamp_min(1)).max().item()
                assert err < 1e-3, f"variant disagrees ({err:.2e})"
            how = {1: "plain", -1: "swapped", -2: "TMA", -3: "TMA swapped"}.get(split, f"k-split {split}")
            print(f"{name:8s} N {n:6d} Kd {kd:6d} RP {rp:4d}  BNS {bns:4d} BK {bk:5d} stages {st} warps {nw:2d} "
                  f"{how:11s}: "
                  f"{ms * 1e3 / reps_mat:8.2f} us per matrix  {rate:6.3f} TB/s  {100 * rate * 1e12 / bw:5.1f}% of copy",
                  flush=True)
        except Exception as exc:
            print(f"{name} BNS {bns} BK {bk} stages {st}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    del w


STUDIES = ("fold", "packed", "read", "tiles", "l2", "ksplit", "blocked")
ap = argparse.ArgumentParser()
ap.add_argument("--grid", type=int, default=0)
ap.add_argument("--study", default=",".join(STUDIES), help="comma-separated: " + ", ".join(STUDIES))
a = ap.parse_args()
dev = torch.device("cuda")
grid = a.grid or torch.cuda.get_device_properties(dev).multi_processor_count
bw = copy_bandwidth(dev)
print(f"copy bandwidth {bw / 1e12:.3f} TB/s, grid {grid}")
studies = a.study.split(",")
# the 8B preset's weight streams at batch 1: (name, rows, columns, repetitions per launch, the
# drafter's sub-slab rows / k-chunk / stages)
SHAPES = [("o_proj", 4096, 4096, 8, 32, 512, 3), ("down", 4096, 14336, 2, 32, 512, 3),
          ("qkv", 6144, 4096, 8, 64, 256, 3), ("lm_head", 32000, 4096, 1, 256, 64, 4), ("gate", 14336, 4096, 2, 128, 64, 4)]
if "fold" in studies:  # the dot folded F ways against the plain one at 8 and 4 warps
    for name, n, kd, reps, bns, bk, st in SHAPES:
        ab_fold(name, n, kd, reps, bns, bk, st, (2, 4) if bns <= 64 else (2,), grid, dev, bw)
if "packed" in studies:  # weights repacked so each program's slab is read in memory order
    for name, n, kd, reps, bns, bk, st in SHAPES:
        ab_packed(name, n, kd, reps, bns, bk, st, grid, dev, bw)
    ab_packed("o_proj", 4096, 4096, 8, 32, 512, 3, grid, dev, bw, nw=4)
    ab_packed("down", 4096, 14336, 2, 32, 512, 3, grid, dev, bw, nw=4)
if "read" in studies:  # no dot: the memory side alone, contiguous per program and in the slab's tiles
    run_read(262 * 2 ** 20, [(8192, 3, 8, 1), (8192, 4, 8, 1), (16384, 3, 8, 1), (16384, 2, 8, 1), (8192, 3, 8, 2)],
             grid, dev, bw)
    run_read2d(32000, 4096, [(256, 64, 4, 8), (128, 128, 4, 8), (32, 512, 3, 8), (16, 1024, 3, 8)], grid, dev, bw)
if "tiles" in studies:  # tile shapes, warps, a 3-D k-split dot, swapped operands, bulk tensor copies
    S, T, TS = -1, -2, -3
    run("o_proj", 4096, 4096, 8, [(32, 512, 3), (32, 512, 3, 4), (32, 256, 4), (16, 1024, 3), (32, 512, 3, 8, 4),
                                  (32, 512, 3, 8, S), (32, 256, 4, 4, T), (32, 256, 4, 4, TS)], grid, dev, bw)
    run("down", 4096, 14336, 2, [(32, 512, 3), (32, 512, 3, 4), (32, 512, 3, 8, S), (32, 256, 4, 4, T)], grid, dev, bw)
    run("qkv", 6144, 4096, 8, [(64, 256, 3), (64, 256, 3, 4), (64, 256, 3, 8, S)], grid, dev, bw)
    run("lm_head", 32000, 4096, 1, [(256, 64, 4), (256, 64, 3), (128, 128, 4), (64, 256, 4), (32, 512, 4), (16, 1024, 4),
                                    (256, 64, 4, 4), (128, 128, 4, 8, S), (128, 128, 4, 8, T)], grid, dev, bw)
    run("gate", 14336, 4096, 2, [(128, 64, 4), (128, 128, 4), (64, 256, 4), (128, 64, 4, 4), (128, 128, 4, 8, T)],
        grid, dev, bw)
if "l2" in studies:  # the same streams from HBM and from L2 (matrices that fit in it)
    for name, n, kd, bns, bk, st, f in (("o_proj", 4096, 4096, 32, 512, 3, 4), ("o_half", 2048, 4096, 16, 512, 3, 4),
                                        ("qkv_emb", 6144, 2048, 64, 256, 3, 2)):
        ab_l2(name, n, kd, 8, bns, bk, st, f, grid, dev, bw)
if "ksplit" in studies:  # shorter accumulator chains: fold, 3-D dot, separate accumulators
    ab_ksplit("o_proj", 4096, 4096, 8, 32, 512, 3, grid, dev, bw)
    ab_ksplit("o_proj", 4096, 4096, 8, 32, 512, 4, grid, dev, bw, l2=(False,))
    ab_ksplit("down", 4096, 14336, 2, 32, 512, 3, grid, dev, bw, l2=(False,))
    ab_ksplit("qkv_emb", 6144, 4096, 4, 64, 256, 3, grid, dev, bw, l2=(False,))
    ab_ksplit("qkv_emb", 6144, 4096, 4, 64, 256, 4, grid, dev, bw, l2=(False,))
if "blocked" in studies:  # row-blocked weights (any grid), against row-major and per-slab packed
    for name, n, kd, reps, bns, bk, st in SHAPES[2:]:
        ab_blocked(name, n, kd, reps, bns, bk, st, grid, dev, bw)
    for name, n, kd, reps, bns, bk, st in (("lm1B", 32000, 2048, 2, 256, 64, 4), ("gate1B", 8192, 2048, 4, 64, 128, 4)):
        ab_blocked(name, n, kd, reps, bns, bk, st, grid, dev, bw)
