"""The batched (wide) drafter's two biggest weight phases outside the drafter, against cuBLAS.

At batch 16 (160 tree rows) the lm_head and gate/up phases move the same weight bytes as at
batch 1 but do 160 rows of tensor-core work on them. This times, one program per SM as in the
drafter and with the drafter's own phase functions:
- ``lm``: ``kernels._ph_lmhead_wide`` (GEMM into the logits scratch, then the per-row top-K,
  max and sum of exp of the program's slab);
- ``lm_gemm``: its GEMM and logits store alone (the fourteenth session's first runs also tried
  BK 32 / 128, 128-row sub-slabs and 3 stages here: 88-120 µs, all slower than the plan's);
- ``lm epilogue``: its statistics alone (``kernels._lm_slab_stats``) on the logits of x W^T,
  checked equal across variants and against torch.topk;
- ``gateup``: ``kernels._ph_gateup`` (both matrices in one k-loop, silu * up epilogue);
  ``gateup stacked``: both matrices as one stacked weight tile per k-chunk; ``gu epilogue
  variant``: the same loop with parts of the epilogue changed, to price them;
- ``cublas``: ``torch.matmul`` of the same shapes (what the tensor cores give a library GEMM).
Each line: µs per call, TFLOP/s, and the ratio to the weight bytes' time at the copy bandwidth.

    python3 scripts/wide_probe.py [--rows 160] [--rounds 3]
"""
import argparse
import statistics

import torch
import triton
import triton.language as tl

from frontier.backends.triton import kernels as K_
from frontier.backends.triton.launch import Tuning, _pow2, slab
from frontier.bench import copy_bandwidth, time_calls


@triton.jit
def lm_kernel(x_ptr, M, w_ptr, V, Kd, logit_ptr, keys_ptr, max_ptr, sum_ptr, RP, MR, K,
              BM: tl.constexpr, KP: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, BNP: tl.constexpr,
              BM2: tl.constexpr, ST: tl.constexpr, EPI: tl.constexpr, BMK: tl.constexpr = 16,
              KEY16: tl.constexpr = False):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if EPI:
        K_._ph_lmhead_wide(pid, nprog, x_ptr, M, w_ptr, V, Kd, logit_ptr, keys_ptr, max_ptr, sum_ptr, RP, MR, K,
                           BM, KP, BNS, BK, False, BMK, BNP, BM2, ST, KEY16)
    else:
        DT = x_ptr.dtype.element_ty
        for s0 in range(0, RP, BNS):
            rr, rmask, wrow = K_._slab_rows(pid, RP, s0, V, 0, Kd, w_ptr, w_ptr, w_ptr, False, BNS, 1)
            for m0 in range(0, M, BM + BM2):
                rm, rm2 = K_._row_tiles(m0, BM, BM2)
                acc, acc2 = K_._stream_tile(wrow, rmask, x_ptr, Kd, rm, rm2, M, 0, Kd, BNS, BM, BK, False, BM2, ST)
                tl.store(logit_ptr + rm[None, :] * V + rr[:, None], acc.to(DT), mask=rmask[:, None] & (rm[None, :] < M))
                if BM2 > 0:
                    tl.store(logit_ptr + rm2[None, :] * V + rr[:, None], acc2.to(DT),
                             mask=rmask[:, None] & (rm2[None, :] < M))


@triton.jit
def epi_kernel(logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, MR, K,
               KP: tl.constexpr, BMK: tl.constexpr, BNP: tl.constexpr, KEY16: tl.constexpr):
    K_._lm_slab_stats(tl.program_id(0), logit_ptr, V, keys_ptr, max_ptr, sum_ptr, RP, M, MR, K, KP, BMK, BNP,
                      logit_ptr.dtype.element_ty, KEY16)


@triton.jit
def gu_kernel(x_ptr, M, wg_ptr, wu_ptr, N, Kd, y_ptr, RP,
              BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, BM2: tl.constexpr, ST: tl.constexpr):
    K_._ph_gateup(tl.program_id(0), tl.num_programs(0), x_ptr, M, wg_ptr, wu_ptr, N, Kd, y_ptr, RP,
                  BM, BNS, BK, False, BM2, ST)


