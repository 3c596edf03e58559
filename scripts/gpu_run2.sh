#!/usr/bin/env bash
# Second GPU call: tuning variants (8B d7), the rest of the GPU tests, bf16 exact-match rate.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
timeout 200 python3 scripts/variants.py --variants base,w8,bk256s5,bn32,steps,graph --json $OUT/variants.json 2>&1 | tee $OUT/variants.log
timeout 200 python3 -m pytest -q tests/test_triton.py -m gpu -k "medium or timeout or persistent" 2>&1 | tail -25 | tee $OUT/pytest_gpu2.log
timeout 150 python3 scripts/bf16_match.py --seeds 60 2>&1 | tee $OUT/match.log
