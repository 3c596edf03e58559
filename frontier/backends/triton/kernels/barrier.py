"""Synchronisation of the persistent program: the bounded grid barrier, per-sequence arrival
counters, the global timer of TIMING builds, and programmatic-dependent-launch waits of step
launches (no-ops on a Triton without grid dependency control).
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # grid dependency control (programmatic dependent launch), sm_90+; Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait
    HAS_GDC = True
except ImportError:  # pragma: no cover - older Triton: the launcher never sets PDL
    HAS_GDC = False

    @triton.jit
    def _gdc_wait():
        pass

    @triton.jit
    def _gdc_launch_dependents():
        pass


@triton.jit
def _globaltimer(dummy):
    """Nanosecond global timer (GPU only; used by the TIMING build for per-phase breakdowns)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _ld_acquire(ptr):
    """A gpu-scope acquiring load of one int32 (``ld.global.acquire.gpu``): orders what follows
    after every write released before the value it reads, without a read-modify-write."""
    return tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _grid_sync(sync_ptr, target, MAX_SPIN: tl.constexpr):
    """Bounded device-wide barrier. sync_ptr[0] counts arrivals (a release atomic per program);
    waiting programs poll it with acquiring loads (no read-modify-write traffic on the line), so
    the poll that sees every arrival is the acquire and no extra round trip follows. A program
    that polls MAX_SPIN times without seeing every arrival sets the error flag sync_ptr[1] and
    adds 2^30 to the counter, which releases every waiter of this and all later barriers at once;
    the launcher then raises."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    cur = _ld_acquire(sync_ptr)
    spins = cur * 0
    while (cur < target) & (spins < MAX_SPIN):
        cur = _ld_acquire(sync_ptr)
        spins += 1
    if cur < target:
        tl.atomic_xchg(sync_ptr + 1, 1, sem="relaxed", scope="gpu")
        tl.atomic_add(sync_ptr, 1 << 30, sem="relaxed", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _last_arrival(ticket_ptr, n):
    """Whether this program is the n-th (last) to arrive at the counter ``ticket_ptr`` (each
    program that arrives adds 1: a release, so what it wrote before is visible to the last one,
    whose add also acquires). The last one sets the counter back to 0 for its next use (a later
    launch, or a later phase after a barrier). No program waits, so the order the programs run
    in does not matter (the interpreter runs them one after another)."""
    tl.debug_barrier()
    old = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    last = old == n - 1
    if last:
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    return last
