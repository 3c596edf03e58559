#!/usr/bin/env bash
# Third GPU call: slab-per-program streaming; tunings on both presets; full GPU tests; bf16 rates.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
timeout 170 python3 scripts/variants.py --variants base,sb64s3,sb16s6,w8,graph --json $OUT/v8b.json 2>&1 | tee $OUT/v8b.log
timeout 100 python3 scripts/variants.py --preset eagle3-llama3.2-1b --variants base,sb64s3,sb16s6 --json $OUT/v1b.json 2>&1 | tee $OUT/v1b.log
timeout 240 python3 -m pytest -q tests/test_triton.py -m gpu -k "medium or timeout or persistent" 2>&1 | tail -25 | tee $OUT/pytest_gpu3.log
timeout 120 python3 scripts/bf16_match.py --seeds 30 --dtypes bfloat16,float16 2>&1 | tee $OUT/match3.log
