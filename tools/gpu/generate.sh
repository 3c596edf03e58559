#!/usr/bin/env bash
# Speculative generation on the GPU (random target + random EAGLE-3 head pairs, no downloads):
# tokens/s, mean accepted length and the draft/verify split per available backend, the
# target.generate baseline, and whether greedy outputs match it. Writes $OUT/generate.{json,md,log}.
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
nvidia-smi -L
timeout 540 python3 benchmarks/generate.py --out "$OUT" "$@" 2>&1 | tee "$OUT/generate.log"