@triton.jit
def _gu_halves(acc, BNS: tl.constexpr, BM: tl.constexpr, IL: tl.constexpr):
    """(gate, up) accumulators [BNS, BM] of a stacked [2*BNS, BM] one: IL 0 rows [0, BNS) are
    gate rows; IL 8: blocks of 8 gate rows, then their 8 up rows, alternate."""
    if IL == 0:
        a3 = tl.permute(tl.reshape(acc, [2, BNS, BM]), [1, 2, 0])
    else:
        a4 = tl.permute(tl.reshape(acc, [BNS // IL, 2, IL, BM]), [0, 2, 3, 1])
        a3 = tl.reshape(a4, [BNS, BM, 2])
    return tl.split(a3)


@triton.jit
def gu2_kernel(x_ptr, M, wg_ptr, wu_ptr, N, Kd, y_ptr, RP,
               BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, BM2: tl.constexpr, ST: tl.constexpr,
               IL: tl.constexpr):
    """gate/up as one stacked [2*BNS, BK] weight tile per k-chunk (row pointers chosen per row
    from the two matrices, no repacking), one dot per activation tile, halves split after."""
    pid = tl.program_id(0)
    j = tl.arange(0, 2 * BNS)
    if IL == 0:
        up = j >= BNS
        r = j % BNS
    else:
        up = (j // IL) % 2 == 1
        r = (j // (2 * IL)) * IL + j % IL
    for s0 in range(0, RP, BNS):
        rr_w = pid * RP + s0 + r
        wmask = (s0 + r < RP) & (rr_w < N)
        wrow = tl.where(up, wu_ptr + rr_w * Kd, wg_ptr + rr_w * Kd)
        wrow = tl.multiple_of(wrow, 16)
        rr = pid * RP + s0 + tl.arange(0, BNS)
        rmask = (s0 + tl.arange(0, BNS) < RP) & (rr < N)
        for m0 in range(0, M, BM + BM2):
            rm, rm2 = K_._row_tiles(m0, BM, BM2)
            acc, acc2 = K_._stream_tile(wrow, wmask, x_ptr, Kd, rm, rm2, M, 0, Kd, 2 * BNS, BM, BK, False, BM2, ST)
            g, u = _gu_halves(acc, BNS, BM, IL)
            K_._gateup_out(g, u, rr, rmask, rm, M, y_ptr, N)
            if BM2 > 0:
                g2, u2 = _gu_halves(acc2, BNS, BM2, IL)
                K_._gateup_out(g2, u2, rr, rmask, rm2, M, y_ptr, N)


@triton.jit
def _gu_out_var(acc_g, acc_u, rr, rmask, rm, M, y_ptr, N, EPI: tl.constexpr):
    """Epilogue variants of ``kernels._gateup_out``, to price its parts: 0 stores the gate
    accumulator alone (the compiler then drops the up matrix's loads: not comparable), 1 is the
    real one (div.rn before the fourteenth session, ``_silu_rn`` after), 2 divides with Triton's default (approximate)
    division, 3 drops the intermediate roundings, 4 the real one with exp through libdevice."""
    DT = y_ptr.dtype.element_ty
    msk = rmask[:, None] & (rm[None, :] < M)
    if EPI == 0:
        out = acc_g.to(DT)
    elif EPI == 1:
        g = acc_g.to(DT).to(tl.float32)
        u = acc_u.to(DT).to(tl.float32)
        sg = tl.math.div_rn(g, 1.0 + tl.exp(-g)).to(DT).to(tl.float32)
        out = (sg * u).to(DT)
    elif EPI == 2:
        g = acc_g.to(DT).to(tl.float32)
        u = acc_u.to(DT).to(tl.float32)
        sg = (g / (1.0 + tl.exp(-g))).to(DT).to(tl.float32)
        out = (sg * u).to(DT)
    elif EPI == 3:
        out = (tl.math.div_rn(acc_g, 1.0 + tl.exp(-acc_g)) * acc_u).to(DT)
    else:
        g = acc_g.to(DT).to(tl.float32)
        u = acc_u.to(DT).to(tl.float32)
        sg = tl.math.div_rn(g, 1.0 + tl.math.exp(-g)).to(DT).to(tl.float32)
        out = (sg * u).to(DT)
    tl.store(y_ptr + rm[None, :] * N + rr[:, None], out, mask=msk)


@triton.jit
def gu_var_kernel(x_ptr, M, wg_ptr, wu_ptr, N, Kd, y_ptr, RP,
                  BM: tl.constexpr, BNS: tl.constexpr, BK: tl.constexpr, BM2: tl.constexpr, ST: tl.constexpr,
                  EPI: tl.constexpr):
    """``kernels._ph_gateup``'s loop with epilogue variant EPI (``_gu_out_var``)."""
    pid = tl.program_id(0)
    rk = tl.arange(0, BK)
    for s0 in range(0, RP, BNS):
        rr, rmask, wgrow = K_._slab_rows(pid, RP, s0, N, 0, Kd, wg_ptr, wg_ptr, wg_ptr, False, BNS, 1)
        for m0 in range(0, M, BM + BM2):
            rm, rm2 = K_._row_tiles(m0, BM, BM2)
            acc_g = tl.zeros([BNS, BM], dtype=tl.float32)
            acc_u = tl.zeros([BNS, BM], dtype=tl.float32)
            acc_g2 = tl.zeros([BNS, BM2], dtype=tl.float32)
            acc_u2 = tl.zeros([BNS, BM2], dtype=tl.float32)
            for k0 in tl.range(0, Kd, BK, num_stages=ST):
                kk = k0 + rk
                wmask = rmask[:, None] & (kk[None, :] < Kd)
                wg = tl.load(wgrow[:, None] + kk[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
                wu = tl.load(wu_ptr + rr[:, None] * Kd + kk[None, :], mask=wmask, other=0.0,
                             eviction_policy="evict_first")
                x = K_._x_chunk(x_ptr, Kd, rm, kk, M, Kd)
                acc_g = tl.dot(wg, x, acc_g)
                acc_u = tl.dot(wu, x, acc_u)
                x2 = K_._x_chunk(x_ptr, Kd, rm2, kk, M, Kd)
                acc_g2 = tl.dot(wg, x2, acc_g2)
                acc_u2 = tl.dot(wu, x2, acc_u2)
            _gu_out_var(acc_g, acc_u, rr, rmask, rm, M, y_ptr, N, EPI)
            _gu_out_var(acc_g2, acc_u2, rr, rmask, rm2, M, y_ptr, N, EPI)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--inter", type=int, default=14336)
    a = ap.parse_args()
    dev = torch.device("cuda")
    grid = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = copy_bandwidth(dev)
    M, H, V, I = a.rows, a.hidden, a.vocab, a.inter
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s, grid {grid}, rows {M}", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(M, H, device=dev, dtype=torch.bfloat16, generator=g)
    w_lm = (torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.02)
    wg = (torch.randn(I, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.02)
    wu = (torch.randn(I, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.02)
    w_gu = torch.cat([wg, wu])
    logits = torch.empty(M, V, device=dev, dtype=torch.bfloat16)
    KP, K = 16, 10
    keys = torch.empty(grid * M * KP, device=dev, dtype=torch.int64)
    mx = torch.empty(grid * M, device=dev, dtype=torch.float32)
    sm = torch.empty(grid * M, device=dev, dtype=torch.float32)
    y = torch.empty(M, I, device=dev, dtype=torch.bfloat16)
    ref_lm = (x @ w_lm.t())
    ref_g = x @ wg.t()

    def rp_of(n):  # the drafter's rows per program for an n-row weight at M activation rows
        return slab(n, H, grid, 2, 1, Tuning(), M)[0]

    rp_lm, rp_gu = rp_of(V), rp_of(I)
    calls, meta = {}, {}

    def lm(bns, bk, st, bm, bm2, epi, nw=8, bmk=16, key16=False):
        def f():
            lm_kernel[(grid,)](x, M, w_lm, V, H, logits, keys, mx, sm, rp_lm, M, K, BM=bm, KP=KP, BNS=bns, BK=bk,
                               BNP=_pow2(rp_lm), BM2=bm2, ST=st, EPI=epi, BMK=bmk, KEY16=key16, num_warps=nw)
        name = f"{'lm' if epi else 'lm_gemm'} BNS {bns} BK {bk} st {st} tile {bm}+{bm2} w{nw}"
        if epi:
            name += f" BMK {bmk} {32 if key16 else 64}-bit keys"
        calls[name] = f
        meta[name] = (V * H * 2, 2 * M * V * H, "lm")

    def gu(bns, bk, st, bm, bm2, nw=8):
        def f():
            gu_kernel[(grid,)](x, M, wg, wu, I, H, y, rp_gu, BM=bm, BNS=bns, BK=bk, BM2=bm2, ST=st, num_warps=nw)
        name = f"gateup BNS {bns} BK {bk} st {st} tile {bm}+{bm2} w{nw}"
        calls[name] = f
        meta[name] = (2 * I * H * 2, 4 * M * I * H, "gu")

    bm, bm2 = (128, 32) if M == 160 else (_pow2(M), 0)
    lm(256, 64, 4, bm, bm2, True, bmk=32, key16=True)  # the drafter's batch-16 lm_head
    lm(256, 64, 4, bm, bm2, False)
    gu(128, 64, 4, bm, bm2)  # the drafter's batch-16 gate/up

    def gu2(bns, bk, st, bm, bm2, il, nw=8):
        def f():
            gu2_kernel[(grid,)](x, M, wg, wu, I, H, y, rp_gu, BM=bm, BNS=bns, BK=bk, BM2=bm2, ST=st, IL=il, num_warps=nw)
        name = f"gateup stacked IL {il} BNS {bns} BK {bk} st {st} w{nw}"
        calls[name] = f
        meta[name] = (2 * I * H * 2, 4 * M * I * H, "gu")

    def gu_var(epi, bns=128, bk=64, st=4, nw=8):
        def f():
            gu_var_kernel[(grid,)](x, M, wg, wu, I, H, y, rp_gu, BM=bm, BNS=bns, BK=bk, BM2=bm2, ST=st, EPI=epi,
                                   num_warps=nw)
        name = f"gu epilogue variant {epi} BNS {bns} BK {bk} st {st} w{nw}"
        calls[name] = f
        meta[name] = (2 * I * H * 2, 4 * M * I * H, "guv")

    for epi in range(5):
        gu_var(epi)
    rp_st = rp_of(2 * I)

    def lm_stacked():  # the GEMM alone on [Wg; Wu] as one matrix, in the lm_head's form
        lm_kernel[(grid,)](x, M, w_gu, 2 * I, H, y_st, keys, mx, sm, rp_st, M, K, BM=bm, KP=KP, BNS=256, BK=64,
                           BNP=_pow2(rp_st), BM2=bm2, ST=4, EPI=False, num_warps=8)

    y_st = torch.empty(M, 2 * I, device=dev, dtype=torch.bfloat16)
    calls["gate+up stacked GEMM alone (lm_gemm form)"] = lm_stacked
    meta["gate+up stacked GEMM alone (lm_gemm form)"] = (2 * I * H * 2, 4 * M * I * H, "gu")
    def epi(bmk, key16, nw=8):
        def f():
            epi_kernel[(grid,)](logits, V, keys, mx, sm, rp_lm, M, M, K, KP=KP, BMK=bmk, BNP=_pow2(rp_lm), KEY16=key16,
                                num_warps=nw)
        name = f"lm epilogue BMK {bmk} {'32' if key16 else '64'}-bit keys w{nw}"
        calls[name] = f
        meta[name] = (V * H * 2, 2 * M * V * H, "epi")

    epi(32, True)
    calls["cublas lm_head"] = lambda: torch.matmul(x, w_lm.t(), out=logits)
    meta["cublas lm_head"] = (V * H * 2, 2 * M * V * H, "lm")
    calls["cublas gate+up"] = lambda: torch.matmul(x, w_gu.t())
    meta["cublas gate+up"] = (2 * I * H * 2, 4 * M * I * H, "gu")

    epi_ref = None
    for name, f in list(calls.items()):  # compile, and check each GEMM against torch
        try:
            if name.startswith("lm epilogue"):  # on the same logits, every variant's output is equal
                logits.copy_(ref_lm)
                keys.zero_(), mx.zero_(), sm.zero_()
            else:
                y.zero_(), logits.zero_()
            f()
            torch.cuda.synchronize()
            if name.startswith("lm epilogue"):
                got = (keys.clone(), mx.clone(), sm.clone())
                if epi_ref is None:
                    epi_ref = got
                    top = torch.topk(ref_lm.float()[:, :rp_lm], K, dim=1)  # program 0's slab
                    k0 = keys[: M * KP].view(M, KP)[:, :K]
                    idx = 0x7FFFFFFF - (k0 & 0x7FFFFFFF)
                    vals = ref_lm.float()[:, :rp_lm].gather(1, idx)
                    assert torch.equal(vals, top.values), "top-K values differ from torch.topk"
                assert all(torch.equal(u, v) for u, v in zip(got, epi_ref)), f"{name}: differs from the first variant"
            if name.startswith("lm_gemm"):
                err = ((logits.float() - ref_lm.float()).abs() / (ref_lm.float().abs() + 0.05)).max().item()
                assert err < 0.02, f"{name}: max relative error {err}"
            elif name.startswith("gateup"):
                want = (torch.nn.functional.silu(ref_g.float()).bfloat16().float() * (x @ wu.t()).float())
                err = ((y.float() - want).abs() / (want.abs() + 0.05)).max().item()
                assert err < 0.02, f"{name}: max relative error {err}"
        except Exception as exc:
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            calls.pop(name)
    got = {k: [] for k in calls}
    for _ in range(a.rounds):
        for name, f in calls.items():
            got[name].append(time_calls(f, warmup=2, reps=20, device_only=True))
    for name, v in got.items():
        nbytes, flop, _ = meta[name]
        ms = statistics.median(v)
        print(f"{name:42s} {ms * 1e3:8.1f} us  {flop / ms / 1e9:6.1f} TFLOP/s  bytes' time {nbytes / bw * 1e6:6.1f} us "
              f"({100 * nbytes / bw / (ms / 1e3):5.1f}% of copy)  rounds {' '.join(f'{t * 1e3:.1f}' for t in v)}",
              flush=True)


if __name__ == "__main__":
    main()
