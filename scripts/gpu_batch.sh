#!/usr/bin/env bash
# Batched triton drafter on the GPU: kernel-only batch timings per tuning (and optionally the GPU tests).
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
nvidia-smi -L
if [ "${GPU_TESTS:-0}" = 1 ]; then
  timeout 330 python3 -m pytest -q tests/test_triton.py -m gpu -x 2>&1 | tail -15 | tee $OUT/pytest_gpu.log
fi
timeout ${VT:-500} python3 scripts/batch_variants.py --batches ${BATCHES:-1,4,16,64} --tunings ${TUNINGS:-base} \
    --breakdown ${BREAK:-0} 2>&1 | tee -a $OUT/batch_variants.log
