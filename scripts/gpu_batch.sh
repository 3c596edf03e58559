#!/usr/bin/env bash
# Batched triton drafter on the GPU: GPU tests (batch included), then kernel-only batch timings per tuning.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
nvidia-smi -L
timeout 330 python3 -m pytest -q tests/test_triton.py -m gpu -x 2>&1 | tail -15 | tee $OUT/pytest_gpu.log
timeout 230 python3 scripts/batch_variants.py --batches 1,4,16 --tunings base,bm128,bm128a8k,bm256a16k --breakdown 16 \
    2>&1 | tee $OUT/batch_variants.log
