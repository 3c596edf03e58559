#!/usr/bin/env bash
# Seventh GPU call: lm_head as two half-height tiles; persistent vs CUDA graph of steps at v4; host overhead.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
timeout 120 python3 scripts/variants.py --variants base,lmhalves,graph --json $OUT/v8b.json 2>&1 | tee $OUT/v8b.log
timeout 90 python3 scripts/variants.py --preset eagle3-llama3.2-1b --variants base,lmhalves,graph --json $OUT/v1b.json 2>&1 | tee $OUT/v1b.log
timeout 60 python3 scripts/host_overhead.py 2>&1 | tee $OUT/host.log
timeout 60 python3 -m pytest -q tests/test_triton.py -m gpu -k "persistent-eagle" 2>&1 | tail -3 | tee $OUT/pytest7.log
