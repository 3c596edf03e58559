#!/usr/bin/env bash
# First GPU call: smoke, GPU parity tests, then one bench case with the breakdown.
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh

nvidia-smi -L
timeout 150 python3 scripts/smoke_triton.py 2>&1 | tee $OUT/smoke.log
timeout 300 python3 -m pytest -q -x tests/test_triton.py -m gpu 2>&1 | tail -40 | tee $OUT/pytest_gpu.log
timeout 200 python3 -m frontier.cli bench --preset eagle3-llama3.1-8b --depth 7 --reps 30 --breakdown --json $OUT/bench1.json 2>&1 | tee $OUT/bench1.log
