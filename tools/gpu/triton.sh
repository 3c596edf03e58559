#!/usr/bin/env bash
# The triton GPU call: the bench table (both presets, depths 5 and 7, triton vs torch_ref, breakdown),
# GPU parity with the default tuning, bf16/fp16 exact-match rates.
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
nvidia-smi -L
timeout 280 python3 -m frontier.cli bench --breakdown --json-out $OUT/bench.json 2>&1 | tee $OUT/bench.log
timeout 230 python3 -m pytest -q tests/test_triton.py -m gpu -k "medium or timeout or persistent or steps-eagle" 2>&1 | tail -8 | tee $OUT/pytest_gpu6.log
timeout 80 python3 benchmarks/bf16_match.py --seeds 24 --cpu-seeds 6 --dtypes fp32,bf16,fp16 2>&1 | tee $OUT/match6.log
