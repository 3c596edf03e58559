#!/usr/bin/env bash
# Fourth GPU call: barrier acquire fix + .cg loads; GPU parity (both modes); in-kernel breakdowns; bf16 rates.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
timeout 150 python3 scripts/variants.py --variants base,w8 --timing --json $OUT/v8b.json 2>&1 | tee $OUT/v8b.log
timeout 90 python3 scripts/variants.py --preset eagle3-llama3.2-1b --variants w8 --timing --json $OUT/v1b.json 2>&1 | tee $OUT/v1b.log
timeout 240 python3 -m pytest -q -x tests/test_triton.py -m gpu -k "medium or timeout or persistent or steps-eagle3" 2>&1 | tail -15 | tee $OUT/pytest_gpu4.log
timeout 100 python3 scripts/bf16_match.py --seeds 16 --cpu-seeds 6 --dtypes bfloat16,float16 2>&1 | tee $OUT/match4.log
