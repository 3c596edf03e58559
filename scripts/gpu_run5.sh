#!/usr/bin/env bash
# Fifth GPU call: split attention (flash-decoding, exact rounding); tunings with in-kernel breakdowns; parity.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
timeout 170 python3 scripts/variants.py --variants w8,w8lm64s3,w8s3,w8s5,base --timing --json $OUT/v8b.json 2>&1 | tee $OUT/v8b.log
timeout 80 python3 scripts/variants.py --preset eagle3-llama3.2-1b --variants w8,w8lm64s3 --timing --json $OUT/v1b.json 2>&1 | tee $OUT/v1b.log
timeout 250 python3 -m pytest -q tests/test_triton.py -m gpu -k "medium or timeout or persistent or steps-eagle3" 2>&1 | tail -15 | tee $OUT/pytest_gpu5.log
